//! The command line; every flag of `serve` can also come from the environment.

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
    CheckConfig {
        /// The policy YAML file.
        file: PathBuf,
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

impl Default for ConnectionArgs {
    /// The flags' defaults, for embedding `serve` (tests).
    fn default() -> ConnectionArgs {
        ConnectionArgs {
            tls_handshake_timeout: std::time::Duration::from_secs(10),
            header_read_timeout: std::time::Duration::from_secs(10),
            body_read_timeout: std::time::Duration::from_secs(10),
            idle_timeout: std::time::Duration::from_secs(120),
            http2_ping_interval: std::time::Duration::from_secs(30),
            max_connections: 1000,
            max_connections_per_source: None,
            max_metrics_connections: 64,
        }
    }
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

impl BudgetArgs {
    /// Turned off, for embedding `serve` where no cluster is wanted (tests).
    pub fn disabled() -> BudgetArgs {
        BudgetArgs {
            enabled: Some(false),
            max_replicas: 3,
        }
    }
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

impl ReleaserArgs {
    /// Turned off, for embedding `serve` where no cluster is wanted (tests).
    pub fn disabled() -> ReleaserArgs {
        ReleaserArgs {
            enabled: Some(false),
            lease_name: "churn-throttler-releaser".into(),
            lease_namespace: None,
            identity: None,
        }
    }
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
