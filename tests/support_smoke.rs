//! Real-broker smoke tests for the shared integration-test support module.

use crate::support;

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::BasicPublishOptions;
use lapin::types::AMQPValue;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use support::*;

#[tokio::test]
async fn wait_helpers_poll_until_ready() {
    let mut polls = 0u32;
    let got = wait_for("the fifth poll", Duration::from_secs(5), || {
        polls += 1;
        let ready = polls >= 5;
        async move { ready.then_some(polls) }
    })
    .await;
    assert_eq!(got, 5);

    let start = tokio::time::Instant::now();
    wait_until(
        "200 ms have passed",
        Duration::from_secs(5),
        || async move { start.elapsed() >= Duration::from_millis(200) },
    )
    .await;
    assert!(start.elapsed() >= Duration::from_millis(200));

    let a = unique_prefix("same test/name");
    let b = unique_prefix("same test/name");
    assert_ne!(a, b);
    assert!(a.starts_with("sy-same-test-name-"), "{a}");
    assert!(
        a.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "{a}"
    );
}

#[tokio::test]
#[should_panic(expected = "the impossible")]
async fn wait_until_panics_naming_the_condition() {
    wait_until("the impossible", Duration::from_millis(150), || async {
        false
    })
    .await;
}

#[tokio::test]
async fn publish_get_roundtrip_keeps_properties_and_headers() {
    let prefix = unique_prefix("roundtrip");
    let broker = TestBroker::connect(&prefix).await;
    let exchange = format!("{prefix}-x");
    let queue = format!("{prefix}-q");
    broker
        .declare_exchange(&exchange, ExchangeKind::Direct)
        .await;
    broker.declare_queue(&queue).await;
    broker.bind(&queue, &exchange, "route-a").await;
    assert!(broker.queue_exists(&queue).await);
    assert!(broker.exchange_exists(&exchange).await);
    assert!(!broker.queue_exists(&format!("{prefix}-missing")).await);
    assert_eq!(
        broker.try_queue_len(&format!("{prefix}-missing")).await,
        None
    );

    let headers = field_table([
        ("x-origin", amqp_str("smoke")),
        ("x-attempt", AMQPValue::LongInt(3)),
    ]);
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id("m-1".into())
        .with_correlation_id("c-1".into())
        .with_delivery_mode(2)
        .with_priority(4)
        .with_headers(headers);
    let confirmation = broker
        .publish(&exchange, "route-a", br#"{"n":1}"#, props)
        .await;
    assert_eq!(confirmation, Confirmation::Ack(None));

    // mandatory=true: an unroutable publish is acked *and* returned.
    let unroutable = broker
        .publish(
            &exchange,
            "no-such-route",
            b"lost",
            BasicProperties::default(),
        )
        .await;
    assert!(unroutable.is_ack());
    let returned = unroutable
        .take_message()
        .expect("mandatory publish to an unbound key must be returned");
    assert_eq!(returned.delivery.data, b"lost");

    broker.await_count(&queue, 1, DEFAULT_TIMEOUT).await;
    let msgs = broker.get_all(&queue).await;
    assert_eq!(msgs.len(), 1);
    let m = &msgs[0];
    assert_eq!(m.body, br#"{"n":1}"#);
    assert_eq!(m.body_str(), r#"{"n":1}"#);
    assert_eq!(m.exchange, exchange);
    assert_eq!(m.routing_key, "route-a");
    assert!(!m.redelivered);
    assert_eq!(
        m.properties.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(
        m.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("m-1")
    );
    assert_eq!(
        m.properties.correlation_id().as_ref().map(|s| s.as_str()),
        Some("c-1")
    );
    assert_eq!(*m.properties.delivery_mode(), Some(2));
    assert_eq!(*m.properties.priority(), Some(4));
    assert_eq!(m.header_str("x-origin").as_deref(), Some("smoke"));
    assert_eq!(m.header("x-attempt"), Some(&AMQPValue::LongInt(3)));
    assert_eq!(broker.queue_len(&queue).await, 0, "get_all drains and acks");

    broker.cleanup(&[&queue], &[&exchange]).await;
    assert!(!broker.queue_exists(&queue).await);
    assert!(!broker.exchange_exists(&exchange).await);
    // Cleaning up what is already gone is fine.
    broker.cleanup(&[&queue], &[&exchange]).await;
    broker.close().await;
}

#[tokio::test]
async fn publish_many_loads_a_thousand_messages() {
    let prefix = unique_prefix("bulk");
    let broker = TestBroker::connect(&prefix).await;
    let queue = format!("{prefix}-q");
    broker.declare_queue(&queue).await;

    let bodies = (0..1000).map(|i| format!("msg-{i:04}").into_bytes());
    let n = broker
        .publish_many("", &queue, bodies, BasicProperties::default())
        .await;
    assert_eq!(n, 1000);
    broker.await_count(&queue, 1000, DEFAULT_TIMEOUT).await;

    let msgs = broker.get_all(&queue).await;
    assert_eq!(msgs.len(), 1000);
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(m.body_str(), format!("msg-{i:04}"), "order is kept");
        assert_eq!(m.routing_key, queue);
    }
    assert_eq!(broker.delete_queue(&queue).await, 0);
    assert!(!broker.queue_exists(&queue).await);
    broker.close().await;
}

#[tokio::test]
async fn await_count_reports_the_actual_count() {
    let prefix = unique_prefix("await-count");
    let broker = TestBroker::connect(&prefix).await;
    let queue = format!("{prefix}-q");
    broker.declare_queue(&queue).await;
    broker
        .publish_many("", &queue, [b"a", b"b"], BasicProperties::default())
        .await;

    let result = {
        let fut = broker.await_count(&queue, 3, Duration::from_millis(300));
        futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(fut)).await
    };
    let panic = result.expect_err("await_count must panic when the count is not reached");
    let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains(&queue) && msg.contains("it holds 2"), "{msg}");

    broker.cleanup(&[&queue], &[]).await;
    broker.close().await;
}

#[tokio::test]
async fn catch_all_cleanup_finds_and_deletes_by_prefix() {
    let prefix = unique_prefix("catch-all");
    let broker = TestBroker::connect(&prefix).await;
    let queues = [format!("{prefix}-a"), format!("{prefix}-b")];
    let exchange = format!("{prefix}-x");
    for q in &queues {
        broker.declare_queue(q).await;
    }
    broker
        .declare_exchange(&exchange, ExchangeKind::Fanout)
        .await;

    assert_eq!(rabbitmq_queues_with_prefix(&prefix).await, queues.to_vec());
    assert_eq!(
        rabbitmq_exchanges_with_prefix(&prefix).await,
        vec![exchange.clone()]
    );
    assert_eq!(delete_all_with_prefix(&prefix).await, 3);
    assert!(rabbitmq_queues_with_prefix(&prefix).await.is_empty());
    assert!(rabbitmq_exchanges_with_prefix(&prefix).await.is_empty());
    assert!(!broker.exchange_exists(&exchange).await);
    broker.close().await;
}

#[tokio::test]
async fn fault_proxy_stall_holds_confirms_until_resume() {
    let prefix = unique_prefix("proxy-stall");
    let direct = TestBroker::connect(&prefix).await;
    let queue = format!("{prefix}-q");
    direct.declare_queue(&queue).await;

    let proxy = FaultProxy::start(amqp_addr()).await;
    let proxied = TestBroker::connect_to(&proxy.amqp_url(), &format!("{prefix}-proxied")).await;
    assert_eq!(proxy.connections(), 1);
    assert!(
        proxy
            .amqp_url()
            .ends_with(&format!(":{}/%2f", proxy.port()))
    );

    // Pass-through works.
    let ack = proxied
        .publish("", &queue, b"before", BasicProperties::default())
        .await;
    assert_eq!(ack, Confirmation::Ack(None));
    direct.await_count(&queue, 1, DEFAULT_TIMEOUT).await;

    proxy.stall();
    assert!(proxy.is_stalled());
    let confirm = proxied
        .channel()
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            b"during-stall",
            BasicProperties::default(),
        )
        .await
        .expect("publish frames are accepted locally while stalled");
    tokio::pin!(confirm);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), confirm.as_mut())
            .await
            .is_err(),
        "no confirm may arrive while the proxy is stalled"
    );
    assert_eq!(
        direct.queue_len(&queue).await,
        1,
        "the broker never saw the stalled publish"
    );
    assert_eq!(proxy.connections(), 1, "a stall keeps the connection open");

    proxy.resume();
    let confirmation = tokio::time::timeout(DEFAULT_TIMEOUT, confirm)
        .await
        .expect("confirm arrives after resume")
        .expect("confirm succeeds after resume");
    assert_eq!(confirmation, Confirmation::Ack(None));
    direct.await_count(&queue, 2, DEFAULT_TIMEOUT).await;
    let bodies: Vec<String> = direct
        .get_all(&queue)
        .await
        .iter()
        .map(|m| m.body_str())
        .collect();
    assert_eq!(bodies, ["before", "during-stall"]);

    proxied.close().await;
    wait_until(
        "the proxied connection is gone",
        DEFAULT_TIMEOUT,
        || async { proxy.connections() == 0 },
    )
    .await;
    direct.cleanup(&[&queue], &[]).await;
    direct.close().await;
}

#[tokio::test]
async fn fault_proxy_cut_breaks_connections_but_accepts_new_ones() {
    let prefix = unique_prefix("proxy-cut");
    let direct = TestBroker::connect(&prefix).await;
    let queue = format!("{prefix}-q");
    direct.declare_queue(&queue).await;

    let proxy = FaultProxy::start(amqp_addr()).await;
    let victim = TestBroker::connect_to(&proxy.amqp_url(), &format!("{prefix}-victim")).await;
    assert!(
        victim
            .publish("", &queue, b"one", BasicProperties::default())
            .await
            .is_ack()
    );
    assert_eq!(proxy.connections(), 1);

    assert_eq!(proxy.cut(), 1);
    wait_until(
        "the cut connection reports failure",
        DEFAULT_TIMEOUT,
        || async { !victim.connection().status().connected() },
    )
    .await;
    let after_cut = victim
        .try_publish("", &queue, b"lost", BasicProperties::default())
        .await;
    assert!(
        after_cut.is_err(),
        "publish on a cut connection must fail: {after_cut:?}"
    );
    wait_until(
        "the proxy forgets the cut connection",
        DEFAULT_TIMEOUT,
        || async { proxy.connections() == 0 },
    )
    .await;

    let fresh = TestBroker::connect_to(&proxy.amqp_url(), &format!("{prefix}-fresh")).await;
    assert_eq!(proxy.connections(), 1);
    assert_eq!(
        fresh
            .publish("", &queue, b"two", BasicProperties::default())
            .await,
        Confirmation::Ack(None)
    );
    direct.await_count(&queue, 2, DEFAULT_TIMEOUT).await;

    fresh.close().await;
    drop(victim);
    direct.cleanup(&[&queue], &[]).await;
    direct.close().await;
}

#[tokio::test]
async fn fault_proxy_refuse_rejects_new_connections_only_while_on() {
    let prefix = unique_prefix("proxy-refuse");
    let proxy = FaultProxy::start(amqp_addr()).await;
    let existing = TestBroker::connect_to(&proxy.amqp_url(), &format!("{prefix}-existing")).await;

    proxy.refuse(true);
    let refused = tokio::time::timeout(
        DEFAULT_TIMEOUT,
        Connection::connect(
            &proxy.amqp_url(),
            ConnectionProperties::default().with_connection_name(format!("{prefix}-r").into()),
        ),
    )
    .await
    .expect("a refused connect fails promptly, it does not hang");
    assert!(refused.is_err(), "connect must fail while refusing");
    assert_eq!(proxy.connections(), 1, "only the pre-existing connection");
    assert!(
        existing.connection().status().connected(),
        "refuse leaves existing connections alone"
    );

    proxy.refuse(false);
    let again = TestBroker::connect_to(&proxy.amqp_url(), &format!("{prefix}-again")).await;
    assert!(again.connection().status().connected());
    assert_eq!(proxy.connections(), 2);
    again.close().await;
    existing.close().await;
}

#[tokio::test]
async fn close_connections_named_closes_only_the_named_connection() {
    let prefix = unique_prefix("ctl-close");
    let bystander = TestBroker::connect(&prefix).await;
    let victim_name = format!("{prefix}-victim");
    let victim = TestBroker::connect_to(&amqp_url(), &victim_name).await;
    let queue = format!("{prefix}-q");
    bystander.declare_queue(&queue).await;

    let names = connection_names().await;
    assert!(names.contains(&victim_name), "{names:?}");
    assert!(names.contains(&bystander.name().to_string()), "{names:?}");

    assert_eq!(close_connections_named(&victim_name).await, 1);
    wait_until("the closed connection notices", DEFAULT_TIMEOUT, || async {
        !victim.connection().status().connected()
    })
    .await;
    let res = victim
        .try_publish("", &queue, b"x", BasicProperties::default())
        .await;
    assert!(res.is_err(), "publish on a closed connection: {res:?}");
    assert!(!connection_names().await.contains(&victim_name));
    assert_eq!(close_connections_named(&victim_name).await, 0);

    assert!(bystander.connection().status().connected());
    assert!(
        bystander
            .publish("", &queue, b"still-fine", BasicProperties::default())
            .await
            .is_ack()
    );
    bystander.await_count(&queue, 1, DEFAULT_TIMEOUT).await;
    bystander.cleanup(&[&queue], &[]).await;
    bystander.close().await;
}

/// A private node: its own broker for faults the shared one must not see.
/// Publish and consume, a memory alarm that blocks a publishing connection
/// (and only it) until cleared, a queue that refuses publishes without
/// dropping what it holds, an app restart that keeps durable messages,
/// closing a named connection, and a stop that leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_node_alarms_refuses_restarts_and_stops() {
    let started = tokio::time::Instant::now();
    let node = PrivateNode::start().await;
    println!(
        "private node {} on {} started in {:?}",
        node.node_name(),
        node.amqp_addr(),
        started.elapsed()
    );
    assert_ne!(node.amqp_addr(), amqp_addr());
    let prefix = unique_prefix("node");
    let queue = format!("{prefix}-q");
    let persistent = || BasicProperties::default().with_delivery_mode(2);

    let publisher = TestBroker::connect_to(&node.amqp_url(), &format!("{prefix}-pub")).await;
    // Declares and reads only: never publishes, so the alarm never blocks it.
    let reader = TestBroker::connect_to(&node.amqp_url(), &format!("{prefix}-reader")).await;
    reader.declare_queue(&queue).await;
    assert_eq!(
        publisher.publish("", &queue, b"one", persistent()).await,
        Confirmation::Ack(None)
    );
    reader.await_count(&queue, 1, DEFAULT_TIMEOUT).await;
    let got: Vec<String> = reader
        .get_all(&queue)
        .await
        .iter()
        .map(Message::body_str)
        .collect();
    assert_eq!(got, ["one"]);
    let shared = TestBroker::connect(&prefix).await;
    assert!(
        !shared.queue_exists(&queue).await,
        "the private node is not the shared broker"
    );
    shared.close().await;

    // The memory alarm: the publishing connection is blocked at its next
    // publish, whose confirm waits until the alarm is cleared.
    let mut events = publisher.connection().events_listener();
    node.set_memory_alarm(true).await;
    assert!(node.memory_alarm().await);
    let held = publisher
        .channel()
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            b"held",
            persistent(),
        )
        .await
        .expect("a publish is accepted locally while blocked");
    let blocked = tokio::time::timeout(DEFAULT_TIMEOUT, async {
        while let Some(event) = events.next().await {
            if let lapin::Event::ConnectionBlocked(reason) = event {
                return reason;
            }
        }
        panic!("the event stream ended before connection.blocked");
    })
    .await
    .expect("connection.blocked within the timeout");
    println!("blocked: {blocked}");
    assert!(publisher.connection().status().blocked());
    assert_eq!(
        reader.queue_len(&queue).await,
        0,
        "the broker holds it back"
    );

    node.set_memory_alarm(false).await;
    tokio::time::timeout(DEFAULT_TIMEOUT, async {
        while let Some(event) = events.next().await {
            if matches!(event, lapin::Event::ConnectionUnblocked) {
                return;
            }
        }
        panic!("the event stream ended before connection.unblocked");
    })
    .await
    .expect("connection.unblocked within the timeout");
    assert!(!node.memory_alarm().await);
    let confirmation = tokio::time::timeout(DEFAULT_TIMEOUT, held)
        .await
        .expect("the held publish is confirmed after the alarm")
        .expect("confirm");
    assert_eq!(confirmation, Confirmation::Ack(None));
    reader.await_count(&queue, 1, DEFAULT_TIMEOUT).await;

    // Refusal by policy: publishes are nacked, nothing already there is lost.
    node.allow_refusal(&queue).await;
    publisher
        .publish_many("", &queue, ["two", "three"], persistent())
        .await;
    reader.await_count(&queue, 3, DEFAULT_TIMEOUT).await;
    node.refuse_publishes(&queue, true).await;
    wait_until("the queue refuses publishes", DEFAULT_TIMEOUT, || async {
        publisher
            .publish("", &queue, b"refused", persistent())
            .await
            .is_nack()
    })
    .await;
    assert_eq!(reader.queue_len(&queue).await, 3, "nothing dropped");
    node.refuse_publishes(&queue, false).await;
    wait_until(
        "the queue accepts publishes again",
        DEFAULT_TIMEOUT,
        || async {
            publisher
                .publish("", &queue, b"four", persistent())
                .await
                .is_ack()
        },
    )
    .await;
    let bodies: Vec<String> = reader
        .get_all(&queue)
        .await
        .iter()
        .map(Message::body_str)
        .collect();
    assert_eq!(&bodies[..4], ["held", "two", "three", "four"], "{bodies:?}");

    // An app restart closes every connection; durable messages survive.
    publisher
        .publish("", &queue, b"durable", persistent())
        .await;
    node.restart_app().await;
    wait_until("the clients see the restart", DEFAULT_TIMEOUT, || async {
        !publisher.connection().status().connected() && !reader.connection().status().connected()
    })
    .await;
    let again = TestBroker::connect_to(&node.amqp_url(), &format!("{prefix}-again")).await;
    again.await_count(&queue, 1, DEFAULT_TIMEOUT).await;
    let bodies: Vec<String> = again
        .get_all(&queue)
        .await
        .iter()
        .map(Message::body_str)
        .collect();
    assert_eq!(bodies, ["durable"]);

    // Closing a named connection on the node.
    let names: Vec<String> = node
        .connections()
        .await
        .into_iter()
        .filter_map(|c| c.name)
        .collect();
    assert!(names.contains(&format!("{prefix}-again")), "{names:?}");
    assert_eq!(
        node.close_connections_named(&format!("{prefix}-again"))
            .await,
        1
    );
    wait_until("the closed connection notices", DEFAULT_TIMEOUT, || async {
        !again.connection().status().connected()
    })
    .await;

    let url = node.amqp_url();
    node.stop().await;
    let after = Connection::connect(&url, ConnectionProperties::default()).await;
    assert!(after.is_err(), "the stopped node still accepts connections");
}

#[tokio::test]
async fn black_hole_accepts_and_never_answers() {
    let hole = BlackHole::start().await;
    let url = hole.amqp_url();
    let connect = Connection::connect(
        &url,
        ConnectionProperties::default().with_connection_name("sy-black-hole".into()),
    );
    tokio::pin!(connect);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), connect.as_mut())
            .await
            .is_err(),
        "a connect to the black hole neither succeeds nor fails"
    );
    assert_eq!(hole.accepted(), 1);
    drop(hole);
}

/// The raw client publishes what a client library may not survive (a header
/// table 3,000 levels deep, a content header a few bytes under frame_max)
/// with a confirm, and reads it back byte for byte without decoding it.
#[tokio::test]
async fn raw_client_publishes_and_drains_poison_intact() {
    use support::raw::{RawClient, RawConfirm, RawProperties, encode};
    let prefix = unique_prefix("raw");
    let broker = TestBroker::connect(&prefix).await;
    let queue = format!("{prefix}-q");
    broker.declare_queue(&queue).await;
    // An ordinary message from the library, read back by the raw client.
    broker
        .publish(
            "",
            &queue,
            b"plain",
            BasicProperties::default()
                .with_message_id("m-plain".into())
                .with_delivery_mode(2)
                .with_headers(field_table([("x-origin", amqp_str("smoke"))])),
        )
        .await;

    let mut raw = RawClient::connect(amqp_addr(), &amqp_vhost())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    raw.confirm_select().await.unwrap_or_else(|e| panic!("{e}"));
    let deep_value = encode::nested_table_value("d", 3000);
    let deep = RawProperties {
        message_id: Some("m-deep".into()),
        delivery_mode: Some(2),
        headers: vec![("deep".into(), deep_value.clone())],
        ..Default::default()
    };
    let mut big = RawProperties {
        message_id: Some("m-big".into()),
        delivery_mode: Some(2),
        headers: vec![("filler".into(), encode::long_string(b""))],
        ..Default::default()
    };
    let target = raw.frame_max() as usize - 16;
    let filler = target - RawClient::header_frame_size(&big);
    let filler_value = encode::long_string(&vec![b'f'; filler]);
    big.headers = vec![("filler".into(), filler_value.clone())];
    assert_eq!(RawClient::header_frame_size(&big), target);
    for (props, body) in [(&deep, &b"deep body"[..]), (&big, &b"big body"[..])] {
        let confirm = raw
            .publish("", &queue, props, body)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(confirm, RawConfirm::Ack);
    }
    let unroutable = raw
        .publish("", &format!("{prefix}-missing"), &deep, b"x")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(unroutable, RawConfirm::Returned(312, _)),
        "{unroutable:?}"
    );

    broker.await_count(&queue, 3, DEFAULT_TIMEOUT).await;
    let got = raw.drain(&queue).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].message_id.as_deref(), Some("m-plain"));
    assert_eq!(got[0].body, b"plain");
    assert_eq!(got[0].delivery_mode, Some(2));
    assert_eq!(
        got[0].header_value("x-origin"),
        Some(encode::long_string(b"smoke"))
    );
    assert_eq!(got[1].message_id.as_deref(), Some("m-deep"));
    assert_eq!(got[1].header_value("deep"), Some(deep_value));
    assert_eq!(got[1].body, b"deep body");
    assert_eq!(got[2].message_id.as_deref(), Some("m-big"));
    assert_eq!(got[2].header_value("filler"), Some(filler_value));
    assert_eq!(got[2].body, b"big body");
    assert_eq!(broker.queue_len(&queue).await, 0, "drained");
    raw.close().await;
    broker.cleanup(&[&queue], &[]).await;
    broker.close().await;
}

/// The configuration builder writes TOML the forwarder loads, and the
/// seed shape it builds is the one the tests describe.
#[test]
fn the_configuration_builder_writes_loadable_toml() {
    use support::config::{Branch, Endpoint, Filter, Forwarder};
    let p = "sy-smoke-config";
    let toml = Forwarder::new(p)
        .mode("republish")
        .endpoint(Endpoint::queue("a", &format!("{p}.a")).set("retries", 2))
        .endpoint(Endpoint::queue("b", &format!("{p}.b")).undeclared())
        .backup_list("backups", &["b"])
        .filter(
            "tenant",
            Filter::header("tenant").set("in", ["acme", "globex"]),
        )
        .filter("urgent", Filter::routing_key("urgent.#"))
        .filter("both", Filter::all_of(&["tenant", "urgent"]))
        .branch(
            Branch::new("service", "both", "a")
                .backups("backups")
                .set("priority", 2),
        )
        .sessions(&[("max_open", 4.into())])
        .toml();
    let settings =
        switchyard::config::load_str(&toml, "smoke.toml").unwrap_or_else(|e| panic!("{e}\n{toml}"));
    assert_eq!(settings.endpoints[&"a".to_owned()].retries, 2);
    assert!(settings.endpoints[&"b".to_owned()].declare_queue.is_none());
    assert_eq!(settings.sessions.map(|s| s.max_open), Some(4));
    let summary = settings.routing.summary();
    assert!(
        summary.contains("service") && summary.contains("a -> b"),
        "{summary}"
    );
    let seed = Forwarder::new(p).seed(p).toml();
    let seed = switchyard::config::load_str(&seed, "seed.toml").unwrap_or_else(|e| panic!("{e}"));
    let branches: Vec<&str> = seed.routing.branch_names().collect();
    assert_eq!(branches, ["service", "logging"]);
}
