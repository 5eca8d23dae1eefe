//! Memory categories of a file that has none (a CUDA snapshot, a profiler trace read without
//! its categories), inferred from what each allocation's stack says and from lifetimes: when it
//! was made (forward, backward, optimizer step, outside them) and whether it outlived the part
//! of the step that made it. One rule a category, in order (docs/pytorch-files.md lists them
//! with their evidence):
//!
//! 1. **before recording**: live from the start, and nothing in its stack (if it has one)
//!    says what it is: no module construction, forward, backward or optimizer step.
//! 2. **gradient**: made in the backward pass and still live when the backward pass is over
//!    (the next allocation outside it); **temporary** when freed inside it.
//! 3. **optimizer_state**: made by an optimizer ([`optimizer_frame`]: a frame under
//!    `torch/optim/`, such as the step wrapper every `Optimizer` subclass's `step` runs in, or
//!    an optimizer library's; or an `Optimizer.step#...` / `Optimizer.zero_grad#...` range
//!    open) with no module `forward` or `closure` run inside it (a closure's forward stays the
//!    model's), and still live when the step is over; **temporary** otherwise.
//! 4. **parameter**: made by a module's construction or its move to a device (`__init__`,
//!    `_apply`, `reset_parameters`, `torch/nn/init.py`, `torch/nn/parameter.py`, `torch.load`)
//!    and never freed. A block live from the start made under a module's forward is an
//!    **activation**.
//! 5. **input**: made outside every module's forward, before the first module forward of its
//!    step, and still live when that forward began.
//! 6. **activation**: made outside backward and optimizer steps, still live when a backward
//!    pass that came after it began (autograd saved it), or never freed.
//! 7. **temporary**: everything else: made and freed before any backward pass used it; and,
//!    whenever it was made, a library's workspace ([`workspace_frame`]: cuBLAS's, which each
//!    thread's handle takes on its first matrix product and keeps), scratch that no tensor
//!    owns, whose life says nothing of what it is.
//!
//! The inference needs only what a stack says of itself ([`Evidence`]) and the order of
//! events: it is a pure function of them.

/// What one allocation's stack and context say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evidence {
    /// Made in the backward pass (the autograd engine's frames, an autograd node,
    /// `torch.autograd.backward`).
    pub backward: bool,
    /// Made in an optimizer step.
    pub optimizer: bool,
    /// Made under a module's `forward`.
    pub forward: bool,
    /// Made by a module's construction or move (see rule 4).
    pub parameter: bool,
    /// The block was live from the start of the file.
    pub before: bool,
    /// The file holds frames for it.
    pub has_stack: bool,
    /// Some of its frames are Python code.
    pub python: bool,
    /// The model runs in it: a module's `forward`, or a function named `closure` of the
    /// user's (what `optimizer.step(closure)` runs is the model's, not the optimizer's).
    pub model: bool,
    /// A library took it for its workspace ([`workspace_frame`]).
    pub workspace: bool,
}

impl Evidence {
    /// The evidence of an allocation made while an optimizer's range (`Optimizer.step#...`,
    /// [`is_optimizer_range`]) was open: the optimizer's, unless it is the backward pass or
    /// the model run inside the step (a closure).
    pub fn in_optimizer_range(self) -> Evidence {
        Evidence {
            optimizer: self.optimizer || (!self.backward && !self.model),
            ..self
        }
    }
}

/// Whether a `record_function` range is an optimizer's own (`Optimizer.step#AdamW.step`,
/// `Optimizer.zero_grad#AdamW.zero_grad`: `torch.optim.Optimizer` opens them for every
/// subclass, a library's or the user's own).
pub fn is_optimizer_range(name: &str) -> bool {
    name.starts_with("Optimizer.step") || name.starts_with("Optimizer.zero_grad")
}

/// One allocation: its evidence and the position of its free among the allocations (the
/// index of the first allocation made after it was freed; `None`: never freed).
#[derive(Debug, Clone, Copy)]
pub struct Life {
    pub evidence: Evidence,
    pub freed_before: Option<usize>,
    /// The same storage made again right where it was freed (a snapshot PyTorch made from a
    /// profile frees and allocates a tensor at each in-place update, one version after
    /// another): the earlier version, an allocation or a block live from the start.
    pub prev: Option<Prev>,
}

/// What an allocation continues ([`Life::prev`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prev {
    Life(usize),
    /// A block live from the start of the file.
    Before,
}

/// What a stack says ([`Evidence`] without its lifetime), its frames `(name, file, line)`
/// outermost first: the backward pass by its engine's frames, an autograd node or
/// `torch.autograd.backward`; an optimizer's frames ([`optimizer_frame`]) unless the model
/// runs inside them (a module's `forward`, or the user's code that a PyTorch optimizer's
/// `step`, or a hand-written one from another file, calls: a closure); a module's `forward`;
/// a module's construction. The user's code that `Optimizer`'s step wrapper calls directly is
/// a hand-written optimizer's `step`, and what it calls in its own file is the optimizer's.
pub fn evidence_of(raw: &[(&str, &str, u32)]) -> Evidence {
    let mut e = Evidence {
        backward: crate::frames::in_backward(raw),
        has_stack: !raw.is_empty(),
        ..Default::default()
    };
    // The last frame under `torch/optim/`, and the file of the user's own optimizer code (a
    // subclass's `step`, which the base class's step wrapper calls).
    let mut last_torch_optim: Option<&str> = None;
    let mut owner: Option<&str> = None;
    for &(name, file, _) in raw {
        if !file.ends_with(".py") {
            e.workspace |= workspace_frame(name);
            continue;
        }
        e.python = true;
        let user = crate::frames::is_user_file(file);
        if optimizer_frame(file, name) {
            e.optimizer = true;
            if in_optimizer(file) {
                last_torch_optim = Some(file);
            } else if user {
                owner = Some(file);
            }
        } else if e.optimizer
            && user
            && owner.is_none()
            && last_torch_optim.is_some_and(|f| f.ends_with("torch/optim/optimizer.py"))
        {
            // `Optimizer`'s wrapper called a subclass's step: the optimizer is the user's.
            owner = Some(file);
        } else if e.optimizer && user && owner != Some(file) {
            // The optimizer called the user's code: a closure, the model's.
            e.optimizer = false;
            e.model = true;
        }
        if name == "forward" {
            e.forward = true;
            e.model = true;
            e.optimizer = false;
        }
        e.model |= user && name == "closure";
        e.parameter |= makes_parameter(file, name);
    }
    e
}

/// The category of a block live from the start, by what its stack says ([`evidence_of`]).
pub fn initial(e: Evidence) -> &'static str {
    categories(&[Life {
        evidence: Evidence { before: true, ..e },
        freed_before: None,
        prev: None,
    }])[0]
}

pub const PARAMETER: &str = "parameter";
pub const GRADIENT: &str = "gradient";
pub const OPTIMIZER_STATE: &str = "optimizer_state";
pub const INPUT: &str = "input";
pub const ACTIVATION: &str = "activation";
pub const TEMPORARY: &str = "temporary";
pub const BEFORE_RECORDING: &str = "before recording";

/// The file of the label frame an inferred category is written with: reports tell inferred
/// categories from recorded ones by it (`categories`' `"inferred": true`).
pub const INFERRED: &str = poolsight_schema::INFERRED_LABEL;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Backward,
    Optimizer,
    Other,
}

fn part(e: &Evidence) -> Part {
    if e.backward {
        Part::Backward
    } else if e.optimizer {
        Part::Optimizer
    } else {
        Part::Other
    }
}

/// The category of each allocation of `lives`, given in the order they were made. The
/// versions of one storage ([`Life::prev`]) are one allocation, made as the first was and
/// freed as the last was: they share its category. A storage live from the start and made
/// again in an optimizer step (updated in place) is a parameter.
pub fn categories(lives: &[Life]) -> Vec<&'static str> {
    let n = lives.len();
    let mut head: Vec<usize> = (0..n).collect();
    let mut from_start = vec![false; n];
    for i in 0..n {
        match lives[i].prev {
            Some(Prev::Life(p)) if p < i => head[i] = head[p],
            Some(Prev::Before) => from_start[i] = true,
            _ => {}
        }
    }
    // Each storage's life: its first version's evidence, its last version's free.
    let mut merged: Vec<Life> = lives.to_vec();
    let mut updated_by_optimizer = vec![false; n];
    // Where an allocation without a stack was made: in the part of the last one with a stack
    // (PyTorch gives the versions of a storage that was there before the profile no stack).
    let mut context = Part::Other;
    for i in 0..n {
        let e = &lives[i].evidence;
        let here = if e.has_stack { part(e) } else { context };
        if e.has_stack {
            context = here;
        }
        updated_by_optimizer[head[i]] |= here == Part::Optimizer;
        let h = head[i];
        if h != i {
            merged[h].freed_before = match (merged[h].freed_before, lives[i].freed_before) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
    }
    let single = single_categories(&merged);
    (0..n)
        .map(|i| {
            let h = head[i];
            if from_start[h] {
                if updated_by_optimizer[h] {
                    PARAMETER
                } else {
                    BEFORE_RECORDING
                }
            } else {
                single[h]
            }
        })
        .collect()
}

/// [`categories`] of allocations each one storage.
fn single_categories(lives: &[Life]) -> Vec<&'static str> {
    let n = lives.len();
    // For each allocation: where the stretch of its part (backward, optimizer, other) ends,
    // as the index of the first allocation of another part after it (n: none).
    let mut part_end = vec![n; n];
    for i in (0..n.saturating_sub(1)).rev() {
        let (p, q) = (part(&lives[i].evidence), part(&lives[i + 1].evidence));
        part_end[i] = if p == q { part_end[i + 1] } else { i + 1 };
    }
    // The first backward allocation at or after each index (n: none).
    let mut next_backward = vec![n; n + 1];
    for i in (0..n).rev() {
        next_backward[i] = if lives[i].evidence.backward {
            i
        } else {
            next_backward[i + 1]
        };
    }
    // The first module-forward allocation of each stretch outside backward and optimizer,
    // for inputs: index of the first `forward` allocation at or after i within its stretch.
    let mut next_forward = vec![n; n + 1];
    for i in (0..n).rev() {
        let e = &lives[i].evidence;
        next_forward[i] = if part(e) != Part::Other {
            n
        } else if e.forward {
            i
        } else {
            next_forward[i + 1]
        };
    }
    let outlives = |l: &Life, end: usize| l.freed_before.is_none_or(|f| f > end);
    lives
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let e = &l.evidence;
            if e.before && !e.has_stack {
                return BEFORE_RECORDING;
            }
            if e.workspace {
                return TEMPORARY;
            }
            match part(e) {
                Part::Backward if outlives(l, part_end[i]) => GRADIENT,
                Part::Optimizer if outlives(l, part_end[i]) => OPTIMIZER_STATE,
                Part::Backward | Part::Optimizer => TEMPORARY,
                Part::Other => {
                    let backward_after = next_backward[i + 1];
                    if e.parameter && l.freed_before.is_none() {
                        return PARAMETER;
                    }
                    if e.before {
                        return if e.forward {
                            ACTIVATION
                        } else {
                            BEFORE_RECORDING
                        };
                    }
                    let forward = next_forward[i + 1];
                    if !e.forward && forward < n && outlives(l, forward) {
                        return INPUT;
                    }
                    if backward_after < n && outlives(l, backward_after) {
                        return ACTIVATION;
                    }
                    if l.freed_before.is_none() {
                        return ACTIVATION;
                    }
                    TEMPORARY
                }
            }
        })
        .collect()
}

/// Whether a native frame is a library taking its workspace (rule 7): cuBLAS's through
/// PyTorch's handle pool (`at::cuda::getNewWorkspace()`, `getCUDABlasLtWorkspace()`, one per
/// thread's handle and stream, kept for the life of the process, so the autograd thread's
/// would read as a gradient and the forward thread's as an activation).
pub fn workspace_frame(name: &str) -> bool {
    name.starts_with("at::cuda::getNewWorkspace") || name.contains("getCUDABlasLtWorkspace")
}

/// Whether a Python frame says the block is a parameter being made (rule 4).
pub fn makes_parameter(file: &str, function: &str) -> bool {
    (file.contains("torch/nn/modules/")
        && matches!(
            function,
            "__init__" | "_apply" | "reset_parameters" | "to" | "cuda" | "convert"
        ))
        || file.contains("torch/nn/init.py")
        || file.contains("torch/nn/parameter.py")
        || file.contains("torch/serialization.py")
}

/// Whether a Python frame is an optimizer's (rule 3).
pub fn in_optimizer(file: &str) -> bool {
    file.contains("torch/optim/") && !file.contains("lr_scheduler") && !file.contains("swa_utils")
}

/// Whether a Python frame says an optimizer is at work (rule 3): PyTorch's optimizers and the
/// `Optimizer` base class ([`in_optimizer`]: its step wrapper, `zero_grad`, `load_state_dict`,
/// `__init__`), an installed package's optimizer module (a directory or file named for one:
/// `bitsandbytes/optim/`, `apex/optimizers/`, `torchao/optim/`, `low_bit_optim/`), a user's
/// `zero_grad`, or the `__init__` of a user's file named for optimizers (`optimizers.py`:
/// state made eagerly in a hand-written optimizer's constructor, where no range or PyTorch
/// frame is open; a class elsewhere cannot be told from a module's construction).
pub fn optimizer_frame(file: &str, function: &str) -> bool {
    if in_optimizer(file) {
        return true;
    }
    if file.contains("torch/") || file.contains("lr_scheduler") {
        return false;
    }
    let names_optimizer = |part: &str| {
        let stem = part
            .strip_suffix(".py")
            .unwrap_or(part)
            .to_ascii_lowercase();
        ["optim", "optimizer", "optimizers"]
            .iter()
            .any(|o| stem == *o || stem.ends_with(&format!("_{o}")))
    };
    let parts: Vec<&str> = file.split(['/', '\\']).collect();
    if crate::frames::is_user_file(file) {
        return function == "zero_grad"
            || (function == "__init__" && parts.last().is_some_and(|p| names_optimizer(p)));
    }
    parts.iter().any(|p| names_optimizer(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(e: Evidence, freed_before: Option<usize>) -> Life {
        Life {
            evidence: e,
            freed_before,
            prev: None,
        }
    }

    #[test]
    fn a_cublas_workspace_is_temporary_in_forward_and_in_backward() {
        // As the real snapshots' stacks read (C++ frames, outermost first): each thread's
        // cuBLAS handle takes its workspace on its first matrix product and keeps it.
        let backward = evidence_of(&[
            ("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??", 0),
            ("torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)", "??", 0),
            ("at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)", "??", 0),
            ("at::cuda::getCurrentCUDABlasHandle()", "??", 0),
            ("at::cuda::getNewWorkspace()", "??", 0),
        ]);
        assert!(backward.backward && backward.workspace, "{backward:?}");
        let forward = evidence_of(&[
            ("forward", "model.py", 22),
            ("einsum", "torch/functional.py", 402),
            ("at::cuda::getCurrentCUDABlasHandle()", "??", 0),
            ("at::cuda::getNewWorkspace()", "??", 0),
        ]);
        assert!(forward.forward && forward.workspace, "{forward:?}");
        let plain_bwd = evidence_of(&[(
            "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)",
            "??",
            0,
        )]);
        assert!(plain_bwd.backward && !plain_bwd.workspace);
        // Never freed: without the rule, a gradient and an activation.
        let lives = [
            life(forward, None),
            life(plain_bwd, None),
            life(backward, None),
            life(plain_bwd, None),
        ];
        assert_eq!(
            categories(&lives),
            [TEMPORARY, GRADIENT, TEMPORARY, GRADIENT]
        );
        assert!(workspace_frame("void at::cuda::getCUDABlasLtWorkspace()"));
        assert!(!workspace_frame("at::cuda::getCurrentCUDABlasHandle()"));
    }

    #[test]
    fn a_training_step_reads_as_its_categories() {
        let param = Evidence {
            parameter: true,
            has_stack: true,
            ..Default::default()
        };
        let top = Evidence {
            has_stack: true,
            ..Default::default()
        };
        let fwd = Evidence {
            forward: true,
            ..top
        };
        let bwd = Evidence {
            backward: true,
            ..top
        };
        let opt = Evidence {
            optimizer: true,
            ..top
        };
        let mut lives = vec![
            life(param, None),   // 0 weight
            life(top, Some(12)), // 1 the batch, freed at the step's end
            life(fwd, Some(7)),  // 2 an activation, freed in backward
            life(fwd, Some(4)),  // 3 a temporary of the forward
            life(top, Some(7)),  // 4 the loss, freed in backward
            life(bwd, Some(7)),  // 5 a temporary of the backward
            life(bwd, Some(11)), // 6 the weight's gradient, freed by zero_grad
            life(opt, None),     // 7 optimizer state
            life(opt, Some(9)),  // 8 a temporary of the step
            life(opt, None),     // 9 optimizer state
            life(top, Some(11)), // 10 made after the step, freed before any backward
            life(
                Evidence {
                    before: true,
                    ..Default::default()
                },
                None,
            ), // 11
        ];
        assert_eq!(
            categories(&lives),
            [
                PARAMETER,
                INPUT,
                ACTIVATION,
                TEMPORARY,
                ACTIVATION,
                TEMPORARY,
                GRADIENT,
                OPTIMIZER_STATE,
                TEMPORARY,
                OPTIMIZER_STATE,
                TEMPORARY,
                BEFORE_RECORDING,
            ]
        );
        // Versions of one storage: a gradient accumulated in place in a second backward
        // pass stays a gradient; a block from the start updated by the optimizer is a
        // parameter.
        lives[6].freed_before = Some(8);
        lives[8] = Life {
            prev: Some(Prev::Life(6)),
            ..life(opt, Some(11))
        };
        lives.push(Life {
            prev: Some(Prev::Before),
            ..life(opt, None)
        });
        let c = categories(&lives);
        assert_eq!((c[6], c[8], c[12]), (GRADIENT, GRADIENT, PARAMETER));
    }

    #[test]
    fn evidence_from_frames() {
        assert!(makes_parameter(
            "/x/site-packages/torch/nn/modules/module.py",
            "_apply"
        ));
        assert!(makes_parameter("torch/nn/modules/linear.py", "__init__"));
        assert!(!makes_parameter("torch/nn/modules/linear.py", "forward"));
        assert!(in_optimizer("/x/site-packages/torch/optim/adamw.py"));
        assert!(!in_optimizer(
            "/x/site-packages/torch/optim/lr_scheduler.py"
        ));
        for (file, function) in [
            ("/x/site-packages/torch/optim/optimizer.py", "wrapper"),
            (
                "/x/site-packages/bitsandbytes/optim/optimizer.py",
                "init_state",
            ),
            ("/x/site-packages/apex/optimizers/fused_adam.py", "step"),
            (
                "/x/site-packages/torchao/prototype/low_bit_optim/adam.py",
                "step",
            ),
            ("/home/me/proj/optimizers.py", "__init__"),
            ("/home/me/proj/train.py", "zero_grad"),
        ] {
            assert!(optimizer_frame(file, function), "{file} {function}");
        }
        for (file, function) in [
            ("/home/me/proj/optimizers.py", "step"),
            ("/home/me/proj/optimize_model.py", "__init__"),
            ("/home/me/proj/model.py", "__init__"),
            ("/x/site-packages/torch/nn/modules/module.py", "zero_grad"),
            ("/x/site-packages/transformers/optimization.py", "step"),
        ] {
            assert!(!optimizer_frame(file, function), "{file} {function}");
        }
    }

    fn py<'a>(file: &'a str, name: &'a str) -> (&'a str, &'a str, u32) {
        (name, file, 1)
    }

    #[test]
    fn a_hand_written_optimizer_is_an_optimizer_and_a_closure_the_model() {
        let wrapper = py("/x/site-packages/torch/optim/optimizer.py", "wrapper");
        let main = py("/home/me/proj/train.py", "main");
        // A hand-written AdamW's step: the user's code inside PyTorch's step wrapper.
        let state = evidence_of(&[
            main,
            wrapper,
            py("/home/me/proj/optimizers.py", "step"),
            ("aten::zeros_like", "??", 0),
        ]);
        assert!(state.optimizer && !state.model, "{state:?}");
        // Its `step` under `@torch.no_grad()`: PyTorch's decorator between the two.
        let no_grad = py(
            "/x/site-packages/torch/utils/_contextlib.py",
            "decorate_context",
        );
        let e = evidence_of(&[
            main,
            wrapper,
            no_grad,
            py("/home/me/proj/optimizers.py", "step"),
        ]);
        assert!(e.optimizer && !e.model, "{e:?}");
        // `optimizer.step(closure)`: the closure's forward is the model's.
        let closure = evidence_of(&[
            main,
            wrapper,
            py("/x/site-packages/torch/optim/adamw.py", "step"),
            py("/home/me/proj/train.py", "closure"),
            py("/home/me/proj/model.py", "forward"),
        ]);
        assert!(!closure.optimizer && closure.model && closure.forward);
        // A closure's loss outside every module, under PyTorch's optimizer or a hand-written
        // one (another file), is the model's too; the hand-written step's helpers are not.
        let adamw = py("/x/site-packages/torch/optim/adamw.py", "step");
        let mine = py("/home/me/proj/optimizers.py", "step");
        let loss = py("/home/me/proj/train.py", "step");
        let f = py("/x/site-packages/torch/nn/functional.py", "cross_entropy");
        for outer in [adamw, mine] {
            let e = evidence_of(&[main, wrapper, outer, loss, f]);
            assert!(!e.optimizer && e.model, "{outer:?}: {e:?}");
        }
        let helper = py("/home/me/proj/optimizers.py", "_update");
        assert!(evidence_of(&[main, wrapper, mine, helper]).optimizer);
        // With no Python frames to say so, an open range says it; not for a closure.
        let bare = evidence_of(&[("aten::zeros_like", "??", 0)]);
        assert!(bare.in_optimizer_range().optimizer);
        assert!(!closure.in_optimizer_range().optimizer);
        let backward = Evidence {
            backward: true,
            ..bare
        };
        assert!(!backward.in_optimizer_range().optimizer);
        assert!(is_optimizer_range("Optimizer.step#AdamW.step"));
        assert!(is_optimizer_range("Optimizer.zero_grad#AdamW.zero_grad"));
        assert!(!is_optimizer_range("forward"));
    }
}
