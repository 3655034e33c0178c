//! Turns an AdmissionRequest into the facts the policy and limiter need.
//! Decides what is churn at all: a terminating pod's final DELETE, for one, never is.

use crate::limiter::Identity;
use crate::names::{
    PACED_BY_ANNOTATION, PARTITION_HELD_ANNOTATION, PARTITION_HELD_SINCE_ANNOTATION,
    PARTITION_TARGET_ANNOTATION,
};
use crate::policy::ChurnKind;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::admission::{AdmissionRequest, Operation};
use kube::core::DynamicObject;
use serde_json::Value;
use std::collections::BTreeMap;

/// Why a request is allowed without consulting the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassReason {
    /// DELETE of a pod that already has deletionTimestamp (the final grace-0 delete).
    AlreadyTerminating,
    /// DELETE of a pod that never ran or has finished: no endpoints change.
    NotRunning,
    /// A StatefulSet UPDATE that releases no pod.
    NoPodReleased,
    /// A kind, subresource or operation churn-throttler does not pace.
    Unhandled,
}

/// What a StatefulSet UPDATE changes, as far as pacing cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatefulSetChange {
    pub rolling_update: bool,
    pub template_changed: bool,
    pub replicas: u32,
    /// Effective partitions (bounded by replicas) before and after.
    pub old_partition: u32,
    pub new_partition: u32,
    /// The partition field as written in the new object (None when absent).
    pub written_partition: Option<u32>,
    /// Whether `spec.updateStrategy.rollingUpdate` exists in the new object.
    pub has_rolling_update_block: bool,
    /// Pods the controller takes down at once in the rollout ([`max_unavailable`] of the
    /// new object): what one partition step lets go at a time.
    pub max_unavailable: u32,
    /// The target annotation of the old object, if a paced rollout is in progress.
    pub old_target: Option<u32>,
    pub new_target_annotation: Option<String>,
    pub new_held_annotation: Option<u32>,
    /// The paced-by annotation of the new object.
    pub new_paced_by: Option<String>,
    /// Whether the new object carries the held-since annotation.
    pub has_held_since: bool,
    pub has_annotations: bool,
    pub update_pending: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChurnRequest {
    pub kind: ChurnKind,
    pub namespace: String,
    /// Empty for a pod CREATE with generateName, as mutating webhooks see it.
    pub name: String,
    pub user: String,
    pub groups: Vec<String>,
    pub controller_kind: Option<String>,
    pub controller_uid: Option<String>,
    pub priority_class: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub identity: Identity,
    pub cost: u32,
    pub dry_run: bool,
    /// pods CREATE: the pod is already bound to a node and must not be gated.
    pub node_name_set: bool,
    /// pods CREATE: scheduling gates already present (to add ours correctly).
    pub scheduling_gates: Vec<String>,
    pub has_annotations: bool,
    pub has_labels: bool,
    pub statefulset: Option<StatefulSetChange>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    Churn(Box<ChurnRequest>),
    Pass(PassReason),
}

fn resource_of(req: &AdmissionRequest<DynamicObject>) -> (&str, &str, &str) {
    // With matchPolicy: Equivalent the request may arrive converted; the group and
    // resource names are what identify it, not the version.
    (
        req.resource.group.as_str(),
        req.resource.resource.as_str(),
        req.sub_resource.as_deref().unwrap_or(""),
    )
}

pub fn classify(req: &AdmissionRequest<DynamicObject>) -> Classified {
    let (group, resource, sub) = resource_of(req);
    match (group, resource, sub, &req.operation) {
        ("", "pods", "", Operation::Create) => pod_create(req),
        ("", "pods", "", Operation::Delete) => pod_delete(req),
        ("", "pods", "eviction", Operation::Create) => eviction(req),
        ("apps", "statefulsets", "", Operation::Update) => statefulset_update(req),
        _ => Classified::Pass(PassReason::Unhandled),
    }
}

fn base(
    req: &AdmissionRequest<DynamicObject>,
    kind: ChurnKind,
    identity: Identity,
) -> ChurnRequest {
    ChurnRequest {
        kind,
        namespace: req.namespace.clone().unwrap_or_default(),
        name: req.name.clone(),
        user: req.user_info.username.clone().unwrap_or_default(),
        groups: req.user_info.groups.clone().unwrap_or_default(),
        controller_kind: None,
        controller_uid: None,
        priority_class: None,
        labels: BTreeMap::new(),
        identity,
        cost: 1,
        dry_run: req.dry_run,
        node_name_set: false,
        scheduling_gates: Vec::new(),
        has_annotations: false,
        has_labels: false,
        statefulset: None,
    }
}

fn fill_from_object(churn: &mut ChurnRequest, object: &DynamicObject) {
    let meta = &object.metadata;
    if let Some(owner) = meta
        .owner_references
        .as_ref()
        .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)))
    {
        churn.controller_kind = Some(owner.kind.clone());
        churn.controller_uid = Some(owner.uid.clone());
    }
    churn.labels = meta.labels.clone().unwrap_or_default();
    churn.has_annotations = meta.annotations.is_some();
    churn.has_labels = meta.labels.is_some();
    churn.priority_class = str_at(&object.data, &["spec", "priorityClassName"]).map(str::to_string);
}

fn pod_create(req: &AdmissionRequest<DynamicObject>) -> Classified {
    let Some(pod) = req.object.as_ref() else {
        return Classified::Pass(PassReason::Unhandled);
    };
    let namespace = req.namespace.clone().unwrap_or_default();
    let name = pod
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| req.name.clone());
    let generate_name = pod.metadata.generate_name.clone().unwrap_or_default();
    let mut churn = base(req, ChurnKind::PodCreate, Identity::Exact(String::new()));
    fill_from_object(&mut churn, pod);
    churn.name = name.clone();
    // StatefulSet pods have stable names; ReplicaSet pods only a generateName until
    // persisted, and several may be created at once: they share a pool.
    let owner = churn.controller_uid.clone().unwrap_or_default();
    churn.identity = pod_create_identity(&namespace, &name, &owner, &generate_name);
    churn.node_name_set = str_at(&pod.data, &["spec", "nodeName"]).is_some_and(|n| !n.is_empty());
    churn.scheduling_gates = pod
        .data
        .pointer("/spec/schedulingGates")
        .and_then(Value::as_array)
        .map(|gates| {
            gates
                .iter()
                .filter_map(|g| g.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    Classified::Churn(Box::new(churn))
}

fn pod_delete(req: &AdmissionRequest<DynamicObject>) -> Classified {
    let namespace = req.namespace.clone().unwrap_or_default();
    // A DeleteCollection (the namespace controller's teardown) is reviewed pod by pod with
    // an empty request.name: only oldObject names the pod, and each must keep its own identity.
    let name = Some(req.name.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| {
            req.old_object
                .as_ref()
                .and_then(|o| o.metadata.name.clone())
        })
        .unwrap_or_default();
    let mut churn = base(
        req,
        ChurnKind::PodDelete,
        pod_delete_identity(&namespace, &name),
    );
    churn.name = name;
    if let Some(pod) = req.old_object.as_ref() {
        if pod.metadata.deletion_timestamp.is_some() {
            return Classified::Pass(PassReason::AlreadyTerminating);
        }
        let phase = str_at(&pod.data, &["status", "phase"]).unwrap_or("");
        let on_node = str_at(&pod.data, &["spec", "nodeName"]).is_some_and(|n| !n.is_empty());
        if !on_node || phase == "Succeeded" || phase == "Failed" {
            return Classified::Pass(PassReason::NotRunning);
        }
        fill_from_object(&mut churn, pod);
    }
    Classified::Churn(Box::new(churn))
}

/// The identity of a pod creation: StatefulSet pods have stable names; ReplicaSet pods
/// only a generateName until persisted, and several may be created at once: they share
/// a pool per owner and generateName.
pub fn pod_create_identity(
    namespace: &str,
    name: &str,
    owner_uid: &str,
    generate_name: &str,
) -> Identity {
    if !name.is_empty() {
        Identity::Exact(format!("pod-create:{namespace}/{name}"))
    } else {
        Identity::Pool(format!(
            "pod-create:{namespace}/{owner_uid}/{generate_name}"
        ))
    }
}

pub fn pod_delete_identity(namespace: &str, name: &str) -> Identity {
    Identity::Exact(format!("pod-delete:{namespace}/{name}"))
}

pub fn statefulset_identity(uid: &str) -> Identity {
    Identity::Exact(format!("statefulset:{uid}"))
}

/// Pods a StatefulSet update lets the controller re-create: with a new template, every
/// ordinal at or above the partition; otherwise the ordinals a lower partition releases.
pub fn statefulset_update_cost(change: &StatefulSetChange) -> u32 {
    if !change.rolling_update {
        0
    } else if change.template_changed {
        change.replicas - change.new_partition
    } else if change.update_pending {
        change.old_partition.saturating_sub(change.new_partition)
    } else {
        0
    }
}

fn eviction(req: &AdmissionRequest<DynamicObject>) -> Classified {
    // The object is the Eviction, not the pod: the pod's owner is not known here.
    let namespace = req.namespace.clone().unwrap_or_default();
    let identity = Identity::Exact(format!("eviction:{namespace}/{}", req.name));
    Classified::Churn(Box::new(base(req, ChurnKind::Eviction, identity)))
}

fn statefulset_update(req: &AdmissionRequest<DynamicObject>) -> Classified {
    let (Some(new), Some(old)) = (req.object.as_ref(), req.old_object.as_ref()) else {
        return Classified::Pass(PassReason::Unhandled);
    };
    let uid = new.metadata.uid.clone().unwrap_or_default();
    let mut churn = base(
        req,
        ChurnKind::StatefulSetUpdate,
        statefulset_identity(&uid),
    );
    fill_from_object(&mut churn, new);
    churn.controller_kind = None;
    churn.controller_uid = Some(uid.clone());

    let replicas = u32_at(&new.data, "/spec/replicas").unwrap_or(1);
    let old_replicas = u32_at(&old.data, "/spec/replicas").unwrap_or(1);
    let strategy = |o: &DynamicObject| {
        str_at(&o.data, &["spec", "updateStrategy", "type"])
            .unwrap_or("RollingUpdate")
            .to_string()
    };
    let rolling_update = strategy(new) == "RollingUpdate";
    let written_partition = u32_at(&new.data, "/spec/updateStrategy/rollingUpdate/partition");
    let old_partition = u32_at(&old.data, "/spec/updateStrategy/rollingUpdate/partition")
        .unwrap_or(0)
        .min(old_replicas);
    let new_partition = written_partition.unwrap_or(0).min(replicas);
    let at_once = new
        .data
        .pointer("/spec/updateStrategy/rollingUpdate/maxUnavailable")
        .and_then(|v| serde_json::from_value::<IntOrString>(v.clone()).ok());
    let template_changed = templates_differ(
        old.data.pointer("/spec/template"),
        new.data.pointer("/spec/template"),
    );
    let update_pending = {
        let current = str_at(&old.data, &["status", "currentRevision"]);
        let update = str_at(&old.data, &["status", "updateRevision"]);
        current.is_none() || update.is_none() || current != update
    };
    let annotation_of = |o: &DynamicObject, key: &str| {
        o.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key).cloned())
    };
    let annotation = |o: &DynamicObject| annotation_of(o, PARTITION_TARGET_ANNOTATION);
    let change = StatefulSetChange {
        rolling_update,
        template_changed,
        replicas,
        old_partition,
        new_partition,
        written_partition,
        has_rolling_update_block: new
            .data
            .pointer("/spec/updateStrategy/rollingUpdate")
            .is_some_and(Value::is_object),
        max_unavailable: max_unavailable(at_once.as_ref(), replicas),
        old_target: annotation(old).and_then(|v| v.parse().ok()),
        new_target_annotation: annotation(new),
        new_held_annotation: annotation_of(new, PARTITION_HELD_ANNOTATION)
            .and_then(|v| v.parse().ok()),
        new_paced_by: annotation_of(new, PACED_BY_ANNOTATION),
        has_held_since: annotation_of(new, PARTITION_HELD_SINCE_ANNOTATION).is_some(),
        has_annotations: new.metadata.annotations.is_some(),
        update_pending,
    };
    churn.cost = statefulset_update_cost(&change);
    churn.statefulset = Some(change);
    Classified::Churn(Box::new(churn))
}

/// `rollingUpdate.maxUnavailable` as the StatefulSet controller reads it
/// (`getStatefulSetMaxUnavailable`, k8s.io/kubernetes v1.36): 1 when absent, a
/// percentage of `spec.replicas` rounded down, at least 1. A value the controller
/// refuses (a string that is not a percentage, which it answers by updating nothing)
/// reads as 1. The field exists only with the feature gate MaxUnavailableStatefulSet
/// on (the API server drops it otherwise); a value left from a time the gate was on is
/// ignored by the controller, which then deletes one pod at a time: the releaser's
/// steps stay in flight (counted as "now") until their pods are deleted, so the rate
/// holds either way.
pub fn max_unavailable(value: Option<&IntOrString>, replicas: u32) -> u32 {
    let scaled = match value {
        None => 1,
        Some(IntOrString::Int(n)) => i64::from(*n),
        Some(IntOrString::String(s)) => match s.strip_suffix('%').map(str::parse::<i64>) {
            Some(Ok(percent)) => percent.saturating_mul(i64::from(replicas)).div_euclid(100),
            _ => 1,
        },
    };
    u32::try_from(scaled.max(1)).unwrap_or(u32::MAX)
}

/// Semantic comparison of pod templates: the controller ignores metadata it does not
/// hash into the revision only in rare cases, so compare the whole template but treat
/// a missing map/list and an empty one as equal (defaults a re-apply may drop).
pub fn templates_differ(old: Option<&Value>, new: Option<&Value>) -> bool {
    !values_equivalent(old.unwrap_or(&Value::Null), new.unwrap_or(&Value::Null))
}

fn values_equivalent(a: &Value, b: &Value) -> bool {
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().all(|k| match (x.get(k), y.get(k)) {
                (Some(p), Some(q)) => values_equivalent(p, q),
                (Some(v), None) | (None, Some(v)) => empty(v),
                (None, None) => true,
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| values_equivalent(p, q))
        }
        _ if empty(a) && empty(b) => true,
        _ => a == b,
    }
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = value;
    for key in path {
        cur = cur.get(key)?;
    }
    cur.as_str()
}

fn u32_at(value: &Value, pointer: &str) -> Option<u32> {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .map(|v| v.min(u32::MAX as u64) as u32)
}
