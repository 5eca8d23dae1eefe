//! A poolsight trace's stacks shown through `--frames`. The frames a foreign caller handed in
//! (Python tracebacks: `poolsight.record(stacks="python")`, the torch tracker's lines) are
//! judged by `poolsight-frames`, the classification the importer applies to PyTorch's files:
//! with `user`, launchers, the interpreter's library and installed packages' internals are
//! dropped, the user's own lines and module `forward`s kept, paths shortened. The frames
//! poolsight makes itself (scopes, call sites, labels) are always kept, so a trace without
//! foreign frames reads as recorded; a trace converted from another tool's file was shown
//! through the frames as it was converted, and is left as it is.
//!
//! Dropping frames makes several stacks one: the stacks are numbered anew and the trace
//! renumbers its events' stacks as they are read ([`Trace::renumber_stacks`]). Kept frames keep
//! their file, line and name (a shortened path is the same for every frame of one file), so
//! two different lines never become one.

use std::collections::HashMap;

use poolsight_frames::{assemble, classify, user_prefix, FrameFilter, FrameRole, UserFrame};
use poolsight_schema::fb;

use crate::read::{Defs, FrameDef, Trace};

/// The frames a trace is shown with when `--frames` is not given: the user's for a trace that
/// observes an allocator from outside (PyTorch's, through `track()`), every frame as recorded
/// for a trace of a pool's hooks (poolsight's pool, CuPy's `TraceHook`), whose `lines` is then
/// CuPy's `LineProfileHook` tree, launchers' frames included, as that hook prints it.
pub fn default_frames(trace: &Trace) -> FrameFilter {
    if trace.defs.devices.iter().any(|d| d.observed) {
        FrameFilter::User
    } else {
        FrameFilter::All
    }
}

/// Shows `trace`'s stacks through `filter` (`None`: [`default_frames`]).
pub(super) fn show(trace: &mut Trace, filter: Option<FrameFilter>) {
    let filter = filter.unwrap_or_else(|| default_frames(trace));
    if filter == FrameFilter::All || trace.header.import.is_some() {
        return;
    }
    let Some((defs, ids)) = view(&trace.defs, filter) else {
        return;
    };
    if ids.iter().enumerate().all(|(old, &new)| old as u32 == new) {
        trace.defs = defs;
    } else {
        trace.renumber_stacks(defs, ids);
    }
}

fn is_foreign(f: &FrameDef) -> bool {
    f.kind == fb::FrameKind::Foreign
}

/// The definitions with their stacks through `filter`, and each old stack id's new one; `None`
/// when nothing changes (no foreign frames), or when the stacks are damaged (a parent missing
/// or not older than its child): such a trace is shown as recorded.
fn view(defs: &Defs, filter: FrameFilter) -> Option<(Defs, Vec<u32>)> {
    if !defs.frames.values().any(is_foreign) {
        return None;
    }
    let prefix = match filter {
        FrameFilter::User => user_prefix(
            (defs.frames.values())
                .filter(|f| is_foreign(f))
                .map(|f| defs.string(f.file)),
        ),
        _ => String::new(),
    };
    // Each foreign frame judged once.
    let roles: HashMap<u32, FrameRole> = (defs.frames.iter())
        .filter(|(_, f)| is_foreign(f))
        .map(|(&id, f)| {
            let (name, file) = (defs.string(f.name), defs.string(f.file));
            let role = match filter {
                FrameFilter::User => classify(name, file, f.line, &prefix),
                _ if filter.keeps(name, file) => FrameRole::Keep(UserFrame {
                    file: file.to_owned(),
                    line: f.line,
                    name: name.to_owned(),
                    op_backward: None,
                }),
                _ => FrameRole::Drop,
            };
            (id, role)
        })
        .collect();
    // Without operators or autograd nodes, what a frame adds to a stack does not depend on
    // the frames around it.
    let by_frame = !roles
        .values()
        .any(|r| matches!(r, FrameRole::Op(_) | FrameRole::Node(_)));

    let mut out = Defs {
        stacks: HashMap::with_capacity(defs.stacks.len()),
        ..defs.clone()
    };
    let mut made = Made::new(defs);
    let mut old: Vec<u32> = defs.stacks.keys().copied().collect();
    old.sort_unstable();
    // Ids are interned from 1: ids far past their count come from a damaged file, and must not
    // size the table.
    let last = old.last().copied().unwrap_or(0) as usize;
    if last > 2 * old.len() + 1024 {
        return None;
    }
    let mut ids: Vec<u32> = (0..=last as u32).collect();
    for &s in &old {
        let (parent, frame) = defs.stacks[&s];
        if parent >= s || (parent != 0 && !defs.stacks.contains_key(&parent)) {
            return None;
        }
        let new = match roles.get(&frame) {
            None => made.stack(&mut out, ids[parent as usize], frame),
            Some(role) if by_frame => match role {
                FrameRole::Keep(f) => {
                    let frame = made.frame(&mut out, f);
                    made.stack(&mut out, ids[parent as usize], frame)
                }
                _ => ids[parent as usize],
            },
            Some(_) => {
                // The run of foreign frames this one ends, outermost first, under `base`.
                let mut run = vec![frame];
                let mut base = parent;
                while let Some(&(p, f)) = defs.stacks.get(&base).filter(|_| base != 0) {
                    if !roles.contains_key(&f) {
                        break;
                    }
                    run.push(f);
                    base = p;
                }
                let shown = assemble(run.iter().rev().filter_map(|f| roles.get(f)));
                shown.iter().fold(ids[base as usize], |at, f| {
                    let frame = made.frame(&mut out, f);
                    made.stack(&mut out, at, frame)
                })
            }
        };
        ids[s as usize] = new;
    }
    Some((out, ids))
}

/// The strings, frames and stacks of the view, each made once (what the file defines already
/// keeps its id).
struct Made {
    strings: HashMap<String, u32>,
    next_string: u32,
    frames: HashMap<(u8, u8, u32, u32, u32), u32>,
    next_frame: u32,
    stacks: HashMap<(u32, u32), u32>,
}

impl Made {
    fn new(defs: &Defs) -> Made {
        Made {
            strings: (defs.strings.iter())
                .map(|(&id, s)| (s.clone(), id))
                .collect(),
            next_string: defs.strings.keys().max().map_or(1, |m| m + 1),
            frames: (defs.frames.iter())
                .map(|(&id, f)| ((f.kind.0, f.phase.0, f.line, f.file, f.name), id))
                .collect(),
            next_frame: defs.frames.keys().max().map_or(1, |m| m + 1),
            stacks: HashMap::new(),
        }
    }

    fn string(&mut self, out: &mut Defs, s: &str) -> u32 {
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        let id = self.next_string;
        self.next_string += 1;
        self.strings.insert(s.to_owned(), id);
        out.strings.insert(id, s.to_owned());
        id
    }

    /// A frame of the view: a kept frame, or an operator (a function scope, as the importer
    /// makes it), phased by the pass it ran in.
    fn frame(&mut self, out: &mut Defs, f: &UserFrame) -> u32 {
        let (kind, phase) = match f.op_backward {
            None => (fb::FrameKind::Foreign, fb::Phase::None),
            Some(false) => (fb::FrameKind::Function, fb::Phase::Forward),
            Some(true) => (fb::FrameKind::Function, fb::Phase::Backward),
        };
        let def = FrameDef {
            kind,
            phase,
            line: f.line,
            file: self.string(out, &f.file),
            name: self.string(out, &f.name),
        };
        let key = (kind.0, phase.0, def.line, def.file, def.name);
        if let Some(&id) = self.frames.get(&key) {
            return id;
        }
        let id = self.next_frame;
        self.next_frame += 1;
        self.frames.insert(key, id);
        out.frames.insert(id, def);
        id
    }

    /// The stack `parent` + `frame`, numbered from 1 in the order made.
    fn stack(&mut self, out: &mut Defs, parent: u32, frame: u32) -> u32 {
        let next = self.stacks.len() as u32 + 1;
        let id = *self.stacks.entry((parent, frame)).or_insert(next);
        out.stacks.entry(id).or_insert((parent, frame));
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Definitions of `stacks` (each outermost frame first, frames as `(kind, file, line,
    /// name)`), interned as the recorder interns them.
    fn defs(stacks: &[&[(fb::FrameKind, &str, u32, &str)]]) -> (Defs, Vec<u32>) {
        let mut d = Defs::default();
        let mut made = Made::new(&d);
        let mut leaves = Vec::new();
        for s in stacks {
            let mut at = 0;
            for &(kind, file, line, name) in s.iter() {
                let f = FrameDef {
                    kind,
                    phase: fb::Phase::None,
                    line,
                    file: made.string(&mut d, file),
                    name: made.string(&mut d, name),
                };
                let id = d.frames.len() as u32 + 1;
                d.frames.insert(id, f);
                at = made.stack(&mut d, at, id);
            }
            leaves.push(at);
        }
        (d, leaves)
    }

    /// The frames of stack `id` of `d`, outermost first, as `file:line:name`.
    fn shown(d: &Defs, mut id: u32) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(&(parent, frame)) = d.stacks.get(&id) {
            let f = &d.frames[&frame];
            out.push(format!(
                "{}:{}:{}",
                d.string(f.file),
                f.line,
                d.string(f.name)
            ));
            id = parent;
        }
        out.reverse();
        out
    }

    const PY: fb::FrameKind = fb::FrameKind::Foreign;

    #[test]
    fn foreign_cpp_frames_read_as_their_operator_under_the_users_lines() {
        let (d, leaves) = defs(&[
            &[
                (PY, "<frozen runpy>", 198, "_run_module_as_main"),
                (PY, "/home/me/train.py", 9, "<module>"),
                (fb::FrameKind::Link, "/home/me/train.py", 3, "Net"),
                (PY, "??", 0, "at::_ops::linear::call(at::Tensor const&)"),
                (PY, "??", 0, "at::_ops::addmm::call(at::Tensor const&)"),
                (
                    PY,
                    "??",
                    0,
                    "c10::cuda::CUDACachingAllocator::malloc(void**)",
                ),
            ],
            &[
                (PY, "<frozen runpy>", 198, "_run_module_as_main"),
                (PY, "/home/me/train.py", 9, "<module>"),
            ],
            &[(PY, "/usr/lib/python3.11/threading.py", 1016, "_bootstrap")],
        ]);
        let (user, ids) = view(&d, FrameFilter::User).expect("a view");
        assert_eq!(
            shown(&user, ids[leaves[0] as usize]),
            [
                "train.py:9:<module>",
                "/home/me/train.py:3:Net",
                ":0:aten::addmm"
            ]
        );
        assert_eq!(
            shown(&user, ids[leaves[1] as usize]),
            ["train.py:9:<module>"]
        );
        // No frame of the user's: no frame at all.
        assert_eq!(ids[leaves[2] as usize], 0);
        // The operator is a forward function, as the importer makes it.
        let (_, op) = user.stacks[&ids[leaves[0] as usize]];
        assert_eq!(user.frames[&op].kind, fb::FrameKind::Function);
        assert_eq!(user.frames[&op].phase, fb::Phase::Forward);
        // The viewer keeps the C++ frames but the allocator's, and paths as recorded.
        let (viewer, ids) = view(&d, FrameFilter::Viewer).expect("a view");
        let leaf = shown(&viewer, ids[leaves[0] as usize]);
        assert_eq!(leaf.len(), 5, "{leaf:?}");
        assert!(leaf[1].starts_with("/home/me/train.py:9"), "{leaf:?}");
    }

    #[test]
    fn traces_without_foreign_frames_or_with_damaged_stacks_are_shown_as_recorded() {
        let (d, _) = defs(&[&[
            (fb::FrameKind::Link, "m.rs", 1, "Net"),
            (fb::FrameKind::Site, "m.rs", 2, "Net"),
        ]]);
        assert!(view(&d, FrameFilter::User).is_none());
        let (mut d, _) = defs(&[&[(PY, "/usr/lib/python3.11/runpy.py", 1, "x")]]);
        d.stacks.insert(7, (5, 1));
        assert!(view(&d, FrameFilter::User).is_none(), "a parent missing");
        d.stacks.insert(1 << 30, (1, 1));
        assert!(
            view(&d, FrameFilter::User).is_none(),
            "ids far past their count"
        );
    }
}
