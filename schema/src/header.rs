//! What a trace's header says (`header.fbs`): the header itself, the devices (also defined in
//! definitions chunks) and where an imported trace came from. One definition of each, with the
//! one way to write it (the recorder writes a new trace's header, the packer a packed copy's)
//! and the one way to read it back (the reader, once the buffer has passed the verifier).

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use crate::fb;
use crate::kinds::DeviceKind;

/// A device whose memory the events are about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its id in the events (the CUDA ordinal for CUDA devices).
    pub id: u32,
    pub name: String,
    pub capacity: u64,
    /// The allocator's rounding unit (512 for the CuPy-style pool).
    pub allocation_unit: u64,
    /// What memory the events are about: reports use the words that fit (`Unspecified`, the
    /// default, for a pool's device: they speak of a GPU pool). `Unspecified` before 1.4.
    pub kind: DeviceKind,
    /// True when the events observe an allocator from outside, with no pool of poolsight's
    /// (each block acquired when allocated, released when freed).
    pub observed: bool,
    /// Format 1.7: the events are a prediction (`poolsight.torch.fake_cuda`), not observed on a
    /// GPU; `capacity` is then what the caching allocator may have on the GPU predicted for.
    pub prediction: Option<Prediction>,
}

/// What a predicted device was predicted for (`DeviceDef.prediction`, format 1.7).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Prediction {
    /// The GPU as poolsight's table names it (`A100-40GB`), or `custom`.
    pub gpu: String,
    /// Its model name (`NVIDIA A100-SXM4-40GB`); empty for `custom`.
    pub model: String,
    /// Bytes on the card, and those the CUDA context takes outside the allocator.
    pub total_bytes: u64,
    pub context_bytes: u64,
    /// Compute capability as major * 10 + minor (90 for an H100).
    pub compute_capability: u32,
    /// What made it (`fake_cuda, torch 2.15.0+cu132`).
    pub made_by: String,
}

impl Prediction {
    pub fn build<'a>(&self, fbb: &mut FlatBufferBuilder<'a>) -> WIPOffset<fb::Prediction<'a>> {
        let gpu = fbb.create_string(&self.gpu);
        let model = fbb.create_string(&self.model);
        let made_by = fbb.create_string(&self.made_by);
        fb::Prediction::create(
            fbb,
            &fb::PredictionArgs {
                gpu: Some(gpu),
                model: Some(model),
                total_bytes: self.total_bytes,
                context_bytes: self.context_bytes,
                compute_capability: self.compute_capability,
                made_by: Some(made_by),
            },
        )
    }

    pub fn read(p: &fb::Prediction<'_>) -> Prediction {
        Prediction {
            gpu: p.gpu().unwrap_or("").to_owned(),
            model: p.model().unwrap_or("").to_owned(),
            total_bytes: p.total_bytes(),
            context_bytes: p.context_bytes(),
            compute_capability: p.compute_capability(),
            made_by: p.made_by().unwrap_or("").to_owned(),
        }
    }
}

impl Device {
    /// A pool's device: `Unspecified` kind, not observed.
    pub fn pool(id: u32, name: impl Into<String>, capacity: u64, allocation_unit: u64) -> Self {
        Device {
            id,
            name: name.into(),
            capacity,
            allocation_unit,
            kind: DeviceKind::Unspecified,
            observed: false,
            prediction: None,
        }
    }

    pub fn build<'a>(&self, fbb: &mut FlatBufferBuilder<'a>) -> WIPOffset<fb::DeviceDef<'a>> {
        let name = fbb.create_string(&self.name);
        let prediction = self.prediction.as_ref().map(|p| p.build(fbb));
        fb::DeviceDef::create(
            fbb,
            &fb::DeviceDefArgs {
                id: self.id,
                name: Some(name),
                capacity: self.capacity,
                allocation_unit: self.allocation_unit,
                kind: self.kind.into(),
                observed: self.observed,
                prediction,
            },
        )
    }

    /// A verified `DeviceDef`; a kind this reader does not know reads `Unspecified`.
    pub fn read(d: &fb::DeviceDef<'_>) -> Device {
        Device {
            id: d.id(),
            name: d.name().unwrap_or("").to_owned(),
            capacity: d.capacity(),
            allocation_unit: d.allocation_unit(),
            kind: DeviceKind::try_from(d.kind()).unwrap_or(DeviceKind::Unspecified),
            observed: d.observed(),
            prediction: d.prediction().map(|p| Prediction::read(&p)),
        }
    }
}

/// Where an imported trace came from (`Header.import`, format 1.5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Import {
    /// `pytorch-snapshot` or `torch-profiler`.
    pub kind: String,
    /// The file as it was named.
    pub path: String,
    pub bytes: u64,
    pub entries: u64,
    /// The snapshot's trace ring had overflowed (its oldest entries are gone).
    pub overflowed: bool,
    /// What could not be mapped, one line each.
    pub unmapped: Vec<String>,
    /// Format 1.7: what a snapshot recorded of its allocator (`None`: nothing, as in a
    /// profiler trace or a trace converted before 1.7).
    pub allocator: Option<AllocatorState>,
}

/// What a snapshot recorded of the allocator that made it: its `allocator_settings` and the
/// segments it held when it was taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AllocatorState {
    /// `allocator_settings` as (key, value) text, values as Python prints them (`True`, `-1`,
    /// `0.6`, `{'1': 4, '2': 0}`); `None` for a snapshot without them.
    pub settings: Option<Vec<(String, String)>>,
    /// Not in `info`'s JSON (a snapshot holds thousands): its text says how many.
    #[cfg_attr(feature = "serde", serde(skip_serializing))]
    pub segments: Vec<HeldSegment>,
}

/// A segment the allocator held when the snapshot was taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HeldSegment {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    /// The stream as PyTorch recorded it (a `cudaStream_t`; 0 the default stream).
    pub stream: u64,
    /// `segment_type` "small" (or `is_large` false).
    pub small: bool,
    pub expandable: bool,
    /// Its blocks handed out (`active_allocated`, or `active_pending_free`): address, size.
    pub allocated: Vec<(u64, u64)>,
}

impl Import {
    pub fn build<'a>(&self, fbb: &mut FlatBufferBuilder<'a>) -> WIPOffset<fb::Import<'a>> {
        let kind = fbb.create_string(&self.kind);
        let path = fbb.create_string(&self.path);
        let unmapped: Vec<_> = self.unmapped.iter().map(|u| fbb.create_string(u)).collect();
        let unmapped = fbb.create_vector(&unmapped);
        let state = self.allocator.as_ref();
        let settings = state.and_then(|a| a.settings.as_ref()).map(|pairs| {
            let made: Vec<_> = pairs
                .iter()
                .map(|(k, v)| {
                    let key = fbb.create_string(k);
                    let value = fbb.create_string(v);
                    fb::AllocatorSetting::create(
                        fbb,
                        &fb::AllocatorSettingArgs {
                            key: Some(key),
                            value: Some(value),
                        },
                    )
                })
                .collect();
            fbb.create_vector(&made)
        });
        let segments = state.map(|a| {
            let made: Vec<_> = a
                .segments
                .iter()
                .map(|seg| {
                    let flat: Vec<u64> = seg.allocated.iter().flat_map(|&(a, b)| [a, b]).collect();
                    let allocated = fbb.create_vector(&flat);
                    fb::HeldSegment::create(
                        fbb,
                        &fb::HeldSegmentArgs {
                            device: seg.device,
                            address: seg.address,
                            total_size: seg.total_size,
                            stream: seg.stream,
                            small: seg.small,
                            expandable: seg.expandable,
                            allocated: Some(allocated),
                        },
                    )
                })
                .collect();
            fbb.create_vector(&made)
        });
        fb::Import::create(
            fbb,
            &fb::ImportArgs {
                kind: Some(kind),
                path: Some(path),
                bytes: self.bytes,
                entries: self.entries,
                overflowed: self.overflowed,
                unmapped: Some(unmapped),
                has_allocator_settings: settings.is_some(),
                allocator_settings: settings,
                held_segments: segments,
            },
        )
    }

    pub fn read(i: &fb::Import<'_>) -> Import {
        Import {
            kind: i.kind().unwrap_or("").to_owned(),
            path: i.path().unwrap_or("").to_owned(),
            bytes: i.bytes(),
            entries: i.entries(),
            overflowed: i.overflowed(),
            unmapped: strings(i.unmapped()),
            allocator: read_allocator(i),
        }
    }
}

/// The allocator state an `Import` keeps (format 1.7), or `None` when it keeps none.
fn read_allocator(i: &fb::Import<'_>) -> Option<AllocatorState> {
    let segments = i.held_segments();
    if !i.has_allocator_settings() && segments.is_none() {
        return None;
    }
    let settings = i.has_allocator_settings().then(|| {
        (i.allocator_settings().into_iter().flatten())
            .map(|kv| {
                (
                    kv.key().unwrap_or("").to_owned(),
                    kv.value().unwrap_or("").to_owned(),
                )
            })
            .collect()
    });
    let segments = (segments.into_iter().flatten())
        .map(|seg| {
            let flat: Vec<u64> = seg
                .allocated()
                .map(|v| v.iter().collect())
                .unwrap_or_default();
            HeldSegment {
                device: seg.device(),
                address: seg.address(),
                total_size: seg.total_size(),
                stream: seg.stream(),
                small: seg.small(),
                expandable: seg.expandable(),
                allocated: flat.chunks_exact(2).map(|p| (p[0], p[1])).collect(),
            }
        })
        .collect();
    Some(AllocatorState { settings, segments })
}

/// A trace's header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// The format version of the file (the prelude's; a new header is the current one).
    pub format_major: u16,
    pub format_minor: u16,
    /// The program that wrote it, and its version.
    pub writer: String,
    /// The clock calibration taken at start (docs/format.md, "Timestamps").
    pub ticks0: u64,
    pub mono_ns: u64,
    pub unix_ns: u64,
    pub ticks_per_ns: f64,
    pub pid: u32,
    pub host: String,
    pub command_line: Vec<String>,
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    /// Ring mode's slots; `None` in grow mode.
    pub ring: Option<u32>,
    pub chunk_size: u32,
    pub cpu_source: fb::CpuSource,
    /// Devices named in the header (more may come in definitions chunks).
    pub devices: Vec<Device>,
    /// A packed trace (format 1.2): no ring slots, event chunks may be packed.
    pub packed: bool,
    /// Format 1.5: what `poolsight import` converted this trace from.
    pub import: Option<Import>,
}

impl Header {
    /// The size-prefixed header buffer, as it follows the prelude (see
    /// [`crate::header_region`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut fbb = FlatBufferBuilder::with_capacity(1024);
        let writer = fbb.create_string(&self.writer);
        let host = fbb.create_string(&self.host);
        let args: Vec<_> = (self.command_line.iter())
            .map(|a| fbb.create_string(a))
            .collect();
        let command_line = fbb.create_vector(&args);
        let devices: Vec<_> = self.devices.iter().map(|d| d.build(&mut fbb)).collect();
        let devices = fbb.create_vector(&devices);
        let import = self.import.as_ref().map(|i| i.build(&mut fbb));
        let clock = fb::Clock::new(self.ticks0, self.mono_ns, self.unix_ns, self.ticks_per_ns);
        let header = fb::Header::create(
            &mut fbb,
            &fb::HeaderArgs {
                format_major: self.format_major,
                format_minor: self.format_minor,
                writer: Some(writer),
                clock: Some(&clock),
                pid: self.pid,
                host: Some(host),
                command_line: Some(command_line),
                rank: self.rank,
                world_size: self.world_size,
                devices: Some(devices),
                mode: if self.ring.is_some() {
                    fb::Mode::Ring
                } else {
                    fb::Mode::Grow
                },
                chunk_size: self.chunk_size,
                ring_slots: self.ring.unwrap_or(0),
                cpu_source: self.cpu_source,
                packed: self.packed,
                import,
            },
        );
        fb::finish_size_prefixed_header_buffer(&mut fbb, header);
        fbb.finished_data().to_vec()
    }

    /// A verified header buffer of a file of format `major.minor` (the prelude's version, which
    /// the reader goes by, not the buffer's copy of it).
    pub fn read(h: &fb::Header<'_>, major: u16, minor: u16) -> Header {
        let clock = h.clock().copied().unwrap_or_default();
        Header {
            format_major: major,
            format_minor: minor,
            writer: h.writer().unwrap_or("").to_owned(),
            ticks0: clock.ticks0(),
            mono_ns: clock.mono_ns(),
            unix_ns: clock.unix_ns(),
            ticks_per_ns: clock.ticks_per_ns(),
            pid: h.pid(),
            host: h.host().unwrap_or("").to_owned(),
            command_line: strings(h.command_line()),
            rank: h.rank(),
            world_size: h.world_size(),
            ring: (h.mode() == fb::Mode::Ring).then_some(h.ring_slots()),
            chunk_size: h.chunk_size(),
            cpu_source: h.cpu_source(),
            devices: (h.devices().into_iter().flatten())
                .map(|d| Device::read(&d))
                .collect(),
            packed: h.packed(),
            import: h.import().map(|i| Import::read(&i)),
        }
    }
}

fn strings(v: Option<flatbuffers::Vector<'_, flatbuffers::ForwardsUOffset<&str>>>) -> Vec<String> {
    v.map(|v| v.iter().map(str::to_owned).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            format_major: crate::FORMAT_MAJOR,
            format_minor: crate::FORMAT_MINOR,
            writer: "poolsight-recorder 0.1.0".into(),
            ticks0: 7,
            mono_ns: 11,
            unix_ns: 1_700_000_000_000_000_000,
            ticks_per_ns: 2.5,
            pid: 42,
            host: "vm".into(),
            command_line: vec!["train.py".into(), "--epochs=3".into()],
            rank: Some(1),
            world_size: Some(2),
            ring: Some(8),
            chunk_size: 65536,
            cpu_source: fb::CpuSource::Heap,
            devices: vec![
                Device::pool(0, "host", 1 << 30, 512),
                Device {
                    kind: DeviceKind::Gpu,
                    observed: true,
                    ..Device::pool(3, "cuda:3", 0, 1)
                },
                Device {
                    kind: DeviceKind::Gpu,
                    prediction: Some(Prediction {
                        gpu: "A100-40GB".into(),
                        model: "NVIDIA A100-SXM4-40GB".into(),
                        total_bytes: 42_298_834_944,
                        context_bytes: 512 << 20,
                        compute_capability: 80,
                        made_by: "fake_cuda, torch 2.15.0".into(),
                    }),
                    ..Device::pool(4, "cuda:0", 42_298_834_944 - (512 << 20), 512)
                },
            ],
            packed: true,
            import: Some(Import {
                kind: "pytorch-snapshot".into(),
                path: "snapshot.pickle".into(),
                bytes: 1000,
                entries: 12,
                overflowed: true,
                unmapped: vec!["1 entry of action \"x\"".into()],
                allocator: Some(AllocatorState {
                    settings: Some(vec![
                        ("expandable_segments".into(), "False".into()),
                        ("max_split_size".into(), "134217728".into()),
                    ]),
                    segments: vec![HeldSegment {
                        device: 0,
                        address: 0x7f00_0000_0000,
                        total_size: 2 << 20,
                        stream: 0,
                        small: true,
                        expandable: false,
                        allocated: vec![(0x7f00_0000_0000, 512), (0x7f00_0000_0200, 1024)],
                    }],
                }),
            }),
        }
    }

    fn read_back(h: &Header) -> Header {
        let bytes = h.encode();
        let buf = fb::size_prefixed_root_as_header(&bytes).expect("a header buffer verifies");
        Header::read(&buf, h.format_major, h.format_minor)
    }

    #[test]
    fn a_header_reads_back_as_written() {
        let h = header();
        assert_eq!(read_back(&h), h);
        let grow = Header {
            ring: None,
            import: None,
            devices: Vec::new(),
            rank: None,
            world_size: None,
            ..header()
        };
        assert_eq!(read_back(&grow), grow);
    }

    #[test]
    fn the_reader_goes_by_the_preludes_version() {
        let bytes = header().encode();
        let buf = fb::size_prefixed_root_as_header(&bytes).expect("verifies");
        let h = Header::read(&buf, 1, 0);
        assert_eq!((h.format_major, h.format_minor), (1, 0));
    }

    #[test]
    fn a_device_kind_from_a_newer_writer_reads_unspecified() {
        let mut fbb = FlatBufferBuilder::new();
        let name = fbb.create_string("x");
        let d = fb::DeviceDef::create(
            &mut fbb,
            &fb::DeviceDefArgs {
                id: 1,
                name: Some(name),
                kind: fb::DeviceKind(200),
                ..Default::default()
            },
        );
        fbb.finish_minimal(d);
        let d = flatbuffers::root::<fb::DeviceDef>(fbb.finished_data()).expect("verifies");
        assert_eq!(Device::read(&d).kind, DeviceKind::Unspecified);
    }
}
