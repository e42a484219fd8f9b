//! Settle: a [`Verdict`] becomes an ack or a dead letter, and nothing else.
//!
//! Commit acks. A dead letter in `nack` mode is `basic.nack(requeue=false)`:
//! the broker routes it through the inbound queue's dead-letter exchange,
//! which startup verified. In `republish` mode an annotated copy (the
//! `x-switchyard-*` headers listed in docs/configuration.md) is published with a confirm
//! and only then is the original acked. A copy that cannot be confirmed is
//! retried with capped backoff while the original stays unacked, so
//! delivered branches are never sent again; a copy the broker refuses for
//! itself (too large a header, a foreign user_id) is sent again in a form
//! that fits: without the producer's headers and user_id, annotated. An
//! abandoned verdict (the inbound channel is gone) settles nothing: the
//! broker redelivers the message.

use super::outcome::{Reason, Verdict};
use crate::amqp::{AmqpValue, FieldArray, FieldTable, Properties, ShortString};
use crate::backoff::Backoff;
use crate::broker::{Mode, Publish, PublishFailure, Receipt};
use crate::destination::DeadLetterMode;
use crate::destination::Endpoint;
use crate::envelope::{Envelope, MAX_HEADER_DEPTH, value_depth};
use crate::errors::one_line_text;
use crate::telemetry::Telemetry;
use crate::wire;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// First and longest pause between two tries of a dead-letter copy.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The dead-letter endpoint of `republish` mode and what publishes to it.
pub type DeadLetters = (Arc<dyn Publish>, Arc<Endpoint>);

/// Turns verdicts into settlements.
#[derive(Clone)]
pub struct Settler {
    mode: DeadLetterMode,
    /// Where annotated copies go in `republish` mode, and through what.
    dead_letters: Option<DeadLetters>,
    source_queue: Arc<str>,
    telemetry: Telemetry,
}

impl Settler {
    /// A settler; `dead_letters` is required in `republish` mode.
    pub fn new(
        mode: DeadLetterMode,
        dead_letters: Option<DeadLetters>,
        source_queue: &str,
        telemetry: Telemetry,
    ) -> Self {
        Self {
            mode,
            dead_letters,
            source_queue: source_queue.into(),
            telemetry,
        }
    }

    /// Settles one message.
    pub async fn settle(&self, envelope: &Arc<Envelope>, receipt: Receipt, verdict: Verdict) {
        self.settle_with(envelope, receipt, verdict, Vec::new())
            .await;
    }

    /// Settles one message; a dead-letter copy also carries `extra`
    /// annotations.
    pub async fn settle_with(
        &self,
        envelope: &Arc<Envelope>,
        receipt: Receipt,
        verdict: Verdict,
        extra: Vec<(ShortString, AmqpValue)>,
    ) {
        // Nearly every message: acked without building a set.
        if let Verdict::Commit = verdict {
            return receipt.ack();
        }
        // Boxed: otherwise every transaction's task carries (and moves) the
        // state of this rare path.
        Box::pin(self.settle_set(vec![(envelope.clone(), receipt, verdict)], extra)).await;
    }

    /// Settles a set of messages as one unit, in order; every dead-letter
    /// copy carries `extra` annotations (a session's id). In `republish`
    /// mode every copy is confirmed before any original is acked, so a crash
    /// midway never leaves part of the set acked: the broker redelivers it
    /// whole (and the copies already confirmed stay in the dead-letter queue
    /// as duplicates).
    pub async fn settle_set(
        &self,
        set: Vec<(Arc<Envelope>, Receipt, Verdict)>,
        extra: Vec<(ShortString, AmqpValue)>,
    ) {
        let telemetry = &self.telemetry;
        let letters: Vec<(Arc<Envelope>, Receipt, Letter)> = set
            .into_iter()
            .filter_map(|(envelope, receipt, verdict)| match verdict {
                Verdict::Commit => {
                    receipt.ack();
                    None
                }
                Verdict::Abandon => {
                    telemetry.abandoned(&envelope.message_id());
                    None
                }
                Verdict::DeadLetter { ref cause, .. } => {
                    let letter = Letter {
                        reason: cause.reason(),
                        error: one_line_text(&cause.to_string()),
                        verdict,
                    };
                    Some((envelope, receipt, letter))
                }
            })
            .collect();
        let republished = match (&self.mode, &self.dead_letters) {
            (DeadLetterMode::Republish, Some(dead_letters)) => {
                for (envelope, receipt, letter) in &letters {
                    let (copy, headers) = self.copy(envelope, letter, &extra);
                    let reason = letter.reason.as_str();
                    if !publish_dead_letter(
                        dead_letters,
                        &copy,
                        headers,
                        receipt,
                        reason,
                        telemetry,
                    )
                    .await
                    {
                        // The inbound channel is lost: the broker redelivers the set.
                        return;
                    }
                }
                true
            }
            _ => false,
        };
        let how = if republished { "republish" } else { "nack" };
        for (envelope, receipt, l) in letters {
            let reason = l.reason.as_str();
            let id = envelope.message_id();
            let failed: Vec<&str> = l.verdict.failed().collect();
            let delivered: Vec<&str> = l.verdict.delivered().collect();
            telemetry.dead_lettered(&id, reason, &l.error, &failed, &delivered, how);
            if republished {
                receipt.ack();
            } else {
                receipt.reject(false);
            }
        }
    }

    /// The annotated dead-letter copy of `envelope` and its headers.
    fn copy(
        &self,
        envelope: &Arc<Envelope>,
        letter: &Letter,
        extra: &[(ShortString, AmqpValue)],
    ) -> (Arc<Envelope>, Vec<(ShortString, AmqpValue)>) {
        let Letter {
            reason,
            error,
            verdict,
        } = letter;
        let mut headers = annotations(
            reason.as_str(),
            error,
            verdict.failed(),
            verdict.delivered(),
            &self.source_queue,
        );
        // No endpoint is an empty string, so the list stays aligned with
        // the failed branches.
        let endpoints = verdict.failed_endpoints().map(Option::unwrap_or_default);
        headers.push((wire::FAILED_ENDPOINTS.into(), text_array(endpoints)));
        headers.extend(extra.iter().cloned());
        // The message's trace (its producer's, or the one the forwarder
        // started), under the forward's span: `dlq inspect` shows it.
        let trace = &envelope.annotations.trace;
        headers.push((
            wire::TRACEPARENT.into(),
            AmqpValue::LongString(
                trace
                    .child(trace.span, trace.sampled.unwrap_or(true))
                    .into(),
            ),
        ));
        // A dead letter is not a forward: it keeps the hops it came with.
        headers.push((
            wire::HOPS.into(),
            AmqpValue::LongLongInt(i64::from(envelope.annotations.hops)),
        ));
        let copy = if *reason == Reason::Malformed {
            Arc::new(without_deep_headers(envelope))
        } else {
            envelope.clone()
        };
        (copy, headers)
    }
}

/// A dead-letter verdict, its reason and its error on one line.
struct Letter {
    reason: Reason,
    error: String,
    /// Always [`Verdict::DeadLetter`]: its lists go in the headers.
    verdict: Verdict,
}

/// Publishes the dead-letter copy until it is confirmed (`true`) or the
/// inbound channel is lost (`false`: the broker redelivers the original).
async fn publish_dead_letter(
    dead_letters: &DeadLetters,
    envelope: &Arc<Envelope>,
    headers: Vec<(ShortString, AmqpValue)>,
    receipt: &Receipt,
    reason: &str,
    telemetry: &Telemetry,
) -> bool {
    let message_id = envelope.message_id();
    let mut copy = envelope.clone();
    let mut extra = headers;
    let mut mode = Mode::Normal;
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
    loop {
        if receipt.lost().is_cancelled() {
            return false;
        }
        let (publish, endpoint) = dead_letters;
        match publish.publish(endpoint, &copy, extra.clone(), mode).await {
            Ok(()) => return true,
            // Alone once, at once; a suspect again alone waits like any failure.
            Err(e) if e.is_suspect() && mode == Mode::Normal => mode = Mode::Alone,
            Err(PublishFailure::Rejected(why)) if Arc::ptr_eq(&copy, envelope) => {
                telemetry.dead_letter_reduced(&message_id, reason, &why);
                let removed = envelope.headers().map_or(0, |h| h.inner().len());
                extra.push((
                    wire::REMOVED_HEADERS.into(),
                    AmqpValue::LongLongInt(removed as i64),
                ));
                copy = Arc::new(fitting(envelope));
                mode = Mode::Normal;
            }
            Err(e) => {
                let delay = backoff.next_delay();
                telemetry.dead_letter_retry(&message_id, reason, &e, delay);
                mode = Mode::Normal;
                tokio::select! {
                    () = receipt.lost().cancelled() => return false,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// The message without the producer's headers and user_id: what is left of
/// a message the broker refused is its body and its other properties.
fn fitting(envelope: &Envelope) -> Envelope {
    let p = &envelope.properties;
    let mut kept = Properties::default();
    macro_rules! keep {
        ($($get:ident => $set:ident),*) => {$(
            if let Some(value) = p.$get() {
                kept = kept.$set(value.clone());
            }
        )*};
    }
    keep!(content_type => with_content_type, content_encoding => with_content_encoding,
        delivery_mode => with_delivery_mode, priority => with_priority,
        correlation_id => with_correlation_id, reply_to => with_reply_to,
        expiration => with_expiration, message_id => with_message_id,
        timestamp => with_timestamp, kind => with_type, app_id => with_app_id,
        cluster_id => with_cluster_id);
    Envelope {
        properties: kept,
        ..envelope.clone()
    }
}

fn text_array<'a>(items: impl Iterator<Item = &'a str>) -> AmqpValue {
    AmqpValue::FieldArray(FieldArray::from(
        items
            .map(|n| AmqpValue::LongString(n.into()))
            .collect::<Vec<_>>(),
    ))
}

/// The `x-switchyard-*` headers of a dead letter.
pub fn annotations<'a>(
    reason: &str,
    error: &str,
    failed: impl Iterator<Item = &'a str>,
    delivered: impl Iterator<Item = &'a str>,
    source_queue: &str,
) -> Vec<(ShortString, AmqpValue)> {
    let text = |s: &str| AmqpValue::LongString(s.into());
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    vec![
        (wire::REASON.into(), text(reason)),
        (wire::ERROR.into(), text(error)),
        (wire::FAILED.into(), text_array(failed)),
        (wire::DELIVERED.into(), text_array(delivered)),
        (wire::SOURCE_QUEUE.into(), text(source_queue)),
        (
            wire::DEAD_LETTERED_AT.into(),
            AmqpValue::LongLongInt(now_ms),
        ),
    ]
}

/// `envelope` with every top-level header whose value nests deeper than
/// [`MAX_HEADER_DEPTH`] replaced by a short string naming the header and its
/// depth (`x-switchyard-removed: <name>: nested N levels`), so the dead
/// letter of a malformed message can itself be published and read. The
/// envelope is cloned whole first, so like any handling of a deep value this
/// wants the binary's large thread stacks.
pub fn without_deep_headers(envelope: &Envelope) -> Envelope {
    let mut copy = envelope.clone();
    if let Some(headers) = envelope.headers() {
        let mut kept = FieldTable::default();
        for (name, value) in headers {
            let depth = value_depth(value);
            let value = if depth > MAX_HEADER_DEPTH {
                let note = format!("x-switchyard-removed: {name}: nested {depth} levels");
                AmqpValue::LongString(note.into())
            } else {
                value.clone()
            };
            kept.insert(name.clone(), value);
        }
        copy.properties = copy.properties.with_headers(kept);
    }
    copy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::Properties;

    fn nested(depth: usize) -> AmqpValue {
        let mut value = AmqpValue::LongString("leaf".into());
        for level in 0..depth {
            value = if level % 2 == 0 {
                AmqpValue::FieldArray(FieldArray::from(vec![value]))
            } else {
                let mut table = FieldTable::default();
                table.insert("k".into(), value);
                AmqpValue::FieldTable(table)
            };
        }
        value
    }

    fn envelope(headers: Option<Vec<(&str, AmqpValue)>>) -> Envelope {
        let mut properties = Properties::default()
            .with_message_id("m-1".into())
            .with_priority(3);
        if let Some(entries) = headers {
            let mut table = FieldTable::default();
            for (name, value) in entries {
                table.insert(name.into(), value);
            }
            properties = properties.with_headers(table);
        }
        Envelope {
            delivery_tag: 9,
            exchange: "ex".to_owned(),
            routing_key: "rk".to_owned(),
            redelivered: true,
            properties,
            body: b"body".to_vec(),
            annotations: Default::default(),
        }
    }

    #[test]
    fn deep_headers_become_a_note_and_the_rest_is_kept() {
        let original = envelope(Some(vec![
            ("deep", nested(500)),
            ("limit", nested(MAX_HEADER_DEPTH)),
            ("over", nested(MAX_HEADER_DEPTH + 1)),
            ("plain", AmqpValue::LongLongInt(42)),
        ]));
        let copy = without_deep_headers(&original);
        let text = |s: &str| AmqpValue::LongString(s.into());
        assert_eq!(
            copy.header("deep"),
            Some(&text("x-switchyard-removed: deep: nested 500 levels"))
        );
        assert_eq!(
            copy.header("over"),
            Some(&text("x-switchyard-removed: over: nested 65 levels"))
        );
        assert_eq!(copy.header("limit"), original.header("limit"));
        assert_eq!(copy.header("plain"), Some(&AmqpValue::LongLongInt(42)));
        assert_eq!(copy.headers().map(|h| h.inner().len()), Some(4));
        assert_eq!(copy.header_depth(), MAX_HEADER_DEPTH);
        assert_eq!(copy.body, original.body);
        assert_eq!(copy.routing_key, original.routing_key);
        assert_eq!(copy.message_id(), "m-1");
        assert_eq!(copy.properties.priority(), &Some(3));
    }

    #[test]
    fn shallow_or_missing_headers_are_unchanged() {
        let shallow = envelope(Some(vec![("a", nested(2))]));
        assert_eq!(
            without_deep_headers(&shallow).properties,
            shallow.properties
        );
        let bare = envelope(None);
        assert_eq!(without_deep_headers(&bare).properties, bare.properties);
    }

    /// The headers list the failed branches, the endpoint each failed on
    /// last (an empty string for none, so the two lists stay aligned) and
    /// the delivered branches, in table order.
    #[test]
    fn a_dead_letter_lists_its_branches_and_endpoints_in_its_headers() {
        use crate::pipeline::outcome::{BranchOutcome, Outcome};
        let failed = |branch: &str, endpoint: Option<&str>| BranchOutcome::Failed {
            branch: branch.into(),
            endpoint: endpoint.map(str::to_owned),
            error: PublishFailure::Nacked,
        };
        let outcome = Outcome {
            trails: Vec::new(),
            branches: vec![
                failed("logging", Some("logging-backup")),
                BranchOutcome::Delivered {
                    branch: "service".into(),
                    endpoint: "primary".to_owned(),
                },
                failed("audit", None),
            ],
        };
        let verdict = outcome.verdict();
        let Verdict::DeadLetter { cause, .. } = &verdict else {
            panic!("a dead letter");
        };
        let letter = Letter {
            reason: cause.reason(),
            error: one_line_text(&cause.to_string()),
            verdict: verdict.clone(),
        };
        let settler = Settler::new(DeadLetterMode::Nack, None, "in", Telemetry::new());
        let (_, headers) = settler.copy(&Arc::new(envelope(None)), &letter, &[]);
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.as_str() == name)
                .map(|(_, v)| v.clone())
        };
        let texts = |items: &[&str]| {
            let items: Vec<AmqpValue> = items
                .iter()
                .map(|i| AmqpValue::LongString((*i).into()))
                .collect();
            Some(AmqpValue::FieldArray(FieldArray::from(items)))
        };
        let text = |s: &str| Some(AmqpValue::LongString(s.into()));
        assert_eq!(header(wire::REASON), text("exhausted"));
        assert_eq!(
            header(wire::ERROR),
            text("logging: nacked by the broker; audit: nacked by the broker")
        );
        assert_eq!(header(wire::FAILED), texts(&["logging", "audit"]));
        assert_eq!(
            header(wire::FAILED_ENDPOINTS),
            texts(&["logging-backup", ""])
        );
        assert_eq!(header(wire::DELIVERED), texts(&["service"]));
        assert_eq!(header(wire::SOURCE_QUEUE), text("in"));
    }

    /// A dead-letter copy that keeps failing as a suspect, alone too, is
    /// retried with the backoff between tries, not in a loop: over ten
    /// seconds of a paused clock it is tried a handful of times, and the
    /// original stays unacked.
    ///
    /// (Before, a suspect tried alone and failing again was tried again at
    /// once, without end.)
    #[tokio::test(start_paused = true)]
    async fn a_suspect_dead_letter_copy_is_retried_with_a_delay() {
        use crate::broker::{Settled, SettledLog};
        use crate::pipeline::outcome::{Barred, Verdict};
        use crate::pipeline::testkit::{Reply, Script, suspect};
        let script = Script::new(|_, _| Reply::Fail(suspect()));
        let endpoint = crate::pipeline::testkit::settings(&["a"], "service", "").endpoints
            [&"a".to_owned()]
            .clone();
        let settler = Settler::new(
            DeadLetterMode::Republish,
            Some((script.clone(), endpoint)),
            "in",
            Telemetry::new(),
        );
        let mut log = SettledLog::default();
        let message = Arc::new(envelope(None));
        let receipt = log.receipt(1);
        let no_route = Barred::NoRoute {
            unparsable_body: None,
        };
        let settling = settler.settle(&message, receipt, Verdict::barred(no_route));
        let timed = tokio::time::timeout(Duration::from_secs(10), settling).await;
        assert!(timed.is_err(), "still retrying");
        let tries = script.calls().len();
        assert!(
            (4..=30).contains(&tries),
            "tried {tries} times in 10 s: alone once, then with the backoff"
        );
        assert_eq!(
            log.drain(),
            [(1, Settled::Requeue)],
            "never acked while unconfirmed; given up, it goes back to the queue"
        );
    }
}
