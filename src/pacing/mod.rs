//! The pacing core: which gates to lift and which partitions to step now, under the
//! rules' windows and readiness caps. Pure: observations and `now` in, a plan out.

pub mod gate;
pub mod network;
pub mod partition;
mod partition_windows;
pub mod schedule;
