//! The real router over real HTTPS: fixtures in, AdmissionReviews out, plus the guards,
//! reloads, probes and metrics. Servers listen on 127.0.0.1 with port 0.

use churn_throttler::serve::{start, Config, Running};
use churn_throttler::server::certgen::{self, CertAuthority};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

const POLICY: &str = r#"
timeoutSeconds: 10
rules:
  - name: sts-rollouts
    match: { resources: [statefulsets], operations: [UPDATE] }
    limit: { events: 2, window: 10s }
    action: partition
  - name: creates
    match: { resources: [pods], operations: [CREATE], controllerKinds: [ReplicaSet] }
    limit: { events: 1, window: 60s }
    action: gate
  - name: sts-creates
    match: { resources: [pods], operations: [CREATE], controllerKinds: [StatefulSet] }
    limit: { events: 1, window: 60s }
    action: warn
  - name: deletes
    match: { resources: [pods], operations: [DELETE] }
    limit: { events: 1, window: 2s }
    action: hold
    maxHold: 3s
  - name: evictions
    match: { resources: [pods/eviction], operations: [CREATE] }
    limit: { events: 1, window: 60s }
    action: retry-after
  - name: partition-steps
    match: { resources: [statefulsets], operations: [UPDATE] }
    limit: { events: 1, window: 60s }
    action: deny
exempt:
  users: [system:serviceaccount:kube-system:namespace-controller]
"#;

struct Harness {
    dir: tempfile::TempDir,
    ca: CertAuthority,
    running: Option<Running>,
    client: reqwest::Client,
    base: String,
    metrics: String,
}

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn write_pair(dir: &Path, ca: &CertAuthority, until: time::Duration) -> (PathBuf, PathBuf) {
    let pair = certgen::issue_serving(
        ca,
        &["localhost", "127.0.0.1"],
        time::Duration::hours(-2),
        until,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    std::fs::write(&cert, pair.cert_pem).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&key, pair.key_pem).unwrap_or_else(|e| panic!("{e}"));
    (cert, key)
}

fn args(dir: &Path) -> Config {
    Config {
        policy_file: Some(dir.join("policy.yaml")),
        tls_cert: Some(dir.join("tls.crt")),
        tls_key: Some(dir.join("tls.key")),
        dev_dir: dir.join("dev"),
        reload_interval: Duration::from_millis(50),
        shutdown_delay: Duration::from_millis(300),
        drain_timeout: Duration::from_secs(5),
        max_body_bytes: 256 * 1024,
        ..Config::loopback()
    }
}

fn client_for(ca: &CertAuthority) -> reqwest::Client {
    let root =
        reqwest::Certificate::from_pem(ca.cert_pem.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(root)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

impl Harness {
    async fn start() -> Harness {
        Self::start_with(|_| {}).await
    }

    async fn start_with(adjust: impl FnOnce(&mut Config)) -> Harness {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ca = certgen::new_ca("test CA").unwrap_or_else(|e| panic!("{e}"));
        write_pair(dir.path(), &ca, time::Duration::days(1));
        std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap_or_else(|e| panic!("{e}"));
        let mut a = args(dir.path());
        adjust(&mut a);
        let running = start(a).await.unwrap_or_else(|e| panic!("{e:#}"));
        let base = format!("https://localhost:{}", running.tls_addr.port());
        let metrics = format!("http://{}", running.metrics_addr);
        Harness {
            client: client_for(&ca),
            dir,
            ca,
            running: Some(running),
            base,
            metrics,
        }
    }

    async fn post(&self, path: &str, content_type: &str, body: String) -> (u16, String) {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .header("Content-Type", content_type)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    async fn review(&self, path: &str, fixture_name: &str) -> Value {
        let (status, body) = self
            .post(path, "application/json", fixture(fixture_name))
            .await;
        assert_eq!(status, 200, "{fixture_name}: {body}");
        let review: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        review["response"].clone()
    }

    async fn metrics_text(&self) -> String {
        reqwest::get(format!("{}/metrics", self.metrics))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .text()
            .await
            .unwrap_or_default()
    }

    async fn metric(&self, series: &str) -> f64 {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|l| {
                l.strip_prefix(series)
                    .and_then(|rest| rest.trim().parse().ok())
            })
            .unwrap_or(0.0)
    }

    async fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown().await;
        }
    }
}

fn uid_of(fixture_name: &str) -> String {
    let review: Value = serde_json::from_str(&fixture(fixture_name)).unwrap_or(Value::Null);
    review["request"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// admission.k8s.io/v1's `patch` is a `[]byte`: a base64 string in JSON, decoding to a
/// JSON patch (an array of operations), not an array of numbers.
fn assert_patch_is_base64_json_patch(name: &str, patch: &Value) {
    use base64::Engine as _;
    let text = patch
        .as_str()
        .unwrap_or_else(|| panic!("{name}: patch is not a JSON string: {patch}"));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap_or_else(|e| panic!("{name}: patch is not base64 ({e}): {text}"));
    let ops: Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{name}: patch does not decode to JSON ({e})"));
    let ops = ops
        .as_array()
        .unwrap_or_else(|| panic!("{name}: patch is not a JSON array: {ops}"));
    assert!(!ops.is_empty(), "{name}: empty patch");
    for op in ops {
        assert!(
            op["op"].is_string() && op["path"].is_string(),
            "{name}: not a JSON patch operation: {op}"
        );
    }
}

#[tokio::test]
async fn every_fixture_gets_an_answer_with_its_uid() {
    let mut h = Harness::start().await;
    // (fixture, endpoint, allowed, has patch). A pod a gate rule admits at once is
    // marked as released (for the releaser's seeding); the next one is gated.
    let cases: &[(&str, &str, bool, bool)] = &[
        ("pod-create-replicaset", "/mutate", true, true),
        ("pod-create-replicaset", "/mutate", true, true),
        ("pod-create-bound", "/mutate", true, true),
        ("pod-create-dry-run", "/mutate", true, true),
        ("pod-create-statefulset", "/validate", true, false),
        ("pod-delete-terminating", "/validate", true, false),
        ("pod-delete-namespace-teardown", "/validate", true, false),
        ("pod-eviction", "/validate", true, false),
        ("pod-eviction", "/validate", false, false),
        ("statefulset-template-change", "/mutate", true, true),
        ("statefulset-reapply-unchanged", "/mutate", true, false),
        ("statefulset-partition-lower", "/validate", true, false),
        ("statefulset-partition-lower", "/validate", false, false),
        ("configmap-create", "/validate", true, false),
        ("pod-status-update", "/validate", true, false),
    ];
    for (name, path, allowed, patched) in cases {
        let response = h.review(path, name).await;
        assert_eq!(response["uid"], json!(uid_of(name)), "{name}");
        assert_eq!(
            response["allowed"],
            json!(allowed),
            "{name} {path}: {response}"
        );
        assert_eq!(
            response.get("patch").is_some(),
            *patched,
            "{name} {path}: {response}"
        );
        if *patched {
            assert_eq!(response["patchType"], json!("JSONPatch"), "{name}");
            assert_patch_is_base64_json_patch(name, &response["patch"]);
        }
    }
    let unhandled = h
        .metric("churn_throttler_unhandled_requests_total{reason=\"kind-or-subresource\"}")
        .await;
    assert_eq!(
        unhandled, 2.0,
        "configmap and pods/status are counted as unhandled"
    );
    let gated = h
        .metric("churn_throttler_gated_pods_total{rule=\"creates\"}")
        .await;
    assert_eq!(
        gated, 2.0,
        "the second ReplicaSet pod and the dry run were gated"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_second_eviction_gets_429_with_retry_after() {
    let mut h = Harness::start().await;
    let mut other: Value = serde_json::from_str(&fixture("pod-eviction")).unwrap_or(Value::Null);
    other["request"]["name"] = json!("web-5d9c7b8f6d-other");
    other["request"]["uid"] = json!("11111111-2222-3333-4444-555555555555");
    assert_eq!(
        h.review("/validate", "pod-eviction").await["allowed"],
        json!(true)
    );
    let (status, body) = h
        .post("/validate", "application/json", other.to_string())
        .await;
    assert_eq!(status, 200);
    let review: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let status_obj = &review["response"]["status"];
    assert_eq!(review["response"]["allowed"], json!(false));
    assert_eq!(status_obj["code"], json!(429));
    assert_eq!(status_obj["reason"], json!("TooManyRequests"));
    let seconds = status_obj["details"]["retryAfterSeconds"]
        .as_u64()
        .unwrap_or(0);
    assert!((59..=60).contains(&seconds), "retryAfterSeconds {seconds}");
    let message = status_obj["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("churn-throttler: rule \"evictions\" allows 1 per 1m (global)"),
        "{message}"
    );
    assert!(
        message.contains(&format!("retry after {seconds}s")),
        "{message}"
    );
    h.stop().await;
}

#[tokio::test]
async fn deny_and_warn_and_hold_end_to_end() {
    let mut h = Harness::start().await;
    // deny: a second partition decrease inside the minute, with no retry hint.
    let mut lower: Value =
        serde_json::from_str(&fixture("statefulset-partition-lower")).unwrap_or(Value::Null);
    assert_eq!(
        h.review("/validate", "statefulset-partition-lower").await["allowed"],
        json!(true)
    );
    lower["request"]["object"]["metadata"]["uid"] = json!("another-statefulset");
    let (_, body) = h
        .post("/validate", "application/json", lower.to_string())
        .await;
    let denied: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(denied["response"]["allowed"], json!(false));
    assert_eq!(denied["response"]["status"]["code"], json!(429));
    assert!(
        denied["response"]["status"].get("details").is_none(),
        "deny has no retryAfterSeconds: {denied}"
    );

    // warn: allowed with a warning once over the limit.
    let mut sts_pod: Value =
        serde_json::from_str(&fixture("pod-create-statefulset")).unwrap_or(Value::Null);
    sts_pod["request"]["object"]["metadata"]["ownerReferences"][0]["kind"] = json!("StatefulSet");
    assert!(h
        .review("/validate", "pod-create-statefulset")
        .await
        .get("warnings")
        .is_none());
    sts_pod["request"]["object"]["metadata"]["name"] = json!("db-1");
    let (_, body) = h
        .post("/validate", "application/json", sts_pod.to_string())
        .await;
    let warned: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(warned["response"]["allowed"], json!(true));
    let warning = warned["response"]["warnings"][0]
        .as_str()
        .unwrap_or_default();
    assert!(
        warning.contains("warn only") && warning.contains("sts-creates"),
        "{warning}"
    );

    // hold: two different deletes in a 2 s window of 1: the second is held, then allowed.
    let mut second: Value =
        serde_json::from_str(&fixture("pod-delete-running")).unwrap_or(Value::Null);
    second["request"]["name"] = json!("another-pod");
    assert_eq!(
        h.review("/validate", "pod-delete-running").await["allowed"],
        json!(true)
    );
    let (_, body) = h
        .post("/validate", "application/json", second.to_string())
        .await;
    let held: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(held["response"]["allowed"], json!(true), "{held}");
    assert_eq!(
        h.metric("churn_throttler_hold_duration_seconds_count")
            .await,
        1.0
    );
    assert_eq!(
        h.metric("churn_throttler_decisions_total{action=\"hold\",operation=\"DELETE\",rule=\"deletes\"}").await,
        1.0
    );
    assert_eq!(h.metric("churn_throttler_held_requests").await, 0.0);
    h.stop().await;
}

#[tokio::test]
async fn bad_requests_get_clear_http_errors_and_the_server_keeps_serving() {
    let mut h = Harness::start().await;
    let (status, body) = h
        .post("/validate", "application/json", fixture("malformed"))
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("not an AdmissionReview"), "{body}");
    let (status, body) = h
        .post("/validate", "text/plain", fixture("pod-eviction"))
        .await;
    assert_eq!(status, 415);
    assert!(body.contains("application/json"), "{body}");
    let (status, body) = h
        .post(
            "/validate",
            "application/json",
            fixture("review-without-request"),
        )
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("no request"), "{body}");
    let (status, body) = h
        .post(
            "/validate",
            "application/json",
            fixture("review-without-uid"),
        )
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("uid"), "{body}");
    let huge = format!("{{\"padding\":\"{}\"}}", "x".repeat(300 * 1024));
    let (status, body) = h.post("/mutate", "application/json", huge).await;
    assert_eq!(status, 413);
    assert!(body.contains("262144 bytes"), "{body}");
    let (status, _) = h.post("/nope", "application/json", "{}".into()).await;
    assert_eq!(status, 404);
    // Nothing of that disturbed the server.
    assert_eq!(
        h.review("/validate", "pod-eviction").await["allowed"],
        json!(true)
    );
    let text = h.metrics_text().await;
    // A review without a uid fails to decode, so it counts as malformed too.
    for (reason, count) in [
        ("malformed", 2),
        ("content-type", 1),
        ("no-request", 1),
        ("too-large", 1),
    ] {
        let series = format!("churn_throttler_bad_requests_total{{reason=\"{reason}\"}} {count}");
        assert!(text.contains(&series), "{series} missing");
    }
    assert!(
        text.contains("churn_throttler_http_requests_total{code=\"400\",endpoint=\"validate\"} 3")
    );
    h.stop().await;
}

#[tokio::test]
async fn probes_metrics_and_not_ready_before_drain() {
    let mut h = Harness::start().await;
    let ready = reqwest::get(format!("{}/readyz", h.metrics))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ready.status().as_u16(), 200);
    let health = reqwest::get(format!("{}/healthz", h.metrics))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(health.status().as_u16(), 200);
    h.review("/validate", "pod-eviction").await;
    let text = h.metrics_text().await;
    for name in [
        "churn_throttler_decisions_total",
        "churn_throttler_admission_duration_seconds_bucket",
        "churn_throttler_window_limit",
        "churn_throttler_window_usage",
        "churn_throttler_held_requests",
        "churn_throttler_reservations_open",
        "churn_throttler_ready 1",
    ] {
        assert!(text.contains(name), "{name} missing");
    }
    // Shutdown: not ready first while still answering, then gone.
    let running = h.running.take().unwrap_or_else(|| panic!("running"));
    let metrics = h.metrics.clone();
    let stopper = tokio::spawn(running.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let during = reqwest::get(format!("{metrics}/readyz"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        during.status().as_u16(),
        503,
        "not ready during the shutdown delay"
    );
    assert_eq!(
        h.review("/validate", "pod-create-statefulset").await["allowed"],
        json!(true),
        "still answering"
    );
    stopper.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        reqwest::get(format!("{metrics}/healthz")).await.is_err(),
        "stopped"
    );
}

#[tokio::test]
async fn certificate_rotates_twice_and_a_bad_pair_keeps_the_last_good_one() {
    let mut h = Harness::start().await;
    assert_eq!(
        h.review("/validate", "pod-create-statefulset").await["allowed"],
        json!(true)
    );
    for round in 1..=2 {
        let ca = certgen::new_ca(&format!("rotated CA {round}")).unwrap_or_else(|e| panic!("{e}"));
        write_pair(h.dir.path(), &ca, time::Duration::days(1));
        let client = client_for(&ca);
        let mut served = false;
        for _ in 0..100 {
            let attempt = client
                .post(format!("{}/validate", h.base))
                .header("Content-Type", "application/json")
                .body(fixture("pod-create-statefulset"))
                .send()
                .await;
            if attempt.is_ok() {
                served = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            served,
            "round {round}: the new certificate was never served"
        );
        h.ca = ca;
        h.client = client_for(&h.ca);
    }
    assert_eq!(
        h.metric("churn_throttler_reloads_total{kind=\"certificate\",result=\"success\"}")
            .await,
        2.0
    );

    // A key that does not match the certificate: refused, the last good pair stays.
    let other = certgen::issue_serving(
        &h.ca,
        &["localhost"],
        time::Duration::hours(-1),
        time::Duration::days(1),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(h.dir.path().join("tls.key"), other.key_pem).unwrap_or_else(|e| panic!("{e}"));
    let mut counted = false;
    for _ in 0..100 {
        if h.metric("churn_throttler_reloads_total{kind=\"certificate\",result=\"error\"}")
            .await
            >= 1.0
        {
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(counted, "the mismatched pair was not reported");
    assert_eq!(
        h.review("/validate", "pod-create-statefulset").await["allowed"],
        json!(true)
    );
    h.stop().await;
}

#[tokio::test]
async fn policy_reload_applies_good_files_and_keeps_the_last_good_one() {
    let mut h = Harness::start().await;
    let path = h.dir.path().join("policy.yaml");
    std::fs::write(&path, "rules: [\n").unwrap_or_else(|e| panic!("{e}"));
    let mut errors = 0.0;
    for _ in 0..100 {
        errors = h
            .metric("churn_throttler_reloads_total{kind=\"policy\",result=\"error\"}")
            .await;
        if errors >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(errors, 1.0);
    assert_eq!(
        h.metric("churn_throttler_policy_rules").await,
        6.0,
        "the last good policy stays"
    );
    // A good file with one rule takes effect.
    let one = "rules:\n  - name: only\n    match: { resources: [pods/eviction], operations: [CREATE] }\n    limit: { events: 5, window: 1s }\n    action: deny\n";
    std::fs::write(&path, one).unwrap_or_else(|e| panic!("{e}"));
    let mut rules = 0.0;
    for _ in 0..100 {
        rules = h.metric("churn_throttler_policy_rules").await;
        if rules == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rules, 1.0);
    assert_eq!(
        h.metric("churn_throttler_window_limit{rule=\"only\"}")
            .await,
        5.0
    );
    // 5 per 1 s with the default burst: (1 s + 50 ms margin) / 5.
    assert_eq!(
        h.metric("churn_throttler_rule_spacing_seconds{rule=\"only\"}")
            .await,
        0.21
    );
    h.stop().await;
}

#[tokio::test]
async fn start_refuses_missing_expired_and_mismatched_certificates() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap_or_else(|e| panic!("{e}"));
    let ca = certgen::new_ca("ca").unwrap_or_else(|e| panic!("{e}"));

    let missing = start(args(dir.path()))
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        missing.contains("cannot read") && missing.contains("tls.crt"),
        "{missing}"
    );

    write_pair(dir.path(), &ca, time::Duration::hours(-1));
    let expired = start(args(dir.path()))
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(expired.contains("expired"), "{expired}");

    write_pair(dir.path(), &ca, time::Duration::days(1));
    let other = certgen::issue_serving(
        &ca,
        &["x"],
        time::Duration::hours(-1),
        time::Duration::days(1),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("tls.key"), other.key_pem).unwrap_or_else(|e| panic!("{e}"));
    let mismatched = start(args(dir.path()))
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(mismatched.contains("does not match"), "{mismatched}");

    std::fs::write(dir.path().join("policy.yaml"), "rules: 7\n").unwrap_or_else(|e| panic!("{e}"));
    let policy = start(args(dir.path()))
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(policy.contains("policy.yaml:1"), "{policy}");
}

#[tokio::test]
async fn client_certificates_are_required_when_a_client_ca_is_set() {
    let client_ca = certgen::new_ca("apiserver client CA").unwrap_or_else(|e| panic!("{e}"));
    let ca_file = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(ca_file.path(), &client_ca.cert_pem).unwrap_or_else(|e| panic!("{e}"));
    let ca_path = ca_file.path().to_path_buf();
    let mut h = Harness::start_with(|a| a.client_ca = Some(ca_path)).await;
    let anonymous = h
        .client
        .post(format!("{}/validate", h.base))
        .header("Content-Type", "application/json")
        .body(fixture("pod-eviction"))
        .send()
        .await;
    assert!(
        anonymous.is_err(),
        "a client without a certificate must be refused"
    );

    let pair =
        certgen::issue_client(&client_ca, "kube-apiserver").unwrap_or_else(|e| panic!("{e}"));
    let identity =
        reqwest::Identity::from_pem(format!("{}{}", pair.cert_pem, pair.key_pem).as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
    let root =
        reqwest::Certificate::from_pem(h.ca.cert_pem.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(root)
        .identity(identity)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let response = client
        .post(format!("{}/validate", h.base))
        .header("Content-Type", "application/json")
        .body(fixture("pod-eviction"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("with a client certificate: {e}"));
    assert_eq!(response.status().as_u16(), 200);
    h.stop().await;
}

/// A fixture with `edit` applied to its JSON.
fn edited(name: &str, edit: impl FnOnce(&mut Value)) -> String {
    let mut review: Value = serde_json::from_str(&fixture(name)).unwrap_or(Value::Null);
    edit(&mut review);
    review.to_string()
}

async fn answer(h: &Harness, path: &str, body: String) -> Value {
    let (status, text) = h.post(path, "application/json", body).await;
    assert_eq!(status, 200, "{text}");
    let review: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    review["response"].clone()
}

async fn wait_metric(h: &Harness, series: &str, want: f64) -> f64 {
    let mut got = 0.0;
    for _ in 0..100 {
        got = h.metric(series).await;
        if got == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    got
}

/// Returns once a limiter sweep has run wholly after the call: the count read first may
/// include none of a sweep already running, so the second one finished after it is the
/// first to have started after the call (sweeps run one after another, each counted when
/// its gauges are published).
async fn sweep_after(h: &Harness) {
    let series = "churn_throttler_sweeps_total";
    let seen = h.metric(series).await;
    // The server sweeps every second; 20 s is far beyond two of them on a loaded machine.
    for _ in 0..400 {
        if h.metric(series).await >= seen + 2.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no sweep after {seen} finished twice in 20 s");
}

#[tokio::test]
async fn objects_of_unexpected_versions_are_paced_by_group_and_resource() {
    let mut h = Harness::start().await;
    // A pods DELETE whose kind and resource say v2: still a pod deletion, allowed and
    // charged to the deletes rule (1 per 2 s, hold 3 s).
    let v2 = edited("pod-delete-running", |r| {
        r["request"]["kind"]["version"] = json!("v2");
        r["request"]["resource"]["version"] = json!("v2");
        r["request"]["requestKind"] = json!({"group": "", "version": "v2", "kind": "Pod"});
        r["request"]["oldObject"]["apiVersion"] = json!("v2");
    });
    let response = answer(&h, "/validate", v2).await;
    assert_eq!(response["allowed"], json!(true), "{response}");
    assert_eq!(response["uid"], json!(uid_of("pod-delete-running")));
    assert_eq!(
        h.metric("churn_throttler_decisions_total{action=\"allow\",operation=\"DELETE\",rule=\"deletes\"}")
            .await,
        1.0,
        "the v2 pod deletion was counted"
    );
    // An apps/v1beta1 StatefulSet lowering its partition: charged to partition-steps
    // (1 per minute, deny); the second, of another StatefulSet, is refused by the same limit.
    let v1beta1 = |uid: &str| {
        let uid = uid.to_string();
        edited("statefulset-partition-lower", move |r| {
            for key in ["kind", "requestKind"] {
                r["request"][key] =
                    json!({"group": "apps", "version": "v1beta1", "kind": "StatefulSet"});
            }
            r["request"]["resource"] =
                json!({"group": "apps", "version": "v1beta1", "resource": "statefulsets"});
            for object in ["object", "oldObject"] {
                r["request"][object]["apiVersion"] = json!("apps/v1beta1");
                r["request"][object]["metadata"]["uid"] = json!(uid);
            }
        })
    };
    let first = answer(&h, "/validate", v1beta1("sts-one")).await;
    assert_eq!(first["allowed"], json!(true), "{first}");
    let second = answer(&h, "/validate", v1beta1("sts-two")).await;
    assert_eq!(second["allowed"], json!(false), "{second}");
    assert_eq!(second["status"]["code"], json!(429));
    assert_eq!(
        h.metric("churn_throttler_decisions_total{action=\"allow\",operation=\"UPDATE\",rule=\"partition-steps\"}")
            .await,
        1.0
    );
    assert_eq!(
        h.metric("churn_throttler_decisions_total{action=\"deny\",operation=\"UPDATE\",rule=\"partition-steps\"}")
            .await,
        1.0
    );
    // "pods" of another API group and a kind nobody paces: allowed, counted as unhandled.
    let foreign = edited("pod-delete-running", |r| {
        r["request"]["kind"] = json!({"group": "example.com", "version": "v1", "kind": "Pod"});
        r["request"]["resource"] =
            json!({"group": "example.com", "version": "v1", "resource": "pods"});
    });
    assert_eq!(
        answer(&h, "/validate", foreign).await["allowed"],
        json!(true)
    );
    let cronjob = edited("configmap-create", |r| {
        r["request"]["kind"] = json!({"group": "batch", "version": "v1", "kind": "CronJob"});
        r["request"]["resource"] =
            json!({"group": "batch", "version": "v1", "resource": "cronjobs"});
    });
    assert_eq!(answer(&h, "/mutate", cronjob).await["allowed"], json!(true));
    assert_eq!(
        h.metric("churn_throttler_unhandled_requests_total{reason=\"kind-or-subresource\"}")
            .await,
        2.0
    );
    h.stop().await;
}

#[tokio::test]
async fn a_panic_while_the_limiter_was_held_does_not_stop_decisions() {
    let mut h = Harness::start().await;
    let state = h
        .running
        .as_ref()
        .map(|r| r.state.clone())
        .unwrap_or_else(|| panic!("running"));
    let poisoned = std::thread::spawn(move || {
        let _limiter = state.limiter();
        panic!("a bug while deciding");
    })
    .join();
    assert!(poisoned.is_err(), "the thread panicked holding the lock");
    assert_eq!(
        h.review("/validate", "pod-eviction").await["allowed"],
        json!(true)
    );
    assert_eq!(
        h.review("/validate", "pod-create-statefulset").await["allowed"],
        json!(true),
        "and the next"
    );
    h.stop().await;
}

#[tokio::test]
async fn admissions_and_reservations_survive_a_bad_policy_reload() {
    let mut h = Harness::start().await;
    let eviction = |name: &str| {
        let name = name.to_string();
        edited("pod-eviction", move |r| {
            r["request"]["name"] = json!(name);
            r["request"]["uid"] = json!(format!("uid-{name}"));
        })
    };
    let retry_after = |response: &Value| {
        response["status"]["details"]["retryAfterSeconds"]
            .as_u64()
            .unwrap_or(0)
    };
    // evictions: 1 per minute, retry-after. A is admitted, B gets a reserved slot.
    assert_eq!(
        answer(&h, "/validate", eviction("a")).await["allowed"],
        json!(true)
    );
    let b = answer(&h, "/validate", eviction("b")).await;
    assert_eq!(b["allowed"], json!(false), "{b}");
    let b_wait = retry_after(&b);
    assert!((58..=60).contains(&b_wait), "{b}");
    assert_eq!(
        wait_metric(&h, "churn_throttler_reservations_open", 1.0).await,
        1.0
    );

    // A broken policy file: refused, and nothing of the limiter is lost.
    std::fs::write(h.dir.path().join("policy.yaml"), "rules:\n  - name: [\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        wait_metric(
            &h,
            "churn_throttler_reloads_total{kind=\"policy\",result=\"error\"}",
            1.0
        )
        .await,
        1.0
    );
    let c = answer(&h, "/validate", eviction("c")).await;
    assert_eq!(
        c["allowed"],
        json!(false),
        "A's admission still fills the window: {c}"
    );
    let b_again = answer(&h, "/validate", eviction("b")).await;
    assert_eq!(b_again["allowed"], json!(false));
    let b_wait_again = retry_after(&b_again);
    assert!(
        b_wait_again <= b_wait && b_wait_again + 10 >= b_wait,
        "B keeps its slot: {b_wait} s, then {b_wait_again} s"
    );
    // C is refused without a slot: namespace shop already holds its fair share of future
    // slots (maxReservedPerNamespace defaults to events, 1). B's retry takes no second one:
    // the gauge a sweep after both requests published says so.
    sweep_after(&h).await;
    assert_eq!(
        h.metric("churn_throttler_reservations_open").await,
        1.0,
        "B's slot, and only B's"
    );

    // A good file that keeps the rule: the same state carries over.
    let more = format!("{POLICY}\n# edited\n");
    std::fs::write(h.dir.path().join("policy.yaml"), more).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        wait_metric(
            &h,
            "churn_throttler_reloads_total{kind=\"policy\",result=\"success\"}",
            1.0
        )
        .await,
        1.0
    );
    let b_last = answer(&h, "/validate", eviction("b")).await;
    assert_eq!(b_last["allowed"], json!(false));
    assert!(retry_after(&b_last) <= b_wait_again, "{b_last}");
    sweep_after(&h).await;
    assert_eq!(h.metric("churn_throttler_reservations_open").await, 1.0);
    h.stop().await;
}

#[tokio::test]
async fn reviews_of_other_versions_than_v1_and_v1beta1_get_400() {
    let mut h = Harness::start().await;
    for version in ["admission.k8s.io/v2", "foo/v9", ""] {
        let body = edited("pod-eviction", |r| r["apiVersion"] = json!(version));
        let (status, text) = h.post("/validate", "application/json", body).await;
        assert_eq!(status, 400, "{version}: {text}");
        assert!(
            text.contains("expected an AdmissionReview of apiVersion admission.k8s.io/v1"),
            "{text}"
        );
    }
    let body = edited("pod-eviction", |r| {
        r["apiVersion"] = json!("admission.k8s.io/v1beta1")
    });
    assert_eq!(answer(&h, "/validate", body).await["allowed"], json!(true));
    assert_eq!(
        h.metric("churn_throttler_bad_requests_total{reason=\"api-version\"}")
            .await,
        3.0
    );
    h.stop().await;
}

#[tokio::test]
async fn a_held_request_whose_client_goes_away_gives_its_slot_to_the_next() {
    let mut h = Harness::start().await;
    let delete = |name: &str| edited("pod-delete-running", |r| r["request"]["name"] = json!(name));
    // The rule `deletes` allows 1 per 2 s: the first is admitted, the second held.
    assert_eq!(
        answer(&h, "/validate", delete("first")).await["allowed"],
        json!(true)
    );
    let impatient = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(h.ca.cert_pem.as_bytes())
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let gone = impatient
        .post(format!("{}/validate", h.base))
        .header("Content-Type", "application/json")
        .body(delete("abandoned"))
        .send()
        .await;
    assert!(gone.is_err(), "the client gave up before the hold ended");
    assert_eq!(
        wait_metric(
            &h,
            "churn_throttler_bad_requests_total{reason=\"abandoned-hold\"}",
            1.0
        )
        .await,
        1.0
    );
    // The third is held until the abandoned slot (inside the first window's 2 s), not
    // a window later; the hold is the scheduled wait, not a measured time.
    assert_eq!(
        answer(&h, "/validate", delete("third")).await["allowed"],
        json!(true)
    );
    let held = h.metric("churn_throttler_hold_duration_seconds_sum").await;
    assert!(held > 0.0 && held < 2.0, "held {held} s");
    h.stop().await;
}

#[tokio::test]
async fn a_drain_shorter_than_the_longest_hold_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap_or_else(|e| panic!("{e}"));
    let ca = certgen::new_ca("ca").unwrap_or_else(|e| panic!("{e}"));
    write_pair(dir.path(), &ca, time::Duration::days(1));
    let mut a = args(dir.path());
    // The rule `deletes` holds up to 3 s: the drain must last 4 s.
    a.drain_timeout = Duration::from_millis(3_500);
    let refused = start(a)
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(
        refused.contains("--drain-timeout 3.5s is too short") && refused.contains("4s or more"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_policy_reload_that_holds_longer_than_the_drain_allows_is_refused() {
    // drain 5 s: holds of 4 s at most. The test policy's `deletes` holds 3 s.
    let mut h = Harness::start().await;
    let path = h.dir.path().join("policy.yaml");
    let longer = POLICY.replace("maxHold: 3s", "maxHold: 5s");
    std::fs::write(&path, longer).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        wait_metric(
            &h,
            "churn_throttler_reloads_total{kind=\"policy\",result=\"error\"}",
            1.0
        )
        .await,
        1.0,
        "refused"
    );
    // The last good policy is still in force: the second delete is held (3 s), not refused.
    let delete = |name: &str| edited("pod-delete-running", |r| r["request"]["name"] = json!(name));
    assert_eq!(
        answer(&h, "/validate", delete("a")).await["allowed"],
        json!(true)
    );
    assert_eq!(
        answer(&h, "/validate", delete("b")).await["allowed"],
        json!(true)
    );
    h.stop().await;
}

#[tokio::test]
async fn with_a_synced_pod_cache_reviews_of_pods_it_lacks_are_allowed_uncharged() {
    let mut h = Harness::start().await;
    let state = h.running.as_ref().map(|r| r.state.clone());
    let Some(state) = state else {
        panic!("no server")
    };
    // The cache as a watch would fill it: two real pods in shop.
    state
        .pods
        .preload(
            &[
                (
                    "shop",
                    "web-5d9c7b8f6d-x7k2p",
                    "9b2d7c1e-3c44-4a51-8d1e-6f0a2b3c4d5e",
                ),
                ("shop", "web-5d9c7b8f6d-other", "other-uid"),
            ],
            &state.metrics,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    // 20 forged evictions (one a minute is the limit) and 20 forged deletions (one per
    // 2 s, held up to 3 s) of pods that do not exist, each in its own namespace.
    for i in 0..20 {
        let mut eviction: Value =
            serde_json::from_str(&fixture("pod-eviction")).unwrap_or(Value::Null);
        eviction["request"]["namespace"] = json!(format!("forged-{i}"));
        eviction["request"]["uid"] = json!(format!("forged-eviction-{i}"));
        let got = answer(&h, "/validate", eviction.to_string()).await;
        assert_eq!(got["allowed"], json!(true), "{got}");
        let mut delete: Value =
            serde_json::from_str(&fixture("pod-delete-running")).unwrap_or(Value::Null);
        delete["request"]["namespace"] = json!(format!("forged-{i}"));
        delete["request"]["oldObject"]["metadata"]["namespace"] = json!(format!("forged-{i}"));
        delete["request"]["uid"] = json!(format!("forged-delete-{i}"));
        let got = answer(&h, "/validate", delete.to_string()).await;
        assert_eq!(got["allowed"], json!(true), "{got}");
    }
    // A deletion naming a real pod with another uid is not the API server's either.
    let mut stale: Value =
        serde_json::from_str(&fixture("pod-delete-running")).unwrap_or(Value::Null);
    stale["request"]["oldObject"]["metadata"]["uid"] = json!("an-older-pod-of-that-name");
    stale["request"]["uid"] = json!("forged-stale-uid");
    assert_eq!(
        answer(&h, "/validate", stale.to_string()).await["allowed"],
        json!(true)
    );
    let unverified =
        |reason: &str| format!("churn_throttler_unverified_requests_total{{reason=\"{reason}\"}}");
    assert_eq!(
        wait_metric(&h, &unverified("no-such-pod"), 40.0).await,
        40.0
    );
    assert_eq!(wait_metric(&h, &unverified("uid-mismatch"), 1.0).await, 1.0);
    assert_eq!(h.metric("churn_throttler_pod_cache_synced").await, 1.0);
    // None of them took a slot: the real eviction and deletion are admitted at once
    // (a charged forgery would have made the eviction a 429 and the deletion a hold).
    assert_eq!(
        h.review("/validate", "pod-eviction").await["allowed"],
        json!(true)
    );
    assert_eq!(
        h.review("/validate", "pod-delete-running").await["allowed"],
        json!(true)
    );
    let decisions = |rule: &str, op: &str, action: &str| {
        format!(
            "churn_throttler_decisions_total{{action=\"{action}\",operation=\"{op}\",rule=\"{rule}\"}}"
        )
    };
    assert_eq!(
        h.metric(&decisions("evictions", "CREATE", "allow")).await,
        1.0
    );
    assert_eq!(
        h.metric(&decisions("deletes", "DELETE", "allow")).await,
        1.0
    );
    assert_eq!(h.metric(&decisions("deletes", "DELETE", "hold")).await, 0.0);
    // Real pods are still charged: a second real pod's eviction inside the minute is refused.
    let mut other: Value = serde_json::from_str(&fixture("pod-eviction")).unwrap_or(Value::Null);
    other["request"]["name"] = json!("web-5d9c7b8f6d-other");
    other["request"]["uid"] = json!("a-real-second-eviction");
    let refused = answer(&h, "/validate", other.to_string()).await;
    assert_eq!(refused["allowed"], json!(false), "{refused}");
    assert_eq!(refused["status"]["code"], json!(429));
    h.stop().await;
}

/// Sum of every series of `name` whose labels contain each of `labels`.
fn series_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

#[tokio::test]
async fn an_idle_flood_is_evicted_and_reviews_keep_being_answered() {
    let mut h = Harness::start_with(|a| {
        a.connections.max_connections = 8;
        a.connections.max_connections_per_source = Some(4);
    })
    .await;
    let delete = |name: &str| edited("pod-delete-running", |r| r["request"]["name"] = json!(name));
    // The rule `deletes` allows 1 per 2 s: the first is admitted, the second is held
    // (in flight) through the flood and must be answered, not evicted.
    assert_eq!(
        answer(&h, "/validate", delete("first")).await["allowed"],
        json!(true)
    );
    let held = {
        let client = h.client.clone();
        let url = format!("{}/validate", h.base);
        let body = delete("held");
        tokio::spawn(async move {
            client
                .post(url)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
        })
    };
    let addr = h
        .running
        .as_ref()
        .map(|r| r.tls_addr)
        .unwrap_or_else(|| panic!("running"));
    assert_eq!(
        wait_metric(&h, "churn_throttler_held_requests", 1.0).await,
        1.0
    );
    // 20 connections from the same address that never start a TLS handshake.
    let mut flood = Vec::new();
    for _ in 0..20 {
        flood.push(
            tokio::net::TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A fresh client is answered while the flood holds its connections.
    let fresh = answer(&h, "/validate", fixture("configmap-create")).await;
    assert_eq!(fresh["allowed"], json!(true), "{fresh}");
    let response = held
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("the held request was dropped: {e}"));
    assert_eq!(response.status().as_u16(), 200);
    let text = h.metrics_text().await;
    let evicted = series_sum(
        &text,
        "churn_throttler_connections_evicted_total",
        &[
            "port=\"admission\"",
            "cap=\"source\"",
            "kind=\"never-completed\"",
        ],
    );
    // 2 in the table (the held one, the flood's first), then each of the other 19 and
    // the fresh client's made room by closing a flood connection: at least 16.
    assert!(evicted >= 16.0, "evicted {evicted}\n{text}");
    let refused = series_sum(&text, "churn_throttler_connections_refused_total", &[]);
    assert_eq!(refused, 0.0, "{text}");
    // The oldest flood connections were closed by the server.
    use tokio::io::AsyncReadExt;
    let mut closed = 0;
    for stream in flood.iter_mut().take(10) {
        let mut buf = [0u8; 16];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 10, "the ten oldest flood connections are closed");
    h.stop().await;
}

/// The built-in policy's gate rules are adaptive; with no releaser in the process nobody
/// here measures the network window, so they pace by their rates alone: a pod that fits
/// is admitted at once (marked released), not gated for a window no one sizes.
#[tokio::test]
async fn without_a_releaser_the_adaptive_rules_pace_by_their_rates() {
    use base64::Engine as _;
    let mut h = Harness::start_with(|a| a.policy_file = None).await;
    let response = h.review("/mutate", "pod-create-replicaset").await;
    assert_eq!(response["allowed"], json!(true), "{response}");
    let text = response["patch"].as_str().unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap_or_else(|e| panic!("patch is not base64 ({e}): {text}"));
    let patch = String::from_utf8_lossy(&bytes);
    assert!(
        patch.contains("released") && !patch.contains("schedulingGates"),
        "admitted at once and marked released, not gated: {patch}"
    );
    h.stop().await;
}

/// A schedule window of `events: 0` in force (one that never closes): the webhook answers
/// 429 at once with Retry-After maxRetryAfter and a message naming the pause, the other
/// rules keep their limits, and the gauges show the limit in force and its source.
#[tokio::test]
async fn a_schedule_pause_answers_429_and_shows_in_the_metrics() {
    let paused_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let policy_file = paused_dir.path().join("policy.yaml");
    let paused = POLICY.replace(
        "    limit: { events: 1, window: 60s }\n    action: retry-after\n",
        "    limit: { events: 1, window: 60s }\n    action: retry-after\n    schedules:\n      \
         - { schedule: \"* * * * *\", duration: 2m, limit: { events: 0 } }\n",
    );
    assert_ne!(paused, POLICY, "the evictions rule is edited");
    std::fs::write(&policy_file, paused).unwrap_or_else(|e| panic!("{e}"));
    let mut h = Harness::start_with(|c| c.policy_file = Some(policy_file.clone())).await;
    let response = h.review("/validate", "pod-eviction").await;
    assert_eq!(response["allowed"], json!(false), "{response}");
    let status = &response["status"];
    assert_eq!(status["code"], json!(429));
    assert_eq!(status["details"]["retryAfterSeconds"], json!(60));
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("rule \"evictions\" is paused by its schedule until no end in sight"),
        "{message}"
    );
    let paused_gauge = "churn_throttler_rule_paused{rule=\"evictions\"}";
    assert_eq!(wait_metric(&h, paused_gauge, 1.0).await, 1.0);
    assert_eq!(
        h.metric("churn_throttler_limit_in_force{rule=\"evictions\"}")
            .await,
        0.0
    );
    assert_eq!(
        h.metric("churn_throttler_limit_source{rule=\"evictions\",source=\"pause\"}")
            .await,
        1.0
    );
    assert_eq!(
        h.metric("churn_throttler_limit_in_force{rule=\"deletes\"}")
            .await,
        1.0
    );
    assert_eq!(
        h.metric("churn_throttler_limit_source{rule=\"deletes\",source=\"rule\"}")
            .await,
        1.0
    );
    h.stop().await;
}
