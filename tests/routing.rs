//! Routing against the real broker: only the highest matching priority is
//! used, routing-key and header filters see the message as published, and
//! `x-switchyard-only` restricts a message to the branches it names.

mod support;

use lapin::types::{AMQPValue, FieldArray, FieldTable};
use lapin::{BasicProperties, ExchangeKind};
use support::harness::{InProcess, base_toml, endpoint_toml};
use support::{DEFAULT_TIMEOUT, Message, TestBroker, delete_all_with_prefix, unique_prefix};

fn toml(p: &str) -> String {
    format!(
        r#"{base}{express}{service}{logging}{eu}
[filters.all]
type = "match_all"

[filters.urgent]
type = "header"
header = "urgent"
equals = true

[filters.eu_orders]
type = "routing_key"
pattern = "orders.*.eu"

[filters.eu_not_urgent]
type = "and"
filters = ["eu_orders", "calm"]

[filters.calm]
type = "not"
filter = "urgent"

[[filter_table]]
name = "express"
filter = "urgent"
endpoint = "express"
priority = 10

[[filter_table]]
name = "eu"
filter = "eu_not_urgent"
endpoint = "eu"
priority = 5

[[filter_table]]
name = "service"
filter = "all"
endpoint = "service"

[[filter_table]]
name = "logging"
filter = "all"
endpoint = "logging"
"#,
        base = base_toml(p, "nack"),
        express = endpoint_toml("express", "main", &format!("{p}.express"), true, ""),
        service = endpoint_toml("service", "main", &format!("{p}.service"), true, ""),
        logging = endpoint_toml("logging", "main", &format!("{p}.logging"), true, ""),
        eu = endpoint_toml("eu", "main", &format!("{p}.eu"), true, ""),
    )
}

fn with_headers(entries: &[(&str, AMQPValue)]) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (k, v) in entries {
        headers.insert((*k).into(), v.clone());
    }
    BasicProperties::default().with_headers(headers)
}

async fn bodies(broker: &TestBroker, queue: &str) -> Vec<String> {
    let mut b: Vec<String> = broker
        .get_all(queue)
        .await
        .iter()
        .map(Message::body_str)
        .collect();
    b.sort();
    b
}

#[tokio::test]
async fn the_highest_matching_priority_wins_and_filters_see_the_published_message() {
    let p = unique_prefix("routing");
    let broker = TestBroker::connect(&p).await;
    let forwarder = InProcess::start_consuming(&toml(&p), &broker, &format!("{p}.in")).await;
    // Publish through a topic exchange so messages carry their own routing keys.
    broker
        .declare_exchange(&format!("{p}.topic"), ExchangeKind::Topic)
        .await;
    broker
        .bind(&format!("{p}.in"), &format!("{p}.topic"), "#")
        .await;
    let topic = format!("{p}.topic");
    let urgent = || with_headers(&[("urgent", AMQPValue::Boolean(true))]);
    broker
        .publish(&topic, "orders.new.eu", b"urgent-eu", urgent())
        .await;
    broker
        .publish(
            &topic,
            "orders.new.eu",
            b"calm-eu",
            BasicProperties::default(),
        )
        .await;
    broker
        .publish(
            &topic,
            "orders.new.us",
            b"calm-us",
            BasicProperties::default(),
        )
        .await;
    broker
        .publish(
            &topic,
            "x",
            b"urgent-text",
            with_headers(&[("urgent", AMQPValue::LongString("true".into()))]),
        )
        .await;
    broker
        .publish(
            &topic,
            "x",
            b"not-urgent",
            with_headers(&[("urgent", AMQPValue::Boolean(false))]),
        )
        .await;

    broker
        .await_count(&format!("{p}.express"), 2, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.eu"), 1, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.service"), 2, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.logging"), 2, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.in"), 0, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(
        bodies(&broker, &format!("{p}.express")).await,
        ["urgent-eu", "urgent-text"]
    );
    assert_eq!(bodies(&broker, &format!("{p}.eu")).await, ["calm-eu"]);
    assert_eq!(
        bodies(&broker, &format!("{p}.service")).await,
        ["calm-us", "not-urgent"]
    );
    assert_eq!(
        bodies(&broker, &format!("{p}.logging")).await,
        ["calm-us", "not-urgent"]
    );
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn only_header_limits_delivery_to_the_named_branches() {
    let p = unique_prefix("only");
    let broker = TestBroker::connect(&p).await;
    let forwarder = InProcess::start_consuming(&toml(&p), &broker, &format!("{p}.in")).await;
    let only = |names: &[&str]| {
        let names = names
            .iter()
            .map(|n| AMQPValue::LongString((*n).into()))
            .collect::<Vec<_>>();
        with_headers(&[(
            "x-switchyard-only",
            AMQPValue::FieldArray(FieldArray::from(names)),
        )])
    };
    broker
        .publish("", &format!("{p}.in"), b"to-logging", only(&["logging"]))
        .await;
    broker
        .publish(
            "",
            &format!("{p}.in"),
            b"to-both",
            only(&["service", "logging"]),
        )
        .await;
    broker
        .publish(
            "",
            &format!("{p}.in"),
            b"to-nobody",
            only(&["retired-branch"]),
        )
        .await;
    broker
        .await_count(&format!("{p}.logging"), 2, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.dlq"), 1, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        bodies(&broker, &format!("{p}.logging")).await,
        ["to-both", "to-logging"]
    );
    assert_eq!(bodies(&broker, &format!("{p}.service")).await, ["to-both"]);
    assert_eq!(bodies(&broker, &format!("{p}.dlq")).await, ["to-nobody"]);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn round_robin_spreads_messages_over_its_endpoints() {
    let p = unique_prefix("rr");
    let broker = TestBroker::connect(&p).await;
    let toml = format!(
        r#"{base}{a}{b}
[backup_lists]
others = ["b"]

[filters.all]
type = "match_all"

[[filter_table]]
name = "spread"
filter = "all"
endpoint = "a"
backup_list = "others"
strategy = "round_robin"
"#,
        base = base_toml(&p, "nack"),
        a = endpoint_toml("a", "main", &format!("{p}.a"), true, ""),
        b = endpoint_toml("b", "main", &format!("{p}.b"), true, ""),
    );
    let forwarder = InProcess::start_consuming(&toml, &broker, &format!("{p}.in")).await;
    let bodies_sent: Vec<String> = (0..100).map(|i| format!("{i}")).collect();
    broker
        .publish_many(
            "",
            &format!("{p}.in"),
            bodies_sent.iter(),
            BasicProperties::default(),
        )
        .await;
    broker
        .await_count(&format!("{p}.in"), 0, DEFAULT_TIMEOUT)
        .await;
    support::wait_until("all 100 forwarded", DEFAULT_TIMEOUT, || async {
        broker.queue_len(&format!("{p}.a")).await + broker.queue_len(&format!("{p}.b")).await == 100
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(broker.queue_len(&format!("{p}.a")).await, 50);
    assert_eq!(broker.queue_len(&format!("{p}.b")).await, 50);
    delete_all_with_prefix(&p).await;
}
