//! The encoded size of a content header frame, computed without encoding it.
//!
//! A content header must fit in one frame of the connection's `frame_max`;
//! one that does not makes RabbitMQ close the whole connection
//! (`FRAME_ERROR`), failing every publish in flight on it. Checking the size
//! before publishing keeps one oversized message from harming the others.
//! The walk is iterative, so a deeply nested header cannot overflow the stack.

use crate::amqp::{AmqpValue, FieldTable, Properties};

/// Frame type, channel, payload size and frame end around every payload.
const FRAME_OVERHEAD: usize = 8;
/// Class id, weight, body size and the property flags of a content header.
const HEADER_FIXED: usize = 2 + 2 + 8 + 2;

/// Size in bytes of the content header frame carrying `properties`.
pub fn content_header_frame(properties: &Properties) -> usize {
    let short =
        |s: &Option<lapin::types::ShortString>| s.as_ref().map_or(0, |s| 1 + s.as_bytes().len());
    let mut size = FRAME_OVERHEAD + HEADER_FIXED;
    size += short(properties.content_type());
    size += short(properties.content_encoding());
    size += properties.headers().as_ref().map_or(0, table_size);
    size += properties.delivery_mode().map_or(0, |_| 1);
    size += properties.priority().map_or(0, |_| 1);
    size += short(properties.correlation_id());
    size += short(properties.reply_to());
    size += short(properties.expiration());
    size += short(properties.message_id());
    size += properties.timestamp().map_or(0, |_| 8);
    size += short(properties.kind());
    size += short(properties.user_id());
    size += short(properties.app_id());
    size += short(properties.cluster_id());
    size
}

/// Encoded size of a field table: its length prefix and every entry.
pub fn table_size(table: &FieldTable) -> usize {
    // Nested containers are queued rather than recursed into; scalars are
    // counted in place, so flat headers are measured without allocating.
    let mut nested: Vec<&AmqpValue> = Vec::new();
    let mut size = 4;
    for (key, value) in table.inner() {
        size += 1 + key.as_bytes().len() + value_size(value, &mut nested);
    }
    while let Some(container) = nested.pop() {
        match container {
            AmqpValue::FieldArray(items) => {
                for value in items.as_slice() {
                    size += value_size(value, &mut nested);
                }
            }
            AmqpValue::FieldTable(inner) => {
                for (key, value) in inner.inner() {
                    size += 1 + key.as_bytes().len() + value_size(value, &mut nested);
                }
            }
            _ => {}
        }
    }
    size
}

/// The encoded size of `value` itself (type tag and payload); a container's
/// elements are left in `nested` to be counted by the caller.
fn value_size<'a>(value: &'a AmqpValue, nested: &mut Vec<&'a AmqpValue>) -> usize {
    1 + match value {
        AmqpValue::Boolean(_) | AmqpValue::ShortShortInt(_) | AmqpValue::ShortShortUInt(_) => 1,
        AmqpValue::ShortInt(_) | AmqpValue::ShortUInt(_) => 2,
        AmqpValue::LongInt(_) | AmqpValue::LongUInt(_) | AmqpValue::Float(_) => 4,
        AmqpValue::LongLongInt(_) | AmqpValue::Double(_) | AmqpValue::Timestamp(_) => 8,
        AmqpValue::DecimalValue(_) => 5,
        AmqpValue::ShortString(s) => 1 + s.as_bytes().len(),
        AmqpValue::LongString(s) => 4 + s.as_bytes().len(),
        AmqpValue::ByteArray(b) => 4 + b.as_slice().len(),
        AmqpValue::Void => 0,
        AmqpValue::FieldArray(_) | AmqpValue::FieldTable(_) => {
            nested.push(value);
            4
        }
    }
}

#[cfg(test)]
mod tests {
    use super::content_header_frame;
    use crate::amqp::{AmqpValue, FieldArray, FieldTable, Properties};
    use lapin::protocol::basic::gen_properties;

    /// The computed size equals what the protocol library encodes.
    fn encoded(properties: &Properties) -> usize {
        let (buffer, _) = cookie_factory::r#gen(gen_properties(properties), Vec::new())
            .unwrap_or_else(|e| panic!("{e:?}"));
        // gen_properties writes the flags and the properties.
        8 + 2 + 2 + 8 + buffer.len()
    }

    #[test]
    fn sizes_match_the_encoder() {
        let mut nested = FieldTable::default();
        nested.insert("n".into(), AmqpValue::LongLongInt(7));
        nested.insert("s".into(), AmqpValue::ShortString("abc".into()));
        let mut headers = FieldTable::default();
        headers.insert("text".into(), AmqpValue::LongString("hello".into()));
        headers.insert("flag".into(), AmqpValue::Boolean(true));
        headers.insert("table".into(), AmqpValue::FieldTable(nested.clone()));
        headers.insert(
            "array".into(),
            AmqpValue::FieldArray(FieldArray::from(vec![
                AmqpValue::FieldTable(nested),
                AmqpValue::Double(1.5),
                AmqpValue::Void,
                AmqpValue::ByteArray(vec![1u8, 2, 3].into()),
            ])),
        );
        let cases = [
            Properties::default(),
            Properties::default()
                .with_message_id("m-1".into())
                .with_delivery_mode(2)
                .with_timestamp(5),
            Properties::default()
                .with_headers(headers)
                .with_content_type("application/json".into())
                .with_priority(3)
                .with_user_id("guest".into())
                .with_app_id("a".into())
                .with_expiration("6000".into()),
        ];
        for properties in cases {
            assert_eq!(content_header_frame(&properties), encoded(&properties));
        }
    }
}
