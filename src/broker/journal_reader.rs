//! The journal's stream as `switchyard trace` reads it: a connection of its
//! own (named `<instance>/trace/<broker>`), the stream checked without
//! creating anything, its tail found, and a consumer from a point in time
//! with manual acks and a bounded prefetch.
//!
//! Over AMQP 0-9-1 a stream never says "this is the end": a consumer that
//! has read everything simply waits. So the tail is learned first
//! ([`JournalReader::tail`]): a consumer at offset `last` with a prefetch
//! of one receives the stream's last chunk whole (RabbitMQ sends a chunk's
//! messages together, and no more until an ack), and a `basic.cancel`,
//! whose `cancel-ok` follows every delivery already sent on the channel,
//! closes it. The highest `x-stream-offset` among them is the tail. Only
//! an empty stream sends nothing at all; [`TAIL_WAIT`] bounds that wait.

use super::closing::close_channel;
use super::connector::{ConnectError, Connector, Role};
use super::error::{BrokerError, OPERATION_BOUND, Unfinished, bounded};
use super::topology::{TopologyError, check_journal_stream};
use crate::amqp::{AmqpValue, FieldTable, Properties, short_text};
use crate::config::Journal;
use crate::telemetry::Telemetry;
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::{Channel, Consumer};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::TaskTracker;

/// How long the tail probe waits for the last chunk: a stream with
/// anything in it sends it at once.
pub const TAIL_WAIT: Duration = Duration::from_secs(2);
/// The header RabbitMQ puts on every message it delivers from a stream.
const OFFSET_HEADER: &str = "x-stream-offset";

/// Reading the journal's stream failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalReadError {
    /// No connection to the broker.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// No queue has the stream's name.
    #[error(
        "it does not exist: start `switchyard run` once with this configuration (it declares \
         the stream), or fix journal.stream"
    )]
    Missing,
    /// A queue of another type has its name, or the broker refused the check.
    #[error(transparent)]
    Check(#[from] TopologyError),
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
    /// The broker ended the consumer (the stream was deleted under it).
    #[error("the broker cancelled the read (was the stream deleted?)")]
    Cancelled,
}

/// One stream message: a batch of journal records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Its offset in the stream.
    pub offset: u64,
    /// Its `timestamp` property (unix seconds), when the writer set one.
    pub timestamp: Option<u64>,
    /// How many records it says it holds (`x-switchyard-journal-records`).
    pub records: Option<u64>,
    /// NDJSON, one record per line.
    pub body: Vec<u8>,
    /// The `user_id` it was published with (checked by the broker against
    /// the publishing connection's user); `None` without one.
    pub writer: Option<String>,
}

/// A connection to the journal's stream.
pub struct JournalReader {
    connector: Arc<Connector>,
    background: TaskTracker,
    stream: String,
}

impl JournalReader {
    /// Connects to the journal's broker and checks that its stream exists
    /// and is a stream (a passive declare, then the declaration `run`
    /// makes, which changes nothing on an existing stream).
    pub async fn open(journal: &Journal, instance: &str) -> Result<Self, JournalReadError> {
        let background = TaskTracker::new();
        // A command's own: its metrics are never served.
        let connector = Connector::new(
            journal.broker.clone(),
            instance,
            Role::Trace,
            background.clone(),
            Telemetry::new(),
        );
        let reader = Self {
            connector,
            background,
            stream: journal.stream.clone(),
        };
        let error = match check_journal_stream(&reader.connector, journal).await {
            Ok(true) => return Ok(reader),
            Ok(false) => JournalReadError::Missing,
            Err(TopologyError::NoConnection(e)) => e.into(),
            Err(e) => e.into(),
        };
        reader.close().await;
        Err(error)
    }

    /// The offset of the stream's last message now, or `None` when the
    /// stream sent nothing within [`TAIL_WAIT`] (it is empty).
    pub async fn tail(&self) -> Result<Option<u64>, JournalReadError> {
        let channel = self.channel().await?;
        let tag = "switchyard-trace-tail";
        let at = AmqpValue::LongString("last".into());
        let mut consumer = self.consume(&channel, tag, 1, at).await?;
        let first = tokio::time::timeout(TAIL_WAIT, consumer.next()).await;
        let mut tail = match first {
            Ok(Some(Ok(delivery))) => stream_offset(&delivery.properties),
            Ok(Some(Err(e))) => return Err(broker("reading the stream's tail", &e)),
            Ok(None) => return Err(JournalReadError::Cancelled),
            Err(_) => None,
        };
        // Every delivery already sent comes before the cancel-ok, which
        // ends the consumer.
        bounded(
            "ending the tail probe",
            channel.basic_cancel(tag.into(), BasicCancelOptions::default()),
        )
        .await?;
        let drain = async {
            while let Some(Ok(delivery)) = consumer.next().await {
                tail = tail.max(stream_offset(&delivery.properties));
            }
        };
        if tokio::time::timeout(OPERATION_BOUND, drain).await.is_err() {
            return Err(JournalReadError::Timeout("ending the tail probe"));
        }
        close_channel(&channel, "", self.connector.telemetry()).await;
        Ok(tail)
    }

    /// Follows the stream from the first chunk written at or after
    /// `from_secs` (unix seconds), `prefetch` messages at a time.
    pub async fn follow(
        &self,
        from_secs: u64,
        prefetch: u16,
    ) -> Result<Follower, JournalReadError> {
        let channel = self.channel().await?;
        let at = AmqpValue::Timestamp(from_secs);
        let consumer = self
            .consume(&channel, "switchyard-trace", prefetch, at)
            .await?;
        Ok(Follower {
            channel,
            consumer,
            unacked: 0,
            ack_every: (prefetch / 2).max(1),
            telemetry: self.connector.telemetry().clone(),
        })
    }

    /// Closes the connection.
    pub async fn close(self) {
        self.connector.close().await;
        self.background.close();
        let _ = tokio::time::timeout(OPERATION_BOUND, self.background.wait()).await;
    }

    async fn channel(&self) -> Result<Channel, JournalReadError> {
        Ok(self.connector.channel(false, OPERATION_BOUND).await?)
    }

    /// `basic.qos` (required on a stream), then `basic.consume` with manual
    /// acks from `at` (`x-stream-offset`).
    async fn consume(
        &self,
        channel: &Channel,
        tag: &str,
        prefetch: u16,
        at: AmqpValue,
    ) -> Result<Consumer, JournalReadError> {
        let qos = BasicQosOptions { global: false };
        bounded("setting the prefetch", channel.basic_qos(prefetch, qos)).await?;
        let mut arguments = FieldTable::default();
        arguments.insert(OFFSET_HEADER.into(), at);
        let options = BasicConsumeOptions {
            no_ack: false,
            ..Default::default()
        };
        let consume =
            channel.basic_consume(self.stream.as_str().into(), tag.into(), options, arguments);
        Ok(bounded("consuming the stream", consume).await?)
    }
}

/// A consumer of the stream from a point in time.
pub struct Follower {
    channel: Channel,
    consumer: Consumer,
    /// Deliveries taken since the last ack.
    unacked: u16,
    ack_every: u16,
    telemetry: Telemetry,
}

impl Follower {
    /// The next batch, or `None` when nothing came for `idle`.
    pub async fn next(&mut self, idle: Duration) -> Result<Option<Batch>, JournalReadError> {
        let delivery = match tokio::time::timeout(idle, self.consumer.next()).await {
            Err(_) => return Ok(None),
            Ok(None) => return Err(JournalReadError::Cancelled),
            Ok(Some(Err(e))) => return Err(broker("reading the stream", &e)),
            Ok(Some(Ok(delivery))) => delivery,
        };
        grant_credit(
            &self.channel,
            delivery.delivery_tag,
            &mut self.unacked,
            self.ack_every,
        )
        .await?;
        let properties = &delivery.properties;
        Ok(Some(Batch {
            offset: stream_offset(properties).unwrap_or(0),
            timestamp: *properties.timestamp(),
            records: records(properties),
            writer: properties
                .user_id()
                .as_ref()
                .map(|u| short_text(u).into_owned()),
            body: delivery.data,
        }))
    }

    /// Ends the consumer and its channel.
    pub async fn close(self) {
        close_channel(&self.channel, "", &self.telemetry).await;
    }
}

/// Counts one delivery taken from a stream and, every `every`, acks up to
/// `tag`: on a stream an ack only grants credit for the next messages.
pub(super) async fn grant_credit(
    channel: &Channel,
    tag: u64,
    unacked: &mut u16,
    every: u16,
) -> Result<(), Unfinished> {
    *unacked += 1;
    if *unacked >= every {
        let ack = BasicAckOptions { multiple: true };
        bounded("acknowledging", channel.basic_ack(tag, ack)).await?;
        *unacked = 0;
    }
    Ok(())
}

/// The stream offset RabbitMQ put on a delivery.
pub(super) fn stream_offset(properties: &Properties) -> Option<u64> {
    integer(properties, OFFSET_HEADER)
}

/// The record count the writer put on a batch.
fn records(properties: &Properties) -> Option<u64> {
    integer(properties, super::BATCH_RECORDS)
}

fn integer(properties: &Properties, header: &str) -> Option<u64> {
    match properties.headers().as_ref()?.inner().get(header)? {
        AmqpValue::LongLongInt(n) => u64::try_from(*n).ok(),
        AmqpValue::LongInt(n) => u64::try_from(*n).ok(),
        AmqpValue::LongUInt(n) => Some(u64::from(*n)),
        _ => None,
    }
}

fn broker(what: &'static str, error: &lapin::Error) -> JournalReadError {
    JournalReadError::Broker {
        what,
        error: BrokerError::from_lapin(error),
    }
}

impl From<Unfinished> for JournalReadError {
    fn from(unfinished: Unfinished) -> Self {
        match unfinished {
            Unfinished::Failed(what, error) => Self::Broker { what, error },
            Unfinished::Timeout(what) => Self::Timeout(what),
        }
    }
}
