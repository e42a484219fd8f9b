//! One supervised AMQP connection per broker and role.
//!
//! A [`Connector`] hands out channels on a live connection, connecting on
//! first use and again after the connection dies. A broker given as a
//! cluster's nodes (`uris`) connects to the first node that answers, in
//! order of preference; a lost connection moves to the next node at once
//! (the lost one is tried last). Only when no node answers does the
//! connector back off (jittered, exponential, capped), so a broker that is
//! down costs callers a fast failure rather than a connect timeout each.
//!
//! While connected to any node but the preferred one, the connector checks
//! the more preferred nodes every [`RETURN_CHECK`]; when one answers, new
//! channels open there at once (the connection's epoch changes, which
//! publishers and the consumer follow) and the old connection is closed
//! once the work on it has had [`DRAIN`] to finish, so returning fails
//! nothing in flight.
//!
//! For [`SETTLING`] after any connection but the first (a node lost, a
//! broker restarted, a return to the preferred node), the connector reads
//! as [`Connector::settling`]: quorum queues may still be electing leaders
//! in place of a lost node, and a nack then says nothing of the message.
//!
//! The connector also follows `connection.blocked` / `connection.unblocked`
//! (a broker resource alarm) and publishes the state on a watch channel:
//! publishes wait out an alarm instead of timing out, and consuming pauses.

mod attempt;
mod failure;
mod reconnect;

pub use attempt::connect_first;
pub use failure::{ConnectError, ConnectFailure};

use super::closing::close_connection;
use super::error::BrokerError;
use crate::backoff::Backoff;
use crate::config::BrokerSpec;
use crate::telemetry::Telemetry;
use failure::AttemptFailure;
use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection};
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often a connection on a less preferred node checks whether a more
/// preferred one answers again.
pub const RETURN_CHECK: Duration = Duration::from_secs(5);
/// How long a connection left for a more preferred node stays open, so
/// that confirms, acks and channels on it finish.
pub const DRAIN: Duration = Duration::from_secs(30);
/// How long after a new connection (other than the first) nacks are taken
/// for a quorum queue electing its leader: RabbitMQ's elections take a few
/// seconds; this leaves room for a loaded cluster.
pub const SETTLING: Duration = Duration::from_secs(30);

/// What a connection is for; consuming and publishing never share one, so a
/// blocked publisher connection cannot hold up acks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The inbound consumer.
    Consume,
    /// Publishing to endpoints and dead letters.
    Publish,
    /// Writing the journal.
    Journal,
    /// Reading the journal (`switchyard trace`).
    Trace,
    /// Following and writing the group's control stream.
    Control,
}

impl Role {
    /// As logs and metric labels name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Consume => "consume",
            Self::Publish => "publish",
            Self::Journal => "journal",
            Self::Trace => "trace",
            Self::Control => "control",
        }
    }
}

/// Whether the broker is blocking this connection's publishes, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocking {
    /// Blocked now.
    pub blocked: bool,
    /// When it last changed.
    pub since: Instant,
}

/// A broker connection that rebuilds itself.
pub struct Connector {
    spec: Arc<BrokerSpec>,
    role: Role,
    connection_name: String,
    state: Mutex<State>,
    /// Bumped on every new connection; publishers and the consumer move
    /// their channels when it changes under a live connection.
    epoch: watch::Sender<u64>,
    /// The same, read on every publish without a lock.
    epoch_now: AtomicU64,
    /// Until when nacks are taken for leader elections; see [`SETTLING`].
    settling_until: std::sync::Mutex<Option<Instant>>,
    /// Itself, for the task that returns to the preferred node.
    me: Weak<Connector>,
    /// Whether that task runs.
    returning: AtomicBool,
    /// Cancelled when the connector is closed: background waits end.
    closed: CancellationToken,
    blocking: Arc<watch::Sender<Blocking>>,
    /// The negotiated frame_max of the current connection; 0 before the first.
    frame_max: AtomicU32,
    /// A refusal ends the run (`--fail-fast` at start): it is logged as
    /// final, with no next try.
    refusal_final: AtomicBool,
    /// Where its background work (event listeners, closes) runs, awaited at
    /// shutdown.
    background: TaskTracker,
    telemetry: Telemetry,
}

struct State {
    connection: Option<Arc<Connection>>,
    /// The node the connection is on.
    node: usize,
    /// The node of a connection found dead, tried last next time.
    lost: Option<usize>,
    /// Connect attempts failed in a row, and the wait before the next.
    backoff: Backoff,
    /// The last attempt failed: until the backoff runs out, callers are
    /// told how, without a new attempt.
    waiting: Option<Waiting>,
}

/// A failed attempt and the end of the backoff after it.
struct Waiting {
    until: Instant,
    after: AttemptFailure,
}

impl Default for State {
    fn default() -> Self {
        Self {
            connection: None,
            node: 0,
            lost: None,
            backoff: Backoff::new(BACKOFF_FIRST, BACKOFF_MAX),
            waiting: None,
        }
    }
}

impl Connector {
    /// A connector; nothing is connected until first use. Its background
    /// work runs in `background`.
    pub fn new(
        spec: Arc<BrokerSpec>,
        instance: &str,
        role: Role,
        background: TaskTracker,
        telemetry: Telemetry,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            connection_name: format!("{instance}/{}/{}", role.as_str(), spec.name),
            spec,
            role,
            state: Mutex::new(State::default()),
            epoch: watch::Sender::new(0),
            epoch_now: AtomicU64::new(0),
            settling_until: std::sync::Mutex::new(None),
            me: me.clone(),
            returning: AtomicBool::new(false),
            closed: CancellationToken::new(),
            blocking: Arc::new(watch::Sender::new(Blocking {
                blocked: false,
                since: Instant::now(),
            })),
            frame_max: AtomicU32::new(0),
            refusal_final: AtomicBool::new(false),
            background,
            telemetry,
        })
    }

    /// With `on`, a refused connection is logged as the end of the run
    /// (the caller exits on it) rather than with its next try.
    pub fn refusal_final(&self, on: bool) {
        self.refusal_final.store(on, Ordering::Relaxed);
    }

    /// Returns once the backoff after a failed connect has run out, so that
    /// the caller's next use makes a new attempt (at once when none failed).
    pub async fn next_attempt(&self) {
        let retry_at = self.state.lock().await.waiting.as_ref().map(|w| w.until);
        if let Some(at) = retry_at {
            tokio::time::sleep_until(at).await;
        }
    }

    /// The largest frame the current connection accepts (0: not known yet).
    pub fn frame_max(&self) -> u32 {
        self.frame_max.load(Ordering::Relaxed)
    }

    /// The blocked state of the current connection, as it changes.
    pub fn blocking(&self) -> watch::Receiver<Blocking> {
        self.blocking.subscribe()
    }

    /// The broker's name.
    pub fn broker(&self) -> &str {
        &self.spec.name
    }

    /// Where the events of its connections and channels are logged.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// The user and vhost the broker's URIs name, for messages that say
    /// what permission to grant.
    pub fn identity(&self) -> (String, String) {
        match lapin::uri::AMQPUri::from_str(self.spec.secret_uri()) {
            Ok(uri) => (uri.authority.userinfo.username, uri.vhost),
            Err(_) => ("?".to_owned(), "?".to_owned()),
        }
    }

    /// The user the broker authenticates, when the URIs name it: the
    /// `user_id` its publishes may carry.
    pub fn user(&self) -> Option<String> {
        self.spec.user()
    }

    /// The current connection's epoch: it changes with every new
    /// connection, so a channel opened under an older one is on a
    /// connection being left.
    pub fn epoch(&self) -> u64 {
        self.epoch_now.load(Ordering::Acquire)
    }

    /// Whether the connection is new after a move, a loss or a restart
    /// ([`SETTLING`]): quorum queues may be electing leaders, and their
    /// nacks are no verdict on the message or the endpoint.
    pub fn settling(&self) -> bool {
        let until = *self
            .settling_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        until.is_some_and(|until| Instant::now() < until)
    }

    /// The epoch, as it changes.
    pub fn epochs(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    /// A new channel on a live connection, in confirm mode when `confirm`.
    /// Fails fast while a reconnect backoff is running.
    pub async fn channel(&self, confirm: bool, limit: Duration) -> Result<Channel, ConnectError> {
        let connection = self.connection().await?;
        let open = async {
            let channel = connection.create_channel().await?;
            if confirm {
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await?;
            }
            Ok::<_, lapin::Error>(channel)
        };
        // channel.open is not written while the broker blocks the connection.
        match within_unblocked(open, limit, self.blocking()).await {
            Some(Ok(channel)) => Ok(channel),
            // The connection died under channel.open: a connection-level
            // failure, which is what an endpoint's health must record.
            Some(Err(e)) if !connection.status().connected() => {
                self.discard(&connection, &e.to_string()).await;
                Err(ConnectError::Connect {
                    uri: self.spec.redacted_uri(),
                    failure: Arc::new(ConnectFailure::Amqp(e)),
                })
            }
            Some(Err(e)) => Err(ConnectError::Channel(BrokerError::from_lapin(&e))),
            // Not a reason to drop a connection other endpoints share: if it
            // is really dead, heartbeats and their publishes will say so.
            None => Err(ConnectError::ChannelTimeout(limit.as_millis())),
        }
    }
    /// Forgets `connection` (if still current) so the next use reconnects;
    /// closes it in the background.
    pub async fn discard(&self, connection: &Arc<Connection>, why: &str) {
        let mut state = self.state.lock().await;
        if state
            .connection
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, connection))
        {
            state.connection = None;
            tracing::debug!(broker = %self.spec.name, why, "discarding connection");
            let (c, telemetry) = (connection.clone(), self.telemetry.clone());
            self.background.spawn(async move {
                close_connection(&c, 320, "switchyard: reconnecting", &telemetry).await;
            });
        }
    }

    /// Closes the connection, if any, in the background (no generation
    /// uses this connector any more).
    pub fn close_later(self: &Arc<Self>) {
        self.closed.cancel();
        let connector = self.clone();
        self.background
            .spawn(async move { connector.close().await });
    }

    /// Closes the connection, if any (at shutdown).
    pub async fn close(&self) {
        self.closed.cancel();
        let connection = self.state.lock().await.connection.take();
        if let Some(c) = connection {
            close_connection(&c, 200, "switchyard: shutdown", &self.telemetry).await;
        }
    }
}

/// Runs `work` for up to `limit`, not counting time while the broker blocks
/// the connection (a resource alarm is waited out, not a timeout); `None`
/// when the limit ran out. The clock restarts when a block lifts, since the
/// broker then works through everything it held.
pub async fn within_unblocked<F: Future>(
    work: F,
    limit: Duration,
    mut blocking: watch::Receiver<Blocking>,
) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    let mut deadline = Instant::now() + limit;
    loop {
        tokio::select! {
            biased;
            done = &mut work => return Some(done),
            () = tokio::time::sleep_until(deadline) => {
                let state = *blocking.borrow_and_update();
                if state.blocked {
                    tokio::select! {
                        done = &mut work => return Some(done),
                        _ = blocking.wait_for(|b| !b.blocked) => {}
                    }
                    deadline = Instant::now() + limit;
                } else if state.since + limit > Instant::now() {
                    deadline = state.since + limit;
                } else {
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
