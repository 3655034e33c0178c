//! The command line; every flag of `serve` can also come from the environment. The flags
//! become the shells' plain configurations here (`ServeArgs::into_config`), so no module
//! below the entry points knows a flag.

use crate::election::{default_identity, default_namespace};
use crate::serve;
use crate::shared::hostname;
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "churn-throttler",
    version,
    about = "Admission webhook that paces pod churn cluster-wide"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the admission server (HTTPS) and the metrics/probe server (HTTP).
    Serve(Box<ServeArgs>),
    /// Validate a policy file; prints the error with file and line, exits non-zero.
    /// With schedules, prints the next changes of the limits in force.
    CheckConfig {
        /// The policy YAML file.
        file: PathBuf,
        /// Count the next schedule changes from this time (RFC 3339, e.g.
        /// 2026-12-07T00:00:00Z) instead of now.
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
    },
    /// Print the built-in default policy.
    DefaultPolicy,
    /// Simulate a mass rollout under each action, over the same limiter and decision code.
    Simulate(Box<crate::simulate::SimulateArgs>),
    /// Show the pacing without a cluster: start the webhook here on 127.0.0.1 with the
    /// built-in policy, delete distinct pods as a ReplicaSet controller, print each answer.
    Demo(crate::demo::DemoArgs),
    /// What churn-throttler holds in a cluster, read as kubectl does: per rule the window
    /// and the next slot, the gated pods with their place and estimated release, the held
    /// StatefulSets, the releaser's leader. `status sts/NAME --wait` waits for a rollout.
    Status(Box<crate::ctl::StatusArgs>),
    /// Emergency: lift churn-throttler's gate of pods now, or let a held StatefulSet go
    /// to its target now (recorded in an annotation and an Event).
    Release(Box<crate::ctl::ReleaseArgs>),
    /// Stop the churn of rules (or --all) for a while: nothing is released or stepped,
    /// paced requests wait. Needs --for DURATION, or --indefinitely on purpose. Returns
    /// once the releasers' leader has taken it up.
    Pause(Box<crate::ctl::pacing::PauseArgs>),
    /// End pauses made with `pause` (deletes their PacingOverride objects).
    Resume(Box<crate::ctl::pacing::ResumeArgs>),
    /// Other limits for a rule for a while (--events N --for 2h), then the policy's again.
    Override(Box<crate::ctl::pacing::OverrideArgs>),
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Policy YAML; without it the built-in default policy (see `default-policy`).
    #[arg(long, env = "CHURN_THROTTLER_CONFIG")]
    pub config: Option<PathBuf>,
    /// PEM certificate chain for the admission port.
    #[arg(long, env = "CHURN_THROTTLER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for the admission port.
    #[arg(long, env = "CHURN_THROTTLER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: when set, clients (the API server) must present a certificate it signed.
    #[arg(long, env = "CHURN_THROTTLER_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// HTTPS address for /validate and /mutate.
    #[arg(long, env = "CHURN_THROTTLER_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Plain-HTTP address for /metrics, /healthz and /readyz.
    #[arg(
        long,
        env = "CHURN_THROTTLER_METRICS_LISTEN",
        default_value = "0.0.0.0:9090"
    )]
    pub metrics_listen: SocketAddr,
    /// Development mode: make a self-signed CA and certificate for localhost at start,
    /// listen on 127.0.0.1, and print a curl line that sends a sample review.
    #[arg(long, env = "CHURN_THROTTLER_DEV")]
    pub dev: bool,
    /// Watch pods (metadata only) so that a pod DELETE or eviction is charged only when the
    /// pod it names exists (forged reviews cannot push real requests back). On by default;
    /// with --dev only when a Kubernetes configuration is found; `--pod-cache=false` turns it off.
    #[arg(long = "pod-cache", env = "CHURN_THROTTLER_POD_CACHE", num_args = 0..=1,
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub pod_cache: Option<bool>,
    /// Where --dev writes its CA, certificate and sample review.
    #[arg(
        long,
        env = "CHURN_THROTTLER_DEV_DIR",
        default_value = ".churn-throttler-dev"
    )]
    pub dev_dir: PathBuf,
    /// How often the certificate and policy files are checked for changes.
    #[arg(long, env = "CHURN_THROTTLER_RELOAD_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub reload_interval: std::time::Duration,
    /// After SIGTERM: time spent not-ready (still serving) before draining.
    #[arg(long, env = "CHURN_THROTTLER_SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_delay: std::time::Duration,
    /// Longest wait for open requests to finish after the delay.
    #[arg(long, env = "CHURN_THROTTLER_DRAIN_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub drain_timeout: std::time::Duration,
    /// Largest accepted AdmissionReview body; larger ones get HTTP 413.
    #[arg(long, env = "CHURN_THROTTLER_MAX_BODY_BYTES", default_value_t = 7 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Log format.
    #[arg(long, env = "CHURN_THROTTLER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub connections: ConnectionArgs,
    #[command(flatten)]
    pub releaser: ReleaserArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
}

/// Timeouts and caps of the connections on both ports (docs/operations.md, "Hostile
/// and broken clients"). The defaults are never reached by a kube-apiserver.
#[derive(Args, Debug, Clone)]
pub struct ConnectionArgs {
    /// Longest TLS handshake on the admission port.
    #[arg(long, env = "CHURN_THROTTLER_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub tls_handshake_timeout: std::time::Duration,
    /// HTTP/1.1: longest wait for a request's complete head (also bounds an idle
    /// HTTP/1.1 keep-alive connection), on both ports.
    #[arg(long, env = "CHURN_THROTTLER_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: std::time::Duration,
    /// Deadline for a request's whole body, from its head; then 408 and the connection closes.
    #[arg(long, env = "CHURN_THROTTLER_BODY_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub body_read_timeout: std::time::Duration,
    /// A connection with no request in flight for this long is closed (HTTP/1.1 and HTTP/2).
    #[arg(long, env = "CHURN_THROTTLER_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: std::time::Duration,
    /// HTTP/2 PING interval; a PING unanswered for as long closes the connection.
    #[arg(long, env = "CHURN_THROTTLER_HTTP2_PING_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub http2_ping_interval: std::time::Duration,
    /// Open connections on the admission port at most (lowered to fit the open-file
    /// limit with room for the metrics port); more are closed as they are accepted.
    #[arg(long, env = "CHURN_THROTTLER_MAX_CONNECTIONS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Open admission connections from one source address at most [default: a quarter
    /// of --max-connections]; at this cap a newcomer closes one of that source's (the
    /// metrics port's per-source cap is a quarter of its own).
    #[arg(long, env = "CHURN_THROTTLER_MAX_CONNECTIONS_PER_SOURCE",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_source: Option<u32>,
    /// Open connections on the metrics/probe port at most, counted apart from the
    /// admission port's, so the probes are answered when that port is full.
    #[arg(long, env = "CHURN_THROTTLER_MAX_METRICS_CONNECTIONS", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_metrics_connections: u32,
}

/// The global budget across webhook replicas (see docs/global-budget.md).
#[derive(Args, Debug, Clone)]
pub struct BudgetArgs {
    /// Share every limit across the webhook replicas: each counts the live replica
    /// Leases (N) and enforces 1/N of each limit. On by default; off with --dev, and when
    /// no Kubernetes configuration is found unless given explicitly; `--replica-budget=false`
    /// turns it off.
    #[arg(id = "replica_budget", long = "replica-budget", env = "CHURN_THROTTLER_REPLICA_BUDGET", num_args = 0..=1,
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub enabled: Option<bool>,
    /// Replicas assumed while the API server cannot be reached for longer than a lease
    /// (10 s): each replica then enforces 1/max(this, the last count) of every limit.
    #[arg(long, env = "CHURN_THROTTLER_MAX_REPLICAS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_replicas: u32,
}

/// The gate releaser inside `serve` (see docs/releaser.md).
#[derive(Args, Debug, Clone)]
pub struct ReleaserArgs {
    /// Run the gate releaser (one replica releases, elected through a Lease).
    /// On by default, off by default with --dev; `--releaser=false` turns it off.
    #[arg(long = "releaser", env = "CHURN_THROTTLER_RELEASER", num_args = 0..=1,
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub enabled: Option<bool>,
    /// Name of the coordination.k8s.io Lease the replicas elect the releaser with.
    #[arg(
        long,
        env = "CHURN_THROTTLER_LEASE_NAME",
        default_value = "churn-throttler-releaser"
    )]
    pub lease_name: String,
    /// Namespace of the Lease [default: $POD_NAMESPACE, else churn-throttler].
    #[arg(long, env = "CHURN_THROTTLER_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// This replica's name in the Lease [default: $POD_NAME, else host name and process id].
    #[arg(long, env = "CHURN_THROTTLER_IDENTITY")]
    pub identity: Option<String>,
}

fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    crate::policy::parse_duration(text)
}

/// How `serve` writes its log lines (stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

impl ServeArgs {
    /// The server's configuration: the flags, with the releaser and the budget resolved
    /// from their switches, `--dev` and the environment ($POD_NAMESPACE, $POD_NAME, $POD_UID).
    pub fn into_config(self) -> serve::Config {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let environment = Environment {
            pod_namespace: env("POD_NAMESPACE"),
            pod_name: env("POD_NAME"),
            pod_uid: env("POD_UID"),
            hostname: hostname(),
            pid: std::process::id(),
        };
        let releaser = releaser_config(&self, &environment);
        let budget = budget_config(&self, &environment);
        let c = self.connections;
        serve::Config {
            policy_file: self.config,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            client_ca: self.client_ca,
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            dev: self.dev,
            dev_dir: self.dev_dir,
            pod_cache: self.pod_cache,
            reload_interval: self.reload_interval,
            shutdown_delay: self.shutdown_delay,
            drain_timeout: self.drain_timeout,
            max_body_bytes: self.max_body_bytes,
            connections: serve::Connections {
                tls_handshake_timeout: c.tls_handshake_timeout,
                header_read_timeout: c.header_read_timeout,
                body_read_timeout: c.body_read_timeout,
                idle_timeout: c.idle_timeout,
                http2_ping_interval: c.http2_ping_interval,
                max_connections: c.max_connections,
                max_connections_per_source: c.max_connections_per_source,
                max_metrics_connections: c.max_metrics_connections,
            },
            releaser,
            budget,
        }
    }
}

/// What the process learns of where it runs, read once by `into_config`.
struct Environment {
    pod_namespace: Option<String>,
    pod_name: Option<String>,
    pod_uid: Option<String>,
    hostname: Option<String>,
    pid: u32,
}

impl Environment {
    fn lease_namespace(&self, args: &ServeArgs) -> String {
        default_namespace(
            args.releaser.lease_namespace.as_deref(),
            self.pod_namespace.as_deref(),
        )
    }

    fn identity(&self, args: &ServeArgs) -> String {
        default_identity(
            args.releaser.identity.as_deref(),
            self.pod_name.as_deref(),
            self.hostname.as_deref(),
            self.pid,
        )
    }
}

/// The releaser's configuration; None when it is turned off (`--releaser=false`, or
/// `--dev` without an explicit `--releaser`).
fn releaser_config(args: &ServeArgs, env: &Environment) -> Option<crate::releaser::Config> {
    if !args.releaser.enabled.unwrap_or(!args.dev) {
        return None;
    }
    Some(crate::releaser::Config::new(
        crate::election::LeaseConfig::new(
            args.releaser.lease_name.clone(),
            env.lease_namespace(args),
            env.identity(args),
        ),
    ))
}

/// The budget's configuration; None when it is off (`--replica-budget=false`, or `--dev`
/// without an explicit `--replica-budget`). Namespace and identity are the releaser's
/// (`--lease-namespace`, `--identity`).
fn budget_config(args: &ServeArgs, env: &Environment) -> Option<crate::budget::lease::Config> {
    if !args.budget.enabled.unwrap_or(!args.dev) {
        return None;
    }
    let mut config =
        crate::budget::lease::Config::new(env.lease_namespace(args), env.identity(args));
    // Owned by its Pod only when the identity is the Pod's name.
    if let (Some(pod), Some(uid)) = (&env.pod_name, &env.pod_uid) {
        if *pod == config.identity {
            config.owner = Some((pod.clone(), uid.clone()));
        }
    }
    config.required = args.budget.enabled == Some(true);
    config.max_replicas = args.budget.max_replicas;
    Some(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_args(extra: &[&str]) -> Result<ServeArgs, clap::Error> {
        let mut argv = vec!["churn-throttler", "serve"];
        argv.extend_from_slice(extra);
        let cli = Cli::try_parse_from(&argv)?;
        let Command::Serve(args) = cli.command else {
            panic!("not serve");
        };
        Ok(*args)
    }

    fn no_environment() -> Environment {
        Environment {
            pod_namespace: None,
            pod_name: None,
            pod_uid: None,
            hostname: Some("host".into()),
            pid: 7,
        }
    }

    #[test]
    fn table_of_releaser_switches() {
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
            let mut argv = vec!["--lease-name", "l", "--identity", "me"];
            argv.extend_from_slice(extra);
            let args = serve_args(&argv).unwrap_or_else(|e| panic!("{name}: {e}"));
            let config = releaser_config(&args, &no_environment());
            assert_eq!(config.is_some(), *on, "{name}");
            if let Some(config) = config {
                assert_eq!(config.lease.name, "l", "{name}");
                assert_eq!(config.lease.identity, "me", "{name}");
            }
        }
    }

    #[test]
    fn table_of_budget_switches() {
        // (case, arguments after `serve`, budget on, insists on a cluster, fallback replicas)
        let cases: &[(&str, &[&str], bool, bool, u32)] = &[
            ("on by default", &[], true, false, 3),
            ("off by default with --dev", &["--dev"], false, false, 3),
            (
                "--dev with --replica-budget",
                &["--dev", "--replica-budget"],
                true,
                true,
                3,
            ),
            (
                "--replica-budget=false",
                &["--replica-budget=false"],
                false,
                false,
                3,
            ),
            (
                "--replica-budget=true",
                &["--replica-budget=true"],
                true,
                true,
                3,
            ),
            ("--max-replicas 5", &["--max-replicas", "5"], true, false, 5),
        ];
        for (name, extra, on, required, max) in cases {
            let mut argv = vec!["--identity", "Pod_1", "--lease-namespace", "ct"];
            argv.extend_from_slice(extra);
            let args = serve_args(&argv).unwrap_or_else(|e| panic!("{name}: {e}"));
            let config = budget_config(&args, &no_environment());
            assert_eq!(config.is_some(), *on, "{name}");
            if let Some(config) = config {
                assert_eq!(config.required, *required, "{name}");
                assert_eq!(config.max_replicas, *max, "{name}");
                assert_eq!(config.namespace, "ct", "{name}");
                assert_eq!(config.identity, "Pod_1", "{name}");
                assert_eq!(
                    crate::budget::lease_name(&config.identity),
                    "churn-throttler-replica-pod-1"
                );
            }
        }
        assert!(
            serve_args(&["--max-replicas", "0"]).is_err(),
            "--max-replicas 0 is refused"
        );
    }

    #[test]
    fn the_budget_lease_is_owned_by_its_pod_only_under_the_pods_name() {
        let mut env = no_environment();
        env.pod_name = Some("web-0".into());
        env.pod_uid = Some("uid-1".into());
        let args = serve_args(&[]).unwrap_or_else(|e| panic!("{e}"));
        let config = budget_config(&args, &env).unwrap_or_else(|| panic!("budget on"));
        assert_eq!(config.owner, Some(("web-0".into(), "uid-1".into())));
        let args = serve_args(&["--identity", "other"]).unwrap_or_else(|e| panic!("{e}"));
        let config = budget_config(&args, &env).unwrap_or_else(|| panic!("budget on"));
        assert_eq!(config.owner, None);
    }
}
