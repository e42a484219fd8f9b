//! Endpoints checked against the inbound queue: none may publish straight
//! back into it.

use super::shared::Result;
use crate::config::raw::{RawConfig, RawEndpoint};
use crate::config::{BrokerSpec, InvalidKey};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Refuses an endpoint that publishes straight back into the inbound queue
/// (docs/configuration.md): on the inbound's broker (by name, or by host, port and vhost),
/// through the default exchange with the inbound queue as routing key, or
/// declaring the inbound queue as its destination.
pub(super) fn check_endpoint_loop(
    name: &str,
    e: &RawEndpoint,
    raw: &RawConfig,
    brokers: &BTreeMap<String, Arc<BrokerSpec>>,
) -> Result<()> {
    let Some(inbound) = &raw.inbound else {
        return Ok(());
    };
    let broker = if e.broker == inbound.broker {
        format!("broker \"{}\", the inbound's broker", e.broker)
    } else {
        match (brokers.get(&e.broker), brokers.get(&inbound.broker)) {
            (Some(ours), Some(theirs)) if ours.same_vhost_as(theirs) => {
                format!(
                    "broker \"{}\", which has the host, port and vhost of the inbound's broker \"{}\"",
                    e.broker, inbound.broker
                )
            }
            _ => return Ok(()),
        }
    };
    let queue = &inbound.queue;
    let (key, what) = if e.exchange.is_empty() && e.routing_key == *queue {
        (
            "routing_key",
            format!("publishing to \"{queue}\" through the default exchange of {broker},"),
        )
    } else if e.declare_queue.as_ref() == Some(queue) {
        (
            "declare_queue",
            format!("\"{queue}\" is the inbound queue on {broker}: this endpoint"),
        )
    } else {
        return Ok(());
    };
    Err(InvalidKey::new(
        format!("endpoints.{name}.{key}"),
        format!(
            "{what} would route every copy back into the inbound queue (a forwarding loop); \
             name another queue"
        ),
    ))
}
