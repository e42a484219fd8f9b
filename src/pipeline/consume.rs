//! Consume: deliveries → transactions, under peek-lock.
//!
//! Each delivery is screened and routed under the live generation and its
//! first publishes submitted inline, in arrival order; the rest of its
//! transaction (confirms, failovers, settlement) runs as a tracked task that
//! keeps that generation, so a slow endpoint delays only its own messages
//! and a reload never splits a message between two configurations. A permit
//! per message bounds the work in flight by `prefetch`, across consumer
//! reconnects too: a transaction keeps its permit until it ends, even when
//! the channel it came on is gone. While a publishing broker blocks
//! publishers (a resource alarm), no new message is taken. When the
//! consumer is lost it is reopened (the queue re-declared first when
//! `inbound.declare` is on); transactions of the lost channel start no new
//! publishes, and the broker redelivers their messages (at-least-once).
//!
//! A reload that changes `[inbound]` (or its broker) cancels the consumer,
//! waits until every transaction has settled on the old channel, closes it
//! and opens the new consumer with a fresh `prefetch` of permits, so no
//! message is lost or acked twice.

use super::admit::{Admission, admit};
use super::engine::spawn_held;
use super::generation::Generation;
use super::live::Live;
use super::outcome::Verdict;
use super::sessions::{self, Sessions};
use crate::backoff::Backoff;
use crate::broker::{
    ConnectError, ConsumeError, InboundChannel, Receipt, open_inbound, redeclare_inbound,
};
use crate::envelope::Envelope;
use crate::reload::Reload;
use crate::telemetry::Telemetry;
use futures_util::future::Either;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why the inner consume loop left its channel.
enum Leave {
    Shutdown,
    Lost,
    Reconfigured,
    /// The connector moved to a more preferred node of the broker.
    Moved,
    /// The broker cancelled the consumer (`basic.cancel`: a quorum queue
    /// moving its leader, the queue deleted) on a channel still open.
    Cancelled,
}

/// The consumer's state: what it takes messages under and hands them to.
pub(super) struct Consumer {
    /// The live generation, and reloads to apply to it.
    pub(super) live: Arc<Live>,
    pub(super) reloads: Option<mpsc::Receiver<Reload>>,
    /// Where messages of a session go.
    pub(super) sessions: Sessions,
    /// Every transaction task, awaited at shutdown.
    pub(super) tracker: TaskTracker,
    /// The shutdown bound: unfinished transactions are dropped.
    pub(super) abandon: CancellationToken,
    /// True while consuming, for readiness.
    pub(super) consuming: Arc<AtomicBool>,
    pub(super) telemetry: Telemetry,
}

impl Consumer {
    /// Consumes until `shutdown`, applying each reload as it comes; returns
    /// the channel still open, to be closed once in-flight transactions have
    /// drained.
    pub(super) async fn consume_until(
        mut self,
        shutdown: &CancellationToken,
    ) -> Option<InboundChannel> {
        let mut reloads = self.reloads.take();
        let reloads = &mut reloads;
        let consumer = &self;
        let telemetry = &self.telemetry;
        let (mut permits, mut prefetch) = permits_for(&consumer.live.current());
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        // Set when the inbound queue may be gone (the broker cancelled the
        // consumer, or said the queue is not found). Only then is it declared
        // again: after a lost connection the declaration would wait on a
        // connection that may be moving nodes, delaying the consumer for no
        // gain.
        let mut redeclare = false;
        while !shutdown.is_cancelled() {
            let generation = consumer.live.current();
            let settings = &generation.settings;
            let queue_side = settings.queue().zip(generation.topology_connector());
            let (Some(((inbound, dead_letter), topology)), Some(consume_connector)) =
                (queue_side, generation.consume_connector.clone())
            else {
                // No inbound queue (the HTTP ingress alone): nothing to
                // consume, unless a reload adds one.
                drop(generation);
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    reload = next_reload(reloads) => {
                        if consumer.live.reload(reload, shutdown).await {
                            (permits, prefetch) = permits_for(&consumer.live.current());
                        }
                    }
                }
                continue;
            };
            let queue = inbound.queue.clone();
            let queue = &queue;
            if std::mem::take(&mut redeclare) && inbound.declare {
                // A deleted inbound queue comes back; anything else is logged by
                // the open below.
                let _ = redeclare_inbound(topology, (inbound, dead_letter)).await;
            }
            let opened = tokio::select! {
                () = shutdown.cancelled() => return None,
                opened = open_inbound(&consume_connector.0, &settings.name, inbound) => opened,
            };
            let prefetch_now = inbound.prefetch;
            let mut inbound = match opened {
                Ok(inbound) => inbound,
                Err(why) => {
                    redeclare = why.queue_not_found();
                    let connector = consume_connector.0.clone();
                    let retry = match why {
                        // Logged by the connector, with its next try: the one to wait for.
                        ConsumeError::Connect(
                            ConnectError::Refused { .. }
                            | ConnectError::Connect { .. }
                            | ConnectError::BackingOff { .. },
                        ) => Either::Left(async move {
                            connector.next_attempt().await;
                        }),
                        other => {
                            telemetry.consumer_lost(queue, &other.to_string());
                            Either::Right(tokio::time::sleep(backoff.next_delay()))
                        }
                    };
                    drop(generation);
                    // A reload may be what fixes the consumer: it is applied at once.
                    tokio::select! {
                        () = shutdown.cancelled() => return None,
                        () = retry => {}
                        reload = next_reload(reloads) => {
                            if consumer.live.reload(reload, shutdown).await {
                                // Transactions of a lost channel end soon; the bound holds meanwhile.
                                tokio::select! {
                                    () = shutdown.cancelled() => return None,
                                    _ = permits.acquire_many(prefetch) => {}
                                }
                                (permits, prefetch) = permits_for(&consumer.live.current());
                            }
                        }
                    }
                    continue;
                }
            };
            backoff.reset();
            telemetry.consuming(queue, prefetch_now);
            consumer.consuming.store(true, Ordering::Relaxed);
            let mut moves = consume_connector.0.epochs();
            drop(generation);
            let channel = Channel {
                inbound: &mut inbound,
                permits: &permits,
                moves: &mut moves,
            };
            let leave = consume_channel(consumer, reloads, shutdown, channel).await;
            consumer.consuming.store(false, Ordering::Relaxed);
            match leave {
                Leave::Shutdown => {
                    inbound.stop_consuming().await;
                    // No more messages can come for open sessions: they go back whole.
                    consumer.sessions.abandon_all();
                    return Some(inbound);
                }
                Leave::Lost => {
                    inbound.mark_lost();
                    consumer.live.common.background.spawn(inbound.close());
                }
                Leave::Reconfigured | Leave::Moved | Leave::Cancelled => {
                    if matches!(leave, Leave::Moved) {
                        telemetry.consumer_moving(&inbound_queue(&consumer.live.current()));
                    }
                    // Its messages settle on the channel they came on: no duplicates.
                    inbound.stop_consuming().await;
                    consumer.sessions.abandon_all();
                    // Every permit back: every transaction of this channel has settled on it.
                    tokio::select! {
                        () = shutdown.cancelled() => return Some(inbound),
                        _ = permits.acquire_many(prefetch) => {}
                    }
                    inbound.close().await;
                    (permits, prefetch) = permits_for(&consumer.live.current());
                    // A cancelled consumer's queue may be gone: declared again.
                    redeclare = matches!(leave, Leave::Cancelled);
                }
            }
        }
        None
    }
}

/// The inbound queue's name under `generation` (`""` without one).
fn inbound_queue(generation: &Generation) -> String {
    let inbound = generation.settings.inbound();
    inbound.map(|i| i.queue.clone()).unwrap_or_default()
}

/// A semaphore of `prefetch` permits for the consumer of `generation`, and
/// that number (1 without an inbound queue: nothing is consumed).
fn permits_for(generation: &Generation) -> (Arc<Semaphore>, u32) {
    let prefetch = generation
        .settings
        .inbound()
        .as_ref()
        .map_or(1, |i| i.prefetch);
    (
        Arc::new(Semaphore::new(usize::from(prefetch))),
        u32::from(prefetch),
    )
}

/// One open inbound channel: its deliveries, the permits that bound them,
/// and its connector's moves to a more preferred node.
struct Channel<'a> {
    inbound: &'a mut InboundChannel,
    permits: &'a Arc<Semaphore>,
    moves: &'a mut tokio::sync::watch::Receiver<u64>,
}

/// Consumes from one open channel until shutdown, its loss, a reload that
/// needs a new consumer, or a move of its connection to a more preferred
/// node (the consumer follows it once this channel's work has settled).
async fn consume_channel(
    consumer: &Consumer,
    reloads: &mut Option<mpsc::Receiver<Reload>>,
    shutdown: &CancellationToken,
    channel: Channel<'_>,
) -> Leave {
    let Channel {
        inbound,
        permits,
        moves,
    } = channel;
    // One registration with the token for the whole channel, not two per message.
    let stopping = shutdown.cancelled();
    tokio::pin!(stopping);
    loop {
        let ready = async {
            let permit = permits.clone().acquire_owned().await;
            consumer.live.wait_until_publishing().await;
            permit
        };
        let reload = next_reload(reloads);
        let permit = tokio::select! {
            biased;
            () = &mut stopping => return Leave::Shutdown,
            // A gone connector (`Err`) leaves too: its connection goes with it.
            _ = moves.changed() => return Leave::Moved,
            reload = reload => {
                if consumer.live.reload(reload, shutdown).await {
                    return Leave::Reconfigured;
                }
                continue;
            }
            permit = ready => match permit {
                Ok(permit) => permit,
                Err(_) => return Leave::Shutdown,
            },
        };
        let telemetry = &consumer.telemetry;
        let queue = || inbound_queue(&consumer.live.current());
        tokio::select! {
            biased;
            () = &mut stopping => return Leave::Shutdown,
            _ = moves.changed() => return Leave::Moved,
            reload = next_reload(reloads) => {
                drop(permit);
                if consumer.live.reload(reload, shutdown).await {
                    return Leave::Reconfigured;
                }
            }
            next = inbound.next() => match next {
                Some(Ok((envelope, receipt))) => {
                    dispatch(consumer, envelope, receipt, permit)
                }
                Some(Err(why)) => {
                    telemetry.consumer_lost(&queue(), &why.to_string());
                    return Leave::Lost;
                }
                None if inbound.is_open() => {
                    telemetry.consumer_cancelled(&queue());
                    return Leave::Cancelled;
                }
                None => {
                    telemetry.consumer_lost(&queue(), "consumer ended");
                    return Leave::Lost;
                }
            },
        }
    }
}

/// The next reload, or never when there is no source (or it has ended).
async fn next_reload(reloads: &mut Option<mpsc::Receiver<Reload>>) -> Reload {
    if let Some(source) = reloads {
        if let Some(reload) = source.recv().await {
            return reload;
        }
        *reloads = None;
    }
    std::future::pending().await
}

/// Admits one message under the live generation and starts its
/// transaction, which holds `permit` and that generation until it ends; a
/// message of a session goes to its session.
fn dispatch(
    consumer: &Consumer,
    envelope: Envelope,
    receipt: Receipt,
    permit: OwnedSemaphorePermit,
) {
    let telemetry = &consumer.telemetry;
    telemetry.consumed();
    if !envelope.annotations.ignored.is_empty() {
        let user_id = envelope.properties.user_id().as_ref().map(|u| u.as_str());
        telemetry.untrusted_headers(envelope.message_id(), user_id, envelope.annotations.ignored);
    }
    let envelope = Arc::new(envelope);
    let generation = consumer.live.current();
    let started = match admit(&generation, &envelope, &consumer.sessions) {
        Admission::Session {
            id,
            generation,
            barred,
        } => {
            let arrival = sessions::Arrival {
                envelope,
                receipt,
                permit,
                refused: barred,
            };
            consumer.sessions.admit(id, arrival, &generation);
            return;
        }
        Admission::Route(plans) => Ok(generation.engine.start(&envelope, plans)),
        Admission::Barred(barred) => Err(Verdict::barred(barred)),
    };
    let in_flight = telemetry.transaction_started();
    let transaction = async move {
        let verdict = match started {
            Ok(started) => {
                let outcome = started.finish(&generation.engine, receipt.lost()).await;
                outcome.verdict()
            }
            Err(verdict) => verdict,
        };
        generation.settler.settle(&envelope, receipt, verdict).await;
        drop(in_flight);
    };
    spawn_held(&consumer.tracker, &consumer.abandon, permit, transaction);
}
