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

use super::closing::close_connection;
use super::error::{BrokerError, Fault};
use super::tls::TlsFailure;
use crate::backoff::Backoff;
use crate::config::BrokerSpec;
use crate::telemetry::Telemetry;
use futures_util::StreamExt;
use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection, ConnectionProperties, Event};
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{Mutex, watch};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
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

/// Why no channel could be had from a broker.
///
/// [`Self::Refused`] is not transient: the broker refuses the credentials
/// or the vhost, and only a change of the configuration (or of the broker)
/// helps. It is tried again at the slowest pace, and ends the run at start
/// with `--fail-fast`. Every other variant is transient: the caller fails
/// over (or, for the consumer, retries later).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConnectError {
    /// The broker refused the credentials or the vhost: retrying will not
    /// help until the configuration changes.
    #[error("broker \"{broker}\" refused the connection: {refusal}")]
    Refused {
        /// The broker's name.
        broker: String,
        /// What the broker refused and what to fix.
        #[source]
        refusal: Arc<AccessRefusal>,
    },
    /// The connection attempt failed or timed out.
    #[error("cannot connect to {uri}: {failure}")]
    Connect {
        /// The broker URI, password masked.
        uri: String,
        /// Why.
        #[source]
        failure: Arc<ConnectFailure>,
    },
    /// A recent attempt failed and the backoff has not run out yet.
    #[error("broker \"{broker}\" unreachable, reconnecting: {last}")]
    BackingOff {
        /// The broker's name.
        broker: String,
        /// Why the last attempt failed.
        #[source]
        last: Arc<ConnectFailure>,
    },
    /// The connection is up but refused or dropped `channel.open`.
    #[error("cannot open a channel: {0}")]
    Channel(#[source] BrokerError),
    /// `channel.open` (or `confirm.select`) was not answered in time.
    #[error("no answer to channel.open within {0} ms")]
    ChannelTimeout(u128),
}

impl ConnectError {
    /// What went wrong in words that say what to fix, without the broker's
    /// name in front: a refusal's reason, or the error itself.
    pub fn reason(&self) -> String {
        match self {
            Self::Refused { refusal, .. } => refusal.to_string(),
            other => other.to_string(),
        }
    }
}

/// Why an attempt to connect made no connection, the broker not having
/// refused it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConnectFailure {
    /// The AMQP client's error: nothing listens, the socket was reset, the
    /// connection closed under `channel.open`...
    #[error(transparent)]
    Amqp(lapin::Error),
    /// The TLS handshake failed.
    #[error(transparent)]
    Tls(TlsFailure),
    /// No answer within the connect timeout.
    #[error("no answer within {} s", .0.as_secs())]
    Timeout(Duration),
    /// The broker has no node to connect to.
    #[error("no node configured")]
    NoNode,
}

/// A broker's refusal of the credentials or the vhost, in words that say
/// what to fix, with what the broker said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessRefusal {
    /// The user or the password is wrong.
    #[error(
        "authentication refused by broker {at}: check the user and password in {} (broker: {})",
        .at.key(),
        .said.text
    )]
    Credentials {
        /// Which broker refused.
        at: RefusedAt,
        /// What it said.
        said: BrokerError,
    },
    /// The vhost does not exist.
    #[error(
        "vhost refused by broker {at}: vhost \"{vhost}\" does not exist; create it \
         (rabbitmqctl add_vhost) or fix the vhost in {} (broker: {})",
        .at.key(),
        .said.text
    )]
    NoVhost {
        /// Which broker refused.
        at: RefusedAt,
        /// The vhost the URI names.
        vhost: String,
        /// What it said.
        said: BrokerError,
    },
    /// The user may not use the vhost.
    #[error(
        "vhost refused by broker {at}: user \"{user}\" may not use vhost \"{vhost}\"; \
         grant it permissions (rabbitmqctl set_permissions) or fix {} (broker: {})",
        .at.key(),
        .said.text
    )]
    Vhost {
        /// Which broker refused.
        at: RefusedAt,
        /// The user the URI names.
        user: String,
        /// The vhost the URI names.
        vhost: String,
        /// What it said.
        said: BrokerError,
    },
}

/// The broker that refused a connection, and where its URIs are set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedAt {
    /// The broker's name.
    pub broker: String,
    /// The node that refused, named only for a cluster's nodes (one node
    /// is the broker).
    pub node: Option<String>,
    /// The key of its URIs: `uri` or `uris`.
    pub uri_key: &'static str,
}

impl RefusedAt {
    /// The setting that holds the credentials and the vhost.
    fn key(&self) -> String {
        format!("brokers.{}.{}", self.broker, self.uri_key)
    }
}

impl std::fmt::Display for RefusedAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.broker)?;
        match &self.node {
            Some(node) => write!(f, " (node {node})"),
            None => Ok(()),
        }
    }
}

/// What a connection is for; consuming and publishing never share one, so a
/// blocked publisher connection cannot hold up acks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The inbound consumer.
    Consume,
    /// Publishing to endpoints and dead letters.
    Publish,
}

impl Role {
    /// As logs and metric labels name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Consume => "consume",
            Self::Publish => "publish",
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

/// Why one attempt to connect to a node failed.
#[derive(Debug)]
enum AttemptFailure {
    /// The broker refused the credentials or the vhost: callers are told
    /// so, not "unreachable".
    Refused(Arc<AccessRefusal>),
    /// No connection, for another reason.
    Failed(Arc<ConnectFailure>),
}

impl AttemptFailure {
    /// As callers are told it: naming the broker, or the node's URI.
    fn error(&self, spec: &BrokerSpec, node: usize) -> ConnectError {
        match self {
            Self::Refused(refusal) => ConnectError::Refused {
                broker: spec.name.clone(),
                refusal: refusal.clone(),
            },
            Self::Failed(failure) => ConnectError::Connect {
                uri: spec.redacted_uri_of(node),
                failure: failure.clone(),
            },
        }
    }

    /// As callers are told it while the backoff after it runs.
    fn backing_off(&self, broker: &str) -> ConnectError {
        match self {
            Self::Refused(refusal) => ConnectError::Refused {
                broker: broker.to_owned(),
                refusal: refusal.clone(),
            },
            Self::Failed(failure) => ConnectError::BackingOff {
                broker: broker.to_owned(),
                last: failure.clone(),
            },
        }
    }
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

    /// The live connection, connecting if needed: to the first node that
    /// answers, in order of preference, the node just lost last.
    pub async fn connection(&self) -> Result<Arc<Connection>, ConnectError> {
        let mut state = self.state.lock().await;
        if let Some(c) = &state.connection {
            if c.status().connected() {
                return Ok(c.clone());
            }
            state.connection = None;
            state.lost = Some(state.node);
        }
        if let Some(waiting) = &state.waiting
            && Instant::now() < waiting.until
        {
            return Err(waiting.after.backing_off(&self.spec.name));
        }
        let order = preference(self.spec.nodes(), state.lost);
        let mut failed = None;
        for (place, &node) in order.iter().enumerate() {
            match connect_once(&self.spec, node, self.properties()).await {
                Ok(connection) => {
                    let was_down = state.backoff.failures() > 0 || state.lost.is_some();
                    return Ok(self.adopt(&mut state, node, connection, was_down));
                }
                Err(error) => {
                    if let Some(&next) = order.get(place + 1) {
                        let next = self.spec.node_of(next);
                        self.telemetry.broker_node_failed(
                            &self.spec.name,
                            &self.spec.node_of(node),
                            &self.spec.redacted_uri_of(node),
                            &error.error(&self.spec, node).reason(),
                            &next,
                        );
                    }
                    failed = Some((node, error));
                }
            }
        }
        let Some((node, error)) = failed else {
            return Err(ConnectError::BackingOff {
                broker: self.spec.name.clone(),
                last: Arc::new(ConnectFailure::NoNode),
            });
        };
        let refused = matches!(error, AttemptFailure::Refused(_));
        let delay = state.backoff.next_delay();
        // A refusal needs a configuration change: retried at the slowest pace.
        let delay = if refused { BACKOFF_MAX } else { delay };
        let broker = &self.spec.name;
        let (name, uri) = (self.spec.node_of(node), self.spec.redacted_uri_of(node));
        let retry_in = (!(refused && self.refusal_final.load(Ordering::Relaxed))).then_some(delay);
        match &error {
            AttemptFailure::Refused(refusal) => {
                let reason = refusal.to_string();
                self.telemetry
                    .broker_refused(broker, &name, &uri, &reason, retry_in);
            }
            AttemptFailure::Failed(failure) => {
                let reason = failure.to_string();
                self.telemetry
                    .broker_unreachable(broker, &name, &uri, &reason, delay);
            }
        }
        let told = error.error(&self.spec, node);
        state.waiting = Some(Waiting {
            until: Instant::now() + delay,
            after: error,
        });
        Err(told)
    }

    fn properties(&self) -> ConnectionProperties {
        ConnectionProperties::default().with_connection_name(self.connection_name.clone().into())
    }

    /// Makes `connection`, on `node`, the current one: a new epoch, a new
    /// blocked state, the node in logs and metrics.
    fn adopt(
        &self,
        state: &mut State,
        node: usize,
        connection: Connection,
        was_down: bool,
    ) -> Arc<Connection> {
        let connection = Arc::new(connection);
        self.follow_blocking(&connection);
        self.frame_max
            .store(connection.configuration().frame_max(), Ordering::Relaxed);
        *state = State {
            connection: Some(connection.clone()),
            node,
            ..State::default()
        };
        self.epoch.send_modify(|n| {
            *n += 1;
            self.epoch_now.store(*n, Ordering::Release);
            if *n > 1 {
                *self
                    .settling_until
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some(Instant::now() + SETTLING);
            }
        });
        let nodes: Vec<String> = (0..self.spec.nodes())
            .map(|i| self.spec.node_of(i))
            .collect();
        self.telemetry
            .broker_node(&self.spec.name, self.role.as_str(), &nodes, node);
        if was_down {
            self.telemetry.broker_reconnected(
                &self.spec.name,
                &self.spec.node_of(node),
                &self.spec.redacted_uri_of(node),
            );
        }
        if node > 0 {
            self.return_in_background();
        }
        connection
    }

    /// Starts, once, the task that brings the connection back to a more
    /// preferred node when one answers.
    fn return_in_background(&self) {
        let Some(me) = self.me.upgrade() else { return };
        if self.returning.swap(true, Ordering::Relaxed) {
            return;
        }
        self.background.spawn(async move {
            let closed = me.closed.clone();
            tokio::select! {
                () = closed.cancelled() => {}
                () = me.return_to_preferred() => {}
            }
        });
    }

    /// Every [`RETURN_CHECK`] while on a less preferred node: tries the
    /// more preferred ones in order and moves to the first that answers.
    async fn return_to_preferred(&self) {
        loop {
            tokio::time::sleep(RETURN_CHECK).await;
            let current = {
                let state = self.state.lock().await;
                match &state.connection {
                    Some(c) if c.status().connected() => state.node,
                    _ => continue,
                }
            };
            for node in 0..current {
                let Ok(connection) = connect_once(&self.spec, node, self.properties()).await else {
                    continue;
                };
                let mut state = self.state.lock().await;
                let still = state.node == current
                    && state
                        .connection
                        .as_ref()
                        .is_some_and(|c| c.status().connected());
                if !still {
                    let connection = Arc::new(connection);
                    let telemetry = self.telemetry.clone();
                    self.background.spawn(async move {
                        close_connection(&connection, 200, "switchyard: not needed", &telemetry)
                            .await;
                    });
                    break;
                }
                let left = state.connection.take();
                self.telemetry.broker_returned(
                    &self.spec.name,
                    self.role.as_str(),
                    &self.spec.node_of(current),
                    &self.spec.node_of(node),
                );
                self.adopt(&mut state, node, connection, false);
                if let Some(left) = left {
                    self.drain_and_close(left);
                }
                break;
            }
        }
    }

    /// Closes a connection left for a more preferred node once the work
    /// on it has had [`DRAIN`] (at once when the connector closes).
    fn drain_and_close(&self, connection: Arc<Connection>) {
        let (closed, telemetry) = (self.closed.clone(), self.telemetry.clone());
        self.background.spawn(async move {
            tokio::select! {
                () = closed.cancelled() => {}
                () = tokio::time::sleep(DRAIN) => {}
            }
            let why = "switchyard: back on the preferred node";
            close_connection(&connection, 200, why, &telemetry).await;
        });
    }

    /// Follows `connection.blocked` / `unblocked` on a new connection; a new
    /// connection starts unblocked.
    fn follow_blocking(&self, connection: &Connection) {
        let blocking = self.blocking.clone();
        let broker = self.spec.name.clone();
        let telemetry = self.telemetry.clone();
        let set = move |blocked: bool| {
            blocking.send_if_modified(|b| {
                let changed = b.blocked != blocked;
                if changed {
                    *b = Blocking {
                        blocked,
                        since: Instant::now(),
                    };
                }
                changed
            })
        };
        set(false);
        let mut events = Box::pin(connection.events_listener());
        self.background.spawn(async move {
            while let Some(event) = events.next().await {
                match event {
                    Event::ConnectionBlocked(reason) if set(true) => {
                        telemetry.broker_blocked(&broker, &reason)
                    }
                    Event::ConnectionUnblocked if set(false) => telemetry.broker_unblocked(&broker),
                    _ => {}
                }
            }
        });
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

/// The order to try `nodes` in: preference order, with `lost` (the node
/// just lost) last.
fn preference(nodes: usize, lost: Option<usize>) -> Vec<usize> {
    let mut order: Vec<usize> = (0..nodes).filter(|&n| Some(n) != lost).collect();
    order.extend(lost.filter(|&n| n < nodes));
    order
}

/// One connection to `spec` for a one-off tool: its nodes tried in order
/// of preference, the first that answers; the last node's error when none
/// does.
pub async fn connect_first(
    spec: &BrokerSpec,
    properties: ConnectionProperties,
) -> Result<Connection, ConnectError> {
    let mut last = None;
    for node in 0..spec.nodes() {
        match connect_once(spec, node, properties.clone()).await {
            Ok(connection) => return Ok(connection),
            Err(error) => last = Some(error.error(spec, node)),
        }
    }
    Err(last.unwrap_or_else(|| ConnectError::Connect {
        uri: spec.redacted_uri(),
        failure: Arc::new(ConnectFailure::NoNode),
    }))
}

/// One connection attempt to node `node` of `spec`, bounded by
/// [`CONNECT_TIMEOUT`]: a refusal of the credentials or the vhost says what
/// to fix, a failed TLS handshake says so, anything else is the client's
/// error. Every connection of the crate is made here.
async fn connect_once(
    spec: &BrokerSpec,
    node: usize,
    properties: ConnectionProperties,
) -> Result<Connection, AttemptFailure> {
    let attempt = super::tls::connect(spec, node, properties);
    let error = match timeout(CONNECT_TIMEOUT, attempt).await {
        Ok(Ok(connection)) => return Ok(connection),
        Ok(Err(e)) => e,
        Err(_) => {
            let failure = ConnectFailure::Timeout(CONNECT_TIMEOUT);
            return Err(AttemptFailure::Failed(Arc::new(failure)));
        }
    };
    let said = BrokerError::from_lapin(&error);
    if said.fault() == Fault::Refused {
        return Err(AttemptFailure::Refused(Arc::new(refusal(said, spec, node))));
    }
    let failure = match super::tls::failure(&error, spec) {
        Some(tls) => ConnectFailure::Tls(tls),
        None => ConnectFailure::Amqp(error),
    };
    Err(AttemptFailure::Failed(Arc::new(failure)))
}

/// What a refused connection means: the credentials, a vhost that does not
/// exist, or a vhost the user may not use.
fn refusal(said: BrokerError, spec: &BrokerSpec, node: usize) -> AccessRefusal {
    let at = RefusedAt {
        broker: spec.name.clone(),
        node: (spec.nodes() > 1).then(|| spec.node_of(node)),
        uri_key: spec.uri_key(),
    };
    let uri = lapin::uri::AMQPUri::from_str(spec.secret_uri_of(node)).ok();
    let vhost = uri.as_ref().map_or("?", |u| u.vhost.as_str()).to_owned();
    let user = uri
        .as_ref()
        .map_or("?", |u| u.authority.userinfo.username.as_str())
        .to_owned();
    if said.code == Some(super::error::code::ACCESS_REFUSED) {
        return AccessRefusal::Credentials { at, said };
    }
    // Both vhost refusals are 530 NOT_ALLOWED; only the broker's words
    // tell a missing vhost from a forbidden one.
    if said.text.contains("not found") {
        return AccessRefusal::NoVhost { at, vhost, said };
    }
    AccessRefusal::Vhost {
        at,
        user,
        vhost,
        said,
    }
}

#[cfg(test)]
mod tests {
    use super::{
        AccessRefusal, BACKOFF_MAX, ConnectError, ConnectFailure, Connector, RefusedAt, Role,
        preference,
    };
    use crate::broker::error::{BrokerError, Level};
    use crate::config::BrokerSpec;
    use crate::errors::one_line;
    use crate::telemetry::Telemetry;
    use std::sync::Arc;
    use std::time::Duration;

    fn at(node: Option<&str>) -> RefusedAt {
        RefusedAt {
            broker: "main".to_owned(),
            node: node.map(str::to_owned),
            uri_key: "uri",
        }
    }

    fn said(code: u16, text: &str) -> BrokerError {
        BrokerError {
            code: Some(code),
            level: Level::Connection,
            text: text.to_owned(),
        }
    }

    fn refused(refusal: AccessRefusal) -> ConnectError {
        ConnectError::Refused {
            broker: "main".to_owned(),
            refusal: Arc::new(refusal),
        }
    }

    /// A refusal says what to fix, once, after the broker it names; its
    /// reason is the refusal alone.
    #[test]
    fn a_refusal_reads_as_what_to_fix() {
        let credentials = refused(AccessRefusal::Credentials {
            at: at(None),
            said: said(403, "ACCESS_REFUSED - Login was refused"),
        });
        let reason = "authentication refused by broker main: check the user and password in \
                      brokers.main.uri (broker: ACCESS_REFUSED - Login was refused)";
        assert_eq!(credentials.reason(), reason);
        let line = format!("broker \"main\" refused the connection: {reason}");
        assert_eq!(credentials.to_string(), line);
        assert_eq!(one_line(&credentials), line);

        let missing = AccessRefusal::NoVhost {
            at: at(Some("rabbit@two")),
            vhost: "orders".to_owned(),
            said: said(530, "NOT_ALLOWED - vhost orders not found"),
        };
        assert_eq!(
            refused(missing).reason(),
            "vhost refused by broker main (node rabbit@two): vhost \"orders\" does not exist; \
             create it (rabbitmqctl add_vhost) or fix the vhost in brokers.main.uri (broker: \
             NOT_ALLOWED - vhost orders not found)"
        );
        let forbidden = AccessRefusal::Vhost {
            at: at(None),
            user: "app".to_owned(),
            vhost: "orders".to_owned(),
            said: said(
                530,
                "NOT_ALLOWED - access to vhost 'orders' refused for user 'app'",
            ),
        };
        assert_eq!(
            refused(forbidden).reason(),
            "vhost refused by broker main: user \"app\" may not use vhost \"orders\"; grant it \
             permissions (rabbitmqctl set_permissions) or fix brokers.main.uri (broker: \
             NOT_ALLOWED - access to vhost 'orders' refused for user 'app')"
        );
    }

    /// A failed connect names the URI and says why once, the client's
    /// error and its causes included.
    #[test]
    fn a_failed_connect_reads_as_its_uri_and_cause() {
        let uri = "amqp://guest:***@127.0.0.1:1/%2f".to_owned();
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let refused = ConnectError::Connect {
            uri: uri.clone(),
            failure: Arc::new(ConnectFailure::Amqp(lapin::Error::from(io))),
        };
        let line =
            "cannot connect to amqp://guest:***@127.0.0.1:1/%2f: IO error: Connection refused";
        assert_eq!(refused.to_string(), line);
        assert_eq!(refused.reason(), line);
        assert_eq!(one_line(&refused), line);
        let silent = ConnectError::Connect {
            uri,
            failure: Arc::new(ConnectFailure::Timeout(Duration::from_secs(10))),
        };
        assert_eq!(
            one_line(&silent),
            "cannot connect to amqp://guest:***@127.0.0.1:1/%2f: no answer within 10 s"
        );
        let waiting = ConnectError::BackingOff {
            broker: "down".to_owned(),
            last: Arc::new(ConnectFailure::NoNode),
        };
        assert_eq!(
            one_line(&waiting),
            "broker \"down\" unreachable, reconnecting: no node configured"
        );
        assert_eq!(
            ConnectError::ChannelTimeout(5000).to_string(),
            "no answer to channel.open within 5000 ms"
        );
    }

    #[test]
    fn nodes_are_tried_in_preference_order_with_the_lost_one_last() {
        assert_eq!(preference(1, None), [0]);
        assert_eq!(preference(1, Some(0)), [0]);
        assert_eq!(preference(3, None), [0, 1, 2]);
        assert_eq!(preference(3, Some(0)), [1, 2, 0]);
        assert_eq!(preference(3, Some(1)), [0, 2, 1]);
    }

    /// Every node of a cluster that refuses connections is tried once,
    /// in order, before the backoff; the error names the last.
    #[tokio::test(start_paused = true)]
    async fn every_node_is_tried_before_the_backoff() {
        let spec = Arc::new(BrokerSpec::cluster(
            "down",
            vec![
                "amqp://guest:secret@127.0.0.1:1/%2f".to_owned(),
                "amqp://guest:secret@127.0.0.1:2/%2f".to_owned(),
            ],
        ));
        let background = tokio_util::task::TaskTracker::new();
        let connector = Connector::new(spec, "unit", Role::Publish, background, Telemetry::new());
        match connector.channel(true, Duration::from_secs(1)).await {
            Err(ConnectError::Connect { uri, .. }) => {
                assert_eq!(uri, "amqp://guest:***@127.0.0.1:2/%2f")
            }
            other => panic!("expected a connect error, got {other:?}"),
        }
        assert!(matches!(
            connector.channel(true, Duration::from_secs(1)).await,
            Err(ConnectError::BackingOff { .. })
        ));
    }

    /// A broker that refuses connections fails fast during its backoff and
    /// is tried again once the backoff has run out.
    #[tokio::test(start_paused = true)]
    async fn a_down_broker_fails_fast_until_its_backoff_runs_out() {
        let spec = Arc::new(BrokerSpec::new(
            "down",
            "amqp://guest:secret@127.0.0.1:1/%2f",
        ));
        let background = tokio_util::task::TaskTracker::new();
        let connector = Connector::new(spec, "unit", Role::Publish, background, Telemetry::new());
        let limit = Duration::from_secs(1);
        match connector.channel(true, limit).await {
            Err(ConnectError::Connect { uri, .. }) => {
                assert_eq!(uri, "amqp://guest:***@127.0.0.1:1/%2f")
            }
            other => panic!("expected a connect error, got {other:?}"),
        }
        let started = tokio::time::Instant::now();
        match connector.channel(true, limit).await {
            Err(ConnectError::BackingOff { broker, .. }) => assert_eq!(broker, "down"),
            other => panic!("expected the backoff, got {other:?}"),
        }
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "no attempt while backing off"
        );
        tokio::time::advance(BACKOFF_MAX).await;
        assert!(matches!(
            connector.channel(true, limit).await,
            Err(ConnectError::Connect { .. })
        ));
    }
}
