//! The message as the pipeline sees it: one inbound delivery, owned, with the
//! accessors filters and deliveries need. Carries no broker handle; the
//! receipt to settle it travels beside it.

use crate::broker::{AmqpValue, FieldTable, Properties};
use std::borrow::Cow;

/// Header naming the only branches a message should reach (set by redrive).
pub const ONLY_HEADER: &str = "x-switchyard-only";
/// Header counting how many times a message was forwarded.
pub const HOPS_HEADER: &str = "x-switchyard-hops";
/// Prefix of every header the forwarder owns; producers' are stripped.
pub const OWN_PREFIX: &str = "x-switchyard-";

/// One inbound message.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// Delivery tag on the consuming channel.
    pub delivery_tag: u64,
    /// Exchange the message was published to.
    pub exchange: String,
    /// Routing key the message was published with.
    pub routing_key: String,
    /// Whether the broker delivered it before.
    pub redelivered: bool,
    /// Every AMQP property, headers included, kept as received.
    pub properties: Properties,
    /// The body, byte for byte.
    pub body: Vec<u8>,
}

impl Envelope {
    /// The message_id property, or `-` for logs when there is none.
    pub fn message_id(&self) -> &str {
        self.properties
            .message_id()
            .as_ref()
            .map_or("-", |id| id.as_str())
    }

    /// The message headers, if any.
    pub fn headers(&self) -> Option<&FieldTable> {
        self.properties.headers().as_ref()
    }

    /// A header by name.
    pub fn header(&self, name: &str) -> Option<&AmqpValue> {
        self.headers().and_then(|h| h.inner().get(name))
    }

    /// How many times this message was forwarded before (`x-switchyard-hops`;
    /// 0 when absent or not a number).
    pub fn hops(&self) -> u32 {
        self.header(HOPS_HEADER)
            .and_then(value_text)
            .and_then(|t| t.parse().ok())
            .unwrap_or(0)
    }

    /// Branch names from `x-switchyard-only`, if the header is present: an
    /// array of names (as `dlq redrive` writes it), or a comma-separated
    /// string for people setting it by hand.
    pub fn only_branches(&self) -> Option<Vec<String>> {
        let value = self.header(ONLY_HEADER)?;
        Some(match value {
            AmqpValue::FieldArray(items) => items
                .as_slice()
                .iter()
                .filter_map(|v| value_text(v).map(Cow::into_owned))
                .collect(),
            other => value_text(other)
                .map(|t| t.split(',').map(|s| s.trim().to_owned()).collect())
                .unwrap_or_default(),
        })
    }
}

/// The text form of a scalar AMQP value: strings as UTF-8 (lossy), numbers
/// in decimal, booleans as `true`/`false`. Arrays, tables, byte arrays and
/// void have none.
pub fn value_text(value: &AmqpValue) -> Option<Cow<'_, str>> {
    Some(match value {
        AmqpValue::Boolean(b) => Cow::Owned(b.to_string()),
        AmqpValue::ShortShortInt(n) => Cow::Owned(n.to_string()),
        AmqpValue::ShortShortUInt(n) => Cow::Owned(n.to_string()),
        AmqpValue::ShortInt(n) => Cow::Owned(n.to_string()),
        AmqpValue::ShortUInt(n) => Cow::Owned(n.to_string()),
        AmqpValue::LongInt(n) => Cow::Owned(n.to_string()),
        AmqpValue::LongUInt(n) => Cow::Owned(n.to_string()),
        AmqpValue::LongLongInt(n) => Cow::Owned(n.to_string()),
        AmqpValue::Float(f) => Cow::Owned(f.to_string()),
        AmqpValue::Double(f) => Cow::Owned(f.to_string()),
        AmqpValue::Timestamp(t) => Cow::Owned(t.to_string()),
        AmqpValue::ShortString(s) => Cow::Borrowed(s.as_str()),
        AmqpValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()),
        AmqpValue::DecimalValue(_)
        | AmqpValue::FieldArray(_)
        | AmqpValue::FieldTable(_)
        | AmqpValue::ByteArray(_)
        | AmqpValue::Void => return None,
    })
}
