//! The handles the HTTP server and the shells (releasers, budget lease) share, kept below
//! all of them so none imports another: the shutdown signal, the wall clock, this
//! process's host name, the releaser's leadership, and the cells holding the policy in
//! force, the limiter, the releaser's role, the gate queue it last saw and the global
//! budget's count. `serve` makes
//! them and hands each part only the ones it uses.

use crate::budget::{share_at, GateRole, Share, ShareHistory};
use crate::limiter::{Limiter, Millis};
use crate::metrics::BudgetMetrics;
use crate::pacing::schedule::Scoped;
use crate::policy::Policy;
use crate::queue::Snapshot;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// Resolves once the shutdown signal is set (or its sender is gone).
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not Send; drop it before the caller awaits on.
    let _ = shutdown.wait_for(|stop| *stop).await.map(|_| ());
}

/// Wall-clock milliseconds since the Unix epoch: the `now` the pure core receives.
pub fn now_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

/// The host name, as the kernel has it (no extra crate for one file read).
pub fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
}

/// Who leads, as this replica knows it: `Some(deadline)` while it holds the lease.
#[derive(Clone)]
pub struct Leadership {
    rx: watch::Receiver<Option<tokio::time::Instant>>,
}

impl Leadership {
    pub fn new(rx: watch::Receiver<Option<tokio::time::Instant>>) -> Leadership {
        Leadership { rx }
    }

    /// True only until the current term's deadline, even if the lease loop is stuck.
    pub fn is_leader(&self) -> bool {
        self.rx
            .borrow()
            .is_some_and(|until| tokio::time::Instant::now() < until)
    }

    /// Resolves once this replica leads (false: the lease loop ended).
    pub async fn acquired(&mut self) -> bool {
        loop {
            if self.is_leader() {
                return true;
            }
            if self.rx.changed().await.is_err() {
                return false;
            }
        }
    }

    /// Resolves when the term ends: the deadline passes unrenewed, or the lease is lost.
    pub async fn lost(&mut self) {
        loop {
            let until = *self.rx.borrow_and_update();
            let Some(until) = until else {
                return;
            };
            if tokio::time::Instant::now() >= until {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {
                    if *self.rx.borrow() == Some(until) {
                        return;
                    }
                }
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// The policy in force (unscaled); swapped whole on a reload. With it the pauses and
/// overrides in force (PacingOverride objects, watched by `crate::overrides_watch`),
/// swapped whole on every change of them.
pub struct PolicyCell(
    RwLock<Arc<Policy>>,
    Mutex<Option<InForceCache>>,
    RwLock<Arc<Vec<Scoped>>>,
);

/// The policy in force last computed: valid from `from` until the next change of any
/// rule's schedule windows or adjustments, for the policy and adjustments it was made from.
struct InForceCache {
    source: Arc<Policy>,
    adjustments: Arc<Vec<Scoped>>,
    from: Millis,
    until: Option<Millis>,
    policy: Arc<Policy>,
}

/// How long a policy in force without a next change in sight is kept before it is
/// computed again.
const IN_FORCE_RECHECK_MS: Millis = 3_600_000;

impl PolicyCell {
    pub fn new(policy: Policy) -> PolicyCell {
        PolicyCell(
            RwLock::new(Arc::new(policy)),
            Mutex::new(None),
            RwLock::new(Arc::new(Vec::new())),
        )
    }

    /// The pauses and overrides in force, as last read from the cluster.
    pub fn adjustments(&self) -> Arc<Vec<Scoped>> {
        match self.2.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the pauses and overrides: new decisions follow them at once.
    pub fn set_adjustments(&self, adjustments: Vec<Scoped>) {
        let adjustments = Arc::new(adjustments);
        match self.2.write() {
            Ok(mut guard) => *guard = adjustments,
            Err(poisoned) => *poisoned.into_inner() = adjustments,
        }
    }

    /// The policy with the limits in force at `now` (its schedule windows applied:
    /// `crate::pacing::schedule`); the policy itself when it has no schedules. What the
    /// webhook decides with (before its budget share) and what the releasers release by.
    pub fn in_force(&self, now: Millis) -> Arc<Policy> {
        self.in_force_until(now).0
    }

    /// [`PolicyCell::in_force`], and the next time the limits in force change (None:
    /// not within the schedules' horizon), so a releaser looks again then.
    pub fn in_force_until(&self, now: Millis) -> (Arc<Policy>, Option<Millis>) {
        let policy = self.get();
        let adjustments = self.adjustments();
        if adjustments.is_empty() && !crate::pacing::schedule::has_schedules(&policy) {
            return (policy, None);
        }
        let mut cache = match self.1.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(c) = cache.as_ref() {
            if Arc::ptr_eq(&c.source, &policy)
                && Arc::ptr_eq(&c.adjustments, &adjustments)
                && c.from <= now
                && c.until.is_none_or(|u| now < u)
            {
                return (c.policy.clone(), c.until);
            }
        }
        let (in_force, until) =
            crate::pacing::schedule::policy_in_force(&policy, &adjustments, now);
        let in_force = Arc::new(in_force);
        *cache = Some(InForceCache {
            source: policy,
            adjustments,
            from: now,
            // No change in sight (a window that stays open, a yearly one): look again in
            // an hour, as the horizon moves on.
            until: Some(until.unwrap_or(now.saturating_add(IN_FORCE_RECHECK_MS))),
            policy: in_force.clone(),
        });
        (in_force, until)
    }

    pub fn get(&self) -> Arc<Policy> {
        match self.0.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn set(&self, policy: Policy) {
        match self.0.write() {
            Ok(mut guard) => *guard = Arc::new(policy),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(policy),
        }
    }
}

/// The limiter the webhook and the gate releaser charge together.
pub struct LimiterCell(Mutex<Limiter>);

impl LimiterCell {
    pub fn new(limiter: Limiter) -> LimiterCell {
        LimiterCell(Mutex::new(limiter))
    }

    /// The limiter; a panic while it was held leaves consistent data (each call
    /// finishes its bookkeeping before returning), so a poisoned lock is taken over.
    pub fn lock(&self) -> MutexGuard<'_, Limiter> {
        match self.0.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// The gate queue as the leading releaser of this process saw it in its last round, for
/// the webhook's estimate of when a pod it gates goes (crate::queue); empty while this
/// process does not lead. Replaced whole each round.
#[derive(Default)]
pub struct QueueCell(RwLock<Option<Arc<Snapshot>>>);

impl QueueCell {
    pub fn get(&self) -> Option<Arc<Snapshot>> {
        match self.0.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn set(&self, snapshot: Option<Snapshot>) {
        let snapshot = snapshot.map(Arc::new);
        match self.0.write() {
            Ok(mut guard) => *guard = snapshot,
            Err(poisoned) => *poisoned.into_inner() = snapshot,
        }
    }
}

/// Whether the releaser runs in this process and, once it has a client, whether it leads.
pub enum ReleaserRole {
    Off,
    Starting,
    Running(Leadership),
}

pub struct RoleCell(Mutex<ReleaserRole>);

impl Default for RoleCell {
    fn default() -> RoleCell {
        RoleCell(Mutex::new(ReleaserRole::Off))
    }
}

impl RoleCell {
    pub fn set(&self, role: ReleaserRole) {
        *lock(&self.0) = role;
    }

    /// The releaser's part in the global budget's split of gate rules.
    pub fn gate_role(&self) -> GateRole {
        match &*lock(&self.0) {
            ReleaserRole::Off => GateRole::NoReleaser,
            ReleaserRole::Starting => GateRole::Follower,
            ReleaserRole::Running(l) if l.is_leader() => GateRole::Leader,
            ReleaserRole::Running(_) => GateRole::Follower,
        }
    }
}

/// The global budget's count of replicas, as the budget lease last saw it, and the
/// shares handed out since (src/budget).
#[derive(Default)]
pub struct BudgetCell(Mutex<Budget>);

impl BudgetCell {
    /// Turns the global budget on: until the first count, the fallback share applies.
    pub fn enable(&self, max_replicas: u32, lease: Duration) {
        let mut budget = lock(&self.0);
        budget.enabled = true;
        budget.max_replicas = max_replicas;
        budget.lease = lease;
        // What this replica's predecessor admitted is unknown: one window of warm-up.
        budget.history = ShareHistory::default();
        let hold = Millis::MAX;
        let now = Instant::now()
            .saturating_duration_since(budget.origin)
            .as_millis() as Millis;
        budget.history.push(now, Share::WarmingUp, hold);
    }

    /// No cluster to coordinate through: the whole of every limit.
    pub fn set_off(&self) {
        lock(&self.0).enabled = false;
    }

    /// A successful renewal and listing at `at` counted `replicas` live replicas.
    pub fn set_contact(&self, at: tokio::time::Instant, replicas: u32) {
        lock(&self.0).contact = Some((at.into_std(), replicas));
    }

    /// This replica's share of the global budget right now under `policy`: the smallest
    /// of the last longest window (plus a renewal), so shares grow late and shrink at once.
    pub fn share(&self, policy: &Policy) -> Share {
        let hold = policy.longest_window() + Duration::from_secs(2);
        let mut guard = lock(&self.0);
        let budget = &mut *guard;
        if !budget.enabled {
            return Share::Whole;
        }
        let origin = budget.origin;
        let ms = |at: Instant| at.saturating_duration_since(origin).as_millis() as Millis;
        let now = ms(Instant::now());
        let computed = share_at(
            budget.contact.map(|(at, n)| (ms(at), n)),
            now,
            budget.lease.as_millis() as Millis,
            budget.max_replicas,
        );
        budget
            .history
            .push(now, computed, hold.as_millis() as Millis)
    }

    /// Publishes the share under `policy` as the budget gauges.
    pub fn publish(&self, policy: &Policy, metrics: &BudgetMetrics) {
        let share = self.share(policy);
        let divisor = match share {
            Share::WarmingUp => 0,
            other => i64::from(other.divisor()),
        };
        metrics.budget_replicas.set(divisor);
        metrics.budget_fallback.set(i64::from(share.is_fallback()));
    }
}

struct Budget {
    enabled: bool,
    max_replicas: u32,
    lease: Duration,
    /// When the replica Leases were last renewed and listed, and how many were live.
    contact: Option<(Instant, u32)>,
    history: ShareHistory,
    origin: Instant,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            enabled: false,
            max_replicas: 3,
            lease: Duration::from_secs(10),
            contact: None,
            history: ShareHistory::default(),
            origin: Instant::now(),
        }
    }
}

/// Small bookkeeping locks: a panic cannot leave them half-written, so take poisoned ones over.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The process's one Kubernetes client, from the standard places (in-cluster service
/// account, KUBECONFIG, ~/.kube/config). The shells that need the API server (pod cache,
/// releaser, budget lease) share it: one connection pool, one back-off.
#[derive(Default)]
pub struct KubeClient {
    cell: tokio::sync::OnceCell<kube::Client>,
}

/// Back-off between tries while no usable configuration is found: 2 s doubling to 60 s.
const CONNECT_FIRST_RETRY: Duration = Duration::from_secs(2);
const CONNECT_LAST_RETRY: Duration = Duration::from_secs(60);

impl KubeClient {
    /// The client, or why none could be made now.
    pub async fn try_get(&self) -> Result<kube::Client, String> {
        self.cell
            .get_or_try_init(|| async {
                let config = kube::Config::infer().await.map_err(|e| e.to_string())?;
                kube::Client::try_from(config).map_err(|e| e.to_string())
            })
            .await
            .cloned()
    }

    /// The client, retried until found or until `shutdown` (None); `missing` says, with
    /// the error, what goes without it meanwhile.
    pub async fn get(
        &self,
        shutdown: &mut watch::Receiver<bool>,
        missing: &str,
    ) -> Option<kube::Client> {
        let mut delay = CONNECT_FIRST_RETRY;
        loop {
            match self.try_get().await {
                Ok(client) => return Some(client),
                Err(why) => tracing::warn!(error = %why, retry_in = ?delay, "{missing}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stopped(shutdown) => return None,
            }
            delay = (delay * 2).min(CONNECT_LAST_RETRY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pacing::schedule::Adjustment;

    /// The cell's cached policy in force follows a change of the adjustments at once,
    /// also for a policy without schedules.
    #[test]
    fn the_policy_in_force_follows_the_adjustments() {
        let cell = PolicyCell::new(Policy::builtin());
        assert!(Arc::ptr_eq(&cell.in_force(10), &cell.get()));
        cell.set_adjustments(vec![Scoped {
            rules: None,
            adjustment: Adjustment::Pause {
                from: 0,
                until: Some(100),
            },
        }]);
        let (paused, until) = cell.in_force_until(10);
        assert!(paused.rules.iter().all(|r| r.paused_at(10) == Some(100)));
        assert_eq!(until, Some(100));
        let (after, _) = cell.in_force_until(100);
        assert!(after.rules.iter().all(|r| r.paused_at(100).is_none()));
        cell.set_adjustments(Vec::new());
        assert!(Arc::ptr_eq(&cell.in_force(50), &cell.get()));
    }
}
