//! The sample review that `serve --dev` writes and `demo` sends: what kube-apiserver
//! sends when the ReplicaSet controller deletes a running pod, which the built-in policy paces.

use serde_json::{json, Value};

/// An AdmissionReview (admission.k8s.io/v1) of the ReplicaSet controller deleting the
/// running pod shop/web-5d9c7b8f6d-x7k2p: the fields churn-throttler reads, with the
/// values tests/fixtures/pod-delete-running.json (a captured review) holds.
pub fn pod_delete_review() -> Value {
    let pod = "web-5d9c7b8f6d-x7k2p";
    let group_version = |kind: &str, resource: &str| {
        (
            json!({ "group": "", "version": "v1", "kind": kind }),
            json!({ "group": "", "version": "v1", "resource": resource }),
        )
    };
    let (kind, resource) = group_version("Pod", "pods");
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "7f1c3c52-0b6e-4d0a-9f5b-1c2d3e4f5a05",
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": pod,
            "namespace": "shop",
            "operation": "DELETE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]
            },
            "object": null,
            "oldObject": {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {
                    "name": pod,
                    "namespace": "shop",
                    "uid": "9b2d7c1e-3c44-4a51-8d1e-6f0a2b3c4d5e",
                    "ownerReferences": [{
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": "web-5d9c7b8f6d",
                        "uid": "3a9e5f2d-64b1-4d0c-8c5b-77e1a2f3b4c5",
                        "controller": true,
                        "blockOwnerDeletion": true
                    }]
                },
                "spec": { "nodeName": "node-1", "containers": [{ "name": "app", "image": "app" }] },
                "status": { "phase": "Running" }
            },
            "dryRun": false,
            "options": { "kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1" }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_holds_what_the_captured_review_holds_where_churn_throttler_reads() {
        let captured: Value =
            serde_json::from_str(include_str!("../tests/fixtures/pod-delete-running.json"))
                .unwrap_or_else(|e| panic!("{e}"));
        let sample = pod_delete_review();
        for pointer in [
            "/apiVersion",
            "/request/uid",
            "/request/kind",
            "/request/resource",
            "/request/name",
            "/request/namespace",
            "/request/operation",
            "/request/userInfo/username",
            "/request/userInfo/groups",
            "/request/dryRun",
            "/request/oldObject/metadata/name",
            "/request/oldObject/metadata/namespace",
            "/request/oldObject/metadata/uid",
            "/request/oldObject/metadata/ownerReferences",
            "/request/oldObject/metadata/deletionTimestamp",
            "/request/oldObject/status/phase",
        ] {
            assert_eq!(
                sample.pointer(pointer),
                captured.pointer(pointer),
                "{pointer}"
            );
        }
    }
}
