//! `[control]` and the control side of `[admin]` compiled: the stream a
//! group's commands travel on, and who may send them.

use super::BrokerSpec;
use super::error::InvalidKey;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// `[control]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawControl {
    /// Whether this instance follows its group's commands (and takes them
    /// on its admin endpoint, with `admin.tokens`).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The stream the group's commands are appended to, on the inbound
    /// broker (else the first broker).
    #[serde(default = "default_control_stream")]
    pub stream: String,
    /// `x-max-length-bytes` when switchyard declares the stream.
    #[serde(default = "default_control_max_bytes")]
    pub max_bytes: u64,
    /// How often an instance says it is alive; one silent for three of
    /// its own intervals leaves the status.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
}

impl Default for RawControl {
    fn default() -> Self {
        Self {
            enabled: true,
            stream: default_control_stream(),
            max_bytes: default_control_max_bytes(),
            heartbeat_ms: default_heartbeat_ms(),
        }
    }
}

fn yes() -> bool {
    true
}

fn default_control_stream() -> String {
    "switchyard.control".to_owned()
}

fn default_control_max_bytes() -> u64 {
    64 << 20
}

fn default_heartbeat_ms() -> u64 {
    10_000
}

/// The range of `heartbeat_ms`: often enough to notice an instance gone
/// within minutes, seldom enough to add little to the stream.
const HEARTBEAT_MS: std::ops::RangeInclusive<u64> = 100..=300_000;

/// The smallest `max_bytes`: retention must always leave the newest
/// snapshot (one every 500 records of a few hundred bytes, and a snapshot
/// of up to `max_registrations` registrations) and what follows it.
const MIN_MAX_BYTES: u64 = 1 << 20;

/// The group's command stream, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// The broker the stream is on: the inbound broker, else the first.
    pub broker: Arc<BrokerSpec>,
    /// The stream's name.
    pub stream: String,
    /// `x-max-length-bytes` when switchyard declares it.
    pub max_bytes: u64,
    /// How often this instance says it is alive.
    pub heartbeat: std::time::Duration,
    /// Bearer tokens `/control` and `/registry` accept; empty: those
    /// paths answer 403 on this instance.
    pub tokens: Vec<String>,
    /// Registrations the group holds at once, at most.
    pub max_registrations: usize,
}

impl Control {
    /// One line for the startup summary and `check`.
    pub fn summary(control: Option<&Self>) -> String {
        let Some(c) = control else {
            return "off".to_owned();
        };
        let commands = match c.tokens.len() {
            0 => "commands refused here (no admin.tokens)".to_owned(),
            1 => "commands with 1 token".to_owned(),
            n => format!("commands with {n} tokens"),
        };
        format!(
            "stream \"{}\" on broker \"{}\" (max_bytes {}), {commands}, max_registrations {}",
            c.stream, c.broker.name, c.max_bytes, c.max_registrations
        )
    }
}

/// The keys of `[admin]` control reads.
pub(super) struct Admin<'a> {
    /// `admin.tokens`.
    pub tokens: &'a [String],
    /// `admin.max_registrations`.
    pub max_registrations: u32,
}

/// `[control]` with `[admin]`'s tokens: `None` when control is off. A
/// non-loopback admin listener that would take commands needs tokens.
pub(super) fn compile_control(
    raw: &RawControl,
    admin: Admin<'_>,
    admin_listen: Option<SocketAddr>,
    brokers: &BTreeMap<String, Arc<BrokerSpec>>,
    inbound_broker: Option<&str>,
) -> Result<Option<Control>, InvalidKey> {
    if let Some(i) = admin.tokens.iter().position(|t| t.trim().is_empty()) {
        return Err(InvalidKey::new(
            format!("admin.tokens[{i}]"),
            "is empty: every token must have a value",
        ));
    }
    if !raw.enabled {
        return Ok(None);
    }
    if let Some(listen) = admin_listen.filter(|l| !l.ip().is_loopback())
        && admin.tokens.is_empty()
    {
        return Err(InvalidKey::new(
            "admin.tokens",
            format!(
                "admin.listen {listen} is reachable from other hosts, and control is on but no \
                 tokens are set: set admin.tokens (e.g. SWITCHYARD__ADMIN__TOKENS), listen on \
                 127.0.0.1, or set [control] enabled = false to serve /healthz, /readyz and \
                 /metrics alone"
            ),
        ));
    }
    if raw.stream.trim().is_empty() || raw.stream.len() > 255 {
        return Err(InvalidKey::new(
            "control.stream",
            "must be a queue name of 1 to 255 bytes",
        ));
    }
    if raw.max_bytes < MIN_MAX_BYTES {
        return Err(InvalidKey::new(
            "control.max_bytes",
            format!(
                "must be at least {MIN_MAX_BYTES} (1 MiB), so that retention never trims the \
                 newest snapshot of the group's state"
            ),
        ));
    }
    if !HEARTBEAT_MS.contains(&raw.heartbeat_ms) {
        return Err(InvalidKey::new(
            "control.heartbeat_ms",
            format!(
                "must be {} to {} (5 minutes)",
                HEARTBEAT_MS.start(),
                HEARTBEAT_MS.end()
            ),
        ));
    }
    if admin.max_registrations == 0 {
        return Err(InvalidKey::new(
            "admin.max_registrations",
            "must be at least 1",
        ));
    }
    let broker = inbound_broker
        .and_then(|name| brokers.get(name))
        .or_else(|| brokers.values().next());
    let Some(broker) = broker else {
        return Ok(None);
    };
    Ok(Some(Control {
        broker: broker.clone(),
        stream: raw.stream.clone(),
        max_bytes: raw.max_bytes,
        heartbeat: std::time::Duration::from_millis(raw.heartbeat_ms),
        tokens: admin.tokens.iter().map(|t| t.trim().to_owned()).collect(),
        max_registrations: usize::try_from(admin.max_registrations).unwrap_or(usize::MAX),
    }))
}
