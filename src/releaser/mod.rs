//! The releasers, run inside `serve` on every replica; a Lease (`lease`) picks the one
//! that acts. The gate releaser (`controller`, plan in `plan`, pod reading and patches in
//! `pods`) lifts churn-throttler's scheduling gate at each gate rule's rate; the partition
//! releaser (`partition`, plan in `partition_plan` with `partition_windows` and
//! `released_pods`, StatefulSet reading and patches in `statefulsets`) steps held
//! StatefulSet rollouts down at each partition rule's rate. Both run on one shell
//! (`shell`: watch, rounds, patches with their error classes and back-off, Events,
//! gauges). The plans are pure; the shells talk to the API server.
//!
//! All of their state lives on the objects (the gate, the `churn-throttler.io/gated`
//! label, the gated-by and released-at annotations on pods; the partition-target,
//! partition-held and partition-stepped-at annotations on StatefulSets, named in
//! `crate::names`), so a restart or a failover loses nothing.
//! User-facing documentation: docs/releaser.md and docs/partition.md.

pub mod controller;
pub mod lease;
pub mod partition;
pub mod partition_plan;
mod partition_windows;
pub mod plan;
pub mod pods;
mod released_pods;
mod shell;
pub mod statefulsets;

pub use controller::{run, Config};
pub use lease::LeaseConfig;

use crate::limiter::Limiter;
use crate::metrics::ReleaserParts;
use crate::policy::Policy;
use crate::shared::{hostname, KubeClient, LimiterCell, PolicyCell, QueueCell, RoleCell};
use std::sync::{Arc, MutexGuard};

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

    pub fn limiter(&self) -> MutexGuard<'_, Limiter> {
        self.limiter.lock()
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

/// The releaser's configuration from `serve`'s flags; None when it is turned off
/// (`--releaser=false`, or `--dev` without an explicit `--releaser`).
pub fn config_from_args(args: &crate::cli::ServeArgs) -> Option<Config> {
    let flags = &args.releaser;
    if !flags.enabled.unwrap_or(!args.dev) {
        return None;
    }
    let env = |name: &str| std::env::var(name).ok();
    let namespace = default_namespace(
        flags.lease_namespace.as_deref(),
        env("POD_NAMESPACE").as_deref(),
    );
    let identity = default_identity(
        flags.identity.as_deref(),
        env("POD_NAME").as_deref(),
        hostname().as_deref(),
        std::process::id(),
    );
    Some(Config::new(LeaseConfig::new(
        flags.lease_name.clone(),
        namespace,
        identity,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn table_of_releaser_switches() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        // (case, arguments after `serve`, releaser on)
        let cases: &[(&str, &[&str], bool)] = &[
            ("on by default", &[], true),
            ("off by default with --dev", &["--dev"], false),
            ("--dev with --releaser", &["--dev", "--releaser"], true),
            ("--releaser=false", &["--releaser=false"], false),
            ("--releaser=true", &["--releaser=true"], true),
            ("--dev --releaser=true", &["--dev", "--releaser=true"], true),
        ];
        for (name, extra, on) in cases {
            let mut argv = vec![
                "churn-throttler",
                "serve",
                "--lease-name",
                "l",
                "--identity",
                "me",
            ];
            argv.extend_from_slice(extra);
            let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{name}: {e}"));
            let Command::Serve(args) = cli.command else {
                panic!("{name}: not serve");
            };
            let config = config_from_args(&args);
            assert_eq!(config.is_some(), *on, "{name}");
            if let Some(config) = config {
                assert_eq!(config.lease.name, "l", "{name}");
                assert_eq!(config.lease.identity, "me", "{name}");
            }
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
