//! What a decision says (`Verdict`, `Decision`) and what every action's decision reads
//! (`Cx`: the request, its rule and now), shared by decide.rs, gate.rs and partition.rs.

use super::classify::{ChurnRequest, PassReason};
use crate::limiter::{Ask, Limiter, Millis, RETRY_ARRIVAL_MARGIN_MS};
use crate::policy::{Action, ChurnKind, Rule};
use json_patch::Patch;
use std::sync::Arc;

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
    pub(super) fn bare(verdict: Verdict, kind: Option<ChurnKind>) -> Decision {
        Decision {
            verdict,
            rule: None,
            kind,
            message: None,
        }
    }
}

/// What one decision needs to know of its request and rule.
pub(super) struct Cx<'a> {
    pub(super) churn: &'a ChurnRequest,
    pub(super) rule: &'a Rule,
    pub(super) now: Millis,
}

impl Cx<'_> {
    pub(super) fn decided(&self, verdict: Verdict, message: Option<String>) -> Decision {
        Decision {
            verdict,
            rule: Some(self.rule.name.clone()),
            kind: Some(self.churn.kind),
            message,
        }
    }

    pub(super) fn owner(&self) -> Option<&str> {
        self.churn.controller_uid.as_deref()
    }

    /// Charges the request now, over the limit if need be (a dry run is never charged).
    pub(super) fn record(&self, limiter: &mut Limiter) {
        if !self.churn.dry_run {
            limiter.record(
                &self.rule.name,
                &self.rule.limits,
                &self.churn.namespace,
                self.owner(),
                self.now,
                self.churn.cost,
            );
        }
    }

    /// Slots this close are held: a hold rule's maxHold, and for any rule a retry that
    /// came back within the arrival margin before its slot.
    pub(super) fn hold_within(&self) -> Millis {
        self.rule
            .max_hold
            .map_or(0, |h| h.as_millis() as Millis)
            .max(RETRY_ARRIVAL_MARGIN_MS)
    }

    pub(super) fn ask(&self, reserve: bool) -> Ask<'_> {
        Ask {
            rule: &self.rule.name,
            limits: &self.rule.limits,
            namespace: &self.churn.namespace,
            owner: self.owner(),
            identity: &self.churn.identity,
            cost: self.churn.cost,
            reserve,
            dry_run: self.churn.dry_run,
            max_reserved_per_namespace: self.rule.max_reserved_per_namespace,
            align_beyond: match self.rule.action {
                Action::Hold | Action::RetryAfter => Some(self.hold_within()),
                _ => None,
            },
        }
    }
}

pub(super) fn rate(rule: &Rule) -> String {
    rule.limits
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join(" and ")
}

pub(super) fn round_up_secs(ms: Millis) -> u32 {
    (ms.div_ceil(1000)).clamp(1, u32::MAX as u64) as u32
}

pub(super) fn describe(churn: &ChurnRequest) -> String {
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
