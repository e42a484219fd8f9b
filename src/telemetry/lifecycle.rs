//! The forwarder's life: the startup summary, configurations loaded and
//! reloaded, the shutdown and its bounds, and the admin listener.

use super::{Telemetry, millis};
use std::fmt::Display;
use std::time::Duration;

/// What the startup summary says.
#[derive(Debug)]
pub struct StartupSummary<'a> {
    /// The configuration file, when there is one.
    pub config_file: Option<&'a std::path::Path>,
    /// `name = uri` per broker, passwords masked.
    pub brokers: String,
    /// The inbound queue and its broker.
    pub inbound: String,
    /// `inbound.prefetch`.
    pub prefetch: u16,
    /// `branch: endpoint -> backup ...` per branch.
    pub branches: String,
    /// The dead-letter mode, exchange and routing key.
    pub dead_letter: String,
    /// The admin listener's address, or `disabled`.
    pub admin: String,
    /// `off`, or `on` with every `[sessions]` setting.
    pub sessions: String,
    /// `off`, or where the HTTP ingress listens and its limits.
    pub http: String,
    /// `off`, or the journal's stream, broker and settings.
    pub journal: String,
    /// `off`, or where spans are exported.
    pub otlp: String,
    /// `off`, or the control stream and who may send commands.
    pub control: String,
}

impl Telemetry {
    /// The forwarder starts: what it runs with.
    pub fn starting(&self, summary: &StartupSummary<'_>) {
        let config = summary
            .config_file
            .map_or_else(|| "-".into(), |p| p.display().to_string());
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            config = config.as_str(),
            brokers = summary.brokers.as_str(),
            inbound = summary.inbound.as_str(),
            prefetch = summary.prefetch,
            branches = summary.branches.as_str(),
            dead_letter = summary.dead_letter.as_str(),
            admin = summary.admin.as_str(),
            sessions = summary.sessions.as_str(),
            http = summary.http.as_str(),
            journal = summary.journal.as_str(),
            otlp = summary.otlp.as_str(),
            control = summary.control.as_str(),
            "starting"
        );
    }

    /// The routing configuration now live.
    pub fn config_loaded(&self, generation: u64, branches: usize) {
        self.metrics
            .config_generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
        tracing::info!(generation, branches, "routing configuration live");
    }

    /// A new configuration was refused (it does not load, or the broker
    /// refuses what it declares); the running one stays.
    pub fn reload_rejected(&self, error: &dyn Display) {
        tracing::error!(%error, "configuration reload rejected; the running configuration stays");
    }

    /// A reload changed `key`, which applies only at start; `effect` says
    /// what happens meanwhile.
    pub fn reload_needs_restart(&self, key: &str, effect: &str) {
        tracing::warn!(key, effect, "this key applies at the next start only");
    }

    /// A configuration reload was asked for, by `trigger`.
    pub fn reload_requested(&self, trigger: &str) {
        tracing::info!(trigger, "reloading the configuration");
    }

    /// The shutdown bound ran out with transactions unfinished.
    pub fn shutdown_bound_reached(&self, in_flight: usize, bound: Duration) {
        tracing::warn!(
            in_flight,
            bound_ms = millis(bound),
            "shutdown bound reached; unfinished messages go back to the queue"
        );
    }

    /// Background tasks were still running when the forwarder stopped.
    pub fn background_left(&self, tasks: usize, bound: Duration) {
        tracing::warn!(
            tasks,
            bound_ms = millis(bound),
            "background work did not finish within its bound; giving up on it"
        );
    }

    /// The forwarder has stopped.
    pub fn stopped(&self) {
        tracing::info!("stopped");
    }

    /// The admin endpoint listens.
    pub fn admin_listening(&self, addr: std::net::SocketAddr) {
        tracing::info!(%addr, "admin endpoint listening: /healthz /readyz /metrics");
    }

    /// An admin connection failed (a client that went away, a malformed request).
    pub fn admin_connection_failed(&self, error: &dyn Display) {
        tracing::debug!(%error, "admin connection failed");
    }
}
