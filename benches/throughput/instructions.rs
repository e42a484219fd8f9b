//! `--instructions`: what a message costs the forwarder in instructions,
//! counted by valgrind's callgrind rather than timed, so that a change of a
//! few percent shows through a machine whose speed drifts.
//!
//! Each row (B1, F1 and F2 unless `--rows`) runs under callgrind twice per
//! round: with `--instructions-backlog` messages preloaded and with a
//! quarter of that. The difference of the two totals, over the difference
//! of the backlogs, is the cost of one message with start-up and shutdown
//! cancelled out. It counts user-space instructions of every thread of the
//! process (the runtime's worker and lapin's I/O threads alike), not the
//! kernel's work for sockets and thread wake-ups, which `perf` shows.
//!
//! With `--against`, the forwarder rows run for both builds in every
//! round, from the same backlogs, and a second table puts the two counts
//! side by side with the median of the per-round ratios.

use std::sync::Arc;

use crate::modes::{queues_label, run_at_backlogs};
use crate::opts::Opts;
use crate::report::median;
use crate::rows::{Build, Ctx, Outcome, Row};

pub async fn run(
    opts: &Opts,
    ctx: &Arc<Ctx>,
    run_prefix: &str,
    rows: &[Row],
) -> Result<(), String> {
    let large = opts.instructions_backlog.max(4);
    let small = large / 4;
    let all = run_at_backlogs(ctx, run_prefix, opts.rounds, rows, &[small, large]).await?;
    println!(
        "\n## Instructions per message (callgrind), 1 KiB bodies{}, backlogs {small} and {large}, medians of {} round(s)\n",
        queues_label(opts),
        opts.rounds
    );
    println!("{}", table(&all, rows, opts.rounds, (small, large)));
    if let Some(against) = &ctx.against {
        println!(
            "## Instructions per message, this build against {}\n",
            against.label
        );
        println!(
            "{}",
            side_by_side(&all, rows, opts.rounds, (small, large), &against.label)
        );
    }
    // Only what the after-run checks found: the timing caveats of the
    // other modes do not apply to counted instructions.
    for o in &all {
        for note in &o.notes {
            println!("NOTE round {} {}: {note}", o.plan.round, o.plan.label());
        }
    }
    Ok(())
}

/// Instructions per message of `row` by `build` in `round`: the
/// difference of its two runs over the difference of their backlogs.
fn per_message(
    all: &[Outcome],
    (row, build): (Row, Build),
    round: u32,
    (small, large): (u64, u64),
) -> Option<f64> {
    let total = |backlog: u64| {
        all.iter()
            .find(|o| {
                o.plan.row == row
                    && o.plan.build == build
                    && o.plan.round == round
                    && o.plan.backlog == backlog
            })
            .and_then(|o| o.instructions)
    };
    let (low, high) = (total(small)?, total(large)?);
    Some((high as f64 - low as f64) / (large - small) as f64)
}

/// One row's counts over its rounds.
struct Counted {
    row: Row,
    median: Option<f64>,
    /// (max - min) / median, percent.
    spread: Option<f64>,
    rounds: Vec<f64>,
}

fn table(all: &[Outcome], rows: &[Row], rounds: u32, backlogs: (u64, u64)) -> String {
    let counted: Vec<Counted> = rows
        .iter()
        .map(|&row| {
            let values: Vec<f64> = (1..=rounds)
                .filter_map(|round| per_message(all, (row, Build::This), round, backlogs))
                .collect();
            let low = values.iter().copied().reduce(f64::min);
            let high = values.iter().copied().reduce(f64::max);
            let mid = median(values.clone());
            let spread = mid
                .zip(low.zip(high))
                .map(|(m, (l, h))| (h - l) / m * 100.0);
            Counted {
                row,
                median: mid,
                spread,
                rounds: values,
            }
        })
        .collect();
    let floor = counted
        .iter()
        .find(|c| c.row == Row::B1)
        .and_then(|c| c.median);
    let thousands = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.1}k", v / 1000.0));
    let mut out = String::from(
        "| row | what | instructions per message | spread | rounds | per copy | per copy above B1 |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for Counted {
        row,
        median: per_msg,
        spread,
        rounds,
    } in &counted
    {
        let each: Vec<String> = rounds.iter().map(|v| thousands(Some(*v))).collect();
        let per_copy = per_msg.map(|v| v / row.copies_per_msg() as f64);
        let above = per_copy.zip(floor).map(|(c, f)| c - f);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            row.label(),
            row.what(),
            thousands(*per_msg),
            spread.map_or("-".to_owned(), |s| format!("{s:.1}%")),
            each.join(" "),
            thousands(per_copy),
            thousands(above),
        ));
    }
    out
}

/// Each forwarder row of `rows` by this build and by the other (`label`):
/// both medians, the median of the per-round ratios this / other, and
/// those ratios round by round.
fn side_by_side(
    all: &[Outcome],
    rows: &[Row],
    rounds: u32,
    backlogs: (u64, u64),
    label: &str,
) -> String {
    let thousands = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.1}k", v / 1000.0));
    let mut out = format!(
        "| row | this | {label} | this / {label} | by round | per copy this | per copy {label} |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for &row in rows.iter().filter(|r| r.is_forwarder()) {
        let count = |build: Build, round: u32| per_message(all, (row, build), round, backlogs);
        let of = |build: Build| median((1..=rounds).filter_map(|r| count(build, r)).collect());
        let ratios: Vec<f64> = (1..=rounds)
            .filter_map(|r| Some(count(Build::This, r)? / count(Build::Against, r)?))
            .collect();
        let each: Vec<String> = ratios.iter().map(|v| format!("{v:.3}")).collect();
        let per_copy = |v: Option<f64>| v.map(|v| v / row.copies_per_msg() as f64);
        let (this, other) = (of(Build::This), of(Build::Against));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            row.label(),
            thousands(this),
            thousands(other),
            median(ratios).map_or("-".to_owned(), |r| format!("{r:.3}")),
            each.join(" "),
            thousands(per_copy(this)),
            thousands(per_copy(other)),
        ));
    }
    out
}
