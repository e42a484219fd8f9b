//! `PrivateNode`: a RabbitMQ node of the test's own, for faults that must
//! never touch the shared broker (app restarts, memory alarms, policies).
//!
//! Each node has its own name, AMQP and distribution ports, configuration
//! file (`listeners.tcp.local`, `loopback_users = none`, and whatever a test
//! adds with [`PrivateNode::start_with_conf`]), plugin file and
//! data and log directories under a temporary base directory. It is stopped
//! and its directory removed by [`PrivateNode::stop`] or on drop.

use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use lapin::{Connection, ConnectionProperties};

use super::rabbitmqctl::parse_connection_name;
use super::{BrokerConnection, rabbitmqctl, try_rabbitmqctl, wait_until};

/// Bound on a node's boot (and on the app's start after `start_app`).
pub const NODE_START_TIMEOUT: Duration = Duration::from_secs(90);
/// The memory watermark that raises the alarm at once (a fraction of RAM far below use).
const ALARM_WATERMARK: &str = "0.0001";
/// RabbitMQ's default watermark, which clears the alarm.
const DEFAULT_WATERMARK: &str = "0.4";

/// A RabbitMQ node started for one test (or one test binary).
pub struct PrivateNode {
    name: String,
    port: u16,
    dist_port: u16,
    base: PathBuf,
    stopped: bool,
    /// A third free port, for a listener the test configures itself.
    extra_port: u16,
    /// Lines added to `rabbitmq.conf`.
    extra_conf: String,
    setup: NodeSetup,
}

/// What a node starts with beyond the defaults (no plugins, any CPU).
#[derive(Debug, Clone, Default)]
pub struct NodeSetup {
    /// Plugins enabled from the start (`rabbitmq_shovel`...).
    pub plugins: Vec<String>,
    /// A CPU list (`taskset -c` syntax, e.g. `"0"`) the node is started on;
    /// the Erlang VM sizes its schedulers to it.
    pub cpus: Option<String>,
}

impl PrivateNode {
    /// Starts a node on free ports and waits until it accepts AMQP connections.
    pub async fn start() -> PrivateNode {
        Self::start_with_conf(|_| String::new()).await
    }

    /// [`Self::start`] with the lines `extra(port)` returns added to the
    /// node's `rabbitmq.conf`; `port` is a free port of the node's own
    /// (a TLS listener, say), also given by [`Self::extra_port`].
    pub async fn start_with_conf(extra: impl FnOnce(u16) -> String) -> PrivateNode {
        Self::start_with(NodeSetup::default(), extra).await
    }

    /// [`Self::start_with_conf`] with plugins enabled and the node confined
    /// to CPUs as `setup` says.
    pub async fn start_with(setup: NodeSetup, extra: impl FnOnce(u16) -> String) -> PrivateNode {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("sy-{}@localhost", &id[..8]);
        let base = std::env::temp_dir().join(format!("sy-node-{}", &id[..8]));
        let (port, dist_port) = free_ports();
        let extra_port = free_port(&[port, dist_port]);
        let node = PrivateNode {
            name,
            port,
            dist_port,
            base,
            stopped: false,
            extra_port,
            extra_conf: extra(extra_port),
            setup,
        };
        node.write_files();
        node.launch();
        node.await_boot().await;
        node
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`.
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// The free port handed to [`Self::start_with_conf`]'s configuration.
    pub fn extra_port(&self) -> u16 {
        self.extra_port
    }

    /// The node's AMQP listener.
    pub fn amqp_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The operating-system pid of the node's Erlang VM (from its pid file),
    /// for its CPU and memory in `/proc`.
    pub fn os_pid(&self) -> Option<u32> {
        read_pid(&self.pid_file())
    }

    /// The Erlang node name (`sy-<hex>@localhost`), as `rabbitmqctl -n` takes it.
    pub fn node_name(&self) -> &str {
        &self.name
    }

    /// Runs `rabbitmqctl -n <this node> <args>`; returns stdout, panics on failure.
    pub async fn rabbitmqctl(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        rabbitmqctl(&full).await
    }

    /// Stops the RabbitMQ application (the Erlang node stays up): every
    /// client connection is closed and the AMQP port stops listening.
    pub async fn stop_app(&self) {
        self.rabbitmqctl(&["stop_app"]).await;
    }

    /// Starts the application again and waits until it accepts AMQP connections.
    pub async fn start_app(&self) {
        self.rabbitmqctl(&["start_app"]).await;
        self.await_amqp().await;
    }

    /// `stop_app` then `start_app`: a broker restart as clients see it.
    pub async fn restart_app(&self) {
        self.stop_app().await;
        self.start_app().await;
    }

    /// Raises (`true`) or clears (`false`) the memory alarm by moving the
    /// high watermark far below, or back to, the node's memory use. While it
    /// is raised the node blocks every connection that publishes.
    pub async fn set_memory_alarm(&self, on: bool) {
        let watermark = if on {
            ALARM_WATERMARK
        } else {
            DEFAULT_WATERMARK
        };
        self.rabbitmqctl(&["set_vm_memory_high_watermark", watermark])
            .await;
    }

    /// Whether a memory alarm is in force (`rabbitmqctl eval` of the alarm list).
    pub async fn memory_alarm(&self) -> bool {
        let out = self
            .rabbitmqctl(&["eval", "rabbit_alarm:get_alarms()."])
            .await;
        out.contains("memory")
    }

    /// Sets policy `name` on queues matching `pattern` with the JSON `definition`.
    pub async fn set_policy(&self, name: &str, pattern: &str, definition: &str, priority: u32) {
        let priority = priority.to_string();
        self.rabbitmqctl(&[
            "set_policy",
            "--apply-to",
            "queues",
            "--priority",
            &priority,
            name,
            pattern,
            definition,
        ])
        .await;
    }

    /// Removes policy `name`; one that does not exist is not an error.
    pub async fn clear_policy(&self, name: &str) {
        let args = ["-n", self.name.as_str(), "clear_policy", name];
        if let Err(e) = try_rabbitmqctl(&args).await
            && !e.contains("does not exist")
        {
            panic!("rabbitmqctl {args:?} failed: {e}");
        }
    }

    /// Prepares `queue` (existing or not) for [`Self::refuse_publishes`]: a
    /// standing policy gives it `overflow = reject-publish`. A max-length
    /// policy applied to a queue still in the default `drop-head` mode drops
    /// what the queue holds beyond the limit; one applied while the queue is
    /// already in `reject-publish` mode only refuses new publishes.
    pub async fn allow_refusal(&self, queue: &str) {
        let pattern = format!("^{}$", regex::escape(queue));
        self.set_policy(
            &format!("{queue}-overflow"),
            &pattern,
            r#"{"overflow":"reject-publish"}"#,
            1,
        )
        .await;
    }

    /// While `on`, `queue` nacks every publish (max-length 0 with
    /// reject-publish) and keeps what it holds; `off` restores it. Call
    /// [`Self::allow_refusal`] first.
    pub async fn refuse_publishes(&self, queue: &str, on: bool) {
        let name = format!("{queue}-refuse");
        if on {
            let pattern = format!("^{}$", regex::escape(queue));
            self.set_policy(
                &name,
                &pattern,
                r#"{"max-length":0,"overflow":"reject-publish"}"#,
                2,
            )
            .await;
        } else {
            self.clear_policy(&name).await;
        }
    }

    /// `(messages_ready, messages_unacknowledged)` of `queue`; `None` if it is missing.
    pub async fn ready_unacked(&self, queue: &str) -> Option<(u64, u64)> {
        super::rabbitmqctl::ready_unacked_in(&self.queue_table().await, queue)
    }

    /// Every queue's name, ready and unacked counts, one line each: read
    /// several queues of it with `ready_unacked_in` for one call.
    pub async fn queue_table(&self) -> String {
        self.rabbitmqctl(&[
            "list_queues",
            "--silent",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ])
        .await
    }

    /// Every client connection on this node with its client-provided name.
    pub async fn connections(&self) -> Vec<BrokerConnection> {
        let out = self
            .rabbitmqctl(&["list_connections", "--silent", "pid", "client_properties"])
            .await;
        out.lines()
            .filter_map(|line| {
                let (pid, props) = line.split_once('\t')?;
                let pid = pid.trim();
                pid.starts_with('<').then(|| BrokerConnection {
                    pid: pid.to_string(),
                    name: parse_connection_name(props),
                })
            })
            .collect()
    }

    /// Client-provided names of the connections the node has blocked (or
    /// will block at their next publish) under a resource alarm.
    pub async fn blocked_connections(&self) -> Vec<String> {
        let out = self
            .rabbitmqctl(&["list_connections", "--silent", "state", "client_properties"])
            .await;
        out.lines()
            .filter_map(|line| {
                let (state, props) = line.split_once('\t')?;
                matches!(state.trim(), "blocked" | "blocking")
                    .then(|| parse_connection_name(props))
                    .flatten()
            })
            .collect()
    }

    /// Closes every connection on this node whose name contains `fragment`; returns how many.
    pub async fn close_connections_named(&self, fragment: &str) -> usize {
        let mut closed = 0;
        for conn in self.connections().await {
            if conn.name.as_deref().is_some_and(|n| n.contains(fragment)) {
                // The connection may have gone by itself since the listing.
                let mut args = vec!["-n", self.name.as_str()];
                args.extend(["close_connection", conn.pid.as_str(), "test fault"]);
                if try_rabbitmqctl(&args).await.is_ok() {
                    closed += 1;
                }
            }
        }
        closed
    }

    /// The last `lines` lines of the node's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.base.join("log").join(format!("{}.log", self.name)))
            .unwrap_or_default();
        super::harness::log_tail(&log, lines)
    }

    /// Boots again a node whose Erlang VM is gone (SIGKILLed): same name,
    /// ports and data directory; waits as [`Self::start`] does. Its stale
    /// pid file is removed first, or the boot would be taken for a crash.
    pub async fn relaunch(&self) {
        let _ = std::fs::remove_file(self.pid_file());
        self.launch();
        self.await_boot().await;
    }

    /// Stops the node and removes its directory.
    pub async fn stop(mut self) {
        let name = self.name.clone();
        let pid_file = self.pid_file();
        let base = self.base.clone();
        self.stopped = true;
        tokio::task::spawn_blocking(move || shut_down(&name, &pid_file, &base))
            .await
            .expect("node shutdown task panicked");
    }

    fn pid_file(&self) -> PathBuf {
        self.base.join("pid")
    }

    fn write_files(&self) {
        for dir in ["mnesia", "log"] {
            std::fs::create_dir_all(self.base.join(dir))
                .unwrap_or_else(|e| panic!("create {}: {e}", self.base.display()));
        }
        std::fs::write(
            self.base.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.local = 127.0.0.1:{}\nloopback_users = none\n{}\n",
                self.port, self.extra_conf
            ),
        )
        .unwrap_or_else(|e| panic!("write rabbitmq.conf: {e}"));
        let plugins = format!("[{}].\n", self.setup.plugins.join(","));
        std::fs::write(self.base.join("enabled_plugins"), plugins)
            .unwrap_or_else(|e| panic!("write enabled_plugins: {e}"));
        // rabbitmq-server started as root runs itself as the rabbitmq user,
        // which must own everything it writes.
        let status = Command::new("chown")
            .args(["-R", "rabbitmq:"])
            .arg(&self.base)
            .status()
            .unwrap_or_else(|e| panic!("chown: {e}"));
        assert!(
            status.success(),
            "chown -R rabbitmq: {}",
            self.base.display()
        );
    }

    fn launch(&self) {
        let base = &self.base;
        let mut command = match &self.setup.cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.args(["-c", cpus, "rabbitmq-server"]);
                c
            }
            None => Command::new("rabbitmq-server"),
        };
        let status = command
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", base.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", base.join("log"))
            .env("RABBITMQ_PID_FILE", self.pid_file())
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                base.join("enabled_plugins"),
            )
            .env("RABBITMQ_CONFIG_FILE", base.join("rabbitmq.conf"))
            .env("ERL_CRASH_DUMP", base.join("erl_crash.dump"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run rabbitmq-server: {e}"));
        assert!(status.success(), "rabbitmq-server -detached: {status}");
    }

    /// Waits for the Erlang node (its distribution port), then for the app
    /// (`await_startup`), then for the AMQP listener.
    async fn await_boot(&self) {
        let dist = SocketAddr::from(([127, 0, 0, 1], self.dist_port));
        let pid_file = self.pid_file();
        let what = format!("node {} listens on {dist}", self.name);
        let deadline = tokio::time::Instant::now() + NODE_START_TIMEOUT;
        loop {
            if tokio::net::TcpStream::connect(dist).await.is_ok() {
                break;
            }
            if let Some(pid) = read_pid(&pid_file)
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                panic!(
                    "node {} (pid {pid}) died while booting; log:\n{}",
                    self.name,
                    self.log_tail(40)
                );
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out after {NODE_START_TIMEOUT:?} waiting until {what}; log:\n{}",
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let timeout = NODE_START_TIMEOUT.as_secs().to_string();
        self.rabbitmqctl(&["await_startup", "--timeout", &timeout])
            .await;
        self.await_amqp().await;
    }

    /// Waits until an AMQP connection can be opened (and closes it).
    async fn await_amqp(&self) {
        let url = self.amqp_url();
        wait_until(
            &format!("node {} accepts AMQP connections", self.name),
            NODE_START_TIMEOUT,
            || {
                let url = url.clone();
                async move {
                    let attempt = tokio::time::timeout(
                        Duration::from_secs(5),
                        Connection::connect(
                            &url,
                            ConnectionProperties::default()
                                .with_connection_name("sy-node-probe".into()),
                        ),
                    )
                    .await;
                    match attempt {
                        Ok(Ok(conn)) => {
                            let _ = conn.close(200, "OK".into()).await;
                            true
                        }
                        _ => false,
                    }
                }
            },
        )
        .await;
    }
}

impl Drop for PrivateNode {
    fn drop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            shut_down(&self.name, &self.pid_file(), &self.base);
        }
    }
}

/// `rabbitmqctl -n NODE stop PIDFILE` (SIGKILL if that fails), then removes `base`.
fn shut_down(name: &str, pid_file: &Path, base: &Path) {
    let stopped = Command::new("rabbitmqctl")
        .args(["-n", name, "stop"])
        .arg(pid_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !stopped && let Some(pid) = read_pid(pid_file) {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    let _ = std::fs::remove_dir_all(base);
}

fn read_pid(pid_file: &Path) -> Option<u32> {
    std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()
}

/// Two distinct free ports for the AMQP listener and Erlang distribution,
/// drawn from 20000-32767: below Linux's ephemeral range, so an outgoing
/// connection cannot take one between this check and the node's bind.
fn free_ports() -> (u16, u16) {
    let amqp = free_port(&[]);
    (amqp, free_port(&[amqp]))
}

/// A free port in 20000-32767 other than those in `avoid` (see [`free_ports`]).
fn free_port(avoid: &[u16]) -> u16 {
    loop {
        let port = fastrand::u16(20000..32768);
        if !avoid.contains(&port)
            && port != 25672
            && StdTcpListener::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
}
