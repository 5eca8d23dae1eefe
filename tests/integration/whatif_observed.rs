//! `whatif` on a device whose events observe PyTorch's allocator from outside (`track()`, and a
//! fake CUDA run's prediction, format 1.7): each block's acquisition and release mirror the
//! block itself, not a segment, so the replay takes the allocations and frees alone (a release
//! read as the allocator's would empty the model's cache at every free). A predicted device's
//! capacity is the replay's, and `info` and `report` say first that the trace is a prediction.

use std::path::Path;

use poolsight::recorder::{
    DeviceInfo, DeviceKind, Handle, MemKind, MemRecord, Prediction, Recorder, RecorderConfig,
};

use crate::support::{cli, scratch};

const MIB: u64 = 1 << 20;

fn record(h: &Handle, kind: MemKind, ptr: u64, bytes: u64) {
    h.record_mem(MemRecord {
        ptr,
        bytes,
        ..MemRecord::new(kind, 0, 0)
    });
}

/// 12 MiB allocated and freed, then 8 MiB and 12 MiB: PyTorch's allocator keeps the first
/// 12 MiB segment cached, splits it for the 8 MiB and needs a second segment for the last
/// 12 MiB (24 MiB reserved); had its cache been emptied after the free, the 8 MiB would have
/// taken a 20 MiB segment with room for the 12 MiB (20 MiB reserved).
fn write(path: &Path, prediction: Option<Prediction>) {
    let device = DeviceInfo {
        kind: DeviceKind::Gpu,
        observed: true,
        prediction,
        ..DeviceInfo::pool(0, "cuda:0", 40 << 30, 512)
    };
    let config = RecorderConfig {
        devices: vec![device],
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(path, config).unwrap();
    let h = rec.handle();
    let blocks = [
        (0x1000_0000, 12 * MIB),
        (0x2000_0000, 8 * MIB),
        (0x3000_0000, 12 * MIB),
    ];
    for (i, &(ptr, bytes)) in blocks.iter().enumerate() {
        record(&h, MemKind::MallocPost, ptr, bytes);
        record(&h, MemKind::AllocPost, ptr, bytes);
        if i == 0 {
            record(&h, MemKind::FreePost, ptr, bytes);
            record(&h, MemKind::Release, ptr, bytes);
        }
    }
    rec.finish().unwrap();
}

fn default_run(path: &str) -> serde_json::Value {
    let out = cli(&["whatif", path, "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let j = out.json();
    j["runs"].as_array().unwrap()[0].clone()
}

#[test]
fn an_observed_devices_frees_are_not_the_allocators_releases() {
    let dir = scratch::dir();
    let path = dir.join("observed.pstrace");
    write(&path, None);
    let run = default_run(path.to_str().unwrap());
    assert_eq!(run["reserved_peak_bytes"], 24 * MIB, "{run}");
    assert_eq!(run["allocated_peak_bytes"], 20 * MIB, "{run}");
}

#[test]
fn a_prediction_says_so_first_and_replays_on_the_gpus_capacity() {
    let dir = scratch::dir();
    let path = dir.join("predicted.pstrace");
    let capacity = 16 * MIB;
    write(
        &path,
        Some(Prediction {
            gpu: "custom".into(),
            model: String::new(),
            total_bytes: capacity + 4 * MIB,
            context_bytes: 4 * MIB,
            compute_capability: 90,
            made_by: "a test".into(),
        }),
    );
    let p = path.to_str().unwrap();
    // The device's capacity (40 GiB in `write`) is what a fake run says the allocator may hold.
    let j = cli(&["whatif", p, "--format", "json"]).json();
    assert_eq!(j["capacity_bytes"], 40u64 << 30, "{j}");
    let small = cli(&["whatif", p, "--capacity", "16MiB", "--format", "json"]).json();
    let run = &small["runs"].as_array().unwrap()[0];
    assert_eq!(run["fits"], false, "{run}");
    assert_eq!(run["first_failure"]["requested_bytes"], 12 * MIB, "{run}");
    for command in ["info", "report"] {
        let out = cli(&[command, p]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let first = out.stdout.lines().next().unwrap_or("");
        assert!(
            first.starts_with("prediction: a CUDA run on custom, made without a GPU by a test"),
            "{command}: {first}"
        );
    }
    let info = cli(&["info", p, "--format", "json"]).json();
    assert_eq!(info["prediction"]["gpu"], "custom", "{info}");
    assert_eq!(info["devices"][0]["prediction"]["compute_capability"], 90);
}
