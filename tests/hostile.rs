//! Hostile headers against the real binary: tables and arrays nested 1,500,
//! 3,000 and 12,000 levels deep (and, in republish mode, 24,000 levels, near
//! what frame_max allows) among normal messages, in both dead-letter modes.
//! The process stays up, every normal message reaches both branches, each
//! deep message is dead-lettered `malformed` and none is forwarded; a
//! message with 5,000 small headers is forwarded intact.
//!
//! The binary is spawned with the `RUST_MIN_STACK` this test process runs
//! with (see `.cargo/config.toml`), which is below what the binary wants: it
//! must raise it itself. Parsing the 24,000-level header would overflow a
//! thread of that size in a debug build.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use support::harness::{Process, base_toml, log_tail, seed_toml, wait_consumers};
use support::{
    Message, TestBroker, amqp_str, delete_all_with_prefix, ready_unacked, tally, unique_prefix,
    wait_until,
};

/// Normal messages per run.
const NORMAL: usize = 200;
/// The innermost value of every deep header: it must never reach a log.
const LEAF: &str = "hostile-leaf-7f3a";
const LIMIT: usize = 64;

#[derive(Clone, Copy, Debug)]
enum Shape {
    Table,
    Array,
    /// Tables and arrays alternating.
    Mixed,
}

/// `depth` nested levels around [`LEAF`], built without recursion.
fn nested(shape: Shape, depth: usize) -> AMQPValue {
    let mut value = amqp_str(LEAF);
    for level in 0..depth {
        value = match (shape, level % 2) {
            (Shape::Array, _) | (Shape::Mixed, 1) => {
                AMQPValue::FieldArray(FieldArray::from(vec![value]))
            }
            _ => {
                let mut table = FieldTable::default();
                table.insert("k".into(), value);
                AMQPValue::FieldTable(table)
            }
        };
    }
    value
}

/// A deep message: its id (also its body) and its header's shape and depth.
struct Deep {
    id: String,
    shape: Shape,
    depth: usize,
}

fn deep_cases(p: &str, extra: &[(Shape, usize)]) -> Vec<Deep> {
    let mut cases = Vec::new();
    for depth in [1_500, 3_000, 12_000] {
        for shape in [Shape::Table, Shape::Array, Shape::Mixed] {
            cases.push((shape, depth));
        }
    }
    cases.extend_from_slice(extra);
    cases
        .into_iter()
        .map(|(shape, depth)| Deep {
            id: format!("{p}-deep-{shape:?}-{depth}").to_lowercase(),
            shape,
            depth,
        })
        .collect()
}

fn deep_props(deep: &Deep) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("deep".into(), nested(deep.shape, deep.depth));
    headers.insert("kind".into(), amqp_str("hostile"));
    BasicProperties::default()
        .with_message_id(deep.id.as_str().into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

fn normal_props(id: &str, n: usize) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("kind".into(), amqp_str("normal"));
    headers.insert("n".into(), AMQPValue::LongLongInt(n as i64));
    BasicProperties::default()
        .with_message_id(id.into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

/// A queue's total length across the primary and backup endpoint.
async fn branch_len(broker: &TestBroker, p: &str, branch: &str) -> u32 {
    broker.queue_len(&format!("{p}.{branch}")).await
        + broker.queue_len(&format!("{p}.{branch}.backup")).await
}

/// Everything a branch received, primary and backup.
async fn branch_messages(broker: &TestBroker, p: &str, branch: &str) -> Vec<Message> {
    let mut all = broker.get_all(&format!("{p}.{branch}")).await;
    all.extend(broker.get_all(&format!("{p}.{branch}.backup")).await);
    all
}

/// Runs the binary in `mode`, feeds it `NORMAL` normal messages with the
/// deep ones spread among them, waits until everything is settled, stops it
/// and returns what the branches and the DLQ hold, after checking the
/// process survived and that every message is accounted for exactly once.
async fn hostile_run(
    test: &str,
    mode: &str,
    extra: &[(Shape, usize)],
) -> (String, Vec<Deep>, Vec<Message>) {
    let p = unique_prefix(test);
    let broker = TestBroker::connect(&p).await;
    let toml = seed_toml(&p, &base_toml(&p, mode));
    let inbound = format!("{p}.in");
    let dlq = format!("{p}.dlq");
    let mut process = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;

    let deep = deep_cases(&p, extra);
    let normal: Vec<String> = (0..NORMAL).map(|i| format!("{p}-n-{i:03}")).collect();
    let every = NORMAL / (deep.len() + 1);
    let mut messages = Vec::new();
    let mut pending_deep = deep.iter();
    for (i, body) in normal.iter().enumerate() {
        messages.push((body.clone(), normal_props(body, i)));
        if (i + 1) % every == 0
            && let Some(d) = pending_deep.next()
        {
            messages.push((d.id.clone(), deep_props(d)));
        }
    }
    for d in pending_deep {
        messages.push((d.id.clone(), deep_props(d)));
    }
    broker.publish_each("", &inbound, messages).await;

    let expected_dlq = deep.len() as u32;
    wait_until(
        &format!("{NORMAL} copies on each branch, {expected_dlq} dead letters, {inbound} settled"),
        Duration::from_secs(60),
        || async {
            let log = process.log();
            assert!(!log.contains("overflowed"), "{}", log_tail(&log, 10));
            branch_len(&broker, &p, "service").await == NORMAL as u32
                && branch_len(&broker, &p, "logging").await == NORMAL as u32
                && broker.queue_len(&dlq).await == expected_dlq
                && ready_unacked(&inbound).await == Some((0, 0))
        },
    )
    .await;

    // Still the same live process: it answers TERM with a clean exit.
    process.signal("TERM");
    let code = process.wait_exit(Duration::from_secs(15)).await;
    let log = process.log();
    assert_eq!(
        code,
        Some(0),
        "the process must still be running and stop cleanly; log tail:\n{}",
        log_tail(&log, 30)
    );
    assert!(!log.contains("overflowed"), "{}", log_tail(&log, 30));
    assert!(
        !log.contains(LEAF),
        "a header value reached the log:\n{}",
        log_tail(&log, 30)
    );
    for d in &deep {
        assert!(
            log.lines().any(|l| l.contains("dead-lettered")
                && l.contains(&d.id)
                && l.contains("malformed")
                && l.contains(&format!(
                    "headers nest {} levels deep (limit {LIMIT})",
                    d.depth
                ))),
            "no malformed dead-letter line for {}:\n{}",
            d.id,
            log_tail(&log, 30)
        );
    }

    let service = branch_messages(&broker, &p, "service").await;
    let logging = branch_messages(&broker, &p, "logging").await;
    let dead = broker.get_all(&dlq).await;
    let left = broker.get_all(&inbound).await;
    assert!(
        left.is_empty(),
        "{} message(s) left in {inbound}",
        left.len()
    );
    let once: BTreeMap<String, usize> = normal.iter().map(|b| (b.clone(), 1)).collect();
    assert_eq!(
        tally(&service),
        once,
        "service: each normal message exactly once"
    );
    assert_eq!(
        tally(&logging),
        once,
        "logging: each normal message exactly once"
    );
    let dead_once: BTreeMap<String, usize> = deep.iter().map(|d| (d.id.clone(), 1)).collect();
    assert_eq!(
        tally(&dead),
        dead_once,
        "DLQ: each deep message exactly once"
    );
    for m in service.iter().chain(&logging) {
        assert_eq!(m.header_str("kind").as_deref(), Some("normal"));
    }
    println!(
        "{mode}: {NORMAL} normal messages on both branches, {} deep ones dead-lettered, none lost",
        deep.len()
    );
    delete_all_with_prefix(&p).await;
    (inbound, deep, dead)
}

use support::array_names as names;

fn by_id<'a>(dead: &'a [Message], id: &str) -> &'a Message {
    dead.iter()
        .find(|m| m.body_str() == id)
        .unwrap_or_else(|| panic!("{id} not in the DLQ"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_headers_are_dead_lettered_malformed_in_republish_mode() {
    let near_frame_max = [(Shape::Array, 24_000)];
    let (inbound, deep, dead) = hostile_run("hostile-repub", "republish", &near_frame_max).await;
    for d in &deep {
        let m = by_id(&dead, &d.id);
        assert_eq!(
            m.header_str("x-switchyard-reason").as_deref(),
            Some("malformed"),
            "{}",
            d.id
        );
        assert_eq!(
            m.header_str("x-switchyard-error"),
            Some(format!(
                "headers nest {} levels deep (limit {LIMIT})",
                d.depth
            ))
        );
        assert!(names(m.header("x-switchyard-failed")).is_empty());
        assert!(names(m.header("x-switchyard-delivered")).is_empty());
        assert_eq!(
            m.header_str("x-switchyard-source-queue").as_deref(),
            Some(inbound.as_str())
        );
        assert!(matches!(
            m.header("x-switchyard-dead-lettered-at"),
            Some(AMQPValue::LongLongInt(_))
        ));
        // The dead letter itself is publishable: the deep value is replaced.
        assert_eq!(
            m.header_str("deep"),
            Some(format!(
                "x-switchyard-removed: deep: nested {} levels",
                d.depth
            ))
        );
        assert_eq!(m.header_str("kind").as_deref(), Some("hostile"));
        assert_eq!(
            m.properties.message_id().as_ref().map(|s| s.as_str()),
            Some(d.id.as_str())
        );
        assert!(m.header("x-death").is_none(), "republished, not nacked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_headers_are_dead_lettered_malformed_in_nack_mode() {
    let (inbound, deep, dead) = hostile_run("hostile-nack", "nack", &[]).await;
    for d in &deep {
        let m = by_id(&dead, &d.id);
        let Some(AMQPValue::FieldArray(deaths)) = m.header("x-death") else {
            panic!("{}: no x-death header", d.id)
        };
        let Some(AMQPValue::FieldTable(first)) = deaths.as_slice().first() else {
            panic!("{}: empty x-death", d.id)
        };
        let field = |name: &str| match first.inner().get(name) {
            Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            _ => panic!("{}: x-death {name} is not a string", d.id),
        };
        assert_eq!(field("reason"), "rejected", "{}", d.id);
        assert_eq!(field("queue"), inbound, "{}", d.id);
        // The broker dead-letters the original, header intact.
        assert!(
            m.header("deep") == Some(&nested(d.shape, d.depth)),
            "{}: deep header changed",
            d.id
        );
        assert!(m.header("x-switchyard-reason").is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_small_headers_are_forwarded_intact() {
    const HEADERS: usize = 5_000;
    let p = unique_prefix("hostile-wide");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let mut process = Process::spawn(&p, &seed_toml(&p, &base_toml(&p, "nack")));
    wait_consumers(&broker, &inbound, 1).await;

    // About 22 bytes a header: 110 KB of the 128 KiB frame_max.
    let mut headers = FieldTable::default();
    for i in 0..HEADERS {
        headers.insert(
            format!("h-{i:04}").into(),
            amqp_str(&format!("value-{i:04}")),
        );
    }
    let wide = format!("{p}-wide");
    let wide_props = BasicProperties::default()
        .with_message_id(wide.as_str().into())
        .with_headers(headers.clone());
    let mut messages: Vec<(String, BasicProperties)> = (0..10)
        .map(|i| {
            let body = format!("{p}-n-{i}");
            let props = normal_props(&body, i);
            (body, props)
        })
        .collect();
    messages.insert(5, (wide.clone(), wide_props));
    broker.publish_each("", &inbound, messages).await;

    wait_until(
        "11 copies on each branch and the inbound queue settled",
        Duration::from_secs(30),
        || async {
            branch_len(&broker, &p, "service").await == 11
                && branch_len(&broker, &p, "logging").await == 11
                && ready_unacked(&inbound).await == Some((0, 0))
        },
    )
    .await;
    process.signal("TERM");
    let code = process.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(code, Some(0), "{}", log_tail(&process.log(), 30));
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);

    for branch in ["service", "logging"] {
        let got = branch_messages(&broker, &p, branch).await;
        assert_eq!(got.len(), 11, "{branch}");
        let copy = by_id(&got, &wide);
        assert_eq!(copy.body_str(), wide, "{branch}: body");
        let forwarded: BTreeMap<_, _> = copy
            .properties
            .headers()
            .as_ref()
            .map(|h| h.inner().iter())
            .into_iter()
            .flatten()
            // Switchyard's own: its annotations and the copy's traceparent.
            .filter(|(name, _)| {
                !name.as_str().starts_with("x-switchyard-") && name.as_str() != "traceparent"
            })
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        assert_eq!(forwarded.len(), HEADERS, "{branch}: header count");
        assert!(&forwarded == headers.inner(), "{branch}: headers differ");
    }
    delete_all_with_prefix(&p).await;
}
