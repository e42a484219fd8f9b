//! The HTTP ingress's sessions: a [`SessionSet`] whose items are requests
//! (each with its caller's deadline and the way to answer it), which
//! refuses a new session when every slot is taken (the caller is told to
//! come back, `429`), and whose task delivers each request after every
//! earlier one of its session, in the order they reached the forwarder,
//! answering each once its own message is confirmed on every branch: the
//! caller, not an unacked queue, holds what is not confirmed yet.
//!
//! A session ends with its end message, with the first message that does
//! not reach every branch, past `idle_timeout_ms` without a message, or
//! past `max_messages` / `max_bytes` (that request is refused); for
//! `closed_ttl_ms` after that its requests are refused (`session-closed`),
//! so no branch receives a set with a hole in it. A first message that no
//! filter matches is refused and opens nothing.

use super::progress::{Next, Progress, next};
use super::set::{Closing, Item, Placed, Session, SessionSet, Start, WhenFull};
use crate::envelope::Envelope;
use crate::pipeline::admit::Membership;
use crate::pipeline::engine::held;
use crate::pipeline::generation::Generation;
use crate::pipeline::outcome::{Barred, Outcome};
use crate::routing::BranchPlan;
use crate::telemetry::Telemetry;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// One request of a session.
pub(crate) struct Request {
    envelope: Arc<Envelope>,
    /// The caller's deadline: cancelled, no new attempt starts.
    lost: CancellationToken,
    answer: oneshot::Sender<Answer>,
}

/// What a request of a session comes to: its outcome, or why its session
/// refused it.
pub(crate) type Answer = Result<Outcome, Refused>;

/// Why a session did not take a request; nothing of it was published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    Barred(Barred),
    /// Every session slot is taken: `sessions.max_open`.
    Full(u32),
    /// The forwarder stopped before the request's turn.
    Stopping,
}

impl Item for Request {
    fn envelope(&self) -> &Arc<Envelope> {
        &self.envelope
    }

    fn lost(&self) -> Option<&CancellationToken> {
        None
    }
}

/// How a session's branches are chosen for callers.
pub(crate) type Route = fn(&Generation, &Envelope) -> Result<Vec<BranchPlan>, Barred>;

/// The ingress's sessions, counted in `switchyard_sessions_open` with the
/// queue's. Cheap to clone.
#[derive(Clone)]
pub(crate) struct HttpSessions {
    set: SessionSet<Request>,
}

impl HttpSessions {
    /// Which session a message belongs to, for [`crate::pipeline::admit`].
    pub(crate) fn membership(&self) -> &impl Membership {
        &self.set
    }

    /// No session open yet; their tasks run on `tracker` within the
    /// shutdown bound `abandon`, choosing branches with `route`.
    pub(crate) fn new(
        tracker: TaskTracker,
        abandon: CancellationToken,
        telemetry: Telemetry,
        route: Route,
    ) -> Self {
        let start: Start<Request> = Arc::new(move |session| {
            let abandon = abandon.clone();
            tracker.spawn(async move {
                held(&abandon, run(session, route)).await;
            });
        });
        Self {
            set: SessionSet::new(WhenFull::Refuse, telemetry, start),
        }
    }

    /// Places `envelope` in session `id` (from [`Self::member`]), opening
    /// it under `generation` when it is not open; the answer comes when
    /// its turn has come and it is delivered.
    pub(crate) fn submit(
        &self,
        id: Arc<str>,
        envelope: Arc<Envelope>,
        generation: &Arc<Generation>,
        lost: CancellationToken,
    ) -> Result<Pin<Box<dyn Future<Output = Answer> + Send>>, Refused> {
        let (answer, answered) = oneshot::channel();
        let request = Request {
            envelope,
            lost,
            answer,
        };
        match self.set.place(id.clone(), request, generation) {
            Placed::Taken => Ok(Box::pin(async move {
                answered.await.unwrap_or(Err(Refused::Stopping))
            })),
            Placed::Closed(_, ago) => Err(Refused::Barred(Barred::SessionClosed { id, ago })),
            Placed::Full(_, max_open) => Err(Refused::Full(max_open)),
        }
    }
}

/// Runs one session: each request in turn, until the session ends.
async fn run(mut session: Session<Request>, route: Route) {
    let Some(config) = session.generation.settings.sessions.clone() else {
        session.release.release(Closing::Abandoned);
        return;
    };
    let generation = session.generation.clone();
    let mut progress = Progress::new(config);
    let closing = loop {
        let idle = progress.idle_timeout();
        let paused = generation.group.pause_changes();
        let request = match next(&mut session.items, idle, paused, &session.stop).await {
            Next::Stopped => break Closing::Abandoned,
            Next::Idle(_) => break Closing::Closed,
            Next::Item(request) => request,
        };
        let Request {
            envelope,
            lost,
            answer,
        } = request;
        let end = match progress.take(envelope) {
            Ok(end) => end,
            Err(barred) => {
                let _ = answer.send(Err(Refused::Barred(barred)));
                break Closing::Closed;
            }
        };
        if let Err(barred) = progress.route(&generation, |first| route(&generation, first)) {
            let _ = answer.send(Err(Refused::Barred(barred)));
            break Closing::Abandoned;
        }
        let mut outcome = progress.deliver(&generation, &session.id, &lost).await;
        if generation.recorder.wanted() {
            outcome.trails = progress.newest_trails();
        }
        let ended = end || !outcome.all_delivered();
        // The caller may be gone: the outcome stands all the same.
        let _ = answer.send(Ok(outcome));
        if ended {
            break Closing::Closed;
        }
    };
    session.release.release(closing);
    session.items.close();
    while let Some(late) = session.items.recv().await {
        let ended = Barred::SessionEnded {
            id: session.id.clone(),
        };
        let _ = late.answer.send(Err(Refused::Barred(ended)));
    }
}
