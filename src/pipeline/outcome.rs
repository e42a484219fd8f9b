//! Outcomes as values: what each branch did, and the verdict one
//! transaction reaches, with its cause kept typed. Settlement turns a
//! [`Verdict`] into an ack or a dead letter.

use crate::broker::{PublishFailure, Refusal};
use crate::journal::Tried;
use crate::routing::Unparsable;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// How one branch ended.
#[derive(Debug, Clone, PartialEq)]
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
        /// The endpoint that failed last; `None` when none was tried.
        endpoint: Option<String>,
        /// The last attempt's failure.
        error: PublishFailure,
    },
    /// An outage exhausted the list (every endpoint tried failed for a
    /// reason that says nothing of the message) and the branch's `outage`
    /// setting dead-letters rather than holds.
    Outage {
        /// Branch name.
        branch: Arc<str>,
        /// The endpoint that failed last.
        endpoint: String,
        /// The last attempt's failure.
        error: PublishFailure,
    },
    /// The broker refused the message itself (published alone, or checked
    /// before publishing); no endpoint would take it as it is.
    Rejected {
        /// Branch name.
        branch: Arc<str>,
        /// The endpoint whose broker refused it.
        endpoint: String,
        /// What the broker said.
        error: Refusal,
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
    /// Each branch's steps, in the same order (empty when nothing records
    /// them).
    pub trails: Vec<Vec<Tried>>,
}

/// Why a message is dead-lettered; its text goes in `x-switchyard-reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A branch exhausted its endpoint list.
    Exhausted,
    /// An outage exhausted a branch's list and its `outage` setting is
    /// `dead_letter`.
    Outage,
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
    pub const ALL: [Reason; 10] = [
        Self::Exhausted,
        Self::Outage,
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
            Self::Outage => "outage",
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

/// Why a message is dead-lettered without (or instead of) its branches'
/// outcomes: the screen, the routing table or its session stopped it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Barred {
    /// No filter matched.
    #[error("no filter-table entry matched{}", unparsable_note(.unparsable_body))]
    NoRoute {
        /// The formats a body filter asked for the body in and it did not
        /// parse as, if any.
        unparsable_body: Option<Unparsable>,
    },
    /// Headers nested deeper than the forwarder handles.
    #[error("headers nest {depth} levels deep (limit {limit})")]
    Malformed {
        /// How deep they nest.
        depth: usize,
        /// The limit.
        limit: usize,
    },
    /// Its session id is longer than the forwarder keeps.
    #[error("session id of {bytes} bytes is over the limit of {limit} bytes")]
    SessionIdTooLong {
        /// The id's length in bytes.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// Forwarded `inbound.max_hops` times already.
    #[error("forwarded {hops} times already (inbound.max_hops = {max}); a routing loop?")]
    Loop {
        /// Forwards so far.
        hops: u32,
        /// `inbound.max_hops`.
        max: u32,
    },
    /// Delivered more than `inbound.max_redeliveries` times.
    #[error("delivered {deliveries} times (inbound.max_redeliveries = {max})")]
    Poison {
        /// Deliveries, this one included.
        deliveries: u32,
        /// `inbound.max_redeliveries`.
        max: u32,
    },
    /// The session received no message for `idle`.
    #[error("no message of the session for {} ms", .idle.as_millis())]
    SessionTimeout {
        /// `sessions.idle_timeout_ms`.
        idle: Duration,
    },
    /// The session outgrew its limits.
    #[error(
        "the session holds {messages} messages and {bytes} bytes, over sessions.max_messages \
         ({max_messages}) or sessions.max_bytes ({max_bytes})"
    )]
    SessionTooLarge {
        /// Messages in the set.
        messages: usize,
        /// Body bytes in the set.
        bytes: u64,
        /// `sessions.max_messages`.
        max_messages: u32,
        /// `sessions.max_bytes`.
        max_bytes: u64,
    },
    /// The session was completed or dead-lettered `ago`.
    #[error("session \"{id}\" was completed or dead-lettered {} ms ago", .ago.as_millis())]
    SessionClosed {
        /// The session id.
        id: Arc<str>,
        /// How long ago.
        ago: Duration,
    },
    /// The message reached its session after the session ended.
    #[error("session \"{id}\" ended before this message came")]
    SessionEnded {
        /// The session id.
        id: Arc<str>,
    },
}

impl Barred {
    /// The dead-letter reason it stands for.
    pub fn reason(&self) -> Reason {
        match self {
            Self::NoRoute { .. } => Reason::NoRoute,
            Self::Malformed { .. } | Self::SessionIdTooLong { .. } => Reason::Malformed,
            Self::Loop { .. } => Reason::Loop,
            Self::Poison { .. } => Reason::Poison,
            Self::SessionTimeout { .. } => Reason::SessionTimeout,
            Self::SessionTooLarge { .. } => Reason::SessionTooLarge,
            Self::SessionClosed { .. } | Self::SessionEnded { .. } => Reason::SessionClosed,
        }
    }
}

/// What a no-route adds when a body filter could not read the body.
fn unparsable_note(unparsable: &Option<Unparsable>) -> String {
    unparsable
        .map(|formats| format!("; the body did not parse as {formats}"))
        .unwrap_or_default()
}

/// One branch that failed: where, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct BranchFailure {
    /// Branch name.
    pub branch: Arc<str>,
    /// The endpoint that failed or refused last; `None` when none was tried.
    pub endpoint: Option<String>,
    /// Why.
    pub error: BranchError,
}

/// Why one branch failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BranchError {
    /// Its list was exhausted; the last attempt's failure.
    #[error("{0}")]
    Exhausted(PublishFailure),
    /// The broker refused the message itself.
    #[error("{0}")]
    Rejected(Refusal),
    /// An outage exhausted its list; the last attempt's failure.
    #[error("outage: {0}")]
    Outage(PublishFailure),
}

/// Why a message is dead-lettered, typed: what barred it, or the branches
/// that failed. Its `Display` is the dead letter's one-line error.
#[derive(Debug, Clone, PartialEq)]
pub enum Cause {
    /// Barred before (or instead of) delivering.
    Barred(Barred),
    /// Branches failed, in filter-table order.
    Branches(Vec<BranchFailure>),
}

impl Cause {
    /// The dead-letter reason: `rejected` when a broker refused the message
    /// itself, `exhausted` when lists ran out, the bar's otherwise.
    pub fn reason(&self) -> Reason {
        match self {
            Self::Barred(barred) => barred.reason(),
            Self::Branches(failures) => {
                // The reason that most needs a person wins.
                let any = |pick: fn(&BranchError) -> bool| failures.iter().any(|f| pick(&f.error));
                if any(|e| matches!(e, BranchError::Rejected(_))) {
                    Reason::Rejected
                } else if any(|e| matches!(e, BranchError::Exhausted(_))) {
                    Reason::Exhausted
                } else {
                    Reason::Outage
                }
            }
        }
    }

    /// The failed branches, each with the endpoint that failed last; empty
    /// for a bar.
    pub fn failed_branches(&self) -> impl Iterator<Item = &BranchFailure> {
        let failures: &[BranchFailure] = match self {
            Self::Barred(_) => &[],
            Self::Branches(failures) => failures,
        };
        failures.iter()
    }

    /// The endpoint `branch` failed on last; `None` when the branch did not
    /// fail or tried no endpoint.
    pub fn endpoint_of(&self, branch: &str) -> Option<&str> {
        self.failed_branches()
            .find(|f| *f.branch == *branch)?
            .endpoint
            .as_deref()
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Barred(barred) => barred.fmt(f),
            Self::Branches(failures) => {
                for (i, failure) in failures.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{}: {}", failure.branch, failure.error)?;
                }
                Ok(())
            }
        }
    }
}

/// What to do with the inbound message.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every branch delivered: ack.
    Commit,
    /// The inbound channel is gone: settle nothing, the broker redelivers.
    Abandon,
    /// Dead-letter, recording which branches failed and which were delivered.
    DeadLetter {
        /// Why, typed; its reason and text go in the dead letter, and the
        /// endpoint each failed branch failed on.
        cause: Cause,
        /// Every branch the message was for, in filter-table order, and
        /// whether it holds the message.
        reached: Vec<Reach>,
    },
}

/// A branch of a dead-lettered message, and whether the message reached it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    /// Branch name.
    pub branch: Arc<str>,
    /// Delivered; in a session's set, its endpoint has the set up to this
    /// message. A branch that failed never holds it.
    pub holds: bool,
}

impl Verdict {
    /// A dead letter decided before any branch ran.
    pub fn barred(barred: Barred) -> Self {
        Self::DeadLetter {
            cause: Cause::Barred(barred),
            reached: Vec::new(),
        }
    }

    /// The branches a dead letter did not reach, in filter-table order:
    /// those that failed and, in a session's set, those that do not hold
    /// this message. None for any other verdict.
    pub fn failed(&self) -> impl Iterator<Item = &str> {
        self.reached().filter(|r| !r.holds).map(|r| &*r.branch)
    }

    /// For each of [`Self::failed`], the endpoint that failed last; `None`
    /// when that branch tried none or did not fail itself.
    pub fn failed_endpoints(&self) -> impl Iterator<Item = Option<&str>> {
        let cause = match self {
            Self::DeadLetter { cause, .. } => Some(cause),
            Self::Commit | Self::Abandon => None,
        };
        self.failed()
            .map(move |branch| cause.and_then(|c| c.endpoint_of(branch)))
    }

    /// The branches a dead letter reached, in filter-table order; none for
    /// any other verdict.
    pub fn delivered(&self) -> impl Iterator<Item = &str> {
        self.reached().filter(|r| r.holds).map(|r| &*r.branch)
    }

    fn reached(&self) -> std::slice::Iter<'_, Reach> {
        match self {
            Self::DeadLetter { reached, .. } => reached.iter(),
            Self::Commit | Self::Abandon => [].iter(),
        }
    }
}

impl Outcome {
    /// Whether every branch delivered (the verdict is a commit).
    pub fn all_delivered(&self) -> bool {
        self.branches
            .iter()
            .all(|b| matches!(b, BranchOutcome::Delivered { .. }))
    }

    /// The branches that delivered, in filter-table order.
    pub fn delivered(&self) -> impl Iterator<Item = &Arc<str>> {
        self.branches.iter().filter_map(|b| match b {
            BranchOutcome::Delivered { branch, .. } => Some(branch),
            _ => None,
        })
    }

    /// Commit when every branch delivered; abandon when the inbound channel
    /// was lost; otherwise dead-letter: `rejected` when the broker refused
    /// the message itself, `exhausted` when lists ran out.
    pub fn verdict(self) -> Verdict {
        // The common case, decided without building the dead-letter lists.
        if self.all_delivered() {
            return Verdict::Commit;
        }
        let mut failures = Vec::new();
        let mut reached = Vec::new();
        for outcome in self.branches {
            let (branch, failure) = match outcome {
                BranchOutcome::Abandoned { .. } => return Verdict::Abandon,
                BranchOutcome::Delivered { branch, .. } => (branch, None),
                BranchOutcome::Failed {
                    branch,
                    endpoint,
                    error,
                } => (branch, Some((endpoint, BranchError::Exhausted(error)))),
                BranchOutcome::Rejected {
                    branch,
                    endpoint,
                    error,
                } => (branch, Some((Some(endpoint), BranchError::Rejected(error)))),
                BranchOutcome::Outage {
                    branch,
                    endpoint,
                    error,
                } => (branch, Some((Some(endpoint), BranchError::Outage(error)))),
            };
            reached.push(Reach {
                branch: branch.clone(),
                holds: failure.is_none(),
            });
            if let Some((endpoint, error)) = failure {
                failures.push(BranchFailure {
                    branch,
                    endpoint,
                    error,
                });
            }
        }
        Verdict::DeadLetter {
            cause: Cause::Branches(failures),
            reached,
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

    fn failed(b: &str) -> BranchOutcome {
        BranchOutcome::Failed {
            branch: b.into(),
            endpoint: Some(format!("{b}-backup")),
            error: PublishFailure::Nacked,
        }
    }

    #[test]
    fn every_branch_delivered_commits() {
        let outcome = Outcome {
            trails: Vec::new(),
            branches: vec![delivered("service"), delivered("logging")],
        };
        assert_eq!(outcome.verdict(), Verdict::Commit);
    }

    /// The lists a dead letter records, as its headers carry them.
    fn lists(verdict: &Verdict) -> (Vec<&str>, Vec<Option<&str>>, Vec<&str>) {
        (
            verdict.failed().collect(),
            verdict.failed_endpoints().collect(),
            verdict.delivered().collect(),
        )
    }

    #[test]
    fn one_failed_branch_dead_letters_with_complete_lists() {
        let outcome = Outcome {
            trails: Vec::new(),
            branches: vec![delivered("service"), failed("logging")],
        };
        let verdict = outcome.verdict();
        assert_eq!(
            lists(&verdict),
            (
                vec!["logging"],
                vec![Some("logging-backup")],
                vec!["service"]
            )
        );
        let Verdict::DeadLetter { cause, .. } = verdict else {
            panic!("a dead letter");
        };
        assert_eq!(cause.reason(), Reason::Exhausted);
        assert_eq!(cause.to_string(), "logging: nacked by the broker");
        assert!(matches!(
            cause.failed_branches().next().map(|f| &f.error),
            Some(BranchError::Exhausted(PublishFailure::Nacked))
        ));
    }

    /// Failed and delivered branches keep the table's order, and a branch
    /// that tried no endpoint has none.
    #[test]
    fn the_lists_keep_table_order_and_an_untried_branch_has_no_endpoint() {
        let untried = BranchOutcome::Failed {
            branch: "audit".into(),
            endpoint: None,
            error: PublishFailure::Stopped,
        };
        let outcome = Outcome {
            trails: Vec::new(),
            branches: vec![
                failed("logging"),
                delivered("service"),
                untried,
                delivered("billing"),
            ],
        };
        assert_eq!(
            lists(&outcome.verdict()),
            (
                vec!["logging", "audit"],
                vec![Some("logging-backup"), None],
                vec!["service", "billing"]
            )
        );
    }

    /// In a session's set a branch may miss a message without failing
    /// itself: it is listed as failed, with no endpoint.
    #[test]
    fn a_branch_that_does_not_hold_a_message_is_failed_without_an_endpoint() {
        let Verdict::DeadLetter { cause, .. } = Outcome {
            trails: Vec::new(),
            branches: vec![delivered("service"), failed("logging")],
        }
        .verdict() else {
            panic!("a dead letter");
        };
        let reach = |branch: &str, holds| Reach {
            branch: branch.into(),
            holds,
        };
        let verdict = Verdict::DeadLetter {
            cause,
            reached: vec![reach("service", false), reach("logging", false)],
        };
        assert_eq!(
            lists(&verdict),
            (
                vec!["service", "logging"],
                vec![None, Some("logging-backup")],
                vec![]
            )
        );
        assert_eq!(lists(&Verdict::Commit), (vec![], vec![], vec![]));
        let bar = Verdict::barred(Barred::Loop { hops: 8, max: 8 });
        assert_eq!(lists(&bar), (vec![], vec![], vec![]));
    }

    #[test]
    fn reasons_have_their_documented_names() {
        assert_eq!(Reason::Exhausted.as_str(), "exhausted");
        assert_eq!(Reason::Outage.as_str(), "outage");
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
            trails: Vec::new(),
            branches: vec![
                delivered("logging"),
                BranchOutcome::Rejected {
                    branch: "service".into(),
                    endpoint: "primary".to_owned(),
                    error: Refusal::FrameTooLarge {
                        header: 200_000,
                        frame_max: 131_072,
                    },
                },
            ],
        };
        let verdict = rejected.verdict();
        assert!(matches!(
            &verdict,
            Verdict::DeadLetter { cause, .. } if cause.reason() == Reason::Rejected
        ));
        assert_eq!(
            lists(&verdict),
            (vec!["service"], vec![Some("primary")], vec!["logging"])
        );
        let abandoned = Outcome {
            trails: Vec::new(),
            branches: vec![
                failed("logging"),
                BranchOutcome::Abandoned {
                    branch: "service".into(),
                },
            ],
        };
        assert_eq!(abandoned.verdict(), Verdict::Abandon);
    }

    #[test]
    fn a_bar_keeps_its_reason_and_says_why() {
        let bar = Barred::Loop { hops: 8, max: 8 };
        assert_eq!(bar.reason(), Reason::Loop);
        assert_eq!(
            Cause::Barred(bar).to_string(),
            "forwarded 8 times already (inbound.max_hops = 8); a routing loop?"
        );
    }

    #[test]
    fn a_no_route_says_when_the_body_did_not_parse() {
        let said = |unparsable_body| {
            let bar = Barred::NoRoute { unparsable_body };
            assert_eq!(bar.reason(), Reason::NoRoute);
            Cause::Barred(bar).to_string()
        };
        assert_eq!(said(None), "no filter-table entry matched");
        assert_eq!(
            said(Some(Unparsable::Json)),
            "no filter-table entry matched; the body did not parse as JSON"
        );
        assert_eq!(
            said(Some(Unparsable::Xml)),
            "no filter-table entry matched; the body did not parse as XML"
        );
        assert_eq!(
            said(Some(Unparsable::JsonAndXml)),
            "no filter-table entry matched; the body did not parse as JSON or XML"
        );
    }
}
