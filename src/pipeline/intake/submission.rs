//! What [`super::Intake::submit`] answers (a delivery to run, or why the
//! message was not taken) and the branches a submitted message takes.

use crate::envelope::Envelope;
use crate::pipeline::generation::Generation;
use crate::pipeline::outcome::{Barred, Outcome};
use crate::routing::{BranchPlan, Outage};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The rest of a delivery: every branch to its outcome.
pub type Delivery = Pin<Box<dyn Future<Output = Result<Outcome, NotTaken>> + Send>>;

/// Why a message was not taken; nothing of it was published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotTaken {
    /// A publishing broker blocks publishers (a resource alarm).
    #[error("a broker blocks publishers (resource alarm); try again later")]
    Blocked,
    /// The forwarder has not prepared its topology yet, or is stopping.
    #[error("the forwarder is starting or stopping; try again in a moment")]
    Starting,
    /// The forwarder is stopping.
    #[error("the forwarder is stopping")]
    Stopping,
    /// The screen, the filter table (`no-route`) or its session bars it.
    #[error("{0}")]
    Barred(Barred),
    /// Every session slot is taken.
    #[error("{0} sessions are open, the most sessions.max_open allows; try again later")]
    SessionsFull(u32),
}

/// A submitted message: the branches it goes to and its delivery.
pub struct Submitted {
    /// Branch names, in filter-table order (the skipped ones left out).
    pub branches: Vec<Arc<str>>,
    /// Runs every branch to its outcome.
    pub delivery: Delivery,
}

/// The branches `envelope` takes under `generation`, less `skip`, each
/// ending at once on an outage.
pub(super) fn plans(
    generation: &Generation,
    envelope: &Envelope,
    skip: &[String],
) -> Result<Vec<BranchPlan>, NotTaken> {
    let (plans, unparsable_body) = generation.settings.routing.route_reading_body(envelope);
    if plans.is_empty() {
        return Err(NotTaken::Barred(Barred::NoRoute { unparsable_body }));
    }
    Ok(plans
        .into_iter()
        .filter(|p| !skip.iter().any(|s| **s == *p.name))
        .map(|mut plan| {
            plan.outage = Outage::DeadLetter { after: None };
            plan
        })
        .collect())
}
