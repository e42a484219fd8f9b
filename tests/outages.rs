//! An outage is not a message failure (the default), even beside a
//! refusal: a broker restarted twice mid-stream dead-letters nothing, in
//! either dead-letter mode (two forwarders side by side under the same
//! restarts, one per mode); a broker that stops answering confirms on
//! every endpoint holds the messages and delivers them once it answers
//! again; a primary refusing every copy while the backup's connection is
//! closed under copies on their way to it dead-letters nothing; and with
//! `outage = "dead_letter"` and `outage_timeout_ms` an outage past the
//! bound dead-letters with reason `outage`.

use crate::support;

use lapin::BasicProperties;
use std::collections::BTreeMap;
use std::time::Duration;
use support::harness::{
    InProcess, Process, endpoint_toml, one_branch_toml, seed_toml, top_toml_at,
};
use support::node::PrivateNode;
use support::{
    DEFAULT_TIMEOUT, FaultProxy, TestBroker, amqp_addr, delete_all_with_prefix, ready_unacked,
    ready_unacked_in, tally_queues, unique_prefix, wait_until,
};

const STREAM: u32 = 3000;

fn message(i: u32) -> (String, BasicProperties) {
    let id = format!("m{i:05}");
    let props = BasicProperties::default()
        .with_message_id(id.as_str().into())
        .with_delivery_mode(2);
    (id, props)
}

/// Publishes `m0..m<n>` to `queue` on `url` at a steady pace, each with a
/// confirm; an unconfirmed one (the broker restarting) is published again
/// on a new connection: duplicates, never gaps. Returns how many were
/// published again.
async fn stream(url: String, queue: String, n: u32) -> u32 {
    let mut republished = 0;
    let mut channel: Option<(lapin::Connection, lapin::Channel)> = None;
    let mut i = 0;
    while i < n {
        let Some((connection, ch)) = &channel else {
            channel = confirm_channel(&url).await;
            if channel.is_none() {
                // The broker is down: try again shortly.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            continue;
        };
        let (id, props) = message(i);
        let options = lapin::options::BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let sent = async {
            ch.basic_publish(
                "".into(),
                queue.as_str().into(),
                options,
                id.as_bytes(),
                props,
            )
            .await?
            .await
        };
        match tokio::time::timeout(Duration::from_secs(10), sent).await {
            Ok(Ok(confirm)) if confirm.is_ack() => i += 1,
            _ => {
                republished += 1;
                // A connection the restart broke may never answer its close.
                let _ = tokio::time::timeout(CLIENT_WAIT, connection.close(200, "".into())).await;
                channel = None;
            }
        }
        // The pace: a stream, not a backlog, so the restarts land mid-way.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    if let Some((connection, _)) = channel {
        let _ = tokio::time::timeout(CLIENT_WAIT, connection.close(200, "".into())).await;
    }
    republished
}

/// How long the test's publisher waits for a connect or a close before it
/// gives up on that connection (a broker mid-restart may never answer).
const CLIENT_WAIT: Duration = Duration::from_secs(10);

async fn confirm_channel(url: &str) -> Option<(lapin::Connection, lapin::Channel)> {
    tokio::time::timeout(CLIENT_WAIT, open_confirm_channel(url))
        .await
        .ok()
        .flatten()
}

async fn open_confirm_channel(url: &str) -> Option<(lapin::Connection, lapin::Channel)> {
    let properties = lapin::ConnectionProperties::default();
    let connection = lapin::Connection::connect(url, properties).await.ok()?;
    let channel = connection.create_channel().await.ok()?;
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .ok()?;
    Some((connection, channel))
}

/// New copies on the service branch that show messages flow through the
/// forwarder, before each restart of [`restarted_twice_in_both_modes`].
const FLOWING: u64 = 100;

/// The dead-letter modes the restarts are run in, side by side.
const MODES: [&str; 2] = ["nack", "republish"];

/// Copies the service branch of prefix `p` holds in a node's queue table,
/// primary and backup.
fn service_copies(table: &str, p: &str) -> u64 {
    [format!("{p}.service"), format!("{p}.service.backup")]
        .iter()
        .filter_map(|queue| ready_unacked_in(table, queue))
        .map(|(ready, _)| ready)
        .sum()
}

/// One forwarder of [`restarted_twice_in_both_modes`]: its dead-letter
/// mode, queue prefix and process.
struct ModeRun {
    mode: &'static str,
    p: String,
    inbound: String,
    forwarder: Process,
}

/// The seed scenario on a private node restarted twice (5 s down each)
/// while a stream of messages flows, with two forwarders side by side, one
/// in each dead-letter mode, each on queues of its own and fed a stream of
/// its own: the same restarts reach both, and for each every message
/// reaches both branches, none is dead-lettered.
async fn restarted_twice_in_both_modes() {
    let node = PrivateNode::start().await;
    let mut runs = Vec::new();
    for mode in MODES {
        let p = unique_prefix(&format!("outage-restart-{mode}"));
        let toml = seed_toml(&p, &top_toml_at(&node.amqp_url(), &p, mode, 5000, 200));
        let inbound = format!("{p}.in");
        let forwarder = Process::spawn(&p, &toml);
        runs.push(ModeRun {
            mode,
            p,
            inbound,
            forwarder,
        });
    }
    let admin = TestBroker::connect_to(&node.amqp_url(), "outage-restart-admin").await;
    for run in &runs {
        wait_until("the forwarder consumes", DEFAULT_TIMEOUT, || async {
            node.ready_unacked(&run.inbound).await.is_some()
                && admin
                    .probe_queue(&run.inbound)
                    .await
                    .is_some_and(|q| q.consumer_count() == 1)
        })
        .await;
    }
    admin.close().await;
    let publishers: Vec<_> = runs
        .iter()
        .map(|run| tokio::spawn(stream(node.amqp_url(), run.inbound.clone(), STREAM)))
        .collect();
    for _ in 0..2 {
        // Restart while messages flow through both forwarders, however long
        // they took to reconnect after the previous restart.
        let table = node.queue_table().await;
        let before: Vec<u64> = runs.iter().map(|r| service_copies(&table, &r.p)).collect();
        wait_until(
            "messages flow to both service branches",
            DEFAULT_TIMEOUT,
            || async {
                let table = node.queue_table().await;
                runs.iter()
                    .zip(&before)
                    .all(|(r, b)| service_copies(&table, &r.p) >= b + FLOWING)
            },
        )
        .await;
        node.stop_app().await;
        // The outage itself, not a wait for a condition: how long the broker
        // stays down.
        tokio::time::sleep(Duration::from_secs(5)).await;
        node.start_app().await;
    }
    let mut republished = Vec::new();
    for publisher in publishers {
        republished.push(publisher.await.unwrap_or_default());
    }
    wait_until(
        "both inbound queues settle",
        Duration::from_secs(120),
        || async {
            let table = node.queue_table().await;
            runs.iter()
                .all(|r| ready_unacked_in(&table, &r.inbound) == Some((0, 0)))
        },
    )
    .await;
    for run in &mut runs {
        run.forwarder.signal("TERM");
        assert_eq!(
            run.forwarder.wait_exit(DEFAULT_TIMEOUT).await,
            Some(0),
            "{}",
            run.mode
        );
    }
    let broker = TestBroker::connect_to(&node.amqp_url(), "outage-restart-count").await;
    for (run, republished) in runs.iter().zip(republished) {
        let (mode, p) = (run.mode, &run.p);
        let service = tally_queues(
            &broker,
            &[format!("{p}.service"), format!("{p}.service.backup")],
        )
        .await;
        let logging = tally_queues(
            &broker,
            &[format!("{p}.logging"), format!("{p}.logging.backup")],
        )
        .await;
        let dead = broker.queue_len(&format!("{p}.dlq")).await;
        let duplicates = |t: &BTreeMap<String, usize>| t.values().map(|n| n - 1).sum::<usize>();
        println!(
            "{mode}: {republished} publishes repeated; service {} ids ({} duplicates), logging \
             {} ids ({} duplicates), {dead} dead-lettered",
            service.len(),
            duplicates(&service),
            logging.len(),
            duplicates(&logging),
        );
        let log = run.forwarder.log();
        assert!(
            log.contains("broker unreachable") && log.contains("inbound consumer lost"),
            "{mode}: the restarts reached the forwarder:\n{log}"
        );
        assert_eq!(dead, 0, "{mode}: an outage dead-letters nothing");
        for i in 0..STREAM {
            let (id, _) = message(i);
            assert!(
                service.contains_key(&id),
                "{mode}: {id} missing from service"
            );
            assert!(
                logging.contains_key(&id),
                "{mode}: {id} missing from logging"
            );
        }
    }
    broker.close().await;
    node.stop().await;
}

#[tokio::test]
async fn a_broker_restarted_twice_mid_stream_dead_letters_nothing_with_nack_or_republish() {
    restarted_twice_in_both_modes().await;
}

/// One branch over two endpoints on broker "edge", reached through `proxy`.
fn behind(p: &str, proxy: &FaultProxy, mode: &str, branch_extra: &str) -> String {
    let confirm = "confirm_timeout_ms = 500\nprobe_interval_ms = 200";
    one_branch_toml(
        p,
        mode,
        &format!("\n[brokers.edge]\nuri = \"{}\"\n", proxy.amqp_url()),
        &endpoint_toml("primary", "edge", &format!("{p}.primary"), true, confirm),
        &endpoint_toml("backup", "edge", &format!("{p}.backup"), true, confirm),
    )
    .replace(
        "backup_list = \"backups\"\n",
        &format!("backup_list = \"backups\"\n{branch_extra}"),
    )
}

async fn publish_ids(broker: &TestBroker, queue: &str, range: std::ops::Range<u32>) {
    for i in range {
        let (id, props) = message(i);
        broker.publish("", queue, id.as_bytes(), props).await;
    }
}

#[tokio::test]
async fn a_broker_that_stops_confirming_holds_the_messages_then_delivers_them() {
    let p = unique_prefix("outage-stall");
    let broker = TestBroker::connect(&p).await;
    let proxy = FaultProxy::start(amqp_addr()).await;
    let inbound = format!("{p}.in");
    let toml = behind(&p, &proxy, "republish", "");
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    publish_ids(&broker, &inbound, 0..5).await;
    broker
        .await_count(&format!("{p}.primary"), 5, DEFAULT_TIMEOUT)
        .await;

    // Every endpoint of the list is on the stalled broker: each confirm
    // times out (500 ms), on the primary and on the backup.
    proxy.stall();
    publish_ids(&broker, &inbound, 5..25).await;
    wait_until("the twenty are held", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound)
            .await
            .is_some_and(|(r, u)| r + u >= 20)
    })
    .await;
    // "Held, not dead-lettered" is the absence of an event, so it is
    // watched for a while rather than awaited.
    let watched = tokio::time::Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            broker.queue_len(&format!("{p}.dlq")).await,
            0,
            "held, not dead-lettered"
        );
        tokio::time::sleep(support::POLL_INTERVAL).await;
    }
    let text = forwarder.telemetry().render();
    assert!(
        text.contains("switchyard_outage_holds "),
        "the holds are a metric:\n{text}"
    );

    proxy.resume();
    wait_until(
        "the held messages are delivered",
        DEFAULT_TIMEOUT,
        || async { ready_unacked(&inbound).await == Some((0, 0)) },
    )
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let copies = tally_queues(&broker, &[format!("{p}.primary"), format!("{p}.backup")]).await;
    for i in 0..25 {
        let (id, _) = message(i);
        assert!(copies.contains_key(&id), "{id} lost");
    }
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    drop(proxy);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn with_outage_dead_letter_an_outage_past_its_bound_dead_letters_with_reason_outage() {
    let p = unique_prefix("outage-bound");
    let broker = TestBroker::connect(&p).await;
    let proxy = FaultProxy::start(amqp_addr()).await;
    let inbound = format!("{p}.in");
    let toml = behind(
        &p,
        &proxy,
        "republish",
        "outage = \"dead_letter\"\noutage_timeout_ms = 2000\n",
    );
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    publish_ids(&broker, &inbound, 0..3).await;
    broker
        .await_count(&format!("{p}.primary"), 3, DEFAULT_TIMEOUT)
        .await;
    // Acked too, so their confirms cannot be caught by the cut.
    wait_until("the first three are acked", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 0))
    })
    .await;

    proxy.refuse(true);
    proxy.cut();
    let cut_at = tokio::time::Instant::now();
    publish_ids(&broker, &inbound, 3..8).await;
    let dlq = format!("{p}.dlq");
    broker.await_count(&dlq, 5, DEFAULT_TIMEOUT).await;
    assert!(
        cut_at.elapsed() >= Duration::from_millis(1900),
        "held for the bound first ({:?})",
        cut_at.elapsed()
    );
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let dead = broker.get_all(&dlq).await;
    assert_eq!(dead.len(), 5);
    for m in &dead {
        assert_eq!(
            m.header_str("x-switchyard-reason").as_deref(),
            Some("outage"),
            "{}",
            m.body_str()
        );
    }
    drop(proxy);
    delete_all_with_prefix(&p).await;
}

/// The seed scenario with its service primary refusing every copy (a queue
/// at `x-max-length = 0` with `reject-publish`, so the broker nacks), while
/// the broker closes (`rabbitmqctl close_connection`) the connection the
/// backup is published on, twice under 10,000 messages, each time with
/// copies on their way to it: the primary refused them and the backup
/// could not be reached for them, so they are held until it is back,
/// never dead-lettered. The backup's broker is the same RabbitMQ through a
/// proxy, which holds what the forwarder sends for an instant before each
/// close, so that copies are in flight when it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_primary_and_closed_connections_together_dead_letter_nothing() {
    const MESSAGES: u32 = 10_000;
    let p = unique_prefix("refuse-close");
    let broker = TestBroker::connect(&p).await;
    let refusing = support::field_table([
        ("x-max-length", lapin::types::AMQPValue::LongLongInt(0)),
        ("x-overflow", support::amqp_str("reject-publish")),
    ]);
    broker
        .declare_queue_with(&format!("{p}.service"), refusing)
        .await;
    for queue in ["service.backup", "logging", "logging.backup"] {
        broker.declare_queue(&format!("{p}.{queue}")).await;
    }
    let proxy = FaultProxy::start(amqp_addr()).await;
    let toml = support::config::Forwarder::new(&p)
        .broker("backup", &proxy.amqp_url())
        .seed_with(&p, |e| {
            let e = e.undeclared();
            if e.name() == "service_backup" {
                e.on("backup")
            } else {
                e
            }
        })
        .toml();
    let inbound = format!("{p}.in");
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    // A backlog: the forwarder works through it at full prefetch.
    let messages = (0..MESSAGES).map(|i| {
        let id = format!("{p}-{i:05}");
        let props = BasicProperties::default().with_message_id(id.as_str().into());
        (id, props)
    });
    broker.publish_windowed("", &inbound, messages, 1_000).await;
    let backup = format!("{p}.service.backup");
    let connection = format!("{p}/publish/backup");
    let mut closed = 0;
    for after in [1_000, 5_000] {
        wait_until(
            &format!("{after} copies on the backup"),
            Duration::from_secs(90),
            || async { broker.queue_len(&backup).await >= after },
        )
        .await;
        proxy.stall_upstream();
        let held = proxy.held();
        wait_until(
            "copies on their way to the backup",
            DEFAULT_TIMEOUT,
            || async { proxy.held() > held },
        )
        .await;
        closed += support::close_connections_named(&connection).await;
        proxy.resume();
    }
    assert_eq!(closed, 2, "the backup's connection was closed twice");
    let queues: Vec<String> = ["service", "service.backup", "logging", "logging.backup"]
        .iter()
        .map(|q| format!("{p}.{q}"))
        .collect();
    wait_until(
        &format!("{inbound} settled"),
        Duration::from_secs(180),
        || async { ready_unacked(&inbound).await == Some((0, 0)) },
    )
    .await;
    let dead = broker.queue_len(&format!("{p}.dlq")).await;
    forwarder
        .stop()
        .await
        .unwrap_or_else(|e| panic!("stop: {e}"));
    assert_eq!(
        dead, 0,
        "a refusal beside a closed connection dead-letters nothing"
    );
    assert_eq!(
        broker.queue_len(&queues[0]).await,
        0,
        "the primary refuses all"
    );
    let service = tally_queues(&broker, &queues[..2]).await;
    let logging = tally_queues(&broker, &queues[2..]).await;
    let mut duplicates = 0;
    for i in 0..MESSAGES {
        let id = format!("{p}-{i:05}");
        for (branch, got) in [("service", &service), ("logging", &logging)] {
            let n = got.get(&id).copied().unwrap_or(0);
            assert!(n >= 1, "{id} never reached {branch}");
            duplicates += n - 1;
        }
    }
    println!(
        "{MESSAGES} messages, the backup's connection closed twice with copies in flight: \
         none lost, none dead-lettered, {duplicates} duplicate copies"
    );
    delete_all_with_prefix(&p).await;
}
