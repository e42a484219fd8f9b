//! `dlq inspect`: lists dead letters, as a table for people or as one
//! JSON object per line for scripts, and hands every message back to the
//! queue in its original order.

use super::error::{Counts, DlqError};
use super::record::{PREVIEW_BYTES, Record};
use super::scan::{Scan, Selection, format_age, open};

/// Dead letters `inspect` lists when `--limit` is not given.
pub const DEFAULT_INSPECT_LIMIT: u64 = 100;
use crate::config::Settings;
use std::fmt;
use std::io::Write;

/// How `inspect` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns, details on indented lines.
    Table,
    /// One JSON object per line (see `Record::to_json` for the keys).
    Json,
}

/// What `inspect` went through; its `Display` is the closing line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspected {
    /// The queue read.
    pub queue: String,
    /// How many dead letters were listed and how many messages were read.
    pub counts: Counts,
    /// The limit that applied.
    pub limit: u64,
}

impl fmt::Display for Inspected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        write!(
            f,
            "{} dead letter(s) listed from {} ({} message(s) in the queue); nothing was removed or reordered",
            c.selected, self.queue, c.queued
        )?;
        if c.selected == self.limit && c.seen < u64::from(c.queued) {
            write!(f, "; stopped at --limit {}", self.limit)?;
        }
        Ok(())
    }
}

/// Lists the dead letters `selection` takes (at most
/// [`DEFAULT_INSPECT_LIMIT`] without `--limit`) to `out`, in queue order,
/// without removing or reordering any.
pub async fn inspect(
    settings: &Settings,
    selection: &Selection,
    format: Format,
    out: &mut (dyn Write + Send),
) -> Result<Inspected, DlqError> {
    let limit = selection.limit.unwrap_or(DEFAULT_INSPECT_LIMIT);
    let selection = Selection {
        limit: Some(limit),
        ..selection.clone()
    };
    let (mut reader, queued) = open(settings).await?;
    let mut scan = Scan::new(settings, &selection, queued);
    let mut records = Vec::new();
    let scanned: Result<(), DlqError> = loop {
        match scan.next(&mut reader).await {
            Ok(Some((_, record))) => {
                if format == Format::Json {
                    if let Err(e) = writeln!(out, "{}", record.to_json(scan.now_ms)) {
                        break Err(e.into());
                    }
                } else {
                    records.push(record);
                }
            }
            Ok(None) => break scan.hold_rest(&mut reader).await.map_err(DlqError::from),
            Err(e) => break Err(e.into()),
        }
    };
    let finished = reader.finish().await;
    scanned?;
    finished?;
    if format == Format::Table {
        out.write_all(table(&records, scan.now_ms).as_bytes())?;
    }
    out.flush()?;
    Ok(Inspected {
        queue: settings
            .dead_letter()
            .as_ref()
            .and_then(|d| d.queue.clone())
            .unwrap_or_default(),
        counts: scan.counts,
        limit,
    })
}

const HEADINGS: [&str; 7] = [
    "AGE",
    "MESSAGE_ID",
    "REASON",
    "SOURCE",
    "FAILED",
    "DELIVERED",
    "BODY",
];

/// The table: one row per dead letter, then indented lines with each failed
/// branch's endpoint and error, or the `x-death` entries and a note for a
/// dead letter only the broker annotated.
fn table(records: &[Record], now_ms: i64) -> String {
    let dash = |v: Option<&str>| v.filter(|s| !s.is_empty()).unwrap_or("-").to_owned();
    let rows: Vec<([String; 7], Vec<String>)> = records
        .iter()
        .map(|r| {
            let body = if r.body_bytes > PREVIEW_BYTES {
                format!("{}... ({} bytes)", r.body_preview, r.body_bytes)
            } else {
                dash(Some(&r.body_preview))
            };
            let cells = [
                r.age_ms(now_ms).map_or_else(|| "-".to_owned(), format_age),
                dash(r.message_id.as_deref()).replace(char::is_control, "."),
                dash(r.reason.as_deref()),
                dash(r.source_queue.as_deref()),
                dash(Some(&r.failed_branches().join(","))),
                dash(Some(&r.delivered.join(","))),
                body,
            ];
            (cells, details(r, now_ms))
        })
        .collect();
    let mut widths = HEADINGS.map(str::len);
    for (cells, _) in &rows {
        for (w, cell) in widths.iter_mut().zip(cells) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    push_row(&mut out, &HEADINGS.map(str::to_owned), &widths);
    for (cells, details) in rows {
        push_row(&mut out, &cells, &widths);
        for detail in details {
            out.push_str("    ");
            out.push_str(&detail);
            out.push('\n');
        }
    }
    out
}

/// One row, each cell padded to its column's width but the last.
fn push_row(out: &mut String, cells: &[String; 7], widths: &[usize; 7]) {
    for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
        if i + 1 == cells.len() {
            out.push_str(cell);
        } else {
            out.push_str(&format!("{cell:<w$}  "));
        }
    }
    out.push('\n');
}

/// The indented lines under a row.
fn details(r: &Record, now_ms: i64) -> Vec<String> {
    let mut lines: Vec<String> = r
        .failed
        .iter()
        .map(|f| {
            let endpoint = f
                .endpoint
                .as_deref()
                .map_or_else(String::new, |e| format!(" (last endpoint {e})"));
            let error = f.error.as_deref().unwrap_or("no error recorded");
            format!("failed {}{endpoint}: {error}", f.branch)
        })
        .collect();
    if r.failed.is_empty()
        && let Some(error) = &r.error
    {
        lines.push(format!("error: {error}"));
    }
    for d in &r.deaths {
        let when = d
            .time
            .map(|t| format!(", {} ago", format_age(now_ms - t.saturating_mul(1000))))
            .unwrap_or_default();
        lines.push(format!(
            "x-death: {} x{} from {}{when}",
            d.reason.as_deref().unwrap_or("?"),
            d.count.unwrap_or(1),
            d.queue.as_deref().unwrap_or("?"),
        ));
    }
    if let Some(trace_id) = &r.trace_id {
        lines.push(format!("trace: {trace_id}"));
    }
    if !r.producer_annotations.is_empty() {
        lines.push(format!(
            "not the forwarder's (a producer's headers, ignored): {}",
            r.producer_annotations.join(", ")
        ));
    }
    if let Some(note) = r.note() {
        lines.push(format!("note: {note}"));
    }
    lines
        .into_iter()
        .map(|l| l.replace(char::is_control, "."))
        .collect()
}
