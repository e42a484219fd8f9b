//! The benchmark's command line.

use clap::Parser;

use crate::rows::Row;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "throughput",
    bin_name = "cargo bench --bench throughput --",
    about = "switchyard vs RabbitMQ Shovel: throughput, CPU per copy, latency, memory"
)]
pub struct Opts {
    /// Messages preloaded into each source queue.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) backlog: u64,
    /// Rounds; each runs every row once, in alternating order.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: u32,
    /// The forwarder's inbound.prefetch and the shovels' src-prefetch-count.
    #[arg(long, default_value_t = 1000)]
    pub(crate) prefetch: u32,
    /// The rows of the main table (S, B1, B1H, F1, S2, 2S, F2N, F2, F2T) [default: all but B1H; S,B1,F1,F2 with --split-cores; S,F2 with --scale].
    #[arg(long, value_delimiter = ',')]
    pub(crate) rows: Vec<Row>,
    /// Body sizes (bytes) for F1 and F2 CPU per copy; 1024 reuses the main table's runs.
    #[arg(long, value_delimiter = ',', default_value = "1024")]
    pub(crate) sizes: Vec<usize>,
    /// Caps backlog × body size (MiB) for large bodies: 256 MiB is 4096 bodies of 64 KiB.
    #[arg(long, default_value_t = 256)]
    pub(crate) max_backlog_mib: u64,
    /// Seconds of each latency run (LS, then L); 0 skips them.
    #[arg(long, default_value_t = 30.0)]
    pub(crate) latency_secs: f64,
    /// Messages per second of the latency run [default: half of F2's msgs/s].
    #[arg(long)]
    pub(crate) latency_rate: Option<f64>,
    /// Skip the forwarder's peak RSS with 64 KiB bodies.
    #[arg(long)]
    pub(crate) no_memory: bool,
    /// The shovels' URI: `direct` (amqp://, Shovel's in-broker connection) or `tcp` (the broker's URL).
    #[arg(long, default_value = "direct", value_parser = ["direct", "tcp"])]
    pub(crate) shovel_uri: String,
    /// Declare every queue of the run as a quorum queue (x-queue-type = quorum, durable): sources, destinations, backups, dead letters.
    #[arg(long)]
    pub(crate) quorum: bool,
    /// Run on a private node pinned to CPU 0, the forwarder pinned to CPU 1.
    #[arg(long)]
    pub(crate) split_cores: bool,
    /// The rows (S and F2 unless --rows) at --backlog and at --scale-backlog instead of the default run.
    #[arg(long)]
    pub(crate) scale: bool,
    /// The larger backlog of --scale.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) scale_backlog: u64,
    /// Count instructions per message under valgrind's callgrind (rows B1, F1 and F2 unless --rows) instead of the default run.
    #[arg(long, conflicts_with_all = ["scale", "split_cores"])]
    pub(crate) instructions: bool,
    /// With --instructions: keep each run's callgrind counts in DIR as
    /// `<row>-<build>-<backlog>.callgrind` (the last round's), for
    /// `callgrind_annotate` to say where the instructions go, by function.
    #[arg(long, value_name = "DIR", requires = "instructions")]
    pub(crate) keep_counts: Option<std::path::PathBuf>,
    /// The larger backlog of --instructions; the smaller is a quarter of it.
    #[arg(long, default_value_t = 4000)]
    pub(crate) instructions_backlog: u64,
    /// Another build to run the forwarder rows (F1, F2) beside this one's, interleaved in every round: a git revision of this repository (built once into target/against) or the path of a switchyard binary.
    #[arg(long, value_name = "REV|PATH")]
    pub(crate) against: Option<String>,
    /// A run whose counts do not move for this many seconds fails.
    #[arg(long, default_value_t = 60)]
    pub(crate) stall_secs: u64,
    /// Passed by `cargo bench`; without it (`cargo test --benches`) nothing runs.
    #[arg(long, hide = true)]
    pub(crate) bench: bool,
}

impl Opts {
    pub(crate) fn rows(&self) -> Vec<Row> {
        if !self.rows.is_empty() {
            return self.rows.clone();
        }
        if self.instructions {
            return vec![Row::B1, Row::F1, Row::F2];
        }
        match (self.scale, self.split_cores) {
            (true, _) => vec![Row::S, Row::F2],
            (false, false) => Row::DEFAULT.to_vec(),
            (false, true) => vec![Row::S, Row::B1, Row::F1, Row::F2],
        }
    }

    /// The backlog for bodies of `size`: `--backlog`, capped by `--max-backlog-mib`.
    pub(crate) fn backlog_for(&self, size: usize) -> u64 {
        let cap = self.max_backlog_mib * 1024 * 1024 / size.max(1) as u64;
        self.backlog.min(cap).max(1)
    }
}
