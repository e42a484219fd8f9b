//! The endpoints of one configuration as the delivery engine sees them:
//! a [`Publish`] seam (publish a copy, read an endpoint's health, follow
//! health changes) and [`Publishers`], the registry of endpoint publishers
//! that implements it against the broker. The engine knows only the trait,
//! so its walking, retries, outage waits and replays are tested with a
//! scripted stand-in under a paused clock.

use super::health::Drains;
use super::publisher::{Mode, PublishFailure, Publisher};
use crate::amqp::{AmqpValue, ShortString};
use crate::destination::Endpoint;
use crate::envelope::Envelope;
use rustc_hash::FxHashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::watch;

/// One publish attempt's outcome: `Ok` once confirmed and not returned.
pub type Attempt = Pin<Box<dyn Future<Output = Result<(), PublishFailure>> + Send>>;

/// An endpoint's health, as the engine reads it to choose where to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// New messages use it.
    Up,
    /// Its channel failed or stalled; skipped while another is up.
    Down,
    /// Its broker cannot be reached: an outage, not a refusal.
    Unreachable,
    /// An operator drained it: skipped, never published to, no failure.
    Drained,
}

/// What the delivery engine needs from the endpoints it publishes to.
pub trait Publish: Send + Sync + 'static {
    /// Starts publishing one copy of `envelope` with `extra` headers to
    /// `endpoint` now, in call order; the attempt resolves to its outcome.
    fn publish(
        &self,
        endpoint: &Endpoint,
        envelope: &Arc<Envelope>,
        extra: Vec<(ShortString, AmqpValue)>,
        mode: Mode,
    ) -> Attempt;

    /// The endpoint's health now (an unknown endpoint is up).
    fn health(&self, endpoint: &Endpoint) -> Health;

    /// Changes whenever some endpoint's health does.
    fn health_changes(&self) -> watch::Receiver<u64>;
}

/// Publishers by endpoint name, with the health epoch they share.
#[derive(Clone)]
pub struct Publishers {
    by_endpoint: Arc<FxHashMap<String, Publisher>>,
    /// Bumped on every endpoint health change.
    health: watch::Receiver<u64>,
    /// The endpoints drained now.
    drains: Option<Drains>,
}

impl Publishers {
    /// Publishers from their handles; `health` follows their health epoch.
    pub fn new(
        publishers: impl IntoIterator<Item = Publisher>,
        health: watch::Receiver<u64>,
    ) -> Self {
        Self {
            by_endpoint: Arc::new(
                publishers
                    .into_iter()
                    .map(|p| (p.endpoint().name.clone(), p))
                    .collect(),
            ),
            health,
            drains: None,
        }
    }

    /// The same publishers, reading `drains`.
    pub fn draining(mut self, drains: Drains) -> Self {
        self.drains = Some(drains);
        self
    }

    /// Whether the endpoint named `name` is drained.
    pub fn drained(&self, name: &str) -> bool {
        self.drains.as_ref().is_some_and(|d| d.contains(name))
    }

    /// Every publisher.
    pub fn all(&self) -> impl Iterator<Item = &Publisher> {
        self.by_endpoint.values()
    }

    /// Whether the endpoint named `name` is up (an unknown name is not).
    pub fn endpoint_up(&self, name: &str) -> bool {
        !self.drained(name)
            && self
                .by_endpoint
                .get(name)
                .is_some_and(|p| p.health().is_up())
    }
}

impl Publish for Publishers {
    fn publish(
        &self,
        endpoint: &Endpoint,
        envelope: &Arc<Envelope>,
        extra: Vec<(ShortString, AmqpValue)>,
        mode: Mode,
    ) -> Attempt {
        match self.by_endpoint.get(&endpoint.name) {
            Some(publisher) => Box::pin(publisher.publish(envelope.clone(), extra, mode)),
            // Unreachable with a compiled configuration: every endpoint has a publisher.
            None => Box::pin(std::future::ready(Err(PublishFailure::Stopped))),
        }
    }

    fn health(&self, endpoint: &Endpoint) -> Health {
        if self.drained(&endpoint.name) {
            return Health::Drained;
        }
        match self.by_endpoint.get(&endpoint.name).map(Publisher::health) {
            Some(h) if h.is_unreachable() => Health::Unreachable,
            Some(h) if !h.is_up() => Health::Down,
            _ => Health::Up,
        }
    }

    fn health_changes(&self) -> watch::Receiver<u64> {
        self.health.clone()
    }
}
