//! Shared state of the server: the policy in force, the limiter, metrics and readiness.

use crate::budget::{scale_policy, GateRole, Share};
use crate::limiter::{Limiter, Millis};
use crate::metrics::Metrics;
use crate::pacing::schedule::Scoped;
use crate::policy::Policy;
use crate::shared::{
    now_millis, BudgetCell, LimiterCell, PolicyCell, QueueCell, ReleaserRole, RoleCell,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The policy and adjustments the in-force gauges were last published for, valid until then.
type Published = (Arc<Policy>, Arc<Vec<Scoped>>, Millis);

pub struct AppState {
    policy: Arc<PolicyCell>,
    limiter: Arc<LimiterCell>,
    budget: Arc<BudgetCell>,
    /// The policy scaled by the share last asked for, and what it was made from.
    scaled: Mutex<Option<Scaled>>,
    /// The policy whose limits in force the gauges show, and until when they hold.
    in_force_published: Mutex<Option<Published>>,
    releaser: Arc<RoleCell>,
    /// The gate queue the leading releaser in this process last saw (None elsewhere).
    queue: Arc<QueueCell>,
    pub metrics: Arc<Metrics>,
    tls_up: AtomicBool,
    shutting_down: AtomicBool,
    pub max_body_bytes: usize,
    /// This process, as the `admitted-by` mark on pods its webhook admitted at once under
    /// a gate rule: its own releaser does not seed them again (its limiter has them).
    pub instance: String,
    /// Deadline for a request's whole body, in milliseconds (--body-read-timeout).
    body_read_timeout_ms: AtomicU64,
    /// The longest hold a policy may ask for (so the drain can answer every held
    /// request), in milliseconds; `u64::MAX` while unbounded.
    hold_bound_ms: AtomicU64,
    /// Which pods exist, for charging only deletions and evictions of real pods.
    pub pods: super::pods::PodCache,
}

impl AppState {
    pub fn new(policy: Policy, metrics: Arc<Metrics>, max_body_bytes: usize) -> Arc<AppState> {
        let limiter = Limiter::new(policy.max_buckets);
        let state = Arc::new(AppState {
            policy: Arc::new(PolicyCell::new(policy)),
            limiter: Arc::new(LimiterCell::new(limiter)),
            budget: Arc::default(),
            scaled: Mutex::new(None),
            in_force_published: Mutex::new(None),
            releaser: Arc::default(),
            queue: Arc::default(),
            metrics,
            tls_up: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            max_body_bytes,
            instance: format!(
                "{}/{}",
                crate::shared::hostname().unwrap_or_else(|| format!("pid-{}", std::process::id())),
                now_millis()
            ),
            body_read_timeout_ms: AtomicU64::new(10_000),
            hold_bound_ms: AtomicU64::new(u64::MAX),
            pods: super::pods::PodCache::default(),
        });
        state.publish_policy_gauges();
        state
    }

    pub fn set_body_read_timeout(&self, timeout: Duration) {
        self.body_read_timeout_ms
            .store(timeout.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms.load(Ordering::SeqCst))
    }

    /// Policies whose longest hold exceeds `bound` are refused from now on (reloads).
    pub fn set_hold_bound(&self, bound: Duration) {
        self.hold_bound_ms
            .store(bound.as_millis() as u64, Ordering::SeqCst);
    }

    /// Why `policy` cannot be put in force: a hold longer than the drain can wait for.
    pub fn check_hold_bound(&self, policy: &Policy) -> Result<(), String> {
        let bound = self.hold_bound_ms.load(Ordering::SeqCst);
        let longest = longest_hold(policy);
        if longest.as_millis() as u64 > bound {
            return Err(format!(
                "the policy can hold a request for {longest:?} but --drain-timeout allows holds of {:?} at most \
                 (a hold must end inside the drain to be answered on a graceful stop)",
                Duration::from_millis(bound)
            ));
        }
        Ok(())
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.policy.get()
    }

    /// The cells the shells share with the server, for `serve` to hand out.
    pub fn policy_cell(&self) -> Arc<PolicyCell> {
        self.policy.clone()
    }

    pub fn limiter_cell(&self) -> Arc<LimiterCell> {
        self.limiter.clone()
    }

    pub fn budget_cell(&self) -> Arc<BudgetCell> {
        self.budget.clone()
    }

    pub fn releaser_role(&self) -> Arc<RoleCell> {
        self.releaser.clone()
    }

    pub fn queue_cell(&self) -> Arc<QueueCell> {
        self.queue.clone()
    }

    /// Swaps in a new policy. Limiter state is kept: buckets are keyed by rule name,
    /// so a reload never opens a burst for a rule that stays.
    pub fn set_policy(&self, policy: Policy) {
        self.limiter().set_max_buckets(policy.max_buckets);
        self.policy.set(policy);
        self.publish_policy_gauges();
    }

    fn publish_policy_gauges(&self) {
        let policy = self.policy();
        self.metrics.limiter.window_limit.reset();
        self.metrics.limiter.window_usage.reset();
        self.metrics.limiter.rule_spacing.reset();
        self.metrics.limiter.limit_in_force.reset();
        self.metrics.limiter.rule_paused.reset();
        self.metrics.limiter.limit_source.reset();
        *lock(&self.in_force_published) = None;
        self.publish_in_force(&policy, now_millis());
        for rule in &policy.rules {
            let events = rule.limits.first().map(|l| l.events).unwrap_or(0);
            let spacing = rule
                .limits
                .first()
                .and_then(|l| l.spacing_ms())
                .unwrap_or(0);
            self.metrics
                .limiter
                .rule_spacing
                .with_label_values(&[&*rule.name])
                .set(spacing as f64 / 1000.0);
            self.metrics
                .limiter
                .window_limit
                .with_label_values(&[&*rule.name])
                .set(events as i64);
            self.metrics
                .limiter
                .window_usage
                .with_label_values(&[&*rule.name])
                .set(0);
        }
        self.metrics
            .limiter
            .policy_rules
            .set(policy.rules.len() as i64);
    }

    /// The policy the webhook decides with at `now`: the policy with the limits in force
    /// then (its schedule windows: `PolicyCell::in_force`), scaled by this replica's share
    /// of the global budget (src/budget), so a window's figures are split across replicas
    /// like the rule's own. The releaser uses the limits in force, unscaled.
    pub fn decision_policy(&self, now: Millis) -> Arc<Policy> {
        let policy = self.policy.in_force(now);
        let share = self.share();
        let role = self.gate_role();
        // Without a releaser in this process nobody here sizes the network window: the
        // adaptive rules pace by their rates alone, as the rest, rather than gate every
        // pod for a window no one measures.
        let unwindowed = role == GateRole::NoReleaser && policy.network.is_some();
        if share == Share::Whole && !unwindowed {
            return policy;
        }
        let mut cache = lock(&self.scaled);
        if let Some(c) = cache.as_ref() {
            if Arc::ptr_eq(&c.source, &policy) && c.share == share && c.role == role {
                return c.policy.clone();
            }
        }
        let mut scaled = scale_policy(&policy, share, role);
        if unwindowed {
            scaled.drop_network_window();
        }
        let scaled = Arc::new(scaled);
        *cache = Some(Scaled {
            source: policy,
            share,
            role,
            policy: scaled.clone(),
        });
        scaled
    }

    /// Turns the global budget on: until the first count, the fallback share applies.
    pub fn enable_budget(&self, max_replicas: u32, lease: Duration) {
        self.budget.enable(max_replicas, lease);
        self.publish_budget();
    }

    /// This replica's share of the global budget right now (`BudgetCell::share`).
    pub fn share(&self) -> Share {
        self.budget.share(&self.policy())
    }

    pub fn publish_budget(&self) {
        self.budget.publish(&self.policy(), &self.metrics.budget);
    }

    /// The releaser runs in this process (its leadership follows once it has a client).
    pub fn set_releaser_starting(&self) {
        self.releaser.set(ReleaserRole::Starting);
    }

    fn gate_role(&self) -> GateRole {
        self.releaser.gate_role()
    }

    /// The limiter; a panic while it was held leaves consistent data (each call
    /// finishes its bookkeeping before returning), so a poisoned lock is taken over.
    pub fn limiter(&self) -> MutexGuard<'_, Limiter> {
        self.limiter.lock()
    }

    pub fn set_tls_up(&self) {
        self.tls_up.store(true, Ordering::SeqCst);
        self.publish_ready();
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.publish_ready();
    }

    /// Ready once the TLS listener is up with a policy loaded, until shutdown begins.
    pub fn is_ready(&self) -> bool {
        self.tls_up.load(Ordering::SeqCst) && !self.shutting_down.load(Ordering::SeqCst)
    }

    fn publish_ready(&self) {
        self.metrics.server.ready.set(i64::from(self.is_ready()));
    }

    /// The limit in force per rule, whether it is paused, and where the limit comes from.
    /// Computed again only when the policy changed or its limits in force may have (the
    /// sweep runs every second; a window evaluation is not free).
    fn publish_in_force(&self, policy: &Arc<Policy>, now: Millis) {
        use crate::pacing::schedule::{adjustments_for, limit_in_force, Source};
        let adjustments = self.policy.adjustments();
        let mut published = lock(&self.in_force_published);
        if let Some((last, last_adjustments, until)) = published.as_ref() {
            if Arc::ptr_eq(last, policy)
                && Arc::ptr_eq(last_adjustments, &adjustments)
                && now < *until
            {
                return;
            }
        }
        let m = &self.metrics.limiter;
        let mut until = now.saturating_add(3_600_000);
        for rule in &policy.rules {
            let in_force = limit_in_force(rule, &adjustments_for(&adjustments, &rule.name), now);
            if let Some(next) = in_force.next_change {
                until = until.min(next);
            }
            let name: &str = &rule.name;
            m.limit_in_force
                .with_label_values(&[name])
                .set(i64::from(in_force.events()));
            m.rule_paused
                .with_label_values(&[name])
                .set(i64::from(in_force.paused_until.is_some()));
            // A window of events: 0 (or an override to 0) is a pause; its source label says so.
            let source = if in_force.paused_until.is_some() {
                Source::Pause
            } else {
                in_force.source
            };
            for label in ["rule", "schedule", "override", "pause"] {
                m.limit_source
                    .with_label_values(&[name, label])
                    .set(i64::from(source.label() == label));
            }
        }
        *published = Some((policy.clone(), adjustments, until));
    }

    /// Sweeps the limiter and publishes its gauges.
    pub fn sweep(&self, now: Millis) {
        self.publish_budget();
        self.publish_in_force(&self.policy(), now);
        let usage = self.limiter().sweep(now);
        self.metrics.limiter.buckets.set(usage.buckets as i64);
        self.metrics
            .limiter
            .reservations_open
            .set(usage.reservations as i64);
        let policy = self.policy();
        for rule in &policy.rules {
            let used = usage.per_rule.get(&rule.name).copied().unwrap_or(0);
            self.metrics
                .limiter
                .window_usage
                .with_label_values(&[&*rule.name])
                .set(used as i64);
        }
        // Last, so a count seen means this sweep's gauges are published.
        self.metrics.limiter.sweeps.inc();
    }
}

struct Scaled {
    source: Arc<Policy>,
    share: Share,
    role: GateRole,
    policy: Arc<Policy>,
}

/// Small bookkeeping locks: a panic cannot leave them half-written, so take poisoned ones over.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The longest a request can be held under `policy`: a hold or retry-after rule's
/// maxHold (at least the retry arrival margin, which any of them holds), never past the
/// server's deadline, which answers every review in time.
pub fn longest_hold(policy: &Policy) -> Duration {
    use crate::policy::Action;
    let margin = Duration::from_millis(crate::limiter::RETRY_ARRIVAL_MARGIN_MS);
    policy
        .rules
        .iter()
        .filter(|r| matches!(r.action, Action::Hold | Action::RetryAfter))
        .map(|r| r.max_hold.unwrap_or(Duration::ZERO).max(margin))
        .max()
        .map_or(Duration::ZERO, |hold| hold.min(policy.server_deadline()))
}
