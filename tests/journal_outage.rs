//! The journal's broker down and back, on a private node (forwarding runs
//! on the shared broker): with `on_unavailable = "drop"` forwarding goes
//! on and the records it could not keep are counted; with `"hold"` nothing
//! is taken while the journal cannot be written (a request over HTTP is
//! answered 503), and everything is forwarded, and recorded, once it can.

use crate::support;

use lapin::BasicProperties;
use std::time::Duration;
use support::config::Forwarder;
use support::harness::InProcess;
use support::ingress::start_ingress;
use support::journal::records;
use support::node::PrivateNode;
use support::{
    DEFAULT_TIMEOUT, Metrics, TestBroker, delete_all_with_prefix, unique_prefix, wait_for,
    wait_until,
};
use switchyard::Options;

/// The seed's shape on the shared broker, its journal on `journal_url`
/// with `on_unavailable` and a small buffer.
fn config(p: &str, journal_url: &str, on_unavailable: &str) -> Forwarder {
    Forwarder::new(p)
        .broker("j", journal_url)
        .seed(p)
        .journal("broker", "j")
        .journal("on_unavailable", on_unavailable)
        .journal("buffer", 20u32)
}

/// Records the journal wrote, and records it dropped.
const WRITTEN: &str = "switchyard_journal_records_total";
const DROPPED: &str = "switchyard_journal_dropped_total";

fn metric(forwarder: &InProcess, name: &str) -> f64 {
    Metrics::parse(&forwarder.telemetry().render()).value(name, &[])
}

async fn publish(broker: &TestBroker, p: &str, ids: std::ops::Range<u32>) {
    for i in ids {
        let id = format!("{p}-{i}");
        let props = BasicProperties::default().with_message_id(id.as_str().into());
        broker
            .publish("", &format!("{p}.in"), id.as_bytes(), props)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journals_broker_down_drops_or_holds_as_configured() {
    let node = PrivateNode::start().await;
    let drop_p = unique_prefix("journal-drop");
    let hold_p = unique_prefix("journal-hold");
    let broker = TestBroker::connect(&drop_p).await;
    let drop_toml = config(&drop_p, &node.amqp_url(), "drop").toml();
    let hold_toml = config(&hold_p, &node.amqp_url(), "hold").toml();
    let dropping = InProcess::start_consuming(&drop_toml, &broker, &format!("{drop_p}.in")).await;
    // The holding instance also takes requests over HTTP.
    let hold_config = config(&hold_p, &node.amqp_url(), "hold").http(&[]);
    let hold_in = format!("{hold_p}.in");
    let (holding, client) =
        start_ingress(&hold_config, Options::default(), Some((&broker, &hold_in))).await;

    // Both journals write while their broker is up.
    publish(&broker, &drop_p, 0..5).await;
    publish(&broker, &hold_p, 0..5).await;
    records(&drop_toml, &format!("{drop_p}-4"), 1).await;
    records(&hold_toml, &format!("{hold_p}-4"), 1).await;
    wait_until(
        "the first five records counted written",
        DEFAULT_TIMEOUT,
        || async { metric(&dropping, WRITTEN) == 5.0 },
    )
    .await;

    node.stop_app().await;
    for (forwarder, which) in [(&dropping, "dropping"), (&holding, "holding")] {
        wait_until(
            &format!("the {which} journal is known unwritable"),
            DEFAULT_TIMEOUT,
            || async { metric(forwarder, "switchyard_journal_writable") == 0.0 },
        )
        .await;
    }
    publish(&broker, &drop_p, 5..205).await;
    publish(&broker, &hold_p, 5..105).await;

    // Drop: forwarding goes on, and what the buffer could not hold is counted.
    broker
        .await_count(&format!("{drop_p}.service"), 205, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{drop_p}.logging"), 205, DEFAULT_TIMEOUT)
        .await;
    wait_until("the drops are counted", DEFAULT_TIMEOUT, || async {
        metric(&dropping, DROPPED) > 0.0
    })
    .await;

    // Hold: nothing is forwarded or acked while the journal is down. How
    // long the broker stays down is the test's choice, not a condition.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(broker.queue_len(&format!("{hold_p}.service")).await, 5);
        assert_eq!(broker.queue_len(&format!("{hold_p}.logging")).await, 5);
    }
    // Over HTTP, a hold is an answer to come back later, and nothing is sent.
    let refused = client
        .post("/messages/k", &[("idempotency-key", "held-1")], b"h")
        .await;
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert!(
        refused.headers.contains_key("retry-after"),
        "{:?}",
        refused.headers
    );
    assert_eq!(broker.queue_len(&format!("{hold_p}.service")).await, 5);

    node.start_app().await;
    broker
        .await_count(&format!("{hold_p}.service"), 105, Duration::from_secs(60))
        .await;
    broker
        .await_count(&format!("{hold_p}.logging"), 105, DEFAULT_TIMEOUT)
        .await;
    for i in [5, 55, 104] {
        let found = records(&hold_toml, &format!("{hold_p}-{i}"), 1).await;
        assert_eq!(found[0]["verdict"], "acked");
    }
    assert_eq!(metric(&holding, DROPPED), 0.0);
    // The dropping journal writes again once its broker is back.
    let within = Duration::from_secs(60);
    let deadline = tokio::time::Instant::now() + within;
    while metric(&dropping, "switchyard_journal_writable") != 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dropping journal never wrote again: {}",
            dropping.telemetry().render()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    publish(&broker, &drop_p, 205..206).await;
    records(&drop_toml, &format!("{drop_p}-205"), 1).await;
    // Every record is accounted for: written (the five before, the one
    // after, and those the journal held through the outage) or counted
    // dropped. It held at least its full buffer (20) and the batch it was
    // trying to write; how big that batch grew depends on how fast the
    // messages came, so the split is not fixed, only the sum.
    let (written, dropped) = wait_for(
        "every record written or counted dropped",
        DEFAULT_TIMEOUT,
        || async {
            let (written, dropped) = (metric(&dropping, WRITTEN), metric(&dropping, DROPPED));
            (written + dropped == 206.0).then_some((written, dropped))
        },
    )
    .await;
    let held = written - 6.0;
    assert!(
        held >= 21.0 && dropped == 200.0 - held,
        "held through the outage {held}, dropped {dropped}"
    );

    dropping.stop().await.unwrap_or_else(|e| panic!("{e}"));
    holding.stop().await.unwrap_or_else(|e| panic!("{e}"));
    for p in [&drop_p, &hold_p] {
        assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
        delete_all_with_prefix(p).await;
    }
    node.stop().await;
}
