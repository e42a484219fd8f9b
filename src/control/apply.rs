//! A record applied to the group's state: the one place each kind of
//! record changes it, saying which parts changed.

use super::record::{Body, Record};
use super::state::{GroupState, Seen, Since};

/// Which parts of the state a record changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changed {
    /// Paused or resumed.
    pub paused: bool,
    /// The set of drained endpoints.
    pub drains: bool,
    /// The set of registered endpoints (a renewal changes only a lease).
    pub registrations: bool,
}

impl Changed {
    /// Whether anything the pipeline reads changed.
    pub fn any(self) -> bool {
        self.paused || self.drains || self.registrations
    }
}

impl GroupState {
    /// Applies `record`, read at `offset`, at `now_ms`: a registration
    /// whose lease already ended (read back while recovering) is dropped.
    pub fn apply(&mut self, offset: u64, record: &Record, now_ms: u64) -> Changed {
        let since = || Since {
            by: record.instance.clone(),
            at_ms: record.at_ms,
        };
        let mut changed = Changed::default();
        if record.body.is_command() {
            self.offset = Some(offset);
        }
        match &record.body {
            Body::Hello => {
                let seen = self.instances.entry(record.instance.clone()).or_default();
                seen.joined_at_ms = record.at_ms;
                seen.joined = Some(offset);
                self.forget_oldest_instances();
            }
            Body::Leave => {
                self.instances.remove(&record.instance);
            }
            Body::Alive { heartbeat_ms } => {
                // One forgotten while cut off comes back with its next beat.
                let seen = self
                    .instances
                    .entry(record.instance.clone())
                    .or_insert_with(|| Seen {
                        joined_at_ms: record.at_ms,
                        ..Seen::default()
                    });
                seen.heartbeat_ms = Some(*heartbeat_ms);
                self.forget_silent_instances(&record.instance, *heartbeat_ms, record.at_ms);
                self.forget_oldest_instances();
            }
            Body::Applied { offset } => {
                let seen = self.instances.entry(record.instance.clone()).or_default();
                seen.applied = seen.applied.max(Some(*offset));
            }
            Body::Pause => {
                changed.paused = self.paused.is_none();
                if changed.paused {
                    self.paused = Some(since());
                }
            }
            Body::Resume => changed.paused = self.paused.take().is_some(),
            Body::Drain { endpoint } => {
                changed.drains = !self.drained.contains_key(endpoint);
                if changed.drains {
                    self.drained.insert(endpoint.clone(), since());
                }
            }
            Body::Undrain { endpoint } => {
                changed.drains = self.drained.remove(endpoint).is_some();
            }
            Body::Register(registration) => {
                let drains = self.drained.len();
                changed.registrations = self.register(registration, now_ms);
                changed.drains = self.drained.len() != drains;
            }
            Body::Unregister { branch, name } => {
                let drains = self.drained.len();
                changed.registrations = self.remove(branch, name);
                changed.drains = self.drained.len() != drains;
            }
            Body::Snapshot { .. } => {}
        }
        // Any record is a sign of life from its writer, if it is listed.
        if let Some(seen) = self.instances.get_mut(&record.instance) {
            seen.seen_at_ms = seen.seen_at_ms.max(record.at_ms);
        }
        changed
    }
}
