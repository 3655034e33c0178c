//! AdmissionRequest -> decision -> AdmissionResponse, all pure.
//! `classify` says what a request is, `decide` what to do, `respond` how to say it.

pub mod classify;
pub mod decide;
pub mod respond;

pub use classify::{
    classify, ChurnRequest, Classified, PassReason, GATED_BY_ANNOTATION, GATED_LABEL, GATE_NAME,
    PACED_BY_ANNOTATION, PARTITION_HELD_ANNOTATION, PARTITION_HELD_SINCE_ANNOTATION,
    PARTITION_STEPPED_AT_ANNOTATION, PARTITION_TARGET_ANNOTATION,
};
pub use decide::{
    decide, mark_admission, plan_partition, Decision, Endpoint, PartitionPlan, Verdict,
    ADMITTED_BY_ANNOTATION,
};
pub use respond::{respond, review_json};

#[cfg(test)]
mod tests;
