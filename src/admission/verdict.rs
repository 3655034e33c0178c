//! What a decision says (`Verdict`, `Decision`) and what every action's decision reads
//! (`Cx`: the request, its rule and now), shared by decide.rs, gate.rs and partition.rs.

use super::classify::{ChurnRequest, PassReason};
use crate::limiter::{Ask, Limiter, Millis, RETRY_ARRIVAL_MARGIN_MS};
use crate::policy::{Action, ChurnKind, Policy, Rule};
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
    /// The sentence still to write, if any ([`Decision::write_message`] writes it).
    pub note: Option<Note>,
}

/// A decision's sentence before it is written: what it says, in numbers. The server
/// writes it once the limiter's lock is released, so a 429 answered under a flood does
/// not format text while every other review waits for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// Has to wait `wait` ms; told to retry after `retry` seconds, or denied (None).
    Throttled { wait: Millis, retry: Option<u32> },
    /// Every slot up to the rule's maxRetryAfter is taken: not queued.
    BeyondReach { retry: u32 },
    /// Allowed over the limit, which would have delayed it by `wait` ms.
    Warn { wait: Millis },
}

impl Note {
    pub(super) fn write(self, rule: &Rule, churn: &ChurnRequest) -> String {
        match self {
            Note::Throttled { wait, retry } => {
                let head = format!(
                    "churn-throttler: rule {:?} allows {}; this {} has to wait {:.1}s",
                    rule.name,
                    rate(rule),
                    describe(churn),
                    wait as f64 / 1000.0
                );
                match retry {
                    Some(seconds) => format!(
                        "{head}, retry after {seconds}s (the request keeps its place)"
                    ),
                    None => format!(
                        "{head} (denied without retry: the action of this rule is deny)"
                    ),
                }
            }
            Note::BeyondReach { retry } => format!(
                "churn-throttler: rule {:?} allows {}; every slot up to {}s ahead is taken, so this {} \
                 is not queued: retry after {retry}s",
                rule.name,
                rate(rule),
                rule.max_retry_after.as_secs(),
                describe(churn),
            ),
            Note::Warn { wait } => format!(
                "churn-throttler (warn only): rule {:?} allows {}; enforcing it would delay this {} by {}s",
                rule.name,
                rate(rule),
                describe(churn),
                round_up_secs(wait)
            ),
        }
    }
}

impl Decision {
    pub(super) fn bare(verdict: Verdict, kind: Option<ChurnKind>) -> Decision {
        Decision {
            verdict,
            rule: None,
            kind,
            message: None,
            note: None,
        }
    }

    /// Writes the sentence a decision left as a [`Note`] (`policy` is the one it was
    /// decided under, `churn` its request); nothing to do for any other decision.
    pub fn write_message(&mut self, policy: &Policy, churn: &ChurnRequest) {
        let Some(note) = self.note else {
            return;
        };
        let rule = self
            .rule
            .as_deref()
            .and_then(|name| policy.rules.iter().find(|r| r.name.as_ref() == name));
        if let Some(rule) = rule {
            self.message = Some(note.write(rule, churn));
            self.note = None;
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
            note: None,
        }
    }

    /// [`Cx::decided`] with its sentence left to write ([`Decision::write_message`]).
    pub(super) fn noted(&self, verdict: Verdict, note: Note) -> Decision {
        Decision {
            note: Some(note),
            ..self.decided(verdict, None)
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
