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
//! [`Readiness`] says whether it is serving: consuming, with an endpoint up
//! on every branch.

mod consume;
pub mod deliver;
pub mod outcome;
pub mod screen;
pub mod settle;

use crate::broker::{
    Blocking, ConnectError, Connector, EndpointHealth, Publisher, Role, TopologyError,
    declare_endpoint_queue, prepare_inbound,
};
use crate::config::{DeadLetterMode, Endpoint, Settings};
use crate::routing::RoutingTable;
use crate::telemetry::Telemetry;
use deliver::Publishers;
use settle::Settler;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// With fail-fast: a broker refused the credentials or the vhost at start.
    #[error("{0}")]
    Refused(String),
    /// The admin endpoint could not listen.
    #[error("{0}")]
    Admin(String),
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
    /// True while the inbound consumer is consuming.
    consuming: Arc<AtomicBool>,
    /// A permanent refusal at start ends `run` instead of being retried.
    fail_fast: bool,
    telemetry: Telemetry,
}

impl Forwarder {
    /// Builds connectors and publisher tasks, all emitting through
    /// `telemetry`; connects lazily.
    pub fn new(settings: Settings, telemetry: Telemetry) -> Self {
        let publish_connectors: BTreeMap<String, Arc<Connector>> = settings
            .brokers
            .iter()
            .map(|(name, spec)| {
                let connector = Connector::new(
                    spec.clone(),
                    &settings.name,
                    Role::Publish,
                    telemetry.clone(),
                );
                (name.clone(), Arc::new(connector))
            })
            .collect();
        let consume_connector = Arc::new(Connector::new(
            settings.brokers[&settings.inbound.broker].clone(),
            &settings.name,
            Role::Consume,
            telemetry.clone(),
        ));
        let publishers_stop = CancellationToken::new();
        let health_epoch = Arc::new(watch::Sender::new(0));
        let publishers = Publishers::new(
            settings.endpoints.values().map(|endpoint| {
                let health =
                    EndpointHealth::new(&endpoint.name, health_epoch.clone(), telemetry.clone());
                Publisher::spawn(
                    endpoint.clone(),
                    publish_connectors[&endpoint.broker].clone(),
                    Arc::new(health),
                    publishers_stop.clone(),
                    telemetry.clone(),
                )
            }),
            health_epoch.subscribe(),
            telemetry.clone(),
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
            let health =
                EndpointHealth::new(&endpoint.name, health_epoch.clone(), telemetry.clone());
            Publisher::spawn(
                endpoint,
                connector,
                Arc::new(health),
                publishers_stop.clone(),
                telemetry.clone(),
            )
        });
        let settler = Settler::new(
            settings.dead_letter.mode,
            dead_letters,
            &settings.inbound.queue,
            telemetry.clone(),
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
            consuming: Arc::new(AtomicBool::new(false)),
            fail_fast: false,
            telemetry,
        }
    }

    /// With `on`, a broker that refuses the credentials or the vhost at
    /// start makes [`run`](Self::run) return [`RunError::Refused`] rather
    /// than retry (for orchestrators that restart failed processes).
    pub fn fail_fast(mut self, on: bool) -> Self {
        self.fail_fast = on;
        self
    }

    /// Whether the forwarder serves now; cheap to clone and to ask.
    pub fn readiness(&self) -> Readiness {
        Readiness {
            consuming: self.consuming.clone(),
            routing: self.routing.clone(),
            publishers: self.publishers.clone(),
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
            for (branch, endpoints) in self.settings.routing.branch_endpoints() {
                let names: Vec<&str> = endpoints.iter().map(|e| e.name.as_str()).collect();
                self.telemetry.branch_known(branch, &names);
            }
            for reason in outcome::Reason::ALL {
                self.telemetry.reason_known(reason.as_str());
            }
            self.telemetry
                .config_loaded(1, self.settings.routing.branch_names().count());
        }
        let tracker = TaskTracker::new();
        let inbound = consume::consume_until(&self, &shutdown, &tracker).await;
        tracker.close();
        let bound = self.settings.shutdown_timeout;
        if tokio::time::timeout(bound, tracker.wait()).await.is_err() {
            self.telemetry.shutdown_bound_reached(tracker.len(), bound);
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
        self.telemetry.stopped();
        Ok(())
    }

    /// Declares what the configuration asks for, retrying while the broker
    /// is unreachable or refuses the connection (the connector logs that,
    /// with what to fix); a refused declaration is fatal, and so is a
    /// refused connection with fail-fast.
    async fn prepare(&self, shutdown: &CancellationToken) -> Result<(), RunError> {
        let mut delay = Duration::from_millis(200);
        loop {
            let prepared = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                prepared = prepare_inbound(self.topology_connector(), &self.settings) => prepared,
            };
            match prepared {
                Ok(()) => break,
                Err(TopologyError::Refused(why)) => return Err(RunError::Topology(why)),
                Err(TopologyError::Denied(why)) if self.fail_fast => {
                    return Err(RunError::Refused(why));
                }
                Err(TopologyError::Denied(_)) => {}
                Err(TopologyError::Unreachable(why)) => self.telemetry.startup_retry(&why, delay),
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(5));
        }
        if self.fail_fast {
            self.refuse_fast().await?;
        }
        for endpoint in self.settings.endpoints.values() {
            if endpoint.declare_queue.is_none() {
                continue;
            }
            let connector = &self.publish_connectors[&endpoint.broker];
            match declare_endpoint_queue(connector, endpoint).await {
                Ok(()) => {}
                Err(TopologyError::Refused(why)) => return Err(RunError::Topology(why)),
                Err(TopologyError::Denied(why)) if self.fail_fast => {
                    return Err(RunError::Refused(why));
                }
                Err(TopologyError::Unreachable(why) | TopologyError::Denied(why)) => {
                    self.telemetry
                        .endpoint_queue_undeclared(&endpoint.name, &why);
                }
            }
        }
        Ok(())
    }

    /// Connects to every other publishing broker once, concurrently: the
    /// first that refuses the credentials or the vhost is an error. One that
    /// cannot be reached is left to fail over as usual.
    async fn refuse_fast(&self) -> Result<(), RunError> {
        let others = self
            .publish_connectors
            .iter()
            .filter(|(name, _)| **name != self.settings.inbound.broker)
            .map(|(_, c)| c.connection());
        for result in futures_util::future::join_all(others).await {
            if let Err(ConnectError::Refused { reason, .. }) = result {
                return Err(RunError::Refused(reason));
            }
        }
        Ok(())
    }
}

/// Whether a forwarder serves: its consumer is consuming and every branch
/// of the live routing table has at least one endpoint up.
#[derive(Clone)]
pub struct Readiness {
    consuming: Arc<AtomicBool>,
    routing: watch::Receiver<Arc<RoutingTable>>,
    publishers: Publishers,
}

impl Readiness {
    /// `Ok` when ready; otherwise why not, in one line.
    pub fn check(&self) -> Result<(), String> {
        if !self.consuming.load(Ordering::Relaxed) {
            return Err("not consuming from the inbound queue".to_owned());
        }
        let table = self.routing.borrow().clone();
        let down: Vec<String> = table
            .branch_endpoints()
            .filter(|(_, endpoints)| {
                !endpoints
                    .iter()
                    .any(|e| self.publishers.endpoint_up(&e.name))
            })
            .map(|(branch, endpoints)| {
                let names: Vec<&str> = endpoints.iter().map(|e| e.name.as_str()).collect();
                format!("branch {branch} has no endpoint up ({})", names.join(", "))
            })
            .collect();
        if down.is_empty() {
            Ok(())
        } else {
            Err(down.join("; "))
        }
    }
}
