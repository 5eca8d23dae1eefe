//! What every binding needs, written once: a recorder that can be finished exactly once and
//! refuses calls afterwards, scopes entered and exited by token, foreign frames interned once,
//! and pools addressed by pointer whose events go to the recorder's trace.
//!
//! The C functions in [`crate::ffi`] and the Python module are thin layers over these types.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
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
pub struct Session {
    recorder: Mutex<Option<Recorder>>,
    /// Set when `finish` takes the recorder: what every call checks, without the lock (scope
    /// enters and observed events from Python pass here on their way to the hot path).
    finished: AtomicBool,
    handle: Handle,
    path: String,
}

impl Session {
    pub fn create(path: impl AsRef<Path>, config: RecorderConfig) -> Result<Session, SessionError> {
        let path = path.as_ref();
        let recorder = Recorder::create(path, config)?;
        let handle = recorder.handle();
        Ok(Session {
            recorder: Mutex::new(Some(recorder)),
            finished: AtomicBool::new(false),
            handle,
            path: path.display().to_string(),
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

    /// The recorder's handle, or an error naming the file once the recording is finished.
    pub fn handle(&self) -> Result<&Handle, SessionError> {
        if self.is_finished() {
            return Err(SessionError::Finished(self.path.clone()));
        }
        Ok(&self.handle)
    }

    pub fn dropped_events(&self) -> u64 {
        self.handle.dropped_events()
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

    /// Opens a scope on the calling thread; see [`Handle::enter`].
    pub fn enter(
        &self,
        kind: ScopeKind,
        name: &str,
        phase: Phase,
        file: &str,
        line: u32,
    ) -> Result<ScopeToken, SessionError> {
        Ok(self.handle()?.enter(kind, name, phase, file, line))
    }

    /// Closes a scope opened by [`Session::enter`] on this thread.
    pub fn exit(&self, token: ScopeToken) -> Result<(), SessionError> {
        self.handle()?
            .exit(token)
            .map_err(|e| SessionError::Invalid(e.to_string()))
    }

    /// Closes a scope opened by [`Session::enter`] whose call raised: not a completed call
    /// (see [`Handle::abort`]).
    pub fn abort(&self, token: ScopeToken) -> Result<(), SessionError> {
        self.handle()?
            .abort(token)
            .map_err(|e| SessionError::Invalid(e.to_string()))
    }

    pub fn epoch_begin(&self, epoch: u32, cpu_bytes: u64) -> Result<(), SessionError> {
        self.handle()?
            .record_mark(MarkKind::EpochBegin, epoch, cpu_bytes, 0);
        Ok(())
    }

    pub fn epoch_end(&self, epoch: u32, cpu_bytes: u64, cpu_peak: u64) -> Result<(), SessionError> {
        self.handle()?
            .record_mark(MarkKind::EpochEnd, epoch, cpu_bytes, cpu_peak);
        Ok(())
    }

    /// [`Handle::epoch_begin`]: the CPU figure read from the recording's own source.
    pub fn epoch_begin_measured(&self, epoch: u32) -> Result<(), SessionError> {
        self.handle()?.epoch_begin(epoch);
        Ok(())
    }

    /// [`Handle::epoch_end`]: the CPU figure and peak from the recording's own source.
    pub fn epoch_end_measured(&self, epoch: u32) -> Result<(), SessionError> {
        self.handle()?.epoch_end(epoch);
        Ok(())
    }

    /// [`Handle::cpu_sample`]: one sample of the recording's own source, raising the epoch's
    /// RSS peak.
    pub fn cpu_sample_measured(&self) -> Result<(), SessionError> {
        self.handle()?.cpu_sample();
        Ok(())
    }

    pub fn cpu_sample(&self, cpu_bytes: u64) -> Result<(), SessionError> {
        self.handle()?
            .record_mark(MarkKind::CpuSample, 0, cpu_bytes, 0);
        Ok(())
    }

    /// The stack of scopes open on this thread (0 when none).
    pub fn current_stack(&self) -> Result<u32, SessionError> {
        Ok(self.handle()?.current_stack())
    }

    /// The stack `parent` + one foreign frame (`file:line:function`, e.g. a Python traceback
    /// line). Interned once per distinct (parent, frame); callers keep a cache in front.
    pub fn push_frame(
        &self,
        parent: u32,
        file: &str,
        line: u32,
        function: &str,
    ) -> Result<u32, SessionError> {
        self.push(parent, FrameKind::Foreign, file, line, function)
    }

    /// The stack `parent` + a user-scope frame named `name`: how an observer labels what kind
    /// of memory an allocation is (PyTorch's parameter, activation, ...), so reports break
    /// memory down by it.
    pub fn push_label(&self, parent: u32, name: &str) -> Result<u32, SessionError> {
        self.push(parent, FrameKind::Scope, "", 0, name)
    }

    fn push(
        &self,
        parent: u32,
        kind: FrameKind,
        file: &str,
        line: u32,
        name: &str,
    ) -> Result<u32, SessionError> {
        let h = self.handle()?;
        let frame = h.intern_frame(&Frame {
            kind,
            phase: Phase::None,
            file: file.to_owned(),
            line,
            name: name.to_owned(),
        });
        Ok(h.intern_stack(parent, frame))
    }

    /// Describes a device an observer records events for: its id in the events, a name,
    /// capacity (0 if unknown) and the rounding unit its allocator uses (1: none).
    pub fn define_device(
        &self,
        id: u32,
        name: &str,
        capacity: u64,
        allocation_unit: u64,
    ) -> Result<(), SessionError> {
        self.handle()?.define_device(DeviceInfo {
            id,
            name: name.to_owned(),
            capacity,
            allocation_unit: allocation_unit.max(1),
        });
        Ok(())
    }

    /// Records one memory event seen by an observer of another allocator. Once the recording
    /// is finished the event is dropped silently: an observer's late frees (a tensor collected
    /// after the recording ended) are not errors.
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
        if self.is_finished() {
            return;
        }
        self.handle.record_mem(MemRecord {
            ptr,
            bytes,
            stack,
            pmem,
            ..MemRecord::new(kind, device, stream)
        });
    }

    /// Binds `pool` to this recording: its events (and only its) go to this trace, from any
    /// thread; its device is defined in the trace.
    fn attach(&self, pool: &MemoryPool) -> Result<(), SessionError> {
        let handle = self.handle()?;
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
