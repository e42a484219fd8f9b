//! The live configuration: the generation every message consumed now is
//! routed, published and dead-lettered under, and the switch to a new one
//! on reload. A reload is prepared (its topology declared) while consuming
//! goes on; a rejected one changes nothing.

use super::admit::route;
use super::generation::{Common, Generation};
use super::outcome::Barred;
use crate::broker::{declare_endpoint_queue, prepare_inbound};
use crate::config::Settings;
use crate::control::Registered;
use crate::envelope::Envelope;
use crate::reload::Reload;
use crate::routing::BranchPlan;
use crate::telemetry::Telemetry;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The live generation and what every generation shares.
pub(super) struct Live {
    /// Each transaction keeps the generation it started with.
    generation: watch::Sender<Arc<Generation>>,
    /// The configuration as its file says, before registrations join it.
    base: std::sync::Mutex<Settings>,
    /// Held while a new generation is made, so that a reload and a
    /// registration never build from the same one; holds the
    /// registrations the live generation was built with.
    switching: tokio::sync::Mutex<Registered>,
    pub(super) common: Common,
    telemetry: Telemetry,
}

impl Live {
    /// Generation 1, from `settings`.
    pub(super) fn new(settings: Settings, common: Common) -> Self {
        let first = Generation::build(1, settings.clone(), None, &common);
        common.group.set_rules(Arc::new(settings.clone()));
        let registered = common.group.registered().borrow().clone();
        Self {
            generation: watch::Sender::new(Arc::new(first)),
            base: std::sync::Mutex::new(settings),
            switching: tokio::sync::Mutex::new(registered),
            telemetry: common.telemetry.clone(),
            common,
        }
    }

    /// The configuration as its file says (without registrations).
    pub(super) fn base(&self) -> Settings {
        self.base.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Switches to a generation whose registrable branches list the
    /// endpoints registered now: new messages use them, transactions in
    /// flight keep the lists they started with.
    /// Does nothing when the live generation has them already, so that a
    /// command's answer can wait for it.
    pub(super) async fn reregister(&self) {
        let mut built_with = self.switching.lock().await;
        let registered = self.common.group.registered().borrow().clone();
        if Arc::ptr_eq(&built_with, &registered) {
            return;
        }
        let settings = self.base().with_registered(&registered);
        *built_with = registered;
        let current = self.current();
        let next = Generation::build(current.number + 1, settings, Some(&current), &self.common);
        let next = Arc::new(next);
        self.generation.send_replace(next.clone());
        self.announce(&next);
    }

    /// The live generation.
    pub(super) fn current(&self) -> Arc<Generation> {
        self.generation.borrow().clone()
    }

    /// Follows the live generation.
    pub(super) fn subscribe(&self) -> watch::Receiver<Arc<Generation>> {
        self.generation.subscribe()
    }

    /// Whether new messages wait: the group is paused, or the journal
    /// cannot record them (`on_unavailable = "hold"`).
    pub(super) fn taking_nothing(&self) -> bool {
        self.common.group.paused() || self.common.recorder.holding()
    }

    /// Returns once the group is not paused, no publishing broker of the
    /// live generation blocks publishers and no branch waits out an outage.
    pub(super) async fn wait_until_publishing(&self) {
        loop {
            // Checked first, so the usual case makes no receiver at all.
            let generation = self.current();
            let journal = &self.common.recorder;
            if generation.publishing() && !self.taking_nothing() {
                return;
            }
            self.common.group.until_resumed().await;
            // `on_unavailable = "hold"`: nothing new is taken while the
            // journal cannot record it.
            journal.until_taking().await;
            for blocking in &generation.blocking {
                let _ = blocking.clone().wait_for(|b| !b.blocked).await;
            }
            self.common.outages.none().await;
        }
    }

    /// Waits, counted as an outage hold (so consuming pauses), for a live
    /// generation under which every branch `envelope` takes has an
    /// endpoint (a service registered into a branch that had none); then
    /// its routing of `envelope`. `None` when `lost` is cancelled first.
    pub(super) async fn routable(
        &self,
        envelope: &Envelope,
        lost: &CancellationToken,
    ) -> Option<(Arc<Generation>, Result<Vec<BranchPlan>, Barred>)> {
        let mut changes = self.subscribe();
        let _held = self.common.outages.counted();
        loop {
            let generation = changes.borrow_and_update().clone();
            match route(&generation.settings.routing, envelope) {
                Ok(plans) if plans.iter().any(BranchPlan::is_empty) => {}
                routed => return Some((generation, routed)),
            }
            tokio::select! {
                () = lost.cancelled() => return None,
                changed = changes.changed() => changed.ok()?,
            }
        }
    }

    /// Tells telemetry that `generation` is live: its branches, its number.
    pub(super) fn announce(&self, generation: &Generation) {
        let routing = &generation.settings.routing;
        for (branch, endpoints) in routing.branch_endpoints() {
            let names: Vec<&str> = endpoints.iter().map(|e| e.name.as_str()).collect();
            self.telemetry.branch_known(branch, &names);
        }
        self.telemetry
            .config_loaded(generation.number, routing.branch_names().count());
    }

    /// Loads, prepares and switches to a new configuration; a rejected one
    /// changes nothing. Returns whether the live generation changed in a
    /// way that needs a new consumer.
    pub(super) async fn reload(&self, reload: Reload, shutdown: &CancellationToken) -> bool {
        let base = match reload {
            Ok(settings) => settings,
            Err(why) => {
                self.telemetry.reload_rejected(&why);
                return false;
            }
        };
        let mut built_with = self.switching.lock().await;
        // Registrations, drains and a pause outlive a reload.
        let registered = self.common.group.registered().borrow().clone();
        let settings = base.with_registered(&registered);
        let current = self.current();
        let next = Generation::build(current.number + 1, settings, Some(&current), &self.common);
        let inbound_differs = current.inbound_differs(&next);
        let topology_differs =
            inbound_differs || current.settings.dead_letter() != next.settings.dead_letter();
        let queue_side = next.settings.queue().zip(next.topology_connector());
        if let (true, Some((queue, connector))) = (topology_differs, queue_side) {
            let prepared = tokio::select! {
                () = shutdown.cancelled() => return false,
                prepared = prepare_inbound(connector, queue) => prepared,
            };
            if let Err(why) = prepared {
                self.telemetry.reload_rejected(&why);
                return false;
            }
        }
        for endpoint in current.endpoints_to_declare(&next) {
            let connector = &next.publish_connectors[&endpoint.broker].0;
            match declare_endpoint_queue(connector, endpoint).await {
                Ok(()) => {}
                Err(why) if why.is_refusal() => {
                    self.telemetry.reload_rejected(&why);
                    return false;
                }
                Err(why) => self
                    .telemetry
                    .endpoint_queue_undeclared(&endpoint.name, &why),
            }
        }
        if next.settings.worker_threads != current.settings.worker_threads {
            self.telemetry.reload_needs_restart(
                "worker_threads",
                "the runtime keeps its threads until the next start",
            );
        }
        if next.settings.http != current.settings.http {
            self.telemetry.reload_needs_restart(
                "ingress.http",
                "the HTTP ingress keeps its listener, tokens, limits and session headers",
            );
        }
        if next.settings.admin_listen != current.settings.admin_listen {
            self.telemetry
                .reload_needs_restart("admin.listen", "the admin listener keeps its address");
        }
        let next = Arc::new(next);
        *built_with = registered;
        self.common.group.set_rules(Arc::new(base.clone()));
        *self.base.lock().unwrap_or_else(|e| e.into_inner()) = base;
        self.generation.send_replace(next.clone());
        self.announce(&next);
        inbound_differs
    }
}
