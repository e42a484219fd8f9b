//! Probing a down endpoint in the background, every `probe_interval_ms`,
//! until a probe finds it working. A drained endpoint's turns pass without
//! a probe, so an undrain is followed by one within an interval.

use super::actor::Actor;
use super::request::Command;
use crate::broker::health::ProbeFailure;
use tokio::time::Instant;

impl Actor {
    /// Checks a down endpoint in the background: a channel opens on its
    /// broker, and what it publishes to exists.
    pub(super) fn probe(&mut self) {
        if self.health.is_drained() {
            self.next_probe = Some(Instant::now() + self.endpoint.probe_interval);
            return;
        }
        self.next_probe = None;
        self.probe_running = true;
        let Some(commands) = self.commands.upgrade() else {
            return;
        };
        let connector = self.connector.clone();
        let endpoint = self.endpoint.clone();
        let stop = self.stop.clone();
        self.background.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                result = crate::broker::health::probe(&connector, &endpoint) => {
                    let _ = commands.send(Command::Probed(result));
                }
            }
        });
    }

    pub(super) fn probed(&mut self, result: Result<(), ProbeFailure>) {
        self.probe_running = false;
        match result {
            Ok(()) => self.health.mark_up(),
            Err(why) => {
                tracing::debug!(endpoint = %self.endpoint.name, error = %why, "probe failed");
                self.next_probe = Some(Instant::now() + self.endpoint.probe_interval);
            }
        }
    }
}
