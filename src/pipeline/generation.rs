//! Generation: one live configuration, compiled into everything a
//! transaction uses — routing table, screen, endpoint publishers, settler
//! and the connectors behind them — swapped as one unit on reload.
//!
//! A transaction holds the generation it started with until it ends, so a
//! message is routed, published and dead-lettered wholly under one
//! configuration. A new generation reuses the previous one's connector for
//! every broker whose definition is unchanged and its publisher for every
//! endpoint whose definition and broker are unchanged. A connector no
//! generation uses any more closes its connection; a publisher stops when
//! its last handle is gone and its confirms are in.

use super::engine::{Engine, Outages};
use super::record::Recorder;
use super::screen::Screen;
use super::settle::Settler;
use crate::broker::{
    Blocking, Connector, Drains, EndpointHealth, Publish, Publisher, Publishers, Role,
};
use crate::config::Settings;
use crate::control::Group;
use crate::destination::{DeadLetterMode, Endpoint};
use crate::telemetry::Telemetry;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The name of the publisher of annotated dead-letter copies.
const DEAD_LETTER_ENDPOINT: &str = "dead-letter";

/// One compiled configuration and the broker handles it publishes through.
pub struct Generation {
    /// 1 for the configuration loaded at start, then one more per reload.
    pub(super) number: u64,
    pub(super) settings: Settings,
    /// The inbound broker's consuming connector; `None` without `[inbound]`.
    pub(super) consume_connector: Option<Arc<Shared>>,
    pub(super) publish_connectors: BTreeMap<String, Arc<Shared>>,
    /// Every endpoint's publisher, by name: the health view readiness reads.
    pub(super) publishers: Publishers,
    /// Delivers through `publishers`.
    pub(super) engine: Engine,
    /// The publisher of annotated copies (`republish` mode).
    dead_letters: Option<Publisher>,
    pub(super) settler: Settler,
    /// Checks before routing: malformed, loop, poison.
    pub(super) screen: Arc<Screen>,
    /// The blocked state of every publishing connection.
    pub(super) blocking: Vec<watch::Receiver<Blocking>>,
    /// Where settled messages are recorded (the forwarder's one recorder).
    pub(crate) recorder: Recorder,
    /// The group's pause, which stops open sessions' idle clocks.
    pub(super) group: Group,
}

/// What every generation of one forwarder shares.
pub(super) struct Common {
    /// Bumped on every endpoint health change, whichever generation.
    pub(super) health_epoch: Arc<watch::Sender<u64>>,
    /// Cancelled at shutdown: every publisher stops.
    pub(super) publishers_stop: CancellationToken,
    /// Branches waiting out an outage, whichever generation they run under.
    pub(super) outages: Outages,
    /// Every connector's and publisher's background work (publisher
    /// actors, probes, event listeners, closes), awaited at shutdown.
    pub(super) background: TaskTracker,
    /// Where every settled message is recorded, whichever generation.
    pub(super) recorder: Recorder,
    /// The endpoints an operator drained, read by every generation's
    /// publishers.
    pub(super) drains: Drains,
    /// The group's pause, drains and registrations.
    pub(super) group: Group,
    pub(super) telemetry: Telemetry,
}

impl Common {
    /// What the generations of a forwarder reporting to `telemetry` share,
    /// fresh.
    pub(super) fn new(telemetry: Telemetry) -> Self {
        let health_epoch = Arc::new(watch::Sender::new(0));
        let drains = Drains::new(health_epoch.clone());
        let group = Group::new(None, "", String::new(), drains.clone(), telemetry.clone());
        Self {
            health_epoch,
            publishers_stop: CancellationToken::new(),
            outages: Outages::new(telemetry.clone()),
            background: TaskTracker::new(),
            recorder: Recorder::default(),
            drains,
            group,
            telemetry,
        }
    }
}

/// A connector used by one or more generations; when the last of them is
/// gone its connection is closed (in the background, bounded).
pub struct Shared(pub(super) Arc<Connector>);

impl Drop for Shared {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            self.0.close_later();
        }
    }
}

impl Generation {
    /// Whether messages may be taken now: no publishing broker blocks
    /// publishers and no branch waits out an outage.
    pub(super) fn publishing(&self) -> bool {
        self.blocking.iter().all(|b| !b.borrow().blocked) && !self.engine.outages().any()
    }

    /// Whether a publishing broker blocks publishers (a resource alarm).
    pub(super) fn blocked(&self) -> bool {
        self.blocking.iter().any(|b| b.borrow().blocked)
    }

    /// Compiles `settings` into generation `number`, reusing what `previous`
    /// has for unchanged brokers and endpoints. Connects lazily.
    pub(super) fn build(
        number: u64,
        settings: Settings,
        previous: Option<&Generation>,
        common: &Common,
    ) -> Self {
        let telemetry = &common.telemetry;
        let parts = Parts {
            settings: &settings,
            previous,
            common,
        };
        let publish_connectors = parts.publish_connectors();
        let consume_connector = parts.consume_connector();
        let publishers = Publishers::new(
            settings.endpoints.values().filter_map(|endpoint| {
                let old = previous.and_then(|p| {
                    p.publishers
                        .all()
                        .find(|old| old.endpoint().name == endpoint.name)
                });
                parts.publisher(endpoint, old, &publish_connectors)
            }),
            common.health_epoch.subscribe(),
        )
        .draining(common.drains.clone());
        let sample_ratio = settings.otlp.as_ref().map_or(1.0, |o| o.sample_ratio);
        let engine = Engine::new(
            Arc::new(publishers.clone()),
            common.outages.clone(),
            telemetry.clone(),
        )
        .recording(common.recorder.wanted(), sample_ratio);
        let dead_letters = parts.dead_letter_publisher(&publish_connectors);
        let settler = Settler::new(
            dead_letter_mode(&settings),
            dead_letters.as_ref().map(|publisher| {
                let registry =
                    Publishers::new([publisher.clone()], common.health_epoch.subscribe());
                let publish: Arc<dyn Publish> = Arc::new(registry);
                (publish, publisher.endpoint().clone())
            }),
            source_queue(&settings),
            telemetry.clone(),
        );
        let screen = parts.screen();
        let blocking = publish_connectors
            .values()
            .map(|c| c.0.blocking())
            .collect();
        Self {
            number,
            settings,
            consume_connector,
            publish_connectors,
            publishers,
            engine,
            dead_letters,
            settler,
            screen,
            blocking,
            recorder: common.recorder.clone(),
            group: common.group.clone(),
        }
    }

    /// The connection declarations and the dead-letter probe use: the
    /// inbound broker's publishing one, so the consuming connection never
    /// publishes and a resource alarm can never block its acks.
    /// `None` without `[inbound]`.
    pub(super) fn topology_connector(&self) -> Option<&Connector> {
        let inbound = self.settings.inbound()?;
        Some(&self.publish_connectors[&inbound.broker].0)
    }

    /// Whether consuming under `next` needs a new consumer: the inbound
    /// queue's settings or its broker changed.
    pub(super) fn inbound_differs(&self, next: &Generation) -> bool {
        self.settings.inbound() != next.settings.inbound()
            || self.settings.name != next.settings.name
            || match (&self.consume_connector, &next.consume_connector) {
                (Some(now), Some(next)) => !Arc::ptr_eq(now, next),
                (None, None) => false,
                _ => true,
            }
    }

    /// Endpoints of `next` whose queue must be declared: new or changed.
    pub(super) fn endpoints_to_declare<'a>(
        &self,
        next: &'a Generation,
    ) -> impl Iterator<Item = &'a Arc<Endpoint>> {
        next.settings.endpoints.values().filter(|e| {
            e.declare_queue.is_some() && self.settings.endpoints.get(&e.name) != Some(e)
        })
    }
}

#[cfg(test)]
impl Generation {
    /// Generation 1 of `settings`, delivering through `publish` (a scripted
    /// stand-in) with `telemetry`. Its publishers never connect: nothing
    /// publishes through them.
    pub(super) fn scripted(
        settings: Settings,
        publish: Arc<dyn crate::broker::Publish>,
        telemetry: Telemetry,
    ) -> Self {
        let common = Common::new(telemetry.clone());
        let mut generation = Self::build(1, settings, None, &common);
        let dead_letters = generation
            .dead_letters
            .as_ref()
            .map(|p| (publish.clone(), p.endpoint().clone()));
        generation.settler = Settler::new(
            dead_letter_mode(&generation.settings),
            dead_letters,
            source_queue(&generation.settings),
            telemetry.clone(),
        );
        generation.engine = Engine::new(publish, common.outages, telemetry);
        generation
    }
}

/// What a new generation is built from: its settings, and the previous
/// generation whose connectors and publishers it reuses where unchanged.
struct Parts<'a> {
    settings: &'a Settings,
    previous: Option<&'a Generation>,
    common: &'a Common,
}

impl Parts<'_> {
    /// The previous generation, when broker `name` is unchanged in it.
    fn reusable(&self, name: &str) -> Option<&Generation> {
        self.previous.filter(|p| {
            p.settings.name == self.settings.name
                && p.settings.brokers.get(name) == self.settings.brokers.get(name)
        })
    }

    fn connector(&self, spec: &Arc<crate::config::BrokerSpec>, role: Role) -> Arc<Shared> {
        Arc::new(Shared(Connector::new(
            spec.clone(),
            &self.settings.name,
            role,
            self.common.background.clone(),
            self.common.telemetry.clone(),
        )))
    }

    /// One publishing connector per broker.
    fn publish_connectors(&self) -> BTreeMap<String, Arc<Shared>> {
        self.settings
            .brokers
            .iter()
            .map(|(name, spec)| {
                let shared = self
                    .reusable(name)
                    .and_then(|p| p.publish_connectors.get(name).cloned())
                    .unwrap_or_else(|| self.connector(spec, Role::Publish));
                (name.clone(), shared)
            })
            .collect()
    }

    /// The consuming connector, with an inbound queue.
    fn consume_connector(&self) -> Option<Arc<Shared>> {
        let broker = &self.settings.inbound()?.broker;
        let reused = self
            .reusable(broker)
            .filter(|p| p.settings.inbound().map(|i| &i.broker) == Some(broker))
            .and_then(|p| p.consume_connector.clone());
        let spec = self.settings.brokers.get(broker)?;
        Some(reused.unwrap_or_else(|| self.connector(spec, Role::Consume)))
    }

    /// The publisher of `endpoint`: `old` when neither it nor its broker
    /// changed, else a new one (`None` for a broker the settings do not
    /// define, which compiled settings never name).
    fn publisher(
        &self,
        endpoint: &Arc<Endpoint>,
        old: Option<&Publisher>,
        connectors: &BTreeMap<String, Arc<Shared>>,
    ) -> Option<Publisher> {
        let unchanged = old.filter(|old| {
            **old.endpoint() == **endpoint && self.reusable(&endpoint.broker).is_some()
        });
        if let Some(old) = unchanged {
            return Some(old.clone());
        }
        let connector = connectors.get(&endpoint.broker)?.0.clone();
        let telemetry = &self.common.telemetry;
        let health = EndpointHealth::new(
            &endpoint.name,
            self.common.health_epoch.clone(),
            telemetry.clone(),
        )
        .drained_by(self.common.drains.clone());
        Some(Publisher::spawn(
            endpoint.clone(),
            connector,
            Arc::new(health),
            self.common.publishers_stop.clone(),
            &self.common.background,
            telemetry.clone(),
        ))
    }

    /// In `republish` mode, the publisher of dead letters.
    fn dead_letter_publisher(
        &self,
        connectors: &BTreeMap<String, Arc<Shared>>,
    ) -> Option<Publisher> {
        let (inbound, dl) = self
            .settings
            .queue()
            .filter(|(_, dl)| dl.mode == DeadLetterMode::Republish)?;
        let endpoint = Arc::new(Endpoint::plain(
            DEAD_LETTER_ENDPOINT,
            &inbound.broker,
            &dl.exchange,
            &dl.routing_key,
        ));
        let old = self.previous.and_then(|p| p.dead_letters.as_ref());
        self.publisher(&endpoint, old, connectors)
    }

    /// The screen; the previous one when its limits are the same, so a
    /// poison message stays counted.
    fn screen(&self) -> Arc<Screen> {
        let (max_hops, max_redeliveries) = limits(self.settings);
        self.previous
            .filter(|p| limits(&p.settings) == (max_hops, max_redeliveries))
            .map(|p| p.screen.clone())
            .unwrap_or_else(|| Arc::new(Screen::new(max_hops, max_redeliveries)))
    }
}

/// The screen's limits: the inbound queue's. Without one, messages come
/// from the HTTP ingress alone, untrusted first deliveries with no hops and
/// no redeliveries, which no limit bars.
fn limits(settings: &Settings) -> (u32, u32) {
    settings
        .inbound()
        .as_ref()
        .map_or((u32::MAX, u32::MAX), |i| (i.max_hops, i.max_redeliveries))
}

/// How the settler dead-letters. Without `[inbound]` nothing is consumed,
/// so nothing is ever settled and the mode is moot.
fn dead_letter_mode(settings: &Settings) -> DeadLetterMode {
    settings
        .dead_letter()
        .as_ref()
        .map_or(DeadLetterMode::Nack, |d| d.mode)
}

/// The queue dead letters say they came from.
fn source_queue(settings: &Settings) -> &str {
    settings.inbound().map_or("", |i| i.queue.as_str())
}
