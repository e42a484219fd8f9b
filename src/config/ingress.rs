//! `[ingress.http]` compiled: an address, limits, tokens, TLS material.

use super::error::InvalidKey;
use super::raw::RawHttpIngress;
use super::{ClientIdentity, HttpIngress, IdentityError, read_client_identity};
use std::time::Duration;

/// The headers that mean something to HTTP itself: never copied into a
/// message, whatever `forward_headers` says.
const HTTP_OWN: [&str; 5] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "host",
    "te",
];

/// The headers that carry a client's credentials: a message would carry
/// them to everyone who reads its queue.
const CREDENTIALS: [&str; 3] = ["authorization", "proxy-authorization", "cookie"];

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
    if let Some(i) = raw.tokens.iter().position(|t| t.trim().is_empty()) {
        return Err(InvalidKey::new(
            format!("ingress.http.tokens[{i}]"),
            "is empty: every token must have a value (leave tokens out for no token, on a \
             loopback listen only)",
        ));
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
        ("body_timeout_ms", raw.body_timeout_ms),
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
    let forward_headers = compile_forward_headers(&raw.forward_headers)?;
    let tls = compile_tls(raw)?;
    Ok(HttpIngress {
        listen,
        max_body_bytes: raw.max_body_bytes,
        max_in_flight,
        request_timeout: Duration::from_millis(raw.request_timeout_ms),
        body_timeout: Duration::from_millis(raw.body_timeout_ms),
        tokens: raw.tokens.iter().map(|t| t.trim().to_owned()).collect(),
        forward_headers,
        idempotency_ttl: Duration::from_millis(raw.idempotency_ttl_ms),
        idempotency_max_keys: raw.idempotency_max_keys as usize,
        max_connections: raw.max_connections as usize,
        header_timeout: Duration::from_millis(raw.header_timeout_ms),
        tls,
    })
}

/// `forward_headers`, lower-cased, each an HTTP header name that may be
/// forwarded (no credential, none of HTTP's own or the forwarder's).
fn compile_forward_headers(names: &[String]) -> Result<Vec<String>, InvalidKey> {
    let mut forward_headers = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let lower = name.trim().to_ascii_lowercase();
        if hyper::header::HeaderName::from_bytes(lower.as_bytes()).is_err() {
            return Err(InvalidKey::new(
                format!("ingress.http.forward_headers[{i}]"),
                format!("\"{name}\" is not an HTTP header name"),
            ));
        }
        let never = if CREDENTIALS.contains(&lower.as_str()) {
            Some("a credential: messages would carry it to every reader of their queues")
        } else if HTTP_OWN.contains(&lower.as_str()) {
            Some("HTTP's own, not the request's content")
        } else if lower.starts_with(crate::wire::OWN_PREFIX) {
            Some("the forwarder's own")
        } else {
            None
        };
        if let Some(why) = never {
            return Err(InvalidKey::new(
                format!("ingress.http.forward_headers[{i}]"),
                format!("\"{name}\" is never forwarded: {why}"),
            ));
        }
        forward_headers.push(lower);
    }
    Ok(forward_headers)
}

/// The listener's certificate and key, both or neither.
fn compile_tls(raw: &RawHttpIngress) -> Result<Option<ClientIdentity>, InvalidKey> {
    let key = |k: &str| format!("ingress.http.{k}");
    Ok(match (&raw.cert_file, &raw.key_file) {
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
