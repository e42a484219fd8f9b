//! One declaration on a short-lived channel of its own (a refused one
//! closes its channel), and how it ended: what every startup check is made
//! of.

use super::super::closing::close_channel;
use super::super::connector::{ConnectError, Connector, within_unblocked};
use super::super::error::BrokerError;
use crate::amqp::FieldTable;
use lapin::options::QueueDeclareOptions;
use lapin::protocol::AMQPErrorKind;
use lapin::{Channel, ErrorKind};
use std::future::Future;
use std::time::Duration;

const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// A startup declaration failed.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// No connection to the broker, so nothing was declared: it cannot be
    /// reached, or it refuses the credentials or the vhost
    /// ([`ConnectError::Refused`]). The connector has logged the attempt.
    #[error(transparent)]
    NoConnection(ConnectError),
    /// A declaration was not answered, or its channel failed; worth retrying.
    #[error("{what}: {cause}")]
    Unanswered {
        /// What was being declared, by its configuration key.
        what: String,
        /// What went wrong.
        #[source]
        cause: OpFailure,
    },
    /// The broker refused a declaration (a permission, say). Not worth
    /// retrying.
    #[error("{what}: refused by the broker ({code} {text})")]
    Declined {
        /// What was being declared, by its configuration key.
        what: String,
        /// The broker's reply code.
        code: u16,
        /// The broker's reply text.
        text: String,
    },
    /// The configuration and what the broker has disagree (a missing queue,
    /// a queue of another type, a dead-letter route to nowhere). Not worth
    /// retrying; the message says what to change.
    #[error("{0}")]
    Mismatch(String),
}

impl TopologyError {
    /// Whether only a change of the configuration or the broker helps.
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Declined { .. } | Self::Mismatch(_))
    }
}

/// Why one declaration got no answer.
#[derive(Debug, thiserror::Error)]
pub enum OpFailure {
    /// No channel could be opened for it.
    #[error("{0}")]
    Channel(ConnectError),
    /// Its channel or connection failed under it.
    #[error("{0}")]
    Lost(BrokerError),
    /// No answer in time.
    #[error("no answer within {} s", .0.as_secs())]
    Timeout(Duration),
}

pub(super) async fn message_count(connector: &Connector, queue: &str) -> Option<u32> {
    passive_queue(connector, queue).await.ok()
}

pub(super) async fn declare_queue(
    connector: &Connector,
    queue: &str,
    arguments: FieldTable,
) -> Result<(), Op> {
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    run(connector, |ch| async move {
        ch.queue_declare(queue.into(), options, arguments)
            .await
            .map(|_| ())
    })
    .await
}

/// Checks `queue` exists; its message count.
pub(super) async fn passive_queue(connector: &Connector, queue: &str) -> Result<u32, Op> {
    let options = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    run(connector, |ch| async move {
        ch.queue_declare(queue.into(), options, FieldTable::default())
            .await
            .map(|q| q.message_count())
    })
    .await
}

/// How one declaration ended.
pub(super) enum Op {
    /// No connection: nothing was declared.
    NoConnection(ConnectError),
    Unreachable(OpFailure),
    Refused(u16, String),
}

impl Op {
    pub(super) fn into_error(self, what: &str) -> TopologyError {
        match self {
            Op::NoConnection(e) => TopologyError::NoConnection(e),
            Op::Unreachable(cause) => TopologyError::Unanswered {
                what: what.to_owned(),
                cause,
            },
            Op::Refused(code, text) => TopologyError::Declined {
                what: what.to_owned(),
                code,
                text,
            },
        }
    }
}

pub(super) async fn run<F, Fut, T>(connector: &Connector, op: F) -> Result<T, Op>
where
    F: FnOnce(Channel) -> Fut,
    Fut: Future<Output = lapin::Result<T>>,
{
    run_on(connector, false, op).await
}

/// Runs `op` on a fresh channel (in confirm mode if `confirm`), closed after.
pub(super) async fn run_on<F, Fut, T>(connector: &Connector, confirm: bool, op: F) -> Result<T, Op>
where
    F: FnOnce(Channel) -> Fut,
    Fut: Future<Output = lapin::Result<T>>,
{
    let channel = connector
        .channel(confirm, OP_TIMEOUT)
        .await
        .map_err(|e| match e {
            ConnectError::Channel(_) | ConnectError::ChannelTimeout(_) => {
                Op::Unreachable(OpFailure::Channel(e))
            }
            _ => Op::NoConnection(e),
        })?;
    // A probe publish waits out a resource alarm rather than timing out.
    let result = within_unblocked(op(channel.clone()), OP_TIMEOUT, connector.blocking())
        .await
        .ok_or(());
    close_channel(&channel, "done", connector.telemetry()).await;
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(match e.kind() {
            ErrorKind::ProtocolError(amqp) if matches!(amqp.kind(), AMQPErrorKind::Soft(_)) => {
                Op::Refused(amqp.get_id(), amqp.get_message().to_string())
            }
            _ => Op::Unreachable(OpFailure::Lost(BrokerError::from_lapin(&e))),
        }),
        Err(_) => Err(Op::Unreachable(OpFailure::Timeout(OP_TIMEOUT))),
    }
}
