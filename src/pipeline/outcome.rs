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
        /// The last error, one line.
        error: String,
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
    /// The message cannot be forwarded safely (headers nested too deep).
    Malformed,
}

impl Reason {
    /// The header and metric value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exhausted => "exhausted",
            Self::NoRoute => "no-route",
            Self::Malformed => "malformed",
        }
    }
}

/// What to do with the inbound message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every branch delivered: ack.
    Commit,
    /// Dead-letter, recording which branches failed and which were delivered.
    DeadLetter {
        /// Why.
        reason: Reason,
        /// The last error, one line.
        error: String,
        /// Branches that failed.
        failed: Vec<String>,
        /// Branches already delivered.
        delivered: Vec<String>,
    },
}

impl Verdict {
    /// The verdict for a message no filter matched.
    pub fn no_route() -> Self {
        Self::DeadLetter {
            reason: Reason::NoRoute,
            error: "no filter-table entry matched".to_owned(),
            failed: Vec::new(),
            delivered: Vec::new(),
        }
    }
}

impl Outcome {
    /// Commit when every branch delivered; otherwise dead-letter as exhausted.
    pub fn verdict(&self) -> Verdict {
        let mut failed = Vec::new();
        let mut delivered = Vec::new();
        let mut errors = Vec::new();
        for branch in &self.branches {
            match branch {
                BranchOutcome::Delivered { branch, .. } => delivered.push(branch.to_string()),
                BranchOutcome::Failed { branch, error } => {
                    failed.push(branch.to_string());
                    errors.push(format!("{branch}: {error}"));
                }
            }
        }
        if failed.is_empty() {
            Verdict::Commit
        } else {
            Verdict::DeadLetter {
                reason: Reason::Exhausted,
                error: errors.join("; "),
                failed,
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
                delivered: vec!["service".to_owned()],
            }
        );
    }

    #[test]
    fn reasons_have_their_documented_names() {
        assert_eq!(Reason::Exhausted.as_str(), "exhausted");
        assert_eq!(Reason::NoRoute.as_str(), "no-route");
        assert_eq!(Reason::Malformed.as_str(), "malformed");
    }
}
