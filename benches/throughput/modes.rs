//! What a run does: the default table (with the body-size sweep, the
//! memory figures and the latency run), split cores, or scale. Rows run one
//! after the other, rounds in alternating order, a progress line each on
//! stderr; the tables go to stdout at the end.

use std::sync::Arc;

use tokio_util::task::AbortOnDropHandle;

use crate::latency::Carrier;
use crate::opts::Opts;
use crate::rows::{self, Build, Ctx, Outcome, Plan, Row};
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

/// Each of `rows` with the builds it runs: a forwarder row (F1, F2) this
/// build's and then, with `--against`, the other's, side by side in the
/// order; every other row once.
pub fn runs_of(rows: &[Row], against: bool) -> Vec<(Row, Build)> {
    rows.iter()
        .flat_map(|&row| {
            let both = against && row.is_forwarder();
            std::iter::once((row, Build::This)).chain(both.then_some((row, Build::Against)))
        })
        .collect()
}

/// `rounds` rounds of `runs`, in the given order in odd rounds and
/// reversed in even ones (so the two builds of a row swap places too).
fn plans(
    run_prefix: &str,
    rounds: u32,
    runs: &[(Row, Build)],
    size: usize,
    backlog: u64,
) -> Vec<Plan> {
    let mut plans = Vec::new();
    for round in 1..=rounds {
        let mut order = runs.to_vec();
        if round % 2 == 0 {
            order.reverse();
        }
        for (row, build) in order {
            plans.push(plan(run_prefix, round, (row, build), size, backlog));
        }
    }
    plans
}

/// One run, its names under `<run prefix>-r<round>-<row>-<size>-<backlog>`
/// (the row `f1-against` for the other build's F1).
fn plan(
    run_prefix: &str,
    round: u32,
    (row, build): (Row, Build),
    size: usize,
    backlog: u64,
) -> Plan {
    let mut label = row.label().to_lowercase();
    if build == Build::Against {
        label.push_str("-against");
    }
    Plan {
        row,
        build,
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
    let runs = runs_of(rows, ctx.against.is_some());
    let main = plans(run_prefix, opts.rounds, &runs, MAIN_SIZE, opts.backlog);
    run_all(ctx, main, &mut all).await?;

    let by_size = process_rows(rows);
    let swept = sweep_sizes(opts, ctx, run_prefix, &by_size, &mut all).await?;
    let mut memory = vec![(MAIN_SIZE, opts.backlog)];
    if !opts.no_memory && rows.contains(&Row::F2) {
        let large = (LARGE_SIZE, opts.backlog_for(LARGE_SIZE));
        if !swept.contains(&large) {
            let f2 = [(Row::F2, Build::This)];
            let plan = plans(run_prefix, 1, &f2, large.0, large.1);
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
    against(ctx, &all, rows, &main_and(opts, &swept), opts.rounds);
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
    let runs = runs_of(rows, ctx.against.is_some());
    let main = plans(run_prefix, opts.rounds, &runs, MAIN_SIZE, opts.backlog);
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
    against(ctx, &all, rows, &main_and(opts, &swept), opts.rounds);
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
            let runs = runs_of(rows, ctx.against.is_some());
            let sweep = plans(run_prefix, opts.rounds, &runs, size, backlog);
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
        let mut order: Vec<((Row, Build), u64)> = runs_of(rows, ctx.against.is_some())
            .into_iter()
            .flat_map(|run| backlogs.iter().map(move |&backlog| (run, backlog)))
            .collect();
        if round % 2 == 0 {
            order.reverse();
        }
        let runs = order
            .into_iter()
            .map(|(run, backlog)| plan(run_prefix, round, run, MAIN_SIZE, backlog))
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
    let cases: Vec<(usize, u64)> = backlogs.iter().map(|&b| (MAIN_SIZE, b)).collect();
    against(ctx, &all, rows, &cases, opts.rounds);
    notes(&all);
    Ok(())
}

/// The main table's body size and backlog, then the others of `swept`.
fn main_and(opts: &Opts, swept: &[(usize, u64)]) -> Vec<(usize, u64)> {
    let main = (MAIN_SIZE, opts.backlog);
    std::iter::once(main)
        .chain(swept.iter().copied().filter(|&case| case != main))
        .collect()
}

/// With `--against`, the forwarder rows of both builds side by side, one
/// table per body size and backlog in `cases`.
fn against(ctx: &Ctx, all: &[Outcome], rows: &[Row], cases: &[(usize, u64)], rounds: u32) {
    let Some(against) = &ctx.against else {
        return;
    };
    for &(size, backlog) in cases {
        println!(
            "## This build against {}: {} bodies, backlog {backlog}, medians of {rounds} round(s)\n",
            against.label,
            report::size_label(size),
        );
        println!(
            "{}",
            report::against(all, rows, size, backlog, &against.label)
        );
    }
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
            o.plan.label(),
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
