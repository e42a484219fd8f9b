//! `[endpoints.NAME]` and `[backup_lists]`: each endpoint's settings, none
//! publishing straight back into the inbound queue, and lists that name
//! only endpoints.

use super::queue::queue_type;
use super::shared::{Result, names};
use crate::config::raw::{RawConfig, RawEndpoint};
use crate::config::{BrokerSpec, InvalidKey};
use crate::destination::{Endpoint, QueueType};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// `[endpoints.NAME]`: each endpoint's broker, destination, bounds and
/// declared queue.
pub(super) fn compile_endpoints(
    raw: &RawConfig,
    brokers: &BTreeMap<String, Arc<BrokerSpec>>,
    known_broker: &dyn Fn(&str, &str) -> Result<()>,
) -> Result<BTreeMap<String, Arc<Endpoint>>> {
    let mut endpoints = BTreeMap::new();
    for (name, e) in &raw.endpoints {
        let key = |k: &str| format!("endpoints.{name}.{k}");
        known_broker(&key("broker"), &e.broker)?;
        if e.confirm_timeout_ms == 0 {
            return Err(InvalidKey::new(
                key("confirm_timeout_ms"),
                "must be greater than 0",
            ));
        }
        if e.exchange.is_empty() && e.routing_key.is_empty() {
            return Err(InvalidKey::new(
                key("routing_key"),
                "must name the destination queue when exchange is the default exchange (\"\")",
            ));
        }
        if e.probe_interval_ms == 0 {
            return Err(InvalidKey::new(
                key("probe_interval_ms"),
                "must be greater than 0",
            ));
        }
        check_endpoint_loop(name, e, raw, brokers)?;
        let declare_queue_type = match (&e.declare_queue_type, &e.declare_queue) {
            (None, _) => QueueType::Classic,
            (Some(_), None) => {
                return Err(InvalidKey::new(
                    key("declare_queue_type"),
                    "applies only with declare_queue; set declare_queue or remove it",
                ));
            }
            (Some(t), Some(_)) => queue_type(&key("declare_queue_type"), t)?,
        };
        endpoints.insert(
            name.clone(),
            Arc::new(Endpoint {
                name: name.clone(),
                broker: e.broker.clone(),
                exchange: e.exchange.clone(),
                routing_key: e.routing_key.clone(),
                declare_queue: e.declare_queue.clone(),
                confirm_timeout: Duration::from_millis(e.confirm_timeout_ms),
                retries: e.retries,
                headers: e.headers.clone().into_iter().collect(),
                declare_queue_type,
                probe_interval: Duration::from_millis(e.probe_interval_ms),
            }),
        );
    }
    Ok(endpoints)
}

/// `[backup_lists]`: each list names at least one endpoint, and only
/// endpoints.
pub(super) fn check_backup_lists(
    raw: &RawConfig,
    endpoints: &BTreeMap<String, Arc<Endpoint>>,
) -> Result<()> {
    for (list, members) in &raw.backup_lists {
        if members.is_empty() {
            return Err(InvalidKey::new(
                format!("backup_lists.{list}"),
                "is empty; list at least one endpoint or remove it",
            ));
        }
        for (i, member) in members.iter().enumerate() {
            if !endpoints.contains_key(member) {
                return Err(InvalidKey::new(
                    format!("backup_lists.{list}[{i}]"),
                    format!(
                        "unknown endpoint \"{member}\" (defined: {})",
                        names(endpoints)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Refuses an endpoint that publishes straight back into the inbound queue
/// (docs/configuration.md): on the inbound's broker (by name, or by host, port and vhost),
/// through the default exchange with the inbound queue as routing key, or
/// declaring the inbound queue as its destination.
fn check_endpoint_loop(
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
        crate::config::loop_words(&what),
    ))
}
