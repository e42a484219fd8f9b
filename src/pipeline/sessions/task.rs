//! One open session: its task takes the session's messages in arrival
//! order, delivers each on every branch through the engine (each branch a
//! [`BranchRun`] over the whole set, so it keeps its endpoint and replays
//! on failover) before taking the next, and settles the set as one unit:
//! - the end message delivered on every branch: every message is acked;
//! - the verdict of a message's branches is a dead letter (`exhausted`,
//!   `rejected`), the screen refused one (its reason), no filter matched
//!   the first (`no-route`), no message for `idle_timeout_ms`
//!   (`session-timeout`), or the set outgrew `max_messages` / `max_bytes`
//!   (`session-too-large`): every message is dead-lettered, in order,
//!   annotated with the session id and, for each message, which branches
//!   hold it and which do not;
//! - the inbound channel lost, or the consumer stopping: nothing is settled.
//!
//! The branches are chosen by the session's first message, and a session
//! runs under the generation (and so the `[sessions]` settings) it opened
//! with. When a branch the first message takes has no endpoint yet (a
//! registrable branch no service has registered into), the session waits,
//! counted as an outage hold so that consuming pauses, for the first live
//! generation where it has one, and runs under that one.

use super::membership::{Arrival, annotation};
use super::progress::{Next, Progress, next};
use super::set::{Closing, Session};
use crate::broker::Receipt;
use crate::envelope::Envelope;
use crate::journal::Said;
use crate::pipeline::admit::route;
use crate::pipeline::engine::{BranchRun, held};
use crate::pipeline::generation::Generation;
use crate::pipeline::outcome::{Barred, Cause, Outcome, Reach, Verdict};
use crate::pipeline::record;
use crate::routing::BranchPlan;
use crate::telemetry::Telemetry;
use std::sync::Arc;
use std::time::SystemTime;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio_util::sync::CancellationToken;

pub(super) struct SessionTask {
    pub(super) session: Session<Arrival>,
    /// The live generation: a first message waiting for a registration
    /// takes the first that routes it.
    pub(super) generations: watch::Receiver<Arc<Generation>>,
    /// The forwarder's shutdown bound.
    pub(super) abandon: CancellationToken,
    pub(super) telemetry: Telemetry,
}

/// What the session holds of its messages until it is settled: the right
/// to settle each, and the prefetch slots they occupy.
#[derive(Default)]
struct Held {
    receipts: Vec<Receipt>,
    permits: Vec<OwnedSemaphorePermit>,
    /// When each was consumed, for the journal.
    received: Vec<SystemTime>,
}

/// How the session ends.
enum End {
    Completed,
    /// Why the whole set is dead-lettered.
    DeadLetter(Cause),
    Abandoned,
}

impl End {
    /// The end a message's verdict calls for, if any.
    fn of(verdict: Verdict) -> Option<Self> {
        match verdict {
            Verdict::Commit => None,
            Verdict::Abandon => Some(Self::Abandoned),
            Verdict::DeadLetter { cause, .. } => Some(Self::DeadLetter(cause)),
        }
    }

    fn barred(barred: Barred) -> Self {
        Self::DeadLetter(Cause::Barred(barred))
    }
}

impl SessionTask {
    pub(super) async fn run(mut self) {
        let Some(config) = self.session.generation.settings.sessions.clone() else {
            self.session.release.release(Closing::Abandoned);
            return;
        };
        let mut progress = Progress::new(config);
        let mut held = Held::default();
        // The channel the session's messages come on: lost, nothing more of it is settled.
        let mut lost = CancellationToken::new();
        let end = self.forward(&mut progress, &mut held, &mut lost).await;
        let closing = match end {
            End::Abandoned => Closing::Abandoned,
            End::Completed | End::DeadLetter(_) => Closing::Closed,
        };
        // Released before settling: a late message meets a closed session.
        self.session.release.release(closing);
        let id = self.session.id.clone();
        match end {
            End::Completed => {
                self.telemetry.session_completed(&id, held.receipts.len());
                for receipt in held.receipts {
                    receipt.ack();
                }
                // Acks on a lost channel never reach the broker: it delivers
                // the set again.
                let said = record::said_on(&Verdict::Commit, lost.is_cancelled());
                let (envelopes, branches) = progress.into_parts();
                self.record(
                    &envelopes,
                    &held.received,
                    &branches,
                    |_| said.clone(),
                    |_, _| "delivered",
                );
            }
            End::Abandoned => self.telemetry.session_abandoned(&id, held.receipts.len()),
            End::DeadLetter(cause) => self.dead_letter(progress, held, cause).await,
        }
        self.late_arrivals(closing, &lost).await;
    }

    /// Forwards messages as they arrive until the session ends.
    async fn forward(
        &mut self,
        progress: &mut Progress,
        held: &mut Held,
        lost: &mut CancellationToken,
    ) -> End {
        let mut generation = self.session.generation.clone();
        loop {
            let idle = progress.idle_timeout();
            let stop = &self.session.stop;
            let coming = async {
                tokio::select! {
                    biased;
                    () = lost.cancelled() => Next::Stopped,
                    next = next(&mut self.session.items, idle, generation.group.pause_changes(), stop) => next,
                }
            };
            let arrival = match held_or_stopped(&self.abandon, coming).await {
                Next::Stopped => return End::Abandoned,
                Next::Idle(idle) => return End::barred(Barred::SessionTimeout { idle }),
                Next::Item(arrival) => arrival,
            };
            let Arrival {
                envelope,
                receipt,
                permit,
                refused,
                received_at,
            } = arrival;
            held.received.push(received_at);
            if held.receipts.is_empty() {
                *lost = receipt.lost().clone();
            }
            held.receipts.push(receipt);
            held.permits.push(permit);
            let end = match progress.take(envelope) {
                Ok(end) => end,
                Err(barred) => return End::barred(refused.unwrap_or(barred)),
            };
            if let Some(barred) = refused {
                return End::barred(barred);
            }
            if let Some(first) = progress.unrouted_first().cloned() {
                match self.routable(generation, &first, lost).await {
                    Some(routable) => generation = routable,
                    None => return End::Abandoned,
                }
            }
            let routing = &generation.settings.routing;
            let routed = progress.route(&generation, |first| route(routing, first));
            if let Err(barred) = routed {
                return End::barred(barred);
            }
            let outcome: Outcome = progress.deliver(&generation, &self.session.id, lost).await;
            if let Some(ended) = End::of(outcome.verdict()) {
                return ended;
            }
            if end {
                return End::Completed;
            }
        }
    }

    /// The generation the session's first message `first` is routed
    /// under: `current`, unless a branch it takes has no endpoint; then the
    /// first live generation where every such branch has one, waited for
    /// as an outage hold. `None` when the channel is lost or the session
    /// stopped first (its messages go back to the queue).
    async fn routable(
        &self,
        current: Arc<Generation>,
        first: &Envelope,
        lost: &CancellationToken,
    ) -> Option<Arc<Generation>> {
        let waits = |generation: &Generation| {
            route(&generation.settings.routing, first)
                .is_ok_and(|plans| plans.iter().any(BranchPlan::is_empty))
        };
        if !waits(&current) {
            return Some(current);
        }
        let _held = current.engine.outages().counted();
        let mut changes = self.generations.clone();
        loop {
            let live = changes.borrow_and_update().clone();
            if !waits(&live) {
                return Some(live);
            }
            tokio::select! {
                () = lost.cancelled() => return None,
                () = self.session.stop.cancelled() => return None,
                () = self.abandon.cancelled() => return None,
                changed = changes.changed() => changed.ok()?,
            }
        }
    }

    /// Dead-letters every message of the set, in order. Each records which
    /// branches hold it (their endpoint has the set up to it, in order) and
    /// which do not: a branch that failed holds none of the set, since the
    /// set must reach it whole; the message a whole-set failure stopped at
    /// reached no branch.
    async fn dead_letter(&self, progress: Progress, holding: Held, cause: Cause) {
        let id = &self.session.id;
        let Held {
            receipts,
            permits,
            received,
        } = holding;
        self.telemetry
            .session_dead_lettered(id, cause.reason().as_str(), receipts.len());
        let lost = receipts.first().map(|r| r.lost().clone());
        let (envelopes, branches) = progress.into_parts();
        let branches: &[BranchRun] = &branches;
        let letters = envelopes
            .iter()
            .cloned()
            .zip(receipts)
            .enumerate()
            .map(|(index, (envelope, receipt))| {
                let reached = branches
                    .iter()
                    .map(|branch| {
                        let name = branch.name();
                        let failed = cause.failed_branches().any(|f| f.branch == *name);
                        Reach {
                            branch: name.clone(),
                            holds: !failed && index < branch.holds(),
                        }
                    })
                    .collect();
                let verdict = Verdict::DeadLetter {
                    cause: cause.clone(),
                    reached,
                };
                (envelope, receipt, verdict)
            })
            .collect();
        let settler = &self.session.generation.settler;
        let settled = settler.settle_set(letters, annotation(id));
        let settled = held(&self.abandon, settled).await.is_some();
        drop(permits);
        if settled {
            let verdict = Verdict::DeadLetter {
                cause: cause.clone(),
                reached: Vec::new(),
            };
            // A set whose channel was lost midway goes back to the queue whole.
            let said = record::said_on(&verdict, lost.is_some_and(|l| l.is_cancelled()));
            let result = |index: usize, branch: &BranchRun| {
                if cause.failed_branches().any(|f| f.branch == *branch.name()) {
                    "failed"
                } else if index < branch.holds() {
                    "delivered"
                } else {
                    "not-sent"
                }
            };
            self.record(&envelopes, &received, branches, |_| said.clone(), result);
        }
    }

    /// Tells the journal of every message of the set, settled as `said`
    /// says, each branch's result for a message as `result` says.
    fn record(
        &self,
        envelopes: &[Arc<Envelope>],
        received: &[SystemTime],
        branches: &[BranchRun],
        said: impl Fn(usize) -> Said,
        result: impl Fn(usize, &BranchRun) -> &'static str,
    ) {
        let journal = &self.session.generation.recorder;
        if !journal.wanted() {
            return;
        }
        for (index, (envelope, received_at)) in envelopes.iter().zip(received).enumerate() {
            let steps = branches
                .iter()
                .map(|b| record::for_message(b.name(), result(index, b), b.trail(), index))
                .collect();
            let source = record::source_of(envelope);
            let mut entry = record::entry(envelope, source, *received_at, said(index), steps);
            entry.session = Some(self.session.id.clone());
            journal.settled(entry);
        }
    }

    /// Settles messages that reached the session after it ended: as
    /// `session-closed` when it closed, back to the queue when abandoned.
    async fn late_arrivals(&mut self, closing: Closing, lost: &CancellationToken) {
        let Session {
            id,
            generation,
            items,
            ..
        } = &mut self.session;
        items.close();
        while let Some(arrival) = items.recv().await {
            if closing == Closing::Abandoned || lost.is_cancelled() {
                continue;
            }
            let verdict = Verdict::barred(Barred::SessionEnded { id: id.clone() });
            self.telemetry.session_closed_arrival(
                id,
                &arrival.envelope.message_id(),
                std::time::Duration::ZERO,
            );
            let said = record::said(&verdict);
            generation
                .settler
                .settle_with(&arrival.envelope, arrival.receipt, verdict, annotation(id))
                .await;
            if generation.recorder.wanted() {
                let envelope = &arrival.envelope;
                let source = record::source_of(envelope);
                let mut entry =
                    record::entry(envelope, source, arrival.received_at, said, Vec::new());
                entry.session = Some(id.clone());
                generation.recorder.settled(entry);
            }
        }
    }
}

/// `coming`, unless the shutdown bound `abandon` is reached first.
async fn held_or_stopped<T>(
    abandon: &CancellationToken,
    coming: impl std::future::Future<Output = Next<T>>,
) -> Next<T> {
    held(abandon, coming).await.unwrap_or(Next::Stopped)
}
