//! What travels on the control stream: one JSON record per stream
//! message, each naming its group (instances sharing `name` and the
//! inbound broker), the instance that wrote it, and what it says.

use super::state::{GroupState, Registration};
use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

/// Unix milliseconds now: what records are stamped with.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One record of the control stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The group it belongs to (the instances' `name`); other groups
    /// sharing the stream skip it.
    pub group: String,
    /// The instance that wrote it.
    pub instance: String,
    /// Unique per record: the writer waits to see it applied.
    pub id: String,
    /// When it was written, unix milliseconds.
    pub at_ms: u64,
    /// What it says.
    #[serde(flatten)]
    pub body: Body,
}

/// What a record says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Body {
    /// An instance (re)joins: once it reads this record back, it has read
    /// every command written before it.
    Hello,
    /// An instance stops (a clean shutdown): it leaves the status.
    Leave,
    /// An instance is alive, and says so again within `heartbeat_ms`; one
    /// silent for three of those leaves the status.
    Alive {
        /// How often it says so.
        heartbeat_ms: u64,
    },
    /// Stop taking new messages.
    Pause,
    /// Take new messages again.
    Resume,
    /// Skip this endpoint in every list.
    Drain {
        /// The endpoint's name.
        endpoint: String,
    },
    /// Use this endpoint again.
    Undrain {
        /// The endpoint's name.
        endpoint: String,
    },
    /// A service instance joins a registrable branch, or renews its lease.
    Register(Registration),
    /// A service instance leaves its branch.
    Unregister {
        /// The branch.
        branch: String,
        /// The registration's name.
        name: String,
    },
    /// The writer applied the command at `offset`.
    Applied {
        /// The command's stream offset.
        offset: u64,
    },
    /// The whole state as of `through`, so a reader whose stream starts
    /// after older records were trimmed by retention still knows it.
    Snapshot {
        /// The offset of the last record the state includes.
        through: u64,
        /// The state.
        state: GroupState,
    },
}

impl Body {
    /// Whether it changes the group's state (and so is acknowledged with
    /// an `Applied` record by every instance).
    pub fn is_command(&self) -> bool {
        !matches!(
            self,
            Self::Hello
                | Self::Leave
                | Self::Alive { .. }
                | Self::Applied { .. }
                | Self::Snapshot { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written_with_its_kind_beside_its_fields() {
        let record = Record {
            group: "g".into(),
            instance: "host:1".into(),
            id: "id-1".into(),
            at_ms: 5,
            body: Body::Drain {
                endpoint: "primary".into(),
            },
        };
        let json = serde_json::to_string(&record).unwrap();
        assert!(json.contains(r#""kind":"drain""#), "{json}");
        assert!(json.contains(r#""endpoint":"primary""#), "{json}");
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), record);
    }

    #[test]
    fn an_unknown_kind_is_an_error_not_a_command() {
        let json = r#"{"group":"g","instance":"i","id":"x","at_ms":1,"kind":"explode"}"#;
        assert!(serde_json::from_str::<Record>(json).is_err());
    }
}
