//! The journal's writer: takes entries from the buffer as they come,
//! turns each into one JSON line, and publishes them in batches (what has
//! gathered while the last batch waited for its confirm, up to
//! [`MAX_BATCH`] records or [`MAX_BATCH_BYTES`]). A batch that fails is
//! kept and tried again with a backoff while new entries wait in the
//! bounded buffer; at shutdown, what is still unwritten after the bound is
//! counted as dropped.

use super::entry::Entry;
use super::record::Record;
use crate::backoff::Backoff;
use crate::broker::{Connector, JournalChannel};
use crate::config;
use crate::telemetry::Telemetry;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Most records in one stream message.
pub const MAX_BATCH: usize = 500;
/// A batch stops growing past this many bytes.
const MAX_BATCH_BYTES: usize = 512 * 1024;

/// The writer's end of the journal.
pub(super) struct Writer {
    pub(super) settings: config::Journal,
    pub(super) instance: String,
    pub(super) entries: mpsc::Receiver<Entry>,
    pub(super) writable: watch::Sender<bool>,
    /// Cancelled at shutdown: write what is buffered, then stop.
    pub(super) stop: CancellationToken,
    /// Cancelled by the writer once it has stopped.
    pub(super) stopped: CancellationToken,
    pub(super) telemetry: Telemetry,
}

impl Writer {
    pub(super) async fn run(mut self, connector: Arc<Connector>) {
        let mut channel = JournalChannel::new(connector, self.settings.clone());
        let mut body = Vec::with_capacity(64 * 1024);
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let mut announced = false;
        loop {
            let first = tokio::select! {
                biased;
                entry = self.entries.recv() => entry,
                () = self.stop.cancelled() => {
                    // Whatever arrives from here on is not waited for.
                    self.entries.close();
                    self.entries.recv().await
                }
            };
            let Some(first) = first else { break };
            body.clear();
            let mut records = 0;
            self.append(&mut body, &first);
            records += 1;
            while records < MAX_BATCH && body.len() < MAX_BATCH_BYTES {
                match self.entries.try_recv() {
                    Ok(entry) => {
                        self.append(&mut body, &entry);
                        records += 1;
                    }
                    Err(_) => break,
                }
            }
            loop {
                match channel.write(&body, records).await {
                    Ok(()) => {
                        self.telemetry.journal_written(records as u64);
                        if !announced || backoff.failures() > 0 {
                            announced = true;
                            self.telemetry
                                .journal_ready(&self.settings.stream, &self.settings.broker.name);
                        }
                        self.writable.send_replace(true);
                        backoff.reset();
                        break;
                    }
                    Err(why) => {
                        let hold = self.settings.on_unavailable == config::OnUnavailable::Hold;
                        self.telemetry.journal_unavailable(
                            &self.settings.stream,
                            &self.settings.broker.name,
                            &why,
                            hold,
                        );
                        self.writable.send_replace(false);
                        if self.stop.is_cancelled() {
                            let left = records + self.entries.len();
                            self.telemetry.journal_dropped(
                                left as u64,
                                "the forwarder stopped before the journal could write them",
                            );
                            self.finish(&mut channel).await;
                            return;
                        }
                        let delay = backoff.next_delay();
                        tokio::select! {
                            () = tokio::time::sleep(delay) => {}
                            () = self.stop.cancelled() => {}
                        }
                    }
                }
            }
        }
        self.finish(&mut channel).await;
    }

    async fn finish(&mut self, channel: &mut JournalChannel) {
        channel.close().await;
        self.stopped.cancel();
    }

    /// One JSON line for `entry`.
    fn append(&self, body: &mut Vec<u8>, entry: &Entry) {
        let record = Record::of(entry, &self.instance);
        // Serializing plain strings and numbers into a Vec cannot fail.
        if serde_json::to_writer(&mut *body, &record).is_ok() {
            body.push(b'\n');
        }
    }
}
