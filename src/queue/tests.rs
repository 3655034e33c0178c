use super::*;
use crate::policy::Policy;

const POLICY: &str = r#"
rules:
  - name: spaced
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 10, burst: 1, window: 10s, scope: global }
    action: gate
  - name: bursty
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 3, burst: 3, window: 10s, scope: global }
    action: gate
  - name: per-namespace
    match: { resources: [pods], operations: [CREATE] }
    limits:
      - { events: 10, burst: 1, window: 10s, scope: global }
      - { events: 1, burst: 1, window: 10s, scope: namespace }
    action: gate
  - name: deletes
    match: { resources: [pods], operations: [DELETE] }
    limit: { events: 1, burst: 1, window: 10s, scope: global }
    action: retry-after
"#;

/// The spacing of `spaced`: (10 s + the 500 ms margin) / 10.
const SPACING: Millis = 1_050;
const NOW: Millis = 1_000_000;

fn policy() -> Policy {
    Policy::from_yaml(POLICY, "test").expect("test policy is valid")
}

/// (namespace, name, rule, created ms).
type Row = (&'static str, &'static str, &'static str, Millis);

fn queue(rows: &[Row]) -> Vec<QueuedPod> {
    rows.iter()
        .map(|&(namespace, name, rule, created)| pod(namespace, name, rule, created))
        .collect()
}

fn pod(namespace: &str, name: &str, rule: &str, created: Millis) -> QueuedPod {
    QueuedPod {
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("uid-{namespace}-{name}"),
        resource_version: "1".into(),
        rule: rule.into(),
        owner: None,
        created,
    }
}

fn charge(limiter: &mut Limiter, policy: &Policy, rule: &str, namespace: &str, at: Millis) {
    let rule = gate_rule(policy, rule).expect("rule exists");
    limiter.record(&rule.name, &rule.limits, namespace, None, at, 1);
}

struct Case {
    name: &'static str,
    pods: &'static [Row],
    /// Charges already in the windows: (rule, namespace, at).
    charges: &'static [(&'static str, &'static str, Millis)],
    /// (rule, namespace) served last.
    cursor: Option<(&'static str, &'static str)>,
    /// Per pod, "ns/name position +ms after NOW", in release order.
    want: &'static [&'static str],
}

fn estimate_cases() -> Vec<Case> {
    vec![
        Case {
            name: "one namespace: oldest first, one spacing apart after the burst of 1",
            pods: &[
                ("a", "p3", "spaced", 3_000),
                ("a", "p1", "spaced", 1_000),
                ("a", "p2", "spaced", 2_000),
            ],
            charges: &[],
            cursor: None,
            want: &["a/p1 1 +0", "a/p2 2 +1050", "a/p3 3 +2100"],
        },
        Case {
            name: "namespaces take turns: b's only pod goes second, not behind all of a",
            pods: &[
                ("a", "a1", "spaced", 1_000),
                ("a", "a2", "spaced", 2_000),
                ("a", "a3", "spaced", 3_000),
                ("b", "b1", "spaced", 9_000),
            ],
            charges: &[],
            cursor: None,
            want: &["a/a1 1 +0", "b/b1 2 +1050", "a/a2 3 +2100", "a/a3 4 +3150"],
        },
        Case {
            name: "the cursor: the namespace after the one served last goes first",
            pods: &[("a", "a1", "spaced", 1_000), ("b", "b1", "spaced", 1_000)],
            charges: &[],
            cursor: Some(("spaced", "a")),
            want: &["b/b1 1 +0", "a/a1 2 +1050"],
        },
        Case {
            name: "a full window: the first release when its oldest charge leaves it",
            pods: &[("a", "a1", "spaced", 1_000), ("a", "a2", "spaced", 1_000)],
            charges: &[
                ("spaced", "x", NOW - 9_000),
                ("spaced", "x", NOW - 8_000),
                ("spaced", "x", NOW - 7_000),
                ("spaced", "x", NOW - 6_000),
                ("spaced", "x", NOW - 5_000),
                ("spaced", "x", NOW - 4_000),
                ("spaced", "x", NOW - 3_000),
                ("spaced", "x", NOW - 2_000),
                ("spaced", "x", NOW - 1_500),
                ("spaced", "x", NOW - 1_000),
            ],
            cursor: None,
            // The kept window is 10.5 s: the charge at -9 s leaves at +1.5 s; the next
            // release keeps the spacing after that one (the window alone: +2.5 s).
            want: &["a/a1 1 +1500", "a/a2 2 +2550"],
        },
        Case {
            name: "a plain window (burst = events): three at once, the rest a window later",
            pods: &[
                ("a", "a1", "bursty", 1_000),
                ("a", "a2", "bursty", 2_000),
                ("b", "b1", "bursty", 1_000),
                ("b", "b2", "bursty", 2_000),
            ],
            charges: &[],
            cursor: None,
            want: &["a/a1 1 +0", "b/b1 2 +0", "a/a2 3 +0", "b/b2 4 +10000"],
        },
        Case {
            name: "a namespace limit: b goes at the global spacing, a's second a window later",
            pods: &[
                ("a", "a1", "per-namespace", 1_000),
                ("a", "a2", "per-namespace", 2_000),
                ("b", "b1", "per-namespace", 1_000),
            ],
            charges: &[],
            cursor: None,
            want: &["a/a1 1 +0", "b/b1 2 +1050", "a/a2 3 +10000"],
        },
        Case {
            name: "a rule gone from the policy: released at once, as the releaser does",
            pods: &[("a", "a1", "spaced", 1_000), ("a", "old", "removed", 5_000)],
            charges: &[],
            cursor: None,
            want: &["a/a1 1 +0", "a/old 1 +0"],
        },
        Case {
            name: "rules are paced apart: each its own order",
            pods: &[
                ("a", "s1", "spaced", 1_000),
                ("a", "s2", "spaced", 2_000),
                ("a", "b1", "bursty", 1_000),
            ],
            charges: &[],
            cursor: None,
            want: &["a/b1 1 +0", "a/s1 1 +0", "a/s2 2 +1050"],
        },
    ]
}

#[test]
fn table_of_estimates() {
    let policy = policy();
    for case in estimate_cases() {
        let pods = queue(case.pods);
        let mut limiter = Limiter::new(1000);
        for &(rule, namespace, at) in case.charges {
            charge(&mut limiter, &policy, rule, namespace, at);
        }
        let mut cursor = Cursor::default();
        if let Some((rule, namespace)) = case.cursor {
            cursor.served(&Arc::from(rule), namespace);
        }
        let estimated = estimate(
            &EstimateInputs {
                queue: &pods,
                policy: &policy,
                cursor: &cursor,
                now: NOW,
                max_releases: MAX_ESTIMATED,
            },
            &mut limiter,
        );
        let mut got: Vec<(Millis, usize, String)> = pods
            .iter()
            .zip(&estimated)
            .map(|(p, e)| {
                let at = e.at.map_or("never".into(), |at| format!("+{}", at - NOW));
                (
                    e.at.unwrap_or(Millis::MAX),
                    e.position,
                    format!("{}/{} {} {at}", p.namespace, p.name, e.position),
                )
            })
            .collect();
        got.sort();
        let got: Vec<String> = got.into_iter().map(|(_, _, s)| s).collect();
        assert_eq!(got, case.want, "{}", case.name);
    }
}

#[test]
fn the_forward_run_stops_at_its_cap() {
    let policy = policy();
    let pods: Vec<QueuedPod> = (0..5)
        .map(|i| pod("a", &format!("p{i}"), "spaced", i * 1_000))
        .collect();
    let estimated = estimate(
        &EstimateInputs {
            queue: &pods,
            policy: &policy,
            cursor: &Cursor::default(),
            now: NOW,
            max_releases: 3,
        },
        &mut Limiter::new(100),
    );
    let times: Vec<Option<Millis>> = estimated.iter().map(|e| e.at).collect();
    assert_eq!(
        times,
        vec![
            Some(NOW),
            Some(NOW + SPACING),
            Some(NOW + 2 * SPACING),
            None,
            None
        ]
    );
    assert!(estimated
        .iter()
        .all(|e| e.rule.as_deref() == Some("spaced")));
}

/// What the webhook tells a pod it gates: the place it takes in the queue, counting the
/// pods already gated ahead of it, which the limiter alone does not hold (they are not
/// charged until released).
#[test]
fn table_of_joining_pods() {
    let policy = policy();
    let rule = gate_rule(&policy, "spaced").expect("rule");
    // (case, waiting pods as (namespace, count), joining namespace, pods ahead)
    type Lanes = &'static [(&'static str, usize)];
    let cases: &[(&str, Lanes, &str, usize)] = &[
        ("an empty queue: next", &[], "z", 0),
        (
            "behind 30 pods in 30 other namespaces of the same global bucket: 30 spacings",
            &[("n", 30)],
            "z",
            30,
        ),
        (
            "behind 30 pods of its own namespace: 30 spacings",
            &[("z", 30)],
            "z",
            30,
        ),
        (
            "30 pods of one other namespace: they take turns with it, so 1 goes first",
            &[("a", 30)],
            "z",
            1,
        ),
        (
            "5 of its own namespace and 30 of another: 6 turns each",
            &[("a", 30), ("z", 5)],
            "z",
            11,
        ),
    ];
    for &(case, lanes, namespace, ahead) in cases {
        let mut pods = Vec::new();
        for &(lane, count) in lanes {
            for i in 0..count {
                // "n": one pod in each of `count` namespaces.
                let ns = if lane == "n" {
                    format!("ns-{i:02}")
                } else {
                    lane.to_string()
                };
                pods.push(pod(&ns, &format!("p{i:02}"), "spaced", 1_000 + i as Millis));
            }
        }
        // In any order: the snapshot sorts them once.
        pods.reverse();
        let snapshot = Snapshot::new(pods, Cursor::default());
        let limiter = Limiter::new(100);
        let joining = estimate_joining(&snapshot, &policy, rule, namespace, None, &limiter, NOW)
            .expect("an estimate");
        assert_eq!(joining.ahead, ahead, "{case}");
        assert_eq!(joining.at, NOW + ahead as Millis * SPACING, "{case}");
        // The limiter alone: the window is empty, so it would say "now".
        let alone = limiter.earliest(&rule.name, &rule.limits, namespace, None, 1, NOW);
        assert_eq!(alone, NOW, "{case}: what the limiter alone knows");
    }
}

#[test]
fn a_joining_pod_counts_the_windows_and_leaves_the_limiter_alone() {
    let policy = policy();
    let rule = gate_rule(&policy, "spaced").expect("rule");
    let mut limiter = Limiter::new(100);
    // A release 300 ms ago: the next slot is one spacing after it.
    charge(&mut limiter, &policy, "spaced", "a", NOW - 300);
    let snapshot = Snapshot {
        network: None,
        pods: vec![
            pod("a", "p1", "spaced", 1_000),
            pod("b", "q1", "spaced", 1_000),
        ],
        cursor: Cursor::default(),
    };
    let joining =
        estimate_joining(&snapshot, &policy, rule, "c", None, &limiter, NOW).expect("estimate");
    assert_eq!(joining.ahead, 2);
    assert_eq!(joining.at, NOW - 300 + 3 * SPACING);
    let key = crate::limiter::BucketKey {
        rule: rule.name.clone(),
        limit: 0,
        scope: crate::limiter::ScopeKey::Global,
    };
    assert_eq!(
        limiter.used(&key, NOW),
        1,
        "nothing was charged for the estimate"
    );
}
