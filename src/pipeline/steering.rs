//! Steering: the running forwarder as the admin endpoint's `/control` and
//! `/registry` see it. A command is checked against the configuration in
//! force (as its file says) and the group's state, then carried to every
//! instance through the group's stream ([`crate::control::Group`]); the
//! answer is the status once this instance has applied it.

use super::live::Live;
use crate::broker::Publish;
use crate::control::{Command, Steer, SteerError, Steered};
use crate::journal::record::rfc3339;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// A handle to the running forwarder's group. Cheap to clone.
#[derive(Clone)]
pub struct Steering {
    live: Arc<Live>,
}

impl Steering {
    pub(super) fn new(live: Arc<Live>) -> Self {
        Self { live }
    }

    /// Checks `command`, carries it to the group and waits until this
    /// instance applied it.
    async fn carry_out(&self, command: Command) -> Result<Value, SteerError> {
        let group = &self.live.common.group;
        let body = command.check(&self.live.base(), &group.state())?;
        group.submit(body).await?;
        // A registration is live for the next message once this answers.
        self.live.reregister().await;
        Ok(self.status_now())
    }

    /// The group's state as this instance holds it, with each endpoint's
    /// state and the live generation, as `GET /control/status` answers.
    fn status_now(&self) -> Value {
        let group = &self.live.common.group;
        let state = group.state();
        let generation = self.live.current();
        let publish = &generation.publishers;
        let endpoints: Vec<Value> = generation
            .settings
            .endpoints
            .values()
            .map(|e| {
                let word = match publish.health(e) {
                    crate::broker::Health::Drained => "drained",
                    crate::broker::Health::Up => "up",
                    _ => "down",
                };
                let registered = state.registration(&e.name).is_some();
                json!({ "name": e.name, "state": word, "registered": registered })
            })
            .collect();
        let registrations: Vec<Value> = state
            .registered()
            .map(|r| {
                let expires = UNIX_EPOCH + Duration::from_millis(r.expires_at_ms);
                json!({
                    "branch": r.branch,
                    "name": r.name,
                    "broker": r.broker,
                    "exchange": r.exchange,
                    "routing_key": r.routing_key,
                    "ttl_ms": r.ttl_ms,
                    "expires_at": rfc3339(expires),
                })
            })
            .collect();
        let instances: Vec<Value> = state
            .instances
            .iter()
            .map(|(name, seen)| {
                json!({
                    "instance": name,
                    "joined_at": rfc3339(UNIX_EPOCH + Duration::from_millis(seen.joined_at_ms)),
                    "last_seen_at": rfc3339(UNIX_EPOCH + Duration::from_millis(seen.seen_at_ms)),
                    "applied": seen.applied,
                    "in_step": state.in_step(seen),
                })
            })
            .collect();
        let paused_by = state.paused.as_ref().map(|since| {
            json!({
                "instance": since.by,
                "at": rfc3339(UNIX_EPOCH + Duration::from_millis(since.at_ms)),
            })
        });
        json!({
            "group": generation.settings.name,
            "instance": group.instance(),
            "control": group.on(),
            "recovered": group.is_recovered(),
            "generation": generation.number,
            "paused": state.paused.is_some(),
            "paused_by": paused_by,
            "endpoints": endpoints,
            "registrations": registrations,
            "instances": instances,
            "offset": state.offset,
        })
    }
}

impl Steer for Steering {
    fn tokens(&self) -> Option<Vec<String>> {
        self.live.base().control.map(|c| c.tokens)
    }

    fn status(&self) -> Value {
        self.status_now()
    }

    fn command(&self, command: Command) -> Steered<'_> {
        Box::pin(self.carry_out(command))
    }
}
