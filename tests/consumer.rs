//! The inbound side under faults: when the consuming connection is closed
//! by the broker, the forwarder reconnects and goes on; messages whose acks
//! were lost are redelivered (at-least-once), none is lost.

mod support;

use lapin::BasicProperties;
use std::collections::BTreeSet;
use support::harness::{InProcess, base_toml, seed_toml, wait_consumers};
use support::{
    DEFAULT_TIMEOUT, Message, TestBroker, close_connections_named, delete_all_with_prefix,
    unique_prefix, wait_until,
};

const N: u32 = 6_000;

#[tokio::test]
async fn the_consumer_reconnects_after_its_connection_is_closed_and_loses_nothing() {
    let p = unique_prefix("consumer-closed");
    let broker = TestBroker::connect(&p).await;
    let toml = seed_toml(&p, &base_toml(&p, "nack"));
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
        DEFAULT_TIMEOUT,
        || async {
            broker.queue_len(&format!("{p}.in")).await == 0
                && broker.queue_len(&format!("{p}.logging")).await >= N
                && broker.queue_len(&format!("{p}.service")).await >= N
        },
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
