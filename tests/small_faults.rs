//! Small faults against the real broker: the inbound queue deleted under a
//! running forwarder comes back with its dead-letter arguments; SIGHUP never
//! kills the real binary; a broker that refuses the credentials or the
//! vhost is named as such in the log, with nothing blamed on a key that is
//! not at fault, and `--fail-fast` turns such a refusal into exit 1; a
//! broker that cannot be reached is logged once per connection attempt; of
//! a broker given as nodes, one that does not answer and one that refuses
//! are logged by name and the next is used, and `--fail-fast` exits only
//! when every node refuses.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::BasicProperties;
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::{InProcess, Process, consumer_count, wait_consumers};
use support::{
    DEFAULT_TIMEOUT, Message, TestBroker, amqp_addr, amqp_str, delete_all_with_prefix, field_table,
    rabbitmqctl, ready_unacked, tally, unique_prefix, wait_until,
};

/// The queue's arguments as `rabbitmqctl list_queues` prints them.
async fn queue_arguments(queue: &str) -> Option<String> {
    let out = rabbitmqctl(&["list_queues", "--silent", "name", "arguments"]).await;
    out.lines().find_map(|line| {
        let (name, args) = line.split_once('\t')?;
        (name.trim() == queue).then(|| args.trim().to_owned())
    })
}

/// With `inbound.declare = true`, deleting the inbound queue under the
/// running forwarder costs one consumer: it declares the queue again, with
/// its dead-letter arguments (a message no filter matches is nacked into
/// the DLQ through them), and consumes again.
#[tokio::test]
async fn a_deleted_inbound_queue_is_declared_again_and_consumed() {
    let p = unique_prefix("inbound-deleted");
    let broker = TestBroker::connect(&p).await;
    let (inbound, out, dlq) = (format!("{p}.in"), format!("{p}.out"), format!("{p}.dlq"));
    let toml = Forwarder::new(&p)
        .endpoint(Endpoint::queue("out", &out))
        .filter("orphan", Filter::header("kind").set("equals", "orphan"))
        .filter("routed", Filter::not("orphan"))
        .branch(Branch::new("out", "routed", "out"))
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    let dead_letter_args = [
        format!("{{\"x-dead-letter-exchange\",\"{p}.dlx\"}}"),
        format!("{{\"x-dead-letter-routing-key\",\"{p}.dlq\"}}"),
    ];
    let before: Vec<String> = (0..10).map(|i| format!("before-{i}")).collect();
    broker
        .publish_many("", &inbound, before.iter(), BasicProperties::default())
        .await;
    broker.await_count(&out, 10, DEFAULT_TIMEOUT).await;
    wait_until("the first ten are acked", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 0))
    })
    .await;

    assert_eq!(broker.delete_queue(&inbound).await, 0);
    // Declared again (the delete cancelled the consumer) and consumed.
    wait_consumers(&broker, &inbound, 1).await;
    let args = queue_arguments(&inbound)
        .await
        .unwrap_or_else(|| panic!("{inbound} is back"));
    for arg in &dead_letter_args {
        assert!(args.contains(arg.as_str()), "{arg} in {args}");
    }

    let after: Vec<String> = (0..10).map(|i| format!("after-{i}")).collect();
    broker
        .publish_many("", &inbound, after.iter(), BasicProperties::default())
        .await;
    let orphan =
        BasicProperties::default().with_headers(field_table([("kind", amqp_str("orphan"))]));
    broker.publish("", &inbound, b"orphan", orphan).await;
    broker.await_count(&out, 20, DEFAULT_TIMEOUT).await;
    broker.await_count(&dlq, 1, DEFAULT_TIMEOUT).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let expected: BTreeMap<String, usize> = before
        .iter()
        .chain(&after)
        .map(|b| (b.clone(), 1))
        .collect();
    assert_eq!(
        tally(&broker.get_all(&out).await),
        expected,
        "every message forwarded once"
    );
    let dead = broker.get_all(&dlq).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body, b"orphan");
    assert!(
        dead[0].header("x-death").is_some(),
        "nacked through the re-declared queue's dead-letter exchange"
    );
    assert_eq!(broker.queue_len(&inbound).await, 0);
    delete_all_with_prefix(&p).await;
}

/// SIGHUP, three times, to the real binary: it reloads its (unchanged)
/// configuration each time, keeps consuming and forwarding, and still exits
/// 0 on SIGTERM.
#[tokio::test]
async fn sighup_never_kills_the_forwarder() {
    let p = unique_prefix("sighup");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let mut process = Process::spawn(&p, &Forwarder::new(&p).seed(&p).toml());
    wait_consumers(&broker, &inbound, 1).await;
    const NOTICE: &str = "reloading the configuration";
    for sent in 1..=3 {
        process.signal("HUP");
        wait_until(
            &format!("{sent} reload notice(s) in the log"),
            DEFAULT_TIMEOUT,
            || async { process.log().matches(NOTICE).count() == sent },
        )
        .await;
    }
    assert_eq!(consumer_count(&broker, &inbound).await, Some(1));
    broker
        .publish("", &inbound, b"after-hup", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.service"), 1, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.logging"), 1, DEFAULT_TIMEOUT)
        .await;
    process.signal("TERM");
    let code = process.wait_exit(DEFAULT_TIMEOUT).await;
    assert_eq!(code, Some(0), "log:\n{}", process.log());
    for queue in ["service", "logging"] {
        let got = broker.get_all(&format!("{p}.{queue}")).await;
        assert_eq!(
            got.iter().map(Message::body_str).collect::<Vec<_>>(),
            ["after-hup"]
        );
    }
    assert_eq!(broker.queue_len(&inbound).await, 0);
    delete_all_with_prefix(&p).await;
}

/// Runs the real binary with `uri` as broker "main" until its log names
/// `cause`, then stops it with SIGTERM; returns the log.
async fn refused_run(p: &str, uri: &str, cause: &str) -> String {
    let toml = Forwarder::at(uri, p).seed(p).toml();
    assert!(toml.contains(uri));
    let mut process = Process::spawn(p, &toml);
    wait_until(
        &format!("the log names the refusal: {cause}"),
        DEFAULT_TIMEOUT,
        || async { process.log().contains(cause) },
    )
    .await;
    process.signal("TERM");
    let code = process.wait_exit(Duration::from_secs(10)).await;
    let log = process.log();
    assert_eq!(code, Some(0), "log:\n{log}");
    assert_names_only_the_refusal(&log);
    log
}

/// The refusal is an error naming what to fix, and nothing else is blamed:
/// not the first key switchyard happened to use on that broker, and no
/// library line says recovery was given up while switchyard retries.
fn assert_names_only_the_refusal(log: &str) {
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("broker refused the connection")),
        "an error line:\n{log}"
    );
    for misleading in ["dead_letter.exchange", "aborting recovery", "lapin"] {
        assert!(!log.contains(misleading), "{misleading:?} in:\n{log}");
    }
}

/// A wrong password is an authentication refusal, named as such (and the
/// password is never logged).
#[tokio::test]
async fn a_wrong_password_is_named_in_the_log() {
    let p = unique_prefix("refused-password");
    let password = format!("not-the-password-{}", &p[p.len() - 8..]);
    let uri = format!("amqp://guest:{password}@{}/%2f", amqp_addr());
    let log = refused_run(&p, &uri, "authentication refused by broker main").await;
    assert!(!log.contains(&password), "the password is never logged");
    assert!(support::rabbitmq_queues_with_prefix(&p).await.is_empty());
}

/// A vhost that does not exist is a vhost refusal, named as such.
#[tokio::test]
async fn a_missing_vhost_is_named_in_the_log() {
    let p = unique_prefix("refused-vhost");
    let uri = format!("amqp://guest:guest@{}/{p}-missing", amqp_addr());
    let log = refused_run(&p, &uri, "vhost refused by broker main").await;
    assert!(
        log.contains(&format!("vhost \\\"{p}-missing\\\" does not exist")),
        "{log}"
    );
}

/// A vhost the user may not use (it exists, without permissions for the
/// user) is a vhost refusal too, not an authentication one.
#[tokio::test]
async fn a_vhost_without_permissions_is_named_in_the_log() {
    let p = unique_prefix("refused-access");
    rabbitmqctl(&["add_vhost", &p]).await;
    let uri = format!("amqp://guest:guest@{}/{p}", amqp_addr());
    let log = refused_run(&p, &uri, "vhost refused by broker main").await;
    rabbitmqctl(&["delete_vhost", &p]).await;
    assert!(
        !log.contains("authentication refused"),
        "the credentials are right:\n{log}"
    );
    assert!(
        log.contains(&format!("user \\\"guest\\\" may not use vhost \\\"{p}\\\"")),
        "{log}"
    );
}

/// A broker that cannot be reached is logged once per connection attempt,
/// naming the broker, its node and the next try, and nothing else is
/// blamed for it: the listener here accepts each attempt and hangs up, and
/// counts them.
#[tokio::test]
async fn an_unreachable_broker_is_logged_once_per_attempt() {
    let p = unique_prefix("unreachable");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr: {e}"));
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let hang_up = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    let toml = Forwarder::at(&format!("amqp://guest:guest@{addr}/%2f"), &p)
        .seed(&p)
        .toml();
    let mut process = Process::spawn(&p, &toml);
    let logged = |log: &str| log.matches("broker unreachable").count();
    wait_until(
        "five attempts, each logged once",
        DEFAULT_TIMEOUT,
        || async {
            let n = attempts.load(Ordering::SeqCst);
            n >= 5 && logged(&process.log()) == n
        },
    )
    .await;
    process.signal("TERM");
    assert_eq!(process.wait_exit(Duration::from_secs(10)).await, Some(0));
    hang_up.abort();
    let log = process.log();
    for line in log.lines().filter(|l| l.contains("broker unreachable")) {
        for field in [
            "broker=\"main\"".to_owned(),
            format!("node=\"{addr}\""),
            "retry_in_ms=".to_owned(),
        ] {
            assert!(line.contains(&field), "{field} in {line}");
        }
    }
    for misleading in [
        "inbound broker not ready",
        "dead_letter.exchange",
        "inbound consumer lost",
        "lapin",
    ] {
        assert!(!log.contains(misleading), "{misleading:?} in:\n{log}");
    }
}

/// With `--fail-fast` a wrong password ends the process at start with exit
/// 1 and the reason on stderr, for an orchestrator to act on.
#[tokio::test]
async fn fail_fast_exits_1_on_a_wrong_password() {
    let p = unique_prefix("fail-fast");
    let password = format!("not-the-password-{}", &p[p.len() - 8..]);
    let uri = format!("amqp://guest:{password}@{}/%2f", amqp_addr());
    let toml = Forwarder::at(&uri, &p).seed(&p).toml();
    let mut process = Process::spawn_with(&p, &toml, &["--fail-fast"], &[]);
    let code = process.wait_exit(DEFAULT_TIMEOUT).await;
    let log = process.log();
    assert_eq!(code, Some(1), "log:\n{log}");
    assert!(
        log.lines().last().is_some_and(|l| l
            .starts_with("switchyard: authentication refused by broker main: check the user and password in brokers.main.uri")),
        "the last line says why:\n{log}"
    );
    assert!(!log.contains(&password), "the password is never logged");
    assert_names_only_the_refusal(&log);
    // Said once as the attempt's error and once as the exit line, with no
    // next try promised.
    assert_eq!(
        log.matches("authentication refused by broker main").count(),
        2,
        "{log}"
    );
    assert!(log.contains("not retrying (--fail-fast)"), "{log}");
    assert!(!log.contains("retry_in_ms"), "{log}");
    assert!(support::rabbitmq_queues_with_prefix(&p).await.is_empty());
}

/// A port on loopback where nothing listens.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("no local address: {e}"))
        .port()
}

/// `uris` = a node where nothing listens, the shared broker with a wrong
/// password, the shared broker by another name: with `--fail-fast` the
/// forwarder logs the first two by node (and what was wrong with each),
/// connects to the third and forwards; the password is never logged.
#[tokio::test]
async fn a_cluster_node_that_is_down_or_refuses_is_named_and_the_next_one_used() {
    let p = unique_prefix("nodes-skip");
    let broker = TestBroker::connect(&p).await;
    let password = format!("not-the-password-{}", &p[p.len() - 8..]);
    let port = amqp_addr().port();
    let dead = format!("127.0.0.1:{}", dead_port());
    let (down, refusing, good) = (
        format!("amqp://guest:guest@{dead}/%2f"),
        format!("amqp://guest:{password}@127.0.0.1:{port}/%2f"),
        format!("amqp://guest:guest@localhost:{port}/%2f"),
    );
    let toml = Forwarder::new(&p)
        .broker_nodes("main", &[down, refusing, good])
        .seed(&p)
        .toml();
    let mut process = Process::spawn_with(&p, &toml, &["--fail-fast"], &[]);
    wait_consumers(&broker, &format!("{p}.in"), 1).await;
    broker
        .publish("", &format!("{p}.in"), b"one", BasicProperties::default())
        .await;
    for queue in ["service", "logging"] {
        broker
            .await_count(&format!("{p}.{queue}"), 1, DEFAULT_TIMEOUT)
            .await;
    }
    process.signal("TERM");
    assert_eq!(process.wait_exit(Duration::from_secs(10)).await, Some(0));
    let log = process.log();
    let skipped = |node: &str, next: &str, cause: &str| {
        log.lines().any(|l| {
            l.contains("broker node unreachable; trying the next node")
                && l.contains(&format!("node=\"{node}\""))
                && l.contains(&format!("next=\"{next}\""))
                && l.contains(cause)
        })
    };
    let refusing_node = format!("127.0.0.1:{port}");
    let good_node = format!("localhost:{port}");
    assert!(
        skipped(&dead, &refusing_node, "Connection refused"),
        "the down node is named:\n{log}"
    );
    assert!(
        skipped(&refusing_node, &good_node, "authentication refused"),
        "the refusing node is named with the refusal:\n{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("connected")
            && l.contains(&format!("node=\"{good_node}\""))
            && l.contains("preferred=false")),
        "{log}"
    );
    assert!(!log.contains(&password), "the password is never logged");
    delete_all_with_prefix(&p).await;
}

/// With `--fail-fast`, a broker whose every node refuses the credentials
/// ends the run with exit 1, naming the refusal.
#[tokio::test]
async fn fail_fast_exits_1_when_every_node_refuses() {
    let p = unique_prefix("nodes-refuse");
    let password = format!("not-the-password-{}", &p[p.len() - 8..]);
    let port = amqp_addr().port();
    let uris = [
        format!("amqp://guest:{password}@127.0.0.1:{port}/%2f"),
        format!("amqp://guest:{password}@localhost:{port}/%2f"),
    ];
    let toml = Forwarder::new(&p)
        .broker_nodes("main", &uris)
        .seed(&p)
        .toml();
    let mut process = Process::spawn_with(&p, &toml, &["--fail-fast"], &[]);
    let code = process.wait_exit(DEFAULT_TIMEOUT).await;
    let log = process.log();
    assert_eq!(code, Some(1), "log:\n{log}");
    assert!(
        log.lines()
            .last()
            .is_some_and(|l| l.starts_with("switchyard: authentication refused by broker main")),
        "the last line says why:\n{log}"
    );
    assert!(!log.contains(&password), "the password is never logged");
    assert!(support::rabbitmq_queues_with_prefix(&p).await.is_empty());
}
