//! Where a follower's knowledge of the group starts. A stream read from
//! its first offset (0) lacks nothing: every record applies in order. A
//! stream whose oldest records retention trimmed starts in the middle, so
//! records are kept aside until a snapshot gives the state they follow;
//! those written after what the snapshot includes are then applied on
//! it. Failing a snapshot, the follower's own `hello` ends the wait: what
//! was read is all there is. Pure: records in, what to apply out.

use super::record::{Body, Record};
use super::state::GroupState;

/// Records kept aside while no base is known, at most.
const MAX_UNBASED: usize = 100_000;

/// What to do with what was read.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing yet: kept aside, or a snapshot not needed.
    Wait,
    /// Apply these records, in order, on the state held.
    Apply(Vec<(u64, Record)>),
    /// Take this state, then apply these records on it.
    Rebase(Box<GroupState>, Vec<(u64, Record)>),
    /// No snapshot came before this follower's own hello: apply these
    /// records, all that is known (the state may lack what was trimmed).
    Partial(Vec<(u64, Record)>),
}

/// A follower's start in the stream.
#[derive(Debug, Default)]
pub struct Base {
    /// The first offset read.
    first: Option<u64>,
    /// Whether the state held follows from the stream's beginning or a
    /// snapshot.
    based: bool,
    /// Records read before a base was known.
    unbased: Vec<(u64, Record)>,
}

impl Base {
    /// The first offset read, if any.
    pub fn first(&self) -> Option<u64> {
        self.first
    }

    /// Ends the wait for a base without one: what was read is all there
    /// is (this follower could not write its hello).
    pub fn settle(&mut self) -> Vec<(u64, Record)> {
        self.based = true;
        std::mem::take(&mut self.unbased)
    }

    /// Takes `record`, read at `offset`; `hello` is the id of this
    /// follower's own hello.
    pub fn read(&mut self, offset: u64, record: Record, hello: &str) -> Step {
        if self.first.is_none() {
            self.first = Some(offset);
            self.based = offset == 0;
        }
        if let Body::Snapshot { through, state } = &record.body {
            if self.based {
                return Step::Wait;
            }
            self.based = true;
            let through = *through;
            let after = std::mem::take(&mut self.unbased)
                .into_iter()
                .filter(|(at, _)| *at > through)
                .collect();
            return Step::Rebase(Box::new(state.clone()), after);
        }
        if self.based {
            return Step::Apply(vec![(offset, record)]);
        }
        let own = record.id == hello;
        if self.unbased.len() < MAX_UNBASED {
            self.unbased.push((offset, record));
        }
        if !own {
            return Step::Wait;
        }
        self.based = true;
        Step::Partial(std::mem::take(&mut self.unbased))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, body: Body) -> Record {
        Record {
            group: "g".into(),
            instance: "i".into(),
            id: id.into(),
            at_ms: 1,
            body,
        }
    }

    fn ids(records: &[(u64, Record)]) -> Vec<(u64, &str)> {
        records.iter().map(|(at, r)| (*at, r.id.as_str())).collect()
    }

    #[test]
    fn a_stream_read_from_its_beginning_applies_every_record_as_it_comes() {
        let mut base = Base::default();
        let Step::Apply(first) = base.read(0, record("a", Body::Pause), "me") else {
            panic!("offset 0 lacks nothing");
        };
        assert_eq!(ids(&first), [(0, "a")]);
        let snapshot = Body::Snapshot {
            through: 0,
            state: GroupState::default(),
        };
        assert_eq!(base.read(1, record("s", snapshot), "me"), Step::Wait);
        assert!(matches!(
            base.read(2, record("me", Body::Hello), "me"),
            Step::Apply(_)
        ));
    }

    #[test]
    fn a_trimmed_stream_waits_for_a_snapshot_and_applies_what_came_after_it() {
        let mut base = Base::default();
        // Trimmed: the stream now starts at 40.
        assert_eq!(base.read(40, record("a", Body::Resume), "me"), Step::Wait);
        assert_eq!(base.read(41, record("b", Body::Pause), "me"), Step::Wait);
        let state = GroupState {
            offset: Some(40),
            ..GroupState::default()
        };
        let snapshot = Body::Snapshot {
            through: 40,
            state: state.clone(),
        };
        let Step::Rebase(taken, after) = base.read(42, record("s", snapshot), "me") else {
            panic!("a snapshot gives the base");
        };
        assert_eq!(*taken, state);
        assert_eq!(ids(&after), [(41, "b")], "40 is in the snapshot, 41 is not");
        assert_eq!(base.first(), Some(40));
        assert!(matches!(
            base.read(43, record("me", Body::Hello), "me"),
            Step::Apply(_)
        ));
    }

    #[test]
    fn without_a_snapshot_the_own_hello_ends_the_wait_with_what_was_read() {
        let mut base = Base::default();
        assert_eq!(base.read(7, record("a", Body::Pause), "me"), Step::Wait);
        let Step::Partial(known) = base.read(8, record("me", Body::Hello), "me") else {
            panic!("the hello ends the wait");
        };
        assert_eq!(ids(&known), [(7, "a"), (8, "me")]);
        assert!(matches!(
            base.read(9, record("c", Body::Resume), "me"),
            Step::Apply(_)
        ));
    }
}
