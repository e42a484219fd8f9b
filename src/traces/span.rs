//! One settled message as OTLP spans: the forward (kind CONSUMER, from
//! arrival to settlement, child of the producer's span when the message
//! carried one) and one span per publish attempt (kind PRODUCER, child of
//! the forward). Steps that published nothing (an endpoint skipped as
//! down, a hold) have no span of their own: the journal records them.
//!
//! Attributes follow the OpenTelemetry messaging conventions for RabbitMQ
//! (`messaging.system`, `messaging.destination.name`,
//! `messaging.rabbitmq.destination.routing_key`, `messaging.message.id`,
//! `messaging.operation.type` and `.name`), with the forwarder's own under
//! `switchyard.*`. Pure: no I/O, no clock.

use crate::journal::{Attempted, Entry, Said, Tried};
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, InstrumentationScope, KeyValue, any_value::Value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use std::time::{SystemTime, UNIX_EPOCH};

/// The forward span's name.
pub const FORWARD: &str = "switchyard forward";
/// `messaging.destination.name` of a copy published to the default exchange.
pub const DEFAULT_EXCHANGE: &str = "amq.default";

/// The sampled bit of the W3C trace flags.
const FLAG_SAMPLED: u32 = 0x01;
/// `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`: the next bit says whether the
/// parent is remote.
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
/// `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`: the parent is in another process.
const FLAG_IS_REMOTE: u32 = 0x200;

/// The spans of `entry`: the forward first, then its attempts in order.
pub fn spans_of(entry: &Entry) -> Vec<Span> {
    let attempts = entry
        .branches
        .iter()
        .map(|b| b.attempts.len())
        .sum::<usize>();
    let mut spans = Vec::with_capacity(1 + attempts);
    spans.push(forward(entry));
    for branch in &entry.branches {
        for tried in branch.attempts.iter().filter(|t| t.span != 0) {
            spans.push(publish(entry, &branch.branch, tried));
        }
    }
    spans
}

/// How many spans [`spans_of`] makes of `entry`, without making them.
pub fn count(entry: &Entry) -> usize {
    1 + entry
        .branches
        .iter()
        .flat_map(|b| &b.attempts)
        .filter(|t| t.span != 0)
        .count()
}

/// One request's worth of spans, under the resource and scope they share.
pub fn resource_spans(resource: &Resource, spans: Vec<Span>) -> ResourceSpans {
    ResourceSpans {
        resource: Some(resource.clone()),
        scope_spans: vec![ScopeSpans {
            scope: Some(InstrumentationScope {
                name: env!("CARGO_PKG_NAME").to_owned(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                ..Default::default()
            }),
            spans,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The process's resource: `service.name` and `service.instance.id`.
pub fn resource(service_name: &str, instance: &str) -> Resource {
    Resource {
        attributes: vec![
            text("service.name", service_name),
            text("service.instance.id", instance),
        ],
        ..Default::default()
    }
}

fn forward(entry: &Entry) -> Span {
    let trace = &entry.trace;
    let mut attributes = vec![
        text("messaging.system", "rabbitmq"),
        text("messaging.operation.type", "process"),
        text("switchyard.verdict", entry.said.as_str()),
        text("switchyard.source", entry.source.as_str()),
    ];
    if let Some(id) = &entry.message_id {
        attributes.push(text("messaging.message.id", id));
    }
    if let Some(session) = &entry.session {
        attributes.push(text("switchyard.session", session));
    }
    let status = match &entry.said {
        Said::DeadLettered { reason, error } => {
            attributes.push(text("switchyard.reason", reason));
            error_status(format!("dead-lettered ({reason}): {error}"))
        }
        Said::Answered { status, reason } => {
            attributes.push(int("http.response.status_code", i64::from(*status)));
            if *status >= 500 {
                error_status(format!("answered {status}: {reason}"))
            } else {
                None
            }
        }
        Said::Acked | Said::Requeued | Said::Redriven => None,
    };
    let flags = FLAG_SAMPLED
        | FLAG_HAS_IS_REMOTE
        | if trace.parent.is_some() {
            FLAG_IS_REMOTE
        } else {
            0
        };
    Span {
        trace_id: trace.trace_id.to_be_bytes().to_vec(),
        span_id: trace.span.to_be_bytes().to_vec(),
        trace_state: trace.state.clone().unwrap_or_default(),
        parent_span_id: trace
            .parent
            .map(|p| p.to_be_bytes().to_vec())
            .unwrap_or_default(),
        flags,
        name: FORWARD.to_owned(),
        kind: SpanKind::Consumer as i32,
        start_time_unix_nano: unix_nanos(entry.received_at),
        end_time_unix_nano: unix_nanos(entry.settled_at),
        attributes,
        status,
        ..Default::default()
    }
}

fn publish(entry: &Entry, branch: &str, tried: &Tried) -> Span {
    let trace = &entry.trace;
    let endpoint = &tried.endpoint;
    let exchange = if endpoint.exchange.is_empty() {
        DEFAULT_EXCHANGE
    } else {
        endpoint.exchange.as_str()
    };
    let mut attributes = vec![
        text("messaging.system", "rabbitmq"),
        text("messaging.destination.name", exchange),
        text(
            "messaging.rabbitmq.destination.routing_key",
            &endpoint.routing_key,
        ),
        text("messaging.operation.type", "send"),
        text("messaging.operation.name", "publish"),
        text("switchyard.branch", branch),
        text("switchyard.endpoint", &endpoint.name),
        text("switchyard.outcome", tried.outcome.as_str()),
    ];
    if let Some(id) = &entry.message_id {
        attributes.push(text("messaging.message.id", id));
    }
    if tried.replay {
        attributes.push(boolean("switchyard.replay", true));
    }
    let status = match tried.outcome {
        Attempted::Confirmed => None,
        Attempted::Returned(code) => {
            attributes.push(int("switchyard.reply_code", i64::from(code)));
            error_status(format!("returned ({code})"))
        }
        ref other => error_status(other.as_str().to_owned()),
    };
    Span {
        trace_id: trace.trace_id.to_be_bytes().to_vec(),
        span_id: tried.span.to_be_bytes().to_vec(),
        trace_state: trace.state.clone().unwrap_or_default(),
        parent_span_id: trace.span.to_be_bytes().to_vec(),
        flags: FLAG_SAMPLED | FLAG_HAS_IS_REMOTE,
        name: format!("publish {exchange}"),
        kind: SpanKind::Producer as i32,
        start_time_unix_nano: unix_nanos(tried.started),
        end_time_unix_nano: unix_nanos(tried.ended),
        attributes,
        status,
        ..Default::default()
    }
}

fn error_status(message: String) -> Option<Status> {
    Some(Status {
        message,
        code: StatusCode::Error as i32,
    })
}

fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn text(key: &str, value: &str) -> KeyValue {
    attribute(key, Value::StringValue(value.to_owned()))
}

fn int(key: &str, value: i64) -> KeyValue {
    attribute(key, Value::IntValue(value))
}

fn boolean(key: &str, value: bool) -> KeyValue {
    attribute(key, Value::BoolValue(value))
}

fn attribute(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}
