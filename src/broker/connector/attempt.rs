//! One connection attempt to one node, bounded and its failure told apart
//! (refused, TLS, anything else), and the order a broker's nodes are tried
//! in.

use super::failure::{AccessRefusal, AttemptFailure, ConnectError, ConnectFailure, RefusedAt};
use crate::broker::error::{BrokerError, Fault};
use crate::config::BrokerSpec;
use lapin::{Connection, ConnectionProperties};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::timeout;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The order to try `nodes` in: preference order, with `lost` (the node
/// just lost) last.
pub(super) fn preference(nodes: usize, lost: Option<usize>) -> Vec<usize> {
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
pub(super) async fn connect_once(
    spec: &BrokerSpec,
    node: usize,
    properties: ConnectionProperties,
) -> Result<Connection, AttemptFailure> {
    let attempt = crate::broker::tls::connect(spec, node, properties);
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
    let failure = match crate::broker::tls::failure(&error, spec) {
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
    if said.code == Some(crate::broker::error::code::ACCESS_REFUSED) {
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
