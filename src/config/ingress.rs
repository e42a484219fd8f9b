//! `[ingress.http]` compiled: an address, limits, tokens, TLS material.

use super::error::InvalidKey;
use super::raw::RawHttpIngress;
use super::{HttpIngress, IdentityError, read_client_identity};
use std::time::Duration;

/// The headers that mean something to HTTP itself, or carry the request's
/// secrets: never copied into a message, whatever `forward_headers` says.
const NEVER_FORWARDED: [&str; 6] = [
    "authorization",
    "content-length",
    "transfer-encoding",
    "connection",
    "host",
    "cookie",
];

pub(super) fn compile_http(raw: &RawHttpIngress, prefetch: u16) -> Result<HttpIngress, InvalidKey> {
    let key = |k: &str| format!("ingress.http.{k}");
    let listen = listen_address(&raw.listen).ok_or_else(|| {
        InvalidKey::new(
            key("listen"),
            format!(
                "\"{}\" is not a host:port address (or a port, for loopback)",
                raw.listen
            ),
        )
    })?;
    if raw.tokens.iter().any(|t| t.trim().is_empty()) {
        return Err(InvalidKey::new(key("tokens"), "holds an empty token"));
    }
    if !listen.ip().is_loopback() && raw.tokens.is_empty() && !raw.allow_anonymous {
        return Err(InvalidKey::new(
            key("listen"),
            format!(
                "{listen} is reachable from other hosts but no tokens are set: set \
                 ingress.http.tokens (e.g. SWITCHYARD__INGRESS__HTTP__TOKENS), listen on \
                 127.0.0.1, or set allow_anonymous = true"
            ),
        ));
    }
    for (name, value) in [
        ("max_body_bytes", raw.max_body_bytes),
        ("request_timeout_ms", raw.request_timeout_ms),
        ("idempotency_ttl_ms", raw.idempotency_ttl_ms),
        ("idempotency_max_keys", u64::from(raw.idempotency_max_keys)),
        ("max_connections", u64::from(raw.max_connections)),
        ("header_timeout_ms", raw.header_timeout_ms),
    ] {
        if value == 0 {
            return Err(InvalidKey::new(key(name), "must be at least 1"));
        }
    }
    let max_in_flight = raw.max_in_flight.unwrap_or(u32::from(prefetch));
    if max_in_flight == 0 {
        return Err(InvalidKey::new(key("max_in_flight"), "must be at least 1"));
    }
    let mut forward_headers = Vec::new();
    for (i, name) in raw.forward_headers.iter().enumerate() {
        let lower = name.trim().to_ascii_lowercase();
        if hyper::header::HeaderName::from_bytes(lower.as_bytes()).is_err() {
            return Err(InvalidKey::new(
                format!("ingress.http.forward_headers[{i}]"),
                format!("\"{name}\" is not an HTTP header name"),
            ));
        }
        if NEVER_FORWARDED.contains(&lower.as_str()) || lower.starts_with(crate::wire::OWN_PREFIX) {
            return Err(InvalidKey::new(
                format!("ingress.http.forward_headers[{i}]"),
                format!("\"{name}\" is never forwarded (HTTP's own, a secret, or the forwarder's)"),
            ));
        }
        forward_headers.push(lower);
    }
    let tls = match (&raw.cert_file, &raw.key_file) {
        (None, None) => None,
        (Some(cert), Some(key_file)) => {
            Some(read_client_identity(cert, key_file).map_err(|e| match e {
                IdentityError::Cert(why) => InvalidKey::new(key("cert_file"), why),
                IdentityError::Key(why) => InvalidKey::new(key("key_file"), why),
            })?)
        }
        (Some(_), None) => {
            return Err(InvalidKey::new(
                key("key_file"),
                "missing: cert_file needs its key",
            ));
        }
        (None, Some(_)) => {
            return Err(InvalidKey::new(
                key("cert_file"),
                "missing: key_file needs its certificate",
            ));
        }
    };
    Ok(HttpIngress {
        listen,
        max_body_bytes: raw.max_body_bytes,
        max_in_flight,
        request_timeout: Duration::from_millis(raw.request_timeout_ms),
        tokens: raw.tokens.iter().map(|t| t.trim().to_owned()).collect(),
        forward_headers,
        idempotency_ttl: Duration::from_millis(raw.idempotency_ttl_ms),
        idempotency_max_keys: raw.idempotency_max_keys as usize,
        max_connections: raw.max_connections as usize,
        header_timeout: Duration::from_millis(raw.header_timeout_ms),
        tls,
    })
}

/// `host:port`, or a bare port (`9090`, `:9090`) on the loopback address:
/// a listener (admin or ingress) is not exposed unless a host says so.
pub(super) fn listen_address(text: &str) -> Option<std::net::SocketAddr> {
    let port = text.strip_prefix(':').unwrap_or(text);
    match port.parse::<u16>() {
        Ok(port) => Some(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
        Err(_) => text.parse().ok(),
    }
}
