//! One session's progress, the same for both sources: its messages so far
//! against `max_messages` and `max_bytes`, whether one of them ends it, its
//! branches (chosen by its first message, each a [`BranchRun`] that keeps
//! its endpoint and replays the set on failover), and its next item within
//! `idle_timeout_ms` (one timer, in its task, for both sources, stopped
//! while the group is paused).

use super::membership::is_end;
use crate::config;
use crate::envelope::Envelope;
use crate::journal::Tried;
use crate::pipeline::engine::{BranchRun, Walk};
use crate::pipeline::generation::Generation;
use crate::pipeline::outcome::{Barred, Outcome};
use crate::routing::BranchPlan;
use futures_util::future::join_all;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// What came for a session.
pub(crate) enum Next<T> {
    Item(T),
    /// Nothing for this long: `idle_timeout_ms`.
    Idle(Duration),
    /// The session is stopped, or no more items can come.
    Stopped,
}

/// The next of `items` within `idle`, unless `stop` is cancelled first.
/// The clock stops while the group is paused (`paused`): nothing is taken
/// for a session then, and once resumed it has its whole `idle` again.
pub(crate) async fn next<T>(
    items: &mut mpsc::UnboundedReceiver<T>,
    idle: Duration,
    mut paused: watch::Receiver<bool>,
    stop: &CancellationToken,
) -> Next<T> {
    let mut following = true;
    loop {
        let clock_stopped = *paused.borrow_and_update();
        let clock = async {
            match clock_stopped {
                true => std::future::pending().await,
                false => tokio::time::sleep(idle).await,
            }
        };
        let pause_changed = async {
            match following {
                true => paused.changed().await.is_ok(),
                false => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => return Next::Stopped,
            item = items.recv() => return item.map_or(Next::Stopped, Next::Item),
            () = clock => return Next::Idle(idle),
            // A pause or a resume: the clock stops, or starts again whole.
            still = pause_changed => following = still,
        }
    }
}

/// A session's messages so far and its branches.
pub(crate) struct Progress {
    config: config::Sessions,
    envelopes: Vec<Arc<Envelope>>,
    bytes: u64,
    branches: Vec<BranchRun>,
}

impl Progress {
    /// A session under `config`, with no message yet.
    pub(crate) fn new(config: config::Sessions) -> Self {
        Self {
            config,
            envelopes: Vec::new(),
            bytes: 0,
            branches: Vec::new(),
        }
    }

    /// How long the session waits for its next message.
    pub(crate) fn idle_timeout(&self) -> Duration {
        self.config.idle_timeout
    }

    /// Adds `envelope` to the set; whether it ends the session, or why the
    /// set may not grow by it (it is counted in the set all the same).
    pub(crate) fn take(&mut self, envelope: Arc<Envelope>) -> Result<bool, Barred> {
        let end = is_end(&envelope, &self.config);
        self.bytes += envelope.body.len() as u64;
        self.envelopes.push(envelope);
        let messages = self.envelopes.len();
        if messages > self.config.max_messages as usize || self.bytes > self.config.max_bytes {
            return Err(Barred::SessionTooLarge {
                messages,
                bytes: self.bytes,
                max_messages: self.config.max_messages,
                max_bytes: self.config.max_bytes,
            });
        }
        Ok(end)
    }

    /// The first message, while the branches are not chosen yet.
    pub(crate) fn unrouted_first(&self) -> Option<&Arc<Envelope>> {
        self.branches
            .is_empty()
            .then(|| self.envelopes.first())
            .flatten()
    }

    /// Chooses the branches by the first message, through `route`, when
    /// they are not chosen yet.
    pub(crate) fn route(
        &mut self,
        generation: &Generation,
        route: impl FnOnce(&Envelope) -> Result<Vec<BranchPlan>, Barred>,
    ) -> Result<(), Barred> {
        if !self.branches.is_empty() {
            return Ok(());
        }
        let Some(first) = self.envelopes.first() else {
            return Ok(());
        };
        let plans = route(first)?;
        self.branches = plans
            .into_iter()
            .map(|plan| BranchRun::new(plan, &generation.engine))
            .collect();
        Ok(())
    }

    /// Delivers the set's newest message on every branch (each replays
    /// what its endpoint lacks first); `lost` cancelled: no new attempt.
    pub(crate) async fn deliver(
        &mut self,
        generation: &Generation,
        id: &str,
        lost: &CancellationToken,
    ) -> Outcome {
        let walk = Walk {
            engine: &generation.engine,
            lost,
            session: Some(id),
        };
        let run = &self.envelopes;
        let branches = join_all(
            self.branches
                .iter_mut()
                .map(|b| b.deliver(run, None, &walk)),
        )
        .await;
        Outcome {
            branches,
            trails: Vec::new(),
        }
    }

    /// Each branch's steps for the set's newest message (its replays of
    /// earlier ones are theirs), for a caller that records this message
    /// alone (a request over HTTP).
    pub(crate) fn newest_trails(&self) -> Vec<Vec<Tried>> {
        let newest = self.envelopes.len().saturating_sub(1);
        self.branches
            .iter()
            .map(|b| {
                let steps = b.trail().iter().filter(|t| t.index as usize == newest);
                steps.cloned().collect()
            })
            .collect()
    }

    /// Takes the messages out, for settling, with the branches.
    pub(crate) fn into_parts(self) -> (Vec<Arc<Envelope>>, Vec<BranchRun>) {
        (self.envelopes, self.branches)
    }
}
