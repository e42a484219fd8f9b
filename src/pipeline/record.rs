//! Record: every settled message, whichever way it came and however it
//! ended, is told once to the [`Recorder`] (the journal and span export),
//! as an [`Entry`] made of what its transaction already holds (the
//! verdict, each branch's outcome and the steps its walk recorded).
//! Nothing here waits: each takes the entry or counts it dropped.

use super::outcome::{BranchOutcome, Outcome, Verdict};
use crate::amqp::short_text;
use crate::config::Settings;
use crate::envelope::Envelope;
use crate::errors::one_line_text;
use crate::journal::{BranchEntry, Entry, Journal, Said, Source, Tried};
use crate::telemetry::Telemetry;
use crate::traces::Spans;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_util::task::TaskTracker;

/// Where settled messages are told: the journal and span export, either
/// or both off. Cheap to clone.
#[derive(Clone, Default)]
pub struct Recorder {
    journal: Journal,
    spans: Spans,
}

impl Recorder {
    /// The journal and span export `settings` ask for, as instance `name`.
    pub(crate) fn new(settings: &Settings, telemetry: &Telemetry) -> Self {
        Self {
            journal: Journal::new(
                settings.journal.as_ref(),
                &settings.name,
                in_flight(settings),
                telemetry,
            ),
            spans: Spans::new(settings.otlp.as_ref(), &settings.name, telemetry),
        }
    }

    /// Starts the journal's writer and the span exporter on `background`.
    pub(crate) fn start(&self, background: &TaskTracker) {
        self.journal.start(background);
        self.spans.start(background);
    }

    /// Whether anything is recorded at all (worth building an entry).
    pub(crate) fn wanted(&self) -> bool {
        self.journal.on() || self.spans.on()
    }

    /// Records one settled message; never waits.
    pub(crate) fn settled(&self, entry: Entry) {
        self.spans.export(&entry);
        self.journal.settled(entry);
    }

    /// With `journal.on_unavailable = "hold"`: whether new work must wait.
    pub(crate) fn holding(&self) -> bool {
        self.journal.holding()
    }

    /// Returns once new work may be taken ([`Self::holding`] is false).
    pub(crate) async fn until_taking(&self) {
        self.journal.until_taking().await;
    }

    /// Writes and exports what is queued, within `bound` each, at once.
    pub(crate) async fn close(&self, bound: Duration) {
        tokio::join!(self.journal.close(bound), self.spans.close(bound));
    }
}

/// The most messages taken and not yet settled at once: the inbound
/// queue's prefetch and the HTTP ingress's requests in flight.
fn in_flight(settings: &Settings) -> usize {
    let queue = settings.inbound().map_or(0, |i| usize::from(i.prefetch));
    let http = settings
        .http
        .as_ref()
        .map_or(0, |h| h.max_in_flight as usize);
    queue + http
}

/// The branches of `outcome` as the journal records them, taking the
/// steps each walk recorded (the outcome keeps its branches, for the
/// verdict).
pub(crate) fn branches(outcome: &mut Outcome) -> Vec<BranchEntry> {
    let mut trails = std::mem::take(&mut outcome.trails).into_iter();
    outcome
        .branches
        .iter()
        .map(|branch| BranchEntry {
            branch: name(branch).clone(),
            result: result(branch),
            attempts: trails.next().unwrap_or_default(),
        })
        .collect()
}

/// A branch confirmed by an earlier try of the same request (an HTTP
/// retry): nothing was sent on it this time.
pub(crate) fn earlier(branch: &str) -> BranchEntry {
    BranchEntry {
        branch: branch.into(),
        result: "earlier",
        attempts: Vec::new(),
    }
}

/// A session's branch as one of its messages saw it: the steps for that
/// message (its place `index` in the set), replays included.
pub(crate) fn for_message(
    branch: &Arc<str>,
    result: &'static str,
    trail: &[Tried],
    index: usize,
) -> BranchEntry {
    BranchEntry {
        branch: branch.clone(),
        result,
        attempts: trail
            .iter()
            .filter(|step| step.index as usize == index)
            .cloned()
            .collect(),
    }
}

/// What `verdict` says of a message whose inbound channel is `lost` or
/// not: nothing can be settled on a lost channel, so the broker delivers
/// the message again whatever the verdict.
pub(crate) fn said_on(verdict: &Verdict, lost: bool) -> Said {
    if lost {
        return Said::Requeued;
    }
    said(verdict)
}

/// What `verdict` says of the message.
pub(crate) fn said(verdict: &Verdict) -> Said {
    match verdict {
        Verdict::Commit => Said::Acked,
        Verdict::Abandon => Said::Requeued,
        Verdict::DeadLetter { cause, .. } => Said::DeadLettered {
            reason: cause.reason().as_str(),
            error: one_line_text(&cause.to_string()),
        },
    }
}

/// The entry of `envelope`, received at `received_at` from `source`,
/// settled now.
pub(crate) fn entry(
    envelope: &Envelope,
    source: Source,
    received_at: SystemTime,
    said: Said,
    branches: Vec<BranchEntry>,
) -> Entry {
    let message_id = envelope
        .properties
        .message_id()
        .as_ref()
        .map(|id| short_text(id).into_owned());
    Entry {
        content: message_id.is_none().then(|| envelope.content_uuid()),
        message_id,
        source,
        session: None,
        redelivered: envelope.redelivered,
        trace: envelope.annotations.trace.clone(),
        received_at,
        settled_at: SystemTime::now(),
        said,
        branches,
    }
}

/// The record's word for how a branch ended.
fn result(branch: &BranchOutcome) -> &'static str {
    match branch {
        BranchOutcome::Delivered { .. } => "delivered",
        BranchOutcome::Failed { .. } => "failed",
        BranchOutcome::Outage { .. } => "outage",
        BranchOutcome::Rejected { .. } => "rejected",
        BranchOutcome::Abandoned { .. } => "abandoned",
    }
}

fn name(branch: &BranchOutcome) -> &Arc<str> {
    match branch {
        BranchOutcome::Delivered { branch, .. }
        | BranchOutcome::Failed { branch, .. }
        | BranchOutcome::Outage { branch, .. }
        | BranchOutcome::Rejected { branch, .. }
        | BranchOutcome::Abandoned { branch } => branch,
    }
}

/// Where a consumed message came from: the queue, or `dlq redrive` (which
/// marks what it puts back).
pub(crate) fn source_of(envelope: &Envelope) -> Source {
    if envelope.annotations.redriven {
        Source::Redrive
    } else {
        Source::Queue
    }
}
