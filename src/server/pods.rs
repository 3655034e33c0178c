//! Which pods exist: a metadata-only watch cache of pods, so that a pod DELETE or eviction
//! is charged only when the pod it names is real.
//!
//! Without `--client-ca` anyone who reaches the admission port can send AdmissionReviews.
//! A forged deletion of a pod that does not exist must not take a slot that a real deletion
//! then waits for. The API server reviews a DELETE only of a pod it has (it sends the pod
//! as oldObject) and an eviction only of a pod it found, so a review naming a pod the
//! cache does not have, or (DELETE) a pod whose uid is not the cached one, did not come
//! from the API server or is about a pod already gone: it is allowed without a charge.
//!
//! [`verify`] is the pure rule; [`PodCache`] holds the store and whether it has synced;
//! `server::pod_watch::run` is the shell that feeds it from the API server.

use crate::admission::ChurnRequest;
use crate::policy::ChurnKind;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ObjectMeta, PartialObjectMeta};
use kube::core::admission::AdmissionRequest;
use kube::core::DynamicObject;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// What the cache says about the pod a review names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// No cache (no cluster, `--dev` without a kubeconfig) or not synced yet.
    Unknown,
    Absent,
    Present {
        uid: Option<String>,
    },
}

/// Whether a request is charged, or allowed uncharged and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Decide as usual (the limiter may charge it).
    Decide,
    /// Allowed without a charge: the named pod is not the one the cache has.
    Unverified(Unverified),
}

/// Why a review was not charged: the `reason` label of `churn_throttler_unverified_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unverified {
    /// No pod of that namespace and name exists.
    NoSuchPod,
    /// A pod of that name exists, but the review's oldObject has another uid (or none).
    UidMismatch,
}

impl Unverified {
    pub fn as_str(self) -> &'static str {
        match self {
            Unverified::NoSuchPod => "no-such-pod",
            Unverified::UidMismatch => "uid-mismatch",
        }
    }
}

/// The pure rule. `claimed_uid` is the uid of the review's oldObject (DELETE only).
/// Until the cache is synced every request is decided as before: the safe side.
pub fn verify(kind: ChurnKind, claimed_uid: Option<&str>, lookup: &Lookup) -> Check {
    match (kind, lookup) {
        (ChurnKind::PodCreate | ChurnKind::StatefulSetUpdate, _) => Check::Decide,
        (_, Lookup::Unknown) => Check::Decide,
        (_, Lookup::Absent) => Check::Unverified(Unverified::NoSuchPod),
        (ChurnKind::Eviction, Lookup::Present { .. }) => Check::Decide,
        // The API server always sends the pod it deletes as oldObject, with its uid: a
        // forger who knows a live pod's name must also know its uid to be charged.
        (ChurnKind::PodDelete, Lookup::Present { uid }) => match (claimed_uid, uid.as_deref()) {
            (Some(claimed), Some(cached)) if claimed == cached => Check::Decide,
            // A cached pod without a uid cannot happen from the API server; charge.
            (_, None) => Check::Decide,
            _ => Check::Unverified(Unverified::UidMismatch),
        },
    }
}

/// The pods the watch has seen (name, namespace and uid only), once it has synced.
#[derive(Default)]
pub struct PodCache {
    store: OnceLock<Store<PartialObjectMeta<Pod>>>,
    synced: AtomicBool,
}

impl PodCache {
    /// Whether the cache has listed every pod once (from then on it answers lookups).
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// Gives the cache its store; false when it already has one (started twice).
    pub(super) fn attach(&self, store: Store<PartialObjectMeta<Pod>>) -> bool {
        self.store.set(store).is_ok()
    }

    pub(super) fn mark_synced(&self) {
        self.synced.store(true, Ordering::SeqCst);
    }

    pub fn lookup(&self, namespace: &str, name: &str) -> Lookup {
        let Some(store) = self.store.get() else {
            return Lookup::Unknown;
        };
        if !self.synced() {
            return Lookup::Unknown;
        }
        match store.get(&ObjectRef::new(name).within(namespace)) {
            Some(pod) => Lookup::Present {
                uid: pod.metadata.uid.clone(),
            },
            None => Lookup::Absent,
        }
    }

    /// A synced cache holding exactly `pods` (namespace, name, uid), through the same
    /// store writer the watch uses: for tests without a cluster. Fails if a store is set.
    pub fn preload(
        &self,
        pods: &[(&str, &str, &str)],
        metrics: &crate::metrics::Metrics,
    ) -> Result<(), &'static str> {
        let (reader, mut writer) = reflector::store::<PartialObjectMeta<Pod>>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for (namespace, name, uid) in pods {
            let pod = PartialObjectMeta::<Pod> {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(namespace.to_string()),
                    uid: Some(uid.to_string()),
                    ..ObjectMeta::default()
                },
                ..PartialObjectMeta::default()
            };
            writer.apply_watcher_event(&watcher::Event::InitApply(pod));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        self.store
            .set(reader)
            .map_err(|_| "the pod cache already has a store")?;
        // The writer goes with this function; the reader keeps the state it swapped in.
        self.synced.store(true, Ordering::SeqCst);
        metrics.server.pod_cache_synced.set(1);
        Ok(())
    }

    /// The check for a review (`churn`: its classification, None when it passes
    /// unclassified): only pod DELETEs and evictions are looked up.
    pub fn check(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        churn: Option<&ChurnRequest>,
    ) -> Check {
        if !request.resource.group.is_empty() || request.resource.resource != "pods" {
            return Check::Decide;
        }
        if self.store.get().is_none() || !self.synced() {
            return Check::Decide;
        }
        let Some(churn) = churn else {
            return Check::Decide;
        };
        let claimed = request
            .old_object
            .as_ref()
            .and_then(|o| o.metadata.uid.as_deref());
        let lookup = self.lookup(&churn.namespace, &churn.name);
        verify(churn.kind, claimed, &lookup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_of_checks() {
        let present = |uid: &str| Lookup::Present {
            uid: Some(uid.to_string()),
        };
        let unverified = |why| Check::Unverified(why);
        use ChurnKind::*;
        let cases: Vec<(ChurnKind, Option<&str>, Lookup, Check)> = vec![
            // Not synced or no cache: as before, charged.
            (PodDelete, Some("u1"), Lookup::Unknown, Check::Decide),
            (PodDelete, None, Lookup::Unknown, Check::Decide),
            (Eviction, None, Lookup::Unknown, Check::Decide),
            // The pod is not there: a forgery, or a pod gone before the cache saw it.
            (
                PodDelete,
                Some("u1"),
                Lookup::Absent,
                unverified(Unverified::NoSuchPod),
            ),
            (
                Eviction,
                None,
                Lookup::Absent,
                unverified(Unverified::NoSuchPod),
            ),
            // The pod is there: a DELETE must name its uid.
            (PodDelete, Some("u1"), present("u1"), Check::Decide),
            (
                PodDelete,
                Some("u2"),
                present("u1"),
                unverified(Unverified::UidMismatch),
            ),
            (
                PodDelete,
                None,
                present("u1"),
                unverified(Unverified::UidMismatch),
            ),
            (
                PodDelete,
                Some("u1"),
                Lookup::Present { uid: None },
                Check::Decide,
            ),
            (Eviction, None, present("u1"), Check::Decide),
            // Other kinds are never looked up.
            (PodCreate, None, Lookup::Absent, Check::Decide),
            (StatefulSetUpdate, None, Lookup::Absent, Check::Decide),
        ];
        for (kind, claimed, lookup, want) in cases {
            assert_eq!(
                verify(kind, claimed, &lookup),
                want,
                "{kind:?} {claimed:?} {lookup:?}"
            );
        }
    }

    #[test]
    fn without_a_store_nothing_is_looked_up() {
        let cache = PodCache::default();
        assert!(!cache.synced());
        assert_eq!(cache.lookup("prod", "web-1"), Lookup::Unknown);
    }
}
#[cfg(test)]
mod mem_probe {
    /// Prints the resident memory 100,000 cached pods take (Linux):
    /// `cargo test --lib rss_of_100k_pods -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn rss_of_100k_pods() {
        let rss = || {
            let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                * 4096
        };
        let names: Vec<(String, String, String)> = (0..100_000)
            .map(|i| {
                (
                    format!("team-{}", i % 500),
                    format!("web-5d9c7b8f6d-{i:05}x"),
                    format!("9b2d7c1e-3c44-4a51-8d1e-{i:012}"),
                )
            })
            .collect();
        let refs: Vec<(&str, &str, &str)> = names
            .iter()
            .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
            .collect();
        let before = rss();
        let cache = super::PodCache::default();
        let m = crate::metrics::Metrics::new();
        cache.preload(&refs, &m).unwrap_or_else(|e| panic!("{e}"));
        let after = rss();
        println!(
            "rss delta for 100k pods: {} bytes ({} per pod)",
            after - before,
            (after - before) / 100_000
        );
    }
}
