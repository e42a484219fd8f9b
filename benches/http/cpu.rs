//! CPU over a phase, from `/proc`: the broker's Erlang VM, switchyard's
//! process (row H), this benchmark's own process (the load generator) and
//! the whole machine, so that what else ran shows too.

use std::time::Instant;

use crate::support::procfs;

/// The processes a phase's CPU is read from.
#[derive(Debug, Clone, Copy)]
pub struct Watched {
    pub broker: Option<u32>,
    pub forwarder: Option<u32>,
}

/// One reading of every counter, in clock ticks.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    at: Instant,
    broker: Option<u64>,
    forwarder: Option<u64>,
    own: Option<u64>,
    machine_busy: Option<u64>,
}

impl Watched {
    pub fn read(&self) -> Reading {
        Reading {
            at: Instant::now(),
            broker: self.broker.and_then(procfs::cpu_ticks),
            forwarder: self.forwarder.and_then(procfs::cpu_ticks),
            own: procfs::own_cpu_ticks(),
            machine_busy: procfs::machine_ticks().map(|(busy, _)| busy),
        }
    }
}

/// CPU seconds used between two readings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Used {
    pub secs: f64,
    pub broker: Option<f64>,
    pub forwarder: Option<f64>,
    /// The benchmark's own process: the load generator.
    pub client: Option<f64>,
    /// Every CPU's busy time less the three above.
    pub others: Option<f64>,
}

impl Used {
    pub fn between(start: &Reading, end: &Reading, ticks_per_sec: f64) -> Self {
        let delta = |a: Option<u64>, b: Option<u64>| {
            Some(b?.saturating_sub(a?) as f64 / ticks_per_sec.max(1.0))
        };
        let broker = delta(start.broker, end.broker);
        let forwarder = delta(start.forwarder, end.forwarder);
        let client = delta(start.own, end.own);
        let machine = delta(start.machine_busy, end.machine_busy);
        let others = machine.map(|m| {
            (m - broker.unwrap_or(0.0) - forwarder.unwrap_or(0.0) - client.unwrap_or(0.0)).max(0.0)
        });
        Self {
            secs: end.at.duration_since(start.at).as_secs_f64(),
            broker,
            forwarder,
            client,
            others,
        }
    }

    /// Microseconds of CPU per request for `cpu` seconds over `requests`.
    pub fn us_per(cpu: Option<f64>, requests: u64) -> Option<f64> {
        (requests > 0).then_some(())?;
        cpu.map(|c| c * 1e6 / requests as f64)
    }

    /// Cores used on average by others over the phase.
    pub fn others_cores(&self) -> Option<f64> {
        self.others.map(|o| o / self.secs.max(1e-9))
    }
}
