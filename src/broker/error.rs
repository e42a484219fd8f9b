//! Broker errors that keep their meaning.
//!
//! lapin reports a closed channel or connection as an error value; this
//! module keeps its AMQP reply code and level and answers the one question
//! the pipeline asks of it: whose fault is it? The message's (the broker
//! refused this message itself: retry the others, dead-letter the culprit),
//! the endpoint's (fail over, mark it down), the connection's (reconnect,
//! fail over), or the configuration's (permanent: say what to fix).

use lapin::ErrorKind;
use lapin::protocol::AMQPErrorKind;
use std::future::Future;
use std::time::Duration;

/// AMQP reply codes this crate reasons about.
pub mod code {
    /// The broker closed the connection on purpose (`rabbitmqctl close_connection`).
    #[cfg(test)]
    pub const CONNECTION_FORCED: u16 = 320;
    /// Access to a vhost or resource was refused.
    pub const ACCESS_REFUSED: u16 = 403;
    /// An exchange or queue does not exist.
    pub const NOT_FOUND: u16 = 404;
    /// A precondition failed: foreign `user_id`, body over `max_message_size`...
    pub const PRECONDITION_FAILED: u16 = 406;
    /// A frame was malformed or too large.
    pub const FRAME_ERROR: u16 = 501;
    /// A frame did not parse.
    pub const SYNTAX_ERROR: u16 = 502;
    /// A frame arrived where it was not expected.
    pub const UNEXPECTED_FRAME: u16 = 505;
    /// The operation is not allowed (e.g. a vhost that does not exist).
    pub const NOT_ALLOWED: u16 = 530;
}

/// Where an AMQP error was raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `channel.close`: only that channel is gone.
    Channel,
    /// `connection.close`: every channel of the connection is gone.
    Connection,
    /// The channel had already been closed (by the broker, for some
    /// publish) when this one was made on it.
    ClosedChannel,
    /// No AMQP reply: the socket, a heartbeat, or the client's own state.
    Transport,
}

/// Whose fault a broker error is, which decides what happens next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The broker refused a message for what it is (size, frame, user_id).
    /// Which message is only certain when it was published alone.
    Message,
    /// The destination is missing or refuses this endpoint.
    Endpoint,
    /// The connection went away; a new one may work.
    Connection,
    /// The broker refuses these credentials or this vhost: only a
    /// configuration change helps.
    Refused,
}

/// An error reported by the broker or the client library, with its code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct BrokerError {
    /// The AMQP reply code, when the broker sent one.
    pub code: Option<u16>,
    /// Where it was raised.
    pub level: Level,
    /// The broker's reply text, or the library's description.
    pub text: String,
}

impl BrokerError {
    /// Keeps what a lapin error says.
    pub fn from_lapin(error: &lapin::Error) -> Self {
        match error.kind() {
            ErrorKind::InvalidChannelState(..) => Self {
                code: None,
                level: Level::ClosedChannel,
                text: error.to_string(),
            },
            ErrorKind::ProtocolError(amqp) => Self {
                code: Some(amqp.get_id()),
                level: match amqp.kind() {
                    AMQPErrorKind::Soft(_) => Level::Channel,
                    AMQPErrorKind::Hard(_) => Level::Connection,
                },
                text: amqp.get_message().to_string(),
            },
            _ => Self {
                code: None,
                level: Level::Transport,
                text: error.to_string(),
            },
        }
    }

    /// Whose fault it is. A publish on a channel the broker had just closed
    /// counts as the message's: it is retried alone, which tells.
    pub fn fault(&self) -> Fault {
        if self.level == Level::ClosedChannel {
            return Fault::Message;
        }
        match self.code {
            Some(
                code::PRECONDITION_FAILED
                | code::FRAME_ERROR
                | code::SYNTAX_ERROR
                | code::UNEXPECTED_FRAME,
            ) => Fault::Message,
            Some(code::ACCESS_REFUSED | code::NOT_ALLOWED) => Fault::Refused,
            Some(_) if self.level == Level::Channel => Fault::Endpoint,
            _ => Fault::Connection,
        }
    }

    fn describe(&self) -> String {
        let level = match self.level {
            Level::ClosedChannel => return format!("channel already closed: {}", self.text),
            Level::Channel => "channel closed by the broker",
            Level::Connection => "connection closed by the broker",
            Level::Transport => return format!("connection lost: {}", self.text),
        };
        match self.code {
            Some(code) => format!("{level}: {code} {}", self.text),
            None => format!("{level}: {}", self.text),
        }
    }
}

/// How long a reader (`dlq`, `trace`) gives the broker to answer one
/// operation, a publish confirm included.
pub(super) const OPERATION_BOUND: Duration = Duration::from_secs(30);

/// An operation the broker refused, dropped, or did not answer within
/// [`OPERATION_BOUND`]; each reader's error takes it in (`From`).
#[derive(Debug)]
pub(super) enum Unfinished {
    /// The broker refused or dropped it: what was being done, and why.
    Failed(&'static str, BrokerError),
    /// No answer in time: what was being done.
    Timeout(&'static str),
}

/// Runs `operation` (`what` names it in the error), given
/// [`OPERATION_BOUND`] to end.
pub(super) async fn bounded<T>(
    what: &'static str,
    operation: impl Future<Output = lapin::Result<T>>,
) -> Result<T, Unfinished> {
    match tokio::time::timeout(OPERATION_BOUND, operation).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(Unfinished::Failed(what, BrokerError::from_lapin(&e))),
        Err(_) => Err(Unfinished::Timeout(what)),
    }
}

#[cfg(test)]
mod tests {
    use super::{BrokerError, Fault, Level, code};

    fn error(code: Option<u16>, level: Level) -> BrokerError {
        BrokerError {
            code,
            level,
            text: "x".to_owned(),
        }
    }

    #[test]
    fn faults_follow_reply_codes_and_levels() {
        let cases = [
            (
                Some(code::PRECONDITION_FAILED),
                Level::Channel,
                Fault::Message,
            ),
            (Some(code::FRAME_ERROR), Level::Connection, Fault::Message),
            (Some(code::NOT_FOUND), Level::Channel, Fault::Endpoint),
            (Some(code::ACCESS_REFUSED), Level::Channel, Fault::Refused),
            (Some(code::NOT_ALLOWED), Level::Connection, Fault::Refused),
            (
                Some(code::CONNECTION_FORCED),
                Level::Connection,
                Fault::Connection,
            ),
            (None, Level::Transport, Fault::Connection),
            (None, Level::ClosedChannel, Fault::Message),
        ];
        for (code, level, fault) in cases {
            assert_eq!(error(code, level).fault(), fault, "{code:?} {level:?}");
        }
    }

    #[test]
    fn the_line_keeps_code_and_text() {
        let e = BrokerError {
            code: Some(406),
            level: Level::Channel,
            text: "PRECONDITION_FAILED - user_id property set to 'x'".to_owned(),
        };
        assert_eq!(
            e.to_string(),
            "channel closed by the broker: 406 PRECONDITION_FAILED - user_id property set to 'x'"
        );
    }
}
