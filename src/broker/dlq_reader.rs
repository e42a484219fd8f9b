//! The dead-letter queue as `dlq inspect` and `dlq redrive` reach it: one
//! connection to the inbound broker, a channel that takes dead letters
//! with `basic.get` and manual acks, and, for redrive, a confirm channel
//! that puts copies back on the inbound queue.
//!
//! A dead letter whose content header is larger than the connection's
//! `frame_max` (the broker's `x-death` can take a header that fit past it)
//! makes the client close the connection; the reader says so, with the
//! dead letter's place in the queue, instead of waiting for an answer that
//! cannot come.
//!
//! Nothing is removed unless the caller acks it. Every message taken and
//! not acked is held (unacked) until [`DlqReader::finish`], which hands them
//! all back with one `basic.nack(multiple, requeue)`; the broker puts each
//! back at its original position in a classic queue, so the queue keeps its
//! content and order. If the process dies instead, the broker does the same
//! when the connection drops.

use super::closing::{close_channel, close_connection};
use super::connector::{ConnectError, connect_first};
use super::error::{BrokerError, Fault, OPERATION_BOUND, Unfinished, bounded};
use super::unreadable::oversized_frame;
use crate::amqp::{FieldTable, Properties};
use crate::config::BrokerSpec;
use crate::envelope::Envelope;
use crate::telemetry::Telemetry;
use futures_util::{Stream, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, Event};
use std::pin::Pin;

/// Reading the dead-letter queue failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// No connection to the broker: unreachable, or it refuses the
    /// credentials or the vhost (said as `run` says it, with what to fix).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The dead-letter queue does not exist.
    #[error(
        "dead_letter.queue \"{queue}\" does not exist on broker \"{broker}\": start \
         `switchyard run` once with this configuration (it declares the queue when \
         inbound.declare = true), or fix dead_letter.queue"
    )]
    Missing {
        /// The queue.
        queue: String,
        /// The broker's name.
        broker: String,
    },
    /// The broker refused or dropped an operation.
    #[error("{what}: {error}")]
    Broker {
        /// What was being done.
        what: &'static str,
        /// The broker's answer.
        error: BrokerError,
    },
    /// The broker did not answer in time.
    #[error("{0}: no answer from the broker within 30 s")]
    Timeout(&'static str),
    /// A dead letter's content header is larger than the connection's
    /// `frame_max`: the client closed the connection on it.
    #[error(
        "dead letter {position} of the queue (from its head) has a content header of {frame} \
         bytes, over the broker's frame_max of {frame_max}: no client of this broker can read it \
         (headers the broker added when it dead-lettered it took it past the limit); the command \
         stops there, and a broker with a larger frame_max (rabbitmq.conf) would let it be read"
    )]
    Unreadable {
        /// Its place in the queue, 1 for the head.
        position: u64,
        /// The size of its content header frame.
        frame: usize,
        /// The connection's negotiated `frame_max`.
        frame_max: u32,
    },
}

/// Why a copy put back on the inbound queue was not confirmed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepublishError {
    /// The broker returned it as unroutable: the queue does not exist.
    #[error("returned by the broker: {code} {text}")]
    Returned {
        /// AMQP reply code (312 NO_ROUTE).
        code: u16,
        /// AMQP reply text.
        text: String,
    },
    /// The broker answered `basic.nack` (a full queue with `reject-publish`).
    #[error("nacked by the broker")]
    Nacked,
    /// The broker refused this message itself (a foreign `user_id`, too
    /// large); others may still pass.
    #[error("refused by the broker: {0}")]
    Refused(BrokerError),
    /// The channel or connection failed.
    #[error("{0}")]
    Broker(BrokerError),
    /// No confirm in time (a broker alarm blocks publishers, or it stalls).
    #[error("no confirm within 30 s (is the broker blocking publishers?)")]
    Timeout,
}

/// A connection to the dead-letter queue's broker.
pub struct DlqReader {
    connection: Connection,
    channel: Channel,
    publisher: Option<Channel>,
    queue: String,
    /// The delivery tag of the last message taken, if any.
    last_tag: Option<u64>,
    /// Messages taken so far.
    taken: u64,
    /// The connection's events, to learn at once that it failed (in a
    /// mutex only to be shared between threads; only `&mut self` reads it).
    events: std::sync::Mutex<Pin<Box<dyn Stream<Item = Event> + Send>>>,
    /// Where a close the broker does not answer is logged.
    telemetry: Telemetry,
}

impl DlqReader {
    /// Connects to `spec` (the connection is named `<instance>/dlq/<broker>`)
    /// and checks that `queue` exists; returns the reader and how many
    /// messages the queue holds ready.
    pub async fn open(
        spec: &BrokerSpec,
        instance: &str,
        queue: &str,
    ) -> Result<(Self, u32), ReadError> {
        let properties = ConnectionProperties::default()
            .with_connection_name(format!("{instance}/dlq/{}", spec.name).into());
        let connection = connect_first(spec, properties).await?;
        let events = std::sync::Mutex::new(Box::pin(connection.events_listener()) as Pin<Box<_>>);
        // A command's own: its metrics are never served.
        let telemetry = Telemetry::new();
        let channel = bounded("opening a channel", connection.create_channel()).await?;
        let options = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = tokio::time::timeout(
            OPERATION_BOUND,
            channel.queue_declare(queue.into(), options, FieldTable::default()),
        )
        .await;
        let count = match declared {
            Ok(Ok(q)) => q.message_count(),
            Ok(Err(e)) => {
                let error = BrokerError::from_lapin(&e);
                close_connection(&connection, 200, "", &telemetry).await;
                return Err(match error.code {
                    Some(super::code::NOT_FOUND) => ReadError::Missing {
                        queue: queue.to_owned(),
                        broker: spec.name.clone(),
                    },
                    _ => ReadError::Broker {
                        what: "checking the dead-letter queue",
                        error,
                    },
                });
            }
            Err(_) => return Err(ReadError::Timeout("checking the dead-letter queue")),
        };
        // The passive declare may not have closed it, but a 404 would have.
        let channel = if channel.status().connected() {
            channel
        } else {
            bounded("opening a channel", connection.create_channel()).await?
        };
        let reader = Self {
            connection,
            channel,
            publisher: None,
            queue: queue.to_owned(),
            last_tag: None,
            taken: 0,
            events,
            telemetry,
        };
        Ok((reader, count))
    }

    /// Takes the next dead letter, unacked; `None` when no message is ready.
    pub async fn next(&mut self) -> Result<Option<Envelope>, ReadError> {
        let get = bounded(
            "reading the dead-letter queue",
            self.channel.basic_get(
                self.queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            ),
        );
        // The get is never answered when the client itself closes the
        // connection; its error event says why.
        let events = self.events.get_mut().unwrap_or_else(|e| e.into_inner());
        let failed = async {
            while let Some(event) = events.next().await {
                if let Event::Error(error) = event {
                    return error;
                }
            }
            std::future::pending().await
        };
        let got = tokio::select! {
            got = get => got?,
            error = failed => {
                let error = BrokerError::from_lapin(&error);
                return Err(match oversized_frame(&error) {
                    Some(frame) => ReadError::Unreadable {
                        position: self.taken + 1,
                        frame,
                        frame_max: self.connection.configuration().frame_max(),
                    },
                    None => ReadError::Broker {
                        what: "reading the dead-letter queue",
                        error,
                    },
                });
            }
        };
        if got.is_some() {
            self.taken += 1;
        }
        Ok(got.map(|message| {
            let delivery = message.delivery;
            self.last_tag = Some(delivery.delivery_tag);
            Envelope {
                delivery_tag: delivery.delivery_tag,
                exchange: delivery.exchange.to_string(),
                routing_key: delivery.routing_key.to_string(),
                redelivered: delivery.redelivered,
                properties: delivery.properties,
                body: delivery.data,
                // The dead-letter tools judge their records themselves.
                annotations: Default::default(),
            }
        }))
    }

    /// Removes one dead letter from the queue for good.
    pub async fn ack(&self, delivery_tag: u64) -> Result<(), ReadError> {
        bounded(
            "acknowledging a dead letter",
            self.channel
                .basic_ack(delivery_tag, BasicAckOptions { multiple: false }),
        )
        .await
        .map_err(ReadError::from)
    }

    /// Publishes `body` with `properties` to the default exchange with
    /// routing key `queue`, `mandatory`, and waits for its confirm: `Ok` only
    /// for an ack without a return. One publish at a time, so a return
    /// always belongs to this publish.
    pub async fn republish(
        &mut self,
        queue: &str,
        properties: Properties,
        body: &[u8],
    ) -> Result<(), RepublishError> {
        let channel = match &self.publisher {
            Some(c) if c.status().connected() => c.clone(),
            _ => {
                let open = async {
                    let channel = self.connection.create_channel().await?;
                    channel
                        .confirm_select(ConfirmSelectOptions::default())
                        .await?;
                    Ok::<_, lapin::Error>(channel)
                };
                let channel = match tokio::time::timeout(OPERATION_BOUND, open).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => return Err(RepublishError::Broker(BrokerError::from_lapin(&e))),
                    Err(_) => return Err(RepublishError::Timeout),
                };
                self.publisher = Some(channel.clone());
                channel
            }
        };
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let publish = async {
            channel
                .basic_publish("".into(), queue.into(), options, body, properties)
                .await?
                .await
        };
        match tokio::time::timeout(OPERATION_BOUND, publish).await {
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(Confirmation::Ack(Some(r)) | Confirmation::Nack(Some(r)))) => {
                Err(RepublishError::Returned {
                    code: r.reply_code,
                    text: r.reply_text.to_string(),
                })
            }
            Ok(Ok(Confirmation::Nack(None))) => Err(RepublishError::Nacked),
            Ok(Ok(Confirmation::NotRequested)) => Err(RepublishError::Broker(BrokerError {
                code: None,
                level: super::Level::Transport,
                text: "channel is not in confirm mode".to_owned(),
            })),
            Ok(Err(e)) => {
                let error = BrokerError::from_lapin(&e);
                match error.fault() {
                    Fault::Message => Err(RepublishError::Refused(error)),
                    _ => Err(RepublishError::Broker(error)),
                }
            }
            Err(_) => {
                // Whatever that channel still delivers is not waited for.
                self.publisher = None;
                Err(RepublishError::Timeout)
            }
        }
    }

    /// Hands every message taken and not acked back to the queue, in
    /// order, and closes the connection.
    pub async fn finish(self) -> Result<(), ReadError> {
        let requeued = match self.last_tag {
            Some(tag) => {
                let options = BasicNackOptions {
                    multiple: true,
                    requeue: true,
                };
                bounded(
                    "handing dead letters back",
                    self.channel.basic_nack(tag, options),
                )
                .await
                .map_err(ReadError::from)
            }
            None => Ok(()),
        };
        // Closing also requeues anything the nack did not reach.
        close_channel(&self.channel, "", &self.telemetry).await;
        let why = "switchyard dlq: done";
        close_connection(&self.connection, 200, why, &self.telemetry).await;
        requeued
    }
}

impl From<Unfinished> for ReadError {
    fn from(unfinished: Unfinished) -> Self {
        match unfinished {
            Unfinished::Failed(what, error) => Self::Broker { what, error },
            Unfinished::Timeout(what) => Self::Timeout(what),
        }
    }
}
