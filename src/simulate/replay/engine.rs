//! The paced run: the recorded events replayed through the pure admission decision, the
//! releasers' own plans (gate releases, partition steps) and the limiter, at their
//! recorded times, with StatefulSet rollouts and ReplicaSet surges re-simulated where a
//! delay changes what comes next.

use super::attribute::{Controller, Kind, PodEvent, REPLICASET_CONTROLLER, STATEFULSET_CONTROLLER};
use crate::admission::classify::{self, ChurnRequest};
use crate::admission::decide::decide_churn;
use crate::admission::{Endpoint, Verdict};
use crate::limiter::{Identity, Limiter, Millis};
use crate::pacing::gate::{
    longest_window, plan, Cursor, Inputs, QueuedPod, MAX_RELEASES_PER_ROUND,
};
use crate::pacing::network::{NetworkRoom, NetworkWindow, Sample};
use crate::pacing::partition::{
    plan_steps, HeldSet, Move, Record, Released, StepInputs, TakenStep,
};
use crate::policy::{ChurnKind, Policy};
use crate::simulate::requests::{base_request, statefulset_update_request, StsUpdate};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

/// A request refused without a retry hint (deny) is retried by its controller after this
/// long at the earliest (client-go's work queue backoff grows from 5 ms; the decision's
/// own wait is used when longer).
const DENY_RETRY_MS: Millis = 1_000;
/// Retries of one refused request at most (bounds the loop on a policy that never admits).
const MAX_RETRIES: u32 = 100;

/// How a workload was replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Treatment {
    /// StatefulSet rollout, OrderedReady: `<set>-<n>` re-created after its predecessor.
    Resimulated,
    /// ReplicaSet pods of a surge rollout: each old pod deleted after its new pod started.
    Surge,
    /// Every request at its recorded time (only the decision moves it).
    Shifted,
}

impl Treatment {
    pub fn as_str(self) -> &'static str {
        match self {
            Treatment::Resimulated => "re-simulated (StatefulSet, OrderedReady)",
            Treatment::Surge => "re-simulated (ReplicaSet surge: delete after the new pod started)",
            Treatment::Shifted => "shifted in time as recorded",
        }
    }
}

/// Measured delays of a re-simulated StatefulSet (medians over its recorded rollout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetDelays {
    /// Write -> first DELETE: the controller's reaction.
    pub reaction: Millis,
    /// DELETE -> re-CREATE of the same ordinal: termination.
    pub terminate: Millis,
    /// CREATE -> binding: scheduling.
    pub schedule: Millis,
    /// binding -> Ready, as binding -> the next ordinal's DELETE less the reaction.
    pub ready: Millis,
}

/// One StatefulSet rollout to re-simulate.
#[derive(Debug, Clone)]
struct SetRollout {
    namespace: String,
    name: String,
    /// Ordinals in the order the recorded rollout deleted them.
    ordinals: Vec<u32>,
    replicas: u32,
    start: Millis,
    delays: SetDelays,
    /// Indices of the recorded events the re-simulation replaces.
    replaced: Vec<usize>,
}

/// What the paced run produced.
#[derive(Debug, Clone, Default)]
pub struct Paced {
    pub times: BTreeMap<Kind, Vec<Millis>>,
    /// The same, per controller of the pods (each rule matches its own controllers).
    pub by_controller: BTreeMap<(Kind, Controller), Vec<Millis>>,
    /// Per namespace: delays (paced - recorded) of the events both runs have.
    pub delays: BTreeMap<String, Vec<Millis>>,
    /// (rule, verdict) -> decisions; releases and steps under (rule, "release"/"step").
    pub rules: BTreeMap<(String, String), u64>,
    pub workloads: BTreeMap<Treatment, Vec<String>>,
    pub set_delays: Vec<(String, SetDelays)>,
    /// The recorded rollouts' steps, inferred: each ordinal the StatefulSet controller
    /// deleted after a write to its set (Metadata level has no partition to read).
    pub inferred_steps: Vec<Millis>,
    /// Requests still refused after MAX_RETRIES (not in the paced run).
    pub gave_up: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// Decide recorded event i (shifted or surge).
    Recorded(usize),
    /// Retry of recorded event i after a refusal.
    Retry(usize, u32),
    /// Set s: the rollout's template write.
    SetWrite(usize),
    /// Set s, not held: the controller deletes its k-th ordinal.
    SetNext(usize, usize),
    /// Set s, held: the controller deletes the ordinal step k released.
    SetDelete(usize, usize),
    /// The partition releaser's next round.
    PartitionWake,
    /// Set s, ordinal k: the replacement pod is created.
    SetCreate(usize, usize),
    /// A gated pod's binding, then its Ready.
    Bound(usize),
    Ready(usize),
    GateWake,
}

/// A held set as the partition releaser sees it: what `plan_steps` reads of it.
#[derive(Debug, Clone)]
struct Hold {
    rule: String,
    since: Millis,
    /// Steps taken: the partition is `replicas - steps`.
    steps: usize,
    /// `partition-stepped-at`, as the plan's moves rewrite it.
    stepped_at: Vec<Millis>,
    /// The pod the last step released.
    released: Released,
    /// Finished or let go: no longer in the plan's inputs.
    done: bool,
}

/// A pod of the paced run that goes through the gate (or is admitted at once).
#[derive(Debug, Clone)]
struct PacedPod {
    controller: Controller,
    namespace: String,
    name: String,
    owner: String,
    rule: Option<String>,
    created: Millis,
    /// Creation -> binding and binding -> Ready.
    schedule: Millis,
    ready: Millis,
    /// The recorded binding (for the delay) and what to do at Ready.
    recorded_bind: Option<Millis>,
    then: After,
    /// Released by an adaptive rule at this time, network not up yet.
    net_since: Option<Millis>,
}

#[derive(Debug, Clone, Copy)]
enum After {
    Nothing,
    /// Set s's ordinal k is Ready.
    SetReady(usize, usize),
    /// The surge deletion (recorded event index) paired with this pod, and its recorded
    /// gap after the pod's binding.
    SurgeDelete(usize, Millis),
}

pub struct Engine<'a> {
    policy: &'a Policy,
    opt_in: &'a [String],
    events: &'a [PodEvent],
    limiter: Limiter,
    heap: BinaryHeap<Reverse<(Millis, u64, Ev)>>,
    seq: u64,
    sets: Vec<SetRollout>,
    /// Per set: its hold, while the webhook holds it and the partition releaser steps
    /// it down (None: not held, the controller rolls it by itself).
    holds: Vec<Option<Hold>>,
    /// What the partition plan reads besides the held sets: the steps taken (for the
    /// spacing) and the records of sets let go (their step times stay in the windows).
    taken: Vec<TakenStep>,
    records: Vec<Record>,
    partition_wake: Option<Millis>,
    /// The controller's reaction to a step: the fastest measured (write -> first DELETE)
    /// of the re-simulated sets. A mass update queues every set in the controller at once
    /// (measured: up to 2.4 s for the last of 24), steps reach it one set at a time.
    step_reaction: Millis,
    /// The adaptive rules' shared network window (None: no adaptive rule), from its start
    /// (`INITIAL_WINDOW` within the policy's bounds), growing by slow start with every
    /// pod's network up at its binding (an audit log has no network times; the replay
    /// assumes a network that keeps up, where the real window grows the same way: it
    /// left paced StatefulSet steps waiting behind 60 gated pods on the e2e control plane
    /// only while the window was small).
    net: Option<NetworkWindow>,
    /// Pods an adaptive rule released that are not Ready yet.
    net_in_flight: u32,
    pods: Vec<PacedPod>,
    queue: Vec<usize>,
    not_ready: HashMap<String, u32>,
    cursor: Cursor,
    wake: Option<Millis>,
    /// Recorded binding time per (namespace, pod).
    binds: HashMap<(&'a str, &'a str), Millis>,
    /// Recorded event index -> the pod it paired with (surge deletions wait for it).
    surge_of: HashMap<usize, usize>,
    /// The reverse: creation index -> its paired deletion.
    surge_delete: HashMap<usize, usize>,
    /// Pods whose creation is in the log: their bindings follow the paced creation.
    created: HashSet<(&'a str, &'a str)>,
    out: Paced,
}

fn median(mut v: Vec<Millis>) -> Option<Millis> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[(v.len() - 1) / 2])
}

impl<'a> Engine<'a> {
    pub fn new(
        policy: &'a Policy,
        opt_in: &'a [String],
        events: &'a [PodEvent],
        sts_writes: &BTreeMap<(String, String), Vec<Millis>>,
    ) -> Engine<'a> {
        let mut binds = HashMap::new();
        let mut created = HashSet::new();
        for e in events {
            if e.kind == Kind::Creations && !e.name.is_empty() {
                created.insert((e.namespace.as_str(), e.name.as_str()));
            }
            if e.kind == Kind::Starts {
                binds
                    .entry((e.namespace.as_str(), e.name.as_str()))
                    .or_insert(e.at);
            }
        }
        let mut engine = Engine {
            policy,
            opt_in,
            events,
            limiter: Limiter::new(policy.max_buckets),
            heap: BinaryHeap::new(),
            seq: 0,
            sets: Vec::new(),
            holds: Vec::new(),
            taken: Vec::new(),
            records: Vec::new(),
            partition_wake: None,
            step_reaction: 0,
            net: policy.network.map(|c| NetworkWindow::new(c, None)),
            net_in_flight: 0,
            pods: Vec::new(),
            queue: Vec::new(),
            not_ready: HashMap::new(),
            cursor: Cursor::default(),
            wake: None,
            binds,
            surge_of: HashMap::new(),
            surge_delete: HashMap::new(),
            created,
            out: Paced::default(),
        };
        engine.find_sets(sts_writes);
        engine.step_reaction = engine
            .sets
            .iter()
            .map(|s| s.delays.reaction)
            .min()
            .unwrap_or(0);
        engine.find_surges();
        engine
    }

    fn at(&mut self, t: Millis, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    fn opted_in(&self, namespace: &str) -> bool {
        self.opt_in.is_empty() || self.opt_in.iter().any(|n| n == namespace)
    }

    /// StatefulSet rollouts: a write to the set, then the StatefulSet controller deleting
    /// and re-creating `<set>-<n>` one ordinal at a time.
    fn find_sets(&mut self, sts_writes: &BTreeMap<(String, String), Vec<Millis>>) {
        // (namespace, set) -> event indices of its controller's pods, in order.
        let mut by_set: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
        for (i, e) in self.events.iter().enumerate() {
            if let Some((set, _)) = &e.set {
                if e.kind != Kind::PartitionSteps {
                    by_set.entry((&e.namespace, set)).or_default().push(i);
                }
            }
        }
        for ((ns, set), all) in by_set {
            let writes = sts_writes
                .get(&(ns.to_string(), set.to_string()))
                .cloned()
                .unwrap_or_default();
            // One rollout per write: a set rolled twice in the log is re-simulated twice.
            let mut rollouts: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for &i in &all {
                let at = self.events[i].at;
                rollouts
                    .entry(writes.partition_point(|&w| w <= at))
                    .or_default()
                    .push(i);
            }
            let several = rollouts.len() > 1;
            for (nth, idx) in rollouts.into_values().enumerate() {
                let name = match several {
                    true => format!("{ns}/statefulset/{set} (rollout {})", nth + 1),
                    false => format!("{ns}/statefulset/{set}"),
                };
                self.find_rollout(ns, set, name, &writes, &idx);
            }
        }
    }

    /// One rollout of a set: its ordinals in the order deleted, the delays measured.
    fn find_rollout(
        &mut self,
        ns: &str,
        set: &str,
        name: String,
        writes: &[Millis],
        idx: &[usize],
    ) {
        {
            let mut ordinals = Vec::new();
            let (mut deleted, mut created, mut bound) =
                (HashMap::new(), HashMap::new(), HashMap::new());
            let mut replaced = Vec::new();
            let mut max_ordinal = 0;
            for &i in idx {
                let e = &self.events[i];
                let Some((_, o)) = e.set else { continue };
                max_ordinal = max_ordinal.max(o);
                match e.kind {
                    Kind::Deletions
                        if e.user == STATEFULSET_CONTROLLER && !deleted.contains_key(&o) =>
                    {
                        ordinals.push(o);
                        deleted.insert(o, e.at);
                        replaced.push(i);
                    }
                    Kind::Creations if deleted.contains_key(&o) && !created.contains_key(&o) => {
                        created.insert(o, e.at);
                        replaced.push(i);
                    }
                    Kind::Starts if created.contains_key(&o) && !bound.contains_key(&o) => {
                        bound.insert(o, e.at);
                        replaced.push(i);
                    }
                    _ => {}
                }
            }
            if ordinals.is_empty() {
                return;
            }
            if !writes.is_empty() {
                self.out.inferred_steps.extend(deleted.values().copied());
            }
            let first_delete = deleted[&ordinals[0]];
            let start = writes
                .iter()
                .rev()
                .find(|&&w| w <= first_delete)
                .copied()
                .unwrap_or(first_delete);
            let pair = |a: &HashMap<u32, Millis>, b: &HashMap<u32, Millis>| {
                ordinals
                    .iter()
                    .filter_map(|o| Some(b.get(o)?.saturating_sub(*a.get(o)?)))
                    .collect::<Vec<_>>()
            };
            let reaction = first_delete - start;
            let next_gaps: Vec<Millis> = ordinals
                .windows(2)
                .filter_map(|w| Some(deleted.get(&w[1])?.saturating_sub(*bound.get(&w[0])?)))
                .collect();
            let delays = SetDelays {
                reaction,
                terminate: median(pair(&deleted, &created)).unwrap_or(0),
                schedule: median(pair(&created, &bound)).unwrap_or(0),
                ready: median(next_gaps).unwrap_or(0).saturating_sub(reaction),
            };
            self.out.set_delays.push((name.clone(), delays));
            self.out
                .workloads
                .entry(Treatment::Resimulated)
                .or_default()
                .push(name);
            self.sets.push(SetRollout {
                namespace: ns.to_string(),
                name: set.to_string(),
                ordinals,
                replicas: max_ordinal + 1,
                start,
                delays,
                replaced,
            });
        }
    }

    /// ReplicaSet surges: per namespace, the k-th replicaset-controller deletion after the
    /// k-th replicaset-controller creation's binding is paired with it.
    fn find_surges(&mut self) {
        let mut creates: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        let mut deletes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, e) in self.events.iter().enumerate() {
            if e.user != REPLICASET_CONTROLLER {
                continue;
            }
            match e.kind {
                Kind::Creations if !e.name.is_empty() => {
                    creates.entry(&e.namespace).or_default().push(i)
                }
                Kind::Deletions => deletes.entry(&e.namespace).or_default().push(i),
                _ => {}
            }
        }
        for (ns, dels) in deletes {
            let Some(cs) = creates.get(ns) else { continue };
            let mut paired = 0;
            for (&d, &c) in dels.iter().zip(cs) {
                let c_ev = &self.events[c];
                let bind = self
                    .binds
                    .get(&(c_ev.namespace.as_str(), c_ev.name.as_str()));
                if bind.is_some_and(|&b| b <= self.events[d].at) {
                    self.surge_of.insert(d, c);
                    self.surge_delete.insert(c, d);
                    paired += 1;
                }
            }
            if paired > 0 {
                self.out
                    .workloads
                    .entry(Treatment::Surge)
                    .or_default()
                    .push(format!("{ns}/replicaset pods ({paired} old pods paired)"));
            }
        }
    }

    pub fn run(mut self) -> Paced {
        let mut replaced = vec![false; self.events.len()];
        for s in &self.sets {
            for &i in &s.replaced {
                replaced[i] = true;
            }
        }
        let mut shifted: BTreeMap<String, ()> = BTreeMap::new();
        for (i, e) in self.events.iter().enumerate() {
            if replaced[i] {
                continue;
            }
            if self.surge_of.contains_key(&i) {
                // Scheduled when its paired new pod is Ready.
                continue;
            }
            if e.kind != Kind::Starts || !self.binds_are_paced(e) {
                shifted.insert(format!("{}/{}", e.namespace, workload_name(e)), ());
            }
            self.seq += 1;
            self.heap.push(Reverse((e.at, self.seq, Ev::Recorded(i))));
        }
        self.out
            .workloads
            .insert(Treatment::Shifted, shifted.into_keys().collect());
        for s in 0..self.sets.len() {
            self.holds.push(None);
            self.at(self.sets[s].start, Ev::SetWrite(s));
        }
        let mut guard: u64 = 0;
        let bound = 64 * (self.events.len() as u64 + 16) * u64::from(MAX_RETRIES);
        while let Some(Reverse((now, _, ev))) = self.heap.pop() {
            guard += 1;
            if guard > bound {
                break;
            }
            self.handle(now, ev);
        }
        for v in self.out.times.values_mut() {
            v.sort_unstable();
        }
        for v in self.out.by_controller.values_mut() {
            v.sort_unstable();
        }
        self.out
    }

    /// A binding whose creation the paced run releases (it is replayed from the release).
    fn binds_are_paced(&self, e: &PodEvent) -> bool {
        self.created
            .contains(&(e.namespace.as_str(), e.name.as_str()))
    }

    fn emit(
        &mut self,
        (kind, controller): (Kind, Controller),
        t: Millis,
        namespace: &str,
        recorded: Option<Millis>,
    ) {
        self.out.times.entry(kind).or_default().push(t);
        self.out
            .by_controller
            .entry((kind, controller))
            .or_default()
            .push(t);
        if let Some(r) = recorded {
            self.out
                .delays
                .entry(namespace.to_string())
                .or_default()
                .push(t.saturating_sub(r));
        }
    }

    fn fired(&mut self, rule: Option<&str>, what: &str) {
        if let Some(rule) = rule {
            *self
                .out
                .rules
                .entry((rule.to_string(), what.to_string()))
                .or_default() += 1;
        }
    }

    fn handle(&mut self, now: Millis, ev: Ev) {
        match ev {
            Ev::Recorded(i) => self.recorded(now, i, 0),
            Ev::Retry(i, n) => self.recorded(now, i, n),
            Ev::SetWrite(s) => self.set_write(now, s),
            Ev::SetNext(s, k) => self.set_next(now, s, k),
            Ev::SetDelete(s, k) => self.set_delete(now, s, k),
            Ev::PartitionWake => {
                if self.partition_wake == Some(now) {
                    self.partition_wake = None;
                }
                self.partition_round(now);
            }
            Ev::SetCreate(s, k) => self.set_create(now, s, k),
            Ev::Bound(p) => {
                self.network_ready(now, p);
                let pod = &self.pods[p];
                let (ns, rec, ready) = (pod.namespace.clone(), pod.recorded_bind, pod.ready);
                let controller = pod.controller;
                self.emit((Kind::Starts, controller), now, &ns, rec);
                self.at(now + ready, Ev::Ready(p));
            }
            Ev::Ready(p) => {
                self.network_ready(now, p);
                if let Some(rule) = self.pods[p].rule.clone() {
                    if let Some(n) = self.not_ready.get_mut(&rule) {
                        *n = n.saturating_sub(1);
                    }
                    self.gate_round(now);
                }
                match self.pods[p].then {
                    After::Nothing => {}
                    After::SetReady(s, k) => self.set_ready(now, s, k),
                    After::SurgeDelete(i, gap) => {
                        let t = (now + gap).max(self.events[i].at);
                        self.at(t, Ev::Recorded(i));
                    }
                }
            }
            Ev::GateWake => {
                if self.wake == Some(now) {
                    self.wake = None;
                }
                self.gate_round(now);
            }
        }
    }

    // --- recorded requests, decided at their time --------------------------------------

    fn recorded(&mut self, now: Millis, i: usize, tries: u32) {
        let e = &self.events[i];
        let recorded = Some(e.at);
        match e.kind {
            Kind::Starts => {
                // A binding of a pod whose creation is not replayed: as recorded.
                if !self.binds_are_paced(e) {
                    let (ns, controller) = (e.namespace.clone(), e.controller);
                    self.emit((Kind::Starts, controller), now, &ns, recorded);
                }
            }
            Kind::Creations => {
                let ns = e.namespace.clone();
                let schedule = self
                    .binds
                    .get(&(e.namespace.as_str(), e.name.as_str()))
                    .map(|b| b.saturating_sub(e.at));
                let bind = schedule.map(|s| e.at + s);
                let churn = self.create_request(e);
                let then = self
                    .surge_delete
                    .get(&i)
                    .map(|&d| {
                        let gap = self.events[d].at.saturating_sub(bind.unwrap_or(e.at));
                        After::SurgeDelete(d, gap)
                    })
                    .unwrap_or(After::Nothing);
                self.create(now, i, churn, ns, schedule, 0, bind, then, tries);
            }
            Kind::Deletions | Kind::Evictions | Kind::PartitionSteps => {
                let churn = self.other_request(e);
                if let Some(t) = self.decide_at(now, i, &churn, Endpoint::Validate, tries) {
                    let (kind, ns) = ((e.kind, e.controller), e.namespace.clone());
                    self.emit(kind, t, &ns, recorded);
                }
            }
        }
    }

    /// Validating decision of a recorded request at `now`: when it takes effect, or None
    /// when it was refused (a retry is scheduled).
    fn decide_at(
        &mut self,
        now: Millis,
        i: usize,
        churn: &ChurnRequest,
        endpoint: Endpoint,
        tries: u32,
    ) -> Option<Millis> {
        if !self.opted_in(&churn.namespace) {
            return Some(now);
        }
        let d = decide_churn(churn, endpoint, self.policy, &mut self.limiter, now);
        self.fired(d.rule.as_deref(), d.verdict.label());
        match d.verdict {
            Verdict::Hold { until } => Some(until.max(now)),
            // client-go sleeps Retry-After and asks again: a reserved slot is claimed
            // then, a refusal beyond the rule's reach (nothing reserved) is decided anew.
            // Taking effect at the slot without asking again let refused requests through
            // in bursts over the limit (31 ReplicaSet deletions in 10 s under 20).
            Verdict::RetryAfter { slot, .. } if i < self.events.len() => {
                if tries >= MAX_RETRIES {
                    self.out.gave_up += 1;
                } else {
                    self.at(slot.max(now + 1), Ev::Retry(i, tries + 1));
                }
                None
            }
            Verdict::RetryAfter { slot, .. } => Some(slot.max(now)),
            Verdict::Deny { wait_ms } => {
                if tries >= MAX_RETRIES {
                    self.out.gave_up += 1;
                } else {
                    self.at(now + wait_ms.max(DENY_RETRY_MS), Ev::Retry(i, tries + 1));
                }
                None
            }
            _ => Some(now),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        now: Millis,
        i: usize,
        churn: ChurnRequest,
        namespace: String,
        schedule: Option<Millis>,
        ready: Millis,
        recorded_bind: Option<Millis>,
        then: After,
        tries: u32,
    ) {
        let recorded = (i < self.events.len()).then(|| self.events[i].at);
        let owner = churn.controller_uid.clone().unwrap_or_default();
        let controller = Controller::from_kind_name(churn.controller_kind.as_deref());
        let created = (Kind::Creations, controller);
        let mut pod = PacedPod {
            controller,
            namespace: namespace.clone(),
            name: churn.name.clone(),
            owner,
            rule: None,
            created: now,
            schedule: schedule.unwrap_or(0),
            ready,
            recorded_bind,
            then,
            net_since: None,
        };
        if !self.opted_in(&namespace) {
            self.emit(created, now, &namespace, recorded);
            self.start_pod(now, pod, schedule.is_some());
            return;
        }
        let mutate = decide_churn(
            &churn,
            Endpoint::Mutate,
            self.policy,
            &mut self.limiter,
            now,
        );
        self.fired(mutate.rule.as_deref(), mutate.verdict.label());
        match mutate.verdict {
            Verdict::Gate { .. } => {
                self.emit(created, now, &namespace, recorded);
                pod.rule = mutate.rule.as_deref().map(str::to_string);
                let p = self.pods.len();
                self.pods.push(pod);
                self.queue.push(p);
                self.gate_round(now);
                return;
            }
            Verdict::AdmitMarked { .. } => {
                pod.rule = mutate.rule.as_deref().map(str::to_string);
                if let Some(rule) = &pod.rule {
                    *self.not_ready.entry(rule.clone()).or_default() += 1;
                }
            }
            Verdict::RetryAfter { .. } | Verdict::Deny { .. } => {
                let wait = match mutate.verdict {
                    Verdict::RetryAfter { slot, .. } => slot.saturating_sub(now),
                    Verdict::Deny { wait_ms } => wait_ms,
                    _ => 0,
                };
                self.retry_create(now + wait.max(DENY_RETRY_MS), i, tries);
                return;
            }
            _ => {}
        }
        let at = match self.decide_at(now, usize::MAX, &churn, Endpoint::Validate, MAX_RETRIES) {
            Some(t) => t,
            None => {
                self.retry_create(now + DENY_RETRY_MS, i, tries);
                return;
            }
        };
        self.emit(created, at, &namespace, recorded);
        self.start_pod(at, pod, schedule.is_some());
    }

    fn retry_create(&mut self, t: Millis, i: usize, tries: u32) {
        if tries >= MAX_RETRIES || i >= self.events.len() {
            self.out.gave_up += 1;
        } else {
            self.at(t, Ev::Retry(i, tries + 1));
        }
    }

    /// An admitted (or released) pod: bound after its scheduling delay.
    fn start_pod(&mut self, now: Millis, pod: PacedPod, bound: bool) {
        let p = self.pods.len();
        let schedule = pod.schedule;
        let set_pod = matches!(pod.then, After::SetReady(..));
        self.pods.push(pod);
        if bound || set_pod {
            self.at(now + schedule, Ev::Bound(p));
        } else {
            self.at(now, Ev::Ready(p));
        }
    }

    fn create_request(&self, e: &PodEvent) -> ChurnRequest {
        let owner = format!("replay:{}/{}", e.namespace, workload_name(e));
        let identity = classify::pod_create_identity(&e.namespace, &e.name, &owner, "");
        let mut churn = base_request(
            ChurnKind::PodCreate,
            &e.namespace,
            &e.name,
            &e.user,
            identity,
        );
        churn.controller_kind = e.controller.kind_name().map(str::to_string);
        churn.controller_uid = Some(owner);
        churn
    }

    fn other_request(&self, e: &PodEvent) -> ChurnRequest {
        match e.kind {
            Kind::Evictions => base_request(
                ChurnKind::Eviction,
                &e.namespace,
                &e.name,
                &e.user,
                Identity::Exact(format!("eviction:{}/{}", e.namespace, e.name)),
            ),
            Kind::PartitionSteps => {
                let o = e.set.as_ref().map(|s| s.1).unwrap_or(0);
                statefulset_update_request(&StsUpdate {
                    namespace: &e.namespace,
                    name: &e.name,
                    uid: &format!("replay:{}/{}", e.namespace, e.name),
                    user: &e.user,
                    replicas: o + 1,
                    template_changed: false,
                    old_partition: Some(o + 1),
                    new_partition: Some(o),
                    update_pending: true,
                    old_target: None,
                    new_target: None,
                    new_held: None,
                })
            }
            _ => {
                let mut churn = base_request(
                    ChurnKind::PodDelete,
                    &e.namespace,
                    &e.name,
                    &e.user,
                    classify::pod_delete_identity(&e.namespace, &e.name),
                );
                churn.controller_kind = e.controller.kind_name().map(str::to_string);
                churn.controller_uid = Some(format!("replay:{}/{}", e.namespace, workload_name(e)));
                churn
            }
        }
    }

    // --- the gate releaser: the real plan ----------------------------------------------

    fn gate_round(&mut self, now: Millis) {
        if self.queue.is_empty() {
            return;
        }
        let queue: Vec<QueuedPod> = self
            .queue
            .iter()
            .map(|&p| {
                let pod = &self.pods[p];
                QueuedPod {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: format!("replay-pod-{p}"),
                    resource_version: String::new(),
                    rule: pod.rule.clone().unwrap_or_default(),
                    owner: Some(pod.owner.clone()),
                    created: pod.created / 1000 * 1000,
                }
            })
            .collect();
        let mut cursor = std::mem::take(&mut self.cursor);
        let round = plan(
            &Inputs {
                queue: &queue,
                not_ready: &self.not_ready,
                policy: self.policy,
                now,
                max_releases: MAX_RELEASES_PER_ROUND,
                network: self.net.as_ref().map(|w| NetworkRoom {
                    in_flight: self.net_in_flight,
                    window: w.window(),
                }),
            },
            &mut self.limiter,
            &mut cursor,
        );
        self.cursor = cursor;
        let mut released = vec![false; queue.len()];
        for r in &round.releases {
            released[r.index] = true;
            let p = self.queue[r.index];
            let rule = r.rule.as_deref().map(str::to_string);
            self.fired(rule.as_deref(), "release");
            if let Some(rule) = &self.pods[p].rule {
                *self.not_ready.entry(rule.clone()).or_default() += 1;
            }
            if self.net.is_some() && self.adaptive(self.pods[p].rule.as_deref()) {
                self.pods[p].net_since = Some(now);
                self.net_in_flight += 1;
            }
            let pod = &self.pods[p];
            let binds = pod.recorded_bind.is_some() || matches!(pod.then, After::SetReady(..));
            if binds {
                self.at(now + pod.schedule, Ev::Bound(p));
            } else {
                // Never bound in the log: released, but no start to count.
                self.at(now, Ev::Ready(p));
            }
        }
        let mut i = 0;
        self.queue.retain(|_| {
            i += 1;
            !released[i - 1]
        });
        if !round.releases.is_empty() {
            // Fewer pods gated: more room in the network window for a step.
            self.partition_round(now);
        }
        if !round.releases.is_empty() && !self.queue.is_empty() {
            // More than one round's worth: the releaser goes on at once.
            self.at(now, Ev::GateWake);
        }
        if let Some(at) = round.wake_at {
            let at = at.max(now + 1);
            if self.wake.is_none_or(|w| at < w || w < now) {
                self.wake = Some(at);
                self.at(at, Ev::GateWake);
            }
        }
    }

    // --- StatefulSet rollouts ------------------------------------------------------------

    fn set_write(&mut self, now: Millis, s: usize) {
        let set = &self.sets[s];
        if self.opted_in(&set.namespace) {
            let uid = format!("replay:{}/{}", set.namespace, set.name);
            let churn = statefulset_update_request(&StsUpdate {
                namespace: &set.namespace,
                name: &set.name,
                uid: &uid,
                user: "replay:operator",
                replicas: set.replicas,
                template_changed: true,
                old_partition: None,
                new_partition: None,
                update_pending: false,
                old_target: None,
                new_target: None,
                new_held: None,
            });
            let d = decide_churn(
                &churn,
                Endpoint::Mutate,
                self.policy,
                &mut self.limiter,
                now,
            );
            self.fired(d.rule.as_deref(), d.verdict.label());
            if matches!(d.verdict, Verdict::HoldPartition { .. }) {
                self.holds[s] = Some(Hold {
                    rule: d.rule.as_deref().unwrap_or_default().to_string(),
                    since: now,
                    steps: 0,
                    stepped_at: Vec::new(),
                    released: Released::None,
                    done: false,
                });
                self.partition_round(now);
                return;
            }
        }
        let first = now + self.sets[s].delays.reaction;
        self.at(first, Ev::SetNext(s, 0));
    }

    /// The controller's DELETE of set s's k-th ordinal, not held: at once.
    fn set_next(&mut self, now: Millis, s: usize, k: usize) {
        if k >= self.sets[s].ordinals.len() {
            return;
        }
        let t = self.set_delete_pod(now, s, k);
        let terminate = self.sets[s].delays.terminate;
        self.at(t + terminate, Ev::SetCreate(s, k));
    }

    /// The controller's DELETE of the ordinal step k of held set s released; the step
    /// now counts in the plan's windows at the deletion instead of "now".
    fn set_delete(&mut self, now: Millis, s: usize, k: usize) {
        let t = self.set_delete_pod(now, s, k);
        if let Some(hold) = self.holds[s].as_mut() {
            hold.released = Released::Starting { at: t };
        }
        let terminate = self.sets[s].delays.terminate;
        self.at(t + terminate, Ev::SetCreate(s, k));
        self.wake_partition(t, now);
    }

    /// Decides the StatefulSet controller's DELETE of set s's k-th ordinal at `now`; when
    /// it takes effect.
    fn set_delete_pod(&mut self, now: Millis, s: usize, k: usize) -> Millis {
        let set = &self.sets[s];
        let o = set.ordinals[k];
        let ns = set.namespace.clone();
        let name = format!("{}-{o}", set.name);
        let recorded = self.recorded_of(s, Kind::Deletions, o);
        let mut churn = base_request(
            ChurnKind::PodDelete,
            &ns,
            &name,
            STATEFULSET_CONTROLLER,
            classify::pod_delete_identity(&ns, &name),
        );
        churn.controller_kind = Some("StatefulSet".into());
        let t = self
            .decide_at(now, usize::MAX, &churn, Endpoint::Validate, MAX_RETRIES)
            .unwrap_or(now);
        self.emit((Kind::Deletions, Controller::StatefulSet), t, &ns, recorded);
        t
    }

    fn wake_partition(&mut self, at: Millis, now: Millis) {
        let at = at.max(now);
        if self.partition_wake.is_none_or(|w| at < w || w < now) {
            self.partition_wake = Some(at);
            self.at(at, Ev::PartitionWake);
        }
    }

    /// Pod p's network is up: at its binding, the earliest a Metadata-level log can show
    /// (it records neither Ready nor PodReadyToStartContainers; the ReplicaSet pods' Ready
    /// is assumed there too). The window takes it as a sample at its floor, as the real
    /// loop does on a network that keeps up: it grows by slow start. A step may find room.
    fn network_ready(&mut self, now: Millis, p: usize) {
        if self.pods[p].net_since.take().is_none() {
            return;
        }
        self.net_in_flight = self.net_in_flight.saturating_sub(1);
        if let Some(window) = self.net.as_mut() {
            window.observe(&Sample {
                // One floor for all: every sample is at it, none shows a queue.
                workload: String::new(),
                started: now,
                ready: now,
                censored: false,
            });
        }
        self.partition_round(now);
    }

    /// Whether the rule of this name is adaptive.
    fn adaptive(&self, rule: Option<&str>) -> bool {
        rule.is_some_and(|name| {
            self.policy
                .rules
                .iter()
                .any(|r| r.adaptive && &*r.name == name)
        })
    }

    /// The room the network window leaves a step (adaptive partition rules), as the real
    /// releaser computes it: the window, less the released pods not network-ready, less
    /// the pods adaptive gate rules still hold (a step's replacement queues behind them).
    fn partition_room(&self) -> Option<u32> {
        let window = self.net.as_ref()?.window();
        let gated = self
            .queue
            .iter()
            .filter(|&&p| self.adaptive(self.pods[p].rule.as_deref()))
            .count();
        let room = NetworkRoom {
            in_flight: self.net_in_flight,
            window,
        };
        Some(room.for_steps(u32::try_from(gated).unwrap_or(u32::MAX)))
    }

    /// The held sets as the partition releaser reads them from the cluster.
    fn held_sets(&self) -> (Vec<usize>, Vec<HeldSet>) {
        let mut ids = Vec::new();
        let mut held = Vec::new();
        for (s, hold) in self.holds.iter().enumerate() {
            let Some(hold) = hold.as_ref().filter(|h| !h.done) else {
                continue;
            };
            let set = &self.sets[s];
            let steps = u32::try_from(hold.steps).unwrap_or(u32::MAX);
            let partition = set.replicas.saturating_sub(steps);
            let rolled = u32::try_from(set.ordinals.len()).unwrap_or(u32::MAX);
            ids.push(s);
            held.push(HeldSet {
                namespace: set.namespace.clone(),
                name: set.name.clone(),
                uid: format!("replay:{}/{}", set.namespace, set.name),
                resource_version: String::new(),
                rule: hold.rule.clone(),
                rolling_update: true,
                replicas: set.replicas,
                partition,
                // The recorded rollout re-created these ordinals: the hold ends there.
                target: Some(set.replicas.saturating_sub(rolled)),
                held: Some(partition),
                stepped_at: hold.stepped_at.clone(),
                held_since: Some(hold.since),
                released: hold.released,
                // The replay's sets roll one ordinal at a time (OrderedReady).
                earlier: Vec::new(),
                max_unavailable: 1,
                nothing_to_roll: false,
                backoff: false,
            });
        }
        (ids, held)
    }

    /// One round of the partition releaser: `pacing::partition::plan_steps`, the plan
    /// the real releaser runs, over the held sets.
    fn partition_round(&mut self, now: Millis) {
        let (ids, held) = self.held_sets();
        if held.is_empty() {
            return;
        }
        let horizon = longest_window(self.policy);
        self.taken.retain(|t| t.at + horizon > now);
        let round = plan_steps(&StepInputs {
            held: &held,
            records: &self.records,
            taken: &self.taken,
            policy: self.policy,
            now,
            max_moves: MAX_RELEASES_PER_ROUND,
            network_room: self.partition_room(),
        });
        let mut index = 0;
        self.records.retain(|_| {
            index += 1;
            !round.cleanups.contains(&(index - 1))
        });
        for m in round.moves {
            let s = ids[m.index()];
            match m {
                Move::Step { rule, record, .. } => {
                    let ns = self.sets[s].namespace.clone();
                    if let Some(rule) = &rule {
                        self.taken.push(TakenStep {
                            rule: rule.clone(),
                            namespace: ns.clone(),
                            at: now,
                        });
                        self.fired(Some(rule), "step");
                    }
                    let reaction = self.step_reaction;
                    let Some(hold) = self.holds[s].as_mut() else {
                        continue;
                    };
                    if let Some(record) = record {
                        hold.stepped_at = record;
                    }
                    let k = hold.steps;
                    hold.steps += 1;
                    hold.released = Released::InFlight;
                    self.emit(
                        (Kind::PartitionSteps, Controller::StatefulSet),
                        now,
                        &ns,
                        None,
                    );
                    if k < self.sets[s].ordinals.len() {
                        self.at(now + reaction, Ev::SetDelete(s, k));
                    }
                }
                Move::Finish { record, .. } | Move::LetGo { record, .. } => {
                    let set = &self.sets[s];
                    if let Some(hold) = self.holds[s].as_mut() {
                        hold.done = true;
                        if !record.is_empty() {
                            self.records.push(Record {
                                namespace: set.namespace.clone(),
                                name: set.name.clone(),
                                uid: format!("replay:{}/{}", set.namespace, set.name),
                                rule: hold.rule.clone(),
                                stepped_at: record,
                            });
                        }
                    }
                }
            }
        }
        if let Some(at) = round.wake_at {
            self.wake_partition(at, now);
        }
    }

    fn recorded_of(&self, s: usize, kind: Kind, o: u32) -> Option<Millis> {
        let set = &self.sets[s];
        set.replaced
            .iter()
            .map(|&i| &self.events[i])
            .find(|e| e.kind == kind && e.set.as_ref().is_some_and(|x| x.1 == o))
            .map(|e| e.at)
    }

    fn set_create(&mut self, now: Millis, s: usize, k: usize) {
        let set = &self.sets[s];
        let o = set.ordinals[k];
        let e = PodEvent {
            kind: Kind::Creations,
            at: now,
            namespace: set.namespace.clone(),
            name: format!("{}-{o}", set.name),
            user: STATEFULSET_CONTROLLER.to_string(),
            controller: Controller::StatefulSet,
            set: Some((set.name.clone(), o)),
        };
        let delays = set.delays;
        let churn = self.create_request(&e);
        let recorded = self.recorded_of(s, Kind::Starts, o);
        // `create` records the creation against the recorded one.
        let rec_create = self.recorded_of(s, Kind::Creations, o);
        let before = self.out.times.get(&Kind::Creations).map_or(0, Vec::len);
        self.create(
            now,
            usize::MAX,
            churn,
            e.namespace.clone(),
            Some(delays.schedule),
            delays.ready,
            recorded,
            After::SetReady(s, k),
            MAX_RETRIES,
        );
        if let (Some(r), true) = (
            rec_create,
            self.out.times.get(&Kind::Creations).map_or(0, Vec::len) > before,
        ) {
            let t = self.out.times[&Kind::Creations]
                .last()
                .copied()
                .unwrap_or(now);
            self.out
                .delays
                .entry(e.namespace)
                .or_default()
                .push(t.saturating_sub(r));
        }
    }

    fn set_ready(&mut self, now: Millis, s: usize, k: usize) {
        match self.holds[s].as_mut() {
            Some(hold) => {
                if let Released::Starting { at } = hold.released {
                    hold.released = Released::Settled { at };
                }
                self.partition_round(now);
            }
            None => {
                let next = now + self.sets[s].delays.reaction;
                self.at(next, Ev::SetNext(s, k + 1));
            }
        }
    }
}

/// The workload a pod belongs to, by name: `<set>` for `<set>-<n>`, `<deployment>` for
/// `<deployment>-<hash>-<suffix>`, else the pod's own name.
pub fn workload_name(e: &PodEvent) -> String {
    if let Some((set, _)) = &e.set {
        return format!("statefulset/{set}");
    }
    match e.controller {
        Controller::ReplicaSet => {
            let mut parts = e.name.rsplitn(3, '-');
            let (_, _, dep) = (parts.next(), parts.next(), parts.next());
            format!(
                "deployment/{}",
                dep.unwrap_or(if e.name.is_empty() { "?" } else { &e.name })
            )
        }
        Controller::None => "pods".to_string(),
        c => format!("{}/{}", c.kind_name().unwrap_or("?").to_lowercase(), e.name),
    }
}
