//! Operating a running forwarder through its admin endpoint, against the
//! real broker: a pause holds new messages while the inbound queue grows
//! and resumes exactly once; a drained endpoint sends its traffic to its
//! backup and back without a failover, a drained last endpoint holds, and
//! a drained endpoint is not probed;
//! services register into a round-robin branch, leave, lapse and come,
//! every message reaching exactly one instance; a reload keeps all of it;
//! a pause longer than the sessions' idle timeout ends no session, and a
//! session waits for a service to register as a message does; a refused
//! control stream is named and holds all work until granted;
//! bad requests change nothing and say why; a flood of control requests
//! never stops forwarding. Every message is counted by body.

use crate::support;

use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::control::{ControlClient, endpoint_state, json_of, registered};
use support::harness::{InProcess, Process, consumer_count, wait_consumers};
use support::ingress::start_ingress;
use support::sessions::{ID, by_session, in_session, publish_to, seqs, whole};
use support::vhost::TestVhost;
use support::{
    DEFAULT_TIMEOUT, Metrics, TestBroker, admin_listener, delete_all_with_prefix, http_get,
    http_send, tally, unique_prefix, wait_for, wait_until,
};
use switchyard::Options;
use switchyard::reload::Reload;
use tokio::sync::mpsc;

const TOKEN: &str = "ops-token";
const FORWARDED: &str = "switchyard_messages_forwarded_total";
const FAILOVERS: &str = "switchyard_failovers_total";
const CONSUMED: &str = "switchyard_messages_consumed_total";

/// `config` with the admin endpoint taking commands with [`TOKEN`].
fn steerable(config: Forwarder) -> Forwarder {
    config
        .admin("127.0.0.1:0")
        .admin_key("tokens", support::config::Value::List(vec![TOKEN.into()]))
}

/// Starts `config` in this process with its admin endpoint on a fresh
/// port; waits until it consumes its inbound queue.
async fn start(config: &Forwarder, broker: &TestBroker, p: &str) -> (InProcess, ControlClient) {
    let (listener, addr) = admin_listener();
    let options = Options {
        admin: Some(listener),
        ..Default::default()
    };
    let running = InProcess::start_with(&config.toml(), options);
    wait_consumers(broker, &format!("{p}.in"), 1).await;
    (running, ControlClient::new(addr, TOKEN))
}

async fn metrics(addr: SocketAddr) -> Metrics {
    let response = http_get(addr, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    Metrics::parse(&response.body)
}

/// Publishes `bodies` from a task of its own, `per_tick` every 50 ms (a
/// steady rate); the handle ends when all are confirmed.
fn publish_steadily(p: &str, bodies: Vec<String>, per_tick: usize) -> tokio::task::JoinHandle<()> {
    let p = p.to_owned();
    tokio::spawn(async move {
        let broker = TestBroker::connect(&format!("{p}-pub")).await;
        let inbound = format!("{p}.in");
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        for chunk in bodies.chunks(per_tick) {
            tick.tick().await;
            let chunk: Vec<Vec<u8>> = chunk.iter().map(|b| b.clone().into_bytes()).collect();
            broker
                .publish_many("", &inbound, chunk, Default::default())
                .await;
        }
    })
}

fn bodies(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

/// Every body of `expected` exactly once in `got`, nothing else.
fn exactly_once(got: &std::collections::BTreeMap<String, usize>, expected: &[String], what: &str) {
    let extra: Vec<&String> = got.keys().filter(|k| !expected.contains(k)).collect();
    let missing: Vec<&String> = expected.iter().filter(|b| !got.contains_key(*b)).collect();
    let twice: Vec<(&String, &usize)> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        extra.is_empty() && missing.is_empty() && twice.is_empty(),
        "{what}: {} missing (first {:?}), {} duplicated (first {:?}), {} unexpected",
        missing.len(),
        missing.first(),
        twice.len(),
        twice.first(),
        extra.len()
    );
}

/// Publishes `bodies` to `<p>.in` and waits until the forwarder at
/// `admin` holds them as in an outage (`switchyard_outage_holds`).
async fn publish_held(broker: &TestBroker, p: &str, bodies: &[String], admin: SocketAddr) {
    broker
        .publish_many("", &format!("{p}.in"), bodies.iter(), Default::default())
        .await;
    wait_until(
        "the messages held as in an outage",
        DEFAULT_TIMEOUT,
        || async { metrics(admin).await.value("switchyard_outage_holds", &[]) > 0.0 },
    )
    .await;
}

async fn lens(broker: &TestBroker, queues: &[&str]) -> u32 {
    let mut total = 0;
    for queue in queues {
        total += broker.queue_len(queue).await;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_new_messages_and_resume_takes_up_exactly_once() {
    let p = unique_prefix("ctlpause");
    let broker = TestBroker::connect(&p).await;
    let config = steerable(Forwarder::new(&p).seed(&p)).http(&[]);
    let (listener, addr) = admin_listener();
    let options = Options {
        admin: Some(listener),
        ..Default::default()
    };
    let inbound = format!("{p}.in");
    let (running, http) = start_ingress(&config, options, Some((&broker, &inbound))).await;
    let control = ControlClient::new(addr, TOKEN);
    let (service, backup, logging, logging_backup) = (
        format!("{p}.service"),
        format!("{p}.service.backup"),
        format!("{p}.logging"),
        format!("{p}.logging.backup"),
    );

    // 5,000 messages at about 800 a second.
    let all = bodies("m", 0..5000);
    let publisher = publish_steadily(&p, all.clone(), 40);
    wait_until(
        "1,000 forwarded before the pause",
        DEFAULT_TIMEOUT,
        || async { broker.queue_len(&service).await >= 1000 },
    )
    .await;
    let status = control.pause().await;
    assert_eq!(status["paused"], true, "{status}");
    let paused_at = Instant::now();

    // Work in flight finishes; then nothing moves while the queue grows.
    let settled = wait_for("the work in flight settled", DEFAULT_TIMEOUT, || async {
        let m = metrics(addr).await;
        (m.value("switchyard_in_flight", &[]) == 0.0).then_some(m)
    })
    .await;
    assert_eq!(settled.value("switchyard_paused", &[]), 1.0);
    let consumed = settled.value(CONSUMED, &[]);
    let copies = lens(&broker, &[&service, &backup, &logging, &logging_backup]).await;
    let ready = broker.queue_len(&inbound).await;
    let readyz = http_get(addr, "/readyz")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(readyz.status, 503, "{}", readyz.body);
    assert!(readyz.body.contains("paused"), "{}", readyz.body);
    let refused = http.post("/messages/work", &[], b"while paused").await;
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert!(
        refused.headers.contains_key("retry-after"),
        "{:?}",
        refused.headers
    );
    assert!(refused.text.contains("paused"), "{}", refused.text);
    wait_until(
        "the inbound queue grows while paused",
        DEFAULT_TIMEOUT,
        || async { broker.queue_len(&inbound).await >= ready + 1000 },
    )
    .await;
    publisher.await.unwrap_or_else(|e| panic!("publisher: {e}"));
    // Held for the rest of 5 s, the pause the scenario asks for.
    if let Some(rest) = Duration::from_secs(5).checked_sub(paused_at.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let during = metrics(addr).await;
    assert_eq!(
        during.value(CONSUMED, &[]),
        consumed,
        "nothing taken while paused"
    );
    assert_eq!(
        lens(&broker, &[&service, &backup, &logging, &logging_backup]).await,
        copies,
        "no copy published while paused"
    );

    let status = control.resume().await;
    assert_eq!(status["paused"], false, "{status}");
    wait_until(
        "every message forwarded on both branches",
        DEFAULT_TIMEOUT * 3,
        || async {
            lens(&broker, &[&service, &backup]).await == 5000
                && lens(&broker, &[&logging, &logging_backup]).await == 5000
        },
    )
    .await;
    let served = support::tally_queues(&broker, &[service, backup]).await;
    exactly_once(&served, &all, "service");
    let logged = support::tally_queues(&broker, &[logging, logging_backup]).await;
    exactly_once(&logged, &all, "logging");
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    let after = metrics(addr).await;
    assert_eq!(after.value("switchyard_paused", &[]), 0.0);
    assert_eq!(after.sum(FAILOVERS), 0.0);
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_endpoint_sends_its_traffic_to_the_backup_and_back_without_a_failover() {
    let p = unique_prefix("ctldrain");
    let broker = TestBroker::connect(&p).await;
    let config = steerable(Forwarder::new(&p).seed(&p));
    let (running, control) = start(&config, &broker, &p).await;
    let (service, backup, logging) = (
        format!("{p}.service"),
        format!("{p}.service.backup"),
        format!("{p}.logging"),
    );
    let all = bodies("d", 0..3000);
    let publisher = publish_steadily(&p, all.clone(), 50);
    wait_until("800 on the primary", DEFAULT_TIMEOUT, || async {
        broker.queue_len(&service).await >= 800
    })
    .await;
    let status = control.drain("service").await;
    assert_eq!(
        endpoint_state(&status, "service").as_deref(),
        Some("drained")
    );
    let m = metrics(control.addr).await;
    let drained = [("endpoint", "service"), ("state", "drained")];
    assert_eq!(m.value("switchyard_endpoint_state", &drained), 1.0);
    let at_drain = broker.queue_len(&service).await;
    wait_until(
        "the backup takes the service copies",
        DEFAULT_TIMEOUT,
        || async { broker.queue_len(&backup).await >= 500 },
    )
    .await;
    // Only messages taken before the drain (at most a prefetch) went on to the primary.
    let primary_while_drained = broker.queue_len(&service).await;
    assert!(
        primary_while_drained <= at_drain + 500,
        "{primary_while_drained} on the primary while drained, {at_drain} at the drain"
    );
    let status = control.undrain("service").await;
    assert_eq!(endpoint_state(&status, "service").as_deref(), Some("up"));
    let at_undrain = broker.queue_len(&service).await;
    publisher.await.unwrap_or_else(|e| panic!("publisher: {e}"));
    wait_until(
        "all 3,000 forwarded on both branches",
        DEFAULT_TIMEOUT * 2,
        || async {
            lens(&broker, &[&service, &backup]).await == 3000
                && broker.queue_len(&logging).await == 3000
        },
    )
    .await;
    assert!(
        broker.queue_len(&service).await > at_undrain,
        "new messages return to the undrained primary"
    );
    let m = metrics(control.addr).await;
    assert_eq!(m.sum(FAILOVERS), 0.0, "a drain is no failover");
    assert!(
        m.value(
            FORWARDED,
            &[("branch", "service"), ("endpoint", "service_backup")]
        ) > 0.0
    );
    let served = support::tally_queues(&broker, &[service, backup]).await;
    exactly_once(&served, &all, "service");
    exactly_once(
        &support::tally_queues(&broker, &[logging]).await,
        &all,
        "logging",
    );
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn draining_the_only_endpoint_of_a_list_holds_its_messages_until_undrained() {
    let p = unique_prefix("ctlsolo");
    let broker = TestBroker::connect(&p).await;
    let config = steerable(Forwarder::new(&p).match_all(&p));
    let (running, control) = start(&config, &broker, &p).await;
    let service = format!("{p}.service");
    control.drain("service").await;
    let held = bodies("h", 0..20);
    publish_held(&broker, &p, &held, control.addr).await;
    assert_eq!(
        broker.queue_len(&service).await,
        0,
        "nothing published to a drained endpoint"
    );
    assert_eq!(
        broker.queue_len(&format!("{p}.dlq")).await,
        0,
        "nothing dead-lettered"
    );
    let readyz = http_get(control.addr, "/readyz")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(readyz.status, 503, "no endpoint up: {}", readyz.body);
    control.undrain("service").await;
    wait_until("the held messages delivered", DEFAULT_TIMEOUT, || async {
        broker.queue_len(&service).await == 20
    })
    .await;
    exactly_once(
        &support::tally_queues(&broker, &[service]).await,
        &held,
        "service",
    );
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    let m = metrics(control.addr).await;
    assert_eq!(m.sum(FAILOVERS), 0.0);
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

/// A drained endpoint is not probed. The primary publishes to an exchange
/// that does not exist yet, so it is down and probed every 100 ms; drained,
/// it stays down while its exchange appears and 20 probe intervals pass
/// (a probe would find it working at once); undrained, a probe finds it
/// and new messages go to it again.
#[tokio::test]
async fn a_drained_endpoint_is_not_probed_until_undrained() {
    let p = unique_prefix("ctlprobe");
    let broker = TestBroker::connect(&p).await;
    let (exchange, primary, backup) = (
        format!("{p}.later"),
        format!("{p}.primary"),
        format!("{p}.backup"),
    );
    let config = steerable(
        Forwarder::new(&p)
            .endpoint(Endpoint::exchange("primary", &exchange, "k").set("probe_interval_ms", 100))
            .endpoint(Endpoint::queue("backup", &backup))
            .backup_list("backups", &["backup"])
            .filter("all", Filter::match_all())
            .branch(Branch::new("service", "all", "primary").backups("backups")),
    );
    let (running, control) = start(&config, &broker, &p).await;
    let up = |m: &Metrics| m.value("switchyard_endpoint_up", &[("endpoint", "primary")]);
    let inbound = format!("{p}.in");
    broker
        .publish_many("", &inbound, ["d0"], Default::default())
        .await;
    broker.await_count(&backup, 1, DEFAULT_TIMEOUT).await;
    assert_eq!(up(&metrics(control.addr).await), 0.0, "the primary is down");

    control.drain("primary").await;
    // A probe started before the drain may still be out; it finds the
    // exchange missing as long as the exchange comes after it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    broker
        .declare_exchange(&exchange, lapin::ExchangeKind::Direct)
        .await;
    broker.declare_queue(&primary).await;
    broker.bind(&primary, &exchange, "k").await;
    broker
        .publish_many("", &inbound, ["d1"], Default::default())
        .await;
    broker.await_count(&backup, 2, DEFAULT_TIMEOUT).await;
    let quiet = Instant::now() + Duration::from_secs(2);
    while Instant::now() < quiet {
        assert_eq!(
            up(&metrics(control.addr).await),
            0.0,
            "a drained endpoint was probed and found working"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    control.undrain("primary").await;
    wait_until(
        "a probe finds the undrained primary",
        DEFAULT_TIMEOUT,
        || async { up(&metrics(control.addr).await) == 1.0 },
    )
    .await;
    broker
        .publish_many("", &inbound, ["d2"], Default::default())
        .await;
    broker.await_count(&primary, 1, DEFAULT_TIMEOUT).await;
    assert_eq!(broker.queue_len(&backup).await, 2);
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    let m = metrics(control.addr).await;
    assert_eq!(m.sum(FAILOVERS), 1.0, "the first message's failover alone");
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

/// A registrable round-robin branch "workers" with no endpoint of its
/// own, beside a "logging" branch to `<p>.logging`.
fn workers(p: &str) -> Forwarder {
    steerable(
        Forwarder::new(p)
            .endpoint(Endpoint::queue("logging", &format!("{p}.logging")))
            .filter("all", Filter::match_all())
            .branch(Branch::registrable("workers", "all").set("strategy", "round_robin"))
            .branch(Branch::new("logging", "all", "logging")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_register_into_a_round_robin_branch_lapse_and_leave() {
    let p = unique_prefix("ctlreg");
    let broker = TestBroker::connect(&p).await;
    let (w1, w2, w3) = (format!("{p}.w1"), format!("{p}.w2"), format!("{p}.w3"));
    for queue in [&w1, &w2, &w3] {
        broker.declare_queue(queue).await;
    }
    let (running, control) = start(&workers(&p), &broker, &p).await;
    let logging = format!("{p}.logging");
    let instances = [w1.as_str(), w2.as_str(), w3.as_str()];

    // No endpoint yet: held, never dead-lettered.
    let early = bodies("r", 0..100);
    publish_held(&broker, &p, &early, control.addr).await;
    assert_eq!(lens(&broker, &instances).await, 0);
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);

    control.register("workers", "w1", &w1, 60_000).await;
    let status = control.register("workers", "w2", &w2, 2_000).await;
    assert_eq!(registered(&status, "workers"), ["w1", "w2"]);
    // w2 renews its short lease until told to stop.
    let renewing = Arc::new(AtomicBool::new(true));
    let renewer = {
        let (control, renewing, w2) = (control.clone(), renewing.clone(), w2.clone());
        tokio::spawn(async move {
            while renewing.load(Ordering::Relaxed) {
                control.register("workers", "w2", &w2, 2_000).await;
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        })
    };
    let publisher = publish_steadily(&p, bodies("r", 100..2000), 40);
    wait_until("1,000 spread over w1 and w2", DEFAULT_TIMEOUT, || async {
        lens(&broker, &instances).await >= 1000
    })
    .await;
    let (w1_then, w2_then) = (broker.queue_len(&w1).await, broker.queue_len(&w2).await);
    assert!(
        w1_then >= 300 && w2_then >= 300,
        "round robin over both: {w1_then} / {w2_then}"
    );
    let status = control.unregister("workers", "w1").await;
    assert_eq!(registered(&status, "workers"), ["w2"]);
    let w1_at_leave = broker.queue_len(&w1).await;
    wait_until("w2 alone takes 500 more", DEFAULT_TIMEOUT, || async {
        broker.queue_len(&w2).await >= w2_then + 500
    })
    .await;
    publisher.await.unwrap_or_else(|e| panic!("publisher: {e}"));
    renewing.store(false, Ordering::Relaxed);
    renewer.await.unwrap_or_else(|e| panic!("renewer: {e}"));
    // Still publishing for 5 s, past the lease's end: what comes after it
    // waits for the newcomer.
    let publisher = publish_steadily(&p, bodies("r", 2000..3000), 10);
    control
        .status_until("w2's lease lapsed", |s| registered(s, "workers").is_empty())
        .await;
    let status = control.register("workers", "w3", &w3, 60_000).await;
    assert_eq!(registered(&status, "workers"), ["w3"]);
    publisher.await.unwrap_or_else(|e| panic!("publisher: {e}"));
    wait_until(
        "all 3,000 on one instance each and logged",
        DEFAULT_TIMEOUT * 2,
        || async {
            lens(&broker, &instances).await == 3000 && broker.queue_len(&logging).await == 3000
        },
    )
    .await;
    let w1_final = broker.queue_len(&w1).await;
    assert!(
        w1_final <= w1_at_leave + 500,
        "after leaving, w1 took only what was already in flight: {w1_at_leave} then {w1_final}"
    );
    assert!(
        broker.queue_len(&w3).await > 0,
        "the newcomer takes traffic"
    );
    let all: Vec<String> = early
        .iter()
        .cloned()
        .chain(bodies("r", 100..3000))
        .collect();
    let spread = support::tally_queues(&broker, &[w1, w2, w3]).await;
    exactly_once(&spread, &all, "workers");
    exactly_once(
        &support::tally_queues(&broker, &[logging]).await,
        &all,
        "logging",
    );
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    let m = metrics(control.addr).await;
    assert_eq!(
        m.value("switchyard_registrations", &[("branch", "workers")]),
        1.0
    );
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

/// A session whose first message finds the registrable branch without an
/// endpoint waits for a registration, for three times its idle timeout,
/// as independent messages do: nothing forwarded, nothing dead-lettered.
/// Once a service registers, the session reaches it and the logging
/// branch whole and in order, and the messages behind it follow.
#[tokio::test]
async fn a_session_waits_for_a_service_to_register() {
    let p = unique_prefix("ctlregses");
    let broker = TestBroker::connect(&p).await;
    let w1 = format!("{p}.w1");
    broker.declare_queue(&w1).await;
    let config = workers(&p).sessions(&[
        ("max_open", 4u32.into()),
        ("idle_timeout_ms", 1000u32.into()),
    ]);
    let (running, control) = start(&config, &broker, &p).await;
    let (inbound, logging, dlq) = (
        format!("{p}.in"),
        format!("{p}.logging"),
        format!("{p}.dlq"),
    );
    let session: Vec<_> = (0..3).map(|seq| in_session("s1", seq, seq == 2)).collect();
    publish_to(&broker, "", &inbound, &session).await;
    let behind = bodies("r", 0..10);
    publish_held(&broker, &p, &behind, control.addr).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(lens(&broker, &[&w1, &logging, &dlq]).await, 0, "held");

    control.register("workers", "w1", &w1, 60_000).await;
    broker.await_count(&w1, 13, DEFAULT_TIMEOUT).await;
    broker.await_count(&logging, 13, DEFAULT_TIMEOUT).await;
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    for queue in [&w1, &logging] {
        let got = broker.get_all(queue).await;
        assert_eq!(seqs(&by_session(&got)["s1"]), whole(3), "{queue}");
        let independent = got
            .iter()
            .filter(|m| m.header(ID).is_none())
            .map(|m| String::from_utf8_lossy(&m.body).into_owned());
        exactly_once(&tally(independent), &behind, queue);
    }
    assert_eq!(broker.queue_len(&dlq).await, 0, "nothing dead-lettered");
    assert_eq!(broker.queue_len(&inbound).await, 0, "every message acked");
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn a_reload_keeps_registrations_drains_and_a_pause() {
    let p = unique_prefix("ctlreload");
    let broker = TestBroker::connect(&p).await;
    let w1 = format!("{p}.w1");
    broker.declare_queue(&w1).await;
    let config = workers(&p);
    let (tx, rx) = mpsc::channel::<Reload>(2);
    let (listener, addr) = admin_listener();
    let options = Options {
        admin: Some(listener),
        reloads: Some(rx),
        ..Default::default()
    };
    let running = InProcess::start_with(&config.toml(), options);
    wait_consumers(&broker, &format!("{p}.in"), 1).await;
    let control = ControlClient::new(addr, TOKEN);
    control.register("workers", "w1", &w1, 60_000).await;
    control.drain("logging").await;
    control.pause().await;
    let before = control.status().await;

    let reloaded = config.clone().top("shutdown_timeout_ms", 6000).toml();
    tx.send(switchyard::config::load_str(&reloaded, "test.toml"))
        .await
        .unwrap_or_else(|e| panic!("send the reload: {e}"));
    let generation = before["generation"].as_u64().unwrap_or_default();
    let after = control
        .status_until("the reload is live", |s| {
            s["generation"].as_u64().unwrap_or_default() > generation
        })
        .await;
    assert_eq!(after["paused"], true, "{after}");
    assert_eq!(
        endpoint_state(&after, "logging").as_deref(),
        Some("drained")
    );
    assert_eq!(registered(&after, "workers"), ["w1"]);

    // Still paused: what arrives is held, unforwarded.
    let held = bodies("k", 0..10);
    broker
        .publish_many("", &format!("{p}.in"), held.iter(), Default::default())
        .await;
    wait_until(
        "the forwarder holds the ten unacked",
        DEFAULT_TIMEOUT,
        || async { support::ready_unacked(&format!("{p}.in")).await == Some((0, 10)) },
    )
    .await;
    assert_eq!(metrics(addr).await.value(CONSUMED, &[]), 0.0);
    assert_eq!(broker.queue_len(&w1).await, 0);
    control.undrain("logging").await;
    control.resume().await;
    wait_until("delivered after resume", DEFAULT_TIMEOUT, || async {
        broker.queue_len(&w1).await == 10 && broker.queue_len(&format!("{p}.logging")).await == 10
    })
    .await;
    exactly_once(&support::tally_queues(&broker, &[w1]).await, &held, "w1");
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn bad_requests_are_refused_with_a_reason_and_change_nothing() {
    let p = unique_prefix("ctlbad");
    let broker = TestBroker::connect(&p).await;
    let config = steerable(
        Forwarder::new(&p)
            .seed(&p)
            .branch(Branch::registrable("workers", "all").set("strategy", "round_robin")),
    )
    .admin_key("max_registrations", 2u32);
    let (running, control) = start(&config, &broker, &p).await;
    let before = control.status().await;

    // Authentication says nothing of what was wrong.
    let anonymous = http_send(control.addr, "GET", "/control/status", &[], b"")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let wrong = ControlClient::new(control.addr, "not-the-token")
        .send("POST", "/control/pause", None)
        .await;
    for response in [&anonymous, &wrong] {
        assert_eq!(response.status, 401, "{}", response.body);
        assert_eq!(json_of(response), json!({ "error": "unauthorized" }));
        assert_eq!(
            response.headers.get("www-authenticate").map(String::as_str),
            Some("Bearer")
        );
    }

    let register = |name: &str, body: Value| {
        let control = control.clone();
        let path = format!("/registry/workers/{name}");
        async move { control.send("PUT", &path, Some(&body)).await }
    };
    let good = |key: &str| json!({ "routing_key": key, "ttl_ms": 10_000 });
    let cases: Vec<(u16, support::HttpResponse, &str)> = vec![
        (
            404,
            control
                .send("POST", "/control/endpoints/nope/drain", None)
                .await,
            "unknown endpoint \"nope\"",
        ),
        (
            404,
            control
                .send("POST", "/control/endpoints/nope/undrain", None)
                .await,
            "unknown endpoint",
        ),
        (
            404,
            control
                .send("PUT", "/registry/nope/w1", Some(&good("q")))
                .await,
            "unknown branch \"nope\"",
        ),
        (
            409,
            control
                .send("PUT", "/registry/service/w1", Some(&good("q")))
                .await,
            "not registrable",
        ),
        (
            409,
            register("service_backup", good("q")).await,
            "configured endpoint",
        ),
        (
            400,
            register(
                "w1",
                json!({ "routing_key": "q", "ttl_ms": 10_000, "broker": "elsewhere" }),
            )
            .await,
            "unknown broker \"elsewhere\"",
        ),
        (
            400,
            register("w1", good(&"k".repeat(256))).await,
            "routing_key",
        ),
        (
            400,
            register("w1", json!({ "routing_key": "q", "ttl_ms": 999 })).await,
            "ttl_ms 999",
        ),
        (
            400,
            register("w1", json!({ "routing_key": "q", "ttl_ms": 3_600_001 })).await,
            "ttl_ms 3600001",
        ),
        (
            400,
            register(
                "w1",
                json!({ "routing_key": "q", "ttl_ms": 10_000, "weight": 3 }),
            )
            .await,
            "unknown field",
        ),
        (
            404,
            control.send("DELETE", "/registry/workers/w9", None).await,
            "no instance \"w9\"",
        ),
        (
            405,
            control.send("GET", "/control/pause", None).await,
            "method",
        ),
        (
            404,
            control.send("GET", "/control/nothing", None).await,
            "not found",
        ),
    ];
    for (status, response, says) in &cases {
        assert_eq!(response.status, *status, "{}", response.body);
        let error = json_of(response)["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            error.contains(says),
            "{status}: {error:?} should say {says:?}"
        );
    }
    let auth = format!("Bearer {TOKEN}");
    let headers = [("Authorization", auth.as_str())];
    let not_json = http_send(
        control.addr,
        "PUT",
        "/registry/workers/w1",
        &headers,
        b"routing_key=q",
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(not_json.status, 400, "{}", not_json.body);
    let huge = vec![b' '; 17 * 1024];
    let too_large = http_send(control.addr, "PUT", "/registry/workers/w1", &headers, &huge)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(too_large.status, 413, "{}", too_large.body);

    // Nothing changed by any of them.
    let unchanged = control.status().await;
    for key in [
        "paused",
        "registrations",
        "generation",
        "offset",
        "endpoints",
    ] {
        assert_eq!(unchanged[key], before[key], "{key}");
    }

    // Two registrations fit, a third is too many; a renewal is not one more.
    register("w1", good(&format!("{p}.w1"))).await;
    register("w2", good(&format!("{p}.w2"))).await;
    let third = register("w3", good(&format!("{p}.w3"))).await;
    assert_eq!(third.status, 429, "{}", third.body);
    assert!(third.body.contains("max_registrations"), "{}", third.body);
    assert_eq!(register("w1", good(&format!("{p}.w1"))).await.status, 200);
    assert_eq!(registered(&control.status().await, "workers"), ["w1", "w2"]);
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn without_tokens_every_control_path_answers_403() {
    let p = unique_prefix("ctlnotok");
    let broker = TestBroker::connect(&p).await;
    let open = Forwarder::new(&p).match_all(&p).admin("127.0.0.1:0");
    let (running, control) = start(&open, &broker, &p).await;
    for (method, path) in [
        ("GET", "/control/status"),
        ("POST", "/control/pause"),
        ("POST", "/control/endpoints/service/drain"),
        ("PUT", "/registry/service/w1"),
        ("DELETE", "/registry/service/w1"),
    ] {
        let response = control.send(method, path, None).await;
        assert_eq!(response.status, 403, "{method} {path}: {}", response.body);
        assert!(response.body.contains("admin.tokens"), "{}", response.body);
    }
    let health = http_get(control.addr, "/healthz")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(health.status, 200);
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_status_requests_and_renewals_never_stops_forwarding() {
    let p = unique_prefix("ctlflood");
    let broker = TestBroker::connect(&p).await;
    let w1 = format!("{p}.w1");
    broker.declare_queue(&w1).await;
    let (running, control) = start(&workers(&p), &broker, &p).await;
    control.register("workers", "w1", &w1, 60_000).await;
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let flood: Vec<_> = (0..64)
        .map(|i| {
            let (control, stop, answered, w1) =
                (control.clone(), stop.clone(), answered.clone(), w1.clone());
            tokio::spawn(async move {
                let renewal = json!({ "routing_key": w1, "ttl_ms": 60_000 }).to_string();
                let auth = format!("Bearer {}", control.token);
                let headers = [("Authorization", auth.as_str())];
                while !stop.load(Ordering::Relaxed) {
                    // Shed connections fail; only answers are counted.
                    let response = match i % 2 {
                        0 => http_send(control.addr, "GET", "/control/status", &headers, b"").await,
                        _ => {
                            let path = "/registry/workers/w1";
                            http_send(control.addr, "PUT", path, &headers, renewal.as_bytes()).await
                        }
                    };
                    if matches!(response, Ok(ref r) if r.status == 200) {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let all = bodies("f", 0..2000);
    broker
        .publish_many("", &format!("{p}.in"), all.iter(), Default::default())
        .await;
    wait_until(
        "2,000 forwarded through the flood",
        DEFAULT_TIMEOUT,
        || async {
            broker.queue_len(&w1).await == 2000
                && broker.queue_len(&format!("{p}.logging")).await == 2000
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in flood {
        task.await.unwrap_or_else(|e| panic!("flood task: {e}"));
    }
    assert!(
        answered.load(Ordering::Relaxed) > 0,
        "the flood was served too"
    );
    exactly_once(&support::tally_queues(&broker, &[w1]).await, &all, "w1");
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

/// A pause three times longer than `sessions.idle_timeout_ms` does not time
/// out a session it interrupts: the session's clock stops while paused, and
/// once resumed it completes whole and in order on both branches.
#[tokio::test]
async fn a_pause_longer_than_the_idle_timeout_keeps_an_open_session() {
    let p = unique_prefix("ctlsession");
    let broker = TestBroker::connect(&p).await;
    let config = steerable(Forwarder::new(&p).seed(&p)).sessions(&[
        ("max_open", 4u32.into()),
        ("idle_timeout_ms", 2000u32.into()),
    ]);
    let (running, control) = start(&config, &broker, &p).await;
    let (inbound, service, logging, dlq) = (
        format!("{p}.in"),
        format!("{p}.service"),
        format!("{p}.logging"),
        format!("{p}.dlq"),
    );
    let message = |seq, end| in_session("s1", seq, end);
    publish_to(
        &broker,
        "",
        &inbound,
        &[message(0, false), message(1, false)],
    )
    .await;
    broker.await_count(&logging, 2, DEFAULT_TIMEOUT).await;
    let status = control.pause().await;
    assert_eq!(status["paused"], true, "{status}");
    publish_to(
        &broker,
        "",
        &inbound,
        &[message(2, false), message(3, true)],
    )
    .await;
    // Held three idle timeouts: unpaused, the session would have ended
    // `session-timeout` after the first.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        broker.queue_len(&dlq).await,
        0,
        "nothing timed out while paused"
    );
    assert_eq!(
        broker.queue_len(&logging).await,
        2,
        "nothing forwarded while paused"
    );

    let status = control.resume().await;
    assert_eq!(status["paused"], false, "{status}");
    broker.await_count(&logging, 4, DEFAULT_TIMEOUT).await;
    broker.await_count(&service, 4, DEFAULT_TIMEOUT).await;
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    for queue in [&service, &logging] {
        let got = broker.get_all(queue).await;
        let sets = by_session(&got);
        assert_eq!(sets.len(), 1, "{queue}: one session");
        assert_eq!(seqs(&sets["s1"]), whole(4), "{queue}: whole and in order");
    }
    assert_eq!(broker.queue_len(&dlq).await, 0, "nothing dead-lettered");
    assert_eq!(broker.queue_len(&inbound).await, 0, "every message acked");
    delete_all_with_prefix(&p).await;
}

/// A broker that refuses the control stream (the forwarder's user may not
/// configure it) is logged as an error saying what to grant, and the
/// instance takes no work while it cannot read the group's state; once
/// granted, it recovers and forwards what waited.
#[tokio::test]
async fn a_refused_control_stream_is_named_and_no_work_is_taken_until_it_is_granted() {
    let p = unique_prefix("ctlrefused");
    let vhost = TestVhost::create(&p).await;
    // Everything but the control stream.
    let allowed = format!("^(?!{}\\.control$).*", p);
    vhost.set_permissions(&allowed, &allowed, &allowed).await;
    let toml = Forwarder::at(&vhost.user_url(), &p).seed(&p).toml();
    let forwarder = Process::spawn(&p, &toml);
    let broker = TestBroker::connect_to(&vhost.guest_url(), &format!("{p}-test")).await;
    let (inbound, service) = (format!("{p}.in"), format!("{p}.service"));
    wait_until("the inbound queue is declared", DEFAULT_TIMEOUT, || async {
        broker.try_queue_len(&inbound).await.is_some()
    })
    .await;
    broker
        .publish("", &inbound, b"waits", Default::default())
        .await;
    wait_until("the refusal is logged", DEFAULT_TIMEOUT, || async {
        forwarder.log().contains(
            "the broker refuses the control stream: grant the forwarder's user configure, \
             write and read on it",
        )
    })
    .await;
    assert_eq!(broker.queue_len(&inbound).await, 1, "no work taken");
    assert_eq!(
        consumer_count(&broker, &inbound).await,
        Some(0),
        "not consuming"
    );

    vhost.grant_all().await;
    broker.await_count(&service, 1, DEFAULT_TIMEOUT).await;
    assert!(
        forwarder
            .log()
            .contains("group state recovered from the control stream")
    );
    drop(forwarder);
    broker.close().await;
    vhost.delete().await;
}

#[test]
fn the_checks_of_this_file_count_what_they_claim() {
    // `exactly_once` itself fails on a loss, a duplicate and a stranger.
    let expected = bodies("x", 0..3);
    let tallied = |items: &[&str]| tally(items.iter().map(|s| (*s).to_owned()));
    for bad in [
        &["x0", "x1"][..],
        &["x0", "x1", "x2", "x2"],
        &["x0", "x1", "x2", "y"],
    ] {
        let got = tallied(bad);
        let caught = std::panic::catch_unwind(|| exactly_once(&got, &expected, "t"));
        assert!(caught.is_err(), "{bad:?} passed");
    }
    exactly_once(&tallied(&["x0", "x1", "x2"]), &expected, "t");
}
