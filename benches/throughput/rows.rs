//! The rows of the table: what each one declares, preloads and starts, and
//! what it checks afterwards. Every name starts with the row's prefix; a
//! row's [`Topology`] is known before it starts, so it is removed whatever
//! happens to the row. Every queue is durable: classic, or with `--quorum`
//! a quorum queue, whoever declares it (the benchmark, or the forwarder on
//! its configuration).

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::{BasicProperties, ExchangeKind};
use serde_json::json;
use tokio_util::task::AbortOnDropHandle;

use crate::against::Against;
use crate::bare;
use crate::callgrind;
use crate::support::TestBroker;
use crate::support::config::Forwarder;
use crate::support::harness::{
    Process, Wrap, declare_inbound, declare_inbound_quorum, wait_consumers,
};
use crate::support::otlp::OtlpReceiver;
use crate::target::Target;
use crate::window::{Mover, Watch, Window};

/// Publishes in flight while preloading.
const PRELOAD_WINDOW: usize = 2000;
/// How long the forwarder may take to finish after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// One kind of run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Row {
    /// One shovel, preloaded queue to one queue.
    S,
    /// The bare lapin forwarder (`bare.rs`), queue to one queue: the floor
    /// of client and broker under F1.
    B1,
    /// B1 adding to each copy the two headers switchyard adds (hops and
    /// publish id): what carrying them costs the broker and the client.
    B1H,
    /// The forwarder, one `match_all` branch to one queue.
    F1,
    /// One shovel into a fanout exchange bound to two queues.
    S2,
    /// Two shovels side by side, each queue to queue.
    TwoS,
    /// The forwarder, the seed scenario: two branches, each with a backup,
    /// as shipped (the journal on, no span export).
    F2,
    /// F2 with the journal off (`[journal] enabled = false`): what the
    /// journal costs.
    F2N,
    /// F2 with control off (`[control] enabled = false`): what following
    /// the group costs.
    F2C,
    /// F2 with the journal and control off: the forwarder without either,
    /// as before them.
    F2X,
    /// F2 exporting spans over OTLP/HTTP at full sampling to a receiver in
    /// the benchmark's process: what export costs.
    F2T,
}

impl Row {
    /// The default run's rows, in the order of the table.
    pub const DEFAULT: [Row; 8] = [
        Row::S,
        Row::B1,
        Row::F1,
        Row::S2,
        Row::TwoS,
        Row::F2N,
        Row::F2,
        Row::F2T,
    ];
    /// Every row, in the order of the table.
    pub const ALL: [Row; 11] = [
        Row::S,
        Row::B1,
        Row::B1H,
        Row::F1,
        Row::S2,
        Row::TwoS,
        Row::F2N,
        Row::F2C,
        Row::F2X,
        Row::F2,
        Row::F2T,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Row::S => "S",
            Row::B1 => "B1",
            Row::B1H => "B1H",
            Row::F1 => "F1",
            Row::S2 => "S2",
            Row::TwoS => "2S",
            Row::F2 => "F2",
            Row::F2N => "F2N",
            Row::F2C => "F2C",
            Row::F2X => "F2X",
            Row::F2T => "F2T",
        }
    }

    pub fn what(self) -> &'static str {
        match self {
            Row::S => "Shovel, queue → 1 queue",
            Row::B1 => "lapin floor, 1 branch → 1 queue",
            Row::B1H => "lapin floor + switchyard's 2 headers",
            Row::F1 => "switchyard, 1 branch → 1 queue",
            Row::S2 => "Shovel → fanout → 2 queues",
            Row::TwoS => "2 Shovels side by side",
            Row::F2 => "switchyard, seed: 2 branches + backups",
            Row::F2N => "F2, journal off",
            Row::F2C => "F2, control off",
            Row::F2X => "F2, journal and control off",
            Row::F2T => "F2 + OTLP span export, all sampled",
        }
    }

    /// Copies landed per source message consumed.
    pub fn copies_per_msg(self) -> u64 {
        match self {
            Row::S | Row::B1 | Row::B1H | Row::F1 | Row::TwoS => 1,
            Row::S2 | Row::F2 | Row::F2N | Row::F2C | Row::F2X | Row::F2T => 2,
        }
    }

    /// switchyard's rows of the body-size sweep and of `--against`.
    pub fn is_forwarder(self) -> bool {
        matches!(self, Row::F1 | Row::F2)
    }

    /// Rows moved by Shovel inside the broker; the others by a process of their own.
    pub fn is_shovel(self) -> bool {
        matches!(self, Row::S | Row::S2 | Row::TwoS)
    }
}

impl FromStr for Row {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Row::ALL
            .into_iter()
            .find(|r| r.label().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!("unknown row {s:?} (rows: S, B1, B1H, F1, S2, 2S, F2N, F2C, F2X, F2, F2T)")
            })
    }
}

/// Which build of switchyard a forwarder row runs: this one, or the one
/// given by `--against`. The other rows always run once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    This,
    Against,
}

/// What every row needs.
pub struct Ctx {
    pub target: Target,
    pub prefetch: u32,
    /// Every queue a quorum queue (`--quorum`).
    pub quorum: bool,
    /// The URI the shovels use for both ends.
    pub shovel_uri: String,
    pub stall: Duration,
    pub clock_ticks: f64,
    /// CPUs the forwarder is confined to (split-cores mode).
    pub forwarder_cpus: Option<String>,
    /// Where callgrind writes its counts when the forwarder rows run under
    /// it (`--instructions`).
    pub callgrind: Option<std::path::PathBuf>,
    /// Where callgrind's counts are kept (`--keep-counts`).
    pub keep_counts: Option<std::path::PathBuf>,
    /// The other build of `--against`.
    pub against: Option<Against>,
    /// F2T's collector: the kit's OTLP/HTTP receiver, counting the spans
    /// it decodes, in this process; started when F2T is among the rows.
    pub otlp: Option<OtlpReceiver>,
}

/// One run of one row.
#[derive(Debug, Clone)]
pub struct Plan {
    pub row: Row,
    pub build: Build,
    pub round: u32,
    /// Messages preloaded into each source queue.
    pub backlog: u64,
    pub size: usize,
    /// Every name of the run starts with it.
    pub prefix: String,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub plan: Plan,
    pub window: Window,
    /// The forwarder's peak resident memory (VmHWM), KiB.
    pub peak_rss_kib: Option<u64>,
    /// The forwarder's instructions, start to exit, under callgrind.
    pub instructions: Option<u64>,
    /// Spans the OTLP receiver decoded, start to exit (F2T).
    pub spans: Option<u64>,
    /// What the check after the run found wrong.
    pub notes: Vec<String>,
}

impl Plan {
    /// The row's label, primed for the other build's run (F1').
    pub fn label(&self) -> String {
        match self.build {
            Build::This => self.row.label().to_owned(),
            Build::Against => format!("{}'", self.row.label()),
        }
    }
}

impl Outcome {
    pub fn copies_per_sec(&self) -> f64 {
        self.window.copies_per_sec()
    }

    pub fn msgs_per_sec(&self) -> f64 {
        self.copies_per_sec() / self.plan.row.copies_per_msg() as f64
    }

    pub fn forwarder_us(&self) -> Option<f64> {
        self.window.us_per_copy(self.window.mover_cpu)
    }

    pub fn broker_us(&self) -> Option<f64> {
        self.window.us_per_copy(self.window.broker_cpu)
    }

    /// Spans exported per message of the backlog (F2T).
    pub fn spans_per_msg(&self) -> Option<f64> {
        Some(self.spans? as f64 / self.plan.backlog as f64)
    }

    /// One progress line.
    pub fn line(&self) -> String {
        let w = &self.window;
        let opt =
            |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
        let mut line = format!(
            "round {} {:<3} {:>6} B × {:<7} {:>6.0} msgs/s {:>6.0} copies/s  µs/copy forwarder {:>4} broker {:>4}  \
             window {:.2} s after {:.2} s  others {} cores",
            self.plan.round,
            self.plan.label(),
            self.plan.size,
            self.plan.backlog,
            self.msgs_per_sec(),
            self.copies_per_sec(),
            opt(self.forwarder_us(), 0),
            opt(self.broker_us(), 0),
            w.secs,
            w.start_up.as_secs_f64(),
            opt(w.others_cores(), 2),
        );
        if let Some(kib) = self.peak_rss_kib {
            line.push_str(&format!("  peak RSS {:.1} MiB", kib as f64 / 1024.0));
        }
        if let Some(per_msg) = self.spans_per_msg() {
            line.push_str(&format!("  spans {per_msg:.2}/msg"));
        }
        if w.whole_run {
            line.push_str("  (window = whole run: the copies landed before the start-up ended)");
        }
        for note in &self.notes {
            line.push_str(&format!("\n    NOTE: {note}"));
        }
        line
    }
}

/// The names a run creates, known before it starts.
#[derive(Debug, Default, Clone)]
pub struct Topology {
    pub queues: Vec<String>,
    pub exchanges: Vec<String>,
    pub shovels: Vec<String>,
}

impl Topology {
    pub fn of(row: Row, p: &str) -> Self {
        let q = |s: &str| format!("{p}.{s}");
        match row {
            Row::S => Self {
                queues: vec![q("src"), q("dst")],
                shovels: vec![format!("{p}-shovel")],
                ..Self::default()
            },
            Row::S2 => Self {
                queues: vec![q("src"), q("dst1"), q("dst2")],
                exchanges: vec![q("fanout")],
                shovels: vec![format!("{p}-shovel")],
            },
            Row::TwoS => Self {
                queues: vec![q("src1"), q("dst1"), q("src2"), q("dst2")],
                shovels: vec![format!("{p}-shovel1"), format!("{p}-shovel2")],
                ..Self::default()
            },
            // F1's names; the bare forwarder declares nothing and dead-letters nothing.
            Row::B1 | Row::B1H => Self {
                queues: vec![q("in"), q("service")],
                ..Self::default()
            },
            // The journal's stream too (F2N declares none; deleting it is harmless).
            Row::F1 => Self {
                queues: vec![q("in"), q("dlq"), q("service"), q("journal")],
                exchanges: vec![q("dlx")],
                ..Self::default()
            },
            Row::F2 | Row::F2N | Row::F2C | Row::F2X | Row::F2T => Self {
                queues: vec![
                    q("in"),
                    q("dlq"),
                    q("service"),
                    q("service.backup"),
                    q("logging"),
                    q("logging.backup"),
                    q("journal"),
                ],
                exchanges: vec![q("dlx")],
                ..Self::default()
            },
        }
    }

    /// What [`start_seed_shovel`] creates.
    pub fn of_seed_shovel(p: &str) -> Self {
        let q = |s: &str| format!("{p}.{s}");
        Self {
            queues: vec![q("in"), q("service"), q("logging")],
            exchanges: vec![q("fanout")],
            shovels: vec![format!("{p}-shovel")],
        }
    }

    /// Removes it all: shovels first, then queues and exchanges.
    pub async fn remove(&self, target: &Target, p: &str) {
        for shovel in &self.shovels {
            target.clear_shovel(shovel).await;
        }
        let broker = target.connect(&format!("{p}-cleanup")).await;
        let queues: Vec<&str> = self.queues.iter().map(String::as_str).collect();
        let exchanges: Vec<&str> = self.exchanges.iter().map(String::as_str).collect();
        broker.cleanup(&queues, &exchanges).await;
        broker.close().await;
    }
}

/// Runs `plan` in a task of its own and removes its topology afterwards,
/// whether it finished, failed or panicked.
pub async fn run(ctx: Arc<Ctx>, plan: Plan) -> Result<Outcome, String> {
    let topology = Topology::of(plan.row, &plan.prefix);
    // Aborted when the benchmark is (Ctrl-C): its forwarder is killed then.
    let task = AbortOnDropHandle::new(tokio::spawn(run_plan(ctx.clone(), plan.clone())));
    let result = task.await.map_err(|e| {
        format!(
            "round {} {} ({} B) failed: {e}",
            plan.round,
            plan.label(),
            plan.size
        )
    });
    topology.remove(&ctx.target, &plan.prefix).await;
    result
}

async fn run_plan(ctx: Arc<Ctx>, plan: Plan) -> Outcome {
    let p = &plan.prefix;
    let broker = ctx.target.connect(&format!("{p}-bench")).await;
    let outcome = if plan.row.is_shovel() {
        shovels(&ctx, &broker, &plan).await
    } else {
        forwarder(&ctx, &broker, &plan).await
    };
    broker.close().await;
    outcome
}

/// A body of `size` bytes, the first ones the message's index.
pub fn body(i: u64, size: usize) -> Vec<u8> {
    let mut body: Vec<u8> = (0..size).map(|j| b'a' + (j % 26) as u8).collect();
    let tag = i.to_be_bytes();
    let n = tag.len().min(size);
    body[..n].copy_from_slice(&tag[..n]);
    body
}

/// Declares `queue`, durable, a quorum queue in quorum mode.
async fn declare_queue(ctx: &Ctx, broker: &TestBroker, queue: &str) {
    if ctx.quorum {
        broker.declare_quorum_queue(queue).await;
    } else {
        broker.declare_queue(queue).await;
    }
}

/// Declares the inbound queue `{p}.in` as the forwarder on
/// [`forwarder_toml`] would create it.
async fn declare_forwarder_inbound(ctx: &Ctx, broker: &TestBroker, p: &str) {
    if ctx.quorum {
        declare_inbound_quorum(broker, p).await;
    } else {
        declare_inbound(broker, p).await;
    }
}

/// The forwarder's configuration under `p`: F1's one branch or the seed
/// scenario (F2), `nack` dead-lettering, a 10 s shutdown bound, the run's
/// prefetch; in quorum mode every queue it declares is a quorum queue.
/// `[journal]` is the shipped default (on) but for its stream, `<p>.journal`,
/// removed with the run's queues; F2N turns it off, F2T adds
/// `[telemetry.otlp]` at its default `sample_ratio` (1.0) to the run's
/// receiver. `[control]` follows the stream `<p>.control`; F2C turns it
/// off, F2X both.
pub fn forwarder_toml(ctx: &Ctx, p: &str, row: Row) -> String {
    let forwarder = Forwarder::at(&ctx.target.url, p)
        .mode("nack")
        .top("shutdown_timeout_ms", 10_000)
        .inbound("prefetch", ctx.prefetch);
    let forwarder = match row {
        Row::F1 => forwarder.match_all(p),
        Row::F2N => forwarder.seed(p).journal("enabled", false),
        Row::F2C => forwarder.seed(p).control("enabled", false),
        Row::F2X => forwarder
            .seed(p)
            .journal("enabled", false)
            .control("enabled", false),
        Row::F2T => match &ctx.otlp {
            Some(receiver) => forwarder.seed(p).otlp(&receiver.endpoint()),
            None => panic!("F2T runs without an OTLP receiver"),
        },
        _ => forwarder.seed(p),
    };
    let forwarder = if ctx.quorum {
        forwarder.quorum()
    } else {
        forwarder
    };
    // A build from before a table (`[journal]`, `[control]`) runs without
    // it: `against::fit` leaves out what it does not know.
    forwarder.toml()
}

/// Fills `queue` with `n` persistent messages of `size` bytes.
async fn preload(broker: &TestBroker, queue: &str, n: u64, size: usize) {
    let messages = (0..n).map(|i| {
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/octet-stream".into())
            .with_message_id(format!("{queue}-{i}").into());
        (body(i, size), props)
    });
    broker
        .publish_windowed("", queue, messages, PRELOAD_WINDOW)
        .await;
    let have = u64::from(broker.queue_len(queue).await);
    assert_eq!(have, n, "{queue} holds {have} after preloading {n}");
}

/// Every destination of every row receives the backlog once.
fn watch<'a>(
    ctx: &'a Ctx,
    broker: &'a TestBroker,
    plan: &Plan,
    groups: Vec<Vec<String>>,
) -> Watch<'a> {
    Watch {
        broker,
        target: &ctx.target,
        groups,
        per_group: plan.backlog,
        dead_letters: None,
        inbound: None,
        stall: ctx.stall,
        clock_ticks: ctx.clock_ticks,
    }
}

/// Counts that differ from `expected`, as notes.
async fn check(broker: &TestBroker, expected: &[(String, u64)]) -> Vec<String> {
    let mut notes = Vec::new();
    for (queue, want) in expected {
        let have = u64::from(broker.queue_len(queue).await);
        if have != *want {
            notes.push(format!(
                "after the run {queue} holds {have}, expected {want}"
            ));
        }
    }
    notes
}

/// A row moved by a process of its own: switchyard (F1, F2, F2N, F2T) or the bare
/// forwarder (B1, from F1's inbound queue to F1's service queue).
async fn forwarder(ctx: &Ctx, broker: &TestBroker, plan: &Plan) -> Outcome {
    let p = &plan.prefix;
    let q = |s: &str| format!("{p}.{s}");
    // The same inbound queue for B1 as for F1 (its dead-letter arguments
    // unused), so that the broker does the same work.
    declare_forwarder_inbound(ctx, broker, p).await;
    let queues = Topology::of(plan.row, p).queues;
    let dead_letters = queues.contains(&q("dlq")).then(|| q("dlq"));
    // The endpoint queues: all but the inbound and the dead-letter queue,
    // and the journal's stream, which the forwarder declares.
    let outputs: Vec<String> = queues
        .into_iter()
        .filter(|queue| ![q("in"), q("dlq"), q("journal")].contains(queue))
        .collect();
    // Declared as the forwarder declares them, so that polls find them.
    for queue in &outputs {
        declare_queue(ctx, broker, queue).await;
    }
    preload(broker, &q("in"), plan.backlog, plan.size).await;

    let (toml, branches) = match plan.row {
        Row::B1 | Row::B1H => (String::new(), vec![vec![q("service")]]),
        Row::F1 => (forwarder_toml(ctx, p, Row::F1), vec![vec![q("service")]]),
        row => (
            forwarder_toml(ctx, p, row),
            vec![
                vec![q("service"), q("service.backup")],
                vec![q("logging"), q("logging.backup")],
            ],
        ),
    };
    let primaries: Vec<String> = branches.iter().map(|b| b[0].clone()).collect();
    let receiver = ctx.otlp.as_ref().filter(|_| plan.row == Row::F2T);
    let spans_before = receiver.map(OtlpReceiver::span_count);
    let started = Instant::now();
    let counts = ctx
        .callgrind
        .as_deref()
        .map(|dir| callgrind::out_file(dir, p));
    let (wrap, env) = match (&counts, ctx.forwarder_cpus.as_deref()) {
        (Some(out), _) => (Wrap::Callgrind(out), &callgrind::FORWARDER_ENV[..]),
        (None, Some(cpus)) => (Wrap::Pinned(cpus), &[][..]),
        (None, None) => (Wrap::Direct, &[][..]),
    };
    let process = match plan.row {
        Row::B1 | Row::B1H => bare::spawn(
            p,
            &ctx.target.url,
            (&q("in"), &q("service")),
            ctx.prefetch,
            plan.row == Row::B1H,
            wrap,
        ),
        _ => match (plan.build, &ctx.against) {
            (Build::Against, Some(against)) => spawn_against(against, p, &toml, wrap, env),
            _ => Process::spawn_through(p, &toml, wrap, &[], env),
        },
    };
    let mut mover = Mover::Forwarder(process);
    let watch = Watch {
        dead_letters: dead_letters.clone(),
        inbound: Some(q("in")),
        ..watch(ctx, broker, plan, branches)
    };
    let window = watch.measure(&mut mover, started).await;
    let Mover::Forwarder(mut process) = mover else {
        unreachable!("a forwarder row runs the forwarder")
    };
    let peak_rss_kib = Some(process.peak_rss_kib());

    process.signal("TERM");
    let code = process.wait_exit(STOP_TIMEOUT).await;
    // The forwarder exports what it holds before it exits.
    let spans = receiver
        .zip(spans_before)
        .map(|(r, before)| (r.span_count() - before) as u64);
    let mut notes = Vec::new();
    if code != Some(0) {
        notes.push(format!(
            "the forwarder exited with {code:?}; log: {}",
            process.log_path.display()
        ));
    }
    notes.extend(drops_logged(&process.log_path));
    let instructions = match &counts {
        Some(out) if code == Some(0) => {
            if let Some(dir) = &ctx.keep_counts {
                let name = format!("{:?}-{:?}-{}.callgrind", plan.row, plan.build, plan.backlog);
                let _ = std::fs::create_dir_all(dir);
                if let Err(e) = std::fs::copy(out, dir.join(name)) {
                    notes.push(format!("cannot keep the counts in {}: {e}", dir.display()));
                }
            }
            callgrind::read_total(out).map_err(|e| notes.push(e)).ok()
        }
        _ => None,
    };
    let expected: Vec<(String, u64)> = outputs
        .iter()
        .map(|queue| {
            let want = if primaries.contains(queue) {
                plan.backlog
            } else {
                0
            };
            (queue.clone(), want)
        })
        .chain([(q("in"), 0)])
        .chain(dead_letters.map(|dlq| (dlq, 0)))
        .collect();
    notes.extend(check(broker, &expected).await);
    if !notes.is_empty() && code == Some(0) {
        process.keep_files();
        notes.push(format!("its log is kept: {}", process.log_path.display()));
    } else if plan.build == Build::Against {
        let _ = std::fs::remove_file(against_config(p));
    }
    Outcome {
        plan: plan.clone(),
        window,
        peak_rss_kib,
        instructions,
        spans,
        notes,
    }
}

/// Journal records and spans the forwarder's log says it dropped, as
/// notes: a rate earned by dropping them is not the cost of writing them.
/// Drops are logged at most every ten seconds, so a count is a lower bound.
fn drops_logged(log: &std::path::Path) -> Vec<String> {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let mut notes = Vec::new();
    for (event, what) in [
        ("journal records dropped", "journal records"),
        ("spans dropped", "spans"),
    ] {
        let dropped: u64 = log
            .lines()
            .filter(|line| line.contains(event))
            .filter_map(|line| {
                let count = line.split("dropped=").nth(1)?;
                let digits: String = count.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u64>().ok()
            })
            .sum();
        if dropped > 0 {
            notes.push(format!("the forwarder dropped {what}: at least {dropped}"));
        }
    }
    notes
}

/// Where the other build's configuration for the run `p` is written (the
/// kit's [`Process::spawn`] writes this build's and removes it itself).
fn against_config(p: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{p}-against.toml"))
}

/// The other build's forwarder on `toml`, started as [`Process::spawn`]
/// starts this build's: `run --config`, `RUST_LOG=info`, through `wrap`.
fn spawn_against(
    against: &Against,
    p: &str,
    toml: &str,
    wrap: Wrap<'_>,
    env: &[(&str, &str)],
) -> Process {
    let config = against_config(p);
    let (toml, _) = crate::against::fit(against, p, toml)
        .unwrap_or_else(|e| panic!("the build against refuses the configuration: {e}"));
    std::fs::write(&config, toml).unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
    let config = config.display().to_string();
    let mut env_with_log = vec![("RUST_LOG", "info")];
    env_with_log.extend_from_slice(env);
    Process::spawn_program(
        p,
        &against.binary,
        &["run", "--config", &config],
        &env_with_log,
        wrap,
    )
}

async fn shovels(ctx: &Ctx, broker: &TestBroker, plan: &Plan) -> Outcome {
    let p = &plan.prefix;
    let q = |s: &str| format!("{p}.{s}");
    let topology = Topology::of(plan.row, p);
    for queue in &topology.queues {
        declare_queue(ctx, broker, queue).await;
    }
    let definition = |src: &str, dest: serde_json::Value| shovel_definition(ctx, src, dest);
    let (definitions, destinations) = match plan.row {
        Row::S => (
            vec![(
                topology.shovels[0].clone(),
                definition(&q("src"), json!({ "dest-queue": q("dst") })),
            )],
            vec![q("dst")],
        ),
        Row::S2 => {
            let fanout = q("fanout");
            broker.declare_exchange(&fanout, ExchangeKind::Fanout).await;
            for dst in [q("dst1"), q("dst2")] {
                broker.bind(&dst, &fanout, "").await;
            }
            let dest = json!({ "dest-exchange": fanout, "dest-exchange-key": "" });
            (
                vec![(topology.shovels[0].clone(), definition(&q("src"), dest))],
                vec![q("dst1"), q("dst2")],
            )
        }
        _ => (
            (1..=2)
                .map(|i| {
                    let dest = json!({ "dest-queue": q(&format!("dst{i}")) });
                    (
                        topology.shovels[i - 1].clone(),
                        definition(&q(&format!("src{i}")), dest),
                    )
                })
                .collect(),
            vec![q("dst1"), q("dst2")],
        ),
    };
    let sources: Vec<String> = match plan.row {
        Row::TwoS => vec![q("src1"), q("src2")],
        _ => vec![q("src")],
    };
    for src in &sources {
        preload(broker, src, plan.backlog, plan.size).await;
    }

    let started = Instant::now();
    let target = ctx.target.clone();
    let cli = tokio::spawn(async move { target.create_shovels(&definitions).await });
    let mut mover = Mover::Shovels(Some(cli));
    let groups = destinations.iter().map(|d| vec![d.clone()]).collect();
    let window = watch(ctx, broker, plan, groups)
        .measure(&mut mover, started)
        .await;
    if let Mover::Shovels(Some(cli)) = mover
        && let Err(e) = cli.await
    {
        panic!("creating the shovels failed: {e}");
    }
    for shovel in &topology.shovels {
        ctx.target.clear_shovel(shovel).await;
    }
    let expected: Vec<(String, u64)> = destinations
        .iter()
        .map(|d| (d.clone(), plan.backlog))
        .chain(sources.iter().map(|s| (s.clone(), 0)))
        .collect();
    Outcome {
        plan: plan.clone(),
        window,
        peak_rss_kib: None,
        instructions: None,
        spans: None,
        notes: check(broker, &expected).await,
    }
}

/// A shovel from queue `src` to `dest` (its `dest-*` keys), on-confirm.
fn shovel_definition(ctx: &Ctx, src: &str, dest: serde_json::Value) -> serde_json::Value {
    let mut value = json!({
        "src-protocol": "amqp091",
        "src-uri": ctx.shovel_uri,
        "src-queue": src,
        "src-prefetch-count": ctx.prefetch,
        "dest-protocol": "amqp091",
        "dest-uri": ctx.shovel_uri,
        "ack-mode": "on-confirm",
    });
    value
        .as_object_mut()
        .expect("an object")
        .extend(dest.as_object().expect("an object").clone());
    value
}

/// The latency baseline: S2's shape on the seed scenario's names. A shovel
/// moves `{p}.in` into a fanout exchange bound to `{p}.service` and
/// `{p}.logging`; returns once it consumes. [`Topology::of_seed_shovel`]
/// names what it creates.
pub async fn start_seed_shovel(ctx: &Ctx, broker: &TestBroker, p: &str) {
    let q = |s: &str| format!("{p}.{s}");
    let topology = Topology::of_seed_shovel(p);
    for queue in &topology.queues {
        declare_queue(ctx, broker, queue).await;
    }
    let fanout = q("fanout");
    broker.declare_exchange(&fanout, ExchangeKind::Fanout).await;
    for queue in [q("service"), q("logging")] {
        broker.bind(&queue, &fanout, "").await;
    }
    let dest = json!({ "dest-exchange": fanout, "dest-exchange-key": "" });
    let definition = shovel_definition(ctx, &q("in"), dest);
    ctx.target
        .create_shovels(&[(topology.shovels[0].clone(), definition)])
        .await;
    wait_consumers(broker, &q("in"), 1).await;
}

/// Starts the seed scenario's forwarder on an empty inbound queue and waits
/// until it consumes (for the latency run).
pub async fn start_seed_forwarder(ctx: &Ctx, broker: &TestBroker, p: &str) -> Process {
    declare_forwarder_inbound(ctx, broker, p).await;
    let process = Process::spawn(p, &forwarder_toml(ctx, p, Row::F2));
    wait_consumers(broker, &format!("{p}.in"), 1).await;
    process
}
