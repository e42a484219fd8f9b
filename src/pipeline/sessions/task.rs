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
//! with.

use super::membership::{Arrival, Closing, annotation, is_end};
use crate::broker::Receipt;
use crate::envelope::Envelope;
use crate::pipeline::engine::{self, BranchRun, Walk, held};
use crate::pipeline::generation::Generation;
use crate::pipeline::outcome::{Barred, Cause, Outcome, Reach, Verdict};
use crate::telemetry::Telemetry;
use futures_util::future::join_all;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;

/// Frees the session's slot in the registry, saying how it closed.
pub(super) type Release = Box<dyn FnOnce(Closing) + Send + Sync>;

pub(super) struct SessionTask {
    pub(super) id: Arc<str>,
    pub(super) generation: Arc<Generation>,
    pub(super) messages: mpsc::UnboundedReceiver<Arrival>,
    pub(super) lost: CancellationToken,
    pub(super) stop: CancellationToken,
    /// The forwarder's shutdown bound.
    pub(super) abandon: CancellationToken,
    pub(super) telemetry: Telemetry,
    /// Called once, before the set is settled.
    pub(super) release: Option<Release>,
}

/// The messages of the session so far, in arrival order.
#[derive(Default)]
struct Set {
    envelopes: Vec<Arc<Envelope>>,
    receipts: Vec<Receipt>,
    /// Held until the set is settled: the prefetch slots it occupies.
    permits: Vec<OwnedSemaphorePermit>,
    bytes: u64,
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
        let mut set = Set::default();
        let mut branches = Vec::new();
        let end = self.forward(&mut set, &mut branches).await;
        let closing = match end {
            End::Abandoned => Closing::Abandoned,
            End::Completed | End::DeadLetter(_) => Closing::Closed,
        };
        // Released before settling: a late message meets a closed session.
        if let Some(release) = self.release.take() {
            release(closing);
        }
        match end {
            End::Completed => {
                self.telemetry
                    .session_completed(&self.id, set.receipts.len());
                for receipt in set.receipts {
                    receipt.ack();
                }
            }
            End::Abandoned => self
                .telemetry
                .session_abandoned(&self.id, set.receipts.len()),
            End::DeadLetter(cause) => self.dead_letter(set, &branches, cause).await,
        }
        self.late_arrivals(closing).await;
    }

    /// Forwards messages as they arrive until the session ends.
    async fn forward(&mut self, set: &mut Set, branches: &mut Vec<BranchRun>) -> End {
        let generation = self.generation.clone();
        let Some(config) = generation.settings.sessions.as_ref() else {
            return End::Abandoned;
        };
        loop {
            let next = async {
                tokio::select! {
                    biased;
                    () = self.stop.cancelled() => None,
                    () = self.lost.cancelled() => None,
                    next = tokio::time::timeout(config.idle_timeout, self.messages.recv()) => Some(next),
                }
            };
            let arrival = match held(&self.abandon, next).await.flatten() {
                None | Some(Ok(None)) => return End::Abandoned,
                Some(Err(_)) => {
                    return End::barred(Barred::SessionTimeout {
                        idle: config.idle_timeout,
                    });
                }
                Some(Ok(Some(arrival))) => arrival,
            };
            let refused = arrival.refused.clone();
            let end = is_end(&arrival.envelope, config);
            set.push(arrival);
            if let Some(barred) = refused {
                return End::barred(barred);
            }
            if set.envelopes.len() > config.max_messages as usize || set.bytes > config.max_bytes {
                return End::barred(Barred::SessionTooLarge {
                    messages: set.envelopes.len(),
                    bytes: set.bytes,
                    max_messages: config.max_messages,
                    max_bytes: config.max_bytes,
                });
            }
            if branches.is_empty() {
                let routing = &generation.settings.routing;
                match engine::route(routing, &set.envelopes[0], None) {
                    Ok(plans) => branches.extend(
                        plans
                            .into_iter()
                            .map(|plan| BranchRun::new(plan, &generation.engine)),
                    ),
                    Err(barred) => return End::barred(barred),
                }
            }
            let walk = Walk {
                engine: &generation.engine,
                lost: &self.lost,
                session: Some(&self.id),
            };
            let run = &set.envelopes;
            let outcomes = join_all(branches.iter_mut().map(|b| b.deliver(run, None, &walk))).await;
            if let Some(ended) = End::of(Outcome { branches: outcomes }.verdict()) {
                return ended;
            }
            if end {
                return End::Completed;
            }
        }
    }

    /// Dead-letters every message of the set, in order. Each records which
    /// branches hold it (their endpoint has the set up to it, in order) and
    /// which do not: a branch that failed holds none of the set, since the
    /// set must reach it whole; the message a whole-set failure stopped at
    /// reached no branch.
    async fn dead_letter(&self, set: Set, branches: &[BranchRun], cause: Cause) {
        self.telemetry
            .session_dead_lettered(&self.id, cause.reason().as_str(), set.receipts.len());
        let Set {
            envelopes,
            receipts,
            permits,
            ..
        } = set;
        let letters = envelopes
            .into_iter()
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
        let settled = self
            .generation
            .settler
            .settle_set(letters, annotation(&self.id));
        held(&self.abandon, settled).await;
        drop(permits);
    }

    /// Settles messages that reached the session after it ended: as
    /// `session-closed` when it closed, back to the queue when abandoned.
    async fn late_arrivals(&mut self, closing: Closing) {
        self.messages.close();
        while let Some(arrival) = self.messages.recv().await {
            if closing == Closing::Abandoned || self.lost.is_cancelled() {
                continue;
            }
            let verdict = Verdict::barred(Barred::SessionEnded {
                id: self.id.clone(),
            });
            self.telemetry.session_closed_arrival(
                &self.id,
                arrival.envelope.message_id(),
                std::time::Duration::ZERO,
            );
            self.generation
                .settler
                .settle_with(
                    &arrival.envelope,
                    arrival.receipt,
                    verdict,
                    annotation(&self.id),
                )
                .await;
        }
    }
}

impl Set {
    fn push(&mut self, arrival: Arrival) {
        self.bytes += arrival.envelope.body.len() as u64;
        self.envelopes.push(arrival.envelope);
        self.receipts.push(arrival.receipt);
        self.permits.push(arrival.permit);
    }
}
