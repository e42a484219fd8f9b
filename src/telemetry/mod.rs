//! Log events and metrics, named once, held in a [`Telemetry`] handle.
//!
//! A forwarder gets one handle when it is built and passes clones of it to
//! every stage that emits: connectors, publishers, endpoint health,
//! deliveries, settlement, the consumer. Every decision the forwarder makes
//! (a failover, a dead letter, a reconnect) is one method here that logs one
//! event, with message_id, branch and endpoint where they apply, and counts
//! it. Nothing is global: two forwarders in one process keep separate
//! metrics.
//!
//! Metrics live in a `prometheus-client` registry and [`Telemetry::render`]
//! writes them in the Prometheus text format (docs/operations.md lists them). Labels are
//! only names from the configuration (branches, endpoints, dead-letter
//! reasons), never anything a message carries, so every series is bounded.
//! On the hot path counting a forwarded copy is an atomic increment behind a
//! read lock, with no allocation once the series exists.
//!
//! Logs never carry a message body or a header value, only message ids and
//! the names of branches, endpoints and brokers. The client library's own
//! warnings and errors are kept out of the log ([`library_event_allowed`]):
//! one of them dumps every returned message whole, others announce giving up
//! while switchyard goes on retrying; each condition they report is logged
//! here in switchyard's words.

mod broker;
mod consumer;
mod control;
mod delivery;
mod endpoints;
mod http;
mod journal;
mod lifecycle;
mod metrics;
mod sessions;

pub(crate) use consumer::UnreadableLoss;
pub(crate) use delivery::Replay;
pub(crate) use http::Listener;
pub(crate) use lifecycle::StartupSummary;

use metrics::Metrics;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The `Content-Type` of [`Telemetry::render`]'s output.
pub const METRICS_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Crates whose own log events at info, warn and error are dropped.
const LIBRARIES: [&str; 2] = ["lapin", "amq_protocol"];

/// Whether an event or span may reach the log: everything except the AMQP
/// client library's own info, warn and error events, which may carry a whole
/// returned message (body and headers) or contradict what switchyard does
/// next. Its debug and trace events stay available through `RUST_LOG`.
pub fn library_event_allowed(meta: &tracing::Metadata<'_>) -> bool {
    let library = LIBRARIES.iter().any(|l| {
        meta.target()
            .strip_prefix(l)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    });
    !(library && meta.is_event() && *meta.level() <= tracing::Level::INFO)
}

/// The forwarder's log events and metrics. Cheap to clone: one `Arc`.
#[derive(Clone)]
pub struct Telemetry {
    metrics: Arc<Metrics>,
}

/// Whether an event last logged at `last` (milliseconds, 0: never) is due
/// again at `now_ms` (at least 1), at most once a minute; claims it if so,
/// so of threads that race only one logs.
fn once_a_minute(last: &AtomicU64, now_ms: u64) -> bool {
    once_every(last, now_ms, 60_000)
}

/// The mutex's value, whether or not a holder panicked.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`once_a_minute`], at most once every `every_ms`.
fn once_every(last: &AtomicU64, now_ms: u64, every_ms: u64) -> bool {
    let logged = last.load(Ordering::Relaxed);
    let due = logged == 0 || now_ms.saturating_sub(logged) >= every_ms;
    due && last
        .compare_exchange(logged, now_ms, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// A handle with every metric at zero.
    pub fn new() -> Self {
        Self {
            metrics: Arc::new(Metrics::new()),
        }
    }

    /// Every metric in the Prometheus text format ([`METRICS_CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.metrics.registry);
        out
    }

    /// Milliseconds since the metrics were made, at least 1 (0 means
    /// "never" to the throttles).
    fn now_ms(&self) -> u64 {
        (self.metrics.started.elapsed().as_millis() as u64).max(1)
    }
}

/// The value of `series` (name and labels, as rendered) in `text`, the
/// Prometheus text [`Telemetry::render`] writes; for unit tests.
#[cfg(test)]
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
