//! The discrete-event model: StatefulSet and Deployment controllers with client-go's work
//! queue and retry, a fake kubelet, the gate and partition releasers, and the webhook,
//! which is the real `decide_churn` over the real `Limiter` at the simulated `now`.

use super::scenario::{
    Scenario, SimAction, OPERATOR, RELEASER, REPLICASET_CONTROLLER, STATEFULSET_CONTROLLER,
};
use crate::admission::classify::StatefulSetChange;
use crate::admission::decide::decide_churn;
use crate::admission::{ChurnRequest, Endpoint, Verdict, GATE_NAME};
use crate::limiter::{Identity, Limiter, Millis};
use crate::policy::{Action, ChurnKind, Policy, Scope};
use crate::releaser::partition_plan::{
    plan_steps, HeldSet, Move, Record, Released, StepInputs, StepWhy, TakenStep,
};
use crate::releaser::plan::{
    longest_window, plan, Cursor, Inputs, QueuedPod, MAX_RELEASES_PER_ROUND,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

// ---------------------------------------------------------------------------------------
// Randomness: per-draw hashing, so a pod's n-th start takes the same time under every action.

/// SplitMix64: tiny, deterministic, good enough for delays.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// A uniform and a standard normal draw (Box-Muller) for one keyed event.
pub fn draws(seed: u64, key: u64) -> (f64, f64) {
    let a = mix(seed ^ mix(key));
    let b = mix(a);
    let u1 = unit(a).max(f64::MIN_POSITIVE);
    let u2 = unit(b);
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    (unit(mix(b)), z)
}

// ---------------------------------------------------------------------------------------
// client-go pieces.

/// golang.org/x/time/rate.Limiter as client-go uses it: reservations may go negative,
/// and the caller waits the returned delay.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Millis,
}

impl TokenBucket {
    /// qps 0 means unlimited.
    pub fn new(qps: f64, burst: u32) -> TokenBucket {
        TokenBucket {
            qps,
            burst: burst as f64,
            tokens: burst as f64,
            last: 0,
        }
    }

    /// Takes one token at `now`; returns how long the caller must wait for it.
    pub fn reserve(&mut self, now: Millis) -> Millis {
        if self.qps <= 0.0 {
            return 0;
        }
        if now > self.last {
            let refill = (now - self.last) as f64 * self.qps / 1000.0;
            self.tokens = (self.tokens + refill).min(self.burst);
            self.last = now;
        }
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            0
        } else {
            (-self.tokens * 1000.0 / self.qps).ceil() as Millis
        }
    }
}

/// client-go's per-item exponential failure backoff: base × 2^failures, capped.
pub fn item_backoff(base: Millis, max: Millis, failures: u32) -> Millis {
    if failures >= 63 {
        return max;
    }
    base.saturating_mul(1u64 << failures).min(max)
}

/// client-go's rate-limited work queue (dirty/processing sets, delaying queue, and the
/// default controller rate limiter: max of per-item exponential and an overall bucket).
#[derive(Debug)]
pub struct WorkQueue {
    queue: VecDeque<u32>,
    dirty: Vec<bool>,
    processing: Vec<bool>,
    failures: Vec<u32>,
    /// Earliest pending AddAfter per item.
    waiting: Vec<Option<Millis>>,
    bucket: TokenBucket,
    base: Millis,
    max: Millis,
}

impl WorkQueue {
    pub fn new(items: usize, base: Millis, max: Millis, qps: f64, burst: u32) -> WorkQueue {
        WorkQueue {
            queue: VecDeque::new(),
            dirty: vec![false; items],
            processing: vec![false; items],
            failures: vec![0; items],
            waiting: vec![None; items],
            bucket: TokenBucket::new(qps, burst),
            base,
            max,
        }
    }

    pub fn add(&mut self, item: u32) {
        let i = item as usize;
        if self.dirty[i] {
            return;
        }
        self.dirty[i] = true;
        if self.processing[i] {
            return;
        }
        self.queue.push_back(item);
    }

    pub fn get(&mut self) -> Option<u32> {
        let item = self.queue.pop_front()?;
        self.processing[item as usize] = true;
        self.dirty[item as usize] = false;
        Some(item)
    }

    pub fn done(&mut self, item: u32) {
        let i = item as usize;
        self.processing[i] = false;
        if self.dirty[i] {
            self.queue.push_back(item);
        }
    }

    pub fn forget(&mut self, item: u32) {
        self.failures[item as usize] = 0;
    }

    /// AddRateLimited: the delay after which the caller must `add` the item, or None when
    /// an earlier AddAfter of the same item is already pending.
    pub fn add_rate_limited(&mut self, item: u32, now: Millis) -> Option<Millis> {
        let i = item as usize;
        let exp = item_backoff(self.base, self.max, self.failures[i]);
        self.failures[i] = self.failures[i].saturating_add(1);
        let delay = exp.max(self.bucket.reserve(now));
        let at = now + delay;
        match self.waiting[i] {
            Some(pending) if pending <= at => None,
            _ => {
                self.waiting[i] = Some(at);
                Some(at)
            }
        }
    }

    /// The delaying queue fired for `item` at `at`; true when that is still current.
    pub fn fire(&mut self, item: u32, at: Millis) -> bool {
        let i = item as usize;
        if self.waiting[i] == Some(at) {
            self.waiting[i] = None;
            true
        } else {
            false
        }
    }

    pub fn failures(&self, item: u32) -> u32 {
        self.failures[item as usize]
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

// ---------------------------------------------------------------------------------------
// Round-robin across namespaces, FIFO within one: both releasers' order.

#[derive(Debug, Default)]
pub struct FairQueue {
    lanes: HashMap<u32, VecDeque<u32>>,
    ring: VecDeque<u32>,
    len: usize,
}

impl FairQueue {
    pub fn push(&mut self, namespace: u32, item: u32) {
        let lane = self.lanes.entry(namespace).or_default();
        if lane.is_empty() {
            self.ring.push_back(namespace);
        }
        lane.push_back(item);
        self.len += 1;
    }

    /// The next namespace's oldest item, without taking it.
    pub fn peek(&self) -> Option<(u32, u32)> {
        let ns = *self.ring.front()?;
        let item = *self.lanes.get(&ns)?.front()?;
        Some((ns, item))
    }

    /// Takes the front namespace's oldest item; its namespace goes to the back of the ring.
    pub fn pop(&mut self) -> Option<(u32, u32)> {
        let ns = self.ring.pop_front()?;
        let lane = self.lanes.get_mut(&ns)?;
        let item = lane.pop_front()?;
        if lane.is_empty() {
            self.lanes.remove(&ns);
        } else {
            self.ring.push_back(ns);
        }
        self.len -= 1;
        Some((ns, item))
    }

    /// Moves the front namespace to the back without serving it (its head does not fit).
    pub fn skip(&mut self) {
        if let Some(ns) = self.ring.pop_front() {
            self.ring.push_back(ns);
        }
    }

    pub fn namespaces(&self) -> usize {
        self.ring.len()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

// ---------------------------------------------------------------------------------------
// Requests the modelled controllers send, built the way `classify` builds them.

pub fn pod_delete_request(
    namespace: &str,
    name: &str,
    user: &str,
    controller_kind: &str,
    controller_uid: &str,
) -> ChurnRequest {
    let mut churn = base_request(
        ChurnKind::PodDelete,
        namespace,
        name,
        user,
        Identity::Exact(format!("pod-delete:{namespace}/{name}")),
    );
    churn.controller_kind = Some(controller_kind.to_string());
    churn.controller_uid = Some(controller_uid.to_string());
    churn
}

/// `name` is empty for a ReplicaSet pod as the mutating webhook sees it.
pub fn pod_create_request(
    namespace: &str,
    name: &str,
    generate_name: &str,
    user: &str,
    controller_kind: &str,
    controller_uid: &str,
) -> ChurnRequest {
    let identity = if !name.is_empty() {
        Identity::Exact(format!("pod-create:{namespace}/{name}"))
    } else {
        Identity::Pool(format!(
            "pod-create:{namespace}/{controller_uid}/{generate_name}"
        ))
    };
    let mut churn = base_request(ChurnKind::PodCreate, namespace, name, user, identity);
    churn.controller_kind = Some(controller_kind.to_string());
    churn.controller_uid = Some(controller_uid.to_string());
    churn
}

/// A StatefulSet UPDATE of a RollingUpdate set with `replicas`, whose template is
/// settled (`template_changed` false) or new, writing `partition` (None: no
/// rollingUpdate block), with churn-throttler's annotations as given.
pub struct StsUpdate<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub user: &'a str,
    pub replicas: u32,
    pub template_changed: bool,
    pub old_partition: Option<u32>,
    pub new_partition: Option<u32>,
    pub update_pending: bool,
    pub old_target: Option<u32>,
    pub new_target: Option<u32>,
    pub new_held: Option<u32>,
}

pub fn statefulset_update_request(u: &StsUpdate<'_>) -> ChurnRequest {
    let mut churn = base_request(
        ChurnKind::StatefulSetUpdate,
        u.namespace,
        u.name,
        u.user,
        Identity::Exact(format!("statefulset:{}", u.uid)),
    );
    churn.controller_uid = Some(u.uid.to_string());
    let old_partition = u.old_partition.unwrap_or(0).min(u.replicas);
    let new_partition = u.new_partition.unwrap_or(0).min(u.replicas);
    churn.cost = if u.template_changed {
        u.replicas - new_partition
    } else if u.update_pending {
        old_partition.saturating_sub(new_partition)
    } else {
        0
    };
    let has_annotations = u.new_target.is_some() || u.new_held.is_some();
    churn.has_annotations = has_annotations;
    churn.statefulset = Some(StatefulSetChange {
        uid: u.uid.to_string(),
        rolling_update: true,
        template_changed: u.template_changed,
        replicas: u.replicas,
        old_partition,
        new_partition,
        written_partition: u.new_partition,
        has_rolling_update_block: u.new_partition.is_some(),
        old_target: u.old_target,
        new_target_annotation: u.new_target.map(|t| t.to_string()),
        new_held_annotation: u.new_held,
        new_paced_by: None,
        has_held_since: false,
        has_annotations,
        update_pending: u.update_pending,
    });
    churn
}

fn base_request(
    kind: ChurnKind,
    namespace: &str,
    name: &str,
    user: &str,
    identity: Identity,
) -> ChurnRequest {
    ChurnRequest {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
        user: user.to_string(),
        groups: Vec::new(),
        controller_kind: None,
        controller_uid: None,
        priority_class: None,
        labels: BTreeMap::new(),
        identity,
        cost: 1,
        dry_run: false,
        node_name_set: false,
        scheduling_gates: Vec::new(),
        has_annotations: false,
        has_labels: false,
        statefulset: None,
    }
}

// ---------------------------------------------------------------------------------------
// The StatefulSet controller's choice.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StsWrite {
    Create(u32),
    Delete(u32),
}

/// One sync of the StatefulSet controller, OrderedReady + RollingUpdate (v1.36 without
/// the MaxUnavailableStatefulSet gate, which is off by default): create the lowest
/// missing ordinal; wait while any pod is terminating or not Ready; else delete the
/// highest out-of-date ordinal at or above the partition. `pod(o)` = (phase, updated).
/// At most one write per sync, as the controller returns after each with OrderedReady.
pub fn statefulset_next(
    replicas: u32,
    partition: u32,
    pod: impl Fn(u32) -> (Phase, bool),
) -> Option<StsWrite> {
    for o in 0..replicas {
        match pod(o).0 {
            Phase::Absent => return Some(StsWrite::Create(o)),
            Phase::Terminating | Phase::Gated | Phase::Starting => return None,
            Phase::Ready => {}
        }
    }
    for o in (partition.min(replicas)..replicas).rev() {
        let (phase, updated) = pod(o);
        if !updated && phase != Phase::Terminating {
            return Some(StsWrite::Delete(o));
        }
        if phase != Phase::Ready {
            return None;
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// The cluster.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Absent,
    /// Created behind churn-throttler's scheduling gate.
    Gated,
    /// Scheduled, not Ready yet.
    Starting,
    Ready,
    Terminating,
}

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
}

const UNLABELLED_NAMESPACE: &str = "unthrottled";

/// How long after a step's DELETE the real partition releaser sees it: its look again at
/// a step in flight (RECHECK_IN_FLIGHT_MS of releaser/partition.rs), at the latest.
const DELETION_SEEN_AFTER: Millis = 250;

impl<'a> Sim<'a> {
    pub fn new(sc: &'a Scenario, action: SimAction) -> Result<Sim<'a>, String> {
        let policy = sc.policy(action)?;
        let limiter = Limiter::new(policy.max_buckets);
        let mut namespaces: Vec<String> = (0..sc.namespaces)
            .map(|i| format!("tenant-{i:05}"))
            .collect();
        let unlabelled = namespaces.len() as u32;
        namespaces.push(UNLABELLED_NAMESPACE.to_string());

        let mut sets = Vec::new();
        let mut pods = Vec::new();
        let mut add_sts = |namespace: u32, name: String, replicas: u32, throttled: bool| {
            let first_pod = pods.len() as u32;
            for ordinal in 0..replicas {
                pods.push(Pod {
                    owner: Owner::Sts(sets.len() as u32),
                    ordinal,
                    phase: Phase::Ready,
                    updated: false,
                    generation: 0,
                    down_since: None,
                    gate_pending: None,
                    step_pending: false,
                    created_at: 0,
                    deleted_at: 0,
                });
            }
            sets.push(Sts {
                namespace,
                uid: format!("uid-sts-{}", sets.len()),
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
        };
        for i in 0..sc.statefulsets {
            add_sts(i % sc.namespaces, format!("mysql-{i}"), sc.replicas, true);
        }
        let collateral_sts = if sc.collateral {
            let index = sc.statefulsets;
            add_sts(
                unlabelled,
                "unthrottled".into(),
                sc.collateral_replicas,
                false,
            );
            Some(index)
        } else {
            None
        };
        let mut deps = Vec::new();
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
                dep.pods.push(pods.len() as u32);
                pods.push(Pod {
                    owner: Owner::Dep(i),
                    ordinal,
                    phase: Phase::Ready,
                    updated: false,
                    generation: 0,
                    down_since: None,
                    gate_pending: None,
                    step_pending: false,
                    created_at: 0,
                    deleted_at: 0,
                });
            }
            deps.push(dep);
        }
        let controller = |items: usize, workers: u32| Controller {
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
                })
                .collect(),
            idle: (0..workers as u16).rev().collect(),
            client: TokenBucket::new(sc.client_qps, sc.client_burst),
        };
        let ctrls = [
            controller(sets.len(), sc.workers),
            controller(deps.len(), sc.deployment_workers),
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
        let remaining = sc.statefulsets as u64 + sc.deployments as u64;
        let out = RunResult {
            action: Some(action),
            workloads: remaining,
            collateral_enabled: sc.collateral,
            ..RunResult::default()
        };
        Ok(Sim {
            sc,
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
        }
    }

    // --- the webhook ---------------------------------------------------------------------

    fn opted_in(&self, namespace: &str) -> bool {
        namespace != UNLABELLED_NAMESPACE
    }

    /// Both webhooks, mutating then validating, as the API server calls them.
    /// `validating_name`: a ReplicaSet pod's generated name, which only the validating
    /// webhook sees.
    fn admit(
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
            };
        }
        let now = self.now;
        let mutate = decide_churn(
            churn,
            Endpoint::Mutate,
            &self.policy,
            &mut self.limiter,
            now,
        );
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
        }
    }

    fn refusal(&mut self, verdict: &Verdict) -> Option<Admission> {
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

    fn charged(&mut self, rule: &Option<Arc<str>>, at: Millis) {
        if let Some(rule) = rule {
            self.out
                .charges
                .entry(rule.to_string())
                .or_default()
                .push(at);
        }
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
                if let (Some(down), true) = (down, throttled) {
                    self.out.outages.push(now - down);
                }
                if step {
                    self.step_ready(s);
                }
                self.check_sts_done(s);
            }
            Owner::Dep(d) => self.check_dep_done(d),
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

    /// Idle workers take items off the queue: processNextWorkItem.
    fn dispatch(&mut self, ctrl: Ctrl) {
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
    fn sync_sts(&self, s: u32) -> Option<Req> {
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
    fn sync_dep(&mut self, d: u32) -> Option<Req> {
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
    fn request_for(&self, req: Req) -> ChurnRequest {
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
    fn send(&mut self, ctrl: Ctrl, w: u16, throttled: bool) {
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
            Admission::Allowed { at, .. } => {
                worker.ok = true;
                worker.gate = gate;
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
    fn complete(&mut self, ctrl: Ctrl, w: u16) {
        let now = self.now;
        let worker = self.ctrls[ctrl as usize].workers[w as usize].clone();
        if worker.ok {
            if let Some(req) = worker.req {
                self.apply(req, worker.gate);
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

    fn throttled_pod(&self, pod: u32) -> bool {
        match self.pods[pod as usize].owner {
            Owner::Sts(s) => self.sets[s as usize].throttled,
            Owner::Dep(_) => true,
        }
    }

    /// The write took effect in the API server; the informers see it at once.
    fn apply(&mut self, req: Req, gate: Option<usize>) {
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
                });
                self.created(p, gate);
            }
        }
    }

    fn created(&mut self, p: u32, gate: Option<usize>) {
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
            None => self.start(p),
        }
        self.enqueue_owner(p);
    }

    /// The pod is scheduled: the kubelet makes it Ready after the start delay.
    fn start(&mut self, p: u32) {
        let now = self.now;
        let pod = &mut self.pods[p as usize];
        pod.phase = Phase::Starting;
        let generation = pod.generation;
        if self.throttled_pod(p) {
            self.out.starts.push(now);
        }
        let ready = now + self.delay(p, generation, 2, self.sc.start);
        self.at(ready, Ev::PodReady { pod: p, generation });
    }

    // --- the gate releaser ------------------------------------------------------------------

    fn wake_gate(&mut self, g: usize, at: Millis) {
        let state = &mut self.gates[g];
        if state.next_wake.is_some_and(|w| w <= at && w >= self.now) {
            return;
        }
        state.next_wake = Some(at);
        self.at(at, Ev::GateWake(g as u16));
    }

    /// Releases gated pods at the rule's rate: round-robin across namespaces, oldest first,
    /// while the rule's released-but-not-Ready pods stay under maxNotReady.
    fn run_gate(&mut self, g: usize) {
        if self.sc.real_releasers {
            self.run_gate_real(g);
            return;
        }
        let now = self.now;
        let rule = self.policy.rules[self.gates[g].rule].clone();
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
            let pod = &mut self.pods[p as usize];
            pod.gate_pending = Some(g);
            let generation = pod.generation;
            self.at(
                now + self.sc.api_latency,
                Ev::Ungated { pod: p, generation },
            );
        }
    }

    fn pod_owner_uid(&self, p: u32) -> &str {
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

    // --- the partition releaser -------------------------------------------------------------

    fn wake_partition(&mut self, at: Millis) {
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
    fn step_took_effect(&mut self, pod: u32) {
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
    fn step_ready(&mut self, s: u32) {
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
    fn run_partition(&mut self) {
        if self.sc.real_releasers {
            self.run_partition_real();
            return;
        }
        let now = self.now;
        let Some(rule_index) = self.partition.as_ref().map(|p| p.rule) else {
            return;
        };
        let rule = self.policy.rules[rule_index].clone();
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
                if rule.limits.iter().any(|l| flying >= l.events) {
                    // Full of steps in flight: the next re-creation wakes the releaser.
                    if global {
                        break;
                    }
                    if let Some(state) = self.partition.as_mut() {
                        state.queue.skip();
                    }
                    continue;
                }
                let at = self.limiter.earliest(
                    &rule.name,
                    &rule.limits,
                    &self.namespaces[ns as usize],
                    Some(&self.sets[s as usize].uid),
                    flying + 1,
                    now,
                );
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
            if let Some(state) = self.partition.as_mut() {
                state.queue.pop();
            }
            self.step(ns, s);
        }
    }

    fn step(&mut self, ns: u32, s: u32) {
        let new = self.sets[s as usize].partition - 1;
        self.step_to(ns, s, new, true, true);
    }

    /// Model releaser: a step is in flight until its pod is re-created.
    fn step_in_flight(&mut self, ns: u32) {
        if let Some(state) = self.partition.as_mut() {
            *state.in_flight.entry(ns).or_insert(0) += 1;
        }
    }

    /// The releaser's partition UPDATE; `model`: the model releaser's step, in flight
    /// until its pod is re-created (the real plan keeps its own windows); `rate`: a paced
    /// step (not a free move to the target).
    fn step_to(&mut self, ns: u32, s: u32, new: u32, model: bool, rate: bool) {
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

    /// One round of `releaser::plan::plan` over the gated pods, as the releaser sees them.
    fn run_gate_real(&mut self, g: usize) {
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

    /// One round of `releaser::partition_plan::plan_steps` over the held sets.
    fn run_partition_real(&mut self) {
        let now = self.now;
        let Some(state) = self.partition.as_ref() else {
            return;
        };
        let rule = self.policy.rules[state.rule].clone();
        let ids = state.held.clone();
        let held: Vec<HeldSet> = ids
            .iter()
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
                    rule: rule.name.to_string(),
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
            .collect();
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

fn churn_generate_name(churn: &ChurnRequest) -> String {
    match &churn.identity {
        Identity::Pool(id) => id.rsplit('/').next().unwrap_or_default().to_string(),
        Identity::Exact(_) => String::new(),
    }
}

enum Admission {
    Allowed {
        at: Millis,
        gated: Option<Arc<str>>,
        partition: Option<(u32, u32)>,
    },
    RetryAfter {
        seconds: u32,
        slot: Option<Millis>,
    },
    Denied,
}
