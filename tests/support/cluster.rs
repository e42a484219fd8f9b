//! `PrivateCluster`: RabbitMQ nodes of the test's own ([`PrivateNode`]s)
//! joined into one cluster, for faults a single node cannot show: a
//! rolling restart, the preferred node of a connection killed and back.
//!
//! The nodes share the Erlang cookie without any setup: `rabbitmq-server`
//! and `rabbitmqctl` started as root run as the `rabbitmq` user, whose
//! `~/.erlang.cookie` (`/var/lib/rabbitmq/.erlang.cookie`) every node and
//! every `rabbitmqctl` reads. Node 0 is the one the others join. The nodes
//! are stopped and their directories removed by [`PrivateCluster::stop`]
//! or on drop.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use lapin::types::AMQPValue;

use super::rabbitmqctl::parse_connection_name;
use super::{PrivateNode, TestBroker, amqp_str, field_table, try_rabbitmqctl, wait_until};

/// Interval between two polls of a condition that runs `rabbitmqctl` (an
/// Erlang VM of its own each time, too costly to start every 50 ms).
pub const CTL_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Bound on a node joining the cluster, or coming back to it, once its app runs.
pub const CLUSTER_JOIN_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on a SIGKILLed VM going away (its AMQP port closed).
const KILL_TIMEOUT: Duration = Duration::from_secs(20);

/// `n` RabbitMQ nodes clustered together.
pub struct PrivateCluster {
    nodes: Vec<PrivateNode>,
}

impl PrivateCluster {
    /// Starts `n` nodes (one after the other: each picks its free ports
    /// once the one before listens on its own), joins nodes 1.. to node 0
    /// (`stop_app`, `join_cluster`, `start_app`), and waits until node 0
    /// reports all `n` running.
    pub async fn start(n: usize) -> PrivateCluster {
        assert!(n >= 1, "a cluster has at least one node");
        let mut cluster = PrivateCluster { nodes: Vec::new() };
        for _ in 0..n {
            cluster.nodes.push(PrivateNode::start().await);
        }
        let first = cluster.nodes[0].node_name().to_owned();
        for node in &cluster.nodes[1..] {
            node.stop_app().await;
            node.rabbitmqctl(&["join_cluster", &first]).await;
            node.start_app().await;
        }
        cluster.await_all_running(0).await;
        cluster
    }

    /// Every node, node 0 first.
    pub fn nodes(&self) -> &[PrivateNode] {
        &self.nodes
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &PrivateNode {
        &self.nodes[i]
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// One `amqp://guest:guest@127.0.0.1:<port>/%2f` per node, in order.
    pub fn amqp_urls(&self) -> Vec<String> {
        self.nodes.iter().map(PrivateNode::amqp_url).collect()
    }

    /// Every node's AMQP listener, in order.
    pub fn amqp_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(PrivateNode::amqp_addr).collect()
    }

    /// The Erlang names of the nodes `rabbitmqctl -n <via> cluster_status`
    /// reports running (the `rabbit` app up); `None` when `via` cannot be asked.
    pub async fn running_nodes(&self, via: usize) -> Option<Vec<String>> {
        let name = self.nodes[via].node_name();
        let out = try_rabbitmqctl(&["-n", name, "cluster_status", "--formatter", "json"])
            .await
            .ok()?;
        running_nodes_in(&out)
    }

    /// Waits until node `via` reports every node of the cluster running.
    pub async fn await_all_running(&self, via: usize) {
        let all: Vec<String> = self
            .nodes
            .iter()
            .map(|n| n.node_name().to_owned())
            .collect();
        wait_every(
            &format!(
                "{} reports all {} nodes running",
                self.nodes[via].node_name(),
                all.len()
            ),
            CLUSTER_JOIN_TIMEOUT,
            || async {
                self.running_nodes(via)
                    .await
                    .is_some_and(|running| all.iter().all(|n| running.contains(n)))
            },
        )
        .await;
    }

    /// Waits until node `via` no longer reports node `gone` running.
    pub async fn await_not_running(&self, gone: usize, via: usize) {
        let name = self.nodes[gone].node_name().to_owned();
        wait_every(
            &format!("{} reports {name} down", self.nodes[via].node_name()),
            CLUSTER_JOIN_TIMEOUT,
            || async {
                self.running_nodes(via)
                    .await
                    .is_some_and(|running| !running.contains(&name))
            },
        )
        .await;
    }

    /// SIGKILLs node `i`'s Erlang VM (no shutdown of any kind, as a crash
    /// or a power cut) and waits until it is gone: the process exited and
    /// its AMQP port refuses connections. [`Self::restart_killed`] boots it again.
    pub async fn kill_node(&self, i: usize) {
        let node = &self.nodes[i];
        let pid = node
            .os_pid()
            .unwrap_or_else(|| panic!("node {} has no pid file", node.node_name()));
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("kill: {e}"));
        assert!(status.success(), "kill -KILL {pid} failed");
        let addr = node.amqp_addr();
        wait_until(
            &format!("node {} (pid {pid}) is gone", node.node_name()),
            KILL_TIMEOUT,
            || async move {
                !process_alive(pid) && tokio::net::TcpStream::connect(addr).await.is_err()
            },
        )
        .await;
    }

    /// Boots node `i` again after [`Self::kill_node`] (same name, ports and
    /// data directory) and waits until it accepts AMQP connections and both
    /// it and another node report every node running.
    pub async fn restart_killed(&self, i: usize) {
        self.nodes[i].relaunch().await;
        self.await_all_running(i).await;
        if self.nodes.len() > 1 {
            self.await_all_running((i + 1) % self.nodes.len()).await;
        }
    }

    /// Declares durable quorum queue `queue` replicated on every node
    /// (`x-quorum-initial-group-size` = the cluster's size), through node 0.
    pub async fn declare_quorum(&self, queue: &str) {
        self.declare_quorum_with(queue, Vec::new()).await;
    }

    /// [`Self::declare_quorum`] with more arguments (`x-dead-letter-exchange`...).
    pub async fn declare_quorum_with(&self, queue: &str, args: Vec<(&str, AMQPValue)>) {
        let size = i32::try_from(self.nodes.len()).unwrap_or(i32::MAX);
        let mut all = vec![
            ("x-queue-type", amqp_str("quorum")),
            ("x-quorum-initial-group-size", AMQPValue::LongInt(size)),
        ];
        all.extend(args);
        let broker = TestBroker::connect_to(&self.nodes[0].amqp_url(), "sy-cluster-declare").await;
        broker.declare_queue_with(queue, field_table(all)).await;
        broker.close().await;
    }

    /// The members and the online members of quorum queue `queue`
    /// (`rabbitmqctl list_queues name members online`, asked of node
    /// `via`); `None` when the queue is not listed.
    pub async fn quorum_members(
        &self,
        queue: &str,
        via: usize,
    ) -> Option<(Vec<String>, Vec<String>)> {
        self.quorum_status(via).await.remove(queue)
    }

    /// Members and online members of every queue node `via` lists, by
    /// queue name (empty lists for a classic queue).
    pub async fn quorum_status(&self, via: usize) -> HashMap<String, (Vec<String>, Vec<String>)> {
        let args = [
            "-n",
            self.nodes[via].node_name(),
            "list_queues",
            "--silent",
            "name",
            "members",
            "online",
        ];
        let out = try_rabbitmqctl(&args).await.unwrap_or_default();
        out.lines()
            .filter_map(|line| {
                let mut fields = line.split('\t');
                let name = fields.next()?.trim().to_owned();
                let members = erlang_list(fields.next()?);
                let online = erlang_list(fields.next()?);
                Some((name, (members, online)))
            })
            .collect()
    }

    /// Waits until each of `queues` has every node of the cluster as an
    /// online member (a node back from a restart has caught up).
    pub async fn await_quorum_online(&self, queues: &[String], via: usize) {
        let n = self.nodes.len();
        wait_every(
            &format!("{queues:?} have {n} online members"),
            CLUSTER_JOIN_TIMEOUT,
            || async {
                let status = self.quorum_status(via).await;
                queues.iter().all(|q| {
                    status
                        .get(q)
                        .is_some_and(|(members, online)| members.len() == n && online.len() == n)
                })
            },
        )
        .await;
    }

    /// Every client connection in the cluster (`rabbitmqctl -n <via>
    /// list_connections`, which lists all nodes'): the server port it came
    /// in on, so the node, and its client-provided name.
    pub async fn connections(&self, via: usize) -> Vec<(u16, Option<String>)> {
        let out = self.nodes[via]
            .rabbitmqctl(&["list_connections", "--silent", "port", "client_properties"])
            .await;
        out.lines()
            .filter_map(|line| {
                let (port, props) = line.split_once('\t')?;
                Some((port.trim().parse().ok()?, parse_connection_name(props)))
            })
            .collect()
    }

    /// Stops every node (in parallel) and removes their directories.
    pub async fn stop(mut self) {
        let nodes = std::mem::take(&mut self.nodes);
        futures_util::future::join_all(nodes.into_iter().map(PrivateNode::stop)).await;
    }
}

/// Polls `cond` every [`CTL_POLL_INTERVAL`] until it returns true; panics
/// naming `what` after `timeout`. For conditions that run `rabbitmqctl`,
/// where [`wait_until`]'s 50 ms would keep a core busy.
pub async fn wait_every<F, Fut>(what: &str, timeout: Duration, cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    super::wait_until_every(what, timeout, CTL_POLL_INTERVAL, cond).await;
}

/// `running_nodes` of `rabbitmqctl cluster_status --formatter json` output.
fn running_nodes_in(out: &str) -> Option<Vec<String>> {
    let json: serde_json::Value = serde_json::from_str(&out[out.find('{')?..]).ok()?;
    let nodes = json.get("running_nodes")?.as_array()?;
    Some(
        nodes
            .iter()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect(),
    )
}

/// The atoms of an Erlang list as `rabbitmqctl` prints it:
/// `[rabbit@a, rabbit@b]` or `['sy-1@localhost','sy-2@localhost']`.
fn erlang_list(text: &str) -> Vec<String> {
    text.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|s| s.trim().trim_matches('\'').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Whether process `pid` still runs (a zombie, or no such process, does not).
fn process_alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(Path::new(&format!("/proc/{pid}/stat")));
    match stat {
        Err(_) => false,
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
    }
}
