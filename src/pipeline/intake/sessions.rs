//! Sessions over HTTP. A request whose `sessions.id_header` names a session
//! is delivered after every earlier request of that session, one at a
//! time, in the order they reach the forwarder; each branch is a
//! [`BranchRun`] over the session's messages so far, so it keeps its
//! endpoint and, when it fails over mid-session, replays the whole set to
//! the backup before the new message. A request is answered once its own
//! message is confirmed on every branch: the caller, not an unacked queue,
//! holds what is not yet confirmed.
//!
//! A session ends with its end message, with the first message that does
//! not reach every branch, past `idle_timeout_ms` without a message, or
//! past `max_messages` / `max_bytes`; for `closed_ttl_ms` after that its
//! messages are refused (`session-closed`), so no branch receives a set
//! with a hole in it. At most `max_open` sessions are open at once.

use super::submission::{Delivery, NotTaken, Submitted, plans};
use crate::envelope::Envelope;
use crate::pipeline::engine::{BranchRun, Walk};
use crate::pipeline::generation::Generation;
use crate::pipeline::outcome::{Barred, Outcome};
use crate::pipeline::sessions::is_end;
use crate::telemetry::Telemetry;
use futures_util::future::join_all;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The most closed sessions remembered; the oldest is forgotten first.
const MAX_CLOSED: usize = 100_000;

/// The HTTP ingress's sessions, counted in `switchyard_sessions_open` with
/// the queue's. Cheap to clone.
#[derive(Clone)]
pub struct HttpSessions {
    registry: Arc<Mutex<Registry>>,
    telemetry: Telemetry,
}

#[derive(Default)]
struct Registry {
    open: HashMap<Arc<str>, Open>,
    closed: HashMap<Arc<str>, Instant>,
    closed_order: VecDeque<(Instant, Arc<str>)>,
}

#[derive(Clone)]
struct Open {
    branches: Vec<Arc<str>>,
    session: Arc<tokio::sync::Mutex<Session>>,
}

/// One open session: its branches' runs and its messages so far.
struct Session {
    generation: Arc<Generation>,
    runs: Vec<BranchRun>,
    set: Vec<Arc<Envelope>>,
    bytes: u64,
    /// When its last message was delivered (or it opened).
    last: Instant,
    ended: bool,
}

impl HttpSessions {
    /// No session open yet; opening and closing ones reports to `telemetry`.
    pub(crate) fn new(telemetry: Telemetry) -> Self {
        Self {
            registry: Arc::default(),
            telemetry,
        }
    }

    /// Takes `envelope` into session `id`, opening it (routed by this
    /// first message under `generation`) when it is not open.
    pub(super) fn submit(
        &self,
        id: Arc<str>,
        envelope: Arc<Envelope>,
        generation: Arc<Generation>,
        lost: CancellationToken,
    ) -> Result<Submitted, NotTaken> {
        let Some(config) = generation.settings.sessions.clone() else {
            return Err(NotTaken::Barred(Barred::NoRoute {
                unparsable_body: None,
            }));
        };
        let open = {
            let mut registry = self.lock();
            let now = Instant::now();
            let expired = registry.expire(now, config.idle_timeout, config.closed_ttl);
            for _ in 0..expired {
                self.telemetry.session_released();
            }
            if let Some(closed) = registry.closed.get(&id) {
                return Err(NotTaken::Barred(Barred::SessionClosed {
                    id,
                    ago: now.saturating_duration_since(*closed),
                }));
            }
            match registry.open.get(&id) {
                Some(open) => open.clone(),
                None => {
                    if registry.open.len() >= config.max_open as usize {
                        return Err(NotTaken::SessionsFull(config.max_open));
                    }
                    let plans = plans(&generation, &envelope, &[])?;
                    let open = Open {
                        branches: plans.iter().map(|p| p.name.clone()).collect(),
                        session: Arc::new(tokio::sync::Mutex::new(Session {
                            runs: plans
                                .into_iter()
                                .map(|plan| BranchRun::new(plan, &generation.engine))
                                .collect(),
                            generation,
                            set: Vec::new(),
                            bytes: 0,
                            last: now,
                            ended: false,
                        })),
                    };
                    registry.open.insert(id.clone(), open.clone());
                    self.telemetry.session_opened(&id, envelope.message_id());
                    open
                }
            }
        };
        let sessions = self.clone();
        let branches = open.branches.clone();
        let delivery: Delivery = Box::pin(async move {
            // Fair: waiters are served in the order they came.
            let mut session = open.session.lock().await;
            let result = session.deliver(&id, envelope, &lost).await;
            if session.ended {
                sessions.close(&id, &open.session);
            }
            result
        });
        Ok(Submitted { branches, delivery })
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Session `id` ended: it is closed, unless a newer one took its place.
    fn close(&self, id: &Arc<str>, session: &Arc<tokio::sync::Mutex<Session>>) {
        let mut registry = self.lock();
        if registry
            .open
            .get(id)
            .is_some_and(|open| Arc::ptr_eq(&open.session, session))
        {
            registry.open.remove(id);
            registry.remember_closed(id.clone(), Instant::now());
            self.telemetry.session_released();
        }
    }
}

impl Registry {
    /// Closes open sessions idle past `idle` (those not delivering now) and
    /// forgets closed ones older than `ttl`; returns how many it closed.
    fn expire(
        &mut self,
        now: Instant,
        idle: std::time::Duration,
        ttl: std::time::Duration,
    ) -> usize {
        let idle_ids: Vec<Arc<str>> = self
            .open
            .iter()
            .filter(|(_, open)| {
                open.session
                    .try_lock()
                    .is_ok_and(|s| now.saturating_duration_since(s.last) > idle)
            })
            .map(|(id, _)| id.clone())
            .collect();
        let closed = idle_ids.len();
        for id in idle_ids {
            self.open.remove(&id);
            self.remember_closed(id, now);
        }
        while let Some((at, _)) = self.closed_order.front() {
            if now.saturating_duration_since(*at) <= ttl && self.closed_order.len() <= MAX_CLOSED {
                break;
            }
            if let Some((at, id)) = self.closed_order.pop_front()
                && self.closed.get(&id) == Some(&at)
            {
                self.closed.remove(&id);
            }
        }
        closed
    }

    fn remember_closed(&mut self, id: Arc<str>, at: Instant) {
        self.closed.insert(id.clone(), at);
        self.closed_order.push_back((at, id));
    }
}

impl Session {
    /// Delivers `envelope` as the session's next message on every branch.
    async fn deliver(
        &mut self,
        id: &str,
        envelope: Arc<Envelope>,
        lost: &CancellationToken,
    ) -> Result<Outcome, NotTaken> {
        let generation = self.generation.clone();
        let Some(config) = generation.settings.sessions.as_ref() else {
            return Err(NotTaken::Barred(Barred::NoRoute {
                unparsable_body: None,
            }));
        };
        if self.ended {
            return Err(NotTaken::Barred(Barred::SessionEnded { id: id.into() }));
        }
        let idle = Instant::now().saturating_duration_since(self.last);
        if !self.set.is_empty() && idle > config.idle_timeout {
            self.ended = true;
            return Err(NotTaken::Barred(Barred::SessionTimeout {
                idle: config.idle_timeout,
            }));
        }
        let end = is_end(&envelope, config);
        self.bytes += envelope.body.len() as u64;
        self.set.push(envelope);
        if self.set.len() > config.max_messages as usize || self.bytes > config.max_bytes {
            self.ended = true;
            return Err(NotTaken::Barred(Barred::SessionTooLarge {
                messages: self.set.len(),
                bytes: self.bytes,
                max_messages: config.max_messages,
                max_bytes: config.max_bytes,
            }));
        }
        let walk = Walk {
            engine: &generation.engine,
            lost,
            session: Some(id),
        };
        let run = &self.set;
        let branches = join_all(self.runs.iter_mut().map(|b| b.deliver(run, None, &walk))).await;
        let outcome = Outcome { branches };
        self.last = Instant::now();
        self.ended = end || !outcome.all_delivered();
        Ok(outcome)
    }
}
