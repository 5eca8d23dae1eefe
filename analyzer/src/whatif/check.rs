//! `whatif --check`: the model of PyTorch's caching allocator, with the recorded settings,
//! against the device allocations and block placements a snapshot recorded
//! (`poolsight_alloc_models::pytorch::check` compares; this says it per device of a trace).

use serde::Serialize;

use poolsight_alloc_models::pytorch::check::{check as compare, Held};

use super::devices::devices;
use super::Recorded;
use crate::read::Trace;

/// A segment a snapshot held when it was taken (its `segments`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSegment {
    pub device: u32,
    pub expandable: bool,
    pub segment: Held,
}

/// How far the model agrees with one device of a recording.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub trace: String,
    /// What recorded the segments: `pytorch` (a snapshot: the caching allocator's own) or
    /// `other` (a poolsight trace, a profiler trace), where agreement is not expected.
    pub recorded_by: &'static str,
    pub device: u32,
    pub settings: String,
    pub segments_recorded: u64,
    pub segments_simulated: u64,
    pub segments_matching: u64,
    pub blocks_checked: u64,
    pub block_offsets_matching: u64,
    pub starts_empty: bool,
    pub initial_segments: u64,
    pub exact: bool,
    pub first_mismatch: Option<String>,
}

/// Each device of `trace` (named `name`) replayed with the recorded settings, its decisions
/// compared with the recorded ones; `capacity` as the replay's.
pub fn check(trace: &Trace, name: &str, recorded: &Recorded, capacity: Option<u64>) -> Vec<Check> {
    devices(trace, capacity)
        .into_iter()
        .map(|d| {
            // Expandable segments are not a state the model can start from.
            let held: Vec<Held> = recorded
                .held
                .iter()
                .filter(|h| h.device == d.device && !h.expandable)
                .map(|h| h.segment.clone())
                .collect();
            let a = compare(&d.requests, &recorded.settings, d.capacity, &held);
            Check {
                trace: name.to_string(),
                recorded_by: if super::recorded_by_pytorch(trace) {
                    "pytorch"
                } else {
                    "other"
                },
                device: d.device,
                settings: recorded.settings.label(),
                exact: a.exact(),
                segments_recorded: a.segments_recorded,
                segments_simulated: a.segments_simulated,
                segments_matching: a.segments_matching,
                blocks_checked: a.blocks_checked,
                block_offsets_matching: a.block_offsets_matching,
                starts_empty: a.starts_empty,
                initial_segments: a.initial_segments,
                first_mismatch: a.first_mismatch,
            }
        })
        .collect()
}
