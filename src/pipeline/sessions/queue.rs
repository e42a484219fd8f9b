//! The inbound queue's sessions: a [`SessionSet`] whose items are
//! deliveries (each with its receipt and prefetch slot), whose sessions
//! wait for a slot when every one is taken (their messages stay unacked,
//! other traffic flows), and whose task (`task`) settles each set as one
//! unit. A late message of a closed session is dead-lettered alone as
//! `session-closed`.

use super::membership::{Arrival, annotation};
use super::set::{Item, Placed, SessionSet, Start, WhenFull};
use super::task::SessionTask;
use crate::envelope::Envelope;
use crate::pipeline::admit::Membership;
use crate::pipeline::engine::spawn_held;
use crate::pipeline::generation::Generation;
use crate::pipeline::outcome::{Barred, Verdict};
use crate::pipeline::record;
use crate::telemetry::Telemetry;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

impl Item for Arrival {
    fn envelope(&self) -> &Arc<Envelope> {
        &self.envelope
    }

    fn lost(&self) -> Option<&CancellationToken> {
        Some(self.receipt.lost())
    }
}

/// The queue's sessions. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Sessions {
    set: SessionSet<Arrival>,
    tracker: TaskTracker,
    /// The forwarder's shutdown bound: open sessions are abandoned.
    abandon: CancellationToken,
    telemetry: Telemetry,
}

impl Sessions {
    /// Which session a message belongs to, for [`crate::pipeline::admit`].
    pub(crate) fn membership(&self) -> &impl Membership {
        &self.set
    }

    /// Sessions whose first message, when a branch it takes has no
    /// endpoint yet, waits for the first of `generations` where it has one.
    pub(crate) fn new(
        tracker: TaskTracker,
        abandon: CancellationToken,
        telemetry: Telemetry,
        generations: watch::Receiver<Arc<Generation>>,
    ) -> Self {
        let start: Start<Arrival> = {
            let (tracker, abandon, telemetry) =
                (tracker.clone(), abandon.clone(), telemetry.clone());
            Arc::new(move |session| {
                let task = SessionTask {
                    session,
                    generations: generations.clone(),
                    abandon: abandon.clone(),
                    telemetry: telemetry.clone(),
                };
                tracker.spawn(task.run());
            })
        };
        Self {
            set: SessionSet::new(WhenFull::Wait, telemetry.clone(), start),
            tracker,
            abandon,
            telemetry,
        }
    }

    /// Takes one message of session `id`, to be admitted under `generation`
    /// (from [`Self::member`]); a new session opens under its settings.
    pub(crate) fn admit(&self, id: Arc<str>, arrival: Arrival, generation: &Arc<Generation>) {
        match self.set.place(id.clone(), arrival, generation) {
            Placed::Taken => {}
            Placed::Closed(arrival, ago) => {
                self.dead_letter_closed(id, arrival, generation.clone(), ago);
            }
            // Never: the queue's sessions wait for a slot. Dropped, the
            // receipt sends the message back to the queue.
            Placed::Full(arrival, _) => drop(arrival),
        }
    }

    /// Abandons every open and waiting session: their messages go back to
    /// the queue unsettled (the consumer stops, or moves to a new queue).
    pub(crate) fn abandon_all(&self) {
        self.set.abandon_all();
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
            .session_closed_arrival(&id, &arrival.envelope.message_id(), ago);
        let Arrival {
            envelope,
            receipt,
            permit,
            received_at,
            ..
        } = arrival;
        let verdict = Verdict::barred(Barred::SessionClosed {
            id: id.clone(),
            ago,
        });
        let settled = async move {
            let said = record::said(&verdict);
            let settler = &generation.settler;
            settler
                .settle_with(&envelope, receipt, verdict, annotation(&id))
                .await;
            if generation.recorder.wanted() {
                let source = record::source_of(&envelope);
                let mut entry = record::entry(&envelope, source, received_at, said, Vec::new());
                entry.session = Some(id);
                generation.recorder.settled(entry);
            }
        };
        spawn_held(&self.tracker, &self.abandon, permit, settled);
    }
}
