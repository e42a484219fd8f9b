//! Compiled filters: evaluated against an [`Envelope`], pure and infallible.
//! A value that cannot be read (a missing header, a body that does not
//! parse) simply does not match.
//!
//! Header, property and routing-key filters allocate nothing per message:
//! values are compared by their text form, borrowed or formatted on the
//! stack, and regular expressions are compiled once, with the table. Body
//! filters read the body through a [`Body`] that parses it once per routing.

use super::body::Body;
use super::topic::TopicPattern;
use crate::amqp::{AmqpValue, ShortString};
use crate::envelope::Envelope;
use regex::Regex;
use std::fmt::{self, Display, Write as _};
use std::sync::Arc;
use sxd_xpath::{Context, Factory, Value};

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

/// Why a body filter cannot be compiled.
#[derive(Debug, thiserror::Error)]
pub enum BodyFilterError {
    /// The pointer is not an RFC 6901 JSON pointer.
    #[error("{0}")]
    Pointer(&'static str),
    /// The expression does not parse or cannot be evaluated.
    #[error("{0}")]
    XPath(String),
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

    fn test(self, envelope: &Envelope, test: &ValueTest) -> bool {
        let p = &envelope.properties;
        let text = |s: &Option<ShortString>| s.as_ref().is_some_and(|s| test.text(s.as_str()));
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
            Self::Priority => p.priority().is_some_and(|n| test.display(n)),
        }
    }
}

impl ValueTest {
    /// Tests a present value's text form.
    fn text(&self, value: &str) -> bool {
        match self {
            Self::Exists => true,
            Self::Equals(expected) => value == expected,
            Self::Regex(re) => re.is_match(value),
            Self::In(options) => options.iter().any(|o| o == value),
        }
    }

    /// Tests the text form of a number, formatted on the stack.
    fn display(&self, value: impl Display) -> bool {
        let mut text = StackText::default();
        if write!(text, "{value}").is_ok() {
            self.text(text.as_str())
        } else {
            self.text(&value.to_string())
        }
    }

    /// Tests a present header value: scalars by their text form (the same as
    /// [`crate::envelope::value_text`]); values without one satisfy only
    /// [`ValueTest::Exists`].
    fn amqp(&self, value: &AmqpValue) -> bool {
        match value {
            AmqpValue::Boolean(b) => self.text(if *b { "true" } else { "false" }),
            AmqpValue::ShortShortInt(n) => self.display(n),
            AmqpValue::ShortShortUInt(n) => self.display(n),
            AmqpValue::ShortInt(n) => self.display(n),
            AmqpValue::ShortUInt(n) => self.display(n),
            AmqpValue::LongInt(n) => self.display(n),
            AmqpValue::LongUInt(n) => self.display(n),
            AmqpValue::LongLongInt(n) => self.display(n),
            AmqpValue::Float(f) => self.display(f),
            AmqpValue::Double(f) => self.display(f),
            AmqpValue::Timestamp(t) => self.display(t),
            AmqpValue::ShortString(s) => self.text(s.as_str()),
            AmqpValue::LongString(s) => self.text(&String::from_utf8_lossy(s.as_bytes())),
            AmqpValue::DecimalValue(_)
            | AmqpValue::FieldArray(_)
            | AmqpValue::FieldTable(_)
            | AmqpValue::ByteArray(_)
            | AmqpValue::Void => matches!(self, Self::Exists),
        }
    }

    /// Tests a present JSON value: strings as they are, numbers in decimal
    /// (integers exactly, others as a header's float is written), booleans
    /// as `true`/`false`; null, arrays and objects satisfy only
    /// [`ValueTest::Exists`].
    fn json(&self, value: &serde_json::Value) -> bool {
        use serde_json::Value as J;
        match value {
            J::String(s) => self.text(s),
            J::Bool(b) => self.text(if *b { "true" } else { "false" }),
            J::Number(n) => {
                if let Some(i) = n.as_i64() {
                    self.display(i)
                } else if let Some(u) = n.as_u64() {
                    self.display(u)
                } else {
                    n.as_f64().is_some_and(|f| self.display(f))
                }
            }
            J::Null | J::Array(_) | J::Object(_) => matches!(self, Self::Exists),
        }
    }
}

/// A short text formatted without allocating; writing past its capacity
/// fails, and the caller formats on the heap instead.
struct StackText {
    buf: [u8; 64],
    len: usize,
}

impl Default for StackText {
    fn default() -> Self {
        Self {
            buf: [0; 64],
            len: 0,
        }
    }
}

impl StackText {
    fn as_str(&self) -> &str {
        // Only whole `str`s are ever written, so this is always UTF-8.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let slot = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// An RFC 6901 JSON pointer, split into its unescaped reference tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointer {
    tokens: Vec<String>,
}

impl JsonPointer {
    /// Parses a pointer: `""` (the whole document) or `/`-prefixed tokens
    /// in which `~1` stands for `/` and `~0` for `~`.
    pub fn parse(pointer: &str) -> Result<Self, BodyFilterError> {
        if pointer.is_empty() {
            return Ok(Self { tokens: Vec::new() });
        }
        let Some(rest) = pointer.strip_prefix('/') else {
            return Err(BodyFilterError::Pointer(
                "must be \"\" (the whole document) or start with \"/\" (RFC 6901)",
            ));
        };
        let tokens = rest
            .split('/')
            .map(|token| {
                let mut out = String::with_capacity(token.len());
                let mut chars = token.chars();
                while let Some(c) = chars.next() {
                    if c != '~' {
                        out.push(c);
                        continue;
                    }
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => {
                            return Err(BodyFilterError::Pointer(
                                "has a \"~\" not followed by 0 or 1; write \"~\" as ~0 and \"/\" as ~1 (RFC 6901)",
                            ));
                        }
                    }
                }
                Ok(out)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { tokens })
    }

    /// The value the pointer refers to in `document`, if there is one.
    pub fn resolve<'v>(&self, document: &'v serde_json::Value) -> Option<&'v serde_json::Value> {
        use serde_json::Value as J;
        self.tokens
            .iter()
            .try_fold(document, |value, token| match value {
                J::Object(map) => map.get(token),
                J::Array(items) => array_index(token).and_then(|i| items.get(i)),
                _ => None,
            })
    }
}

/// An array index as RFC 6901 writes it: `0` or digits without a leading
/// zero. (`-`, the element after the last, never exists.)
fn array_index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if !digits || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}

/// A compiled `xpath` filter: an XPath 1.0 expression and the namespace
/// prefixes it may use.
#[derive(Debug)]
pub struct XPathTest {
    expression: String,
    namespaces: Vec<(String, String)>,
}

impl XPathTest {
    /// Checks `expression` by parsing it and evaluating it once on a small
    /// document, so that a syntax error, an unknown function or an
    /// undeclared prefix is refused with the configuration, not met on
    /// every message.
    pub fn new(
        expression: &str,
        namespaces: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, BodyFilterError> {
        let test = Self {
            expression: expression.to_owned(),
            namespaces: namespaces.into_iter().collect(),
        };
        let names = scan_names(expression);
        if names.variable {
            return Err(BodyFilterError::XPath(
                "uses a variable ($name); none is defined".to_owned(),
            ));
        }
        if let Some(p) = names
            .prefixes
            .iter()
            .find(|p| !test.namespaces.iter().any(|(declared, _)| declared == *p))
        {
            return Err(BodyFilterError::XPath(format!(
                "uses the prefix \"{p}\", which namespaces does not declare"
            )));
        }
        if let Some(f) = names.calls.iter().find(|f| !XPATH_FUNCTIONS.contains(f)) {
            return Err(BodyFilterError::XPath(format!(
                "calls \"{f}()\", which is not an XPath 1.0 function available here"
            )));
        }
        let probe = sxd_document::Package::new();
        let doc = probe.as_document();
        doc.root().append_child(doc.create_element("probe"));
        test.evaluate(doc)?;
        Ok(test)
    }

    /// Whether the expression holds on `doc`: a boolean is its value, a
    /// node-set must be non-empty, a number non-zero and not NaN, a string
    /// non-empty. An expression that fails to evaluate does not match.
    pub fn matches(&self, doc: sxd_document::dom::Document<'_>) -> bool {
        // The evaluator panics on a name test whose prefix has no namespace.
        // `new` refuses such an expression; should one slip through, the
        // message does not match rather than take the forwarder down.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.evaluate(doc)))
            .is_ok_and(|result| result.unwrap_or(false))
    }

    fn evaluate(&self, doc: sxd_document::dom::Document<'_>) -> Result<bool, BodyFilterError> {
        let xpath = Factory::new()
            .build(&self.expression)
            .map_err(|e| BodyFilterError::XPath(format!("does not parse ({e})")))?
            .ok_or_else(|| BodyFilterError::XPath("is empty".to_owned()))?;
        let mut context = Context::new();
        for (prefix, uri) in &self.namespaces {
            context.set_namespace(prefix, uri);
        }
        let value = xpath
            .evaluate(&context, doc.root())
            .map_err(|e| BodyFilterError::XPath(format!("cannot be evaluated ({e})")))?;
        Ok(match value {
            Value::Boolean(b) => b,
            Value::Number(n) => n != 0.0 && !n.is_nan(),
            Value::String(s) => !s.is_empty(),
            Value::Nodeset(nodes) => nodes.size() > 0,
        })
    }
}

/// The functions `xpath` filters can call: XPath 1.0's core library but
/// `id()` and `lang()`.
const XPATH_FUNCTIONS: &[&str] = &[
    "last",
    "position",
    "count",
    "local-name",
    "namespace-uri",
    "name",
    "string",
    "concat",
    "starts-with",
    "contains",
    "substring-before",
    "substring-after",
    "substring",
    "string-length",
    "normalize-space",
    "translate",
    "boolean",
    "not",
    "true",
    "false",
    "number",
    "sum",
    "floor",
    "ceiling",
    "round",
];

/// What an XPath expression names, found outside its string literals.
#[derive(Debug, Default, PartialEq, Eq)]
struct Names<'e> {
    /// The prefixes of qualified names (`o` in `o:order` or `o:*`; not
    /// axes like `child::`).
    prefixes: Vec<&'e str>,
    /// The names called as functions, node type tests excluded.
    calls: Vec<&'e str>,
    /// Whether it refers to a variable (`$name`).
    variable: bool,
}

fn scan_names(expression: &str) -> Names<'_> {
    let name_start = |c: char| c == '_' || c.is_alphabetic();
    let name_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
    let not_called = [
        "node",
        "text",
        "comment",
        "processing-instruction",
        "and",
        "or",
        "div",
        "mod",
    ];
    let mut names = Names::default();
    let mut rest = expression;
    while let Some(c) = rest.chars().next() {
        if c == '\'' || c == '"' {
            let after = &rest[1..];
            rest = after.find(c).map_or("", |end| &after[end + 1..]);
        } else if c == '$' {
            names.variable = true;
            rest = &rest[1..];
        } else if name_start(c) {
            let end = rest.find(|ch| !name_char(ch)).unwrap_or(rest.len());
            let (name, after) = rest.split_at(end);
            rest = after;
            if let Some(local) = after.strip_prefix(':') {
                if local.starts_with(|ch| name_start(ch) || ch == '*') {
                    names.prefixes.push(name);
                    rest = local;
                }
            } else if after.trim_start().starts_with('(') && !not_called.contains(&name) {
                names.calls.push(name);
            }
        } else {
            rest = &rest[c.len_utf8()..];
        }
    }
    names
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
mod tests {
    use super::*;
    use crate::amqp::{AmqpValue, FieldArray, FieldTable, Properties};

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
            annotations: Default::default(),
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

    fn body(text: &str) -> Envelope {
        let mut env = envelope("rk", Properties::default(), &[]);
        env.body = text.as_bytes().to_vec();
        env
    }

    fn json(pointer: &str, test: ValueTest) -> Filter {
        Filter::Json {
            pointer: JsonPointer::parse(pointer).unwrap_or_else(|e| panic!("{pointer}: {e}")),
            test,
        }
    }

    fn xpath(expression: &str, namespaces: &[(&str, &str)]) -> Filter {
        let ns = namespaces
            .iter()
            .map(|(p, u)| ((*p).to_owned(), (*u).to_owned()));
        Filter::XPath(
            XPathTest::new(expression, ns).unwrap_or_else(|e| panic!("{expression}: {e}")),
        )
    }

    #[test]
    fn header_text_forms_are_those_of_value_text() {
        let values = [
            AmqpValue::Boolean(false),
            AmqpValue::ShortShortInt(-8),
            AmqpValue::ShortShortUInt(200),
            AmqpValue::ShortInt(-300),
            AmqpValue::ShortUInt(60_000),
            AmqpValue::LongInt(-70_000),
            AmqpValue::LongUInt(4_000_000_000),
            AmqpValue::LongLongInt(i64::MIN),
            AmqpValue::Float(1.5),
            AmqpValue::Double(1.0),
            AmqpValue::Double(1e300),
            AmqpValue::Double(5e-324),
            AmqpValue::Double(f64::NAN),
            AmqpValue::Timestamp(1_700_000_000),
            AmqpValue::ShortString("short".into()),
            AmqpValue::LongString("long".into()),
            AmqpValue::LongString(vec![b'a', 0xff].into()),
        ];
        for value in values {
            let text = crate::envelope::value_text(&value)
                .unwrap_or_else(|| panic!("{value:?} has a text form"))
                .into_owned();
            let env = envelope("rk", Properties::default(), &[("h", value.clone())]);
            assert!(
                header("h", ValueTest::Equals(text.clone())).matches(&env),
                "{value:?} as {text:?}"
            );
            assert!(
                !header("h", ValueTest::Equals(format!("{text}x"))).matches(&env),
                "{value:?}"
            );
        }
    }

    #[test]
    fn json_filters_test_the_value_at_the_pointer() {
        let doc = body(
            r#"{"order": {"id": 7, "total": 12.5, "whole": 3.0, "big": 18446744073709551615,
                 "vip": true, "note": null, "region": "eu-west", "tags": ["a", "b"],
                 "a/b": 1, "m~n": 2, "": 3, "items": [{"sku": "X-1"}, {"sku": "Y-2"}]}}"#,
        );
        let cases = [
            (json("/order/id", ValueTest::Equals("7".into())), true),
            (json("/order/id", ValueTest::Equals("7.0".into())), false),
            (json("/order/total", ValueTest::Equals("12.5".into())), true),
            (json("/order/whole", ValueTest::Equals("3".into())), true),
            (
                json(
                    "/order/big",
                    ValueTest::Equals("18446744073709551615".into()),
                ),
                true,
            ),
            (json("/order/vip", ValueTest::Equals("true".into())), true),
            (json("/order/region", re("^eu-")), true),
            (json("/order/region", re("^us-")), false),
            (
                json(
                    "/order/region",
                    ValueTest::In(vec!["x".into(), "eu-west".into()]),
                ),
                true,
            ),
            (json("/order/tags/1", ValueTest::Equals("b".into())), true),
            (json("/order/tags/01", ValueTest::Exists), false),
            (json("/order/tags/2", ValueTest::Exists), false),
            (json("/order/tags/-", ValueTest::Exists), false),
            (
                json("/order/items/1/sku", ValueTest::Equals("Y-2".into())),
                true,
            ),
            (json("/order/a~1b", ValueTest::Equals("1".into())), true),
            (json("/order/m~0n", ValueTest::Equals("2".into())), true),
            (json("/order/", ValueTest::Equals("3".into())), true),
            // Null, arrays and objects exist but have no text form.
            (json("/order/note", ValueTest::Exists), true),
            (json("/order/note", ValueTest::Equals("null".into())), false),
            (json("/order/tags", ValueTest::Exists), true),
            (json("/order/tags", re(".")), false),
            (json("", ValueTest::Exists), true),
            (json("/order/missing", ValueTest::Exists), false),
            (json("/order/id/deeper", ValueTest::Exists), false),
        ];
        for (i, (filter, expected)) in cases.iter().enumerate() {
            assert_eq!(filter.matches(&doc), *expected, "case {i}: {filter:?}");
        }
        let exists = json("", ValueTest::Exists);
        for bad in ["", "{", "<order/>", "[1,", "\u{0}"] {
            assert!(!exists.matches(&body(bad)), "{bad:?}");
        }
        let mut invalid_utf8 = body("");
        invalid_utf8.body = b"\"\xff\"".to_vec();
        assert!(!exists.matches(&invalid_utf8));
    }

    #[test]
    fn json_pointers_follow_rfc_6901() {
        for bad in ["a", "a/b", "/a~", "/a~2", "~0"] {
            assert!(JsonPointer::parse(bad).is_err(), "{bad:?}");
        }
        // The examples of RFC 6901, section 5.
        let doc: serde_json::Value = serde_json::from_str(
            r#"{"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4,
                "i\\j": 5, "k\"l": 6, " ": 7, "m~n": 8}"#,
        )
        .unwrap();
        let cases = [
            ("/foo/0", serde_json::json!("bar")),
            ("/", serde_json::json!(0)),
            ("/a~1b", serde_json::json!(1)),
            ("/c%d", serde_json::json!(2)),
            ("/e^f", serde_json::json!(3)),
            ("/g|h", serde_json::json!(4)),
            ("/i\\j", serde_json::json!(5)),
            ("/k\"l", serde_json::json!(6)),
            ("/ ", serde_json::json!(7)),
            ("/m~0n", serde_json::json!(8)),
        ];
        for (pointer, expected) in cases {
            let found = JsonPointer::parse(pointer).unwrap().resolve(&doc).cloned();
            assert_eq!(found, Some(expected), "{pointer}");
        }
        assert_eq!(JsonPointer::parse("").unwrap().resolve(&doc), Some(&doc));
    }

    #[test]
    fn xpath_filters_take_the_truth_of_the_result() {
        let doc = body(
            r#"<?xml version="1.0"?>
<o:order xmlns:o="urn:example:orders" xmlns="urn:example:default" region="eu">
  <o:id>7</o:id>
  <o:total currency="EUR">12.50</o:total>
  <line sku="X-1"/><line sku="Y-2"/>
  <note><![CDATA[fragile & heavy]]></note>
</o:order>"#,
        );
        let o = [("o", "urn:example:orders")];
        let both = [("o", "urn:example:orders"), ("d", "urn:example:default")];
        let cases = [
            // Node-sets: non-empty.
            (xpath("/o:order", &o), true),
            (xpath("/o:order/o:id[. = 7]", &o), true),
            (xpath("/o:order/o:id[. = 8]", &o), false),
            (xpath("/order", &[]), false),
            (xpath("//d:line[@sku = 'Y-2']", &both), true),
            (xpath("/o:order[@region = 'eu']", &o), true),
            (xpath("/o:order/@missing", &o), false),
            // The prefix is the document's business; the namespace counts.
            (xpath("/x:order", &[("x", "urn:example:orders")]), true),
            (xpath("/x:order", &[("x", "urn:example:other")]), false),
            // Booleans: their value.
            (xpath("/o:order/o:total > 10", &o), true),
            (xpath("/o:order/o:total > 20", &o), false),
            (xpath("count(//d:line) = 2", &both), true),
            (xpath("contains(//d:note, 'fragile &')", &both), true),
            (xpath("name(/*) = 'o:order'", &o), true),
            // Numbers: non-zero and not NaN.
            (xpath("count(//d:line)", &both), true),
            (xpath("count(//d:missing)", &both), false),
            (xpath("number('x')", &[]), false),
            // Strings: non-empty.
            (xpath("string(/o:order/o:id)", &o), true),
            (xpath("string(/o:order/@missing)", &o), false),
        ];
        for (i, (filter, expected)) in cases.iter().enumerate() {
            assert_eq!(filter.matches(&doc), *expected, "case {i}: {filter:?}");
        }
        let any = xpath("true()", &[]);
        assert!(any.matches(&body("<a/>")));
        for bad in ["", "<a>", "{\"a\": 1}", "<a></b>", "text"] {
            assert!(!any.matches(&body(bad)), "{bad:?}");
        }
    }

    #[test]
    fn xpath_expressions_are_checked_when_compiled() {
        let none = || std::iter::empty::<(String, String)>();
        assert!(XPathTest::new("/a", none()).is_ok());
        for bad in ["", "/a[", "nosuch(1)", "id('x')", "/o:a", "1 +"] {
            assert!(XPathTest::new(bad, none()).is_err(), "{bad:?}");
        }
        let o = [("o".to_owned(), "urn:o".to_owned())];
        assert!(XPathTest::new("/o:a", o.clone()).is_ok());
        // A prefix is checked wherever it is, even where a small document
        // would never evaluate it.
        assert!(XPathTest::new("/a/p:b", o.clone()).is_err());
        assert!(XPathTest::new("false() and //p:b", o.clone()).is_err());
        assert!(XPathTest::new("$v = 1", none()).is_err());
        let fine = "child::o:a[@o:x = 'p:q $v'] | descendant-or-self::node()/o:*";
        assert!(XPathTest::new(fine, o).is_ok(), "{fine}");
    }

    #[test]
    fn names_are_found_outside_literals() {
        let names = |prefixes: &[&'static str], calls: &[&'static str], variable| Names {
            prefixes: prefixes.to_vec(),
            calls: calls.to_vec(),
            variable,
        };
        assert_eq!(scan_names("/o:a/p:*"), names(&["o", "p"], &[], false));
        assert_eq!(
            scan_names("child::a | ancestor::x:b"),
            names(&["x"], &[], false)
        );
        assert_eq!(scan_names("'o:a' = \"$p:b f()\""), names(&[], &[], false));
        assert_eq!(
            scan_names("count(//my-ns.v2:item) > $n and (1)"),
            names(&["my-ns.v2"], &["count"], true)
        );
        assert_eq!(
            scan_names("//text() | //node() [not (x)]"),
            names(&[], &["not"], false)
        );
        assert_eq!(scan_names("'unterminated o:a"), names(&[], &[], false));
    }

    #[test]
    fn a_table_evaluating_several_body_filters_parses_the_body_once_per_format() {
        let env = body(r#"{"kind": "order", "n": 3}"#);
        let parsed = Body::new(&env.body);
        let kind = json("/kind", ValueTest::Equals("order".into()));
        let n = json("/n", ValueTest::In(vec!["3".into()]));
        assert!(kind.matches_with(&env, &parsed));
        let first = parsed.json().map(std::ptr::from_ref);
        assert!(n.matches_with(&env, &parsed));
        assert_eq!(parsed.json().map(std::ptr::from_ref), first);
        // Header filters never read the body, parsed or not.
        let untouched = Body::new(&env.body);
        assert!(!header("x", ValueTest::Exists).matches_with(&env, &untouched));
        assert!(untouched.is_unparsed());
    }
}
