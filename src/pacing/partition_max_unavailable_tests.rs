//! The step plan for sets with `rollingUpdate.maxUnavailable` k > 1: up to k steps of a
//! set in flight, each charged at the rule's rate as before.

use super::tests::{described, plan_at, set, settled, POLICY};
use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Room for many steps: 10 per 10 s, maxNotReady 10.
fn roomy() -> String {
    POLICY
        .replace("events: 2, burst: 2", "events: 10, burst: 10")
        .replace("maxNotReady: 3", "maxNotReady: 10")
}

/// A set of `replicas` with maxUnavailable `k`, held at `partition`, target 0, its
/// looked-at pods as given (the last step's first, then the ordinals above it).
fn rolling(k: u32, replicas: u32, partition: u32, looked: &[Released]) -> HeldSet {
    let mut s = set("shop", "db");
    s.max_unavailable = k;
    s.replicas = replicas;
    s.partition = partition;
    s.held = Some(partition);
    s.released = looked.first().copied().unwrap_or(Released::None);
    s.earlier = looked.iter().skip(1).copied().collect();
    let n = released_ordinals(partition, replicas, k).len();
    assert_eq!(
        looked.len(),
        n,
        "the looked-at pods of {partition}/{replicas}, k {k}"
    );
    s
}

/// (case, set, policy, expected moves, not-ready after the plan)
type Case = (&'static str, HeldSet, String, Vec<&'static str>, u32);

const NOW: Millis = 100_000;

fn at(ms: Millis) -> Released {
    Released::Starting { at: NOW - ms }
}

fn ago(ms: Millis) -> Released {
    settled(NOW - ms)
}

fn with(mut s: HeldSet, f: &dyn Fn(&mut HeldSet)) -> HeldSet {
    f(&mut s);
    s
}

/// Steps up to k in flight, and what still binds them.
fn stepping_cases() -> Vec<Case> {
    use Released::InFlight;
    let roomy = roomy();
    let strict = POLICY.to_string();
    vec![
        (
            "k=3, fresh hold: the first step",
            rolling(3, 6, 6, &[]),
            roomy.clone(),
            vec!["db: step 6->5 rate"],
            1,
        ),
        (
            "k=3, one step in flight: the second goes",
            rolling(3, 6, 5, &[InFlight]),
            roomy.clone(),
            vec!["db: step 5->4 rate"],
            2,
        ),
        (
            "k=3, two in flight: the third goes",
            rolling(3, 6, 4, &[InFlight, at(500)]),
            roomy.clone(),
            vec!["db: step 4->3 rate"],
            3,
        ),
        (
            "k=3, three in flight: the fourth waits",
            rolling(3, 6, 3, &[InFlight, InFlight, at(500)]),
            roomy.clone(),
            vec![],
            3,
        ),
        (
            "k=3, the oldest settled: the next step records its time, it leaves the looked-at pods",
            rolling(3, 6, 3, &[InFlight, at(500), ago(1_000)]),
            roomy.clone(),
            vec!["db: step 3->2 rate record [99000]"],
            3,
        ),
        (
            "k=3, the two newest settled, the oldest starting: waits for it (it would go unseen)",
            rolling(3, 6, 3, &[ago(500), ago(800), at(1_000)]),
            roomy.clone(),
            vec![],
            1,
        ),
        (
            "k=3 near the top: the looked-at pods stop at replicas, two in flight, one more goes",
            rolling(3, 3, 1, &[InFlight, InFlight]),
            roomy.clone(),
            vec!["db: step 1->0 rate"],
            3,
        ),
        (
            "k=3 but the rule's window is full of steps in flight: waits",
            rolling(3, 6, 4, &[InFlight, InFlight]),
            strict.clone(),
            vec![],
            2,
        ),
        (
            "k=3 but the rule's window is full of steps seen deleted: waits",
            rolling(3, 6, 4, &[at(1_000), at(1_500)]),
            strict.clone(),
            vec![],
            2,
        ),
    ]
}

/// The end of a hold, moves that re-create nothing, letting go, and k = 1 or capped.
fn other_cases() -> Vec<Case> {
    use Released::InFlight;
    let roomy = roomy();
    vec![
        (
            "k=3 at the target, the last pod starting: keeps holding",
            rolling(3, 6, 0, &[at(1_000), ago(2_000), ago(3_000)]),
            roomy.clone(),
            vec![],
            1,
        ),
        (
            "k=3 at the target, every pod settled: finish, recording every looked-at pod",
            rolling(3, 6, 0, &[ago(1_000), ago(2_000), ago(3_000)]),
            roomy.clone(),
            vec!["db: finish record [97000, 98000, 99000]"],
            0,
        ),
        (
            "k=3, nothing to roll but a pod still starting: waits for it",
            with(rolling(3, 6, 4, &[at(1_000), ago(2_000)]), &|s| {
                s.nothing_to_roll = true
            }),
            roomy.clone(),
            vec![],
            1,
        ),
        (
            "k=3, nothing to roll, every pod settled: straight to the target, recording them",
            with(rolling(3, 6, 4, &[ago(1_000), ago(2_000)]), &|s| {
                s.nothing_to_roll = true
            }),
            roomy.clone(),
            vec!["db: step 4->0 nothing-to-roll record [98000, 99000]"],
            0,
        ),
        (
            "k=3, someone else set the partition: let go, recording every pod seen deleted",
            with(
                rolling(3, 6, 3, &[ago(1_000), ago(2_000), InFlight]),
                &|s| s.held = Some(4),
            ),
            roomy.clone(),
            vec!["db: let go partition-moved record [98000, 99000]"],
            1,
        ),
        (
            "k=50 is capped at 10 steps in flight",
            rolling(50, 20, 10, &[InFlight; 10]),
            roomy.clone(),
            vec![],
            10,
        ),
        (
            "k=1 (unchanged): the previous pod in flight, wait",
            rolling(1, 6, 3, &[InFlight]),
            roomy.clone(),
            vec![],
            1,
        ),
        (
            "k=1 (unchanged): the previous pod settled, next step, recording it",
            rolling(1, 6, 3, &[ago(1_000)]),
            roomy.clone(),
            vec!["db: step 3->2 rate record [99000]"],
            1,
        ),
        (
            "k=0 reads as 1",
            rolling(0, 6, 3, &[at(1_000)]),
            roomy.clone(),
            vec![],
            1,
        ),
    ]
}

#[test]
fn table_of_sets_with_max_unavailable() {
    for (case, s, yaml, want, not_ready) in stepping_cases().into_iter().chain(other_cases()) {
        let held = vec![s];
        let plan = plan_at(&held, &[], &yaml, NOW);
        assert_eq!(described(&plan, &held), want, "{case}");
        let counted = plan.not_ready.get("rollouts").copied().unwrap_or(0);
        assert_eq!(counted, not_ready, "{case}: not ready");
    }
}

#[test]
fn max_not_ready_counts_each_unsettled_pod() {
    let now = 100_000;
    let yaml = roomy().replace("maxNotReady: 10", "maxNotReady: 5");
    let mut a = rolling(
        3,
        6,
        4,
        &[Released::InFlight, Released::Starting { at: now - 1 }],
    );
    a.namespace = "a".into();
    let mut b = a.clone();
    b.namespace = "b".into();
    b.uid = "b/db".into();
    let held = vec![a, b];
    let plan = plan_at(&held, &[], &yaml, now);
    assert_eq!(plan.moves.len(), 1, "4 unsettled + 1 step = maxNotReady 5");
    assert_eq!(plan.not_ready.get("rollouts"), Some(&5));
    assert_eq!(
        plan.waiting[0].blocked,
        Blocked::NotReady {
            not_ready: 5,
            max: 5
        }
    );
}

/// Each looked-at pod counts once in the windows: at its own time until a step takes it
/// out of the looked-at ordinals, then in `partition-stepped-at`.
#[test]
fn each_step_counts_once_whether_looked_at_or_recorded() {
    let now = 100_000;
    let mut s = rolling(
        3,
        6,
        3,
        &[
            Released::InFlight,
            Released::Starting { at: now - 1_000 },
            settled(now - 2_000),
        ],
    );
    s.stepped_at = vec![now - 5_000];
    let held = vec![s.clone()];
    let plan = plan_at(&held, &[], &roomy(), now);
    assert_eq!(
        described(&plan, &held),
        vec!["db: step 3->2 rate record [95000, 98000]"]
    );
    assert_eq!(
        plan.in_window.get("rollouts"),
        Some(&5),
        "4 before, 1 taken"
    );
    // As the step left it: the settled pod is in the record, no longer looked at.
    let mut after = s;
    after.partition = 2;
    after.held = Some(2);
    after.stepped_at = vec![now - 5_000, now - 2_000];
    after.released = Released::InFlight;
    after.earlier = vec![Released::InFlight, Released::Starting { at: now - 1_000 }];
    let plan = plan_at(&[after], &[], &roomy(), now + 10);
    assert!(plan.moves.is_empty(), "3 unsettled");
    assert_eq!(plan.in_window.get("rollouts"), Some(&5));
}

/// What the plan's moves and the pods' observations make of one set in the property.
#[derive(Debug, Clone)]
struct Model {
    k: u32,
    replicas: u32,
    partition: u32,
    stepped_at: Vec<Millis>,
    /// Per ordinal released by a step: deleted at, seen deleted at, settled.
    pods: BTreeMap<u32, (Option<Millis>, Option<Millis>, bool)>,
    finished: bool,
}

impl Model {
    fn held(&self, index: usize) -> HeldSet {
        let mut s = set(&format!("ns-{}", index % 2), &format!("s{index}"));
        s.max_unavailable = self.k;
        s.replicas = self.replicas;
        s.partition = self.partition;
        s.held = Some(self.partition);
        s.stepped_at = self.stepped_at.clone();
        s.unlooked();
        let ordinals = released_ordinals(self.partition, self.replicas, self.k);
        for (slot, ordinal) in ordinals.enumerate() {
            let released = match self.pods.get(&ordinal) {
                Some((_, Some(at), true)) => Released::Settled { at: *at },
                Some((_, Some(at), false)) => Released::Starting { at: *at },
                _ => Released::InFlight,
            };
            if let Some(r) = s.looked_mut(slot) {
                *r = released;
            }
        }
        s
    }

    fn unsettled(&self) -> usize {
        self.pods.values().filter(|p| !p.2).count()
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Time passes, the releaser looks at the pods and plans.
    Plan(Millis),
    /// The controller deletes an old pod a step released (the n-th not yet deleted).
    Delete(usize, usize),
    /// A deleted pod's replacement becomes updated and Ready.
    Settle(usize, usize),
    /// A new leader: what it knows of each looked-at deletion comes from the stamps.
    Restart,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0u64..3_000).prop_map(Op::Plan),
        3 => (0usize..3, 0usize..4).prop_map(|(s, n)| Op::Delete(s, n)),
        3 => (0usize..3, 0usize..4).prop_map(|(s, n)| Op::Settle(s, n)),
        1 => Just(Op::Restart),
    ];
    prop::collection::vec(op, 1..160)
}

/// Looks at the pods (a deletion not seen yet is seen now, if the set looks at that
/// ordinal), plans, and applies the moves; records steps and checks the set limits.
fn look_and_plan(
    sets: &mut [Model],
    records: &mut Vec<Record>,
    steps: &mut Vec<Millis>,
    yaml: &str,
    now: Millis,
) -> Result<(), TestCaseError> {
    for m in sets.iter_mut().filter(|m| !m.finished) {
        let looked = released_ordinals(m.partition, m.replicas, m.k);
        for (ordinal, pod) in m.pods.iter_mut() {
            if looked.contains(ordinal) && pod.0.is_some() && pod.1.is_none() {
                pod.1 = Some(now);
            }
        }
    }
    let live: Vec<usize> = (0..sets.len()).filter(|&i| !sets[i].finished).collect();
    let held: Vec<HeldSet> = live.iter().map(|&i| sets[i].held(i)).collect();
    let plan = plan_at(&held, records, yaml, now);
    for m in &plan.moves {
        let model = &mut sets[live[m.index()]];
        match m {
            Move::Step { to, record, .. } => {
                if let Some(r) = record {
                    model.stepped_at = r.clone();
                }
                model.partition = *to;
                model.pods.insert(*to, (None, None, false));
                steps.push(now);
            }
            Move::Finish { record, .. } => {
                model.finished = true;
                records.push(Record {
                    namespace: held[m.index()].namespace.clone(),
                    name: held[m.index()].name.clone(),
                    uid: held[m.index()].uid.clone(),
                    rule: "rollouts".into(),
                    stepped_at: record.clone(),
                });
            }
            Move::LetGo { .. } => prop_assert!(false, "nothing lets go here: {m:?}"),
        }
    }
    let mut not_ready = 0;
    for m in sets.iter() {
        prop_assert!(
            m.unsettled() <= m.k.max(1) as usize,
            "{} unsettled released pods, k {}: {m:?}",
            m.unsettled(),
            m.k
        );
        // Every released pod the set does not look at has settled.
        let looked = released_ordinals(m.partition, m.replicas, m.k);
        for (ordinal, pod) in &m.pods {
            prop_assert!(looked.contains(ordinal) || pod.2, "{ordinal} unseen: {m:?}");
        }
        not_ready += m.unsettled();
    }
    prop_assert!(
        not_ready <= 5,
        "{not_ready} released pods not Ready, maxNotReady 5"
    );
    Ok(())
}

fn nth_pod(
    m: &mut Model,
    n: usize,
    which: impl Fn(&(Option<Millis>, Option<Millis>, bool)) -> bool,
) -> Option<&mut (Option<Millis>, Option<Millis>, bool)> {
    let mut pods: Vec<_> = m.pods.values_mut().filter(|p| which(p)).collect();
    let len = pods.len();
    (len > 0).then(|| pods.swap_remove(n % len))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever the order in which the controller deletes the released pods and their
    /// replacements become Ready, and across restarts of the releaser (a new leader
    /// knows a looked-at deletion only from the pod's stamps, the second after it), no
    /// 10 s window holds more steps or deletions than the limit, no set has more than
    /// k unsettled released pods (nor the rule more than maxNotReady), and every set
    /// converges once its pods settle.
    #[test]
    fn up_to_k_in_flight_per_set_within_the_rate(
        shapes in prop::collection::vec((1u32..4, 2u32..7), 3),
        ops in ops(),
    ) {
        let yaml = POLICY
            .replace("events: 2, burst: 2", "events: 3, burst: 3")
            .replace("maxNotReady: 3", "maxNotReady: 5");
        let mut sets: Vec<Model> = shapes
            .iter()
            .map(|&(k, replicas)| Model {
                k,
                replicas,
                partition: replicas,
                stepped_at: Vec::new(),
                pods: BTreeMap::new(),
                finished: false,
            })
            .collect();
        let (mut records, mut steps, mut deletions) = (Vec::new(), Vec::new(), Vec::new());
        let mut now: Millis = 1_000_000;
        let drain = (0..300).map(|_| None);
        for op in ops.into_iter().map(Some).chain(drain) {
            match op {
                Some(Op::Plan(ms)) => {
                    now += ms;
                    look_and_plan(&mut sets, &mut records, &mut steps, &yaml, now)?;
                }
                Some(Op::Delete(s, n)) => {
                    if let Some(p) = nth_pod(&mut sets[s], n, |p| p.0.is_none()) {
                        p.0 = Some(now);
                        deletions.push(now);
                    }
                }
                Some(Op::Settle(s, n)) => {
                    if let Some(p) = nth_pod(&mut sets[s], n, |p| p.0.is_some() && !p.2) {
                        p.2 = true;
                    }
                }
                Some(Op::Restart) => {
                    for m in sets.iter_mut().filter(|m| !m.finished) {
                        let looked = released_ordinals(m.partition, m.replicas, m.k);
                        for (ordinal, pod) in m.pods.iter_mut() {
                            if let (true, Some(deleted), Some(seen)) =
                                (looked.contains(ordinal), pod.0, pod.1)
                            {
                                let stamp = deleted - deleted % 1_000 + 1_000;
                                pod.1 = Some(seen.min(stamp));
                            }
                        }
                    }
                }
                None if sets.iter().all(|m| m.finished) => break,
                None => {
                    // Drain: the controller deletes, the pods settle, time passes.
                    for m in sets.iter_mut() {
                        for pod in m.pods.values_mut() {
                            if pod.0.is_none() {
                                pod.0 = Some(now);
                                deletions.push(now);
                            } else if pod.1.is_some() {
                                pod.2 = true;
                            }
                        }
                    }
                    now += 1_000;
                    look_and_plan(&mut sets, &mut records, &mut steps, &yaml, now)?;
                }
            }
        }
        for (what, times) in [("steps", &mut steps), ("deletions", &mut deletions)] {
            times.sort_unstable();
            for (i, &t) in times.iter().enumerate() {
                let inside = times[i..].iter().take_while(|&&u| u < t + 10_000).count();
                prop_assert!(inside <= 3, "{inside} {what} in the 10 s from {t}: {times:?}");
            }
        }
        for m in &sets {
            prop_assert!(m.finished && m.partition == 0, "not converged: {m:?}");
        }
    }
}

#[test]
fn a_parsed_set_looks_at_up_to_k_pods() {
    // (case, partition, replicas, k, looked-at ordinals)
    let cases = [
        ("k=1: the pod at the partition", 2, 5, 1, 2..3),
        ("k=3", 2, 5, 3, 2..5),
        ("k=3 near the top", 3, 5, 3, 3..5),
        ("nothing released yet", 5, 5, 3, 5..5),
        ("held above a smaller size", 7, 5, 3, 5..5),
        ("k=0 reads as 1", 2, 5, 0, 2..3),
        ("k above the cap", 0, 50, 40, 0..MAX_IN_FLIGHT_PER_SET),
    ];
    for (case, partition, replicas, k, want) in cases {
        assert_eq!(released_ordinals(partition, replicas, k), want, "{case}");
    }
}
