//! The journal's channel: a confirm channel of its own on the journal's
//! connection, which declares the stream once per channel and publishes
//! one batch of records at a time, mandatory, waiting for its confirm.

use super::closing::close_channel;
use super::connector::{ConnectError, Connector};
use super::error::BrokerError;
use super::stream_append::{Appended, append};
use super::topology::{TopologyError, declare_journal_stream};
use crate::amqp::{AmqpValue, FieldTable, Properties};
use crate::config::Journal;
use lapin::Channel;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a batch may wait for its confirm, and a channel to open.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of a batch: one JSON record per line.
pub const BATCH_CONTENT_TYPE: &str = "application/x-ndjson";
/// On every batch: how many records it holds.
pub const BATCH_RECORDS: &str = "x-switchyard-journal-records";

/// Why a batch was not written.
#[derive(Debug, thiserror::Error)]
pub enum JournalWriteError {
    /// No channel to the journal's broker.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The stream could not be declared (another queue type by that name,
    /// no stream support, a permission).
    #[error(transparent)]
    Declare(#[from] TopologyError),
    /// The broker returned the batch: the stream is gone.
    #[error("returned by the broker: {code} {text}")]
    Returned {
        /// AMQP reply code.
        code: u16,
        /// AMQP reply text.
        text: String,
    },
    /// The broker nacked the batch.
    #[error("nacked by the broker")]
    Nacked,
    /// The channel failed under the batch.
    #[error("{0}")]
    Broker(BrokerError),
    /// No confirm within the write timeout.
    #[error("no confirm within {} s", WRITE_TIMEOUT.as_secs())]
    Timeout,
}

/// Publishes batches of records to the journal's stream.
pub struct JournalChannel {
    connector: Arc<Connector>,
    settings: Journal,
    channel: Option<Channel>,
}

impl JournalChannel {
    /// A channel to be opened on `connector` when first written to.
    pub fn new(connector: Arc<Connector>, settings: Journal) -> Self {
        Self {
            connector,
            settings,
            channel: None,
        }
    }

    /// Opens the channel (declaring the stream) unless it is open: `Ok`
    /// when a batch could be written now.
    pub async fn ready(&mut self) -> Result<Channel, JournalWriteError> {
        match &self.channel {
            Some(channel) if channel.status().connected() => Ok(channel.clone()),
            _ => {
                self.channel = None;
                declare_journal_stream(&self.connector, &self.settings).await?;
                let channel = self.connector.channel(true, WRITE_TIMEOUT).await?;
                self.channel = Some(channel.clone());
                Ok(channel)
            }
        }
    }

    /// Writes one batch of `records` records and waits for its confirm.
    pub async fn write(&mut self, body: &[u8], records: usize) -> Result<(), JournalWriteError> {
        let channel = self.ready().await?;
        let mut headers = FieldTable::default();
        headers.insert(
            BATCH_RECORDS.into(),
            AmqpValue::LongLongInt(i64::try_from(records).unwrap_or(i64::MAX)),
        );
        // When it was written: `switchyard trace` stops at a batch written
        // after it started when it cannot learn the stream's tail.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut properties = Properties::default()
            .with_content_type(BATCH_CONTENT_TYPE.into())
            .with_timestamp(now)
            .with_delivery_mode(2)
            .with_headers(headers);
        // The broker checks it is this connection's user: `trace` tells the
        // forwarders' records from anyone else's by it.
        if let Some(user) = self.connector.user() {
            properties = properties.with_user_id(user.into());
        }
        let stream = self.settings.stream.as_str();
        let failed = match append(&channel, stream, body, properties, WRITE_TIMEOUT).await {
            Appended::Confirmed => return Ok(()),
            Appended::Returned(code, text) => JournalWriteError::Returned { code, text },
            Appended::Nacked => JournalWriteError::Nacked,
            Appended::Failed(e) => JournalWriteError::Broker(e),
            Appended::TimedOut => JournalWriteError::Timeout,
        };
        // A fresh channel (and declaration) for the next try.
        if let Some(channel) = self.channel.take() {
            let telemetry = self.connector.telemetry();
            close_channel(&channel, "journal write failed", telemetry).await;
        }
        Err(failed)
    }

    /// Closes the channel, if open.
    pub async fn close(&mut self) {
        if let Some(channel) = self.channel.take() {
            let telemetry = self.connector.telemetry();
            close_channel(&channel, "journal stopping", telemetry).await;
        }
        self.connector.close().await;
    }
}
