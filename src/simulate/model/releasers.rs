//! The releasers in the model: the gate and partition releasers, either the model's own
//! incremental ones or the releaser's real pure plans (`--releasers real`).

use super::*;
use crate::limiter::spaced_after;

impl<'a> Sim<'a> {
    pub(super) fn wake_gate(&mut self, g: usize, at: Millis) {
        let state = &mut self.gates[g];
        if state.next_wake.is_some_and(|w| w <= at && w >= self.now) {
            return;
        }
        state.next_wake = Some(at);
        self.at(at, Ev::GateWake(g as u16));
    }

    /// Releases gated pods at the rule's rate: round-robin across namespaces, oldest first,
    /// while the rule's released-but-not-Ready pods stay under maxNotReady.
    pub(super) fn run_gate(&mut self, g: usize) {
        if self.sc.real_releasers {
            self.run_gate_real(g);
            return;
        }
        let now = self.now;
        let rule = self.policy.rules[self.gates[g].rule].clone();
        // Paused by a schedule window: the window's end (Ev::ScheduleChange) wakes it.
        if rule.paused_at(now).is_some() {
            return;
        }
        let global = rule.limits.iter().all(|l| l.scope == Scope::Global);
        self.gates[g].blocked_on_ready = false;
        loop {
            let state = &mut self.gates[g];
            if state.queue.is_empty() {
                return;
            }
            if rule.max_not_ready.is_some_and(|max| state.not_ready >= max) {
                state.blocked_on_ready = true;
                return;
            }
            // The shared network window: the next pod whose network comes up wakes it.
            if rule.adaptive && self.network_room().is_some_and(|n| n.full()) {
                return;
            }
            let state = &mut self.gates[g];
            let mut earliest = Millis::MAX;
            let mut chosen = None;
            for _ in 0..state.queue.namespaces() {
                let Some((ns, p)) = self.gates[g].queue.peek() else {
                    break;
                };
                let owner = self.pod_owner_uid(p);
                let at = self.limiter.earliest(
                    &rule.name,
                    &rule.limits,
                    &self.namespaces[ns as usize],
                    Some(owner),
                    1,
                    now,
                );
                if at <= now {
                    chosen = Some((ns, p));
                    break;
                }
                earliest = earliest.min(at);
                if global {
                    break;
                }
                self.gates[g].queue.skip();
            }
            let Some((ns, p)) = chosen else {
                if earliest != Millis::MAX {
                    self.wake_gate(g, earliest);
                }
                return;
            };
            let owner = self.pod_owner_uid(p).to_string();
            self.limiter.record(
                &rule.name,
                &rule.limits,
                &self.namespaces[ns as usize],
                Some(&owner),
                now,
                1,
            );
            self.charged(&Some(rule.name.clone()), now);
            let state = &mut self.gates[g];
            state.queue.pop();
            state.not_ready += 1;
            self.released(p, g);
            let pod = &mut self.pods[p as usize];
            pod.gate_pending = Some(g);
            let generation = pod.generation;
            self.at(
                now + self.sc.api_latency,
                Ev::Ungated { pod: p, generation },
            );
        }
    }

    pub(super) fn pod_owner_uid(&self, p: u32) -> &str {
        let pod = &self.pods[p as usize];
        match pod.owner {
            Owner::Sts(s) => &self.sets[s as usize].uid,
            Owner::Dep(d) => {
                let dep = &self.deps[d as usize];
                if pod.updated {
                    &dep.new_rs
                } else {
                    &dep.old_rs
                }
            }
        }
    }

    pub(super) fn wake_partition(&mut self, at: Millis) {
        let now = self.now;
        let Some(state) = self.partition.as_mut() else {
            return;
        };
        if state.next_wake.is_some_and(|w| w <= at && w >= now) {
            return;
        }
        state.next_wake = Some(at);
        self.at(at, Ev::PartitionWake);
    }

    /// Model releaser: the old pod of a step is deleted; the step now counts at this
    /// time in the window instead of "now".
    pub(super) fn step_took_effect(&mut self, pod: u32) {
        let now = self.now;
        let Owner::Sts(s) = self.pods[pod as usize].owner else {
            return;
        };
        let ns = self.sets[s as usize].namespace;
        let Some(state) = self.partition.as_mut() else {
            return;
        };
        if let Some(n) = state.in_flight.get_mut(&ns) {
            *n = n.saturating_sub(1);
        }
        let rule = self.policy.rules[state.rule].clone();
        let uid = self.sets[s as usize].uid.clone();
        self.limiter.record(
            &rule.name,
            &rule.limits,
            &self.namespaces[ns as usize],
            Some(&uid),
            now,
            1,
        );
        self.wake_partition(now);
    }

    /// The previously released pod of a held StatefulSet is updated and Ready.
    pub(super) fn step_ready(&mut self, s: u32) {
        if self.sc.real_releasers {
            self.wake_partition(self.now);
            return;
        }
        let sts = &self.sets[s as usize];
        let namespace = sts.namespace;
        let more = sts.target.is_some_and(|t| sts.partition > t);
        let Some(state) = self.partition.as_mut() else {
            return;
        };
        state.not_ready = state.not_ready.saturating_sub(1);
        if more {
            state.queue.push(namespace, s);
        } else {
            // Target reached: churn-throttler lets go of the set.
            self.sets[s as usize].target = None;
        }
        self.wake_partition(self.now);
    }

    /// Steps held partitions down by one at the rule's rate, fair across namespaces, one
    /// step in flight per StatefulSet, under maxNotReady.
    pub(super) fn run_partition(&mut self) {
        if self.sc.real_releasers {
            self.run_partition_real();
            return;
        }
        let now = self.now;
        let Some(rule_index) = self.partition.as_ref().map(|p| p.rule) else {
            return;
        };
        let rule = self.policy.rules[rule_index].clone();
        if rule.paused_at(now).is_some() {
            return;
        }
        let global = rule.limits.iter().all(|l| l.scope == Scope::Global);
        if let Some(p) = self.partition.as_mut() {
            p.blocked_on_ready = false;
        }
        loop {
            let Some(state) = self.partition.as_mut() else {
                return;
            };
            if state.queue.is_empty() {
                return;
            }
            if rule.max_not_ready.is_some_and(|max| state.not_ready >= max) {
                state.blocked_on_ready = true;
                return;
            }
            // The shared network window must have room for the step's replacement; the
            // next pod whose network comes up wakes the releaser.
            if self.partition_room().is_some_and(|room| room == 0) {
                return;
            }
            let Some(state) = self.partition.as_mut() else {
                return;
            };
            let horizon = longest_window(&self.policy);
            state.taken.retain(|t| t.at + horizon > now);
            let mut earliest = Millis::MAX;
            let mut chosen = None;
            for _ in 0..state.queue.namespaces() {
                let Some(state) = self.partition.as_ref() else {
                    return;
                };
                let Some((ns, s)) = state.queue.peek() else {
                    break;
                };
                let flying = if global {
                    state.in_flight.values().sum::<u32>()
                } else {
                    state.in_flight.get(&ns).copied().unwrap_or(0)
                };
                // As the real plan (pacing/partition_windows.rs): a spaced limit keeps
                // at most `burst` steps whose old pod is not deleted yet, and steps are
                // spaced by their decision times.
                let over_burst = |l: &crate::policy::Limit| l.burst < l.events && flying >= l.burst;
                if rule
                    .limits
                    .iter()
                    .any(|l| flying >= l.events || over_burst(l))
                {
                    // Full of steps in flight: the next re-creation wakes the releaser.
                    if global {
                        break;
                    }
                    if let Some(state) = self.partition.as_mut() {
                        state.queue.skip();
                    }
                    continue;
                }
                let namespace = &self.namespaces[ns as usize];
                let spaced = rule
                    .limits
                    .iter()
                    .map(|l| {
                        let window = l.kept_window_ms();
                        let times: Vec<Millis> = state
                            .taken
                            .iter()
                            .filter(|t| l.scope == Scope::Global || &t.namespace == namespace)
                            .map(|t| t.at)
                            .filter(|&t| t + window > now)
                            .collect();
                        spaced_after(l, &times, now)
                    })
                    .max()
                    .unwrap_or(now);
                let at = self
                    .limiter
                    .earliest(
                        &rule.name,
                        &rule.limits,
                        namespace,
                        Some(&self.sets[s as usize].uid),
                        flying + 1,
                        now,
                    )
                    .max(spaced);
                if at <= now {
                    chosen = Some((ns, s));
                    break;
                }
                earliest = earliest.min(at);
                if global {
                    break;
                }
                if let Some(state) = self.partition.as_mut() {
                    state.queue.skip();
                }
            }
            let Some((ns, s)) = chosen else {
                if earliest != Millis::MAX {
                    self.wake_partition(earliest);
                }
                return;
            };
            let namespace = self.namespaces[ns as usize].clone();
            if let Some(state) = self.partition.as_mut() {
                state.queue.pop();
                state.taken.push(TakenStep {
                    rule: rule.name.clone(),
                    namespace,
                    at: now,
                });
            }
            self.step(ns, s);
        }
    }

    pub(super) fn step(&mut self, ns: u32, s: u32) {
        let new = self.sets[s as usize].partition - 1;
        self.step_to(ns, s, new, true, true);
    }

    /// Model releaser: a step is in flight until its pod is re-created.
    pub(super) fn step_in_flight(&mut self, ns: u32) {
        if let Some(state) = self.partition.as_mut() {
            *state.in_flight.entry(ns).or_insert(0) += 1;
        }
    }

    /// The releaser's partition UPDATE; `model`: the model releaser's step, in flight
    /// until its pod is re-created (the real plan keeps its own windows); `rate`: a paced
    /// step (not a free move to the target).
    pub(super) fn step_to(&mut self, ns: u32, s: u32, new: u32, model: bool, rate: bool) {
        let now = self.now;
        let sts = &self.sets[s as usize];
        let (old, target) = (sts.partition, sts.target.unwrap_or(0));
        // The releaser's own UPDATE goes through the webhook like any other write.
        let mut churn = statefulset_update_request(&StsUpdate {
            namespace: &self.namespaces[ns as usize],
            name: &sts.name,
            uid: &sts.uid,
            user: RELEASER,
            replicas: sts.replicas,
            template_changed: false,
            old_partition: Some(old),
            new_partition: Some(new),
            update_pending: true,
            old_target: Some(target),
            new_target: Some(target),
            new_held: Some(new),
        });
        if let Admission::Allowed { .. } = self.admit(&mut churn, None, None) {
            if model && new < self.sets[s as usize].replicas {
                self.step_in_flight(ns);
            }
            if rate {
                let rule = self
                    .partition
                    .as_ref()
                    .map(|p| self.policy.rules[p.rule].name.clone());
                self.charged(&rule, now);
                self.out.steps.push(now);
            }
            let sts = &mut self.sets[s as usize];
            sts.partition = new;
            if new < sts.replicas {
                let pod = sts.first_pod + new;
                self.pods[pod as usize].step_pending = true;
            }
            if let Some(state) = self.partition.as_mut() {
                state.not_ready += 1;
            }
            self.enqueue(Ctrl::Sts, s);
        } else if let Some(state) = self.partition.as_mut() {
            // Refused by some other rule: try again after a window.
            if !self.sc.real_releasers {
                state.queue.push(ns, s);
            }
            let retry = now + self.sc.window;
            self.wake_partition(retry);
        }
    }

    /// One round of `pacing::gate::plan` over the gated pods, as the releaser sees them.
    pub(super) fn run_gate_real(&mut self, g: usize) {
        let now = self.now;
        let rule = self.policy.rules[self.gates[g].rule].name.clone();
        let queue: Vec<QueuedPod> = self.gates[g]
            .real_queue
            .iter()
            .map(|&p| QueuedPod {
                namespace: self.namespaces[self.pod_namespace(p) as usize].clone(),
                name: self.pod_name(p),
                uid: format!("uid-pod-{p}-{}", self.pods[p as usize].generation),
                resource_version: String::new(),
                rule: rule.to_string(),
                owner: Some(self.pod_owner_uid(p).to_string()),
                // creationTimestamp has second precision.
                created: self.pods[p as usize].created_at / 1000 * 1000,
            })
            .collect();
        let not_ready = HashMap::from([(rule.to_string(), self.gates[g].not_ready)]);
        let mut cursor = std::mem::take(&mut self.gates[g].cursor);
        let round = plan(
            &Inputs {
                queue: &queue,
                not_ready: &not_ready,
                policy: &self.policy,
                now,
                max_releases: MAX_RELEASES_PER_ROUND,
                network: self.network_room(),
            },
            &mut self.limiter,
            &mut cursor,
        );
        self.gates[g].cursor = cursor;
        let mut released = vec![false; queue.len()];
        for r in &round.releases {
            released[r.index] = true;
            let p = self.gates[g].real_queue[r.index];
            self.charged(&Some(rule.clone()), now);
            self.gates[g].not_ready += 1;
            self.released(p, g);
            let pod = &mut self.pods[p as usize];
            pod.gate_pending = Some(g);
            let generation = pod.generation;
            self.at(
                now + self.sc.api_latency,
                Ev::Ungated { pod: p, generation },
            );
        }
        let mut i = 0;
        self.gates[g].real_queue.retain(|_| {
            i += 1;
            !released[i - 1]
        });
        let state = &mut self.gates[g];
        state.blocked_on_ready = !state.real_queue.is_empty();
        if let Some(at) = round.wake_at {
            self.wake_gate(g, at.max(now));
        }
    }

    /// One round of `pacing::partition::plan_steps` over the held sets.
    /// The held sets as the real releaser reads them from the cluster.
    fn held_sets(&self, ids: &[u32], rule: &str, now: Millis) -> Vec<HeldSet> {
        ids.iter()
            .map(|&s| {
                let sts = &self.sets[s as usize];
                let released = if sts.partition >= sts.replicas {
                    Released::None
                } else {
                    // The real releaser sees the deletion at its next look at the pod.
                    let pod = &self.pods[(sts.first_pod + sts.partition) as usize];
                    let at = pod.deleted_at + DELETION_SEEN_AFTER;
                    let deleted =
                        pod.updated || matches!(pod.phase, Phase::Terminating | Phase::Absent);
                    match (
                        deleted && at <= now,
                        pod.updated && pod.phase == Phase::Ready,
                    ) {
                        (false, _) => Released::InFlight,
                        (true, false) => Released::Starting { at },
                        (true, true) => Released::Settled { at },
                    }
                };
                HeldSet {
                    namespace: self.namespaces[sts.namespace as usize].clone(),
                    name: sts.name.clone(),
                    uid: sts.uid.clone(),
                    resource_version: String::new(),
                    rule: rule.to_string(),
                    rolling_update: true,
                    replicas: sts.replicas,
                    partition: sts.partition,
                    target: sts.target,
                    held: Some(sts.partition),
                    stepped_at: sts.stepped_at.clone(),
                    held_since: sts.updated_at,
                    released,
                    // The simulated sets have no maxUnavailable: one step in flight.
                    earlier: Vec::new(),
                    max_unavailable: 1,
                    nothing_to_roll: false,
                    backoff: false,
                }
            })
            .collect()
    }

    pub(super) fn run_partition_real(&mut self) {
        let now = self.now;
        let Some(state) = self.partition.as_ref() else {
            return;
        };
        let rule = self.policy.rules[state.rule].name.to_string();
        let ids = state.held.clone();
        let held = self.held_sets(&ids, &rule, now);
        let records = self
            .partition
            .as_ref()
            .map(|p| p.records.clone())
            .unwrap_or_default();
        let horizon = longest_window(&self.policy);
        let taken = match self.partition.as_mut() {
            Some(state) => {
                state.taken.retain(|t| t.at + horizon > now);
                state.taken.clone()
            }
            None => Vec::new(),
        };
        let round = plan_steps(&StepInputs {
            held: &held,
            records: &records,
            taken: &taken,
            policy: &self.policy,
            now,
            max_moves: MAX_RELEASES_PER_ROUND,
            // An adaptive rule steps a set only with room for its replacement, as the
            // real partition releaser does.
            network_room: self.partition_room(),
        });
        if let Some(state) = self.partition.as_mut() {
            let mut index = 0;
            state.records.retain(|_| {
                index += 1;
                !round.cleanups.contains(&(index - 1))
            });
        }
        let mut finished = Vec::new();
        for m in round.moves {
            match m {
                Move::Step {
                    index,
                    to,
                    why,
                    record,
                    rule,
                    ..
                } => {
                    if let (Some(rule), Some(state)) = (rule, self.partition.as_mut()) {
                        state.taken.push(TakenStep {
                            rule,
                            namespace: held[index].namespace.clone(),
                            at: now,
                        });
                    }
                    let s = ids[index];
                    let ns = self.sets[s as usize].namespace;
                    if let Some(record) = record {
                        self.sets[s as usize].stepped_at = record;
                    }
                    // The real plan counts its steps in its own windows, not the limiter's.
                    self.step_to(ns, s, to, false, why == StepWhy::Rate);
                }
                Move::Finish { index, record, .. } | Move::LetGo { index, record, .. } => {
                    let set = &held[index];
                    if !record.is_empty() {
                        if let Some(state) = self.partition.as_mut() {
                            state.records.push(Record {
                                namespace: set.namespace.clone(),
                                name: set.name.clone(),
                                uid: set.uid.clone(),
                                rule: set.rule.clone(),
                                stepped_at: record,
                            });
                        }
                    }
                    finished.push(ids[index]);
                }
            }
        }
        if !finished.is_empty() {
            if let Some(state) = self.partition.as_mut() {
                state.held.retain(|s| !finished.contains(s));
            }
            for s in finished {
                self.sets[s as usize].target = None;
                self.check_sts_done(s);
            }
        }
        if let Some(at) = round.wake_at {
            self.wake_partition(at.max(now));
        }
    }
}
