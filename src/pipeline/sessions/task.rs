//! One open session: its task takes the session's messages in arrival
//! order, forwards each on every branch (see [`super::affinity`]) before
//! taking the next, and settles the set as one unit:
//! - the end message delivered on every branch: every message is acked;
//! - a branch exhausted its list (`exhausted`), the broker refused a message
//!   itself (`rejected`), the screen refused one (its reason), no filter
//!   matched the first (`no-route`), no message for `idle_timeout_ms`
//!   (`session-timeout`), or the set outgrew `max_messages` / `max_bytes`
//!   (`session-too-large`): every message is dead-lettered, in order,
//!   annotated with the session id;
//! - the inbound channel lost, or the consumer stopping: nothing is settled.
//!
//! The branches are chosen by the session's first message.

use super::affinity::{Affinity, Context, Step};
use super::{Arrival, Closing, Sessions, annotation, is_end};
use crate::broker::Receipt;
use crate::envelope::Envelope;
use crate::pipeline::generation::Generation;
use crate::pipeline::outcome::{Reason, Verdict};
use futures_util::future::join_all;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;

pub(super) struct SessionTask {
    pub(super) id: Arc<str>,
    pub(super) serial: u64,
    pub(super) generation: Arc<Generation>,
    pub(super) sessions: Sessions,
    pub(super) messages: mpsc::UnboundedReceiver<Arrival>,
    pub(super) lost: CancellationToken,
    pub(super) stop: CancellationToken,
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
    DeadLetter(Failure),
    Abandoned,
}

/// Why the whole set is dead-lettered.
struct Failure {
    reason: Reason,
    error: String,
    /// The branches that failed, each with the endpoint that refused last;
    /// empty when the set as a whole failed (every branch is named then).
    failed: Vec<(String, String)>,
}

impl Failure {
    fn whole(reason: Reason, error: String) -> Self {
        Self {
            reason,
            error,
            failed: Vec::new(),
        }
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
        self.sessions.release(&self.id, self.serial, closing);
        let telemetry = &self.sessions.telemetry;
        match end {
            End::Completed => {
                telemetry.session_completed(&self.id, set.receipts.len());
                for receipt in set.receipts {
                    receipt.ack();
                }
            }
            End::Abandoned => telemetry.session_abandoned(&self.id, set.receipts.len()),
            End::DeadLetter(failure) => self.dead_letter(set, &branches, failure).await,
        }
        self.late_arrivals(closing).await;
    }

    /// Forwards messages as they arrive until the session ends.
    async fn forward(&mut self, set: &mut Set, branches: &mut Vec<Affinity>) -> End {
        let generation = self.generation.clone();
        let Some(config) = generation.settings.sessions.as_ref() else {
            return End::Abandoned;
        };
        let abandon = self.sessions.abandon.clone();
        loop {
            let next = tokio::select! {
                biased;
                () = self.stop.cancelled() => return End::Abandoned,
                () = self.lost.cancelled() => return End::Abandoned,
                () = abandon.cancelled() => return End::Abandoned,
                next = tokio::time::timeout(config.idle_timeout, self.messages.recv()) => next,
            };
            let arrival = match next {
                Err(_) => {
                    return End::DeadLetter(Failure::whole(
                        Reason::SessionTimeout,
                        format!(
                            "no message of the session for {} ms",
                            config.idle_timeout.as_millis()
                        ),
                    ));
                }
                Ok(None) => return End::Abandoned,
                Ok(Some(arrival)) => arrival,
            };
            let refused = arrival.refused.clone();
            let end = is_end(&arrival.envelope, config);
            set.push(arrival);
            if let Some(Verdict::DeadLetter { reason, error, .. }) = refused {
                return End::DeadLetter(Failure::whole(reason, error));
            }
            if set.envelopes.len() > config.max_messages as usize || set.bytes > config.max_bytes {
                return End::DeadLetter(Failure::whole(
                    Reason::SessionTooLarge,
                    format!(
                        "the session holds {} messages and {} bytes, over sessions.max_messages \
                         ({}) or sessions.max_bytes ({})",
                        set.envelopes.len(),
                        set.bytes,
                        config.max_messages,
                        config.max_bytes
                    ),
                ));
            }
            if branches.is_empty() {
                let plans = generation.settings.routing.route(&set.envelopes[0]);
                if plans.is_empty() {
                    let Verdict::DeadLetter { reason, error, .. } = Verdict::no_route() else {
                        return End::Abandoned;
                    };
                    return End::DeadLetter(Failure::whole(reason, error));
                }
                branches.extend(
                    plans
                        .into_iter()
                        .map(|plan| Affinity::new(plan, &generation.publishers)),
                );
            }
            let cx = Context {
                publishers: &generation.publishers,
                session: &self.id,
                lost: &self.lost,
            };
            let envelopes = &set.envelopes;
            let steps = join_all(branches.iter_mut().map(|b| b.deliver(envelopes, &cx))).await;
            if let Some(end) = verdict(branches, steps) {
                return end;
            }
            if end {
                return End::Completed;
            }
        }
    }

    /// Dead-letters every message of the set, in order.
    async fn dead_letter(&self, set: Set, branches: &[Affinity], failure: Failure) {
        let telemetry = &self.sessions.telemetry;
        telemetry.session_dead_lettered(&self.id, failure.reason.as_str(), set.receipts.len());
        let (failed, refused_by): (Vec<String>, Vec<String>) = if failure.failed.is_empty() {
            branches
                .iter()
                .map(|b| (b.plan.name.to_string(), String::new()))
                .unzip()
        } else {
            failure.failed.iter().cloned().unzip()
        };
        let whole = failure.failed.is_empty();
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
                let delivered = if whole {
                    Vec::new()
                } else {
                    branches
                        .iter()
                        .filter(|b| {
                            index < b.delivered && !failed.iter().any(|f| *f == *b.plan.name)
                        })
                        .map(|b| b.plan.name.to_string())
                        .collect()
                };
                let verdict = Verdict::DeadLetter {
                    reason: failure.reason,
                    error: failure.error.clone(),
                    failed: failed.clone(),
                    refused_by: refused_by.clone(),
                    delivered,
                };
                (envelope, receipt, verdict)
            })
            .collect();
        let settled = self
            .generation
            .settler
            .settle_set(letters, annotation(&self.id));
        tokio::select! {
            biased;
            () = self.sessions.abandon.cancelled() => {}
            () = settled => {}
        }
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
            let verdict = Verdict::refuse(
                Reason::SessionClosed,
                format!("session \"{}\" ended before this message came", self.id),
            );
            self.sessions.telemetry.session_closed_arrival(
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

/// The end the branches' steps for one message call for, if any: abandoned
/// when any branch lost its channel, dead-lettered when any failed.
fn verdict(branches: &[Affinity], steps: Vec<Step>) -> Option<End> {
    let mut failed = Vec::new();
    let mut errors = Vec::new();
    let mut reason = Reason::Exhausted;
    for (branch, step) in branches.iter().zip(steps) {
        match step {
            Step::Delivered => {}
            Step::Abandoned => return Some(End::Abandoned),
            Step::Failed { endpoint, error } => {
                errors.push(format!("{}: {error}", branch.plan.name));
                failed.push((branch.plan.name.to_string(), endpoint));
            }
            Step::Rejected { endpoint, error } => {
                reason = Reason::Rejected;
                errors.push(format!("{}: {error}", branch.plan.name));
                failed.push((branch.plan.name.to_string(), endpoint));
            }
        }
    }
    (!failed.is_empty()).then(|| {
        End::DeadLetter(Failure {
            reason,
            error: errors.join("; "),
            failed,
        })
    })
}
