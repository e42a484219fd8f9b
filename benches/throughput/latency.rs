//! L: the seed scenario at a steady rate below its maximum, and LS, the
//! same traffic moved by a Shovel into a fanout exchange: the latency the
//! broker and the machine give any mover. Each message carries the time it
//! was published (nanoseconds on this process's monotonic clock, in the
//! first 8 bytes of the body); a consumer on the service queue takes the
//! difference on arrival. The logging queue is drained too, so the broker
//! holds no growing queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt, stream::FuturesUnordered};
use lapin::options::{BasicConsumeOptions, BasicPublishOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation};
use tokio::sync::oneshot;

use crate::rows::{Ctx, Row, Topology, body, start_seed_forwarder, start_seed_shovel};
use crate::support::TestBroker;
use crate::support::harness::Process;

/// How long the last messages may take to arrive after the last publish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// What moves the messages from `{p}.in` to `{p}.service` and `{p}.logging`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// L: switchyard on the seed scenario.
    Switchyard,
    /// LS: one Shovel into a fanout exchange bound to both queues.
    Shovel,
}

impl Carrier {
    pub fn label(self) -> &'static str {
        match self {
            Self::Switchyard => "L",
            Self::Shovel => "LS",
        }
    }

    pub fn what(self) -> &'static str {
        match self {
            Self::Switchyard => "switchyard, seed scenario",
            Self::Shovel => "Shovel → fanout → 2 queues",
        }
    }

    /// The names a run with this carrier creates under `p`.
    pub fn topology(self, p: &str) -> Topology {
        match self {
            Self::Switchyard => Topology::of(Row::F2, p),
            Self::Shovel => Topology::of_seed_shovel(p),
        }
    }
}

/// What the latency run measured.
#[derive(Debug, Clone)]
pub struct Latency {
    pub carrier: Carrier,
    /// The rate asked for, messages per second.
    pub rate: f64,
    /// The rate achieved by the publisher.
    pub published_rate: f64,
    pub secs: f64,
    pub sent: u64,
    /// Arrivals on the service queue, and on the logging queue.
    pub received: u64,
    pub logged: u64,
    /// Publish to arrival, milliseconds.
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// The forwarder's CPU over the run, in cores (none for a Shovel).
    pub forwarder_cores: Option<f64>,
    /// The broker's CPU over the run, in cores.
    pub broker_cores: Option<f64>,
}

/// A consumer in its own task that records (or just counts) arrivals.
struct Arrivals {
    count: Arc<AtomicU64>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<u64>>,
}

impl Arrivals {
    /// Consumes `queue` without acks; with `epoch`, keeps each message's
    /// publish-to-arrival time in nanoseconds.
    async fn start(broker: &TestBroker, queue: &str, epoch: Option<Instant>) -> Self {
        let channel = broker.fresh_channel().await;
        let mut deliveries = channel
            .basic_consume(
                queue.into(),
                "latency".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("consume {queue}: {e}"));
        let count = Arc::new(AtomicU64::new(0));
        let (stop, mut stopped) = oneshot::channel();
        let counter = count.clone();
        let task = tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let delivery = tokio::select! {
                    d = deliveries.next() => d,
                    _ = &mut stopped => break,
                };
                let Some(Ok(delivery)) = delivery else { break };
                if let Some(epoch) = epoch {
                    let now = epoch.elapsed().as_nanos() as u64;
                    let mut sent = [0u8; 8];
                    sent.copy_from_slice(&delivery.data[..8]);
                    latencies.push(now.saturating_sub(u64::from_be_bytes(sent)));
                }
                counter.fetch_add(1, Ordering::Relaxed);
            }
            let _ = channel.close(200, "OK".into()).await;
            latencies
        });
        Self { count, stop, task }
    }

    /// Stops consuming; how many arrived, and their times if recorded.
    async fn finish(self) -> (u64, Vec<u64>) {
        let _ = self.stop.send(());
        let latencies = self.task.await.expect("consumer task panicked");
        (self.count.load(Ordering::Relaxed), latencies)
    }
}

/// Publishes `rate` messages per second for `secs` through `carrier` (names
/// under `p`) and measures their latency to the service queue.
pub async fn run(
    ctx: Arc<Ctx>,
    carrier: Carrier,
    p: String,
    rate: f64,
    secs: f64,
    size: usize,
) -> Latency {
    let size = size.max(8);
    let broker = ctx.target.connect(&format!("{p}-bench")).await;
    let mut forwarder = match carrier {
        Carrier::Switchyard => Some(start_seed_forwarder(&ctx, &broker, &p).await),
        Carrier::Shovel => {
            start_seed_shovel(&ctx, &broker, &p).await;
            None
        }
    };
    let consumers = ctx.target.connect(&format!("{p}-consumer")).await;
    let epoch = Instant::now();
    let service = Arrivals::start(&consumers, &format!("{p}.service"), Some(epoch)).await;
    let logging = Arrivals::start(&consumers, &format!("{p}.logging"), None).await;
    let publisher = ctx.target.connect(&format!("{p}-publisher")).await;

    let total = (rate * secs).round() as u64;
    let inbound = format!("{p}.in");
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/octet-stream".into());
    let check = |confirm: lapin::Result<Confirmation>| match confirm {
        Ok(Confirmation::Ack(None)) => {}
        other => panic!("publish to {inbound}: {other:?}"),
    };
    let ticks_before = forwarder.as_ref().and_then(Process::cpu_ticks);
    let broker_before = ctx.target.cpu_ticks();
    let started = Instant::now();
    let mut pending = FuturesUnordered::new();
    let mut sent = 0;
    while sent < total {
        let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(total);
        while sent < due {
            let mut message = body(sent, size);
            let now = epoch.elapsed().as_nanos() as u64;
            message[..8].copy_from_slice(&now.to_be_bytes());
            let confirm = publisher
                .channel()
                .basic_publish(
                    "".into(),
                    inbound.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &message,
                    props.clone(),
                )
                .await
                .unwrap_or_else(|e| panic!("publish to {inbound}: {e}"));
            pending.push(confirm);
            sent += 1;
        }
        while let Some(Some(confirm)) = pending.next().now_or_never() {
            check(confirm);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let published_rate = sent as f64 / started.elapsed().as_secs_f64();
    while let Some(confirm) = pending.next().await {
        check(confirm);
    }
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while (service.count.load(Ordering::Relaxed) < sent
        || logging.count.load(Ordering::Relaxed) < sent)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cores = |before: Option<u64>, after: Option<u64>| match (before, after) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / ctx.clock_ticks / elapsed),
        _ => None,
    };
    let forwarder_cores = cores(
        ticks_before,
        forwarder.as_ref().and_then(Process::cpu_ticks),
    );
    let broker_cores = cores(broker_before, ctx.target.cpu_ticks());
    let (received, mut latencies) = service.finish().await;
    let (logged, _) = logging.finish().await;
    if let Some(forwarder) = forwarder.as_mut() {
        forwarder.signal("TERM");
        forwarder.wait_exit(Duration::from_secs(30)).await;
        forwarder.remove_files();
    }
    publisher.close().await;
    consumers.close().await;
    broker.close().await;

    latencies.sort_unstable();
    let ms = |q: f64| {
        if latencies.is_empty() {
            return f64::NAN;
        }
        let i = ((q * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i] as f64 / 1e6
    };
    Latency {
        carrier,
        rate,
        published_rate,
        secs,
        sent,
        received,
        logged,
        p50: ms(0.50),
        p99: ms(0.99),
        max: ms(1.0),
        forwarder_cores,
        broker_cores,
    }
}
