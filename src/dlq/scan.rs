//! Which dead letters a command takes, and the walk that takes them: from
//! the queue's head, holding every message taken, up to the selection's
//! limit or as many as the queue held at the start.

use super::error::{Counts, DlqError};
use super::record::{Record, is_probe};
use crate::broker::{DlqReader, ReadError};
use crate::config::{Inbound, InvalidKey, Settings};
use crate::destination::{DeadLetter, QueueType};
use crate::duration::parse_duration;
use crate::envelope::Envelope;
use crate::wire::Trust;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Which dead letters a command takes: `--limit`, `--reason`,
/// `--message-id`, `--since`. Every given filter must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// At most this many dead letters; `None`: all.
    pub limit: Option<u64>,
    /// The dead letter's reason is one of these (`exhausted`, `no-route`,
    /// ..., or `x-death:<reason>` for one only the broker annotated).
    pub reasons: Vec<String>,
    /// The message_id property equals this.
    pub message_id: Option<String>,
    /// Dead-lettered at most this long ago.
    pub since: Option<Duration>,
}

impl Selection {
    /// A selection from command-line values; `since` is a duration such as
    /// `90s`, `10m`, `2h`, `1d` or `1h30m`.
    pub fn new(
        limit: Option<u64>,
        reasons: Vec<String>,
        message_id: Option<String>,
        since: Option<&str>,
    ) -> Result<Self, DlqError> {
        let since = since
            .map(|text| {
                parse_duration(text)
                    .map_err(|why| DlqError::Usage(format!("--since \"{text}\": {why}")))
            })
            .transpose()?;
        Ok(Self {
            limit,
            reasons,
            message_id,
            since,
        })
    }

    fn matches(&self, record: &Record, now_ms: i64) -> bool {
        let reason = || {
            self.reasons.is_empty()
                || record
                    .reason
                    .as_ref()
                    .is_some_and(|r| self.reasons.iter().any(|want| want == r))
        };
        let id = || {
            self.message_id
                .as_ref()
                .is_none_or(|want| record.message_id.as_ref() == Some(want))
        };
        let recent = || {
            self.since.is_none_or(|since| {
                record
                    .age_ms(now_ms)
                    .is_some_and(|age| u128::try_from(age).is_ok_and(|a| a <= since.as_millis()))
            })
        };
        reason() && id() && recent()
    }
}

/// The inbound queue and its dead letters, or the configuration error
/// saying they are needed.
pub(super) fn queue_side(settings: &Settings) -> Result<(&Inbound, &DeadLetter), DlqError> {
    settings.queue().ok_or_else(|| {
        DlqError::Config(InvalidKey::new(
            "inbound",
            "not set: this forwarder consumes no queue (HTTP ingress only) and dead-letters \
             nothing, so there is no dead-letter queue to read",
        ))
    })
}

/// The dead-letter queue's name, or the configuration error saying it is needed.
fn dead_letter_queue(settings: &Settings) -> Result<&str, DlqError> {
    queue_side(settings)?.1.queue.as_deref().ok_or_else(|| {
        DlqError::Config(InvalidKey::new(
            "dead_letter.queue",
            "not set; the dlq commands read the dead-letter queue it names (set it to the queue \
             bound to dead_letter.exchange with dead_letter.routing_key)",
        ))
    })
}

/// Opens the dead-letter queue on the inbound broker.
pub(super) async fn open(settings: &Settings) -> Result<(DlqReader, u32), DlqError> {
    let queue = dead_letter_queue(settings)?;
    let (inbound, _) = queue_side(settings)?;
    let broker = settings.brokers.get(&inbound.broker).ok_or_else(|| {
        DlqError::Config(InvalidKey::new(
            "inbound.broker",
            "names no [brokers] entry",
        ))
    })?;
    Ok(DlqReader::open(broker, &settings.name, queue).await?)
}

/// Walks the queue from its head, holding what it takes, and yields the
/// dead letters `selection` takes, up to its limit.
pub(super) struct Scan<'a> {
    settings: &'a Settings,
    selection: &'a Selection,
    /// Messages the queue held at the start, not yet taken.
    remaining: u32,
    /// When the scan started, in unix milliseconds.
    pub(super) now_ms: i64,
    /// Counts so far.
    pub(super) counts: Counts,
    /// Whose dead letters carry the forwarder's record.
    pub(super) trust: Trust,
}

impl<'a> Scan<'a> {
    pub(super) fn new(settings: &'a Settings, selection: &'a Selection, queued: u32) -> Self {
        Self {
            settings,
            selection,
            remaining: queued,
            now_ms: now_ms(),
            counts: Counts {
                queued,
                ..Counts::default()
            },
            trust: Trust::new(
                settings
                    .inbound()
                    .as_ref()
                    .map(|i| i.trusted_users.clone())
                    .unwrap_or_default(),
            ),
        }
    }

    /// The next selected dead letter, or `None` when the scan is over.
    pub(super) async fn next(
        &mut self,
        reader: &mut DlqReader,
    ) -> Result<Option<(Envelope, Record)>, ReadError> {
        while self.remaining > 0
            && self
                .selection
                .limit
                .is_none_or(|limit| self.counts.selected < limit)
        {
            let Some(message) = reader.next().await? else {
                self.remaining = 0;
                break;
            };
            self.remaining -= 1;
            self.counts.seen += 1;
            if is_probe(&message, &self.trust) {
                self.counts.probes += 1;
                continue;
            }
            let record = Record::read(&message, &self.settings.routing, &self.trust);
            if self.selection.matches(&record, self.now_ms) {
                self.counts.selected += 1;
                return Ok(Some((message, record)));
            }
        }
        Ok(None)
    }

    /// Before the messages held go back: a quorum queue puts messages it
    /// gets back behind the others, so every message it held at the start
    /// is taken first, and all go back behind any that arrived since, in
    /// their order. A classic queue puts each back in its place.
    pub(super) async fn hold_rest(&mut self, reader: &mut DlqReader) -> Result<(), ReadError> {
        let quorum = self.settings.dead_letter().map(|d| d.queue_type);
        if quorum != Some(QueueType::Quorum) {
            return Ok(());
        }
        while self.remaining > 0 && reader.next().await?.is_some() {
            self.remaining -= 1;
            self.counts.seen += 1;
        }
        Ok(())
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A short age: `45s`, `3m12s`, `2h05m`, `3d04h`.
pub fn format_age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_since_is_a_usage_error() {
        let err = Selection::new(None, Vec::new(), None, Some("soon")).unwrap_err();
        assert!(err.is_usage());
        assert!(err.to_string().starts_with("--since \"soon\": "), "{err}");
    }

    #[test]
    fn ages_are_short() {
        assert_eq!(format_age(45_000), "45s");
        assert_eq!(format_age(192_000), "3m12s");
        assert_eq!(format_age(7_500_000), "2h05m");
        assert_eq!(format_age(273_600_000), "3d04h");
        assert_eq!(format_age(-5), "0s");
    }

    fn record(reason: Option<&str>, id: Option<&str>, at: Option<i64>) -> Record {
        Record {
            message_id: id.map(str::to_owned),
            reason: reason.map(str::to_owned),
            error: None,
            failed: Vec::new(),
            delivered: Vec::new(),
            source_queue: None,
            dead_lettered_at_ms: at,
            annotated: true,
            producer_annotations: Vec::new(),
            trace_id: None,
            deaths: Vec::new(),
            body_bytes: 0,
            body_preview: String::new(),
        }
    }

    #[test]
    fn every_given_filter_must_match() {
        let now = 10_000_000;
        let all = Selection::default();
        let r = record(Some("exhausted"), Some("m1"), Some(now - 60_000));
        assert!(all.matches(&r, now));
        let by_reason = Selection {
            reasons: vec!["no-route".to_owned(), "exhausted".to_owned()],
            ..Selection::default()
        };
        assert!(by_reason.matches(&r, now));
        assert!(!by_reason.matches(&record(Some("poison"), None, None), now));
        assert!(!by_reason.matches(&record(None, None, None), now));
        let by_id = Selection {
            message_id: Some("m1".to_owned()),
            ..Selection::default()
        };
        assert!(by_id.matches(&r, now));
        assert!(!by_id.matches(&record(None, Some("m2"), None), now));
        assert!(!by_id.matches(&record(None, None, None), now));
        let recent = Selection {
            since: Some(Duration::from_secs(120)),
            ..Selection::default()
        };
        assert!(recent.matches(&r, now));
        assert!(!recent.matches(&record(None, None, Some(now - 121_000)), now));
        assert!(
            !recent.matches(&record(None, None, None), now),
            "unknown age"
        );
        let both = Selection {
            reasons: vec!["exhausted".to_owned()],
            message_id: Some("m2".to_owned()),
            ..Selection::default()
        };
        assert!(!both.matches(&r, now));
    }
}
