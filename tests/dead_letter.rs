//! Dead letters: an exhausted backup list and a message no filter matches
//! go to the dead-letter queue, in both modes, with the delivered branches
//! never sent twice and (in republish mode) the SPEC's annotations.

mod support;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use std::time::{SystemTime, UNIX_EPOCH};
use support::harness::{InProcess, base_toml, endpoint_toml};
use support::{DEFAULT_TIMEOUT, Message, TestBroker, delete_all_with_prefix, unique_prefix};

/// "service" delivers to an existing queue; "logging" has only missing
/// queues (every attempt returned), so its list is exhausted.
fn exhausting_toml(p: &str, mode: &str) -> String {
    format!(
        r#"{base}{service}{logging}{logging_backup}
[backup_lists]
logging_backups = ["logging_backup"]

[filters.all]
type = "match_all"

[[filter_table]]
name = "service"
filter = "all"
endpoint = "service"

[[filter_table]]
name = "logging"
filter = "all"
endpoint = "logging"
backup_list = "logging_backups"
"#,
        base = base_toml(p, mode),
        service = endpoint_toml("service", "main", &format!("{p}.service"), true, ""),
        logging = endpoint_toml(
            "logging",
            "main",
            &format!("{p}.logging.missing"),
            false,
            ""
        ),
        logging_backup = endpoint_toml(
            "logging_backup",
            "main",
            &format!("{p}.logging.gone"),
            false,
            ""
        ),
    )
}

/// Only messages with header `kind = order` have a route.
fn selective_toml(p: &str, mode: &str) -> String {
    format!(
        r#"{base}{service}
[filters.orders]
type = "header"
header = "kind"
equals = "order"

[[filter_table]]
name = "service"
filter = "orders"
endpoint = "service"
"#,
        base = base_toml(p, mode),
        service = endpoint_toml("service", "main", &format!("{p}.service"), true, ""),
    )
}

fn props(id: &str, kind: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("kind".into(), AMQPValue::LongString(kind.into()));
    BasicProperties::default()
        .with_message_id(id.into())
        .with_correlation_id(format!("c-{id}").into())
        .with_headers(headers)
}

fn names(value: Option<&AMQPValue>) -> Vec<String> {
    match value {
        Some(AMQPValue::FieldArray(items)) => items
            .as_slice()
            .iter()
            .map(|v| match v {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                other => panic!("not a string: {other:?}"),
            })
            .collect(),
        other => panic!("not an array: {other:?}"),
    }
}

fn x_death_reason(m: &Message) -> String {
    let Some(AMQPValue::FieldArray(deaths)) = m.header("x-death") else {
        panic!("no x-death header: {:?}", m.properties.headers())
    };
    let Some(AMQPValue::FieldTable(first)) = deaths.as_slice().first() else {
        panic!("empty x-death")
    };
    match first.inner().get("reason") {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => panic!("x-death reason: {other:?}"),
    }
}

#[tokio::test]
async fn an_exhausted_list_dead_letters_in_nack_mode_and_keeps_delivered_branches_single() {
    let p = unique_prefix("dl-nack");
    let broker = TestBroker::connect(&p).await;
    let forwarder =
        InProcess::start_consuming(&exhausting_toml(&p, "nack"), &broker, &format!("{p}.in")).await;
    for i in 0..20 {
        broker
            .publish(
                "",
                &format!("{p}.in"),
                format!("b{i}").as_bytes(),
                props(&format!("m{i}"), "order"),
            )
            .await;
    }
    broker
        .await_count(&format!("{p}.dlq"), 20, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.service"), 20, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let dead = broker.get_all(&format!("{p}.dlq")).await;
    let mut ids: Vec<String> = dead
        .iter()
        .map(|m| {
            assert_eq!(x_death_reason(m), "rejected");
            let id = m
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default();
            assert_eq!(m.body_str(), format!("b{}", &id[1..]), "body kept");
            id
        })
        .collect();
    ids.sort();
    let mut expected: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    expected.sort();
    assert_eq!(ids, expected, "every message dead-lettered once");
    // The delivered branch got each message exactly once; the failed one nothing.
    assert_eq!(broker.get_all(&format!("{p}.service")).await.len(), 20);
    assert!(!broker.queue_exists(&format!("{p}.logging.missing")).await);
    assert_eq!(broker.queue_len(&format!("{p}.in")).await, 0);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn an_exhausted_list_dead_letters_in_republish_mode_with_annotations() {
    let p = unique_prefix("dl-repub");
    let broker = TestBroker::connect(&p).await;
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let forwarder = InProcess::start_consuming(
        &exhausting_toml(&p, "republish"),
        &broker,
        &format!("{p}.in"),
    )
    .await;
    broker
        .publish("", &format!("{p}.in"), b"payload", props("m1", "order"))
        .await;
    broker
        .await_count(&format!("{p}.dlq"), 1, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);

    let dead = broker.get_all(&format!("{p}.dlq")).await;
    assert_eq!(dead.len(), 1);
    let m = &dead[0];
    assert_eq!(m.body, b"payload");
    assert_eq!(
        m.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("m1")
    );
    assert_eq!(
        m.properties.correlation_id().as_ref().map(|s| s.as_str()),
        Some("c-m1")
    );
    assert_eq!(
        m.header_str("kind").as_deref(),
        Some("order"),
        "user headers kept"
    );
    assert_eq!(
        m.header_str("x-switchyard-reason").as_deref(),
        Some("exhausted")
    );
    assert_eq!(names(m.header("x-switchyard-failed")), ["logging"]);
    assert_eq!(names(m.header("x-switchyard-delivered")), ["service"]);
    assert_eq!(
        m.header_str("x-switchyard-source-queue"),
        Some(format!("{p}.in"))
    );
    let error = m.header_str("x-switchyard-error").unwrap_or_default();
    assert!(
        error.contains("logging") && error.contains("312"),
        "{error}"
    );
    assert!(!error.contains('\n'));
    match m.header("x-switchyard-dead-lettered-at") {
        Some(AMQPValue::LongLongInt(at)) => assert!((before..=after).contains(at), "{at}"),
        other => panic!("dead-lettered-at: {other:?}"),
    }
    assert!(m.header("x-death").is_none(), "republished, not nacked");
    assert_eq!(
        broker.get_all(&format!("{p}.service")).await.len(),
        1,
        "service delivered once"
    );
    assert_eq!(broker.queue_len(&format!("{p}.in")).await, 0);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn no_route_dead_letters_in_nack_mode() {
    let p = unique_prefix("noroute-nack");
    let broker = TestBroker::connect(&p).await;
    let forwarder =
        InProcess::start_consuming(&selective_toml(&p, "nack"), &broker, &format!("{p}.in")).await;
    broker
        .publish("", &format!("{p}.in"), b"x", props("routed", "order"))
        .await;
    broker
        .publish("", &format!("{p}.in"), b"y", props("unrouted", "invoice"))
        .await;
    broker
        .await_count(&format!("{p}.dlq"), 1, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.service"), 1, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let dead = broker.get_all(&format!("{p}.dlq")).await;
    assert_eq!(dead[0].body, b"y");
    assert_eq!(x_death_reason(&dead[0]), "rejected");
    assert_eq!(broker.get_all(&format!("{p}.service")).await[0].body, b"x");
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn no_route_dead_letters_in_republish_mode_with_reason() {
    let p = unique_prefix("noroute-repub");
    let broker = TestBroker::connect(&p).await;
    let forwarder = InProcess::start_consuming(
        &selective_toml(&p, "republish"),
        &broker,
        &format!("{p}.in"),
    )
    .await;
    broker
        .publish("", &format!("{p}.in"), b"", props("unrouted", "invoice"))
        .await;
    broker
        .await_count(&format!("{p}.dlq"), 1, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let dead = broker.get_all(&format!("{p}.dlq")).await;
    let m = &dead[0];
    assert!(m.body.is_empty());
    assert_eq!(
        m.header_str("x-switchyard-reason").as_deref(),
        Some("no-route")
    );
    assert!(names(m.header("x-switchyard-failed")).is_empty());
    assert!(names(m.header("x-switchyard-delivered")).is_empty());
    assert_eq!(broker.queue_len(&format!("{p}.service")).await, 0);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn an_unconfirmed_dead_letter_requeues_the_original_instead_of_dropping_it() {
    let p = unique_prefix("dl-unroutable");
    let broker = TestBroker::connect(&p).await;
    // Once started, the dead-letter queue goes away: the annotated copy is
    // returned, so the dead letter cannot be confirmed. (Startup refuses a
    // dead-letter route that goes nowhere, so it is removed afterwards.)
    let toml = exhausting_toml(&p, "republish");
    let forwarder = InProcess::start_consuming(&toml, &broker, &format!("{p}.in")).await;
    broker.delete_queue(&format!("{p}.dlq")).await;
    broker
        .publish("", &format!("{p}.in"), b"keep me", props("m1", "order"))
        .await;
    // Requeued and tried again: the delivered branch shows each attempt.
    support::wait_until("the message went round twice", DEFAULT_TIMEOUT, || async {
        broker.queue_len(&format!("{p}.service")).await >= 2
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let back = broker.get_all(&format!("{p}.in")).await;
    assert_eq!(back.len(), 1, "the original is back in the inbound queue");
    assert_eq!(back[0].body, b"keep me");
    assert!(back[0].redelivered);
    assert!(!broker.queue_exists(&format!("{p}.dlq")).await);
    delete_all_with_prefix(&p).await;
}
