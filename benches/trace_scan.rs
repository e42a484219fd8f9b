//! `cargo bench --bench trace_scan`: how long `switchyard trace` (the
//! release binary) takes over a window of 1,000,000 journal records.
//!
//! It writes the records to a stream of its own on the test broker
//! (`tests/support`'s broker URL) as the journal's writer does (500 per
//! stream message, each a realistic record of three branches), then times
//! `trace` for an id in the middle of the window and for an id that is in
//! no record (the whole window read), prints the figures and deletes the
//! stream.

#[path = "../tests/support/mod.rs"]
mod support;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::config::Forwarder;
use support::harness::clean_command;
use support::{TestBroker, amqp_str, unique_prefix};
use switchyard::journal::Record;
use switchyard::journal::record::{AttemptRecord, BranchRecord, rfc3339};

const RECORDS: usize = 1_000_000;
const PER_BATCH: usize = 500;
/// Stream messages awaiting their confirm while writing.
const WINDOW: usize = 32;

#[tokio::main]
async fn main() {
    let p = unique_prefix("trace-bench");
    let stream = format!("trace-{p}");
    let broker = TestBroker::connect(&p).await;
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), amqp_str("stream"));
    broker.declare_queue_with(&stream, args).await;
    let config = std::env::temp_dir().join(format!("{p}-trace-bench.toml"));
    let toml = format!(
        "{}\n[journal]\nstream = \"{stream}\"\n",
        Forwarder::new(&p).seed(&p).toml()
    );
    std::fs::write(&config, toml).unwrap_or_else(|e| panic!("write config: {e}"));

    let started = Instant::now();
    let base = SystemTime::now() - Duration::from_secs(600);
    let mut bytes = 0usize;
    let batches = (0..RECORDS / PER_BATCH).map(|b| {
        let body = batch(b, base);
        bytes += body.len();
        (body, properties())
    });
    broker.publish_windowed("", &stream, batches, WINDOW).await;
    println!(
        "wrote {RECORDS} records in {} stream messages ({} MB) in {:.1} s",
        RECORDS / PER_BATCH,
        bytes / 1_000_000,
        started.elapsed().as_secs_f64()
    );

    let config = config.display().to_string();
    let middle = id(RECORDS / 2);
    let absent = format!("absent-{p}");
    for (what, wanted, code) in [
        ("an id in the middle of the window", middle.as_str(), 0),
        ("an absent id (the whole window)", absent.as_str(), 3),
    ] {
        let started = Instant::now();
        let out = clean_command()
            .stdin(Stdio::null())
            .args(["trace", wanted, "--config", &config])
            .output()
            .unwrap_or_else(|e| panic!("cannot run switchyard: {e}"));
        let took = started.elapsed();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        println!(
            "trace {what}: {:.2} s over {RECORDS} records",
            took.as_secs_f64()
        );
    }
    broker.delete_queue(&stream).await;
    let _ = std::fs::remove_file(&config);
    broker.close().await;
}

fn id(n: usize) -> String {
    format!("order-{n:08}")
}

/// Batch `b`: records `b * PER_BATCH ..`, one JSON line each.
fn batch(b: usize, base: SystemTime) -> Vec<u8> {
    let mut body = Vec::with_capacity(PER_BATCH * 1024);
    for n in b * PER_BATCH..(b + 1) * PER_BATCH {
        let at = base + Duration::from_micros(n as u64 * 500);
        serde_json::to_writer(&mut body, &record(n, at)).unwrap_or_else(|e| panic!("{e}"));
        body.push(b'\n');
    }
    body
}

fn properties() -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "x-switchyard-journal-records".into(),
        AMQPValue::LongLongInt(PER_BATCH as i64),
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    BasicProperties::default()
        .with_content_type("application/x-ndjson".into())
        .with_delivery_mode(2)
        .with_timestamp(now)
        .with_headers(headers)
}

/// Record `n`: three branches, one of which failed over once.
fn record(n: usize, at: SystemTime) -> Record {
    let id = id(n);
    let step = |endpoint: &str, outcome: &str, ms: u64| AttemptRecord {
        endpoint: endpoint.to_owned(),
        outcome: outcome.to_owned(),
        at: rfc3339(at + Duration::from_millis(ms)),
        reply_code: (outcome == "returned").then_some(312),
        held_ms: None,
        replay: false,
    };
    let branch = |name: &str, attempts| BranchRecord {
        branch: name.to_owned(),
        result: "delivered".to_owned(),
        attempts,
    };
    Record {
        v: 1,
        message_id: Some(id.clone()),
        copy_ids: ["service", "logging", "audit"]
            .iter()
            .map(|b| format!("{b}:{id}"))
            .collect(),
        instance: format!("switchyard-{}", n % 3),
        source: "queue".to_owned(),
        verdict: "acked".to_owned(),
        reason: None,
        error: None,
        http_status: None,
        session: None,
        redelivered: false,
        trace_id: format!("{:032x}", n as u128 * 0x9e37_79b9_7f4a_7c15),
        span_id: format!("{:016x}", n as u64 * 0x2545_f491),
        received_at: rfc3339(at),
        settled_at: rfc3339(at + Duration::from_millis(4)),
        branches: vec![
            branch(
                "service",
                vec![
                    step("service-primary", "returned", 1),
                    step("service-backup", "confirmed", 3),
                ],
            ),
            branch("logging", vec![step("logging-primary", "confirmed", 2)]),
            branch("audit", vec![step("audit-primary", "confirmed", 2)]),
        ],
    }
}
