//! Routing against the real broker: only the highest matching priority is
//! used, routing-key and header filters see the message as published,
//! `x-switchyard-only` restricts a message to the branches it names,
//! routing-key filters agree with a real topic exchange on every tricky key,
//! round robin is fair with hundreds of messages in flight, and matching a
//! 100-entry table of header, property and routing-key filters allocates
//! nothing.

mod support;

use lapin::types::{AMQPValue, FieldArray, FieldTable};
use lapin::{BasicProperties, ExchangeKind};
use std::collections::BTreeSet;
use support::harness::{InProcess, base_toml, endpoint_toml};
use support::{
    BULK_TIMEOUT, DEFAULT_TIMEOUT, Message, TestBroker, delete_all_with_prefix, unique_prefix,
};
use switchyard::envelope::Envelope;
use switchyard::routing::TopicPattern;

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

/// Binding keys (and filter patterns) and routing keys where topic matching
/// is easy to get wrong: the empty key, empty words, `#` at either end and
/// in the middle, `*.#`, dots only, and wildcard characters inside words.
const PATTERNS: &[&str] = &[
    "",
    "#",
    "*",
    "a",
    "a.*",
    "*.a",
    "a.#",
    "#.a",
    "#.a.#",
    "a.#.b",
    "a.*.b",
    "*.#",
    "#.*",
    "#.#",
    "*.*",
    "a.*.#",
    "#.*.#",
    "#.b.#.b.#",
    ".",
    "..",
    "a.",
    ".a",
    "*.",
    ".*",
    "#.",
    ".#",
    "a..b",
    "a#",
    "*a",
];
const KEYS: &[&str] = &[
    "", "a", "b", "a.b", "b.a", "a.a", "a.b.c", "a.x.b", "a.x.y.b", "x.a.y", "a.b.b", "b.x.b.y",
    ".", "..", "...", "a.", ".a", "a..b", "#", "*", "a.#", "a#", "*a",
];

/// Which of [`KEYS`] each of `queues` holds.
async fn keys_in(broker: &TestBroker, queues: &[String]) -> Vec<BTreeSet<usize>> {
    let mut held = Vec::new();
    for q in queues {
        let keys = broker
            .get_all(q)
            .await
            .iter()
            .map(|m| m.body_str().parse().unwrap())
            .collect();
        held.push(keys);
    }
    held
}

#[tokio::test]
async fn routing_key_filters_match_as_a_real_topic_exchange_binds() {
    let p = unique_prefix("topic");
    let broker = TestBroker::connect(&p).await;
    let mut toml = base_toml(&p, "nack");
    for (i, pattern) in PATTERNS.iter().enumerate() {
        toml.push_str(&endpoint_toml(
            &format!("f{i}"),
            "main",
            &format!("{p}.f{i}"),
            true,
            "",
        ));
        toml.push_str(&format!(
            "\n[filters.rk{i}]\ntype = \"routing_key\"\npattern = \"{pattern}\"\n\
             \n[[filter_table]]\nname = \"t{i}\"\nfilter = \"rk{i}\"\nendpoint = \"f{i}\"\n"
        ));
    }
    let forwarder = InProcess::start_consuming(&toml, &broker, &format!("{p}.in")).await;

    // The reference: one queue per binding key on a real topic exchange,
    // which also feeds the forwarder's inbound queue through "#".
    let topic = format!("{p}.topic");
    broker.declare_exchange(&topic, ExchangeKind::Topic).await;
    let reference: Vec<String> = (0..PATTERNS.len()).map(|i| format!("{p}.ref{i}")).collect();
    for (queue, pattern) in reference.iter().zip(PATTERNS) {
        broker.declare_queue(queue).await;
        broker.bind(queue, &topic, pattern).await;
    }
    broker.bind(&format!("{p}.in"), &topic, "#").await;
    for (k, key) in KEYS.iter().enumerate() {
        broker
            .publish(
                &topic,
                key,
                k.to_string().as_bytes(),
                BasicProperties::default(),
            )
            .await;
    }

    let by_exchange = keys_in(&broker, &reference).await;
    let routed: usize = by_exchange.iter().map(BTreeSet::len).sum();
    let unrouted = (0..KEYS.len())
        .filter(|k| by_exchange.iter().all(|keys| !keys.contains(k)))
        .count();
    let forwarded: Vec<String> = (0..PATTERNS.len()).map(|i| format!("{p}.f{i}")).collect();
    support::wait_until(
        "every key forwarded or dead-lettered",
        DEFAULT_TIMEOUT,
        || async {
            let mut copies = 0;
            for q in &forwarded {
                copies += broker.queue_len(q).await as usize;
            }
            copies == routed && broker.queue_len(&format!("{p}.dlq")).await as usize == unrouted
        },
    )
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let by_forwarder = keys_in(&broker, &forwarded).await;

    let mut disagreements = Vec::new();
    for (i, pattern) in PATTERNS.iter().enumerate() {
        let compiled = TopicPattern::parse(pattern);
        for (k, key) in KEYS.iter().enumerate() {
            let exchange = by_exchange[i].contains(&k);
            let filter = compiled.matches(key);
            let forwarder = by_forwarder[i].contains(&k);
            if exchange != filter || exchange != forwarder {
                disagreements.push(format!(
                    "pattern {pattern:?} key {key:?}: exchange {exchange}, filter {filter}, \
                     forwarder {forwarder}"
                ));
            }
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    // The cases this table exists for, as the exchange decided them.
    let routes = |pattern: &str, key: &str| {
        let i = PATTERNS.iter().position(|p| *p == pattern).unwrap();
        let k = KEYS.iter().position(|k| *k == key).unwrap();
        by_exchange[i].contains(&k)
    };
    assert!(!routes("*", "") && routes("#", "") && routes("", ""));
    assert!(!routes("*.#", "") && routes("*.#", "a") && routes("a.*", "a."));
    assert!(routes("*.*", ".") && !routes("*", ".") && routes("a.#.b", "a.b"));
    assert_eq!(broker.queue_len(&format!("{p}.in")).await, 0);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn round_robin_is_fair_with_many_messages_in_flight() {
    let p = unique_prefix("rrfair");
    let broker = TestBroker::connect(&p).await;
    let toml = format!(
        r#"{base}{a}{b}{c}
[backup_lists]
others = ["b", "c"]

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
        c = endpoint_toml("c", "main", &format!("{p}.c"), true, ""),
    );
    let forwarder = InProcess::start_consuming(&toml, &broker, &format!("{p}.in")).await;
    let queues = [format!("{p}.a"), format!("{p}.b"), format!("{p}.c")];
    // Pipelined: all 9,000 are published before the first confirm is
    // awaited, and the forwarder holds up to its prefetch (500) at once.
    broker
        .publish_many(
            "",
            &format!("{p}.in"),
            (0..9000).map(|i| i.to_string()),
            BasicProperties::default(),
        )
        .await;
    support::wait_until("all 9,000 forwarded", BULK_TIMEOUT, || async {
        let mut total = 0;
        for q in &queues {
            total += broker.queue_len(q).await;
        }
        total >= 9000
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let mut seen = BTreeSet::new();
    let mut duplicates = 0;
    for q in &queues {
        let bodies = broker.get_all(q).await;
        assert!(
            (2970..=3030).contains(&bodies.len()),
            "{q} got {} of 9,000, not 3,000 ± 1%",
            bodies.len()
        );
        for m in bodies {
            if !seen.insert(m.body_str().parse::<u32>().unwrap()) {
                duplicates += 1;
            }
        }
    }
    assert_eq!(duplicates, 0, "duplicated copies");
    assert_eq!(seen.len(), 9000, "every message once");
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    assert_eq!(broker.queue_len(&format!("{p}.in")).await, 0);
    delete_all_with_prefix(&p).await;
}

/// A 100-entry table of header, property, routing-key and combined filters
/// (every entry at priority 0, so every one is evaluated), each testing for
/// something the message of [`probe`] does not carry unless `hit` is set:
/// then entry 91 matches it, and so does entry 99, an `or` including it.
fn mixed_table(hit: bool) -> switchyard::config::Settings {
    let mut toml = String::from(
        r#"
[inbound]
broker = "main"
queue = "work.in"

[dead_letter]
exchange = "work.dlx"
routing_key = "work.dlq"

[brokers.main]
uri = "amqp://guest:guest@127.0.0.1:5672/%2f"

[endpoints.out]
broker = "main"
routing_key = "out"
"#,
    );
    for i in 0..100 {
        let n = if hit && i == 91 { 42 } else { 1000 + i };
        let filter = match i % 10 {
            0 => format!("type = \"header\"\nheader = \"tenant\"\nequals = \"acme-{i}\""),
            1 => format!("type = \"header\"\nheader = \"count\"\nequals = {n}"),
            2 => format!("type = \"header\"\nheader = \"ratio\"\nin = [{i}.25, {i}.75]"),
            3 => format!("type = \"header\"\nheader = \"tenant\"\nregex = \"^t{i}-\""),
            4 => format!("type = \"header\"\nheader = \"absent-{i}\"\nexists = true"),
            5 => format!("type = \"property\"\nproperty = \"content_type\"\nequals = \"text/{i}\""),
            6 => format!("type = \"property\"\nproperty = \"priority\"\nin = [{i}, {n}]"),
            7 => format!("type = \"routing_key\"\npattern = \"orders.#.x{i}\""),
            8 => format!("type = \"and\"\nfilters = [\"f{}\", \"f{}\"]", i - 1, i - 2),
            _ => format!(
                "type = \"or\"\nfilters = [\"f{}\", \"f{}\", \"f{}\"]",
                i - 8,
                i - 9,
                i - 1
            ),
        };
        toml.push_str(&format!(
            "\n[filters.f{i}]\n{filter}\n\n[[filter_table]]\nname = \"b{i}\"\nfilter = \"f{i}\"\nendpoint = \"out\"\n"
        ));
    }
    switchyard::config::load_str(&toml, "mixed table").unwrap_or_else(|e| panic!("{e}"))
}

fn probe() -> Envelope {
    let headers = support::field_table([
        ("tenant", AMQPValue::LongString("acme".into())),
        ("count", AMQPValue::LongLongInt(42)),
        ("ratio", AMQPValue::Double(0.5)),
        ("region", AMQPValue::ShortString("eu".into())),
    ]);
    Envelope {
        delivery_tag: 1,
        exchange: "orders".to_owned(),
        routing_key: "orders.new.eu".to_owned(),
        redelivered: false,
        properties: BasicProperties::default()
            .with_headers(headers)
            .with_content_type("application/json".into())
            .with_priority(5),
        body: br#"{"order": 1}"#.to_vec(),
    }
}

#[test]
fn matching_header_property_and_routing_key_filters_allocates_nothing() {
    let message = probe();
    let miss = mixed_table(false).routing;
    assert!(miss.route(&message).is_empty(), "nothing matches");
    let counted = allocation_counter::measure(|| {
        for _ in 0..100 {
            assert!(miss.route(&message).is_empty());
        }
    });
    assert_eq!(counted.count_total, 0, "100 routings through 100 entries");

    // With a match, the only allocation is the list of branches returned.
    let hit = mixed_table(true).routing;
    let names = |plans: Vec<switchyard::routing::BranchPlan>| {
        plans.iter().map(|p| p.name.to_string()).collect::<Vec<_>>()
    };
    assert_eq!(names(hit.route(&message)), ["b91", "b99"]);
    let counted = allocation_counter::measure(|| {
        assert_eq!(hit.route(&message).len(), 2);
    });
    assert_eq!(counted.count_total, 1);
}
