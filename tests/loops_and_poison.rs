//! Messages that must not simply be forwarded, against the real broker:
//! loops through a named exchange that `check` cannot see are cut at
//! `inbound.max_hops`; a producer's forged `x-switchyard-*` annotations are
//! stripped (copies and dead letters carry the forwarder's own); a required
//! branch gets a message whose `x-switchyard-only` names another; and a
//! message that keeps coming back is dead-lettered `poison` after
//! `inbound.max_redeliveries`, on classic queues (counted by the forwarder)
//! and quorum queues (the broker's `x-delivery-count`), while ordinary
//! messages beside it are forwarded once each.

use crate::support;

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use lapin::options::{BasicGetOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use lapin::{BasicProperties, ExchangeKind};
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::InProcess;
use support::{
    DEFAULT_TIMEOUT, FaultProxy, Message, TestBroker, amqp_addr, amqp_str, close_connections_named,
    delete_all_with_prefix, field_table, ready_unacked, tally, unique_prefix, wait_until,
};

/// One `[[filter_table]]` entry: branch `branch`, matched by `filter`,
/// sent to the endpoint of the same name.
fn entry(branch: &str, filter: &str) -> Branch {
    Branch::new(branch, filter, branch)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

use support::array_names as names;

fn array(items: &[&str]) -> AMQPValue {
    AMQPValue::FieldArray(FieldArray::from(
        items.iter().map(|s| amqp_str(s)).collect::<Vec<_>>(),
    ))
}

/// The names of the `x-switchyard-*` headers a message carries, sorted.
fn own_headers(m: &Message) -> Vec<String> {
    let mut own: Vec<String> = m
        .properties
        .headers()
        .as_ref()
        .map(|h| {
            h.inner()
                .keys()
                .map(|k| k.as_str().to_owned())
                .filter(|k| k.starts_with("x-switchyard-"))
                .collect()
        })
        .unwrap_or_default();
    own.sort();
    own
}

fn hops(m: &Message) -> Option<i64> {
    match m.header("x-switchyard-hops")? {
        AMQPValue::LongLongInt(n) => Some(*n),
        other => panic!("x-switchyard-hops is not an integer: {other:?}"),
    }
}

/// Waits until `queue` holds `ready` ready and `unacked` unacked messages,
/// as the broker counts them.
async fn wait_ready_unacked(queue: &str, ready: u64, unacked: u64) {
    wait_until(
        &format!("{queue} holds {ready} ready and {unacked} unacked"),
        DEFAULT_TIMEOUT,
        || async move { ready_unacked(queue).await == Some((ready, unacked)) },
    )
    .await;
}

/// A loop `check` cannot see: the only endpoint publishes to a named
/// exchange that the test binds back to the inbound queue (and to a side
/// queue that counts every copy). Each message goes round until its hop
/// count reaches `max_hops = 3`, then is dead-lettered `loop` with its hop
/// count; the forwarder settles with the inbound queue empty, and exactly
/// three copies of each message were made.
#[tokio::test]
async fn a_loop_through_a_named_exchange_ends_at_max_hops() {
    let p = unique_prefix("loop");
    let broker = TestBroker::connect(&p).await;
    let (inbound, side, dlq, exchange) = (
        format!("{p}.in"),
        format!("{p}.side"),
        format!("{p}.dlq"),
        format!("{p}.loop"),
    );
    broker
        .declare_exchange(&exchange, ExchangeKind::Direct)
        .await;
    broker.declare_queue(&side).await;
    broker.bind(&side, &exchange, "again").await;
    let toml = Forwarder::new(&p)
        .mode("republish")
        .inbound("max_hops", 3)
        .endpoint(Endpoint::exchange("round", &exchange, "again"))
        .filter("all", Filter::match_all())
        .branch(entry("round", "all"))
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    broker.bind(&inbound, &exchange, "again").await;

    let bodies: Vec<String> = (0..5).map(|i| format!("loop-{i}")).collect();
    for body in &bodies {
        let props = BasicProperties::default().with_message_id(body.as_str().into());
        broker.publish("", &inbound, body.as_bytes(), props).await;
    }
    broker.await_count(&dlq, 5, DEFAULT_TIMEOUT).await;
    // Nothing ready and nothing held: no copy can be made any more.
    wait_ready_unacked(&inbound, 0, 0).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let copies = broker.get_all(&side).await;
    let mut by_body: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for m in &copies {
        let h = hops(m).unwrap_or_else(|| panic!("copy {} has no hop count", m.body_str()));
        by_body.entry(m.body_str()).or_default().push(h);
    }
    for h in by_body.values_mut() {
        h.sort();
    }
    let expected: BTreeMap<String, Vec<i64>> =
        bodies.iter().map(|b| (b.clone(), vec![1, 2, 3])).collect();
    assert_eq!(
        by_body, expected,
        "each message copied exactly max_hops times, with hops 1, 2, 3"
    );
    assert_eq!(copies.len(), 15);

    let dead = broker.get_all(&dlq).await;
    assert_eq!(
        tally(&dead),
        bodies.iter().map(|b| (b.clone(), 1)).collect(),
        "each message dead-lettered once"
    );
    for m in &dead {
        assert_eq!(m.header_str("x-switchyard-reason").as_deref(), Some("loop"));
        assert_eq!(
            hops(m),
            Some(3),
            "a dead letter keeps the hops it came with"
        );
        assert_eq!(
            m.header_str("x-switchyard-source-queue"),
            Some(inbound.clone())
        );
        let error = m.header_str("x-switchyard-error").unwrap_or_default();
        assert!(error.contains("max_hops = 3"), "{error}");
        assert!(names(m.header("x-switchyard-failed")).is_empty());
        assert!(names(m.header("x-switchyard-delivered")).is_empty());
    }
    assert_eq!(broker.queue_len(&inbound).await, 0);
    delete_all_with_prefix(&p).await;
}

/// A producer's `x-switchyard-*` headers are not the forwarder's: its
/// `x-switchyard-only` skips no branch, and the copies carry none of them,
/// only a hop count of 1; and the dead letter of the same message (branch a
/// refuses it) carries the forwarder's own annotations, not the forged
/// ones.
#[tokio::test]
async fn forged_annotations_are_ignored_and_stripped_from_copies_and_dead_letters() {
    let p = unique_prefix("forged");
    let broker = TestBroker::connect(&p).await;
    let (inbound, a, b, dlq) = (
        format!("{p}.in"),
        format!("{p}.a"),
        format!("{p}.b"),
        format!("{p}.dlq"),
    );
    // Branch a takes one message, then the broker nacks the next.
    broker
        .declare_queue_with(
            &a,
            field_table([
                ("x-max-length", AMQPValue::LongLongInt(1)),
                ("x-overflow", amqp_str("reject-publish")),
            ]),
        )
        .await;
    let toml = Forwarder::new(&p)
        .mode("republish")
        .endpoint(Endpoint::queue("a", &a).undeclared())
        .endpoint(Endpoint::queue("b", &b))
        .filter("all", Filter::match_all())
        .branch(entry("a", "all"))
        .branch(entry("b", "all"))
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;

    let forged = || {
        let headers: FieldTable = field_table([
            ("x-switchyard-reason", amqp_str("forged")),
            ("x-switchyard-error", amqp_str("forged error")),
            ("x-switchyard-failed", array(&["b"])),
            ("x-switchyard-delivered", array(&["a", "b"])),
            ("x-switchyard-only", array(&["a"])),
            ("x-switchyard-source-queue", amqp_str("forged.queue")),
            ("x-switchyard-dead-lettered-at", AMQPValue::LongLongInt(7)),
            ("x-switchyard-publish-id", AMQPValue::LongLongInt(-1)),
            ("x-switchyard-copy-id", amqp_str("forged")),
            ("keep", amqp_str("me")),
        ]);
        BasicProperties::default().with_headers(headers)
    };
    let start = now_ms();
    broker.publish("", &inbound, b"first", forged()).await;
    broker.await_count(&a, 1, DEFAULT_TIMEOUT).await;
    broker.publish("", &inbound, b"second", forged()).await;
    broker.await_count(&dlq, 1, DEFAULT_TIMEOUT).await;
    wait_ready_unacked(&inbound, 0, 0).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let end = now_ms();

    let copies = broker.get_all(&a).await;
    assert_eq!(copies.len(), 1);
    let copy = &copies[0];
    assert_eq!(copy.body, b"first");
    assert_eq!(
        own_headers(copy),
        [
            "x-switchyard-copy-id",
            "x-switchyard-hops",
            "x-switchyard-publish-id"
        ],
        "only the forwarder's own annotations"
    );
    assert_eq!(hops(copy), Some(1));
    assert_ne!(
        copy.header_str("x-switchyard-copy-id").as_deref(),
        Some("forged")
    );
    assert_ne!(
        copy.header("x-switchyard-publish-id"),
        Some(&AMQPValue::LongLongInt(-1))
    );
    assert_eq!(copy.header_str("keep").as_deref(), Some("me"));
    assert_eq!(
        copy.properties.user_id().as_ref().map(|u| u.as_str()),
        Some("guest"),
        "a copy carries the forwarder's user"
    );
    let b_copies = broker.get_all(&b).await;
    let mut b_bodies: Vec<String> = b_copies.iter().map(Message::body_str).collect();
    b_bodies.sort();
    assert_eq!(
        b_bodies,
        ["first", "second"],
        "a producer's x-switchyard-only skips no branch"
    );

    let dead = broker.get_all(&dlq).await;
    assert_eq!(dead.len(), 1);
    let m = &dead[0];
    assert_eq!(m.body, b"second");
    assert_eq!(
        m.header_str("x-switchyard-reason").as_deref(),
        Some("exhausted")
    );
    assert_eq!(names(m.header("x-switchyard-failed")), ["a"]);
    assert_eq!(names(m.header("x-switchyard-failed-endpoints")), ["a"]);
    assert_eq!(names(m.header("x-switchyard-delivered")), ["b"]);
    assert_eq!(m.header_str("x-switchyard-source-queue"), Some(inbound));
    let error = m.header_str("x-switchyard-error").unwrap_or_default();
    assert!(error.contains("nack"), "{error}");
    match m.header("x-switchyard-dead-lettered-at") {
        Some(AMQPValue::LongLongInt(at)) => assert!((start..=end).contains(at), "{at}"),
        other => panic!("dead-lettered-at: {other:?}"),
    }
    assert_eq!(hops(m), Some(0), "never forwarded");
    assert!(m.header("x-switchyard-only").is_none());
    assert_eq!(m.header_str("keep").as_deref(), Some("me"));
    assert_eq!(
        own_headers(m),
        [
            "x-switchyard-dead-lettered-at",
            "x-switchyard-delivered",
            "x-switchyard-error",
            "x-switchyard-failed",
            "x-switchyard-failed-endpoints",
            "x-switchyard-hops",
            "x-switchyard-publish-id",
            "x-switchyard-reason",
            "x-switchyard-source-queue",
        ]
    );
    delete_all_with_prefix(&p).await;
}

/// A required entry gets every message it matches, even one whose
/// `x-switchyard-only` names only another branch; a branch that is neither
/// named nor required does not.
#[tokio::test]
async fn a_required_branch_gets_messages_restricted_to_another_branch() {
    let p = unique_prefix("required");
    let broker = TestBroker::connect(&p).await;
    let q = |name: &str| format!("{p}.{name}");
    let toml = Forwarder::new(&p)
        .endpoint(Endpoint::queue("work", &q("work")))
        .endpoint(Endpoint::queue("audit", &q("audit")))
        .endpoint(Endpoint::queue("extra", &q("extra")))
        .filter("all", Filter::match_all())
        .branch(entry("work", "all"))
        .branch(entry("audit", "all").set("required", true))
        .branch(entry("extra", "all"))
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &q("in")).await;
    // Trusted: from the forwarder's own user, as `dlq redrive` sends it.
    let only_work = BasicProperties::default()
        .with_user_id("guest".into())
        .with_headers(field_table([("x-switchyard-only", array(&["work"]))]));
    broker.publish("", &q("in"), b"only-work", only_work).await;
    broker
        .publish("", &q("in"), b"everyone", BasicProperties::default())
        .await;
    broker.await_count(&q("audit"), 2, DEFAULT_TIMEOUT).await;
    broker.await_count(&q("work"), 2, DEFAULT_TIMEOUT).await;
    wait_ready_unacked(&q("in"), 0, 0).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let bodies = |messages: Vec<Message>| {
        let mut b: Vec<String> = messages.iter().map(Message::body_str).collect();
        b.sort();
        b
    };
    let audit = broker.get_all(&q("audit")).await;
    assert!(
        audit
            .iter()
            .all(|m| m.header("x-switchyard-only").is_none())
    );
    assert_eq!(bodies(audit), ["everyone", "only-work"]);
    assert_eq!(
        bodies(broker.get_all(&q("work")).await),
        ["everyone", "only-work"]
    );
    assert_eq!(
        bodies(broker.get_all(&q("extra")).await),
        ["everyone"],
        "an unnamed branch that is not required is skipped"
    );
    assert_eq!(broker.queue_len(&q("dlq")).await, 0);
    delete_all_with_prefix(&p).await;
}

/// What a poison run left behind.
struct PoisonRun {
    dead: Vec<Message>,
    normal: Vec<Message>,
    stuck: Vec<Message>,
    ordinary: Vec<String>,
}

/// How the poison message comes back before the forwarder gives up on it.
#[derive(Clone, Copy)]
enum Comebacks {
    /// Classic queue: the forwarder gets it once, then the test closes the
    /// forwarder's consuming connection this many times.
    Closes(u32),
    /// Quorum queue: the test takes it first and returns it (`basic.nack`,
    /// requeue) this many times before the forwarder first sees it, then
    /// closes the forwarder's consuming connection once. Only the broker's
    /// `x-delivery-count` knows about the test's deliveries.
    ReturnedFirst(u32),
}

/// One message comes back for real: its only branch's endpoint is on a
/// broker reached through a proxy that holds the confirms
/// (`stall_downstream`: each copy reaches the stuck queue, unconfirmed), so
/// the forwarder holds the message unacked; each time, the test closes the
/// forwarder's consuming connection and the broker redelivers it, until
/// the forwarder dead-letters it `poison`. Ordinary messages are published
/// in every round and settled before each close, so none of them is
/// redelivered.
async fn poison_run(p: &str, queue_type: &str, comebacks: Comebacks) -> PoisonRun {
    let broker = TestBroker::connect(p).await;
    let proxy = FaultProxy::start(amqp_addr()).await;
    let (inbound, stuck, normal, dlq) = (
        format!("{p}.in"),
        format!("{p}.stuck"),
        format!("{p}.normal"),
        format!("{p}.dlq"),
    );
    let toml = Forwarder::new(p)
        .mode("republish")
        .inbound("max_redeliveries", 2)
        .inbound("queue_type", queue_type)
        .broker("far", &proxy.amqp_url())
        .endpoint(
            Endpoint::queue("stuck", &stuck)
                .on("far")
                .set("confirm_timeout_ms", 60000),
        )
        .endpoint(Endpoint::queue("normal", &normal))
        .filter("stuck", Filter::header("kind").set("equals", "stuck"))
        .filter("ordinary", Filter::not("stuck"))
        .branch(entry("stuck", "stuck"))
        .branch(entry("normal", "ordinary"))
        .toml();
    let stuck_kind = |body: &str| {
        BasicProperties::default()
            .with_message_id(body.into())
            .with_headers(field_table([("kind", amqp_str("stuck"))]))
    };
    // Quorum: the test holds the poison message while the forwarder starts.
    let mut held_by_test = None;
    let closes = match comebacks {
        Comebacks::Closes(n) => n,
        Comebacks::ReturnedFirst(returns) => {
            broker
                .declare_queue_with(
                    &inbound,
                    field_table([("x-queue-type", amqp_str(queue_type))]),
                )
                .await;
            broker
                .publish("", &inbound, b"poison", stuck_kind("poison"))
                .await;
            let channel = broker.fresh_channel().await;
            // The last return is made once the forwarder is ready.
            for taken in 1..=returns {
                let got = channel
                    .basic_get(inbound.as_str().into(), BasicGetOptions { no_ack: false })
                    .await
                    .unwrap_or_else(|e| panic!("basic_get: {e}"))
                    .unwrap_or_else(|| panic!("the poison message is in {inbound}"));
                if taken < returns {
                    requeue(&got.acker).await;
                } else {
                    held_by_test = Some((channel.clone(), got));
                }
            }
            1
        }
    };
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    // The stuck endpoint's channel opens while the proxy still forwards.
    broker
        .publish("", &inbound, b"warm-up", stuck_kind("warm-up"))
        .await;
    broker.await_count(&stuck, 1, DEFAULT_TIMEOUT).await;
    // Its confirm is in and it is acked: the stall will hold nothing of it.
    wait_ready_unacked(&inbound, 0, u64::from(held_by_test.is_some())).await;
    proxy.stall_downstream();
    match held_by_test.take() {
        Some((channel, got)) => {
            requeue(&got.acker).await;
            let _ = channel.close(200, "OK".into()).await;
        }
        None => {
            broker
                .publish("", &inbound, b"poison", stuck_kind("poison"))
                .await;
        }
    }

    let mut ordinary = Vec::new();
    for r in 0..=closes {
        if r > 0 {
            assert_eq!(close_connections_named(&format!("{p}/consume")).await, 1);
        }
        if r < closes {
            // The forwarder has it (again): one more copy, unconfirmed.
            broker.await_count(&stuck, 2 + r, DEFAULT_TIMEOUT).await;
        } else {
            broker.await_count(&dlq, 1, DEFAULT_TIMEOUT).await;
        }
        let bodies: Vec<String> = (0..10).map(|i| format!("ordinary-{r}-{i}")).collect();
        ordinary.extend(bodies.iter().cloned());
        broker
            .publish_many("", &inbound, bodies.iter(), BasicProperties::default())
            .await;
        broker
            .await_count(&normal, ordinary.len() as u32, DEFAULT_TIMEOUT)
            .await;
        // Only the poison message is held (nothing after the last round).
        wait_ready_unacked(&inbound, 0, u64::from(r < closes)).await;
    }
    proxy.resume();
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let run = PoisonRun {
        dead: broker.get_all(&dlq).await,
        normal: broker.get_all(&normal).await,
        stuck: broker.get_all(&stuck).await,
        ordinary,
    };
    assert_eq!(broker.queue_len(&inbound).await, 0);
    broker.close().await;
    run
}

/// Returns a message to its queue (`basic.nack`, requeue).
async fn requeue(acker: &lapin::Acker) {
    let sent = acker
        .nack(BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        })
        .await
        .unwrap_or_else(|e| panic!("nack: {e}"));
    assert!(sent, "the nack was sent");
}

/// Checks what every poison run must show: `copies` copies of the poison
/// message reached its branch, every ordinary message was forwarded once,
/// and the poison message was dead-lettered once; returns the dead letter.
fn check_poison_run(run: &PoisonRun, copies: usize) -> &Message {
    assert_eq!(
        tally(&run.normal),
        run.ordinary.iter().map(|b| (b.clone(), 1)).collect(),
        "every ordinary message forwarded exactly once"
    );
    assert_eq!(
        tally(&run.stuck),
        BTreeMap::from([("poison".to_owned(), copies), ("warm-up".to_owned(), 1)]),
        "the poison message was copied only while under the limit"
    );
    assert_eq!(
        run.dead.len(),
        1,
        "only the poison message is dead-lettered"
    );
    let m = &run.dead[0];
    assert_eq!(m.body, b"poison");
    assert_eq!(
        m.header_str("x-switchyard-reason").as_deref(),
        Some("poison")
    );
    let error = m.header_str("x-switchyard-error").unwrap_or_default();
    assert_eq!(error, "delivered 4 times (inbound.max_redeliveries = 2)");
    assert!(names(m.header("x-switchyard-failed")).is_empty());
    assert!(names(m.header("x-switchyard-delivered")).is_empty());
    m
}

/// Classic queue, `max_redeliveries = 2`: the first delivery and two
/// redeliveries are forwarded, the third redelivery is poison. The
/// forwarder counts the redeliveries itself.
#[tokio::test]
async fn a_message_redelivered_past_the_limit_is_poison_on_a_classic_queue() {
    let p = unique_prefix("poison-classic");
    let run = poison_run(&p, "classic", Comebacks::Closes(3)).await;
    let m = check_poison_run(&run, 3);
    assert!(m.header("x-delivery-count").is_none());
    delete_all_with_prefix(&p).await;
}

/// Quorum queue, `max_redeliveries = 2`: the test takes and returns the
/// message twice, so the forwarder first sees it with `x-delivery-count =
/// 2` and forwards it; after one close it comes back with 3 and is poison.
/// A count of the forwarder's own redeliveries would have said 2.
#[tokio::test]
async fn a_message_redelivered_past_the_limit_is_poison_on_a_quorum_queue() {
    let p = unique_prefix("poison-quorum");
    let run = poison_run(&p, "quorum", Comebacks::ReturnedFirst(2)).await;
    let m = check_poison_run(&run, 1);
    assert_eq!(
        m.header("x-delivery-count"),
        Some(&AMQPValue::LongLongInt(3)),
        "the broker's count"
    );
    delete_all_with_prefix(&p).await;
}

/// A producer's `x-delivery-count` counts for nothing: 50 messages that
/// arrive with 99 on their first delivery (as a message consumed from a
/// quorum queue elsewhere and published on carries) are forwarded, on a
/// quorum inbound queue and on a classic one alike, none dead-lettered.
#[tokio::test]
async fn a_first_delivery_is_never_poison_whatever_its_delivery_count_says() {
    for queue_type in ["quorum", "classic"] {
        let p = unique_prefix(&format!("forged-count-{queue_type}"));
        let broker = TestBroker::connect(&p).await;
        let (inbound, out, dlq) = (format!("{p}.in"), format!("{p}.out"), format!("{p}.dlq"));
        let toml = Forwarder::new(&p)
            .inbound("max_redeliveries", 2)
            .inbound("queue_type", queue_type)
            .endpoint(Endpoint::queue("out", &out))
            .filter("all", Filter::match_all())
            .branch(entry("out", "all"))
            .toml();
        let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
        let forged = BasicProperties::default().with_headers(field_table([(
            "x-delivery-count",
            AMQPValue::LongLongInt(99),
        )]));
        let bodies: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
        broker
            .publish_many("", &inbound, bodies.iter(), forged)
            .await;
        broker.await_count(&out, 50, DEFAULT_TIMEOUT).await;
        wait_ready_unacked(&inbound, 0, 0).await;
        forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(broker.queue_len(&dlq).await, 0, "{queue_type}: none poison");
        delete_all_with_prefix(&p).await;
    }
}
