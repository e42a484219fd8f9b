//! Any bytes a producer may send: AMQP short strings (properties, header
//! names) are bytes, and RabbitMQ passes them through whether or not they
//! are UTF-8. A message whose `message_id`, `correlation_id`, `type`,
//! `app_id` or header name is not UTF-8, published by a plain-socket client
//! as a Latin-1 producer would, ahead of 1,000 normal messages in the same
//! prefetch window: every message is forwarded once with its bytes kept,
//! nothing is dead-lettered or redelivered, and `/readyz` stays ready, on
//! classic and quorum inbound queues, in both dead-letter modes. Such a
//! message dead-lettered is listed by `dlq inspect` (its id written
//! `\xNN`) and redriven with its bytes kept.

use crate::support;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use support::config::{Endpoint, Forwarder};
use support::harness::{InProcess, clean_command};
use support::raw::{RawClient, RawConfirm, RawMessage, RawProperties, Short, encode};
use support::{
    DEFAULT_TIMEOUT, Metrics, TestBroker, admin_listener, amqp_addr, amqp_vhost,
    delete_all_with_prefix, http_get, ready_unacked, unique_prefix, wait_until,
};
use switchyard::Options;

/// Normal messages behind the bad ones.
const NORMAL: usize = 1_000;

/// One message that is not UTF-8 where the specification says it must be.
struct Bad {
    /// Its body, by which it is found again.
    body: &'static str,
    props: RawProperties,
}

impl Bad {
    /// The bytes a copy must carry where the original carried them.
    fn kept(&self, copy: &RawMessage) -> bool {
        let shorts_kept = self
            .props
            .short
            .iter()
            .all(|(which, bytes)| copy.short(*which) == Some(bytes.as_slice()));
        let keys = copy.header_keys();
        let keys_kept = self.props.raw_headers.iter().all(|(k, _)| keys.contains(k));
        shorts_kept && keys_kept
    }
}

/// The five fields, each carrying a Latin-1 `é` (0xe9) and a stray 0xff.
fn bad_messages(p: &str) -> Vec<Bad> {
    let latin1 = |what: &str| {
        let mut bytes = format!("{p}-{what}-caf").into_bytes();
        bytes.extend([0xe9, b'-', 0xff]);
        bytes
    };
    let with = |which: Short, what: &str| RawProperties {
        delivery_mode: Some(2),
        short: vec![(which, latin1(what))],
        ..Default::default()
    };
    let mut header_key = RawProperties {
        message_id: Some(format!("{p}-bad-header-key")),
        delivery_mode: Some(2),
        ..Default::default()
    };
    header_key
        .raw_headers
        .push((latin1("key"), encode::long_string(b"value")));
    vec![
        Bad {
            body: "bad message_id",
            props: with(Short::MessageId, "id"),
        },
        Bad {
            body: "bad correlation_id",
            props: with(Short::CorrelationId, "corr"),
        },
        Bad {
            body: "bad type",
            props: with(Short::Type, "type"),
        },
        Bad {
            body: "bad app_id",
            props: with(Short::AppId, "app"),
        },
        Bad {
            body: "bad header key",
            props: header_key,
        },
    ]
}

async fn raw_client() -> RawClient {
    let mut raw = RawClient::connect(amqp_addr(), &amqp_vhost())
        .await
        .unwrap_or_else(|e| panic!("raw connect: {e}"));
    raw.confirm_select()
        .await
        .unwrap_or_else(|e| panic!("confirm.select: {e}"));
    raw
}

/// Publishes each message to `queue` through the default exchange and
/// checks the broker took it.
async fn publish_raw(raw: &mut RawClient, queue: &str, messages: &[(RawProperties, Vec<u8>)]) {
    for (props, body) in messages {
        let answer = raw
            .publish("", queue, props, body)
            .await
            .unwrap_or_else(|e| panic!("raw publish: {e}"));
        assert_eq!(answer, RawConfirm::Ack, "the broker refused a publish");
    }
}

async fn drain(raw: &mut RawClient, queue: &str) -> Vec<RawMessage> {
    raw.drain(queue)
        .await
        .unwrap_or_else(|e| panic!("drain {queue}: {e}"))
}

async fn metrics(addr: SocketAddr) -> Metrics {
    let r = http_get(addr, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    Metrics::parse(&r.body)
}

async fn readyz(addr: SocketAddr) -> u16 {
    http_get(addr, "/readyz").await.map_or(0, |r| r.status)
}

/// Samples `/readyz` every 20 ms until stopped; counts the answers other
/// than 200.
fn watch_readiness(addr: SocketAddr) -> (Arc<AtomicBool>, Arc<AtomicUsize>) {
    let stop = Arc::new(AtomicBool::new(false));
    let not_ready = Arc::new(AtomicUsize::new(0));
    let (s, n) = (stop.clone(), not_ready.clone());
    tokio::spawn(async move {
        while !s.load(Ordering::Relaxed) {
            if readyz(addr).await != 200 {
                n.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (stop, not_ready)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Queue {
    Classic,
    Quorum,
}

async fn bad_bytes_ahead_of_normal_messages(test: &str, queue: Queue, mode: &str) {
    let p = unique_prefix(test);
    let broker = TestBroker::connect(&p).await;
    let mut forwarder = Forwarder::new(&p).mode(mode).seed(&p);
    if queue == Queue::Quorum {
        forwarder = forwarder.quorum();
    }
    let toml = forwarder.toml();
    let inbound = format!("{p}.in");

    // A first run declares the topology, so the queue can be filled with
    // nobody consuming: the bad messages lead the first prefetch window.
    let first = InProcess::start_consuming(&toml, &broker, &inbound).await;
    first
        .stop()
        .await
        .unwrap_or_else(|e| panic!("first run: {e}"));
    let bad = bad_messages(&p);
    let mut messages: Vec<(RawProperties, Vec<u8>)> = bad
        .iter()
        .map(|b| (b.props.clone(), b.body.as_bytes().to_vec()))
        .collect();
    for i in 0..NORMAL {
        let id = format!("{p}-n-{i:04}");
        let props = RawProperties {
            message_id: Some(id.clone()),
            delivery_mode: Some(2),
            ..Default::default()
        };
        messages.push((props, id.into_bytes()));
    }
    let mut raw = raw_client().await;
    publish_raw(&mut raw, &inbound, &messages).await;
    let total = messages.len() as u32;

    let (listener, addr) = admin_listener();
    let options = Options {
        admin: Some(listener),
        ..Default::default()
    };
    let running = InProcess::start_with(&toml, options);
    wait_until("/readyz answers 200", DEFAULT_TIMEOUT, || async {
        readyz(addr).await == 200
    })
    .await;
    let (stop_watch, not_ready) = watch_readiness(addr);
    wait_until(
        &format!("{total} copies on each branch's primary, {inbound} settled"),
        Duration::from_secs(90),
        || async {
            broker.queue_len(&format!("{p}.service")).await == total
                && broker.queue_len(&format!("{p}.logging")).await == total
                && ready_unacked(&inbound).await == Some((0, 0))
        },
    )
    .await;
    stop_watch.store(true, Ordering::Relaxed);
    let m = metrics(addr).await;
    assert_eq!(
        not_ready.load(Ordering::Relaxed),
        0,
        "/readyz was not ready while the bad messages passed"
    );
    assert_eq!(
        m.get("switchyard_messages_consumed_total", &[]),
        Some(f64::from(total)),
        "each message consumed once: none redelivered by a lost connection"
    );
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));

    for branch in ["service", "logging"] {
        let copies = drain(&mut raw, &format!("{p}.{branch}")).await;
        let mut bodies: Vec<&[u8]> = copies.iter().map(|m| m.body.as_slice()).collect();
        bodies.sort_unstable();
        let mut expected: Vec<&[u8]> = messages.iter().map(|(_, b)| b.as_slice()).collect();
        expected.sort_unstable();
        assert!(
            bodies == expected,
            "{branch}: not every message exactly once"
        );
        for b in &bad {
            let copy = copies
                .iter()
                .find(|m| m.body == b.body.as_bytes())
                .unwrap_or_else(|| panic!("{branch}: no copy of {}", b.body));
            assert!(
                b.kept(copy),
                "{branch}: {} lost its bytes: {:?}",
                b.body,
                copy.short
            );
        }
        assert_eq!(
            broker.queue_len(&format!("{p}.{branch}.backup")).await,
            0,
            "{branch}: no failover"
        );
    }
    assert_eq!(
        broker.queue_len(&format!("{p}.dlq")).await,
        0,
        "no dead letter"
    );
    println!(
        "{test}: {} bad and {NORMAL} normal messages forwarded once each",
        bad.len()
    );
    raw.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_utf8_pass_a_classic_queue_in_nack_mode() {
    bad_bytes_ahead_of_normal_messages("bytes-cl-nack", Queue::Classic, "nack").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_utf8_pass_a_classic_queue_in_republish_mode() {
    bad_bytes_ahead_of_normal_messages("bytes-cl-repub", Queue::Classic, "republish").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_utf8_pass_a_quorum_queue_in_nack_mode() {
    bad_bytes_ahead_of_normal_messages("bytes-qq-nack", Queue::Quorum, "nack").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_utf8_pass_a_quorum_queue_in_republish_mode() {
    bad_bytes_ahead_of_normal_messages("bytes-qq-repub", Queue::Quorum, "republish").await;
}

/// Runs `switchyard dlq <args>` on `config`; returns exit code and stdout.
async fn dlq(config: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = tokio::process::Command::from(clean_command());
    cmd.stdin(Stdio::null())
        .arg("dlq")
        .args(args)
        .arg("--config")
        .arg(config);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("dlq {args:?} did not finish"))
        .unwrap_or_else(|e| panic!("cannot run switchyard: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn dead_letters_that_are_not_utf8_are_inspected_and_redriven(test: &str, mode: &str) {
    let p = unique_prefix(test);
    let broker = TestBroker::connect(&p).await;
    // "service" publishes to a queue that does not exist yet: every copy is
    // returned and the message dead-lettered, until the queue is declared.
    let toml = Forwarder::new(&p)
        .mode(mode)
        .seed_with(&p, |e: Endpoint| e.undeclared())
        .toml();
    broker.declare_queue(&format!("{p}.logging")).await;
    let inbound = format!("{p}.in");
    let config = std::env::temp_dir().join(format!("{p}.toml"));
    std::fs::write(&config, &toml).unwrap_or_else(|e| panic!("write config: {e}"));
    let running = InProcess::start_consuming(&toml, &broker, &inbound).await;
    let bad = bad_messages(&p);
    let messages: Vec<(RawProperties, Vec<u8>)> = bad[..2]
        .iter()
        .chain(&bad[4..])
        .map(|b| (b.props.clone(), b.body.as_bytes().to_vec()))
        .collect();
    let mut raw = raw_client().await;
    publish_raw(&mut raw, &inbound, &messages).await;
    let dlq_name = format!("{p}.dlq");
    broker
        .await_count(&dlq_name, messages.len() as u32, DEFAULT_TIMEOUT)
        .await;
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));

    let (code, listing, stderr) = dlq(&config, &["inspect"]).await;
    assert_eq!(code, Some(0), "dlq inspect: {stderr}");
    assert!(
        listing.contains(&format!("{p}-id-caf\\xe9-\\xff")),
        "the id is listed with its bytes written \\xNN:\n{listing}"
    );
    let (code, json, stderr) = dlq(&config, &["inspect", "--json"]).await;
    assert_eq!(code, Some(0), "dlq inspect --json: {stderr}");
    let ids: Vec<String> = json
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            v["message_id"].as_str().unwrap_or("-").to_owned()
        })
        .collect();
    assert_eq!(ids.len(), messages.len(), "{json}");
    assert!(ids.contains(&format!("{p}-id-caf\\xe9-\\xff")), "{ids:?}");
    assert!(ids.contains(&format!("{p}-bad-header-key")), "{ids:?}");

    broker.declare_queue(&format!("{p}.service")).await;
    let running = InProcess::start_consuming(&toml, &broker, &inbound).await;
    let (code, _, stderr) = dlq(&config, &["redrive"]).await;
    assert_eq!(code, Some(0), "dlq redrive: {stderr}");
    broker
        .await_count(
            &format!("{p}.service"),
            messages.len() as u32,
            DEFAULT_TIMEOUT,
        )
        .await;
    wait_until(&format!("{inbound} settled"), DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 0))
    })
    .await;
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
    assert_eq!(
        broker.queue_len(&dlq_name).await,
        0,
        "every dead letter redriven"
    );
    let service = drain(&mut raw, &format!("{p}.service")).await;
    assert_eq!(service.len(), messages.len());
    for b in bad[..2].iter().chain(&bad[4..]) {
        let copy = service
            .iter()
            .find(|m| m.body == b.body.as_bytes())
            .unwrap_or_else(|| panic!("service: no copy of {}", b.body));
        assert!(b.kept(copy), "{} lost its bytes on the way back", b.body);
    }
    raw.close().await;
    let _ = std::fs::remove_file(&config);
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_that_are_not_utf8_are_inspected_and_redriven_in_republish_mode() {
    dead_letters_that_are_not_utf8_are_inspected_and_redriven("bytes-dlq-repub", "republish").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_that_are_not_utf8_are_inspected_and_redriven_in_nack_mode() {
    dead_letters_that_are_not_utf8_are_inspected_and_redriven("bytes-dlq-nack", "nack").await;
}
