//! Permission loss is an outage, not a message failure: the forwarder's
//! user losing its permissions on the vhost mid-stream (an operator's
//! mistake, put right a few seconds later) dead-letters nothing and loses
//! nothing with `outage` at its default, and the log names the user, the
//! vhost and what to grant.
//!
//! Each test has a vhost and a user of its own on the shared broker
//! ([`TestVhost`]); the forwarder runs as that user, `guest` streams the
//! messages and counts them. What RabbitMQ (3.10) does when the user's
//! permissions change under live connections, as observed here:
//!
//! - Nothing is closed. Connections and channels stay open, and a consumer
//!   keeps receiving and acking: `basic.consume` was checked when it was
//!   issued, deliveries and acks are not checked again.
//! - A publish is checked against the channel's permission cache. A
//!   channel that keeps publishing keeps publishing after
//!   `clear_permissions`: its cache is dropped only when its process
//!   hibernates, after about a second without work (longer for a channel
//!   woken often). So a busy stream never sees the change; a lull does.
//! - Once the cache is gone, the next publish closes the channel with
//!   `403 ACCESS_REFUSED - access to exchange 'amq.default' in vhost 'V'
//!   refused for user 'U'`, the same for cleared permissions and for
//!   writes denied (`set_permissions -p V U '.*' '' '.*'`); a new channel
//!   opens and is refused on its first publish. The connection stays.
//! - With the permissions cleared, a new connection is refused `530
//!   NOT_ALLOWED - access to vhost 'V' refused for user 'U'`, and a
//!   `basic.get` or a new `basic.consume` `403`; with writes denied, new
//!   connections and reads still work. Either way a passive
//!   `queue.declare` is not checked and succeeds: a probe that declares
//!   passively finds the endpoint working while its publishes are refused.
//! - Restored permissions apply to the next check: a new channel publishes
//!   again at once.
//!
//! So the stream pauses for the revocation: the first half is forwarded,
//! the permissions are taken away, the test waits until every channel of
//! the user has dropped its cache (a condition on the broker, polled),
//! then streams the second half into the refusal, holds it for a few
//! seconds and restores the permissions.

use crate::support;

use lapin::BasicProperties;
use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;
use support::config::Forwarder;
use support::harness::{Process, wait_consumers};
use support::vhost::TestVhost;
use support::{
    BULK_TIMEOUT, DEFAULT_TIMEOUT, POLL_INTERVAL, TestBroker, tally_queues, unique_prefix,
    wait_until, wait_until_every,
};

/// Messages streamed in all; the permissions go at the half.
const STREAM: u32 = 4000;
const REVOKED_AT: u32 = STREAM / 2;
/// The stream: confirmed batches of this many, `PACE` apart.
const BATCH: u32 = 20;
const PACE: Duration = Duration::from_millis(20);
/// How long the operator takes to notice, once the forwarder is refused.
const HELD_FOR: Duration = Duration::from_secs(3);

fn message(i: u32) -> (String, BasicProperties) {
    let id = format!("m{i:05}");
    let props = BasicProperties::default()
        .with_message_id(id.as_str().into())
        .with_delivery_mode(2);
    (id, props)
}

/// Publishes `range` to `queue` on `url` as a steady stream of confirmed
/// batches.
async fn stream(url: String, queue: String, range: Range<u32>) {
    let broker = TestBroker::connect_to(&url, &format!("{queue}-producer")).await;
    let mut start = range.start;
    while start < range.end {
        let end = (start + BATCH).min(range.end);
        let messages = (start..end).map(|i| {
            let (id, props) = message(i);
            (id.into_bytes(), props)
        });
        broker.publish_each("", &queue, messages).await;
        start = end;
        tokio::time::sleep(PACE).await;
    }
    broker.close().await;
}

/// Copies held by `queues` together.
async fn copies(broker: &TestBroker, queues: &[String]) -> u32 {
    let mut n = 0;
    for queue in queues {
        n += broker.queue_len(queue).await;
    }
    n
}

/// The forwarder's error line for a refusal of its own user: it names the
/// user and the vhost and says what to grant.
fn refusal_line<'a>(log: &'a str, vhost: &TestVhost) -> Option<&'a str> {
    log.lines().find(|line| {
        line.contains("ERROR")
            && line.contains(&vhost.user)
            && line.contains(&vhost.name)
            && line.contains("set_permissions")
    })
}

/// How the user loses its permissions.
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// `rabbitmqctl clear_permissions`: nothing at all on the vhost.
    Cleared,
    /// `set_permissions '.*' '' '.*'`: configure and read, no write.
    WritesDenied,
}

impl Loss {
    async fn apply(self, vhost: &TestVhost) {
        match self {
            Self::Cleared => vhost.clear_permissions().await,
            Self::WritesDenied => vhost.set_permissions(".*", "", ".*").await,
        }
    }
}

async fn permissions_lost_mid_stream(loss: Loss) {
    let p = unique_prefix(&format!("perm-{loss:?}"));
    let vhost = TestVhost::create(&p).await;
    let toml = Forwarder::at(&vhost.user_url(), &p).seed(&p).toml();
    let inbound = format!("{p}.in");
    let dlq = format!("{p}.dlq");
    let service = [format!("{p}.service"), format!("{p}.service.backup")];
    let logging = [format!("{p}.logging"), format!("{p}.logging.backup")];
    let mut forwarder = Process::spawn(&p, &toml);
    let broker = TestBroker::connect_to(&vhost.guest_url(), &format!("{p}-test")).await;
    wait_consumers(&broker, &inbound, 1).await;

    // The first half, forwarded with every permission.
    stream(vhost.guest_url(), inbound.clone(), 0..REVOKED_AT).await;
    wait_until("the first half is forwarded", BULK_TIMEOUT, || async {
        copies(&broker, &service).await >= REVOKED_AT
            && copies(&broker, &logging).await >= REVOKED_AT
    })
    .await;

    // The operator's mistake; the broker applies it to the forwarder's
    // idle channels once they have dropped their permission caches.
    loss.apply(&vhost).await;
    let revoked = tokio::time::Instant::now();
    vhost.wait_permission_caches_dropped(DEFAULT_TIMEOUT).await;
    let producer = tokio::spawn(stream(
        vhost.guest_url(),
        inbound.clone(),
        REVOKED_AT..STREAM,
    ));
    wait_until("the forwarder is refused", DEFAULT_TIMEOUT, || async {
        refusal_line(&forwarder.log(), &vhost).is_some()
    })
    .await;
    let refused_after = revoked.elapsed();

    // Held, not dead-lettered, until the operator puts it right.
    let watched = tokio::time::Instant::now();
    while watched.elapsed() < HELD_FOR {
        assert_eq!(broker.queue_len(&dlq).await, 0, "held, not dead-lettered");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let held = vhost.ready_unacked(&inbound).await;
    assert!(
        held.is_some_and(|(ready, unacked)| ready + unacked > 0),
        "the refusal holds messages: {held:?}"
    );
    vhost.grant_all().await;
    let revoked_for = revoked.elapsed();

    producer.await.expect("the producer panicked");
    wait_until_every(
        "the inbound queue settles",
        BULK_TIMEOUT,
        Duration::from_millis(500),
        || async { vhost.ready_unacked(&inbound).await == Some((0, 0)) },
    )
    .await;
    forwarder.signal("TERM");
    assert_eq!(forwarder.wait_exit(DEFAULT_TIMEOUT).await, Some(0));

    let service = tally_queues(&broker, &service).await;
    let logging = tally_queues(&broker, &logging).await;
    let dead = broker.get_all(&dlq).await;
    let duplicates = |t: &BTreeMap<String, usize>| t.values().map(|n| n - 1).sum::<usize>();
    let log = forwarder.log();
    let mentions = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    println!(
        "{loss:?}: refused {refused_after:.1?} after the revocation, permissions back after \
         {revoked_for:.1?}, inbound (ready, unacked) {held:?} when they came back; service {} ids \
         ({} duplicates), logging {} ids ({} duplicates), {} dead-lettered; log: {} refusals of \
         the user, {} vhost refusals, {} endpoint down, {} up again, {} outage holds, {} \
         outage over, {} consumer lost",
        service.len(),
        duplicates(&service),
        logging.len(),
        duplicates(&logging),
        dead.len(),
        mentions("refuses the forwarder's user"),
        mentions("vhost refused"),
        mentions("endpoint down"),
        mentions("endpoint up again"),
        mentions("outage: messages held"),
        mentions("outage over"),
        mentions("inbound consumer lost"),
    );
    let refusal = refusal_line(&log, &vhost).unwrap_or_default();
    println!("{loss:?}: {refusal}");
    assert!(
        dead.is_empty(),
        "an outage dead-letters nothing; dead-lettered: {:?}",
        dead.iter()
            .take(10)
            .map(|m| m.body_str())
            .collect::<Vec<_>>()
    );
    for i in 0..STREAM {
        let (id, _) = message(i);
        assert!(service.contains_key(&id), "{id} missing from service");
        assert!(logging.contains_key(&id), "{id} missing from logging");
    }
    broker.close().await;
    vhost.delete().await;
}

#[tokio::test]
async fn permissions_cleared_mid_stream_dead_letter_nothing_and_lose_nothing() {
    permissions_lost_mid_stream(Loss::Cleared).await;
}

#[tokio::test]
async fn writes_denied_mid_stream_dead_letter_nothing_and_lose_nothing() {
    permissions_lost_mid_stream(Loss::WritesDenied).await;
}
