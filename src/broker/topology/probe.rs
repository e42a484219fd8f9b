//! The dead-letter route probe: one message that proves the dead-letter
//! exchange routes the dead-letter routing key somewhere before any dead
//! letter relies on it.

use super::operation::{TopologyError, run_on};
use crate::amqp::{AmqpValue, FieldTable};
use crate::broker::connector::Connector;
use crate::destination::DeadLetter;
use crate::wire;
use lapin::Confirmation;
use lapin::options::BasicPublishOptions;

/// Makes sure the dead-letter exchange routes the dead-letter routing key
/// somewhere, since a dead letter sent into an exchange without a matching
/// binding is dropped silently (a nack) or returned forever (a republish).
/// One probe message is published with `mandatory`, on a confirm channel;
/// it carries [`wire::PROBE`], the forwarder's user as `user_id` and
/// `expiration = "0"`, so it expires at once
/// unless a consumer of the dead-letter queue is waiting, which then sees
/// one probe per start.
pub(super) async fn probe_dead_letter_route(
    connector: &Connector,
    broker: &str,
    dl: &DeadLetter,
) -> Result<(), TopologyError> {
    let mut headers = FieldTable::default();
    headers.insert(wire::PROBE.into(), AmqpValue::Boolean(true));
    let properties = lapin::BasicProperties::default()
        .with_expiration("0".into())
        .with_headers(headers);
    // Published as the forwarder's user, which the dead-letter tools trust:
    // a producer's probe mark hides nothing.
    let properties = match connector.user() {
        Some(user) => properties.with_user_id(user.as_str().into()),
        None => properties,
    };
    let options = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let confirmation = run_on(connector, true, |ch| async move {
        ch.basic_publish(
            dl.exchange.as_str().into(),
            dl.routing_key.as_str().into(),
            options,
            b"",
            properties,
        )
        .await?
        .await
    })
    .await
    .map_err(|e| {
        e.into_error(&format!(
            "probing dead_letter.exchange \"{}\" with dead_letter.routing_key \"{}\"",
            dl.exchange, dl.routing_key
        ))
    })?;
    match confirmation {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) if dl.exchange.is_empty() => {
            Err(TopologyError::Mismatch(format!(
                "dead_letter.routing_key \"{}\" names no queue on broker \"{broker}\" (dead_letter.exchange \
             is the default exchange): every dead letter would be lost; create that queue, or name \
             an existing one",
                dl.routing_key
            )))
        }
        Confirmation::Ack(Some(_)) => Err(TopologyError::Mismatch(format!(
            "dead_letter.exchange \"{}\" on broker \"{broker}\" routes nothing with \
             dead_letter.routing_key \"{}\": every dead letter would be lost; bind a queue to it \
             with that routing key, or set dead_letter.queue and inbound.declare = true so \
             switchyard declares and binds one",
            dl.exchange, dl.routing_key
        ))),
        Confirmation::Nack(_) => {
            tracing::warn!(
                exchange = %dl.exchange,
                routing_key = %dl.routing_key,
                "the broker refused the dead-letter route probe (is the dead-letter queue full?); dead letters may be refused too"
            );
            Ok(())
        }
    }
}
