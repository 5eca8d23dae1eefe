//! `poolsight._native`: the Python package's bindings over the Rust core. Everything here is a
//! thin layer over `poolsight-capi`'s `Session` (recording) and `SessionPool` (the pool), and
//! over the `poolsight` CLI; the Python sources in `python/poolsight/` add the idioms (context
//! managers, decorators, framework integrations).

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rustc_hash::FxHashMap;

use poolsight_capi::{Session, SessionError, SessionPool};
use poolsight_recorder::{
    DeviceInfo, DeviceKind, FrameKind, MemKind, Mode, Phase, RecorderConfig, ScopeKind, ScopeToken,
};

mod alloc_shim;
mod autograd;
mod cupy_alloc;
mod cupy_hook;
mod fake_cuda;
mod stacks;
mod torch_alloc;
mod torch_files;
mod torch_track;
mod whatif;

create_exception!(
    _native,
    PoolsightError,
    PyException,
    "A recording or pool operation poolsight refused, with the reason."
);

fn err(e: SessionError) -> PyErr {
    PoolsightError::new_err(e.to_string())
}

fn kind_of(kind: u32) -> PyResult<ScopeKind> {
    u8::try_from(kind)
        .ok()
        .and_then(|k| FrameKind::try_from(k).ok())
        .and_then(|k| ScopeKind::try_from(k).ok())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "scope kind {kind} is not FUNCTION ({}), LINK ({}) or SCOPE ({})",
                FrameKind::Function as u8,
                FrameKind::Link as u8,
                FrameKind::Scope as u8
            ))
        })
}

fn phase_of(phase: u32) -> PyResult<Phase> {
    u8::try_from(phase)
        .ok()
        .and_then(|p| Phase::try_from(p).ok())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "phase {phase} is not NONE (0), FORWARD (1) or BACKWARD (2)"
            ))
        })
}

/// An open trace file (``poolsight.record`` wraps it).
#[pyclass(module = "poolsight._native", frozen)]
pub struct Recorder {
    session: Arc<Session>,
    stacks: Mutex<stacks::PythonStacks>,
}

impl Recorder {
    fn stacks(&self) -> MutexGuard<'_, stacks::PythonStacks> {
        self.stacks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl Recorder {
    #[new]
    #[pyo3(signature = (path, *, mode="grow", ring_slots=1024, chunk_size=65536, max_bytes=None,
                        rank=None, world_size=None, cpu_source="none", command_line=None,
                        overwrite=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: &str,
        mode: &str,
        ring_slots: u32,
        chunk_size: u32,
        max_bytes: Option<u64>,
        rank: Option<u32>,
        world_size: Option<u32>,
        cpu_source: &str,
        command_line: Option<Vec<String>>,
        overwrite: bool,
    ) -> PyResult<Self> {
        let defaults = RecorderConfig::default();
        let config = RecorderConfig {
            mode: match mode {
                "grow" => Mode::Grow,
                "ring" => Mode::Ring { slots: ring_slots },
                other => {
                    return Err(PyValueError::new_err(format!(
                        "mode must be 'grow' or 'ring', not {other:?}"
                    )))
                }
            },
            chunk_size,
            max_bytes: max_bytes.unwrap_or(defaults.max_bytes),
            rank,
            world_size,
            cpu_source: match cpu_source {
                "none" => poolsight_recorder::CpuSource::None,
                "rss" => poolsight_recorder::CpuSource::Rss,
                "tracemalloc" => poolsight_recorder::CpuSource::Tracemalloc,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "cpu_source must be 'none', 'rss' or 'tracemalloc', not {other:?}"
                    )))
                }
            },
            command_line,
            overwrite,
            ..defaults
        };
        let session = py.detach(|| Session::create(path, config)).map_err(err)?;
        Ok(Recorder {
            session: Arc::new(session),
            stacks: Mutex::new(stacks::PythonStacks::new(py)?),
        })
    }

    #[getter]
    fn path(&self) -> &str {
        self.session.path()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.session.is_finished()
    }

    #[getter]
    fn dropped_events(&self) -> u64 {
        self.session.dropped_events()
    }

    /// Seals the file; returns {events, chunks, dropped_events, file_bytes, forked}
    /// (``forked``: this process was forked from the recording one, and left the file alone).
    /// With ``pack``, then writes a packed copy there (zstd ``level``, by default `poolsight
    /// pack`'s), as ``FinishPacked::finish_packed`` does, and adds ``packed_path``,
    /// ``packed_bytes`` and ``packed_warnings`` (the reader's).
    #[pyo3(signature = (pack=None, level=None))]
    fn finish<'py>(
        &self,
        py: Python<'py>,
        pack: Option<std::path::PathBuf>,
        level: Option<i32>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let opts = pack_options(level)?;
        let s = py.detach(|| self.session.finish()).map_err(err)?;
        let d = PyDict::new(py);
        d.set_item("events", s.events)?;
        d.set_item("chunks", s.chunks)?;
        d.set_item("dropped_events", s.dropped_events)?;
        d.set_item("file_bytes", s.file_bytes)?;
        d.set_item("forked", s.forked)?;
        // A forked child's copy of the recording wrote nothing: the parent packs its trace.
        if let Some(out) = pack.filter(|_| !s.forked) {
            let live = self.session.file_path();
            let done = py
                .detach(|| poolsight::pack_finished(&live, s, &out, &opts))
                .map_err(|e| PoolsightError::new_err(e.to_string()))?;
            d.set_item("packed_path", out.to_string_lossy())?;
            d.set_item("packed_bytes", done.packed.bytes_out)?;
            d.set_item("packed_warnings", warning_texts(&done.warnings))?;
        }
        Ok(d)
    }

    /// Opens a scope on this thread; returns a token for ``exit``.
    fn enter(&self, kind: u32, name: &str, phase: u32, file: &str, line: u32) -> PyResult<Token> {
        let token = self
            .session
            .enter(kind_of(kind)?, name, phase_of(phase)?, file, line);
        Ok(Token(token))
    }

    /// ``enter`` under the stack ``parent`` (a stack id of this recording) instead of the
    /// open scopes: for a call that belongs somewhere else than where the thread is (PyTorch's
    /// backward operators, under the module whose forward made them).
    fn enter_under(
        &self,
        parent: u32,
        kind: u32,
        name: &str,
        phase: u32,
        file: &str,
        line: u32,
    ) -> PyResult<Token> {
        let session = &self.session;
        let stack = session.scope_stack(parent, kind_of(kind)?, name, phase_of(phase)?, file, line);
        Ok(Token(session.enter_stack(stack)))
    }

    /// An allocation observed in another allocator, which has no pool of poolsight's: its
    /// ``MALLOC_POST`` and ``ALLOC_POST`` (``size`` bytes at ``ptr``) in one call.
    #[pyo3(signature = (size, ptr, stack, device=0))]
    fn observed(&self, size: u64, ptr: u64, stack: u32, device: u32) {
        self.session.observed(device, ptr, size, stack);
    }

    /// The block at ``ptr`` (``size`` bytes, as it was recorded) now belongs to ``stack``, its
    /// live bytes unchanged: one ``RELABEL`` event. Views of what is live at an instant move
    /// it; cumulative figures keep it where it was allocated, counted once.
    #[pyo3(signature = (size, ptr, stack, device=0))]
    fn relabel(&self, size: u64, ptr: u64, stack: u32, device: u32) {
        self.session.relabel(device, ptr, size, stack);
    }

    /// Closes the scope of ``token`` (from ``enter`` on this thread).
    fn exit(&self, token: &Token) -> PyResult<()> {
        self.session.exit(token.0).map_err(err)
    }

    /// Closes the scope of ``token`` as a call that raised: not a call of its function (no
    /// row, no occurrence, no time); nothing recorded later nests under it.
    fn abort(&self, token: &Token) -> PyResult<()> {
        self.session.abort(token.0).map_err(err)
    }

    /// Describes a device that ``mem`` events name by ``id``: ``kind`` is ``DEVICE_GPU``,
    /// ``DEVICE_CPU`` or ``DEVICE_UNSPECIFIED`` (a pool's device); ``observed`` says the events
    /// observe an allocator from outside (no pool: each block acquired when allocated).
    #[pyo3(signature = (id, name, capacity=0, allocation_unit=1, kind=0, observed=false))]
    fn define_device(
        &self,
        id: u32,
        name: &str,
        capacity: u64,
        allocation_unit: u64,
        kind: u8,
        observed: bool,
    ) -> PyResult<()> {
        let kind = DeviceKind::try_from(kind).map_err(|k| {
            PyValueError::new_err(format!(
                "device kind {k} is not one of the trace format's (poolsight._native.DEVICE_CPU, ...)"
            ))
        })?;
        self.session.define_device_info(DeviceInfo {
            id,
            name: name.to_owned(),
            capacity,
            allocation_unit: allocation_unit.max(1),
            kind,
            observed,
            prediction: None,
        });
        Ok(())
    }

    /// Records a memory event observed in another allocator: ``kind`` as in the trace format
    /// (1 malloc, 3 device alloc, 5 free; see MemKind), ``size`` bytes at ``ptr``.
    #[pyo3(signature = (kind, size, ptr=0, stack=0, device=0, stream=0))]
    fn mem(
        &self,
        kind: u8,
        size: u64,
        ptr: u64,
        stack: u32,
        device: u32,
        stream: u32,
    ) -> PyResult<()> {
        let kind = mem_kind(kind)?;
        self.session
            .mem_event(kind, device, stream, ptr, size, stack, 0);
        Ok(())
    }

    /// An observed block went back: its free and the release of its memory (the observer
    /// records each block as a device allocation of its own, an ``ALLOC_POST`` beside its
    /// ``MALLOC_POST``, as ``poolsight.torch.track`` does). Never raises: it runs from
    /// finalizers, possibly after the recording finished.
    #[pyo3(signature = (size, ptr, device=0))]
    fn freed(&self, size: u64, ptr: u64, device: u32) {
        self.session.observed_free(device, ptr, size);
    }

    /// A context manager opening one scope per ``with``.
    fn scope(
        slf: Bound<'_, Self>,
        kind: u32,
        name: String,
        phase: u32,
        file: String,
        line: u32,
    ) -> PyResult<ScopeGuard> {
        Ok(ScopeGuard {
            recorder: slf.unbind(),
            kind: kind_of(kind)?,
            name,
            phase: phase_of(phase)?,
            file,
            line,
            tokens: Mutex::new(Vec::new()),
        })
    }

    /// Marks the start of ``epoch``; ``cpu_bytes`` None: the recorder reads its own CPU source.
    #[pyo3(signature = (epoch, cpu_bytes=None))]
    fn epoch_begin(&self, epoch: u32, cpu_bytes: Option<u64>) -> PyResult<()> {
        match cpu_bytes {
            Some(b) => self.session.epoch_begin(epoch, b),
            None => self.session.epoch_begin_measured(epoch),
        }
        Ok(())
    }

    /// Marks the end of ``epoch``; without figures, the recorder reads its own CPU source
    /// (and the RSS peak its samples raised).
    #[pyo3(signature = (epoch, cpu_bytes=None, cpu_peak=None))]
    fn epoch_end(&self, epoch: u32, cpu_bytes: Option<u64>, cpu_peak: Option<u64>) -> PyResult<()> {
        match (cpu_bytes, cpu_peak) {
            (Some(b), peak) => self.session.epoch_end(epoch, b, peak.unwrap_or(b)),
            (None, None) => self.session.epoch_end_measured(epoch),
            (None, Some(_)) => {
                return Err(PyValueError::new_err(
                    "cpu_peak needs cpu_bytes: give both figures, or neither to have the recorder measure them",
                ))
            }
        }
        Ok(())
    }

    /// Records a CPU sample; ``cpu_bytes`` None: one reading of the recorder's own source.
    #[pyo3(signature = (cpu_bytes=None))]
    fn cpu_sample(&self, cpu_bytes: Option<u64>) {
        match cpu_bytes {
            Some(b) => self.session.cpu_sample(b),
            None => self.session.cpu_sample_measured(),
        }
    }

    /// The stack of the scopes open on this thread (0: none).
    fn scopes_stack(&self) -> u32 {
        self.session.current_stack()
    }

    /// The open scopes plus the caller's Python frames, as CuPy's ``LineProfileHook`` takes
    /// them: outermost first, poolsight's own frames left out, and with ``max_depth`` > 0 only
    /// the outermost ``max_depth - 1`` frames. ``skip`` leaves out innermost frames.
    #[pyo3(signature = (max_depth=0, skip=0))]
    fn python_stack(&self, py: Python<'_>, max_depth: u32, skip: u32) -> PyResult<u32> {
        if self.session.is_finished() {
            return Ok(0);
        }
        let base = self.session.current_stack();
        self.stacks()
            .stack(py, &self.session, base, max_depth, skip)
    }

    /// A stack from explicit frames ``[(file, line, function), ...]``, outermost first, under
    /// the open scopes.
    fn frames_stack(&self, frames: Vec<(String, u32, String)>) -> PyResult<u32> {
        let mut stack = self.session.current_stack();
        for (file, line, function) in &frames {
            stack = self.session.push_frame(stack, file, *line, function);
        }
        Ok(stack)
    }

    /// The stack ``parent`` plus one frame ``file:line`` in ``function`` (a line of Python
    /// code, as in ``frames_stack``). Interned: the same arguments give the same id.
    fn frame_under(&self, parent: u32, file: &str, line: u32, function: &str) -> u32 {
        self.session.push_frame(parent, file, line, function)
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() {
            "finished"
        } else {
            "recording"
        };
        format!("<poolsight._native.Recorder {:?} {state}>", self.path())
    }
}

/// An open scope, from ``Recorder.enter`` for ``Recorder.exit``.
#[pyclass(module = "poolsight._native", frozen)]
pub struct Token(ScopeToken);

#[pymethods]
impl Token {
    /// The stack id of the scope (0 for a token that opened nothing, after ``finish``).
    #[getter]
    fn stack(&self) -> u32 {
        self.0.stack()
    }
}

fn mem_kind(kind: u8) -> PyResult<MemKind> {
    MemKind::try_from(kind).map_err(|other| {
        PyValueError::new_err(format!(
            "memory event kind {other} is not one of the trace format's (poolsight._native.MALLOC_POST, ...)"
        ))
    })
}

/// ``with recorder.scope(...)``: one scope per ``with``, nesting, re-entrant and usable from
/// several threads at once (each thread closes its own). ``enter()``/``exit(token)`` are the
/// same scope for decorators, without re-reading its name on every call.
#[pyclass(module = "poolsight._native", frozen)]
pub struct ScopeGuard {
    recorder: Py<Recorder>,
    kind: ScopeKind,
    name: String,
    phase: Phase,
    file: String,
    line: u32,
    /// Tokens of the `with` blocks open on this object, with the thread that opened each.
    tokens: Mutex<Vec<(std::thread::ThreadId, ScopeToken)>>,
}

impl ScopeGuard {
    fn open(&self) -> ScopeToken {
        self.recorder
            .get()
            .session
            .enter(self.kind, &self.name, self.phase, &self.file, self.line)
    }

    fn close(&self, token: ScopeToken, raised: bool) -> PyResult<()> {
        let session = &self.recorder.get().session;
        if raised {
            session.abort(token)
        } else {
            session.exit(token)
        }
        .map_err(err)
    }
}

#[pymethods]
impl ScopeGuard {
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let g = slf.get();
        let token = g.open();
        g.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((std::thread::current().id(), token));
        Ok(slf)
    }

    /// A block left by an exception closes its scope as a call that raised.
    #[pyo3(signature = (exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let me = std::thread::current().id();
        let token = {
            let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            tokens
                .iter()
                .rposition(|(t, _)| *t == me)
                .map(|i| tokens.remove(i).1)
        };
        if let Some(token) = token {
            self.close(token, exc_type.is_some_and(|t| !t.is_none()))?;
        }
        Ok(false)
    }

    /// Opens one scope on this thread; returns its token for ``exit``.
    fn enter(&self) -> Token {
        Token(self.open())
    }

    /// Closes the scope of ``token``; ``raised``: its call did not complete.
    #[pyo3(signature = (token, raised=false))]
    fn exit(&self, token: &Token, raised: bool) -> PyResult<()> {
        self.close(token.0, raised)
    }
}

/// poolsight's CuPy-style caching pool, addressed by integers (device pointers).
#[pyclass(module = "poolsight._native", frozen)]
pub struct Pool {
    pool: SessionPool,
    recorder: Option<Py<Recorder>>,
    python_stacks: bool,
    max_depth: u32,
}

#[pymethods]
impl Pool {
    /// ``Pool(recorder=None, device="host", capacity=1 << 30, stacks=None, max_depth=None)``.
    /// ``device`` is ``"host"`` (simulated device memory of ``capacity`` bytes, real host
    /// memory) or ``"cuda:N"``; ``stacks`` and ``max_depth`` default to the recording's.
    #[new]
    #[pyo3(signature = (recorder=None, *, device="host", capacity=1u64 << 30, stacks=None, max_depth=None))]
    fn new(
        py: Python<'_>,
        recorder: Option<&Bound<'_, PyAny>>,
        device: &str,
        capacity: u64,
        stacks: Option<String>,
        max_depth: Option<u32>,
    ) -> PyResult<Self> {
        // Unless told otherwise, allocations get the stacks the recording was opened with.
        let setting = |name: &str| recorder.and_then(|r| r.getattr(name).ok());
        let stacks = match stacks {
            Some(s) => s,
            None => setting("stacks")
                .and_then(|v| v.extract::<String>().ok())
                .unwrap_or_else(|| "scopes".into()),
        };
        let max_depth = match max_depth {
            Some(d) => d,
            None => setting("max_depth")
                .and_then(|v| v.extract::<u32>().ok())
                .unwrap_or(0),
        };
        let recorder = match recorder {
            None => None,
            Some(r) => Some(native_recorder(r)?),
        };
        let python_stacks = match stacks.as_str() {
            "scopes" => false,
            "python" => true,
            other => {
                return Err(PyValueError::new_err(format!(
                    "stacks must be 'scopes' or 'python', not {other:?}"
                )))
            }
        };
        let session = recorder.as_ref().map(|r| Arc::clone(&r.get().session));
        let pool = match device {
            // Device 0, or the first id the recording's other allocators (PyTorch's tensors
            // observed by track()) left free.
            "host" => {
                let id = session.as_ref().map_or(0, |s| s.unused_device_id());
                SessionPool::host(session, id, capacity)
            }
            d => match d.strip_prefix("cuda:").and_then(|n| n.parse::<u32>().ok()) {
                Some(n) => py.detach(|| SessionPool::cuda(session, n)),
                None => {
                    return Err(PyValueError::new_err(format!(
                        "device must be 'host' or 'cuda:N', not {d:?}"
                    )))
                }
            },
        }
        .map_err(err)?;
        Ok(Pool {
            pool,
            recorder,
            python_stacks,
            max_depth,
        })
    }

    /// Allocates ``size`` bytes on ``stream``; returns the address (0 for 0 bytes). Raises
    /// ``PoolsightError`` when out of memory.
    #[pyo3(signature = (size, stream=0))]
    fn malloc(&self, py: Python<'_>, size: u64, stream: u32) -> PyResult<u64> {
        let stack = match (&self.recorder, self.python_stacks) {
            (Some(r), true) => r.get().python_stack(py, self.max_depth, 0)?,
            _ => 0,
        };
        self.pool.malloc(size, stream, stack).map_err(err)
    }

    /// Returns ``ptr`` to the pool. Raises ``PoolsightError`` for an address it did not give.
    fn free(&self, ptr: u64) -> PyResult<()> {
        self.pool.free(ptr).map_err(err)
    }

    #[getter]
    fn used_bytes(&self) -> u64 {
        self.pool.pool().used_bytes()
    }

    #[getter]
    fn total_bytes(&self) -> u64 {
        self.pool.pool().total_bytes()
    }

    #[getter]
    fn free_bytes(&self) -> u64 {
        self.pool.pool().free_bytes()
    }

    #[getter]
    fn live_allocations(&self) -> usize {
        self.pool.live_allocations()
    }

    fn free_all_blocks(&self) -> u64 {
        self.pool.pool().free_all_blocks(None)
    }

    fn set_limit(&self, bytes: u64) {
        self.pool.pool().set_limit(bytes)
    }

    #[getter]
    fn limit(&self) -> u64 {
        self.pool.pool().get_limit()
    }
}

/// A native recorder from a ``Recorder`` or from anything holding one in ``_native`` (the
/// Python ``Recording``).
fn native_recorder(obj: &Bound<'_, PyAny>) -> PyResult<Py<Recorder>> {
    if let Ok(r) = obj.cast::<Recorder>() {
        return Ok(r.clone().unbind());
    }
    match obj.getattr("_native") {
        Ok(inner) => Ok(inner.cast::<Recorder>()?.clone().unbind()),
        Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "expected a poolsight recording, got {}",
            obj.get_type().name()?
        ))),
    }
}

/// The packer's options at zstd `level` (`None`: the `poolsight pack` default).
fn pack_options(level: Option<i32>) -> PyResult<poolsight::analyzer::export::pack::PackOptions> {
    let defaults = poolsight::analyzer::export::pack::PackOptions::default();
    let level = level.unwrap_or(defaults.level);
    if !(1..=22).contains(&level) {
        return Err(PyValueError::new_err(format!(
            "a zstd level is an int in 1..22, not {level}"
        )));
    }
    Ok(poolsight::analyzer::export::pack::PackOptions { level, ..defaults })
}

fn warning_texts(warnings: &[poolsight::analyzer::Warning]) -> Vec<String> {
    warnings.iter().map(|w| w.to_string()).collect()
}

/// Packs the finished trace ``trace`` into ``output`` (what ``poolsight pack`` does); returns
/// {events, bytes_in, bytes_out, warnings}. The reader's warnings name chunks left out.
/// ``level`` defaults to the one ``poolsight pack`` uses.
#[pyfunction]
#[pyo3(signature = (trace, output, level=None))]
fn pack<'py>(
    py: Python<'py>,
    trace: std::path::PathBuf,
    output: std::path::PathBuf,
    level: Option<i32>,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = pack_options(level)?;
    let (s, warnings) = py
        .detach(|| poolsight::analyzer::export::pack::pack_file(&trace, &output, &opts))
        .map_err(|e| PoolsightError::new_err(e.to_string()))?;
    let d = PyDict::new(py);
    d.set_item("events", s.events)?;
    d.set_item("bytes_in", s.bytes_in)?;
    d.set_item("bytes_out", s.bytes_out)?;
    d.set_item("warnings", warning_texts(&warnings))?;
    Ok(d)
}

/// What a finished trace's peak is made of, as the analyzer replays it for ``poolsight report``
/// and ``flamegraph --metric peak``: {peak_bytes, peak_ns, end_bytes, devices: [(name, kind)],
/// device_peaks: [(name, kind, peak_bytes)] (each device's own peak, for every device that had
/// blocks),
/// at_peak: [(frames, bytes)], categories: [(name, at_peak_bytes, at_end_bytes)], warnings};
/// ``at_peak`` holds each stack's bytes live at the peak (``export --format folded --metric
/// peak``), outermost frame first; ``categories`` is ``poolsight categories``' (empty for a
/// trace without them). ``pytest --poolsight`` checks its limits on these figures.
#[pyfunction]
fn peak<'py>(py: Python<'py>, trace: std::path::PathBuf) -> PyResult<Bound<'py, PyDict>> {
    use poolsight::analyzer::{load, views::flamegraph};
    // Loaded as `poolsight report` loads it: PyTorch files converted, the user's frames.
    let opts = whatif::loading(None);
    let replay = poolsight::analyzer::ReplayOptions {
        live_at_peak: true,
        ..Default::default()
    };
    let loaded = py
        .detach(|| load::load(&[&trace], &opts, &replay, |_| {}))
        .map_err(|e| PoolsightError::new_err(e.to_string()))?;
    let (Some(t), Some(p)) = (loaded.traces.first(), loaded.profiles.first()) else {
        return Err(PoolsightError::new_err("no trace was read"));
    };
    let source = &p.sources[0];
    let tree = &p.tree;
    let mut at_peak: Vec<(Vec<String>, u64)> = tree
        .walk()
        .into_iter()
        .filter_map(|(i, _)| {
            let bytes = flamegraph::Metric::Peak.self_value(tree, i);
            let frames = tree.path(i).into_iter().map(flamegraph::frame_label);
            (bytes > 0).then(|| (frames.collect(), bytes))
        })
        .collect();
    at_peak.sort_by_key(|s| std::cmp::Reverse(s.1));
    let d = PyDict::new(py);
    d.set_item("peak_bytes", source.pool.peak_used_bytes)?;
    d.set_item("peak_ns", source.pool.peak_used_ns)?;
    d.set_item("end_bytes", source.pool.used_at_end_bytes)?;
    let devices: Vec<(&str, &str)> = (t.defs.devices.iter())
        .map(|d| (d.name.as_str(), d.kind.name()))
        .collect();
    d.set_item("devices", devices)?;
    // Each device's own peak, for every device that had blocks.
    let device_peaks: Vec<(&str, &str, u64)> = (source.device_peaks.iter())
        .map(|p| (p.name.as_str(), p.kind, p.peak_used_bytes))
        .collect();
    d.set_item("device_peaks", device_peaks)?;
    d.set_item("at_peak", at_peak)?;
    // By memory category (a trace whose allocations carry them): at the peak and at the end.
    let categories: Vec<(String, u64, u64)> = (source.categories.iter())
        .flat_map(|c| &c.categories)
        .map(|c| {
            (
                c.name.clone().unwrap_or_default(),
                c.at_peak_bytes,
                c.at_end_bytes,
            )
        })
        .collect();
    d.set_item("categories", categories)?;
    let warnings: Vec<String> = loaded.warnings.iter().map(|w| w.to_string()).collect();
    d.set_item("warnings", warnings)?;
    Ok(d)
}

/// Runs the poolsight CLI with ``argv`` (``argv[0]`` is the program name); returns its exit
/// code. Output goes to this process's stdout and stderr.
#[pyfunction]
fn cli(py: Python<'_>, argv: &Bound<'_, PyList>) -> PyResult<i32> {
    let args: Vec<String> = argv.extract()?;
    Ok(py.detach(|| poolsight::cli::run_args(args)).into())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PoolsightError", m.py().get_type::<PoolsightError>())?;
    // The kinds, as the trace format numbers them (poolsight_schema::kinds): MALLOC_POST, ...,
    // FUNCTION, LINK, SCOPE, and the phases NONE, FORWARD, BACKWARD.
    for k in MemKind::ALL {
        m.add(k.name().to_uppercase(), *k as u8)?;
    }
    for k in ScopeKind::ALL {
        let f = FrameKind::from(*k);
        m.add(f.name().to_uppercase(), f as u8)?;
    }
    for p in Phase::ALL {
        m.add(p.name().to_uppercase(), *p as u8)?;
    }
    for d in DeviceKind::ALL {
        m.add(format!("DEVICE_{}", d.name().to_uppercase()), *d as u8)?;
    }
    m.add_class::<Recorder>()?;
    m.add_class::<ScopeGuard>()?;
    m.add_class::<Token>()?;
    m.add_class::<Pool>()?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(pack, m)?)?;
    m.add_function(wrap_pyfunction!(peak, m)?)?;
    torch_alloc::register(m)?;
    autograd::register(m)?;
    cupy_hook::register(m)?;
    cupy_alloc::register(m)?;
    torch_files::register(m)?;
    torch_track::register(m)?;
    whatif::register(m)?;
    fake_cuda::register(m)?;
    Ok(())
}

/// Keeps `FxHashMap` in one place for the submodules.
pub(crate) type Map<K, V> = FxHashMap<K, V>;
