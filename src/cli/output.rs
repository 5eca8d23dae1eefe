//! What the CLI writes besides errors: the reports in their formats, files with a note on
//! stderr for each, and a progress bar on a terminal for long work.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::args::Format;

/// Runs `write` (text made by `fmt::Write`) onto `out` as it goes, with the first I/O error
/// (a closed pipe, a full disk) as the error, not `fmt::Error`.
pub fn write_text(
    out: &mut impl Write,
    write: impl FnOnce(&mut dyn std::fmt::Write) -> std::fmt::Result,
) -> std::io::Result<()> {
    struct Text<'a, W: Write> {
        out: &'a mut W,
        error: Option<std::io::Error>,
    }
    impl<W: Write> std::fmt::Write for Text<'_, W> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.out.write_all(s.as_bytes()).map_err(|e| {
                self.error.get_or_insert(e);
                std::fmt::Error
            })
        }
    }
    let mut text = Text { out, error: None };
    match (write(&mut text), text.error) {
        (_, Some(e)) => Err(e),
        (Err(_), None) => Err(std::io::Error::other("formatting the report failed")),
        (Ok(()), None) => Ok(()),
    }
}

/// `value` as pretty JSON and a newline, written as it is made; a closed pipe or a full disk
/// is its I/O error.
pub fn write_json(out: &mut impl Write, value: &impl serde::Serialize) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value).map_err(std::io::Error::from)?;
    writeln!(out)
}

/// Views as one JSON array, each view's object with its `trace` added, made one view at a
/// time as it is written.
struct Traces<'a, T>(&'a [(String, T)]);

impl<T: serde::Serialize> serde::Serialize for Traces<'_, T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for (name, v) in self.0 {
            // Through a `Value`, whose keys are in alphabetical order: `trace` among them.
            let mut j = serde_json::to_value(v).map_err(S::Error::custom)?;
            if let Some(o) = j.as_object_mut() {
                o.insert("trace".into(), name.clone().into());
            }
            seq.serialize_element(&j)?;
        }
        seq.end()
    }
}

/// Prints one rendering per view: tables and CSV under `== heading ==` lines, JSON as one
/// document (an array of `{"trace", ...report}` objects with --per-rank).
pub fn emit<T: serde::Serialize>(
    out: &mut impl Write,
    format: Format,
    views: &[(String, T)],
    table: impl Fn(&T) -> String,
    csv: impl Fn(&T) -> String,
) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            // Written as it is made (a large trace's `lines` is hundreds of MB of JSON), and
            // buffered: standard output flushes at every line.
            let mut text = std::io::BufWriter::with_capacity(1 << 16, &mut *out);
            if views.len() == 1 && views[0].0.is_empty() {
                write_json(&mut text, &views[0].1)?;
            } else {
                write_json(&mut text, &Traces(views))?;
            }
            text.flush()?;
        }
        Format::Csv if views.iter().any(|(name, _)| !name.is_empty()) => {
            // One table for every rank: a leading `trace` column says whose row it is.
            for (i, (name, v)) in views.iter().enumerate() {
                let text = csv(v);
                let (header, rows) = text.split_once('\n').unwrap_or((&text, ""));
                if i == 0 {
                    writeln!(out, "trace,{header}")?;
                }
                let cell = poolsight::analyzer::tables::csv::cell(name);
                for record in csv_records(rows) {
                    writeln!(out, "{cell},{record}")?;
                }
            }
        }
        Format::Table | Format::Csv => {
            for (i, (name, v)) in views.iter().enumerate() {
                if !name.is_empty() {
                    if i > 0 {
                        writeln!(out)?;
                    }
                    writeln!(out, "== {name} ==")?;
                }
                let text = if format == Format::Table {
                    table(v)
                } else {
                    csv(v)
                };
                write!(out, "{text}")?;
            }
        }
    }
    Ok(())
}

/// The records of CSV text (without its header), each possibly spanning lines inside quotes.
fn csv_records(text: &str) -> Vec<&str> {
    let mut records = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, b) in text.bytes().enumerate() {
        match b {
            b'"' => quoted = !quoted,
            b'\n' if !quoted => {
                records.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < text.len() {
        records.push(&text[start..]);
    }
    records
}

pub fn write_file(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    wrote(path);
    Ok(())
}

pub fn wrote(path: &Path) {
    eprintln!("poolsight: wrote {}", path.display());
}

/// The traces' file names, for titles.
pub fn names(traces: &[PathBuf]) -> String {
    traces
        .iter()
        .map(|p| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where an export goes: a buffered file, or stdout for "-".
pub enum Sink {
    File(PathBuf, std::io::BufWriter<std::fs::File>),
    Stdout(std::io::Stdout),
}

impl Sink {
    pub fn create(path: &Path) -> anyhow::Result<Sink> {
        if path == Path::new("-") {
            return Ok(Sink::Stdout(std::io::stdout()));
        }
        let f = std::fs::File::create(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Sink::File(
            path.to_path_buf(),
            std::io::BufWriter::with_capacity(1 << 20, f),
        ))
    }

    pub fn finish(self) -> anyhow::Result<()> {
        match self {
            Sink::File(path, mut w) => {
                w.flush()
                    .with_context(|| format!("cannot write {}", path.display()))?;
                wrote(&path);
            }
            Sink::Stdout(mut s) => s.flush()?,
        }
        Ok(())
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::File(_, w) => w.write(buf),
            Sink::Stdout(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::File(_, w) => w.flush(),
            Sink::Stdout(s) => s.flush(),
        }
    }
}

/// Runs `work` with a progress bar counting up to `total` (shown as the replay shows its own);
/// `work` gets the counter to add to.
pub fn with_progress<T>(label: &str, total: u64, work: impl FnOnce(Arc<AtomicU64>) -> T) -> T {
    let mut bar = ProgressBar::new();
    bar.begin(label, total);
    let result = work(Arc::clone(&bar.done));
    bar.finish();
    result
}

/// A progress bar on stderr while replaying or exporting, only when stderr is a terminal and the work is
/// big enough to notice; silent otherwise (CI logs, pipes).
pub struct ProgressBar {
    pub done: Arc<AtomicU64>,
    finished: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const PROGRESS_MIN_BYTES: u64 = 256 << 20;

impl ProgressBar {
    pub fn new() -> ProgressBar {
        ProgressBar {
            done: Arc::new(AtomicU64::new(0)),
            finished: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    /// Shows the bar, once the total is known, if it is worth one.
    pub fn begin(&mut self, label: &str, total: u64) {
        if !std::io::stderr().is_terminal() || total < PROGRESS_MIN_BYTES {
            return;
        }
        let (done, finished) = (Arc::clone(&self.done), Arc::clone(&self.finished));
        let template =
            format!("{label} {{bar:40}} {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}, {{eta}})");
        self.thread = Some(std::thread::spawn(move || {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(&template)
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            while !finished.load(Ordering::Relaxed) {
                bar.set_position(done.load(Ordering::Relaxed).min(total));
                std::thread::sleep(Duration::from_millis(100));
            }
            bar.finish_and_clear();
        }));
    }

    pub fn finish(mut self) {
        self.finished.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
