//! Shared rendering rules of the seed tables: right-aligned columns, and (from
//! [`crate::units`]) Python's `'%3.2f'`, the byte units of Chainer's and CuPy's reports and the
//! time units of Chainer's TimerHook.

use std::fmt::Write;

pub use crate::units::{
    bytes_in, choose_byte_unit, f2, humanized, seconds, seconds_or_ms, time_auto, time_in,
    time_unit_of, BYTE_UNITS, TIME_UNITS,
};

/// Chainer's table layout: every column right-aligned to its widest entry, two spaces between.
pub fn right_aligned(rows: &[Vec<String>]) -> String {
    aligned(rows, false)
}

/// Columns two spaces apart, each as wide as its widest entry, right-aligned; with
/// `first_left` the first (names, indented) left-aligned, and no row ends in spaces.
pub fn aligned(rows: &[Vec<String>], first_left: bool) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (s, w))| {
                if first_left && i == 0 {
                    format!("{s:<w$}")
                } else {
                    format!("{s:>w$}")
                }
            })
            .collect();
        let line = cells.join("  ");
        let _ = writeln!(out, "{}", if first_left { line.trim_end() } else { &line });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let rows = vec![
            vec!["LinkName".into(), "ElapsedTime".into(), "Occurrence".into()],
            vec!["Linear".into(), "41.42sec".into(), "2100".into()],
            vec!["Classifier".into(), "42.39sec".into(), "700".into()],
        ];
        assert_eq!(
            right_aligned(&rows),
            "  LinkName  ElapsedTime  Occurrence\n    Linear     41.42sec        2100\nClassifier     42.39sec         700\n"
        );
    }
}
