//! The user's lines of operators called outside every module call: `_Sites` of
//! `python/poolsight/_torch_sites.py`, natively, for the per-operator path (the Python rule
//! judges each code object once).

use std::sync::Mutex;

use pyo3::intern;
use pyo3::prelude::*;

use super::{lock, TorchState};
use crate::Map;

/// A code object as `_Sites._judge` judged it.
struct Code {
    /// The user's code (else a library's).
    user: bool,
    /// Its short file and function, for the user's.
    file: String,
    function: String,
    /// Keeps the code object, whose address is the key, alive.
    _code: Py<PyAny>,
}

/// The user's lines of operators called outside every module call (`_Sites`, natively).
#[derive(Default)]
pub(super) struct Sites {
    /// By the code object's address.
    codes: Mutex<Map<usize, Code>>,
    /// (parent stack, code, line) -> the stack of that line under the parent.
    lines: Mutex<Map<(u32, usize, u32), u32>>,
}

impl TorchState {
    /// `_Sites.stack(parent, frame)` of the innermost Python frame running now: `parent` plus
    /// the line of the innermost frame whose code is the user's (`parent` when none is). Each
    /// code object is judged once (by `_Sites._judge`, the Python rule) and each (parent,
    /// code, line) interned once, so a call seen before costs a few attribute reads per frame.
    pub(super) fn user_line(&self, py: Python<'_>, parent: u32) -> PyResult<u32> {
        // SAFETY: called with the GIL held (a `Python` token); the frame is borrowed from the
        // interpreter and owned here from the bind on.
        let mut frame =
            unsafe { Bound::from_borrowed_ptr_or_opt(py, pyo3::ffi::PyEval_GetFrame().cast()) };
        while let Some(f) = frame {
            let code = f.getattr(intern!(py, "f_code"))?;
            let key = code.as_ptr() as usize;
            let known = lock(&self.sites.codes).get(&key).map(|c| c.user);
            let user = match known {
                Some(user) => user,
                None => self.judge(py, &code)?,
            };
            if user {
                let line: u32 = f.getattr(intern!(py, "f_lineno"))?.extract().unwrap_or(0);
                if let Some(&stack) = lock(&self.sites.lines).get(&(parent, key, line)) {
                    return Ok(stack);
                }
                let stack = {
                    let codes = lock(&self.sites.codes);
                    let c = &codes[&key];
                    self.session()
                        .push_frame(parent, &c.file, line, &c.function)
                };
                lock(&self.sites.lines).insert((parent, key, line), stack);
                return Ok(stack);
            }
            let back = f.getattr(intern!(py, "f_back"))?;
            frame = (!back.is_none()).then_some(back);
        }
        Ok(parent)
    }

    /// Whether `code` is the user's, by `_Sites._judge` (None: a library's; else its short
    /// file and function), remembered.
    fn judge(&self, py: Python<'_>, code: &Bound<'_, PyAny>) -> PyResult<bool> {
        let sites = self.state.bind(py).getattr(intern!(py, "sites"))?;
        let verdict = sites.call_method1(intern!(py, "_judge"), (code,))?;
        let (user, file, function) = if verdict.is_none() {
            (false, String::new(), String::new())
        } else {
            let (file, function): (String, String) = verdict.extract()?;
            (true, file, function)
        };
        lock(&self.sites.codes).insert(
            code.as_ptr() as usize,
            Code {
                user,
                file,
                function,
                _code: code.clone().unbind(),
            },
        );
        Ok(user)
    }
}
