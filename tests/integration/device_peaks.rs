//! Each device's own peak of live bytes, exact from the events in time order, where a trace's
//! blocks are on several devices: the pool's peak is of all of them together, a device's own
//! peak may come at another instant; the replay in windows gives what the one merge gives.

use poolsight::analyzer::replay::{replay_split, Split};
use poolsight::analyzer::{ReplayOptions, Trace};
use poolsight::recorder::{DeviceInfo, MemKind, MemRecord, Recorder, RecorderConfig};

use crate::support::{cli, scratch};

fn event(h: &poolsight::recorder::Handle, kind: MemKind, device: u32, ptr: u64, bytes: u64) {
    h.record_mem(MemRecord {
        ptr,
        bytes,
        ..MemRecord::new(kind, device, 0)
    });
}

#[test]
fn each_device_has_its_own_peak_at_its_own_instant() {
    let dir = scratch::dir();
    let path = dir.join("two-devices.pstrace");
    let config = RecorderConfig {
        chunk_size: 4096,
        devices: vec![
            DeviceInfo::pool(0, "host:0", 1 << 30, 512),
            DeviceInfo::pool(1, "host:1", 1 << 30, 512),
        ],
        ..RecorderConfig::default()
    };
    let rec = Recorder::create(&path, config).unwrap();
    let h = rec.handle();
    // Device 1 alone reaches 8 KiB; then device 0 takes 6 KiB while device 1 holds 4 KiB
    // (10 KiB in all, the pool's peak); many small blocks between, so windows cut it.
    event(&h, MemKind::MallocPost, 1, 0x1000, 8192);
    event(&h, MemKind::FreePost, 1, 0x1000, 8192);
    for i in 0..3000u64 {
        event(&h, MemKind::MallocPost, 1, 0x10_0000 + i * 512, 512);
        event(&h, MemKind::FreePost, 1, 0x10_0000 + i * 512, 512);
    }
    event(&h, MemKind::MallocPost, 1, 0x2000, 4096);
    event(&h, MemKind::MallocPost, 0, 0x3000, 6144);
    event(&h, MemKind::FreePost, 0, 0x3000, 6144);
    rec.finish().unwrap();

    let trace = Trace::open(&path).unwrap();
    let opts = ReplayOptions::default();
    let one = replay_split(&trace, 0, &opts, Split::OneMerge).unwrap();
    let s = &one.sources[0];
    assert_eq!(s.pool.peak_used_bytes, 10240);
    let own: Vec<(&str, u64, i64)> = (s.device_peaks.iter())
        .map(|d| (d.name.as_str(), d.peak_used_bytes, d.used_at_end_bytes))
        .collect();
    assert_eq!(own, [("host:0", 6144, 0), ("host:1", 8192, 4096)]);
    assert!(s.device_peaks[1].peak_used_ns < s.pool.peak_used_ns);
    for n in [16, 300, 5000] {
        let w = replay_split(&trace, 0, &opts, Split::WindowsOnly(n)).unwrap();
        assert_eq!(w.sources[0].device_peaks, s.device_peaks, "windows of {n}");
    }

    // The peak table's JSON has a row per device.
    let out = cli(&["report", path.to_str().unwrap(), "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = out.json()["peak"]["by_device"].clone();
    assert_eq!(rows[0]["device"], "host:0");
    assert_eq!(rows[0]["peak_bytes"], 6144);
    assert_eq!(rows[1]["peak_bytes"], 8192);
}
