//! The stacks of a snapshot's entries as poolsight stacks: each distinct frame judged and made
//! once, each list of frames made a stack once, with its category label and range prefix.

use rustc_hash::FxHashMap;

use super::entries::{raw_frame, Made, Tables, NONE};
use crate::events::{before_trace, label as label_frame, Events, Stack};
use crate::frames::FrameFilter;
use crate::infer;
use crate::pickle::{Store, StrId};
use poolsight_recorder::{Frame, FrameKind, Phase};

/// The stack of a segment held from before the trace ([`crate::events::HELD_BEFORE`]).
pub(super) fn held_before_stack(ev: &mut Events) -> Stack {
    let f = ev.frame(crate::events::held_before());
    ev.stack(&[f])
}

/// The memory category an allocation's stack ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Label {
    None,
    /// The entry's own `category` (profiler-made snapshots).
    Recorded(StrId),
    /// Inferred ([`infer`]): a label frame whose file says so.
    Inferred(&'static str),
    /// A parameter inferred from a gradient of its size ([`super::categories::by_gradients`]).
    ByGradient,
}

impl Label {
    pub(super) fn of(category: StrId) -> Label {
        if category == NONE {
            Label::None
        } else {
            Label::Recorded(category)
        }
    }
}

/// The stacks of the entries: a list of frames, filtered ([`FrameFilter`]), outermost first,
/// with a category label innermost when the entry has one, under the [`before_trace`] frame
/// for a block the trace did not allocate. Each frame is filtered and made once, each list
/// of frames made a stack once.
pub(super) struct Stacks {
    pub(super) filter: FrameFilter,
    /// The common directory of the user's files ([`crate::frames::common_dir`]), for `user`.
    pub(super) prefix: String,
    /// Per frame of [`Tables::frames`], its role in the `user` view, once judged.
    pub(super) roles: Vec<Option<crate::frames::FrameRole>>,
    /// Per frame of [`Tables::frames`]: not seen yet (`None`), dropped by the filter
    /// (`Some(NONE)`), or its id in [`Events`].
    pub(super) frames: Vec<Option<u32>>,
    pub(super) by_list: FxHashMap<(u32, Label, bool, Vec<u32>), Stack>,
    pub(super) ids: Vec<u32>,
}

impl Stacks {
    pub(super) fn new(filter: FrameFilter, t: &Tables, s: &Store<Made>) -> Stacks {
        let prefix = if filter == FrameFilter::User {
            crate::frames::user_prefix((0..t.frames.len() as u32).map(|f| raw_frame(t, s, f).1))
        } else {
            String::new()
        };
        Stacks {
            filter,
            prefix,
            roles: Vec::new(),
            frames: Vec::new(),
            by_list: FxHashMap::default(),
            ids: Vec::new(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn get(
        &mut self,
        ev: &mut Events,
        t: &Tables,
        s: &Store<Made>,
        frames: u32,
        label: Label,
        before: bool,
        prefix: &[u32],
    ) -> Stack {
        let key = (frames, label, before, prefix.to_vec());
        if let Some(&st) = self.by_list.get(&key) {
            return st;
        }
        self.ids.clear();
        if before {
            self.ids.push(ev.frame(before_trace()));
        }
        self.ids.extend_from_slice(prefix);
        // PyTorch stores a stack innermost first.
        let list = t.lists.get(frames as usize).map_or(&[][..], |l| &l[..]);
        if self.filter == FrameFilter::User {
            // Each distinct frame is judged once, each stack put together from the judgements.
            for &f in list {
                let i = f as usize;
                if self.roles.len() <= i {
                    self.roles.resize(i + 1, None);
                }
                if self.roles[i].is_none() {
                    let (name, file, line) = raw_frame(t, s, f);
                    self.roles[i] = Some(crate::frames::classify(name, file, line, &self.prefix));
                }
            }
            let roles = list
                .iter()
                .rev()
                .filter_map(|&f| self.roles[f as usize].as_ref());
            for f in crate::frames::assemble(roles) {
                let frame = match f.op_backward {
                    None => Frame {
                        kind: FrameKind::Foreign,
                        phase: Phase::None,
                        file: f.file,
                        line: f.line,
                        name: f.name,
                    },
                    Some(back) => Frame {
                        kind: FrameKind::Function,
                        phase: if back {
                            Phase::Backward
                        } else {
                            Phase::Forward
                        },
                        file: String::new(),
                        line: 0,
                        name: f.name,
                    },
                };
                self.ids.push(ev.frame(frame));
            }
        } else {
            for &f in list.iter().rev() {
                let id = self.frame(ev, t, s, f);
                if id != NONE {
                    self.ids.push(id);
                }
            }
        }
        match label {
            Label::None => {}
            Label::Recorded(c) => self.ids.push(ev.frame(label_frame(s.text(c)))),
            Label::Inferred(name) => self.ids.push(ev.frame(Frame {
                file: infer::INFERRED.to_owned(),
                ..label_frame(name)
            })),
            Label::ByGradient => self.ids.push(ev.frame(Frame {
                file: poolsight_schema::INFERRED_BY_GRADIENT_LABEL.to_owned(),
                ..label_frame(infer::PARAMETER)
            })),
        }
        let stack = ev.stack(&self.ids);
        self.by_list.insert(key, stack);
        stack
    }

    /// The id in `ev` of a frame of [`Tables::frames`], `NONE` when the filter drops it.
    pub(super) fn frame(&mut self, ev: &mut Events, t: &Tables, s: &Store<Made>, f: u32) -> u32 {
        if let Some(&Some(id)) = self.frames.get(f as usize) {
            return id;
        }
        if t.frames.get(f as usize).is_none() {
            return NONE;
        }
        let (name, file, line) = raw_frame(t, s, f);
        let id = if self.filter.keeps(name, file) {
            ev.frame(Frame {
                kind: FrameKind::Foreign,
                phase: Phase::None,
                file: file.to_owned(),
                line,
                name: name.to_owned(),
            })
        } else {
            NONE
        };
        if self.frames.len() <= f as usize {
            self.frames.resize(f as usize + 1, None);
        }
        self.frames[f as usize] = Some(id);
        id
    }
}

/// Streams as the viewer numbers them: 0 is the default stream, others 1, 2, ... in order of
/// first appearance.
#[derive(Default)]
pub(super) struct StreamIds(FxHashMap<u64, u32>);

impl StreamIds {
    pub(super) fn id(&mut self, s: u64) -> u32 {
        if s == 0 {
            return 0;
        }
        let n = self.0.len() as u32 + 1;
        *self.0.entry(s).or_insert(n)
    }
}
