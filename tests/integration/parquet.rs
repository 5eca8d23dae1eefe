//! `export --format parquet`: the fixture traces exported, read back with the `parquet` crate,
//! and the reports recomputed from the rows — `functions`, `epochs` and `info`'s pool peak —
//! equal the analyzer's, per rank. Then the bad inputs: a dataset of another schema version, a
//! directory that is not a dataset, a damaged trace: exit 2, one line, nothing left looking
//! complete.

use crate::support::scratch;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::types::{Int32Type, Int64Type, Int8Type};
use arrow_array::{
    Array, ArrowPrimitiveType, BooleanArray, DictionaryArray, PrimitiveArray, RecordBatch,
    StringArray,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use poolsight::analyzer::export::dataset::{self, ExportOptions, Tables};
use poolsight::analyzer::replay::EpochFigures;
use poolsight::analyzer::tables::epochs::{self, EpochRow};
use poolsight::analyzer::tables::functions::{self, FunctionRow};
use poolsight::analyzer::{replay, tables::info, ReplayOptions, Trace};

const FIXTURES: &[&str] = &[
    "chainer_nested.pstrace",
    "cupy_line_profile.pstrace",
    "fastai_epochs.pstrace",
    "seed_fidelity.pstrace",
    "two_ranks-rank0.pstrace",
    "two_ranks-rank1.pstrace",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/traces")
        .join(name)
}

/// A path that does not exist yet, in a scratch directory removed when the test ends.
fn scratch(name: &str) -> scratch::Scratch {
    scratch::file(name)
}

/// A file's rows as one batch (the fixtures' tables are small).
fn read(path: &Path) -> RecordBatch {
    let file = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).expect("parquet footer");
    let schema = builder.schema().clone();
    let mut batches: Vec<RecordBatch> = builder
        .with_batch_size(1 << 20)
        .build()
        .expect("reader")
        .map(|b| b.expect("batch"))
        .collect();
    assert!(batches.len() <= 1, "{}", path.display());
    batches
        .pop()
        .unwrap_or_else(|| RecordBatch::new_empty(schema))
}

/// A column of numbers of type `T`, nulls as None.
fn numbers<T: ArrowPrimitiveType>(b: &RecordBatch, name: &str) -> Vec<Option<T::Native>> {
    let c = b
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"));
    let a = c
        .as_any()
        .downcast_ref::<PrimitiveArray<T>>()
        .unwrap_or_else(|| panic!("{name}: not {:?}", T::DATA_TYPE));
    a.iter().collect()
}

fn ints(b: &RecordBatch, name: &str) -> Vec<Option<i64>> {
    numbers::<Int64Type>(b, name)
}

fn int(b: &RecordBatch, name: &str) -> Vec<i64> {
    ints(b, name)
        .into_iter()
        .map(|v| v.expect("not null"))
        .collect()
}

fn strs(b: &RecordBatch, name: &str) -> Vec<String> {
    let c = b
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"));
    if let Some(d) = c.as_any().downcast_ref::<DictionaryArray<Int8Type>>() {
        let values = d
            .values()
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("utf8");
        return d
            .keys()
            .iter()
            .map(|k| values.value(k.expect("key") as usize).to_string())
            .collect();
    }
    let a = c.as_any().downcast_ref::<StringArray>().expect("Utf8");
    a.iter().map(|s| s.expect("not null").to_string()).collect()
}

fn bools(b: &RecordBatch, name: &str) -> Vec<bool> {
    let c = b
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"));
    let a = c.as_any().downcast_ref::<BooleanArray>().expect("Boolean");
    a.iter().map(|v| v.expect("not null")).collect()
}

/// One rank's tables, read back.
struct Rank {
    events: RecordBatch,
    stacks: RecordBatch,
    runs: RecordBatch,
    functions: RecordBatch,
    epochs: RecordBatch,
}

fn rank_tables(dir: &Path, run: &str, rank: u32) -> Rank {
    let t = |table: &str| {
        read(
            &dir.join(table)
                .join(format!("run={run}"))
                .join(format!("rank={rank}"))
                .join("part-0.parquet"),
        )
    };
    Rank {
        events: t("events"),
        stacks: t("stacks"),
        runs: t("runs"),
        functions: t("functions"),
        epochs: t("epochs"),
    }
}

/// Chainer's functions table, from the rows alone: a malloc request counts for every
/// function frame on its stack (nested calls in each), its innermost function's self
/// columns, and a function's occurrences are its closed scopes.
fn functions_from_rows(r: &Rank) -> Vec<FunctionRow> {
    let (stack, name, kind) = (
        int(&r.stacks, "stack"),
        strs(&r.stacks, "name"),
        strs(&r.stacks, "kind"),
    );
    // stack -> function names on it, outermost first (rows are in depth order)
    let mut fns: HashMap<i64, Vec<String>> = HashMap::new();
    let mut innermost_name: HashMap<i64, String> = HashMap::new();
    for i in 0..stack.len() {
        if kind[i] == "function" {
            fns.entry(stack[i]).or_default().push(name[i].clone());
        }
        innermost_name.insert(stack[i], name[i].clone());
    }
    let e = &r.events;
    let (seq, kinds, mem_size, ptr, stacks) = (
        int(e, "seq"),
        strs(e, "kind"),
        ints(e, "mem_size"),
        ints(e, "ptr"),
        ints(e, "stack"),
    );
    let mut rows: BTreeMap<String, (FunctionRow, i64, i64)> = BTreeMap::new();
    fn row<'r>(
        rows: &'r mut BTreeMap<String, (FunctionRow, i64, i64)>,
        name: &str,
    ) -> &'r mut (FunctionRow, i64, i64) {
        rows.entry(name.to_string()).or_insert_with(|| {
            (
                FunctionRow {
                    name: name.to_string(),
                    ..FunctionRow::default()
                },
                i64::MAX,
                i64::MAX,
            )
        })
    }
    for i in 0..seq.len() {
        let s = stacks[i].unwrap_or(0);
        let names = fns.get(&s).cloned().unwrap_or_default();
        let size = mem_size[i].unwrap_or(0) as u64;
        let failed = ptr[i] == Some(0);
        match kinds[i].as_str() {
            "malloc_post" | "alloc_post" => {
                let used = kinds[i] == "malloc_post";
                for n in &names {
                    let r = row(&mut rows, n);
                    if used {
                        r.0.used_bytes += size;
                        r.0.failed_used_bytes += if failed { size } else { 0 };
                    } else {
                        r.0.acquired_bytes += size;
                        r.0.failed_acquired_bytes += if failed { size } else { 0 };
                    }
                    r.2 = r.2.min(seq[i]);
                }
                if let Some(n) = names.last() {
                    let r = row(&mut rows, n);
                    if used {
                        r.0.self_used_bytes += size;
                    } else {
                        r.0.self_acquired_bytes += size;
                    }
                }
            }
            "function" => {
                let r = row(&mut rows, &innermost_name[&s]);
                r.0.occurrence += 1;
                r.1 = r.1.min(seq[i]);
            }
            _ => {}
        }
    }
    let mut rows: Vec<_> = rows.into_values().collect();
    rows.sort_by(|a, b| (a.1, a.2, &a.0.name).cmp(&(b.1, b.2, &b.0.name)));
    rows.into_iter().map(|r| r.0).collect()
}

/// The pool's used and held bytes walked in `seq` order: the peak, and fastai's epochs.
fn pool_from_rows(r: &Rank) -> (u64, u64, Vec<EpochRow>) {
    let e = &r.events;
    let (kinds, bytes, mem_size, ptr, epoch, cpu, cpu_peak) = (
        strs(e, "kind"),
        ints(e, "bytes"),
        ints(e, "mem_size"),
        ints(e, "ptr"),
        ints(e, "epoch"),
        ints(e, "cpu_bytes"),
        ints(e, "cpu_peak_bytes"),
    );
    assert_eq!(int(e, "seq"), (0..kinds.len() as i64).collect::<Vec<_>>());
    let (mut used, mut held, mut peak_used, mut peak_held) = (0i64, 0i64, 0i64, 0i64);
    let mut open: Option<EpochFigures> = None;
    let mut out = Vec::new();
    for i in 0..kinds.len() {
        match kinds[i].as_str() {
            "malloc_post" if ptr[i] != Some(0) => used += mem_size[i].unwrap_or(0),
            "free_post" => used -= mem_size[i].unwrap_or(0),
            "alloc_post" if ptr[i] != Some(0) => held += bytes[i].unwrap_or(0),
            "release" => held -= bytes[i].unwrap_or(0),
            "epoch_begin" => {
                open = Some(EpochFigures {
                    epoch: epoch[i].expect("epoch") as u32,
                    begin_ns: 0,
                    end_ns: 0,
                    complete: false,
                    gpu_begin_bytes: used,
                    gpu_end_bytes: used,
                    gpu_max_bytes: used,
                    held_begin_bytes: held,
                    held_end_bytes: held,
                    held_max_bytes: held,
                    cpu_begin_bytes: cpu[i].expect("cpu") as u64,
                    cpu_end_bytes: 0,
                    cpu_peak_bytes: 0,
                });
            }
            "epoch_end" => {
                if let Some(mut f) = open.take() {
                    f.complete = true;
                    f.gpu_end_bytes = used;
                    f.held_end_bytes = held;
                    f.cpu_end_bytes = cpu[i].expect("cpu") as u64;
                    f.cpu_peak_bytes = cpu_peak[i].expect("cpu peak") as u64;
                    out.push(epochs::row(&f));
                }
            }
            _ => {}
        }
        peak_used = peak_used.max(used);
        peak_held = peak_held.max(held);
        if let Some(f) = &mut open {
            f.gpu_max_bytes = f.gpu_max_bytes.max(used);
            f.held_max_bytes = f.held_max_bytes.max(held);
        }
    }
    (peak_used as u64, peak_held as u64, out)
}

fn export_fixtures(dir: &Path) -> Vec<dataset::ExportedTrace> {
    let paths: Vec<PathBuf> = FIXTURES.iter().map(|f| fixture(f)).collect();
    let traces = dataset::open(&paths, false).expect("open");
    let opts = ExportOptions {
        tables: Tables::All,
        ..ExportOptions::default()
    };
    dataset::export(&traces, dir, &opts).expect("export")
}

#[test]
fn the_rows_reproduce_functions_epochs_and_the_peak_of_every_rank() {
    let dir = scratch("fixtures");
    let written = export_fixtures(&dir);
    assert_eq!(written.len(), FIXTURES.len());
    for w in &written {
        let trace = Trace::open(&w.path).expect("open");
        let profile = replay(&trace, 0, &ReplayOptions::default());
        let mut expected_info = info::info(&trace);
        info::add_replay(&mut expected_info, &profile);
        let pool = expected_info.pool.clone().expect("pool figures");
        let r = rank_tables(&dir, &w.run, w.rank);
        let what = w.path.display();

        assert_eq!(
            r.events.num_rows() as u64,
            expected_info.total_events,
            "{what}: one row per event"
        );
        let expected_functions = functions::functions(&profile).functions;
        assert_eq!(
            functions_from_rows(&r),
            expected_functions,
            "{what}: functions"
        );
        let (peak_used, peak_held, epoch_rows) = pool_from_rows(&r);
        assert_eq!(peak_used, pool.peak_used_bytes, "{what}: peak used");
        assert_eq!(peak_held, pool.peak_acquired_bytes, "{what}: peak acquired");
        let expected_epochs = epochs::epochs(&profile).epochs;
        assert_eq!(epoch_rows, expected_epochs, "{what}: epochs");

        // The runs row and the summary tables carry the same figures.
        assert_eq!(
            int(&r.runs, "peak_used_bytes"),
            [pool.peak_used_bytes as i64]
        );
        assert_eq!(bools(&r.runs, "finished"), [expected_info.finished]);
        assert_eq!(
            numbers::<Int32Type>(&r.runs, "schema_version"),
            [Some(dataset::SCHEMA_VERSION as i32)]
        );
        assert_eq!(
            strs(&r.functions, "name"),
            expected_functions
                .iter()
                .map(|f| f.name.clone())
                .collect::<Vec<_>>()
        );
        assert_eq!(
            int(&r.functions, "used_bytes"),
            expected_functions
                .iter()
                .map(|f| f.used_bytes as i64)
                .collect::<Vec<_>>()
        );
        assert_eq!(
            int(&r.epochs, "gpu_peak_mb"),
            expected_epochs
                .iter()
                .map(|e| e.gpu_peak_mb)
                .collect::<Vec<_>>()
        );
    }
    // The two ranks of one job share a run; every other fixture is a run of its own.
    let runs: Vec<&str> = written.iter().map(|w| w.run.as_str()).collect();
    assert_eq!(runs[4], runs[5]);
    let mut distinct = runs.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), FIXTURES.len() - 1);
    assert!(written.iter().any(|w| w.rank == 1));
}

#[test]
fn exporting_again_gives_the_same_partitions_and_replaces_the_files() {
    let dir = scratch("again");
    let first = export_fixtures(&dir);
    let second = export_fixtures(&dir);
    assert_eq!(first, second);
    let files = walk(&dir);
    assert!(
        files.iter().all(|f| {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name == dataset::MARKER || name == "part-0.parquet"
        }),
        "{files:?}"
    );
    // events, stacks, functions, lines, timers, epochs, runs per trace, and the marker
    assert_eq!(files.len(), FIXTURES.len() * 7 + 1);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn poolsight(args: &[&str]) -> (i32, String) {
    let o = crate::support::cli(args);
    (o.code, o.stderr)
}

fn one_error_line(stderr: &str) -> &str {
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("poolsight: warning:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    errors[0]
}

#[test]
fn another_schema_version_or_a_foreign_directory_is_refused() {
    let trace = fixture("chainer_nested.pstrace");
    let trace = trace.to_str().expect("utf-8 path");
    let dir = scratch("other-version");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join(dataset::MARKER),
        "{\"format\":\"poolsight-parquet\",\"schema_version\":999}\n",
    )
    .expect("marker");
    let d = dir.to_str().expect("utf-8 path");
    let (code, stderr) = poolsight(&["export", "--format", "parquet", "-o", d, trace]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        one_error_line(&stderr).contains("schema version 999"),
        "{stderr}"
    );
    assert_eq!(walk(&dir).len(), 1, "nothing written beside the marker");

    let foreign = scratch("foreign");
    std::fs::create_dir_all(&foreign).expect("mkdir");
    std::fs::write(foreign.join("notes.txt"), "mine").expect("write");
    let d = foreign.to_str().expect("utf-8 path");
    let (code, stderr) = poolsight(&["export", "--format", "parquet", "-o", d, trace]);
    assert_eq!(code, 2, "{stderr}");
    assert!(one_error_line(&stderr).contains("not empty"), "{stderr}");
    assert_eq!(walk(&foreign).len(), 1);
}

#[test]
fn a_damaged_trace_is_refused_before_anything_is_written() {
    let mut bytes = std::fs::read(fixture("chainer_nested.pstrace")).expect("fixture");
    let at = bytes.len() - 200;
    bytes[at] ^= 0x5a;
    let dir = scratch("damaged");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let bad = dir.join("bad.pstrace");
    std::fs::write(&bad, &bytes).expect("write");
    let good = fixture("fastai_epochs.pstrace");
    let out = dir.join("dataset");
    let (code, stderr) = poolsight(&[
        "export",
        "--format",
        "parquet",
        "-o",
        out.to_str().expect("utf-8"),
        good.to_str().expect("utf-8"),
        bad.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 2, "{stderr}");
    let line = one_error_line(&stderr);
    assert!(
        line.contains("damaged") && line.contains("--allow-incomplete"),
        "{stderr}"
    );
    assert!(!out.exists(), "no dataset started for a refused export");

    let (code, stderr) = poolsight(&[
        "export",
        "--format",
        "parquet",
        "--allow-incomplete",
        "-o",
        out.to_str().expect("utf-8"),
        bad.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("poolsight: warning:"), "{stderr}");
}

/// A trace of several row groups from two threads racing: the rows come out in one time
/// order, numbered without a gap, and the running sum over them is `info`'s peak.
#[test]
fn a_large_two_thread_trace_exports_in_order_across_row_groups() {
    use poolsight::recorder::{MemKind, MemRecord, Recorder, RecorderConfig};

    const PAIRS: u64 = 200_000;
    let dir = scratch("large");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join("two-threads.pstrace");
    let rec = Recorder::create(&path, RecorderConfig::default()).expect("create");
    std::thread::scope(|s| {
        for t in 1..=2u64 {
            let h = rec.handle();
            s.spawn(move || {
                let record = |kind, ptr, bytes| {
                    h.record_mem(MemRecord {
                        kind,
                        device: 0,
                        stream: 0,
                        ptr,
                        bytes,
                        stack: 0,
                        pmem: 0,
                    })
                };
                for i in 0..PAIRS {
                    let ptr = (t << 40) | (i + 1);
                    record(MemKind::MallocPost, ptr, 512 * (1 + i % 7));
                    record(MemKind::FreePost, ptr, 512 * (1 + i % 7));
                }
            });
        }
    });
    rec.finish().expect("finish");
    let traces = dataset::open(&[&path], false).expect("open");
    let out = dir.join("dataset");
    let written = dataset::export(&traces, &out, &ExportOptions::default()).expect("export");
    let profile = replay(&traces[0], 0, &ReplayOptions::default());
    let mut expected = info::info(&traces[0]);
    info::add_replay(&mut expected, &profile);

    let file = File::open(&written[0].files[0]).expect("events file");
    let reader = ParquetRecordBatchReaderBuilder::try_new(file).expect("footer");
    assert!(reader.metadata().num_row_groups() > 1, "several row groups");
    let (mut seq, mut last_ns, mut used, mut peak) = (0i64, 0i64, 0i64, 0i64);
    for batch in reader.build().expect("reader") {
        let b = batch.expect("batch");
        let (seqs, ns, kinds, sizes) = (
            int(&b, "seq"),
            int(&b, "ts_ns"),
            strs(&b, "kind"),
            int(&b, "mem_size"),
        );
        for i in 0..b.num_rows() {
            assert_eq!(seqs[i], seq, "seq has no gap");
            assert!(ns[i] >= last_ns, "time order at seq {seq}");
            (seq, last_ns) = (seq + 1, ns[i]);
            used += if kinds[i] == "malloc_post" {
                sizes[i]
            } else {
                -sizes[i]
            };
            peak = peak.max(used);
        }
    }
    assert_eq!(seq as u64, expected.total_events);
    assert_eq!(seq as u64, 4 * PAIRS);
    assert_eq!(peak as u64, expected.pool.expect("pool").peak_used_bytes);
}

/// `trace` exported with the CLI, and the events table of its one rank.
fn exported_events(trace: &Path) -> RecordBatch {
    let out = scratch::dir();
    let (code, err) = poolsight(&[
        "export",
        "--format",
        "parquet",
        "-o",
        out.to_str().unwrap(),
        trace.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let parts: Vec<PathBuf> = walk(&out.join("events"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    assert_eq!(parts.len(), 1, "{parts:?}");
    read(&parts[0])
}

#[test]
fn each_mark_puts_its_figures_in_the_columns_that_name_them() {
    // An imported snapshot's out-of-memory: the device's free bytes (1 MiB in make.py) are
    // the device_free row's bytes, on its device, not CPU bytes.
    let snap = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pytorch/snapshot_small.pickle");
    let ev = exported_events(&snap);
    let kinds = strs(&ev, "kind");
    let at = kinds
        .iter()
        .position(|k| k == "device_free")
        .expect("a device_free row");
    assert_eq!(ints(&ev, "bytes")[at], Some(1 << 20));
    assert_eq!(numbers::<Int32Type>(&ev, "device")[at], Some(0));
    assert_eq!(ints(&ev, "cpu_bytes")[at], None);

    // A call that raised: its row carries the call's stack and how long it ran.
    let path = scratch("aborted.pstrace");
    {
        use poolsight::recorder::{Phase, Recorder, RecorderConfig, ScopeKind};
        let rec = Recorder::create(&*path, RecorderConfig::default()).expect("recorder");
        let h = rec.handle();
        let t = h.enter(ScopeKind::Function, "Embed", Phase::Forward, "m.py", 9);
        std::thread::sleep(std::time::Duration::from_millis(2));
        h.abort(t).unwrap();
        drop(h);
        rec.finish().unwrap();
    }
    let ev = exported_events(&path);
    let kinds = strs(&ev, "kind");
    let at = kinds
        .iter()
        .position(|k| k == "scope_abort")
        .expect("a scope_abort row");
    assert!(ints(&ev, "stack")[at].is_some_and(|s| s > 0));
    assert!(ints(&ev, "duration_ns")[at].is_some_and(|d| d >= 2_000_000));
    assert_eq!(ints(&ev, "cpu_bytes")[at], None);
}
