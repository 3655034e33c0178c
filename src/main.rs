//! churn-throttler: parse the command line, set up logging, dispatch.

use churn_throttler::cli::{Cli, Command, LogFormat};
use churn_throttler::pacing::schedule;
use churn_throttler::policy::{Policy, DEFAULT_POLICY_YAML};
use clap::{CommandFactory, FromArgMatches};
use std::process::ExitCode;

/// The file name kubectl's plugin lookup runs for `kubectl churn-throttler` (a dash in a
/// plugin's command is an underscore in its file name).
const KUBECTL_PLUGIN: &str = "kubectl-churn_throttler";

/// The command line; run as a kubectl plugin, help and errors name `kubectl churn-throttler`.
fn parse() -> Cli {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let plugin = std::path::Path::new(&argv0)
        .file_name()
        .is_some_and(|name| name.to_string_lossy().ends_with(KUBECTL_PLUGIN));
    let mut command = Cli::command();
    if plugin {
        command = command.bin_name("kubectl churn-throttler");
    }
    let matches = command.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> ExitCode {
    let cli = parse();
    match cli.command {
        Command::Status(args) => churn_throttler::ctl::status_main(&args),
        Command::Release(args) => churn_throttler::ctl::release_main(&args),
        Command::Pause(args) => churn_throttler::ctl::pacing::pause_main(&args),
        Command::Resume(args) => churn_throttler::ctl::pacing::resume_main(&args),
        Command::Override(args) => churn_throttler::ctl::pacing::override_main(&args),
        Command::CheckConfig { file, at } => check_config(&file, at.as_deref()),
        Command::Simulate(args) => match churn_throttler::simulate::main(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("churn-throttler simulate: {e:#}");
                // --replay: 2 for a usage error, 1 when nothing could be replayed.
                if e.is::<churn_throttler::simulate::replay::UsageError>() {
                    ExitCode::from(2)
                } else {
                    ExitCode::FAILURE
                }
            }
        },
        Command::Demo(args) => match churn_throttler::demo::main(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("churn-throttler demo: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::DefaultPolicy => {
            print!("{DEFAULT_POLICY_YAML}");
            ExitCode::SUCCESS
        }
        Command::Serve(args) => {
            init_logging(args.log_format);
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("churn-throttler: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(churn_throttler::serve::run(args.into_config())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("churn-throttler: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn check_config(file: &std::path::Path, at: Option<&str>) -> ExitCode {
    let now = match at {
        None => churn_throttler::shared::now_millis(),
        Some(text) => match churn_throttler::names::parse_time(text) {
            Some(t) => t,
            None => {
                eprintln!("--at {text:?}: not an RFC 3339 time (e.g. 2026-12-07T00:00:00Z)");
                return ExitCode::FAILURE;
            }
        },
    };
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{}: cannot read: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    match Policy::from_yaml(&text, &file.display().to_string()) {
        Ok(policy) => {
            println!("{}: ok, {} rules", file.display(), policy.rules.len());
            for rule in &policy.rules {
                let limits: Vec<String> = rule.limits.iter().map(|l| l.to_string()).collect();
                println!(
                    "  {}: {} at {}",
                    rule.name,
                    rule.action.as_str(),
                    limits.join(" and ")
                );
            }
            let (lines, warnings) = schedule::describe(&policy, now, 10);
            for line in lines {
                println!("{line}");
            }
            for warning in warnings {
                eprintln!("{}: warning: {warning}", file.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    churn_throttler::server::logs::init(format == LogFormat::Json);
}
