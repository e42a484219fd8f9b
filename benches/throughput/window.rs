//! The measurement window of one row: it opens at the first poll that sees
//! copies landing once the mover is fully started (the forwarder process
//! running, the `rabbitmqctl` call that created a shovel returned, so the
//! CLI's own Erlang VM is gone), and closes at the poll that sees the last
//! copy. Rates and CPU figures are over that window only: start-up on
//! either side is left out.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::support::harness::Process;
use crate::support::{TestBroker, procfs};
use crate::target::Target;

/// Interval between two polls of the destination counts.
const POLL: Duration = Duration::from_millis(20);
/// Lines of the forwarder's log a failure quotes.
const LOG_LINES: usize = 30;

/// The last `LOG_LINES` lines of the forwarder's log.
fn log_tail(process: &Process) -> String {
    let log = process.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(LOG_LINES)..].join("\n")
}

/// What moves the messages of a row.
pub enum Mover {
    /// The forwarder, a process of its own.
    Forwarder(Process),
    /// Shovels inside the broker, being created by a `rabbitmqctl` call
    /// (`None` once it has returned).
    Shovels(Option<JoinHandle<()>>),
}

impl Mover {
    /// Whether it is fully started; panics when it failed.
    async fn started(&mut self, counts: &str) -> bool {
        match self {
            Mover::Forwarder(process) => {
                if let Some(status) = process.exited() {
                    panic!(
                        "the forwarder exited ({status}) with {counts}; its log ends:\n{}",
                        log_tail(process)
                    );
                }
                true
            }
            Mover::Shovels(cli) => {
                if let Some(task) = cli.take_if(|task| task.is_finished())
                    && let Err(e) = task.await
                {
                    panic!("creating the shovels failed: {e}");
                }
                cli.is_none()
            }
        }
    }

    fn ticks(&self) -> Option<u64> {
        match self {
            Mover::Forwarder(process) => process.cpu_ticks(),
            Mover::Shovels(_) => None,
        }
    }
}

/// CPU counters at one instant.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    at: Instant,
    copies: u64,
    mover: Option<u64>,
    broker: Option<u64>,
    own: Option<u64>,
    machine: Option<(u64, u64)>,
}

impl Snapshot {
    fn take(copies: u64, mover: &Mover, target: &Target) -> Self {
        Self {
            at: Instant::now(),
            copies,
            mover: mover.ticks(),
            broker: target.cpu_ticks(),
            own: procfs::own_cpu_ticks(),
            machine: procfs::machine_ticks(),
        }
    }
}

/// What one window measured.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Copies that landed inside the window.
    pub copies: u64,
    /// Its length in seconds.
    pub secs: f64,
    /// From the mover's start to the window's opening.
    pub start_up: Duration,
    /// CPU seconds of the forwarder process (none for Shovel).
    pub mover_cpu: Option<f64>,
    /// CPU seconds of the broker's Erlang VM.
    pub broker_cpu: Option<f64>,
    /// CPU seconds of this benchmark process (the poller).
    pub own_cpu: f64,
    /// CPU seconds of the whole machine, everyone's processes included.
    pub machine_cpu: Option<f64>,
    /// The copies landed faster than the mover started: the window is the
    /// whole run, start-up included.
    pub whole_run: bool,
}

impl Window {
    fn between(a: &Snapshot, b: &Snapshot, start: Instant, whole_run: bool, tck: f64) -> Self {
        let cpu = |x: Option<u64>, y: Option<u64>| Some(y?.saturating_sub(x?) as f64 / tck);
        let machine = match (a.machine, b.machine) {
            (Some((busy_a, total_a)), Some((busy_b, total_b))) if total_b > total_a => {
                // The busy share of all CPUs, times the CPUs, times the wall time.
                let share = busy_b.saturating_sub(busy_a) as f64 / (total_b - total_a) as f64;
                Some(share * procfs::cores() as f64 * (b.at - a.at).as_secs_f64())
            }
            _ => None,
        };
        Self {
            copies: b.copies - a.copies,
            secs: (b.at - a.at).as_secs_f64().max(1e-6),
            start_up: a.at.saturating_duration_since(start),
            mover_cpu: cpu(a.mover, b.mover),
            broker_cpu: cpu(a.broker, b.broker),
            own_cpu: cpu(a.own, b.own).unwrap_or(0.0),
            machine_cpu: machine,
            whole_run,
        }
    }

    /// Copies per second.
    pub fn copies_per_sec(&self) -> f64 {
        self.copies as f64 / self.secs
    }

    /// CPU microseconds per copy of `cpu` seconds.
    pub fn us_per_copy(&self, cpu: Option<f64>) -> Option<f64> {
        Some(cpu? * 1e6 / self.copies.max(1) as f64)
    }

    /// Cores everyone else used: the machine minus the forwarder, the broker
    /// and this process. Near 0 on a quiet machine.
    pub fn others_cores(&self) -> Option<f64> {
        let rest = self.machine_cpu?
            - self.mover_cpu.unwrap_or(0.0)
            - self.broker_cpu.unwrap_or(0.0)
            - self.own_cpu;
        Some((rest / self.secs).max(0.0))
    }
}

/// What to watch.
pub struct Watch<'a> {
    pub broker: &'a TestBroker,
    pub target: &'a Target,
    /// The destinations, each a group of queues that together receive
    /// `per_group` copies: one queue, or a branch's primary and backup (a
    /// copy that fails over still lands, on the backup).
    pub groups: Vec<Vec<String>>,
    pub per_group: u64,
    /// A run whose counts do not move for this long fails.
    pub stall: Duration,
    pub clock_ticks: f64,
}

impl Watch<'_> {
    fn target_copies(&self) -> u64 {
        self.groups.len() as u64 * self.per_group
    }

    /// Copies landed, each group counted up to `per_group` (a duplicate
    /// in one group does not make up for a copy missing in another).
    async fn copies(&self) -> (u64, String) {
        let mut total = 0;
        let mut shown = Vec::new();
        for group in &self.groups {
            let mut landed = 0;
            for queue in group {
                let n = self.broker.queue_len(queue).await;
                landed += u64::from(n);
                shown.push(format!("{queue}={n}"));
            }
            total += landed.min(self.per_group);
        }
        (total, shown.join(", "))
    }

    /// Polls until every copy has landed; the window over the run.
    /// `started` is when the mover was launched.
    pub async fn measure(&self, mover: &mut Mover, started: Instant) -> Window {
        let origin = Snapshot {
            at: started,
            copies: 0,
            mover: Some(0),
            ..Snapshot::take(0, mover, self.target)
        };
        let mut opened: Option<Snapshot> = None;
        let (mut last, mut last_change) = (0, Instant::now());
        loop {
            let (copies, shown) = self.copies().await;
            let running = mover.started(&shown).await;
            if copies >= self.target_copies() {
                let end = Snapshot::take(copies, mover, self.target);
                let whole_run = opened.is_none();
                let start = opened.unwrap_or(origin);
                return Window::between(&start, &end, started, whole_run, self.clock_ticks);
            }
            if opened.is_none() && running && copies > 0 {
                opened = Some(Snapshot::take(copies, mover, self.target));
            }
            if copies != last {
                (last, last_change) = (copies, Instant::now());
            } else if last_change.elapsed() > self.stall {
                let shovels = match mover {
                    Mover::Shovels(_) => self.target.shovel_status().await,
                    Mover::Forwarder(p) => format!("the forwarder's log ends:\n{}", log_tail(p)),
                };
                panic!(
                    "no progress for {:?}: {copies} of {} copies ({shown})\n{shovels}",
                    self.stall,
                    self.target_copies()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
