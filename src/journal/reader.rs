//! `switchyard trace MESSAGE_ID`: every journal record of one message (by
//! its message id or one of its copy ids), from every instance writing the
//! stream, in time order.
//!
//! The contract:
//!
//! - It reads the stream from `--since` (default [`DEFAULT_SINCE`]) back
//!   from when it started, and stops at the stream's end as it was then:
//!   it learns the tail's offset first and stops there
//!   ([`crate::broker::JournalReader::tail`]). When the tail cannot be
//!   learned (an empty stream), it stops at the first batch whose
//!   `timestamp` is after its start, or, as a last resort, once nothing has
//!   come for [`IDLE`]. It never writes to the stream, and its time grows
//!   with the window read, not with the stream's size.
//! - A batch is searched for the id (as JSON writes it) with a substring
//!   search before anything is parsed; only a line that holds the id is
//!   parsed, and one that does not parse as a record is skipped and
//!   counted ([`Traced::skipped`]).
//! - The same line read twice (a batch the writer sent again) is one record.
//! - A batch not published by the group (its `user_id`, which the broker
//!   checks, is not the journal broker's user nor one of
//!   `inbound.trusted_users`) is not the forwarders' history: the lines in
//!   it that hold the id are ignored and counted ([`Traced::ignored`]).
//! - Records are printed oldest first by `settled_at`, then `received_at`:
//!   a timeline ([`timeline`]) or, with `--json`, each line as stored.
//!
//! - `window`: `--since`.
//! - `timeline`: the human form.

mod timeline;
mod window;

pub use window::{DEFAULT_SINCE, Window};

use super::record::Record;
use crate::broker::{Batch, Follower, JournalReadError, JournalReader};
use crate::config::{InvalidKey, Settings};
use memchr::memmem::Finder;
use std::collections::BTreeSet;
use std::fmt;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The last resort stop: nothing more came for this long.
pub const IDLE: Duration = Duration::from_secs(2);
/// Stream messages in flight to the reader (each up to about 512 KiB).
const PREFETCH: u16 = 64;
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// A `trace` command, its values checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The message id or copy id looked for.
    pub id: String,
    /// What is read.
    pub window: Window,
    /// One JSON object per line instead of a timeline.
    pub json: bool,
}

impl Request {
    /// A request from command-line values, at `now` (unix seconds); a bad
    /// `--since` or an empty id is a usage error.
    pub fn new(id: &str, since: Option<&str>, json: bool, now: i64) -> Result<Self, TraceError> {
        if id.is_empty() {
            return Err(TraceError::Usage("MESSAGE_ID must not be empty".to_owned()));
        }
        let since = since.unwrap_or(DEFAULT_SINCE);
        let window = Window::parse(since, now)
            .map_err(|why| TraceError::Usage(format!("--since \"{since}\": {why}")))?;
        Ok(Self {
            id: id.to_owned(),
            window,
            json,
        })
    }
}

/// Why a trace failed (finding nothing is not a failure: see [`Traced`]).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A command-line value is invalid (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The configuration has no journal (exit 2).
    #[error("{0}")]
    Config(InvalidKey),
    /// The stream could not be read (exit 1).
    #[error("cannot read journal stream \"{stream}\" on broker \"{broker}\" ({uri}): {error}")]
    Read {
        /// The stream.
        stream: String,
        /// The broker's name.
        broker: String,
        /// Its URI, password masked.
        uri: String,
        /// Why.
        #[source]
        error: Box<JournalReadError>,
    },
    /// The records could not be written (exit 1).
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
}

impl TraceError {
    /// Exit code 2 (usage or configuration) rather than 1.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Usage(_) | Self::Config(_))
    }
}

/// What a trace found; its `Display` says so in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Traced {
    /// The id looked for.
    pub id: String,
    /// The stream read.
    pub stream: String,
    /// Its broker's name.
    pub broker: String,
    /// What was read.
    pub window: Window,
    /// Records printed.
    pub found: usize,
    /// Lines that held the id but did not parse as a record.
    pub skipped: u64,
    /// Lines that held the id in batches the group did not write.
    pub ignored: u64,
    /// Stream messages read.
    pub batches: u64,
}

impl fmt::Display for Traced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (id, stream, broker, window) = (&self.id, &self.stream, &self.broker, &self.window);
        if self.found == 0 {
            write!(
                f,
                "no record of \"{id}\" in journal stream \"{stream}\" on broker \"{broker}\" {window}"
            )
        } else {
            write!(
                f,
                "{} record(s) of \"{id}\" in journal stream \"{stream}\" on broker \"{broker}\" {window}",
                self.found
            )
        }
    }
}

/// Reads the journal for `request` and writes what it finds to `out`
/// (nothing when it finds nothing); a progress line on stderr when
/// `progress`.
pub async fn trace(
    settings: &Settings,
    request: &Request,
    progress: bool,
    out: &mut (dyn Write + Send),
) -> Result<Traced, TraceError> {
    let journal = settings.journal.as_ref().ok_or_else(|| {
        TraceError::Config(InvalidKey::new(
            "journal.enabled",
            "false: this forwarder keeps no journal, so there is nothing to trace \
             (enable [journal], or point --config at a configuration that has it)",
        ))
    })?;
    let started = now();
    let failed = |error| TraceError::Read {
        stream: journal.stream.clone(),
        broker: journal.broker.name.clone(),
        uri: journal.broker.redacted_uri(),
        error: Box::new(error),
    };
    let reader = JournalReader::open(journal, &settings.name)
        .await
        .map_err(failed)?;
    let mut search = Search::new(&request.id, settings.stream_writers(&journal.broker));
    // A window that starts after now holds nothing yet.
    let read = if request.window.start > started {
        Ok(0)
    } else {
        read(&reader, &request.window, started, &mut search, progress).await
    };
    reader.close().await;
    let batches = read.map_err(failed)?;
    let mut found = search.found;
    found.sort_by_cached_key(|(r, _)| (time_of(&r.settled_at), time_of(&r.received_at)));
    if request.json {
        for (_, line) in &found {
            out.write_all(line)?;
            out.write_all(b"\n")?;
        }
    } else {
        let text = timeline::timeline(found.iter().map(|(r, _)| r));
        out.write_all(text.as_bytes())?;
    }
    out.flush()?;
    Ok(Traced {
        id: request.id.clone(),
        stream: journal.stream.clone(),
        broker: journal.broker.name.clone(),
        window: request.window.clone(),
        found: found.len(),
        skipped: search.skipped,
        ignored: search.ignored,
        batches,
    })
}

/// Reads the window up to the stream's end at `started`; how many batches.
async fn read(
    reader: &JournalReader,
    window: &Window,
    started: i64,
    search: &mut Search,
    progress: bool,
) -> Result<u64, JournalReadError> {
    let tail = reader.tail().await?;
    let mut follower = reader.follow(window.from_secs(), PREFETCH).await?;
    let mut shown = Progress::new(progress);
    let read = follow(&mut follower, tail, started, search, &mut shown).await;
    shown.clear();
    follower.close().await;
    read
}

async fn follow(
    follower: &mut Follower,
    tail: Option<u64>,
    started: i64,
    search: &mut Search,
    shown: &mut Progress,
) -> Result<u64, JournalReadError> {
    let mut batches = 0;
    while let Some(batch) = follower.next(IDLE).await? {
        if past_end(&batch, tail, started) {
            break;
        }
        batches += 1;
        search.batch(&batch.body, batch.writer.as_deref());
        shown.batch(&batch, tail, search.found.len());
        if tail.is_some_and(|tail| batch.offset >= tail) {
            break;
        }
    }
    Ok(batches)
}

/// Whether `batch` was written after the command started: past the tail
/// when it is known, else stamped later than the start.
fn past_end(batch: &Batch, tail: Option<u64>, started: i64) -> bool {
    match tail {
        Some(tail) => batch.offset > tail,
        None => batch
            .timestamp
            .is_some_and(|t| i64::try_from(t).is_ok_and(|t| t > started)),
    }
}

/// The id's search through batches, and what it found.
struct Search {
    id: String,
    /// The id as JSON writes it inside a string.
    finder: Finder<'static>,
    /// Each record found, with its line as stored.
    found: Vec<(Record, Vec<u8>)>,
    /// Lines already found, so that a batch written twice counts once.
    seen: BTreeSet<Vec<u8>>,
    skipped: u64,
    /// Whose batches are the group's (empty: anyone's, the user unknown).
    writers: Vec<String>,
    ignored: u64,
}

impl Search {
    fn new(id: &str, writers: Vec<String>) -> Self {
        let quoted = serde_json::to_string(id).unwrap_or_else(|_| format!("\"{id}\""));
        let escaped = &quoted[1..quoted.len() - 1];
        Self {
            id: id.to_owned(),
            finder: Finder::new(escaped.as_bytes()).into_owned(),
            found: Vec::new(),
            seen: BTreeSet::new(),
            skipped: 0,
            writers,
            ignored: 0,
        }
    }

    /// Parses every line of `body`, a batch `writer` published, that holds
    /// the id, once per line; counts them instead when the batch is not
    /// the group's.
    fn batch(&mut self, body: &[u8], writer: Option<&str>) {
        let ours =
            self.writers.is_empty() || writer.is_some_and(|w| self.writers.iter().any(|u| u == w));
        let mut from = 0;
        while let Some(hit) = self.finder.find(&body[from..]) {
            let at = from + hit;
            let start = memchr::memrchr(b'\n', &body[..at]).map_or(0, |i| i + 1);
            let end = memchr::memchr(b'\n', &body[at..]).map_or(body.len(), |i| at + i);
            if ours {
                self.line(body[start..end].trim_ascii());
            } else {
                self.ignored += 1;
            }
            from = end;
        }
    }

    fn line(&mut self, line: &[u8]) {
        match serde_json::from_slice::<Record>(line) {
            Ok(record) if record.names(&self.id) => {
                if self.seen.insert(line.to_vec()) {
                    self.found.push((record, line.to_vec()));
                }
            }
            // The id inside another one, or in another field.
            Ok(_) => {}
            Err(_) => self.skipped += 1,
        }
    }
}

/// The progress line on stderr, redrawn in place.
struct Progress {
    on: bool,
    drawn: Option<Instant>,
    records: u64,
    first: Option<u64>,
}

impl Progress {
    fn new(on: bool) -> Self {
        Self {
            on,
            drawn: None,
            records: 0,
            first: None,
        }
    }

    fn batch(&mut self, batch: &Batch, tail: Option<u64>, found: usize) {
        if !self.on {
            return;
        }
        self.records += batch.records.unwrap_or(0);
        let first = *self.first.get_or_insert(batch.offset);
        if self.drawn.is_some_and(|at| at.elapsed() < PROGRESS_EVERY) {
            return;
        }
        self.drawn = Some(Instant::now());
        let share = tail
            .filter(|&tail| tail > first)
            .map(|tail| (batch.offset - first) * 100 / (tail - first))
            .map_or_else(String::new, |p| format!("{}% ", p.min(100)));
        let at = batch
            .timestamp
            .and_then(|t| OffsetDateTime::from_unix_timestamp(i64::try_from(t).ok()?).ok())
            .and_then(|t| t.format(&Rfc3339).ok())
            .map_or_else(String::new, |t| format!(", at {t}"));
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "\r\x1b[2Kscanning the journal: {share}{} record(s){at}, {found} found",
            self.records
        );
        let _ = err.flush();
    }

    fn clear(&mut self) {
        if self.on && self.drawn.is_some() {
            let mut err = std::io::stderr();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// An RFC 3339 time, for ordering; `None` (first) when it does not parse.
fn time_of(at: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(at, &Rfc3339).ok()
}

/// Now in unix seconds, as `trace` reads it (for [`Request::new`]).
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, copy: &str) -> Vec<u8> {
        format!(
            "{{\"v\":1,\"message_id\":\"{id}\",\"copy_ids\":[\"{copy}\"],\"instance\":\"a\",\
             \"source\":\"queue\",\"verdict\":\"acked\",\"trace_id\":\"t\",\"span_id\":\"s\",\
             \"received_at\":\"2026-12-05T13:00:00.000Z\",\"settled_at\":\"2026-12-05T13:00:00.100Z\",\
             \"branches\":[]}}"
        )
        .into_bytes()
    }

    #[test]
    fn only_lines_that_hold_the_id_are_parsed_and_bad_ones_counted() {
        let mut body = Vec::new();
        for line in [
            record("m-1", "service:m-1"),
            record("m-10", "service:m-10"),
            record("other", "service:other"),
            b"{\"message_id\":\"m-1\", broken".to_vec(),
            b"not json at all".to_vec(),
            record("x", "logging:m-1"),
            record("m-1", "service:m-1"),
        ] {
            body.extend_from_slice(&line);
            body.push(b'\n');
        }
        let mut search = Search::new("m-1", Vec::new());
        search.batch(&body, None);
        // The duplicate line counts once; m-10, "other" and x are not m-1.
        assert_eq!(search.found.len(), 1);
        assert_eq!(search.skipped, 1, "only the broken line that names m-1");
        let mut by_copy = Search::new("logging:m-1", Vec::new());
        by_copy.batch(&body, None);
        assert_eq!(by_copy.found.len(), 1);
        assert_eq!(by_copy.found[0].0.message_id.as_deref(), Some("x"));
        // A batch another user published, or one without a user, is not
        // the group's history: its lines are counted, never shown.
        let writers = vec!["switchyard".to_owned()];
        for writer in [Some("producer"), None] {
            let mut guarded = Search::new("m-1", writers.clone());
            guarded.batch(&body, writer);
            assert_eq!(guarded.found.len(), 0, "{writer:?}");
            assert!(guarded.ignored >= 2, "{writer:?}: {}", guarded.ignored);
        }
        let mut ours = Search::new("m-1", writers);
        ours.batch(&body, Some("switchyard"));
        assert_eq!((ours.found.len(), ours.ignored), (1, 0));
    }

    #[test]
    fn an_id_is_searched_as_json_writes_it() {
        let mut line = serde_json::to_vec(&serde_json::json!({
            "v": 1, "message_id": "a\"b\\c", "instance": "a", "source": "queue",
            "verdict": "acked", "trace_id": "t", "received_at": "x", "settled_at": "y"
        }))
        .unwrap_or_default();
        line.push(b'\n');
        let mut search = Search::new("a\"b\\c", Vec::new());
        search.batch(&line, None);
        assert_eq!(search.found.len(), 1);
    }

    #[test]
    fn the_end_is_the_tail_or_else_the_start() {
        let batch = |offset, timestamp| Batch {
            offset,
            timestamp,
            records: None,
            body: Vec::new(),
            writer: None,
        };
        assert!(!past_end(&batch(10, Some(2_000)), Some(10), 1_000));
        assert!(past_end(&batch(11, Some(10)), Some(10), 1_000));
        assert!(!past_end(&batch(11, Some(1_000)), None, 1_000));
        assert!(past_end(&batch(11, Some(1_001)), None, 1_000));
        assert!(!past_end(&batch(11, None), None, 1_000));
    }

    #[test]
    fn a_bad_since_or_an_empty_id_is_a_usage_error() {
        let err = Request::new("m-1", Some("soon"), false, 0).err();
        let err = err.map(|e| (e.is_usage(), e.to_string()));
        assert!(
            err.as_ref()
                .is_some_and(|(usage, text)| *usage && text.starts_with("--since \"soon\": ")),
            "{err:?}"
        );
        assert!(Request::new("", None, false, 0).is_err_and(|e| e.is_usage()));
    }
}
