//! Settle: a [`Verdict`] becomes an ack or a dead letter, and nothing else.
//!
//! Commit acks. A dead letter in `nack` mode is `basic.nack(requeue=false)`:
//! the broker routes it through the inbound queue's dead-letter exchange,
//! which startup verified. In `republish` mode an annotated copy (the
//! `x-switchyard-*` headers of SPEC section 6) is published with a confirm
//! and only then is the original acked; if that copy cannot be confirmed
//! the original is requeued, never dropped.

use super::outcome::Verdict;
use crate::broker::{AmqpValue, FieldArray, PublishFailure, Publisher, Receipt, ShortString};
use crate::config::DeadLetterMode;
use crate::envelope::Envelope;
use crate::telemetry;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Attempts at publishing a dead letter before requeueing the original.
const DEAD_LETTER_ATTEMPTS: u32 = 3;

/// Turns verdicts into settlements.
#[derive(Clone)]
pub struct Settler {
    mode: DeadLetterMode,
    /// Publishes annotated copies in `republish` mode.
    dead_letters: Option<Publisher>,
    source_queue: Arc<str>,
}

impl Settler {
    /// A settler; `dead_letters` is required in `republish` mode.
    pub fn new(mode: DeadLetterMode, dead_letters: Option<Publisher>, source_queue: &str) -> Self {
        Self {
            mode,
            dead_letters,
            source_queue: source_queue.into(),
        }
    }

    /// Settles one message.
    pub async fn settle(&self, envelope: &Arc<Envelope>, receipt: Receipt, verdict: Verdict) {
        let Verdict::DeadLetter {
            reason,
            error,
            failed,
            delivered,
        } = verdict
        else {
            receipt.ack();
            return;
        };
        let message_id = envelope.message_id();
        let reason = reason.as_str();
        let error = one_line(&error);
        match (&self.mode, &self.dead_letters) {
            (DeadLetterMode::Republish, Some(publisher)) => {
                let headers = annotations(reason, &error, &failed, &delivered, &self.source_queue);
                match publish_with_retries(publisher, envelope, headers).await {
                    Ok(()) => {
                        telemetry::dead_lettered(
                            message_id,
                            reason,
                            &error,
                            &failed,
                            &delivered,
                            "republish",
                        );
                        receipt.ack();
                    }
                    Err(e) => {
                        telemetry::dead_letter_failed(message_id, reason, &e);
                        receipt.reject(true);
                    }
                }
            }
            _ => {
                telemetry::dead_lettered(message_id, reason, &error, &failed, &delivered, "nack");
                receipt.reject(false);
            }
        }
    }
}

async fn publish_with_retries(
    publisher: &Publisher,
    envelope: &Arc<Envelope>,
    headers: Vec<(ShortString, AmqpValue)>,
) -> Result<(), PublishFailure> {
    let mut delay = Duration::from_millis(100);
    let mut attempt = 1;
    loop {
        match publisher.publish(envelope.clone(), headers.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if attempt >= DEAD_LETTER_ATTEMPTS => return Err(e),
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
        }
    }
}

/// The `x-switchyard-*` headers of a dead letter.
pub fn annotations(
    reason: &str,
    error: &str,
    failed: &[String],
    delivered: &[String],
    source_queue: &str,
) -> Vec<(ShortString, AmqpValue)> {
    let text = |s: &str| AmqpValue::LongString(s.into());
    let array = |names: &[String]| {
        AmqpValue::FieldArray(FieldArray::from(
            names.iter().map(|n| text(n)).collect::<Vec<_>>(),
        ))
    };
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    vec![
        ("x-switchyard-reason".into(), text(reason)),
        ("x-switchyard-error".into(), text(error)),
        ("x-switchyard-failed".into(), array(failed)),
        ("x-switchyard-delivered".into(), array(delivered)),
        ("x-switchyard-source-queue".into(), text(source_queue)),
        (
            "x-switchyard-dead-lettered-at".into(),
            AmqpValue::LongLongInt(now_ms),
        ),
    ]
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
