//! Every `serve` replica's watch of the PacingOverride objects (pauses and overrides) in
//! its own namespace: hands those in force to the policy cell, so webhook decisions and
//! both releasers follow them. The releasers' leader records what it applies on its Lease
//! (for `pause` to wait on) and deletes expired objects.
//!
//! A missing CRD or missing rights block nothing: the failure is logged (first, then at
//! powers of two) and counted, and the replica runs as if there were none. A malformed
//! object is ignored with a log line, a metric and an Event, once per version.

use crate::budget::GateRole;
use crate::election::{within, Notes};
use crate::metrics::OverrideMetrics;
use crate::names::PACING_NOTE_ANNOTATION;
use crate::objects::overrides::{api_resource, changes, read, Live, Read};
use crate::pacing::schedule::Adjustment;
use crate::shared::{now_millis, stopped, KubeClient, PolicyCell, RoleCell};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::runtime::reflector::{store::Writer, Store};
use kube::runtime::{watcher, WatchStreamExt};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the objects are read again without a change (expiry, leadership, clean-up).
const TICK: Duration = Duration::from_secs(2);
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Context {
    pub policy: Arc<PolicyCell>,
    pub role: Arc<RoleCell>,
    pub kube: Arc<KubeClient>,
    /// The namespace watched (churn-throttler's own).
    pub namespace: String,
    /// The releaser's Lease notes, when this process runs a releaser.
    pub notes: Option<Arc<Notes>>,
    pub metrics: OverrideMetrics,
    pub identity: String,
}

pub async fn run(ctx: Context, mut shutdown: watch::Receiver<bool>) {
    let Some(client) = ctx
        .kube
        .get(
            &mut shutdown,
            "pauses and overrides: no Kubernetes client yet; none applies meanwhile",
        )
        .await
    else {
        return;
    };
    let resource = api_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ctx.namespace, &resource);
    let writer = Writer::new(resource.clone());
    let reader: Store<DynamicObject> = writer.as_reader();
    let stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    let mut failures: u32 = 0;
    let mut told: HashSet<(String, String)> = HashSet::new();
    let mut deleting: HashSet<String> = HashSet::new();
    // The objects in force at the last pass (with their references, for an Event after
    // they are gone), and whether this replica led then: a new leader tells no change it
    // did not see happen.
    let mut known: BTreeMap<String, (Live, ObjectReference)> = BTreeMap::new();
    let mut was_leader = false;
    tracing::info!(namespace = %ctx.namespace, "pauses and overrides: watching PacingOverride objects");
    loop {
        tokio::select! {
            item = stream.next() => match item {
                None => return,
                Some(Ok(_)) => failures = 0,
                Some(Err(e)) => {
                    failures += 1;
                    ctx.metrics.watch_errors.inc();
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures,
                            "pauses and overrides: listing or watching PacingOverride objects failed \
                             (is the CRD installed, may the ServiceAccount list them?); none applies \
                             meanwhile, retrying with back-off");
                    }
                }
            },
            _ = tokio::time::sleep(TICK) => {}
            _ = stopped(&mut shutdown) => return,
        }
        let now = now_millis();
        let objects = reader.state();
        let mut live = Vec::new();
        let mut expired = Vec::new();
        for object in &objects {
            match read(object, now) {
                Read::Live(l) => live.push(l),
                Read::Expired { name, .. } => expired.push(name),
                Read::Ignored { name, reason } => {
                    let version = object.metadata.resource_version.clone().unwrap_or_default();
                    if told.insert((name.clone(), version)) {
                        ctx.metrics.ignored.inc();
                        tracing::warn!(object = %format!("{}/{name}", ctx.namespace), %reason,
                            "pauses and overrides: a PacingOverride is malformed and ignored");
                        if leads(&ctx) {
                            let note = format!(
                                "ignored: {reason}; no pause or override applies from this object"
                            );
                            let regarding = reference(object, &ctx.namespace);
                            event(&client, &ctx, regarding, "PacingOverrideIgnored", note).await;
                        }
                    }
                }
            }
        }
        told.retain(|(name, _)| {
            objects
                .iter()
                .any(|o| o.metadata.name.as_ref() == Some(name))
        });
        let pauses = live
            .iter()
            .filter(|l| matches!(l.scoped.adjustment, Adjustment::Pause { .. }))
            .count();
        ctx.metrics
            .live
            .with_label_values(&["pause"])
            .set(pauses as i64);
        ctx.metrics
            .live
            .with_label_values(&["override"])
            .set((live.len() - pauses) as i64);
        let scoped: Vec<_> = live.iter().map(|l| l.scoped.clone()).collect();
        if *ctx.policy.adjustments() != scoped {
            tracing::info!(
                in_force = ?live.iter().map(|l| &l.name).collect::<Vec<_>>(),
                "pauses and overrides: the limits in force follow these PacingOverride objects"
            );
            ctx.policy.set_adjustments(scoped);
        }
        if let Some(notes) = &ctx.notes {
            // What the leader applies, for `pause` to wait on: the objects' uids.
            let mut uids: Vec<String> = objects
                .iter()
                .filter(|o| {
                    live.iter()
                        .any(|l| o.metadata.name.as_ref() == Some(&l.name))
                })
                .filter_map(|o| o.metadata.uid.clone())
                .collect();
            uids.sort();
            notes.set(PACING_NOTE_ANNOTATION, uids.join(","));
        }
        let leading = leads(&ctx);
        if leading && was_leader {
            tell_changes(&client, &ctx, &known, &live, &objects, &expired).await;
        }
        was_leader = leading;
        known = live
            .into_iter()
            .filter_map(|l| {
                let object = objects
                    .iter()
                    .find(|o| o.metadata.name.as_ref() == Some(&l.name))?;
                let regarding = reference(object, &ctx.namespace);
                Some((l.name.clone(), (l, regarding)))
            })
            .collect();
        deleting.retain(|name| expired.contains(name));
        if leads(&ctx) {
            for name in expired {
                if !deleting.insert(name.clone()) {
                    continue;
                }
                match within(CALL_TIMEOUT, api.delete(&name, &DeleteParams::default())).await {
                    Ok(_) => {
                        ctx.metrics.deleted.inc();
                        tracing::info!(object = %format!("{}/{name}", ctx.namespace),
                            "pauses and overrides: deleted an expired PacingOverride");
                    }
                    Err(e) => tracing::debug!(error = %e, %name,
                        "pauses and overrides: could not delete an expired PacingOverride (ignored anyway)"),
                }
            }
        }
    }
}

/// The releasers' leader tidies up and tells; without a releaser in the process, nobody.
fn leads(ctx: &Context) -> bool {
    ctx.role.gate_role() == GateRole::Leader
}

/// Events on the objects that came into force, ended early or expired since the last pass.
async fn tell_changes(
    client: &kube::Client,
    ctx: &Context,
    known: &BTreeMap<String, (Live, ObjectReference)>,
    live: &[Live],
    objects: &[Arc<DynamicObject>],
    expired: &[String],
) {
    let before: Vec<Live> = known.values().map(|(l, _)| l.clone()).collect();
    let present: Vec<String> = objects
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    for told in changes(&before, live, expired, &present) {
        // The reference as last seen: a deleted object is named as it was.
        let regarding = known.get(&told.name).map(|(_, r)| r.clone()).or_else(|| {
            objects
                .iter()
                .find(|o| o.metadata.name.as_ref() == Some(&told.name))
                .map(|o| reference(o, &ctx.namespace))
        });
        if let Some(regarding) = regarding {
            event(client, ctx, regarding, told.reason, told.note).await;
        }
    }
}

fn reference(object: &DynamicObject, namespace: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!(
            "{}/{}",
            crate::objects::overrides::GROUP,
            crate::objects::overrides::VERSION
        )),
        kind: Some(crate::objects::overrides::KIND.into()),
        name: object.metadata.name.clone(),
        namespace: Some(namespace.to_string()),
        uid: object.metadata.uid.clone(),
        resource_version: object.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// One Event in churn-throttler's namespace (the objects live there); a failure is logged
/// at debug: an Event is a courtesy.
async fn event(
    client: &kube::Client,
    ctx: &Context,
    regarding: ObjectReference,
    reason: &str,
    note: String,
) {
    let event: Event = crate::releaser::new_event(regarding, "Pacing", reason, note, &ctx.identity);
    let api: Api<Event> = Api::namespaced(client.clone(), &ctx.namespace);
    if let Err(e) = within(CALL_TIMEOUT, api.create(&PostParams::default(), &event)).await {
        tracing::debug!(error = %e, "pauses and overrides: could not write an Event");
    }
}
