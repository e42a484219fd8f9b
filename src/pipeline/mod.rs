//! The forwarding pipeline: consume → route → deliver → settle.
//!
//! - [`consume`]: deliveries → envelopes under peek-lock, one transaction
//!   task each, reconnecting the consumer when it is lost.
//! - [`screen`]: the verdict for a message that must not be forwarded.
//! - route: [`crate::routing`], pure.
//! - [`deliver`]: one confirmed copy per branch, backup lists walked.
//! - [`outcome`]: branch outcomes and the verdict they reach.
//! - [`settle`]: verdict → ack or dead letter.
//!
//! [`Forwarder::run`] prepares the broker topology, consumes until
//! shutdown, then drains in-flight transactions within the configured bound.

mod consume;
pub mod deliver;
pub mod outcome;
pub mod screen;
pub mod settle;

use crate::broker::{
    Blocking, Connector, EndpointHealth, Publisher, Role, TopologyError, declare_endpoint_queue,
    prepare_inbound,
};
use crate::config::{DeadLetterMode, Endpoint, Settings};
use crate::routing::RoutingTable;
use deliver::Publishers;
use settle::Settler;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why the forwarder could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The broker refused the topology the configuration asks for.
    #[error("{0}")]
    Topology(String),
}

/// A configured forwarder, not yet connected.
pub struct Forwarder {
    settings: Settings,
    consume_connector: Arc<Connector>,
    publish_connectors: BTreeMap<String, Arc<Connector>>,
    publishers: Publishers,
    settler: Settler,
    routing: watch::Receiver<Arc<RoutingTable>>,
    /// Kept so the routing channel stays open; reload publishes through it.
    _routing_source: watch::Sender<Arc<RoutingTable>>,
    publishers_stop: CancellationToken,
    /// Checks before routing: malformed, loop, poison.
    screen: screen::Screen,
    /// One per message in flight, `prefetch` in all, across consumer reconnects.
    permits: Arc<Semaphore>,
    /// The blocked state of every publishing connection.
    blocking: Vec<watch::Receiver<Blocking>>,
    /// Cancelled when the shutdown bound is reached: unfinished transactions
    /// drop their receipts, which requeues their messages.
    abandon: CancellationToken,
}

impl Forwarder {
    /// Builds connectors and publisher tasks; connects lazily.
    pub fn new(settings: Settings) -> Self {
        let publish_connectors: BTreeMap<String, Arc<Connector>> = settings
            .brokers
            .iter()
            .map(|(name, spec)| {
                (
                    name.clone(),
                    Arc::new(Connector::new(spec.clone(), &settings.name, Role::Publish)),
                )
            })
            .collect();
        let consume_connector = Arc::new(Connector::new(
            settings.brokers[&settings.inbound.broker].clone(),
            &settings.name,
            Role::Consume,
        ));
        let publishers_stop = CancellationToken::new();
        let health_epoch = Arc::new(watch::Sender::new(0));
        let publishers = Publishers::new(
            settings.endpoints.values().map(|endpoint| {
                Publisher::spawn(
                    endpoint.clone(),
                    publish_connectors[&endpoint.broker].clone(),
                    Arc::new(EndpointHealth::new(&endpoint.name, health_epoch.clone())),
                    publishers_stop.clone(),
                )
            }),
            health_epoch.subscribe(),
        );
        let dead_letters = (settings.dead_letter.mode == DeadLetterMode::Republish).then(|| {
            let endpoint = Arc::new(Endpoint {
                name: "dead-letter".to_owned(),
                broker: settings.inbound.broker.clone(),
                exchange: settings.dead_letter.exchange.clone(),
                routing_key: settings.dead_letter.routing_key.clone(),
                declare_queue: None,
                confirm_timeout: Duration::from_secs(5),
                retries: 0,
                headers: Vec::new(),
                declare_queue_type: Default::default(),
                probe_interval: Duration::from_secs(1),
            });
            let connector = publish_connectors[&settings.inbound.broker].clone();
            let health = Arc::new(EndpointHealth::new(&endpoint.name, health_epoch.clone()));
            Publisher::spawn(endpoint, connector, health, publishers_stop.clone())
        });
        let settler = Settler::new(
            settings.dead_letter.mode,
            dead_letters,
            &settings.inbound.queue,
        );
        let (routing_source, routing) = watch::channel(settings.routing.clone());
        let screen =
            screen::Screen::new(settings.inbound.max_hops, settings.inbound.max_redeliveries);
        let permits = Arc::new(Semaphore::new(usize::from(settings.inbound.prefetch)));
        let blocking = publish_connectors.values().map(|c| c.blocking()).collect();
        Self {
            settings,
            consume_connector,
            publish_connectors,
            publishers,
            settler,
            routing,
            _routing_source: routing_source,
            publishers_stop,
            screen,
            permits,
            blocking,
            abandon: CancellationToken::new(),
        }
    }

    /// The connection declarations and the dead-letter probe use: the
    /// inbound broker's publishing one, so the consuming connection never
    /// publishes and a resource alarm can never block its acks.
    fn topology_connector(&self) -> &Connector {
        &self.publish_connectors[&self.settings.inbound.broker]
    }

    /// Returns once no publishing broker blocks publishers and no branch
    /// waits out an outage.
    async fn wait_until_publishing(&self) {
        loop {
            for blocking in &self.blocking {
                let _ = blocking.clone().wait_for(|b| !b.blocked).await;
            }
            self.publishers.no_outage().await;
            if self.blocking.iter().all(|b| !b.borrow().blocked) {
                return;
            }
        }
    }

    /// Runs until `shutdown` is cancelled, then drains and closes.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunError> {
        self.prepare(&shutdown).await?;
        if !shutdown.is_cancelled() {
            crate::telemetry::config_loaded(1, self.settings.routing.branch_names().count());
        }
        let tracker = TaskTracker::new();
        let inbound = consume::consume_until(&self, &shutdown, &tracker).await;
        tracker.close();
        let bound = self.settings.shutdown_timeout;
        if tokio::time::timeout(bound, tracker.wait()).await.is_err() {
            tracing::warn!(
                in_flight = tracker.len(),
                bound_ms = bound.as_millis() as u64,
                "shutdown bound reached; unfinished messages go back to the queue"
            );
            self.abandon.cancel();
            tracker.wait().await;
        }
        if let Some(inbound) = inbound {
            inbound.close().await;
        }
        self.publishers_stop.cancel();
        // Concurrently: a stalled broker must not add its close timeout to every other's.
        let closes = std::iter::once(&self.consume_connector)
            .chain(self.publish_connectors.values())
            .map(|c| c.close());
        futures_util::future::join_all(closes).await;
        tracing::info!("stopped");
        Ok(())
    }

    /// Declares what the configuration asks for, retrying while the broker
    /// is unreachable; a refusal is fatal.
    async fn prepare(&self, shutdown: &CancellationToken) -> Result<(), RunError> {
        let mut delay = Duration::from_millis(200);
        loop {
            match prepare_inbound(self.topology_connector(), &self.settings).await {
                Ok(()) => break,
                Err(TopologyError::Refused(why)) => return Err(RunError::Topology(why)),
                Err(TopologyError::Unreachable(why)) => {
                    tracing::warn!(error = %why, retry_in_ms = delay.as_millis() as u64, "inbound broker not ready");
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(()),
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        for endpoint in self.settings.endpoints.values() {
            if endpoint.declare_queue.is_none() {
                continue;
            }
            let connector = &self.publish_connectors[&endpoint.broker];
            match declare_endpoint_queue(connector, endpoint).await {
                Ok(()) => {}
                Err(TopologyError::Refused(why)) => return Err(RunError::Topology(why)),
                Err(TopologyError::Unreachable(why)) => {
                    tracing::warn!(endpoint = %endpoint.name, error = %why, "could not declare the endpoint's queue; its branches will fail over until it is reachable");
                }
            }
        }
        Ok(())
    }
}
