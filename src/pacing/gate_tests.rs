use super::*;
use crate::policy::Policy;

const POLICY: &str = r#"
rules:
  - name: pods
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 2, burst: 2, window: 10s, scope: global }
    action: gate
  - name: ready-capped
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 10, burst: 10, window: 10s, scope: global }
    maxNotReady: 3
    action: gate
  - name: per-namespace
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 1, burst: 1, window: 10s, scope: namespace }
    action: gate
  - name: per-owner
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 1, burst: 1, window: 10s, scope: owner }
    action: gate
  - name: paced-deletes
    match: { resources: [pods], operations: [DELETE] }
    limit: { events: 1, burst: 1, window: 10s, scope: global }
    action: retry-after
"#;

fn policy() -> Policy {
    Policy::from_yaml(POLICY, "test").expect("test policy is valid")
}

/// (namespace, name, rule, created ms); the owner is the name's prefix before '-'.
type Row = (&'static str, &'static str, &'static str, Millis);

fn queue(rows: &[Row]) -> Vec<QueuedPod> {
    rows.iter()
        .map(|&(namespace, name, rule, created)| QueuedPod {
            namespace: namespace.into(),
            name: name.into(),
            uid: format!("uid-{namespace}-{name}"),
            resource_version: "1".into(),
            rule: rule.into(),
            owner: name.split('-').next().map(str::to_string),
            created,
        })
        .collect()
}

fn run(
    policy: &Policy,
    pods: &[QueuedPod],
    not_ready: &[(&str, u32)],
    limiter: &mut Limiter,
    cursor: &mut Cursor,
    now: Millis,
) -> Plan {
    let not_ready: HashMap<String, u32> =
        not_ready.iter().map(|(r, n)| (r.to_string(), *n)).collect();
    plan(
        &Inputs {
            queue: pods,
            not_ready: &not_ready,
            policy,
            now,
            max_releases: MAX_RELEASES_PER_ROUND,
            network: None,
        },
        limiter,
        cursor,
    )
}

fn names(pods: &[QueuedPod], plan: &Plan) -> Vec<String> {
    plan.releases
        .iter()
        .map(|r| format!("{}/{}", pods[r.index].namespace, pods[r.index].name))
        .collect()
}

fn charge(limiter: &mut Limiter, policy: &Policy, rule: &str, namespace: &str, at: Millis) {
    let rule = gate_rule(policy, rule).expect("rule exists");
    limiter.record(&rule.name, &rule.limits, namespace, None, at, 1);
}

struct Case {
    name: &'static str,
    pods: &'static [Row],
    not_ready: &'static [(&'static str, u32)],
    /// Charges already in the windows: (rule, namespace, at).
    charges: &'static [(&'static str, &'static str, Millis)],
    now: Millis,
    released: &'static [&'static str],
    wake_at: Option<Millis>,
}

#[test]
fn table_of_single_rounds() {
    let policy = policy();
    let cases = [
        Case {
            name: "FIFO: the oldest pods of a namespace go first, wake when a charge leaves",
            pods: &[
                ("a", "p3", "pods", 3_000),
                ("a", "p1", "pods", 1_000),
                ("a", "p4", "pods", 4_000),
                ("a", "p2", "pods", 2_000),
            ],
            not_ready: &[],
            charges: &[],
            now: 50_000,
            released: &["a/p1", "a/p2"],
            wake_at: Some(60_000),
        },
        Case {
            name: "FIFO: same creation second, ordered by name",
            pods: &[("a", "web-b", "pods", 1_000), ("a", "web-a", "pods", 1_000)],
            not_ready: &[],
            charges: &[],
            now: 50_000,
            released: &["a/web-a", "a/web-b"],
            wake_at: None,
        },
        Case {
            name: "fairness: round-robin across namespaces, not global age",
            pods: &[
                ("a", "a1", "pods", 1_000),
                ("a", "a2", "pods", 1_001),
                ("a", "a3", "pods", 1_002),
                ("b", "b1", "pods", 9_000),
                ("c", "c1", "pods", 9_500),
            ],
            not_ready: &[],
            charges: &[],
            now: 50_000,
            released: &["a/a1", "b/b1"],
            wake_at: Some(60_000),
        },
        Case {
            name: "windows: charges already in the window leave one slot",
            pods: &[("a", "p1", "pods", 1_000), ("a", "p2", "pods", 2_000)],
            not_ready: &[],
            charges: &[("pods", "x", 45_000)],
            now: 50_000,
            released: &["a/p1"],
            wake_at: Some(55_000),
        },
        Case {
            name: "windows: a full window releases nothing, wakes at the first slot",
            pods: &[("a", "p1", "pods", 1_000)],
            not_ready: &[],
            charges: &[("pods", "x", 41_000), ("pods", "x", 42_000)],
            now: 50_000,
            released: &[],
            wake_at: Some(51_000),
        },
        Case {
            name: "maxNotReady: two free of three, then blocked without a timed wake",
            pods: &[
                ("a", "p1", "ready-capped", 1_000),
                ("a", "p2", "ready-capped", 2_000),
                ("b", "p3", "ready-capped", 3_000),
                ("b", "p4", "ready-capped", 4_000),
            ],
            not_ready: &[("ready-capped", 1)],
            charges: &[],
            now: 50_000,
            released: &["a/p1", "b/p3"],
            wake_at: None,
        },
        Case {
            name: "maxNotReady reached: nothing goes even with room in the window",
            pods: &[("a", "p1", "ready-capped", 1_000)],
            not_ready: &[("ready-capped", 3), ("pods", 7)],
            charges: &[],
            now: 50_000,
            released: &[],
            wake_at: None,
        },
        Case {
            name: "not-Ready pods of another rule do not count",
            pods: &[("a", "p1", "ready-capped", 1_000)],
            not_ready: &[("pods", 70)],
            charges: &[],
            now: 50_000,
            released: &["a/p1"],
            wake_at: None,
        },
        Case {
            name: "rule removed from the policy: released at once, oldest first, uncharged",
            pods: &[
                ("a", "p2", "removed-rule", 2_000),
                ("b", "p1", "removed-rule", 1_000),
                ("a", "p3", "", 3_000),
                ("a", "p4", "paced-deletes", 4_000),
            ],
            not_ready: &[],
            charges: &[("pods", "x", 49_000), ("pods", "x", 49_500)],
            now: 50_000,
            released: &["b/p1", "a/p2", "a/p3", "a/p4"],
            wake_at: None,
        },
        Case {
            name: "namespace scope: each namespace has its own window",
            pods: &[
                ("a", "p1", "per-namespace", 1_000),
                ("a", "p2", "per-namespace", 2_000),
                ("b", "p3", "per-namespace", 3_000),
                ("c", "p4", "per-namespace", 4_000),
            ],
            not_ready: &[],
            charges: &[("per-namespace", "c", 45_000)],
            now: 50_000,
            released: &["a/p1", "b/p3"],
            wake_at: Some(55_000),
        },
        Case {
            name: "owner scope: a full owner does not block another owner's younger pod",
            pods: &[
                ("a", "x-1", "per-owner", 1_000),
                ("a", "x-2", "per-owner", 2_000),
                ("a", "y-1", "per-owner", 3_000),
            ],
            not_ready: &[],
            charges: &[],
            now: 50_000,
            released: &["a/x-1", "a/y-1"],
            wake_at: Some(60_000),
        },
        Case {
            name: "empty queue: nothing to do, no wake",
            pods: &[],
            not_ready: &[],
            charges: &[],
            now: 50_000,
            released: &[],
            wake_at: None,
        },
    ];
    for case in &cases {
        let pods = queue(case.pods);
        let mut limiter = Limiter::new(1_000);
        for &(rule, namespace, at) in case.charges {
            charge(&mut limiter, &policy, rule, namespace, at);
        }
        let mut cursor = Cursor::default();
        let got = run(
            &policy,
            &pods,
            case.not_ready,
            &mut limiter,
            &mut cursor,
            case.now,
        );
        assert_eq!(names(&pods, &got), case.released, "{}", case.name);
        assert_eq!(got.wake_at, case.wake_at, "{}: wake_at", case.name);
    }
}

#[test]
fn orphans_are_marked_rule_gone() {
    let policy = policy();
    let pods = queue(&[("a", "p1", "removed", 0), ("a", "p2", "pods", 0)]);
    let mut limiter = Limiter::new(1_000);
    let got = run(
        &policy,
        &pods,
        &[],
        &mut limiter,
        &mut Cursor::default(),
        1_000,
    );
    assert_eq!(got.releases[0].why, ReleaseWhy::RuleGone);
    assert_eq!(got.releases[0].rule, None);
    assert_eq!(got.releases[1].why, ReleaseWhy::Rate);
    assert_eq!(got.releases[1].rule.as_deref(), Some("pods"));
    assert_eq!(got.releases[1].waited_ms, 1_000);
}

#[test]
fn round_robin_cursor_rotates_across_rounds() {
    // One slot per round: the namespaces must take turns, whatever their ages.
    let policy = Policy::from_yaml(
        r#"
rules:
  - name: one
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 1, burst: 1, window: 1s, scope: global }
    action: gate
"#,
        "test",
    )
    .expect("valid");
    let mut pods = queue(&[
        ("a", "a1", "one", 0),
        ("a", "a2", "one", 1),
        ("a", "a3", "one", 2),
        ("a", "a4", "one", 3),
        ("b", "b1", "one", 500),
        ("b", "b2", "one", 501),
        ("c", "c1", "one", 900),
    ]);
    let mut limiter = Limiter::new(1_000);
    let mut cursor = Cursor::default();
    let mut order = Vec::new();
    for round in 0..7u64 {
        let got = run(
            &policy,
            &pods,
            &[],
            &mut limiter,
            &mut cursor,
            10_000 + round * 1_000,
        );
        let mut released = names(&pods, &got);
        assert_eq!(released.len(), 1, "round {round}");
        let index = got.releases[0].index;
        pods.remove(index);
        order.append(&mut released);
    }
    assert_eq!(
        order,
        ["a/a1", "b/b1", "c/c1", "a/a2", "b/b2", "a/a3", "a/a4"]
    );
}

#[test]
fn the_per_round_cap_wakes_at_once() {
    let policy = policy();
    let rows: Vec<Row> = vec![
        ("a", "p1", "gone", 1),
        ("a", "p2", "gone", 2),
        ("a", "p3", "gone", 3),
    ];
    let pods = queue(&rows);
    let mut limiter = Limiter::new(1_000);
    let not_ready = HashMap::new();
    let got = plan(
        &Inputs {
            queue: &pods,
            not_ready: &not_ready,
            policy: &policy,
            now: 100,
            max_releases: 2,
            network: None,
        },
        &mut limiter,
        &mut Cursor::default(),
    );
    assert_eq!(names(&pods, &got), ["a/p1", "a/p2"]);
    assert_eq!(got.wake_at, Some(100));
}

#[test]
fn waiting_summary_per_namespace_and_rule() {
    let policy = policy();
    // 2 per 10s global; a has 4 pods, b has 1: after a1 and b1 go, a waits for 3 more.
    let pods = queue(&[
        ("a", "a1", "pods", 1),
        ("a", "a2", "pods", 2),
        ("a", "a3", "pods", 3),
        ("a", "a4", "pods", 4),
        ("b", "b1", "pods", 5),
        ("c", "c1", "ready-capped", 6),
    ]);
    let mut limiter = Limiter::new(1_000);
    let got = run(
        &policy,
        &pods,
        &[("ready-capped", 3)],
        &mut limiter,
        &mut Cursor::default(),
        100_000,
    );
    assert_eq!(names(&pods, &got), ["a/a1", "b/b1"]);
    let a = got
        .waiting
        .iter()
        .find(|w| w.namespace == "a")
        .expect("a waits");
    assert_eq!(a.pods, 3);
    assert_eq!(pods[a.head].name, "a2");
    assert_eq!(a.blocked, Blocked::Rate);
    assert_eq!((a.rule_pods, a.rule_namespaces), (3, 1));
    let c = got
        .waiting
        .iter()
        .find(|w| w.namespace == "c")
        .expect("c waits");
    assert_eq!(
        c.blocked,
        Blocked::NotReady {
            not_ready: 3,
            max: 3
        }
    );
}

/// (namespace, uid, rule, released_at, settled)
type Released = (
    &'static str,
    &'static str,
    &'static str,
    Option<Millis>,
    bool,
);

const OWN_INSTANCE: &str = "churn-throttler-1/1767229200000";

fn released(rows: &[Released]) -> Vec<ReleasedPod> {
    rows.iter()
        .map(
            |&(namespace, uid, rule, released_at, settled)| ReleasedPod {
                namespace: namespace.into(),
                name: uid.into(),
                uid: uid.into(),
                rule: rule.into(),
                owner: None,
                released_at,
                settled,
                held_elsewhere: uid.starts_with("held"),
                // Pods the webhook admitted at once: by this process, or by an earlier one.
                admitted_by: if uid.starts_with("mine") {
                    Some(OWN_INSTANCE.into())
                } else if uid.starts_with("admitted") {
                    Some("churn-throttler-0/1767225600000".into())
                } else {
                    None
                },
            },
        )
        .collect()
}

#[test]
fn table_of_seeding() {
    let policy = policy();
    // (case, released pods, already charged uids, now, seeded count, releases allowed now)
    type SeedCase = (
        &'static str,
        &'static [Released],
        &'static [&'static str],
        Millis,
        usize,
        usize,
    );
    let cases: &[SeedCase] = &[
        ("nothing released: full budget", &[], &[], 100_000, 0, 2),
        (
            "admitted at once by an earlier process: seeded like a release",
            &[("a", "admitted-1", "pods", Some(97_000), false)],
            &[],
            100_000,
            1,
            1,
        ),
        (
            "admitted at once by this process: its limiter has it already",
            &[("a", "mine-1", "pods", Some(97_000), false)],
            &[],
            100_000,
            0,
            1,
        ),
        (
            "two releases inside the window: no burst after a restart",
            &[
                ("a", "u1", "pods", Some(95_000), true),
                ("b", "u2", "pods", Some(99_000), false),
            ],
            &[],
            100_000,
            2,
            0,
        ),
        (
            "one inside, one out of the window",
            &[
                ("a", "u1", "pods", Some(85_000), true),
                ("a", "u2", "pods", Some(99_000), true),
            ],
            &[],
            100_000,
            1,
            1,
        ),
        (
            "exactly one window ago is out",
            &[("a", "u1", "pods", Some(90_000), true)],
            &[],
            100_000,
            0,
            2,
        ),
        (
            "a release time in the future (clock skew) counts as now",
            &[("a", "u1", "pods", Some(500_000), false)],
            &[],
            100_000,
            1,
            1,
        ),
        (
            "already charged by this process: not charged twice",
            &[
                ("a", "u1", "pods", Some(99_000), false),
                ("a", "u2", "pods", Some(99_500), false),
            ],
            &["u1"],
            100_000,
            1,
            0,
        ),
        (
            "no annotation, or a rule that is gone: nothing to seed",
            &[
                ("a", "u1", "pods", None, false),
                ("a", "u2", "removed", Some(99_000), false),
            ],
            &[],
            100_000,
            0,
            2,
        ),
        (
            "another rule's releases use another window",
            &[("a", "u1", "ready-capped", Some(99_000), false)],
            &[],
            100_000,
            1,
            2,
        ),
    ];
    for &(name, rows, already, now, seeded, allowed) in cases {
        let mut limiter = Limiter::new(1_000);
        let mut charged = Charged::default();
        for uid in already {
            // This process charged it itself when it released it.
            charge(&mut limiter, &policy, "pods", "a", now - 1_000);
            charged.insert(uid, now - 1_000);
        }
        for row in rows.iter().filter(|r| r.1.starts_with("mine")) {
            // This process's webhook charged it when it admitted it.
            charge(&mut limiter, &policy, "pods", row.0, row.3.unwrap_or(now));
        }
        let got = seed(
            &mut limiter,
            &policy,
            &released(rows),
            &mut charged,
            OWN_INSTANCE,
            now,
        );
        assert_eq!(got, seeded, "{name}: seeded");
        let pods = queue(&[
            ("q", "p1", "pods", 0),
            ("q", "p2", "pods", 1),
            ("q", "p3", "pods", 2),
        ]);
        let plan = run(
            &policy,
            &pods,
            &[],
            &mut limiter,
            &mut Cursor::default(),
            now,
        );
        assert_eq!(
            plan.releases.len(),
            allowed,
            "{name}: releases after seeding"
        );
        // Seeding twice changes nothing.
        let again = seed(
            &mut limiter,
            &policy,
            &released(rows),
            &mut charged,
            OWN_INSTANCE,
            now,
        );
        assert_eq!(again, 0, "{name}: second seeding");
    }
}

#[test]
fn charged_is_pruned_after_the_longest_window() {
    let policy = policy();
    let mut charged = Charged::default();
    charged.insert("old", 1_000);
    charged.insert("new", 95_000);
    charged.prune(&policy, 100_000);
    assert!(!charged.contains("old"));
    assert!(charged.contains("new"));
    assert_eq!(charged.len(), 1);
}

#[test]
fn table_of_label_drops_and_readiness() {
    let policy = policy();
    let rows: &[Released] = &[
        ("a", "ready-old", "pods", Some(80_000), true),
        ("a", "ready-recent", "pods", Some(95_000), true),
        ("a", "not-ready-old", "pods", Some(80_000), false),
        ("a", "ready-no-time", "pods", None, true),
        ("a", "ready-rule-gone", "removed", Some(99_000), true),
        ("a", "not-ready-other", "ready-capped", Some(99_000), false),
        (
            "a",
            "held-by-another-gate",
            "ready-capped",
            Some(99_000),
            false,
        ),
    ];
    let pods = released(rows);
    let drop: Vec<&str> = labels_to_drop(&pods, &policy, 100_000)
        .into_iter()
        .map(|i| pods[i].uid.as_str())
        .collect();
    assert_eq!(drop, ["ready-old", "ready-no-time", "ready-rule-gone"]);
    let not_ready = not_ready_by_rule(&pods);
    assert_eq!(not_ready.get("pods"), Some(&1));
    assert_eq!(not_ready.get("ready-capped"), Some(&1));
}

/// Drives plan + seeding over time as the controller would, with a restart in the
/// middle that keeps only what the cluster keeps (the released-at annotations).
#[test]
fn a_mass_release_never_exceeds_the_limit_in_any_window() {
    let policy = Policy::from_yaml(
        r#"
rules:
  - name: five
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 5, burst: 5, window: 10s, scope: global }
    action: gate
"#,
        "test",
    )
    .expect("valid");
    let mut pods: Vec<QueuedPod> = Vec::new();
    for (n, ns) in ["a", "b", "c"].iter().enumerate() {
        for i in 0..10u64 {
            pods.push(QueuedPod {
                namespace: ns.to_string(),
                name: format!("p{i:02}"),
                uid: format!("{ns}-{i}"),
                resource_version: "1".into(),
                rule: "five".into(),
                owner: None,
                created: i * 10 + n as u64,
            });
        }
    }
    let mut done: Vec<ReleasedPod> = Vec::new();
    let mut times: Vec<Millis> = Vec::new();
    let mut limiter = Limiter::new(1_000);
    let mut cursor = Cursor::default();
    let mut charged = Charged::default();
    let mut now: Millis = 1_000;
    let mut rounds = 0;
    while !pods.is_empty() && rounds < 1_000 {
        rounds += 1;
        if (17_000..17_300).contains(&now) {
            // Restart: memory is lost, the windows come back from the annotations.
            limiter = Limiter::new(1_000);
            cursor = Cursor::default();
            charged = Charged::default();
            seed(
                &mut limiter,
                &policy,
                &done,
                &mut charged,
                OWN_INSTANCE,
                now,
            );
        }
        let got = run(&policy, &pods, &[], &mut limiter, &mut cursor, now);
        let mut gone: Vec<usize> = got.releases.iter().map(|r| r.index).collect();
        for &index in &gone {
            let pod = &pods[index];
            times.push(now);
            done.push(ReleasedPod {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                rule: pod.rule.clone(),
                owner: None,
                released_at: Some(now),
                settled: true,
                held_elsewhere: false,
                admitted_by: None,
            });
            charged.insert(&pod.uid, now);
        }
        gone.sort_unstable();
        for index in gone.into_iter().rev() {
            pods.remove(index);
        }
        // The controller wakes at wake_at, or every 300 ms on watch events.
        now = got
            .wake_at
            .map_or(now + 300, |w| w.min(now + 300))
            .max(now + 1);
    }
    assert!(pods.is_empty(), "all 30 released");
    assert_eq!(times.len(), 30);
    for (i, &t) in times.iter().enumerate() {
        let in_window = times[i..].iter().filter(|&&u| u < t + 10_000).count();
        assert!(
            in_window <= 5,
            "{in_window} releases in the window from {t}"
        );
    }
    // 30 pods at 5 per 10 s: the last goes in the sixth window, no earlier, no later.
    let last = *times.last().expect("released");
    assert!((51_000..=52_000).contains(&last), "last release at {last}");
    // Each window's five are spread over the namespaces.
    let first: Vec<&str> = done[..3].iter().map(|p| p.namespace.as_str()).collect();
    assert_eq!(first, ["a", "b", "c"]);
}

/// Burst 1: one release per round, each (window + margin) / events after the one
/// before, and the plan wakes the controller at exactly the next spaced slot.
#[test]
fn a_mass_release_is_spaced_and_wakes_at_the_next_slot() {
    let policy = Policy::from_yaml(
        r#"
rules:
  - name: five
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 5, burst: 1, window: 10s, scope: global }
    action: gate
"#,
        "test",
    )
    .expect("valid");
    let spacing = policy.rules[0].limits[0]
        .spacing_ms()
        .expect("burst 1 spaces");
    assert_eq!(spacing, 2_100);
    let mut pods: Vec<QueuedPod> = (0..12u64)
        .map(|i| QueuedPod {
            namespace: ["a", "b", "c"][i as usize % 3].to_string(),
            name: format!("p{i:02}"),
            uid: format!("u{i}"),
            resource_version: "1".into(),
            rule: "five".into(),
            owner: None,
            created: i,
        })
        .collect();
    let mut limiter = Limiter::new(1_000);
    let mut cursor = Cursor::default();
    let mut times: Vec<Millis> = Vec::new();
    let mut now: Millis = 1_000;
    for _ in 0..1_000 {
        if pods.is_empty() {
            break;
        }
        let got = run(&policy, &pods, &[], &mut limiter, &mut cursor, now);
        assert!(
            got.releases.len() <= 1,
            "{} released at {now}",
            got.releases.len()
        );
        for release in &got.releases {
            times.push(now);
            pods.remove(release.index);
        }
        if !pods.is_empty() {
            let wake = got.wake_at.expect("pods wait on the rate");
            assert_eq!(wake, times.last().copied().unwrap_or(0) + spacing);
            // A round woken early (a watch event) releases nothing and says the same.
            let early = run(&policy, &pods, &[], &mut limiter, &mut cursor, wake - 700);
            assert!(early.releases.is_empty());
            assert_eq!(early.wake_at, Some(wake));
            now = wake;
        }
    }
    assert_eq!(times.len(), 12, "all released");
    for pair in times.windows(2) {
        assert_eq!(pair[1] - pair[0], spacing, "{pair:?}");
    }
}

#[test]
fn the_network_window_caps_adaptive_rules_together_and_no_other() {
    let policy = Policy::from_yaml(
        r#"
network: { minWindow: 1, maxWindow: 50 }
rules:
  - name: sts
    match: { resources: [pods], operations: [CREATE], controllerKinds: [StatefulSet] }
    limit: { events: 100, burst: 100, window: 10s, scope: global }
    maxNotReady: 100
    adaptive: true
    action: gate
  - name: rs
    match: { resources: [pods], operations: [CREATE], controllerKinds: [ReplicaSet] }
    limit: { events: 100, burst: 100, window: 10s, scope: global }
    maxNotReady: 100
    adaptive: true
    action: gate
  - name: fixed
    match: { resources: [pods], operations: [CREATE] }
    limit: { events: 100, burst: 100, window: 10s, scope: global }
    action: gate
"#,
        "test",
    )
    .expect("valid");
    let pods = queue(&[
        ("a", "s-1", "sts", 1),
        ("a", "s-2", "sts", 2),
        ("a", "s-3", "sts", 3),
        ("b", "r-1", "rs", 4),
        ("b", "r-2", "rs", 5),
        ("c", "f-1", "fixed", 6),
        ("c", "f-2", "fixed", 7),
    ]);
    let not_ready = HashMap::new();
    // (case, network room, releases of the adaptive rules, blocked reason of what waits)
    let cases: &[(&str, Option<NetworkRoom>, usize, Option<Blocked>)] = &[
        ("no window: everything goes", None, 5, None),
        (
            "room for 3, shared by both adaptive rules",
            Some(NetworkRoom {
                in_flight: 2,
                window: 5,
            }),
            3,
            Some(Blocked::Network {
                in_flight: 5,
                window: 5,
            }),
        ),
        (
            "full: no adaptive release",
            Some(NetworkRoom {
                in_flight: 6,
                window: 5,
            }),
            0,
            Some(Blocked::Network {
                in_flight: 6,
                window: 5,
            }),
        ),
    ];
    for (name, network, adaptive, blocked) in cases {
        let mut limiter = Limiter::new(policy.max_buckets);
        let plan = plan(
            &Inputs {
                queue: &pods,
                not_ready: &not_ready,
                policy: &policy,
                now: 1_000,
                max_releases: MAX_RELEASES_PER_ROUND,
                network: *network,
            },
            &mut limiter,
            &mut Cursor::default(),
        );
        let rule_of = |r: &Release| pods[r.index].rule.clone();
        let adaptive_released = plan
            .releases
            .iter()
            .filter(|r| rule_of(r) != "fixed")
            .count();
        let fixed_released = plan
            .releases
            .iter()
            .filter(|r| rule_of(r) == "fixed")
            .count();
        assert_eq!(adaptive_released, *adaptive, "{name}");
        assert_eq!(
            fixed_released, 2,
            "{name}: a rule that is not adaptive ignores the window"
        );
        let waiting: Vec<Blocked> = plan
            .waiting
            .iter()
            .filter(|w| &*w.rule != "fixed")
            .map(|w| w.blocked)
            .collect();
        match blocked {
            None => assert!(waiting.is_empty(), "{name}: {waiting:?}"),
            Some(b) => assert!(
                waiting.iter().all(|w| w == b) && !waiting.is_empty(),
                "{name}: {waiting:?}"
            ),
        }
    }
}

/// A paused rule (a schedule window of `events: 0` in force) lifts no gate, says why and
/// when it ends, and wakes the releaser then; the other rules go on.
#[test]
fn a_paused_rule_lifts_no_gate_until_its_pause_ends() {
    let mut paused = policy();
    for rule in paused.rules.iter_mut().filter(|r| &*r.name == "pods") {
        rule.paused_until = Some(60_000);
    }
    let pods = queue(&[
        ("a", "p1", "pods", 0),
        ("a", "p2", "pods", 1),
        ("b", "q1", "ready-capped", 2),
    ]);
    let mut limiter = Limiter::new(1_000);
    let mut cursor = Cursor::default();
    let plan = run(&paused, &pods, &[], &mut limiter, &mut cursor, 1_000);
    assert_eq!(names(&pods, &plan), vec!["b/q1"]);
    assert_eq!(plan.wake_at, Some(60_000));
    let waiting: Vec<_> = plan
        .waiting
        .iter()
        .map(|w| (&*w.rule, w.pods, w.blocked))
        .collect();
    assert_eq!(
        waiting,
        vec![("pods", 2, Blocked::Paused { until: 60_000 })]
    );
    // At the end of the pause the rule's burst goes, no more.
    let plan = run(&paused, &pods[..2], &[], &mut limiter, &mut cursor, 60_000);
    assert_eq!(names(&pods, &plan), vec!["a/p1", "a/p2"]);
}
