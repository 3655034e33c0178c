//! The decision on one admission request: policy + limiter state + now -> verdict.
//! Pure: the caller supplies `now` and performs any waiting a `Hold` asks for.

use super::classify::{classify, ChurnRequest, Classified, PassReason};
use super::verdict::{describe, round_up_secs, Cx, Decision, Endpoint, Note, Verdict};
use crate::limiter::{Identity, Limiter, Millis, Outcome, RefusedWhy, RETRY_ARRIVAL_MARGIN_MS};
use crate::policy::{Action, ChurnKind, Policy, RequestFacts, Rule};
use crate::queue::Snapshot;
use kube::core::admission::AdmissionRequest;
use kube::core::DynamicObject;

pub fn decide(
    req: &AdmissionRequest<DynamicObject>,
    endpoint: Endpoint,
    policy: &Policy,
    limiter: &mut Limiter,
    now: Millis,
) -> Decision {
    decide_classified(&classify(req), endpoint, policy, limiter, None, now)
}

/// [`decide`] for a request the caller has classified already (the server does once, and
/// uses the result for its pod check and a hold's slot too), knowing the gate queue
/// (`queue`: what the leading releaser in this process saw in its last round), so a gated
/// pod is told when it goes behind the pods already waiting, not only when the windows
/// next have room.
pub fn decide_classified(
    classified: &Classified,
    endpoint: Endpoint,
    policy: &Policy,
    limiter: &mut Limiter,
    queue: Option<&Snapshot>,
    now: Millis,
) -> Decision {
    let mut decision =
        decide_classified_unwritten(classified, endpoint, policy, limiter, queue, now);
    if let Classified::Churn(churn) = classified {
        decision.write_message(policy, churn);
    }
    decision
}

/// [`decide_classified`] with the sentence left as a [`Note`] (see [`decide_unwritten`]).
pub fn decide_classified_unwritten(
    classified: &Classified,
    endpoint: Endpoint,
    policy: &Policy,
    limiter: &mut Limiter,
    queue: Option<&Snapshot>,
    now: Millis,
) -> Decision {
    match classified {
        Classified::Pass(reason) => Decision::bare(Verdict::Pass(*reason), None),
        Classified::Churn(churn) => decide_unwritten(churn, endpoint, policy, limiter, queue, now),
    }
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
    let mut decision = decide_unwritten(churn, endpoint, policy, limiter, queue, now);
    decision.write_message(policy, churn);
    decision
}

/// [`decide_churn_queued`] with the decision's sentence left as a [`Note`]: the server
/// decides under the limiter's lock and writes it ([`Decision::write_message`]) after.
pub fn decide_unwritten(
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
    let cx = Cx { churn, rule, now };
    if rule.action != Action::Partition
        && churn.kind == ChurnKind::StatefulSetUpdate
        && churn.cost == 0
    {
        return cx.decided(Verdict::Pass(PassReason::NoPodReleased), None);
    }
    if let Some(until) = rule.paused_at(now) {
        if let Some(decision) = paused(&cx, until, limiter) {
            return decision;
        }
    }
    match rule.action {
        Action::Partition => super::partition::decide(&cx),
        Action::Gate => super::gate::decide(&cx, policy, limiter, queue),
        Action::Hold | Action::RetryAfter => hold_or_retry(&cx, limiter),
        Action::Deny => deny(&cx, limiter),
        Action::Warn => warn(&cx, limiter),
    }
}

/// A rule paused until `until` (a schedule window of `events: 0`): hold and retry-after
/// answer 429 at once with Retry-After = min(time left, maxRetryAfter) and reserve
/// nothing; deny names the pause's end; warn lets the request through with a warning
/// (and charges it, as it charges any request over the limit). Gate and partition
/// decide as usual (None): the pod is gated, the partition held, and the releasers take
/// nothing while the pause lasts.
fn paused(cx: &Cx<'_>, until: Millis, limiter: &mut Limiter) -> Option<Decision> {
    let (churn, rule, now) = (cx.churn, cx.rule, cx.now);
    let left = until.saturating_sub(now);
    let end = crate::names::format_pause_end(until);
    let head = format!(
        "churn-throttler: rule {:?} is paused by {} until {end}; this {}",
        rule.name,
        rule.paused_by,
        describe(churn)
    );
    Some(match rule.action {
        Action::Gate | Action::Partition => return None,
        Action::Hold | Action::RetryAfter => {
            let wait = left.min(rule.max_retry_after.as_millis() as Millis);
            let seconds = round_up_secs(wait);
            cx.decided(
                Verdict::RetryAfter {
                    seconds,
                    slot: now.saturating_add(wait),
                },
                Some(format!("{head} is not admitted: retry after {seconds}s")),
            )
        }
        Action::Deny => cx.decided(
            Verdict::Deny { wait_ms: left },
            Some(format!(
                "{head} is denied (the action of this rule is deny): try again after {end}"
            )),
        ),
        Action::Warn => {
            cx.record(limiter);
            cx.decided(
                Verdict::Warn { wait_ms: left },
                Some(format!("{head} would wait (warn only: it goes through)")),
            )
        }
    })
}

/// hold and retry-after: hold a slot this close, else 429 with Retry-After. No reservation
/// further ahead than a client told to come back after maxRetryAfter keeps; beyond it:
/// Retry-After maxRetryAfter and nothing reserved.
fn hold_or_retry(cx: &Cx<'_>, limiter: &mut Limiter) -> Decision {
    let (churn, rule, now) = (cx.churn, cx.rule, cx.now);
    let decided = |verdict, message| cx.decided(verdict, message);
    let hold_within = cx.hold_within();
    let ask = |reserve| cx.ask(reserve);
    match limiter.acquire_within(
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
            cx.noted(
                Verdict::RetryAfter { seconds, slot },
                Note::Throttled {
                    wait,
                    retry: Some(seconds),
                },
            )
        }
        Outcome::Refused { retry_at, why } => {
            let wait = retry_at.saturating_sub(now).max(1);
            let seconds = retry_seconds(rule, &churn.identity, wait);
            let note = if why == RefusedWhy::BeyondReach {
                Note::BeyondReach { retry: seconds }
            } else {
                Note::Throttled {
                    wait,
                    retry: Some(seconds),
                }
            };
            cx.noted(
                Verdict::RetryAfter {
                    seconds,
                    slot: retry_at,
                },
                note,
            )
        }
    }
}

fn deny(cx: &Cx<'_>, limiter: &mut Limiter) -> Decision {
    let now = cx.now;
    match limiter.acquire(&cx.ask(false), now) {
        Outcome::Admitted | Outcome::Claimed { .. } => cx.decided(Verdict::Admitted, None),
        Outcome::Reserved { slot }
        | Outcome::Held { slot }
        | Outcome::Refused { retry_at: slot, .. } => {
            let wait = slot.saturating_sub(now);
            cx.noted(
                Verdict::Deny { wait_ms: wait },
                Note::Throttled { wait, retry: None },
            )
        }
    }
}

fn warn(cx: &Cx<'_>, limiter: &mut Limiter) -> Decision {
    let now = cx.now;
    match limiter.acquire(&cx.ask(false), now) {
        Outcome::Admitted | Outcome::Claimed { .. } => cx.decided(Verdict::Admitted, None),
        Outcome::Reserved { slot }
        | Outcome::Held { slot }
        | Outcome::Refused { retry_at: slot, .. } => {
            cx.record(limiter);
            let wait = slot.saturating_sub(now);
            cx.noted(Verdict::Warn { wait_ms: wait }, Note::Warn { wait })
        }
    }
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
