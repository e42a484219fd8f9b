//! A broker alarm is not a failure: while the broker blocks publishers
//! (`connection.blocked`), branches wait (no failover, no dead letter, no
//! teardown), consuming pauses and memory stays bounded by `prefetch`; when
//! the alarm clears everything is delivered once. Runs the real binary
//! against a private RabbitMQ node, since a memory alarm blocks a whole node.

use crate::support;

use lapin::BasicProperties;
use std::time::Duration;
use support::harness::{Process, seed_toml, top_toml, wait_consumers};
use support::node::PrivateNode;
use support::{DEFAULT_TIMEOUT, TestBroker, amqp_url, tally, unique_prefix, wait_until};

const BACKLOG: u32 = 2000;
const PREFETCH: u32 = 200;
const BODY: usize = 50 * 1024;

#[tokio::test]
async fn a_memory_alarm_is_waited_out_without_failover_dead_letters_or_unbounded_memory() {
    let node = PrivateNode::start().await;
    let p = unique_prefix("alarm");
    let inbound = format!("{p}.in");
    // Confirm timeouts of 2 s: the alarm lasts three times longer.
    let toml = seed_toml(&p, &top_toml(&p, "republish", 10_000, PREFETCH))
        .replace(&amqp_url(), &node.amqp_url())
        .replace(
            "broker = \"main\"\nrouting_key = ",
            "broker = \"main\"\nconfirm_timeout_ms = 2000\nrouting_key = ",
        );
    assert_eq!(toml.matches("confirm_timeout_ms = 2000").count(), 4);
    let broker = TestBroker::connect_to(&node.amqp_url(), &format!("{p}-client")).await;

    // A first run declares the topology; then a backlog waits for the second.
    let mut first = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;
    first.signal("TERM");
    assert_eq!(first.wait_exit(DEFAULT_TIMEOUT).await, Some(0));
    let body = vec![b'x'; BODY];
    for i in 0..BACKLOG {
        let props = BasicProperties::default()
            .with_message_id(format!("m{i:05}").into())
            .with_delivery_mode(2);
        broker.publish("", &inbound, &body, props).await;
    }

    node.set_memory_alarm(true).await;
    wait_until("the alarm is raised", DEFAULT_TIMEOUT, || {
        node.memory_alarm()
    })
    .await;
    let forwarder = Process::spawn(&p, &toml);
    wait_until(
        "a prefetch of messages is held",
        DEFAULT_TIMEOUT,
        || async {
            node.ready_unacked(&inbound)
                .await
                .is_some_and(|(_, unacked)| unacked == u64::from(PREFETCH))
        },
    )
    .await;
    let publish_connections = || async {
        node.connections()
            .await
            .into_iter()
            .filter(|c| c.name.as_deref().is_some_and(|n| n.contains("/publish/")))
            .map(|c| c.pid)
            .collect::<Vec<_>>()
    };
    let connections = publish_connections().await;
    assert_eq!(connections.len(), 1);
    // Three confirm timeouts long: nothing fails over, nothing is dead-lettered,
    // nothing is acked, the connection stays, memory stays bounded.
    let mut peak_kib = 0;
    let watched = tokio::time::Instant::now();
    while watched.elapsed() < Duration::from_secs(6) {
        for queue in ["service.backup", "logging.backup", "dlq"] {
            assert_eq!(
                broker.queue_len(&format!("{p}.{queue}")).await,
                0,
                "{queue}"
            );
        }
        assert_eq!(
            node.ready_unacked(&inbound).await,
            Some((u64::from(BACKLOG - PREFETCH), u64::from(PREFETCH)))
        );
        peak_kib = peak_kib.max(forwarder.rss_kib());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(publish_connections().await, connections, "no teardown");
    assert!(forwarder.log().contains("broker blocked publishing"));
    println!("peak RSS while blocked: {} MiB", peak_kib / 1024);
    // Bodies held: at most prefetch × body, each copy shares it; the write
    // buffers of the blocked connection hold at most two copies each.
    let bound_kib = (3 * u64::from(PREFETCH) * BODY as u64) / 1024 + 96 * 1024;
    assert!(
        peak_kib < bound_kib,
        "RSS {peak_kib} KiB over {bound_kib} KiB"
    );

    node.set_memory_alarm(false).await;
    wait_until(
        "the backlog is forwarded",
        Duration::from_secs(120),
        || async { node.ready_unacked(&inbound).await == Some((0, 0)) },
    )
    .await;
    // Once the alarm clears, the broker works through everything it held;
    // a copy whose confirm then takes longer than the timeout fails over
    // like any slow confirm. Nothing may be missing or dead-lettered.
    let mut duplicates = 0;
    let mut after_alarm_failovers = 0;
    for branch in ["service", "logging"] {
        let mut messages = broker.get_all(&format!("{p}.{branch}")).await;
        let backup = broker.get_all(&format!("{p}.{branch}.backup")).await;
        after_alarm_failovers += backup.len();
        messages.extend(backup);
        let seen = tally(messages.iter().map(|m| {
            let id = m.properties.message_id().as_ref().map(|i| i.to_string());
            id.unwrap_or_default()
        }));
        assert_eq!(seen.len(), BACKLOG as usize, "{branch}: every message");
        duplicates += seen.values().map(|n| n - 1).sum::<usize>();
    }
    println!(
        "after the alarm: {duplicates} duplicates, {after_alarm_failovers} copies failed over"
    );
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0, "dlq");
    forwarder.signal("TERM");
    let mut forwarder = forwarder;
    assert_eq!(forwarder.wait_exit(DEFAULT_TIMEOUT).await, Some(0));
    broker.close().await;
    node.stop().await;
}
