//! What a session's messages are made of and how its end is told: the id
//! and end headers, an arrival with its receipt and prefetch slot, and the
//! annotation its dead letters carry. Shared by the registry and the task.

use crate::amqp::{AmqpValue, ShortString};
use crate::broker::Receipt;
use crate::config;
use crate::envelope::{Envelope, value_text};
use crate::pipeline::outcome::Barred;
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;

/// One inbound message of a session, with its right to settle and its
/// prefetch slot.
pub(crate) struct Arrival {
    pub(crate) envelope: Arc<Envelope>,
    pub(crate) receipt: Receipt,
    pub(crate) permit: OwnedSemaphorePermit,
    /// Why the screen bars the message, if it does: the whole session is
    /// dead-lettered with it.
    pub(crate) refused: Option<Barred>,
    /// When it was consumed, for the journal.
    pub(crate) received_at: std::time::SystemTime,
}

/// The longest session id kept, in bytes: every open, waiting and recently
/// closed session is remembered by its id, and ids come from producers.
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// The session a message belongs to, if any: the text of its id header,
/// when it is not empty and not over [`MAX_SESSION_ID_BYTES`].
pub(crate) fn session_id(envelope: &Envelope, config: &config::Sessions) -> Option<Arc<str>> {
    let text = value_text(envelope.header(&config.id_header)?)?;
    (!text.is_empty() && text.len() <= MAX_SESSION_ID_BYTES).then(|| Arc::from(text.as_ref()))
}

/// Why a message is barred for its session id: one over
/// [`MAX_SESSION_ID_BYTES`] is dead-lettered alone as `malformed`.
pub(crate) fn oversized_id(envelope: &Envelope, config: &config::Sessions) -> Option<Barred> {
    let text = value_text(envelope.header(&config.id_header)?)?;
    (text.len() > MAX_SESSION_ID_BYTES).then_some(Barred::SessionIdTooLong {
        bytes: text.len(),
        limit: MAX_SESSION_ID_BYTES,
    })
}

/// Whether the message ends its session: its end header is the boolean
/// true or the text "true" in any case.
pub(crate) fn is_end(envelope: &Envelope, config: &config::Sessions) -> bool {
    match envelope.header(&config.end_header) {
        Some(AmqpValue::Boolean(end)) => *end,
        Some(value) => value_text(value).is_some_and(|t| t.eq_ignore_ascii_case("true")),
        None => false,
    }
}

/// The `x-switchyard-session` annotation of a session's dead letters.
pub(super) fn annotation(id: &str) -> Vec<(ShortString, AmqpValue)> {
    vec![(
        crate::wire::SESSION.into(),
        AmqpValue::LongString(id.into()),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::{FieldTable, Properties};
    use std::time::Duration;

    fn config() -> config::Sessions {
        config::Sessions {
            id_header: "session-id".to_owned(),
            end_header: "session-end".to_owned(),
            idle_timeout: Duration::from_secs(30),
            max_messages: 50,
            max_bytes: 1 << 20,
            max_open: 4,
            closed_ttl: Duration::from_secs(60),
        }
    }

    fn envelope(headers: Vec<(&str, AmqpValue)>) -> Envelope {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert(name.into(), value);
        }
        Envelope {
            delivery_tag: 1,
            exchange: String::new(),
            routing_key: "in".to_owned(),
            redelivered: false,
            properties: Properties::default().with_headers(table),
            body: Vec::new(),
            annotations: Default::default(),
        }
    }

    fn text(s: &str) -> AmqpValue {
        AmqpValue::LongString(s.into())
    }

    #[test]
    fn the_id_is_the_headers_text_and_an_empty_or_missing_one_is_independent() {
        let config = config();
        let id = |headers| session_id(&envelope(headers), &config).map(|id| id.to_string());
        assert_eq!(
            id(vec![("session-id", text("order-7"))]),
            Some("order-7".to_owned())
        );
        assert_eq!(
            id(vec![("session-id", AmqpValue::ShortString("s".into()))]),
            Some("s".to_owned())
        );
        assert_eq!(
            id(vec![("session-id", AmqpValue::LongLongInt(42))]),
            Some("42".to_owned())
        );
        assert_eq!(id(vec![("session-id", text(""))]), None);
        let longest = "s".repeat(MAX_SESSION_ID_BYTES);
        assert_eq!(
            id(vec![("session-id", text(&longest))]),
            Some(longest.clone())
        );
        let over = format!("{longest}s");
        assert_eq!(id(vec![("session-id", text(&over))]), None);
        assert_eq!(
            oversized_id(&envelope(vec![("session-id", text(&over))]), &config),
            Some(Barred::SessionIdTooLong {
                bytes: MAX_SESSION_ID_BYTES + 1,
                limit: MAX_SESSION_ID_BYTES
            })
        );
        assert_eq!(
            oversized_id(&envelope(vec![("session-id", text(&longest))]), &config),
            None
        );
        assert_eq!(id(vec![("other", text("x"))]), None);
        assert_eq!(
            id(vec![(
                "session-id",
                AmqpValue::FieldTable(FieldTable::default())
            )]),
            None
        );
    }

    #[test]
    fn the_end_is_boolean_true_or_the_text_true_in_any_case() {
        let config = config();
        let end = |value: Option<AmqpValue>| {
            let headers = value.map(|v| vec![("session-end", v)]).unwrap_or_default();
            is_end(&envelope(headers), &config)
        };
        assert!(end(Some(AmqpValue::Boolean(true))));
        assert!(end(Some(text("true"))));
        assert!(end(Some(text("TRUE"))));
        assert!(end(Some(AmqpValue::ShortString("True".into()))));
        assert!(!end(Some(AmqpValue::Boolean(false))));
        assert!(!end(Some(text("yes"))));
        assert!(!end(Some(AmqpValue::LongLongInt(1))));
        assert!(!end(None));
    }
}
