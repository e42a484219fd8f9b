//! Filters against envelopes: header text forms, each property, routing
//! keys and boolean composition, JSON pointers and XPath truth, expressions
//! checked when compiled, and a body parsed once per format.

use super::xpath::{Names, scan_names};
use super::*;
use crate::amqp::{AmqpValue, FieldArray, FieldTable, Properties};
use regex::Regex;

fn envelope(routing_key: &str, properties: Properties, headers: &[(&str, AmqpValue)]) -> Envelope {
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
    Filter::XPath(XPathTest::new(expression, ns).unwrap_or_else(|e| panic!("{expression}: {e}")))
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
