//! The registry of one forwarder's sessions: the open ones (each with its
//! task), the ones waiting for a slot, and the ones closed recently.
//! [`Sessions::admit`] hands each message of a session to its place.

use super::membership::{Arrival, Closing, annotation, session_id};
use super::task::SessionTask;
use crate::config;
use crate::envelope::Envelope;
use crate::pipeline::engine::spawn_held;
use crate::pipeline::generation::Generation;
use crate::pipeline::outcome::{Barred, Verdict};
use crate::telemetry::Telemetry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The open sessions of one forwarder, the sessions waiting for a slot and
/// the ones closed recently. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Sessions {
    registry: Arc<Mutex<Registry>>,
    /// Open and waiting sessions, readable without the lock: while there
    /// are none, no message needs the registry to know it is independent.
    live: Arc<AtomicUsize>,
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
    /// The generation it opened under, whose `[sessions]` it keeps.
    generation: Arc<Generation>,
}

struct Waiting {
    generation: Arc<Generation>,
    arrivals: Vec<Arrival>,
}

impl Sessions {
    pub(crate) fn new(
        tracker: TaskTracker,
        abandon: CancellationToken,
        telemetry: Telemetry,
    ) -> Self {
        Self {
            registry: Arc::default(),
            live: Arc::default(),
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

    /// The session `envelope` belongs to, with the generation it is to be
    /// admitted under; `None` for an independent message. A session open
    /// (or waiting) claims its messages first, by the id header it opened
    /// with: it finishes under the `[sessions]` settings it started with,
    /// whatever a reload changed since (sessions turned off, the header
    /// renamed, the limits changed). Otherwise the live `generation`'s
    /// settings say, and a new session opens under them.
    pub(crate) fn member(
        &self,
        envelope: &Envelope,
        generation: &Arc<Generation>,
    ) -> Option<(Arc<str>, Arc<Generation>)> {
        if self.live.load(Ordering::Relaxed) > 0 {
            let registry = self.lock();
            let mut headers: Vec<&Arc<Generation>> = Vec::new();
            let open = registry.open.values().map(|o| &o.generation);
            let waiting = registry.waiting_sets.values().map(|w| &w.generation);
            for opened in open.chain(waiting) {
                let Some(config) = opened.settings.sessions.as_ref() else {
                    continue;
                };
                let seen = headers.iter().any(|g| {
                    g.settings
                        .sessions
                        .as_ref()
                        .is_some_and(|c| c.id_header == config.id_header)
                });
                if seen {
                    continue;
                }
                headers.push(opened);
                if let Some(id) = session_id(envelope, config) {
                    let claimed = registry
                        .open
                        .get(&id)
                        .map(|o| &o.generation)
                        .or_else(|| registry.waiting_sets.get(&id).map(|w| &w.generation));
                    if let Some(owner) = claimed {
                        return Some((id, owner.clone()));
                    }
                }
            }
        }
        let config = generation.settings.sessions.as_ref()?;
        session_id(envelope, config).map(|id| (id, generation.clone()))
    }

    /// Takes one message of session `id`, to be admitted under `generation`
    /// (from [`Self::member`]); a new session opens under its settings.
    pub(crate) fn admit(&self, id: Arc<str>, arrival: Arrival, generation: &Arc<Generation>) {
        let generation = generation.clone();
        let Some(config) = generation.settings.sessions.clone() else {
            return;
        };
        let config = &config;
        let mut registry = self.lock();
        self.admit_locked(&mut registry, id, arrival, generation, config);
        self.count_live(&registry);
    }

    fn admit_locked(
        &self,
        registry: &mut MutexGuard<'_, Registry>,
        id: Arc<str>,
        arrival: Arrival,
        generation: Arc<Generation>,
        config: &config::Sessions,
    ) {
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
            // A redriven set (`dlq redrive` marks it, trusted) is the
            // operator's deliberate second try: it opens the session anew.
            if arrival.envelope.annotations.redriven {
                registry.closed.remove(&id);
            } else {
                let ago = closed_at.elapsed();
                self.dead_letter_closed(id, arrival, generation, ago);
                return;
            }
        }
        if let Some(waiting) = registry.waiting_sets.get_mut(&id) {
            waiting.arrivals.push(arrival);
            return;
        }
        if registry.open.len() < slots(config) {
            self.open(registry, id, generation, vec![arrival]);
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
                generation: generation.clone(),
            },
        );
        let sessions = self.clone();
        let released = id.clone();
        let task = SessionTask {
            id,
            generation,
            messages,
            lost,
            stop,
            abandon: self.abandon.clone(),
            telemetry: self.telemetry.clone(),
            release: Some(Box::new(move |closing| {
                sessions.release(&released, serial, closing)
            })),
        };
        self.tracker.spawn(task.run());
    }

    /// Called when a session's task ends: frees its slot (remembering it as
    /// closed unless abandoned) and opens the sessions waiting for one,
    /// oldest first.
    fn release(&self, id: &Arc<str>, serial: u64, closing: Closing) {
        let mut registry = self.lock();
        if registry.open.get(id).is_some_and(|o| o.serial == serial) {
            registry.open.remove(id);
        }
        if closing == Closing::Closed {
            registry.remember_closed(id.clone(), Instant::now(), MAX_CLOSED);
        }
        self.telemetry.session_released();
        self.promote(&mut registry);
        self.count_live(&registry);
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
    pub(crate) fn abandon_all(&self) {
        let mut registry = self.lock();
        for open in registry.open.values() {
            open.stop.cancel();
        }
        registry.open.clear();
        registry.waiting.clear();
        registry.waiting_sets.clear();
        self.count_live(&registry);
    }

    fn count_live(&self, registry: &Registry) {
        let live = registry.open.len() + registry.waiting_sets.len();
        self.live.store(live, Ordering::Relaxed);
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
        let Arrival {
            envelope,
            receipt,
            permit,
            ..
        } = arrival;
        let verdict = Verdict::barred(Barred::SessionClosed {
            id: id.clone(),
            ago,
        });
        let settled = async move {
            let settler = &generation.settler;
            settler
                .settle_with(&envelope, receipt, verdict, annotation(&id))
                .await;
        };
        spawn_held(&self.tracker, &self.abandon, permit, settled);
    }
}

/// Closed sessions remembered at most (ids come from producers, up to
/// 256 bytes each: some 40 MiB at worst). Past it the oldest are forgotten
/// before their `closed_ttl_ms`: a late message of one of those opens a new
/// session instead of being dead-lettered `session-closed`.
const MAX_CLOSED: usize = 100_000;

impl Registry {
    /// Remembers `id` as closed `now`, forgetting the oldest past `bound`.
    fn remember_closed(&mut self, id: Arc<str>, now: Instant, bound: usize) {
        self.closed.insert(id.clone(), now);
        self.closed_order.push_back((now, id));
        while self.closed_order.len() > bound {
            if let Some((at, id)) = self.closed_order.pop_front()
                && self.closed.get(&id) == Some(&at)
            {
                self.closed.remove(&id);
            }
        }
    }

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

/// `sessions.max_open` as a count.
fn slots(config: &config::Sessions) -> usize {
    usize::try_from(config.max_open).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn closed_sessions_past_the_bound_are_forgotten_oldest_first() {
        let mut registry = Registry::default();
        let now = Instant::now();
        let at = |i: u64| now + Duration::from_millis(i);
        for (i, id) in ["a", "b", "a", "c", "d"].into_iter().enumerate() {
            registry.remember_closed(id.into(), at(i as u64), 3);
        }
        // "a" closed again is remembered from its second closing.
        let mut kept: Vec<&str> = registry.closed.keys().map(|k| &**k).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["a", "c", "d"]);
        assert_eq!(registry.closed_order.len(), 3);
        for i in 0..10 {
            registry.remember_closed(format!("s{i}").into(), at(10 + i), 3);
        }
        assert_eq!(registry.closed.len(), 3);
        assert!(registry.closed.contains_key("s9"));
    }
}
