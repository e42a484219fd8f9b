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

/// Why no channel could be had from a broker. Every variant is transient:
/// the caller fails over (or, for the consumer, retries later).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// The broker refused the credentials or the vhost: retrying will not
    /// help until the configuration changes.
    #[error("broker \"{broker}\" refused the connection: {reason}")]
    Refused {
        /// The broker's name.
        broker: String,
        /// What the broker said and what to fix.
        reason: String,
    },
    /// The connection attempt failed or timed out.
    #[error("cannot connect to {uri}: {reason}")]
    Connect {
        /// The broker URI, password masked.
        uri: String,
        /// Why.
        reason: String,
    },
    /// A recent attempt failed and the backoff has not run out yet.
    #[error("broker \"{broker}\" unreachable, reconnecting: {last_error}")]
    BackingOff {
        /// The broker's name.
        broker: String,
        /// Why the last attempt failed.
        last_error: String,
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
            Self::Refused { reason, .. } => reason.clone(),
            other => other.to_string(),
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
    retry_at: Option<Instant>,
    last_error: String,
    /// The last attempt was refused (credentials, vhost): until the next
    /// one, callers are told so rather than "unreachable".
    refused: bool,
}

impl Default for State {
    fn default() -> Self {
        Self {
            connection: None,
            node: 0,
            lost: None,
            backoff: Backoff::new(BACKOFF_FIRST, BACKOFF_MAX),
            retry_at: None,
            last_error: String::new(),
            refused: false,
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
        let retry_at = self.state.lock().await.retry_at;
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
                    reason: e.to_string(),
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
        if let Some(at) = state.retry_at
            && Instant::now() < at
        {
            if state.refused {
                return Err(ConnectError::Refused {
                    broker: self.spec.name.clone(),
                    reason: state.last_error.clone(),
                });
            }
            return Err(ConnectError::BackingOff {
                broker: self.spec.name.clone(),
                last_error: state.last_error.clone(),
            });
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
                            &error.reason(),
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
                last_error: "no node configured".to_owned(),
            });
        };
        let refused = matches!(error, ConnectError::Refused { .. });
        let delay = state.backoff.next_delay();
        // A refusal needs a configuration change: retried at the slowest pace.
        let delay = if refused { BACKOFF_MAX } else { delay };
        state.retry_at = Some(Instant::now() + delay);
        state.refused = refused;
        let broker = &self.spec.name;
        let (node, uri) = (self.spec.node_of(node), self.spec.redacted_uri_of(node));
        let retry_in = (!(refused && self.refusal_final.load(Ordering::Relaxed))).then_some(delay);
        match &error {
            ConnectError::Refused { reason, .. } => {
                state.last_error = reason.clone();
                self.telemetry
                    .broker_refused(broker, &node, &uri, reason, retry_in);
            }
            ConnectError::Connect { reason, .. } => {
                state.last_error = reason.clone();
                self.telemetry
                    .broker_unreachable(broker, &node, &uri, reason, delay);
            }
            other => state.last_error = other.to_string(),
        }
        Err(error)
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
                    self.background.spawn(async move {
                        close_connection(&connection, 200, "switchyard: not needed").await;
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
        let closed = self.closed.clone();
        self.background.spawn(async move {
            tokio::select! {
                () = closed.cancelled() => {}
                () = tokio::time::sleep(DRAIN) => {}
            }
            close_connection(&connection, 200, "switchyard: back on the preferred node").await;
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
            let c = connection.clone();
            self.background.spawn(async move {
                close_connection(&c, 320, "switchyard: reconnecting").await;
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
            close_connection(&c, 200, "switchyard: shutdown").await;
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
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| ConnectError::Connect {
        uri: spec.redacted_uri(),
        reason: "no node configured".to_owned(),
    }))
}

/// One connection attempt to node `node` of `spec`, bounded by
/// [`CONNECT_TIMEOUT`]: a refusal of the credentials or the vhost says what
/// to fix, a failed TLS handshake says so, anything else is a connect error
/// naming the node's URI (password masked). Every connection of the crate
/// is made here.
pub async fn connect_once(
    spec: &BrokerSpec,
    node: usize,
    properties: ConnectionProperties,
) -> Result<Connection, ConnectError> {
    let attempt = super::tls::connect(spec, node, properties);
    let reason = match timeout(CONNECT_TIMEOUT, attempt).await {
        Ok(Ok(connection)) => return Ok(connection),
        Ok(Err(e)) if BrokerError::from_lapin(&e).fault() == Fault::Refused => {
            return Err(ConnectError::Refused {
                broker: spec.name.clone(),
                reason: refusal(&e, spec, node),
            });
        }
        Ok(Err(e)) => super::tls::failure(&e, spec).unwrap_or_else(|| e.to_string()),
        Err(_) => format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
    };
    Err(ConnectError::Connect {
        uri: spec.redacted_uri_of(node),
        reason,
    })
}

/// What a refused connection means, in words that say what to fix: the
/// credentials, a vhost that does not exist, or a vhost the user may not use.
fn refusal(error: &lapin::Error, spec: &BrokerSpec, node: usize) -> String {
    let e = BrokerError::from_lapin(error);
    let broker = &spec.name;
    let key = spec.uri_key();
    // Only a cluster's refusals name the node: one node is the broker.
    let at = if spec.nodes() > 1 {
        format!(" (node {})", spec.node_of(node))
    } else {
        String::new()
    };
    let uri = lapin::uri::AMQPUri::from_str(spec.secret_uri_of(node)).ok();
    let vhost = uri.as_ref().map_or("?", |u| u.vhost.as_str());
    let user = uri
        .as_ref()
        .map_or("?", |u| u.authority.userinfo.username.as_str());
    if e.code == Some(super::error::code::ACCESS_REFUSED) {
        return format!(
            "authentication refused by broker {broker}{at}: check the user and password in \
             brokers.{broker}.{key} (broker: {})",
            e.text
        );
    }
    if e.text.contains("not found") {
        return format!(
            "vhost refused by broker {broker}{at}: vhost \"{vhost}\" does not exist; create it \
             (rabbitmqctl add_vhost) or fix the vhost in brokers.{broker}.{key} (broker: {})",
            e.text
        );
    }
    format!(
        "vhost refused by broker {broker}{at}: user \"{user}\" may not use vhost \"{vhost}\"; \
         grant it permissions (rabbitmqctl set_permissions) or fix brokers.{broker}.{key} \
         (broker: {})",
        e.text
    )
}

#[cfg(test)]
mod tests {
    use super::{BACKOFF_MAX, ConnectError, Connector, Role, preference};
    use crate::config::BrokerSpec;
    use crate::telemetry::Telemetry;
    use std::sync::Arc;
    use std::time::Duration;

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
