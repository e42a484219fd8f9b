//! Broker connections: attempts, nodes left and returned to, refusals,
//! closes that time out, and resource alarms.

use super::metrics::NodeLabels;
use super::{Telemetry, millis};
use std::fmt::Display;
use std::time::Duration;

impl Telemetry {
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
}
