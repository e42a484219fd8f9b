//! One message never harms another, and endpoint health: a message the
//! destination broker refuses for itself is dead-lettered alone (reason
//! `rejected`) while the messages in flight with it are retried, not failed
//! over; a down endpoint is skipped at once and used again when it recovers;
//! transactions of a lost inbound channel start no new publishes.

use crate::support;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use std::collections::BTreeMap;
use support::harness::{InProcess, endpoint_toml, one_branch_toml as one_branch};
use support::{
    DEFAULT_TIMEOUT, FaultProxy, Message, TestBroker, amqp_addr, amqp_str, amqp_url,
    close_connections_named, connections_named, delete_all_with_prefix, rabbitmqctl, ready_unacked,
    tally, unique_prefix, wait_until,
};

fn on_main(p: &str, mode: &str) -> String {
    one_branch(
        p,
        mode,
        "",
        &endpoint_toml("primary", "main", &format!("{p}.primary"), true, ""),
        &endpoint_toml("backup", "main", &format!("{p}.backup"), true, ""),
    )
}

fn numbered(i: u32) -> (String, BasicProperties) {
    let id = format!("m{i:05}");
    let props = BasicProperties::default()
        .with_message_id(id.as_str().into())
        .with_delivery_mode(2);
    (id, props)
}

/// Publishes `m<from>..m<to>` with their message ids, pipelined.
async fn publish_range(broker: &TestBroker, queue: &str, range: std::ops::Range<u32>) {
    for i in range {
        let (id, props) = numbered(i);
        broker.publish("", queue, id.as_bytes(), props).await;
    }
}

async fn at_least(broker: &TestBroker, queue: &str, n: u32) {
    wait_until(&format!("{queue} holds {n}"), DEFAULT_TIMEOUT, || async {
        broker.queue_len(queue).await >= n
    })
    .await;
}

/// Message ids in a queue with how often each appears.
fn counts(messages: &[Message]) -> BTreeMap<String, usize> {
    tally(messages.iter().map(|m| {
        m.properties
            .message_id()
            .as_ref()
            .map_or_else(|| m.body_str(), |id| id.to_string())
    }))
}

/// A producer that is not the forwarder's user: its messages carry a
/// `user_id` the forwarder's connection may not publish (406).
struct ForeignUser {
    name: String,
}

impl ForeignUser {
    async fn create(p: &str) -> (Self, TestBroker) {
        let name = format!("{p}-producer");
        rabbitmqctl(&["add_user", &name, "secret"]).await;
        rabbitmqctl(&["set_permissions", "-p", "/", &name, ".*", ".*", ".*"]).await;
        let url = amqp_url().replacen("guest:guest", &format!("{name}:secret"), 1);
        let producer = TestBroker::connect_to(&url, &format!("{p}-producer")).await;
        (Self { name }, producer)
    }

    async fn delete(self) {
        rabbitmqctl(&["delete_user", &self.name]).await;
    }
}

#[tokio::test]
async fn a_foreign_user_id_is_rejected_alone_and_the_others_are_not_failed_over() {
    let p = unique_prefix("fault-user-id");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let forwarder = InProcess::start_consuming(&on_main(&p, "republish"), &broker, &inbound).await;
    let (user, producer) = ForeignUser::create(&p).await;
    let mut culprit_props = numbered(99_999).1;
    culprit_props = culprit_props.with_user_id(user.name.as_str().into());
    for i in 0..1000 {
        if i == 500 {
            producer
                .publish("", &inbound, b"culprit", culprit_props.clone())
                .await;
        }
        let (id, props) = numbered(i);
        producer.publish("", &inbound, id.as_bytes(), props).await;
    }
    at_least(&broker, &format!("{p}.primary"), 1000).await;
    at_least(&broker, &format!("{p}.dlq"), 1).await;
    wait_until("inbound settled", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 0))
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let primary = counts(&broker.get_all(&format!("{p}.primary")).await);
    assert_eq!(
        primary.len(),
        1000,
        "every innocent message reached the primary"
    );
    let duplicates: usize = primary.values().map(|n| n - 1).sum();
    println!("duplicates on the primary (retried after the channel closed): {duplicates}");
    assert!(!primary.contains_key("m99999"));
    assert_eq!(
        broker.queue_len(&format!("{p}.backup")).await,
        0,
        "nothing failed over"
    );
    let dead = broker.get_all(&format!("{p}.dlq")).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body, b"culprit");
    assert_eq!(
        dead[0].header_str("x-switchyard-reason").as_deref(),
        Some("rejected")
    );
    let error = dead[0].header_str("x-switchyard-error").unwrap_or_default();
    assert!(
        error.contains("406") && error.contains("user_id"),
        "{error}"
    );
    assert_eq!(
        dead[0].header("x-switchyard-failed-endpoints"),
        Some(&AMQPValue::FieldArray(vec![amqp_str("primary")].into())),
        "the endpoint whose broker refused it"
    );
    producer.close().await;
    user.delete().await;
    delete_all_with_prefix(&p).await;
}

/// Properties whose content header frame is `slack` bytes under frame_max.
fn near_frame_max(id: &str, slack: usize) -> BasicProperties {
    const FRAME_MAX: usize = 131_072;
    let with_pad = |n: usize| {
        let mut headers = FieldTable::default();
        headers.insert("pad".into(), amqp_str(&"p".repeat(n)));
        headers.insert("kind".into(), amqp_str("order"));
        BasicProperties::default()
            .with_message_id(id.into())
            .with_headers(headers)
    };
    let base = switchyard::broker::frame_size::content_header_frame(&with_pad(0));
    with_pad(FRAME_MAX - slack - base)
}

async fn a_header_near_frame_max_is_rejected_before_it_is_sent(mode: &str) {
    let p = unique_prefix(&format!("fault-frame-{mode}"));
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let forwarder = InProcess::start_consuming(&on_main(&p, mode), &broker, &inbound).await;
    // Accepted from the producer; the forwarder's own header pushes its copy over.
    let big = near_frame_max("big", 10);
    assert_eq!(
        switchyard::broker::frame_size::content_header_frame(&big),
        131_062
    );
    publish_range(&broker, &inbound, 0..300).await;
    broker.publish("", &inbound, b"big", big).await;
    publish_range(&broker, &inbound, 300..600).await;
    broker
        .await_count(&format!("{p}.primary"), 600, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.dlq"), 1, DEFAULT_TIMEOUT)
        .await;
    wait_until("inbound settled", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 0))
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let primary = counts(&broker.get_all(&format!("{p}.primary")).await);
    assert_eq!(primary.len(), 600);
    assert!(
        primary.values().all(|n| *n == 1),
        "no channel or connection was lost, so nothing was sent twice"
    );
    assert_eq!(broker.queue_len(&format!("{p}.backup")).await, 0);
    if mode == "republish" {
        // The annotated copy would not fit either: it is sent without the
        // producer's headers, and says so.
        let dead = broker.get_all(&format!("{p}.dlq")).await;
        assert_eq!(dead[0].body, b"big");
        assert_eq!(
            dead[0].header_str("x-switchyard-reason").as_deref(),
            Some("rejected")
        );
        assert!(dead[0].header("pad").is_none());
        assert_eq!(
            dead[0].header("x-switchyard-removed-headers"),
            Some(&AMQPValue::LongLongInt(2))
        );
        let error = dead[0].header_str("x-switchyard-error").unwrap_or_default();
        assert!(error.contains("frame_max"), "{error}");
    }
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn a_header_near_frame_max_is_rejected_in_republish_mode() {
    a_header_near_frame_max_is_rejected_before_it_is_sent("republish").await;
}

#[tokio::test]
async fn a_header_near_frame_max_is_rejected_in_nack_mode() {
    a_header_near_frame_max_is_rejected_before_it_is_sent("nack").await;
}

/// The primary behind a fault proxy (confirm timeout `timeout_ms`), the
/// backup on the main broker.
/// Broker pids of the connections whose client-provided name contains `name`.
async fn connection_pids(name: &str) -> Vec<String> {
    connections_named(name)
        .await
        .into_iter()
        .map(|c| c.pid)
        .collect()
}

fn behind_proxy(p: &str, proxy: &FaultProxy, timeout_ms: u64) -> String {
    one_branch(
        p,
        "nack",
        &format!("\n[brokers.edge]\nuri = \"{}\"\n", proxy.amqp_url()),
        &endpoint_toml(
            "primary",
            "edge",
            &format!("{p}.primary"),
            true,
            &format!("confirm_timeout_ms = {timeout_ms}"),
        ),
        &endpoint_toml("backup", "main", &format!("{p}.backup"), true, ""),
    )
}

#[tokio::test]
async fn a_down_endpoint_is_skipped_at_once_and_traffic_returns_when_it_recovers() {
    let p = unique_prefix("fault-health");
    let broker = TestBroker::connect(&p).await;
    let proxy = FaultProxy::start(amqp_addr()).await;
    let inbound = format!("{p}.in");
    let forwarder =
        InProcess::start_consuming(&behind_proxy(&p, &proxy, 500), &broker, &inbound).await;
    publish_range(&broker, &inbound, 0..10).await;
    broker
        .await_count(&format!("{p}.primary"), 10, DEFAULT_TIMEOUT)
        .await;

    proxy.stall();
    publish_range(&broker, &inbound, 10..11).await;
    // At least: a confirm of the first ten may still have been on its way.
    at_least(&broker, &format!("{p}.backup"), 1).await;
    // The primary is down now: these go straight to the backup, never to
    // the stalled primary (which would deliver them once it resumes).
    publish_range(&broker, &inbound, 11..51).await;
    at_least(&broker, &format!("{p}.backup"), 41).await;

    proxy.resume();
    // Once a probe finds it working, new messages go to the primary again.
    let mut next = 51;
    wait_until("traffic returns to the primary", DEFAULT_TIMEOUT, || {
        next += 1;
        let (broker, inbound, backup) = (&broker, &inbound, format!("{p}.backup"));
        async move {
            let before = broker.queue_len(&backup).await;
            publish_range(broker, inbound, next..next + 1).await;
            wait_until("settled", DEFAULT_TIMEOUT, || async {
                ready_unacked(inbound).await == Some((0, 0))
            })
            .await;
            broker.queue_len(&backup).await == before
        }
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let primary = counts(&broker.get_all(&format!("{p}.primary")).await);
    for i in 11..51 {
        assert!(
            !primary.contains_key(&format!("m{i:05}")),
            "m{i:05} was sent to the primary while it was down"
        );
    }
    assert!(primary.contains_key(&format!("m{next:05}")));
    let backup = counts(&broker.get_all(&format!("{p}.backup")).await);
    for i in 10..51 {
        assert!(backup.contains_key(&format!("m{i:05}")), "m{i:05} lost");
    }
    drop(proxy);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn transactions_of_a_lost_inbound_channel_start_no_new_publishes() {
    let p = unique_prefix("fault-orphan");
    let broker = TestBroker::connect(&p).await;
    let proxy = FaultProxy::start(amqp_addr()).await;
    let inbound = format!("{p}.in");
    // No confirm timeout fires during the test: every step below waits on a
    // state, however slow the machine, and the old transactions are still
    // waiting for the stalled primary when their channel goes.
    let forwarder =
        InProcess::start_consuming(&behind_proxy(&p, &proxy, 600_000), &broker, &inbound).await;
    proxy.stall();
    publish_range(&broker, &inbound, 0..10).await;
    wait_until("all ten held", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 10))
    })
    .await;
    let consume = format!("{p}/consume");
    let old = connection_pids(&consume).await;
    assert_eq!(old.len(), 1, "one consuming connection: {old:?}");
    assert_eq!(close_connections_named(&consume).await, 1);
    // A new consuming connection means the loss was noticed, and the old
    // channel's receipts marked lost, before the redeliveries came.
    wait_until("the consumer reopened", DEFAULT_TIMEOUT, || async {
        let now = connection_pids(&consume).await;
        !now.is_empty() && now.iter().all(|pid| !old.contains(pid))
    })
    .await;
    // Now every publish to the primary fails at once, old and new: the
    // redelivered messages fail over to the backup, and the old transactions,
    // whose messages the broker has already handed out again, must not.
    proxy.refuse(true);
    proxy.cut();
    broker
        .await_count(&format!("{p}.backup"), 10, DEFAULT_TIMEOUT)
        .await;
    wait_until("inbound settled", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 0))
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let backup = counts(&broker.get_all(&format!("{p}.backup")).await);
    assert_eq!(backup.len(), 10);
    assert!(
        backup.values().all(|n| *n == 1),
        "each message failed over once, by its redelivery only: {backup:?}"
    );
    assert_eq!(broker.queue_len(&format!("{p}.primary")).await, 0);
    proxy.resume();
    drop(proxy);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn with_outage_wait_a_branch_whose_brokers_are_all_unreachable_holds_its_messages() {
    let p = unique_prefix("fault-outage");
    let broker = TestBroker::connect(&p).await;
    let proxy = FaultProxy::start(amqp_addr()).await;
    let inbound = format!("{p}.in");
    let toml = one_branch(
        &p,
        "nack",
        &format!("\n[brokers.edge]\nuri = \"{}\"\n", proxy.amqp_url()),
        &endpoint_toml("primary", "edge", &format!("{p}.primary"), true, ""),
        &endpoint_toml("backup", "edge", &format!("{p}.backup"), true, ""),
    )
    .replace(
        "backup_list = \"backups\"\n",
        "backup_list = \"backups\"\noutage = \"wait\"\n",
    );
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    publish_range(&broker, &inbound, 0..10).await;
    at_least(&broker, &format!("{p}.primary"), 10).await;

    // The only broker of the branch goes away and refuses to come back.
    proxy.refuse(true);
    proxy.cut();
    publish_range(&broker, &inbound, 10..30).await;
    // At least: a copy of the first ten whose confirm was still on its way
    // when the connection was cut is held with them.
    wait_until("the twenty are held", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound)
            .await
            .is_some_and(|(ready, unacked)| ready + unacked >= 20 && unacked >= 1)
    })
    .await;
    // Held, not dead-lettered, for as long as the outage lasts.
    let watched = tokio::time::Instant::now();
    while watched.elapsed() < std::time::Duration::from_secs(3) {
        assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
        tokio::time::sleep(support::POLL_INTERVAL).await;
    }

    proxy.refuse(false);
    wait_until(
        "the held messages are delivered",
        DEFAULT_TIMEOUT,
        || async { ready_unacked(&inbound).await == Some((0, 0)) },
    )
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let primary = counts(&broker.get_all(&format!("{p}.primary")).await);
    let backup = counts(&broker.get_all(&format!("{p}.backup")).await);
    for i in 0..30 {
        let id = format!("m{i:05}");
        assert!(
            primary.contains_key(&id) || backup.contains_key(&id),
            "{id} lost"
        );
    }
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    drop(proxy);
    delete_all_with_prefix(&p).await;
}
