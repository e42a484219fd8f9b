//! Why no connection or channel could be had: what callers are told
//! ([`ConnectError`]), a failed attempt's cause, and a broker's refusal of
//! the credentials or the vhost in words that say what to fix.

use crate::broker::error::BrokerError;
use crate::broker::tls::TlsFailure;
use crate::config::BrokerSpec;
use std::sync::Arc;
use std::time::Duration;

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

/// Why one attempt to connect to a node failed.
#[derive(Debug)]
pub(super) enum AttemptFailure {
    /// The broker refused the credentials or the vhost: callers are told
    /// so, not "unreachable".
    Refused(Arc<AccessRefusal>),
    /// No connection, for another reason.
    Failed(Arc<ConnectFailure>),
}

impl AttemptFailure {
    /// As callers are told it: naming the broker, or the node's URI.
    pub(super) fn error(&self, spec: &BrokerSpec, node: usize) -> ConnectError {
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
    pub(super) fn backing_off(&self, broker: &str) -> ConnectError {
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
