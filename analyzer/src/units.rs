//! The seeds' numbers as text: Python's `'%3.2f'`, the byte units of Chainer's and CuPy's
//! reports (1024 steps) and the time units of Chainer's `TimerHook`. Every layer of the crate
//! speaks them (the replay's out-of-memory notes, the allocator model's advice, the tables), so
//! they sit below all of them; [`crate::tables::render`] re-exports them beside its columns.

/// Python's `'%3.2f' % x`: two decimals, at least three characters wide.
pub fn f2(x: f64) -> String {
    format!("{x:3.2}")
}

/// Byte units of Chainer's `CupyMemoryProfileHook._units` (the multiplier is 1024 per step).
pub const BYTE_UNITS: [&str; 8] = ["B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB"];

/// Chainer's `CupyMemoryProfileHook._choose_unit`: the first of B..EB where
/// `value / (unit * 1024) < 1`, else ZB; `B` for values at or below 0. Returns (index into
/// [`BYTE_UNITS`], divisor).
pub fn choose_byte_unit(value: f64) -> (usize, f64) {
    let mut denom = 1.0;
    if value <= 0.0 {
        return (0, denom);
    }
    for i in 0..BYTE_UNITS.len() - 1 {
        if value / (denom * 1024.0) < 1.0 {
            return (i, denom);
        }
        denom *= 1024.0;
    }
    (BYTE_UNITS.len() - 1, denom)
}

/// A byte count in a given unit: `%3.2f` + unit name.
pub fn bytes_in(value: f64, unit: (usize, f64)) -> String {
    format!("{}{}", f2(value / unit.1), BYTE_UNITS[unit.0])
}

/// CuPy `LineProfileHook`'s `_humanized_size`: `%3.2f` and B, KB, ... in 1024 steps.
pub fn humanized(bytes: u64) -> String {
    let mut size = bytes as f64;
    for unit in &BYTE_UNITS[..BYTE_UNITS.len() - 1] {
        if size < 1024.0 {
            return format!("{}{unit}", f2(size));
        }
        size /= 1024.0;
    }
    format!("{size:.2}ZB")
}

/// Time units of Chainer's `TimerHook.print_report`, with their multipliers from seconds.
pub const TIME_UNITS: [(&str, f64); 4] = [("sec", 1.0), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)];

/// Chainer's `TimerHook._choose_unit`: the first of sec, ms, us in which the value is >= 1,
/// else ns. Returns an index into [`TIME_UNITS`].
pub fn time_unit_of(ns: u64) -> usize {
    let secs = ns as f64 / 1e9;
    TIME_UNITS
        .iter()
        .position(|(_, m)| secs * m >= 1.0)
        .unwrap_or(TIME_UNITS.len() - 1)
}

/// A time in the unit [`time_unit_of`] chooses for it.
pub fn time_auto(ns: u64) -> String {
    time_in(ns, time_unit_of(ns))
}

/// `%3.2f` in one of [`TIME_UNITS`] (by index) + its name.
pub fn time_in(ns: u64, unit: usize) -> String {
    let (name, mult) = TIME_UNITS[unit];
    format!("{}{name}", f2(ns as f64 / 1e9 * mult))
}

/// Wall time in seconds with three decimals: `1.234 s`.
pub fn seconds(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

/// Wall time in seconds from one second up, in milliseconds below.
pub fn seconds_or_ms(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        seconds(ns)
    } else {
        format!("{:.3} ms", ns as f64 / 1e6)
    }
}

/// Bytes with an optional unit (1024 steps): `16GiB`, `80GB`, `512M`, `1048576`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 16GiB, 80GB, 1048576)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?} (B, KB, MB, GB, TB)"
            ))
        }
    };
    let bytes = n * scale as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{s:?} is not a usable capacity"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_formatting() {
        assert_eq!(f2(0.0), "0.00");
        assert_eq!(f2(5.164), "5.16");
        assert_eq!(f2(179.98), "179.98");
    }

    #[test]
    fn chainer_units() {
        assert_eq!(choose_byte_unit(0.0).0, 0);
        assert_eq!(choose_byte_unit(1023.0).0, 0);
        assert_eq!(choose_byte_unit(1024.0).0, 1);
        let gb = 5.16 * (1u64 << 30) as f64;
        assert_eq!(bytes_in(gb, choose_byte_unit(gb)), "5.16GB");
        // Column unit from the max: a smaller value in the same column keeps GB.
        let relu = 0.99 * (1u64 << 30) as f64;
        assert_eq!(bytes_in(relu, choose_byte_unit(gb)), "0.99GB");
        // chainer/function_hooks/cupy_memory_profile.py `_choose_unit`: EB below 1024 EB,
        // ZB from there on (the last unit takes everything above).
        let eb = 1024f64.powi(6);
        assert_eq!(bytes_in(eb, choose_byte_unit(eb)), "1.00EB");
        assert_eq!(
            bytes_in(2048.0 * eb, choose_byte_unit(2048.0 * eb)),
            "2.00ZB"
        );
        assert_eq!(choose_byte_unit(-5.0), (0, 1.0));
    }

    #[test]
    fn cupy_sizes() {
        assert_eq!(humanized(3072), "3.00KB");
        assert_eq!(humanized(2048), "2.00KB");
        assert_eq!(humanized(0), "0.00B");
        assert_eq!(humanized(1023), "1023.00B");
    }

    #[test]
    fn chainer_times() {
        assert_eq!(time_auto(41_420_000_000), "41.42sec");
        assert_eq!(time_auto(1_500_000), "1.50ms");
        assert_eq!(time_auto(999), "999.00ns");
        assert_eq!(time_auto(0), "0.00ns");
    }
}
