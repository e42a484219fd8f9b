//! Throughput benchmark: switchyard (in-process, seed-like multicast
//! configuration) against RabbitMQ Shovel on the same broker.
//!
//! ```text
//! cargo run --release --example throughput -- [--messages N] [--size BYTES] [--rounds R]
//! ```
//!
//! Each round, on fresh `bench-<8hex>` names:
//!
//! 1. **switchyard**: N persistent messages are preloaded (confirmed,
//!    pipelined) into the inbound queue, then the forwarder is started with a
//!    configuration shaped like `config/switchyard.toml` (branches "service"
//!    and "logging", each with a backup, nack dead-lettering, prefetch 1000).
//!    Timed until the service and the logging queue both hold N.
//! 2. **shovel-1**: N messages preloaded into a source queue, then one dynamic
//!    shovel (`ack-mode = on-confirm`, `src-prefetch-count = 1000`) is created
//!    with `rabbitmqctl set_parameter`. Timed until the destination holds N.
//! 3. **shovel-2**: two source queues preloaded with N each, two shovels
//!    created in one `rabbitmqctl import_definitions` call, timed until both
//!    destinations hold N: 2N copies, the same amount of output as the
//!    switchyard run (skipped with `--no-dual-shovel`).
//!
//! Everything created is deleted after each round, and at exit even on
//! error or Ctrl-C (as far as the broker lets us). See `bench/README.md` for
//! how to read the figures.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::oneshot;

const DEFAULT_URI: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Interval between two count polls.
const POLL: Duration = Duration::from_millis(20);
/// Bound on any single AMQP operation of the benchmark itself.
const OP_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on one `rabbitmqctl` / `rabbitmq-plugins` call.
const CLI_TIMEOUT: Duration = Duration::from_secs(90);
/// Publishes in flight while preloading.
const PRELOAD_WINDOW: usize = 2000;

#[derive(Parser, Debug)]
#[command(
    about = "Throughput of switchyard (seed-like multicast) vs RabbitMQ Shovel on one broker"
)]
struct Args {
    /// Messages per run (switchyard: inbound messages; shovel: messages per source queue).
    #[arg(long, default_value_t = 20_000)]
    messages: u32,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Rounds; each round runs switchyard, then shovel.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Prefetch for switchyard's inbound consumer and the shovels' src-prefetch-count.
    #[arg(long, default_value_t = 1000)]
    prefetch: u16,
    /// Broker URI used by the benchmark client and by switchyard.
    #[arg(long, default_value = DEFAULT_URI)]
    uri: String,
    /// URI the shovels use: "tcp" (the same URI as switchyard, over loopback
    /// TCP: comparable) or "direct" ("amqp://", the node-local Erlang
    /// connection: no network stack, Shovel's most favourable case).
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "direct"])]
    shovel_uri: String,
    /// Fail a run whose destination counts do not reach N within this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
    /// Fail a run whose destination counts do not move for this many seconds.
    #[arg(long, default_value_t = 30)]
    stall_secs: u64,
    /// Skip the two-shovel (2N copies) variant.
    #[arg(long)]
    no_dual_shovel: bool,
    /// Run switchyard only (no plugin, no shovels, no ratios).
    #[arg(long)]
    skip_shovel: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match bench(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("throughput: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(args: Args) -> Result<ExitCode> {
    if args.messages == 0 || args.rounds == 0 {
        bail!("--messages and --rounds must be at least 1");
    }
    let vhost = vhost_of(&args.uri)?;
    let env = Environment::probe().await;
    env.print(&args);

    let mut shovel_problem = None;
    if !args.skip_shovel {
        match ensure_shovel_plugin().await {
            Ok(note) => println!("shovel plugin:    {note}"),
            Err(e) => {
                println!(
                    "shovel plugin:    UNAVAILABLE: {e:#}\n                  the Shovel baseline is skipped"
                );
                shovel_problem = Some(format!("{e:#}"));
            }
        }
    }
    println!();

    let mut registry = Registry::new(vhost.clone());
    let ctx = Ctx {
        args: &args,
        vhost: &vhost,
        clk_tck: env.clk_tck,
        broker_pid: env.broker_pid,
        shovels: !args.skip_shovel && shovel_problem.is_none(),
    };
    let mut results = Vec::new();
    let outcome = tokio::select! {
        r = run_rounds(&ctx, &mut registry, &mut results) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted (Ctrl-C)")),
    };
    let leftovers = registry.cleanup(&args.uri).await;
    if !leftovers.is_empty() {
        eprintln!(
            "throughput: warning: could not delete everything; left on the broker: {}",
            leftovers.join(", ")
        );
    }
    if !results.is_empty() {
        report(&args, &results);
    }
    outcome?;
    if let Some(problem) = shovel_problem {
        println!("\nShovel baseline NOT measured: {problem}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// What every run needs.
struct Ctx<'a> {
    args: &'a Args,
    vhost: &'a str,
    clk_tck: f64,
    broker_pid: Option<u32>,
    shovels: bool,
}

impl Ctx<'_> {
    fn n(&self) -> u32 {
        self.args.messages
    }

    fn deadline(&self) -> Duration {
        Duration::from_secs(self.args.timeout_secs)
    }

    fn shovel_uri(&self) -> &str {
        if self.args.shovel_uri == "direct" {
            "amqp://"
        } else {
            &self.args.uri
        }
    }
}

async fn run_rounds(ctx: &Ctx<'_>, registry: &mut Registry, results: &mut Vec<Run>) -> Result<()> {
    let mut client = Client::connect(&ctx.args.uri, "bench-client").await?;
    for round in 1..=ctx.args.rounds {
        let run = switchyard_run(ctx, &mut client, registry, round)
            .await
            .with_context(|| format!("round {round}, switchyard"))?;
        run.print_line();
        results.push(run);
        registry.cleanup_with(&mut client).await;
        if ctx.shovels {
            let run = shovel_run(ctx, &mut client, registry, round, 1)
                .await
                .with_context(|| format!("round {round}, shovel-1"))?;
            run.print_line();
            results.push(run);
            registry.cleanup_with(&mut client).await;
            if !ctx.args.no_dual_shovel {
                let run = shovel_run(ctx, &mut client, registry, round, 2)
                    .await
                    .with_context(|| format!("round {round}, shovel-2"))?;
                run.print_line();
                results.push(run);
                registry.cleanup_with(&mut client).await;
            }
        }
    }
    client.close().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// The runs
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum System {
    Switchyard,
    Shovel1,
    Shovel2,
}

impl System {
    fn label(self) -> &'static str {
        match self {
            System::Switchyard => "switchyard",
            System::Shovel1 => "shovel-1",
            System::Shovel2 => "shovel-2",
        }
    }
}

/// One timed run.
struct Run {
    round: u32,
    system: System,
    /// Source messages consumed (switchyard: N; shovel-1: N; shovel-2: 2N).
    messages: u64,
    /// Copies that had to land (switchyard: 2N; shovel-1: N; shovel-2: 2N).
    copies: u64,
    /// Timing of the copies landing.
    progress: Progress,
    /// For shovels: how long the rabbitmqctl call that created them took.
    cli: Option<Duration>,
    cpu: CpuUse,
    /// Anything the post-run check found wrong (duplicates, failovers, dead letters).
    notes: Vec<String>,
}

impl Run {
    /// Source messages per second, start to finish.
    fn e2e_msgs(&self) -> f64 {
        self.messages as f64 / self.progress.total.as_secs_f64()
    }

    /// Copies per second, start to finish.
    fn e2e_copies(&self) -> f64 {
        self.copies as f64 / self.progress.total.as_secs_f64()
    }

    /// Copies per second from the first copy seen to the last.
    fn steady_copies(&self) -> f64 {
        self.progress.steady_rate()
    }

    /// Source messages per second from the first copy seen to the last.
    fn steady_msgs(&self) -> f64 {
        self.steady_copies() * self.messages as f64 / self.copies as f64
    }

    /// CPU microseconds this process spent per copy.
    fn bench_us_per_copy(&self) -> f64 {
        self.cpu.bench * self.cpu.wall * 1e6 / self.copies as f64
    }

    /// CPU microseconds the broker spent per copy.
    fn broker_us_per_copy(&self) -> Option<f64> {
        self.cpu
            .broker
            .map(|b| b * self.cpu.wall * 1e6 / self.copies as f64)
    }

    fn print_line(&self) {
        let cli = self
            .cli
            .map(|d| format!(" (rabbitmqctl {:.2} s)", d.as_secs_f64()))
            .unwrap_or_default();
        println!(
            "round {} {:<10} {:>6} msgs {:>6} copies  total {:>6.2} s  first copy {:>5.2} s{}  \
             steady {:>7.0} msgs/s {:>7.0} copies/s  cpu: bench {} broker {} machine {}",
            self.round,
            self.system.label(),
            self.messages,
            self.copies,
            self.progress.total.as_secs_f64(),
            self.progress.first_at.as_secs_f64(),
            cli,
            self.steady_msgs(),
            self.steady_copies(),
            cores(self.cpu.bench),
            self.cpu.broker.map(cores).unwrap_or_else(|| "n/a".into()),
            cores(self.cpu.machine),
        );
        if let Some(threads) = &self.cpu.threads {
            println!("        bench threads (CPU cores): {threads}");
        }
        for note in &self.notes {
            println!("        NOTE: {note}");
        }
    }
}

fn cores(value: f64) -> String {
    format!("{value:.2}")
}

/// Queue names of a switchyard run.
struct SwitchyardNames {
    inbound: String,
    dlx: String,
    dlq: String,
    service: String,
    service_backup: String,
    logging: String,
    logging_backup: String,
}

impl SwitchyardNames {
    fn new(prefix: &str) -> Self {
        Self {
            inbound: format!("{prefix}.work.in"),
            dlx: format!("{prefix}.work.dlx"),
            dlq: format!("{prefix}.work.dlq"),
            service: format!("{prefix}.service.primary"),
            service_backup: format!("{prefix}.service.backup"),
            logging: format!("{prefix}.logging.primary"),
            logging_backup: format!("{prefix}.logging.backup"),
        }
    }
}

/// The seed scenario (config/switchyard.toml), every name prefixed.
fn seed_config(prefix: &str, uri: &str, prefetch: u16, names: &SwitchyardNames) -> String {
    let q = toml_str;
    format!(
        r#"name = {name}
shutdown_timeout_ms = 10000

[inbound]
broker = "main"
queue = {inbound}
prefetch = {prefetch}
declare = true
single_active_consumer = false

[dead_letter]
mode = "nack"
exchange = {dlx}
routing_key = {dlq}
queue = {dlq}

[brokers.main]
uri = {uri}

[endpoints.primaryServiceQueue]
broker = "main"
exchange = ""
routing_key = {service}
declare_queue = {service}
confirm_timeout_ms = 5000

[endpoints.backupServiceQueue]
broker = "main"
routing_key = {service_backup}
declare_queue = {service_backup}

[endpoints.primaryLoggingQueue]
broker = "main"
routing_key = {logging}
declare_queue = {logging}

[endpoints.backupLoggingQueue]
broker = "main"
routing_key = {logging_backup}
declare_queue = {logging_backup}

[backup_lists]
backupServiceEndpoints = ["backupServiceQueue"]
backupLoggingEndpoints = ["backupLoggingQueue"]

[filters.all]
type = "match_all"

[[filter_table]]
name = "service"
filter = "all"
endpoint = "primaryServiceQueue"
backup_list = "backupServiceEndpoints"

[[filter_table]]
name = "logging"
filter = "all"
endpoint = "primaryLoggingQueue"
backup_list = "backupLoggingEndpoints"
"#,
        name = q(prefix),
        inbound = q(&names.inbound),
        dlx = q(&names.dlx),
        dlq = q(&names.dlq),
        uri = q(uri),
        service = q(&names.service),
        service_backup = q(&names.service_backup),
        logging = q(&names.logging),
        logging_backup = q(&names.logging_backup),
    )
}

async fn switchyard_run(
    ctx: &Ctx<'_>,
    client: &mut Client,
    registry: &mut Registry,
    round: u32,
) -> Result<Run> {
    let prefix = unique_prefix();
    let names = SwitchyardNames::new(&prefix);
    for q in [
        &names.inbound,
        &names.dlq,
        &names.service,
        &names.service_backup,
        &names.logging,
        &names.logging_backup,
    ] {
        registry.queues.push(q.clone());
    }
    registry.exchanges.push(names.dlx.clone());

    let toml = seed_config(&prefix, &ctx.args.uri, ctx.args.prefetch, &names);
    let settings = switchyard::config::load_str(&toml, &format!("<{prefix} config>"))
        .map_err(|e| anyhow!("the generated configuration is invalid: {e}"))?;

    // The inbound queue exactly as switchyard declares it (durable, with its
    // dead-letter arguments), so the forwarder's own declare is a no-op.
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(names.dlx.as_str().into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(names.dlq.as_str().into()),
    );
    client.declare_queue(&names.inbound, args).await?;
    // The endpoint queues too (switchyard declares them the same way), so
    // the poller never asks for a queue that is not there yet.
    for queue in [
        &names.service,
        &names.service_backup,
        &names.logging,
        &names.logging_backup,
    ] {
        client.declare_queue(queue, FieldTable::default()).await?;
    }
    let n = ctx.n();
    client
        .preload(&names.inbound, n, ctx.args.size, &prefix)
        .await?;

    let (stop, stopped) = oneshot::channel::<()>();
    let cpu_before = CpuSnapshot::take(ctx.broker_pid, true);
    let started = Instant::now();
    let mut forwarder = tokio::spawn(switchyard::run(settings, async move {
        // A dropped sender (error path) stops the forwarder too.
        let _ = stopped.await;
    }));
    let watched = [names.service.as_str(), names.logging.as_str()];
    let progress = wait_for_copies(
        client,
        &watched,
        2 * u64::from(n),
        started,
        ctx,
        Driver::Forwarder(&forwarder),
    )
    .await;
    let cpu_after = CpuSnapshot::take(ctx.broker_pid, true);
    let _ = stop.send(());
    let stopped = match tokio::time::timeout(Duration::from_secs(30), &mut forwarder).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(anyhow!("switchyard stopped with an error: {e}")),
        Ok(Err(e)) => Err(anyhow!("the switchyard task failed: {e}")),
        Err(_) => {
            forwarder.abort();
            Err(anyhow!("switchyard did not stop within 30 s of shutdown"))
        }
    };
    let progress = match (progress, stopped) {
        (Ok(progress), Ok(())) => progress,
        (Err(e), Ok(())) => return Err(e),
        (Ok(_), Err(why)) => return Err(why),
        (Err(e), Err(why)) => return Err(e.context(why)),
    };

    let mut notes = Vec::new();
    let expect = [
        (&names.service, u64::from(n)),
        (&names.logging, u64::from(n)),
        (&names.service_backup, 0),
        (&names.logging_backup, 0),
        (&names.dlq, 0),
        (&names.inbound, 0),
    ];
    for (queue, want) in expect {
        let have = client.count(queue).await?;
        if u64::from(have) != want {
            notes.push(format!(
                "after the run {queue} holds {have}, expected {want}"
            ));
        }
    }
    Ok(Run {
        round,
        system: System::Switchyard,
        messages: u64::from(n),
        copies: 2 * u64::from(n),
        progress,
        cli: None,
        cpu: cpu_before.until(&cpu_after, started.elapsed(), ctx.clk_tck),
        notes,
    })
}

async fn shovel_run(
    ctx: &Ctx<'_>,
    client: &mut Client,
    registry: &mut Registry,
    round: u32,
    count: u32,
) -> Result<Run> {
    let prefix = unique_prefix();
    let n = ctx.n();
    let mut pairs = Vec::new();
    for i in 1..=count {
        let src = format!("{prefix}.shovel{i}.src");
        let dst = format!("{prefix}.shovel{i}.dst");
        registry.queues.push(src.clone());
        registry.queues.push(dst.clone());
        client.declare_queue(&src, FieldTable::default()).await?;
        client.declare_queue(&dst, FieldTable::default()).await?;
        client.preload(&src, n, ctx.args.size, &prefix).await?;
        pairs.push((format!("{prefix}-shovel{i}"), src, dst));
    }
    let definitions: Vec<(String, String)> = pairs
        .iter()
        .map(|(name, src, dst)| (name.clone(), shovel_definition(ctx, src, dst)))
        .collect();
    // Registered before the command runs: cleared at the end whatever happens.
    registry
        .shovels
        .extend(definitions.iter().map(|(name, _)| name.clone()));

    let definitions_file =
        (count > 1).then(|| std::env::temp_dir().join(format!("{prefix}-shovels.json")));
    let create: Vec<String> = match &definitions_file {
        None => {
            let (name, value) = &definitions[0];
            vec![
                "set_parameter".into(),
                "-p".into(),
                ctx.vhost.into(),
                "shovel".into(),
                name.clone(),
                value.clone(),
            ]
        }
        Some(path) => {
            // One CLI call creates every shovel, so they start together.
            let parameters: Vec<String> = definitions
                .iter()
                .map(|(name, value)| {
                    format!(
                        r#"{{"vhost":{},"component":"shovel","name":{},"value":{}}}"#,
                        json_str(ctx.vhost),
                        json_str(name),
                        value
                    )
                })
                .collect();
            let body = format!(r#"{{"parameters":[{}]}}"#, parameters.join(","));
            std::fs::write(path, body)
                .with_context(|| format!("cannot write {}", path.display()))?;
            vec!["import_definitions".into(), path.display().to_string()]
        }
    };

    let watched: Vec<&str> = pairs.iter().map(|(_, _, dst)| dst.as_str()).collect();
    let cpu_before = CpuSnapshot::take(ctx.broker_pid, false);
    let started = Instant::now();
    let mut cli_took = None;
    let mut cli = Some(tokio::spawn(async move {
        let args: Vec<&str> = create.iter().map(String::as_str).collect();
        let result = cli_call("rabbitmqctl", &args).await;
        (result, started.elapsed())
    }));
    let progress = wait_for_copies(
        client,
        &watched,
        u64::from(count) * u64::from(n),
        started,
        ctx,
        Driver::Cli {
            task: &mut cli,
            took: &mut cli_took,
        },
    )
    .await;
    let cpu_after = CpuSnapshot::take(ctx.broker_pid, false);
    // Still running: everything landed, or the wait failed, before it returned.
    let pending = match cli.take() {
        None => None,
        Some(mut task) => Some(match tokio::time::timeout(CLI_TIMEOUT, &mut task).await {
            Ok(Ok((Ok(_), took))) => Ok(took),
            Ok(Ok((Err(e), _))) => Err(e.context("creating the shovel")),
            Ok(Err(e)) => Err(anyhow!("the rabbitmqctl task failed: {e}")),
            Err(_) => {
                task.abort();
                Err(anyhow!(
                    "rabbitmqctl did not return within {} s",
                    CLI_TIMEOUT.as_secs()
                ))
            }
        }),
    };
    if let Some(path) = &definitions_file {
        let _ = std::fs::remove_file(path);
    }
    let cli_took = match (cli_took, pending) {
        (Some(took), _) => took,
        (None, Some(Ok(took))) => took,
        (None, Some(Err(e))) => return Err(e),
        // The wait failed on the CLI's own error.
        (None, None) => Duration::ZERO,
    };
    let progress = match progress {
        Ok(p) => p,
        Err(e) => {
            let status = cli_call("rabbitmqctl", &["shovel_status", "-p", ctx.vhost])
                .await
                .unwrap_or_else(|e| format!("(shovel_status failed: {e:#})"));
            return Err(e.context(format!("rabbitmqctl shovel_status:\n{status}")));
        }
    };
    registry.clear_shovels().await;

    let mut notes = Vec::new();
    for (_, _, dst) in &pairs {
        let have = client.count(dst).await?;
        if have != n {
            notes.push(format!("after the run {dst} holds {have}, expected {n}"));
        }
    }
    Ok(Run {
        round,
        system: if count == 1 {
            System::Shovel1
        } else {
            System::Shovel2
        },
        messages: u64::from(count) * u64::from(n),
        copies: u64::from(count) * u64::from(n),
        progress,
        cli: Some(cli_took),
        cpu: cpu_before.until(&cpu_after, started.elapsed(), ctx.clk_tck),
        notes,
    })
}

/// The shovel's parameter value (JSON).
fn shovel_definition(ctx: &Ctx<'_>, src: &str, dst: &str) -> String {
    format!(
        r#"{{"src-protocol":"amqp091","src-uri":{uri},"src-queue":{src},"src-prefetch-count":{prefetch},"dest-protocol":"amqp091","dest-uri":{uri},"dest-queue":{dst},"ack-mode":"on-confirm"}}"#,
        uri = json_str(ctx.shovel_uri()),
        src = json_str(src),
        dst = json_str(dst),
        prefetch = ctx.args.prefetch,
    )
}

/// How the copies landed.
#[derive(Debug, Clone, Copy)]
struct Progress {
    /// From start to the poll that saw every copy.
    total: Duration,
    /// From start to the first poll that saw a copy.
    first_at: Duration,
    /// Copies already there at that first poll.
    first_count: u64,
    /// Copies expected.
    target: u64,
}

impl Progress {
    /// Copies per second between the first poll that saw a copy and the last:
    /// leaves out start-up (connections, topology, the rabbitmqctl VM).
    fn steady_rate(&self) -> f64 {
        let span = self.total.saturating_sub(self.first_at).as_secs_f64();
        let moved = self.target.saturating_sub(self.first_count) as f64;
        if span > 0.0 && moved > 0.0 {
            moved / span
        } else {
            // Everything landed between two polls: fall back to end to end.
            self.target as f64 / self.total.as_secs_f64()
        }
    }
}

type ForwarderTask = tokio::task::JoinHandle<Result<(), switchyard::RunError>>;
type CliTask = tokio::task::JoinHandle<(Result<String>, Duration)>;

/// What makes the copies land, watched while waiting.
enum Driver<'a> {
    /// The in-process forwarder: failing early is an error.
    Forwarder(&'a ForwarderTask),
    /// The rabbitmqctl call that creates the shovels: taken out of `task`
    /// when it ends (an error fails the wait), its duration put in `took`.
    Cli {
        task: &'a mut Option<CliTask>,
        took: &'a mut Option<Duration>,
    },
}

/// Polls the `watched` queues every [`POLL`] until their counts add up to
/// `target`. Fails on the overall timeout, on a stall, when the forwarder
/// stops early or when the CLI that creates the shovels fails.
async fn wait_for_copies(
    client: &mut Client,
    watched: &[&str],
    target: u64,
    started: Instant,
    ctx: &Ctx<'_>,
    mut driver: Driver<'_>,
) -> Result<Progress> {
    let deadline = started + ctx.deadline();
    let stall = Duration::from_secs(ctx.args.stall_secs);
    let mut first: Option<(Duration, u64)> = None;
    let mut last_change = Instant::now();
    let mut last_total = 0u64;
    let mut counts = vec![0u32; watched.len()];
    loop {
        for (i, queue) in watched.iter().enumerate() {
            counts[i] = client.count(queue).await?;
        }
        let now = Instant::now();
        let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        if total > 0 && first.is_none() {
            first = Some((now - started, total));
        }
        if total >= target {
            let (first_at, first_count) = first.unwrap_or((now - started, total));
            return Ok(Progress {
                total: now - started,
                first_at,
                first_count,
                target,
            });
        }
        let describe = || {
            watched
                .iter()
                .zip(&counts)
                .map(|(q, c)| format!("{q}={c}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if total != last_total {
            last_total = total;
            last_change = now;
        } else if now - last_change > stall {
            bail!(
                "no progress for {} s ({} of {target} copies: {})",
                stall.as_secs(),
                total,
                describe()
            );
        }
        if now > deadline {
            bail!(
                "timed out after {} s: {} of {target} copies ({})",
                ctx.args.timeout_secs,
                total,
                describe()
            );
        }
        if let Driver::Forwarder(task) = &driver
            && task.is_finished()
        {
            // The caller collects the reason from the task.
            bail!(
                "switchyard stopped before forwarding everything ({})",
                describe()
            );
        }
        if let Driver::Cli {
            task: cli,
            took: cli_took,
        } = &mut driver
            && cli.as_ref().is_some_and(|task| task.is_finished())
            && let Some(task) = cli.take()
        {
            match task.await {
                Ok((Ok(_), took)) => **cli_took = Some(took),
                Ok((Err(e), _)) => return Err(e.context("creating the shovel")),
                Err(e) => bail!("the rabbitmqctl task failed: {e}"),
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

// ---------------------------------------------------------------------------
// The benchmark's own AMQP client
// ---------------------------------------------------------------------------

struct Client {
    uri: String,
    name: String,
    conn: Connection,
    /// Declares, passive declares (counts) and deletes.
    ops: Channel,
    /// Confirm-mode channel for preloading.
    publish: Channel,
}

impl Client {
    async fn connect(uri: &str, name: &str) -> Result<Self> {
        let conn = with_timeout(
            "connecting",
            Connection::connect(
                uri,
                ConnectionProperties::default().with_connection_name(name.into()),
            ),
        )
        .await
        .with_context(|| format!("cannot connect to {}", redact(uri)))?;
        let ops = with_timeout("opening a channel", conn.create_channel()).await?;
        let publish = with_timeout("opening a channel", conn.create_channel()).await?;
        with_timeout(
            "confirm.select",
            publish.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        Ok(Self {
            uri: uri.to_owned(),
            name: name.to_owned(),
            conn,
            ops,
            publish,
        })
    }

    /// Reopens what an error closed (a refused operation closes its channel).
    async fn heal(&mut self) -> Result<()> {
        if !self.conn.status().connected() {
            *self = Self::connect(&self.uri.clone(), &self.name.clone()).await?;
            return Ok(());
        }
        if !self.ops.status().connected() {
            self.ops = with_timeout("opening a channel", self.conn.create_channel()).await?;
        }
        if !self.publish.status().connected() {
            let publish = with_timeout("opening a channel", self.conn.create_channel()).await?;
            with_timeout(
                "confirm.select",
                publish.confirm_select(ConfirmSelectOptions::default()),
            )
            .await?;
            self.publish = publish;
        }
        Ok(())
    }

    async fn declare_queue(&mut self, queue: &str, args: FieldTable) -> Result<()> {
        self.heal().await?;
        let options = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        with_timeout(
            &format!("declaring queue {queue}"),
            self.ops.queue_declare(queue.into(), options, args),
        )
        .await?;
        Ok(())
    }

    /// Ready messages in `queue` (passive declare).
    async fn count(&mut self, queue: &str) -> Result<u32> {
        self.heal().await?;
        let options = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let q = with_timeout(
            &format!("counting queue {queue}"),
            self.ops
                .queue_declare(queue.into(), options, FieldTable::default()),
        )
        .await?;
        Ok(q.message_count())
    }

    /// Publishes `n` persistent messages of `size` bytes to `queue` through
    /// the default exchange, [`PRELOAD_WINDOW`] confirms in flight, and
    /// checks every confirm.
    async fn preload(&mut self, queue: &str, n: u32, size: usize, prefix: &str) -> Result<()> {
        self.heal().await?;
        let template: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
        let mut in_flight = FuturesUnordered::new();
        let check = |result: Option<lapin::Result<Confirmation>>| -> Result<()> {
            match result {
                Some(Ok(Confirmation::Ack(None))) => Ok(()),
                Some(Ok(Confirmation::Ack(Some(ret)))) => Err(anyhow!(
                    "preload to {queue}: returned {} {}",
                    ret.reply_code,
                    ret.reply_text
                )),
                Some(Ok(other)) => Err(anyhow!("preload to {queue}: {other:?}")),
                Some(Err(e)) => Err(anyhow!("preload to {queue}: {e}")),
                None => Ok(()),
            }
        };
        for i in 0..n {
            let mut body = template.clone();
            let tag = i.to_be_bytes();
            let len = tag.len().min(body.len());
            body[..len].copy_from_slice(&tag[..len]);
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/octet-stream".into())
                .with_message_id(format!("{prefix}-{i}").into());
            let confirm = with_timeout(
                &format!("publishing to {queue}"),
                self.publish.basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &body,
                    properties,
                ),
            )
            .await?;
            in_flight.push(confirm);
            while in_flight.len() >= PRELOAD_WINDOW {
                let next = tokio::time::timeout(OP_TIMEOUT, in_flight.next())
                    .await
                    .map_err(|_| anyhow!("preload to {queue}: no confirm within 15 s"))?;
                check(next)?;
            }
        }
        while !in_flight.is_empty() {
            let next = tokio::time::timeout(OP_TIMEOUT, in_flight.next())
                .await
                .map_err(|_| anyhow!("preload to {queue}: no confirm within 15 s"))?;
            check(next)?;
        }
        let have = self.count(queue).await?;
        if have != n {
            bail!("preloaded {n} messages into {queue} but it holds {have}");
        }
        Ok(())
    }

    async fn delete_queue(&mut self, queue: &str) -> Result<()> {
        self.heal().await?;
        with_timeout(
            &format!("deleting queue {queue}"),
            self.ops
                .queue_delete(queue.into(), QueueDeleteOptions::default()),
        )
        .await?;
        Ok(())
    }

    async fn delete_exchange(&mut self, exchange: &str) -> Result<()> {
        self.heal().await?;
        with_timeout(
            &format!("deleting exchange {exchange}"),
            self.ops
                .exchange_delete(exchange.into(), ExchangeDeleteOptions::default()),
        )
        .await?;
        Ok(())
    }

    async fn close(self) {
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.conn.close(200, "bench done".into()),
        )
        .await;
    }
}

async fn with_timeout<T>(what: &str, op: impl Future<Output = lapin::Result<T>>) -> Result<T> {
    match tokio::time::timeout(OP_TIMEOUT, op).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(anyhow!("{what}: {e}")),
        Err(_) => Err(anyhow!(
            "{what}: no answer from the broker within {} s",
            OP_TIMEOUT.as_secs()
        )),
    }
}

// ---------------------------------------------------------------------------
// Cleanup
// ---------------------------------------------------------------------------

/// Everything created on the broker and not yet deleted.
struct Registry {
    vhost: String,
    queues: Vec<String>,
    exchanges: Vec<String>,
    shovels: Vec<String>,
}

impl Registry {
    fn new(vhost: String) -> Self {
        Self {
            vhost,
            queues: Vec::new(),
            exchanges: Vec::new(),
            shovels: Vec::new(),
        }
    }

    /// Clears the shovel parameters; keeps those that could not be cleared.
    async fn clear_shovels(&mut self) -> Vec<String> {
        let mut failed = Vec::new();
        for name in std::mem::take(&mut self.shovels) {
            let args = [
                "clear_parameter",
                "-p",
                self.vhost.as_str(),
                "shovel",
                &name,
            ];
            if let Err(e) = cli_call("rabbitmqctl", &args).await {
                // Already gone (e.g. the CLI that set it failed) is fine.
                let text = format!("{e:#}");
                if !text.contains("not_found") && !text.contains("Parameter does not exist") {
                    eprintln!("throughput: warning: clearing shovel {name}: {text}");
                    failed.push(format!("shovel parameter {name}"));
                    self.shovels.push(name);
                }
            }
        }
        failed
    }

    /// Deletes everything registered using `client`; keeps what failed.
    async fn cleanup_with(&mut self, client: &mut Client) -> Vec<String> {
        let mut failed = self.clear_shovels().await;
        for queue in std::mem::take(&mut self.queues) {
            if let Err(e) = client.delete_queue(&queue).await {
                eprintln!("throughput: warning: {e:#}");
                failed.push(format!("queue {queue}"));
                self.queues.push(queue);
            }
        }
        for exchange in std::mem::take(&mut self.exchanges) {
            if let Err(e) = client.delete_exchange(&exchange).await {
                eprintln!("throughput: warning: {e:#}");
                failed.push(format!("exchange {exchange}"));
                self.exchanges.push(exchange);
            }
        }
        failed
    }

    /// Final cleanup on a connection of its own (the benchmark's may be gone).
    async fn cleanup(&mut self, uri: &str) -> Vec<String> {
        if self.queues.is_empty() && self.exchanges.is_empty() && self.shovels.is_empty() {
            return Vec::new();
        }
        match Client::connect(uri, "bench-cleanup").await {
            Ok(mut client) => {
                let failed = self.cleanup_with(&mut client).await;
                client.close().await;
                failed
            }
            Err(e) => {
                eprintln!("throughput: warning: cleanup cannot connect: {e:#}");
                let mut failed = self.clear_shovels().await;
                failed.extend(self.queues.iter().map(|q| format!("queue {q}")));
                failed.extend(self.exchanges.iter().map(|x| format!("exchange {x}")));
                failed
            }
        }
    }
}

// ---------------------------------------------------------------------------
// rabbitmqctl
// ---------------------------------------------------------------------------

/// Runs a RabbitMQ CLI tool with a timeout; its stdout, or an error naming
/// the command and quoting its output.
async fn cli_call(program: &str, args: &[&str]) -> Result<String> {
    let shown = format!("{program} {}", args.join(" "));
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(CLI_TIMEOUT, child).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => bail!("cannot run `{shown}`: {e}"),
        Err(_) => bail!(
            "`{shown}` did not finish within {} s",
            CLI_TIMEOUT.as_secs()
        ),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let said = format!("{} {}", stdout.trim(), stderr.trim());
        bail!("`{shown}` failed ({}): {}", output.status, said.trim());
    }
    Ok(stdout)
}

/// Makes sure `rabbitmq_shovel` is enabled; says what was done.
async fn ensure_shovel_plugin() -> Result<String> {
    let enabled = cli_call("rabbitmq-plugins", &["list", "-e", "-m"]).await?;
    if enabled.lines().any(|l| l.trim() == "rabbitmq_shovel") {
        return Ok("rabbitmq_shovel already enabled".to_owned());
    }
    cli_call("rabbitmq-plugins", &["enable", "rabbitmq_shovel"])
        .await
        .context("enabling the shovel plugin")?;
    Ok("rabbitmq_shovel was not enabled: enabled it (`rabbitmq-plugins enable rabbitmq_shovel`); it stays enabled".to_owned())
}

// ---------------------------------------------------------------------------
// CPU accounting from /proc
// ---------------------------------------------------------------------------

/// CPU used during a run, in cores (CPU seconds per wall second).
struct CpuUse {
    /// This process: switchyard in-process plus the poller.
    bench: f64,
    /// The RabbitMQ node (beam.smp), Shovel included.
    broker: Option<f64>,
    /// The whole machine, everyone's processes included.
    machine: f64,
    /// This process by thread name, for switchyard runs.
    threads: Option<String>,
    /// The wall time these averages are over, in seconds.
    wall: f64,
}

struct CpuSnapshot {
    own_ticks: u64,
    broker_ticks: Option<u64>,
    machine_busy: u64,
    machine_total: u64,
    threads: Option<HashMap<String, (String, u64)>>,
}

impl CpuSnapshot {
    fn take(broker_pid: Option<u32>, with_threads: bool) -> Self {
        let (machine_busy, machine_total) = machine_ticks().unwrap_or((0, 0));
        Self {
            own_ticks: stat_ticks("/proc/self/stat").map(|(_, t)| t).unwrap_or(0),
            broker_ticks: broker_pid
                .and_then(|pid| stat_ticks(&format!("/proc/{pid}/stat")).map(|(_, t)| t)),
            machine_busy,
            machine_total,
            threads: with_threads.then(thread_ticks),
        }
    }

    fn until(&self, after: &CpuSnapshot, wall: Duration, clk_tck: f64) -> CpuUse {
        let wall = wall.as_secs_f64().max(1e-6);
        let per_wall = |ticks: u64| ticks as f64 / clk_tck / wall;
        let machine_span = after.machine_total.saturating_sub(self.machine_total);
        let machine = if machine_span > 0 {
            // Busy share of all cores, expressed in cores.
            let busy = after.machine_busy.saturating_sub(self.machine_busy) as f64;
            busy / machine_span as f64 * available_cores()
        } else {
            0.0
        };
        let threads = match (&self.threads, &after.threads) {
            (Some(before), Some(after)) => {
                let mut by_name: HashMap<&str, u64> = HashMap::new();
                for (tid, (name, ticks)) in after {
                    let base = before.get(tid).map(|(_, t)| *t).unwrap_or(0);
                    *by_name.entry(name.as_str()).or_default() += ticks.saturating_sub(base);
                }
                let mut rows: Vec<_> = by_name.into_iter().filter(|(_, t)| *t > 0).collect();
                rows.sort_by_key(|row| std::cmp::Reverse(row.1));
                Some(
                    rows.iter()
                        .map(|(name, t)| format!("{name} {:.2}", per_wall(*t)))
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            }
            _ => None,
        };
        CpuUse {
            bench: per_wall(after.own_ticks.saturating_sub(self.own_ticks)),
            broker: match (self.broker_ticks, after.broker_ticks) {
                (Some(b), Some(a)) => Some(per_wall(a.saturating_sub(b))),
                _ => None,
            },
            machine,
            threads,
            wall,
        }
    }
}

/// (comm, utime + stime) of a /proc stat file.
fn stat_ticks(path: &str) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // After the comm: state is field 3, utime field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

/// tid → (thread name, ticks) for this process.
fn thread_ticks() -> HashMap<String, (String, u64)> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for entry in dir.flatten() {
        let tid = entry.file_name().to_string_lossy().into_owned();
        let path: PathBuf = entry.path().join("stat");
        if let Some(stat) = path.to_str().and_then(stat_ticks) {
            out.insert(tid, stat);
        }
    }
    out
}

/// (busy, total) ticks of the whole machine from /proc/stat.
fn machine_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is inside user).
    let get = |i: usize| values.get(i).copied().unwrap_or(0);
    let idle = get(3) + get(4);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
    Some((busy, busy + idle))
}

fn available_cores() -> f64 {
    std::thread::available_parallelism()
        .map(|n| n.get() as f64)
        .unwrap_or(1.0)
}

// ---------------------------------------------------------------------------
// Environment and report
// ---------------------------------------------------------------------------

struct Environment {
    rabbitmq: String,
    erlang: String,
    broker_pid: Option<u32>,
    clk_tck: f64,
    load: String,
    cpu_model: String,
    git: String,
}

impl Environment {
    async fn probe() -> Self {
        let rabbitmq = cli_call("rabbitmqctl", &["version"])
            .await
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|e| format!("unknown ({e:#})"));
        let erlang = cli_call("rabbitmqctl", &["eval", "erlang:system_info(otp_release)."])
            .await
            .map(|v| v.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|_| "unknown".to_owned());
        let broker_pid = cli_call("rabbitmqctl", &["eval", "os:getpid()."])
            .await
            .ok()
            .and_then(|v| v.trim().trim_matches('"').parse().ok());
        let clk_tck = cli_call("getconf", &["CLK_TCK"])
            .await
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(100.0);
        let load = std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "unknown".to_owned());
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let git = cli_call("git", &["describe", "--always", "--dirty"])
            .await
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned());
        Self {
            rabbitmq,
            erlang,
            broker_pid,
            clk_tck,
            load,
            cpu_model,
            git,
        }
    }

    fn print(&self, args: &Args) {
        println!("switchyard throughput benchmark");
        println!(
            "messages (N):     {}   body: {} bytes, persistent   rounds: {}   prefetch: {}",
            args.messages, args.size, args.rounds, args.prefetch
        );
        println!("broker:           {}", redact(&args.uri));
        println!(
            "RabbitMQ:         {}   Erlang/OTP {}   node OS pid {}",
            self.rabbitmq,
            self.erlang,
            self.broker_pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "unknown (no broker CPU figures)".to_owned())
        );
        println!(
            "machine:          {} cores ({}), load average {}",
            available_cores(),
            self.cpu_model,
            self.load
        );
        println!(
            "switchyard:       {} (git {}), release: {}",
            env!("CARGO_PKG_VERSION"),
            self.git,
            !cfg!(debug_assertions)
        );
        println!(
            "shovel URIs:      {}",
            if args.shovel_uri == "direct" {
                "amqp:// (direct, node-local)"
            } else {
                "same as switchyard (TCP loopback)"
            }
        );
    }
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

fn report(args: &Args, results: &[Run]) {
    println!();
    println!(
        "{:<5} {:<10} {:>7} {:>7} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>6} {:>6} {:>7}",
        "round",
        "system",
        "msgs",
        "copies",
        "total s",
        "first s",
        "e2e msg/s",
        "e2e cp/s",
        "msgs/s",
        "copies/s",
        "bench",
        "broker",
        "machine"
    );
    for r in results {
        println!(
            "{:<5} {:<10} {:>7} {:>7} {:>8.2} {:>8.2} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>6.2} {:>6} {:>7.2}",
            r.round,
            r.system.label(),
            r.messages,
            r.copies,
            r.progress.total.as_secs_f64(),
            r.progress.first_at.as_secs_f64(),
            r.e2e_msgs(),
            r.e2e_copies(),
            r.steady_msgs(),
            r.steady_copies(),
            r.cpu.bench,
            r.cpu
                .broker
                .map(|b| format!("{b:.2}"))
                .unwrap_or_else(|| "n/a".into()),
            r.cpu.machine,
        );
    }
    println!(
        "(msgs/s and copies/s: steady state, first copy seen to last; e2e: from start, \
         shovels including the rabbitmqctl call; CPU columns in cores)"
    );

    let of = |system: System, f: fn(&Run) -> f64| {
        median(
            results
                .iter()
                .filter(|r| r.system == system)
                .map(f)
                .collect(),
        )
    };
    println!();
    println!(
        "medians over {} round(s), N = {}, {} bytes:",
        args.rounds, args.messages, args.size
    );
    let show = |label: &str, v: Option<f64>| {
        if let Some(v) = v {
            println!("  {label:<44} {v:>9.0}");
        }
    };
    let sw_msgs = of(System::Switchyard, Run::steady_msgs);
    let sw_copies = of(System::Switchyard, Run::steady_copies);
    let s1 = of(System::Shovel1, Run::steady_msgs);
    let s2 = of(System::Shovel2, Run::steady_copies);
    show("switchyard   msgs/s (inbound messages)", sw_msgs);
    show("switchyard   copies/s (2 confirmed per msg)", sw_copies);
    show("shovel-1     msgs/s (1 destination)", s1);
    show("shovel-2     copies/s (2 shovels, 2N total)", s2);
    show(
        "switchyard   e2e msgs/s",
        of(System::Switchyard, Run::e2e_msgs),
    );
    show(
        "shovel-1     e2e msgs/s",
        of(System::Shovel1, Run::e2e_msgs),
    );
    show(
        "shovel-2     e2e copies/s",
        of(System::Shovel2, Run::e2e_copies),
    );

    println!();
    println!("CPU per copy (medians, microseconds; the shovels run inside the broker):");
    for system in [System::Switchyard, System::Shovel1, System::Shovel2] {
        let runs: Vec<&Run> = results.iter().filter(|r| r.system == system).collect();
        if runs.is_empty() {
            continue;
        }
        let bench = median(runs.iter().map(|r| r.bench_us_per_copy()).collect());
        let broker = median(runs.iter().filter_map(|r| r.broker_us_per_copy()).collect());
        let total = median(
            runs.iter()
                .filter_map(|r| r.broker_us_per_copy().map(|b| b + r.bench_us_per_copy()))
                .collect(),
        );
        let fmt = |v: Option<f64>| v.map(|v| format!("{v:.0}")).unwrap_or_else(|| "n/a".into());
        println!(
            "  {:<12} bench process {:>5}   broker {:>5}   together {:>5}",
            system.label(),
            fmt(bench),
            fmt(broker),
            fmt(total)
        );
    }

    let ratio = |label: &str, a: Option<f64>, b: Option<f64>| {
        if let (Some(a), Some(b)) = (a, b)
            && b > 0.0
        {
            println!("  {label:<44} {:>9.2}", a / b);
        }
    };
    if s1.is_some() || s2.is_some() {
        println!();
        println!("ratios (medians, steady state; > 1 means switchyard is faster):");
        ratio("switchyard msgs/s   / shovel-1 msgs/s", sw_msgs, s1);
        ratio("switchyard copies/s / shovel-1 msgs/s", sw_copies, s1);
        ratio("switchyard copies/s / shovel-2 copies/s", sw_copies, s2);
    }
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

fn unique_prefix() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("bench-{}", &id[..8])
}

fn vhost_of(uri: &str) -> Result<String> {
    let parsed: lapin::uri::AMQPUri = uri
        .parse()
        .map_err(|e| anyhow!("cannot parse --uri {}: {e}", redact(uri)))?;
    Ok(parsed.vhost)
}

/// The URI without its password.
fn redact(uri: &str) -> String {
    match (uri.find("://"), uri.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &uri[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &uri[..scheme + 3], &uri[at..])
        }
        _ => uri.to_owned(),
    }
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    json_str(s)
}

/// A JSON string (also a valid TOML basic string for what we put in it).
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
