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

use std::cell::RefCell;
use std::marker::PhantomData;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ScopeError;
use crate::kinds::{FrameKind, MarkKind, Phase, ScopeKind};
use crate::writer::{now_ticks, Frame, Handle};

/// The keys here are a few integers, for which SipHash's DoS resistance buys nothing and costs
/// most of a cache hit; rustc's Fx hash is the usual answer.
type FxMap<K, V> = rustc_hash::FxHashMap<K, V>;

#[inline]
fn text_hash(name: &str, file: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    name.hash(&mut h);
    file.hash(&mut h);
    h.finish()
}

/// Identity of a call site. `Location`s are statics, so the address is a stable key; two
/// addresses for the same `file:line` only cost one extra cache entry, as frames are interned
/// by content.
#[inline]
fn site_key(site: &'static Location<'static>) -> usize {
    site as *const Location<'static> as usize
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ScopeKey {
    parent: u32,
    site: usize,
    kind: FrameKind,
    phase: Phase,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ForeignScopeKey {
    parent: u32,
    line: u32,
    kind: FrameKind,
    phase: Phase,
    /// A hash of the name and file: a binding may open hundreds of names at one "site" (every
    /// PyTorch operator is opened with no file and line 0), which must not be one long list.
    text: u64,
}

/// A file and a name, compared after the key's hash matched: a hash could collide, this cannot.
struct Named {
    file: Box<str>,
    name: Box<str>,
    stack: u32,
}

struct OpenScope {
    stack: u32,
    /// Tells a closing scope whether the entry at its depth is still its own.
    serial: u64,
}

/// One thread's scopes for one recorder.
struct Context {
    recorder: u64,
    /// Unique among the contexts of the process: a token remembers it, so that a token handed
    /// to another thread is recognised as foreign there.
    owner: u64,
    open: Vec<OpenScope>,
    next_serial: u64,
    /// Serials of scopes closed early by an outer scope, whose own close has not come yet.
    orphans: Vec<u64>,
    scopes: FxMap<ScopeKey, Vec<(Box<str>, u32)>>,
    foreign_scopes: FxMap<ForeignScopeKey, Vec<Named>>,
    /// (parent stack, line) -> foreign frames with that line under that parent.
    foreign_frames: FxMap<(u32, u32), Vec<Named>>,
    /// Innermost scope name of each stack this thread opened: the name of allocation sites.
    names: FxMap<u32, Box<str>>,
    sites: FxMap<(u32, usize), u32>,
    /// The malloc hooks of one allocation ask for the same site two to four times in a row.
    last_site: (u32, usize, u32),
    /// Guards opened lately, by call site; in front of `scopes`.
    recent: [Recent; RECENT],
}

/// Slots of [`Context::recent`]. A training step opens a handful of guard sites over and over;
/// 32 slots indexed by the site's address keep them apart.
const RECENT: usize = 32;

/// A guard scope opened lately: a hit is a few compares of integers and of the name's bytes, no
/// hash and no call, where the `scopes` map costs a hash, a probe and a `memcmp`.
#[derive(Clone, Copy)]
struct Recent {
    /// 0: empty.
    site: usize,
    parent: u32,
    kind: FrameKind,
    phase: Phase,
    stack: u32,
    /// The name, as the `Box<str>` kept in `scopes` holds it: that buffer is never freed nor
    /// moved while the context lives (entries are only added).
    name: *const u8,
    len: usize,
}

const EMPTY_RECENT: Recent = Recent {
    site: 0,
    parent: 0,
    kind: FrameKind::Scope,
    phase: Phase::None,
    stack: 0,
    name: std::ptr::null(),
    len: 0,
};

/// Equality of two byte strings of the same length, inlined for the short names scopes have:
/// two overlapping word compares instead of a call to `memcmp`.
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    debug_assert_eq!(n, b.len());
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap_or([0; 8]));
    let half = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().unwrap_or([0; 4]));
    match n {
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        _ => a == b,
    }
}

/// Contexts of recorders this thread no longer uses are dropped beyond this many (their caches
/// only; nothing is lost).
const MAX_IDLE_CONTEXTS: usize = 8;

/// Orphaned scopes whose close never comes (a leaked token) must not grow a list forever; past
/// this many, the oldest are forgotten, and exiting their token then reports
/// [`ScopeError::NotOpen`].
const MAX_ORPHANS: usize = 1024;

static NEXT_CONTEXT: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CONTEXTS: RefCell<Vec<Context>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's context for `handle`'s recorder, most recently used first. `None`
/// while the thread is exiting, or if `f` would re-enter (it never does: interning writes
/// definitions, it does not allocate from a pool or open scopes).
#[inline]
fn with_context<R>(handle: &Handle, f: impl FnOnce(&mut Context) -> R) -> Option<R> {
    let id = handle.id();
    CONTEXTS
        .try_with(|cell| {
            let mut list = cell.try_borrow_mut().ok()?;
            let idx = match list.first() {
                Some(c) if c.recorder == id => 0,
                _ => find_or_insert(&mut list, id),
            };
            Some(f(&mut list[idx]))
        })
        .ok()
        .flatten()
}

#[cold]
fn find_or_insert(list: &mut Vec<Context>, recorder: u64) -> usize {
    let idx = match list.iter().position(|c| c.recorder == recorder) {
        Some(i) => i,
        None => {
            if list.len() >= MAX_IDLE_CONTEXTS {
                list.retain(|c| !c.open.is_empty() || !c.orphans.is_empty());
            }
            list.push(Context {
                recorder,
                owner: NEXT_CONTEXT.fetch_add(1, Ordering::Relaxed),
                open: Vec::new(),
                next_serial: 1,
                orphans: Vec::new(),
                scopes: FxMap::default(),
                foreign_scopes: FxMap::default(),
                foreign_frames: FxMap::default(),
                names: FxMap::default(),
                sites: FxMap::default(),
                last_site: (0, 0, 0),
                recent: [EMPTY_RECENT; RECENT],
            });
            list.len() - 1
        }
    };
    list.swap(0, idx);
    0
}

impl Context {
    #[inline]
    fn top(&self) -> u32 {
        self.open.last().map_or(0, |o| o.stack)
    }

    /// Pushes `stack` and returns the token describing it (its start time is set by the
    /// caller, after interning, so that a cache miss is not billed to the scope).
    #[inline]
    fn push(&mut self, recorder: u64, stack: u32) -> ScopeToken {
        let serial = self.next_serial;
        self.next_serial += 1;
        let depth = self.open.len() as u32;
        self.open.push(OpenScope { stack, serial });
        ScopeToken {
            recorder,
            context: self.owner,
            serial,
            start: 0,
            stack,
            depth,
        }
    }

    /// Pops the scope `(depth, serial)`, with any still open inside it.
    #[inline]
    fn close(&mut self, depth: u32, serial: u64) -> Result<(), ScopeError> {
        let depth = depth as usize;
        if self.open.get(depth).is_some_and(|o| o.serial == serial) {
            if self.open.len() > depth + 1 {
                self.orphan_above(depth);
            }
            self.open.truncate(depth);
            return Ok(());
        }
        self.close_orphan(serial)
    }

    #[cold]
    fn orphan_above(&mut self, depth: usize) {
        self.orphans
            .extend(self.open[depth + 1..].iter().map(|o| o.serial));
        if self.orphans.len() > MAX_ORPHANS {
            let excess = self.orphans.len() - MAX_ORPHANS;
            self.orphans.drain(..excess);
        }
    }

    #[cold]
    fn close_orphan(&mut self, serial: u64) -> Result<(), ScopeError> {
        match self.orphans.iter().position(|&s| s == serial) {
            Some(i) => {
                self.orphans.swap_remove(i);
                Ok(())
            }
            None => Err(ScopeError::NotOpen),
        }
    }

    #[inline]
    fn site_scope(
        &mut self,
        handle: &Handle,
        kind: FrameKind,
        phase: Phase,
        name: &str,
        site: &'static Location<'static>,
    ) -> u32 {
        let key = ScopeKey {
            parent: self.top(),
            site: site_key(site),
            kind,
            phase,
        };
        // `Location`s are 8-aligned and at least 24 bytes apart.
        let slot = (key.site >> 3) % RECENT;
        let r = self.recent[slot];
        if r.site == key.site
            && r.parent == key.parent
            && r.kind == kind
            && r.phase == phase
            && r.len == name.len()
            // SAFETY: `r.name` points at `r.len` bytes of a name kept in `scopes` (see `Recent`).
            && same_bytes(unsafe { std::slice::from_raw_parts(r.name, r.len) }, name.as_bytes())
        {
            return r.stack;
        }
        self.site_scope_slow(handle, key, name, site, slot)
    }

    #[inline(never)]
    fn site_scope_slow(
        &mut self,
        handle: &Handle,
        key: ScopeKey,
        name: &str,
        site: &'static Location<'static>,
        slot: usize,
    ) -> u32 {
        let cached = self
            .scopes
            .get(&key)
            .and_then(|v| v.iter().find(|(n, _)| &**n == name))
            .map(|(n, id)| (n.as_ptr(), *id));
        let (kept, stack) = match cached {
            Some(hit) => hit,
            None => self.intern_site_scope(handle, key, name, site),
        };
        self.recent[slot] = Recent {
            site: key.site,
            parent: key.parent,
            kind: key.kind,
            phase: key.phase,
            stack,
            name: kept,
            len: name.len(),
        };
        stack
    }

    /// Interns the scope and returns its stack id with the cached copy of its name.
    #[cold]
    fn intern_site_scope(
        &mut self,
        handle: &Handle,
        key: ScopeKey,
        name: &str,
        site: &'static Location<'static>,
    ) -> (*const u8, u32) {
        let frame = Frame {
            kind: key.kind,
            phase: key.phase,
            file: site.file().to_owned(),
            line: site.line(),
            name: name.to_owned(),
        };
        let stack = self.intern_scope(handle, key.parent, frame);
        let kept: Box<str> = name.into();
        let at = kept.as_ptr();
        self.scopes.entry(key).or_default().push((kept, stack));
        (at, stack)
    }

    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn foreign_scope(
        &mut self,
        handle: &Handle,
        parent: u32,
        kind: FrameKind,
        phase: Phase,
        name: &str,
        file: &str,
        line: u32,
    ) -> u32 {
        let key = ForeignScopeKey {
            parent,
            line,
            kind,
            phase,
            text: text_hash(name, file),
        };
        let cached = self
            .foreign_scopes
            .get(&key)
            .and_then(|v| v.iter().find(|n| &*n.name == name && &*n.file == file))
            .map(|n| n.stack);
        match cached {
            Some(id) => id,
            None => self.intern_foreign_scope(handle, key, name, file),
        }
    }

    #[cold]
    fn intern_foreign_scope(
        &mut self,
        handle: &Handle,
        key: ForeignScopeKey,
        name: &str,
        file: &str,
    ) -> u32 {
        let frame = Frame {
            kind: key.kind,
            phase: key.phase,
            file: file.to_owned(),
            line: key.line,
            name: name.to_owned(),
        };
        let stack = self.intern_scope(handle, key.parent, frame);
        self.foreign_scopes.entry(key).or_default().push(Named {
            file: file.into(),
            name: name.into(),
            stack,
        });
        stack
    }

    #[cold]
    fn intern_scope(&mut self, handle: &Handle, parent: u32, frame: Frame) -> u32 {
        let id = handle.intern_frame(&frame);
        let stack = handle.intern_stack(parent, id);
        self.names
            .entry(stack)
            .or_insert(frame.name.into_boxed_str());
        stack
    }

    #[inline]
    fn site(&mut self, handle: &Handle, site: &'static Location<'static>) -> u32 {
        let parent = self.top();
        let key = (parent, site_key(site));
        if (self.last_site.0, self.last_site.1) == key {
            return self.last_site.2;
        }
        let stack = match self.sites.get(&key) {
            Some(&id) => id,
            None => self.intern_site(handle, parent, site),
        };
        self.last_site = (key.0, key.1, stack);
        stack
    }

    #[cold]
    fn intern_site(
        &mut self,
        handle: &Handle,
        parent: u32,
        site: &'static Location<'static>,
    ) -> u32 {
        let name = self.names.get(&parent).map_or("<top>", |n| &**n);
        let frame = handle.intern_frame(&Frame {
            kind: FrameKind::Site,
            phase: Phase::None,
            file: site.file().to_owned(),
            line: site.line(),
            name: name.to_owned(),
        });
        let stack = handle.intern_stack(parent, frame);
        self.sites.insert((parent, site_key(site)), stack);
        stack
    }

    fn foreign_stack(
        &mut self,
        handle: &Handle,
        frames: &[ForeignFrame<'_>],
        under_scopes: bool,
    ) -> u32 {
        let mut parent = if under_scopes { self.top() } else { 0 };
        for f in frames {
            let cached = self
                .foreign_frames
                .get(&(parent, f.line))
                .and_then(|v| {
                    v.iter()
                        .find(|n| &*n.file == f.file && &*n.name == f.function)
                })
                .map(|n| n.stack);
            parent = match cached {
                Some(id) => id,
                None => self.intern_foreign_frame(handle, parent, f),
            };
        }
        parent
    }

    #[cold]
    fn intern_foreign_frame(&mut self, handle: &Handle, parent: u32, f: &ForeignFrame<'_>) -> u32 {
        let frame = handle.intern_frame(&Frame {
            kind: FrameKind::Foreign,
            phase: Phase::None,
            file: f.file.to_owned(),
            line: f.line,
            name: f.function.to_owned(),
        });
        let stack = handle.intern_stack(parent, frame);
        self.foreign_frames
            .entry((parent, f.line))
            .or_default()
            .push(Named {
                file: f.file.into(),
                name: f.function.into(),
                stack,
            });
        stack
    }
}

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
