//! The journal's writer: takes entries from the buffer as they come,
//! turns each into one JSON line, and publishes them in batches (what has
//! gathered while the last batch waited for its confirm, up to
//! [`MAX_BATCH`] records or [`MAX_BATCH_BYTES`]). A batch that fails is
//! kept and tried again with a backoff while new entries wait in the
//! bounded buffer; at shutdown, what is still unwritten after the bound is
//! counted as dropped.

use super::entry::Entry;
use super::record::write_line;
use crate::backoff::Backoff;
use crate::broker::{Connector, JournalChannel, JournalWriteError};
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
/// How long a batch waits for more records once its first has come: a
/// record reaches the stream at most this much later.
const LINGER: Duration = Duration::from_millis(20);
/// How long the writer waits idle before it checks that it could write
/// (so that `writable`, and a `hold`, follow the broker even when no
/// record comes).
const IDLE_CHECK: Duration = Duration::from_secs(1);

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
                () = tokio::time::sleep(IDLE_CHECK) => {
                    let ready = channel.ready().await.map(|_| ());
                    self.reached(ready, &mut announced);
                    continue;
                }
            };
            let Some(first) = first else { break };
            body.clear();
            let mut records = 0;
            self.append(&mut body, &first);
            records += 1;
            // What comes within `LINGER` joins the batch: fewer, larger
            // stream messages cost the broker less per record.
            let linger = tokio::time::Instant::now() + LINGER;
            while records < MAX_BATCH && body.len() < MAX_BATCH_BYTES {
                let entry = match self.entries.try_recv() {
                    Ok(entry) => entry,
                    Err(_) if self.stop.is_cancelled() => break,
                    Err(_) => match tokio::time::timeout_at(linger, self.entries.recv()).await {
                        Ok(Some(entry)) => entry,
                        Ok(None) | Err(_) => break,
                    },
                };
                self.append(&mut body, &entry);
                records += 1;
            }
            loop {
                let written = channel.write(&body, records).await;
                let ok = written.is_ok();
                self.reached(written, &mut announced);
                if ok {
                    self.telemetry.journal_written(records as u64);
                    backoff.reset();
                    break;
                }
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
        self.finish(&mut channel).await;
    }

    /// Tells whether the stream could be reached (a write or an idle
    /// check): `writable` follows, and a change is logged once.
    fn reached(&self, result: Result<(), JournalWriteError>, announced: &mut bool) {
        let (stream, broker) = (&self.settings.stream, &self.settings.broker.name);
        let was_writable = *self.writable.borrow();
        match result {
            Ok(()) => {
                if !*announced || !was_writable {
                    *announced = true;
                    self.telemetry.journal_ready(stream, broker);
                }
                self.writable.send_replace(true);
            }
            Err(why) => {
                let hold = self.settings.on_unavailable == config::OnUnavailable::Hold;
                // Once per outage: the first failure after the journal could write.
                if was_writable {
                    self.telemetry
                        .journal_unavailable(stream, broker, &why, hold);
                }
                self.writable.send_replace(false);
            }
        }
    }

    async fn finish(&mut self, channel: &mut JournalChannel) {
        channel.close().await;
        self.stopped.cancel();
    }

    /// One JSON line for `entry`, written straight from it.
    fn append(&self, body: &mut Vec<u8>, entry: &Entry) {
        write_line(body, entry, &self.instance);
        body.push(b'\n');
    }
}
