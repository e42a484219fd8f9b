//! Log events and metrics, named once. Every decision the forwarder makes
//! (a failover, a dead letter, a reconnect) is one function here that logs
//! one event, with message_id, branch and endpoint where they apply, and
//! counts it. [`render`] writes the counters in the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

static CONSUMED: AtomicU64 = AtomicU64::new(0);
static IN_FLIGHT: AtomicI64 = AtomicI64::new(0);
static CONFIG_GENERATION: AtomicU64 = AtomicU64::new(0);
/// metric -> rendered labels -> count.
static LABELLED: LazyLock<Mutex<Labelled>> = LazyLock::new(|| Mutex::new(Labelled::default()));

#[derive(Default)]
struct Labelled {
    counts: BTreeMap<&'static str, BTreeMap<String, u64>>,
    /// Reused to render labels, so counting an existing series allocates
    /// nothing (it runs once per forwarded copy).
    scratch: String,
}

fn count(metric: &'static str, labels: std::fmt::Arguments<'_>) {
    let mut guard = LABELLED.lock().unwrap_or_else(|e| e.into_inner());
    let Labelled { counts, scratch } = &mut *guard;
    scratch.clear();
    let _ = scratch.write_fmt(labels);
    let series = counts.entry(metric).or_default();
    match series.get_mut(scratch.as_str()) {
        Some(n) => *n += 1,
        None => {
            series.insert(scratch.clone(), 1);
        }
    }
}

/// A message was taken from the inbound queue.
pub fn consumed() {
    CONSUMED.fetch_add(1, Ordering::Relaxed);
}

/// A transaction started (+1) or ended (-1).
pub fn in_flight(delta: i64) {
    IN_FLIGHT.fetch_add(delta, Ordering::Relaxed);
}

/// The routing configuration now live.
pub fn config_loaded(generation: u64, branches: usize) {
    CONFIG_GENERATION.store(generation, Ordering::Relaxed);
    tracing::info!(generation, branches, "routing configuration live");
}

/// A branch's copy was confirmed by `endpoint`.
pub fn forwarded(message_id: &str, branch: &str, endpoint: &str) {
    tracing::debug!(message_id, branch, endpoint, "delivered");
    count(
        "switchyard_messages_forwarded_total",
        format_args!("branch=\"{branch}\",endpoint=\"{endpoint}\""),
    );
}

/// An attempt on `endpoint` failed and the endpoint will be tried again.
pub fn retry(message_id: &str, branch: &str, endpoint: &str, error: &dyn std::fmt::Display) {
    tracing::info!(message_id, branch, endpoint, %error, "retrying endpoint");
    count(
        "switchyard_endpoint_retries_total",
        format_args!("branch=\"{branch}\",endpoint=\"{endpoint}\""),
    );
}

/// A branch leaves `from` for `to` (`None`: its list is exhausted).
pub fn failover(
    message_id: &str,
    branch: &str,
    from: &str,
    to: Option<&str>,
    error: &dyn std::fmt::Display,
) {
    match to {
        Some(to) => {
            tracing::warn!(message_id, branch, endpoint = from, next = to, %error, "failover");
            count(
                "switchyard_failovers_total",
                format_args!("branch=\"{branch}\",from=\"{from}\",to=\"{to}\""),
            );
        }
        None => {
            tracing::warn!(message_id, branch, endpoint = from, %error, "backup list exhausted")
        }
    }
}

/// A message was dead-lettered.
pub fn dead_lettered(
    message_id: &str,
    reason: &str,
    error: &str,
    failed: &[String],
    delivered: &[String],
    how: &str,
) {
    tracing::warn!(
        message_id,
        reason,
        error,
        failed = ?failed,
        delivered = ?delivered,
        how,
        "dead-lettered"
    );
    count(
        "switchyard_dead_lettered_total",
        format_args!("reason=\"{reason}\""),
    );
}

/// Dead-lettering itself failed; the message goes back to the inbound queue.
pub fn dead_letter_failed(message_id: &str, reason: &str, error: &dyn std::fmt::Display) {
    tracing::error!(message_id, reason, %error, "dead letter not confirmed; message requeued");
}

/// A broker could not be reached.
pub fn broker_unreachable(broker: &str, uri: &str, error: &str, retry_in: Duration) {
    tracing::warn!(
        broker,
        uri,
        error,
        retry_in_ms = retry_in.as_millis() as u64,
        "broker unreachable"
    );
}

/// A broker is reachable again.
pub fn broker_reconnected(broker: &str, uri: &str) {
    tracing::info!(broker, uri, "broker reconnected");
}

/// An endpoint's channel was dropped and will be reopened.
pub fn channel_reset(endpoint: &str, why: &str) {
    tracing::warn!(endpoint, why, "reopening publish channel");
}

/// A `basic.return` named a publish whose outcome was already decided.
pub fn late_return(endpoint: &str, publish_id: u64) {
    tracing::warn!(endpoint, publish_id, "return for a publish already settled");
}

/// The inbound consumer was lost and is being reopened.
pub fn consumer_lost(queue: &str, error: &str) {
    tracing::warn!(queue, error, "inbound consumer lost; reconnecting");
}

/// The inbound consumer is (again) consuming.
pub fn consuming(queue: &str, prefetch: u16) {
    tracing::info!(queue, prefetch, "consuming");
}

/// All counters in the Prometheus text format.
pub fn render() -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# TYPE switchyard_messages_consumed_total counter\nswitchyard_messages_consumed_total {}",
        CONSUMED.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# TYPE switchyard_in_flight gauge\nswitchyard_in_flight {}",
        IN_FLIGHT.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# TYPE switchyard_config_generation gauge\nswitchyard_config_generation {}",
        CONFIG_GENERATION.load(Ordering::Relaxed)
    );
    let guard = LABELLED.lock().unwrap_or_else(|e| e.into_inner());
    for (metric, series) in &guard.counts {
        let _ = writeln!(out, "# TYPE {metric} counter");
        for (labels, value) in series {
            let _ = writeln!(out, "{metric}{{{labels}}} {value}");
        }
    }
    out
}
