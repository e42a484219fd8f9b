//! Startup safety of dead-lettering: in `nack` mode the broker
//! routes a nacked message through the inbound queue's dead-letter exchange,
//! so the forwarder declares the queue with its dead-letter arguments, and
//! refuses to start when an existing queue has other arguments or the
//! dead-letter exchange is missing, naming the fix. Arguments an operator
//! gave an existing queue and that do not matter to dead-lettering are kept.
//! `republish` mode does not depend on the queue's arguments. In both modes a
//! dead-letter exchange that routes the dead-letter key nowhere is refused at
//! startup (a probe message, returned when unroutable).

use crate::support;

use futures_util::StreamExt;
use lapin::BasicProperties;
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Confirmation, ExchangeKind};
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::{InProcess, consumer_count};
use support::{
    DEFAULT_TIMEOUT, TestBroker, amqp_str, amqp_vhost, delete_all_with_prefix, field_table,
    unique_prefix,
};
use switchyard::RunError;

/// `base` (a [`Forwarder`] for `p`) with one branch for messages with
/// header `route = yes` to queue `<p>.out`; anything else has no route and
/// is dead-lettered.
fn one_branch_toml(base: Forwarder, p: &str) -> String {
    base.endpoint(Endpoint::queue("out", &format!("{p}.out")))
        .filter("routed", Filter::header("route").set("equals", "yes"))
        .branch(Branch::new("out", "routed", "out"))
        .toml()
}

/// The forwarder for `p` in `mode` with `declare = false` under `[inbound]`.
fn base_without_declare(p: &str, mode: &str) -> Forwarder {
    Forwarder::new(p).mode(mode).inbound("declare", false)
}

/// The arguments the forwarder declares `<p>.in` with in nack mode.
fn dead_letter_args(p: &str) -> FieldTable {
    field_table([
        ("x-dead-letter-exchange", amqp_str(&format!("{p}.dlx"))),
        ("x-dead-letter-routing-key", amqp_str(&format!("{p}.dlq"))),
    ])
}

/// Declares durable `queue` with `args` on a throwaway channel; `Err(code)`
/// carries the broker's reply code when it refuses.
async fn try_declare(broker: &TestBroker, queue: &str, args: FieldTable) -> Result<(), u16> {
    let ch = broker.fresh_channel().await;
    let result = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await;
    match result {
        Ok(_) => {
            let _ = ch.close(200, "OK".into()).await;
            Ok(())
        }
        Err(e) => match e.kind() {
            lapin::ErrorKind::ProtocolError(amqp) => Err(amqp.get_id()),
            _ => panic!("declare {queue}: unexpected error {e}"),
        },
    }
}

fn routed() -> BasicProperties {
    BasicProperties::default().with_headers(field_table([("route", amqp_str("yes"))]))
}

/// The startup error of a forwarder that must refuse to start.
async fn topology_error(toml: &str) -> String {
    match InProcess::start(toml).finished().await {
        Err(RunError::Topology(error)) => error.to_string(),
        other => panic!("expected a topology refusal at startup, got {other:?}"),
    }
}

#[tokio::test]
async fn inbound_queue_is_declared_with_its_dead_letter_arguments() {
    let p = unique_prefix("topology-declared");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let forwarder =
        InProcess::start_consuming(&one_branch_toml(Forwarder::new(&p), &p), &broker, &inbound)
            .await;

    // Redeclaring with the same arguments is accepted; with any other
    // arguments the broker refuses (406 PRECONDITION_FAILED).
    assert_eq!(
        try_declare(&broker, &inbound, dead_letter_args(&p)).await,
        Ok(()),
        "{inbound} must carry exactly the dead-letter arguments"
    );
    assert_eq!(
        try_declare(&broker, &inbound, FieldTable::default()).await,
        Err(406),
        "{inbound} declared without arguments must be refused"
    );
    let other_exchange = field_table([
        ("x-dead-letter-exchange", amqp_str(&format!("{p}.other"))),
        ("x-dead-letter-routing-key", amqp_str(&format!("{p}.dlq"))),
    ]);
    assert_eq!(
        try_declare(&broker, &inbound, other_exchange).await,
        Err(406),
        "{inbound} with another x-dead-letter-exchange must be refused"
    );
    let other_key = field_table([
        ("x-dead-letter-exchange", amqp_str(&format!("{p}.dlx"))),
        ("x-dead-letter-routing-key", amqp_str(&format!("{p}.other"))),
    ]);
    assert_eq!(
        try_declare(&broker, &inbound, other_key).await,
        Err(406),
        "{inbound} with another x-dead-letter-routing-key must be refused"
    );

    // The dead-letter exchange exists and routes the dead-letter key to the DLQ.
    assert!(broker.exchange_exists(&format!("{p}.dlx")).await);
    let confirm = broker
        .publish(
            &format!("{p}.dlx"),
            &format!("{p}.dlq"),
            b"probe",
            BasicProperties::default(),
        )
        .await;
    assert_eq!(
        confirm,
        Confirmation::Ack(None),
        "{p}.dlx must route {p}.dlq"
    );
    broker
        .await_count(&format!("{p}.dlq"), 1, DEFAULT_TIMEOUT)
        .await;
    let probe = broker.get_all(&format!("{p}.dlq")).await;
    assert_eq!(probe.len(), 1);
    assert_eq!(probe[0].body, b"probe");

    // End to end: a message with no route is nacked and the broker
    // dead-letters it through those arguments; a routed one is forwarded.
    broker
        .publish("", &inbound, b"no route", BasicProperties::default())
        .await;
    broker.publish("", &inbound, b"routed", routed()).await;
    broker
        .await_count(&format!("{p}.dlq"), 1, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.out"), 1, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let dead = broker.get_all(&format!("{p}.dlq")).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body, b"no route");
    assert!(
        matches!(dead[0].header("x-death"), Some(AMQPValue::FieldArray(_))),
        "a nack-mode dead letter carries the broker's x-death: {:?}",
        dead[0].properties.headers()
    );
    let out = broker.get_all(&format!("{p}.out")).await;
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].body, b"routed");
    assert_eq!(broker.queue_len(&inbound).await, 0);

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn existing_inbound_queue_with_other_arguments_is_a_startup_error() {
    let p = unique_prefix("topology-other-args");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    broker.declare_queue(&inbound).await;
    broker.publish("", &inbound, b"waiting", routed()).await;

    let message = topology_error(&one_branch_toml(Forwarder::new(&p), &p)).await;
    assert_eq!(
        message,
        format!(
            "inbound.queue \"{inbound}\" on broker \"main\" has x-dead-letter-exchange = none \
             where the configuration needs \"{p}.dlx\": in nack mode a nacked message would be \
             discarded: set inbound.dead_letter_by_policy = true if a policy sets its dead-letter \
             exchange, or dead_letter.mode = \"republish\"; deleting the queue instead would \
             discard the 1 message it holds (broker: PRECONDITION_FAILED - inequivalent arg \
             'x-dead-letter-exchange' for queue '{inbound}' in vhost '{vhost}': received the \
             value '{p}.dlx' of type 'longstr' but current is none)",
            vhost = amqp_vhost(),
        )
    );

    // Nothing was consumed, forwarded or changed.
    assert_eq!(
        broker.queue_len(&inbound).await,
        1,
        "{inbound} keeps its message"
    );
    assert_eq!(consumer_count(&broker, &inbound).await, Some(0));
    assert_eq!(broker.queue_len(&format!("{p}.out")).await, 0);
    assert_eq!(
        try_declare(&broker, &inbound, FieldTable::default()).await,
        Ok(()),
        "{inbound} keeps its original (empty) arguments"
    );
    let left = broker.get_all(&inbound).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].body, b"waiting");
    assert!(!left[0].redelivered, "the message was never delivered");

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn an_existing_queue_keeps_the_arguments_switchyard_does_not_manage() {
    let p = unique_prefix("topology-operator-args");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    // The operator's queue: the right dead-letter arguments plus a length
    // limit and a message TTL that the configuration does not mention.
    let mut args = dead_letter_args(&p);
    args.insert("x-max-length".into(), AMQPValue::LongInt(100_000));
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(3_600_000));
    broker.declare_queue_with(&inbound, args.clone()).await;

    for toml in [
        one_branch_toml(Forwarder::new(&p), &p),
        one_branch_toml(base_without_declare(&p, "nack"), &p),
    ] {
        broker.publish("", &inbound, b"routed", routed()).await;
        let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
        broker
            .await_count(&format!("{p}.out"), 1, DEFAULT_TIMEOUT)
            .await;
        forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
        let out = broker.get_all(&format!("{p}.out")).await;
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].body, b"routed");
    }
    // Unchanged: exactly the operator's arguments.
    assert_eq!(try_declare(&broker, &inbound, args).await, Ok(()));
    assert_eq!(broker.queue_len(&inbound).await, 0);

    // An argument that matters still has to match: another dead-letter
    // routing key is refused, naming the configuration's alternative.
    broker.delete_queue(&inbound).await;
    let mut other_key = dead_letter_args(&p);
    other_key.insert("x-dead-letter-routing-key".into(), amqp_str("elsewhere"));
    other_key.insert("x-max-length".into(), AMQPValue::LongInt(100_000));
    broker.declare_queue_with(&inbound, other_key).await;
    let message = topology_error(&one_branch_toml(Forwarder::new(&p), &p)).await;
    assert!(
        message.starts_with(&format!(
            "inbound.queue \"{inbound}\" on broker \"main\" has x-dead-letter-routing-key = \
             \"elsewhere\" where the configuration needs \"{p}.dlq\": set \
             dead_letter.routing_key = \"elsewhere\", or dead_letter.mode = \"republish\"; or \
             delete the queue (it is empty) and let switchyard declare it (broker: "
        )),
        "{message}"
    );

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn missing_dead_letter_exchange_without_declare_is_a_startup_error() {
    let p = unique_prefix("topology-no-dlx");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let dlx = format!("{p}.dlx");
    broker
        .declare_queue_with(&inbound, dead_letter_args(&p))
        .await;
    broker.publish("", &inbound, b"waiting", routed()).await;

    let message = topology_error(&one_branch_toml(base_without_declare(&p, "nack"), &p)).await;
    for needle in [dlx.as_str(), "does not exist"] {
        assert!(
            message.contains(needle),
            "the startup error must mention {needle:?}: {message}"
        );
    }

    // With declare = false the forwarder creates nothing and consumes nothing.
    assert!(
        !broker.exchange_exists(&dlx).await,
        "{dlx} must not be created"
    );
    assert!(!broker.queue_exists(&format!("{p}.dlq")).await);
    assert_eq!(
        broker.queue_len(&inbound).await,
        1,
        "{inbound} keeps its message"
    );
    assert_eq!(consumer_count(&broker, &inbound).await, Some(0));

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn republish_mode_accepts_an_existing_queue_without_dead_letter_arguments() {
    let p = unique_prefix("topology-republish");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let dlq = format!("{p}.dlq");
    broker.declare_queue(&inbound).await;
    broker
        .declare_exchange(&format!("{p}.dlx"), ExchangeKind::Direct)
        .await;
    broker.declare_queue(&dlq).await;
    broker.bind(&dlq, &format!("{p}.dlx"), &dlq).await;

    let toml = one_branch_toml(base_without_declare(&p, "republish"), &p);
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;

    broker.publish("", &inbound, b"routed", routed()).await;
    broker
        .publish("", &inbound, b"no route", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.out"), 1, DEFAULT_TIMEOUT)
        .await;
    broker.await_count(&dlq, 1, DEFAULT_TIMEOUT).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let out = broker.get_all(&format!("{p}.out")).await;
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].body, b"routed");
    let dead = broker.get_all(&dlq).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body, b"no route");
    assert_eq!(
        dead[0].header_str("x-switchyard-reason").as_deref(),
        Some("no-route"),
        "republished dead letter: {:?}",
        dead[0].properties.headers()
    );
    assert_eq!(
        dead[0].header_str("x-switchyard-source-queue").as_deref(),
        Some(inbound.as_str())
    );
    assert_eq!(broker.queue_len(&inbound).await, 0);
    // The queue keeps the arguments it was created with.
    assert_eq!(
        try_declare(&broker, &inbound, FieldTable::default()).await,
        Ok(())
    );

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

/// The setup of an operator who manages the topology: `<p>.in` with its
/// dead-letter arguments and the dead-letter exchange `<p>.dlx`, but no
/// queue bound to it unless `bound`.
async fn operator_topology(broker: &TestBroker, p: &str, bound: bool) {
    broker
        .declare_queue_with(&format!("{p}.in"), dead_letter_args(p))
        .await;
    broker
        .declare_exchange(&format!("{p}.dlx"), ExchangeKind::Direct)
        .await;
    if bound {
        let dlq = format!("{p}.dlq");
        broker.declare_queue(&dlq).await;
        broker.bind(&dlq, &format!("{p}.dlx"), &dlq).await;
    }
}

#[tokio::test]
async fn a_dead_letter_exchange_that_routes_nowhere_is_a_startup_error() {
    let p = unique_prefix("topology-dl-nowhere");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    operator_topology(&broker, &p, false).await;
    broker.publish("", &inbound, b"waiting", routed()).await;

    let expected = format!(
        "dead_letter.exchange \"{p}.dlx\" on broker \"main\" routes nothing with \
         dead_letter.routing_key \"{p}.dlq\": every dead letter would be lost; bind a queue to it \
         with that routing key, or set dead_letter.queue and inbound.declare = true so \
         switchyard declares and binds one"
    );
    for mode in ["nack", "republish"] {
        let message = topology_error(&one_branch_toml(base_without_declare(&p, mode), &p)).await;
        assert_eq!(message, expected, "{mode} mode");
    }
    // Declaring everything but the dead-letter queue is no better.
    let no_dlq = Forwarder::new(&p).mode("republish").no_dead_letter_queue();
    assert_eq!(topology_error(&one_branch_toml(no_dlq, &p)).await, expected);

    // Through the default exchange, the routing key must name a queue.
    let default_exchange = base_without_declare(&p, "republish")
        .dead_letter("exchange", "")
        .no_dead_letter_queue();
    assert_eq!(
        topology_error(&one_branch_toml(default_exchange, &p)).await,
        format!(
            "dead_letter.routing_key \"{p}.dlq\" names no queue on broker \"main\" \
             (dead_letter.exchange is the default exchange): every dead letter would be lost; \
             create that queue, or name an existing one"
        )
    );

    // Nothing was consumed, and the probe left nothing behind.
    assert_eq!(
        broker.queue_len(&inbound).await,
        1,
        "{inbound} keeps its message"
    );
    assert_eq!(consumer_count(&broker, &inbound).await, Some(0));
    assert!(!broker.queue_exists(&format!("{p}.dlq")).await);

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn a_bound_dead_letter_exchange_passes_the_probe_and_keeps_no_probe_message() {
    let p = unique_prefix("topology-dl-bound");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let dlq = format!("{p}.dlq");
    operator_topology(&broker, &p, true).await;

    // A consumer already waiting on the dead-letter queue sees the probe,
    // recognisable by its header.
    let watcher = broker.fresh_channel().await;
    let mut probes = watcher
        .basic_consume(
            dlq.as_str().into(),
            "probe-watcher".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("consume {dlq}: {e}"));
    let forwarder = InProcess::start_consuming(
        &one_branch_toml(base_without_declare(&p, "nack"), &p),
        &broker,
        &inbound,
    )
    .await;
    let probe = tokio::time::timeout(DEFAULT_TIMEOUT, probes.next())
        .await
        .unwrap_or_else(|_| panic!("no probe reached {dlq}"))
        .unwrap_or_else(|| panic!("consumer on {dlq} ended"))
        .unwrap_or_else(|e| panic!("consumer on {dlq}: {e}"));
    let headers = probe.properties.headers().clone().unwrap_or_default();
    assert_eq!(
        headers.inner().get("x-switchyard-probe"),
        Some(&AMQPValue::Boolean(true)),
        "{headers:?}"
    );
    assert_eq!(
        probe.properties.expiration().as_ref().map(|e| e.as_str()),
        Some("0")
    );
    let _ = watcher.close(200, "OK".into()).await;

    // It forwards and dead-letters as usual.
    broker.publish("", &inbound, b"routed", routed()).await;
    broker
        .publish("", &inbound, b"no route", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.out"), 1, DEFAULT_TIMEOUT)
        .await;
    broker.await_count(&dlq, 1, DEFAULT_TIMEOUT).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let dead = broker.get_all(&dlq).await;
    assert_eq!(dead.len(), 1, "only the dead letter, no probe");
    assert_eq!(dead[0].body, b"no route");
    assert!(dead[0].header("x-switchyard-probe").is_none());

    // Without a consumer the probe expires at once: a restart adds nothing.
    let forwarder = InProcess::start_consuming(
        &one_branch_toml(base_without_declare(&p, "nack"), &p),
        &broker,
        &inbound,
    )
    .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(broker.queue_len(&dlq).await, 0, "no probe left in {dlq}");

    broker.close().await;
    delete_all_with_prefix(&p).await;
}
