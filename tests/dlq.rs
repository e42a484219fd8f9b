//! `switchyard dlq inspect` and `dlq redrive`, the real binary
//! against real dead letters made by the forwarder running in-process:
//! listings in both dead-letter modes with every filter, the queue left
//! unchanged in content and order; redrive of partially delivered messages
//! reaching only the missing branch; a redrive stopped by SIGINT duplicating
//! nothing and one killed with SIGKILL losing nothing; the quick start's dead letters explaining themselves; and the
//! one-line errors.

use crate::support;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::{InProcess, clean_command};
use support::{
    BULK_TIMEOUT, DEFAULT_TIMEOUT, Message, TestBroker, amqp_addr, amqp_str, amqp_url,
    delete_all_with_prefix, ready_unacked, tally, unique_prefix, wait_until,
};

/// The keys of every `dlq inspect --json` object (README, "Dead-letter queue").
const JSON_KEYS: [&str; 15] = [
    "message_id",
    "reason",
    "error",
    "failed",
    "delivered",
    "source_queue",
    "dead_lettered_at_ms",
    "age_ms",
    "annotated",
    "x_death",
    "note",
    "producer_annotations",
    "trace_id",
    "body_bytes",
    "body_preview",
];

/// Branch "service" takes kinds `order` and `invoice` to `<p>.service`;
/// branch "logging" takes `order` to two queues that do not exist (every
/// attempt is returned), so an order is delivered to service and
/// dead-lettered `exhausted` for logging; any other kind is `no-route`.
fn mixed(p: &str, mode: &str) -> Forwarder {
    let queue = |name: &str, queue: &str| Endpoint::queue(name, &format!("{p}.{queue}"));
    Forwarder::new(p)
        .mode(mode)
        .endpoint(queue("service", "service"))
        .endpoint(queue("logging", "logging").undeclared())
        .endpoint(queue("logging_backup", "logging.backup").undeclared())
        .backup_list("logging_backups", &["logging_backup"])
        .filter(
            "known",
            Filter::header("kind").set("in", ["order", "invoice"]),
        )
        .filter("orders", Filter::header("kind").set("equals", "order"))
        .branch(Branch::new("service", "known", "service"))
        .branch(Branch::new("logging", "orders", "logging").backups("logging_backups"))
}

fn props(id: &str, kind: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("kind".into(), amqp_str(kind));
    BasicProperties::default()
        .with_message_id(id.into())
        .with_correlation_id(format!("c-{id}").into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A configuration file for the binary, removed on drop.
struct ConfigFile(PathBuf);

impl ConfigFile {
    fn new(p: &str, toml: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{p}-dlq.toml"));
        std::fs::write(&path, toml).unwrap_or_else(|e| panic!("write config: {e}"));
        Self(path)
    }

    fn path(&self) -> &str {
        self.0
            .to_str()
            .unwrap_or_else(|| panic!("non-UTF-8 temp path"))
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The binary clean of the test's environment, with nothing on stdin.
fn switchyard() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::from(clean_command());
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs `switchyard dlq <args> --config <config>`, bounded in time.
async fn dlq(config: &ConfigFile, args: &[&str]) -> Output {
    let run = switchyard()
        .arg("dlq")
        .args(args)
        .args(["--config", config.path()])
        .output();
    tokio::time::timeout(BULK_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| panic!("dlq {args:?} did not finish"))
        .unwrap_or_else(|e| panic!("cannot run switchyard: {e}"))
}

/// Runs a `dlq` command that must succeed; returns stdout.
async fn dlq_ok(config: &ConfigFile, args: &[&str]) -> String {
    let out = dlq(config, args).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "dlq {args:?}\nstdout: {stdout}\nstderr: {stderr}"
    );
    stdout
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `inspect --json` with `extra` arguments: one object per line, each with
/// exactly the documented keys.
async fn inspect_json(config: &ConfigFile, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["inspect", "--json"];
    args.extend_from_slice(extra);
    let stdout = dlq_ok(config, &args).await;
    stdout
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            let object = value
                .as_object()
                .unwrap_or_else(|| panic!("not an object: {line}"));
            let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
            keys.sort_unstable();
            let mut expected = JSON_KEYS.to_vec();
            expected.sort_unstable();
            assert_eq!(keys, expected, "{line}");
            value
        })
        .collect()
}

fn ids(listing: &[Value]) -> Vec<String> {
    listing
        .iter()
        .map(|v| v["message_id"].as_str().unwrap_or("-").to_owned())
        .collect()
}

fn message_ids(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            m.properties
                .message_id()
                .as_ref()
                .map_or_else(|| "-".to_owned(), |id| id.to_string())
        })
        .collect()
}

fn array(items: &[&str]) -> AMQPValue {
    AMQPValue::FieldArray(FieldArray::from(
        items.iter().map(|s| amqp_str(s)).collect::<Vec<_>>(),
    ))
}

/// `x-switchyard-only` of a message, as names.
fn only(m: &Message) -> Option<Vec<String>> {
    match m.header("x-switchyard-only")? {
        AMQPValue::FieldArray(items) => Some(
            items
                .as_slice()
                .iter()
                .map(|v| match v {
                    AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                    other => panic!("not a string: {other:?}"),
                })
                .collect(),
        ),
        other => panic!("x-switchyard-only: {other:?}"),
    }
}

/// Publishes `n` orders `<tag>0..` and waits until they are dead-lettered.
async fn dead_letter_orders(broker: &TestBroker, p: &str, tag: &str, n: usize) {
    for i in 0..n {
        broker
            .publish(
                "",
                &format!("{p}.in"),
                format!("order-{i}").as_bytes(),
                props(&format!("{tag}{i}"), "order"),
            )
            .await;
    }
}

#[tokio::test]
async fn inspect_lists_republished_dead_letters_with_every_filter_and_changes_nothing() {
    let p = unique_prefix("dlq-inspect-repub");
    let broker = TestBroker::connect(&p).await;
    let (inbound, dlq_name) = (format!("{p}.in"), format!("{p}.dlq"));
    let toml = mixed(&p, "republish").toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    dead_letter_orders(&broker, &p, "o", 5).await;
    let mut long = b"\x00\x01bin\nary".to_vec();
    long.extend(std::iter::repeat_n(b'z', 100));
    broker
        .publish("", &inbound, &long, props("o5", "order"))
        .await;
    for i in 0..2 {
        broker
            .publish(
                "",
                &inbound,
                b"unroutable",
                props(&format!("n{i}"), "other"),
            )
            .await;
    }
    broker.await_count(&dlq_name, 8, DEFAULT_TIMEOUT).await;
    broker
        .await_count(&format!("{p}.service"), 6, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    // A dead letter from two hours ago, annotated as the forwarder does,
    // under its user (`guest`).
    let mut headers = FieldTable::default();
    headers.insert("x-switchyard-reason".into(), amqp_str("exhausted"));
    headers.insert(
        "x-switchyard-error".into(),
        amqp_str("logging: nacked by the broker"),
    );
    headers.insert("x-switchyard-failed".into(), array(&["logging"]));
    headers.insert("x-switchyard-delivered".into(), array(&["service"]));
    headers.insert("x-switchyard-source-queue".into(), amqp_str(&inbound));
    headers.insert(
        "x-switchyard-dead-lettered-at".into(),
        AMQPValue::LongLongInt(now_ms() - 2 * 3600 * 1000),
    );
    broker
        .publish(
            "",
            &dlq_name,
            b"old",
            BasicProperties::default()
                .with_message_id("old".into())
                .with_user_id("guest".into())
                .with_headers(headers),
        )
        .await;
    broker.await_count(&dlq_name, 9, DEFAULT_TIMEOUT).await;
    let config = ConfigFile::new(&p, &toml);

    let all = inspect_json(&config, &[]).await;
    assert_eq!(all.len(), 9, "{all:?}");
    let order = ids(&all);
    let by_id: BTreeMap<String, &Value> = order.iter().cloned().zip(all.iter()).collect();
    let o0 = by_id["o0"];
    assert_eq!(o0["reason"], "exhausted");
    assert_eq!(o0["failed"].as_array().map(Vec::len), Some(1));
    assert_eq!(o0["failed"][0]["branch"], "logging");
    assert_eq!(o0["failed"][0]["endpoint"], "logging_backup");
    let error = o0["failed"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("312"), "{error}");
    assert_eq!(o0["delivered"], serde_json::json!(["service"]));
    assert_eq!(o0["source_queue"], inbound.as_str());
    assert!(
        o0["age_ms"]
            .as_i64()
            .is_some_and(|a| (0..120_000).contains(&a))
    );
    assert!(o0["dead_lettered_at_ms"].as_i64().is_some());
    assert_eq!(o0["annotated"], true);
    assert_eq!(o0["x_death"], serde_json::json!([]));
    assert_eq!(o0["note"], Value::Null);
    assert_eq!(o0["body_preview"], "order-0");
    assert_eq!(o0["body_bytes"], 7);
    let o5 = by_id["o5"];
    assert_eq!(o5["body_bytes"], 109);
    let preview = o5["body_preview"].as_str().unwrap_or_default();
    assert_eq!(preview.len(), 64, "{preview}");
    assert!(preview.starts_with("..bin.aryzz"), "{preview}");
    let n0 = by_id["n0"];
    assert_eq!(n0["reason"], "no-route");
    assert_eq!(n0["failed"], serde_json::json!([]));
    assert_eq!(n0["delivered"], serde_json::json!([]));
    assert!(
        by_id["old"]["age_ms"]
            .as_i64()
            .is_some_and(|a| a >= 7_200_000)
    );

    // Filters keep queue order.
    let keep = |pred: &dyn Fn(&str) -> bool| -> Vec<String> {
        order.iter().filter(|id| pred(id)).cloned().collect()
    };
    assert_eq!(
        ids(&inspect_json(&config, &["--limit", "3"]).await),
        order[..3]
    );
    assert_eq!(
        ids(&inspect_json(&config, &["--reason", "no-route"]).await),
        keep(&|id| id.starts_with('n'))
    );
    assert_eq!(
        ids(&inspect_json(
            &config,
            &[
                "--reason",
                "no-route",
                "--reason",
                "exhausted",
                "--limit",
                "4"
            ]
        )
        .await),
        order[..4]
    );
    assert_eq!(
        ids(&inspect_json(&config, &["--message-id", "o3"]).await),
        ["o3"]
    );
    assert_eq!(
        ids(&inspect_json(&config, &["--since", "1h"]).await),
        keep(&|id| id != "old")
    );
    assert_eq!(ids(&inspect_json(&config, &["--since", "3h"]).await), order);
    assert_eq!(
        ids(&inspect_json(
            &config,
            &[
                "--since",
                "1h",
                "--reason",
                "exhausted",
                "--message-id",
                "old"
            ]
        )
        .await),
        Vec::<String>::new()
    );

    // The table, for people.
    let out = dlq(&config, &["inspect"]).await;
    let (table, summary) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{summary}");
    let lines: Vec<&str> = table.lines().collect();
    for heading in [
        "AGE",
        "MESSAGE_ID",
        "REASON",
        "SOURCE",
        "FAILED",
        "DELIVERED",
        "BODY",
    ] {
        assert!(lines[0].contains(heading), "{table}");
    }
    let row = lines
        .iter()
        .find(|l| l.split_whitespace().nth(1) == Some("o0"))
        .unwrap_or_else(|| panic!("no row for o0:\n{table}"));
    for cell in ["exhausted", &inbound, "logging", "service", "order-0"] {
        assert!(row.contains(cell), "{row}");
    }
    assert!(
        table
            .contains("failed logging (last endpoint logging_backup): returned by the broker: 312"),
        "{table}"
    );
    assert!(table.contains("... (109 bytes)"), "{table}");
    assert!(
        summary.contains("9 dead letter(s) listed") && summary.contains("nothing was removed"),
        "{summary}"
    );

    // Still all there, in the same order, each once.
    assert_eq!(ids(&inspect_json(&config, &[]).await), order);
    assert_eq!(ready_unacked(&dlq_name).await, Some((9, 0)));
    let left = broker.get_all(&dlq_name).await;
    assert_eq!(message_ids(&left), order);
    let o5_at = order.iter().position(|id| id == "o5");
    assert_eq!(o5_at.map(|i| &left[i].body), Some(&long), "bytes kept");
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn inspect_in_nack_mode_shows_x_death_and_says_where_the_reason_is() {
    let p = unique_prefix("dlq-inspect-nack");
    let broker = TestBroker::connect(&p).await;
    let (inbound, dlq_name) = (format!("{p}.in"), format!("{p}.dlq"));
    let toml = mixed(&p, "nack").toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    dead_letter_orders(&broker, &p, "o", 3).await;
    broker
        .publish("", &inbound, b"unroutable", props("n0", "other"))
        .await;
    broker.await_count(&dlq_name, 4, DEFAULT_TIMEOUT).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let config = ConfigFile::new(&p, &toml);

    let all = inspect_json(&config, &[]).await;
    assert_eq!(all.len(), 4);
    let now_s = now_ms() / 1000;
    for v in &all {
        assert_eq!(v["reason"], "x-death:rejected", "{v}");
        assert_eq!(v["annotated"], false);
        assert!(v["note"].as_str().is_some_and(|n| n.contains("log")), "{v}");
        assert_eq!(v["source_queue"], inbound.as_str());
        assert_eq!(v["failed"], serde_json::json!([]));
        let death = &v["x_death"][0];
        assert_eq!(death["count"], 1);
        assert_eq!(death["reason"], "rejected");
        assert_eq!(death["queue"], inbound.as_str());
        assert!(
            death["time"]
                .as_i64()
                .is_some_and(|t| (now_s - 120..=now_s + 5).contains(&t)),
            "{v}"
        );
        assert!(v["age_ms"].as_i64().is_some());
    }
    let order = ids(&all);
    assert_eq!(
        ids(&inspect_json(&config, &["--reason", "x-death:rejected", "--limit", "2"]).await),
        order[..2]
    );
    assert_eq!(
        ids(&inspect_json(&config, &["--message-id", "n0"]).await),
        ["n0"]
    );
    assert!(
        inspect_json(&config, &["--reason", "exhausted"])
            .await
            .is_empty()
    );

    let table = dlq_ok(&config, &["inspect"]).await;
    assert!(
        table.contains(&format!("x-death: rejected x1 from {inbound}")),
        "{table}"
    );
    assert!(
        table.contains("note: dead-lettered by the broker"),
        "{table}"
    );

    let left = broker.get_all(&dlq_name).await;
    assert_eq!(message_ids(&left), order, "content and order unchanged");
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn inspect_leaves_a_quorum_dead_letter_queue_in_order() {
    let p = unique_prefix("dlq-inspect-quorum");
    let broker = TestBroker::connect(&p).await;
    let (inbound, dlq_name) = (format!("{p}.in"), format!("{p}.dlq"));
    let toml = mixed(&p, "republish")
        .dead_letter("queue_type", "quorum")
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    dead_letter_orders(&broker, &p, "o", 8).await;
    broker.await_count(&dlq_name, 8, DEFAULT_TIMEOUT).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let config = ConfigFile::new(&p, &toml);
    let order = ids(&inspect_json(&config, &[]).await);
    assert_eq!(order.len(), 8);
    assert_eq!(
        ids(&inspect_json(&config, &["--limit", "3"]).await),
        order[..3]
    );
    assert_eq!(
        ids(&inspect_json(&config, &["--message-id", "o5"]).await),
        ["o5"]
    );
    assert_eq!(ids(&inspect_json(&config, &[]).await), order);
    wait_until("nothing is held", DEFAULT_TIMEOUT, || async {
        ready_unacked(&dlq_name).await == Some((8, 0))
    })
    .await;
    assert_eq!(message_ids(&broker.get_all(&dlq_name).await), order);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn redrive_of_partial_deliveries_reaches_only_the_missing_branch() {
    let p = unique_prefix("dlq-redrive");
    let broker = TestBroker::connect(&p).await;
    let (inbound, dlq_name) = (format!("{p}.in"), format!("{p}.dlq"));
    let (service, logging) = (format!("{p}.service"), format!("{p}.logging"));
    let toml = mixed(&p, "republish").toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    dead_letter_orders(&broker, &p, "o", 6).await;
    broker.await_count(&dlq_name, 6, DEFAULT_TIMEOUT).await;
    broker.await_count(&service, 6, DEFAULT_TIMEOUT).await;
    let config = ConfigFile::new(&p, &toml);
    let before = ids(&inspect_json(&config, &[]).await);

    let dry = dlq_ok(&config, &["redrive", "--dry-run"]).await;
    let lines: Vec<&str> = dry.lines().collect();
    assert_eq!(lines.len(), 7, "{dry}");
    for (line, id) in lines.iter().zip(&before) {
        assert_eq!(
            *line,
            format!("would redrive {id} (exhausted) to {inbound}: only logging")
        );
    }
    assert!(lines[6].starts_with("dry run: 6 of 6"), "{dry}");
    assert_eq!(ready_unacked(&dlq_name).await, Some((6, 0)));
    assert_eq!(ids(&inspect_json(&config, &[]).await), before);
    assert_eq!(broker.queue_len(&inbound).await, 0);

    // The missing branch is back; redrive.
    broker.declare_queue(&logging).await;
    let summary = dlq_ok(&config, &["redrive"]).await;
    assert_eq!(
        summary.trim(),
        format!("6 of 6 dead letter(s) redriven from {dlq_name} to {inbound}")
    );
    broker.await_count(&logging, 6, DEFAULT_TIMEOUT).await;
    wait_until("the inbound queue is done", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 0))
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(broker.queue_len(&dlq_name).await, 0, "the DLQ ends empty");
    assert_eq!(
        broker.get_all(&service).await.len(),
        6,
        "no duplicate on service"
    );
    let copies = broker.get_all(&logging).await;
    let mut got = message_ids(&copies);
    got.sort();
    let mut want = before.clone();
    want.sort();
    assert_eq!(got, want);
    for m in &copies {
        let id = message_ids(std::slice::from_ref(m))[0].clone();
        assert_eq!(m.body_str(), format!("order-{}", &id[1..]));
        assert_eq!(m.header_str("kind").as_deref(), Some("order"));
        assert_eq!(
            m.properties
                .correlation_id()
                .as_ref()
                .map(|c| c.to_string()),
            Some(format!("c-{id}"))
        );
        assert_eq!(only(m), None, "x-switchyard-only is not forwarded");
        assert!(m.header("x-switchyard-reason").is_none());
        assert!(m.header("x-death").is_none());
    }
    delete_all_with_prefix(&p).await;
}

/// The dead-letter tools trust only what the forwarder wrote: a message a
/// producer put on the dead-letter queue with a forged record and probe
/// mark is listed (not hidden as a probe), its headers shown as a
/// producer's, and redriven to every branch; the forwarder's own record
/// beside it (under its user) is read and redriven to its failed branch
/// only.
#[tokio::test]
async fn a_forged_record_is_shown_as_a_producers_and_redriven_to_every_branch() {
    let p = unique_prefix("dlq-forged");
    let broker = TestBroker::connect(&p).await;
    let (inbound, dlq_name) = (format!("{p}.in"), format!("{p}.dlq"));
    let (service, logging) = (format!("{p}.service"), format!("{p}.logging"));
    let toml = mixed(&p, "republish").toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    let record = |id: &str| {
        let mut headers = FieldTable::default();
        headers.insert("kind".into(), amqp_str("order"));
        headers.insert("x-switchyard-reason".into(), amqp_str("exhausted"));
        headers.insert("x-switchyard-failed".into(), array(&["logging"]));
        headers.insert("x-switchyard-delivered".into(), array(&["service"]));
        BasicProperties::default()
            .with_message_id(id.into())
            .with_headers(headers)
    };
    let mut forged = record("forged");
    let mut headers = forged.headers().clone().unwrap_or_default();
    headers.insert("x-switchyard-probe".into(), AMQPValue::Boolean(true));
    forged = forged.with_headers(headers);
    broker.publish("", &dlq_name, b"forged", forged).await;
    let own = record("own").with_user_id("guest".into());
    broker.publish("", &dlq_name, b"own", own).await;
    broker.await_count(&dlq_name, 2, DEFAULT_TIMEOUT).await;
    let config = ConfigFile::new(&p, &toml);

    let listed = inspect_json(&config, &[]).await;
    assert_eq!(
        ids(&listed),
        ["forged", "own"],
        "a forged probe mark hides nothing"
    );
    let (f, o) = (&listed[0], &listed[1]);
    assert_eq!(f["annotated"], false);
    assert_eq!(f["reason"], Value::Null);
    assert_eq!(f["failed"], serde_json::json!([]));
    assert_eq!(f["delivered"], serde_json::json!([]));
    let mut shown: Vec<&str> = f["producer_annotations"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    shown.sort_unstable();
    assert_eq!(
        shown,
        [
            "x-switchyard-delivered",
            "x-switchyard-failed",
            "x-switchyard-probe",
            "x-switchyard-reason"
        ]
    );
    assert_eq!(o["annotated"], true);
    assert_eq!(o["reason"], "exhausted");
    assert_eq!(o["producer_annotations"], serde_json::json!([]));
    let table = dlq_ok(&config, &["inspect"]).await;
    assert!(
        table.contains("not the forwarder's (a producer's headers, ignored): "),
        "{table}"
    );

    let dry = dlq_ok(&config, &["redrive", "--dry-run"]).await;
    let lines: Vec<&str> = dry.lines().take(2).collect();
    assert_eq!(
        lines,
        [
            format!(
                "would redrive forged (-) to {inbound}: every branch (no record of the forwarder's on it)"
            ),
            format!("would redrive own (exhausted) to {inbound}: only logging"),
        ],
        "{dry}"
    );
    broker.declare_queue(&logging).await;
    dlq_ok(&config, &["redrive"]).await;
    broker.await_count(&logging, 2, DEFAULT_TIMEOUT).await;
    wait_until("the inbound queue is done", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 0))
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        message_ids(&broker.get_all(&service).await),
        ["forged"],
        "the forged record named no branch; the forwarder's did"
    );
    let mut on_logging = message_ids(&broker.get_all(&logging).await);
    on_logging.sort();
    assert_eq!(on_logging, ["forged", "own"]);
    assert_eq!(broker.queue_len(&dlq_name).await, 0);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn redrive_takes_each_dead_letter_once_even_when_it_comes_back() {
    let p = unique_prefix("dlq-redrive-back");
    let broker = TestBroker::connect(&p).await;
    let (inbound, dlq_name) = (format!("{p}.in"), format!("{p}.dlq"));
    let toml = mixed(&p, "republish").toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    for i in 0..3 {
        broker
            .publish("", &inbound, b"x", props(&format!("n{i}"), "other"))
            .await;
    }
    dead_letter_orders(&broker, &p, "o", 2).await;
    broker.await_count(&dlq_name, 5, DEFAULT_TIMEOUT).await;
    let config = ConfigFile::new(&p, &toml);
    // No-route dead letters have no failed branch: redriven to every
    // branch, they match nothing again and come back, and are not taken twice.
    let summary = dlq_ok(&config, &["redrive", "--reason", "no-route"]).await;
    assert_eq!(
        summary.trim(),
        format!("3 of 5 dead letter(s) redriven from {dlq_name} to {inbound}")
    );
    broker.await_count(&dlq_name, 5, DEFAULT_TIMEOUT).await;
    wait_until("the inbound queue is done", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 0))
    })
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let left = inspect_json(&config, &[]).await;
    let mut reasons: Vec<(String, String)> = left
        .iter()
        .map(|v| {
            (
                v["message_id"].as_str().unwrap_or("-").to_owned(),
                v["reason"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            ("n0", "no-route"),
            ("n1", "no-route"),
            ("n2", "no-route"),
            ("o0", "exhausted"),
            ("o1", "exhausted")
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn a_redrive_interrupted_or_killed_midway_loses_nothing() {
    const N: usize = 2000;
    let p = unique_prefix("dlq-redrive-kill");
    let broker = TestBroker::connect(&p).await;
    let (inbound, dlq_name) = (format!("{p}.in"), format!("{p}.dlq"));
    let toml = mixed(&p, "republish").toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    let bodies: Vec<String> = (0..N).map(|i| format!("order-{i}")).collect();
    let mut pending = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        pending.push(broker.publish(
            "",
            &inbound,
            body.as_bytes(),
            props(&format!("o{i}"), "order"),
        ));
        if pending.len() == 200 {
            futures_util::future::join_all(pending.drain(..)).await;
        }
    }
    futures_util::future::join_all(pending).await;
    broker.await_count(&dlq_name, N as u32, BULK_TIMEOUT).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let config = ConfigFile::new(&p, &toml);

    // Ctrl-C stops it between two messages: nothing duplicated.
    let interrupted = switchyard()
        .args(["dlq", "redrive", "--config", config.path()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    wait_until("a few hundred are redriven", BULK_TIMEOUT, || async {
        broker.queue_len(&inbound).await >= 300
    })
    .await;
    let pid = interrupted.id().unwrap_or_else(|| panic!("no pid"));
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap_or_else(|e| panic!("kill: {e}"));
    assert!(status.success());
    let out = tokio::time::timeout(BULK_TIMEOUT, interrupted.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("redrive did not stop on SIGINT"))
        .unwrap_or_else(|e| panic!("wait: {e}"));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("switchyard: redrive stopped: interrupted (SIGINT); ")
            && err.contains(" of 2000 dead letter(s) redriven"),
        "{err}"
    );
    let moved = broker.queue_len(&inbound).await;
    assert!(moved < N as u32, "stopped before the end");
    wait_until(
        "the broker took back what the redrive held",
        DEFAULT_TIMEOUT,
        || async { ready_unacked(&dlq_name).await == Some((u64::from(N as u32 - moved), 0)) },
    )
    .await;

    // SIGKILL: nothing lost, at most the message in hand duplicated.
    let mut child = switchyard()
        .args([
            "dlq",
            "redrive",
            "--limit",
            "100000",
            "--config",
            config.path(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    wait_until("a few hundred more are redriven", BULK_TIMEOUT, || async {
        broker.queue_len(&inbound).await >= moved + 300
    })
    .await;
    child.start_kill().unwrap_or_else(|e| panic!("kill: {e}"));
    let status = child.wait().await.unwrap_or_else(|e| panic!("wait: {e}"));
    assert_eq!(status.code(), None, "killed by a signal, not finished");
    wait_until(
        "the broker took back what the redrive held",
        DEFAULT_TIMEOUT,
        || async {
            ready_unacked(&dlq_name)
                .await
                .is_some_and(|(_, unacked)| unacked == 0)
        },
    )
    .await;

    let in_dlq = broker.get_all(&dlq_name).await;
    let redriven = broker.get_all(&inbound).await;
    assert!(!in_dlq.is_empty(), "the kill came before the end");
    for m in &redriven {
        assert_eq!(only(m), Some(vec!["logging".to_owned()]));
        assert!(m.header("x-switchyard-failed").is_none());
    }
    let seen = tally(
        message_ids(&in_dlq)
            .into_iter()
            .chain(message_ids(&redriven)),
    );
    let missing: Vec<String> = (0..N)
        .map(|i| format!("o{i}"))
        .filter(|id| !seen.contains_key(id))
        .collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    assert_eq!(seen.len(), N, "nothing else appeared");
    let duplicated: Vec<(&String, &usize)> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicated.len() <= 1 && duplicated.iter().all(|(_, n)| **n == 2),
        "at most the message in hand is duplicated: {duplicated:?}"
    );
    delete_all_with_prefix(&p).await;
}

/// config/switchyard.toml with every name prefixed and both logging queues
/// missing, so every message is dead-lettered for logging.
fn quick_start_toml(p: &str) -> String {
    let seed = include_str!("../config/switchyard.toml");
    let mut toml = format!("name = \"{p}\"\n{seed}")
        .replace("amqp://guest:guest@127.0.0.1:5672/%2f", &amqp_url());
    for name in ["work.", "service.", "logging."] {
        toml = toml.replace(&format!("\"{name}"), &format!("\"{p}.{name}"));
    }
    for queue in ["logging.primary", "logging.backup"] {
        let line = format!("declare_queue = \"{p}.{queue}\"\n");
        assert!(toml.contains(&line), "the quick start declares {queue}");
        toml = toml.replace(&line, "");
    }
    toml
}

#[tokio::test]
async fn the_quick_start_dead_letters_explain_themselves() {
    let p = unique_prefix("dlq-quick-start");
    let broker = TestBroker::connect(&p).await;
    let toml = quick_start_toml(&p);
    let inbound = format!("{p}.work.in");
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    broker
        .publish("", &inbound, b"{\"item\": 1}", props("w1", "order"))
        .await;
    broker
        .await_count(&format!("{p}.work.dlq"), 1, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let config = ConfigFile::new(&p, &toml);
    let listing = inspect_json(&config, &[]).await;
    assert_eq!(listing.len(), 1);
    let v = &listing[0];
    assert_eq!(v["reason"], "exhausted", "{v}");
    assert_eq!(v["failed"][0]["branch"], "logging", "{v}");
    assert_eq!(v["failed"][0]["endpoint"], "backupLoggingQueue", "{v}");
    assert!(
        v["failed"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("312")),
        "{v}"
    );
    assert_eq!(v["delivered"], serde_json::json!(["service"]));
    let table = dlq_ok(&config, &["inspect"]).await;
    assert!(
        table.contains("failed logging (last endpoint backupLoggingQueue)"),
        "{table}"
    );
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn usage_and_configuration_errors_are_one_line_with_exit_2() {
    let p = unique_prefix("dlq-cli");
    let one_line = |out: &Output| {
        let err = text(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line: {err:?}");
        assert!(!err.contains("panicked"), "{err}");
        lines[0].to_owned()
    };
    let config = ConfigFile::new(&p, &mixed(&p, "republish").toml());
    for command in ["inspect", "redrive"] {
        let out = dlq(&config, &[command, "--since", "10x"]).await;
        assert_eq!(out.status.code(), Some(2));
        let line = one_line(&out);
        assert!(
            line.contains("--since \"10x\"") && line.contains("unit"),
            "{line}"
        );
    }

    let no_queue = mixed(&p, "republish").no_dead_letter_queue().toml();
    let no_queue = ConfigFile::new(&format!("{p}-noq"), &no_queue);
    for command in ["inspect", "redrive"] {
        let out = dlq(&no_queue, &[command]).await;
        assert_eq!(out.status.code(), Some(2));
        let line = one_line(&out);
        assert!(
            line.starts_with(&format!(
                "switchyard: {}: dead_letter.queue: not set",
                no_queue.path()
            )),
            "{line}"
        );
    }

    // A dead-letter queue missing on the broker is not a usage error; the
    // line says what creates it.
    let out = dlq(&config, &["inspect"]).await;
    assert_eq!(out.status.code(), Some(1));
    let line = one_line(&out);
    assert!(
        line.contains("does not exist") && line.contains("start `switchyard run` once"),
        "{line}"
    );

    // Connection failures are classified and worded as `run` words them.
    let with_uri = |name: &str, uri: &str| {
        let toml = mixed(&p, "republish").broker("main", uri).toml();
        ConfigFile::new(&format!("{p}-{name}"), &toml)
    };
    let password = format!("not-the-password-{}", &p[p.len() - 8..]);
    let wrong_password = with_uri(
        "password",
        &format!("amqp://guest:{password}@{}/%2f", amqp_addr()),
    );
    let nothing_listens = with_uri("port", "amqp://guest:guest@127.0.0.1:1/%2f");
    for command in ["inspect", "redrive"] {
        let out = dlq(&wrong_password, &[command]).await;
        assert_eq!(out.status.code(), Some(1));
        let line = one_line(&out);
        assert!(
            line.starts_with(
                "switchyard: broker \"main\" refused the connection: authentication refused \
                 by broker main: check the user and password in brokers.main.uri"
            ),
            "{line}"
        );
        assert!(!line.contains(&password), "{line}");
        let out = dlq(&nothing_listens, &[command]).await;
        assert_eq!(out.status.code(), Some(1));
        let line = one_line(&out);
        assert!(
            line.starts_with("switchyard: cannot connect to amqp://guest:***@127.0.0.1:1/%2f: "),
            "never connected, so not \"connection lost\": {line}"
        );
    }

    let help = switchyard()
        .args(["dlq", "--help"])
        .output()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(help.status.code(), Some(0));
    let help = text(&help.stdout);
    assert!(
        help.contains("inspect") && help.contains("redrive"),
        "{help}"
    );
}
