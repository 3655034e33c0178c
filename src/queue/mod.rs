//! The gate queue: the order in which gated pods are released, and when each waiting pod
//! is expected to go. Pure: the queue, the policy, a limiter holding the rules' windows and
//! `now` come in; nothing here reads a clock, sleeps or talks to the API server.
//!
//! One order, written once: per gate rule, one lane per namespace, oldest first within a
//! lane (creation time, then name), the lanes served in turn starting after the namespace
//! served last, one pod per lane and pass, until a pass releases nothing. The release plan
//! (src/pacing/gate.rs) runs one such round at `now` on the real limiter; [`estimate`]
//! runs the same rounds forward in time on a scratch limiter, from the current windows,
//! and records when each pod would go. It sits below the admission and the releaser so
//! that the webhook's warning, the releaser's Events and `churn-throttler status` all say
//! what this module computes.
//!
//! What the estimate leaves out: `maxNotReady` (pods not Ready yet stop the real releaser;
//! when they become Ready is not known in advance), pods created later (a new pod in
//! another namespace takes its turn ahead of the tail of a long lane), and releases the
//! windows cannot see (pods un-gated by hand, gates lifted by a rule removed from the
//! policy).

use crate::limiter::{Limiter, Millis};
use crate::pacing::network::NetworkRoom;
use crate::policy::{Action, Policy, Rule, Scope};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// How far an `owner`-scoped rule looks past a namespace's oldest pod for one that fits.
pub const OWNER_SCAN: usize = 64;

/// Releases an estimate runs forward at most (all rules together); pods beyond get no time.
pub const MAX_ESTIMATED: usize = 100_000;

/// A pod that carries churn-throttler's gate and waits for its release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// The rule named by the gated-by annotation; empty when the annotation is missing.
    pub rule: String,
    /// The controller's UID, for `owner`-scoped limits.
    pub owner: Option<String>,
    /// creationTimestamp (second precision, as the API server keeps it).
    pub created: Millis,
}

/// The round-robin position per rule: the namespace served last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    last: HashMap<Arc<str>, String>,
}

impl Cursor {
    pub fn last(&self, rule: &str) -> Option<&str> {
        self.last.get(rule).map(String::as_str)
    }

    /// Records that `namespace` was served last under `rule`.
    pub fn served(&mut self, rule: &Arc<str>, namespace: &str) {
        match self.last.get_mut(rule) {
            Some(last) if last == namespace => {}
            Some(last) => namespace.clone_into(last),
            None => {
                self.last.insert(rule.clone(), namespace.to_string());
            }
        }
    }
}

/// The gate rule of this name, if the policy has one.
pub fn gate_rule<'p>(policy: &'p Policy, name: &str) -> Option<&'p Rule> {
    policy
        .rules
        .iter()
        .find(|r| r.action == Action::Gate && &*r.name == name)
}

/// Oldest first: creation time, then name, then uid.
pub(crate) fn fifo(a: &QueuedPod, b: &QueuedPod) -> std::cmp::Ordering {
    (a.created, &a.name, &a.uid).cmp(&(b.created, &b.name, &b.uid))
}

/// The rule's pods in one lane per namespace, oldest first, the lanes in turn: the
/// namespace after the one served last comes first.
pub(crate) fn lanes_in_turn<'q>(
    rule: &Rule,
    indices: Vec<usize>,
    queue: &'q [QueuedPod],
    cursor: &Cursor,
) -> (Vec<&'q str>, Vec<Vec<usize>>) {
    let mut lanes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for index in indices {
        lanes
            .entry(queue[index].namespace.as_str())
            .or_default()
            .push(index);
    }
    for lane in lanes.values_mut() {
        lane.sort_by(|&a, &b| fifo(&queue[a], &queue[b]));
    }
    in_turn(lanes, cursor.last(&rule.name))
}

/// Lanes keyed by namespace (sorted), rotated so that the one after `last` comes first.
fn in_turn<'q>(
    mut lanes: BTreeMap<&'q str, Vec<usize>>,
    last: Option<&str>,
) -> (Vec<&'q str>, Vec<Vec<usize>>) {
    let mut names: Vec<&str> = lanes.keys().copied().collect();
    if let Some(last) = last {
        let split = names.partition_point(|n| *n <= last);
        names.rotate_left(split);
    }
    let lanes = names
        .iter()
        .map(|n| lanes.remove(n).unwrap_or_default())
        .collect();
    (names, lanes)
}

/// The position in the lane of the first of its `scan` oldest pods that fits now, or
/// the earliest time one of them would (Millis::MAX: never).
pub(crate) fn pick(
    rule: &Rule,
    lane: &[usize],
    scan: usize,
    queue: &[QueuedPod],
    limiter: &Limiter,
    now: Millis,
) -> Result<usize, Millis> {
    let mut earliest = Millis::MAX;
    for (position, &index) in lane.iter().take(scan).enumerate() {
        let pod = &queue[index];
        let at = limiter.earliest(
            &rule.name,
            &rule.limits,
            &pod.namespace,
            pod.owner.as_deref(),
            1,
            now,
        );
        if at <= now {
            return Ok(position);
        }
        earliest = earliest.min(at);
    }
    Err(earliest)
}

/// How far past a lane's head a rule looks for a pod that fits.
pub(crate) fn scan_of(rule: &Rule) -> usize {
    if rule.limits.iter().any(|l| l.scope == Scope::Owner) {
        OWNER_SCAN
    } else {
        1
    }
}

/// Why a round stopped before every lane was blocked or empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The rule's released pods that are not Ready reached maxNotReady.
    NotReady,
    /// The shared network window is full (adaptive rules).
    Network,
    /// The round's cap on releases is reached; the next round follows at once.
    Cap,
}

/// What a caller of [`serve_round`] counts: whether one more release may go, and each
/// release made (already charged in the limiter, the cursor moved).
pub(crate) trait Releases {
    fn may_release(&self) -> Result<(), Stop>;
    fn released(&mut self, index: usize);
}

/// How a round ended: when a pod that waits for the windows could go (None: none
/// does), and what stopped it early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RoundEnd {
    pub wake_at: Option<Millis>,
    pub stopped: Option<Stop>,
}

/// One round of one rule at `now`: the lanes in turn, one pod of each per pass, each
/// release charged in `limiter` at `now`, until a pass releases nothing or `releases`
/// says stop. Released pods leave their lanes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve_round(
    rule: &Rule,
    names: &[&str],
    lanes: &mut [Vec<usize>],
    queue: &[QueuedPod],
    limiter: &mut Limiter,
    cursor: &mut Cursor,
    now: Millis,
    releases: &mut impl Releases,
) -> RoundEnd {
    let scan = scan_of(rule);
    // With only global limits every lane asks the same buckets: once one is full until
    // `t`, so is every other lane, until the next charge. Saves a lookup per lane.
    let shared_buckets = rule.limits.iter().all(|l| l.scope == Scope::Global);
    let mut end = RoundEnd::default();
    let mut blocked = vec![false; lanes.len()];
    loop {
        let mut progress = false;
        let mut full_until: Option<Millis> = None;
        for (lane_no, lane) in lanes.iter_mut().enumerate() {
            if blocked[lane_no] || lane.is_empty() {
                continue;
            }
            if let Err(stop) = releases.may_release() {
                if stop == Stop::Cap {
                    end.wake_at = Some(now);
                }
                end.stopped = Some(stop);
                return end;
            }
            let picked = match full_until {
                Some(earliest) => Err(earliest),
                None => pick(rule, lane, scan, queue, limiter, now),
            };
            match picked {
                Ok(position) => {
                    let index = lane.remove(position);
                    let pod = &queue[index];
                    limiter.record(
                        &rule.name,
                        &rule.limits,
                        &pod.namespace,
                        pod.owner.as_deref(),
                        now,
                        1,
                    );
                    cursor.served(&rule.name, names[lane_no]);
                    releases.released(index);
                    progress = true;
                }
                Err(earliest) => {
                    blocked[lane_no] = true;
                    if shared_buckets {
                        full_until = Some(earliest);
                    }
                    if earliest != Millis::MAX {
                        end.wake_at = Some(end.wake_at.map_or(earliest, |w| w.min(earliest)));
                    }
                }
            }
        }
        if !progress {
            return end;
        }
    }
}

/// A pod's expected release: its place in its rule's order (1 = next) and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimated {
    /// The gate rule that releases it; None when its rule is gone (released at once).
    pub rule: Option<Arc<str>>,
    pub position: usize,
    /// None: beyond what the estimate runs forward, or a window that never frees.
    pub at: Option<Millis>,
}

pub struct EstimateInputs<'a> {
    pub queue: &'a [QueuedPod],
    pub policy: &'a Policy,
    /// The releaser's round-robin position ([`Cursor::default`] when unknown).
    pub cursor: &'a Cursor,
    pub now: Millis,
    /// Releases to run forward at most, all rules together ([`MAX_ESTIMATED`]).
    pub max_releases: usize,
}

/// When each pod of `queue` is expected to be released, in queue order: the rounds of
/// the real release order run forward from `now`, each at the time the windows in
/// `limiter` next have room, every release charged there (so `limiter` must be a scratch
/// copy: it holds the simulated releases afterwards). Pods whose rule is no longer a gate
/// rule of the policy go at once, as the releaser lets them. maxNotReady is not applied.
pub fn estimate(inputs: &EstimateInputs<'_>, limiter: &mut Limiter) -> Vec<Estimated> {
    let queue = inputs.queue;
    let mut out: Vec<Estimated> = vec![
        Estimated {
            rule: None,
            position: 0,
            at: None,
        };
        queue.len()
    ];
    let mut by_rule: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut orphans = Vec::new();
    for (index, pod) in queue.iter().enumerate() {
        match gate_rule(inputs.policy, &pod.rule) {
            Some(rule) => by_rule.entry(&rule.name).or_default().push(index),
            None => orphans.push(index),
        }
    }
    orphans.sort_by(|&a, &b| fifo(&queue[a], &queue[b]));
    for (n, &index) in orphans.iter().enumerate() {
        out[index].position = n + 1;
        out[index].at = Some(inputs.now);
    }
    let mut cursor = inputs.cursor.clone();
    let mut budget = inputs.max_releases;
    for rule in inputs.policy.rules.iter() {
        let Some(indices) = by_rule.remove(&*rule.name) else {
            continue;
        };
        budget -= estimate_rule(
            rule,
            indices,
            inputs,
            limiter,
            &mut cursor,
            budget,
            &mut out,
        );
    }
    out
}

/// Releases of one rule, recorded as they happen in the forward run.
struct Forward<'o> {
    rule: Arc<str>,
    at: Millis,
    released: usize,
    budget: usize,
    out: &'o mut [Estimated],
}

impl Releases for Forward<'_> {
    fn may_release(&self) -> Result<(), Stop> {
        if self.released >= self.budget {
            Err(Stop::Cap)
        } else {
            Ok(())
        }
    }

    fn released(&mut self, index: usize) {
        self.released += 1;
        self.out[index] = Estimated {
            rule: Some(self.rule.clone()),
            position: self.released,
            at: Some(self.at),
        };
    }
}

/// Runs one rule's rounds forward; returns the releases it made.
fn estimate_rule(
    rule: &Rule,
    indices: Vec<usize>,
    inputs: &EstimateInputs<'_>,
    limiter: &mut Limiter,
    cursor: &mut Cursor,
    budget: usize,
    out: &mut [Estimated],
) -> usize {
    let queue = inputs.queue;
    for &index in &indices {
        out[index].rule = Some(rule.name.clone());
    }
    // A rule paused now (a schedule window of events: 0) releases nothing before the
    // pause ends; with no end in sight nothing is estimated.
    let start = match rule.paused_at(inputs.now) {
        Some(Millis::MAX) => return 0,
        Some(until) => until,
        None => inputs.now,
    };
    let (names, lanes) = lanes_in_turn(rule, indices, queue, cursor);
    let mut lanes: BTreeMap<&str, Vec<usize>> = names.into_iter().zip(lanes).collect();
    let mut forward = Forward {
        rule: rule.name.clone(),
        at: start,
        released: 0,
        budget,
        out,
    };
    loop {
        lanes.retain(|_, lane| !lane.is_empty());
        if lanes.is_empty() {
            break;
        }
        // The real releaser plans again at every wake, the lanes in turn from its cursor.
        let (names, mut order) = in_turn(std::mem::take(&mut lanes), cursor.last(&rule.name));
        let end = serve_round(
            rule,
            &names,
            &mut order,
            queue,
            limiter,
            cursor,
            forward.at,
            &mut forward,
        );
        lanes = names.into_iter().zip(order).collect();
        match (end.stopped, end.wake_at) {
            (Some(_), _) | (None, None) => break,
            (None, Some(at)) if at <= forward.at => break,
            (None, Some(at)) => forward.at = at,
        }
    }
    forward.released
}

/// The gated pods the leading releaser saw in its last round, with its round-robin
/// position: what the webhook in the same process knows of the queue. Sorted once here
/// (by rule, namespace, then oldest first), off the webhook's path, so that a decision
/// only slices it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pods: Vec<QueuedPod>,
    cursor: Cursor,
    /// The shared network window after the round (adaptive rules), None without one.
    network: Option<NetworkRoom>,
}

impl Snapshot {
    pub fn new(mut pods: Vec<QueuedPod>, cursor: Cursor) -> Snapshot {
        pods.sort_by(|a, b| {
            (&a.rule, &a.namespace)
                .cmp(&(&b.rule, &b.namespace))
                .then_with(|| fifo(a, b))
        });
        Snapshot {
            pods,
            cursor,
            network: None,
        }
    }

    /// The snapshot with the round's network window.
    pub fn with_network(self, network: Option<NetworkRoom>) -> Snapshot {
        Snapshot { network, ..self }
    }

    pub fn network(&self) -> Option<NetworkRoom> {
        self.network
    }

    pub fn pods(&self) -> &[QueuedPod] {
        &self.pods
    }

    /// The waiting pods of one rule, one lane per namespace, each oldest first.
    fn lanes(&self, rule: &str) -> Vec<&[QueuedPod]> {
        let start = self.pods.partition_point(|p| p.rule.as_str() < rule);
        let end = self.pods.partition_point(|p| p.rule.as_str() <= rule);
        self.pods[start..end]
            .chunk_by(|a, b| a.namespace == b.namespace)
            .collect()
    }
}

/// The expected release of a pod that joins the queue now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joining {
    pub at: Millis,
    /// Pods of the same rule expected to go before it.
    pub ahead: usize,
}

/// When a pod gated now under `rule` in `namespace` is expected to go: it joins the end
/// of its namespace's lane (it is the youngest), behind the pods of `snapshot`, and the
/// windows are those of `limiter` (copied: nothing is charged). A lane of another
/// namespace matters only up to the joining pod's own place in its lane, so longer lanes
/// are cut there, which keeps this cheap on the webhook's path; with `namespace` or
/// `owner` limits that cut makes the answer approximate. None: the windows never free.
pub fn estimate_joining(
    snapshot: &Snapshot,
    policy: &Policy,
    rule: &Rule,
    namespace: &str,
    owner: Option<&str>,
    limiter: &Limiter,
    now: Millis,
) -> Option<Joining> {
    let lanes = snapshot.lanes(&rule.name);
    let mine = lanes
        .iter()
        .find(|lane| lane.first().is_some_and(|p| p.namespace == namespace))
        .map_or(0, |lane| lane.len());
    let mut queue: Vec<QueuedPod> = Vec::new();
    for lane in lanes {
        queue.extend(lane.iter().take(mine + 1).cloned());
    }
    let joining = queue.len();
    queue.push(QueuedPod {
        namespace: namespace.to_string(),
        name: String::new(),
        uid: String::new(),
        resource_version: String::new(),
        rule: rule.name.to_string(),
        owner: owner.map(str::to_string),
        // After every pod already waiting: their times are truncated to the second.
        created: now.max(queue.iter().map(|p| p.created + 1).max().unwrap_or(0)),
    });
    let mut scratch = limiter.copy_rule(&rule.name);
    let estimated = estimate(
        &EstimateInputs {
            queue: &queue,
            policy,
            cursor: &snapshot.cursor,
            now,
            max_releases: MAX_ESTIMATED,
        },
        &mut scratch,
    );
    let mine = &estimated[joining];
    Some(Joining {
        at: mine.at?,
        ahead: mine.position.saturating_sub(1),
    })
}

#[cfg(test)]
mod tests;
