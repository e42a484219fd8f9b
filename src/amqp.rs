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
use std::fmt::Write as _;

/// The text of a short string (a property, a header name): itself when it
/// is UTF-8, as the specification says it is; otherwise its valid parts
/// with each byte of the rest written `\xNN`, so that two different byte
/// strings keep different texts and a person sees which bytes came. The
/// bytes themselves are kept for the copy ([`ShortString::as_bytes`]).
pub fn short_text(s: &ShortString) -> Cow<'_, str> {
    if s.is_utf8() {
        return Cow::Borrowed(s.as_str());
    }
    let mut text = String::with_capacity(s.as_bytes().len() * 2);
    for chunk in s.as_bytes().utf8_chunks() {
        text.push_str(chunk.valid());
        for byte in chunk.invalid() {
            let _ = write!(text, "\\x{byte:02x}");
        }
    }
    Cow::Owned(text)
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
        AmqpValue::ShortString(s) => short_text(s),
        AmqpValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()),
        AmqpValue::DecimalValue(_)
        | AmqpValue::FieldArray(_)
        | AmqpValue::FieldTable(_)
        | AmqpValue::ByteArray(_)
        | AmqpValue::Void => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_string_that_is_not_utf8_reads_with_its_bytes_escaped() {
        let utf8 = ShortString::from("order-é");
        assert!(matches!(short_text(&utf8), Cow::Borrowed("order-é")));
        let bad = ShortString::try_from_bytes(b"bad-\xff\xc3(x".to_vec()).unwrap();
        assert_eq!(short_text(&bad), "bad-\\xff\\xc3(x");
        assert_eq!(bad.as_bytes(), b"bad-\xff\xc3(x", "the bytes are kept");
        let other = ShortString::try_from_bytes(b"bad-\xfe\xc3(x".to_vec()).unwrap();
        assert_ne!(short_text(&bad), short_text(&other));
        assert_eq!(
            value_text(&AmqpValue::ShortString(bad)).as_deref(),
            Some("bad-\\xff\\xc3(x")
        );
    }
}
