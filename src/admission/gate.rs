//! The gate action: a pod CREATE that does not fit now is admitted behind churn-throttler's
//! scheduling gate, for the releaser to lift at the rate; one admitted at once is marked as
//! released now. Pure, like the rest of the decision.

use super::verdict::{rate, round_up_secs, Cx, Decision, Verdict};
use super::ChurnRequest;
use crate::limiter::{Limiter, Millis, Outcome};
use crate::names::{
    add, format_time, map_entries_ops, map_entry_ops, ADMITTED_BY_ANNOTATION, GATED_BY_ANNOTATION,
    GATED_LABEL, GATE_NAME, LABEL_RELEASED, RELEASED_AT_ANNOTATION,
};
use crate::policy::{format_duration, Action, ChurnKind, Policy, Rule};
use crate::queue::{estimate_joining, Snapshot};
use json_patch::Patch;
use serde_json::json;
use std::time::Duration;

pub(super) fn decide(
    cx: &Cx<'_>,
    policy: &Policy,
    limiter: &mut Limiter,
    queue: Option<&Snapshot>,
) -> Decision {
    let (churn, rule, now) = (cx.churn, cx.rule, cx.now);
    let decided = |verdict, message| cx.decided(verdict, message);
    let ask = |reserve| cx.ask(reserve);
    if churn.scheduling_gates.iter().any(|g| g == GATE_NAME) {
        return decided(Verdict::Admitted, None);
    }
    if churn.node_name_set {
        // Validation rejects gates on a bound pod: count it, let it through.
        cx.record(limiter);
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
    if let Some(until) = rule.paused_at(now) {
        // A schedule window of events: 0: every pod waits; the releaser lifts none.
        return gated(format!(
            "the rule is paused by {} until {}",
            rule.paused_by,
            crate::names::format_pause_end(until)
        ));
    }
    if rule.gate_only {
        // The global budget: only the releasing replica admits pods at once.
        return gated("the replica that releases decides when".to_string());
    }
    if rule.adaptive {
        // The network window is the leading releaser's: without its word (no releaser
        // here, a new leader) or with the window full, the pod waits for it.
        match queue.and_then(Snapshot::network) {
            Some(room) if !room.full() => {}
            Some(room) => {
                return gated(format!(
                "the network window is full: {} released pods wait for their network, window {}",
                room.in_flight, room.window
            ))
            }
            None => return gated("the releaser sizes the network window".to_string()),
        }
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
    churn: &ChurnRequest,
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
