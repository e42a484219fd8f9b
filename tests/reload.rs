//! Live reconfiguration against the real broker: routing switched under
//! load, an endpoint's routing key changed, an invalid reload refused, the
//! inbound queue changed, and the real binary reloading on SIGHUP and on a
//! file renamed over its configuration without ever exiting.

use crate::support;

use lapin::BasicProperties;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use support::config::{Branch, Endpoint, Filter, Forwarder, Value};
use support::harness::{InProcess, Process, wait_consumers};
use support::{
    BULK_TIMEOUT, DEFAULT_TIMEOUT, Metrics, TestBroker, delete_all_with_prefix, unique_prefix,
    wait_until,
};
use switchyard::Options;
use switchyard::reload::Reload;
use tokio::sync::mpsc;

/// Every message to the one endpoint `endpoint`, which publishes to queue
/// `<p>.<queue>` on broker "main"; dead letters by `nack`.
fn to_queue(p: &str, endpoint: &str, queue: &str) -> Forwarder {
    to_queue_on(p, "main", endpoint, queue)
}

/// [`to_queue`] with the endpoint on broker `broker`.
fn to_queue_on(p: &str, broker: &str, endpoint: &str, queue: &str) -> Forwarder {
    Forwarder::new(p)
        .endpoint(Endpoint::queue(endpoint, &format!("{p}.{queue}")).on(broker))
        .filter("all", Filter::match_all())
        .branch(Branch::new("all", "all", endpoint))
}

fn settings(toml: &str) -> Reload {
    switchyard::config::load_str(toml, "test.toml")
}

/// An in-process forwarder on `toml` that takes reloads from the returned sender.
fn start_reloadable(toml: &str) -> (InProcess, mpsc::Sender<Reload>) {
    let (tx, rx) = mpsc::channel(4);
    let options = Options {
        reloads: Some(rx),
        ..Default::default()
    };
    (InProcess::start_with(toml, options), tx)
}

fn generation(forwarder: &InProcess) -> Option<f64> {
    Metrics::parse(&forwarder.telemetry().render()).get("switchyard_config_generation", &[])
}

async fn wait_generation(forwarder: &InProcess, n: u32) {
    wait_until(
        &format!("configuration generation {n} is live"),
        DEFAULT_TIMEOUT,
        || async { generation(forwarder) == Some(f64::from(n)) },
    )
    .await;
}

/// Messages in `queue`; one not declared yet holds none.
async fn len(broker: &TestBroker, queue: &str) -> u32 {
    broker.try_queue_len(queue).await.unwrap_or(0)
}

fn seqs(messages: &[support::Message]) -> Vec<u64> {
    messages
        .iter()
        .map(|m| m.body_str().parse().expect("a sequence number"))
        .collect()
}

#[tokio::test]
async fn routing_switched_five_times_under_load_routes_each_message_by_its_consume_time_table() {
    let p = unique_prefix("reload-load");
    let broker = TestBroker::connect(&p).await;
    // Each configuration knows only its own endpoint: a switch adds one and removes the other.
    let to_a = to_queue(&p, "a", "a").toml();
    let to_b = to_queue(&p, "b", "b").toml();
    let (forwarder, reloads) = start_reloadable(&to_a);
    let inbound = format!("{p}.in");
    wait_consumers(&broker, &inbound, 1).await;

    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let publisher = {
        let (stop, published, inbound) = (stop.clone(), published.clone(), inbound.clone());
        let client = TestBroker::connect(&format!("{p}-producer")).await;
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = published.load(Ordering::Relaxed);
                client
                    .publish(
                        "",
                        &inbound,
                        n.to_string().as_bytes(),
                        BasicProperties::default(),
                    )
                    .await;
                published.store(n + 1, Ordering::Relaxed);
            }
            client.close().await;
        })
    };
    let (a, b) = (format!("{p}.a"), format!("{p}.b"));
    wait_until("messages reach A", DEFAULT_TIMEOUT, || async {
        len(&broker, &a).await > 0
    })
    .await;
    for switch in 1..=5u32 {
        let (toml, to) = if switch % 2 == 1 {
            (&to_b, &b)
        } else {
            (&to_a, &a)
        };
        let before = len(&broker, to).await;
        reloads.send(settings(toml)).await.unwrap();
        wait_generation(&forwarder, switch + 1).await;
        // A message consumed after the switch reaches the new destination.
        wait_until(
            &format!("switch {switch} routes to {to}"),
            DEFAULT_TIMEOUT,
            || async { len(&broker, to).await > before },
        )
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    publisher.await.unwrap();
    let total = published.load(Ordering::Relaxed);
    wait_until("every message is forwarded", BULK_TIMEOUT, || async {
        u64::from(broker.queue_len(&a).await + broker.queue_len(&b).await) >= total
    })
    .await;
    forwarder.stop().await.unwrap();

    let in_a = seqs(&broker.get_all(&a).await);
    let in_b = seqs(&broker.get_all(&b).await);
    let mut all: Vec<(u64, char)> = in_a.iter().map(|&n| (n, 'a')).collect();
    all.extend(in_b.iter().map(|&n| (n, 'b')));
    all.sort_unstable();
    let distinct: HashSet<u64> = all.iter().map(|(n, _)| *n).collect();
    assert_eq!(distinct.len(), all.len(), "a message was forwarded twice");
    assert_eq!(all.len() as u64, total, "messages lost: {total} published");
    assert_eq!(broker.queue_len(&inbound).await, 0);
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    // Consumed in order, each routed by the table live when it was consumed:
    // the destinations form six runs, A B A B A B.
    let mut runs = vec![all[0].1];
    for window in all.windows(2) {
        if window[0].1 != window[1].1 {
            runs.push(window[1].1);
        }
    }
    assert_eq!(runs, vec!['a', 'b', 'a', 'b', 'a', 'b'], "{total} messages");
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn a_reload_changes_an_endpoints_routing_key() {
    let p = unique_prefix("reload-key");
    let broker = TestBroker::connect(&p).await;
    let (forwarder, reloads) = start_reloadable(&to_queue(&p, "svc", "one").toml());
    let inbound = format!("{p}.in");
    wait_consumers(&broker, &inbound, 1).await;
    broker
        .publish("", &inbound, b"before", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.one"), 1, DEFAULT_TIMEOUT)
        .await;

    reloads
        .send(settings(&to_queue(&p, "svc", "two").toml()))
        .await
        .unwrap();
    wait_generation(&forwarder, 2).await;
    broker
        .publish("", &inbound, b"after", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.two"), 1, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap();
    let one = broker.get_all(&format!("{p}.one")).await;
    let two = broker.get_all(&format!("{p}.two")).await;
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].body_str(), "before");
    assert_eq!(two.len(), 1);
    assert_eq!(two[0].body_str(), "after");
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn an_invalid_reload_leaves_routing_and_generation_untouched() {
    let p = unique_prefix("reload-invalid");
    let broker = TestBroker::connect(&p).await;
    let original = to_queue(&p, "svc", "one").toml();
    let (forwarder, reloads) = start_reloadable(&original);
    let inbound = format!("{p}.in");
    wait_consumers(&broker, &inbound, 1).await;
    wait_generation(&forwarder, 1).await;

    // Routes to queue two, but names a broker that does not exist.
    let invalid = to_queue_on(&p, "nowhere", "svc", "two").toml();
    let rejected = settings(&invalid);
    let error = rejected.as_ref().map(|_| ()).unwrap_err().to_string();
    assert!(error.contains("endpoints.svc.broker"), "{error}");
    reloads.send(rejected).await.unwrap();
    broker
        .publish("", &inbound, b"m1", BasicProperties::default())
        .await;
    // The same configuration again: generation 2, not 3, proves the invalid
    // one (queued before it) was taken and did not count.
    reloads.send(settings(&original)).await.unwrap();
    wait_generation(&forwarder, 2).await;
    broker
        .publish("", &inbound, b"m2", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.one"), 2, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap();
    assert!(!broker.queue_exists(&format!("{p}.two")).await);
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn an_inbound_change_moves_the_consumer_without_losing_or_repeating_a_message() {
    let p = unique_prefix("reload-inbound");
    let broker = TestBroker::connect(&p).await;
    let config = to_queue(&p, "svc", "out");
    let (forwarder, reloads) = start_reloadable(&config.toml());
    let (old_in, new_in) = (format!("{p}.in"), format!("{p}.in2"));
    wait_consumers(&broker, &old_in, 1).await;
    let count = 300u32;
    broker
        .publish_many(
            "",
            &old_in,
            (0..count).map(|n| n.to_string()),
            BasicProperties::default(),
        )
        .await;
    let moved = config
        .inbound("queue", &new_in)
        .inbound("prefetch", 7)
        .toml();
    reloads.send(settings(&moved)).await.unwrap();
    wait_generation(&forwarder, 2).await;
    wait_consumers(&broker, &new_in, 1).await;
    wait_consumers(&broker, &old_in, 0).await;
    broker
        .publish("", &new_in, b"new", BasicProperties::default())
        .await;
    // The old channel was closed only after its transactions settled, so
    // what it had taken but not yet started went back to the old queue.
    let out = format!("{p}.out");
    wait_until(
        "every message is forwarded or back in the old queue",
        DEFAULT_TIMEOUT,
        || async { len(&broker, &out).await + len(&broker, &old_in).await == count + 1 },
    )
    .await;
    forwarder.stop().await.unwrap();
    let forwarded = broker.get_all(&out).await;
    let left = broker.get_all(&old_in).await;
    let mut seen = HashSet::new();
    for body in forwarded.iter().chain(&left).map(|m| m.body_str()) {
        assert!(seen.insert(body.clone()), "{body} seen twice");
    }
    assert_eq!(seen.len() as u32, count + 1);
    assert!(seen.contains("new"));
    assert_eq!(len(&broker, &format!("{p}.dlq")).await, 0);
    assert_eq!(len(&broker, &new_in).await, 0);
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

/// Waits until the process's log has `n` lines containing every one of `parts`.
async fn wait_log(process: &mut Process, parts: &[&str], n: usize) {
    wait_until(
        &format!("{n} log line(s) with {parts:?}"),
        DEFAULT_TIMEOUT,
        || {
            let log = process.log();
            let found = log
                .lines()
                .filter(|l| parts.iter().all(|p| l.contains(p)))
                .count();
            async move { found >= n }
        },
    )
    .await;
    assert!(
        process.exited().is_none(),
        "exited; log:\n{}",
        process.log()
    );
}

/// Writes `toml` next to the configuration file `process` runs on and
/// renames it over it, as an editor's save does.
fn save_by_rename(process: &Process, toml: &str) {
    let Some(target) = process.config_path() else {
        panic!("the forwarder runs on a configuration file");
    };
    let staged = target.with_extension("toml.new");
    std::fs::write(&staged, toml).unwrap();
    std::fs::rename(&staged, target).unwrap();
}

#[tokio::test]
async fn the_binary_reloads_on_sighup_even_before_it_consumes_and_never_exits() {
    let p = unique_prefix("reload-hup");
    let broker = TestBroker::connect(&p).await;
    let toml = to_queue(&p, "svc", "one").toml();
    let mut process = Process::spawn(&p, &toml);
    // Caught from before the startup summary, so before anything is live.
    wait_log(&mut process, &["starting"], 1).await;
    process.signal("HUP");
    let inbound = format!("{p}.in");
    wait_consumers(&broker, &inbound, 1).await;
    wait_log(
        &mut process,
        &["routing configuration live", "generation=2"],
        1,
    )
    .await;
    // Signals of one kind coalesce while one is pending, so each is sent
    // only once the previous reload is live.
    for generation in 3..=6 {
        process.signal("HUP");
        let live = format!("generation={generation}");
        wait_log(&mut process, &["routing configuration live", &live], 1).await;
    }
    wait_log(&mut process, &["reloading the configuration", "SIGHUP"], 5).await;
    broker
        .publish("", &inbound, b"m", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.one"), 1, DEFAULT_TIMEOUT)
        .await;
    wait_consumers(&broker, &inbound, 1).await;
    process.signal("TERM");
    assert_eq!(process.wait_exit(Duration::from_secs(15)).await, Some(0));
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn the_binary_reloads_a_file_renamed_over_its_configuration_and_rejects_an_invalid_one() {
    let p = unique_prefix("reload-file");
    let broker = TestBroker::connect(&p).await;
    let mut process = Process::spawn(&p, &to_queue(&p, "svc", "one").toml());
    let inbound = format!("{p}.in");
    wait_consumers(&broker, &inbound, 1).await;
    broker
        .publish("", &inbound, b"first", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.one"), 1, DEFAULT_TIMEOUT)
        .await;

    save_by_rename(&process, &to_queue(&p, "svc", "two").toml());
    wait_log(
        &mut process,
        &["routing configuration live", "generation=2"],
        1,
    )
    .await;
    broker
        .publish("", &inbound, b"second", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.two"), 1, DEFAULT_TIMEOUT)
        .await;

    // Routes to queue three, but with a prefetch out of range.
    let invalid = to_queue(&p, "svc", "three").inbound("prefetch", 0).toml();
    save_by_rename(&process, &invalid);
    wait_log(
        &mut process,
        &["configuration reload rejected", "inbound.prefetch"],
        1,
    )
    .await;
    broker
        .publish("", &inbound, b"third", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.two"), 2, DEFAULT_TIMEOUT)
        .await;
    assert!(!process.log().contains("generation=3"), "{}", process.log());
    assert!(!broker.queue_exists(&format!("{p}.three")).await);
    assert_eq!(broker.queue_len(&format!("{p}.one")).await, 1);

    process.signal("TERM");
    assert_eq!(process.wait_exit(Duration::from_secs(15)).await, Some(0));
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

/// Whether a connection named exactly `name` is open on the broker.
async fn connected(name: &str) -> bool {
    support::connection_names().await.iter().any(|n| n == name)
}

#[tokio::test]
async fn a_reload_connects_an_added_broker_and_closes_a_removed_one() {
    let p = unique_prefix("reload-brokers");
    let broker = TestBroker::connect(&p).await;
    let on_broker = |name: &str, queue: &str| {
        to_queue_on(&p, name, "svc", queue)
            .broker(name, &support::amqp_url())
            .toml()
    };
    let (forwarder, reloads) = start_reloadable(&on_broker("old", "one"));
    let inbound = format!("{p}.in");
    wait_consumers(&broker, &inbound, 1).await;
    broker
        .publish("", &inbound, b"first", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.one"), 1, DEFAULT_TIMEOUT)
        .await;
    let (old, new) = (format!("{p}/publish/old"), format!("{p}/publish/new"));
    assert!(connected(&old).await);

    reloads
        .send(settings(&on_broker("new", "two")))
        .await
        .unwrap();
    wait_generation(&forwarder, 2).await;
    broker
        .publish("", &inbound, b"second", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.two"), 1, DEFAULT_TIMEOUT)
        .await;
    assert!(connected(&new).await);
    // No message in flight uses the removed broker any more.
    wait_until(
        "the removed broker's connection is closed",
        DEFAULT_TIMEOUT,
        || async { !connected(&old).await },
    )
    .await;
    forwarder.stop().await.unwrap();
    assert_eq!(broker.queue_len(&format!("{p}.one")).await, 1);
    assert_eq!(len(&broker, &format!("{p}.dlq")).await, 0);
    broker.close().await;
    delete_all_with_prefix(&p).await;
}

/// A session open when a reload turns sessions off (or renames the id
/// header) finishes under the settings it started with: its last messages
/// join it, the set is acked as one and reaches the endpoint whole and in
/// order; a message of the old header that opens no session after the
/// reload is forwarded as an independent message.
#[tokio::test]
async fn open_sessions_finish_under_their_settings_across_a_reload() {
    let p = unique_prefix("reload-sessions");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let queue = format!("{p}.one");
    let plain = to_queue(&p, "svc", "one");
    // Sessions on with four slots, by the default id header or by `id_header`.
    let with = |id_header: Option<&str>| {
        let mut keys = vec![("max_open", Value::from(4))];
        if let Some(header) = id_header {
            keys.push(("id_header", header.into()));
        }
        plain.clone().sessions(&keys).toml()
    };
    let (forwarder, reloads) = start_reloadable(&with(None));
    wait_consumers(&broker, &inbound, 1).await;
    let message = |session: &str, seq: u32, end: bool| {
        let mut headers = vec![("session-id", support::amqp_str(session))];
        if end {
            headers.push(("session-end", lapin::types::AMQPValue::Boolean(true)));
        }
        let props = BasicProperties::default()
            .with_message_id(format!("{session}/{seq}").into())
            .with_headers(support::field_table(headers));
        (format!("{session}/{seq}"), props)
    };
    for (session, reload) in [("off", plain.toml()), ("renamed", with(Some("sid")))] {
        for seq in 0..2 {
            let (body, props) = message(session, seq, false);
            broker.publish("", &inbound, body.as_bytes(), props).await;
        }
        wait_until(
            "the open session holds two messages",
            DEFAULT_TIMEOUT,
            || async { support::ready_unacked(&inbound).await == Some((0, 2)) },
        )
        .await;
        let before = generation(&forwarder).unwrap_or_default() as u32;
        let _ = reloads.send(settings(&reload)).await;
        wait_generation(&forwarder, before + 1).await;
        let (body, props) = message(session, 2, true);
        broker.publish("", &inbound, body.as_bytes(), props).await;
        // A new message of the old header is no session now: forwarded alone.
        let (body, props) = message(&format!("{session}-new"), 0, false);
        broker.publish("", &inbound, body.as_bytes(), props).await;
        wait_until("everything is acked", DEFAULT_TIMEOUT, || async {
            support::ready_unacked(&inbound).await == Some((0, 0))
        })
        .await;
        let got: Vec<String> = broker
            .get_all(&queue)
            .await
            .iter()
            .map(|m| m.body_str())
            .collect();
        let mut session_part: Vec<&String> = got
            .iter()
            .filter(|b| b.starts_with(&format!("{session}/")))
            .collect();
        session_part.dedup();
        assert_eq!(
            session_part,
            [
                &format!("{session}/0"),
                &format!("{session}/1"),
                &format!("{session}/2")
            ],
            "{got:?}"
        );
        assert!(got.contains(&format!("{session}-new/0")), "{got:?}");
        assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
        // Back to sessions on, by the original header, for the next round.
        let before = generation(&forwarder).unwrap_or_default() as u32;
        let _ = reloads.send(settings(&with(None))).await;
        wait_generation(&forwarder, before + 1).await;
    }
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    broker.close().await;
    delete_all_with_prefix(&p).await;
}
