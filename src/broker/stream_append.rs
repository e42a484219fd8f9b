//! One record appended to a stream (the journal's, the group's control
//! stream): published mandatory on a confirm channel through the default
//! exchange, and how the broker settled it, within a bound.

use super::error::BrokerError;
use crate::amqp::Properties;
use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation};
use std::time::Duration;

/// How the broker settled one append.
#[derive(Debug)]
pub(super) enum Appended {
    /// Confirmed, and not returned.
    Confirmed,
    /// Returned (the stream is gone): the reply code and text.
    Returned(u16, String),
    /// Nacked.
    Nacked,
    /// The channel failed under it.
    Failed(BrokerError),
    /// No confirm within the bound.
    TimedOut,
}

/// Publishes `body` to `stream` on `channel` and waits at most `bound`
/// for its confirm.
pub(super) async fn append(
    channel: &Channel,
    stream: &str,
    body: &[u8],
    properties: Properties,
    bound: Duration,
) -> Appended {
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    let publish = async {
        channel
            .basic_publish("".into(), stream.into(), options, body, properties)
            .await?
            .await
    };
    match tokio::time::timeout(bound, publish).await {
        Ok(Ok(Confirmation::Ack(None) | Confirmation::NotRequested)) => Appended::Confirmed,
        Ok(Ok(Confirmation::Ack(Some(r)) | Confirmation::Nack(Some(r)))) => {
            Appended::Returned(r.reply_code, r.reply_text.to_string())
        }
        Ok(Ok(Confirmation::Nack(None))) => Appended::Nacked,
        Ok(Err(e)) => Appended::Failed(BrokerError::from_lapin(&e)),
        Err(_) => Appended::TimedOut,
    }
}
