//! The forwarder on a three-node RabbitMQ cluster of the test's own
//! ([`PrivateCluster`]), its broker given as `uris = [n0, n1, n2]`: every
//! connection uses the first node that answers, moves to the next at once
//! when it loses its node, and goes back to the preferred one when it
//! returns. Every queue is a quorum queue replicated on the three nodes.
//! Both tests run on one cluster, one after the other, each with its own
//! queues and forwarder; beside them, in the same test binary
//! (`tests/slow/main.rs`), the chaos runs.
//!
//! - A rolling restart (`stop_app`, five seconds down, `start_app`, node by
//!   node) while messages flow: nothing lost, nothing dead-lettered, and
//!   while a node is down copies keep reaching both branches.
//! - The preferred node SIGKILLed while messages flow: traffic goes on
//!   through another node, and once the node is back both connections
//!   return to it (the `switchyard_broker_node` gauge and the broker's own
//!   connection list say so); nothing lost, nothing dead-lettered.
//!
//! How messages are counted: the test's publisher (a connection of its own,
//! moving between nodes as the forwarder does) publishes ids `m000000`...
//! persistent, with confirms, and publishes again what is not confirmed
//! (duplicates, never gaps). A watcher samples the depth of the four
//! destination queues every 200 ms: nothing consumes them, so a depth that
//! grows is a copy arriving. At the end every queue is drained and each id
//! counted per branch (primary and backup together).

use crate::support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use support::cluster::{PrivateCluster, wait_every};
use support::config::{Endpoint, Forwarder};
use support::harness::Process;
use support::raw::{RawClient, RawMessage};
use support::{Metrics, TestBroker, free_admin_addr, http_get, try_rabbitmqctl, unique_prefix};
use tokio::time::{Instant, MissedTickBehavior};

const NODES: usize = 3;
/// The test's publisher sends this many messages a second, steadily...
const RATE: usize = 50;
const TICK: Duration = Duration::from_millis(100);
/// ...and, in the rolling restart, at least this many in all.
const ROLLING_MESSAGES: usize = 3000;
/// How long each node of the rolling restart stays down (the fault itself).
const DOWN_FOR: Duration = Duration::from_secs(5);
/// The longest stretch without a new copy reaching a branch while a node is down.
const MAX_STALL: Duration = Duration::from_secs(5);
/// How often the watcher samples the destination queues.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// A publish (or its confirm) that takes longer is published again.
const PUBLISH_WAIT: Duration = Duration::from_secs(15);
/// Connecting to one node, for the test's own clients.
const CONNECT_WAIT: Duration = Duration::from_secs(5);
/// Bound on the return of both connections to the preferred node once it is
/// back (the forwarder checks every 5 s).
const RETURN_BOUND: Duration = Duration::from_secs(60);
/// Bound on the forwarder's old connections closing after a return (they
/// are closed 30 s after it).
const OLD_CLOSED_BOUND: Duration = Duration::from_secs(50);
/// Bound on failing over (metrics on another node, copies flowing again).
const FAILOVER_BOUND: Duration = Duration::from_secs(30);
/// Bound on the inbound queue emptying once publishing has stopped.
const SETTLE_BOUND: Duration = Duration::from_secs(90);
/// The destination queues (suffixes of the test's prefix), by branch.
const BRANCHES: [(&str, [&str; 2]); 2] = [
    ("service", ["service", "service.backup"]),
    ("logging", ["logging", "logging.backup"]),
];

/// The gauge that says which node each role's connection uses.
const NODE_GAUGE: &str = "switchyard_broker_node";

fn id(i: usize) -> String {
    format!("m{i:06}")
}

/// One test's cluster, forwarder and timeline.
struct Rig {
    p: String,
    cluster: PrivateCluster,
    forwarder: Option<Process>,
    admin: SocketAddr,
    started: Instant,
    timeline: Mutex<Vec<String>>,
}

impl Rig {
    /// On `cluster`, declares the four destination queues as quorum
    /// queues on all nodes, starts the forwarder on `uris = [n0, n1, n2]`
    /// (which declares the inbound and dead-letter queues as quorum
    /// queues), and waits until it consumes and every queue has its three
    /// members online.
    async fn start(test: &str, cluster: PrivateCluster) -> Rig {
        let started = Instant::now();
        let p = unique_prefix(test);
        let admin = free_admin_addr();
        let mut rig = Rig {
            p,
            cluster,
            forwarder: None,
            admin,
            started,
            timeline: Mutex::new(Vec::new()),
        };
        rig.note(format!(
            "on the cluster of {NODES}: {}",
            rig.cluster
                .nodes()
                .iter()
                .map(|n| format!("{} on {}", n.node_name(), n.amqp_addr()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for (_, queues) in BRANCHES {
            for queue in queues {
                rig.cluster.declare_quorum(&rig.queue(queue)).await;
            }
        }
        rig.forwarder = Some(Process::spawn(&rig.p, &rig.toml()));
        rig.wait_consuming().await;
        rig.note("forwarder consuming");
        rig.cluster.await_quorum_online(&rig.all_queues(), 0).await;
        rig.note("all six queues are quorum queues with 3 online members");
        rig
    }

    fn queue(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.p)
    }

    fn all_queues(&self) -> Vec<String> {
        let mut queues = vec![self.queue("in"), self.queue("dlq")];
        for (_, branch) in BRANCHES {
            queues.extend(branch.iter().map(|q| self.queue(q)));
        }
        queues
    }

    /// The node label of node `i` in the metrics: its host and port as configured.
    fn label(&self, i: usize) -> String {
        self.cluster.node(i).amqp_addr().to_string()
    }

    fn since(&self) -> Duration {
        self.started.elapsed()
    }

    fn note(&self, text: impl AsRef<str>) {
        let line = format!("+{:6.1}s {}", self.since().as_secs_f64(), text.as_ref());
        println!("cluster: {line}");
        self.timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
    }

    fn timeline(&self) -> String {
        let lines = self.timeline.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::from("timeline:\n");
        for line in lines.iter() {
            let _ = writeln!(out, "  {line}");
        }
        out
    }

    /// The seed scenario (branches service and logging over every message,
    /// each with one backup), quorum inbound and dead-letter queues (nack
    /// mode), the destination queues declared by the test, an admin
    /// listener, and broker `main` as `uris = [n0, n1, n2]`.
    fn toml(&self) -> String {
        let p = &self.p;
        let urls = self.cluster.amqp_urls();
        Forwarder::at(&urls[0], p)
            .broker_nodes("main", &urls)
            .mode("nack")
            .inbound("queue_type", "quorum")
            .inbound("prefetch", 200)
            .dead_letter("queue_type", "quorum")
            .admin(&self.admin.to_string())
            .seed_with(p, Endpoint::undeclared)
            .toml()
    }

    /// Waits until the forwarder consumes from the inbound queue.
    async fn wait_consuming(&self) {
        let inbound = self.queue("in");
        let addr = self.cluster.node(0).amqp_addr();
        let what = format!("the forwarder consumes from {inbound}");
        wait_every(&what, Duration::from_secs(60), || {
            let inbound = inbound.clone();
            async move {
                let Ok(Ok(mut raw)) =
                    tokio::time::timeout(CONNECT_WAIT, RawClient::connect(addr, "/")).await
                else {
                    return false;
                };
                let counts = raw.queue_counts(&inbound).await;
                raw.close().await;
                matches!(counts, Ok((_, 1)))
            }
        })
        .await;
    }

    /// The admin endpoint's metrics; `None` when it does not answer.
    async fn metrics(&self) -> Option<Metrics> {
        let response =
            tokio::time::timeout(Duration::from_secs(5), http_get(self.admin, "/metrics"))
                .await
                .ok()?
                .ok()?;
        (response.status == 200).then(|| Metrics::parse(&response.body))
    }

    /// The node (label) each role's connection uses now, by the gauge:
    /// `(consume, publish)`, `None` for a role with no node at 1 (or more than one).
    async fn nodes_in_use(&self) -> (Option<String>, Option<String>) {
        let Some(metrics) = self.metrics().await else {
            return (None, None);
        };
        let role = |role: &str| {
            let at_one: Vec<String> = metrics
                .samples
                .iter()
                .filter(|((name, labels), value)| {
                    name == NODE_GAUGE
                        && labels.get("broker").map(String::as_str) == Some("main")
                        && labels.get("role").map(String::as_str) == Some(role)
                        && **value == 1.0
                })
                .filter_map(|((_, labels), _)| labels.get("node").cloned())
                .collect();
            (at_one.len() == 1).then(|| at_one[0].clone())
        };
        (role("consume"), role("publish"))
    }

    /// Waits (up to `bound`) until both roles use a node `accept` takes;
    /// returns how long it took, the nodes, and what the gauge said on the
    /// way (each change, with its time).
    async fn wait_roles(
        &self,
        what: &str,
        bound: Duration,
        accept: impl Fn(&str) -> bool,
    ) -> (Duration, String, String, String) {
        let began = Instant::now();
        let deadline = began + bound;
        let mut seen: Vec<String> = Vec::new();
        let mut last = None;
        loop {
            let state = self.nodes_in_use().await;
            if last.as_ref() != Some(&state) {
                seen.push(format!(
                    "{:.1}s consume {:?} publish {:?}",
                    began.elapsed().as_secs_f64(),
                    state.0,
                    state.1
                ));
                last = Some(state.clone());
            }
            if let (Some(c), Some(p)) = &state
                && accept(c)
                && accept(p)
            {
                return (began.elapsed(), c.clone(), p.clone(), seen.join("; "));
            }
            if Instant::now() >= deadline {
                self.fail(format!(
                    "timed out after {bound:?} waiting until {what}; the gauge said: {}",
                    seen.join("; ")
                ))
                .await;
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    }

    /// The forwarder's connections as the broker lists them (cluster-wide):
    /// `(role, server port)` of each connection named `<prefix>/<role>/main`.
    async fn forwarder_connections(&self, via: usize) -> Vec<(String, u16)> {
        let own = format!("{}/", self.p);
        self.cluster
            .connections(via)
            .await
            .into_iter()
            .filter_map(|(port, name)| {
                let role = name?.strip_prefix(&own)?.split('/').next()?.to_owned();
                Some((role, port))
            })
            .collect()
    }

    /// [`Watch::wait_growth`], failing the test with the cluster's state
    /// when copies do not grow.
    async fn grown(&self, watch: &Watch, base: [u32; 2], n: u32, bound: Duration) -> Duration {
        match watch.wait_growth(base, n, bound).await {
            Some(took) => took,
            None => {
                self.fail(format!(
                    "both branches did not grow by {n} copies from {base:?} within {bound:?} \
                     (now {:?})",
                    watch.copies()
                ))
                .await
            }
        }
    }

    /// Panics with `what`, the timeline, the queues as a running node
    /// lists them, the tail of each node's log and the forwarder's log.
    async fn fail(&self, what: String) -> ! {
        let mut out = format!("{what}\n{}", self.timeline());
        for node in self.cluster.nodes() {
            let listed = try_rabbitmqctl(&[
                "-n",
                node.node_name(),
                "list_queues",
                "--silent",
                "name",
                "type",
                "leader",
                "online",
                "messages_ready",
                "messages_unacknowledged",
            ])
            .await;
            if let Ok(listed) = listed {
                let _ = writeln!(out, "queues as {} lists them:\n{listed}", node.node_name());
                break;
            }
        }
        for (i, node) in self.cluster.nodes().iter().enumerate() {
            let _ = writeln!(
                out,
                "node {i} {} log tail:\n{}",
                node.node_name(),
                node.log_tail(25)
            );
        }
        panic!("{out}{}", self.log_excerpt());
    }

    /// The forwarder's log without its per-message lines (the last 60),
    /// and those counted: failovers by endpoint and error, and the others.
    fn log_excerpt(&self) -> String {
        let Some(forwarder) = &self.forwarder else {
            return String::new();
        };
        let log = forwarder.log();
        let mut per_message: BTreeMap<String, usize> = BTreeMap::new();
        let mut lines = Vec::new();
        for line in log.lines() {
            match line.find(" message_id=") {
                Some(at) => {
                    // `<time> <level> <target>: <what> message_id=".." <rest>`
                    let what = line[..at].rsplit(": ").next().unwrap_or_default();
                    let rest = line[at + 1..].split_once(' ').map_or("", |(_, r)| r);
                    *per_message.entry(format!("{what} {rest}")).or_insert(0) += 1;
                }
                None => lines.push(line),
            }
        }
        let shown = &lines[lines.len().saturating_sub(60)..];
        let mut out = format!(
            "forwarder log ({}): {} of {} lines without a message id:\n  {}\n",
            forwarder.log_path.display(),
            shown.len(),
            lines.len(),
            shown.join("\n  ")
        );
        out.push_str("per-message lines, counted:\n");
        for (kind, n) in &per_message {
            let _ = writeln!(out, "  {n} x {kind}");
        }
        out
    }

    /// Waits until the inbound queue has nothing ready and nothing unacked
    /// (twice in a row, half a second apart).
    async fn settle(&self) {
        let inbound = self.queue("in");
        let deadline = Instant::now() + SETTLE_BOUND;
        let mut quiet = 0;
        loop {
            let state = self.cluster.node(0).ready_unacked(&inbound).await;
            quiet = if state == Some((0, 0)) { quiet + 1 } else { 0 };
            if quiet >= 2 {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{inbound} did not settle within {SETTLE_BOUND:?}: (ready, unacked) = \
                     {state:?}\n{}{}",
                    self.timeline(),
                    self.log_excerpt()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Stops the forwarder (SIGTERM) and returns its exit code.
    async fn stop_forwarder(&mut self) -> Option<i32> {
        let forwarder = self.forwarder.as_mut()?;
        forwarder.signal("TERM");
        forwarder.wait_exit(Duration::from_secs(30)).await
    }

    /// Drains every queue (through node 0) and counts.
    async fn account(&self, published: usize) -> Accounting {
        let mut raw = RawClient::connect(self.cluster.node(0).amqp_addr(), "/")
            .await
            .unwrap_or_else(|e| panic!("connect to drain: {e}"));
        let mut queues = HashMap::new();
        for suffix in [
            "service",
            "service.backup",
            "logging",
            "logging.backup",
            "dlq",
            "in",
        ] {
            let messages = raw
                .drain(&self.queue(suffix))
                .await
                .unwrap_or_else(|e| panic!("drain {suffix}: {e}"));
            queues.insert(suffix.to_owned(), messages);
        }
        raw.close().await;
        Accounting { queues, published }
    }
}

/// What the queues held at the end.
struct Accounting {
    queues: HashMap<String, Vec<RawMessage>>,
    published: usize,
}

/// Per branch: copies, distinct ids, duplicates, lost ids.
struct Tally {
    branch: &'static str,
    primary: usize,
    backup: usize,
    copies: usize,
    distinct: usize,
    lost: Vec<String>,
}

impl Accounting {
    fn len(&self, suffix: &str) -> usize {
        self.queues.get(suffix).map_or(0, Vec::len)
    }

    fn ids(&self, suffix: &str) -> impl Iterator<Item = String> + '_ {
        self.queues
            .get(suffix)
            .into_iter()
            .flatten()
            .map(|m| m.message_id.clone().unwrap_or_default())
    }

    fn tally(&self) -> Vec<Tally> {
        BRANCHES
            .iter()
            .map(|(branch, [primary, backup])| {
                let counts = support::tally(self.ids(primary).chain(self.ids(backup)));
                let lost = (0..self.published)
                    .map(id)
                    .filter(|id| !counts.contains_key(id))
                    .collect();
                Tally {
                    branch,
                    primary: self.len(primary),
                    backup: self.len(backup),
                    copies: counts.values().sum(),
                    distinct: counts.len(),
                    lost,
                }
            })
            .collect()
    }

    /// Ids found anywhere that the publisher never sent, and copies whose
    /// body is not their id.
    fn strangers(&self) -> (BTreeSet<String>, usize) {
        let known: BTreeSet<String> = (0..self.published).map(id).collect();
        let unknown = self
            .queues
            .values()
            .flatten()
            .filter_map(|m| m.message_id.clone())
            .filter(|id| !known.contains(id))
            .collect();
        let altered = self
            .queues
            .values()
            .flatten()
            .filter(|m| m.message_id.as_deref().map(str::as_bytes) != Some(m.body.as_slice()))
            .count();
        (unknown, altered)
    }

    /// The report lines and the problems found.
    fn report(&self) -> (String, Vec<String>) {
        let mut out = String::new();
        let mut problems = Vec::new();
        for t in self.tally() {
            let _ = writeln!(
                out,
                "{}: {} primary + {} backup = {} copies of {} distinct ids ({} duplicates), \
                 {} lost",
                t.branch,
                t.primary,
                t.backup,
                t.copies,
                t.distinct,
                t.copies - t.distinct.min(t.copies),
                t.lost.len()
            );
            if !t.lost.is_empty() {
                let sample: Vec<&String> = t.lost.iter().take(8).collect();
                problems.push(format!(
                    "{} lost {} of {} ids, e.g. {sample:?}",
                    t.branch,
                    t.lost.len(),
                    self.published
                ));
            }
        }
        let (dlq, left) = (self.len("dlq"), self.len("in"));
        let _ = writeln!(out, "dlq: {dlq} dead letters; inbound left: {left}");
        if dlq > 0 {
            let sample: Vec<String> = self.ids("dlq").take(8).collect();
            problems.push(format!("{dlq} messages dead-lettered, e.g. {sample:?}"));
        }
        if left > 0 {
            problems.push(format!("{left} messages left in the inbound queue"));
        }
        let (unknown, altered) = self.strangers();
        if !unknown.is_empty() {
            problems.push(format!("unknown ids: {unknown:?}"));
        }
        if altered > 0 {
            problems.push(format!("{altered} copies with an altered body"));
        }
        (out, problems)
    }
}

/// The test's publisher: ids `m000000`... to the inbound queue at `RATE`
/// a second, persistent and mandatory, with confirms; what is not confirmed
/// is published again on a fresh connection, to the next node that answers.
struct Feed {
    urls: Vec<String>,
    inbound: String,
    name: String,
    /// At least this many, then stop once `stop` is set.
    min: usize,
    stop: AtomicBool,
    /// Ids `0..confirmed` are confirmed.
    confirmed: AtomicUsize,
    retries: AtomicUsize,
    reconnects: AtomicUsize,
    /// The longest time one batch took to be confirmed, retries included.
    longest_batch: Mutex<Duration>,
}

impl Feed {
    fn new(rig: &Rig, order: &[usize], min: usize) -> Arc<Feed> {
        let urls = rig.cluster.amqp_urls();
        Arc::new(Feed {
            urls: order.iter().map(|&i| urls[i].clone()).collect(),
            inbound: rig.queue("in"),
            name: format!("{}-feed", rig.p),
            min,
            stop: AtomicBool::new(false),
            confirmed: AtomicUsize::new(0),
            retries: AtomicUsize::new(0),
            reconnects: AtomicUsize::new(0),
            longest_batch: Mutex::new(Duration::ZERO),
        })
    }

    fn confirmed(&self) -> usize {
        self.confirmed.load(Ordering::SeqCst)
    }

    fn summary(&self) -> String {
        format!(
            "publisher: {} ids confirmed, {} publishes retried, {} reconnects, longest batch \
             {:.1}s",
            self.confirmed(),
            self.retries.load(Ordering::SeqCst),
            self.reconnects.load(Ordering::SeqCst),
            self.longest_batch
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_secs_f64()
        )
    }

    /// A confirm channel on the first node, from `*at` on, that answers.
    async fn connect(&self, at: &mut usize) -> Option<(Connection, Channel)> {
        for k in 0..self.urls.len() {
            let i = (*at + k) % self.urls.len();
            let attempt = async {
                let conn = Connection::connect(
                    &self.urls[i],
                    ConnectionProperties::default().with_connection_name(self.name.clone().into()),
                )
                .await?;
                let ch = conn.create_channel().await?;
                ch.confirm_select(ConfirmSelectOptions::default()).await?;
                Ok::<_, lapin::Error>((conn, ch))
            };
            if let Ok(Ok(link)) = tokio::time::timeout(CONNECT_WAIT, attempt).await {
                *at = i;
                return Some(link);
            }
        }
        None
    }

    async fn run(self: Arc<Self>) {
        let per_tick = (RATE * TICK.as_millis() as usize / 1000).max(1);
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut link: Option<(Connection, Channel)> = None;
        let mut at = 0;
        let mut next = 0;
        while !(self.stop.load(Ordering::SeqCst) && next >= self.min) {
            ticker.tick().await;
            let ids: Vec<String> = (next..next + per_tick).map(id).collect();
            let began = Instant::now();
            let mut pending: Vec<&String> = ids.iter().collect();
            let mut first = true;
            while !pending.is_empty() {
                if !first {
                    self.retries.fetch_add(pending.len(), Ordering::SeqCst);
                }
                first = false;
                if link
                    .as_ref()
                    .is_none_or(|(c, ch)| !c.status().connected() || !ch.status().connected())
                {
                    if let Some((old, _)) = link.take() {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(2),
                            old.close(200, "OK".into()),
                        )
                        .await;
                    }
                    link = self.connect(&mut at).await;
                    self.reconnects.fetch_add(1, Ordering::SeqCst);
                }
                let Some((_, channel)) = link.as_ref() else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    first = true;
                    continue;
                };
                let mut failed = Vec::new();
                let mut confirms = Vec::new();
                for (i, id) in pending.iter().enumerate() {
                    let publish = channel.basic_publish(
                        "".into(),
                        self.inbound.as_str().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        id.as_bytes(),
                        BasicProperties::default()
                            .with_message_id(id.as_str().into())
                            .with_delivery_mode(2),
                    );
                    match tokio::time::timeout(PUBLISH_WAIT, publish).await {
                        Ok(Ok(confirm)) => confirms.push((*id, confirm)),
                        _ => {
                            failed.extend(pending[i..].iter().copied());
                            break;
                        }
                    }
                }
                for (id, confirm) in confirms {
                    match tokio::time::timeout(PUBLISH_WAIT, confirm).await {
                        Ok(Ok(Confirmation::Ack(None))) => {}
                        _ => failed.push(id),
                    }
                }
                if !failed.is_empty()
                    && let Some((conn, _)) = link.take()
                {
                    // A fresh channel, so no late confirm is taken for a new one.
                    let _ =
                        tokio::time::timeout(Duration::from_secs(2), conn.close(200, "OK".into()))
                            .await;
                }
                pending = failed;
            }
            next += per_tick;
            self.confirmed.store(next, Ordering::SeqCst);
            let took = began.elapsed();
            let mut longest = self.longest_batch.lock().unwrap_or_else(|e| e.into_inner());
            *longest = (*longest).max(took);
        }
        if let Some((conn, _)) = link {
            let _ =
                tokio::time::timeout(Duration::from_secs(2), conn.close(200, "OK".into())).await;
        }
    }
}

/// One sample of the destination queues: copies per branch so far.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    copies: [u32; 2],
}

/// Samples the depth of each branch's two queues every `SAMPLE_EVERY`
/// through the first node, from `order`, that answers.
struct Watch {
    addrs: Vec<SocketAddr>,
    queues: [[String; 2]; 2],
    started: Instant,
    samples: Mutex<Vec<Sample>>,
    failed_samples: AtomicUsize,
}

impl Watch {
    fn new(rig: &Rig, order: &[usize]) -> Arc<Watch> {
        let addrs = rig.cluster.amqp_addrs();
        let queues = BRANCHES.map(|(_, qs)| qs.map(|q| rig.queue(q)));
        Arc::new(Watch {
            addrs: order.iter().map(|&i| addrs[i]).collect(),
            queues,
            started: rig.started,
            samples: Mutex::new(Vec::new()),
            failed_samples: AtomicUsize::new(0),
        })
    }

    async fn run(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(SAMPLE_EVERY);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut raw: Option<RawClient> = None;
        let mut at = 0;
        loop {
            ticker.tick().await;
            if raw.is_none() {
                for k in 0..self.addrs.len() {
                    let i = (at + k) % self.addrs.len();
                    let connect = RawClient::connect(self.addrs[i], "/");
                    if let Ok(Ok(client)) =
                        tokio::time::timeout(Duration::from_secs(2), connect).await
                    {
                        raw = Some(client);
                        at = i;
                        break;
                    }
                }
            }
            let Some(client) = raw.as_mut() else {
                self.failed_samples.fetch_add(1, Ordering::SeqCst);
                continue;
            };
            let read = tokio::time::timeout(Duration::from_secs(2), async {
                let mut copies = [0u32; 2];
                for (b, queues) in self.queues.iter().enumerate() {
                    for queue in queues {
                        copies[b] += client.message_count(queue).await?;
                    }
                }
                Ok::<_, support::raw::RawError>(copies)
            })
            .await;
            match read {
                Ok(Ok(copies)) => {
                    self.samples
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Sample {
                            at: self.started.elapsed(),
                            copies,
                        })
                }
                _ => {
                    self.failed_samples.fetch_add(1, Ordering::SeqCst);
                    raw = None;
                    at = (at + 1) % self.addrs.len();
                }
            }
        }
    }

    /// The latest copies per branch.
    fn copies(&self) -> [u32; 2] {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last()
            .map_or([0, 0], |s| s.copies)
    }

    /// Waits (up to `bound`) until each branch has at least `n` copies more
    /// than `base`; how long it took, `None` if it did not.
    async fn wait_growth(&self, base: [u32; 2], n: u32, bound: Duration) -> Option<Duration> {
        let began = Instant::now();
        loop {
            let now = self.copies();
            if now[0] >= base[0] + n && now[1] >= base[1] + n {
                return Some(began.elapsed());
            }
            if began.elapsed() >= bound {
                return None;
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    }

    /// When branch `b`'s copies grew (sample times).
    fn growth_times(&self, b: usize) -> Vec<Duration> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let mut most = 0;
        let mut times = Vec::new();
        for s in samples.iter() {
            if s.copies[b] > most {
                most = s.copies[b];
                times.push(s.at);
            }
        }
        times
    }

    /// The longest stretch within `[from, to]` in which branch `b` got no new copy.
    fn longest_stall(&self, b: usize, from: Duration, to: Duration) -> Duration {
        let mut last = from;
        let mut longest = Duration::ZERO;
        for t in self.growth_times(b) {
            if t <= from {
                continue;
            }
            if t >= to {
                break;
            }
            longest = longest.max(t - last);
            last = t;
        }
        longest.max(to.saturating_sub(last))
    }
}

/// Stops publishing (once `feed.min` ids are out) and waits for the publisher.
async fn finish_feed(feed: &Feed, task: tokio::task::JoinHandle<()>) {
    feed.stop.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(120), task)
        .await
        .unwrap_or_else(|_| panic!("the publisher did not finish: {}", feed.summary()))
        .unwrap_or_else(|e| panic!("the publisher failed: {e}"));
}

/// A rolling restart: node by node, `stop_app`, five seconds down,
/// `start_app`, until it is back in the cluster with its quorum members
/// caught up, while ~3000 messages flow. Every id reaches both branches,
/// none is dead-lettered, and while a node is down neither branch goes more
/// than `MAX_STALL` without a new copy.
async fn a_rolling_restart_of_every_node_loses_and_dead_letters_nothing(
    cluster: PrivateCluster,
) -> PrivateCluster {
    let mut rig = Rig::start("cluster-rolling", cluster).await;
    let watch = Watch::new(&rig, &[0, 1, 2]);
    let watcher = tokio::spawn(watch.clone().run());
    let feed = Feed::new(&rig, &[0, 1, 2], ROLLING_MESSAGES);
    let publisher = tokio::spawn(feed.clone().run());
    let flowing = rig
        .grown(&watch, [0, 0], 100, Duration::from_secs(60))
        .await;
    rig.note(format!(
        "copies flowing ({:.1}s after the publisher started)",
        flowing.as_secs_f64()
    ));
    let (consume, publish) = rig.nodes_in_use().await;
    rig.note(format!(
        "forwarder on consume {consume:?}, publish {publish:?}"
    ));

    let queues = rig.all_queues();
    let mut windows = Vec::new();
    for i in 0..NODES {
        let name = rig.cluster.node(i).node_name().to_owned();
        let down = rig.since();
        rig.note(format!("node {i} ({name}): stop_app"));
        rig.cluster.node(i).stop_app().await;
        rig.note(format!(
            "node {i}: app stopped; {:?} copies",
            watch.copies()
        ));
        if i == 0 {
            // The forwarder starts on its preferred node: both roles move off it.
            let n0 = rig.label(0);
            let (took, consume, publish, _) = rig
                .wait_roles("both roles leave node 0", DOWN_FOR, |n| n != n0)
                .await;
            rig.note(format!(
                "gauge: consume on {consume}, publish on {publish}, {:.1}s after stop_app",
                took.as_secs_f64()
            ));
        }
        // The fault itself: the node stays down this long.
        tokio::time::sleep(DOWN_FOR).await;
        let (consume, publish) = rig.nodes_in_use().await;
        rig.note(format!(
            "node {i}: start_app (forwarder on consume {consume:?}, publish {publish:?})"
        ));
        rig.cluster.node(i).start_app().await;
        rig.cluster.await_all_running(i).await;
        rig.cluster.await_all_running((i + 1) % NODES).await;
        let back = rig.since();
        rig.note(format!(
            "node {i}: back in the cluster after {:.1}s down; {:?} copies",
            (back - down).as_secs_f64(),
            watch.copies()
        ));
        windows.push((i, down, back));
        rig.cluster
            .await_quorum_online(&queues, (i + 1) % NODES)
            .await;
        rig.note(format!("node {i}: quorum members online"));
    }
    let n0 = rig.label(0);
    let (took, consume, publish, _) = rig
        .wait_roles("both roles are back on node 0", RETURN_BOUND, |n| n == n0)
        .await;
    rig.note(format!(
        "rolling restart done; gauge: consume on {consume}, publish on {publish} (the preferred \
         node, {:.1}s after the roll)",
        took.as_secs_f64()
    ));

    finish_feed(&feed, publisher).await;
    let published = feed.confirmed();
    let publishing_ended = rig.since();
    rig.note(feed.summary());
    rig.settle().await;
    rig.note("inbound queue empty, nothing unacked");
    watcher.abort();

    // Stalls: the longest stretch without a new copy, per branch, while a
    // node was down (stop_app to back in the cluster), and over the whole run.
    let mut stall_report = String::new();
    let mut problems = Vec::new();
    let first_copy = watch.growth_times(0).first().copied().unwrap_or_default();
    for (b, (branch, _)) in BRANCHES.iter().enumerate() {
        for &(i, from, to) in &windows {
            let stall = watch.longest_stall(b, from, to);
            let _ = writeln!(
                stall_report,
                "{branch}: node {i} down {:.1}s-{:.1}s, longest stall {:.1}s",
                from.as_secs_f64(),
                to.as_secs_f64(),
                stall.as_secs_f64()
            );
            if stall > MAX_STALL {
                problems.push(format!(
                    "{branch} got no new copy for {:.1}s while node {i} was down",
                    stall.as_secs_f64()
                ));
            }
        }
        let overall = watch.longest_stall(b, first_copy, publishing_ended);
        let _ = writeln!(
            stall_report,
            "{branch}: longest stall over the whole run {:.1}s",
            overall.as_secs_f64()
        );
    }
    let _ = writeln!(
        stall_report,
        "watcher: {} samples, {} failed",
        watch
            .samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len(),
        watch.failed_samples.load(Ordering::SeqCst)
    );

    let exit = rig.stop_forwarder().await;
    rig.note(format!("forwarder stopped, exit code {exit:?}"));
    let accounting = rig.account(published).await;
    let (counts, found) = accounting.report();
    problems.extend(found);
    if exit != Some(0) {
        problems.push(format!("the forwarder exited with {exit:?} on SIGTERM"));
    }
    let full = format!(
        "{}{}\n{stall_report}{counts}problems: {}\n",
        rig.timeline(),
        feed.summary(),
        if problems.is_empty() {
            "none".to_owned()
        } else {
            format!("\n  - {}", problems.join("\n  - "))
        }
    );
    println!("{full}{}", rig.log_excerpt());
    if !problems.is_empty() {
        panic!("{full}{}", rig.log_excerpt());
    }
    rig.finish().await
}

/// The preferred node (n0 of `uris = [n0, n1, n2]`) SIGKILLed while
/// messages flow: both connections move to another node and copies keep
/// arriving; the node booted again, both connections are back on it
/// within `RETURN_BOUND` (the gauge, and the broker's connection list),
/// the old ones closed; traffic flows through it, and every message is
/// accounted for: none lost, none dead-lettered.
///
/// Seen on RabbitMQ 3.10.8: a channel whose first publishes to a quorum
/// queue come before the queue has elected a leader in place of the killed
/// one may have every publish to that queue nacked for as long as it lives.
/// The forwarder takes nacks just after a node change for an election
/// (retried on the same endpoint after a pause, on a fresh channel): with
/// that undone, both endpoints of a branch refuse and its messages are
/// dead-lettered, and this test fails naming the dead letters.
async fn the_preferred_node_killed_hard_then_back_carries_traffic_again(
    cluster: PrivateCluster,
) -> PrivateCluster {
    let mut rig = Rig::start("cluster-kill", cluster).await;
    let n0 = rig.label(0);
    let n0_port = rig.cluster.node(0).amqp_addr().port();
    let (took, consume, publish, _) = rig
        .wait_roles("both roles use n0", Duration::from_secs(20), |n| n == n0)
        .await;
    rig.note(format!(
        "metrics: consume on {consume}, publish on {publish} (n0 = {n0}, after {:.1}s)",
        took.as_secs_f64()
    ));
    let on_n0 = rig.forwarder_connections(1).await;
    rig.note(format!(
        "broker lists forwarder connections (role, port): {on_n0:?}"
    ));
    for role in ["consume", "publish"] {
        assert!(
            on_n0.iter().any(|(r, port)| r == role && *port == n0_port),
            "a {role} connection on n0 (port {n0_port}): {on_n0:?}"
        );
    }

    // The test's own clients prefer n1, so the kill is the forwarder's alone to handle.
    let watch = Watch::new(&rig, &[1, 2, 0]);
    let watcher = tokio::spawn(watch.clone().run());
    let feed = Feed::new(&rig, &[1, 2, 0], 0);
    let publisher = tokio::spawn(feed.clone().run());
    rig.grown(&watch, [0, 0], 100, Duration::from_secs(60))
        .await;
    rig.note(format!("copies flowing: {:?}", watch.copies()));

    let killed_at = rig.since();
    rig.cluster.kill_node(0).await;
    let at_kill = watch.copies();
    rig.note(format!("n0 SIGKILLed; {at_kill:?} copies"));
    let (took, consume, publish, seen) = rig
        .wait_roles("both roles use another node", FAILOVER_BOUND, |n| n != n0)
        .await;
    rig.note(format!(
        "metrics: consume on {consume}, publish on {publish}, {:.1}s after the kill \
         (gauge: {seen})",
        took.as_secs_f64()
    ));
    let took = rig.grown(&watch, at_kill, 200, FAILOVER_BOUND).await;
    rig.note(format!(
        "traffic continues without n0: {:?} copies ({:.1}s to grow by 200)",
        watch.copies(),
        took.as_secs_f64()
    ));

    rig.cluster.restart_killed(0).await;
    let back_at = rig.since();
    rig.note(format!(
        "n0 booted again and back in the cluster ({:.1}s after the kill); {:?} copies",
        (back_at - killed_at).as_secs_f64(),
        watch.copies()
    ));
    let (took, consume, publish, seen) = rig
        .wait_roles("both roles are back on n0", RETURN_BOUND, |n| n == n0)
        .await;
    let returned_at = rig.since();
    rig.note(format!(
        "metrics: consume on {consume}, publish on {publish}: back on n0 {:.1}s after it was \
         (gauge: {seen})",
        took.as_secs_f64()
    ));
    let connections = rig.forwarder_connections(1).await;
    rig.note(format!(
        "broker lists forwarder connections (role, port): {connections:?}"
    ));
    for role in ["consume", "publish"] {
        assert!(
            connections
                .iter()
                .any(|(r, port)| r == role && *port == n0_port),
            "the broker lists a {role} connection of the forwarder on n0 (port {n0_port}): \
             {connections:?}\n{}",
            rig.timeline()
        );
    }
    let at_return = watch.copies();
    let took = rig.grown(&watch, at_return, 200, FAILOVER_BOUND).await;
    rig.note(format!(
        "traffic flows after the return: {:?} copies ({:.1}s to grow by 200)",
        watch.copies(),
        took.as_secs_f64()
    ));

    // The connections to the other node are closed once their work is done.
    let began = Instant::now();
    let old_closed = loop {
        let listed = rig.forwarder_connections(1).await;
        if listed.iter().all(|(_, port)| *port == n0_port) {
            break Some(began.elapsed());
        }
        if began.elapsed() >= OLD_CLOSED_BOUND {
            rig.note(format!("old connections still listed: {listed:?}"));
            break None;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    rig.note(match old_closed {
        Some(t) => format!(
            "only n0 connections left, {:.1}s after the return was seen",
            t.as_secs_f64()
        ),
        None => format!("old connections NOT closed within {OLD_CLOSED_BOUND:?}"),
    });

    finish_feed(&feed, publisher).await;
    let published = feed.confirmed();
    let publishing_ended = rig.since();
    rig.note(feed.summary());
    rig.settle().await;
    rig.note("inbound queue empty, nothing unacked");
    watcher.abort();

    let mut stall_report = String::new();
    for (b, (branch, _)) in BRANCHES.iter().enumerate() {
        let _ = writeln!(
            stall_report,
            "{branch}: longest stall while n0 was down {:.1}s, from its return to the end {:.1}s",
            watch.longest_stall(b, killed_at, back_at).as_secs_f64(),
            watch
                .longest_stall(b, returned_at, publishing_ended)
                .as_secs_f64()
        );
    }
    let exit = rig.stop_forwarder().await;
    rig.note(format!("forwarder stopped, exit code {exit:?}"));
    let accounting = rig.account(published).await;
    let (counts, mut problems) = accounting.report();
    if exit != Some(0) {
        problems.push(format!("the forwarder exited with {exit:?} on SIGTERM"));
    }
    if old_closed.is_none() {
        problems.push(format!(
            "the forwarder's connections to the other node were not closed within \
             {OLD_CLOSED_BOUND:?} of the return"
        ));
    }
    let full = format!(
        "{}{}\n{stall_report}{counts}problems: {}\n",
        rig.timeline(),
        feed.summary(),
        if problems.is_empty() {
            "none".to_owned()
        } else {
            format!("\n  - {}", problems.join("\n  - "))
        }
    );
    println!("{full}{}", rig.log_excerpt());
    if !problems.is_empty() {
        panic!("{full}{}", rig.log_excerpt());
    }
    rig.finish().await
}

impl Rig {
    /// Stops the forwarder (if still running; its files are removed, the
    /// run went well), deletes the test's queues and hands the cluster
    /// back, every node running, for the next test.
    async fn finish(self) -> PrivateCluster {
        let queues = self.all_queues();
        let Rig {
            cluster, forwarder, ..
        } = self;
        drop(forwarder);
        let broker =
            TestBroker::connect_to(&cluster.node(0).amqp_url(), "sy-cluster-cleanup").await;
        for queue in &queues {
            broker.delete_queue(queue).await;
        }
        broker.close().await;
        cluster
    }
}

/// Both tests on one cluster, one after the other: each measures how long
/// traffic stalls on three nodes that already fill a small machine, so
/// they never run side by side, and booting the cluster once saves the
/// second boot (about 25 s). Each has its own queues and forwarder, and
/// leaves every node running with its queues deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_then_the_preferred_node_killed_hard_on_one_cluster() {
    let cluster = PrivateCluster::start(NODES).await;
    let cluster = a_rolling_restart_of_every_node_loses_and_dead_letters_nothing(cluster).await;
    let cluster = the_preferred_node_killed_hard_then_back_carries_traffic_again(cluster).await;
    cluster.stop().await;
}
