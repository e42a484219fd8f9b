//! The real binary as a process: crash safety under SIGKILL (at-least-once,
//! nothing lost), and SIGTERM shutdown (in-flight transactions drained within
//! `shutdown_timeout_ms`, the rest requeued, exit code 0).

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::{Process, consumer_count, log_tail, wait_consumers};
use support::{
    BULK_TIMEOUT, DEFAULT_TIMEOUT, FaultProxy, TestBroker, amqp_addr, delete_all_with_prefix,
    ready_unacked, tally, unique_prefix, wait_for, wait_until,
};

/// The seed scenario's two branches with prefetch `prefetch`.
fn two_branch_toml(p: &str, prefetch: u32) -> String {
    Forwarder::new(p)
        .inbound("prefetch", prefetch)
        .seed(p)
        .toml()
}

/// Pipelines one persistent, mandatory publish per body to `queue` (default
/// exchange) with `message_id = body`, then awaits every confirm.
async fn publish_with_ids(broker: &TestBroker, queue: &str, bodies: &[String]) {
    let messages = bodies.iter().map(|body| {
        let props = BasicProperties::default()
            .with_message_id(body.as_str().into())
            .with_delivery_mode(2);
        (body.as_bytes(), props)
    });
    broker.publish_each("", queue, messages).await;
}

/// Waits until `queue` holds exactly `ready` ready and `unacked` unacked messages.
async fn wait_ready_unacked(queue: &str, ready: u64, unacked: u64, timeout: Duration) {
    wait_until(
        &format!("{queue} holds {ready} ready and {unacked} unacked messages"),
        timeout,
        || async move { ready_unacked(queue).await == Some((ready, unacked)) },
    )
    .await;
}

/// Sum over bodies of the copies beyond the first, with the duplicated bodies.
fn duplicates(counts: &BTreeMap<String, usize>) -> (usize, Vec<(&str, usize)>) {
    let dups: Vec<(&str, usize)> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(b, n)| (b.as_str(), *n))
        .collect();
    (dups.iter().map(|(_, n)| n - 1).sum(), dups)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_messages_in_flight_loses_nothing() {
    const N: usize = 3000;
    const KILL_AT: u32 = 300;
    let p = unique_prefix("sigkill");
    let broker = TestBroker::connect(&p).await;
    let toml = two_branch_toml(&p, 200);
    let inbound = format!("{p}.in");
    let service = format!("{p}.service");
    let bodies: Vec<String> = (0..N).map(|i| format!("{p}-{i:05}")).collect();

    // A first run declares the topology (inbound queue with its dead-letter
    // arguments, DLX, DLQ, endpoint queues) and stops; the backlog is then
    // published while nothing consumes, so the next run works at full
    // prefetch and has many transactions in flight when it is killed.
    let mut setup = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;
    setup.signal("TERM");
    let code = setup.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(
        code,
        Some(0),
        "setup run: TERM must exit 0; log tail:\n{}",
        log_tail(&setup.log(), 30)
    );
    wait_consumers(&broker, &inbound, 0).await;
    publish_with_ids(&broker, &inbound, &bodies).await;
    broker
        .await_count(&inbound, N as u32, DEFAULT_TIMEOUT)
        .await;

    // SIGKILL as soon as some (not all) messages reached the service branch.
    let mut first = Process::spawn(&p, &toml);
    let seen_at_kill = wait_for(
        &format!("{service} holds at least {KILL_AT} messages"),
        BULK_TIMEOUT,
        || async {
            let n = broker.queue_len(&service).await;
            (n >= KILL_AT).then_some(n)
        },
    )
    .await;
    first.signal("KILL");
    let code = first.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, None, "SIGKILL: no exit code expected");
    wait_consumers(&broker, &inbound, 0).await;
    // The broker requeued whatever the dead process held unacked.
    wait_until(
        &format!("{inbound} has no unacked messages after the kill"),
        DEFAULT_TIMEOUT,
        || async { ready_unacked(&inbound).await.is_some_and(|(_, u)| u == 0) },
    )
    .await;
    let (left_ready, _) = ready_unacked(&inbound).await.expect("inbound queue exists");
    let service_after_kill = broker.queue_len(&service).await;
    println!(
        "killed with {seen_at_kill} seen on service; after the kill: service holds \
         {service_after_kill}, {inbound} holds {left_ready} ready"
    );
    assert!(
        left_ready > 0 && (service_after_kill as usize) < N,
        "the kill must interrupt the stream: {left_ready} left in {inbound}, \
         {service_after_kill} of {N} on service"
    );

    // Restart on the same configuration and let it finish the backlog.
    let started = Instant::now();
    let mut second = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;
    wait_ready_unacked(&inbound, 0, 0, BULK_TIMEOUT).await;
    println!("restart drained the backlog in {:?}", started.elapsed());
    second.signal("TERM");
    let code = second.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(
        code,
        Some(0),
        "TERM after the backlog: exit 0 expected; log tail:\n{}",
        log_tail(&second.log(), 30)
    );

    // Account for every message.
    let get = |suffix: &str| {
        let queue = format!("{p}.{suffix}");
        let broker = &broker;
        async move { broker.get_all(&queue).await }
    };
    let service_backup = get("service.backup").await;
    let logging_backup = get("logging.backup").await;
    let backups = (service_backup.len(), logging_backup.len());
    let service_msgs = [get("service").await, service_backup].concat();
    let logging_msgs = [get("logging").await, logging_backup].concat();
    let dlq_msgs = get("dlq").await;
    let left = get("in").await;
    assert!(
        left.is_empty(),
        "{} message(s) left in {inbound}",
        left.len()
    );
    for m in service_msgs.iter().chain(&logging_msgs).chain(&dlq_msgs) {
        assert_eq!(
            m.properties.message_id().as_ref().map(|s| s.as_str()),
            Some(m.body_str().as_str()),
            "message_id must survive forwarding"
        );
    }
    let service_counts = tally(&service_msgs);
    let logging_counts = tally(&logging_msgs);
    let dlq_counts = tally(&dlq_msgs);
    let known: std::collections::BTreeSet<&str> = bodies.iter().map(String::as_str).collect();
    let unknown: Vec<&String> = service_counts
        .keys()
        .chain(logging_counts.keys())
        .chain(dlq_counts.keys())
        .filter(|b| !known.contains(b.as_str()))
        .collect();
    assert!(unknown.is_empty(), "bodies never published: {unknown:?}");

    let lost: Vec<&str> = bodies
        .iter()
        .filter(|b| {
            let both = service_counts.contains_key(*b) && logging_counts.contains_key(*b);
            !both && !dlq_counts.contains_key(*b)
        })
        .map(String::as_str)
        .collect();
    let (service_dups, service_dup_list) = duplicates(&service_counts);
    let (logging_dups, logging_dup_list) = duplicates(&logging_counts);
    println!(
        "accounting: {N} published; service {} copies ({} distinct, {service_dups} duplicates), \
         logging {} copies ({} distinct, {logging_dups} duplicates), dlq {} ({} distinct), \
         lost {}",
        service_msgs.len(),
        service_counts.len(),
        logging_msgs.len(),
        logging_counts.len(),
        dlq_msgs.len(),
        dlq_counts.len(),
        lost.len()
    );
    println!("of which on the backup endpoints (service, logging): {backups:?}");
    if service_dups + logging_dups > 0 {
        let first = |n: usize| n.min(5);
        println!(
            "first duplicates on service (body, copies): {:?}",
            &service_dup_list[..first(service_dup_list.len())]
        );
        println!(
            "first duplicates on logging (body, copies): {:?}",
            &logging_dup_list[..first(logging_dup_list.len())]
        );
    }
    if !dlq_msgs.is_empty() {
        println!(
            "dead-lettered (unexpected with healthy endpoints): {:?}",
            dlq_counts.keys().collect::<Vec<_>>()
        );
    }
    assert!(
        lost.is_empty(),
        "{} message(s) lost (missing from a branch and not dead-lettered), e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_and_exits_zero() {
    const K: usize = 20;
    const M: usize = 50;
    const SHUTDOWN_MS: u64 = 1500;
    // Closing after the drain bound: channels, and connections, one of which
    // goes to a broker that no longer answers and can only time out. Generous
    // for a loaded machine, yet far below the 30 s confirm timeout that an
    // exit ignoring the drain bound would wait out.
    const SHUTDOWN_SLACK: Duration = Duration::from_secs(12);
    let p = unique_prefix("sigterm-drain");
    let broker = TestBroker::connect(&p).await;
    let proxy = FaultProxy::start(amqp_addr()).await;
    let inbound = format!("{p}.in");
    let dest = format!("{p}.dest");
    let toml = Forwarder::new(&p)
        .top("shutdown_timeout_ms", SHUTDOWN_MS)
        .inbound("prefetch", 200)
        .broker("slow", &proxy.amqp_url())
        .endpoint(
            Endpoint::queue("dest", &dest)
                .on("slow")
                .set("confirm_timeout_ms", 30000),
        )
        .filter("all", Filter::match_all())
        .branch(Branch::new("dest", "all", "dest"))
        .toml();

    let mut process = Process::spawn(&p, &toml);
    wait_consumers(&broker, &inbound, 1).await;

    // A first batch goes through and is fully settled.
    let early: Vec<String> = (0..K).map(|i| format!("{p}-early-{i:03}")).collect();
    publish_with_ids(&broker, &inbound, &early).await;
    broker.await_count(&dest, K as u32, DEFAULT_TIMEOUT).await;
    wait_ready_unacked(&inbound, 0, 0, DEFAULT_TIMEOUT).await;

    // The endpoint's broker goes silent: the next batch is consumed and
    // published, but no confirm ever comes back, so all of it stays in flight.
    proxy.stall();
    let stuck: Vec<String> = (0..M).map(|i| format!("{p}-stuck-{i:03}")).collect();
    publish_with_ids(&broker, &inbound, &stuck).await;
    wait_ready_unacked(&inbound, 0, M as u64, DEFAULT_TIMEOUT).await;

    let term_at = Instant::now();
    process.signal("TERM");
    let code = process.wait_exit(Duration::from_secs(25)).await;
    let took = term_at.elapsed();
    let log = process.log();
    println!("TERM with {M} in flight: exit {code:?} after {took:?}");
    assert_eq!(
        code,
        Some(0),
        "TERM: exit 0 expected; log tail:\n{}",
        log_tail(&log, 30)
    );
    assert!(
        took >= Duration::from_millis(SHUTDOWN_MS - 200),
        "exited after {took:?}, before the {SHUTDOWN_MS} ms drain bound, with confirms \
         still outstanding; log tail:\n{}",
        log_tail(&log, 30)
    );
    assert!(
        log.contains("shutdown bound reached"),
        "the log must warn that the shutdown bound was reached; log tail:\n{}",
        log_tail(&log, 30)
    );

    // Nothing was acked that was not delivered: the broker requeues all M.
    wait_consumers(&broker, &inbound, 0).await;
    wait_ready_unacked(&inbound, M as u64, 0, DEFAULT_TIMEOUT).await;

    // Let the held bytes go; a stalled publish may still land (a duplicate).
    proxy.resume();
    wait_until(
        "the proxy has flushed and closed its connections",
        DEFAULT_TIMEOUT,
        || async { proxy.connections() == 0 },
    )
    .await;
    let slow_conn = format!("{p}/publish/slow");
    wait_until(
        &format!("the broker has closed connection {slow_conn}"),
        DEFAULT_TIMEOUT,
        || async {
            !support::connection_names()
                .await
                .iter()
                .any(|n| n.contains(&slow_conn))
        },
    )
    .await;

    let in_msgs = broker.get_all(&inbound).await;
    let dest_msgs = broker.get_all(&dest).await;
    let dlq_msgs = broker.get_all(&format!("{p}.dlq")).await;
    let in_counts = tally(&in_msgs);
    let dest_counts = tally(&dest_msgs);
    let lost: Vec<&String> = early
        .iter()
        .chain(&stuck)
        .filter(|b| !in_counts.contains_key(*b) && !dest_counts.contains_key(*b))
        .collect();
    let early_missing: Vec<&String> = early
        .iter()
        .filter(|b| !dest_counts.contains_key(*b))
        .collect();
    let stuck_not_requeued: Vec<&String> = stuck
        .iter()
        .filter(|b| !in_counts.contains_key(*b))
        .collect();
    let late_landed: Vec<&String> = stuck
        .iter()
        .filter(|b| dest_counts.contains_key(*b))
        .collect();
    let (dest_dups, dest_dup_list) = duplicates(&dest_counts);
    println!(
        "accounting: {} published; {} in {inbound}, {} in {dest} ({dest_dups} duplicate copies), \
         {} dead-lettered; {} stalled publishes landed after resume (also requeued: \
         at-least-once duplicates)",
        K + M,
        in_msgs.len(),
        dest_msgs.len(),
        dlq_msgs.len(),
        late_landed.len()
    );
    if dest_dups > 0 {
        println!("duplicates in {dest} (body, copies): {dest_dup_list:?}");
    }
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(
        early_missing.is_empty(),
        "confirmed messages missing from {dest}: {early_missing:?}"
    );
    assert!(
        stuck_not_requeued.is_empty(),
        "in-flight messages acked or dropped at shutdown instead of requeued: \
         {stuck_not_requeued:?}"
    );
    assert_eq!(
        in_msgs.len(),
        M,
        "{inbound} must hold exactly the {M} in-flight messages, once each"
    );
    assert!(
        dlq_msgs.is_empty(),
        "nothing may be dead-lettered at shutdown: {:?}",
        tally(&dlq_msgs).keys().collect::<Vec<_>>()
    );

    // Then how the shutdown went: within a few seconds of the drain bound
    // (the bound, plus closing a connection that no longer answers, which
    // needs a timeout of its own), and without treating the abandoned
    // transactions as failed deliveries.
    let mut problems = Vec::new();
    let limit = Duration::from_millis(SHUTDOWN_MS) + SHUTDOWN_SLACK;
    if took > limit {
        problems.push(format!(
            "exit took {took:?}, more than the {SHUTDOWN_MS} ms drain bound + \
             {SHUTDOWN_SLACK:?} for closing"
        ));
    }
    let claimed_dead: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("dead-lettered") && stuck.iter().any(|b| l.contains(b.as_str())))
        .collect();
    if !claimed_dead.is_empty() {
        problems.push(format!(
            "the log reports {} of the requeued in-flight messages as dead-lettered at \
             shutdown (nothing reached {p}.dlq), e.g. {}",
            claimed_dead.len(),
            claimed_dead[0]
        ));
    }
    assert!(
        problems.is_empty(),
        "shutdown problems:\n- {}\nlog (without per-message lines):\n{}",
        problems.join("\n- "),
        log.lines()
            .filter(|l| !l.contains("message_id="))
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(proxy);
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_when_idle_exits_zero_quickly() {
    let p = unique_prefix("sigterm-idle");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let mut process = Process::spawn(&p, &two_branch_toml(&p, 200));
    wait_consumers(&broker, &inbound, 1).await;

    let term_at = Instant::now();
    process.signal("TERM");
    let code = process.wait_exit(Duration::from_secs(10)).await;
    let took = term_at.elapsed();
    println!("idle TERM: exit {code:?} after {took:?}");
    assert_eq!(
        code,
        Some(0),
        "TERM when idle: exit 0 expected; log tail:\n{}",
        log_tail(&process.log(), 30)
    );
    wait_consumers(&broker, &inbound, 0).await;
    assert_eq!(consumer_count(&broker, &inbound).await, Some(0));
    delete_all_with_prefix(&p).await;
}
