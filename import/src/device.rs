//! PyTorch's devices as a trace defines them, written once for the importer (snapshots and
//! profiler traces) and for `poolsight.torch.track()` (the Python package's tracker, on either
//! of its paths).

use poolsight_recorder::{DeviceInfo, DeviceKind};

/// The trace's device `id` for PyTorch's device of type `device_type` (`cpu`, `cuda`, `xpu`,
/// `mps`, ...) and `index`, named as PyTorch prints it (`cpu`, `cuda:0`). Sizes are PyTorch's
/// own (a storage's bytes, the bytes a snapshot's entry asked for), so no rounding unit;
/// `observed`: the events observe PyTorch's allocator from outside (no pool of poolsight's).
pub fn pytorch_device(
    id: u32,
    device_type: &str,
    index: Option<u32>,
    observed: bool,
) -> DeviceInfo {
    let cpu = device_type == "cpu";
    DeviceInfo {
        id,
        name: match index {
            Some(i) if !cpu => format!("{device_type}:{i}"),
            _ => device_type.to_string(),
        },
        capacity: 0,
        allocation_unit: 1,
        kind: if cpu {
            DeviceKind::Cpu
        } else {
            DeviceKind::Gpu
        },
        observed,
        prediction: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_as_pytorch_prints_them() {
        let cpu = pytorch_device(0, "cpu", Some(0), true);
        assert_eq!((cpu.name.as_str(), cpu.kind), ("cpu", DeviceKind::Cpu));
        let gpu = pytorch_device(3, "cuda", Some(1), false);
        assert_eq!(
            (gpu.id, gpu.name.as_str(), gpu.kind),
            (3, "cuda:1", DeviceKind::Gpu)
        );
        assert!(!gpu.observed && cpu.observed);
        assert_eq!(pytorch_device(1, "mps", None, true).name, "mps");
    }
}
