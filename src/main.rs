//! churn-throttler: parse the command line, set up logging, dispatch.

use churn_throttler::cli::{Cli, Command, LogFormat};
use churn_throttler::policy::{Policy, DEFAULT_POLICY_YAML};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => check_config(&file),
        Command::Simulate(args) => match churn_throttler::simulate::main(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("churn-throttler simulate: {e:#}");
                ExitCode::FAILURE
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
            match runtime.block_on(churn_throttler::serve::run(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("churn-throttler: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn check_config(file: &std::path::Path) -> ExitCode {
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
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == LogFormat::Json {
        builder.json().init();
    } else {
        builder.init();
    }
}
