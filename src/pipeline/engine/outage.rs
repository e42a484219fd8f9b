//! Outage holds: a branch whose list an outage exhausted (every endpoint it
//! tried failed because its broker was unreachable, lost, stalled or
//! refused the forwarder's own user) holds its message instead of failing
//! it. Holds are counted here, so that consuming pauses while any branch
//! holds and resumes when none does.

use crate::backoff::Backoff;
use crate::broker::{Health, Publish};
use crate::destination::Endpoint;
use crate::telemetry::Telemetry;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The shortest and longest pause between two tries of a held branch's
/// list: an endpoint whose health has not caught up with the outage yet
/// (it still reads up) is not hammered.
const PAUSE_FIRST: Duration = Duration::from_millis(100);
const PAUSE_MAX: Duration = Duration::from_secs(5);

/// How many branches hold a message for an outage now, across every
/// generation.
#[derive(Clone)]
pub struct Outages {
    holding: Arc<watch::Sender<usize>>,
    telemetry: Telemetry,
}

/// How a hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HoldEnd {
    /// An endpoint of the list is up again: try the list again.
    Recovered,
    /// The inbound channel was lost: the broker redelivers the message.
    Lost,
    /// The branch's `outage_timeout_ms` ran out.
    Expired,
}

/// One branch's hold of one message, across the tries of its list.
pub(super) struct Hold {
    /// When the outage first exhausted the list.
    pub since: Instant,
    pause: Backoff,
}

impl Hold {
    pub(super) fn new() -> Self {
        Self {
            since: Instant::now(),
            pause: Backoff::new(PAUSE_FIRST, PAUSE_MAX),
        }
    }
}

impl Outages {
    /// No branch holds anything yet.
    pub fn new(telemetry: Telemetry) -> Self {
        Self {
            holding: Arc::new(watch::Sender::new(0)),
            telemetry,
        }
    }

    /// Whether some branch holds a message for an outage now.
    pub fn any(&self) -> bool {
        *self.holding.borrow() > 0
    }

    /// Returns once no branch holds a message for an outage.
    pub async fn none(&self) {
        let _ = self.holding.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Holds, counted as holding, until one of `waiting_for` (the
    /// endpoints of the list that did not refuse the message) is up (and a
    /// pause since the last try has passed), `lost` is cancelled, or
    /// `deadline` passes.
    pub(super) async fn hold(
        &self,
        publish: &dyn Publish,
        waiting_for: &[&Arc<Endpoint>],
        hold: &mut Hold,
        lost: &CancellationToken,
        deadline: Option<Instant>,
    ) -> HoldEnd {
        let _counted = Counted::new(self);
        let pause_until = Instant::now() + hold.pause.next_delay();
        let mut changes = publish.health_changes();
        loop {
            let paused = Instant::now() < pause_until;
            if !paused && waiting_for.iter().any(|e| publish.health(e) == Health::Up) {
                return HoldEnd::Recovered;
            }
            tokio::select! {
                () = lost.cancelled() => return HoldEnd::Lost,
                () = sleep_until_some(deadline) => return HoldEnd::Expired,
                () = tokio::time::sleep_until(pause_until), if paused => {}
                changed = changes.changed() => if changed.is_err() {
                    return HoldEnd::Lost;
                },
            }
        }
    }
}

impl Outages {
    /// Counts one holder while the returned guard lives (a message waiting
    /// for an endpoint to be registered).
    pub fn counted(&self) -> impl Drop + '_ {
        Counted::new(self)
    }

    /// Counted as holding, waits `delay` before a transient failure's
    /// endpoint is tried again; false when `lost` is cancelled first.
    pub(super) async fn pause(&self, delay: Duration, lost: &CancellationToken) -> bool {
        let _counted = Counted::new(self);
        tokio::select! {
            () = lost.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }
}

/// One branch counted as holding while it lives; the first and the last
/// holder of an outage say so once for all the messages held.
struct Counted<'a>(&'a Outages);

impl<'a> Counted<'a> {
    fn new(outages: &'a Outages) -> Self {
        outages.count(|n| n + 1);
        Self(outages)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.count(|n| n.saturating_sub(1));
    }
}

impl Outages {
    fn count(&self, change: impl FnOnce(usize) -> usize) {
        self.holding.send_modify(|n| {
            let before = *n;
            *n = change(before);
            self.telemetry.outage_holds(*n, before);
        });
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
