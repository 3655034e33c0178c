//! The metrics, registered per component (`register(&Registry) -> Self`) in one registry
//! that `/metrics` renders; each part holds only its own (the server and the limiter's
//! gauges in AppState, the releasers' in `ReleaserParts`, the budget's in its lease
//! loop). Label values are bounded: rule names come from the policy, the rest are fixed sets.

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// What the releasers record: their leadership, the gate's and the partition steps'.
#[derive(Clone)]
pub struct ReleaserParts {
    pub releaser: ReleaserMetrics,
    pub gate: GateMetrics,
    pub partition: PartitionMetrics,
}

/// Every component's metrics, registered in one registry that `/metrics` renders.
pub struct Metrics {
    registry: Registry,
    pub server: ServerMetrics,
    pub limiter: LimiterMetrics,
    pub releaser: ReleaserMetrics,
    pub gate: GateMetrics,
    pub partition: PartitionMetrics,
    pub budget: BudgetMetrics,
    pub overrides: OverrideMetrics,
}

/// PacingOverride objects (pauses and overrides) as this replica reads them.
#[derive(Clone)]
pub struct OverrideMetrics {
    /// objects in force, by kind (pause, override)
    pub live: IntGaugeVec,
    /// objects ignored as malformed (each counted once per version of the object)
    pub ignored: IntCounter,
    /// failed lists/watches (a missing CRD or missing rights: run as if none exist)
    pub watch_errors: IntCounter,
    /// expired objects the leader deleted
    pub deleted: IntCounter,
}

impl OverrideMetrics {
    fn register(registry: &Registry) -> OverrideMetrics {
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
            register(registry, Box::new(c.clone()));
            c
        };
        OverrideMetrics {
            live: gauge_vec(
                registry,
                "churn_throttler_pacing_overrides",
                "PacingOverride objects in force (not expired, not ignored), by kind (pause, override).",
                &["kind"],
            ),
            ignored: counter(
                "churn_throttler_pacing_overrides_ignored_total",
                "PacingOverride objects ignored as malformed (once per version of the object); the log and an Event on it say why.",
            ),
            watch_errors: counter(
                "churn_throttler_pacing_overrides_watch_errors_total",
                "Failed lists or watches of PacingOverride objects (a missing CRD or missing rights: no pause or override applies).",
            ),
            deleted: counter(
                "churn_throttler_pacing_overrides_deleted_total",
                "Expired PacingOverride objects deleted by the releasers' leader.",
            ),
        }
    }
}

/// The HTTPS server and the admission path: decisions, answers, holds, refusals, reloads, readiness.
#[derive(Clone)]
pub struct ServerMetrics {
    /// decisions by rule, operation and action
    pub decisions: IntCounterVec,
    /// seconds from request to answer, by endpoint (holds included)
    pub admission_duration: HistogramVec,
    /// HTTP answers by endpoint and status code
    pub http_requests: IntCounterVec,
    pub held_requests: IntGauge,
    /// seconds a held request waited
    pub hold_duration: Histogram,
    /// requests of kinds or subresources that are not paced, by resource group
    pub unhandled: IntCounterVec,
    /// requests refused before a decision (malformed, wrong content type, too large)
    pub bad_requests: IntCounterVec,
    /// pod DELETEs and evictions allowed without a charge: the pod is not the one the
    /// pod cache has, by reason (no-such-pod, uid-mismatch)
    pub unverified_requests: IntCounterVec,
    pub gated_pods: IntCounterVec,
    /// 1 once the pod cache has listed every pod, 0 without a cache or before
    pub pod_cache_synced: IntGauge,
    /// policy and certificate reloads by kind and result
    pub reloads: IntCounterVec,
    pub ready: IntGauge,
    /// connections closed to make room for a newcomer, by port, cap and kind
    pub connections_evicted: IntCounterVec,
    /// newcomers closed at a cap because every candidate had a request in flight
    pub connections_refused: IntCounterVec,
    /// open connections per port
    pub open_connections: IntGaugeVec,
}

impl ServerMetrics {
    pub fn register(registry: &Registry) -> Self {
        let admission_duration = HistogramVec::new(
            HistogramOpts::new(
                "churn_throttler_admission_duration_seconds",
                "Time from receiving an admission review to answering it, holds included.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["endpoint"],
        )
        .unwrap_or_else(|e| panic!("histogram: {e}"));
        register(registry, Box::new(admission_duration.clone()));
        let hold_duration = Histogram::with_opts(
            HistogramOpts::new(
                "churn_throttler_hold_duration_seconds",
                "How long held requests waited in the webhook for their slot.",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0]),
        )
        .unwrap_or_else(|e| panic!("histogram: {e}"));
        register(registry, Box::new(hold_duration.clone()));
        register(registry, Box::new(h2_warnings().clone()));
        ServerMetrics {
            decisions: counter_vec(
                registry,
                "churn_throttler_decisions_total",
                "Admission decisions by rule, operation and action.",
                &["rule", "operation", "action"],
            ),
            admission_duration,
            http_requests: counter_vec(
                registry,
                "churn_throttler_http_requests_total",
                "HTTP answers of the admission endpoints by endpoint and status code.",
                &["endpoint", "code"],
            ),
            held_requests: gauge(
                registry,
                "churn_throttler_held_requests",
                "Admission requests being held in the webhook right now.",
            ),
            hold_duration,
            unhandled: counter_vec(
                registry,
                "churn_throttler_unhandled_requests_total",
                "Requests of kinds, subresources or operations that are not paced, allowed as they are.",
                &["reason"],
            ),
            bad_requests: counter_vec(
                registry,
                "churn_throttler_bad_requests_total",
                "Requests answered with an HTTP error before any decision, by reason.",
                &["reason"],
            ),
            unverified_requests: counter_vec(
                registry,
                "churn_throttler_unverified_requests_total",
                "Pod DELETEs and evictions allowed without a charge because the pod cache has no such pod, by reason.",
                &["reason"],
            ),
            gated_pods: counter_vec(
                registry,
                "churn_throttler_gated_pods_total",
                "Pods admitted behind the scheduling gate, by rule.",
                &["rule"],
            ),
            pod_cache_synced: gauge(
                registry,
                "churn_throttler_pod_cache_synced",
                "1 once the pod cache has listed every pod (deletions of pods it lacks are then not charged), else 0.",
            ),
            reloads: counter_vec(
                registry,
                "churn_throttler_reloads_total",
                "Reloads of the policy and the certificate, by kind and result.",
                &["kind", "result"],
            ),
            ready: gauge(
                registry,
                "churn_throttler_ready",
                "1 while the server is ready to take admission reviews.",
            ),
            connections_evicted: counter_vec(
                registry,
                "churn_throttler_connections_evicted_total",
                "Connections closed to make room for a newcomer at a cap, by port (admission, metrics), cap (port, source) and kind (never-completed, idle).",
                &["port", "cap", "kind"],
            ),
            connections_refused: counter_vec(
                registry,
                "churn_throttler_connections_refused_total",
                "Newcomers closed at a cap because every connection that could make room had a request in flight, by port and cap.",
                &["port", "cap"],
            ),
            open_connections: gauge_vec(
                registry,
                "churn_throttler_open_connections",
                "Open connections per port (admission, metrics), as of the last accept.",
                &["port"],
            ),
        }
    }
}

/// The policy in force and the limiter's windows, published on every sweep.
#[derive(Clone)]
pub struct LimiterMetrics {
    /// charges in the fullest window, per rule
    pub window_usage: IntGaugeVec,
    /// events allowed per window, per rule
    pub window_limit: IntGaugeVec,
    /// seconds between consecutive events after the burst, per rule (0: no spacing)
    pub rule_spacing: GaugeVec,
    /// events per window in force now (schedule windows applied; 0 while paused), per rule
    pub limit_in_force: IntGaugeVec,
    /// 1 while the rule is paused (a schedule window of events: 0), per rule
    pub rule_paused: IntGaugeVec,
    /// 1 for where the limit in force comes from (rule, schedule, override, pause), 0 for
    /// the others, per rule
    pub limit_source: IntGaugeVec,
    pub reservations_open: IntGauge,
    pub buckets: IntGauge,
    pub policy_rules: IntGauge,
    /// sweeps finished: a stuck sweep shows as a flat line, and a test waits on it for
    /// a sweep that ran after its request instead of sleeping
    pub sweeps: IntCounter,
}

impl LimiterMetrics {
    pub fn register(registry: &Registry) -> Self {
        LimiterMetrics {
            window_usage: gauge_vec(
                registry,
                "churn_throttler_window_usage",
                "Charges in the current window of the rule's fullest bucket.",
                &["rule"],
            ),
            window_limit: gauge_vec(
                registry,
                "churn_throttler_window_limit",
                "Events the rule allows per window (its first limit).",
                &["rule"],
            ),
            rule_spacing: {
                let name = "churn_throttler_rule_spacing_seconds";
                let metric = GaugeVec::new(
                    Opts::new(
                        name,
                        "Seconds between consecutive events after the burst (the rule's first \
                         limit; 0 when its burst is the whole window).",
                    ),
                    &["rule"],
                )
                .unwrap_or_else(|e| panic!("metric {name}: {e}"));
                register(registry, Box::new(metric.clone()));
                metric
            },
            limit_in_force: gauge_vec(
                registry,
                "churn_throttler_limit_in_force",
                "Events per window in force now for the whole cluster (the rule's first limit, \
                 its schedule windows applied; 0 while paused).",
                &["rule"],
            ),
            rule_paused: gauge_vec(
                registry,
                "churn_throttler_rule_paused",
                "1 while the rule is paused (a schedule window of events: 0, `churn-throttler pause`), else 0.",
                &["rule"],
            ),
            limit_source: gauge_vec(
                registry,
                "churn_throttler_limit_source",
                "1 for the source of the limit in force (rule, schedule, override, pause), 0 for \
                 the others.",
                &["rule", "source"],
            ),
            reservations_open: gauge(
                registry,
                "churn_throttler_reservations_open",
                "Reserved future slots not yet claimed.",
            ),
            buckets: gauge(registry, "churn_throttler_buckets", "Live limiter buckets."),
            policy_rules: gauge(
                registry,
                "churn_throttler_policy_rules",
                "Rules in the policy in force.",
            ),
            sweeps: {
                let name = "churn_throttler_sweeps_total";
                let metric = IntCounter::new(
                    name,
                    "Limiter sweeps finished (expired reservations, idle buckets, these gauges).",
                )
                .unwrap_or_else(|e| panic!("metric {name}: {e}"));
                register(registry, Box::new(metric.clone()));
                metric
            },
        }
    }
}

/// The releaser's leadership and its API errors (shared by the gate and partition releasers).
#[derive(Clone)]
pub struct ReleaserMetrics {
    /// releaser: 1 while this replica holds the lease
    pub releaser_leader: IntGauge,
    /// releaser: failed API calls by operation (lease, watch, patch, event)
    pub releaser_api_errors: IntCounterVec,
}

impl ReleaserMetrics {
    pub fn register(registry: &Registry) -> Self {
        ReleaserMetrics {
            releaser_leader: gauge(
                registry,
                "churn_throttler_releaser_leader",
                "1 while this replica holds the releaser's lease.",
            ),
            releaser_api_errors: counter_vec(
                registry,
                "churn_throttler_releaser_api_errors_total",
                "Failed API calls of the releaser, by operation (lease, watch, patch, event).",
                &["operation"],
            ),
        }
    }
}

/// The gate releaser: queue, releases, Events.
#[derive(Clone)]
pub struct GateMetrics {
    /// releaser: pods waiting behind the gate, by rule ("(none)" when the rule is gone)
    pub gate_queue: IntGaugeVec,
    /// releaser: released pods not yet Ready, by rule (what maxNotReady counts)
    pub gate_not_ready: IntGaugeVec,
    /// releaser: gates lifted, by rule and reason (rate, rule-gone, ungated-elsewhere)
    pub gate_releases: IntCounterVec,
    /// releaser: release patches that failed, by reason (conflict, gone, error)
    pub gate_release_failures: IntCounterVec,
    /// releaser: seconds from pod creation to release, by rule
    pub gate_wait: HistogramVec,
    /// releaser: Events written on gated pods
    pub gate_events: IntCounterVec,
    /// releaser: the shared network window of the adaptive rules (crate::pacing::network)
    pub network_window: IntGauge,
    /// releaser: released pods of adaptive rules whose network is not up yet
    pub network_in_flight: IntGauge,
    /// releaser: the policy's minWindow, for the alert on a window pinned there
    pub network_min_window: IntGauge,
    /// releaser: the last sample's workload floor, in seconds
    pub network_floor_seconds: prometheus::Gauge,
    /// releaser: the recent samples' 90th percentile network time, in seconds
    pub network_p90_seconds: prometheus::Gauge,
    /// releaser: the reason of the last change of the window (one series set to 1)
    pub network_last_change: IntGaugeVec,
    /// releaser: network samples by outcome (sample, censored, deleted-first, node-not-ready)
    pub network_samples: IntCounterVec,
}

impl GateMetrics {
    pub fn register(registry: &Registry) -> Self {
        let gate_wait = HistogramVec::new(
            HistogramOpts::new(
                "churn_throttler_gate_wait_seconds",
                "Time pods spent behind the scheduling gate, from creation to release, by rule.",
            )
            .buckets(vec![
                0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
            ]),
            &["rule"],
        )
        .unwrap_or_else(|e| panic!("histogram: {e}"));
        register(registry, Box::new(gate_wait.clone()));
        GateMetrics {
            gate_queue: gauge_vec(
                registry,
                "churn_throttler_gate_queue_pods",
                "Pods waiting behind the scheduling gate, by rule (as seen by the leading releaser).",
                &["rule"],
            ),
            gate_not_ready: gauge_vec(
                registry,
                "churn_throttler_gate_released_not_ready_pods",
                "Released pods not yet Ready, by rule (what maxNotReady counts).",
                &["rule"],
            ),
            gate_releases: counter_vec(
                registry,
                "churn_throttler_gate_releases_total",
                "Scheduling gates lifted, by rule and reason (rate, rule-gone, ungated-elsewhere).",
                &["rule", "reason"],
            ),
            gate_release_failures: counter_vec(
                registry,
                "churn_throttler_gate_release_failures_total",
                "Release patches refused, by reason (conflict: the pod changed; gone; error).",
                &["reason"],
            ),
            gate_wait,
            gate_events: counter_vec(
                registry,
                "churn_throttler_gate_events_total",
                "Kubernetes Events written on gated pods, by reason (Paced, WaitingForReady, WaitingForNetwork).",
                &["reason"],
            ),
            network_window: gauge(
                registry,
                "churn_throttler_network_window_pods",
                "The network window: released pods of adaptive rules that may wait for their network at once.",
            ),
            network_in_flight: gauge(
                registry,
                "churn_throttler_network_in_flight_pods",
                "Released pods of adaptive rules whose network is not up yet.",
            ),
            network_min_window: gauge(
                registry,
                "churn_throttler_network_min_window_pods",
                "The policy's minWindow of the network window.",
            ),
            network_floor_seconds: float_gauge(
                registry,
                "churn_throttler_network_floor_seconds",
                "The unloaded network time (floor) of the last sample's workload.",
            ),
            network_p90_seconds: float_gauge(
                registry,
                "churn_throttler_network_p90_seconds",
                "The 90th percentile of the recent pods' network time (binding to PodReadyToStartContainers).",
            ),
            network_last_change: gauge_vec(
                registry,
                "churn_throttler_network_window_change",
                "1 for the reason of the network window's last change (start, slow-start, queue, probe, remeasure).",
                &["reason"],
            ),
            network_samples: counter_vec(
                registry,
                "churn_throttler_network_samples_total",
                "Pods whose network time was measured, by outcome (sample, censored: counted at the bound, deleted-first, node-not-ready: left out).",
                &["outcome"],
            ),
        }
    }
}

/// The partition releaser: held StatefulSets, steps, Events.
#[derive(Clone)]
pub struct PartitionMetrics {
    /// partition releaser: StatefulSets whose rollout is held, by rule
    pub partition_held: IntGaugeVec,
    /// partition releaser: pods re-created by steps and not yet Ready, by rule
    pub partition_not_ready: IntGaugeVec,
    /// partition releaser: steps in the rule's fullest window (in flight included)
    pub partition_window_steps: IntGaugeVec,
    /// partition releaser: partition steps, by rule and reason
    pub partition_steps: IntCounterVec,
    /// partition releaser: holds ended, by rule and outcome
    pub partition_rollouts: IntCounterVec,
    /// partition releaser: patches refused, by reason (conflict, gone, error)
    pub partition_failures: IntCounterVec,
    /// partition releaser: seconds from the hold to its end, by rule
    pub partition_held_duration: HistogramVec,
    /// partition releaser: Events written on StatefulSets, by reason
    pub partition_events: IntCounterVec,
}

impl PartitionMetrics {
    pub fn register(registry: &Registry) -> Self {
        let partition_held_duration = HistogramVec::new(
            HistogramOpts::new(
                "churn_throttler_partition_held_seconds",
                "Time a StatefulSet rollout was held, from the hold to its end (target reached or let go), by rule.",
            )
            .buckets(vec![
                1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0,
            ]),
            &["rule"],
        )
        .unwrap_or_else(|e| panic!("histogram: {e}"));
        register(registry, Box::new(partition_held_duration.clone()));
        PartitionMetrics {
            partition_held: gauge_vec(
                registry,
                "churn_throttler_partition_held_statefulsets",
                "StatefulSets whose rollout churn-throttler holds, by rule (as seen by the leading releaser).",
                &["rule"],
            ),
            partition_not_ready: gauge_vec(
                registry,
                "churn_throttler_partition_released_not_ready_pods",
                "Pods re-created by partition steps and not yet updated and Ready, by rule (what maxNotReady counts).",
                &["rule"],
            ),
            partition_window_steps: gauge_vec(
                registry,
                "churn_throttler_partition_window_steps",
                "Partition steps in the rule's fullest window, steps whose pod is not yet seen re-created included, by rule (leading releaser).",
                &["rule"],
            ),
            partition_steps: counter_vec(
                registry,
                "churn_throttler_partition_steps_total",
                "Partition steps, by rule and reason (rate; nothing-to-roll and rule-gone are uncharged).",
                &["rule", "reason"],
            ),
            partition_rollouts: counter_vec(
                registry,
                "churn_throttler_partition_rollouts_total",
                "Held rollouts that ended, by rule and outcome (done, let-go, rule-gone).",
                &["rule", "outcome"],
            ),
            partition_failures: counter_vec(
                registry,
                "churn_throttler_partition_patch_failures_total",
                "StatefulSet patches of the partition releaser refused, by reason (conflict: the set changed; gone; error).",
                &["reason"],
            ),
            partition_held_duration,
            partition_events: counter_vec(
                registry,
                "churn_throttler_partition_events_total",
                "Kubernetes Events written on held StatefulSets, by reason.",
                &["reason"],
            ),
        }
    }
}

/// The global budget across webhook replicas.
#[derive(Clone)]
pub struct BudgetMetrics {
    /// global budget: what every limit is divided by on this replica (1: budget off)
    pub budget_replicas: IntGauge,
    /// global budget: 1 while the fallback share applies
    pub budget_fallback: IntGauge,
    /// global budget: failed Lease calls
    pub budget_api_errors: IntCounterVec,
}

impl BudgetMetrics {
    pub fn register(registry: &Registry) -> Self {
        BudgetMetrics {
            budget_replicas: gauge(
                registry,
                "churn_throttler_budget_replicas",
                "Global budget: what every limit is divided by on this replica (live replicas, or the fallback; 1 when the budget is off, 0 while warming up at 1 event per window).",
            ),
            budget_fallback: gauge(
                registry,
                "churn_throttler_budget_fallback",
                "Global budget: 1 while the API server has been out of reach for longer than a lease and the fallback share applies.",
            ),
            budget_api_errors: counter_vec(
                registry,
                "churn_throttler_budget_api_errors_total",
                "Global budget: failed API calls on the replica Leases, by operation.",
                &["operation"],
            ),
        }
    }
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(registry, Box::new(metric.clone()));
    metric
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(registry, Box::new(metric.clone()));
    metric
}

fn float_gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Gauge {
    let g = prometheus::Gauge::new(name, help).unwrap_or_else(|e| panic!("gauge: {e}"));
    register(registry, Box::new(g.clone()));
    g
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let metric = IntGauge::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(registry, Box::new(metric.clone()));
    metric
}

/// Warnings the h2 crate logged (kept out of the default log filter, see
/// `server::logs`): one process-wide counter, registered in every registry.
pub fn h2_warnings() -> &'static IntCounter {
    static COUNTER: std::sync::LazyLock<IntCounter> = std::sync::LazyLock::new(|| {
        IntCounter::new(
            "churn_throttler_h2_warnings_total",
            "Warnings of the HTTP/2 library (a client's protocol faults, such as a rapid-reset flood), counted instead of logged.",
        )
        .unwrap_or_else(|e| panic!("metric: {e}"))
    });
    &COUNTER
}

fn register(registry: &Registry, metric: Box<dyn prometheus::core::Collector>) {
    // Names are fixed at compile time and unique, so registration cannot fail at run time.
    registry
        .register(metric)
        .unwrap_or_else(|e| panic!("registering a metric: {e}"));
}

const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        Metrics {
            server: ServerMetrics::register(&registry),
            limiter: LimiterMetrics::register(&registry),
            releaser: ReleaserMetrics::register(&registry),
            gate: GateMetrics::register(&registry),
            partition: PartitionMetrics::register(&registry),
            budget: BudgetMetrics::register(&registry),
            overrides: OverrideMetrics::register(&registry),
            registry,
        }
    }

    /// The parts the releasers hold.
    pub fn releaser_parts(&self) -> ReleaserParts {
        ReleaserParts {
            releaser: self.releaser.clone(),
            gate: self.gate.clone(),
            partition: self.partition.clone(),
        }
    }

    /// The exposition in Prometheus text format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        if encoder
            .encode(&self.registry.gather(), &mut buffer)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
