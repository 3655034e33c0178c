//! The step plan: which held StatefulSets to step down now, which to let go, and when
//! to look again. Pure: the sets, the policy and `now` come in.
//!
//! A held set (annotation `partition-target`) moves in steps of one ordinal: a step lowers
//! `rollingUpdate.partition` and the `partition-held` annotation together, which lets the
//! StatefulSet controller re-create exactly one pod. A step is taken only once the pod
//! released by the set's previous step is updated and Ready (with
//! `rollingUpdate.maxUnavailable` k > 1: once the pod released k steps ago is, so at most
//! k of the set's released pods are unsettled at once), it must fit every limit of the
//! set's rule, and the rule's released pods that are not Ready stay within
//! `maxNotReady`. Order: round-robin across namespaces, and across the sets of a
//! namespace, least recently stepped first; both orders are read from the step times
//! recorded on the sets, so they survive a restart. Moves that release no pod (nothing
//! left to roll, the target reached, a set someone else took over) cost nothing.
//!
//! The windows count what a step causes, not when it was sent: the controller deletes
//! the old pod some time later (measured up to 3.6 s after a mass update), and that
//! delay varies, so steps spaced by the limit would not keep deletions within it. A step
//! therefore counts in its rule's windows at "now" from the moment it is taken until its
//! old pod is seen deleted (being deleted, or gone), and from then on at the time it was
//! seen, which is never earlier than the deletion. Then no window of deletions or of
//! steps can hold more than the limit. Termination and the replacement's start overlap
//! other steps: the replacement pod is not counted here; it is paced where the CNI does
//! its work, by a gate rule on StatefulSet pod creations (the built-in policy's
//! `statefulset-creates`), in the gate releaser's windows. The windows are rebuilt every
//! round from the sets (the times recorded in `partition-stepped-at`, the pods in
//! flight), so a restart or a failover opens no burst. The webhook never charges a
//! partition rule, so nothing else shares these windows.

use super::gate::{longest_window, rule_window};
use super::partition_windows::Windows;
use crate::limiter::Millis;
use crate::policy::{Action, Policy, Rule};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;

/// Step times kept on a set at most (the newest ones); a window never needs more
/// than the steps one set can take in it, one per ordinal.
pub const MAX_STEP_RECORDS: usize = 100;

/// Steps of one set in flight at most, whatever its `maxUnavailable` says: the shell
/// looks at each of their pods (a GET each) every round they are unsettled.
pub const MAX_IN_FLIGHT_PER_SET: u32 = 10;

/// The ordinals (before `ordinals.start`) of the pods a set's last steps released and
/// that the set may still have in flight: from the partition up, at most
/// `max_unavailable` of them (capped at `MAX_IN_FLIGHT_PER_SET`), below `replicas`.
/// Every released pod above them has settled: a step is taken only once the highest of
/// them has (see `HeldSet::may_step`), so these are the only ones worth a look.
pub fn released_ordinals(partition: u32, replicas: u32, max_unavailable: u32) -> Range<u32> {
    let k = max_unavailable.clamp(1, MAX_IN_FLIGHT_PER_SET);
    let end = partition.saturating_add(k).min(replicas);
    partition.min(end)..end
}

/// A pod a set's step released: the last step's is the one at the partition, earlier
/// steps' are just above it (`HeldSet::earlier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The partition is at or above `replicas`: no pod has been released.
    None,
    /// The old pod is not yet seen deleted (or not looked at yet).
    InFlight,
    /// The old pod was seen deleted at `at`; its replacement is not updated and Ready
    /// yet (terminating, not created, gated or starting).
    Starting { at: Millis },
    /// The replacement is updated and Ready; the old pod was seen deleted at `at`.
    Settled { at: Millis },
}

impl Released {
    /// When the step's old pod was seen deleted: the step's time in the windows.
    fn seen_at(self) -> Option<Millis> {
        match self {
            Released::Starting { at } | Released::Settled { at } => Some(at),
            Released::None | Released::InFlight => None,
        }
    }

    fn settled(self) -> bool {
        matches!(self, Released::None | Released::Settled { .. })
    }
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
    /// `partition-stepped-at`: when the old pods of earlier steps were seen deleted,
    /// oldest first (the times of the pods still looked at, `released` and `earlier`,
    /// are written when a step takes them out of the looked-at ordinals).
    pub stepped_at: Vec<Millis>,
    /// `partition-held-since`.
    pub held_since: Option<Millis>,
    /// The pod at the partition: the one the last step released.
    pub released: Released,
    /// The pods just above it, nearest first, that earlier steps released and that may
    /// still be in flight: the rest of `released_ordinals` (empty when k = 1).
    pub earlier: Vec<Released>,
    /// `rollingUpdate.maxUnavailable` as the StatefulSet controller reads it (1 when
    /// absent): how many of the set's released pods may be unsettled at once.
    pub max_unavailable: u32,
    /// The controller has seen the current spec and every pod is at the update revision:
    /// lowering the partition would re-create nothing.
    pub nothing_to_roll: bool,
    /// A patch of this set was refused and it has not changed since: no move this round.
    pub backoff: bool,
}

impl HeldSet {
    fn last_step(&self) -> Millis {
        match self.released {
            // A step in flight was taken just now, as far as order goes.
            Released::InFlight => Millis::MAX,
            r => r.seen_at().or(self.stepped_at.last().copied()).unwrap_or(0),
        }
    }

    /// The looked-at pods the set's last steps released, the last step's first.
    pub fn looked(&self) -> impl Iterator<Item = Released> + '_ {
        std::iter::once(self.released).chain(self.earlier.iter().copied())
    }

    /// Marks the pods of `released_ordinals` as not looked at yet: in flight (`None`
    /// when no pod is released).
    pub fn unlooked(&mut self) {
        let n = released_ordinals(self.partition, self.replicas, self.max_unavailable).len();
        self.released = if n == 0 {
            Released::None
        } else {
            Released::InFlight
        };
        self.earlier = vec![Released::InFlight; n.saturating_sub(1)];
    }

    /// The looked-at pod `slot` ordinals above the partition.
    pub fn looked_mut(&mut self, slot: usize) -> Option<&mut Released> {
        match slot.checked_sub(1) {
            None => Some(&mut self.released),
            Some(i) => self.earlier.get_mut(i),
        }
    }

    /// Released pods not updated and Ready yet (what `maxNotReady` counts).
    fn unsettled(&self) -> u32 {
        self.looked().filter(|r| !r.settled()).count() as u32
    }

    /// Whether the set's own pods let it take one more step: fewer than k of its
    /// released pods are unsettled, and the highest one looked at (the pod k-1
    /// ordinals above the partition) has settled. That pod leaves the looked-at
    /// ordinals with the step; were it still unsettled, it would go unseen and the set
    /// could have more than k unsettled. With k = 1: the last step's pod has settled.
    fn may_step(&self) -> bool {
        let k = self.max_unavailable.clamp(1, MAX_IN_FLIGHT_PER_SET) as usize;
        self.unsettled() < k as u32 && self.looked().skip(k - 1).all(Released::settled)
    }

    /// The times the set's steps count at in the windows (None: in flight, "now").
    /// The recorded times are of pods no longer looked at; the looked-at pods count at
    /// their own times (a step records a pod's time when it leaves the looked-at ones).
    fn step_times(&self) -> impl Iterator<Item = Option<Millis>> + '_ {
        let looked = self.looked().filter_map(|r| match r {
            Released::InFlight => Some(None),
            r => r.seen_at().map(Some),
        });
        self.stepped_at.iter().map(|&t| Some(t)).chain(looked)
    }
}

/// A step this process took: the rule and namespace it was paced under, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenStep {
    pub rule: Arc<str>,
    pub namespace: String,
    pub at: Millis,
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
    /// Lower the partition and `partition-held` to `to`; `record`: the new value of
    /// `partition-stepped-at` when it changes.
    Step {
        index: usize,
        rule: Option<Arc<str>>,
        from: u32,
        to: u32,
        why: StepWhy,
        record: Option<Vec<Millis>>,
    },
    /// The target is reached and the last released pod is Ready: drop the hold. The
    /// step times still inside a window stay (`record`, with `paced-by`) until they leave
    /// it; an empty record drops those annotations too.
    Finish {
        index: usize,
        rule: Option<Arc<str>>,
        record: Vec<Millis>,
    },
    /// Stop pacing without touching the partition; `record` as for Finish.
    LetGo {
        index: usize,
        rule: Option<Arc<str>>,
        why: LetGoWhy,
        record: Vec<Millis>,
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
    /// The rule's windows are full (of steps seen, or of steps in flight).
    Rate,
    NotReady {
        not_ready: u32,
        max: u32,
    },
    /// Adaptive rules: the network window has no room for the step's replacement pod.
    Network,
    /// The rule is paused (a schedule window of `events: 0`) until then (u64::MAX: no end
    /// in sight).
    Paused {
        until: Millis,
    },
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
    /// Estimated wait for the next step here (None: waits until old pods of earlier
    /// steps are seen deleted, or their replacements Ready).
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
    /// Steps in the fullest window of each rule after the plan (in flight included).
    pub in_window: HashMap<Arc<str>, u32>,
}

pub struct StepInputs<'a> {
    pub held: &'a [HeldSet],
    pub records: &'a [Record],
    /// Steps this process took (their decision times), for the spacing: a step's pod is
    /// seen deleted some time later, so spacing by seen times would serialise steps.
    pub taken: &'a [TakenStep],
    pub policy: &'a Policy,
    pub now: Millis,
    pub max_moves: usize,
    /// Adaptive rules: how many more replacement pods the network window has room for
    /// (`NetworkRoom::for_steps`: released pods not network-ready and pods of adaptive
    /// gate rules still gated, against the window), shared by the adaptive partition
    /// rules; None without one.
    /// A step deletes a pod whose replacement then waits for that room: stepping past it
    /// would leave pods deleted and not re-created.
    pub network_room: Option<u32>,
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

/// How long step times matter for a set of this rule name.
fn window_for(policy: &Policy, rule: &str) -> Millis {
    partition_rule(policy, rule)
        .map(rule_window)
        .unwrap_or_else(|| longest_window(policy))
}

/// The value of `partition-stepped-at` to write when the hold ends: the recorded times
/// and those of every looked-at pod seen deleted that are still inside `window`, newest
/// `MAX_STEP_RECORDS` at most.
pub fn record_now(set: &HeldSet, window: Millis, now: Millis) -> Vec<Millis> {
    record_with(set, set.looked(), window, now)
}

/// The value of `partition-stepped-at` to write with a move of the partition to `to`:
/// the recorded times and those of the looked-at pods the move takes out of the
/// looked-at ordinals (`released_ordinals` from `to`). A pod that stays looked at is not
/// recorded yet: it counts at its own time, and a new leader finds that time on the pod
/// (`deleted_by`). With k = 1 a step records its previous pod's time.
fn record_after_move(set: &HeldSet, to: u32, window: Millis, now: Millis) -> Vec<Millis> {
    let k = set.max_unavailable.clamp(1, MAX_IN_FLIGHT_PER_SET);
    let first = set.partition.min(set.replicas);
    let stays = released_ordinals(to, set.replicas, k);
    let leaving = set
        .looked()
        .zip(first..)
        .filter(|(_, ordinal)| !stays.contains(ordinal))
        .map(|(r, _)| r);
    record_with(set, leaving, window, now)
}

fn record_with(
    set: &HeldSet,
    pods: impl Iterator<Item = Released>,
    window: Millis,
    now: Millis,
) -> Vec<Millis> {
    let mut kept: Vec<Millis> = set
        .stepped_at
        .iter()
        .copied()
        .chain(pods.filter_map(Released::seen_at))
        .filter(|&t| t.min(now) + window > now)
        .collect();
    // Equal times are distinct steps (two pods seen deleted in the same millisecond, or
    // dated by a new leader from stamps of the same second): keep each.
    kept.sort_unstable();
    let skip = kept.len().saturating_sub(MAX_STEP_RECORDS);
    kept.split_off(skip)
}

/// Each partition rule's windows, with the steps this process took and those recorded on
/// finished rollouts (the held sets' own step times are added as they are read).
fn windows_of_steps_taken<'p>(inputs: &StepInputs<'p>) -> BTreeMap<Arc<str>, Windows<'p>> {
    let policy = inputs.policy;
    let mut windows: BTreeMap<Arc<str>, Windows<'p>> = policy
        .rules
        .iter()
        .filter(|r| r.action == Action::Partition)
        .map(|r| (r.name.clone(), Windows::new(r)))
        .collect();
    for step in inputs.taken {
        if let Some(w) = windows.get_mut(&step.rule) {
            w.take(&step.namespace, step.at);
        }
    }
    for record in inputs.records {
        if let Some(rule) = partition_rule(policy, &record.rule) {
            if let Some(w) = windows.get_mut(&rule.name) {
                for &t in &record.stepped_at {
                    w.add(&record.namespace, Some(t));
                }
            }
        }
    }
    windows
}

/// Records whose step times left every window can go; the others wake the releaser
/// when they leave.
fn plan_cleanups(inputs: &StepInputs<'_>, out: &mut StepPlan) {
    let now = inputs.now;
    for (index, record) in inputs.records.iter().enumerate() {
        let window = window_for(inputs.policy, &record.rule);
        match record.stepped_at.iter().map(|t| t.min(&now) + window).max() {
            Some(until) if until > now => {
                out.wake_at = Some(out.wake_at.map_or(until, |w| w.min(until)));
            }
            _ => out.cleanups.push(index),
        }
    }
}

/// When each namespace was last served, from the step times on every set: the least
/// recently served go first.
fn last_served<'i>(inputs: &StepInputs<'i>) -> HashMap<&'i str, Millis> {
    let mut last_served: HashMap<&str, Millis> = HashMap::new();
    let served = inputs
        .held
        .iter()
        .map(|s| (s.namespace.as_str(), s.last_step()))
        .chain(inputs.records.iter().map(|r| {
            (
                r.namespace.as_str(),
                r.stepped_at.iter().copied().max().unwrap_or(0),
            )
        }));
    for (namespace, last) in served {
        let entry = last_served.entry(namespace).or_insert(0);
        *entry = (*entry).max(last);
    }
    last_served
}

/// A set whose rule left the policy goes to its target at once, uncharged.
fn rule_gone(index: usize, set: &HeldSet, target: u32) -> Move {
    if set.partition > target {
        Move::Step {
            index,
            rule: None,
            from: set.partition,
            to: target,
            why: StepWhy::RuleGone,
            record: None,
        }
    } else {
        Move::Finish {
            index,
            rule: None,
            record: Vec::new(),
        }
    }
}

/// What a held set of a rule, not let go, does this round.
enum Next {
    /// The end of the hold, or straight to the target when nothing is left to re-create.
    Free(Move),
    /// A step at the rate, if the rule's windows and `maxNotReady` let it.
    Candidate,
    /// Nothing while its released pods settle.
    Wait,
}

fn next_move(index: usize, set: &HeldSet, rule: &Rule, target: u32, now: Millis) -> Next {
    // Moves that end the hold, or re-create nothing, wait for every released pod; a
    // step at the rate only for the set's own limit (`may_step`).
    let settled = set.unsettled() == 0;
    if !settled && !set.may_step() {
        return Next::Wait;
    }
    let name = Some(rule.name.clone());
    let window = rule_window(rule);
    let effective = set.partition.min(set.replicas);
    if set.partition <= target {
        if !settled {
            return Next::Wait;
        }
        let record = record_now(set, window, now);
        return Next::Free(Move::Finish {
            index,
            rule: name,
            record,
        });
    }
    if set.nothing_to_roll || effective <= target {
        if !settled {
            return Next::Wait;
        }
        let record = record_after_move(set, target, window, now);
        return Next::Free(Move::Step {
            index,
            rule: name,
            from: set.partition,
            to: target,
            why: StepWhy::NothingToRoll,
            record: (record != set.stepped_at).then_some(record),
        });
    }
    Next::Candidate
}

/// Decides this round's moves.
pub fn plan_steps(inputs: &StepInputs<'_>) -> StepPlan {
    let now = inputs.now;
    let policy = inputs.policy;
    let mut out = StepPlan::default();
    let mut free: Vec<Move> = Vec::new();
    let mut windows = windows_of_steps_taken(inputs);
    // Per rule: candidate sets for a step at the rate.
    let mut candidates: BTreeMap<Arc<str>, Vec<usize>> = BTreeMap::new();
    let mut not_ready: HashMap<Arc<str>, u32> = HashMap::new();
    let mut remaining: HashMap<Arc<str>, (usize, u64)> = HashMap::new();

    for (index, set) in inputs.held.iter().enumerate() {
        let rule = partition_rule(policy, &set.rule);
        let name: Option<Arc<str>> = rule.map(|r| r.name.clone());
        let key = name.clone().unwrap_or_else(|| Arc::from(""));
        *out.held.entry(key.clone()).or_insert(0) += 1;
        if let Some(w) = windows.get_mut(&key) {
            for t in set.step_times() {
                w.add(&set.namespace, t);
            }
        }
        let unsettled = set.unsettled();
        if unsettled > 0 && rule.is_some() {
            *not_ready.entry(key.clone()).or_insert(0) += unsettled;
        }
        if set.backoff {
            continue;
        }
        let record = record_now(set, window_for(policy, &set.rule), now);
        let let_go = |why| Move::LetGo {
            index,
            rule: name.clone(),
            why,
            record: record.clone(),
        };
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
        let Some(rule) = rule else {
            free.push(rule_gone(index, set, target));
            continue;
        };
        let left = remaining.entry(key.clone()).or_insert((0, 0));
        left.0 += 1;
        left.1 += u64::from(effective.saturating_sub(target));
        match next_move(index, set, rule, target, now) {
            Next::Free(m) => free.push(m),
            Next::Candidate => candidates.entry(key).or_default().push(index),
            Next::Wait => {}
        }
    }

    plan_cleanups(inputs, &mut out);
    // Uncharged moves first, up to the round's cap.
    let cap = inputs.max_moves.min(free.len());
    if free.len() > cap {
        out.wake_at = Some(now);
    }
    out.moves.extend(free.into_iter().take(cap));
    let last_served = last_served(inputs);
    let mut network_room = inputs.network_room;

    for (name, windows) in windows.iter_mut() {
        if let Some(indices) = candidates.remove(name) {
            let not_ready = not_ready.entry(name.clone()).or_insert(0);
            let left = remaining.get(name).copied().unwrap_or((0, 0));
            plan_rule(
                indices,
                inputs,
                &last_served,
                windows,
                InFlight {
                    not_ready,
                    network_room: &mut network_room,
                },
                left,
                &mut out,
            );
        }
        out.in_window.insert(name.clone(), windows.fullest(now));
    }
    out.not_ready = not_ready;
    out
}

/// The candidate sets in one lane per namespace, the namespaces least recently served
/// first; in a lane the least recently stepped set, then the oldest hold, then by name
/// goes first (lanes are reversed so that the next set is popped from the end).
fn lanes_in_turn<'h>(
    indices: Vec<usize>,
    held: &'h [HeldSet],
    last_served: &HashMap<&str, Millis>,
) -> (Vec<&'h str>, Vec<Vec<usize>>) {
    let mut lanes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for index in indices {
        lanes
            .entry(held[index].namespace.as_str())
            .or_default()
            .push(index);
    }
    for lane in lanes.values_mut() {
        lane.sort_by(|&a, &b| {
            let key = |s: &HeldSet| (s.last_step(), s.held_since.unwrap_or(0), s.name.clone());
            key(&held[b]).cmp(&key(&held[a]))
        });
    }
    let mut names: Vec<&str> = lanes.keys().copied().collect();
    names.sort_by_key(|n| (last_served.get(n).copied().unwrap_or(0), *n));
    let lanes = names
        .iter()
        .map(|n| lanes.remove(n).unwrap_or_default())
        .collect();
    (names, lanes)
}

/// What a rule's steps count against as they are taken: its pods not Ready yet, and the
/// network window's room shared by the adaptive rules.
struct InFlight<'r> {
    not_ready: &'r mut u32,
    network_room: &'r mut Option<u32>,
}

fn plan_rule(
    indices: Vec<usize>,
    inputs: &StepInputs<'_>,
    last_served: &HashMap<&str, Millis>,
    windows: &mut Windows<'_>,
    InFlight {
        not_ready,
        network_room,
    }: InFlight<'_>,
    (rule_sets, rule_pods): (usize, u64),
    out: &mut StepPlan,
) {
    let rule = windows.rule;
    let held = inputs.held;
    let now = inputs.now;
    let (names, mut lanes) = lanes_in_turn(indices, held, last_served);
    // A paused rule takes no step; the releaser looks again when the pause ends.
    let paused = rule.paused_at(now);
    if let Some(until) = paused.filter(|&u| u != Millis::MAX) {
        out.wake_at = Some(out.wake_at.map_or(until, |w| w.min(until)));
    }
    let mut blocked: Vec<Option<Option<Millis>>> = vec![None; lanes.len()];
    let mut blocked_by_readiness = false;
    let mut blocked_by_network = false;
    let room = if rule.adaptive {
        network_room
    } else {
        &mut None
    };

    'rounds: loop {
        if paused.is_some() {
            break;
        }
        let mut progress = false;
        for (lane_no, lane) in lanes.iter_mut().enumerate() {
            let Some(&index) = lane.last() else {
                continue;
            };
            if blocked[lane_no].is_some() {
                continue;
            }
            if let Some(max) = rule.max_not_ready {
                if *not_ready >= max {
                    blocked_by_readiness = true;
                    break 'rounds;
                }
            }
            if *room == Some(0) {
                blocked_by_network = true;
                break 'rounds;
            }
            if out.moves.len() >= inputs.max_moves {
                out.wake_at = Some(now);
                break 'rounds;
            }
            let set = &held[index];
            if let Err(wake) = windows.room(&set.namespace, now) {
                blocked[lane_no] = Some(wake);
                if let Some(at) = wake {
                    out.wake_at = Some(out.wake_at.map_or(at, |w| w.min(at)));
                }
                continue;
            }
            lane.pop();
            windows.add(&set.namespace, None);
            windows.take(&set.namespace, now);
            let target = set.target.unwrap_or(0);
            let to = set
                .partition
                .min(set.replicas)
                .saturating_sub(1)
                .max(target);
            let record = record_after_move(set, to, rule_window(rule), now);
            out.moves.push(Move::Step {
                index,
                rule: Some(rule.name.clone()),
                from: set.partition,
                to,
                why: StepWhy::Rate,
                record: (record != set.stepped_at).then_some(record),
            });
            *not_ready += 1;
            if let Some(room) = room.as_mut() {
                *room -= 1;
            }
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
        let (blocked, next_in_ms) = if let Some(until) = paused {
            (
                Blocked::Paused { until },
                (until != Millis::MAX).then(|| until.saturating_sub(now)),
            )
        } else if blocked_by_network {
            (Blocked::Network, None)
        } else if blocked_by_readiness {
            let max = rule.max_not_ready.unwrap_or(0);
            (
                Blocked::NotReady {
                    not_ready: *not_ready,
                    max,
                },
                None,
            )
        } else {
            let wake = match windows.room(&held[head].namespace, now) {
                Ok(()) => Some(now),
                Err(wake) => wake,
            };
            (Blocked::Rate, wake.map(|at| at.saturating_sub(now)))
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
#[path = "partition_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "partition_max_unavailable_tests.rs"]
mod max_unavailable_tests;
