//! The group's state, as every instance rebuilds it from the control
//! stream: whether it is paused, which endpoints are drained, which
//! service instances are registered into which branch until when, and
//! which instances have applied what. Pure: records in, state out.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Instances remembered in the state, at most (the most recently joined).
const MAX_INSTANCES: usize = 64;
/// How many of its own heartbeat intervals an instance may stay silent
/// before the group takes it for gone.
const SILENT_BEATS: u64 = 3;

/// Who asked for something, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Since {
    /// The instance the command was sent to.
    pub by: String,
    /// When, unix milliseconds.
    pub at_ms: u64,
}

/// What the group knows of one instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// When it last joined (started or reconnected), unix milliseconds.
    pub joined_at_ms: u64,
    /// The offset of its last join: it knows every command before it.
    #[serde(default)]
    pub joined: Option<u64>,
    /// The offset of the last command it says it applied.
    pub applied: Option<u64>,
    /// When it last wrote a record, unix milliseconds (its own clock).
    #[serde(default)]
    pub seen_at_ms: u64,
    /// How often it says it is alive, once it has said so.
    #[serde(default)]
    pub heartbeat_ms: Option<u64>,
}

/// A service instance registered into a branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The registrable branch.
    pub branch: String,
    /// Its name: the endpoint's name in logs, metrics and lists.
    pub name: String,
    /// A key of `[brokers]`.
    pub broker: String,
    /// The exchange copies are published to (`""`: the default exchange).
    pub exchange: String,
    /// The routing key copies are published with.
    pub routing_key: String,
    /// The lease, in milliseconds.
    pub ttl_ms: u64,
    /// When the lease ends unless renewed, unix milliseconds.
    pub expires_at_ms: u64,
}

impl Registration {
    /// Whether `other` registers the same endpoint (a renewal, when only
    /// the lease differs).
    pub fn same_endpoint(&self, other: &Self) -> bool {
        (
            &self.branch,
            &self.name,
            &self.broker,
            &self.exchange,
            &self.routing_key,
        ) == (
            &other.branch,
            &other.name,
            &other.broker,
            &other.exchange,
            &other.routing_key,
        )
    }
}

/// The group's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupState {
    /// Set while the group is paused.
    pub paused: Option<Since>,
    /// Drained endpoints, by name.
    pub drained: BTreeMap<String, Since>,
    /// Registrations by branch, then by name.
    pub registrations: BTreeMap<String, BTreeMap<String, Registration>>,
    /// The offset of the last command applied.
    pub offset: Option<u64>,
    /// Instances by name.
    pub instances: BTreeMap<String, Seen>,
}

impl GroupState {
    /// Drops every registration whose lease ended by `now_ms`, with its
    /// drain; whether any did.
    pub fn lapse(&mut self, now_ms: u64) -> bool {
        let mut gone = Vec::new();
        for names in self.registrations.values_mut() {
            names.retain(|name, r| {
                let keep = r.expires_at_ms > now_ms;
                if !keep {
                    gone.push(name.clone());
                }
                keep
            });
        }
        self.registrations.retain(|_, names| !names.is_empty());
        for name in &gone {
            self.drained.remove(name);
        }
        !gone.is_empty()
    }

    /// When the next lease ends, unix milliseconds.
    pub fn next_expiry(&self) -> Option<u64> {
        self.registrations
            .values()
            .flat_map(BTreeMap::values)
            .map(|r| r.expires_at_ms)
            .min()
    }

    /// Every registration, by branch then name.
    pub fn registered(&self) -> impl Iterator<Item = &Registration> {
        self.registrations.values().flat_map(BTreeMap::values)
    }

    /// The registration named `name`, in whichever branch.
    pub fn registration(&self, name: &str) -> Option<&Registration> {
        self.registered().find(|r| r.name == name)
    }

    /// How many registrations there are.
    pub fn registration_count(&self) -> usize {
        self.registrations.values().map(BTreeMap::len).sum()
    }

    /// Whether `seen` has applied every command so far (or joined after
    /// the last).
    pub fn in_step(&self, seen: &Seen) -> bool {
        self.offset
            .is_none_or(|last| seen.applied >= Some(last) || seen.joined > Some(last))
    }

    /// Registers (or renews); whether the set of endpoints changed.
    pub(super) fn register(&mut self, registration: &Registration, now_ms: u64) -> bool {
        if registration.expires_at_ms <= now_ms {
            return false;
        }
        // A name is one endpoint: registered elsewhere, it moves.
        let elsewhere: Vec<String> = self
            .registrations
            .iter()
            .filter(|(branch, names)| {
                **branch != registration.branch && names.contains_key(&registration.name)
            })
            .map(|(branch, _)| branch.clone())
            .collect();
        let mut changed = false;
        for branch in elsewhere {
            changed |= self.remove(&branch, &registration.name);
        }
        let names = self
            .registrations
            .entry(registration.branch.clone())
            .or_default();
        let previous = names.insert(registration.name.clone(), registration.clone());
        changed || previous.is_none_or(|p| !p.same_endpoint(registration))
    }

    /// Removes a registration, and its drain (the name is that endpoint's
    /// and no other's); whether it was there.
    pub(super) fn remove(&mut self, branch: &str, name: &str) -> bool {
        let Some(names) = self.registrations.get_mut(branch) else {
            return false;
        };
        let removed = names.remove(name).is_some();
        if names.is_empty() {
            self.registrations.remove(branch);
        }
        if removed {
            self.drained.remove(name);
        }
        removed
    }

    /// Forgets every instance other than `by` silent for more than
    /// [`SILENT_BEATS`] of its own heartbeats at `at_ms` (a killed one;
    /// one that stopped cleanly said it leaves); one not heard beating yet
    /// is judged by `by_beat_ms`, the beat of the record's writer. Judged
    /// at a record's time, not a reader's clock, so every instance forgets
    /// the same ones.
    pub(super) fn forget_silent_instances(&mut self, by: &str, by_beat_ms: u64, at_ms: u64) {
        self.instances.retain(|name, seen| {
            let beat = seen.heartbeat_ms.unwrap_or(by_beat_ms);
            name == by
                || seen
                    .seen_at_ms
                    .saturating_add(beat.saturating_mul(SILENT_BEATS))
                    >= at_ms
        });
    }

    pub(super) fn forget_oldest_instances(&mut self) {
        while self.instances.len() > MAX_INSTANCES {
            let oldest = self
                .instances
                .iter()
                .min_by_key(|(_, seen)| seen.joined_at_ms)
                .map(|(name, _)| name.clone());
            match oldest {
                Some(name) => self.instances.remove(&name),
                None => break,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::{Body, Record};
    use super::*;

    fn record(instance: &str, at_ms: u64, body: Body) -> Record {
        Record {
            group: "g".into(),
            instance: instance.into(),
            id: format!("{instance}-{at_ms}"),
            at_ms,
            body,
        }
    }

    fn registration(name: &str, key: &str, expires_at_ms: u64) -> Registration {
        Registration {
            branch: "service".into(),
            name: name.into(),
            broker: "main".into(),
            exchange: String::new(),
            routing_key: key.into(),
            ttl_ms: 10_000,
            expires_at_ms,
        }
    }

    #[test]
    fn pause_drain_and_their_reversals_change_the_state_once_each() {
        let mut state = GroupState::default();
        let pause = record("a", 1, Body::Pause);
        assert!(state.apply(0, &pause, 1).paused);
        assert!(!state.apply(1, &pause, 1).paused, "paused twice is once");
        assert_eq!(state.paused.as_ref().map(|s| s.by.as_str()), Some("a"));
        let drain = Body::Drain {
            endpoint: "p".into(),
        };
        assert!(state.apply(2, &record("b", 2, drain), 2).drains);
        let undrain = Body::Undrain {
            endpoint: "p".into(),
        };
        assert!(state.apply(3, &record("b", 3, undrain.clone()), 3).drains);
        assert!(!state.apply(4, &record("b", 4, undrain), 4).drains);
        assert!(state.apply(5, &record("a", 5, Body::Resume), 5).paused);
        assert_eq!(state.paused, None);
        assert_eq!(state.offset, Some(5));
    }

    #[test]
    fn a_renewal_moves_the_lease_without_changing_the_endpoints() {
        let mut state = GroupState::default();
        let first = Body::Register(registration("svc-1", "svc.1", 100));
        assert!(state.apply(0, &record("a", 1, first), 1).registrations);
        let renewal = Body::Register(registration("svc-1", "svc.1", 200));
        assert!(!state.apply(1, &record("a", 2, renewal), 2).registrations);
        assert_eq!(state.next_expiry(), Some(200));
        let moved = Body::Register(registration("svc-1", "svc.other", 300));
        assert!(state.apply(2, &record("a", 3, moved), 3).registrations);
        assert!(!state.lapse(250));
        assert!(state.lapse(300), "its lease ended");
        assert_eq!(state.registration_count(), 0);
        assert!(state.registrations.is_empty());
    }

    #[test]
    fn a_registration_read_back_after_its_lease_is_dropped() {
        let mut state = GroupState::default();
        let old = Body::Register(registration("svc-1", "svc.1", 100));
        assert!(!state.apply(0, &record("a", 1, old), 500).registrations);
        assert_eq!(state.registration_count(), 0);
    }

    #[test]
    fn unregister_removes_at_once_and_acks_are_remembered_per_instance() {
        let mut state = GroupState::default();
        let register = Body::Register(registration("svc-1", "svc.1", 100));
        state.apply(0, &record("a", 1, register), 1);
        let unregister = Body::Unregister {
            branch: "service".into(),
            name: "svc-1".into(),
        };
        assert!(state.apply(1, &record("a", 2, unregister), 2).registrations);
        state.apply(2, &record("b", 3, Body::Hello), 3);
        state.apply(3, &record("b", 4, Body::Applied { offset: 1 }), 4);
        assert_eq!(state.instances["b"].applied, Some(1));
        assert_eq!(state.instances["b"].joined_at_ms, 3);
        assert_eq!(state.offset, Some(1), "hello and applied are no commands");
        state.apply(4, &record("b", 5, Body::Leave), 5);
        assert!(
            !state.instances.contains_key("b"),
            "a clean stop leaves the status"
        );
        assert_eq!(state.offset, Some(1));
    }

    #[test]
    fn an_instance_silent_for_three_of_its_beats_is_forgotten_by_anothers_beat() {
        let mut state = GroupState::default();
        let alive = |beat| Body::Alive { heartbeat_ms: beat };
        state.apply(0, &record("a", 0, Body::Hello), 0);
        state.apply(1, &record("b", 0, Body::Hello), 0);
        state.apply(2, &record("a", 10, alive(100)), 10);
        state.apply(3, &record("b", 20, alive(1_000)), 20);
        // a's last sign was at 10: silent 300 ms, three of its beats, is
        // still there; b's beats stay known.
        state.apply(4, &record("b", 310, alive(1_000)), 310);
        assert!(state.instances.contains_key("a"));
        assert_eq!(state.instances["a"].seen_at_ms, 10);
        assert_eq!(state.instances["b"].heartbeat_ms, Some(1_000));
        state.apply(5, &record("b", 311, alive(1_000)), 311);
        assert!(!state.instances.contains_key("a"), "a was silent too long");
        // b, on a slower beat, stays for three of its own beats, whatever
        // a's were; any record of b's counts as a sign of life.
        state.apply(6, &record("c", 900, Body::Hello), 900);
        state.apply(7, &record("b", 2_000, Body::Applied { offset: 1 }), 2_000);
        state.apply(8, &record("c", 5_000, alive(100)), 5_000);
        assert_eq!(state.instances["b"].seen_at_ms, 2_000);
        assert!(state.instances.contains_key("b"), "silent 3 s of 3 s");
        state.apply(9, &record("c", 5_001, alive(100)), 5_001);
        // One that acks before it is listed is seen at its ack.
        state.apply(10, &record("d", 5_002, Body::Applied { offset: 1 }), 5_002);
        assert_eq!(state.instances["d"].seen_at_ms, 5_002);
        state.instances.remove("d");
        assert_eq!(state.instances.keys().collect::<Vec<_>>(), ["c"]);
        // One forgotten while cut off comes back with its next beat.
        state.apply(11, &record("a", 6_000, alive(100)), 6_000);
        assert_eq!(state.instances["a"].joined_at_ms, 6_000);
        assert_eq!(state.offset, None, "beats are no commands");
    }

    #[test]
    fn one_killed_before_its_first_beat_is_judged_by_the_beat_of_who_forgets_it() {
        let mut state = GroupState::default();
        state.apply(0, &record("early", 0, Body::Hello), 0);
        let alive = Body::Alive { heartbeat_ms: 100 };
        state.apply(1, &record("a", 300, alive.clone()), 300);
        assert!(state.instances.contains_key("early"));
        state.apply(2, &record("a", 301, alive), 301);
        assert_eq!(state.instances.keys().collect::<Vec<_>>(), ["a"]);
    }
}
