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
//! After a loss to a message the client cannot read, the consumer takes
//! one message at a time until the messages returned with it have passed,
//! then opens again at the configured prefetch (see `broker::SingleFile`).
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
use super::record;
use super::sessions::{self, Sessions};
use crate::amqp::short_text;
use crate::backoff::Backoff;
use crate::broker::{
    ConnectError, ConsumeError, InboundChannel, Receipt, SingleFile, open_inbound,
    redeclare_inbound,
};
use crate::envelope::Envelope;
use crate::reload::Reload;
use crate::routing::BranchPlan;
use crate::telemetry::Telemetry;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often a consumer that is not reading checks that its channel is
/// still open.
const CLOSED_CHECK: Duration = Duration::from_millis(250);

/// What the consume loop acts on.
enum Event {
    Shutdown,
    /// A new configuration: applied, and a new consumer opened when it
    /// changes `[inbound]`.
    Reload(Box<Reload>),
    /// The channel or its connection was lost.
    Lost,
    /// The connector moved to a more preferred node of the broker.
    Moved,
    /// The broker cancelled the consumer (`basic.cancel`: a quorum queue
    /// moving its leader, the queue deleted) on a channel still open.
    Cancelled,
    /// The messages returned with one the client could not read have
    /// passed: consume at the configured prefetch again.
    Widen,
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

/// What the loop keeps between channels.
struct State {
    /// One permit per message in flight, `prefetch` in all: a transaction
    /// keeps its permit until it ends, even when its channel is gone.
    permits: Arc<Semaphore>,
    prefetch: u32,
    backoff: Backoff,
    /// Set when the inbound queue may be gone (the broker cancelled the
    /// consumer, or said the queue is not found). Only then is it declared
    /// again: after a lost connection the declaration would wait on a
    /// connection that may be moving nodes, delaying the consumer for no
    /// gain.
    redeclare: bool,
    /// After a message the client cannot read: one message at a time.
    single_file: SingleFile,
}

/// One open inbound channel, and its connector's moves to a more preferred
/// node.
struct Open {
    inbound: InboundChannel,
    moves: watch::Receiver<u64>,
}

/// What an attempt to open the consumer came to.
enum Opening {
    Opened(Box<Open>),
    /// Not open: try again once this completes (never, without an inbound
    /// queue: only a reload can add one).
    Wait(Pin<Box<dyn Future<Output = ()> + Send>>),
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
        let (permits, prefetch) = permits_for(&self.live.current());
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut state = State {
            permits,
            prefetch,
            backoff,
            redeclare: false,
            single_file: SingleFile::default(),
        };
        let mut open: Option<Open> = None;
        while !shutdown.is_cancelled() {
            let event = match open.as_mut() {
                Some(channel) => {
                    self.consume_channel(channel, &state.permits, &mut reloads, shutdown)
                        .await
                }
                None => match self.open(&mut state, shutdown).await {
                    Opening::Opened(channel) => {
                        open = Some(*channel);
                        continue;
                    }
                    Opening::Wait(retry) => tokio::select! {
                        () = shutdown.cancelled() => Event::Shutdown,
                        () = retry => continue,
                        reload = next_reload(&mut reloads) => Event::Reload(Box::new(reload)),
                    },
                },
            };
            match event {
                Event::Reload(reload) => {
                    if self.live.reload(*reload, shutdown).await {
                        // A changed `[inbound]`: a new consumer, once this one's work has settled.
                        if let Err(inbound) = self.retire(open.take(), &mut state, shutdown).await {
                            return Some(inbound);
                        }
                    }
                }
                Event::Shutdown => {
                    let channel = open.take()?;
                    self.consuming.store(false, Ordering::Relaxed);
                    channel.inbound.stop_consuming().await;
                    // No more messages can come for open sessions: they go back whole.
                    self.sessions.abandon_all();
                    return Some(channel.inbound);
                }
                Event::Lost => {
                    if let Some(channel) = open.take() {
                        self.consuming.store(false, Ordering::Relaxed);
                        channel.inbound.mark_lost();
                        self.live.common.background.spawn(channel.inbound.close());
                    }
                }
                Event::Moved | Event::Cancelled | Event::Widen => {
                    if matches!(event, Event::Moved) {
                        let queue = inbound_queue(&self.live.current());
                        self.telemetry.consumer_moving(&queue);
                    }
                    if let Err(inbound) = self.retire(open.take(), &mut state, shutdown).await {
                        return Some(inbound);
                    }
                    // A cancelled consumer's queue may be gone: declared again.
                    state.redeclare = matches!(event, Event::Cancelled);
                }
            }
        }
        None
    }

    /// Opens the consumer of the live generation, or says what to wait for
    /// before trying again.
    async fn open(&self, state: &mut State, shutdown: &CancellationToken) -> Opening {
        let never = || Opening::Wait(Box::pin(std::future::pending()));
        let generation = self.live.current();
        let settings = &generation.settings;
        let queue_side = settings.queue().zip(generation.topology_connector());
        let (Some(((inbound, dead_letter), topology)), Some(consume_connector)) =
            (queue_side, generation.consume_connector.clone())
        else {
            // No inbound queue (the HTTP ingress alone): nothing to consume.
            return never();
        };
        if std::mem::take(&mut state.redeclare) && inbound.declare {
            // A deleted inbound queue comes back; anything else is logged by
            // the open below.
            let _ = redeclare_inbound(topology, (inbound, dead_letter)).await;
        }
        let opened = tokio::select! {
            () = shutdown.cancelled() => return never(),
            opened = open_inbound(&consume_connector.0, &settings.name, inbound, &state.single_file) => opened,
        };
        let connector = consume_connector.0.clone();
        match opened {
            Ok(channel) => {
                state.backoff.reset();
                self.telemetry.consuming(&inbound.queue, channel.prefetch());
                self.consuming.store(true, Ordering::Relaxed);
                Opening::Opened(Box::new(Open {
                    inbound: channel,
                    moves: connector.epochs(),
                }))
            }
            Err(why) => {
                state.redeclare = why.queue_not_found();
                match why {
                    // Logged by the connector, with its next try: the one to wait for.
                    ConsumeError::Connect(
                        ConnectError::Refused { .. }
                        | ConnectError::Connect { .. }
                        | ConnectError::BackingOff { .. },
                    ) => Opening::Wait(Box::pin(async move {
                        connector.next_attempt().await;
                    })),
                    other => {
                        self.telemetry
                            .consumer_lost(&inbound.queue, &other.to_string());
                        Opening::Wait(Box::pin(tokio::time::sleep(state.backoff.next_delay())))
                    }
                }
            }
        }
    }

    /// Leaves `channel` (if any) for a new consumer: stops consuming,
    /// abandons its open sessions, waits until every transaction has
    /// settled on the channel it came on (no duplicates), closes it, and
    /// takes a fresh `prefetch` of permits under the live settings. The
    /// channel still open when shutdown comes meanwhile.
    async fn retire(
        &self,
        channel: Option<Open>,
        state: &mut State,
        shutdown: &CancellationToken,
    ) -> Result<(), InboundChannel> {
        self.consuming.store(false, Ordering::Relaxed);
        if let Some(channel) = &channel {
            channel.inbound.stop_consuming().await;
        }
        self.sessions.abandon_all();
        tokio::select! {
            () = shutdown.cancelled() => {
                return match channel {
                    Some(channel) => Err(channel.inbound),
                    None => Ok(()),
                };
            }
            _ = state.permits.acquire_many(state.prefetch) => {}
        }
        if let Some(channel) = channel {
            channel.inbound.close().await;
        }
        (state.permits, state.prefetch) = permits_for(&self.live.current());
        Ok(())
    }

    /// Consumes from `channel` until shutdown, its loss, a reload, or a
    /// move of its connection to a more preferred node (the consumer
    /// follows it once this channel's work has settled).
    async fn consume_channel(
        &self,
        channel: &mut Open,
        permits: &Arc<Semaphore>,
        reloads: &mut Option<mpsc::Receiver<Reload>>,
        shutdown: &CancellationToken,
    ) -> Event {
        let Open { inbound, moves } = channel;
        // One registration with the token for the whole channel, not two per message.
        let stopping = shutdown.cancelled();
        tokio::pin!(stopping);
        // While nothing is taken (an outage held, the journal on hold) the
        // channel is not read: its loss is watched for apart.
        let closed = inbound.closed(CLOSED_CHECK);
        tokio::pin!(closed);
        let queue = || inbound_queue(&self.live.current());
        loop {
            let next = async {
                let permit = permits.clone().acquire_owned().await;
                self.live.wait_until_publishing().await;
                (permit, inbound.next().await)
            };
            let (permit, next) = tokio::select! {
                biased;
                () = &mut stopping => return Event::Shutdown,
                // A gone connector (`Err`) leaves too: its connection goes with it.
                _ = moves.changed() => return Event::Moved,
                reload = next_reload(reloads) => return Event::Reload(Box::new(reload)),
                () = &mut closed => {
                    self.telemetry.consumer_lost(&queue(), "channel closed");
                    return Event::Lost;
                }
                next = next => next,
            };
            let Ok(permit) = permit else {
                return Event::Shutdown;
            };
            match next {
                Some(Ok((envelope, receipt))) => {
                    // A message that came while the consumer waited idle,
                    // as the group was paused or the journal stopped taking
                    // work (`hold`): it waits here, unforwarded, until
                    // resumed and recordable.
                    let common = &self.live.common;
                    while self.live.taking_nothing() {
                        tokio::select! {
                            biased;
                            () = &mut stopping => return Event::Shutdown,
                            () = &mut closed => return Event::Lost,
                            () = async {
                                common.group.until_resumed().await;
                                common.recorder.until_taking().await;
                            } => {}
                        }
                    }
                    self.dispatch(envelope, receipt, permit);
                    if inbound.returned_passed() {
                        return Event::Widen;
                    }
                }
                Some(Err(why)) => {
                    // A message the client cannot read was logged as such.
                    if !why.unreadable() {
                        self.telemetry.consumer_lost(&queue(), &why.to_string());
                    }
                    return Event::Lost;
                }
                None if inbound.is_open() => {
                    self.telemetry.consumer_cancelled(&queue());
                    return Event::Cancelled;
                }
                None => {
                    self.telemetry.consumer_lost(&queue(), "consumer ended");
                    return Event::Lost;
                }
            }
        }
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
    let prefetch = generation.settings.inbound().map_or(1, |i| i.prefetch);
    (
        Arc::new(Semaphore::new(usize::from(prefetch))),
        u32::from(prefetch),
    )
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
impl Consumer {
    fn dispatch(&self, envelope: Envelope, receipt: Receipt, permit: OwnedSemaphorePermit) {
        let consumer = self;
        let telemetry = &consumer.telemetry;
        telemetry.consumed();
        if !envelope.annotations.ignored.is_empty() {
            let user_id = envelope.properties.user_id().as_ref().map(short_text);
            telemetry.untrusted_headers(
                &envelope.message_id(),
                user_id.as_deref(),
                envelope.annotations.ignored,
            );
        }
        if envelope.annotations.trace.malformed {
            telemetry.trace_context_malformed(&envelope.message_id());
        }
        let envelope = Arc::new(envelope);
        let received_at = SystemTime::now();
        let generation = consumer.live.current();
        let started = match admit(&generation, &envelope, consumer.sessions.membership()) {
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
                    received_at,
                };
                consumer.sessions.admit(id, arrival, &generation);
                return;
            }
            // A registrable branch no service has registered into: held
            // until one does (below).
            Admission::Route(plans) if plans.iter().any(BranchPlan::is_empty) => Err(None),
            Admission::Route(plans) => Ok(generation.engine.start(&envelope, plans)),
            Admission::Barred(barred) => Err(Some(Verdict::barred(barred))),
        };
        let in_flight = telemetry.transaction_started();
        let live = consumer.live.clone();
        let transaction = async move {
            let (generation, started) = match started {
                Err(None) => match live.routable(&envelope, receipt.lost()).await {
                    Some((generation, Ok(plans))) => {
                        let started = generation.engine.start(&envelope, plans);
                        (generation, Ok(started))
                    }
                    Some((generation, Err(barred))) => (generation, Err(Verdict::barred(barred))),
                    // The channel was lost while waiting: the broker redelivers it.
                    None => return drop(in_flight),
                },
                Err(Some(verdict)) => (generation, Err(verdict)),
                Ok(started) => (generation, Ok(started)),
            };
            let recorder = &generation.recorder;
            // Nothing is gathered for the journal when nothing records.
            let recording = recorder.wanted();
            let (verdict, branches) = match started {
                Ok(started) => {
                    let mut outcome = started.finish(&generation.engine, receipt.lost()).await;
                    let branches = match recording {
                        true => record::branches(&mut outcome),
                        false => Vec::new(),
                    };
                    (outcome.verdict(), branches)
                }
                Err(verdict) => (verdict, Vec::new()),
            };
            let lost = receipt.lost().is_cancelled();
            let said = recording.then(|| record::said_on(&verdict, lost));
            generation.settler.settle(&envelope, receipt, verdict).await;
            if let Some(said) = said {
                let source = record::source_of(&envelope);
                let entry = record::entry(&envelope, source, received_at, said, branches);
                recorder.settled(entry);
            }
            drop(in_flight);
        };
        spawn_held(&consumer.tracker, &consumer.abandon, permit, transaction);
    }
}
