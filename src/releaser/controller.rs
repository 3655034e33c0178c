//! The releaser's shell around the pure plan: the lease, the watch of labelled pods,
//! the patches that lift gates, the Events on waiting pods, and the metrics.
//!
//! Every term as leader starts from nothing: a fresh list+watch of the pods labelled
//! `churn-throttler.io/gated` rebuilds the queue, the released-at annotations seed the
//! windows, and only then does anything get released. Releases are charged in the
//! webhook's own limiter, so on the leading replica the pods the webhook admits
//! ungated and the pods the releaser lifts share one window per rule.

use super::lease::{self, within, LeaseConfig};
use super::partition::PartitionReleaser;
use super::plan::{
    gate_rule, labels_to_drop, not_ready_by_rule, plan, seed, Blocked, Charged, Cursor, Inputs,
    Plan, QueuedPod, ReleaseWhy, ReleasedPod, MAX_RELEASES_PER_ROUND,
};
use super::pods::{mark_released_patch, release_patch, unlabel_patch, view, View};
use super::Context;
use crate::limiter::Millis;
use crate::names::{format_time, GATED_LABEL, GATE_NAME, REPORTING_CONTROLLER};
use crate::policy::{format_duration, Policy};
use crate::shared::{now_millis, Leadership, ReleaserRole};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

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
/// The label value used for pods whose rule is not in the policy, to keep labels bounded.
pub(super) const NO_RULE: &str = "(none)";

#[derive(Debug, Clone)]
pub struct Config {
    pub lease: LeaseConfig,
    /// At most one Event per namespace and rule in this interval.
    pub event_interval: Duration,
}

impl Config {
    pub fn new(lease: LeaseConfig) -> Config {
        Config {
            lease,
            event_interval: Duration::from_secs(30),
        }
    }
}

/// Runs the releaser until `shutdown`: connects (retrying while there is no cluster),
/// takes part in the election, and releases while it leads.
pub async fn run(config: Config, ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let Some(client) = connect(&mut shutdown).await else {
        return;
    };
    tracing::info!(
        lease = %format!("{}/{}", config.lease.namespace, config.lease.name),
        identity = %config.lease.identity,
        "releaser: started; waiting for the lease"
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), &config.lease.namespace);
    let (tx, rx) = watch::channel(None);
    let election = tokio::spawn(lease::run(
        leases,
        config.lease.clone(),
        tx,
        ctx.metrics.clone(),
        shutdown.clone(),
    ));
    let mut leadership = Leadership::new(rx);
    // The global budget: only the leader admits gate-rule pods at once (src/budget).
    ctx.role.set(ReleaserRole::Running(leadership.clone()));
    let mut releaser = Releaser::new(client.clone(), ctx.clone(), &config);
    let mut partitions = PartitionReleaser::new(client, ctx.clone(), &config);
    loop {
        tokio::select! {
            acquired = leadership.acquired() => if !acquired { break },
            _ = crate::shared::stopped(&mut shutdown) => break,
        }
        let mut term_end = leadership.clone();
        // Gates and partitions in one term: either watch ending starts both over.
        let both =
            async { tokio::try_join!(releaser.term(&leadership), partitions.term(&leadership)) };
        tokio::select! {
            result = both => {
                if let Err(e) = result {
                    tracing::warn!(error = %e, "releaser: a watch (gated pods or StatefulSets) ended; starting over");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            _ = term_end.lost() => {
                tracing::warn!("releaser: no longer the leader; stopped releasing");
            }
            _ = crate::shared::stopped(&mut shutdown) => break,
        }
        releaser.clear_gauges();
        partitions.clear_gauges();
    }
    releaser.clear_gauges();
    partitions.clear_gauges();
    // The election gives the lease up on shutdown, so a follower need not wait it out.
    let _ = election.await;
    tracing::info!("releaser: stopped");
}

/// The client from the standard places (in-cluster account, KUBECONFIG, ~/.kube/config).
async fn connect(shutdown: &mut watch::Receiver<bool>) -> Option<Client> {
    let mut delay = Duration::from_secs(5);
    loop {
        let why = match kube::Config::infer().await {
            Ok(config) => match Client::try_from(config) {
                Ok(client) => return Some(client),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        tracing::warn!(
            error = %why,
            retry_in = %format_duration(delay),
            "releaser: no usable Kubernetes configuration (in-cluster service account, KUBECONFIG or \
             ~/.kube/config); gated pods are not released until it is found. Turn the releaser off \
             with --releaser=false"
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = crate::shared::stopped(shutdown) => return None,
        }
        delay = (delay * 2).min(Duration::from_secs(60));
    }
}

/// A spawned task that is stopped when its handle goes out of scope.
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

/// Runs a reflecting watch stream in a task: every event wakes `changed`; errors are
/// counted and logged (first, then at powers of two) while the stream backs off.
pub(super) fn spawn_feed<S, E>(
    stream: S,
    changed: Arc<Notify>,
    metrics: Arc<crate::metrics::Metrics>,
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

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A release that failed; the pod is retried once its resourceVersion changes or
/// the back-off passes, so a pod the API server keeps refusing cannot eat the rate.
struct Failed {
    resource_version: String,
    retry_at: Millis,
    attempts: u32,
}

struct Releaser {
    client: Client,
    ctx: Arc<Context>,
    identity: String,
    event_interval: Millis,
    charged: Charged,
    cursor: Cursor,
    failed: HashMap<String, Failed>,
    events_sent: HashMap<(String, Arc<str>), Millis>,
    gauge_rules: HashSet<String>,
}

/// One pod to patch, with what the patch needs.
struct Job {
    namespace: String,
    name: String,
    uid: String,
    resource_version: String,
    patch: json_patch::Patch,
    rule: String,
    reason: &'static str,
    waited_ms: Millis,
}

enum Done {
    Released,
    Conflict,
    Gone,
    Error(String),
    NotLeader,
}

impl Releaser {
    fn new(client: Client, ctx: Arc<Context>, config: &Config) -> Releaser {
        Releaser {
            client,
            ctx,
            identity: config.lease.identity.clone(),
            event_interval: config.event_interval.as_millis() as Millis,
            charged: Charged::default(),
            cursor: Cursor::default(),
            failed: HashMap::new(),
            events_sent: HashMap::new(),
            gauge_rules: HashSet::new(),
        }
    }

    /// One term as leader: rebuild from the cluster, then release until cancelled.
    async fn term(&mut self, leadership: &Leadership) -> anyhow::Result<()> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let (reader, writer) = reflector::store::<Pod>();
        let changed = Arc::new(Notify::new());
        let stream = watcher(pods.clone(), watcher::Config::default().labels(GATED_LABEL))
            .default_backoff()
            .reflect(writer);
        let _feed = spawn_feed(
            stream,
            changed.clone(),
            self.ctx.metrics.clone(),
            "gated pods",
        );
        // Nothing is released before the whole set of labelled pods has been listed.
        reader.wait_until_ready().await?;
        // Releases this process made in an earlier term are in the limiter already;
        // anything else in the window is seeded from the annotations below.
        self.failed.clear();
        let mut first = true;
        loop {
            let now = now_millis();
            let wake = self.round(&reader, leadership, now, first).await;
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

    /// Reads the store, plans, and applies the plan; returns when to look again.
    async fn round(
        &mut self,
        reader: &Store<Pod>,
        leadership: &Leadership,
        now: Millis,
        first: bool,
    ) -> Option<Millis> {
        let policy = self.ctx.policy();
        let mut queue: Vec<QueuedPod> = Vec::new();
        let mut gate_at: Vec<(usize, bool)> = Vec::new();
        let mut ungated: Vec<(QueuedPod, bool)> = Vec::new();
        let mut released: Vec<ReleasedPod> = Vec::new();
        for object in reader.state() {
            let has_annotations = object.metadata.annotations.is_some();
            match view(&object) {
                View::Queued { pod, gate_index } => {
                    queue.push(pod);
                    gate_at.push((gate_index, has_annotations));
                }
                View::UngatedElsewhere { pod } => ungated.push((pod, has_annotations)),
                View::Released(pod) => released.push(pod),
                View::Ignored => {}
            }
        }
        // Pods in back-off after a refused patch sit this round out.
        let live: HashMap<&str, &str> = queue
            .iter()
            .chain(ungated.iter().map(|(p, _)| p))
            .map(|p| (p.uid.as_str(), p.resource_version.as_str()))
            .collect();
        self.failed.retain(|uid, f| {
            live.get(uid.as_str())
                .is_some_and(|rv| *rv == f.resource_version)
        });
        let in_backoff = |uid: &str| self.failed.get(uid).is_some_and(|f| now < f.retry_at);
        ungated.retain(|(pod, _)| !in_backoff(&pod.uid));
        let mut eligible: Vec<QueuedPod> = Vec::new();
        let mut eligible_gate: Vec<(usize, bool)> = Vec::new();
        for (pod, gate) in queue.iter().zip(&gate_at) {
            if in_backoff(&pod.uid) {
                continue;
            }
            eligible.push(pod.clone());
            eligible_gate.push(*gate);
        }

        self.charged.prune(&policy, now);
        let not_ready = not_ready_by_rule(&released);
        let (plan, seeded) = {
            let mut limiter = self.ctx.limiter();
            let seeded = seed(
                &mut limiter,
                &policy,
                &released,
                &mut self.charged,
                &self.ctx.instance,
                now,
            );
            // Pods un-gated by hand are counted now, before anything else is planned.
            for (pod, _) in &ungated {
                if let Some(rule) = gate_rule(&policy, &pod.rule) {
                    limiter.record(
                        &rule.name,
                        &rule.limits,
                        &pod.namespace,
                        pod.owner.as_deref(),
                        now,
                        1,
                    );
                }
            }
            let plan = plan(
                &Inputs {
                    queue: &eligible,
                    not_ready: &not_ready,
                    policy: &policy,
                    now,
                    max_releases: MAX_RELEASES_PER_ROUND,
                },
                &mut limiter,
                &mut self.cursor,
            );
            (plan, seeded)
        };
        if first {
            tracing::info!(
                gated = queue.len(),
                released_not_ready = not_ready.values().sum::<u32>(),
                released_labelled = released.len(),
                seeded,
                "releaser: leading; queue rebuilt from the cluster and windows seeded from released-at"
            );
        } else if seeded > 0 {
            tracing::info!(
                seeded,
                "releaser: seeded releases seen on pods into the windows"
            );
        }
        self.publish_gauges(&policy, &queue, &not_ready);

        let mut jobs = Vec::new();
        for release in &plan.releases {
            let pod = &eligible[release.index];
            let (gate_index, has_annotations) = eligible_gate[release.index];
            jobs.push(Job {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                resource_version: pod.resource_version.clone(),
                patch: release_patch(&pod.resource_version, gate_index, has_annotations, now),
                rule: metric_rule(&policy, &pod.rule),
                reason: match release.why {
                    ReleaseWhy::Rate => "rate",
                    ReleaseWhy::RuleGone => "rule-gone",
                },
                waited_ms: release.waited_ms,
            });
        }
        for (pod, has_annotations) in &ungated {
            jobs.push(Job {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                resource_version: pod.resource_version.clone(),
                patch: mark_released_patch(&pod.resource_version, *has_annotations, now),
                rule: metric_rule(&policy, &pod.rule),
                reason: "ungated-elsewhere",
                waited_ms: now.saturating_sub(pod.created),
            });
        }
        self.run_jobs(jobs, leadership, now).await;
        self.drop_labels(&released, &policy, leadership, now).await;
        self.send_events(&plan, &eligible, leadership, now).await;
        plan.wake_at
    }

    async fn run_jobs(&mut self, jobs: Vec<Job>, leadership: &Leadership, now: Millis) {
        if jobs.is_empty() {
            return;
        }
        let client = self.client.clone();
        let results: Vec<(Job, Done)> = futures::stream::iter(jobs)
            .map(|job| {
                let client = client.clone();
                async move {
                    // Checked right before each call: a replica whose term ended sends nothing.
                    if !leadership.is_leader() {
                        return (job, Done::NotLeader);
                    }
                    let api: Api<Pod> = Api::namespaced(client, &job.namespace);
                    let patch = Patch::Json::<()>(job.patch.clone());
                    let params = PatchParams::default();
                    let call = api.patch(&job.name, &params, &patch);
                    let done = match within(CALL_TIMEOUT, call).await {
                        Ok(_) => Done::Released,
                        // 422: a test op failed (the pod changed); 409: a write conflict.
                        Err(e) if matches!(e.status(), Some(409 | 422)) => Done::Conflict,
                        Err(e) if e.status() == Some(404) => Done::Gone,
                        Err(e) => Done::Error(e.to_string()),
                    };
                    (job, done)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let metrics = &self.ctx.metrics;
        let mut released: HashMap<&str, u32> = HashMap::new();
        let mut errors = 0;
        for (job, done) in &results {
            match done {
                Done::Released => {
                    self.charged.insert(&job.uid, now);
                    self.failed.remove(&job.uid);
                    metrics
                        .gate_releases
                        .with_label_values(&[&job.rule, job.reason])
                        .inc();
                    metrics
                        .gate_wait
                        .with_label_values(&[&job.rule])
                        .observe(job.waited_ms as f64 / 1000.0);
                    *released.entry(job.reason).or_insert(0) += 1;
                    tracing::debug!(pod = %format!("{}/{}", job.namespace, job.name), rule = %job.rule,
                        reason = job.reason, waited_s = job.waited_ms / 1000, "releaser: released");
                }
                Done::NotLeader => {}
                other => {
                    let reason = match other {
                        Done::Conflict => "conflict",
                        Done::Gone => "gone",
                        _ => "error",
                    };
                    metrics
                        .gate_release_failures
                        .with_label_values(&[reason])
                        .inc();
                    if let Done::Error(e) = other {
                        errors += 1;
                        metrics
                            .releaser_api_errors
                            .with_label_values(&["patch"])
                            .inc();
                        tracing::warn!(pod = %format!("{}/{}", job.namespace, job.name), error = %e,
                            "releaser: release patch failed; retrying later");
                    }
                    let attempts = self.failed.get(&job.uid).map_or(0, |f| f.attempts) + 1;
                    // 1 s, 2 s, 4 s ... 60 s, unless the pod changes first.
                    let backoff = 1_000u64 << attempts.min(6).saturating_sub(1);
                    self.failed.insert(
                        job.uid.clone(),
                        Failed {
                            resource_version: job.resource_version.clone(),
                            retry_at: now + backoff.min(60_000),
                            attempts,
                        },
                    );
                }
            }
        }
        if !released.is_empty() {
            let at = format_time(now);
            tracing::info!(
                rate = released.get("rate").copied().unwrap_or(0),
                rule_gone = released.get("rule-gone").copied().unwrap_or(0),
                ungated_elsewhere = released.get("ungated-elsewhere").copied().unwrap_or(0),
                errors,
                at = %at,
                "releaser: released pods"
            );
        }
    }

    /// Drops the label of released pods that are settled and out of every window.
    async fn drop_labels(
        &self,
        released: &[ReleasedPod],
        policy: &Policy,
        leadership: &Leadership,
        now: Millis,
    ) {
        let todo: Vec<&ReleasedPod> = labels_to_drop(released, policy, now)
            .into_iter()
            .take(MAX_RELEASES_PER_ROUND)
            .map(|i| &released[i])
            .collect();
        let client = self.client.clone();
        let metrics = self.ctx.metrics.clone();
        futures::stream::iter(todo)
            .for_each_concurrent(CONCURRENCY, |pod| {
                let client = client.clone();
                let metrics = metrics.clone();
                async move {
                    if !leadership.is_leader() {
                        return;
                    }
                    let api: Api<Pod> = Api::namespaced(client, &pod.namespace);
                    let patch = Patch::Json::<()>(unlabel_patch());
                    let params = PatchParams::default();
                    let call = api.patch(&pod.name, &params, &patch);
                    if let Err(e) = within(CALL_TIMEOUT, call).await {
                        if !matches!(e.status(), Some(404 | 409 | 422)) {
                            metrics.releaser_api_errors.with_label_values(&["patch"]).inc();
                            tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), error = %e,
                                "releaser: could not drop the label of a released pod");
                        }
                    }
                }
            })
            .await;
    }

    /// At most one Event per namespace and rule per interval, on the oldest waiting pod.
    async fn send_events(
        &mut self,
        plan: &Plan,
        queue: &[QueuedPod],
        leadership: &Leadership,
        now: Millis,
    ) {
        let interval = self.event_interval;
        let waiting: HashSet<(String, Arc<str>)> = plan
            .waiting
            .iter()
            .map(|w| (w.namespace.clone(), w.rule.clone()))
            .collect();
        self.events_sent
            .retain(|key, at| waiting.contains(key) && *at + interval > now);
        let policy = self.ctx.policy();
        let mut due: Vec<&super::plan::Waiting> = plan
            .waiting
            .iter()
            .filter(|w| {
                !self
                    .events_sent
                    .contains_key(&(w.namespace.clone(), w.rule.clone()))
            })
            .collect();
        // Oldest heads first, so a cap on Events per round still reaches everyone in turn.
        due.sort_by_key(|w| queue[w.head].created);
        due.truncate(MAX_EVENTS_PER_ROUND);
        let mut events = Vec::new();
        for w in due {
            let Some(rule) = gate_rule(&policy, &w.rule) else {
                continue;
            };
            let limits: Vec<String> = rule.limits.iter().map(|l| l.to_string()).collect();
            let head = &queue[w.head];
            let (reason, note) = match w.blocked {
                Blocked::Rate => (
                    "Paced",
                    format!(
                        "{} pod(s) in this namespace wait behind the scheduling gate {GATE_NAME}: rule {:?} \
                         releases {}; {} pod(s) wait for it in {} namespace(s), released in turn, oldest \
                         first. Next release here in about {}, the last of these in about {}.",
                        w.pods,
                        &*w.rule,
                        limits.join(" and "),
                        w.rule_pods,
                        w.rule_namespaces,
                        about(w.next_in_ms.unwrap_or(0)),
                        about(w.last_in_ms.unwrap_or(0)),
                    ),
                ),
                Blocked::NotReady { not_ready, max } => (
                    "WaitingForReady",
                    format!(
                        "{} pod(s) in this namespace wait behind the scheduling gate {GATE_NAME}: rule {:?} \
                         has {not_ready} released pod(s) not Ready yet (maxNotReady {max}); releases \
                         resume as they become Ready, then at {}. {} pod(s) wait for it in {} namespace(s).",
                        w.pods,
                        &*w.rule,
                        limits.join(" and "),
                        w.rule_pods,
                        w.rule_namespaces,
                    ),
                ),
            };
            self.events_sent
                .insert((w.namespace.clone(), w.rule.clone()), now);
            events.push((head.clone(), reason, note));
        }
        let client = self.client.clone();
        let metrics = self.ctx.metrics.clone();
        let identity = self.identity.clone();
        futures::stream::iter(events)
            .for_each_concurrent(CONCURRENCY, |(pod, reason, note)| {
                let client = client.clone();
                let metrics = metrics.clone();
                let identity = identity.clone();
                async move {
                    if !leadership.is_leader() {
                        return;
                    }
                    let api: Api<Event> = Api::namespaced(client, &pod.namespace);
                    let event = event(&pod, reason, note, &identity);
                    match within(CALL_TIMEOUT, api.create(&PostParams::default(), &event)).await {
                        Ok(_) => metrics.gate_events.with_label_values(&[reason]).inc(),
                        Err(e) => {
                            metrics
                                .releaser_api_errors
                                .with_label_values(&["event"])
                                .inc();
                            tracing::debug!(error = %e, "releaser: could not write an Event");
                        }
                    }
                }
            })
            .await;
    }

    fn publish_gauges(
        &mut self,
        policy: &Policy,
        queue: &[QueuedPod],
        not_ready: &HashMap<String, u32>,
    ) {
        let metrics = &self.ctx.metrics;
        let mut queued: HashMap<String, i64> = HashMap::new();
        for pod in queue {
            *queued.entry(metric_rule(policy, &pod.rule)).or_insert(0) += 1;
        }
        let mut rules: HashSet<String> = policy
            .rules
            .iter()
            .filter(|r| gate_rule(policy, &r.name).is_some())
            .map(|r| r.name.to_string())
            .collect();
        rules.extend(queued.keys().cloned());
        // Rules that left the policy leave the gauges too.
        for gone in self.gauge_rules.difference(&rules) {
            let _ = metrics.gate_queue.remove_label_values(&[gone]);
            let _ = metrics.gate_not_ready.remove_label_values(&[gone]);
        }
        for rule in &rules {
            metrics
                .gate_queue
                .with_label_values(&[rule])
                .set(queued.get(rule).copied().unwrap_or(0));
            let nr = not_ready.get(rule).copied().unwrap_or(0);
            metrics
                .gate_not_ready
                .with_label_values(&[rule])
                .set(i64::from(nr));
        }
        self.gauge_rules = rules;
    }

    /// Only the leader reports the queue; a follower's gauges would be stale.
    fn clear_gauges(&mut self) {
        let metrics = &self.ctx.metrics;
        for rule in self.gauge_rules.drain() {
            let _ = metrics.gate_queue.remove_label_values(&[&rule]);
            let _ = metrics.gate_not_ready.remove_label_values(&[&rule]);
        }
    }
}

/// A rule name usable as a metric label: a gate rule of the policy, else "(none)".
fn metric_rule(policy: &Policy, rule: &str) -> String {
    match gate_rule(policy, rule) {
        Some(rule) => rule.name.to_string(),
        None => NO_RULE.to_string(),
    }
}

fn about(ms: Millis) -> String {
    let seconds = ms.div_ceil(1000).max(1);
    format_duration(Duration::from_secs(seconds))
}

fn event(pod: &QueuedPod, reason: &str, note: String, identity: &str) -> Event {
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(pod.uid.clone()),
        ..Default::default()
    };
    new_event(regarding, "Gate", reason, note, identity)
}

/// A new events.k8s.io Event about `regarding`, from the releaser, within the API's limits.
pub(super) fn new_event(
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
    fn events_regard_the_pod_and_stay_within_the_api_limits() {
        let pod = QueuedPod {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "u1".into(),
            resource_version: "7".into(),
            rule: "paced".into(),
            owner: None,
            created: 0,
        };
        let event = event(&pod, "Paced", "é".repeat(700), &"x".repeat(300));
        let regarding = event.regarding.as_ref().expect("regarding");
        assert_eq!(regarding.kind.as_deref(), Some("Pod"));
        assert_eq!(regarding.uid.as_deref(), Some("u1"));
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
}
