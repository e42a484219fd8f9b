//! The tables: medians over the rounds, as Markdown, so that a run's output
//! can be pasted into BENCHMARKS.md as it is.

use std::fmt::Write;

use crate::latency::Latency;
use crate::rows::{Outcome, Row};

/// The median; the mean of the middle two for an even count.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

/// One row's medians over its rounds.
#[derive(Debug, Clone)]
pub struct Stats {
    pub msgs: f64,
    pub copies: f64,
    /// (max - min) / median of msgs/s, percent.
    pub spread: f64,
    pub forwarder_us: Option<f64>,
    pub broker_us: Option<f64>,
    pub total_us: Option<f64>,
    /// The largest peak RSS of the rounds, MiB.
    pub peak_rss_mib: Option<f64>,
    pub others: Option<f64>,
}

/// The medians of the runs of `row` at `size` bytes and `backlog`.
pub fn stats(all: &[Outcome], row: Row, size: usize, backlog: u64) -> Option<Stats> {
    let runs: Vec<&Outcome> = all
        .iter()
        .filter(|o| o.plan.row == row && o.plan.size == size && o.plan.backlog == backlog)
        .collect();
    let of =
        |f: &dyn Fn(&Outcome) -> Option<f64>| median(runs.iter().filter_map(|o| f(o)).collect());
    let msgs = of(&|o| Some(o.msgs_per_sec()))?;
    let rates: Vec<f64> = runs.iter().map(|o| o.msgs_per_sec()).collect();
    let spread = rates.iter().copied().fold(f64::MIN, f64::max)
        - rates.iter().copied().fold(f64::MAX, f64::min);
    Some(Stats {
        msgs,
        copies: of(&|o| Some(o.copies_per_sec()))?,
        spread: spread / msgs * 100.0,
        forwarder_us: of(&|o| o.forwarder_us()),
        broker_us: of(&|o| o.broker_us()),
        total_us: of(&|o| Some(o.forwarder_us().unwrap_or(0.0) + o.broker_us()?)),
        peak_rss_mib: runs
            .iter()
            .filter_map(|o| o.peak_rss_kib)
            .max()
            .map(|k| k as f64 / 1024.0),
        others: of(&|o| o.window.others_cores()),
    })
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("—".to_owned(), |v| format!("{v:.digits$}"))
}

/// Body size as people say it.
pub fn size_label(size: usize) -> String {
    if size >= 1024 && size.is_multiple_of(1024) {
        format!("{} KiB", size / 1024)
    } else {
        format!("{size} B")
    }
}

/// The main table: one line per row, then the ratios.
pub fn throughput(all: &[Outcome], rows: &[Row], size: usize, backlog: u64) -> String {
    let mut out = String::new();
    out.push_str(
        "| row | what | msgs/s | copies/s | spread | forwarder µs/copy | broker µs/copy | \
         total µs/copy | forwarder peak RSS | others (cores) |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for &row in rows {
        let Some(s) = stats(all, row, size, backlog) else {
            continue;
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.0}% | {} | {} | {} | {} | {} |",
            row.label(),
            row.what(),
            s.msgs,
            s.copies,
            s.spread,
            num(s.forwarder_us, 1),
            num(s.broker_us, 1),
            num(s.total_us, 1),
            s.peak_rss_mib
                .map_or("—".to_owned(), |m| format!("{m:.1} MiB")),
            num(s.others, 2),
        );
    }
    let ratios = ratios(all, size, backlog);
    if ratios.lines().count() > 2 {
        out.push('\n');
        out.push_str(&ratios);
    }
    out
}

/// Ratios between rows, each the median of the per-round ratios: the rows
/// of one round ran minutes apart at most, so load that comes and goes
/// between rounds cancels out better than in a ratio of medians.
fn ratios(all: &[Outcome], size: usize, backlog: u64) -> String {
    let runs = |row: Row| -> Vec<&Outcome> {
        all.iter()
            .filter(|o| o.plan.row == row && o.plan.size == size && o.plan.backlog == backlog)
            .collect()
    };
    // The median over the rounds of `combine(f(a's run), g(b's run))`.
    let per_round = |a: Row,
                     b: Row,
                     f: &dyn Fn(&Outcome) -> Option<f64>,
                     g: &dyn Fn(&Outcome) -> Option<f64>,
                     combine: fn(f64, f64) -> f64| {
        let (a, b) = (runs(a), runs(b));
        let values = a.iter().filter_map(|x| {
            let y = b.iter().find(|y| y.plan.round == x.plan.round)?;
            Some(combine(f(x)?, g(y)?))
        });
        median(values.collect())
    };
    let ratio = |a, b, f: &dyn Fn(&Outcome) -> Option<f64>, g: &dyn Fn(&Outcome) -> Option<f64>| {
        per_round(a, b, f, g, |x, y| x / y)
    };
    let msgs = |o: &Outcome| Some(o.msgs_per_sec());
    let copies = |o: &Outcome| Some(o.copies_per_sec());
    let twice = |o: &Outcome| Some(2.0 * o.copies_per_sec());
    let total = |o: &Outcome| Some(o.forwarder_us().unwrap_or(0.0) + o.broker_us()?);
    let forwarder = |o: &Outcome| o.forwarder_us();
    let mut out =
        String::from("| ratio (median of the per-round ratios) | value |\n| --- | ---: |\n");
    let mut line = |label: &str, value: Option<f64>| {
        if let Some(v) = value {
            let _ = writeln!(out, "| {label} | {v:.2} |");
        }
    };
    line("F1 / S, msgs/s", ratio(Row::F1, Row::S, &msgs, &msgs));
    line("F1 / B1, msgs/s", ratio(Row::F1, Row::B1, &msgs, &msgs));
    line("B1 / S, msgs/s", ratio(Row::B1, Row::S, &msgs, &msgs));
    line("F1 / B1H, msgs/s", ratio(Row::F1, Row::B1H, &msgs, &msgs));
    line("B1H / B1, msgs/s", ratio(Row::B1H, Row::B1, &msgs, &msgs));
    line(
        "F2 / S2, msgs/s (2 copies each)",
        ratio(Row::F2, Row::S2, &msgs, &msgs),
    );
    if runs(Row::TwoS).is_empty() {
        line(
            "F2 / (2 × S), copies/s (computed from S: an upper bound for two shovels)",
            ratio(Row::F2, Row::S, &copies, &twice),
        );
    } else {
        line(
            "F2 / 2S, copies/s (2S measured: two shovels side by side)",
            ratio(Row::F2, Row::TwoS, &copies, &copies),
        );
    }
    line(
        "S / F1, total CPU per copy",
        ratio(Row::S, Row::F1, &total, &total),
    );
    line(
        "S2 / F2, total CPU per copy",
        ratio(Row::S2, Row::F2, &total, &total),
    );
    line(
        "forwarder µs/copy F1 − B1 (switchyard's own work above the lapin floor; a difference, not a ratio)",
        per_round(Row::F1, Row::B1, &forwarder, &forwarder, |x, y| x - y),
    );
    let broker = |o: &Outcome| o.broker_us();
    line(
        "broker µs/copy F1 − B1 (what switchyard's traffic costs the broker above the floor's)",
        per_round(Row::F1, Row::B1, &broker, &broker, |x, y| x - y),
    );
    line(
        "broker µs/copy F1 − B1H (the same, the headers carried by both)",
        per_round(Row::F1, Row::B1H, &broker, &broker, |x, y| x - y),
    );
    out
}

/// `rows` (B1, F1, F2) per body size.
pub fn sizes(all: &[Outcome], rows: &[Row], sizes: &[(usize, u64)]) -> String {
    let mut out = String::from("| body | backlog |");
    let mut rule = String::from("| --- | ---: |");
    for row in rows {
        let r = row.label();
        let _ = write!(
            out,
            " {r} msgs/s | {r} forwarder µs/copy | {r} broker µs/copy |"
        );
        rule.push_str(" ---: | ---: | ---: |");
    }
    let _ = writeln!(out, "\n{rule}");
    for &(size, backlog) in sizes {
        let _ = write!(out, "| {} | {backlog} |", size_label(size));
        for &row in rows {
            match stats(all, row, size, backlog) {
                Some(s) => {
                    let _ = write!(
                        out,
                        " {:.0} | {} | {} |",
                        s.msgs,
                        num(s.forwarder_us, 1),
                        num(s.broker_us, 1)
                    );
                }
                None => out.push_str(" — | — | — |"),
            }
        }
        out.push('\n');
    }
    out
}

/// The forwarder's peak RSS in the F2 runs of each `(size, backlog)`.
pub fn memory(all: &[Outcome], cases: &[(usize, u64)], prefetch: u32) -> String {
    let mut out = String::from(
        "| case | forwarder peak RSS (VmHWM, largest of the runs) |\n| --- | ---: |\n",
    );
    for &(size, backlog) in cases {
        if let Some(mib) = stats(all, Row::F2, size, backlog).and_then(|s| s.peak_rss_mib) {
            let _ = writeln!(
                out,
                "| F2, {} bodies, prefetch {prefetch}, backlog {backlog} | {mib:.1} MiB |",
                size_label(size)
            );
        }
    }
    out
}

pub fn latency(runs: &[Latency]) -> String {
    let mut out = String::from(
        "| row | what | rate asked | rate published | seconds | sent | \
         arrived (service / logging) | p50 | p99 | max | forwarder CPU | broker CPU |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for l in runs {
        out += &format!(
            "| {} | {} | {:.0}/s | {:.0}/s | {:.0} | {} | {} / {} | {:.2} ms | {:.2} ms | \
             {:.2} ms | {} cores | {} cores |\n",
            l.carrier.label(),
            l.carrier.what(),
            l.rate,
            l.published_rate,
            l.secs,
            l.sent,
            l.received,
            l.logged,
            l.p50,
            l.p99,
            l.max,
            num(l.forwarder_cores, 2),
            num(l.broker_cores, 2),
        );
    }
    out
}

/// Each of `rows` at two backlogs, and each row's ratio of the two rates.
pub fn scale(all: &[Outcome], rows: &[Row], size: usize, backlogs: &[u64]) -> String {
    let mut out = String::from(
        "| row | backlog | msgs/s | copies/s | spread | forwarder µs/copy | broker µs/copy | \
         forwarder peak RSS (MiB) | others (cores) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut ratios = String::new();
    for &row in rows {
        let mut rates = Vec::new();
        for &backlog in backlogs {
            let Some(s) = stats(all, row, size, backlog) else {
                continue;
            };
            rates.push(s.msgs);
            let _ = writeln!(
                out,
                "| {} | {backlog} | {:.0} | {:.0} | {:.0}% | {} | {} | {} | {} |",
                row.label(),
                s.msgs,
                s.copies,
                s.spread,
                num(s.forwarder_us, 1),
                num(s.broker_us, 1),
                num(s.peak_rss_mib, 1),
                num(s.others, 2)
            );
        }
        if let [small, large] = rates[..] {
            let _ = writeln!(
                ratios,
                "{} msgs/s at {} / at {}: {:.2}",
                row.label(),
                backlogs[1],
                backlogs[0],
                large / small
            );
        }
    }
    if !ratios.is_empty() {
        out += "\n";
        out += &ratios;
    }
    out
}
