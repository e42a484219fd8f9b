//! Log events and metrics of the journal and of trace context: records
//! written and dropped, the stream's state, malformed `traceparent`s and
//! span export. Drops are counted one by one and logged at most once every
//! ten seconds, with how many since the last line.

use super::{Telemetry, once_every};
use std::sync::atomic::Ordering;

/// How often drops may be logged, in milliseconds.
const DROPS_LOG_EVERY_MS: u64 = 10_000;

impl Telemetry {
    /// The journal writes to `stream` on `broker`.
    pub fn journal_ready(&self, stream: &str, broker: &str) {
        self.metrics.journal_writable.set(1);
        tracing::info!(stream, broker, "journal writable");
    }

    /// The journal cannot write: records wait in its buffer (and, with
    /// `hold`, no new work is taken).
    pub fn journal_unavailable(
        &self,
        stream: &str,
        broker: &str,
        error: &dyn std::fmt::Display,
        hold: bool,
    ) {
        let was = self.metrics.journal_writable.set(0);
        let then = if hold {
            "no new work is taken until it can"
        } else {
            "records wait in its buffer; once it is full they are dropped and counted"
        };
        if was == 1 {
            tracing::warn!(stream, broker, %error, "journal cannot write: {then}");
        } else {
            tracing::debug!(stream, broker, %error, "journal still cannot write");
        }
    }

    /// `n` records were written and confirmed.
    pub fn journal_written(&self, n: u64) {
        self.metrics.journal_records.inc_by(n);
    }

    /// `n` records were dropped (`why`): counted, and logged at most once
    /// every ten seconds with the count since the last line.
    pub fn journal_dropped(&self, n: u64, why: &str) {
        let m = &self.metrics;
        m.journal_dropped.inc_by(n);
        let since = m.journal_dropped_since.fetch_add(n, Ordering::Relaxed) + n;
        if once_every(
            &m.journal_dropped_logged_ms,
            self.now_ms(),
            DROPS_LOG_EVERY_MS,
        ) {
            m.journal_dropped_since.fetch_sub(since, Ordering::Relaxed);
            tracing::warn!(dropped = since, why, "journal records dropped");
        }
    }

    /// A message or request carried a malformed `traceparent`.
    pub fn trace_context_malformed(&self, message_id: &str) {
        self.metrics.trace_context_malformed.inc();
        tracing::debug!(message_id, "malformed traceparent: a new trace is started");
    }

    /// `n` spans were accepted by the collector.
    pub fn spans_exported(&self, n: u64) {
        self.metrics.spans_exported.inc_by(n);
    }

    /// `n` spans were dropped (`why`): counted, and logged at most once
    /// every ten seconds with the count since the last line.
    pub fn spans_dropped(&self, n: u64, why: &dyn std::fmt::Display) {
        let m = &self.metrics;
        m.spans_dropped.inc_by(n);
        let since = m.spans_dropped_since.fetch_add(n, Ordering::Relaxed) + n;
        if once_every(
            &m.spans_dropped_logged_ms,
            self.now_ms(),
            DROPS_LOG_EVERY_MS,
        ) {
            m.spans_dropped_since.fetch_sub(since, Ordering::Relaxed);
            tracing::warn!(dropped = since, %why, "spans dropped");
        }
    }
}
