//! Leader election through a coordination.k8s.io/v1 Lease, so one replica releases; the
//! Lease helpers (`within`, `Failure`) and the replica identity are shared with the budget.
//!
//! `decide` is the pure rule; `run` applies it every couple of seconds.
//!
//! Expiry is judged the way client-go judges it: by how long this replica has seen the
//! Lease unchanged on its own monotonic clock, never by comparing `renewTime` with its
//! wall clock, so clock skew between nodes cannot hand the lease over early. The
//! leader counts its term from the moment it *sent* the renewal, minus a margin, so it
//! stops releasing before any other replica can take over.

use crate::metrics::ReleaserParts;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    /// How long a holder that stopped renewing keeps the lease.
    pub duration: Duration,
    /// How often the leader renews.
    pub renew_every: Duration,
    /// How often a follower looks (bounds how late it notices an expiry).
    pub retry_every: Duration,
    /// The leader stops this long before its lease could expire.
    pub margin: Duration,
    /// Longest wait for one API call: a hung connection must not stall the election.
    pub call_timeout: Duration,
    /// Annotations the leader keeps on the Lease (the network window, for the next
    /// leader), written with each renewal, and those it last read there.
    pub notes: Arc<Notes>,
}

/// Annotations carried on the Lease by the renewals, so that nothing else writes the
/// Lease (a second writer would make a renewal lose its race).
#[derive(Debug, Default)]
pub struct Notes {
    to_write: Mutex<BTreeMap<String, String>>,
    seen: Mutex<BTreeMap<String, String>>,
}

impl Notes {
    /// Written with the next renewal.
    pub fn set(&self, key: &str, value: String) {
        lock(&self.to_write).insert(key.to_string(), value);
    }

    /// What the Lease carried when last read.
    pub fn seen(&self, key: &str) -> Option<String> {
        lock(&self.seen).get(key).cloned()
    }

    fn saw(&self, lease: Option<&Lease>) {
        let annotations = lease
            .and_then(|l| l.metadata.annotations.clone())
            .unwrap_or_default();
        *lock(&self.seen) = annotations;
    }

    fn write_into(&self, lease: &mut Lease) {
        let notes = lock(&self.to_write).clone();
        if !notes.is_empty() {
            lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .extend(notes);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LeaseConfig {
    pub fn new(name: String, namespace: String, identity: String) -> LeaseConfig {
        LeaseConfig {
            name,
            namespace,
            identity,
            duration: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
            retry_every: Duration::from_secs(1),
            margin: Duration::from_secs(1),
            call_timeout: Duration::from_secs(4),
            notes: Arc::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No Lease exists: create it with us as holder.
    Create,
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it, guarded by its resourceVersion.
    TakeOver,
    /// Someone else holds a live lease.
    Follow { holder: String },
}

/// What to do with the Lease as read, given how long it has looked unchanged to us.
pub fn decide(lease: Option<&Lease>, me: &str, unchanged_for: Duration) -> Step {
    let Some(lease) = lease else {
        return Step::Create;
    };
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("");
    if holder == me {
        return Step::Renew;
    }
    if holder.is_empty() {
        return Step::TakeOver;
    }
    let seconds = spec
        .and_then(|s| s.lease_duration_seconds)
        .unwrap_or(10)
        .max(1);
    if unchanged_for >= Duration::from_secs(seconds as u64) {
        Step::TakeOver
    } else {
        Step::Follow {
            holder: holder.to_string(),
        }
    }
}

enum Outcome {
    Leading(Instant),
    Following(String),
    /// An error or a lost race: keep the current deadline, look again soon.
    Unknown(String),
}

struct Observed {
    version: Option<String>,
    since: Instant,
}

/// Runs the election until `shutdown`; on shutdown a leader gives the lease up, so a
/// follower takes over at its next look instead of after the full duration.
pub async fn run(
    api: Api<Lease>,
    config: LeaseConfig,
    tx: watch::Sender<Option<Instant>>,
    metrics: ReleaserParts,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut observed = Observed {
        version: None,
        since: Instant::now(),
    };
    let mut failures: u32 = 0;
    let mut last_holder = String::new();
    loop {
        let started = Instant::now();
        let outcome = round(&api, &config, &mut observed, started).await;
        let current = *tx.borrow();
        let leading = match outcome {
            Outcome::Leading(until) => {
                failures = 0;
                if current.is_none() {
                    tracing::info!(lease = %format!("{}/{}", config.namespace, config.name),
                        identity = %config.identity, "releaser: acquired the lease, now the leader");
                }
                tx.send_replace(Some(until));
                true
            }
            Outcome::Following(holder) => {
                failures = 0;
                if current.is_some() {
                    tracing::warn!(%holder, "releaser: lost the lease, stopped releasing");
                }
                if holder != last_holder {
                    tracing::info!(%holder, "releaser: following; the lease is held by another replica");
                    last_holder = holder;
                }
                tx.send_replace(None);
                false
            }
            Outcome::Unknown(why) => {
                failures += 1;
                metrics
                    .releaser
                    .releaser_api_errors
                    .with_label_values(&["lease"])
                    .inc();
                if failures == 1 || failures.is_power_of_two() {
                    tracing::warn!(error = %why, failures, "releaser: cannot read or renew the lease; retrying");
                }
                match current {
                    Some(until) if Instant::now() < until => true,
                    Some(_) => {
                        tracing::warn!(
                            "releaser: lease not renewed before its expiry, stopped releasing"
                        );
                        tx.send_replace(None);
                        false
                    }
                    None => false,
                }
            }
        };
        metrics.releaser.releaser_leader.set(i64::from(leading));
        let mut pause = if leading {
            config.renew_every
        } else if failures > 0 {
            // Back off while the API server is away, but never past a renewal we need.
            config.retry_every * 2u32.saturating_pow(failures.min(3) - 1)
        } else {
            config.retry_every
        };
        if let Some(until) = *tx.borrow() {
            pause = pause.min(until.saturating_duration_since(Instant::now()));
        }
        if leading && failures > 0 {
            pause = pause.min(config.retry_every);
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = crate::shared::stopped(&mut shutdown) => {
                if tx.borrow().is_some() {
                    tx.send_replace(None);
                    give_up(&api, &config).await;
                }
                metrics.releaser.releaser_leader.set(0);
                return;
            }
        }
    }
}

async fn round(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observed: &mut Observed,
    started: Instant,
) -> Outcome {
    let limit = config.call_timeout;
    let lease = match within(limit, api.get_opt(&config.name)).await {
        Ok(lease) => lease,
        Err(e) => return Outcome::Unknown(e.to_string()),
    };
    config.notes.saw(lease.as_ref());
    let version = lease
        .as_ref()
        .and_then(|l| l.metadata.resource_version.clone());
    if version != observed.version {
        observed.version = version;
        observed.since = started;
    }
    let term_end = started + config.duration.saturating_sub(config.margin);
    let now = MicroTime(Timestamp::now());
    let seconds = i32::try_from(config.duration.as_secs())
        .unwrap_or(10)
        .max(1);
    match decide(
        lease.as_ref(),
        &config.identity,
        started.saturating_duration_since(observed.since),
    ) {
        Step::Create => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(config.name.clone()),
                    namespace: Some(config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(config.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            match within(limit, api.create(&PostParams::default(), &lease)).await {
                Ok(_) => Outcome::Leading(term_end),
                Err(e) if e.is_conflict() => Outcome::Following("(another replica)".into()),
                Err(e) => Outcome::Unknown(e.to_string()),
            }
        }
        Step::Renew | Step::TakeOver => {
            let Some(mut lease) = lease else {
                return Outcome::Unknown("lease vanished".into());
            };
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
                spec.holder_identity = Some(config.identity.clone());
                spec.acquire_time = Some(now.clone());
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.lease_duration_seconds = Some(seconds);
            spec.renew_time = Some(now);
            config.notes.write_into(&mut lease);
            // `replace` sends metadata.resourceVersion: a concurrent writer makes it fail.
            match within(
                limit,
                api.replace(&config.name, &PostParams::default(), &lease),
            )
            .await
            {
                Ok(_) => Outcome::Leading(term_end),
                Err(e) if e.is_conflict() => Outcome::Unknown(format!("lost a race: {e}")),
                Err(e) => Outcome::Unknown(e.to_string()),
            }
        }
        Step::Follow { holder } => Outcome::Following(holder),
    }
}

/// Clears the holder so a follower takes over at once (best effort).
async fn give_up(api: &Api<Lease>, config: &LeaseConfig) {
    let limit = config.call_timeout;
    let Ok(Some(mut lease)) = within(limit, api.get_opt(&config.name)).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    match within(
        limit,
        api.replace(&config.name, &PostParams::default(), &lease),
    )
    .await
    {
        Ok(_) => tracing::info!("releaser: gave the lease up"),
        Err(e) => {
            tracing::warn!(error = %e, "releaser: could not give the lease up; it expires by itself")
        }
    }
}

/// Why a bounded API call failed.
#[derive(Debug)]
pub enum Failure {
    TimedOut(Duration),
    Api(kube::Error),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::TimedOut(limit) => write!(f, "no answer within {limit:?}"),
            Failure::Api(e) => write!(f, "{e}"),
        }
    }
}

impl Failure {
    fn is_conflict(&self) -> bool {
        matches!(self, Failure::Api(e) if is_conflict(e))
    }

    /// The HTTP status of an API error (None for a timeout or a transport error).
    pub fn status(&self) -> Option<u16> {
        match self {
            Failure::Api(e) => status_code(e),
            Failure::TimedOut(_) => None,
        }
    }
}

/// Runs one API call, giving up after `limit`.
pub async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(Failure::Api(e)),
        Err(_) => Err(Failure::TimedOut(limit)),
    }
}

pub fn is_conflict(e: &kube::Error) -> bool {
    status_code(e) == Some(409)
}

pub fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The Lease's namespace: `--lease-namespace`, else $POD_NAMESPACE, else churn-throttler.
pub fn default_namespace(flag: Option<&str>, pod_namespace: Option<&str>) -> String {
    flag.or(pod_namespace)
        .filter(|s| !s.is_empty())
        .unwrap_or("churn-throttler")
        .to_string()
}

/// This replica's identity in the Lease: `--identity`, else $POD_NAME, else the host
/// name with the process id (two processes on one host must never share an identity,
/// or both would think they hold the lease).
pub fn default_identity(
    flag: Option<&str>,
    pod_name: Option<&str>,
    hostname: Option<&str>,
    pid: u32,
) -> String {
    if let Some(id) = flag.or(pod_name).filter(|s| !s.is_empty()) {
        return id.to_string();
    }
    let host = hostname
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("churn-throttler");
    format!("{host}-{pid}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::Leadership;

    fn lease(holder: Option<&str>, seconds: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: seconds,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn table_of_lease_decisions() {
        let s = Duration::from_secs;
        let other = || Step::Follow { holder: "b".into() };
        // (case, lease, unchanged for, step)
        let cases: Vec<(&str, Option<Lease>, Duration, Step)> = vec![
            ("no lease: create it", None, s(0), Step::Create),
            (
                "ours: renew",
                Some(lease(Some("a"), Some(10))),
                s(0),
                Step::Renew,
            ),
            (
                "ours even when it looks stale: renew",
                Some(lease(Some("a"), Some(10))),
                s(60),
                Step::Renew,
            ),
            (
                "given up (no holder): take it",
                Some(lease(None, Some(1))),
                s(0),
                Step::TakeOver,
            ),
            (
                "given up (empty holder)",
                Some(lease(Some(""), Some(10))),
                s(0),
                Step::TakeOver,
            ),
            (
                "another's, fresh: follow",
                Some(lease(Some("b"), Some(10))),
                s(9),
                other(),
            ),
            (
                "another's, unchanged for its duration: take it",
                Some(lease(Some("b"), Some(10))),
                s(10),
                Step::TakeOver,
            ),
            (
                "another's, without a duration: 10 s",
                Some(lease(Some("b"), None)),
                s(9),
                other(),
            ),
            (
                "a zero duration counts as 1 s",
                Some(lease(Some("b"), Some(0))),
                s(1),
                Step::TakeOver,
            ),
            (
                "no spec at all: free",
                Some(Lease {
                    metadata: ObjectMeta::default(),
                    spec: None,
                }),
                s(0),
                Step::TakeOver,
            ),
        ];
        for (name, lease, unchanged, step) in cases {
            assert_eq!(decide(lease.as_ref(), "a", unchanged), step, "{name}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn leadership_ends_at_its_deadline_without_renewal() {
        let (tx, rx) = watch::channel(None);
        let mut leadership = Leadership::new(rx);
        assert!(!leadership.is_leader());
        let until = Instant::now() + Duration::from_secs(9);
        tx.send_replace(Some(until));
        assert!(leadership.acquired().await);
        assert!(leadership.is_leader());
        let started = Instant::now();
        leadership.lost().await;
        assert_eq!(Instant::now() - started, Duration::from_secs(9));
        assert!(!leadership.is_leader());
    }

    #[tokio::test(start_paused = true)]
    async fn renewal_extends_the_term_and_loss_ends_it_at_once() {
        let (tx, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(9)));
        let mut leadership = Leadership::new(rx);
        let renew = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            renew.send_replace(Some(Instant::now() + Duration::from_secs(9)));
            tokio::time::sleep(Duration::from_secs(3)).await;
            renew.send_replace(None);
        });
        let started = Instant::now();
        leadership.lost().await;
        assert_eq!(Instant::now() - started, Duration::from_secs(5));
        drop(tx);
    }

    #[test]
    fn table_of_identities() {
        type Case = (
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
            &'static str,
        );
        let cases: &[Case] = &[
            ("flag wins", Some("me"), Some("pod-1"), Some("host"), "me"),
            ("pod name next", None, Some("pod-1"), Some("host"), "pod-1"),
            (
                "empty pod name ignored",
                None,
                Some(""),
                Some("host"),
                "host-7",
            ),
            ("host name with pid", None, None, Some("host\n"), "host-7"),
            ("nothing known", None, None, None, "churn-throttler-7"),
        ];
        for (name, flag, pod, host, want) in cases {
            assert_eq!(default_identity(*flag, *pod, *host, 7), *want, "{name}");
        }
    }

    #[test]
    fn table_of_lease_namespaces() {
        assert_eq!(default_namespace(Some("x"), Some("y")), "x");
        assert_eq!(default_namespace(None, Some("y")), "y");
        assert_eq!(default_namespace(None, None), "churn-throttler");
        assert_eq!(default_namespace(Some(""), None), "churn-throttler");
    }
}
