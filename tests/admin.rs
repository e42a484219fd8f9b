//! The admin endpoint over real HTTP against a forwarder on the real broker:
//! `/healthz`, `/readyz` following the consumer and endpoint health,
//! `/metrics` in the Prometheus text format with every documented metric
//! moving as messages are forwarded, fail over and are dead-lettered. Each
//! forwarder has its own metrics, so the counts are exact even with other
//! tests' forwarders running in this process. A second instance on the
//! first one's admin port is told what to change. Idle connections to the
//! admin port are bounded and closed, and forwarding goes on meanwhile.

use crate::support;

use lapin::BasicProperties;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::{InProcess, Process, wait_consumers};
use support::{
    BlackHole, DEFAULT_TIMEOUT, FaultProxy, HttpResponse, Message, Metrics, TestBroker,
    admin_listener, amqp_addr, amqp_str, delete_all_with_prefix, field_table, http_get,
    http_request, tally, unique_prefix, wait_for, wait_until,
};
use switchyard::Options;

async fn get(addr: SocketAddr, path: &str) -> HttpResponse {
    http_get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

async fn metrics(addr: SocketAddr) -> Metrics {
    let response = get(addr, "/metrics").await;
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(
        response.headers.get("content-type").map(String::as_str),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    Metrics::parse(&response.body)
}

/// Waits until `/metrics` satisfies `cond`; returns that page.
async fn metrics_until(addr: SocketAddr, what: &str, cond: impl Fn(&Metrics) -> bool) -> Metrics {
    wait_for(what, DEFAULT_TIMEOUT, || async {
        let m = metrics(addr).await;
        cond(&m).then_some(m)
    })
    .await
}

async fn wait_ready(addr: SocketAddr, status: u16) -> HttpResponse {
    wait_for(
        &format!("/readyz answers {status}"),
        DEFAULT_TIMEOUT,
        || async {
            let r = get(addr, "/readyz").await;
            (r.status == status).then_some(r)
        },
    )
    .await
}

fn once(bodies: impl IntoIterator<Item = String>) -> BTreeMap<String, usize> {
    bodies.into_iter().map(|b| (b, 1)).collect()
}

const FORWARDED: &str = "switchyard_messages_forwarded_total";
const FAILOVERS: &str = "switchyard_failovers_total";
const DEAD: &str = "switchyard_dead_lettered_total";
const UP: &str = "switchyard_endpoint_up";

/// Branch "service": `primary` (broker "flaky", behind a fault proxy) then
/// `backup` (broker "main"); branch "audit": only `audit` on "flaky".
/// Messages with header kind = stray match nothing.
fn two_branches(p: &str, flaky_uri: &str) -> String {
    let probed = |name: &str, queue: &str| {
        Endpoint::queue(name, &format!("{p}.{queue}"))
            .on("flaky")
            .set("probe_interval_ms", 200)
    };
    Forwarder::new(p)
        .broker("flaky", flaky_uri)
        .endpoint(probed("primary", "service"))
        .endpoint(Endpoint::queue("backup", &format!("{p}.service.backup")))
        .endpoint(probed("audit", "audit"))
        .backup_list("service_backups", &["backup"])
        .filter("stray", Filter::header("kind").set("equals", "stray"))
        .filter("routed", Filter::not("stray"))
        .branch(Branch::new("service", "routed", "primary").backups("service_backups"))
        // An outage dead-letters this branch's messages rather than
        // holding them (the default), so the test sees an exhausted list.
        .branch(Branch::new("audit", "routed", "audit").set("outage", "dead_letter"))
        .toml()
}

#[tokio::test]
async fn the_admin_endpoint_follows_forwarding_failover_dead_letters_and_health() {
    let p = unique_prefix("admin");
    let broker = TestBroker::connect(&p).await;
    let proxy = FaultProxy::start(amqp_addr()).await;
    let (listener, addr) = admin_listener();
    let inbound = format!("{p}.in");
    let (service, backup, audit, dlq) = (
        format!("{p}.service"),
        format!("{p}.service.backup"),
        format!("{p}.audit"),
        format!("{p}.dlq"),
    );
    let options = Options {
        admin: Some(listener),
        ..Default::default()
    };
    let forwarder = InProcess::start_with(&two_branches(&p, &proxy.amqp_url()), options);

    let health = get(addr, "/healthz").await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    let ready = wait_ready(addr, 200).await;
    assert_eq!(ready.body, "ready\n");
    assert_eq!(get(addr, "/nowhere").await.status, 404);
    assert_eq!(
        http_request(addr, "POST", "/metrics")
            .await
            .unwrap_or_else(|e| panic!("POST: {e}"))
            .status,
        405
    );
    let fresh = metrics(addr).await;
    for name in [
        "switchyard_messages_consumed",
        "switchyard_messages_forwarded",
        "switchyard_failovers",
        "switchyard_dead_lettered",
    ] {
        let family = format!("{name}_total");
        assert_eq!(
            fresh.types.get(&family).map(String::as_str),
            Some("counter"),
            "{family}"
        );
    }
    assert_eq!(
        fresh
            .types
            .get("switchyard_confirm_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    for gauge in [
        "switchyard_in_flight",
        "switchyard_sessions_open",
        UP,
        "switchyard_config_generation",
    ] {
        assert_eq!(
            fresh.types.get(gauge).map(String::as_str),
            Some("gauge"),
            "{gauge}"
        );
    }
    assert_eq!(fresh.get("switchyard_config_generation", &[]), Some(1.0));
    assert_eq!(fresh.get("switchyard_sessions_open", &[]), Some(0.0));
    assert_eq!(
        fresh.get(FORWARDED, &[("branch", "service"), ("endpoint", "backup")]),
        Some(0.0),
        "series start at zero"
    );
    assert_eq!(fresh.get(DEAD, &[("reason", "no-route")]), Some(0.0));

    // Healthy: ten messages, each forwarded on both branches.
    let first: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
    broker
        .publish_many("", &inbound, first.iter(), BasicProperties::default())
        .await;
    let m = metrics_until(addr, "ten messages forwarded on both branches", |m| {
        m.value(FORWARDED, &[("branch", "service"), ("endpoint", "primary")]) == 10.0
            && m.value(FORWARDED, &[("branch", "audit"), ("endpoint", "audit")]) == 10.0
            && m.value("switchyard_in_flight", &[]) == 0.0
    })
    .await;
    assert_eq!(m.get("switchyard_messages_consumed_total", &[]), Some(10.0));
    assert!(m.value("switchyard_confirm_seconds_count", &[]) >= 20.0);
    assert_eq!(
        m.get("switchyard_confirm_seconds_bucket", &[("le", "+Inf")]),
        m.get("switchyard_confirm_seconds_count", &[])
    );
    assert!(m.value("switchyard_confirm_seconds_sum", &[]) > 0.0);
    assert_eq!(m.get(UP, &[("endpoint", "primary")]), Some(1.0));
    assert_eq!(m.get(UP, &[("endpoint", "audit")]), Some(1.0));
    assert_eq!(m.sum(FAILOVERS), 0.0);
    assert_eq!(m.sum(DEAD), 0.0);

    // The flaky broker goes away: service fails over, audit is exhausted.
    proxy.refuse(true);
    proxy.cut();
    let outage: Vec<String> = (0..5).map(|i| format!("f{i}")).collect();
    broker
        .publish_many("", &inbound, outage.iter(), BasicProperties::default())
        .await;
    broker.await_count(&backup, 5, DEFAULT_TIMEOUT).await;
    broker.await_count(&dlq, 5, DEFAULT_TIMEOUT).await;
    let m = metrics_until(addr, "five dead letters and both endpoints down", |m| {
        m.value(DEAD, &[("reason", "outage")]) == 5.0
            && m.value(UP, &[("endpoint", "primary")]) == 0.0
            && m.value(UP, &[("endpoint", "audit")]) == 0.0
    })
    .await;
    let failovers = m.value(
        FAILOVERS,
        &[("branch", "service"), ("from", "primary"), ("to", "backup")],
    );
    assert!(
        (1.0..=5.0).contains(&failovers),
        "the first copies after the cut fail over, later ones skip the down primary: {failovers}"
    );
    assert_eq!(
        m.sum(FAILOVERS),
        failovers,
        "an exhausted list is no failover"
    );
    assert_eq!(
        m.get(FORWARDED, &[("branch", "service"), ("endpoint", "backup")]),
        Some(5.0)
    );
    assert_eq!(m.get(UP, &[("endpoint", "backup")]), Some(1.0));
    let not_ready = wait_ready(addr, 503).await;
    assert!(
        not_ready
            .body
            .contains("branch audit has no endpoint up (audit)")
            && !not_ready.body.contains("branch service"),
        "{}",
        not_ready.body
    );
    assert_eq!(get(addr, "/healthz").await.status, 200);

    // It comes back: probes find both endpoints up, traffic returns.
    proxy.refuse(false);
    wait_ready(addr, 200).await;
    metrics_until(addr, "both endpoints up again", |m| {
        m.value(UP, &[("endpoint", "primary")]) == 1.0
            && m.value(UP, &[("endpoint", "audit")]) == 1.0
    })
    .await;
    let stray = BasicProperties::default().with_headers(field_table([("kind", amqp_str("stray"))]));
    broker.publish("", &inbound, b"stray", stray).await;
    let last: Vec<String> = (0..3).map(|i| format!("g{i}")).collect();
    broker
        .publish_many("", &inbound, last.iter(), BasicProperties::default())
        .await;
    let m = metrics_until(addr, "the last messages counted", |m| {
        m.value(FORWARDED, &[("branch", "service"), ("endpoint", "primary")]) == 13.0
            && m.value(FORWARDED, &[("branch", "audit"), ("endpoint", "audit")]) == 13.0
            && m.value(DEAD, &[("reason", "no-route")]) == 1.0
            && m.value("switchyard_in_flight", &[]) == 0.0
    })
    .await;
    assert_eq!(m.get("switchyard_messages_consumed_total", &[]), Some(19.0));
    assert_eq!(m.get(DEAD, &[("reason", "outage")]), Some(5.0));
    assert!(m.value("switchyard_confirm_seconds_count", &[]) >= 31.0);

    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        http_get(addr, "/healthz").await.is_err(),
        "the admin endpoint stops with the forwarder"
    );

    let normal: Vec<String> = first.iter().chain(&last).cloned().collect();
    assert_eq!(tally(&broker.get_all(&service).await), once(normal.clone()));
    assert_eq!(tally(&broker.get_all(&backup).await), once(outage.clone()));
    assert_eq!(tally(&broker.get_all(&audit).await), once(normal));
    let dead = once(outage.into_iter().chain(["stray".to_owned()]));
    assert_eq!(tally(&broker.get_all(&dlq).await), dead);
    assert_eq!(broker.queue_len(&inbound).await, 0);
    delete_all_with_prefix(&p).await;
}

/// While the inbound broker cannot be reached the process is alive but not
/// ready, and nothing is counted; stopping it stops the admin endpoint.
#[tokio::test]
async fn not_ready_until_consuming() {
    let p = unique_prefix("admin-unready");
    let hole = BlackHole::start().await;
    let (listener, addr) = admin_listener();
    let toml = Forwarder::at(&hole.amqp_url(), &p)
        .endpoint(Endpoint::queue("out", &format!("{p}.out")).undeclared())
        .filter("all", Filter::match_all())
        .branch(Branch::new("out", "all", "out"))
        .toml();
    let options = Options {
        admin: Some(listener),
        ..Default::default()
    };
    let forwarder = InProcess::start_with(&toml, options);
    wait_until(
        "the forwarder tried the broker",
        DEFAULT_TIMEOUT,
        || async { hole.accepted() >= 1 },
    )
    .await;
    assert_eq!(get(addr, "/healthz").await.status, 200);
    let ready = get(addr, "/readyz").await;
    assert_eq!(ready.status, 503);
    assert_eq!(
        ready.body,
        "not ready: not consuming from the inbound queue\n"
    );
    let m = metrics(addr).await;
    assert_eq!(m.get("switchyard_messages_consumed_total", &[]), Some(0.0));
    assert_eq!(m.get("switchyard_config_generation", &[]), Some(0.0));
    tokio::time::timeout(Duration::from_secs(15), forwarder.stop())
        .await
        .unwrap_or_else(|_| panic!("stops while the broker is unreachable"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(http_get(addr, "/healthz").await.is_err());
}

/// A free loopback port, released for the process that will listen on it.
fn free_port() -> u16 {
    admin_listener().1.port()
}

/// A second instance on the same host and configuration cannot take the
/// first one's admin port: it exits 1 with a line that says what to
/// change. Following that advice (and the operations guide's), both run
/// side by side as competing consumers, each message forwarded once.
#[tokio::test]
async fn a_second_instance_is_told_how_to_share_the_host() {
    let p = unique_prefix("second-instance");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let port = free_port();
    let toml = Forwarder::new(&p)
        .seed(&p)
        .admin(&format!("127.0.0.1:{port}"))
        .toml();
    let first = Process::spawn(&format!("{p}-a"), &toml);
    wait_consumers(&broker, &inbound, 1).await;

    let mut second = Process::spawn(&format!("{p}-b"), &toml);
    assert_eq!(second.wait_exit(DEFAULT_TIMEOUT).await, Some(1));
    let log = second.log();
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!(
            "switchyard: admin.listen 127.0.0.1:{port}: cannot listen: Address already in use"
        )) && last.contains("SWITCHYARD__ADMIN__LISTEN"),
        "{log}"
    );

    let other_port = free_port().to_string();
    let listen = format!("127.0.0.1:{other_port}");
    let name = format!("{p}-b");
    let second = Process::spawn_with(
        &format!("{p}-c"),
        &toml,
        &[],
        &[
            ("SWITCHYARD__NAME", name.as_str()),
            ("SWITCHYARD__ADMIN__LISTEN", listen.as_str()),
        ],
    );
    wait_consumers(&broker, &inbound, 2).await;
    for addr in [port.to_string(), other_port] {
        let addr: SocketAddr = format!("127.0.0.1:{addr}")
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(get(addr, "/healthz").await.status, 200);
    }
    let bodies: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    broker
        .publish_many("", &inbound, bodies.iter(), BasicProperties::default())
        .await;
    for queue in ["service", "logging"] {
        let queue = format!("{p}.{queue}");
        broker.await_count(&queue, 40, DEFAULT_TIMEOUT).await;
        let mut got: Vec<String> = broker
            .get_all(&queue)
            .await
            .iter()
            .map(Message::body_str)
            .collect();
        got.sort();
        let mut want = bodies.clone();
        want.sort();
        assert_eq!(got, want, "{queue}: each message once");
    }
    drop((first, second));
    delete_all_with_prefix(&p).await;
}

/// Open descriptors of process `pid`.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Anyone who can reach the admin port holds it only so far: 100
/// connections that send nothing hold none of its 32 slots (`/healthz`
/// answers within a second while they are open), cost the real binary a
/// descriptor each and no more, are each closed within the header timeout,
/// and forwarding goes on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_the_admin_port_are_bounded_and_forwarding_goes_on() {
    const IDLE: usize = 100;
    let p = unique_prefix("admin-idle");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}")
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    let toml = Forwarder::new(&p).seed(&p).admin(&addr.to_string()).toml();
    let forwarder = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;
    assert_eq!(get(addr, "/healthz").await.status, 200);
    let before = open_files(forwarder.pid());

    let mut idle = Vec::new();
    for _ in 0..IDLE {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => idle.push(stream),
            Err(e) => panic!("connect to the admin port: {e}"),
        }
    }
    let bodies: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    broker
        .publish_many("", &inbound, bodies.iter(), BasicProperties::default())
        .await;
    for queue in ["service", "logging"] {
        broker
            .await_count(&format!("{p}.{queue}"), 20, DEFAULT_TIMEOUT)
            .await;
    }
    let most = std::sync::atomic::AtomicUsize::new(0);
    let pid = forwarder.pid();
    for _ in 0..5 {
        most.fetch_max(open_files(pid), std::sync::atomic::Ordering::Relaxed);
        let answered =
            tokio::time::timeout(Duration::from_secs(1), http_get(addr, "/healthz")).await;
        assert!(
            matches!(&answered, Ok(Ok(r)) if r.status == 200),
            "/healthz beside {IDLE} idle connections: {answered:?}"
        );
    }
    let most = most.into_inner();
    assert!(
        most <= before + IDLE + 4,
        "open descriptors {most}, {before} before the idle connections"
    );
    // Every idle connection was closed by the forwarder: each reads EOF.
    for stream in &mut idle {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::io::AsyncReadExt::read(stream, &mut byte),
        )
        .await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "an idle connection is closed: {read:?}"
        );
    }
    let mut forwarder = forwarder;
    forwarder.signal("TERM");
    assert_eq!(forwarder.wait_exit(DEFAULT_TIMEOUT).await, Some(0));
    delete_all_with_prefix(&p).await;
}
