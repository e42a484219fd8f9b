//! One long-lived confirm channel per endpoint, driven by a single task.
//!
//! Publishes are started in the order [`Publisher::publish`] is called and
//! many stay in flight at once. Every copy carries `x-switchyard-publish-id`
//! so a `basic.return` is attributed to the publish it names, whichever
//! confirm lapin happened to attach it to: a confirm is a delivery only when
//! it is an ack and no return names its publish (see `Actor::harvest` for
//! why that needs a fence on lapin's acknowledgement lock).

use super::connector::{ConnectError, Connector};
use super::{AmqpValue, ShortString};
use crate::config::Endpoint;
use crate::envelope::{Envelope, value_text};
use crate::telemetry;
use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::message::BasicReturnMessage;
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;

/// Header carrying the identity of one publish attempt.
pub const PUBLISH_ID_HEADER: &str = "x-switchyard-publish-id";

static NEXT_PUBLISH_ID: AtomicU64 = AtomicU64::new(1);

/// Why one publish attempt failed; every variant is a reason to fail over.
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
    #[error("channel error: {0}")]
    Channel(String),
    /// No channel could be opened to the endpoint's broker.
    #[error("{0}")]
    Unreachable(#[from] ConnectError),
}

/// Handle to an endpoint's publishing task. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    endpoint: Arc<Endpoint>,
    commands: mpsc::UnboundedSender<Command>,
}

enum Command {
    Publish(Request),
    /// The publish with this id timed out: its channel is suspect.
    TimedOut(u64),
}

struct Request {
    id: u64,
    envelope: Arc<Envelope>,
    extra_headers: Vec<(ShortString, AmqpValue)>,
    reply: oneshot::Sender<Result<(), PublishFailure>>,
}

impl Publisher {
    /// Spawns the endpoint's task. It stops when every handle is dropped and
    /// its confirms are in, or at once when `stop` is cancelled.
    pub fn spawn(
        endpoint: Arc<Endpoint>,
        connector: Arc<Connector>,
        stop: CancellationToken,
    ) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let actor = Actor {
            exchange: endpoint.exchange.as_str().into(),
            routing_key: endpoint.routing_key.as_str().into(),
            endpoint: endpoint.clone(),
            connector,
            channel: None,
            generation: 0,
            waiting: HashMap::new(),
            returned: HashMap::new(),
            rx,
            stop,
        };
        tokio::spawn(actor.run());
        Self { endpoint, commands }
    }

    /// The endpoint this publisher sends to.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// Starts publishing one copy of `envelope` now, in call order, and
    /// returns its outcome: `Ok` once confirmed and not returned. The
    /// confirm timeout runs from this call.
    pub fn publish(
        &self,
        envelope: Arc<Envelope>,
        extra_headers: Vec<(ShortString, AmqpValue)>,
    ) -> impl Future<Output = Result<(), PublishFailure>> + Send + 'static {
        let limit = self.endpoint.confirm_timeout;
        let deadline = Instant::now() + limit;
        let id = NEXT_PUBLISH_ID.fetch_add(1, Ordering::Relaxed);
        let (reply, outcome) = oneshot::channel();
        let request = Request {
            id,
            envelope,
            extra_headers,
            reply,
        };
        let sent = self.commands.send(Command::Publish(request)).is_ok();
        let commands = self.commands.clone();
        async move {
            if !sent {
                return Err(PublishFailure::Channel("publisher stopped".to_owned()));
            }
            match timeout_at(deadline, outcome).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(PublishFailure::Channel("publisher stopped".to_owned())),
                Err(_) => {
                    let _ = commands.send(Command::TimedOut(id));
                    Err(PublishFailure::Timeout(limit.as_millis()))
                }
            }
        }
    }
}

/// One publish's confirm: its id, the channel it went out on, the result.
type Confirmed = (u64, Channel, lapin::Result<Confirmation>);
type InFlight = Pin<Box<dyn Future<Output = Confirmed> + Send>>;

struct Waiter {
    reply: oneshot::Sender<Result<(), PublishFailure>>,
    generation: u64,
}

struct Actor {
    endpoint: Arc<Endpoint>,
    exchange: ShortString,
    routing_key: ShortString,
    connector: Arc<Connector>,
    channel: Option<Channel>,
    /// Bumped each time a new channel is opened.
    generation: u64,
    /// Publishes awaiting their outcome, by publish id.
    waiting: HashMap<u64, Waiter>,
    /// Returns seen for publishes whose own confirm is not in yet.
    returned: HashMap<u64, PublishFailure>,
    rx: mpsc::UnboundedReceiver<Command>,
    stop: CancellationToken,
}

impl Actor {
    async fn run(mut self) {
        let mut in_flight: FuturesUnordered<InFlight> = FuturesUnordered::new();
        let mut open = true;
        while open || !in_flight.is_empty() {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break,
                Some(first) = in_flight.next(), if !in_flight.is_empty() => {
                    self.harvest(first, &mut in_flight);
                }
                command = self.rx.recv(), if open => match command {
                    Some(Command::Publish(request)) => self.start(request, &mut in_flight).await,
                    Some(Command::TimedOut(id)) => self.timed_out(id),
                    None => open = false,
                },
            }
        }
        if let Some(channel) = self.channel.take() {
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                channel.close(200, "switchyard: shutdown".into()),
            )
            .await;
        }
    }

    async fn start(&mut self, request: Request, in_flight: &mut FuturesUnordered<InFlight>) {
        let channel = match self.live_channel().await {
            Ok(channel) => channel,
            Err(why) => {
                let _ = request.reply.send(Err(why.into()));
                return;
            }
        };
        let id = request.id;
        let properties = self.properties(&request);
        let (exchange, routing_key) = (self.exchange.clone(), self.routing_key.clone());
        let envelope = request.envelope;
        let publishing = channel.clone();
        let mut publish: InFlight = Box::pin(async move {
            let options = BasicPublishOptions {
                mandatory: true,
                immediate: false,
            };
            let result = match publishing
                .basic_publish(exchange, routing_key, options, &envelope.body, properties)
                .await
            {
                Ok(confirm) => confirm.await,
                Err(e) => Err(e),
            };
            (id, channel, result)
        });
        self.waiting.insert(
            id,
            Waiter {
                reply: request.reply,
                generation: self.generation,
            },
        );
        // The first poll assigns the delivery tag and queues the frames, so
        // publishes leave in call order without awaiting each one.
        match std::future::poll_fn(|cx| Poll::Ready(publish.as_mut().poll(cx))).await {
            Poll::Ready(done) => self.harvest(done, in_flight),
            Poll::Pending => in_flight.push(publish),
        }
    }

    async fn live_channel(&mut self) -> Result<Channel, ConnectError> {
        if let Some(channel) = &self.channel {
            if channel.status().connected() {
                return Ok(channel.clone());
            }
            self.channel = None;
        }
        let channel = self
            .connector
            .channel(true, self.endpoint.confirm_timeout)
            .await?;
        self.generation += 1;
        self.channel = Some(channel.clone());
        Ok(channel)
    }

    fn properties(&self, request: &Request) -> BasicProperties {
        let mut headers = request.envelope.headers().cloned().unwrap_or_default();
        for (name, value) in &self.endpoint.headers {
            headers.insert(
                name.as_str().into(),
                AmqpValue::LongString(value.as_str().into()),
            );
        }
        for (name, value) in &request.extra_headers {
            headers.insert(name.clone(), value.clone());
        }
        headers.insert(
            PUBLISH_ID_HEADER.into(),
            AmqpValue::LongLongInt(request.id as i64),
        );
        request.envelope.properties.clone().with_headers(headers)
    }

    /// A publish timed out: if it went out on the current channel, that
    /// channel is suspect (a stalled connection never answers), so the next
    /// publish opens a fresh one.
    fn timed_out(&mut self, id: u64) {
        if let Some(waiter) = self.waiting.remove(&id)
            && waiter.generation == self.generation
            && let Some(channel) = self.channel.take()
        {
            telemetry::channel_reset(&self.endpoint.name, "confirm timeout");
            tokio::spawn(async move {
                let _ = tokio::time::timeout(
                    std::time::Duration::from_secs(1),
                    channel.close(200, "switchyard: confirm timeout".into()),
                )
                .await;
            });
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
        let mut batch = vec![first];
        drain_ready(in_flight, &mut batch);
        loop {
            fence(&batch);
            let mut late = Vec::new();
            drain_ready(in_flight, &mut late);
            for (id, _, result) in batch.iter_mut().chain(late.iter_mut()) {
                if let Ok(Confirmation::Ack(returned) | Confirmation::Nack(returned)) = result {
                    self.attribute(returned.take(), *id);
                }
            }
            self.decide(batch);
            if late.is_empty() {
                return;
            }
            batch = late;
        }
    }

    /// Sends each publisher its outcome; returns were attributed already.
    fn decide(&mut self, batch: Vec<Confirmed>) {
        for (id, _, result) in batch {
            let outcome = match (self.returned.remove(&id), result) {
                (Some(returned), _) => Err(returned),
                (None, Ok(Confirmation::Ack(_))) => Ok(()),
                (None, Ok(Confirmation::Nack(_))) => Err(PublishFailure::Nacked),
                (None, Ok(Confirmation::NotRequested)) => Err(PublishFailure::Channel(
                    "channel is not in confirm mode".to_owned(),
                )),
                (None, Err(e)) => Err(PublishFailure::Channel(e.to_string())),
            };
            if let Some(waiter) = self.waiting.remove(&id) {
                let _ = waiter.reply.send(outcome);
            }
        }
    }

    fn attribute(&mut self, returned: Option<BasicReturnMessage>, carrier: u64) {
        let Some(message) = returned else { return };
        let owner = publish_id(&message.delivery.properties).unwrap_or(carrier);
        if !self.waiting.contains_key(&owner) {
            telemetry::late_return(&self.endpoint.name, owner);
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
        .get(PUBLISH_ID_HEADER)?;
    value_text(value)?.parse().ok()
}
