//! Intake: messages that do not come from the inbound queue (the HTTP
//! ingress) go through the same screen, filter table and delivery engine as
//! consumed ones, under the live generation, and their outcome goes back to
//! the caller instead of to settlement: nothing they send is ever acked or
//! dead-lettered, the caller holds the outcome.
//!
//! [`Intake::submit`] admits one envelope through [`admit`] (the queue's
//! screen, session membership and filter table), leaving out branches the
//! caller already has confirmed (a retry), and returns the rest of its
//! delivery as a future that the caller runs (on [`Intake::spawn`], so
//! shutdown waits for it). Two rules differ from the queue's, because a
//! caller is waiting: a barred message is refused on its own (its session,
//! if any, goes on), and a branch whose whole list is down ends at once as
//! an outage (the caller is told to come back) rather than holding;
//! cancelling the `lost` token (the caller's deadline) starts no new
//! attempt. A message of a session goes to the HTTP sessions
//! ([`HttpSessions`]), which deliver each session's messages one at a
//! time, in order.

mod submission;

pub use submission::{Delivery, NotTaken};

use super::admit::{Admission, admit, for_caller};
use super::engine::held;
use super::live::Live;
use super::record::Recorder;
use super::sessions::HttpSessions;
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

    /// Where settled messages are recorded.
    pub fn recorder(&self) -> Recorder {
        self.live.common.recorder.clone()
    }

    /// Admits `envelope` under the live generation, leaving out the
    /// branches `skip` names, and puts the first attempts of an independent
    /// message on the wire. `lost` cancelled: no new attempt starts.
    pub fn submit(
        &self,
        envelope: Envelope,
        skip: &[String],
        lost: CancellationToken,
    ) -> Result<Delivery, NotTaken> {
        if !self.prepared.load(Ordering::Acquire) {
            return Err(NotTaken::Starting);
        }
        let generation = self.live.current();
        if generation.blocked() {
            return Err(NotTaken::Blocked);
        }
        if self.live.common.recorder.holding() {
            return Err(NotTaken::Unrecorded);
        }
        if self.live.common.group.paused() {
            return Err(NotTaken::Paused);
        }
        let envelope = Arc::new(envelope);
        match admit(&generation, &envelope, self.sessions.membership()) {
            Admission::Barred(barred)
            | Admission::Session {
                barred: Some(barred),
                ..
            } => Err(NotTaken::Barred(barred)),
            Admission::Session {
                id,
                generation,
                barred: None,
            } => {
                let answer = self.sessions.submit(id, envelope, &generation, lost)?;
                Ok(Box::pin(async move { Ok(answer.await?) }))
            }
            Admission::Route(plans) => {
                let plans = plans
                    .into_iter()
                    .filter(|p| !skip.iter().any(|s| **s == *p.name))
                    .map(for_caller)
                    .collect();
                let started = generation.engine.start(&envelope, plans);
                Ok(Box::pin(async move {
                    Ok(started.finish(&generation.engine, &lost).await)
                }))
            }
        }
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
