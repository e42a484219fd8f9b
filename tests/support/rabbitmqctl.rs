//! `rabbitmqctl` against the shared test broker: queue and connection
//! listings, prefix cleanup, closing named connections.

use std::process::Command;

use super::{TestBroker, amqp_url, amqp_vhost};

/// Runs `rabbitmqctl <args>` on a blocking thread; returns stdout, panics on failure.
pub async fn rabbitmqctl(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new("rabbitmqctl")
            .args(&args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run rabbitmqctl {args:?}: {e}"));
        if !out.status.success() {
            panic!(
                "rabbitmqctl {args:?} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .expect("rabbitmqctl task panicked")
}

/// `rabbitmqctl <args>` returning its failure (stderr) instead of panicking.
pub async fn try_rabbitmqctl(args: &[&str]) -> Result<String, String> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new("rabbitmqctl")
            .args(&args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    })
    .await
    .expect("rabbitmqctl task panicked")
}

/// The operating-system pid of the shared broker's Erlang VM, for its CPU
/// and memory in `/proc`; `None` when it cannot be asked.
pub async fn broker_os_pid() -> Option<u32> {
    let out = try_rabbitmqctl(&["eval", "os:getpid()."]).await.ok()?;
    out.trim().trim_matches('"').parse().ok()
}

/// `(messages_ready, messages_unacknowledged)` of `queue` as the broker
/// reports them (`rabbitmqctl list_queues`); `None` if the queue is missing.
/// Unlike a passive declare, this also sees the unacked (in-flight) ones.
pub async fn ready_unacked(queue: &str) -> Option<(u64, u64)> {
    let vhost = amqp_vhost();
    let out = rabbitmqctl(&[
        "list_queues",
        "-p",
        &vhost,
        "--silent",
        "name",
        "messages_ready",
        "messages_unacknowledged",
    ])
    .await;
    ready_unacked_in(&out, queue)
}

/// The ready and unacked counts of `queue` in `rabbitmqctl list_queues
/// --silent name messages_ready messages_unacknowledged` output.
pub fn ready_unacked_in(out: &str, queue: &str) -> Option<(u64, u64)> {
    out.lines().find_map(|line| {
        let mut fields = line.split('\t').map(str::trim);
        if fields.next()? != queue {
            return None;
        }
        let ready = fields.next()?.parse().ok()?;
        let unacked = fields.next()?.parse().ok()?;
        Some((ready, unacked))
    })
}

/// Names of the queues in the test vhost that start with `prefix` (`rabbitmqctl list_queues`).
pub async fn rabbitmq_queues_with_prefix(prefix: &str) -> Vec<String> {
    let vhost = amqp_vhost();
    let out = rabbitmqctl(&["list_queues", "-p", &vhost, "--silent", "name"]).await;
    lines_with_prefix(&out, prefix)
}

/// Names of the exchanges in the test vhost that start with `prefix` (`rabbitmqctl list_exchanges`).
pub async fn rabbitmq_exchanges_with_prefix(prefix: &str) -> Vec<String> {
    let vhost = amqp_vhost();
    let out = rabbitmqctl(&["list_exchanges", "-p", &vhost, "--silent", "name"]).await;
    lines_with_prefix(&out, prefix)
}

fn lines_with_prefix(out: &str, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && l.starts_with(prefix))
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

/// Deletes every queue and exchange whose name starts with `prefix`; returns how many.
pub async fn delete_all_with_prefix(prefix: &str) -> usize {
    let queues = rabbitmq_queues_with_prefix(prefix).await;
    let exchanges = rabbitmq_exchanges_with_prefix(prefix).await;
    if queues.is_empty() && exchanges.is_empty() {
        return 0;
    }
    let broker = TestBroker::connect_to(&amqp_url(), &format!("{prefix}-cleanup")).await;
    let q: Vec<&str> = queues.iter().map(String::as_str).collect();
    let x: Vec<&str> = exchanges.iter().map(String::as_str).collect();
    broker.cleanup(&q, &x).await;
    broker.close().await;
    queues.len() + exchanges.len()
}

/// One row of `rabbitmqctl list_connections pid client_properties`.
#[derive(Debug, Clone)]
pub struct BrokerConnection {
    /// The connection's Erlang pid, as `close_connection` takes it.
    pub pid: String,
    /// The client-provided `connection_name`, if the client sent one.
    pub name: Option<String>,
}

/// Every connection on the broker with its client-provided name (`rabbitmqctl list_connections`).
pub async fn broker_connections() -> Vec<BrokerConnection> {
    let out = rabbitmqctl(&["list_connections", "--silent", "pid", "client_properties"]).await;
    out.lines()
        .filter_map(|line| {
            let (pid, props) = line.split_once('\t')?;
            let pid = pid.trim();
            if !pid.starts_with('<') {
                return None;
            }
            Some(BrokerConnection {
                pid: pid.to_string(),
                name: parse_connection_name(props),
            })
        })
        .collect()
}

/// Client-provided names of all connections on the broker (unnamed ones are skipped).
pub async fn connection_names() -> Vec<String> {
    broker_connections()
        .await
        .into_iter()
        .filter_map(|c| c.name)
        .collect()
}

/// The connections whose client-provided name contains `fragment`.
pub async fn connections_named(fragment: &str) -> Vec<BrokerConnection> {
    broker_connections()
        .await
        .into_iter()
        .filter(|c| c.name.as_deref().is_some_and(|n| n.contains(fragment)))
        .collect()
}

/// Closes (`rabbitmqctl close_connection`) every connection whose name contains `fragment`; returns how many.
pub async fn close_connections_named(fragment: &str) -> usize {
    let named = connections_named(fragment).await;
    for conn in &named {
        rabbitmqctl(&["close_connection", &conn.pid, "test fault"]).await;
    }
    named.len()
}

/// Extracts `connection_name` from rabbitmqctl's Erlang-ish rendering of client_properties,
/// e.g. `[...,{"connection_name","my-name"},...]`.
pub(super) fn parse_connection_name(props: &str) -> Option<String> {
    const KEY: &str = "{\"connection_name\",\"";
    let start = props.find(KEY)? + KEY.len();
    let mut name = String::new();
    let mut chars = props[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => name.push(chars.next()?),
            '"' => return Some(name),
            c => name.push(c),
        }
    }
    None
}
