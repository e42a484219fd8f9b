//! Body filters against the real broker: a `json` branch and an `xpath`
//! branch (with a namespace) route real messages; bodies that do not parse,
//! or that are too large, too deep, not UTF-8, empty or hostile (an entity
//! bomb) match no body filter, so they are dead-lettered `no-route`, or take
//! a `match_all` fallback at a lower priority; and the forwarder keeps
//! forwarding after them. A no-route dead letter says, in its error and its
//! log line, when the body did not parse as the format its filters asked for.

use crate::support;

use lapin::BasicProperties;
use std::time::Duration;
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::{InProcess, Process, wait_consumers};
use support::{
    DEFAULT_TIMEOUT, Message, TestBroker, amqp_str, delete_all_with_prefix, field_table,
    unique_prefix, wait_until,
};

/// Branch `orders` takes paid JSON orders, branch `invoices` XML invoices
/// over 100 in the invoices namespace; `fallback` adds a `match_all` entry
/// at priority -1 to queue `<p>.unread`.
fn toml(p: &str, mode: &str, fallback: bool) -> String {
    let queue = |name: &str| Endpoint::queue(name, &format!("{p}.{name}"));
    let mut config = Forwarder::new(p)
        .mode(mode)
        .endpoint(queue("orders"))
        .endpoint(queue("invoices"))
        .filter("paid", Filter::json("/order/status").set("equals", "paid"))
        .filter(
            "bigInvoice",
            Filter::xpath("/inv:invoice[inv:total > 100]").namespace("inv", "urn:example:invoices"),
        )
        .branch(Branch::new("orders", "paid", "orders"))
        .branch(Branch::new("invoices", "bigInvoice", "invoices"));
    if fallback {
        config = config
            .endpoint(queue("unread"))
            .filter("all", Filter::match_all())
            .branch(Branch::new("unread", "all", "unread").set("priority", -1));
    }
    config.toml()
}

fn invoice(ns: &str, prefix: &str, total: u32) -> Vec<u8> {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<{prefix}:invoice xmlns:{prefix}="{ns}"><{prefix}:total>{total}</{prefix}:total></{prefix}:invoice>"#
    )
    .into_bytes()
}

const INVOICES: &str = "urn:example:invoices";

/// Bodies no body filter can read, each with its message id: every one
/// would match a filter if it could be read.
fn unreadable() -> Vec<(&'static str, Vec<u8>)> {
    let deep_json = format!(
        r#"{{"order": {{"status": "paid", "pad": {}1{}}}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let huge_json = format!(
        r#"{{"order": {{"status": "paid"}}, "pad": "{}"}}"#,
        "x".repeat(1_100_000)
    );
    let deep_xml = format!(
        r#"<inv:invoice xmlns:inv="{INVOICES}"><inv:total>500</inv:total>{}{}</inv:invoice>"#,
        "<d>".repeat(200),
        "</d>".repeat(200)
    );
    let laughs = format!(
        r#"<?xml version="1.0"?>
<!DOCTYPE inv:invoice [
 <!ENTITY a "aaaaaaaaaa">
 <!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
 <!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">
 <!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">
 <!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;">
 <!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;">
 <!ENTITY g "&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;">
 <!ENTITY h "&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;">
 <!ENTITY i "&h;&h;&h;&h;&h;&h;&h;&h;&h;&h;">
]>
<inv:invoice xmlns:inv="{INVOICES}"><inv:total>500</inv:total><inv:note>&i;</inv:note></inv:invoice>"#
    );
    vec![
        ("broken-json", br#"{"order": {"status": "paid""#.to_vec()),
        ("deep-json", deep_json.into_bytes()),
        ("huge-json", huge_json.into_bytes()),
        (
            "invalid-utf8",
            b"{\"order\": {\"status\": \"paid\", \"note\": \"\xff\xfe\"}}".to_vec(),
        ),
        ("empty", Vec::new()),
        ("broken-xml", invoice(INVOICES, "inv", 500)[..60].to_vec()),
        ("deep-xml", deep_xml.into_bytes()),
        ("entity-bomb", laughs.into_bytes()),
    ]
}

fn with_id(id: &str) -> BasicProperties {
    BasicProperties::default().with_message_id(id.into())
}

fn ids(messages: &[Message]) -> Vec<String> {
    let mut ids: Vec<String> = messages.iter().map(message_id).collect();
    ids.sort();
    ids
}

fn message_id(m: &Message) -> String {
    m.properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str().to_owned())
        .unwrap_or_default()
}

/// A no-route dead letter's error when the body parsed and matched nothing,
/// or no body filter read it.
const NO_ROUTE: &str = "no filter-table entry matched";
const UNPARSED_AS_EITHER: &str =
    "no filter-table entry matched; the body did not parse as JSON or XML";

fn sorted(mut names: Vec<&str>) -> Vec<String> {
    names.sort();
    names.into_iter().map(str::to_owned).collect()
}

#[tokio::test]
async fn json_and_xpath_branches_route_and_unreadable_bodies_are_no_route() {
    let p = unique_prefix("body");
    let broker = TestBroker::connect(&p).await;
    let forwarder =
        InProcess::start_consuming(&toml(&p, "republish", false), &broker, &format!("{p}.in"))
            .await;
    let inbound = format!("{p}.in");
    let readable: Vec<(&str, Vec<u8>)> = vec![
        (
            "json-paid",
            br#"{"order": {"status": "paid", "total": 10}}"#.to_vec(),
        ),
        ("json-open", br#"{"order": {"status": "open"}}"#.to_vec()),
        ("xml-big", invoice(INVOICES, "inv", 250)),
        ("xml-small", invoice(INVOICES, "inv", 50)),
        ("xml-own-prefix", invoice(INVOICES, "i", 250)),
        (
            "xml-other-namespace",
            invoice("urn:example:other", "inv", 250),
        ),
    ];
    let unreadable = unreadable();
    for (id, body) in readable.iter().chain(&unreadable) {
        broker.publish("", &inbound, body, with_id(id)).await;
    }
    // Still forwarding after the hostile bodies.
    broker
        .publish(
            "",
            &inbound,
            br#"{"order": {"status": "paid"}}"#,
            with_id("json-paid-after"),
        )
        .await;

    let dead = 2 + 1 + unreadable.len() as u32;
    broker
        .await_count(&format!("{p}.orders"), 2, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.invoices"), 2, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.dlq"), dead, DEFAULT_TIMEOUT)
        .await;
    broker.await_count(&inbound, 0, DEFAULT_TIMEOUT).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(
        ids(&broker.get_all(&format!("{p}.orders")).await),
        sorted(vec!["json-paid", "json-paid-after"])
    );
    assert_eq!(
        ids(&broker.get_all(&format!("{p}.invoices")).await),
        sorted(vec!["xml-big", "xml-own-prefix"])
    );
    let dead_letters = broker.get_all(&format!("{p}.dlq")).await;
    let mut expected = vec!["json-open", "xml-small", "xml-other-namespace"];
    expected.extend(unreadable.iter().map(|(id, _)| *id));
    assert_eq!(ids(&dead_letters), sorted(expected));
    for m in &dead_letters {
        let id = message_id(m);
        assert_eq!(
            m.header_str("x-switchyard-reason").as_deref(),
            Some("no-route"),
            "{id}"
        );
        // Both kinds of body filter read every body: an unreadable one
        // parsed as neither; a readable one parsed and matched nothing.
        let expected = if unreadable.iter().any(|(u, _)| *u == id) {
            UNPARSED_AS_EITHER
        } else {
            NO_ROUTE
        };
        assert_eq!(
            m.header_str("x-switchyard-error").as_deref(),
            Some(expected),
            "{id}"
        );
    }
    // The dead letters keep their bodies byte for byte, the huge one too.
    let huge = dead_letters
        .iter()
        .find(|m| m.properties.message_id().as_ref().map(|i| i.as_str()) == Some("huge-json"))
        .unwrap();
    assert_eq!(huge.body.len(), unreadable[2].1.len());
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn unreadable_bodies_take_a_lower_priority_fallback() {
    let p = unique_prefix("bodyfb");
    let broker = TestBroker::connect(&p).await;
    let forwarder =
        InProcess::start_consuming(&toml(&p, "nack", true), &broker, &format!("{p}.in")).await;
    let inbound = format!("{p}.in");
    let unreadable = unreadable();
    broker
        .publish(
            "",
            &inbound,
            br#"{"order": {"status": "paid"}}"#,
            with_id("json-paid"),
        )
        .await;
    broker
        .publish(
            "",
            &inbound,
            &invoice(INVOICES, "inv", 101),
            with_id("xml-big"),
        )
        .await;
    for (id, body) in &unreadable {
        broker.publish("", &inbound, body, with_id(id)).await;
    }
    broker
        .await_count(
            &format!("{p}.unread"),
            unreadable.len() as u32,
            DEFAULT_TIMEOUT,
        )
        .await;
    broker
        .await_count(&format!("{p}.orders"), 1, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.invoices"), 1, DEFAULT_TIMEOUT)
        .await;
    broker.await_count(&inbound, 0, DEFAULT_TIMEOUT).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(
        ids(&broker.get_all(&format!("{p}.unread")).await),
        sorted(unreadable.iter().map(|(id, _)| *id).collect())
    );
    assert_eq!(
        ids(&broker.get_all(&format!("{p}.orders")).await),
        ["json-paid"]
    );
    assert_eq!(
        ids(&broker.get_all(&format!("{p}.invoices")).await),
        ["xml-big"]
    );
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    delete_all_with_prefix(&p).await;
}

/// Branch `orders` reads the body as JSON only for messages with header
/// `kind: json`, `invoices` as XML only for `kind: xml`; a message with
/// neither is not read at all (the header filter comes first).
fn by_kind_toml(p: &str) -> String {
    let queue = |name: &str| Endpoint::queue(name, &format!("{p}.{name}"));
    Forwarder::new(p)
        .mode("republish")
        .endpoint(queue("orders"))
        .endpoint(queue("invoices"))
        .filter("isJson", Filter::header("kind").set("equals", "json"))
        .filter("isXml", Filter::header("kind").set("equals", "xml"))
        .filter("paid", Filter::json("/order/status").set("equals", "paid"))
        .filter(
            "bigInvoice",
            Filter::xpath("/inv:invoice[inv:total > 100]").namespace("inv", INVOICES),
        )
        .filter("paidJson", Filter::all_of(&["isJson", "paid"]))
        .filter("bigXml", Filter::all_of(&["isXml", "bigInvoice"]))
        .branch(Branch::new("orders", "paidJson", "orders"))
        .branch(Branch::new("invoices", "bigXml", "invoices"))
        .toml()
}

/// A no-route dead letter says in its error, and in the `dead-lettered`
/// log line, that the body did not parse as the format its body filter
/// asked for (JSON or XML); one whose body parsed, or that no body filter
/// read, says only that nothing matched.
#[tokio::test]
async fn a_no_route_dead_letter_says_when_the_body_did_not_parse() {
    let p = unique_prefix("bodynr");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let mut process = Process::spawn_with(&p, &by_kind_toml(&p), &["--log-format=json"], &[]);
    wait_consumers(&broker, &inbound, 1).await;
    let cases: Vec<(&str, Option<&str>, Vec<u8>, &str)> = vec![
        (
            "json-broken",
            Some("json"),
            br#"{"order": {"status": "paid""#.to_vec(),
            "no filter-table entry matched; the body did not parse as JSON",
        ),
        (
            "json-open",
            Some("json"),
            br#"{"order": {"status": "open"}}"#.to_vec(),
            NO_ROUTE,
        ),
        (
            "xml-broken",
            Some("xml"),
            invoice(INVOICES, "inv", 500)[..60].to_vec(),
            "no filter-table entry matched; the body did not parse as XML",
        ),
        (
            "xml-small",
            Some("xml"),
            invoice(INVOICES, "inv", 50),
            NO_ROUTE,
        ),
        ("unread", None, b"neither JSON nor XML".to_vec(), NO_ROUTE),
    ];
    for (id, kind, body, _) in &cases {
        let headers = kind.map(|k| field_table([("kind", amqp_str(k))]));
        let properties = match headers {
            Some(headers) => with_id(id).with_headers(headers),
            None => with_id(id),
        };
        broker.publish("", &inbound, body, properties).await;
    }
    let dlq = format!("{p}.dlq");
    broker
        .await_count(&dlq, cases.len() as u32, DEFAULT_TIMEOUT)
        .await;
    let dead_lettered = |log: &str| -> Vec<(String, String, String)> {
        log.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|event| event["message"] == "dead-lettered")
            .map(|event| {
                let field = |name: &str| event[name].as_str().unwrap_or_default().to_owned();
                (field("message_id"), field("reason"), field("error"))
            })
            .collect()
    };
    wait_until("every dead letter is logged", DEFAULT_TIMEOUT, || async {
        dead_lettered(&process.log()).len() == cases.len()
    })
    .await;
    process.signal("TERM");
    assert_eq!(process.wait_exit(Duration::from_secs(15)).await, Some(0));

    let logged = dead_lettered(&process.log());
    let dead_letters = broker.get_all(&dlq).await;
    for (id, _, _, error) in &cases {
        let Some(m) = dead_letters.iter().find(|m| message_id(m) == *id) else {
            panic!("{id} was not dead-lettered");
        };
        assert_eq!(
            m.header_str("x-switchyard-reason").as_deref(),
            Some("no-route"),
            "{id}"
        );
        assert_eq!(
            m.header_str("x-switchyard-error").as_deref(),
            Some(*error),
            "{id}"
        );
        let line = (id.to_string(), "no-route".to_owned(), error.to_string());
        assert!(logged.contains(&line), "{id}: {logged:?}");
    }
    delete_all_with_prefix(&p).await;
}
