//! Closing a channel or a connection, bounded: a broker that does not
//! answer `close` (stalled, or gone) is not waited for past
//! [`CLOSE_TIMEOUT`]; the socket goes with the handle.

use lapin::{Channel, Connection};
use std::time::Duration;

/// The longest a close waits for the broker's answer.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Closes `channel` if it is still open, saying `why`.
pub async fn close_channel(channel: &Channel, why: &str) {
    if channel.status().connected() {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, channel.close(200, why.into())).await;
    }
}

/// Closes `connection` if it is still open, with reply `code`, saying `why`.
pub async fn close_connection(connection: &Connection, code: u16, why: &str) {
    if connection.status().connected() {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, connection.close(code, why.into())).await;
    }
}
