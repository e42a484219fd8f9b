//! Endpoints and their publish channels: declared, down, up again,
//! refused by the broker, and the `switchyard_endpoint_up` gauge.

use super::Telemetry;
use super::metrics::{EndpointLabels, EndpointStateLabels};
use std::fmt::Display;

impl Telemetry {
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
        self.endpoint_state(endpoint);
    }

    /// Sets `switchyard_endpoint_state` for `endpoint` from its up gauge
    /// and whether it is drained.
    pub(super) fn endpoint_state(&self, endpoint: &str) {
        let metrics = &self.metrics;
        let drained = metrics
            .drained
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(endpoint);
        let up = metrics
            .endpoint_up
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.to_owned(),
            })
            .get()
            == 1;
        let state = match (drained, up) {
            (true, _) => "drained",
            (false, true) => "up",
            (false, false) => "down",
        };
        for each in ["up", "down", "drained"] {
            metrics
                .endpoint_state
                .get_or_create(&EndpointStateLabels {
                    endpoint: endpoint.to_owned(),
                    state: each,
                })
                .set(i64::from(each == state));
        }
    }
}
