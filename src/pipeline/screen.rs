//! Screen: checks a message before routing and returns the verdict for one
//! that must not be forwarded:
//!
//! - `malformed`: headers nested deeper than [`MAX_HEADER_DEPTH`] (the check
//!   never recurses and never formats a header value);
//! - `loop`: already forwarded `inbound.max_hops` times (the trusted
//!   `x-switchyard-hops`, [`Annotations::hops`]);
//! - `poison`: delivered more than `inbound.max_redeliveries` times before.
//!   A first delivery has been delivered 0 times, whatever its headers say.
//!   A redelivery from a quorum inbound queue counts in the broker's
//!   `x-delivery-count` ([`Annotations::delivery_count`]); for other queues
//!   the screen counts redelivered copies of the same message (by
//!   message_id, or by a hash of the body when there is none) in a bounded
//!   memory of recent messages, which a restart forgets.
//!
//! It reads no header itself: what a message may claim was decided when
//! its envelope was built.
//!
//! [`Annotations::hops`]: crate::wire::Annotations
//! [`Annotations::delivery_count`]: crate::wire::Annotations

use super::outcome::Barred;
use crate::envelope::{Envelope, MAX_HEADER_DEPTH};
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

/// Messages remembered per generation of the redelivery memory.
const REMEMBERED: usize = 50_000;

/// The checks, with the redelivery memory they need.
#[derive(Debug)]
pub struct Screen {
    max_hops: u32,
    max_redeliveries: u32,
    redeliveries: Mutex<Memory>,
}

/// Two generations of counts: when the young one fills up it becomes the
/// old one, so memory stays bounded and recent messages are kept.
#[derive(Debug, Default)]
struct Memory {
    young: HashMap<u64, u32>,
    old: HashMap<u64, u32>,
}

impl Memory {
    fn bump(&mut self, key: u64) -> u32 {
        let seen = self.young.get(&key).or(self.old.get(&key)).copied();
        let count = seen.unwrap_or(0) + 1;
        if self.young.len() >= REMEMBERED && !self.young.contains_key(&key) {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key, count);
        count
    }
}

impl Screen {
    /// Checks with the configured limits.
    pub fn new(max_hops: u32, max_redeliveries: u32) -> Self {
        Self {
            max_hops,
            max_redeliveries,
            redeliveries: Mutex::new(Memory::default()),
        }
    }

    /// `None` when `envelope` may be routed; otherwise why it is barred.
    pub fn check(&self, envelope: &Envelope) -> Option<Barred> {
        let depth = envelope.header_depth();
        if depth > MAX_HEADER_DEPTH {
            return Some(Barred::Malformed {
                depth,
                limit: MAX_HEADER_DEPTH,
            });
        }
        let hops = envelope.annotations.hops;
        if hops >= self.max_hops {
            return Some(Barred::Loop {
                hops,
                max: self.max_hops,
            });
        }
        let redeliveries = self.redeliveries(envelope);
        (redeliveries > self.max_redeliveries).then(|| Barred::Poison {
            deliveries: redeliveries.saturating_add(1),
            max: self.max_redeliveries,
        })
    }

    /// How many times this message was delivered before.
    fn redeliveries(&self, envelope: &Envelope) -> u32 {
        if !envelope.redelivered {
            return 0;
        }
        if let Some(count) = envelope.annotations.delivery_count {
            return count;
        }
        let mut memory = self.redeliveries.lock().unwrap_or_else(|e| e.into_inner());
        memory.bump(identity(envelope))
    }
}

/// What makes two deliveries the same message.
fn identity(envelope: &Envelope) -> u64 {
    let mut hasher = DefaultHasher::new();
    match envelope.properties.message_id() {
        Some(id) => id.as_bytes().hash(&mut hasher),
        None => {
            envelope.routing_key.hash(&mut hasher);
            envelope.body.hash(&mut hasher);
        }
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::{AmqpValue, FieldArray, FieldTable, Properties};
    use crate::pipeline::outcome::Reason;
    use crate::wire::{Annotations, Reading, Trust};

    /// A delivery as the inbound channel builds it: from a quorum queue when
    /// `quorum`, published by the trusted user `switchyard`.
    fn delivered(headers: FieldTable, redelivered: bool, quorum: bool) -> Envelope {
        let properties = Properties::default()
            .with_message_id("m-1".into())
            .with_user_id("switchyard".into())
            .with_headers(headers);
        let reading = Reading {
            trust: Trust::new(vec!["switchyard".to_owned()]),
            quorum,
        };
        Envelope {
            delivery_tag: 1,
            exchange: String::new(),
            routing_key: String::new(),
            redelivered,
            annotations: Annotations::read(&properties, redelivered, &reading),
            properties,
            body: b"body".to_vec(),
        }
    }

    fn envelope(headers: FieldTable, redelivered: bool) -> Envelope {
        delivered(headers, redelivered, false)
    }

    fn with_depth(depth: usize) -> Envelope {
        let mut value = AmqpValue::Boolean(true);
        for _ in 0..depth {
            value = AmqpValue::FieldArray(FieldArray::from(vec![value]));
        }
        let mut headers = FieldTable::default();
        headers.insert("h".into(), value);
        envelope(headers, false)
    }

    fn with_header(name: &str, value: AmqpValue, redelivered: bool) -> Envelope {
        on_queue(name, value, redelivered, false)
    }

    fn on_queue(name: &str, value: AmqpValue, redelivered: bool, quorum: bool) -> Envelope {
        let mut headers = FieldTable::default();
        headers.insert(name.into(), value);
        delivered(headers, redelivered, quorum)
    }

    fn reason(barred: Option<Barred>) -> Option<Reason> {
        barred.map(|b| b.reason())
    }

    #[test]
    fn headers_at_the_limit_pass() {
        let screen = Screen::new(8, 10);
        assert_eq!(screen.check(&with_depth(0)), None);
        assert_eq!(screen.check(&with_depth(MAX_HEADER_DEPTH)), None);
    }

    #[test]
    fn deeper_headers_are_malformed_with_the_depth_in_the_error() {
        let screen = Screen::new(8, 10);
        let barred = screen.check(&with_depth(3000));
        assert_eq!(
            barred,
            Some(Barred::Malformed {
                depth: 3000,
                limit: MAX_HEADER_DEPTH
            })
        );
        assert_eq!(
            barred.map(|b| b.to_string()).as_deref(),
            Some("headers nest 3000 levels deep (limit 64)")
        );
        assert!(screen.check(&with_depth(MAX_HEADER_DEPTH + 1)).is_some());
    }

    #[test]
    fn a_message_forwarded_max_hops_times_is_a_loop() {
        let screen = Screen::new(8, 10);
        let hops = |n: i64| with_header("x-switchyard-hops", AmqpValue::LongLongInt(n), false);
        assert_eq!(screen.check(&hops(7)), None);
        assert_eq!(reason(screen.check(&hops(8))), Some(Reason::Loop));
        let text = with_header(
            "x-switchyard-hops",
            AmqpValue::LongString("9".into()),
            false,
        );
        assert_eq!(reason(screen.check(&text)), Some(Reason::Loop));
    }

    #[test]
    fn a_quorum_delivery_count_past_the_limit_is_poison() {
        let screen = Screen::new(8, 3);
        let count = |n: i64| on_queue("x-delivery-count", AmqpValue::LongLongInt(n), true, true);
        assert_eq!(screen.check(&count(3)), None);
        assert_eq!(reason(screen.check(&count(4))), Some(Reason::Poison));
    }

    #[test]
    fn a_producers_delivery_count_counts_for_nothing() {
        let count = |n: i64, redelivered, quorum| {
            on_queue(
                "x-delivery-count",
                AmqpValue::LongLongInt(n),
                redelivered,
                quorum,
            )
        };
        // A first delivery, on any queue, whatever it says.
        for quorum in [true, false] {
            let screen = Screen::new(8, 3);
            assert_eq!(
                screen.check(&count(99, false, quorum)),
                None,
                "quorum {quorum}"
            );
        }
        // A classic queue's redelivery: the forwarder's own count, from 1.
        let screen = Screen::new(8, 3);
        assert_eq!(screen.check(&count(99, true, false)), None);
        let zero = Screen::new(8, 0);
        assert_eq!(
            reason(zero.check(&count(0, true, false))),
            Some(Reason::Poison),
            "a forged 0 does not lift the limit"
        );
    }

    #[test]
    fn redelivered_copies_are_counted_and_first_deliveries_are_not() {
        let screen = Screen::new(8, 3);
        let fresh = envelope(FieldTable::default(), false);
        let again = envelope(FieldTable::default(), true);
        assert_eq!(screen.check(&fresh), None);
        for _ in 0..3 {
            assert_eq!(screen.check(&again), None);
        }
        assert_eq!(reason(screen.check(&again)), Some(Reason::Poison));
        assert_eq!(
            screen.check(&fresh),
            None,
            "a first delivery is never poison"
        );
    }

    #[test]
    fn the_memory_stays_bounded_and_keeps_recent_messages() {
        let mut memory = Memory::default();
        for key in 0..(3 * REMEMBERED as u64) {
            memory.bump(key);
        }
        assert!(memory.young.len() + memory.old.len() <= 2 * REMEMBERED);
        assert_eq!(memory.bump(3 * REMEMBERED as u64 - 1), 2);
    }
}
