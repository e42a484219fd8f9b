//! What a `dlq` command reports: why it failed, what a scan went through,
//! and what a redrive did (also when it stopped early).

use crate::broker::{ReadError, RepublishError};
use crate::config::InvalidKey;
use std::fmt;

/// Why a `dlq` command failed.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    /// A command-line value is invalid (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The configuration lacks what the command needs (exit 2).
    #[error("{0}")]
    Config(InvalidKey),
    /// The dead-letter queue could not be read (exit 1).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The listing could not be written (exit 1).
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    /// Redrive stopped before it was done (exit 1); what it did is kept.
    #[error("redrive stopped: {why}; {done}")]
    Stopped {
        /// Why.
        #[source]
        why: Box<Stop>,
        /// What was redriven before it stopped.
        done: Box<Redriven>,
    },
}

impl DlqError {
    /// Exit code 2 (usage or configuration) rather than 1.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Usage(_) | Self::Config(_))
    }
}

/// What a scan went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Messages the queue held when the command started.
    pub queued: u32,
    /// Messages taken from it (and handed back unless acked).
    pub seen: u64,
    /// Dead letters the selection took.
    pub selected: u64,
    /// Startup probes of the dead-letter route, skipped.
    pub probes: u64,
}

/// Why a redrive stopped before it was done.
#[derive(Debug, thiserror::Error)]
pub enum Stop {
    /// Ctrl-C, between two messages.
    #[error("interrupted (SIGINT)")]
    Interrupted,
    /// The dead-letter queue could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The lines could not be written.
    #[error("cannot write the output: {0}")]
    Output(#[source] std::io::Error),
    /// A dead letter every branch holds could not be removed.
    #[error("{id} could not be removed: {error}")]
    NotRemoved {
        /// Its message_id.
        id: String,
        /// Why.
        #[source]
        error: ReadError,
    },
    /// The inbound queue returned a copy: it does not exist.
    #[error(
        "the broker returned the copy of {id} ({error}): does inbound.queue \"{inbound}\" exist?"
    )]
    Returned {
        /// Its message_id.
        id: String,
        /// The inbound queue.
        inbound: String,
        /// The return.
        #[source]
        error: RepublishError,
    },
    /// A copy was not confirmed.
    #[error("the copy of {id} was not confirmed: {error}")]
    NotConfirmed {
        /// Its message_id.
        id: String,
        /// Why.
        #[source]
        error: RepublishError,
    },
    /// A copy was confirmed but its dead letter could not be removed.
    #[error("{id} reached {inbound} but stays in the dead-letter queue too: {error}")]
    InBoth {
        /// Its message_id.
        id: String,
        /// The inbound queue.
        inbound: String,
        /// Why.
        #[source]
        error: ReadError,
    },
}

/// What a redrive did; its `Display` is the summary line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redriven {
    /// The dead-letter queue.
    pub from: String,
    /// The inbound queue.
    pub to: String,
    /// What the scan went through.
    pub counts: Counts,
    /// Dead letters confirmed on the inbound queue and removed.
    pub redriven: u64,
    /// Dead letters the broker refused to take back as they are; left in place.
    pub refused: u64,
    /// Dead letters every branch already held, removed without a copy.
    pub held: u64,
    /// Nothing was published or removed.
    pub dry_run: bool,
}

impl fmt::Display for Redriven {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        if self.dry_run {
            write!(
                f,
                "dry run: {} of {} dead letter(s) in {} would be redriven to {}; nothing was changed",
                c.selected, c.queued, self.from, self.to
            )?;
        } else {
            write!(
                f,
                "{} of {} dead letter(s) redriven from {} to {}",
                self.redriven, c.queued, self.from, self.to
            )?;
            if self.held > 0 {
                write!(f, "; {} already held by every branch, removed", self.held)?;
            }
            if self.refused > 0 {
                write!(
                    f,
                    "; {} refused by the broker, left in {}",
                    self.refused, self.from
                )?;
            }
        }
        Ok(())
    }
}
