//! The partition releaser's shell around the pure step plan: the watch of StatefulSets,
//! a look at the pod each step released, the patches, the Events and the metrics.
//!
//! Every term as leader starts from nothing: a fresh list+watch of all StatefulSets
//! (annotations cannot be selected on, so it filters; pod templates are dropped before
//! they are stored) rebuilds the held sets, and only then is anything stepped. The
//! windows are rebuilt every round from the sets: the step times recorded on them, and
//! the pods of their last steps, looked at before each plan.

use super::controller::{
    new_event, spawn_feed, Config, CALL_TIMEOUT, CONCURRENCY, DEBOUNCE, IDLE, MAX_EVENTS_PER_ROUND,
    NO_RULE,
};
use super::lease::within;
use super::partition_plan::{
    plan_steps, Blocked, HeldSet, LetGoWhy, Move, Record, Released, StepInputs, StepPlan, StepWhy,
    TakenStep,
};
use super::plan::{longest_window, MAX_RELEASES_PER_ROUND};
use super::statefulsets::{
    cleanup_patch, finish_patch, let_go_patch, pod_progress, released_pod_name, step_patch,
    update_revision, view, PodProgress, View,
};
use super::Context;
use crate::limiter::Millis;
use crate::names::{format_time, FIELD_MANAGER};
use crate::policy::{format_duration, Action, Policy};
use crate::shared::{now_millis, Leadership};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// A released pod that is not settled is looked at again at least this often, even when
/// its StatefulSet does not change (status updates normally bring the news first).
const RECHECK_MS: Millis = 5_000;

/// The last look at the pod a set's last step released.
struct PodCheck {
    partition: u32,
    revision: String,
    /// The set's resourceVersion when we looked: a change is worth another look.
    resource_version: String,
    at: Millis,
    /// When it was first seen re-created from the update revision (our clock, read
    /// after the answer came: never earlier than the creation).
    seen_at: Option<Millis>,
    settled: bool,
}

/// A patch that went through: until the watch brings the set's new version, the store
/// still shows the old one, and the set is planned as the patch left it.
struct Patched {
    /// The resourceVersion the patch was sent against.
    resource_version: String,
    /// For a step: the partition it set.
    to: Option<u32>,
}

/// A patch that failed; the set is retried once it changes or the back-off passes.
struct Failed {
    resource_version: String,
    retry_at: Millis,
    attempts: u32,
}

pub(super) struct PartitionReleaser {
    client: Client,
    ctx: Arc<Context>,
    identity: String,
    event_interval: Millis,
    checks: HashMap<String, PodCheck>,
    failed: HashMap<String, Failed>,
    patched: HashMap<String, Patched>,
    /// Steps taken while the windows can see them, for the spacing.
    taken: Vec<TakenStep>,
    events_sent: HashMap<(String, Arc<str>), Millis>,
    gauge_rules: HashSet<String>,
}

#[derive(Debug, Clone, Copy)]
enum JobKind {
    Step { from: u32, to: u32, why: StepWhy },
    Finish,
    LetGo(LetGoWhy),
    Cleanup,
}

struct Job {
    namespace: String,
    name: String,
    uid: String,
    resource_version: String,
    patch: json_patch::Patch,
    kind: JobKind,
    /// The rule as a metric label.
    rule: String,
    target: u32,
    held_since: Option<Millis>,
}

enum Done {
    Patched,
    Conflict,
    Gone,
    Error(String),
    NotLeader,
}

/// A StatefulSet as the store keeps it: without what the releaser never reads.
fn slim(sts: &mut StatefulSet) {
    sts.metadata.managed_fields = None;
    if let Some(spec) = sts.spec.as_mut() {
        spec.template = Default::default();
        spec.volume_claim_templates = None;
    }
}

impl PartitionReleaser {
    pub(super) fn new(client: Client, ctx: Arc<Context>, config: &Config) -> Self {
        PartitionReleaser {
            client,
            ctx,
            identity: config.lease.identity.clone(),
            event_interval: config.event_interval.as_millis() as Millis,
            checks: HashMap::new(),
            failed: HashMap::new(),
            patched: HashMap::new(),
            taken: Vec::new(),
            events_sent: HashMap::new(),
            gauge_rules: HashSet::new(),
        }
    }

    /// One term as leader: rebuild from the cluster, then step until cancelled.
    pub(super) async fn term(&mut self, leadership: &Leadership) -> anyhow::Result<()> {
        let sets: Api<StatefulSet> = Api::all(self.client.clone());
        let (reader, writer) = reflector::store::<StatefulSet>();
        let changed = Arc::new(Notify::new());
        let stream = watcher(sets, watcher::Config::default())
            .default_backoff()
            .modify(slim)
            .reflect(writer);
        let _feed = spawn_feed(
            stream,
            changed.clone(),
            self.ctx.metrics.clone(),
            "statefulsets",
        );
        // Nothing is stepped before every StatefulSet has been listed.
        reader.wait_until_ready().await?;
        self.failed.clear();
        self.patched.clear();
        self.checks.clear();
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

    async fn round(
        &mut self,
        reader: &Store<StatefulSet>,
        leadership: &Leadership,
        now: Millis,
        first: bool,
    ) -> Option<Millis> {
        let policy = self.ctx.policy();
        let mut held: Vec<HeldSet> = Vec::new();
        let mut held_objects: Vec<Arc<StatefulSet>> = Vec::new();
        let mut records: Vec<Record> = Vec::new();
        let mut record_objects: Vec<Arc<StatefulSet>> = Vec::new();
        for object in reader.state() {
            match view(&object) {
                View::Held(set) => {
                    held.push(set);
                    held_objects.push(object);
                }
                View::Record(record) => {
                    records.push(record);
                    record_objects.push(object);
                }
                View::Ignored => {}
            }
        }
        let live: HashMap<&str, &str> = held
            .iter()
            .map(|s| (s.uid.as_str(), s.resource_version.as_str()))
            .chain(
                records
                    .iter()
                    .zip(&record_objects)
                    .map(|(r, o)| (r.uid.as_str(), resource_version(o))),
            )
            .collect();
        self.failed.retain(|uid, f| {
            live.get(uid.as_str())
                .is_some_and(|rv| *rv == f.resource_version)
        });
        self.patched.retain(|uid, p| {
            live.get(uid.as_str())
                .is_some_and(|rv| *rv == p.resource_version)
        });
        self.checks
            .retain(|uid, _| held.iter().any(|s| &s.uid == uid));
        for set in held.iter_mut() {
            set.backoff = self.failed.get(&set.uid).is_some_and(|f| now < f.retry_at);
            if let Some(p) = self.patched.get(&set.uid) {
                // A step just taken is in flight, whatever the stale copy says.
                if let Some(to) = p.to {
                    set.partition = to;
                    set.held = Some(to);
                    set.released = if to < set.replicas {
                        Released::InFlight
                    } else {
                        Released::None
                    };
                }
                set.backoff = true;
            }
        }
        let looked = self
            .look_at_released_pods(&mut held, &held_objects, leadership, now)
            .await;
        // Times seen while looking are later than `now`; plan after them.
        let now = now_millis().max(now);
        let horizon = longest_window(&policy);
        self.taken.retain(|t| t.at + horizon > now);
        let plan = plan_steps(&StepInputs {
            held: &held,
            records: &records,
            taken: &self.taken,
            policy: &policy,
            now,
            max_moves: MAX_RELEASES_PER_ROUND,
        });
        for m in &plan.moves {
            if let Move::Step {
                index,
                rule: Some(rule),
                ..
            } = m
            {
                self.taken.push(TakenStep {
                    rule: rule.clone(),
                    namespace: held[*index].namespace.clone(),
                    at: now,
                });
            }
        }
        if first {
            let recorded: usize = held
                .iter()
                .map(|s| s.stepped_at.len())
                .chain(records.iter().map(|r| r.stepped_at.len()))
                .sum();
            let in_flight = held
                .iter()
                .filter(|s| s.released == Released::InFlight)
                .count();
            tracing::info!(
                held = held.len(),
                records = records.len(),
                recorded_steps = recorded,
                in_flight,
                in_window = plan.in_window.values().copied().max().unwrap_or(0),
                "releaser: leading; held StatefulSets rebuilt from the cluster, windows from partition-stepped-at and the pods in flight"
            );
        }
        self.publish_gauges(&policy, &plan);

        let mut jobs = Vec::new();
        for m in &plan.moves {
            let set = &held[m.index()];
            let object = &held_objects[m.index()];
            let annotations = object.metadata.annotations.clone().unwrap_or_default();
            let (patch, kind, rule) = match m {
                Move::Step {
                    rule,
                    from,
                    to,
                    why,
                    record,
                    ..
                } => (
                    step_patch(&set.resource_version, *to, record.as_deref()),
                    JobKind::Step {
                        from: *from,
                        to: *to,
                        why: *why,
                    },
                    rule,
                ),
                Move::Finish { rule, record, .. } => (
                    finish_patch(&set.resource_version, &annotations, record),
                    JobKind::Finish,
                    rule,
                ),
                Move::LetGo {
                    rule, why, record, ..
                } => (
                    let_go_patch(&set.resource_version, set.partition, &annotations, record),
                    JobKind::LetGo(*why),
                    rule,
                ),
            };
            jobs.push(Job {
                namespace: set.namespace.clone(),
                name: set.name.clone(),
                uid: set.uid.clone(),
                resource_version: set.resource_version.clone(),
                patch,
                kind,
                rule: rule.as_deref().unwrap_or(NO_RULE).to_string(),
                target: set.target.unwrap_or(0),
                held_since: set.held_since,
            });
        }
        for &index in plan.cleanups.iter().take(MAX_RELEASES_PER_ROUND) {
            let record = &records[index];
            let object = &record_objects[index];
            if self
                .failed
                .get(&record.uid)
                .is_some_and(|f| now < f.retry_at)
            {
                continue;
            }
            let annotations = object.metadata.annotations.clone().unwrap_or_default();
            let rv = resource_version(object).to_string();
            jobs.push(Job {
                namespace: record.namespace.clone(),
                name: record.name.clone(),
                uid: record.uid.clone(),
                patch: cleanup_patch(&rv, &annotations),
                resource_version: rv,
                kind: JobKind::Cleanup,
                rule: NO_RULE.to_string(),
                target: 0,
                held_since: None,
            });
        }
        self.run_jobs(jobs, leadership, now).await;
        self.send_waiting_events(&plan, &held, leadership, now)
            .await;

        // A pod still starting is looked at again soon even if nothing changes.
        let pending = held
            .iter()
            .any(|s| matches!(s.released, Released::InFlight | Released::Starting { .. }));
        let mut wake = plan.wake_at;
        if pending {
            let again = now + RECHECK_MS;
            wake = Some(wake.map_or(again, |w| w.min(again)));
        }
        if !looked {
            wake = Some(now);
        }
        wake
    }

    /// Looks at the pod each held set's last step released (one GET per set whose
    /// object changed since the last look, or after RECHECK_MS) and marks it in flight,
    /// starting (seen re-created) or settled. Returns false when some were left for the
    /// next round.
    async fn look_at_released_pods(
        &mut self,
        held: &mut [HeldSet],
        objects: &[Arc<StatefulSet>],
        leadership: &Leadership,
        now: Millis,
    ) -> bool {
        let mut todo: Vec<(usize, String, String)> = Vec::new();
        let mut complete = true;
        for (index, set) in held.iter_mut().enumerate() {
            let just_stepped = self.patched.get(&set.uid).is_some_and(|p| p.to.is_some());
            if set.released == Released::None || just_stepped {
                continue;
            }
            let object = &objects[index];
            let Some(revision) = update_revision(object) else {
                continue;
            };
            if let Some(check) = self
                .checks
                .get(&set.uid)
                .filter(|c| c.partition == set.partition && c.revision == revision)
            {
                set.released = match (check.seen_at, check.settled) {
                    (Some(at), true) => Released::Settled { at },
                    (Some(at), false) => Released::Starting { at },
                    (None, _) => Released::InFlight,
                };
                let fresh =
                    check.resource_version == set.resource_version && now < check.at + RECHECK_MS;
                if check.settled || fresh {
                    continue;
                }
            }
            if todo.len() >= MAX_RELEASES_PER_ROUND {
                complete = false;
                continue;
            }
            todo.push((
                index,
                released_pod_name(object, set.partition),
                revision.to_string(),
            ));
        }
        if todo.is_empty() {
            return complete;
        }
        let client = self.client.clone();
        let metrics = self.ctx.metrics.clone();
        let held_ref: &[HeldSet] = held;
        // Per set: its index, the revision looked for, and what was seen when.
        type Look = (usize, String, Option<(PodProgress, Millis)>);
        let results: Vec<Look> = futures::stream::iter(todo)
            .map(|(index, pod, revision)| {
                let client = client.clone();
                let metrics = metrics.clone();
                let namespace = held_ref[index].namespace.clone();
                async move {
                    if !leadership.is_leader() {
                        return (index, revision, None);
                    }
                    let api: Api<Pod> = Api::namespaced(client, &namespace);
                    let answer = within(CALL_TIMEOUT, api.get_opt(&pod)).await;
                    // Read after the answer: never earlier than what it shows.
                    let at = now_millis();
                    let progress = match answer {
                        Ok(Some(p)) => Some((pod_progress(&p, &revision), created_by(&p, at))),
                        Ok(None) => Some((PodProgress::NotUpdated, at)),
                        Err(e) => {
                            metrics
                                .releaser_api_errors
                                .with_label_values(&["get"])
                                .inc();
                            tracing::debug!(pod = %format!("{namespace}/{pod}"), error = %e,
                                    "releaser: could not read the pod a partition step released");
                            None
                        }
                    };
                    (index, revision, progress)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for (index, revision, progress) in results {
            let set = &mut held[index];
            let Some((progress, at)) = progress else {
                continue;
            };
            let earlier = self
                .checks
                .get(&set.uid)
                .filter(|c| c.partition == set.partition && c.revision == revision)
                .and_then(|c| c.seen_at);
            let seen_at = match progress {
                PodProgress::NotUpdated => None,
                PodProgress::Updated | PodProgress::Ready => Some(earlier.unwrap_or(at)),
            };
            let settled = progress == PodProgress::Ready;
            set.released = match (seen_at, settled) {
                (Some(at), true) => Released::Settled { at },
                (Some(at), false) => Released::Starting { at },
                (None, _) => Released::InFlight,
            };
            self.checks.insert(
                set.uid.clone(),
                PodCheck {
                    partition: set.partition,
                    revision,
                    resource_version: set.resource_version.clone(),
                    at: now,
                    seen_at,
                    settled,
                },
            );
        }
        complete
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
                    let api: Api<StatefulSet> = Api::namespaced(client, &job.namespace);
                    let patch = Patch::Json::<()>(job.patch.clone());
                    let params = PatchParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    };
                    let call = api.patch(&job.name, &params, &patch);
                    let done = match within(CALL_TIMEOUT, call).await {
                        Ok(_) => Done::Patched,
                        // 422: a test op failed (the set changed); 409: a write conflict.
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
        let metrics = self.ctx.metrics.clone();
        let mut counts: BTreeMap<&'static str, u32> = BTreeMap::new();
        let mut events: Vec<(ObjectReference, &'static str, String)> = Vec::new();
        for (job, done) in &results {
            match done {
                Done::Patched => {
                    self.failed.remove(&job.uid);
                    self.patched.insert(
                        job.uid.clone(),
                        Patched {
                            resource_version: job.resource_version.clone(),
                            to: match job.kind {
                                JobKind::Step { to, .. } => Some(to),
                                _ => None,
                            },
                        },
                    );
                    let held_for = job.held_since.map(|t| now.saturating_sub(t));
                    let about_held = held_for
                        .map(|ms| format!(" after {} held", about(ms)))
                        .unwrap_or_default();
                    let label = match job.kind {
                        JobKind::Step { from, to, why } => {
                            metrics
                                .partition_steps
                                .with_label_values(&[&job.rule, why.as_str()])
                                .inc();
                            tracing::debug!(statefulset = %format!("{}/{}", job.namespace, job.name),
                                rule = %job.rule, from, to, reason = why.as_str(), "releaser: partition stepped");
                            "stepped"
                        }
                        JobKind::Finish | JobKind::LetGo(_) => {
                            let outcome = match job.kind {
                                JobKind::LetGo(_) => "let-go",
                                _ if job.rule == NO_RULE => "rule-gone",
                                _ => "done",
                            };
                            metrics
                                .partition_rollouts
                                .with_label_values(&[&job.rule, outcome])
                                .inc();
                            if let Some(ms) = held_for {
                                metrics
                                    .partition_held_duration
                                    .with_label_values(&[&job.rule])
                                    .observe(ms as f64 / 1000.0);
                            }
                            let (reason, note) = match job.kind {
                                JobKind::LetGo(why) => (
                                    "PacingStopped",
                                    format!(
                                        "churn-throttler stopped pacing this rollout{about_held} and left the \
                                         partition at its current value: {}",
                                        let_go_words(why)
                                    ),
                                ),
                                _ => (
                                    "RolloutReleased",
                                    format!(
                                        "churn-throttler has stepped this rollout's partition down to its \
                                         target {}{about_held}; the hold's annotations are removed",
                                        job.target
                                    ),
                                ),
                            };
                            tracing::info!(statefulset = %format!("{}/{}", job.namespace, job.name),
                                rule = %job.rule, outcome, held_s = held_for.map(|ms| ms / 1000),
                                "releaser: partition hold ended");
                            events.push((job_reference(job), reason, note));
                            outcome
                        }
                        JobKind::Cleanup => "cleaned-up",
                    };
                    *counts.entry(label).or_insert(0) += 1;
                }
                Done::NotLeader => {}
                other => {
                    let reason = match other {
                        Done::Conflict => "conflict",
                        Done::Gone => "gone",
                        _ => "error",
                    };
                    metrics
                        .partition_failures
                        .with_label_values(&[reason])
                        .inc();
                    *counts.entry(reason).or_insert(0) += 1;
                    if let Done::Error(e) = other {
                        metrics
                            .releaser_api_errors
                            .with_label_values(&["patch"])
                            .inc();
                        tracing::warn!(statefulset = %format!("{}/{}", job.namespace, job.name), error = %e,
                            "releaser: StatefulSet patch failed; retrying later (if a webhook refused it, \
                             exempt churn-throttler's ServiceAccount in the policy)");
                    }
                    let attempts = self.failed.get(&job.uid).map_or(0, |f| f.attempts) + 1;
                    // A conflict is retried as soon as the set changes; otherwise 1 s, 2 s ... 60 s.
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
        if counts.values().any(|&c| c > 0) {
            tracing::info!(
                stepped = counts.get("stepped").copied().unwrap_or(0),
                done = counts.get("done").copied().unwrap_or(0),
                let_go = counts.get("let-go").copied().unwrap_or(0),
                conflicts = counts.get("conflict").copied().unwrap_or(0),
                errors = counts.get("error").copied().unwrap_or(0),
                at = %format_time(now),
                "releaser: partitions"
            );
        }
        events.truncate(MAX_EVENTS_PER_ROUND);
        self.write_events(events, leadership).await;
    }

    /// At most one Event per namespace and rule per interval, on the set that goes next.
    async fn send_waiting_events(
        &mut self,
        plan: &StepPlan,
        held: &[HeldSet],
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
        let mut events = Vec::new();
        for w in &plan.waiting {
            if events.len() >= MAX_EVENTS_PER_ROUND {
                break;
            }
            let key = (w.namespace.clone(), w.rule.clone());
            if self.events_sent.contains_key(&key) {
                continue;
            }
            let Some(rule) = policy
                .rules
                .iter()
                .find(|r| r.action == Action::Partition && r.name == w.rule)
            else {
                continue;
            };
            let limits: Vec<String> = rule.limits.iter().map(|l| l.to_string()).collect();
            let head = &held[w.head];
            let (reason, note) = match w.blocked {
                Blocked::Rate => (
                    "Paced",
                    format!(
                        "{} StatefulSet rollout(s) in this namespace wait for their next partition step \
                         (one pod at a time): rule {:?} steps {}; it holds {} StatefulSet(s) with {} pod(s) \
                         still to re-create, served in turn across namespaces. Next step here in about {}; \
                         this one is at partition {} of {}, target {}.",
                        w.sets,
                        &*w.rule,
                        limits.join(" and "),
                        w.rule_sets,
                        w.rule_pods,
                        about(w.next_in_ms.unwrap_or(0)),
                        head.partition,
                        head.replicas,
                        head.target.unwrap_or(0),
                    ),
                ),
                Blocked::NotReady { not_ready, max } => (
                    "WaitingForReady",
                    format!(
                        "{} StatefulSet rollout(s) in this namespace wait for their next partition step: \
                         rule {:?} has {not_ready} re-created pod(s) not Ready yet (maxNotReady {max}); \
                         steps resume as they become Ready, then at {}.",
                        w.sets,
                        &*w.rule,
                        limits.join(" and "),
                    ),
                ),
            };
            self.events_sent.insert(key, now);
            events.push((set_reference(head), reason, note));
        }
        self.write_events(events, leadership).await;
    }

    async fn write_events(
        &self,
        events: Vec<(ObjectReference, &'static str, String)>,
        leadership: &Leadership,
    ) {
        let client = self.client.clone();
        let metrics = self.ctx.metrics.clone();
        let identity = self.identity.clone();
        futures::stream::iter(events)
            .for_each_concurrent(CONCURRENCY, |(regarding, reason, note)| {
                let client = client.clone();
                let metrics = metrics.clone();
                let identity = identity.clone();
                async move {
                    if !leadership.is_leader() {
                        return;
                    }
                    let namespace = regarding.namespace.clone().unwrap_or_default();
                    let api: Api<Event> = Api::namespaced(client, &namespace);
                    let event = new_event(regarding, "Partition", reason, note, &identity);
                    match within(CALL_TIMEOUT, api.create(&PostParams::default(), &event)).await {
                        Ok(_) => metrics.partition_events.with_label_values(&[reason]).inc(),
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

    fn publish_gauges(&mut self, policy: &Policy, plan: &StepPlan) {
        let metrics = &self.ctx.metrics;
        let label = |name: &str| {
            if name.is_empty() {
                NO_RULE.to_string()
            } else {
                name.to_string()
            }
        };
        let mut rules: HashSet<String> = policy
            .rules
            .iter()
            .filter(|r| r.action == Action::Partition)
            .map(|r| r.name.to_string())
            .collect();
        rules.extend(plan.held.keys().map(|k| label(k)));
        for gone in self.gauge_rules.difference(&rules) {
            let _ = metrics.partition_held.remove_label_values(&[gone]);
            let _ = metrics.partition_not_ready.remove_label_values(&[gone]);
            let _ = metrics.partition_window_steps.remove_label_values(&[gone]);
        }
        let held: HashMap<String, usize> = plan.held.iter().map(|(k, v)| (label(k), *v)).collect();
        let not_ready: HashMap<String, u32> =
            plan.not_ready.iter().map(|(k, v)| (label(k), *v)).collect();
        for rule in &rules {
            metrics
                .partition_held
                .with_label_values(&[rule])
                .set(held.get(rule).copied().unwrap_or(0) as i64);
            metrics
                .partition_not_ready
                .with_label_values(&[rule])
                .set(i64::from(not_ready.get(rule).copied().unwrap_or(0)));
            let in_window = plan.in_window.get(rule.as_str()).copied().unwrap_or(0);
            metrics
                .partition_window_steps
                .with_label_values(&[rule])
                .set(i64::from(in_window));
        }
        self.gauge_rules = rules;
    }

    /// Only the leader reports held sets; a follower's gauges would be stale.
    pub(super) fn clear_gauges(&mut self) {
        let metrics = &self.ctx.metrics;
        for rule in self.gauge_rules.drain() {
            let _ = metrics.partition_held.remove_label_values(&[&rule]);
            let _ = metrics.partition_not_ready.remove_label_values(&[&rule]);
            let _ = metrics.partition_window_steps.remove_label_values(&[&rule]);
        }
    }
}

/// No earlier than the pod's creation: when it was seen (`seen`, read after the answer),
/// or its creationTimestamp rounded up to the next second if that is sooner (a pod
/// re-created long before a new leader first looks at it). The second bound reads the
/// API server's clock; skew between it and this replica's clock shifts it by as much.
fn created_by(pod: &Pod, seen: Millis) -> Millis {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| u64::try_from(t.0.as_millisecond()).ok())
        .map_or(seen, |t| seen.min(t - t % 1_000 + 1_000))
}

fn resource_version(sts: &StatefulSet) -> &str {
    sts.metadata.resource_version.as_deref().unwrap_or_default()
}

fn reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some("StatefulSet".into()),
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

fn set_reference(set: &HeldSet) -> ObjectReference {
    reference(&set.namespace, &set.name, &set.uid)
}

fn job_reference(job: &Job) -> ObjectReference {
    reference(&job.namespace, &job.name, &job.uid)
}

fn about(ms: Millis) -> String {
    let seconds = ms.div_ceil(1000).max(1);
    format_duration(Duration::from_secs(seconds))
}

fn let_go_words(why: LetGoWhy) -> &'static str {
    match why {
        LetGoWhy::PartitionMoved => {
            "the partition was set by someone the webhook does not pace (an exempt user, an \
             excluded writer, or a write while the webhook was unavailable)"
        }
        LetGoWhy::NotRollingUpdate => "the update strategy is no longer RollingUpdate",
        LetGoWhy::Unreadable => "the partition-target annotation is not a number",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_counts_from_when_it_was_seen_or_the_second_after_its_creation_stamp() {
        let pod = |created: Option<&str>| -> Pod {
            let mut meta = serde_json::json!({ "name": "db-2" });
            if let Some(c) = created {
                meta["creationTimestamp"] = serde_json::json!(c);
            }
            serde_json::from_value(serde_json::json!({ "metadata": meta })).expect("pod json")
        };
        let t = 1_767_323_045_000; // 2026-01-02T03:04:05Z
                                   // (case, creationTimestamp, seen at, counted from)
        let cases = [
            (
                "seen at once",
                Some("2026-01-02T03:04:05Z"),
                t + 300,
                t + 300,
            ),
            (
                "seen long after (a new leader): the second after its stamp",
                Some("2026-01-02T03:04:05Z"),
                t + 60_000,
                t + 1_000,
            ),
            ("no stamp", None, t + 60_000, t + 60_000),
        ];
        for (case, created, seen, want) in cases {
            assert_eq!(created_by(&pod(created), seen), want, "{case}");
        }
    }
}
