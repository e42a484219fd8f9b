//! Outcomes as values: what each branch did, and the verdict one
//! transaction reaches. Settlement turns a [`Verdict`] into an ack or a dead
//! letter.

use std::sync::Arc;

/// How one branch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BranchOutcome {
    /// Confirmed by `endpoint` and not returned.
    Delivered {
        /// Branch name.
        branch: Arc<str>,
        /// Endpoint that confirmed it.
        endpoint: String,
    },
    /// Every endpoint of the list failed.
    Failed {
        /// Branch name.
        branch: Arc<str>,
        /// The endpoint that failed last (`""` when none was tried).
        endpoint: String,
        /// The last error, one line.
        error: String,
    },
    /// The broker refused the message itself (published alone, or checked
    /// before publishing); no endpoint would take it as it is.
    Rejected {
        /// Branch name.
        branch: Arc<str>,
        /// The endpoint whose broker refused it.
        endpoint: String,
        /// The broker's reply, one line.
        error: String,
    },
    /// Stopped because the inbound channel was lost: the broker redelivers
    /// the message, so nothing more is sent for it.
    Abandoned {
        /// Branch name.
        branch: Arc<str>,
    },
}

/// Every branch's outcome for one message.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// In filter-table order.
    pub branches: Vec<BranchOutcome>,
}

/// Why a message is dead-lettered; its text goes in `x-switchyard-reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A branch exhausted its endpoint list.
    Exhausted,
    /// No filter matched.
    NoRoute,
    /// The destination broker refused the message itself.
    Rejected,
    /// The message kept coming back (`inbound.max_redeliveries`).
    Poison,
    /// The message was forwarded too many times (`inbound.max_hops`).
    Loop,
    /// The message cannot be forwarded safely (headers nested too deep).
    Malformed,
    /// A session had no message for `sessions.idle_timeout_ms`.
    SessionTimeout,
    /// A session outgrew `sessions.max_messages` or `sessions.max_bytes`.
    SessionTooLarge,
    /// The message belongs to a session completed or dead-lettered moments
    /// ago (`sessions.closed_ttl_ms`).
    SessionClosed,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 9] = [
        Self::Exhausted,
        Self::NoRoute,
        Self::Rejected,
        Self::Poison,
        Self::Loop,
        Self::Malformed,
        Self::SessionTimeout,
        Self::SessionTooLarge,
        Self::SessionClosed,
    ];

    /// The header and metric value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exhausted => "exhausted",
            Self::NoRoute => "no-route",
            Self::Rejected => "rejected",
            Self::Poison => "poison",
            Self::Loop => "loop",
            Self::Malformed => "malformed",
            Self::SessionTimeout => "session-timeout",
            Self::SessionTooLarge => "session-too-large",
            Self::SessionClosed => "session-closed",
        }
    }
}

/// What to do with the inbound message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every branch delivered: ack.
    Commit,
    /// The inbound channel is gone: settle nothing, the broker redelivers.
    Abandon,
    /// Dead-letter, recording which branches failed and which were delivered.
    DeadLetter {
        /// Why.
        reason: Reason,
        /// The last error, one line.
        error: String,
        /// Branches that failed.
        failed: Vec<String>,
        /// For each failed branch, the endpoint that refused last (`""`
        /// when none was tried).
        refused_by: Vec<String>,
        /// Branches already delivered.
        delivered: Vec<String>,
    },
}

impl Verdict {
    /// The verdict for a message no filter matched.
    pub fn no_route() -> Self {
        Self::refuse(Reason::NoRoute, "no filter-table entry matched".to_owned())
    }

    /// A dead letter decided before any branch ran.
    pub fn refuse(reason: Reason, error: String) -> Self {
        Self::DeadLetter {
            reason,
            error,
            failed: Vec::new(),
            refused_by: Vec::new(),
            delivered: Vec::new(),
        }
    }
}

impl Outcome {
    /// Commit when every branch delivered; abandon when the inbound channel
    /// was lost; otherwise dead-letter: `rejected` when the broker refused
    /// the message itself, `exhausted` when lists ran out.
    pub fn verdict(&self) -> Verdict {
        // The common case, decided without building the dead-letter lists.
        if self
            .branches
            .iter()
            .all(|b| matches!(b, BranchOutcome::Delivered { .. }))
        {
            return Verdict::Commit;
        }
        let mut failed = Vec::new();
        let mut refused_by = Vec::new();
        let mut delivered = Vec::new();
        let mut errors = Vec::new();
        let mut reason = Reason::Exhausted;
        for branch in &self.branches {
            match branch {
                BranchOutcome::Delivered { branch, .. } => delivered.push(branch.to_string()),
                BranchOutcome::Abandoned { .. } => return Verdict::Abandon,
                BranchOutcome::Failed {
                    branch,
                    endpoint,
                    error,
                } => {
                    failed.push(branch.to_string());
                    refused_by.push(endpoint.clone());
                    errors.push(format!("{branch}: {error}"));
                }
                BranchOutcome::Rejected {
                    branch,
                    endpoint,
                    error,
                } => {
                    reason = Reason::Rejected;
                    failed.push(branch.to_string());
                    refused_by.push(endpoint.clone());
                    errors.push(format!("{branch}: {error}"));
                }
            }
        }
        if failed.is_empty() {
            Verdict::Commit
        } else {
            Verdict::DeadLetter {
                reason,
                error: errors.join("; "),
                failed,
                refused_by,
                delivered,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(b: &str) -> BranchOutcome {
        BranchOutcome::Delivered {
            branch: b.into(),
            endpoint: format!("{b}-ep"),
        }
    }

    fn failed(b: &str, e: &str) -> BranchOutcome {
        BranchOutcome::Failed {
            branch: b.into(),
            endpoint: format!("{b}-backup"),
            error: e.to_owned(),
        }
    }

    #[test]
    fn every_branch_delivered_commits() {
        let outcome = Outcome {
            branches: vec![delivered("service"), delivered("logging")],
        };
        assert_eq!(outcome.verdict(), Verdict::Commit);
    }

    #[test]
    fn one_failed_branch_dead_letters_with_complete_lists() {
        let outcome = Outcome {
            branches: vec![
                delivered("service"),
                failed("logging", "nacked by the broker"),
            ],
        };
        assert_eq!(
            outcome.verdict(),
            Verdict::DeadLetter {
                reason: Reason::Exhausted,
                error: "logging: nacked by the broker".to_owned(),
                failed: vec!["logging".to_owned()],
                refused_by: vec!["logging-backup".to_owned()],
                delivered: vec!["service".to_owned()],
            }
        );
    }

    #[test]
    fn reasons_have_their_documented_names() {
        assert_eq!(Reason::Exhausted.as_str(), "exhausted");
        assert_eq!(Reason::NoRoute.as_str(), "no-route");
        assert_eq!(Reason::Malformed.as_str(), "malformed");
        assert_eq!(Reason::Rejected.as_str(), "rejected");
        assert_eq!(Reason::Poison.as_str(), "poison");
        assert_eq!(Reason::Loop.as_str(), "loop");
        assert_eq!(Reason::SessionTimeout.as_str(), "session-timeout");
        assert_eq!(Reason::SessionTooLarge.as_str(), "session-too-large");
        assert_eq!(Reason::SessionClosed.as_str(), "session-closed");
    }

    #[test]
    fn a_refused_message_is_rejected_and_a_lost_channel_abandons() {
        let rejected = Outcome {
            branches: vec![
                delivered("logging"),
                BranchOutcome::Rejected {
                    branch: "service".into(),
                    endpoint: "primary".to_owned(),
                    error: "406".to_owned(),
                },
            ],
        };
        assert!(matches!(
            rejected.verdict(),
            Verdict::DeadLetter { reason: Reason::Rejected, ref failed, ref refused_by, .. }
                if failed == &["service"] && refused_by == &["primary"]
        ));
        let abandoned = Outcome {
            branches: vec![
                failed("logging", "nacked"),
                BranchOutcome::Abandoned {
                    branch: "service".into(),
                },
            ],
        };
        assert_eq!(abandoned.verdict(), Verdict::Abandon);
    }
}
