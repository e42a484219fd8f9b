//! The configuration file as written: plain serde types, one per TOML table.
//!
//! Nothing here is validated beyond its shape (`deny_unknown_fields` makes an
//! unknown key an error). [`super::compile`] turns a [`RawConfig`] into a
//! [`super::Settings`] whose every name is resolved.

use super::control::RawControl;
use super::unknown::UnknownKey;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Name of this forwarder instance; prefixes its AMQP connection names.
    #[serde(default = "default_instance_name")]
    pub name: String,
    /// How long SIGINT/SIGTERM waits for in-flight transactions, in milliseconds.
    #[serde(default = "default_shutdown_timeout_ms")]
    pub shutdown_timeout_ms: u64,
    /// Threads that run the forwarder's tasks; 0 is one per CPU core.
    #[serde(default = "default_worker_threads")]
    pub worker_threads: u16,
    /// The queue work items are consumed from; optional when
    /// `[ingress.http]` is set.
    pub inbound: Option<RawInbound>,
    /// Where messages go when they cannot be forwarded; required with
    /// `[inbound]`, and only with it.
    pub dead_letter: Option<RawDeadLetter>,
    /// Broker connections by name.
    pub brokers: BTreeMap<String, RawBroker>,
    /// Publish destinations by name.
    pub endpoints: BTreeMap<String, RawEndpoint>,
    /// Named, ordered lists of endpoint names used as backups.
    #[serde(default)]
    pub backup_lists: BTreeMap<String, Vec<String>>,
    /// Named filters.
    #[serde(default)]
    pub filters: BTreeMap<String, RawFilter>,
    /// The filter table: each entry is a potential branch.
    #[serde(default)]
    pub filter_table: Vec<RawFilterEntry>,
    /// Sessionful message sets.
    #[serde(default)]
    pub sessions: RawSessions,
    /// The admin HTTP listener.
    #[serde(default)]
    pub admin: RawAdmin,
    /// Sources of messages besides the inbound queue.
    #[serde(default)]
    pub ingress: RawIngress,
    /// The record of every settled message, on a RabbitMQ stream.
    #[serde(default)]
    pub journal: RawJournal,
    /// Where spans are exported.
    #[serde(default)]
    pub telemetry: RawTelemetry,
    /// The group's commands (pause, drains, registrations), on a RabbitMQ
    /// stream.
    #[serde(default)]
    pub control: RawControl,
}

fn default_instance_name() -> String {
    "switchyard".to_owned()
}

fn default_shutdown_timeout_ms() -> u64 {
    10_000
}

fn default_worker_threads() -> u16 {
    1
}

/// `[inbound]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInbound {
    /// A key of `[brokers]`.
    pub broker: String,
    /// The queue to consume.
    pub queue: String,
    /// `basic.qos` prefetch: how many messages are held unacked at once.
    #[serde(default = "default_prefetch")]
    pub prefetch: u32,
    /// Declare the queue (durable) with its dead-letter arguments.
    #[serde(default = "default_true")]
    pub declare: bool,
    /// Declare the queue with `x-single-active-consumer`.
    #[serde(default)]
    pub single_active_consumer: bool,
    /// `"classic"` (default) or `"quorum"`: the queue's type, declared as
    /// `x-queue-type`. It must match an existing queue's type.
    #[serde(default = "default_queue_type")]
    pub queue_type: String,
    /// A message delivered more than this many times is dead-lettered with
    /// reason `poison` (at least 1).
    #[serde(default = "default_max_redeliveries")]
    pub max_redeliveries: u32,
    /// A message that has been forwarded more than this many times (its
    /// `x-switchyard-hops` header) is dead-lettered with reason `loop`
    /// (at least 1).
    #[serde(default = "default_max_hops")]
    pub max_hops: u32,
    /// The queue's dead-letter exchange is set by an operator policy
    /// (`dead-letter-exchange`) instead of queue arguments: the queue is
    /// declared without them and, in `nack` mode, not checked for them.
    #[serde(default)]
    pub dead_letter_by_policy: bool,
    /// Users whose messages may carry the forwarder's own `x-switchyard-*`
    /// annotations (by the broker-validated `user_id` property), besides
    /// the user of the inbound broker's URI, which always may.
    #[serde(default)]
    pub trusted_users: Option<Vec<String>>,
}

fn default_queue_type() -> String {
    "classic".to_owned()
}

fn default_max_redeliveries() -> u32 {
    10
}

fn default_max_hops() -> u32 {
    8
}

fn default_prefetch() -> u32 {
    1000
}

fn default_true() -> bool {
    true
}

/// `[dead_letter]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeadLetter {
    /// `"nack"` or `"republish"`.
    #[serde(default = "default_dead_letter_mode")]
    pub mode: String,
    /// The dead-letter exchange.
    pub exchange: String,
    /// The routing key dead letters are published (or dead-lettered) with.
    #[serde(default)]
    pub routing_key: String,
    /// The dead-letter queue, declared and bound when `inbound.declare` is true.
    #[serde(default)]
    pub queue: Option<String>,
    /// `"classic"` (default) or `"quorum"`: the type `queue` is declared with.
    #[serde(default)]
    pub queue_type: Option<String>,
}

fn default_dead_letter_mode() -> String {
    "nack".to_owned()
}

/// `[brokers.NAME]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBroker {
    /// `amqp://` or `amqps://` URI, credentials included.
    pub uri: Option<String>,
    /// Instead of `uri`: a cluster's nodes, in order of preference, all with
    /// the same vhost and user.
    pub uris: Option<Vec<String>>,
    /// `amqps://` only: a PEM file of CA certificates trusted to sign the
    /// broker's certificate, in addition to the system's roots. Relative to
    /// the configuration file's directory.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// `amqps://` only: a PEM file with the client certificate (chain) shown
    /// to a broker that asks for one; needs `client_key_file`. Relative to
    /// the configuration file's directory.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// `amqps://` only: the PEM private key of `client_cert_file`. Relative
    /// to the configuration file's directory.
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
}

impl RawConfig {
    /// Makes every relative file path in the configuration relative to
    /// `dir` (the configuration file's directory) instead of the process's
    /// working directory.
    pub fn relative_to(&mut self, dir: &Path) {
        if let Some(http) = &mut self.ingress.http {
            for file in [&mut http.cert_file, &mut http.key_file]
                .into_iter()
                .flatten()
            {
                if file.is_relative() {
                    *file = dir.join(&*file);
                }
            }
        }
        for broker in self.brokers.values_mut() {
            for file in [
                &mut broker.ca_file,
                &mut broker.client_cert_file,
                &mut broker.client_key_file,
            ]
            .into_iter()
            .flatten()
            {
                if file.is_relative() {
                    *file = dir.join(&*file);
                }
            }
        }
    }
}

/// `[endpoints.NAME]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEndpoint {
    /// A key of `[brokers]`.
    pub broker: String,
    /// Exchange to publish to; `""` is the default exchange.
    #[serde(default)]
    pub exchange: String,
    /// Routing key of the copies; with the default exchange, the queue name.
    #[serde(default)]
    pub routing_key: String,
    /// Declare this durable queue at startup.
    #[serde(default)]
    pub declare_queue: Option<String>,
    /// `"classic"` (default) or `"quorum"`: the type `declare_queue` is
    /// declared with.
    #[serde(default)]
    pub declare_queue_type: Option<String>,
    /// How long to wait for a publisher confirm, in milliseconds.
    #[serde(default = "default_confirm_timeout_ms")]
    pub confirm_timeout_ms: u64,
    /// Extra attempts on this endpoint before moving to the next one.
    #[serde(default)]
    pub retries: u32,
    /// Headers set (or overwritten) on this endpoint's copies.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// After a connection- or channel-level failure the endpoint is skipped
    /// and probed in the background this often, in milliseconds.
    #[serde(default = "default_probe_interval_ms")]
    pub probe_interval_ms: u64,
}

fn default_confirm_timeout_ms() -> u64 {
    5000
}

fn default_probe_interval_ms() -> u64 {
    1000
}

/// `[filters.NAME]`: one filter, of the kind its `type` names, with that
/// kind's keys and no other. A key another kind takes, a missing key or an
/// unknown kind is kept as [`RawFilter::Invalid`], which `compile`
/// reports with the filter's name.
#[derive(Debug, Clone)]
pub enum RawFilter {
    /// `match_all`: always matches; takes no key.
    MatchAll,
    /// `header`.
    Header(RawHeaderFilter),
    /// `property`.
    Property(RawPropertyFilter),
    /// `routing_key`.
    RoutingKey(RawRoutingKeyFilter),
    /// `json`.
    Json(RawJsonFilter),
    /// `xpath`.
    XPath(RawXPathFilter),
    /// `and`: every named filter matches.
    And(RawListFilter),
    /// `or`: some named filter matches.
    Or(RawListFilter),
    /// `not`: the named filter does not match.
    Not(RawNotFilter),
    /// Keys that do not fit: the key at fault (`""`: the filter as a
    /// whole) and what is wrong.
    Invalid {
        /// The key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

/// The kinds, as `type` spells them.
const FILTER_KINDS: &str = "match_all, header, property, routing_key, json, xpath, and, or, not";

impl<'de> Deserialize<'de> for RawFilter {
    /// Reads `type`, then the other keys as that kind's struct, through
    /// the configuration's own values so that environment overrides (text)
    /// convert to booleans and numbers as anywhere else.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = config::Value::deserialize(deserializer)?;
        let mut table = value.into_table().map_err(serde::de::Error::custom)?;
        let Some(kind) = table.remove("type") else {
            return Ok(Self::invalid("type", "is required"));
        };
        let kind = kind.into_string().map_err(serde::de::Error::custom)?;
        let keys = config::Value::from(table);
        let parsed = match kind.as_str() {
            "match_all" => keys.try_deserialize::<RawNoKeys>().map(|_| Self::MatchAll),
            "header" => keys.try_deserialize().map(Self::Header),
            "property" => keys.try_deserialize().map(Self::Property),
            "routing_key" => keys.try_deserialize().map(Self::RoutingKey),
            "json" => keys.try_deserialize().map(Self::Json),
            "xpath" => keys.try_deserialize().map(Self::XPath),
            "and" => keys.try_deserialize().map(Self::And),
            "or" => keys.try_deserialize().map(Self::Or),
            "not" => keys.try_deserialize().map(Self::Not),
            other => {
                return Ok(Self::invalid(
                    "type",
                    &format!("unknown filter type \"{other}\" (expected {FILTER_KINDS})"),
                ));
            }
        };
        Ok(parsed.unwrap_or_else(|e| Self::misfit(&kind, &e)))
    }
}

impl RawFilter {
    fn invalid(key: &str, message: &str) -> Self {
        Self::Invalid {
            key: key.to_owned(),
            message: message.to_owned(),
        }
    }

    /// What serde found wrong with a `kind` filter's keys, said as the rest
    /// of the configuration says it.
    fn misfit(kind: &str, error: &config::ConfigError) -> Self {
        if let config::ConfigError::NotFound(key) = error {
            return Self::invalid(key, "is required");
        }
        let unknown = match error {
            config::ConfigError::Message(text) => UnknownKey::read(text),
            _ => None,
        };
        match unknown {
            Some(mut unknown) => {
                unknown.valid.insert(0, "type".to_owned());
                let what = format!("does not apply to a \"{kind}\" filter");
                Self::invalid(&unknown.key, &unknown.explain(&what))
            }
            None => Self::invalid("", &error.to_string()),
        }
    }
}

/// `match_all` takes no key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNoKeys {}

/// `[filters.NAME]` with `type = "header"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderFilter {
    /// The header name.
    pub header: String,
    /// Matches when the value's text form equals this.
    pub equals: Option<ScalarValue>,
    /// Matches when the header is present.
    pub exists: Option<bool>,
    /// Matches when the value's text form matches this regular expression.
    pub regex: Option<String>,
    /// Matches when the value's text form is one of these.
    #[serde(rename = "in")]
    pub one_of: Option<Vec<ScalarValue>>,
}

/// `[filters.NAME]` with `type = "property"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPropertyFilter {
    /// The property name.
    pub property: String,
    /// Matches when the value's text form equals this.
    pub equals: Option<ScalarValue>,
    /// Matches when the value's text form matches this regular expression.
    pub regex: Option<String>,
    /// Matches when the value's text form is one of these.
    #[serde(rename = "in")]
    pub one_of: Option<Vec<ScalarValue>>,
}

/// `[filters.NAME]` with `type = "routing_key"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoutingKeyFilter {
    /// The topic pattern.
    pub pattern: String,
}

/// `[filters.NAME]` with `type = "json"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJsonFilter {
    /// An RFC 6901 pointer to the value tested in the body (`""` is the
    /// whole document).
    pub pointer: String,
    /// Matches when the value's text form equals this.
    pub equals: Option<ScalarValue>,
    /// Matches when the value is present.
    pub exists: Option<bool>,
    /// Matches when the value's text form matches this regular expression.
    pub regex: Option<String>,
    /// Matches when the value's text form is one of these.
    #[serde(rename = "in")]
    pub one_of: Option<Vec<ScalarValue>>,
}

/// `[filters.NAME]` with `type = "xpath"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawXPathFilter {
    /// An XPath 1.0 expression over the body; matches when it is true,
    /// selects a node, or is a non-zero number or non-empty string.
    pub expression: String,
    /// The namespace prefixes the expression uses, as `{ prefix = "uri" }`.
    pub namespaces: Option<BTreeMap<String, String>>,
}

/// `[filters.NAME]` with `type = "and"` or `"or"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListFilter {
    /// The named filters.
    pub filters: Vec<String>,
}

/// `[filters.NAME]` with `type = "not"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNotFilter {
    /// The named filter.
    pub filter: String,
}

/// A TOML scalar compared by its text form (`1`, `true` and `"x"` all work).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum ScalarValue {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Text(String),
}

impl ScalarValue {
    /// The text form header and property values are compared with.
    pub fn as_text(&self) -> String {
        match self {
            Self::Bool(b) => b.to_string(),
            Self::Int(i) => i.to_string(),
            Self::Float(f) => f.to_string(),
            Self::Text(s) => s.clone(),
        }
    }
}

/// `[[filter_table]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFilterEntry {
    /// Branch name used in headers, logs and metrics; default `<filter>-><endpoint>`.
    pub name: Option<String>,
    /// A key of `[filters]`.
    pub filter: String,
    /// A key of `[endpoints]`: the branch's first endpoint. A
    /// `registrable` entry may leave it out: its list is then whatever
    /// services register.
    pub endpoint: Option<String>,
    /// A key of `[backup_lists]`.
    pub backup_list: Option<String>,
    /// Only the highest priority with a match is used.
    #[serde(default)]
    pub priority: i32,
    /// `"failover"` or `"round_robin"`.
    #[serde(default = "default_strategy")]
    pub strategy: String,
    /// A required branch always gets a matching message, even when the
    /// message's `x-switchyard-only` does not name it.
    #[serde(default)]
    pub required: bool,
    /// `"wait"` (default): a message whose list an outage exhausted
    /// (brokers unreachable, lost, stalled, or refusing the forwarder's
    /// user) is held, unacked with consuming paused, until an endpoint
    /// works again. `"dead_letter"`: it is dead-lettered (reason `outage`).
    #[serde(default = "default_outage")]
    pub outage: String,
    /// With `outage = "dead_letter"`: hold for this long first.
    pub outage_timeout_ms: Option<u64>,
    /// Services may register endpoints into this branch's list
    /// (`PUT /registry/{branch}/{name}` on the admin endpoint).
    #[serde(default)]
    pub registrable: bool,
}

fn default_outage() -> String {
    "wait".to_owned()
}

fn default_strategy() -> String {
    "failover".to_owned()
}

/// `[sessions]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSessions {
    /// Whether sessionful forwarding is on.
    pub enabled: bool,
    /// Header naming the session a message belongs to.
    pub id_header: String,
    /// Header marking the last message of a session.
    pub end_header: String,
    /// A session idle this long is dead-lettered, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Most messages a session may hold.
    pub max_messages: u32,
    /// Most body bytes a session may hold.
    pub max_bytes: u64,
    /// Most sessions open at once.
    pub max_open: u32,
    /// A message of a session completed or dead-lettered this recently is
    /// dead-lettered with reason `session-closed`, in milliseconds.
    pub closed_ttl_ms: u64,
}

impl Default for RawSessions {
    fn default() -> Self {
        Self {
            enabled: false,
            id_header: "session-id".to_owned(),
            end_header: "session-end".to_owned(),
            idle_timeout_ms: 30_000,
            max_messages: 50,
            max_bytes: 16 * 1024 * 1024,
            max_open: 16,
            closed_ttl_ms: 60_000,
        }
    }
}

/// `[admin]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    /// `host:port` of the admin listener (`/healthz`, `/readyz`,
    /// `/metrics`), e.g. `127.0.0.1:9090`; a bare port (`9090`) listens on
    /// the loopback address only. Absent means disabled.
    pub listen: Option<String>,
    /// Bearer tokens that `/control` and `/registry` accept; a list, or
    /// one string of comma-separated tokens. Without tokens those paths
    /// answer 403.
    #[serde(default, deserialize_with = "list_or_commas")]
    pub tokens: Vec<String>,
    /// Registrations the group holds at once, at most.
    #[serde(default = "default_max_registrations")]
    pub max_registrations: u32,
}

impl Default for RawAdmin {
    fn default() -> Self {
        Self {
            listen: None,
            tokens: Vec::new(),
            max_registrations: default_max_registrations(),
        }
    }
}

fn default_max_registrations() -> u32 {
    256
}

/// `[ingress]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIngress {
    /// `[ingress.http]`: messages from HTTP requests.
    pub http: Option<RawHttpIngress>,
}

/// `[ingress.http]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttpIngress {
    /// `host:port` to listen on; a bare port (`8080`) listens on the
    /// loopback address only.
    pub listen: String,
    /// The largest request body accepted, in bytes.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: u64,
    /// Requests being delivered at once; more are answered 429. Default:
    /// `inbound.prefetch`.
    pub max_in_flight: Option<u32>,
    /// How long a request may take, body read and every confirm included,
    /// in milliseconds; past it the answer is 504.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long a request's body may take to arrive once its headers have,
    /// in milliseconds; past it the answer is 408. A body still arriving
    /// holds a connection, never a `max_in_flight` slot.
    #[serde(default = "default_body_timeout_ms")]
    pub body_timeout_ms: u64,
    /// Bearer tokens accepted in `Authorization`; a list, or one string of
    /// comma-separated tokens (as an environment variable gives it). An
    /// empty token anywhere (`""`, `","`, `"a,,b"`) is refused, so an
    /// override cannot switch authentication off.
    #[serde(default, deserialize_with = "list_or_commas")]
    pub tokens: Vec<String>,
    /// A non-loopback `listen` without `tokens` is refused unless this is true.
    #[serde(default)]
    pub allow_anonymous: bool,
    /// Request headers copied into the message's headers, by name
    /// (case-insensitive).
    #[serde(default, deserialize_with = "list_or_commas")]
    pub forward_headers: Vec<String>,
    /// How long the delivered branches of an `Idempotency-Key` are
    /// remembered, in milliseconds.
    #[serde(default = "default_idempotency_ttl_ms")]
    pub idempotency_ttl_ms: u64,
    /// The most keys remembered at once; the oldest is forgotten first.
    #[serde(default = "default_idempotency_max_keys")]
    pub idempotency_max_keys: u32,
    /// Connections served at once, each once its client has sent a byte;
    /// connections that have not wait in a lobby of their own.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// How long a client may take to send a request's headers, and how long
    /// an idle keep-alive connection is kept, in milliseconds.
    #[serde(default = "default_header_timeout_ms")]
    pub header_timeout_ms: u64,
    /// PEM certificate chain: with `key_file`, the listener speaks TLS.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

fn default_max_body_bytes() -> u64 {
    1024 * 1024
}

fn default_request_timeout_ms() -> u64 {
    30_000
}

fn default_body_timeout_ms() -> u64 {
    10_000
}

fn default_idempotency_ttl_ms() -> u64 {
    600_000
}

fn default_idempotency_max_keys() -> u32 {
    100_000
}

fn default_max_connections() -> u32 {
    1024
}

fn default_header_timeout_ms() -> u64 {
    5_000
}

/// A list of strings, or one string of comma-separated entries. Empty
/// entries are kept, for the key's own check to refuse: `"a,,b"` is a
/// mistake to name, not two tokens.
fn list_or_commas<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        List(Vec<String>),
        Text(String),
    }
    Ok(match Form::deserialize(d)? {
        Form::List(items) => items,
        Form::Text(text) => text.split(',').map(|t| t.trim().to_owned()).collect(),
    })
}

/// `[journal]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJournal {
    /// Whether every settled message leaves a record.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A key of `[brokers]`; default: the inbound broker, else the first.
    pub broker: Option<String>,
    /// The stream's name.
    #[serde(default = "default_journal_stream")]
    pub stream: String,
    /// `x-max-age` on declare.
    #[serde(default = "default_journal_max_age")]
    pub max_age: String,
    /// `x-max-length-bytes` on declare.
    #[serde(default = "default_journal_max_bytes")]
    pub max_bytes: u64,
    /// `drop` or `hold`.
    #[serde(default = "default_on_unavailable")]
    pub on_unavailable: String,
    /// Records waiting for the writer, at most.
    #[serde(default = "default_journal_buffer")]
    pub buffer: u32,
}

impl Default for RawJournal {
    fn default() -> Self {
        Self {
            enabled: true,
            broker: None,
            stream: default_journal_stream(),
            max_age: default_journal_max_age(),
            max_bytes: default_journal_max_bytes(),
            on_unavailable: default_on_unavailable(),
            buffer: default_journal_buffer(),
        }
    }
}

fn yes() -> bool {
    true
}

fn default_journal_stream() -> String {
    "switchyard.journal".to_owned()
}

fn default_journal_max_age() -> String {
    "7D".to_owned()
}

fn default_journal_max_bytes() -> u64 {
    1 << 30
}

fn default_on_unavailable() -> String {
    "drop".to_owned()
}

fn default_journal_buffer() -> u32 {
    10_000
}

/// `[telemetry]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// `[telemetry.otlp]`
    pub otlp: Option<RawOtlp>,
}

/// `[telemetry.otlp]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtlp {
    /// The collector's OTLP/HTTP base URL; absent: nothing exported.
    pub endpoint: Option<String>,
    /// `service.name` of the spans.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// The share of new traces sampled.
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
}

fn default_service_name() -> String {
    "switchyard".to_owned()
}

fn default_sample_ratio() -> f64 {
    1.0
}
