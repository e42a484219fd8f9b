//! One long-lived confirm channel per endpoint, driven by a single task.
//!
//! Publishes are started in the order [`Publisher::publish`] is called and
//! many stay in flight at once. Every copy carries `x-switchyard-publish-id`
//! so a `basic.return` is attributed to the publish it names, whichever
//! confirm lapin happened to attach it to: a confirm is a delivery only when
//! it is an ack and no return names its publish (see `Actor::harvest` for
//! why that needs a fence on lapin's acknowledgement lock).
//!
//! One bad message must not harm the others. A content header too large
//! for the connection's `frame_max` is refused before it is sent. When the
//! broker closes a channel in a way one message may have caused (406, frame
//! errors), every publish in flight on it fails as a *suspect*; the caller
//! retries each [`Mode::Alone`]: on a second channel, one at a time, so a
//! failure there is that message's own and is reported as
//! [`PublishFailure::Rejected`].
//!
//! The task also keeps the endpoint's [`EndpointHealth`]: down on a
//! connection or channel failure, probed every `probe_interval_ms` while
//! down and not drained, up again on a working probe or a confirmed
//! publish. Confirm timeouts do not run while the broker blocks the
//! connection; the task keeps every publish's deadline itself (see
//! `deadlines`).
//!
//! - `request`: what a publisher is asked and how an attempt fails.
//! - `actor`: the task: channels, publishes in flight, health.
//! - `confirms` and `attribution`: confirms and returns, matched to their
//!   publishes.
//! - `deadlines`: confirm timeouts, one timer per endpoint.
//! - `probing`: a down endpoint checked in the background.

mod actor;
mod attribution;
mod confirms;
mod deadlines;
mod probing;
mod request;

pub use request::{Mode, PublishFailure, Refusal};

use super::connector::Connector;
use super::health::EndpointHealth;
use crate::amqp::{AmqpValue, ShortString};
use crate::destination::Endpoint;
use crate::envelope::Envelope;
use crate::telemetry::Telemetry;
use actor::Actor;
use deadlines::Deadlines;
use request::{Command, Request};
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

static NEXT_PUBLISH_ID: AtomicU64 = AtomicU64::new(1);

/// Handle to an endpoint's publishing task. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    endpoint: Arc<Endpoint>,
    commands: mpsc::UnboundedSender<Command>,
    health: Arc<EndpointHealth>,
}

impl Publisher {
    /// Spawns the endpoint's task. It stops when every handle is dropped and
    /// its confirms are in, or at once when `stop` is cancelled.
    pub fn spawn(
        endpoint: Arc<Endpoint>,
        connector: Arc<Connector>,
        health: Arc<EndpointHealth>,
        stop: CancellationToken,
        background: &TaskTracker,
        telemetry: Telemetry,
    ) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let actor = Actor {
            deadlines: Deadlines::new(endpoint.confirm_timeout, connector.blocking()),
            exchange: endpoint.exchange.as_str().into(),
            routing_key: endpoint.routing_key.as_str().into(),
            user: connector.user().map(|u| u.as_str().into()),
            endpoint: endpoint.clone(),
            connector,
            health: health.clone(),
            channel: None,
            channel_epoch: 0,
            alone_epoch: 0,
            generation: 0,
            channel_opened: Instant::now(),
            settling_logged: 0,
            alone_channel: None,
            alone_queue: VecDeque::new(),
            alone_busy: None,
            waiting: HashMap::default(),
            returned: HashMap::default(),
            batch: Vec::new(),
            late: Vec::new(),
            rx,
            commands: commands.downgrade(),
            next_probe: None,
            probe_running: false,
            stop,
            background: background.clone(),
            telemetry,
        };
        background.spawn(actor.run());
        Self {
            endpoint,
            commands,
            health,
        }
    }

    /// The endpoint this publisher sends to.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// The endpoint's health.
    pub fn health(&self) -> &EndpointHealth {
        &self.health
    }

    /// Starts publishing one copy of `envelope` now, in call order, and
    /// returns its outcome: `Ok` once confirmed and not returned. The
    /// confirm timeout runs from this call ([`Mode::Alone`]: from when it
    /// leaves) and stands still while the broker blocks the connection.
    pub fn publish(
        &self,
        envelope: Arc<Envelope>,
        extra_headers: Vec<(ShortString, AmqpValue)>,
        mode: Mode,
    ) -> impl Future<Output = Result<(), PublishFailure>> + Send + 'static {
        let (reply, outcome) = oneshot::channel();
        let request = Request {
            id: NEXT_PUBLISH_ID.fetch_add(1, Ordering::Relaxed),
            envelope,
            extra_headers,
            mode,
            reply,
            called_at: Instant::now(),
        };
        let queued = self.commands.send(Command::Publish(request)).is_ok();
        async move {
            if !queued {
                return Err(PublishFailure::Stopped);
            }
            outcome.await.unwrap_or(Err(PublishFailure::Stopped))
        }
    }
}
