//! Deliver: the one delivery engine. A branch delivers an ordered run of
//! one or more messages to its endpoint list ([`BranchRun`], in `walk`):
//! an independent message is a run of one; a session is a run that keeps
//! its endpoint, replays its confirmed prefix on failover and settles as a
//! set (the `sessions` module drives it). Every failover rule, retry,
//! suspect isolation, outage wait and replay is written once, there.
//!
//! - [`Engine::start`] submits every branch's first attempt of a run of one
//!   at once, in the order messages arrive, so the happy path keeps inbound
//!   order per endpoint; [`Started::finish`] then runs the branches
//!   concurrently to their outcomes. A delivered branch is never sent again.
//! - [`held`] and [`spawn_held`]: work that the shutdown bound abandons
//!   (its receipts and prefetch permits dropped, so the broker requeues
//!   the messages).
//!
//! The engine publishes through [`crate::broker::Publish`], so it runs the
//! same against the broker and against a scripted stand-in in unit tests.

mod outage;
mod walk;

#[cfg(test)]
mod tests;

pub use outage::Outages;
pub use walk::{BranchRun, Walk};

use super::outcome::{BranchOutcome, Outcome};
use crate::broker::{Attempt, Publish};
use crate::envelope::Envelope;
use crate::journal::Tried;
use crate::routing::BranchPlan;
use crate::telemetry::Telemetry;
use crate::wire::Trace;
use futures_util::future::join_all;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What every walk shares: where it publishes, the outage count, the
/// telemetry it reports to. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    publish: Arc<dyn Publish>,
    outages: Outages,
    telemetry: Telemetry,
    /// Whether walks record their steps (the journal or span export is on).
    recording: bool,
    /// The share of new traces sampled.
    sample_ratio: f64,
}

impl Engine {
    /// An engine publishing through `publish`, counting outage waits in
    /// `outages`.
    pub fn new(publish: Arc<dyn Publish>, outages: Outages, telemetry: Telemetry) -> Self {
        Self {
            publish,
            outages,
            telemetry,
            recording: false,
            sample_ratio: 1.0,
        }
    }

    /// The same engine, recording every walk's steps when `recording` (for
    /// the journal and span export), sampling new traces at `sample_ratio`.
    pub fn recording(mut self, recording: bool, sample_ratio: f64) -> Self {
        self.recording = recording;
        self.sample_ratio = sample_ratio;
        self
    }

    /// Whether a copy of a message in `trace` says it is sampled: as its
    /// producer said, or by the ratio for a new trace.
    pub fn sampled(&self, trace: &Trace) -> bool {
        crate::traces::sampled(trace, self.sample_ratio)
    }

    /// The outage waits this engine counts in.
    pub fn outages(&self) -> &Outages {
        &self.outages
    }

    /// Submits the first attempt of every branch of a run of one, now.
    pub fn start(&self, envelope: &Arc<Envelope>, plans: Vec<BranchPlan>) -> Started {
        let branches = plans
            .into_iter()
            .map(|plan| {
                let mut run = BranchRun::new(plan, self);
                let first = run.submit(self, envelope);
                (run, first)
            })
            .collect();
        Started {
            envelope: envelope.clone(),
            branches,
        }
    }
}

/// A run of one whose first attempts are on the wire.
pub struct Started {
    envelope: Arc<Envelope>,
    branches: Vec<(BranchRun, Option<Attempt>)>,
}

impl Started {
    /// Runs every branch to its outcome through `engine` (the one that
    /// started it). `lost` is cancelled when the inbound channel is lost:
    /// no new attempt starts after that.
    pub async fn finish(self, engine: &Engine, lost: &CancellationToken) -> Outcome {
        let Started { envelope, branches } = self;
        let walk = Walk {
            engine,
            lost,
            session: None,
        };
        let run = std::slice::from_ref(&envelope);
        let deliveries = branches.into_iter().map(|(mut branch, first)| {
            let walk = &walk;
            async move {
                let outcome = branch.deliver(run, first, walk).await;
                (outcome, branch.take_trail())
            }
        });
        // Each delivery is boxed where it is made. Held inline, or side by
        // side in `join_all`'s one slice, they made every transaction's task
        // larger to allocate and to move (the layout keeps a moved-from
        // future's slot until its scope ends).
        let mut deliveries = deliveries.map(Box::pin);
        // One branch (one-to-one forwarding) needs no join.
        let ended: Vec<(BranchOutcome, Vec<Tried>)> = if deliveries.len() == 1 {
            match deliveries.next() {
                Some(delivery) => vec![delivery.await],
                None => Vec::new(),
            }
        } else {
            join_all(deliveries).await
        };
        let (branches, trails) = ended.into_iter().unzip();
        Outcome { branches, trails }
    }
}

/// Runs `work` as a tracked task holding `permit` (its prefetch slot) until
/// it ends or `abandon` (the shutdown bound) drops it, with whatever it
/// holds: the broker then requeues its message.
pub fn spawn_held<F>(
    tracker: &TaskTracker,
    abandon: &CancellationToken,
    permit: OwnedSemaphorePermit,
    work: F,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let abandon = abandon.clone();
    tracker.spawn(async move {
        held(&abandon, work).await;
        drop(permit);
    });
}

/// Runs `work` unless `abandon` (the shutdown bound) is cancelled first;
/// `None` when it was abandoned. Whatever `work` holds (receipts, prefetch
/// permits) is dropped with it, so the broker requeues its messages.
pub async fn held<F: Future>(abandon: &CancellationToken, work: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        () = abandon.cancelled() => None,
        done = work => Some(done),
    }
}
