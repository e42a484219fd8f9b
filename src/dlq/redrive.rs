//! `dlq redrive`: puts dead letters back on the inbound queue.
//!
//! Each selected dead letter is published to the inbound queue (default
//! exchange, `mandatory`, on a confirm channel) without the forwarder's
//! annotations and the broker's dead-letter headers, with
//! `x-switchyard-only` naming the branches it failed on, if the
//! forwarder's own record says so, so the branches it already reached get
//! no duplicate; a dead letter without that record (nack mode, or a
//! producer's annotations) goes to every branch. It is published as the
//! redriving user and marked `x-switchyard-redriven`, which the forwarder
//! trusts. One that every branch
//! already holds (the forwarder recorded it delivered everywhere: a
//! session's message, dead-lettered with its set) is removed without a
//! copy. Its dead-letter copy is
//! acked only after that publish is confirmed, one message at a time. A
//! message the broker refuses for itself stays in the dead-letter queue and
//! the others carry on; anything else (the inbound queue is missing or
//! full, the connection is lost, no confirm) stops the run with what it did.

use super::error::{DlqError, Redriven, Stop};
use super::record::{Missing, Record, redrive_properties};
use super::scan::{Scan, Selection, open, queue_side};
use crate::broker::{DlqReader, RepublishError};
use crate::config::Settings;
use crate::envelope::Envelope;
use crate::journal::{BranchEntry, Entry, Journal, Said, Source};
use crate::telemetry::Telemetry;
use crate::wire::{Trace, Trust};
use indicatif::{ProgressBar, ProgressStyle};
use std::future::Future;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_util::task::TaskTracker;

/// Below this many messages in the queue no progress bar is drawn.
const PROGRESS_FROM: u32 = 50;
/// How long the journal gets, once the run ends, to write its records.
const JOURNAL_BOUND: Duration = Duration::from_secs(5);

/// Redrives the dead letters `selection` takes, in queue order; stops
/// (an error saying what was done) when `interrupt` completes, checked
/// between messages. With `dry_run`, only
/// prints to `out` what it would do. `progress` draws a bar on stderr.
pub async fn redrive(
    settings: &Settings,
    selection: &Selection,
    dry_run: bool,
    progress: bool,
    out: &mut (dyn Write + Send),
    interrupt: impl Future<Output = ()>,
) -> Result<Redriven, DlqError> {
    let (mut reader, queued) = open(settings).await?;
    let (inbound, dead_letter) = queue_side(settings)?;
    let inbound_broker = inbound.broker.as_str();
    let inbound = inbound.queue.as_str();
    let bar = progress_bar(progress, queued);
    let mut scan = Scan::new(settings, selection, queued);
    // Each message put back leaves a record (`redriven`) in the journal.
    let journal = match dry_run {
        true => Journal::default(),
        false => Journal::new(
            settings.journal.as_ref(),
            &settings.name,
            0,
            &Telemetry::new(),
        ),
    };
    let background = TaskTracker::new();
    journal.start(&background);
    let mut pass = Pass {
        journal: journal.clone(),
        inbound,
        // The redriving user, which the copies carry as `user_id`.
        user: settings.brokers.get(inbound_broker).and_then(|b| b.user()),
        dry_run,
        done: Redriven {
            from: dead_letter.queue.clone().unwrap_or_default(),
            to: inbound.to_owned(),
            counts: scan.counts,
            redriven: 0,
            refused: 0,
            held: 0,
            dry_run,
        },
    };
    let mut interrupt = std::pin::pin!(interrupt);
    let outcome: Result<(), Stop> = loop {
        let next = tokio::select! {
            biased;
            () = &mut interrupt => break Err(Stop::Interrupted),
            next = scan.next(&mut reader) => next,
        };
        let (message, record) = match next {
            Ok(Some(found)) => found,
            Ok(None) => break scan.hold_rest(&mut reader).await.map_err(Stop::Read),
            Err(e) => break Err(e.into()),
        };
        bar.set_position(scan.counts.seen);
        if let Err(stop) = pass
            .one(&mut reader, out, &scan.trust, &message, &record)
            .await
        {
            break Err(stop);
        }
        bar.set_message(format!("{} redriven", pass.done.redriven));
    };
    bar.finish_and_clear();
    journal.close(JOURNAL_BOUND).await;
    background.close();
    let mut done = pass.done;
    done.counts = scan.counts;
    let finished = reader.finish().await;
    match (outcome, finished) {
        (Err(why), _) => Err(DlqError::Stopped {
            why: Box::new(why),
            done: Box::new(done),
        }),
        (Ok(()), Err(e)) => Err(DlqError::Stopped {
            why: Box::new(Stop::Read(e)),
            done: Box::new(done),
        }),
        (Ok(()), Ok(())) => {
            out.flush()?;
            Ok(done)
        }
    }
}

/// A bar on stderr while a run of at least [`PROGRESS_FROM`] messages
/// goes on; hidden otherwise.
fn progress_bar(progress: bool, queued: u32) -> ProgressBar {
    if !progress || queued < PROGRESS_FROM {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(u64::from(queued));
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} read, {msg}") {
        bar.set_style(style);
    }
    bar
}

/// One run's settings and what it did so far.
struct Pass<'a> {
    journal: Journal,
    inbound: &'a str,
    user: Option<String>,
    dry_run: bool,
    done: Redriven,
}

impl Pass<'_> {
    /// Redrives one selected dead letter (or removes it, when every branch
    /// holds it; or says what it would do, in a dry run); `Err` stops the
    /// run.
    async fn one(
        &mut self,
        reader: &mut DlqReader,
        out: &mut (dyn Write + Send),
        trust: &Trust,
        message: &Envelope,
        record: &Record,
    ) -> Result<(), Stop> {
        let id = record.message_id.as_deref().unwrap_or("-");
        let only = match record.missing() {
            Missing::Every => Vec::new(),
            Missing::Only(branches) => branches,
            Missing::Nothing => return self.remove(reader, out, message, id).await,
        };
        if self.dry_run {
            let to = if only.is_empty() && !record.annotated {
                "every branch (no record of the forwarder's on it)".to_owned()
            } else if only.is_empty() {
                "every branch".to_owned()
            } else {
                format!("only {}", only.join(", "))
            };
            let reason = record.reason.as_deref().unwrap_or("-");
            let inbound = self.inbound;
            return writeln!(out, "would redrive {id} ({reason}) to {inbound}: {to}")
                .map_err(Stop::Output);
        }
        let properties = redrive_properties(message, &only, self.user.as_deref(), trust);
        // The redrive's moment is the publish: the forwarder may take the
        // copy, and record its forward, before the confirm and the ack here.
        let at = SystemTime::now();
        match reader
            .republish(self.inbound, properties, &message.body)
            .await
        {
            Ok(()) => {}
            Err(RepublishError::Refused(why)) => {
                self.done.refused += 1;
                let _ = writeln!(out, "left {id} in place: refused by the broker: {why}");
                return Ok(());
            }
            Err(error @ RepublishError::Returned { .. }) => {
                return Err(Stop::Returned {
                    id: id.to_owned(),
                    inbound: self.inbound.to_owned(),
                    error,
                });
            }
            Err(error) => {
                return Err(Stop::NotConfirmed {
                    id: id.to_owned(),
                    error,
                });
            }
        }
        if let Err(error) = reader.ack(message.delivery_tag).await {
            return Err(Stop::InBoth {
                id: id.to_owned(),
                inbound: self.inbound.to_owned(),
                error,
            });
        }
        self.done.redriven += 1;
        self.journal.settled(redriven(message, record, &only, at));
        Ok(())
    }

    /// Removes a dead letter every branch already holds.
    async fn remove(
        &mut self,
        reader: &mut DlqReader,
        out: &mut (dyn Write + Send),
        message: &Envelope,
        id: &str,
    ) -> Result<(), Stop> {
        let line = if self.dry_run {
            format!("would remove {id}: every branch already holds it")
        } else if let Err(e) = reader.ack(message.delivery_tag).await {
            return Err(Stop::NotRemoved {
                id: id.to_owned(),
                error: e,
            });
        } else {
            self.done.held += 1;
            format!("removed {id}: every branch already holds it")
        };
        writeln!(out, "{line}").map_err(Stop::Output)
    }
}

/// The journal's entry of a dead letter put back on the inbound queue for
/// the branches `only` names (every branch when empty), `at` the moment
/// it was republished.
fn redriven(message: &Envelope, record: &Record, only: &[String], at: SystemTime) -> Entry {
    Entry {
        message_id: record.message_id.clone(),
        content: record.message_id.is_none().then(|| message.content_uuid()),
        source: Source::Redrive,
        session: None,
        redelivered: false,
        trace: Trace::from_headers(message.headers()),
        received_at: at,
        settled_at: at,
        said: Said::Redriven,
        branches: only
            .iter()
            .map(|branch| BranchEntry {
                branch: Arc::from(branch.as_str()),
                result: "redriven",
                attempts: Vec::new(),
            })
            .collect(),
    }
}
