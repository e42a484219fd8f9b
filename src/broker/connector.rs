//! One supervised AMQP connection per broker and role.
//!
//! A [`Connector`] hands out channels on a live connection, connecting on
//! first use and again after the connection dies. Failed connects back off
//! (jittered, exponential, capped) so a broker that is down costs callers a
//! fast failure rather than a connect timeout each; callers fail over
//! meanwhile.
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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, watch};
use tokio::time::{Instant, timeout};
use tokio_util::task::TaskTracker;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

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
    connection_name: String,
    state: Mutex<State>,
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
    ) -> Self {
        let role = match role {
            Role::Consume => "consume",
            Role::Publish => "publish",
        };
        Self {
            connection_name: format!("{instance}/{role}/{}", spec.name),
            spec,
            state: Mutex::new(State::default()),
            blocking: Arc::new(watch::Sender::new(Blocking {
                blocked: false,
                since: Instant::now(),
            })),
            frame_max: AtomicU32::new(0),
            refusal_final: AtomicBool::new(false),
            background,
            telemetry,
        }
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

    /// The live connection, connecting if needed.
    pub async fn connection(&self) -> Result<Arc<Connection>, ConnectError> {
        let mut state = self.state.lock().await;
        if let Some(c) = &state.connection {
            if c.status().connected() {
                return Ok(c.clone());
            }
            state.connection = None;
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
        let properties = ConnectionProperties::default()
            .with_connection_name(self.connection_name.clone().into());
        let error = match connect_once(&self.spec, properties).await {
            Ok(connection) => {
                if state.backoff.failures() > 0 {
                    self.telemetry.broker_reconnected(
                        &self.spec.name,
                        &self.spec.node(),
                        &self.spec.redacted_uri(),
                    );
                }
                let connection = Arc::new(connection);
                self.follow_blocking(&connection);
                self.frame_max
                    .store(connection.configuration().frame_max(), Ordering::Relaxed);
                *state = State {
                    connection: Some(connection.clone()),
                    ..State::default()
                };
                return Ok(connection);
            }
            Err(error) => error,
        };
        let refused = matches!(error, ConnectError::Refused { .. });
        let delay = state.backoff.next_delay();
        // A refusal needs a configuration change: retried at the slowest pace.
        let delay = if refused { BACKOFF_MAX } else { delay };
        state.retry_at = Some(Instant::now() + delay);
        state.refused = refused;
        let (broker, node, uri) = (&self.spec.name, self.spec.node(), self.spec.redacted_uri());
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
        let connector = self.clone();
        self.background
            .spawn(async move { connector.close().await });
    }

    /// Closes the connection, if any (at shutdown).
    pub async fn close(&self) {
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

/// One connection attempt to `spec`, bounded by [`CONNECT_TIMEOUT`]: a
/// refusal of the credentials or the vhost says what to fix, a failed TLS
/// handshake says so, anything else is a connect error naming the URI
/// (password masked). Every connection of the crate is made here.
pub async fn connect_once(
    spec: &BrokerSpec,
    properties: ConnectionProperties,
) -> Result<Connection, ConnectError> {
    let reason = match timeout(CONNECT_TIMEOUT, super::tls::connect(spec, properties)).await {
        Ok(Ok(connection)) => return Ok(connection),
        Ok(Err(e)) if BrokerError::from_lapin(&e).fault() == Fault::Refused => {
            return Err(ConnectError::Refused {
                broker: spec.name.clone(),
                reason: refusal(&e, spec),
            });
        }
        Ok(Err(e)) => super::tls::failure(&e, &spec.name).unwrap_or_else(|| e.to_string()),
        Err(_) => format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
    };
    Err(ConnectError::Connect {
        uri: spec.redacted_uri(),
        reason,
    })
}

/// What a refused connection means, in words that say what to fix: the
/// credentials, a vhost that does not exist, or a vhost the user may not use.
fn refusal(error: &lapin::Error, spec: &BrokerSpec) -> String {
    let e = BrokerError::from_lapin(error);
    let broker = &spec.name;
    let uri = lapin::uri::AMQPUri::from_str(spec.secret_uri()).ok();
    let vhost = uri.as_ref().map_or("?", |u| u.vhost.as_str());
    let user = uri
        .as_ref()
        .map_or("?", |u| u.authority.userinfo.username.as_str());
    if e.code == Some(super::error::code::ACCESS_REFUSED) {
        return format!(
            "authentication refused by broker {broker}: check the user and password in \
             brokers.{broker}.uri (broker: {})",
            e.text
        );
    }
    if e.text.contains("not found") {
        return format!(
            "vhost refused by broker {broker}: vhost \"{vhost}\" does not exist; create it \
             (rabbitmqctl add_vhost) or fix the vhost in brokers.{broker}.uri (broker: {})",
            e.text
        );
    }
    format!(
        "vhost refused by broker {broker}: user \"{user}\" may not use vhost \"{vhost}\"; grant \
         it permissions (rabbitmqctl set_permissions) or fix brokers.{broker}.uri (broker: {})",
        e.text
    )
}

#[cfg(test)]
mod tests {
    use super::{BACKOFF_MAX, ConnectError, Connector, Role};
    use crate::config::BrokerSpec;
    use crate::telemetry::Telemetry;
    use std::sync::Arc;
    use std::time::Duration;

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
