//! What the ingress remembers of each `Idempotency-Key`: a digest of the
//! request (routing key and body), the branches already confirmed, and,
//! once every branch is, the answer given. A retry sends only the branches
//! not yet confirmed; a retry of a complete request is answered from the
//! record; the same key with another request is a conflict; a retry while
//! the first try still runs waits for it.
//!
//! Memory is bounded (`recent`, the map closed sessions use too):
//! a key is forgotten `idempotency_ttl_ms` after its last use, and past
//! `idempotency_max_keys` the least recently used is forgotten first (never
//! one whose try runs). A record keeps its key once and no copy of the
//! answer, which is made again from the key and the branches;
//! tests/http_key_memory.rs measures what a key costs. Records live in
//! this process only.

use crate::recent::Recent;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The remembered keys. Cheap to clone.
#[derive(Clone)]
pub struct Records {
    inner: Arc<Mutex<Recent<Record>>>,
    ttl: Duration,
}

struct Record {
    digest: uuid::Uuid,
    delivered: Vec<String>,
    /// Whether a try confirmed every branch.
    complete: bool,
    /// Set while a try runs; set to true when it ends. A waiter subscribes
    /// under the lock, so it cannot miss the end. A running key is never
    /// forgotten.
    running: Option<watch::Sender<bool>>,
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
            inner: Arc::new(Mutex::new(Recent::new(max))),
            ttl,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Recent<Record>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a try of `key` for a request whose digest is `digest`.
    pub fn begin(&self, key: &str, digest: uuid::Uuid) -> Begin {
        let now = Instant::now();
        let mut records = self.lock();
        records.forget(now, self.ttl, |r| r.running.is_some());
        if let Some(record) = records.get_mut(key) {
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
            let skip = record.delivered.clone();
            records.touch(key, now);
            let key = records.key(key).unwrap_or_else(|| key.into());
            return Begin::Deliver(self.ticket(key), skip);
        }
        let key: Arc<str> = key.into();
        let record = Record {
            digest,
            delivered: Vec::new(),
            complete: false,
            running: Some(watch::Sender::new(false)),
        };
        records.insert(key.clone(), record, now);
        records.forget(now, self.ttl, |r| r.running.is_some());
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
        self.lock().len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let mut records = self.records.lock();
        let nothing = delivered.is_empty() && !complete;
        let Some(record) = records.get_mut(&self.key) else {
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
        // A first try that confirmed nothing leaves nothing to remember.
        if nothing && record.delivered.is_empty() {
            records.remove(&self.key);
        } else {
            records.touch(&self.key, Instant::now());
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
