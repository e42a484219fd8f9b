//! switchyard: a transactional multicast forwarder for RabbitMQ.
//!
//! Work items are consumed from an inbound queue under peek-lock, matched
//! against a filter table, and multicast to every matching branch's
//! endpoint with publisher confirms and the mandatory flag. The inbound
//! message is acked only when every branch is confirmed; a failed branch
//! walks its backup list; an exhausted list dead-letters the message with
//! the reason.
//!
//! # Layout
//!
//! Modules import one way: the leaves ([`amqp`], `uri`, [`destination`],
//! `wire`, `backoff`, [`errors`], `recent`, [`listen`], [`telemetry`])
//! import no other module of the crate; then the envelope, the
//! configuration and routing, the broker, the pipeline, and the commands.
//! Modules the binary, the tests and the benchmarks do not use are private
//! to the crate.
//!
//! - [`amqp`]: the AMQP value types messages are made of.
//! - `uri`: broker URIs checked, compared and shown without passwords.
//! - [`destination`]: endpoints, queue types and dead-letter settings.
//! - `wire`: every `x-switchyard-*` header the forwarder reads or writes.
//! - `backoff`, [`errors`] and `recent`: the one backoff; an error and its
//!   causes on one line; keys producers name, bounded by age and count.
//! - [`config`]: the TOML file (raw serde types) and its compilation into
//!   [`config::Settings`], which only `compile` makes and so cannot be
//!   invalid.
//! - [`routing`]: filters and the compiled filter table. Pure, no I/O.
//! - [`envelope`]: the inbound message as the pipeline sees it.
//! - `pipeline`: consume → screen → route → deliver → settle, one
//!   configuration generation per transaction; deliver is one engine for
//!   independent messages and sessions.
//! - [`broker`]: every lapin connection and channel: connectors, confirm
//!   channels, the consumer and its acks, topology, and the `Publish` seam
//!   the engine publishes through.
//! - [`telemetry`]: log events and metrics, named once, in a handle.
//! - [`ingress`]: the HTTP ingress: requests become messages through the
//!   pipeline's intake, answered with what happened to every branch.
//! - `admin`: the HTTP endpoint: `/healthz`, `/readyz`, `/metrics`, and
//!   `/control` and `/registry`, which steer the group.
//! - [`control`]: the group's pause, drains and registrations, carried to
//!   every instance through a RabbitMQ stream.
//! - [`ctl`]: `switchyard ctl`, one command to a running forwarder.
//! - [`dlq`]: `dlq inspect` and `dlq redrive`, the dead-letter queue read
//!   in place.
//! - [`journal`]: one record per settled message in a RabbitMQ stream;
//!   [`traces`]: the same message's spans, exported over OTLP.
//! - [`reload`]: new configurations on SIGHUP and on a change of the file.
//! - [`duration`]: durations as operators type them (`10m`, `2h`, `1d`).
//!
//! The binary is thin: it parses the command line, loads the configuration
//! and calls [`run_with`].

#![forbid(unsafe_code)]

pub(crate) mod admin;
pub mod amqp;
pub(crate) mod backoff;
pub mod broker;
pub mod config;
pub mod control;
pub mod ctl;
pub mod destination;
pub mod dlq;
pub mod duration;
pub mod envelope;
pub mod errors;
pub mod ingress;
pub mod journal;
pub mod listen;
pub(crate) mod pipeline;
mod recent;
pub mod reload;
pub mod routing;
pub mod telemetry;
pub mod traces;
pub(crate) mod uri;
pub(crate) mod wire;

pub use pipeline::RunError;
use pipeline::{Forwarder, NotReady};
pub use telemetry::Telemetry;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// How to run a forwarder, beyond its configuration.
#[derive(Debug, Default)]
pub struct Options {
    /// Where its metrics are kept and its events logged from.
    pub telemetry: Telemetry,
    /// A broker that refuses the credentials or the vhost at start ends the
    /// run with [`RunError::Refused`] instead of being retried.
    pub fail_fast: bool,
    /// The configuration file, named in the startup summary.
    pub config_file: Option<PathBuf>,
    /// An admin listener already bound, used instead of `admin.listen`.
    pub admin: Option<std::net::TcpListener>,
    /// An HTTP ingress listener already bound, used instead of
    /// `ingress.http.listen` (when `[ingress.http]` is set).
    pub http: Option<std::net::TcpListener>,
    /// New configurations to switch to while running (see [`reload`]);
    /// `None`: the configuration never changes.
    pub reloads: Option<tokio::sync::mpsc::Receiver<reload::Reload>>,
}

/// Runs the forwarder on `settings` with default [`Options`] until
/// `shutdown` completes, then stops consuming, drains in-flight transactions
/// (bounded by `shutdown_timeout_ms`) and closes its connections.
pub async fn run(
    settings: config::Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    run_with(settings, Options::default(), shutdown).await
}

/// [`run`] with `options`: logs the startup summary, serves the admin
/// endpoint (when `admin.listen` is set or a listener is given) for as long
/// as the forwarder runs, and stops it with the forwarder.
pub async fn run_with(
    settings: config::Settings,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let admin_error = RunError::Admin;
    let admin = match (options.admin, settings.admin_listen) {
        (Some(listener), _) => Some(admin::Admin::from_std(listener).map_err(admin_error)?),
        (None, Some(addr)) => Some(admin::Admin::bind(addr).await.map_err(admin_error)?),
        (None, None) => None,
    };
    let http = match &settings.http {
        Some(config) => Some(
            ingress::server::Listener::bind(config, options.http)
                .await
                .map_err(RunError::Ingress)?,
        ),
        None => None,
    };
    let telemetry = options.telemetry;
    telemetry.starting(&startup_summary(
        &settings,
        options.config_file.as_deref(),
        admin.as_ref().map(admin::Admin::local_addr),
        http.as_ref().map(ingress::server::Listener::local_addr),
    ));
    // Said here, where both sockets already listen, so the log reads in one
    // order: what listens, then the brokers connected, then consuming.
    if let Some(admin) = &admin {
        telemetry.admin_listening(admin.local_addr());
    }
    if let Some(http) = &http {
        telemetry.http_listening(http.local_addr(), http.is_tls());
    }
    let token = CancellationToken::new();
    let trigger = token.clone();
    let signal = tokio::spawn(async move {
        shutdown.await;
        trigger.cancel();
    });
    let (settings_http, settings_sessions) = (settings.http.clone(), settings.sessions.clone());
    let mut forwarder = Forwarder::new(settings, telemetry.clone()).fail_fast(options.fail_fast);
    if let Some(reloads) = options.reloads {
        forwarder = forwarder.reloads(reloads);
    }
    let admin_stop = CancellationToken::new();
    let server = admin.map(|admin| {
        let readiness = forwarder.readiness();
        let ready: admin::Ready<NotReady> = Arc::new(move || readiness.check());
        let steering: Option<Arc<dyn control::Steer>> = Some(Arc::new(forwarder.steering()));
        tokio::spawn(admin.serve(telemetry.clone(), ready, steering, admin_stop.clone()))
    });
    // The ingress stops taking requests when shutdown starts; the ones it
    // took finish as the forwarder drains.
    let ingress = match (http, &settings_http) {
        (Some(listener), Some(config)) => {
            let ingress = ingress::Ingress::new(
                config.clone(),
                settings_sessions.as_ref(),
                forwarder.intake(),
                telemetry.clone(),
            );
            Some(tokio::spawn(
                listener.serve(Arc::new(ingress), token.clone()),
            ))
        }
        _ => None,
    };
    let result = forwarder.run(token).await;
    admin_stop.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    if let Some(ingress) = ingress {
        let _ = ingress.await;
    }
    signal.abort();
    result
}

fn startup_summary<'a>(
    settings: &config::Settings,
    config_file: Option<&'a std::path::Path>,
    admin: Option<std::net::SocketAddr>,
    http: Option<std::net::SocketAddr>,
) -> telemetry::StartupSummary<'a> {
    let brokers: Vec<String> = settings
        .brokers
        .values()
        .map(|b| format!("{}={}", b.name, b.redacted_uri()))
        .collect();
    let branches: Vec<String> = settings
        .routing
        .branch_endpoints()
        .map(|(name, endpoints)| {
            let list: Vec<&str> = endpoints.iter().map(|e| e.name.as_str()).collect();
            format!("{name}: {}", list.join(" -> "))
        })
        .collect();
    let inbound = settings.inbound();
    telemetry::StartupSummary {
        config_file,
        brokers: brokers.join(", "),
        inbound: inbound.map_or_else(
            || "none (HTTP ingress only)".to_owned(),
            |i| format!("{} on {}", i.queue, i.broker),
        ),
        prefetch: inbound.map_or(0, |i| i.prefetch),
        branches: branches.join("; "),
        dead_letter: settings.dead_letter().map_or_else(
            || "none".to_owned(),
            |dl| {
                format!(
                    "{} via exchange \"{}\" key \"{}\"",
                    dl.mode, dl.exchange, dl.routing_key
                )
            },
        ),
        admin: admin.map_or_else(|| "disabled".to_owned(), |a| a.to_string()),
        sessions: config::Sessions::summary(settings.sessions.as_ref()),
        http: match (settings.http.as_ref(), http) {
            (Some(config), Some(addr)) => {
                let mut config = config.clone();
                config.listen = addr;
                config::HttpIngress::summary(Some(&config))
            }
            _ => "off".to_owned(),
        },
        journal: config::Journal::summary(settings.journal.as_ref()),
        control: config::Control::summary(settings.control.as_ref()),
        otlp: config::Otlp::summary(settings.otlp.as_ref()),
    }
}
