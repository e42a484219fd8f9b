//! What happens to each message: consumed and screened, its branches'
//! copies confirmed, retried, failed over, held for an outage or
//! dead-lettered, and the series that count them.

use super::metrics::{EndpointLabels, EndpointStateLabels, FailoverLabels, Metrics, ReasonLabels};
use super::{Telemetry, lock, millis, once_a_minute};
use crate::wire::Ignored;
use prometheus_client::metrics::counter::Counter;
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

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

impl Telemetry {
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
            let _ = self.failover_counter(branch, pair[0], pair[1]);
        }
    }

    /// Starts the dead-letter series of `reason` at zero.
    pub fn reason_known(&self, reason: &str) {
        let _ = self.metrics.dead_lettered.get_or_create(&ReasonLabels {
            reason: reason.to_owned(),
        });
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
        self.failover_counter(branch, from, to).inc();
    }

    fn failover_counter(&self, branch: &str, from: &str, to: &str) -> Counter {
        let labels = FailoverLabels {
            branch: branch.to_owned(),
            from: from.to_owned(),
            to: to.to_owned(),
        };
        let counter = self.metrics.failovers.get_or_create_owned(&labels);
        lock(&self.metrics.failover_series).insert(labels);
        counter
    }

    /// Removes every series of `endpoint` (a registered endpoint that
    /// left): its state, copies, retries, replays and failovers.
    pub(super) fn forget_endpoint(&self, endpoint: &str) {
        let metrics = &self.metrics;
        let labels = EndpointLabels {
            endpoint: endpoint.to_owned(),
        };
        metrics.endpoint_up.remove(&labels);
        for state in ["up", "down", "drained"] {
            metrics.endpoint_state.remove(&EndpointStateLabels {
                endpoint: endpoint.to_owned(),
                state,
            });
        }
        lock(&metrics.drained).remove(endpoint);
        for counters in [&metrics.forwarded, &metrics.retries, &metrics.replays] {
            counters.forget(endpoint);
        }
        lock(&metrics.failover_series).retain(|l| {
            let keep = l.from != endpoint && l.to != endpoint;
            if !keep {
                metrics.failovers.remove(l);
            }
            keep
        });
    }

    /// An endpoint's publisher stopped: no copy can count for it any more.
    pub fn publisher_stopped(&self, endpoint: &str) {
        if lock(&self.metrics.retired).contains(endpoint) {
            self.forget_endpoint(endpoint);
        }
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
}
