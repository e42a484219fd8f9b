//! The tables: medians over the rounds, as Markdown, so that a run's output
//! can be pasted into BENCHMARKS.md as it is.

use std::fmt::Write;

use crate::latency::Latency;
use crate::rows::{Build, Outcome, Row};

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

/// The runs of `row` by `build` at `size` bytes and `backlog`.
fn runs(all: &[Outcome], (row, build): (Row, Build), size: usize, backlog: u64) -> Vec<&Outcome> {
    all.iter()
        .filter(|o| {
            o.plan.row == row
                && o.plan.build == build
                && o.plan.size == size
                && o.plan.backlog == backlog
        })
        .collect()
}

/// The medians of this build's runs of `row` at `size` bytes and `backlog`.
pub fn stats(all: &[Outcome], row: Row, size: usize, backlog: u64) -> Option<Stats> {
    stats_of(all, (row, Build::This), size, backlog)
}

/// The medians of the runs of `row` by `build` at `size` bytes and `backlog`.
pub fn stats_of(all: &[Outcome], run: (Row, Build), size: usize, backlog: u64) -> Option<Stats> {
    let runs = runs(all, run, size, backlog);
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
    let costs = costs(all, size, backlog);
    if !costs.is_empty() {
        out.push('\n');
        out.push_str(&costs);
    }
    out
}

/// What the journal and span export cost F2, against the goals:
/// a ratio of rates, `numerator / denominator`, at least the goal if any.
const COSTS: [(Row, Row, Option<f64>, &str); 6] = [
    (Row::F2, Row::F2N, Some(0.95), "the journal (on / off)"),
    (Row::F2, Row::F2C, None, "control (on / off)"),
    (
        Row::F2,
        Row::F2X,
        Some(0.97),
        "journal and control (the defaults / both off)",
    ),
    (Row::F2N, Row::F2X, None, "control, the journal off in both"),
    (
        Row::F2T,
        Row::F2,
        Some(0.90),
        "span export (on / off, the journal on in both)",
    ),
    (Row::F2T, Row::F2N, None, "journal and export / neither"),
];

/// Each pair of [`COSTS`] that ran: its per-round msgs/s ratios (rows of
/// one round ran minutes apart, in alternating order), their median and
/// range, the goal met or not; then the spans F2T exported per message.
fn costs(all: &[Outcome], size: usize, backlog: u64) -> String {
    let msgs = |o: &Outcome| Some(o.msgs_per_sec());
    let mut out = String::new();
    for (a, b, goal, what) in COSTS {
        let at = (size, backlog);
        let ratios = paired(
            all,
            (a, Build::This),
            (b, Build::This),
            at,
            &msgs,
            &msgs,
            |x, y| x / y,
        );
        let Some(mid) = median(ratios.clone()) else {
            continue;
        };
        let low = ratios.iter().copied().fold(f64::MAX, f64::min);
        let high = ratios.iter().copied().fold(f64::MIN, f64::max);
        let each: Vec<String> = ratios.iter().map(|v| format!("{v:.3}")).collect();
        let verdict = if let Some(goal) = goal {
            let pass = if mid >= goal { "PASS" } else { "FAIL" };
            format!(
                "; goal ≥ {goal:.2} (a cost of at most {:.0}%): {pass}",
                (1.0 - goal) * 100.0
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "- cost of {what}: {} / {}, msgs/s, median {mid:.3} (range {low:.3}–{high:.3}; by round {}){verdict}",
            a.label(),
            b.label(),
            each.join(" "),
        );
    }
    let spans = median(
        runs(all, (Row::F2T, Build::This), size, backlog)
            .iter()
            .filter_map(|o| o.spans_per_msg())
            .collect(),
    );
    if let Some(spans) = spans {
        let _ = writeln!(
            out,
            "- F2T: {spans:.2} spans received per message (median; a forward and a publish per copy make 3, fewer means export dropped some)"
        );
    }
    // The receiver decodes in this process: its CPU is the collector's,
    // beside the poller's that every row has.
    let own = |row: Row| {
        let runs = runs(all, (row, Build::This), size, backlog);
        median(
            runs.iter()
                .filter_map(|o| o.window.us_per_copy(Some(o.window.own_cpu)))
                .collect(),
        )
    };
    if let (Some(with), Some(without)) = (own(Row::F2T), own(Row::F2)) {
        let _ = writeln!(
            out,
            "- the benchmark's own process (poller, and in F2T the receiver decoding the spans): {with:.1} µs/copy in F2T, {without:.1} in F2"
        );
    }
    out
}

/// Ratios between rows, each the median of the per-round ratios: the rows
/// of one round ran minutes apart at most, so load that comes and goes
/// between rounds cancels out better than in a ratio of medians.
fn ratios(all: &[Outcome], size: usize, backlog: u64) -> String {
    let runs = |row: Row| runs(all, (row, Build::This), size, backlog);
    // The median over the rounds of `combine(f(a's run), g(b's run))`.
    let per_round = |a: Row,
                     b: Row,
                     f: &dyn Fn(&Outcome) -> Option<f64>,
                     g: &dyn Fn(&Outcome) -> Option<f64>,
                     combine: fn(f64, f64) -> f64| {
        let (a, b) = ((a, Build::This), (b, Build::This));
        median(paired(all, a, b, (size, backlog), f, g, combine))
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
    line(
        "F2 / F2N, msgs/s (journal on / off)",
        ratio(Row::F2, Row::F2N, &msgs, &msgs),
    );
    line(
        "F2T / F2, msgs/s (span export on / off, the journal on in both)",
        ratio(Row::F2T, Row::F2, &msgs, &msgs),
    );
    line(
        "forwarder µs/copy F2 − F2N (the journal's work in the forwarder; a difference)",
        per_round(Row::F2, Row::F2N, &forwarder, &forwarder, |x, y| x - y),
    );
    line(
        "broker µs/copy F2 − F2N (the journal's stream writes in the broker; a difference)",
        per_round(Row::F2, Row::F2N, &broker, &broker, |x, y| x - y),
    );
    line(
        "F2 / F2X, msgs/s (journal and control on / both off)",
        ratio(Row::F2, Row::F2X, &msgs, &msgs),
    );
    line(
        "forwarder µs/copy F2 / F2X (journal and control on / both off; goal ≤ 1.10)",
        ratio(Row::F2, Row::F2X, &forwarder, &forwarder),
    );
    line(
        "forwarder µs/copy F2T − F2 (span export's work in the forwarder; a difference)",
        per_round(Row::F2T, Row::F2, &forwarder, &forwarder, |x, y| x - y),
    );
    out
}

/// A measure of one run, when it has one.
type Measure<'a> = &'a dyn Fn(&Outcome) -> Option<f64>;

/// `combine(f(a's run), g(b's run))` for each round that ran both, in
/// round order.
fn paired(
    all: &[Outcome],
    a: (Row, Build),
    b: (Row, Build),
    (size, backlog): (usize, u64),
    f: Measure<'_>,
    g: Measure<'_>,
    combine: fn(f64, f64) -> f64,
) -> Vec<f64> {
    let (a, b) = (runs(all, a, size, backlog), runs(all, b, size, backlog));
    let mut values: Vec<(u32, f64)> = a
        .iter()
        .filter_map(|x| {
            let y = b.iter().find(|y| y.plan.round == x.plan.round)?;
            Some((x.plan.round, combine(f(x)?, g(y)?)))
        })
        .collect();
    values.sort_by_key(|(round, _)| *round);
    values.into_iter().map(|(_, v)| v).collect()
}

/// The Shovel row a forwarder row is compared with as today: F1 with S,
/// F2 with S2.
fn shovel_of(row: Row) -> Option<Row> {
    match row {
        Row::F1 => Some(Row::S),
        Row::F2 => Some(Row::S2),
        _ => None,
    }
}

/// `--against`: each forwarder row of `rows` run by this build and by the
/// other (`label`) side by side: the medians of each, the median of the
/// per-round ratios this / other (the two ran next to each other in every
/// round), and each build against Shovel as the main table puts it; then
/// the per-round ratios, to judge the spread.
pub fn against(all: &[Outcome], rows: &[Row], size: usize, backlog: u64, label: &str) -> String {
    let mut out = format!(
        "| row | msgs/s this | msgs/s {label} | this / {label} | forwarder µs/copy this | \
         forwarder µs/copy {label} | this / {label} | broker µs/copy this | broker µs/copy {label} | \
         vs Shovel this | vs Shovel {label} |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    let msgs = |o: &Outcome| Some(o.msgs_per_sec());
    let forwarder = |o: &Outcome| o.forwarder_us();
    let ratio = |x: f64, y: f64| x / y;
    let at = (size, backlog);
    let mut rounds = String::new();
    for &row in rows.iter().filter(|r| r.is_forwarder()) {
        let (this, other) = ((row, Build::This), (row, Build::Against));
        let (Some(a), Some(b)) = (
            stats_of(all, this, size, backlog),
            stats_of(all, other, size, backlog),
        ) else {
            continue;
        };
        let msgs_ratios = paired(all, this, other, at, &msgs, &msgs, ratio);
        let cpu_ratios = paired(all, this, other, at, &forwarder, &forwarder, ratio);
        let vs_shovel = |build: Build| {
            let shovel = (shovel_of(row)?, Build::This);
            median(paired(all, (row, build), shovel, at, &msgs, &msgs, ratio))
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.label(),
            a.msgs,
            b.msgs,
            num(median(msgs_ratios.clone()), 3),
            num(a.forwarder_us, 1),
            num(b.forwarder_us, 1),
            num(median(cpu_ratios.clone()), 3),
            num(a.broker_us, 1),
            num(b.broker_us, 1),
            num(vs_shovel(Build::This), 2),
            num(vs_shovel(Build::Against), 2),
        );
        let each = |values: &[f64]| {
            let each: Vec<String> = values.iter().map(|v| format!("{v:.3}")).collect();
            each.join(" ")
        };
        let _ = writeln!(
            rounds,
            "- {}, this / {label} by round: msgs/s {}; forwarder µs/copy {}",
            row.label(),
            each(&msgs_ratios),
            each(&cpu_ratios),
        );
    }
    if !rounds.is_empty() {
        out.push('\n');
        out.push_str(&rounds);
    }
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
