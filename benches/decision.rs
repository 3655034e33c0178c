//! One admission decision with 10,000 active buckets: `cargo bench --bench decision`.
//! The request is classified from a real fixture once; the benchmark times
//! `decide_churn`, the part every review pays for, under a namespace-scoped limit; then
//! the throttled decision of a mass re-creation (bench/run.sh's throttle policy, the
//! namespace holding its share of a fully booked future) beside the allowed one, as the
//! server takes them under the limiter's lock (`decide_unwritten`) and with the message.

use churn_throttler::admission::decide::{decide_churn, decide_unwritten};
use churn_throttler::admission::{classify, ChurnRequest, Classified, Endpoint, Verdict};
use churn_throttler::limiter::Limiter;
use churn_throttler::policy::Policy;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use kube::core::DynamicObject;

const POLICY: &str = r#"
rules:
  - name: deletes
    match: { resources: [pods], operations: [DELETE] }
    limits:
      - { events: 1000000, window: 10s, scope: global }
      - { events: 1000, window: 10s, scope: namespace }
    action: retry-after
    maxHold: 2s
maxBuckets: 200000
"#;

fn bench(c: &mut Criterion) {
    let policy = Policy::from_yaml(POLICY, "bench").expect("policy");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pod-delete-running.json"
    ))
    .expect("fixture");
    let review: AdmissionReview<DynamicObject> = serde_json::from_str(&text).expect("review");
    let request: AdmissionRequest<DynamicObject> = review.try_into().expect("request");
    let Classified::Churn(template) = classify(&request) else {
        panic!("not churn")
    };

    // 10,000 namespaces, each with a live bucket.
    let mut limiter = Limiter::new(policy.max_buckets);
    let namespaces: Vec<String> = (0..10_000).map(|i| format!("ns-{i}")).collect();
    let mut requests = Vec::with_capacity(namespaces.len());
    for (i, ns) in namespaces.iter().enumerate() {
        let mut churn = (*template).clone();
        churn.namespace = ns.clone();
        churn.identity = churn_throttler::limiter::Identity::Exact(format!("pod-delete:{ns}/pod"));
        decide_churn(&churn, Endpoint::Validate, &policy, &mut limiter, i as u64);
        requests.push(churn);
    }
    assert!(limiter.bucket_count() >= 10_000);

    let mut now = 20_000u64;
    let mut i = 0usize;
    c.bench_function("decide_churn, 10k active buckets", |b| {
        b.iter(|| {
            let churn = &requests[i % requests.len()];
            i += 1;
            now += 1;
            black_box(decide_churn(
                churn,
                Endpoint::Validate,
                &policy,
                &mut limiter,
                now,
            ))
        })
    });

    c.bench_function("classify + decide from a decoded review", |b| {
        b.iter(|| {
            now += 1;
            match classify(black_box(&request)) {
                Classified::Churn(churn) => Some(decide_churn(
                    &churn,
                    Endpoint::Validate,
                    &policy,
                    &mut limiter,
                    now,
                )),
                Classified::Pass(_) => None,
            }
        })
    });
}

/// bench/run.sh's policies: "allow" far above the load, "throttle" 20 per 10 s.
fn policy(limit: &str) -> Policy {
    let yaml = format!(
        "maxBuckets: 100000\nrules:\n  - name: controller-creates\n    match: {{ resources: [pods], operations: [CREATE], controllerKinds: [ReplicaSet, StatefulSet, Job] }}\n    limits: {limit}\n    action: retry-after\n"
    );
    Policy::from_yaml(&yaml, "bench").expect("policy")
}

fn throttled_beside_allowed(c: &mut Criterion) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pod-create-statefulset.json"
    ))
    .expect("fixture");
    let review: AdmissionReview<DynamicObject> = serde_json::from_str(&text).expect("review");
    let request: AdmissionRequest<DynamicObject> = review.try_into().expect("request");
    let Classified::Churn(template) = classify(&request) else {
        panic!("not churn")
    };
    // Every request a new pod of one namespace, as under a mass re-creation.
    let requests: Vec<ChurnRequest> = (0..4096)
        .map(|i| {
            let mut churn = (*template).clone();
            churn.name = format!("web-{i}");
            churn.identity = churn_throttler::limiter::Identity::Exact(format!("pod:{i}"));
            churn
        })
        .collect();
    let cases = [
        ("allowed", policy("[{ events: 1000000, window: 10s, scope: global }, { events: 1000000, window: 10s, scope: namespace }]")),
        ("throttled", policy("[{ events: 20, window: 10s, scope: global }]")),
    ];
    for (name, policy) in &cases {
        for written in [false, true] {
            let mut limiter = Limiter::new(policy.max_buckets);
            // Past the first window: the bucket's future booked up to the namespace's share.
            let mut now = 1_000_000u64;
            for churn in &requests[..200] {
                decide_unwritten(churn, Endpoint::Validate, policy, &mut limiter, None, now);
                now += 1;
            }
            let probe = decide_unwritten(
                &requests[200],
                Endpoint::Validate,
                policy,
                &mut limiter,
                None,
                now,
            );
            let want_throttled = *name == "throttled";
            assert_eq!(
                matches!(probe.verdict, Verdict::RetryAfter { .. }),
                want_throttled,
                "{name}: {probe:?}"
            );
            let mut i = 201usize;
            let label = if written {
                "decision and message"
            } else {
                "decision under the lock"
            };
            c.bench_function(&format!("{name}: {label}"), |b| {
                b.iter(|| {
                    let churn = &requests[i % requests.len()];
                    i += 1;
                    // 1 ms per 10 decisions: ~10,000 reviews/s, the reservations' slots
                    // stay ahead through a measurement.
                    now += (i % 10 == 0) as u64;
                    let mut decision = decide_unwritten(
                        churn,
                        Endpoint::Validate,
                        policy,
                        &mut limiter,
                        None,
                        now,
                    );
                    if written {
                        decision.write_message(policy, churn);
                    }
                    black_box(decision)
                })
            });
        }
    }
}

criterion_group!(benches, bench, throttled_beside_allowed);
criterion_main!(benches);
