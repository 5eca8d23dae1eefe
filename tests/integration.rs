//! The end-to-end tests, one module per subject, in one test binary (linking one binary instead
//! of sixteen is most of their build time). `tests/epochs.rs` (it installs a counting global
//! allocator) and `tests/trace_hook.rs` (it registers process-wide hooks) stay binaries of
//! their own, so that no other test disturbs what they count.
//!
//! Run one subject with `cargo test --test integration golden::`.

#[path = "scenarios/mod.rs"]
mod scenarios;
#[path = "support/mod.rs"]
mod support;

#[path = "integration/bad_input.rs"]
mod bad_input;
#[path = "integration/ci_gate.rs"]
mod ci_gate;
#[path = "integration/crafted.rs"]
mod crafted;
#[path = "integration/device_peaks.rs"]
mod device_peaks;
#[path = "integration/diff.rs"]
mod diff;
#[path = "integration/docs_map.rs"]
mod docs_map;
#[path = "integration/drills.rs"]
mod drills;
#[path = "integration/export.rs"]
mod export;
#[path = "integration/finish_packed.rs"]
mod finish_packed;
#[path = "integration/foreign.rs"]
mod foreign;
#[path = "integration/format.rs"]
mod format;
#[path = "integration/gate.rs"]
mod gate;
#[path = "integration/golden.rs"]
mod golden;
#[path = "integration/html.rs"]
mod html;
#[path = "integration/inferred_owners.rs"]
mod inferred_owners;
#[path = "integration/parquet.rs"]
mod parquet;
#[path = "integration/relabel.rs"]
mod relabel;
#[path = "integration/scopes.rs"]
mod scopes;
#[path = "integration/snapshot_views.rs"]
mod snapshot_views;
#[path = "integration/snapshots.rs"]
mod snapshots;
#[path = "integration/user_frames.rs"]
mod user_frames;
#[path = "integration/visuals.rs"]
mod visuals;
#[path = "integration/whatif.rs"]
mod whatif;
#[path = "integration/whatif_observed.rs"]
mod whatif_observed;
#[path = "integration/whatif_uses.rs"]
mod whatif_uses;
#[path = "integration/windows.rs"]
mod windows;
