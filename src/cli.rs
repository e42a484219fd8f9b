//! The command line: `run` and `check`, and how logs are written.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Transactional multicast forwarder for RabbitMQ.
#[derive(Debug, Parser)]
#[command(name = "switchyard", version, about)]
pub struct Cli {
    /// How log lines are written to stderr; `RUST_LOG` sets the level (default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The shape of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, fields at the top level.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the forwarder until SIGINT or SIGTERM.
    Run {
        /// Configuration file [default: $SWITCHYARD_CONFIG, then config/switchyard.toml].
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
        /// Exit 1 when a broker refuses the credentials or the vhost at start,
        /// instead of logging it and retrying (for orchestrators that restart).
        #[arg(long)]
        fail_fast: bool,
    },
    /// Validate the configuration and print a summary of the routing table.
    Check {
        /// Configuration file [default: $SWITCHYARD_CONFIG, then config/switchyard.toml].
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
}
