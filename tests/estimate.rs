//! The release estimates (crate::queue::estimate) against the real release plan
//! (pacing::gate::plan) driven forward on a simulated clock: for any queue, windows and
//! round-robin position, every pod is estimated at the time and in the place the plan
//! releases it, when nothing else happens meanwhile (no new pods, every release Ready).

use churn_throttler::limiter::{Limiter, Millis};
use churn_throttler::pacing::gate::{gate_rule, plan, Inputs, MAX_RELEASES_PER_ROUND};
use churn_throttler::policy::Policy;
use churn_throttler::queue::{estimate, Cursor, EstimateInputs, QueuedPod, MAX_ESTIMATED};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

const POLICY: &str = r#"
rules:
  - name: spaced
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 5, window: 10s, scope: global }
    action: gate
  - name: plain
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 3, burst: 3, window: 4s, scope: global }
    action: gate
  - name: two-limits
    match: { resources: [pods], operations: [CREATE] }
    limits:
      - { events: 6, burst: 2, window: 10s, scope: global }
      - { events: 2, burst: 1, window: 5s, scope: namespace }
    action: gate
  - name: owners
    match: { resources: [pods], operations: [CREATE] }
    limits:
      - { events: 4, window: 10s, scope: global }
      - { events: 1, burst: 1, window: 6s, scope: owner }
    action: gate
"#;

const RULES: [&str; 5] = ["spaced", "plain", "two-limits", "owners", "gone"];
const NOW: Millis = 1_000_000;

fn policy() -> Policy {
    Policy::from_yaml(POLICY, "test").unwrap_or_else(|e| panic!("{e}"))
}

/// (namespace 0..4, rule 0..5, owner 0..3, created seconds 0..20)
type Spec = (usize, usize, usize, u64);

fn pods(specs: &[Spec]) -> Vec<QueuedPod> {
    specs
        .iter()
        .enumerate()
        .map(|(i, &(ns, rule, owner, created))| QueuedPod {
            namespace: format!("ns-{ns}"),
            name: format!("pod-{i:03}"),
            uid: format!("uid-{i}"),
            resource_version: "1".into(),
            rule: RULES[rule].into(),
            owner: Some(format!("owner-{ns}-{owner}")),
            created: NOW - 60_000 + created * 1_000,
        })
        .collect()
}

fn limiter_with(policy: &Policy, charges: &[(usize, usize, u64)]) -> Limiter {
    let mut limiter = Limiter::new(10_000);
    let mut charges = charges.to_vec();
    charges.sort_by_key(|c| c.2);
    for &(ns, rule, ago) in &charges {
        if let Some(rule) = gate_rule(policy, RULES[rule]) {
            limiter.record(
                &rule.name,
                &rule.limits,
                &format!("ns-{ns}"),
                Some(&format!("owner-{ns}-0")),
                NOW - ago,
                1,
            );
        }
    }
    limiter
}

/// The release plan run round after round at its own wake times: (time, position in its
/// rule's order) per pod.
fn drive_the_plan(
    policy: &Policy,
    queue: &[QueuedPod],
    limiter: &mut Limiter,
    mut cursor: Cursor,
) -> Vec<Option<(Millis, usize)>> {
    let mut released: Vec<Option<(Millis, usize)>> = vec![None; queue.len()];
    let mut left: Vec<usize> = (0..queue.len()).collect();
    let mut per_rule: HashMap<String, usize> = HashMap::new();
    let mut now = NOW;
    for _ in 0..10_000 {
        if left.is_empty() {
            break;
        }
        let waiting: Vec<QueuedPod> = left.iter().map(|&i| queue[i].clone()).collect();
        let out = plan(
            &Inputs {
                queue: &waiting,
                not_ready: &HashMap::new(),
                policy,
                now,
                max_releases: MAX_RELEASES_PER_ROUND,
                network: None,
            },
            limiter,
            &mut cursor,
        );
        let mut gone = Vec::new();
        for r in &out.releases {
            let index = left[r.index];
            let key = r.rule.as_deref().unwrap_or("(gone)").to_string();
            let n = per_rule.entry(key).or_insert(0);
            *n += 1;
            released[index] = Some((now, *n));
            gone.push(r.index);
        }
        gone.sort_unstable();
        for i in gone.into_iter().rev() {
            left.remove(i);
        }
        match out.wake_at {
            Some(at) if at >= now => now = at,
            _ => break,
        }
    }
    released
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn estimates_are_what_the_plan_does(
        specs in prop::collection::vec((0usize..4, 0usize..5, 0usize..3, 0u64..20), 0..60),
        charges in prop::collection::vec((0usize..4, 0usize..4, 0u64..12_000), 0..12),
        served in prop::option::of((0usize..4, 0usize..4)),
    ) {
        let policy = policy();
        let queue = pods(&specs);
        let mut cursor = Cursor::default();
        if let Some((rule, ns)) = served {
            cursor.served(&Arc::from(RULES[rule]), &format!("ns-{ns}"));
        }
        let mut estimated_on = limiter_with(&policy, &charges);
        let estimated = estimate(
            &EstimateInputs {
                queue: &queue,
                policy: &policy,
                cursor: &cursor,
                now: NOW,
                max_releases: MAX_ESTIMATED,
            },
            &mut estimated_on,
        );
        let mut planned_on = limiter_with(&policy, &charges);
        let planned = drive_the_plan(&policy, &queue, &mut planned_on, cursor);
        for (i, (e, p)) in estimated.iter().zip(&planned).enumerate() {
            let e = e.at.map(|at| (at, e.position));
            prop_assert_eq!(e, *p, "pod {} {:?}", i, &queue[i]);
        }
    }
}
