//! One admission decision with 10,000 active buckets: `cargo bench --bench decision`.
//! The request is classified from a real fixture once; the benchmark times
//! `decide_churn`, the part every review pays for, under a namespace-scoped limit.

use churn_throttler::admission::{classify, decide::decide_churn, Classified, Endpoint};
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

criterion_group!(benches, bench);
criterion_main!(benches);
