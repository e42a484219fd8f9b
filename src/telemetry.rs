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

/// gauge -> rendered labels -> value (endpoint health).
static GAUGES: LazyLock<Mutex<BTreeMap<&'static str, BTreeMap<String, i64>>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

fn gauge(metric: &'static str, labels: String, value: i64) {
    let mut guard = GAUGES.lock().unwrap_or_else(|e| e.into_inner());
    guard.entry(metric).or_default().insert(labels, value);
}

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

/// A dead-letter copy was not confirmed; the original stays unacked and the
/// copy is tried again after `retry_in`.
pub fn dead_letter_retry(
    message_id: &str,
    reason: &str,
    error: &dyn std::fmt::Display,
    retry_in: Duration,
) {
    tracing::error!(
        message_id,
        reason,
        %error,
        retry_in_ms = retry_in.as_millis() as u64,
        "dead letter not confirmed; original kept unacked, retrying"
    );
}

/// The broker refused the dead-letter copy itself: it is sent again without
/// the producer's headers and user_id.
pub fn dead_letter_reduced(message_id: &str, reason: &str, error: &str) {
    tracing::warn!(
        message_id,
        reason,
        error,
        "dead letter refused as it is; sending it without the producer's headers"
    );
}

/// A transaction stopped because its inbound channel was lost; the broker
/// redelivers the message.
pub fn abandoned(message_id: &str) {
    tracing::info!(
        message_id,
        "inbound channel lost; the broker will redeliver this message"
    );
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

/// An endpoint's health changed, or it was registered (up).
pub fn endpoint_up(endpoint: &str, up: bool) {
    gauge(
        "switchyard_endpoint_up",
        format!("endpoint=\"{endpoint}\""),
        i64::from(up),
    );
}

/// An endpoint failed at the connection or channel level: new messages skip
/// it until a probe finds it working.
pub fn endpoint_down(endpoint: &str, why: crate::broker::Down, error: &dyn std::fmt::Display) {
    let level = match why {
        crate::broker::Down::Connection => "connection",
        crate::broker::Down::Channel => "channel",
    };
    tracing::warn!(endpoint, level, %error, "endpoint down; skipping it and probing");
    endpoint_up(endpoint, false);
}

/// A probe or a publish found a down endpoint working again.
pub fn endpoint_recovered(endpoint: &str) {
    tracing::info!(endpoint, "endpoint up again; traffic returns to it");
    endpoint_up(endpoint, true);
}

/// A broker refused the credentials or vhost: only a configuration change helps.
pub fn broker_refused(broker: &str, uri: &str, reason: &str) {
    tracing::error!(broker, uri, reason, "broker refused the connection");
}

/// A broker blocked publishing (resource alarm): publishes wait, consuming pauses.
pub fn broker_blocked(broker: &str, reason: &str) {
    tracing::warn!(
        broker,
        reason,
        "broker blocked publishing (resource alarm); waiting, consuming paused"
    );
}

/// A broker lifted its publishing block.
pub fn broker_unblocked(broker: &str) {
    tracing::info!(broker, "broker unblocked publishing; resuming");
}

/// The broker refused a message itself (size, frame, user_id): it is
/// dead-lettered; the messages in flight with it are retried.
pub fn rejected(message_id: &str, branch: &str, endpoint: &str, error: &dyn std::fmt::Display) {
    tracing::warn!(message_id, branch, endpoint, %error, "message refused by the broker");
}

/// A channel closed under publishes in a way one message may have caused;
/// this one is retried alone on the same endpoint to find out.
pub fn isolating(message_id: &str, branch: &str, endpoint: &str, error: &dyn std::fmt::Display) {
    tracing::info!(message_id, branch, endpoint, %error, "retrying alone on the same endpoint");
}

/// Every endpoint of a branch with `outage = "wait"` is unreachable: the
/// message is held and consuming pauses until one recovers.
pub fn outage_wait(message_id: &str, branch: &str) {
    tracing::warn!(
        message_id,
        branch,
        "every endpoint unreachable; holding the message until one recovers"
    );
}

/// A branch that waited out an outage tries its list again.
pub fn outage_over(message_id: &str, branch: &str) {
    tracing::info!(message_id, branch, "outage over; trying the list again");
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
    let gauges = GAUGES.lock().unwrap_or_else(|e| e.into_inner());
    for (metric, series) in gauges.iter() {
        let _ = writeln!(out, "# TYPE {metric} gauge");
        for (labels, value) in series {
            let _ = writeln!(out, "{metric}{{{labels}}} {value}");
        }
    }
    drop(gauges);
    let guard = LABELLED.lock().unwrap_or_else(|e| e.into_inner());
    for (metric, series) in &guard.counts {
        let _ = writeln!(out, "# TYPE {metric} counter");
        for (labels, value) in series {
            let _ = writeln!(out, "{metric}{{{labels}}} {value}");
        }
    }
    out
}
