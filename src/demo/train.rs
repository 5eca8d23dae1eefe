//! The training loop of the demo: a seeded synthetic task, its training and validation sets in
//! pool memory, and the epochs, marked as fastai's `PeakMemMetric` brackets them.

use poolsight::pool::MemoryPool;
use poolsight::recorder::Handle;

use super::model::{Model, Tensor, XorShift};
use super::{DemoError, DemoOptions};

/// Runs every epoch; returns the mean training loss and the validation accuracy per epoch.
pub(super) fn train(
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
pub(super) struct Task {
    pub(super) centres: Vec<f32>,
    pub(super) inputs: usize,
    pub(super) classes: usize,
}

pub(super) struct Dataset {
    pub(super) x: Vec<f32>,
    pub(super) labels: Vec<f32>,
    pub(super) inputs: usize,
}

impl Task {
    pub(super) fn new(rng: &mut XorShift, inputs: usize, classes: usize) -> Task {
        let centres = (0..inputs * classes).map(|_| rng.symmetric()).collect();
        Task {
            centres,
            inputs,
            classes,
        }
    }

    pub(super) fn sample(&self, rng: &mut XorShift, n: usize) -> Dataset {
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
    pub(super) fn len(&self) -> usize {
        self.labels.len()
    }

    /// Gathers the samples `rows` and moves them to the device (Chainer's `concat_examples`).
    /// Labels travel as f32 class indices, exact for any class count a demo has.
    pub(super) fn batch(
        &self,
        pool: &MemoryPool,
        rows: &[usize],
    ) -> Result<(Tensor, Tensor), DemoError> {
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
