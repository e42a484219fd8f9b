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
//! A quorum inbound queue is created with a delivery limit, and startup
//! says what limit an existing one has and what to set when it has none
//! (see `limit`).
//!
//! Unless switchyard has just declared and bound the dead-letter queue
//! itself, one probe message checks that the dead-letter exchange routes the
//! dead-letter routing key somewhere (see `probe`).
//!
//! Every operation runs on its own short-lived channel, because a refused
//! declaration closes the channel it was made on.

mod limit;
mod operation;
mod probe;
mod queue;

use limit::{DELIVERY_LIMIT, report_delivery_limit};
pub use operation::TopologyError;
use operation::{Op, run};
use probe::probe_dead_letter_route;
use queue::{QueueSpec, Setting, ensure_queue};

use super::connector::Connector;
use crate::amqp::{AmqpValue, FieldTable};
use crate::config::Inbound;
use crate::destination::{DeadLetter, DeadLetterMode, Endpoint, QueueType};
use lapin::ExchangeKind;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};

/// Declares (or, with `inbound.declare = false`, verifies) the dead-letter
/// exchange and queue and the inbound queue with its type and dead-letter
/// arguments.
pub async fn prepare_inbound(
    connector: &Connector,
    (inbound, dl): (&Inbound, &DeadLetter),
) -> Result<(), TopologyError> {
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
            Op::Refused(404, _) => TopologyError::Mismatch(format!(
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
    let arguments = ensure_queue(connector, &inbound_spec(inbound, dl)).await?;
    report_delivery_limit(connector, (inbound, dl), &arguments);
    if !(inbound.declare && dl.queue.is_some()) {
        probe_dead_letter_route(connector, &inbound.broker, dl).await?;
    }
    Ok(())
}

/// Declares the inbound queue again (after it was deleted under a running
/// consumer), with the same arguments and checks as at startup.
pub async fn redeclare_inbound(
    connector: &Connector,
    (inbound, dl): (&Inbound, &DeadLetter),
) -> Result<(), TopologyError> {
    ensure_queue(connector, &inbound_spec(inbound, dl)).await?;
    Ok(())
}

/// Declares the journal's stream (`x-queue-type = stream`, with the
/// configured `x-max-age` and `x-max-length-bytes` when it is new; an
/// existing stream keeps its own). A queue of another type by that name
/// is a mismatch naming `journal.stream`.
pub async fn declare_journal_stream(
    connector: &Connector,
    journal: &crate::config::Journal,
) -> Result<(), TopologyError> {
    let mut spec = QueueSpec::new(
        "journal.stream",
        &journal.stream,
        &journal.broker.name,
        true,
    );
    spec.require(
        "x-queue-type",
        Some(AmqpValue::LongString("stream".into())),
        Setting::Stream,
    );
    spec.prefer(
        "x-max-age",
        AmqpValue::LongString(journal.max_age.as_str().into()),
    );
    spec.prefer(
        "x-max-length-bytes",
        AmqpValue::LongLongInt(i64::try_from(journal.max_bytes).unwrap_or(i64::MAX)),
    );
    ensure_queue(connector, &spec).await?;
    Ok(())
}

/// Declares the group's control stream (`x-queue-type = stream`), with
/// `x-max-length-bytes` and segments small enough for retention to trim
/// it (a stream drops whole segments only).
pub async fn declare_control_stream(
    connector: &Connector,
    control: &crate::config::Control,
) -> Result<(), TopologyError> {
    let mut spec = QueueSpec::new(
        "control.stream",
        &control.stream,
        &control.broker.name,
        true,
    );
    spec.require(
        "x-queue-type",
        Some(AmqpValue::LongString("stream".into())),
        Setting::Stream,
    );
    let bytes = i64::try_from(control.max_bytes).unwrap_or(i64::MAX);
    spec.prefer("x-max-length-bytes", AmqpValue::LongLongInt(bytes));
    spec.prefer(
        "x-stream-max-segment-size-bytes",
        AmqpValue::LongLongInt((bytes / 8).clamp(1 << 16, 8 << 20)),
    );
    ensure_queue(connector, &spec).await?;
    Ok(())
}

/// Checks, creating nothing, that the journal's stream exists and is a
/// stream: `Ok(false)` when no queue has its name; an existing stream is
/// declared as `run` declares it (which changes nothing), so a queue of
/// another type by that name is the mismatch `run` reports.
pub async fn check_journal_stream(
    connector: &Connector,
    journal: &crate::config::Journal,
) -> Result<bool, TopologyError> {
    match operation::passive_queue(connector, &journal.stream).await {
        Ok(_) => {}
        Err(Op::Refused(404, _)) => return Ok(false),
        Err(other) => {
            return Err(other.into_error(&format!("journal.stream \"{}\"", journal.stream)));
        }
    }
    declare_journal_stream(connector, journal).await?;
    Ok(true)
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
    ensure_queue(connector, &spec).await?;
    Ok(())
}

/// The inbound queue as the configuration wants it.
///
/// A quorum queue is created with `x-delivery-limit` (see
/// [`Inbound::delivery_limit`]); an existing one keeps its own, or none.
/// In `nack` mode the dead-letter arguments must hold, since the broker
/// routes every nack through them. A quorum queue in `nack` mode is created
/// with `x-dead-letter-strategy = at-least-once`, which RabbitMQ honours only
/// together with `x-overflow = reject-publish` (otherwise it falls back to
/// at-most-once): a dead letter then leaves the inbound queue only once the
/// dead-letter queue has confirmed it. An existing queue may differ there;
/// that is logged, not refused. With `dead_letter_by_policy` no dead-letter
/// argument is declared or checked: the policy is trusted.
fn inbound_spec<'a>(inbound: &'a Inbound, dl: &'a DeadLetter) -> QueueSpec<'a> {
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
    if let Some(limit) = inbound.delivery_limit() {
        spec.prefer(DELIVERY_LIMIT, AmqpValue::LongLongInt(i64::from(limit)));
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
