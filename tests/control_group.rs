//! A group of two real instances (the same `name`, the same inbound
//! queue, each with its own admin port and the token `T`): a command sent
//! to one applies to both. A service registered through the first takes
//! the second's messages too, and messages that came before any
//! registration are held, not dead-lettered, until it registers; a drain
//! sent to the second and a pause sent to the first hold on both (status,
//! `/readyz`, metrics, and no copy made while paused); an instance
//! SIGKILLed while the group is paused comes back paused, with the drain
//! and the registration, before it takes work, a resume sent to it
//! releases every message held meanwhile, and the killed one leaves the
//! status once silent for three heartbeats; an instance started after
//! retention trimmed the records that made the group's state recovers it
//! from a snapshot. Every message is counted by body: nothing lost,
//! nothing twice, nothing dead-lettered.

use crate::support;

use futures_util::StreamExt;
use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::control::{ControlClient, endpoint_state, registered};
use support::harness::{Process, wait_consumers};
use support::rabbitmqctl::ready_unacked;
use support::{
    DEFAULT_TIMEOUT, HttpResponse, Metrics, TestBroker, delete_all_with_prefix, free_admin_addr,
    http_get, tally, unique_prefix, wait_for, wait_until,
};

const TOKEN: &str = "T";
const FORWARDED: &str = "switchyard_messages_forwarded_total";
const FAILOVERS: &str = "switchyard_failovers_total";
const PAUSED: &str = "switchyard_paused";
const ENDPOINT_STATE: &str = "switchyard_endpoint_state";
const REGISTRATIONS: &str = "switchyard_registrations";
/// A registration's lease: far longer than any test here runs.
const LEASE_MS: u64 = 300_000;
/// The smallest `control.max_bytes`.
const MIN_CONTROL_BYTES: u64 = 1 << 20;

/// One real instance of the group and its admin endpoint.
struct Instance {
    process: Process,
    control: ControlClient,
}

impl Instance {
    /// `switchyard run` on `config` with an admin port of its own and the
    /// group's token.
    fn spawn(p: &str, tag: &str, config: &Forwarder) -> Self {
        let addr = free_admin_addr();
        let toml = config
            .clone()
            .admin(&addr.to_string())
            .admin_key("tokens", [TOKEN])
            .toml();
        Self {
            process: Process::spawn(&format!("{p}-{tag}"), &toml),
            control: ControlClient::new(addr, TOKEN),
        }
    }

    /// Its status once its admin endpoint answers and it has recovered
    /// the group's state.
    async fn recovered(&self) -> Value {
        self.control.recovered().await
    }

    async fn get(&self, path: &str) -> HttpResponse {
        http_get(self.control.addr, path)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    async fn metrics(&self) -> Metrics {
        let response = self.get("/metrics").await;
        assert_eq!(response.status, 200, "{}", response.body);
        Metrics::parse(&response.body)
    }

    async fn metrics_until(&self, what: &str, cond: impl Fn(&Metrics) -> bool) -> Metrics {
        wait_for(what, DEFAULT_TIMEOUT, || async {
            let m = self.metrics().await;
            cond(&m).then_some(m)
        })
        .await
    }

    /// Waits until `/readyz` answers `status`; that answer.
    async fn ready_until(&self, status: u16) -> HttpResponse {
        wait_for(
            &format!("/readyz answers {status}"),
            DEFAULT_TIMEOUT,
            || async {
                let r = self.get("/readyz").await;
                (r.status == status).then_some(r)
            },
        )
        .await
    }

    /// Its instance name in the group.
    async fn name(&self) -> String {
        let status = self.control.status().await;
        status["instance"]
            .as_str()
            .unwrap_or_else(|| panic!("no instance name: {status}"))
            .to_owned()
    }

    /// Stops it with SIGTERM; it must exit 0.
    async fn stop(mut self) {
        self.process.signal("TERM");
        assert_eq!(
            self.process.wait_exit(DEFAULT_TIMEOUT).await,
            Some(0),
            "SIGTERM ends it cleanly; log:\n{}",
            self.process.log()
        );
    }
}

/// The seed scenario (branches "service" and "logging", each with a
/// backup) as a group; `workers` adds a registrable round-robin branch
/// "workers" over every message.
fn seed_group(p: &str, workers: bool) -> Forwarder {
    let config = Forwarder::new(p).seed(p);
    if workers {
        config.branch(Branch::registrable("workers", "all").set("strategy", "round_robin"))
    } else {
        config
    }
}

/// `n` bodies, unique to this test and `batch`.
fn bodies(p: &str, batch: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{p}-{batch}-{i}")).collect()
}

async fn publish(broker: &TestBroker, inbound: &str, bodies: &[String]) {
    let sent = broker
        .publish_many("", inbound, bodies, BasicProperties::default())
        .await;
    assert_eq!(sent, bodies.len());
}

/// Waits until `queue` holds exactly `ready` ready and `unacked` unacked
/// messages, as the broker counts them.
async fn inbound_until(queue: &str, ready: u64, unacked: u64, timeout: Duration) {
    wait_until(
        &format!("{queue} holds {ready} ready and {unacked} unacked"),
        timeout,
        || async { ready_unacked(queue).await == Some((ready, unacked)) },
    )
    .await;
}

/// Watches for `window` that nothing moves while the group is paused:
/// the inbound queue keeps `held` (ready, unacked), each of `queues`
/// keeps its count, and no instance of `instances` forwards anything. How
/// long to watch is the test's choice, not a condition: a pause that
/// leaked would forward and ack within milliseconds.
async fn nothing_moves(
    broker: &TestBroker,
    inbound: &str,
    held: (u64, u64),
    queues: &[(&str, u32)],
    instances: &[&Instance],
    window: Duration,
) {
    let mut forwarded = Vec::new();
    for instance in instances {
        forwarded.push(instance.metrics().await.sum(FORWARDED));
    }
    let watched = tokio::time::Instant::now();
    while watched.elapsed() < window {
        assert_eq!(ready_unacked(inbound).await, Some(held), "{inbound}");
        for (queue, expected) in queues {
            assert_eq!(broker.queue_len(queue).await, *expected, "{queue}");
        }
        for (instance, before) in instances.iter().zip(&forwarded) {
            assert_eq!(instance.metrics().await.sum(FORWARDED), *before);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Drains `queue` and asserts it held each of `sent` exactly once and
/// nothing else; prints the count and the duplicates.
async fn assert_each_once(broker: &TestBroker, queue: &str, sent: &[String]) {
    wait_until(
        &format!("{queue} holds {} messages", sent.len()),
        DEFAULT_TIMEOUT,
        || async { broker.queue_len(queue).await as usize >= sent.len() },
    )
    .await;
    let copies: BTreeMap<String, usize> = tally(&broker.get_all(queue).await);
    let missing: Vec<&String> = sent.iter().filter(|b| !copies.contains_key(*b)).collect();
    let duplicated: Vec<(&String, &usize)> = copies.iter().filter(|(_, n)| **n > 1).collect();
    let strangers: Vec<&String> = copies.keys().filter(|b| !sent.contains(b)).collect();
    println!(
        "{queue}: {} copies of {} messages, {} duplicated",
        copies.values().sum::<usize>(),
        sent.len(),
        duplicated.len()
    );
    assert!(
        missing.is_empty() && duplicated.is_empty() && strangers.is_empty(),
        "{queue}: missing {missing:?}, duplicated {duplicated:?}, unexpected {strangers:?}"
    );
}

/// The parts of a status every instance of the group must agree on.
fn group_view(status: &Value) -> Value {
    let endpoints: BTreeMap<String, Option<String>> = ["service", "service_backup", "logging"]
        .into_iter()
        .map(|e| (e.to_owned(), endpoint_state(status, e)))
        .collect();
    serde_json::json!({
        "group": status["group"],
        "paused": status["paused"],
        "paused_by": status["paused_by"],
        "endpoints": endpoints,
        "registrations": status["registrations"],
        "offset": status["offset"],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_made_through_one_instance_routes_the_other_instances_messages() {
    let p = unique_prefix("group-register");
    let broker = TestBroker::connect(&p).await;
    let (inbound, w1, dlq) = (format!("{p}.in"), format!("{p}.w1"), format!("{p}.dlq"));
    broker.declare_queue(&w1).await;
    // A configuration needs an endpoint; this one is in no branch's list.
    let config = Forwarder::new(&p)
        .endpoint(Endpoint::queue("spare", &format!("{p}.spare")))
        .filter("all", Filter::match_all())
        .branch(Branch::registrable("workers", "all").set("strategy", "round_robin"));
    let a = Instance::spawn(&p, "a", &config);
    let b = Instance::spawn(&p, "b", &config);
    let (status_a, status_b) = (a.recovered().await, b.recovered().await);
    assert_eq!(status_a["group"], p.as_str());
    assert_eq!(status_b["group"], p.as_str());
    assert_ne!(status_a["instance"], status_b["instance"]);
    wait_consumers(&broker, &inbound, 2).await;

    // Before any registration the branch has no endpoint: its messages
    // are held by both instances, never dead-lettered.
    let early = bodies(&p, "early", 20);
    publish(&broker, &inbound, &early).await;
    inbound_until(&inbound, 0, 20, DEFAULT_TIMEOUT).await;
    assert_eq!(broker.queue_len(&w1).await, 0);
    assert_eq!(broker.queue_len(&dlq).await, 0);

    let answer = a.control.register("workers", "w1", &w1, LEASE_MS).await;
    assert_eq!(registered(&answer, "workers"), ["w1"], "{answer}");
    let on_b = b
        .control
        .status_until("B lists w1, registered and up", |s| {
            registered(s, "workers") == ["w1"] && endpoint_state(s, "w1").as_deref() == Some("up")
        })
        .await;
    let registration = &on_b["registrations"][0];
    assert_eq!(registration["routing_key"], w1.as_str(), "{on_b}");
    assert_eq!(registration["ttl_ms"], LEASE_MS, "{on_b}");
    assert_eq!(registration["broker"], "main", "{on_b}");

    let late = bodies(&p, "late", 200);
    publish(&broker, &inbound, &late).await;
    inbound_until(&inbound, 0, 0, Duration::from_secs(60)).await;
    let every: Vec<String> = early.iter().chain(&late).cloned().collect();
    assert_each_once(&broker, &w1, &every).await;
    assert_eq!(broker.queue_len(&dlq).await, 0, "nothing dead-lettered");

    // Both instances forwarded to w1, and between them every message once.
    let workers_w1 = [("branch", "workers"), ("endpoint", "w1")];
    let mut total = 0.0;
    for (tag, instance) in [("A", &a), ("B", &b)] {
        let m = instance.metrics().await;
        let forwarded = m.value(FORWARDED, &workers_w1);
        println!("{tag} forwarded {forwarded} to w1");
        assert!(forwarded > 0.0, "{tag} forwarded nothing to w1");
        assert_eq!(
            m.get(REGISTRATIONS, &[("branch", "workers")]),
            Some(1.0),
            "{tag}"
        );
        assert_eq!(m.sum(FAILOVERS), 0.0, "{tag}");
        total += forwarded;
    }
    assert_eq!(total, every.len() as f64, "A and B forwarded each once");

    a.stop().await;
    b.stop().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_through_one_instance_and_a_pause_through_the_other_hold_on_both() {
    let p = unique_prefix("group-drain-pause");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let (service, backup, logging, logging_backup, dlq) = (
        format!("{p}.service"),
        format!("{p}.service.backup"),
        format!("{p}.logging"),
        format!("{p}.logging.backup"),
        format!("{p}.dlq"),
    );
    let config = seed_group(&p, false);
    let a = Instance::spawn(&p, "a", &config);
    let b = Instance::spawn(&p, "b", &config);
    a.recovered().await;
    b.recovered().await;
    wait_consumers(&broker, &inbound, 2).await;
    a.ready_until(200).await;
    b.ready_until(200).await;

    // Drained through B: A skips `service` too, without failing it.
    let answer = b.control.drain("service").await;
    assert_eq!(
        endpoint_state(&answer, "service").as_deref(),
        Some("drained")
    );
    a.control
        .status_until("A shows service drained", |s| {
            endpoint_state(s, "service").as_deref() == Some("drained")
        })
        .await;
    let drained = [("endpoint", "service"), ("state", "drained")];
    let up = [("endpoint", "service"), ("state", "up")];
    for (tag, instance) in [("A", &a), ("B", &b)] {
        let m = instance
            .metrics_until(&format!("{tag}'s metrics show service drained"), |m| {
                m.get(ENDPOINT_STATE, &drained) == Some(1.0)
            })
            .await;
        assert_eq!(m.get(ENDPOINT_STATE, &up), Some(0.0), "{tag}");
        assert_eq!(m.get(PAUSED, &[]), Some(0.0), "{tag}");
    }

    let drained_batch = bodies(&p, "drained", 60);
    publish(&broker, &inbound, &drained_batch).await;
    inbound_until(&inbound, 0, 0, DEFAULT_TIMEOUT).await;
    for queue in [&backup, &logging] {
        assert_eq!(broker.queue_len(queue).await, 60, "{queue}");
    }
    assert_eq!(broker.queue_len(&service).await, 0, "service is drained");
    assert_eq!(broker.queue_len(&logging_backup).await, 0);
    let mut to_backup = 0.0;
    for (tag, instance) in [("A", &a), ("B", &b)] {
        let m = instance.metrics().await;
        assert_eq!(m.sum(FAILOVERS), 0.0, "{tag}: a drain is no failover");
        assert_eq!(
            m.value(FORWARDED, &[("branch", "service"), ("endpoint", "service")]),
            0.0,
            "{tag}"
        );
        to_backup += m.value(
            FORWARDED,
            &[("branch", "service"), ("endpoint", "service_backup")],
        );
    }
    assert_eq!(to_backup, 60.0, "A and B sent each to the backup once");

    // Paused through A: neither takes a new message.
    let answer = a.control.pause().await;
    assert_eq!(answer["paused"], true, "{answer}");
    let a_name = a.name().await;
    assert_eq!(answer["paused_by"]["instance"], a_name.as_str(), "{answer}");
    for (tag, instance) in [("A", &a), ("B", &b)] {
        let ready = instance.ready_until(503).await;
        assert!(
            ready.body.contains("paused"),
            "{tag}'s /readyz: {}",
            ready.body
        );
        instance
            .metrics_until(&format!("{tag}'s switchyard_paused is 1"), |m| {
                m.get(PAUSED, &[]) == Some(1.0)
            })
            .await;
    }
    let paused_batch = bodies(&p, "paused", 100);
    publish(&broker, &inbound, &paused_batch).await;
    // Every one handed to the instances, which hold it unforwarded.
    inbound_until(&inbound, 0, 100, DEFAULT_TIMEOUT).await;
    let counts = [
        (service.as_str(), 0),
        (backup.as_str(), 60),
        (logging.as_str(), 60),
        (logging_backup.as_str(), 0),
        (dlq.as_str(), 0),
    ];
    nothing_moves(
        &broker,
        &inbound,
        (0, 100),
        &counts,
        &[&a, &b],
        Duration::from_secs(3),
    )
    .await;

    // Both hold the same view of the group, and both have applied every
    // command.
    let in_step = |s: &Value| {
        let instances = s["instances"].as_array().cloned().unwrap_or_default();
        instances.len() == 2 && instances.iter().all(|i| i["in_step"] == true)
    };
    let seen_by_a = a.control.status_until("A sees both in step", in_step).await;
    let seen_by_b = b.control.status_until("B sees both in step", in_step).await;
    assert_eq!(group_view(&seen_by_a), group_view(&seen_by_b));
    assert_eq!(seen_by_b["paused"], true);
    assert_eq!(seen_by_b["paused_by"]["instance"], a_name.as_str());
    assert_eq!(
        endpoint_state(&seen_by_b, "service").as_deref(),
        Some("drained")
    );
    assert_eq!(seen_by_b["registrations"], serde_json::json!([]));

    // Resumed through B: every message held is forwarded once.
    let answer = b.control.resume().await;
    assert_eq!(answer["paused"], false, "{answer}");
    // Both say who resumed, not who paused.
    let b_name = b.name().await;
    for (tag, instance) in [("A", &a), ("B", &b)] {
        wait_until(
            &format!("{tag} logs that B resumed"),
            DEFAULT_TIMEOUT,
            || async {
                let by = format!("by=\"{b_name}\"");
                instance
                    .process
                    .log()
                    .lines()
                    .any(|l| l.contains("resumed: taking messages again") && l.contains(&by))
            },
        )
        .await;
    }
    a.ready_until(200).await;
    inbound_until(&inbound, 0, 0, DEFAULT_TIMEOUT).await;
    let every: Vec<String> = drained_batch.iter().chain(&paused_batch).cloned().collect();
    assert_each_once(&broker, &backup, &every).await;
    assert_each_once(&broker, &logging, &every).await;
    assert_eq!(broker.queue_len(&service).await, 0, "service still drained");
    assert_eq!(broker.queue_len(&dlq).await, 0, "nothing dead-lettered");
    for (tag, instance) in [("A", &a), ("B", &b)] {
        let m = instance.metrics().await;
        assert_eq!(m.get(PAUSED, &[]), Some(0.0), "{tag}");
        assert_eq!(m.sum(FAILOVERS), 0.0, "{tag}");
    }

    a.stop().await;
    b.stop().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_restarted_while_paused_comes_back_paused_with_the_drain_and_the_registration()
{
    let p = unique_prefix("group-restart");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let (service, backup, logging, w1, dlq) = (
        format!("{p}.service"),
        format!("{p}.service.backup"),
        format!("{p}.logging"),
        format!("{p}.w1"),
        format!("{p}.dlq"),
    );
    broker.declare_queue(&w1).await;
    // A small prefetch leaves messages ready in the queue while both hold
    // theirs: a restarted instance that consumed before it knew the group
    // was paused would take them and forward them at once.
    const PREFETCH: u32 = 20;
    // Quick heartbeats, so the killed B is seen gone within a second.
    let config = seed_group(&p, true)
        .inbound("prefetch", PREFETCH)
        .control("heartbeat_ms", 300);
    let a = Instance::spawn(&p, "a", &config);
    let mut b = Instance::spawn(&p, "b", &config);
    a.recovered().await;
    b.recovered().await;
    wait_consumers(&broker, &inbound, 2).await;

    // The group: w1 registered, service drained, paused.
    a.control.register("workers", "w1", &w1, LEASE_MS).await;
    b.control.drain("service").await;
    let paused = a.control.pause().await;
    let paused_by = paused["paused_by"].clone();
    b.control
        .status_until("B applied all three", |s| {
            s["paused"] == true
                && endpoint_state(s, "service").as_deref() == Some("drained")
                && registered(s, "workers") == ["w1"]
        })
        .await;
    let held = bodies(&p, "paused", 100);
    publish(&broker, &inbound, &held).await;
    let prefetch = u64::from(PREFETCH);
    inbound_until(&inbound, 100 - 2 * prefetch, 2 * prefetch, DEFAULT_TIMEOUT).await;

    // B dies with the messages it was handed: they go back to the queue,
    // unforwarded (A, full, takes none of them).
    let old_b = b.name().await;
    let a_name = a.name().await;
    a.control
        .status_until("A lists B", |s| {
            instance_names(s) == sorted([a_name.as_str(), old_b.as_str()])
        })
        .await;
    b.process.signal("KILL");
    assert_eq!(
        b.process.wait_exit(DEFAULT_TIMEOUT).await,
        None,
        "killed by a signal"
    );
    drop(b);
    wait_consumers(&broker, &inbound, 1).await;
    inbound_until(&inbound, 100 - prefetch, prefetch, DEFAULT_TIMEOUT).await;

    let b = Instance::spawn(&p, "b2", &config);
    let status = b.recovered().await;
    assert_ne!(status["instance"], old_b.as_str(), "a new instance");
    assert_eq!(status["paused"], true, "{status}");
    assert_eq!(status["paused_by"], paused_by, "{status}");
    assert_eq!(
        endpoint_state(&status, "service").as_deref(),
        Some("drained"),
        "{status}"
    );
    assert_eq!(registered(&status, "workers"), ["w1"], "{status}");
    assert_eq!(status["registrations"][0]["routing_key"], w1.as_str());
    let ready = b.ready_until(503).await;
    assert!(ready.body.contains("paused"), "/readyz: {}", ready.body);
    let m = b.metrics().await;
    assert_eq!(m.get(PAUSED, &[]), Some(1.0));
    assert_eq!(
        m.get(
            ENDPOINT_STATE,
            &[("endpoint", "service"), ("state", "drained")]
        ),
        Some(1.0)
    );
    assert_eq!(m.get(REGISTRATIONS, &[("branch", "workers")]), Some(1.0));

    // The new B takes its share of the ready messages and holds it.
    wait_consumers(&broker, &inbound, 2).await;
    inbound_until(&inbound, 100 - 2 * prefetch, 2 * prefetch, DEFAULT_TIMEOUT).await;
    let empty = [
        (service.as_str(), 0),
        (backup.as_str(), 0),
        (logging.as_str(), 0),
        (w1.as_str(), 0),
        (dlq.as_str(), 0),
    ];
    let held_now = (100 - 2 * prefetch, 2 * prefetch);
    nothing_moves(
        &broker,
        &inbound,
        held_now,
        &empty,
        &[&a, &b],
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(b.metrics().await.sum(FORWARDED), 0.0, "the new B held all");

    // Resumed through the new B: every message held arrives once on each
    // branch, through the backup of the drained service.
    let answer = b.control.resume().await;
    assert_eq!(answer["paused"], false, "{answer}");
    inbound_until(&inbound, 0, 0, Duration::from_secs(60)).await;
    for queue in [&backup, &logging, &w1] {
        assert_each_once(&broker, queue, &held).await;
    }
    assert_eq!(broker.queue_len(&service).await, 0, "service still drained");
    assert_eq!(broker.queue_len(&dlq).await, 0, "nothing dead-lettered");
    let m = b.metrics().await;
    assert!(
        m.value(FORWARDED, &[("branch", "workers"), ("endpoint", "w1")]) > 0.0,
        "the new B forwarded its share once resumed"
    );
    assert_eq!(m.get(PAUSED, &[]), Some(0.0));

    // The killed B said nothing; it leaves the group's status once silent
    // for three of its beats, and the two alive are listed, in step.
    let b_name = b.name().await;
    let alive = sorted([a_name.as_str(), b_name.as_str()]);
    for (tag, instance) in [("A", &a), ("the new B", &b)] {
        let status = instance
            .control
            .status_until(&format!("{tag} lists the live instances alone"), |s| {
                instance_names(s) == alive
                    && s["instances"]
                        .as_array()
                        .is_some_and(|l| l.iter().all(|i| i["in_step"] == true))
            })
            .await;
        for listed in status["instances"].as_array().into_iter().flatten() {
            assert!(listed["last_seen_at"].is_string(), "{listed}");
        }
    }

    // A clean stop says it leaves, and no beat of it follows the leave
    // (read once both have stopped: A's beats would keep the read going).
    b.stop().await;
    a.stop().await;
    let records = stream_read(&broker, &format!("{p}.control"), "first", u64::MAX).await;
    let kinds: Vec<&str> = records
        .iter()
        .filter(|(_, r)| r["instance"] == b_name.as_str())
        .filter_map(|(_, r)| r["kind"].as_str())
        .collect();
    assert_eq!(
        kinds.last(),
        Some(&"leave"),
        "the new B's records: {kinds:?}"
    );
    assert!(kinds.contains(&"alive"), "the new B beat: {kinds:?}");
    delete_all_with_prefix(&p).await;
}

/// The instances a status lists, by name, sorted.
fn instance_names(status: &Value) -> Vec<String> {
    let mut names: Vec<String> = status["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["instance"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

fn sorted<const N: usize>(names: [&str; N]) -> Vec<String> {
    let mut names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    names.sort();
    names
}

/// Retention trims the control stream's head, and with it the records
/// that paused the group, drained `service` and registered `w1`: an
/// instance started on what is left recovers all three from the newest
/// snapshot and the records after it, not from a partial read. The
/// stream is declared at the smallest `control.max_bytes` (1 MiB, in
/// segments of 128 KiB); renewals of another registration, `w2`, fill it
/// (each says nothing of the first three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_started_after_retention_trimmed_the_stream_recovers_from_a_snapshot() {
    let p = unique_prefix("group-trimmed");
    let broker = TestBroker::connect(&p).await;
    let stream = format!("{p}.control");
    let w1 = format!("{p}.w1");
    let config = seed_group(&p, true).control("max_bytes", MIN_CONTROL_BYTES);
    let a = Instance::spawn(&p, "a", &config);
    a.recovered().await;
    a.control.register("workers", "w1", &w1, 3_600_000).await;
    a.control.drain("service").await;
    a.control.pause().await;
    // The records that made the state: A's hello, three commands and
    // their acknowledgements.
    let made_by = stream_offsets(&broker, &stream).await;
    assert!(made_by.1 < 20, "{made_by:?}");

    // w2 renewed with a routing key of 255 bytes, eight at a time, until
    // the stream's first record is past them.
    let w2 = json!({ "routing_key": "k".repeat(255), "ttl_ms": 3_600_000 });
    let began = std::time::Instant::now();
    let renewals = std::sync::atomic::AtomicUsize::new(0);
    let trimmed = wait_for(
        "retention trims the stream's head",
        Duration::from_secs(120),
        || async {
            let rounds = (0..8).map(|_| async {
                for _ in 0..25 {
                    a.control.ok("PUT", "/registry/workers/w2", Some(&w2)).await;
                }
            });
            futures_util::future::join_all(rounds).await;
            renewals.fetch_add(200, std::sync::atomic::Ordering::Relaxed);
            let offsets = stream_offsets(&broker, &stream).await;
            (offsets.0 > made_by.1).then_some(offsets)
        },
    )
    .await;
    println!(
        "{} renewals in {:.1}s; the stream now holds offsets {trimmed:?}",
        renewals.into_inner(),
        began.elapsed().as_secs_f64()
    );

    let b = Instance::spawn(&p, "b", &config);
    let status = b.recovered().await;
    assert_eq!(status["paused"], true, "{status}");
    assert_eq!(
        endpoint_state(&status, "service").as_deref(),
        Some("drained"),
        "{status}"
    );
    assert_eq!(registered(&status, "workers"), ["w1", "w2"], "{status}");
    let log = b.process.log();
    assert!(
        log.contains("group state recovered from the control stream"),
        "{log}"
    );
    assert!(!log.contains("no snapshot followed"), "{log}");
    a.control
        .status_until("A shows the group as B recovered it", |s| {
            group_view(s) == group_view(&status)
        })
        .await;
    a.stop().await;
    b.stop().await;
    delete_all_with_prefix(&p).await;
}

/// The first and the last offset `stream` holds, read by a consumer of
/// its own from its first record and up to its last.
async fn stream_offsets(broker: &TestBroker, stream: &str) -> (u64, u64) {
    let first = stream_read(broker, stream, "first", 1).await;
    // From the last chunk on, until nothing more comes.
    let last = stream_read(broker, stream, "last", u64::MAX).await;
    match (first.first(), last.iter().map(|(offset, _)| offset).max()) {
        (Some((first, _)), Some(last)) => (*first, *last),
        _ => panic!("{stream} holds no record"),
    }
}

/// Up to `most` records of `stream` read from `start` (`first` or
/// `last`), each with its offset, ending once none comes for half a second.
async fn stream_read(
    broker: &TestBroker,
    stream: &str,
    start: &str,
    most: u64,
) -> Vec<(u64, Value)> {
    let channel = broker.fresh_channel().await;
    channel
        .basic_qos(100, BasicQosOptions::default())
        .await
        .unwrap_or_else(|e| panic!("basic.qos: {e}"));
    let mut args = FieldTable::default();
    args.insert(
        "x-stream-offset".into(),
        AMQPValue::LongString(start.into()),
    );
    let mut consumer = channel
        .basic_consume(
            stream.into(),
            "".into(),
            BasicConsumeOptions::default(),
            args,
        )
        .await
        .unwrap_or_else(|e| panic!("consume {stream}: {e}"));
    let mut records = Vec::new();
    while (records.len() as u64) < most {
        let next = tokio::time::timeout(Duration::from_millis(500), consumer.next()).await;
        let Ok(Some(Ok(delivery))) = next else { break };
        let offset = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-stream-offset").cloned());
        match offset {
            Some(AMQPValue::LongLongInt(n)) => {
                let record = serde_json::from_slice(&delivery.data)
                    .unwrap_or_else(|e| panic!("a record that is not JSON ({e})"));
                records.push((n as u64, record));
            }
            other => panic!("a record without its offset: {other:?}"),
        }
        let _ = delivery.ack(BasicAckOptions::default()).await;
    }
    let _ = channel.close(200, "done".into()).await;
    records
}
