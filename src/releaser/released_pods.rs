//! The partition releaser's looks at the pods that held sets' last steps released: a GET
//! of each pod of `released_ordinals` (one with k = 1, up to `maxUnavailable`, capped,
//! with k > 1), remembered per set and ordinal, so that each set's `released` and
//! `earlier` say which are in flight (old pod not deleted yet), starting (seen deleted,
//! the replacement not Ready yet) or settled.

use super::shell::{CALL_TIMEOUT, CONCURRENCY};
use crate::election::within;
use crate::limiter::Millis;
use crate::metrics::ReleaserParts;
use crate::objects::statefulsets::{
    deleted_by, pod_progress, released_pod_name, update_revision, PodProgress,
};
use crate::pacing::gate::MAX_RELEASES_PER_ROUND;
use crate::pacing::partition::{released_ordinals, HeldSet, Released};
use crate::shared::{now_millis, Leadership};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::Client;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A released pod that is not settled is looked at again at least this often, even when
/// its StatefulSet does not change (status updates normally bring the news first).
pub(super) const RECHECK_MS: Millis = 5_000;

/// A step whose old pod is not seen deleted yet counts as "now" in its rule's windows,
/// holding a slot until a look shows the deletion: look again this soon (deletion
/// follows the step by tens of milliseconds, so few steps wait here at once).
pub(super) const RECHECK_IN_FLIGHT_MS: Millis = 250;

/// The last look at one released pod.
struct PodCheck {
    revision: String,
    /// The set's resourceVersion when we looked: a change is worth another look.
    resource_version: String,
    at: Millis,
    /// When the old pod was first seen deleted (our clock, read after the answer came,
    /// or the API server's stamps: never earlier than the deletion).
    seen_at: Option<Millis>,
    settled: bool,
}

impl PodCheck {
    fn released(&self) -> Released {
        released(self.seen_at, self.settled)
    }
}

fn released(seen_at: Option<Millis>, settled: bool) -> Released {
    match (seen_at, settled) {
        (Some(at), true) => Released::Settled { at },
        (Some(at), false) => Released::Starting { at },
        (None, _) => Released::InFlight,
    }
}

/// One pod to GET: the set's index, the slot (ordinals above the partition), the
/// ordinal, the pod's name and the revision it must have.
struct Todo {
    index: usize,
    slot: usize,
    ordinal: u32,
    pod: String,
    revision: String,
}

/// What the looks remember, per set UID and ordinal.
#[derive(Default)]
pub(super) struct PodLooks {
    checks: HashMap<(String, u32), PodCheck>,
}

impl PodLooks {
    pub(super) fn clear(&mut self) {
        self.checks.clear();
    }

    /// Forgets the pods no held set looks at any more (a pod that left the looked-at
    /// ordinals has settled, and a set let go or finished is not held).
    pub(super) fn retain(&mut self, held: &[HeldSet]) {
        let looked: HashMap<&str, std::ops::Range<u32>> = held
            .iter()
            .map(|s| {
                let ordinals = released_ordinals(s.partition, s.replicas, s.max_unavailable);
                (s.uid.as_str(), ordinals)
            })
            .collect();
        self.checks.retain(|(uid, ordinal), _| {
            looked
                .get(uid.as_str())
                .is_some_and(|r| r.contains(ordinal))
        });
    }

    /// Looks at the pods each held set's last steps released (one GET per pod whose set
    /// changed since the last look, or after RECHECK_IN_FLIGHT_MS / RECHECK_MS; none
    /// for a settled pod, nor for the pod of a step whose new version the watch has not
    /// brought, `just_stepped`) and marks each in flight, starting or settled. Returns
    /// false when some were left for the next round.
    pub(super) async fn look(
        &mut self,
        client: &Client,
        metrics: &ReleaserParts,
        (held, objects): (&mut [HeldSet], &[Arc<StatefulSet>]),
        just_stepped: &HashSet<String>,
        leadership: &Leadership,
        now: Millis,
    ) -> bool {
        let mut todo: Vec<Todo> = Vec::new();
        let mut complete = true;
        for (index, set) in held.iter_mut().enumerate() {
            let Some(revision) = update_revision(&objects[index]) else {
                continue;
            };
            let ordinals = released_ordinals(set.partition, set.replicas, set.max_unavailable);
            for (slot, ordinal) in ordinals.enumerate() {
                // A step just taken: its pod is in flight, whatever the stale copy says.
                if slot == 0 && just_stepped.contains(&set.uid) {
                    continue;
                }
                let key = (set.uid.clone(), ordinal);
                if let Some(check) = self.checks.get(&key).filter(|c| c.revision == revision) {
                    if let Some(r) = set.looked_mut(slot) {
                        *r = check.released();
                    }
                    let again = if check.seen_at.is_some() {
                        RECHECK_MS
                    } else {
                        RECHECK_IN_FLIGHT_MS
                    };
                    let fresh =
                        check.resource_version == set.resource_version && now < check.at + again;
                    if check.settled || fresh {
                        continue;
                    }
                }
                if todo.len() >= MAX_RELEASES_PER_ROUND {
                    complete = false;
                    continue;
                }
                todo.push(Todo {
                    index,
                    slot,
                    ordinal,
                    pod: released_pod_name(&objects[index], ordinal),
                    revision: revision.to_string(),
                });
            }
        }
        if todo.is_empty() {
            return complete;
        }
        let held_ref: &[HeldSet] = held;
        let results: Vec<(Todo, Option<(PodProgress, Millis)>)> = futures::stream::iter(todo)
            .map(|todo| {
                let namespace = held_ref[todo.index].namespace.clone();
                async move {
                    let seen = get_pod(client, metrics, &namespace, &todo, leadership).await;
                    (todo, seen)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for (todo, seen) in results {
            let set = &mut held[todo.index];
            let Some((progress, at)) = seen else {
                continue;
            };
            let key = (set.uid.clone(), todo.ordinal);
            let earlier = self
                .checks
                .get(&key)
                .filter(|c| c.revision == todo.revision)
                .and_then(|c| c.seen_at);
            let seen_at = match progress {
                PodProgress::NotDeleted => None,
                PodProgress::Deleted | PodProgress::Updated | PodProgress::Ready => {
                    Some(earlier.unwrap_or(at))
                }
            };
            let settled = progress == PodProgress::Ready;
            if let Some(r) = set.looked_mut(todo.slot) {
                *r = released(seen_at, settled);
            }
            self.checks.insert(
                key,
                PodCheck {
                    revision: todo.revision,
                    resource_version: set.resource_version.clone(),
                    at: now,
                    seen_at,
                    settled,
                },
            );
        }
        complete
    }
}

/// One GET of a released pod: how far it has come, and when its deletion counts from
/// (None: not looked at, or the answer did not come).
async fn get_pod(
    client: &Client,
    metrics: &ReleaserParts,
    namespace: &str,
    todo: &Todo,
    leadership: &Leadership,
) -> Option<(PodProgress, Millis)> {
    if !leadership.is_leader() {
        return None;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let answer = within(CALL_TIMEOUT, api.get_opt(&todo.pod)).await;
    // Read after the answer: never earlier than what it shows.
    let at = now_millis();
    match answer {
        Ok(p) => Some((
            pod_progress(p.as_ref(), &todo.revision),
            deleted_by(p.as_ref(), at),
        )),
        Err(e) => {
            metrics
                .releaser
                .releaser_api_errors
                .with_label_values(&["get"])
                .inc();
            tracing::debug!(pod = %format!("{namespace}/{}", todo.pod), error = %e,
                "releaser: could not read the pod a partition step released");
            None
        }
    }
}
