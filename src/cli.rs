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
    ///
    /// Validates the configuration, declares and checks the queues and
    /// exchanges it names, then consumes the inbound queue and publishes one
    /// confirmed copy of every message to each matching branch, acking it
    /// only when every copy is confirmed and dead-lettering it otherwise.
    /// SIGINT or SIGTERM stops consuming, lets the messages in flight finish
    /// (up to shutdown_timeout_ms) and exits; SIGHUP is logged and changes
    /// nothing. Any configuration key can be overridden from the environment
    /// as SWITCHYARD__SECTION__KEY; RUST_LOG sets the log level (default
    /// info). Logs go to stderr.
    ///
    /// Exit codes: 0 stopped by SIGINT or SIGTERM, 2 invalid configuration
    /// or usage, 1 the broker refused the declared topology or another
    /// failure.
    Run {
        /// Configuration file [default: $SWITCHYARD_CONFIG, then config/switchyard.toml].
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Validate the configuration and print a summary of the routing table.
    ///
    /// Loads the file with its SWITCHYARD__SECTION__KEY environment
    /// overrides and checks every key and reference without connecting to
    /// any broker. Prints the inbound queue, the dead-letter settings, the
    /// brokers (passwords masked) and the filter table, one branch per line
    /// with its priority, filter and endpoint list.
    ///
    /// Exit codes: 0 valid, 2 invalid (one line on stderr names the file, the
    /// key and what is wrong).
    Check {
        /// Configuration file [default: $SWITCHYARD_CONFIG, then config/switchyard.toml].
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
}
