//! Outage waits: a branch whose every endpoint is unreachable holds its
//! message instead of failing it, counted here, so that consuming pauses
//! while any branch waits and resumes when none does.

use crate::broker::{Health, Publish};
use crate::routing::BranchPlan;
use crate::telemetry::Telemetry;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How many branches wait out an outage now, across every generation.
#[derive(Clone, Default)]
pub struct Outages {
    waiting: Arc<watch::Sender<usize>>,
}

impl Outages {
    /// Whether some branch waits out an outage now.
    pub fn any(&self) -> bool {
        *self.waiting.borrow() > 0
    }

    /// Returns once no branch waits out an outage.
    pub async fn none(&self) {
        let _ = self.waiting.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Waits, counted as waiting, until an endpoint of `plan` is up (a
    /// probe found it working) or `lost` is cancelled.
    pub(super) async fn wait_for_recovery(
        &self,
        publish: &dyn Publish,
        plan: &BranchPlan,
        message_id: &str,
        lost: &CancellationToken,
        telemetry: &Telemetry,
    ) {
        telemetry.outage_wait(message_id, &plan.name);
        self.waiting.send_modify(|n| *n += 1);
        let mut changes = publish.health_changes();
        while !plan.endpoints().any(|e| publish.health(e) == Health::Up) {
            tokio::select! {
                () = lost.cancelled() => break,
                changed = changes.changed() => if changed.is_err() { break },
            }
        }
        self.waiting.send_modify(|n| *n -= 1);
        telemetry.outage_over(message_id, &plan.name);
    }
}

/// Whether every endpoint of `plan` is unreachable at the connection level
/// (an outage, not a refusal).
pub(super) fn all_unreachable(publish: &dyn Publish, plan: &BranchPlan) -> bool {
    plan.endpoints()
        .all(|e| publish.health(e) == Health::Unreachable)
}
