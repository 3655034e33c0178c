//! The step plan: which held StatefulSets to step down now, which to let go, and when
//! to look again. Pure: the sets, the policy, the windows and `now` come in.
//!
//! A held set (annotation `partition-target`) moves in steps of one ordinal: a step lowers
//! `rollingUpdate.partition` and the `partition-held` annotation together, which lets the
//! StatefulSet controller re-create exactly one pod. A step is taken only once the pod
//! released by the set's previous step is updated and Ready, it must fit every limit of
//! the set's rule, and the rule's released pods that are not Ready stay within
//! `maxNotReady`. Order: round-robin across namespaces, and across the sets of a
//! namespace, least recently stepped first; both orders are read from the step times
//! recorded on the sets, so they survive a restart. Moves that release no pod (nothing
//! left to roll, the target reached, a set someone else took over) cost nothing.

use super::plan::{longest_window, Charged};
use crate::limiter::{Limiter, Millis};
use crate::policy::{Action, Policy, Rule};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Step times kept on a set at most (the newest ones); a window never needs more
/// than the steps one set can take in it, one per ordinal.
pub const MAX_STEP_RECORDS: usize = 100;

/// The pod released by a set's last step (the ordinal at the partition).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The partition is at or above `replicas`: no pod has been released.
    None,
    /// Updated (its revision is the set's update revision) and Ready.
    Settled,
    /// Not yet updated, not Ready, missing, or not looked at yet.
    Pending,
}

/// A StatefulSet churn-throttler holds, as read from the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSet {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// The rule named by `paced-by`; empty when the annotation is missing.
    pub rule: String,
    pub rolling_update: bool,
    pub replicas: u32,
    /// `rollingUpdate.partition` as written (0 when absent).
    pub partition: u32,
    /// `partition-target`; None when it cannot be read.
    pub target: Option<u32>,
    /// `partition-held`; None when missing or unreadable.
    pub held: Option<u32>,
    /// `partition-stepped-at`, oldest first.
    pub stepped_at: Vec<Millis>,
    /// `partition-held-since`.
    pub held_since: Option<Millis>,
    pub released: Released,
    /// The controller has seen the current spec and every pod is at the update revision:
    /// lowering the partition would re-create nothing.
    pub nothing_to_roll: bool,
    /// A patch of this set was refused and it has not changed since: no move this round.
    pub backoff: bool,
}

impl HeldSet {
    fn last_step(&self) -> Millis {
        self.stepped_at.last().copied().unwrap_or(0)
    }
}

/// A set that is no longer held but still carries some of churn-throttler's annotations:
/// step times inside a window (kept for seeding), or what letting go left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub rule: String,
    pub stepped_at: Vec<Millis>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepWhy {
    /// Charged at the rule's rate: it re-creates a pod.
    Rate,
    /// Every pod is already at the update revision, or none is at or above the target:
    /// straight to the target, uncharged.
    NothingToRoll,
    /// The policy has no partition rule any more: straight to the target, uncharged.
    RuleGone,
}

impl StepWhy {
    pub fn as_str(self) -> &'static str {
        match self {
            StepWhy::Rate => "rate",
            StepWhy::NothingToRoll => "nothing-to-roll",
            StepWhy::RuleGone => "rule-gone",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LetGoWhy {
    /// The partition is not what churn-throttler last wrote (`partition-held`): someone
    /// the webhook does not pace (an exempt user, a self-paced writer, the webhook being
    /// down) set it. Their value stands.
    PartitionMoved,
    /// The strategy is no longer RollingUpdate.
    NotRollingUpdate,
    /// The target annotation is not a number.
    Unreadable,
}

impl LetGoWhy {
    pub fn as_str(self) -> &'static str {
        match self {
            LetGoWhy::PartitionMoved => "partition-moved",
            LetGoWhy::NotRollingUpdate => "not-rolling-update",
            LetGoWhy::Unreadable => "unreadable-target",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// Lower the partition and `partition-held` to `to`.
    Step {
        index: usize,
        rule: Option<Arc<str>>,
        from: u32,
        to: u32,
        why: StepWhy,
    },
    /// The target is reached and the last released pod is Ready: drop the hold.
    /// `keep_record`: keep `paced-by` and `partition-stepped-at` until the steps leave
    /// every window, so that seeding still sees them.
    Finish {
        index: usize,
        rule: Option<Arc<str>>,
        keep_record: bool,
    },
    /// Stop pacing without touching the partition.
    LetGo {
        index: usize,
        rule: Option<Arc<str>>,
        why: LetGoWhy,
        keep_record: bool,
    },
}

impl Move {
    pub fn index(&self) -> usize {
        match self {
            Move::Step { index, .. } | Move::Finish { index, .. } | Move::LetGo { index, .. } => {
                *index
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    Rate,
    NotReady { not_ready: u32, max: u32 },
}

/// Sets of one rule in one namespace that could step but wait for the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub rule: Arc<str>,
    pub namespace: String,
    pub sets: usize,
    /// Index of the set that goes next here (the one an Event is attached to).
    pub head: usize,
    pub blocked: Blocked,
    /// Estimated wait for the next step here (None: waits on readiness).
    pub next_in_ms: Option<Millis>,
    /// Held sets of the rule in the whole cluster, and pods their steps still release.
    pub rule_sets: usize,
    pub rule_pods: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepPlan {
    /// Uncharged moves first, then the steps at the rate, in the order to send them.
    pub moves: Vec<Move>,
    /// Records whose step times left every window: their annotations can go.
    pub cleanups: Vec<usize>,
    /// When something that waits on time could go (None: nothing waits on time).
    pub wake_at: Option<Millis>,
    pub waiting: Vec<Waiting>,
    /// Released pods not yet Ready, per rule (what maxNotReady counts), after the plan.
    pub not_ready: HashMap<Arc<str>, u32>,
    /// Held sets per rule ("" for sets no rule paces).
    pub held: HashMap<Arc<str>, usize>,
}

pub struct StepInputs<'a> {
    pub held: &'a [HeldSet],
    pub records: &'a [Record],
    pub policy: &'a Policy,
    pub now: Millis,
    pub max_moves: usize,
}

/// The rule that paces a set: the partition rule it names, else the policy's first
/// partition rule (a renamed or removed rule must not let every held rollout go at
/// once), else None: the policy no longer paces rollouts.
pub fn partition_rule<'p>(policy: &'p Policy, name: &str) -> Option<&'p Rule> {
    let mut rules = policy
        .rules
        .iter()
        .filter(|r| r.action == Action::Partition);
    let first = rules.clone().next();
    rules.find(|r| &*r.name == name).or(first)
}

fn rule_window(rule: &Rule) -> Millis {
    rule.limits
        .iter()
        .map(|l| l.window.as_millis() as Millis)
        .max()
        .unwrap_or(0)
}

/// How long step times matter for a set of this rule name.
fn window_for(policy: &Policy, rule: &str) -> Millis {
    partition_rule(policy, rule)
        .map(rule_window)
        .unwrap_or_else(|| longest_window(policy))
}

/// Step times still inside the window at `now`.
fn in_window(times: &[Millis], window: Millis, now: Millis) -> impl Iterator<Item = Millis> + '_ {
    times
        .iter()
        .copied()
        .filter(move |&t| t.min(now) + window > now)
}

/// The `partition-stepped-at` value after a step at `now`: the times still in the window,
/// then `now`, newest `MAX_STEP_RECORDS` at most.
pub fn stepped_at_after(times: &[Millis], window: Millis, now: Millis) -> Vec<Millis> {
    let mut kept: Vec<Millis> = in_window(times, window, now).collect();
    kept.push(now);
    let skip = kept.len().saturating_sub(MAX_STEP_RECORDS);
    kept.split_off(skip)
}

/// The key under which a step is remembered as charged.
pub fn charge_key(uid: &str, at: Millis) -> String {
    format!("{uid}@{at}")
}

/// Rebuilds the windows from the step times recorded on held sets and records: each
/// step still inside its rule's window, not already charged by this process, is charged
/// at its recorded time. Returns how many were charged.
pub fn seed_steps(
    limiter: &mut Limiter,
    policy: &Policy,
    held: &[HeldSet],
    records: &[Record],
    charged: &mut Charged,
    now: Millis,
) -> usize {
    let sets = held
        .iter()
        .map(|s| (&s.namespace, &s.uid, &s.rule, &s.stepped_at))
        .chain(
            records
                .iter()
                .map(|r| (&r.namespace, &r.uid, &r.rule, &r.stepped_at)),
        );
    let mut todo: Vec<(Millis, &str, &str, &Rule)> = Vec::new();
    for (namespace, uid, rule, times) in sets {
        let Some(rule) = partition_rule(policy, rule) else {
            continue;
        };
        for at in in_window(times, rule_window(rule), now) {
            if !charged.contains(&charge_key(uid, at)) {
                todo.push((at.min(now), namespace, uid, rule));
            }
        }
    }
    // In time order, so every window is exact.
    todo.sort_by(|a, b| (a.0, a.2).cmp(&(b.0, b.2)));
    for (at, namespace, uid, rule) in &todo {
        limiter.record(&rule.name, &rule.limits, namespace, Some(uid), *at, 1);
        charged.insert(&charge_key(uid, *at), *at);
    }
    todo.len()
}

/// Decides this round's moves and charges each step at the rate in `limiter` at `now`.
pub fn plan_steps(inputs: &StepInputs<'_>, limiter: &mut Limiter) -> StepPlan {
    let now = inputs.now;
    let policy = inputs.policy;
    let mut out = StepPlan::default();
    let mut free: Vec<Move> = Vec::new();
    // Per rule: candidate sets for a step at the rate.
    let mut candidates: BTreeMap<Arc<str>, Vec<usize>> = BTreeMap::new();
    let mut not_ready: HashMap<Arc<str>, u32> = HashMap::new();
    let mut remaining: HashMap<Arc<str>, (usize, u64)> = HashMap::new();

    for (index, set) in inputs.held.iter().enumerate() {
        let rule = partition_rule(policy, &set.rule);
        let name: Option<Arc<str>> = rule.map(|r| r.name.clone());
        let key = name.clone().unwrap_or_else(|| Arc::from(""));
        *out.held.entry(key.clone()).or_insert(0) += 1;
        let keep_record = in_window(&set.stepped_at, window_for(policy, &set.rule), now)
            .next()
            .is_some();
        let let_go = |why| Move::LetGo {
            index,
            rule: name.clone(),
            why,
            keep_record,
        };
        if set.backoff {
            if set.released == Released::Pending && rule.is_some() {
                *not_ready.entry(key).or_insert(0) += 1;
            }
            continue;
        }
        let Some(target) = set.target else {
            free.push(let_go(LetGoWhy::Unreadable));
            continue;
        };
        if !set.rolling_update {
            free.push(let_go(LetGoWhy::NotRollingUpdate));
            continue;
        }
        if set.held != Some(set.partition) {
            free.push(let_go(LetGoWhy::PartitionMoved));
            continue;
        }
        let effective = set.partition.min(set.replicas);
        let pending = set.released == Released::Pending;
        if rule.is_none() {
            free.push(if set.partition > target {
                Move::Step {
                    index,
                    rule: None,
                    from: set.partition,
                    to: target,
                    why: StepWhy::RuleGone,
                }
            } else {
                Move::Finish {
                    index,
                    rule: None,
                    keep_record: false,
                }
            });
            continue;
        }
        if pending {
            *not_ready.entry(key.clone()).or_insert(0) += 1;
        }
        let left = remaining.entry(key.clone()).or_insert((0, 0));
        left.0 += 1;
        left.1 += u64::from(effective.saturating_sub(target));
        if set.partition <= target {
            if !pending {
                free.push(Move::Finish {
                    index,
                    rule: name.clone(),
                    keep_record,
                });
            }
            continue;
        }
        if pending {
            continue;
        }
        if set.nothing_to_roll || effective <= target {
            free.push(Move::Step {
                index,
                rule: name.clone(),
                from: set.partition,
                to: target,
                why: StepWhy::NothingToRoll,
            });
            continue;
        }
        candidates.entry(key).or_default().push(index);
    }

    for (index, record) in inputs.records.iter().enumerate() {
        let window = window_for(policy, &record.rule);
        match record.stepped_at.iter().map(|t| t.min(&now) + window).max() {
            Some(until) if until > now => {
                out.wake_at = Some(out.wake_at.map_or(until, |w| w.min(until)));
            }
            _ => out.cleanups.push(index),
        }
    }

    for m in free {
        if out.moves.len() >= inputs.max_moves {
            out.wake_at = Some(now);
            break;
        }
        out.moves.push(m);
    }

    // Namespaces least recently served first, from the step times on every set.
    let mut last_served: HashMap<&str, Millis> = HashMap::new();
    let sets = inputs
        .held
        .iter()
        .map(|s| (&s.namespace, &s.stepped_at))
        .chain(inputs.records.iter().map(|r| (&r.namespace, &r.stepped_at)));
    for (namespace, times) in sets {
        let last = times.iter().copied().max().unwrap_or(0);
        let entry = last_served.entry(namespace.as_str()).or_insert(0);
        *entry = (*entry).max(last);
    }

    for rule in policy
        .rules
        .iter()
        .filter(|r| r.action == Action::Partition)
    {
        let Some(indices) = candidates.remove(&rule.name) else {
            continue;
        };
        let not_ready = not_ready.entry(rule.name.clone()).or_insert(0);
        let (rule_sets, rule_pods) = remaining.get(&rule.name).copied().unwrap_or((0, 0));
        plan_rule(
            rule,
            indices,
            inputs,
            &last_served,
            limiter,
            not_ready,
            (rule_sets, rule_pods),
            &mut out,
        );
    }
    out.not_ready = not_ready;
    out
}

#[allow(clippy::too_many_arguments)]
fn plan_rule(
    rule: &Rule,
    indices: Vec<usize>,
    inputs: &StepInputs<'_>,
    last_served: &HashMap<&str, Millis>,
    limiter: &mut Limiter,
    not_ready: &mut u32,
    (rule_sets, rule_pods): (usize, u64),
    out: &mut StepPlan,
) {
    let held = inputs.held;
    let now = inputs.now;
    let mut lanes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for index in indices {
        lanes
            .entry(held[index].namespace.as_str())
            .or_default()
            .push(index);
    }
    for lane in lanes.values_mut() {
        // Least recently stepped first, then the oldest hold, then by name; reversed so
        // that the next set is popped from the end.
        lane.sort_by(|&a, &b| {
            let key = |s: &HeldSet| (s.last_step(), s.held_since.unwrap_or(0), s.name.clone());
            key(&held[b]).cmp(&key(&held[a]))
        });
    }
    let mut names: Vec<&str> = lanes.keys().copied().collect();
    names.sort_by_key(|n| (last_served.get(n).copied().unwrap_or(0), *n));
    let mut lanes: Vec<Vec<usize>> = names
        .iter()
        .map(|n| lanes.remove(n).unwrap_or_default())
        .collect();
    let mut blocked = vec![false; lanes.len()];
    let mut blocked_by_readiness = false;

    'rounds: loop {
        let mut progress = false;
        for (lane_no, lane) in lanes.iter_mut().enumerate() {
            let Some(&index) = lane.last() else {
                continue;
            };
            if blocked[lane_no] {
                continue;
            }
            if let Some(max) = rule.max_not_ready {
                if *not_ready >= max {
                    blocked_by_readiness = true;
                    break 'rounds;
                }
            }
            if out.moves.len() >= inputs.max_moves {
                out.wake_at = Some(now);
                break 'rounds;
            }
            let set = &held[index];
            let at = limiter.earliest(
                &rule.name,
                &rule.limits,
                &set.namespace,
                Some(&set.uid),
                1,
                now,
            );
            if at > now {
                blocked[lane_no] = true;
                out.wake_at = Some(out.wake_at.map_or(at, |w| w.min(at)));
                continue;
            }
            lane.pop();
            limiter.record(
                &rule.name,
                &rule.limits,
                &set.namespace,
                Some(&set.uid),
                now,
                1,
            );
            let target = set.target.unwrap_or(0);
            let to = set
                .partition
                .min(set.replicas)
                .saturating_sub(1)
                .max(target);
            out.moves.push(Move::Step {
                index,
                rule: Some(rule.name.clone()),
                from: set.partition,
                to,
                why: StepWhy::Rate,
            });
            *not_ready += 1;
            progress = true;
        }
        if !progress {
            break;
        }
    }

    for (lane_no, lane) in lanes.iter().enumerate() {
        let Some(&head) = lane.last() else {
            continue;
        };
        let (blocked, next_in_ms) = if blocked_by_readiness {
            let max = rule.max_not_ready.unwrap_or(0);
            (
                Blocked::NotReady {
                    not_ready: *not_ready,
                    max,
                },
                None,
            )
        } else {
            let set = &held[head];
            let at = limiter.earliest(
                &rule.name,
                &rule.limits,
                &set.namespace,
                Some(&set.uid),
                1,
                now,
            );
            (Blocked::Rate, Some(at.saturating_sub(now)))
        };
        out.waiting.push(Waiting {
            rule: rule.name.clone(),
            namespace: names[lane_no].to_string(),
            sets: lane.len(),
            head,
            blocked,
            next_in_ms,
            rule_sets,
            rule_pods,
        });
    }
}

#[cfg(test)]
#[path = "partition_plan_tests.rs"]
mod tests;
