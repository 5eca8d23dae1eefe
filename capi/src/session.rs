//! What every binding needs, written once: a recorder that can be finished exactly once and
//! refuses calls afterwards, scopes entered and exited by token, foreign frames interned once,
//! and pools addressed by pointer whose events go to the recorder's trace.
//!
//! The C functions in [`crate::ffi`] and the Python module are thin layers over these types.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use poolsight_pool::device::{Device, HostDevice};
use poolsight_pool::{AddressedPool, MemoryPool, PoolError, TraceHook};
use poolsight_recorder::{
    DeviceInfo, Frame, FrameKind, Handle, MarkKind, MemKind, MemRecord, Phase, Recorder,
    RecorderConfig, RecorderError, ScopeKind, ScopeToken, Summary,
};

/// Why a binding call was refused.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Recorder(#[from] RecorderError),
    #[error("the recording of {0} is finished; start a new one to record more")]
    Finished(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("{0}")]
    Device(String),
}

/// A recorder for bindings: shareable, finished once.
///
/// Hooks outlive recordings (a Chainer hook left registered, a fastai `fit()` after the `with`
/// block, a tensor freed at exit), and an observer must never raise into the training code it
/// observes. So once the recording is finished, every recording call here is a no-op that
/// succeeds: what it would have recorded is counted in [`Session::dropped_events`], and the
/// first one says so once on stderr. Frees and releases observed late are not counted: the
/// memory of a tensor that outlives the recording is freed after it as a matter of course.
/// What stays an error is wrong use: finishing twice, a bad argument.
pub struct Session {
    recorder: Mutex<Option<Recorder>>,
    /// Set when `finish` takes the recorder: what every call checks, without the lock (scope
    /// enters and observed events from Python pass here on their way to the hot path).
    finished: AtomicBool,
    /// Calls dropped because they came after `finish`.
    late: AtomicU64,
    handle: Handle,
    path: String,
    /// Device ids defined in the trace so far (observers' and pools').
    devices: Mutex<Vec<u32>>,
}

impl Session {
    pub fn create(path: impl AsRef<Path>, config: RecorderConfig) -> Result<Session, SessionError> {
        let path = path.as_ref();
        let recorder = Recorder::create(path, config)?;
        let handle = recorder.handle();
        Ok(Session {
            recorder: Mutex::new(Some(recorder)),
            finished: AtomicBool::new(false),
            late: AtomicU64::new(0),
            handle,
            path: path.display().to_string(),
            devices: Mutex::new(Vec::new()),
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// The trace file's absolute path (the recorder keeps it absolute), finished or not.
    pub fn file_path(&self) -> std::path::PathBuf {
        self.handle.path()
    }

    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// The recorder's handle, or an error naming the file once the recording is finished: for
    /// what starts recording (a hook being made), where a finished recording is wrong use.
    pub fn handle(&self) -> Result<&Handle, SessionError> {
        if self.is_finished() {
            return Err(SessionError::Finished(self.path.clone()));
        }
        Ok(&self.handle)
    }

    /// The handle while recording; after `finish`, `None`, counting the call as dropped.
    #[inline]
    fn live(&self) -> Option<&Handle> {
        if self.is_finished() {
            self.dropped_late();
            return None;
        }
        Some(&self.handle)
    }

    #[cold]
    fn dropped_late(&self) {
        if self.late.fetch_add(1, Ordering::Relaxed) == 0 {
            eprintln!(
                "poolsight: the recording of {} is finished; what hooks record from now on is \
                 ignored and counted in its dropped events",
                self.path
            );
        }
    }

    /// [`Handle::forked`]: this process is a child forked from the recording one.
    #[inline]
    pub fn forked(&self) -> bool {
        self.handle.forked()
    }

    /// Events that could not be recorded: the recorder's own (a full disk, a size limit), and
    /// calls that came after `finish`.
    pub fn dropped_events(&self) -> u64 {
        self.handle.dropped_events() + self.late.load(Ordering::Relaxed)
    }

    /// Seals the file. A second call is an error, never a second seal.
    pub fn finish(&self) -> Result<Summary, SessionError> {
        let recorder = lock(&self.recorder)
            .take()
            .ok_or_else(|| SessionError::Finished(self.path.clone()))?;
        // Calls racing the seal still reach the handle, which counts them as dropped once the
        // recorder is closed, as for any late event.
        self.finished.store(true, Ordering::Release);
        Ok(recorder.finish()?)
    }

    /// Opens a scope on the calling thread; see [`Handle::enter`]. After `finish`, a token
    /// that opened nothing (closing it does nothing).
    pub fn enter(
        &self,
        kind: ScopeKind,
        name: &str,
        phase: Phase,
        file: &str,
        line: u32,
    ) -> ScopeToken {
        match self.live() {
            Some(h) => h.enter(kind, name, phase, file, line),
            None => ScopeToken::from_words([0; 5]),
        }
    }

    /// [`Handle::scope_stack`]: the stack a scope of these arguments opened under `parent` has,
    /// without opening it (0 after `finish`); [`Session::enter_stack`] opens it.
    pub fn scope_stack(
        &self,
        parent: u32,
        kind: ScopeKind,
        name: &str,
        phase: Phase,
        file: &str,
        line: u32,
    ) -> u32 {
        match self.live() {
            Some(h) => h.scope_stack(parent, kind, name, phase, file, line),
            None => 0,
        }
    }

    /// Opens the scope of a stack [`Session::scope_stack`] gave (see [`Handle::enter_stack`]):
    /// together, [`Handle::enter_under`]. Stack 0 (what `scope_stack` gives after `finish`)
    /// opens nothing and is not counted again as a dropped call.
    pub fn enter_stack(&self, stack: u32) -> ScopeToken {
        if stack == 0 {
            return ScopeToken::from_words([0; 5]);
        }
        match self.live() {
            Some(h) => h.enter_stack(stack),
            None => ScopeToken::from_words([0; 5]),
        }
    }

    /// Closes a scope opened by [`Session::enter`] on this thread. Refuses a token that is not
    /// an open scope of this thread (wrong use), also after `finish`.
    pub fn exit(&self, token: ScopeToken) -> Result<(), SessionError> {
        self.close(token, Handle::exit)
    }

    /// Closes a scope opened by [`Session::enter`] whose call raised: not a completed call
    /// (see [`Handle::abort`]).
    pub fn abort(&self, token: ScopeToken) -> Result<(), SessionError> {
        self.close(token, Handle::abort)
    }

    fn close(
        &self,
        token: ScopeToken,
        how: fn(&Handle, ScopeToken) -> Result<(), poolsight_recorder::ScopeError>,
    ) -> Result<(), SessionError> {
        let Some(h) = self.live() else {
            return Ok(());
        };
        how(h, token).map_err(|e| SessionError::Invalid(e.to_string()))
    }

    pub fn epoch_begin(&self, epoch: u32, cpu_bytes: u64) {
        if let Some(h) = self.live() {
            h.record_mark(MarkKind::EpochBegin, epoch, cpu_bytes, 0);
        }
    }

    pub fn epoch_end(&self, epoch: u32, cpu_bytes: u64, cpu_peak: u64) {
        if let Some(h) = self.live() {
            h.record_mark(MarkKind::EpochEnd, epoch, cpu_bytes, cpu_peak);
        }
    }

    /// [`Handle::epoch_begin`]: the CPU figure read from the recording's own source.
    pub fn epoch_begin_measured(&self, epoch: u32) {
        if let Some(h) = self.live() {
            h.epoch_begin(epoch);
        }
    }

    /// [`Handle::epoch_end`]: the CPU figure and peak from the recording's own source.
    pub fn epoch_end_measured(&self, epoch: u32) {
        if let Some(h) = self.live() {
            h.epoch_end(epoch);
        }
    }

    /// [`Handle::cpu_sample`]: one sample of the recording's own source, raising the epoch's
    /// RSS peak.
    pub fn cpu_sample_measured(&self) {
        if let Some(h) = self.live() {
            h.cpu_sample();
        }
    }

    pub fn cpu_sample(&self, cpu_bytes: u64) {
        if let Some(h) = self.live() {
            h.record_mark(MarkKind::CpuSample, 0, cpu_bytes, 0);
        }
    }

    /// The stack of scopes open on this thread (0 when none, or after `finish`).
    pub fn current_stack(&self) -> u32 {
        self.live().map_or(0, Handle::current_stack)
    }

    /// The stack `parent` + one foreign frame (`file:line:function`, e.g. a Python traceback
    /// line). Interned once per distinct (parent, frame); callers keep a cache in front.
    pub fn push_frame(&self, parent: u32, file: &str, line: u32, function: &str) -> u32 {
        self.push(parent, FrameKind::Foreign, file, line, function)
    }

    /// The stack `parent` + a label frame named `name` (`FrameKind::Label`): how an observer labels what kind
    /// of memory an allocation is (PyTorch's parameter, activation, ...), so reports break
    /// memory down by it.
    pub fn push_label(&self, parent: u32, name: &str) -> u32 {
        self.push(parent, FrameKind::Label, "", 0, name)
    }

    fn push(&self, parent: u32, kind: FrameKind, file: &str, line: u32, name: &str) -> u32 {
        let Some(h) = self.live() else {
            return 0;
        };
        let frame = h.intern_frame(&Frame {
            kind,
            phase: Phase::None,
            file: file.to_owned(),
            line,
            name: name.to_owned(),
        });
        h.intern_stack(parent, frame)
    }

    /// Describes a device an observer records events for: its id in the events, a name,
    /// capacity (0 if unknown) and the rounding unit its allocator uses (1: none).
    pub fn define_device(&self, id: u32, name: &str, capacity: u64, allocation_unit: u64) {
        self.define_device_info(DeviceInfo::pool(id, name, capacity, allocation_unit.max(1)));
    }

    /// [`Session::define_device`] with every field: what kind of memory, and whether the events
    /// observe an allocator from outside (see [`DeviceInfo`]).
    pub fn define_device_info(&self, info: DeviceInfo) {
        self.taken(info.id);
        if let Some(h) = self.live() {
            h.define_device(info);
        }
    }

    /// The lowest device id no device of this recording has yet, taken: for an observer or a
    /// pool whose id is the recording's to choose (PyTorch's tracker, a host pool), so that two
    /// allocators recorded together never share one device's bytes.
    pub fn unused_device_id(&self) -> u32 {
        let mut taken = lock(&self.devices);
        let id = (0..).find(|i| !taken.contains(i)).unwrap_or(0);
        taken.push(id);
        id
    }

    fn taken(&self, id: u32) {
        let mut taken = lock(&self.devices);
        if !taken.contains(&id) {
            taken.push(id);
        }
    }

    /// A block observed in another allocator, which has no pool of poolsight's: its
    /// `MallocPost` and `AllocPost` (`bytes` at `ptr`, under `stack`), each block its own
    /// device allocation.
    pub fn observed(&self, device: u32, ptr: u64, bytes: u64, stack: u32) {
        self.mem_event(MemKind::MallocPost, device, 0, ptr, bytes, stack, 0);
        self.mem_event(MemKind::AllocPost, device, 0, ptr, bytes, stack, 0);
    }

    /// An observed block went back: its `FreePost` and `Release`. After `finish`, dropped
    /// without a word (see [`Session::mem_event`]).
    pub fn observed_free(&self, device: u32, ptr: u64, bytes: u64) {
        self.mem_event(MemKind::FreePost, device, 0, ptr, bytes, 0, 0);
        self.mem_event(MemKind::Release, device, 0, ptr, bytes, 0, 0);
    }

    /// The block at `ptr` (`bytes`, as its allocation was accounted) now belongs to `stack`,
    /// its live bytes unchanged: one `Relabel` event (see [`Handle::record_relabel`]), where a
    /// free and an allocation would count the block twice in cumulative figures.
    pub fn relabel(&self, device: u32, ptr: u64, bytes: u64, stack: u32) {
        self.mem_event(MemKind::Relabel, device, 0, ptr, bytes, stack, 0);
    }

    /// Records one memory event seen by an observer of another allocator. Once the recording
    /// is finished, a late free or release (a tensor collected after the recording ended) is
    /// dropped without a word; anything else is counted as dropped.
    #[allow(clippy::too_many_arguments)]
    pub fn mem_event(
        &self,
        kind: MemKind,
        device: u32,
        stream: u32,
        ptr: u64,
        bytes: u64,
        stack: u32,
        pmem: u32,
    ) {
        if self.is_finished() && Self::is_late_free(kind) {
            return;
        }
        if let Some(h) = self.live() {
            h.record_mem(MemRecord {
                ptr,
                bytes,
                stack,
                pmem,
                ..MemRecord::new(kind, device, stream)
            });
        }
    }

    /// Whether an event of `kind` only gives memory back: after `finish`, such an event is the
    /// normal end of something the recording saw begin, not something lost.
    pub fn is_late_free(kind: MemKind) -> bool {
        matches!(
            kind,
            MemKind::FreePre | MemKind::FreePost | MemKind::Release
        )
    }

    /// Binds `pool` to this recording: its events (and only its) go to this trace, from any
    /// thread; its device is defined in the trace.
    fn attach(&self, pool: &MemoryPool) -> Result<(), SessionError> {
        let handle = self.handle()?;
        self.taken(pool.device().id());
        // A pool made just now has no hook yet.
        let _ = pool.record_to(TraceHook::for_pool(handle.clone(), pool));
        Ok(())
    }
}

/// A pool whose allocations are addressed by pointer, recorded by a session when given one.
pub struct SessionPool {
    pool: AddressedPool,
    /// The recording this pool's events go to (the pool holds its `TraceHook`): held so that
    /// the session outlives every allocation made here.
    _session: Option<Arc<Session>>,
}

impl SessionPool {
    /// A pool over a simulated device of `capacity` bytes in host memory.
    pub fn host(
        session: Option<Arc<Session>>,
        device_id: u32,
        capacity: u64,
    ) -> Result<SessionPool, SessionError> {
        Self::over(session, Arc::new(HostDevice::new(device_id, capacity)))
    }

    /// A pool over CUDA device `ordinal` (needs the `cuda` feature and a driver).
    pub fn cuda(session: Option<Arc<Session>>, ordinal: u32) -> Result<SessionPool, SessionError> {
        #[cfg(feature = "cuda")]
        {
            let device = poolsight_pool::device::CudaDevice::new(ordinal)
                .map_err(|e| SessionError::Device(e.to_string()))?;
            Self::over(session, Arc::new(device))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = session;
            Err(SessionError::Device(format!(
                "cuda:{ordinal}: this build of poolsight has no CUDA support (the `cuda` feature)"
            )))
        }
    }

    fn over(
        session: Option<Arc<Session>>,
        device: Arc<dyn Device>,
    ) -> Result<SessionPool, SessionError> {
        let pool = MemoryPool::new(device);
        if let Some(s) = &session {
            s.attach(&pool)?;
        }
        Ok(SessionPool {
            pool: AddressedPool::new(pool),
            _session: session,
        })
    }

    /// Allocates; `stack` 0 records the open scopes of this thread.
    pub fn malloc(&self, size: u64, stream: u32, stack: u32) -> Result<u64, SessionError> {
        Ok(self.pool.malloc(size, stream, stack)?)
    }

    pub fn free(&self, ptr: u64) -> Result<(), SessionError> {
        self.pool
            .free(ptr)
            .map_err(|e| SessionError::Invalid(e.to_string()))
    }

    pub fn pool(&self) -> &MemoryPool {
        self.pool.pool()
    }

    pub fn live_allocations(&self) -> usize {
        self.pool.live_allocations()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
