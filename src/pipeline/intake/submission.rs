//! What [`super::Intake::submit`] answers: a delivery to run, or why the
//! message was not taken.

use crate::pipeline::outcome::{Barred, Outcome};
use crate::pipeline::sessions::Refused;
use std::future::Future;
use std::pin::Pin;

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
    /// The journal cannot record it now (`on_unavailable = "hold"`).
    #[error(
        "the journal cannot be written now (journal.on_unavailable = \"hold\"); try again later"
    )]
    Unrecorded,
    /// An operator paused the group.
    #[error(
        "the forwarder is paused by an operator (POST /control/resume resumes it); try again later"
    )]
    Paused,
    /// Every session slot is taken.
    #[error("{0} sessions are open, the most sessions.max_open allows; try again later")]
    SessionsFull(u32),
}

impl From<Refused> for NotTaken {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::Barred(barred) => Self::Barred(barred),
            Refused::Full(max_open) => Self::SessionsFull(max_open),
            Refused::Stopping => Self::Stopping,
        }
    }
}
