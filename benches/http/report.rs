//! The output: a header saying what ran where, one Markdown table with
//! both rows, the ratio of their rates and the goals.

use crate::opts::{Opts, Row};
use crate::rows::Outcome;

/// H's requests/s over M's must be at least this.
pub const GOAL_RATIO: f64 = 5.0;
/// H's p99 at half its maximum rate must be under this, in milliseconds.
pub const GOAL_P99_MS: f64 = 20.0;

/// The lines above the table.
pub struct Header {
    pub machine: String,
    pub broker: String,
    pub forwarder: String,
    pub management_port: u16,
}

pub fn header(opts: &Opts, h: &Header) -> String {
    [
        "# switchyard HTTP ingress benchmark".to_owned(),
        String::new(),
        format!("- machine: {}", h.machine),
        format!(
            "- broker: a private node of the benchmark's own, {}",
            h.broker
        ),
        format!("- forwarder: {}", h.forwarder),
        format!(
            "- queues: {}",
            if opts.quorum {
                "quorum"
            } else {
                "classic, durable"
            }
        ),
        format!(
            "- load: {} concurrent clients in the benchmark's process, each on a keep-alive \
             HTTP/1.1 connection of its own; {} B bodies, persistent; per row {:.0} s at the \
             maximum rate after a {:.0} s warm-up, then {:.0} s at {} on a fixed schedule; {} \
             round(s), rows in the order {}",
            opts.clients,
            opts.size,
            opts.secs,
            opts.warmup_secs,
            opts.latency_secs,
            opts.latency_rate
                .map_or("half that rate".to_owned(), |r| format!("{r} requests/s")),
            opts.rounds,
            opts.rows
                .iter()
                .map(|r| r.label())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        format!(
            "- M: `POST /api/exchanges/%2F/{{fanout}}/publish` on the management listener \
             (port {}), basic auth, a fanout exchange bound to the row's two durable queues; \
             accepted = `200` with `{{\"routed\":true}}`",
            h.management_port
        ),
        "- H: `POST /messages/bench` on switchyard's ingress, the seed scenario (branches \
         service and logging, each with a backup); accepted = `202`: both copies confirmed"
            .to_owned(),
        "- A: the floor under H, no HTTP and no forwarder: the benchmark's clients publish the \
         same body to the same two queues over AMQP (a confirm channel each on one connection, \
         mandatory, persistent) and await both confirms; its latency run is at H's rate"
            .to_owned(),
    ]
    .join("\n")
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.digits$}"))
}

/// One row's figures in one round.
#[derive(Debug, Clone, Default)]
struct Figures {
    rate: f64,
    broker: Option<f64>,
    forwarder: Option<f64>,
    total: Option<f64>,
    client: Option<f64>,
    others: Option<f64>,
    asked: Option<f64>,
    got: Option<f64>,
    p50: Option<f64>,
    p99: Option<f64>,
    max: Option<f64>,
    refused: u64,
}

impl Figures {
    fn of(o: &Outcome) -> Self {
        let max = &o.max;
        let used = &max.used;
        let broker = max.us_per_request(used.broker);
        let forwarder = max.us_per_request(used.forwarder);
        let mut figures = Self {
            rate: max.phase.rate(),
            broker,
            forwarder,
            total: broker.map(|b| b + forwarder.unwrap_or(0.0)),
            client: max.us_per_request(used.client),
            others: used.others_cores(),
            refused: max.phase.tally.refused(),
            ..Self::default()
        };
        if let Some((rate, m)) = &o.latency {
            let t = &m.phase.tally;
            figures.asked = Some(*rate);
            figures.got = Some(m.phase.rate());
            figures.p50 = t.latency_ms(0.50);
            figures.p99 = t.latency_ms(0.99);
            figures.max = t.latency_ms(1.0);
            figures.refused += t.refused();
        }
        figures
    }
}

/// The median of the values there are.
fn median(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let mut values: Vec<f64> = values.into_iter().flatten().collect();
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

/// The table (medians over the rounds), the ratio, the goals, the rounds
/// one by one when there are several, and the notes.
pub fn table(rounds: &[Vec<Outcome>]) -> String {
    let several = rounds.len() > 1;
    let title = if several {
        format!("medians of {} rounds", rounds.len())
    } else {
        "one round".to_owned()
    };
    let mut out = vec![
        String::new(),
        format!("## Requests per second, CPU per request and latency ({title})"),
        String::new(),
        "| row | what | requests/s | broker µs/req | switchyard µs/req | broker + switchyard µs/req | \
         load generator µs/req | others (cores) | latency run: asked / got req/s | p50 ms | p99 ms | max ms | not accepted |"
            .to_owned(),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            .to_owned(),
    ];
    let rows: Vec<Row> = Row::ALL
        .into_iter()
        .filter(|row| rounds.iter().flatten().any(|o| o.row == *row))
        .collect();
    let figures = |row: Row| -> Vec<Figures> {
        rounds
            .iter()
            .flatten()
            .filter(|o| o.row == row)
            .map(Figures::of)
            .collect()
    };
    for row in &rows {
        let f = figures(*row);
        let m = |get: fn(&Figures) -> Option<f64>| median(f.iter().map(get));
        let rates = match (m(|f| f.asked), m(|f| f.got)) {
            (Some(asked), Some(got)) => format!("{asked:.0} / {got:.0}"),
            _ => "-".to_owned(),
        };
        out.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {rates} | {} | {} | {} | {} |",
            row.label(),
            row.what(),
            opt(m(|f| Some(f.rate)), 0),
            opt(m(|f| f.broker), 0),
            match row {
                Row::H => opt(m(|f| f.forwarder), 0),
                Row::M | Row::A => "-".to_owned(),
            },
            opt(m(|f| f.total), 0),
            opt(m(|f| f.client), 0),
            opt(m(|f| f.others), 2),
            opt(m(|f| f.p50), 2),
            opt(m(|f| f.p99), 2),
            opt(m(|f| f.max), 1),
            f.iter().map(|f| f.refused).sum::<u64>(),
        ));
    }
    out.push(String::new());
    // Each round's H / M, then their median.
    let by_round: Vec<(Option<Figures>, Option<Figures>, Option<Figures>)> = rounds
        .iter()
        .map(|round| {
            let find = |row: Row| round.iter().find(|o| o.row == row).map(Figures::of);
            (find(Row::M), find(Row::H), find(Row::A))
        })
        .collect();
    let ratios: Vec<Option<f64>> = by_round
        .iter()
        .map(|(m, h, _)| match (m, h) {
            (Some(m), Some(h)) if m.rate > 0.0 => Some(h.rate / m.rate),
            _ => None,
        })
        .collect();
    match median(ratios.iter().copied()) {
        Some(ratio) => {
            out.push(format!("- H / M requests per second: {ratio:.1}×"));
            out.push(format!(
                "- goal: H ≥ {GOAL_RATIO:.0}× M's requests/s: {} ({ratio:.1}×)",
                pass(ratio >= GOAL_RATIO)
            ));
        }
        None => out.push("- H / M: needs both rows".to_owned()),
    }
    let h = figures(Row::H);
    // The floor's tail on the same traffic says how much of a miss is the broker's.
    let floor = match median(figures(Row::A).iter().map(|f| f.p99)) {
        Some(a) => format!("; the AMQP floor A on the same traffic: {a:.2} ms"),
        None => String::new(),
    };
    match median(h.iter().map(|f| f.p99)) {
        Some(p99) => out.push(format!(
            "- goal: H's p99 < {GOAL_P99_MS:.0} ms at half its maximum rate ({} requests/s): {} ({p99:.2} ms{floor})",
            opt(median(h.iter().map(|f| f.asked)), 0),
            pass(p99 < GOAL_P99_MS),
        )),
        None => out.push("- H's p99: no latency run".to_owned()),
    }
    if several {
        out.push(String::new());
        out.push("### By round".to_owned());
        out.push(String::new());
        out.push(
            "| round | M req/s | H req/s | A req/s | H / M | M p99 ms | H p99 ms | A p99 ms | others (cores) M / H / A |"
                .to_owned(),
        );
        out.push("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |".to_owned());
        for (i, ((m, h, a), ratio)) in by_round.iter().zip(&ratios).enumerate() {
            let get = |f: &Option<Figures>, v: fn(&Figures) -> Option<f64>, digits: usize| {
                opt(f.as_ref().and_then(v), digits)
            };
            out.push(format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} |",
                i + 1,
                get(m, |f| Some(f.rate), 0),
                get(h, |f| Some(f.rate), 0),
                get(a, |f| Some(f.rate), 0),
                opt(*ratio, 2),
                get(m, |f| f.p99, 1),
                get(h, |f| f.p99, 1),
                get(a, |f| f.p99, 1),
                get(m, |f| f.others, 2),
                get(h, |f| f.others, 2),
                get(a, |f| f.others, 2),
            ));
        }
    }
    let notes: Vec<String> = rounds
        .iter()
        .enumerate()
        .flat_map(|(i, round)| {
            round.iter().flat_map(move |o| {
                o.notes
                    .iter()
                    .map(move |note| format!("- NOTE round {} {}: {note}", i + 1, o.row.label()))
            })
        })
        .collect();
    if !notes.is_empty() {
        out.push(String::new());
        out.extend(notes);
    }
    out.join("\n")
}

fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}
