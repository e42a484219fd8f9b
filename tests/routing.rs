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
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::InProcess;
use support::{
    BULK_TIMEOUT, DEFAULT_TIMEOUT, Message, TestBroker, delete_all_with_prefix, unique_prefix,
};
use switchyard::envelope::Envelope;
use switchyard::routing::TopicPattern;

fn toml(p: &str) -> String {
    let queue = |name: &str| Endpoint::queue(name, &format!("{p}.{name}"));
    Forwarder::new(p)
        .endpoint(queue("express"))
        .endpoint(queue("service"))
        .endpoint(queue("logging"))
        .endpoint(queue("eu"))
        .filter("all", Filter::match_all())
        .filter("urgent", Filter::header("urgent").set("equals", true))
        .filter("eu_orders", Filter::routing_key("orders.*.eu"))
        .filter("eu_not_urgent", Filter::all_of(&["eu_orders", "calm"]))
        .filter("calm", Filter::not("urgent"))
        .branch(Branch::new("express", "urgent", "express").set("priority", 10))
        .branch(Branch::new("eu", "eu_not_urgent", "eu").set("priority", 5))
        .branch(Branch::new("service", "all", "service"))
        .branch(Branch::new("logging", "all", "logging"))
        .toml()
}

/// One round-robin branch "spread" over every message, across `endpoints`
/// (queues `<p>.<name>`).
fn round_robin(p: &str, endpoints: &[&str]) -> String {
    let mut config = Forwarder::new(p)
        .backup_list("others", &endpoints[1..])
        .filter("all", Filter::match_all())
        .branch(
            Branch::new("spread", "all", endpoints[0])
                .backups("others")
                .set("strategy", "round_robin"),
        );
    for name in endpoints {
        config = config.endpoint(Endpoint::queue(name, &format!("{p}.{name}")));
    }
    config.toml()
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
        // From the forwarder's own user (`guest`), as `dlq redrive` sends it:
        // a producer's is ignored (tests/trust.rs).
        with_headers(&[(
            "x-switchyard-only",
            AMQPValue::FieldArray(FieldArray::from(names)),
        )])
        .with_user_id("guest".into())
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
    let toml = round_robin(&p, &["a", "b"]);
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
    let mut config = Forwarder::new(&p);
    for (i, pattern) in PATTERNS.iter().enumerate() {
        config = config
            .endpoint(Endpoint::queue(&format!("f{i}"), &format!("{p}.f{i}")))
            .filter(&format!("rk{i}"), Filter::routing_key(pattern))
            .branch(Branch::new(
                &format!("t{i}"),
                &format!("rk{i}"),
                &format!("f{i}"),
            ));
    }
    let toml = config.toml();
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
    let toml = round_robin(&p, &["a", "b", "c"]);
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
    let mut config = Forwarder::new("work").endpoint(Endpoint::queue("out", "out").undeclared());
    for i in 0..100i64 {
        let n = if hit && i == 91 { 42 } else { 1000 + i };
        let filter = match i % 10 {
            0 => Filter::header("tenant").set("equals", format!("acme-{i}")),
            1 => Filter::header("count").set("equals", n),
            2 => Filter::header("ratio").set("in", [i as f64 + 0.25, i as f64 + 0.75]),
            3 => Filter::header("tenant").set("regex", format!("^t{i}-")),
            4 => Filter::header(&format!("absent-{i}")).set("exists", true),
            5 => Filter::property("content_type").set("equals", format!("text/{i}")),
            6 => Filter::property("priority").set("in", [i, n]),
            7 => Filter::routing_key(&format!("orders.#.x{i}")),
            8 => Filter::all_of(&[&format!("f{}", i - 1), &format!("f{}", i - 2)]),
            _ => Filter::any_of(&[
                &format!("f{}", i - 8),
                &format!("f{}", i - 9),
                &format!("f{}", i - 1),
            ]),
        };
        config = config.filter(&format!("f{i}"), filter).branch(Branch::new(
            &format!("b{i}"),
            &format!("f{i}"),
            "out",
        ));
    }
    let toml = config.toml();
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
        annotations: Default::default(),
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
