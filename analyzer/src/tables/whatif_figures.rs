//! What `diff` compares of a replay: the `whatif` section, one figure per device and key, for
//! the one setting each side is replayed under (its recorded settings, or an alternative over
//! them). So `diff` compares two runs under one setting, or one run under two settings (the
//! same file on both sides, a setting per side), and a CI rule gates on it like any figure:
//! `whatif:*.reserved_peak>+5%`, `whatif:*.failures>0`.

use super::{DiffKey, Figures, Quantity, Section};
use crate::read::Trace;
use crate::whatif::devices::devices;
use crate::whatif::{replay_device, Allocator, Recorded, Settings};

/// The section of `diff` these figures print in, after the tables'.
pub const SECTION: Section = Section("whatif");

/// The keys, `whatif:DEVICE.FIGURE` (DEVICE the device's number).
pub const DIFF_KEYS: [DiffKey; 6] = [
    DiffKey::scoped("whatif", "reserved_peak", Quantity::Bytes),
    DiffKey::scoped("whatif", "allocated_peak", Quantity::Bytes),
    DiffKey::scoped("whatif", "fragmentation", Quantity::Bytes),
    DiffKey::scoped("whatif", "inactive_split", Quantity::Bytes),
    DiffKey::scoped("whatif", "failures", Quantity::Count),
    DiffKey::scoped("whatif", "min_capacity", Quantity::Bytes),
];

/// The figures of `trace` replayed through PyTorch's allocator under `setting` over its
/// recorded settings (the recorded ones when `None`), device by device, with `capacity`
/// (else the trace's) deciding the failures.
pub fn figures(
    trace: &Trace,
    recorded: &Recorded,
    setting: Option<&Settings>,
    capacity: Option<u64>,
) -> Figures {
    let settings =
        setting.map_or_else(|| recorded.settings.clone(), |s| s.over(&recorded.settings));
    let mut f = Figures::default();
    for d in devices(trace, capacity) {
        let (o, min) = replay_device(&d, Allocator::Pytorch, &settings, true);
        // No smallest capacity when none fits (a request larger than any device): no key.
        let values = [
            Some(o.reserved_peak),
            Some(o.allocated_peak),
            Some(o.fragmentation),
            Some(o.inactive_split_at_peak),
            Some(o.failures),
            min,
        ];
        for (k, v) in DIFF_KEYS.iter().zip(values) {
            let Some(v) = v else { continue };
            f.put(
                format!("{}:{}.{}", k.scope, d.device, k.figure),
                SECTION,
                k.quantity,
                i64::try_from(v).unwrap_or(i64::MAX),
            );
        }
    }
    f
}
