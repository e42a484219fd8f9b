//! The group's control stream on the broker: a connection of its own
//! (named `<name>/control/<broker>`), the stream declared, records
//! appended one at a time with a confirm, and followed from an offset
//! (`first` when recovering, else the one after the last applied).

use super::closing::close_channel;
use super::connector::{ConnectError, Connector, Role};
use super::error::{BrokerError, Unfinished, bounded};
use super::journal_reader::{grant_credit, stream_offset};
use super::stream_append::{Appended, append};
use super::topology::{TopologyError, declare_control_stream};
use crate::amqp::{AmqpValue, FieldTable, Properties, short_text};
use crate::config::Control;
use crate::telemetry::Telemetry;
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::{Channel, Consumer};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::TaskTracker;

/// How long an append may wait for its confirm, and a channel to open.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Where a stream consumer starts.
const OFFSET_HEADER: &str = "x-stream-offset";
/// Records the follower takes before it acknowledges (stream credit).
const PREFETCH: u16 = 200;

/// The control stream failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlStreamError {
    /// No connection to the broker.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The stream could not be declared.
    #[error(transparent)]
    Declare(#[from] TopologyError),
    /// The broker refused or dropped an operation.
    #[error("{what}: {error}")]
    Broker {
        /// What was being done.
        what: &'static str,
        /// The broker's answer.
        error: BrokerError,
    },
    /// The broker did not answer in time.
    #[error("{0}: no answer from the broker in time")]
    Timeout(&'static str),
    /// The broker nacked or returned a record.
    #[error("the broker refused the record ({0})")]
    Refused(String),
    /// The broker ended the consumer (the stream was deleted under it).
    #[error("the broker cancelled the control stream's consumer (was the stream deleted?)")]
    Cancelled,
}

impl ControlStreamError {
    /// Whether the broker refuses the stream itself (a permission, a queue
    /// of another type by its name): trying again changes nothing.
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Declare(e) if e.is_refusal())
    }
}

impl From<Unfinished> for ControlStreamError {
    fn from(unfinished: Unfinished) -> Self {
        match unfinished {
            Unfinished::Failed(what, error) => Self::Broker { what, error },
            Unfinished::Timeout(what) => Self::Timeout(what),
        }
    }
}

/// Where the follower starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The oldest record the stream keeps.
    First,
    /// This offset.
    Offset(u64),
}

/// The control stream's connection.
pub struct ControlStream {
    connector: Arc<Connector>,
    settings: Control,
    writer: Option<Channel>,
}

impl ControlStream {
    /// A connection to be made on first use, for instance `name`.
    pub fn new(
        settings: &Control,
        name: &str,
        background: TaskTracker,
        telemetry: Telemetry,
    ) -> Self {
        let connector = Connector::new(
            settings.broker.clone(),
            name,
            Role::Control,
            background,
            telemetry,
        );
        Self {
            connector,
            settings: settings.clone(),
            writer: None,
        }
    }

    /// Declares the stream (nothing changes on an existing one).
    pub async fn declare(&self) -> Result<(), ControlStreamError> {
        declare_control_stream(&self.connector, &self.settings).await?;
        Ok(())
    }

    /// Appends one record and waits for its confirm.
    pub async fn append(&mut self, body: &[u8]) -> Result<(), ControlStreamError> {
        let channel = match &self.writer {
            Some(channel) if channel.status().connected() => channel.clone(),
            _ => {
                let channel = self.connector.channel(true, WRITE_TIMEOUT).await?;
                self.writer = Some(channel.clone());
                channel
            }
        };
        let mut properties = Properties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        // The broker checks it is this connection's user: readers tell the
        // forwarders' records from anyone else's by it.
        if let Some(user) = self.connector.user() {
            properties = properties.with_user_id(user.into());
        }
        let stream = self.settings.stream.as_str();
        let failed = match append(&channel, stream, body, properties, WRITE_TIMEOUT).await {
            Appended::Confirmed => return Ok(()),
            Appended::Returned(code, text) => {
                ControlStreamError::Refused(format!("returned: {code} {text}"))
            }
            Appended::Nacked => ControlStreamError::Refused("nacked".to_owned()),
            Appended::Failed(error) => ControlStreamError::Broker {
                what: "appending a record",
                error,
            },
            Appended::TimedOut => ControlStreamError::Timeout("appending a record"),
        };
        if let Some(channel) = self.writer.take() {
            close_channel(
                &channel,
                "control append failed",
                self.connector.telemetry(),
            )
            .await;
        }
        Err(failed)
    }

    /// Follows the stream from `from`.
    pub async fn follow(&self, from: Start) -> Result<StreamFollower, ControlStreamError> {
        let channel = self.connector.channel(false, WRITE_TIMEOUT).await?;
        let qos = BasicQosOptions { global: false };
        bounded("setting the prefetch", channel.basic_qos(PREFETCH, qos)).await?;
        let mut arguments = FieldTable::default();
        let at = match from {
            Start::First => AmqpValue::LongString("first".into()),
            Start::Offset(n) => AmqpValue::LongLongInt(i64::try_from(n).unwrap_or(i64::MAX)),
        };
        arguments.insert(OFFSET_HEADER.into(), at);
        let options = BasicConsumeOptions {
            no_ack: false,
            ..Default::default()
        };
        let stream = self.settings.stream.as_str();
        let consume = channel.basic_consume(
            stream.into(),
            "switchyard-control".into(),
            options,
            arguments,
        );
        let consumer = bounded("following the control stream", consume).await?;
        Ok(StreamFollower {
            channel,
            consumer,
            unacked: 0,
            telemetry: self.connector.telemetry().clone(),
        })
    }

    /// Closes the connection.
    pub async fn close(&mut self) {
        if let Some(channel) = self.writer.take() {
            close_channel(&channel, "control stopping", self.connector.telemetry()).await;
        }
        self.connector.close().await;
    }
}

/// One message read from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    /// Its offset in the stream.
    pub offset: u64,
    /// The `user_id` it was published with, which the broker checked
    /// against the publishing connection's user; `None` without one.
    pub writer: Option<String>,
    /// What it holds.
    pub body: Vec<u8>,
}

/// A consumer of the control stream.
pub struct StreamFollower {
    channel: Channel,
    consumer: Consumer,
    unacked: u16,
    telemetry: Telemetry,
}

impl StreamFollower {
    /// The next record.
    pub async fn next(&mut self) -> Result<StreamRecord, ControlStreamError> {
        let delivery = match self.consumer.next().await {
            None => return Err(ControlStreamError::Cancelled),
            Some(Err(e)) => {
                return Err(ControlStreamError::Broker {
                    what: "following the control stream",
                    error: BrokerError::from_lapin(&e),
                });
            }
            Some(Ok(delivery)) => delivery,
        };
        let tag = delivery.delivery_tag;
        grant_credit(&self.channel, tag, &mut self.unacked, PREFETCH / 2).await?;
        let offset = stream_offset(&delivery.properties).unwrap_or(0);
        let writer = delivery.properties.user_id().as_ref().map(short_text);
        Ok(StreamRecord {
            offset,
            writer: writer.map(std::borrow::Cow::into_owned),
            body: delivery.data,
        })
    }

    /// Ends the consumer and its channel.
    pub async fn close(self) {
        close_channel(&self.channel, "", &self.telemetry).await;
    }
}
