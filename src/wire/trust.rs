//! Trust: which of a message's `x-switchyard-*` headers the forwarder
//! honours, decided once, when the envelope is built.
//!
//! A message is trusted when its `user_id` property names one of
//! `inbound.trusted_users`. RabbitMQ refuses a publish whose `user_id` is
//! not the publishing connection's own user, so a producer cannot claim a
//! user it has no password for. The forwarder's copies, its dead letters and
//! `dlq redrive` publish with their connection's user, so what they wrote
//! is trusted where that user is listed.
//!
//! From a trusted message the forwarder reads its annotations; from any
//! other it reads none, and says which kinds it ignored. `x-delivery-count`
//! is not the forwarder's: it counts only on a redelivery from a quorum
//! queue, where the broker writes it.

use super::{DELIVERY_COUNT, HOPS, ONLY, OWN_PREFIX, REDRIVEN};
use crate::amqp::{AmqpValue, Properties, value_text};
use std::borrow::Cow;

/// The users whose messages may carry the forwarder's annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trust {
    users: Vec<String>,
}

impl Trust {
    /// Trusting messages published by any of `users`.
    pub fn new(users: Vec<String>) -> Self {
        Self { users }
    }

    /// Whether `properties` carry the `user_id` of a trusted user.
    pub fn trusts(&self, properties: &Properties) -> bool {
        properties
            .user_id()
            .as_ref()
            .is_some_and(|id| self.users.iter().any(|u| u.as_bytes() == id.as_bytes()))
    }

    /// The trusted users, in configuration order.
    pub fn users(&self) -> &[String] {
        &self.users
    }
}

/// How the inbound queue's deliveries are read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reading {
    /// Whose annotations count.
    pub trust: Trust,
    /// The inbound queue is a quorum queue: its redeliveries carry the
    /// broker's `x-delivery-count`.
    pub quorum: bool,
}

/// What the forwarder honours of one message's headers: the only inputs
/// of its decisions that a message carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotations {
    /// The message's `user_id` is a trusted user's.
    pub trusted: bool,
    /// How many times a forwarder forwarded it (`x-switchyard-hops`).
    pub hops: u32,
    /// The only branches it should reach (`x-switchyard-only`).
    pub only: Option<Vec<String>>,
    /// `dlq redrive` put it back (`x-switchyard-redriven`): a closed session
    /// it belongs to opens anew.
    pub redriven: bool,
    /// Earlier deliveries, as the broker counts them: only on a redelivery
    /// from a quorum queue.
    pub delivery_count: Option<u32>,
    /// The kinds of `x-switchyard-*` header it carried that were ignored
    /// because it is not trusted.
    pub ignored: Ignored,
    /// The trace it continues (its `traceparent`), or a new one.
    pub trace: super::Trace,
}

impl Annotations {
    /// Reads `properties` of a delivery (`redelivered` as the broker says).
    pub fn read(properties: &Properties, redelivered: bool, reading: &Reading) -> Self {
        let headers = properties.headers().as_ref();
        let header = |name: &str| headers.and_then(|h| h.inner().get(name));
        let delivery_count = (reading.quorum && redelivered)
            .then(|| header(DELIVERY_COUNT).and_then(number))
            .flatten();
        let trusted = reading.trust.trusts(properties);
        let trace = super::Trace::from_headers(headers);
        if !trusted {
            let mut ignored = Ignored::default();
            for name in headers.iter().flat_map(|h| h.inner().keys()) {
                if let Some(kind) = Kind::of(name.as_str()) {
                    ignored.insert(kind);
                }
            }
            return Self {
                trusted,
                hops: 0,
                only: None,
                redriven: false,
                delivery_count,
                ignored,
                trace,
            };
        }
        Self {
            trusted,
            hops: header(HOPS).and_then(number).unwrap_or(0),
            only: header(ONLY).map(branch_names),
            redriven: header(REDRIVEN).is_some(),
            delivery_count,
            ignored: Ignored::default(),
            trace,
        }
    }
}

fn number(value: &AmqpValue) -> Option<u32> {
    value_text(value).and_then(|t| t.parse().ok())
}

/// Branch names: an array of names (as `dlq redrive` writes it), or a
/// comma-separated string for people setting it by hand.
fn branch_names(value: &AmqpValue) -> Vec<String> {
    match value {
        AmqpValue::FieldArray(items) => items
            .as_slice()
            .iter()
            .filter_map(|v| value_text(v).map(Cow::into_owned))
            .collect(),
        other => value_text(other)
            .map(|t| t.split(',').map(|s| s.trim().to_owned()).collect())
            .unwrap_or_default(),
    }
}

/// A kind of `x-switchyard-*` header, for counting the ignored ones: each
/// header the forwarder knows, and `other` for the rest, so a metric label
/// never takes a producer's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind(u8);

impl Kind {
    /// The kind of header `name`, if it is one of the forwarder's.
    pub fn of(name: &str) -> Option<Self> {
        if !name.starts_with(OWN_PREFIX) {
            return None;
        }
        let known = super::KNOWN.iter().position(|k| *k == name);
        Some(Self(known.map_or(OTHER, |i| i as u8)))
    }

    /// Its label: the header's name, or `other`.
    pub fn label(self) -> &'static str {
        super::KNOWN
            .get(usize::from(self.0))
            .copied()
            .unwrap_or("other")
    }

    /// Its place in [`Kind::all`].
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// Every kind, `other` last.
    pub fn all() -> impl Iterator<Item = Self> {
        (0..=OTHER).map(Self)
    }
}

/// The index of `other`, past every known header.
const OTHER: u8 = super::KNOWN.len() as u8;

/// A set of [`Kind`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ignored(u32);

impl Ignored {
    fn insert(&mut self, kind: Kind) {
        self.0 |= 1 << kind.0;
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The kinds in the set.
    pub fn kinds(self) -> impl Iterator<Item = Kind> {
        Kind::all().filter(move |k| self.0 & (1 << k.0) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::{FieldArray, FieldTable};

    fn properties(user: Option<&str>, headers: &[(&str, AmqpValue)]) -> Properties {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert((*name).into(), value.clone());
        }
        let p = Properties::default().with_headers(table);
        match user {
            Some(user) => p.with_user_id(user.into()),
            None => p,
        }
    }

    fn reading(quorum: bool) -> Reading {
        Reading {
            trust: Trust::new(vec!["switchyard".to_owned(), "upstream".to_owned()]),
            quorum,
        }
    }

    fn text(s: &str) -> AmqpValue {
        AmqpValue::LongString(s.into())
    }

    fn forged() -> Vec<(&'static str, AmqpValue)> {
        vec![
            (ONLY, text("service")),
            (HOPS, AmqpValue::LongLongInt(7)),
            (REDRIVEN, AmqpValue::Boolean(true)),
            ("x-switchyard-reason", text("exhausted")),
            ("x-switchyard-made-up", text("x")),
            ("x-other", text("kept")),
        ]
    }

    #[test]
    fn a_trusted_users_message_is_read_for_every_annotation() {
        for user in ["switchyard", "upstream"] {
            let a = Annotations::read(&properties(Some(user), &forged()), false, &reading(false));
            assert!(a.trusted);
            assert_eq!(a.hops, 7);
            assert_eq!(a.only, Some(vec!["service".to_owned()]));
            assert!(a.redriven);
            assert!(a.ignored.is_empty());
        }
    }

    #[test]
    fn an_untrusted_message_is_read_for_nothing_and_says_which_kinds_it_carried() {
        for user in [None, Some("producer"), Some("Switchyard"), Some("")] {
            let a = Annotations::read(&properties(user, &forged()), false, &reading(false));
            assert!(!a.trusted, "{user:?}");
            assert_eq!((a.hops, &a.only, a.redriven), (0, &None, false));
            let labels: Vec<&str> = a.ignored.kinds().map(Kind::label).collect();
            assert_eq!(
                labels,
                [ONLY, HOPS, REDRIVEN, "x-switchyard-reason", "other"],
                "{user:?}"
            );
        }
    }

    #[test]
    fn only_is_an_array_or_a_comma_separated_list() {
        let array = AmqpValue::FieldArray(FieldArray::from(vec![text("a"), text("b")]));
        for value in [array, text("a, b")] {
            let p = properties(Some("switchyard"), &[(ONLY, value)]);
            let a = Annotations::read(&p, false, &reading(false));
            assert_eq!(a.only, Some(vec!["a".to_owned(), "b".to_owned()]));
        }
    }

    #[test]
    fn the_delivery_count_counts_only_on_a_quorum_queues_redelivery() {
        let p = properties(None, &[(DELIVERY_COUNT, AmqpValue::LongLongInt(99))]);
        let count = |redelivered, quorum| {
            Annotations::read(&p, redelivered, &reading(quorum)).delivery_count
        };
        assert_eq!(count(true, true), Some(99));
        assert_eq!(count(false, true), None);
        assert_eq!(count(true, false), None);
        assert_eq!(count(false, false), None);
    }

    #[test]
    fn every_kind_has_a_fixed_label() {
        assert_eq!(Kind::of("x-other"), None);
        assert_eq!(Kind::of(HOPS).map(Kind::label), Some(HOPS));
        assert_eq!(Kind::of("x-switchyard-").map(Kind::label), Some("other"));
        assert_eq!(Kind::all().count(), super::super::KNOWN.len() + 1);
        assert!(Kind::all().count() <= 32, "the set is a u32");
    }
}
