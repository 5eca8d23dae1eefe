//! A real-shaped snapshot reads as the user's model: the `user` frames by default, inferred
//! categories, `record_function` ranges as functions, segments kept (fixtures/pytorch/make.py
//! writes the files: a training step with C++ stacks (also as PyTorch 2.4 laid it out), a
//! notebook cell that runs out of memory, and the same notebook's OOM dump with segments only).

use std::path::{Path, PathBuf};

use crate::support::{cli, Outcome};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/pytorch")
        .join(name)
}

fn ok(o: Outcome) -> Outcome {
    assert_eq!(o.code, 0, "stdout: {}\nstderr: {}", o.stdout, o.stderr);
    o
}

fn step() -> String {
    fixture("snapshot_step_cpp.pickle").display().to_string()
}

#[test]
fn the_default_frames_are_the_users_lines_modules_and_operators() {
    let s = step();
    let user = ok(cli(&["lines", &s])).stdout;
    let viewer = ok(cli(&["lines", "--frames", "viewer", &s])).stdout;
    // The user's own lines, paths from their common directory; module forwards from
    // site-packages on; the operator that allocated as the leaf.
    for want in [
        "train.py:76:main",
        "model.py:20:forward",
        "torch/nn/modules/linear.py:125:forward",
        ":0:aten::addmm",
        ":0:MmBackward0",
        ":0:aten::mm",
    ] {
        assert!(user.contains(want), "{want} not in\n{user}");
    }
    // Launchers, libc, the interpreter, the dispatcher and PyTorch's plumbing are gone.
    for gone in [
        "_start",
        "runpy",
        "_call_impl",
        "_wrapped_call_impl",
        "RegisterCUDA",
        "at::_ops",
        "/home/me/proj/",
        "ceval",
        "start_thread",
    ] {
        assert!(!user.contains(gone), "{gone} in\n{user}");
    }
    // The viewer's frames are as before: every C++ frame it keeps.
    assert!(viewer.contains("wrap_kernel_functor_unboxed_"), "{viewer}");
    assert!(user.lines().count() * 2 < viewer.lines().count());
    // Both count the same bytes.
    let root = |t: &str| t.lines().next().unwrap().to_string();
    assert_eq!(root(&user), root(&viewer));
}

#[test]
fn a_notebook_reads_from_the_users_cell() {
    let s = fixture("snapshot_notebook_oom.pickle")
        .display()
        .to_string();
    let lines = ok(cli(&["lines", &s])).stdout;
    let second = lines.lines().nth(1).unwrap_or("");
    assert!(
        second.trim_start().starts_with("2734571.py:3:<module>")
            || second
                .trim_start()
                .starts_with("/tmp/ipykernel_4021/2734571.py:3:<module>"),
        "{lines}"
    );
    for gone in [
        "ipykernel",
        "tornado",
        "asyncio",
        "IPython",
        "traitlets",
        "runpy",
    ] {
        assert!(!lines.contains(gone), "{gone} in\n{lines}");
    }
    // Two different lines of the cell stay two rows.
    assert!(
        lines.contains(":7:make") && lines.contains(":8:make"),
        "{lines}"
    );
}

#[test]
fn categories_are_inferred_where_the_file_has_none() {
    let j = ok(cli(&["categories", "--format", "json", &step()])).json();
    assert_eq!(j["inferred"], true);
    let at_end = |name: &str| {
        j["categories"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["category"] == name)
            .map(|c| c["at_end_bytes"].as_u64().unwrap())
            .unwrap_or_else(|| panic!("no {name} in {j}"))
    };
    let max = |name: &str| {
        j["categories"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["category"] == name)
            .map(|c| c["max_bytes"].as_u64().unwrap())
            .unwrap()
    };
    // make.py: weights of 4 MiB and 1 MiB, biases of 4 KiB and 1 KiB.
    let params = (4 << 20) + 4096 + (1 << 20) + 1024;
    assert_eq!(at_end("parameter"), params);
    // AdamW: two states per parameter, made in the first step and kept.
    assert_eq!(at_end("optimizer_state"), 2 * params);
    // Every parameter's gradient, live between backward and zero_grad.
    assert_eq!(max("gradient"), params);
    assert_eq!(max("input"), 16 << 20);
    assert_eq!(at_end("activation"), 0);
    // The categories add up to the peak.
    let sum: u64 = j["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["at_peak_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, j["peak_used_bytes"].as_u64().unwrap());
    // The lines say which labels were inferred.
    let lines = ok(cli(&["lines", &step()])).stdout;
    assert!(lines.contains("inferred:0:gradient"), "{lines}");
}

#[test]
fn user_categories_come_first_and_bad_rules_are_usage_errors() {
    let s = step();
    let j = ok(cli(&[
        "categories",
        "--format",
        "json",
        "--category",
        "first layer=linear\\.py",
        "--category",
        "never=linear\\.py|relu",
        &s,
    ]))
    .json();
    let names: Vec<&str> = j["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["category"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"first layer"), "{names:?}");
    // relu's output matches only the second rule; linear's both, and the first wins.
    assert!(names.contains(&"never"), "{names:?}");
    for bad in ["x=(", "noequals", "=x"] {
        let o = cli(&["categories", "--category", bad, &s]);
        assert_eq!(o.code, 2, "{bad}: {}", o.stderr);
        assert_eq!(o.stderr.trim().lines().count(), 1, "{}", o.stderr);
    }
}

#[test]
fn record_function_ranges_are_functions_and_profiler_steps_epochs() {
    let s = step();
    let j = ok(cli(&["functions", "--format", "json", &s])).json();
    let row = |name: &str| {
        j["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {j}"))
            .clone()
    };
    let step = row("Optimizer.step#AdamW.step");
    assert_eq!(step["occurrence"], 2);
    // Two states and one temporary per parameter in the first step, one temporary in the
    // second.
    let params = (4u64 << 20) + 4096 + (1 << 20) + 1024;
    assert_eq!(step["used_bytes"].as_u64().unwrap(), 4 * params);
    assert_eq!(row("Optimizer.zero_grad#AdamW.zero_grad")["used_bytes"], 0);
    let t = ok(cli(&["timers", "--functions", "--format", "json", &s])).json();
    assert!(t["functions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "Optimizer.step#AdamW.step" && r["occurrence"] == 2));
    let e = ok(cli(&["epochs", "--format", "json", &s])).json();
    assert_eq!(e["epochs"].as_array().unwrap().len(), 2);
}

/// PyTorch 2.4 kept `record_function` ranges as `user_defined` entries of a device's trace
/// (one frame: the range's name as its `filename`, START or END as its `name`); 2.5 moved them
/// to `external_annotations`. The same run in either layout reads the same.
#[test]
fn record_function_ranges_of_pytorch_2_4_read_as_those_of_later_versions() {
    let v24 = fixture("snapshot_step_cpp_v24.pickle")
        .display()
        .to_string();
    let info = ok(cli(&["info", &v24])).stdout;
    assert!(info.contains("unmapped   nothing"), "{info}");
    for command in ["functions", "epochs", "lines", "categories", "report"] {
        let (a, b) = (ok(cli(&[command, &step()])), ok(cli(&[command, &v24])));
        assert_eq!(a.stdout, b.stdout, "{command}");
    }
    let f = ok(cli(&["functions", &v24])).stdout;
    assert!(f.contains("Optimizer.step#AdamW.step"), "{f}");
}

#[test]
fn segments_only_dumps_keep_their_segments() {
    let s = fixture("snapshot_oom_dump.pickle").display().to_string();
    let info = ok(cli(&["info", "--format", "json", &s])).json();
    // The notebook's allocator (make.py): twelve 3 MiB blocks in 20 MiB segments, eight on the
    // default stream (two segments), four on another (one): three segments, not one lump.
    assert_eq!(info["events"]["alloc_post"], 3, "{info}");
    assert_eq!(info["pool"]["acquired_at_end_bytes"], 3 * (20 << 20));
}

#[test]
fn oom_explains_a_notebooks_out_of_memory() {
    let s = fixture("snapshot_notebook_oom.pickle")
        .display()
        .to_string();
    let j = ok(cli(&["oom", "--format", "json", &s])).json();
    let ooms = j["ooms"].as_array().unwrap();
    assert_eq!(ooms.len(), 1, "{j}");
    let o = &ooms[0];
    let mib = |n: u64| n << 20;
    assert_eq!(o["requested_bytes"], mib(16));
    assert_eq!(o["device_free_bytes"], mib(3));
    assert_eq!(o["reserved_bytes"], mib(60));
    assert_eq!(o["allocated_bytes"], mib(18));
    assert_eq!(o["reserved_unallocated_bytes"], mib(42));
    let pools = o["pools"].as_array().unwrap();
    let default = pools.iter().find(|p| p["stream"] == 0).unwrap();
    assert_eq!(default["pool"], "large");
    assert_eq!(default["segments"], 2);
    assert_eq!(default["free_bytes"], mib(28));
    // Three 3 MiB holes and a 2 MiB tail in the first segment; a hole and a 14 MiB tail in
    // the second (make.py): none holds 16 MiB.
    assert_eq!(default["largest_free_block_bytes"], mib(14));
    assert_eq!(default["inactive_split_blocks"], 6);
    assert_eq!(o["top_lines"][0]["bytes"], mib(18));
    assert!(
        o["top_lines"][0]["line"]
            .as_str()
            .unwrap()
            .ends_with(":7:make"),
        "{o}"
    );
    let advice = o["advice"].to_string();
    assert!(advice.contains("expandable_segments:True"), "{advice}");
    // The report ends with the same explanation.
    let report = ok(cli(&["report", &s])).stdout;
    assert!(
        report.contains("out of memory on cuda:0, stream 0"),
        "{report}"
    );
    assert!(report.contains("expandable_segments:True"), "{report}");
    // No CSV form: a usage error.
    assert_eq!(cli(&["oom", "--format", "csv", &s]).code, 2);
}

#[test]
fn oom_on_a_dump_without_an_oom_entry_explains_its_end() {
    let s = fixture("snapshot_oom_dump.pickle").display().to_string();
    let j = ok(cli(&["oom", "--format", "json", &s])).json();
    let o = &j["ooms"][0];
    assert!(o["requested_bytes"].is_null(), "{o}");
    assert_eq!(o["reserved_bytes"], 60u64 << 20);
    assert_eq!(o["allocated_bytes"], 18u64 << 20);
    assert_eq!(o["pools"].as_array().unwrap().len(), 2);
    let text = ok(cli(&["oom", &s])).stdout;
    assert!(text.starts_with("no out-of-memory in this file"), "{text}");
}

#[test]
fn oom_reads_the_pools_own_out_of_memory() {
    let t = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/traces/seed_fidelity.pstrace")
        .display()
        .to_string();
    let j = ok(cli(&["oom", "--format", "json", &t])).json();
    let o = &j["ooms"][0];
    assert_eq!(o["requested_bytes"], 4u64 << 20);
    // The simulated device holds 4 MiB; the pool held 1 MiB of it.
    assert_eq!(o["reserved_bytes"], 1u64 << 20);
    assert_eq!(o["device_free_bytes"], 3u64 << 20);
    assert!(
        o["advice"].to_string().contains("no allocator setting"),
        "{o}"
    );
}

#[test]
fn report_opens_with_what_was_live_at_the_peak() {
    let report = ok(cli(&["report", &step()])).stdout;
    let peak = report.find("live at the peak: 64.02MB").expect(&report);
    let functions = report.find("FunctionName").unwrap();
    assert!(peak < functions, "{report}");
    for want in [
        "25%  activation",
        "25%  input",
        "train.py:74:main > aten::empty_strided",
        "MmBackward0 > aten::mm",
        "16%  Optimizer.step#AdamW.step",
    ] {
        assert!(report.contains(want), "{want} not in\n{report}");
    }
    let j = ok(cli(&["report", "--format", "json", &step()])).json();
    let sum: u64 = j["peak"]["by_category"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, j["peak"]["peak_used_bytes"].as_u64().unwrap());
}

#[test]
fn the_html_page_of_a_snapshot_explains_its_out_of_memory() {
    let dir = crate::support::scratch::dir();
    let page = dir.join("oom.html");
    let s = fixture("snapshot_notebook_oom.pickle")
        .display()
        .to_string();
    ok(cli(&["html", "-o", page.to_str().unwrap(), &s]));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("id=\"oom-section\""), "the section");
    // The explanation travels in the data island, as `poolsight oom` prints it.
    assert!(
        html.contains("\"oom\":\"out of memory on cuda:0, stream 0"),
        "no oom text"
    );
    assert!(html.contains("expandable_segments:True"));
    // The section `oom` prints, the allocator model's replays included: built once.
    assert!(
        html.contains("the model of PyTorch's allocator, replaying this run with its settings"),
        "no model advice in the page"
    );
    let text = ok(cli(&["oom", &s])).stdout;
    // As the page's data island writes it: JSON, with HTML's `<`, `>` and `&` escaped.
    let escaped = serde_json::to_string(&text)
        .unwrap()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    assert!(
        html.contains(escaped.trim_matches('"')),
        "the page's section is not oom's"
    );
    // A run without an out-of-memory has none.
    let quiet = dir.join("step.html");
    ok(cli(&["html", "-o", quiet.to_str().unwrap(), &step()]));
    assert!(!std::fs::read_to_string(&quiet)
        .unwrap()
        .contains("\"oom\":"));
}

fn plain_step() -> String {
    fixture("snapshot_step_cpp_plain.pickle")
        .display()
        .to_string()
}

#[test]
fn phases_are_inferred_from_the_stacks_where_the_file_records_none() {
    let s = plain_step();
    // Each stretch of forward, backward and optimizer step is a function call.
    let j = ok(cli(&["functions", "--format", "json", &s])).json();
    let names: Vec<(&str, u64)> = j["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                r["occurrence"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [("forward", 2), ("backward", 2), ("optimizer step", 2)]
    );
    // The categories split by phase: what each phase made that was live at the peak.
    let j = ok(cli(&["categories", "--format", "json", &s])).json();
    let phases = j["phases"].as_array().expect("phases");
    let phase = |name: &str| {
        phases
            .iter()
            .find(|p| p["phase"] == name)
            .unwrap_or_else(|| panic!("no {name} in {j}"))
    };
    let split = |name: &str| -> Vec<(String, u64)> {
        phase(name)["categories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["category"].as_str().unwrap().to_string(),
                    c["at_peak_bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    const MIB: u64 = 1 << 20;
    // make.py: relu's and the second layer's outputs live at the peak (8 MiB each: the
    // second layer's freed by then), the backward's temporaries and the last layer's
    // gradients, AdamW's two states per parameter made in the first step.
    assert_eq!(split("forward"), [("activation".to_string(), 16 * MIB)]);
    assert_eq!(
        split("backward"),
        [
            ("temporary".to_string(), 16 * MIB),
            ("gradient".to_string(), MIB + 1024)
        ]
    );
    let params = (4 << 20) + 4096 + (1 << 20) + 1024;
    assert_eq!(
        split("optimizer step"),
        [("optimizer_state".to_string(), 2 * params)]
    );
    assert!(phases
        .iter()
        .all(|p| p["inferred"] == true || p["phase"] == "(no phase)"));
    let sum: u64 = phases
        .iter()
        .map(|p| p["at_peak_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, j["peak_used_bytes"].as_u64().unwrap());
    let text = ok(cli(&["categories", &s])).stdout;
    assert!(text.contains("phases inferred from stacks"), "{text}");
    // Each phase is the root of the lines its allocations came from, as a range is.
    let lines = ok(cli(&["lines", &s])).stdout;
    assert!(
        lines
            .contains("\n  inferred:0:forward (36.00MB, 0.00B)\n    train.py:90:<module> (36.00MB"),
        "{lines}"
    );
    for phase in ["backward", "optimizer step"] {
        assert!(
            lines.contains(&format!("\n  inferred:0:{phase} (")),
            "{lines}"
        );
    }
}

#[test]
fn a_file_with_record_function_ranges_keeps_them_as_its_phases() {
    let j = ok(cli(&["categories", "--format", "json", &step()])).json();
    let names: Vec<&str> = j["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "Optimizer.step#AdamW.step",
            "Optimizer.zero_grad#AdamW.zero_grad",
            "(no phase)"
        ]
    );
    assert!(j["phases"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["inferred"] == false));
    let f = ok(cli(&["functions", "--format", "json", &step()])).json();
    assert!(!f.to_string().contains("\"forward\""), "{f}");
}

#[test]
fn the_html_page_of_a_snapshot_has_a_phase_view() {
    let out = crate::support::scratch::file("p.html");
    ok(cli(&["html", &plain_step(), "-o", out.to_str().unwrap()]));
    let page = std::fs::read_to_string(&out).unwrap();
    assert!(page.contains("id=\"phases-section\""));
    assert!(page.contains("\"id\":\"phases-table\""), "the phase table");
    let at = page
        .find("\"by\":\"phase\"")
        .expect("the timeline stacks by phase");
    let names = &page[at..at + page[at..].find(']').unwrap()];
    for want in ["forward", "backward", "optimizer step", "(no phase)"] {
        assert!(
            names.contains(&format!("\"{want}\"")),
            "{want} not in {names}"
        );
    }
}
