//! Connect errors as they read, nodes tried in order of preference, and a
//! down broker failing fast until its backoff runs out.

use super::attempt::preference;
use super::failure::{AccessRefusal, RefusedAt};
use super::{BACKOFF_MAX, ConnectError, ConnectFailure, Connector, Role};
use crate::broker::error::{BrokerError, Level};
use crate::config::BrokerSpec;
use crate::errors::one_line;
use crate::telemetry::Telemetry;
use std::sync::Arc;
use std::time::Duration;

fn at(node: Option<&str>) -> RefusedAt {
    RefusedAt {
        broker: "main".to_owned(),
        node: node.map(str::to_owned),
        uri_key: "uri",
    }
}

fn said(code: u16, text: &str) -> BrokerError {
    BrokerError {
        code: Some(code),
        level: Level::Connection,
        text: text.to_owned(),
    }
}

fn refused(refusal: AccessRefusal) -> ConnectError {
    ConnectError::Refused {
        broker: "main".to_owned(),
        refusal: Arc::new(refusal),
    }
}

/// A refusal says what to fix, once, after the broker it names; its
/// reason is the refusal alone.
#[test]
fn a_refusal_reads_as_what_to_fix() {
    let credentials = refused(AccessRefusal::Credentials {
        at: at(None),
        said: said(403, "ACCESS_REFUSED - Login was refused"),
    });
    let reason = "authentication refused by broker main: check the user and password in \
                  brokers.main.uri (broker: ACCESS_REFUSED - Login was refused)";
    assert_eq!(credentials.reason(), reason);
    let line = format!("broker \"main\" refused the connection: {reason}");
    assert_eq!(credentials.to_string(), line);
    assert_eq!(one_line(&credentials), line);

    let missing = AccessRefusal::NoVhost {
        at: at(Some("rabbit@two")),
        vhost: "orders".to_owned(),
        said: said(530, "NOT_ALLOWED - vhost orders not found"),
    };
    assert_eq!(
        refused(missing).reason(),
        "vhost refused by broker main (node rabbit@two): vhost \"orders\" does not exist; \
         create it (rabbitmqctl add_vhost) or fix the vhost in brokers.main.uri (broker: \
         NOT_ALLOWED - vhost orders not found)"
    );
    let forbidden = AccessRefusal::Vhost {
        at: at(None),
        user: "app".to_owned(),
        vhost: "orders".to_owned(),
        said: said(
            530,
            "NOT_ALLOWED - access to vhost 'orders' refused for user 'app'",
        ),
    };
    assert_eq!(
        refused(forbidden).reason(),
        "vhost refused by broker main: user \"app\" may not use vhost \"orders\"; grant it \
         permissions (rabbitmqctl set_permissions) or fix brokers.main.uri (broker: \
         NOT_ALLOWED - access to vhost 'orders' refused for user 'app')"
    );
}

/// A failed connect names the URI and says why once, the client's
/// error and its causes included.
#[test]
fn a_failed_connect_reads_as_its_uri_and_cause() {
    let uri = "amqp://guest:***@127.0.0.1:1/%2f".to_owned();
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
    let refused = ConnectError::Connect {
        uri: uri.clone(),
        failure: Arc::new(ConnectFailure::Amqp(lapin::Error::from(io))),
    };
    let line = "cannot connect to amqp://guest:***@127.0.0.1:1/%2f: IO error: Connection refused";
    assert_eq!(refused.to_string(), line);
    assert_eq!(refused.reason(), line);
    assert_eq!(one_line(&refused), line);
    let silent = ConnectError::Connect {
        uri,
        failure: Arc::new(ConnectFailure::Timeout(Duration::from_secs(10))),
    };
    assert_eq!(
        one_line(&silent),
        "cannot connect to amqp://guest:***@127.0.0.1:1/%2f: no answer within 10 s"
    );
    let waiting = ConnectError::BackingOff {
        broker: "down".to_owned(),
        last: Arc::new(ConnectFailure::NoNode),
    };
    assert_eq!(
        one_line(&waiting),
        "broker \"down\" unreachable, reconnecting: no node configured"
    );
    assert_eq!(
        ConnectError::ChannelTimeout(5000).to_string(),
        "no answer to channel.open within 5000 ms"
    );
}

#[test]
fn nodes_are_tried_in_preference_order_with_the_lost_one_last() {
    assert_eq!(preference(1, None), [0]);
    assert_eq!(preference(1, Some(0)), [0]);
    assert_eq!(preference(3, None), [0, 1, 2]);
    assert_eq!(preference(3, Some(0)), [1, 2, 0]);
    assert_eq!(preference(3, Some(1)), [0, 2, 1]);
}

/// Every node of a cluster that refuses connections is tried once,
/// in order, before the backoff; the error names the last.
#[tokio::test(start_paused = true)]
async fn every_node_is_tried_before_the_backoff() {
    let spec = Arc::new(BrokerSpec::cluster(
        "down",
        vec![
            "amqp://guest:secret@127.0.0.1:1/%2f".to_owned(),
            "amqp://guest:secret@127.0.0.1:2/%2f".to_owned(),
        ],
    ));
    let background = tokio_util::task::TaskTracker::new();
    let connector = Connector::new(spec, "unit", Role::Publish, background, Telemetry::new());
    match connector.channel(true, Duration::from_secs(1)).await {
        Err(ConnectError::Connect { uri, .. }) => {
            assert_eq!(uri, "amqp://guest:***@127.0.0.1:2/%2f")
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
    assert!(matches!(
        connector.channel(true, Duration::from_secs(1)).await,
        Err(ConnectError::BackingOff { .. })
    ));
}

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
