//! Which frames of a call stack poolsight shows (`--frames`): the one classification of frames
//! — the user's own lines, module `forward`s, the operator that allocated, and what is dropped
//! (launchers, the interpreter, libc, the dispatcher, PyTorch's call plumbing) — used by the
//! importer as it converts PyTorch's files and by the analyzer as it opens poolsight's own
//! traces with Python (foreign) frames. Pure: strings in, judgements out.

/// `--frames`: what to keep of each stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FrameFilter {
    /// What the user reads as their own model (the default; [`user_view`]): their own Python
    /// frames, module `forward`s and, innermost, the operator that allocated; launchers,
    /// interpreter, libc, dispatcher and PyTorch's call plumbing dropped.
    #[default]
    User,
    /// What PyTorch's viewer shows (`_memory_viz._frame_filter`: the unwinder's, the
    /// interpreter's and the dispatcher's own frames are dropped), less the caching
    /// allocator's own frames (`CUDACachingAllocator`); every other frame is kept (`??` files
    /// included, by name).
    Viewer,
    /// The viewer's frames less every C/C++ frame: Python code only.
    Python,
    /// Every frame as recorded.
    All,
}

impl std::str::FromStr for FrameFilter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "user" => Ok(FrameFilter::User),
            "viewer" => Ok(FrameFilter::Viewer),
            "python" => Ok(FrameFilter::Python),
            "all" => Ok(FrameFilter::All),
            other => Err(format!(
                "unknown frame filter {other:?}: expected user|viewer|python|all"
            )),
        }
    }
}

/// The names and files `_memory_viz._frame_filter` omits (substring matches).
const OMIT_FUNCTIONS: &[&str] = &[
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "_start",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
];
const OMIT_FILES: &[&str] = &[
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
];
const NATIVE_SUFFIXES: &[&str] = &[".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hpp"];

impl FrameFilter {
    /// Whether a frame (`name` in `file`) is kept, for the filters that judge frame by
    /// frame (`User` judges whole stacks: [`user_view`]; here it keeps what `python` keeps).
    pub fn keeps(self, name: &str, file: &str) -> bool {
        match self {
            FrameFilter::All => true,
            FrameFilter::Viewer => viewer_keeps(name, file),
            FrameFilter::Python | FrameFilter::User => viewer_keeps(name, file) && is_python(file),
        }
    }
}

/// The caching allocator's own frames: where every allocation ends, so they tell nothing.
const ALLOCATOR: &str = "CUDACachingAllocator";

fn viewer_keeps(name: &str, file: &str) -> bool {
    !OMIT_FUNCTIONS.iter().any(|f| name.contains(f))
        && !OMIT_FILES.iter().any(|f| file.contains(f))
        && !name.contains(ALLOCATOR)
        && !file.contains(ALLOCATOR)
}

/// What a symbolizer names when it has no source file: the object or library the code is in
/// (`thread48.o`, where libstdc++ starts the autograd engine's threads; `libc.so.6`).
const OBJECT_SUFFIXES: &[&str] = &[".o", ".a", ".so", ".dylib", ".dll"];

/// Whether a frame's file is Python code (not C or C++, not an object file or a shared
/// library, not `??`, not empty).
fn is_python(file: &str) -> bool {
    !file.is_empty()
        && file != "??"
        && !NATIVE_SUFFIXES.iter().any(|s| file.ends_with(s))
        && !is_object(file)
}

/// An object file or shared library, versioned ones (`libc.so.6`, `libcudart.so.12.4`) too.
fn is_object(file: &str) -> bool {
    let unversioned = file.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    let unversioned = if unversioned.len() < file.len() && unversioned.ends_with(".so") {
        unversioned
    } else {
        file
    };
    OBJECT_SUFFIXES.iter().any(|s| unversioned.ends_with(s))
}

/// A frame of the user view: a Python frame kept with its (shortened) file, or the operator
/// that allocated (`aten::addmm`, in backward under its autograd node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserFrame {
    pub file: String,
    pub line: u32,
    pub name: String,
    /// An operator (no file): `Some(true)` when it ran in the backward pass.
    pub op_backward: Option<bool>,
}

/// Launchers: frames of code that starts a program, a notebook cell or a distributed job, not
/// the user's own code, wherever they are installed (substrings of the file). The other
/// frames dropped are those of the interpreter's library, of installed packages and of
/// PyTorch ([`is_user_file`]).
pub const LAUNCHERS: &[&str] = &[
    "runpy",
    "<frozen ",
    "ipykernel_launcher.py",
    "/IPython/",
    "/ipykernel/",
    "/tornado/",
    "/asyncio/",
    "/traitlets/",
    "/jupyter_core/",
    "/torch/distributed/run.py",
    "/torch/distributed/launch.py",
    "/torch/distributed/elastic/",
    "/accelerate/commands/",
    "/accelerate/launchers.py",
    "/lightning/fabric/strategies/launchers/",
    "/pytorch_lightning/strategies/launchers/",
    "/lightning/pytorch/strategies/launchers/",
    "/torchrun",
];

/// Whether a Python file is the user's own: not a launcher, not the interpreter's library
/// (`lib/pythonX.Y/` outside `site-packages`), not an installed package (`site-packages/`,
/// `dist-packages/`), not PyTorch.
pub fn is_user_file(file: &str) -> bool {
    if LAUNCHERS.iter().any(|l| file.contains(l)) {
        return false;
    }
    if file.contains("site-packages/") || file.contains("dist-packages/") {
        return false;
    }
    if file.starts_with("torch/") || file.contains("/torch/") {
        return false;
    }
    // The standard library: .../lib/python3.11/x.py or .../lib64/python3.11/...
    if let Some(i) = file.find("/python3") {
        let before = &file[..i];
        if before.ends_with("/lib") || before.ends_with("/lib64") {
            return false;
        }
    }
    true
}

/// The prefix [`short_path`] takes off the user's files: the directory common to the absolute
/// `.py` files among `files` that are the user's own ([`is_user_file`]).
pub fn user_prefix<'a>(files: impl IntoIterator<Item = &'a str>) -> String {
    common_dir(
        files
            .into_iter()
            .filter(|f| f.starts_with('/') && is_user_file(f) && f.ends_with(".py")),
    )
}

/// A path as the user reads it: the part after `site-packages/` (or `dist-packages/`) for an
/// installed package, else without `prefix` (the common directory of the user's files).
pub fn short_path<'a>(file: &'a str, prefix: &str) -> &'a str {
    for marker in ["site-packages/", "dist-packages/"] {
        if let Some(i) = file.rfind(marker) {
            return &file[i + marker.len()..];
        }
    }
    if !prefix.is_empty() {
        if let Some(rest) = file.strip_prefix(prefix) {
            if !rest.is_empty() {
                return rest;
            }
        }
    }
    file
}

/// The directory every one of `files` (the user's files, absolute or not) lies in, ending
/// with `/`; empty when they share none, or when there is one file only in the root.
pub fn common_dir<'a>(files: impl IntoIterator<Item = &'a str>) -> String {
    let mut common: Option<&str> = None;
    for f in files {
        let dir = match f.rfind('/') {
            Some(i) => &f[..=i],
            None => return String::new(),
        };
        common = Some(match common {
            None => dir,
            Some(c) => {
                let n = c
                    .bytes()
                    .zip(dir.bytes())
                    .take_while(|(a, b)| a == b)
                    .count();
                // Back to a whole directory.
                match c[..n].rfind('/') {
                    Some(i) => &c[..=i],
                    None => return String::new(),
                }
            }
        });
    }
    match common {
        Some("/") | None => String::new(),
        Some(c) => c.to_owned(),
    }
}

/// A C++ name without its return type, template arguments and parameter list:
/// `at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>)` reads
/// `at::detail::_empty_generic`.
pub fn short_cpp(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut angle = 0usize;
    let mut paren = 0usize;
    for c in name.chars() {
        match c {
            '<' => angle += 1,
            '>' => angle = angle.saturating_sub(1),
            '(' if angle == 0 => {
                // `(anonymous namespace)` is part of a name; a parameter list ends it.
                paren += 1;
            }
            ')' if angle == 0 => paren = paren.saturating_sub(1),
            _ if angle == 0 && paren == 0 => out.push(c),
            _ => {}
        }
    }
    // A return type before the name: keep the last space-separated word.
    let out = out.trim();
    let out = out.rsplit(' ').next().unwrap_or(out);
    let out = out
        .trim_end_matches(['&', '*'])
        .trim_start_matches(['&', '*']);
    if out.is_empty() {
        name.to_owned()
    } else {
        out.to_owned()
    }
}

/// The ATen operator of a C++ frame: `at::_ops::addmm::call(...)` (or `::redispatch`) is
/// `aten::addmm`. The overload is left out, as the profiler names operators:
/// `at::_ops::add_Tensor::call` and `at::_ops::sum_dim_IntList::call` read `aten::add` and
/// `aten::sum` ([`without_overload`]).
fn aten_op(name: &str) -> Option<String> {
    let i = name.find("at::_ops::")?;
    let rest = &name[i + "at::_ops::".len()..];
    let end = rest.find("::")?;
    let (op, after) = (&rest[..end], &rest[end + 2..]);
    if !(after.starts_with("call") || after.starts_with("redispatch")) || op.is_empty() {
        return None;
    }
    if !op.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    Some(format!("aten::{}", without_overload(op)))
}

/// Lowercase words that begin an overload name before its capitalized part (`dim_IntList`,
/// `self_Tensor`): ATen's generated structs join the overload to the operator's name by `_`.
const OVERLOAD_WORDS: &[&str] = &["dim", "self", "input", "int", "names", "src", "using"];

/// An ATen struct name without its overload: the overload starts at the first `_`-separated
/// part that is capitalized (`Tensor`, `Scalar`, `IntList`), or at one of
/// [`OVERLOAD_WORDS`] just before such a part. Names without a capitalized part are whole
/// (`_softmax`, `native_layer_norm`, `add_`).
fn without_overload(op: &str) -> &str {
    let parts: Vec<(usize, &str)> = op
        .match_indices('_')
        .map(|(i, _)| (i, &op[i + 1..]))
        .collect();
    for (k, &(i, rest)) in parts.iter().enumerate() {
        if i == 0 || !rest.starts_with(|c: char| c.is_ascii_uppercase()) {
            continue;
        }
        if k > 0 {
            let (j, prev) = parts[k - 1];
            let word = &prev[..prev.find('_').unwrap_or(prev.len())];
            if j > 0 && OVERLOAD_WORDS.contains(&word) {
                return &op[..j];
            }
        }
        return &op[..i];
    }
    op
}

/// The autograd node of a C++ frame: `torch::autograd::generated::MmBackward0::apply(...)`
/// is `MmBackward0` (also `CopyBackwards`, `AccumulateGrad`).
fn autograd_node(name: &str) -> Option<&str> {
    let short = name.split('(').next()?;
    let short = short.strip_suffix("::apply")?;
    let node = short.rsplit("::").next()?;
    (node.contains("Backward") || node == "AccumulateGrad").then_some(node)
}

/// Whether a C++ frame is the autograd engine's (the backward pass runs under it).
fn is_engine(name: &str) -> bool {
    name.contains("torch::autograd::Engine::") || name.contains("autograd::engine::")
}

/// Python frames of the backward pass when the stack holds no C++ frames: the engine is
/// entered from `torch/autograd/__init__.py` (`backward`, `_engine_run_backward`).
fn is_python_backward(file: &str, name: &str) -> bool {
    (file.ends_with("torch/autograd/__init__.py") || file.ends_with("torch/autograd/graph.py"))
        && matches!(name, "backward" | "_engine_run_backward" | "grad")
}

/// The user view of a stack (outermost first; each frame `(name, file, line)`): the user's
/// own Python frames ([`is_user_file`]) and module `forward`s (any file), paths shortened
/// ([`short_path`], `prefix` the common directory of the user's files), then innermost the
/// operator that allocated (the innermost ATen operator of the C++ frames), under its autograd
/// node in the backward pass (`MmBackward0`). Everything else — launchers, the interpreter,
/// libc, the dispatcher, PyTorch's call plumbing (`_call_impl`, `_wrapped_call_impl`) — is
/// dropped. Two different user lines stay two frames, so no two lines ever merge.
pub fn user_view(frames: &[(&str, &str, u32)], prefix: &str) -> Vec<UserFrame> {
    let roles: Vec<FrameRole> = frames
        .iter()
        .map(|&(name, file, line)| classify(name, file, line, prefix))
        .collect();
    assemble(&roles)
}

/// What one frame is to the [`user_view`] of any stack it is in: judged once per distinct
/// frame ([`classify`]), then a stack is its frames' roles put together ([`assemble`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameRole {
    /// Shown: the user's own frame or a module's `forward`, its path shortened.
    Keep(UserFrame),
    /// An ATen operator (`aten::addmm`).
    Op(String),
    /// An autograd node (`MmBackward0`): the stack runs in the backward pass.
    Node(String),
    /// Not shown, but says the stack runs in the backward pass (the engine's frames,
    /// `torch.autograd.backward`).
    Backward,
    /// Not shown.
    Drop,
}

/// The profiler's name of a C function called from Python without the address of the object
/// it is bound to, which differs from run to run (so that the same line of two runs is one
/// `diff` key): `<built-in method dropout of type object at 0x7f…>` → `<built-in method
/// dropout>`, `<built-in method contiguous of Tensor object at 0x7f…>` → `<built-in method
/// Tensor.contiguous>`; `<built-in function linear>` as it is. None for any other name.
pub fn builtin_name(name: &str) -> Option<String> {
    let rest = name.strip_prefix("<built-in ")?.strip_suffix('>')?;
    let Some((head, owner)) = rest.split_once(" of ") else {
        return Some(name.to_owned());
    };
    let owner = owner.split_once(" at 0x").map_or(owner, |(o, _)| o);
    let owner = owner.strip_suffix(" object").unwrap_or(owner);
    let (kind, method) = head.split_once(' ')?;
    Some(if owner == "type" {
        format!("<built-in {kind} {method}>")
    } else {
        format!("<built-in {kind} {owner}.{method}>")
    })
}

/// The role of the frame `name` in `file` at `line` ([`FrameRole`]; `prefix` as for
/// [`user_view`]).
pub fn classify(name: &str, file: &str, line: u32, prefix: &str) -> FrameRole {
    // What the profiler's Python tracer names (`_profile_to_snapshot`'s frames, file `none`):
    // a C function called from Python, a module instance.
    let bare = |name: String| {
        FrameRole::Keep(UserFrame {
            file: String::new(),
            line: 0,
            name,
            op_backward: None,
        })
    };
    if let Some(b) = builtin_name(name) {
        return bare(b);
    }
    if file == "none" && name.starts_with("nn.Module: ") {
        return bare(name.to_owned());
    }
    if is_python(file) {
        if is_python_backward(file, name) {
            return FrameRole::Backward;
        }
        let module_forward = name == "forward" && !file.contains("/torch/nn/parallel/");
        if is_user_file(file) || module_forward {
            return FrameRole::Keep(UserFrame {
                file: short_path(file, prefix).to_owned(),
                line,
                name: name.to_owned(),
                op_backward: None,
            });
        }
        return FrameRole::Drop;
    }
    // A C++ frame, or one whose file is unknown.
    if let Some(n) = autograd_node(name) {
        return FrameRole::Node(n.to_owned());
    }
    if let Some(o) = aten_op(name) {
        return FrameRole::Op(o);
    }
    if is_engine(name) {
        return FrameRole::Backward;
    }
    FrameRole::Drop
}

/// The user view of a stack from its frames' roles, outermost first (see [`user_view`]).
pub fn assemble<'a>(roles: impl IntoIterator<Item = &'a FrameRole>) -> Vec<UserFrame> {
    let mut out: Vec<UserFrame> = Vec::new();
    let mut op: Option<&str> = None;
    let mut node: Option<&str> = None;
    let mut backward = false;
    for role in roles {
        match role {
            FrameRole::Keep(f) => out.push(f.clone()),
            FrameRole::Backward => backward = true,
            FrameRole::Node(n) => {
                backward = true;
                node = Some(n);
                op = None;
            }
            // The innermost operator is the one that allocated.
            FrameRole::Op(o) => op = Some(o),
            FrameRole::Drop => {}
        }
    }
    if let Some(n) = node {
        out.push(UserFrame {
            file: String::new(),
            line: 0,
            name: n.to_owned(),
            op_backward: Some(true),
        });
    }
    if let Some(o) = op {
        out.push(UserFrame {
            file: String::new(),
            line: 0,
            name: o.to_owned(),
            op_backward: Some(backward),
        });
    }
    out
}

/// Whether a stack (outermost first, `(name, file, line)`) ran in the backward pass: under the
/// autograd engine (its C++ frames, an autograd node) or `torch.autograd.backward`.
pub fn in_backward(frames: &[(&str, &str, u32)]) -> bool {
    frames.iter().any(|&(name, file, _)| {
        if is_python(file) {
            is_python_backward(file, name)
        } else {
            is_engine(name) || autograd_node(name).is_some()
        }
    })
}

/// The profiler's name of a Python call, `file.py(line): function`, as (file, line,
/// function); None for any other name.
pub fn profiler_location(name: &str) -> Option<(&str, u32, &str)> {
    let (loc, function) = name.split_once("): ")?;
    let (file, line) = loc.rsplit_once('(')?;
    Some((file, line.parse().ok()?, function))
}

/// A path as shown in frames: from the package on for a file inside an installed package
/// (`.../site-packages/torch/nn/modules/conv.py` reads `torch/nn/modules/conv.py`), else as
/// recorded.
pub fn short_file(file: &str) -> &str {
    [
        "site-packages/",
        "dist-packages/",
        "site-packages\\",
        "dist-packages\\",
    ]
    .iter()
    .filter_map(|m| file.rfind(m).map(|i| i + m.len()))
    .max()
    .filter(|&at| at < file.len())
    .map_or(file, |at| &file[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_builtins_name_loses_its_objects_address() {
        let b = |n: &str| builtin_name(n);
        assert_eq!(
            b("<built-in method dropout of type object at 0x7fde9bcbc100>").as_deref(),
            Some("<built-in method dropout>")
        );
        assert_eq!(
            b("<built-in method contiguous of Tensor object at 0x7fde4f5f4870>").as_deref(),
            Some("<built-in method Tensor.contiguous>")
        );
        assert_eq!(
            b("<built-in method run_backward of torch._C._EngineBase object at 0x7f>").as_deref(),
            Some("<built-in method torch._C._EngineBase.run_backward>")
        );
        assert_eq!(
            b("<built-in function linear>").as_deref(),
            Some("<built-in function linear>")
        );
        assert_eq!(b("forward"), None);
        assert_eq!(b("<module>"), None);
        // In a stack: kept where it is, without a file.
        let v = user_view(
            &[
                ("<module>", "/home/u/m.py", 7),
                ("nn.Module: Dropout_0", "none", 0),
                ("forward", "torch/nn/modules/dropout.py", 69),
                (
                    "<built-in method dropout of type object at 0x7f00>",
                    "none",
                    0,
                ),
            ],
            "/home/u/",
        );
        let names: Vec<(&str, &str)> = v
            .iter()
            .map(|f| (f.file.as_str(), f.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("m.py", "<module>"),
                ("", "nn.Module: Dropout_0"),
                ("torch/nn/modules/dropout.py", "forward"),
                ("", "<built-in method dropout>"),
            ]
        );
    }

    #[test]
    fn a_profiler_call_name_gives_its_file_line_and_function() {
        assert_eq!(
            profiler_location("torch/nn/modules/linear.py(130): forward"),
            Some(("torch/nn/modules/linear.py", 130, "forward"))
        );
        assert_eq!(
            profiler_location("gen (2).py(18): <module>"),
            Some(("gen (2).py", 18, "<module>"))
        );
        assert_eq!(profiler_location("aten::addmm"), None);
        assert_eq!(profiler_location("f(x): y"), None);
    }

    #[test]
    fn the_viewer_rule_and_python_frames() {
        let v = FrameFilter::Viewer;
        assert!(!v.keeps("torch::unwind::unwind()", "??"));
        assert!(!v.keeps("_PyEval_EvalFrameDefault", "Python/ceval.c"));
        assert!(v.keeps("at::native::empty_cuda", "??"));
        assert!(!v.keeps("malloc", "c10/cuda/CUDACachingAllocator.cpp"));
        assert!(v.keeps("forward", "model.py"));
        let py = FrameFilter::Python;
        assert!(!py.keeps("at::native::empty_cuda", "??"));
        assert!(!py.keeps("c10::cuda::Alloc", "c10/cuda/CUDACachingAllocator.cpp"));
        assert!(py.keeps("forward", "model.py"));
        assert!(FrameFilter::All.keeps("torch::unwind::unwind()", "??"));
        assert!("bogus".parse::<FrameFilter>().is_err());
    }
    /// A CUDA allocation's stack as PyTorch records it with C++ frames (`stacks="all"`),
    /// outermost first: libc and the interpreter, a launcher, the user's script and model, a
    /// module call's plumbing, `Linear.forward`, the dispatcher down to the allocator.
    fn cpp_stack() -> Vec<(&'static str, &'static str, u32)> {
        vec![
            ("_start", "??", 0),
            ("__libc_start_main", "??", 0),
            ("Py_BytesMain", "??", 0),
            ("_run_module_as_main", "<frozen runpy>", 198),
            ("<module>", "/home/me/proj/train.py", 90),
            ("main", "/home/me/proj/train.py", 80),
            ("_PyEval_EvalFrameDefault", "Python/ceval.c", 0),
            ("_wrapped_call_impl", "/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1736),
            ("_call_impl", "/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1747),
            ("forward", "/home/me/proj/model/net.py", 31),
            ("method_vectorcall.llvm.12275804309777372242", "??", 0),
            ("forward", "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125),
            ("torch::autograd::THPVariable_linear(_object*, _object*, _object*)", "??", 0),
            ("at::_ops::linear::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)", "??", 0),
            ("at::native::linear(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)", "??", 0),
            ("at::_ops::addmm::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, c10::Scalar const&)", "??", 0),
            ("c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<c10::CompileTimeFunctionPointer<at::Tensor (at::Tensor const&)>>>::call(c10::OperatorKernel*)", "RegisterCUDA.cpp", 0),
            ("at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*)", "", 0),
            ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)", "??", 0),
            ("torch::unwind::unwind()", "??", 0),
        ]
    }

    #[test]
    fn the_user_view_keeps_the_users_lines_the_module_forwards_and_the_operator() {
        let v = user_view(&cpp_stack(), "/home/me/proj/");
        let shown: Vec<String> = v
            .iter()
            .map(|f| format!("{}:{}:{}", f.file, f.line, f.name))
            .collect();
        assert_eq!(
            shown,
            [
                "train.py:90:<module>",
                "train.py:80:main",
                "model/net.py:31:forward",
                "torch/nn/modules/linear.py:125:forward",
                ":0:aten::addmm",
            ]
        );
        assert_eq!(v.last().unwrap().op_backward, Some(false));
        assert!(!in_backward(&cpp_stack()));
    }

    /// Where the symbolizer knows no source file it names the object or library: the engine's
    /// threads start in libstdc++'s `thread48.o`, every thread in `libc.so.6`. Those are not
    /// the user's Python files.
    #[test]
    fn object_files_and_libraries_are_native_frames() {
        let stack = [
            ("clone3", "libc.so.6", 0),
            ("start_thread", "/lib/x86_64-linux-gnu/libc.so.6", 0),
            ("execute_native_thread_routine", "thread48.o", 0),
            (
                "torch::autograd::Engine::thread_init(int)",
                "libtorch_cuda.so",
                0,
            ),
            (
                "torch::autograd::generated::MulBackward0::apply(std::vector<at::Tensor>&&)",
                "??",
                0,
            ),
            (
                "at::_ops::mul_Tensor::call(at::Tensor const&, at::Tensor const&)",
                "libtorch_cpu.so.2.5",
                0,
            ),
        ];
        let names: Vec<String> = user_view(&stack, "").into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["MulBackward0", "aten::mul"]);
        for native in [
            "thread48.o",
            "libc.so.6",
            "libcudart.so.12.4.127",
            "x.a",
            "m.dylib",
            "k.dll",
        ] {
            assert!(!is_python(native), "{native}");
        }
        for python in [
            "train.py",
            "<stdin>",
            "<ipython-input-3-1f>",
            "/tmp/ipykernel_7/1.py",
            "so.py",
            "v1.2",
        ] {
            assert!(is_python(python), "{python}");
        }
    }

    #[test]
    fn a_backward_stack_reads_as_its_autograd_node_and_operator() {
        let stack = [
            ("start_thread", "??", 0),
            ("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??", 0),
            ("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*)", "??", 0),
            ("at::_ops::linear::call(at::Tensor const&)", "??", 0),
            ("torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)", "??", 0),
            ("at::_ops::mm::call(at::Tensor const&, at::Tensor const&)", "??", 0),
            ("at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&)", "??", 0),
            ("at::_ops::empty_strided::redispatch(c10::DispatchKeySet)", "??", 0),
        ];
        let v = user_view(&stack, "");
        let names: Vec<&str> = v.iter().map(|f| f.name.as_str()).collect();
        // The innermost operator is the one that allocated; the node says which backward.
        assert_eq!(names, ["MmBackward0", "aten::empty_strided"]);
        assert!(v.iter().all(|f| f.op_backward == Some(true)));
        assert!(in_backward(&stack));
        assert_eq!(
            aten_op("at::_ops::add_Tensor::call(x)").as_deref(),
            Some("aten::add")
        );
        assert_eq!(
            aten_op("at::_ops::sum_dim_IntList::call(x)").as_deref(),
            Some("aten::sum")
        );
        assert_eq!(
            aten_op("at::_ops::div_Tensor_mode::call(x)").as_deref(),
            Some("aten::div")
        );
        assert_eq!(
            aten_op("at::_ops::add__Tensor::call(x)").as_deref(),
            Some("aten::add_")
        );
        assert_eq!(
            aten_op("at::_ops::_foreach_add_Scalar::call(x)").as_deref(),
            Some("aten::_foreach_add")
        );
        assert_eq!(
            aten_op("at::_ops::_softmax::call(x)").as_deref(),
            Some("aten::_softmax")
        );
        assert_eq!(
            aten_op("at::_ops::native_layer_norm::call(x)").as_deref(),
            Some("aten::native_layer_norm")
        );
        assert_eq!(aten_op("at::_ops::addmm::schema"), None);
    }

    #[test]
    fn launchers_libraries_and_torch_are_not_the_users_files() {
        for f in [
            "<frozen runpy>",
            "/usr/lib/python3.11/runpy.py",
            "/usr/lib/python3.11/asyncio/events.py",
            "/opt/conda/lib/python3.10/site-packages/ipykernel/kernelapp.py",
            "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py",
            "/usr/local/lib/python3.10/dist-packages/transformers/trainer.py",
            "torch/nn/functional.py",
        ] {
            assert!(!is_user_file(f), "{f}");
        }
        for f in [
            "/home/me/train.py",
            "/tmp/ipykernel_4021/2734571.py",
            "train.py",
        ] {
            assert!(is_user_file(f), "{f}");
        }
    }

    #[test]
    fn paths_read_from_site_packages_or_the_users_common_directory() {
        assert_eq!(
            short_path(
                "/x/lib/python3.10/site-packages/torch/nn/modules/linear.py",
                "/home/me/"
            ),
            "torch/nn/modules/linear.py"
        );
        assert_eq!(
            short_path("/home/me/proj/train.py", "/home/me/proj/"),
            "train.py"
        );
        assert_eq!(
            short_path("/elsewhere/a.py", "/home/me/proj/"),
            "/elsewhere/a.py"
        );
        assert_eq!(
            common_dir(["/home/me/proj/train.py", "/home/me/proj/model/net.py"]),
            "/home/me/proj/"
        );
        assert_eq!(common_dir(["/home/a.py", "/opt/b.py"]), "");
        assert_eq!(common_dir(["train.py"]), "");
    }

    #[test]
    fn cpp_names_lose_their_templates_parameters_and_return_types() {
        assert_eq!(
            short_cpp("at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*)"),
            "at::detail::_empty_generic"
        );
        assert_eq!(
            short_cpp("c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<x>>::call(c10::OperatorKernel*)"),
            "c10::impl::wrap_kernel_functor_unboxed_::call"
        );
        assert_eq!(short_cpp("method_vectorcall"), "method_vectorcall");
    }

    #[test]
    fn python_frames_have_a_file() {
        let py = FrameFilter::Python;
        assert!(!py.keeps("at::TensorBase at::detail::_empty_generic<long>(x)", ""));
        assert!("user".parse::<FrameFilter>() == Ok(FrameFilter::User));
        assert_eq!(FrameFilter::default(), FrameFilter::User);
    }
}
