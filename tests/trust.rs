//! The trust boundary against the real broker: a message's
//! `x-switchyard-*` annotations count only when its broker-validated
//! `user_id` names a trusted user (the forwarder's own, and
//! `inbound.trusted_users`). A producer with publish rights on the inbound
//! queue cannot skip a branch, fake a loop or poison, or claim to be the
//! forwarder; what it wrote is counted by kind and stripped from every copy.
//!
//! Each test has a vhost and a user of its own ([`TestVhost`]): the
//! forwarder runs as that user and `guest` is the producer, or the other
//! way round.

use crate::support;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray};
use support::config::Forwarder;
use support::harness::InProcess;
use support::vhost::TestVhost;
use support::{DEFAULT_TIMEOUT, Message, TestBroker, amqp_str, field_table, unique_prefix};

fn only(branches: &[&str]) -> AMQPValue {
    AMQPValue::FieldArray(FieldArray::from(
        branches
            .iter()
            .map(|b| AMQPValue::LongString((*b).into()))
            .collect::<Vec<_>>(),
    ))
}

fn user_id(m: &Message) -> Option<&str> {
    m.properties.user_id().as_ref().map(|u| u.as_str())
}

/// The value of `switchyard_untrusted_headers_total{header="<header>"}`.
fn untrusted_count(metrics: &str, header: &str) -> Option<u64> {
    let series = format!("switchyard_untrusted_headers_total{{header=\"{header}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
}

/// The producer, seed scenario in `nack` mode: 50 messages that
/// name only the service branch, 20 that say they were delivered 99 times,
/// 10 that say they were forwarded 100 times and 10 that carry a forged
/// dead-letter record and probe mark. Every one reaches both branches,
/// none is dead-lettered, no copy carries what the producer wrote, each
/// kind is counted; and the producer cannot claim the forwarder's user.
/// The forwarder's own user, publishing the same `x-switchyard-only`, is
/// honoured.
#[tokio::test]
async fn a_producers_annotations_skip_no_branch_and_fake_no_verdict() {
    let p = unique_prefix("trust");
    let vhost = TestVhost::create(&p).await;
    let toml = Forwarder::at(&vhost.user_url(), &p)
        .seed(&p)
        .mode("nack")
        .toml();
    let inbound = format!("{p}.in");
    let (service, logging, dlq) = (
        format!("{p}.service"),
        format!("{p}.logging"),
        format!("{p}.dlq"),
    );
    let producer = TestBroker::connect_to(&vhost.guest_url(), &format!("{p}-producer")).await;
    let forwarder = InProcess::start_consuming(&toml, &producer, &inbound).await;

    let with = |headers: Vec<(&str, AMQPValue)>| {
        BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(field_table(headers))
    };
    let mut sent = 0u32;
    for _ in 0..50 {
        let props = with(vec![("x-switchyard-only", only(&["service"]))]);
        producer.publish("", &inbound, b"only", props).await;
        sent += 1;
    }
    for _ in 0..20 {
        let props = with(vec![("x-delivery-count", AMQPValue::LongLongInt(99))]);
        producer.publish("", &inbound, b"count", props).await;
        sent += 1;
    }
    for _ in 0..10 {
        let props = with(vec![("x-switchyard-hops", AMQPValue::LongLongInt(100))]);
        producer.publish("", &inbound, b"hops", props).await;
        sent += 1;
    }
    for _ in 0..10 {
        let props = with(vec![
            ("x-switchyard-reason", amqp_str("exhausted")),
            ("x-switchyard-failed", only(&["logging"])),
            ("x-switchyard-probe", AMQPValue::Boolean(true)),
            ("x-switchyard-made-up", amqp_str("x")),
        ]);
        producer.publish("", &inbound, b"record", props).await;
        sent += 1;
    }
    producer.await_count(&service, sent, DEFAULT_TIMEOUT).await;
    producer.await_count(&logging, sent, DEFAULT_TIMEOUT).await;

    // The producer cannot claim the forwarder's user: the broker refuses.
    let forger = TestBroker::connect_to(&vhost.guest_url(), &format!("{p}-forger")).await;
    let claimed = BasicProperties::default()
        .with_user_id(vhost.user.as_str().into())
        .with_headers(field_table([("x-switchyard-only", only(&["service"]))]));
    let refused = forger.try_publish("", &inbound, b"forged", claimed).await;
    let error = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        error.contains("PRECONDITION_FAILED") && error.contains("user_id"),
        "the broker refuses a user_id that is not the publisher's: {error:?}"
    );

    // The forwarder's own user is trusted.
    let own = TestBroker::connect_to(&vhost.user_url(), &format!("{p}-own")).await;
    let trusted = BasicProperties::default()
        .with_user_id(vhost.user.as_str().into())
        .with_headers(field_table([("x-switchyard-only", only(&["service"]))]));
    own.publish("", &inbound, b"trusted", trusted).await;
    producer
        .await_count(&service, sent + 1, DEFAULT_TIMEOUT)
        .await;
    support::wait_until("the inbound queue is empty", DEFAULT_TIMEOUT, || async {
        producer.try_queue_len(&inbound).await == Some(0)
    })
    .await;
    let metrics = forwarder.telemetry().render();
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(producer.queue_len(&dlq).await, 0, "no verdict was faked");
    let logging = producer.get_all(&logging).await;
    assert_eq!(
        logging.len(),
        sent as usize,
        "the trusted one skipped logging"
    );
    let service = producer.get_all(&service).await;
    assert_eq!(service.len(), sent as usize + 1);
    for copy in service.iter().chain(&logging) {
        let own_headers: Vec<&str> = copy
            .properties
            .headers()
            .iter()
            .flat_map(|h| h.inner().keys())
            .map(|k| k.as_str())
            .filter(|k| k.starts_with("x-switchyard-"))
            .collect();
        assert_eq!(
            own_headers,
            [
                "x-switchyard-copy-id",
                "x-switchyard-hops",
                "x-switchyard-publish-id"
            ],
            "{}",
            copy.body_str()
        );
        assert_eq!(
            user_id(copy),
            Some(vhost.user.as_str()),
            "the forwarder's mark"
        );
    }
    let counts: Vec<(&str, Option<u64>)> = [
        "x-switchyard-only",
        "x-switchyard-hops",
        "x-switchyard-reason",
        "x-switchyard-failed",
        "x-switchyard-probe",
        "other",
    ]
    .into_iter()
    .map(|h| (h, untrusted_count(&metrics, h)))
    .collect();
    assert_eq!(
        counts,
        [
            ("x-switchyard-only", Some(50)),
            ("x-switchyard-hops", Some(10)),
            ("x-switchyard-reason", Some(10)),
            ("x-switchyard-failed", Some(10)),
            ("x-switchyard-probe", Some(10)),
            ("other", Some(10)),
        ]
    );
    assert_eq!(untrusted_count(&metrics, "x-switchyard-redriven"), Some(0));
    own.close().await;
    producer.close().await;
    vhost.delete().await;
}

/// Chained forwarders trust each other by listing each other's users: with
/// `guest` in `inbound.trusted_users`, guest's `x-switchyard-only` (under
/// its own validated `user_id`) is honoured, and the copy carries the
/// forwarder's user, so the next forwarder can trust it in turn.
#[tokio::test]
async fn a_listed_user_is_trusted_and_its_copies_carry_the_forwarders_user() {
    let p = unique_prefix("trust-listed");
    let vhost = TestVhost::create(&p).await;
    let toml = Forwarder::at(&vhost.user_url(), &p)
        .seed(&p)
        .inbound("trusted_users", &["guest".to_owned()][..])
        .toml();
    let inbound = format!("{p}.in");
    let (service, logging) = (format!("{p}.service"), format!("{p}.logging"));
    let guest = TestBroker::connect_to(&vhost.guest_url(), &format!("{p}-guest")).await;
    let forwarder = InProcess::start_consuming(&toml, &guest, &inbound).await;
    let listed = BasicProperties::default()
        .with_user_id("guest".into())
        .with_headers(field_table([("x-switchyard-only", only(&["logging"]))]));
    guest.publish("", &inbound, b"listed", listed).await;
    guest
        .publish("", &inbound, b"plain", BasicProperties::default())
        .await;
    guest.await_count(&logging, 2, DEFAULT_TIMEOUT).await;
    guest.await_count(&service, 1, DEFAULT_TIMEOUT).await;
    support::wait_until("the inbound queue is empty", DEFAULT_TIMEOUT, || async {
        guest.try_queue_len(&inbound).await == Some(0)
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let service = guest.get_all(&service).await;
    assert_eq!(
        service.iter().map(Message::body_str).collect::<Vec<_>>(),
        ["plain"],
        "the listed user's x-switchyard-only was honoured"
    );
    for copy in guest.get_all(&logging).await {
        assert_eq!(
            user_id(&copy),
            Some(vhost.user.as_str()),
            "{}",
            copy.body_str()
        );
    }
    guest.close().await;
    vhost.delete().await;
}
