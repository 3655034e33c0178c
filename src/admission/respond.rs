//! Builds the AdmissionResponse for a decision: 429 with Retry-After, warnings, patches.

use super::decide::{Decision, Verdict};
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use kube::core::response::StatusDetails;
use kube::core::{DynamicObject, Status};

/// The response for a decision once any hold is over.
pub fn respond(req: &AdmissionRequest<DynamicObject>, decision: &Decision) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(req);
    let message = decision.message.clone().unwrap_or_default();
    match &decision.verdict {
        Verdict::RetryAfter { seconds, .. } => {
            response.allowed = false;
            response.result = too_many_requests(message, *seconds);
        }
        Verdict::Deny { .. } => {
            response.allowed = false;
            response.result = too_many_requests(message, 0);
        }
        Verdict::Warn { .. } => {
            response.warnings = Some(vec![message]);
        }
        Verdict::Gate { patch }
        | Verdict::HoldPartition { patch, .. }
        | Verdict::AdmitMarked { patch } => {
            response.warnings = decision.message.clone().map(|m| vec![m]);
            response = match response.clone().with_patch(patch.clone()) {
                Ok(patched) => patched,
                // A patch that cannot be serialised is admitted unpaced rather than lost.
                Err(_) => response,
            };
        }
        Verdict::Pass(_)
        | Verdict::Exempt(_)
        | Verdict::NoRule
        | Verdict::Admitted
        | Verdict::Hold { .. } => {}
    }
    if let Some(rule) = &decision.rule {
        response
            .audit_annotations
            .insert("rule".to_string(), rule.to_string());
        response
            .audit_annotations
            .insert("action".to_string(), decision.verdict.label().to_string());
    }
    response
}

/// kube-apiserver turns `details.retryAfterSeconds` into a Retry-After header, which
/// client-go honours by sleeping and retrying without an error reaching the controller.
fn too_many_requests(message: String, retry_after_seconds: u32) -> Status {
    Status {
        status: Some(kube::core::response::StatusSummary::Failure),
        code: 429,
        message,
        metadata: None,
        reason: "TooManyRequests".to_string(),
        details: (retry_after_seconds > 0).then(|| StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds,
        }),
    }
}
