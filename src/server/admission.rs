//! The /validate and /mutate handlers: guards, decoding, the decision, holds, metrics.

use super::state::{now_millis, AppState};
use crate::admission::{decide, mark_admission, respond, Endpoint, PassReason, Verdict};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use kube::core::DynamicObject;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Body = Result<Bytes, BytesRejection>;

pub async fn validate(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(state, Endpoint::Validate, headers, body).await
}

pub async fn mutate(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(state, Endpoint::Mutate, headers, body).await
}

async fn handle(
    state: Arc<AppState>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let status = rejection.status();
            let reason = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "too-large"
            } else {
                "unreadable-body"
            };
            state
                .metrics
                .bad_requests
                .with_label_values(&[reason])
                .inc();
            state
                .metrics
                .http_requests
                .with_label_values(&[endpoint.as_str(), status.as_str()])
                .inc();
            return error_response(
                status,
                format!(
                    "churn-throttler: cannot read the request body ({}); the limit is {} bytes",
                    rejection.body_text(),
                    state.max_body_bytes
                ),
            );
        }
    };
    let deadline = state.policy().server_deadline();
    let response =
        within_deadline(&state, deadline, review(&state, endpoint, &headers, &body)).await;
    state
        .metrics
        .admission_duration
        .with_label_values(&[endpoint.as_str()])
        .observe(started.elapsed().as_secs_f64());
    state
        .metrics
        .http_requests
        .with_label_values(&[endpoint.as_str(), response.status().as_str()])
        .inc();
    response
}

/// The server-side deadline (a second inside the webhook's timeoutSeconds): a decision
/// that takes longer is answered 503, so the API server applies the failurePolicy now
/// rather than after its own timeout.
async fn within_deadline(
    state: &AppState,
    deadline: Duration,
    decision: impl std::future::Future<Output = Response>,
) -> Response {
    match tokio::time::timeout(deadline, decision).await {
        Ok(response) => response,
        Err(_) => {
            state
                .metrics
                .bad_requests
                .with_label_values(&["deadline"])
                .inc();
            error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "churn-throttler: no decision within {}ms; the webhook's failurePolicy applies",
                    deadline.as_millis()
                ),
            )
        }
    }
}

async fn review(
    state: &AppState,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    if !media_type.eq_ignore_ascii_case("application/json") {
        state
            .metrics
            .bad_requests
            .with_label_values(&["content-type"])
            .inc();
        return error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "churn-throttler: expected Content-Type application/json, got {content_type:?}"
            ),
        );
    }
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(e) => {
            state
                .metrics
                .bad_requests
                .with_label_values(&["malformed"])
                .inc();
            return error_response(
                StatusCode::BAD_REQUEST,
                format!("churn-throttler: the body is not an AdmissionReview: {e}"),
            );
        }
    };
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(_) => {
            state
                .metrics
                .bad_requests
                .with_label_values(&["no-request"])
                .inc();
            return error_response(
                StatusCode::BAD_REQUEST,
                "churn-throttler: the AdmissionReview has no request".to_string(),
            );
        }
    };
    if request.uid.is_empty() {
        state
            .metrics
            .bad_requests
            .with_label_values(&["no-uid"])
            .inc();
        return error_response(
            StatusCode::BAD_REQUEST,
            "churn-throttler: the AdmissionReview request has no uid".to_string(),
        );
    }

    let policy = state.decision_policy();
    let now = now_millis();
    let decision = {
        let mut limiter = state.limiter();
        let decision = decide(&request, endpoint, &policy, &mut limiter, now);
        mark_admission(&request, decision, &policy, now, &state.instance)
    };
    let rule = decision.rule.as_deref().unwrap_or("none");
    let operation = decision
        .kind
        .map(|k| k.operation())
        .unwrap_or_else(|| operation_of(&request));
    state
        .metrics
        .decisions
        .with_label_values(&[rule, operation, decision.verdict.label()])
        .inc();
    match &decision.verdict {
        Verdict::Pass(PassReason::Unhandled) => {
            state
                .metrics
                .unhandled
                .with_label_values(&["kind-or-subresource"])
                .inc();
        }
        Verdict::Gate { .. } => {
            state.metrics.gated_pods.with_label_values(&[rule]).inc();
        }
        Verdict::Hold { until } => {
            let wait = Duration::from_millis(until.saturating_sub(now));
            // The guard keeps the gauge right even if the API server hangs up mid-hold.
            let _held = HeldGuard::new(&state.metrics.held_requests);
            tokio::time::sleep(wait).await;
            state.metrics.hold_duration.observe(wait.as_secs_f64());
        }
        _ => {}
    }
    if let Some(message) = &decision.message {
        tracing::debug!(uid = %request.uid, rule, action = decision.verdict.label(), "{message}");
    }
    let response = respond(&request, &decision);
    Json(crate::admission::review_json(response)).into_response()
}

fn operation_of(request: &AdmissionRequest<DynamicObject>) -> &'static str {
    use kube::core::admission::Operation;
    match request.operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

pub fn error_response(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}

struct HeldGuard<'a>(&'a prometheus::IntGauge);

impl<'a> HeldGuard<'a> {
    fn new(gauge: &'a prometheus::IntGauge) -> Self {
        gauge.inc();
        HeldGuard(gauge)
    }
}

impl Drop for HeldGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::policy::Policy;

    #[tokio::test(start_paused = true)]
    async fn a_decision_past_the_deadline_gets_503_and_is_counted() {
        let state = AppState::new(Policy::builtin(), Arc::new(Metrics::new()), 1024);
        let deadline = state.policy().server_deadline();
        assert_eq!(deadline, Duration::from_secs(9), "timeoutSeconds 10 - 1 s");
        let started = tokio::time::Instant::now();
        let slow = async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            (StatusCode::OK, "late").into_response()
        };
        let response = within_deadline(&state, deadline, slow).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            started.elapsed(),
            deadline,
            "answered at the deadline, not later"
        );
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("no decision within 9000ms") && text.contains("failurePolicy"),
            "{text}"
        );
        assert_eq!(
            state
                .metrics
                .bad_requests
                .with_label_values(&["deadline"])
                .get(),
            1
        );
        // A decision inside the deadline passes through untouched.
        let quick = async { (StatusCode::OK, "on time").into_response() };
        let response = within_deadline(&state, deadline, quick).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
}
