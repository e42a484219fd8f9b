//! The human form of a trace: one block per record, oldest first, each a
//! heading line (when it was settled, by which instance, from where, and
//! the verdict) then the ids and the branches, each with its attempts.
//!
//! ```text
//! 2026-12-05T13:04:01.250Z  switchyard-a  queue  dead-lettered: exhausted
//!     message order-4711  trace 4bf92f3577b34da6a3ce929d0e0e4736
//!     received 13:04:01.000Z, settled after 250 ms
//!     error: logging: nacked by the broker
//!     service: delivered
//!       13:04:01.100Z  primary  returned (reply 312)  (refused the copy)
//!       13:04:01.200Z  backup   confirmed
//!     logging: failed
//!       13:04:01.240Z  log      held 1500 ms  replay
//! ```

use super::super::record::{AttemptRecord, Record};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The timeline of `records`, in their order.
pub fn timeline<'a>(records: impl IntoIterator<Item = &'a Record>) -> String {
    let mut out = String::new();
    for (i, record) in records.into_iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        block(&mut out, record);
    }
    out
}

fn block(out: &mut String, r: &Record) {
    let date = date_of(&r.settled_at);
    out.push_str(&clean(&format!(
        "{}  {}  {}  {}",
        r.settled_at,
        r.instance,
        r.source,
        verdict(r)
    )));
    out.push('\n');
    let mut ids = format!("message {}", r.message_id.as_deref().unwrap_or("(none)"));
    if !r.trace_id.is_empty() {
        ids.push_str(&format!("  trace {}", r.trace_id));
    }
    if let Some(session) = &r.session {
        ids.push_str(&format!("  session {session}"));
    }
    line(out, 4, &ids);
    let mut received = format!("received {}", short(&r.received_at, date));
    if let Some(ms) = millis_between(&r.received_at, &r.settled_at) {
        received.push_str(&format!(", settled after {ms} ms"));
    }
    line(out, 4, &received);
    if let Some(error) = &r.error {
        line(out, 4, &format!("error: {error}"));
    }
    for branch in &r.branches {
        line(out, 4, &format!("{}: {}", branch.branch, branch.result));
        let width = branch
            .attempts
            .iter()
            .map(|a| a.endpoint.chars().count())
            .max()
            .unwrap_or(0);
        for attempt in &branch.attempts {
            line(out, 6, &step(attempt, date, width));
        }
    }
}

/// `dead-lettered: exhausted`, `answered 502`, `acked`; `(redelivered)`
/// after a message the broker had delivered before.
fn verdict(r: &Record) -> String {
    let said = match (&r.reason, r.http_status) {
        (Some(reason), _) => format!("{}: {reason}", r.verdict),
        (None, Some(status)) => format!("{} {status}", r.verdict),
        (None, None) => r.verdict.clone(),
    };
    if r.redelivered {
        format!("{said} (redelivered)")
    } else {
        said
    }
}

/// `13:04:01.100Z  primary  returned (reply 312)`.
fn step(a: &AttemptRecord, date: Option<&str>, width: usize) -> String {
    let mut text = format!(
        "{}  {:<width$}  {}",
        short(&a.at, date),
        a.endpoint,
        a.outcome
    );
    if let Some(code) = a.reply_code {
        text.push_str(&format!(" (reply {code})"));
    }
    if let Some(held) = a.held_ms {
        text.push_str(&format!(" {held} ms"));
    }
    if a.replay {
        text.push_str("  replay");
    }
    // Which kind of failure it was: only a list every endpoint of which
    // refused the copy dead-letters it.
    match a.outcome.as_str() {
        "returned" | "nacked" => text.push_str("  (refused the copy)"),
        "timed-out" | "lost" | "unreachable" | "skipped-down" => {
            text.push_str("  (not reached: the copy is held for it)")
        }
        _ => {}
    }
    text
}

fn line(out: &mut String, indent: usize, text: &str) {
    out.push_str(&" ".repeat(indent));
    out.push_str(&clean(text));
    out.push('\n');
}

/// A record's text may hold anything: control characters are shown as `.`.
fn clean(text: &str) -> String {
    text.replace(char::is_control, ".")
}

/// The date part of an RFC 3339 time (`2026-12-05T`).
fn date_of(at: &str) -> Option<&str> {
    at.get(..11).filter(|d| d.ends_with('T'))
}

/// `at` without its date when it is `date`.
fn short<'a>(at: &'a str, date: Option<&str>) -> &'a str {
    match date {
        Some(date) => at.strip_prefix(date).unwrap_or(at),
        None => at,
    }
}

fn millis_between(from: &str, to: &str) -> Option<i128> {
    let from = OffsetDateTime::parse(from, &Rfc3339).ok()?;
    let to = OffsetDateTime::parse(to, &Rfc3339).ok()?;
    Some((to - from).whole_milliseconds())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::record::{BranchRecord, VERSION};

    fn attempt(endpoint: &str, outcome: &str, at: &str) -> AttemptRecord {
        AttemptRecord {
            endpoint: endpoint.to_owned(),
            outcome: outcome.to_owned(),
            at: at.to_owned(),
            reply_code: None,
            held_ms: None,
            replay: false,
        }
    }

    #[test]
    fn a_record_reads_at_a_glance() {
        let mut returned = attempt("primary", "returned", "2026-12-05T13:04:01.100Z");
        returned.reply_code = Some(312);
        let mut held = attempt("log", "held", "2026-12-05T13:04:01.240Z");
        held.held_ms = Some(1500);
        held.replay = true;
        let record = Record {
            v: VERSION,
            message_id: Some("order-4711".to_owned()),
            copy_ids: vec!["service:order-4711".to_owned()],
            instance: "switchyard-a".to_owned(),
            source: "queue".to_owned(),
            verdict: "dead-lettered".to_owned(),
            reason: Some("exhausted".to_owned()),
            error: Some("logging: nacked\nby the broker".to_owned()),
            http_status: None,
            session: None,
            redelivered: false,
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
            span_id: String::new(),
            received_at: "2026-12-05T13:04:01.000Z".to_owned(),
            settled_at: "2026-12-05T13:04:01.250Z".to_owned(),
            branches: vec![
                BranchRecord {
                    branch: "service".to_owned(),
                    result: "delivered".to_owned(),
                    attempts: vec![
                        returned,
                        attempt("backup", "confirmed", "2026-12-05T13:04:01.200Z"),
                    ],
                },
                BranchRecord {
                    branch: "logging".to_owned(),
                    result: "failed".to_owned(),
                    attempts: vec![held],
                },
            ],
        };
        let expected = "\
2026-12-05T13:04:01.250Z  switchyard-a  queue  dead-lettered: exhausted
    message order-4711  trace 4bf92f3577b34da6a3ce929d0e0e4736
    received 13:04:01.000Z, settled after 250 ms
    error: logging: nacked.by the broker
    service: delivered
      13:04:01.100Z  primary  returned (reply 312)  (refused the copy)
      13:04:01.200Z  backup   confirmed
    logging: failed
      13:04:01.240Z  log  held 1500 ms  replay
";
        assert_eq!(timeline([&record]), expected);
        let answered = Record {
            reason: None,
            http_status: Some(502),
            verdict: "answered".to_owned(),
            ..record
        };
        assert!(
            timeline([&answered])
                .starts_with("2026-12-05T13:04:01.250Z  switchyard-a  queue  answered 502\n")
        );
    }
}
