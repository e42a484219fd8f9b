//! Counting copies: how many times each message, or each id, occurs.

use std::collections::BTreeMap;

use super::{Message, TestBroker};

/// What [`tally`] counts an item under.
pub trait Tallied {
    /// The key: a message's body, an id itself.
    fn key(self) -> String;
}

impl Tallied for &Message {
    fn key(self) -> String {
        self.body_str()
    }
}

impl Tallied for String {
    fn key(self) -> String {
        self
    }
}

/// How many times each item occurs: messages by body, ids as themselves.
pub fn tally<T: Tallied>(items: impl IntoIterator<Item = T>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for item in items {
        *counts.entry(item.key()).or_insert(0) += 1;
    }
    counts
}

/// Drains every queue of `queues` and tallies their messages together, by body.
pub async fn tally_queues(broker: &TestBroker, queues: &[String]) -> BTreeMap<String, usize> {
    let mut messages = Vec::new();
    for queue in queues {
        messages.extend(broker.get_all(queue).await);
    }
    tally(&messages)
}
