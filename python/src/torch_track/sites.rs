//! The user's lines of operators called outside every module call: `_Sites` of
//! `python/poolsight/_torch_sites.py`, natively, for the per-operator path (the Python rule
//! judges each code object once).

use std::sync::Mutex;

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;

use super::{lock, TorchState};
use crate::Map;

// Public functions of every CPython since 3.9 (`Include/cpython/pyframe.h`,
// `Include/pyframe.h`), exported by each interpreter this package loads into; pyo3's bindings
// for the 3.9 stable ABI leave them out, as they are not in its limited API. They walk the
// frames with no attribute lookup (`f_code`, `f_back`): each returns a new reference, the
// back frame NULL at the outermost.
extern "C" {
    fn PyFrame_GetBack(frame: *mut ffi::PyFrameObject) -> *mut ffi::PyObject;
    fn PyFrame_GetCode(frame: *mut ffi::PyFrameObject) -> *mut ffi::PyObject;
}

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
    /// code, line) interned once, so a call seen before costs two C calls and a lookup per frame.
    pub(super) fn user_line(&self, py: Python<'_>, parent: u32) -> PyResult<u32> {
        // SAFETY: called with the GIL held (a `Python` token); the frame is borrowed from the
        // interpreter and owned here from the bind on.
        let mut frame: Option<Bound<'_, PyAny>> =
            unsafe { Bound::from_borrowed_ptr_or_opt(py, ffi::PyEval_GetFrame().cast()) };
        while let Some(f) = frame {
            let raw = f.as_ptr().cast::<ffi::PyFrameObject>();
            // SAFETY: `raw` is a live frame (held by `f`); its code, a new reference, is never
            // NULL.
            let code = unsafe { Bound::from_owned_ptr(py, PyFrame_GetCode(raw)) };
            let key = code.as_ptr() as usize;
            let known = lock(&self.sites.codes).get(&key).map(|c| c.user);
            let user = match known {
                Some(user) => user,
                None => self.judge(py, &code)?,
            };
            if user {
                // SAFETY: as above. Negative while the frame is being set up (`f_lineno` is
                // None then): 0.
                let line = u32::try_from(unsafe { ffi::PyFrame_GetLineNumber(raw) }).unwrap_or(0);
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
            // SAFETY: as above; a new reference, NULL for the outermost frame.
            frame = unsafe { Bound::from_owned_ptr_or_opt(py, PyFrame_GetBack(raw)) };
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
