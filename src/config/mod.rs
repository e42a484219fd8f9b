//! Configuration in two layers: `raw` is the TOML file as written (serde,
//! unknown keys rejected); `compile` resolves every name and produces
//! [`Settings`], which cannot be invalid: every reference resolved, every
//! endpoint list non-empty, every filter compiled.

mod compile;
mod control;
mod delivery_limit;
mod error;
mod ingress;
mod journal;
mod load;
pub(crate) mod raw;
mod tls;
mod unknown;

pub(crate) use compile::compile;
pub use control::Control;
pub use delivery_limit::delivery_limit_policy;
pub use error::ConfigError;
pub(crate) use error::InvalidKey;
pub use journal::{Journal, OnUnavailable, Otlp};
pub use load::{CONFIG_ENV, DEFAULT_CONFIG_PATH, config_path, load, load_str};
pub(crate) use tls::{IdentityError, read_ca_file, read_client_identity};

use crate::destination::{DeadLetter, Endpoint, QueueType};
use crate::routing::RoutingTable;
use crate::uri::{node_of, redact_uri, same_vhost};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// A validated configuration. Only `compile` makes one (its
/// [`Compiled`] field cannot be made elsewhere), so a `Settings` always
/// passed every check; its fields are public to be read, but for the
/// inbound queue and its dead letters, which come together and are read
/// through [`Settings::queue`], [`Settings::inbound`] and
/// [`Settings::dead_letter`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// Instance name; prefixes AMQP connection names.
    pub name: String,
    /// Bound on draining in-flight transactions at shutdown.
    pub shutdown_timeout: Duration,
    /// Threads running the forwarder's tasks; `None` is one per CPU core.
    pub worker_threads: Option<usize>,
    /// The inbound queue and where its failed messages go, one with the
    /// other; `None` for a forwarder fed by the HTTP ingress alone.
    queue: Option<(Inbound, DeadLetter)>,
    /// Brokers by name.
    pub brokers: BTreeMap<String, Arc<BrokerSpec>>,
    /// Endpoints by name.
    pub endpoints: BTreeMap<String, Arc<Endpoint>>,
    /// The compiled filter table.
    pub routing: Arc<RoutingTable>,
    /// Admin listener address, if enabled.
    pub admin_listen: Option<SocketAddr>,
    /// Sessionful message sets; `None` when `sessions.enabled` is off.
    pub sessions: Option<Sessions>,
    /// The HTTP ingress; `None` when `[ingress.http]` is absent.
    pub http: Option<HttpIngress>,
    /// The journal stream; `None` when `journal.enabled` is off.
    pub journal: Option<Journal>,
    /// Span export; `None` without `[telemetry.otlp] endpoint`.
    pub otlp: Option<Otlp>,
    /// The group's command stream; `None` when `control.enabled` is off.
    pub control: Option<Control>,
    /// Proof that `compile` made it.
    pub compiled: Compiled,
}

impl Settings {
    /// The queue side: the inbound queue and its dead letters, when the
    /// forwarder consumes one.
    pub fn queue(&self) -> Option<(&Inbound, &DeadLetter)> {
        self.queue
            .as_ref()
            .map(|(inbound, dead_letter)| (inbound, dead_letter))
    }

    /// The inbound queue; `None` for a forwarder fed by the HTTP ingress
    /// alone.
    pub fn inbound(&self) -> Option<&Inbound> {
        self.queue.as_ref().map(|(inbound, _)| inbound)
    }

    /// These settings with the endpoints services registered (by branch)
    /// added: each joins `endpoints` and its branch's list. One whose
    /// branch is not registrable, whose broker is not defined or whose
    /// name a configured endpoint has (a reload can make any of them so)
    /// is left out.
    pub fn with_registered(&self, registered: &BTreeMap<String, Vec<Arc<Endpoint>>>) -> Self {
        let fits = |branch: &str, endpoint: &Endpoint| {
            self.routing.branch(branch).is_some_and(|b| b.registrable())
                && self.brokers.contains_key(&endpoint.broker)
                && !self.endpoints.contains_key(&endpoint.name)
        };
        let kept: BTreeMap<String, Vec<Arc<Endpoint>>> = registered
            .iter()
            .map(|(branch, list)| {
                let list = list.iter().filter(|e| fits(branch, e)).cloned().collect();
                (branch.clone(), list)
            })
            .collect();
        let mut next = self.clone();
        for endpoint in kept.values().flatten() {
            next.endpoints
                .insert(endpoint.name.clone(), endpoint.clone());
        }
        next.routing = Arc::new(self.routing.with_registered(&kept));
        next
    }

    /// Where failed messages go; set exactly when [`Self::inbound`] is.
    pub fn dead_letter(&self) -> Option<&DeadLetter> {
        self.queue.as_ref().map(|(_, dead_letter)| dead_letter)
    }

    /// Why publishing to `routing_key` through `exchange` of broker
    /// `broker` would be a forwarding loop (the default exchange with the
    /// inbound queue's name, on the inbound's broker or one with its host,
    /// port and vhost), in the words `check` uses; `None` when it is not.
    pub fn forwarding_loop(
        &self,
        broker: &str,
        exchange: &str,
        routing_key: &str,
    ) -> Option<String> {
        let inbound = self.inbound()?;
        if !exchange.is_empty() || routing_key != inbound.queue {
            return None;
        }
        let on = if broker == inbound.broker {
            format!("broker \"{broker}\", the inbound's broker")
        } else {
            let ours = self.brokers.get(broker)?;
            let theirs = self.brokers.get(&inbound.broker)?;
            if !ours.same_vhost_as(theirs) {
                return None;
            }
            format!(
                "broker \"{broker}\", which has the host, port and vhost of the inbound's broker \"{}\"",
                inbound.broker
            )
        };
        Some(loop_words(&format!(
            "publishing to \"{}\" through the default exchange of {on},",
            inbound.queue
        )))
    }

    /// The users whose records on a stream of broker `broker` are the
    /// group's: the broker's own user (the one its records are published
    /// with) and `inbound.trusted_users`. Empty when the broker's user is
    /// not known (a certificate login): records cannot be told apart then.
    pub fn stream_writers(&self, broker: &BrokerSpec) -> Vec<String> {
        let Some(own) = broker.user() else {
            return Vec::new();
        };
        let mut writers = vec![own];
        for user in self
            .inbound()
            .map(|i| i.trusted_users.as_slice())
            .unwrap_or_default()
        {
            if !writers.contains(user) {
                writers.push(user.clone());
            }
        }
        writers
    }
}

/// The end of every forwarding-loop refusal, after what would loop.
pub(crate) fn loop_words(what: &str) -> String {
    format!(
        "{what} would route every copy back into the inbound queue (a forwarding loop); name \
         another queue"
    )
}

/// The mark of a [`Settings`] that `compile` made: it has no public
/// constructor.
#[derive(Debug, Clone, Copy)]
pub struct Compiled(());

impl Compiled {
    /// Only the compiler of the configuration makes one.
    pub(in crate::config) fn new() -> Self {
        Self(())
    }
}

/// `[sessions]`, when enabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sessions {
    /// Header naming the session a message belongs to.
    pub id_header: String,
    /// Header marking the last message of a session.
    pub end_header: String,
    /// A session with no message for this long is dead-lettered.
    pub idle_timeout: Duration,
    /// Most messages one session may hold.
    pub max_messages: u32,
    /// Most body bytes one session may hold.
    pub max_bytes: u64,
    /// Most sessions open at once.
    pub max_open: u32,
    /// How long a completed or dead-lettered session stays closed.
    pub closed_ttl: Duration,
}

impl Sessions {
    /// `off`, or `on` with every setting by its configuration key, for the
    /// startup line and `check`.
    pub fn summary(sessions: Option<&Self>) -> String {
        let Some(s) = sessions else {
            return "off".to_owned();
        };
        format!(
            "on (id_header \"{}\", end_header \"{}\", idle_timeout_ms {}, max_open {}, \
             max_messages {}, max_bytes {}, closed_ttl_ms {})",
            s.id_header,
            s.end_header,
            s.idle_timeout.as_millis(),
            s.max_open,
            s.max_messages,
            s.max_bytes,
            s.closed_ttl.as_millis()
        )
    }
}

/// `[ingress.http]`: the HTTP front door.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpIngress {
    /// Where it listens.
    pub listen: SocketAddr,
    /// The largest body accepted.
    pub max_body_bytes: u64,
    /// Requests delivered at once.
    pub max_in_flight: u32,
    /// How long one request may take.
    pub request_timeout: Duration,
    /// How long a request's body may take to arrive.
    pub body_timeout: Duration,
    /// Accepted bearer tokens; empty: anyone who reaches the port.
    pub tokens: Vec<String>,
    /// Request headers copied into the message, lower case.
    pub forward_headers: Vec<String>,
    /// How long an `Idempotency-Key` is remembered.
    pub idempotency_ttl: Duration,
    /// The most keys remembered at once.
    pub idempotency_max_keys: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// How long request headers (and an idle keep-alive) may take.
    pub header_timeout: Duration,
    /// The listener's certificate and key, when it speaks TLS.
    pub tls: Option<ClientIdentity>,
}

impl std::fmt::Debug for HttpIngress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Tokens are secrets: only how many there are is shown.
        f.debug_struct("HttpIngress")
            .field("listen", &self.listen)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_in_flight", &self.max_in_flight)
            .field("request_timeout", &self.request_timeout)
            .field("tokens", &self.tokens.len())
            .field("forward_headers", &self.forward_headers)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl HttpIngress {
    /// One line for the startup summary and `check`.
    pub fn summary(http: Option<&Self>) -> String {
        let Some(h) = http else {
            return "off".to_owned();
        };
        format!(
            "{}://{} (max_in_flight {}, max_body_bytes {}, request_timeout_ms {}, {})",
            if h.tls.is_some() { "https" } else { "http" },
            h.listen,
            h.max_in_flight,
            h.max_body_bytes,
            h.request_timeout.as_millis(),
            if h.tokens.is_empty() {
                "anonymous".to_owned()
            } else {
                format!("{} bearer token(s)", h.tokens.len())
            }
        )
    }
}

/// The inbound queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// Broker name.
    pub broker: String,
    /// Queue name.
    pub queue: String,
    /// `basic.qos` prefetch.
    pub prefetch: u16,
    /// Declare the queue with its dead-letter arguments.
    pub declare: bool,
    /// Declare it with `x-single-active-consumer`.
    pub single_active_consumer: bool,
    /// The queue's type; it must match the queue's type on the broker.
    pub queue_type: QueueType,
    /// A message delivered more often than this is dead-lettered as `poison`.
    pub max_redeliveries: u32,
    /// A message forwarded more often than this (`x-switchyard-hops`) is
    /// dead-lettered as `loop`.
    pub max_hops: u32,
    /// The queue's dead-letter exchange is set by an operator policy, not by
    /// queue arguments: declare it without them and trust the policy.
    pub dead_letter_by_policy: bool,
    /// Users whose messages' `x-switchyard-*` annotations count (by their
    /// broker-validated `user_id`): `inbound.trusted_users` and the inbound
    /// broker's own user (first, when its URI names it).
    pub trusted_users: Vec<String>,
}

#[cfg(test)]
impl Inbound {
    /// An inbound queue with the defaults, for unit tests.
    pub(crate) fn sample(queue: &str, queue_type: QueueType) -> Self {
        Self {
            broker: "main".into(),
            queue: queue.into(),
            prefetch: 100,
            declare: true,
            single_active_consumer: false,
            queue_type,
            max_redeliveries: 10,
            max_hops: 8,
            dead_letter_by_policy: false,
            trusted_users: Vec::new(),
        }
    }
}

/// A broker connection target: one node (`uri`) or a cluster's nodes in
/// order of preference (`uris`), which share vhost and user. Equal when the
/// name, the URIs and the TLS material are.
#[derive(Clone, PartialEq, Eq)]
pub struct BrokerSpec {
    /// Its name in `[brokers]`.
    pub name: String,
    /// Never empty; the first is the preferred node.
    uris: Vec<String>,
    /// What an `amqps://` connection trusts and shows (empty for `amqp://`).
    pub tls: Tls,
}

/// The TLS material of an `amqps://` broker, read from the files its
/// configuration names and checked when the configuration was loaded.
/// Certificate verification is always on; this only adds to what is trusted
/// and what is shown.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// CA certificates (PEM) trusted besides the system's roots (`ca_file`).
    pub ca_pem: Option<String>,
    /// The client certificate and key (`client_cert_file`, `client_key_file`).
    pub client: Option<ClientIdentity>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

/// A client certificate chain and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate chain, the client's own certificate first.
    pub cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl ClientIdentity {
    /// An identity; the key was checked to belong to the certificate.
    pub fn new(cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Self {
        Self { cert_pem, key_pem }
    }

    /// The private key, for the TLS handshake only. Never log it.
    pub fn secret_key_pem(&self) -> &[u8] {
        &self.key_pem
    }
}

impl BrokerSpec {
    /// A broker without TLS material; `uri` was validated by `compile`.
    pub fn new(name: impl Into<String>, uri: impl Into<String>) -> Self {
        Self::cluster(name, vec![uri.into()])
    }

    /// A broker of several nodes, preferred first; `uris` were validated
    /// by `compile` (not empty, one vhost and user).
    pub fn cluster(name: impl Into<String>, uris: Vec<String>) -> Self {
        Self {
            name: name.into(),
            uris,
            tls: Tls::default(),
        }
    }

    /// The same broker with `tls` for its `amqps://` connections.
    pub fn with_tls(self, tls: Tls) -> Self {
        Self { tls, ..self }
    }

    /// The key that names its nodes, for messages: `uri` or `uris`.
    pub fn uri_key(&self) -> &'static str {
        if self.uris.len() > 1 { "uris" } else { "uri" }
    }

    /// How many nodes it has (at least one).
    pub fn nodes(&self) -> usize {
        self.uris.len().max(1)
    }

    /// The preferred node's URI with credentials, for connecting only.
    /// Never log it.
    pub fn secret_uri(&self) -> &str {
        self.secret_uri_of(0)
    }

    /// Node `index`'s URI with credentials (the preferred one's past the
    /// end), for connecting only. Never log it.
    pub fn secret_uri_of(&self, index: usize) -> &str {
        self.uris
            .get(index)
            .or(self.uris.first())
            .map_or("", String::as_str)
    }

    /// The user its URIs name (all name the same one), which the broker
    /// authenticates; `None` when another mechanism logs in (a client certificate
    /// with `auth_mechanism=external` names the user itself).
    pub fn user(&self) -> Option<String> {
        let uri = lapin::uri::AMQPUri::from_str(self.secret_uri()).ok()?;
        // Only PLAIN and AMQPLAIN log in as the user the URI names.
        let named = uri
            .query
            .auth_mechanism
            .is_none_or(|m| matches!(m.name(), "PLAIN" | "AMQPLAIN"));
        named.then_some(uri.authority.userinfo.username)
    }

    /// The vhost its URIs name (all name the same one; `/` by default).
    pub fn vhost(&self) -> String {
        lapin::uri::AMQPUri::from_str(self.secret_uri())
            .map_or_else(|_| "/".to_owned(), |u| u.vhost)
    }

    /// Every node's URI with its password masked, in order, safe for logs.
    pub fn redacted_uri(&self) -> String {
        let uris: Vec<String> = self.uris.iter().map(|u| redact_uri(u)).collect();
        uris.join(", ")
    }

    /// Node `index`'s URI with its password masked.
    pub fn redacted_uri_of(&self, index: usize) -> String {
        redact_uri(self.secret_uri_of(index))
    }

    /// The preferred node as `host:port` (the scheme's default port when
    /// the URI names none), for logs.
    pub fn node(&self) -> String {
        self.node_of(0)
    }

    /// Node `index` as `host:port`, for logs and metric labels.
    pub fn node_of(&self, index: usize) -> String {
        node_of(self.secret_uri_of(index))
    }

    /// Whether some node of each reaches the same vhost.
    pub fn same_vhost_as(&self, other: &BrokerSpec) -> bool {
        self.uris
            .iter()
            .any(|a| other.uris.iter().any(|b| same_vhost(a, b)))
    }
}

impl std::fmt::Debug for BrokerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerSpec")
            .field("name", &self.name)
            .field("uri", &self.redacted_uri())
            .field("tls", &self.tls)
            .finish()
    }
}

#[cfg(test)]
mod tests;
