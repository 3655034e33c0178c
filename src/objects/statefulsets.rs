//! What the partition releaser reads from a StatefulSet (and from the pod its last step
//! released) and the JSON patches it writes back. Pure: objects in, plan inputs or a patch out.

use crate::admission::max_unavailable;
use crate::limiter::Millis;
use crate::names::{
    add, annotation_path, format_times, parse_time, parse_times, pointer, PACED_BY_ANNOTATION,
    PARTITION_HELD_ANNOTATION, PARTITION_HELD_SINCE_ANNOTATION, PARTITION_STEPPED_AT_ANNOTATION,
    PARTITION_TARGET_ANNOTATION,
};
use crate::pacing::partition::{HeldSet, Record, Released};
use json_patch::{Patch, PatchOperation, RemoveOperation, TestOperation};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use std::collections::BTreeMap;

/// The label the StatefulSet controller puts on each pod: the revision it was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

const PARTITION_PATH: &str = "/spec/updateStrategy/rollingUpdate/partition";

/// The annotations of a hold, dropped when it ends.
const HOLD_KEYS: [&str; 3] = [
    PARTITION_TARGET_ANNOTATION,
    PARTITION_HELD_ANNOTATION,
    PARTITION_HELD_SINCE_ANNOTATION,
];
/// The record kept after a hold until its steps leave every window.
const RECORD_KEYS: [&str; 2] = [PACED_BY_ANNOTATION, PARTITION_STEPPED_AT_ANNOTATION];

/// How the releaser sees one StatefulSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum View {
    Held(HeldSet),
    Record(Record),
    Ignored,
}

fn count(v: Option<i32>) -> u32 {
    v.unwrap_or(0).max(0) as u32
}

pub fn view(sts: &StatefulSet) -> View {
    let meta = &sts.metadata;
    let empty = BTreeMap::new();
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let get = |key: &str| annotations.get(key).map(String::as_str);
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let uid = meta.uid.clone().unwrap_or_default();
    let rule = get(PACED_BY_ANNOTATION).unwrap_or_default().to_string();
    let stepped_at = get(PARTITION_STEPPED_AT_ANNOTATION)
        .map(parse_times)
        .unwrap_or_default();
    let Some(target) = get(PARTITION_TARGET_ANNOTATION) else {
        let ours = HOLD_KEYS
            .iter()
            .chain(RECORD_KEYS.iter())
            .any(|k| get(k).is_some());
        return if ours {
            View::Record(Record {
                namespace,
                name,
                uid,
                rule,
                stepped_at,
            })
        } else {
            View::Ignored
        };
    };
    let spec = sts.spec.as_ref();
    let strategy = spec.and_then(|s| s.update_strategy.as_ref());
    let rolling_update = strategy
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate");
    let replicas = spec.map_or(1, |s| s.replicas.unwrap_or(1).max(0) as u32);
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    let partition = count(rolling.and_then(|r| r.partition));
    let max_unavailable =
        max_unavailable(rolling.and_then(|r| r.max_unavailable.as_ref()), replicas);
    let status = sts.status.as_ref();
    let observed = status.and_then(|s| s.observed_generation).unwrap_or(0);
    let nothing_to_roll = status.is_some_and(|s| {
        observed >= meta.generation.unwrap_or(0)
            && s.update_revision.is_some()
            && count(s.updated_replicas) >= replicas
            && count(Some(s.replicas)) == replicas
    });
    let mut held = HeldSet {
        namespace,
        name,
        uid,
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        rule,
        rolling_update,
        replicas,
        partition,
        target: target.trim().parse().ok(),
        held: get(PARTITION_HELD_ANNOTATION).and_then(|v| v.trim().parse().ok()),
        stepped_at,
        held_since: get(PARTITION_HELD_SINCE_ANNOTATION).and_then(parse_time),
        released: Released::None,
        earlier: Vec::new(),
        max_unavailable,
        nothing_to_roll,
        backoff: false,
    };
    // The shell looks at the released pods before planning; until then they are in flight.
    held.unlooked();
    View::Held(held)
}

/// The name of the pod at `ordinal` (counted from `ordinals.start`): the pod a step to
/// that partition released.
pub fn released_pod_name(sts: &StatefulSet, partition: u32) -> String {
    let start = sts
        .spec
        .as_ref()
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .unwrap_or(0)
        .max(0) as u64;
    format!(
        "{}-{}",
        sts.metadata.name.as_deref().unwrap_or_default(),
        start + u64::from(partition)
    )
}

/// The revision pods must have to count as updated, once the controller has seen the spec.
pub fn update_revision(sts: &StatefulSet) -> Option<&str> {
    let status = sts.status.as_ref()?;
    if status.observed_generation.unwrap_or(0) < sts.metadata.generation.unwrap_or(0) {
        return None;
    }
    status.update_revision.as_deref()
}

/// How far the step's pod has come: the old pod's deletion (what the deletion windows
/// count), then its replacement from the update revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodProgress {
    /// Still the old pod, not being deleted: the step has not taken effect yet.
    NotDeleted,
    /// The old pod is being deleted or gone; no replacement from the update revision
    /// yet (or it is being deleted too).
    Deleted,
    /// Re-created from the update revision (perhaps still behind the gate), not Ready.
    Updated,
    /// Re-created from the update revision and Ready.
    Ready,
}

/// What a GET of the step's pod shows (None: the pod does not exist).
pub fn pod_progress(pod: Option<&Pod>, update_revision: &str) -> PodProgress {
    let Some(pod) = pod else {
        return PodProgress::Deleted;
    };
    let updated = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REVISION_LABEL))
        .is_some_and(|r| r == update_revision);
    match (updated, pod.metadata.deletion_timestamp.is_some()) {
        (_, true) => return PodProgress::Deleted,
        (false, false) => return PodProgress::NotDeleted,
        (true, false) => {}
    }
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if ready {
        PodProgress::Ready
    } else {
        PodProgress::Updated
    }
}

fn test_version(resource_version: &str) -> PatchOperation {
    PatchOperation::Test(TestOperation {
        path: pointer("/metadata/resourceVersion"),
        value: json!(resource_version),
    })
}

/// Removes those of `keys` the object has (removing a missing member fails a patch).
fn remove_present<'a>(
    annotations: &BTreeMap<String, String>,
    keys: impl IntoIterator<Item = &'a str>,
) -> Vec<PatchOperation> {
    keys.into_iter()
        .filter(|k| annotations.contains_key(*k))
        .map(|k| {
            PatchOperation::Remove(RemoveOperation {
                path: pointer(&annotation_path(k)),
            })
        })
        .collect()
}

/// One step: the partition and `partition-held` go to `to` together, which the
/// webhook recognises as the releaser's step; `record`, when given, is the new value of
/// `partition-stepped-at`. The test op makes the API server refuse the patch (HTTP 422)
/// when the set changed since it was read: a conflict is retried on a later round,
/// never overwritten.
pub fn step_patch(resource_version: &str, to: u32, record: Option<&[Millis]>) -> Patch {
    let mut ops = vec![
        test_version(resource_version),
        add(PARTITION_PATH, json!(to)),
        add(
            &annotation_path(PARTITION_HELD_ANNOTATION),
            json!(to.to_string()),
        ),
    ];
    if let Some(times) = record {
        ops.push(add(
            &annotation_path(PARTITION_STEPPED_AT_ANNOTATION),
            json!(format_times(times)),
        ));
    }
    Patch(ops)
}

/// The end of a hold at its target: the webhook lets this through because the partition
/// already is the target. A non-empty `record` (step times still inside a window) stays
/// in `partition-stepped-at`, with `paced-by`, until it leaves the window.
pub fn finish_patch(
    resource_version: &str,
    annotations: &BTreeMap<String, String>,
    record: &[Millis],
) -> Patch {
    let mut ops = vec![test_version(resource_version)];
    ops.extend(remove_present(annotations, HOLD_KEYS));
    ops.extend(record_ops(annotations, record));
    Patch(ops)
}

fn record_ops(annotations: &BTreeMap<String, String>, record: &[Millis]) -> Vec<PatchOperation> {
    if record.is_empty() {
        remove_present(annotations, RECORD_KEYS)
    } else {
        vec![add(
            &annotation_path(PARTITION_STEPPED_AT_ANNOTATION),
            json!(format_times(record)),
        )]
    }
}

/// Stops pacing and leaves the partition as it is. Setting `partition-held` to the
/// partition in the same patch makes it a releaser step for the webhook, which would
/// otherwise hold a partition above the target again; that annotation is cleaned up
/// later with the rest of the record.
pub fn let_go_patch(
    resource_version: &str,
    partition: u32,
    annotations: &BTreeMap<String, String>,
    record: &[Millis],
) -> Patch {
    let mut ops = vec![
        test_version(resource_version),
        add(
            &annotation_path(PARTITION_HELD_ANNOTATION),
            json!(partition.to_string()),
        ),
    ];
    ops.extend(remove_present(
        annotations,
        [PARTITION_TARGET_ANNOTATION, PARTITION_HELD_SINCE_ANNOTATION],
    ));
    ops.extend(record_ops(annotations, record));
    Patch(ops)
}

/// Drops what is left of a finished hold once its steps are out of every window.
pub fn cleanup_patch(resource_version: &str, annotations: &BTreeMap<String, String>) -> Patch {
    let mut ops = vec![test_version(resource_version)];
    ops.extend(remove_present(
        annotations,
        HOLD_KEYS.into_iter().chain(RECORD_KEYS),
    ));
    Patch(ops)
}

/// When the step's deletion counts, no earlier than the DELETE that carried it out:
/// when it was seen (`seen`, read after the answer), or sooner from the API server's
/// stamps, for a deletion that happened long before a new leader first looks: a
/// replacement's creationTimestamp (it is created after the old pod is gone) or the old
/// pod's deletionTimestamp less its grace period (the DELETE's time), each rounded up
/// to the next second, as the stamps are truncated to seconds. Skew between the API
/// server's clock and this replica's shifts the second bound by as much.
pub fn deleted_by(pod: Option<&Pod>, seen: Millis) -> Millis {
    let Some(meta) = pod.map(|p| &p.metadata) else {
        return seen;
    };
    let millis = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        u64::try_from(t.0.as_millisecond()).ok()
    };
    let stamp = match (&meta.deletion_timestamp, &meta.creation_timestamp) {
        (Some(deleting), _) => {
            let grace = meta.deletion_grace_period_seconds.unwrap_or(0).max(0) as u64;
            millis(deleting).map(|t| t.saturating_sub(grace * 1_000))
        }
        (None, Some(created)) => millis(created),
        (None, None) => None,
    };
    stamp.map_or(seen, |t| seen.min(t - t % 1_000 + 1_000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn sts(annotations: Value, spec_extra: Value, status: Value) -> StatefulSet {
        let mut spec = json!({
            "replicas": 3,
            "selector": { "matchLabels": { "app": "db" } },
            "template": { "metadata": { "labels": { "app": "db" } }, "spec": { "containers": [{ "name": "c" }] } },
            "updateStrategy": { "type": "RollingUpdate", "rollingUpdate": { "partition": 2 } }
        });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
            for (k, v) in extra {
                spec.insert(k.clone(), v.clone());
            }
        }
        serde_json::from_value(json!({
            "metadata": {
                "namespace": "shop", "name": "db", "uid": "u1", "resourceVersion": "42",
                "generation": 7, "annotations": annotations
            },
            "spec": spec,
            "status": status
        }))
        .expect("statefulset json")
    }

    fn held_annotations() -> Value {
        json!({
            PARTITION_TARGET_ANNOTATION: "0",
            PARTITION_HELD_ANNOTATION: "2",
            PACED_BY_ANNOTATION: "rollouts",
            PARTITION_HELD_SINCE_ANNOTATION: "2026-01-02T03:04:05.000Z",
            PARTITION_STEPPED_AT_ANNOTATION: "2026-01-02T03:04:15.000Z,2026-01-02T03:04:10.500Z",
            "other": "kept"
        })
    }

    fn rolling_status(updated: i32) -> Value {
        json!({
            "replicas": 3, "observedGeneration": 7, "updatedReplicas": updated,
            "readyReplicas": 3, "updateRevision": "db-new", "currentRevision": "db-old"
        })
    }

    #[test]
    fn table_of_views() {
        let t0 = 1_767_323_045_000;
        match view(&sts(held_annotations(), json!({}), rolling_status(1))) {
            View::Held(h) => {
                assert_eq!(
                    (h.partition, h.target, h.held, h.replicas),
                    (2, Some(0), Some(2), 3)
                );
                assert_eq!(h.rule, "rollouts");
                assert_eq!(h.stepped_at, vec![t0 + 5_500, t0 + 10_000], "sorted");
                assert_eq!(h.held_since, Some(t0));
                assert_eq!(h.released, Released::InFlight);
                assert!(h.rolling_update && !h.nothing_to_roll && !h.backoff);
                assert_eq!(h.resource_version, "42");
            }
            other => panic!("{other:?}"),
        }
        // (case, annotations, spec, status, what to expect)
        type Check = fn(&View) -> bool;
        let cases: Vec<(&str, Value, Value, Value, Check)> = vec![
            (
                "every pod at the update revision: nothing to roll",
                held_annotations(),
                json!({}),
                rolling_status(3),
                |v| matches!(v, View::Held(h) if h.nothing_to_roll),
            ),
            (
                "status of an older generation proves nothing",
                held_annotations(),
                json!({}),
                json!({ "replicas": 3, "observedGeneration": 6, "updatedReplicas": 3, "updateRevision": "r" }),
                |v| matches!(v, View::Held(h) if !h.nothing_to_roll),
            ),
            (
                "partition at replicas: nothing released yet",
                held_annotations(),
                json!({ "updateStrategy": { "type": "RollingUpdate", "rollingUpdate": { "partition": 3 } } }),
                rolling_status(0),
                |v| matches!(v, View::Held(h) if h.released == Released::None),
            ),
            (
                "OnDelete",
                held_annotations(),
                json!({ "updateStrategy": { "type": "OnDelete" } }),
                json!({ "replicas": 3 }),
                |v| matches!(v, View::Held(h) if !h.rolling_update && h.partition == 0),
            ),
            (
                "only a record left",
                json!({ PACED_BY_ANNOTATION: "rollouts", PARTITION_STEPPED_AT_ANNOTATION: "2026-01-02T03:04:15.000Z" }),
                json!({}),
                json!({ "replicas": 3 }),
                |v| matches!(v, View::Record(r) if r.stepped_at.len() == 1 && r.rule == "rollouts"),
            ),
            (
                "a held annotation left by letting go",
                json!({ PARTITION_HELD_ANNOTATION: "2" }),
                json!({}),
                json!({ "replicas": 3 }),
                |v| matches!(v, View::Record(r) if r.stepped_at.is_empty()),
            ),
            (
                "not ours",
                json!({ "other": "x" }),
                json!({}),
                json!({ "replicas": 3 }),
                |v| *v == View::Ignored,
            ),
            (
                "garbage target",
                json!({ PARTITION_TARGET_ANNOTATION: "zero" }),
                json!({}),
                json!({ "replicas": 3 }),
                |v| matches!(v, View::Held(h) if h.target.is_none() && h.held.is_none()),
            ),
        ];
        for (case, annotations, spec, status, check) in cases {
            let v = view(&sts(annotations, spec, status));
            assert!(check(&v), "{case}: {v:?}");
        }
    }

    #[test]
    fn table_of_max_unavailable() {
        // (case, rollingUpdate.maxUnavailable, replicas, k, looked-at pods at partition 1)
        let cases: Vec<(&str, Option<Value>, i32, u32, usize)> = vec![
            (
                "absent (what the API server leaves with the feature gate off)",
                None,
                5,
                1,
                1,
            ),
            ("1", Some(json!(1)), 5, 1, 1),
            ("3", Some(json!(3)), 5, 3, 3),
            (
                "\"50%\" of 5: 2, rounded down as the controller does",
                Some(json!("50%")),
                5,
                2,
                2,
            ),
            (
                "\"10%\" of 5 rounds down to 0: at least 1",
                Some(json!("10%")),
                5,
                1,
                1,
            ),
            (
                "\"0\": a string that is not a percentage, which the controller refuses",
                Some(json!("0")),
                5,
                1,
                1,
            ),
            ("not a number", Some(json!("three%")), 5, 1, 1),
            ("0", Some(json!(0)), 5, 1, 1),
            ("negative", Some(json!(-2)), 5, 1, 1),
            (
                "above the replicas: the looked-at pods stop at replicas",
                Some(json!(8)),
                5,
                8,
                4,
            ),
            (
                "\"100%\" of 40: 40, the looked-at pods capped at 10",
                Some(json!("100%")),
                40,
                40,
                10,
            ),
        ];
        for (case, value, replicas, k, looked) in cases {
            let mut rolling = json!({ "partition": 1 });
            if let Some(v) = value {
                rolling["maxUnavailable"] = v;
            }
            let spec = json!({
                "replicas": replicas,
                "updateStrategy": { "type": "RollingUpdate", "rollingUpdate": rolling }
            });
            let View::Held(h) = view(&sts(held_annotations(), spec, rolling_status(1))) else {
                panic!("{case}: not held");
            };
            assert_eq!(h.max_unavailable, k, "{case}");
            assert_eq!(h.looked().count(), looked, "{case}: looked-at pods");
            assert!(
                h.looked().all(|r| r == Released::InFlight),
                "{case}: in flight until looked at"
            );
        }
    }

    #[test]
    fn released_pods_are_named_by_ordinal_and_judged_by_revision_and_readiness() {
        let s = sts(held_annotations(), json!({}), rolling_status(1));
        assert_eq!(released_pod_name(&s, 2), "db-2");
        let s = sts(
            held_annotations(),
            json!({ "ordinals": { "start": 5 } }),
            rolling_status(1),
        );
        assert_eq!(released_pod_name(&s, 2), "db-7");
        assert_eq!(update_revision(&s), Some("db-new"));
        let stale = sts(
            held_annotations(),
            json!({}),
            json!({ "replicas": 3, "observedGeneration": 6, "updateRevision": "db-new" }),
        );
        assert_eq!(
            update_revision(&stale),
            None,
            "controller has not seen the step"
        );

        let pod = |revision: &str, ready: &str, deleting: bool| -> Pod {
            let mut p: Pod = serde_json::from_value(json!({
                "metadata": { "name": "db-2", "labels": { REVISION_LABEL: revision } },
                "status": { "conditions": [{ "type": "Ready", "status": ready }] }
            }))
            .expect("pod json");
            if deleting {
                p.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ));
            }
            p
        };
        // (case, pod, progress)
        let cases = [
            (
                "updated and Ready",
                pod("db-new", "True", false),
                PodProgress::Ready,
            ),
            (
                "old revision, Ready",
                pod("db-old", "True", false),
                PodProgress::NotDeleted,
            ),
            (
                "old revision, being deleted",
                pod("db-old", "True", true),
                PodProgress::Deleted,
            ),
            (
                "updated, not Ready",
                pod("db-new", "False", false),
                PodProgress::Updated,
            ),
            (
                "updated, Ready, being deleted",
                pod("db-new", "True", true),
                PodProgress::Deleted,
            ),
        ];
        for (case, p, want) in cases {
            assert_eq!(pod_progress(Some(&p), "db-new"), want, "{case}");
        }
        assert_eq!(pod_progress(None, "db-new"), PodProgress::Deleted, "gone");
    }

    fn apply(s: &StatefulSet, patch: &Patch) -> Result<Value, json_patch::PatchError> {
        let mut doc = serde_json::to_value(s).expect("json");
        json_patch::patch(&mut doc, patch)?;
        Ok(doc)
    }

    fn annotations_of(s: &StatefulSet) -> BTreeMap<String, String> {
        s.metadata.annotations.clone().unwrap_or_default()
    }

    #[test]
    fn a_step_moves_the_partition_and_the_held_annotation_together() {
        let s = sts(held_annotations(), json!({}), rolling_status(1));
        let doc = apply(&s, &step_patch("42", 1, Some(&[0, 1_500]))).expect("applies");
        assert_eq!(
            doc["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
            1
        );
        let a = &doc["metadata"]["annotations"];
        assert_eq!(a[PARTITION_HELD_ANNOTATION], "1");
        assert_eq!(
            a[PARTITION_STEPPED_AT_ANNOTATION],
            "1970-01-01T00:00:00.000Z,1970-01-01T00:00:01.500Z"
        );
        assert_eq!(a[PARTITION_TARGET_ANNOTATION], "0");
        assert_eq!(a["other"], "kept");
        assert!(
            apply(&s, &step_patch("41", 1, None)).is_err(),
            "stale resourceVersion"
        );
        let doc = apply(&s, &step_patch("42", 0, None)).expect("applies");
        assert_eq!(
            doc["metadata"]["annotations"][PARTITION_STEPPED_AT_ANNOTATION],
            "2026-01-02T03:04:15.000Z,2026-01-02T03:04:10.500Z",
            "an uncharged step leaves the record alone"
        );
    }

    #[test]
    fn finishing_letting_go_and_cleaning_up_remove_only_what_is_there() {
        let s = sts(held_annotations(), json!({}), rolling_status(3));
        let a = annotations_of(&s);
        let keys = |doc: &Value| -> Vec<String> {
            doc["metadata"]["annotations"]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default()
        };
        let doc = apply(&s, &finish_patch("42", &a, &[1_500])).expect("applies");
        assert_eq!(
            keys(&doc),
            vec![
                PACED_BY_ANNOTATION.to_string(),
                PARTITION_STEPPED_AT_ANNOTATION.to_string(),
                "other".to_string()
            ]
        );
        assert_eq!(
            doc["metadata"]["annotations"][PARTITION_STEPPED_AT_ANNOTATION],
            "1970-01-01T00:00:01.500Z"
        );
        let doc = apply(&s, &finish_patch("42", &a, &[])).expect("applies");
        assert_eq!(keys(&doc), vec!["other".to_string()]);
        assert_eq!(
            doc["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
            2
        );

        let doc = apply(&s, &let_go_patch("42", 2, &a, &[])).expect("applies");
        assert_eq!(
            keys(&doc),
            vec![PARTITION_HELD_ANNOTATION.to_string(), "other".to_string()]
        );
        assert_eq!(
            doc["metadata"]["annotations"][PARTITION_HELD_ANNOTATION],
            "2"
        );

        let mut sparse = s.clone();
        sparse.metadata.annotations = Some(BTreeMap::from([
            (PARTITION_HELD_ANNOTATION.to_string(), "2".to_string()),
            ("other".to_string(), "kept".to_string()),
        ]));
        let doc = apply(&sparse, &cleanup_patch("42", &annotations_of(&sparse))).expect("applies");
        assert_eq!(keys(&doc), vec!["other".to_string()]);
        assert!(apply(&sparse, &cleanup_patch("7", &annotations_of(&sparse))).is_err());
    }

    #[test]
    fn step_times_round_trip() {
        let times = vec![1_767_323_045_000, 1_767_323_046_250];
        assert_eq!(parse_times(&format_times(&times)), times);
        assert_eq!(
            parse_times("garbage,2026-01-02T03:04:05Z"),
            vec![1_767_323_045_000]
        );
        assert!(parse_times("").is_empty());
    }

    #[test]
    fn a_deletion_counts_from_when_it_was_seen_or_the_second_after_its_stamps() {
        let pod = |created: Option<&str>, deleting: Option<(&str, i64)>| -> Pod {
            let mut meta = serde_json::json!({ "name": "db-2" });
            if let Some(c) = created {
                meta["creationTimestamp"] = serde_json::json!(c);
            }
            if let Some((d, grace)) = deleting {
                meta["deletionTimestamp"] = serde_json::json!(d);
                meta["deletionGracePeriodSeconds"] = serde_json::json!(grace);
            }
            serde_json::from_value(serde_json::json!({ "metadata": meta })).expect("pod json")
        };
        let t = 1_767_323_045_000; // 2026-01-02T03:04:05Z
        let old = Some("2026-01-01T00:00:00Z");
        // (case, pod, seen at, counted from)
        let cases = [
            (
                "old pod deleting, seen at once",
                Some(pod(old, Some(("2026-01-02T03:04:35Z", 30)))),
                t + 300,
                t + 300,
            ),
            (
                "old pod deleting, seen by a new leader 50 s on: the DELETE's second + 1 s",
                Some(pod(old, Some(("2026-01-02T03:04:35Z", 30)))),
                t + 50_000,
                t + 1_000,
            ),
            (
                "replacement seen long after: the second after its creation",
                Some(pod(Some("2026-01-02T03:04:05Z"), None)),
                t + 60_000,
                t + 1_000,
            ),
            ("gone", None, t + 60_000, t + 60_000),
            ("no stamps", Some(pod(None, None)), t + 60_000, t + 60_000),
        ];
        for (case, p, seen, want) in cases {
            assert_eq!(deleted_by(p.as_ref(), seen), want, "{case}");
        }
    }
}
