//! The /validate and /mutate handlers: guards, decoding, the decision, holds, metrics.

use super::pods::Check;
use super::state::AppState;
use crate::admission::{
    classify, decide_classified_unwritten, mark_admission, respond, ChurnRequest, Classified,
    Decision, Endpoint, PassReason, Verdict,
};
use crate::limiter::{Ask, Identity, Millis};
use crate::policy::{Limit, Policy};
use crate::shared::now_millis;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    let body = match read_body(&state, &headers, body).await {
        Ok(body) => body,
        Err(unread) => {
            state
                .metrics
                .server
                .bad_requests
                .with_label_values(&[unread.reason])
                .inc();
            state
                .metrics
                .server
                .http_requests
                .with_label_values(&[endpoint.as_str(), unread.status.as_str()])
                .inc();
            // The rest of the body is not read: the connection cannot carry another request.
            let mut response = error_response(unread.status, unread.message);
            response.headers_mut().insert(
                header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            return response;
        }
    };
    let deadline = state.policy().server_deadline();
    let response =
        within_deadline(&state, deadline, review(&state, endpoint, &headers, &body)).await;
    state
        .metrics
        .server
        .admission_duration
        .with_label_values(&[endpoint.as_str()])
        .observe(started.elapsed().as_secs_f64());
    state
        .metrics
        .server
        .http_requests
        .with_label_values(&[endpoint.as_str(), response.status().as_str()])
        .inc();
    response
}

/// Why a body was not read: the status, the `bad_requests` reason, the sentence.
struct Unread {
    status: StatusCode,
    reason: &'static str,
    message: String,
}

/// The whole body, within the size limit and the body deadline (counted from the head):
/// a client that declares a body and sends it slowly, or not at all, is answered 408
/// at the deadline; one that declares or sends more than the limit, 413 at once.
async fn read_body(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, Unread> {
    let limit = state.max_body_bytes;
    let too_large = || {
        Unread {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        reason: "too-large",
        message: format!(
            "churn-throttler: cannot read the request body (length limit exceeded); the limit is {limit} bytes"
        ),
    }
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let deadline = state.body_read_timeout();
    let collect = async {
        let mut stream = body.into_data_stream();
        let mut bytes: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0) as usize);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| Unread {
                status: StatusCode::BAD_REQUEST,
                reason: "unreadable-body",
                message: format!("churn-throttler: cannot read the request body ({e})"),
            })?;
            if bytes.len() + chunk.len() > limit {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(bytes))
    };
    match tokio::time::timeout(deadline, collect).await {
        Ok(read) => read,
        Err(_) => Err(Unread {
            status: StatusCode::REQUEST_TIMEOUT,
            reason: "body-timeout",
            message: format!(
                "churn-throttler: the request body did not arrive within {}ms",
                deadline.as_millis()
            ),
        }),
    }
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
        Err(_) => refuse(
            state,
            "deadline",
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "churn-throttler: no decision within {}ms; the webhook's failurePolicy applies",
                deadline.as_millis()
            ),
        ),
    }
}

async fn review(
    state: &AppState,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let request = match parse_review(state, headers, body) {
        Ok(request) => request,
        Err(refused) => return *refused,
    };
    // Classified once: the pod check, the decision and a hold's slot all read it.
    let classified = classify(&request);
    let churn = match &classified {
        Classified::Churn(churn) => Some(&**churn),
        Classified::Pass(_) => None,
    };
    // Before the decision, so a forged review never reaches the limiter (see `pods`).
    if let Check::Unverified(why) = state.pods.check(&request, churn) {
        state
            .metrics
            .server
            .unverified_requests
            .with_label_values(&[why.as_str()])
            .inc();
        tracing::debug!(
            uid = %log_safe(&request.uid),
            namespace = %log_safe(request.namespace.as_deref().unwrap_or("")),
            name = %log_safe(&request.name),
            reason = why.as_str(),
            "allowed without a charge: the pod cache has no such pod"
        );
        return Json(AdmissionResponse::from(&request).into_review()).into_response();
    }
    let now = now_millis();
    let policy = state.decision_policy(now);
    let queue = state.queue_cell().get();
    let mut decision = {
        let mut limiter = state.limiter();
        let decision = decide_classified_unwritten(
            &classified,
            endpoint,
            &policy,
            &mut limiter,
            queue.as_deref(),
            now,
        );
        match churn {
            Some(churn) => mark_admission(churn, decision, &policy, now, &state.instance),
            None => decision,
        }
    };
    // Written once the lock is released: no review waits for another's text.
    if let Some(churn) = churn {
        decision.write_message(&policy, churn);
    }
    let rule = decision.rule.as_deref().unwrap_or("none");
    let operation = decision
        .kind
        .map(|k| k.operation())
        .unwrap_or_else(|| operation_of(&request));
    state
        .metrics
        .server
        .decisions
        .with_label_values(&[rule, operation, decision.verdict.label()])
        .inc();
    match &decision.verdict {
        Verdict::Pass(PassReason::Unhandled) => {
            state
                .metrics
                .server
                .unhandled
                .with_label_values(&["kind-or-subresource"])
                .inc();
        }
        Verdict::Gate { .. } => {
            state
                .metrics
                .server
                .gated_pods
                .with_label_values(&[rule])
                .inc();
        }
        Verdict::Hold { until } => {
            let wait = Duration::from_millis(until.saturating_sub(now));
            // The guard keeps the gauge right even if the API server hangs up mid-hold.
            let _held = HeldGuard::new(&state.metrics.server.held_requests);
            // Dropped unfinished (the client went away, the deadline passed, the drain
            // ended): the slot is given back for the next request.
            let mut slot = HeldSlot::new(state, churn, &decision, &policy, *until);
            tokio::time::sleep(wait).await;
            slot.finished();
            state
                .metrics
                .server
                .hold_duration
                .observe(wait.as_secs_f64());
        }
        _ => {}
    }
    if let Some(message) = &decision.message {
        // Request-derived text is escaped: a forged uid or name cannot start a log line.
        tracing::debug!(
            uid = %log_safe(&request.uid),
            rule = %log_safe(rule),
            action = decision.verdict.label(),
            "{}",
            log_safe(message)
        );
    }
    let response = respond(&request, &decision);
    Json(crate::admission::review_json(response)).into_response()
}

/// The request of a well-formed AdmissionReview, or the answer refusing the body (the
/// refusal counted under its `bad_requests` reason).
fn parse_review(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<AdmissionRequest<DynamicObject>, Box<Response>> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    if !media_type.eq_ignore_ascii_case("application/json") {
        return Err(refused(
            state,
            "content-type",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "churn-throttler: expected Content-Type application/json, got {content_type:?}"
            ),
        ));
    }
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(e) => {
            return Err(refused(
                state,
                "malformed",
                StatusCode::BAD_REQUEST,
                format!("churn-throttler: the body is not an AdmissionReview: {e}"),
            ));
        }
    };
    let api_version = review.types.api_version.as_str();
    if !SUPPORTED_API_VERSIONS.contains(&api_version) || review.types.kind != "AdmissionReview" {
        return Err(refused(
            state,
            "api-version",
            StatusCode::BAD_REQUEST,
            format!(
                "churn-throttler: expected an AdmissionReview of apiVersion {}, got kind {:?} of apiVersion {:?}",
                SUPPORTED_API_VERSIONS.join(" or "),
                log_safe(&review.types.kind),
                log_safe(api_version),
            ),
        ));
    }
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(_) => {
            return Err(refused(
                state,
                "no-request",
                StatusCode::BAD_REQUEST,
                "churn-throttler: the AdmissionReview has no request".to_string(),
            ));
        }
    };
    if request.uid.is_empty() {
        return Err(refused(
            state,
            "no-uid",
            StatusCode::BAD_REQUEST,
            "churn-throttler: the AdmissionReview request has no uid".to_string(),
        ));
    }
    Ok(request)
}

/// [`refuse`], boxed for a `Result` (a Response is large).
fn refused(
    state: &AppState,
    reason: &'static str,
    code: StatusCode,
    message: String,
) -> Box<Response> {
    Box::new(refuse(state, reason, code, message))
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

/// Counts a request refused before any decision under its `bad_requests` reason, and
/// answers it with `status` and a sentence.
fn refuse(state: &AppState, reason: &'static str, status: StatusCode, message: String) -> Response {
    state
        .metrics
        .server
        .bad_requests
        .with_label_values(&[reason])
        .inc();
    error_response(status, message)
}

pub fn error_response(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}

/// The AdmissionReview versions the API server sends (v1beta1 until Kubernetes 1.21).
const SUPPORTED_API_VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// `text` with control characters escaped (`\n`, `\u{1b}`, `\0`...), for logs and
/// messages that quote what a client sent.
pub fn log_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\0' => escaped.push_str("\\0"),
            c if c.is_control() => escaped.extend(c.escape_default()),
            c => escaped.push(c),
        }
    }
    std::borrow::Cow::Owned(escaped)
}

/// The charge of a request being held: given back unless the hold finished.
struct HeldSlot<'a> {
    state: &'a AppState,
    charge: Option<HeldCharge>,
}

/// What [`crate::limiter::Limiter::cancel_hold`] needs, owned.
struct HeldCharge {
    rule: Arc<str>,
    limits: Vec<Limit>,
    namespace: String,
    owner: Option<String>,
    identity: Identity,
    cost: u32,
    slot: Millis,
}

impl<'a> HeldSlot<'a> {
    fn new(
        state: &'a AppState,
        churn: Option<&ChurnRequest>,
        decision: &Decision,
        policy: &Policy,
        slot: Millis,
    ) -> HeldSlot<'a> {
        let rule = decision
            .rule
            .as_ref()
            .and_then(|name| policy.rules.iter().find(|r| &r.name == name));
        let charge = match (churn, rule) {
            (Some(churn), Some(rule)) if !churn.dry_run => Some(HeldCharge {
                rule: rule.name.clone(),
                limits: rule.limits.clone(),
                namespace: churn.namespace.clone(),
                owner: churn.controller_uid.clone(),
                identity: churn.identity.clone(),
                cost: churn.cost,
                slot,
            }),
            _ => None,
        };
        HeldSlot { state, charge }
    }

    fn finished(&mut self) {
        self.charge = None;
    }
}

impl Drop for HeldSlot<'_> {
    fn drop(&mut self) {
        let Some(c) = self.charge.take() else {
            return;
        };
        let ask = Ask {
            rule: &c.rule,
            limits: &c.limits,
            namespace: &c.namespace,
            owner: c.owner.as_deref(),
            identity: &c.identity,
            cost: c.cost,
            reserve: false,
            dry_run: false,
            max_reserved_per_namespace: 0,
            align_beyond: None,
        };
        self.state.limiter().cancel_hold(&ask, c.slot);
        self.state
            .metrics
            .server
            .bad_requests
            .with_label_values(&["abandoned-hold"])
            .inc();
        tracing::debug!("a held request ended before its slot was used; the slot is given back");
    }
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

    #[test]
    fn control_characters_from_a_request_are_escaped_for_the_log() {
        let cases = [
            ("plain-uid-1234", "plain-uid-1234"),
            (
                "evil\nlevel=ERROR forged\u{1b}[31m\0end",
                "evil\\nlevel=ERROR forged\\u{1b}[31m\\0end",
            ),
            ("tab\there\r", "tab\\there\\r"),
            ("ünïcode stays", "ünïcode stays"),
        ];
        for (raw, logged) in cases {
            assert_eq!(log_safe(raw), logged, "{raw:?}");
            assert!(!log_safe(raw).chars().any(char::is_control));
        }
    }

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
                .server
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
