//! Startup declarations, and the checks that make `nack` dead-lettering
//! safe: the inbound queue must carry the configured dead-letter exchange,
//! and that exchange must exist, or a nacked message would be discarded.
//!
//! Every operation runs on its own short-lived channel, because a refused
//! declaration closes the channel it was made on.

use super::connector::Connector;
use super::{AmqpValue, FieldTable};
use crate::config::{DeadLetterMode, Settings};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::protocol::AMQPErrorKind;
use lapin::{Channel, ErrorKind, ExchangeKind};
use std::time::Duration;

const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// A startup declaration failed.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The broker could not be reached; worth retrying.
    #[error("{0}")]
    Unreachable(String),
    /// The broker refused: the configuration and the broker disagree. Not
    /// worth retrying; the message says what to change.
    #[error("{0}")]
    Refused(String),
}

/// Declares (or, with `inbound.declare = false`, verifies) the dead-letter
/// exchange and queue and the inbound queue with its dead-letter arguments.
pub async fn prepare_inbound(
    connector: &Connector,
    settings: &Settings,
) -> Result<(), TopologyError> {
    let inbound = &settings.inbound;
    let dl = &settings.dead_letter;
    if !dl.exchange.is_empty() {
        let options = ExchangeDeclareOptions {
            passive: !inbound.declare,
            durable: true,
            ..Default::default()
        };
        run(connector, |ch| async move {
            ch.exchange_declare(dl.exchange.as_str().into(), ExchangeKind::Direct, options, FieldTable::default())
                .await
        })
        .await
        .map_err(|e| match e {
            Op::Refused(404, _) => TopologyError::Refused(format!(
                "dead_letter.exchange \"{}\" does not exist on broker \"{}\": create it, or set inbound.declare = true",
                dl.exchange, inbound.broker
            )),
            other => other.into_error(&format!("dead_letter.exchange \"{}\"", dl.exchange)),
        })?;
    }
    if inbound.declare
        && let Some(queue) = &dl.queue
    {
        declare_queue(connector, queue, FieldTable::default())
            .await
            .map_err(|e| e.into_error(&format!("dead_letter.queue \"{queue}\"")))?;
        run(connector, |ch| async move {
            ch.queue_bind(
                queue.as_str().into(),
                dl.exchange.as_str().into(),
                dl.routing_key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
        })
        .await
        .map_err(|e| e.into_error(&format!("binding dead_letter.queue \"{queue}\"")))?;
    }

    let arguments = inbound_arguments(settings);
    let queue = inbound.queue.as_str();
    if !inbound.declare {
        passive_queue(connector, queue).await.map_err(|e| match e {
            Op::Refused(404, _) => TopologyError::Refused(format!(
                "inbound.queue \"{queue}\" does not exist on broker \"{}\": create it, or set inbound.declare = true",
                inbound.broker
            )),
            other => other.into_error(&format!("inbound.queue \"{queue}\"")),
        })?;
        if dl.mode == DeadLetterMode::Republish {
            return Ok(());
        }
    }
    // Declaring with the expected arguments is idempotent when the queue has
    // exactly them and refused (406) otherwise: that is the check.
    declare_queue(connector, queue, arguments).await.map_err(|e| match e {
        Op::Refused(406, text) => TopologyError::Refused(format!(
            "inbound.queue \"{queue}\" exists with other arguments than x-dead-letter-exchange = \"{}\", \
             x-dead-letter-routing-key = \"{}\"{} ({text}); in nack mode a dead letter would be lost: \
             delete and let switchyard declare it, redeclare it with these arguments, or set dead_letter.mode = \"republish\"",
            dl.exchange,
            dl.routing_key,
            if inbound.single_active_consumer { ", x-single-active-consumer = true" } else { "" },
        )),
        other => other.into_error(&format!("inbound.queue \"{queue}\"")),
    })
}

/// Declares an endpoint's durable queue.
pub async fn declare_endpoint_queue(
    connector: &Connector,
    queue: &str,
) -> Result<(), TopologyError> {
    declare_queue(connector, queue, FieldTable::default())
        .await
        .map_err(|e| {
            e.into_error(&format!(
                "queue \"{queue}\" on broker \"{}\"",
                connector.broker()
            ))
        })
}

fn inbound_arguments(settings: &Settings) -> FieldTable {
    let dl = &settings.dead_letter;
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AmqpValue::LongString(dl.exchange.as_str().into()),
    );
    if !dl.routing_key.is_empty() {
        args.insert(
            "x-dead-letter-routing-key".into(),
            AmqpValue::LongString(dl.routing_key.as_str().into()),
        );
    }
    if settings.inbound.single_active_consumer {
        args.insert("x-single-active-consumer".into(), AmqpValue::Boolean(true));
    }
    args
}

async fn declare_queue(
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

async fn passive_queue(connector: &Connector, queue: &str) -> Result<(), Op> {
    let options = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    run(connector, |ch| async move {
        ch.queue_declare(queue.into(), options, FieldTable::default())
            .await
            .map(|_| ())
    })
    .await
}

/// How one declaration ended.
enum Op {
    Unreachable(String),
    Refused(u16, String),
}

impl Op {
    fn into_error(self, what: &str) -> TopologyError {
        match self {
            Op::Unreachable(why) => TopologyError::Unreachable(format!("{what}: {why}")),
            Op::Refused(code, text) => {
                TopologyError::Refused(format!("{what}: refused by the broker ({code} {text})"))
            }
        }
    }
}

async fn run<F, Fut, T>(connector: &Connector, op: F) -> Result<T, Op>
where
    F: FnOnce(Channel) -> Fut,
    Fut: Future<Output = lapin::Result<T>>,
{
    let channel = connector
        .channel(false, OP_TIMEOUT)
        .await
        .map_err(|e| Op::Unreachable(e.to_string()))?;
    let result = tokio::time::timeout(OP_TIMEOUT, op(channel.clone())).await;
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
