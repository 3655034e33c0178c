//! The webhook in the model: the real `decide_churn` over the real `Limiter`, called as
//! the API server calls it (mutating, then validating) at the simulated `now`.

use super::*;

impl<'a> Sim<'a> {
    /// Both webhooks, mutating then validating, as the API server calls them.
    /// `validating_name`: a ReplicaSet pod's generated name, which only the validating
    /// webhook sees.
    pub(super) fn admit(
        &mut self,
        churn: &mut ChurnRequest,
        slot_hint: Option<Millis>,
        validating_name: Option<String>,
    ) -> Admission {
        if !self.opted_in(&churn.namespace) {
            return Admission::Allowed {
                at: self.now,
                gated: None,
                partition: None,
                adaptive_at_once: false,
            };
        }
        let now = self.now;
        // The webhook gates the pods of adaptive rules (instead of admitting them at once)
        // while the network window is full: the policy with those rules gate-only.
        let full = self.net.gate_only.is_some() && self.network_full();
        let policy = match (&self.net.gate_only, full) {
            (Some(gate_only), true) => gate_only,
            _ => &self.policy,
        };
        let mutate = decide_churn(churn, Endpoint::Mutate, policy, &mut self.limiter, now);
        let adaptive_at_once = matches!(mutate.verdict, Verdict::Admitted)
            && mutate.rule.as_ref().is_some_and(|name| {
                self.policy
                    .rules
                    .iter()
                    .any(|r| r.name == *name && r.action == Action::Gate && r.adaptive)
            });
        let mut gated = None;
        let mut partition = None;
        match mutate.verdict {
            Verdict::Gate { .. } => {
                churn.scheduling_gates.push(GATE_NAME.to_string());
                gated = mutate.rule.clone();
            }
            Verdict::HoldPartition { held, target, .. } => {
                partition = Some((held, target));
                if let Some(sts) = churn.statefulset.as_mut() {
                    sts.written_partition = Some(held);
                    sts.new_partition = held;
                    sts.new_held_annotation = Some(held);
                    sts.new_target_annotation = Some(target.to_string());
                    sts.has_rolling_update_block = true;
                    churn.cost = sts.replicas.saturating_sub(held);
                }
            }
            Verdict::Admitted => self.charged(&mutate.rule, slot_hint.unwrap_or(now).min(now)),
            _ => {}
        }
        if let Some(refusal) = self.refusal(&mutate.verdict) {
            return refusal;
        }
        if let Some(name) = validating_name {
            churn.identity = Identity::Exact(format!("pod-create:{}/{name}", churn.namespace));
            churn.name = name;
        }
        let validate = decide_churn(
            churn,
            Endpoint::Validate,
            &self.policy,
            &mut self.limiter,
            now,
        );
        let at = match validate.verdict {
            Verdict::Admitted => {
                self.charged(&validate.rule, slot_hint.unwrap_or(now).min(now));
                now
            }
            Verdict::Hold { until } => {
                self.out.holds += 1;
                self.charged(&validate.rule, until);
                until
            }
            ref v => {
                if let Some(refusal) = self.refusal(v) {
                    return refusal;
                }
                now
            }
        };
        Admission::Allowed {
            at,
            gated,
            partition,
            adaptive_at_once,
        }
    }

    pub(super) fn refusal(&mut self, verdict: &Verdict) -> Option<Admission> {
        match *verdict {
            Verdict::RetryAfter { seconds, slot } => {
                self.out.refused += 1;
                Some(Admission::RetryAfter {
                    seconds,
                    slot: Some(slot),
                })
            }
            Verdict::Deny { .. } => {
                self.out.refused += 1;
                Some(Admission::Denied)
            }
            _ => None,
        }
    }

    pub(super) fn charged(&mut self, rule: &Option<Arc<str>>, at: Millis) {
        if let Some(rule) = rule {
            self.out
                .charges
                .entry(rule.to_string())
                .or_default()
                .push(at);
        }
    }
}

pub(super) enum Admission {
    Allowed {
        at: Millis,
        gated: Option<Arc<str>>,
        partition: Option<(u32, u32)>,
        /// A pod admitted at once under an adaptive gate rule: released now, it waits
        /// for its network in the window.
        adaptive_at_once: bool,
    },
    RetryAfter {
        seconds: u32,
        slot: Option<Millis>,
    },
    Denied,
}
