use super::*;
use crate::limiter::Limiter;
use crate::policy::Policy;

const POLICY: &str = r#"
rules:
  - name: rollouts
    match: { resources: [statefulsets], operations: [UPDATE] }
    limit: { events: 2, window: 10s, scope: global }
    maxNotReady: 3
    action: partition
  - name: other-rollouts
    match: { resources: [statefulsets], operations: [UPDATE], namespaces: [special] }
    limit: { events: 1, window: 10s, scope: global }
    action: partition
"#;

const NO_PARTITION_RULE: &str = r#"
rules:
  - name: deletes
    match: { resources: [pods], operations: [DELETE] }
    limit: { events: 2, window: 10s }
    action: retry-after
"#;

fn policy(yaml: &str) -> Policy {
    Policy::from_yaml(yaml, "test").unwrap_or_else(|e| panic!("{e}"))
}

/// A fresh hold: 3 replicas held at 3, target 0, nothing released yet.
fn set(namespace: &str, name: &str) -> HeldSet {
    HeldSet {
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("{namespace}/{name}"),
        resource_version: "1".into(),
        rule: "rollouts".into(),
        rolling_update: true,
        replicas: 3,
        partition: 3,
        target: Some(0),
        held: Some(3),
        stepped_at: Vec::new(),
        held_since: Some(0),
        released: Released::None,
        nothing_to_roll: false,
        backoff: false,
    }
}

/// The same set after `steps` steps, its last released pod in state `released`.
fn stepped(mut s: HeldSet, steps: u32, released: Released, last_at: Millis) -> HeldSet {
    s.partition -= steps;
    s.held = Some(s.partition);
    s.released = released;
    s.stepped_at = vec![last_at];
    s
}

fn plan_at(held: &[HeldSet], records: &[Record], yaml: &str, now: Millis) -> StepPlan {
    let policy = policy(yaml);
    let mut limiter = Limiter::new(1_000);
    plan_steps(
        &StepInputs {
            held,
            records,
            policy: &policy,
            now,
            max_moves: 100,
        },
        &mut limiter,
    )
}

/// One-line descriptions of the moves, for table comparisons.
fn described(plan: &StepPlan, held: &[HeldSet]) -> Vec<String> {
    plan.moves
        .iter()
        .map(|m| {
            let s = &held[m.index()];
            match m {
                Move::Step { from, to, why, .. } => {
                    format!("{}: step {from}->{to} {}", s.name, why.as_str())
                }
                Move::Finish { keep_record, .. } => {
                    format!(
                        "{}: finish{}",
                        s.name,
                        if *keep_record { " +record" } else { "" }
                    )
                }
                Move::LetGo { why, .. } => format!("{}: let go {}", s.name, why.as_str()),
            }
        })
        .collect()
}

#[test]
fn table_of_single_sets() {
    let now = 100_000;
    let with = |f: &dyn Fn(&mut HeldSet)| {
        let mut s = set("shop", "db");
        f(&mut s);
        s
    };
    // (case, set, policy, expected moves, not-ready after the plan)
    let cases: Vec<(&str, HeldSet, &str, Vec<&str>, u32)> = vec![
        (
            "fresh hold: first step releases the highest ordinal",
            set("shop", "db"),
            POLICY,
            vec!["db: step 3->2 rate"],
            1,
        ),
        (
            "previous pod not Ready yet: wait, and it counts as not Ready",
            stepped(set("shop", "db"), 1, Released::Pending, now - 1_000),
            POLICY,
            vec![],
            1,
        ),
        (
            "previous pod updated and Ready: next step",
            stepped(set("shop", "db"), 1, Released::Settled, now - 1_000),
            POLICY,
            vec!["db: step 2->1 rate"],
            1,
        ),
        (
            "target reached, last pod Ready, step inside the window: finish, keep the record",
            stepped(set("shop", "db"), 3, Released::Settled, now - 1_000),
            POLICY,
            vec!["db: finish +record"],
            0,
        ),
        (
            "target reached, last step out of every window: finish, drop everything",
            stepped(set("shop", "db"), 3, Released::Settled, now - 60_000),
            POLICY,
            vec!["db: finish"],
            0,
        ),
        (
            "target reached, last pod not Ready: keep holding",
            stepped(set("shop", "db"), 3, Released::Pending, now - 1_000),
            POLICY,
            vec![],
            1,
        ),
        (
            "a writer's target 1 (e.g. a canary): stops at 1",
            with(&|s| {
                s.target = Some(1);
                s.partition = 2;
                s.held = Some(2);
                s.released = Released::Settled;
            }),
            POLICY,
            vec!["db: step 2->1 rate"],
            1,
        ),
        (
            "someone the webhook does not pace set the partition: let go, keep their value",
            with(&|s| s.partition = 0),
            POLICY,
            vec!["db: let go partition-moved"],
            0,
        ),
        (
            "held annotation missing: let go",
            with(&|s| s.held = None),
            POLICY,
            vec!["db: let go partition-moved"],
            0,
        ),
        (
            "strategy switched to OnDelete: let go",
            with(&|s| s.rolling_update = false),
            POLICY,
            vec!["db: let go not-rolling-update"],
            0,
        ),
        (
            "unreadable target: let go",
            with(&|s| s.target = None),
            POLICY,
            vec!["db: let go unreadable-target"],
            0,
        ),
        (
            "every pod already at the update revision: straight to the target, uncharged",
            with(&|s| s.nothing_to_roll = true),
            POLICY,
            vec!["db: step 3->0 nothing-to-roll"],
            0,
        ),
        (
            "scaled down to 1 while held at 3: the next step releases ordinal 0",
            with(&|s| s.replicas = 1),
            POLICY,
            vec!["db: step 3->0 rate"],
            1,
        ),
        (
            "scaled to 0 while held: nothing to roll",
            with(&|s| s.replicas = 0),
            POLICY,
            vec!["db: step 3->0 nothing-to-roll"],
            0,
        ),
        (
            "scaled up to 5 while held at 2: the next step releases ordinal 1",
            with(&|s| {
                s.replicas = 5;
                s.partition = 2;
                s.held = Some(2);
                s.released = Released::Settled;
            }),
            POLICY,
            vec!["db: step 2->1 rate"],
            1,
        ),
        (
            "a refused patch and no change since: no move, still counted",
            with(&|s| {
                s.backoff = true;
                s.partition = 2;
                s.held = Some(2);
                s.released = Released::Pending;
            }),
            POLICY,
            vec![],
            1,
        ),
        (
            "the policy paces no rollouts any more: straight to the target",
            set("shop", "db"),
            NO_PARTITION_RULE,
            vec!["db: step 3->0 rule-gone"],
            0,
        ),
        (
            "the policy paces no rollouts any more, at the target: finish without waiting",
            stepped(set("shop", "db"), 3, Released::Pending, now - 1_000),
            NO_PARTITION_RULE,
            vec!["db: finish"],
            0,
        ),
    ];
    for (case, s, yaml, want, not_ready) in cases {
        let held = vec![s];
        let plan = plan_at(&held, &[], yaml, now);
        assert_eq!(described(&plan, &held), want, "{case}");
        let counted = plan.not_ready.get("rollouts").copied().unwrap_or(0);
        assert_eq!(counted, not_ready, "{case}: not ready");
    }
}

#[test]
fn a_renamed_rule_hands_its_sets_to_the_first_partition_rule() {
    let mut s = set("shop", "db");
    s.rule = "renamed-away".into();
    let held = vec![s];
    let plan = plan_at(&held, &[], POLICY, 0);
    assert!(matches!(
        &plan.moves[..],
        [Move::Step { rule: Some(r), why: StepWhy::Rate, .. }] if &**r == "rollouts"
    ));
    // A set naming the second rule is paced by it.
    let mut s = set("special", "db");
    s.rule = "other-rollouts".into();
    let held = vec![s.clone(), s];
    let plan = plan_at(&held, &[], POLICY, 0);
    assert_eq!(plan.moves.len(), 1, "1 per 10s for other-rollouts");
}

#[test]
fn the_rate_holds_and_the_plan_wakes_when_the_window_opens() {
    let held: Vec<HeldSet> = (0..5).map(|i| set("shop", &format!("db-{i}"))).collect();
    let policy = policy(POLICY);
    let mut limiter = Limiter::new(1_000);
    let mut plan = |now: Millis, held: &[HeldSet]| {
        plan_steps(
            &StepInputs {
                held,
                records: &[],
                policy: &policy,
                now,
                max_moves: 100,
            },
            &mut limiter,
        )
    };
    let first = plan(1_000, &held);
    assert_eq!(first.moves.len(), 2, "2 per 10s");
    assert_eq!(first.wake_at, Some(11_000));
    assert_eq!(first.waiting.len(), 1);
    assert_eq!(first.waiting[0].sets, 3);
    assert_eq!(first.waiting[0].blocked, Blocked::Rate);
    assert_eq!(first.waiting[0].next_in_ms, Some(10_000));
    assert_eq!(first.waiting[0].rule_pods, 15);
    // The stepped sets now wait for their pods; the others still for the rate.
    let mut next: Vec<HeldSet> = held.clone();
    for m in &first.moves {
        next[m.index()] = stepped(held[m.index()].clone(), 1, Released::Pending, 1_000);
    }
    assert!(plan(5_000, &next).moves.is_empty());
    // The window has room for 2 again, but maxNotReady (3) leaves room for 1.
    assert_eq!(plan(11_000, &next).moves.len(), 1);
}

#[test]
fn namespaces_take_turns_and_sets_least_recently_stepped_go_first() {
    let now = 100_000;
    let mut held = vec![
        stepped(set("a", "a1"), 1, Released::Settled, now - 3_000),
        stepped(set("a", "a2"), 1, Released::Settled, now - 5_000),
        set("a", "a3"),
        set("b", "b1"),
    ];
    held[2].held_since = Some(now - 1_000);
    // b was served last (a record of a set in b that finished a second ago): a goes first.
    let records = vec![Record {
        namespace: "b".into(),
        name: "old".into(),
        uid: "b/old".into(),
        rule: "rollouts".into(),
        stepped_at: vec![now - 1_000],
    }];
    let plan = plan_at(&held, &records, POLICY, now);
    assert_eq!(
        described(&plan, &held),
        vec!["a3: step 3->2 rate", "b1: step 3->2 rate"],
        "a's never-stepped set first, then b's turn"
    );
    // With room for 4 (two rounds), a's sets go least recently stepped first.
    let roomy = POLICY
        .replace("events: 2", "events: 4")
        .replace("maxNotReady: 3", "maxNotReady: 10");
    let plan = plan_at(&held, &records, &roomy, now);
    assert_eq!(
        described(&plan, &held),
        vec![
            "a3: step 3->2 rate",
            "b1: step 3->2 rate",
            "a2: step 2->1 rate",
            "a1: step 2->1 rate"
        ]
    );
    // The record stays until its step leaves the window.
    assert_eq!(plan.cleanups, Vec::<usize>::new());
    assert_eq!(plan.wake_at, Some(now + 9_000));
}

#[test]
fn max_not_ready_counts_pods_released_by_steps() {
    let now = 100_000;
    let held = vec![
        stepped(set("a", "p1"), 1, Released::Pending, now - 1_000),
        stepped(set("a", "p2"), 1, Released::Pending, now - 1_000),
        set("b", "f1"),
        set("c", "f2"),
    ];
    let roomy = POLICY.replace("events: 2", "events: 50");
    let plan = plan_at(&held, &[], &roomy, now);
    assert_eq!(plan.moves.len(), 1, "2 pending + 1 step = maxNotReady 3");
    assert_eq!(plan.not_ready.get("rollouts"), Some(&3));
    assert_eq!(plan.waiting.len(), 1);
    assert_eq!(
        plan.waiting[0].blocked,
        Blocked::NotReady {
            not_ready: 3,
            max: 3
        }
    );
    assert_eq!(plan.waiting[0].next_in_ms, None);
}

#[test]
fn seeding_from_step_times_opens_no_burst_and_never_charges_twice() {
    let now = 100_000;
    let policy = policy(POLICY);
    let held = vec![
        stepped(set("a", "s1"), 1, Released::Settled, now - 4_000),
        set("b", "fresh"),
    ];
    let records = vec![Record {
        namespace: "c".into(),
        name: "done".into(),
        uid: "c/done".into(),
        rule: "rollouts".into(),
        stepped_at: vec![now - 30_000, now - 2_000],
    }];
    let mut limiter = Limiter::new(1_000);
    let mut charged = Charged::default();
    let seeded = seed_steps(&mut limiter, &policy, &held, &records, &mut charged, now);
    assert_eq!(seeded, 2, "the two steps inside the 10 s window");
    assert_eq!(
        seed_steps(&mut limiter, &policy, &held, &records, &mut charged, now),
        0,
        "seeding again charges nothing twice"
    );
    let inputs = StepInputs {
        held: &held,
        records: &records,
        policy: &policy,
        now,
        max_moves: 100,
    };
    let plan = plan_steps(&inputs, &mut limiter);
    assert!(
        plan.moves.is_empty(),
        "the window is full: {:?}",
        plan.moves
    );
    assert_eq!(
        plan.wake_at,
        Some(now + 6_000),
        "when the older step leaves"
    );
    let plan = plan_steps(
        &StepInputs {
            now: now + 6_000,
            ..inputs
        },
        &mut limiter,
    );
    assert_eq!(plan.moves.len(), 1);
}

#[test]
fn records_are_cleaned_up_once_their_steps_leave_every_window() {
    let now = 100_000;
    let record = |stepped_at: Vec<Millis>, rule: &str| Record {
        namespace: "a".into(),
        name: "r".into(),
        uid: "a/r".into(),
        rule: rule.into(),
        stepped_at,
    };
    let records = vec![
        record(vec![now - 3_000], "rollouts"),
        record(vec![now - 10_000], "rollouts"),
        record(vec![], ""),
        record(vec![now - 3_000], "gone"),
    ];
    let plan = plan_at(&[], &records, POLICY, now);
    assert_eq!(plan.cleanups, vec![1, 2]);
    assert_eq!(plan.wake_at, Some(now + 7_000));
    let plan = plan_at(&[], &records, NO_PARTITION_RULE, now);
    assert_eq!(
        plan.cleanups,
        vec![1, 2],
        "longest window of the policy: 10 s"
    );
}

#[test]
fn step_records_keep_the_window_and_are_bounded() {
    assert_eq!(
        stepped_at_after(&[1_000, 5_000, 9_000], 10_000, 12_000),
        vec![5_000, 9_000, 12_000]
    );
    let many: Vec<Millis> = (0..150).collect();
    let kept = stepped_at_after(&many, 10_000, 200);
    assert_eq!(kept.len(), MAX_STEP_RECORDS);
    assert_eq!(kept.last(), Some(&200));
}

#[test]
fn at_most_max_moves_per_round_then_again_at_once() {
    let held: Vec<HeldSet> = (0..5)
        .map(|i| {
            let mut s = set("a", &format!("s{i}"));
            s.nothing_to_roll = true;
            s
        })
        .collect();
    let policy = policy(POLICY);
    let mut limiter = Limiter::new(1_000);
    let plan = plan_steps(
        &StepInputs {
            held: &held,
            records: &[],
            policy: &policy,
            now: 7,
            max_moves: 3,
        },
        &mut limiter,
    );
    assert_eq!(plan.moves.len(), 3);
    assert_eq!(plan.wake_at, Some(7));
    assert_eq!(plan.held.get("rollouts"), Some(&5));
}
