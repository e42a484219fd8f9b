//! One dead letter as `dlq inspect` shows it and `dlq redrive` reads it:
//! the forwarder's `x-switchyard-*` annotations (republish mode), the
//! broker's `x-death` (nack mode, or a message the broker dead-lettered by
//! itself), the first bytes of the body, and the copy redrive publishes.
//! Pure: no I/O.
//!
//! Only a dead letter whose `user_id` is a trusted user's ([`Trust`]: the
//! forwarder's own, which its dead letters carry, and
//! `inbound.trusted_users`) is read for the forwarder's record. On any
//! other, `x-switchyard-*` headers are a producer's: their names are shown
//! as such, their values never taken for the forwarder's.

use crate::amqp::{AmqpValue, FieldArray, FieldTable, Properties, short_text};
use crate::envelope::{Envelope, value_text};
use crate::routing::RoutingTable;
use crate::wire::{self, Kind, Trust};
use serde_json::{Value, json};

/// How many bytes of the body a listing shows.
pub const PREVIEW_BYTES: usize = 64;

/// Said of a dead letter that carries no annotation of the forwarder's.
pub const NACK_NOTE: &str = "dead-lettered by the broker (nack mode or a queue limit): the reason and branches are only in the forwarder's log (event \"dead-lettered\", by message_id)";

/// Said of a dead letter the broker made at the inbound queue's delivery
/// limit (its newest `x-death` reason is `delivery_limit`).
pub const DELIVERY_LIMIT_NOTE: &str = "dead-lettered by the broker at the queue's delivery limit: it came back more often than the limit without being settled, so switchyard never decided on it (a message whose header switchyard's client cannot read, or a forwarder that kept stopping with it); redrive sends it to every branch";

/// Headers the broker adds when it dead-letters or redelivers a message;
/// a redriven copy starts without them.
const BROKER_HEADERS: [&str; 2] = ["x-death", "x-delivery-count"];
const BROKER_PREFIXES: [&str; 2] = ["x-first-death-", "x-last-death-"];

/// A failed branch and what is known of its last attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedBranch {
    /// The branch (filter-table entry) name.
    pub branch: String,
    /// The endpoint that refused last, when the configuration tells
    /// (a `failover` branch whose list was exhausted).
    pub endpoint: Option<String>,
    /// The branch's last error, from `x-switchyard-error`.
    pub error: Option<String>,
}

/// One `x-death` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Death {
    /// How many times the message was dead-lettered from `queue` for `reason`.
    pub count: Option<i64>,
    /// `rejected`, `expired`, `maxlen` or `delivery_limit`.
    pub reason: Option<String>,
    /// The queue it was dead-lettered from.
    pub queue: Option<String>,
    /// Unix time in seconds.
    pub time: Option<i64>,
    /// The exchange it had been published to.
    pub exchange: Option<String>,
    /// The routing keys it had been published with.
    pub routing_keys: Vec<String>,
}

/// Which branches a dead letter has not reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// Nothing is known of its branches: every branch.
    Every,
    /// These branches.
    Only(Vec<String>),
    /// Every branch already holds it.
    Nothing,
}

/// A dead letter, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The message_id property.
    pub message_id: Option<String>,
    /// `x-switchyard-reason`, or `x-death:<reason>` for a message only the
    /// broker annotated.
    pub reason: Option<String>,
    /// `x-switchyard-error`.
    pub error: Option<String>,
    /// `x-switchyard-failed`, with each branch's endpoint and error.
    pub failed: Vec<FailedBranch>,
    /// `x-switchyard-delivered`.
    pub delivered: Vec<String>,
    /// `x-switchyard-source-queue`, or the queue of the newest `x-death`.
    pub source_queue: Option<String>,
    /// When it was dead-lettered, in unix milliseconds:
    /// `x-switchyard-dead-lettered-at`, or the newest `x-death` time.
    pub dead_lettered_at_ms: Option<i64>,
    /// Whether the forwarder annotated it (republish mode): it carries the
    /// record of a trusted user.
    pub annotated: bool,
    /// The kinds of `x-switchyard-*` header it carries that are not the
    /// forwarder's record (a producer's; `other` for unknown names),
    /// ignored.
    pub producer_annotations: Vec<&'static str>,
    /// `x-death`, newest first.
    pub deaths: Vec<Death>,
    /// The trace it belongs to (its `traceparent`), 32 hex digits: the
    /// key to `switchyard trace` and to a tracing backend.
    pub trace_id: Option<String>,
    /// The body's length in bytes.
    pub body_bytes: usize,
    /// The first [`PREVIEW_BYTES`] of the body, printable.
    pub body_preview: String,
}

impl Record {
    /// Reads `message`; `routing` names the endpoint each failed branch
    /// tried last; only a message of a user `trust` names is read for the
    /// forwarder's record.
    pub fn read(message: &Envelope, routing: &RoutingTable, trust: &Trust) -> Self {
        let trusted = trust.trusts(&message.properties);
        let header = |name: &str| message.header(name).filter(|_| trusted);
        let text = |name: &str| header(name).and_then(value_text).map(|t| t.into_owned());
        let mut producer_annotations: Vec<&'static str> = Vec::new();
        if !trusted {
            for name in message.headers().iter().flat_map(|h| h.inner().keys()) {
                let label = Kind::of(name.as_str()).map(Kind::label);
                if let Some(label) = label.filter(|l| !producer_annotations.contains(l)) {
                    producer_annotations.push(label);
                }
            }
        }
        let deaths = match message.header("x-death") {
            Some(AmqpValue::FieldArray(items)) => {
                items.as_slice().iter().filter_map(death).collect()
            }
            _ => Vec::new(),
        };
        let newest = deaths.first();
        let reason = text(wire::REASON);
        let annotated = reason.is_some();
        let error = text(wire::ERROR);
        let failed_names = names(header(wire::FAILED));
        let errors = branch_errors(error.as_deref().unwrap_or(""), &failed_names);
        // The forwarder records the endpoint that refused each branch last;
        // for older dead letters, only an exhausted list ends on the endpoint
        // it tries last.
        let recorded = names(header(wire::FAILED_ENDPOINTS));
        let exhausted = reason.as_deref() == Some("exhausted");
        let failed = failed_names
            .into_iter()
            .zip(errors)
            .enumerate()
            .map(|(i, (branch, error))| FailedBranch {
                endpoint: match recorded.get(i).filter(|e| !e.is_empty()) {
                    Some(endpoint) => Some(endpoint.clone()),
                    None => exhausted
                        .then(|| routing.last_endpoint(&branch).map(str::to_owned))
                        .flatten(),
                },
                branch,
                error,
            })
            .collect();
        let dead_lettered_at_ms = match header(wire::DEAD_LETTERED_AT) {
            Some(v) => value_text(v).and_then(|t| t.parse().ok()),
            None => newest.and_then(|d| d.time).map(|s| s.saturating_mul(1000)),
        };
        Self {
            message_id: message
                .properties
                .message_id()
                .as_ref()
                .map(|m| short_text(m).into_owned()),
            reason: reason.or_else(|| {
                newest
                    .and_then(|d| d.reason.as_deref())
                    .map(|r| format!("x-death:{r}"))
            }),
            error,
            failed,
            delivered: names(header(wire::DELIVERED)),
            trace_id: trace_id(message),
            source_queue: text(wire::SOURCE_QUEUE).or_else(|| newest.and_then(|d| d.queue.clone())),
            dead_lettered_at_ms,
            annotated,
            producer_annotations,
            deaths,
            body_bytes: message.body.len(),
            body_preview: printable(&message.body[..message.body.len().min(PREVIEW_BYTES)]),
        }
    }

    /// The failed branch names, for `x-switchyard-only`.
    pub fn failed_branches(&self) -> Vec<String> {
        self.failed.iter().map(|f| f.branch.clone()).collect()
    }

    /// The branches a redrive must still reach: the failed ones; none when
    /// the forwarder recorded that every branch holds the message (a
    /// session's message delivered everywhere before the session failed);
    /// every branch when nothing is known.
    pub fn missing(&self) -> Missing {
        if !self.failed.is_empty() {
            Missing::Only(self.failed_branches())
        } else if self.annotated && !self.delivered.is_empty() {
            Missing::Nothing
        } else {
            Missing::Every
        }
    }

    /// What a listing says of a dead letter the forwarder did not
    /// annotate: who dead-lettered it and where its reason is.
    pub fn note(&self) -> Option<&'static str> {
        if self.annotated {
            return None;
        }
        let newest = self.deaths.first().and_then(|d| d.reason.as_deref());
        Some(match newest {
            Some("delivery_limit") => DELIVERY_LIMIT_NOTE,
            _ => NACK_NOTE,
        })
    }

    /// Milliseconds since it was dead-lettered, if known.
    pub fn age_ms(&self, now_ms: i64) -> Option<i64> {
        self.dead_lettered_at_ms.map(|at| (now_ms - at).max(0))
    }

    /// The JSON object `dlq inspect --json` prints for it.
    pub fn to_json(&self, now_ms: i64) -> Value {
        let failed: Vec<Value> = self
            .failed
            .iter()
            .map(|f| json!({"branch": f.branch, "endpoint": f.endpoint, "error": f.error}))
            .collect();
        let deaths: Vec<Value> = self
            .deaths
            .iter()
            .map(|d| {
                json!({
                    "count": d.count, "reason": d.reason, "queue": d.queue, "time": d.time,
                    "exchange": d.exchange, "routing_keys": d.routing_keys,
                })
            })
            .collect();
        json!({
            "message_id": self.message_id,
            "reason": self.reason,
            "error": self.error,
            "failed": failed,
            "delivered": self.delivered,
            "source_queue": self.source_queue,
            "dead_lettered_at_ms": self.dead_lettered_at_ms,
            "age_ms": self.age_ms(now_ms),
            "annotated": self.annotated,
            "x_death": deaths,
            "note": self.note(),
            "producer_annotations": self.producer_annotations,
            "trace_id": self.trace_id,
            "body_bytes": self.body_bytes,
            "body_preview": self.body_preview,
        })
    }
}

/// Whether `message` is the forwarder's dead-letter route probe, which is
/// not a dead letter: marked, and published by a trusted user (a
/// producer's mark hides nothing).
pub fn is_probe(message: &Envelope, trust: &Trust) -> bool {
    message.header(wire::PROBE).is_some() && trust.trusts(&message.properties)
}

/// The properties of the copy `dlq redrive` puts back on the inbound
/// queue: the dead letter's own, without the forwarder's annotations and
/// the broker's dead-letter headers, marked `x-switchyard-redriven`,
/// restricted with `x-switchyard-only` to `only` when it is not empty (a
/// dead letter without failed branches goes to every branch), and
/// published as `user` (the redriving user, which the forwarder trusts) so
/// the forwarder honours those marks. A producer's own `user_id` (not a
/// trusted user's) is kept, as the forwarder keeps it on copies: the
/// broker refuses it unless it is the redriving user's.
pub fn redrive_properties(
    message: &Envelope,
    only: &[String],
    user: Option<&str>,
    trust: &Trust,
) -> Properties {
    let original = message.headers();
    let mut headers = FieldTable::default();
    for (name, value) in original.map(|h| h.inner().iter()).into_iter().flatten() {
        let name_text = name.as_str();
        let dropped = wire::is_own(name_text)
            || BROKER_HEADERS.contains(&name_text)
            || BROKER_PREFIXES.iter().any(|p| name_text.starts_with(p));
        if !dropped {
            headers.insert(name.clone(), value.clone());
        }
    }
    if !only.is_empty() {
        let names = only
            .iter()
            .map(|n| AmqpValue::LongString(n.as_str().into()))
            .collect::<Vec<_>>();
        headers.insert(
            wire::ONLY.into(),
            AmqpValue::FieldArray(FieldArray::from(names)),
        );
    }
    headers.insert(wire::REDRIVEN.into(), AmqpValue::Boolean(true));
    let properties = message.properties.clone().with_headers(headers);
    let producers = properties.user_id().is_some() && !trust.trusts(&properties);
    match user {
        Some(user) if !producers => properties.with_user_id(user.into()),
        _ => properties,
    }
}

/// `text` with control characters shown as `.`; invalid UTF-8 becomes
/// U+FFFD. Safe in a table cell and a terminal.
pub fn printable(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| if c.is_control() { '.' } else { c })
        .collect()
}

fn names(value: Option<&AmqpValue>) -> Vec<String> {
    match value {
        Some(AmqpValue::FieldArray(items)) => items
            .as_slice()
            .iter()
            .filter_map(|v| value_text(v).map(|t| t.into_owned()))
            .collect(),
        Some(other) => value_text(other)
            .map(|t| {
                t.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
        None => Vec::new(),
    }
}

/// Splits `x-switchyard-error` (`"<branch>: <error>; <branch>: <error>"`,
/// in the order of `x-switchyard-failed`) into one error per failed branch.
fn branch_errors(error: &str, branches: &[String]) -> Vec<Option<String>> {
    let mut out = Vec::with_capacity(branches.len());
    let mut rest = error;
    for (i, branch) in branches.iter().enumerate() {
        let prefix = format!("{branch}: ");
        let Some(after) = rest.strip_prefix(prefix.as_str()) else {
            out.push(None);
            continue;
        };
        let end = branches[i + 1..]
            .first()
            .and_then(|next| after.find(&format!("; {next}: ")))
            .unwrap_or(after.len());
        out.push(Some(after[..end].to_owned()));
        rest = after[end..].strip_prefix("; ").unwrap_or("");
    }
    out
}

fn death(value: &AmqpValue) -> Option<Death> {
    let AmqpValue::FieldTable(table) = value else {
        return None;
    };
    let get = |key: &str| table.inner().get(key);
    let text = |key: &str| get(key).and_then(value_text).map(|t| t.into_owned());
    let number = |key: &str| text(key).and_then(|t| t.parse().ok());
    Some(Death {
        count: number("count"),
        reason: text("reason"),
        queue: text("queue"),
        time: number("time"),
        exchange: text("exchange"),
        routing_keys: names(get("routing-keys")),
    })
}

/// The trace id of `message`'s `traceparent`, when it carries a valid one
/// (the forwarder's on a republished dead letter, the producer's otherwise).
fn trace_id(message: &Envelope) -> Option<String> {
    let trace = wire::Trace::from_headers(message.headers());
    trace.parent.map(|_| trace.trace_id_hex())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_str;

    const CONFIG: &str = r#"
[inbound]
broker = "main"
queue = "in"
[dead_letter]
mode = "republish"
exchange = "dlx"
routing_key = "dlq"
queue = "dlq"
[brokers.main]
uri = "amqp://guest:guest@127.0.0.1:5672/%2f"
[endpoints.s1]
broker = "main"
routing_key = "s1"
[endpoints.s2]
broker = "main"
routing_key = "s2"
[endpoints.l1]
broker = "main"
routing_key = "l1"
[backup_lists]
service = ["s2"]
[filters.all]
type = "match_all"
[[filter_table]]
name = "service"
filter = "all"
endpoint = "s1"
backup_list = "service"
[[filter_table]]
name = "logging"
filter = "all"
endpoint = "l1"
"#;

    /// The forwarder's own user, which its dead letters carry.
    fn trust() -> Trust {
        Trust::new(vec!["guest".to_owned()])
    }

    /// `m` as a producer sent it: no `user_id`.
    fn from_producer(mut m: Envelope) -> Envelope {
        let mut p = Properties::default()
            .with_message_id("m-1".into())
            .with_correlation_id("c-1".into());
        if let Some(h) = m.headers() {
            p = p.with_headers(h.clone());
        }
        m.properties = p;
        m
    }

    fn routing() -> std::sync::Arc<RoutingTable> {
        load_str(CONFIG, "t.toml")
            .unwrap_or_else(|e| panic!("{e}"))
            .routing
    }

    fn text(s: &str) -> AmqpValue {
        AmqpValue::LongString(s.into())
    }

    fn array(items: &[&str]) -> AmqpValue {
        AmqpValue::FieldArray(FieldArray::from(
            items.iter().map(|s| text(s)).collect::<Vec<_>>(),
        ))
    }

    /// A message whose only header is `x-death` holding `death`.
    fn dead_by(death: FieldTable) -> Envelope {
        let deaths = FieldArray::from(vec![AmqpValue::FieldTable(death)]);
        message(vec![("x-death", AmqpValue::FieldArray(deaths))], b"")
    }

    fn message(headers: Vec<(&str, AmqpValue)>, body: &[u8]) -> Envelope {
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert(k.into(), v);
        }
        Envelope {
            delivery_tag: 1,
            exchange: "dlx".to_owned(),
            routing_key: "dlq".to_owned(),
            redelivered: false,
            properties: Properties::default()
                .with_message_id("m-1".into())
                .with_correlation_id("c-1".into())
                .with_user_id("guest".into())
                .with_headers(table),
            body: body.to_vec(),
            annotations: Default::default(),
        }
    }

    fn annotated() -> Envelope {
        message(
            vec![
                ("x-switchyard-reason", text("exhausted")),
                (
                    "x-switchyard-error",
                    text(
                        "service: returned by the broker: 312 NO_ROUTE; logging: no confirm within 5000 ms",
                    ),
                ),
                ("x-switchyard-failed", array(&["service", "logging"])),
                ("x-switchyard-delivered", array(&[])),
                ("x-switchyard-source-queue", text("in")),
                (
                    "x-switchyard-dead-lettered-at",
                    AmqpValue::LongLongInt(1_000_000),
                ),
                ("x-switchyard-hops", AmqpValue::LongLongInt(1)),
                ("tenant", text("acme")),
            ],
            b"{\"order\":\n17}\x01",
        )
    }

    #[test]
    fn an_annotated_dead_letter_names_its_branches_endpoints_and_errors() {
        let r = Record::read(&annotated(), &routing(), &trust());
        assert_eq!(r.message_id.as_deref(), Some("m-1"));
        assert_eq!(r.reason.as_deref(), Some("exhausted"));
        assert!(r.annotated);
        assert_eq!(
            r.failed,
            vec![
                FailedBranch {
                    branch: "service".to_owned(),
                    endpoint: Some("s2".to_owned()),
                    error: Some("returned by the broker: 312 NO_ROUTE".to_owned()),
                },
                FailedBranch {
                    branch: "logging".to_owned(),
                    endpoint: Some("l1".to_owned()),
                    error: Some("no confirm within 5000 ms".to_owned()),
                },
            ]
        );
        assert!(r.delivered.is_empty());
        assert_eq!(r.source_queue.as_deref(), Some("in"));
        assert_eq!(r.dead_lettered_at_ms, Some(1_000_000));
        assert_eq!(r.age_ms(1_005_000), Some(5000));
        assert_eq!(r.body_bytes, 14);
        assert_eq!(r.body_preview, "{\"order\":.17}.");
        let json = r.to_json(1_005_000);
        assert_eq!(json["failed"][0]["endpoint"], "s2");
        assert_eq!(json["age_ms"], 5000);
        assert_eq!(json["note"], Value::Null);
    }

    #[test]
    fn a_recorded_refusing_endpoint_wins_over_the_configuration() {
        let rejected = message(
            vec![
                ("x-switchyard-reason", text("rejected")),
                (
                    "x-switchyard-error",
                    text("service: refused by the broker: 406"),
                ),
                ("x-switchyard-failed", array(&["service"])),
                ("x-switchyard-failed-endpoints", array(&["s1"])),
            ],
            b"",
        );
        let r = Record::read(&rejected, &routing(), &trust());
        assert_eq!(r.failed[0].endpoint.as_deref(), Some("s1"));
    }

    #[test]
    fn a_nacked_dead_letter_shows_x_death() {
        let mut death = FieldTable::default();
        death.insert("count".into(), AmqpValue::LongLongInt(2));
        death.insert("reason".into(), text("rejected"));
        death.insert("queue".into(), text("in"));
        death.insert("time".into(), AmqpValue::Timestamp(1_700_000_000));
        death.insert("exchange".into(), text(""));
        death.insert("routing-keys".into(), array(&["in"]));
        let m = dead_by(death);
        let r = Record::read(&m, &routing(), &trust());
        assert!(!r.annotated);
        assert_eq!(r.reason.as_deref(), Some("x-death:rejected"));
        assert_eq!(r.source_queue.as_deref(), Some("in"));
        assert_eq!(r.dead_lettered_at_ms, Some(1_700_000_000_000));
        assert!(r.failed.is_empty());
        assert_eq!(
            r.deaths,
            vec![Death {
                count: Some(2),
                reason: Some("rejected".to_owned()),
                queue: Some("in".to_owned()),
                time: Some(1_700_000_000),
                exchange: Some(String::new()),
                routing_keys: vec!["in".to_owned()],
            }]
        );
        assert_eq!(r.to_json(0)["note"], NACK_NOTE);
    }

    #[test]
    fn a_dead_letter_made_at_the_delivery_limit_says_so() {
        let mut death = FieldTable::default();
        death.insert("count".into(), AmqpValue::LongLongInt(1));
        death.insert("reason".into(), text("delivery_limit"));
        death.insert("queue".into(), text("in"));
        let m = dead_by(death);
        let r = Record::read(&m, &routing(), &trust());
        assert_eq!(r.reason.as_deref(), Some("x-death:delivery_limit"));
        assert_eq!(r.note(), Some(DELIVERY_LIMIT_NOTE));
        assert_eq!(r.to_json(0)["note"], DELIVERY_LIMIT_NOTE);
        assert_eq!(r.missing(), Missing::Every);
    }

    #[test]
    fn errors_split_by_branch_even_with_separators_inside() {
        let branches = ["a".to_owned(), "b".to_owned()];
        assert_eq!(
            branch_errors("a: x; y: z; b: w", &branches),
            vec![Some("x; y: z".to_owned()), Some("w".to_owned())]
        );
        assert_eq!(branch_errors("", &branches), vec![None, None]);
        assert_eq!(
            branch_errors("b: only", &branches),
            vec![None, Some("only".to_owned())]
        );
    }

    #[test]
    fn only_a_failover_branch_with_an_exhausted_list_names_an_endpoint() {
        let mut m = annotated();
        let mut headers = m.headers().cloned().unwrap_or_default();
        headers.insert("x-switchyard-reason".into(), text("rejected"));
        m.properties = m.properties.clone().with_headers(headers);
        let r = Record::read(&m, &routing(), &trust());
        assert!(r.failed.iter().all(|f| f.endpoint.is_none()));
    }

    #[test]
    fn the_redrive_copy_drops_annotations_and_death_headers_and_sets_only() {
        let mut m = annotated();
        let mut headers = m.headers().cloned().unwrap_or_default();
        headers.insert("x-death".into(), array(&[]));
        headers.insert("x-first-death-queue".into(), text("in"));
        headers.insert("x-delivery-count".into(), AmqpValue::LongLongInt(3));
        m.properties = m.properties.clone().with_headers(headers);
        let copy = redrive_properties(&m, &["logging".to_owned()], Some("guest"), &trust());
        let h = copy.headers().clone().unwrap_or_default();
        let mut keys: Vec<&str> = h.inner().keys().map(|k| k.as_str()).collect();
        keys.sort();
        assert_eq!(
            keys,
            ["tenant", "x-switchyard-only", "x-switchyard-redriven"]
        );
        assert_eq!(copy.user_id().as_ref().map(|u| u.as_str()), Some("guest"));
        assert_eq!(h.inner().get(wire::ONLY), Some(&array(&["logging"])));
        assert_eq!(copy.message_id(), m.properties.message_id());
        assert_eq!(copy.correlation_id(), m.properties.correlation_id());

        let none = redrive_properties(&m, &[], Some("guest"), &trust());
        assert!(
            none.headers()
                .as_ref()
                .is_some_and(|h| !h.inner().contains_key(wire::ONLY))
        );
        // A producer's message without a user_id is sent as the redriving
        // user; one with the producer's own keeps it.
        let mut bare = annotated();
        bare.properties = Properties::default().with_message_id("m".into());
        let sent = redrive_properties(&bare, &[], Some("guest"), &trust());
        assert_eq!(sent.user_id().as_ref().map(|u| u.as_str()), Some("guest"));
        bare.properties = bare.properties.clone().with_user_id("producer".into());
        let kept = redrive_properties(&bare, &[], Some("guest"), &trust());
        assert_eq!(
            kept.user_id().as_ref().map(|u| u.as_str()),
            Some("producer")
        );
    }

    #[test]
    fn a_producers_record_is_shown_as_such_and_never_taken_for_the_forwarders() {
        let mut death = FieldTable::default();
        death.insert("reason".into(), text("rejected"));
        death.insert("queue".into(), text("in"));
        let mut forged = from_producer(annotated());
        let mut headers = forged.headers().cloned().unwrap_or_default();
        headers.insert(
            "x-death".into(),
            AmqpValue::FieldArray(FieldArray::from(vec![AmqpValue::FieldTable(death)])),
        );
        headers.insert("x-switchyard-made-up".into(), text("x"));
        forged.properties = forged.properties.clone().with_headers(headers);
        let r = Record::read(&forged, &routing(), &trust());
        assert!(!r.annotated);
        assert_eq!(r.reason.as_deref(), Some("x-death:rejected"));
        assert_eq!(r.source_queue.as_deref(), Some("in"), "from x-death");
        assert!(r.failed.is_empty() && r.delivered.is_empty() && r.error.is_none());
        assert_eq!(r.missing(), Missing::Every, "redriven to every branch");
        let mut shown = r.producer_annotations.clone();
        shown.sort_unstable();
        assert_eq!(
            shown,
            [
                "other",
                "x-switchyard-dead-lettered-at",
                "x-switchyard-delivered",
                "x-switchyard-error",
                "x-switchyard-failed",
                "x-switchyard-hops",
                "x-switchyard-reason",
                "x-switchyard-source-queue",
            ]
        );
        assert_eq!(r.to_json(0)["note"], NACK_NOTE);
        let producer = Trust::new(vec!["someone-else".to_owned()]);
        assert!(!Record::read(&annotated(), &routing(), &producer).annotated);
    }

    #[test]
    fn probes_are_recognised() {
        let probe = message(vec![(wire::PROBE, AmqpValue::Boolean(true))], b"");
        assert!(is_probe(&probe, &trust()));
        assert!(!is_probe(&annotated(), &trust()));
        assert!(
            !is_probe(&from_producer(probe), &trust()),
            "a producer's mark hides nothing"
        );
    }

    #[test]
    fn previews_are_printable() {
        assert_eq!(printable(b"a\tb\r\nc"), "a.b..c");
        assert_eq!(printable(&[0xff, b'x']), "\u{fffd}x");
    }
}
