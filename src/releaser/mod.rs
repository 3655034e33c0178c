//! The releasers' shells, run inside `serve` on every replica; a Lease (`crate::election`)
//! picks the one that acts. The gate releaser (`controller`) lifts churn-throttler's
//! scheduling gate at each gate rule's rate; the partition releaser (`partition`, with
//! `released_pods`, its looks at the pods its steps released) steps held StatefulSet
//! rollouts down at each partition rule's rate. Both run on one shell (`shell`: watch,
//! rounds, patches with their error classes and back-off, Events, gauges). What they
//! decide is the pure pacing core (`crate::pacing`); the objects' views and patches are
//! `crate::objects`.
//!
//! All of their state lives on the objects (the gate, the `churn-throttler.io/gated`
//! label, the gated-by and released-at annotations on pods; the partition-target,
//! partition-held and partition-stepped-at annotations on StatefulSets, named in
//! `crate::names`), so a restart or a failover loses nothing.
//! User-facing documentation: docs/releaser.md and docs/partition.md.

mod controller;
mod partition;
mod released_pods;
mod shell;
pub use shell::new_event;

pub use controller::run;

use crate::election::LeaseConfig;
use crate::limiter::{Limiter, Millis};
use crate::metrics::ReleaserParts;
use crate::policy::Policy;
use crate::shared::{KubeClient, LimiterCell, PolicyCell, QueueCell, RoleCell};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

/// What the releasers use of the process, built by `serve`: the policy in force
/// (unscaled), the limiter they charge with the webhook, where to say whether they lead
/// (the global budget splits gate rules by it), where the gate queue it sees goes for
/// the webhook's estimates, the metrics, and this process's
/// `admitted-by` mark (pods its own webhook admitted are already in its limiter).
pub struct Context {
    pub policy: Arc<PolicyCell>,
    pub limiter: Arc<LimiterCell>,
    pub role: Arc<RoleCell>,
    /// The gate queue of the last round, while leading, for the webhook in this process.
    pub queue: Arc<QueueCell>,
    pub metrics: ReleaserParts,
    pub instance: String,
    /// The process's Kubernetes client, shared with the other shells.
    pub kube: Arc<KubeClient>,
}

impl Context {
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.get()
    }

    /// The policy with the limits in force at `now` (schedule windows applied).
    pub fn policy_at(&self, now: Millis) -> Arc<Policy> {
        self.policy.in_force(now)
    }

    /// The next time after `now` the limits in force change, if one is in reach: a round
    /// wakes then at the latest, so a window that opens or closes takes effect at once.
    pub fn next_change(&self, now: Millis) -> Option<Millis> {
        self.policy.in_force_until(now).1
    }

    pub fn limiter(&self) -> MutexGuard<'_, Limiter> {
        self.limiter.lock()
    }
}

/// The releasers' configuration: the Lease they elect the leader through, how often they
/// write Events.
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
