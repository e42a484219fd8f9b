//! The task behind one endpoint's publisher: its confirm channel (and a
//! second one for suspects, published alone), its publishes in flight,
//! their deadlines, and the endpoint's health. Returns are attributed in
//! `attribution`, down endpoints probed in `probing`.

use super::confirms::{Confirm, Confirmed, InFlight, SharedChannel};
use super::deadlines::Deadlines;
use super::request::{Command, Mode, PublishFailure, Refusal, Request};
use crate::amqp::{AmqpValue, FieldTable, ShortString};
use crate::broker::closing::close_channel;
use crate::broker::connector::{ConnectError, Connector};
use crate::broker::frame_size::content_header_frame;
use crate::broker::health::{Down, EndpointHealth};
use crate::destination::Endpoint;
use crate::telemetry::Telemetry;
use crate::wire;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a main channel lives before a nack on it makes new publishes
/// go to a fresh one. RabbitMQ was seen nacking every publish, for as long
/// as the channel lived, on a channel whose first publishes to a quorum
/// queue came before the queue had elected a leader; a queue that is
/// simply full nacks on any channel, and then this bounds the churn to one
/// new channel a second.
const NACKED_CHANNEL_AGE: std::time::Duration = std::time::Duration::from_secs(1);

pub(super) struct Waiter {
    pub(super) reply: oneshot::Sender<Result<(), PublishFailure>>,
    /// The main channel's generation it went out on; 0 when alone.
    pub(super) generation: u64,
    pub(super) mode: Mode,
    /// When it was put on the wire, for the confirm latency.
    pub(super) sent_at: Instant,
}

pub(super) struct Actor {
    pub(super) deadlines: Deadlines,
    pub(super) endpoint: Arc<Endpoint>,
    pub(super) exchange: ShortString,
    pub(super) routing_key: ShortString,
    pub(super) connector: Arc<Connector>,
    /// The connection's user: the `user_id` of copies, so the next
    /// forwarder can tell the copy's annotations are a forwarder's.
    pub(super) user: Option<ShortString>,
    pub(super) health: Arc<EndpointHealth>,
    pub(super) channel: Option<SharedChannel>,
    /// The connector's epoch when the main and the alone channel opened: a
    /// channel of an older one is on a connection being left, and new
    /// publishes go to a new channel (those in flight keep theirs).
    pub(super) channel_epoch: u64,
    pub(super) alone_epoch: u64,
    /// Bumped each time a new main channel is opened.
    pub(super) generation: u64,
    /// When the main channel opened: a nacked channel is left only once it
    /// has lived [`NACKED_CHANNEL_AGE`].
    pub(super) channel_opened: Instant,
    /// The connector epoch whose settling nacks were logged already.
    pub(super) settling_logged: u64,
    /// Where suspects are published, one at a time.
    pub(super) alone_channel: Option<SharedChannel>,
    pub(super) alone_queue: VecDeque<Request>,
    /// The publish id of the suspect in flight.
    pub(super) alone_busy: Option<u64>,
    /// Publishes awaiting their outcome, by publish id.
    pub(super) waiting: HashMap<u64, Waiter>,
    /// Returns seen for publishes whose own confirm is not in yet.
    pub(super) returned: HashMap<u64, PublishFailure>,
    /// Scratch buffers of [`Actor::harvest`].
    pub(super) batch: Vec<Confirmed>,
    pub(super) late: Vec<Confirmed>,
    pub(super) rx: mpsc::UnboundedReceiver<Command>,
    /// For probe results; weak, so the task still ends with its last handle.
    pub(super) commands: mpsc::WeakUnboundedSender<Command>,
    /// When to probe next; `None` while up or while a probe runs.
    pub(super) next_probe: Option<Instant>,
    pub(super) probe_running: bool,
    pub(super) stop: CancellationToken,
    /// Where its probes and channel closes run.
    pub(super) background: TaskTracker,
    pub(super) telemetry: Telemetry,
}

impl Actor {
    pub(super) async fn run(mut self) {
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
            close_channel(&channel, "switchyard: shutdown", &self.telemetry).await;
        }
        self.telemetry.publisher_stopped(&self.endpoint.name);
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
            let current = self.alone_epoch == self.connector.epoch();
            let channel = match self.alone_channel.as_ref() {
                Some(c) if current && c.status().connected() => c.clone(),
                _ => match self.open_channel().await {
                    Ok((c, epoch)) => {
                        self.alone_epoch = epoch;
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
        mut request: Request,
        in_flight: &mut FuturesUnordered<InFlight>,
    ) {
        let id = request.id;
        let extra = std::mem::take(&mut request.extra_headers);
        let properties = self.properties(&request, extra);
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
            if channel.status().connected() && self.channel_epoch == self.connector.epoch() {
                return Ok(channel.clone());
            }
            self.channel = None;
        }
        let (channel, epoch) = self.open_channel().await?;
        self.channel_epoch = epoch;
        self.channel_opened = Instant::now();
        self.generation += 1;
        self.channel = Some(channel.clone());
        Ok(channel)
    }

    /// A new confirm channel, and the connector epoch it was opened under
    /// (read first: a move in between only costs one more channel).
    async fn open_channel(&self) -> Result<(SharedChannel, u64), ConnectError> {
        let epoch = self.connector.epoch();
        let channel = self
            .connector
            .channel(true, self.endpoint.confirm_timeout)
            .await?;
        Ok((Arc::new(channel), epoch))
    }

    /// The copy's properties: the message's own, without any `x-switchyard-*`
    /// header a producer sent in, plus the endpoint's headers, the caller's
    /// extra headers, the hop count and the publish id; the connection's
    /// user as `user_id`, so the next forwarder can trust what this one
    /// wrote, unless the message carries a producer's own `user_id` (not a
    /// trusted user's), which is kept: the broker refuses it unless it is
    /// this user or this user may impersonate.
    fn properties(
        &self,
        request: &Request,
        extra: Vec<(ShortString, AmqpValue)>,
    ) -> BasicProperties {
        let mut headers = FieldTable::default();
        if let Some(incoming) = request.envelope.headers() {
            for (name, value) in wire::foreign(incoming) {
                headers.insert(name.clone(), value.clone());
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
            AmqpValue::LongLongInt(i64::from(request.envelope.annotations.hops) + 1),
        );
        for (name, value) in extra {
            headers.insert(name, value);
        }
        headers.insert(
            wire::PUBLISH_ID.into(),
            AmqpValue::LongLongInt(request.id as i64),
        );
        let properties = request.envelope.properties.clone().with_headers(headers);
        // A producer's own user_id passes through untouched; a trusted one
        // is a forwarder's or its tools' mark, and this copy is ours.
        let producers = properties.user_id().is_some() && !request.envelope.annotations.trusted;
        match &self.user {
            Some(user) if !producers => properties.with_user_id(user.clone()),
            _ => properties,
        }
    }

    /// A publish was nacked. While the connection settles, the first such
    /// nack of the connection is logged, once for all that follow. New
    /// publishes go to a fresh channel (see [`NACKED_CHANNEL_AGE`]); the
    /// nacked one closes once the confirms on it are in or overdue.
    pub(super) fn nacked(&mut self, waiter: &Waiter, failure: &PublishFailure) {
        let epoch = self.connector.epoch();
        if matches!(failure, PublishFailure::NackedSettling) && self.settling_logged != epoch {
            self.settling_logged = epoch;
            self.telemetry
                .publish_settling(&self.endpoint.name, self.connector.broker());
        }
        let current = waiter.mode == Mode::Normal && waiter.generation == self.generation;
        if !current || self.channel_opened.elapsed() < NACKED_CHANNEL_AGE {
            return;
        }
        let Some(channel) = self.channel.take() else {
            return;
        };
        let (stop, drain) = (self.stop.clone(), self.endpoint.confirm_timeout);
        let telemetry = self.telemetry.clone();
        self.background.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(drain) => {}
            }
            close_channel(&channel, "switchyard: nacked", &telemetry).await;
        });
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
        while let Some(id) = self.deadlines.pop_due(|id| self.waiting.contains_key(&id)) {
            self.timed_out(id);
        }
        self.deadlines.rearm(|id| self.waiting.contains_key(&id));
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
            let telemetry = self.telemetry.clone();
            self.background.spawn(async move {
                close_channel(&channel, "switchyard: confirm timeout", &telemetry).await;
            });
        }
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
