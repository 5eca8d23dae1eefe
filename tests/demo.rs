//! The built-in workload trains for real and records a trace: a small configuration, so that it
//! runs in a debug build within seconds.

use std::path::{Path, PathBuf};

use poolsight::demo::{self, DemoDevice, DemoError, DemoOptions};

fn out(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    dir.join(format!("{name}-{}.pstrace", std::process::id()))
}

fn small(name: &str) -> DemoOptions {
    DemoOptions {
        out: out(name),
        epochs: 2,
        hidden: vec![32],
        steps_per_epoch: 80,
        eval_batches: 4,
        ..DemoOptions::default()
    }
}

#[test]
fn the_loss_falls_and_the_trace_is_written() {
    let opts = small("demo-small");
    let r = demo::run(&opts).expect("demo runs");
    assert_eq!(r.losses.len(), 2);
    assert_eq!(r.accuracies.len(), 2);
    assert!(
        r.losses.iter().all(|l| l.is_finite() && *l > 0.0),
        "{:?}",
        r.losses
    );
    assert!(r.losses[1] < r.losses[0], "loss falls: {:?}", r.losses);
    let chance = 1.0 / opts.classes as f32;
    assert!(r.accuracies[1] > 3.0 * chance, "learns: {:?}", r.accuracies);

    assert_eq!(r.path, opts.out);
    let len = std::fs::metadata(&r.path).expect("trace exists").len();
    assert!(len > 0);
    assert_eq!(len, r.summary.file_bytes);
    assert_eq!(r.summary.dropped_events, 0);
    // At least a malloc and a free for each array of each step.
    let steps = (opts.epochs * opts.steps_per_epoch) as u64;
    assert!(
        r.summary.events > steps * 40,
        "{} events for {steps} steps",
        r.summary.events
    );
}

#[test]
fn the_same_seed_trains_the_same_way() {
    let a = demo::run(&small("demo-seed-a")).expect("demo runs");
    let b = demo::run(&small("demo-seed-b")).expect("demo runs");
    assert_eq!(a.losses, b.losses);
    let c = demo::run(&DemoOptions {
        seed: 99,
        ..small("demo-seed-c")
    })
    .expect("demo runs");
    assert_ne!(a.losses, c.losses);
}

#[test]
fn devices_parse_as_the_cli_writes_them() {
    assert_eq!("host".parse::<DemoDevice>().ok(), Some(DemoDevice::Host));
    assert_eq!("cuda".parse::<DemoDevice>().ok(), Some(DemoDevice::Cuda(0)));
    assert_eq!(
        "cuda:3".parse::<DemoDevice>().ok(),
        Some(DemoDevice::Cuda(3))
    );
    assert!("gpu".parse::<DemoDevice>().is_err());
    assert!("cuda:x".parse::<DemoDevice>().is_err());
}

#[test]
fn bad_options_are_refused_before_any_file_is_written() {
    let opts = DemoOptions {
        batch: 0,
        ..small("demo-bad")
    };
    let err = demo::run(&opts).expect_err("batch 0 is refused");
    assert!(matches!(err, DemoError::Options(_)), "{err}");
    assert!(err.to_string().contains("batch"), "{err}");
    assert!(!opts.out.exists());
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_says_how_to_get_it() {
    let opts = DemoOptions {
        device: DemoDevice::Cuda(0),
        ..small("demo-cuda")
    };
    let err = demo::run(&opts).expect_err("no cuda in this build");
    assert!(err.to_string().contains("--features cuda"), "{err}");
    assert!(!opts.out.exists());
}
