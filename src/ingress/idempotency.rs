//! What the ingress remembers of each `Idempotency-Key`: a digest of the
//! request (routing key and body), the branches already confirmed, and,
//! once every branch is, the answer given. A retry sends only the branches
//! not yet confirmed; a retry of a complete request is answered from the
//! record; the same key with another request is a conflict; a retry while
//! the first try still runs waits for it.
//!
//! Memory is bounded: a key is forgotten `idempotency_ttl_ms` after its
//! last use, and past `idempotency_max_keys` the oldest is forgotten first.
//! A record keeps its key once (shared by the map and the order of use)
//! and no copy of the answer, which is made again from the key and the
//! branches; tests/http_key_memory.rs measures what a key costs. Records
//! live in this process only.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The remembered keys. Cheap to clone.
#[derive(Clone)]
pub struct Records {
    inner: Arc<Mutex<Inner>>,
    ttl: Duration,
    max: usize,
}

#[derive(Default)]
struct Inner {
    by_key: HashMap<Arc<str>, Record>,
    /// Keys by last use, oldest first; an entry whose time is not its
    /// record's any more is stale and skipped.
    order: VecDeque<(Instant, Arc<str>)>,
}

struct Record {
    digest: uuid::Uuid,
    delivered: Vec<String>,
    /// Whether a try confirmed every branch.
    complete: bool,
    /// Set while a try runs; set to true when it ends. A waiter subscribes
    /// under the lock, so it cannot miss the end.
    running: Option<watch::Sender<bool>>,
    used: Instant,
}

/// What a request with a key may do.
pub enum Begin {
    /// Deliver, skipping the branches named; finish with the ticket.
    Deliver(Ticket, Vec<String>),
    /// Every branch was confirmed already: these, in the order they were.
    Complete(Vec<String>),
    /// The key was used for another request.
    Conflict,
    /// A try with this key runs: wait until this turns true (or its
    /// sender is gone), then begin again.
    Wait(watch::Receiver<bool>),
}

/// The right to finish one try of a key. Dropped without
/// [`Ticket::finish`], it ends the try as if nothing was confirmed.
pub struct Ticket {
    records: Records,
    key: Arc<str>,
    done: bool,
}

impl Records {
    /// Records kept `ttl` after last use, at most `max` of them.
    pub fn new(ttl: Duration, max: usize) -> Self {
        Self {
            inner: Arc::default(),
            ttl,
            max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a try of `key` for a request whose digest is `digest`.
    pub fn begin(&self, key: &str, digest: uuid::Uuid) -> Begin {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.forget_old(now, self.ttl, self.max);
        if let Some(record) = inner.by_key.get_mut(key) {
            if record.digest != digest {
                return Begin::Conflict;
            }
            if let Some(running) = &record.running {
                return Begin::Wait(running.subscribe());
            }
            if record.complete {
                return Begin::Complete(record.delivered.clone());
            }
            record.running = Some(watch::Sender::new(false));
            record.used = now;
            let skip = record.delivered.clone();
            let key = inner.shared(key);
            inner.order.push_back((now, key.clone()));
            return Begin::Deliver(self.ticket(key), skip);
        }
        let key: Arc<str> = key.into();
        inner.by_key.insert(
            key.clone(),
            Record {
                digest,
                delivered: Vec::new(),
                complete: false,
                running: Some(watch::Sender::new(false)),
                used: now,
            },
        );
        inner.order.push_back((now, key.clone()));
        Begin::Deliver(self.ticket(key), Vec::new())
    }

    fn ticket(&self, key: Arc<str>) -> Ticket {
        Ticket {
            records: self.clone(),
            key,
            done: false,
        }
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.lock().by_key.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// The map's own copy of `key`, which must be remembered.
    fn shared(&self, key: &str) -> Arc<str> {
        self.by_key
            .get_key_value(key)
            .map_or_else(|| key.into(), |(k, _)| k.clone())
    }

    fn forget_old(&mut self, now: Instant, ttl: Duration, max: usize) {
        while let Some((used, key)) = self.order.front() {
            let current = self.by_key.get(key).map(|r| r.used);
            if current != Some(*used) {
                self.order.pop_front();
                continue;
            }
            let expired = now.saturating_duration_since(*used) > ttl;
            let running = self.by_key.get(key).is_some_and(|r| r.running.is_some());
            if !(expired || self.by_key.len() >= max) || running {
                break;
            }
            if let Some((_, key)) = self.order.pop_front() {
                self.by_key.remove(&key);
            }
        }
    }
}

impl Ticket {
    /// Ends the try: `delivered` were confirmed now, and `complete` when
    /// every branch of the request now is.
    pub fn finish(mut self, delivered: &[String], complete: bool) {
        self.done = true;
        self.end(delivered, complete);
    }

    fn end(&self, delivered: &[String], complete: bool) {
        let mut inner = self.records.lock();
        let now = Instant::now();
        let nothing = delivered.is_empty() && !complete;
        let Some(record) = inner.by_key.get_mut(&*self.key) else {
            return;
        };
        for branch in delivered {
            if !record.delivered.contains(branch) {
                record.delivered.push(branch.clone());
            }
        }
        record.complete |= complete;
        if let Some(running) = record.running.take() {
            running.send_replace(true);
        }
        record.used = now;
        // A first try that confirmed nothing leaves nothing to remember.
        if nothing && record.delivered.is_empty() {
            inner.by_key.remove(&*self.key);
        } else {
            inner.order.push_back((now, self.key.clone()));
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.end(&[], false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(body: &str) -> uuid::Uuid {
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, body.as_bytes())
    }

    fn deliver(begin: Begin) -> (Ticket, Vec<String>) {
        match begin {
            Begin::Deliver(ticket, skip) => (ticket, skip),
            _ => panic!("expected to deliver"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_skips_what_was_confirmed_and_a_complete_key_answers_from_the_record() {
        let records = Records::new(Duration::from_secs(600), 10);
        let (ticket, skip) = deliver(records.begin("k", digest("a")));
        assert!(skip.is_empty());
        let Begin::Wait(mut waiting) = records.begin("k", digest("a")) else {
            panic!("a second try waits for the first");
        };
        assert!(matches!(records.begin("k", digest("b")), Begin::Conflict));
        ticket.finish(&["logging".to_owned()], false);
        assert!(
            waiting.wait_for(|done| *done).await.is_ok(),
            "told the first try ended"
        );
        let (ticket, skip) = deliver(records.begin("k", digest("a")));
        assert_eq!(skip, ["logging"]);
        ticket.finish(&["service".to_owned()], true);
        assert!(
            matches!(records.begin("k", digest("a")), Begin::Complete(d) if d == ["logging", "service"])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn keys_are_forgotten_after_the_ttl_and_past_the_count() {
        let records = Records::new(Duration::from_secs(60), 2);
        for key in ["a", "b"] {
            let (ticket, _) = deliver(records.begin(key, digest(key)));
            ticket.finish(&["x".to_owned()], true);
        }
        assert_eq!(records.len(), 2);
        // A third key forgets the oldest.
        let (ticket, _) = deliver(records.begin("c", digest("c")));
        ticket.finish(&["x".to_owned()], true);
        assert_eq!(records.len(), 2);
        assert!(matches!(
            records.begin("a", digest("other")),
            Begin::Deliver(..)
        ));
        tokio::time::advance(Duration::from_secs(61)).await;
        let running = records.begin("z", digest("z"));
        assert_eq!(records.len(), 1, "only the new key is left");
        drop(running);
    }

    #[tokio::test(start_paused = true)]
    async fn a_try_that_confirmed_nothing_is_forgotten_and_a_dropped_ticket_frees_the_key() {
        let records = Records::new(Duration::from_secs(60), 10);
        let (ticket, _) = deliver(records.begin("k", digest("a")));
        drop(ticket);
        assert!(records.is_empty());
        assert!(matches!(
            records.begin("k", digest("b")),
            Begin::Deliver(..)
        ));
    }
}
