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

mod http;
mod metrics;
mod sessions;

use crate::wire::Ignored;
pub use http::Listener;
use metrics::{EndpointLabels, FailoverLabels, Metrics, NodeLabels, ReasonLabels};
use std::fmt::Display;
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

/// One transaction counted in `switchyard_in_flight` while it lives.
#[must_use = "the transaction ends when this is dropped"]
pub struct InFlight(Arc<Metrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

/// A session's part in a failover: its id, and how many of its messages
/// the next endpoint is sent again before the new one.
#[derive(Debug, Clone, Copy)]
pub struct Replay<'a> {
    /// The session id.
    pub session: &'a str,
    /// Messages replayed.
    pub replaying: usize,
}

/// What the startup summary says.
#[derive(Debug)]
pub struct StartupSummary<'a> {
    /// The configuration file, when there is one.
    pub config_file: Option<&'a std::path::Path>,
    /// `name = uri` per broker, passwords masked.
    pub brokers: String,
    /// The inbound queue and its broker.
    pub inbound: String,
    /// `inbound.prefetch`.
    pub prefetch: u16,
    /// `branch: endpoint -> backup ...` per branch.
    pub branches: String,
    /// The dead-letter mode, exchange and routing key.
    pub dead_letter: String,
    /// The admin listener's address, or `disabled`.
    pub admin: String,
    /// `off`, or `on` with every `[sessions]` setting.
    pub sessions: String,
    /// `off`, or where the HTTP ingress listens and its limits.
    pub http: String,
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

    /// A message not from a trusted user carried headers of the
    /// forwarder's (`ignored`): each is counted, and each kind logged at
    /// most once a minute, without its value.
    pub fn untrusted_headers(&self, message_id: &str, user_id: Option<&str>, ignored: Ignored) {
        let now_ms = self.now_ms();
        for kind in ignored.kinds() {
            let i = kind.index();
            self.metrics.untrusted_headers[i].inc();
            if once_a_minute(&self.metrics.untrusted_logged_ms[i], now_ms) {
                tracing::warn!(
                    message_id,
                    header = kind.label(),
                    user_id = user_id.unwrap_or("-"),
                    "ignored and stripped a header of the forwarder's on a message from a user not in inbound.trusted_users (logged at most once a minute per header; switchyard_untrusted_headers_total counts them all)"
                );
            }
        }
    }

    /// Milliseconds since the metrics were made, at least 1 (0 means
    /// "never" to the throttles).
    fn now_ms(&self) -> u64 {
        (self.metrics.started.elapsed().as_millis() as u64).max(1)
    }

    /// The forwarder starts: what it runs with.
    pub fn starting(&self, summary: &StartupSummary<'_>) {
        let config = summary
            .config_file
            .map_or_else(|| "-".into(), |p| p.display().to_string());
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            config = config.as_str(),
            brokers = summary.brokers.as_str(),
            inbound = summary.inbound.as_str(),
            prefetch = summary.prefetch,
            branches = summary.branches.as_str(),
            dead_letter = summary.dead_letter.as_str(),
            admin = summary.admin.as_str(),
            sessions = summary.sessions.as_str(),
            http = summary.http.as_str(),
            "starting"
        );
    }

    /// A message was taken from the inbound queue.
    pub fn consumed(&self) {
        self.metrics.consumed.inc();
    }

    /// A transaction started; it ends (settled, or abandoned to be
    /// redelivered) when the returned guard is dropped.
    pub fn transaction_started(&self) -> InFlight {
        self.metrics.in_flight.inc();
        InFlight(self.metrics.clone())
    }

    /// Starts the series of a branch at zero, so that they are exposed
    /// before anything happens: forwarded copies per endpoint of its list,
    /// and failovers from each endpoint to the next.
    pub fn branch_known(&self, branch: &str, endpoints: &[&str]) {
        for endpoint in endpoints {
            let _ = self.metrics.forwarded.get(branch, endpoint);
            let _ = self.metrics.replays.get(branch, endpoint);
        }
        for pair in endpoints.windows(2) {
            let _ = self.metrics.failovers.get_or_create(&FailoverLabels {
                branch: branch.to_owned(),
                from: pair[0].to_owned(),
                to: pair[1].to_owned(),
            });
        }
    }

    /// Starts the dead-letter series of `reason` at zero.
    pub fn reason_known(&self, reason: &str) {
        let _ = self.metrics.dead_lettered.get_or_create(&ReasonLabels {
            reason: reason.to_owned(),
        });
    }

    /// The routing configuration now live.
    pub fn config_loaded(&self, generation: u64, branches: usize) {
        self.metrics
            .config_generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
        tracing::info!(generation, branches, "routing configuration live");
    }

    /// A new configuration was refused (it does not load, or the broker
    /// refuses what it declares); the running one stays.
    pub fn reload_rejected(&self, error: &dyn Display) {
        tracing::error!(%error, "configuration reload rejected; the running configuration stays");
    }

    /// A reload changed `key`, which applies only at start; `effect` says
    /// what happens meanwhile.
    pub fn reload_needs_restart(&self, key: &str, effect: &str) {
        tracing::warn!(key, effect, "this key applies at the next start only");
    }

    /// A configuration reload was asked for, by `trigger`.
    pub fn reload_requested(&self, trigger: &str) {
        tracing::info!(trigger, "reloading the configuration");
    }

    /// A copy published to `endpoint` was confirmed after `elapsed`.
    pub fn confirmed(&self, elapsed: Duration) {
        self.metrics.confirm_seconds.observe(elapsed.as_secs_f64());
    }

    /// A copy of a branch's message was confirmed by `endpoint` (a
    /// session's replayed copies included: each counts).
    pub fn forwarded(&self, message_id: &str, branch: &str, endpoint: &str) {
        tracing::debug!(message_id, branch, endpoint, "delivered");
        self.metrics.forwarded.inc(branch, endpoint);
    }

    /// A copy of a session's earlier message was confirmed by the endpoint
    /// its branch failed over to.
    pub fn replayed(&self, branch: &str, endpoint: &str) {
        self.metrics.replays.inc(branch, endpoint);
    }

    /// An attempt on `endpoint` failed and the endpoint will be tried again.
    pub fn retry(&self, message_id: &str, branch: &str, endpoint: &str, error: &dyn Display) {
        tracing::info!(message_id, branch, endpoint, %error, "retrying endpoint");
        self.metrics.retries.inc(branch, endpoint);
    }

    /// A branch leaves `from` for `to` (`None`: its list is exhausted). On
    /// a session's branch, `session` names it and how many of its messages
    /// `to` is sent again first.
    pub fn failover(
        &self,
        message_id: &str,
        branch: &str,
        (from, to): (&str, Option<&str>),
        error: &dyn Display,
        session: Option<Replay<'_>>,
    ) {
        let Some(to) = to else {
            tracing::warn!(message_id, branch, endpoint = from, %error, "backup list exhausted");
            return;
        };
        match session {
            Some(Replay { session, replaying }) => tracing::warn!(
                session,
                message_id,
                branch,
                endpoint = from,
                next = to,
                replaying,
                %error,
                "session failover; replaying the session to the next endpoint"
            ),
            None => {
                tracing::warn!(message_id, branch, endpoint = from, next = to, %error, "failover")
            }
        }
        self.metrics
            .failovers
            .get_or_create(&FailoverLabels {
                branch: branch.to_owned(),
                from: from.to_owned(),
                to: to.to_owned(),
            })
            .inc();
    }

    /// A message was dead-lettered.
    pub fn dead_lettered(
        &self,
        message_id: &str,
        reason: &str,
        error: &str,
        failed: &[&str],
        delivered: &[&str],
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
        self.metrics
            .dead_lettered
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// A dead-letter copy was not confirmed; the original stays unacked and
    /// the copy is tried again after `retry_in`.
    pub fn dead_letter_retry(
        &self,
        message_id: &str,
        reason: &str,
        error: &dyn Display,
        retry_in: Duration,
    ) {
        tracing::error!(
            message_id,
            reason,
            %error,
            retry_in_ms = millis(retry_in),
            "dead letter not confirmed; original kept unacked, retrying"
        );
    }

    /// The broker refused the dead-letter copy itself: it is sent again
    /// without the producer's headers and user_id.
    pub fn dead_letter_reduced(&self, message_id: &str, reason: &str, error: &dyn Display) {
        tracing::warn!(
            message_id,
            reason,
            %error,
            "dead letter refused as it is; sending it without the producer's headers"
        );
    }

    /// A transaction stopped because its inbound channel was lost; the
    /// broker redelivers the message.
    pub fn abandoned(&self, message_id: &str) {
        tracing::info!(
            message_id,
            "inbound channel lost; the broker will redeliver this message"
        );
    }

    /// A connection attempt to a broker's node failed; the next one is in
    /// `retry_in`.
    pub fn broker_unreachable(
        &self,
        broker: &str,
        node: &str,
        uri: &str,
        error: &str,
        retry_in: Duration,
    ) {
        tracing::warn!(
            broker,
            node,
            uri,
            error,
            retry_in_ms = millis(retry_in),
            "broker unreachable"
        );
    }

    /// A node of a cluster did not answer; the next one is tried at once.
    pub fn broker_node_failed(&self, broker: &str, node: &str, uri: &str, error: &str, next: &str) {
        tracing::warn!(
            broker,
            node,
            uri,
            error,
            next,
            "broker node unreachable; trying the next node"
        );
    }

    /// A broker's `role` connection is on node `current` of `nodes` now.
    pub fn broker_node(&self, broker: &str, role: &str, nodes: &[String], current: usize) {
        for (i, node) in nodes.iter().enumerate() {
            self.metrics
                .broker_node
                .get_or_create(&NodeLabels {
                    broker: broker.to_owned(),
                    role: role.to_owned(),
                    node: node.clone(),
                })
                .set(i64::from(i == current));
        }
        if let Some(node) = nodes.get(current) {
            let preferred = current == 0;
            tracing::info!(broker, role, node, preferred, "connected");
        }
    }

    /// A more preferred node answers again: new work goes there, the old
    /// connection is closed once its work is done.
    pub fn broker_returned(&self, broker: &str, role: &str, from: &str, to: &str) {
        tracing::info!(
            broker,
            role,
            from,
            node = to,
            "returning to a more preferred node"
        );
    }

    /// A broker is reachable again.
    pub fn broker_reconnected(&self, broker: &str, node: &str, uri: &str) {
        tracing::info!(broker, node, uri, "broker reconnected");
    }

    /// A broker refused the credentials or the vhost: only a configuration
    /// (or broker) change helps; `reason` says what to fix. `retry_in` is
    /// the next try, `None` when the run ends on it (`--fail-fast`).
    pub fn broker_refused(
        &self,
        broker: &str,
        node: &str,
        uri: &str,
        reason: &str,
        retry_in: Option<Duration>,
    ) {
        match retry_in {
            Some(retry_in) => tracing::error!(
                broker,
                node,
                uri,
                reason,
                retry_in_ms = millis(retry_in),
                "broker refused the connection"
            ),
            None => tracing::error!(
                broker,
                node,
                uri,
                reason,
                "broker refused the connection; not retrying (--fail-fast)"
            ),
        }
    }

    /// A broker did not answer the close of channel `channel` within
    /// `bound`: it is given up without the broker's answer.
    pub fn channel_close_timed_out(&self, channel: u16, why: &str, bound: Duration) {
        tracing::warn!(
            channel,
            why,
            bound_ms = millis(bound),
            "closing a channel timed out; given up without the broker's answer"
        );
    }

    /// A broker did not answer the close of a connection within `bound`:
    /// it is dropped without the broker's answer.
    pub fn connection_close_timed_out(&self, why: &str, bound: Duration) {
        tracing::warn!(
            why,
            bound_ms = millis(bound),
            "closing a connection timed out; dropped without the broker's answer"
        );
    }

    /// A broker blocked publishing (resource alarm): publishes wait,
    /// consuming pauses.
    pub fn broker_blocked(&self, broker: &str, reason: &str) {
        tracing::warn!(
            broker,
            reason,
            "broker blocked publishing (resource alarm); waiting, consuming paused"
        );
    }

    /// A broker lifted its publishing block.
    pub fn broker_unblocked(&self, broker: &str) {
        tracing::info!(broker, "broker unblocked publishing; resuming");
    }

    /// The inbound broker is not reachable yet at startup; retried.
    pub fn startup_retry(&self, error: &dyn Display, retry_in: Duration) {
        tracing::warn!(%error, retry_in_ms = millis(retry_in), "inbound broker not ready");
    }

    /// An endpoint's queue could not be declared at startup.
    pub fn endpoint_queue_undeclared(&self, endpoint: &str, error: &dyn Display) {
        tracing::warn!(
            endpoint,
            %error,
            "could not declare the endpoint's queue; its branches will fail over until it is reachable"
        );
    }

    /// An endpoint's channel was dropped and will be reopened.
    pub fn channel_reset(&self, endpoint: &str, why: &str) {
        tracing::warn!(endpoint, why, "reopening publish channel");
    }

    /// An endpoint's publishes are nacked on a connection made just after
    /// a node change: taken for quorum queues electing leaders. Once per
    /// connection, not per message.
    pub fn publish_settling(&self, endpoint: &str, broker: &str) {
        tracing::warn!(
            endpoint,
            broker,
            "publishes nacked just after a node change: a quorum queue is likely electing its \
             leader; retrying on the same endpoint, nothing is failed over or dead-lettered for it"
        );
    }

    /// A `basic.return` named a publish whose outcome was already decided.
    pub fn late_return(&self, endpoint: &str, publish_id: u64) {
        tracing::warn!(endpoint, publish_id, "return for a publish already settled");
    }

    /// An endpoint was registered; it starts up.
    pub fn endpoint_registered(&self, endpoint: &str) {
        self.endpoint_gauge(endpoint, true);
    }

    /// An endpoint failed at the `level` of its connection or its channel:
    /// new messages skip it until a probe finds it working.
    pub fn endpoint_down(&self, endpoint: &str, level: &str, error: &dyn Display) {
        tracing::warn!(endpoint, level, %error, "endpoint down; skipping it and probing");
        self.endpoint_gauge(endpoint, false);
    }

    /// The broker refuses the forwarder's own user a publish (403): an
    /// operator's fix, not the message's fault; messages are held.
    pub fn publish_refused(
        &self,
        endpoint: &str,
        user: &str,
        vhost: &str,
        exchange: &str,
        error: &dyn Display,
    ) {
        let exchange = if exchange.is_empty() {
            "(default)"
        } else {
            exchange
        };
        tracing::error!(
            endpoint,
            user,
            vhost,
            exchange,
            %error,
            "the broker refuses the forwarder's user: grant it write permission on the exchange \
             in the vhost (rabbitmqctl set_permissions); messages are held meanwhile"
        );
    }

    /// A probe or a publish found a down endpoint working again.
    pub fn endpoint_recovered(&self, endpoint: &str) {
        tracing::info!(endpoint, "endpoint up again; traffic returns to it");
        self.endpoint_gauge(endpoint, true);
    }

    fn endpoint_gauge(&self, endpoint: &str, up: bool) {
        self.metrics
            .endpoint_up
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.to_owned(),
            })
            .set(i64::from(up));
    }

    /// The broker refused a message itself (size, frame, user_id): it is
    /// dead-lettered; the messages in flight with it are retried.
    pub fn rejected(&self, message_id: &str, branch: &str, endpoint: &str, error: &dyn Display) {
        tracing::warn!(message_id, branch, endpoint, %error, "message refused by the broker");
    }

    /// A channel closed under publishes in a way one message may have
    /// caused; this one is retried alone on the same endpoint to find out.
    pub fn isolating(&self, message_id: &str, branch: &str, endpoint: &str, error: &dyn Display) {
        tracing::info!(message_id, branch, endpoint, %error, "retrying alone on the same endpoint");
    }

    /// An outage exhausted a branch's list: the message is held, unacked,
    /// until an endpoint of the list works again.
    pub fn outage_hold(&self, message_id: &str, branch: &str, endpoint: &str, error: &dyn Display) {
        tracing::info!(
            message_id,
            branch,
            endpoint,
            %error,
            "outage: holding the message until an endpoint of its list works again"
        );
    }

    /// A held branch found an endpoint of its list up and tries it again.
    pub fn outage_retry(&self, message_id: &str, branch: &str) {
        tracing::debug!(message_id, branch, "outage: trying the list again");
    }

    /// `holds` branches hold a message for an outage now: the first says
    /// consuming pauses, the last that it resumes.
    pub fn outage_holds(&self, holds: usize, before: usize) {
        self.metrics
            .outage_holds
            .set(i64::try_from(holds).unwrap_or(i64::MAX));
        if before == 0 && holds > 0 {
            tracing::warn!(
                "outage: messages held, consuming paused until their endpoints work again"
            );
        } else if before > 0 && holds == 0 {
            tracing::info!("outage over: no message held, consuming resumes");
        }
    }

    /// The inbound consumer was lost and is being reopened.
    pub fn consumer_lost(&self, queue: &str, error: &str) {
        tracing::warn!(queue, error, "inbound consumer lost; reconnecting");
    }

    /// `basic.cancel` was not answered within `bound`: the consumer is left
    /// as it is; what the broker still delivers goes back to the queue when
    /// the channel closes.
    pub fn consumer_stop_timed_out(&self, queue: &str, bound: Duration) {
        tracing::warn!(
            queue,
            bound_ms = millis(bound),
            "stopping the inbound consumer timed out; what the broker still delivers goes back \
             to the queue when the channel closes"
        );
    }

    /// The settlements of an inbound channel being closed did not all go
    /// out within `bound`: the channel closes with `unacked` messages that
    /// the broker redelivers.
    pub fn inbound_close_timed_out(&self, queue: &str, unacked: usize, bound: Duration) {
        tracing::warn!(
            queue,
            unacked,
            bound_ms = millis(bound),
            "inbound channel closed with messages unacked; the broker redelivers them"
        );
    }

    /// The broker cancelled the consumer on a channel still open: it
    /// consumes again once the messages it holds have settled there.
    pub fn consumer_cancelled(&self, queue: &str) {
        tracing::warn!(
            queue,
            "inbound consumer cancelled by the broker (a quorum queue moving its leader, or the \
             queue deleted); consuming again once its messages have settled"
        );
    }

    /// The consumer's broker connection moved to a more preferred node: the
    /// consumer stops, lets its messages settle, and consumes there.
    pub fn consumer_moving(&self, queue: &str) {
        tracing::info!(
            queue,
            "consumer moving to a more preferred node once its messages have settled"
        );
    }

    /// The inbound consumer is (again) consuming.
    pub fn consuming(&self, queue: &str, prefetch: u16) {
        tracing::info!(queue, prefetch, "consuming");
    }

    /// The shutdown bound ran out with transactions unfinished.
    pub fn shutdown_bound_reached(&self, in_flight: usize, bound: Duration) {
        tracing::warn!(
            in_flight,
            bound_ms = millis(bound),
            "shutdown bound reached; unfinished messages go back to the queue"
        );
    }

    /// Background tasks were still running when the forwarder stopped.
    pub fn background_left(&self, tasks: usize, bound: Duration) {
        tracing::warn!(
            tasks,
            bound_ms = millis(bound),
            "background work did not finish within its bound; giving up on it"
        );
    }

    /// The forwarder has stopped.
    pub fn stopped(&self) {
        tracing::info!("stopped");
    }

    /// The admin endpoint listens.
    pub fn admin_listening(&self, addr: std::net::SocketAddr) {
        tracing::info!(%addr, "admin endpoint listening: /healthz /readyz /metrics");
    }

    /// An admin connection failed (a client that went away, a malformed request).
    pub fn admin_connection_failed(&self, error: &dyn Display) {
        tracing::debug!(%error, "admin connection failed");
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
mod tests {
    use super::sample;
    use super::{Replay, Telemetry, once_a_minute};
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    #[test]
    fn an_untrusted_header_is_logged_at_most_once_a_minute_and_counted_every_time() {
        let last = AtomicU64::new(0);
        assert!(once_a_minute(&last, 1), "the first one is logged");
        assert!(!once_a_minute(&last, 2));
        assert!(!once_a_minute(&last, 60_000));
        assert!(once_a_minute(&last, 60_001), "a minute later");
        assert!(!once_a_minute(&last, 60_002));

        let telemetry = Telemetry::new();
        let ignored = crate::wire::Annotations::read(
            &crate::amqp::Properties::default().with_headers({
                let mut h = crate::amqp::FieldTable::default();
                h.insert(
                    crate::wire::ONLY.into(),
                    crate::amqp::AmqpValue::Boolean(true),
                );
                h
            }),
            false,
            &crate::wire::Reading::default(),
        )
        .ignored;
        for _ in 0..3 {
            telemetry.untrusted_headers("m", None, ignored);
        }
        let text = telemetry.render();
        let series = |h: &str| format!("switchyard_untrusted_headers_total{{header=\"{h}\"}}");
        assert_eq!(sample(&text, &series("x-switchyard-only")), Some(3.0));
        assert_eq!(
            sample(&text, &series("other")),
            Some(0.0),
            "every series from the start"
        );
    }

    #[test]
    fn every_spec_metric_is_exposed_from_the_start() {
        let telemetry = Telemetry::new();
        telemetry.branch_known("service", &["primary", "backup"]);
        telemetry.reason_known("no-route");
        telemetry.endpoint_registered("primary");
        let text = telemetry.render();
        for name in [
            "switchyard_messages_consumed_total",
            "switchyard_messages_forwarded_total",
            "switchyard_failovers_total",
            "switchyard_dead_lettered_total",
            "switchyard_confirm_seconds",
            "switchyard_in_flight",
            "switchyard_sessions_open",
            "switchyard_endpoint_up",
            "switchyard_config_generation",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} in\n{text}"
            );
        }
        assert_eq!(
            sample(&text, "switchyard_messages_consumed_total"),
            Some(0.0)
        );
        assert_eq!(sample(&text, "switchyard_confirm_seconds_count"), Some(0.0));
    }

    #[test]
    fn labelled_series_count_separately_and_handles_do_not_share() {
        let telemetry = Telemetry::new();
        let other = Telemetry::new();
        for _ in 0..3 {
            telemetry.forwarded("m", "service", "primary");
        }
        telemetry.forwarded("m", "logging", "primary");
        telemetry.clone().consumed();
        telemetry.failover("m", "service", ("primary", Some("backup")), &"nacked", None);
        let replay = Some(Replay {
            session: "s",
            replaying: 2,
        });
        telemetry.failover("m", "service", ("backup", Some("third")), &"nacked", replay);
        telemetry.failover("m", "service", ("third", None), &"nacked", None);
        telemetry.replayed("service", "third");
        telemetry.dead_lettered("m", "exhausted", "nacked", &[], &[], "nack");
        telemetry.endpoint_registered("primary");
        telemetry.endpoint_down("primary", "connection", &"gone");
        telemetry.confirmed(Duration::from_millis(3));
        let _in_flight = telemetry.transaction_started();
        telemetry.config_loaded(1, 2);
        let text = telemetry.render();
        let cases = [
            (
                r#"switchyard_messages_forwarded_total{branch="service",endpoint="primary"}"#,
                3.0,
            ),
            (
                r#"switchyard_messages_forwarded_total{branch="logging",endpoint="primary"}"#,
                1.0,
            ),
            ("switchyard_messages_consumed_total", 1.0),
            (
                r#"switchyard_failovers_total{branch="service",from="primary",to="backup"}"#,
                1.0,
            ),
            (
                r#"switchyard_failovers_total{branch="service",from="backup",to="third"}"#,
                1.0,
            ),
            (
                r#"switchyard_replays_total{branch="service",endpoint="third"}"#,
                1.0,
            ),
            (r#"switchyard_dead_lettered_total{reason="exhausted"}"#, 1.0),
            (r#"switchyard_endpoint_up{endpoint="primary"}"#, 0.0),
            ("switchyard_confirm_seconds_count", 1.0),
            (r#"switchyard_confirm_seconds_bucket{le="0.005"}"#, 1.0),
            (r#"switchyard_confirm_seconds_bucket{le="0.0025"}"#, 0.0),
            ("switchyard_in_flight", 1.0),
            ("switchyard_config_generation", 1.0),
        ];
        for (series, value) in cases {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
        assert_eq!(
            text.matches("switchyard_failovers_total{").count(),
            2,
            "a session's failover counts as one; an exhausted list is not one"
        );
        assert_eq!(
            sample(&other.render(), "switchyard_messages_consumed_total"),
            Some(0.0)
        );
    }

    #[test]
    fn the_librarys_warnings_are_dropped_and_its_debug_kept() {
        use tracing::Level;
        use tracing::callsite::DefaultCallsite;
        use tracing::metadata::{Kind, Metadata};
        macro_rules! meta {
            ($target:expr, $level:expr) => {{
                static CALLSITE: DefaultCallsite = DefaultCallsite::new(&META);
                static META: Metadata<'static> = Metadata::new(
                    "event",
                    $target,
                    $level,
                    None,
                    None,
                    None,
                    tracing::field::FieldSet::new(&[], tracing::callsite::Identifier(&CALLSITE)),
                    Kind::EVENT,
                );
                &META
            }};
        }
        assert!(!super::library_event_allowed(meta!(
            "lapin::returned_messages",
            Level::WARN
        )));
        assert!(!super::library_event_allowed(meta!(
            "lapin::io_loop",
            Level::ERROR
        )));
        assert!(!super::library_event_allowed(meta!("lapin", Level::INFO)));
        assert!(super::library_event_allowed(meta!(
            "lapin::channels",
            Level::DEBUG
        )));
        assert!(super::library_event_allowed(meta!(
            "switchyard::telemetry",
            Level::WARN
        )));
        assert!(super::library_event_allowed(meta!(
            "lapinator",
            Level::WARN
        )));
    }
}
