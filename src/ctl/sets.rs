//! Held StatefulSets in the status report, when each is expected to reach its target, and
//! the predicate `status sts/NAME --wait` waits on. Pure: objects, the policy and `now` in.
//!
//! The windows and the order are the partition releaser's own: `plan_steps` on the sets
//! as the cluster records them (`partition-stepped-at`, the pod of each set's last step),
//! run forward round after round at its wake times. A step's pod is taken as Ready at
//! once, so the estimated end is when the last step can be taken at the rule's rate: the
//! real rollout ends later by the time its last pods take to stop, pass their gate and
//! become Ready.

use super::report::{
    fullest_window, rule_line, seconds_until, Cluster, HeldStatefulSet, RuleStatus, StepPod,
};
use crate::limiter::Millis;
use crate::names::{
    format_time, PARTITION_HELD_ANNOTATION, PARTITION_TARGET_ANNOTATION, RELEASED_BY_ANNOTATION,
};
use crate::objects::statefulsets::{view, PodProgress, View};
use crate::pacing::partition::{
    partition_rule, plan_steps, HeldSet, Move, Record, Released, StepInputs, StepWhy, TakenStep,
};
use crate::policy::{Action, Policy, Rule};
use k8s_openapi::api::apps::v1::StatefulSet;
use std::collections::HashMap;

/// Rounds of the step plan the estimate runs at most; sets not done by then get no time.
const MAX_ROUNDS: usize = 20_000;

/// The last step's state, read from its pod as the partition releaser reads it.
pub fn released_of(set: &HeldSet, step: Option<&StepPod>) -> Released {
    match (set.released, step) {
        (Released::None, _) | (_, None) => set.released,
        (_, Some(s)) => match s.progress {
            PodProgress::NotDeleted => Released::InFlight,
            PodProgress::Deleted | PodProgress::Updated => Released::Starting { at: s.deleted_by },
            PodProgress::Ready => Released::Settled { at: s.deleted_by },
        },
    }
}

/// The sets churn-throttler holds and the records of finished holds, as the releaser reads
/// them, with the objects of the held ones.
pub(super) fn read_sets<'s>(
    sets: &'s [StatefulSet],
    steps: &HashMap<String, StepPod>,
) -> (Vec<HeldSet>, Vec<&'s StatefulSet>, Vec<Record>) {
    let (mut held, mut objects, mut records) = (Vec::new(), Vec::new(), Vec::new());
    for sts in sets {
        match view(sts) {
            View::Held(mut set) => {
                set.released = released_of(&set, steps.get(&set.uid));
                held.push(set);
                objects.push(sts);
            }
            View::Record(record) => records.push(record),
            View::Ignored => {}
        }
    }
    (held, objects, records)
}

/// The step times the sets record, as the decisions a running leader remembers (for the
/// spacing; a leader started now would have none and step at once).
fn taken_of(held: &[HeldSet], records: &[Record], policy: &Policy) -> Vec<TakenStep> {
    let mut taken = Vec::new();
    let mut add = |rule: &str, namespace: &str, times: &mut dyn Iterator<Item = Millis>| {
        if let Some(rule) = partition_rule(policy, rule) {
            for at in times {
                taken.push(TakenStep {
                    rule: rule.name.clone(),
                    namespace: namespace.to_string(),
                    at,
                });
            }
        }
    };
    for set in held {
        let seen = match set.released {
            Released::Starting { at } | Released::Settled { at } => Some(at),
            _ => None,
        };
        add(
            &set.rule,
            &set.namespace,
            &mut set.stepped_at.iter().copied().chain(seen),
        );
    }
    for record in records {
        add(
            &record.rule,
            &record.namespace,
            &mut record.stepped_at.iter().copied(),
        );
    }
    taken.sort_by_key(|t| t.at);
    taken
}

/// When each held set is expected to take its last step: the step plan run forward,
/// every released pod taken as Ready at once. None: let go, or beyond the rounds run.
pub fn estimate_ends(
    held: &[HeldSet],
    records: &[Record],
    policy: &Policy,
    now: Millis,
) -> Vec<Option<Millis>> {
    let mut sets: Vec<HeldSet> = held.to_vec();
    let mut records: Vec<Record> = records.to_vec();
    let mut taken = taken_of(held, records.as_slice(), policy);
    for set in sets.iter_mut() {
        set.backoff = false;
        set.released = match set.released {
            Released::None => Released::None,
            Released::InFlight => Released::Settled { at: now },
            Released::Starting { at } | Released::Settled { at } => Released::Settled { at },
        };
    }
    let mut ends = vec![None; sets.len()];
    let mut live: Vec<usize> = (0..sets.len()).collect();
    let mut t = now;
    for _ in 0..MAX_ROUNDS {
        if live.is_empty() {
            break;
        }
        let current: Vec<HeldSet> = live.iter().map(|&i| sets[i].clone()).collect();
        let plan = plan_steps(&StepInputs {
            held: &current,
            records: &records,
            taken: &taken,
            policy,
            now: t,
            max_moves: usize::MAX,
            network_room: None,
        });
        if plan.moves.is_empty() {
            match plan.wake_at {
                Some(at) if at > t => {
                    t = at;
                    continue;
                }
                _ => break,
            }
        }
        let mut done = Vec::new();
        for m in &plan.moves {
            let i = live[m.index()];
            let set = &mut sets[i];
            match m {
                Move::Step {
                    rule,
                    to,
                    why,
                    record,
                    ..
                } => {
                    set.partition = *to;
                    set.held = Some(*to);
                    if let Some(record) = record {
                        set.stepped_at = record.clone();
                    }
                    // A step at the rate counts from now; a free one counts nowhere.
                    let counted = *why == StepWhy::Rate;
                    set.released = Released::Settled {
                        at: if counted { t } else { 0 },
                    };
                    if let (true, Some(rule)) = (counted, rule) {
                        taken.push(TakenStep {
                            rule: rule.clone(),
                            namespace: set.namespace.clone(),
                            at: t,
                        });
                    }
                }
                Move::Finish { record, .. } => {
                    ends[i] = Some(t);
                    done.push(m.index());
                    records.push(record_of(set, record));
                }
                Move::LetGo { .. } => done.push(m.index()),
            }
        }
        done.sort_unstable();
        for position in done.into_iter().rev() {
            live.remove(position);
        }
    }
    ends
}

fn record_of(set: &HeldSet, stepped_at: &[Millis]) -> Record {
    Record {
        namespace: set.namespace.clone(),
        name: set.name.clone(),
        uid: set.uid.clone(),
        rule: set.rule.clone(),
        stepped_at: stepped_at.to_vec(),
    }
}

/// When one more step of `rule` fits its windows: a probe set asks the step plan, the
/// held sets counted in the windows but not competing.
fn next_step_slot(
    held: &[HeldSet],
    records: &[Record],
    taken: &[TakenStep],
    policy: &Policy,
    rule: &Rule,
    now: Millis,
) -> Millis {
    let mut sets: Vec<HeldSet> = held.to_vec();
    for set in sets.iter_mut() {
        set.backoff = true;
    }
    let probe = sets.len();
    sets.push(HeldSet {
        namespace: String::new(),
        name: String::new(),
        uid: "(probe)".into(),
        resource_version: String::new(),
        rule: rule.name.to_string(),
        rolling_update: true,
        replicas: 1,
        partition: 1,
        target: Some(0),
        held: Some(1),
        stepped_at: Vec::new(),
        held_since: None,
        released: Released::None,
        earlier: Vec::new(),
        max_unavailable: 1,
        nothing_to_roll: false,
        backoff: false,
    });
    let plan = plan_steps(&StepInputs {
        held: &sets,
        records,
        taken,
        policy,
        now,
        max_moves: 1,
        network_room: None,
    });
    if plan.moves.iter().any(|m| m.index() == probe) {
        return now;
    }
    plan.waiting
        .iter()
        .find(|w| w.head == probe)
        .and_then(|w| w.next_in_ms)
        .map_or(now, |ms| now + ms)
}

/// The partition rules' lines and the held StatefulSets.
pub(super) fn held_part(c: &Cluster<'_>) -> (Vec<RuleStatus>, Vec<HeldStatefulSet>, Vec<String>) {
    let policy = c.policy;
    let now = c.now;
    let (held, objects, records) = read_sets(c.sets, c.steps);
    let taken = taken_of(&held, &records, policy);
    let ends = estimate_ends(&held, &records, policy, now);
    let rule_of = |set: &HeldSet| partition_rule(policy, &set.rule).map(|r| r.name.clone());
    let mut lines = Vec::new();
    for rule in policy
        .rules
        .iter()
        .filter(|r| r.action == Action::Partition)
    {
        let Some(first) = rule.limits.first() else {
            continue;
        };
        let mine = |set: &&HeldSet| rule_of(set).as_ref() == Some(&rule.name);
        let times = held.iter().filter(mine).flat_map(|s| {
            let last = match s.released {
                Released::InFlight => Some(now),
                Released::Starting { at } | Released::Settled { at } => Some(at),
                Released::None => None,
            };
            s.stepped_at
                .iter()
                .copied()
                .chain(last)
                .map(|at| (s.namespace.as_str(), None, at))
        });
        let records_times = records
            .iter()
            .filter(|r| partition_rule(policy, &r.rule).is_some_and(|p| p.name == rule.name))
            .flat_map(|r| {
                r.stepped_at
                    .iter()
                    .map(|&at| (r.namespace.as_str(), None, at))
            });
        let window_events = fullest_window(first, times.chain(records_times), now);
        let next = next_step_slot(&held, &records, &taken, policy, rule, now);
        let mut line = rule_line(rule, "partition", window_events, next, now);
        let sets: Vec<(usize, &HeldSet)> =
            held.iter().enumerate().filter(|(_, s)| mine(s)).collect();
        line.waiting = sets.len();
        line.pods_to_step = Some(sets.iter().map(|(_, s)| u64::from(steps_left(s))).sum());
        line.released_not_ready = sets
            .iter()
            .filter(|(_, s)| matches!(s.released, Released::InFlight | Released::Starting { .. }))
            .count() as u32;
        if let Some(last) = sets.iter().filter_map(|(i, _)| ends[*i]).max() {
            line.last_estimated = Some(format_time(last));
            line.last_estimated_in_seconds = Some(seconds_until(last, now).max(0.0));
        }
        lines.push(line);
    }
    let mut out = Vec::new();
    for ((set, sts), end) in held.iter().zip(&objects).zip(&ends) {
        if c.namespace.is_some_and(|ns| ns != set.namespace) {
            continue;
        }
        let status = sts.status.as_ref();
        let count = |v: Option<i32>| v.unwrap_or(0).max(0) as u32;
        out.push(HeldStatefulSet {
            namespace: set.namespace.clone(),
            name: set.name.clone(),
            rule: set.rule.clone(),
            replicas: set.replicas,
            partition: set.partition,
            target: set.target,
            updated_replicas: count(status.and_then(|s| s.updated_replicas)),
            ready_replicas: count(status.and_then(|s| s.ready_replicas)),
            held_since: set.held_since.map(format_time),
            steps_left: steps_left(set),
            estimated_end: end.map(format_time),
            estimated_in_seconds: end.map(|at| seconds_until(at, now).max(0.0)),
        });
    }
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut notes = Vec::new();
    if !held.is_empty() {
        notes.push(
            "held StatefulSets: the estimated end is when the last step can be taken at the rule's \
             rate, each re-created pod taken as Ready at once; the rollout ends when that pod is Ready"
                .to_string(),
        );
    }
    (lines, out, notes)
}

fn steps_left(set: &HeldSet) -> u32 {
    set.partition
        .min(set.replicas)
        .saturating_sub(set.target.unwrap_or(0))
}

/// Where a rollout `status sts/NAME --wait` waits on stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollout {
    /// churn-throttler holds it at `partition` (the annotation `partition-target` is there).
    Held { partition: u32, target: Option<u32> },
    /// Not held, and the StatefulSet controller has not finished: what it waits for.
    Rolling(String),
    /// The hold (if any) has ended at its target and the rollout is complete.
    Complete,
    /// The hold ended with the partition not at its target: churn-throttler let it go
    /// (someone else set the partition, or the strategy changed; `PacingStopped` Event).
    LetGo { partition: u32, target: Option<u32> },
}

/// The state of `sts`; `seen_target`: the target of the hold while it was seen (None:
/// never seen held, then the mark letting go leaves is what tells: `partition-held`
/// without `partition-target`, which finishing removes, and no `released-by`).
pub fn rollout_state(sts: &StatefulSet, seen_target: Option<u32>) -> Rollout {
    let empty = Default::default();
    let annotations = sts.metadata.annotations.as_ref().unwrap_or(&empty);
    let spec = sts.spec.as_ref();
    let strategy = spec.and_then(|s| s.update_strategy.as_ref());
    let partition = strategy
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0)
        .max(0) as u32;
    if let Some(target) = annotations.get(PARTITION_TARGET_ANNOTATION) {
        return Rollout::Held {
            partition,
            target: target.trim().parse().ok(),
        };
    }
    let on_delete = strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete");
    match seen_target {
        Some(target) if partition != target || on_delete => {
            return Rollout::LetGo {
                partition,
                target: Some(target),
            }
        }
        None if annotations.contains_key(PARTITION_HELD_ANNOTATION)
            && !annotations.contains_key(RELEASED_BY_ANNOTATION) =>
        {
            return Rollout::LetGo {
                partition,
                target: None,
            }
        }
        _ => {}
    }
    match incomplete(sts, partition) {
        Some(why) => Rollout::Rolling(why),
        None => Rollout::Complete,
    }
}

/// What the StatefulSet controller still has to do (None: done): the spec observed, every
/// replica there and Ready, the pods above the partition updated (all of them at partition
/// 0, where the current revision is the update revision or every replica is updated).
fn incomplete(sts: &StatefulSet, partition: u32) -> Option<String> {
    let replicas = sts
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1)
        .max(0) as u32;
    let Some(status) = sts.status.as_ref() else {
        return Some("no status yet".into());
    };
    let count = |v: Option<i32>| v.unwrap_or(0).max(0) as u32;
    let generation = sts.metadata.generation.unwrap_or(0);
    let observed = status.observed_generation.unwrap_or(0);
    if observed < generation {
        return Some(format!(
            "the controller has not seen generation {generation} yet (observed {observed})"
        ));
    }
    let (current, ready, updated) = (
        count(Some(status.replicas)),
        count(status.ready_replicas),
        count(status.updated_replicas),
    );
    if current != replicas || ready != replicas {
        return Some(format!(
            "{ready} of {replicas} pods Ready ({current} exist)"
        ));
    }
    let wanted = replicas.saturating_sub(partition);
    if updated < wanted {
        return Some(format!("{updated} of {wanted} pods updated"));
    }
    let same_revision =
        status.current_revision.is_some() && status.current_revision == status.update_revision;
    if partition == 0 && !same_revision && updated != replicas {
        return Some("the current revision is not the update revision yet".into());
    }
    None
}
