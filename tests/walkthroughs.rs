//! The README's quick start, two-minute walkthrough, "What happened to
//! message X?" and sessions walkthrough, the `curl` walkthrough of
//! `docs/http-ingress.md`, and the maintenance and registration
//! walkthroughs of `docs/operations.md`, run
//! as a reader runs them: each `sh` block of those sections as written,
//! through the real `rabbitmqadmin`, `rabbitmqctl` and `curl`, from the
//! repository's root, with the state the documents state checked after
//! each step. They run in several orders (the walkthrough before and after
//! the others), starting clean as the README says, so none depends on
//! another.
//!
//! They run on a private node with the management plugin. Small wrappers
//! first on `PATH` point the tools at it and nothing else: `rabbitmqctl`
//! gets `-n NODE`, `rabbitmqadmin` the node's management port, `switchyard`
//! (the binary under test) the node's URI and free admin and HTTP ingress
//! ports, `curl` connects to that ingress port whenever it is asked for
//! the seed configuration's `127.0.0.1:8080` (and to that admin port for
//! its `127.0.0.1:9090`), and
//! `cargo run --release -- ARGS` runs that `switchyard ARGS`.

use crate::support;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::harness::Process;
use support::{NodeSetup, PrivateNode, wait_until};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
/// A step's effects, or a forwarder's start, may take this long.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the seed configuration's HTTP ingress listens, as the documents
/// write it.
const SEED_INGRESS: &str = "127.0.0.1:8080";
/// Where its admin endpoint listens.
const SEED_ADMIN: &str = "127.0.0.1:9090";

/// The `sh` blocks of the README section whose heading starts with `heading`.
fn blocks(heading: &str) -> Vec<String> {
    blocks_in("README.md", heading)
}

/// The `sh` blocks of the section of `file` whose heading starts with
/// `heading`.
fn blocks_in(file: &str, heading: &str) -> Vec<String> {
    fenced_in(file, heading, "sh")
}

/// The blocks fenced as `kind` of the section of `file` whose heading
/// starts with `heading`.
fn fenced_in(file: &str, heading: &str, kind: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(REPO).join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let start = readme
        .find(&format!("\n## {heading}"))
        .unwrap_or_else(|| panic!("no section {heading:?} in {file}"));
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let fence = format!("```{kind}\n");
    let mut blocks = Vec::new();
    let mut rest = section;
    while let Some(open) = rest.find(&fence) {
        let body = &rest[open + fence.len()..];
        let close = body
            .find("\n```")
            .unwrap_or_else(|| panic!("unclosed block in {heading:?}"));
        blocks.push(body[..close].to_owned());
        rest = &body[close + 4..];
    }
    blocks
}

/// The event of a log line as the README quotes it (`LEVEL target:
/// message key=value ...`): its message, without the fields.
fn event(line: &str) -> &str {
    let message = line.split_once(": ").map_or(line, |(_, m)| m);
    let fields = message
        .match_indices(' ')
        .find(|(i, _)| {
            let word = &message[i + 1..];
            word.split_once('=').is_some_and(|(key, _)| {
                !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            })
        })
        .map_or(message.len(), |(i, _)| i);
    &message[..fields]
}

/// The node, the wrappers that point the tools at it, and the forwarder a
/// step started.
struct Tour {
    node: PrivateNode,
    bin: PathBuf,
    forwarder: Option<Forwarder>,
}

/// A forwarder a step started, and its log; killed if the test fails.
struct Forwarder {
    child: Child,
    log: PathBuf,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let group = format!("-{}", self.child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = self.child.wait();
            eprintln!("forwarder log kept: {}", self.log.display());
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// `(messages, messages_unacknowledged)` by queue name.
type Queues = BTreeMap<String, (u64, u64)>;

impl Tour {
    async fn start() -> Tour {
        let setup = NodeSetup {
            plugins: vec!["rabbitmq_management".to_owned()],
            ..NodeSetup::default()
        };
        let node = PrivateNode::start_with(setup, |port| {
            format!("management.tcp.port = {port}\nmanagement.tcp.ip = 127.0.0.1\n")
        })
        .await;
        let bin =
            std::env::temp_dir().join(format!("{}-bin", support::unique_prefix("walkthrough")));
        std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .unwrap_or_else(|e| panic!("a free port: {e}"))
                .port()
        };
        let (admin_port, http_port) = (free_port(), free_port());
        let wrappers = [
            (
                "rabbitmqctl",
                format!(
                    "exec {} -n {} \"$@\"",
                    real("rabbitmqctl").display(),
                    node.node_name()
                ),
            ),
            (
                "rabbitmqadmin",
                format!(
                    "exec {} -P {} \"$@\"",
                    real("rabbitmqadmin").display(),
                    node.extra_port()
                ),
            ),
            (
                "switchyard",
                format!(
                    "export SWITCHYARD__BROKERS__MAIN__URI={}\n\
                     export SWITCHYARD__ADMIN__LISTEN=127.0.0.1:{admin_port}\n\
                     export SWITCHYARD__INGRESS__HTTP__LISTEN=127.0.0.1:{http_port}\n\
                     exec {} \"$@\"",
                    node.amqp_url(),
                    Process::binary()
                ),
            ),
            (
                "curl",
                format!(
                    "exec {} --connect-to {SEED_INGRESS}:127.0.0.1:{http_port} \
                     --connect-to {SEED_ADMIN}:127.0.0.1:{admin_port} \"$@\"",
                    real("curl").display()
                ),
            ),
            (
                "cargo",
                "if [ \"$1 $2 $3\" = \"run --release --\" ]; then shift 3; exec switchyard \"$@\"; fi\n\
                 echo \"only cargo run --release -- is wrapped\" >&2; exit 2"
                    .to_owned(),
            ),
        ];
        for (name, body) in wrappers {
            let path = bin.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n"))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let chmod = Command::new("chmod").arg("+x").arg(&path).status();
            assert!(chmod.is_ok_and(|s| s.success()), "chmod {}", path.display());
        }
        let tour = Tour {
            node,
            bin,
            forwarder: None,
        };
        wait_until("the management API answers", STEP_TIMEOUT, || async {
            tour.shell("rabbitmqadmin list queues").status.success()
        })
        .await;
        tour
    }

    /// `script` run by bash from the repository's root, the wrappers first
    /// on `PATH`, with no `SWITCHYARD*` variable of the test's own.
    fn command(&self, script: &str) -> Command {
        let mut cmd = Command::new("bash");
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("SWITCHYARD") {
                cmd.env_remove(key);
            }
        }
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.arg("-c")
            .arg(script)
            .current_dir(REPO)
            .env("PATH", path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null());
        cmd
    }

    fn shell(&self, script: &str) -> Output {
        self.command(script)
            .output()
            .unwrap_or_else(|e| panic!("bash: {e}"))
    }

    /// Runs a block that must succeed; returns its stdout.
    fn step(&self, block: &str) -> String {
        let out = self.shell(block);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success(),
            "{block}\nexit {:?}\nstdout: {stdout}\nstderr: {stderr}",
            out.status.code()
        );
        stdout
    }

    /// Starts the forwarder as `block` does (in the reader's other
    /// terminal) and waits until it consumes.
    async fn start_forwarder(&mut self, block: &str) {
        assert!(self.forwarder.is_none(), "one forwarder at a time");
        assert!(block.contains(" run"), "not a start: {block}");
        let log = std::env::temp_dir().join(format!(
            "{}.log",
            support::unique_prefix("walkthrough-forwarder")
        ));
        let file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}"));
        // A group of its own, which Ctrl-C signals as a whole.
        let child = self
            .command(block)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start the forwarder: {e}"));
        self.forwarder = Some(Forwarder { child, log });
        wait_until("the forwarder consumes", STEP_TIMEOUT, || {
            let log = self.log();
            if let Some(forwarder) = self.forwarder.as_mut()
                && let Ok(Some(status)) = forwarder.child.try_wait()
            {
                panic!("{block}: the forwarder exited ({status}):\n{log}");
            }
            std::future::ready(log.contains("consuming"))
        })
        .await;
    }

    fn log(&self) -> String {
        self.forwarder
            .as_ref()
            .and_then(|f| std::fs::read_to_string(&f.log).ok())
            .unwrap_or_default()
    }

    /// Ctrl-C (SIGINT to the terminal's foreground process group): the
    /// forwarder drains and exits 0.
    async fn stop_forwarder(&mut self) {
        let Some(mut forwarder) = self.forwarder.take() else {
            panic!("no forwarder runs");
        };
        let group = format!("-{}", forwarder.child.id());
        let sent = Command::new("kill").args(["-INT", "--", &group]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -INT");
        let mut status = None;
        wait_until("the forwarder exits", STEP_TIMEOUT, || {
            status = forwarder.child.try_wait().ok().flatten();
            std::future::ready(status.is_some())
        })
        .await;
        let log = std::fs::read_to_string(&forwarder.log).unwrap_or_default();
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{log}");
    }

    /// The node's queues, as `rabbitmqctl list_queues` shows them.
    fn queues(&self) -> Queues {
        let out =
            self.step("rabbitmqctl list_queues --silent name messages messages_unacknowledged");
        out.lines()
            .filter_map(|line| {
                let mut cells = line.split_whitespace();
                let name = cells.next()?.to_owned();
                let messages = cells.next()?.parse().ok()?;
                let unacked = cells.next()?.parse().ok()?;
                Some((name, (messages, unacked)))
            })
            .collect()
    }

    /// Waits until the queues are `expected`: (name, messages, unacked),
    /// with `None` for a queue that must not exist.
    async fn await_queues(&self, what: &str, expected: &[(&str, Option<(u64, u64)>)]) {
        let mut last = Queues::new();
        let matches = |queues: &Queues| {
            expected
                .iter()
                .all(|(name, want)| queues.get(*name).copied() == *want)
        };
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            last = self.queues();
            if matches(&last) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "{what}: expected {expected:?}, the node has {last:?}\nforwarder log:\n{}",
            self.log()
        );
    }

    /// The bodies and `x-switchyard-replay` headers of `queue`, in order,
    /// read without removing them.
    fn peek(&self, queue: &str) -> Vec<(String, bool)> {
        let out = self.step(&format!(
            "rabbitmqadmin -f raw_json get queue={queue} count=100 ackmode=ack_requeue_true"
        ));
        let messages: Vec<Value> =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        messages
            .iter()
            .map(|m| {
                let body = m["payload"].as_str().unwrap_or_default().to_owned();
                let replay = m["properties"]["headers"]["x-switchyard-replay"] == Value::Bool(true);
                (body, replay)
            })
            .collect()
    }

    async fn finish(mut self) {
        if self.forwarder.is_some() {
            self.stop_forwarder().await;
        }
        let _ = std::fs::remove_dir_all(&self.bin);
        self.node.stop().await;
    }
}

/// The program `name` as found on `PATH` (not a wrapper).
fn real(name: &str) -> PathBuf {
    let out = Command::new("which")
        .arg(name)
        .output()
        .unwrap_or_else(|e| panic!("which {name}: {e}"));
    let path = text(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && !path.is_empty(),
        "{name} must be on the PATH (it comes with RabbitMQ's packages)"
    );
    PathBuf::from(path)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const SEED_QUEUES: [&str; 6] = [
    "work.in",
    "work.dlq",
    "service.primary",
    "service.backup",
    "logging.primary",
    "logging.backup",
];

/// The quick start: start, publish, look, stop; then start clean and check.
async fn quick_start(tour: &mut Tour) {
    let b = blocks("Quick start");
    assert_eq!(b.len(), 5, "start, publish, get, start clean, check: {b:?}");
    tour.start_forwarder(&b[0]).await;
    let quoted = &fenced_in("README.md", "Quick start", "text")[0];
    let log = tour.log();
    let mut rest = log.as_str();
    for line in quoted.lines() {
        let event = event(line);
        let at = rest
            .find(event)
            .unwrap_or_else(|| panic!("the log has {event:?} after the lines before it:\n{log}"));
        rest = &rest[at + event.len()..];
    }
    let answer = tour.step(&b[1]);
    assert!(
        answer.contains(r#""delivered":["service","logging"]"#)
            && answer.contains(r#""outcome":"accepted""#)
            && answer.contains("\"}\nstatus 202\n"),
        "the curl line's answer, then its status: {answer:?}"
    );
    tour.await_queues(
        "two messages, one from the queue and one over HTTP, in each branch's primary",
        &[
            ("service.primary", Some((2, 0))),
            ("logging.primary", Some((2, 0))),
            ("work.in", Some((0, 0))),
            ("service.backup", Some((0, 0))),
            ("logging.backup", Some((0, 0))),
        ],
    )
    .await;
    let copy = tour.step(&b[2]);
    for needle in [
        r#""payload": "{\"order\": 0}""#,
        "x-switchyard-hops",
        "x-switchyard-copy-id",
        "x-switchyard-publish-id",
        r#""message_id": "order-"#,
    ] {
        assert!(copy.contains(needle), "the copy shows {needle:?}:\n{copy}");
    }
    tour.await_queues(
        "the copy looked at is back on its queue",
        &[("service.primary", Some((2, 0)))],
    )
    .await;
    tour.stop_forwarder().await;
    start_clean(tour).await;
    let summary = tour.step(&b[4]);
    assert!(
        summary.contains(": ok")
            && summary.contains("sessions: off")
            && summary.contains("http ingress: http://127.0.0.1:"),
        "{summary}"
    );
}

/// The quick start's "starting clean": every queue and the exchange gone.
async fn start_clean(tour: &Tour) {
    let clean = &blocks("Quick start")[3];
    assert!(clean.contains("delete"), "{clean}");
    tour.shell(clean);
    let gone: Vec<(&str, Option<(u64, u64)>)> = SEED_QUEUES.iter().map(|q| (*q, None)).collect();
    tour.await_queues("a clean start", &gone).await;
    let exchanges = tour.step("rabbitmqctl list_exchanges --silent name");
    assert!(
        !exchanges.lines().any(|l| l.trim() == "work.dlx"),
        "{exchanges}"
    );
}

/// The two-minute walkthrough, from a clean start to a clean start.
async fn walkthrough(tour: &mut Tour) {
    let b = blocks("A two-minute walkthrough");
    assert_eq!(b.len(), 5, "five steps: {b:?}");
    tour.start_forwarder(&b[0]).await;

    tour.step(&b[1]);
    tour.await_queues(
        "2. multicast to both branches",
        &[
            ("service.primary", Some((1, 0))),
            ("logging.primary", Some((1, 0))),
            ("work.in", Some((0, 0))),
        ],
    )
    .await;

    tour.step(&b[2]);
    tour.await_queues(
        "3. the service branch broken",
        &[
            ("service.primary", None),
            ("service.backup", None),
            ("logging.primary", Some((2, 0))),
            ("work.dlq", Some((1, 0))),
            ("work.in", Some((0, 0))),
        ],
    )
    .await;
    let log = tour.log();
    for line in [
        "failover",
        "backup list exhausted",
        "dead-lettered",
        "reason=\"exhausted\"",
    ] {
        assert!(log.contains(line), "3. the log has {line:?}:\n{log}");
    }

    let listing = tour.step(&b[3]);
    for needle in ["order-2", "exhausted", "service", "logging", "work.in"] {
        assert!(
            listing.contains(needle),
            "4. inspect shows {needle:?}:\n{listing}"
        );
    }

    tour.step(&b[4]);
    tour.await_queues(
        "5. redriven to the service branch only",
        &[
            ("service.primary", Some((1, 0))),
            ("service.backup", Some((0, 0))),
            ("logging.primary", Some((2, 0))),
            ("work.dlq", Some((0, 0))),
            ("work.in", Some((0, 0))),
        ],
    )
    .await;
    assert_eq!(
        tour.peek("service.primary"),
        [("{\"order\": 2}".to_owned(), false)]
    );
    tour.stop_forwarder().await;
    start_clean(tour).await;
}

/// "What happened to message X?", from a clean start to a clean start:
/// a failover, then `switchyard trace` in both forms.
async fn journal_walkthrough(tour: &mut Tour) {
    let b = blocks("What happened to message X?");
    assert_eq!(
        b.len(),
        4,
        "start, break and publish, trace, trace --json: {b:?}"
    );
    tour.start_forwarder(&b[0]).await;
    tour.step(&b[1]);
    tour.await_queues(
        "2. the service copy failed over",
        &[
            ("service.primary", None),
            ("service.backup", Some((1, 0))),
            ("logging.primary", Some((1, 0))),
            ("work.in", Some((0, 0))),
        ],
    )
    .await;
    // The record is written a moment after the message is acked.
    let mut timeline = String::new();
    wait_until("3. trace finds the order", STEP_TIMEOUT, || {
        let out = tour.shell(&b[2]);
        timeline = text(&out.stdout);
        std::future::ready(out.status.success())
    })
    .await;
    let quoted = &fenced_in("README.md", "What happened to message X?", "text")[0];
    for needle in [
        "switchyard  queue  acked",
        "message order-4711  trace 0af7651916cd43dd8448eb211c80319c",
        "primaryServiceQueue  returned (reply 312)",
        "backupServiceQueue   confirmed",
        "primaryLoggingQueue  confirmed",
    ] {
        assert!(quoted.contains(needle), "the README shows {needle:?}");
        assert!(
            timeline.contains(needle),
            "3. trace prints {needle:?}:\n{timeline}"
        );
    }
    let json = tour.step(&b[3]);
    let record: Value = serde_json::from_str(json.trim())
        .unwrap_or_else(|e| panic!("4. one JSON record ({e}): {json}"));
    assert_eq!(record["verdict"], "acked");
    assert_eq!(record["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    let copy =
        tour.step("rabbitmqadmin -f pretty_json get queue=service.backup ackmode=ack_requeue_true");
    assert!(
        copy.contains("00-0af7651916cd43dd8448eb211c80319c-"),
        "the copy carries the producer's trace on:\n{copy}"
    );
    tour.stop_forwarder().await;
    start_clean(tour).await;
}

/// The sessions walkthrough, from a clean start to a clean start.
async fn sessions_walkthrough(tour: &mut Tour) {
    let b = blocks("Sessions");
    assert_eq!(b.len(), 4, "four steps: {b:?}");
    tour.start_forwarder(&b[0]).await;
    let log = tour.log();
    assert!(
        log.contains("idle_timeout_ms 600000") && log.contains("sessions=\"on"),
        "1. the starting line shows the sessions settings:\n{log}"
    );

    tour.step(&b[1]);
    tour.await_queues(
        "2. the session open, its acks held",
        &[
            ("service.primary", Some((2, 0))),
            ("logging.primary", Some((2, 0))),
            ("work.in", Some((2, 2))),
        ],
    )
    .await;

    tour.step(&b[2]);
    tour.await_queues(
        "3. the session completed on the backup",
        &[
            ("service.primary", None),
            ("service.backup", Some((4, 0))),
            ("logging.primary", Some((4, 0))),
            ("work.in", Some((0, 0))),
        ],
    )
    .await;
    let log = tour.log();
    for line in [
        "session failover; replaying the session to the next endpoint",
        "replaying=2",
        "session completed",
    ] {
        assert!(log.contains(line), "3. the log has {line:?}:\n{log}");
    }
    let part = |n: u32, replay: bool| (format!("part {n}"), replay);
    assert_eq!(
        tour.peek("service.backup"),
        [part(1, true), part(2, true), part(3, false), part(4, false)]
    );
    let logging: Vec<(String, bool)> = (1..=4).map(|n| part(n, false)).collect();
    assert_eq!(tour.peek("logging.primary"), logging);

    let listing = tour.step(&b[3]);
    assert!(listing.contains("session-closed"), "4.:\n{listing}");
    tour.await_queues("4. the late message", &[("work.dlq", Some((1, 0)))])
        .await;
    tour.stop_forwarder().await;
    start_clean(tour).await;
}

/// `curl -si` printed `status` (the status line) and each of `needles`.
fn assert_answer(step: &str, out: &str, status: &str, needles: &[&str]) {
    assert!(
        out.contains(&format!("HTTP/1.1 {status}")),
        "{step}: the answer is {status}:\n{out}"
    );
    for needle in needles {
        assert!(
            out.contains(needle),
            "{step}: the answer has {needle}:\n{out}"
        );
    }
}

/// The `curl` walkthrough of `docs/http-ingress.md`, from a clean start to
/// a clean start.
async fn http_walkthrough(tour: &mut Tour) {
    let b = blocks_in("docs/http-ingress.md", "A walkthrough with curl");
    assert_eq!(b.len(), 6, "six steps: {b:?}");
    tour.start_forwarder(&b[0]).await;
    let log = tour.log();
    assert!(log.contains("HTTP ingress listening"), "1.:\n{log}");

    let out = tour.step(&b[1]);
    assert_answer(
        "2. a message over HTTP",
        &out,
        "202 Accepted",
        &[
            r#""delivered":["service","logging"]"#,
            r#""message_id":"order-41""#,
        ],
    );
    tour.await_queues(
        "2. a copy in each branch's primary",
        &[
            ("service.primary", Some((1, 0))),
            ("logging.primary", Some((1, 0))),
            ("work.in", Some((0, 0))),
        ],
    )
    .await;

    let out = tour.step(&b[2]);
    let copies: Vec<Value> = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let [copy] = copies.as_slice() else {
        panic!("3. one copy in service.primary: {out}");
    };
    let properties = &copy["properties"];
    assert_eq!(copy["payload"], "{\"order\": 41}", "3.: {out}");
    assert_eq!(properties["message_id"], "order-41", "3.: {out}");
    assert_eq!(properties["content_type"], "application/json", "3.: {out}");
    assert_eq!(properties["delivery_mode"], 2, "3.: {out}");
    assert!(properties["timestamp"].is_u64(), "3.: {out}");
    let headers = properties["headers"]
        .as_object()
        .unwrap_or_else(|| panic!("3. the copy has headers: {out}"));
    assert_eq!(
        headers["x-switchyard-copy-id"], "service:order-41",
        "3.: {out}"
    );
    assert!(
        !headers.keys().any(|k| k.starts_with("x-switchyard-http")),
        "3. the forwarder's own request headers are not on the copy: {out}"
    );

    let out = tour.step(&b[3]);
    assert_answer(
        "4. the service branch broken",
        &out,
        "502 Bad Gateway",
        &[
            r#""delivered":["logging"]"#,
            r#""branch":"service""#,
            r#""endpoint":"backupServiceQueue""#,
            "NO_ROUTE",
        ],
    );
    tour.await_queues(
        "4. logging has its copy, nothing dead-lettered",
        &[
            ("service.primary", None),
            ("service.backup", None),
            ("logging.primary", Some((2, 0))),
            ("work.dlq", Some((0, 0))),
        ],
    )
    .await;
    let log = tour.log();
    for line in [
        "failover",
        "backup list exhausted",
        "HTTP request failed",
        "code=502",
    ] {
        assert!(log.contains(line), "4. the log has {line:?}:\n{log}");
    }

    let out = tour.step(&b[4]);
    assert_answer(
        "5. the retry after the fix",
        &out,
        "202 Accepted",
        &[r#""delivered":["logging","service"]"#],
    );
    tour.await_queues(
        "5. only the service copy sent",
        &[
            ("service.primary", Some((1, 0))),
            ("service.backup", Some((0, 0))),
            ("logging.primary", Some((2, 0))),
            ("work.dlq", Some((0, 0))),
        ],
    )
    .await;
    assert_eq!(
        tour.peek("service.primary"),
        [("{\"order\": 42}".to_owned(), false)]
    );

    let out = tour.step(&b[5]);
    assert_answer(
        "6. the retries",
        &out,
        "200 OK",
        &[r#""delivered":["logging","service"]"#],
    );
    assert_answer(
        "6. another body",
        &out,
        "409 Conflict",
        &[r#""outcome":"conflict""#],
    );
    tour.await_queues(
        "6. nothing sent again",
        &[
            ("service.primary", Some((1, 0))),
            ("logging.primary", Some((2, 0))),
            ("work.dlq", Some((0, 0))),
        ],
    )
    .await;
    tour.stop_forwarder().await;
    start_clean(tour).await;
}

/// "Maintenance without a reload" in `docs/operations.md`: a drain, an
/// undrain, a pause and a resume with `switchyard ctl`.
async fn maintenance_walkthrough(tour: &mut Tour) {
    let b = blocks_in("docs/operations.md", "Maintenance without a reload");
    assert_eq!(b.len(), 4, "four steps: {b:?}");
    tour.start_forwarder(&b[0]).await;

    let out = tour.step(&b[1]);
    assert!(out.contains("drained primaryServiceQueue"), "2.: {out}");
    tour.await_queues(
        "2. the service copy on the backup",
        &[
            ("service.primary", Some((0, 0))),
            ("service.backup", Some((1, 0))),
            ("logging.primary", Some((1, 0))),
            ("work.in", Some((0, 0))),
        ],
    )
    .await;
    let log = tour.log();
    assert!(
        log.contains("endpoint drained"),
        "2. the log says so:\n{log}"
    );
    assert!(!log.contains(": failover "), "2. no failover:\n{log}");
    assert!(
        !log.contains("ops-secret"),
        "2. the token is never logged:\n{log}"
    );

    let out = tour.step(&b[2]);
    assert!(
        out.contains("paused: yes"),
        "3. the status says paused: {out}"
    );
    assert!(
        out.contains("primaryServiceQueue          up"),
        "3. undrained: {out}"
    );
    tour.await_queues(
        "3. the message waits in the forwarder, unacked",
        &[
            ("service.primary", Some((0, 0))),
            ("logging.primary", Some((1, 0))),
            ("work.in", Some((1, 1))),
        ],
    )
    .await;

    let out = tour.step(&b[3]);
    assert!(out.contains("resumed"), "4.: {out}");
    tour.await_queues(
        "4. delivered on resume",
        &[
            ("service.primary", Some((1, 0))),
            ("service.backup", Some((1, 0))),
            ("logging.primary", Some((2, 0))),
            ("work.in", Some((0, 0))),
            ("work.dlq", Some((0, 0))),
        ],
    )
    .await;
    tour.stop_forwarder().await;
    start_clean(tour).await;
}

/// "Services that register themselves" in `docs/operations.md`: a
/// service's start and stop hooks with `curl`.
async fn registry_walkthrough(tour: &mut Tour) {
    let b = blocks_in("docs/operations.md", "Services that register themselves");
    assert_eq!(b.len(), 3, "three steps: {b:?}");
    tour.start_forwarder(&b[0]).await;

    let out = tour.step(&b[1]);
    let status = json_line(&out);
    assert_eq!(status["registrations"][0]["name"], "worker-1", "2.: {out}");
    tour.await_queues(
        "2. the job on the registered instance",
        &[
            ("worker.1", Some((1, 0))),
            ("logging.primary", Some((1, 0))),
            ("work.in", Some((0, 0))),
        ],
    )
    .await;

    let out = tour.step(&b[2]);
    let status = json_line(&out);
    assert_eq!(status["registrations"], serde_json::json!([]), "3.: {out}");
    tour.await_queues(
        "3. the next job waits in the forwarder for an instance",
        &[
            ("worker.1", Some((1, 0))),
            ("logging.primary", Some((1, 0))),
            ("work.in", Some((1, 1))),
            ("work.dlq", Some((0, 0))),
        ],
    )
    .await;
    tour.stop_forwarder().await;
    tour.step("rabbitmqadmin delete queue name=worker.1");
    start_clean(tour).await;
}

/// The one line of `out` that is a JSON object (what `curl` printed
/// among the other tools' lines).
fn json_line(out: &str) -> Value {
    let line = out.lines().find(|l| l.starts_with('{'));
    let line = line.unwrap_or_else(|| panic!("no JSON line in {out}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[tokio::test]
async fn the_walkthroughs_run_as_written_in_any_order() {
    let mut tour = Tour::start().await;
    quick_start(&mut tour).await;
    walkthrough(&mut tour).await;
    http_walkthrough(&mut tour).await;
    maintenance_walkthrough(&mut tour).await;
    journal_walkthrough(&mut tour).await;
    registry_walkthrough(&mut tour).await;
    sessions_walkthrough(&mut tour).await;
    walkthrough(&mut tour).await;
    tour.finish().await;
}
