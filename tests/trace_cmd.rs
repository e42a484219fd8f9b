//! `switchyard trace`, the real binary against a journal stream of the
//! test's own, written as the forwarder writes it (NDJSON batches of real
//! `Record` values): found by message id and by copy id, two instances'
//! records in one answer in time order, `--json` with every documented
//! key, exit 3 naming the window (a future `--since` included), a bad
//! `--since`, a line that is not a record skipped and counted, and the
//! one-line errors for a missing stream and a classic queue of its name.

use crate::support;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::config::Forwarder;
use support::harness::clean_command;
use support::{BULK_TIMEOUT, TestBroker, amqp_str, unique_prefix};
use switchyard::journal::Record;
use switchyard::journal::record::{AttemptRecord, BranchRecord, rfc3339};

/// A journal stream of the test's own, and a configuration naming it.
struct Journal {
    broker: TestBroker,
    stream: String,
    config: PathBuf,
}

impl Journal {
    /// The stream declared as the forwarder declares it.
    async fn new(test: &str) -> Self {
        let journal = Self::named(test).await;
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), amqp_str("stream"));
        journal
            .broker
            .declare_queue_with(&journal.stream, args)
            .await;
        journal
    }

    /// A configuration naming a stream `trace-<unique>` that is not declared.
    async fn named(test: &str) -> Self {
        let p = unique_prefix(test);
        let stream = format!("trace-{p}");
        let toml = Forwarder::new(&p)
            .seed(&p)
            .journal("stream", stream.as_str())
            .toml();
        let config = std::env::temp_dir().join(format!("{p}-trace.toml"));
        std::fs::write(&config, toml).unwrap_or_else(|e| panic!("write config: {e}"));
        Self {
            broker: TestBroker::connect(&p).await,
            stream,
            config,
        }
    }

    /// One batch, as the writer publishes it: one JSON line per record.
    async fn write(&self, records: &[Record]) {
        let mut body = Vec::new();
        for record in records {
            serde_json::to_writer(&mut body, record).unwrap_or_else(|e| panic!("{e}"));
            body.push(b'\n');
        }
        self.write_raw(&body, records.len()).await;
    }

    /// One batch as the forwarder publishes it, with its user (`guest`,
    /// the user of the test broker's URI) as `user_id`.
    async fn write_raw(&self, body: &[u8], records: usize) {
        self.write_as(body, records, Some("guest")).await;
    }

    /// One batch published with `user_id` (or none).
    async fn write_as(&self, body: &[u8], records: usize, user_id: Option<&str>) {
        let mut headers = FieldTable::default();
        headers.insert(
            "x-switchyard-journal-records".into(),
            AMQPValue::LongLongInt(records as i64),
        );
        let props = BasicProperties::default()
            .with_content_type("application/x-ndjson".into())
            .with_delivery_mode(2)
            .with_timestamp(unix_now())
            .with_headers(headers);
        let props = match user_id {
            Some(user) => props.with_user_id(user.into()),
            None => props,
        };
        let confirmation = self.broker.publish("", &self.stream, body, props).await;
        assert!(
            confirmation.is_ack() && confirmation.take_message().is_none(),
            "batch not confirmed"
        );
    }

    /// `switchyard trace <args> --config <config>`, bounded in time.
    async fn trace(&self, args: &[&str]) -> Output {
        let config = self.config.display().to_string();
        let run = tokio::process::Command::from(clean_command())
            .stdin(Stdio::null())
            .arg("trace")
            .args(args)
            .args(["--config", &config])
            .output();
        tokio::time::timeout(BULK_TIMEOUT, run)
            .await
            .unwrap_or_else(|_| panic!("trace {args:?} did not finish"))
            .unwrap_or_else(|e| panic!("cannot run switchyard: {e}"))
    }

    async fn delete(self) {
        self.broker.delete_queue(&self.stream).await;
        let _ = std::fs::remove_file(&self.config);
        self.broker.close().await;
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `ms` milliseconds from now, in RFC 3339.
fn at(ms: i64) -> String {
    let now = SystemTime::now();
    let shifted = if ms >= 0 {
        now + Duration::from_millis(ms as u64)
    } else {
        now - Duration::from_millis(ms.unsigned_abs())
    };
    rfc3339(shifted)
}

fn attempt(endpoint: &str, outcome: &str, ms: i64) -> AttemptRecord {
    AttemptRecord {
        endpoint: endpoint.to_owned(),
        outcome: outcome.to_owned(),
        at: at(ms),
        reply_code: None,
        held_ms: None,
        replay: false,
    }
}

/// A record of message `id` settled by `instance` `ms` from now: branch
/// "service" returned (312) by its primary and confirmed by its backup,
/// branch "logging" confirmed.
fn record(id: &str, instance: &str, verdict: &str, ms: i64) -> Record {
    let mut returned = attempt("primary", "returned", ms - 30);
    returned.reply_code = Some(312);
    Record {
        v: 1,
        message_id: Some(id.to_owned()),
        copy_ids: vec![format!("service:{id}"), format!("logging:{id}")],
        instance: instance.to_owned(),
        source: "queue".to_owned(),
        verdict: verdict.to_owned(),
        reason: (verdict == "dead-lettered").then(|| "exhausted".to_owned()),
        error: None,
        http_status: None,
        session: None,
        redelivered: false,
        trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
        span_id: "00f067aa0ba902b7".to_owned(),
        received_at: at(ms - 50),
        settled_at: at(ms),
        branches: vec![
            BranchRecord {
                branch: "service".to_owned(),
                result: "delivered".to_owned(),
                attempts: vec![returned, attempt("backup", "confirmed", ms - 20)],
            },
            BranchRecord {
                branch: "logging".to_owned(),
                result: "delivered".to_owned(),
                attempts: vec![attempt("log", "confirmed", ms - 10)],
            },
        ],
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_exit(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Two instances wrote records of one message (b's batch first, though
/// a settled it earlier), among others: one answer, by message id and by
/// copy id, in time order.
#[tokio::test]
async fn one_answer_from_every_instance_in_time_order() {
    let journal = Journal::new("trace-found").await;
    let id = format!("order-{}", uuid::Uuid::new_v4());
    journal
        .write(&[
            record("other-1", "switchyard-b", "acked", -900),
            record(&id, "switchyard-b", "acked", -1000),
        ])
        .await;
    journal
        .write(&[
            record(&id, "switchyard-a", "dead-lettered", -2000),
            record(&format!("{id}0"), "switchyard-a", "acked", -1500),
        ])
        .await;
    for query in [id.clone(), format!("logging:{id}")] {
        let out = journal.trace(&[&query]).await;
        assert_exit(&out, 0, &query);
        let stdout = text(&out.stdout);
        let headings: Vec<&str> = stdout
            .lines()
            .filter(|l| !l.starts_with(' ') && !l.is_empty())
            .collect();
        assert_eq!(headings.len(), 2, "{query}: {stdout}");
        assert!(
            headings[0].contains("switchyard-a")
                && headings[0].contains("dead-lettered: exhausted"),
            "{query}: the earlier settlement first: {stdout}"
        );
        assert!(headings[1].contains("switchyard-b") && headings[1].ends_with("acked"));
        assert!(
            stdout.contains("primary  returned (reply 312)")
                && stdout.contains("backup   confirmed")
                && stdout.contains(&format!("message {id}  trace 4bf92f35")),
            "{stdout}"
        );
        assert!(!stdout.contains("other-1") && !stdout.contains(&format!("{id}0")));
    }
    journal.delete().await;
}

/// `--json`: one object per record, as stored, with every documented key.
#[tokio::test]
async fn json_prints_each_record_as_stored() {
    let journal = Journal::new("trace-json").await;
    let id = format!("json-{}", uuid::Uuid::new_v4());
    let written = [
        record(&id, "switchyard-b", "acked", -500),
        record(&id, "switchyard-a", "requeued", -3000),
    ];
    journal.write(&written).await;
    let out = journal.trace(&[&id, "--json"]).await;
    assert_exit(&out, 0, "--json");
    let lines: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 2);
    for key in [
        "message_id",
        "instance",
        "source",
        "verdict",
        "trace_id",
        "received_at",
        "settled_at",
        "branches",
    ] {
        assert!(lines.iter().all(|l| l.get(key).is_some()), "{key}");
    }
    assert_eq!(lines[0]["verdict"], "requeued", "oldest first");
    let attempt = &lines[1]["branches"][0]["attempts"][0];
    assert_eq!(attempt["endpoint"], "primary");
    assert_eq!(attempt["outcome"], "returned");
    assert_eq!(attempt["reply_code"], 312);
    assert!(attempt["at"].as_str().is_some_and(|t| t.ends_with('Z')));
    let back: Record = serde_json::from_value(lines[1].clone()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, written[0]);
    journal.delete().await;
}

/// Nothing found: exit 3, stderr naming the id, the stream and the window,
/// for the default window and for one that starts in the future.
#[tokio::test]
async fn nothing_found_exits_3_naming_the_window() {
    let journal = Journal::new("trace-absent").await;
    journal
        .write(&[record("present", "switchyard-a", "acked", -100)])
        .await;
    let out = journal.trace(&["absent-id"]).await;
    assert_exit(&out, 3, "absent id");
    let stderr = text(&out.stderr);
    assert!(out.stdout.is_empty());
    assert!(
        stderr.contains("\"absent-id\"")
            && stderr.contains(&format!("\"{}\"", journal.stream))
            && stderr.contains("since ")
            && stderr.trim_end().ends_with("(24h)"),
        "{stderr}"
    );
    let future = journal
        .trace(&["present", "--since", "2099-01-01T00:00:00Z"])
        .await;
    assert_exit(&future, 3, "a window in the future");
    let stderr = text(&future.stderr);
    assert!(
        stderr.contains("\"present\"") && stderr.contains("since 2099-01-01T00:00:00Z"),
        "{stderr}"
    );
    journal.delete().await;
}

/// A `--since` that is neither a duration nor a time: usage, naming it.
#[tokio::test]
async fn a_bad_since_is_a_usage_error() {
    let journal = Journal::named("trace-since").await;
    for bad in ["yesterday", "24", "1.5h"] {
        let out = journal.trace(&["m-1", "--since", bad]).await;
        assert_exit(&out, 2, bad);
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("--since \"{bad}\"")) && stderr.lines().count() == 1,
            "{stderr}"
        );
    }
    journal.delete().await;
}

/// A line that names the id but is not a record is skipped and counted;
/// the records around it are shown.
#[tokio::test]
async fn a_line_that_is_not_a_record_is_skipped_and_counted() {
    let journal = Journal::new("trace-broken").await;
    let id = format!("broken-{}", uuid::Uuid::new_v4());
    let mut body = Vec::new();
    for record in [
        record(&id, "switchyard-a", "acked", -300),
        record("unrelated", "switchyard-a", "acked", -200),
    ] {
        serde_json::to_writer(&mut body, &record).unwrap_or_else(|e| panic!("{e}"));
        body.push(b'\n');
    }
    body.extend_from_slice(format!("{{\"message_id\":\"{id}\",\"cut\n").as_bytes());
    body.extend_from_slice(b"garbage without the id\n");
    journal.write_raw(&body, 4).await;
    journal
        .write(&[record(&id, "switchyard-b", "acked", -100)])
        .await;
    let out = journal.trace(&[&id]).await;
    assert_exit(&out, 0, "with a broken line");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("switchyard-a") && stdout.contains("switchyard-b"),
        "{stdout}"
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("skipped 1 line(s)") && stderr.contains(&id),
        "{stderr}"
    );
    journal.delete().await;
}

/// A batch published without the forwarder's `user_id` is not the group's
/// history, whatever it says: its records are not shown, and they are
/// counted on stderr.
#[tokio::test]
async fn a_batch_the_forwarders_did_not_publish_is_ignored_and_counted() {
    let journal = Journal::new("trace-forged").await;
    let id = format!("forged-{}", uuid::Uuid::new_v4());
    let mut forged = Vec::new();
    serde_json::to_writer(&mut forged, &record(&id, "attacker", "acked", -300))
        .unwrap_or_else(|e| panic!("{e}"));
    forged.push(b'\n');
    journal.write_as(&forged, 1, None).await;
    let out = journal.trace(&[&id]).await;
    assert_exit(&out, 3, "only a forged record");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("ignored 1 line(s)") && stderr.contains("did not write"),
        "{stderr}"
    );
    assert!(!text(&out.stdout).contains("attacker"));
    // The forwarder's own record of the same id is shown beside it.
    journal
        .write(&[record(&id, "switchyard-a", "acked", -100)])
        .await;
    let out = journal.trace(&[&id]).await;
    assert_exit(&out, 0, "the forwarder's record");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("switchyard-a") && !stdout.contains("attacker"),
        "{stdout}"
    );
    journal.delete().await;
}

/// A classic queue by the stream's name, and no queue at all: one line
/// naming the stream and the broker, the password masked, exit 1; the
/// missing stream is not created.
#[tokio::test]
async fn a_classic_queue_or_no_stream_is_a_clear_error() {
    let journal = Journal::named("trace-classic").await;
    let missing = journal.trace(&["m-1"]).await;
    assert_exit(&missing, 1, "missing stream");
    let stderr = text(&missing.stderr);
    assert!(
        stderr.contains(&format!("journal stream \"{}\"", journal.stream))
            && stderr.contains("broker \"main\"")
            && stderr.contains("does not exist")
            && stderr.contains(":***@")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
    assert!(
        !journal.broker.queue_exists(&journal.stream).await,
        "trace creates nothing"
    );
    journal.broker.declare_queue(&journal.stream).await;
    journal
        .broker
        .publish("", &journal.stream, b"work", BasicProperties::default())
        .await;
    let classic = journal.trace(&["m-1"]).await;
    assert_exit(&classic, 1, "classic queue");
    let stderr = text(&classic.stderr);
    assert!(
        stderr.contains(&format!("journal stream \"{}\"", journal.stream))
            && stderr.contains("stream")
            && stderr.contains(":***@")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
    assert_eq!(
        journal.broker.queue_len(&journal.stream).await,
        1,
        "its message is untouched"
    );
    journal.delete().await;
}
