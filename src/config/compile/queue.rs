//! `[inbound]` and `[dead_letter]`, the queue side of the forwarder, and
//! the queue types they and endpoints declare.

use super::shared::Result;
use crate::config::raw::{RawConfig, RawDeadLetter, RawInbound};
use crate::config::{BrokerSpec, Inbound, InvalidKey};
use crate::destination::{DeadLetter, DeadLetterMode, QueueType};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `[inbound]` and `[dead_letter]` together, or neither for a forwarder
/// fed by the HTTP ingress alone.
pub(super) fn queue_side(
    raw: &RawConfig,
    brokers: &BTreeMap<String, Arc<BrokerSpec>>,
    known_broker: &dyn Fn(&str, &str) -> Result<()>,
) -> Result<Option<(Inbound, DeadLetter)>> {
    Ok(match (&raw.inbound, &raw.dead_letter) {
        (Some(inbound), Some(dead_letter)) => {
            Some(compile_queue(inbound, dead_letter, brokers, known_broker)?)
        }
        (Some(_), None) => {
            return Err(InvalidKey::new(
                "dead_letter",
                "missing; add a [dead_letter] table (where messages go when they cannot be \
                 forwarded)",
            ));
        }
        (None, Some(_)) => {
            return Err(InvalidKey::new(
                "dead_letter",
                "applies only with [inbound]; remove it, or add the [inbound] queue to consume",
            ));
        }
        (None, None) if raw.ingress.http.is_none() => {
            return Err(InvalidKey::new(
                "inbound",
                "missing; add an [inbound] queue to consume, an [ingress.http] listener, or both",
            ));
        }
        (None, None) => None,
    })
}

/// `[inbound]` and `[dead_letter]`: the queue side of the forwarder.
fn compile_queue(
    raw: &RawInbound,
    dead_letter: &RawDeadLetter,
    brokers: &BTreeMap<String, Arc<BrokerSpec>>,
    known_broker: &dyn Fn(&str, &str) -> Result<()>,
) -> Result<(Inbound, DeadLetter)> {
    known_broker("inbound.broker", &raw.broker)?;
    if raw.queue.is_empty() {
        return Err(InvalidKey::new("inbound.queue", "must not be empty"));
    }
    let prefetch = u16::try_from(raw.prefetch)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| InvalidKey::new("inbound.prefetch", "must be between 1 and 65535"))?;

    let inbound_queue_type = queue_type("inbound.queue_type", &raw.queue_type)?;
    if raw.max_redeliveries == 0 {
        return Err(InvalidKey::new(
            "inbound.max_redeliveries",
            "must be at least 1",
        ));
    }
    if raw.max_hops == 0 {
        return Err(InvalidKey::new("inbound.max_hops", "must be at least 1"));
    }
    // The forwarder's own user is always trusted: whoever holds its
    // credentials can consume and publish as the forwarder anyway.
    let mut trusted_users = raw.trusted_users.clone().unwrap_or_default();
    if let Some(i) = trusted_users.iter().position(String::is_empty) {
        return Err(InvalidKey::new(
            format!("inbound.trusted_users[{i}]"),
            "must not be empty; name a RabbitMQ user",
        ));
    }
    let own = brokers.get(&raw.broker).and_then(|b| b.user());
    if let Some(own) = own.filter(|own| !trusted_users.contains(own)) {
        trusted_users.insert(0, own);
    }

    let dead_letter = compile_dead_letter(dead_letter, &raw.queue)?;
    if raw.dead_letter_by_policy && dead_letter.mode != DeadLetterMode::Nack {
        return Err(InvalidKey::new(
            "inbound.dead_letter_by_policy",
            "applies only to dead_letter.mode = \"nack\"; remove it",
        ));
    }

    let inbound = Inbound {
        broker: raw.broker.clone(),
        queue: raw.queue.clone(),
        prefetch,
        declare: raw.declare,
        single_active_consumer: raw.single_active_consumer,
        queue_type: inbound_queue_type,
        max_redeliveries: raw.max_redeliveries,
        max_hops: raw.max_hops,
        dead_letter_by_policy: raw.dead_letter_by_policy,
        trusted_users,
    };
    Ok((inbound, dead_letter))
}

fn compile_dead_letter(d: &RawDeadLetter, inbound_queue: &str) -> Result<DeadLetter> {
    let mode = match d.mode.as_str() {
        "nack" => DeadLetterMode::Nack,
        "republish" => DeadLetterMode::Republish,
        other => {
            return Err(InvalidKey::new(
                "dead_letter.mode",
                format!("unknown mode \"{other}\" (expected \"nack\" or \"republish\")"),
            ));
        }
    };
    if d.exchange.is_empty() && d.routing_key.is_empty() {
        return Err(InvalidKey::new(
            "dead_letter.routing_key",
            "must name the dead-letter queue when exchange is the default exchange (\"\")",
        ));
    }
    if d.queue.as_deref() == Some("") {
        return Err(InvalidKey::new(
            "dead_letter.queue",
            "must not be empty; omit it instead",
        ));
    }
    if d.queue.is_some() && d.exchange.is_empty() {
        return Err(InvalidKey::new(
            "dead_letter.queue",
            "cannot be bound to the default exchange; name a dead_letter.exchange",
        ));
    }
    if d.exchange.is_empty() && d.routing_key == inbound_queue {
        return Err(InvalidKey::new(
            "dead_letter.routing_key",
            format!(
                "publishing dead letters to \"{inbound_queue}\" through the default exchange \
                 would route every dead letter back into the inbound queue (a dead-letter loop); \
                 name the dead-letter queue"
            ),
        ));
    }
    if d.queue.as_deref() == Some(inbound_queue) {
        return Err(InvalidKey::new(
            "dead_letter.queue",
            format!(
                "\"{inbound_queue}\" is the inbound queue: binding it to dead_letter.exchange \
                 would route every dead letter back into the inbound queue (a dead-letter loop); \
                 name another queue"
            ),
        ));
    }
    let dlq_type = match (&d.queue_type, &d.queue) {
        (None, _) => QueueType::Classic,
        (Some(_), None) => {
            return Err(InvalidKey::new(
                "dead_letter.queue_type",
                "applies only with dead_letter.queue; set dead_letter.queue or remove it",
            ));
        }
        (Some(t), Some(_)) => queue_type("dead_letter.queue_type", t)?,
    };
    Ok(DeadLetter {
        mode,
        exchange: d.exchange.clone(),
        routing_key: d.routing_key.clone(),
        queue: d.queue.clone(),
        queue_type: dlq_type,
    })
}

pub(super) fn queue_type(key: &str, value: &str) -> Result<QueueType> {
    match value {
        "classic" => Ok(QueueType::Classic),
        "quorum" => Ok(QueueType::Quorum),
        other => Err(InvalidKey::new(
            key,
            format!("unknown queue type \"{other}\" (expected \"classic\" or \"quorum\")"),
        )),
    }
}
