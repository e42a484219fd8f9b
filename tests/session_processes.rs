//! Sessions with the real binary: SIGKILL mid-session and a restart (each
//! session forwarded again from its first message, whole and in order after
//! the duplicates of the first run), a hot standby on a single-active-consumer
//! queue completing the sessions of the forwarder it replaces, and two
//! forwarders behind a consistent-hash exchange (the example configurations
//! in `config/`), each session on one of them.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lapin::options::ExchangeDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, ExchangeKind};
use support::harness::{Process, log_tail, seed_toml, top_toml, wait_consumers};
use support::sessions::*;
use support::{
    BULK_TIMEOUT, DEFAULT_TIMEOUT, TestBroker, amqp_str, amqp_url, delete_all_with_prefix,
    field_table, ready_unacked, unique_prefix, wait_for, wait_until,
};

/// Message `seq` of session `id` (string id), with the end header `true` when `end`.
fn session_message(id: &str, seq: u32, end: bool) -> Outgoing {
    let mut headers = FieldTable::default();
    headers.insert(ID.into(), amqp_str(id));
    headers.insert(SEQ.into(), AMQPValue::LongInt(seq as i32));
    if end {
        headers.insert(END.into(), AMQPValue::Boolean(true));
    }
    let props = BasicProperties::default()
        .with_message_id(format!("{id}/{seq}").into())
        .with_delivery_mode(2)
        .with_headers(headers);
    (format!("{id}:{seq:03}").into_bytes(), props)
}

/// A message of no session, `message_id = body = id`.
fn independent(id: &str) -> Outgoing {
    let props = BasicProperties::default()
        .with_message_id(id.into())
        .with_delivery_mode(2);
    (id.as_bytes().to_vec(), props)
}

/// Messages `seqs` of every session, interleaved (all sessions' message 0,
/// then all 1...), the one numbered `last` ending each session; an
/// independent message (`<tag>-<n>`) after each round when `tag` is given.
fn interleaved(
    sessions: &[String],
    seqs: std::ops::Range<u32>,
    last: u32,
    tag: Option<&str>,
) -> (Vec<Outgoing>, Vec<String>) {
    let mut out = Vec::new();
    let mut singles = Vec::new();
    for seq in seqs {
        for id in sessions {
            out.push(session_message(id, seq, seq == last));
        }
        if let Some(tag) = tag {
            let id = format!("{tag}-{seq}");
            out.push(independent(&id));
            singles.push(id);
        }
    }
    (out, singles)
}

/// A session's copies on a branch after a crash and a second forwarding: a
/// prefix `0..j` from before it (copies confirmed but never acked), then
/// the whole session `0..n` in order. Returns `j`, the duplicates.
fn prefix_then_whole(seqs: &[u32], n: u32) -> Option<usize> {
    let j = seqs.len().checked_sub(n as usize)?;
    (seqs[..j] == whole(j as u32)[..] && seqs[j..] == whole(n)[..]).then_some(j)
}

/// Waits until the broker has requeued everything a killed consumer held.
async fn wait_requeued(queue: &str) {
    wait_until(
        &format!("{queue} has no unacked messages"),
        DEFAULT_TIMEOUT,
        || async { ready_unacked(queue).await.is_some_and(|(_, u)| u == 0) },
    )
    .await;
}

async fn stop(process: &mut Process, what: &str) {
    process.signal("TERM");
    let code = process.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(
        code,
        Some(0),
        "{what}: TERM must exit 0; log tail:\n{}",
        log_tail(&process.log(), 30)
    );
}

/// The seed scenario (two branches, republish) with sessions on and
/// `inbound_extra` added to `[inbound]`; the instance is named `name`.
fn seed_with_sessions(p: &str, name: &str, inbound_extra: &str, sessions_extra: &str) -> String {
    let top = top_toml(p, "republish", 5000, 1000)
        .replace(&format!("name = \"{p}\""), &format!("name = \"{name}\""))
        .replace(
            "prefetch = 1000\n",
            &format!("prefetch = 1000\n{inbound_extra}\n"),
        );
    seed_toml(p, &top) + &sessions_toml(sessions_extra)
}

/// Checks every session on the seed scenario's branches after a forwarder
/// died mid-session and another forwarded everything again: per branch, on
/// the primary endpoint, a prefix then the whole session in order, no
/// replay marks (a redelivery is not a failover). Returns, per branch, the
/// duplicated copies and how many sessions had any.
async fn account_after_crash(
    broker: &TestBroker,
    p: &str,
    sessions: &[String],
    per: u32,
    singles: &[String],
    logs: &str,
) -> Vec<(&'static str, usize, usize)> {
    let mut problems = Vec::new();
    let mut report = Vec::new();
    let dlq = broker.get_all(&format!("{p}.dlq")).await;
    let dead = by_session(&dlq);
    for branch in ["service", "logging"] {
        let primary = broker.get_all(&format!("{p}.{branch}")).await;
        let backup = broker.get_all(&format!("{p}.{branch}.backup")).await;
        if !backup.is_empty() {
            problems.push(format!(
                "{branch}: {} copies on the backup, which nothing made necessary",
                backup.len()
            ));
        }
        let got = by_session(&primary);
        let (mut dups, mut with_dups) = (0, 0);
        for id in sessions {
            if let Some(dead) = dead.get(id) {
                if seqs(dead) != whole(per) {
                    problems.push(format!("{id}: dead-lettered partly: {:?}", seqs(dead)));
                }
                continue;
            }
            let copies = got.get(id).cloned().unwrap_or_default();
            match prefix_then_whole(&seqs(&copies), per) {
                Some(j) => {
                    dups += j;
                    with_dups += usize::from(j > 0);
                }
                None => problems.push(format!(
                    "{branch}: {id} is not a prefix then whole and in order: {:?}",
                    seqs(&copies)
                )),
            }
            if copies.iter().any(|m| m.header(REPLAY).is_some()) {
                problems.push(format!(
                    "{branch}: {id} has copies marked {REPLAY}, but no endpoint failed"
                ));
            }
        }
        let counts = independents(&primary);
        for id in singles {
            match counts.get(id) {
                None => problems.push(format!("{branch}: independent {id} lost")),
                Some(n) => dups += n - 1,
            }
        }
        println!(
            "{branch}: {} copies; {dups} duplicates ({with_dups} sessions repeated a prefix)",
            primary.len()
        );
        report.push((branch, dups, with_dups));
    }
    println!("dead-lettered: {} messages", dlq.len());
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}\nlogs:\n{logs}",
        problems.len(),
        problems[..problems.len().min(30)].join("\n")
    );
    report
}

// ---------------------------------------------------------------------------
// 7. SIGKILL mid-session

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_session_forwards_every_session_again_whole_after_the_restart() {
    const SESSIONS: usize = 30;
    const PER: u32 = 10;
    const FIRST_PART: u32 = 6;
    let p = unique_prefix("sess-sigkill");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let service = format!("{p}.service");
    let toml = seed_with_sessions(&p, &p, "", "max_open = 32\nmax_messages = 20");
    let sessions: Vec<String> = (0..SESSIONS).map(|s| format!("k{s:02}")).collect();

    // The first part of every session (no end yet) and one independent
    // message per round; killed while it is being forwarded.
    let mut first = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;
    let (part1, mut singles) = interleaved(&sessions, 0..FIRST_PART, PER - 1, Some("one"));
    publish_to(&broker, "", &inbound, &part1).await;
    let kill_at = (part1.len() / 2) as u32;
    let seen = wait_for(
        &format!("{service} holds at least {kill_at} copies"),
        BULK_TIMEOUT,
        || async {
            let n = broker.queue_len(&service).await;
            (n >= kill_at).then_some(n)
        },
    )
    .await;
    first.signal("KILL");
    assert_eq!(first.wait_exit(Duration::from_secs(10)).await, None);
    let first_log = first.log();
    wait_consumers(&broker, &inbound, 0).await;
    wait_requeued(&inbound).await;
    let (ready, _) = ready_unacked(&inbound).await.expect("inbound exists");
    println!(
        "killed with {seen} of {} first-part copies on service; {ready} requeued",
        part1.len()
    );

    // The restart forwards the requeued messages again, then the rest.
    let started = Instant::now();
    let mut second = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;
    let (part2, more) = interleaved(&sessions, FIRST_PART..PER, PER - 1, Some("two"));
    singles.extend(more);
    publish_to(&broker, "", &inbound, &part2).await;
    wait_settled(&inbound, BULK_TIMEOUT).await;
    println!("the restart settled everything in {:?}", started.elapsed());
    stop(&mut second, "the restarted forwarder").await;

    let logs = format!(
        "first run:\n{}\nsecond run:\n{}",
        log_tail(&first_log, 20),
        log_tail(&second.log(), 20)
    );
    let report = account_after_crash(&broker, &p, &sessions, PER, &singles, &logs).await;
    let (_, service_dups, in_flight) = report[0];
    assert!(
        in_flight >= 20,
        "at least 20 sessions must have been in flight at the kill (had copies before it): \
         {in_flight}"
    );
    assert!(service_dups > 0, "the kill must have duplicated something");
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    delete_all_with_prefix(&p).await;
}

// ---------------------------------------------------------------------------
// 8. Hot standby

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_standby_completes_the_sessions_of_a_killed_forwarder() {
    const SESSIONS: usize = 20;
    const PER: u32 = 10;
    const FIRST_PART: u32 = 5;
    let p = unique_prefix("sess-standby");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let service = format!("{p}.service");
    let sac = "single_active_consumer = true";
    let (name_a, name_b) = (format!("{p}-a"), format!("{p}-b"));
    // Room for all 20 sessions at once (none waits for a slot).
    let limits = "max_open = 32\nmax_messages = 20";
    let toml_a = seed_with_sessions(&p, &name_a, sac, limits);
    let toml_b = seed_with_sessions(&p, &name_b, sac, limits);

    // The first to register is the active consumer; the second waits.
    let mut active = Process::spawn(&name_a, &toml_a);
    wait_consumers(&broker, &inbound, 1).await;
    let mut standby = Process::spawn(&name_b, &toml_b);
    wait_consumers(&broker, &inbound, 2).await;

    let sessions: Vec<String> = (0..SESSIONS).map(|s| format!("h{s:02}")).collect();
    let (part1, mut singles) = interleaved(&sessions, 0..FIRST_PART, PER - 1, Some("one"));
    publish_to(&broker, "", &inbound, &part1).await;
    for queue in [&service, &format!("{p}.logging")] {
        broker
            .await_count(queue, part1.len() as u32, BULK_TIMEOUT)
            .await;
    }
    active.signal("KILL");
    assert_eq!(active.wait_exit(Duration::from_secs(10)).await, None);
    let active_log = active.log();

    // The rest goes to the standby, which has the killed one's sessions
    // redelivered from their first message.
    let started = Instant::now();
    let (part2, more) = interleaved(&sessions, FIRST_PART..PER, PER - 1, Some("two"));
    singles.extend(more);
    publish_to(&broker, "", &inbound, &part2).await;
    wait_settled(&inbound, BULK_TIMEOUT).await;
    println!("the standby settled everything in {:?}", started.elapsed());
    assert!(
        standby.exited().is_none(),
        "the standby must still run; log tail:\n{}",
        log_tail(&standby.log(), 30)
    );
    stop(&mut standby, "the standby").await;

    let logs = format!(
        "killed forwarder:\n{}\nstandby:\n{}",
        log_tail(&active_log, 20),
        log_tail(&standby.log(), 20)
    );
    let report = account_after_crash(&broker, &p, &sessions, PER, &singles, &logs).await;
    for (branch, _, repeated) in report {
        assert_eq!(
            repeated, SESSIONS,
            "{branch}: every session was mid-way on the killed forwarder (all its first \
             part confirmed), so the standby forwards each again from message 0"
        );
    }
    delete_all_with_prefix(&p).await;
}

// ---------------------------------------------------------------------------
// 9. Scale-out over a consistent-hash exchange

/// `config/sessions-scale-out-<x>.toml` with the test's prefix for every
/// queue, exchange and instance name, the test broker's URI, and no admin
/// listener (the example's ports may be taken).
fn example_config(p: &str, x: &str) -> String {
    let path = format!(
        "{}/config/sessions-scale-out-{x}.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let (text, _admin) = text
        .split_once("\n[admin]")
        .unwrap_or_else(|| panic!("{path} has no [admin] table"));
    let text = text
        .replace("sessions.", &format!("{p}."))
        .replace(&format!("\"sessions-{x}\""), &format!("\"{p}-{x}\""))
        .replace("amqp://guest:guest@127.0.0.1:5672/%2f", &amqp_url());
    for needle in [
        format!("queue = \"{p}.in.{x}\""),
        format!("name = \"{p}-{x}\""),
        format!("forwarded-by = \"{p}-{x}\""),
        "single_active_consumer = true".to_owned(),
        format!("id_header = \"{ID}\""),
    ] {
        assert!(text.contains(&needle), "{path}: expected {needle:?}");
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_scale_out_keeps_each_session_on_one_forwarder() {
    const SESSIONS: usize = 40;
    const PER: u32 = 10;
    let p = unique_prefix("sess-scale");
    let broker = TestBroker::connect(&p).await;
    let exchange = format!("{p}.in");

    // The exchange hashes the session id header (the operator declares it).
    broker
        .channel()
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Custom("x-consistent-hash".into()),
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            field_table([("hash-header", amqp_str(ID))]),
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot declare an x-consistent-hash exchange: this test needs the plugin on \
                 the shared broker (`rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`, \
                 as .ci/run does): {e}"
            )
        });

    let mut forwarders = Vec::new();
    for x in ["a", "b"] {
        let queue = format!("{p}.in.{x}");
        let process = Process::spawn(&format!("{p}-{x}"), &example_config(&p, x));
        wait_consumers(&broker, &queue, 1).await;
        broker.bind(&queue, &exchange, "1").await;
        forwarders.push(process);
    }

    let sessions: Vec<String> = (0..SESSIONS).map(|s| format!("c{s:02}")).collect();
    let (messages, _) = interleaved(&sessions, 0..PER, PER - 1, None);
    let started = Instant::now();
    publish_to(&broker, &exchange, "", &messages).await;
    let mut spread = Vec::new();
    for x in ["a", "b"] {
        let queue = format!("{p}.in.{x}");
        wait_settled(&queue, BULK_TIMEOUT).await;
    }
    println!(
        "{} messages settled by two forwarders in {:?}",
        messages.len(),
        started.elapsed()
    );
    let logs: Vec<String> = forwarders.iter().map(|f| log_tail(&f.log(), 20)).collect();
    for (f, x) in forwarders.iter_mut().zip(["a", "b"]) {
        stop(f, &format!("forwarder {x}")).await;
    }

    let mut problems = Vec::new();
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for branch in ["service", "logging"] {
        let copies = broker.get_all(&format!("{p}.{branch}.primary")).await;
        let backup = broker.get_all(&format!("{p}.{branch}.backup")).await;
        if !backup.is_empty() {
            problems.push(format!("{branch}: {} copies on the backup", backup.len()));
        }
        let got = by_session(&copies);
        for id in &sessions {
            let msgs = got.get(id).cloned().unwrap_or_default();
            if seqs(&msgs) != whole(PER) {
                problems.push(format!(
                    "{branch}: {id} not whole and in order: {:?}",
                    seqs(&msgs)
                ));
            }
            let by: Vec<String> = msgs
                .iter()
                .map(|m| m.header_str("forwarded-by").unwrap_or_default())
                .collect();
            if let Some(first) = by.first() {
                if by.iter().any(|f| f != first) {
                    problems.push(format!("{branch}: {id} forwarded by several: {by:?}"));
                }
                let previous = owner.entry(id.clone()).or_insert_with(|| first.clone());
                if previous != first {
                    problems.push(format!("{id}: service by {previous}, logging by {first}"));
                }
            }
        }
        if got.len() != SESSIONS {
            problems.push(format!("{branch}: {} sessions, not {SESSIONS}", got.len()));
        }
    }
    for x in ["a", "b"] {
        let name = format!("{p}-{x}");
        spread.push((name.clone(), owner.values().filter(|o| **o == name).count()));
    }
    println!("sessions per forwarder: {spread:?}");
    let dlq = broker.get_all(&format!("{p}.dlq")).await;
    if !dlq.is_empty() {
        problems.push(format!("{} dead letters", dlq.len()));
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}\nlogs:\n{}",
        problems.len(),
        problems[..problems.len().min(30)].join("\n"),
        logs.join("\n---\n")
    );
    assert!(
        spread.iter().all(|(_, n)| *n > 0),
        "both forwarders must get some sessions: {spread:?}"
    );
    delete_all_with_prefix(&p).await;
}

// ---------------------------------------------------------------------------
// A crash while a session is being dead-lettered

/// A session whose branch is exhausted is dead-lettered whole; the
/// dead-letter queue takes two of its five messages and then refuses the
/// rest, so the forwarder is still dead-lettering the set when it is
/// SIGKILLed. The broker redelivers what was unacked and the restart
/// forwards it, with the session's end, to the healed endpoint. The session
/// must end up whole somewhere: forwarded again from its first message, or
/// dead-lettered whole, never a tail forwarded as if it were the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_a_session_is_dead_lettered_leaves_it_whole() {
    let p = unique_prefix("sess-dl-crash");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let primary = format!("{p}.primary");
    let dlq = format!("{p}.dlq");
    let dlx = format!("{p}.dlx");
    // Room for two dead letters; the third is refused (nacked) until there is room.
    broker
        .declare_queue_with(
            &dlq,
            field_table([
                ("x-max-length", AMQPValue::LongLongInt(2)),
                ("x-overflow", amqp_str("reject-publish")),
            ]),
        )
        .await;
    broker.declare_exchange(&dlx, ExchangeKind::Direct).await;
    broker.bind(&dlq, &dlx, &dlq).await;
    // The dead-letter queue is the test's own, limited; the forwarder must not declare it.
    let toml = session_branch_toml(&p, false).replace(&format!("queue = \"{dlq}\"\n"), "")
        + &sessions_toml("max_open = 4");

    let mut first = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;
    let x = "x";
    let opening: Vec<Outgoing> = (0..4).map(|seq| session_message(x, seq, false)).collect();
    publish_to(&broker, "", &inbound, &opening).await;
    broker.await_count(&primary, 4, DEFAULT_TIMEOUT).await;
    let before = broker.get_all(&primary).await;
    assert_eq!(seqs(&before.iter().collect::<Vec<_>>()), whole(4));
    assert_eq!(broker.delete_queue(&primary).await, 0);

    // Message 4 exhausts the branch: 0 and 1 are dead-lettered, 2 is refused.
    publish_to(&broker, "", &inbound, &[session_message(x, 4, false)]).await;
    broker.await_count(&dlq, 2, DEFAULT_TIMEOUT).await;
    let held = wait_for(
        "the session's dead-lettering to stall on the full queue",
        DEFAULT_TIMEOUT,
        || async {
            let log = first.log();
            let stalled = log.contains("dead letter not confirmed");
            let counts = ready_unacked(&inbound).await;
            (stalled && counts.is_some_and(|(r, _)| r == 0)).then_some(counts)
        },
    )
    .await;
    println!("dead-lettering stalled with {inbound} at (ready, unacked) = {held:?}");
    first.signal("KILL");
    assert_eq!(first.wait_exit(Duration::from_secs(10)).await, None);
    let first_log = first.log();
    wait_consumers(&broker, &inbound, 0).await;
    wait_requeued(&inbound).await;
    let requeued = ready_unacked(&inbound).await.map(|(r, _)| r);
    let dead_first = broker.get_all(&dlq).await;

    // The restart declares the primary's queue again; the session ends.
    let mut second = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;
    publish_to(&broker, "", &inbound, &[session_message(x, 5, true)]).await;
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;
    stop(&mut second, "the restarted forwarder").await;

    let after = broker.get_all(&primary).await;
    let dead_after = broker.get_all(&dlq).await;
    let service_seqs = seqs(&by_session(&after).remove(x).unwrap_or_default());
    let dead = [dead_first, dead_after].concat();
    let dead_seqs = seqs(&by_session(&dead).remove(x).unwrap_or_default());
    println!(
        "requeued after the kill: {requeued:?}; service after the restart: {service_seqs:?}; \
         dead letters: {dead_seqs:?}"
    );
    let whole_on_service = service_seqs == whole(6);
    let whole_dead = [5, 6]
        .iter()
        .any(|n| prefix_then_whole(&dead_seqs, *n).is_some());
    assert!(
        whole_on_service || (whole_dead && service_seqs.is_empty()),
        "session {x} is neither whole on the service after the restart ({service_seqs:?}) nor \
         dead-lettered whole ({dead_seqs:?}): the first run acked part of the set while \
         dead-lettering it, and the restart forwarded the rest as if it were the session\n\
         first run:\n{}\nrestart:\n{}",
        log_tail(&first_log, 12),
        log_tail(&second.log(), 12)
    );
    delete_all_with_prefix(&p).await;
}
