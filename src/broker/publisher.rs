//! One long-lived confirm channel per endpoint, driven by a single task.
//!
//! Publishes are started in the order [`Publisher::publish`] is called and
//! many stay in flight at once. Every copy carries `x-switchyard-publish-id`
//! so a `basic.return` is attributed to the publish it names, whichever
//! confirm lapin happened to attach it to: a confirm is a delivery only when
//! it is an ack and no return names its publish (see `Actor::harvest` for
//! why that needs a fence on lapin's acknowledgement lock).
//!
//! One bad message must not harm the others. A content header too large
//! for the connection's `frame_max` is refused before it is sent. When the
//! broker closes a channel in a way one message may have caused (406, frame
//! errors), every publish in flight on it fails as a *suspect*; the caller
//! retries each [`Mode::Alone`]: on a second channel, one at a time, so a
//! failure there is that message's own and is reported as
//! [`PublishFailure::Rejected`].
//!
//! The task also keeps the endpoint's [`EndpointHealth`]: down on a
//! connection or channel failure, probed every `probe_interval_ms` while
//! down, up again on a working probe or a confirmed publish. Confirm
//! timeouts do not run while the broker blocks the connection; the task
//! keeps every publish's deadline itself (see [`Deadlines`]).

use super::closing::close_channel;
use super::connector::{Blocking, ConnectError, Connector};
use super::error::{BrokerError, Fault};
use super::frame_size::content_header_frame;
use super::health::{Down, EndpointHealth, ProbeFailure};
use crate::amqp::{AmqpValue, FieldTable, ShortString};
use crate::destination::Endpoint;
use crate::envelope::{Envelope, value_text};
use crate::telemetry::Telemetry;
use crate::wire::{self, OWN_PREFIX};
use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::message::BasicReturnMessage;
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

static NEXT_PUBLISH_ID: AtomicU64 = AtomicU64::new(1);

/// Why one publish attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishFailure {
    /// The broker answered `basic.nack`.
    #[error("nacked by the broker")]
    Nacked,
    /// The broker returned the mandatory publish as unroutable.
    #[error("returned by the broker: {code} {text}")]
    Returned {
        /// AMQP reply code (312 NO_ROUTE).
        code: u16,
        /// AMQP reply text.
        text: String,
    },
    /// No confirm within the endpoint's `confirm_timeout_ms`.
    #[error("no confirm within {0} ms")]
    Timeout(u128),
    /// The channel or connection failed while the publish was in flight.
    #[error("{0}")]
    Broker(BrokerError),
    /// No channel could be opened to the endpoint's broker.
    #[error("{0}")]
    Unreachable(#[from] ConnectError),
    /// The broker refuses this message itself (too large, foreign user_id):
    /// no endpoint will take it as it is.
    #[error("refused by the broker: {0}")]
    Rejected(#[source] Refusal),
    /// The publisher is shutting down.
    #[error("publisher stopped")]
    Stopped,
}

impl PublishFailure {
    /// The channel closed in a way one message may have caused: retry this
    /// one [`Mode::Alone`] to find out whether it is the culprit.
    pub fn is_suspect(&self) -> bool {
        matches!(self, Self::Broker(e) if e.fault() == Fault::Message)
    }
}

/// Why a broker refuses one message for what it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It closed the channel when the message was published alone.
    #[error("{0}")]
    Broker(BrokerError),
    /// Its content header does not fit in one frame (checked before
    /// publishing, as the broker would close the connection).
    #[error("content header of {header} bytes exceeds the broker's frame_max of {frame_max}")]
    FrameTooLarge {
        /// The content header's size in bytes.
        header: usize,
        /// The connection's negotiated frame_max.
        frame_max: usize,
    },
}

/// How a copy is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// With the endpoint's other publishes, many in flight.
    Normal,
    /// On a channel of its own, one at a time: a failure is its own.
    Alone,
}

/// Handle to an endpoint's publishing task. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    endpoint: Arc<Endpoint>,
    commands: mpsc::UnboundedSender<Command>,
    health: Arc<EndpointHealth>,
}

enum Command {
    Publish(Request),
    /// A background probe of a down endpoint finished.
    Probed(Result<(), ProbeFailure>),
}

struct Request {
    id: u64,
    envelope: Arc<Envelope>,
    extra_headers: Vec<(ShortString, AmqpValue)>,
    mode: Mode,
    reply: oneshot::Sender<Result<(), PublishFailure>>,
    /// When [`Publisher::publish`] was called: a [`Mode::Normal`] publish's
    /// confirm timeout runs from then.
    called_at: Instant,
}

impl Publisher {
    /// Spawns the endpoint's task. It stops when every handle is dropped and
    /// its confirms are in, or at once when `stop` is cancelled.
    pub fn spawn(
        endpoint: Arc<Endpoint>,
        connector: Arc<Connector>,
        health: Arc<EndpointHealth>,
        stop: CancellationToken,
        background: &TaskTracker,
        telemetry: Telemetry,
    ) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let actor = Actor {
            deadlines: Deadlines::new(endpoint.confirm_timeout, connector.blocking()),
            exchange: endpoint.exchange.as_str().into(),
            routing_key: endpoint.routing_key.as_str().into(),
            endpoint: endpoint.clone(),
            connector,
            health: health.clone(),
            channel: None,
            generation: 0,
            alone_channel: None,
            alone_queue: VecDeque::new(),
            alone_busy: None,
            waiting: HashMap::default(),
            returned: HashMap::default(),
            batch: Vec::new(),
            late: Vec::new(),
            rx,
            commands: commands.downgrade(),
            next_probe: None,
            probe_running: false,
            stop,
            background: background.clone(),
            telemetry,
        };
        background.spawn(actor.run());
        Self {
            endpoint,
            commands,
            health,
        }
    }

    /// The endpoint this publisher sends to.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// The endpoint's health.
    pub fn health(&self) -> &EndpointHealth {
        &self.health
    }

    /// Starts publishing one copy of `envelope` now, in call order, and
    /// returns its outcome: `Ok` once confirmed and not returned. The
    /// confirm timeout runs from this call ([`Mode::Alone`]: from when it
    /// leaves) and stands still while the broker blocks the connection.
    pub fn publish(
        &self,
        envelope: Arc<Envelope>,
        extra_headers: Vec<(ShortString, AmqpValue)>,
        mode: Mode,
    ) -> impl Future<Output = Result<(), PublishFailure>> + Send + 'static {
        let (reply, outcome) = oneshot::channel();
        let request = Request {
            id: NEXT_PUBLISH_ID.fetch_add(1, Ordering::Relaxed),
            envelope,
            extra_headers,
            mode,
            reply,
            called_at: Instant::now(),
        };
        let queued = self.commands.send(Command::Publish(request)).is_ok();
        async move {
            if !queued {
                return Err(PublishFailure::Stopped);
            }
            outcome.await.unwrap_or(Err(PublishFailure::Stopped))
        }
    }
}

/// A channel as the actor holds it. Every publish keeps a handle to the
/// channel it went out on (for the fence in [`Actor::harvest`]). Cloning a
/// lapin `Channel` bumps some fifteen reference counts that its I/O thread
/// also touches. One `Arc` per publish instead, with a leaner consume loop,
/// took about 3% off the forwarder's instructions per message
/// (BENCHMARKS.md, "Instructions per message").
type SharedChannel = Arc<Channel>;

/// One publish's confirm: its id, the channel it went out on, the result.
type Confirmed = (u64, SharedChannel, Confirm);

/// A confirm as the actor keeps it. lapin's `Confirmation` is some 470
/// bytes, nearly all of it room for a returned message that is rarely
/// there, and each confirm is moved several times between the wire and its
/// decision: the returned message is boxed instead, when there is one.
enum Confirm {
    Ack(Option<Box<BasicReturnMessage>>),
    Nack(Option<Box<BasicReturnMessage>>),
    NotRequested,
    Failed(BrokerError),
}

impl From<lapin::Result<Confirmation>> for Confirm {
    fn from(result: lapin::Result<Confirmation>) -> Self {
        match result {
            Ok(Confirmation::Ack(returned)) => Self::Ack(returned.map(Box::new)),
            Ok(Confirmation::Nack(returned)) => Self::Nack(returned.map(Box::new)),
            Ok(Confirmation::NotRequested) => Self::NotRequested,
            Err(e) => Self::Failed(BrokerError::from_lapin(&e)),
        }
    }
}
type InFlight = Pin<Box<dyn Future<Output = Confirmed> + Send>>;

struct Waiter {
    reply: oneshot::Sender<Result<(), PublishFailure>>,
    /// The main channel's generation it went out on; 0 when alone.
    generation: u64,
    mode: Mode,
    /// When it was put on the wire, for the confirm latency.
    sent_at: Instant,
}

struct Actor {
    deadlines: Deadlines,
    endpoint: Arc<Endpoint>,
    exchange: ShortString,
    routing_key: ShortString,
    connector: Arc<Connector>,
    health: Arc<EndpointHealth>,
    channel: Option<SharedChannel>,
    /// Bumped each time a new main channel is opened.
    generation: u64,
    /// Where suspects are published, one at a time.
    alone_channel: Option<SharedChannel>,
    alone_queue: VecDeque<Request>,
    /// The publish id of the suspect in flight.
    alone_busy: Option<u64>,
    /// Publishes awaiting their outcome, by publish id.
    waiting: HashMap<u64, Waiter>,
    /// Returns seen for publishes whose own confirm is not in yet.
    returned: HashMap<u64, PublishFailure>,
    /// Scratch buffers of [`Actor::harvest`].
    batch: Vec<Confirmed>,
    late: Vec<Confirmed>,
    rx: mpsc::UnboundedReceiver<Command>,
    /// For probe results; weak, so the task still ends with its last handle.
    commands: mpsc::WeakUnboundedSender<Command>,
    /// When to probe next; `None` while up or while a probe runs.
    next_probe: Option<Instant>,
    probe_running: bool,
    stop: CancellationToken,
    /// Where its probes and channel closes run.
    background: TaskTracker,
    telemetry: Telemetry,
}

impl Actor {
    async fn run(mut self) {
        let mut in_flight: FuturesUnordered<InFlight> = FuturesUnordered::new();
        let mut open = true;
        while open || !in_flight.is_empty() || !self.alone_queue.is_empty() {
            let probe_at = self.next_probe;
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break,
                Some(first) = in_flight.next(), if !in_flight.is_empty() => {
                    self.harvest(first, &mut in_flight);
                }
                // Before new publishes: up to `prefetch` of them may be queued.
                () = &mut self.deadlines.timer, if self.deadlines.armed => self.expire_due(),
                command = self.rx.recv(), if open => match command {
                    Some(Command::Publish(request)) => match request.mode {
                        Mode::Normal => self.start(request, &mut in_flight).await,
                        Mode::Alone => self.alone_queue.push_back(request),
                    },
                    Some(Command::Probed(result)) => self.probed(result),
                    None => open = false,
                },
                () = sleep_until_some(probe_at), if probe_at.is_some() => self.probe(),
            }
            self.next_alone(&mut in_flight).await;
            if self.next_probe.is_none() && !self.probe_running && !self.health.is_up() {
                self.next_probe = Some(Instant::now() + self.endpoint.probe_interval);
            }
        }
        for channel in [self.channel.take(), self.alone_channel.take()]
            .into_iter()
            .flatten()
        {
            close_channel(&channel, "switchyard: shutdown").await;
        }
    }

    async fn start(&mut self, request: Request, in_flight: &mut FuturesUnordered<InFlight>) {
        let channel = match self.live_channel().await {
            Ok(channel) => channel,
            Err(why) => {
                self.unreachable(&why);
                let _ = request.reply.send(Err(why.into()));
                return;
            }
        };
        self.send(channel, self.generation, request, in_flight);
    }

    /// Publishes the next suspect if none is in flight.
    async fn next_alone(&mut self, in_flight: &mut FuturesUnordered<InFlight>) {
        while self.alone_busy.is_none() {
            let Some(request) = self.alone_queue.pop_front() else {
                return;
            };
            let channel = match self.alone_channel.as_ref() {
                Some(c) if c.status().connected() => c.clone(),
                _ => match self
                    .connector
                    .channel(true, self.endpoint.confirm_timeout)
                    .await
                {
                    Ok(c) => {
                        let c = Arc::new(c);
                        self.alone_channel = Some(c.clone());
                        c
                    }
                    Err(why) => {
                        self.unreachable(&why);
                        let _ = request.reply.send(Err(why.into()));
                        continue;
                    }
                },
            };
            self.alone_busy = Some(request.id);
            self.send(channel, 0, request, in_flight);
        }
    }

    /// Puts one publish on the wire (or refuses it) and tracks its confirm.
    fn send(
        &mut self,
        channel: SharedChannel,
        generation: u64,
        request: Request,
        in_flight: &mut FuturesUnordered<InFlight>,
    ) {
        let id = request.id;
        let properties = self.properties(&request);
        let frame_max = self.connector.frame_max() as usize;
        let header = content_header_frame(&properties);
        if frame_max > 0 && header > frame_max {
            if request.mode == Mode::Alone {
                self.alone_busy = None;
            }
            let refusal = Refusal::FrameTooLarge { header, frame_max };
            let _ = request.reply.send(Err(PublishFailure::Rejected(refusal)));
            return;
        }
        let deadline = match request.mode {
            Mode::Normal => request.called_at,
            Mode::Alone => Instant::now(),
        } + self.endpoint.confirm_timeout;
        self.deadlines.push(request.mode, deadline, id);
        let (exchange, routing_key) = (self.exchange.clone(), self.routing_key.clone());
        let envelope = request.envelope;
        let mut publish: InFlight = Box::pin(async move {
            let options = BasicPublishOptions {
                mandatory: true,
                immediate: false,
            };
            let result = match channel
                .basic_publish(exchange, routing_key, options, &envelope.body, properties)
                .await
            {
                Ok(confirm) => confirm.await,
                Err(e) => Err(e),
            };
            (id, channel, Confirm::from(result))
        });
        self.waiting.insert(
            id,
            Waiter {
                reply: request.reply,
                generation,
                mode: request.mode,
                sent_at: Instant::now(),
            },
        );
        // The first poll assigns the delivery tag and queues the frames, so
        // publishes leave in call order without awaiting each one.
        let waker = futures_util::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match publish.as_mut().poll(&mut cx) {
            Poll::Ready(done) => self.harvest(done, in_flight),
            Poll::Pending => in_flight.push(publish),
        }
    }

    async fn live_channel(&mut self) -> Result<SharedChannel, ConnectError> {
        if let Some(channel) = &self.channel {
            if channel.status().connected() {
                return Ok(channel.clone());
            }
            self.channel = None;
        }
        let channel = Arc::new(
            self.connector
                .channel(true, self.endpoint.confirm_timeout)
                .await?,
        );
        self.generation += 1;
        self.channel = Some(channel.clone());
        Ok(channel)
    }

    /// The copy's properties: the message's own, without any `x-switchyard-*`
    /// header a producer sent in, plus the endpoint's headers, the caller's
    /// extra headers, the hop count and the publish id.
    fn properties(&self, request: &Request) -> BasicProperties {
        let mut headers = FieldTable::default();
        if let Some(incoming) = request.envelope.headers() {
            for (name, value) in incoming.inner() {
                if !name.as_str().starts_with(OWN_PREFIX) {
                    headers.insert(name.clone(), value.clone());
                }
            }
        }
        for (name, value) in &self.endpoint.headers {
            headers.insert(
                name.as_str().into(),
                AmqpValue::LongString(value.as_str().into()),
            );
        }
        headers.insert(
            wire::HOPS.into(),
            AmqpValue::LongLongInt(i64::from(request.envelope.hops()) + 1),
        );
        for (name, value) in &request.extra_headers {
            headers.insert(name.clone(), value.clone());
        }
        headers.insert(
            wire::PUBLISH_ID.into(),
            AmqpValue::LongLongInt(request.id as i64),
        );
        request.envelope.properties.clone().with_headers(headers)
    }

    fn unreachable(&self, why: &ConnectError) {
        let down = match why {
            ConnectError::Channel(_) | ConnectError::ChannelTimeout(_) => Down::Channel,
            _ => Down::Connection,
        };
        self.health.mark_down(down, why);
    }

    /// Fails every publish whose confirm is overdue, then sets the next
    /// alarm.
    fn expire_due(&mut self) {
        while let Some(id) = self.deadlines.pop_due(&self.waiting) {
            self.timed_out(id);
        }
        self.deadlines.rearm(&self.waiting);
    }

    /// A publish timed out: its caller is told so and, if it went out on
    /// the current channel, that channel is suspect (a stalled connection
    /// never answers), so the next publish opens a fresh one.
    fn timed_out(&mut self, id: u64) {
        let Some(waiter) = self.waiting.remove(&id) else {
            return;
        };
        let limit = self.endpoint.confirm_timeout.as_millis();
        if waiter.mode == Mode::Alone {
            self.alone_busy = None;
        }
        // Nobody waits for it any more (its transaction was abandoned): no
        // verdict on the channel from it.
        if waiter
            .reply
            .send(Err(PublishFailure::Timeout(limit)))
            .is_err()
        {
            return;
        }
        let stale = match waiter.mode {
            Mode::Alone => self.alone_channel.take(),
            Mode::Normal if waiter.generation == self.generation => self.channel.take(),
            Mode::Normal => None,
        };
        if let Some(channel) = stale {
            self.health
                .mark_down(Down::Channel, &format_args!("no confirm within {limit} ms"));
            self.telemetry
                .channel_reset(&self.endpoint.name, "confirm timeout");
            self.background.spawn(async move {
                close_channel(&channel, "switchyard: confirm timeout").await;
            });
        }
    }

    /// Checks a down endpoint in the background: a channel opens on its
    /// broker, and what it publishes to exists.
    fn probe(&mut self) {
        self.next_probe = None;
        self.probe_running = true;
        let Some(commands) = self.commands.upgrade() else {
            return;
        };
        let connector = self.connector.clone();
        let endpoint = self.endpoint.clone();
        let stop = self.stop.clone();
        self.background.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                result = super::health::probe(&connector, &endpoint) => {
                    let _ = commands.send(Command::Probed(result));
                }
            }
        });
    }

    fn probed(&mut self, result: Result<(), ProbeFailure>) {
        self.probe_running = false;
        match result {
            Ok(()) => self.health.mark_up(),
            Err(why) => {
                tracing::debug!(endpoint = %self.endpoint.name, error = %why, "probe failed");
                self.next_probe = Some(Instant::now() + self.endpoint.probe_interval);
            }
        }
    }

    /// Decides the outcome of `first` and of every other confirm that
    /// resolved with it.
    ///
    /// lapin attaches a return to whichever confirm it resolves next, and
    /// resolves all confirms of one multiple-ack frame in one walk under its
    /// acknowledgement lock. A return can therefore ride on a sibling of its
    /// own publish. So: collect what is ready, pass the lock once (the
    /// fence: any walk in progress has then finished and woken every
    /// sibling), collect again, attribute every return seen, and only then
    /// decide the confirms collected before the fence. Those collected after
    /// it wait for the next fence.
    fn harvest(&mut self, first: Confirmed, in_flight: &mut FuturesUnordered<InFlight>) {
        // Two buffers kept across calls: a batch is often hundreds of
        // confirms, and growing fresh vectors showed in the profile.
        let mut batch = std::mem::take(&mut self.batch);
        let mut late = std::mem::take(&mut self.late);
        batch.push(first);
        drain_ready(in_flight, &mut batch);
        loop {
            fence(&batch);
            drain_ready(in_flight, &mut late);
            for (id, _, result) in batch.iter_mut().chain(late.iter_mut()) {
                if let Confirm::Ack(returned) | Confirm::Nack(returned) = result {
                    self.attribute(returned.take(), *id);
                }
            }
            self.decide(&mut batch);
            if late.is_empty() {
                break;
            }
            std::mem::swap(&mut batch, &mut late);
        }
        self.batch = batch;
        self.late = late;
        self.deadlines.forget_settled(&self.waiting);
    }

    /// Sends each publisher its outcome; returns were attributed already.
    /// Leaves `batch` empty.
    fn decide(&mut self, batch: &mut Vec<Confirmed>) {
        for (id, _, result) in batch.drain(..) {
            let mut outcome = match (self.returned.remove(&id), result) {
                (Some(returned), _) => Err(returned),
                (None, Confirm::Ack(_)) => Ok(()),
                (None, Confirm::Nack(_)) => Err(PublishFailure::Nacked),
                (None, Confirm::NotRequested) => Err(PublishFailure::Broker(BrokerError {
                    code: None,
                    level: super::Level::Transport,
                    text: "channel is not in confirm mode".to_owned(),
                })),
                (None, Confirm::Failed(e)) => Err(PublishFailure::Broker(e)),
            };
            let Some(waiter) = self.waiting.remove(&id) else {
                continue;
            };
            if waiter.mode == Mode::Alone {
                self.alone_busy = None;
                // Alone on its channel, a refusal with a reply code is this message's own.
                if let Err(PublishFailure::Broker(e)) = &outcome
                    && e.fault() == Fault::Message
                    && e.code.is_some()
                {
                    outcome = Err(PublishFailure::Rejected(Refusal::Broker(e.clone())));
                }
            }
            match &outcome {
                Ok(()) => {
                    self.telemetry.confirmed(waiter.sent_at.elapsed());
                    self.health.mark_up();
                }
                Err(PublishFailure::Broker(e)) => match e.fault() {
                    Fault::Message => {}
                    Fault::Endpoint => self.health.mark_down(Down::Channel, e),
                    Fault::Connection | Fault::Refused => {
                        self.health.mark_down(Down::Connection, e)
                    }
                },
                Err(_) => {}
            }
            let _ = waiter.reply.send(outcome);
        }
    }

    fn attribute(&mut self, returned: Option<Box<BasicReturnMessage>>, carrier: u64) {
        let Some(message) = returned else { return };
        let owner = publish_id(&message.delivery.properties).unwrap_or(carrier);
        if !self.waiting.contains_key(&owner) {
            self.telemetry.late_return(&self.endpoint.name, owner);
            return;
        }
        self.returned.insert(
            owner,
            PublishFailure::Returned {
                code: message.reply_code,
                text: message.reply_text.to_string(),
            },
        );
    }
}

/// Every publish's confirm deadline, kept by the actor with one timer for
/// the endpoint. A timer per publish in the caller (with its own watch of
/// the blocked state and a command back on timeout) cost about 3% of the
/// seed scenario's instructions per message (BENCHMARKS.md, "Profile").
///
/// A publish is overdue once its deadline has passed and the connection
/// is not blocked, and has not been blocked within the last
/// `confirm_timeout`: the clock stands still during a resource alarm and
/// restarts in full when it lifts. While blocked, the timer looks again
/// every `confirm_timeout`, so it never looks later than the moment the
/// first publish could be due after the block lifts.
///
/// Normal publishes count from their call and are kept in the order they
/// went out, which is their call order (to within the moment between
/// taking the time and queueing the command). Suspects go out one at a
/// time and count from when they leave. The task sweeps between its other
/// steps: while it opens a channel (itself bounded by `confirm_timeout`),
/// an overdue publish is failed only once that is done.
struct Deadlines {
    limit: Duration,
    normal: VecDeque<(Instant, u64)>,
    alone: Option<(Instant, u64)>,
    blocking: watch::Receiver<Blocking>,
    timer: Pin<Box<Sleep>>,
    /// Whether `timer` is set: some publish is pending.
    armed: bool,
}

impl Deadlines {
    fn new(limit: Duration, blocking: watch::Receiver<Blocking>) -> Self {
        Self {
            limit,
            normal: VecDeque::new(),
            alone: None,
            blocking,
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            armed: false,
        }
    }

    fn push(&mut self, mode: Mode, deadline: Instant, id: u64) {
        match mode {
            Mode::Normal => self.normal.push_back((deadline, id)),
            Mode::Alone => self.alone = Some((deadline, id)),
        }
        if !self.armed {
            self.arm(deadline);
        }
    }

    /// When the earliest pending publish is due, given the blocked state.
    fn due(&self, deadline: Instant) -> Option<Instant> {
        let state = *self.blocking.borrow();
        (!state.blocked).then(|| deadline.max(state.since + self.limit))
    }

    fn arm(&mut self, deadline: Instant) {
        let at = self
            .due(deadline)
            .unwrap_or_else(|| Instant::now() + self.limit);
        self.timer.as_mut().reset(at);
        self.armed = true;
    }

    /// Drops deadlines of publishes already decided, from the front.
    fn forget_settled(&mut self, waiting: &HashMap<u64, Waiter>) {
        while let Some((_, id)) = self.normal.front() {
            if waiting.contains_key(id) {
                break;
            }
            self.normal.pop_front();
        }
        if self.alone.is_some_and(|(_, id)| !waiting.contains_key(&id)) {
            self.alone = None;
        }
    }

    /// The next overdue publish still waiting, taken off the list.
    fn pop_due(&mut self, waiting: &HashMap<u64, Waiter>) -> Option<u64> {
        self.forget_settled(waiting);
        let now = Instant::now();
        let overdue = |entry: Option<(Instant, u64)>| {
            entry.filter(|(deadline, _)| self.due(*deadline).is_some_and(|at| at <= now))
        };
        if let Some((_, id)) = overdue(self.alone) {
            self.alone = None;
            return Some(id);
        }
        let (_, id) = overdue(self.normal.front().copied())?;
        self.normal.pop_front();
        Some(id)
    }

    /// Sets the timer for the earliest deadline still pending, if any.
    fn rearm(&mut self, waiting: &HashMap<u64, Waiter>) {
        self.forget_settled(waiting);
        let earliest = [self.alone, self.normal.front().copied()]
            .into_iter()
            .flatten()
            .map(|(deadline, _)| deadline)
            .min();
        match earliest {
            Some(deadline) => self.arm(deadline),
            None => self.armed = false,
        }
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Moves every confirm that is ready now into `into`.
fn drain_ready(in_flight: &mut FuturesUnordered<InFlight>, into: &mut Vec<Confirmed>) {
    while let Some(Some(done)) = in_flight.next().now_or_never() {
        into.push(done);
    }
}

/// Takes and releases the acknowledgement lock of every channel in `batch`
/// (`wait_for_confirms` takes it first thing; it is not awaited), so a
/// multiple-ack walk that was in progress has completed.
fn fence(batch: &[Confirmed]) {
    let mut fenced: Vec<u16> = Vec::new();
    for (_, channel, _) in batch {
        if !fenced.contains(&channel.id()) {
            fenced.push(channel.id());
            let _ = channel.wait_for_confirms().now_or_never();
        }
    }
}

fn publish_id(properties: &BasicProperties) -> Option<u64> {
    let value = properties
        .headers()
        .as_ref()?
        .inner()
        .get(wire::PUBLISH_ID)?;
    value_text(value)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::{Blocking, Deadlines, HashMap, Mode, Waiter};
    use std::time::Duration;
    use tokio::sync::{oneshot, watch};
    use tokio::time::{Instant, advance};

    const LIMIT: Duration = Duration::from_secs(5);

    fn waiting(ids: &[u64]) -> HashMap<u64, Waiter> {
        ids.iter()
            .map(|&id| {
                let (reply, _) = oneshot::channel();
                let waiter = Waiter {
                    reply,
                    generation: 1,
                    mode: Mode::Normal,
                    sent_at: Instant::now(),
                };
                (id, waiter)
            })
            .collect()
    }

    fn unblocked_long_ago() -> watch::Sender<Blocking> {
        watch::Sender::new(Blocking {
            blocked: false,
            since: Instant::now(),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_is_due_at_its_deadline_and_a_settled_one_never() {
        let blocking = unblocked_long_ago();
        advance(LIMIT).await;
        let mut deadlines = Deadlines::new(LIMIT, blocking.subscribe());
        let now = Instant::now();
        deadlines.push(Mode::Normal, now + LIMIT, 1);
        deadlines.push(Mode::Normal, now + LIMIT, 2);
        deadlines.push(Mode::Alone, now + 2 * LIMIT, 3);
        assert!(deadlines.armed);
        let mut waiting = waiting(&[2, 3]);
        advance(LIMIT - Duration::from_millis(1)).await;
        assert_eq!(deadlines.pop_due(&waiting), None, "not yet");
        advance(Duration::from_millis(1)).await;
        assert_eq!(deadlines.pop_due(&waiting), Some(2), "1 was settled");
        waiting.remove(&2);
        assert_eq!(deadlines.pop_due(&waiting), None);
        deadlines.rearm(&waiting);
        assert_eq!(deadlines.timer.deadline(), now + 2 * LIMIT);
        advance(LIMIT).await;
        assert_eq!(deadlines.pop_due(&waiting), Some(3));
        waiting.remove(&3);
        deadlines.rearm(&waiting);
        assert!(!deadlines.armed, "nothing pending");
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_stands_still_while_blocked_and_restarts_when_it_lifts() {
        let blocking = unblocked_long_ago();
        advance(LIMIT).await;
        let mut deadlines = Deadlines::new(LIMIT, blocking.subscribe());
        let waiting = waiting(&[1]);
        deadlines.push(Mode::Normal, Instant::now() + LIMIT, 1);
        blocking.send_replace(Blocking {
            blocked: true,
            since: Instant::now(),
        });
        advance(3 * LIMIT).await;
        assert_eq!(deadlines.pop_due(&waiting), None, "blocked");
        deadlines.rearm(&waiting);
        assert!(deadlines.armed, "looks again while blocked");
        assert_eq!(deadlines.timer.deadline(), Instant::now() + LIMIT);
        let lifted = Instant::now();
        blocking.send_replace(Blocking {
            blocked: false,
            since: lifted,
        });
        advance(LIMIT - Duration::from_millis(1)).await;
        assert_eq!(
            deadlines.pop_due(&waiting),
            None,
            "a full limit after the block"
        );
        deadlines.rearm(&waiting);
        assert_eq!(deadlines.timer.deadline(), lifted + LIMIT);
        advance(Duration::from_millis(1)).await;
        assert_eq!(deadlines.pop_due(&waiting), Some(1));
    }
}
