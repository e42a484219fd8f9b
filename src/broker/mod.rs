//! Every lapin type lives behind this module: connections, confirm channels,
//! the inbound consumer and its acknowledgements, topology declarations and
//! reconnection. The rest of the crate speaks in envelopes, endpoints and
//! outcomes.
//!
//! - [`connector`]: one supervised connection per broker and role, rebuilt
//!   on demand with jittered backoff.
//! - [`publisher`]: one long-lived confirm channel per endpoint; many
//!   publishes in flight, each confirm (and return) attributed to its own
//!   publish.
//! - [`inbound`]: the consuming connection: qos, peek-lock consume, and the
//!   settle actor that batches acks.
//! - [`topology`]: startup declarations and the dead-letter checks.
//! - `error`: broker errors with their reply codes, classified by fault.
//! - `health`: endpoint health, marked by publishers, read by deliveries.
//! - [`frame_size`]: content header size, checked before publishing.

mod connector;
mod error;
pub mod frame_size;
mod health;
mod inbound;
mod publisher;
mod topology;

pub use connector::{Blocking, ConnectError, Connector, Role};
pub use error::{BrokerError, Fault, Level, code};
pub use health::{Down, EndpointHealth};
pub use inbound::{ConsumeError, InboundChannel, Receipt, open_inbound};
pub use publisher::{Mode, PublishFailure, Publisher};
pub use topology::{TopologyError, declare_endpoint_queue, prepare_inbound};

/// AMQP message properties, headers included.
pub type Properties = lapin::BasicProperties;
/// An AMQP field value.
pub use lapin::types::{AMQPValue as AmqpValue, FieldArray, FieldTable, LongString, ShortString};

use std::str::FromStr;

/// Checks that `uri` is an `amqp://` or `amqps://` URI lapin can use. The
/// error never repeats the URI, so it cannot leak credentials.
pub fn validate_uri(uri: &str) -> Result<(), String> {
    if !(uri.starts_with("amqp://") || uri.starts_with("amqps://")) {
        return Err("must start with amqp:// or amqps://".to_owned());
    }
    lapin::uri::AMQPUri::from_str(uri)
        .map(|_| ())
        .map_err(|e| format!("not a valid AMQP URI: {}", redact_in(&e.to_string(), uri)))
}

/// `uri` with its password replaced by `***`.
pub fn redact_uri(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => uri.to_owned(),
    }
}

fn redact_in(text: &str, uri: &str) -> String {
    text.replace(uri, &redact_uri(uri))
}

#[cfg(test)]
mod tests {
    use super::{redact_uri, validate_uri};

    #[test]
    fn redaction_hides_the_password_only() {
        let cases = [
            (
                "amqp://guest:guest@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            (
                "amqps://u:p%40ss@host/vh?heartbeat=10",
                "amqps://u:***@host/vh?heartbeat=10",
            ),
            ("amqp://127.0.0.1:5672", "amqp://127.0.0.1:5672"),
            ("amqp://user@host/", "amqp://user:***@host/"),
        ];
        for (uri, expected) in cases {
            assert_eq!(redact_uri(uri), expected);
        }
    }

    #[test]
    fn uri_validation_rejects_other_schemes_without_echoing_secrets() {
        assert!(validate_uri("amqp://guest:guest@127.0.0.1:5672/%2f").is_ok());
        let err = validate_uri("http://guest:secret@host/").unwrap_err();
        assert!(!err.contains("secret"), "{err}");
        let err = validate_uri("amqp://guest:secret@host:notaport/").unwrap_err();
        assert!(!err.contains("secret"), "{err}");
    }
}
