//! Intake: messages that do not come from the inbound queue (the HTTP
//! ingress) go through the same screen, filter table and delivery engine as
//! consumed ones, under the live generation, and their outcome goes back to
//! the caller instead of to settlement: nothing they send is ever acked or
//! dead-lettered, the caller holds the outcome.
//!
//! [`Intake::submit`] screens and routes one envelope, leaving out branches
//! the caller already has confirmed (a retry), and returns the rest of its
//! delivery as a future that the caller runs (on [`Intake::spawn`], so
//! shutdown waits for it). Two rules differ from the queue's, because a
//! caller is waiting: a branch whose whole list is down ends at once as an
//! outage (the caller is told to come back) rather than holding, and
//! cancelling the `lost` token (the caller's deadline) starts no new
//! attempt. A message of a session goes to [`sessions`], which delivers
//! each session's messages one at a time, in order, each branch a run that
//! keeps its endpoint and replays on failover.

mod sessions;
mod submission;

pub use sessions::HttpSessions;
pub use submission::{Delivery, NotTaken, Submitted};

use submission::plans;

use super::engine::held;
use super::live::Live;
use crate::envelope::Envelope;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A handle to submit messages through the forwarder. Cheap to clone.
#[derive(Clone)]
pub struct Intake {
    live: Arc<Live>,
    /// Set once the forwarder has prepared its topology (endpoint queues
    /// declared): nothing is taken before.
    prepared: Arc<AtomicBool>,
    tracker: TaskTracker,
    /// The shutdown bound: deliveries still running are dropped.
    abandon: CancellationToken,
    sessions: HttpSessions,
}

impl Intake {
    pub(super) fn new(
        live: Arc<Live>,
        prepared: Arc<AtomicBool>,
        tracker: TaskTracker,
        abandon: CancellationToken,
        sessions: HttpSessions,
    ) -> Self {
        Self {
            live,
            prepared,
            tracker,
            abandon,
            sessions,
        }
    }

    /// Screens and routes `envelope` under the live generation, leaving out
    /// the branches `skip` names, and puts the first attempts on the wire.
    /// `lost` cancelled: no new attempt starts.
    pub fn submit(
        &self,
        envelope: Envelope,
        skip: &[String],
        lost: CancellationToken,
    ) -> Result<Submitted, NotTaken> {
        if !self.prepared.load(Ordering::Acquire) {
            return Err(NotTaken::Starting);
        }
        let generation = self.live.current();
        if generation.blocked() {
            return Err(NotTaken::Blocked);
        }
        let envelope = Arc::new(envelope);
        if let Some(barred) = generation.screen.check(&envelope) {
            return Err(NotTaken::Barred(barred));
        }
        if let Some(config) = generation.settings.sessions.as_ref() {
            if let Some(barred) = super::sessions::oversized_id(&envelope, config) {
                return Err(NotTaken::Barred(barred));
            }
            if let Some(id) = super::sessions::session_id(&envelope, config) {
                return self.sessions.submit(id, envelope, generation.clone(), lost);
            }
        }
        let plans = plans(&generation, &envelope, skip)?;
        let branches = plans.iter().map(|p| p.name.clone()).collect();
        let started = generation.engine.start(&envelope, plans);
        let delivery = Box::pin(async move { Ok(started.finish(&generation.engine, &lost).await) });
        Ok(Submitted { branches, delivery })
    }

    /// Runs `work` as a task the forwarder waits for at shutdown, within
    /// its bound (`shutdown_timeout_ms`): past it the work is dropped, as a
    /// consumed message's transaction is.
    pub fn spawn<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let abandon = self.abandon.clone();
        self.tracker.spawn(async move {
            held(&abandon, work).await;
        });
    }
}
