//! The command line: `run` and `check`.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Transactional multicast forwarder for RabbitMQ.
#[derive(Debug, Parser)]
#[command(name = "switchyard", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the forwarder until SIGINT or SIGTERM.
    Run {
        /// Configuration file [default: $SWITCHYARD_CONFIG, then config/switchyard.toml].
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Validate the configuration and print a summary of the routing table.
    Check {
        /// Configuration file [default: $SWITCHYARD_CONFIG, then config/switchyard.toml].
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
}
