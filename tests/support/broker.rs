//! The real-broker test client: addresses and unique names, `TestBroker`
//! (one named connection and a confirm channel), the `Message` it reads
//! back, and `FieldTable` helpers.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};

use super::POLL_INTERVAL;

/// Environment variable overriding the broker URL used by the tests.
pub const AMQP_URL_ENV: &str = "SWITCHYARD_TEST_AMQP_URL";
/// Broker URL used when `SWITCHYARD_TEST_AMQP_URL` is not set.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The broker URL: `$SWITCHYARD_TEST_AMQP_URL` or `amqp://guest:guest@127.0.0.1:5672/%2f`.
pub fn amqp_url() -> String {
    std::env::var(AMQP_URL_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_AMQP_URL.to_string())
}

/// The broker's TCP address as given by `amqp_url()` (127.0.0.1:5672 by default).
pub fn amqp_addr() -> SocketAddr {
    let url = amqp_url();
    let uri: lapin::uri::AMQPUri = url
        .parse()
        .unwrap_or_else(|e| panic!("cannot parse AMQP URL {url:?}: {e}"));
    let host = uri
        .authority
        .host
        .trim_start_matches('[')
        .trim_end_matches(']');
    let addrs: Vec<SocketAddr> = (host, uri.authority.port)
        .to_socket_addrs()
        .unwrap_or_else(|e| panic!("cannot resolve {host}:{}: {e}", uri.authority.port))
        .collect();
    // Prefer IPv4: "localhost" may list ::1 first while the broker listens on 127.0.0.1 only.
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .unwrap_or_else(|| panic!("{host}:{} resolves to no address", uri.authority.port))
}

/// The vhost named by `amqp_url()` (`/` by default); used for `rabbitmqctl -p`.
pub fn amqp_vhost() -> String {
    let url = amqp_url();
    let uri: lapin::uri::AMQPUri = url
        .parse()
        .unwrap_or_else(|e| panic!("cannot parse AMQP URL {url:?}: {e}"));
    uri.vhost
}

/// A fresh `sy-<test>-<8 hex>` prefix, safe in queue, exchange and connection names.
pub fn unique_prefix(test: &str) -> String {
    let mut clean: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    if clean.is_empty() {
        clean.push('t');
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("sy-{clean}-{}", &id[..8])
}

/// A message taken from a queue by `TestBroker::get_all`.
#[derive(Debug, Clone)]
pub struct Message {
    /// The payload.
    pub body: Vec<u8>,
    /// The AMQP properties, headers included.
    pub properties: BasicProperties,
    /// The routing key it was published with.
    pub routing_key: String,
    /// The exchange it was published to (`""` for the default exchange).
    pub exchange: String,
    /// Whether the broker flagged it as redelivered.
    pub redelivered: bool,
}

impl Message {
    /// The body as UTF-8 (lossy).
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The raw value of header `key`, if present.
    pub fn header(&self, key: &str) -> Option<&AMQPValue> {
        self.properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(key))
    }

    /// Header `key` as a string when it is a (long or short) string value.
    pub fn header_str(&self, key: &str) -> Option<String> {
        match self.header(key)? {
            AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
            AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
            _ => None,
        }
    }
}

/// Builds a `FieldTable` from `(key, value)` pairs, e.g. for queue arguments or headers.
pub fn field_table<'a>(entries: impl IntoIterator<Item = (&'a str, AMQPValue)>) -> FieldTable {
    let mut table = FieldTable::default();
    for (k, v) in entries {
        table.insert(k.into(), v);
    }
    table
}

/// The strings of an AMQP array header (`x-switchyard-failed`...); panics
/// when it is not an array of long strings.
pub fn array_names(value: Option<&AMQPValue>) -> Vec<String> {
    match value {
        Some(AMQPValue::FieldArray(items)) => items
            .as_slice()
            .iter()
            .map(|v| match v {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                other => panic!("not a string: {other:?}"),
            })
            .collect(),
        other => panic!("not an array: {other:?}"),
    }
}

/// A long-string `AMQPValue` (the usual type for string headers and arguments).
pub fn amqp_str(s: &str) -> AMQPValue {
    AMQPValue::LongString(s.into())
}

/// A test client: one named connection plus one confirm-mode channel.
pub struct TestBroker {
    conn: Connection,
    channel: Channel,
    name: String,
    /// Reused by polls (passive declares): a channel per poll would run
    /// through the connection's channel ids in long waits.
    probe: tokio::sync::Mutex<Option<Channel>>,
}

impl TestBroker {
    /// Connects to `amqp_url()`; the connection is named `<prefix>-test`.
    pub async fn connect(prefix: &str) -> TestBroker {
        Self::connect_to(&amqp_url(), &format!("{prefix}-test")).await
    }

    /// Connects to `url` with connection name `connection_name` and opens a confirm channel.
    pub async fn connect_to(url: &str, connection_name: &str) -> TestBroker {
        let conn = Connection::connect(
            url,
            ConnectionProperties::default().with_connection_name(connection_name.into()),
        )
        .await
        .unwrap_or_else(|e| panic!("connect {connection_name} to {url}: {e}"));
        let channel = conn
            .create_channel()
            .await
            .unwrap_or_else(|e| panic!("create channel on {connection_name}: {e}"));
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap_or_else(|e| panic!("confirm_select on {connection_name}: {e}"));
        TestBroker {
            conn,
            channel,
            name: connection_name.to_string(),
            probe: tokio::sync::Mutex::new(None),
        }
    }

    /// The underlying lapin connection.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The confirm-mode channel used for declares and publishes.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// The client-provided connection name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens a new plain (non-confirm) channel on the connection.
    pub async fn fresh_channel(&self) -> Channel {
        self.conn
            .create_channel()
            .await
            .unwrap_or_else(|e| panic!("create channel on {}: {e}", self.name))
    }

    /// Declares a durable queue with no arguments.
    pub async fn declare_queue(&self, name: &str) {
        self.declare_queue_with(name, FieldTable::default()).await
    }

    /// Declares a durable queue with `args` (e.g. `x-dead-letter-exchange`).
    pub async fn declare_queue_with(&self, name: &str, args: FieldTable) {
        self.channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                args,
            )
            .await
            .unwrap_or_else(|e| panic!("declare queue {name}: {e}"));
    }

    /// Declares durable quorum queue `name` (`x-queue-type = quorum`).
    pub async fn declare_quorum_queue(&self, name: &str) {
        let args = field_table([("x-queue-type", amqp_str("quorum"))]);
        self.declare_queue_with(name, args).await
    }

    /// Declares a durable exchange of `kind`.
    pub async fn declare_exchange(&self, name: &str, kind: ExchangeKind) {
        self.channel
            .exchange_declare(
                name.into(),
                kind,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("declare exchange {name}: {e}"));
    }

    /// Binds `queue` to `exchange` with routing key `key`.
    pub async fn bind(&self, queue: &str, exchange: &str, key: &str) {
        self.channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("bind {queue} to {exchange} with {key:?}: {e}"));
    }

    /// Publishes (mandatory) and returns the broker's confirmation, or the lapin error.
    pub async fn try_publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> lapin::Result<Confirmation> {
        self.channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                props,
            )
            .await?
            .await
    }

    /// Publishes (mandatory), awaits the confirm and returns it; panics on error.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Confirmation {
        self.try_publish(exchange, routing_key, body, props)
            .await
            .unwrap_or_else(|e| panic!("publish to {exchange:?}/{routing_key:?}: {e}"))
    }

    /// Pipelines one mandatory publish per body, then awaits all confirms (panics unless all acked and routed); returns the count.
    pub async fn publish_many<I, B>(
        &self,
        exchange: &str,
        routing_key: &str,
        bodies: I,
        props: BasicProperties,
    ) -> usize
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        let messages = bodies.into_iter().map(|body| (body, props.clone()));
        self.publish_each(exchange, routing_key, messages).await
    }

    /// Pipelines one mandatory publish per `(body, properties)`, then awaits
    /// all confirms (panics unless all acked and routed); returns the count.
    pub async fn publish_each<I, B>(&self, exchange: &str, routing_key: &str, messages: I) -> usize
    where
        I: IntoIterator<Item = (B, BasicProperties)>,
        B: AsRef<[u8]>,
    {
        let mut pending = Vec::new();
        for (body, props) in messages {
            let confirm = self
                .channel
                .basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    body.as_ref(),
                    props,
                )
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "publish #{} to {exchange:?}/{routing_key:?}: {e}",
                        pending.len()
                    )
                });
            pending.push(confirm);
        }
        let count = pending.len();
        for (i, confirm) in pending.into_iter().enumerate() {
            match confirm.await {
                Ok(Confirmation::Ack(None)) => {}
                Ok(Confirmation::Ack(Some(ret))) => {
                    panic!("publish #{i} to {exchange:?}/{routing_key:?} was returned: {ret:?}")
                }
                Ok(other) => panic!("publish #{i} to {exchange:?}/{routing_key:?}: {other:?}"),
                Err(e) => panic!("confirm #{i} to {exchange:?}/{routing_key:?}: {e}"),
            }
        }
        count
    }

    /// [`Self::publish_each`] with at most `window` confirms outstanding:
    /// fills a queue with a backlog too large to hold every pending confirm
    /// (or every body) at once. Panics unless all are acked and routed;
    /// returns the count.
    pub async fn publish_windowed<I, B>(
        &self,
        exchange: &str,
        routing_key: &str,
        messages: I,
        window: usize,
    ) -> usize
    where
        I: IntoIterator<Item = (B, BasicProperties)>,
        B: AsRef<[u8]>,
    {
        let check = |confirm: lapin::Result<Confirmation>| match confirm {
            Ok(Confirmation::Ack(None)) => {}
            Ok(Confirmation::Ack(Some(ret))) => {
                panic!("publish to {exchange:?}/{routing_key:?} was returned: {ret:?}")
            }
            Ok(other) => panic!("publish to {exchange:?}/{routing_key:?}: {other:?}"),
            Err(e) => panic!("confirm of a publish to {exchange:?}/{routing_key:?}: {e}"),
        };
        let mut pending = FuturesUnordered::new();
        let mut count = 0;
        for (body, props) in messages {
            let confirm = self
                .channel
                .basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    body.as_ref(),
                    props,
                )
                .await
                .unwrap_or_else(|e| {
                    panic!("publish #{count} to {exchange:?}/{routing_key:?}: {e}")
                });
            pending.push(confirm);
            count += 1;
            while pending.len() >= window.max(1) {
                check(pending.next().await.expect("a confirm is pending"));
            }
        }
        while let Some(confirm) = pending.next().await {
            check(confirm);
        }
        count
    }

    /// Passive declare of `name` on the probe channel: its message and
    /// consumer counts, `None` if the queue is missing.
    pub async fn probe_queue(&self, name: &str) -> Option<lapin::Queue> {
        let mut probe = self.probe.lock().await;
        let ch = match probe.as_ref().filter(|c| c.status().connected()) {
            Some(ch) => ch.clone(),
            None => {
                let ch = self.fresh_channel().await;
                *probe = Some(ch.clone());
                ch
            }
        };
        let res = ch
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        match res {
            Ok(queue) => Some(queue),
            // A 404 closed the probe channel; the next poll opens another.
            Err(e) if is_not_found(&e) => {
                *probe = None;
                None
            }
            Err(e) => panic!("passive declare of queue {name}: {e}"),
        }
    }

    /// Ready messages in `name`, `None` if the queue is missing.
    pub async fn try_queue_len(&self, name: &str) -> Option<u32> {
        self.probe_queue(name).await.map(|q| q.message_count())
    }

    /// Message count of `name`; 0 if the queue does not exist.
    pub async fn queue_len(&self, name: &str) -> u32 {
        self.try_queue_len(name).await.unwrap_or(0)
    }

    /// Whether queue `name` exists.
    pub async fn queue_exists(&self, name: &str) -> bool {
        self.try_queue_len(name).await.is_some()
    }

    /// Whether exchange `name` exists (passive declare on a throwaway channel).
    pub async fn exchange_exists(&self, name: &str) -> bool {
        let ch = self.fresh_channel().await;
        let res = ch
            .exchange_declare(
                name.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        match res {
            Ok(()) => {
                let _ = ch.close(200, "OK".into()).await;
                true
            }
            Err(e) if is_not_found(&e) => false,
            Err(e) => panic!("passive declare of exchange {name}: {e}"),
        }
    }

    /// Drains queue `name` with basic_get + ack until empty and returns the messages in order.
    pub async fn get_all(&self, name: &str) -> Vec<Message> {
        let ch = self.fresh_channel().await;
        let mut out = Vec::new();
        loop {
            let got = ch
                .basic_get(name.into(), BasicGetOptions { no_ack: false })
                .await
                .unwrap_or_else(|e| panic!("basic_get from {name}: {e}"));
            let Some(msg) = got else { break };
            msg.acker
                .ack(BasicAckOptions::default())
                .await
                .unwrap_or_else(|e| panic!("ack message from {name}: {e}"));
            let delivery = msg.delivery;
            out.push(Message {
                body: delivery.data,
                properties: delivery.properties,
                routing_key: delivery.routing_key.as_str().to_string(),
                exchange: delivery.exchange.as_str().to_string(),
                redelivered: delivery.redelivered,
            });
        }
        let _ = ch.close(200, "OK".into()).await;
        out
    }

    /// Polls `queue_len(name)` until it equals `n`; panics with the last count after `timeout`.
    pub async fn await_count(&self, name: &str, n: u32, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let len = self.try_queue_len(name).await;
            if len == Some(n) {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                match len {
                    Some(len) => panic!(
                        "timed out after {timeout:?} waiting for queue {name} to hold {n} \
                         messages: it holds {len}"
                    ),
                    None => panic!(
                        "timed out after {timeout:?} waiting for queue {name} to hold {n} \
                         messages: the queue does not exist"
                    ),
                }
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Deletes queue `name` (on a fresh channel) and returns how many messages it held.
    pub async fn delete_queue(&self, name: &str) -> u32 {
        let ch = self.fresh_channel().await;
        let n = ch
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await
            .unwrap_or_else(|e| panic!("delete queue {name}: {e}"));
        let _ = ch.close(200, "OK".into()).await;
        n
    }

    /// Deletes exchange `name` (on a fresh channel).
    pub async fn delete_exchange(&self, name: &str) {
        let ch = self.fresh_channel().await;
        ch.exchange_delete(name.into(), ExchangeDeleteOptions::default())
            .await
            .unwrap_or_else(|e| panic!("delete exchange {name}: {e}"));
        let _ = ch.close(200, "OK".into()).await;
    }

    /// Deletes the given queues and exchanges, each on a fresh channel, ignoring failures.
    pub async fn cleanup(&self, queues: &[&str], exchanges: &[&str]) {
        for q in queues {
            if let Ok(ch) = self.conn.create_channel().await
                && ch
                    .queue_delete((*q).into(), QueueDeleteOptions::default())
                    .await
                    .is_ok()
            {
                let _ = ch.close(200, "OK".into()).await;
            }
        }
        for x in exchanges {
            if let Ok(ch) = self.conn.create_channel().await
                && ch
                    .exchange_delete((*x).into(), ExchangeDeleteOptions::default())
                    .await
                    .is_ok()
            {
                let _ = ch.close(200, "OK".into()).await;
            }
        }
    }

    /// Closes the channel and the connection (errors ignored: it may already be gone).
    pub async fn close(self) {
        let _ = self.channel.close(200, "OK".into()).await;
        let _ = self.conn.close(200, "OK".into()).await;
    }
}

/// Whether a lapin error is the broker's 404 NOT_FOUND.
pub fn is_not_found(err: &lapin::Error) -> bool {
    matches!(err.kind(), lapin::ErrorKind::ProtocolError(e) if e.get_id() == 404)
}
