//! The releaser's shell around the pure plan: the lease, the watch of labelled pods,
//! the patches that lift gates, the Events on waiting pods, and the metrics.
//!
//! Every term as leader starts from nothing: a fresh list+watch of the pods labelled
//! `churn-throttler.io/gated` rebuilds the queue, the released-at annotations seed the
//! windows, and only then does anything get released. Releases are charged in the
//! webhook's own limiter, so on the leading replica the pods the webhook admits
//! ungated and the pods the releaser lifts share one window per rule.

use super::partition::PartitionReleaser;
use super::shell::{
    about, keep_all, patch_all, run_term, Backoffs, Done, EventThrottle, EventWriter, NodeWatch,
    Rounds, RuleGauges, Target, MAX_EVENTS_PER_ROUND, NO_RULE,
};
use super::{Config, Context};
use crate::election as lease;
use crate::limiter::Millis;
use crate::names::{format_time, GATED_LABEL, GATE_NAME, NETWORK_WINDOW_ANNOTATION};
use crate::objects::pods::{
    mark_released_patch, network_view, release_patch, unlabel_patch, view, View,
};
use crate::pacing::gate::{
    charge, gate_rule, labels_to_drop, not_ready_by_rule, order, record_seeds, to_seed, Blocked,
    Charged, Cursor, Inputs, Plan, QueuedPod, ReleaseWhy, ReleasedPod, MAX_RELEASES_PER_ROUND,
};
use crate::pacing::network::{
    Change, NetworkRoom, NetworkStatus, NetworkWindow, PodNetwork, Tracker,
};
use crate::policy::Policy;
use crate::queue::{estimate, EstimateInputs, Snapshot, MAX_ESTIMATED};
use crate::shared::{Leadership, ReleaserRole};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::Client;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Runs the releaser until `shutdown`: connects (retrying while there is no cluster),
/// takes part in the election, and releases while it leads.
pub async fn run(config: Config, ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let missing = "releaser: no usable Kubernetes configuration (in-cluster service account, KUBECONFIG or \
                   ~/.kube/config); gated pods are not released until it is found. Turn the releaser off \
                   with --releaser=false";
    let Some(client) = ctx.kube.get(&mut shutdown, missing).await else {
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
    let nodes = NodeWatch::start(&client, ctx.metrics.clone());
    let mut releaser = Releaser::new(client.clone(), ctx.clone(), &config, nodes);
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

struct Releaser {
    client: Client,
    ctx: Arc<Context>,
    /// The shared network window of the adaptive rules and the pods it measures; None
    /// until a policy has adaptive rules (then started from the Lease's note).
    network: Option<(NetworkWindow, Tracker)>,
    /// Which nodes are Ready: the window leaves out pods on the others.
    nodes: NodeWatch,
    /// The Lease's notes: the window is recorded there for the next leader.
    notes: Arc<crate::election::Notes>,
    /// The Lease's namespace: the policy's ConfigMap (churn-throttler-policy) lives there
    /// in the shipped manifests, and an Event on it tells of a hard cut of the window.
    namespace: String,
    /// A hard cut to tell in an Event this round, and when the last one was written.
    window_cut: Option<String>,
    window_cut_told: Option<Millis>,
    charged: Charged,
    cursor: Cursor,
    failed: Backoffs,
    throttle: EventThrottle,
    events: EventWriter,
    gauges: RuleGauges,
}

/// One pod to patch, with what the patch needs.
struct Job {
    target: Target,
    rule: String,
    reason: &'static str,
    waited_ms: Millis,
}

impl Releaser {
    fn new(client: Client, ctx: Arc<Context>, config: &Config, nodes: NodeWatch) -> Releaser {
        let metrics = &ctx.metrics;
        let events = EventWriter::new(&client, config, "Gate", &metrics.gate.gate_events, metrics);
        let gauges = RuleGauges::new(vec![
            metrics.gate.gate_queue.clone(),
            metrics.gate.gate_not_ready.clone(),
        ]);
        Releaser {
            client,
            ctx,
            network: None,
            nodes,
            notes: config.lease.notes.clone(),
            namespace: config.lease.namespace.clone(),
            window_cut: None,
            window_cut_told: None,
            charged: Charged::default(),
            cursor: Cursor::default(),
            failed: Backoffs::default(),
            throttle: EventThrottle::new(config.event_interval),
            events,
            gauges,
        }
    }

    /// One term as leader: rebuild from the pods labelled gated, then release until cancelled.
    async fn term(&mut self, leadership: &Leadership) -> anyhow::Result<()> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default().labels(GATED_LABEL);
        let metrics = self.ctx.metrics.clone();
        run_term(
            self,
            pods,
            config,
            keep_all,
            metrics,
            "gated pods",
            leadership,
        )
        .await
    }

    /// Sorts the labelled pods into gated, ungated by someone else and released; pods in
    /// back-off after a refused patch sit the round out.
    fn read(&mut self, reader: &Store<Pod>, now: Millis) -> Pods {
        let mut pods = Pods::default();
        for object in reader.state() {
            let has_annotations = object.metadata.annotations.is_some();
            match view(&object) {
                View::Queued { pod, gate_index } => {
                    pods.queue.push(pod);
                    pods.gate_at.push((gate_index, has_annotations));
                }
                View::UngatedElsewhere { pod } => pods.ungated.push((pod, has_annotations)),
                View::Released(pod) => {
                    pods.network
                        .push((pod.rule.clone(), network_view(&object, &pod)));
                    pods.released.push(pod);
                }
                View::Ignored => {}
            }
        }
        let live: HashMap<&str, &str> = pods
            .queue
            .iter()
            .chain(pods.ungated.iter().map(|(p, _)| p))
            .map(|p| (p.uid.as_str(), p.resource_version.as_str()))
            .collect();
        self.failed.keep_unchanged(&live);
        pods.ungated
            .retain(|(pod, _)| !self.failed.waiting(&pod.uid, now));
        for (pod, gate) in pods.queue.iter().zip(&pods.gate_at) {
            if !self.failed.waiting(&pod.uid, now) {
                pods.eligible.push(pod.clone());
                pods.eligible_gate.push(*gate);
            }
        }
        pods
    }

    /// Seeds the windows, counts pods ungated by hand, and plans. What needs no windows
    /// (which releases to seed, the queue's release order) is worked out first; the
    /// limiter's lock, which every admission decision takes too, is held only to charge.
    fn plan(
        &mut self,
        policy: &Policy,
        pods: &Pods,
        not_ready: &HashMap<String, u32>,
        network: Option<NetworkRoom>,
        now: Millis,
    ) -> (Plan, usize) {
        let seeds = to_seed(
            policy,
            &pods.released,
            &self.charged,
            &self.ctx.instance,
            now,
        );
        let inputs = Inputs {
            queue: &pods.eligible,
            not_ready,
            policy,
            now,
            max_releases: MAX_RELEASES_PER_ROUND,
            network,
        };
        let ordered = order(&inputs, &self.cursor);
        let mut limiter = self.ctx.limiter();
        let seeded = record_seeds(&mut limiter, &seeds, &mut self.charged);
        // Pods un-gated by hand are counted now, before anything else is planned.
        for (pod, _) in &pods.ungated {
            if let Some(rule) = gate_rule(policy, &pod.rule) {
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
        let charged = charge(ordered, &mut limiter, &mut self.cursor);
        drop(limiter);
        (charged.into_plan(), seeded)
    }

    /// The patches of a plan: lift the gate of each release, mark pods ungated elsewhere.
    fn jobs(policy: &Policy, plan: &Plan, pods: &Pods, now: Millis) -> Vec<Job> {
        let target = |pod: &QueuedPod, patch| Target {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            resource_version: pod.resource_version.clone(),
            patch,
        };
        let mut jobs = Vec::new();
        for release in &plan.releases {
            let pod = &pods.eligible[release.index];
            let (gate_index, has_annotations) = pods.eligible_gate[release.index];
            jobs.push(Job {
                target: target(
                    pod,
                    release_patch(&pod.resource_version, gate_index, has_annotations, now),
                ),
                rule: metric_rule(policy, &pod.rule),
                reason: match release.why {
                    ReleaseWhy::Rate => "rate",
                    ReleaseWhy::RuleGone => "rule-gone",
                },
                waited_ms: release.waited_ms,
            });
        }
        for (pod, has_annotations) in &pods.ungated {
            jobs.push(Job {
                target: target(
                    pod,
                    mark_released_patch(&pod.resource_version, *has_annotations, now),
                ),
                rule: metric_rule(policy, &pod.rule),
                reason: "ungated-elsewhere",
                waited_ms: now.saturating_sub(pod.created),
            });
        }
        jobs
    }

    async fn run_jobs(&mut self, jobs: Vec<Job>, leadership: &Leadership, now: Millis) {
        if jobs.is_empty() {
            return;
        }
        let results = patch_all::<Pod, Job>(&self.client, jobs, |j| &j.target, leadership).await;
        let metrics = &self.ctx.metrics;
        let mut released: HashMap<&str, u32> = HashMap::new();
        let mut errors = 0;
        for (job, done) in &results {
            let Some(failure) = done.failure() else {
                if let Done::Patched = done {
                    self.charged.insert(&job.target.uid, now);
                    self.failed.succeeded(&job.target.uid);
                    metrics
                        .gate
                        .gate_releases
                        .with_label_values(&[&job.rule, job.reason])
                        .inc();
                    metrics
                        .gate
                        .gate_wait
                        .with_label_values(&[&job.rule])
                        .observe(job.waited_ms as f64 / 1000.0);
                    *released.entry(job.reason).or_insert(0) += 1;
                    tracing::debug!(pod = %job.target.pod_name(), rule = %job.rule,
                        reason = job.reason, waited_s = job.waited_ms / 1000, "releaser: released");
                }
                continue;
            };
            metrics
                .gate
                .gate_release_failures
                .with_label_values(&[failure])
                .inc();
            if let Done::Error(e) = done {
                errors += 1;
                metrics
                    .releaser
                    .releaser_api_errors
                    .with_label_values(&["patch"])
                    .inc();
                tracing::warn!(pod = %job.target.pod_name(), error = %e,
                    "releaser: release patch failed; retrying later");
            }
            self.failed.failed(&job.target, now);
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
        let jobs: Vec<Target> = labels_to_drop(released, policy, now)
            .into_iter()
            .take(MAX_RELEASES_PER_ROUND)
            .map(|i| Target {
                namespace: released[i].namespace.clone(),
                name: released[i].name.clone(),
                uid: String::new(),
                resource_version: String::new(),
                patch: unlabel_patch(),
            })
            .collect();
        for (target, done) in patch_all::<Pod, Target>(&self.client, jobs, |t| t, leadership).await
        {
            if let Done::Error(e) = done {
                self.ctx
                    .metrics
                    .releaser
                    .releaser_api_errors
                    .with_label_values(&["patch"])
                    .inc();
                tracing::warn!(pod = %target.pod_name(), error = %e,
                    "releaser: could not drop the label of a released pod");
            }
        }
    }

    /// At most one Event per namespace and rule per interval, on the oldest waiting pod.
    async fn send_events(
        &mut self,
        plan: &Plan,
        queue: &[QueuedPod],
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
        let mut due: Vec<&crate::pacing::gate::Waiting> = plan
            .waiting
            .iter()
            .filter(|w| self.throttle.is_due(&w.namespace, &w.rule))
            .collect();
        // Oldest heads first, so a cap on Events per round still reaches everyone in turn.
        due.sort_by_key(|w| queue[w.head].created);
        due.truncate(MAX_EVENTS_PER_ROUND);
        let when = if due.iter().any(|w| w.blocked == Blocked::Rate) {
            self.estimates(&policy, plan, queue, now)
        } else {
            HashMap::new()
        };
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
                        about(first_and_last(&when, w).0),
                        about(first_and_last(&when, w).1),
                    ),
                ),
                Blocked::Network { in_flight, window } => (
                    "WaitingForNetwork",
                    format!(
                        "{} pod(s) in this namespace wait behind the scheduling gate {GATE_NAME}: the network \
                         window is full ({in_flight} released pod(s) wait for their network, window {window}, \
                         sized from how fast pods get their network); releases resume as their network comes \
                         up. {} pod(s) wait for rule {:?} in {} namespace(s).",
                        w.pods,
                        w.rule_pods,
                        &*w.rule,
                        w.rule_namespaces,
                    ),
                ),
                Blocked::Paused { until } => (
                    "Paused",
                    format!(
                        "{} pod(s) in this namespace wait behind the scheduling gate {GATE_NAME}: rule {:?} \
                         is paused (by its schedule or `churn-throttler pause`) until {}; releases resume then at {}. {} pod(s) wait \
                         for it in {} namespace(s).",
                        w.pods,
                        &*w.rule,
                        crate::names::format_pause_end(until),
                        limits.join(" and "),
                        w.rule_pods,
                        w.rule_namespaces,
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
            self.throttle.sent(&w.namespace, &w.rule, now);
            events.push((pod_reference(head), reason, note));
        }
        self.events.write(events, leadership).await;
    }

    /// When the pods still waiting after this round's releases are expected to go, per
    /// rule and namespace (the first and the last), from the windows as they are now and
    /// this releaser's round-robin position: the estimate `status` and the webhook use.
    fn estimates(
        &self,
        policy: &Policy,
        plan: &Plan,
        queue: &[QueuedPod],
        now: Millis,
    ) -> HashMap<(Arc<str>, String), (Millis, Millis)> {
        let released: HashSet<usize> = plan.releases.iter().map(|r| r.index).collect();
        let waiting: Vec<QueuedPod> = queue
            .iter()
            .enumerate()
            .filter(|(i, _)| !released.contains(i))
            .map(|(_, p)| p.clone())
            .collect();
        let rules: HashSet<&str> = plan.waiting.iter().map(|w| &*w.rule).collect();
        let mut scratch = self.ctx.limiter().copy_rules(|r| rules.contains(r));
        let estimated = estimate(
            &EstimateInputs {
                queue: &waiting,
                policy,
                cursor: &self.cursor,
                now,
                max_releases: MAX_ESTIMATED,
            },
            &mut scratch,
        );
        let mut when: HashMap<(Arc<str>, String), (Millis, Millis)> = HashMap::new();
        for (pod, e) in waiting.iter().zip(estimated) {
            let (Some(rule), Some(at)) = (e.rule, e.at) else {
                continue;
            };
            let wait = at.saturating_sub(now);
            when.entry((rule, pod.namespace.clone()))
                .and_modify(|(first, last)| {
                    *first = (*first).min(wait);
                    *last = (*last).max(wait);
                })
                .or_insert((wait, wait));
        }
        when
    }

    /// What the webhook in this process knows of the queue: the pods still waiting after
    /// this round's releases, and the round-robin position.
    fn publish_queue(
        &self,
        policy: &Policy,
        plan: &Plan,
        pods: &Pods,
        network: Option<NetworkRoom>,
    ) {
        let released: HashSet<&str> = plan
            .releases
            .iter()
            .map(|r| pods.eligible[r.index].uid.as_str())
            .collect();
        let waiting = pods
            .queue
            .iter()
            .filter(|p| !released.contains(p.uid.as_str()))
            .cloned()
            .collect();
        // The window after this round's releases of adaptive rules.
        let network = network.map(|room| NetworkRoom {
            in_flight: room.in_flight
                + plan
                    .releases
                    .iter()
                    .filter(|r| {
                        r.rule
                            .as_deref()
                            .and_then(|rule| gate_rule(policy, rule))
                            .is_some_and(|rule| rule.adaptive)
                    })
                    .count() as u32,
            ..room
        });
        self.ctx.queue.set(Some(
            Snapshot::new(waiting, self.cursor.clone()).with_network(network),
        ));
    }

    /// An Event on the policy's ConfigMap for a hard cut of the network window, at most
    /// one per event interval.
    async fn tell_window_cut(&mut self, leadership: &Leadership, now: Millis) {
        let Some(note) = self.window_cut.take() else {
            return;
        };
        if self
            .window_cut_told
            .is_some_and(|at| now.saturating_sub(at) < WINDOW_CUT_EVENT_INTERVAL_MS)
        {
            return;
        }
        self.window_cut_told = Some(now);
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            name: Some(POLICY_CONFIGMAP.into()),
            namespace: Some(self.namespace.clone()),
            ..Default::default()
        };
        self.events
            .write(vec![(regarding, "NetworkWindowCut", note)], leadership)
            .await;
    }

    /// Feeds the network window what this round sees of the adaptive rules' released
    /// pods; None when no rule is adaptive. The window moves only on a sample.
    fn measure_network(
        &mut self,
        policy: &Policy,
        pods: &Pods,
        now: Millis,
    ) -> Option<NetworkRoom> {
        let Some(config) = policy.network else {
            self.network = None;
            return None;
        };
        let notes = &self.notes;
        let (window, tracker) = self.network.get_or_insert_with(|| {
            let start = notes
                .seen(NETWORK_WINDOW_ANNOTATION)
                .and_then(|v| v.split_whitespace().next().and_then(|w| w.parse().ok()));
            (NetworkWindow::new(config, start), Tracker::default())
        });
        if window.config() != config {
            window.reconfigure(config);
        }
        let adaptive: Vec<PodNetwork> = pods
            .network
            .iter()
            .filter(|(rule, _)| gate_rule(policy, rule).is_some_and(|r| r.adaptive))
            .map(|(_, p)| p.clone())
            .collect();
        let nodes = &self.nodes;
        let observed = tracker.observe(now, &adaptive, config.bound_ms, |n| nodes.is_ready(n));
        let metrics = &self.ctx.metrics.gate;
        let before = window.window();
        for sample in &observed.samples {
            window.observe(sample);
            let outcome = if sample.censored {
                "censored"
            } else {
                "sample"
            };
            metrics.network_samples.with_label_values(&[outcome]).inc();
        }
        for (outcome, n) in [
            ("deleted-first", observed.deleted_first),
            ("node-not-ready", observed.node_not_ready),
        ] {
            if n > 0 {
                metrics
                    .network_samples
                    .with_label_values(&[outcome])
                    .inc_by(u64::from(n));
            }
        }
        let status = window.status();
        if status.cut_hard && status.window < before {
            self.window_cut = Some(format!(
                "The network window of the adaptive rules was cut from {before} to {} pods: {} \
                 (network time p90 {}, floor {}; {} released pods wait for their network). Gated \
                 pods are released as their network comes up (docs/adaptive.md).",
                status.window,
                match status.last_change {
                    Change::Remeasure => "the floor is being measured again",
                    _ => "a queue showed in the pods' network times",
                },
                describe_ms(status.p90_ms),
                describe_ms(status.floor_ms),
                observed.in_flight,
            ));
        }
        if status.window != before {
            tracing::info!(
                window = status.window,
                before,
                reason = status.last_change.as_str(),
                floor_ms = status.floor_ms,
                p90_ms = status.p90_ms,
                "releaser: network window changed"
            );
        }
        metrics.network_window.set(i64::from(status.window));
        metrics.network_min_window.set(i64::from(config.min_window));
        metrics.network_in_flight.set(i64::from(observed.in_flight));
        metrics
            .network_floor_seconds
            .set(status.floor_ms.map_or(0.0, |f| f as f64 / 1000.0));
        metrics
            .network_p90_seconds
            .set(status.p90_ms.map_or(0.0, |f| f as f64 / 1000.0));
        for change in Change::ALL {
            metrics
                .network_last_change
                .with_label_values(&[change.as_str()])
                .set(i64::from(change == status.last_change));
        }
        notes.set(NETWORK_WINDOW_ANNOTATION, describe_network(&status));
        Some(NetworkRoom {
            in_flight: observed.in_flight,
            window: status.window,
        })
    }

    fn publish_gauges(
        &mut self,
        policy: &Policy,
        queue: &[QueuedPod],
        not_ready: &HashMap<String, u32>,
    ) {
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
        self.gauges.publish(rules, |gauge, rule| match gauge {
            0 => queued.get(rule).copied().unwrap_or(0),
            _ => i64::from(not_ready.get(rule).copied().unwrap_or(0)),
        });
    }

    /// At the end of a term: the gauges and the queue it published (a follower's would
    /// be stale).
    fn clear_gauges(&mut self) {
        self.gauges.clear();
        self.ctx.queue.set(None);
    }
}

/// The labelled pods of one round, sorted by what they wait for.
#[derive(Default)]
struct Pods {
    queue: Vec<QueuedPod>,
    /// Per queued pod: the index of churn-throttler's gate, and whether it has annotations.
    gate_at: Vec<(usize, bool)>,
    ungated: Vec<(QueuedPod, bool)>,
    released: Vec<ReleasedPod>,
    /// What the network window reads of each released pod, with its rule.
    network: Vec<(String, PodNetwork)>,
    /// The queued pods not in back-off, and their gates.
    eligible: Vec<QueuedPod>,
    eligible_gate: Vec<(usize, bool)>,
}

impl Rounds for Releaser {
    type Object = Pod;

    // Releases this process made in an earlier term are in the limiter already;
    // anything else in the window is seeded from the annotations.
    fn start_term(&mut self) {
        self.failed.clear();
    }

    async fn round(
        &mut self,
        reader: &Store<Pod>,
        leadership: &Leadership,
        now: Millis,
        first: bool,
    ) -> Option<Millis> {
        let policy = self.ctx.policy_at(now);
        let pods = self.read(reader, now);
        self.charged.prune(&policy, now);
        let not_ready = not_ready_by_rule(&pods.released);
        let network = self.measure_network(&policy, &pods, now);
        let (plan, seeded) = self.plan(&policy, &pods, &not_ready, network, now);
        if first {
            tracing::info!(
                gated = pods.queue.len(),
                released_not_ready = not_ready.values().sum::<u32>(),
                released_labelled = pods.released.len(),
                seeded,
                "releaser: leading; queue rebuilt from the cluster and windows seeded from released-at"
            );
        } else if seeded > 0 {
            tracing::info!(
                seeded,
                "releaser: seeded releases seen on pods into the windows"
            );
        }
        self.publish_gauges(&policy, &pods.queue, &not_ready);
        self.publish_queue(&policy, &plan, &pods, network);
        let jobs = Self::jobs(&policy, &plan, &pods, now);
        self.run_jobs(jobs, leadership, now).await;
        self.drop_labels(&pods.released, &policy, leadership, now)
            .await;
        self.send_events(&plan, &pods.eligible, leadership, now)
            .await;
        self.tell_window_cut(leadership, now).await;
        match (plan.wake_at, self.ctx.next_change(now)) {
            (Some(wake), Some(change)) => Some(wake.min(change)),
            (wake, change) => wake.or(change),
        }
    }
}

/// The policy's ConfigMap in the shipped manifests and chart, in the releaser's namespace.
const POLICY_CONFIGMAP: &str = "churn-throttler-policy";

/// At most one NetworkWindowCut Event in this long.
const WINDOW_CUT_EVENT_INTERVAL_MS: Millis = 60_000;

fn describe_ms(ms: Option<Millis>) -> String {
    ms.map_or("unknown".to_string(), |ms| {
        format!("{:.1} s", ms as f64 / 1000.0)
    })
}

/// The Lease's note: the window first (a new leader starts from it), then what `status`
/// shows, e.g. "12 floor=2.0s p90=3.1s change=queue".
fn describe_network(status: &NetworkStatus) -> String {
    let secs =
        |ms: Option<Millis>| ms.map_or("-".to_string(), |ms| format!("{:.1}s", ms as f64 / 1000.0));
    format!(
        "{} floor={} p90={} change={}",
        status.window,
        secs(status.floor_ms),
        secs(status.p90_ms),
        status.last_change.as_str()
    )
}

/// The waits of the first and the last pod of a waiting namespace (0 when unknown).
fn first_and_last(
    when: &HashMap<(Arc<str>, String), (Millis, Millis)>,
    w: &crate::pacing::gate::Waiting,
) -> (Millis, Millis) {
    when.get(&(w.rule.clone(), w.namespace.clone()))
        .copied()
        .unwrap_or((0, 0))
}

/// A rule name usable as a metric label: a gate rule of the policy, else "(none)".
fn metric_rule(policy: &Policy, rule: &str) -> String {
    match gate_rule(policy, rule) {
        Some(rule) => rule.name.to_string(),
        None => NO_RULE.to_string(),
    }
}

fn pod_reference(pod: &QueuedPod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(pod.uid.clone()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::releaser::shell::new_event;

    #[test]
    fn events_regard_the_pod() {
        let pod = QueuedPod {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "u1".into(),
            resource_version: "7".into(),
            rule: "paced".into(),
            owner: None,
            created: 0,
        };
        let event = new_event(pod_reference(&pod), "Gate", "Paced", "note".into(), "me");
        let regarding = event.regarding.as_ref().expect("regarding");
        assert_eq!(regarding.kind.as_deref(), Some("Pod"));
        assert_eq!(regarding.uid.as_deref(), Some("u1"));
        assert_eq!(event.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(event.action.as_deref(), Some("Gate"));
    }
}
