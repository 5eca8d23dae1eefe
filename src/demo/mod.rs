//! The built-in training workload behind `poolsight demo`: a small MLP classifier trained with
//! SGD on synthetic data, recorded the way a Chainer run with CuPy's and Chainer's hooks would
//! be, so every report has something real to show.
//!
//! Chainer's structure is kept on purpose, because it is what the reports are named after: a
//! `Classifier` link wraps an `MLP` link of `Linear` links; the functions `LinearFunction`,
//! `ReLU`, `SoftmaxCrossEntropy` and `Accuracy` open function scopes in the forward phase, and
//! their gradients open them in the backward phase (outside any link, as Chainer's
//! `loss.backward()` runs); `concat_examples` moves each batch to the device; `SGD.update`
//! applies the gradients through a temporary `lr * grad`, as an elementwise kernel would.
//!
//! Every array (batch, activations, gradients, temporaries, parameters) lives in pool memory
//! and is copied in and out through the device, so the pool sees the same malloc/free pattern
//! as on a GPU. The arithmetic itself runs on the host, in plain loops: the point is the memory
//! traffic and real numbers (the loss falls), not speed, and it keeps the workload identical
//! on the simulated host device and on CUDA, where only the storage moves to the GPU.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use poolsight::pool::device::{Device, DeviceError, HostDevice};
use poolsight::pool::{MemoryPool, PoolError, TraceHook};
use poolsight::recorder::{
    CountingAllocator, CpuSource, Recorder, RecorderConfig, RecorderError, Summary,
};

mod model;
mod train;

use train::train;

/// Where the demo's arrays live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoDevice {
    /// Simulated device memory in host RAM ([`HostDevice`]); runs everywhere.
    Host,
    /// CUDA device `n` (needs the `cuda` feature and a driver).
    Cuda(u32),
}

impl FromStr for DemoDevice {
    type Err = DemoError;

    /// `host`, `cuda` (device 0) or `cuda:N`, as the CLI takes them.
    fn from_str(s: &str) -> Result<Self, DemoError> {
        match s {
            "host" => Ok(DemoDevice::Host),
            "cuda" => Ok(DemoDevice::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DemoDevice::Cuda)
                .ok_or_else(|| {
                    DemoError::Options(format!(
                        "unknown device {s:?}: expected host, cuda or cuda:N"
                    ))
                }),
        }
    }
}

impl fmt::Display for DemoDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DemoDevice::Host => f.write_str("host"),
            DemoDevice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// What to train and where to write the trace. The defaults record about 137k events in about
/// two seconds (release build, one core); tests shrink `steps_per_epoch` and `hidden`.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The trace file to write.
    pub out: PathBuf,
    pub epochs: u32,
    pub device: DemoDevice,
    /// Features per sample.
    pub inputs: usize,
    /// Widths of the hidden layers, input side first.
    pub hidden: Vec<usize>,
    pub classes: usize,
    pub batch: usize,
    /// Training batches per epoch; the training set holds exactly one epoch of samples.
    pub steps_per_epoch: u32,
    /// Validation batches run after each epoch (forward only).
    pub eval_batches: u32,
    /// Samples per validation batch: larger than a training batch, as evaluation keeps no
    /// activations for a backward pass (and so the epochs' peaks show in whole MB).
    pub eval_batch: usize,
    pub learning_rate: f32,
    /// Seeds the dataset, the initial weights and the shuffles: equal options, equal run.
    pub seed: u64,
    /// Capacity of the simulated device ([`DemoDevice::Host`]).
    pub host_capacity: u64,
    /// Exact heap bytes when [`CountingAllocator`] is the global allocator, else RSS.
    pub cpu_source: CpuSource,
    /// Replace `out` when it exists (never while another recording writes it).
    pub overwrite: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            out: PathBuf::from("demo.pstrace"),
            epochs: 3,
            device: DemoDevice::Host,
            inputs: 64,
            hidden: vec![256, 256],
            classes: 10,
            batch: 32,
            steps_per_epoch: 600,
            eval_batches: 4,
            eval_batch: 1024,
            learning_rate: 0.05,
            seed: 0x5eed,
            host_capacity: 1 << 30,
            cpu_source: if CountingAllocator::is_installed() {
                CpuSource::Heap
            } else {
                CpuSource::Rss
            },
            overwrite: false,
        }
    }
}

/// What a demo run produced.
#[derive(Debug, Clone)]
pub struct DemoOutcome {
    pub path: PathBuf,
    /// Mean training loss of each epoch.
    pub losses: Vec<f32>,
    /// Validation accuracy after each epoch, in [0, 1].
    pub accuracies: Vec<f32>,
    pub summary: Summary,
    /// The device's name as the trace records it.
    pub device_name: String,
}

/// Why the demo could not run.
#[derive(Debug)]
pub enum DemoError {
    /// The options make no sense (a zero size, an unknown device name).
    Options(String),
    /// `--device cuda:N` asked of a binary built without CUDA support.
    #[cfg(not(feature = "cuda"))]
    NoCuda,
    Device(DeviceError),
    Pool(PoolError),
    Recorder(RecorderError),
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DemoError::Options(why) => write!(f, "invalid demo options: {why}"),
            #[cfg(not(feature = "cuda"))]
            DemoError::NoCuda => f.write_str(
                "this poolsight was built without the cuda feature; rebuild with --features cuda",
            ),
            DemoError::Device(e) => write!(f, "demo device: {e}"),
            DemoError::Pool(e) => write!(f, "demo memory pool: {e}"),
            DemoError::Recorder(e) => write!(f, "demo recorder: {e}"),
        }
    }
}

impl std::error::Error for DemoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DemoError::Device(e) => Some(e),
            DemoError::Pool(e) => Some(e),
            DemoError::Recorder(e) => Some(e),
            DemoError::Options(_) => None,
            #[cfg(not(feature = "cuda"))]
            DemoError::NoCuda => None,
        }
    }
}

impl From<DeviceError> for DemoError {
    fn from(e: DeviceError) -> Self {
        DemoError::Device(e)
    }
}

impl From<PoolError> for DemoError {
    fn from(e: PoolError) -> Self {
        DemoError::Pool(e)
    }
}

impl From<RecorderError> for DemoError {
    fn from(e: RecorderError) -> Self {
        DemoError::Recorder(e)
    }
}

/// Trains the model, recording into `opts.out`, and returns the losses and the trace summary.
pub fn run(opts: &DemoOptions) -> Result<DemoOutcome, DemoError> {
    check(opts)?;
    let device = open_device(opts)?;
    let device_name = device.name();
    let pool = MemoryPool::new(device);
    let config = RecorderConfig {
        cpu_source: opts.cpu_source,
        overwrite: opts.overwrite,
        ..RecorderConfig::default()
    };
    let recorder = Recorder::create(&opts.out, config)?;
    let handle = recorder.handle();
    let (losses, accuracies) = {
        let _hook = TraceHook::for_pool(handle.clone(), &pool).install();
        let _sampler = handle.start_cpu_sampler(Duration::from_millis(10));
        let curves = train(&handle, &pool, opts)?;
        // Hand the cache back while the hook still listens, so the trace ends with the pool
        // empty, as a process exit would leave it.
        pool.free_all_blocks(None);
        curves
    };
    let summary = recorder.finish()?;
    Ok(DemoOutcome {
        path: opts.out.clone(),
        losses,
        accuracies,
        summary,
        device_name,
    })
}

fn check(o: &DemoOptions) -> Result<(), DemoError> {
    let sizes = [
        ("epochs", o.epochs as usize),
        ("inputs", o.inputs),
        ("classes", o.classes),
        ("batch", o.batch),
        ("steps_per_epoch", o.steps_per_epoch as usize),
    ];
    if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
        return Err(DemoError::Options(format!("{name} must be at least 1")));
    }
    if o.hidden.contains(&0) {
        return Err(DemoError::Options(
            "hidden layer widths must be at least 1".into(),
        ));
    }
    let largest = [o.inputs, o.classes]
        .into_iter()
        .chain(o.hidden.iter().copied())
        .max()
        .unwrap_or(0);
    let samples = o.batch as u64 * o.steps_per_epoch as u64;
    if largest > 1 << 16 || o.batch > 1 << 16 || samples > 1 << 24 {
        return Err(DemoError::Options(
            "sizes too large for a demo (at most 65536 wide, 16M samples per epoch)".into(),
        ));
    }
    Ok(())
}

fn open_device(opts: &DemoOptions) -> Result<Arc<dyn Device>, DemoError> {
    match opts.device {
        DemoDevice::Host => Ok(Arc::new(HostDevice::new(0, opts.host_capacity))),
        #[cfg(feature = "cuda")]
        DemoDevice::Cuda(n) => Ok(Arc::new(poolsight::pool::device::CudaDevice::new(n)?)),
        #[cfg(not(feature = "cuda"))]
        DemoDevice::Cuda(_) => Err(DemoError::NoCuda),
    }
}

/// The workload trains for real and records a trace: a small configuration, so that it runs in
/// a debug build within seconds.
#[cfg(test)]
mod tests {
    use super::*;

    /// Unit tests of a binary get no per-target temporary directory from Cargo: the system's,
    /// cleaned up by [`remove`].
    fn out(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("poolsight-{name}-{}.pstrace", std::process::id()))
    }

    fn remove(runs: &[&DemoOutcome]) {
        for r in runs {
            let _ = std::fs::remove_file(&r.path);
        }
    }

    fn small(name: &str) -> DemoOptions {
        DemoOptions {
            out: out(name),
            epochs: 2,
            hidden: vec![32],
            steps_per_epoch: 80,
            eval_batches: 4,
            ..DemoOptions::default()
        }
    }

    #[test]
    fn the_loss_falls_and_the_trace_is_written() {
        let opts = small("demo-small");
        let r = run(&opts).expect("demo runs");
        assert_eq!(r.losses.len(), 2);
        assert_eq!(r.accuracies.len(), 2);
        assert!(
            r.losses.iter().all(|l| l.is_finite() && *l > 0.0),
            "{:?}",
            r.losses
        );
        assert!(r.losses[1] < r.losses[0], "loss falls: {:?}", r.losses);
        let chance = 1.0 / opts.classes as f32;
        assert!(r.accuracies[1] > 3.0 * chance, "learns: {:?}", r.accuracies);

        assert_eq!(r.path, opts.out);
        let len = std::fs::metadata(&r.path).expect("trace exists").len();
        assert!(len > 0);
        assert_eq!(len, r.summary.file_bytes);
        assert_eq!(r.summary.dropped_events, 0);
        // At least a malloc and a free for each array of each step.
        let steps = (opts.epochs * opts.steps_per_epoch) as u64;
        assert!(
            r.summary.events > steps * 40,
            "{} events for {steps} steps",
            r.summary.events
        );
        remove(&[&r]);
    }

    /// The default model and validation batch hold more than a megabyte at their peak, so the
    /// demo's `epochs` table (whole MB, as fastai prints it) does not read all zeros.
    #[test]
    fn the_default_epochs_show_a_peak_in_whole_megabytes() {
        use poolsight::analyzer::{replay, tables::epochs, ReplayOptions, Trace};
        let opts = DemoOptions {
            out: out("demo-epochs"),
            epochs: 1,
            steps_per_epoch: 5,
            ..DemoOptions::default()
        };
        let r = run(&opts).expect("demo runs");
        let trace = Trace::open(&r.path).expect("trace");
        let profile = replay(&trace, 0, &ReplayOptions::default());
        let rows = epochs::epochs(&profile).epochs;
        assert_eq!(rows.len(), 1);
        assert!(rows[0].gpu_peak_mb >= 1, "{:?}", rows[0]);
        remove(&[&r]);
    }

    #[test]
    fn the_same_seed_trains_the_same_way() {
        let a = run(&small("demo-seed-a")).expect("demo runs");
        let b = run(&small("demo-seed-b")).expect("demo runs");
        assert_eq!(a.losses, b.losses);
        let c = run(&DemoOptions {
            seed: 99,
            ..small("demo-seed-c")
        })
        .expect("demo runs");
        assert_ne!(a.losses, c.losses);
        remove(&[&a, &b, &c]);
    }

    #[test]
    fn devices_parse_as_the_cli_writes_them() {
        assert_eq!("host".parse::<DemoDevice>().ok(), Some(DemoDevice::Host));
        assert_eq!("cuda".parse::<DemoDevice>().ok(), Some(DemoDevice::Cuda(0)));
        assert_eq!(
            "cuda:3".parse::<DemoDevice>().ok(),
            Some(DemoDevice::Cuda(3))
        );
        assert!("gpu".parse::<DemoDevice>().is_err());
        assert!("cuda:x".parse::<DemoDevice>().is_err());
    }

    #[test]
    fn bad_options_are_refused_before_any_file_is_written() {
        let opts = DemoOptions {
            batch: 0,
            ..small("demo-bad")
        };
        let err = run(&opts).expect_err("batch 0 is refused");
        assert!(matches!(err, DemoError::Options(_)), "{err}");
        assert!(err.to_string().contains("batch"), "{err}");
        assert!(!opts.out.exists());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_get_it() {
        let opts = DemoOptions {
            device: DemoDevice::Cuda(0),
            ..small("demo-cuda")
        };
        let err = run(&opts).expect_err("no cuda in this build");
        assert!(err.to_string().contains("--features cuda"), "{err}");
        assert!(!opts.out.exists());
    }
}
