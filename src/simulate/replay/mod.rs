//! `churn-throttler simulate --replay`: reads kube-apiserver audit logs and shows what the
//! policy would have done to that recorded churn, side by side with what happened.

pub mod attribute;
pub mod audit;
pub mod engine;
pub mod input;
pub mod report;

#[cfg(test)]
mod tests;

use crate::policy::{Policy, DEFAULT_POLICY_YAML};
use attribute::{Attributor, Kind};
use engine::{Engine, Paced};
use input::{Counts, Range, Reader};
use std::io::BufRead;
use std::path::PathBuf;

/// A usage error (the command exits 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Nothing could be replayed (the command exits 1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NothingReplayed(pub String);

/// The audit policy rules the replay needs, at the cheapest level that has them.
pub const AUDIT_POLICY_LINES: &str = "\
  - level: Metadata
    resources:
      - group: \"\"
        resources: [\"pods\", \"pods/binding\", \"pods/eviction\"]
      - group: \"apps\"
        resources: [\"statefulsets\"]
    verbs: [\"create\", \"delete\", \"update\", \"patch\"]";

/// What `--replay` needs besides the files.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub files: Vec<PathBuf>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub policy: Option<PathBuf>,
    pub opt_in: Vec<String>,
}

/// The whole replay: what was read, recorded and paced.
pub struct Replay {
    pub counts: Counts,
    pub attributed: Attributor,
    pub paced: Paced,
    pub policy: Policy,
    pub window: crate::limiter::Millis,
}

pub fn load_policy(path: Option<&PathBuf>) -> Result<Policy, UsageError> {
    match path {
        None => Policy::from_yaml(DEFAULT_POLICY_YAML, "built-in")
            .map_err(|e| UsageError(e.to_string())),
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| UsageError(format!("--policy {}: {e}", p.display())))?;
            Policy::from_yaml(&text, &p.display().to_string())
                .map_err(|e| UsageError(format!("--policy {}: {e}", p.display())))
        }
    }
}

fn parse_time(flag: &str, value: &Option<String>) -> Result<Option<u64>, UsageError> {
    value
        .as_deref()
        .map(|v| {
            audit::parse_rfc3339_ms(v).ok_or_else(|| {
                UsageError(format!(
                    "{flag} {v:?}: expected an RFC 3339 time such as 2026-05-01T10:00:00Z"
                ))
            })
        })
        .transpose()
}

/// Reads the inputs and replays them. Usage errors and "nothing to replay" come back as
/// [`UsageError`] and [`NothingReplayed`].
pub fn run(opts: &Options, inputs: Inputs) -> anyhow::Result<Replay> {
    let policy = load_policy(opts.policy.as_ref())?;
    let range = Range {
        since: parse_time("--since", &opts.since)?,
        until: parse_time("--until", &opts.until)?,
    };
    let mut reader = Reader::new(inputs, range);
    let mut attributed = Attributor::default();
    for request in reader.by_ref() {
        attributed.push(request);
    }
    attributed.finish();
    let counts = reader.counts;
    let pod_events = attributed
        .events
        .iter()
        .filter(|e| e.kind != Kind::PartitionSteps)
        .count();
    if pod_events == 0 {
        let mut why = format!(
            "nothing to replay: {} lines read, no successful pod creation, binding, deletion \
             or eviction among them",
            counts.lines
        );
        if !counts.truncated.is_empty() {
            why += &format!(" ({})", counts.truncated.join("; "));
        }
        why += &format!(
            ".\nThe audit policy must record them; add these lines to its rules \
             (before any rule that drops pods):\n{AUDIT_POLICY_LINES}"
        );
        return Err(NothingReplayed(why).into());
    }
    let window = crate::pacing::gate::longest_window(&policy).max(1);
    let paced = Engine::new(
        &policy,
        &opts.opt_in,
        &attributed.events,
        &attributed.sts_writes,
    )
    .run();
    Ok(Replay {
        counts,
        attributed,
        paced,
        policy,
        window,
    })
}

/// Named inputs, as [`run`] reads them.
pub type Inputs = Vec<(String, Box<dyn BufRead>)>;

/// Opens every file (`-`: stdin, at most once).
pub fn open_all(files: &[PathBuf]) -> Result<Inputs, UsageError> {
    if files.iter().filter(|f| f.as_os_str() == "-").count() > 1 {
        return Err(UsageError(
            "--replay: stdin (-) given more than once".into(),
        ));
    }
    files
        .iter()
        .map(|f| {
            input::open(f)
                .map(|r| (f.display().to_string(), r))
                .map_err(|e| UsageError(format!("--replay {e}")))
        })
        .collect()
}

/// The command: prints the summary and the table, writes CSV and plot when asked.
pub fn main(opts: &Options, csv: Option<&PathBuf>, plot: Option<&PathBuf>) -> anyhow::Result<()> {
    let inputs = open_all(&opts.files)?;
    let started = std::time::Instant::now();
    let replay = run(opts, inputs)?;
    let wall = started.elapsed().as_secs_f64();
    print!("{}", report::text(&replay));
    let mb = replay.counts.bytes as f64 / 1e6;
    println!(
        "read {mb:.1} MB in {wall:.2} s wall: {:.1} MB/s, {:.0} lines/s, {:.0} disruptive requests/s",
        mb / wall.max(1e-9),
        replay.counts.lines as f64 / wall.max(1e-9),
        replay.counts.requests as f64 / wall.max(1e-9)
    );
    let mut rows = report::rows(&replay);
    if let Some(path) = csv {
        // The kinds, then each kind per controller (`starts:StatefulSet`).
        rows.extend(report::rows_by_controller(&replay));
        std::fs::write(path, report::csv(&rows))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = plot {
        report::plot(&replay, path).map_err(anyhow::Error::msg)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
