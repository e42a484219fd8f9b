//! `[journal]` and `[telemetry.otlp]` compiled: where each settled
//! message's record goes, and where spans are exported.

use super::BrokerSpec;
use super::error::InvalidKey;
use super::raw::{RawJournal, RawOtlp};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The stream every settled message leaves one record in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Journal {
    /// The broker the stream is on.
    pub broker: Arc<BrokerSpec>,
    /// The stream's name.
    pub stream: String,
    /// `x-max-age` when switchyard declares it (RabbitMQ's units:
    /// `Y`, `M`, `D`, `h`, `m`, `s`).
    pub max_age: String,
    /// `x-max-length-bytes` when switchyard declares it.
    pub max_bytes: u64,
    /// What happens while records cannot be written.
    pub on_unavailable: OnUnavailable,
    /// Records buffered for the writer before new ones are dropped
    /// (or, with `hold`, before new work waits).
    pub buffer: usize,
}

/// `journal.on_unavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnavailable {
    /// Forwarding goes on; records that cannot be written are counted
    /// and dropped.
    Drop,
    /// No new work is taken while the journal cannot be written.
    Hold,
}

impl OnUnavailable {
    /// The configuration word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Drop => "drop",
            Self::Hold => "hold",
        }
    }
}

impl Journal {
    /// One line for the startup summary and `check`.
    pub fn summary(journal: Option<&Self>) -> String {
        let Some(j) = journal else {
            return "off".to_owned();
        };
        format!(
            "stream \"{}\" on broker \"{}\" (max_age {}, max_bytes {}, on_unavailable {})",
            j.stream,
            j.broker.name,
            j.max_age,
            j.max_bytes,
            j.on_unavailable.as_str()
        )
    }
}

/// `[telemetry.otlp]`: spans exported over OTLP/HTTP.
#[derive(Debug, Clone, PartialEq)]
pub struct Otlp {
    /// The collector's base URL (`http://host:4318`); spans go to
    /// `{endpoint}/v1/traces`.
    pub endpoint: String,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// The share of new traces sampled (a sampled parent is always followed).
    pub sample_ratio: f64,
}

impl Otlp {
    /// One line for the startup summary and `check`.
    pub fn summary(otlp: Option<&Self>) -> String {
        let Some(o) = otlp else {
            return "off (traceparent still carried)".to_owned();
        };
        format!(
            "{}/v1/traces (service_name \"{}\", sample_ratio {})",
            o.endpoint.trim_end_matches('/'),
            o.service_name,
            o.sample_ratio
        )
    }
}

/// `[journal]`: `None` when disabled. Its broker defaults to the inbound
/// broker, else the first broker by name.
pub(super) fn compile_journal(
    raw: &RawJournal,
    brokers: &BTreeMap<String, Arc<BrokerSpec>>,
    inbound_broker: Option<&str>,
) -> Result<Option<Journal>, InvalidKey> {
    if !raw.enabled {
        return Ok(None);
    }
    let name = match (&raw.broker, inbound_broker) {
        (Some(name), _) => name.as_str(),
        (None, Some(inbound)) => inbound,
        (None, None) => match brokers.keys().next() {
            Some(first) => first.as_str(),
            None => return Err(InvalidKey::new("journal.broker", "no broker is defined")),
        },
    };
    let Some(broker) = brokers.get(name) else {
        let defined: Vec<&str> = brokers.keys().map(String::as_str).collect();
        return Err(InvalidKey::new(
            "journal.broker",
            format!(
                "unknown broker \"{name}\" (defined: {})",
                defined.join(", ")
            ),
        ));
    };
    if raw.stream.trim().is_empty() || raw.stream.len() > 255 {
        return Err(InvalidKey::new(
            "journal.stream",
            "must be a queue name of 1 to 255 bytes",
        ));
    }
    if !valid_max_age(&raw.max_age) {
        return Err(InvalidKey::new(
            "journal.max_age",
            format!(
                "\"{}\" is not a RabbitMQ age: a whole number and one of Y, M, D, h, m, s \
                 (e.g. \"7D\", \"12h\")",
                raw.max_age
            ),
        ));
    }
    if raw.max_bytes == 0 {
        return Err(InvalidKey::new("journal.max_bytes", "must be at least 1"));
    }
    let on_unavailable = match raw.on_unavailable.as_str() {
        "drop" => OnUnavailable::Drop,
        "hold" => OnUnavailable::Hold,
        other => {
            return Err(InvalidKey::new(
                "journal.on_unavailable",
                format!("\"{other}\" is not one of \"drop\", \"hold\""),
            ));
        }
    };
    if raw.buffer == 0 {
        return Err(InvalidKey::new("journal.buffer", "must be at least 1"));
    }
    Ok(Some(Journal {
        broker: broker.clone(),
        stream: raw.stream.clone(),
        max_age: raw.max_age.clone(),
        max_bytes: raw.max_bytes,
        on_unavailable,
        buffer: raw.buffer as usize,
    }))
}

/// RabbitMQ's `x-max-age` syntax: digits and one unit letter.
fn valid_max_age(age: &str) -> bool {
    let Some(unit) = age.chars().last() else {
        return false;
    };
    let digits = &age[..age.len() - unit.len_utf8()];
    matches!(unit, 'Y' | 'M' | 'D' | 'h' | 'm' | 's')
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && digits.bytes().any(|b| b != b'0')
}

/// Whether `authority` is `host` or `host:port`, as the exporter connects
/// to it: no credentials, a numeric port, no spaces.
fn collector_authority(authority: &str) -> bool {
    let (host, port) = match authority.rsplit_once(':') {
        // An IPv6 literal without a port: `[::1]`.
        Some((_, port)) if port.ends_with(']') => (authority, None),
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    };
    !host.is_empty()
        && !authority.contains(['@', ' ', '\t'])
        && port.is_none_or(|p| !p.is_empty() && p.parse::<u16>().is_ok())
}

/// `[telemetry.otlp]`: `None` when absent or without an endpoint.
pub(super) fn compile_otlp(raw: Option<&RawOtlp>) -> Result<Option<Otlp>, InvalidKey> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let Some(endpoint) = &raw.endpoint else {
        return Ok(None);
    };
    let key = |k: &str| format!("telemetry.otlp.{k}");
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"));
    let authority = rest.map(|r| r.split('/').next().unwrap_or_default());
    if !authority.is_some_and(collector_authority) || endpoint.contains(['?', '#']) {
        return Err(InvalidKey::new(
            key("endpoint"),
            format!(
                "\"{endpoint}\" is not an http:// or https:// URL of a collector \
                 (e.g. \"http://127.0.0.1:4318\")"
            ),
        ));
    }
    if raw.service_name.trim().is_empty() {
        return Err(InvalidKey::new(key("service_name"), "must not be empty"));
    }
    if !(0.0..=1.0).contains(&raw.sample_ratio) {
        return Err(InvalidKey::new(
            key("sample_ratio"),
            format!("{} is not between 0.0 and 1.0", raw.sample_ratio),
        ));
    }
    Ok(Some(Otlp {
        endpoint: endpoint.trim_end_matches('/').to_owned(),
        service_name: raw.service_name.clone(),
        sample_ratio: raw.sample_ratio,
    }))
}

#[cfg(test)]
mod tests {
    use super::{collector_authority, valid_max_age};

    #[test]
    fn a_collector_is_a_host_and_a_numeric_port_without_credentials() {
        for good in [
            "127.0.0.1:4318",
            "jaeger:4318",
            "collector",
            "[::1]:4318",
            "[::1]",
        ] {
            assert!(collector_authority(good), "{good}");
        }
        for bad in [
            "",
            ":4318",
            "jaeger:port",
            "jaeger:",
            "user:pw@jaeger:4318",
            "a b:1",
            "h:99999",
        ] {
            assert!(!collector_authority(bad), "{bad}");
        }
    }

    #[test]
    fn ages_are_read_as_rabbitmq_reads_them() {
        for good in ["7D", "12h", "1Y", "30m", "90s", "2M"] {
            assert!(valid_max_age(good), "{good}");
        }
        for bad in ["", "D", "7", "7d ", "0D", "-1D", "7 D", "1.5h", "7days"] {
            assert!(!valid_max_age(bad), "{bad}");
        }
    }
}
