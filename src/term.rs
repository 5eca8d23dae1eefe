//! What the CLI writes to stderr besides errors: warnings about damaged traces, the replay
//! progress bar, and a note for each file written.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use poolsight::analyzer::read::load::{self, LoadWarning, Loaded};
use poolsight::analyzer::{Profile, ReplayOptions};

pub fn warn(w: &LoadWarning) {
    // One line per warning, whatever a verifier's message holds.
    let text: String = w
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("poolsight: warning: {text}");
}

/// Opens and replays the traces ([`load::load`]: each chunk's checksum is checked as the
/// replay reads it), with a progress bar while replaying, then prints the warnings.
pub fn load_traces(paths: &[PathBuf], opts: ReplayOptions) -> anyhow::Result<Loaded> {
    for p in paths {
        check_trace_path(p)?;
    }
    let mut bar = ProgressBar::new();
    let opts = ReplayOptions {
        progress: Some(Arc::clone(&bar.done)),
        ..opts
    };
    let loaded = load::load(paths, &opts, |total| bar.begin("replaying", total));
    bar.finish();
    let loaded = loaded?;
    loaded.warnings.iter().for_each(warn);
    Ok(loaded)
}

/// A directory named where a trace file is expected gets its own message (opening it would
/// report the operating system's "No such device" or "Is a directory").
pub fn check_trace_path(path: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        !path.is_dir(),
        "{} is a directory, not a trace file (name the *.pstrace files in it)",
        path.display()
    );
    Ok(())
}

/// The traces' profiles (see [`load_traces`]).
pub fn load_profiles(paths: &[PathBuf], live_at_peak: bool) -> anyhow::Result<Vec<Profile>> {
    let opts = ReplayOptions {
        live_at_peak,
        ..ReplayOptions::default()
    };
    Ok(load_traces(paths, opts)?.profiles)
}

/// Runs `work` with a progress bar counting up to `total` (shown as [`load_traces`] shows
/// its own); `work` gets the counter to add to.
pub fn with_progress<T>(label: &str, total: u64, work: impl FnOnce(Arc<AtomicU64>) -> T) -> T {
    let mut bar = ProgressBar::new();
    bar.begin(label, total);
    let result = work(Arc::clone(&bar.done));
    bar.finish();
    result
}

pub fn write_file(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    wrote(path);
    Ok(())
}

pub fn wrote(path: &Path) {
    eprintln!("poolsight: wrote {}", path.display());
}

/// A progress bar on stderr while replaying or exporting, only when stderr is a terminal and the work is
/// big enough to notice; silent otherwise (CI logs, pipes).
struct ProgressBar {
    done: Arc<AtomicU64>,
    finished: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const PROGRESS_MIN_BYTES: u64 = 256 << 20;

impl ProgressBar {
    fn new() -> ProgressBar {
        ProgressBar {
            done: Arc::new(AtomicU64::new(0)),
            finished: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    /// Shows the bar, once the total is known, if it is worth one.
    fn begin(&mut self, label: &str, total: u64) {
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

    fn finish(mut self) {
        self.finished.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
