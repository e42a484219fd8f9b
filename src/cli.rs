//! The command line: `run`, `check`, `dlq inspect` / `dlq redrive`,
//! `trace`, `ctl`, and how logs are written.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use switchyard::dlq::{DlqError, Format, Request, Selection};

/// Transactional multicast forwarder for RabbitMQ: peek-lock consume, filter
/// table, confirmed multicast, backup lists, dead letters.
///
/// `run` consumes the inbound queue and, with an [ingress.http] table, also
/// takes messages over HTTP as POST /messages/{routing_key}, through the
/// same filter table. With [admin] listen set it serves /healthz, /readyz
/// and /metrics. It reloads the configuration on SIGHUP or a change of the
/// file. `check` validates a configuration; `dlq` lists or redrives dead
/// letters; `trace` shows what happened to one message; `ctl` pauses,
/// drains and registers through a running forwarder's admin endpoint.
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
    ///
    /// Validates the configuration, declares and checks the queues and
    /// exchanges it names, then consumes the inbound queue and publishes one
    /// confirmed copy of every message to each matching branch, acking it
    /// only when every copy is confirmed and dead-lettering it otherwise.
    /// SIGINT or SIGTERM stops consuming, lets the messages in flight finish
    /// (up to shutdown_timeout_ms) and exits 0. SIGHUP, or a change of the
    /// file on disk, reloads the configuration: a valid one routes every
    /// message consumed from then on, an invalid one is logged and changes
    /// nothing; the process never exits on SIGHUP ([admin] listen and
    /// [ingress.http] keep their values until the next start).
    ///
    /// With an [ingress.http] table it also takes messages over HTTP as
    /// POST /messages/{routing_key}: each goes through the same filter table
    /// and the answer says what happened to its branches. With [admin]
    /// listen set it serves /healthz, /readyz and /metrics on that address.
    ///
    /// Any configuration key can be overridden from the environment as
    /// SWITCHYARD__SECTION__KEY; RUST_LOG sets the log level (default info).
    /// Logs go to stderr.
    ///
    /// Exit codes: 0 stopped by SIGINT or SIGTERM, 2 invalid configuration
    /// or usage, 1 the broker refused the declared topology or another
    /// failure.
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
    ///
    /// Loads the file with its SWITCHYARD__SECTION__KEY environment
    /// overrides and checks every key and reference without connecting to
    /// any broker. Prints the inbound queue, the dead-letter settings (and
    /// for a quorum inbound queue the delivery limit it needs, with the
    /// policy that sets it), the brokers (passwords masked), the admin
    /// address, sessions, the HTTP ingress and the filter table, one branch
    /// per line with its priority, filter and endpoint list. An unknown key
    /// is named with the nearest valid one.
    ///
    /// Exit codes: 0 valid, 2 invalid (one line on stderr names the file, the
    /// key and what is wrong).
    Check {
        /// Configuration file [default: $SWITCHYARD_CONFIG, then config/switchyard.toml].
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Look at or redrive the dead-letter queue (dead_letter.queue on the inbound broker).
    #[command(subcommand)]
    Dlq(Dlq),
    /// Show what happened to one message, from the journal.
    ///
    /// Reads the journal stream ([journal] stream, on its broker) from
    /// --since ago up to its end when the command started, and prints every
    /// record whose message id or copy id is MESSAGE_ID, from every instance
    /// that writes the stream, oldest first: when it was received and
    /// settled, by which instance, from where (queue, http, redrive), the
    /// verdict (acked, dead-lettered with its reason, requeued, the HTTP
    /// answer), the trace id, and each branch with its attempts (time,
    /// endpoint, outcome, reply code, how long it was held, replays). The
    /// stream is only read, never written. A line of the journal that names
    /// the id but is not a record is skipped, and counted on stderr.
    ///
    /// Exit codes: 0 found, 3 nothing found in the window read (stderr names
    /// the id, the stream and the window), 2 invalid configuration or usage,
    /// 1 the broker could not be reached or the stream read.
    Trace {
        /// The message_id, or a copy id (BRANCH:MESSAGE_ID), to look for.
        #[arg(value_name = "MESSAGE_ID")]
        message_id: String,
        /// Configuration file [default: $SWITCHYARD_CONFIG, then config/switchyard.toml].
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
        /// How far back to read: a duration (30s, 90m, 24h, 7d) or an RFC 3339 time.
        #[arg(long, value_name = "DURATION|RFC3339", default_value = "24h")]
        since: String,
        /// Print one JSON object per record (as the journal stores it) instead of a timeline.
        #[arg(long)]
        json: bool,
    },
    /// Steer a running forwarder's group through its admin endpoint.
    ///
    /// Sends one command to /control or /registry on the admin endpoint
    /// (--admin, else admin.listen of the configuration) with a bearer
    /// token (--token, else $SWITCHYARD_ADMIN_TOKEN, else the first of
    /// admin.tokens). A command taken by one instance applies to every
    /// instance of its group (same name, same inbound broker), and the
    /// answer comes once the instance asked has applied it.
    ///
    /// Exit codes: 0 done, 2 invalid configuration or usage, 1 the admin
    /// endpoint could not be reached or refused the command (its reason is
    /// printed).
    Ctl {
        /// Where and how to send it.
        #[command(flatten)]
        target: CtlTarget,
        /// The command.
        #[command(subcommand)]
        command: CtlCommand,
    },
}

/// Where `ctl` sends its command, and how it prints the answer.
#[derive(Debug, Args)]
pub struct CtlTarget {
    /// Configuration file [default: $SWITCHYARD_CONFIG, then config/switchyard.toml];
    /// read for admin.listen and admin.tokens when --admin or the token is not given.
    #[arg(long, value_name = "PATH", global = true)]
    pub config: Option<PathBuf>,
    /// The admin endpoint, as host:port or http://host:port.
    #[arg(long, value_name = "URL", global = true)]
    pub admin: Option<String>,
    /// A bearer token of admin.tokens [default: $SWITCHYARD_ADMIN_TOKEN].
    #[arg(long, value_name = "T", global = true)]
    pub token: Option<String>,
    /// Print the server's JSON answer instead of lines for a person.
    #[arg(long, global = true)]
    pub json: bool,
}

/// The `ctl` commands.
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Show the group's state: paused or not, each endpoint's state (up,
    /// down, drained), registrations and their expiry, the instances.
    Status,
    /// Stop taking new messages (work in flight finishes); the HTTP
    /// ingress answers 503 meanwhile.
    Pause,
    /// Take new messages again.
    Resume,
    /// Skip an endpoint in every list, without failing it, until undrained.
    Drain {
        /// The endpoint's name (configured, or a registered instance's).
        endpoint: String,
    },
    /// Send traffic to a drained endpoint again.
    Undrain {
        /// The endpoint's name.
        endpoint: String,
    },
    /// Register a service instance into a registrable branch (again
    /// within the lease, to renew it).
    Register {
        /// The branch (its [[filter_table]] entry has registrable = true).
        branch: String,
        /// The instance's name, unique in the group.
        name: String,
        /// The routing key its copies are published with.
        #[arg(long, value_name = "K")]
        routing_key: String,
        /// The exchange [default: "", the default exchange].
        #[arg(long, value_name = "E", default_value = "")]
        exchange: String,
        /// A key of [brokers] [default: the inbound broker].
        #[arg(long, value_name = "B")]
        broker: Option<String>,
        /// The lease, 1s to 1h: it lapses unless renewed within it.
        #[arg(long, value_name = "DURATION", default_value = "30s")]
        ttl: String,
    },
    /// Unregister a service instance at once.
    Unregister {
        /// The branch.
        branch: String,
        /// The instance's name.
        name: String,
    },
}

impl CtlCommand {
    /// The request to send; a bad `--ttl` is a usage error.
    pub fn ask(&self) -> Result<switchyard::ctl::Ask, String> {
        use switchyard::ctl::Ask;
        Ok(match self {
            Self::Status => Ask::Status,
            Self::Pause => Ask::Pause,
            Self::Resume => Ask::Resume,
            Self::Drain { endpoint } => Ask::Drain(endpoint.clone()),
            Self::Undrain { endpoint } => Ask::Undrain(endpoint.clone()),
            Self::Register {
                branch,
                name,
                routing_key,
                exchange,
                broker,
                ttl,
            } => Ask::Register {
                branch: branch.clone(),
                name: name.clone(),
                routing_key: routing_key.clone(),
                exchange: exchange.clone(),
                broker: broker.clone(),
                ttl: switchyard::duration::parse_duration(ttl)
                    .map_err(|e| format!("--ttl {ttl}: {e}"))?,
            },
            Self::Unregister { branch, name } => Ask::Unregister {
                branch: branch.clone(),
                name: name.clone(),
            },
        })
    }
}

/// The `dlq` commands.
#[derive(Debug, Subcommand)]
pub enum Dlq {
    /// List dead letters without removing or reordering them.
    ///
    /// Shows, in queue order, each dead letter's message_id, reason, failed
    /// branches (with the endpoint that refused last and the error),
    /// delivered branches, source queue, age and the first bytes of the
    /// body; for a dead letter only the broker annotated (nack mode), its
    /// x-death entries. Every message read is handed back to the queue in
    /// its original position.
    ///
    /// Exit codes: 0 listed, 2 invalid configuration or usage, 1 the broker
    /// could not be reached or the queue read.
    Inspect {
        /// Which dead letters.
        #[command(flatten)]
        select: Select,
        /// At most N dead letters [default: 100].
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
        /// Print one JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Move dead letters back to the inbound queue.
    ///
    /// Each copy is confirmed on the inbound queue before its dead letter is
    /// removed, with x-switchyard-only set to the branches it failed on, so
    /// branches it already reached get no duplicate. Killed midway it loses
    /// nothing; at most the message in hand is duplicated.
    ///
    /// Exit codes: 0 redriven, 2 invalid configuration or usage, 1 the
    /// broker could not be reached, refused a copy, or the redrive was
    /// interrupted.
    Redrive {
        /// Which dead letters.
        #[command(flatten)]
        select: Select,
        /// At most N dead letters [default: all].
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
        /// Print what would be redriven and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// The configuration and filters every `dlq` command takes.
#[derive(Debug, Args)]
pub struct Select {
    /// Configuration file [default: $SWITCHYARD_CONFIG, then config/switchyard.toml].
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Only dead letters with this reason (exhausted, no-route, rejected, poison, loop,
    /// malformed, ..., or x-death:REASON for one only the broker annotated); repeatable.
    #[arg(long, value_name = "REASON")]
    pub reason: Vec<String>,
    /// Only the dead letter(s) with this message_id.
    #[arg(long, value_name = "ID")]
    pub message_id: Option<String>,
    /// Only dead letters dead-lettered within this long, e.g. 10m, 2h, 1d, 1h30m.
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
}

impl Dlq {
    /// The filters of either command.
    pub fn select(&self) -> &Select {
        match self {
            Self::Inspect { select, .. } | Self::Redrive { select, .. } => select,
        }
    }

    /// `--limit`, whose default each command applies itself.
    fn limit(&self) -> Option<u64> {
        match self {
            Self::Inspect { limit, .. } | Self::Redrive { limit, .. } => *limit,
        }
    }

    /// The command with its values checked (a bad `--since` is a usage error).
    pub fn request(&self) -> Result<Request, DlqError> {
        let s = self.select();
        let selection = Selection::new(
            self.limit(),
            s.reason.clone(),
            s.message_id.clone(),
            s.since.as_deref(),
        )?;
        Ok(match self {
            Self::Inspect { json: true, .. } => Request::Inspect(selection, Format::Json),
            Self::Inspect { json: false, .. } => Request::Inspect(selection, Format::Table),
            Self::Redrive { dry_run, .. } => Request::Redrive(selection, *dry_run),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(args: &[&str]) -> Request {
        let cli = match Cli::try_parse_from(args) {
            Ok(cli) => cli,
            Err(e) => panic!("{args:?}: {e}"),
        };
        let Command::Dlq(dlq) = cli.command else {
            panic!("{args:?} is not a dlq command");
        };
        match dlq.request() {
            Ok(request) => request,
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    fn limit(request: &Request) -> Option<u64> {
        match request {
            Request::Inspect(selection, _) | Request::Redrive(selection, _) => selection.limit,
        }
    }

    #[test]
    fn each_dlq_command_hands_its_limit_to_the_selection() {
        for command in ["inspect", "redrive"] {
            let given = request(&["switchyard", "dlq", command, "--limit", "7"]);
            assert_eq!(limit(&given), Some(7), "{command}");
            let absent = request(&["switchyard", "dlq", command]);
            assert_eq!(
                limit(&absent),
                None,
                "{command}: the command applies its default"
            );
        }
    }
}
