//! The AMQP values a message is made of (properties, header tables and
//! their field values), named once for the whole crate. They are the client
//! library's own types: an envelope carries them as the broker sent them,
//! and a copy goes out with them unchanged; [`value_text`] reads a scalar
//! as text. Every other use of the client
//! library (connections, channels, confirms) stays in [`crate::broker`].

/// AMQP message properties, headers included.
pub type Properties = lapin::BasicProperties;
/// An AMQP field value, and the tables, arrays and strings it is made of.
pub use lapin::types::{AMQPValue as AmqpValue, FieldArray, FieldTable, LongString, ShortString};

use std::borrow::Cow;

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
