//! AdmissionRequest -> decision -> AdmissionResponse, all pure.
//! `classify` says what a request is, `decide` what to do, `respond` how to say it.

pub mod classify;
pub mod decide;
mod gate;
mod partition;
pub mod respond;
mod verdict;

/// Kept for src/simulate's import path only; the names live in `crate::names`.
pub use crate::names::GATE_NAME;
pub use classify::{classify, max_unavailable, ChurnRequest, Classified, PassReason};
pub use decide::{decide, decide_classified, decide_classified_unwritten};
pub use gate::mark_admission;
pub use partition::{plan_partition, PartitionPlan};
pub use respond::{respond, review_json};
pub use verdict::{Decision, Endpoint, Note, Verdict};

#[cfg(test)]
mod tests;

/// A review's classification, for tests that know it is churn.
#[cfg(test)]
pub(crate) fn churn_of(
    req: &kube::core::admission::AdmissionRequest<kube::core::DynamicObject>,
) -> Box<ChurnRequest> {
    match classify(req) {
        Classified::Churn(churn) => churn,
        Classified::Pass(reason) => panic!("expected churn, classified as {reason:?}"),
    }
}
