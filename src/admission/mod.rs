//! AdmissionRequest -> decision -> AdmissionResponse, all pure.
//! `classify` says what a request is, `decide` what to do, `respond` how to say it.

pub mod classify;
pub mod decide;
pub mod respond;

pub use classify::{classify, ChurnRequest, Classified, PassReason, GATE_NAME};
pub use decide::{decide, plan_partition, Decision, Endpoint, PartitionPlan, Verdict};
pub use respond::respond;

#[cfg(test)]
mod tests;
