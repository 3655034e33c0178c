//! The partition releaser's shell around the pure step plan: the watch of StatefulSets,
//! a look at the pod each step released, the patches, the Events and the metrics.
//!
//! Every term as leader starts from nothing: a fresh list+watch of all StatefulSets
//! (annotations cannot be selected on, so it filters; pod templates are dropped before
//! they are stored) rebuilds the held sets, and only then is anything stepped. The
//! windows are rebuilt every round from the sets: the step times recorded on them, and
//! the pods of their last steps, looked at before each plan (`released_pods.rs`).

use super::released_pods::{PodLooks, RECHECK_IN_FLIGHT_MS, RECHECK_MS};
use super::shell::{
    about, patch_all, run_term, Backoffs, Done, EventThrottle, EventWriter, Rounds, RuleGauges,
    Target, MAX_EVENTS_PER_ROUND, NO_RULE,
};
use super::Config;
use super::Context;
use crate::limiter::Millis;
use crate::names::format_time;
use crate::objects::statefulsets::{
    cleanup_patch, finish_patch, let_go_patch, step_patch, view, View,
};
use crate::pacing::gate::gate_rule;
use crate::pacing::gate::{longest_window, MAX_RELEASES_PER_ROUND};
use crate::pacing::partition::{
    plan_steps, Blocked, HeldSet, LetGoWhy, Move, Record, Released, StepInputs, StepPlan, StepWhy,
    TakenStep,
};
use crate::policy::{Action, Policy};
use crate::shared::{now_millis, Leadership};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::Client;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// A patch that went through: until the watch brings the set's new version, the store
/// still shows the old one, and the set is planned as the patch left it.
struct Patched {
    /// The resourceVersion the patch was sent against.
    resource_version: String,
    /// For a step: the partition it set.
    to: Option<u32>,
    /// For a move that wrote `partition-stepped-at`: what it wrote.
    record: Option<Vec<Millis>>,
}

pub(super) struct PartitionReleaser {
    client: Client,
    ctx: Arc<Context>,
    looks: PodLooks,
    failed: Backoffs,
    patched: HashMap<String, Patched>,
    /// Steps taken while the windows can see them, for the spacing.
    taken: Vec<TakenStep>,
    throttle: EventThrottle,
    events: EventWriter,
    gauges: RuleGauges,
}

#[derive(Debug, Clone, Copy)]
enum JobKind {
    Step { from: u32, to: u32, why: StepWhy },
    Finish,
    LetGo(LetGoWhy),
    Cleanup,
}

struct Job {
    target: Target,
    kind: JobKind,
    /// The rule as a metric label.
    rule: String,
    target_partition: u32,
    held_since: Option<Millis>,
    /// For a step: the `partition-stepped-at` it writes, if it changes.
    record: Option<Vec<Millis>>,
}

/// The StatefulSets of one round: those held, and records of finished rollouts.
struct Sets {
    held: Vec<HeldSet>,
    held_objects: Vec<Arc<StatefulSet>>,
    records: Vec<Record>,
    record_objects: Vec<Arc<StatefulSet>>,
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
        let metrics = &ctx.metrics;
        let events = EventWriter::new(
            &client,
            config,
            "Partition",
            &metrics.partition.partition_events,
            metrics,
        );
        let gauges = RuleGauges::new(vec![
            metrics.partition.partition_held.clone(),
            metrics.partition.partition_not_ready.clone(),
            metrics.partition.partition_window_steps.clone(),
        ]);
        PartitionReleaser {
            client,
            ctx,
            looks: PodLooks::default(),
            failed: Backoffs::default(),
            patched: HashMap::new(),
            taken: Vec::new(),
            throttle: EventThrottle::new(config.event_interval),
            events,
            gauges,
        }
    }

    /// One term as leader: rebuild from every StatefulSet (annotations cannot be
    /// selected on, so it filters), then step until cancelled.
    pub(super) async fn term(&mut self, leadership: &Leadership) -> anyhow::Result<()> {
        let sets: Api<StatefulSet> = Api::all(self.client.clone());
        let metrics = self.ctx.metrics.clone();
        let config = watcher::Config::default();
        run_term(
            self,
            sets,
            config,
            slim,
            metrics,
            "statefulsets",
            leadership,
        )
        .await
    }

    /// Sorts the sets into held and records, and lays what this process knows over the
    /// store's copies: back-offs, and steps whose new version the watch has not brought.
    fn read(&mut self, reader: &Store<StatefulSet>, now: Millis) -> Sets {
        let mut sets = Sets {
            held: Vec::new(),
            held_objects: Vec::new(),
            records: Vec::new(),
            record_objects: Vec::new(),
        };
        for object in reader.state() {
            match view(&object) {
                View::Held(set) => {
                    sets.held.push(set);
                    sets.held_objects.push(object);
                }
                View::Record(record) => {
                    sets.records.push(record);
                    sets.record_objects.push(object);
                }
                View::Ignored => {}
            }
        }
        let live: HashMap<&str, &str> = sets
            .held
            .iter()
            .map(|s| (s.uid.as_str(), s.resource_version.as_str()))
            .chain(
                sets.records
                    .iter()
                    .zip(&sets.record_objects)
                    .map(|(r, o)| (r.uid.as_str(), resource_version(o))),
            )
            .collect();
        self.failed.keep_unchanged(&live);
        self.patched.retain(|uid, p| {
            live.get(uid.as_str())
                .is_some_and(|rv| *rv == p.resource_version)
        });
        for set in sets.held.iter_mut() {
            set.backoff = self.failed.waiting(&set.uid, now);
            if let Some(p) = self.patched.get(&set.uid) {
                // A step just taken is in flight, whatever the stale copy says, and the
                // times it recorded count (those of pods it took out of the looked-at
                // ones).
                if let Some(to) = p.to {
                    set.partition = to;
                    set.held = Some(to);
                    set.unlooked();
                }
                if let Some(record) = &p.record {
                    set.stepped_at = record.clone();
                }
                set.backoff = true;
            }
        }
        self.looks.retain(&sets.held);
        sets
    }

    /// The network window's room for replacement pods, from the gate releaser's last round
    /// in this process (`NetworkRoom::for_steps`: the pods it counts in flight and the
    /// pods of adaptive gate rules still gated). No word from it yet: no room (a missing
    /// signal never opens the window).
    fn network_room(&self, policy: &Policy) -> Option<u32> {
        policy.network?;
        let snapshot = self.ctx.queue.get();
        let Some(room) = snapshot.as_deref().and_then(|s| s.network()) else {
            return Some(0);
        };
        let gated = snapshot.as_deref().map_or(0, |s| {
            s.pods()
                .iter()
                .filter(|p| gate_rule(policy, &p.rule).is_some_and(|r| r.adaptive))
                .count() as u32
        });
        Some(room.for_steps(gated))
    }

    /// Plans the steps and remembers those taken, for the spacing of the next rounds.
    fn plan(&mut self, policy: &Policy, sets: &Sets, now: Millis) -> StepPlan {
        let horizon = longest_window(policy);
        self.taken.retain(|t| t.at + horizon > now);
        let plan = plan_steps(&StepInputs {
            held: &sets.held,
            records: &sets.records,
            taken: &self.taken,
            policy,
            now,
            max_moves: MAX_RELEASES_PER_ROUND,
            network_room: self.network_room(policy),
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
                    namespace: sets.held[*index].namespace.clone(),
                    at: now,
                });
            }
        }
        plan
    }

    /// The patches of a plan: its moves, then cleanups of records not in back-off.
    fn jobs(&self, plan: &StepPlan, sets: &Sets, now: Millis) -> Vec<Job> {
        let mut jobs = Vec::new();
        for m in &plan.moves {
            let set = &sets.held[m.index()];
            let object = &sets.held_objects[m.index()];
            let annotations = object.metadata.annotations.clone().unwrap_or_default();
            let rv = &set.resource_version;
            let step_record = match m {
                Move::Step { record, .. } => record.clone(),
                _ => None,
            };
            let (patch, kind, rule) = match m {
                Move::Step {
                    rule,
                    from,
                    to,
                    why,
                    record,
                    ..
                } => (
                    step_patch(rv, *to, record.as_deref()),
                    JobKind::Step {
                        from: *from,
                        to: *to,
                        why: *why,
                    },
                    rule,
                ),
                Move::Finish { rule, record, .. } => (
                    finish_patch(rv, &annotations, record),
                    JobKind::Finish,
                    rule,
                ),
                Move::LetGo {
                    rule, why, record, ..
                } => (
                    let_go_patch(rv, set.partition, &annotations, record),
                    JobKind::LetGo(*why),
                    rule,
                ),
            };
            jobs.push(Job {
                target: set_target(&set.namespace, &set.name, &set.uid, rv, patch),
                kind,
                rule: rule.as_deref().unwrap_or(NO_RULE).to_string(),
                target_partition: set.target.unwrap_or(0),
                held_since: set.held_since,
                record: step_record,
            });
        }
        for &index in plan.cleanups.iter().take(MAX_RELEASES_PER_ROUND) {
            let record = &sets.records[index];
            let object = &sets.record_objects[index];
            if self.failed.waiting(&record.uid, now) {
                continue;
            }
            let annotations = object.metadata.annotations.clone().unwrap_or_default();
            let rv = resource_version(object);
            let patch = cleanup_patch(rv, &annotations);
            jobs.push(Job {
                target: set_target(&record.namespace, &record.name, &record.uid, rv, patch),
                kind: JobKind::Cleanup,
                rule: NO_RULE.to_string(),
                target_partition: 0,
                held_since: None,
                record: None,
            });
        }
        jobs
    }

    async fn run_jobs(&mut self, jobs: Vec<Job>, leadership: &Leadership, now: Millis) {
        if jobs.is_empty() {
            return;
        }
        let results =
            patch_all::<StatefulSet, Job>(&self.client, jobs, |j| &j.target, leadership).await;
        let metrics = self.ctx.metrics.clone();
        let mut counts: BTreeMap<&'static str, u32> = BTreeMap::new();
        let mut events: Vec<(ObjectReference, &'static str, String)> = Vec::new();
        for (job, done) in &results {
            if let Some(failure) = done.failure() {
                metrics
                    .partition
                    .partition_failures
                    .with_label_values(&[failure])
                    .inc();
                *counts.entry(failure).or_insert(0) += 1;
                if let Done::Error(e) = done {
                    metrics
                        .releaser
                        .releaser_api_errors
                        .with_label_values(&["patch"])
                        .inc();
                    tracing::warn!(statefulset = %job.target.pod_name(), error = %e,
                        "releaser: StatefulSet patch failed; retrying later (if a webhook refused it, \
                         exempt churn-throttler's ServiceAccount in the policy)");
                }
                // A conflict is retried as soon as the set changes.
                self.failed.failed(&job.target, now);
            } else if let Done::Patched = done {
                let (label, event) = self.patched(job, now);
                *counts.entry(label).or_insert(0) += 1;
                events.extend(event);
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
        self.events.write(events, leadership).await;
    }

    /// Records a patch that went through and counts it; returns its outcome's label and,
    /// for a hold that ended, the Event that says so.
    fn patched(
        &mut self,
        job: &Job,
        now: Millis,
    ) -> (
        &'static str,
        Option<(ObjectReference, &'static str, String)>,
    ) {
        let metrics = &self.ctx.metrics;
        self.failed.succeeded(&job.target.uid);
        self.patched.insert(
            job.target.uid.clone(),
            Patched {
                resource_version: job.target.resource_version.clone(),
                to: match job.kind {
                    JobKind::Step { to, .. } => Some(to),
                    _ => None,
                },
                record: job.record.clone(),
            },
        );
        let statefulset = job.target.pod_name();
        let outcome = match job.kind {
            JobKind::Step { from, to, why } => {
                metrics
                    .partition
                    .partition_steps
                    .with_label_values(&[&job.rule, why.as_str()])
                    .inc();
                tracing::debug!(%statefulset, rule = %job.rule, from, to, reason = why.as_str(),
                    "releaser: partition stepped");
                return ("stepped", None);
            }
            JobKind::Cleanup => return ("cleaned-up", None),
            JobKind::LetGo(_) => "let-go",
            JobKind::Finish if job.rule == NO_RULE => "rule-gone",
            JobKind::Finish => "done",
        };
        metrics
            .partition
            .partition_rollouts
            .with_label_values(&[&job.rule, outcome])
            .inc();
        let held_for = job.held_since.map(|t| now.saturating_sub(t));
        if let Some(ms) = held_for {
            metrics
                .partition
                .partition_held_duration
                .with_label_values(&[&job.rule])
                .observe(ms as f64 / 1000.0);
        }
        let about_held = held_for
            .map(|ms| format!(" after {} held", about(ms)))
            .unwrap_or_default();
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
                    job.target_partition
                ),
            ),
        };
        tracing::info!(%statefulset, rule = %job.rule, outcome, held_s = held_for.map(|ms| ms / 1000),
            "releaser: partition hold ended");
        let t = &job.target;
        (
            outcome,
            Some((reference(&t.namespace, &t.name, &t.uid), reason, note)),
        )
    }

    /// At most one Event per namespace and rule per interval, on the set that goes next.
    async fn send_waiting_events(
        &mut self,
        plan: &StepPlan,
        held: &[HeldSet],
        leadership: &Leadership,
        now: Millis,
    ) {
        let waiting = plan
            .waiting
            .iter()
            .map(|w| (w.namespace.clone(), w.rule.clone()))
            .collect();
        self.throttle.keep_waiting(waiting, now);
        let policy = self.ctx.policy_at(now);
        let mut events = Vec::new();
        for w in &plan.waiting {
            if events.len() >= MAX_EVENTS_PER_ROUND {
                break;
            }
            if !self.throttle.is_due(&w.namespace, &w.rule) {
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
                Blocked::Network => (
                    "WaitingForNetwork",
                    format!(
                        "{} StatefulSet rollout(s) in this namespace wait for their next partition step: \
                         the network window has no room for the replacement pod (rule {:?}); steps resume \
                         as released pods get their network.",
                        w.sets, &*w.rule,
                    ),
                ),
                Blocked::Paused { until } => (
                    "Paused",
                    format!(
                        "{} StatefulSet rollout(s) in this namespace wait for their next partition step: \
                         rule {:?} is paused (by its schedule or `churn-throttler pause`) until {}; steps resume then.",
                        w.sets,
                        &*w.rule,
                        crate::names::format_pause_end(until),
                    ),
                ),
                Blocked::NotReady { not_ready, max } => (
                    "WaitingForReady",
                    format!(
                        "{} StatefulSet rollout(s) in this namespace wait for their next partition step: \
                         rule {:?} has {not_ready} released pod(s) not Ready yet (maxNotReady {max}); \
                         steps resume as they become Ready, then at {}.",
                        w.sets,
                        &*w.rule,
                        limits.join(" and "),
                    ),
                ),
            };
            self.throttle.sent(&w.namespace, &w.rule, now);
            events.push((
                reference(&head.namespace, &head.name, &head.uid),
                reason,
                note,
            ));
        }
        self.events.write(events, leadership).await;
    }

    fn publish_gauges(&mut self, policy: &Policy, plan: &StepPlan) {
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
        let held: HashMap<String, usize> = plan.held.iter().map(|(k, v)| (label(k), *v)).collect();
        let not_ready: HashMap<String, u32> =
            plan.not_ready.iter().map(|(k, v)| (label(k), *v)).collect();
        self.gauges.publish(rules, |gauge, rule| match gauge {
            0 => held.get(rule).copied().unwrap_or(0) as i64,
            1 => i64::from(not_ready.get(rule).copied().unwrap_or(0)),
            _ => i64::from(plan.in_window.get(rule).copied().unwrap_or(0)),
        });
    }

    pub(super) fn clear_gauges(&mut self) {
        self.gauges.clear();
    }
}

impl Rounds for PartitionReleaser {
    type Object = StatefulSet;

    fn start_term(&mut self) {
        self.failed.clear();
        self.patched.clear();
        self.looks.clear();
    }

    async fn round(
        &mut self,
        reader: &Store<StatefulSet>,
        leadership: &Leadership,
        now: Millis,
        first: bool,
    ) -> Option<Millis> {
        let policy = self.ctx.policy_at(now);
        let mut sets = self.read(reader, now);
        let just_stepped: HashSet<String> = self
            .patched
            .iter()
            .filter(|(_, p)| p.to.is_some())
            .map(|(uid, _)| uid.clone())
            .collect();
        let looked = self
            .looks
            .look(
                &self.client,
                &self.ctx.metrics,
                (&mut sets.held, &sets.held_objects),
                &just_stepped,
                leadership,
                now,
            )
            .await;
        // Times seen while looking are later than `now`; plan after them.
        let now = now_millis().max(now);
        let plan = self.plan(&policy, &sets, now);
        if first {
            log_first_round(&sets, &plan);
        }
        self.publish_gauges(&policy, &plan);
        let jobs = self.jobs(&plan, &sets, now);
        self.run_jobs(jobs, leadership, now).await;
        self.send_waiting_events(&plan, &sets.held, leadership, now)
            .await;

        // A pod still in flight or starting is looked at again soon even if nothing
        // changes: one whose deletion is not seen yet holds a slot, so sooner.
        let again = sets
            .held
            .iter()
            .flat_map(HeldSet::looked)
            .filter_map(|r| match r {
                Released::InFlight => Some(RECHECK_IN_FLIGHT_MS),
                Released::Starting { .. } => Some(RECHECK_MS),
                Released::None | Released::Settled { .. } => None,
            })
            .min();
        let mut wake = plan.wake_at;
        if let Some(again) = again {
            let again = now + again;
            wake = Some(wake.map_or(again, |w| w.min(again)));
        }
        if let Some(change) = self.ctx.next_change(now) {
            wake = Some(wake.map_or(change, |w| w.min(change)));
        }
        if !looked {
            wake = Some(now);
        }
        wake
    }
}

fn log_first_round(sets: &Sets, plan: &StepPlan) {
    let recorded: usize = sets
        .held
        .iter()
        .map(|s| s.stepped_at.len())
        .chain(sets.records.iter().map(|r| r.stepped_at.len()))
        .sum();
    let in_flight = sets
        .held
        .iter()
        .flat_map(HeldSet::looked)
        .filter(|r| *r == Released::InFlight)
        .count();
    tracing::info!(
        held = sets.held.len(),
        records = sets.records.len(),
        recorded_steps = recorded,
        in_flight,
        in_window = plan.in_window.values().copied().max().unwrap_or(0),
        "releaser: leading; held StatefulSets rebuilt from the cluster, windows from partition-stepped-at and the pods in flight"
    );
}

fn set_target(
    namespace: &str,
    name: &str,
    uid: &str,
    resource_version: &str,
    patch: json_patch::Patch,
) -> Target {
    Target {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
        resource_version: resource_version.into(),
        patch,
    }
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
