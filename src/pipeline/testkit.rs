//! For unit tests of the pipeline without a broker: a scripted stand-in
//! for the endpoints ([`Script`], a [`Publish`]) that answers each publish
//! as a test says and records it, configurations from TOML, and envelopes.
//! Tests run under `tokio::time::pause()`, so timeouts and outage waits
//! take no real time.

use crate::amqp::{AmqpValue, FieldTable, Properties, ShortString};
use crate::broker::{Attempt, ConnectError, ConnectFailure, Health, Mode, Publish, PublishFailure};
use crate::config::{Settings, load_str};
use crate::destination::Endpoint;
use crate::envelope::Envelope;
use crate::wire;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// One publish the engine made.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub endpoint: String,
    pub message_id: String,
    pub replay: bool,
    pub mode: Mode,
    /// The headers the caller added.
    pub extra: Vec<(ShortString, AmqpValue)>,
    /// The endpoint's health when it was called.
    pub health: Health,
}

impl Call {
    /// The added header `name`, if any.
    pub fn header(&self, name: &str) -> Option<&AmqpValue> {
        self.extra
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, v)| v)
    }
}

impl Call {
    /// `endpoint:message_id`, with `(replay)` or `(alone)` when so.
    pub fn short(&self) -> String {
        let mut text = format!("{}:{}", self.endpoint, self.message_id);
        if self.replay {
            text.push_str("(replay)");
        }
        if self.mode == Mode::Alone {
            text.push_str("(alone)");
        }
        text
    }
}

/// How the script answers one publish.
pub enum Reply {
    /// Confirmed at once.
    Ack,
    /// Failed at once.
    Fail(PublishFailure),
    /// Answered after a while.
    After(Duration, Box<Reply>),
}

type Responder = dyn Fn(&Call, usize) -> Reply + Send + Sync;

/// Endpoints that answer as a closure says (given the call and how many
/// earlier calls went to the same endpoint), with health a test sets.
pub struct Script {
    respond: Box<Responder>,
    calls: Mutex<Vec<Call>>,
    health: Mutex<HashMap<String, Health>>,
    changes: watch::Sender<u64>,
}

impl Script {
    pub fn new(respond: impl Fn(&Call, usize) -> Reply + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            respond: Box::new(respond),
            calls: Mutex::default(),
            health: Mutex::default(),
            changes: watch::Sender::new(0),
        })
    }

    /// Every endpoint confirms everything.
    pub fn acking() -> Arc<Self> {
        Self::new(|_, _| Reply::Ack)
    }

    /// Every publish so far, whole.
    pub fn all_calls(&self) -> Vec<Call> {
        self.lock_calls().clone()
    }

    /// Every publish so far, as [`Call::short`] writes them.
    pub fn calls(&self) -> Vec<String> {
        self.lock_calls().iter().map(Call::short).collect()
    }

    /// Sets an endpoint's health, as its publisher would.
    pub fn set_health(&self, endpoint: &str, health: Health) {
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(endpoint.to_owned(), health);
        self.changes.send_modify(|n| *n += 1);
    }

    fn lock_calls(&self) -> std::sync::MutexGuard<'_, Vec<Call>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Publish for Script {
    fn publish(
        &self,
        endpoint: &Endpoint,
        envelope: &Arc<Envelope>,
        extra: Vec<(ShortString, AmqpValue)>,
        mode: Mode,
    ) -> Attempt {
        let health = self.health(endpoint);
        let call = Call {
            health,
            endpoint: endpoint.name.clone(),
            message_id: envelope.message_id().into_owned(),
            replay: extra.iter().any(|(name, _)| name.as_str() == wire::REPLAY),
            mode,
            extra,
        };
        let reply = {
            let mut calls = self.lock_calls();
            let earlier = calls.iter().filter(|c| c.endpoint == call.endpoint).count();
            let reply = (self.respond)(&call, earlier);
            calls.push(call);
            reply
        };
        Box::pin(answer(reply))
    }

    fn health(&self, endpoint: &Endpoint) -> Health {
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&endpoint.name)
            .copied()
            .unwrap_or(Health::Up)
    }

    fn health_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

async fn answer(reply: Reply) -> Result<(), PublishFailure> {
    let mut reply = reply;
    loop {
        match reply {
            Reply::Ack => return Ok(()),
            Reply::Fail(failure) => return Err(failure),
            Reply::After(delay, then) => {
                tokio::time::sleep(delay).await;
                reply = *then;
            }
        }
    }
}

/// A broker that cannot be reached, as a publish reports it.
pub fn unreachable() -> PublishFailure {
    PublishFailure::Unreachable(ConnectError::Connect {
        uri: "amqp://guest:***@127.0.0.1:1/%2f".to_owned(),
        failure: Arc::new(ConnectFailure::Timeout(Duration::from_secs(10))),
    })
}

/// A channel closed in a way one message may have caused.
pub fn suspect() -> PublishFailure {
    PublishFailure::Broker(crate::broker::BrokerError {
        code: Some(crate::broker::code::PRECONDITION_FAILED),
        level: crate::broker::Level::Channel,
        text: "PRECONDITION_FAILED".to_owned(),
    })
}

/// Settings in `nack` mode with one branch `branch` over endpoints `names`
/// (the first the endpoint, the rest its backup list; `"a: retries = 2"`
/// adds a key to endpoint `a`) and `extra` TOML after the entry.
pub fn settings(endpoints: &[&str], branch: &str, extra: &str) -> Settings {
    load(&settings_toml(endpoints, branch, extra))
}

/// The TOML of [`settings`].
pub fn settings_toml(endpoints: &[&str], branch: &str, extra: &str) -> String {
    let parsed: Vec<(&str, &str)> = endpoints
        .iter()
        .map(|e| e.split_once(':').map_or((*e, ""), |(n, k)| (n, k.trim())))
        .collect();
    let names: Vec<&str> = parsed.iter().map(|(n, _)| *n).collect();
    let mut toml = String::from(
        "[inbound]\nbroker = \"main\"\nqueue = \"in\"\nprefetch = 100\n\n\
         [dead_letter]\nmode = \"nack\"\nexchange = \"dlx\"\nrouting_key = \"dlq\"\n\n\
         [brokers.main]\nuri = \"amqp://guest:guest@127.0.0.1:1/%2f\"\n\n\
         [filters.all]\ntype = \"match_all\"\n",
    );
    for (name, keys) in &parsed {
        toml.push_str(&format!(
            "\n[endpoints.{name}]\nbroker = \"main\"\nrouting_key = \"{name}\"\n{keys}\n"
        ));
    }
    let backups: Vec<String> = names[1..].iter().map(|n| format!("\"{n}\"")).collect();
    if !backups.is_empty() {
        toml.push_str(&format!(
            "\n[backup_lists]\nbackups = [{}]\n",
            backups.join(", ")
        ));
    }
    toml.push_str(&format!(
        "\n[[filter_table]]\nname = \"{branch}\"\n\
         filter = \"all\"\nendpoint = \"{}\"\n{}{extra}\n",
        names[0],
        if backups.is_empty() {
            ""
        } else {
            "backup_list = \"backups\"\n"
        },
    ));
    toml
}

/// Settings from `toml`, which must be valid.
pub fn load(toml: &str) -> Settings {
    match load_str(toml, "unit.toml") {
        Ok(settings) => settings,
        Err(e) => panic!("{e}\n{toml}"),
    }
}

/// A message with `message_id` and `headers`.
pub fn envelope(message_id: &str, headers: &[(&str, AmqpValue)]) -> Arc<Envelope> {
    let mut table = FieldTable::default();
    for (name, value) in headers {
        table.insert((*name).into(), value.clone());
    }
    let trace = crate::wire::Trace::from_headers(Some(&table));
    Arc::new(Envelope {
        delivery_tag: 1,
        exchange: String::new(),
        routing_key: "in".to_owned(),
        redelivered: false,
        properties: Properties::default()
            .with_message_id(message_id.into())
            .with_headers(table),
        body: message_id.as_bytes().to_vec(),
        annotations: crate::wire::Annotations {
            trace,
            ..Default::default()
        },
    })
}
