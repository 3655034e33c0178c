//! The release plan: which gated pods to release now, and when to look again.
//! Pure: the queue, readiness, the policy, the windows and `now` come in; nothing here
//! reads a clock, sleeps or talks to the API server.
//!
//! Order: the orphans first (pods whose rule is no longer a gate rule of the policy:
//! they are released at once, never stranded), then, per gate rule, round-robin across
//! namespaces (a cursor remembers the last namespace served, so one slot per round
//! still rotates) and oldest first within a namespace. A release must fit every limit
//! of its rule in the shared limiter and keep the rule's released-but-not-Ready pods
//! within `maxNotReady`. With an `owner`-scoped limit a namespace's oldest pod may be
//! passed over for a younger one of another owner whose bucket has room, so one
//! controller's budget never blocks another's.

pub use super::network::NetworkRoom;
use crate::limiter::{Limiter, Millis};
use crate::policy::{Policy, Rule};
use crate::queue::{fifo, lanes_in_turn, serve_round, Releases, Stop};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

// The release order lives in crate::queue, shared with the estimates.
pub use crate::queue::{gate_rule, Cursor, QueuedPod};

/// At most this many releases per round; the rest follow in the next round at once.
/// Bounds the burst of API calls one round makes, not the rate (the limiter does that).
pub const MAX_RELEASES_PER_ROUND: usize = 100;

/// A pod churn-throttler released (label `released`), kept until it is Ready and out of
/// every window, so that windows and readiness can be rebuilt from the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub rule: String,
    pub owner: Option<String>,
    /// From the released-at annotation; None when it is missing or unreadable.
    pub released_at: Option<Millis>,
    /// Ready, finished or being deleted: it no longer counts against maxNotReady.
    pub settled: bool,
    /// Still held by another component's scheduling gate: it is not starting yet, so
    /// it counts against maxNotReady only once those gates are gone too.
    pub held_elsewhere: bool,
    /// The process whose webhook admitted it at once (admitted-by); None for a pod the
    /// releaser released.
    pub admitted_by: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseWhy {
    /// Its rule had room.
    Rate,
    /// Its rule is gone from the policy (or no longer gates): released at once.
    RuleGone,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// Index into the queue that was planned.
    pub index: usize,
    /// The policy's rule (None for orphans).
    pub rule: Option<Arc<str>>,
    pub why: ReleaseWhy,
    /// Time from creation to this release.
    pub waited_ms: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// The rule's windows are full.
    Rate,
    /// The rule's released pods that are not Ready reached maxNotReady.
    NotReady { not_ready: u32, max: u32 },
    /// The shared network window is full: `in_flight` released pods of adaptive rules
    /// wait for their network (crate::pacing::network).
    Network { in_flight: u32, window: u32 },
    /// The rule is paused (a schedule window of `events: 0`) until then (u64::MAX: no
    /// end in sight).
    Paused { until: Millis },
}

/// Pods of one rule in one namespace that still wait after this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub rule: Arc<str>,
    pub namespace: String,
    pub pods: usize,
    /// Queue index of the oldest pod waiting here (the one an Event is attached to).
    pub head: usize,
    pub blocked: Blocked,
    /// Pods and namespaces waiting for this rule in the whole cluster.
    pub rule_pods: usize,
    pub rule_namespaces: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// In the order they should be sent.
    pub releases: Vec<Release>,
    /// When a pod that waits for the rate could go (None: nothing waits on time).
    pub wake_at: Option<Millis>,
    pub waiting: Vec<Waiting>,
}

pub struct Inputs<'a> {
    pub queue: &'a [QueuedPod],
    /// Released pods not yet Ready, per rule name.
    pub not_ready: &'a HashMap<String, u32>,
    pub policy: &'a Policy,
    pub now: Millis,
    pub max_releases: usize,
    /// The network window of the adaptive rules, shared by them all: None when no rule
    /// is adaptive.
    pub network: Option<NetworkRoom>,
}

/// Decides this round's releases and charges each in `limiter` at `now`:
/// [`order`] then [`charge`].
pub fn plan(inputs: &Inputs<'_>, limiter: &mut Limiter, cursor: &mut Cursor) -> Plan {
    charge(order(inputs, cursor), limiter, cursor).into_plan()
}

/// The queue in release order, before any window is asked: the orphans oldest first,
/// then each gate rule's lanes (one per namespace, oldest first, in turn from the
/// cursor), rules in policy order. It needs no limiter, so the releaser builds it
/// outside the limiter's lock and holds that lock only for [`charge`].
pub struct Order<'a> {
    inputs: &'a Inputs<'a>,
    orphans: Vec<usize>,
    rules: Vec<RuleLanes<'a>>,
}

struct RuleLanes<'a> {
    rule: &'a Rule,
    names: Vec<&'a str>,
    lanes: Vec<Vec<usize>>,
}

/// Groups and sorts the queue; the cursor is only read.
pub fn order<'a>(inputs: &'a Inputs<'a>, cursor: &Cursor) -> Order<'a> {
    let mut by_rule: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut orphans = Vec::new();
    for (index, pod) in inputs.queue.iter().enumerate() {
        match gate_rule(inputs.policy, &pod.rule) {
            Some(rule) => by_rule.entry(&rule.name).or_default().push(index),
            None => orphans.push(index),
        }
    }
    orphans.sort_by(|&a, &b| fifo(&inputs.queue[a], &inputs.queue[b]));
    // Rules in policy order, so an earlier rule is not starved of the per-round cap.
    let rules = inputs
        .policy
        .rules
        .iter()
        .filter_map(|rule| {
            let indices = by_rule.remove(&*rule.name)?;
            let (names, lanes) = lanes_in_turn(rule, indices, inputs.queue, cursor);
            Some(RuleLanes { rule, names, lanes })
        })
        .collect();
    Order {
        inputs,
        orphans,
        rules,
    }
}

/// A round charged, before what still waits is described ([`RoundCharged::into_plan`], which
/// needs no limiter either).
pub struct RoundCharged<'a> {
    plan: Plan,
    left: Vec<(RuleLanes<'a>, Option<Blocked>)>,
}

impl RoundCharged<'_> {
    /// The plan, with what still waits per rule and namespace.
    pub fn into_plan(self) -> Plan {
        let mut plan = self.plan;
        for (lanes, readiness) in &self.left {
            describe_waiting(lanes, *readiness, &mut plan);
        }
        plan
    }
}

/// Runs the round on `order`: orphans go at once, then each rule's lanes in turn while
/// its windows have room, each release charged in `limiter` at `now`.
pub fn charge<'a>(
    order: Order<'a>,
    limiter: &mut Limiter,
    cursor: &mut Cursor,
) -> RoundCharged<'a> {
    let inputs = order.inputs;
    let now = inputs.now;
    let mut out = Plan::default();
    for &index in &order.orphans {
        if out.releases.len() >= inputs.max_releases {
            out.wake_at = Some(now);
            break;
        }
        out.releases.push(Release {
            index,
            rule: None,
            why: ReleaseWhy::RuleGone,
            waited_ms: now.saturating_sub(inputs.queue[index].created),
        });
    }
    let mut network = inputs.network;
    let left = order
        .rules
        .into_iter()
        .map(|lanes| plan_rule(lanes, inputs, limiter, cursor, &mut network, &mut out))
        .collect();
    RoundCharged { plan: out, left }
}

/// This round's releases of one rule, as the shared release order makes them: each one
/// counts against the round's cap and, until it is Ready, against maxNotReady.
struct Round<'a, 'p> {
    rule: &'a Rule,
    queue: &'a [QueuedPod],
    now: Millis,
    max_releases: usize,
    not_ready: u32,
    /// The shared network window, for an adaptive rule: each release takes a place in it.
    network: Option<&'p mut NetworkRoom>,
    out: &'p mut Plan,
}

impl Releases for Round<'_, '_> {
    fn may_release(&self) -> Result<(), Stop> {
        if self
            .rule
            .max_not_ready
            .is_some_and(|max| self.not_ready >= max)
        {
            return Err(Stop::NotReady);
        }
        if self.network.as_ref().is_some_and(|n| n.full()) {
            return Err(Stop::Network);
        }
        if self.out.releases.len() >= self.max_releases {
            return Err(Stop::Cap);
        }
        Ok(())
    }

    fn released(&mut self, index: usize) {
        self.out.releases.push(Release {
            index,
            rule: Some(self.rule.name.clone()),
            why: ReleaseWhy::Rate,
            waited_ms: self.now.saturating_sub(self.queue[index].created),
        });
        self.not_ready += 1;
        if let Some(network) = self.network.as_mut() {
            network.in_flight += 1;
        }
    }
}

/// One rule's round; returns its lanes as the round left them, and whether maxNotReady
/// stopped it.
fn plan_rule<'a>(
    mut lanes: RuleLanes<'a>,
    inputs: &Inputs<'_>,
    limiter: &mut Limiter,
    cursor: &mut Cursor,
    network: &mut Option<NetworkRoom>,
    out: &mut Plan,
) -> (RuleLanes<'a>, Option<Blocked>) {
    let rule = lanes.rule;
    let queue = inputs.queue;
    let now = inputs.now;
    // A paused rule lifts no gate; the releaser looks again when the pause ends.
    if let Some(until) = rule.paused_at(now) {
        if until != Millis::MAX {
            out.wake_at = Some(out.wake_at.map_or(until, |w| w.min(until)));
        }
        return (lanes, Some(Blocked::Paused { until }));
    }
    let mut round = Round {
        rule,
        queue,
        now,
        max_releases: inputs.max_releases,
        not_ready: inputs.not_ready.get(&*rule.name).copied().unwrap_or(0),
        network: network.as_mut().filter(|_| rule.adaptive),
        out,
    };
    let end = serve_round(
        rule,
        &lanes.names,
        &mut lanes.lanes,
        queue,
        limiter,
        cursor,
        now,
        &mut round,
    );
    let not_ready = round.not_ready;
    if let Some(wake) = end.wake_at {
        out.wake_at = Some(out.wake_at.map_or(wake, |w| w.min(wake)));
    }
    let readiness = match end.stopped {
        Some(Stop::NotReady) => Some(Blocked::NotReady {
            not_ready,
            max: rule.max_not_ready.unwrap_or(0),
        }),
        Some(Stop::Network) => network.map(|n| Blocked::Network {
            in_flight: n.in_flight,
            window: n.window,
        }),
        _ => None,
    };
    (lanes, readiness)
}

/// What still waits per namespace; `readiness` when maxNotReady stopped the round. When
/// they go is estimated apart, for the pods an Event speaks of (crate::queue::estimate).
fn describe_waiting(
    RuleLanes { rule, names, lanes }: &RuleLanes<'_>,
    readiness: Option<Blocked>,
    out: &mut Plan,
) {
    let counts: Vec<usize> = lanes.iter().map(Vec::len).collect();
    let rule_pods: usize = counts.iter().sum();
    let rule_namespaces = counts.iter().filter(|&&c| c > 0).count();
    for (lane_no, lane) in lanes.iter().enumerate() {
        let Some(&head) = lane.first() else {
            continue;
        };
        out.waiting.push(Waiting {
            rule: rule.name.clone(),
            namespace: names[lane_no].to_string(),
            pods: lane.len(),
            head,
            blocked: readiness.unwrap_or(Blocked::Rate),
            rule_pods,
            rule_namespaces,
        });
    }
}

/// Release times already charged in the limiter by this process, by pod UID, so that
/// seeding again (after a lost and regained lease) never charges a release twice.
#[derive(Debug, Clone, Default)]
pub struct Charged {
    at: HashMap<String, Millis>,
}

impl Charged {
    pub fn insert(&mut self, uid: &str, at: Millis) {
        self.at.insert(uid.to_string(), at);
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.at.contains_key(uid)
    }

    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Forgets charges no window of any rule can still see.
    pub fn prune(&mut self, policy: &Policy, now: Millis) {
        let horizon = longest_window(policy);
        self.at.retain(|_, &mut at| at + horizon > now);
    }
}

/// The longest window of any rule: how long a release time matters.
pub fn longest_window(policy: &Policy) -> Millis {
    policy
        .rules
        .iter()
        .flat_map(|r| r.limits.iter())
        .map(|l| l.window.as_millis() as Millis)
        .max()
        .unwrap_or(0)
}

/// The longest window of one rule's limits.
pub(super) fn rule_window(rule: &Rule) -> Millis {
    rule.limits
        .iter()
        .map(|l| l.window.as_millis() as Millis)
        .max()
        .unwrap_or(0)
}

/// Rebuilds the windows from the release times recorded on pods: each release still
/// inside its rule's window, not already charged by this process, is charged at its
/// recorded time. Pods a webhook admitted at once under a gate rule carry the same
/// record; those this process admitted (`own_instance`) are already in its limiter.
/// Returns how many were charged.
///
/// What this cannot give back: releases of pods deleted since (their annotation went
/// with them), and pods un-gated by hand without the releaser seeing them.
pub fn seed(
    limiter: &mut Limiter,
    policy: &Policy,
    released: &[ReleasedPod],
    charged: &mut Charged,
    own_instance: &str,
    now: Millis,
) -> usize {
    let todo = to_seed(policy, released, charged, own_instance, now);
    record_seeds(limiter, &todo, charged)
}

/// A release to charge again at its recorded time.
pub struct Seed<'p> {
    at: Millis,
    pod: &'p ReleasedPod,
    rule: &'p Rule,
}

/// What [`seed`] charges, in time order, without the limiter (built outside its lock).
pub fn to_seed<'p>(
    policy: &'p Policy,
    released: &'p [ReleasedPod],
    charged: &Charged,
    own_instance: &str,
    now: Millis,
) -> Vec<Seed<'p>> {
    let mut todo: Vec<Seed<'p>> = released
        .iter()
        .filter(|p| !charged.contains(&p.uid))
        .filter(|p| p.admitted_by.as_deref() != Some(own_instance))
        .filter_map(|pod| {
            let rule = gate_rule(policy, &pod.rule)?;
            // A release time in the future (clock skew) counts as now.
            let at = pod.released_at?.min(now);
            (at + rule_window(rule) > now).then_some(Seed { at, pod, rule })
        })
        .collect();
    // Charges are recorded in time order so every window is exact.
    todo.sort_by(|a, b| (a.at, &a.pod.uid).cmp(&(b.at, &b.pod.uid)));
    todo
}

/// Charges `todo` (from [`to_seed`]) in `limiter` and remembers each; returns how many.
pub fn record_seeds(limiter: &mut Limiter, todo: &[Seed<'_>], charged: &mut Charged) -> usize {
    for Seed { at, pod, rule } in todo {
        limiter.record(
            &rule.name,
            &rule.limits,
            &pod.namespace,
            pod.owner.as_deref(),
            *at,
            1,
        );
        charged.insert(&pod.uid, *at);
    }
    todo.len()
}

/// Released pods not yet settled, per rule name (what maxNotReady counts).
pub fn not_ready_by_rule(released: &[ReleasedPod]) -> HashMap<String, u32> {
    let mut counts = HashMap::new();
    for pod in released.iter().filter(|p| !p.settled && !p.held_elsewhere) {
        *counts.entry(pod.rule.clone()).or_insert(0) += 1;
    }
    counts
}

/// Released pods whose label can go: settled, and their release out of every window of
/// their rule (until then the label keeps them visible for seeding).
pub fn labels_to_drop(released: &[ReleasedPod], policy: &Policy, now: Millis) -> Vec<usize> {
    released
        .iter()
        .enumerate()
        .filter(|(_, p)| p.settled)
        .filter(|(_, p)| match (gate_rule(policy, &p.rule), p.released_at) {
            (Some(rule), Some(at)) => at.min(now) + rule_window(rule) <= now,
            _ => true,
        })
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
