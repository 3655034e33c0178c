//! The status report, built from what the cluster records: the labelled pods, the
//! StatefulSets, the releaser's Lease. Pure: objects, the policy and `now` in, a report
//! out (its JSON is the documented schema of `status -o json`, README "See the queue").
//!
//! The windows are rebuilt exactly as a new leader rebuilds its own: gate rules from the
//! `released-at` of the pods still labelled released (`pacing::gate::seed`), partition
//! rules from `partition-stepped-at` and the pod each held set's last step released
//! (`pacing::partition::plan_steps`). The releaser's round-robin position, which it
//! keeps in memory, is read back from the last release each rule made. The gated pods'
//! places and times come from `crate::queue::estimate`, the estimate the webhook and the
//! releaser's Events use.

use super::report::{
    fullest_window, rule_line, seconds_until, Cluster, GatedPod, Leader, PacingStatus, Report,
    RuleStatus, ScheduleStatus, API_VERSION, KIND,
};
use super::sets::held_part;
use crate::limiter::{Limiter, Millis};
use crate::names::format_time;
use crate::objects::overrides::{read, until, Live, Read};
use crate::objects::pods::{view, View};
use crate::pacing::gate::{not_ready_by_rule, seed, Charged, ReleasedPod};
use crate::pacing::schedule::{Adjustment, Scoped};
use crate::policy::{Action, Policy};
use crate::queue::{estimate, gate_rule, Cursor, EstimateInputs, QueuedPod, MAX_ESTIMATED};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DynamicObject;
use std::collections::HashMap;
use std::sync::Arc;

/// Never the `admitted-by` of a real process: every release the cluster records is seeded.
const NOBODY: &str = "churn-throttler status (reads only)";

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
    // The windows, slots and estimates with the limits in force now (schedule windows
    // applied); each rule with schedules says which window is in force and what is next.
    let (pacing, pacing_notes) = pacing_part(c.overrides, c.now);
    let scoped: Vec<Scoped> = pacing.iter().map(|(l, _)| l.scoped.clone()).collect();
    let (in_force, _) = crate::pacing::schedule::policy_in_force(c.policy, &scoped, c.now);
    let at_now = Cluster {
        policy: &in_force,
        ..*c
    };
    let (mut rules, gated_pods, mut notes) = gate_part(&at_now);
    let (partition_rules, held_stateful_sets, partition_notes) = held_part(&at_now);
    rules.extend(partition_rules);
    for line in &mut rules {
        if let Some(rule) = c.policy.rules.iter().find(|r| *r.name == line.name) {
            line.schedule = schedule_status(rule, &scoped, c.now);
        }
    }
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
    notes.extend(pacing_notes);
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
        pacing_overrides: pacing.into_iter().map(|(_, s)| s).collect(),
        notes,
    }
}

/// The pauses and overrides in force, oldest first, and a note per ignored object.
fn pacing_part(objects: &[DynamicObject], now: Millis) -> (Vec<(Live, PacingStatus)>, Vec<String>) {
    let mut live = Vec::new();
    let mut notes = Vec::new();
    for object in objects {
        match read(object, now) {
            Read::Live(l) => {
                let until = until(&l);
                let (kind, figures) = match l.scoped.adjustment {
                    Adjustment::Pause { .. } => ("pause", None),
                    Adjustment::Override {
                        events,
                        burst,
                        max_not_ready,
                        ..
                    } => {
                        let mut f = format!("{events} events");
                        if let Some(b) = burst {
                            f.push_str(&format!(", burst {b}"));
                        }
                        if let Some(m) = max_not_ready {
                            f.push_str(&format!(", maxNotReady {m}"));
                        }
                        ("override", Some(f))
                    }
                };
                let status = PacingStatus {
                    name: l.name.clone(),
                    kind,
                    rules: l.scoped.rules.clone().unwrap_or_default(),
                    figures,
                    author: l.author.clone(),
                    reason: l.reason.clone(),
                    since: format_time(l.created),
                    until: until.map(format_time),
                    seconds_left: until.map(|u| seconds_until(u, now)),
                };
                live.push((l, status));
            }
            Read::Expired { .. } => {}
            Read::Ignored { name, reason } => notes.push(format!(
                "PacingOverride {name} is ignored (malformed: {reason}); no pause or override applies from it"
            )),
        }
    }
    live.sort_by(|a, b| (a.0.created, &a.0.name).cmp(&(b.0.created, &b.0.name)));
    (live, notes)
}

/// Which schedule window, pause or override is in force for `rule` and what comes next
/// (None without schedules or adjustments).
fn schedule_status(
    rule: &crate::policy::Rule,
    scoped: &[Scoped],
    now: Millis,
) -> Option<ScheduleStatus> {
    use crate::pacing::schedule::{
        adjustments_for, describe_in_force, limit_in_force, source_words,
    };
    let adjustments = adjustments_for(scoped, &rule.name);
    if rule.schedules.is_empty() && adjustments.is_empty() {
        return None;
    }
    let in_force = limit_in_force(rule, &adjustments, now);
    let next = in_force.next_change.map(|at| {
        let then = limit_in_force(rule, &adjustments, at);
        (at, describe_in_force(&then))
    });
    Some(ScheduleStatus {
        in_force: describe_in_force(&in_force),
        source: source_words(rule, in_force.source),
        paused: in_force.paused_until.is_some(),
        paused_until: in_force
            .paused_until
            .filter(|&u| u != Millis::MAX)
            .map(format_time),
        next_change: next.as_ref().map(|(at, _)| format_time(*at)),
        next_change_in_seconds: next.as_ref().map(|(at, _)| seconds_until(*at, now)),
        next_in_force: next.map(|(_, text)| text),
    })
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
        network_window: c
            .lease?
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::names::NETWORK_WINDOW_ANNOTATION))
            .cloned(),
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
