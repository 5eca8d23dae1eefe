//! `diff`: compare a base run with a new one, figure by figure, and check CI rules.
//!
//! Every report is flattened into [`Figures`]: one number per stable key, the key being what a
//! user writes in a rule, so that a row of the output can be copied into `--fail-on` as is:
//!
//! | key | section | quantity |
//! |---|---|---|
//! | `peak_used`, `peak_acquired` | headline | bytes |
//! | `allocations`, `device_allocations`, `out_of_memory` | headline | count |
//! | `time` (wall time of the trace) | headline | ns |
//! | `peak.category.NAME`: bytes of a category live at the peak | peak | bytes |
//! | `peak.line.LINE`: bytes live at the peak by innermost user line and operator (`file:line:function > aten::op`; the largest stack behind it in [`Row::stack`]) | peak | bytes |
//! | `function:NAME.used`, `.acquired`, `.self_used`, `.self_acquired` | functions | bytes |
//! | `function:NAME.occurrence` | functions | count |
//! | `function:NAME.time`, `link:NAME.time` | timers | ns |
//! | `link:NAME.occurrence` | timers | count |
//! | `line:STACK.used`, `.acquired` (STACK: `file:line:function` frames joined by `;`) | lines | bytes |
//! | `line:STACK.live_at_peak`: bytes allocated there still live at the peak | lines | bytes |
//! | `epoch:N.gpu_used`, `.gpu_peak`, `.cpu_used`, `.cpu_peak` | epochs | bytes |
//! | `whatif:DEVICE.reserved_peak`, `.allocated_peak`, `.fragmentation`, `.inactive_split`, `.min_capacity` (with `diff --whatif`: the run replayed through PyTorch's allocator, [`crate::tables::whatif_figures`]) | whatif | bytes |
//! | `whatif:DEVICE.failures` | whatif | count |
//!
//! Keys never hold an address or a trace-local id, so two runs of the same program give the
//! same keys. A side may hold several runs (the same job recorded again): each figure is the
//! median over them, which is what makes time rules usable on noisy CI machines (one slow run
//! out of three moves nothing). A key a run lacks counts as 0 in that run's place.
//!
//! Rules: `METRIC > VALUE` or `METRIC >= VALUE`, where METRIC is a key above (`*` matches any
//! run of characters, so `function:*.used` is every function) and VALUE a growth: a percentage
//! (`+5%`), a size (`+64MB`, 1024 steps as every table of poolsight), a duration (`100ms`) or a
//! plain number (bytes, ns or a count, as the metric is). A percentage of a base of 0 is
//! infinite: any growth from nothing crosses a percentage rule, since a CI gate that let a
//! brand-new allocation through would be no gate.
//!
//! What is shown ([`ShowOptions`]) answers why the peak moved: the headline, where the runs
//! part ([`parting`]), the `peak` section, then the others; `lines` (cumulative bytes of every
//! request) and `categories` are shown only when named. Rules see every row.

mod compare;
pub mod parting;
mod render;
mod rules;
#[cfg(test)]
mod tests;

pub use crate::tables::{Figure, Figures, Keys, Quantity, Section};
pub use compare::{compare, Change, Diff, DiffJson, Row, ShowOptions, Shown, Violation, ASKED_FOR};
pub use parting::{Parting, PartingPoint, Timeline};
pub use render::{render_markdown, render_table, write_markdown, write_table};
pub use rules::{parse_rules_file, Rule, RuleError, RuleProblem, RulesFileError, Threshold};
