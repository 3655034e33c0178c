//! What the releaser reads from a Pod and the JSON patches it writes back.
//! Pure: a Pod object in, plan inputs or a patch out.

use crate::limiter::Millis;
use crate::names::{
    escape, format_time, millis, parse_time, pointer, test, ADMITTED_BY_ANNOTATION,
    GATED_BY_ANNOTATION, GATED_LABEL, GATE_NAME, LABEL_GATED, LABEL_RELEASED,
    RELEASED_AT_ANNOTATION,
};
use crate::pacing::gate::{QueuedPod, ReleasedPod};
use crate::pacing::network::PodNetwork;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// How the releaser sees one labelled pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum View {
    /// Carries our gate at `gate_index` of spec.schedulingGates: waits in the queue.
    Queued { pod: QueuedPod, gate_index: usize },
    /// Labelled gated but our gate is gone (removed by hand): to be marked released now.
    UngatedElsewhere { pod: QueuedPod },
    /// Released by us (label `released`).
    Released(ReleasedPod),
    /// Being deleted while gated, or a label value we do not own: left alone.
    Ignored,
}

pub fn view(pod: &Pod) -> View {
    let meta = &pod.metadata;
    let label = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(GATED_LABEL))
        .map(String::as_str);
    let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
    let owner = meta
        .owner_references
        .as_ref()
        .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)))
        .map(|r| r.uid.clone());
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let uid = meta.uid.clone().unwrap_or_default();
    let rule = annotation(GATED_BY_ANNOTATION).unwrap_or_default();
    let deleting = meta.deletion_timestamp.is_some();
    match label {
        Some(LABEL_GATED) => {
            if deleting {
                return View::Ignored;
            }
            let queued = QueuedPod {
                namespace,
                name,
                uid,
                resource_version: meta.resource_version.clone().unwrap_or_default(),
                rule,
                owner,
                created: meta.creation_timestamp.as_ref().map_or(0, |t| millis(t.0)),
            };
            match gate_index(pod) {
                Some(gate_index) => View::Queued {
                    pod: queued,
                    gate_index,
                },
                None => View::UngatedElsewhere { pod: queued },
            }
        }
        Some(LABEL_RELEASED) => View::Released(ReleasedPod {
            namespace,
            name,
            uid,
            rule,
            owner,
            released_at: annotation(RELEASED_AT_ANNOTATION).and_then(|t| parse_time(&t)),
            settled: deleting || is_settled(pod),
            held_elsewhere: pod
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| !g.is_empty()),
            admitted_by: annotation(ADMITTED_BY_ANNOTATION),
        }),
        _ => View::Ignored,
    }
}

/// What the network window reads of a released pod (`released`, its view): its workload,
/// binding and network condition (src/pacing/network.rs).
pub fn network_view(pod: &Pod, released: &ReleasedPod) -> PodNetwork {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let condition = |kind: &str| conditions.and_then(|c| c.iter().find(|c| c.type_ == kind));
    let network = condition("PodReadyToStartContainers");
    PodNetwork {
        uid: released.uid.clone(),
        workload: workload_of(pod),
        released_at: released.released_at,
        bound: pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        network_ready: network.is_some_and(|c| c.status == "True"),
        has_network_condition: network.is_some(),
        ready: is_settled(pod),
        deleting: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// The top-level workload of a pod, `namespace/Kind/name`: a ReplicaSet's pod belongs to
/// the Deployment (the ReplicaSet's name without the `pod-template-hash` suffix), since a
/// ReplicaSet's uid changes with every rollout.
fn workload_of(pod: &Pod) -> String {
    let meta = &pod.metadata;
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let owner = meta
        .owner_references
        .as_ref()
        .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)));
    let Some(owner) = owner else {
        return format!(
            "{namespace}/Pod/{}",
            meta.name.as_deref().unwrap_or_default()
        );
    };
    let hash = meta
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"));
    match (owner.kind.as_str(), hash) {
        ("ReplicaSet", Some(hash)) => match owner.name.strip_suffix(&format!("-{hash}")) {
            Some(deployment) => format!("{namespace}/Deployment/{deployment}"),
            None => format!("{namespace}/ReplicaSet/{}", owner.name),
        },
        (kind, _) => format!("{namespace}/{kind}/{}", owner.name),
    }
}

/// Position of churn-throttler's gate in spec.schedulingGates.
pub fn gate_index(pod: &Pod) -> Option<usize> {
    pod.spec
        .as_ref()?
        .scheduling_gates
        .as_ref()?
        .iter()
        .position(|g| g.name == GATE_NAME)
}

/// Ready, or finished (a Job's pod may complete before anyone sees it Ready).
fn is_settled(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return true;
    }
    status
        .conditions
        .as_ref()
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn annotation_ops(has_annotations: bool, at: Millis) -> PatchOperation {
    if has_annotations {
        PatchOperation::Add(AddOperation {
            path: pointer(&format!(
                "/metadata/annotations/{}",
                escape(RELEASED_AT_ANNOTATION)
            )),
            value: json!(format_time(at)),
        })
    } else {
        PatchOperation::Add(AddOperation {
            path: pointer("/metadata/annotations"),
            value: json!({ RELEASED_AT_ANNOTATION: format_time(at) }),
        })
    }
}

fn label_path() -> String {
    format!("/metadata/labels/{}", escape(GATED_LABEL))
}

/// Removes our gate and marks the pod released. The test ops make the API server refuse
/// the patch (HTTP 422) when the pod changed since it was read, so a changed pod is
/// retried on a later round and never overwritten; other gates stay where they are.
pub fn release_patch(
    resource_version: &str,
    gate_index: usize,
    has_annotations: bool,
    at: Millis,
) -> Patch {
    let gate = format!("/spec/schedulingGates/{gate_index}");
    Patch(vec![
        test("/metadata/resourceVersion", json!(resource_version)),
        test(&format!("{gate}/name"), json!(GATE_NAME)),
        PatchOperation::Remove(RemoveOperation {
            path: pointer(&gate),
        }),
        test(&label_path(), json!(LABEL_GATED)),
        PatchOperation::Replace(ReplaceOperation {
            path: pointer(&label_path()),
            value: json!(LABEL_RELEASED),
        }),
        annotation_ops(has_annotations, at),
    ])
}

/// For a pod whose gate someone else removed: count it as released now.
pub fn mark_released_patch(resource_version: &str, has_annotations: bool, at: Millis) -> Patch {
    Patch(vec![
        test("/metadata/resourceVersion", json!(resource_version)),
        test(&label_path(), json!(LABEL_GATED)),
        PatchOperation::Replace(ReplaceOperation {
            path: pointer(&label_path()),
            value: json!(LABEL_RELEASED),
        }),
        annotation_ops(has_annotations, at),
    ])
}

/// Drops the label of a settled released pod (the annotation stays as a record).
pub fn unlabel_patch() -> Patch {
    Patch(vec![
        test(&label_path(), json!(LABEL_RELEASED)),
        PatchOperation::Remove(RemoveOperation {
            path: pointer(&label_path()),
        }),
    ])
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_of_network_views() {
        use serde_json::json;
        let released = |owner: serde_json::Value,
                        labels: serde_json::Value,
                        status: serde_json::Value| {
            let doc = json!({
                "metadata": {
                    "name": "web-5d9c7b8f6d-abcde", "namespace": "shop", "uid": "u1",
                    "labels": labels, "ownerReferences": [owner],
                    "annotations": { "churn-throttler.io/released-at": "2026-12-07T10:00:00.000Z" }
                },
                "spec": { "containers": [], "nodeName": "node-1" },
                "status": status,
            });
            serde_json::from_value::<Pod>(doc).unwrap_or_else(|e| panic!("{e}"))
        };
        let rs = json!({"kind": "ReplicaSet", "name": "web-5d9c7b8f6d", "uid": "rs", "apiVersion": "apps/v1", "controller": true});
        let sts = json!({"kind": "StatefulSet", "name": "db", "uid": "s", "apiVersion": "apps/v1", "controller": true});
        let labels = |hash: bool| {
            let mut l = json!({ GATED_LABEL: LABEL_RELEASED });
            if hash {
                l["pod-template-hash"] = json!("5d9c7b8f6d");
            }
            l
        };
        let up = json!({"conditions": [{"type": "PodReadyToStartContainers", "status": "True"}]});
        let not_up =
            json!({"conditions": [{"type": "PodReadyToStartContainers", "status": "False"}]});
        // (case, pod, workload, network ready, condition present)
        let cases = [
            (
                "deployment through its ReplicaSet",
                released(rs.clone(), labels(true), up.clone()),
                "shop/Deployment/web",
                true,
                true,
            ),
            (
                "ReplicaSet without the hash label",
                released(rs, labels(false), not_up.clone()),
                "shop/ReplicaSet/web-5d9c7b8f6d",
                false,
                true,
            ),
            (
                "StatefulSet",
                released(sts, labels(false), json!({})),
                "shop/StatefulSet/db",
                false,
                false,
            ),
        ];
        for (name, pod, workload, ready, present) in cases {
            let View::Released(r) = view(&pod) else {
                panic!("{name}: not released");
            };
            let v = network_view(&pod, &r);
            assert_eq!(v.workload, workload, "{name}");
            assert_eq!(v.network_ready, ready, "{name}");
            assert_eq!(v.has_network_condition, present, "{name}");
            assert!(v.bound && v.released_at.is_some(), "{name}");
        }
    }

    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::Value;

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).expect("pod json")
    }

    fn gated(gates: Value, label: &str) -> Pod {
        pod(json!({
            "metadata": {
                "namespace": "ns", "name": "web-0", "uid": "u1", "resourceVersion": "42",
                "creationTimestamp": "2026-01-02T03:04:05Z",
                "labels": { GATED_LABEL: label },
                "annotations": { GATED_BY_ANNOTATION: "controller-creates" },
                "ownerReferences": [
                    { "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": true }
                ]
            },
            "spec": { "containers": [{ "name": "c" }], "schedulingGates": gates },
            "status": { "phase": "Pending" }
        }))
    }

    #[test]
    fn table_of_views() {
        let queued = |gate_index| match view(&gated(
            json!([{ "name": "other.io/x" }, { "name": GATE_NAME }]),
            "true",
        )) {
            View::Queued { pod, gate_index: i } => {
                assert_eq!(pod.rule, "controller-creates");
                assert_eq!(pod.owner.as_deref(), Some("rs-uid"));
                assert_eq!(pod.resource_version, "42");
                assert_eq!(pod.created, 1_767_323_045_000);
                i == gate_index
            }
            _ => false,
        };
        assert!(queued(1), "gate found behind another gate");
        assert!(matches!(
            view(&gated(json!([{ "name": "other.io/x" }]), "true")),
            View::UngatedElsewhere { .. }
        ));
        assert!(matches!(
            view(&gated(json!([{ "name": GATE_NAME }]), "something-else")),
            View::Ignored
        ));
        let mut deleting = gated(json!([{ "name": GATE_NAME }]), "true");
        deleting.metadata.deletion_timestamp = deleting.metadata.creation_timestamp.clone();
        assert_eq!(view(&deleting), View::Ignored);
    }

    #[test]
    fn table_of_released_views() {
        // (case, status, released-at, settled, released_at)
        let cases: &[(&str, Value, &str, bool, Option<Millis>)] = &[
            (
                "running, not ready",
                json!({ "phase": "Running", "conditions": [{ "type": "Ready", "status": "False" }] }),
                "2026-01-02T03:04:05.678Z",
                false,
                Some(1_767_323_045_678),
            ),
            (
                "ready",
                json!({ "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] }),
                "2026-01-02T03:04:05.678Z",
                true,
                Some(1_767_323_045_678),
            ),
            (
                "succeeded",
                json!({ "phase": "Succeeded" }),
                "garbage",
                true,
                None,
            ),
            (
                "no status yet",
                json!({}),
                "2026-01-02T03:04:05+01:00",
                false,
                Some(1_767_319_445_000),
            ),
        ];
        for (name, status, at, settled, released_at) in cases {
            let mut p = gated(json!([]), "released");
            p.status = serde_json::from_value(status.clone()).expect("status");
            p.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(RELEASED_AT_ANNOTATION.into(), at.to_string());
            match view(&p) {
                View::Released(r) => {
                    assert!(!r.held_elsewhere, "{name}");
                    assert_eq!(r.settled, *settled, "{name}");
                    assert_eq!(r.released_at, *released_at, "{name}");
                    assert_eq!(r.rule, "controller-creates", "{name}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_released_pod_behind_another_gate_is_held_elsewhere() {
        let p = gated(json!([{ "name": "other.io/x" }]), "released");
        match view(&p) {
            View::Released(r) => assert!(r.held_elsewhere && !r.settled),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn times_round_trip_with_milliseconds() {
        let at = 1_767_323_045_678;
        assert_eq!(format_time(at), "2026-01-02T03:04:05.678Z");
        assert_eq!(parse_time(&format_time(at)), Some(at));
        assert_eq!(format_time(1_767_323_045_000), "2026-01-02T03:04:05.000Z");
    }

    fn apply(pod: &Pod, patch: &Patch) -> Result<Value, json_patch::PatchError> {
        let mut doc = serde_json::to_value(pod).expect("pod to json");
        json_patch::patch(&mut doc, patch)?;
        Ok(doc)
    }

    #[test]
    fn release_removes_only_our_gate_and_marks_the_pod() {
        let p = gated(
            json!([{ "name": "a.io/x" }, { "name": GATE_NAME }, { "name": "b.io/y" }]),
            "true",
        );
        let index = gate_index(&p).expect("gated");
        let doc = apply(&p, &release_patch("42", index, true, 1_767_323_045_678)).expect("applies");
        assert_eq!(
            doc["spec"]["schedulingGates"],
            json!([{ "name": "a.io/x" }, { "name": "b.io/y" }])
        );
        assert_eq!(doc["metadata"]["labels"][GATED_LABEL], "released");
        assert_eq!(
            doc["metadata"]["annotations"][RELEASED_AT_ANNOTATION],
            "2026-01-02T03:04:05.678Z"
        );
        assert_eq!(
            doc["metadata"]["annotations"][GATED_BY_ANNOTATION],
            "controller-creates"
        );
    }

    #[test]
    fn release_fails_on_a_changed_pod() {
        let p = gated(json!([{ "name": "a.io/x" }, { "name": GATE_NAME }]), "true");
        // Stale resourceVersion.
        assert!(apply(&p, &release_patch("41", 1, true, 0)).is_err());
        // The gate moved: index 0 is someone else's gate now.
        assert!(apply(&p, &release_patch("42", 0, true, 0)).is_err());
        // Already released by another replica.
        let mut released = p.clone();
        released
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(GATED_LABEL.into(), "released".into());
        assert!(apply(&released, &release_patch("42", 1, true, 0)).is_err());
    }

    #[test]
    fn patches_create_the_annotation_map_when_missing() {
        let mut p = gated(json!([{ "name": GATE_NAME }]), "true");
        p.metadata.annotations = None;
        let doc = apply(&p, &release_patch("42", 0, false, 0)).expect("applies");
        assert_eq!(
            doc["metadata"]["annotations"][RELEASED_AT_ANNOTATION],
            "1970-01-01T00:00:00.000Z"
        );
        assert_eq!(doc["spec"]["schedulingGates"], json!([]));
        let mut p = gated(json!([]), "true");
        p.metadata.annotations = None;
        let doc = apply(&p, &mark_released_patch("42", false, 0)).expect("applies");
        assert_eq!(doc["metadata"]["labels"][GATED_LABEL], "released");
    }

    #[test]
    fn unlabel_only_removes_our_released_label() {
        let p = gated(json!([]), "released");
        let doc = apply(&p, &unlabel_patch()).expect("applies");
        assert!(doc["metadata"]["labels"].get(GATED_LABEL).is_none());
        let p = gated(json!([]), "true");
        assert!(apply(&p, &unlabel_patch()).is_err());
    }

    /// A pod the webhook admitted at once under a gate rule, with the patch
    /// `admission::mark_admission` gives it, reads back as released by that process.
    #[test]
    fn a_pod_the_webhook_marked_reads_as_released() {
        use crate::admission::{decide, mark_admission, Endpoint, Verdict};
        use crate::limiter::Limiter;
        use crate::policy::Policy;
        use kube::core::admission::{AdmissionRequest, AdmissionReview};
        use kube::core::DynamicObject;

        let policy = Policy::from_yaml(
            "rules:\n  - name: creates\n    match: { resources: [pods], operations: [CREATE] }\n    limit: { events: 2, burst: 2, window: 10s }\n    action: gate\n",
            "test",
        )
        .expect("policy");
        let path = format!(
            "{}/tests/fixtures/pod-create-statefulset.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("fixture");
        let review: AdmissionReview<DynamicObject> = serde_json::from_str(&text).expect("review");
        let req: AdmissionRequest<DynamicObject> = review.try_into().expect("request");
        let now = 1_767_225_600_000;
        let decision = decide(
            &req,
            Endpoint::Mutate,
            &policy,
            &mut Limiter::new(1_000),
            now,
        );
        let decision = mark_admission(
            &crate::admission::churn_of(&req),
            decision,
            &policy,
            now,
            "replica-a/1",
        );
        let Verdict::AdmitMarked { patch } = &decision.verdict else {
            panic!("not marked: {:?}", decision.verdict)
        };
        let mut doc = serde_json::to_value(req.object.as_ref().expect("object")).expect("json");
        json_patch::patch(&mut doc, patch).expect("applies");
        let View::Released(released) = view(&pod(doc)) else {
            panic!("not seen as released")
        };
        assert_eq!(released.released_at, Some(now));
        assert_eq!(released.admitted_by.as_deref(), Some("replica-a/1"));
        assert_eq!(released.rule, "creates");
    }
}
