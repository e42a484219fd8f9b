//! `dlq redrive`: puts dead letters back on the inbound queue.
//!
//! Each selected dead letter is published to the inbound queue (default
//! exchange, `mandatory`, on a confirm channel) without the forwarder's
//! annotations and the broker's dead-letter headers, with
//! `x-switchyard-only` naming the branches it failed on, if any, so the
//! branches it already reached get no duplicate. One that every branch
//! already holds (the forwarder recorded it delivered everywhere: a
//! session's message, dead-lettered with its set) is removed without a
//! copy. Its dead-letter copy is
//! acked only after that publish is confirmed, one message at a time. A
//! message the broker refuses for itself stays in the dead-letter queue and
//! the others carry on; anything else (the inbound queue is missing or
//! full, the connection is lost, no confirm) stops the run with what it did.

use super::record::{Missing, redrive_properties};
use super::{Counts, DlqError, Scan, Selection, open};
use crate::broker::RepublishError;
use crate::config::Settings;
use indicatif::{ProgressBar, ProgressStyle};
use std::fmt;
use std::future::Future;
use std::io::Write;

/// Below this many messages in the queue no progress bar is drawn.
const PROGRESS_FROM: u32 = 50;

/// What a redrive did; its `Display` is the summary line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redriven {
    /// The dead-letter queue.
    pub from: String,
    /// The inbound queue.
    pub to: String,
    /// What the scan went through.
    pub counts: Counts,
    /// Dead letters confirmed on the inbound queue and removed.
    pub redriven: u64,
    /// Dead letters the broker refused to take back as they are; left in place.
    pub refused: u64,
    /// Dead letters every branch already held, removed without a copy.
    pub held: u64,
    /// Nothing was published or removed.
    pub dry_run: bool,
}

impl fmt::Display for Redriven {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        if self.dry_run {
            write!(
                f,
                "dry run: {} of {} dead letter(s) in {} would be redriven to {}; nothing was changed",
                c.selected, c.queued, self.from, self.to
            )?;
        } else {
            write!(
                f,
                "{} of {} dead letter(s) redriven from {} to {}",
                self.redriven, c.queued, self.from, self.to
            )?;
            if self.held > 0 {
                write!(f, "; {} already held by every branch, removed", self.held)?;
            }
            if self.refused > 0 {
                write!(
                    f,
                    "; {} refused by the broker, left in {}",
                    self.refused, self.from
                )?;
            }
        }
        Ok(())
    }
}

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
    let inbound = settings.inbound.queue.as_str();
    let bar = if progress && queued >= PROGRESS_FROM {
        let bar = ProgressBar::new(u64::from(queued));
        if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} read, {msg}") {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut scan = Scan::new(settings, selection, queued);
    let mut done = Redriven {
        from: settings.dead_letter.queue.clone().unwrap_or_default(),
        to: inbound.to_owned(),
        counts: scan.counts,
        redriven: 0,
        refused: 0,
        held: 0,
        dry_run,
    };
    let mut interrupt = std::pin::pin!(interrupt);
    let outcome: Result<(), String> = loop {
        let next = tokio::select! {
            biased;
            () = &mut interrupt => break Err("interrupted (SIGINT)".to_owned()),
            next = scan.next(&mut reader) => next,
        };
        let (message, record) = match next {
            Ok(Some(found)) => found,
            Ok(None) => break scan.hold_rest(&mut reader).await.map_err(|e| e.to_string()),
            Err(e) => break Err(e.to_string()),
        };
        bar.set_position(scan.counts.seen);
        let id = record.message_id.as_deref().unwrap_or("-");
        let only = match record.missing() {
            Missing::Every => Vec::new(),
            Missing::Only(branches) => branches,
            Missing::Nothing => {
                let line = if dry_run {
                    format!("would remove {id}: every branch already holds it")
                } else if let Err(e) = reader.ack(message.delivery_tag).await {
                    break Err(format!("{id} could not be removed: {e}"));
                } else {
                    done.held += 1;
                    format!("removed {id}: every branch already holds it")
                };
                if let Err(e) = writeln!(out, "{line}") {
                    break Err(e.to_string());
                }
                continue;
            }
        };
        if dry_run {
            let to = if only.is_empty() {
                "every branch".to_owned()
            } else {
                format!("only {}", only.join(", "))
            };
            let reason = record.reason.as_deref().unwrap_or("-");
            if let Err(e) = writeln!(out, "would redrive {id} ({reason}) to {inbound}: {to}") {
                break Err(e.to_string());
            }
            continue;
        }
        let properties = redrive_properties(&message, &only);
        match reader.republish(inbound, properties, &message.body).await {
            Ok(()) => {}
            Err(RepublishError::Refused(why)) => {
                done.refused += 1;
                let _ = writeln!(out, "left {id} in place: refused by the broker: {why}");
                continue;
            }
            Err(RepublishError::Returned { code, text }) => {
                break Err(format!(
                    "the broker returned the copy of {id} ({code} {text}): does inbound.queue \"{inbound}\" exist?"
                ));
            }
            Err(e) => break Err(format!("the copy of {id} was not confirmed: {e}")),
        }
        if let Err(e) = reader.ack(message.delivery_tag).await {
            break Err(format!(
                "{id} reached {inbound} but stays in the dead-letter queue too: {e}"
            ));
        }
        done.redriven += 1;
        bar.set_message(format!("{} redriven", done.redriven));
    };
    bar.finish_and_clear();
    done.counts = scan.counts;
    let finished = reader.finish().await;
    match (outcome, finished) {
        (Err(why), _) => Err(DlqError::Stopped {
            why,
            done: Box::new(done),
        }),
        (Ok(()), Err(e)) => Err(DlqError::Stopped {
            why: e.to_string(),
            done: Box::new(done),
        }),
        (Ok(()), Ok(())) => {
            out.flush()?;
            Ok(done)
        }
    }
}
