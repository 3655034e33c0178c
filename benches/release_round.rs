//! One gate releaser round over 10,000 gated pods in 1,000 namespaces:
//! `cargo bench --bench release_round`.
//!
//! The releaser shares its limiter with the webhook, so an admission decision waits for
//! whatever a round does under the limiter's lock. Side by side: the whole round (the
//! queue grouped and sorted, then charged: what the lock used to cover) and the part the
//! lock covers now (`charge`; `order` runs before the lock is taken). The windows are
//! full, the steady state of a long queue: each round finds no room and says when to
//! look again.

use churn_throttler::limiter::Limiter;
use churn_throttler::pacing::gate::{charge, order, plan, Cursor, Inputs, QueuedPod};
use churn_throttler::policy::Policy;
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use std::collections::HashMap;

const PODS: usize = 10_000;
const NAMESPACES: usize = 1_000;

fn policy(scope: &str) -> Policy {
    let yaml = format!(
        r#"
rules:
  - name: starts
    match: {{ resources: [pods], operations: [CREATE] }}
    limits:
      - {{ events: 20, window: 10s, scope: {scope} }}
    action: gate
maxBuckets: 200000
"#
    );
    Policy::from_yaml(&yaml, "bench").expect("policy")
}

fn queue() -> Vec<QueuedPod> {
    (0..PODS)
        .map(|i| QueuedPod {
            namespace: format!("ns-{}", i % NAMESPACES),
            name: format!("pod-{i}"),
            uid: format!("uid-{i}"),
            resource_version: "1".into(),
            rule: "starts".into(),
            owner: None,
            // Creation times shuffled so the lanes' sort has work to do.
            created: ((i * 7_919) % PODS) as u64,
        })
        .collect()
}

fn bench_scope(c: &mut Criterion, scope: &str) {
    let policy = policy(scope);
    let queue = queue();
    let not_ready = HashMap::new();
    let now = 1_000_000;
    let inputs = Inputs {
        queue: &queue,
        not_ready: &not_ready,
        policy: &policy,
        now,
        max_releases: 100,
        network: None,
    };
    let mut limiter = Limiter::new(policy.max_buckets);
    let mut cursor = Cursor::default();
    // Fill the windows (a round releases at most 100): from here on every round finds
    // them full.
    let mut filling_rounds = 0;
    while !plan(&inputs, &mut limiter, &mut cursor).releases.is_empty() {
        filling_rounds += 1;
        assert!(filling_rounds < 1_000, "the windows never fill");
    }
    assert!(filling_rounds > 0);

    c.bench_function(&format!("{scope}: whole round (order + charge)"), |b| {
        b.iter(|| black_box(plan(&inputs, &mut limiter, &mut cursor)))
    });
    // Rounds that find the windows full leave the cursor where it is.
    let ordered_from = cursor.clone();
    c.bench_function(&format!("{scope}: under the lock (charge)"), |b| {
        b.iter_batched(
            || order(&inputs, &ordered_from),
            // Returned, so criterion drops it untimed: the releaser describes what waits
            // (`into_plan`) after it has let the lock go.
            |order| charge(order, &mut limiter, &mut cursor),
            BatchSize::SmallInput,
        )
    });
}

fn bench(c: &mut Criterion) {
    bench_scope(c, "global");
    bench_scope(c, "namespace");
}

criterion_group!(benches, bench);
criterion_main!(benches);
