//! The journal's record: one JSON object per settled message, as the
//! stream holds it and `switchyard trace --json` prints it. A record names
//! the message (its id, copy ids, trace id), the branches and endpoints,
//! and what happened; never a body or a header value.

use super::entry::{Attempted, BranchEntry, Entry, Said, Tried};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// The version of the record's shape, `v` in every record.
pub const VERSION: u32 = 1;

/// One settled message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The shape's version.
    pub v: u32,
    /// The message's `message_id`; `null` when it has none.
    pub message_id: Option<String>,
    /// The copy id of each branch (`x-switchyard-copy-id`), in branch order.
    #[serde(default)]
    pub copy_ids: Vec<String>,
    /// The instance (`name`) that settled it.
    pub instance: String,
    /// `queue`, `http` or `redrive`.
    pub source: String,
    /// `acked`, `dead-lettered`, `requeued`, `answered` or `redriven`.
    pub verdict: String,
    /// The dead-letter reason word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The dead letter's error line, or the HTTP answer's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The HTTP answer's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// The session it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The broker had delivered it before (to this instance or another).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redelivered: bool,
    /// The trace, 32 hex digits.
    pub trace_id: String,
    /// The forwarder's span for this message, 16 hex digits.
    #[serde(default)]
    pub span_id: String,
    /// When it arrived (RFC 3339).
    pub received_at: String,
    /// When it was settled or answered (RFC 3339).
    pub settled_at: String,
    /// Every branch, in filter-table order.
    #[serde(default)]
    pub branches: Vec<BranchRecord>,
}

/// One branch of a record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BranchRecord {
    /// The branch name.
    pub branch: String,
    /// `delivered`, `failed`, `rejected`, `outage`, `abandoned` or `earlier`.
    pub result: String,
    /// Its steps, in order.
    #[serde(default)]
    pub attempts: Vec<AttemptRecord>,
}

/// One step of a branch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The endpoint's name.
    pub endpoint: String,
    /// `confirmed`, `returned`, `nacked`, `timed-out`, `lost`,
    /// `unreachable`, `refused`, `stopped`, `skipped-down`, `skipped-drained` or `held`.
    pub outcome: String,
    /// When it ended (RFC 3339).
    pub at: String,
    /// A return's AMQP reply code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_code: Option<u16>,
    /// How long a `held` step held the message, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_ms: Option<u64>,
    /// A session's message sent again to a new endpoint after a failover.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay: bool,
}

impl Record {
    /// The record of `entry`, settled by `instance`.
    pub fn of(entry: &Entry, instance: &str) -> Self {
        let id = |branch: &str| match (&entry.message_id, entry.content) {
            (Some(id), _) => format!("{branch}:{id}"),
            (None, Some(content)) => format!("{branch}:content-{content}"),
            (None, None) => format!("{branch}:-"),
        };
        let (reason, error, http_status) = match &entry.said {
            Said::DeadLettered { reason, error } => {
                (Some((*reason).to_owned()), Some(error.clone()), None)
            }
            Said::Answered { status, reason } => (None, Some(reason.clone()), Some(*status)),
            Said::Acked | Said::Requeued | Said::Redriven => (None, None, None),
        };
        Self {
            v: VERSION,
            message_id: entry.message_id.clone(),
            copy_ids: entry.branches.iter().map(|b| id(&b.branch)).collect(),
            instance: instance.to_owned(),
            source: entry.source.as_str().to_owned(),
            verdict: entry.said.as_str().to_owned(),
            reason,
            error,
            http_status,
            session: entry.session.as_deref().map(str::to_owned),
            redelivered: entry.redelivered,
            trace_id: entry.trace.trace_id_hex(),
            span_id: format!("{:016x}", entry.trace.span),
            received_at: rfc3339(entry.received_at),
            settled_at: rfc3339(entry.settled_at),
            branches: entry
                .branches
                .iter()
                .map(|b| BranchRecord {
                    branch: b.branch.to_string(),
                    result: b.result.to_owned(),
                    attempts: b
                        .attempts
                        .iter()
                        .map(|t| AttemptRecord {
                            endpoint: t.endpoint.name.clone(),
                            outcome: t.outcome.as_str().to_owned(),
                            at: rfc3339(t.ended),
                            reply_code: match t.outcome {
                                super::Attempted::Returned(code) => Some(code),
                                _ => None,
                            },
                            held_ms: match t.outcome {
                                super::Attempted::Held(held) => {
                                    Some(u64::try_from(held.as_millis()).unwrap_or(u64::MAX))
                                }
                                _ => None,
                            },
                            replay: t.replay,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// Whether `id` names this record's message: its message id or one of
    /// its copy ids.
    pub fn names(&self, id: &str) -> bool {
        self.message_id.as_deref() == Some(id) || self.copy_ids.iter().any(|c| c == id)
    }
}

/// `at` in RFC 3339, UTC, to the millisecond (`2026-12-06T14:02:11.204Z`).
pub fn rfc3339(at: SystemTime) -> String {
    Rfc3339(at).to_string()
}

/// A time shown in RFC 3339, UTC, to the millisecond. Written by hand: it
/// runs several times per record, and a calendar library's formatting cost
/// more than the rest of the record.
#[derive(Debug, Clone, Copy)]
pub struct Rfc3339(pub SystemTime);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let since = self.0.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs();
        let (days, of_day) = (secs / 86_400, secs % 86_400);
        let (year, month, day) = civil_from_days(days);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
            of_day / 3600,
            of_day % 3600 / 60,
            of_day % 60,
            since.subsec_millis()
        )
    }
}

/// Appends the record of `entry`, settled by `instance`, to `out` as one
/// line of JSON: the same bytes as serializing [`Record::of`] gives (a
/// test holds them equal), written straight from the entry, without
/// building the owned record, its strings and vectors, and without the
/// general formatting machinery: the journal's writer writes every record
/// this way, and its cost per message is the journal's cost.
pub fn write_line(out: &mut Vec<u8>, entry: &Entry, instance: &str) {
    let mut day = Day::default();
    out.extend_from_slice(b"{\"v\":");
    push_u64(out, u64::from(VERSION));
    out.extend_from_slice(b",\"message_id\":");
    match &entry.message_id {
        Some(id) => push_str(out, id),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"copy_ids\":[");
    for (i, branch) in entry.branches.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        push_escaped(out, &branch.branch);
        out.push(b':');
        match (&entry.message_id, entry.content) {
            (Some(id), _) => push_escaped(out, id),
            (None, Some(content)) => {
                out.extend_from_slice(b"content-");
                let mut uuid = [0u8; uuid::fmt::Hyphenated::LENGTH];
                out.extend_from_slice(content.hyphenated().encode_lower(&mut uuid).as_bytes());
            }
            (None, None) => out.push(b'-'),
        }
        out.push(b'"');
    }
    out.extend_from_slice(b"],\"instance\":");
    push_str(out, instance);
    out.extend_from_slice(b",\"source\":");
    push_word(out, entry.source.as_str());
    out.extend_from_slice(b",\"verdict\":");
    push_word(out, entry.said.as_str());
    match &entry.said {
        Said::DeadLettered { reason, error } => {
            out.extend_from_slice(b",\"reason\":");
            push_word(out, reason);
            out.extend_from_slice(b",\"error\":");
            push_str(out, error);
        }
        Said::Answered { status, reason } => {
            out.extend_from_slice(b",\"error\":");
            push_str(out, reason);
            out.extend_from_slice(b",\"http_status\":");
            push_u64(out, u64::from(*status));
        }
        Said::Acked | Said::Requeued | Said::Redriven => {}
    }
    if let Some(session) = &entry.session {
        out.extend_from_slice(b",\"session\":");
        push_str(out, session);
    }
    if entry.redelivered {
        out.extend_from_slice(b",\"redelivered\":true");
    }
    out.extend_from_slice(b",\"trace_id\":\"");
    push_hex(out, entry.trace.trace_id, 32);
    out.extend_from_slice(b"\",\"span_id\":\"");
    push_hex(out, u128::from(entry.trace.span), 16);
    out.extend_from_slice(b"\",\"received_at\":\"");
    push_time(out, entry.received_at, &mut day);
    out.extend_from_slice(b"\",\"settled_at\":\"");
    push_time(out, entry.settled_at, &mut day);
    out.extend_from_slice(b"\",\"branches\":[");
    for (i, branch) in entry.branches.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_branch(out, branch, &mut day);
    }
    out.extend_from_slice(b"]}");
}

fn push_branch(out: &mut Vec<u8>, branch: &BranchEntry, day: &mut Day) {
    out.extend_from_slice(b"{\"branch\":");
    push_str(out, &branch.branch);
    out.extend_from_slice(b",\"result\":");
    push_word(out, branch.result);
    out.extend_from_slice(b",\"attempts\":[");
    for (i, tried) in branch.attempts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_attempt(out, tried, day);
    }
    out.extend_from_slice(b"]}");
}

fn push_attempt(out: &mut Vec<u8>, tried: &Tried, day: &mut Day) {
    out.extend_from_slice(b"{\"endpoint\":");
    push_str(out, &tried.endpoint.name);
    out.extend_from_slice(b",\"outcome\":");
    push_word(out, tried.outcome.as_str());
    out.extend_from_slice(b",\"at\":\"");
    push_time(out, tried.ended, day);
    out.push(b'"');
    match tried.outcome {
        Attempted::Returned(code) => {
            out.extend_from_slice(b",\"reply_code\":");
            push_u64(out, u64::from(code));
        }
        Attempted::Held(held) => {
            out.extend_from_slice(b",\"held_ms\":");
            push_u64(out, u64::try_from(held.as_millis()).unwrap_or(u64::MAX));
        }
        _ => {}
    }
    if tried.replay {
        out.extend_from_slice(b",\"replay\":true");
    }
    out.push(b'}');
}

/// One of the record's own words (`acked`, `confirmed`, `exhausted`...):
/// known to need no escaping.
fn push_word(out: &mut Vec<u8>, word: &'static str) {
    debug_assert!(!needs_escape(word.as_bytes()), "{word}");
    out.push(b'"');
    out.extend_from_slice(word.as_bytes());
    out.push(b'"');
}

/// `s` as a JSON string, quoted and escaped.
fn push_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    push_escaped(out, s);
    out.push(b'"');
}

/// `s` escaped as serde_json escapes it: `"` and `\\`, and control
/// characters below 0x20 (the usual ones by letter, the rest as `\\u00XX`);
/// everything else as it is.
fn push_escaped(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    if !needs_escape(bytes) {
        out.extend_from_slice(bytes);
        return;
    }
    for &b in bytes {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b if b < 0x20 => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
            b => out.push(b),
        }
    }
}

/// Whether any byte of `bytes` must be escaped in JSON: checked eight at a
/// time (a byte below 0x20, a `"` or a `\\` in a word sets its high bit),
/// since nearly every string of a record has none.
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(word);
        let x = u64::from_le_bytes(eight);
        let control = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
        let quote = zero_byte(x ^ (ONES * u64::from(b'"')));
        let backslash = zero_byte(x ^ (ONES * u64::from(b'\\')));
        if control | quote | backslash != 0 {
            return true;
        }
    }
    words
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// `n`'s last `digits` hex digits, lower case, zero-padded.
fn push_hex(out: &mut Vec<u8>, n: u128, digits: u32) {
    for i in (0..digits).rev() {
        out.push(HEX[((n >> (i * 4)) & 0xf) as usize]);
    }
}

fn push_u64(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// `n` in `width` decimal digits, zero-padded.
fn push_padded(out: &mut Vec<u8>, n: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut n = n;
    for slot in digits[20 - width..].iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out.extend_from_slice(&digits[20 - width..]);
}

/// The date of the last time a record wrote, kept for the next: a
/// record's times nearly always share their day.
#[derive(Default)]
struct Day {
    days: Option<u64>,
    /// `YYYY-MM-DD`.
    date: [u8; 10],
}

/// `at` as [`Rfc3339`] shows it, written digit by digit.
fn push_time(out: &mut Vec<u8>, at: SystemTime, day: &mut Day) {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    if day.days != Some(days) {
        let (year, month, date) = civil_from_days(days);
        let digit = |n: u64, place: u64| b'0' + (n / place % 10) as u8;
        day.date = [
            digit(year, 1000),
            digit(year, 100),
            digit(year, 10),
            digit(year, 1),
            b'-',
            digit(month, 10),
            digit(month, 1),
            b'-',
            digit(date, 10),
            digit(date, 1),
        ];
        day.days = Some(days);
    }
    out.extend_from_slice(&day.date);
    out.push(b'T');
    push_padded(out, of_day / 3600, 2);
    out.push(b':');
    push_padded(out, of_day % 3600 / 60, 2);
    out.push(b':');
    push_padded(out, of_day % 60, 2);
    out.push(b'.');
    push_padded(out, u64::from(since.subsec_millis()), 3);
    out.push(b'Z');
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Attempted, BranchEntry, Entry, Source, Tried};
    use crate::wire::Trace;
    use std::sync::Arc;
    use std::time::Duration;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn a_record_names_ids_branches_and_steps_and_reads_back() {
        let endpoint = |name: &str| {
            Arc::new(crate::destination::Endpoint {
                name: name.to_owned(),
                broker: "main".to_owned(),
                exchange: String::new(),
                routing_key: name.to_owned(),
                declare_queue: None,
                declare_queue_type: crate::destination::QueueType::Classic,
                confirm_timeout: Duration::from_secs(1),
                retries: 0,
                headers: Vec::new(),
                probe_interval: Duration::from_secs(1),
            })
        };
        let tried = |name: &str, outcome, ms| Tried {
            index: 0,
            endpoint: endpoint(name),
            outcome,
            replay: false,
            span: 7,
            started: at(ms - 1),
            ended: at(ms),
        };
        let entry = Entry {
            message_id: Some("order-4711".to_owned()),
            content: None,
            source: Source::Queue,
            session: None,
            redelivered: false,
            trace: Trace::from_texts(
                Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                None,
                true,
            ),
            received_at: at(1_764_800_000_000),
            settled_at: at(1_764_800_000_250),
            said: Said::DeadLettered {
                reason: "exhausted",
                error: "logging: nacked by the broker".to_owned(),
            },
            branches: vec![
                BranchEntry {
                    branch: Arc::from("service"),
                    result: "delivered",
                    attempts: vec![
                        tried("primary", Attempted::Returned(312), 1_764_800_000_100),
                        tried("backup", Attempted::Confirmed, 1_764_800_000_200),
                    ],
                },
                BranchEntry {
                    branch: Arc::from("logging"),
                    result: "failed",
                    attempts: vec![tried(
                        "log",
                        Attempted::Held(Duration::from_millis(1500)),
                        1_764_800_000_240,
                    )],
                },
            ],
        };
        let record = Record::of(&entry, "switchyard-a");
        assert_eq!(
            record.copy_ids,
            ["service:order-4711", "logging:order-4711"]
        );
        assert_eq!(record.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(record.verdict, "dead-lettered");
        assert_eq!(record.reason.as_deref(), Some("exhausted"));
        assert_eq!(record.received_at, "2025-12-03T22:13:20.000Z");
        assert_eq!(record.settled_at, "2025-12-03T22:13:20.250Z");
        let service = &record.branches[0];
        assert_eq!(service.attempts[0].outcome, "returned");
        assert_eq!(service.attempts[0].reply_code, Some(312));
        assert_eq!(service.attempts[1].endpoint, "backup");
        assert_eq!(record.branches[1].attempts[0].held_ms, Some(1500));
        assert!(record.names("order-4711") && record.names("logging:order-4711"));
        assert!(!record.names("order-47"));
        let line = serde_json::to_string(&record).unwrap_or_default();
        assert!(!line.contains("\"replay\""), "false flags are left out");
        let back: Record = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, record);
        // Written straight from the entry, the writer's way: the same line.
        let written = |entry: &Entry, instance: &str| {
            let mut out = Vec::new();
            write_line(&mut out, entry, instance);
            String::from_utf8(out).unwrap_or_default()
        };
        assert_eq!(written(&entry, "switchyard-a"), line);
        let mut odd = entry.clone();
        odd.message_id = Some("a\"b\\c\n\u{1b}é".to_owned());
        odd.session = Some(Arc::from("s-1"));
        odd.redelivered = true;
        odd.said = Said::Answered {
            status: 502,
            reason: "failed \"x\"".to_owned(),
        };
        odd.branches[0].attempts[1].replay = true;
        // Settled on the next day, an attempt in the year 2100.
        odd.settled_at = at(1_764_900_000_000);
        odd.branches[1].attempts[0].ended = at(4_107_542_400_500);
        let owned = serde_json::to_string(&Record::of(&odd, "i\u{7}\\")).unwrap_or_default();
        assert_eq!(written(&odd, "i\u{7}\\"), owned);
        odd.message_id = None;
        odd.content = Some(uuid::Uuid::from_u128(
            0x6b1f_58c2_9d47_4e0b_a3c5_2f8e_71d0_94aa,
        ));
        let owned = serde_json::to_string(&Record::of(&odd, "i")).unwrap_or_default();
        assert_eq!(written(&odd, "i"), owned);
        odd.content = None;
        odd.said = Said::Requeued;
        let owned = serde_json::to_string(&Record::of(&odd, "i")).unwrap_or_default();
        assert_eq!(written(&odd, "i"), owned);
    }

    /// The word-at-a-time check finds every byte that needs escaping, at
    /// every place of a string of any length, and no other.
    #[test]
    fn the_escape_check_finds_exactly_the_bytes_json_escapes() {
        for len in 1..=17 {
            for at in 0..len {
                for byte in 0..=255u8 {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = byte;
                    let expected = byte < 0x20 || byte == b'"' || byte == b'\\';
                    assert_eq!(needs_escape(&bytes), expected, "{len} {at} {byte}");
                }
            }
        }
    }

    /// The hand-written format agrees with a calendar library's, across
    /// leap days, year ends and centuries.
    #[test]
    fn timestamps_agree_with_the_calendar() {
        let format = time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        );
        for (secs, millis) in [
            (0, 0),
            (951_782_400, 1),     // 2000-02-29
            (1_735_689_599, 999), // 2024-12-31T23:59:59.999
            (1_796_568_233, 841), // 2026-12-06
            (4_107_542_400, 500), // 2100-03-01
            (253_402_300_799, 0), // 9999-12-31T23:59:59
        ] {
            let at = UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis);
            let expected = time::OffsetDateTime::from(at)
                .format(&format)
                .unwrap_or_default();
            assert_eq!(rfc3339(at), expected, "{secs}");
        }
    }
}
