//! Python call stacks as trace stacks, the way CuPy's `LineProfileHook` takes them: every frame
//! from the outermost in, `file:line:function`, leaving out poolsight's own frames.
//!
//! Walking the frames costs a few attribute reads per frame; what makes it cheap on repeat is
//! that nothing is interned twice: code objects are remembered (and kept alive, so that an
//! address cannot be reused by another code object), and each (parent stack, code, line) maps
//! to its stack id without taking the recorder's lock.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use poolsight_capi::Session;

use crate::Map;

struct Code {
    /// False for poolsight's own frames.
    keep: bool,
    file: String,
    name: String,
    _code: Py<PyAny>,
}

pub struct PythonStacks {
    own_dir: Option<String>,
    codes: Map<usize, Code>,
    stacks: Map<(u32, usize, u32), u32>,
}

impl PythonStacks {
    pub fn new(py: Python<'_>) -> PyResult<Self> {
        // The package's folder: its frames (integrations, wrappers) are not the user's code.
        let own_dir = py
            .import("poolsight")
            .and_then(|m| m.getattr("__file__"))
            .and_then(|f| py.import("os.path")?.call_method1("dirname", (f,)))
            .and_then(|d| d.extract::<String>())
            .ok()
            .map(|d| format!("{d}{}", std::path::MAIN_SEPARATOR));
        Ok(PythonStacks {
            own_dir,
            codes: Map::default(),
            stacks: Map::default(),
        })
    }

    /// See `Recorder.python_stack`.
    pub fn stack(
        &mut self,
        py: Python<'_>,
        session: &Session,
        base: u32,
        max_depth: u32,
        skip: u32,
    ) -> PyResult<u32> {
        let sys = py.import("sys")?;
        let mut frame = match sys.call_method1("_getframe", (skip,)) {
            Ok(f) => f,
            // Fewer frames than `skip`: nothing of the caller's to show.
            Err(e) if e.is_instance_of::<PyValueError>(py) => return Ok(base),
            Err(e) => return Err(e),
        };
        let mut chain: Vec<(usize, u32)> = Vec::new();
        loop {
            let code = frame.getattr("f_code")?;
            let key = code.as_ptr() as usize;
            if !self.codes.contains_key(&key) {
                let file: String = code.getattr("co_filename")?.extract()?;
                let name: String = code.getattr("co_name")?.extract()?;
                let keep = !self
                    .own_dir
                    .as_ref()
                    .is_some_and(|dir| file.starts_with(dir.as_str()));
                self.codes.insert(
                    key,
                    Code {
                        keep,
                        file,
                        name,
                        _code: code.unbind(),
                    },
                );
            }
            if self.codes[&key].keep {
                // f_lineno is None while a frame is being set up; 0 then.
                let line: u32 = frame.getattr("f_lineno")?.extract().unwrap_or(0);
                chain.push((key, line));
            }
            let back = frame.getattr("f_back")?;
            if back.is_none() {
                break;
            }
            frame = back;
        }
        chain.reverse();
        if max_depth > 0 {
            chain.truncate(max_depth as usize - 1);
        }
        let mut stack = base;
        for (code, line) in chain {
            stack = match self.stacks.get(&(stack, code, line)) {
                Some(&s) => s,
                None => {
                    let c = &self.codes[&code];
                    let s = session.push_frame(stack, &c.file, line, &c.name);
                    self.stacks.insert((stack, code, line), s);
                    s
                }
            };
        }
        Ok(stack)
    }
}
