use super::*;
use crate::policy::Policy;

pub(super) const POLICY: &str = r#"
rules:
  - name: rollouts
    match: { resources: [statefulsets], operations: [UPDATE] }
    limit: { events: 2, burst: 2, window: 10s, scope: global }
    maxNotReady: 3
    action: partition
  - name: other-rollouts
    match: { resources: [statefulsets], operations: [UPDATE], namespaces: [special] }
    limit: { events: 1, burst: 1, window: 10s, scope: global }
    action: partition
"#;

const NO_PARTITION_RULE: &str = r#"
rules:
  - name: deletes
    match: { resources: [pods], operations: [DELETE] }
    limit: { events: 2, burst: 2, window: 10s }
    action: retry-after
"#;

fn policy(yaml: &str) -> Policy {
    Policy::from_yaml(yaml, "test").unwrap_or_else(|e| panic!("{e}"))
}

/// A fresh hold: 3 replicas held at 3, target 0, nothing released yet.
pub(super) fn set(namespace: &str, name: &str) -> HeldSet {
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
        earlier: Vec::new(),
        max_unavailable: 1,
        nothing_to_roll: false,
        backoff: false,
    }
}

/// The same set after `steps` steps, its last released pod in state `released`.
fn stepped(mut s: HeldSet, steps: u32, released: Released) -> HeldSet {
    s.partition -= steps;
    s.held = Some(s.partition);
    s.released = released;
    s
}

pub(super) fn settled(at: Millis) -> Released {
    Released::Settled { at }
}

pub(super) fn plan_at(held: &[HeldSet], records: &[Record], yaml: &str, now: Millis) -> StepPlan {
    let policy = policy(yaml);
    plan_steps(&StepInputs {
        held,
        records,
        taken: &[],
        policy: &policy,
        now,
        max_moves: 100,
        network_room: None,
    })
}

/// One-line descriptions of the moves, for table comparisons.
pub(super) fn described(plan: &StepPlan, held: &[HeldSet]) -> Vec<String> {
    plan.moves
        .iter()
        .map(|m| {
            let s = &held[m.index()];
            match m {
                Move::Step {
                    from,
                    to,
                    why,
                    record,
                    ..
                } => format!(
                    "{}: step {from}->{to} {}{}",
                    s.name,
                    why.as_str(),
                    record
                        .as_ref()
                        .map(|r| format!(" record {r:?}"))
                        .unwrap_or_default()
                ),
                Move::Finish { record, .. } => format!("{}: finish record {record:?}", s.name),
                Move::LetGo { why, record, .. } => {
                    format!("{}: let go {} record {record:?}", s.name, why.as_str())
                }
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
            "fresh hold: the first step releases the highest ordinal",
            set("shop", "db"),
            POLICY,
            vec!["db: step 3->2 rate"],
            1,
        ),
        (
            "the previous pod not yet re-created: wait; it counts as not Ready",
            stepped(set("shop", "db"), 1, Released::InFlight),
            POLICY,
            vec![],
            1,
        ),
        (
            "the previous pod re-created, not Ready: wait",
            stepped(set("shop", "db"), 1, Released::Starting { at: now - 500 }),
            POLICY,
            vec![],
            1,
        ),
        (
            "the previous pod updated and Ready: next step, recording when it was re-created",
            stepped(set("shop", "db"), 1, settled(now - 1_000)),
            POLICY,
            vec!["db: step 2->1 rate record [99000]"],
            1,
        ),
        (
            "target reached, last pod Ready, its step inside the window: finish, keep the record",
            stepped(set("shop", "db"), 3, settled(now - 1_000)),
            POLICY,
            vec!["db: finish record [99000]"],
            0,
        ),
        (
            "target reached, the steps out of every window: finish, drop everything",
            stepped(set("shop", "db"), 3, settled(now - 60_000)),
            POLICY,
            vec!["db: finish record []"],
            0,
        ),
        (
            "target reached, last pod not Ready: keep holding",
            stepped(set("shop", "db"), 3, Released::Starting { at: now - 1_000 }),
            POLICY,
            vec![],
            1,
        ),
        (
            "a writer's target 1 (a canary): stops at 1",
            with(&|s| {
                s.target = Some(1);
                s.partition = 2;
                s.held = Some(2);
                s.released = settled(now - 20_000);
            }),
            POLICY,
            vec!["db: step 2->1 rate"],
            1,
        ),
        (
            "someone the webhook does not pace set the partition: let go, keep their value",
            with(&|s| s.partition = 0),
            POLICY,
            vec!["db: let go partition-moved record []"],
            0,
        ),
        (
            "held annotation missing: let go",
            with(&|s| s.held = None),
            POLICY,
            vec!["db: let go partition-moved record []"],
            0,
        ),
        (
            "strategy switched to OnDelete: let go",
            with(&|s| s.rolling_update = false),
            POLICY,
            vec!["db: let go not-rolling-update record []"],
            0,
        ),
        (
            "unreadable target: let go",
            with(&|s| s.target = None),
            POLICY,
            vec!["db: let go unreadable-target record []"],
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
                s.released = settled(now - 20_000);
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
                s.released = Released::InFlight;
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
            stepped(set("shop", "db"), 3, Released::InFlight),
            NO_PARTITION_RULE,
            vec!["db: finish record []"],
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
    // Sets naming the second rule are paced by it: 1 per 10 s.
    let mut s = set("special", "db");
    s.rule = "other-rollouts".into();
    let mut t = s.clone();
    t.name = "db2".into();
    let plan = plan_at(&[s, t], &[], POLICY, 0);
    assert_eq!(plan.moves.len(), 1);
}

#[test]
fn a_step_counts_as_now_until_its_old_pod_is_seen_deleted() {
    let yaml = POLICY.replace("maxNotReady: 3", "maxNotReady: 10");
    let held: Vec<HeldSet> = (0..5).map(|i| set("shop", &format!("db-{i}"))).collect();
    let plan = plan_at(&held, &[], &yaml, 1_000);
    assert_eq!(plan.moves.len(), 2, "2 per 10 s");
    assert_eq!(plan.wake_at, None, "the window is full of steps in flight");
    assert_eq!(plan.waiting.len(), 1);
    assert_eq!(plan.waiting[0].sets, 3);
    assert_eq!(plan.waiting[0].blocked, Blocked::Rate);
    assert_eq!(plan.waiting[0].next_in_ms, None);
    assert_eq!(plan.waiting[0].rule_pods, 15);
    assert_eq!(plan.in_window.get("rollouts"), Some(&2));

    let mut next = held.clone();
    let stepped_idx: Vec<usize> = plan.moves.iter().map(Move::index).collect();
    for &i in &stepped_idx {
        next[i] = stepped(held[i].clone(), 1, Released::InFlight);
    }
    // Long after the step, still in flight: still counted, nothing goes.
    assert!(plan_at(&next, &[], &yaml, 60_000).moves.is_empty());
    // Seen deleted at 3 s and 4 s: they count there, so the window opens at 13 s.
    next[stepped_idx[0]].released = Released::Starting { at: 3_000 };
    next[stepped_idx[1]].released = Released::Starting { at: 4_000 };
    let plan = plan_at(&next, &[], &yaml, 5_000);
    assert!(plan.moves.is_empty());
    assert_eq!(plan.wake_at, Some(13_000));
    assert_eq!(plan.waiting[0].next_in_ms, Some(8_000));
    let plan = plan_at(&next, &[], &yaml, 13_000);
    assert_eq!(plan.moves.len(), 1, "one leaves at 13 s");
    assert_eq!(plan.wake_at, Some(14_000));
}

/// The property the windows are for: whatever the controller's delay between a step and
/// the deletion it causes, however long the old pod takes to stop and the new one to be
/// Ready, and across restarts of the releaser (a new leader knows only the sets: the
/// recorded times, and a deletion it finds already done counted from the API server's
/// stamp, the second after it), no window holds more steps or deletions than the limit.
/// Terminations overlap: with pods that stop slowly the steps still go at the rate.
#[test]
fn no_window_of_steps_or_deletions_exceeds_the_limit_whatever_the_delays_and_restarts() {
    let yaml = POLICY
        .replace("events: 2, burst: 2", "events: 3, burst: 3")
        .replace("maxNotReady: 3", "maxNotReady: 50");
    for seed in 1..=30u64 {
        let mut rng = seed;
        let mut next = move |bound: u64| {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) % bound
        };
        // Long terminations in half the seeds: steps must overlap them.
        let terminate_max = if seed % 2 == 0 { 60_000 } else { 2_000 };
        let mut held: Vec<HeldSet> = (0..8)
            .map(|i| set(&format!("ns-{}", i % 3), &format!("s{i}")))
            .collect();
        // Per set, the current step's pod: (deleted at, seen deleted at, Ready at).
        let mut pending: Vec<Option<(Millis, Millis, Millis)>> = vec![None; held.len()];
        let (mut deletions, mut steps, mut outages) = (Vec::new(), Vec::new(), Vec::new());
        let mut now = 0;
        let mut restarts = 0;
        while now < 1_200_000 && steps.len() < 24 {
            if next(40) == 0 {
                // A new leader: what it sees of each pod, from the cluster alone.
                restarts += 1;
                for (i, s) in held.iter_mut().enumerate() {
                    if let (Some((deleted, _, _)), Released::Starting { at }) =
                        (pending[i], s.released)
                    {
                        let stamp = deleted - deleted % 1_000 + 1_000;
                        s.released = Released::Starting { at: at.min(stamp) };
                    }
                }
            }
            for (i, s) in held.iter_mut().enumerate() {
                let Some((_, seen, ready)) = pending[i] else {
                    continue;
                };
                if seen <= now {
                    let at = s.released.seen_at().unwrap_or(seen);
                    s.released = if ready <= now {
                        pending[i] = None;
                        Released::Settled { at }
                    } else {
                        Released::Starting { at }
                    };
                }
            }
            let plan = plan_at(&held, &[], &yaml, now);
            for m in &plan.moves {
                if let Move::Step {
                    index, to, record, ..
                } = m
                {
                    let s = &mut held[*index];
                    if let Some(r) = record {
                        s.stepped_at = r.clone();
                    }
                    s.partition = *to;
                    s.held = Some(*to);
                    s.released = Released::InFlight;
                    let deleted = now + next(3_000);
                    let seen = deleted + next(300);
                    let ready = deleted + next(terminate_max) + next(5_000);
                    pending[*index] = Some((deleted, seen, ready.max(seen)));
                    outages.push((deleted, ready.max(seen)));
                    deletions.push(deleted);
                    steps.push(now);
                }
            }
            now += 1 + next(700);
        }
        for (what, times) in [("deletions", &mut deletions), ("steps", &mut steps)] {
            times.sort_unstable();
            for (i, &t) in times.iter().enumerate() {
                let in_window = times[i..].iter().take_while(|&&u| u < t + 10_000).count();
                assert!(
                    in_window <= 3,
                    "seed {seed}: {in_window} {what} in the window from {t} ({restarts} restarts)"
                );
            }
        }
        assert_eq!(steps.len(), 24, "seed {seed}: every pod rolled");
        // Slow pods overlap: more pods are down (deleted, not Ready) at once than the
        // limit, which counting a step until its pod is re-created would not allow.
        if terminate_max == 60_000 {
            let most_down = outages
                .iter()
                .map(|&(from, _)| {
                    outages
                        .iter()
                        .filter(|&&(d, r)| d <= from && from < r)
                        .count()
                })
                .max()
                .unwrap_or(0);
            assert!(
                most_down > 3,
                "seed {seed}: at most {most_down} pods down at once"
            );
        }
    }
}

#[test]
fn namespaces_take_turns_and_sets_least_recently_stepped_go_first() {
    let now = 100_000;
    let mut held = vec![
        stepped(set("a", "a1"), 1, settled(now - 13_000)),
        stepped(set("a", "a2"), 1, settled(now - 15_000)),
        set("a", "a3"),
        set("b", "b1"),
    ];
    held[2].held_since = Some(now - 1_000);
    // b was served last (a set in b that finished a second ago): a goes first.
    let records = vec![Record {
        namespace: "b".into(),
        name: "old".into(),
        uid: "b/old".into(),
        rule: "rollouts".into(),
        stepped_at: vec![now - 1_000],
    }];
    let roomy = |events: u32| {
        POLICY
            .replace(
                "events: 2, burst: 2",
                &format!("events: {events}, burst: {events}"),
            )
            .replace("maxNotReady: 3", "maxNotReady: 10")
    };
    let plan = plan_at(&held, &records, &roomy(3), now);
    assert_eq!(
        described(&plan, &held),
        vec!["a3: step 3->2 rate", "b1: step 3->2 rate"],
        "the record in b takes a place in the window; a's never-stepped set first, then b"
    );
    let plan = plan_at(&held, &records, &roomy(5), now);
    assert_eq!(
        described(&plan, &held),
        vec![
            "a3: step 3->2 rate",
            "b1: step 3->2 rate",
            "a2: step 2->1 rate",
            "a1: step 2->1 rate"
        ]
    );
    assert_eq!(plan.cleanups, Vec::<usize>::new());
    assert_eq!(plan.wake_at, Some(now + 9_000), "when the record leaves");
}

#[test]
fn max_not_ready_counts_pods_released_by_steps() {
    let now = 100_000;
    let held = vec![
        stepped(set("a", "p1"), 1, Released::Starting { at: now - 30_000 }),
        stepped(set("a", "p2"), 1, Released::Starting { at: now - 30_000 }),
        set("b", "f1"),
        set("c", "f2"),
    ];
    let roomy = POLICY.replace("events: 2, burst: 2", "events: 50, burst: 50");
    let plan = plan_at(&held, &[], &roomy, now);
    assert_eq!(plan.moves.len(), 1, "2 starting + 1 step = maxNotReady 3");
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
fn a_restart_rebuilds_the_windows_from_the_sets_and_opens_no_burst() {
    let now = 100_000;
    // What a new leader finds: one set in flight, one whose last step was seen at -4 s
    // (recorded or seen again now), a finished set's record at -2 s.
    let held = vec![
        stepped(set("a", "s1"), 1, Released::InFlight),
        stepped(set("a", "s2"), 1, settled(now - 4_000)),
        set("b", "fresh"),
    ];
    let records = vec![Record {
        namespace: "c".into(),
        name: "done".into(),
        uid: "c/done".into(),
        rule: "rollouts".into(),
        stepped_at: vec![now - 30_000, now - 2_000],
    }];
    let roomy = POLICY
        .replace("events: 2, burst: 2", "events: 3, burst: 3")
        .replace("maxNotReady: 3", "maxNotReady: 10");
    let plan = plan_at(&held, &records, &roomy, now);
    assert!(plan.moves.is_empty(), "3 in the window: {:?}", plan.moves);
    assert_eq!(
        plan.wake_at,
        Some(now + 6_000),
        "when the step seen at -4 s leaves"
    );
    let plan = plan_at(&held, &records, &roomy, now + 6_000);
    assert_eq!(described(&plan, &held), vec!["fresh: step 3->2 rate"]);
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
    let mut s = stepped(set("a", "s"), 1, settled(9_000));
    s.stepped_at = vec![1_000, 5_000];
    assert_eq!(record_now(&s, 10_000, 12_000), vec![5_000, 9_000]);
    s.stepped_at = (0..150).collect();
    s.released = settled(200);
    let kept = record_now(&s, 10_000, 300);
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
    let plan = plan_steps(&StepInputs {
        held: &held,
        records: &[],
        taken: &[],
        policy: &policy,
        now: 7,
        max_moves: 3,
        network_room: None,
    });
    assert_eq!(plan.moves.len(), 3);
    assert_eq!(plan.wake_at, Some(7));
    assert_eq!(plan.held.get("rollouts"), Some(&5));
}

/// Burst 1: one step per round however many sets wait, the next one a
/// spacing after the last step taken, not after its pod is seen re-created.
#[test]
fn steps_are_spaced_by_their_decision_times() {
    let yaml = POLICY
        .replace("events: 2, burst: 2", "events: 4, burst: 1")
        .replace("maxNotReady: 3", "maxNotReady: 10");
    let policy = policy(&yaml);
    let spacing = policy.rules[0].limits[0]
        .spacing_ms()
        .expect("burst 1 spaces");
    assert_eq!(spacing, 2_625);
    let held = vec![set("a", "one"), set("b", "two"), set("c", "three")];
    let plan_with = |taken: &[TakenStep], now: Millis| {
        plan_steps(&StepInputs {
            held: &held,
            records: &[],
            taken,
            policy: &policy,
            now,
            max_moves: 100,
            network_room: None,
        })
    };
    let first = plan_with(&[], 1_000);
    assert_eq!(first.moves.len(), 1, "{:?}", described(&first, &held));
    let taken = vec![TakenStep {
        rule: Arc::from("rollouts"),
        namespace: held[first.moves[0].index()].namespace.clone(),
        at: 1_000,
    }];
    // Nothing before the spacing, though the window has room; the wake is the slot.
    let early = plan_with(&taken, 2_000);
    assert!(early.moves.is_empty(), "{:?}", described(&early, &held));
    assert_eq!(early.wake_at, Some(1_000 + spacing));
    let due = plan_with(&taken, 1_000 + spacing);
    assert_eq!(due.moves.len(), 1);
}

/// A spaced limit keeps at most `burst` steps whose old pod is not seen deleted: what the
/// controller deletes late, it cannot then delete together beyond the burst.
#[test]
fn at_most_burst_steps_wait_for_their_deletion() {
    let yaml = POLICY
        .replace("events: 2, burst: 2", "events: 10, burst: 2")
        .replace("maxNotReady: 3", "maxNotReady: 50");
    let now = 100_000;
    let in_flight = |ns: &str| stepped(set(ns, "db"), 1, Released::InFlight);
    let fresh = [set("c", "db"), set("d", "db")];
    // (case, sets in flight, sets whose old pod was seen deleted, steps now)
    let cases = [
        ("none in flight: the burst", 0, 0, 2),
        ("one in flight: one more", 1, 0, 1),
        ("two in flight: none until a deletion is seen", 2, 0, 0),
        ("two stepped, one seen deleted: one more", 1, 1, 1),
    ];
    for (case, flying, seen, want) in cases {
        let mut held: Vec<HeldSet> = (0..flying).map(|i| in_flight(&format!("f{i}"))).collect();
        held.extend((0..seen).map(|i| {
            stepped(
                set(&format!("s{i}"), "db"),
                1,
                Released::Starting { at: now - 100 },
            )
        }));
        held.extend(fresh.iter().cloned());
        let plan = plan_at(&held, &[], &yaml, now);
        let steps = plan
            .moves
            .iter()
            .filter(|m| {
                matches!(
                    m,
                    Move::Step {
                        why: StepWhy::Rate,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(steps, want, "{case}: {:?}", described(&plan, &held));
        if want == 0 {
            assert_eq!(plan.wake_at, None, "{case}: waits for a look, not a time");
        }
    }
}

#[test]
fn an_adaptive_rule_steps_only_with_room_for_the_replacements() {
    let yaml = r#"
rules:
  - name: rollouts
    match: { resources: [statefulsets], operations: [UPDATE] }
    limit: { events: 20, burst: 20, window: 10s, scope: global }
    maxNotReady: 20
    adaptive: true
    action: partition
  - name: fixed
    match: { resources: [statefulsets], operations: [UPDATE], namespaces: [fixed] }
    limit: { events: 20, burst: 20, window: 10s, scope: global }
    maxNotReady: 20
    action: partition
"#;
    let policy = policy(yaml);
    let mut held: Vec<HeldSet> = (0..6).map(|i| set(&format!("ns{i}"), "db")).collect();
    let mut fixed = set("fixed", "db");
    fixed.rule = "fixed".into();
    held.push(fixed);
    // (case, room, adaptive steps, what the adaptive sets wait for)
    let cases: &[(&str, Option<u32>, usize, Option<Blocked>)] = &[
        ("no window", None, 6, None),
        ("room for 2", Some(2), 2, Some(Blocked::Network)),
        (
            "no room: no step (no word from the gate releaser counts as none)",
            Some(0),
            0,
            Some(Blocked::Network),
        ),
    ];
    for (name, room, adaptive, blocked) in cases {
        let plan = plan_steps(&StepInputs {
            held: &held,
            records: &[],
            taken: &[],
            policy: &policy,
            now: 1_000,
            max_moves: 100,
            network_room: *room,
        });
        let steps = |fixed: bool| {
            plan.moves
                .iter()
                .filter(|m| {
                    matches!(m, Move::Step { .. })
                        && (held[m.index()].namespace == "fixed") == fixed
                })
                .count()
        };
        assert_eq!(steps(false), *adaptive, "{name}");
        assert_eq!(
            steps(true),
            1,
            "{name}: a rule that is not adaptive ignores the window"
        );
        let waits: Vec<Blocked> = plan
            .waiting
            .iter()
            .filter(|w| &*w.rule == "rollouts")
            .map(|w| w.blocked)
            .collect();
        match blocked {
            None => assert!(
                waits.iter().all(|b| *b != Blocked::Network),
                "{name}: {waits:?}"
            ),
            Some(b) => assert!(
                !waits.is_empty() && waits.iter().all(|w| w == b),
                "{name}: {waits:?}"
            ),
        }
    }
}

/// A paused rule takes no partition step while its pause lasts, and steps again after.
#[test]
fn a_paused_rule_takes_no_step_until_its_pause_ends() {
    let held = [set("a", "web"), set("b", "db")];
    let mut paused = policy(POLICY);
    for rule in &mut paused.rules {
        rule.paused_until = Some(30_000);
    }
    let inputs = |now| StepInputs {
        held: &held,
        records: &[],
        taken: &[],
        policy: &paused,
        now,
        max_moves: 100,
        network_room: None,
    };
    let plan = plan_steps(&inputs(1_000));
    assert!(plan.moves.is_empty(), "{:?}", described(&plan, &held));
    assert_eq!(plan.wake_at, Some(30_000));
    assert!(plan
        .waiting
        .iter()
        .all(|w| w.blocked == Blocked::Paused { until: 30_000 } && w.next_in_ms == Some(29_000)));
    assert_eq!(plan.waiting.len(), 2);
    let plan = plan_steps(&inputs(30_000));
    assert_eq!(plan.moves.len(), 2, "{:?}", described(&plan, &held));
}
