//! Two real instances on one inbound queue writing one journal: a message
//! the first held (its endpoints unreachable) goes back to the queue when
//! the first loses its connections and is then SIGKILLed; the second
//! forwards it. `switchyard trace` answers with both instances' records in
//! time order: requeued by the first, acked by the second as a
//! redelivery. Every message is counted.

use crate::support;

use lapin::BasicProperties;
use support::config::{Endpoint, Forwarder};
use support::harness::Process;
use support::journal::{records, trace};
use support::rabbitmqctl::close_connections_named;
use support::rabbitmqctl::ready_unacked;
use support::{DEFAULT_TIMEOUT, TestBroker, delete_all_with_prefix, unique_prefix, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_messages_records_from_both_instances_come_in_one_answer() {
    let p = unique_prefix("journal-pair");
    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    // Nothing listens there: every publish of the first instance fails as
    // an outage, and it holds what it takes.
    let closed = support::ingress::ingress_listener().1;
    let (first_name, second_name) = (format!("{p}-first"), format!("{p}-second"));
    let first_toml = Forwarder::new(&p)
        .top("name", first_name.as_str())
        .inbound("prefetch", 5u32)
        .broker("far", &format!("amqp://guest:guest@{closed}/%2f"))
        .seed_with(&p, |endpoint: Endpoint| endpoint.undeclared().on("far"))
        .toml();
    let second_toml = Forwarder::new(&p)
        .top("name", second_name.as_str())
        .seed(&p)
        .toml();

    let mut first = Process::spawn(&format!("{p}-first"), &first_toml);
    wait_until("the first instance consumes", DEFAULT_TIMEOUT, || async {
        broker
            .probe_queue(&inbound)
            .await
            .is_some_and(|q| q.consumer_count() == 1)
    })
    .await;
    let publish = |i: u32| {
        let broker = &broker;
        let inbound = &inbound;
        async move {
            let id = format!("m-{i}");
            let props = BasicProperties::default().with_message_id(id.as_str().into());
            broker.publish("", inbound, id.as_bytes(), props).await;
        }
    };
    publish(0).await;
    wait_until("the first instance holds m-0", DEFAULT_TIMEOUT, || async {
        ready_unacked(&inbound).await == Some((0, 1))
    })
    .await;
    let mut second = Process::spawn(&format!("{p}-second"), &second_toml);
    for i in 1..50 {
        publish(i).await;
    }
    // The first instance loses its connections: what it held goes back,
    // recorded as requeued. Then it is killed.
    assert!(close_connections_named(&first_name).await >= 1);
    let requeued =
        |r: &serde_json::Value| r["instance"] == first_name.as_str() && r["verdict"] == "requeued";
    wait_until(
        "the first instance records m-0 as requeued",
        DEFAULT_TIMEOUT,
        || async {
            trace(&second_toml, "m-0", &["--json"])
                .await
                .records
                .iter()
                .any(requeued)
        },
    )
    .await;
    first.signal("KILL");
    assert_eq!(
        first.wait_exit(DEFAULT_TIMEOUT).await,
        None,
        "killed by a signal"
    );

    broker
        .await_count(&format!("{p}.service"), 50, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.logging"), 50, DEFAULT_TIMEOUT)
        .await;
    let mut ids: Vec<String> = broker
        .get_all(&format!("{p}.service"))
        .await
        .iter()
        .filter_map(|m| m.properties.message_id().as_ref().map(|s| s.to_string()))
        .collect();
    ids.sort();
    let duplicates = ids.len() - {
        let mut unique = ids.clone();
        unique.dedup();
        unique.len()
    };
    println!("service copies: {} ({duplicates} duplicates)", ids.len());
    assert_eq!(
        ids.len(),
        50,
        "every message once (the first delivered none)"
    );

    let both = records(&second_toml, "m-0", 2).await;
    assert_eq!(both.len(), 2, "one record from each instance: {both:?}");
    let settled: Vec<&str> = both
        .iter()
        .map(|r| r["settled_at"].as_str().unwrap_or_default())
        .collect();
    assert!(settled[0] <= settled[1], "in time order: {settled:?}");
    let first_record = both
        .iter()
        .find(|r| requeued(r))
        .unwrap_or_else(|| panic!("the first instance's record: {both:?}"));
    assert_eq!(first_record["source"], "queue");
    let second_record = both
        .iter()
        .find(|r| r["instance"] == second_name.as_str())
        .unwrap_or_else(|| panic!("the second instance's record: {both:?}"));
    assert_eq!(second_record["verdict"], "acked");
    assert_eq!(second_record["redelivered"], true);
    let human = trace(&second_toml, "m-0", &[]).await;
    assert!(
        human.stdout.contains(&first_name) && human.stdout.contains(&second_name),
        "{}",
        human.stdout
    );

    second.signal("TERM");
    assert_eq!(second.wait_exit(DEFAULT_TIMEOUT).await, Some(0));
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    delete_all_with_prefix(&p).await;
}
