//! What the gate and partition releasers share around their plans: the term loop over a
//! reflecting watch, patches with their error classes and back-off, Events with their
//! throttle, and per-rule gauges. Each releaser keeps only its plan and its objects.

use super::Config;
use crate::election::within;
use crate::limiter::Millis;
use crate::metrics::ReleaserParts;
use crate::names::{FIELD_MANAGER, REPORTING_CONTROLLER};
use crate::policy::format_duration;
use crate::shared::{now_millis, Leadership};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use prometheus::{IntCounterVec, IntGaugeVec};
use serde::de::DeserializeOwned;
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Longest sleep between rounds when nothing is due (housekeeping, label drops).
pub(super) const IDLE: Duration = Duration::from_secs(5);
/// After a watch event, wait this long so a burst of events makes one round.
pub(super) const DEBOUNCE: Duration = Duration::from_millis(50);
/// Patches in flight at once.
pub(super) const CONCURRENCY: usize = 8;
/// Longest wait for one patch or Event: a hung connection must not stall a round.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Events written per round at most, whatever the number of waiting namespaces.
pub(super) const MAX_EVENTS_PER_ROUND: usize = 20;
/// The label value used for objects whose rule is not in the policy, to keep labels bounded.
pub(super) const NO_RULE: &str = "(none)";

/// One releaser as the term loop drives it: what it watches and what a round does.
pub(super) trait Rounds {
    type Object: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static;
    /// Called once the whole watched set has been listed, before the first round:
    /// nothing of an earlier term is trusted.
    fn start_term(&mut self);
    /// Reads the store, plans, and applies the plan; returns when to look again.
    fn round(
        &mut self,
        reader: &Store<Self::Object>,
        leadership: &Leadership,
        now: Millis,
        first: bool,
    ) -> impl Future<Output = Option<Millis>> + Send;
}

/// One term as leader: a fresh list+watch rebuilds the releaser's view, then rounds run
/// until the caller cancels the future (term lost, shutdown) or the watch ends.
pub(super) async fn run_term<R: Rounds>(
    rounds: &mut R,
    api: Api<R::Object>,
    config: watcher::Config,
    slim: fn(&mut R::Object),
    metrics: ReleaserParts,
    what: &'static str,
    leadership: &Leadership,
) -> anyhow::Result<()> {
    let (reader, writer) = reflector::store::<R::Object>();
    let changed = Arc::new(Notify::new());
    let stream = watcher(api, config)
        .default_backoff()
        .modify(slim)
        .reflect(writer);
    let _feed = spawn_feed(stream, changed.clone(), metrics, what);
    // Nothing is released before the whole watched set has been listed.
    reader.wait_until_ready().await?;
    rounds.start_term();
    let mut first = true;
    loop {
        let now = now_millis();
        let wake = rounds.round(&reader, leadership, now, first).await;
        first = false;
        let pause = wake
            .map_or(IDLE, |at| {
                Duration::from_millis(at.saturating_sub(now_millis()))
            })
            .min(IDLE);
        tokio::select! {
            _ = changed.notified() => tokio::time::sleep(DEBOUNCE).await,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// Whether each Node is Ready, from a watch kept for the whole process (warm when a
/// replica takes over the lease). The network window leaves out pods on a node that is
/// not Ready (`crate::pacing::network::Tracker`).
pub(super) struct NodeWatch {
    reader: Store<Node>,
    _feed: AbortOnDrop,
}

impl NodeWatch {
    pub fn start(client: &Client, metrics: ReleaserParts) -> NodeWatch {
        let (reader, writer) = reflector::store::<Node>();
        let stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(crate::objects::nodes::slim)
            .reflect(writer);
        // Nobody waits on node changes: a round reads the store when it runs.
        let feed = spawn_feed(stream, Arc::new(Notify::new()), metrics, "nodes");
        NodeWatch {
            reader,
            _feed: feed,
        }
    }

    /// A node not known (not listed yet, gone, or no right to list Nodes) counts as
    /// Ready: no word on the nodes never leaves a pod out.
    pub fn is_ready(&self, name: &str) -> bool {
        self.reader
            .get(&ObjectRef::new(name))
            .is_none_or(|node| crate::objects::nodes::is_ready(&node))
    }
}

/// Stores the object as it is (the gate releaser reads all of a pod it watches).
pub(super) fn keep_all<K>(_: &mut K) {}

/// A spawned task that is stopped when its handle goes out of scope.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs a reflecting watch stream in a task: every event wakes `changed`; errors are
/// counted and logged (first, then at powers of two) while the stream backs off.
fn spawn_feed<S, E>(
    stream: S,
    changed: Arc<Notify>,
    metrics: ReleaserParts,
    what: &'static str,
) -> AbortOnDrop
where
    S: futures::Stream<Item = Result<E, watcher::Error>> + Send + 'static,
{
    AbortOnDrop(tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut failures: u32 = 0;
        loop {
            match stream.try_next().await {
                Ok(Some(_)) => {
                    failures = 0;
                    changed.notify_one();
                }
                Ok(None) => return,
                Err(e) => {
                    failures += 1;
                    metrics
                        .releaser
                        .releaser_api_errors
                        .with_label_values(&["watch"])
                        .inc();
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures, what,
                            "releaser: listing or watching failed; retrying with back-off");
                    }
                }
            }
        }
    }))
}

/// The object a patch goes to, as it was read.
pub(super) struct Target {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub patch: json_patch::Patch,
}

impl Target {
    pub fn pod_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// How one patch ended.
pub(super) enum Done {
    Patched,
    /// 422: a test op failed (the object changed); 409: a write conflict.
    Conflict,
    Gone,
    Error(String),
    /// This replica's term ended before the call: nothing was sent.
    NotLeader,
}

impl Done {
    /// The failure's metric label; None for a patch that went through or was not sent.
    pub fn failure(&self) -> Option<&'static str> {
        match self {
            Done::Patched | Done::NotLeader => None,
            Done::Conflict => Some("conflict"),
            Done::Gone => Some("gone"),
            Done::Error(_) => Some("error"),
        }
    }
}

/// Sends every job's JSON patch (CONCURRENCY at a time, each bounded by CALL_TIMEOUT,
/// leadership checked right before each call) under churn-throttler's field manager.
pub(super) async fn patch_all<K, J>(
    client: &Client,
    jobs: Vec<J>,
    target: fn(&J) -> &Target,
    leadership: &Leadership,
) -> Vec<(J, Done)>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
    J: Send,
{
    futures::stream::iter(jobs)
        .map(|job| {
            let client = client.clone();
            async move {
                if !leadership.is_leader() {
                    return (job, Done::NotLeader);
                }
                let done = patch_one::<K>(client, target(&job)).await;
                (job, done)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await
}

/// One JSON patch of one object, its error put in a class.
async fn patch_one<K>(client: Client, target: &Target) -> Done
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(client, &target.namespace);
    let patch = Patch::Json::<()>(target.patch.clone());
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match within(CALL_TIMEOUT, api.patch(&target.name, &params, &patch)).await {
        Ok(_) => Done::Patched,
        Err(e) if matches!(e.status(), Some(409 | 422)) => Done::Conflict,
        Err(e) if e.status() == Some(404) => Done::Gone,
        Err(e) => Done::Error(e.to_string()),
    }
}

/// A patch that failed; the object is retried once its resourceVersion changes or the
/// back-off passes, so an object the API server keeps refusing cannot eat the rate.
struct Failed {
    resource_version: String,
    retry_at: Millis,
    attempts: u32,
}

/// The objects in back-off after a refused patch, by uid.
#[derive(Default)]
pub(super) struct Backoffs(HashMap<String, Failed>);

impl Backoffs {
    pub fn clear(&mut self) {
        self.0.clear();
    }

    pub fn succeeded(&mut self, uid: &str) {
        self.0.remove(uid);
    }

    /// Forgets objects that are gone or changed since (uid -> resourceVersion now).
    pub fn keep_unchanged(&mut self, live: &HashMap<&str, &str>) {
        self.0.retain(|uid, f| {
            live.get(uid.as_str())
                .is_some_and(|rv| *rv == f.resource_version)
        });
    }

    pub fn waiting(&self, uid: &str, now: Millis) -> bool {
        self.0.get(uid).is_some_and(|f| now < f.retry_at)
    }

    /// 1 s, 2 s, 4 s ... 60 s after each failure in a row, unless the object changes first.
    pub fn failed(&mut self, target: &Target, now: Millis) {
        let attempts = self.0.get(&target.uid).map_or(0, |f| f.attempts) + 1;
        let backoff = 1_000u64 << attempts.min(7).saturating_sub(1);
        self.0.insert(
            target.uid.clone(),
            Failed {
                resource_version: target.resource_version.clone(),
                retry_at: now + backoff.min(60_000),
                attempts,
            },
        );
    }
}

/// At most one Event per namespace and rule per interval.
pub(super) struct EventThrottle {
    interval: Millis,
    sent: HashMap<(String, Arc<str>), Millis>,
}

impl EventThrottle {
    pub fn new(interval: Duration) -> EventThrottle {
        EventThrottle {
            interval: interval.as_millis() as Millis,
            sent: HashMap::new(),
        }
    }

    /// Forgets namespaces that no longer wait and Events older than the interval.
    pub fn keep_waiting(&mut self, waiting: HashSet<(String, Arc<str>)>, now: Millis) {
        let interval = self.interval;
        self.sent
            .retain(|key, at| waiting.contains(key) && *at + interval > now);
    }

    pub fn is_due(&self, namespace: &str, rule: &Arc<str>) -> bool {
        !self
            .sent
            .contains_key(&(namespace.to_string(), rule.clone()))
    }

    pub fn sent(&mut self, namespace: &str, rule: &Arc<str>, now: Millis) {
        self.sent.insert((namespace.to_string(), rule.clone()), now);
    }
}

/// Where a releaser's Events go and how they are counted.
pub(super) struct EventWriter {
    pub client: Client,
    pub identity: String,
    /// The Event's `action`: Gate or Partition.
    pub action: &'static str,
    pub written: IntCounterVec,
    pub api_errors: IntCounterVec,
}

impl EventWriter {
    pub fn new(
        client: &Client,
        config: &Config,
        action: &'static str,
        written: &IntCounterVec,
        metrics: &ReleaserParts,
    ) -> EventWriter {
        EventWriter {
            client: client.clone(),
            identity: config.lease.identity.clone(),
            action,
            written: written.clone(),
            api_errors: metrics.releaser.releaser_api_errors.clone(),
        }
    }

    /// Writes each (regarding, reason, note) as an events.k8s.io Event while leading.
    pub async fn write(
        &self,
        events: Vec<(ObjectReference, &'static str, String)>,
        leadership: &Leadership,
    ) {
        futures::stream::iter(events)
            .for_each_concurrent(CONCURRENCY, |(regarding, reason, note)| async move {
                if !leadership.is_leader() {
                    return;
                }
                let namespace = regarding.namespace.clone().unwrap_or_default();
                let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
                let event = new_event(regarding, self.action, reason, note, &self.identity);
                match within(CALL_TIMEOUT, api.create(&PostParams::default(), &event)).await {
                    Ok(_) => self.written.with_label_values(&[reason]).inc(),
                    Err(e) => {
                        self.api_errors.with_label_values(&["event"]).inc();
                        tracing::debug!(error = %e, "releaser: could not write an Event");
                    }
                }
            })
            .await;
    }
}

/// A new events.k8s.io Event about `regarding`, from the releaser, within the API's limits.
pub fn new_event(
    regarding: ObjectReference,
    action: &str,
    reason: &str,
    note: String,
    identity: &str,
) -> Event {
    let now = Timestamp::now();
    let mut note = note;
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    let name = regarding.name.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..Default::default()
        },
        action: Some(action.into()),
        reason: Some(reason.into()),
        note: Some(note),
        type_: Some("Normal".into()),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding),
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(identity.chars().take(128).collect()),
        ..Default::default()
    }
}

/// Gauges labelled by rule that only the leader publishes: a rule that leaves the
/// policy leaves them, and a replica that stops leading clears them (its figures
/// would be stale).
pub(super) struct RuleGauges {
    gauges: Vec<IntGaugeVec>,
    rules: HashSet<String>,
}

impl RuleGauges {
    pub fn new(gauges: Vec<IntGaugeVec>) -> RuleGauges {
        RuleGauges {
            gauges,
            rules: HashSet::new(),
        }
    }

    /// Sets gauge `i` of every rule in `rules` to `value(i, rule)`.
    pub fn publish(&mut self, rules: HashSet<String>, value: impl Fn(usize, &str) -> i64) {
        for gone in self.rules.difference(&rules) {
            for gauge in &self.gauges {
                let _ = gauge.remove_label_values(&[gone]);
            }
        }
        for rule in &rules {
            for (i, gauge) in self.gauges.iter().enumerate() {
                gauge.with_label_values(&[rule]).set(value(i, rule));
            }
        }
        self.rules = rules;
    }

    pub fn clear(&mut self) {
        for rule in self.rules.drain() {
            for gauge in &self.gauges {
                let _ = gauge.remove_label_values(&[&rule]);
            }
        }
    }
}

/// A wait in whole seconds, at least 1 s, as people read it in an Event.
pub(super) fn about(ms: Millis) -> String {
    let seconds = ms.div_ceil(1000).max(1);
    format_duration(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_of_rough_durations() {
        for (ms, want) in [
            (0, "1s"),
            (1, "1s"),
            (1_000, "1s"),
            (1_001, "2s"),
            (90_000, "90s"),
            (120_000, "2m"),
        ] {
            assert_eq!(about(ms), want, "{ms} ms");
        }
    }

    #[test]
    fn events_stay_within_the_api_limits() {
        let regarding = ObjectReference {
            kind: Some("Pod".into()),
            name: Some("web-0".into()),
            namespace: Some("shop".into()),
            uid: Some("u1".into()),
            ..Default::default()
        };
        let event = new_event(
            regarding,
            "Gate",
            "Paced",
            "é".repeat(700),
            &"x".repeat(300),
        );
        assert_eq!(event.metadata.namespace.as_deref(), Some("shop"));
        assert!(event.note.as_ref().is_some_and(|n| n.len() <= 1000));
        assert_eq!(
            event.reporting_instance.as_ref().map(String::len),
            Some(128)
        );
        assert_eq!(
            event.reporting_controller.as_deref(),
            Some(REPORTING_CONTROLLER)
        );
        assert!(event.event_time.is_some());
    }

    #[test]
    fn back_off_doubles_to_a_minute_and_ends_when_the_object_changes() {
        let target = Target {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
            resource_version: "1".into(),
            patch: json_patch::Patch(vec![]),
        };
        let mut backoffs = Backoffs::default();
        let mut waits = Vec::new();
        for _ in 0..8 {
            backoffs.failed(&target, 0);
            let until = (0..=60_000).find(|&t| !backoffs.waiting("u", t));
            waits.push(until.unwrap_or(u64::MAX));
        }
        assert_eq!(
            waits,
            [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]
        );
        backoffs.keep_unchanged(&HashMap::from([("u", "2")]));
        assert!(!backoffs.waiting("u", 0), "a changed object is tried again");
    }
}
