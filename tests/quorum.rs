//! Quorum queues (queue types): the seed scenario with a quorum
//! inbound queue, quorum destinations and a quorum dead-letter queue
//! forwards and dead-letters in both modes; an existing quorum queue is
//! accepted with `declare = false` (whatever other arguments an operator gave
//! it); a queue of the other type is a one-line startup error naming the
//! argument, the queue's message count and the setting to change; and with
//! `dead_letter_by_policy` the dead-letter exchange comes from a policy.

use crate::support;

use lapin::options::QueueDeclareOptions;
use lapin::types::AMQPValue;
use lapin::{BasicProperties, ExchangeKind};
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::{InProcess, consumer_count};
use support::{
    DEFAULT_TIMEOUT, Message, TestBroker, amqp_str, amqp_vhost, delete_all_with_prefix,
    field_table, rabbitmqctl, unique_prefix,
};
use switchyard::RunError;

const ROUTED: u32 = 40;

/// The seed scenario on quorum queues but for the inbound queue, which is
/// left as configured by default (classic): the dead-letter queue and the
/// four destination queues are quorum. Branches "service" and "logging"
/// take messages with header `route = yes`; anything else has no route.
fn quorum_destinations(p: &str, mode: &str) -> Forwarder {
    let endpoint = |name: &str, queue: &str| {
        Endpoint::queue(name, &format!("{p}.{queue}")).set("declare_queue_type", "quorum")
    };
    Forwarder::new(p)
        .mode(mode)
        .dead_letter("queue_type", "quorum")
        .endpoint(endpoint("service", "service"))
        .endpoint(endpoint("service_backup", "service.backup"))
        .endpoint(endpoint("logging", "logging"))
        .endpoint(endpoint("logging_backup", "logging.backup"))
        .backup_list("service_backups", &["service_backup"])
        .backup_list("logging_backups", &["logging_backup"])
        .filter("routed", Filter::header("route").set("equals", "yes"))
        .branch(Branch::new("service", "routed", "service").backups("service_backups"))
        .branch(Branch::new("logging", "routed", "logging").backups("logging_backups"))
}

/// The seed scenario on quorum queues: inbound, dead-letter and the four
/// destination queues are quorum ([`quorum_destinations`] with a quorum
/// inbound queue).
fn quorum_seed(p: &str, mode: &str) -> Forwarder {
    quorum_destinations(p, mode).inbound("queue_type", "quorum")
}

fn routed(i: u32) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(format!("m{i}").into())
        .with_headers(field_table([("route", amqp_str("yes"))]))
}

fn quorum() -> (&'static str, AMQPValue) {
    ("x-queue-type", amqp_str("quorum"))
}

/// The delivery limit switchyard gives a quorum inbound queue it creates:
/// one above `inbound.max_redeliveries` (10 by default).
fn delivery_limit() -> (&'static str, AMQPValue) {
    ("x-delivery-limit", AMQPValue::LongLongInt(11))
}

/// The arguments switchyard gives a quorum inbound queue in nack mode,
/// besides its delivery limit.
fn quorum_nack_args(p: &str) -> Vec<(&'static str, AMQPValue)> {
    vec![
        quorum(),
        ("x-dead-letter-exchange", amqp_str(&format!("{p}.dlx"))),
        ("x-dead-letter-routing-key", amqp_str(&format!("{p}.dlq"))),
        ("x-dead-letter-strategy", amqp_str("at-least-once")),
        ("x-overflow", amqp_str("reject-publish")),
    ]
}

/// Declares durable `queue` with `args` on a throwaway channel; `Err(code)`
/// carries the broker's reply code when it refuses. Never creates `queue`
/// by mistake: callers only use it on queues that exist.
async fn try_declare(
    broker: &TestBroker,
    queue: &str,
    args: Vec<(&str, AMQPValue)>,
) -> Result<(), u16> {
    assert!(broker.queue_exists(queue).await, "{queue} must exist");
    let ch = broker.fresh_channel().await;
    let result = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            field_table(args),
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

/// Asserts `queue` is a quorum queue: the broker accepts `x-queue-type =
/// quorum` (plus `rest`) and refuses a declaration without it.
async fn assert_quorum(broker: &TestBroker, queue: &str, rest: Vec<(&str, AMQPValue)>) {
    let mut args = vec![quorum()];
    args.extend(rest.iter().cloned());
    assert_eq!(
        try_declare(broker, queue, args).await,
        Ok(()),
        "{queue} must be a quorum queue with {rest:?}"
    );
    assert_eq!(
        try_declare(broker, queue, rest).await,
        Err(406),
        "{queue} must not accept a declaration without x-queue-type = quorum"
    );
}

/// Publishes `ROUTED` routed messages and one without a route to `<p>.in`.
async fn publish_traffic(broker: &TestBroker, p: &str) {
    let inbound = format!("{p}.in");
    for i in 0..ROUTED {
        broker
            .publish("", &inbound, format!("body {i}").as_bytes(), routed(i))
            .await;
    }
    broker
        .publish(
            "",
            &inbound,
            b"no route",
            BasicProperties::default().with_message_id("lost".into()),
        )
        .await;
}

/// Every routed message once, in order, on `queue`.
async fn assert_forwarded(broker: &TestBroker, queue: &str) {
    broker.await_count(queue, ROUTED, DEFAULT_TIMEOUT).await;
    let got = broker.get_all(queue).await;
    let bodies: Vec<String> = got.iter().map(Message::body_str).collect();
    let expected: Vec<String> = (0..ROUTED).map(|i| format!("body {i}")).collect();
    assert_eq!(bodies, expected, "{queue} holds every routed message once");
}

/// The single dead letter in `<p>.dlq`.
async fn the_dead_letter(broker: &TestBroker, p: &str) -> Message {
    let dlq = format!("{p}.dlq");
    broker.await_count(&dlq, 1, DEFAULT_TIMEOUT).await;
    let mut dead = broker.get_all(&dlq).await;
    assert_eq!(dead.len(), 1, "exactly one dead letter");
    let dead = dead.remove(0);
    assert_eq!(dead.body, b"no route");
    dead
}

/// `field` of the newest `x-death` entry, as text.
fn x_death(message: &Message, field: &str) -> Option<String> {
    let Some(AMQPValue::FieldArray(deaths)) = message.header("x-death") else {
        return None;
    };
    let Some(AMQPValue::FieldTable(newest)) = deaths.as_slice().first() else {
        return None;
    };
    match newest.inner().get(field)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        other => Some(format!("{other:?}")),
    }
}

/// The startup error of a forwarder that must refuse to start.
async fn topology_error(toml: &str) -> String {
    match InProcess::start(toml).finished().await {
        Err(RunError::Topology(error)) => error.to_string(),
        other => panic!("expected a topology refusal at startup, got {other:?}"),
    }
}

#[tokio::test]
async fn quorum_seed_scenario_forwards_and_dead_letters_by_nack() {
    let p = unique_prefix("quorum-nack");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let forwarder =
        InProcess::start_consuming(&quorum_seed(&p, "nack").toml(), &broker, &inbound).await;

    // Every queue switchyard declared is a quorum queue; the inbound one
    // carries at-least-once dead-lettering (x-overflow is compared, so a
    // declaration with another value is refused) and a delivery limit.
    let mut args = quorum_nack_args(&p)[1..].to_vec();
    args.push(delivery_limit());
    assert_quorum(&broker, &inbound, args).await;
    let mut drop_head = quorum_nack_args(&p);
    drop_head[4] = ("x-overflow", amqp_str("drop-head"));
    assert_eq!(try_declare(&broker, &inbound, drop_head).await, Err(406));
    for queue in [
        "dlq",
        "service",
        "service.backup",
        "logging",
        "logging.backup",
    ] {
        assert_quorum(&broker, &format!("{p}.{queue}"), Vec::new()).await;
    }

    publish_traffic(&broker, &p).await;
    assert_forwarded(&broker, &format!("{p}.service")).await;
    assert_forwarded(&broker, &format!("{p}.logging")).await;
    let dead = the_dead_letter(&broker, &p).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(
        x_death(&dead, "queue").as_deref(),
        Some(inbound.as_str()),
        "the broker's x-death names the inbound queue: {:?}",
        dead.properties.headers()
    );
    assert_eq!(x_death(&dead, "reason").as_deref(), Some("rejected"));
    assert_eq!(
        dead.header_str("x-first-death-queue").as_deref(),
        Some(inbound.as_str())
    );
    for queue in ["in", "service.backup", "logging.backup", "dlq"] {
        assert_eq!(
            broker.queue_len(&format!("{p}.{queue}")).await,
            0,
            "{queue}"
        );
    }

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn quorum_seed_scenario_forwards_and_dead_letters_by_republish() {
    let p = unique_prefix("quorum-republish");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let forwarder =
        InProcess::start_consuming(&quorum_seed(&p, "republish").toml(), &broker, &inbound).await;
    for queue in ["dlq", "service", "logging"] {
        assert_quorum(&broker, &format!("{p}.{queue}"), Vec::new()).await;
    }
    let mut args = quorum_nack_args(&p)[1..3].to_vec();
    args.push(delivery_limit());
    assert_quorum(&broker, &inbound, args).await;

    publish_traffic(&broker, &p).await;
    assert_forwarded(&broker, &format!("{p}.service")).await;
    assert_forwarded(&broker, &format!("{p}.logging")).await;
    let dead = the_dead_letter(&broker, &p).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(
        dead.header_str("x-switchyard-reason").as_deref(),
        Some("no-route"),
        "{:?}",
        dead.properties.headers()
    );
    assert_eq!(
        dead.header_str("x-switchyard-source-queue").as_deref(),
        Some(inbound.as_str())
    );
    assert_eq!(
        dead.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("lost")
    );
    assert!(
        dead.header("x-death").is_none(),
        "not dead-lettered by the broker"
    );
    assert_eq!(broker.queue_len(&inbound).await, 0);

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn an_existing_quorum_queue_with_its_own_limits_is_accepted_without_declare() {
    let p = unique_prefix("quorum-existing");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let dlx = format!("{p}.dlx");
    let dlq = format!("{p}.dlq");
    // The operator's queue: quorum, the right dead-letter arguments, and
    // arguments switchyard does not manage (a delivery limit, a length
    // limit), without the at-least-once strategy.
    let mut args = quorum_nack_args(&p)[..3].to_vec();
    args.push(("x-delivery-limit", AMQPValue::LongInt(50)));
    args.push(("x-max-length", AMQPValue::LongInt(100_000)));
    broker
        .declare_queue_with(&inbound, field_table(args.clone()))
        .await;
    broker.declare_exchange(&dlx, ExchangeKind::Direct).await;
    broker
        .declare_queue_with(&dlq, field_table([quorum()]))
        .await;
    broker.bind(&dlq, &dlx, &dlq).await;
    broker.publish("", &inbound, b"waiting", routed(0)).await;

    let toml = quorum_seed(&p, "nack").inbound("declare", false).toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    broker
        .await_count(&format!("{p}.service"), 1, DEFAULT_TIMEOUT)
        .await;
    broker
        .publish("", &inbound, b"no route", BasicProperties::default())
        .await;
    let dead = the_dead_letter(&broker, &p).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(x_death(&dead, "reason").as_deref(), Some("rejected"));
    let service = broker.get_all(&format!("{p}.service")).await;
    assert_eq!(service.len(), 1);
    assert_eq!(service[0].body, b"waiting");
    // The queue is unchanged: exactly the operator's arguments.
    assert_eq!(try_declare(&broker, &inbound, args).await, Ok(()));

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn a_queue_of_the_other_type_is_a_startup_error_naming_the_fix() {
    let p = unique_prefix("quorum-mismatch");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let vhost = amqp_vhost();

    // A quorum inbound queue holding two messages, configured as classic.
    broker
        .declare_queue_with(&inbound, field_table(quorum_nack_args(&p)))
        .await;
    broker.publish("", &inbound, b"one", routed(1)).await;
    broker.publish("", &inbound, b"two", routed(2)).await;
    let classic = quorum_destinations(&p, "nack").toml();
    let message = topology_error(&classic).await;
    assert_eq!(
        message,
        format!(
            "inbound.queue \"{inbound}\" on broker \"main\" has x-queue-type = \"quorum\" where \
             the configuration needs \"classic\": set inbound.queue_type = \"quorum\"; deleting \
             the queue instead would discard the 2 messages it holds (broker: PRECONDITION_FAILED \
             - inequivalent arg 'x-queue-type' for queue '{inbound}' in vhost '{vhost}': received \
             none but current is the value 'quorum' of type 'longstr')"
        )
    );
    assert_eq!(broker.queue_len(&inbound).await, 2, "nothing was consumed");
    assert_eq!(consumer_count(&broker, &inbound).await, Some(0));
    broker.delete_queue(&inbound).await;

    // An empty classic queue, configured as quorum, with declare = false.
    broker.declare_queue(&inbound).await;
    let toml = quorum_seed(&p, "republish")
        .inbound("declare", false)
        .toml();
    let message = topology_error(&toml).await;
    assert!(
        message.starts_with(&format!(
            "inbound.queue \"{inbound}\" on broker \"main\" has x-queue-type = none where the \
             configuration needs \"quorum\": set inbound.queue_type = \"classic\"; or delete the \
             queue (it is empty) and recreate it as configured (broker: PRECONDITION_FAILED - \
             inequivalent arg 'x-queue-type'"
        )),
        "{message}"
    );
    assert!(!message.contains('\n'), "one line: {message:?}");
    assert_eq!(try_declare(&broker, &inbound, Vec::new()).await, Ok(()));

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn a_policy_can_set_the_dead_letter_exchange_of_a_quorum_inbound_queue() {
    let p = unique_prefix("quorum-policy");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let vhost = amqp_vhost();
    // A policy that applies to this test's inbound queue only.
    let definition =
        format!("{{\"dead-letter-exchange\":\"{p}.dlx\",\"dead-letter-routing-key\":\"{p}.dlq\"}}");
    let pattern = format!("^{}\\.in$", p.replace('-', "\\-"));
    rabbitmqctl(&[
        "set_policy",
        "-p",
        &vhost,
        "--apply-to",
        "queues",
        "--priority",
        "7",
        &p,
        &pattern,
        &definition,
    ])
    .await;

    let toml = quorum_seed(&p, "nack")
        .inbound("dead_letter_by_policy", true)
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    // Declared without dead-letter arguments: the policy is in charge.
    assert_quorum(&broker, &inbound, vec![delivery_limit()]).await;
    publish_traffic(&broker, &p).await;
    assert_forwarded(&broker, &format!("{p}.service")).await;
    assert_forwarded(&broker, &format!("{p}.logging")).await;
    let dead = the_dead_letter(&broker, &p).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    rabbitmqctl(&["clear_policy", "-p", &vhost, &p]).await;

    assert_eq!(x_death(&dead, "queue").as_deref(), Some(inbound.as_str()));
    assert_eq!(x_death(&dead, "reason").as_deref(), Some("rejected"));
    assert_eq!(broker.queue_len(&inbound).await, 0);

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn without_the_policy_flag_a_quorum_queue_lacking_dead_letter_arguments_is_refused() {
    let p = unique_prefix("quorum-no-dlx");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    broker
        .declare_queue_with(&inbound, field_table([quorum()]))
        .await;
    let message = topology_error(&quorum_seed(&p, "nack").toml()).await;
    assert!(
        message.starts_with(&format!(
            "inbound.queue \"{inbound}\" on broker \"main\" has x-dead-letter-exchange = none \
             where the configuration needs \"{p}.dlx\": in nack mode a nacked message would be \
             discarded: set inbound.dead_letter_by_policy = true if a policy sets its dead-letter \
             exchange, or dead_letter.mode = \"republish\"; or delete the queue (it is empty) and \
             let switchyard declare it (broker: "
        )),
        "{message}"
    );
    assert_eq!(
        try_declare(&broker, &inbound, vec![quorum()]).await,
        Ok(()),
        "{inbound} is unchanged"
    );

    broker.close().await;
    delete_all_with_prefix(&p).await;
}
