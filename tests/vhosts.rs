//! Endpoints on another virtual host: each broker entry gets its own
//! publishing connection, and copies land in that vhost's queues.

use crate::support;

use lapin::BasicProperties;
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::InProcess;
use support::{
    DEFAULT_TIMEOUT, Message, TestBroker, delete_all_with_prefix, rabbitmqctl, unique_prefix,
};

#[tokio::test]
async fn a_branch_on_another_vhost_gets_its_copies() {
    let p = unique_prefix("vhost");
    rabbitmqctl(&["add_vhost", &p]).await;
    rabbitmqctl(&["set_permissions", "-p", &p, "guest", ".*", ".*", ".*"]).await;
    let other_url = format!("amqp://guest:guest@127.0.0.1:5672/{p}");

    let broker = TestBroker::connect(&p).await;
    let toml = Forwarder::new(&p)
        .broker("other", &other_url)
        .endpoint(Endpoint::queue("local", &format!("{p}.local")))
        .endpoint(Endpoint::queue("remote", &format!("{p}.remote")).on("other"))
        .filter("all", Filter::match_all())
        .branch(Branch::new("local", "all", "local"))
        .branch(Branch::new("remote", "all", "remote"))
        .toml();
    let forwarder = InProcess::start_consuming(&toml, &broker, &format!("{p}.in")).await;
    let bodies: Vec<String> = (0..50).map(|i| format!("v{i:03}")).collect();
    broker
        .publish_many(
            "",
            &format!("{p}.in"),
            bodies.iter(),
            BasicProperties::default(),
        )
        .await;
    let other = TestBroker::connect_to(&other_url, &format!("{p}-other")).await;
    broker
        .await_count(&format!("{p}.local"), 50, DEFAULT_TIMEOUT)
        .await;
    other
        .await_count(&format!("{p}.remote"), 50, DEFAULT_TIMEOUT)
        .await;
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));

    let remote: Vec<String> = other
        .get_all(&format!("{p}.remote"))
        .await
        .iter()
        .map(Message::body_str)
        .collect();
    assert_eq!(
        remote, bodies,
        "every copy, once, in order, on the other vhost"
    );
    assert!(
        !broker.queue_exists(&format!("{p}.remote")).await,
        "nothing declared on the default vhost"
    );
    other.close().await;
    delete_all_with_prefix(&p).await;
    rabbitmqctl(&["delete_vhost", &p]).await;
}
