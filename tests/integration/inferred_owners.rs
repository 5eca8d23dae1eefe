//! Categories inferred where the stacks alone cannot tell whose a block is: an optimizer that is
//! not PyTorch's (the user's own `Optimizer` subclass, bitsandbytes' 8-bit Adam resumed from a
//! checkpoint; a profiler trace of the same), and parameters made before recording began, named
//! by the gradients that match them (fixtures/pytorch/make.py writes the snapshots).

use std::path::Path;

use crate::support::cli;

fn categories(name: &str) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/pytorch")
        .join(name);
    let o = cli(&[
        "categories",
        "--format",
        "json",
        &path.display().to_string(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()
}

/// A category's figure (`at_end_bytes`, `max_bytes`, ...), 0 when the category is absent.
fn figure(j: &serde_json::Value, category: &str, key: &str) -> u64 {
    j["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["category"] == category)
        .map_or(0, |c| c[key].as_u64().unwrap())
}

/// make.py's MLP: weights of 4 MiB and 1 MiB, biases of 4 KiB and 1 KiB.
const PARAMS: u64 = (4 << 20) + 4096 + (1 << 20) + 1024;

#[test]
fn a_hand_written_adamw_keeps_its_state_and_its_closure_is_the_models() {
    let j = categories("snapshot_hand_written_adamw.pickle");
    assert_eq!(j["inferred"], true);
    assert_eq!(figure(&j, "parameter", "at_end_bytes"), PARAMS);
    // `exp_avg` made eagerly in `__init__`, `exp_avg_sq` in the first step, a 4-byte step
    // counter per parameter (a 512 B block) made in `zero_grad`.
    assert_eq!(
        figure(&j, "optimizer_state", "at_end_bytes"),
        2 * PARAMS + 4 * 512,
        "{j}"
    );
    assert_eq!(figure(&j, "gradient", "max_bytes"), PARAMS);
    // The second step's closure: its forward's activations (8 + 8 + 2 MiB) and its loss (a
    // 512 B block, live as backward begins) are the model's, not the step's.
    assert_eq!(
        figure(&j, "activation", "max_bytes"),
        (18 << 20) + 512,
        "{j}"
    );
    assert_eq!(figure(&j, "activation", "at_end_bytes"), 0);
    assert_eq!(figure(&j, "input", "max_bytes"), 16 << 20);
    // The peak is in that closure's forward, inside the step's range: activation there.
    let step = j["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == "Optimizer.step#AdamW.step")
        .unwrap_or_else(|| panic!("no step phase in {j}"));
    let in_step = |c: &str| {
        step["categories"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["category"] == c)
            .map_or(0, |r| r["at_peak_bytes"].as_u64().unwrap())
    };
    assert_eq!(in_step("activation"), (16 << 20) + 512, "{step}");
    assert_eq!(in_step("optimizer_state"), PARAMS);
}

#[test]
fn eight_bit_state_and_state_loaded_from_a_checkpoint_are_optimizer_state() {
    let j = categories("snapshot_adam8bit_resumed.pickle");
    // fc1.weight's two states and their absmax, moved by `load_state_dict`; the others' made
    // by `init_state` (a byte per element, blocks rounded to 512 B).
    let loaded = 2 * (1 << 20) + 2 * 4096;
    let lazy = 2 * (1024 + (256 << 10) + 512);
    assert_eq!(
        figure(&j, "optimizer_state", "at_end_bytes"),
        loaded + lazy,
        "{j}"
    );
    assert_eq!(figure(&j, "parameter", "at_end_bytes"), PARAMS);
    assert_eq!(figure(&j, "activation", "at_end_bytes"), 0);
    assert_eq!(figure(&j, "gradient", "max_bytes"), PARAMS);
}

#[test]
fn parameters_made_before_recording_are_named_by_their_gradients() {
    let j = categories("snapshot_built_before_recording.pickle");
    assert_eq!(figure(&j, "parameter", "at_end_bytes"), PARAMS, "{j}");
    assert_eq!(figure(&j, "before recording", "at_end_bytes"), 0, "{j}");
    assert_eq!(figure(&j, "optimizer_state", "at_end_bytes"), 2 * PARAMS);
    assert_eq!(figure(&j, "gradient", "max_bytes"), PARAMS);
    let parameter = j["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["category"] == "parameter")
        .unwrap();
    assert_eq!(
        parameter["inferred_from"],
        serde_json::json!(["gradient sizes"])
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/pytorch/snapshot_built_before_recording.pickle");
    let text = cli(&["categories", &path.display().to_string()]).stdout;
    assert!(
        text.contains(
            "(parameter: includes blocks live from the start, inferred from gradient sizes)"
        ),
        "{text}"
    );
}

#[test]
fn frozen_parameters_and_forward_only_runs_stay_before_recording() {
    // LoRA: only the adapters (32 + 32 + 32 + 8 KiB) get gradients; the frozen base has none.
    let j = categories("snapshot_lora_before_recording.pickle");
    assert_eq!(figure(&j, "parameter", "at_end_bytes"), 104 << 10, "{j}");
    assert_eq!(
        figure(&j, "before recording", "at_end_bytes"),
        PARAMS,
        "{j}"
    );
    assert_eq!(
        figure(&j, "optimizer_state", "at_end_bytes"),
        2 * (104 << 10)
    );
    // Inference: no gradient, no evidence.
    let j = categories("snapshot_forward_before_recording.pickle");
    assert_eq!(figure(&j, "parameter", "at_end_bytes"), 0, "{j}");
    assert_eq!(
        figure(&j, "before recording", "at_end_bytes"),
        PARAMS,
        "{j}"
    );
    assert!(j["categories"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c.get("inferred_from").is_none()));
}

/// A profiler trace (`export_chrome_trace`, `with_stack=True`) of a hand-written optimizer's
/// step: its state, made under PyTorch's step wrapper and the user's `optimizers.py`, is
/// optimizer state; the closure's module forward inside the same range is the model's.
#[test]
fn a_profiler_trace_of_a_hand_written_optimizer_gets_the_same_categories() {
    let x = |name: &str, ts: f64, dur: f64, cat: &str| {
        format!(
            r#"{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": {dur}}}"#
        )
    };
    let mem = |ts: f64, bytes: i64, addr: u64| {
        format!(
            r#"{{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": {ts}, "args": {{"Bytes": {bytes}, "Addr": {addr}, "Device Type": 1, "Device Id": 0}}}}"#
        )
    };
    let events = [
        x("Optimizer.step#AdamW.step", 100.0, 100.0, "user_annotation"),
        x(
            "/opt/conda/lib/python3.11/site-packages/torch/optim/optimizer.py(487): wrapper",
            101.0,
            98.0,
            "python_function",
        ),
        x(
            "/home/me/proj/optimizers.py(70): step",
            102.0,
            96.0,
            "python_function",
        ),
        mem(110.0, 4096, 0x1000),
        x(
            "/home/me/proj/train.py(84): closure",
            120.0,
            40.0,
            "python_function",
        ),
        x("nn.Module: Linear_0", 121.0, 30.0, "python_function"),
        mem(125.0, 8192, 0x2000),
        mem(170.0, 1024, 0x3000),
        mem(175.0, -1024, 0x3000),
        mem(250.0, 512, 0x4000),
    ];
    let path = crate::support::scratch::file("hand_written.json");
    std::fs::write(
        &path,
        format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n")),
    )
    .unwrap();
    let o = cli(&[
        "categories",
        "--format",
        "json",
        &path.display().to_string(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j = o.json();
    assert_eq!(figure(&j, "optimizer_state", "at_end_bytes"), 4096, "{j}");
    assert_eq!(figure(&j, "activation", "at_end_bytes"), 8192 + 512, "{j}");
    assert_eq!(figure(&j, "temporary", "max_bytes"), 1024, "{j}");
}
