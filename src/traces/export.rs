//! The exporter's task: takes settled entries from the bounded queue,
//! turns them into spans ([`super::span`]) and sends them in batches (up to
//! [`MAX_BATCH`] spans, or what has come [`LINGER`] after a batch's first
//! entry) as one `ExportTraceServiceRequest`, protobuf-encoded, to the
//! collector ([`super::collector`]), each POST answered within [`TIMEOUT`].
//!
//! A batch the collector did not take (refused connection, timeout,
//! non-2xx) is dropped and counted, never retried: while a collector is
//! down the queue fills and new entries are dropped at once, so nothing
//! piles up and forwarding never waits. At close, what is queued is sent
//! until the close deadline; what is left then is counted as dropped.

use super::collector::{Accepted, Client, ExportError, Target};
use super::span;
use crate::journal::Entry;
use crate::telemetry::Telemetry;
use hyper::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A batch is sent once it holds this many spans.
pub const MAX_BATCH: usize = 512;
/// ... or this long after its first entry came.
pub const LINGER: Duration = Duration::from_secs(1);
/// The longest a POST may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The exporter's end of the queue.
pub(super) struct Exporter {
    /// Where to send; an endpoint that does not parse (why) drops every batch.
    pub(super) target: Result<Target, String>,
    pub(super) resource: Resource,
    pub(super) entries: mpsc::Receiver<Entry>,
    /// Set once, by `close`: send what is queued until then, then stop.
    pub(super) closing: watch::Receiver<Option<Instant>>,
    /// Cancelled by the exporter once it has stopped.
    pub(super) stopped: CancellationToken,
    pub(super) telemetry: Telemetry,
}

impl Exporter {
    pub(super) async fn run(mut self, background: TaskTracker) {
        let mut client = self.target.clone().and_then(|target| {
            Client::new(target, background).map_err(|e: ExportError| e.to_string())
        });
        let mut deadline: Option<Instant> = None;
        while let Some(batch) = self.gather(&mut deadline).await {
            let until = match deadline {
                Some(d) => d.min(Instant::now() + TIMEOUT),
                None => Instant::now() + TIMEOUT,
            };
            self.send(&mut client, batch, until).await;
            let closed_meanwhile = *self.closing.borrow();
            if let (None, Some(at)) = (deadline, closed_meanwhile) {
                deadline = Some(at);
                self.entries.close();
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
        // Past the close deadline: whatever is still queued is not sent.
        self.entries.close();
        let mut left = 0;
        while let Ok(entry) = self.entries.try_recv() {
            left += span::count(&entry) as u64;
        }
        if left > 0 {
            self.telemetry
                .spans_dropped(left, &"the forwarder stopped before they could be exported");
        }
        self.stopped.cancel();
    }

    /// The next batch: waits for a first entry, then gathers more until
    /// the batch is full or [`LINGER`] has passed (once closing: only
    /// what is already queued). `None` once the queue is closed and empty.
    async fn gather(&mut self, deadline: &mut Option<Instant>) -> Option<Vec<Span>> {
        let first = if deadline.is_some() {
            self.entries.try_recv().ok()?
        } else {
            tokio::select! {
                biased;
                entry = self.entries.recv() => entry?,
                at = closing(&mut self.closing) => {
                    *deadline = Some(at);
                    self.entries.close();
                    self.entries.try_recv().ok()?
                }
            }
        };
        let mut batch = span::spans_of(&first);
        let linger = Instant::now() + LINGER;
        while batch.len() < MAX_BATCH {
            let entry = if deadline.is_some() {
                self.entries.try_recv().ok()
            } else {
                tokio::select! {
                    biased;
                    entry = self.entries.recv() => entry,
                    () = tokio::time::sleep_until(linger) => None,
                    at = closing(&mut self.closing) => {
                        *deadline = Some(at);
                        self.entries.close();
                        continue;
                    }
                }
            };
            match entry {
                Some(entry) => batch.extend(span::spans_of(&entry)),
                None => break,
            }
        }
        Some(batch)
    }

    async fn send(&self, client: &mut Result<Client, String>, spans: Vec<Span>, until: Instant) {
        let n = spans.len() as u64;
        let client = match client {
            Ok(client) => client,
            Err(why) => {
                self.telemetry.spans_dropped(n, why);
                return;
            }
        };
        let request = ExportTraceServiceRequest {
            resource_spans: vec![span::resource_spans(&self.resource, spans)],
        };
        let body = Bytes::from(request.encode_to_vec());
        let mut closing_rx = self.closing.clone();
        let result = tokio::select! {
            result = client.post(body, until) => result,
            // close() came while this POST waited: it has until then.
            () = async {
                let at = closing(&mut closing_rx).await;
                tokio::time::sleep_until(at).await;
            } => Err(ExportError::TimedOut),
        };
        if result.is_err() {
            client.abandon();
        }
        match result {
            Ok(Accepted { rejected, message }) => {
                let rejected = rejected.min(n);
                self.telemetry.spans_exported(n - rejected);
                if rejected > 0 {
                    let why = format!("the collector rejected them: {message}");
                    self.telemetry.spans_dropped(rejected, &why);
                }
            }
            Err(e) => self.telemetry.spans_dropped(n, &e),
        }
    }
}

/// The close deadline, once `close` has set it (never, if every handle
/// is gone without closing: the queue's end says so then).
async fn closing(closing: &mut watch::Receiver<Option<Instant>>) -> Instant {
    let at = closing
        .wait_for(Option::is_some)
        .await
        .map(|at| at.unwrap_or_else(Instant::now));
    match at {
        Ok(at) => at,
        Err(_) => std::future::pending().await,
    }
}
