//! The status report, built from what the cluster records: the labelled pods, the
//! StatefulSets, the releaser's Lease. Pure: objects, the policy and `now` in, a report
//! out (its JSON is the documented schema of `status -o json`, README "See the queue").
//!
//! The windows are rebuilt exactly as a new leader rebuilds its own: gate rules from the
//! `released-at` of the pods still labelled released (`releaser::plan::seed`), partition
//! rules from `partition-stepped-at` and the pod each held set's last step released
//! (`releaser::partition_plan::plan_steps`). The releaser's round-robin position, which it
//! keeps in memory, is read back from the last release each rule made. The gated pods'
//! places and times come from `crate::queue::estimate`, the estimate the webhook and the
//! releaser's Events use.

use super::sets::{held_part, StepPod};
use crate::limiter::{Limiter, Millis};
use crate::names::format_time;
use crate::policy::{Action, Limit, Policy, Rule, Scope};
use crate::queue::{estimate, gate_rule, Cursor, EstimateInputs, QueuedPod, MAX_ESTIMATED};
use crate::releaser::plan::{not_ready_by_rule, seed, Charged, ReleasedPod};
use crate::releaser::pods::{view, View};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

pub const API_VERSION: &str = "churn-throttler.io/v1";
pub const KIND: &str = "Status";

/// Never the `admitted-by` of a real process: every release the cluster records is seeded.
const NOBODY: &str = "churn-throttler status (reads only)";

/// What `status` read from the cluster.
pub struct Cluster<'a> {
    pub policy: &'a Policy,
    /// Where the policy came from, in words.
    pub policy_source: &'a str,
    /// The pods labelled `churn-throttler.io/gated`, every namespace.
    pub pods: &'a [Pod],
    /// Every StatefulSet.
    pub sets: &'a [StatefulSet],
    /// Per held set (uid): what the pod its last step released showed.
    pub steps: &'a HashMap<String, StepPod>,
    pub lease: Option<&'a Lease>,
    /// namespace/name of the Lease.
    pub lease_name: &'a str,
    /// Only this namespace's pods and sets are listed (the estimates count every one).
    pub namespace: Option<&'a str>,
    pub now: Millis,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub time: String,
    /// The namespace listed; null: every namespace.
    pub namespace: Option<String>,
    /// Where the policy was read from.
    pub policy: String,
    /// The releaser's Lease; null when it does not exist.
    pub leader: Option<Leader>,
    pub rules: Vec<RuleStatus>,
    pub gated_pods: Vec<GatedPod>,
    pub held_stateful_sets: Vec<HeldStatefulSet>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Leader {
    /// namespace/name of the Lease.
    pub lease: String,
    pub holder: Option<String>,
    pub renew_time: Option<String>,
    pub renewed_seconds_ago: Option<f64>,
    pub lease_duration_seconds: Option<i32>,
    /// No renewal within the lease's duration: nobody releases until a replica takes it.
    pub expired: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuleStatus {
    pub name: String,
    /// gate or partition.
    pub action: &'static str,
    /// The limits, as the policy says them (e.g. "5 per 10s (global)").
    pub limit: String,
    /// Events (releases or steps) in the current window of the fullest bucket of the
    /// rule's first limit, and that limit's events and window.
    pub window_events: u32,
    pub window_limit: u32,
    pub window_seconds: f64,
    /// Between consecutive events after the burst; null for a plain window.
    pub spacing_seconds: Option<f64>,
    /// When one more event fits the windows (for a namespace or owner with nothing in its
    /// own window).
    pub next_free_slot: String,
    pub next_free_in_seconds: f64,
    /// Gated pods, or held StatefulSets, waiting for the rule in the whole cluster.
    pub waiting: usize,
    /// Partition rules: pods the held sets' steps still re-create.
    pub pods_to_step: Option<u64>,
    /// Released pods not yet Ready (what maxNotReady counts).
    pub released_not_ready: u32,
    pub max_not_ready: Option<u32>,
    /// When the last waiting pod or set is expected to be done.
    pub last_estimated: Option<String>,
    pub last_estimated_in_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatedPod {
    pub namespace: String,
    pub name: String,
    /// The gated-by annotation.
    pub rule: String,
    pub created: String,
    /// Place in its rule's release order, every namespace counted (1 = next).
    pub position: usize,
    pub estimated_release: Option<String>,
    pub estimated_in_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeldStatefulSet {
    pub namespace: String,
    pub name: String,
    /// The paced-by annotation.
    pub rule: String,
    pub replicas: u32,
    pub partition: u32,
    /// The partition-target annotation; null when unreadable.
    pub target: Option<u32>,
    pub updated_replicas: u32,
    pub ready_replicas: u32,
    pub held_since: Option<String>,
    /// Steps (pods) left to the target.
    pub steps_left: u32,
    /// When its last step is expected (null: not estimated).
    pub estimated_end: Option<String>,
    pub estimated_in_seconds: Option<f64>,
}

/// Seconds from `now` to `at` (negative when past).
pub(super) fn seconds_until(at: Millis, now: Millis) -> f64 {
    (at as f64 - now as f64) / 1000.0
}

fn spacing(limit: &Limit) -> Option<f64> {
    limit.spacing_ms().map(|ms| ms as f64 / 1000.0)
}

fn limits_text(rule: &Rule) -> String {
    let limits: Vec<String> = rule.limits.iter().map(|l| l.to_string()).collect();
    limits.join(" and ")
}

/// A rule's line with the window and slot figures; the caller fills in the rest.
pub(super) fn rule_line(
    rule: &Rule,
    action: &'static str,
    window_events: u32,
    next_free: Millis,
    now: Millis,
) -> RuleStatus {
    let first = rule.limits.first();
    RuleStatus {
        name: rule.name.to_string(),
        action,
        limit: limits_text(rule),
        window_events,
        window_limit: first.map_or(0, |l| l.events),
        window_seconds: first.map_or(0.0, |l| l.window.as_secs_f64()),
        spacing_seconds: first.and_then(spacing),
        next_free_slot: format_time(next_free),
        next_free_in_seconds: seconds_until(next_free, now).max(0.0),
        waiting: 0,
        pods_to_step: None,
        released_not_ready: 0,
        max_not_ready: rule.max_not_ready,
        last_estimated: None,
        last_estimated_in_seconds: None,
    }
}

/// The fullest bucket of `limit`: times (at most `now`) in its current window, per scope key.
pub(super) fn fullest_window<'k>(
    limit: &Limit,
    times: impl Iterator<Item = (&'k str, Option<&'k str>, Millis)>,
    now: Millis,
) -> u32 {
    let window = limit.window.as_millis() as Millis;
    let mut counts: HashMap<(&str, &str), u32> = HashMap::new();
    for (namespace, owner, at) in times {
        let at = at.min(now);
        if at + window <= now {
            continue;
        }
        let key = match limit.scope {
            Scope::Global => ("", ""),
            Scope::Namespace => (namespace, ""),
            Scope::Owner => ("", owner.unwrap_or("")),
        };
        *counts.entry(key).or_insert(0) += 1;
    }
    counts.values().copied().max().unwrap_or(0)
}

/// The releaser's round-robin position, as its last releases left it: per rule, the
/// namespace of the latest release it made (pods the webhook admitted at once do not
/// move it).
pub fn cursor_of(policy: &Policy, released: &[ReleasedPod]) -> Cursor {
    let mut last: HashMap<Arc<str>, (Millis, &str)> = HashMap::new();
    for pod in released.iter().filter(|p| p.admitted_by.is_none()) {
        let (Some(rule), Some(at)) = (gate_rule(policy, &pod.rule), pod.released_at) else {
            continue;
        };
        let entry = last.entry(rule.name.clone()).or_insert((0, ""));
        if (at, pod.namespace.as_str()) > *entry {
            *entry = (at, pod.namespace.as_str());
        }
    }
    let mut cursor = Cursor::default();
    for (rule, (_, namespace)) in last {
        cursor.served(&rule, namespace);
    }
    cursor
}

/// The whole report.
pub fn build(c: &Cluster<'_>) -> Report {
    let (mut rules, gated_pods, mut notes) = gate_part(c);
    let (partition_rules, held_stateful_sets, partition_notes) = held_part(c);
    rules.extend(partition_rules);
    // In policy order, as the policy file lists them.
    let order: HashMap<&str, usize> = c
        .policy
        .rules
        .iter()
        .enumerate()
        .map(|(i, r)| (&*r.name, i))
        .collect();
    rules.sort_by_key(|r| order.get(r.name.as_str()).copied().unwrap_or(usize::MAX));
    notes.extend(partition_notes);
    Report {
        api_version: API_VERSION,
        kind: KIND,
        time: format_time(c.now),
        namespace: c.namespace.map(str::to_string),
        policy: c.policy_source.to_string(),
        leader: leader(c),
        rules,
        gated_pods,
        held_stateful_sets,
        notes,
    }
}

fn leader(c: &Cluster<'_>) -> Option<Leader> {
    let spec = c.lease?.spec.as_ref();
    let renew = spec
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| crate::names::millis(t.0));
    let duration = spec.and_then(|s| s.lease_duration_seconds);
    let expired = match (renew, duration) {
        (Some(renew), Some(secs)) => renew + (secs.max(0) as Millis) * 1000 < c.now,
        _ => true,
    };
    Some(Leader {
        lease: c.lease_name.to_string(),
        holder: spec
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty()),
        renew_time: renew.map(format_time),
        renewed_seconds_ago: renew.map(|r| seconds_until(c.now, r)),
        lease_duration_seconds: duration,
        expired,
    })
}

/// The gate rules' lines and the gated pods, with their places and estimated releases.
/// The labelled pods as the gate releaser sorts them.
#[derive(Default)]
struct Labelled {
    queue: Vec<QueuedPod>,
    /// Labelled gated, our gate removed by someone else.
    ungated: Vec<QueuedPod>,
    released: Vec<ReleasedPod>,
}

fn labelled(pods: &[Pod]) -> Labelled {
    let mut out = Labelled::default();
    for pod in pods {
        match view(pod) {
            View::Queued { pod, .. } => out.queue.push(pod),
            View::UngatedElsewhere { pod } => out.ungated.push(pod),
            View::Released(pod) => out.released.push(pod),
            View::Ignored => {}
        }
    }
    out
}

/// The gate rules' windows as a leader starting now rebuilds them from the pods.
fn seeded(policy: &Policy, pods: &Labelled, now: Millis) -> Limiter {
    let mut limiter = Limiter::new(policy.max_buckets);
    seed(
        &mut limiter,
        policy,
        &pods.released,
        &mut Charged::default(),
        NOBODY,
        now,
    );
    // The releaser counts a gate removed by someone else when it sees it: now.
    for pod in &pods.ungated {
        if let Some(rule) = gate_rule(policy, &pod.rule) {
            let owner = pod.owner.as_deref();
            limiter.record(&rule.name, &rule.limits, &pod.namespace, owner, now, 1);
        }
    }
    limiter
}

/// Each gate rule's line: its fullest window, next slot and pods not Ready.
fn gate_lines(
    policy: &Policy,
    pods: &Labelled,
    limiter: &Limiter,
    not_ready: &HashMap<String, u32>,
    now: Millis,
) -> Vec<RuleStatus> {
    let (released, ungated) = (&pods.released, &pods.ungated);
    let mut lines: Vec<RuleStatus> = Vec::new();
    for rule in policy.rules.iter().filter(|r| r.action == Action::Gate) {
        let Some(first) = rule.limits.first() else {
            continue;
        };
        let times = released
            .iter()
            .filter(|p| gate_rule(policy, &p.rule).is_some_and(|r| r.name == rule.name))
            .filter_map(|p| Some((p.namespace.as_str(), p.owner.as_deref(), p.released_at?)))
            .chain(
                ungated
                    .iter()
                    .filter(|p| p.rule == *rule.name)
                    .map(|p| (p.namespace.as_str(), p.owner.as_deref(), now)),
            );
        let window_events = fullest_window(first, times, now);
        let next_free = limiter.earliest(&rule.name, &rule.limits, "", None, 1, now);
        let mut line = rule_line(rule, "gate", window_events, next_free, now);
        line.released_not_ready = not_ready.get(&*rule.name).copied().unwrap_or(0);
        lines.push(line);
    }
    lines
}

fn gate_part(c: &Cluster<'_>) -> (Vec<RuleStatus>, Vec<GatedPod>, Vec<String>) {
    let policy = c.policy;
    let now = c.now;
    let pods = labelled(c.pods);
    let mut limiter = seeded(policy, &pods, now);
    let not_ready = not_ready_by_rule(&pods.released);
    let mut lines = gate_lines(policy, &pods, &limiter, &not_ready, now);
    let queue = &pods.queue;
    let cursor = cursor_of(policy, &pods.released);
    let estimated = estimate(
        &EstimateInputs {
            queue,
            policy,
            cursor: &cursor,
            now,
            max_releases: MAX_ESTIMATED,
        },
        &mut limiter,
    );
    let mut pods = Vec::new();
    for (pod, e) in queue.iter().zip(&estimated) {
        if let Some(line) = lines
            .iter_mut()
            .find(|l| e.rule.as_deref() == Some(l.name.as_str()))
        {
            line.waiting += 1;
            if let Some(at) = e.at {
                let in_s = seconds_until(at, now);
                if line
                    .last_estimated_in_seconds
                    .is_none_or(|last| in_s > last)
                {
                    line.last_estimated = Some(format_time(at));
                    line.last_estimated_in_seconds = Some(in_s.max(0.0));
                }
            }
        }
        if c.namespace.is_some_and(|ns| ns != pod.namespace) {
            continue;
        }
        pods.push(GatedPod {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            rule: pod.rule.clone(),
            created: format_time(pod.created),
            position: e.position,
            estimated_release: e.at.map(format_time),
            estimated_in_seconds: e.at.map(|at| seconds_until(at, now).max(0.0)),
        });
    }
    let rank: HashMap<&str, usize> = policy
        .rules
        .iter()
        .enumerate()
        .map(|(i, r)| (&*r.name, i))
        .collect();
    pods.sort_by(|a, b| {
        let key = |p: &GatedPod| (rank.get(p.rule.as_str()).copied(), p.position);
        key(a).cmp(&key(b)).then_with(|| a.name.cmp(&b.name))
    });
    let notes = gate_notes(policy, queue, &not_ready);
    (lines, pods, notes)
}

/// What the gate estimates leave out, and what holds the releaser back now.
fn gate_notes(
    policy: &Policy,
    queue: &[QueuedPod],
    not_ready: &HashMap<String, u32>,
) -> Vec<String> {
    let mut notes = Vec::new();
    if !queue.is_empty() {
        notes.push(
            "gated pods: places and times run the releaser's order (per rule, namespaces in turn, \
             oldest first) forward from the windows the cluster records; they assume no new pod \
             joins, maxNotReady does not stop the releaser, and a leader releases without a pause"
                .to_string(),
        );
    }
    for (rule, max) in policy
        .rules
        .iter()
        .filter(|r| r.action == Action::Gate)
        .filter_map(|r| Some((r, r.max_not_ready?)))
    {
        let n = not_ready.get(&*rule.name).copied().unwrap_or(0);
        if n >= max {
            notes.push(format!(
                "rule {}: {n} released pod(s) not Ready (maxNotReady {max}): releases wait for them, \
                 later than estimated",
                rule.name
            ));
        }
    }
    if queue.iter().any(|p| gate_rule(policy, &p.rule).is_none()) {
        notes.push(
            "pods whose gated-by rule is not a gate rule of the policy are released at once".into(),
        );
    }
    notes
}
