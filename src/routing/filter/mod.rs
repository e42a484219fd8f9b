//! Compiled filters: evaluated against an [`Envelope`], pure and infallible.
//! A value that cannot be read (a missing header, a body that does not
//! parse) simply does not match.
//!
//! Header, property and routing-key filters allocate nothing per message:
//! values are compared by their text form, borrowed or formatted on the
//! stack, and regular expressions are compiled once, with the table. Body
//! filters read the body through a [`Body`] that parses it once per routing.

mod error;
mod json;
mod property;
mod value;
mod xpath;

pub use json::JsonPointer;
pub use property::Property;
pub use value::ValueTest;
pub use xpath::XPathTest;

use super::body::Body;
use super::topic::TopicPattern;
use crate::envelope::Envelope;
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
    /// A value of a JSON body, found by a JSON pointer and tested by its
    /// text form.
    Json {
        /// Where the value is.
        pointer: JsonPointer,
        /// The test.
        test: ValueTest,
    },
    /// An XPath 1.0 expression over an XML body.
    XPath(XPathTest),
    /// All of these match.
    And(Vec<Arc<Filter>>),
    /// Any of these matches.
    Or(Vec<Arc<Filter>>),
    /// This one does not match.
    Not(Arc<Filter>),
}

impl Filter {
    /// Whether the message matches.
    pub fn matches(&self, envelope: &Envelope) -> bool {
        self.matches_with(envelope, &Body::new(&envelope.body))
    }

    /// Whether the message matches, its body read (and parsed at most once)
    /// through `body`.
    pub(super) fn matches_with(&self, envelope: &Envelope, body: &Body<'_>) -> bool {
        match self {
            Self::MatchAll => true,
            Self::Header { name, test } => envelope.header(name).is_some_and(|v| test.amqp(v)),
            Self::Property { property, test } => property.test(envelope, test),
            Self::RoutingKey(pattern) => pattern.matches(&envelope.routing_key),
            Self::Json { pointer, test } => body
                .json()
                .and_then(|doc| pointer.resolve(doc))
                .is_some_and(|v| test.json(v)),
            Self::XPath(xpath) => body.xml().is_some_and(|doc| xpath.matches(doc)),
            Self::And(all) => all.iter().all(|f| f.matches_with(envelope, body)),
            Self::Or(any) => any.iter().any(|f| f.matches_with(envelope, body)),
            Self::Not(inner) => !inner.matches_with(envelope, body),
        }
    }
}

#[cfg(test)]
mod tests;
