//! Nothing a producer can send steers the group or writes its history.
//!
//! The forwarder runs as a user of its own on a vhost of the test's own;
//! `guest`, with every permission there, plays a producer that may publish
//! to `amq.default` and so to both streams. Its pause, registration and
//! journal record are ignored and counted, and the broker refuses it the
//! forwarder's `user_id`; the forwarder's own commands still apply. A
//! record the forwarder's own user writes but no request could have made
//! (a lease of eleven days, a routing key into the inbound queue, a name
//! that rewrites a terminal) is refused as it is read. Registrations obey
//! the file's rules (no loop, no control characters, the limit held under
//! 300 concurrent requests, the true count named), and one that leaves
//! takes its drain and its metric series with it. Log lines escape what a
//! broker echoes back.

use crate::support;

use lapin::BasicProperties;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::control::{ControlClient, registered};
use support::harness::{InProcess, Process, log_tail, wait_consumers};
use support::vhost::TestVhost;
use support::{
    DEFAULT_TIMEOUT, Metrics, TestBroker, admin_listener, delete_all_with_prefix, http_get,
    unique_prefix, wait_for, wait_until,
};
use switchyard::Options;

const TOKEN: &str = "trust-token";
const IGNORED: &str = "switchyard_control_records_ignored_total";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The seed's two branches, and "workers", registrable, with an endpoint
/// of its own (so messages flow before anyone registers); the admin
/// endpoint takes commands with [`TOKEN`].
fn group(url: &str, p: &str) -> Forwarder {
    Forwarder::at(url, p)
        .seed(p)
        .endpoint(Endpoint::queue("w0", &format!("{p}.w0")))
        .branch(Branch::new("workers", "all", "w0").set("registrable", true))
        .admin("127.0.0.1:0")
        .admin_key("tokens", [TOKEN])
}

async fn start(config: &Forwarder) -> (InProcess, ControlClient) {
    let (listener, addr) = admin_listener();
    let options = Options {
        admin: Some(listener),
        ..Default::default()
    };
    let running = InProcess::start_with(&config.toml(), options);
    let control = ControlClient::new(addr, TOKEN);
    control.recovered().await;
    (running, control)
}

async fn metrics(addr: SocketAddr) -> Metrics {
    let r = http_get(addr, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    Metrics::parse(&r.body)
}

async fn ignored_until(addr: SocketAddr, why: &str, n: f64) -> Metrics {
    wait_for(
        &format!("{n} control records ignored ({why})"),
        DEFAULT_TIMEOUT,
        || async {
            let m = metrics(addr).await;
            (m.value(IGNORED, &[("why", why)]) >= n).then_some(m)
        },
    )
    .await
}

/// A control record as the forwarder writes one, saying `body`.
fn record(group: &str, instance: &str, body: Value) -> Vec<u8> {
    let mut record = json!({
        "group": group,
        "instance": instance,
        "id": uuid::Uuid::new_v4().to_string(),
        "at_ms": now_ms(),
    });
    for (k, v) in body.as_object().into_iter().flatten() {
        record[k] = v.clone();
    }
    record.to_string().into_bytes()
}

fn registration(name: &str, routing_key: &str, ttl_ms: u64) -> Value {
    json!({
        "kind": "register",
        "branch": "workers",
        "name": name,
        "broker": "main",
        "exchange": "",
        "routing_key": routing_key,
        "ttl_ms": ttl_ms,
        "expires_at_ms": now_ms() + ttl_ms,
    })
}

/// Publishes `body` to `stream` through the default exchange, with
/// `user_id` when given; whether the broker confirmed it.
async fn append(broker: &TestBroker, stream: &str, body: &[u8], user_id: Option<&str>) -> bool {
    let mut props = BasicProperties::default().with_delivery_mode(2);
    if let Some(user) = user_id {
        props = props.with_user_id(user.into());
    }
    let channel = broker.fresh_channel().await;
    channel
        .confirm_select(Default::default())
        .await
        .unwrap_or_else(|e| panic!("confirm.select: {e}"));
    let publish = channel
        .basic_publish(
            "".into(),
            stream.into(),
            lapin::options::BasicPublishOptions::default(),
            body,
            props,
        )
        .await;
    let confirmed = match publish {
        Ok(confirm) => matches!(confirm.await, Ok(c) if c.is_ack()),
        Err(_) => false,
    };
    let _ = channel.close(200, "done".into()).await;
    confirmed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_records_are_ignored_and_counted_and_the_groups_own_apply() {
    let p = unique_prefix("trust-forged");
    let vhost = TestVhost::create(&p).await;
    let config = group(&vhost.user_url(), &p);
    let (running, control) = start(&config).await;
    let producer = TestBroker::connect_to(&vhost.guest_url(), &format!("{p}-producer")).await;
    let stream = format!("{p}.control");

    // A producer with write on amq.default: without a user_id, and as itself.
    let pause = record(&p, "attacker", json!({ "kind": "pause" }));
    let register = record(&p, "attacker", registration("evil", "w.evil", 60_000));
    assert!(append(&producer, &stream, &pause, None).await);
    assert!(append(&producer, &stream, &register, None).await);
    assert!(append(&producer, &stream, &pause, Some("guest")).await);
    // Claiming the forwarder's user is the broker's to refuse.
    assert!(
        !append(&producer, &stream, &pause, Some(&vhost.user)).await,
        "the broker let guest publish as the forwarder's user"
    );
    let m = ignored_until(control.addr, "writer", 3.0).await;
    assert_eq!(m.value(IGNORED, &[("why", "refused")]), 0.0);
    let status = control.status().await;
    assert_eq!(status["paused"], false, "{status}");
    assert!(registered(&status, "workers").is_empty(), "{status}");
    assert_eq!(m.get("switchyard_paused", &[]), Some(0.0));

    // A forged journal record is not the group's history.
    let forged_id = format!("{p}-forged");
    let forged = json!({
        "v": 1, "message_id": forged_id, "instance": "attacker", "source": "queue",
        "verdict": "acked", "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "received_at": "2026-12-08T00:00:00Z", "settled_at": "2026-12-08T00:00:01Z",
        "branches": []
    });
    let journal = format!("{p}.journal");
    wait_until("the journal stream exists", DEFAULT_TIMEOUT, || async {
        producer.try_queue_len(&journal).await.is_some()
    })
    .await;
    assert!(append(&producer, &journal, format!("{forged}\n").as_bytes(), None).await);

    // The group's own commands and records still apply.
    let paused = control.pause().await;
    assert_eq!(paused["paused"], true, "{paused}");
    control.resume().await;
    let with_w1 = control
        .register("workers", "w1", &format!("{p}.w1"), 60_000)
        .await;
    assert_eq!(registered(&with_w1, "workers"), ["w1"]);
    let inbound = format!("{p}.in");
    producer
        .publish(
            "",
            &inbound,
            b"real",
            BasicProperties::default().with_message_id(format!("{p}-real").into()),
        )
        .await;
    producer
        .await_count(&format!("{p}.logging"), 1, DEFAULT_TIMEOUT)
        .await;
    let toml = config.toml();
    let real = support::journal::records(&toml, &format!("{p}-real"), 1).await;
    assert_eq!(real.len(), 1);
    let traced = support::journal::trace(&toml, &forged_id, &[]).await;
    assert_eq!(traced.code, Some(3), "{}", traced.stderr);
    assert!(
        traced.stderr.contains("ignored 1 line(s)") && !traced.stdout.contains("attacker"),
        "{}",
        traced.stderr
    );
    let m = metrics(control.addr).await;
    assert_eq!(
        m.value(IGNORED, &[("why", "writer")]),
        3.0,
        "no more ignored"
    );

    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
    producer.close().await;
    vhost.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_no_request_could_make_is_refused_even_from_the_groups_user() {
    let p = unique_prefix("trust-rules");
    let vhost = TestVhost::create(&p).await;
    let config = group(&vhost.user_url(), &p);
    let (running, control) = start(&config).await;
    let own = TestBroker::connect_to(&vhost.user_url(), &format!("{p}-own")).await;
    let stream = format!("{p}.control");
    let user = Some(vhost.user.as_str());
    let mut long_lease = registration("eleven-days", "w.long", 999_999_999);
    long_lease["expires_at_ms"] = json!(now_ms() + 999_999_999);
    let forged = [
        long_lease,
        registration("looping", &format!("{p}.in"), 60_000),
        registration("x\u{1b}[2J\u{202e}", "w.x", 60_000),
        registration("w.unknown-broker", "w.u", 60_000),
        json!({ "kind": "drain", "endpoint": "no-such-endpoint" }),
    ];
    let mut unknown_broker = forged[3].clone();
    unknown_broker["broker"] = json!("elsewhere");
    let forged: Vec<Value> = forged
        .iter()
        .enumerate()
        .map(|(i, f)| {
            if i == 3 {
                unknown_broker.clone()
            } else {
                f.clone()
            }
        })
        .collect();
    for body in &forged {
        assert!(append(&own, &stream, &record(&p, "buggy", body.clone()), user).await);
    }
    ignored_until(control.addr, "refused", forged.len() as f64).await;
    let status = control.status().await;
    assert!(registered(&status, "workers").is_empty(), "{status}");
    assert!(
        status["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|e| e["state"] != "drained"),
        "{status}"
    );
    // The same user writing what a request could have made: applied.
    let fine = registration("w2", &format!("{p}.w2"), 60_000);
    assert!(append(&own, &stream, &record(&p, "buggy", fine), user).await);
    control
        .status_until("w2 registered", |s| registered(s, "workers") == ["w2"])
        .await;
    let m = metrics(control.addr).await;
    assert_eq!(m.value(IGNORED, &[("why", "refused")]), forged.len() as f64);
    assert_eq!(m.value(IGNORED, &[("why", "writer")]), 0.0);

    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
    own.close().await;
    vhost.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_obey_the_rules_of_the_file() {
    let p = unique_prefix("trust-register");
    let broker = TestBroker::connect(&p).await;
    let config = group(&support::amqp_url(), &p);
    let (running, control) = start(&config).await;
    let put = |name: &str, body: Value| {
        let control = control.clone();
        let path = format!("/registry/workers/{name}");
        async move { control.send("PUT", &path, Some(&body)).await }
    };
    let looping = put(
        "w-loop",
        json!({ "routing_key": format!("{p}.in"), "ttl_ms": 60_000 }),
    )
    .await;
    assert_eq!(looping.status, 409, "{}", looping.body);
    assert!(
        looping.body.contains(&format!(
            "publishing to \\\"{p}.in\\\" through the default exchange of broker \\\"main\\\", the \
             inbound's broker, would route every copy back into the inbound queue (a forwarding \
             loop)"
        )),
        "{}",
        looping.body
    );
    for (key, value) in [
        ("routing_key", "w.\u{1b}[2J"),
        ("routing_key", "w.\n2026-12-08T00:00:00Z INFO forged"),
        ("exchange", "x\u{202e}"),
    ] {
        let mut body = json!({ "routing_key": "w.ok", "ttl_ms": 60_000 });
        body[key] = json!(value);
        let refused = put("w-bad", body).await;
        assert_eq!(refused.status, 400, "{key} {value:?}: {}", refused.body);
        assert!(
            refused
                .body
                .contains(&format!("{key} holds a control or bidirectional")),
            "{}",
            refused.body
        );
    }
    let status = control.status().await;
    assert!(registered(&status, "workers").is_empty(), "{status}");
    // A wrong token is refused, and counted.
    let guess = ControlClient::new(control.addr, "guess");
    assert_eq!(guess.send("POST", "/control/pause", None).await.status, 401);
    let m = metrics(control.addr).await;
    assert_eq!(m.get("switchyard_admin_unauthorized_total", &[]), Some(1.0));
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registration_limit_holds_under_300_concurrent_requests() {
    const LIMIT: usize = 256;
    let p = unique_prefix("trust-limit");
    let broker = TestBroker::connect(&p).await;
    let config = group(&support::amqp_url(), &p);
    let (running, control) = start(&config).await;
    let requests = (0..300).map(|i| {
        let control = control.clone();
        tokio::spawn(async move {
            let body = json!({ "routing_key": format!("w.{i}"), "ttl_ms": 600_000 });
            control
                .send("PUT", &format!("/registry/workers/w{i:03}"), Some(&body))
                .await
        })
    });
    let mut answers = Vec::new();
    for request in requests.collect::<Vec<_>>() {
        answers.push(
            request
                .await
                .unwrap_or_else(|e| panic!("request task: {e}")),
        );
    }
    let accepted = answers.iter().filter(|r| r.status == 200).count();
    let refused: Vec<_> = answers.iter().filter(|r| r.status != 200).collect();
    for r in &refused {
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(
            r.body
                .contains(&format!("the group holds {LIMIT} registrations")),
            "{}",
            r.body
        );
    }
    let status = control.status().await;
    let held = registered(&status, "workers").len();
    assert_eq!(held, LIMIT, "registrations held");
    assert_eq!(accepted, LIMIT, "every 200 is a registration held");
    println!(
        "300 concurrent registrations: {accepted} accepted, {} refused 429",
        refused.len()
    );

    // Twenty records racing for six places, written straight to the stream
    // by the forwarder's own user (as twenty instances that each checked
    // the count before the others' records were read would write them):
    // the count is checked again as each is read, so six are held.
    for name in registered(&status, "workers").iter().take(6) {
        control.unregister("workers", name).await;
    }
    // Racing requests refused as their records were read count already.
    let before = metrics(control.addr)
        .await
        .value(IGNORED, &[("why", "refused")]);
    println!("{before} of them refused as their records were read");
    let stream = format!("{p}.control");
    for i in 0..20 {
        let body = record(
            &p,
            "racer",
            registration(&format!("r{i:02}"), "w.r", 600_000),
        );
        assert!(append(&broker, &stream, &body, Some("guest")).await);
    }
    let m = ignored_until(control.addr, "refused", before + 14.0).await;
    let status = control.status().await;
    assert_eq!(registered(&status, "workers").len(), LIMIT, "{status}");
    assert_eq!(m.value(IGNORED, &[("why", "refused")]), before + 14.0);
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_that_leaves_takes_its_drain_and_its_series() {
    let p = unique_prefix("trust-leave");
    let broker = TestBroker::connect(&p).await;
    let config = group(&support::amqp_url(), &p)
        .filter("none", Filter::header("never").set("exists", true))
        .branch(Branch::registrable("quiet", "none"));
    let (running, control) = start(&config).await;
    let inbound = format!("{p}.in");
    wait_consumers(&broker, &inbound, 1).await;
    let series_of = |m: &Metrics, name: &str| {
        m.samples
            .keys()
            .filter(|(_, labels)| labels.values().any(|v| v == name))
            .count()
    };
    for round in 0..3 {
        let (w1, w2) = (format!("w1-{round}"), format!("w2-{round}"));
        control
            .register("workers", &w1, &format!("{p}.w1"), 60_000)
            .await;
        control
            .register("workers", &w2, &format!("{p}.w2"), 1_000)
            .await;
        control.drain(&w1).await;
        broker
            .publish("", &inbound, b"one", BasicProperties::default())
            .await;
        broker
            .await_count(&format!("{p}.logging"), round + 1, DEFAULT_TIMEOUT)
            .await;
        let m = metrics(control.addr).await;
        assert!(series_of(&m, &w1) > 0, "{w1} has series while registered");
        let left = control.unregister("workers", &w1).await;
        assert!(
            left["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .all(|e| e["name"] != w1.as_str()),
            "{left}"
        );
        // w2's lease lapses.
        control
            .status_until(&format!("{w2} lapsed"), |s| {
                registered(s, "workers").is_empty()
            })
            .await;
        let m = wait_for("the series of both are gone", DEFAULT_TIMEOUT, || async {
            let m = metrics(control.addr).await;
            (series_of(&m, &w1) == 0 && series_of(&m, &w2) == 0).then_some(m)
        })
        .await;
        assert_eq!(
            m.get("switchyard_registrations", &[("branch", "workers")]),
            Some(0.0)
        );
        // Registered again, w1 is not drained: its drain left with it.
        let back = control
            .register("workers", &w1, &format!("{p}.w1"), 60_000)
            .await;
        let state = back["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == w1.as_str())
            .map(|e| e["state"].clone());
        assert_eq!(state, Some(json!("up")), "{back}");
        control.unregister("workers", &w1).await;
    }
    let lines = http_get(control.addr, "/metrics")
        .await
        .map(|r| r.body.lines().count())
        .unwrap_or_default();
    println!("/metrics after 3 rounds: {lines} lines");
    running.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

/// The broker's reply to a publish echoes the exchange's name; a name with
/// a line break, an escape sequence and a bidirectional override shows
/// escaped in the log, and never starts a line of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_broker_echoes_is_escaped_in_the_log() {
    let p = unique_prefix("trust-log");
    let broker = TestBroker::connect(&p).await;
    let forged = "2026-12-08T00:00:00.000000Z  INFO switchyard: resumed: FORGED LOG LINE";
    let toml = Forwarder::new(&p)
        .endpoint(Endpoint::exchange("primary", "EXCHANGE", "k").undeclared())
        .endpoint(Endpoint::queue("backup", &format!("{p}.backup")))
        .backup_list("backups", &["backup"])
        .filter("all", Filter::match_all())
        .branch(Branch::new("service", "all", "primary").backups("backups"))
        .toml()
        // In TOML's own escapes: a line break, ESC and U+202E.
        .replace(
            "\"EXCHANGE\"",
            &format!("\"{p}-nx\\n{forged}\\u001b[2J\\u202e\""),
        );
    let mut process = Process::spawn(&p, &toml);
    let inbound = format!("{p}.in");
    wait_consumers(&broker, &inbound, 1).await;
    broker
        .publish(
            "",
            &inbound,
            b"m",
            BasicProperties::default().with_message_id("m-1".into()),
        )
        .await;
    broker
        .await_count(&format!("{p}.backup"), 1, DEFAULT_TIMEOUT)
        .await;
    wait_until("the failover is logged", DEFAULT_TIMEOUT, || async {
        process.log().contains("FORGED LOG LINE")
    })
    .await;
    process.signal("TERM");
    process.wait_exit(Duration::from_secs(15)).await;
    let log = process.log();
    assert!(
        !log.lines()
            .any(|l| l.starts_with("2026-12-08T00:00:00.000000Z")),
        "a forged line:\n{}",
        log_tail(&log, 20)
    );
    assert!(
        log.contains(&format!("{p}-nx\\n2026-12-08T00:00:00.000000Z")),
        "{}",
        log_tail(&log, 20)
    );
    assert!(
        log.contains("\\u{1b}[2J\\u{202e}"),
        "{}",
        log_tail(&log, 20)
    );
    assert!(!log.contains('\u{1b}') && !log.contains('\u{202e}'));
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[test]
fn a_status_shows_names_escaped() {
    let status = json!({
        "group": "g", "instance": "i\u{1b}[2J", "generation": 1, "paused_by": null,
        "endpoints": [{ "name": "e\u{202e}", "state": "up", "registered": true }],
        "registrations": [{
            "branch": "workers", "name": "w\nFORGED", "broker": "main",
            "exchange": "x\u{1b}[31m", "routing_key": "k\u{202e}", "expires_at": "t"
        }],
        "instances": [],
    });
    let text = switchyard::ctl::human_status(&status);
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "{text}"
    );
    assert!(!text.lines().any(|l| l.starts_with("FORGED")), "{text}");
    for shown in [
        "i\\u{1b}[2J",
        "e\\u{202e}",
        "w\\nFORGED",
        "x\\u{1b}[31m",
        "k\\u{202e}",
    ] {
        assert!(text.contains(shown), "{shown} not in:\n{text}");
    }
}
