//! Which frames of a PyTorch stack become poolsight frames.

/// `--frames`: what to keep of each stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FrameFilter {
    /// What PyTorch's viewer shows (`_memory_viz._frame_filter`: the unwinder's, the
    /// interpreter's and the dispatcher's own frames are dropped), less the caching
    /// allocator's own frames (`CUDACachingAllocator`); every other frame is kept (`??` files
    /// included, by name).
    #[default]
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
            "viewer" => Ok(FrameFilter::Viewer),
            "python" => Ok(FrameFilter::Python),
            "all" => Ok(FrameFilter::All),
            other => Err(format!(
                "unknown frame filter {other:?}: expected viewer|python|all"
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
    /// Whether a frame (`name` in `file`) is kept.
    pub fn keeps(self, name: &str, file: &str) -> bool {
        match self {
            FrameFilter::All => true,
            FrameFilter::Viewer => viewer_keeps(name, file),
            FrameFilter::Python => {
                viewer_keeps(name, file)
                    && file != "??"
                    && !NATIVE_SUFFIXES.iter().any(|s| file.ends_with(s))
            }
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

/// The profiler's name of a Python call, `file.py(line): function`, as (file, line,
/// function); None for any other name.
pub fn profiler_location(name: &str) -> Option<(&str, u32, &str)> {
    let (loc, function) = name.split_once("): ")?;
    let (file, line) = loc.rsplit_once('(')?;
    Some((file, line.parse().ok()?, function))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
