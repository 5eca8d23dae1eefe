//! Scopes: the calling context that every allocation and every timer is attributed to, opened
//! where Chainer's hooks fire (a `FunctionNode` forward or backward, a `Link` call) or anywhere
//! the user wants a name in the reports.
//!
//! A scope is an RAII guard. Opening one pushes a frame (`file:line:name`, the line being where
//! the scope was opened, thanks to `#[track_caller]`) onto this thread's stack of open scopes for
//! that recorder; dropping it writes one scope event (the stack and the duration) and pops.
//!
//! # Cost
//!
//! The trace refers to stacks by interned id, and interning takes the recorder's mutex. So each
//! thread keeps, per recorder, a cache from (parent stack, call site, kind, phase, name) to the
//! stack id: once a training step has run once, opening a scope is a thread-local lookup and one
//! hash probe with a string compare, with no lock and no allocation, and closing it is a
//! truncate plus the writer's event append.
//!
//! # Threads and recorders
//!
//! Each thread has its own stack, as Chainer's thread-local hook stacks do: a guard is `!Send`
//! and closes on the thread that opened it. Stacks are also kept apart per recorder, since stack
//! ids only mean something in the file they were interned in.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::panic::Location;

use crate::fb;
use crate::writer::{now_ticks, Frame, Handle};

/// Whether a function scope is the forward or the backward computation; reports split by it as
/// Chainer's `CupyMemoryProfileHook` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Forward,
    Backward,
}

impl From<Phase> for fb::Phase {
    fn from(p: Phase) -> fb::Phase {
        match p {
            Phase::Forward => fb::Phase::Forward,
            Phase::Backward => fb::Phase::Backward,
        }
    }
}

/// The keys here are a few integers, for which SipHash's DoS resistance buys nothing and costs
/// most of a cache hit; rustc's Fx hash is the usual answer.
type FxMap<K, V> = rustc_hash::FxHashMap<K, V>;

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
    kind: u8,
    phase: u8,
}

struct OpenScope {
    stack: u32,
    /// Tells a guard whether the entry at its depth is still its own (see [`ScopeGuard`]).
    serial: u64,
}

/// One thread's scopes for one recorder.
struct Context {
    recorder: u64,
    open: Vec<OpenScope>,
    next_serial: u64,
    /// Names are compared rather than hashed into the key: a call site almost always opens
    /// one name, so this is one short compare, and unlike a hash it cannot collide.
    scopes: FxMap<ScopeKey, Vec<(Box<str>, u32)>>,
    /// Innermost scope name of each stack this thread opened: the name of allocation sites.
    names: FxMap<u32, Box<str>>,
    sites: FxMap<(u32, usize), u32>,
    /// The malloc hooks of one allocation ask for the same site two to four times in a row.
    last_site: (u32, usize, u32),
}

/// Contexts of recorders this thread no longer uses are dropped beyond this many (their caches
/// only; nothing is lost).
const MAX_IDLE_CONTEXTS: usize = 8;

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
                list.retain(|c| !c.open.is_empty());
            }
            list.push(Context {
                recorder,
                open: Vec::new(),
                next_serial: 1,
                scopes: FxMap::default(),
                names: FxMap::default(),
                sites: FxMap::default(),
                last_site: (0, 0, 0),
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

    #[inline]
    fn push(
        &mut self,
        handle: &Handle,
        kind: fb::FrameKind,
        phase: fb::Phase,
        name: &str,
        site: &'static Location<'static>,
    ) -> (u32, usize, u64) {
        let key = ScopeKey {
            parent: self.top(),
            site: site_key(site),
            kind: kind.0,
            phase: phase.0,
        };
        let cached = self
            .scopes
            .get(&key)
            .and_then(|v| v.iter().find(|(n, _)| &**n == name))
            .map(|&(_, id)| id);
        let stack = match cached {
            Some(id) => id,
            None => self.intern_scope(handle, key, kind, phase, name, site),
        };
        let serial = self.next_serial;
        self.next_serial += 1;
        let depth = self.open.len();
        self.open.push(OpenScope { stack, serial });
        (stack, depth, serial)
    }

    #[cold]
    fn intern_scope(
        &mut self,
        handle: &Handle,
        key: ScopeKey,
        kind: fb::FrameKind,
        phase: fb::Phase,
        name: &str,
        site: &'static Location<'static>,
    ) -> u32 {
        let frame = handle.intern_frame(&Frame {
            kind,
            phase,
            file: site.file().to_owned(),
            line: site.line(),
            name: name.to_owned(),
        });
        let stack = handle.intern_stack(key.parent, frame);
        self.scopes
            .entry(key)
            .or_default()
            .push((name.into(), stack));
        self.names.entry(stack).or_insert_with(|| name.into());
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
            kind: fb::FrameKind::Site,
            phase: fb::Phase::None,
            file: site.file().to_owned(),
            line: site.line(),
            name: name.to_owned(),
        });
        let stack = handle.intern_stack(parent, frame);
        self.sites.insert((parent, site_key(site)), stack);
        stack
    }
}

/// An open scope; closing it (dropping it) records it.
///
/// Guards are meant to be dropped in reverse order of opening, which Rust's scoping does by
/// itself. If one is dropped early (moved out and dropped by hand), it closes the scopes opened
/// inside it too, as far as the stack is concerned: the next scope or allocation is attributed
/// to the guard's parent. The inner guards still record their own event (with the stack they
/// were opened with) when they drop, but no longer touch the stack, so a scope opened after the
/// early drop is never popped by a stale guard.
#[must_use = "the scope closes when the guard is dropped"]
pub struct ScopeGuard<'h> {
    handle: &'h Handle,
    /// 0 when the scope could not be opened (thread exiting); then dropping records nothing.
    stack: u32,
    depth: usize,
    serial: u64,
    start: u64,
    _not_send: PhantomData<*const ()>,
}

impl ScopeGuard<'_> {
    /// The interned stack whose innermost frame is this scope.
    pub fn stack(&self) -> u32 {
        self.stack
    }
}

impl std::fmt::Debug for ScopeGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopeGuard")
            .field("stack", &self.stack)
            .field("depth", &self.depth)
            .finish()
    }
}

impl Drop for ScopeGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.stack == 0 {
            return;
        }
        let (depth, serial) = (self.depth, self.serial);
        with_context(self.handle, |cx| {
            if cx.open.get(depth).is_some_and(|o| o.serial == serial) {
                cx.open.truncate(depth);
            }
        });
        self.handle.record_scope(self.stack, self.start);
    }
}

impl Handle {
    /// Opens a function scope (a Chainer `FunctionNode` call) in `phase`, until the guard drops.
    #[track_caller]
    #[inline]
    pub fn function(&self, name: &str, phase: Phase) -> ScopeGuard<'_> {
        self.open_scope(
            fb::FrameKind::Function,
            phase.into(),
            name,
            Location::caller(),
        )
    }

    /// Opens a link scope (a Chainer `Link`'s forward; by convention `name` is its class name).
    #[track_caller]
    #[inline]
    pub fn link(&self, name: &str) -> ScopeGuard<'_> {
        self.open_scope(
            fb::FrameKind::Link,
            fb::Phase::None,
            name,
            Location::caller(),
        )
    }

    /// Opens a user scope: any region worth a row in the reports (a training step, an update).
    #[track_caller]
    #[inline]
    pub fn scope(&self, name: &str) -> ScopeGuard<'_> {
        self.open_scope(
            fb::FrameKind::Scope,
            fb::Phase::None,
            name,
            Location::caller(),
        )
    }

    #[inline]
    fn open_scope(
        &self,
        kind: fb::FrameKind,
        phase: fb::Phase,
        name: &str,
        site: &'static Location<'static>,
    ) -> ScopeGuard<'_> {
        let (stack, depth, serial) =
            with_context(self, |cx| cx.push(self, kind, phase, name, site)).unwrap_or((0, 0, 0));
        // Read after the push so that interning on a cache miss is not billed to the scope.
        let start = now_ticks();
        ScopeGuard {
            handle: self,
            stack,
            depth,
            serial,
            start,
            _not_send: PhantomData,
        }
    }
}

/// The stack of scopes open on this thread for `handle`'s recorder (0 when none): what a
/// foreign caller or a hook attributes work to.
pub fn current_stack(handle: &Handle) -> u32 {
    with_context(handle, |cx| cx.top()).unwrap_or(0)
}

/// The stack an allocation made at `site` gets: the open scopes plus a `Site` frame
/// `file:line:name`, named after the innermost open scope (`<top>` outside any scope), as
/// CuPy's line profile names a line after its function. Cached per (scopes, site), so a repeat
/// costs one hash probe or less.
#[inline]
pub fn allocation_stack(handle: &Handle, site: &'static Location<'static>) -> u32 {
    with_context(handle, |cx| cx.site(handle, site)).unwrap_or(0)
}
