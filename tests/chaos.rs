//! The acceptance test of fault handling, in three runs that share every
//! part but the broker and the faults.
//!
//! `chaos_loses_nothing_under_faults`: 20,000 messages through the seed
//! scenario (branches service and logging, each with one backup) with the
//! real binary on a private node, while at random moments (a seeded RNG)
//! the forwarder is SIGKILLed and restarted, its connections are closed, the
//! primary service queue refuses publishes for a while (once with the
//! backup's connection closed inside that window, see `refuse+close`
//! below), the broker app
//! restarts, a memory alarm blocks publishers for longer than a confirm
//! timeout, and poison messages ride along (a header table 3,000 levels
//! deep, a content header a few bytes under frame_max). At the end every
//! message is in a service queue and in a logging queue, none lost, none
//! dead-lettered, duplicates counted, and every duplicate carries the copy
//! id (`x-switchyard-copy-id`) of its message's first copy on that branch;
//! each poison message is dead-lettered
//! or forwarded intact. A one-screen report is printed, and is the failure
//! message.
//!
//! `chaos_on_a_cluster_loses_nothing`: 6,000 messages through the same
//! scenario on a private three-node cluster, every queue (inbound,
//! destinations, dead letters) a quorum queue replicated on the three
//! nodes and the forwarder's broker given as `uris = [n0, n1, n2]`, with
//! the kills, closes, refusals and poison messages above and node
//! faults (`node`): a node's app stopped for a few seconds, then started
//! and waited for until it is back in the cluster with every quorum
//! member online. The first node fault stops the node the forwarder's
//! connections use (by its `switchyard_broker_node` gauge: n0, the
//! preferred one, unless they have moved), a later one that node or a
//! random one. At least two node faults must land while messages flow
//! (the publisher not done, messages waiting); a node fault due goes
//! before the other faults due. The same accounting applies: none lost,
//! none dead-lettered. Left to the single node:
//! - the alarm: an alarm on one node blocks publishers on every node, the
//!   same fault with more setup;
//! - the broker-wide restart: every node stopped at once loses the quorum
//!   queues' majority, a cluster outage of its own rather than a fault the
//!   forwarder handles otherwise than one node's restart.
//!
//! On the cluster the big poison, once delivered again, cannot be read at
//! all: the quorum queue adds `x-delivery-count`, which takes its content
//! header past `frame_max`, and only the queue's delivery limit (the one
//! switchyard creates it with) dead-letters it, while the forwarder takes
//! one message at a time so that the messages behind it do not come back
//! with it (`quorum_big_header.rs` shows it on its own).
//!
//! `chaos_of_refusals_overlapping_closes_dead_letters_nothing`: 8,000
//! messages on a private node with a kill, a close, a refusal and three
//! `refuse+close` faults, the first before any other fault. With the two
//! runs above, every run of the suite takes three schedules (three seeds),
//! each with a refusal window overlapping a connection close, and each
//! must land at least one on copies in flight (a problem otherwise).
//!
//! How the faults are made:
//! - The publisher is the test's own connection; only confirmed publishes
//!   count as sent, and what is not confirmed (a restart, an alarm that
//!   outlasts the wait) is published again: duplicates, never gaps.
//! - The refusal is a policy `max-length = 0, overflow = reject-publish` on
//!   the primary service queue, which nacks every publish and keeps what
//!   the queue holds: a standing policy puts the queue in reject-publish
//!   mode from the start, because applying a max-length to a queue still in
//!   the default drop-head mode would drop its head, a loss the test itself
//!   would cause.
//! - `refuse+close`: the refusal above, and, once copies fail over to the
//!   backup, the proxy the backup is published through (on one node)
//!   holds what the forwarder sends until some is held, the backup's
//!   publishing connection is closed (`rabbitmqctl close_connection`) and
//!   the proxy resumes: copies the primary refused are cut on their way to
//!   the backup, and must be held, never dead-lettered. On the cluster
//!   (no proxy) the publishing connection is closed on a backlog instead.
//! - A broker-side fault (close, restart, alarm) takes a second or more to
//!   apply through `rabbitmqctl`, longer than the forwarder needs for a
//!   burst, so the forwarder is paused (SIGSTOP) until a backlog waits,
//!   the fault is applied and the forwarder resumed (SIGCONT): the fault
//!   lands on a full prefetch window.
//! - Poison messages are published and read back with the raw AMQP client
//!   (a client library may overflow its stack decoding the deep table);
//!   their ids start with `poison-` and they carry `chaos-poison = true`.
//! - A node fault on the node the forwarder uses pauses it for a backlog
//!   too, so the node is lost under a full window; on another node it
//!   waits for traffic instead, so the quorum queues lose a member under
//!   publishes in flight. The test's own clients (publisher, readers,
//!   `rabbitmqctl`) prefer n1 and skip the node that is down.
//! - The forwarder is restarted when it exits on its own (counted as a
//!   failure), up to five times.
//!
//! The two runs go side by side, and beside `tests/cluster.rs` in the
//! same test binary (`tests/slow/main.rs`): waiting on their publishers'
//! pace and on the brokers, the three keep two cores about half busy.
//! `CHAOS_SEED` replays a run (the seed is printed), `CHAOS_MESSAGES`
//! sets its size, `CHAOS_FAULTS` (comma list of kill, close, refuse,
//! restart, alarm, poison, node; default all a run takes; `none` for none;
//! `refuse+close` comes with refuse and close together)
//! picks the faults: restart and alarm are the single node's only, node
//! the cluster's only, and a run leaves out those it does not take.

use crate::support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use support::cluster::PrivateCluster;
use support::config::{Endpoint, Forwarder};
use support::harness::{Process, seed_toml, top_toml_at};
use support::raw::{RawClient, RawConfirm, RawMessage, RawProperties, encode};
use support::{FaultProxy, Metrics, PrivateNode, free_admin_addr, http_get, unique_prefix};
use tokio::task::AbortHandle;
use tokio::time::Instant;

const FAULTS: [&str; 7] = [
    "kill", "close", "refuse", "restart", "alarm", "poison", "node",
];
/// The nodes of the cluster run.
const CLUSTER_NODES: usize = 3;
/// Node faults the cluster run plans, of which at least
/// `MIN_NODE_FAULTS_FLOWING` must land while messages flow.
const NODE_FAULTS: usize = 2;
const MIN_NODE_FAULTS_FLOWING: usize = 2;
/// The gauge that says which node each of the forwarder's connections uses.
const NODE_GAUGE: &str = "switchyard_broker_node";
/// How long a close waits for a forwarder just restarted to consume.
const CONSUMING_WAIT: Duration = Duration::from_secs(15);
/// How long a node fault waits for the gauge to name a node.
const GAUGE_WAIT: Duration = Duration::from_secs(15);
/// A connection attempt of the test's own clients to one node.
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// Top-level header that marks a poison message (its id starts with "poison-").
const POISON_HEADER: &str = "chaos-poison";
const DEEP_LEVELS: usize = 3000;
/// How close (wire bytes) the big poison's content header comes to frame_max.
const BIG_HEADER_MARGIN: usize = 24;
/// A kill or a refusal waits up to this long for a burst to be in
/// progress, so that it hits transactions in flight.
const TRAFFIC_WAIT: Duration = Duration::from_secs(4);
/// A broker-side fault (close, restart, alarm) takes a second or two to
/// apply, longer than the forwarder needs for a burst; the forwarder is
/// paused (SIGSTOP) until `Pace::backlog` messages wait (or this long), so
/// the fault lands on a full window and a backlog.
const BACKLOG_WAIT: Duration = Duration::from_secs(8);
/// A publish (or its confirm) that takes longer is retried: an alarm lasts
/// a few seconds and a blocked publish simply waits it out.
const PUBLISH_WAIT: Duration = Duration::from_secs(60);
/// The queues the branches publish to (suffixes of the run's prefix).
const DESTINATIONS: [&str; 4] = ["service", "service.backup", "logging", "logging.backup"];
/// Forwarder exits not caused by the test before it stops restarting it.
const MAX_UNEXPECTED_EXITS: usize = 5;

/// Where a run happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// One private node, classic queues.
    Node,
    /// A private cluster of `CLUSTER_NODES`, every queue a quorum queue.
    Cluster,
    /// One private node, classic queues, a shorter run whose faults are
    /// kills, closes and refusals, most of them a refusal overlapping a
    /// close: a third schedule in every run of the suite.
    Overlap,
}

impl Setup {
    /// The faults a run takes.
    fn faults(self) -> &'static [&'static str] {
        match self {
            Setup::Node => &["kill", "close", "refuse", "restart", "alarm", "poison"],
            Setup::Cluster => &["kill", "close", "refuse", "poison", "node"],
            Setup::Overlap => &["kill", "close", "refuse"],
        }
    }

    /// How many kills, closes and refusals a run plans.
    fn counts(self) -> (usize, usize, usize) {
        match self {
            Setup::Node | Setup::Cluster => (3, 3, 2),
            Setup::Overlap => (1, 1, 1),
        }
    }

    /// How many refusals overlapping a close a run plans.
    fn overlaps(self) -> usize {
        match self {
            Setup::Node | Setup::Cluster => 1,
            Setup::Overlap => 3,
        }
    }

    /// The poison messages a run publishes: on both, two deep and two big.
    fn poison_kinds(self) -> &'static [Poison] {
        &[Poison::Deep, Poison::Big, Poison::Deep, Poison::Big]
    }

    fn pace(self) -> Pace {
        match self {
            Setup::Node => Pace {
                messages: 20_000,
                rate: 330,
                span: (10, 60),
                burst: 1000,
                backlog: 1000,
                bound: Duration::from_secs(360),
            },
            // A node fault takes 15 to 25 s (a stop, a few seconds down,
            // a start, the cluster and the quorum members back), and every
            // rabbitmqctl of the others a second or two: a longer span, so
            // the faults fall while messages flow, in smaller bursts (still
            // more than the prefetch window, so that messages wait) every
            // five seconds or so.
            Setup::Cluster => Pace {
                messages: 6_000,
                rate: 60,
                span: (90, 100),
                burst: 300,
                backlog: 200,
                bound: Duration::from_secs(300),
            },
            // Long enough for its faults to land while messages flow.
            Setup::Overlap => Pace {
                messages: 8_000,
                rate: 130,
                span: (55, 65),
                burst: 600,
                backlog: 400,
                bound: Duration::from_secs(300),
            },
        }
    }
}

/// How a run publishes, and how long it may take.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// Messages when `CHAOS_MESSAGES` does not say.
    messages: usize,
    /// Publishing is paced at about this many messages a second on
    /// average, so the faults fall while messages flow: the span is
    /// messages / rate seconds, within `span`. It goes in bursts of
    /// `burst`, each a backlog that fills the forwarder's prefetch window
    /// for a while.
    rate: usize,
    span: (u64, u64),
    burst: usize,
    /// The backlog a paused forwarder waits for (see `BACKLOG_WAIT`).
    backlog: u32,
    /// The whole test fails, with its report, past this.
    bound: Duration,
}

struct Settings {
    setup: Setup,
    seed: u64,
    messages: usize,
    faults: BTreeSet<String>,
    /// Faults `CHAOS_FAULTS` names that this run does not take.
    left_out: BTreeSet<String>,
}

impl Settings {
    fn from_env(setup: Setup) -> Settings {
        let seed = std::env::var("CHAOS_SEED")
            .ok()
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("CHAOS_SEED={s}: {e}"))
            })
            .unwrap_or_else(|| fastrand::u64(..));
        let messages = std::env::var("CHAOS_MESSAGES")
            .ok()
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("CHAOS_MESSAGES={s}: {e}"))
            })
            .unwrap_or(setup.pace().messages);
        let named: BTreeSet<String> = match std::env::var("CHAOS_FAULTS") {
            Ok(list) if list.trim() == "none" => BTreeSet::new(),
            Ok(list) if !list.trim().is_empty() => list
                .split(',')
                .map(|f| f.trim().to_lowercase())
                .filter(|f| !f.is_empty())
                .inspect(|f| {
                    assert!(
                        FAULTS.contains(&f.as_str()),
                        "CHAOS_FAULTS: unknown fault {f:?}; known: {FAULTS:?}"
                    )
                })
                .collect(),
            _ => setup.faults().iter().map(|f| f.to_string()).collect(),
        };
        let (faults, left_out) = named
            .into_iter()
            .partition(|f| setup.faults().contains(&f.as_str()));
        Settings {
            setup,
            seed,
            messages,
            faults,
            left_out,
        }
    }

    fn has(&self, fault: &str) -> bool {
        self.faults.contains(fault)
    }
}

/// One fault the scheduler injects.
#[derive(Debug, Clone)]
enum Fault {
    Kill {
        down: Duration,
    },
    Close,
    Refuse {
        hold: Duration,
    },
    /// The primary refuses for `hold`, and the publishing connection is
    /// closed within that window: copies the primary refused and whose
    /// publish to the backup the close cut must be held, not dead-lettered.
    RefuseAndClose {
        hold: Duration,
    },
    Restart,
    Alarm {
        hold: Duration,
    },
    Poison {
        id: String,
        kind: Poison,
    },
    Node {
        down: Duration,
        target: Target,
    },
}

/// The node a node fault stops.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The one the forwarder's connections use (the preferred n0 unless
    /// they have moved).
    InUse,
    /// Node `i`, whether the forwarder uses it or not.
    Random(usize),
}

/// A node fault as it landed.
#[derive(Debug, Clone)]
struct NodeFault {
    node: usize,
    /// The forwarder had a connection on it.
    used: bool,
    /// Messages waited in the inbound queue and the publisher was not done.
    flowing: bool,
}

/// The broker nodes of a run.
enum Brokers {
    Node(PrivateNode),
    Cluster(PrivateCluster),
}

impl Brokers {
    /// Every node, n0 first.
    fn nodes(&self) -> &[PrivateNode] {
        match self {
            Brokers::Node(node) => std::slice::from_ref(node),
            Brokers::Cluster(cluster) => cluster.nodes(),
        }
    }

    async fn stop(self) {
        match self {
            Brokers::Node(node) => node.stop().await,
            Brokers::Cluster(cluster) => cluster.stop().await,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Poison {
    Deep,
    Big,
}

/// A poison message as published, to check what comes back against.
#[derive(Debug, Clone)]
struct PoisonSent {
    id: String,
    kind: Poison,
    /// The key and encoded value of the header that makes it poison.
    header: (String, Vec<u8>),
    body: Vec<u8>,
    confirmed: bool,
}

/// Everything the run shares between its tasks and the report.
struct Chaos {
    p: String,
    brokers: Brokers,
    /// The forwarder's admin endpoint (on a cluster, for the node it uses).
    admin: Option<SocketAddr>,
    pace: Pace,
    /// The node whose app a node fault has stopped, until it is back.
    down: Mutex<Option<usize>>,
    toml: String,
    started: Instant,
    forwarder: tokio::sync::Mutex<Option<Process>>,
    timeline: Mutex<Vec<String>>,
    phase: Mutex<String>,
    kills: AtomicUsize,
    unexpected_exits: AtomicUsize,
    confirmed: AtomicUsize,
    publish_retries: AtomicUsize,
    poison: Mutex<Vec<PoisonSent>>,
    log_paths: Mutex<Vec<std::path::PathBuf>>,
    /// Until the publisher has every id confirmed.
    publishing: std::sync::atomic::AtomicBool,
    /// Faults applied, by kind.
    applied: Mutex<BTreeMap<&'static str, usize>>,
    node_faults: Mutex<Vec<NodeFault>>,
    /// Refusals overlapping a close that closed a publishing connection
    /// with copies on their way to the backup (on a cluster: on a backlog
    /// of waiting messages).
    overlaps: AtomicUsize,
    /// The proxy the service backup is published through (one node).
    backup: Option<FaultProxy>,
}

impl Chaos {
    fn queue(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.p)
    }

    fn at(&self) -> String {
        format!("+{:6.1}s", self.started.elapsed().as_secs_f64())
    }

    fn note(&self, text: impl AsRef<str>) {
        let line = format!("{} {}", self.at(), text.as_ref());
        println!("chaos: {line}");
        self.timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
    }

    fn set_phase(&self, phase: &str) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = phase.to_string();
    }

    fn applied(&self, kind: &'static str) {
        *self
            .applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_insert(0) += 1;
    }

    /// The six queues of the run.
    fn all_queues(&self) -> Vec<String> {
        ["in", "dlq"]
            .into_iter()
            .chain(DESTINATIONS)
            .map(|suffix| self.queue(suffix))
            .collect()
    }

    /// The nodes the test's own clients use, in order: n1 first on a
    /// cluster (n0 is the forwarder's preferred node), without the one
    /// that is down.
    fn client_order(&self) -> Vec<usize> {
        let n = self.brokers.nodes().len();
        let down = *self.down.lock().unwrap_or_else(|e| e.into_inner());
        (1..=n)
            .map(|k| k % n)
            .filter(|&i| Some(i) != down)
            .collect()
    }

    /// The node `rabbitmqctl` asks: the first of [`Self::client_order`].
    fn ctl(&self) -> &PrivateNode {
        let i = self.client_order().first().copied().unwrap_or(0);
        &self.brokers.nodes()[i]
    }

    /// A raw client on the first node of [`Self::client_order`] that answers.
    async fn raw(&self) -> Option<RawClient> {
        for i in self.client_order() {
            let addr = self.brokers.nodes()[i].amqp_addr();
            if let Ok(Ok(raw)) =
                tokio::time::timeout(CONNECT_WAIT, RawClient::connect(addr, "/")).await
            {
                return Some(raw);
            }
        }
        None
    }

    /// The nodes the forwarder's connections use now, by its
    /// `switchyard_broker_node` gauge: the publishing connection's first,
    /// then the consumer's (a connection left on another node after a
    /// return, closing once its work is done, is not counted). A forwarder
    /// just restarted is given `GAUGE_WAIT` to connect; empty if it has not.
    async fn forwarder_nodes(&self) -> Vec<usize> {
        let deadline = Instant::now() + GAUGE_WAIT;
        loop {
            let used = self.forwarder_nodes_now().await;
            if !used.is_empty() || Instant::now() >= deadline {
                return used;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// [`Self::forwarder_nodes`] as the gauge says now.
    async fn forwarder_nodes_now(&self) -> Vec<usize> {
        let Some(admin) = self.admin else {
            return vec![0];
        };
        let Ok(Ok(response)) =
            tokio::time::timeout(Duration::from_secs(5), http_get(admin, "/metrics")).await
        else {
            return Vec::new();
        };
        let metrics = Metrics::parse(&response.body);
        let mut used = Vec::new();
        for role in ["publish", "consume"] {
            for (i, node) in self.brokers.nodes().iter().enumerate() {
                let label = node.amqp_addr().to_string();
                let labels = [("broker", "main"), ("role", role), ("node", &label)];
                if metrics.get(NODE_GAUGE, &labels) == Some(1.0) && !used.contains(&i) {
                    used.push(i);
                }
            }
        }
        used
    }

    /// Starts the forwarder; its log and configuration are kept until the
    /// end, and removed there only when the run went well.
    fn spawn_forwarder(&self) -> Process {
        let mut process = Process::spawn(&self.p, &self.toml);
        process.keep_files();
        let mut paths = self.log_paths.lock().unwrap_or_else(|e| e.into_inner());
        paths.push(process.log_path.clone());
        paths.extend(process.config_path().map(|p| p.to_path_buf()));
        process
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_loses_nothing_under_faults() {
    chaos_run(Setup::Node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_a_cluster_loses_nothing() {
    chaos_run(Setup::Cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_of_refusals_overlapping_closes_dead_letters_nothing() {
    chaos_run(Setup::Overlap).await;
}

/// The forwarder's configuration: the seed scenario in `nack` mode with
/// prefetch 200; on a cluster, broker `main` as `uris`, every queue a
/// quorum queue (the destinations declared by the test) and an admin
/// endpoint at `admin`.
fn forwarder_toml(
    p: &str,
    brokers: &Brokers,
    admin: Option<SocketAddr>,
    backup: Option<&FaultProxy>,
) -> String {
    match brokers {
        Brokers::Node(node) => match backup {
            // The service backup's broker is the node through `backup`.
            Some(proxy) => Forwarder::at(&node.amqp_url(), p)
                .broker("backup", &proxy.amqp_url())
                .mode("nack")
                .top("shutdown_timeout_ms", 5000)
                .inbound("prefetch", 200)
                .seed_with(p, |e| {
                    if e.name() == "service_backup" {
                        e.on("backup")
                    } else {
                        e
                    }
                })
                .toml(),
            None => seed_toml(p, &top_toml_at(&node.amqp_url(), p, "nack", 5000, 200)),
        },
        Brokers::Cluster(cluster) => {
            let urls = cluster.amqp_urls();
            let mut forwarder = Forwarder::at(&urls[0], p)
                .broker_nodes("main", &urls)
                .mode("nack")
                .top("shutdown_timeout_ms", 5000)
                .inbound("prefetch", 200)
                .inbound("queue_type", "quorum")
                .dead_letter("queue_type", "quorum")
                .seed_with(p, Endpoint::undeclared);
            if let Some(admin) = admin {
                forwarder = forwarder.admin(&admin.to_string());
            }
            forwarder.toml()
        }
    }
}

/// One whole run on `setup`: brokers up, faults while publishing,
/// accounting, report; panics with the report when anything is wrong.
async fn chaos_run(setup: Setup) {
    let settings = Settings::from_env(setup);
    let pace = setup.pace();
    println!(
        "chaos: {setup:?} run, seed {} (CHAOS_SEED={} replays it), {} messages, faults {:?}{}",
        settings.seed,
        settings.seed,
        settings.messages,
        settings.faults,
        if settings.left_out.is_empty() {
            String::new()
        } else {
            format!(" ({:?} left out: not in this run)", settings.left_out)
        }
    );
    let started = Instant::now();
    let brokers = match setup {
        Setup::Node | Setup::Overlap => Brokers::Node(PrivateNode::start().await),
        Setup::Cluster => Brokers::Cluster(PrivateCluster::start(CLUSTER_NODES).await),
    };
    let node_start = started.elapsed();
    let p = unique_prefix("chaos");
    let admin = (setup == Setup::Cluster).then(free_admin_addr);
    // On one node, the service backup is published to through a proxy, so
    // that a refusal overlapping a close can hold what the forwarder sends
    // to it while the close comes.
    let backup = match &brokers {
        Brokers::Node(node) => Some(FaultProxy::start(node.amqp_addr()).await),
        Brokers::Cluster(_) => None,
    };
    let toml = forwarder_toml(&p, &brokers, admin, backup.as_ref());
    let chaos = Arc::new(Chaos {
        p,
        brokers,
        admin,
        pace,
        down: Mutex::new(None),
        toml,
        started,
        forwarder: tokio::sync::Mutex::new(None),
        timeline: Mutex::new(Vec::new()),
        phase: Mutex::new("starting".into()),
        kills: AtomicUsize::new(0),
        unexpected_exits: AtomicUsize::new(0),
        confirmed: AtomicUsize::new(0),
        publish_retries: AtomicUsize::new(0),
        poison: Mutex::new(Vec::new()),
        log_paths: Mutex::new(Vec::new()),
        publishing: std::sync::atomic::AtomicBool::new(false),
        applied: Mutex::new(BTreeMap::new()),
        node_faults: Mutex::new(Vec::new()),
        overlaps: AtomicUsize::new(0),
        backup,
    });
    let names: Vec<String> = chaos
        .brokers
        .nodes()
        .iter()
        .enumerate()
        .map(|(i, n)| format!("n{i} {} on {}", n.node_name(), n.amqp_addr()))
        .collect();
    chaos.note(format!(
        "private {} {} up in {:.1}s",
        if names.len() == 1 { "node" } else { "cluster" },
        names.join(", "),
        node_start.as_secs_f64()
    ));

    let mut tasks = Vec::new();
    let outcome = tokio::time::timeout(
        pace.bound.saturating_sub(started.elapsed()),
        run(chaos.clone(), &settings, &mut tasks),
    )
    .await;
    for task in &tasks {
        task.abort();
    }
    let run_problem = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(format!(
            "bound of {:?} exceeded during: {}",
            pace.bound,
            chaos.phase.lock().unwrap_or_else(|e| e.into_inner())
        )),
    };
    if let Some(problem) = &run_problem {
        chaos.note(format!("run ended early: {problem}"));
    }
    let settled_at = started.elapsed();

    // Whatever happened, leave the node clean and the forwarder stopped.
    chaos.set_phase("stopping");
    let cleanup = {
        let chaos = chaos.clone();
        let (alarm, refuse) = (settings.has("alarm"), settings.has("refuse"));
        tokio::spawn(async move {
            if alarm {
                chaos.ctl().set_memory_alarm(false).await;
            }
            if refuse {
                chaos
                    .ctl()
                    .refuse_publishes(&chaos.queue("service"), false)
                    .await;
            }
        })
    };
    if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(30), cleanup).await {
        chaos.note(format!("clearing the alarm and the refusal failed: {e}"));
    }
    stop_forwarder(&chaos).await;

    chaos.set_phase("accounting");
    let accounting = tokio::time::timeout(Duration::from_secs(120), account(&chaos)).await;
    let (report, mut problems) = match accounting {
        Ok(Ok(acc)) => acc.report(&chaos, &settings, settled_at),
        Ok(Err(e)) => (
            String::new(),
            vec![format!("cannot read the queues back: {e}")],
        ),
        Err(_) => (
            String::new(),
            vec!["reading the queues back timed out".into()],
        ),
    };
    if let Some(problem) = run_problem {
        problems.insert(0, problem);
    }
    let unexpected = chaos.unexpected_exits.load(Ordering::SeqCst);
    if unexpected > 0 {
        problems.push(format!(
            "the forwarder exited {unexpected} time(s) on its own"
        ));
    }
    let kept = if problems.is_empty() {
        String::new()
    } else {
        let paths = chaos.log_paths.lock().unwrap_or_else(|e| e.into_inner());
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        format!("forwarder files kept: {}\n", shown.join(", "))
    };
    let full = format!(
        "{}\n{}problems: {}\n{kept}elapsed {:.1}s\n",
        timeline(&chaos),
        report,
        if problems.is_empty() {
            "none".to_string()
        } else {
            format!("\n  - {}", problems.join("\n  - "))
        },
        started.elapsed().as_secs_f64()
    );
    println!("{full}");
    if problems.is_empty() {
        for path in chaos
            .log_paths
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = std::fs::remove_file(path);
        }
    }
    stop_brokers(chaos).await;
    assert!(
        problems.is_empty(),
        "chaos run failed (CHAOS_SEED={} replays it):\n{full}",
        settings.seed
    );
}

/// Stops the broker nodes (in parallel on a cluster) once the run's last
/// task has let go of them; if one still holds on, they stop on drop.
async fn stop_brokers(chaos: Arc<Chaos>) {
    let mut chaos = chaos;
    for _ in 0..100 {
        match Arc::try_unwrap(chaos) {
            Ok(run) => return run.brokers.stop().await,
            Err(still) => chaos = still,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sets up, publishes while injecting faults, and waits until the inbound
/// queue has settled. Background tasks go to `tasks` so the caller can end
/// them whatever happens.
async fn run(
    chaos: Arc<Chaos>,
    settings: &Settings,
    tasks: &mut Vec<AbortHandle>,
) -> Result<(), String> {
    let mut rng = fastrand::Rng::with_seed(settings.seed);
    let pace = chaos.pace;
    let span = Duration::from_secs(
        (settings.messages / pace.rate).clamp(pace.span.0 as usize, pace.span.1 as usize) as u64,
    );

    chaos.set_phase("setup");
    // Before the queue is declared, so it never holds messages in the
    // default drop-head mode when the refusal policy comes and goes.
    chaos.ctl().allow_refusal(&chaos.queue("service")).await;
    if let Brokers::Cluster(cluster) = &chaos.brokers {
        for suffix in DESTINATIONS {
            cluster.declare_quorum(&chaos.queue(suffix)).await;
        }
    }
    *chaos.forwarder.lock().await = Some(chaos.spawn_forwarder());
    wait_consuming(&chaos, Duration::from_secs(60)).await?;
    chaos.note("forwarder consuming");
    if let Brokers::Cluster(cluster) = &chaos.brokers {
        cluster.await_quorum_online(&chaos.all_queues(), 0).await;
        chaos.note(format!(
            "all six queues are quorum queues with {} online members",
            cluster.len()
        ));
    }

    let plan = plan(&mut rng, settings, span);
    let summary: Vec<String> = plan
        .iter()
        .map(|(at, f)| format!("{:.1}s {}", at.as_secs_f64(), fault_name(f)))
        .collect();
    chaos.note(format!("plan: {}", summary.join(", ")));

    tasks.push(tokio::spawn(monitor(chaos.clone())).abort_handle());
    let ids: Vec<String> = (0..settings.messages).map(|i| format!("m{i:06}")).collect();
    let t0 = Instant::now();
    chaos.publishing.store(true, Ordering::SeqCst);
    let publisher = tokio::spawn(publish_all(chaos.clone(), ids, span, t0));
    let scheduler = tokio::spawn(inject(chaos.clone(), plan, t0, rng.u64(..)));
    tasks.push(publisher.abort_handle());
    tasks.push(scheduler.abort_handle());

    chaos.set_phase("publishing and injecting faults");
    scheduler
        .await
        .map_err(|e| format!("the fault scheduler failed: {e}"))?;
    chaos.note("all faults injected and cleared");
    publisher
        .await
        .map_err(|e| format!("the publisher failed: {e}"))?;
    chaos.note(format!(
        "publisher done: {} confirmed, {} publish retries",
        chaos.confirmed.load(Ordering::SeqCst),
        chaos.publish_retries.load(Ordering::SeqCst)
    ));

    chaos.set_phase("waiting for the inbound queue to settle");
    let inbound = chaos.queue("in");
    let mut quiet = 0;
    loop {
        if chaos.unexpected_exits.load(Ordering::SeqCst) >= MAX_UNEXPECTED_EXITS {
            return Err("the forwarder keeps exiting; not restarted any more".into());
        }
        let state = chaos.ctl().ready_unacked(&inbound).await;
        quiet = if state == Some((0, 0)) { quiet + 1 } else { 0 };
        if quiet >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    chaos.note("inbound queue empty, nothing unacked");
    Ok(())
}

/// Waits (up to `bound`) until the forwarder consumes from the inbound queue.
async fn wait_consuming(chaos: &Chaos, bound: Duration) -> Result<(), String> {
    let inbound = chaos.queue("in");
    let deadline = Instant::now() + bound;
    loop {
        if let Some(mut raw) = chaos.raw().await {
            let counts = raw.queue_counts(&inbound).await;
            raw.close().await;
            if matches!(counts, Ok((_, 1))) {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("the forwarder never consumed from {inbound}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn fault_name(f: &Fault) -> String {
    match f {
        Fault::Kill { .. } => "kill".into(),
        Fault::Close => "close".into(),
        Fault::Refuse { .. } => "refuse".into(),
        Fault::RefuseAndClose { .. } => "refuse+close".into(),
        Fault::Restart => "restart".into(),
        Fault::Alarm { .. } => "alarm".into(),
        Fault::Poison { id, .. } => format!("poison {id}"),
        Fault::Node {
            target: Target::InUse,
            ..
        } => "node (in use)".into(),
        Fault::Node {
            target: Target::Random(i),
            ..
        } => format!("node n{i}"),
    }
}

fn fault_kind(f: &Fault) -> &'static str {
    match f {
        Fault::Kill { .. } => "kill",
        Fault::Close => "close",
        Fault::Refuse { .. } => "refuse",
        Fault::RefuseAndClose { .. } => "refuse+close",
        Fault::Restart => "restart",
        Fault::Alarm { .. } => "alarm",
        Fault::Poison { .. } => "poison",
        Fault::Node { .. } => "node",
    }
}

/// The faults, at random offsets within the publishing span, in time order.
fn plan(rng: &mut fastrand::Rng, settings: &Settings, span: Duration) -> Vec<(Duration, Fault)> {
    let mut faults = Vec::new();
    let ms = |rng: &mut fastrand::Rng, lo: u64, hi: u64| Duration::from_millis(rng.u64(lo..hi));
    let (kills, closes, refusals) = settings.setup.counts();
    if settings.has("kill") {
        for _ in 0..kills {
            faults.push(Fault::Kill {
                down: ms(rng, 0, 1500),
            });
        }
    }
    if settings.has("close") {
        for _ in 0..closes {
            faults.push(Fault::Close);
        }
    }
    if settings.has("refuse") {
        for _ in 0..refusals {
            faults.push(Fault::Refuse {
                hold: ms(rng, 2000, 5000),
            });
        }
    }
    if settings.has("restart") {
        faults.push(Fault::Restart);
    }
    if settings.has("alarm") {
        // Longer than the forwarder's default 5 s confirm timeout: the alarm
        // must be waited out, not failed over or dead-lettered.
        faults.push(Fault::Alarm {
            hold: ms(rng, 6000, 9000),
        });
    }
    if settings.has("poison") {
        for (i, kind) in settings.setup.poison_kinds().iter().copied().enumerate() {
            let name = if kind == Poison::Deep { "deep" } else { "big" };
            faults.push(Fault::Poison {
                id: format!("poison-{name}-{i}"),
                kind,
            });
        }
    }
    let span_ms = span.as_millis() as u64;
    let mut plan: Vec<(Duration, Fault)> = faults
        .into_iter()
        .map(|f| {
            let at = Duration::from_millis(rng.u64(span_ms / 20..span_ms * 17 / 20));
            (at, f)
        })
        .collect();
    if settings.has("refuse") && settings.has("close") {
        // Each in its own slice of the span's first three quarters: it
        // must land while messages flow, and takes several seconds. The
        // first comes before every other fault: a close or a restart just
        // before it would make the primary's nacks read as a quorum
        // queue's election for 30 s (retried there, not failed over).
        let overlaps = settings.setup.overlaps() as u64;
        let slice = span_ms * 3 / 4 / overlaps;
        for k in 0..overlaps {
            let fault = Fault::RefuseAndClose {
                hold: ms(rng, 4000, 7000),
            };
            let from = span_ms / 20 + k * slice;
            let at = match k {
                0 => span_ms / 40,
                _ => rng.u64(from..from + slice / 2),
            };
            plan.push((Duration::from_millis(at), fault));
        }
    }
    if settings.has("node") {
        // Each in its own slice of the span's first half: a node fault
        // takes long, and every one must land while messages flow.
        let slice = span_ms / 2 / NODE_FAULTS as u64;
        for k in 0..NODE_FAULTS as u64 {
            let target = if k == 0 || rng.bool() {
                Target::InUse
            } else {
                Target::Random(rng.usize(..CLUSTER_NODES))
            };
            let fault = Fault::Node {
                down: ms(rng, 2000, 5000),
                target,
            };
            let from = span_ms / 20 + k * slice;
            plan.push((Duration::from_millis(rng.u64(from..from + slice)), fault));
        }
    }
    plan.sort_by_key(|(at, _)| *at);
    plan
}

/// Runs the plan, one fault at a time (a fault due while another is in
/// progress starts when it ends; node faults due go before the others, so
/// that they land while messages flow however long the others take).
async fn inject(chaos: Arc<Chaos>, plan: Vec<(Duration, Fault)>, t0: Instant, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut plan = std::collections::VecDeque::from(plan);
    while !plan.is_empty() {
        let now = t0.elapsed();
        let next = plan
            .iter()
            .position(|(at, f)| matches!(f, Fault::Node { .. }) && *at <= now)
            .unwrap_or(0);
        let Some((at, fault)) = plan.remove(next) else {
            break;
        };
        tokio::time::sleep_until(t0 + at).await;
        let began = Instant::now();
        let kind = fault_kind(&fault);
        match fault {
            Fault::Kill { down } => {
                let (_, busy) = wait_for_traffic(&chaos, TRAFFIC_WAIT).await;
                let mut forwarder = chaos.forwarder.lock().await;
                let Some(process) = forwarder.as_mut() else {
                    chaos.note("kill: skipped, the forwarder is no longer restarted");
                    continue;
                };
                process.signal("KILL");
                process.wait_exit(Duration::from_secs(10)).await;
                chaos.kills.fetch_add(1, Ordering::SeqCst);
                // Down for a while, as after a real crash.
                tokio::time::sleep(down).await;
                *forwarder = Some(chaos.spawn_forwarder());
                chaos.note(format!(
                    "kill: forwarder SIGKILLed{busy}, restarted after {:.1}s",
                    began.elapsed().as_secs_f64()
                ));
            }
            Fault::Close => {
                // A forwarder just restarted by a kill has nothing to close yet.
                let _ = wait_consuming(&chaos, CONSUMING_WAIT).await;
                let (_, backlog) = pause_for_backlog(&chaos).await;
                let closed = chaos
                    .ctl()
                    .close_connections_named(&format!("{}/", chaos.p))
                    .await;
                resume(&chaos).await;
                chaos.note(format!(
                    "close: {closed} forwarder connection(s) closed{backlog}"
                ));
            }
            Fault::Refuse { hold } => {
                let (_, busy) = wait_for_traffic(&chaos, TRAFFIC_WAIT).await;
                let queue = chaos.queue("service");
                chaos.ctl().refuse_publishes(&queue, true).await;
                chaos.note(format!("refuse: {queue} refuses publishes{busy}"));
                tokio::time::sleep(hold).await;
                chaos.ctl().refuse_publishes(&queue, false).await;
                chaos.note(format!(
                    "refuse: {queue} accepts again after {:.1}s",
                    began.elapsed().as_secs_f64()
                ));
            }
            Fault::RefuseAndClose { hold } => {
                let queue = chaos.queue("service");
                let _ = wait_consuming(&chaos, CONSUMING_WAIT).await;
                chaos.ctl().refuse_publishes(&queue, true).await;
                let (landed, how) = match &chaos.backup {
                    Some(proxy) => close_under_copies_to_the_backup(&chaos, proxy).await,
                    None => close_on_a_backlog(&chaos).await,
                };
                if landed {
                    chaos.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                chaos.note(format!("refuse+close: {queue} refuses; {how}"));
                tokio::time::sleep_until(began + hold).await;
                chaos.ctl().refuse_publishes(&queue, false).await;
                chaos.note(format!(
                    "refuse+close: {queue} accepts again after {:.1}s",
                    began.elapsed().as_secs_f64()
                ));
            }
            Fault::Restart => {
                let (_, backlog) = pause_for_backlog(&chaos).await;
                chaos.note(format!("restart: broker app stopping{backlog}"));
                chaos.ctl().stop_app().await;
                resume(&chaos).await;
                chaos.ctl().start_app().await;
                chaos.note(format!(
                    "restart: broker app back after {:.1}s",
                    began.elapsed().as_secs_f64()
                ));
            }
            Fault::Alarm { hold } => {
                let (_, backlog) = pause_for_backlog(&chaos).await;
                chaos.ctl().set_memory_alarm(true).await;
                resume(&chaos).await;
                chaos.note(format!("alarm: memory alarm raised{backlog}"));
                tokio::time::sleep_until(began + hold).await;
                let blocked = chaos.ctl().blocked_connections().await;
                let forwarder = format!("{}/publish/", chaos.p);
                chaos.note(format!(
                    "alarm: forwarder publishing connection {}",
                    if blocked.iter().any(|n| n.contains(&forwarder)) {
                        "blocked"
                    } else {
                        "NOT blocked"
                    }
                ));
                chaos.ctl().set_memory_alarm(false).await;
                chaos.note(format!(
                    "alarm: cleared after {:.1}s",
                    began.elapsed().as_secs_f64()
                ));
            }
            Fault::Poison { id, kind } => {
                let sent = publish_poison(&chaos, &id, kind, &mut rng).await;
                chaos.note(format!(
                    "poison: {id} {}",
                    if sent.confirmed {
                        "published (confirmed)"
                    } else {
                        "NOT confirmed"
                    }
                ));
                chaos
                    .poison
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(sent);
            }
            Fault::Node { down, target } => node_fault(&chaos, down, target).await,
        }
        chaos.applied(kind);
    }
}

/// Within a refusal window: once copies fail over to the backup, holds what
/// the forwarder sends through the backup's proxy until some is held (copies
/// on their way), closes the backup's publishing connection, and resumes:
/// the copies the primary refused are cut on their way to the backup.
/// Whether it landed so, and what happened.
async fn close_under_copies_to_the_backup(chaos: &Chaos, proxy: &FaultProxy) -> (bool, String) {
    let backup = chaos.queue("service.backup");
    let count = |raw: &mut Option<RawClient>| {
        let backup = backup.clone();
        let raw = raw.take();
        async move {
            let mut raw = raw?;
            let n = raw.message_count(&backup).await.ok();
            Some((raw, n?))
        }
    };
    let mut raw = chaos.raw().await;
    let before = match count(&mut raw).await {
        Some((client, n)) => {
            raw = Some(client);
            n
        }
        None => 0,
    };
    // Copies fail over to the backup (a burst is in progress).
    let deadline = Instant::now() + TRAFFIC_WAIT * 2;
    let mut flowing = false;
    while Instant::now() < deadline {
        match count(&mut raw).await {
            Some((client, n)) => {
                raw = Some(client);
                if n > before {
                    flowing = true;
                    break;
                }
            }
            None => raw = chaos.raw().await,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(client) = raw {
        client.close().await;
    }
    let held = proxy.held();
    proxy.stall_upstream();
    let deadline = Instant::now() + TRAFFIC_WAIT;
    while proxy.held() == held && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let on_their_way = proxy.held() > held;
    let closed = chaos
        .ctl()
        .close_connections_named(&format!("{}/publish/backup", chaos.p))
        .await;
    proxy.resume();
    let landed = flowing && on_their_way && closed > 0;
    (
        landed,
        format!(
            "the backup's connection closed ({closed}) with copies {} on their way to it{}",
            if on_their_way { "held" } else { "NOT" },
            if flowing {
                ""
            } else {
                " (no failover seen first)"
            }
        ),
    )
}

/// Within a refusal window, on a cluster: the forwarder paused until a
/// backlog waits, its publishing connection closed, and resumed.
async fn close_on_a_backlog(chaos: &Chaos) -> (bool, String) {
    let (waiting, backlog) = pause_for_backlog(chaos).await;
    let closed = chaos
        .ctl()
        .close_connections_named(&format!("{}/publish/", chaos.p))
        .await;
    resume(chaos).await;
    (
        closed > 0 && waiting > 0,
        format!("{closed} publishing connection(s) closed within the window{backlog}"),
    )
}

/// Stops the app of the node `target` names for `down`, starts it again
/// and waits until it is back in the cluster with every quorum member of
/// the run's queues online. On the node the forwarder uses, the forwarder
/// is paused for a backlog first (the node is lost under a full window);
/// on another, the stop waits for traffic (the quorum queues lose a member,
/// or their leader, under publishes in flight), and when none comes (the
/// forwarder keeps up with the publisher) it is paused for a backlog too.
async fn node_fault(chaos: &Chaos, down: Duration, target: Target) {
    let Brokers::Cluster(cluster) = &chaos.brokers else {
        chaos.note("node: skipped, not a cluster");
        return;
    };
    let began = Instant::now();
    let used = chaos.forwarder_nodes().await;
    let (i, which) = match target {
        Target::InUse => (used.first().copied().unwrap_or(0), "the forwarder's"),
        Target::Random(i) if used.contains(&i) => (i, "random, the forwarder's"),
        Target::Random(i) => (i, "random, not the forwarder's"),
    };
    let uses = used.contains(&i);
    // Longer than a kill waits: every node fault must find traffic. A
    // forwarder that keeps up leaves nothing waiting; it is then paused
    // for a backlog too, so that the node is lost with messages flowing.
    let traffic = if uses {
        None
    } else {
        Some(wait_for_traffic(chaos, BACKLOG_WAIT).await).filter(|(n, _)| *n > 0)
    };
    let paused = traffic.is_none();
    let (waiting, load) = match traffic {
        Some((waiting, busy)) => (waiting, busy.to_string()),
        None => pause_for_backlog(chaos).await,
    };
    let flowing = waiting > 0 && chaos.publishing.load(Ordering::SeqCst);
    let node = cluster.node(i);
    *chaos.down.lock().unwrap_or_else(|e| e.into_inner()) = Some(i);
    chaos.note(format!(
        "node: n{i} {} ({which}; forwarder on {used:?}) stopping{load}",
        node.node_name()
    ));
    node.stop_app().await;
    if paused {
        resume(chaos).await;
    }
    let stopped = Instant::now();
    chaos.note(format!("node: n{i} app stopped"));
    // The fault itself: the node stays down this long.
    tokio::time::sleep(down).await;
    node.start_app().await;
    let other = (i + 1) % cluster.len();
    cluster.await_all_running(i).await;
    cluster.await_all_running(other).await;
    *chaos.down.lock().unwrap_or_else(|e| e.into_inner()) = None;
    chaos.note(format!(
        "node: n{i} back in the cluster after {:.1}s down",
        stopped.elapsed().as_secs_f64()
    ));
    cluster
        .await_quorum_online(&chaos.all_queues(), other)
        .await;
    chaos.note(format!(
        "node: n{i} quorum members online, {:.1}s after the fault began",
        began.elapsed().as_secs_f64()
    ));
    chaos
        .node_faults
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(NodeFault {
            node: i,
            used: uses,
            flowing,
        });
}

/// Pauses the forwarder (SIGSTOP) and waits (up to `BACKLOG_WAIT`) until
/// `Pace::backlog` messages wait in the inbound queue; says how many did.
/// The caller applies its fault, then [`resume`]s the forwarder.
async fn pause_for_backlog(chaos: &Chaos) -> (u32, String) {
    {
        let mut forwarder = chaos.forwarder.lock().await;
        let Some(process) = forwarder.as_mut() else {
            return (0, " (forwarder not running)".into());
        };
        process.signal("STOP");
    }
    let deadline = Instant::now() + BACKLOG_WAIT;
    let inbound = chaos.queue("in");
    let mut waiting = 0;
    if let Some(mut raw) = chaos.raw().await {
        while Instant::now() < deadline {
            match raw.message_count(&inbound).await {
                Ok(n) => waiting = n,
                Err(_) => break,
            }
            if waiting >= chaos.pace.backlog {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        raw.close().await;
    }
    (
        waiting,
        format!(" (forwarder paused until {waiting} messages waited)"),
    )
}

/// Lets a forwarder paused by [`pause_for_backlog`] go on (SIGCONT).
async fn resume(chaos: &Chaos) {
    if let Some(process) = chaos.forwarder.lock().await.as_mut() {
        process.signal("CONT");
    }
}

/// Waits (up to `wait`) until the inbound queue has a backlog, that is the
/// forwarder has a full window in flight; says which it was, with the
/// backlog seen.
async fn wait_for_traffic(chaos: &Chaos, wait: Duration) -> (u32, &'static str) {
    let deadline = Instant::now() + wait;
    let Some(mut raw) = chaos.raw().await else {
        return (0, " (broker unreachable)");
    };
    let inbound = chaos.queue("in");
    let mut busy = (0, " (idle)");
    while Instant::now() < deadline {
        match raw.message_count(&inbound).await {
            Ok(n) if n > 0 => {
                busy = (n, " (with messages in flight)");
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(_) => break,
        }
    }
    raw.close().await;
    busy
}

/// Publishes one poison message over a raw connection, retrying until the
/// broker confirms it (or a minute has passed).
async fn publish_poison(
    chaos: &Chaos,
    id: &str,
    kind: Poison,
    rng: &mut fastrand::Rng,
) -> PoisonSent {
    let body = format!("{id} body {}", rng.u32(..)).into_bytes();
    let mut props = RawProperties {
        message_id: Some(id.to_string()),
        delivery_mode: Some(2),
        headers: vec![(POISON_HEADER.to_string(), encode::boolean(true))],
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sent = PoisonSent {
        id: id.to_string(),
        kind,
        header: (String::new(), Vec::new()),
        body,
        confirmed: false,
    };
    while Instant::now() < deadline {
        let Some(mut raw) = chaos.raw().await else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        // Only the marker: a header of an earlier attempt would skew the filler.
        props.headers.truncate(1);
        let header = poison_header(kind, &props, raw.frame_max());
        props.headers.push(header.clone());
        sent.header = header;
        let result = async {
            raw.confirm_select().await?;
            raw.publish("", &chaos.queue("in"), &props, &sent.body)
                .await
        }
        .await;
        raw.close().await;
        if result == Ok(RawConfirm::Ack) {
            sent.confirmed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    sent
}

/// The header that makes a message with `props` poison: a table
/// `DEEP_LEVELS` deep, or a filler that brings the content header to
/// `BIG_HEADER_MARGIN` bytes under `frame_max`.
fn poison_header(kind: Poison, props: &RawProperties, frame_max: u32) -> (String, Vec<u8>) {
    match kind {
        Poison::Deep => (
            "deep".to_string(),
            encode::nested_table_value("d", DEEP_LEVELS),
        ),
        Poison::Big => {
            let mut probe = props.clone();
            probe
                .headers
                .push(("filler".to_string(), encode::long_string(b"")));
            let target = frame_max as usize - BIG_HEADER_MARGIN;
            let filler = target - RawClient::header_frame_size(&probe);
            (
                "filler".to_string(),
                encode::long_string(&vec![b'f'; filler]),
            )
        }
    }
}

/// Restarts the forwarder whenever it exits without the test killing it,
/// up to `MAX_UNEXPECTED_EXITS` times.
async fn monitor(chaos: Arc<Chaos>) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let mut forwarder = chaos.forwarder.lock().await;
        let Some(process) = forwarder.as_mut() else {
            continue;
        };
        let Some(status) = process.exited() else {
            continue;
        };
        let n = chaos.unexpected_exits.fetch_add(1, Ordering::SeqCst) + 1;
        let log = process.log();
        let tail: Vec<&str> = log.lines().rev().take(3).collect();
        chaos.note(format!(
            "UNEXPECTED: the forwarder exited on its own ({status}); log tail: {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
        if n >= MAX_UNEXPECTED_EXITS {
            chaos.note("giving up restarting the forwarder");
            *forwarder = None;
            return;
        }
        *forwarder = Some(chaos.spawn_forwarder());
    }
}

/// A confirm channel on a fresh publishing connection of the test's own,
/// to the first node of [`Chaos::client_order`] that answers.
async fn publisher_channel(chaos: &Chaos) -> Option<(Connection, Channel)> {
    for i in chaos.client_order() {
        let url = chaos.brokers.nodes()[i].amqp_url();
        let connect = Connection::connect(
            &url,
            ConnectionProperties::default()
                .with_connection_name(format!("{}-publisher", chaos.p).into()),
        );
        let Ok(Ok(conn)) = tokio::time::timeout(CONNECT_WAIT, connect).await else {
            continue;
        };
        let open = async {
            let ch = conn.create_channel().await?;
            ch.confirm_select(ConfirmSelectOptions::default()).await?;
            Ok::<_, lapin::Error>(ch)
        };
        match tokio::time::timeout(CONNECT_WAIT, open).await {
            Ok(Ok(ch)) => return Some((conn, ch)),
            _ => {
                let _ = tokio::time::timeout(Duration::from_secs(5), conn.close(200, "OK".into()))
                    .await;
            }
        }
    }
    None
}

/// Publishes every id to the inbound queue, persistent and mandatory, in
/// bursts spread over `span`; publishes that are not confirmed (nack, error,
/// timeout, connection lost) are published again. Only confirmed publishes
/// count as sent.
async fn publish_all(chaos: Arc<Chaos>, ids: Vec<String>, span: Duration, t0: Instant) {
    let inbound = chaos.queue("in");
    let burst = chaos.pace.burst;
    let batches = ids.len().div_ceil(burst).max(1);
    let mut link: Option<(Connection, Channel)> = None;
    for (k, batch) in ids.chunks(burst).enumerate() {
        tokio::time::sleep_until(t0 + span.mul_f64(k as f64 / batches as f64)).await;
        let mut pending: Vec<&String> = batch.iter().collect();
        let mut first = true;
        while !pending.is_empty() {
            if !first {
                chaos
                    .publish_retries
                    .fetch_add(pending.len(), Ordering::SeqCst);
            }
            first = false;
            if link
                .as_ref()
                .is_none_or(|(c, ch)| !c.status().connected() || !ch.status().connected())
            {
                if let Some((old, _)) = link.take() {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), old.close(200, "OK".into()))
                            .await;
                }
                link = publisher_channel(&chaos).await;
            }
            let Some((_, channel)) = link.as_ref() else {
                // The broker is down (an app restart): try again shortly.
                tokio::time::sleep(Duration::from_millis(200)).await;
                first = true;
                continue;
            };
            let mut failed = Vec::new();
            let mut confirms = Vec::new();
            for (i, id) in pending.iter().enumerate() {
                let props = BasicProperties::default()
                    .with_message_id(id.as_str().into())
                    .with_delivery_mode(2);
                let publish = channel.basic_publish(
                    "".into(),
                    inbound.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    id.as_bytes(),
                    props,
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
                    Ok(Ok(Confirmation::Ack(None))) => {
                        chaos.confirmed.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => failed.push(id),
                }
            }
            if !failed.is_empty()
                && let Some((conn, _)) = link.take()
            {
                // A fresh channel, so no late confirm is mistaken for a new one.
                let _ = tokio::time::timeout(Duration::from_secs(5), conn.close(200, "OK".into()))
                    .await;
            }
            pending = failed;
        }
    }
    if let Some((conn, _)) = link {
        let _ = tokio::time::timeout(Duration::from_secs(5), conn.close(200, "OK".into())).await;
    }
    chaos.publishing.store(false, Ordering::SeqCst);
}

async fn stop_forwarder(chaos: &Chaos) {
    let mut forwarder = chaos.forwarder.lock().await;
    if let Some(mut process) = forwarder.take() {
        if process.exited().is_none() {
            process.signal("TERM");
            let deadline = Instant::now() + Duration::from_secs(30);
            while process.exited().is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let status = process.exited();
        chaos.note(format!("forwarder stopped: {status:?}"));
        // Drop kills it if TERM did not.
    }
}

/// What the queues held at the end, by message id.
/// The distinct `x-switchyard-copy-id` values (raw bytes; `None`: absent)
/// seen on one message's copies.
type CopyIds = BTreeSet<Option<Vec<u8>>>;

struct Accounting {
    queues: Vec<(String, Vec<RawMessage>)>,
}

async fn account(chaos: &Chaos) -> Result<Accounting, String> {
    let mut raw = chaos.raw().await.ok_or("no node answers")?;
    let mut queues = Vec::new();
    for suffix in DESTINATIONS.into_iter().chain(["dlq", "in"]) {
        let messages = raw
            .drain(&chaos.queue(suffix))
            .await
            .map_err(|e| format!("{suffix}: {e}"))?;
        queues.push((suffix.to_string(), messages));
    }
    raw.close().await;
    Ok(Accounting { queues })
}

fn timeline(chaos: &Chaos) -> String {
    let lines = chaos.timeline.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = String::from("timeline:\n");
    for line in lines.iter() {
        let _ = writeln!(out, "  {line}");
    }
    out
}

impl Accounting {
    fn queue(&self, suffix: &str) -> &[RawMessage] {
        self.queues
            .iter()
            .find(|(s, _)| s == suffix)
            .map(|(_, m)| m.as_slice())
            .unwrap_or(&[])
    }

    /// Copies per message id in the given queues.
    fn tally(&self, suffixes: &[&str]) -> BTreeMap<String, usize> {
        support::tally(
            suffixes
                .iter()
                .flat_map(|suffix| self.queue(suffix))
                .map(|m| m.message_id.clone().unwrap_or_default()),
        )
    }

    /// Over the copies in `suffixes`: how many are duplicates, and the ids
    /// whose copies do not all carry one and the same
    /// `x-switchyard-copy-id` (every redelivery, replay and instance must
    /// give a message's copies on one branch the same).
    fn copy_ids(&self, suffixes: &[&str]) -> (usize, Vec<String>) {
        let mut seen: HashMap<String, (usize, CopyIds)> = HashMap::new();
        for suffix in suffixes {
            for m in self.queue(suffix) {
                let id = m.message_id.clone().unwrap_or_default();
                let entry = seen.entry(id).or_default();
                entry.0 += 1;
                entry.1.insert(m.header_value("x-switchyard-copy-id"));
            }
        }
        let duplicates = seen.values().map(|(n, _)| n - 1).sum();
        let mut mismatched: Vec<String> = seen
            .into_iter()
            .filter(|(_, (_, ids))| ids.len() != 1 || ids.contains(&None))
            .map(|(id, _)| id)
            .collect();
        mismatched.sort();
        (duplicates, mismatched)
    }

    fn report(
        &self,
        chaos: &Chaos,
        settings: &Settings,
        settled_at: Duration,
    ) -> (String, Vec<String>) {
        let mut out = String::new();
        let mut problems = Vec::new();
        let is_poison = |id: &str| id.starts_with("poison-");
        let normal = |counts: &BTreeMap<String, usize>| -> (usize, usize) {
            let copies = counts
                .iter()
                .filter(|(id, _)| !is_poison(id))
                .map(|(_, n)| n)
                .sum();
            let distinct = counts.keys().filter(|id| !is_poison(id)).count();
            (copies, distinct)
        };
        let service = self.tally(&["service", "service.backup"]);
        let logging = self.tally(&["logging", "logging.backup"]);
        let dlq = self.tally(&["dlq"]);
        let inbound = self.tally(&["in"]);
        let confirmed = chaos.confirmed.load(Ordering::SeqCst);
        let ids: Vec<String> = (0..settings.messages).map(|i| format!("m{i:06}")).collect();
        let known: BTreeSet<&str> = ids.iter().map(String::as_str).collect();

        let _ = writeln!(
            out,
            "publisher: {confirmed} of {} confirmed, {} publish retries",
            settings.messages,
            chaos.publish_retries.load(Ordering::SeqCst)
        );
        let _ = writeln!(
            out,
            "forwarder: {} kills by the test, {} exits on its own; run ended at {:.1}s",
            chaos.kills.load(Ordering::SeqCst),
            chaos.unexpected_exits.load(Ordering::SeqCst),
            settled_at.as_secs_f64()
        );
        let applied = chaos.applied.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(
            out,
            "faults applied: {}",
            if applied.is_empty() {
                "none".to_string()
            } else {
                applied
                    .iter()
                    .map(|(kind, n)| format!("{kind} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        if settings.has("node") {
            let node_faults = chaos.node_faults.lock().unwrap_or_else(|e| e.into_inner());
            let flowing = node_faults.iter().filter(|f| f.flowing).count();
            let each: Vec<String> = node_faults
                .iter()
                .map(|f| {
                    format!(
                        "n{} ({}, {})",
                        f.node,
                        if f.used {
                            "the forwarder's"
                        } else {
                            "not the forwarder's"
                        },
                        if f.flowing {
                            "messages flowing"
                        } else {
                            "NO messages flowing"
                        }
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "node faults: {} of {NODE_FAULTS} planned, {flowing} while messages flowed: {}",
                node_faults.len(),
                each.join(", ")
            );
            if flowing < MIN_NODE_FAULTS_FLOWING {
                problems.push(format!(
                    "only {flowing} node fault(s) landed while messages flowed, at least \
                     {MIN_NODE_FAULTS_FLOWING} must"
                ));
            }
        }
        if settings.has("refuse") && settings.has("close") {
            let landed = chaos.overlaps.load(Ordering::SeqCst);
            let _ = writeln!(
                out,
                "refusals overlapping a close: {} planned, {landed} landed on waiting messages",
                settings.setup.overlaps()
            );
            if landed == 0 {
                problems
                    .push("no refusal overlapping a close landed while messages waited".to_owned());
            }
        }
        for (label, counts, primary, backup) in [
            ("service", &service, "service", "service.backup"),
            ("logging", &logging, "logging", "logging.backup"),
        ] {
            let (copies, distinct) = normal(counts);
            let _ = writeln!(
                out,
                "{label}: {} primary + {} backup; normal: {copies} copies of {distinct} ids, \
                 {} duplicates",
                self.queue(primary).len(),
                self.queue(backup).len(),
                copies - distinct
            );
        }
        for (label, queues) in [
            ("service", ["service", "service.backup"]),
            ("logging", ["logging", "logging.backup"]),
        ] {
            let (duplicates, mismatched) = self.copy_ids(&queues);
            let _ = writeln!(
                out,
                "{label}: {duplicates} duplicates, {} with a copy id other than their first \
                 copy's",
                mismatched.len()
            );
            if !mismatched.is_empty() {
                problems.push(format!(
                    "{label}: copies of one message with different (or no) copy ids, e.g. {:?}",
                    &mismatched[..mismatched.len().min(8)]
                ));
            }
        }
        let (dlq_normal, _) = normal(&dlq);
        let _ = writeln!(
            out,
            "dlq: {} messages ({dlq_normal} normal); inbound left: {}",
            self.queue("dlq").len(),
            self.queue("in").len()
        );

        // A message still in the inbound queue or dead-lettered is counted
        // as such; lost is missing from a branch and from both of those.
        let dead: Vec<&String> = ids.iter().filter(|id| dlq.contains_key(*id)).collect();
        let left: Vec<&String> = ids.iter().filter(|id| inbound.contains_key(*id)).collect();
        let elsewhere = |id: &String| dlq.contains_key(id) || inbound.contains_key(id);
        let missing_service: Vec<&String> = ids
            .iter()
            .filter(|id| !service.contains_key(*id) && !elsewhere(id))
            .collect();
        let missing_logging: Vec<&String> = ids
            .iter()
            .filter(|id| !logging.contains_key(*id) && !elsewhere(id))
            .collect();
        let unknown: BTreeSet<&String> = service
            .keys()
            .chain(logging.keys())
            .chain(dlq.keys())
            .chain(inbound.keys())
            .filter(|id| !is_poison(id) && !known.contains(id.as_str()))
            .collect();
        let altered = self
            .queues
            .iter()
            .flat_map(|(_, ms)| ms)
            .filter(|m| {
                m.message_id
                    .as_deref()
                    .is_some_and(|id| !is_poison(id) && m.body != id.as_bytes())
            })
            .count();
        let lost: BTreeSet<&String> = missing_service
            .iter()
            .chain(&missing_logging)
            .copied()
            .collect();
        let _ = writeln!(
            out,
            "normal messages: {} lost (missing from service {}, from logging {}), \
             {} dead-lettered, {} left in inbound, {} unknown ids, {altered} altered bodies",
            lost.len(),
            missing_service.len(),
            missing_logging.len(),
            dead.len(),
            left.len(),
            unknown.len()
        );
        let sample = |v: &[&String]| -> String {
            let shown: Vec<&str> = v.iter().take(8).map(|s| s.as_str()).collect();
            format!("{shown:?}")
        };
        if confirmed < settings.messages {
            problems.push(format!(
                "only {confirmed} of {} publishes confirmed",
                settings.messages
            ));
        }
        if !lost.is_empty() {
            let lost: Vec<&String> = lost.into_iter().collect();
            problems.push(format!("{} lost, e.g. {}", lost.len(), sample(&lost)));
        }
        if !dead.is_empty() {
            problems.push(format!(
                "{} normal messages dead-lettered, e.g. {}",
                dead.len(),
                sample(&dead)
            ));
        }
        if !left.is_empty() {
            problems.push(format!("{} left in the inbound queue", left.len()));
        }
        if !unknown.is_empty() {
            let unknown: Vec<&String> = unknown.into_iter().collect();
            problems.push(format!("unknown message ids: {}", sample(&unknown)));
        }
        if altered > 0 {
            problems.push(format!("{altered} copies with an altered body"));
        }

        let poison = chaos.poison.lock().unwrap_or_else(|e| e.into_inner());
        for sent in poison.iter() {
            let verdict = self.poison_verdict(sent);
            let _ = writeln!(out, "poison {} ({:?}): {verdict}", sent.id, sent.kind);
            if !verdict.starts_with("ok") {
                problems.push(format!("poison {}: {verdict}", sent.id));
            }
        }
        (out, problems)
    }

    /// Where a poison message ended: dead-lettered, or forwarded intact to
    /// both branches; anything else is a problem.
    fn poison_verdict(&self, sent: &PoisonSent) -> String {
        let find = |suffixes: &[&str]| -> Vec<&RawMessage> {
            suffixes
                .iter()
                .flat_map(|s| self.queue(s))
                .filter(|m| m.message_id.as_deref() == Some(sent.id.as_str()))
                .collect()
        };
        let intact = |m: &RawMessage| {
            m.body == sent.body
                && m.header_value(&sent.header.0).as_deref() == Some(sent.header.1.as_slice())
                && m.header_value(POISON_HEADER) == Some(encode::boolean(true))
        };
        let dead = find(&["dlq"]);
        let service = find(&["service", "service.backup"]);
        let logging = find(&["logging", "logging.backup"]);
        let left = find(&["in"]);
        if !sent.confirmed {
            return "never confirmed by the broker".into();
        }
        if !left.is_empty() {
            return format!("still in the inbound queue ({} copies)", left.len());
        }
        if let Some(m) = dead.iter().find(|m| intact(m)) {
            return format!(
                "ok, dead-lettered{} ({} in dlq, {} service and {} logging copies)",
                death_reason(m).map_or_else(String::new, |r| format!(" {r}")),
                dead.len(),
                service.len(),
                logging.len()
            );
        }
        if !dead.is_empty() {
            return "dead-lettered but altered".into();
        }
        match (service.is_empty(), logging.is_empty()) {
            (false, false) if service.iter().chain(&logging).all(|m| intact(m)) => format!(
                "ok, forwarded intact ({} service, {} logging copies)",
                service.len(),
                logging.len()
            ),
            (false, false) => "forwarded but altered".into(),
            (true, true) => "LOST: in no queue".into(),
            (true, false) => "LOST from service (logging has it)".into(),
            (false, true) => "LOST from logging (service has it)".into(),
        }
    }
}

/// The reason of a dead letter's `x-death` (`rejected` when the forwarder
/// nacked it, `delivery_limit` when the quorum queue gave it up), if it
/// has one of those.
fn death_reason(message: &RawMessage) -> Option<&'static str> {
    let death = message.header_value("x-death")?;
    ["delivery_limit", "rejected"].into_iter().find(|reason| {
        let mut text = vec![b'S'];
        text.extend(u32::try_from(reason.len()).unwrap_or(0).to_be_bytes());
        text.extend(reason.as_bytes());
        death.windows(text.len()).any(|w| w == text)
    })
}
