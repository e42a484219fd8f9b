//! The forwarding pipeline: consume → admit (screen, session, route) →
//! deliver → settle, with a second source, the intake, answering instead
//! of settling.
//!
//! - `consume`: deliveries → envelopes under peek-lock, one transaction
//!   task each, reconnecting the consumer when it is lost.
//! - `admit`: the one place a message is screened ([`screen`]), placed in
//!   its session and routed ([`crate::routing`], pure), for both sources.
//! - [`engine`]: deliver, the one delivery engine: a branch delivers an
//!   ordered run of messages down its endpoint list (a run of one for an
//!   independent message), backup lists walked.
//! - [`sessions`]: one session set for both sources (slots, limits, idle
//!   and closed sessions), driving the engine with a run that grows as
//!   messages arrive.
//! - `live`: the live generation, switched on reload.
//! - [`outcome`]: branch outcomes and the verdict they reach.
//! - [`settle`]: verdict → ack or dead letter.
//! - [`intake`]: messages from the HTTP ingress, admitted as consumed ones
//!   are, their outcome answered rather than settled.
//! - `generation`: one live configuration compiled into all of the above,
//!   swapped as one unit on reload.
//!
//! [`Forwarder::run`] prepares the broker topology, consumes until
//! shutdown, then drains in-flight transactions within the configured bound.
//! A reload (see [`crate::reload`]) is prepared while consuming goes on and
//! then routes every message consumed after it; transactions in flight
//! finish under the generation they started with.
//! [`Readiness`] says whether it is serving: consuming, with an endpoint up
//! on every branch.

mod admit;
mod consume;
pub mod engine;
mod generation;
pub mod intake;
mod live;
pub mod outcome;
pub(crate) mod record;
pub mod screen;
pub mod sessions;
pub mod settle;
pub mod steering;
#[cfg(test)]
mod testkit;

use crate::backoff::Backoff;
use crate::broker::{ConnectError, TopologyError, declare_endpoint_queue, prepare_inbound};
use crate::config::Settings;
use crate::reload::Reload;
use crate::telemetry::Telemetry;
use generation::{Common, Generation};
use live::Live;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long the journal gets at shutdown to write what it holds; what is
/// left after it is counted as dropped.
const JOURNAL_BOUND: Duration = Duration::from_secs(5);

/// How long the background work (publisher actors, probes, connection
/// closes) gets to finish once every connection is closed; past it, what is
/// left is given up on and logged.
const BACKGROUND_BOUND: Duration = Duration::from_secs(5);

/// Why the forwarder could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The broker refused the topology the configuration asks for.
    #[error(transparent)]
    Topology(TopologyError),
    /// With fail-fast: a broker refused the credentials or the vhost at
    /// start. Said as what to fix.
    #[error("{}", .0.reason())]
    Refused(#[source] ConnectError),
    /// The admin endpoint could not listen.
    #[error(transparent)]
    Admin(crate::admin::AdminError),
    /// The HTTP ingress could not listen.
    #[error(transparent)]
    Ingress(crate::listen::ListenError),
}

/// A configured forwarder, not yet connected.
pub struct Forwarder {
    /// The live generation and what every generation shares.
    live: Arc<Live>,
    /// New configurations to switch to, each already loaded or rejected.
    reloads: Option<mpsc::Receiver<Reload>>,
    /// Cancelled when the shutdown bound is reached: unfinished transactions
    /// drop their receipts, which requeues their messages.
    abandon: CancellationToken,
    /// True while the inbound consumer is consuming.
    consuming: Arc<AtomicBool>,
    /// Set once the topology is prepared: the intake takes messages.
    prepared: Arc<AtomicBool>,
    /// Every transaction and session task, awaited at shutdown.
    tracker: TaskTracker,
    /// Open sessions, sessions waiting for a slot, recently closed ones.
    sessions: sessions::Sessions,
    /// The HTTP ingress's sessions, shared by every intake handle.
    http_sessions: sessions::HttpSessions,
    /// A permanent refusal at start ends `run` instead of being retried.
    fail_fast: bool,
    telemetry: Telemetry,
}

impl Forwarder {
    /// Builds connectors and publisher tasks, all emitting through
    /// `telemetry`; connects lazily.
    pub fn new(settings: Settings, telemetry: Telemetry) -> Self {
        let mut common = Common::new(telemetry.clone());
        common.recorder = record::Recorder::new(&settings, &telemetry);
        common.group = crate::control::Group::new(
            settings.control.clone(),
            &settings.name,
            crate::control::group::instance_name(),
            common.drains.clone(),
            telemetry.clone(),
        );
        let tracker = TaskTracker::new();
        let abandon = CancellationToken::new();
        let live = Arc::new(Live::new(settings, common));
        let generations = live.subscribe();
        Self {
            live,
            reloads: None,
            sessions: sessions::Sessions::new(
                tracker.clone(),
                abandon.clone(),
                telemetry.clone(),
                generations,
            ),
            http_sessions: sessions::HttpSessions::new(
                tracker.clone(),
                abandon.clone(),
                telemetry.clone(),
                admit::route_for_caller,
            ),
            tracker,
            abandon,
            consuming: Arc::new(AtomicBool::new(false)),
            prepared: Arc::new(AtomicBool::new(false)),
            fail_fast: false,
            telemetry,
        }
    }

    /// Switches to each configuration `reloads` yields, as described in
    /// [`crate::reload`]; a rejected one is logged and changes nothing.
    pub fn reloads(mut self, reloads: mpsc::Receiver<Reload>) -> Self {
        self.reloads = Some(reloads);
        self
    }

    /// With `on`, a broker that refuses the credentials or the vhost at
    /// start makes [`run`](Self::run) return [`RunError::Refused`] rather
    /// than retry (for orchestrators that restart failed processes).
    pub fn fail_fast(mut self, on: bool) -> Self {
        self.fail_fast = on;
        self
    }

    /// A handle to submit messages that do not come from the inbound
    /// queue (the HTTP ingress); it works while [`run`](Self::run) runs.
    pub fn intake(&self) -> intake::Intake {
        intake::Intake::new(
            self.live.clone(),
            self.prepared.clone(),
            self.tracker.clone(),
            self.abandon.clone(),
            self.http_sessions.clone(),
        )
    }

    /// Whether the forwarder serves now; cheap to clone and to ask.
    pub fn readiness(&self) -> Readiness {
        Readiness {
            consuming: self.consuming.clone(),
            prepared: self.prepared.clone(),
            generation: self.live.subscribe(),
            group: self.live.common.group.clone(),
        }
    }

    /// A handle to steer the running forwarder's group (the admin
    /// endpoint's `/control` and `/registry`).
    pub fn steering(&self) -> steering::Steering {
        steering::Steering::new(self.live.clone())
    }

    /// Runs until `shutdown` is cancelled, then drains and closes.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), RunError> {
        let common = &self.live.common;
        common.recorder.start(&common.background);
        let first = self.live.current();
        self.prepare(&first, &shutdown).await?;
        // Followed once the brokers took the topology (a refusal with
        // fail-fast ends the run before this connects).
        common
            .group
            .start(&common.background, common.publishers_stop.clone());
        self.follow_registrations();
        // The group's pause, drains and registrations hold before any work is taken.
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = common.group.recovered() => {}
        }
        if !shutdown.is_cancelled() {
            for reason in outcome::Reason::ALL {
                self.telemetry.reason_known(reason.as_str());
            }
            self.live.announce(&first);
            self.prepared.store(true, Ordering::Release);
        }
        drop(first);
        let consumer = consume::Consumer {
            live: self.live.clone(),
            reloads: self.reloads.take(),
            sessions: self.sessions.clone(),
            tracker: self.tracker.clone(),
            abandon: self.abandon.clone(),
            consuming: self.consuming.clone(),
            telemetry: self.telemetry.clone(),
        };
        let inbound = consumer.consume_until(&shutdown).await;
        self.prepared.store(false, Ordering::Release);
        let tracker = &self.tracker;
        tracker.close();
        let bound = self.live.current().settings.shutdown_timeout;
        if tokio::time::timeout(bound, tracker.wait()).await.is_err() {
            self.telemetry.shutdown_bound_reached(tracker.len(), bound);
            self.abandon.cancel();
            tracker.wait().await;
        }
        if let Some(inbound) = inbound {
            inbound.close().await;
        }
        let common = &self.live.common;
        // Every transaction has settled: what they recorded is written now.
        common.recorder.close(JOURNAL_BOUND).await;
        common.publishers_stop.cancel();
        let last = self.live.current();
        // Concurrently: a stalled broker must not add its close timeout to every other's.
        let closes = last
            .consume_connector
            .iter()
            .chain(last.publish_connectors.values())
            .map(|c| c.0.close());
        futures_util::future::join_all(closes).await;
        drop(last);
        let background = &common.background;
        background.close();
        if tokio::time::timeout(BACKGROUND_BOUND, background.wait())
            .await
            .is_err()
        {
            self.telemetry
                .background_left(background.len(), BACKGROUND_BOUND);
        }
        self.telemetry.stopped();
        Ok(())
    }

    /// Switches generations as services register and leave, until the
    /// publishers stop.
    fn follow_registrations(&self) {
        let live = self.live.clone();
        let stop = live.common.publishers_stop.clone();
        let mut changes = live.common.group.registered();
        self.live.common.background.spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    changed = changes.changed() => if changed.is_err() {
                        return;
                    },
                }
                live.reregister().await;
            }
        });
    }

    /// Declares what `generation` asks for, retrying while the broker
    /// is unreachable or refuses the connection (the connector logs each
    /// attempt, with what to fix and when it tries next); a refused
    /// declaration is fatal, and so is a refused connection with fail-fast.
    async fn prepare(
        &self,
        generation: &Generation,
        shutdown: &CancellationToken,
    ) -> Result<(), RunError> {
        let connectors = || {
            generation
                .consume_connector
                .iter()
                .chain(generation.publish_connectors.values())
        };
        for connector in connectors() {
            connector.0.refusal_final(self.fail_fast);
        }
        let prepared = self.prepare_topology(generation, shutdown).await;
        for connector in connectors() {
            connector.0.refusal_final(false);
        }
        prepared
    }

    async fn prepare_topology(
        &self,
        generation: &Generation,
        shutdown: &CancellationToken,
    ) -> Result<(), RunError> {
        let settings = &generation.settings;
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        // Without an inbound queue (the HTTP ingress alone) there is none to prepare.
        let queue_side = settings.queue().zip(generation.topology_connector());
        while let Some((queue, connector)) = queue_side {
            let prepared = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                prepared = prepare_inbound(connector, queue) => prepared,
            };
            let retry = match prepared {
                Ok(()) => break,
                Err(why) if why.is_refusal() => return Err(RunError::Topology(why)),
                Err(TopologyError::NoConnection(refused @ ConnectError::Refused { .. }))
                    if self.fail_fast =>
                {
                    return Err(RunError::Refused(refused));
                }
                // Logged by the connector, with its next try: the one to wait for.
                Err(TopologyError::NoConnection(_)) => {
                    futures_util::future::Either::Left(connector.next_attempt())
                }
                Err(why) => {
                    let delay = backoff.next_delay();
                    self.telemetry.startup_retry(&why, delay);
                    futures_util::future::Either::Right(tokio::time::sleep(delay))
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = retry => {}
            }
        }
        if self.fail_fast {
            refuse_fast(generation).await?;
        }
        for endpoint in settings.endpoints.values() {
            if endpoint.declare_queue.is_none() {
                continue;
            }
            let connector = &generation.publish_connectors[&endpoint.broker].0;
            match declare_endpoint_queue(connector, endpoint).await {
                Ok(()) => {}
                Err(why) if why.is_refusal() => return Err(RunError::Topology(why)),
                Err(TopologyError::NoConnection(refused @ ConnectError::Refused { .. }))
                    if self.fail_fast =>
                {
                    return Err(RunError::Refused(refused));
                }
                Err(why) => self
                    .telemetry
                    .endpoint_queue_undeclared(&endpoint.name, &why),
            }
        }
        Ok(())
    }
}

/// Connects to every other publishing broker once, concurrently: the
/// first that refuses the credentials or the vhost is an error. One that
/// cannot be reached is left to fail over as usual.
async fn refuse_fast(generation: &Generation) -> Result<(), RunError> {
    let inbound = generation.settings.inbound().map(|i| &i.broker);
    let others = generation
        .publish_connectors
        .iter()
        .filter(|(name, _)| Some(*name) != inbound)
        .map(|(_, c)| c.0.connection());
    for result in futures_util::future::join_all(others).await {
        if let Err(refused @ ConnectError::Refused { .. }) = result {
            return Err(RunError::Refused(refused));
        }
    }
    Ok(())
}

/// Whether a forwarder serves: its topology is prepared, its consumer (if
/// it has an inbound queue) is consuming, and every branch of the live
/// routing table has at least one endpoint up.
#[derive(Clone)]
pub struct Readiness {
    consuming: Arc<AtomicBool>,
    prepared: Arc<AtomicBool>,
    generation: watch::Receiver<Arc<Generation>>,
    group: crate::control::Group,
}

impl Readiness {
    /// `Ok` when ready; otherwise why not.
    pub fn check(&self) -> Result<(), NotReady> {
        if self.group.paused() {
            return Err(NotReady::Paused);
        }
        let generation = self.generation.borrow().clone();
        let consumes = generation.settings.inbound().is_some();
        if consumes && !self.consuming.load(Ordering::Relaxed) {
            return Err(NotReady::NotConsuming);
        }
        if !self.group.is_recovered() {
            return Err(NotReady::Recovering);
        }
        if !self.prepared.load(Ordering::Relaxed) {
            return Err(NotReady::Starting);
        }
        let down: Vec<DownBranch> = generation
            .settings
            .routing
            .branch_endpoints()
            .filter(|(_, endpoints)| {
                !endpoints
                    .iter()
                    .any(|e| generation.publishers.endpoint_up(&e.name))
            })
            .map(|(branch, endpoints)| DownBranch {
                branch: branch.to_owned(),
                endpoints: endpoints.iter().map(|e| e.name.clone()).collect(),
            })
            .collect();
        if down.is_empty() {
            Ok(())
        } else {
            Err(NotReady::NoEndpointUp(down))
        }
    }
}

/// Why a forwarder does not serve, as `/readyz` says it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// It has an inbound queue and does not consume from it.
    #[error("not consuming from the inbound queue")]
    NotConsuming,
    /// Its topology is not prepared yet.
    #[error("starting: the topology is not prepared yet")]
    Starting,
    /// It has not read its group's state from the control stream yet.
    #[error(
        "starting: reading the group's pause, drains and registrations from the control stream"
    )]
    Recovering,
    /// An operator paused the group.
    #[error("paused by an operator: no new message is taken (POST /control/resume resumes)")]
    Paused,
    /// Branches with no endpoint up, in filter-table order; never empty.
    #[error("{}", joined(.0))]
    NoEndpointUp(Vec<DownBranch>),
}

/// A branch none of whose endpoints is up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", down_line(.branch, .endpoints))]
pub struct DownBranch {
    /// The branch's name.
    pub branch: String,
    /// Its endpoints, in list order.
    pub endpoints: Vec<String>,
}

fn down_line(branch: &str, endpoints: &[String]) -> String {
    if endpoints.is_empty() {
        format!("branch {branch} has no endpoint: none registered yet")
    } else {
        format!(
            "branch {branch} has no endpoint up ({})",
            endpoints.join(", ")
        )
    }
}

fn joined(down: &[DownBranch]) -> String {
    let lines: Vec<String> = down.iter().map(DownBranch::to_string).collect();
    lines.join("; ")
}

#[cfg(test)]
mod tests {
    use super::{DownBranch, NotReady};

    fn down(branch: &str, endpoints: &[&str]) -> DownBranch {
        DownBranch {
            branch: branch.to_owned(),
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
        }
    }

    #[test]
    fn each_reason_not_to_serve_reads_as_readyz_says_it() {
        assert_eq!(
            NotReady::NotConsuming.to_string(),
            "not consuming from the inbound queue"
        );
        assert_eq!(
            NotReady::Starting.to_string(),
            "starting: the topology is not prepared yet"
        );
        assert_eq!(
            NotReady::NoEndpointUp(vec![down("audit", &["audit"])]).to_string(),
            "branch audit has no endpoint up (audit)"
        );
        assert_eq!(
            NotReady::NoEndpointUp(vec![
                down("audit", &["audit"]),
                down("service", &["primary", "backup"]),
            ])
            .to_string(),
            "branch audit has no endpoint up (audit); branch service has no endpoint up \
             (primary, backup)"
        );
    }
}
