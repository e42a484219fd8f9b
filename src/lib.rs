//! switchyard: a transactional multicast forwarder for RabbitMQ.
//!
//! Work items are consumed from an inbound queue under peek-lock, matched
//! against a filter table, and multicast to every matching branch's
//! endpoint with publisher confirms and the mandatory flag. The inbound
//! message is acked only when every branch is confirmed; a failed branch
//! walks its backup list; an exhausted list dead-letters the message with
//! the reason.
//!
//! # Layout
//!
//! - [`config`]: the TOML file (raw serde types) and its compilation into
//!   [`config::Settings`], which cannot be invalid.
//! - [`routing`]: filters and the compiled filter table. Pure, no I/O.
//! - [`envelope`]: the inbound message as the pipeline sees it.
//! - [`pipeline`]: consume → route → deliver → settle.
//! - [`broker`]: every lapin type: connections, confirm channels, the
//!   consumer and its acks, topology.
//! - [`telemetry`]: log events and metrics, named once.
//! - [`dlq`]: `dlq inspect` and `dlq redrive`, the dead-letter queue read
//!   in place.
//!
//! The binary is thin: it parses the command line, loads the configuration
//! and calls [`run`].

#![forbid(unsafe_code)]

pub mod broker;
pub mod config;
pub mod dlq;
pub mod envelope;
pub mod pipeline;
pub mod routing;
pub mod telemetry;

pub use pipeline::{Forwarder, RunError};

use std::future::Future;
use tokio_util::sync::CancellationToken;

/// Runs the forwarder on `settings` until `shutdown` completes, then stops
/// consuming, drains in-flight transactions (bounded by
/// `shutdown_timeout_ms`) and closes its connections.
pub async fn run(
    settings: config::Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let token = CancellationToken::new();
    let trigger = token.clone();
    let signal = tokio::spawn(async move {
        shutdown.await;
        trigger.cancel();
    });
    let result = Forwarder::new(settings).run(token).await;
    signal.abort();
    result
}
