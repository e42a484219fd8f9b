//! `switchyard ctl`: one request to a running forwarder's admin endpoint
//! (`/control`, `/registry`), and its answer as a person reads it or as
//! the JSON the server sent. Plain HTTP/1.1 with hyper's client
//! connection, one request per connection, bounded in time.

use crate::errors::escaped;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

/// The most a request and its answer may take.
const TIMEOUT: Duration = Duration::from_secs(15);

/// What to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// The group's state.
    Status,
    /// Pause the group.
    Pause,
    /// Resume it.
    Resume,
    /// Drain an endpoint.
    Drain(String),
    /// Undrain an endpoint.
    Undrain(String),
    /// Register (or renew) a service instance.
    Register {
        /// The branch.
        branch: String,
        /// The instance's name.
        name: String,
        /// Its routing key.
        routing_key: String,
        /// Its exchange (`""`: the default exchange).
        exchange: String,
        /// A key of `[brokers]`; `None`: the server's default.
        broker: Option<String>,
        /// The lease.
        ttl: Duration,
    },
    /// Unregister a service instance.
    Unregister {
        /// The branch.
        branch: String,
        /// The instance's name.
        name: String,
    },
}

/// Why a request got no good answer.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The admin endpoint could not be reached.
    #[error("cannot reach the admin endpoint at {addr}: {error}")]
    Unreachable {
        /// Where.
        addr: SocketAddr,
        /// What failed.
        error: String,
    },
    /// No answer in time.
    #[error("no answer from the admin endpoint at {0} within {secs} s", secs = TIMEOUT.as_secs())]
    Timeout(SocketAddr),
    /// The server refused the request: its status and reason.
    #[error("refused ({status}): {reason}")]
    Refused {
        /// The HTTP status.
        status: StatusCode,
        /// The server's reason.
        reason: String,
    },
}

impl Ask {
    fn request(&self) -> (Method, String, Option<Value>) {
        let segment = |s: &str| encode(s);
        match self {
            Self::Status => (Method::GET, "/control/status".into(), None),
            Self::Pause => (Method::POST, "/control/pause".into(), None),
            Self::Resume => (Method::POST, "/control/resume".into(), None),
            Self::Drain(e) => (
                Method::POST,
                format!("/control/endpoints/{}/drain", segment(e)),
                None,
            ),
            Self::Undrain(e) => (
                Method::POST,
                format!("/control/endpoints/{}/undrain", segment(e)),
                None,
            ),
            Self::Register {
                branch,
                name,
                routing_key,
                exchange,
                broker,
                ttl,
            } => {
                let mut body = json!({
                    "routing_key": routing_key,
                    "exchange": exchange,
                    "ttl_ms": u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                });
                if let Some(broker) = broker {
                    body["broker"] = json!(broker);
                }
                let path = format!("/registry/{}/{}", segment(branch), segment(name));
                (Method::PUT, path, Some(body))
            }
            Self::Unregister { branch, name } => (
                Method::DELETE,
                format!("/registry/{}/{}", segment(branch), segment(name)),
                None,
            ),
        }
    }

    /// One line saying what was done, for a person.
    pub fn done(&self) -> String {
        match self {
            Self::Status => String::new(),
            Self::Pause => "paused: no new message is taken until `switchyard ctl resume`".into(),
            Self::Resume => "resumed: taking messages again".into(),
            Self::Drain(e) => format!("drained {e}: every list skips it until undrained"),
            Self::Undrain(e) => format!("undrained {e}: traffic returns to it"),
            Self::Register {
                branch, name, ttl, ..
            } => format!(
                "registered {name} into {branch} for {} s (renew within the lease to stay)",
                ttl.as_secs()
            ),
            Self::Unregister { branch, name } => format!("unregistered {name} from {branch}"),
        }
    }
}

/// Sends `ask` to the admin endpoint at `addr` with `token`; the server's
/// JSON answer.
pub async fn send(addr: SocketAddr, token: &str, ask: &Ask) -> Result<Value, CtlError> {
    match tokio::time::timeout(TIMEOUT, exchange(addr, token, ask)).await {
        Ok(answer) => answer,
        Err(_) => Err(CtlError::Timeout(addr)),
    }
}

async fn exchange(addr: SocketAddr, token: &str, ask: &Ask) -> Result<Value, CtlError> {
    let unreachable = |error: String| CtlError::Unreachable { addr, error };
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(connection);
    let (method, path, body) = ask.request();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr.to_string())
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| unreachable(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
    let value: Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| json!({ "error": String::from_utf8_lossy(&bytes).trim().to_owned() }));
    if status.is_success() {
        Ok(value)
    } else {
        let reason = value["error"]
            .as_str()
            .map_or_else(|| value.to_string(), |r| escaped(r).into_owned());
        Err(CtlError::Refused { status, reason })
    }
}

/// The status as a person reads it; every name in it, which a service or
/// an operator chose, with its control and bidirectional formatting
/// characters escaped.
pub fn human_status(status: &Value) -> String {
    let text = |v: &Value| escaped(v.as_str().unwrap_or_default()).into_owned();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "group {} (instance {}), configuration generation {}",
        text(&status["group"]),
        text(&status["instance"]),
        status["generation"]
    );
    let paused = match status["paused_by"].as_object() {
        Some(by) => format!(
            "yes, since {} (by {})",
            text(&by["at"]),
            text(&by["instance"])
        ),
        None => "no".to_owned(),
    };
    let _ = writeln!(out, "paused: {paused}");
    let _ = writeln!(out, "endpoints:");
    for e in status["endpoints"].as_array().into_iter().flatten() {
        let registered = if e["registered"].as_bool() == Some(true) {
            "  (registered)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {:<28} {}{registered}",
            text(&e["name"]),
            text(&e["state"])
        );
    }
    let registrations = status["registrations"].as_array();
    match registrations.filter(|r| !r.is_empty()) {
        None => {
            let _ = writeln!(out, "registrations: none");
        }
        Some(list) => {
            let _ = writeln!(out, "registrations:");
            for r in list {
                let _ = writeln!(
                    out,
                    "  {}/{}  broker {} exchange \"{}\" routing key \"{}\", expires {}",
                    text(&r["branch"]),
                    text(&r["name"]),
                    text(&r["broker"]),
                    text(&r["exchange"]),
                    text(&r["routing_key"]),
                    text(&r["expires_at"])
                );
            }
        }
    }
    let _ = writeln!(out, "instances:");
    for i in status["instances"].as_array().into_iter().flatten() {
        let step = if i["in_step"].as_bool() == Some(true) {
            "in step"
        } else {
            "behind"
        };
        let _ = writeln!(
            out,
            "  {:<28} joined {}, last seen {}, {step}",
            text(&i["instance"]),
            text(&i["joined_at"]),
            text(&i["last_seen_at"])
        );
    }
    out
}

/// A path segment with everything but unreserved characters
/// percent-encoded.
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_travel_percent_encoded_in_the_path() {
        let ask = Ask::Drain("a b/c".into());
        let (method, path, body) = ask.request();
        assert_eq!(method, Method::POST);
        assert_eq!(path, "/control/endpoints/a%20b%2Fc/drain");
        assert_eq!(body, None);
    }

    #[test]
    fn a_registration_sends_its_lease_in_milliseconds() {
        let ask = Ask::Register {
            branch: "service".into(),
            name: "svc-1".into(),
            routing_key: "svc.1".into(),
            exchange: String::new(),
            broker: None,
            ttl: Duration::from_secs(30),
        };
        let (method, path, body) = ask.request();
        assert_eq!(
            (method, path.as_str()),
            (Method::PUT, "/registry/service/svc-1")
        );
        let body = body.unwrap();
        assert_eq!(body["ttl_ms"], 30_000);
        assert_eq!(body["routing_key"], "svc.1");
        assert!(body.get("broker").is_none());
    }
}
