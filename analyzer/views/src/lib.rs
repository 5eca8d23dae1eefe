//! poolsight's pictures of a profile: [`flamegraph`]s (inferno SVG and folded stacks), the
//! [`timeline`] of the pool's bytes, and the interactive [`html`] report with its script and
//! style. Each draws from what `poolsight-analyzer` computes (a replayed profile, the bytes
//! live over time, the report tables' HTML tables); only this crate links inferno.

pub mod flamegraph;
pub mod html;
pub mod timeline;
