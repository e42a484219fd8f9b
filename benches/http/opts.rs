//! The benchmark's command line.

use std::str::FromStr;

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "http",
    bin_name = "cargo bench --bench http --",
    about = "switchyard's HTTP ingress vs the management plugin's HTTP publish: \
             requests/s, CPU per request, latency at half the maximum rate"
)]
pub struct Opts {
    /// Seconds of each maximum-rate run, after the warm-up.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) secs: f64,
    /// Seconds of requests before each maximum-rate run, not counted.
    #[arg(long, default_value_t = 2.0)]
    pub(crate) warmup_secs: f64,
    /// Seconds of each latency run at half the row's maximum rate; 0 skips them.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) latency_secs: f64,
    /// Requests per second of every latency run [default: half the row's maximum rate; A: H's latency rate].
    #[arg(long)]
    pub(crate) latency_rate: Option<f64>,
    /// Concurrent clients, each on a keep-alive connection of its own.
    #[arg(long, default_value_t = 64)]
    pub(crate) clients: usize,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub(crate) size: usize,
    /// Rounds, each running every row; the table shows medians.
    #[arg(long, default_value_t = 1)]
    pub(crate) rounds: u32,
    /// The rows, in order (M, H, A) [default: M,H,A].
    #[arg(long, value_delimiter = ',')]
    pub(crate) rows: Vec<Row>,
    /// Every queue of the run a quorum queue (durable, `x-queue-type =
    /// quorum`) rather than a classic one.
    #[arg(long)]
    pub(crate) quorum: bool,
    /// A quick look: --secs 3 --warmup-secs 1 --latency-secs 3.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Passed by `cargo bench`; without it (`cargo test --benches`) nothing runs.
    #[arg(long, hide = true)]
    pub(crate) bench: bool,
}

impl Opts {
    /// The options with `--quick` applied and the rows defaulted.
    pub(crate) fn resolved(mut self) -> Self {
        if self.quick {
            self.secs = 3.0;
            self.warmup_secs = 1.0;
            self.latency_secs = 3.0;
        }
        if self.rows.is_empty() {
            self.rows = Row::ALL.to_vec();
        }
        self
    }

    /// Why the options cannot run, if they cannot.
    pub(crate) fn invalid(&self) -> Option<&'static str> {
        if self.secs.is_nan() || self.secs <= 0.0 {
            return Some("--secs must be above 0");
        }
        if self.warmup_secs < 0.0 || self.latency_secs < 0.0 {
            return Some("--warmup-secs and --latency-secs cannot be negative");
        }
        if self.latency_rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
            return Some("--latency-rate must be above 0");
        }
        if self.rounds == 0 {
            return Some("--rounds must be at least 1");
        }
        if self.clients == 0 {
            return Some("--clients must be at least 1");
        }
        if self.size == 0 {
            return Some("--size must be at least 1");
        }
        None
    }
}

/// What the requests go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    /// The management plugin's `POST /api/exchanges/{vhost}/{exchange}/publish`
    /// into a fanout exchange bound to the two queues.
    M,
    /// switchyard's `POST /messages/{routing_key}`, the seed scenario.
    H,
    /// The floor under H: no HTTP and no forwarder, the same two copies
    /// published by the benchmark over AMQP (mandatory, persistent) and
    /// both confirms awaited.
    A,
}

impl Row {
    pub const ALL: [Row; 3] = [Row::M, Row::H, Row::A];

    pub fn label(self) -> &'static str {
        match self {
            Row::M => "M",
            Row::H => "H",
            Row::A => "A",
        }
    }

    pub fn what(self) -> &'static str {
        match self {
            Row::M => "management API publish → fanout → 2 queues",
            Row::H => "switchyard HTTP ingress, seed: 2 branches",
            Row::A => "AMQP floor: 2 confirmed publishes → 2 queues",
        }
    }
}

impl FromStr for Row {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Row::ALL
            .into_iter()
            .find(|r| r.label().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown row {s:?} (rows: M, H, A)"))
    }
}
