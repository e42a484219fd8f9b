//! The journal against the real broker, read as an operator reads it
//! (`switchyard trace`): every settled message leaves one record with each
//! branch's attempts in order, from the queue, over HTTP and in a session;
//! copies carry the producer's trace with the forwarder's publish span as
//! parent.

use crate::support;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::Value;
use support::config::{Branch, Endpoint, Filter, Forwarder};
use support::harness::InProcess;
use support::ingress::{start_ingress, stop_clean};
use support::journal::{attempts, records, result, switchyard, trace};
use support::sessions::{in_session, publish_to};
use support::{DEFAULT_TIMEOUT, TestBroker, delete_all_with_prefix, unique_prefix};
use switchyard::Options;

/// A producer's trace: its id and its span.
const PRODUCER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PRODUCER_SPAN: &str = "b7ad6b7169203331";

fn with_id(id: &str, headers: &[(&str, &str)]) -> BasicProperties {
    let mut table = FieldTable::default();
    for (name, value) in headers {
        table.insert((*name).into(), AMQPValue::LongString((*value).into()));
    }
    BasicProperties::default()
        .with_message_id(id.into())
        .with_headers(table)
}

/// The trace id and parent span of a copy's `traceparent`.
fn trace_of(copy: &support::Message) -> (String, String) {
    let text = copy.header_str("traceparent").unwrap_or_default();
    let parts: Vec<&str> = text.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {text:?}");
    assert_eq!((parts[0], parts[3]), ("00", "01"), "traceparent {text:?}");
    (parts[1].to_owned(), parts[2].to_owned())
}

/// The seed's two branches, each failing over: the service primary nacks
/// (a full queue that rejects publishes), the logging primary returns (no
/// such queue); and an "audit" branch for messages of kind "doomed" whose
/// only endpoint returns, so they are dead-lettered.
#[tokio::test]
async fn failovers_and_a_dead_letter_are_found_by_trace_with_every_attempt() {
    let p = unique_prefix("journal-seed");
    let broker = TestBroker::connect(&p).await;
    let mut full = FieldTable::default();
    full.insert("x-max-length".into(), AMQPValue::LongLongInt(0));
    full.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    broker
        .declare_queue_with(&format!("{p}.service"), full)
        .await;
    for backup in ["service.backup", "logging.backup"] {
        broker.declare_queue(&format!("{p}.{backup}")).await;
    }
    // Every queue is the test's: `<p>.logging` and `<p>.audit` do not exist.
    let config = Forwarder::new(&p)
        .seed_with(&p, Endpoint::undeclared)
        .endpoint(Endpoint::queue("audit", &format!("{p}.audit")).undeclared())
        .filter("doomed", Filter::header("kind").set("equals", "doomed"))
        .branch(Branch::new("audit", "doomed", "audit"));
    let toml = config.toml();
    let inbound = format!("{p}.in");
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    let producer = format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01");
    broker
        .publish(
            "",
            &inbound,
            b"order",
            with_id("order-4711", &[("traceparent", &producer)]),
        )
        .await;
    broker
        .publish(
            "",
            &inbound,
            b"doomed",
            with_id("doomed-1", &[("kind", "doomed")]),
        )
        .await;
    broker
        .await_count(&format!("{p}.service.backup"), 2, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.dlq"), 1, DEFAULT_TIMEOUT)
        .await;

    let found = records(&toml, "order-4711", 1).await;
    assert_eq!(found.len(), 1, "one record per settled message: {found:?}");
    let order = &found[0];
    assert_eq!(order["verdict"], "acked");
    assert_eq!(order["source"], "queue");
    assert_eq!(order["instance"], p.as_str());
    assert_eq!(
        order["trace_id"], PRODUCER_TRACE,
        "the producer's trace goes on"
    );
    assert_eq!(
        attempts(order, "service"),
        ["service:nacked", "service_backup:confirmed"]
    );
    assert_eq!(
        attempts(order, "logging"),
        ["logging:returned:312", "logging_backup:confirmed"]
    );
    assert_eq!(result(order, "service"), "delivered");
    for key in ["received_at", "settled_at"] {
        let at = order[key].as_str().unwrap_or_default();
        assert!(at.ends_with('Z') && at.contains('T'), "{key}: {at}");
    }
    let text = order.to_string();
    assert!(!text.contains("order\""), "no body in a record: {text}");

    // A copy id finds the same record.
    let by_copy = records(&toml, "logging:order-4711", 1).await;
    assert_eq!(by_copy, found);

    // Each copy continues the producer's trace under a publish span of its own.
    let copies = broker.get_all(&format!("{p}.service.backup")).await;
    let copy = copies
        .iter()
        .find(|m| m.properties.message_id().as_ref().map(|s| s.as_str()) == Some("order-4711"))
        .unwrap_or_else(|| panic!("the order's service copy"));
    let (trace_id, parent) = trace_of(copy);
    assert_eq!(trace_id, PRODUCER_TRACE);
    assert_ne!(
        parent, PRODUCER_SPAN,
        "the copy's parent is the forwarder's publish"
    );

    let doomed = records(&toml, "doomed-1", 1).await;
    let doomed = &doomed[0];
    assert_eq!(doomed["verdict"], "dead-lettered");
    assert_eq!(doomed["reason"], "exhausted");
    assert_eq!(attempts(doomed, "audit"), ["audit:returned:312"]);
    assert_eq!(result(doomed, "audit"), "failed");
    assert_eq!(result(doomed, "service"), "delivered");
    let new_trace = doomed["trace_id"].as_str().unwrap_or_default();
    assert!(
        new_trace.len() == 32 && new_trace != PRODUCER_TRACE,
        "a message without a traceparent starts a trace: {new_trace}"
    );

    // The timeline a person reads names the endpoints and outcomes.
    let human = trace(&toml, "order-4711", &[]).await;
    assert_eq!(human.code, Some(0), "{human:?}");
    for word in ["service_backup", "nacked", "returned", "312", "acked"] {
        assert!(human.stdout.contains(word), "{word} in {}", human.stdout);
    }
    // A malformed traceparent starts a new trace, counted.
    broker
        .publish(
            "",
            &inbound,
            b"odd",
            with_id("odd-1", &[("traceparent", "00-not-a-trace")]),
        )
        .await;
    let odd = records(&toml, "odd-1", 1).await;
    let odd_trace = odd[0]["trace_id"].as_str().unwrap_or_default();
    assert_eq!(odd_trace.len(), 32, "{odd:?}");
    let metrics = support::Metrics::parse(&forwarder.telemetry().render());
    assert_eq!(
        metrics.value("switchyard_trace_context_malformed_total", &[]),
        1.0
    );

    let missing = trace(&toml, "order-0000", &["--json"]).await;
    assert_eq!(missing.code, Some(3), "{missing:?}");
    assert!(
        missing.stderr.contains("24h"),
        "the window is named: {}",
        missing.stderr
    );

    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

/// An HTTP request answered 502 (one branch's queue missing) and its retry
/// answered 202 leave two records: the first with the failed attempt, the
/// second with the retried branch's attempt and the other as "earlier".
#[tokio::test]
async fn an_http_502_and_its_retry_leave_two_records() {
    let p = unique_prefix("journal-http");
    let broker = TestBroker::connect(&p).await;
    let config = Forwarder::new(&p)
        .endpoint(Endpoint::queue("service", &format!("{p}.service")).undeclared())
        .endpoint(Endpoint::queue("logging", &format!("{p}.logging")))
        .filter("all", Filter::match_all())
        .branch(Branch::new("service", "all", "service"))
        .branch(Branch::new("logging", "all", "logging"))
        .http(&[]);
    let toml = config.toml();
    let inbound = format!("{p}.in");
    let (running, client) =
        start_ingress(&config, Options::default(), Some((&broker, &inbound))).await;
    let producer = format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01");
    let headers = [
        ("idempotency-key", "http-1"),
        ("traceparent", producer.as_str()),
    ];
    let failed = client.post("/messages/k", &headers, b"work").await;
    assert_eq!(failed.status, 502, "{}", failed.text);
    broker.declare_queue(&format!("{p}.service")).await;
    let retried = client.post("/messages/k", &headers, b"work").await;
    assert_eq!(retried.status, 202, "{}", retried.text);

    let found = records(&toml, "http-1", 2).await;
    let by_status = |status: u64| -> &Value {
        found
            .iter()
            .find(|r| r["http_status"] == status)
            .unwrap_or_else(|| panic!("a record answered {status}: {found:?}"))
    };
    let first = by_status(502);
    assert_eq!(first["source"], "http");
    assert_eq!(first["verdict"], "answered");
    assert_eq!(first["trace_id"], PRODUCER_TRACE);
    assert_eq!(attempts(first, "service"), ["service:returned:312"]);
    assert_eq!(result(first, "service"), "failed");
    assert_eq!(attempts(first, "logging"), ["logging:confirmed"]);
    let second = by_status(202);
    assert_eq!(attempts(second, "service"), ["service:confirmed"]);
    assert_eq!(result(second, "logging"), "earlier");
    assert!(attempts(second, "logging").is_empty(), "nothing sent again");

    let copy = broker.get_all(&format!("{p}.service")).await;
    assert_eq!(
        trace_of(&copy[0]).0,
        PRODUCER_TRACE,
        "the request's trace goes on"
    );
    stop_clean(running, &broker, &p).await;
}

/// A session whose service primary disappears mid-session replays the
/// earlier messages on the backup; each message's record shows its own
/// attempts, the replay marked, with the session id.
#[tokio::test]
async fn a_session_replay_is_recorded_on_each_message() {
    let p = unique_prefix("journal-session");
    let broker = TestBroker::connect(&p).await;
    let toml = Forwarder::new(&p)
        .seed(&p)
        .sessions(&[("max_open", 4.into())])
        .toml();
    let inbound = format!("{p}.in");
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    let message = |seq, end| in_session("s1", seq, end);
    publish_to(
        &broker,
        "",
        &inbound,
        &[message(0, false), message(1, false)],
    )
    .await;
    broker
        .await_count(&format!("{p}.service"), 2, DEFAULT_TIMEOUT)
        .await;
    broker.delete_queue(&format!("{p}.service")).await;
    publish_to(
        &broker,
        "",
        &inbound,
        &[message(2, false), message(3, true)],
    )
    .await;
    broker
        .await_count(&format!("{p}.service.backup"), 4, DEFAULT_TIMEOUT)
        .await;

    let first = records(&toml, "s1/0", 1).await;
    let first = &first[0];
    assert_eq!(first["session"], "s1");
    assert_eq!(first["verdict"], "acked");
    assert_eq!(
        attempts(first, "service"),
        ["service:confirmed", "service_backup:confirmed:replay"]
    );
    let third = records(&toml, "s1/2", 1).await;
    assert_eq!(
        attempts(&third[0], "service"),
        ["service:returned:312", "service_backup:confirmed"]
    );
    assert_eq!(attempts(&third[0], "logging"), ["logging:confirmed"]);

    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

/// A dead letter republished by the forwarder carries its trace, and
/// `dlq inspect` shows the trace id, which `trace` then finds; `dlq
/// redrive` and the forward after it leave records in the same trace.
#[tokio::test]
async fn dlq_inspect_shows_each_dead_letters_trace_id() {
    let p = unique_prefix("journal-dlq");
    let broker = TestBroker::connect(&p).await;
    let toml = Forwarder::new(&p)
        .mode("republish")
        .endpoint(Endpoint::queue("service", &format!("{p}.missing")).undeclared())
        .filter("all", Filter::match_all())
        .branch(Branch::new("service", "all", "service"))
        .toml();
    let inbound = format!("{p}.in");
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    broker
        .publish("", &inbound, b"lost", with_id("lost-1", &[]))
        .await;
    broker
        .await_count(&format!("{p}.dlq"), 1, DEFAULT_TIMEOUT)
        .await;
    let found = records(&toml, "lost-1", 1).await;
    let trace_id = found[0]["trace_id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(found[0]["verdict"], "dead-lettered");

    let inspected = switchyard(&toml, &["dlq", "inspect", "--json"]).await;
    let stdout = String::from_utf8_lossy(&inspected.stdout);
    let letter: Value = serde_json::from_str(stdout.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(letter["trace_id"], trace_id.as_str());
    let table = switchyard(&toml, &["dlq", "inspect"]).await;
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains(&format!("trace: {trace_id}")), "{table}");

    // Fixed and redriven: the redrive and the forward that follows it are
    // recorded too, in the same trace.
    broker.declare_queue(&format!("{p}.missing")).await;
    let redriven = switchyard(&toml, &["dlq", "redrive"]).await;
    assert!(redriven.status.success(), "{redriven:?}");
    broker
        .await_count(&format!("{p}.missing"), 1, DEFAULT_TIMEOUT)
        .await;
    let all = records(&toml, "lost-1", 3).await;
    let story: Vec<(&str, &str)> = all
        .iter()
        .map(|r| {
            (
                r["source"].as_str().unwrap_or_default(),
                r["verdict"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        story,
        [
            ("queue", "dead-lettered"),
            ("redrive", "redriven"),
            ("redrive", "acked")
        ]
    );
    assert!(
        all.iter().all(|r| r["trace_id"] == trace_id.as_str()),
        "{all:?}"
    );

    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

/// The forwarder's hop in a distributed trace, end to end: a message with
/// a producer's `traceparent` fails over on one branch; a real OTLP/HTTP
/// receiver gets the forward span (child of the producer's span) and one
/// span per publish attempt (children of the forward), with the RabbitMQ
/// messaging attributes; each copy's `traceparent` names the span of the
/// publish that made it.
#[tokio::test]
async fn the_hop_is_exported_as_spans_the_copies_point_at() {
    use support::otlp::OtlpReceiver;
    let p = unique_prefix("journal-otlp");
    let broker = TestBroker::connect(&p).await;
    let receiver = OtlpReceiver::start().await;
    let toml = Forwarder::new(&p)
        .endpoint(Endpoint::queue("primary", &format!("{p}.missing")).undeclared())
        .endpoint(Endpoint::queue("backup", &format!("{p}.backup")))
        .backup_list("backups", &["backup"])
        .filter("all", Filter::match_all())
        .branch(Branch::new("service", "all", "primary").backups("backups"))
        .otlp(&receiver.endpoint())
        .toml();
    let inbound = format!("{p}.in");
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    let producer = format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01");
    broker
        .publish(
            "",
            &inbound,
            b"o",
            with_id("traced-1", &[("traceparent", &producer)]),
        )
        .await;
    broker
        .await_count(&format!("{p}.backup"), 1, DEFAULT_TIMEOUT)
        .await;
    let spans = receiver.wait_for_spans(3, DEFAULT_TIMEOUT).await;
    let producer_trace = u128::from_str_radix(PRODUCER_TRACE, 16).unwrap_or_default();
    let producer_span = u64::from_str_radix(PRODUCER_SPAN, 16).unwrap_or_default();
    assert!(
        spans.iter().all(|s| s.trace_id() == producer_trace),
        "{spans:#?}"
    );
    let forward = spans
        .iter()
        .find(|s| s.parent() == Some(producer_span))
        .unwrap_or_else(|| panic!("a forward span under the producer's: {spans:#?}"));
    let publishes: Vec<_> = spans
        .iter()
        .filter(|s| s.parent() == Some(forward.span_id()))
        .collect();
    let outcomes: Vec<(Option<String>, Option<String>)> = publishes
        .iter()
        .map(|s| (s.attr("switchyard.endpoint"), s.attr("switchyard.outcome")))
        .collect();
    assert_eq!(
        outcomes,
        [
            (Some("primary".into()), Some("returned".into())),
            (Some("backup".into()), Some("confirmed".into()))
        ]
    );
    for s in &publishes {
        assert_eq!(s.attr("messaging.system").as_deref(), Some("rabbitmq"));
        assert_eq!(s.attr("switchyard.branch").as_deref(), Some("service"));
        assert_eq!(s.attr("messaging.message.id").as_deref(), Some("traced-1"));
    }
    assert_eq!(
        publishes[1]
            .attr("messaging.rabbitmq.destination.routing_key")
            .as_deref(),
        Some(format!("{p}.backup").as_str())
    );
    let copy = broker.get_all(&format!("{p}.backup")).await;
    let (trace_id, parent) = trace_of(&copy[0]);
    assert_eq!(trace_id, PRODUCER_TRACE);
    assert_eq!(parent, format!("{:016x}", publishes[1].span_id()));

    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}

/// A queue that is not a stream under the journal's name: the forwarder
/// forwards as ever, says the journal cannot write (and why, in its log),
/// and leaves the queue as it was.
#[tokio::test]
async fn a_journal_name_taken_by_a_classic_queue_never_stops_forwarding() {
    let p = unique_prefix("journal-classic");
    let broker = TestBroker::connect(&p).await;
    let journal = format!("{p}.journal");
    broker.declare_queue(&journal).await;
    broker
        .publish("", &journal, b"someone else's", BasicProperties::default())
        .await;
    let toml = Forwarder::new(&p).seed(&p).toml();
    let inbound = format!("{p}.in");
    let forwarder = InProcess::start_consuming(&toml, &broker, &inbound).await;
    for i in 0..20 {
        broker
            .publish("", &inbound, b"w", with_id(&format!("w-{i}"), &[]))
            .await;
    }
    broker
        .await_count(&format!("{p}.service"), 20, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.logging"), 20, DEFAULT_TIMEOUT)
        .await;
    support::wait_until(
        "the journal is known unwritable",
        DEFAULT_TIMEOUT,
        || async {
            support::Metrics::parse(&forwarder.telemetry().render())
                .value("switchyard_journal_writable", &[])
                == 0.0
        },
    )
    .await;
    assert_eq!(
        broker.queue_len(&journal).await,
        1,
        "the queue is left as it was"
    );
    let traced = trace(&toml, "w-0", &[]).await;
    assert_ne!(traced.code, Some(0), "{traced:?}");
    assert!(traced.stderr.contains("stream"), "{}", traced.stderr);
    forwarder.stop().await.unwrap_or_else(|e| panic!("{e}"));
    delete_all_with_prefix(&p).await;
}
