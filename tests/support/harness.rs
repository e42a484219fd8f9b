//! Running switchyard inside a test: configuration text with the test's
//! prefix, the forwarder started in-process (or as a real process), and
//! waiting until it consumes.

use super::config::{Branch, Endpoint, Filter, Forwarder};
use super::{DEFAULT_TIMEOUT, TestBroker, amqp_str, amqp_url, field_table, procfs, wait_until};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use switchyard::{Options, RunError, Telemetry};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The inbound, dead-letter and broker sections for `prefix`: inbound queue
/// `<prefix>.in`, dead-letter exchange `<prefix>.dlx`, queue `<prefix>.dlq`;
/// a 5 s shutdown bound and prefetch 500.
pub fn base_toml(prefix: &str, dead_letter_mode: &str) -> String {
    top_toml(prefix, dead_letter_mode, 5000, 500)
}

/// [`base_toml`] with a chosen shutdown bound and prefetch. The instance is
/// named `prefix`, so its connections are too.
pub fn top_toml(
    prefix: &str,
    dead_letter_mode: &str,
    shutdown_timeout_ms: u64,
    prefetch: u32,
) -> String {
    top_toml_at(
        &amqp_url(),
        prefix,
        dead_letter_mode,
        shutdown_timeout_ms,
        prefetch,
    )
}

/// [`top_toml`] with broker "main" at `url` (a private node, say).
pub fn top_toml_at(
    url: &str,
    prefix: &str,
    dead_letter_mode: &str,
    shutdown_timeout_ms: u64,
    prefetch: u32,
) -> String {
    Forwarder::at(url, prefix)
        .mode(dead_letter_mode)
        .top("shutdown_timeout_ms", shutdown_timeout_ms)
        .inbound("prefetch", prefetch)
        .toml()
}

/// The seed scenario's shape after `top` (from [`base_toml`] or
/// [`top_toml`]): branches "service" and "logging" over every message, each
/// with a one-endpoint backup list; queues `<p>.service`,
/// `<p>.service.backup`, `<p>.logging`, `<p>.logging.backup`
/// ([`Forwarder::seed`]).
pub fn seed_toml(p: &str, top: &str) -> String {
    format!("{top}{}", Forwarder::new(p).seed(p).routing_toml())
}

/// The smallest forwarding shape after `top`: one branch "service" over
/// every message to queue `<p>.service`, no backup list.
pub fn match_all_toml(p: &str, top: &str) -> String {
    format!("{top}{}", Forwarder::new(p).match_all(p).routing_toml())
}

/// Declares the inbound queue `<p>.in` exactly as a forwarder on
/// [`top_toml`] in `nack` mode declares it (durable, dead-letter exchange
/// `<p>.dlx` and routing key `<p>.dlq`), so it can be filled before the
/// forwarder starts.
pub async fn declare_inbound(broker: &TestBroker, p: &str) {
    let args = field_table([
        ("x-dead-letter-exchange", amqp_str(&format!("{p}.dlx"))),
        ("x-dead-letter-routing-key", amqp_str(&format!("{p}.dlq"))),
    ]);
    broker.declare_queue_with(&format!("{p}.in"), args).await;
}

/// Declares the inbound queue `<p>.in` as a quorum queue, exactly as a
/// forwarder on [`top_toml`] in `nack` mode with `inbound.queue_type =
/// "quorum"` creates it: [`declare_inbound`]'s arguments, the type, and
/// at-least-once dead-lettering (`x-dead-letter-strategy`, with the
/// `x-overflow = reject-publish` it needs).
pub async fn declare_inbound_quorum(broker: &TestBroker, p: &str) {
    let args = field_table([
        ("x-queue-type", amqp_str("quorum")),
        ("x-dead-letter-exchange", amqp_str(&format!("{p}.dlx"))),
        ("x-dead-letter-routing-key", amqp_str(&format!("{p}.dlq"))),
        ("x-dead-letter-strategy", amqp_str("at-least-once")),
        ("x-overflow", amqp_str("reject-publish")),
    ]);
    broker.declare_queue_with(&format!("{p}.in"), args).await;
}

/// One branch "service" over every message: endpoint `primary`, then the
/// backup list `["backup"]`; `brokers` adds `[brokers.X]` tables, and
/// `primary` and `backup` are [`endpoint_toml`]s.
pub fn one_branch_toml(p: &str, mode: &str, brokers: &str, primary: &str, backup: &str) -> String {
    let routing = Forwarder::new(p)
        .backup_list("backups", &["backup"])
        .filter("all", Filter::match_all())
        .branch(Branch::new("service", "all", "primary").backups("backups"));
    format!(
        "{base}{brokers}{primary}{backup}{}",
        routing.routing_toml(),
        base = base_toml(p, mode),
    )
}

/// An endpoint on broker `broker` publishing to queue `queue` through the
/// default exchange, declaring it unless `declare` is false; `extra` is
/// more of its keys, as TOML lines.
pub fn endpoint_toml(name: &str, broker: &str, queue: &str, declare: bool, extra: &str) -> String {
    let mut endpoint = Endpoint::queue(name, queue).on(broker);
    if !declare {
        endpoint = endpoint.undeclared();
    }
    let table = Forwarder::new("-").endpoint(endpoint).routing_toml();
    format!("{table}{extra}\n")
}

/// A forwarder running in this process.
pub struct InProcess {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), RunError>>,
    telemetry: Telemetry,
}

impl InProcess {
    /// Compiles `toml` (panicking on an invalid one) and starts the forwarder.
    pub fn start(toml: &str) -> Self {
        Self::start_with(toml, Options::default())
    }

    /// [`InProcess::start`] with `options` (an admin listener, fail-fast).
    pub fn start_with(toml: &str, options: Options) -> Self {
        init_logs();
        let settings =
            switchyard::config::load_str(toml, "test.toml").unwrap_or_else(|e| panic!("{e}"));
        let (stop, stopped) = oneshot::channel::<()>();
        let telemetry = options.telemetry.clone();
        let task = tokio::spawn(switchyard::run_with(settings, options, async {
            let _ = stopped.await;
        }));
        Self {
            stop: Some(stop),
            task,
            telemetry,
        }
    }

    /// This forwarder's own metrics and events.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// Starts the forwarder and waits until it consumes from `queue`.
    pub async fn start_consuming(toml: &str, broker: &TestBroker, queue: &str) -> Self {
        let running = Self::start(toml);
        wait_consumers(broker, queue, 1).await;
        running
    }

    /// Signals shutdown and waits for `run` to return.
    pub async fn stop(mut self) -> Result<(), RunError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => panic!("forwarder task failed: {e}"),
        }
    }

    /// Waits for `run` to return on its own (a startup error).
    pub async fn finished(self) -> Result<(), RunError> {
        match tokio::time::timeout(DEFAULT_TIMEOUT, self.task).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => panic!("forwarder task failed: {e}"),
            Err(_) => panic!("forwarder did not stop on its own"),
        }
    }
}

/// Consumer count of `queue`, `None` when it does not exist.
pub async fn consumer_count(broker: &TestBroker, queue: &str) -> Option<u32> {
    broker.probe_queue(queue).await.map(|q| q.consumer_count())
}

/// Waits until `queue` has exactly `n` consumers.
pub async fn wait_consumers(broker: &TestBroker, queue: &str, n: u32) {
    wait_until(
        &format!("{queue} has {n} consumer(s)"),
        DEFAULT_TIMEOUT,
        || async { consumer_count(broker, queue).await == Some(n) },
    )
    .await;
}

/// The switchyard binary with none of the test's `SWITCHYARD*` or backtrace variables inherited.
pub fn clean_command() -> Command {
    let mut command = Command::new(Process::binary());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("SWITCHYARD") {
            command.env_remove(key);
        }
    }
    command
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    command
}

/// The last `lines` lines of `log`, for failure messages.
pub fn log_tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What a [`Process`] is started through.
#[derive(Debug, Clone, Copy)]
pub enum Wrap<'a> {
    /// The program itself.
    Direct,
    /// `taskset -c <cpus>` (e.g. `"1"`), which execs the program: confined
    /// from its first instruction, and the pid stays the program's.
    Pinned(&'a str),
    /// valgrind's callgrind, counting the program's instructions into this
    /// file when it exits. The program runs inside valgrind's process, so
    /// the pid and signals are its own; it cannot follow an `exec`.
    Callgrind(&'a std::path::Path),
}

/// The switchyard binary run as a real process on a configuration file.
pub struct Process {
    child: Child,
    /// Where its log goes.
    pub log_path: std::path::PathBuf,
    /// The configuration file it was started on, if any.
    config_path: Option<std::path::PathBuf>,
    /// Keep both files when it is dropped ([`Process::keep_files`]).
    keep: bool,
}

impl Process {
    /// Writes `toml` to a temporary file and starts `switchyard run` on it.
    pub fn spawn(prefix: &str, toml: &str) -> Self {
        Self::spawn_with(prefix, toml, &[], &[])
    }

    /// [`Process::spawn`] with extra arguments (`--log-format=X` goes before
    /// `run`, the others after it) and environment variables (`RUST_LOG` is
    /// `info` unless given).
    pub fn spawn_with(prefix: &str, toml: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::launch(prefix, toml, args, env, Wrap::Direct)
    }

    /// [`Process::spawn_with`] started through `wrap` (pinned to CPUs, or
    /// under callgrind).
    pub fn spawn_through(
        prefix: &str,
        toml: &str,
        wrap: Wrap<'_>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::launch(prefix, toml, args, env, wrap)
    }

    fn launch(
        prefix: &str,
        toml: &str,
        args: &[&str],
        env: &[(&str, &str)],
        wrap: Wrap<'_>,
    ) -> Self {
        // A file of its own: another process of the same test may start
        // on the same prefix while this one still runs.
        let config_path = std::env::temp_dir().join(format!("{prefix}-{}.toml", uuid_suffix()));
        std::fs::write(&config_path, toml).unwrap_or_else(|e| panic!("write config: {e}"));
        let (global, local): (Vec<&str>, Vec<&str>) =
            args.iter().partition(|a| a.starts_with("--log-format"));
        let config = config_path.display().to_string();
        let mut argv = global;
        argv.extend(["run", "--config", config.as_str()]);
        argv.extend(local);
        let mut env_with_log = vec![("RUST_LOG", "info")];
        env_with_log.extend_from_slice(env);
        let binary = std::path::Path::new(env!("CARGO_BIN_EXE_switchyard"));
        let mut process = Self::start(prefix, binary, &argv, &env_with_log, wrap);
        process.config_path = Some(config_path);
        process
    }

    /// Another program (`program args...`) as a process of its own, with
    /// the same handling as the forwarder's: stdout discarded, stderr in a
    /// log named after `prefix`, started through `wrap`.
    pub fn spawn_program(
        prefix: &str,
        program: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
        wrap: Wrap<'_>,
    ) -> Self {
        Self::start(prefix, program, args, env, wrap)
    }

    /// Starts `program args...` with `env` added (a later pair wins), stdout
    /// discarded and stderr in a log named after `prefix`, through `wrap`.
    fn start(
        prefix: &str,
        program: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
        wrap: Wrap<'_>,
    ) -> Self {
        let log_path = std::env::temp_dir().join(format!("{prefix}-{}.log", uuid_suffix()));
        let log = std::fs::File::create(&log_path).unwrap_or_else(|e| panic!("create log: {e}"));
        let mut command = match wrap {
            Wrap::Direct => Command::new(program),
            Wrap::Pinned(cpus) => {
                let mut c = Command::new("taskset");
                c.args(["-c", cpus]).arg(program);
                c
            }
            Wrap::Callgrind(out) => {
                let mut c = Command::new("valgrind");
                c.arg("--tool=callgrind")
                    .arg(format!("--callgrind-out-file={}", out.display()))
                    .arg(program);
                c
            }
        };
        let child = command
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        Self {
            child,
            log_path,
            config_path: None,
            keep: false,
        }
    }

    /// The configuration file it runs on (the forwarder reloads it when it
    /// changes); `None` for another program.
    pub fn config_path(&self) -> Option<&std::path::Path> {
        self.config_path.as_deref()
    }

    /// The path of the binary [`Process::spawn`] runs.
    pub fn binary() -> &'static str {
        env!("CARGO_BIN_EXE_switchyard")
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's resident memory in KiB, from `/proc`.
    pub fn rss_kib(&self) -> u64 {
        procfs::status_kib(self.pid(), "VmRSS").unwrap_or(0)
    }

    /// The process's peak resident memory so far (`VmHWM`) in KiB; 0 once it has exited.
    pub fn peak_rss_kib(&self) -> u64 {
        procfs::status_kib(self.pid(), "VmHWM").unwrap_or(0)
    }

    /// The CPU time (user + system, all threads) the process has used, in
    /// clock ticks; `None` once it has exited.
    pub fn cpu_ticks(&self) -> Option<u64> {
        procfs::cpu_ticks(self.pid())
    }

    /// Removes the configuration and log files it was started with (a run
    /// that went well needs neither).
    pub fn remove_files(&self) {
        if let Some(config_path) = &self.config_path {
            let _ = std::fs::remove_file(config_path);
        }
        let _ = std::fs::remove_file(&self.log_path);
    }

    /// Keeps the configuration and log files when it is dropped, for a
    /// caller that reports them.
    pub fn keep_files(&mut self) {
        self.keep = true;
    }

    /// Where its log is written.
    pub fn log_path(&self) -> &std::path::Path {
        &self.log_path
    }

    /// Sends `signal` (e.g. "KILL", "TERM") to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .unwrap_or_else(|e| panic!("kill: {e}"));
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit and returns its exit code.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .unwrap_or_else(|e| panic!("wait: {e}"))
            {
                return status.code();
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "switchyard did not exit within {timeout:?}; log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process's exit status if it has exited, without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .try_wait()
            .unwrap_or_else(|e| panic!("wait: {e}"))
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Process {
    /// Kills the process if it still runs. Its configuration and log are
    /// removed, unless the test is failing: then they are kept, and their
    /// paths printed with the test's output.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.keep {
            return;
        }
        if std::thread::panicking() {
            eprintln!(
                "kept for the failed test: log {}{}",
                self.log_path.display(),
                self.config_path
                    .as_ref()
                    .map(|p| format!(", configuration {}", p.display()))
                    .unwrap_or_default()
            );
        } else {
            self.remove_files();
        }
    }
}

fn uuid_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}

/// With `SWITCHYARD_TEST_LOG` set (an `EnvFilter` such as `info` or
/// `switchyard=debug`), the in-process forwarder's logs go to the test output.
fn init_logs() {
    if let Ok(filter) = std::env::var("SWITCHYARD_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}
