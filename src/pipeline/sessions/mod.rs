//! Sessions: a transaction over a set of inbound messages that grows as
//! they arrive, forwarded in order and settled as one unit.
//!
//! A message whose `sessions.id_header` has a non-empty text value belongs
//! to that session; [`Sessions::admit`] hands it over:
//! - to the session's task when the session is open;
//! - to a new task when a slot is free (at most `sessions.max_open`);
//! - otherwise to the waiting line: the session's messages stay unacked and
//!   unforwarded until a slot frees, while independent messages and open
//!   sessions keep flowing;
//! - and when the session was completed or dead-lettered less than
//!   `sessions.closed_ttl_ms` ago, the message is dead-lettered alone as
//!   `session-closed`, so no service receives a set with a hole in it;
//!   unless `dlq redrive` sent it (it carries `x-switchyard-only`): a
//!   redriven set opens the session anew.
//!
//! The task ([`task`]) forwards the set with per-branch endpoint affinity
//! and replay ([`affinity`]) and settles it. A session whose inbound channel
//! is lost, or that is open when the consumer stops, is abandoned: nothing
//! of it is settled and the broker redelivers the whole set, which is then
//! forwarded again from its first message.

mod affinity;
mod task;

use super::generation::Generation;
use super::outcome::{Reason, Verdict};
use crate::amqp::{AmqpValue, ShortString};
use crate::broker::Receipt;
use crate::config;
use crate::envelope::{Envelope, value_text};
use crate::telemetry::Telemetry;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// One inbound message of a session, with its right to settle and its
/// prefetch slot.
pub(super) struct Arrival {
    pub(super) envelope: Arc<Envelope>,
    pub(super) receipt: Receipt,
    pub(super) permit: OwnedSemaphorePermit,
    /// The screen's verdict when the message must not be forwarded: the
    /// whole session is dead-lettered with it.
    pub(super) refused: Option<Verdict>,
}

/// The session a message belongs to, if any: the text of its id header.
pub(super) fn session_id(envelope: &Envelope, config: &config::Sessions) -> Option<Arc<str>> {
    let text = value_text(envelope.header(&config.id_header)?)?;
    (!text.is_empty()).then(|| Arc::from(text.as_ref()))
}

/// Whether the message ends its session: its end header is the boolean
/// true or the text "true" in any case.
pub(super) fn is_end(envelope: &Envelope, config: &config::Sessions) -> bool {
    match envelope.header(&config.end_header) {
        Some(AmqpValue::Boolean(end)) => *end,
        Some(value) => value_text(value).is_some_and(|t| t.eq_ignore_ascii_case("true")),
        None => false,
    }
}

/// The open sessions of one forwarder, the sessions waiting for a slot and
/// the ones closed recently. Cheap to clone.
#[derive(Clone)]
pub(super) struct Sessions {
    registry: Arc<Mutex<Registry>>,
    tracker: TaskTracker,
    /// The forwarder's shutdown bound: open sessions are abandoned.
    abandon: CancellationToken,
    telemetry: Telemetry,
}

#[derive(Default)]
struct Registry {
    open: HashMap<Arc<str>, Open>,
    /// Sessions waiting for a slot, in the order their first message came.
    waiting: VecDeque<Arc<str>>,
    waiting_sets: HashMap<Arc<str>, Waiting>,
    closed: HashMap<Arc<str>, Instant>,
    closed_order: VecDeque<(Instant, Arc<str>)>,
    /// Numbers open sessions, so a task ending late never removes a newer
    /// session of the same id.
    serial: u64,
}

/// An open session, as the registry sees it.
struct Open {
    feed: mpsc::UnboundedSender<Arrival>,
    /// The inbound channel its messages came on was lost.
    lost: CancellationToken,
    /// Cancelled to abandon the session (the consumer stops or moves).
    stop: CancellationToken,
    serial: u64,
}

struct Waiting {
    generation: Arc<Generation>,
    arrivals: Vec<Arrival>,
}

/// How a session task ended, for the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closing {
    /// Completed or dead-lettered: late messages are `session-closed`.
    Closed,
    /// Abandoned: the broker redelivers the set, which opens it anew.
    Abandoned,
}

impl Sessions {
    pub(super) fn new(
        tracker: TaskTracker,
        abandon: CancellationToken,
        telemetry: Telemetry,
    ) -> Self {
        Self {
            registry: Arc::default(),
            tracker,
            abandon,
            telemetry,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves plain data behind: go on with it.
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes one message of session `id`, consumed under `generation`,
    /// whose sessions settings are `config`.
    pub(super) fn admit(
        &self,
        id: Arc<str>,
        arrival: Arrival,
        generation: &Arc<Generation>,
        config: &config::Sessions,
    ) {
        let generation = generation.clone();
        let mut registry = self.lock();
        registry.forget_closed(config.closed_ttl);
        let mut arrival = arrival;
        if let Some(open) = registry.open.get(&id) {
            if !open.lost.is_cancelled() && !open.stop.is_cancelled() {
                match open.feed.send(arrival) {
                    Ok(()) => return,
                    Err(mpsc::error::SendError(back)) => arrival = back,
                }
            }
            // Left behind by a lost channel: its task abandons it, and this
            // redelivered set starts over.
            registry.open.remove(&id);
        }
        if let Some(closed_at) = registry.closed.get(&id) {
            // A redriven set (`dlq redrive` marks it) is the operator's
            // deliberate second try: it opens the session anew.
            if arrival.envelope.only_branches().is_some() {
                registry.closed.remove(&id);
            } else {
                let ago = closed_at.elapsed();
                drop(registry);
                self.dead_letter_closed(id, arrival, generation, ago);
                return;
            }
        }
        if let Some(waiting) = registry.waiting_sets.get_mut(&id) {
            waiting.arrivals.push(arrival);
            return;
        }
        if registry.open.len() < slots(config) {
            self.open(&mut registry, id, generation, vec![arrival]);
        } else {
            self.telemetry
                .session_waiting(&id, arrival.envelope.message_id(), registry.open.len());
            registry.waiting.push_back(id.clone());
            registry.waiting_sets.insert(
                id,
                Waiting {
                    generation,
                    arrivals: vec![arrival],
                },
            );
        }
    }

    /// Opens session `id` with its first messages and starts its task.
    fn open(
        &self,
        registry: &mut Registry,
        id: Arc<str>,
        generation: Arc<Generation>,
        arrivals: Vec<Arrival>,
    ) {
        let Some(first) = arrivals.first() else {
            return;
        };
        let (feed, messages) = mpsc::unbounded_channel();
        let lost = first.receipt.lost().clone();
        self.telemetry
            .session_opened(&id, first.envelope.message_id());
        for arrival in arrivals {
            // The receiver is alive: it is moved into the task below.
            let _ = feed.send(arrival);
        }
        registry.serial += 1;
        let serial = registry.serial;
        let stop = CancellationToken::new();
        registry.open.insert(
            id.clone(),
            Open {
                feed,
                lost: lost.clone(),
                stop: stop.clone(),
                serial,
            },
        );
        let task = task::SessionTask {
            id,
            serial,
            generation,
            sessions: self.clone(),
            messages,
            lost,
            stop,
        };
        self.tracker.spawn(task.run());
    }

    /// Called by a session's task when it ends: frees its slot (remembering
    /// it as closed unless abandoned) and opens the sessions waiting for
    /// one, oldest first.
    pub(super) fn release(&self, id: &Arc<str>, serial: u64, closing: Closing) {
        let mut registry = self.lock();
        if registry.open.get(id).is_some_and(|o| o.serial == serial) {
            registry.open.remove(id);
        }
        if closing == Closing::Closed {
            let now = Instant::now();
            registry.closed.insert(id.clone(), now);
            registry.closed_order.push_back((now, id.clone()));
        }
        self.telemetry.session_released();
        self.promote(&mut registry);
    }

    /// Opens waiting sessions while slots are free.
    fn promote(&self, registry: &mut Registry) {
        while let Some(id) = registry.waiting.front().cloned() {
            let Some(waiting) = registry.waiting_sets.get(&id) else {
                registry.waiting.pop_front();
                continue;
            };
            let limit = waiting
                .generation
                .settings
                .sessions
                .as_ref()
                .map_or(usize::MAX, slots);
            if registry.open.len() >= limit {
                return;
            }
            registry.waiting.pop_front();
            if let Some(waiting) = registry.waiting_sets.remove(&id) {
                self.open(registry, id, waiting.generation, waiting.arrivals);
            }
        }
    }

    /// Abandons every open and waiting session: their messages go back to
    /// the queue unsettled (the consumer stops, or moves to a new queue).
    pub(super) fn abandon_all(&self) {
        let mut registry = self.lock();
        for open in registry.open.values() {
            open.stop.cancel();
        }
        registry.open.clear();
        registry.waiting.clear();
        registry.waiting_sets.clear();
    }

    /// Dead-letters one message of a session that closed `ago`.
    fn dead_letter_closed(
        &self,
        id: Arc<str>,
        arrival: Arrival,
        generation: Arc<Generation>,
        ago: Duration,
    ) {
        self.telemetry
            .session_closed_arrival(&id, arrival.envelope.message_id(), ago);
        let abandon = self.abandon.clone();
        self.tracker.spawn(async move {
            let Arrival {
                envelope,
                receipt,
                permit,
                ..
            } = arrival;
            let verdict = Verdict::refuse(
                Reason::SessionClosed,
                format!(
                    "session \"{id}\" was completed or dead-lettered {} ms ago",
                    ago.as_millis()
                ),
            );
            tokio::select! {
                biased;
                () = abandon.cancelled() => {}
                () = generation.settler.settle_with(&envelope, receipt, verdict, annotation(&id)) => {}
            }
            drop(permit);
        });
    }
}

/// `sessions.max_open` as a count.
fn slots(config: &config::Sessions) -> usize {
    usize::try_from(config.max_open).unwrap_or(usize::MAX)
}

/// The `x-switchyard-session` annotation of a session's dead letters.
pub(super) fn annotation(id: &str) -> Vec<(ShortString, AmqpValue)> {
    vec![(
        crate::wire::SESSION.into(),
        AmqpValue::LongString(id.into()),
    )]
}

impl Registry {
    /// Drops closed sessions older than `ttl`.
    fn forget_closed(&mut self, ttl: Duration) {
        while let Some((at, id)) = self.closed_order.front() {
            if at.elapsed() < ttl {
                return;
            }
            if self.closed.get(id) == Some(at) {
                self.closed.remove(id);
            }
            self.closed_order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::{FieldTable, Properties};

    fn config() -> config::Sessions {
        config::Sessions {
            id_header: "session-id".to_owned(),
            end_header: "session-end".to_owned(),
            idle_timeout: Duration::from_secs(30),
            max_messages: 50,
            max_bytes: 1 << 20,
            max_open: 4,
            closed_ttl: Duration::from_secs(60),
        }
    }

    fn envelope(headers: Vec<(&str, AmqpValue)>) -> Envelope {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert(name.into(), value);
        }
        Envelope {
            delivery_tag: 1,
            exchange: String::new(),
            routing_key: "in".to_owned(),
            redelivered: false,
            properties: Properties::default().with_headers(table),
            body: Vec::new(),
        }
    }

    fn text(s: &str) -> AmqpValue {
        AmqpValue::LongString(s.into())
    }

    #[test]
    fn the_id_is_the_headers_text_and_an_empty_or_missing_one_is_independent() {
        let config = config();
        let id = |headers| session_id(&envelope(headers), &config).map(|id| id.to_string());
        assert_eq!(
            id(vec![("session-id", text("order-7"))]),
            Some("order-7".to_owned())
        );
        assert_eq!(
            id(vec![("session-id", AmqpValue::ShortString("s".into()))]),
            Some("s".to_owned())
        );
        assert_eq!(
            id(vec![("session-id", AmqpValue::LongLongInt(42))]),
            Some("42".to_owned())
        );
        assert_eq!(id(vec![("session-id", text(""))]), None);
        assert_eq!(id(vec![("other", text("x"))]), None);
        assert_eq!(
            id(vec![(
                "session-id",
                AmqpValue::FieldTable(FieldTable::default())
            )]),
            None
        );
    }

    #[test]
    fn the_end_is_boolean_true_or_the_text_true_in_any_case() {
        let config = config();
        let end = |value: Option<AmqpValue>| {
            let headers = value.map(|v| vec![("session-end", v)]).unwrap_or_default();
            is_end(&envelope(headers), &config)
        };
        assert!(end(Some(AmqpValue::Boolean(true))));
        assert!(end(Some(text("true"))));
        assert!(end(Some(text("TRUE"))));
        assert!(end(Some(AmqpValue::ShortString("True".into()))));
        assert!(!end(Some(AmqpValue::Boolean(false))));
        assert!(!end(Some(text("yes"))));
        assert!(!end(Some(AmqpValue::LongLongInt(1))));
        assert!(!end(None));
    }

    #[test]
    fn closed_sessions_are_forgotten_after_their_ttl() {
        let mut registry = Registry::default();
        let now = Instant::now();
        let old = now.checked_sub(Duration::from_secs(120)).unwrap_or(now);
        for (at, id) in [(old, "old"), (now, "new")] {
            registry.closed.insert(id.into(), at);
            registry.closed_order.push_back((at, id.into()));
        }
        registry.forget_closed(Duration::from_secs(60));
        assert!(!registry.closed.contains_key("old"));
        assert!(registry.closed.contains_key("new"));
        assert_eq!(registry.closed_order.len(), 1);
    }
}
