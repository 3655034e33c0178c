//! The decision on one admission request: policy + limiter state + now -> verdict.
//! Pure: the caller supplies `now` and performs any waiting a `Hold` asks for.

use super::classify::{classify, ChurnRequest, Classified, PassReason, StatefulSetChange};
use crate::limiter::{
    Ask, Identity, Limiter, Millis, Outcome, RefusedWhy, RETRY_ARRIVAL_MARGIN_MS,
};
use crate::names::{
    add, escape, format_time, ADMITTED_BY_ANNOTATION, GATED_BY_ANNOTATION, GATED_LABEL, GATE_NAME,
    LABEL_RELEASED, PACED_BY_ANNOTATION, PARTITION_HELD_ANNOTATION,
    PARTITION_HELD_SINCE_ANNOTATION, PARTITION_TARGET_ANNOTATION, RELEASED_AT_ANNOTATION,
};
use crate::policy::{format_duration, Action, ChurnKind, Policy, RequestFacts, Rule};
use crate::queue::{estimate_joining, Snapshot};
use json_patch::{Patch, PatchOperation};
use kube::core::admission::AdmissionRequest;
use kube::core::DynamicObject;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Validate,
    Mutate,
}

impl Endpoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Validate => "validate",
            Endpoint::Mutate => "mutate",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Not churn, or not ours to pace.
    Pass(PassReason),
    /// Churn, but exempt by the policy (the reason names which exemption).
    Exempt(&'static str),
    /// Churn that no rule covers on this endpoint.
    NoRule,
    /// Fits now (or used its reserved slot).
    Admitted,
    /// Wait in the webhook until `until`, then allow; the slot is already taken.
    Hold { until: Millis },
    /// 429 with Retry-After.
    RetryAfter { seconds: u32, slot: Millis },
    /// 429 without a retry hint.
    Deny { wait_ms: Millis },
    /// Allowed over the limit, with a warning.
    Warn { wait_ms: Millis },
    /// Admitted behind churn-throttler's scheduling gate.
    Gate { patch: Patch },
    /// Admitted at once under a gate rule, and marked as released now (see `mark_admission`).
    AdmitMarked { patch: Patch },
    /// Admitted with the rollout's partition held; the releaser steps it down.
    HoldPartition {
        patch: Patch,
        target: u32,
        held: u32,
    },
}

impl Verdict {
    /// The bounded label used in metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Pass(_) => "pass",
            Verdict::Exempt(_) => "exempt",
            Verdict::NoRule => "no-rule",
            Verdict::Admitted | Verdict::AdmitMarked { .. } => "allow",
            Verdict::Hold { .. } => "hold",
            Verdict::RetryAfter { .. } => "retry-after",
            Verdict::Deny { .. } => "deny",
            Verdict::Warn { .. } => "warn",
            Verdict::Gate { .. } => "gate",
            Verdict::HoldPartition { .. } => "partition",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub verdict: Verdict,
    pub rule: Option<Arc<str>>,
    pub kind: Option<ChurnKind>,
    /// A sentence for the person reading kubectl output (denials and warnings).
    pub message: Option<String>,
}

impl Decision {
    fn bare(verdict: Verdict, kind: Option<ChurnKind>) -> Decision {
        Decision {
            verdict,
            rule: None,
            kind,
            message: None,
        }
    }
}

pub fn decide(
    req: &AdmissionRequest<DynamicObject>,
    endpoint: Endpoint,
    policy: &Policy,
    limiter: &mut Limiter,
    now: Millis,
) -> Decision {
    decide_queued(req, endpoint, policy, limiter, None, now)
}

/// [`decide`], knowing the gate queue (`queue`: what the leading releaser in this process
/// saw in its last round), so a gated pod is told when it goes behind the pods already
/// waiting, not only when the windows next have room.
pub fn decide_queued(
    req: &AdmissionRequest<DynamicObject>,
    endpoint: Endpoint,
    policy: &Policy,
    limiter: &mut Limiter,
    queue: Option<&Snapshot>,
    now: Millis,
) -> Decision {
    let churn = match classify(req) {
        Classified::Pass(reason) => return Decision::bare(Verdict::Pass(reason), None),
        Classified::Churn(churn) => churn,
    };
    decide_churn_queued(&churn, endpoint, policy, limiter, queue, now)
}

pub fn decide_churn(
    churn: &ChurnRequest,
    endpoint: Endpoint,
    policy: &Policy,
    limiter: &mut Limiter,
    now: Millis,
) -> Decision {
    decide_churn_queued(churn, endpoint, policy, limiter, None, now)
}

pub fn decide_churn_queued(
    churn: &ChurnRequest,
    endpoint: Endpoint,
    policy: &Policy,
    limiter: &mut Limiter,
    queue: Option<&Snapshot>,
    now: Millis,
) -> Decision {
    let kind = Some(churn.kind);
    let facts = RequestFacts {
        kind: churn.kind,
        namespace: &churn.namespace,
        user: &churn.user,
        groups: &churn.groups,
        controller_kind: churn.controller_kind.as_deref(),
        priority_class: churn.priority_class.as_deref(),
        labels: &churn.labels,
    };
    if let Some(reason) = policy.exempt.exempts(&facts) {
        return Decision::bare(Verdict::Exempt(reason), kind);
    }
    let Some(rule) = policy.rule_for(&facts, endpoint == Endpoint::Mutate) else {
        return Decision::bare(Verdict::NoRule, kind);
    };
    let decided = |verdict: Verdict, message: Option<String>| Decision {
        verdict,
        rule: Some(rule.name.clone()),
        kind,
        message,
    };

    if rule.action == Action::Partition {
        return match partition_verdict(churn, &rule.name, now) {
            Some(verdict) => {
                let message = match &verdict {
                    Verdict::HoldPartition { target, held, .. } => Some(format!(
                        "churn-throttler: rule {:?} holds this rollout's partition at {held} and lowers it \
                         to {target} at {}, one pod at a time",
                        rule.name,
                        rate(rule)
                    )),
                    _ => None,
                };
                decided(verdict, message)
            }
            None => decided(Verdict::Pass(PassReason::NoPodReleased), None),
        };
    }
    if churn.kind == ChurnKind::StatefulSetUpdate && churn.cost == 0 {
        return decided(Verdict::Pass(PassReason::NoPodReleased), None);
    }

    let owner = churn.controller_uid.as_deref();
    // Slots this close are held: a hold rule's maxHold, and for any rule a retry that came
    // back within the arrival margin before its slot.
    let hold_within = rule
        .max_hold
        .map_or(0, |h| h.as_millis() as Millis)
        .max(RETRY_ARRIVAL_MARGIN_MS);
    let ask = |reserve: bool| Ask {
        rule: &rule.name,
        limits: &rule.limits,
        namespace: &churn.namespace,
        owner,
        identity: &churn.identity,
        cost: churn.cost,
        reserve,
        dry_run: churn.dry_run,
        max_reserved_per_namespace: rule.max_reserved_per_namespace,
        align_beyond: match rule.action {
            Action::Hold | Action::RetryAfter => Some(hold_within),
            _ => None,
        },
    };

    match rule.action {
        Action::Gate => {
            if churn.scheduling_gates.iter().any(|g| g == GATE_NAME) {
                return decided(Verdict::Admitted, None);
            }
            if churn.node_name_set {
                // Validation rejects gates on a bound pod: count it, let it through.
                if !churn.dry_run {
                    limiter.record(
                        &rule.name,
                        &rule.limits,
                        &churn.namespace,
                        owner,
                        now,
                        churn.cost,
                    );
                }
                return decided(Verdict::Admitted, None);
            }
            let gated = |when: String| {
                decided(
                    Verdict::Gate {
                        patch: gate_patch(churn, &rule.name),
                    },
                    Some(format!(
                        "churn-throttler: rule {:?} paces pod creation to {}; this pod waits behind \
                         the scheduling gate {GATE_NAME} ({when})",
                        rule.name,
                        rate(rule),
                    )),
                )
            };
            if rule.gate_only {
                // The global budget: only the releasing replica admits pods at once.
                return gated("the replica that releases decides when".to_string());
            }
            match limiter.acquire(&ask(false), now) {
                Outcome::Admitted | Outcome::Claimed { .. } => decided(Verdict::Admitted, None),
                Outcome::Reserved { slot }
                | Outcome::Held { slot }
                | Outcome::Refused { retry_at: slot, .. } => {
                    gated(gate_wait(churn, policy, rule, limiter, queue, slot, now))
                }
            }
        }
        // No reservation further ahead than a client told to come back after
        // maxRetryAfter keeps; beyond it: Retry-After maxRetryAfter and nothing reserved.
        Action::Hold | Action::RetryAfter => match limiter.acquire_within(
            &ask(true),
            now,
            (rule.max_retry_after.as_millis() as Millis + RETRY_ARRIVAL_MARGIN_MS).max(hold_within),
        ) {
            Outcome::Admitted | Outcome::Claimed { .. } => decided(Verdict::Admitted, None),
            Outcome::Held { slot } => decided(Verdict::Hold { until: slot }, None),
            Outcome::Reserved { slot } => {
                let wait = slot - now;
                if wait <= hold_within {
                    limiter.consume(&rule.name, &churn.identity, slot);
                    return decided(Verdict::Hold { until: slot }, None);
                }
                let seconds = retry_seconds(rule, &churn.identity, wait);
                decided(
                    Verdict::RetryAfter { seconds, slot },
                    Some(throttled_message(rule, churn, wait, Some(seconds))),
                )
            }
            Outcome::Refused { retry_at, why } => {
                let wait = retry_at.saturating_sub(now).max(1);
                let seconds = retry_seconds(rule, &churn.identity, wait);
                let message = if why == RefusedWhy::BeyondReach {
                    format!(
                        "churn-throttler: rule {:?} allows {}; every slot up to {}s ahead is taken, so this {} \
                         is not queued: retry after {seconds}s",
                        rule.name,
                        rate(rule),
                        rule.max_retry_after.as_secs(),
                        describe(churn),
                    )
                } else {
                    throttled_message(rule, churn, wait, Some(seconds))
                };
                decided(
                    Verdict::RetryAfter {
                        seconds,
                        slot: retry_at,
                    },
                    Some(message),
                )
            }
        },
        Action::Deny => match limiter.acquire(&ask(false), now) {
            Outcome::Admitted | Outcome::Claimed { .. } => decided(Verdict::Admitted, None),
            Outcome::Reserved { slot }
            | Outcome::Held { slot }
            | Outcome::Refused { retry_at: slot, .. } => {
                let wait = slot.saturating_sub(now);
                decided(
                    Verdict::Deny { wait_ms: wait },
                    Some(throttled_message(rule, churn, wait, None)),
                )
            }
        },
        Action::Warn => match limiter.acquire(&ask(false), now) {
            Outcome::Admitted | Outcome::Claimed { .. } => decided(Verdict::Admitted, None),
            Outcome::Reserved { slot }
            | Outcome::Held { slot }
            | Outcome::Refused { retry_at: slot, .. } => {
                if !churn.dry_run {
                    limiter.record(
                        &rule.name,
                        &rule.limits,
                        &churn.namespace,
                        owner,
                        now,
                        churn.cost,
                    );
                }
                let wait = slot.saturating_sub(now);
                decided(
                    Verdict::Warn { wait_ms: wait },
                    Some(format!(
                        "churn-throttler (warn only): rule {:?} allows {}; enforcing it would delay this {} by {}s",
                        rule.name,
                        rate(rule),
                        describe(churn),
                        round_up_secs(wait)
                    )),
                )
            }
        },
        // Handled above; kept for exhaustiveness.
        Action::Partition => decided(Verdict::Pass(PassReason::NoPodReleased), None),
    }
}

/// When a pod gated now is expected to go, in words. With the queue known (the leading
/// releaser runs in this process), the pods already waiting are counted, in the order the
/// releaser lifts them (crate::queue); without it only the windows are: the pods gated
/// before this one are not charged until released, so the limiter's `slot` does not see
/// them and the real wait can be longer.
fn gate_wait(
    churn: &ChurnRequest,
    policy: &Policy,
    rule: &Rule,
    limiter: &Limiter,
    queue: Option<&Snapshot>,
    slot: Millis,
    now: Millis,
) -> String {
    let about =
        |wait: Millis| format_duration(Duration::from_millis(round_up_secs(wait) as u64 * 1000));
    let Some(queue) = queue else {
        return format!(
            "about {} now by the rule's windows; pods already waiting are not known to this \
             replica and can make it longer",
            about(slot.saturating_sub(now))
        );
    };
    let owner = churn.controller_uid.as_deref();
    match estimate_joining(queue, policy, rule, &churn.namespace, owner, limiter, now) {
        Some(joining) => format!(
            "about {} now, behind {} pod(s) of this rule already waiting",
            about(joining.at.saturating_sub(now)),
            joining.ahead
        ),
        None => "the rule's windows give no time yet".to_string(),
    }
}

fn rate(rule: &Rule) -> String {
    rule.limits
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join(" and ")
}

fn round_up_secs(ms: Millis) -> u32 {
    (ms.div_ceil(1000)).clamp(1, u32::MAX as u64) as u32
}

/// Whole seconds (at least 1) for Retry-After, told so that the retry comes back up to
/// the arrival margin before its slot (and is held until it). Exact identities are capped
/// by `maxRetryAfter` (their early retry keeps its slot); pool members are not, since a
/// pool retry that comes before the hold reach cannot be told apart from a new pod.
fn retry_seconds(rule: &Rule, identity: &Identity, wait: Millis) -> u32 {
    let wait = match identity {
        Identity::Exact(_) => wait.min(rule.max_retry_after.as_millis() as Millis),
        Identity::Pool(_) => wait,
    };
    round_up_secs(wait.saturating_sub(RETRY_ARRIVAL_MARGIN_MS))
}

fn describe(churn: &ChurnRequest) -> String {
    let what = match churn.kind {
        ChurnKind::PodCreate => "pod creation",
        ChurnKind::PodDelete => "pod deletion",
        ChurnKind::Eviction => "eviction",
        ChurnKind::StatefulSetUpdate => "StatefulSet update",
    };
    if churn.name.is_empty() {
        what.to_string()
    } else {
        format!("{what} of {}/{}", churn.namespace, churn.name)
    }
}

fn throttled_message(
    rule: &Rule,
    churn: &ChurnRequest,
    wait: Millis,
    retry: Option<u32>,
) -> String {
    let head = format!(
        "churn-throttler: rule {:?} allows {}; this {} has to wait {:.1}s",
        rule.name,
        rate(rule),
        describe(churn),
        wait as f64 / 1000.0
    );
    match retry {
        Some(seconds) => format!("{head}, retry after {seconds}s (the request keeps its place)"),
        None => format!("{head} (denied without retry: the action of this rule is deny)"),
    }
}

fn gate_patch(churn: &ChurnRequest, rule: &str) -> Patch {
    let mut ops = Vec::new();
    let gate = json!({ "name": GATE_NAME });
    if churn.scheduling_gates.is_empty() {
        ops.push(add("/spec/schedulingGates", json!([gate])));
    } else {
        ops.push(add("/spec/schedulingGates/-", gate));
    }
    ops.extend(map_entry_ops(
        "annotations",
        churn.has_annotations,
        GATED_BY_ANNOTATION,
        rule,
    ));
    ops.extend(map_entry_ops(
        "labels",
        churn.has_labels,
        GATED_LABEL,
        "true",
    ));
    Patch(ops)
}

/// A pod the webhook admits at once under a gate rule is marked the way the releaser marks
/// a pod it released (label `released`, the rule, the time), so a releaser that leads
/// later, after a restart of every replica too, seeds its windows with it: the webhook's
/// own admissions are then no longer lost with the process that counted them. Any other
/// decision is returned as it is.
pub fn mark_admission(
    req: &AdmissionRequest<DynamicObject>,
    decision: Decision,
    policy: &Policy,
    now: Millis,
    instance: &str,
) -> Decision {
    let gate_rule = decision
        .rule
        .as_deref()
        .and_then(|name| policy.rules.iter().find(|r| r.name.as_ref() == name))
        .is_some_and(|r| r.action == Action::Gate);
    if decision.verdict != Verdict::Admitted
        || decision.kind != Some(ChurnKind::PodCreate)
        || !gate_rule
    {
        return decision;
    }
    let Classified::Churn(churn) = classify(req) else {
        return decision;
    };
    if churn.dry_run {
        return decision;
    }
    let rule = decision.rule.as_deref().unwrap_or_default();
    let mut ops = map_entries_ops(
        "annotations",
        churn.has_annotations,
        &[
            (GATED_BY_ANNOTATION, rule),
            (RELEASED_AT_ANNOTATION, &format_time(now)),
            (ADMITTED_BY_ANNOTATION, instance),
        ],
    );
    ops.extend(map_entries_ops(
        "labels",
        churn.has_labels,
        &[(GATED_LABEL, LABEL_RELEASED)],
    ));
    Decision {
        verdict: Verdict::AdmitMarked { patch: Patch(ops) },
        ..decision
    }
}

/// Adds entries to metadata.labels or metadata.annotations, creating the map if absent.
fn map_entries_ops(map: &str, map_exists: bool, entries: &[(&str, &str)]) -> Vec<PatchOperation> {
    if map_exists {
        entries
            .iter()
            .flat_map(|(key, value)| map_entry_ops(map, true, key, value))
            .collect()
    } else {
        let object: serde_json::Map<String, Value> = entries
            .iter()
            .map(|(key, value)| (key.to_string(), json!(value)))
            .collect();
        vec![add(&format!("/metadata/{map}"), Value::Object(object))]
    }
}

/// Adds `key: value` to metadata.labels or metadata.annotations, creating the map if absent.
fn map_entry_ops(map: &str, map_exists: bool, key: &str, value: &str) -> Vec<PatchOperation> {
    if map_exists {
        vec![add(
            &format!("/metadata/{map}/{}", escape(key)),
            json!(value),
        )]
    } else {
        vec![add(&format!("/metadata/{map}"), json!({ key: value }))]
    }
}

/// The partition action on a StatefulSet UPDATE: None when pacing does not apply.
fn partition_verdict(churn: &ChurnRequest, rule: &str, now: Millis) -> Option<Verdict> {
    let change = churn.statefulset.as_ref()?;
    if !change.rolling_update {
        return None;
    }
    let plan = plan_partition(change)?;
    let unchanged = change.written_partition == Some(plan.held)
        && change.new_held_annotation == Some(plan.held)
        && change.new_target_annotation == Some(plan.target.to_string())
        && change.new_paced_by.as_deref() == Some(rule)
        && change.has_held_since;
    if unchanged {
        return None;
    }
    Some(Verdict::HoldPartition {
        patch: partition_patch(change, plan.held, plan.target, rule, now),
        target: plan.target,
        held: plan.held,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionPlan {
    pub held: u32,
    pub target: u32,
}

/// What the mutation of a StatefulSet UPDATE should hold, given the change.
/// A paced rollout is in progress when the old object carries the target annotation.
pub fn plan_partition(c: &StatefulSetChange) -> Option<PartitionPlan> {
    let written = c.written_partition.unwrap_or(0);
    let in_progress = c.old_target.is_some();
    if in_progress && !c.template_changed && c.new_held_annotation == Some(written) {
        // The releaser's own step: it writes the partition and the held annotation together.
        return None;
    }
    // What the writer asked for: while paced, an unchanged partition field means the
    // writer did not touch it, so the recorded target still stands.
    let intent = match (in_progress, c.old_target) {
        (true, Some(target)) if written == c.old_partition => target,
        _ => written,
    };
    if c.template_changed {
        if intent >= c.replicas {
            return None;
        }
        return Some(PartitionPlan {
            held: c.replicas,
            target: intent,
        });
    }
    if !in_progress {
        return None;
    }
    if intent >= c.old_partition {
        // The writer raised the partition itself: nothing left to pace below it.
        return None;
    }
    Some(PartitionPlan {
        held: c.old_partition,
        target: intent,
    })
}

/// Holds the partition and records, for the releaser and for people reading the object,
/// the asked-for target, the held value, the rule that paces it and since when (a hold
/// already in progress keeps its start).
fn partition_patch(
    c: &StatefulSetChange,
    held: u32,
    target: u32,
    rule: &str,
    now: Millis,
) -> Patch {
    let mut ops = Vec::new();
    if c.has_rolling_update_block {
        ops.push(add(
            "/spec/updateStrategy/rollingUpdate/partition",
            json!(held),
        ));
    } else {
        ops.push(add(
            "/spec/updateStrategy",
            json!({ "type": "RollingUpdate", "rollingUpdate": { "partition": held } }),
        ));
    }
    ops.extend(map_entry_ops(
        "annotations",
        c.has_annotations,
        PARTITION_TARGET_ANNOTATION,
        &target.to_string(),
    ));
    // The first annotation op may have created the map; the second adds into it.
    ops.extend(map_entry_ops(
        "annotations",
        true,
        PARTITION_HELD_ANNOTATION,
        &held.to_string(),
    ));
    ops.extend(map_entry_ops(
        "annotations",
        true,
        PACED_BY_ANNOTATION,
        rule,
    ));
    if !c.has_held_since {
        ops.extend(map_entry_ops(
            "annotations",
            true,
            PARTITION_HELD_SINCE_ANNOTATION,
            &format_time(now),
        ));
    }
    Patch(ops)
}
