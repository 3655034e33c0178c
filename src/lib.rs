//! churn-throttler: an admission webhook that paces pod churn cluster-wide.
//! The decision code (policy, limiter, admission) is pure; server and cli are the shells.

pub mod admission;
pub mod budget;
pub mod cli;
pub mod ctl;
pub mod demo;
pub mod election;
pub mod limiter;
pub mod metrics;
pub mod names;
pub mod objects;
pub mod overrides_watch;
pub mod pacing;
pub mod policy;
pub mod queue;
pub mod releaser;
pub mod sample;
pub mod serve;
pub mod server;
pub mod shared;
pub mod simulate;
