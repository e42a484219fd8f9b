//! Publish outcomes are attributed to the right publish even with hundreds
//! in flight on one endpoint channel: a `basic.return` is matched to its
//! publish by the `x-switchyard-publish-id` header it carries (lapin attaches
//! a return to whichever confirm resolves next), and a `basic.nack` is a
//! failure that walks the backup list, never a delivery.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, QueueBindOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation, ExchangeKind};
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::InProcess;
use support::{
    DEFAULT_TIMEOUT, Message, POLL_INTERVAL, TestBroker, amqp_str, delete_all_with_prefix,
    field_table, ready_unacked, tally, unique_prefix,
};

/// The header every forwarded copy carries.
const PUBLISH_ID_HEADER: &str = "x-switchyard-publish-id";

/// Whether message `i` is one the headers exchange cannot route (irregular
/// interleaving: runs of good messages of varying length between bad ones).
fn is_bad(i: u32) -> bool {
    i.is_multiple_of(3) || i.is_multiple_of(7)
}

/// The message id of message `i` (also its body).
fn id(i: u32) -> String {
    format!("{i:05}")
}

/// One branch: every message to the headers exchange `<p>.hx`, backup queue
/// `<p>.caught` on the default exchange.
fn headers_exchange_toml(p: &str) -> String {
    Forwarder::new(p)
        .endpoint(Endpoint::exchange("hx", &format!("{p}.hx"), "x"))
        .endpoint(Endpoint::queue("caught", &format!("{p}.caught")))
        .backup_list("catch", &["caught"])
        .filter("all", Filter::match_all())
        .branch(Branch::new("hx", "all", "hx").backups("catch"))
        .toml()
}

/// The message ids of `messages`, sorted, duplicates kept.
fn sorted_ids(messages: &[Message]) -> Vec<String> {
    let mut ids: Vec<String> = messages
        .iter()
        .map(|m| {
            m.properties
                .message_id()
                .as_ref()
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|| panic!("a copy without message_id: {m:?}"))
        })
        .collect();
    ids.sort();
    ids
}

/// The integer publish id of a forwarded copy.
fn publish_id(m: &Message) -> i64 {
    match m.header(PUBLISH_ID_HEADER) {
        Some(AMQPValue::LongLongInt(v)) => *v,
        Some(AMQPValue::LongInt(v)) => i64::from(*v),
        Some(AMQPValue::LongUInt(v)) => i64::from(*v),
        Some(AMQPValue::ShortInt(v)) => i64::from(*v),
        Some(AMQPValue::ShortUInt(v)) => i64::from(*v),
        other => panic!(
            "copy {:?} has {PUBLISH_ID_HEADER} = {other:?}, expected an integer",
            m.properties.message_id()
        ),
    }
}

/// Ids that occur more than once in a sorted list, with their counts.
fn duplicates(sorted: &[String]) -> BTreeMap<String, usize> {
    let mut counts = tally(sorted.iter().cloned());
    counts.retain(|_, n| *n > 1);
    counts
}

#[tokio::test]
async fn returns_are_attributed_to_their_own_publish_with_hundreds_in_flight() {
    let p = unique_prefix("attribution");
    let broker = TestBroker::connect(&p).await;
    let (inbound, good, caught, dlq) = (
        format!("{p}.in"),
        format!("{p}.good"),
        format!("{p}.caught"),
        format!("{p}.dlq"),
    );

    // `<p>.good` receives only what carries dest=good; anything else is
    // unroutable on `<p>.hx` and comes back as a basic.return.
    broker
        .declare_exchange(&format!("{p}.hx"), ExchangeKind::Headers)
        .await;
    broker.declare_queue(&good).await;
    broker
        .channel()
        .queue_bind(
            good.as_str().into(),
            format!("{p}.hx").as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            field_table([("x-match", amqp_str("all")), ("dest", amqp_str("good"))]),
        )
        .await
        .unwrap_or_else(|e| panic!("bind {good} to {p}.hx: {e}"));

    let forwarder = InProcess::start_consuming(&headers_exchange_toml(&p), &broker, &inbound).await;

    // 3000 messages, pipelined: all publishes go out before the first
    // confirm is awaited, so the forwarder holds a full prefetch (500) and
    // keeps hundreds of copies in flight on its one endpoint channel.
    let n: u32 = 3000;
    let mut confirms = Vec::with_capacity(n as usize);
    for i in 0..n {
        let dest = if is_bad(i) { "bad" } else { "good" };
        let mut headers = FieldTable::default();
        headers.insert("dest".into(), amqp_str(dest));
        let props = BasicProperties::default()
            .with_message_id(id(i).as_str().into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let confirm = broker
            .channel()
            .basic_publish(
                "".into(),
                inbound.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                id(i).as_bytes(),
                props,
            )
            .await
            .unwrap_or_else(|e| panic!("publish #{i} to {inbound}: {e}"));
        confirms.push(confirm);
    }
    for (i, confirm) in confirms.into_iter().enumerate() {
        match confirm.await {
            Ok(Confirmation::Ack(None)) => {}
            other => panic!("publish #{i} to {inbound} not confirmed cleanly: {other:?}"),
        }
    }

    let expected_good: Vec<String> = (0..n).filter(|&i| !is_bad(i)).map(id).collect();
    let expected_bad: Vec<String> = (0..n).filter(|&i| is_bad(i)).map(id).collect();
    assert!(expected_bad.len() > 1000 && expected_good.len() > 1000);

    // Wait until every transaction has ended: n copies in good, caught or
    // (wrongly) the DLQ, or, should a copy be lost (a returned publish
    // counted as delivered), nothing left in the inbound queue, ready or
    // unacked.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    for round in 0u32.. {
        let counts = [
            broker.queue_len(&good).await,
            broker.queue_len(&caught).await,
            broker.queue_len(&dlq).await,
        ];
        if counts.iter().sum::<u32>() >= n {
            break;
        }
        if round % 20 == 19 && ready_unacked(&inbound).await == Some((0, 0)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {n} copies: {good} {}, {caught} {}, {dlq} {}, {inbound} {} ready",
            counts[0],
            counts[1],
            counts[2],
            broker.queue_len(&inbound).await
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    // Stopping drains the transactions in flight, so a late misattributed
    // copy would still show up below.
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let good_copies = broker.get_all(&good).await;
    let caught_copies = broker.get_all(&caught).await;
    let dead = broker.get_all(&dlq).await;
    let good_ids = sorted_ids(&good_copies);
    let caught_ids = sorted_ids(&caught_copies);

    let expected_bad_set: BTreeSet<&String> = expected_bad.iter().collect();
    let good_in_caught: Vec<&String> = caught_ids
        .iter()
        .filter(|id| !expected_bad_set.contains(id))
        .collect();
    let caught_set: BTreeSet<&String> = caught_ids.iter().collect();
    let bad_missing: Vec<&String> = expected_bad
        .iter()
        .filter(|id| !caught_set.contains(id))
        .collect();
    assert!(
        good_in_caught.is_empty(),
        "{} good message(s) were failed over to the backup (a return attributed to the wrong \
         publish), e.g. {:?}",
        good_in_caught.len(),
        &good_in_caught[..good_in_caught.len().min(10)]
    );
    assert!(
        bad_missing.is_empty(),
        "{} returned message(s) never reached the backup (counted as delivered), e.g. {:?}",
        bad_missing.len(),
        &bad_missing[..bad_missing.len().min(10)]
    );
    assert!(
        duplicates(&good_ids).is_empty() && duplicates(&caught_ids).is_empty(),
        "duplicates: good {:?}, caught {:?}",
        duplicates(&good_ids),
        duplicates(&caught_ids)
    );
    assert_eq!(
        good_ids, expected_good,
        "{good}: every good message exactly once"
    );
    assert_eq!(
        caught_ids, expected_bad,
        "{caught}: every bad message exactly once"
    );
    assert!(
        dead.is_empty(),
        "nothing may be dead-lettered, got {} (e.g. {:?})",
        dead.len(),
        dead.first().map(Message::body_str)
    );
    assert_eq!(
        broker.queue_len(&inbound).await,
        0,
        "{inbound} must be empty"
    );

    // Each copy is a distinct publish, and its body is untouched.
    for m in good_copies.iter().chain(&caught_copies) {
        assert_eq!(
            m.properties
                .message_id()
                .as_ref()
                .map(|s| s.as_str().to_string()),
            Some(m.body_str()),
            "body and message_id of a copy"
        );
    }
    let publish_ids: BTreeSet<i64> = good_copies
        .iter()
        .chain(&caught_copies)
        .map(publish_id)
        .collect();
    assert_eq!(
        publish_ids.len(),
        good_copies.len() + caught_copies.len(),
        "every copy carries its own {PUBLISH_ID_HEADER}"
    );

    broker.close().await;
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn nack_is_a_failure_not_a_delivery() {
    let p = unique_prefix("nack-failure");
    let broker = TestBroker::connect(&p).await;
    let (inbound, full, overflow, dlq) = (
        format!("{p}.in"),
        format!("{p}.full"),
        format!("{p}.overflow"),
        format!("{p}.dlq"),
    );
    // Holds one message and nacks every publish beyond that.
    broker
        .declare_queue_with(
            &full,
            field_table([
                ("x-max-length", AMQPValue::LongLongInt(1)),
                ("x-overflow", amqp_str("reject-publish")),
            ]),
        )
        .await;

    let toml = Forwarder::new(&p)
        .endpoint(Endpoint::queue("full", &full).undeclared())
        .endpoint(Endpoint::queue("overflow", &overflow))
        .backup_list("spill", &["overflow"])
        .filter("all", Filter::match_all())
        .branch(Branch::new("bounded", "all", "full").backups("spill"))
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;

    let bodies: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    for body in &bodies {
        let props = BasicProperties::default().with_message_id(body.as_str().into());
        broker.publish("", &inbound, body.as_bytes(), props).await;
    }
    broker.await_count(&full, 1, DEFAULT_TIMEOUT).await;
    broker.await_count(&overflow, 4, DEFAULT_TIMEOUT).await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let in_full: Vec<String> = broker
        .get_all(&full)
        .await
        .iter()
        .map(Message::body_str)
        .collect();
    // Failovers of independent messages run concurrently: any order.
    let mut in_overflow: Vec<String> = broker
        .get_all(&overflow)
        .await
        .iter()
        .map(Message::body_str)
        .collect();
    in_overflow.sort();
    assert_eq!(
        in_full,
        vec!["m0".to_string()],
        "{full}: the first message only"
    );
    assert_eq!(
        in_overflow,
        bodies[1..].to_vec(),
        "{overflow}: exactly the four nacked messages, once each"
    );
    assert_eq!(broker.queue_len(&dlq).await, 0, "nothing dead-lettered");
    assert_eq!(
        broker.queue_len(&inbound).await,
        0,
        "{inbound} must be empty"
    );

    broker.close().await;
    delete_all_with_prefix(&p).await;
}
