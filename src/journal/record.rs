//! The journal's record: one JSON object per settled message, as the
//! stream holds it and `switchyard trace --json` prints it. A record names
//! the message (its id, copy ids, trace id), the branches and endpoints,
//! and what happened; never a body or a header value.

use super::entry::{Entry, Said};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
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
/// Written by hand: it runs four times per record, and a calendar
/// library's formatting cost more than the rest of the record.
pub fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    let mut out = String::with_capacity(24);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
        since.subsec_millis()
    );
    out
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
