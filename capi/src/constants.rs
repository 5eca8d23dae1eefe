//! The C constants of the trace format's kinds, made from `poolsight_schema::kinds` (the one
//! list every crate and binding takes them from), never numbered by hand: cbindgen writes them
//! into `include/poolsight.h` after its includes (`tests/header.rs` makes the header with them
//! and checks the committed one), and `ps_scope_enter` reads a value back with the same kinds'
//! `TryFrom`. A kind added to the schema fails to compile here until it has its C name.

use std::fmt::Write as _;

use poolsight_recorder::{FrameKind, Phase, ScopeKind};

/// A scope kind's C name and what it is for.
fn scope(k: ScopeKind) -> (&'static str, &'static str) {
    match k {
        ScopeKind::Function => (
            "PS_SCOPE_FUNCTION",
            "Scope kind: a function (a row of `poolsight functions`).",
        ),
        ScopeKind::Link => (
            "PS_SCOPE_LINK",
            "Scope kind: a link, by convention a layer's class name (`poolsight timers --links`).",
        ),
        ScopeKind::Scope => ("PS_SCOPE_USER", "Scope kind: any other named region."),
    }
}

/// A phase's C name and what it is for.
fn phase(p: Phase) -> (&'static str, &'static str) {
    match p {
        Phase::None => ("PS_PHASE_NONE", "Phase of a scope: none."),
        Phase::Forward => (
            "PS_PHASE_FORWARD",
            "Phase of a function scope: the forward computation.",
        ),
        Phase::Backward => (
            "PS_PHASE_BACKWARD",
            "Phase of a function scope: the backward computation.",
        ),
    }
}

/// Every constant: (C name, value, comment), scope kinds then phases.
pub fn constants() -> Vec<(&'static str, u32, &'static str)> {
    let scopes = ScopeKind::ALL.iter().map(|&k| {
        let (name, doc) = scope(k);
        (name, FrameKind::from(k) as u32, doc)
    });
    let phases = Phase::ALL.iter().map(|&p| {
        let (name, doc) = phase(p);
        (name, p as u32, doc)
    });
    scopes.chain(phases).collect()
}

/// The constants as C `#define`s, each under its comment, for the header.
pub fn c_defines() -> String {
    let mut out = String::new();
    for (name, value, doc) in constants() {
        let _ = write!(out, "\n// {doc}\n#define {name} {value}\n");
    }
    out.truncate(out.trim_end().len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_reads_back_as_its_kind() {
        let c = constants();
        for (name, value, _) in &c {
            let v = u8::try_from(*value).unwrap();
            let ok = if name.starts_with("PS_SCOPE_") {
                FrameKind::try_from(v)
                    .ok()
                    .and_then(|k| ScopeKind::try_from(k).ok())
                    .is_some()
            } else {
                Phase::try_from(v).is_ok()
            };
            assert!(ok, "{name} = {value}");
        }
        assert_eq!(c.len(), ScopeKind::ALL.len() + Phase::ALL.len());
        let defines = c_defines();
        let has = |line: &str| defines.lines().any(|l| l == line);
        assert!(has("#define PS_SCOPE_USER 3"));
        assert!(has("#define PS_PHASE_BACKWARD 2"));
    }
}
