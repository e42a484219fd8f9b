//! The happy path: every message reaches every branch once, byte for byte,
//! with every property and header, and the inbound queue is left empty.

use crate::support;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use support::harness::{InProcess, base_toml, seed_toml};
use support::{
    BULK_TIMEOUT, DEFAULT_TIMEOUT, Message, TestBroker, delete_all_with_prefix, unique_prefix,
};

fn two_branch_toml(p: &str) -> String {
    seed_toml(p, &base_toml(p, "nack"))
}

/// Headers of `m` without the ones the forwarder may add.
/// The copy's headers other than switchyard's own: its `x-switchyard-*`
/// annotations and the `traceparent` naming its publish (checked apart).
fn user_headers(m: &Message) -> FieldTable {
    let mut out = FieldTable::default();
    if let Some(h) = m.properties.headers() {
        for (k, v) in h {
            if !k.as_str().starts_with("x-switchyard-") && k.as_str() != "traceparent" {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

fn rich_properties(i: u32) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("tenant".into(), AMQPValue::LongString("acme".into()));
    headers.insert("attempt".into(), AMQPValue::LongLongInt(i64::from(i)));
    headers.insert("flag".into(), AMQPValue::Boolean(true));
    headers.insert("ratio".into(), AMQPValue::Double(0.25));
    headers.insert(
        "tags".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![
            AMQPValue::LongString("a".into()),
            AMQPValue::LongInt(2),
        ])),
    );
    let mut nested = FieldTable::default();
    nested.insert("k".into(), AMQPValue::LongString("v".into()));
    headers.insert("nested".into(), AMQPValue::FieldTable(nested));
    headers.insert(
        "raw".into(),
        AMQPValue::LongString(vec![0u8, 159, 146, 150].into()),
    );
    BasicProperties::default()
        .with_message_id(format!("msg-{i}").into())
        .with_correlation_id(format!("corr-{i}").into())
        .with_reply_to("replies".into())
        .with_content_type("application/octet-stream".into())
        .with_content_encoding("identity".into())
        .with_type("work.item".into())
        .with_app_id("tests".into())
        .with_priority(3)
        .with_timestamp(1_700_000_000)
        .with_expiration("600000".into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

#[tokio::test]
async fn multicast_keeps_body_properties_and_headers_exactly() {
    let p = unique_prefix("multicast");
    let broker = TestBroker::connect(&p).await;
    let forwarder =
        InProcess::start_consuming(&two_branch_toml(&p), &broker, &format!("{p}.in")).await;

    // Bodies that stress byte-exactness: empty, binary, and 1 MiB.
    let bodies: Vec<Vec<u8>> = vec![
        Vec::new(),
        (0..=255u8).collect(),
        b"plain text".to_vec(),
        vec![0xA5; 1024 * 1024],
    ];
    for (i, body) in bodies.iter().enumerate() {
        broker
            .publish("", &format!("{p}.in"), body, rich_properties(i as u32))
            .await;
    }
    let n = bodies.len() as u32;
    broker
        .await_count(&format!("{p}.service"), n, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.logging"), n, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    for queue in ["service", "logging"] {
        let got = broker.get_all(&format!("{p}.{queue}")).await;
        assert_eq!(got.len(), bodies.len(), "{queue}");
        for (i, m) in got.iter().enumerate() {
            let sent = rich_properties(i as u32);
            assert_eq!(m.body, bodies[i], "{queue} body {i}");
            assert_eq!(
                user_headers(m),
                sent.headers().clone().unwrap_or_default(),
                "{queue} headers {i}"
            );
            let without_headers =
                |p: &BasicProperties| p.clone().with_headers(FieldTable::default());
            // The one property added: the forwarder's user, its mark for a
            // forwarder downstream.
            assert_eq!(
                without_headers(&m.properties),
                without_headers(&sent).with_user_id("guest".into()),
                "{queue} properties {i}"
            );
        }
    }
    for queue in ["service.backup", "logging.backup", "dlq", "in"] {
        assert_eq!(
            broker.queue_len(&format!("{p}.{queue}")).await,
            0,
            "{queue} must be empty"
        );
    }
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn a_message_without_properties_gets_only_switchyard_headers() {
    let p = unique_prefix("bare");
    let broker = TestBroker::connect(&p).await;
    let forwarder =
        InProcess::start_consuming(&two_branch_toml(&p), &broker, &format!("{p}.in")).await;
    broker
        .publish("", &format!("{p}.in"), b"bare", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.service"), 1, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.logging"), 1, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    for queue in ["service", "logging"] {
        let got = broker.get_all(&format!("{p}.{queue}")).await;
        assert_eq!(got[0].body, b"bare");
        assert!(user_headers(&got[0]).inner().is_empty());
        let traceparent = got[0].header_str("traceparent").unwrap_or_default();
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert!(
            parts.len() == 4 && parts[0] == "00" && parts[1].len() == 32 && parts[2].len() == 16,
            "{queue}: a new trace is started and carried: {traceparent:?}"
        );
        assert_eq!(got[0].properties.message_id(), &None);
        assert_eq!(got[0].properties.content_type(), &None);
    }
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn many_messages_arrive_once_and_in_order() {
    let p = unique_prefix("order");
    let broker = TestBroker::connect(&p).await;
    let forwarder =
        InProcess::start_consuming(&two_branch_toml(&p), &broker, &format!("{p}.in")).await;
    let n = 2000u32;
    let bodies: Vec<String> = (0..n).map(|i| format!("{i:06}")).collect();
    broker
        .publish_many(
            "",
            &format!("{p}.in"),
            bodies.iter(),
            BasicProperties::default(),
        )
        .await;
    broker
        .await_count(&format!("{p}.service"), n, BULK_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.logging"), n, BULK_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    for queue in ["service", "logging"] {
        let got: Vec<String> = broker
            .get_all(&format!("{p}.{queue}"))
            .await
            .iter()
            .map(Message::body_str)
            .collect();
        assert_eq!(got, bodies, "{queue}: every message once, in inbound order");
    }
    assert_eq!(broker.queue_len(&format!("{p}.in")).await, 0);
    delete_all_with_prefix(&p).await;
}

#[tokio::test]
async fn an_endpoints_headers_option_sets_headers_on_its_copies_only() {
    let p = unique_prefix("ep-headers");
    let broker = TestBroker::connect(&p).await;
    let toml = two_branch_toml(&p).replace(
        &format!("routing_key = \"{p}.logging\"\n"),
        &format!("routing_key = \"{p}.logging\"\nheaders = {{ tenant = \"override\", added = \"yes\" }}\n"),
    );
    let forwarder = InProcess::start_consuming(&toml, &broker, &format!("{p}.in")).await;
    broker
        .publish("", &format!("{p}.in"), b"h", rich_properties(7))
        .await;
    broker
        .await_count(&format!("{p}.service"), 1, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.logging"), 1, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let service = &broker.get_all(&format!("{p}.service")).await[0];
    assert_eq!(
        user_headers(service),
        rich_properties(7).headers().clone().unwrap_or_default()
    );
    let logging = &broker.get_all(&format!("{p}.logging")).await[0];
    let mut expected = rich_properties(7).headers().clone().unwrap_or_default();
    expected.insert("tenant".into(), AMQPValue::LongString("override".into()));
    expected.insert("added".into(), AMQPValue::LongString("yes".into()));
    assert_eq!(user_headers(logging), expected);
    delete_all_with_prefix(&p).await;
}
