//! `churn-throttler release`: the emergency path, by hand. Lifts churn-throttler's gate of
//! pods now, or lets a held StatefulSet go to its target now, each with the patch shape the
//! releaser itself uses (a `resourceVersion` test: an object that changed since it was read
//! is refused and read again, never overwritten), an annotation saying who released it and
//! when, and an Event. The patches are pure functions of the object; the shell reads,
//! patches and writes the Events.
//!
//! A pod released here is marked `released` with `released-at` now, as the releaser marks
//! its own, so it counts in its rule's window and against maxNotReady afterwards. A
//! StatefulSet gets its partition set to the target with `partition-held` at the same
//! value, which the webhook takes for a releaser step (it would otherwise hold a lowered
//! partition again), and the hold's annotations go; its step record stays until the
//! releaser cleans it up, like after letting a rollout go.

use super::cluster::{Conn, CtlError};
use crate::limiter::Millis;
use crate::names::{
    add, annotation_path, format_time, CLI_REPORTING_CONTROLLER, GATED_LABEL, LABEL_GATED,
    RELEASED_BY_ANNOTATION,
};
use crate::objects::pods::{gate_index, release_patch};
use crate::objects::statefulsets::{let_go_patch, view, View};
use json_patch::Patch;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch as KubePatch, PatchParams, PostParams};
use kube::Resource;
use serde_json::json;

const PARTITION_PATH: &str = "/spec/updateStrategy/rollingUpdate/partition";
/// Tries of one object when it changes between the read and the patch.
const TRIES: usize = 5;

/// Why an object is not released.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReleased {
    #[error("does not carry churn-throttler's gate")]
    NotGated,
    #[error("is not held by churn-throttler (no churn-throttler.io/partition-target annotation)")]
    NotHeld,
    #[error("has a partition-target annotation that is not a number ({0:?})")]
    UnreadableTarget(String),
}

/// The value of `churn-throttler.io/released-by`.
pub fn released_by(who: &str, now: Millis) -> String {
    format!("{who} at {}", format_time(now))
}

/// Lifts churn-throttler's gate of `pod` now: the releaser's release patch (tests of the
/// resourceVersion and of the gate's position, the label set to `released`, `released-at`)
/// plus `released-by`.
pub fn pod_patch(pod: &Pod, who: &str, now: Millis) -> Result<Patch, NotReleased> {
    let index = gate_index(pod).ok_or(NotReleased::NotGated)?;
    let meta = &pod.metadata;
    let labelled = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(GATED_LABEL))
        .is_some_and(|v| v == LABEL_GATED);
    if !labelled {
        // Our gate without our label: not a pod the releaser queues; the test of the label
        // in the release patch would refuse it anyway.
        return Err(NotReleased::NotGated);
    }
    let has_annotations = meta.annotations.is_some();
    let rv = meta.resource_version.as_deref().unwrap_or_default();
    let mut patch = release_patch(rv, index, has_annotations, now);
    // release_patch has created the annotations map by now, if there was none.
    patch.0.push(add(
        &annotation_path(RELEASED_BY_ANNOTATION),
        json!(released_by(who, now)),
    ));
    Ok(patch)
}

/// Lets a held StatefulSet go to its target now: the releaser's let-go patch with the
/// partition set to the target (resourceVersion test, `partition-held` = the target,
/// `partition-target` and `partition-held-since` removed, the step record kept) plus
/// `released-by`. Returns the target too.
pub fn statefulset_patch(
    sts: &StatefulSet,
    who: &str,
    now: Millis,
) -> Result<(Patch, u32), NotReleased> {
    let View::Held(set) = view(sts) else {
        return Err(NotReleased::NotHeld);
    };
    let annotations = sts.metadata.annotations.clone().unwrap_or_default();
    let Some(target) = set.target else {
        let text = annotations
            .get(crate::names::PARTITION_TARGET_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        return Err(NotReleased::UnreadableTarget(text));
    };
    let mut patch = let_go_patch(&set.resource_version, target, &annotations, &set.stepped_at);
    // After the resourceVersion test: the partition, then who released it.
    patch.0.insert(1, add(PARTITION_PATH, json!(target)));
    patch.0.push(add(
        &annotation_path(RELEASED_BY_ANNOTATION),
        json!(released_by(who, now)),
    ));
    Ok((patch, target))
}

/// An Event on the released object (events.k8s.io/v1), from `churn-throttler.io/cli`.
pub fn hand_event(regarding: ObjectReference, note: String, who: &str, now: Millis) -> Event {
    let at = Timestamp::from_millisecond(i64::try_from(now).unwrap_or(i64::MAX))
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let name = regarding.name.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", at.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..Default::default()
        },
        action: Some("ReleaseByHand".into()),
        reason: Some("ReleasedByHand".into()),
        note: Some(note.chars().take(1000).collect()),
        type_: Some("Normal".into()),
        event_time: Some(MicroTime(at)),
        regarding: Some(regarding),
        reporting_controller: Some(CLI_REPORTING_CONTROLLER.into()),
        reporting_instance: Some(who.chars().take(128).collect()),
        ..Default::default()
    }
}

fn reference<K: Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    let meta = object.meta();
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        ..Default::default()
    }
}

/// What one release did, for the caller's lines and exit code.
#[derive(Debug, Default)]
pub struct Outcome {
    pub released: usize,
    pub skipped: usize,
    pub failed: usize,
}

/// Lifts the gate of the named pods of `namespace`, or of every gated pod there (every
/// namespace with `all`). One line per pod on stdout.
pub async fn pods(
    conn: &Conn,
    namespace: Option<&str>,
    names: &[String],
    who: &str,
) -> Result<Outcome, CtlError> {
    let api: Api<Pod> = match namespace {
        Some(ns) => Api::namespaced(conn.client.clone(), ns),
        None => Api::all(conn.client.clone()),
    };
    let targets: Vec<Pod> = if names.is_empty() {
        let selector = format!("{GATED_LABEL}={LABEL_GATED}");
        let list = conn
            .call(
                "list gated pods",
                api.list(&ListParams::default().labels(&selector)),
            )
            .await?;
        list.items
    } else {
        let mut pods = Vec::new();
        for name in names {
            pods.push(conn.call(&format!("get pod {name}"), api.get(name)).await?);
        }
        pods
    };
    let mut outcome = Outcome::default();
    for pod in targets {
        let what = format!(
            "pod {}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        match release_one(conn, pod, who, pod_patch).await {
            Ok(pod) => {
                outcome.released += 1;
                println!("{what}: gate lifted (released by {who})");
                let note = format!(
                    "churn-throttler's scheduling gate lifted by hand by {who} (churn-throttler \
                     release): the pod starts now, outside its rule's pacing; it counts in the \
                     rule's window and against maxNotReady from now on"
                );
                write_event(conn, hand_event(reference(&pod), note, who, now())).await;
            }
            Err(Failure::Not(why)) => {
                outcome.skipped += 1;
                println!("{what}: skipped, it {why}");
            }
            Err(Failure::Api(e)) => {
                outcome.failed += 1;
                println!("{what}: not released: {e}");
            }
        }
    }
    Ok(outcome)
}

/// Lets the named StatefulSet (or every held one of the namespace, every namespace with
/// `all`) go to its target now.
pub async fn statefulsets(
    conn: &Conn,
    namespace: Option<&str>,
    name: Option<&str>,
    who: &str,
) -> Result<Outcome, CtlError> {
    let api: Api<StatefulSet> = match namespace {
        Some(ns) => Api::namespaced(conn.client.clone(), ns),
        None => Api::all(conn.client.clone()),
    };
    let targets: Vec<StatefulSet> = match name {
        Some(name) => vec![
            conn.call(&format!("get statefulset {name}"), api.get(name))
                .await?,
        ],
        None => conn
            .call("list statefulsets", api.list(&ListParams::default()))
            .await?
            .items
            .into_iter()
            .filter(|s| matches!(view(s), View::Held(_)))
            .collect(),
    };
    let mut outcome = Outcome::default();
    for sts in targets {
        let what = format!(
            "statefulset {}/{}",
            sts.metadata.namespace.as_deref().unwrap_or_default(),
            sts.metadata.name.as_deref().unwrap_or_default()
        );
        let patch_of = |s: &StatefulSet, who: &str, now: Millis| {
            statefulset_patch(s, who, now).map(|(patch, _)| patch)
        };
        match release_one(conn, sts, who, patch_of).await {
            Ok(sts) => {
                outcome.released += 1;
                let partition = sts
                    .spec
                    .as_ref()
                    .and_then(|s| s.update_strategy.as_ref())
                    .and_then(|s| s.rolling_update.as_ref())
                    .and_then(|r| r.partition)
                    .unwrap_or(0);
                println!("{what}: let go at partition {partition} (released by {who})");
                let note = format!(
                    "churn-throttler's hold of this rollout ended by hand by {who} (churn-throttler \
                     release): the partition is its target {partition} now, the remaining pods roll \
                     at the StatefulSet controller's own pace"
                );
                write_event(conn, hand_event(reference(&sts), note, who, now())).await;
            }
            Err(Failure::Not(why)) => {
                outcome.skipped += 1;
                println!("{what}: skipped, it {why}");
            }
            Err(Failure::Api(e)) => {
                outcome.failed += 1;
                println!("{what}: not released: {e}");
            }
        }
    }
    Ok(outcome)
}

enum Failure {
    Not(NotReleased),
    Api(CtlError),
}

fn now() -> Millis {
    crate::shared::now_millis()
}

/// Patches `object` with `patch_of` (under churn-throttler's field manager), reading it
/// again when it changed in between (the resourceVersion test fails: 422, or 409).
async fn release_one<K>(
    conn: &Conn,
    mut object: K,
    who: &str,
    patch_of: impl Fn(&K, &str, Millis) -> Result<Patch, NotReleased>,
) -> Result<K, Failure>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    let name = object.meta().name.clone().unwrap_or_default();
    let api: Api<K> = Api::namespaced(conn.client.clone(), &namespace);
    let params = PatchParams {
        field_manager: Some(crate::names::FIELD_MANAGER.into()),
        ..Default::default()
    };
    for attempt in 1..=TRIES {
        let patch = patch_of(&object, who, now()).map_err(Failure::Not)?;
        let patch = KubePatch::<()>::Json(patch);
        let sent = api.patch(&name, &params, &patch);
        match conn.call(&format!("patch {name}"), sent).await {
            Ok(patched) => return Ok(patched),
            Err(CtlError::Conflict(_)) if attempt < TRIES => {
                object = conn
                    .call(&format!("get {name}"), api.get(&name))
                    .await
                    .map_err(Failure::Api)?;
            }
            Err(e) => return Err(Failure::Api(e)),
        }
    }
    Err(Failure::Api(CtlError::Other(format!(
        "{name} kept changing; {TRIES} tries"
    ))))
}

async fn write_event(conn: &Conn, event: Event) {
    let namespace = event.metadata.namespace.clone().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(conn.client.clone(), &namespace);
    if let Err(e) = conn
        .call("create event", api.create(&PostParams::default(), &event))
        .await
    {
        eprintln!("churn-throttler release: the Event was not written: {e}");
    }
}
