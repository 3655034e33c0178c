//! The partition action: a StatefulSet template change is admitted with its rollout's
//! partition held at `replicas`, and the asked-for target recorded, for the releaser to
//! step down at the rate. Pure, like the rest of the decision.

use super::classify::{ChurnRequest, PassReason, StatefulSetChange};
use super::verdict::{rate, Cx, Decision, Verdict};
use crate::limiter::Millis;
use crate::names::{
    add, format_time, map_entry_ops, PACED_BY_ANNOTATION, PARTITION_HELD_ANNOTATION,
    PARTITION_HELD_SINCE_ANNOTATION, PARTITION_TARGET_ANNOTATION,
};
use json_patch::Patch;
use serde_json::json;

pub(super) fn decide(cx: &Cx<'_>) -> Decision {
    let (churn, rule, now) = (cx.churn, cx.rule, cx.now);
    let decided = |verdict, message| cx.decided(verdict, message);
    match partition_verdict(churn, &rule.name, now) {
        Some(verdict) => {
            let message = match &verdict {
                Verdict::HoldPartition { target, held, .. } => Some(format!(
                    "churn-throttler: rule {:?} holds this rollout's partition at {held} and lowers it \
                     to {target} at {}, {}",
                    rule.name,
                    rate(rule),
                    at_a_time(churn)
                )),
                _ => None,
            };
            decided(verdict, message)
        }
        None => decided(Verdict::Pass(PassReason::NoPodReleased), None),
    }
}

/// How many pods the rollout takes down at once, in words: one per step, or up to
/// maxUnavailable where the set asks for more (with the MaxUnavailableStatefulSet
/// feature the API server keeps the field, and the releaser keeps that many in flight).
fn at_a_time(churn: &ChurnRequest) -> String {
    match churn.statefulset.as_ref().map_or(1, |c| c.max_unavailable) {
        1 => "one pod at a time".to_string(),
        k => format!("up to {k} pods at a time (maxUnavailable)"),
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
