//! A message whose content header the client cannot read after a
//! redelivery does not stop the inbound queue.
//!
//! The message's content header is `BIG_HEADER_MARGIN` bytes under
//! `frame_max`; a forwarder receives it with an ordinary message behind
//! it, is paused (SIGSTOP) and killed (SIGKILL) before it settles either,
//! and a second forwarder (the real binary) starts. A quorum queue hands
//! the big one out again with `x-delivery-count` added, which takes its
//! header past `frame_max`: the client closes the consuming connection on
//! it each time, and only the queue's delivery limit can remove it. The
//! forwarder meanwhile takes one message at a time, so that the message
//! behind it does not come back with it (at the full prefetch its count
//! would climb with the big one's until it too was dead-lettered). A
//! classic queue adds no header: the big one is read, and dead-lettered
//! `rejected` because its copies do not fit a frame either.
//!
//! Four cases on one private node, every message counted: quorum in `nack`
//! mode with the delivery limit switchyard declares on a queue it creates;
//! quorum in `republish` mode on a queue an operator created without one,
//! given one (and its dead-letter exchange) by running the policy line
//! `switchyard check` prints, as printed; classic in both modes. Each ends
//! with the big one dead-lettered once (reason `delivery_limit` from the
//! broker on the quorum queue), the message behind it and one published
//! afterwards forwarded once to both branches, the backups and the
//! inbound queue empty; on the quorum queue the log shows the losses to
//! the unreadable frame and the return to the configured prefetch once the
//! returned messages have passed. `dlq inspect` says at once that the big
//! dead letter cannot be read where the broker's headers took it past
//! `frame_max` (quorum, and classic in `nack` mode), and lists a readable
//! message the quorum queue dead-lettered at its limit (returned by the
//! test until the queue gave it up) with reason `x-death:delivery_limit`
//! and what that means.

use crate::support;

use std::time::Duration;

use lapin::options::{BasicGetOptions, BasicNackOptions};
use lapin::types::AMQPValue;
use support::config::Forwarder;
use support::harness::{Process, clean_command, log_tail};
use support::raw::{RawClient, RawConfirm, RawMessage, RawProperties, encode};
use support::{PrivateNode, TestBroker, field_table, unique_prefix, wait_until};
use tokio::time::Instant;

/// How close (wire bytes) the big message's content header comes to
/// frame_max: `x-delivery-count` (26 bytes) takes it 2 bytes past.
const BIG_HEADER_MARGIN: usize = 24;
/// How long a case may take to settle after the second forwarder starts.
const SETTLE_WAIT: Duration = Duration::from_secs(30);
/// The queues a case reads back (suffixes of its prefix).
const QUEUES: [&str; 6] = [
    "in",
    "dlq",
    "service",
    "logging",
    "service.backup",
    "logging.backup",
];

/// One case: the inbound queue's type, the dead-letter mode, and whether
/// the queue exists beforehand without a delivery limit (given one by the
/// policy `check` prints) or is created by the forwarder.
#[derive(Debug, Clone, Copy)]
struct Case {
    queue_type: &'static str,
    mode: &'static str,
    existing: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_the_client_cannot_read_after_a_redelivery_does_not_block_the_queue() {
    let started = Instant::now();
    let node = PrivateNode::start().await;
    println!("private node up in {:.1}s", started.elapsed().as_secs_f64());
    let cases = [
        Case {
            queue_type: "quorum",
            mode: "nack",
            existing: false,
        },
        Case {
            queue_type: "quorum",
            mode: "republish",
            existing: true,
        },
        Case {
            queue_type: "classic",
            mode: "nack",
            existing: false,
        },
        Case {
            queue_type: "classic",
            mode: "republish",
            existing: false,
        },
    ];
    let mut failures = Vec::new();
    for case in cases {
        let began = Instant::now();
        let outcome = run_case(&node, case).await;
        let took = began.elapsed().as_secs_f64();
        match outcome {
            Ok(report) => println!("{case:?}: ok in {took:.1}s; {report}"),
            Err(report) => {
                println!("{case:?}: FAILED in {took:.1}s; {report}");
                failures.push(format!("{case:?}: {report}"));
            }
        }
    }
    node.stop().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

async fn run_case(node: &PrivateNode, case: Case) -> Result<String, String> {
    let p = unique_prefix(&format!("big-{}-{}", case.queue_type, case.mode));
    let inbound = format!("{p}.in");
    let toml = Forwarder::at(&node.amqp_url(), &p)
        .mode(case.mode)
        .inbound("queue_type", case.queue_type)
        .dead_letter("queue_type", case.queue_type)
        .seed(&p)
        .toml();
    let policy = if case.existing {
        Some(give_it_a_delivery_limit(node, &p, &toml).await)
    } else {
        None
    };
    let addr = node.amqp_addr();
    let mut first = Process::spawn(&p, &toml);
    wait_until("the first forwarder consumes", SETTLE_WAIT, || {
        let inbound = inbound.clone();
        async move { counts(addr, &inbound).await == Some((0, 1)) }
    })
    .await;
    let first_log = first.log();
    first.signal("STOP");
    let mut raw = RawClient::connect(addr, "/")
        .await
        .map_err(|e| format!("connect: {e}"))?;
    raw.confirm_select()
        .await
        .map_err(|e| format!("confirm.select: {e}"))?;
    let big = big_properties("poison-big", raw.frame_max());
    publish(&mut raw, &inbound, &big, b"big").await?;
    publish(&mut raw, &inbound, &plain("m000000"), b"m000000").await?;
    // Both handed to the paused forwarder, which dies without settling them.
    wait_until("both messages are delivered", SETTLE_WAIT, || {
        let inbound = inbound.clone();
        async move { counts(addr, &inbound).await == Some((0, 1)) }
    })
    .await;
    first.signal("KILL");
    first.wait_exit(SETTLE_WAIT).await;
    let mut second = Process::spawn(&p, &toml);
    let deadline = Instant::now() + SETTLE_WAIT;
    let mut settled = false;
    while Instant::now() < deadline && !settled {
        settled = ready(&mut raw, &format!("{p}.dlq")).await == 1
            && ready(&mut raw, &format!("{p}.service")).await == 1
            && ready(&mut raw, &format!("{p}.logging")).await == 1
            && ready(&mut raw, &inbound).await == 0;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A first delivery after them: the returned messages have passed.
    publish(&mut raw, &inbound, &plain("m000001"), b"m000001").await?;
    let deadline = Instant::now() + SETTLE_WAIT;
    while Instant::now() < deadline && ready(&mut raw, &format!("{p}.logging")).await < 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let state = node.ready_unacked(&inbound).await;
    second.signal("TERM");
    second.wait_exit(Duration::from_secs(30)).await;
    let log = second.log();
    let inspected = dlq_inspect(&p, &toml, &[]).await;
    // `dlq inspect` hands what it read back as its connection closes; a
    // busy broker may not have put it back yet when the drain looks.
    let dlq = format!("{p}.dlq");
    let deadline = Instant::now() + SETTLE_WAIT;
    while Instant::now() < deadline && ready(&mut raw, &dlq).await == 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut found = Vec::new();
    for suffix in QUEUES {
        let messages = raw
            .drain(&format!("{p}.{suffix}"))
            .await
            .map_err(|e| format!("drain {suffix}: {e}"))?;
        found.push((suffix, messages));
    }
    raw.close().await;
    let at_the_limit = if case.queue_type == "quorum" {
        Some(dead_letter_at_the_limit(node, &p, &toml).await)
    } else {
        None
    };
    if let Some(name) = policy {
        node.clear_policy(&name).await;
    }
    let checked = check(case, &found, state, (&first_log, &log)).and_then(|report| {
        let inspect = check_inspect(case, &inspected, at_the_limit.as_ref())?;
        Ok(format!("{report}; {inspect}"))
    });
    checked.map_err(|report| {
        // Both forwarders' logs stay for a failed case, and the second's
        // tail says what it did.
        first.keep_files();
        second.keep_files();
        format!(
            "{report}; copies by publish id: {}; the restarted forwarder's log (kept as {}) \
             ends:\n{}",
            publish_ids(&found),
            second.log_path().display(),
            log_tail(&log, 40)
        )
    })
}

/// Each copy on the service and logging queues as `message_id@publish-id`,
/// so a duplicate says whether it was published twice or once and
/// delivered twice.
fn publish_ids(found: &[(&str, Vec<RawMessage>)]) -> String {
    let mut copies = Vec::new();
    for (suffix, messages) in found
        .iter()
        .filter(|(s, _)| matches!(*s, "service" | "logging"))
    {
        for message in messages {
            // A long-long-int: `l` and 8 bytes, big-endian.
            let id = message
                .header_value("x-switchyard-publish-id")
                .and_then(|v| <[u8; 8]>::try_from(v.get(1..9)?).ok())
                .map_or_else(|| "?".to_string(), |b| i64::from_be_bytes(b).to_string());
            let name = message.message_id.as_deref().unwrap_or("?");
            copies.push(format!("{suffix}:{name}@{id}"));
        }
    }
    copies.join(" ")
}

/// What `dlq inspect` said, how long it took, and whether it succeeded.
#[derive(Debug)]
struct Inspected {
    ok: bool,
    out: String,
    took: Duration,
}

/// `switchyard dlq inspect ARGS` on the configuration `toml`.
async fn dlq_inspect(p: &str, toml: &str, args: &[&str]) -> Inspected {
    let config = std::env::temp_dir().join(format!("{p}-dlq.toml"));
    std::fs::write(&config, toml).unwrap_or_else(|e| panic!("write config: {e}"));
    let began = Instant::now();
    let out = tokio::process::Command::from(clean_command())
        .args(["dlq", "inspect", "--config"])
        .arg(&config)
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| panic!("dlq inspect: {e}"));
    let _ = std::fs::remove_file(&config);
    Inspected {
        ok: out.status.success(),
        out: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        took: began.elapsed(),
    }
}

/// A readable message the quorum inbound queue dead-letters at its limit:
/// taken and handed back by the test until the queue gives it up, then
/// listed by `dlq inspect --json` (and drained).
async fn dead_letter_at_the_limit(node: &PrivateNode, p: &str, toml: &str) -> Inspected {
    let inbound = format!("{p}.in");
    let broker = TestBroker::connect_to(&node.amqp_url(), &format!("{p}-returns")).await;
    let props = lapin::BasicProperties::default()
        .with_message_id("m-limit".into())
        .with_delivery_mode(2);
    broker.publish("", &inbound, b"m-limit", props).await;
    let dlq = format!("{p}.dlq");
    let mut returns = 0;
    let deadline = Instant::now() + SETTLE_WAIT;
    // Until the queue gives it up: a basic.get can come before the broker
    // has put the message back (the nack is not confirmed), so an empty
    // answer is polled again, not taken for the end.
    while returns < 20 && Instant::now() < deadline {
        if broker.try_queue_len(&dlq).await == Some(1) {
            break;
        }
        let got = broker
            .channel()
            .basic_get(inbound.as_str().into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap_or_else(|e| panic!("basic.get: {e}"));
        let Some(message) = got else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let requeue = BasicNackOptions {
            multiple: false,
            requeue: true,
        };
        message
            .delivery
            .nack(requeue)
            .await
            .unwrap_or_else(|e| panic!("basic.nack: {e}"));
        returns += 1;
    }
    wait_until("the queue dead-letters it", SETTLE_WAIT, || async {
        broker.try_queue_len(&dlq).await == Some(1)
    })
    .await;
    let mut inspected = dlq_inspect(p, toml, &["--json"]).await;
    inspected.out = format!("returned {returns} times; {}", inspected.out);
    broker.delete_queue(&dlq).await;
    broker.close().await;
    inspected
}

/// What `dlq inspect` says of the dead letters: the big one cannot be read
/// on a classic queue in `nack` mode or a quorum queue (the broker's
/// headers took it past `frame_max`), and it says so at once; a readable
/// one the quorum queue dead-lettered at its limit shows that reason.
fn check_inspect(
    case: Case,
    big: &Inspected,
    at_the_limit: Option<&Inspected>,
) -> Result<String, String> {
    let unreadable = case.queue_type == "quorum" || case.mode == "nack";
    let said = if unreadable {
        !big.ok
            && big
                .out
                .contains("dead letter 1 of the queue (from its head)")
            && big.out.contains("over the broker's frame_max of")
            && big.took < Duration::from_secs(10)
    } else {
        big.ok && big.out.contains("poison-big")
    };
    if !said {
        return Err(format!("dlq inspect of the big one: {big:?}"));
    }
    if let Some(limit) = at_the_limit {
        let listed = limit.ok
            && limit.out.contains(r#""reason":"x-death:delivery_limit""#)
            && limit
                .out
                .contains("dead-lettered by the broker at the queue's delivery limit");
        if !listed {
            return Err(format!("dlq inspect at the limit: {limit:?}"));
        }
    }
    Ok(format!(
        "dlq inspect: {:?} in {:.1}s",
        big.out.lines().last().unwrap_or_default(),
        big.took.as_secs_f64()
    ))
}

/// The accounting of one case, and the log lines that say what happened.
fn check(
    case: Case,
    found: &[(&str, Vec<RawMessage>)],
    state: Option<(u64, u64)>,
    (first_log, log): (&str, &str),
) -> Result<String, String> {
    let ids = |suffix: &str| -> Vec<String> {
        found
            .iter()
            .find(|(s, _)| *s == suffix)
            .map(|(_, messages)| {
                messages
                    .iter()
                    .filter_map(|m| m.message_id.clone())
                    .collect()
            })
            .unwrap_or_default()
    };
    let losses = log.matches("closed the consuming connection").count();
    let widened = log.contains("consuming at the configured prefetch again");
    let report = format!(
        "inbound (ready, unacked): {state:?}; queues: {:?}; the restarted forwarder lost its \
         consumer {losses} times to the unreadable frame, {} other consumer losses; back to the \
         configured prefetch: {widened}",
        QUEUES.iter().map(|q| (q, ids(q))).collect::<Vec<_>>(),
        log.matches("inbound consumer lost").count(),
    );
    let mut wrong = Vec::new();
    if state != Some((0, 0)) {
        wrong.push("the inbound queue is not empty");
    }
    let both = ["m000000".to_string(), "m000001".to_string()];
    if ids("service") != both || ids("logging") != both {
        wrong.push("the messages behind the big one are not forwarded once to each branch");
    }
    if !ids("service.backup").is_empty() || !ids("logging.backup").is_empty() {
        wrong.push("a backup got a copy");
    }
    if ids("dlq") != ["poison-big".to_string()] {
        wrong.push("the big one is not dead-lettered once, alone");
    }
    let dead = found
        .iter()
        .find(|(s, _)| *s == "dlq")
        .and_then(|(_, m)| m.first());
    let quorum = case.queue_type == "quorum";
    let reason = match (quorum, case.mode) {
        (true, _) => dead.is_some_and(|m| carries(m, "x-death", "delivery_limit")),
        (false, "nack") => dead.is_some_and(|m| carries(m, "x-death", "rejected")),
        (false, _) => dead.is_some_and(|m| carries(m, "x-switchyard-reason", "rejected")),
    };
    if !reason {
        wrong.push("the dead letter does not carry the expected reason");
    }
    if quorum && (losses == 0 || !widened) {
        wrong.push("the log does not show the losses and the return to the prefetch");
    }
    // What startup said of the queue's delivery limit.
    let limit_line = if case.existing {
        "inbound queue has no x-delivery-limit"
    } else {
        "inbound queue has a delivery limit"
    };
    if quorum != first_log.contains(limit_line) {
        wrong.push("startup does not say what the queue's delivery limit is");
    }
    if wrong.is_empty() {
        Ok(report)
    } else {
        Err(format!("{}: {report}", wrong.join("; ")))
    }
}

/// Creates the inbound queue as an operator would, a quorum queue without
/// a delivery limit or dead-letter arguments, and runs the policy line
/// `switchyard check` prints for the configuration `toml`, as printed, on
/// `node`. Returns the policy's name.
async fn give_it_a_delivery_limit(node: &PrivateNode, p: &str, toml: &str) -> String {
    let broker = TestBroker::connect_to(&node.amqp_url(), &format!("{p}-operator")).await;
    let args = field_table([("x-queue-type", AMQPValue::LongString("quorum".into()))]);
    broker.declare_queue_with(&format!("{p}.in"), args).await;
    broker.close().await;
    let config = std::env::temp_dir().join(format!("{p}-check.toml"));
    std::fs::write(&config, toml).unwrap_or_else(|e| panic!("write config: {e}"));
    let out = clean_command()
        .arg("check")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap_or_else(|e| panic!("check: {e}"));
    let _ = std::fs::remove_file(&config);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "check: {stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("delivery limit: "))
        .and_then(|l| l.split_once(": rabbitmqctl "))
        .map(|(_, command)| command.trim_end_matches(')'))
        .unwrap_or_else(|| panic!("check prints no policy line: {stdout}"));
    let command = format!("rabbitmqctl -n {} {line}", node.node_name());
    let status = tokio::process::Command::new("sh")
        .args(["-c", &command])
        .status()
        .await
        .unwrap_or_else(|e| panic!("{command}: {e}"));
    assert!(status.success(), "{command}: {status}");
    format!("switchyard-{p}.in")
}

/// Ready messages and consumers of `queue`, on a connection of its own.
async fn counts(addr: std::net::SocketAddr, queue: &str) -> Option<(u32, u32)> {
    let mut raw = RawClient::connect(addr, "/").await.ok()?;
    let counts = raw.queue_counts(queue).await.ok();
    raw.close().await;
    counts
}

async fn ready(raw: &mut RawClient, queue: &str) -> u32 {
    raw.message_count(queue).await.unwrap_or(u32::MAX)
}

async fn publish(
    raw: &mut RawClient,
    queue: &str,
    props: &RawProperties,
    body: &[u8],
) -> Result<(), String> {
    match raw.publish("", queue, props, body).await {
        Ok(RawConfirm::Ack) => Ok(()),
        other => Err(format!("publish to {queue}: {other:?}")),
    }
}

fn plain(id: &str) -> RawProperties {
    RawProperties {
        message_id: Some(id.to_string()),
        delivery_mode: Some(2),
        headers: Vec::new(),
        ..Default::default()
    }
}

/// A message whose content header frame is `BIG_HEADER_MARGIN` bytes under
/// `frame_max`.
fn big_properties(id: &str, frame_max: u32) -> RawProperties {
    let mut props = plain(id);
    props
        .headers
        .push(("filler".to_string(), encode::long_string(b"")));
    let target = frame_max as usize - BIG_HEADER_MARGIN;
    let filler = target - RawClient::header_frame_size(&props);
    props.headers.pop();
    props.headers.push((
        "filler".to_string(),
        encode::long_string(&vec![b'f'; filler]),
    ));
    props
}

/// Whether header `key` of `message` holds the long string `text`
/// somewhere (for `x-death`, in one of its tables).
fn carries(message: &RawMessage, key: &str, text: &str) -> bool {
    let mut wanted = vec![b'S'];
    wanted.extend(u32::try_from(text.len()).unwrap_or(0).to_be_bytes());
    wanted.extend(text.as_bytes());
    message
        .header_value(key)
        .is_some_and(|value| value.windows(wanted.len()).any(|w| w == wanted))
}
