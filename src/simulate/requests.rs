//! The requests the modelled controllers send, built with `classify`'s identities and
//! cost, and the StatefulSet controller's choice of its next write.

use crate::admission::classify::{self, StatefulSetChange};
use crate::admission::ChurnRequest;
use crate::limiter::Identity;
use crate::policy::ChurnKind;
use std::collections::BTreeMap;

/// Where a modelled pod is in its life; the controllers decide by it.
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
        classify::pod_delete_identity(namespace, name),
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
    let identity = classify::pod_create_identity(namespace, name, controller_uid, generate_name);
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
        classify::statefulset_identity(u.uid),
    );
    churn.controller_uid = Some(u.uid.to_string());
    let old_partition = u.old_partition.unwrap_or(0).min(u.replicas);
    let new_partition = u.new_partition.unwrap_or(0).min(u.replicas);
    let has_annotations = u.new_target.is_some() || u.new_held.is_some();
    churn.has_annotations = has_annotations;
    let change = StatefulSetChange {
        rolling_update: true,
        template_changed: u.template_changed,
        replicas: u.replicas,
        old_partition,
        new_partition,
        written_partition: u.new_partition,
        has_rolling_update_block: u.new_partition.is_some(),
        // The simulator models maxUnavailable 1 only.
        max_unavailable: 1,
        old_target: u.old_target,
        new_target_annotation: u.new_target.map(|t| t.to_string()),
        new_held_annotation: u.new_held,
        new_paced_by: None,
        has_held_since: false,
        has_annotations,
        update_pending: u.update_pending,
    };
    churn.cost = classify::statefulset_update_cost(&change);
    churn.statefulset = Some(change);
    churn
}

pub(super) fn base_request(
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

/// The generateName a pooled pod creation was asked with (empty for a named pod).
pub(super) fn churn_generate_name(churn: &ChurnRequest) -> String {
    match &churn.identity {
        Identity::Pool(id) => id.rsplit('/').next().unwrap_or_default().to_string(),
        Identity::Exact(_) => String::new(),
    }
}
