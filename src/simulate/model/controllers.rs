//! The modelled controllers' side: a worker picks an item, syncs it, sends its one write
//! through the webhook (client-go's retry on Retry-After included), and what the write
//! does to the cluster.

use super::*;

impl<'a> Sim<'a> {
    /// Idle workers take items off the queue: processNextWorkItem.
    pub(super) fn dispatch(&mut self, ctrl: Ctrl) {
        loop {
            let c = &mut self.ctrls[ctrl as usize];
            if c.idle.is_empty() || c.queue.is_empty() {
                return;
            }
            let Some(item) = c.queue.get() else { return };
            let req = match ctrl {
                Ctrl::Sts => self.sync_sts(item),
                Ctrl::Dep => self.sync_dep(item),
            };
            let c = &mut self.ctrls[ctrl as usize];
            match req {
                None => {
                    c.queue.done(item);
                    c.queue.forget(item);
                }
                Some(req) => {
                    let Some(w) = c.idle.pop() else { return };
                    let worker = &mut c.workers[w as usize];
                    worker.item = item;
                    worker.req = Some(req);
                    worker.retries = 0;
                    worker.slot = None;
                    worker.ok = false;
                    worker.gate = None;
                    let now = self.now;
                    self.at(
                        now,
                        Ev::Send {
                            ctrl,
                            worker: w,
                            throttled: false,
                        },
                    );
                }
            }
        }
    }

    /// The StatefulSet controller's sync, OrderedReady + RollingUpdate (v1.36 without the
    /// MaxUnavailableStatefulSet gate): at most one pod write per sync.
    pub(super) fn sync_sts(&self, s: u32) -> Option<Req> {
        let sts = &self.sets[s as usize];
        sts.updated_at?;
        let first = sts.first_pod;
        let pod = |o: u32| {
            let p = &self.pods[(first + o) as usize];
            (p.phase, p.updated)
        };
        match statefulset_next(sts.replicas, sts.partition, pod)? {
            StsWrite::Create(o) => Some(Req::Create(first + o)),
            StsWrite::Delete(o) => Some(Req::Delete(first + o)),
        }
    }

    /// Deployment + ReplicaSet controllers folded into one sync: scale the new ReplicaSet
    /// up within maxSurge, the old one down within maxUnavailable, then one pod write.
    pub(super) fn sync_dep(&mut self, d: u32) -> Option<Req> {
        let dep = &self.deps[d as usize];
        dep.updated_at?;
        let (mut old_alive, mut new_alive, mut new_ready) = (0u32, 0u32, 0u32);
        let mut victim: Option<u32> = None;
        for &p in &dep.pods {
            let pod = &self.pods[p as usize];
            if pod.phase == Phase::Terminating {
                continue;
            }
            if pod.updated {
                new_alive += 1;
                if pod.phase == Phase::Ready {
                    new_ready += 1;
                }
            } else {
                old_alive += 1;
                // Not-ready pods go first, as the ReplicaSet controller ranks them.
                if victim.is_none() || pod.phase != Phase::Ready {
                    victim = Some(p);
                }
            }
        }
        let (r, surge, unavailable) = (dep.replicas, self.sc.max_surge, self.sc.max_unavailable);
        let mut old_spec = dep.old_spec;
        let mut new_spec = dep.new_spec;
        let max_total = r + surge;
        if old_spec + new_spec < max_total {
            new_spec = (new_spec + max_total - old_spec - new_spec).min(r);
        }
        let min_available = r.saturating_sub(unavailable);
        let new_unavailable = new_spec.saturating_sub(new_ready);
        // Old pods beyond the old ReplicaSet's size are about to go: not counted available.
        let available = old_alive.min(old_spec) + new_ready;
        if old_spec + new_spec > min_available + new_unavailable && available > min_available {
            old_spec -= (available - min_available).min(old_spec);
        }
        let dep = &mut self.deps[d as usize];
        dep.old_spec = old_spec;
        dep.new_spec = new_spec;
        if new_alive < new_spec {
            return Some(Req::CreateForReplicaSet(d));
        }
        if old_alive > old_spec {
            return victim.map(Req::Delete);
        }
        None
    }

    /// The request as the mutating webhook sees it.
    pub(super) fn request_for(&self, req: Req) -> ChurnRequest {
        match req {
            Req::Delete(p) => {
                let pod = &self.pods[p as usize];
                match pod.owner {
                    Owner::Sts(s) => {
                        let sts = &self.sets[s as usize];
                        pod_delete_request(
                            &self.namespaces[sts.namespace as usize],
                            &format!("{}-{}", sts.name, pod.ordinal),
                            STATEFULSET_CONTROLLER,
                            "StatefulSet",
                            &sts.uid,
                        )
                    }
                    Owner::Dep(d) => {
                        let dep = &self.deps[d as usize];
                        let rs = if pod.updated {
                            &dep.new_rs
                        } else {
                            &dep.old_rs
                        };
                        pod_delete_request(
                            &self.namespaces[dep.namespace as usize],
                            &format!("{}-{}-{}", dep.name, pod.updated as u8, pod.ordinal),
                            REPLICASET_CONTROLLER,
                            "ReplicaSet",
                            rs,
                        )
                    }
                }
            }
            Req::Create(p) => {
                let pod = &self.pods[p as usize];
                let Owner::Sts(s) = pod.owner else {
                    return base_request(
                        ChurnKind::PodCreate,
                        "",
                        "",
                        "",
                        Identity::Exact(String::new()),
                    );
                };
                let sts = &self.sets[s as usize];
                pod_create_request(
                    &self.namespaces[sts.namespace as usize],
                    &format!("{}-{}", sts.name, pod.ordinal),
                    "",
                    STATEFULSET_CONTROLLER,
                    "StatefulSet",
                    &sts.uid,
                )
            }
            Req::CreateForReplicaSet(d) => {
                let dep = &self.deps[d as usize];
                let generate_name = format!("{}-new-", dep.name);
                pod_create_request(
                    &self.namespaces[dep.namespace as usize],
                    "",
                    &generate_name,
                    REPLICASET_CONTROLLER,
                    "ReplicaSet",
                    &dep.new_rs,
                )
            }
        }
    }

    /// A worker's request reaches the API server (after the client's own rate limit).
    pub(super) fn send(&mut self, ctrl: Ctrl, w: u16, throttled: bool) {
        let now = self.now;
        let c = &mut self.ctrls[ctrl as usize];
        if !throttled {
            let wait = c.client.reserve(now);
            if wait > 0 {
                self.at(
                    now + wait,
                    Ev::Send {
                        ctrl,
                        worker: w,
                        throttled: true,
                    },
                );
                return;
            }
        }
        let worker = &c.workers[w as usize];
        let Some(req) = worker.req else { return };
        let slot = worker.slot;
        let mut churn = self.request_for(req);
        let validating_name = match req {
            Req::CreateForReplicaSet(_) => {
                Some(format!("{}{}", churn_generate_name(&churn), self.seq))
            }
            _ => None,
        };
        let admission = self.admit(&mut churn, slot, validating_name);
        let latency = self.sc.api_latency;
        let max_retries = self.sc.max_retries;
        let gate = match &admission {
            Admission::Allowed {
                gated: Some(rule), ..
            } => self
                .gates
                .iter()
                .position(|g| self.policy.rules[g.rule].name == *rule),
            _ => None,
        };
        let worker = &mut self.ctrls[ctrl as usize].workers[w as usize];
        match admission {
            Admission::Allowed {
                at,
                adaptive_at_once,
                ..
            } => {
                worker.ok = true;
                worker.gate = gate;
                worker.adaptive_at_once = adaptive_at_once;
                self.out.worker_blocked += at - now;
                self.at(at + latency, Ev::Complete { ctrl, worker: w });
            }
            Admission::RetryAfter { seconds, slot } if worker.retries < max_retries => {
                worker.retries += 1;
                worker.slot = slot;
                let sleep = seconds as Millis * 1000;
                self.out.retries += 1;
                self.out.worker_blocked += sleep;
                self.at(
                    now + latency + sleep,
                    Ev::Send {
                        ctrl,
                        worker: w,
                        throttled: false,
                    },
                );
            }
            Admission::RetryAfter { .. } | Admission::Denied => {
                worker.ok = false;
                self.out.errors += 1;
                self.at(now + latency, Ev::Complete { ctrl, worker: w });
            }
        }
    }

    /// The API call returned: apply it, then Done + Forget or AddRateLimited.
    pub(super) fn complete(&mut self, ctrl: Ctrl, w: u16) {
        let now = self.now;
        let worker = self.ctrls[ctrl as usize].workers[w as usize].clone();
        if worker.ok {
            if let Some(req) = worker.req {
                self.net.applying_at_once = worker.adaptive_at_once;
                self.apply(req, worker.gate);
                self.net.applying_at_once = false;
            }
        }
        let c = &mut self.ctrls[ctrl as usize];
        c.workers[w as usize].req = None;
        c.idle.push(w);
        c.queue.done(worker.item);
        if worker.ok {
            c.queue.forget(worker.item);
        } else if let Some(at) = c.queue.add_rate_limited(worker.item, now) {
            self.at(
                at,
                Ev::Requeue {
                    ctrl,
                    item: worker.item,
                },
            );
        }
        self.dispatch(ctrl);
    }

    pub(super) fn throttled_pod(&self, pod: u32) -> bool {
        match self.pods[pod as usize].owner {
            Owner::Sts(s) => self.sets[s as usize].throttled,
            Owner::Dep(_) => true,
        }
    }

    /// The write took effect in the API server; the informers see it at once.
    pub(super) fn apply(&mut self, req: Req, gate: Option<usize>) {
        let now = self.now;
        match req {
            Req::Delete(p) => {
                let pod = &mut self.pods[p as usize];
                if pod.phase == Phase::Terminating || pod.phase == Phase::Absent {
                    return;
                }
                pod.phase = Phase::Terminating;
                pod.down_since = Some(now);
                pod.deleted_at = now;
                let generation = pod.generation;
                let stepped = pod.step_pending;
                if self.throttled_pod(p) {
                    self.out.deletions.push(now);
                }
                let gone = now + self.delay(p, generation, 1, self.sc.terminate);
                self.at(gone, Ev::PodGone { pod: p, generation });
                if stepped {
                    // The step took effect: it counts at its deletion from now on.
                    if self.sc.real_releasers {
                        self.wake_partition(now + DELETION_SEEN_AFTER);
                    } else {
                        self.step_took_effect(p);
                    }
                }
                self.enqueue_owner(p);
            }
            Req::Create(p) => {
                let partition = match self.pods[p as usize].owner {
                    Owner::Sts(s) => self.sets[s as usize].partition,
                    Owner::Dep(_) => 0,
                };
                let pod = &mut self.pods[p as usize];
                if pod.phase != Phase::Absent {
                    return;
                }
                pod.generation += 1;
                pod.created_at = now;
                // Below the partition the controller re-creates the current revision.
                pod.updated = pod.ordinal >= partition;
                self.created(p, gate);
            }
            Req::CreateForReplicaSet(d) => {
                let dep = &mut self.deps[d as usize];
                let p = self.pods.len() as u32;
                let ordinal = dep.created;
                dep.created += 1;
                dep.pods.push(p);
                self.pods.push(Pod {
                    owner: Owner::Dep(d),
                    ordinal,
                    phase: Phase::Absent,
                    updated: true,
                    generation: 1,
                    down_since: None,
                    gate_pending: None,
                    step_pending: false,
                    created_at: now,
                    deleted_at: 0,
                    released_at: now,
                    bound_at: now,
                    net_up: true,
                    net_pending: false,
                    sampled: false,
                });
                self.created(p, gate);
            }
        }
    }

    pub(super) fn created(&mut self, p: u32, gate: Option<usize>) {
        match gate {
            Some(g) => {
                self.pods[p as usize].phase = Phase::Gated;
                self.out.gated += 1;
                let namespace = match self.pods[p as usize].owner {
                    Owner::Sts(s) => self.sets[s as usize].namespace,
                    Owner::Dep(d) => self.deps[d as usize].namespace,
                };
                if self.sc.real_releasers {
                    self.gates[g].real_queue.push(p);
                } else {
                    self.gates[g].queue.push(namespace, p);
                }
                self.wake_gate(g, self.now);
            }
            None => {
                if self.net.applying_at_once {
                    self.admitted_at_once(p);
                }
                self.start(p)
            }
        }
        self.enqueue_owner(p);
    }

    /// The pod is scheduled: the kubelet makes it Ready after the start delay (with the
    /// network model: after the CNI has wired it, the base network time, then the start
    /// delay).
    pub(super) fn start(&mut self, p: u32) {
        let now = self.now;
        let pod = &mut self.pods[p as usize];
        pod.phase = Phase::Starting;
        if pod.gate_pending.is_none() {
            pod.released_at = now;
        }
        let generation = pod.generation;
        if self.throttled_pod(p) {
            self.out.starts.push(now);
        }
        if self.sc.cni.is_some() {
            self.bind(p);
            return;
        }
        let ready = now + self.delay(p, generation, 2, self.sc.start);
        self.at(ready, Ev::PodReady { pod: p, generation });
    }
}
