//! The demo's model: an MLP classifier of `Linear` layers with ReLU and softmax cross-entropy,
//! its arrays in pool memory, forward and backward scoped as Chainer's hooks scope them, and
//! the plain-loop arithmetic it runs on the host.

use poolsight::pool::{MemoryPool, PooledMemory};
use poolsight::recorder::{Handle, Phase};

use super::train::Dataset;
use super::{DemoError, DemoOptions};

/// A row-major matrix in pool memory.
pub(super) struct Tensor {
    pub(super) mem: PooledMemory,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl Tensor {
    /// Allocates and fills a tensor. `#[track_caller]` passes the caller's line on to the pool,
    /// so the line report points into the function that needed the array, not here.
    #[track_caller]
    pub(super) fn upload(
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

    pub(super) fn download(&self) -> Result<Vec<f32>, DemoError> {
        let mut v = vec![0.0f32; self.rows * self.cols];
        self.mem.copy_to_host(as_bytes_mut(&mut v))?;
        Ok(v)
    }

    /// Overwrites the tensor in place (a parameter update writes into the same memory).
    pub(super) fn store(&self, data: &[f32]) -> Result<(), DemoError> {
        debug_assert_eq!(data.len(), self.rows * self.cols);
        Ok(self.mem.copy_from_host(as_bytes(data))?)
    }
}

pub(super) fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and u8 no alignment requirement; the length covers exactly
    // the floats' bytes, borrowed for as long as the floats are.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

pub(super) fn as_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`, and every bit pattern written through the bytes is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// A `Linear` link's parameters: `w` is inputs x outputs, so that `x w` walks rows.
pub(super) struct Linear {
    pub(super) w: Tensor,
    pub(super) b: Tensor,
}

pub(super) struct Grads {
    pub(super) w: Tensor,
    pub(super) b: Tensor,
}

/// What the forward pass keeps for the backward pass, as Chainer's graph retains arrays.
pub(super) struct Forward {
    /// Input of each `Linear`: the batch, then each `ReLU` output.
    pub(super) inputs: Vec<Tensor>,
    /// Softmax of the logits, retained by `SoftmaxCrossEntropy`.
    pub(super) probs: Tensor,
    pub(super) loss: f32,
}

pub(super) struct Model<'a> {
    pub(super) h: &'a Handle,
    pub(super) pool: &'a MemoryPool,
    pub(super) layers: Vec<Linear>,
    pub(super) lr: f32,
}

impl<'a> Model<'a> {
    pub(super) fn new(
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
    pub(super) fn classifier(&self, x: Tensor, t: &Tensor) -> Result<Forward, DemoError> {
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
    pub(super) fn mlp(&self, x: Tensor) -> Result<(Vec<Tensor>, Tensor), DemoError> {
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

    pub(super) fn linear(&self, layer: &Linear, x: &Tensor) -> Result<Tensor, DemoError> {
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

    pub(super) fn relu(&self, x: &Tensor) -> Result<Tensor, DemoError> {
        let _f = self.h.function("ReLU", Phase::Forward);
        let y: Vec<f32> = x.download()?.into_iter().map(|v| v.max(0.0)).collect();
        Tensor::upload(self.pool, x.rows, x.cols, &y)
    }

    /// Returns the softmax (kept for the backward pass) and the mean cross-entropy, which goes
    /// through the device as a one-element array like any loss would.
    pub(super) fn softmax_cross_entropy(
        &self,
        x: &Tensor,
        t: &Tensor,
    ) -> Result<(Tensor, f32), DemoError> {
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

    pub(super) fn accuracy(&self, x: &Tensor, t: &Tensor) -> Result<f32, DemoError> {
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
    pub(super) fn backward(&self, fwd: Forward, t: &Tensor) -> Result<Vec<Grads>, DemoError> {
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

    pub(super) fn softmax_cross_entropy_grad(
        &self,
        probs: &Tensor,
        t: &Tensor,
    ) -> Result<Tensor, DemoError> {
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
    pub(super) fn linear_grad(
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

    pub(super) fn relu_grad(&self, y: &Tensor, gy: &Tensor) -> Result<Tensor, DemoError> {
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
    pub(super) fn update(&self, grads: Vec<Grads>) -> Result<(), DemoError> {
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
    pub(super) fn evaluate(&self, set: &Dataset, batch: usize) -> Result<f32, DemoError> {
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
pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

/// Dot product over eight running sums: one sum would serialise every addition, since float
/// addition may not be reordered by the compiler.
#[inline]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
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

pub(super) fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// xorshift64*: small, fast and good enough for synthetic data; no dependency needed.
pub(super) struct XorShift(u64);

impl XorShift {
    pub(super) fn new(seed: u64) -> XorShift {
        // Any seed, 0 included, must give a non-zero state.
        XorShift((seed ^ 0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1), from the top 24 bits (all an f32 mantissa holds).
    pub(super) fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1).
    pub(super) fn symmetric(&mut self) -> f32 {
        2.0 * self.uniform() - 1.0
    }

    /// Approximately standard normal: four uniforms summed (variance 1/3), rescaled.
    pub(super) fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * 3.0f32.sqrt()
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub(super) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}
