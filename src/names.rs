//! The names churn-throttler writes into the cluster (labels, annotations, the gate, the
//! field manager, the Lease names), the time format of its annotations, and the JSON-patch
//! helpers its patches are built from. The webhook writes what the releasers read back,
//! so both take these from one place; this module sits at the bottom, next to the policy,
//! and imports nothing of the crate.

use json_patch::{AddOperation, PatchOperation, TestOperation};
use jsonptr::PointerBuf;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

/// The scheduling gate churn-throttler adds and only it removes.
pub const GATE_NAME: &str = "churn-throttler.io/paced";
/// Label on pods churn-throttler gated ("true") or released but not yet seen Ready
/// ("released"), so the releaser can list and watch exactly those pods.
pub const GATED_LABEL: &str = "churn-throttler.io/gated";
/// GATED_LABEL value while the pod carries the gate.
pub const LABEL_GATED: &str = "true";
/// GATED_LABEL value once released, until the pod is Ready and out of every window.
pub const LABEL_RELEASED: &str = "released";
/// Annotation naming the rule that gated a pod, for the releaser.
pub const GATED_BY_ANNOTATION: &str = "churn-throttler.io/gated-by";
/// Annotation with the time churn-throttler removed its gate (RFC 3339, milliseconds):
/// the record window seeding rebuilds the windows from.
pub const RELEASED_AT_ANNOTATION: &str = "churn-throttler.io/released-at";
/// Annotation on a pod the webhook admitted at once under a gate rule: the process whose
/// limiter charged it, which therefore does not seed its windows with it again.
pub const ADMITTED_BY_ANNOTATION: &str = "churn-throttler.io/admitted-by";
/// Annotation holding the partition a writer asked for while churn-throttler holds it.
pub const PARTITION_TARGET_ANNOTATION: &str = "churn-throttler.io/partition-target";
/// Annotation holding the partition churn-throttler set; an update that writes the same
/// value into both is a release step, not a writer moving the target.
pub const PARTITION_HELD_ANNOTATION: &str = "churn-throttler.io/partition-held";
/// Annotation naming the rule that holds a StatefulSet's partition, for the releaser.
pub const PACED_BY_ANNOTATION: &str = "churn-throttler.io/paced-by";
/// Annotation with the time a paced rollout was first held (RFC 3339, milliseconds).
pub const PARTITION_HELD_SINCE_ANNOTATION: &str = "churn-throttler.io/partition-held-since";
/// Annotation with the times of the releaser's recent steps (comma-separated RFC 3339):
/// the record window seeding rebuilds the windows from after a restart.
pub const PARTITION_STEPPED_AT_ANNOTATION: &str = "churn-throttler.io/partition-stepped-at";
/// On the releaser's Lease: the network window when the leader last renewed, where a new
/// leader starts from.
pub const NETWORK_WINDOW_ANNOTATION: &str = "churn-throttler.io/network-window";
/// On the releaser's Lease: the uids of the PacingOverride objects (pauses, overrides)
/// the leader applies, comma-separated; `churn-throttler pause` waits for its own.
pub const PACING_NOTE_ANNOTATION: &str = "churn-throttler.io/pacing-overrides";
/// Annotation on a pod or StatefulSet released by hand with `churn-throttler release`:
/// who (as the API server or the kubeconfig names them) and when.
pub const RELEASED_BY_ANNOTATION: &str = "churn-throttler.io/released-by";
/// The field manager of the releaser's patches, for tools that read managedFields.
pub const FIELD_MANAGER: &str = "churn-throttler";
/// The reporting controller of the Events the releasers write.
pub const REPORTING_CONTROLLER: &str = "churn-throttler.io/releaser";
/// The reporting controller of the Events `churn-throttler release` writes.
pub const CLI_REPORTING_CONTROLLER: &str = "churn-throttler.io/cli";
/// Replica Leases are named this prefix + the replica's identity.
pub const LEASE_PREFIX: &str = "churn-throttler-replica-";
/// Label on replica Leases, so a replica lists exactly those.
pub const LEASE_LABEL: &str = "churn-throttler.io/replica-lease";

/// Milliseconds since the Unix epoch, the same count as `limiter::Millis` (which this
/// bottom module does not import).
type Millis = u64;

/// A Kubernetes timestamp in milliseconds (0 before the epoch).
pub fn millis(t: Timestamp) -> Millis {
    u64::try_from(t.as_millisecond()).unwrap_or(0)
}

/// RFC 3339 in UTC with milliseconds, e.g. 2026-01-02T03:04:05.678Z.
pub fn format_time(at: Millis) -> String {
    let at = i64::try_from(at).unwrap_or(i64::MAX);
    match Timestamp::from_millisecond(at) {
        Ok(t) => format!("{t:.3}"),
        Err(_) => format!("{:.3}", Timestamp::UNIX_EPOCH),
    }
}

/// The end of a pause, for messages: its time, or that none is in sight (`u64::MAX`).
pub fn format_pause_end(until: Millis) -> String {
    if until == Millis::MAX {
        "no end in sight (until `churn-throttler resume`, or a schedule window that stays open)"
            .to_string()
    } else {
        format_time(until)
    }
}

pub fn parse_time(text: &str) -> Option<Millis> {
    text.trim().parse::<Timestamp>().ok().map(millis)
}

pub fn parse_times(text: &str) -> Vec<Millis> {
    let mut times: Vec<Millis> = text.split(',').filter_map(parse_time).collect();
    times.sort_unstable();
    times
}

pub fn format_times(times: &[Millis]) -> String {
    times
        .iter()
        .map(|&t| format_time(t))
        .collect::<Vec<_>>()
        .join(",")
}

/// A map key as one JSON-pointer token (RFC 6901: `~` then `/` escaped).
pub fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

pub fn pointer(path: &str) -> PointerBuf {
    PointerBuf::parse(path).unwrap_or_default()
}

pub fn annotation_path(key: &str) -> String {
    format!("/metadata/annotations/{}", escape(key))
}

pub fn add(path: &str, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: pointer(path),
        value,
    })
}

pub fn test(path: &str, value: Value) -> PatchOperation {
    PatchOperation::Test(TestOperation {
        path: pointer(path),
        value,
    })
}

/// Adds entries to metadata.labels or metadata.annotations, creating the map if absent.
pub fn map_entries_ops(
    map: &str,
    map_exists: bool,
    entries: &[(&str, &str)],
) -> Vec<PatchOperation> {
    if map_exists {
        entries
            .iter()
            .flat_map(|(key, value)| map_entry_ops(map, true, key, value))
            .collect()
    } else {
        let object: serde_json::Map<String, Value> = entries
            .iter()
            .map(|(key, value)| (key.to_string(), json!(value)))
            .collect();
        vec![add(&format!("/metadata/{map}"), Value::Object(object))]
    }
}

/// Adds `key: value` to metadata.labels or metadata.annotations, creating the map if absent.
pub fn map_entry_ops(map: &str, map_exists: bool, key: &str, value: &str) -> Vec<PatchOperation> {
    if map_exists {
        vec![add(
            &format!("/metadata/{map}/{}", escape(key)),
            json!(value),
        )]
    } else {
        vec![add(&format!("/metadata/{map}"), json!({ key: value }))]
    }
}
