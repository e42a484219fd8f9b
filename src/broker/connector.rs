//! One supervised AMQP connection per broker and role.
//!
//! A [`Connector`] hands out channels on a live connection, connecting on
//! first use and again after the connection dies. Failed connects back off
//! (jittered, exponential, capped) so a broker that is down costs callers a
//! fast failure rather than a connect timeout each; callers fail over
//! meanwhile.

use crate::config::BrokerSpec;
use crate::telemetry;
use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection, ConnectionProperties};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::{Instant, timeout};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Bound on a graceful close at shutdown; past it the socket is dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why no channel could be had from a broker. Every variant is transient:
/// the caller fails over (or, for the consumer, retries later).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
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
    Channel(String),
    /// `channel.open` (or `confirm.select`) was not answered in time.
    #[error("no answer to channel.open within {0} ms")]
    ChannelTimeout(u128),
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

/// A broker connection that rebuilds itself.
pub struct Connector {
    spec: Arc<BrokerSpec>,
    connection_name: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    connection: Option<Arc<Connection>>,
    failures: u32,
    retry_at: Option<Instant>,
    last_error: String,
}

impl Connector {
    /// A connector; nothing is connected until first use.
    pub fn new(spec: Arc<BrokerSpec>, instance: &str, role: Role) -> Self {
        let role = match role {
            Role::Consume => "consume",
            Role::Publish => "publish",
        };
        Self {
            connection_name: format!("{instance}/{role}/{}", spec.name),
            spec,
            state: Mutex::new(State::default()),
        }
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
        match timeout(limit, open).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(e)) => {
                self.discard(&connection, &e.to_string()).await;
                Err(ConnectError::Channel(e.to_string()))
            }
            Err(_) => {
                self.discard(&connection, "channel open timed out").await;
                Err(ConnectError::ChannelTimeout(limit.as_millis()))
            }
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
            return Err(ConnectError::BackingOff {
                broker: self.spec.name.clone(),
                last_error: state.last_error.clone(),
            });
        }
        let properties = ConnectionProperties::default()
            .with_connection_name(self.connection_name.clone().into());
        let attempt = timeout(
            CONNECT_TIMEOUT,
            Connection::connect(self.spec.secret_uri(), properties),
        );
        let error = match attempt.await {
            Ok(Ok(connection)) => {
                if state.failures > 0 {
                    telemetry::broker_reconnected(&self.spec.name, &self.spec.redacted_uri());
                }
                let connection = Arc::new(connection);
                *state = State {
                    connection: Some(connection.clone()),
                    ..State::default()
                };
                return Ok(connection);
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
        };
        state.failures += 1;
        let delay = backoff(state.failures);
        state.retry_at = Some(Instant::now() + delay);
        state.last_error = error.clone();
        telemetry::broker_unreachable(&self.spec.name, &self.spec.redacted_uri(), &error, delay);
        Err(ConnectError::Connect {
            uri: self.spec.redacted_uri(),
            reason: error,
        })
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
            tokio::spawn(async move {
                let _ = timeout(
                    Duration::from_secs(2),
                    c.close(320, "switchyard: reconnecting".into()),
                )
                .await;
            });
        }
    }

    /// Closes the connection, if any (at shutdown).
    pub async fn close(&self) {
        let connection = self.state.lock().await.connection.take();
        if let Some(c) = connection
            && c.status().connected()
        {
            let _ = timeout(CLOSE_TIMEOUT, c.close(200, "switchyard: shutdown".into())).await;
        }
    }
}

/// Exponential backoff with full jitter between half and all of the step.
fn backoff(failures: u32) -> Duration {
    let step = BACKOFF_FIRST
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(BACKOFF_MAX);
    let millis = step.as_millis() as u64;
    Duration::from_millis(millis / 2 + fastrand::u64(0..=millis / 2))
}

#[cfg(test)]
mod tests {
    use super::{BACKOFF_MAX, ConnectError, Connector, Role, backoff};
    use crate::config::BrokerSpec;
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
        let connector = Connector::new(spec, "unit", Role::Publish);
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

    #[test]
    fn backoff_grows_is_jittered_and_capped() {
        for _ in 0..100 {
            let first = backoff(1);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = backoff(3);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            assert!(backoff(40) <= BACKOFF_MAX && backoff(40) >= BACKOFF_MAX / 2);
        }
    }
}
