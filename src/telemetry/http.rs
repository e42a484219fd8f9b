//! Log events and metrics of the HTTP ingress and of the listeners'
//! connections. Events name the request by its message id and never carry
//! a body, a header value or a token. Refusals are counted one by one and
//! logged at most once a second per status, so a flood of bad requests
//! cannot flood the log.

use super::Telemetry;
use super::metrics::{CodeLabels, ListenerLabels, REFUSAL_CODES};
use std::fmt::Display;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often one refusal status may be logged, in milliseconds.
const REFUSAL_LOG_EVERY_MS: u64 = 1_000;

/// One of the forwarder's own listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The admin endpoint (`[admin] listen`).
    Admin,
    /// The HTTP ingress (`[ingress.http] listen`).
    Ingress,
}

impl Listener {
    fn label(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Ingress => "ingress",
        }
    }
}

impl Telemetry {
    /// The HTTP ingress listens.
    pub fn http_listening(&self, addr: std::net::SocketAddr, tls: bool) {
        let scheme = if tls { "https" } else { "http" };
        tracing::info!(%addr, scheme, "HTTP ingress listening: POST /messages/{{routing_key}}");
    }

    /// A request was answered `code` after `took`: counted; failures
    /// logged one event each, refusals through [`Self::http_refused`]'s
    /// throttle.
    pub fn http_answered(&self, code: u16, took: Duration, message_id: &str, reason: &str) {
        self.metrics.http_seconds.observe(took.as_secs_f64());
        match code {
            400..=499 | 501 => self.http_refused(code, message_id, reason),
            _ => {
                self.count_answer(code);
                if code >= 500 {
                    tracing::warn!(code, message_id, reason, "HTTP request failed");
                } else {
                    tracing::debug!(code, message_id, reason, "HTTP request answered");
                }
            }
        }
    }

    /// A request was refused with `code`, by the ingress or by the HTTP
    /// layer under it: counted, and logged when this status was not logged
    /// in the last second, with how many were refused since its last line.
    pub fn http_refused(&self, code: u16, message_id: &str, reason: &str) {
        self.count_answer(code);
        let slot = REFUSAL_CODES
            .iter()
            .position(|c| *c == code)
            .unwrap_or(REFUSAL_CODES.len());
        let log = &self.metrics.refusal_logs[slot];
        log.since.fetch_add(1, Ordering::Relaxed);
        if super::once_every(&log.logged_ms, self.now_ms(), REFUSAL_LOG_EVERY_MS) {
            let refused = log.since.swap(0, Ordering::Relaxed);
            tracing::info!(
                code,
                message_id,
                reason,
                refused,
                "HTTP request refused (each status logged at most once a second: `refused` \
                 counts this one and those since its last line; switchyard_http_requests_total \
                 counts every one)"
            );
        }
    }

    fn count_answer(&self, code: u16) {
        self.metrics
            .http_requests
            .get_or_create(&CodeLabels { code })
            .inc();
    }

    /// An ingress connection failed (a client that went away, a TLS
    /// handshake that failed, a head that was never finished).
    pub fn http_connection_failed(&self, error: &dyn Display) {
        tracing::debug!(%error, "HTTP ingress connection failed");
    }

    /// The ingress could not accept a connection (out of descriptors, most
    /// likely); it pauses before the next accept.
    pub fn http_accept_failed(&self, error: &dyn Display) {
        tracing::warn!(%error, "HTTP ingress cannot accept connections; pausing");
    }

    /// `listener` stopped with `open` connections still serving after
    /// `bound`: it no longer waits for them, and the process may end under
    /// them.
    pub fn connections_left(&self, listener: Listener, open: usize, bound: Duration) {
        tracing::warn!(
            listener = listener.label(),
            open,
            bound_ms = super::millis(bound),
            "connections still open when the listener stopped; no longer waited for"
        );
    }

    /// `listener` closed an idle connection to make room for a new one.
    /// Counted, not logged: a flood of idle clients would be one line each.
    pub fn connection_shed(&self, listener: Listener) {
        let listener = listener.label();
        self.metrics
            .connections_shed
            .get_or_create(&ListenerLabels { listener })
            .inc();
    }
}
