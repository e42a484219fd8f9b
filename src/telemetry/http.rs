//! Log events and metrics of the HTTP ingress. Events name the request by
//! its message id and never carry a body, a header value or a token.

use super::Telemetry;
use super::metrics::CodeLabels;
use std::fmt::Display;
use std::time::Duration;

impl Telemetry {
    /// The HTTP ingress listens.
    pub fn http_listening(&self, addr: std::net::SocketAddr, tls: bool) {
        let scheme = if tls { "https" } else { "http" };
        tracing::info!(%addr, scheme, "HTTP ingress listening: POST /messages/{{routing_key}}");
    }

    /// A request was answered `code` after `took`; refusals and failures
    /// are logged with their reason, one event each.
    pub fn http_answered(&self, code: u16, took: Duration, message_id: &str, reason: &str) {
        let metrics = &self.metrics;
        metrics
            .http_requests
            .get_or_create(&CodeLabels { code })
            .inc();
        metrics.http_seconds.observe(took.as_secs_f64());
        match code {
            // A flood past max_in_flight is counted, not logged request by request.
            200..=299 | 429 => tracing::debug!(code, message_id, reason, "HTTP request answered"),
            500..=599 => tracing::warn!(code, message_id, reason, "HTTP request failed"),
            _ => tracing::info!(code, message_id, reason, "HTTP request refused"),
        }
    }

    /// An ingress connection failed (a client that went away, a malformed
    /// request, a TLS handshake that failed).
    pub fn http_connection_failed(&self, error: &dyn Display) {
        tracing::debug!(%error, "HTTP ingress connection failed");
    }

    /// The ingress could not accept a connection (out of descriptors, most
    /// likely); it pauses before the next accept.
    pub fn http_accept_failed(&self, error: &dyn Display) {
        tracing::warn!(%error, "HTTP ingress cannot accept connections; pausing");
    }
}
