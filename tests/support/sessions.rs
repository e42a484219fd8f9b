//! Session messages for the sessions tests: building them with a session id
//! and a sequence number, reading them back grouped by session, and waiting
//! until an inbound queue has settled everything.

use super::config::{Branch, Endpoint, Filter, Forwarder};
use super::{Message, TestBroker, ready_unacked, tally, wait_until};
use lapin::BasicProperties;
use lapin::types::AMQPValue;
use std::collections::BTreeMap;
use std::time::Duration;

/// The default session headers, and the per-message sequence number the
/// tests set so that order can be checked on every queue.
pub const ID: &str = "session-id";
pub const END: &str = "session-end";
pub const SEQ: &str = "seq";
pub const REPLAY: &str = "x-switchyard-replay";

/// A `[sessions]` section that turns sessions on, with `extra` keys as
/// TOML lines, to append to a configuration's text. (A configuration built
/// with [`Forwarder`] takes them typed: [`Forwarder::sessions`].)
pub fn sessions_toml(extra: &str) -> String {
    format!("\n[sessions]\nenabled = true\n{extra}\n")
}

/// The sessions tests' forwarder without its `[sessions]` section: one
/// branch "service" in republish mode to endpoint `primary` (queue
/// `{p}.primary`), then the backup list `["backup"]`, whose queue is
/// `{p}.backup`; with `backup_exists = false` it is `{p}.missing`, never
/// declared, so the list is exhausted once the primary fails.
pub fn session_branch(p: &str, backup_exists: bool) -> Forwarder {
    let backup = if backup_exists {
        Endpoint::queue("backup", &format!("{p}.backup"))
    } else {
        Endpoint::queue("backup", &format!("{p}.missing")).undeclared()
    };
    Forwarder::new(p)
        .mode("republish")
        .endpoint(Endpoint::queue("primary", &format!("{p}.primary")))
        .endpoint(backup)
        .backup_list("backups", &["backup"])
        .filter("all", Filter::match_all())
        .branch(Branch::new("service", "all", "primary").backups("backups"))
}

/// [`session_branch`] as TOML text.
pub fn session_branch_toml(p: &str, backup_exists: bool) -> String {
    session_branch(p, backup_exists).toml()
}

/// One message to publish: body and properties.
pub type Outgoing = (Vec<u8>, BasicProperties);

/// Message `seq` of session `id` (the last of it when `end`): message id
/// `id/seq`, body `id:seq`.
pub fn in_session(id: &str, seq: u32, end: bool) -> Outgoing {
    let mut headers = lapin::types::FieldTable::default();
    headers.insert(ID.into(), AMQPValue::LongString(id.into()));
    headers.insert(SEQ.into(), AMQPValue::LongInt(seq as i32));
    if end {
        headers.insert(END.into(), AMQPValue::Boolean(true));
    }
    let props = BasicProperties::default()
        .with_message_id(format!("{id}/{seq}").into())
        .with_headers(headers);
    (format!("{id}:{seq}").into_bytes(), props)
}

/// Publishes `messages` in order, each confirmed.
pub async fn publish_to(broker: &TestBroker, exchange: &str, key: &str, messages: &[Outgoing]) {
    let batch = messages.iter().map(|(b, p)| (b.as_slice(), p.clone()));
    broker.publish_each(exchange, key, batch).await;
}

/// A header's text form: strings as they are, integers in decimal.
pub fn text_form(value: &AMQPValue) -> Option<String> {
    Some(match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        _ => return None,
    })
}

/// The session a message belongs to (`None`: independent).
pub fn session_of(m: &Message) -> Option<String> {
    m.header(ID).and_then(text_form).filter(|id| !id.is_empty())
}

pub fn seq_of(m: &Message) -> u32 {
    m.header(SEQ)
        .and_then(text_form)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no {SEQ} header on {:?}", m.properties.message_id()))
}

/// Whether a copy is marked as a replay; the mark, when present, must be
/// AMQP `true` (copies that are not replays carry none).
pub fn is_replay(m: &Message) -> bool {
    match m.header(REPLAY) {
        None => false,
        Some(AMQPValue::Boolean(true)) => true,
        Some(other) => panic!(
            "{REPLAY} on {:?} must be AMQP true when present, got {other:?}",
            m.properties.message_id()
        ),
    }
}

pub fn message_id(m: &Message) -> String {
    m.properties
        .message_id()
        .as_ref()
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// The session messages of `queue`, grouped by session in queue order.
pub fn by_session(queue: &[Message]) -> BTreeMap<String, Vec<&Message>> {
    let mut sessions: BTreeMap<String, Vec<&Message>> = BTreeMap::new();
    for m in queue {
        if let Some(id) = session_of(m) {
            sessions.entry(id).or_default().push(m);
        }
    }
    sessions
}

/// How often each independent message (by `message_id`) occurs in `queue`.
pub fn independents(queue: &[Message]) -> BTreeMap<String, usize> {
    tally(
        queue
            .iter()
            .filter(|m| session_of(m).is_none())
            .map(message_id),
    )
}

pub fn seqs(messages: &[&Message]) -> Vec<u32> {
    messages.iter().map(|m| seq_of(m)).collect()
}

pub fn whole(n: u32) -> Vec<u32> {
    (0..n).collect()
}

/// Waits until `queue` holds no ready and no unacked message: every message
/// taken from it is settled (acked or dead-lettered).
pub async fn wait_settled(queue: &str, timeout: Duration) {
    wait_until(
        &format!("{queue} has no ready and no unacked message"),
        timeout,
        || async move { ready_unacked(queue).await == Some((0, 0)) },
    )
    .await;
}
