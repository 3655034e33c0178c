//! Builds the AdmissionResponse for a decision: 429 with Retry-After, warnings, patches.

use super::verdict::{Decision, Verdict};
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

/// The AdmissionReview for a response, in the wire format admission.k8s.io/v1
/// documents: `patch` is a `[]byte`, i.e. a base64 string in JSON. kube-rs serialises
/// its `Vec<u8>` as an array of numbers (kube-rs/kube#1781), which kube-apiserver's
/// decoder happens to accept but which is about four times larger and which other
/// readers of AdmissionReviews (audit tooling, test harnesses) read wrongly.
pub fn review_json(response: AdmissionResponse) -> serde_json::Value {
    use base64::Engine as _;
    let patch = response
        .patch
        .as_deref()
        .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes));
    let mut review = match serde_json::to_value(response.into_review()) {
        Ok(review) => review,
        // Serialising plain structs of strings, maps and numbers cannot fail; should it
        // ever, an empty object makes kube-apiserver fail the call by the webhook's
        // failurePolicy instead of the server panicking.
        Err(_) => return serde_json::Value::Object(serde_json::Map::new()),
    };
    if let (Some(patch), Some(wire)) = (patch, review.pointer_mut("/response/patch")) {
        *wire = serde_json::Value::String(patch);
    }
    review
}
