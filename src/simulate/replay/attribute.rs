//! Requests in received order -> the pod events the replay paces, each tied to a pod and
//! a workload where the log allows: generateName pairing, final deletions, inferred steps.

use super::audit::{Request, What};
use crate::limiter::Millis;
use std::collections::{BTreeMap, HashMap, VecDeque};

pub const STATEFULSET_CONTROLLER: &str = "system:serviceaccount:kube-system:statefulset-controller";
pub const REPLICASET_CONTROLLER: &str = "system:serviceaccount:kube-system:replicaset-controller";

/// The kinds of the report, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Creations,
    Starts,
    Deletions,
    Evictions,
    PartitionSteps,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Creations,
        Kind::Starts,
        Kind::Deletions,
        Kind::Evictions,
        Kind::PartitionSteps,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Creations => "creations",
            Kind::Starts => "starts",
            Kind::Deletions => "deletions",
            Kind::Evictions => "evictions",
            Kind::PartitionSteps => "partition_steps",
        }
    }
}

/// Which controller made a request: from the user (the controllers' service accounts), or
/// the body's ownerReferences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Controller {
    StatefulSet,
    ReplicaSet,
    Job,
    DaemonSet,
    /// A person or an operator writing pods directly.
    None,
}

impl Controller {
    pub fn of(r: &Request) -> Controller {
        let by_user = match r
            .user
            .strip_prefix("system:serviceaccount:kube-system:")
            .unwrap_or("")
        {
            "statefulset-controller" => Some(Controller::StatefulSet),
            "replicaset-controller" => Some(Controller::ReplicaSet),
            "job-controller" => Some(Controller::Job),
            "daemon-set-controller" => Some(Controller::DaemonSet),
            _ => None,
        };
        by_user
            .or(match r.owner_kind.as_deref() {
                Some("StatefulSet") => Some(Controller::StatefulSet),
                Some("ReplicaSet") => Some(Controller::ReplicaSet),
                Some("Job") => Some(Controller::Job),
                Some("DaemonSet") => Some(Controller::DaemonSet),
                _ => None,
            })
            .unwrap_or(Controller::None)
    }

    /// The controller of that `controllerKinds` name (None: a person or an operator).
    pub fn from_kind_name(kind: Option<&str>) -> Controller {
        match kind {
            Some("StatefulSet") => Controller::StatefulSet,
            Some("ReplicaSet") => Controller::ReplicaSet,
            Some("Job") => Controller::Job,
            Some("DaemonSet") => Controller::DaemonSet,
            _ => Controller::None,
        }
    }

    /// The controller kind as the policy's `controllerKinds` names it.
    pub fn kind_name(self) -> Option<&'static str> {
        match self {
            Controller::StatefulSet => Some("StatefulSet"),
            Controller::ReplicaSet => Some("ReplicaSet"),
            Controller::Job => Some("Job"),
            Controller::DaemonSet => Some("DaemonSet"),
            Controller::None => None,
        }
    }
}

/// One disruptive event of the recorded run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    pub kind: Kind,
    pub at: Millis,
    pub namespace: String,
    /// The pod (or StatefulSet for a step); empty for a generateName creation that no
    /// binding or deletion was paired with.
    pub name: String,
    pub user: String,
    pub controller: Controller,
    /// The StatefulSet a StatefulSet-controller pod belongs to (`<set>-<ordinal>`), or the
    /// set of a step; with the ordinal.
    pub set: Option<(String, u32)>,
}

/// Why a pod could not be tied to its creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unattributed {
    /// A binding of a pod whose creation is not in the log (created before it starts, or
    /// before --since): its start is replayed as recorded.
    CreatedBeforeLog,
    /// A generateName creation with no later binding in its namespace.
    GenerateNameUnpaired,
}

impl Unattributed {
    pub fn as_str(self) -> &'static str {
        match self {
            Unattributed::CreatedBeforeLog => "created before the log (or --since)",
            Unattributed::GenerateNameUnpaired => "generateName creation never bound in the log",
        }
    }
}

/// Requests that are not replayed as events, by why (each is a disruptive request read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dropped {
    /// DELETE by a node (the kubelet's final delete).
    NodeDelete,
    /// DELETE or eviction of a pod already deleted and not re-created: a final deletion of
    /// a terminating pod, never paced (it moves with the first).
    FinalDelete,
    /// A StatefulSet write that does not lower the partition (a template change is
    /// replayed through the StatefulSet's rollout instead).
    NotAStep,
}

impl Dropped {
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::NodeDelete => "DELETE by a node (final delete)",
            Dropped::FinalDelete => "DELETE/eviction of a pod already being deleted",
            Dropped::NotAStep => "StatefulSet write lowering no partition",
        }
    }
}

/// How long a deleted pod's state is kept (its later DELETEs are final deletions of a
/// terminating pod) and how long a generateName creation waits for its binding: then
/// they are dropped (the creation counted as unpaired), so what the attributor keeps
/// follows the pods in flight, not the log's length.
pub const POD_STATE_HORIZON_MS: Millis = 10 * 60 * 1000;

#[derive(Debug, Default)]
struct PodState {
    /// Deleted (or evicted) since its last creation.
    deleting: bool,
    /// When, for the horizon (the first DELETE's received time).
    deleted_at: Millis,
    /// The StatefulSet (and ordinal) whose controller created it.
    set: Option<(String, u32)>,
}

/// Turns the merged requests into events; call [`Attributor::push`] in received order.
#[derive(Debug, Default)]
pub struct Attributor {
    pub events: Vec<PodEvent>,
    /// Requests replayed as events (a partition decrease is one request, several steps).
    pub replayed: u64,
    pub dropped: BTreeMap<Dropped, u64>,
    pub unattributed: BTreeMap<Unattributed, u64>,
    pods: HashMap<(String, String), PodState>,
    /// generateName creations waiting for their pod's name: namespace -> event indices.
    unnamed: HashMap<String, VecDeque<usize>>,
    /// Deleted pods in deletion order, dropped from `pods` after the horizon.
    deleted: VecDeque<(Millis, (String, String))>,
    next_expiry: Millis,
    /// Last partition written per StatefulSet (from bodies).
    partitions: HashMap<(String, String), u32>,
    /// StatefulSet writes per set: (namespace, set) -> times (for inferred rollouts).
    pub sts_writes: BTreeMap<(String, String), Vec<Millis>>,
    pub levels: BTreeMap<super::audit::Level, u64>,
}

/// `<set>-<ordinal>` -> (set, ordinal).
pub fn split_ordinal(name: &str) -> Option<(&str, u32)> {
    let (set, ordinal) = name.rsplit_once('-')?;
    if set.is_empty() || ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((set, ordinal.parse().ok()?))
}

impl Attributor {
    pub fn push(&mut self, r: Request) {
        *self.levels.entry(r.level).or_default() += 1;
        self.expire(r.received);
        let before = self.events.len();
        self.push_events(r);
        if self.events.len() > before {
            self.replayed += 1;
        }
    }

    fn push_events(&mut self, r: Request) {
        let controller = Controller::of(&r);
        let key = (r.namespace.clone(), r.name.clone());
        let set = (controller == Controller::StatefulSet)
            .then(|| split_ordinal(&r.name).map(|(s, o)| (s.to_string(), o)))
            .flatten();
        let event = |kind: Kind, name: String, set: Option<(String, u32)>| PodEvent {
            kind,
            at: r.received,
            namespace: r.namespace.clone(),
            name,
            user: r.user.clone(),
            controller,
            set,
        };
        match r.what {
            What::PodCreate => {
                let e = event(Kind::Creations, r.name.clone(), set);
                if r.name.is_empty() {
                    self.unnamed
                        .entry(r.namespace.clone())
                        .or_default()
                        .push_back(self.events.len());
                } else {
                    self.pods.insert(
                        key,
                        PodState {
                            deleting: false,
                            deleted_at: 0,
                            set: e.set.clone(),
                        },
                    );
                }
                self.events.push(e);
            }
            What::Binding => {
                self.name_pod(&key, true);
                let set = self.set_of(&key);
                self.events.push(event(Kind::Starts, r.name.clone(), set));
            }
            What::PodDelete | What::Eviction => {
                if r.what == What::PodDelete && r.from_node {
                    *self.dropped.entry(Dropped::NodeDelete).or_default() += 1;
                    return;
                }
                self.name_pod(&key, false);
                let state = self.pods.entry(key.clone()).or_default();
                if state.deleting {
                    *self.dropped.entry(Dropped::FinalDelete).or_default() += 1;
                    return;
                }
                state.deleting = true;
                state.deleted_at = r.received;
                self.deleted.push_back((r.received, key.clone()));
                let kind = if r.what == What::Eviction {
                    Kind::Evictions
                } else {
                    Kind::Deletions
                };
                let set = set.or_else(|| self.set_of(&key));
                self.events.push(event(kind, r.name.clone(), set));
            }
            What::StatefulSetWrite { partition } => {
                let before = self.partitions.get(&key).copied();
                if let Some(p) = partition {
                    self.partitions.insert(key.clone(), p);
                }
                match (before, partition) {
                    (Some(b), Some(p)) if p < b => {
                        // A partition decrease read from the body: one step per ordinal
                        // released, as churn-throttler's releaser would take them.
                        for o in (p..b).rev() {
                            self.events.push(event(
                                Kind::PartitionSteps,
                                r.name.clone(),
                                Some((r.name.clone(), o)),
                            ));
                        }
                    }
                    _ => {
                        self.sts_writes.entry(key).or_default().push(r.received);
                        *self.dropped.entry(Dropped::NotAStep).or_default() += 1;
                    }
                }
            }
        }
    }

    /// A pod first seen by name that was not created by name. Its binding makes it the
    /// oldest unnamed creation of its namespace (generateName pairing, in order); a
    /// deletion does not, since the pods a rollout deletes are mostly older than the log
    /// and would steal the new pods' creations.
    fn name_pod(&mut self, key: &(String, String), binding: bool) {
        if self.pods.contains_key(key) {
            return;
        }
        if binding {
            match self.unnamed.get_mut(&key.0).and_then(|q| q.pop_front()) {
                Some(i) => self.events[i].name = key.1.clone(),
                None => {
                    *self
                        .unattributed
                        .entry(Unattributed::CreatedBeforeLog)
                        .or_default() += 1
                }
            }
        }
        self.pods.insert(key.clone(), PodState::default());
    }

    /// The set of a StatefulSet pod, from its creation by the StatefulSet controller.
    fn set_of(&self, key: &(String, String)) -> Option<(String, u32)> {
        self.pods.get(key).and_then(|p| p.set.clone())
    }

    /// Drops what is older than the horizon at `now`: deleted pods not re-created since,
    /// and generateName creations never bound (counted as unpaired).
    fn expire(&mut self, now: Millis) {
        let before = now.saturating_sub(POD_STATE_HORIZON_MS);
        while let Some((at, _)) = self.deleted.front() {
            if *at >= before {
                break;
            }
            let Some((at, key)) = self.deleted.pop_front() else {
                break;
            };
            if self
                .pods
                .get(&key)
                .is_some_and(|p| p.deleting && p.deleted_at == at)
            {
                self.pods.remove(&key);
            }
        }
        // The unnamed creations: a walk over the namespaces, at most once a second.
        if now < self.next_expiry {
            return;
        }
        self.next_expiry = now.saturating_add(1000);
        let events = &self.events;
        let mut unpaired = 0;
        self.unnamed.retain(|_, q| {
            while q.front().is_some_and(|&i| events[i].at < before) {
                q.pop_front();
                unpaired += 1;
            }
            !q.is_empty()
        });
        if unpaired > 0 {
            *self
                .unattributed
                .entry(Unattributed::GenerateNameUnpaired)
                .or_default() += unpaired;
        }
    }

    /// Entries kept per pod (pod states, deleted pods waiting for the horizon, unnamed
    /// creations waiting for a binding): what grows with the pods in flight.
    pub fn retained(&self) -> usize {
        self.pods.len()
            + self.deleted.len()
            + self.unnamed.values().map(VecDeque::len).sum::<usize>()
    }

    /// The end of the log: generateName creations never paired are counted.
    pub fn finish(&mut self) {
        let left: usize = self.unnamed.values().map(|q| q.len()).sum();
        if left > 0 {
            *self
                .unattributed
                .entry(Unattributed::GenerateNameUnpaired)
                .or_default() += left as u64;
        }
        self.unnamed.clear();
    }
}
