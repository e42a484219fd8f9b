//! Control: what operators and services tell a running group of
//! instances (pause and resume, drain and undrain an endpoint, register
//! and unregister a service instance), carried to every instance through
//! a RabbitMQ stream and applied by each in the same order.
//!
//! - `record`: what travels on the stream, one JSON record per message.
//! - `state`: the group's state; `apply`: each record's change to it (pure).
//! - `base`: where a follower's knowledge starts: the stream's first
//!   record, or a snapshot once retention trimmed it (pure).
//! - `command`: a request checked against the configuration and the state
//!   before anything is written; a refusal changes nothing.
//! - `group`: one instance following the stream, recovering the state in
//!   force before it takes work, and telling the pipeline what changed.
//! - `steer`: what the admin endpoint needs of a running forwarder.

mod apply;
mod base;
pub mod command;
pub mod group;
pub mod record;
pub mod state;
mod steer;

pub use apply::Changed;
pub use command::{Command, Refusal, RegisterRequest};
pub use group::{Group, Registered, SubmitError};
pub use state::{GroupState, Registration};
pub use steer::{Steer, SteerError, Steered};
