//! The pod cache's shell: a metadata-only watch of pods that feeds `server::pods::PodCache`
//! (the pure rule and the store live there).

use crate::server::state::AppState;
use crate::shared::KubeClient;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ObjectMeta, PartialObjectMeta};
use kube::runtime::reflector;
use kube::runtime::{watcher, WatchStreamExt};
use std::sync::Arc;
use tokio::sync::watch;

/// Feeds the cache until `shutdown`. With `try_once` (`--dev`) and no usable Kubernetes
/// configuration there is no cache and every request is decided as before; otherwise a
/// missing configuration is retried like the releaser's.
pub async fn run(
    state: Arc<AppState>,
    kube: Arc<KubeClient>,
    try_once: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    let client = if try_once {
        match kube.try_get().await {
            Ok(client) => client,
            Err(_) => {
                tracing::info!(
                    "pod cache off (--dev without a Kubernetes configuration): every pod DELETE and \
                     eviction is charged, whether the pod exists or not"
                );
                return;
            }
        }
    } else {
        let missing = "pod cache: no usable Kubernetes configuration; until it is found every pod \
                       DELETE and eviction is charged, whether the pod exists or not";
        match kube.get(&mut shutdown, missing).await {
            Some(client) => client,
            None => return,
        }
    };
    let (reader, writer) = reflector::store::<PartialObjectMeta<Pod>>();
    let cache = &state.pods;
    if !cache.attach(reader.clone()) {
        tracing::warn!("pod cache: started twice; the second is not run");
        return;
    }
    // An Api of PartialObjectMeta lists and watches metadata only (as metadata_watcher did).
    let api: Api<PartialObjectMeta<Pod>> = Api::all(client);
    // Only what a lookup needs is kept (about 0.8 KiB a pod with the store's index: see
    // the ignored test `rss_of_100k_pods`).
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|pod: &mut PartialObjectMeta<Pod>| {
            let meta = std::mem::take(&mut pod.metadata);
            pod.metadata = ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                ..ObjectMeta::default()
            };
        })
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    let mut ready = std::pin::pin!(reader.wait_until_ready());
    let mut failures: u32 = 0;
    loop {
        tokio::select! {
            Ok(()) = &mut ready, if !cache.synced() => {
                cache.mark_synced();
                state.metrics.server.pod_cache_synced.set(1);
                tracing::info!(pods = reader.len(), "pod cache synced: pod DELETEs and evictions of pods that do not exist are no longer charged");
            }
            next = stream.next() => match next {
                Some(Ok(_)) => failures = 0,
                Some(Err(e)) => {
                    failures += 1;
                    if failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures, "pod cache: watch failed; retrying with backoff (the cache keeps its last state)");
                    }
                }
                None => return,
            },
            _ = crate::shared::stopped(&mut shutdown) => return,
        }
    }
}
