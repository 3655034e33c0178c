//! What `status` reads (`Cluster`) and what it reports (`Report`: its JSON is the
//! documented schema of `status -o json`), with the window arithmetic both parts share.

use crate::limiter::Millis;
use crate::names::format_time;
use crate::objects::statefulsets::PodProgress;
use crate::policy::{Limit, Policy, Rule, Scope};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DynamicObject;
use serde::Serialize;
use std::collections::HashMap;

/// What the pod a held set's last step released showed when read, and from when its
/// deletion counts (`statefulsets::pod_progress`, `statefulsets::deleted_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepPod {
    pub progress: PodProgress,
    pub deleted_by: Millis,
}

pub const API_VERSION: &str = "churn-throttler.io/v1";
pub const KIND: &str = "Status";

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
    /// The PacingOverride objects (pauses and overrides).
    pub overrides: &'a [DynamicObject],
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
    /// Pauses and overrides in force (`churn-throttler pause`, `override`).
    pub pacing_overrides: Vec<PacingStatus>,
    pub notes: Vec<String>,
}

/// One pause or override in force.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PacingStatus {
    /// The PacingOverride object's name.
    pub name: String,
    /// pause or override.
    pub kind: &'static str,
    /// The rules it applies to; empty: every rule.
    pub rules: Vec<String>,
    /// An override's figures, e.g. "50 events, burst 5".
    pub figures: Option<String>,
    pub author: String,
    pub reason: String,
    pub since: String,
    /// null: until resumed.
    pub until: Option<String>,
    pub seconds_left: Option<f64>,
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
    /// The adaptive rules' network window as the leader last recorded it on the Lease,
    /// e.g. "12 floor=2.0s p90=3.1s change=queue"; None without adaptive rules.
    pub network_window: Option<String>,
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
    /// The rule's schedule windows now (null: the rule has none).
    pub schedule: Option<ScheduleStatus>,
}

/// A rule's schedule: what is in force now, from which window, and the next change.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    /// e.g. "50 per 10s (global), burst 2, maxNotReady 400" or "paused until <time>".
    pub in_force: String,
    /// e.g. "schedules[1] \"0 1 * * *\" UTC" or "the rule's own".
    pub source: String,
    /// A window of `events: 0` is open: nothing is released or stepped.
    pub paused: bool,
    pub paused_until: Option<String>,
    /// When the limits in force change next (null: not within 400 days).
    pub next_change: Option<String>,
    pub next_change_in_seconds: Option<f64>,
    /// What is in force from then.
    pub next_in_force: Option<String>,
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
pub fn seconds_until(at: Millis, now: Millis) -> f64 {
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
pub fn rule_line(
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
        schedule: None,
    }
}

/// The fullest bucket of `limit`: times (at most `now`) in its current window, per scope key.
pub fn fullest_window<'k>(
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
