//! The entry → span mapping and the sampling decision; export over the
//! wire is tested against a real OTLP/HTTP receiver in
//! `tests/otlp_export.rs`.

use super::span::{self, DEFAULT_EXCHANGE, FORWARD};
use super::{Spans, sampled};
use crate::destination::{Endpoint, QueueType};
use crate::journal::{Attempted, BranchEntry, Entry, Said, Source, Tried};
use crate::telemetry::Telemetry;
use crate::wire::Trace;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn endpoint(name: &str, exchange: &str) -> Arc<Endpoint> {
    Arc::new(Endpoint {
        name: name.to_owned(),
        broker: "main".to_owned(),
        exchange: exchange.to_owned(),
        routing_key: format!("rk.{name}"),
        declare_queue: None,
        declare_queue_type: QueueType::Classic,
        confirm_timeout: Duration::from_secs(1),
        retries: 0,
        headers: Vec::new(),
        probe_interval: Duration::from_secs(1),
    })
}

fn tried(name: &str, exchange: &str, outcome: Attempted, span: u64, ms: u64) -> Tried {
    Tried {
        index: 0,
        endpoint: endpoint(name, exchange),
        outcome,
        replay: false,
        span,
        started: at(ms),
        ended: at(ms + 5),
    }
}

/// A message continuing the producer's trace, failed over on one branch
/// (returned, then confirmed), held on the other, dead-lettered.
fn failed_over() -> Entry {
    let mut trace = Trace::from_texts(Some(PARENT), Some("congo=t61rcWkgMzE"), true);
    trace.span = 0x1111;
    Entry {
        message_id: Some("order-4711".to_owned()),
        content: None,
        source: Source::Queue,
        session: Some(Arc::from("s-1")),
        redelivered: false,
        trace,
        received_at: at(1_000),
        settled_at: at(1_250),
        said: Said::DeadLettered {
            reason: "exhausted",
            error: "logging: held too long".to_owned(),
        },
        branches: vec![
            BranchEntry {
                branch: Arc::from("service"),
                result: "delivered",
                attempts: vec![
                    tried("primary", "", Attempted::Returned(312), 0x2222, 1_100),
                    tried("backup", "orders", Attempted::Confirmed, 0x3333, 1_200),
                ],
            },
            BranchEntry {
                branch: Arc::from("logging"),
                result: "outage",
                attempts: vec![tried(
                    "log",
                    "logs",
                    Attempted::Held(Duration::from_millis(50)),
                    0,
                    1_240,
                )],
            },
        ],
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn text<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key)? {
        Value::StringValue(s) => Some(s),
        _ => None,
    }
}

#[test]
fn the_forward_continues_the_producers_span() {
    let entry = failed_over();
    let spans = span::spans_of(&entry);
    assert_eq!(span::count(&entry), spans.len());
    // The held step published nothing: no span.
    assert_eq!(spans.len(), 3);
    let forward = &spans[0];
    assert_eq!(forward.name, FORWARD);
    assert_eq!(forward.kind, SpanKind::Consumer as i32);
    assert_eq!(
        forward.trace_id,
        0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736u128.to_be_bytes()
    );
    assert_eq!(forward.span_id, 0x1111u64.to_be_bytes());
    assert_eq!(
        forward.parent_span_id,
        0x00f0_67aa_0ba9_02b7u64.to_be_bytes()
    );
    assert_eq!(forward.trace_state, "congo=t61rcWkgMzE");
    assert_eq!(forward.flags, 0x301, "sampled, with a remote parent");
    assert_eq!(forward.start_time_unix_nano, 1_000_000_000);
    assert_eq!(forward.end_time_unix_nano, 1_250_000_000);
    assert_eq!(text(forward, "messaging.system"), Some("rabbitmq"));
    assert_eq!(text(forward, "messaging.message.id"), Some("order-4711"));
    assert_eq!(text(forward, "messaging.operation.type"), Some("process"));
    assert_eq!(text(forward, "switchyard.verdict"), Some("dead-lettered"));
    assert_eq!(text(forward, "switchyard.reason"), Some("exhausted"));
    assert_eq!(text(forward, "switchyard.source"), Some("queue"));
    assert_eq!(text(forward, "switchyard.session"), Some("s-1"));
    let status = forward.status.as_ref().expect("a dead letter is an error");
    assert_eq!(status.code, StatusCode::Error as i32);
    assert!(status.message.contains("held too long"), "{status:?}");
}

#[test]
fn each_publish_is_a_child_of_the_forward() {
    let spans = span::spans_of(&failed_over());
    let (returned, confirmed) = (&spans[1], &spans[2]);
    for (s, id) in [(returned, 0x2222u64), (confirmed, 0x3333)] {
        assert_eq!(s.trace_id, spans[0].trace_id);
        assert_eq!(s.span_id, id.to_be_bytes());
        assert_eq!(s.parent_span_id, 0x1111u64.to_be_bytes());
        assert_eq!(s.kind, SpanKind::Producer as i32);
        assert_eq!(s.flags, 0x101, "sampled, with a local parent");
        assert_eq!(text(s, "messaging.system"), Some("rabbitmq"));
        assert_eq!(text(s, "messaging.operation.type"), Some("send"));
        assert_eq!(text(s, "messaging.operation.name"), Some("publish"));
        assert_eq!(text(s, "messaging.message.id"), Some("order-4711"));
        assert_eq!(text(s, "switchyard.branch"), Some("service"));
        assert_eq!(attr(s, "switchyard.replay"), None);
    }
    assert_eq!(returned.name, format!("publish {DEFAULT_EXCHANGE}"));
    assert_eq!(
        text(returned, "messaging.destination.name"),
        Some(DEFAULT_EXCHANGE)
    );
    assert_eq!(
        text(returned, "messaging.rabbitmq.destination.routing_key"),
        Some("rk.primary")
    );
    assert_eq!(text(returned, "switchyard.endpoint"), Some("primary"));
    assert_eq!(text(returned, "switchyard.outcome"), Some("returned"));
    assert_eq!(
        attr(returned, "switchyard.reply_code"),
        Some(&Value::IntValue(312))
    );
    let status = returned.status.as_ref().expect("a return is an error");
    assert_eq!(status.code, StatusCode::Error as i32);
    assert_eq!(returned.start_time_unix_nano, 1_100_000_000);
    assert_eq!(returned.end_time_unix_nano, 1_105_000_000);

    assert_eq!(confirmed.name, "publish orders");
    assert_eq!(
        text(confirmed, "messaging.destination.name"),
        Some("orders")
    );
    assert_eq!(text(confirmed, "switchyard.outcome"), Some("confirmed"));
    assert_eq!(confirmed.status, None);
}

#[test]
fn a_new_trace_has_a_root_forward_and_replays_say_so() {
    let mut entry = failed_over();
    entry.trace = Trace::default();
    entry.message_id = None;
    entry.session = None;
    entry.said = Said::Acked;
    entry.branches.truncate(1);
    entry.branches[0].attempts[1].replay = true;
    entry.branches[0].attempts[0].outcome = Attempted::Nacked;
    let spans = span::spans_of(&entry);
    let forward = &spans[0];
    assert!(forward.parent_span_id.is_empty());
    assert_eq!(forward.trace_state, "");
    assert_eq!(forward.flags, 0x101, "sampled, a root");
    assert_eq!(forward.status, None);
    assert_eq!(text(forward, "switchyard.verdict"), Some("acked"));
    assert_eq!(attr(forward, "messaging.message.id"), None);
    assert_eq!(attr(forward, "switchyard.session"), None);
    assert_eq!(text(&spans[1], "switchyard.outcome"), Some("nacked"));
    assert_eq!(
        spans[1].status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );
    assert_eq!(
        attr(&spans[2], "switchyard.replay"),
        Some(&Value::BoolValue(true))
    );
}

#[test]
fn an_http_answer_is_an_error_only_from_500_on() {
    let mut entry = failed_over();
    for (status, error) in [(200, false), (409, false), (503, true)] {
        entry.said = Said::Answered {
            status,
            reason: "why".to_owned(),
        };
        let forward = &span::spans_of(&entry)[0];
        assert_eq!(
            attr(forward, "http.response.status_code"),
            Some(&Value::IntValue(i64::from(status)))
        );
        assert_eq!(forward.status.is_some(), error, "{status}");
    }
}

#[test]
fn the_producers_flag_wins_and_new_traces_follow_the_ratio() {
    let producer = |flag: &str| {
        Trace::from_texts(
            Some(&format!(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flag}"
            )),
            None,
            true,
        )
    };
    assert!(sampled(&producer("01"), 0.0));
    assert!(!sampled(&producer("00"), 1.0));
    let new = Trace::default();
    assert!(sampled(&new, 1.0));
    assert!(!sampled(&new, 0.0));
}

#[test]
fn the_resource_names_the_service_and_instance() {
    let resource = span::resource("switchyard", "sy-a");
    let keys: Vec<_> = resource
        .attributes
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.clone()))
        .collect();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].0, "service.name");
    assert_eq!(keys[1].0, "service.instance.id");
}

#[tokio::test]
async fn export_off_does_nothing_and_a_never_started_exporter_counts_its_queue() {
    let telemetry = Telemetry::new();
    let off = Spans::new(None, "sy-a", &telemetry);
    assert!(!off.on());
    off.export(&failed_over());
    off.close(Duration::from_millis(10)).await;

    let otlp = crate::config::Otlp {
        endpoint: "http://127.0.0.1:9".to_owned(),
        service_name: "switchyard".to_owned(),
        sample_ratio: 1.0,
    };
    let spans = Spans::new(Some(&otlp), "sy-a", &telemetry);
    assert!(spans.on() && spans.samples(&Trace::default()));
    spans.export(&failed_over());
    spans.close(Duration::from_millis(10)).await;
    let text = telemetry.render();
    assert_eq!(
        crate::telemetry::sample(&text, "switchyard_spans_dropped_total"),
        Some(3.0),
        "{text}"
    );
}
