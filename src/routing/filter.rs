//! Compiled filters: evaluated against an [`Envelope`], pure and infallible.
//! A value that cannot be read (a missing header, a body that does not
//! parse) simply does not match.

use super::topic::TopicPattern;
use crate::broker::ShortString;
use crate::envelope::{Envelope, value_text};
use regex::Regex;
use std::borrow::Cow;
use std::sync::Arc;

/// A compiled filter.
#[derive(Debug)]
pub enum Filter {
    /// Always matches.
    MatchAll,
    /// An AMQP header tested by its text form.
    Header {
        /// Header name.
        name: String,
        /// The test.
        test: ValueTest,
    },
    /// An AMQP property tested by its text form.
    Property {
        /// Which property.
        property: Property,
        /// The test.
        test: ValueTest,
    },
    /// The routing key the message was published with.
    RoutingKey(TopicPattern),
    /// All of these match.
    And(Vec<Arc<Filter>>),
    /// Any of these matches.
    Or(Vec<Arc<Filter>>),
    /// This one does not match.
    Not(Arc<Filter>),
}

/// How a value is tested.
#[derive(Debug)]
pub enum ValueTest {
    /// Text form equals.
    Equals(String),
    /// Present, whatever its value.
    Exists,
    /// Text form matches the regular expression (unanchored, like `grep`).
    Regex(Regex),
    /// Text form is one of these.
    In(Vec<String>),
}

/// The AMQP properties a `property` filter can test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property {
    /// `content_type`
    ContentType,
    /// `content_encoding`
    ContentEncoding,
    /// `type`
    Type,
    /// `app_id`
    AppId,
    /// `correlation_id`
    CorrelationId,
    /// `reply_to`
    ReplyTo,
    /// `user_id`
    UserId,
    /// `message_id`
    MessageId,
    /// `priority`
    Priority,
    /// `expiration`
    Expiration,
}

impl Property {
    /// Every name accepted in configuration, for error messages.
    pub const NAMES: &'static [&'static str] = &[
        "content_type",
        "content_encoding",
        "type",
        "app_id",
        "correlation_id",
        "reply_to",
        "user_id",
        "message_id",
        "priority",
        "expiration",
    ];

    /// Parses a configuration name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "content_type" => Self::ContentType,
            "content_encoding" => Self::ContentEncoding,
            "type" => Self::Type,
            "app_id" => Self::AppId,
            "correlation_id" => Self::CorrelationId,
            "reply_to" => Self::ReplyTo,
            "user_id" => Self::UserId,
            "message_id" => Self::MessageId,
            "priority" => Self::Priority,
            "expiration" => Self::Expiration,
            _ => return None,
        })
    }

    fn read<'a>(self, envelope: &'a Envelope) -> Option<Cow<'a, str>> {
        let p = &envelope.properties;
        let text = |s: &'a Option<ShortString>| s.as_ref().map(|s| Cow::Borrowed(s.as_str()));
        match self {
            Self::ContentType => text(p.content_type()),
            Self::ContentEncoding => text(p.content_encoding()),
            Self::Type => text(p.kind()),
            Self::AppId => text(p.app_id()),
            Self::CorrelationId => text(p.correlation_id()),
            Self::ReplyTo => text(p.reply_to()),
            Self::UserId => text(p.user_id()),
            Self::MessageId => text(p.message_id()),
            Self::Expiration => text(p.expiration()),
            Self::Priority => p.priority().map(|n| Cow::Owned(n.to_string())),
        }
    }
}

impl ValueTest {
    fn test(&self, value: Option<Cow<'_, str>>) -> bool {
        match (self, value) {
            (Self::Exists, value) => value.is_some(),
            (_, None) => false,
            (Self::Equals(expected), Some(v)) => v == expected.as_str(),
            (Self::Regex(re), Some(v)) => re.is_match(&v),
            (Self::In(options), Some(v)) => options.iter().any(|o| o.as_str() == v),
        }
    }
}

impl Filter {
    /// Whether the message matches.
    pub fn matches(&self, envelope: &Envelope) -> bool {
        match self {
            Self::MatchAll => true,
            Self::Header { name, test } => match (test, envelope.header(name)) {
                (ValueTest::Exists, found) => found.is_some(),
                (test, found) => test.test(found.and_then(value_text)),
            },
            Self::Property { property, test } => test.test(property.read(envelope)),
            Self::RoutingKey(pattern) => pattern.matches(&envelope.routing_key),
            Self::And(all) => all.iter().all(|f| f.matches(envelope)),
            Self::Or(any) => any.iter().any(|f| f.matches(envelope)),
            Self::Not(inner) => !inner.matches(envelope),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::{AmqpValue, FieldArray, FieldTable, Properties};

    fn envelope(
        routing_key: &str,
        properties: Properties,
        headers: &[(&str, AmqpValue)],
    ) -> Envelope {
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert((*k).into(), v.clone());
        }
        Envelope {
            delivery_tag: 1,
            exchange: String::new(),
            routing_key: routing_key.to_owned(),
            redelivered: false,
            properties: properties.with_headers(table),
            body: b"{not json".to_vec(),
        }
    }

    fn header(name: &str, test: ValueTest) -> Filter {
        Filter::Header {
            name: name.to_owned(),
            test,
        }
    }

    fn re(p: &str) -> ValueTest {
        ValueTest::Regex(Regex::new(p).unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn header_filters_compare_the_text_form_of_any_scalar() {
        let env = envelope(
            "rk",
            Properties::default(),
            &[
                ("tenant", AmqpValue::LongString("acme".into())),
                ("short", AmqpValue::ShortString("s".into())),
                ("count", AmqpValue::LongLongInt(42)),
                ("small", AmqpValue::ShortShortInt(-3)),
                ("flag", AmqpValue::Boolean(true)),
                ("ratio", AmqpValue::Double(0.5)),
                (
                    "list",
                    AmqpValue::FieldArray(FieldArray::from(vec![AmqpValue::Boolean(true)])),
                ),
                ("bytes", AmqpValue::LongString(vec![0xff, 0xfe].into())),
            ],
        );
        let cases = [
            (header("tenant", ValueTest::Equals("acme".into())), true),
            (header("tenant", ValueTest::Equals("Acme".into())), false),
            (header("short", ValueTest::Equals("s".into())), true),
            (header("count", ValueTest::Equals("42".into())), true),
            (header("small", ValueTest::Equals("-3".into())), true),
            (header("flag", ValueTest::Equals("true".into())), true),
            (header("ratio", ValueTest::Equals("0.5".into())), true),
            (header("tenant", ValueTest::Exists), true),
            (header("list", ValueTest::Exists), true),
            (header("missing", ValueTest::Exists), false),
            (header("missing", ValueTest::Equals("".into())), false),
            (header("tenant", re("^ac")), true),
            (header("tenant", re("^me")), false),
            (header("count", re(r"^\d+$")), true),
            (
                header("tenant", ValueTest::In(vec!["x".into(), "acme".into()])),
                true,
            ),
            (header("tenant", ValueTest::In(vec!["x".into()])), false),
            (header("list", ValueTest::Equals("true".into())), false),
            (header("bytes", re(".")), true),
        ];
        for (i, (filter, expected)) in cases.iter().enumerate() {
            assert_eq!(filter.matches(&env), *expected, "case {i}: {filter:?}");
        }
    }

    #[test]
    fn property_filters_read_each_property() {
        let props = Properties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_type("order.created".into())
            .with_app_id("shop".into())
            .with_correlation_id("c-1".into())
            .with_reply_to("replies".into())
            .with_user_id("guest".into())
            .with_message_id("m-1".into())
            .with_priority(7)
            .with_expiration("60000".into());
        let env = envelope("rk", props, &[]);
        let bare = envelope("rk", Properties::default(), &[]);
        let cases = [
            (Property::ContentType, "application/json"),
            (Property::ContentEncoding, "gzip"),
            (Property::Type, "order.created"),
            (Property::AppId, "shop"),
            (Property::CorrelationId, "c-1"),
            (Property::ReplyTo, "replies"),
            (Property::UserId, "guest"),
            (Property::MessageId, "m-1"),
            (Property::Priority, "7"),
            (Property::Expiration, "60000"),
        ];
        for (property, value) in cases {
            let filter = Filter::Property {
                property,
                test: ValueTest::Equals(value.to_owned()),
            };
            assert!(filter.matches(&env), "{property:?} = {value}");
            assert!(!filter.matches(&bare), "{property:?} absent");
        }
        let regex = Filter::Property {
            property: Property::Type,
            test: re(r"^order\."),
        };
        assert!(regex.matches(&env));
        let one_of = Filter::Property {
            property: Property::Priority,
            test: ValueTest::In(vec!["5".into(), "7".into()]),
        };
        assert!(one_of.matches(&env));
        for name in Property::NAMES {
            assert!(Property::from_name(name).is_some(), "{name}");
        }
        assert!(Property::from_name("colour").is_none());
    }

    #[test]
    fn routing_key_and_boolean_filters_compose() {
        let eu = Arc::new(Filter::RoutingKey(TopicPattern::parse("orders.*.eu")));
        let vip = Arc::new(header("tier", ValueTest::Equals("vip".into())));
        let both = Filter::And(vec![eu.clone(), vip.clone()]);
        let either = Filter::Or(vec![eu.clone(), vip.clone()]);
        let not_eu = Filter::Not(eu.clone());
        let vip_us = envelope(
            "orders.new.us",
            Properties::default(),
            &[("tier", AmqpValue::LongString("vip".into()))],
        );
        let plain_eu = envelope("orders.new.eu", Properties::default(), &[]);
        assert!(!both.matches(&vip_us) && !both.matches(&plain_eu));
        assert!(either.matches(&vip_us) && either.matches(&plain_eu));
        assert!(not_eu.matches(&vip_us) && !not_eu.matches(&plain_eu));
        assert!(Filter::MatchAll.matches(&vip_us));
    }
}
