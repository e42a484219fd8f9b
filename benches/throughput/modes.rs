//! What a run does: the default table (with the body-size sweep, the
//! memory figures and the latency run), split cores, or scale. Rows run one
//! after the other, rounds in alternating order, a progress line each on
//! stderr; the tables go to stdout at the end.

use std::sync::Arc;

use tokio_util::task::AbortOnDropHandle;

use crate::latency::Carrier;
use crate::opts::Opts;
use crate::rows::{self, Ctx, Outcome, Plan, Row};
use crate::support::procfs;
use crate::{latency, report};

/// The body size of the main table.
pub const MAIN_SIZE: usize = 1024;
/// The body size of the second memory figure.
const LARGE_SIZE: usize = 65536;

/// ", quorum queues" for a heading in quorum mode; nothing otherwise.
pub fn queues_label(opts: &Opts) -> &'static str {
    if opts.quorum { ", quorum queues" } else { "" }
}

/// Runs `plans` one after the other, printing a line per run; stops at the first failure.
async fn run_all(ctx: &Arc<Ctx>, plans: Vec<Plan>, out: &mut Vec<Outcome>) -> Result<(), String> {
    for plan in plans {
        let outcome = rows::run(ctx.clone(), plan).await?;
        eprintln!("{}", outcome.line());
        out.push(outcome);
    }
    Ok(())
}

/// `rounds` rounds of `rows`, in the given order in odd rounds and reversed in even ones.
fn plans(run_prefix: &str, rounds: u32, rows: &[Row], size: usize, backlog: u64) -> Vec<Plan> {
    let mut plans = Vec::new();
    for round in 1..=rounds {
        let mut order = rows.to_vec();
        if round % 2 == 0 {
            order.reverse();
        }
        for row in order {
            plans.push(plan(run_prefix, round, row, size, backlog));
        }
    }
    plans
}

/// One run, its names under `<run prefix>-r<round>-<row>-<size>-<backlog>`.
fn plan(run_prefix: &str, round: u32, row: Row, size: usize, backlog: u64) -> Plan {
    let label = row.label().to_lowercase();
    Plan {
        row,
        round,
        backlog,
        size,
        prefix: format!("{run_prefix}-r{round}-{label}-{size}-{backlog}"),
    }
}

pub async fn default_run(
    opts: &Opts,
    ctx: &Arc<Ctx>,
    run_prefix: &str,
    rows: &[Row],
) -> Result<(), String> {
    let mut all = Vec::new();
    let main = plans(run_prefix, opts.rounds, rows, MAIN_SIZE, opts.backlog);
    run_all(ctx, main, &mut all).await?;

    let by_size = process_rows(rows);
    let swept = sweep_sizes(opts, ctx, run_prefix, &by_size, &mut all).await?;
    let mut memory = vec![(MAIN_SIZE, opts.backlog)];
    if !opts.no_memory && rows.contains(&Row::F2) {
        let large = (LARGE_SIZE, opts.backlog_for(LARGE_SIZE));
        if !swept.contains(&large) {
            let plan = plans(run_prefix, 1, &[Row::F2], large.0, large.1);
            run_all(ctx, plan, &mut all).await?;
        }
        memory.push(large);
    }

    let f2 = report::stats(&all, Row::F2, MAIN_SIZE, opts.backlog).map(|s| s.msgs);
    let latency = match (
        opts.latency_secs > 0.0,
        opts.latency_rate.or(f2.map(|r| r / 2.0)),
    ) {
        (true, Some(rate)) => {
            let mut runs = Vec::new();
            // The Shovel baseline first, then switchyard, at the same rate.
            for carrier in [Carrier::Shovel, Carrier::Switchyard] {
                eprintln!(
                    "latency {}: {rate:.0} msgs/s for {} s ...",
                    carrier.label(),
                    opts.latency_secs
                );
                let p = format!("{run_prefix}-latency-{}", carrier.label().to_lowercase());
                let topology = carrier.topology(&p);
                let task = AbortOnDropHandle::new(tokio::spawn(latency::run(
                    ctx.clone(),
                    carrier,
                    p.clone(),
                    rate,
                    opts.latency_secs,
                    MAIN_SIZE,
                )));
                let result = task.await;
                topology.remove(&ctx.target, &p).await;
                runs.push(result.map_err(|e| format!("latency run failed: {e}"))?);
            }
            runs
        }
        (true, None) => {
            eprintln!("latency: skipped (no F2 rate; give --latency-rate)");
            Vec::new()
        }
        _ => Vec::new(),
    };

    println!(
        "\n## Throughput: {} bodies{}, backlog {}, medians of {} round(s)\n",
        report::size_label(MAIN_SIZE),
        queues_label(opts),
        opts.backlog,
        opts.rounds
    );
    println!(
        "{}",
        report::throughput(&all, rows, MAIN_SIZE, opts.backlog)
    );
    if !by_size.is_empty() {
        println!("## CPU per copy by body size (medians)\n");
        println!("{}", report::sizes(&all, &by_size, &swept));
    }
    if rows.contains(&Row::F2) {
        println!("## Memory\n");
        println!("{}", report::memory(&all, &memory, opts.prefetch));
    }
    if !latency.is_empty() {
        println!("## Latency: publish to arrival on the service queue\n");
        println!("{}", report::latency(&latency));
    }
    notes(&all);
    Ok(())
}

pub async fn split(
    opts: &Opts,
    ctx: &Arc<Ctx>,
    run_prefix: &str,
    rows: &[Row],
) -> Result<(), String> {
    let mut all = Vec::new();
    let main = plans(run_prefix, opts.rounds, rows, MAIN_SIZE, opts.backlog);
    run_all(ctx, main, &mut all).await?;
    let by_size = process_rows(rows);
    let swept = sweep_sizes(opts, ctx, run_prefix, &by_size, &mut all).await?;
    println!(
        "\n## Split cores: broker on CPU 0, forwarder on CPU 1; {} bodies{}, backlog {}, medians of {} round(s)\n",
        report::size_label(MAIN_SIZE),
        queues_label(opts),
        opts.backlog,
        opts.rounds
    );
    println!(
        "{}",
        report::throughput(&all, rows, MAIN_SIZE, opts.backlog)
    );
    if !by_size.is_empty() && swept.len() > 1 {
        println!("## Split cores: CPU per copy by body size (medians)\n");
        println!("{}", report::sizes(&all, &by_size, &swept));
    }
    notes(&all);
    Ok(())
}

/// The rows among `rows` that forward in a process of their own (B1, F1,
/// F2): the ones whose CPU per copy is measured by body size.
fn process_rows(rows: &[Row]) -> Vec<Row> {
    rows.iter()
        .copied()
        .filter(|r| r.is_forwarder() || *r == Row::B1)
        .collect()
}

/// Runs `rows` at every size of `--sizes` that the main runs did not
/// cover; returns each size with its backlog.
async fn sweep_sizes(
    opts: &Opts,
    ctx: &Arc<Ctx>,
    run_prefix: &str,
    rows: &[Row],
    all: &mut Vec<Outcome>,
) -> Result<Vec<(usize, u64)>, String> {
    let mut swept = Vec::new();
    for &size in &opts.sizes {
        let backlog = opts.backlog_for(size);
        if size != MAIN_SIZE || backlog != opts.backlog {
            let sweep = plans(run_prefix, opts.rounds, rows, size, backlog);
            run_all(ctx, sweep, all).await?;
        }
        swept.push((size, backlog));
    }
    Ok(swept)
}

/// `rounds` rounds of every row at every backlog (1 KiB bodies), in
/// alternating order, as `--scale` and `--instructions` run them.
pub async fn run_at_backlogs(
    ctx: &Arc<Ctx>,
    run_prefix: &str,
    rounds: u32,
    rows: &[Row],
    backlogs: &[u64],
) -> Result<Vec<Outcome>, String> {
    let mut all = Vec::new();
    for round in 1..=rounds {
        let mut order: Vec<(Row, u64)> = rows
            .iter()
            .flat_map(|&row| backlogs.iter().map(move |&backlog| (row, backlog)))
            .collect();
        if round % 2 == 0 {
            order.reverse();
        }
        let runs = order
            .into_iter()
            .map(|(row, backlog)| plan(run_prefix, round, row, MAIN_SIZE, backlog))
            .collect();
        run_all(ctx, runs, &mut all).await?;
    }
    Ok(all)
}

pub async fn scale(
    opts: &Opts,
    ctx: &Arc<Ctx>,
    run_prefix: &str,
    rows: &[Row],
) -> Result<(), String> {
    let backlogs = [opts.backlog, opts.scale_backlog];
    let all = run_at_backlogs(ctx, run_prefix, opts.rounds, rows, &backlogs).await?;
    let labels: Vec<&str> = rows.iter().map(|r| r.label()).collect();
    println!(
        "\n## Scale: {} by backlog, {} bodies{}, medians of {} round(s)\n",
        labels.join(" and "),
        report::size_label(MAIN_SIZE),
        queues_label(opts),
        opts.rounds
    );
    println!("{}", report::scale(&all, rows, MAIN_SIZE, &backlogs));
    notes(&all);
    Ok(())
}

/// Cores of other work above which a run's rate is called depressed.
const BUSY: f64 = 0.5;
/// A window shorter than this (seconds) holds few of /proc's clock ticks.
const SHORT: f64 = 1.0;

/// The runs whose after-run check found something, those whose window had
/// to include start-up or was too short for CPU figures, and those that
/// shared the machine with other work.
fn notes(all: &[Outcome]) {
    for o in all {
        let run = format!(
            "round {} {} {}",
            o.plan.round,
            o.plan.row.label(),
            report::size_label(o.plan.size)
        );
        for note in &o.notes {
            println!("NOTE {run}: {note}");
        }
        if o.window.whole_run {
            println!(
                "NOTE {run}: the copies landed before start-up ended; its window includes start-up"
            );
        }
        if o.window.secs < SHORT {
            println!(
                "NOTE {run}: a window of {:.2} s: its CPU figures are coarse (CPU time counts in ticks of {:.0} ms)",
                o.window.secs,
                1000.0 / procfs::clock_ticks_per_sec()
            );
        }
        if let Some(others) = o.window.others_cores().filter(|c| *c > BUSY) {
            println!(
                "NOTE {run}: other work used {others:.2} cores during its window; its rate is depressed"
            );
        }
    }
}
