//! Endpoint health: the cheap view `deliver` reads to pick the first usable
//! endpoint of a list.
//!
//! An endpoint that failed at the connection or channel level (unreachable,
//! connection lost, channel closed, confirm timeout) is marked down; new
//! messages skip it at once and its publisher probes it in the background
//! every `probe_interval_ms`. When a probe or a confirmed publish succeeds it
//! is up again, and failover lists start from it again. Every change bumps
//! one shared epoch, so a branch waiting out an outage wakes on any recovery.
//! The probe itself ([`probe`]) opens a channel on the endpoint's broker
//! and passively declares what the endpoint publishes to. A drained
//! endpoint is not probed (an operator took it out for maintenance); once
//! undrained it is probed again within one interval.

use super::closing::close_channel;
use super::connector::{ConnectError, Connector};
use super::error::BrokerError;
use crate::amqp::FieldTable;
use crate::destination::Endpoint;
use crate::telemetry::Telemetry;
use lapin::ExchangeKind;
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use tokio::sync::watch;

const UP: u8 = 0;
const DOWN_CHANNEL: u8 = 1;
const DOWN_CONNECTION: u8 = 2;

/// Why an endpoint is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Down {
    /// Its broker cannot be reached or the connection was lost.
    Connection,
    /// The broker is there but the endpoint's channel failed or stalled.
    Channel,
}

impl Down {
    /// The level that failed, as logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Channel => "channel",
        }
    }
}

/// One endpoint's health, shared by its publisher (which writes it) and the
/// deliveries that read it.
#[derive(Debug)]
pub struct EndpointHealth {
    endpoint: String,
    state: AtomicU8,
    epoch: Arc<watch::Sender<u64>>,
    /// The forwarder's drains, when its endpoint can be drained.
    drains: Option<Drains>,
    telemetry: Telemetry,
}

impl EndpointHealth {
    /// Starts up; `epoch` is shared by every endpoint of one forwarder.
    pub fn new(endpoint: &str, epoch: Arc<watch::Sender<u64>>, telemetry: Telemetry) -> Self {
        telemetry.endpoint_registered(endpoint);
        Self {
            endpoint: endpoint.to_owned(),
            state: AtomicU8::new(UP),
            epoch,
            drains: None,
            telemetry,
        }
    }

    /// The same health, whose endpoint is drained when `drains` names it.
    pub fn drained_by(mut self, drains: Drains) -> Self {
        self.drains = Some(drains);
        self
    }

    /// Whether an operator drained it: then it is not probed.
    pub fn is_drained(&self) -> bool {
        self.drains
            .as_ref()
            .is_some_and(|d| d.contains(&self.endpoint))
    }

    /// Whether new messages should use it.
    pub fn is_up(&self) -> bool {
        self.state.load(Ordering::Relaxed) == UP
    }

    /// Down because its broker is unreachable.
    pub fn is_unreachable(&self) -> bool {
        self.state.load(Ordering::Relaxed) == DOWN_CONNECTION
    }

    /// Marks it down; logs only the change, and says whether it was one.
    pub fn mark_down(&self, why: Down, error: &dyn std::fmt::Display) -> bool {
        let next = match why {
            Down::Connection => DOWN_CONNECTION,
            Down::Channel => DOWN_CHANNEL,
        };
        let changed = self.state.swap(next, Ordering::Relaxed) != next;
        if changed {
            self.telemetry
                .endpoint_down(&self.endpoint, why.as_str(), error);
            self.bump();
        }
        changed
    }

    /// Marks it up; logs only the change.
    pub fn mark_up(&self) {
        if self.state.swap(UP, Ordering::Relaxed) != UP {
            self.telemetry.endpoint_recovered(&self.endpoint);
            self.bump();
        }
    }

    fn bump(&self) {
        self.epoch.send_modify(|n| *n += 1);
    }
}

/// The endpoints an operator drained, by name: skipped by every list as
/// if down, never published to, never counted as failing. Shared by every
/// generation; a change bumps the health epoch, so a branch holding for
/// want of an endpoint wakes on an undrain.
#[derive(Debug, Clone)]
pub struct Drains {
    names: Arc<std::sync::RwLock<Arc<BTreeSet<String>>>>,
    /// Whether any endpoint is drained: the usual case reads no lock.
    any: Arc<AtomicBool>,
    epoch: Arc<watch::Sender<u64>>,
}

impl Drains {
    /// None drained; changes bump `epoch`.
    pub fn new(epoch: Arc<watch::Sender<u64>>) -> Self {
        Self {
            names: Arc::default(),
            any: Arc::default(),
            epoch,
        }
    }

    /// Whether the endpoint named `name` is drained.
    pub fn contains(&self, name: &str) -> bool {
        self.any.load(Ordering::Acquire) && self.now().contains(name)
    }

    /// The drained endpoints now.
    pub fn now(&self) -> Arc<BTreeSet<String>> {
        match self.names.read() {
            Ok(names) => names.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Drains exactly `names`; bumps the epoch when that changes anything.
    pub fn set(&self, names: BTreeSet<String>) {
        let changed = {
            let mut now = match self.names.write() {
                Ok(now) => now,
                Err(poisoned) => poisoned.into_inner(),
            };
            let changed = **now != names;
            self.any.store(!names.is_empty(), Ordering::Release);
            *now = Arc::new(names);
            changed
        };
        if changed {
            self.epoch.send_modify(|n| *n += 1);
        }
    }
}

/// Why a probe found an endpoint still down.
#[derive(Debug, thiserror::Error)]
pub(super) enum ProbeFailure {
    /// No channel on its broker.
    #[error(transparent)]
    Connect(ConnectError),
    /// What it publishes to is missing or refused.
    #[error("{0}")]
    Broker(BrokerError),
    /// No answer in time.
    #[error("no answer within {} ms", .0.as_millis())]
    Timeout(std::time::Duration),
}

/// Probes one endpoint: a channel on its broker, then passive declarations
/// of what it publishes to, each on that short-lived channel.
pub(super) async fn probe(connector: &Connector, endpoint: &Endpoint) -> Result<(), ProbeFailure> {
    let limit = endpoint.confirm_timeout;
    let channel = connector
        .channel(false, limit)
        .await
        .map_err(ProbeFailure::Connect)?;
    let checks = async {
        if !endpoint.exchange.is_empty() {
            let options = ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            };
            channel
                .exchange_declare(
                    endpoint.exchange.as_str().into(),
                    ExchangeKind::Direct,
                    options,
                    FieldTable::default(),
                )
                .await?;
        }
        let queue = endpoint.declare_queue.as_deref().or(endpoint
            .exchange
            .is_empty()
            .then_some(endpoint.routing_key.as_str()));
        if let Some(queue) = queue {
            let options = QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            channel
                .queue_declare(queue.into(), options, FieldTable::default())
                .await?;
        }
        Ok::<_, lapin::Error>(())
    };
    let result = tokio::time::timeout(limit, checks).await;
    close_channel(&channel, "switchyard: probe", connector.telemetry()).await;
    match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ProbeFailure::Broker(BrokerError::from_lapin(&e))),
        Err(_) => Err(ProbeFailure::Timeout(limit)),
    }
}
