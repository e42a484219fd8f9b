//! Sessions over HTTP: each session's requests are delivered in the order
//! they come, the whole set replayed to the backup when a branch fails over
//! mid-session, and a closed session refuses late messages.

use crate::support;

use lapin::types::AMQPValue;
use support::config::{Branch, Endpoint, Filter, Forwarder, Value};
use support::ingress::{Client, start_ingress, stop_clean};
use support::{TestBroker, amqp_str, field_table, unique_prefix};
use switchyard::Options;

const MESSAGES: usize = 10;

async fn send_session(client: Client, id: &'static str) -> Vec<u16> {
    let mut statuses = Vec::new();
    for i in 1..=MESSAGES {
        let end = if i == MESSAGES { "true" } else { "false" };
        let body = format!("{id}-{i}");
        let reply = client
            .post(
                "/messages/work",
                &[("session-id", id), ("session-end", end)],
                body.as_bytes(),
            )
            .await;
        statuses.push(reply.status);
    }
    statuses
}

/// The bodies of session `id` in `queue`, in queue order.
fn of_session(messages: &[support::Message], id: &str) -> Vec<String> {
    messages
        .iter()
        .map(|m| m.body_str())
        .filter(|b| b.starts_with(&format!("{id}-")))
        .collect()
}

#[tokio::test]
async fn sessions_over_http_reach_every_branch_whole_and_in_order() {
    let p = unique_prefix("http-sessions");
    let broker = TestBroker::connect(&p).await;
    // The service primary takes three messages, then refuses (nacks) the rest.
    broker
        .declare_queue_with(
            &format!("{p}.primary"),
            field_table([
                ("x-max-length", AMQPValue::LongLongInt(3)),
                ("x-overflow", amqp_str("reject-publish")),
            ]),
        )
        .await;
    let config = Forwarder::new(&p)
        .endpoint(Endpoint::queue("primary", &format!("{p}.primary")).undeclared())
        .endpoint(Endpoint::queue("backup", &format!("{p}.backup")))
        .endpoint(Endpoint::queue("logging", &format!("{p}.logging")))
        .backup_list("backups", &["backup"])
        .filter("all", Filter::match_all())
        .branch(Branch::new("service", "all", "primary").backups("backups"))
        .branch(Branch::new("logging", "all", "logging"))
        .sessions(&[
            ("max_open", Value::from(4u32)),
            ("max_messages", Value::from(20u32)),
        ])
        .http(&[]);
    let inbound = format!("{p}.in");
    let (running, client) =
        start_ingress(&config, Options::default(), Some((&broker, &inbound))).await;

    let a = tokio::spawn(send_session(client.clone(), "A"));
    let b = tokio::spawn(send_session(client.clone(), "B"));
    for (id, statuses) in [("A", a.await), ("B", b.await)] {
        let statuses = statuses.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(statuses, vec![202; MESSAGES], "session {id}");
    }
    let late = client
        .post("/messages/work", &[("session-id", "A")], b"A-11")
        .await;
    assert_eq!(late.status, 409, "{}", late.text);
    assert!(
        late.json["reason"]
            .as_str()
            .is_some_and(|r| r.contains("session \"A\"")),
        "{}",
        late.text
    );

    let primary = broker.get_all(&format!("{p}.primary")).await;
    let backup = broker.get_all(&format!("{p}.backup")).await;
    let logging = broker.get_all(&format!("{p}.logging")).await;
    assert_eq!(primary.len(), 3, "the primary took three, then refused");
    assert!(!backup.is_empty(), "a session failed over");
    for id in ["A", "B"] {
        let whole: Vec<String> = (1..=MESSAGES).map(|i| format!("{id}-{i}")).collect();
        assert_eq!(of_session(&logging, id), whole, "logging, session {id}");
        let on_primary = of_session(&primary, id);
        let on_backup = of_session(&backup, id);
        // The session that failed over replays its whole set to the backup;
        // one the primary never refused stays there whole.
        if on_backup.is_empty() {
            assert_eq!(on_primary, whole, "service, session {id}");
        } else {
            assert_eq!(on_backup, whole, "service backup, session {id}");
            let replays = backup
                .iter()
                .filter(|m| m.body_str().starts_with(&format!("{id}-")))
                .filter(|m| m.header("x-switchyard-replay").is_some())
                .count();
            assert_eq!(
                replays,
                on_primary.len(),
                "session {id}: what the primary held is replayed"
            );
        }
    }
    stop_clean(running, &broker, &p).await;
}

#[tokio::test]
async fn a_session_past_its_limits_is_413_and_past_max_open_429() {
    let p = unique_prefix("http-session-limits");
    let broker = TestBroker::connect(&p).await;
    let config = Forwarder::new(&p)
        .match_all(&p)
        .sessions(&[
            ("max_open", Value::from(2u32)),
            ("max_messages", Value::from(3u32)),
            // Configured in another case than the requests send it.
            ("id_header", Value::from("Session-Id")),
        ])
        .http(&[]);
    let inbound = format!("{p}.in");
    let (running, client) =
        start_ingress(&config, Options::default(), Some((&broker, &inbound))).await;
    let send = |id: &'static str, body: &'static str| {
        let client = client.clone();
        async move {
            client
                .post("/messages/k", &[("session-id", id)], body.as_bytes())
                .await
        }
    };
    for i in 1..=3 {
        let reply = send("big", ["b1", "b2", "b3"][i - 1]).await;
        assert_eq!(reply.status, 202, "{}", reply.text);
    }
    let over = send("big", "b4").await;
    assert_eq!(over.status, 413, "{}", over.text);
    assert_eq!(send("big", "b5").await.status, 409, "the session is closed");
    assert_eq!(send("one", "o1").await.status, 202);
    assert_eq!(send("two", "t1").await.status, 202);
    let full = send("three", "x1").await;
    assert_eq!(full.status, 429, "{}", full.text);
    let metrics = running.telemetry().render();
    assert!(
        metrics.contains("switchyard_sessions_open 2\n"),
        "one and two are open, big closed: {metrics}"
    );
    assert_eq!(
        full.headers.get("retry-after").map(String::as_str),
        Some("1")
    );
    let bodies: Vec<String> = broker
        .get_all(&format!("{p}.service"))
        .await
        .iter()
        .map(|m| m.body_str())
        .collect();
    assert_eq!(
        bodies,
        ["b1", "b2", "b3", "o1", "t1"],
        "nothing refused was published"
    );
    stop_clean(running, &broker, &p).await;
}
