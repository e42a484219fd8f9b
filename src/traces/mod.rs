//! Span export: with `[telemetry.otlp] endpoint` set, every sampled
//! settled message's forward and each of its publish attempts become
//! spans, exported over OTLP/HTTP (protobuf) by a task of their own through
//! a bounded queue. A full queue or a collector that cannot be reached
//! drops spans, counted (`switchyard_spans_dropped_total`); forwarding
//! never waits for export. Without an endpoint nothing is exported, and
//! copies still carry their `traceparent` (`crate::wire::traceparent`).
//!
//! A message is sampled when its producer's `traceparent` says so, never
//! when it says not, and for a new trace by `sample_ratio` on the trace id
//! ([`sampled`]). The handle ([`Spans`]) only clones the entry into the
//! queue; `span` turns entries into OTLP spans, `export` batches and
//! sends them, `collector` is the HTTP client (`http://`, or `https://`
//! with the system's root certificates).

mod collector;
mod export;
pub mod span;

use crate::config::Otlp;
use crate::journal::Entry;
use crate::telemetry::Telemetry;
use crate::wire::traceparent::sampled_at;
pub use collector::{ExportError, Target};
pub use export::{LINGER, MAX_BATCH, TIMEOUT};

/// A message's place in its trace, as [`Entry::trace`] holds it.
pub use crate::wire::Trace;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Settled entries waiting for the exporter; beyond this, new ones are
/// dropped (their spans counted).
pub const QUEUE: usize = 4096;

/// Where spans go; off unless built with an OTLP endpoint. Cheap to clone.
#[derive(Clone, Default)]
pub struct Spans {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    ratio: f64,
    queue: mpsc::Sender<Entry>,
    /// The exporter, until it starts.
    waiting: Mutex<Option<export::Exporter>>,
    /// Set by `close`: the deadline to export what is queued by.
    closing: watch::Sender<Option<Instant>>,
    /// Cancelled once the exporter has stopped.
    stopped: CancellationToken,
    telemetry: Telemetry,
}

/// Whether spans of a message in `trace` are exported at `ratio`: as its
/// producer sampled it, or, for a new trace, by the trace id.
pub fn sampled(trace: &Trace, ratio: f64) -> bool {
    trace
        .sampled
        .unwrap_or_else(|| sampled_at(trace.trace_id, ratio))
}

impl Spans {
    /// Span export to `otlp` (`None`: off), with `instance` as
    /// `service.instance.id`, reporting to `telemetry`. Nothing is sent
    /// until [`Self::start`].
    pub fn new(otlp: Option<&Otlp>, instance: &str, telemetry: &Telemetry) -> Self {
        let Some(otlp) = otlp else {
            return Self::default();
        };
        let (queue, entries) = mpsc::channel(QUEUE);
        let (closing, closing_rx) = watch::channel(None);
        let stopped = CancellationToken::new();
        let exporter = export::Exporter {
            target: Target::parse(&otlp.endpoint).map_err(|e| e.to_string()),
            resource: span::resource(&otlp.service_name, instance),
            entries,
            closing: closing_rx,
            stopped: stopped.clone(),
            telemetry: telemetry.clone(),
        };
        Self {
            inner: Some(Arc::new(Inner {
                ratio: otlp.sample_ratio,
                queue,
                waiting: Mutex::new(Some(exporter)),
                closing,
                stopped,
                telemetry: telemetry.clone(),
            })),
        }
    }

    /// Whether spans are exported.
    pub fn on(&self) -> bool {
        self.inner.is_some()
    }

    /// Whether a message in `trace` is sampled (false when export is off):
    /// the flag its copies' `traceparent` should carry when export is on.
    pub fn samples(&self, trace: &Trace) -> bool {
        self.inner.as_ref().is_some_and(|i| sampled(trace, i.ratio))
    }

    /// Starts the exporter's task (once) on `background`.
    pub fn start(&self, background: &TaskTracker) {
        let Some(inner) = &self.inner else {
            return;
        };
        let Some(exporter) = inner.waiting.lock().ok().and_then(|mut w| w.take()) else {
            return;
        };
        background.spawn(exporter.run(background.clone()));
    }

    /// Queues the spans of one settled message, if it is sampled; never
    /// waits. A full queue drops them, counted.
    pub fn export(&self, entry: &Entry) {
        let Some(inner) = &self.inner else {
            return;
        };
        if !sampled(&entry.trace, inner.ratio) {
            return;
        }
        // Reserve first: a full queue costs no clone.
        match inner.queue.try_reserve() {
            Ok(permit) => permit.send(entry.clone()),
            Err(full_or_closed) => {
                let why = match full_or_closed {
                    TrySendError::Full(()) => {
                        "the export queue is full: the collector is slow or unreachable"
                    }
                    TrySendError::Closed(()) => "span export has stopped",
                };
                inner
                    .telemetry
                    .spans_dropped(span::count(entry) as u64, &why);
            }
        }
    }

    /// Exports what is queued and stops the exporter, within `bound`;
    /// what is left then is counted as dropped. The exporter is given a
    /// little less than `bound` so that its count is in before this
    /// returns.
    pub async fn close(&self, bound: Duration) {
        let Some(inner) = &self.inner else {
            return;
        };
        if let Some(mut never_started) = inner.waiting.lock().ok().and_then(|mut w| w.take()) {
            never_started.entries.close();
            let mut left = 0;
            while let Ok(entry) = never_started.entries.try_recv() {
                left += span::count(&entry) as u64;
            }
            if left > 0 {
                inner
                    .telemetry
                    .spans_dropped(left, &"span export was never started");
            }
            return;
        }
        let margin = (bound / 10).min(Duration::from_millis(100));
        let started = Instant::now();
        inner.closing.send_modify(|deadline| {
            deadline.get_or_insert(started + (bound - margin));
        });
        let _ = tokio::time::timeout_at(started + bound, inner.stopped.cancelled()).await;
    }
}

#[cfg(test)]
mod tests;
