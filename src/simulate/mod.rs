//! `churn-throttler simulate`: a discrete-event simulation of a mass rollout that drives
//! the same pure `decide_churn` and `Limiter` as the server, once per compared action.

mod client;
pub mod model;
pub mod replay;
pub mod report;
mod requests;
mod rng;
pub mod scenario;

#[cfg(test)]
mod tests;

pub use model::{RunResult, Sim};
pub use scenario::{Scenario, ScenarioFile, SimAction, PRESETS};

use crate::policy::Policy;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug, Clone, Default)]
pub struct SimulateArgs {
    /// Built-in scenario: mysql-300, huge-10k or e2e (ignored with --scenario).
    #[arg(long, default_value = "mysql-300")]
    pub preset: String,
    /// Scenario YAML (see docs/simulator.md); flags below override its fields.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// Actions to compare, comma-separated: none,deny,retry-after,hold,gate,partition.
    #[arg(long, value_delimiter = ',')]
    pub actions: Vec<String>,
    #[arg(long)]
    pub statefulsets: Option<u32>,
    #[arg(long)]
    pub replicas: Option<u32>,
    #[arg(long)]
    pub namespaces: Option<u32>,
    #[arg(long)]
    pub deployments: Option<u32>,
    #[arg(long)]
    pub deployment_replicas: Option<u32>,
    /// The limit as events/window, e.g. 20/10s (global scope).
    #[arg(long)]
    pub limit: Option<String>,
    /// Termination delay: 10s, uniform(5s, 15s) or lognormal(10s, 0.3).
    #[arg(long)]
    pub terminate: Option<String>,
    /// Start-to-Ready delay, same forms as --terminate.
    #[arg(long)]
    pub start: Option<String>,
    /// StatefulSet controller workers.
    #[arg(long)]
    pub workers: Option<u32>,
    #[arg(long)]
    pub max_hold: Option<String>,
    #[arg(long)]
    pub max_retry_after: Option<String>,
    /// For gate and partition; 0 for no cap.
    #[arg(long)]
    pub max_not_ready: Option<u32>,
    #[arg(long)]
    pub api_latency: Option<String>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Releasers: model (incremental, fast) or real (the releaser's own pure plans).
    #[arg(long)]
    pub releasers: Option<String>,
    /// deny, retry-after and hold also pace pod creations (a second rule, same limit).
    #[arg(long, conflicts_with = "gate_creates")]
    pub pace_creates: bool,
    /// deny, retry-after and hold pace deletions; pod creations go behind the gate.
    #[arg(long)]
    pub gate_creates: bool,
    /// The network: one FIFO CNI wiring bound pods at this rate, 0.5/s, or changing
    /// over time, 10/s,1/s@60s; --start then runs from network-ready to Ready.
    #[arg(long)]
    pub cni_rate: Option<String>,
    /// With --cni-rate: from wired to network-ready.
    #[arg(long)]
    pub cni_base: Option<String>,
    /// on: the gate and partition rules are adaptive (the shared network window); off:
    /// fixed (maxNotReady only).
    #[arg(long, value_parser = ["on", "off"])]
    pub adaptive: Option<String>,
    /// Leave out the unthrottled StatefulSet.
    #[arg(long)]
    pub no_collateral: bool,
    /// Write the table as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write an SVG plot of events per window over time, one line per action.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print the effective scenario as YAML and the policy of each action, then exit.
    #[arg(long)]
    pub print_scenario: bool,
    /// Replay kube-apiserver audit logs (JSON lines, plain or gzip; - for stdin) through
    /// the policy instead of a scenario (docs/simulator.md, "Replay your audit log").
    #[arg(long, num_args = 1.., value_name = "FILE")]
    pub replay: Vec<PathBuf>,
    /// With --replay: only requests received at or after this RFC 3339 time.
    #[arg(long, requires = "replay")]
    pub since: Option<String>,
    /// With --replay: only requests received before this RFC 3339 time.
    #[arg(long, requires = "replay")]
    pub until: Option<String>,
    /// With --replay: the policy file (default: the built-in policy). Without it: the
    /// file whose schedule windows the simulated rules take (each from the file's first
    /// rule of the same action that has some), with --start-time.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// With --policy and without --replay: the wall time of the simulated clock's zero
    /// (RFC 3339, e.g. 2026-12-14T00:30:00Z), so the policy's schedule windows open and
    /// close when they would from then.
    #[arg(
        long,
        value_name = "TIME",
        requires = "policy",
        conflicts_with = "replay"
    )]
    pub start_time: Option<String>,
    /// With --replay: the namespaces that opt in, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', requires = "replay")]
    pub opt_in: Vec<String>,
}

impl SimulateArgs {
    /// The scenario file (or preset) with the flags applied.
    pub fn scenario_file(&self) -> Result<ScenarioFile, String> {
        let mut f = match &self.scenario {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                ScenarioFile::from_yaml(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
            None => ScenarioFile::preset(&self.preset)?,
        };
        if !self.actions.is_empty() {
            f.actions = self.actions.clone();
        }
        macro_rules! set {
            ($($field:ident),*) => {$(
                if let Some(v) = &self.$field {
                    f.$field = v.clone();
                }
            )*};
        }
        set!(
            statefulsets,
            replicas,
            namespaces,
            deployments,
            deployment_replicas,
            limit,
            terminate,
            start,
            workers,
            max_hold,
            max_retry_after,
            max_not_ready,
            api_latency,
            seed,
            releasers,
            cni_rate,
            cni_base
        );
        if let Some(a) = &self.adaptive {
            f.adaptive = a == "on";
        }
        if self.pace_creates {
            f.pace_creates = true;
            f.gate_creates = false;
        }
        if self.gate_creates {
            f.gate_creates = true;
            f.pace_creates = false;
        }
        if self.no_collateral {
            f.collateral = false;
        }
        Ok(f)
    }
}

/// `--policy FILE --start-time TIME` (without --replay): the file's schedules.
fn schedules(args: &SimulateArgs) -> anyhow::Result<Option<scenario::Schedules>> {
    let Some(path) = &args.policy else {
        return Ok(None);
    };
    let Some(start) = &args.start_time else {
        anyhow::bail!(
            "--policy without --replay takes the policy's schedule windows: give --start-time \
             (RFC 3339, the wall time of the simulated clock's zero)"
        );
    };
    let start = crate::names::parse_time(start).ok_or_else(|| {
        anyhow::anyhow!("--start-time {start:?}: not an RFC 3339 time (e.g. 2026-12-14T00:30:00Z)")
    })?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", path.display()))?;
    let policy = Policy::from_yaml(&text, &path.display().to_string())?;
    Ok(Some(scenario::Schedules { policy, start }))
}

/// Runs every action of the scenario; results in the scenario's action order.
pub fn simulate(sc: &Scenario) -> Result<Vec<RunResult>, String> {
    sc.actions
        .iter()
        .map(|&action| Ok(Sim::new(sc, action)?.run()))
        .collect()
}

/// The command: prints the table, writes CSV and plot when asked.
pub fn main(args: &SimulateArgs) -> anyhow::Result<()> {
    if !args.replay.is_empty() {
        let opts = replay::Options {
            files: args.replay.clone(),
            since: args.since.clone(),
            until: args.until.clone(),
            policy: args.policy.clone(),
            opt_in: args.opt_in.clone(),
        };
        return replay::main(&opts, args.csv.as_ref(), args.plot.as_ref());
    }
    let file = args.scenario_file().map_err(anyhow::Error::msg)?;
    let mut sc = file.build().map_err(anyhow::Error::msg)?;
    sc.schedules = schedules(args)?;
    if args.print_scenario {
        print!("{}", file.to_yaml());
        for action in &sc.actions {
            println!(
                "# policy for {}:\n{}",
                action.as_str(),
                sc.policy_yaml(*action)
            );
        }
        return Ok(());
    }
    println!("{}", describe(&sc));
    let started = Instant::now();
    let runs = simulate(&sc).map_err(anyhow::Error::msg)?;
    let wall = started.elapsed();
    let rows: Vec<report::Row> = runs.iter().map(|r| report::row(&sc, r)).collect();
    print!("{}", report::table(&sc, &rows));
    let events: u64 = runs.iter().map(|r| r.events).sum();
    println!(
        "simulated {} actions in {:.2} s wall ({} events)",
        runs.len(),
        wall.as_secs_f64(),
        events
    );
    if let Some(path) = &args.csv {
        std::fs::write(path, report::csv(&sc, &rows))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        report::plot(&sc, &runs, path).map_err(anyhow::Error::msg)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

pub fn describe(sc: &Scenario) -> String {
    let mut what = format!(
        "scenario {}: {} StatefulSets × {} in {} namespaces",
        sc.file.name, sc.statefulsets, sc.replicas, sc.namespaces
    );
    if sc.deployments > 0 {
        what += &format!(
            ", {} Deployments × {} (maxSurge {}, maxUnavailable {})",
            sc.deployments, sc.deployment_replicas, sc.max_surge, sc.max_unavailable
        );
    }
    if sc.collateral {
        what += &format!(", + 1 unthrottled StatefulSet × {}", sc.collateral_replicas);
    }
    format!(
        "{what}\n  limit {} per {} s, terminate {}, start {}, {} workers, API latency {} ms, \
         client {} qps/{} burst, queue bucket {} qps/{}, seed {}, {} releasers\n  \
         ideal makespan: {} pods / ({} per {} s) = {} s\n",
        sc.events,
        sc.window as f64 / 1000.0,
        sc.terminate,
        sc.start,
        sc.workers,
        sc.api_latency,
        sc.client_qps,
        sc.client_burst,
        sc.queue_qps,
        sc.queue_burst,
        sc.seed,
        if sc.real_releasers { "real" } else { "model" },
        sc.paced_pods(),
        sc.events,
        sc.window as f64 / 1000.0,
        sc.ideal_ms() / 1000
    ) + &match &sc.cni {
        Some(cni) => format!(
            "  network: one FIFO CNI at {}, base {} ms, then start; {} window\n",
            sc.file.cni_rate,
            cni.base,
            if sc.adaptive { "adaptive" } else { "fixed" }
        ),
        None => String::new(),
    }
}
