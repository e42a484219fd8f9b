//! Startup declarations, and the checks that make dead-lettering safe: the
//! inbound queue must carry the configured dead-letter exchange (in `nack`
//! mode, unless a policy is trusted to set it), and that exchange must exist,
//! or a nacked message would be discarded.
//!
//! Queues are declared with their configured type (`x-queue-type`). A
//! queue that already exists is compared only on the arguments that matter:
//! its type, and in `nack` mode its dead-letter exchange and routing key.
//! Other arguments an operator gave it (a length limit, a TTL, a delivery
//! limit) are read back from the broker's refusal and kept, so a
//! redeclaration never fails on them. A mismatch that matters is a one-line
//! error naming the argument, the queue's message count and what to change.
//!
//! Unless switchyard has just declared and bound the dead-letter queue
//! itself, one probe message checks that the dead-letter exchange routes the
//! dead-letter routing key somewhere (see [`PROBE_HEADER`]).
//!
//! Every operation runs on its own short-lived channel, because a refused
//! declaration closes the channel it was made on.

mod probe;
mod queue;

pub use probe::PROBE_HEADER;
use probe::probe_dead_letter_route;
use queue::{QueueSpec, Setting, ensure_queue};

use super::connector::{ConnectError, Connector, within_unblocked};
use super::{AmqpValue, FieldTable};
use crate::config::{DeadLetterMode, Endpoint, QueueType, Settings};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::protocol::AMQPErrorKind;
use lapin::{Channel, ErrorKind, ExchangeKind};
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

/// Declares (or, with `inbound.declare = false`, verifies) the dead-letter
/// exchange and queue and the inbound queue with its type and dead-letter
/// arguments.
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
        let spec = QueueSpec::new("dead_letter.queue", queue, &inbound.broker, true)
            .typed("dead_letter.queue_type", dl.queue_type);
        ensure_queue(connector, &spec).await?;
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
    ensure_queue(connector, &inbound_spec(settings)).await?;
    if !(inbound.declare && dl.queue.is_some()) {
        probe_dead_letter_route(connector, settings).await?;
    }
    Ok(())
}

/// Declares the inbound queue again (after it was deleted under a running
/// consumer), with the same arguments and checks as at startup.
pub async fn redeclare_inbound(
    connector: &Connector,
    settings: &Settings,
) -> Result<(), TopologyError> {
    ensure_queue(connector, &inbound_spec(settings)).await
}

/// Declares an endpoint's `declare_queue`, if it has one, with its type.
pub async fn declare_endpoint_queue(
    connector: &Connector,
    endpoint: &Endpoint,
) -> Result<(), TopologyError> {
    let Some(queue) = &endpoint.declare_queue else {
        return Ok(());
    };
    let key = format!("endpoints.{}.declare_queue", endpoint.name);
    let spec = QueueSpec::new(&key, queue, &endpoint.broker, true).typed(
        &format!("endpoints.{}.declare_queue_type", endpoint.name),
        endpoint.declare_queue_type,
    );
    ensure_queue(connector, &spec).await
}

/// The inbound queue as the configuration wants it.
///
/// In `nack` mode the dead-letter arguments must hold, since the broker
/// routes every nack through them. A quorum queue in `nack` mode is created
/// with `x-dead-letter-strategy = at-least-once`, which RabbitMQ honours only
/// together with `x-overflow = reject-publish` (otherwise it falls back to
/// at-most-once): a dead letter then leaves the inbound queue only once the
/// dead-letter queue has confirmed it. An existing queue may differ there;
/// that is logged, not refused. With `dead_letter_by_policy` no dead-letter
/// argument is declared or checked: the policy is trusted.
fn inbound_spec(settings: &Settings) -> QueueSpec<'_> {
    let inbound = &settings.inbound;
    let dl = &settings.dead_letter;
    let mut spec = QueueSpec::new(
        "inbound.queue",
        &inbound.queue,
        &inbound.broker,
        inbound.declare,
    )
    .typed("inbound.queue_type", inbound.queue_type);
    let routing_key =
        (!dl.routing_key.is_empty()).then(|| AmqpValue::LongString(dl.routing_key.as_str().into()));
    let exchange = AmqpValue::LongString(dl.exchange.as_str().into());
    match (dl.mode, inbound.dead_letter_by_policy) {
        (DeadLetterMode::Nack, true) => {
            tracing::info!(
                queue = %inbound.queue,
                exchange = %dl.exchange,
                "inbound.dead_letter_by_policy: trusting a policy to set the inbound queue's dead-letter exchange; not checking its arguments"
            );
        }
        (DeadLetterMode::Nack, false) => {
            spec.require(
                "x-dead-letter-exchange",
                Some(exchange),
                Setting::DeadLetterExchange,
            );
            spec.require(
                "x-dead-letter-routing-key",
                routing_key,
                Setting::DeadLetterRoutingKey,
            );
            if inbound.queue_type == QueueType::Quorum {
                spec.prefer(
                    "x-dead-letter-strategy",
                    AmqpValue::LongString("at-least-once".into()),
                );
                spec.prefer("x-overflow", AmqpValue::LongString("reject-publish".into()));
            }
        }
        (DeadLetterMode::Republish, _) => {
            spec.prefer("x-dead-letter-exchange", exchange);
            if let Some(key) = routing_key {
                spec.prefer("x-dead-letter-routing-key", key);
            }
        }
    }
    if inbound.single_active_consumer {
        spec.require(
            "x-single-active-consumer",
            Some(AmqpValue::Boolean(true)),
            Setting::SingleActiveConsumer,
        );
    }
    spec
}

async fn message_count(connector: &Connector, queue: &str) -> Option<u32> {
    passive_queue(connector, queue).await.ok()
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

/// Checks `queue` exists; its message count.
async fn passive_queue(connector: &Connector, queue: &str) -> Result<u32, Op> {
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
enum Op {
    /// No connection: nothing was declared.
    NoConnection(ConnectError),
    Unreachable(String),
    Refused(u16, String),
}

impl Op {
    fn into_error(self, what: &str) -> TopologyError {
        match self {
            Op::NoConnection(e) => TopologyError::NoConnection(e),
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
    run_on(connector, false, op).await
}

/// Runs `op` on a fresh channel (in confirm mode if `confirm`), closed after.
async fn run_on<F, Fut, T>(connector: &Connector, confirm: bool, op: F) -> Result<T, Op>
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
