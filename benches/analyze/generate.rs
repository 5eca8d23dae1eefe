//! The benchmark's trace: written with the recorder's low-level API (no pool, no hooks), two
//! writer threads each running a training-like loop over a 32-block model with a caching pool
//! simulated per thread (see the benchmark's documentation).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use poolsight::recorder::writer::now_ticks;
use poolsight::recorder::{
    DeviceInfo, Frame, FrameKind, Handle, MarkKind, MemKind, MemRecord, Phase, Recorder,
    RecorderConfig,
};

use super::Res;

pub const WRITER_THREADS: u64 = 2;
const EPOCHS: u64 = 10;
const ALLOCATION_UNIT: u64 = 512;

/// One layer function: a forward scope under its block's link, its allocation site, and the
/// backward scope and site (outside any link, as Chainer's `loss.backward()` runs).
struct Func {
    fwd_scope: u32,
    fwd_site: u32,
    bwd_scope: u32,
    bwd_site: u32,
    size: Size,
}

struct Block {
    link: u32,
    funcs: Vec<Func>,
    update_scope: u32,
    update_site: u32,
    params: Size,
}

#[derive(Clone, Copy)]
struct Size {
    requested: u64,
    mem: u64,
    /// Free-list index (one per distinct `mem`).
    bin: usize,
}

struct Model {
    model_link: u32,
    data_site: u32,
    batch: Size,
    blocks: Vec<Block>,
    bins: usize,
}

const FUNCS: [(&str, &str, u32); 4] = [
    (
        "LinearFunction",
        "chainer/functions/connection/linear.py",
        21,
    ),
    (
        "LayerNormalization",
        "chainer/functions/normalization/layer_normalization.py",
        48,
    ),
    ("ReLU", "chainer/functions/activation/relu.py", 37),
    ("Dropout", "chainer/functions/noise/dropout.py", 30),
];
const BLOCKS: usize = 32;
const BATCH: u64 = 64;

impl Model {
    fn build(h: &Handle) -> Model {
        let frame = |kind, phase, file: &str, line, name: &str| {
            h.intern_frame(&Frame {
                kind,
                phase,
                file: file.to_owned(),
                line,
                name: name.to_owned(),
            })
        };
        let (fk, ph) = (FrameKind::Link, Phase::Forward);
        let classifier = h.intern_stack(0, frame(fk, ph, "train.py", 88, "Classifier"));
        let model_link = h.intern_stack(classifier, frame(fk, ph, "model.py", 140, "Model"));
        let data_site = h.intern_stack(
            0,
            frame(
                FrameKind::Site,
                Phase::None,
                "chainer/dataset/convert.py",
                62,
                "<top>",
            ),
        );
        let mut mems: Vec<u64> = Vec::new();
        let mut size = |requested: u64| {
            let mem = requested.div_ceil(ALLOCATION_UNIT) * ALLOCATION_UNIT;
            let bin = match mems.iter().position(|&m| m == mem) {
                Some(b) => b,
                None => {
                    mems.push(mem);
                    mems.len() - 1
                }
            };
            Size {
                requested,
                mem,
                bin,
            }
        };
        let batch = size(BATCH * 784 * 4);
        let update = frame(
            FrameKind::Function,
            Phase::None,
            "chainer/optimizers/sgd.py",
            25,
            "SGD.update",
        );
        let update_scope = h.intern_stack(0, update);
        let update_site = h.intern_stack(
            update_scope,
            frame(
                FrameKind::Site,
                Phase::None,
                "chainer/optimizers/sgd.py",
                31,
                "SGD.update",
            ),
        );
        let blocks = (0..BLOCKS)
            .map(|i| {
                let width = 512 + 128 * (i as u64 % 6);
                let link = h.intern_stack(
                    model_link,
                    frame(fk, ph, "model.py", 60 + i as u32, &format!("block{i}")),
                );
                let funcs = FUNCS
                    .iter()
                    .enumerate()
                    .map(|(k, &(name, file, line))| {
                        let fwd = frame(FrameKind::Function, ph, file, line, name);
                        let bwd = frame(FrameKind::Function, Phase::Backward, file, line, name);
                        let site = frame(FrameKind::Site, Phase::None, file, line + 9, name);
                        let fwd_scope = h.intern_stack(link, fwd);
                        let bwd_scope = h.intern_stack(0, bwd);
                        Func {
                            fwd_scope,
                            fwd_site: h.intern_stack(fwd_scope, site),
                            bwd_scope,
                            bwd_site: h.intern_stack(bwd_scope, site),
                            // Dropout keeps a mask next to its output: odd sizes on purpose.
                            size: size(BATCH * width * 4 + 8 * k as u64),
                        }
                    })
                    .collect();
                Block {
                    link,
                    funcs,
                    update_scope,
                    update_site,
                    params: size(width * width * 4 + 12),
                }
            })
            .collect();
        Model {
            model_link,
            data_site,
            batch,
            blocks,
            bins: mems.len(),
        }
    }
}

#[derive(Clone, Copy)]
struct Alloc {
    ptr: u64,
    pmem: u32,
    size: Size,
}

/// One thread's simulated caching pool (its own stream), writing the events a `TraceHook`
/// would write for it.
struct Pool {
    h: Handle,
    stream: u16,
    free: Vec<Vec<(u64, u32)>>,
    cached: u64,
    next_ptr: u64,
    next_pmem: u32,
    events: u64,
}

impl Pool {
    fn new(h: Handle, thread: u64, bins: usize) -> Pool {
        Pool {
            h,
            stream: thread as u16 + 1,
            free: vec![Vec::new(); bins],
            cached: 0,
            next_ptr: 0x7f00_0000_0000 + (thread << 40),
            next_pmem: (thread as u32) << 28,
            events: 0,
        }
    }

    #[inline]
    fn mem(&mut self, kind: MemKind, ptr: u64, bytes: u64, stack: u32, pmem: u32) {
        self.h.record_mem(MemRecord {
            kind,
            device: 0,
            stream: self.stream,
            ptr,
            bytes,
            stack,
            pmem,
        });
        self.events += 1;
    }

    fn malloc(&mut self, stack: u32, size: Size) -> Alloc {
        let (ptr, pmem) = match self.free[size.bin].pop() {
            Some(hit) => {
                self.cached -= size.mem;
                hit
            }
            None => {
                let ptr = self.next_ptr;
                self.next_ptr += size.mem;
                self.next_pmem = self.next_pmem.wrapping_add(1);
                self.mem(MemKind::AllocPost, ptr, size.mem, stack, 0);
                (ptr, self.next_pmem)
            }
        };
        self.mem(MemKind::MallocPost, ptr, size.requested, stack, pmem);
        Alloc { ptr, pmem, size }
    }

    fn free(&mut self, b: Alloc) {
        self.mem(MemKind::FreePost, b.ptr, b.size.mem, 0, b.pmem);
        self.free[b.size.bin].push((b.ptr, b.pmem));
        self.cached += b.size.mem;
    }

    /// `free_all_blocks`: the cache goes back to the device.
    fn release(&mut self) {
        if self.cached > 0 {
            self.mem(MemKind::Release, 0, self.cached, 0, 0);
            self.free.iter_mut().for_each(Vec::clear);
            self.cached = 0;
        }
    }

    #[inline]
    fn scope(&mut self, stack: u32, start: u64) {
        self.h.record_scope(stack, start);
        self.events += 1;
    }
}

/// One training step: batch in, forward through the blocks, backward, optimizer update.
fn step(p: &mut Pool, m: &Model, acts: &mut Vec<Alloc>) {
    let x = p.malloc(m.data_site, m.batch);
    let model_start = now_ticks();
    for b in &m.blocks {
        let link_start = now_ticks();
        for f in &b.funcs {
            let s = now_ticks();
            acts.push(p.malloc(f.fwd_site, f.size));
            p.scope(f.fwd_scope, s);
        }
        p.scope(b.link, link_start);
    }
    p.scope(m.model_link, model_start);
    let mut grad: Option<Alloc> = None;
    for b in m.blocks.iter().rev() {
        for f in b.funcs.iter().rev() {
            let s = now_ticks();
            let g = p.malloc(f.bwd_site, f.size);
            if let Some(a) = acts.pop() {
                p.free(a);
            }
            if let Some(old) = grad.replace(g) {
                p.free(old);
            }
            p.scope(f.bwd_scope, s);
        }
    }
    if let Some(g) = grad {
        p.free(g);
    }
    for b in &m.blocks {
        let s = now_ticks();
        let tmp = p.malloc(b.update_site, b.params);
        p.free(tmp);
        p.scope(b.update_scope, s);
    }
    p.free(x);
}

/// Events one writer thread records: its share, epochs marked by thread 0.
fn writer_thread(h: Handle, m: &Model, thread: u64, quota: u64) -> u64 {
    let marks = thread == 0;
    let mut p = Pool::new(h.clone(), thread, m.bins);
    let mut acts = Vec::with_capacity(BLOCKS * FUNCS.len());
    let mut marks_written = 0u64;
    let mut epoch = 0u64;
    if marks {
        h.record_mark(MarkKind::EpochBegin, 0, 0, 0);
        marks_written += 1;
    }
    while p.events + marks_written < quota {
        step(&mut p, m, &mut acts);
        let due = (epoch + 1) * quota / EPOCHS;
        if p.events + marks_written >= due && epoch + 1 < EPOCHS {
            if marks {
                h.record_mark(MarkKind::EpochEnd, epoch as u32, 0, 0);
            }
            p.release();
            epoch += 1;
            if marks {
                h.record_mark(MarkKind::EpochBegin, epoch as u32, 0, 0);
                marks_written += 2;
            }
        }
    }
    if marks {
        h.record_mark(MarkKind::EpochEnd, epoch as u32, 0, 0);
        marks_written += 1;
    }
    p.events + marks_written
}

/// Writes a trace of about `events` events (whole steps); returns (events, file bytes).
pub fn generate(path: &Path, events: u64) -> Res<(u64, u64)> {
    let config = RecorderConfig {
        devices: vec![DeviceInfo::pool(0, "bench:0", 80 << 30, ALLOCATION_UNIT)],
        command_line: Some(vec!["poolsight-bench-analyze".into(), events.to_string()]),
        calibration: Duration::from_millis(2),
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(path, config).map_err(|e| e.to_string())?;
    let model = Arc::new(Model::build(&rec.handle()));
    let written: Vec<u64> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..WRITER_THREADS)
            .map(|t| {
                let (h, m) = (rec.handle(), &model);
                let quota = events / WRITER_THREADS + u64::from(t < events % WRITER_THREADS);
                std::thread::Builder::new()
                    .name(format!("trainer-{t}"))
                    .spawn_scoped(s, move || writer_thread(h, m, t, quota))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| match t {
                Ok(j) => j.join().unwrap_or(0),
                Err(_) => 0,
            })
            .collect()
    });
    if written.contains(&0) {
        return Err("a writer thread could not be started or panicked".into());
    }
    let summary = rec.finish().map_err(|e| e.to_string())?;
    if summary.dropped_events > 0 {
        return Err(format!(
            "the recorder dropped {} events",
            summary.dropped_events
        ));
    }
    Ok((written.iter().sum(), summary.file_bytes))
}
