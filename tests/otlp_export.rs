//! Span export over OTLP/HTTP against a real receiver (`support::otlp`):
//! the spans of settled entries (a producer's trace, a new trace, a
//! failover, a session's replay) arrive as protobuf at `/v1/traces`,
//! linked (trace ids, span ids, parents), with their kinds, attributes,
//! status and resource; sampling follows the producer's flag and the
//! ratio; a collector that refuses connections, stalls or answers 500
//! never makes `export` wait, and what it did not take is counted as
//! dropped, not retried; `close` keeps its bound. No broker needed.

use crate::support::Metrics;
use crate::support::otlp::{Answer, OtlpReceiver, Received, refusing_endpoint};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use switchyard::Telemetry;
use switchyard::config::Otlp;
use switchyard::destination::{Endpoint, QueueType};
use switchyard::journal::{Attempted, BranchEntry, Entry, Said, Source, Tried};
use switchyard::traces::{Spans, Trace};
use tokio_util::task::TaskTracker;

const PRODUCER_TRACE: u128 = 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736;
const PRODUCER_SPAN: u64 = 0x00f0_67aa_0ba9_02b7;
const WAIT: Duration = Duration::from_secs(20);
/// `close`'s bound in these tests.
const CLOSE: Duration = Duration::from_secs(2);

fn producer(flag: &str) -> Trace {
    let traceparent = format!("00-{PRODUCER_TRACE:032x}-{PRODUCER_SPAN:016x}-{flag}");
    Trace::from_texts(Some(&traceparent), Some("vendor=abc"), true)
}

/// A new trace whose id the ratio sampler takes at any ratio above 0 (its
/// low 56 bits are 0) or never (all ones), whichever `sampled` says.
fn new_trace(sampled_at_any_ratio: bool) -> Trace {
    let mut trace = Trace::default();
    let low = if sampled_at_any_ratio {
        0
    } else {
        (1u128 << 56) - 1
    };
    trace.trace_id = (trace.trace_id & !((1u128 << 56) - 1)) | low | (1 << 100);
    trace
}

fn endpoint(name: &str, exchange: &str) -> Arc<Endpoint> {
    Arc::new(Endpoint {
        name: name.to_owned(),
        broker: "main".to_owned(),
        exchange: exchange.to_owned(),
        routing_key: format!("to.{name}"),
        declare_queue: None,
        declare_queue_type: QueueType::Classic,
        confirm_timeout: Duration::from_secs(5),
        retries: 0,
        headers: Vec::new(),
        probe_interval: Duration::from_secs(1),
    })
}

fn attempt(endpoint: Arc<Endpoint>, outcome: Attempted, span: u64) -> Tried {
    let now = SystemTime::now();
    Tried {
        index: 0,
        endpoint,
        outcome,
        replay: false,
        span,
        started: now,
        ended: now + Duration::from_millis(3),
    }
}

fn entry(id: &str, trace: Trace, attempts: Vec<Tried>) -> Entry {
    let now = SystemTime::now();
    Entry {
        message_id: Some(id.to_owned()),
        content: None,
        source: Source::Queue,
        session: None,
        redelivered: false,
        trace,
        received_at: now,
        settled_at: now + Duration::from_millis(10),
        said: Said::Acked,
        branches: vec![BranchEntry {
            branch: Arc::from("orders"),
            result: "delivered",
            attempts,
        }],
    }
}

/// One confirmed publish to `primary`.
fn simple(id: &str, trace: Trace) -> Entry {
    entry(
        id,
        trace,
        vec![attempt(
            endpoint("primary", "orders.x"),
            Attempted::Confirmed,
            fastrand::u64(1..),
        )],
    )
}

fn otlp(endpoint: String, sample_ratio: f64) -> Otlp {
    Otlp {
        endpoint,
        service_name: "switchyard-test".to_owned(),
        sample_ratio,
    }
}

fn started(otlp: &Otlp, telemetry: &Telemetry) -> (Spans, TaskTracker) {
    let spans = Spans::new(Some(otlp), "sy-otlp-test", telemetry);
    let tracker = TaskTracker::new();
    spans.start(&tracker);
    (spans, tracker)
}

fn counter(telemetry: &Telemetry, name: &str) -> f64 {
    Metrics::parse(&telemetry.render()).value(name, &[])
}

fn by_id(spans: &[Received], id: u64) -> &Received {
    spans
        .iter()
        .find(|s| s.span_id() == id)
        .unwrap_or_else(|| panic!("no span {id:016x} among {spans:#?}"))
}

const CONSUMER: i32 = 5;
const PRODUCER: i32 = 4;
const STATUS_ERROR: i32 = 2;

#[tokio::test]
async fn spans_of_a_producers_message_a_new_trace_a_failover_and_a_replay_arrive_linked() {
    let receiver = OtlpReceiver::start().await;
    let telemetry = Telemetry::new();
    let (spans, _tracker) = started(&otlp(receiver.endpoint(), 1.0), &telemetry);

    let continued = simple("m-producer", producer("01"));
    let fresh = simple("m-new", new_trace(true));
    let mut failover = entry(
        "m-failover",
        new_trace(true),
        vec![
            attempt(endpoint("primary", ""), Attempted::Nacked, 0xa1),
            attempt(endpoint("backup", "orders.x"), Attempted::Confirmed, 0xa2),
        ],
    );
    failover.session = Some(Arc::from("session-7"));
    let mut replay = entry(
        "m-replay",
        new_trace(true),
        vec![
            attempt(endpoint("primary", "orders.x"), Attempted::Lost, 0xb1),
            attempt(endpoint("backup", "orders.x"), Attempted::Confirmed, 0xb2),
        ],
    );
    replay.branches[0].attempts[1].replay = true;
    replay.said = Said::DeadLettered {
        reason: "exhausted",
        error: "orders: every endpoint failed".to_owned(),
    };
    for e in [&continued, &fresh, &failover, &replay] {
        spans.export(e);
    }
    let got = receiver.wait_for_spans(2 + 2 + 3 + 3, WAIT).await;
    spans.close(CLOSE).await;
    assert_eq!(receiver.spans().len(), 10, "{got:#?}");
    for posted in receiver.posted() {
        assert_eq!(posted.request_line, "POST /v1/traces");
        assert_eq!(
            posted.content_type.as_deref(),
            Some("application/x-protobuf")
        );
        assert!(posted.decoded);
    }
    for s in &got {
        assert_eq!(
            s.resource_attr("service.name").as_deref(),
            Some("switchyard-test")
        );
        assert_eq!(
            s.resource_attr("service.instance.id").as_deref(),
            Some("sy-otlp-test")
        );
        assert_eq!(s.attr("messaging.system").as_deref(), Some("rabbitmq"));
        assert!(s.span.start_time_unix_nano > 0);
        assert!(s.span.end_time_unix_nano >= s.span.start_time_unix_nano);
    }

    // The producer's trace: the forward is the producer span's child.
    let forward = by_id(&got, continued.trace.span);
    assert_eq!(forward.trace_id(), PRODUCER_TRACE);
    assert_eq!(forward.parent(), Some(PRODUCER_SPAN));
    assert_eq!(forward.span.kind, CONSUMER);
    assert_eq!(forward.span.trace_state, "vendor=abc");
    assert_eq!(
        forward.attr("messaging.message.id").as_deref(),
        Some("m-producer")
    );
    assert_eq!(
        forward.attr("messaging.operation.type").as_deref(),
        Some("process")
    );
    assert_eq!(forward.attr("switchyard.verdict").as_deref(), Some("acked"));
    assert_eq!(forward.attr("switchyard.source").as_deref(), Some("queue"));
    assert_eq!(forward.span.status, None);
    let publish = by_id(&got, continued.branches[0].attempts[0].span);
    assert_eq!(publish.trace_id(), PRODUCER_TRACE);
    assert_eq!(publish.parent(), Some(continued.trace.span));
    assert_eq!(publish.span.kind, PRODUCER);
    assert_eq!(publish.span.name, "publish orders.x");
    assert_eq!(
        publish.attr("messaging.destination.name").as_deref(),
        Some("orders.x")
    );
    assert_eq!(
        publish
            .attr("messaging.rabbitmq.destination.routing_key")
            .as_deref(),
        Some("to.primary")
    );
    assert_eq!(
        publish.attr("messaging.message.id").as_deref(),
        Some("m-producer")
    );
    assert_eq!(publish.attr("switchyard.branch").as_deref(), Some("orders"));
    assert_eq!(
        publish.attr("switchyard.endpoint").as_deref(),
        Some("primary")
    );
    assert_eq!(
        publish.attr("switchyard.outcome").as_deref(),
        Some("confirmed")
    );

    // A new trace: the forward is a root, in the trace the entry named.
    let forward = by_id(&got, fresh.trace.span);
    assert_eq!(forward.trace_id(), fresh.trace.trace_id);
    assert_eq!(forward.parent(), None);
    assert_eq!(forward.span.trace_state, "");

    // A failover: a nacked publish (an error) then a confirmed one, both
    // children of the forward; the session is named.
    let forward = by_id(&got, failover.trace.span);
    assert_eq!(
        forward.attr("switchyard.session").as_deref(),
        Some("session-7")
    );
    let nacked = by_id(&got, 0xa1);
    let confirmed = by_id(&got, 0xa2);
    for s in [nacked, confirmed] {
        assert_eq!(s.trace_id(), failover.trace.trace_id);
        assert_eq!(s.parent(), Some(failover.trace.span));
    }
    assert_eq!(nacked.span.name, "publish amq.default");
    assert_eq!(
        nacked.attr("messaging.destination.name").as_deref(),
        Some("amq.default")
    );
    assert_eq!(nacked.attr("switchyard.outcome").as_deref(), Some("nacked"));
    assert_eq!(
        nacked.span.status.as_ref().map(|s| s.code),
        Some(STATUS_ERROR)
    );
    assert_eq!(confirmed.span.status, None);
    assert_eq!(confirmed.attr("switchyard.replay"), None);

    // A replay after a lost channel, then dead-lettered: the replayed
    // publish says so and the forward is an error.
    let forward = by_id(&got, replay.trace.span);
    assert_eq!(
        forward.attr("switchyard.verdict").as_deref(),
        Some("dead-lettered")
    );
    assert_eq!(
        forward.span.status.as_ref().map(|s| s.code),
        Some(STATUS_ERROR)
    );
    assert_eq!(
        by_id(&got, 0xb1).attr("switchyard.outcome").as_deref(),
        Some("lost")
    );
    assert_eq!(
        by_id(&got, 0xb2).attr("switchyard.replay").as_deref(),
        Some("true")
    );

    assert_eq!(counter(&telemetry, "switchyard_spans_exported_total"), 10.0);
    assert_eq!(counter(&telemetry, "switchyard_spans_dropped_total"), 0.0);
}

#[tokio::test]
async fn ratio_zero_exports_no_new_trace_but_a_sampled_parent_is_followed() {
    let receiver = OtlpReceiver::start().await;
    let telemetry = Telemetry::new();
    let (spans, _tracker) = started(&otlp(receiver.endpoint(), 0.0), &telemetry);
    spans.export(&simple("new", new_trace(true)));
    spans.export(&simple("unsampled-parent", producer("00")));
    let followed = simple("sampled-parent", producer("01"));
    spans.export(&followed);
    // close() flushes: whatever was to arrive has arrived when it returns.
    spans.close(CLOSE).await;
    let got = receiver.spans();
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got.iter()
            .all(|s| s.attr("messaging.message.id").as_deref() == Some("sampled-parent"))
    );
    assert!(got.iter().any(|s| s.span_id() == followed.trace.span));

    // At a ratio of 1, an unsampled parent is still not exported.
    let receiver = OtlpReceiver::start().await;
    let (spans, _tracker) = started(&otlp(receiver.endpoint(), 1.0), &telemetry);
    spans.export(&simple("unsampled-parent", producer("00")));
    spans.export(&simple("new", new_trace(false)));
    spans.close(CLOSE).await;
    let got = receiver.spans();
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got.iter()
            .all(|s| s.attr("messaging.message.id").as_deref() == Some("new"))
    );
}

/// 50,000 `export` calls (100,000 spans) against a collector that cannot
/// take them: they return at once, and every span is counted as dropped
/// by the time `close` returns (and none as exported).
async fn export_never_waits(endpoint: String, stalled: Option<&OtlpReceiver>) {
    const CALLS: usize = 50_000;
    let telemetry = Telemetry::new();
    let (spans, _tracker) = started(&otlp(endpoint, 1.0), &telemetry);
    let entries: Vec<Entry> = (0..64)
        .map(|i| simple(&format!("m-{i}"), new_trace(true)))
        .collect();
    let began = Instant::now();
    for i in 0..CALLS {
        spans.export(&entries[i % entries.len()]);
    }
    let took = began.elapsed();
    let dropped_at_once = counter(&telemetry, "switchyard_spans_dropped_total");
    if let Some(receiver) = stalled {
        // The exporter took one batch (512 spans) and waits on it; the
        // queue (4096 entries) filled; everything after was dropped at once.
        let kept = switchyard::traces::QUEUE + switchyard::traces::MAX_BATCH / 2 + 1;
        assert!(
            dropped_at_once >= (2 * (CALLS - kept)) as f64,
            "only {dropped_at_once} spans dropped during the calls"
        );
        receiver.wait_for_posts(1, WAIT).await;
    }
    assert!(
        took < Duration::from_millis(500),
        "{CALLS} export calls took {took:?}"
    );

    let began = Instant::now();
    spans.close(CLOSE).await;
    let closing = began.elapsed();
    assert!(
        closing < CLOSE + Duration::from_millis(500),
        "close took {closing:?}"
    );
    crate::support::wait_until("every span counted as dropped", WAIT, || async {
        counter(&telemetry, "switchyard_spans_dropped_total") == (2 * CALLS) as f64
    })
    .await;
    assert_eq!(counter(&telemetry, "switchyard_spans_exported_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_refusing_connections_never_makes_export_wait() {
    export_never_waits(refusing_endpoint(), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_collector_never_makes_export_wait_and_close_keeps_its_bound() {
    let receiver = OtlpReceiver::start().await;
    receiver.answer(Answer::Stall);
    export_never_waits(receiver.endpoint(), Some(&receiver)).await;
    assert!(receiver.spans().is_empty());
}

#[tokio::test]
async fn a_batch_answered_500_is_dropped_not_retried_and_export_goes_on() {
    let receiver = OtlpReceiver::start().await;
    receiver.answer(Answer::Status(500));
    let telemetry = Telemetry::new();
    let (spans, _tracker) = started(&otlp(receiver.endpoint(), 1.0), &telemetry);
    spans.export(&simple("refused", new_trace(true)));
    crate::support::wait_until("the refused batch is counted", WAIT, || async {
        counter(&telemetry, "switchyard_spans_dropped_total") == 2.0
    })
    .await;
    receiver.answer(Answer::Ok);
    spans.export(&simple("taken", new_trace(true)));
    let got = receiver.wait_for_spans(2, WAIT).await;
    spans.close(CLOSE).await;
    assert_eq!(receiver.spans().len(), 2, "{got:#?}");
    assert!(
        got.iter()
            .all(|s| s.attr("messaging.message.id").as_deref() == Some("taken"))
    );
    assert_eq!(
        receiver.posted().len(),
        2,
        "the refused batch was sent again"
    );
    assert_eq!(counter(&telemetry, "switchyard_spans_exported_total"), 2.0);
    assert_eq!(counter(&telemetry, "switchyard_spans_dropped_total"), 2.0);
}
