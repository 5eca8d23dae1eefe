//! Scopes: the calling context that every allocation and every timer is attributed to, opened
//! where Chainer's hooks fire (a `FunctionNode` forward or backward, a `Link` call) or anywhere
//! the user wants a name in the reports.
//!
//! Opening a scope pushes a frame (`file:line:name`) onto this thread's stack of open scopes for
//! that recorder; closing it writes one scope event (the stack and the duration) and pops. Two
//! front ends share that core:
//!
//! - for Rust, RAII guards ([`Handle::function`], [`Handle::link`], [`Handle::scope`]), whose
//!   `file:line` is where they were opened, thanks to `#[track_caller]`;
//! - for foreign callers (the Python package, the C ABI), [`Handle::enter`], which takes the
//!   name, file and line as plain values and returns a [`ScopeToken`] (no borrow, no lifetime),
//!   and [`Handle::exit`], which takes it back.
//!
//! Foreign callers also hand in whole call stacks (a Python traceback, as CuPy's
//! `LineProfileHook` sees it): [`Handle::foreign_stack`] interns them, once per distinct stack.
//!
//! # Cost
//!
//! The trace refers to stacks by interned id, and interning takes the recorder's mutex. So each
//! thread keeps, per recorder, caches from (parent stack, call site, kind, phase, name) to the
//! stack id: once a training step has run once, opening a scope is a thread-local lookup and one
//! hash probe with string compares, with no lock and no allocation, and closing it is a
//! truncate plus the writer's event append. A foreign stack of N frames costs N such probes.
//!
//! # Threads, recorders and out-of-order closes
//!
//! Each thread has its own stack, as Chainer's thread-local hook stacks do: a guard is `!Send`
//! and closes on the thread that opened it; a token exited on another thread, or on another
//! recorder, is refused with a [`ScopeError`] and changes nothing. Stacks are also kept apart
//! per recorder, since stack ids only mean something in the file they were interned in.
//!
//! # Calls that raise
//!
//! A scope whose call did not complete (it raised, panicked, or the caller says it failed) is
//! closed by [`Handle::abort`], by a guard dropped while its thread unwinds from a panic, or by
//! [`ScopeGuard::fail`]. It is popped like any scope, so nothing recorded afterwards nests
//! under it, but it records a `ScopeAbort` mark instead of a scope event: it is not a call of
//! its function (no row, no occurrence, no time), as Chainer's hooks never see the post hook
//! of a call that raised. What it allocated meanwhile stays attributed to its stack, and the
//! analyzer leaves it out of that function's row (the enclosing calls keep it).
//!
//! Scopes are meant to close in reverse order of opening. Closing an outer one first closes the
//! scopes opened inside it too, as far as the stack is concerned: the next scope or allocation
//! is attributed to the outer scope's parent. The inner scopes still record their own event
//! (with the stack they were opened with) when they close, but no longer touch the stack, so a
//! scope opened after the early close is never popped by a stale guard or token.

mod context;

use std::marker::PhantomData;
use std::panic::Location;

use crate::error::ScopeError;
use crate::kinds::{FrameKind, MarkKind, Phase, ScopeKind};
use crate::writer::{now_ticks, Handle};
use context::with_context;

/// An open scope entered with [`Handle::enter`]; give it back to [`Handle::exit`] to close it.
///
/// Plain data: it borrows nothing and may be stored anywhere (a Python object, a C struct of
/// the same size, 40 bytes, `#[repr(C)]`). It is only valid on the thread and recorder that
/// entered it; [`Handle::exit`] refuses it elsewhere, and refuses a second exit of a copy.
#[must_use = "the scope stays open until the token is given to Handle::exit"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct ScopeToken {
    recorder: u64,
    context: u64,
    serial: u64,
    start: u64,
    /// 0 when the scope could not be opened (thread exiting); then closing records nothing.
    stack: u32,
    depth: u32,
}

impl ScopeToken {
    /// The interned stack whose innermost frame is this scope (0 if it could not be opened).
    pub fn stack(&self) -> u32 {
        self.stack
    }

    /// The token as five words, for bindings that keep it opaque (a C struct, a Python
    /// object); [`ScopeToken::from_words`] gives it back.
    pub fn to_words(&self) -> [u64; 5] {
        [
            self.recorder,
            self.context,
            self.serial,
            self.start,
            self.stack as u64 | (self.depth as u64) << 32,
        ]
    }

    /// A token from [`ScopeToken::to_words`]. Words that were never a token are harmless:
    /// [`Handle::exit`] checks the recorder, the thread and that the scope is open, as for any
    /// token, and refuses what does not match.
    pub fn from_words(words: [u64; 5]) -> ScopeToken {
        ScopeToken {
            recorder: words[0],
            context: words[1],
            serial: words[2],
            start: words[3],
            stack: words[4] as u32,
            depth: (words[4] >> 32) as u32,
        }
    }
}

/// One frame of a foreign call stack, as a Python traceback gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignFrame<'a> {
    pub file: &'a str,
    pub line: u32,
    pub function: &'a str,
}

/// An open scope; closing it (dropping it) records it. See the module documentation for what
/// an out-of-order drop does.
#[must_use = "the scope closes when the guard is dropped"]
pub struct ScopeGuard<'h> {
    handle: &'h Handle,
    token: ScopeToken,
    _not_send: PhantomData<*const ()>,
}

impl ScopeGuard<'_> {
    /// The interned stack whose innermost frame is this scope.
    pub fn stack(&self) -> u32 {
        self.token.stack
    }
}

impl std::fmt::Debug for ScopeGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopeGuard")
            .field("stack", &self.token.stack)
            .field("depth", &self.token.depth)
            .finish()
    }
}

impl ScopeGuard<'_> {
    /// Closes the scope as a call that did not complete (its work failed): a `ScopeAbort`
    /// mark instead of a scope event. A guard dropped while its thread unwinds from a panic
    /// does the same by itself.
    pub fn fail(mut self) {
        self.close(true);
    }

    #[inline]
    fn close(&mut self, failed: bool) {
        let t = std::mem::replace(&mut self.token, CLOSED_TOKEN);
        if t.stack == 0 {
            return;
        }
        // A guard cannot be closed twice nor leave its thread, so its close cannot fail in a
        // way that matters: an orphan forgotten past MAX_ORPHANS still records its event.
        with_context(self.handle, |cx| cx.close(t.depth, t.serial));
        if failed {
            self.handle.record_abort(t.stack, t.start);
        } else {
            self.handle.record_scope(t.stack, t.start);
        }
    }
}

impl Drop for ScopeGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.close(std::thread::panicking());
    }
}

impl Handle {
    /// Opens a function scope (a Chainer `FunctionNode` call) in `phase`, until the guard drops.
    #[track_caller]
    #[inline]
    pub fn function(&self, name: &str, phase: Phase) -> ScopeGuard<'_> {
        self.open_guard(FrameKind::Function, phase, name, Location::caller())
    }

    /// Opens a link scope (a Chainer `Link`'s forward; by convention `name` is its class name).
    #[track_caller]
    #[inline]
    pub fn link(&self, name: &str) -> ScopeGuard<'_> {
        self.open_guard(FrameKind::Link, Phase::None, name, Location::caller())
    }

    /// Opens a user scope: any region worth a row in the reports (a training step, an update).
    #[track_caller]
    #[inline]
    pub fn scope(&self, name: &str) -> ScopeGuard<'_> {
        self.open_guard(FrameKind::Scope, Phase::None, name, Location::caller())
    }

    #[inline]
    fn open_guard(
        &self,
        kind: FrameKind,
        phase: Phase,
        name: &str,
        site: &'static Location<'static>,
    ) -> ScopeGuard<'_> {
        let id = self.id();
        let token = with_context(self, |cx| {
            let stack = cx.site_scope(self, kind, phase, name, site);
            cx.push(id, stack)
        });
        ScopeGuard {
            handle: self,
            token: started(token),
            _not_send: PhantomData,
        }
    }

    /// Opens a scope named `name`, opened at `file:line`, on this thread, for a caller that
    /// cannot hold a guard (the Python package, the C ABI). Close it with [`Handle::exit`].
    /// `phase` is what [`Handle::function`] takes; links and user scopes pass [`Phase::None`].
    ///
    /// Costs what a guard costs: after the first time a (parent, file, line, kind, phase, name)
    /// is seen on this thread, no lock and no allocation.
    #[inline]
    pub fn enter(
        &self,
        kind: ScopeKind,
        name: &str,
        phase: Phase,
        file: &str,
        line: u32,
    ) -> ScopeToken {
        let id = self.id();
        let token = with_context(self, |cx| {
            let parent = cx.top();
            let stack = cx.foreign_scope(self, parent, kind.into(), phase, name, file, line);
            cx.push(id, stack)
        });
        started(token)
    }

    /// [`Handle::enter`] under the stack `parent` instead of the innermost open scope: for a
    /// binding that knows better than the thread's open scopes where a call belongs (PyTorch's
    /// backward operators belong under the module whose forward made them, which is no longer
    /// open). `parent` is a stack id of this recorder (0: the root). Scopes opened inside nest
    /// under this one, and it closes like any other.
    #[inline]
    pub fn enter_under(
        &self,
        parent: u32,
        kind: ScopeKind,
        name: &str,
        phase: Phase,
        file: &str,
        line: u32,
    ) -> ScopeToken {
        self.enter_stack(self.scope_stack(parent, kind, name, phase, file, line))
    }

    /// The stack of the scope [`Handle::enter_under`] would open with these arguments, interned
    /// on first sight, without opening it: a binding that opens the same scope under the same
    /// parent many times (an operator in a module) keeps the id and opens it with
    /// [`Handle::enter_stack`], skipping the name's hash and compare (0 after the recorder is
    /// closed on this thread).
    pub fn scope_stack(
        &self,
        parent: u32,
        kind: ScopeKind,
        name: &str,
        phase: Phase,
        file: &str,
        line: u32,
    ) -> u32 {
        with_context(self, |cx| {
            cx.foreign_scope(self, parent, kind.into(), phase, name, file, line)
        })
        .unwrap_or(0)
    }

    /// Opens on this thread the scope whose stack is `stack`, an id [`Handle::scope_stack`]
    /// gave (of this recorder); it nests and closes as [`Handle::enter_under`]'s does. Stack 0
    /// opens nothing.
    #[inline]
    pub fn enter_stack(&self, stack: u32) -> ScopeToken {
        if stack == 0 {
            return started(None);
        }
        let id = self.id();
        started(with_context(self, |cx| cx.push(id, stack)))
    }

    /// Closes a scope opened by [`Handle::enter`] and records it. Closing out of order behaves
    /// as guards do (see the module documentation).
    ///
    /// A token entered on another recorder ([`ScopeError::OtherRecorder`]) or another thread
    /// ([`ScopeError::OtherThread`]), or already exited ([`ScopeError::NotOpen`]), is refused:
    /// nothing is recorded and the open scopes are untouched.
    #[inline]
    pub fn exit(&self, token: ScopeToken) -> Result<(), ScopeError> {
        if self.pop(&token)? {
            self.record_scope(token.stack, token.start);
        }
        Ok(())
    }

    /// Closes a scope opened by [`Handle::enter`] whose call did not complete (it raised):
    /// popped as [`Handle::exit`] pops it, but recorded as a `ScopeAbort` mark, not as a call
    /// (see the module documentation). Refuses the same tokens `exit` refuses.
    pub fn abort(&self, token: ScopeToken) -> Result<(), ScopeError> {
        if self.pop(&token)? {
            self.record_abort(token.stack, token.start);
        }
        Ok(())
    }

    /// Pops `token`'s scope from this thread's stack; false for a token that opened nothing.
    #[inline]
    fn pop(&self, token: &ScopeToken) -> Result<bool, ScopeError> {
        if token.stack == 0 {
            return Ok(false);
        }
        if token.recorder != self.id() {
            return Err(ScopeError::OtherRecorder);
        }
        with_context(self, |cx| {
            if cx.owner != token.context {
                return Err(ScopeError::OtherThread);
            }
            cx.close(token.depth, token.serial)
        })
        .unwrap_or(Err(ScopeError::OtherThread))?;
        Ok(true)
    }

    /// Records that the scope `stack`, opened at `start_ticks`, closed without completing.
    #[cold]
    fn record_abort(&self, stack: u32, start_ticks: u64) {
        self.record_mark(MarkKind::ScopeAbort, stack, start_ticks, 0);
    }

    /// The stack of scopes open on this thread for this recorder (0 when none): what a foreign
    /// caller attributes an allocation to in "scopes" mode.
    #[inline]
    pub fn current_stack(&self) -> u32 {
        with_context(self, |cx| cx.top()).unwrap_or(0)
    }

    /// The stack an allocation made at `site` gets: the open scopes plus a `Site` frame
    /// `file:line:name`, named after the innermost open scope (`<top>` outside any scope), as
    /// CuPy's line profile names a line after its function. Cached per (scopes, site), so a
    /// repeat costs one hash probe or less.
    #[inline]
    pub fn site_stack(&self, site: &'static Location<'static>) -> u32 {
        with_context(self, |cx| cx.site(self, site)).unwrap_or(0)
    }

    /// Interns a foreign call stack given outermost frame first (a Python traceback) as
    /// [`FrameKind::Foreign`] frames, under the scopes open on this thread when `under_scopes`,
    /// and returns the innermost stack id (the open scopes' stack, or 0, for no frames).
    ///
    /// Cached per thread frame by frame: a stack seen before costs one hash probe and a string
    /// compare per frame, with no lock and no allocation; one that shares a prefix with a known
    /// one interns only the new frames.
    pub fn foreign_stack(&self, frames: &[ForeignFrame<'_>], under_scopes: bool) -> u32 {
        with_context(self, |cx| cx.foreign_stack(self, frames, under_scopes)).unwrap_or(0)
    }
}

/// A token that opened nothing (stack 0): closing it records nothing.
const CLOSED_TOKEN: ScopeToken = ScopeToken {
    recorder: 0,
    context: 0,
    serial: 0,
    start: 0,
    stack: 0,
    depth: 0,
};

/// Stamps the start time, read after the push so that interning on a cache miss is not billed
/// to the scope. A scope that could not be opened gets an all-zero token (stack 0).
#[inline]
fn started(token: Option<ScopeToken>) -> ScopeToken {
    let mut token = token.unwrap_or(CLOSED_TOKEN);
    token.start = now_ticks();
    token
}
