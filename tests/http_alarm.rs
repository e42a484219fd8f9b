//! A broker that blocks publishers (a memory alarm on a private node) is
//! a 503 with `Retry-After`, never a dead letter, and every request retried
//! with its key after the alarm reaches every branch.

use crate::support;

use std::time::Duration;
use support::config::{Forwarder, Value};
use support::ingress::start_ingress;
use support::{DEFAULT_TIMEOUT, PrivateNode, TestBroker, unique_prefix, wait_for, wait_until};
use switchyard::Options;

#[tokio::test]
async fn a_memory_alarm_is_503_and_every_request_retried_after_it_is_delivered() {
    let node = PrivateNode::start().await;
    let p = unique_prefix("http-alarm");
    let broker = TestBroker::connect_to(&node.amqp_url(), &format!("{p}-client")).await;
    let config = Forwarder::at(&node.amqp_url(), &p)
        .seed(&p)
        .http(&[("request_timeout_ms", Value::from(2000u32))]);
    let inbound = format!("{p}.in");
    let (running, client) =
        start_ingress(&config, Options::default(), Some((&broker, &inbound))).await;
    let first = client
        .post("/messages/k", &[("idempotency-key", "k-0")], b"k-0")
        .await;
    assert_eq!(first.status, 202, "{}", first.text);

    node.set_memory_alarm(true).await;
    wait_until("the alarm is raised", DEFAULT_TIMEOUT, || {
        node.memory_alarm()
    })
    .await;
    // The first publish after the alarm is blocked and times out (504);
    // once the forwarder knows the broker blocks, requests are 503 at once.
    let mut keys = vec!["k-0".to_owned()];
    let unavailable = wait_for("a 503 under the alarm", DEFAULT_TIMEOUT, || {
        let key = format!("k-{}", keys.len());
        keys.push(key.clone());
        let client = client.clone();
        async move {
            let reply = client
                .post("/messages/k", &[("idempotency-key", &key)], key.as_bytes())
                .await;
            assert!(
                matches!(reply.status, 503 | 504),
                "{} {}",
                reply.status,
                reply.text
            );
            (reply.status == 503).then_some(reply)
        }
    })
    .await;
    assert_eq!(
        unavailable.headers.get("retry-after").map(String::as_str),
        Some("5")
    );
    assert!(
        unavailable.json["reason"]
            .as_str()
            .is_some_and(|r| r.contains("blocks publishers")),
        "{}",
        unavailable.text
    );
    let started = tokio::time::Instant::now();
    let again = client
        .post("/messages/k", &[("idempotency-key", "k-last")], b"k-last")
        .await;
    assert_eq!(again.status, 503, "{}", again.text);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "503 is answered at once"
    );
    keys.push("k-last".to_owned());

    node.set_memory_alarm(false).await;
    for key in &keys {
        let reply = wait_for(&format!("{key} delivered"), DEFAULT_TIMEOUT, || {
            let client = client.clone();
            async move {
                let reply = client
                    .post("/messages/k", &[("idempotency-key", key)], key.as_bytes())
                    .await;
                matches!(reply.status, 200 | 202).then_some(reply)
            }
        })
        .await;
        assert_eq!(reply.names("delivered"), ["logging", "service"], "{key}");
    }
    for queue in ["service", "logging"] {
        let bodies: Vec<String> = broker
            .get_all(&format!("{p}.{queue}"))
            .await
            .iter()
            .map(|m| m.body_str())
            .collect();
        let duplicates = bodies.len() - keys.len();
        for key in &keys {
            assert!(bodies.contains(key), "{queue} lacks {key}");
        }
        eprintln!("{queue}: {} requests, {duplicates} duplicates", keys.len());
        assert!(duplicates <= 2, "{queue}: {duplicates} duplicates");
    }
    assert_eq!(
        broker.queue_len(&format!("{p}.dlq")).await,
        0,
        "never dead-lettered"
    );
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
}
