//! Which frames of a PyTorch stack become poolsight frames: the one classification, shared with
//! the analyzer (which shows poolsight's own traces through it), lives in `poolsight-frames`.

pub use poolsight_frames::*;
