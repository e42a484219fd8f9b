//! Log events and the open-sessions gauge for sessionful message sets. Each
//! event names the session by its id, as the producer set it.

use super::Telemetry;
use std::time::Duration;

impl Telemetry {
    /// A session's first message arrived and the session holds a slot.
    pub fn session_opened(&self, session: &str, message_id: &str) {
        self.metrics.sessions_open.inc();
        tracing::info!(session, message_id, "session opened");
    }

    /// A session released its slot (completed, dead-lettered or abandoned).
    pub fn session_released(&self) {
        self.metrics.sessions_open.dec();
    }

    /// Every session slot is taken: this session waits, unforwarded and
    /// unacked, while independent messages keep flowing.
    pub fn session_waiting(&self, session: &str, message_id: &str, open: usize) {
        tracing::info!(
            session,
            message_id,
            open,
            "every session slot is taken; the session waits for one"
        );
    }

    /// The end message was delivered on every branch: the set is acked.
    pub fn session_completed(&self, session: &str, messages: usize) {
        tracing::info!(session, messages, "session completed; acking its set");
    }

    /// A whole session goes to the dead letters, in order.
    pub fn session_dead_lettered(&self, session: &str, reason: &str, messages: usize) {
        tracing::warn!(
            session,
            reason,
            messages,
            "dead-lettering the whole session"
        );
    }

    /// A message arrived for a session closed moments ago.
    pub fn session_closed_arrival(&self, session: &str, message_id: &str, closed_ago: Duration) {
        tracing::warn!(
            session,
            message_id,
            closed_ago_ms = u64::try_from(closed_ago.as_millis()).unwrap_or(u64::MAX),
            "message for a closed session"
        );
    }

    /// The session's inbound channel was lost or the forwarder is stopping:
    /// nothing is settled and the broker redelivers the whole set.
    pub fn session_abandoned(&self, session: &str, messages: usize) {
        tracing::info!(
            session,
            messages,
            "session abandoned; the broker will redeliver its messages"
        );
    }
}
