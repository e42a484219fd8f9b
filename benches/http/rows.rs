//! The rows on one private node. Each declares (or has switchyard
//! declare) its own durable queues under a fresh prefix, then runs the same
//! phases: a probe until one request is accepted, a warm-up, the
//! maximum-rate run, the latency run at half that rate. After each counted
//! phase the two queues must hold exactly one copy per accepted request;
//! they are purged before the next phase and everything the row created is
//! removed at the end, whatever happened.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::QueuePurgeOptions;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use serde_json::json;
use tokio_util::task::AbortOnDropHandle;

use crate::cpu::{Used, Watched};
use crate::load::{self, AmqpShape, Pace, Phase, Shape};
use crate::opts::{Opts, Row};
use crate::support::TestBroker;
use crate::support::config::{Forwarder, Value};
use crate::support::harness::{Process, wait_consumers};

/// How long a row may take to accept its first request.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the queue counts may take to settle after a phase.
const COUNT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long switchyard may take to finish after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// `Authorization` for guest:guest (base64 of `guest:guest`).
const GUEST_BASIC: &str = "Basic Z3Vlc3Q6Z3Vlc3Q=";
/// The routing key of every request.
const ROUTING_KEY: &str = "bench";
/// The seed scenario's `max_in_flight` (more than the clients, so never a 429).
const MAX_IN_FLIGHT: u32 = 2000;

/// What every row needs.
pub struct Ctx {
    pub opts: Opts,
    pub amqp_url: String,
    /// The management plugin's listener.
    pub management: SocketAddr,
    /// The broker's Erlang VM, for its CPU.
    pub broker_pid: Option<u32>,
    pub clock_ticks: f64,
}

/// A counted phase: what it got and the CPU it took.
#[derive(Debug, Clone)]
pub struct Measured {
    pub phase: Phase,
    pub used: Used,
}

impl Measured {
    pub fn us_per_request(&self, cpu: Option<f64>) -> Option<f64> {
        Used::us_per(cpu, self.phase.tally.accepted)
    }
}

/// What one row measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub row: Row,
    pub max: Measured,
    /// The rate asked for and what the latency run got.
    pub latency: Option<(f64, Measured)>,
    /// What went wrong or is worth knowing: refusals, counts, reconnections.
    pub notes: Vec<String>,
}

/// The names a row creates under `p`, known before it starts.
fn topology(row: Row, p: &str) -> (Vec<String>, Vec<String>) {
    let q = |s: &str| format!("{p}.{s}");
    match row {
        Row::M => (vec![q("service"), q("logging")], vec![q("fanout")]),
        Row::A => (vec![q("service"), q("logging")], Vec::new()),
        Row::H => (
            vec![
                q("in"),
                q("dlq"),
                q("service"),
                q("service.backup"),
                q("logging"),
                q("logging.backup"),
            ],
            vec![q("dlx")],
        ),
    }
}

/// Runs `row` under prefix `p` in a task of its own and removes what it
/// created afterwards, whether it finished, failed or panicked.
/// `latency_rate` is the latency run's rate; `None`: half the row's maximum.
pub async fn run(
    ctx: Arc<Ctx>,
    row: Row,
    p: String,
    latency_rate: Option<f64>,
) -> Result<Outcome, String> {
    let task = AbortOnDropHandle::new(tokio::spawn(run_row(
        ctx.clone(),
        row,
        p.clone(),
        latency_rate,
    )));
    let result = match task.await {
        Ok(result) => result,
        Err(e) => Err(format!("{e}")),
    }
    .map_err(|e| format!("row {} failed: {e}", row.label()));
    let broker = TestBroker::connect_to(&ctx.amqp_url, &format!("{p}-cleanup")).await;
    let (queues, exchanges) = topology(row, &p);
    let queues: Vec<&str> = queues.iter().map(String::as_str).collect();
    let exchanges: Vec<&str> = exchanges.iter().map(String::as_str).collect();
    broker.cleanup(&queues, &exchanges).await;
    broker.close().await;
    result
}

async fn run_row(
    ctx: Arc<Ctx>,
    row: Row,
    p: String,
    latency_rate: Option<f64>,
) -> Result<Outcome, String> {
    let q = |s: &str| format!("{p}.{s}");
    let broker = TestBroker::connect_to(&ctx.amqp_url, &format!("{p}-bench")).await;
    let counted = [q("service"), q("logging")];
    let outcome = match row {
        Row::M => {
            broker
                .declare_exchange(&q("fanout"), ExchangeKind::Fanout)
                .await;
            for queue in &counted {
                declare(&broker, queue, ctx.opts.quorum).await;
                broker.bind(queue, &q("fanout"), "").await;
            }
            let shape = management_shape(&ctx, &q("fanout"))?;
            let watched = Watched {
                broker: ctx.broker_pid,
                forwarder: None,
            };
            phases(&ctx, row, &broker, &shape, watched, &counted, latency_rate).await
        }
        Row::A => {
            for queue in &counted {
                declare(&broker, queue, ctx.opts.quorum).await;
            }
            let connection = Connection::connect(
                &ctx.amqp_url,
                ConnectionProperties::default()
                    .with_connection_name(format!("{p}-publisher").into()),
            )
            .await
            .map_err(|e| format!("connect the publisher: {e}"))?;
            let shape = Arc::new(Shape::Amqp(AmqpShape {
                connection,
                queues: counted.to_vec(),
                body: body(ctx.opts.size),
            }));
            let watched = Watched {
                broker: ctx.broker_pid,
                forwarder: None,
            };
            let outcome = phases(&ctx, row, &broker, &shape, watched, &counted, latency_rate).await;
            if let Shape::Amqp(amqp) = shape.as_ref() {
                let _ = amqp.connection.close(200, "OK".into()).await;
            }
            outcome
        }
        Row::H => {
            let addr = free_addr()?;
            let process = Process::spawn(&p, &forwarder_toml(&ctx, &p, addr));
            wait_consumers(&broker, &q("in"), 1).await;
            let shape = Arc::new(Shape::post(
                addr,
                &format!("/messages/{ROUTING_KEY}"),
                &[("content-type", "application/octet-stream".to_owned())],
                body(ctx.opts.size),
                |status, _| status == 202,
            )?);
            let watched = Watched {
                broker: ctx.broker_pid,
                forwarder: Some(process.pid()),
            };
            let outcome = phases(&ctx, row, &broker, &shape, watched, &counted, latency_rate).await;
            stop_forwarder(process, &broker, &p, outcome).await
        }
    };
    broker.close().await;
    outcome
}

/// switchyard on the seed scenario with its ingress on `addr`: branches
/// service and logging over every message, each with a backup; `nack`
/// dead-lettering, prefetch 1000, a 10 s shutdown bound.
fn forwarder_toml(ctx: &Ctx, p: &str, addr: SocketAddr) -> String {
    let config = Forwarder::at(&ctx.amqp_url, p)
        .mode("nack")
        .top("shutdown_timeout_ms", 10_000)
        .inbound("prefetch", 1000u32)
        .seed(p)
        .http(&[
            ("listen", Value::from(addr.to_string())),
            ("max_in_flight", Value::from(MAX_IN_FLIGHT)),
        ]);
    if ctx.opts.quorum {
        config.quorum().toml()
    } else {
        config.toml()
    }
}

/// Declares durable `queue`, a quorum queue with `quorum`.
async fn declare(broker: &TestBroker, queue: &str, quorum: bool) {
    if quorum {
        broker.declare_quorum_queue(queue).await;
    } else {
        broker.declare_queue(queue).await;
    }
}

/// A loopback address free a moment ago, for the ingress to listen on.
fn free_addr() -> Result<SocketAddr, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(|e| format!("a free port: {e}"))
}

/// The body of every request: `size` bytes of lower-case letters (text, so
/// the management API can carry it as a `string` payload unchanged).
fn body(size: usize) -> Vec<u8> {
    (0..size).map(|j| b'a' + (j % 26) as u8).collect()
}

/// The management API's publish into `fanout`: the same body, persistent.
fn management_shape(ctx: &Ctx, fanout: &str) -> Result<Arc<Shape>, String> {
    let payload = String::from_utf8_lossy(&body(ctx.opts.size)).into_owned();
    let request = json!({
        "properties": { "delivery_mode": 2, "content_type": "application/octet-stream" },
        "routing_key": ROUTING_KEY,
        "payload": payload,
        "payload_encoding": "string",
    });
    let shape = Shape::post(
        ctx.management,
        &format!("/api/exchanges/%2F/{fanout}/publish"),
        &[
            ("content-type", "application/json".to_owned()),
            ("authorization", GUEST_BASIC.to_owned()),
        ],
        request.to_string().into_bytes(),
        |status, body| {
            status == 200
                && serde_json::from_slice::<serde_json::Value>(body)
                    .is_ok_and(|v| v["routed"] == json!(true))
        },
    )?;
    Ok(Arc::new(shape))
}

/// The probe, the warm-up, the maximum-rate run and the latency run (at
/// `latency_rate`, or half the maximum rate).
async fn phases(
    ctx: &Ctx,
    row: Row,
    broker: &TestBroker,
    shape: &Arc<Shape>,
    watched: Watched,
    counted: &[String],
    latency_rate: Option<f64>,
) -> Result<Outcome, String> {
    let opts = &ctx.opts;
    let label = row.label();
    let mut notes = Vec::new();
    probe(shape).await?;
    if opts.warmup_secs > 0.0 {
        let warmup = Pace::Closed(Duration::from_secs_f64(opts.warmup_secs));
        let (phase, ()) = load::run(shape, opts.clients, warmup, || ()).await?;
        eprintln!(
            "{label}: warm-up {:.0} requests/s over {:.1} s",
            phase.rate(),
            phase.elapsed.as_secs_f64()
        );
        note_refusals(&mut notes, "warm-up", &phase);
    }
    purge(broker, counted).await?;

    let pace = Pace::Closed(Duration::from_secs_f64(opts.secs));
    let max = measure(ctx, shape, watched, pace).await?;
    eprintln!(
        "{label}: {:.0} requests/s over {:.1} s, {} not accepted, {} reconnection(s)",
        max.phase.rate(),
        max.phase.elapsed.as_secs_f64(),
        max.phase.tally.refused(),
        max.phase.tally.reconnects
    );
    note_refusals(&mut notes, "maximum-rate run", &max.phase);
    notes.extend(
        check_counts(
            broker,
            counted,
            max.phase.tally.accepted,
            "maximum-rate run",
        )
        .await,
    );
    purge(broker, counted).await?;

    let mut latency = None;
    let rate = latency_rate.unwrap_or(max.phase.rate() / 2.0);
    if opts.latency_secs > 0.0 && rate > 0.0 {
        let pace = Pace::Open {
            rate,
            secs: opts.latency_secs,
        };
        let measured = measure(ctx, shape, watched, pace).await?;
        let tally = &measured.phase.tally;
        let ms = |q: f64| tally.latency_ms(q).unwrap_or(f64::NAN);
        eprintln!(
            "{label}: latency run at {rate:.0} requests/s: got {:.0}/s, ms p50 {:.2} p90 {:.2} \
             p99 {:.2} p99.9 {:.2} max {:.2}, {} not accepted",
            measured.phase.rate(),
            ms(0.50),
            ms(0.90),
            ms(0.99),
            ms(0.999),
            ms(1.0),
            tally.refused()
        );
        note_refusals(&mut notes, "latency run", &measured.phase);
        notes.extend(check_counts(broker, counted, tally.accepted, "latency run").await);
        purge(broker, counted).await?;
        latency = Some((rate, measured));
    }
    for (what, phase) in [("maximum-rate run", Some(&max.phase))]
        .into_iter()
        .chain([("latency run", latency.as_ref().map(|(_, m)| &m.phase))])
    {
        if let Some(phase) = phase
            && phase.tally.reconnects > 0
        {
            notes.push(format!(
                "{what}: the server closed keep-alive connections {} time(s); the clients \
                 opened new ones",
                phase.tally.reconnects
            ));
        }
    }
    Ok(Outcome {
        row,
        max,
        latency,
        notes,
    })
}

/// One phase with the CPU readings around it.
async fn measure(
    ctx: &Ctx,
    shape: &Arc<Shape>,
    watched: Watched,
    pace: Pace,
) -> Result<Measured, String> {
    let (phase, start) = load::run(shape, ctx.opts.clients, pace, || watched.read()).await?;
    let end = watched.read();
    Ok(Measured {
        phase,
        used: Used::between(&start, &end, ctx.clock_ticks),
    })
}

/// Sends single requests until one is accepted (the listener is up and,
/// for switchyard, its publishers are connected).
async fn probe(shape: &Arc<Shape>) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let pace = Pace::Open {
            rate: 1.0,
            secs: 1.0,
        };
        let last = match load::run(shape, 1, pace, || ()).await {
            Ok((phase, ())) if phase.tally.accepted > 0 => return Ok(()),
            Ok((phase, ())) => phase.tally.refusal_lines().join("; "),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "no request accepted within {READY_TIMEOUT:?}; the last: {last}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn note_refusals(notes: &mut Vec<String>, what: &str, phase: &Phase) {
    for line in phase.tally.refusal_lines() {
        notes.push(format!("{what}: not accepted: {line}"));
    }
}

/// Empties `queues` and waits until they read empty.
async fn purge(broker: &TestBroker, queues: &[String]) -> Result<(), String> {
    for queue in queues {
        broker
            .channel()
            .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
            .await
            .map_err(|e| format!("purge {queue}: {e}"))?;
    }
    let notes = check_counts(broker, queues, 0, "purge").await;
    match notes.is_empty() {
        true => Ok(()),
        false => Err(notes.join("; ")),
    }
}

/// Waits until every queue of `queues` holds `want`; a note for each that
/// does not within [`COUNT_TIMEOUT`].
async fn check_counts(
    broker: &TestBroker,
    queues: &[String],
    want: u64,
    what: &str,
) -> Vec<String> {
    let deadline = Instant::now() + COUNT_TIMEOUT;
    loop {
        let mut wrong = Vec::new();
        for queue in queues {
            let have = broker.try_queue_len(queue).await.map(u64::from);
            if have != Some(want) {
                wrong.push((queue, have));
            }
        }
        if wrong.is_empty() {
            return Vec::new();
        }
        if Instant::now() >= deadline {
            return wrong
                .into_iter()
                .map(|(queue, have)| match have {
                    Some(n) => format!("after the {what} {queue} holds {n}, expected {want}"),
                    None => format!("after the {what} {queue} is missing"),
                })
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops switchyard with SIGTERM; a non-zero exit or a message left in
/// its inbound, backup or dead-letter queues is a note.
async fn stop_forwarder(
    mut process: Process,
    broker: &TestBroker,
    p: &str,
    outcome: Result<Outcome, String>,
) -> Result<Outcome, String> {
    process.signal("TERM");
    let code = process.wait_exit(STOP_TIMEOUT).await;
    let mut outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            process.keep_files();
            return Err(format!(
                "{e}; switchyard's log: {}",
                process.log_path.display()
            ));
        }
    };
    let q = |s: &str| format!("{p}.{s}");
    let others = [q("in"), q("dlq"), q("service.backup"), q("logging.backup")];
    let mut notes = check_counts(broker, &others, 0, "row").await;
    if code != Some(0) {
        notes.push(format!("switchyard exited with {code:?}"));
    }
    if !notes.is_empty() || !outcome.notes.is_empty() {
        process.keep_files();
        notes.push(format!(
            "switchyard's log is kept: {}",
            process.log_path.display()
        ));
    }
    outcome.notes.extend(notes);
    Ok(outcome)
}
