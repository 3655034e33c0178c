//! The policy: which disruptive requests are paced, by which limit, and how.
//! Pure data and matching; parsing and validation live in `load`.

mod cron;
mod duration;
mod load;
mod schedule;

pub use cron::{Cron, CronError};
pub use duration::{format_duration, parse_duration};
pub use load::{PolicyError, DEFAULT_POLICY_YAML};
pub use schedule::{ScheduleWindow, HORIZON_MS};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The four kinds of request counted as churn (docs/architecture.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChurnKind {
    /// pods CREATE
    PodCreate,
    /// pods DELETE of a pod that is not yet terminating
    PodDelete,
    /// pods/eviction CREATE
    Eviction,
    /// statefulsets UPDATE (a partition decrease, or a template change for `partition`)
    StatefulSetUpdate,
}

impl ChurnKind {
    pub fn operation(self) -> &'static str {
        match self {
            ChurnKind::PodCreate | ChurnKind::Eviction => "CREATE",
            ChurnKind::PodDelete => "DELETE",
            ChurnKind::StatefulSetUpdate => "UPDATE",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    Global,
    Namespace,
    Owner,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Namespace => "namespace",
            Scope::Owner => "owner",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub events: u32,
    pub window: Duration,
    pub scope: Scope,
    /// How many may go at once; after them, one per [`Limit::spacing_ms`]. `events` makes
    /// the limit a plain sliding window (a window's worth at once).
    pub burst: u32,
}

/// Slack added to the window of a spaced limit (burst below events), so that an effect
/// lagging its decision by up to this much (the scheduler binding a released pod, the API
/// server answering a held request) still keeps `events` per window where it happens: both
/// the exact window and the spacing are kept over window + margin. At most a twentieth of
/// the window, so it costs at most 5% of the rate. 300 ms was not enough in the e2e: held
/// deletions and creations were answered up to ~0.45 s after their slots, 51 in a 10 s
/// window.
pub const SPACING_MARGIN_MS: u64 = 500;

impl Limit {
    /// The margin a spaced limit keeps (0 for a plain window).
    /// Spaced: the burst is below the events, and one event per window / events is at least
    /// a millisecond apart. The limiter's clock counts milliseconds, so a faster rate (over
    /// 1,000 per second) cannot be spaced: rounded up to 1 ms it would cap the rule at about
    /// 1,000 per second whatever it says; such a rule keeps the plain exact window.
    fn spaced(&self) -> bool {
        self.burst < self.events && self.window.as_millis() as u64 >= u64::from(self.events)
    }

    fn margin_ms(&self) -> u64 {
        if !self.spaced() {
            return 0;
        }
        (self.window.as_millis() as u64 / 20).min(SPACING_MARGIN_MS)
    }

    /// The window the limiter keeps exactly: the policy's, plus the margin when spaced.
    pub fn kept_window_ms(&self) -> u64 {
        self.window.as_millis() as u64 + self.margin_ms()
    }

    /// Milliseconds between consecutive events after the burst: the kept window / events,
    /// rounded up. None when the burst is the whole window's worth (a plain window), or
    /// when the rate is too fast to space on a millisecond clock (see `spaced`).
    pub fn spacing_ms(&self) -> Option<u64> {
        if !self.spaced() {
            return None;
        }
        Some(
            self.kept_window_ms()
                .div_ceil(u64::from(self.events.max(1)))
                .max(1),
        )
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} per {} ({})",
            self.events,
            format_duration(self.window),
            self.scope.as_str()
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// The shared network window of the rules marked `adaptive` (policy key `network`;
/// the loop itself is `crate::pacing::network`).
pub struct NetworkConfig {
    pub min_window: u32,
    pub max_window: u32,
    /// A pod not network-ready this long after its binding is a sample at this bound.
    pub bound_ms: u64,
    /// The floor is the least network time of a workload over this long.
    pub floor_period_ms: u64,
}

impl Default for NetworkConfig {
    fn default() -> NetworkConfig {
        NetworkConfig {
            min_window: 2,
            max_window: 200,
            bound_ms: 60_000,
            floor_period_ms: 600_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Admit the pod at once behind a scheduling gate; the releaser lifts it at the rate.
    Gate,
    /// Hold a StatefulSet rollout's partition; the releaser steps it down at the rate.
    Partition,
    /// Wait in the webhook for a slot closer than `maxHold`, else answer retry-after.
    Hold,
    /// Answer 429 with Retry-After (holding first when the rule sets `maxHold`).
    RetryAfter,
    /// Answer 429 without a retry hint (what plain rate-limiting webhooks do).
    Deny,
    /// Allow, with an admission warning.
    Warn,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Gate => "gate",
            Action::Partition => "partition",
            Action::Hold => "hold",
            Action::RetryAfter => "retry-after",
            Action::Deny => "deny",
            Action::Warn => "warn",
        }
    }

    /// Gate and partition rewrite the object, so they run on /mutate; the rest on /validate.
    pub fn is_mutating(self) -> bool {
        matches!(self, Action::Gate | Action::Partition)
    }
}

/// Which requests a rule applies to. Empty lists mean "any".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    pub kinds: Vec<ChurnKind>,
    /// Kinds of the pod's controller (ownerReference with controller: true), e.g. StatefulSet.
    /// The pseudo kind `None` matches pods without a controller.
    pub controller_kinds: Vec<String>,
    pub namespaces: Vec<String>,
    pub users: Vec<String>,
    pub exclude_users: Vec<String>,
    /// Objects carrying all of these labels are not matched (writers that pace themselves).
    pub exclude_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: Arc<str>,
    pub matches: Match,
    /// A request must fit in every one of these buckets.
    pub limits: Vec<Limit>,
    pub action: Action,
    /// For hold and retry-after: the longest wait served by holding the request.
    pub max_hold: Option<Duration>,
    /// For gate and partition: released pods of this rule that may be not Ready at once.
    pub max_not_ready: Option<u32>,
    /// Future slots one namespace may hold in one bucket, so no namespace starves another.
    pub max_reserved_per_namespace: u32,
    /// Retry-After answers never ask for more than this; the retry then keeps its slot.
    pub max_retry_after: Duration,
    /// For gate and partition: also bounded by the shared network window
    /// (`Policy::network`), sized from the pods' observed network-readiness.
    pub adaptive: bool,
    /// For gate: gate every pod, admit none at once. Never set by the policy file: the
    /// global budget sets it on replicas that do not lead the releaser, so that the
    /// leader alone decides how many pods start in a window (src/budget).
    pub gate_only: bool,
    /// Windows in time with limits of their own (`schedules`); outside them the rule's.
    pub schedules: Vec<ScheduleWindow>,
    /// Nothing of this rule goes until then (epoch ms): a window of `events: 0` in force.
    /// Never set by the policy file: `crate::pacing::schedule` sets it on the policy in
    /// force at a given time, as it sets the limits.
    pub paused_until: Option<u64>,
    /// What pauses it, for messages: "its schedule" or "`churn-throttler pause`" (set
    /// with `paused_until`).
    pub paused_by: &'static str,
}

/// `Rule::paused_by` of a schedule window of `events: 0`.
pub const PAUSED_BY_SCHEDULE: &str = "its schedule";
/// `Rule::paused_by` of a PacingOverride (`churn-throttler pause`, an override to 0).
pub const PAUSED_BY_COMMAND: &str = "`churn-throttler pause`";

impl Rule {
    /// The end of the pause in force at `now`, if the rule is paused (see `paused_until`).
    pub fn paused_at(&self, now: u64) -> Option<u64> {
        self.paused_until.filter(|&until| until > now)
    }

    /// Whether the rule covers this request (exemptions are checked by the caller).
    pub fn matches(&self, request: &RequestFacts<'_>) -> bool {
        let m = &self.matches;
        if !m.kinds.contains(&request.kind) {
            return false;
        }
        if !m.controller_kinds.is_empty() {
            let kind = request.controller_kind.unwrap_or("None");
            if !m.controller_kinds.iter().any(|k| k == kind) {
                return false;
            }
        }
        if !m.namespaces.is_empty() && !m.namespaces.iter().any(|n| n == request.namespace) {
            return false;
        }
        if !m.users.is_empty() && !m.users.iter().any(|u| u == request.user) {
            return false;
        }
        if m.exclude_users.iter().any(|u| u == request.user) {
            return false;
        }
        if !m.exclude_labels.is_empty()
            && m.exclude_labels
                .iter()
                .all(|(k, v)| request.labels.get(k) == Some(v))
        {
            return false;
        }
        true
    }
}

/// What matching needs to know of a request; borrowed from the classified request.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    pub kind: ChurnKind,
    pub namespace: &'a str,
    pub user: &'a str,
    pub groups: &'a [String],
    pub controller_kind: Option<&'a str>,
    pub priority_class: Option<&'a str>,
    pub labels: &'a BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exemptions {
    pub namespaces: Vec<String>,
    pub priority_classes: Vec<String>,
    pub users: Vec<String>,
    pub groups: Vec<String>,
}

impl Exemptions {
    /// The reason a request is exempt, if it is.
    pub fn exempts(&self, request: &RequestFacts<'_>) -> Option<&'static str> {
        if self.namespaces.iter().any(|n| n == request.namespace) {
            return Some("namespace");
        }
        if let Some(pc) = request.priority_class {
            if self.priority_classes.iter().any(|p| p == pc) {
                return Some("priority-class");
            }
        }
        if self.users.iter().any(|u| u == request.user) {
            return Some("user");
        }
        if request.groups.iter().any(|g| self.groups.contains(g)) {
            return Some("group");
        }
        None
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The webhook configurations' timeoutSeconds; holds and the server deadline fit inside.
    pub timeout: Duration,
    pub rules: Vec<Rule>,
    /// The network window shared by the `adaptive` rules; None when no rule is adaptive.
    pub network: Option<NetworkConfig>,
    pub exempt: Exemptions,
    /// Upper bound on live limiter buckets, whatever the input.
    pub max_buckets: usize,
}

impl Policy {
    /// The first rule that covers the request on the given endpoint.
    pub fn rule_for(&self, request: &RequestFacts<'_>, mutating: bool) -> Option<&Rule> {
        self.rules
            .iter()
            .filter(|r| r.action.is_mutating() == mutating)
            .find(|r| r.matches(request))
    }

    /// The policy without its network window: the adaptive rules keep their rates and
    /// caps, and nothing waits for a window (where no releaser measures one).
    pub fn drop_network_window(&mut self) {
        self.network = None;
        for rule in &mut self.rules {
            rule.adaptive = false;
        }
    }

    /// The built-in policy used when no file is given.
    pub fn builtin() -> Policy {
        // The embedded file is validated by a unit test, so this cannot fail at run time.
        Policy::from_yaml(DEFAULT_POLICY_YAML, "<built-in>").unwrap_or_else(|e| {
            panic!("built-in policy is invalid: {e}");
        })
    }

    /// The longest window of any limit (zero without rules).
    pub fn longest_window(&self) -> Duration {
        self.rules
            .iter()
            .flat_map(|r| r.limits.iter().map(|l| l.window))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// The server's deadline for one review: a second inside the webhook timeout.
    pub fn server_deadline(&self) -> Duration {
        self.timeout
            .saturating_sub(Duration::from_secs(1))
            .max(Duration::from_millis(500))
    }
}
