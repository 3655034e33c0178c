//! `serve`: wires the shells together and runs them until SIGTERM or SIGINT.

use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::server::reload::{self, CertFiles};
use crate::server::state::AppState;
use crate::server::{self, certgen, tls};
use crate::shared::{now_millis, KubeClient};
use anyhow::{bail, Context};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// What `serve` runs with, in plain values: built from the command line by `cli.rs`, or by
/// an embedder (`demo`, tests) from [`Config::loopback`].
#[derive(Debug, Clone)]
pub struct Config {
    /// The policy file; None: the built-in policy.
    pub policy_file: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Clients must present a certificate this CA bundle signed.
    pub client_ca: Option<PathBuf>,
    pub listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    /// Development mode: a throw-away CA and certificate in `dev_dir`, loopback only.
    pub dev: bool,
    pub dev_dir: PathBuf,
    /// The pod cache: Some(false) off, Some(true) required, None as the mode allows.
    pub pod_cache: Option<bool>,
    pub reload_interval: Duration,
    pub shutdown_delay: Duration,
    pub drain_timeout: Duration,
    pub max_body_bytes: usize,
    pub connections: Connections,
    /// None: no releaser in this process.
    pub releaser: Option<crate::releaser::Config>,
    /// None: no global budget (every limit enforced whole).
    pub budget: Option<crate::budget::lease::Config>,
}

impl Config {
    /// Both ports on 127.0.0.1 (ephemeral), the flags' defaults otherwise, and nothing
    /// that looks for a cluster (no pod cache, releaser or budget).
    pub fn loopback() -> Config {
        Config {
            policy_file: None,
            tls_cert: None,
            tls_key: None,
            client_ca: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            dev: false,
            dev_dir: PathBuf::from(".churn-throttler-dev"),
            pod_cache: Some(false),
            reload_interval: Duration::from_secs(2),
            shutdown_delay: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(15),
            max_body_bytes: 7 * 1024 * 1024,
            connections: Connections::default(),
            releaser: None,
            budget: None,
        }
    }
}

/// Timeouts and caps of the connections on both ports (docs/operations.md, "Hostile
/// and broken clients").
#[derive(Debug, Clone)]
pub struct Connections {
    pub tls_handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub http2_ping_interval: Duration,
    pub max_connections: u32,
    /// None: a quarter of `max_connections`.
    pub max_connections_per_source: Option<u32>,
    pub max_metrics_connections: u32,
}

impl Default for Connections {
    /// The flags' defaults.
    fn default() -> Connections {
        Connections {
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            http2_ping_interval: Duration::from_secs(30),
            max_connections: 1000,
            max_connections_per_source: None,
            max_metrics_connections: 64,
        }
    }
}

pub async fn run(args: Config) -> anyhow::Result<()> {
    let dev = args.dev;
    let dev_dir = args.dev_dir.clone();
    let running = start(args).await?;
    if dev {
        print_dev_help(&dev_dir, running.tls_addr, running.metrics_addr);
    }
    wait_for_signal(&running.reload_now).await;
    running.shutdown().await;
    Ok(())
}

/// A started server: its bound addresses and what is needed to stop it.
pub struct Running {
    pub tls_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub state: Arc<AppState>,
    /// Wakes the reloader: what SIGHUP does.
    pub reload_now: Arc<tokio::sync::Notify>,
    stop: watch::Sender<bool>,
    tasks: tokio::task::JoinSet<()>,
    shutdown_delay: Duration,
}

impl Running {
    /// Not-ready first, so endpoints stop sending while requests still get answers;
    /// then stop accepting and drain.
    pub async fn shutdown(mut self) {
        self.state.begin_shutdown();
        tracing::info!(delay = ?self.shutdown_delay, "shutting down: not ready, draining after the delay");
        tokio::time::sleep(self.shutdown_delay).await;
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
        tracing::info!("stopped");
    }
}

/// Loads everything, binds both listeners and starts serving; errors say what is wrong.
pub async fn start(mut args: Config) -> anyhow::Result<Running> {
    if args.dev {
        prepare_dev(&mut args)?;
    }
    let (policy, policy_source, policy_file) = load_policy(args.policy_file.as_deref())?;
    let hold_bound = hold_bound(&args, &policy, &policy_source)?;
    let tls = load_tls(&args)?;

    let metrics = Arc::new(Metrics::new());
    let state = AppState::new(policy, metrics.clone(), args.max_body_bytes);
    state.set_body_read_timeout(args.connections.body_read_timeout);
    state.set_hold_bound(hold_bound);
    let reload_now = Arc::new(tokio::sync::Notify::new());
    let (stop, stop_rx) = watch::channel(false);

    let metrics_listener = server::bind(args.metrics_listen, "metrics").await?;
    let tls_listener = server::bind(args.listen, "admission (HTTPS)").await?;
    let tls_addr = tls_listener.local_addr()?;
    let metrics_addr = metrics_listener.local_addr()?;

    let mut tasks = tokio::task::JoinSet::new();
    let (admission_limits, metrics_limits) = connection_limits(&args.connections);
    tracing::info!(
        admission = admission_limits.max_connections,
        admission_per_source = admission_limits.max_per_source,
        metrics = metrics_limits.max_connections,
        metrics_per_source = metrics_limits.max_per_source,
        "open connections capped per port"
    );
    tasks.spawn(server::conn::serve(
        tls_listener,
        Some(TlsAcceptor::from(tls.config)),
        server::admission_router(state.clone()),
        metrics.clone(),
        admission_limits,
        stop_rx.clone(),
        args.drain_timeout,
    ));
    tasks.spawn(server::conn::serve(
        metrics_listener,
        None,
        server::metrics_router(state.clone()),
        metrics.clone(),
        metrics_limits,
        stop_rx.clone(),
        Duration::from_secs(1),
    ));
    tasks.spawn(reload::poll(
        state.clone(),
        Some((
            CertFiles {
                cert: tls.cert_path,
                key: tls.key_path,
                target: tls.cert,
            },
            tls.pair,
        )),
        policy_file,
        args.reload_interval,
        reload_now.clone(),
        stop_rx.clone(),
    ));
    tasks.spawn(sweep_loop(state.clone(), stop_rx.clone()));
    spawn_cluster_shells(&mut tasks, &args, &state, &stop_rx);
    state.set_tls_up();
    tracing::info!(%tls_addr, %metrics_addr, policy = %policy_source, "churn-throttler serving");
    Ok(Running {
        tls_addr,
        metrics_addr,
        state,
        reload_now,
        stop,
        tasks,
        shutdown_delay: args.shutdown_delay,
    })
}

/// The shells that need the API server, sharing one client: the pod cache, the
/// releaser and the global budget's Lease, each as its flags say.
fn spawn_cluster_shells(
    tasks: &mut tokio::task::JoinSet<()>,
    args: &Config,
    state: &Arc<AppState>,
    stop_rx: &watch::Receiver<bool>,
) {
    let kube = Arc::new(KubeClient::default());
    match args.pod_cache {
        Some(false) => tracing::info!(
            "pod cache off (--pod-cache=false): every pod DELETE and eviction is charged, whether the pod exists or not"
        ),
        // --dev without the flag: only if a configuration is found, without retrying.
        wanted => {
            tasks.spawn(server::pod_watch::run(
                state.clone(),
                kube.clone(),
                args.dev && wanted.is_none(),
                stop_rx.clone(),
            ));
        }
    }
    match &args.releaser {
        Some(config) => {
            state.set_releaser_starting();
            let ctx = crate::releaser::Context {
                policy: state.policy_cell(),
                limiter: state.limiter_cell(),
                role: state.releaser_role(),
                queue: state.queue_cell(),
                metrics: state.metrics.releaser_parts(),
                instance: state.instance.clone(),
                kube: kube.clone(),
            };
            tasks.spawn(crate::releaser::run(
                config.clone(),
                Arc::new(ctx),
                stop_rx.clone(),
            ));
        }
        None => tracing::info!("gate releaser off (--releaser=false, or --dev)"),
    }
    // Pauses and overrides, in churn-throttler's own namespace (the Leases' namespace).
    let namespace = args
        .releaser
        .as_ref()
        .map(|c| c.lease.namespace.clone())
        .or_else(|| args.budget.as_ref().map(|c| c.namespace.clone()))
        .unwrap_or_else(|| {
            crate::election::default_namespace(None, std::env::var("POD_NAMESPACE").ok().as_deref())
        });
    // Wherever this process talks to a cluster for anything else (not `--dev` alone, which
    // looks for one only once, for the pod cache).
    let in_cluster = args.releaser.is_some()
        || args.budget.is_some()
        || args.pod_cache == Some(true)
        || (args.pod_cache.is_none() && !args.dev);
    if in_cluster {
        tasks.spawn(crate::overrides_watch::run(
            crate::overrides_watch::Context {
                policy: state.policy_cell(),
                role: state.releaser_role(),
                kube: kube.clone(),
                namespace,
                notes: args.releaser.as_ref().map(|c| c.lease.notes.clone()),
                metrics: state.metrics.overrides.clone(),
                identity: state.instance.clone(),
            },
            stop_rx.clone(),
        ));
    }
    match &args.budget {
        Some(config) => {
            state.enable_budget(config.max_replicas, config.duration);
            let ctx = crate::budget::lease::Context {
                budget: state.budget_cell(),
                policy: state.policy_cell(),
                metrics: state.metrics.budget.clone(),
                kube: kube.clone(),
            };
            tasks.spawn(crate::budget::lease::run(
                config.clone(),
                Arc::new(ctx),
                stop_rx.clone(),
            ));
        }
        None => tracing::info!(
            "global budget off (--replica-budget=false, or --dev): this replica enforces every limit whole"
        ),
    }
}

/// How long a request may be held: the drain must outlast the longest hold, or a
/// graceful stop could not answer every held request.
fn hold_bound(args: &Config, policy: &Policy, source: &str) -> anyhow::Result<Duration> {
    let bound = args.drain_timeout.saturating_sub(HOLD_ANSWER_MARGIN);
    let longest = crate::server::state::longest_hold(policy);
    if longest > bound {
        bail!(
            "--drain-timeout {:?} is too short: the policy ({source}) can hold a request for {longest:?}, \
             and a graceful stop answers every held request only if the drain lasts at least the longest hold \
             plus {HOLD_ANSWER_MARGIN:?}; set --drain-timeout to {:?} or more, or lower the rules' maxHold",
            args.drain_timeout,
            longest + HOLD_ANSWER_MARGIN,
        );
    }
    Ok(bound)
}

/// The serving certificate and the TLS configuration built on it, as read at start.
struct Tls {
    cert_path: PathBuf,
    key_path: PathBuf,
    pair: tls::PemPair,
    cert: Arc<tls::SwappableCert>,
    config: Arc<rustls::ServerConfig>,
}

fn load_tls(args: &Config) -> anyhow::Result<Tls> {
    let (cert_path, key_path) = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => bail!("serve needs --tls-cert and --tls-key (or --dev for a self-signed localhost certificate)"),
    };
    let pair = tls::read_pair(&cert_path, &key_path)?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let key = tls::certified_key(&pair, &cert_path, &key_path, now)?;
    let cert = tls::SwappableCert::new(key);
    let client_ca = match &args.client_ca {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("cannot read --client-ca {}", path.display()))?,
        ),
        None => None,
    };
    let config = tls::server_config(cert.clone(), client_ca.as_deref())?;
    Ok(Tls {
        cert_path,
        key_path,
        pair,
        cert,
        config,
    })
}

/// Time left after the longest hold for its answer to be written before the drain ends.
const HOLD_ANSWER_MARGIN: Duration = Duration::from_secs(1);

/// File descriptors kept free of both ports' caps: listeners, API clients, files, logs.
const RESERVED_FDS: usize = 64;

/// Both ports' limits from the flags; the admission port's cap is lowered to fit the
/// open-file limit with the metrics port's cap and a reserve left over, so that a full
/// admission port never leaves the probes without a descriptor.
fn connection_limits(args: &Connections) -> (server::conn::Limits, server::conn::Limits) {
    let metrics_cap = args.max_metrics_connections as usize;
    let mut admission_cap = args.max_connections as usize;
    if let Some(files) = server::conn::open_file_limit() {
        let room = files.saturating_sub(metrics_cap + RESERVED_FDS).max(1);
        if room < admission_cap {
            tracing::warn!(
                "the open-file limit is {files}: admission connections capped at {room} \
                 (--max-connections {admission_cap}), {metrics_cap} kept for the metrics port"
            );
            admission_cap = room;
        }
    }
    let admission = server::conn::Limits {
        handshake: args.tls_handshake_timeout,
        header_read: args.header_read_timeout,
        idle: args.idle_timeout,
        http2_ping: args.http2_ping_interval,
        max_connections: admission_cap,
        max_per_source: args
            .max_connections_per_source
            .map_or(server::conn::per_source_default(admission_cap), |n| {
                n as usize
            })
            .min(admission_cap),
    };
    let metrics = server::conn::Limits {
        max_connections: metrics_cap,
        max_per_source: server::conn::per_source_default(metrics_cap),
        ..admission
    };
    (admission, metrics)
}

/// The policy file as read once: the policy, where it came from, and the bytes the
/// reloader compares later reads with (None for the built-in policy).
type LoadedPolicy = (Policy, String, Option<(PathBuf, Vec<u8>)>);

fn load_policy(path: Option<&Path>) -> anyhow::Result<LoadedPolicy> {
    match path {
        Some(path) => {
            let bytes = std::fs::read(path)
                .with_context(|| format!("cannot read policy {}", path.display()))?;
            let text = std::str::from_utf8(&bytes)
                .with_context(|| format!("policy {} is not UTF-8 text", path.display()))?;
            let policy = Policy::from_yaml(text, &path.display().to_string())?;
            Ok((
                policy,
                path.display().to_string(),
                Some((path.to_path_buf(), bytes)),
            ))
        }
        None => Ok((Policy::builtin(), "built-in default".to_string(), None)),
    }
}

async fn sweep_loop(state: Arc<AppState>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = ticker.tick() => state.sweep(now_millis()),
            _ = crate::shared::stopped(&mut shutdown) => return,
        }
    }
}

/// Until SIGTERM or SIGINT. SIGHUP (whose default action would end the process) re-reads
/// the certificate and policy files at once and serving goes on.
async fn wait_for_signal(reload_now: &tokio::sync::Notify) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(hangup) => Some(hangup),
            Err(e) => {
                tracing::warn!("cannot handle SIGHUP: {e}");
                None
            }
        };
        let mut term = match signal(SignalKind::terminate()) {
            Ok(term) => Some(term),
            Err(e) => {
                tracing::warn!("cannot handle SIGTERM: {e}");
                None
            }
        };
        loop {
            tokio::select! {
                Some(()) = async { hangup.as_mut()?.recv().await } => {
                    tracing::info!("SIGHUP: re-reading the certificate and policy files");
                    reload_now.notify_one();
                }
                Some(()) = async { term.as_mut()?.recv().await } => return,
                _ = tokio::signal::ctrl_c() => return,
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = reload_now;
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// --dev: a fresh CA and localhost certificate, loopback addresses, a sample review.
fn prepare_dev(args: &mut Config) -> anyhow::Result<()> {
    let dir = &args.dev_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let ca = certgen::new_ca("churn-throttler dev CA")?;
    let serving = certgen::issue_serving(
        &ca,
        &["localhost", "127.0.0.1"],
        time::Duration::hours(-1),
        time::Duration::days(30),
    )?;
    let write = |name: &str, content: &str, private: bool| -> anyhow::Result<PathBuf> {
        let path = dir.join(name);
        write_file(&path, content.as_bytes(), private)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    };
    write("ca.crt", &ca.cert_pem, false)?;
    args.tls_cert = Some(write("tls.crt", &serving.cert_pem, false)?);
    args.tls_key = Some(write("tls.key", &serving.key_pem, true)?);
    // A running pod DELETE by the ReplicaSet controller, which the default policy paces.
    // Repeats of it name the same pod, whose admitted deletion is not charged again:
    // `demo` shows the pacing with distinct pods.
    let sample = serde_json::to_string_pretty(&crate::sample::pod_delete_review())?;
    write("sample-review.json", &sample, false)?;
    let loopback = |addr: SocketAddr, default_port: u16| {
        if addr.ip().is_unspecified() {
            SocketAddr::from((
                [127, 0, 0, 1],
                if addr.port() == 0 {
                    default_port
                } else {
                    addr.port()
                },
            ))
        } else {
            addr
        }
    };
    args.listen = loopback(args.listen, 8443);
    args.metrics_listen = loopback(args.metrics_listen, 9090);
    if args.shutdown_delay > Duration::from_secs(1) {
        args.shutdown_delay = Duration::from_millis(200);
    }
    Ok(())
}

/// Writes `content` to `path`; a private file (a key) is readable by its owner only
/// (0600), also when it already existed with a wider mode.
fn write_file(path: &Path, content: &[u8], private: bool) -> std::io::Result<()> {
    #[cfg(unix)]
    if private {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        // `mode` applies to new files only: narrow an older one before writing the key.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        return file.write_all(content);
    }
    let _ = private;
    std::fs::write(path, content)
}

fn print_dev_help(dir: &Path, tls: SocketAddr, metrics: SocketAddr) {
    let ca = dir.join("ca.crt");
    let sample = dir.join("sample-review.json");
    println!("churn-throttler --dev: CA written to {}", ca.display());
    println!("Send a sample review (a ReplicaSet controller deleting a running pod):");
    println!(
        "  curl --cacert {} -H 'Content-Type: application/json' --data @{} https://localhost:{}/validate",
        ca.display(),
        sample.display(),
        tls.port()
    );
    println!("Metrics: curl http://{metrics}/metrics    Readiness: curl http://{metrics}/readyz");
    // Repeating the curl line repeats one pod's deletion, charged once: it shows no pacing.
    println!("To see the pacing (20 per 10 s, spaced): churn-throttler demo (its own webhook, distinct pods, stops by itself)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn private_files_are_written_0600_even_over_a_wider_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let key = dir.path().join("tls.key");
        std::fs::write(&key, "old").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644))
            .unwrap_or_else(|e| panic!("{e}"));
        write_file(&key, b"secret", true).unwrap_or_else(|e| panic!("{e}"));
        let mode = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| m.permissions().mode() & 0o777)
                .unwrap_or(0)
        };
        assert_eq!(mode(&key), 0o600);
        assert_eq!(std::fs::read(&key).unwrap_or_default(), b"secret");
        let fresh = dir.path().join("new.key");
        write_file(&fresh, b"k", true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(mode(&fresh), 0o600);
    }
}
