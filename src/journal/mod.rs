//! The journal: one record per settled message, from the queue or over
//! HTTP, in a RabbitMQ stream that every instance of a group writes and
//! `switchyard trace` reads.
//!
//! The data path hands [`Journal::settled`] an [`Entry`] built of values
//! it already holds and goes on: the entry waits in a bounded buffer for
//! the writer, which turns entries into JSON records (`record`), several
//! per stream message, and publishes them with confirms on a connection of
//! its own (`writer`). Nothing on the data path waits for the journal. A
//! full buffer drops the new entry, counted
//! (`switchyard_journal_dropped_total`) and logged at most every ten
//! seconds. With `on_unavailable = "hold"`, no new work is taken while the
//! journal cannot write or its buffer is half full ([`Journal::holding`]).
//! The pipeline hands the same entry to span export (`crate::traces`), so
//! the journal and the trace tell one story.

mod entry;
pub mod reader;
pub mod record;
mod writer;

pub use entry::{Attempted, BranchEntry, Entry, Said, Source, Tried};
pub use record::Record;

use crate::broker::Connector;
use crate::config::{self, OnUnavailable};
use crate::telemetry::Telemetry;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Where settled messages are recorded. Cheap to clone; a journal that is
/// off records nothing and never holds.
#[derive(Clone, Default)]
pub struct Journal {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    buffer: mpsc::Sender<Entry>,
    /// The buffer's size: `buffer`, plus the work in flight with `hold`.
    room: usize,
    /// `buffer`: with `hold`, no new work is taken past half of it.
    capacity: usize,
    /// The writer's end, until the writer starts.
    waiting: Mutex<Option<writer::Writer>>,
    /// True while the last write was confirmed (or none failed yet).
    writable: watch::Receiver<bool>,
    hold: bool,
    /// Cancelled to make the writer flush and stop.
    stop: CancellationToken,
    /// Cancelled once the writer has stopped.
    stopped: CancellationToken,
    telemetry: Telemetry,
}

impl Journal {
    /// A journal for `settings` (`None`: off), written as `instance`.
    /// With `on_unavailable = "hold"` the buffer has room for `in_flight`
    /// more records than `buffer`: work already taken when the hold begins
    /// is recorded, never dropped. Nothing is connected until
    /// [`Self::start`].
    pub fn new(
        settings: Option<&config::Journal>,
        instance: &str,
        in_flight: usize,
        telemetry: &Telemetry,
    ) -> Self {
        let Some(settings) = settings else {
            return Self { inner: None };
        };
        let hold = settings.on_unavailable == OnUnavailable::Hold;
        let room = if hold {
            settings.buffer.saturating_add(in_flight)
        } else {
            settings.buffer
        };
        let (buffer, entries) = mpsc::channel(room);
        let (writable_tx, writable) = watch::channel(true);
        let stop = CancellationToken::new();
        let stopped = CancellationToken::new();
        let writer = writer::Writer {
            settings: settings.clone(),
            instance: instance.to_owned(),
            entries,
            writable: writable_tx,
            stop: stop.clone(),
            stopped: stopped.clone(),
            telemetry: telemetry.clone(),
        };
        Self {
            inner: Some(Arc::new(Inner {
                buffer,
                room,
                capacity: settings.buffer,
                waiting: Mutex::new(Some(writer)),
                writable,
                hold,
                stop,
                stopped,
                telemetry: telemetry.clone(),
            })),
        }
    }

    /// Starts the writer (once) on a connection of its own, made by a
    /// connector whose background work runs on `background`.
    pub fn start(&self, background: &TaskTracker) {
        let Some(inner) = &self.inner else {
            return;
        };
        let Some(writer) = inner.waiting.lock().ok().and_then(|mut w| w.take()) else {
            return;
        };
        let connector = Connector::new(
            writer.settings.broker.clone(),
            &writer.instance,
            crate::broker::Role::Journal,
            background.clone(),
            writer.telemetry.clone(),
        );
        background.spawn(writer.run(connector));
    }

    /// Records one settled message: never waits.
    pub fn settled(&self, entry: Entry) {
        let Some(inner) = &self.inner else {
            return;
        };
        if inner.buffer.try_send(entry).is_err() {
            let why = if inner.buffer.is_closed() {
                "the journal has stopped"
            } else {
                "its buffer is full while the stream cannot be written fast enough"
            };
            inner.telemetry.journal_dropped(1, why);
        }
    }

    /// Whether the journal is on.
    pub fn on(&self) -> bool {
        self.inner.is_some()
    }

    /// With `on_unavailable = "hold"`: whether new work must wait (the
    /// journal cannot write, or its buffer is half full). Always false
    /// otherwise.
    pub fn holding(&self) -> bool {
        match &self.inner {
            Some(inner) if inner.hold => {
                let used = inner.room - inner.buffer.capacity();
                !*inner.writable.borrow() || used * 2 > inner.capacity
            }
            _ => false,
        }
    }

    /// Returns once [`Self::holding`] is false (at once when it is).
    pub async fn until_taking(&self) {
        let Some(inner) = &self.inner else {
            return;
        };
        while self.holding() {
            let mut writable = inner.writable.clone();
            if !*writable.borrow() {
                let _ = writable.wait_for(|w| *w).await;
            } else {
                // Half full and writable: the writer is catching up.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Writes what the buffer holds and stops the writer, within `bound`;
    /// what is left then is counted as dropped.
    pub async fn close(&self, bound: Duration) {
        if let Some(inner) = &self.inner {
            inner.stop.cancel();
            let _ = tokio::time::timeout(bound, inner.stopped.cancelled()).await;
        }
    }
}
