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
use crate::routing::RoutingTable;
use brokers::compile_brokers;
use endpoints::{check_backup_lists, compile_endpoints};
use queue::queue_side;
use shared::{Result, names};
use std::sync::Arc;
use std::time::Duration;
use table::compile_table;

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

    let queue = queue_side(raw, &brokers, &known_broker)?;
    let prefetch = queue.as_ref().map(|(inbound, _)| inbound.prefetch);

    let endpoints = compile_endpoints(raw, &brokers, &known_broker)?;
    check_backup_lists(raw, &endpoints)?;
    let branches = compile_table(raw, &endpoints)?;

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

    let inbound_broker = queue.as_ref().map(|(inbound, _)| inbound.broker.as_str());
    let journal = super::journal::compile_journal(&raw.journal, &brokers, inbound_broker)?;
    let otlp = super::journal::compile_otlp(raw.telemetry.otlp.as_ref())?;
    let admin = super::control::Admin {
        tokens: &raw.admin.tokens,
        max_registrations: raw.admin.max_registrations,
    };
    let control = super::control::compile_control(
        &raw.control,
        admin,
        admin_listen,
        &brokers,
        inbound_broker,
    )?;

    Ok(Settings {
        name: raw.name.clone(),
        shutdown_timeout: Duration::from_millis(raw.shutdown_timeout_ms),
        worker_threads: (raw.worker_threads > 0).then_some(usize::from(raw.worker_threads)),
        queue,
        brokers,
        endpoints,
        routing: Arc::new(RoutingTable::new(branches)),
        admin_listen,
        sessions,
        http,
        journal,
        otlp,
        control,
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
