//! The operator's commands against a running cluster: `status` (the queue, the held
//! rollouts, the windows, the leader; `--watch`; `status sts/NAME --wait`) and `release`
//! (the emergency path by hand), `pause`, `resume` and `override` (PacingOverride
//! objects: `pacing`). They read the cluster as kubectl does and need only the
//! rights of manifests/rbac/churn-throttler-operator.yaml. `model`, `sets`, `render` and
//! the patches of `release` are pure; `cluster`, `wait` and the rest of `release` talk to
//! the API server. Also run as a kubectl plugin (`kubectl churn-throttler status`).

pub mod cluster;
pub mod model;
pub mod pacing;
pub mod release;
pub mod render;
pub mod report;
pub mod sets;
pub mod wait;

use clap::{Args, ValueEnum};
use cluster::{connect, Conn, CtlError};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use wait::WaitEnd;

/// Exit codes of `status` and `release` (README, "See the queue").
pub mod exit {
    /// Done: the report printed, the rollout complete, everything asked for released.
    pub const OK: u8 = 0;
    /// Could not do it: no cluster, no rights, churn-throttler not installed, not found,
    /// or (`release`) something asked for was not released. One line on stderr says why.
    pub const ERROR: u8 = 1;
    /// The command line is wrong (clap's code).
    pub const USAGE: u8 = 2;
    /// `--wait`: the timeout passed first.
    pub const TIMEOUT: u8 = 3;
    /// `--wait`: churn-throttler let the rollout go with the partition not at its target.
    pub const LET_GO: u8 = 4;
    /// `--wait`: the StatefulSet was deleted.
    pub const DELETED: u8 = 5;
    /// Interrupted (Ctrl-C).
    pub const INTERRUPTED: u8 = 130;
}

/// Where the cluster is and where churn-throttler lives in it.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Kubeconfig file [default: $KUBECONFIG, else ~/.kube/config, else the pod's service account].
    #[arg(long, env = "CHURN_THROTTLER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context [default: its current context].
    #[arg(long, env = "CHURN_THROTTLER_CONTEXT")]
    pub context: Option<String>,
    /// Namespace [default: the context's].
    #[arg(short = 'n', long, env = "CHURN_THROTTLER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(
        short = 'A',
        long,
        env = "CHURN_THROTTLER_ALL_NAMESPACES",
        conflicts_with = "namespace"
    )]
    pub all_namespaces: bool,
    /// Namespace of churn-throttler's Lease and policy ConfigMap.
    #[arg(
        long,
        env = "CHURN_THROTTLER_LEASE_NAMESPACE",
        default_value = "churn-throttler"
    )]
    pub lease_namespace: String,
    /// Name of the releaser's Lease.
    #[arg(
        long,
        env = "CHURN_THROTTLER_LEASE_NAME",
        default_value = "churn-throttler-releaser"
    )]
    pub lease_name: String,
    /// Longest wait for one API call.
    #[arg(long, env = "CHURN_THROTTLER_REQUEST_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub request_timeout: Duration,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// One StatefulSet: sts/NAME (with --wait: wait for its rollout).
    pub target: Option<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Policy file, instead of the ConfigMap churn-throttler-policy in --lease-namespace.
    #[arg(long, env = "CHURN_THROTTLER_CONFIG")]
    pub config: Option<PathBuf>,
    /// table (for people), json or yaml (for scripts: the schema in the README).
    #[arg(
        short = 'o',
        long,
        env = "CHURN_THROTTLER_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: Output,
    /// Print again every SECONDS (default 2) until Ctrl-C.
    #[arg(short = 'w', long, env = "CHURN_THROTTLER_WATCH", num_args = 0..=1, require_equals = true,
          default_missing_value = "2", value_parser = parse_seconds)]
    pub watch: Option<Duration>,
    /// With sts/NAME: wait until churn-throttler's hold has ended and the rollout is
    /// complete (exit 0), was let go (4), deleted (5), or --timeout passed (3).
    #[arg(long, env = "CHURN_THROTTLER_WAIT", requires = "target")]
    pub wait: bool,
    /// Longest --wait (0: no limit).
    #[arg(long, env = "CHURN_THROTTLER_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Args, Debug, Clone)]
pub struct ReleaseArgs {
    /// pods (with NAMEs, or every gated pod of the namespace) or sts/NAME (sts alone: every
    /// held StatefulSet of the namespace).
    pub what: String,
    /// Pod names (release pods).
    pub names: Vec<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::policy::parse_duration(text)
}

/// Seconds as a bare number ("5"), or a duration ("5s", "1m").
fn parse_seconds(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err("the interval must be at least 1 second".into()),
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => parse_duration(text),
    }
}

/// `sts/NAME` and its spellings; None: not a StatefulSet.
pub fn statefulset_name(target: &str) -> Option<&str> {
    let (kind, name) = target.split_once('/')?;
    let kinds = [
        "sts",
        "statefulset",
        "statefulsets",
        "statefulset.apps",
        "statefulsets.apps",
    ];
    (kinds.contains(&kind.to_ascii_lowercase().as_str()) && !name.is_empty()).then_some(name)
}

fn runtime() -> Result<tokio::runtime::Runtime, CtlError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CtlError::Other(format!("cannot start the runtime: {e}")))
}

/// The namespace a command works in: -A (None), -n, else the context's.
fn namespace_of(args: &ClusterArgs, conn: &Conn) -> Option<String> {
    if args.all_namespaces {
        None
    } else {
        Some(
            args.namespace
                .clone()
                .unwrap_or_else(|| conn.default_namespace.clone()),
        )
    }
}

/// Runs `status`; prints one line on stderr when it cannot.
pub fn status_main(args: &StatusArgs) -> ExitCode {
    let result = runtime().and_then(|rt| {
        rt.block_on(async {
            tokio::select! {
                code = status(args) => code,
                _ = tokio::signal::ctrl_c() => Ok(exit::INTERRUPTED),
            }
        })
    });
    finish("status", result)
}

/// Runs `release`; prints one line on stderr when it cannot.
pub fn release_main(args: &ReleaseArgs) -> ExitCode {
    let result = runtime().and_then(|rt| rt.block_on(release(args)));
    finish("release", result)
}

fn finish(command: &str, result: Result<u8, CtlError>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("churn-throttler {command}: {e}");
            ExitCode::from(exit::ERROR)
        }
    }
}

async fn status(args: &StatusArgs) -> Result<u8, CtlError> {
    let set = match args.target.as_deref() {
        None => None,
        Some(target) => Some(statefulset_name(target).ok_or_else(|| {
            CtlError::Other(format!(
                "{target:?}: the only target is a StatefulSet, sts/NAME"
            ))
        })?),
    };
    let conn = connect(&args.cluster).await?;
    let namespace = namespace_of(&args.cluster, &conn);
    if args.wait {
        let (Some(name), Some(namespace)) = (set, namespace.as_deref()) else {
            return Err(CtlError::Other(
                "--wait needs sts/NAME in one namespace (not -A)".into(),
            ));
        };
        return Ok(
            match wait::wait(&conn, namespace, name, args.timeout).await? {
                WaitEnd::Complete => exit::OK,
                WaitEnd::LetGo { .. } => exit::LET_GO,
                WaitEnd::Deleted => {
                    eprintln!("churn-throttler status: statefulset {namespace}/{name} was deleted");
                    exit::DELETED
                }
                WaitEnd::TimedOut(last) => {
                    eprintln!(
                    "churn-throttler status: timed out after {}s waiting for sts/{name} ({last})",
                    args.timeout.as_secs()
                );
                    exit::TIMEOUT
                }
            },
        );
    }
    let clear =
        args.watch.is_some() && args.output == Output::Table && std::io::stdout().is_terminal();
    loop {
        let read = cluster::read(&conn, &args.cluster, args.config.as_deref()).await?;
        let lease_name = format!(
            "{}/{}",
            args.cluster.lease_namespace, args.cluster.lease_name
        );
        let mut report = model::build(&report::Cluster {
            policy: &read.policy,
            policy_source: &read.policy_source,
            pods: &read.pods,
            sets: &read.sets,
            steps: &read.steps,
            lease: read.lease.as_ref(),
            lease_name: &lease_name,
            namespace: namespace.as_deref(),
            overrides: &read.overrides,
            now: read.now,
        });
        if let Some(note) = &read.overrides_note {
            report.notes.push(note.clone());
        }
        if let Some(name) = set {
            only_statefulset(&mut report, name);
        }
        let text = match args.output {
            Output::Table => render::human(&report),
            Output::Json => serde_json::to_string_pretty(&report)
                .map(|t| t + "\n")
                .map_err(|e| CtlError::Other(e.to_string()))?,
            Output::Yaml => {
                serde_yaml::to_string(&report).map_err(|e| CtlError::Other(e.to_string()))?
            }
        };
        if clear {
            print!("\x1b[2J\x1b[H");
        }
        print!("{text}");
        let Some(every) = args.watch else {
            return Ok(exit::OK);
        };
        if !clear {
            println!();
        }
        tokio::time::sleep(every).await;
    }
}

/// The report of one StatefulSet: its row and its gated pods (NAME-<ordinal>).
fn only_statefulset(report: &mut report::Report, name: &str) {
    report.held_stateful_sets.retain(|s| s.name == name);
    let prefix = format!("{name}-");
    report.gated_pods.retain(|p| {
        p.name
            .strip_prefix(&prefix)
            .is_some_and(|ordinal| ordinal.chars().all(|c| c.is_ascii_digit()))
    });
}

async fn release(args: &ReleaseArgs) -> Result<u8, CtlError> {
    let what = args.what.as_str();
    let set = statefulset_name(what);
    let kind = match (what, set) {
        ("pods" | "pod" | "po", _) => "pods",
        (_, Some(_)) | ("sts" | "statefulset" | "statefulsets", None) => "statefulsets",
        _ => {
            return Err(CtlError::Other(format!(
                "{what:?}: release pods [NAME...] or release sts/NAME (sts alone: every held StatefulSet)"
            )))
        }
    };
    if kind == "statefulsets" && !args.names.is_empty() {
        return Err(CtlError::Other(
            "release sts/NAME takes one StatefulSet; no further names".into(),
        ));
    }
    if args.cluster.all_namespaces && (set.is_some() || !args.names.is_empty()) {
        return Err(CtlError::Other(
            "-A releases everything held; name objects with -n NAMESPACE instead".into(),
        ));
    }
    let conn = connect(&args.cluster).await?;
    let namespace = namespace_of(&args.cluster, &conn);
    let who = conn.who_am_i().await;
    let outcome = if kind == "pods" {
        release::pods(&conn, namespace.as_deref(), &args.names, &who).await?
    } else {
        release::statefulsets(&conn, namespace.as_deref(), set, &who).await?
    };
    let named = set.is_some() || !args.names.is_empty();
    println!(
        "released {}, skipped {}, failed {}",
        outcome.released, outcome.skipped, outcome.failed
    );
    let incomplete = outcome.failed > 0 || (named && outcome.skipped > 0);
    Ok(if incomplete { exit::ERROR } else { exit::OK })
}

#[cfg(test)]
mod tests;
