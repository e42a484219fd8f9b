//! Dead letters: an exhausted backup list and a message no filter matches
//! go to the dead-letter queue, in both modes, with the delivered branches
//! never sent twice and (in republish mode) the documented annotations.

use crate::support;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::InProcess;
use support::{
    DEFAULT_TIMEOUT, Message, TestBroker, amqp_str, delete_all_with_prefix, field_table,
    ready_unacked, unique_prefix, wait_until,
};

/// "service" delivers to an existing queue; "logging" has only missing
/// queues (every attempt returned), so its list is exhausted.
fn exhausting(p: &str, mode: &str) -> Forwarder {
    let missing =
        |name: &str, queue: &str| Endpoint::queue(name, &format!("{p}.{queue}")).undeclared();
    Forwarder::new(p)
        .mode(mode)
        .endpoint(Endpoint::queue("service", &format!("{p}.service")))
        .endpoint(missing("logging", "logging.missing"))
        .endpoint(missing("logging_backup", "logging.gone"))
        .backup_list("logging_backups", &["logging_backup"])
        .filter("all", Filter::match_all())
        .branch(Branch::new("service", "all", "service"))
        .branch(Branch::new("logging", "all", "logging").backups("logging_backups"))
}

/// Only messages with header `kind = order` have a route.
fn selective(p: &str, mode: &str) -> Forwarder {
    Forwarder::new(p)
        .mode(mode)
        .endpoint(Endpoint::queue("service", &format!("{p}.service")))
        .filter("orders", Filter::header("kind").set("equals", "order"))
        .branch(Branch::new("service", "orders", "service"))
}

fn props(id: &str, kind: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("kind".into(), AMQPValue::LongString(kind.into()));
    BasicProperties::default()
        .with_message_id(id.into())
        .with_correlation_id(format!("c-{id}").into())
        .with_headers(headers)
}

use support::array_names as names;

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
        InProcess::start_consuming(&exhausting(&p, "nack").toml(), &broker, &format!("{p}.in"))
            .await;
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
        &exhausting(&p, "republish").toml(),
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
        InProcess::start_consuming(&selective(&p, "nack").toml(), &broker, &format!("{p}.in"))
            .await;
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
        &selective(&p, "republish").toml(),
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
async fn an_unconfirmed_dead_letter_keeps_the_original_and_never_resends_delivered_branches() {
    let p = unique_prefix("dl-full");
    let broker = TestBroker::connect(&p).await;
    let dlq = format!("{p}.dlq");
    // A full dead-letter queue that refuses publishes: the annotated copy is
    // nacked until room is made.
    broker
        .declare_queue_with(
            &dlq,
            field_table([
                ("x-max-length", AMQPValue::LongLongInt(1)),
                ("x-overflow", amqp_str("reject-publish")),
            ]),
        )
        .await;
    broker
        .declare_exchange(&format!("{p}.dlx"), lapin::ExchangeKind::Direct)
        .await;
    broker.bind(&dlq, &format!("{p}.dlx"), &dlq).await;
    broker
        .publish("", &dlq, b"filler", props("filler", "x"))
        .await;
    let toml = exhausting(&p, "republish").no_dead_letter_queue().toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &format!("{p}.in")).await;
    broker
        .publish("", &format!("{p}.in"), b"keep me", props("m1", "order"))
        .await;
    wait_until("the original is held unacked", DEFAULT_TIMEOUT, || async {
        ready_unacked(&format!("{p}.in")).await == Some((0, 1))
    })
    .await;
    // The copy is retried with backoff (0.1, 0.2, 0.4, 0.8, 1.6 s...); for
    // well past the old three tries the original stays held and the
    // delivered branch gets no second copy.
    let watched = tokio::time::Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert_eq!(ready_unacked(&format!("{p}.in")).await, Some((0, 1)));
        assert_eq!(broker.queue_len(&format!("{p}.service")).await, 1);
        tokio::time::sleep(support::POLL_INTERVAL).await;
    }
    // Room in the dead-letter queue: the next try lands and the original is acked.
    let filler = broker.get_all(&dlq).await;
    assert_eq!(filler.len(), 1);
    broker.await_count(&dlq, 1, DEFAULT_TIMEOUT).await;
    wait_until("the original is acked", DEFAULT_TIMEOUT, || async {
        ready_unacked(&format!("{p}.in")).await == Some((0, 0))
    })
    .await;
    let dead = broker.get_all(&dlq).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body, b"keep me");
    assert_eq!(
        dead[0].header_str("x-switchyard-reason").as_deref(),
        Some("exhausted")
    );
    assert_eq!(
        broker.queue_len(&format!("{p}.service")).await,
        1,
        "never resent"
    );
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}
