//! Closing a channel or a connection, bounded: a broker that does not
//! answer `close` (stalled, or gone) is not waited for past
//! [`CLOSE_TIMEOUT`], and the log says so; the socket goes with the handle.

use crate::telemetry::Telemetry;
use lapin::{Channel, Connection};
use std::time::Duration;

/// The longest a close waits for the broker's answer.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Closes `channel` if it is still open, saying `why`.
pub async fn close_channel(channel: &Channel, why: &str, telemetry: &Telemetry) {
    if channel.status().connected()
        && tokio::time::timeout(CLOSE_TIMEOUT, channel.close(200, why.into()))
            .await
            .is_err()
    {
        telemetry.channel_close_timed_out(channel.id(), why, CLOSE_TIMEOUT);
    }
}

/// Closes `connection` if it is still open, with reply `code`, saying `why`.
pub async fn close_connection(
    connection: &Connection,
    code: u16,
    why: &str,
    telemetry: &Telemetry,
) {
    if connection.status().connected()
        && tokio::time::timeout(CLOSE_TIMEOUT, connection.close(code, why.into()))
            .await
            .is_err()
    {
        telemetry.connection_close_timed_out(why, CLOSE_TIMEOUT);
    }
}
