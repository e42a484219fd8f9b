//! The message as the pipeline sees it: one inbound delivery, owned, with the
//! accessors filters and deliveries need. Carries no broker handle; the
//! receipt to settle it travels beside it. Its `Debug` never shows header
//! values (they can be arbitrarily nested), and [`Envelope::header_depth`]
//! measures how deep they nest without recursing.

pub use crate::amqp::value_text;
use crate::amqp::{AmqpValue, FieldTable, Properties, short_text};
use crate::wire::Annotations;
use std::borrow::Cow;

/// The deepest nesting of tables and arrays a message's headers may have to
/// be forwarded. Real headers nest a handful of levels (`x-death` nests 3);
/// a deeper message is dead-lettered as malformed.
pub const MAX_HEADER_DEPTH: usize = 64;

/// One inbound message.
#[derive(Clone)]
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
    /// What the forwarder honours of its headers, decided when it arrived.
    pub annotations: Annotations,
}

impl Envelope {
    /// The message_id property, or `-` for logs when there is none; bytes
    /// that are not UTF-8 written `\xNN` ([`short_text`]).
    pub fn message_id(&self) -> Cow<'_, str> {
        self.properties
            .message_id()
            .as_ref()
            .map_or(Cow::Borrowed("-"), short_text)
    }

    /// How deep the headers nest: 0 without headers or with scalar values
    /// only, 1 for a table or array value holding scalars, one more for each
    /// table or array inside it. Computed with an explicit stack, so any
    /// depth is safe to measure.
    pub fn header_depth(&self) -> usize {
        self.headers()
            .map_or(0, |h| deepest(h.inner().values().map(|v| (v, 0))))
    }

    /// The message headers, if any.
    pub fn headers(&self) -> Option<&FieldTable> {
        self.properties.headers().as_ref()
    }

    /// A header by name.
    pub fn header(&self, name: &str) -> Option<&AmqpValue> {
        self.headers().and_then(|h| h.inner().get(name))
    }
}

/// The namespace of content-derived copy ids (a fixed, random UUID).
const COPY_ID_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x6b1f_58c2_9d47_4e0b_a3c5_2f8e_71d0_94aa);

impl Envelope {
    /// The copy id of this message on `branch` (`x-switchyard-copy-id`):
    /// `<branch>:<message_id>` when the message has a `message_id`, so every
    /// delivery of it, by any instance, gets the same id; without one,
    /// `<branch>:content-<uuid>`, the uuid a name-based one (version 5) of
    /// the routing key and the body, so identical messages without ids
    /// share copy ids.
    pub fn copy_id(&self, branch: &str) -> String {
        let Some(id) = self.properties.message_id() else {
            return format!("{branch}:content-{}", self.content_uuid());
        };
        let id = short_text(id);
        let mut copy_id = String::with_capacity(branch.len() + 1 + id.len());
        copy_id.push_str(branch);
        copy_id.push(':');
        copy_id.push_str(&id);
        copy_id
    }

    /// A name-based UUID of the routing key and the body.
    pub fn content_uuid(&self) -> uuid::Uuid {
        // Each part with its length in front, so no two messages' parts run
        // together into the same name.
        let mut name: Vec<u8> = Vec::with_capacity(self.body.len() + self.routing_key.len() + 16);
        for part in [self.routing_key.as_bytes(), &self.body] {
            name.extend_from_slice(&(part.len() as u64).to_be_bytes());
            name.extend_from_slice(part);
        }
        uuid::Uuid::new_v5(&COPY_ID_NAMESPACE, &name)
    }
}

impl std::fmt::Debug for Envelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envelope")
            .field("delivery_tag", &self.delivery_tag)
            .field("message_id", &self.message_id())
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("redelivered", &self.redelivered)
            .field(
                "header_count",
                &self.headers().map_or(0, |h| h.inner().len()),
            )
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// How deep `value` nests: 0 for a scalar, 1 for a table or array of
/// scalars, and so on. Iterative, like [`Envelope::header_depth`].
pub fn value_depth(value: &AmqpValue) -> usize {
    deepest(std::iter::once((value, 0)))
}

/// The deepest nesting under `roots`, each given with the depth of the
/// container holding it.
fn deepest<'a>(roots: impl Iterator<Item = (&'a AmqpValue, usize)>) -> usize {
    // Only containers are queued, so the common message (scalar headers
    // only) is walked without allocating.
    let mut pending: Vec<(&AmqpValue, usize)> = Vec::new();
    pending.extend(roots.filter(|(v, _)| is_container(v)));
    let mut max = 0;
    while let Some((value, outer)) = pending.pop() {
        max = max.max(outer + 1);
        let inner = outer + 1;
        match value {
            AmqpValue::FieldTable(table) => pending.extend(
                table
                    .inner()
                    .values()
                    .filter(|v| is_container(v))
                    .map(|v| (v, inner)),
            ),
            AmqpValue::FieldArray(array) => pending.extend(
                array
                    .as_slice()
                    .iter()
                    .filter(|v| is_container(v))
                    .map(|v| (v, inner)),
            ),
            _ => {}
        }
    }
    max
}

fn is_container(value: &AmqpValue) -> bool {
    matches!(value, AmqpValue::FieldTable(_) | AmqpValue::FieldArray(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::{FieldArray, Properties};

    fn envelope(headers: Option<FieldTable>) -> Envelope {
        let properties = match headers {
            Some(h) => Properties::default().with_headers(h),
            None => Properties::default(),
        };
        Envelope {
            delivery_tag: 1,
            exchange: String::new(),
            routing_key: "rk".to_owned(),
            redelivered: false,
            properties,
            body: Vec::new(),
            annotations: Default::default(),
        }
    }

    #[test]
    fn a_copy_id_is_the_same_for_the_same_message_and_branch_only() {
        let with_id = |id: &str, body: &[u8]| {
            let mut e = envelope(None);
            e.properties = Properties::default().with_message_id(id.into());
            e.body = body.to_vec();
            e
        };
        let (a, again) = (with_id("m-1", b"x"), with_id("m-1", b"other body"));
        assert_eq!(a.copy_id("service"), "service:m-1");
        assert_eq!(
            a.copy_id("service"),
            again.copy_id("service"),
            "by message_id"
        );
        assert_ne!(a.copy_id("service"), a.copy_id("logging"));
        // Without a message_id: the routing key and the body.
        let mut plain = envelope(None);
        plain.body = b"x".to_vec();
        let mut same = plain.clone();
        same.delivery_tag = 9;
        let copy_id = plain.copy_id("service");
        assert_eq!(copy_id, same.copy_id("service"));
        let uuid = copy_id.strip_prefix("service:content-").unwrap_or_default();
        assert_eq!(
            uuid::Uuid::parse_str(uuid).map(|u| u.get_version_num()),
            Ok(5)
        );
        same.body = b"y".to_vec();
        assert_ne!(copy_id, same.copy_id("service"));
        same.body = b"x".to_vec();
        same.routing_key = "rk2".to_owned();
        assert_ne!(copy_id, same.copy_id("service"));
    }

    fn table(entries: Vec<(&str, AmqpValue)>) -> AmqpValue {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert(k.into(), v);
        }
        AmqpValue::FieldTable(t)
    }

    fn array(items: Vec<AmqpValue>) -> AmqpValue {
        AmqpValue::FieldArray(FieldArray::from(items))
    }

    fn headers(entries: Vec<(&str, AmqpValue)>) -> Option<FieldTable> {
        match table(entries) {
            AmqpValue::FieldTable(t) => Some(t),
            _ => None,
        }
    }

    /// `depth` levels, alternating tables and arrays when `mixed`.
    fn nested(depth: usize, kind: &str) -> AmqpValue {
        let mut v = AmqpValue::LongString("leaf".into());
        for level in 0..depth {
            v = match (kind, level % 2) {
                ("array", _) | ("mixed", 1) => array(vec![v]),
                _ => table(vec![("k", v)]),
            };
        }
        v
    }

    fn text(s: &str) -> AmqpValue {
        AmqpValue::LongString(s.into())
    }

    #[test]
    fn no_headers_and_scalar_headers_have_depth_zero() {
        assert_eq!(envelope(None).header_depth(), 0);
        assert_eq!(envelope(headers(vec![])).header_depth(), 0);
        let flat = headers(vec![("a", text("x")), ("b", AmqpValue::LongLongInt(7))]);
        assert_eq!(envelope(flat).header_depth(), 0);
    }

    #[test]
    fn empty_containers_count_as_one_level() {
        assert_eq!(
            envelope(headers(vec![("t", table(vec![]))])).header_depth(),
            1
        );
        assert_eq!(
            envelope(headers(vec![("a", array(vec![]))])).header_depth(),
            1
        );
    }

    #[test]
    fn depth_counts_nested_tables_arrays_and_mixes() {
        for kind in ["table", "array", "mixed"] {
            for depth in [1, 2, 3, 64, 65, 1000] {
                let h = headers(vec![("flat", text("x")), ("deep", nested(depth, kind))]);
                assert_eq!(envelope(h).header_depth(), depth, "{kind} {depth}");
            }
        }
    }

    #[test]
    fn depth_is_the_deepest_branch() {
        // x-death's shape: an array of tables holding an array.
        let death = array(vec![
            table(vec![("count", AmqpValue::LongLongInt(1))]),
            table(vec![("routing-keys", array(vec![text("rk")]))]),
        ]);
        let h = headers(vec![
            ("x-death", death.clone()),
            ("shallow", array(vec![text("a"), text("b")])),
        ]);
        assert_eq!(envelope(h).header_depth(), 3);
        assert_eq!(value_depth(&death), 3);
        assert_eq!(value_depth(&text("x")), 0);
        assert_eq!(value_depth(&nested(7, "mixed")), 7);
    }

    #[test]
    fn measuring_does_not_recurse() {
        // Built and dropped on a thread with room for that; measured on one
        // with 256 KiB, far less than a recursive walk of 20,000 levels needs.
        let big = std::thread::Builder::new().stack_size(256 << 20);
        let depth = big
            .spawn(|| {
                let e = envelope(headers(vec![("deep", nested(20_000, "mixed"))]));
                std::thread::scope(|s| {
                    std::thread::Builder::new()
                        .stack_size(256 << 10)
                        .spawn_scoped(s, || e.header_depth())
                        .unwrap()
                        .join()
                        .unwrap()
                })
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(depth, 20_000);
    }

    #[test]
    fn debug_never_shows_header_values() {
        let e = envelope(headers(vec![("secret", text("hunter2"))]));
        let shown = format!("{e:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("header_count: 1"), "{shown}");
    }
}
