//! What the data path hands the journal: one [`Entry`] per settled
//! message, made of values it already holds (names behind `Arc`s, the
//! attempts its walk recorded), so that recording costs it a move and no
//! formatting. The writer turns entries into records off the data path.

use crate::destination::Endpoint;
use crate::wire::Trace;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Where the message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The inbound queue.
    Queue,
    /// The HTTP ingress.
    Http,
    /// `dlq redrive` put it back on the inbound queue.
    Redrive,
}

impl Source {
    /// The record's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queue => "queue",
            Self::Http => "http",
            Self::Redrive => "redrive",
        }
    }
}

/// How one publish attempt (or a step in place of one) ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempted {
    /// Confirmed by the broker and not returned.
    Confirmed,
    /// Returned as unroutable, with the AMQP reply code.
    Returned(u16),
    /// `basic.nack`.
    Nacked,
    /// No confirm in time.
    TimedOut,
    /// The channel or connection failed under it.
    Lost,
    /// No channel could be opened.
    Unreachable,
    /// The broker refused the message itself.
    Refused,
    /// The forwarder stopped.
    Stopped,
    /// Not tried: the endpoint was down when the branch came to it.
    SkippedDown,
    /// Not tried: an operator had drained the endpoint.
    SkippedDrained,
    /// The branch held the message while its whole list was down.
    Held(Duration),
}

impl Attempted {
    /// The record's word.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Confirmed => "confirmed",
            Self::Returned(_) => "returned",
            Self::Nacked => "nacked",
            Self::TimedOut => "timed-out",
            Self::Lost => "lost",
            Self::Unreachable => "unreachable",
            Self::Refused => "refused",
            Self::Stopped => "stopped",
            Self::SkippedDown => "skipped-down",
            Self::SkippedDrained => "skipped-drained",
            Self::Held(_) => "held",
        }
    }
}

/// One step of a branch's walk.
#[derive(Debug, Clone)]
pub struct Tried {
    /// The message's place in its run (0 for an independent message; a
    /// session's messages count from its first).
    pub index: u32,
    /// The endpoint.
    pub endpoint: Arc<Endpoint>,
    /// How it ended.
    pub outcome: Attempted,
    /// A session's earlier message sent again after a failover.
    pub replay: bool,
    /// The publish span (the copy's `traceparent` names it); 0 for a step
    /// that published nothing.
    pub span: u64,
    /// When it started and ended.
    pub started: SystemTime,
    /// When it ended.
    pub ended: SystemTime,
}

/// One branch of a settled message: how it ended and its steps in order.
#[derive(Debug, Clone)]
pub struct BranchEntry {
    /// The branch name.
    pub branch: Arc<str>,
    /// `delivered`, `failed`, `rejected`, `outage`, `abandoned`, or
    /// `earlier` (an HTTP retry: confirmed by an earlier try).
    pub result: &'static str,
    /// Its steps, in order.
    pub attempts: Vec<Tried>,
}

/// What was decided for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// Acked: every branch confirmed.
    Acked,
    /// Dead-lettered, with the reason word and the one-line error.
    DeadLettered {
        /// The reason word (`exhausted`, `no-route`, ...).
        reason: &'static str,
        /// The dead letter's error line.
        error: String,
    },
    /// Left for the broker to deliver again (the channel was lost or the
    /// forwarder stopped).
    Requeued,
    /// An HTTP request answered with this status and reason.
    Answered {
        /// The HTTP status.
        status: u16,
        /// Why, one line.
        reason: String,
    },
    /// `dlq redrive` confirmed it back on the inbound queue.
    Redriven,
}

impl Said {
    /// The record's verdict word.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Acked => "acked",
            Self::DeadLettered { .. } => "dead-lettered",
            Self::Requeued => "requeued",
            Self::Answered { .. } => "answered",
            Self::Redriven => "redriven",
        }
    }
}

/// One settled message, as the data path knows it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its `message_id`, if it has one.
    pub message_id: Option<String>,
    /// For a message without an id: the content id its copy ids use.
    pub content: Option<uuid::Uuid>,
    /// Where it came from.
    pub source: Source,
    /// Its session, if any.
    pub session: Option<Arc<str>>,
    /// The broker delivered it before (to this instance or another).
    pub redelivered: bool,
    /// Its trace.
    pub trace: Trace,
    /// When it arrived.
    pub received_at: SystemTime,
    /// When it was settled or answered.
    pub settled_at: SystemTime,
    /// The verdict.
    pub said: Said,
    /// Every branch it was for, in filter-table order.
    pub branches: Vec<BranchEntry>,
}
