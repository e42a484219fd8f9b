//! The `switchyard` binary: parse the command line, load and validate the
//! configuration before any I/O, then run or report. Exit codes: 0 success,
//! 2 invalid configuration or usage, 1 any other failure.

mod cli;

use clap::Parser;
use cli::{Cli, Command};
use std::process::ExitCode;
use switchyard::config::{self, Settings};

const EXIT_FAILURE: u8 = 1;
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Check { config } => match load(config) {
            Ok((path, settings)) => {
                print!("{}", summary(&path, &settings));
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Run { config } => match load(config) {
            Ok((_, settings)) => run(settings),
            Err(code) => code,
        },
    }
}

fn load(flag: Option<std::path::PathBuf>) -> Result<(std::path::PathBuf, Settings), ExitCode> {
    let path = config::config_path(flag);
    config::load(&path).map(|s| (path, s)).map_err(|e| {
        eprintln!("switchyard: {e}");
        ExitCode::from(EXIT_USAGE)
    })
}

fn summary(path: &std::path::Path, settings: &Settings) -> String {
    let brokers: Vec<String> = settings
        .brokers
        .values()
        .map(|b| format!("{} = {}", b.name, b.redacted_uri()))
        .collect();
    format!(
        "{}: ok\ninbound: {} on {} (prefetch {})\ndead letters: {} via exchange \"{}\" key \"{}\"\nbrokers: {}\nfilter table:\n{}",
        path.display(),
        settings.inbound.queue,
        settings.inbound.broker,
        settings.inbound.prefetch,
        settings.dead_letter.mode,
        settings.dead_letter.exchange,
        settings.dead_letter.routing_key,
        brokers.join(", "),
        settings.routing.summary()
    )
}

fn run(settings: Settings) -> ExitCode {
    init_tracing();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("switchyard: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match runtime.block_on(switchyard::run(settings, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "switchyard stopped");
            eprintln!("switchyard: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
    }
}
