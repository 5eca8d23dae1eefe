//! The seed tables, each computed from a [`crate::Profile`] and printed as its seed prints it:
//! [`functions`] (Chainer's `CupyMemoryProfileHook`), [`lines`] (CuPy's `LineProfileHook`),
//! [`timers`] (Chainer's link and function `TimerHook`), [`epochs`] (fastai's `PeakMemMetric`),
//! and [`report`], all of them with a headline. [`render`] and [`csv`] hold what the tables
//! share to print.

pub mod csv;
pub mod epochs;
pub mod functions;
pub mod lines;
pub mod render;
pub mod report;
pub mod timers;
