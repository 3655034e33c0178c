//! What the releaser reads of a Node: whether it is Ready (the network window leaves out
//! the pods on a node that is not). Pure: a Node in, its readiness or its slim copy out.

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};

/// The node's `Ready` condition is True. A node that reports no Ready condition yet is
/// not Ready (the node lifecycle controller treats it as Unknown).
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// Keeps only the name and the Ready condition: a Node's status carries its images,
/// addresses and capacity (kilobytes each), which 5,000 of would hold for nothing.
pub fn slim(node: &mut Node) {
    let ready: Option<NodeCondition> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| NodeCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            ..NodeCondition::default()
        });
    node.metadata.annotations = None;
    node.metadata.labels = None;
    node.metadata.managed_fields = None;
    node.spec = None;
    node.status = Some(NodeStatus {
        conditions: ready.map(|c| vec![c]),
        ..NodeStatus::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(conditions: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": { "name": "n1", "labels": { "a": "b" } },
            "spec": { "podCIDR": "10.0.0.0/24" },
            "status": {
                "conditions": conditions,
                "images": [{ "names": ["registry.example/app:1"], "sizeBytes": 1 }]
            }
        }))
        .expect("a node")
    }

    #[test]
    fn table_of_node_readiness_kept_by_the_slim_copy() {
        let cases = [
            (
                "Ready True",
                json!([{ "type": "Ready", "status": "True" }]),
                true,
            ),
            (
                "Ready False",
                json!([{ "type": "Ready", "status": "False" }]),
                false,
            ),
            (
                "Ready Unknown (kubelet silent)",
                json!([{ "type": "Ready", "status": "Unknown" }]),
                false,
            ),
            (
                "no Ready condition yet",
                json!([{ "type": "MemoryPressure", "status": "False" }]),
                false,
            ),
            (
                "pressure beside Ready",
                json!([{ "type": "DiskPressure", "status": "True" }, { "type": "Ready", "status": "True" }]),
                true,
            ),
        ];
        for (name, conditions, want) in cases {
            let mut n = node(conditions);
            assert_eq!(is_ready(&n), want, "{name}");
            slim(&mut n);
            assert_eq!(is_ready(&n), want, "{name}: after slim");
            assert_eq!(n.metadata.name.as_deref(), Some("n1"));
            let status = n.status.as_ref().expect("status");
            assert!(
                status.images.is_none() && n.spec.is_none() && n.metadata.labels.is_none(),
                "{name}"
            );
            assert!(
                status.conditions.as_ref().is_none_or(|c| c.len() <= 1),
                "{name}"
            );
        }
    }
}
