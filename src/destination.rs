//! Where copies and dead letters go: an endpoint (a broker, an exchange
//! and a routing key, with what to declare and how long to wait), the queue
//! types the forwarder declares, and the dead-letter settings. Plain values,
//! shared by the configuration that compiles them, the routing table that
//! names them and the broker code that publishes to them.

use std::time::Duration;

/// The type of a queue the forwarder declares (`x-queue-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    /// A classic queue (the broker's default).
    #[default]
    Classic,
    /// A replicated quorum queue: always durable, never exclusive or auto-delete.
    Quorum,
}

impl QueueType {
    /// The configuration spelling, also the `x-queue-type` argument value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Quorum => "quorum",
        }
    }
}

impl std::fmt::Display for QueueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a message is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterMode {
    /// `basic.nack(requeue=false)`; the broker routes it through the queue's DLX.
    Nack,
    /// Publish an annotated copy with a confirm, then ack.
    Republish,
}

impl std::fmt::Display for DeadLetterMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Nack => "nack",
            Self::Republish => "republish",
        })
    }
}

/// The dead-letter destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Mode.
    pub mode: DeadLetterMode,
    /// Dead-letter exchange.
    pub exchange: String,
    /// Dead-letter routing key.
    pub routing_key: String,
    /// Dead-letter queue to declare and bind, if any.
    pub queue: Option<String>,
    /// The dead-letter queue's type.
    pub queue_type: QueueType,
}

/// A publish destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Its name in `[endpoints]`.
    pub name: String,
    /// Broker name.
    pub broker: String,
    /// Exchange (`""` is the default exchange).
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// Durable queue to declare at startup.
    pub declare_queue: Option<String>,
    /// The type `declare_queue` is declared with.
    pub declare_queue_type: QueueType,
    /// How long to wait for the confirm.
    pub confirm_timeout: Duration,
    /// Extra attempts here before the next endpoint.
    pub retries: u32,
    /// Headers set on every copy sent here.
    pub headers: Vec<(String, String)>,
    /// While unhealthy, how often the endpoint is probed in the background.
    pub probe_interval: Duration,
}

impl Endpoint {
    /// An endpoint the configuration does not define (a service's
    /// registration, the dead-letter publisher): `exchange` and
    /// `routing_key` on `broker`, with the defaults of an `[endpoints]`
    /// entry and no queue to declare.
    pub fn plain(name: &str, broker: &str, exchange: &str, routing_key: &str) -> Self {
        Self {
            name: name.to_owned(),
            broker: broker.to_owned(),
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            declare_queue: None,
            declare_queue_type: QueueType::default(),
            confirm_timeout: Duration::from_secs(5),
            retries: 0,
            headers: Vec::new(),
            probe_interval: Duration::from_secs(1),
        }
    }
}
