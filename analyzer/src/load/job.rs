//! Opening the traces of one job together: in a fixed order (by rank, then path), refusing a
//! trace given twice and the same rank of one run twice, and warning of ranks of different runs
//! and of ranks missing from a world size.

use super::{Input, LoadError, LoadWarning};
use crate::read::{Header, Trace, Warning};

/// Missing ranks a warning names; it counts the rest.
const MISSING_RANKS_NAMED: usize = 32;

/// Opened traces in report order, and what was wrong with parts of them.
pub struct Opened {
    pub traces: Vec<Trace>,
    pub warnings: Vec<LoadWarning>,
}

/// Opens the inputs' traces (with `deferred`, their event chunks' checksums left to the
/// replay), ordered by rank then path, so that the same files give the same output whatever
/// order they were named in. Warnings are in the order the paths were named.
///
/// The same file twice (by its header: process, host and start time), or the same rank of
/// one run twice, is an error; ranks of different runs (another command line or world size)
/// and ranks missing from a world size are warnings.
pub(super) fn open<'a>(
    inputs: impl IntoIterator<Item = &'a Input>,
    deferred: bool,
) -> Result<Opened, LoadError> {
    let mut traces = Vec::new();
    for input in inputs {
        traces.push(input.open(deferred)?);
    }
    check_duplicates(&traces)?;
    let mut warnings: Vec<LoadWarning> = traces
        .iter()
        .flat_map(|t| {
            t.warnings.iter().map(|w| LoadWarning {
                path: t.path.clone(),
                warning: w.clone(),
            })
        })
        .collect();
    warnings.extend(set_warnings(&traces));
    traces.sort_by(|a, b| (a.header.rank, &a.path).cmp(&(b.header.rank, &b.path)));
    Ok(Opened { traces, warnings })
}

/// What tells one run from another: its command line and world size.
fn run_of(t: &Trace) -> (&[String], Option<u32>) {
    (&t.header.command_line, t.header.world_size)
}

/// Whether two headers are of one recording (the same file, or a copy of it): same process,
/// host, start and rank. The rank counts because one process writes several ranks when it
/// converts PyTorch files (`poolsight import a.pickle b.pickle`), and two snapshots written in
/// the same instant, of the same length, convert to the same start.
pub fn same_recording(a: &Header, b: &Header) -> bool {
    // An imported trace is also its source file: one process may convert several at once.
    let source = |h: &Header| {
        h.import
            .as_ref()
            .map(|i| (i.path.clone(), i.bytes, i.entries))
    };
    (a.pid, &a.host, a.unix_ns, a.ticks0, a.rank, source(a))
        == (b.pid, &b.host, b.unix_ns, b.ticks0, b.rank, source(b))
}

fn check_duplicates(traces: &[Trace]) -> Result<(), LoadError> {
    for (i, a) in traces.iter().enumerate() {
        for b in &traces[..i] {
            let (ha, hb) = (&a.header, &b.header);
            if same_recording(ha, hb) {
                return Err(LoadError::SameTrace {
                    first: b.path.clone(),
                    second: a.path.clone(),
                });
            }
            if let (Some(ra), Some(rb)) = (ha.rank, hb.rank) {
                if ra == rb && run_of(a) == run_of(b) {
                    return Err(LoadError::SameRank {
                        first: b.path.clone(),
                        second: a.path.clone(),
                        rank: ra,
                    });
                }
            }
        }
    }
    Ok(())
}

fn set_warnings(traces: &[Trace]) -> Vec<LoadWarning> {
    let mut out = Vec::new();
    let Some(first) = traces.first() else {
        return out;
    };
    let warn = |t: &Trace, what: String| LoadWarning {
        path: t.path.clone(),
        warning: Warning {
            offset: 0,
            what,
            torn: false,
        },
    };
    for t in &traces[1..] {
        if run_of(t) != run_of(first) {
            out.push(warn(
                t,
                format!(
                    "merged with {}, but from another run (command line or world size differ)",
                    first.path.display()
                ),
            ));
        }
    }
    {
        if let Some(world) = first.header.world_size {
            // A damaged header can claim billions of ranks: count the missing ones, name a few.
            let mut given: Vec<u32> = traces
                .iter()
                .filter_map(|t| t.header.rank)
                .filter(|&r| r < world)
                .collect();
            given.sort_unstable();
            given.dedup();
            let missing = world as u64 - given.len() as u64;
            let named: Vec<String> = (0..world)
                .filter(|r| given.binary_search(r).is_err())
                .take(MISSING_RANKS_NAMED)
                .map(|r| r.to_string())
                .collect();
            if missing > 0 {
                let more = missing - named.len() as u64;
                let tail = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                out.push(warn(
                    first,
                    format!(
                        "world size {world}, but rank(s) {}{tail} not given: figures cover only the ranks given",
                        named.join(", ")
                    ),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(rank: Option<u32>) -> Header {
        Header {
            format_major: 1,
            format_minor: 5,
            writer: String::new(),
            ticks0: 7,
            mono_ns: 0,
            unix_ns: 1_700_000_000_000_000_000,
            ticks_per_ns: 1.0,
            pid: 42,
            host: "vm".into(),
            command_line: Vec::new(),
            rank,
            world_size: Some(2),
            ring: None,
            chunk_size: 65536,
            cpu_source: poolsight_schema::fb::CpuSource::None,
            devices: Vec::new(),
            packed: false,
            import: None,
        }
    }

    #[test]
    fn one_process_two_ranks_are_two_recordings() {
        assert!(same_recording(&header(Some(0)), &header(Some(0))));
        assert!(!same_recording(&header(Some(0)), &header(Some(1))));
        assert!(same_recording(&header(None), &header(None)));
    }
}
