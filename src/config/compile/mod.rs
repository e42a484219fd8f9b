//! [`compile`]: raw configuration → [`Settings`], or the first invalid key.
//! Each section has its compiler here: brokers, the queue side, endpoints,
//! named filters and the filter table.

mod brokers;
mod endpoints;
mod filters;
mod queue;
mod shared;
mod table;

use super::Compiled;
use super::error::InvalidKey;
use super::ingress::listen_address;
use super::raw::{RawConfig, RawSessions};
use super::{Sessions, Settings};
use crate::destination::{Endpoint, QueueType};
use crate::routing::RoutingTable;
use brokers::compile_brokers;
use endpoints::check_endpoint_loop;
use filters::FilterCompiler;
use queue::{compile_queue, queue_type};
use shared::{Result, names};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use table::compile_entry;

/// Validates `raw` and resolves every name in it.
pub fn compile(raw: &RawConfig) -> Result<Settings> {
    if raw.name.trim().is_empty() {
        return Err(InvalidKey::new("name", "must not be empty"));
    }
    let brokers = compile_brokers(raw)?;
    let known_broker = |key: &str, name: &str| -> Result<()> {
        if brokers.contains_key(name) {
            Ok(())
        } else {
            Err(InvalidKey::new(
                key,
                format!("unknown broker \"{name}\" (defined: {})", names(&brokers)),
            ))
        }
    };

    let queue = match (&raw.inbound, &raw.dead_letter) {
        (Some(inbound), Some(dead_letter)) => Some(compile_queue(
            inbound,
            dead_letter,
            &brokers,
            &known_broker,
        )?),
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
    };
    let prefetch = queue.as_ref().map(|(inbound, _)| inbound.prefetch);

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
        check_endpoint_loop(name, e, raw, &brokers)?;
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
                        names(&endpoints)
                    ),
                ));
            }
        }
    }

    let mut filters = FilterCompiler::new(&raw.filters);
    for name in raw.filters.keys() {
        filters.compile(name)?;
    }

    if raw.filter_table.is_empty() {
        return Err(InvalidKey::new(
            "filter_table",
            "has no entries; add at least one [[filter_table]]",
        ));
    }
    let mut branches = Vec::new();
    let mut seen_names = HashSet::new();
    for (i, entry) in raw.filter_table.iter().enumerate() {
        let branch = compile_entry(i, entry, raw, &endpoints, &mut filters)?;
        if !seen_names.insert(branch.name().to_owned()) {
            return Err(InvalidKey::new(
                format!("filter_table[{i}].name"),
                format!(
                    "branch name \"{}\" is used twice; names must be unique",
                    branch.name()
                ),
            ));
        }
        branches.push(branch);
    }

    let sessions = compile_sessions(&raw.sessions, prefetch)?;
    let admin_listen = match &raw.admin.listen {
        None => None,
        Some(addr) => Some(listen_address(addr).ok_or_else(|| {
            InvalidKey::new(
                "admin.listen",
                format!("\"{addr}\" is not a host:port address (or a port, for loopback)"),
            )
        })?),
    };

    let http = match &raw.ingress.http {
        Some(http) => Some(super::ingress::compile_http(
            http,
            prefetch.unwrap_or(1000),
        )?),
        None => None,
    };

    Ok(Settings {
        name: raw.name.clone(),
        shutdown_timeout: Duration::from_millis(raw.shutdown_timeout_ms),
        worker_threads: (raw.worker_threads > 0).then_some(usize::from(raw.worker_threads)),
        inbound: queue.as_ref().map(|(inbound, _)| inbound.clone()),
        dead_letter: queue.map(|(_, dead_letter)| dead_letter),
        brokers,
        endpoints,
        routing: Arc::new(RoutingTable::new(branches)),
        admin_listen,
        sessions,
        http,
        compiled: Compiled::new(),
    })
}

/// `[sessions]`: `None` when disabled. Open sessions hold their messages'
/// prefetch slots until they end, so they must never be able to hold all of
/// them: something else has to be able to arrive (their next message).
fn compile_sessions(raw: &RawSessions, prefetch: Option<u16>) -> Result<Option<Sessions>> {
    if !raw.enabled {
        return Ok(None);
    }
    for (key, value) in [
        ("id_header", &raw.id_header),
        ("end_header", &raw.end_header),
    ] {
        if value.is_empty() {
            return Err(InvalidKey::new(
                format!("sessions.{key}"),
                "is empty; name the header",
            ));
        }
    }
    if raw.id_header == raw.end_header {
        return Err(InvalidKey::new(
            "sessions.end_header",
            "is the same header as sessions.id_header; use two headers",
        ));
    }
    for (key, value) in [
        ("idle_timeout_ms", raw.idle_timeout_ms),
        ("max_messages", u64::from(raw.max_messages)),
        ("max_bytes", raw.max_bytes),
        ("max_open", u64::from(raw.max_open)),
    ] {
        if value == 0 {
            return Err(InvalidKey::new(
                format!("sessions.{key}"),
                "must be at least 1",
            ));
        }
    }
    let held = u64::from(raw.max_open) * u64::from(raw.max_messages);
    if let Some(prefetch) = prefetch.filter(|p| held >= u64::from(*p)) {
        return Err(InvalidKey::new(
            "sessions.max_open",
            format!(
                "max_open ({}) x max_messages ({}) = {held} must stay below inbound.prefetch \
                 ({prefetch}), or open sessions could hold every prefetch slot and wait \
                 forever for messages that cannot arrive; lower them or raise the prefetch",
                raw.max_open, raw.max_messages
            ),
        ));
    }
    Ok(Some(Sessions {
        id_header: raw.id_header.clone(),
        end_header: raw.end_header.clone(),
        idle_timeout: Duration::from_millis(raw.idle_timeout_ms),
        max_messages: raw.max_messages,
        max_bytes: raw.max_bytes,
        max_open: raw.max_open,
        closed_ttl: Duration::from_millis(raw.closed_ttl_ms),
    }))
}
