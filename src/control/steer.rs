//! What the admin endpoint needs of a running forwarder to steer its
//! group: the tokens it takes, the status, and a command carried out. The
//! pipeline implements it; the admin endpoint knows only this.

use super::command::{Command, Refusal};
use super::group::SubmitError;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;

/// Why a command was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    /// Refused: nothing written, nothing changed.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// It could not be carried to the group.
    #[error(transparent)]
    Submit(#[from] SubmitError),
}

/// A command's answer: the status once applied.
pub type Steered<'a> = Pin<Box<dyn Future<Output = Result<Value, SteerError>> + Send + 'a>>;

/// A running forwarder's group, as the admin endpoint steers it.
pub trait Steer: Send + Sync {
    /// The bearer tokens `/control` and `/registry` accept now (empty:
    /// they answer 403), or `None` with control off.
    fn tokens(&self) -> Option<Vec<String>>;

    /// The group's state as this instance holds it (`GET /control/status`).
    fn status(&self) -> Value;

    /// Checks `command`, carries it to the group and answers once this
    /// instance has applied it.
    fn command(&self, command: Command) -> Steered<'_>;
}
