//! Shared state of the server: the policy in force, the limiter, metrics and readiness.

use crate::limiter::{Limiter, Millis};
use crate::metrics::Metrics;
use crate::policy::Policy;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

pub struct AppState {
    policy: RwLock<Arc<Policy>>,
    limiter: Mutex<Limiter>,
    pub metrics: Arc<Metrics>,
    tls_up: AtomicBool,
    shutting_down: AtomicBool,
    pub max_body_bytes: usize,
}

impl AppState {
    pub fn new(policy: Policy, metrics: Arc<Metrics>, max_body_bytes: usize) -> Arc<AppState> {
        let limiter = Limiter::new(policy.max_buckets);
        let state = Arc::new(AppState {
            policy: RwLock::new(Arc::new(policy)),
            limiter: Mutex::new(limiter),
            metrics,
            tls_up: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            max_body_bytes,
        });
        state.publish_policy_gauges();
        state
    }

    pub fn policy(&self) -> Arc<Policy> {
        match self.policy.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Swaps in a new policy. Limiter state is kept: buckets are keyed by rule name,
    /// so a reload never opens a burst for a rule that stays.
    pub fn set_policy(&self, policy: Policy) {
        self.limiter().set_max_buckets(policy.max_buckets);
        match self.policy.write() {
            Ok(mut guard) => *guard = Arc::new(policy),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(policy),
        }
        self.publish_policy_gauges();
    }

    fn publish_policy_gauges(&self) {
        let policy = self.policy();
        self.metrics.window_limit.reset();
        self.metrics.window_usage.reset();
        for rule in &policy.rules {
            let events = rule.limits.first().map(|l| l.events).unwrap_or(0);
            self.metrics
                .window_limit
                .with_label_values(&[&*rule.name])
                .set(events as i64);
            self.metrics
                .window_usage
                .with_label_values(&[&*rule.name])
                .set(0);
        }
        self.metrics.policy_rules.set(policy.rules.len() as i64);
    }

    /// The limiter; a panic while it was held leaves consistent data (each call
    /// finishes its bookkeeping before returning), so a poisoned lock is taken over.
    pub fn limiter(&self) -> MutexGuard<'_, Limiter> {
        match self.limiter.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
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
        self.metrics.ready.set(i64::from(self.is_ready()));
    }

    /// Sweeps the limiter and publishes its gauges.
    pub fn sweep(&self, now: Millis) {
        let usage = self.limiter().sweep(now);
        self.metrics.buckets.set(usage.buckets as i64);
        self.metrics
            .reservations_open
            .set(usage.reservations as i64);
        let policy = self.policy();
        for rule in &policy.rules {
            let used = usage.per_rule.get(&rule.name).map_or(0, |u| u.0);
            self.metrics
                .window_usage
                .with_label_values(&[&*rule.name])
                .set(used as i64);
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch: the `now` the pure core receives.
pub fn now_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}
