//! One thread's scopes for one recorder: the stack of open scopes, and the caches that make
//! opening a scope a thread-local lookup once a step has run once (see the module
//! documentation of [`super`], "Cost").

use std::cell::RefCell;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{ForeignFrame, ScopeToken};
use crate::error::ScopeError;
use crate::kinds::{FrameKind, Phase};
use crate::writer::{Frame, Handle};

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
pub(super) struct Context {
    recorder: u64,
    /// Unique among the contexts of the process: a token remembers it, so that a token handed
    /// to another thread is recognised as foreign there.
    pub(super) owner: u64,
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
pub(super) fn with_context<R>(handle: &Handle, f: impl FnOnce(&mut Context) -> R) -> Option<R> {
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
    pub(super) fn top(&self) -> u32 {
        self.open.last().map_or(0, |o| o.stack)
    }

    /// Pushes `stack` and returns the token describing it (its start time is set by the
    /// caller, after interning, so that a cache miss is not billed to the scope).
    #[inline]
    pub(super) fn push(&mut self, recorder: u64, stack: u32) -> ScopeToken {
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
    pub(super) fn close(&mut self, depth: u32, serial: u64) -> Result<(), ScopeError> {
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
    pub(super) fn site_scope(
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
    pub(super) fn foreign_scope(
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
    pub(super) fn site(&mut self, handle: &Handle, site: &'static Location<'static>) -> u32 {
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

    pub(super) fn foreign_stack(
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
