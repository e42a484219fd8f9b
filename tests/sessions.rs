//! Sessions with the in-process forwarder on the shared broker: every
//! session whole and in order on one endpoint per branch across a failover
//! (earlier messages replayed and marked), whole-session dead letters with
//! their reason (`exhausted`, `session-timeout`, `session-too-large`,
//! `session-closed`), a session id over its length limit refused alone as
//! `malformed`, session slots that hold a new session back while other
//! traffic flows, memory bounded by the session limits with the real binary,
//! `check` refusing slots that could fill the prefetch, and a session's
//! failovers, replays and dead-letter records counted and written as any
//! message's are, so a redrive sends only what is missing.

use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::{InProcess, Process, clean_command, wait_consumers};
use support::sessions::*;
use support::{
    BULK_TIMEOUT, DEFAULT_TIMEOUT, Message, Metrics, TestBroker, array_names,
    delete_all_with_prefix, ready_unacked, unique_prefix, wait_for, wait_until,
};

// ---------------------------------------------------------------------------
// Building messages

/// A session id as the producer sends it (a string or a number) and its
/// text form, which is the id switchyard uses.
#[derive(Clone, Debug)]
struct Session {
    id: AMQPValue,
    text: String,
}

impl Session {
    fn named(name: &str) -> Self {
        Self {
            id: AMQPValue::LongString(name.into()),
            text: name.to_owned(),
        }
    }

    fn numbered(n: i64) -> Self {
        Self {
            id: AMQPValue::LongLongInt(n),
            text: n.to_string(),
        }
    }

    /// Message `seq` of the session; `end` is the end header's value, if any.
    fn message(&self, seq: u32, end: Option<AMQPValue>) -> Outgoing {
        let body = format!("{}:{seq:03}", self.text).into_bytes();
        self.message_with_body(seq, end, body)
    }

    fn message_with_body(&self, seq: u32, end: Option<AMQPValue>, body: Vec<u8>) -> Outgoing {
        let mut headers = FieldTable::default();
        headers.insert(ID.into(), self.id.clone());
        headers.insert(SEQ.into(), AMQPValue::LongInt(seq as i32));
        if let Some(end) = end {
            headers.insert(END.into(), end);
        }
        let props = BasicProperties::default()
            .with_message_id(format!("{}/{seq}", self.text).into())
            .with_headers(headers);
        (body, props)
    }

    /// Messages `range` of the session, the one numbered `last` with the end
    /// header `true`.
    fn messages(&self, range: std::ops::Range<u32>, last: u32) -> Vec<Outgoing> {
        range
            .map(|seq| self.message(seq, (seq == last).then(end_true)))
            .collect()
    }
}

fn end_true() -> AMQPValue {
    AMQPValue::Boolean(true)
}

/// A message of no session, with `message_id = body = id`; `session_header`
/// is sent as the id header when given (an empty one makes no session).
fn independent(id: &str, session_header: Option<AMQPValue>) -> Outgoing {
    let mut props = BasicProperties::default().with_message_id(id.into());
    if let Some(value) = session_header {
        let mut headers = FieldTable::default();
        headers.insert(ID.into(), value);
        props = props.with_headers(headers);
    }
    (id.as_bytes().to_vec(), props)
}

async fn publish(broker: &TestBroker, queue: &str, messages: &[Outgoing]) {
    publish_to(broker, "", queue, messages).await;
}

// ---------------------------------------------------------------------------
// Reading messages back

/// The messages of session `id` in `sessions` (none if it has none).
fn of_session<'a>(sessions: &BTreeMap<String, Vec<&'a Message>>, id: &str) -> Vec<&'a Message> {
    sessions.get(id).cloned().unwrap_or_default()
}

/// A dead letter of session `id` with reason `reason` (republish mode).
fn assert_session_dead_letter(m: &Message, id: &str, reason: &str) {
    assert_eq!(
        m.header("x-switchyard-session"),
        Some(&AMQPValue::LongString(id.into())),
        "x-switchyard-session of dead letter {}",
        message_id(m)
    );
    assert_eq!(
        m.header_str("x-switchyard-reason").as_deref(),
        Some(reason),
        "x-switchyard-reason of dead letter {}",
        message_id(m)
    );
}

// ---------------------------------------------------------------------------
// Waiting

/// Waits until `queue` holds exactly `n` messages and returns them all.
async fn take(broker: &TestBroker, queue: &str, n: u32) -> Vec<Message> {
    broker.await_count(queue, n, DEFAULT_TIMEOUT).await;
    broker.get_all(queue).await
}

fn sessions_open(forwarder: &InProcess) -> f64 {
    Metrics::parse(&forwarder.telemetry().render()).value("switchyard_sessions_open", &[])
}

async fn wait_sessions_open(forwarder: &InProcess, n: u32) {
    wait_until(
        &format!("switchyard_sessions_open is {n}"),
        DEFAULT_TIMEOUT,
        || async { sessions_open(forwarder) == f64::from(n) },
    )
    .await;
}

// ---------------------------------------------------------------------------
// 1. Failover mid-session

/// 300 sessions of 10 messages, five at a time interleaved with independent
/// messages; halfway through, with five sessions open, the primary service
/// queue is deleted and the backup takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stay_whole_and_in_order_when_the_primary_disappears_mid_session() {
    const SESSIONS: usize = 300;
    const PER: u32 = 10;
    const AT_ONCE: usize = 5;
    const PAUSE_GROUP: usize = 30;
    const PAUSE_AFTER: u32 = 4;
    let p = unique_prefix("sess-failover");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let primary = format!("{p}.service");
    let toml = Forwarder::new(&p)
        .mode("republish")
        .seed(&p)
        .sessions(&[("max_open", 8.into()), ("max_messages", 16.into())])
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;

    // Even sessions have string ids, odd ones numeric ids. The end header
    // comes as AMQP true or as the string "true" / "True"; some earlier
    // messages carry an end header that is not true.
    let sessions: Vec<Session> = (0..SESSIONS)
        .map(|s| {
            if s % 2 == 0 {
                Session::named(&format!("s{s:04}"))
            } else {
                Session::numbered(100_000 + s as i64)
            }
        })
        .collect();
    let end_for = |s: usize, seq: u32| -> Option<AMQPValue> {
        if seq == PER - 1 {
            return Some(match s % 4 {
                2 => AMQPValue::LongString("true".into()),
                3 => AMQPValue::LongString("True".into()),
                _ => end_true(),
            });
        }
        match s % 6 {
            0 => Some(AMQPValue::Boolean(false)),
            3 => Some(AMQPValue::LongString("false".into())),
            _ => None,
        }
    };
    let mut before = Vec::new();
    let mut after = Vec::new();
    let mut independent_ids = Vec::new();
    for (group, members) in sessions.chunks(AT_ONCE).enumerate() {
        for seq in 0..PER {
            let out = if (group, seq) < (PAUSE_GROUP, PAUSE_AFTER) {
                &mut before
            } else {
                &mut after
            };
            for (i, session) in members.iter().enumerate() {
                out.push(session.message(seq, end_for(group * AT_ONCE + i, seq)));
            }
            if seq % 2 == 0 {
                let id = format!("i{:04}", independent_ids.len());
                // Every third independent message has an empty session id.
                let header =
                    (independent_ids.len() % 3 == 0).then(|| AMQPValue::LongString("".into()));
                out.push(independent(&id, header));
                independent_ids.push(id);
            }
        }
    }
    let total = before.len() + after.len();

    // Up to the pause: everything forwarded to the primaries, the five open
    // sessions' messages held unacked.
    publish(&broker, &inbound, &before).await;
    for queue in [&primary, &format!("{p}.logging")] {
        broker
            .await_count(queue, before.len() as u32, BULK_TIMEOUT)
            .await;
    }
    let held = (AT_ONCE as u64) * u64::from(PAUSE_AFTER);
    wait_until(
        &format!("{inbound} holds the {held} messages of the open sessions unacked"),
        DEFAULT_TIMEOUT,
        || async { ready_unacked(&inbound).await == Some((0, held)) },
    )
    .await;
    wait_sessions_open(&forwarder, AT_ONCE as u32).await;

    // The primary goes away (its copies are kept for the accounting).
    let mut on_primary = broker.get_all(&primary).await;
    assert_eq!(on_primary.len(), before.len());
    assert_eq!(
        broker.delete_queue(&primary).await,
        0,
        "nothing may reach the primary while paused"
    );

    let started = Instant::now();
    publish(&broker, &inbound, &after).await;
    broker
        .await_count(&format!("{p}.logging"), total as u32, BULK_TIMEOUT)
        .await;
    wait_settled(&inbound, BULK_TIMEOUT).await;
    println!(
        "{total} messages ({SESSIONS} sessions of {PER}, {} independent); the {} after the \
         pause settled in {:?}",
        independent_ids.len(),
        after.len(),
        started.elapsed()
    );
    wait_sessions_open(&forwarder, 0).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    if broker.queue_exists(&primary).await {
        on_primary.extend(broker.get_all(&primary).await);
    }
    let on_backup = broker.get_all(&format!("{p}.service.backup")).await;
    let logging = broker.get_all(&format!("{p}.logging")).await;
    let logging_backup = broker.get_all(&format!("{p}.logging.backup")).await;
    let dlq = broker.get_all(&format!("{p}.dlq")).await;

    let primary_sessions = by_session(&on_primary);
    let backup_sessions = by_session(&on_backup);
    let logging_sessions = by_session(&logging);
    let logging_backup_sessions = by_session(&logging_backup);
    let dead_sessions = by_session(&dlq);
    let (mut on_primary_only, mut on_backup_only, mut switched, mut replays) = (0, 0, 0, 0);
    let mut problems = Vec::new();
    for session in &sessions {
        let id = &session.text;
        let get = |m| of_session(m, id);
        let (p_msgs, b_msgs, dead) = (
            get(&primary_sessions),
            get(&backup_sessions),
            get(&dead_sessions),
        );
        if !dead.is_empty() {
            if seqs(&dead) != whole(PER) {
                problems.push(format!("{id}: dead-lettered partly: {:?}", seqs(&dead)));
            }
            for m in &dead {
                assert_eq!(
                    m.header("x-switchyard-session"),
                    Some(&AMQPValue::LongString(id.as_str().into())),
                    "{id}: dead letter without its session"
                );
            }
            continue;
        }
        let (p_seqs, b_seqs) = (seqs(&p_msgs), seqs(&b_msgs));
        if p_seqs == whole(PER) && b_seqs.is_empty() {
            on_primary_only += 1;
            if p_msgs.iter().any(|m| is_replay(m)) {
                problems.push(format!("{id}: replay mark without a failover"));
            }
        } else if b_seqs == whole(PER) && p_seqs == whole(p_seqs.len() as u32) {
            // On the backup whole; the primary got a prefix before the switch,
            // and exactly that prefix was replayed (and marked) on the backup.
            if p_seqs.is_empty() {
                on_backup_only += 1;
            } else {
                switched += 1;
            }
            let marks: Vec<bool> = b_msgs.iter().map(|m| is_replay(m)).collect();
            let expected: Vec<bool> = (0..PER).map(|seq| (seq as usize) < p_seqs.len()).collect();
            if marks != expected {
                problems.push(format!(
                    "{id}: replay marks on the backup {marks:?}, expected {expected:?} (the \
                     primary had {p_seqs:?})"
                ));
            }
            replays += p_seqs.len();
        } else {
            problems.push(format!(
                "{id}: not whole and in order on one service endpoint: primary {p_seqs:?}, \
                 backup {b_seqs:?}"
            ));
        }
        let (l, lb) = (
            seqs(&get(&logging_sessions)),
            seqs(&get(&logging_backup_sessions)),
        );
        if !((l == whole(PER) && lb.is_empty()) || (lb == whole(PER) && l.is_empty())) {
            problems.push(format!(
                "{id}: logging not whole and in order: primary {l:?}, backup {lb:?}"
            ));
        }
        if get(&logging_sessions).iter().any(|m| is_replay(m)) {
            problems.push(format!("{id}: replay mark on logging, which never failed"));
        }
    }
    let stray: Vec<&String> = primary_sessions
        .keys()
        .chain(backup_sessions.keys())
        .chain(logging_sessions.keys())
        .filter(|id| !sessions.iter().any(|s| &&s.text == id))
        .collect();
    if !stray.is_empty() {
        problems.push(format!("sessions never published: {stray:?}"));
    }

    // Independent messages: once per branch, never marked.
    let service_single = {
        let mut all = independents(&on_primary);
        for (id, n) in independents(&on_backup) {
            *all.entry(id).or_insert(0) += n;
        }
        all
    };
    let logging_single = {
        let mut all = independents(&logging);
        for (id, n) in independents(&logging_backup) {
            *all.entry(id).or_insert(0) += n;
        }
        all
    };
    let dead_single = independents(&dlq);
    let mut lost = 0;
    let mut duplicated = 0;
    for id in &independent_ids {
        for (branch, counts) in [("service", &service_single), ("logging", &logging_single)] {
            match counts.get(id).copied().unwrap_or(0) {
                0 if dead_single.contains_key(id) => {}
                0 => {
                    lost += 1;
                    problems.push(format!("independent {id} lost on {branch}"));
                }
                1 => {}
                n => {
                    duplicated += n - 1;
                    problems.push(format!("independent {id} {n} times on {branch}"));
                }
            }
        }
    }
    if on_primary
        .iter()
        .chain(&on_backup)
        .chain(&logging)
        .any(|m| session_of(m).is_none() && is_replay(m))
    {
        problems.push("an independent message was marked as a replay".into());
    }
    println!(
        "service: {on_primary_only} sessions whole on the primary, {on_backup_only} whole on \
         the backup only, {switched} switched mid-session ({replays} replayed copies, marked); \
         {} session(s) dead-lettered whole; {} dead letters in all; independent messages lost \
         {lost}, duplicated {duplicated}",
        dead_sessions.len(),
        dlq.len()
    );
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems[..problems.len().min(30)].join("\n")
    );
    assert_eq!(
        switched, AT_ONCE,
        "exactly the {AT_ONCE} sessions open at the pause switch mid-session"
    );
    assert_eq!(replays, AT_ONCE * PAUSE_AFTER as usize);
    assert_eq!(
        on_primary_only,
        PAUSE_GROUP * AT_ONCE,
        "the sessions completed before the pause stay on the primary"
    );
    assert!(dlq.is_empty(), "nothing is dead-lettered with a backup up");
    delete_all_with_prefix(&p).await;
}

// ---------------------------------------------------------------------------
// 2. Exhaustion

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_branch_dead_letters_the_whole_session_in_order() {
    let p = unique_prefix("sess-exhausted");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let primary = format!("{p}.primary");
    let dlq = format!("{p}.dlq");
    // The backup's queue never exists: once the primary is gone, the list is exhausted.
    let toml = session_branch(&p, false)
        .sessions(&[("max_open", 4.into())])
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;

    let x = Session::named("order-77");
    publish(&broker, &inbound, &x.messages(0..5, 9)).await;
    let delivered = take(&broker, &primary, 5).await;
    assert_eq!(seqs(&delivered.iter().collect::<Vec<_>>()), whole(5));
    wait_until(
        &format!("{inbound} holds the open session's 5 messages unacked"),
        DEFAULT_TIMEOUT,
        || async { ready_unacked(&inbound).await == Some((0, 5)) },
    )
    .await;
    assert_eq!(broker.delete_queue(&primary).await, 0);

    // Message 5 is returned by the primary and by the backup (after replaying
    // message 0 there): the whole session so far is dead-lettered, in order.
    publish(&broker, &inbound, &[x.message(5, None)]).await;
    let dead = take(&broker, &dlq, 6).await;
    let dead_refs: Vec<&Message> = dead.iter().collect();
    assert_eq!(seqs(&dead_refs), whole(6), "the whole session, in order");
    for m in &dead {
        assert_session_dead_letter(m, "order-77", "exhausted");
        assert_eq!(array_names(m.header("x-switchyard-failed")), ["service"]);
        assert!(!is_replay(m), "a dead letter is not a replay");
    }
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;

    // A session with a numeric id fails on its first message: its dead
    // letter names the id's text form.
    let n = Session::numbered(4242);
    publish(&broker, &inbound, &[n.message(0, None)]).await;
    let dead = take(&broker, &dlq, 1).await;
    assert_session_dead_letter(&dead[0], "4242", "exhausted");

    // Both sessions are now closed: their next messages are dead-lettered
    // alone as session-closed.
    publish(&broker, &inbound, &[x.message(6, Some(end_true()))]).await;
    publish(&broker, &inbound, &[n.message(1, Some(end_true()))]).await;
    // Two sessions' dead letters: no order is promised between them.
    let mut late = take(&broker, &dlq, 2).await;
    late.sort_by_key(message_id);
    let late_ids: Vec<String> = late.iter().map(message_id).collect();
    assert_eq!(late_ids, ["4242/1", "order-77/6"]);
    assert_session_dead_letter(&late[0], "4242", "session-closed");
    assert_session_dead_letter(&late[1], "order-77", "session-closed");
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;
    wait_sessions_open(&forwarder, 0).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

/// A message the screen refuses (here a loop: it arrives already forwarded
/// `max_hops` times) fails its whole session with that reason, in order,
/// and closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_message_dead_letters_its_whole_session_with_the_screens_reason() {
    let p = unique_prefix("sess-refused");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let primary = format!("{p}.primary");
    let dlq = format!("{p}.dlq");
    let toml = session_branch(&p, true)
        .inbound("max_hops", 3)
        .sessions(&[("max_open", 4.into())])
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;

    let s = Session::named("looped");
    publish(&broker, &inbound, &s.messages(0..2, 9)).await;
    assert_eq!(
        seqs(&take(&broker, &primary, 2).await.iter().collect::<Vec<_>>()),
        whole(2)
    );
    let (body, props) = s.message(2, None);
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert("x-switchyard-hops".into(), AMQPValue::LongLongInt(3));
    // A trusted user's hop count (a forwarder's copy), which counts.
    let props = props.with_headers(headers).with_user_id("guest".into());
    publish(&broker, &inbound, &[(body, props)]).await;

    let dead = take(&broker, &dlq, 3).await;
    assert_eq!(
        seqs(&dead.iter().collect::<Vec<_>>()),
        whole(3),
        "the whole session, in order"
    );
    for m in &dead {
        assert_session_dead_letter(m, "looped", "loop");
    }
    publish(&broker, &inbound, &[s.message(3, Some(end_true()))]).await;
    let late = take(&broker, &dlq, 1).await;
    assert_session_dead_letter(&late[0], "looped", "session-closed");
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;
    wait_sessions_open(&forwarder, 0).await;
    assert_eq!(
        broker.queue_len(&primary).await,
        0,
        "taken above; nothing more forwarded"
    );
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

/// A session id over 256 bytes (ids are remembered, and producers choose
/// them) makes no session: that message is dead-lettered alone as
/// `malformed`, saying why, while a session with a long id under it goes
/// through whole (the unit tests take the limit to the byte).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_id_over_the_limit_is_dead_lettered_alone_as_malformed() {
    let p = unique_prefix("sess-long-id");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let primary = format!("{p}.primary");
    let dlq = format!("{p}.dlq");
    let toml = session_branch(&p, true)
        .sessions(&[("max_open", 4.into())])
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;

    // Under the limit, and short enough for the test's message ids.
    let longest = Session::named(&"k".repeat(200));
    publish(&broker, &inbound, &longest.messages(0..2, 1)).await;
    let mut headers = FieldTable::default();
    headers.insert(
        ID.into(),
        AMQPValue::LongString("x".repeat(16 * 1024).into()),
    );
    let over = BasicProperties::default()
        .with_message_id("over-the-limit".into())
        .with_headers(headers);
    publish(&broker, &inbound, &[(b"over".to_vec(), over)]).await;

    let forwarded = take(&broker, &primary, 2).await;
    assert_eq!(seqs(&forwarded.iter().collect::<Vec<_>>()), whole(2));
    let dead = take(&broker, &dlq, 1).await;
    assert_eq!(message_id(&dead[0]), "over-the-limit");
    assert_eq!(
        dead[0].header_str("x-switchyard-reason").as_deref(),
        Some("malformed")
    );
    let error = dead[0].header_str("x-switchyard-error").unwrap_or_default();
    assert!(
        error.contains("session id of 16384 bytes is over the limit of 256 bytes"),
        "{error}"
    );
    assert!(
        dead[0].header("x-switchyard-session").is_none(),
        "no session"
    );
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;
    wait_sessions_open(&forwarder, 0).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

// ---------------------------------------------------------------------------
// 3. Timeout, size limits, late messages

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_oversized_and_late_messages_are_dead_lettered_with_their_reason() {
    const IDLE_MS: u64 = 1000;
    const MAX_BYTES: usize = 1000;
    let p = unique_prefix("sess-limits");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let service = format!("{p}.primary");
    let dlq = format!("{p}.dlq");
    let toml = session_branch(&p, true)
        .sessions(&[
            ("idle_timeout_ms", IDLE_MS.into()),
            ("max_messages", 5.into()),
            ("max_bytes", MAX_BYTES.into()),
        ])
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;

    // Idle: three messages and no end. They are forwarded, then after the
    // idle timeout the session is dead-lettered whole.
    let idle = Session::named("idle");
    publish(&broker, &inbound, &idle.messages(0..3, 99)).await;
    let published = Instant::now();
    let took = wait_for(
        "the idle session's dead letters",
        DEFAULT_TIMEOUT,
        || async { (broker.queue_len(&dlq).await == 3).then(|| published.elapsed()) },
    )
    .await;
    println!("idle session dead-lettered {took:?} after its last message was published");
    assert!(
        took >= Duration::from_millis(IDLE_MS - 100),
        "dead-lettered after {took:?}, before the {IDLE_MS} ms idle timeout"
    );
    let dead = broker.get_all(&dlq).await;
    assert_eq!(seqs(&dead.iter().collect::<Vec<_>>()), whole(3));
    for m in &dead {
        assert_session_dead_letter(m, "idle", "session-timeout");
    }
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;

    // Too many messages: the sixth exceeds max_messages = 5. Too many bytes:
    // the fourth 300-byte body exceeds max_bytes = 1000. Completed: three
    // messages with the end on the last.
    let many = Session::named("many");
    let big = Session::named("big");
    let done = Session::named("done");
    let mut batch = many.messages(0..6, 99);
    batch.extend((0..4).map(|seq| big.message_with_body(seq, None, vec![b'b'; 300])));
    batch.extend(done.messages(0..3, 2));
    publish(&broker, &inbound, &batch).await;
    let dead = take(&broker, &dlq, 6 + 4).await;
    let dead_by = by_session(&dead);
    assert_eq!(
        seqs(&dead_by["many"]),
        whole(6),
        "many: the set and the 6th"
    );
    assert_eq!(seqs(&dead_by["big"]), whole(4), "big: the set and the 4th");
    assert_eq!(dead_by.len(), 2, "only many and big: {:?}", dead_by.keys());
    for m in &dead_by["many"] {
        assert_session_dead_letter(m, "many", "session-too-large");
    }
    for m in &dead_by["big"] {
        assert_session_dead_letter(m, "big", "session-too-large");
    }
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;

    // Late messages: after the dead letters (idle, many, big) and after the
    // completion (done), each is dead-lettered alone as session-closed.
    let late = vec![
        idle.message(3, Some(end_true())),
        many.message(6, Some(end_true())),
        big.message(4, Some(end_true())),
        done.message(3, Some(end_true())),
    ];
    publish(&broker, &inbound, &late).await;
    // Different sessions are dead-lettered independently: in any order.
    let dead = take(&broker, &dlq, 4).await;
    let mut ids: Vec<String> = dead.iter().map(message_id).collect();
    ids.sort();
    assert_eq!(ids, ["big/4", "done/3", "idle/3", "many/6"], "each alone");
    for m in &dead {
        let session = session_of(m).expect("a session message");
        assert_session_dead_letter(m, &session, "session-closed");
    }
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;
    wait_sessions_open(&forwarder, 0).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    // The service got each forwarded message once, in order: "done" whole;
    // of the dead-lettered sessions what was forwarded before their end.
    let on_service = broker.get_all(&service).await;
    let by = by_session(&on_service);
    assert_eq!(seqs(&by["done"]), whole(3), "done: whole and in order");
    assert_eq!(
        seqs(&by["idle"]),
        whole(3),
        "idle: forwarded before the timeout"
    );
    for (id, limit) in [("many", 5), ("big", 3)] {
        let got = by.get(id).map(|m| seqs(m)).unwrap_or_default();
        assert!(
            got == whole(got.len() as u32) && got.len() <= limit,
            "{id}: at most the messages within the limit, in order: {got:?}"
        );
    }
    assert_eq!(broker.queue_len(&format!("{p}.backup")).await, 0);
    delete_all_with_prefix(&p).await;
}

// ---------------------------------------------------------------------------
// 4. Slots

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_waits_for_a_free_slot_while_other_traffic_flows() {
    let p = unique_prefix("sess-slots");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let service = format!("{p}.primary");
    let toml = session_branch(&p, true)
        .sessions(&[("max_open", 2.into())])
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    let (a, b, c) = (
        Session::named("a"),
        Session::named("b"),
        Session::named("c"),
    );

    // Two sessions take both slots.
    let mut batch = a.messages(0..2, 99);
    batch.extend(b.messages(0..2, 99));
    publish(&broker, &inbound, &batch).await;
    broker.await_count(&service, 4, DEFAULT_TIMEOUT).await;
    wait_sessions_open(&forwarder, 2).await;

    // A third session's first message, then an independent message and more
    // of the open sessions: those flow past it.
    publish(&broker, &inbound, &[c.message(0, None)]).await;
    let mut batch = vec![independent("free-1", None)];
    batch.extend(a.messages(2..3, 99));
    batch.extend(b.messages(2..3, 99));
    publish(&broker, &inbound, &batch).await;
    broker.await_count(&service, 7, DEFAULT_TIMEOUT).await;
    wait_until(
        &format!("{inbound} holds a0-2, b0-2 and c0 unacked"),
        DEFAULT_TIMEOUT,
        || async { ready_unacked(&inbound).await == Some((0, 7)) },
    )
    .await;
    let got = broker.get_all(&service).await;
    assert!(
        !got.iter().any(|m| session_of(m).as_deref() == Some("c")),
        "c must wait for a slot"
    );
    assert_eq!(sessions_open(&forwarder), 2.0);

    // a ends: its slot frees and c proceeds, then completes.
    publish(&broker, &inbound, &[a.message(3, Some(end_true()))]).await;
    let got2 = take(&broker, &service, 2).await;
    let ids: Vec<String> = got2.iter().map(message_id).collect();
    assert_eq!(ids, ["a/3", "c/0"], "c/0 is forwarded once a has ended");
    publish(&broker, &inbound, &[c.message(1, Some(end_true()))]).await;
    publish(&broker, &inbound, &[b.message(3, Some(end_true()))]).await;
    let got3 = take(&broker, &service, 2).await;
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;
    wait_sessions_open(&forwarder, 0).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let all: Vec<Message> = [got, got2, got3].concat();
    let by = by_session(&all);
    assert_eq!(seqs(&by["a"]), whole(4));
    assert_eq!(seqs(&by["b"]), whole(4));
    assert_eq!(seqs(&by["c"]), whole(2));
    assert_eq!(independents(&all).get("free-1"), Some(&1));
    assert_eq!(all.len(), 11, "each message once");
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    delete_all_with_prefix(&p).await;
}

// ---------------------------------------------------------------------------
// 5. Memory

/// The real binary with every slot taken by a session of 50 messages of
/// 64 KiB (none ended): its resident memory stays within the cached sessions'
/// bound plus a baseline, twice in a row (completed sessions free theirs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_with_every_session_slot_full_of_large_messages() {
    const MAX_OPEN: u64 = 16;
    const MESSAGES: u32 = 50;
    const BODY: usize = 64 * 1024;
    const MAX_BYTES: u64 = 4 * 1024 * 1024;
    const ROUNDS: usize = 2;
    let p = unique_prefix("sess-memory");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let service = format!("{p}.primary");
    let toml = session_branch(&p, true)
        .inbound("prefetch", 1100)
        .sessions(&[
            ("max_open", MAX_OPEN.into()),
            ("max_messages", 64.into()),
            ("max_bytes", MAX_BYTES.into()),
        ])
        .toml();
    let process = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;
    publish(&broker, &inbound, &[independent("warm-up", None)]).await;
    take(&broker, &service, 1).await;
    let baseline = process.rss_kib();
    // The cached sets (at most max_open x max_bytes), plus half as much again
    // for the client library's frame buffers and the allocator's slack.
    let bound = baseline + (MAX_OPEN * MAX_BYTES * 3 / 2) / 1024;
    println!(
        "baseline RSS {baseline} KiB; bound {bound} KiB for {MAX_OPEN} sessions of {MESSAGES} \
         x {} KiB ({} MiB of bodies)",
        BODY / 1024,
        MAX_OPEN * u64::from(MESSAGES) * BODY as u64 / 1024 / 1024
    );

    let mut first_peak = None;
    for round in 0..ROUNDS {
        let sessions: Vec<Session> = (0..MAX_OPEN)
            .map(|s| Session::named(&format!("r{round}-s{s:02}")))
            .collect();
        let mut batch = Vec::new();
        for seq in 0..MESSAGES {
            for s in &sessions {
                let mut body = vec![b'x'; BODY];
                body[..4].copy_from_slice(&seq.to_be_bytes());
                batch.push(s.message_with_body(seq, None, body));
            }
        }
        let total = batch.len() as u32;
        publish(&broker, &inbound, &batch).await;
        drop(batch);
        let mut peak = 0;
        wait_until(
            &format!("round {round}: all {total} copies on the service"),
            BULK_TIMEOUT,
            || {
                peak = peak.max(process.rss_kib());
                let broker = &broker;
                let service = &service;
                async move { broker.queue_len(service).await == total }
            },
        )
        .await;
        let open = ready_unacked(&inbound).await;
        peak = peak.max(process.rss_kib());
        println!("round {round}: peak RSS {peak} KiB with every session open; inbound {open:?}");
        assert_eq!(
            open,
            Some((0, u64::from(total))),
            "every message of the open sessions is held unacked"
        );
        assert!(
            peak <= bound,
            "round {round}: RSS {peak} KiB exceeds the bound {bound} KiB (baseline {baseline})"
        );
        // Completed sessions free their cache: a later round needs no more.
        let first = *first_peak.get_or_insert(peak);
        assert!(
            peak <= first + (MAX_OPEN * MAX_BYTES / 4) / 1024,
            "round {round}: RSS {peak} KiB grew past round 0's {first} KiB: completed sessions \
             keep memory"
        );
        let forwarded = broker.get_all(&service).await;

        // The sessions end and complete.
        let ends: Vec<Outgoing> = sessions
            .iter()
            .map(|s| s.message(MESSAGES, Some(end_true())))
            .collect();
        publish(&broker, &inbound, &ends).await;
        let ended = take(&broker, &service, MAX_OPEN as u32).await;
        wait_settled(&inbound, BULK_TIMEOUT).await;
        let all = [forwarded, ended].concat();
        let by = by_session(&all);
        for s in &sessions {
            assert_eq!(
                seqs(&by[&s.text]),
                whole(MESSAGES + 1),
                "{}: whole and in order",
                s.text
            );
        }
        println!(
            "round {round}: completed; RSS now {} KiB",
            process.rss_kib()
        );
    }
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    drop(process);
    delete_all_with_prefix(&p).await;
}

// ---------------------------------------------------------------------------
// 6. The prefetch rule in `check`

fn check(name: &str, toml: &str) -> (Option<i32>, String, String) {
    let path: PathBuf = std::env::temp_dir().join(format!("{}.toml", unique_prefix(name)));
    std::fs::write(&path, toml).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    let out = clean_command()
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run switchyard: {e}"));
    let _ = std::fs::remove_file(&path);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_refuses_session_slots_that_could_fill_the_prefetch() {
    let p = "sess-check";
    let with = |prefetch: u32| {
        Forwarder::new(p)
            .mode("republish")
            .inbound("prefetch", prefetch)
            .seed(p)
            .sessions(&[("max_open", 10.into()), ("max_messages", 10.into())])
            .toml()
    };

    // 10 x 10 = 100 >= 100: refused, naming the key and the rule.
    let (code, stdout, stderr) = check("sess-check-refused", &with(100));
    assert_eq!(code, Some(2), "exit 2; stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {stderr:?}");
    assert!(
        lines[0].contains("sessions.max_open") && lines[0].contains("inbound.prefetch"),
        "the line names sessions.max_open and the rule with inbound.prefetch: {stderr:?}"
    );
    assert!(stdout.trim().is_empty(), "no summary: {stdout}");

    // 10 x 10 = 100 < 101: accepted.
    let (code, _, stderr) = check("sess-check-ok", &with(101));
    assert_eq!(code, Some(0), "prefetch 101 passes; stderr: {stderr}");
}

// ---------------------------------------------------------------------------
// Routing and round robin, decided once per session

/// A session goes where its first message's routing sends it, whatever its
/// later messages say; a round-robin branch picks its endpoint once per
/// session and keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_and_round_robin_are_decided_by_the_first_message() {
    const PER: u32 = 5;
    let p = unique_prefix("sess-routing");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let queue = |name: &str| format!("{p}.{name}");
    let kind_is = |value: &str| Filter::header("kind").set("equals", value);
    let mut config = Forwarder::new(&p).mode("republish");
    for name in ["alpha", "beta", "rr0", "rr1", "rr2"] {
        config = config.endpoint(Endpoint::queue(name, &queue(name)));
    }
    let toml = config
        .backup_list("pool", &["rr1", "rr2"])
        .filter("a", kind_is("a"))
        .filter("b", kind_is("b"))
        .filter("r", kind_is("r"))
        .branch(Branch::new("alpha", "a", "alpha"))
        .branch(Branch::new("beta", "b", "beta"))
        .branch(
            Branch::new("rr", "r", "rr0")
                .backups("pool")
                .set("strategy", "round_robin"),
        )
        .sessions(&[("max_open", 8.into())])
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;

    // kind cycles after the first message: a session that starts with "a"
    // goes on with "b", "r" and none, and so on.
    let with_kind = |(body, props): Outgoing, kind: Option<&str>| -> Outgoing {
        let mut headers = props.headers().clone().unwrap_or_default();
        if let Some(kind) = kind {
            headers.insert("kind".into(), AMQPValue::LongString(kind.into()));
        }
        (body, props.with_headers(headers))
    };
    let starts = ["a", "b", "r", "r", "r", "r", "r", "r"];
    let later = [Some("b"), Some("r"), None, Some("a")];
    let sessions: Vec<Session> = (0..starts.len())
        .map(|s| Session::named(&format!("{}{s}", starts[s])))
        .collect();
    let mut batch = Vec::new();
    for seq in 0..PER {
        for (s, session) in sessions.iter().enumerate() {
            let kind = if seq == 0 {
                Some(starts[s])
            } else {
                later[(seq as usize + s) % later.len()]
            };
            let message = session.message(seq, (seq == PER - 1).then(end_true));
            batch.push(with_kind(message, kind));
        }
    }
    publish(&broker, &inbound, &batch).await;
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let mut got = BTreeMap::new();
    for name in ["alpha", "beta", "rr0", "rr1", "rr2"] {
        got.insert(name, broker.get_all(&queue(name)).await);
    }
    let sessions_on = |name: &str| -> BTreeMap<String, Vec<u32>> {
        by_session(&got[name])
            .into_iter()
            .map(|(id, m)| (id, seqs(&m)))
            .collect()
    };
    let expect = |name: &str, ids: &[&str]| {
        let on = sessions_on(name);
        let names: Vec<&str> = on.keys().map(String::as_str).collect();
        assert_eq!(
            names, ids,
            "{name}: the sessions whose first message matched"
        );
        for (id, seqs) in on {
            assert_eq!(seqs, whole(PER), "{name}: {id} whole and in order");
        }
    };
    expect("alpha", &["a0"]);
    expect("beta", &["b1"]);
    let mut spread = Vec::new();
    let mut on_rr = Vec::new();
    for name in ["rr0", "rr1", "rr2"] {
        let on = sessions_on(name);
        for (id, s) in &on {
            assert_eq!(s, &whole(PER), "{name}: {id} whole and in order");
        }
        spread.push(on.len());
        on_rr.extend(on.into_keys());
    }
    on_rr.sort();
    println!("round robin: sessions per endpoint {spread:?}");
    assert_eq!(
        on_rr,
        ["r2", "r3", "r4", "r5", "r6", "r7"],
        "each round-robin session on exactly one endpoint"
    );
    assert!(
        spread.iter().all(|n| *n > 0),
        "the start rotates from session to session: {spread:?}"
    );
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    delete_all_with_prefix(&p).await;
}

// ---------------------------------------------------------------------------
// 7. Counted and recorded like any message

/// Runs `switchyard dlq <args>` on `config`; returns stdout.
fn dlq_cli(config: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("dlq")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap_or_else(|e| panic!("cannot run switchyard: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "dlq {args:?}: {stdout}{stderr}");
    stdout
}

/// A session's failover, replays and forwarded copies are counted by the
/// same code as any message's; a session that times out after reaching
/// every branch records that each branch holds each of its messages, so
/// a redrive sends nothing again and only removes the dead letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_failovers_are_counted_and_its_dead_letters_say_which_branches_hold_it() {
    let p = unique_prefix("sess-record");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let (service, backup, logging) = (
        format!("{p}.service"),
        format!("{p}.service.backup"),
        format!("{p}.logging"),
    );
    let toml = Forwarder::new(&p)
        .mode("republish")
        .seed(&p)
        .sessions(&[("max_open", 4.into()), ("idle_timeout_ms", 1500.into())])
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;

    let one = Session::named("one");
    publish(&broker, &inbound, &one.messages(0..2, 9)).await;
    broker.await_count(&service, 2, DEFAULT_TIMEOUT).await;
    broker.delete_queue(&service).await;
    publish(&broker, &inbound, &one.messages(2..4, 3)).await;
    broker.await_count(&backup, 4, DEFAULT_TIMEOUT).await;
    broker.await_count(&logging, 4, DEFAULT_TIMEOUT).await;
    wait_settled(&inbound, DEFAULT_TIMEOUT).await;
    let metrics = Metrics::parse(&forwarder.telemetry().render());
    let route = |endpoint| [("branch", "service"), ("endpoint", endpoint)];
    assert_eq!(
        metrics.value(
            "switchyard_failovers_total",
            &[
                ("branch", "service"),
                ("from", "service"),
                ("to", "service_backup")
            ]
        ),
        1.0
    );
    assert_eq!(
        metrics.value("switchyard_messages_forwarded_total", &route("service")),
        2.0
    );
    assert_eq!(
        metrics.value(
            "switchyard_messages_forwarded_total",
            &route("service_backup")
        ),
        4.0,
        "every copy the backup holds, replays included"
    );
    assert_eq!(
        metrics.value("switchyard_replays_total", &route("service_backup")),
        2.0
    );

    broker.declare_queue(&service).await;
    let two = Session::named("two");
    publish(&broker, &inbound, &two.messages(0..2, 9)).await;
    broker
        .await_count(&format!("{p}.dlq"), 2, DEFAULT_TIMEOUT)
        .await;
    let config = std::env::temp_dir().join(format!("{p}-dlq.toml"));
    std::fs::write(&config, &toml).unwrap_or_else(|e| panic!("{e}"));
    let listing = dlq_cli(&config, &["inspect", "--json"]);
    let records: Vec<serde_json::Value> = listing
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(records.len(), 2, "{listing}");
    for record in &records {
        assert_eq!(record["reason"], "session-timeout", "{record}");
        assert_eq!(record["failed"], serde_json::json!([]), "{record}");
        assert_eq!(
            record["delivered"],
            serde_json::json!(["service", "logging"]),
            "{record}"
        );
    }
    let redriven = dlq_cli(&config, &["redrive"]);
    assert!(
        redriven.contains("removed two/0: every branch already holds it")
            && redriven.contains("0 of 2 dead letter(s) redriven")
            && redriven.contains("2 already held by every branch, removed"),
        "{redriven}"
    );
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    assert_eq!(
        broker.queue_len(&inbound).await,
        0,
        "nothing was sent again"
    );
    assert_eq!(broker.queue_len(&service).await, 2);
    assert_eq!(broker.queue_len(&logging).await, 6);
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_file(config);
    delete_all_with_prefix(&p).await;
}
