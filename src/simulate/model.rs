//! The discrete-event model: StatefulSet and Deployment controllers with client-go's work
//! queue and retry, a fake kubelet, the gate and partition releasers, and the webhook,
//! which is the real `decide_churn` over the real `Limiter` at the simulated `now`.

mod controllers;
mod network;
mod releasers;
mod webhook;

pub use network::{queue_max_from, Fifo};
use webhook::Admission;

use super::client::{FairQueue, TokenBucket, WorkQueue};
use super::requests::{
    base_request, churn_generate_name, pod_create_request, pod_delete_request, statefulset_next,
    statefulset_update_request, Phase, StsUpdate, StsWrite,
};
use super::rng::draws;
use super::scenario::{
    Scenario, SimAction, OPERATOR, RELEASER, REPLICASET_CONTROLLER, STATEFULSET_CONTROLLER,
};
use crate::admission::decide::decide_churn;
use crate::admission::{ChurnRequest, Endpoint, Verdict, GATE_NAME};
use crate::limiter::{Identity, Limiter, Millis};
use crate::pacing::gate::{
    longest_window, plan, Cursor, Inputs, NetworkRoom, QueuedPod, MAX_RELEASES_PER_ROUND,
};
use crate::pacing::partition::{
    plan_steps, HeldSet, Move, Record, Released, StepInputs, StepWhy, TakenStep,
};
use crate::policy::{Action, ChurnKind, Policy, Scope};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;

// ---------------------------------------------------------------------------------------
// Randomness: per-draw hashing, so a pod's n-th start takes the same time under every action.

// ---------------------------------------------------------------------------------------
// client-go pieces.

// ---------------------------------------------------------------------------------------
// Round-robin across namespaces, FIFO within one: both releasers' order.

// ---------------------------------------------------------------------------------------
// Requests the modelled controllers send, built the way `classify` builds them.

// ---------------------------------------------------------------------------------------
// The StatefulSet controller's choice.

// ---------------------------------------------------------------------------------------
// The cluster.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Sts(u32),
    Dep(u32),
}

#[derive(Debug, Clone)]
struct Pod {
    owner: Owner,
    ordinal: u32,
    phase: Phase,
    updated: bool,
    /// Bumped on every (re)creation, so stale kubelet events are ignored.
    generation: u32,
    /// When the pod's previous incarnation stopped serving (deletion), for outages.
    down_since: Option<Millis>,
    /// Released by a gate releaser (index into the gate rules) and not yet Ready.
    gate_pending: Option<usize>,
    /// Released by a partition step and not yet Ready.
    step_pending: bool,
    /// When this incarnation was created.
    created_at: Millis,
    /// When the last DELETE of this ordinal took effect (StatefulSet pods keep their
    /// index across incarnations).
    deleted_at: Millis,
    /// When this incarnation was released (by a gate) or started ungated: start latency
    /// runs from here to Ready.
    released_at: Millis,
    /// The network model: when this incarnation was bound (its network time starts).
    bound_at: Millis,
    /// Its network is up (the network model), or there is no network model.
    net_up: bool,
    /// Released by an adaptive rule and not network-ready: counts in the window.
    net_pending: bool,
    /// Its network time was fed to the window (at the bound, or when it came).
    sampled: bool,
}

#[derive(Debug, Clone)]
struct Sts {
    namespace: u32,
    name: String,
    uid: String,
    replicas: u32,
    first_pod: u32,
    throttled: bool,
    /// Effective partition (what the controller respects).
    partition: u32,
    /// Where churn-throttler's partition releaser is heading, while it holds the set.
    target: Option<u32>,
    updated_at: Option<Millis>,
    done_at: Option<Millis>,
    /// Partition step times still in the window (the real releaser reads them).
    stepped_at: Vec<Millis>,
}

#[derive(Debug, Clone)]
struct Dep {
    namespace: u32,
    name: String,
    /// The new ReplicaSet's UID (owner of the new pods) and the old one's.
    new_rs: String,
    old_rs: String,
    replicas: u32,
    old_spec: u32,
    new_spec: u32,
    pods: Vec<u32>,
    created: u32,
    updated_at: Option<Millis>,
    done_at: Option<Millis>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ctrl {
    Sts = 0,
    Dep = 1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Req {
    /// Delete this pod.
    Delete(u32),
    /// Create this StatefulSet pod.
    Create(u32),
    /// Create a pod for this deployment's new ReplicaSet.
    CreateForReplicaSet(u32),
}

#[derive(Debug, Clone)]
struct Worker {
    item: u32,
    req: Option<Req>,
    /// Retries done for the current request (client-go's attempts - 1).
    retries: u32,
    /// The slot a Retry-After answer named, so a later admission is placed there.
    slot: Option<Millis>,
    ok: bool,
    /// The gate (index into the gate releasers) the created pod is held behind.
    gate: Option<usize>,
    /// Admitted at once under an adaptive gate rule.
    adaptive_at_once: bool,
}

struct Controller {
    queue: WorkQueue,
    workers: Vec<Worker>,
    idle: Vec<u16>,
    client: TokenBucket,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    StsUpdate(u32),
    DepUpdate(u32),
    Send {
        ctrl: Ctrl,
        worker: u16,
        throttled: bool,
    },
    Complete {
        ctrl: Ctrl,
        worker: u16,
    },
    Requeue {
        ctrl: Ctrl,
        item: u32,
    },
    PodGone {
        pod: u32,
        generation: u32,
    },
    PodReady {
        pod: u32,
        generation: u32,
    },
    /// The releaser's patch removing the gate took effect.
    Ungated {
        pod: u32,
        generation: u32,
    },
    GateWake(u16),
    PartitionWake,
    /// The limits in force change (a schedule window opens or closes).
    ScheduleChange,
    /// The network model: the pod's network is up.
    NetReady {
        pod: u32,
        generation: u32,
    },
    /// The network model: the pod's bound after binding; a censored sample if its
    /// network is still not up.
    NetBound {
        pod: u32,
        generation: u32,
    },
}

struct GateState {
    rule: usize,
    queue: FairQueue,
    /// Real releasers: gated pods in creation order, and the plan's round-robin cursor.
    real_queue: Vec<u32>,
    cursor: Cursor,
    not_ready: u32,
    blocked_on_ready: bool,
    next_wake: Option<Millis>,
}

struct PartitionState {
    rule: usize,
    /// Real releasers: the held sets.
    held: Vec<u32>,
    /// Real releasers: the step times finished sets keep until they leave the window.
    records: Vec<Record>,
    /// Real releasers: the steps taken, for the spacing (as the controller keeps them).
    taken: Vec<TakenStep>,
    /// Model releaser: steps whose old pod is not deleted yet, per namespace. Like the
    /// real releaser, a step counts in the window from the step until its old pod is
    /// deleted, and at the deletion from then on.
    in_flight: HashMap<u32, u32>,
    /// StatefulSets whose previous step is Ready and that have steps left.
    queue: FairQueue,
    not_ready: u32,
    blocked_on_ready: bool,
    next_wake: Option<Millis>,
}

/// What one run produced, for the report.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    pub action: Option<SimAction>,
    /// Throttled workloads converged, of how many.
    pub converged: u64,
    pub workloads: u64,
    /// Last throttled workload done (None when some never converged).
    pub makespan: Option<Millis>,
    /// When every throttled workload has converged or the horizon was hit.
    pub end: Millis,
    /// Pod deletions taking effect (endpoints removed), throttled workloads.
    pub deletions: Vec<Millis>,
    /// Pods scheduled to start (ungated creation or release), throttled workloads.
    pub starts: Vec<Millis>,
    /// Partition steps by the releaser.
    pub steps: Vec<Millis>,
    /// Times charged in the limiter per rule (admission, slot, hold, release, step).
    pub charges: BTreeMap<String, Vec<Millis>>,
    /// Per StatefulSet pod ordinal: time not Ready.
    pub outages: Vec<Millis>,
    /// The unthrottled StatefulSet's rollout (None: did not converge).
    pub collateral: Option<Millis>,
    pub collateral_enabled: bool,
    /// 429 answers (deny and retry-after) seen by the controllers.
    pub refused: u64,
    /// client-go retries after Retry-After.
    pub retries: u64,
    /// Requests that failed back to the controller (deny, retries exhausted).
    pub errors: u64,
    /// Webhook holds.
    pub holds: u64,
    /// Pods admitted behind the gate.
    pub gated: u64,
    /// Worker time spent sleeping in Retry-After or held by the webhook.
    pub worker_blocked: Millis,
    pub events: u64,
    /// Throttled pods: release (or ungated start) to Ready.
    pub start_latency: Vec<Millis>,
    /// The network model: every pod's (bound, wired) in the CNI, in binding order; the
    /// CNI queue at t is the pods with bound <= t < wired.
    pub cni_spans: Vec<(Millis, Millis)>,
    /// The adaptive window after every change: (time, window).
    pub window: Vec<(Millis, u32)>,
}

pub struct Sim<'a> {
    sc: &'a Scenario,
    policy: Policy,
    limiter: Limiter,
    now: Millis,
    heap: BinaryHeap<Reverse<(Millis, u64, Ev)>>,
    seq: u64,
    namespaces: Vec<String>,
    /// Namespace index of the unthrottled StatefulSet (not opted in).
    sets: Vec<Sts>,
    deps: Vec<Dep>,
    pods: Vec<Pod>,
    ctrls: [Controller; 2],
    gates: Vec<GateState>,
    partition: Option<PartitionState>,
    collateral_sts: Option<u32>,
    remaining: u64,
    out: RunResult,
    net: NetState,
    /// The policy with its schedule windows (`--policy`, `--start-time`); `policy` is the
    /// one in force at the simulated `now`.
    scheduled: Option<&'a super::scenario::Schedules>,
    base_policy: Policy,
}

/// The network model's state: the CNI's FIFO and the shared window of the adaptive rules.
#[derive(Default)]
struct NetState {
    /// The CNI's queue.
    fifo: network::Fifo,
    /// The shared window (adaptive runs only).
    window: Option<crate::pacing::network::NetworkWindow>,
    /// Released pods of adaptive rules whose network is not up.
    in_flight: u32,
    /// The policy the webhook decides by while the window is full: the adaptive gate
    /// rules gate-only (None: no adaptive gate rule).
    gate_only: Option<Policy>,
    /// The write being applied was admitted at once under an adaptive gate rule.
    applying_at_once: bool,
}

const UNLABELLED_NAMESPACE: &str = "unthrottled";

/// How long after a step's DELETE the real partition releaser sees it: its look again at
/// a step in flight (RECHECK_IN_FLIGHT_MS of releaser/partition.rs), at the latest.
const DELETION_SEEN_AFTER: Millis = 250;

/// The cluster at the start: every workload rolled out and Ready.
struct World {
    namespaces: Vec<String>,
    sets: Vec<Sts>,
    deps: Vec<Dep>,
    pods: Vec<Pod>,
    collateral_sts: Option<u32>,
}

impl World {
    fn of(sc: &Scenario) -> World {
        let mut namespaces: Vec<String> = (0..sc.namespaces)
            .map(|i| format!("tenant-{i:05}"))
            .collect();
        let unlabelled = namespaces.len() as u32;
        namespaces.push(UNLABELLED_NAMESPACE.to_string());
        let mut world = World {
            namespaces,
            sets: Vec::new(),
            deps: Vec::new(),
            pods: Vec::new(),
            collateral_sts: None,
        };
        for i in 0..sc.statefulsets {
            world.add_sts(i % sc.namespaces, format!("mysql-{i}"), sc.replicas, true);
        }
        if sc.collateral {
            world.collateral_sts = Some(sc.statefulsets);
            world.add_sts(
                unlabelled,
                "unthrottled".into(),
                sc.collateral_replicas,
                false,
            );
        }
        for i in 0..sc.deployments {
            let mut dep = Dep {
                namespace: i % sc.namespaces,
                name: format!("web-{i}"),
                new_rs: format!("uid-rs-new-{i}"),
                old_rs: format!("uid-rs-old-{i}"),
                replicas: sc.deployment_replicas,
                old_spec: sc.deployment_replicas,
                new_spec: 0,
                pods: Vec::new(),
                created: 0,
                updated_at: None,
                done_at: None,
            };
            for ordinal in 0..sc.deployment_replicas {
                dep.pods.push(world.pods.len() as u32);
                world.pods.push(Pod::ready(Owner::Dep(i), ordinal));
            }
            world.deps.push(dep);
        }
        world
    }

    fn add_sts(&mut self, namespace: u32, name: String, replicas: u32, throttled: bool) {
        let first_pod = self.pods.len() as u32;
        let index = self.sets.len() as u32;
        for ordinal in 0..replicas {
            self.pods.push(Pod::ready(Owner::Sts(index), ordinal));
        }
        self.sets.push(Sts {
            namespace,
            uid: format!("uid-sts-{index}"),
            name,
            replicas,
            first_pod,
            throttled,
            partition: 0,
            target: None,
            updated_at: None,
            done_at: None,
            stepped_at: Vec::new(),
        });
    }
}

impl Pod {
    fn ready(owner: Owner, ordinal: u32) -> Pod {
        Pod {
            owner,
            ordinal,
            phase: Phase::Ready,
            updated: false,
            generation: 0,
            down_since: None,
            gate_pending: None,
            step_pending: false,
            created_at: 0,
            deleted_at: 0,
            released_at: 0,
            bound_at: 0,
            net_up: true,
            net_pending: false,
            sampled: false,
        }
    }
}

impl Controller {
    fn new(sc: &Scenario, items: usize, workers: u32) -> Controller {
        Controller {
            queue: WorkQueue::new(
                items,
                sc.backoff_base,
                sc.backoff_max,
                sc.queue_qps,
                sc.queue_burst,
            ),
            workers: (0..workers)
                .map(|_| Worker {
                    item: 0,
                    req: None,
                    retries: 0,
                    slot: None,
                    ok: false,
                    gate: None,
                    adaptive_at_once: false,
                })
                .collect(),
            idle: (0..workers as u16).rev().collect(),
            client: TokenBucket::new(sc.client_qps, sc.client_burst),
        }
    }
}

impl<'a> Sim<'a> {
    pub fn new(sc: &'a Scenario, action: SimAction) -> Result<Sim<'a>, String> {
        let policy = sc.policy(action)?;
        let limiter = Limiter::new(policy.max_buckets);
        let World {
            namespaces,
            sets,
            deps,
            pods,
            collateral_sts,
        } = World::of(sc);
        let ctrls = [
            Controller::new(sc, sets.len(), sc.workers),
            Controller::new(sc, deps.len(), sc.deployment_workers),
        ];
        let gates = policy
            .rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.action == Action::Gate)
            .map(|(rule, _)| GateState {
                rule,
                queue: FairQueue::default(),
                real_queue: Vec::new(),
                cursor: Cursor::default(),
                not_ready: 0,
                blocked_on_ready: false,
                next_wake: None,
            })
            .collect();
        let partition = policy
            .rules
            .iter()
            .position(|r| r.action == Action::Partition)
            .map(|rule| PartitionState {
                rule,
                held: Vec::new(),
                records: Vec::new(),
                taken: Vec::new(),
                in_flight: HashMap::new(),
                queue: FairQueue::default(),
                not_ready: 0,
                blocked_on_ready: false,
                next_wake: None,
            });
        let window = policy
            .network
            .filter(|_| sc.cni.is_some())
            .map(|config| crate::pacing::network::NetworkWindow::new(config, None));
        let gate_only = window.as_ref().and_then(|_| {
            let mut p = policy.clone();
            let mut any = false;
            for r in p.rules.iter_mut() {
                if r.action == Action::Gate && r.adaptive {
                    r.gate_only = true;
                    any = true;
                }
            }
            any.then_some(p)
        });
        let net = NetState {
            window,
            gate_only,
            ..NetState::default()
        };
        let remaining = sc.statefulsets as u64 + sc.deployments as u64;
        let out = RunResult {
            action: Some(action),
            workloads: remaining,
            collateral_enabled: sc.collateral,
            ..RunResult::default()
        };
        Ok(Sim {
            sc,
            base_policy: policy.clone(),
            scheduled: sc.schedules.as_ref(),
            policy,
            limiter,
            now: 0,
            heap: BinaryHeap::new(),
            seq: 0,
            namespaces,
            sets,
            deps,
            pods,
            ctrls,
            gates,
            partition,
            collateral_sts,
            remaining,
            out,
            net,
        })
    }

    fn at(&mut self, time: Millis, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((time, self.seq, ev)));
    }

    fn delay(&self, pod: u32, generation: u32, salt: u64, dist: super::scenario::Dist) -> Millis {
        let key = ((pod as u64) << 24) ^ ((generation as u64) << 4) ^ salt;
        let (u, z) = draws(self.sc.seed, key);
        dist.sample(u, z)
    }

    /// Runs to convergence (or the horizon) and returns the measurements.
    pub fn run(mut self) -> RunResult {
        self.apply_schedule();
        // The operator updates every throttled template at once; the other team's update
        // comes in the same instant (or at collateralAt), behind it.
        for i in 0..self.sc.statefulsets {
            self.at(0, Ev::StsUpdate(i));
        }
        for i in 0..self.sc.deployments {
            self.at(0, Ev::DepUpdate(i));
        }
        if let Some(c) = self.collateral_sts {
            self.at(self.sc.collateral_at, Ev::StsUpdate(c));
        }
        let horizon = self.sc.horizon_ms();
        while let Some(Reverse((time, _, ev))) = self.heap.pop() {
            if time > horizon {
                self.now = horizon;
                break;
            }
            self.now = time;
            self.out.events += 1;
            self.handle(ev);
            if self.remaining == 0 && self.collateral_done() {
                break;
            }
        }
        self.out.end = self.now;
        if self.remaining == 0 {
            let sets = self.sets.iter().filter(|s| s.throttled).map(|s| s.done_at);
            let deps = self.deps.iter().map(|d| d.done_at);
            self.out.makespan = sets.chain(deps).try_fold(0, |m, d| d.map(|d| m.max(d)));
        }
        self.out.converged = self.out.workloads - self.remaining;
        if let Some(c) = self.collateral_sts {
            let s = &self.sets[c as usize];
            self.out.collateral = match (s.updated_at, s.done_at) {
                (Some(u), Some(d)) => Some(d - u),
                _ => None,
            };
        }
        self.out
    }

    fn collateral_done(&self) -> bool {
        self.collateral_sts
            .is_none_or(|c| self.sets[c as usize].done_at.is_some())
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::StsUpdate(s) => self.sts_update(s),
            Ev::DepUpdate(d) => {
                self.deps[d as usize].updated_at = Some(self.now);
                self.enqueue(Ctrl::Dep, d);
            }
            Ev::Send {
                ctrl,
                worker,
                throttled,
            } => self.send(ctrl, worker, throttled),
            Ev::Complete { ctrl, worker } => self.complete(ctrl, worker),
            Ev::Requeue { ctrl, item } => {
                if self.ctrls[ctrl as usize].queue.fire(item, self.now) {
                    self.enqueue(ctrl, item);
                }
            }
            Ev::PodGone { pod, generation } => self.pod_gone(pod, generation),
            Ev::PodReady { pod, generation } => self.pod_ready(pod, generation),
            Ev::Ungated { pod, generation } => {
                if self.pods[pod as usize].generation == generation {
                    self.start(pod);
                }
            }
            Ev::GateWake(g) => {
                let g = g as usize;
                if self.gates[g].next_wake == Some(self.now) {
                    self.gates[g].next_wake = None;
                }
                self.run_gate(g);
            }
            Ev::PartitionWake => {
                if let Some(p) = self.partition.as_mut() {
                    if p.next_wake == Some(self.now) {
                        p.next_wake = None;
                    }
                }
                self.run_partition();
            }
            Ev::NetReady { pod, generation } => self.net_ready(pod, generation),
            Ev::NetBound { pod, generation } => self.net_bound(pod, generation),
            Ev::ScheduleChange => {
                self.apply_schedule();
                for g in 0..self.gates.len() {
                    self.wake_gate(g, self.now);
                }
                if self.partition.is_some() {
                    self.at(self.now, Ev::PartitionWake);
                }
            }
        }
    }

    /// The policy in force at the simulated `now` (its wall time: the start time plus
    /// `now`), with a pause's end in simulated time; the next change is an event.
    fn apply_schedule(&mut self) {
        let Some(scheduled) = self.scheduled else {
            return;
        };
        let start = scheduled.start;
        let (mut policy, next) =
            crate::pacing::schedule::policy_in_force(&self.base_policy, &[], start + self.now);
        for rule in &mut policy.rules {
            rule.paused_until = rule.paused_until.map(|u| {
                if u == Millis::MAX {
                    u
                } else {
                    u.saturating_sub(start)
                }
            });
        }
        self.policy = policy;
        if let Some(next) = next {
            self.at(next.saturating_sub(start), Ev::ScheduleChange);
        }
    }

    // --- the webhook ---------------------------------------------------------------------

    fn opted_in(&self, namespace: &str) -> bool {
        namespace != UNLABELLED_NAMESPACE
    }

    // --- informer events and the operator ---------------------------------------------------

    fn sts_update(&mut self, s: u32) {
        let sts = &self.sets[s as usize];
        let mut churn = statefulset_update_request(&StsUpdate {
            namespace: &self.namespaces[sts.namespace as usize],
            name: &sts.name,
            uid: &sts.uid,
            user: OPERATOR,
            replicas: sts.replicas,
            template_changed: true,
            old_partition: None,
            new_partition: None,
            update_pending: false,
            old_target: None,
            new_target: None,
            new_held: None,
        });
        match self.admit(&mut churn, None, None) {
            Admission::Allowed { partition, .. } => {
                let sts = &mut self.sets[s as usize];
                sts.updated_at = Some(self.now);
                if let Some((held, target)) = partition {
                    sts.partition = held;
                    sts.target = Some(target);
                    let namespace = sts.namespace;
                    let real = self.sc.real_releasers;
                    if let Some(p) = self.partition.as_mut() {
                        if real {
                            p.held.push(s);
                        } else {
                            p.queue.push(namespace, s);
                        }
                    }
                    self.wake_partition(self.now);
                }
                self.enqueue(Ctrl::Sts, s);
            }
            // The operator retries its update (not a paced path in any generated policy).
            Admission::RetryAfter { seconds, .. } => {
                self.at(self.now + seconds as Millis * 1000, Ev::StsUpdate(s))
            }
            Admission::Denied => self.at(self.now + 1000, Ev::StsUpdate(s)),
        }
    }

    fn enqueue(&mut self, ctrl: Ctrl, item: u32) {
        self.ctrls[ctrl as usize].queue.add(item);
        self.dispatch(ctrl);
    }

    fn enqueue_owner(&mut self, pod: u32) {
        match self.pods[pod as usize].owner {
            Owner::Sts(s) => self.enqueue(Ctrl::Sts, s),
            Owner::Dep(d) => self.enqueue(Ctrl::Dep, d),
        }
    }

    fn pod_gone(&mut self, pod: u32, generation: u32) {
        let p = &mut self.pods[pod as usize];
        if p.generation != generation || p.phase != Phase::Terminating {
            return;
        }
        p.phase = Phase::Absent;
        if let Owner::Dep(d) = p.owner {
            self.deps[d as usize].pods.retain(|&x| x != pod);
            self.check_dep_done(d);
        }
        self.enqueue_owner(pod);
    }

    fn pod_ready(&mut self, pod: u32, generation: u32) {
        let now = self.now;
        let p = &mut self.pods[pod as usize];
        if p.generation != generation || p.phase != Phase::Starting {
            return;
        }
        p.phase = Phase::Ready;
        let started = now.saturating_sub(p.released_at);
        let down = p.down_since.take();
        let gate = p.gate_pending.take();
        let step = std::mem::take(&mut p.step_pending);
        let owner = p.owner;
        if let Some(g) = gate {
            let state = &mut self.gates[g];
            state.not_ready = state.not_ready.saturating_sub(1);
            if state.blocked_on_ready {
                self.wake_gate(g, now);
            }
        }
        match owner {
            Owner::Sts(s) => {
                let throttled = self.sets[s as usize].throttled;
                if throttled {
                    self.out.start_latency.push(started);
                }
                if let (Some(down), true) = (down, throttled) {
                    self.out.outages.push(now - down);
                }
                if step {
                    self.step_ready(s);
                }
                self.check_sts_done(s);
            }
            Owner::Dep(d) => {
                self.out.start_latency.push(started);
                self.check_dep_done(d);
            }
        }
        self.enqueue_owner(pod);
    }

    fn check_sts_done(&mut self, s: u32) {
        let sts = &self.sets[s as usize];
        if sts.done_at.is_some() || sts.updated_at.is_none() || sts.target.is_some() {
            return;
        }
        let first = sts.first_pod as usize;
        let all = self.pods[first..first + sts.replicas as usize]
            .iter()
            .all(|p| p.updated && p.phase == Phase::Ready);
        if all {
            let throttled = sts.throttled;
            self.sets[s as usize].done_at = Some(self.now);
            if throttled {
                self.remaining -= 1;
            }
        }
    }

    fn check_dep_done(&mut self, d: u32) {
        let dep = &self.deps[d as usize];
        if dep.done_at.is_some() || dep.pods.len() != dep.replicas as usize {
            return;
        }
        let all = dep.pods.iter().all(|&p| {
            let p = &self.pods[p as usize];
            p.updated && p.phase == Phase::Ready
        });
        if all {
            self.deps[d as usize].done_at = Some(self.now);
            self.remaining -= 1;
        }
    }

    // --- controllers ----------------------------------------------------------------------

    // --- the gate releaser ------------------------------------------------------------------

    // --- the partition releaser -------------------------------------------------------------

    // --- the real releasers' pure plans -------------------------------------------------------

    fn pod_name(&self, p: u32) -> String {
        let pod = &self.pods[p as usize];
        match pod.owner {
            Owner::Sts(s) => format!("{}-{}", self.sets[s as usize].name, pod.ordinal),
            Owner::Dep(d) => format!("{}-new-{}", self.deps[d as usize].name, pod.ordinal),
        }
    }

    fn pod_namespace(&self, p: u32) -> u32 {
        match self.pods[p as usize].owner {
            Owner::Sts(s) => self.sets[s as usize].namespace,
            Owner::Dep(d) => self.deps[d as usize].namespace,
        }
    }
}
