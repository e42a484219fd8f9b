//! The one session set, for both sources: the open sessions (each fed to
//! its task), the ones waiting for a slot, and the ones closed recently.
//! It owns the rules the sources share: which session a message belongs
//! to (a session keeps the `[sessions]` settings it opened with), at most
//! `max_open` open at once, and for `closed_ttl_ms` after a session closed
//! its late messages are turned away (unless `dlq redrive` sent them). The
//! closed sessions are kept in a [`Recent`] map, bounded by age and count.
//!
//! What a source does with a session (hold its messages and settle them,
//! or answer callers) is its task's business: the set starts a task with
//! the source's `start` function and feeds it the session's items.

use super::membership::session_id;
use crate::config;
use crate::envelope::Envelope;
use crate::pipeline::admit::Membership;
use crate::pipeline::generation::Generation;
use crate::recent::Recent;
use crate::telemetry::Telemetry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Closed sessions remembered at most (ids come from producers, up to
/// 256 bytes each: some 40 MiB at worst). Past it the oldest are forgotten
/// before their `closed_ttl_ms`: a late message of one of those opens a new
/// session instead of being turned away as `session-closed`.
pub(crate) const MAX_CLOSED: usize = 100_000;

/// What a session's task is fed: one message of it, held as its source
/// holds work.
pub(crate) trait Item: Send + 'static {
    /// The message.
    fn envelope(&self) -> &Arc<Envelope>;
    /// Cancelled when the channel the message came on is lost; a session
    /// whose channel is lost is left behind, and its redelivered set opens
    /// it anew. `None`: the item holds no channel.
    fn lost(&self) -> Option<&CancellationToken>;
}

/// What a full set does with a new session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WhenFull {
    /// Keep its items until a slot frees (they wait unacked on the queue).
    Wait,
    /// Give them back at once (a caller is told to come back).
    Refuse,
}

/// How a session's task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closing {
    /// Completed or ended: late messages are turned away for a while.
    Closed,
    /// Left unfinished: what comes for it opens it anew.
    Abandoned,
}

/// Where [`SessionSet::place`] put an item.
pub(crate) enum Placed<T> {
    /// Fed to its session, opened now or before, or waiting for a slot.
    Taken,
    /// The session closed `ago`: the item comes back, to be turned away.
    Closed(T, Duration),
    /// Every slot is taken and the set refuses new sessions.
    Full(T, u32),
}

/// A session to run: its id, the settings it opened under, its items in
/// order, and the tokens that stop it.
pub(crate) struct Session<T> {
    pub(crate) id: Arc<str>,
    pub(crate) generation: Arc<Generation>,
    pub(crate) items: mpsc::UnboundedReceiver<T>,
    /// Cancelled to abandon it (its consumer stops or moves).
    pub(crate) stop: CancellationToken,
    /// Frees its slot, saying how it closed; called once by its task.
    pub(crate) release: Release,
}

/// Frees a session's slot in its set.
pub(crate) struct Release(Option<Box<dyn FnOnce(Closing) + Send + Sync>>);

impl Release {
    /// Frees the slot, remembering the session as closed unless abandoned.
    pub(crate) fn release(&mut self, closing: Closing) {
        if let Some(release) = self.0.take() {
            release(closing);
        }
    }
}

/// Starts a session's task.
pub(crate) type Start<T> = Arc<dyn Fn(Session<T>) + Send + Sync>;

/// One source's sessions. Cheap to clone.
pub(crate) struct SessionSet<T: Item> {
    registry: Arc<Mutex<Registry<T>>>,
    /// Open and waiting sessions, readable without the lock: while there
    /// are none, no message needs the registry to know it is independent.
    live: Arc<AtomicUsize>,
    when_full: WhenFull,
    start: Start<T>,
    telemetry: Telemetry,
}

impl<T: Item> Clone for SessionSet<T> {
    fn clone(&self) -> Self {
        Self {
            registry: self.registry.clone(),
            live: self.live.clone(),
            when_full: self.when_full,
            start: self.start.clone(),
            telemetry: self.telemetry.clone(),
        }
    }
}

struct Registry<T> {
    open: HashMap<Arc<str>, Open<T>>,
    /// Sessions waiting for a slot, in the order their first item came.
    waiting: VecDeque<Arc<str>>,
    waiting_sets: HashMap<Arc<str>, Waiting<T>>,
    /// When each recently closed session closed.
    closed: Recent<()>,
    /// Numbers open sessions, so a task ending late never removes a newer
    /// session of the same id.
    serial: u64,
}

/// An open session, as the set sees it.
struct Open<T> {
    feed: mpsc::UnboundedSender<T>,
    /// The channel its messages came on was lost.
    lost: Option<CancellationToken>,
    stop: CancellationToken,
    serial: u64,
    /// The generation it opened under, whose `[sessions]` it keeps.
    generation: Arc<Generation>,
}

struct Waiting<T> {
    generation: Arc<Generation>,
    items: Vec<T>,
}

impl<T: Item> SessionSet<T> {
    /// An empty set whose sessions run as `start` starts them.
    pub(crate) fn new(when_full: WhenFull, telemetry: Telemetry, start: Start<T>) -> Self {
        let registry = Registry {
            open: HashMap::new(),
            waiting: VecDeque::new(),
            waiting_sets: HashMap::new(),
            closed: Recent::new(MAX_CLOSED),
            serial: 0,
        };
        Self {
            registry: Arc::new(Mutex::new(registry)),
            live: Arc::default(),
            when_full,
            start,
            telemetry,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry<T>> {
        // A panic while holding the lock leaves plain data behind: go on with it.
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Places `item` in session `id`, under `generation` (from
    /// [`Self::member`]); a new session opens under its settings.
    pub(crate) fn place(&self, id: Arc<str>, item: T, generation: &Arc<Generation>) -> Placed<T> {
        let Some(config) = generation.settings.sessions.clone() else {
            // `member` names sessions only where they are on.
            return Placed::Closed(item, Duration::ZERO);
        };
        let mut registry = self.lock();
        let placed = self.place_locked(&mut registry, id, item, generation, &config);
        self.count_live(&registry);
        placed
    }

    fn place_locked(
        &self,
        registry: &mut Registry<T>,
        id: Arc<str>,
        item: T,
        generation: &Arc<Generation>,
        config: &config::Sessions,
    ) -> Placed<T> {
        let now = Instant::now();
        registry.closed.forget(now, config.closed_ttl, |()| false);
        let mut item = item;
        if let Some(open) = registry.open.get(&id) {
            let lost = open.lost.as_ref().is_some_and(|l| l.is_cancelled());
            if !lost && !open.stop.is_cancelled() {
                match open.feed.send(item) {
                    Ok(()) => return Placed::Taken,
                    Err(mpsc::error::SendError(back)) => item = back,
                }
            }
            // Left behind by a lost channel: its task abandons it, and this
            // redelivered set starts over.
            registry.open.remove(&id);
        }
        if let Some(closed_at) = registry.closed.used(&id) {
            // A redriven set (`dlq redrive` marks it, trusted) is the
            // operator's deliberate second try: it opens the session anew.
            if item.envelope().annotations.redriven {
                registry.closed.remove(&id);
            } else {
                return Placed::Closed(item, now.saturating_duration_since(closed_at));
            }
        }
        if let Some(waiting) = registry.waiting_sets.get_mut(&id) {
            waiting.items.push(item);
            return Placed::Taken;
        }
        if registry.open.len() < slots(config) {
            self.open(registry, id, generation.clone(), vec![item]);
            return Placed::Taken;
        }
        if self.when_full == WhenFull::Refuse {
            return Placed::Full(item, config.max_open);
        }
        let message_id = item.envelope().message_id().into_owned();
        self.telemetry
            .session_waiting(&id, &message_id, registry.open.len());
        registry.waiting.push_back(id.clone());
        registry.waiting_sets.insert(
            id,
            Waiting {
                generation: generation.clone(),
                items: vec![item],
            },
        );
        Placed::Taken
    }

    /// Opens session `id` with its first items and starts its task.
    fn open(
        &self,
        registry: &mut Registry<T>,
        id: Arc<str>,
        generation: Arc<Generation>,
        items: Vec<T>,
    ) {
        let Some(first) = items.first() else {
            return;
        };
        let (feed, receiver) = mpsc::unbounded_channel();
        let lost = first.lost().cloned();
        self.telemetry
            .session_opened(&id, &first.envelope().message_id());
        for item in items {
            // The receiver is alive: it is handed to the task below.
            let _ = feed.send(item);
        }
        registry.serial += 1;
        let serial = registry.serial;
        let stop = CancellationToken::new();
        registry.open.insert(
            id.clone(),
            Open {
                feed,
                lost,
                stop: stop.clone(),
                serial,
                generation: generation.clone(),
            },
        );
        let set = self.clone();
        let released = id.clone();
        (self.start)(Session {
            id,
            generation,
            items: receiver,
            stop,
            release: Release(Some(Box::new(move |closing| {
                set.release(&released, serial, closing);
            }))),
        });
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
            registry.closed.insert(id.clone(), (), Instant::now());
            registry
                .closed
                .forget(Instant::now(), Duration::MAX, |()| false);
        }
        self.telemetry.session_released();
        self.promote(&mut registry);
        self.count_live(&registry);
    }

    /// Opens waiting sessions while slots are free.
    fn promote(&self, registry: &mut Registry<T>) {
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
                self.open(registry, id, waiting.generation, waiting.items);
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

    fn count_live(&self, registry: &Registry<T>) {
        let live = registry.open.len() + registry.waiting_sets.len();
        self.live.store(live, Ordering::Relaxed);
    }
}

impl<T: Item> Membership for SessionSet<T> {
    /// The session `envelope` belongs to, with the generation it is to be
    /// placed under; `None` for an independent message. A session open
    /// (or waiting) claims its messages first, by the id header it opened
    /// with: it finishes under the `[sessions]` settings it started with,
    /// whatever a reload changed since (sessions turned off, the header
    /// renamed, the limits changed). Otherwise the live `generation`'s
    /// settings say, and a new session opens under them.
    fn member(
        &self,
        envelope: &Envelope,
        generation: &Arc<Generation>,
    ) -> Option<(Arc<str>, Arc<Generation>)> {
        if self.live.load(Ordering::Relaxed) > 0 {
            let registry = self.lock();
            if let Some(claimed) = registry.claim(envelope) {
                return Some(claimed);
            }
        }
        let config = generation.settings.sessions.as_ref()?;
        session_id(envelope, config).map(|id| (id, generation.clone()))
    }
}

impl<T> Registry<T> {
    /// The open or waiting session that claims `envelope` by the id header
    /// it opened with, and its generation.
    fn claim(&self, envelope: &Envelope) -> Option<(Arc<str>, Arc<Generation>)> {
        let open = self.open.values().map(|o| &o.generation);
        let waiting = self.waiting_sets.values().map(|w| &w.generation);
        let mut headers: Vec<&str> = Vec::new();
        for opened in open.chain(waiting) {
            let Some(config) = opened.settings.sessions.as_ref() else {
                continue;
            };
            if headers.contains(&config.id_header.as_str()) {
                continue;
            }
            headers.push(&config.id_header);
            if let Some(id) = session_id(envelope, config) {
                let claimed = self
                    .open
                    .get(&id)
                    .map(|o| &o.generation)
                    .or_else(|| self.waiting_sets.get(&id).map(|w| &w.generation));
                if let Some(owner) = claimed {
                    return Some((id, owner.clone()));
                }
            }
        }
        None
    }
}

/// `sessions.max_open` as a count.
fn slots(config: &config::Sessions) -> usize {
    usize::try_from(config.max_open).unwrap_or(usize::MAX)
}
