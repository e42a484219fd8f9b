//! Logs an operator can trust, from the real binary on the real broker: the
//! startup summary says what runs (passwords masked), `--log-format json`
//! writes one JSON object per line (and the admin address it announces
//! serves metrics), and a returned message never puts its body or a header
//! value in the log.

use crate::support;

use lapin::BasicProperties;
use serde_json::Value;
use std::net::SocketAddr;
use support::harness::{
    Process, base_toml, endpoint_toml, one_branch_toml, seed_toml, wait_consumers,
};
use support::{
    DEFAULT_TIMEOUT, Metrics, TestBroker, amqp_str, delete_all_with_prefix, field_table, http_get,
    unique_prefix, wait_for,
};

/// Every line of `log` as a JSON object; panics on any other line.
fn json_lines(log: &str) -> Vec<serde_json::Map<String, Value>> {
    log.lines()
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(map)) => map,
            other => panic!("not a JSON object ({other:?}): {line}"),
        })
        .collect()
}

fn text<'a>(event: &'a serde_json::Map<String, Value>, field: &str) -> &'a str {
    event
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string field {field} in {event:?}"))
}

#[tokio::test]
async fn json_logs_are_one_object_per_line_with_the_startup_summary() {
    let p = unique_prefix("logs-json");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let toml = format!(
        "{}\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        seed_toml(&p, &base_toml(&p, "nack"))
    );
    let mut process = Process::spawn_with(&p, &toml, &["--log-format=json"], &[]);
    wait_consumers(&broker, &inbound, 1).await;
    let bodies: Vec<String> = (0..3).map(|i| format!("j{i}")).collect();
    broker
        .publish_many("", &inbound, bodies.iter(), BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.service"), 3, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.logging"), 3, DEFAULT_TIMEOUT)
        .await;

    let events = json_lines(&process.log());
    let start = events
        .iter()
        .find(|e| e.get("message").and_then(Value::as_str) == Some("starting"))
        .unwrap_or_else(|| panic!("a startup summary in {events:?}"));
    assert_eq!(text(start, "level"), "INFO");
    assert_eq!(text(start, "version"), env!("CARGO_PKG_VERSION"));
    let config = process.config_path().map(|path| path.display().to_string());
    assert_eq!(Some(text(start, "config")), config.as_deref(), "{start:?}");
    assert_eq!(text(start, "sessions"), "off", "{start:?}");
    assert!(
        text(start, "brokers").starts_with("main=amqp://guest:***@"),
        "{start:?}"
    );
    assert_eq!(text(start, "inbound"), format!("{inbound} on main"));
    assert_eq!(start.get("prefetch").and_then(Value::as_u64), Some(500));
    assert_eq!(
        text(start, "branches"),
        "service: service -> service_backup; logging: logging -> logging_backup"
    );
    assert_eq!(
        text(start, "dead_letter"),
        format!("nack via exchange \"{p}.dlx\" key \"{p}.dlq\"")
    );
    let admin: SocketAddr = text(start, "admin")
        .parse()
        .unwrap_or_else(|e| panic!("admin address: {e}"));
    assert_ne!(admin.port(), 0, "the bound port, not the configured 0");

    // The announced address serves this process's metrics. A copy is counted
    // forwarded when its confirm is read, which may come after the queue
    // already shows it, so both counters are awaited together.
    let forwarded = [("branch", "logging"), ("endpoint", "logging")];
    wait_for("three messages in /metrics", DEFAULT_TIMEOUT, || async {
        let page = http_get(admin, "/metrics").await.ok()?;
        let m = Metrics::parse(&page.body);
        (m.get("switchyard_messages_consumed_total", &[]) == Some(3.0)
            && m.get("switchyard_messages_forwarded_total", &forwarded) == Some(3.0))
        .then_some(())
    })
    .await;

    process.signal("TERM");
    assert_eq!(process.wait_exit(DEFAULT_TIMEOUT).await, Some(0));
    let events = json_lines(&process.log());
    for event in &events {
        for field in ["timestamp", "level", "message", "target"] {
            assert!(event.contains_key(field), "{field} in {event:?}");
        }
    }
    let messages: Vec<&str> = events.iter().map(|e| text(e, "message")).collect();
    for expected in ["consuming", "routing configuration live", "stopped"] {
        assert!(messages.contains(&expected), "{expected} in {messages:?}");
    }
    assert!(!process.log().contains("guest:guest"));
    delete_all_with_prefix(&p).await;
}

/// A message returned by the broker (its endpoint's queue is missing) fails
/// over to the backup; the log says so by message id, and neither its body
/// nor its header value appears in any line. The client library logs every
/// returned message whole at warn: that line must not get through.
#[tokio::test]
async fn a_returned_message_leaves_no_body_or_header_value_in_the_log() {
    let p = unique_prefix("logs-secret");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let toml = one_branch_toml(
        &p,
        "nack",
        "",
        &endpoint_toml("primary", "main", &format!("{p}.missing"), false, ""),
        &endpoint_toml("backup", "main", &format!("{p}.backup"), true, ""),
    );
    let mut process = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;

    let body = format!("body-secret-{p}");
    let header = format!("header-secret-{p}");
    let message_id = format!("id-{p}");
    let properties = BasicProperties::default()
        .with_message_id(message_id.as_str().into())
        .with_correlation_id(format!("corr-secret-{p}").as_str().into())
        .with_headers(field_table([("tenant", amqp_str(&header))]));
    broker
        .publish("", &inbound, body.as_bytes(), properties)
        .await;
    broker
        .await_count(&format!("{p}.backup"), 1, DEFAULT_TIMEOUT)
        .await;
    wait_for("the failover in the log", DEFAULT_TIMEOUT, || async {
        let log = process.log();
        log.lines()
            .any(|l| l.contains("failover") && l.contains(&message_id) && l.contains("NO_ROUTE"))
            .then_some(())
    })
    .await;
    process.signal("TERM");
    assert_eq!(process.wait_exit(DEFAULT_TIMEOUT).await, Some(0));

    let log = process.log();
    let start = log
        .lines()
        .find(|l| l.contains(" starting "))
        .unwrap_or_else(|| panic!("a startup summary in:\n{log}"));
    for field in [
        "version=\"",
        "config=\"",
        "brokers=\"main=amqp://guest:***@",
        &format!("inbound=\"{inbound} on main\""),
        "prefetch=500",
        "branches=\"service: primary -> backup\"",
        "dead_letter=\"nack via exchange",
        "admin=\"disabled\"",
    ] {
        assert!(start.contains(field), "{field} in {start}");
    }
    for secret in [&body, &header, &format!("corr-secret-{p}")] {
        // As text, and as the list of bytes a Debug dump of it prints.
        let bytes: Vec<String> = secret.bytes().map(|b| b.to_string()).collect();
        for form in [secret.clone(), bytes.join(", ")] {
            assert!(!log.contains(&form), "{form} in:\n{log}");
        }
    }
    let got = broker.get_all(&format!("{p}.backup")).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, body.as_bytes());
    delete_all_with_prefix(&p).await;
}
