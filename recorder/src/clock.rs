//! The recorder's clock: the CPU's time-stamp counter where it is invariant (a few ns to read,
//! no syscall), else CLOCK_MONOTONIC in ns. Traces store raw ticks; the header carries the
//! calibration that turns them into nanoseconds, and the footer a second point for a better fit.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const UNDECIDED: u8 = 0;
/// x86_64 only: elsewhere the clock is the monotonic one.
#[cfg(target_arch = "x86_64")]
const TSC: u8 = 1;
const MONOTONIC: u8 = 2;

static SOURCE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// Current clock ticks. Which clock is fixed by the first [`Calibration::measure`] in the
/// process; before that, monotonic nanoseconds.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if SOURCE.load(Ordering::Relaxed) == TSC {
            // SAFETY: rdtsc has no preconditions; TSC is chosen only when it is invariant.
            return unsafe { core::arch::x86_64::_rdtsc() };
        }
    }
    monotonic_ns()
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Unix time in nanoseconds.
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos() as u64
}

#[cfg(target_arch = "x86_64")]
fn tsc_is_invariant() -> bool {
    use core::arch::x86_64::__cpuid;
    // Leaf 0x8000_0007 EDX bit 8 is the invariant TSC flag: the counter runs at a constant rate
    // in every power state and is synchronized across cores, so ticks from different threads
    // compare.
    let max_ext = __cpuid(0x8000_0000).eax;
    max_ext >= 0x8000_0007 && (__cpuid(0x8000_0007).edx & (1 << 8)) != 0
}

fn choose_source() -> u8 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("POOLSIGHT_CLOCK").is_some_and(|v| v == "monotonic") {
            return MONOTONIC;
        }
        if tsc_is_invariant() {
            return TSC;
        }
    }
    MONOTONIC
}

/// One instant read on all three clocks, plus the tick rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub ticks: u64,
    pub mono_ns: u64,
    pub unix_ns: u64,
    pub ticks_per_ns: f64,
}

impl Calibration {
    /// Fixes the process's clock source (first call) and measures the tick rate over `span`.
    pub fn measure(span: Duration) -> Calibration {
        let _ = SOURCE.compare_exchange(
            UNDECIDED,
            choose_source(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        let (t0, m0) = paired_reading();
        let unix = unix_ns();
        if SOURCE.load(Ordering::Relaxed) == MONOTONIC {
            return Calibration {
                ticks: t0,
                mono_ns: m0,
                unix_ns: unix,
                ticks_per_ns: 1.0,
            };
        }
        let deadline = m0 + span.as_nanos() as u64;
        while monotonic_ns() < deadline {
            std::hint::spin_loop();
        }
        let (t1, m1) = paired_reading();
        let rate = if m1 > m0 && t1 > t0 {
            (t1 - t0) as f64 / (m1 - m0) as f64
        } else {
            1.0
        };
        Calibration {
            ticks: t0,
            mono_ns: m0,
            unix_ns: unix,
            ticks_per_ns: rate,
        }
    }

    /// The current instant, without re-measuring the rate (for the footer's second point).
    pub fn now() -> (u64, u64, u64) {
        let (t, m) = paired_reading();
        (t, m, unix_ns())
    }
}

/// A ticks reading and a monotonic reading taken as close together as we can: the tick is
/// read between two monotonic reads, and the tightest of a few tries wins.
fn paired_reading() -> (u64, u64) {
    let mut best = (ticks(), monotonic_ns(), u64::MAX);
    for _ in 0..5 {
        let a = monotonic_ns();
        let t = ticks();
        let b = monotonic_ns();
        if b - a < best.2 {
            best = (t, a + (b - a) / 2, b - a);
        }
    }
    (best.0, best.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_converts_ticks_to_elapsed_time() {
        let cal = Calibration::measure(Duration::from_millis(5));
        let t0 = ticks();
        std::thread::sleep(Duration::from_millis(20));
        let t1 = ticks();
        let ns = (t1 - t0) as f64 / cal.ticks_per_ns;
        assert!(
            (19e6..200e6).contains(&ns),
            "20 ms of sleep measured as {ns} ns"
        );
        assert!(cal.unix_ns > 1_600_000_000_000_000_000);
    }

    #[test]
    fn ticks_do_not_go_backwards_on_one_thread() {
        Calibration::measure(Duration::from_millis(1));
        let mut last = ticks();
        for _ in 0..100_000 {
            let now = ticks();
            assert!(now >= last);
            last = now;
        }
    }
}
