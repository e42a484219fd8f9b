//! What a publisher is asked and what it answers: the request for one
//! copy, the ways an attempt fails, and how a copy is published.

use crate::amqp::{AmqpValue, ShortString};
use crate::broker::connector::ConnectError;
use crate::broker::error::{BrokerError, Fault};
use crate::broker::health::ProbeFailure;
use crate::envelope::Envelope;
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Why one publish attempt failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PublishFailure {
    /// The broker answered `basic.nack`.
    #[error("nacked by the broker")]
    Nacked,
    /// The broker answered `basic.nack` on a connection just made after a
    /// node was lost or came back ([`crate::broker::connector::SETTLING`]):
    /// most likely a quorum queue still electing its leader. Retried on the
    /// same endpoint, never a reason to fail over or dead-letter.
    #[error("nacked by the broker while its quorum queues elect leaders after a node change")]
    NackedSettling,
    /// The broker returned the mandatory publish as unroutable.
    #[error("returned by the broker: {code} {text}")]
    Returned {
        /// AMQP reply code (312 NO_ROUTE).
        code: u16,
        /// AMQP reply text.
        text: String,
    },
    /// No confirm within the endpoint's `confirm_timeout_ms`.
    #[error("no confirm within {0} ms")]
    Timeout(u128),
    /// The channel or connection failed while the publish was in flight.
    #[error("{0}")]
    Broker(BrokerError),
    /// No channel could be opened to the endpoint's broker.
    #[error("{0}")]
    Unreachable(#[from] ConnectError),
    /// The broker refuses this message itself (too large, foreign user_id):
    /// no endpoint will take it as it is.
    #[error("refused by the broker: {0}")]
    Rejected(#[source] Refusal),
    /// The publisher is shutting down.
    #[error("publisher stopped")]
    Stopped,
    /// The endpoint was skipped as down (its connection or channel failed
    /// and it is probed): it did not refuse the message. An outage.
    #[error("skipped as down: its connection or channel failed; it is probed until it works")]
    Down,
    /// The list has no endpoint to publish to: every one is drained, or
    /// none is registered yet. An outage, never the message's fault.
    #[error(
        "no endpoint to publish to: every endpoint of the list is drained, or none is registered"
    )]
    NoEndpoint,
}

impl PublishFailure {
    /// The channel closed in a way one message may have caused: retry this
    /// one [`Mode::Alone`] to find out whether it is the culprit.
    pub fn is_suspect(&self) -> bool {
        matches!(self, Self::Broker(e) if e.fault() == Fault::Message)
    }

    /// The same endpoint will most likely take the message after a pause:
    /// it is retried there, not failed over.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::NackedSettling)
    }

    /// The failure says nothing about the message or the destination: the
    /// broker could not be reached, the connection was lost, no confirm
    /// came (the broker stalls), or the broker refuses the forwarder's own
    /// user. A list exhausted only by these is an outage, held by default.
    pub fn is_outage(&self) -> bool {
        match self {
            Self::Timeout(_)
            | Self::Unreachable(_)
            | Self::NackedSettling
            | Self::NoEndpoint
            | Self::Down => true,
            Self::Broker(e) => matches!(e.fault(), Fault::Connection | Fault::Refused),
            Self::Nacked | Self::Returned { .. } | Self::Rejected(_) | Self::Stopped => false,
        }
    }
}

/// Why a broker refuses one message for what it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It closed the channel when the message was published alone.
    #[error("{0}")]
    Broker(BrokerError),
    /// Its content header does not fit in one frame (checked before
    /// publishing, as the broker would close the connection).
    #[error("content header of {header} bytes exceeds the broker's frame_max of {frame_max}")]
    FrameTooLarge {
        /// The content header's size in bytes.
        header: usize,
        /// The connection's negotiated frame_max.
        frame_max: usize,
    },
}

/// How a copy is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// With the endpoint's other publishes, many in flight.
    Normal,
    /// On a channel of its own, one at a time: a failure is its own.
    Alone,
}

pub(super) enum Command {
    Publish(Request),
    /// A background probe of a down endpoint finished.
    Probed(Result<(), ProbeFailure>),
}

pub(super) struct Request {
    pub(super) id: u64,
    pub(super) envelope: Arc<Envelope>,
    pub(super) extra_headers: Vec<(ShortString, AmqpValue)>,
    pub(super) mode: Mode,
    pub(super) reply: oneshot::Sender<Result<(), PublishFailure>>,
    /// When [`Publisher::publish`] was called: a [`Mode::Normal`] publish's
    /// confirm timeout runs from then.
    pub(super) called_at: Instant,
}
