//! The inbound side: when the consuming connection is closed by the broker,
//! the forwarder reconnects and goes on, losing nothing; and a slow message
//! never holds back the acks of the messages behind it.

use crate::support;

use lapin::BasicProperties;
use std::collections::BTreeSet;
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::{InProcess, wait_consumers};
use support::{
    BULK_TIMEOUT, DEFAULT_TIMEOUT, FaultProxy, Message, TestBroker, amqp_addr, amqp_str,
    close_connections_named, delete_all_with_prefix, field_table, ready_unacked, unique_prefix,
    wait_until,
};

const N: u32 = 6_000;

#[tokio::test]
async fn the_consumer_reconnects_after_its_connection_is_closed_and_loses_nothing() {
    let p = unique_prefix("consumer-closed");
    let broker = TestBroker::connect(&p).await;
    let toml = Forwarder::new(&p).seed(&p).toml();
    // A first run declares the queues; the messages then wait as a backlog,
    // so the second run has a full prefetch window in flight at the close.
    InProcess::start_consuming(&toml, &broker, &format!("{p}.in"))
        .await
        .stop()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let sent: Vec<String> = (0..N).map(|i| format!("c{i:05}")).collect();
    broker
        .publish_many(
            "",
            &format!("{p}.in"),
            sent.iter(),
            BasicProperties::default(),
        )
        .await;
    let forwarder = InProcess::start_consuming(&toml, &broker, &format!("{p}.in")).await;
    wait_until("some forwarded", DEFAULT_TIMEOUT, || async {
        broker.queue_len(&format!("{p}.service")).await >= 100
    })
    .await;
    let name = format!("{p}/consume/main");
    assert_eq!(
        close_connections_named(&name).await,
        1,
        "the forwarder's consuming connection"
    );
    wait_consumers(&broker, &format!("{p}.in"), 1).await;
    wait_until(
        "inbound drained after the reconnect",
        BULK_TIMEOUT,
        // Every message acked, so forwarded on both branches. Queue lengths
        // alone would not do: with redelivered duplicates they reach N early.
        || async { ready_unacked(&format!("{p}.in")).await == Some((0, 0)) },
    )
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let expected: BTreeSet<String> = sent.iter().cloned().collect();
    for queue in ["service", "logging"] {
        let got: Vec<String> = broker
            .get_all(&format!("{p}.{queue}"))
            .await
            .iter()
            .map(Message::body_str)
            .collect();
        let distinct: BTreeSet<String> = got.iter().cloned().collect();
        assert_eq!(distinct, expected, "{queue}: every message at least once");
        println!(
            "{queue}: {} copies, {} redelivered duplicates",
            got.len(),
            got.len() - distinct.len()
        );
    }
    assert_eq!(broker.queue_len(&format!("{p}.in")).await, 0);
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn a_slow_message_does_not_hold_back_the_acks_of_the_messages_behind_it() {
    let p = unique_prefix("ack-behind");
    let broker = TestBroker::connect(&p).await;
    let proxy = FaultProxy::start(amqp_addr()).await;
    let toml = Forwarder::new(&p)
        .broker("slow", &proxy.amqp_url())
        .endpoint(
            Endpoint::queue("slow", &format!("{p}.slow"))
                .on("slow")
                .set("confirm_timeout_ms", 20000),
        )
        .endpoint(Endpoint::queue("fast", &format!("{p}.fast")))
        .filter("slow", Filter::header("lane").set("equals", "slow"))
        .filter("fast", Filter::not("slow"))
        .branch(Branch::new("slow", "slow", "slow"))
        .branch(Branch::new("fast", "fast", "fast"))
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &format!("{p}.in")).await;
    let slow_lane =
        || BasicProperties::default().with_headers(field_table([("lane", amqp_str("slow"))]));
    broker
        .publish("", &format!("{p}.in"), b"warm-up", slow_lane())
        .await;
    broker
        .await_count(&format!("{p}.slow"), 1, DEFAULT_TIMEOUT)
        .await;

    // The slow message is delivered first and its confirm is held; the 50
    // behind it complete and must be acked without waiting for it.
    proxy.stall();
    broker
        .publish("", &format!("{p}.in"), b"stuck", slow_lane())
        .await;
    let fast: Vec<String> = (0..50).map(|i| format!("f{i:02}")).collect();
    broker
        .publish_many(
            "",
            &format!("{p}.in"),
            fast.iter(),
            BasicProperties::default(),
        )
        .await;
    broker
        .await_count(&format!("{p}.fast"), 50, DEFAULT_TIMEOUT)
        .await;
    wait_until(
        "only the stuck message unacked",
        DEFAULT_TIMEOUT,
        || async { ready_unacked(&format!("{p}.in")).await == Some((0, 1)) },
    )
    .await;

    proxy.resume();
    wait_until("the stuck message acked too", DEFAULT_TIMEOUT, || async {
        ready_unacked(&format!("{p}.in")).await == Some((0, 0))
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(broker.queue_len(&format!("{p}.slow")).await, 2);
    drop(proxy);
    delete_all_with_prefix(&p).await;
}
