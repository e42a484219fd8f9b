//! The confirm deadlines of one endpoint's publishes, kept by its actor
//! with one timer.

use super::request::Mode;
use crate::broker::connector::Blocking;
use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

/// Every publish's confirm deadline, kept by the actor with one timer for
/// the endpoint. A timer per publish in the caller (with its own watch of
/// the blocked state and a command back on timeout) cost about 3% of the
/// seed scenario's instructions per message (BENCHMARKS.md, "Profile").
///
/// A publish is overdue once its deadline has passed and the connection
/// is not blocked, and has not been blocked within the last
/// `confirm_timeout`: the clock stands still during a resource alarm and
/// restarts in full when it lifts. While blocked, the timer looks again
/// every `confirm_timeout`, so it never looks later than the moment the
/// first publish could be due after the block lifts.
///
/// Normal publishes count from their call and are kept in the order they
/// went out, which is their call order (to within the moment between
/// taking the time and queueing the command). Suspects go out one at a
/// time and count from when they leave. The task sweeps between its other
/// steps: while it opens a channel (itself bounded by `confirm_timeout`),
/// an overdue publish is failed only once that is done.
pub(super) struct Deadlines {
    limit: Duration,
    normal: VecDeque<(Instant, u64)>,
    alone: Option<(Instant, u64)>,
    blocking: watch::Receiver<Blocking>,
    pub(super) timer: Pin<Box<Sleep>>,
    /// Whether `timer` is set: some publish is pending.
    pub(super) armed: bool,
}

impl Deadlines {
    pub(super) fn new(limit: Duration, blocking: watch::Receiver<Blocking>) -> Self {
        Self {
            limit,
            normal: VecDeque::new(),
            alone: None,
            blocking,
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            armed: false,
        }
    }

    pub(super) fn push(&mut self, mode: Mode, deadline: Instant, id: u64) {
        match mode {
            Mode::Normal => self.normal.push_back((deadline, id)),
            Mode::Alone => self.alone = Some((deadline, id)),
        }
        if !self.armed {
            self.arm(deadline);
        }
    }

    /// When the earliest pending publish is due, given the blocked state.
    fn due(&self, deadline: Instant) -> Option<Instant> {
        let state = *self.blocking.borrow();
        (!state.blocked).then(|| deadline.max(state.since + self.limit))
    }

    fn arm(&mut self, deadline: Instant) {
        let at = self
            .due(deadline)
            .unwrap_or_else(|| Instant::now() + self.limit);
        self.timer.as_mut().reset(at);
        self.armed = true;
    }

    /// Drops deadlines of publishes already decided, from the front.
    pub(super) fn forget_settled(&mut self, waiting: impl Fn(u64) -> bool + Copy) {
        while let Some((_, id)) = self.normal.front() {
            if waiting(*id) {
                break;
            }
            self.normal.pop_front();
        }
        if self.alone.is_some_and(|(_, id)| !waiting(id)) {
            self.alone = None;
        }
    }

    /// The next overdue publish still waiting, taken off the list.
    pub(super) fn pop_due(&mut self, waiting: impl Fn(u64) -> bool + Copy) -> Option<u64> {
        self.forget_settled(waiting);
        let now = Instant::now();
        let overdue = |entry: Option<(Instant, u64)>| {
            entry.filter(|(deadline, _)| self.due(*deadline).is_some_and(|at| at <= now))
        };
        if let Some((_, id)) = overdue(self.alone) {
            self.alone = None;
            return Some(id);
        }
        let (_, id) = overdue(self.normal.front().copied())?;
        self.normal.pop_front();
        Some(id)
    }

    /// Sets the timer for the earliest deadline still pending, if any.
    pub(super) fn rearm(&mut self, waiting: impl Fn(u64) -> bool + Copy) {
        self.forget_settled(waiting);
        let earliest = [self.alone, self.normal.front().copied()]
            .into_iter()
            .flatten()
            .map(|(deadline, _)| deadline)
            .min();
        match earliest {
            Some(deadline) => self.arm(deadline),
            None => self.armed = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Blocking, Deadlines, Mode};
    use std::collections::HashSet;
    use std::time::Duration;
    use tokio::sync::watch;
    use tokio::time::{Instant, advance};

    const LIMIT: Duration = Duration::from_secs(5);

    /// The publishes still waiting for their outcome, by id.
    fn waiting(ids: &[u64]) -> HashSet<u64> {
        ids.iter().copied().collect()
    }

    fn unblocked_long_ago() -> watch::Sender<Blocking> {
        watch::Sender::new(Blocking {
            blocked: false,
            since: Instant::now(),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_is_due_at_its_deadline_and_a_settled_one_never() {
        let blocking = unblocked_long_ago();
        advance(LIMIT).await;
        let mut deadlines = Deadlines::new(LIMIT, blocking.subscribe());
        let now = Instant::now();
        deadlines.push(Mode::Normal, now + LIMIT, 1);
        deadlines.push(Mode::Normal, now + LIMIT, 2);
        deadlines.push(Mode::Alone, now + 2 * LIMIT, 3);
        assert!(deadlines.armed);
        let mut waiting = waiting(&[2, 3]);
        advance(LIMIT - Duration::from_millis(1)).await;
        assert_eq!(
            deadlines.pop_due(|id| waiting.contains(&id)),
            None,
            "not yet"
        );
        advance(Duration::from_millis(1)).await;
        assert_eq!(
            deadlines.pop_due(|id| waiting.contains(&id)),
            Some(2),
            "1 was settled"
        );
        waiting.remove(&2);
        assert_eq!(deadlines.pop_due(|id| waiting.contains(&id)), None);
        deadlines.rearm(|id| waiting.contains(&id));
        assert_eq!(deadlines.timer.deadline(), now + 2 * LIMIT);
        advance(LIMIT).await;
        assert_eq!(deadlines.pop_due(|id| waiting.contains(&id)), Some(3));
        waiting.remove(&3);
        deadlines.rearm(|id| waiting.contains(&id));
        assert!(!deadlines.armed, "nothing pending");
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_stands_still_while_blocked_and_restarts_when_it_lifts() {
        let blocking = unblocked_long_ago();
        advance(LIMIT).await;
        let mut deadlines = Deadlines::new(LIMIT, blocking.subscribe());
        let waiting = waiting(&[1]);
        deadlines.push(Mode::Normal, Instant::now() + LIMIT, 1);
        blocking.send_replace(Blocking {
            blocked: true,
            since: Instant::now(),
        });
        advance(3 * LIMIT).await;
        assert_eq!(
            deadlines.pop_due(|id| waiting.contains(&id)),
            None,
            "blocked"
        );
        deadlines.rearm(|id| waiting.contains(&id));
        assert!(deadlines.armed, "looks again while blocked");
        assert_eq!(deadlines.timer.deadline(), Instant::now() + LIMIT);
        let lifted = Instant::now();
        blocking.send_replace(Blocking {
            blocked: false,
            since: lifted,
        });
        advance(LIMIT - Duration::from_millis(1)).await;
        assert_eq!(
            deadlines.pop_due(|id| waiting.contains(&id)),
            None,
            "a full limit after the block"
        );
        deadlines.rearm(|id| waiting.contains(&id));
        assert_eq!(deadlines.timer.deadline(), lifted + LIMIT);
        advance(Duration::from_millis(1)).await;
        assert_eq!(deadlines.pop_due(|id| waiting.contains(&id)), Some(1));
    }
}
