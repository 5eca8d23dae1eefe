//! The pictures of a profile: [`flamegraph`]s (inferno SVG and folded stacks), the
//! [`timeline`] of the pool's bytes, and the interactive [`html`] report.

pub mod flamegraph;
pub mod html;
pub mod timeline;
