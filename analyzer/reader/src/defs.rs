//! The definitions of a trace (strings, frames, stacks, threads, devices), merged from its
//! definitions chunks, and its footer.

use poolsight_schema::fb;

use super::trace::Trace;
use super::types::{ChunkKind, Defs, DeviceDef, Footer, FrameDef, ThreadDef, Warning};

impl Trace {
    pub(super) fn load_defs_and_footer(&mut self) {
        let mut defs = Defs {
            devices: self.header.devices.clone(),
            ..Defs::default()
        };
        let mut footer = None;
        for c in self
            .chunks
            .iter()
            .filter(|c| matches!(c.kind, ChunkKind::Defs | ChunkKind::Footer))
        {
            let chunk = self.chunk_root(c);
            if let Some(d) = chunk.body_as_defs() {
                merge_defs(&mut defs, &d);
            } else if let Some(f) = chunk.body_as_footer() {
                if c.sealed {
                    footer = Some(Footer {
                        end_ticks: f.end_ticks(),
                        end_mono_ns: f.end_mono_ns(),
                        end_unix_ns: f.end_unix_ns(),
                        dropped_events: f.dropped_events(),
                        chunks: f.chunks(),
                        data_end: f.data_end(),
                    });
                }
            }
        }
        if let Some(f) = footer {
            let len = self.map.len() as u64;
            if f.data_end > len {
                self.warnings.push(Warning {
                    offset: len,
                    what: format!(
                        "the file ends at {len} bytes but its writer wrote {}: it was truncated (copied while being written, or a disk filled); what remains was read",
                        f.data_end
                    ),
                    torn: false,
                });
            }
        }
        if self.header.format_minor < poolsight_schema::LABEL_MINOR {
            labels_before_1_4(&mut defs);
        }
        self.defs = defs;
        self.footer = footer;
    }
}

/// Before format 1.4 an integration's labels (PyTorch's memory categories) were `Scope` frames
/// with no file and line 0; they read as the `Label` frames they are.
fn labels_before_1_4(defs: &mut Defs) {
    let no_file = |id: u32| defs.strings.get(&id).is_none_or(|s| s.is_empty());
    let labels: Vec<u32> = defs
        .frames
        .iter()
        .filter(|(_, f)| f.kind == fb::FrameKind::Scope && f.line == 0 && no_file(f.file))
        .map(|(&id, _)| id)
        .collect();
    for id in labels {
        if let Some(f) = defs.frames.get_mut(&id) {
            f.kind = fb::FrameKind::Label;
        }
    }
}

fn merge_defs(defs: &mut Defs, d: &fb::Defs<'_>) {
    for s in d.strings().into_iter().flatten() {
        defs.strings
            .insert(s.id(), s.text().unwrap_or("").to_owned());
    }
    for f in d.frames().into_iter().flatten() {
        defs.frames.insert(
            f.id(),
            FrameDef {
                kind: f.kind(),
                phase: f.phase(),
                line: f.line(),
                file: f.file(),
                name: f.name(),
            },
        );
    }
    for s in d.stacks().into_iter().flatten() {
        defs.stacks.insert(s.id(), (s.parent(), s.frame()));
    }
    for t in d.threads().into_iter().flatten() {
        defs.threads.push(ThreadDef {
            id: t.id(),
            os_tid: t.os_tid(),
            name: t.name().unwrap_or("").to_owned(),
        });
    }
    for dev in d.devices().into_iter().flatten() {
        defs.devices.push(DeviceDef::read(&dev));
    }
}
