//! One declaration on a short-lived channel of its own (a refused one
//! closes its channel), and how it ended: what every startup check is made
//! of.

use super::super::connector::{ConnectError, Connector, within_unblocked};
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
    #[error("{0}")]
    Unreachable(String),
    /// The broker refused: the configuration and the broker disagree. Not
    /// worth retrying; the message says what to change.
    #[error("{0}")]
    Refused(String),
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
    Unreachable(String),
    Refused(u16, String),
}

impl Op {
    pub(super) fn into_error(self, what: &str) -> TopologyError {
        match self {
            Op::NoConnection(e) => TopologyError::NoConnection(e),
            Op::Unreachable(why) => TopologyError::Unreachable(format!("{what}: {why}")),
            Op::Refused(code, text) => {
                TopologyError::Refused(format!("{what}: refused by the broker ({code} {text})"))
            }
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
                Op::Unreachable(e.to_string())
            }
            _ => Op::NoConnection(e),
        })?;
    // A probe publish waits out a resource alarm rather than timing out.
    let result = within_unblocked(op(channel.clone()), OP_TIMEOUT, connector.blocking())
        .await
        .ok_or(());
    if channel.status().connected() {
        let _ = channel.close(200, "done".into()).await;
    }
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(match e.kind() {
            ErrorKind::ProtocolError(amqp) if matches!(amqp.kind(), AMQPErrorKind::Soft(_)) => {
                Op::Refused(amqp.get_id(), amqp.get_message().to_string())
            }
            _ => Op::Unreachable(e.to_string()),
        }),
        Err(_) => Err(Op::Unreachable(format!(
            "no answer within {} s",
            OP_TIMEOUT.as_secs()
        ))),
    }
}
