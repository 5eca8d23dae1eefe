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
use poolsight::pool::{MemoryPool, PoolError, PooledMemory, TraceHook};
use poolsight::recorder::{
    CountingAllocator, CpuSource, Handle, Phase, Recorder, RecorderConfig, RecorderError, Summary,
};

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

/// Runs every epoch; returns the mean training loss and the validation accuracy per epoch.
fn train(
    h: &Handle,
    pool: &MemoryPool,
    o: &DemoOptions,
) -> Result<(Vec<f32>, Vec<f32>), DemoError> {
    let mut rng = XorShift::new(o.seed);
    let train_len = o.batch * o.steps_per_epoch as usize;
    let eval_len = o.eval_batch * o.eval_batches as usize;
    let task = Task::new(&mut rng, o.inputs, o.classes);
    let train_set = task.sample(&mut rng, train_len);
    let eval_set = task.sample(&mut rng, eval_len);
    let model = {
        let _init = h.scope("init");
        Model::new(h, pool, &mut rng, o)?
    };
    let mut order: Vec<usize> = (0..train_len).collect();
    let (mut losses, mut accuracies) = (Vec::new(), Vec::new());
    for epoch in 1..=o.epochs {
        // As fastai's PeakMemMetric empties PyTorch's cache at both edges of an epoch, so its
        // readings start and end from what is live.
        pool.free_all_blocks(None);
        h.epoch_begin(epoch);
        rng.shuffle(&mut order);
        let mut total = 0.0f64;
        for batch in order.chunks_exact(o.batch) {
            let (x, t) = {
                let _s = h.scope("concat_examples");
                train_set.batch(pool, batch)?
            };
            let fwd = model.classifier(x, &t)?;
            total += fwd.loss as f64;
            let grads = model.backward(fwd, &t)?;
            model.update(grads)?;
        }
        losses.push((total / o.steps_per_epoch as f64) as f32);
        accuracies.push(model.evaluate(&eval_set, o.eval_batch)?);
        pool.free_all_blocks(None);
        h.epoch_end(epoch);
    }
    Ok((losses, accuracies))
}

/// Class `c`'s samples scatter around a random centre; the classes overlap a little, so the
/// loss keeps falling over several epochs instead of vanishing in the first.
struct Task {
    centres: Vec<f32>,
    inputs: usize,
    classes: usize,
}

struct Dataset {
    x: Vec<f32>,
    labels: Vec<f32>,
    inputs: usize,
}

impl Task {
    fn new(rng: &mut XorShift, inputs: usize, classes: usize) -> Task {
        let centres = (0..inputs * classes).map(|_| rng.symmetric()).collect();
        Task {
            centres,
            inputs,
            classes,
        }
    }

    fn sample(&self, rng: &mut XorShift, n: usize) -> Dataset {
        let mut x = Vec::with_capacity(n * self.inputs);
        let mut labels = Vec::with_capacity(n);
        for _ in 0..n {
            let c = rng.below(self.classes);
            let centre = &self.centres[c * self.inputs..(c + 1) * self.inputs];
            x.extend(centre.iter().map(|m| m + 1.5 * rng.normal()));
            labels.push(c as f32);
        }
        Dataset {
            x,
            labels,
            inputs: self.inputs,
        }
    }
}

impl Dataset {
    fn len(&self) -> usize {
        self.labels.len()
    }

    /// Gathers the samples `rows` and moves them to the device (Chainer's `concat_examples`).
    /// Labels travel as f32 class indices, exact for any class count a demo has.
    fn batch(&self, pool: &MemoryPool, rows: &[usize]) -> Result<(Tensor, Tensor), DemoError> {
        let d = self.inputs;
        let mut x = Vec::with_capacity(rows.len() * d);
        for &r in rows {
            x.extend_from_slice(&self.x[r * d..(r + 1) * d]);
        }
        let t: Vec<f32> = rows.iter().map(|&r| self.labels[r]).collect();
        Ok((
            Tensor::upload(pool, rows.len(), d, &x)?,
            Tensor::upload(pool, rows.len(), 1, &t)?,
        ))
    }
}

/// A row-major matrix in pool memory.
struct Tensor {
    mem: PooledMemory,
    rows: usize,
    cols: usize,
}

impl Tensor {
    /// Allocates and fills a tensor. `#[track_caller]` passes the caller's line on to the pool,
    /// so the line report points into the function that needed the array, not here.
    #[track_caller]
    fn upload(
        pool: &MemoryPool,
        rows: usize,
        cols: usize,
        data: &[f32],
    ) -> Result<Tensor, DemoError> {
        debug_assert_eq!(data.len(), rows * cols);
        let mem = pool.malloc(std::mem::size_of_val(data) as u64)?;
        mem.copy_from_host(as_bytes(data))?;
        Ok(Tensor { mem, rows, cols })
    }

    fn download(&self) -> Result<Vec<f32>, DemoError> {
        let mut v = vec![0.0f32; self.rows * self.cols];
        self.mem.copy_to_host(as_bytes_mut(&mut v))?;
        Ok(v)
    }

    /// Overwrites the tensor in place (a parameter update writes into the same memory).
    fn store(&self, data: &[f32]) -> Result<(), DemoError> {
        debug_assert_eq!(data.len(), self.rows * self.cols);
        Ok(self.mem.copy_from_host(as_bytes(data))?)
    }
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and u8 no alignment requirement; the length covers exactly
    // the floats' bytes, borrowed for as long as the floats are.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn as_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`, and every bit pattern written through the bytes is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// A `Linear` link's parameters: `w` is inputs x outputs, so that `x w` walks rows.
struct Linear {
    w: Tensor,
    b: Tensor,
}

struct Grads {
    w: Tensor,
    b: Tensor,
}

/// What the forward pass keeps for the backward pass, as Chainer's graph retains arrays.
struct Forward {
    /// Input of each `Linear`: the batch, then each `ReLU` output.
    inputs: Vec<Tensor>,
    /// Softmax of the logits, retained by `SoftmaxCrossEntropy`.
    probs: Tensor,
    loss: f32,
}

struct Model<'a> {
    h: &'a Handle,
    pool: &'a MemoryPool,
    layers: Vec<Linear>,
    lr: f32,
}

impl<'a> Model<'a> {
    fn new(
        h: &'a Handle,
        pool: &'a MemoryPool,
        rng: &mut XorShift,
        o: &DemoOptions,
    ) -> Result<Model<'a>, DemoError> {
        let widths: Vec<usize> = std::iter::once(o.inputs)
            .chain(o.hidden.iter().copied())
            .chain(std::iter::once(o.classes))
            .collect();
        let mut layers = Vec::with_capacity(widths.len() - 1);
        for io in widths.windows(2) {
            let (n_in, n_out) = (io[0], io[1]);
            // He initialisation, as Chainer's default for ReLU networks.
            let scale = (6.0 / n_in as f32).sqrt();
            let w: Vec<f32> = (0..n_in * n_out).map(|_| scale * rng.symmetric()).collect();
            layers.push(Linear {
                w: Tensor::upload(pool, n_in, n_out, &w)?,
                b: Tensor::upload(pool, 1, n_out, &vec![0.0; n_out])?,
            });
        }
        Ok(Model {
            h,
            pool,
            layers,
            lr: o.learning_rate,
        })
    }

    /// `Classifier.forward`: the predictor, then the loss and the accuracy of its output.
    fn classifier(&self, x: Tensor, t: &Tensor) -> Result<Forward, DemoError> {
        let _link = self.h.link("Classifier");
        let (inputs, logits) = self.mlp(x)?;
        let (probs, loss) = self.softmax_cross_entropy(&logits, t)?;
        self.accuracy(&logits, t)?;
        Ok(Forward {
            inputs,
            probs,
            loss,
        })
    }

    /// `MLP.forward`: `Linear` links with `ReLU` between them. Returns the arrays the backward
    /// pass needs and the logits.
    fn mlp(&self, x: Tensor) -> Result<(Vec<Tensor>, Tensor), DemoError> {
        let _link = self.h.link("MLP");
        let (last, hidden) = self
            .layers
            .split_last()
            .ok_or_else(|| DemoError::Options("the model needs at least one layer".into()))?;
        let mut inputs = vec![x];
        for layer in hidden {
            let y = self.linear(layer, &inputs[inputs.len() - 1])?;
            inputs.push(self.relu(&y)?);
        }
        let logits = self.linear(last, &inputs[inputs.len() - 1])?;
        Ok((inputs, logits))
    }

    fn linear(&self, layer: &Linear, x: &Tensor) -> Result<Tensor, DemoError> {
        let _link = self.h.link("Linear");
        let _f = self.h.function("LinearFunction", Phase::Forward);
        let (n_in, n_out) = (layer.w.rows, layer.w.cols);
        let xv = x.download()?;
        let w = layer.w.download()?;
        let b = layer.b.download()?;
        let mut y = vec![0.0f32; x.rows * n_out];
        for (yi, xi) in y.chunks_exact_mut(n_out).zip(xv.chunks_exact(n_in)) {
            yi.copy_from_slice(&b);
            for (&a, wk) in xi.iter().zip(w.chunks_exact(n_out)) {
                axpy(a, wk, yi);
            }
        }
        Tensor::upload(self.pool, x.rows, n_out, &y)
    }

    fn relu(&self, x: &Tensor) -> Result<Tensor, DemoError> {
        let _f = self.h.function("ReLU", Phase::Forward);
        let y: Vec<f32> = x.download()?.into_iter().map(|v| v.max(0.0)).collect();
        Tensor::upload(self.pool, x.rows, x.cols, &y)
    }

    /// Returns the softmax (kept for the backward pass) and the mean cross-entropy, which goes
    /// through the device as a one-element array like any loss would.
    fn softmax_cross_entropy(&self, x: &Tensor, t: &Tensor) -> Result<(Tensor, f32), DemoError> {
        let _f = self.h.function("SoftmaxCrossEntropy", Phase::Forward);
        let mut p = x.download()?;
        let labels = t.download()?;
        let mut loss = 0.0f32;
        for (row, &label) in p.chunks_exact_mut(x.cols).zip(&labels) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for v in row.iter_mut() {
                *v = (*v - max).exp();
                sum += *v;
            }
            for v in row.iter_mut() {
                *v /= sum;
            }
            loss -= row[label as usize].max(f32::MIN_POSITIVE).ln();
        }
        loss /= x.rows as f32;
        let probs = Tensor::upload(self.pool, x.rows, x.cols, &p)?;
        let loss_array = Tensor::upload(self.pool, 1, 1, &[loss])?;
        Ok((probs, loss_array.download()?[0]))
    }

    fn accuracy(&self, x: &Tensor, t: &Tensor) -> Result<f32, DemoError> {
        let _f = self.h.function("Accuracy", Phase::Forward);
        let y = x.download()?;
        let labels = t.download()?;
        let hits = y
            .chunks_exact(x.cols)
            .zip(&labels)
            .filter(|(row, &label)| argmax(row) == label as usize)
            .count();
        let acc = Tensor::upload(self.pool, 1, 1, &[hits as f32 / x.rows as f32])?;
        Ok(acc.download()?[0])
    }

    /// `loss.backward()`: gradients of every parameter, last layer first, freeing each retained
    /// array once its gradient is taken.
    fn backward(&self, fwd: Forward, t: &Tensor) -> Result<Vec<Grads>, DemoError> {
        let _s = self.h.scope("backward");
        let Forward { inputs, probs, .. } = fwd;
        let mut gy = self.softmax_cross_entropy_grad(&probs, t)?;
        drop(probs);
        let mut grads = Vec::with_capacity(self.layers.len());
        // Reversed, the retained inputs are freed one by one as their layer is done.
        for (i, (layer, x)) in self.layers.iter().zip(inputs).enumerate().rev() {
            let (gx, g) = self.linear_grad(layer, &x, &gy, i > 0)?;
            grads.push(g);
            if let Some(gx) = gx {
                // `x` is the ReLU output that fed this layer.
                gy = self.relu_grad(&x, &gx)?;
            }
        }
        grads.reverse();
        Ok(grads)
    }

    fn softmax_cross_entropy_grad(&self, probs: &Tensor, t: &Tensor) -> Result<Tensor, DemoError> {
        let _f = self.h.function("SoftmaxCrossEntropy", Phase::Backward);
        let mut g = probs.download()?;
        let labels = t.download()?;
        let scale = 1.0 / probs.rows as f32;
        for (row, &label) in g.chunks_exact_mut(probs.cols).zip(&labels) {
            row[label as usize] -= 1.0;
            row.iter_mut().for_each(|v| *v *= scale);
        }
        Tensor::upload(self.pool, probs.rows, probs.cols, &g)
    }

    /// Gradients of `x w + b`: `gy wᵀ` (only when the input needs one; the batch does not),
    /// `xᵀ gy` and the column sums of `gy`.
    fn linear_grad(
        &self,
        layer: &Linear,
        x: &Tensor,
        gy: &Tensor,
        need_gx: bool,
    ) -> Result<(Option<Tensor>, Grads), DemoError> {
        let _f = self.h.function("LinearFunction", Phase::Backward);
        let (n_in, n_out) = (layer.w.rows, layer.w.cols);
        let xv = x.download()?;
        let g = gy.download()?;
        let gx = if need_gx {
            let w = layer.w.download()?;
            let mut gx = vec![0.0f32; x.rows * n_in];
            for (gxi, gi) in gx.chunks_exact_mut(n_in).zip(g.chunks_exact(n_out)) {
                for (v, wk) in gxi.iter_mut().zip(w.chunks_exact(n_out)) {
                    *v = dot(gi, wk);
                }
            }
            Some(Tensor::upload(self.pool, x.rows, n_in, &gx)?)
        } else {
            None
        };
        let mut gw = vec![0.0f32; n_in * n_out];
        let mut gb = vec![0.0f32; n_out];
        for (xi, gi) in xv.chunks_exact(n_in).zip(g.chunks_exact(n_out)) {
            for (&a, gwk) in xi.iter().zip(gw.chunks_exact_mut(n_out)) {
                axpy(a, gi, gwk);
            }
            axpy(1.0, gi, &mut gb);
        }
        let grads = Grads {
            w: Tensor::upload(self.pool, n_in, n_out, &gw)?,
            b: Tensor::upload(self.pool, 1, n_out, &gb)?,
        };
        Ok((gx, grads))
    }

    fn relu_grad(&self, y: &Tensor, gy: &Tensor) -> Result<Tensor, DemoError> {
        let _f = self.h.function("ReLU", Phase::Backward);
        let yv = y.download()?;
        let mut g = gy.download()?;
        for (gv, &yv) in g.iter_mut().zip(&yv) {
            if yv <= 0.0 {
                *gv = 0.0;
            }
        }
        Tensor::upload(self.pool, y.rows, y.cols, &g)
    }

    /// Plain SGD, `p -= lr * g`, through a temporary as a device kernel pair would.
    fn update(&self, grads: Vec<Grads>) -> Result<(), DemoError> {
        let _s = self.h.scope("SGD.update");
        for (layer, g) in self.layers.iter().zip(&grads) {
            for (p, g) in [(&layer.w, &g.w), (&layer.b, &g.b)] {
                let step: Vec<f32> = g.download()?.iter().map(|v| self.lr * v).collect();
                let step = Tensor::upload(self.pool, g.rows, g.cols, &step)?;
                let mut pv = p.download()?;
                for (v, s) in pv.iter_mut().zip(step.download()?) {
                    *v -= s;
                }
                p.store(&pv)?;
            }
        }
        Ok(())
    }

    /// Validation accuracy over `set`, forward only, as Chainer's `Evaluator` extension does.
    fn evaluate(&self, set: &Dataset, batch: usize) -> Result<f32, DemoError> {
        let _s = self.h.scope("Evaluator");
        let rows: Vec<usize> = (0..set.len()).collect();
        let mut hits = 0.0f32;
        let mut n = 0usize;
        for chunk in rows.chunks_exact(batch) {
            let (x, t) = set.batch(self.pool, chunk)?;
            let _link = self.h.link("Classifier");
            let (_, logits) = self.mlp(x)?;
            hits += self.accuracy(&logits, &t)? * chunk.len() as f32;
            n += chunk.len();
        }
        Ok(if n == 0 { 0.0 } else { hits / n as f32 })
    }
}

/// `y += a x`; the zip lets the compiler vectorise it.
#[inline]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

/// Dot product over eight running sums: one sum would serialise every addition, since float
/// addition may not be reordered by the compiler.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// xorshift64*: small, fast and good enough for synthetic data; no dependency needed.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        // Any seed, 0 included, must give a non-zero state.
        XorShift((seed ^ 0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1), from the top 24 bits (all an f32 mantissa holds).
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1).
    fn symmetric(&mut self) -> f32 {
        2.0 * self.uniform() - 1.0
    }

    /// Approximately standard normal: four uniforms summed (variance 1/3), rescaled.
    fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * 3.0f32.sqrt()
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
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
