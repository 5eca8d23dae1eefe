//! What the recorder's and the pool's benchmarks share: the floor (one clock read), the
//! `--rounds N` argument, the load average, and running contestants interleaved, round after
//! round, into medians and minimums. The pool's benchmark includes this file by path.

use std::time::Instant;

use poolsight_recorder::clock;

/// ns per clock read over `n` reads: the floor of any timestamped event.
pub fn floor(n: u64) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(clock::ticks());
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

/// The value after `flag` on the command line (`cargo bench` passes `--bench`; the rest is
/// ours).
pub fn arg<'a>(args: &'a [String], flag: &str) -> Option<&'a String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
}

/// `--rounds N`, 9 unless given.
pub fn rounds(args: &[String]) -> usize {
    arg(args, "--rounds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(9usize)
        .max(1)
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Runs the contestants interleaved for `rounds` rounds (those `runs` leaves out give NaN),
/// so that a burst of load from another process hits them alike, with the load average
/// printed before and after; returns each one's (median, minimum) in ns.
pub fn interleaved(
    contestants: &[&dyn Fn() -> f64],
    rounds: usize,
    runs: impl Fn(usize) -> bool,
) -> (Vec<f64>, Vec<f64>) {
    println!("load average before: {}", loadavg());
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); contestants.len()];
    for _ in 0..rounds {
        for (i, run) in contestants.iter().enumerate() {
            samples[i].push(if runs(i) { run() } else { f64::NAN });
        }
    }
    println!("load average after:  {}", loadavg());
    let mins = samples
        .iter()
        .map(|s| s.iter().copied().fold(f64::INFINITY, f64::min))
        .collect();
    let meds = samples
        .iter_mut()
        .map(|s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        })
        .collect();
    (meds, mins)
}
