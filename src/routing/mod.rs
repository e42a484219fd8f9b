//! Route: envelope → branches. Pure, synchronous, no I/O.
//!
//! The [`RoutingTable`] is compiled once from the configuration and shared
//! behind an `Arc`; every message in flight keeps the table it was routed
//! with, so a reload never changes a transaction half-way. Matching takes the
//! highest priority that has at least one matching entry and returns one
//! [`BranchPlan`] per matching entry there: its name and the ordered list of
//! endpoints to try. A message's `x-switchyard-only` restricts the entries
//! considered to those it names, except that a *required* entry is always
//! considered.
//!
//! Routing a message evaluates the filters on the compiled table in place:
//! header, property and routing-key filters allocate nothing, and a body
//! filter parses the body at most once per routing (once as JSON, once as
//! XML), and only when one is evaluated; a table without body filters never
//! reads the body.

mod body;
mod filter;
mod topic;

pub(crate) use body::Unparsable;
pub(crate) use filter::{Filter, JsonPointer, Property, ValueTest, XPathTest};
pub use topic::TopicPattern;

use crate::destination::Endpoint;
use crate::envelope::Envelope;
use body::Body;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How a branch walks its endpoint list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Always start at the first endpoint.
    Failover,
    /// Rotate the starting endpoint per message; the rest are backups in order.
    RoundRobin,
}

/// What a branch does when its list is exhausted by an outage: every
/// endpoint tried failed because its broker was unreachable, lost, stalled
/// or refused the forwarder's own user, which says nothing of the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outage {
    /// Hold the message (unacked, consuming paused) until an endpoint of
    /// the list works again.
    #[default]
    Wait,
    /// Dead-letter it (reason `outage`): at once, or once it has been held
    /// for `after`.
    DeadLetter {
        /// How long to hold first (`outage_timeout_ms`).
        after: Option<std::time::Duration>,
    },
    /// A caller waits for the outcome (the HTTP ingress): end at once as
    /// an outage, whatever the cause, so the caller is told to come back.
    Answer,
}

impl Outage {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeadLetter { .. } => "dead_letter",
            Self::Wait => "wait",
            Self::Answer => "answer",
        }
    }
}

/// One filter-table entry: a potential branch.
#[derive(Debug)]
pub struct Branch {
    name: Arc<str>,
    filter_name: String,
    filter: Arc<Filter>,
    priority: i32,
    endpoints: Arc<[Arc<Endpoint>]>,
    strategy: Strategy,
    required: bool,
    outage: Outage,
    /// Services may register endpoints into its list.
    registrable: bool,
    next_start: AtomicUsize,
}

impl Branch {
    /// A branch; `endpoints` is `[endpoint] + backup_list`, empty only for
    /// a registrable branch (whose messages wait for a registration).
    pub fn new(
        name: impl Into<Arc<str>>,
        filter_name: impl Into<String>,
        filter: Arc<Filter>,
        priority: i32,
        endpoints: Vec<Arc<Endpoint>>,
        strategy: Strategy,
    ) -> Self {
        Self {
            name: name.into(),
            filter_name: filter_name.into(),
            filter,
            priority,
            endpoints: endpoints.into(),
            strategy,
            required: false,
            outage: Outage::Wait,
            registrable: false,
            next_start: AtomicUsize::new(0),
        }
    }

    /// This branch, taking endpoints that services register when
    /// `registrable`.
    pub fn with_registrable(mut self, registrable: bool) -> Self {
        self.registrable = registrable;
        self
    }

    /// Whether services may register endpoints into its list.
    pub fn registrable(&self) -> bool {
        self.registrable
    }

    /// The same branch with `extra` appended to its list (a round robin
    /// rotates over them too).
    fn extended(&self, extra: &[Arc<Endpoint>]) -> Self {
        let mut endpoints = self.endpoints.to_vec();
        endpoints.extend(extra.iter().cloned());
        Self {
            name: self.name.clone(),
            filter_name: self.filter_name.clone(),
            filter: self.filter.clone(),
            priority: self.priority,
            endpoints: endpoints.into(),
            strategy: self.strategy,
            required: self.required,
            outage: self.outage,
            registrable: self.registrable,
            next_start: AtomicUsize::new(0),
        }
    }

    /// This branch, required: it gets every message it matches, whatever
    /// the message's `x-switchyard-only` says.
    pub fn with_required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// This branch with outage behaviour `outage`.
    pub fn with_outage(mut self, outage: Outage) -> Self {
        self.outage = outage;
        self
    }

    /// The branch name used in headers, logs and metrics.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the branch ignores `x-switchyard-only`.
    pub fn required(&self) -> bool {
        self.required
    }

    /// What the branch does while every endpoint of its list is down.
    pub fn outage(&self) -> Outage {
        self.outage
    }

    fn plan(&self) -> BranchPlan {
        let start = match self.strategy {
            Strategy::Failover => 0,
            Strategy::RoundRobin => {
                // Kept below the list length, so the rotation never jumps
                // when a counter would wrap.
                let n = self.endpoints.len().max(1);
                match self
                    .next_start
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| Some((s + 1) % n))
                {
                    Ok(start) | Err(start) => start,
                }
            }
        };
        BranchPlan {
            name: self.name.clone(),
            outage: self.outage,
            endpoints: self.endpoints.clone(),
            start,
        }
    }
}

/// What one message does on one branch: the endpoints to try, in order.
#[derive(Debug, Clone)]
pub struct BranchPlan {
    /// The branch name.
    pub name: Arc<str>,
    /// What the branch does while every endpoint of its list is down.
    pub outage: Outage,
    endpoints: Arc<[Arc<Endpoint>]>,
    start: usize,
}

impl BranchPlan {
    /// The endpoints in the order they are tried.
    pub fn endpoints(&self) -> impl Iterator<Item = &Arc<Endpoint>> {
        let n = self.endpoints.len();
        (0..n).map(move |i| &self.endpoints[(self.start + i) % n])
    }

    /// Whether its list has no endpoint at all (a registrable branch no
    /// service has registered into).
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// How many endpoints its list has.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// The endpoint tried `i`-th (from 0), if the list is that long.
    pub fn endpoint(&self, i: usize) -> Option<&Arc<Endpoint>> {
        let n = self.endpoints.len();
        (i < n).then(|| &self.endpoints[(self.start + i) % n])
    }
}

/// The compiled filter table.
#[derive(Debug)]
pub struct RoutingTable {
    /// Entries sorted by priority, highest first; ties keep file order.
    branches: Vec<Branch>,
}

impl RoutingTable {
    /// A table from its entries (any order).
    pub fn new(mut branches: Vec<Branch>) -> Self {
        branches.sort_by_key(|b| std::cmp::Reverse(b.priority));
        Self { branches }
    }

    /// The branches `envelope` takes: every matching entry at the highest
    /// matching priority. With `x-switchyard-only`, entries it does not name
    /// are ignored, except required ones. Empty means no route.
    pub fn route(&self, envelope: &Envelope) -> Vec<BranchPlan> {
        self.route_body(envelope, &Body::new(&envelope.body))
    }

    /// [`Self::route`], and, when nothing matched, the formats body
    /// filters asked for the body in if it parsed as none of them: a
    /// no-route dead letter says so, and the HTTP ingress answers 415
    /// rather than 404. Looking parses nothing more.
    pub fn route_reading_body(&self, envelope: &Envelope) -> (Vec<BranchPlan>, Option<Unparsable>) {
        let body = Body::new(&envelope.body);
        let plans = self.route_body(envelope, &body);
        let unparsable = if plans.is_empty() {
            body.unparsable()
        } else {
            None
        };
        (plans, unparsable)
    }

    fn route_body(&self, envelope: &Envelope, body: &Body<'_>) -> Vec<BranchPlan> {
        let only = envelope.annotations.only.as_ref();
        let allowed = |b: &Branch| {
            b.required || only.is_none_or(|names| names.iter().any(|n| n.as_str() == b.name()))
        };
        let mut chosen: Option<i32> = None;
        let mut plans = Vec::new();
        for branch in &self.branches {
            if chosen.is_some_and(|p| p != branch.priority) {
                break;
            }
            if allowed(branch) && branch.filter.matches_with(envelope, body) {
                chosen = Some(branch.priority);
                plans.push(branch.plan());
            }
        }
        plans
    }

    /// The same table, each registrable branch's list extended by the
    /// endpoints `registered` holds for it (by branch name).
    pub fn with_registered(
        &self,
        registered: &std::collections::BTreeMap<String, Vec<Arc<Endpoint>>>,
    ) -> Self {
        let branches = self
            .branches
            .iter()
            .map(|b| {
                let extra = registered
                    .get(b.name())
                    .filter(|_| b.registrable)
                    .map_or(&[][..], Vec::as_slice);
                b.extended(extra)
            })
            .collect();
        Self { branches }
    }

    /// The branch named `name`.
    pub fn branch(&self, name: &str) -> Option<&Branch> {
        self.branches.iter().find(|b| b.name() == name)
    }

    /// Every branch name, in table order.
    pub fn branch_names(&self) -> impl Iterator<Item = &str> {
        self.branches.iter().map(Branch::name)
    }

    /// The endpoint a `failover` branch tries last. When such a branch's
    /// list is exhausted, this is the endpoint that refused last (the last
    /// endpoint of a list is never skipped). `None` for an unknown branch
    /// and for `round_robin`, whose starting endpoint varies per message.
    pub fn last_endpoint(&self, branch: &str) -> Option<&str> {
        let branch = self.branches.iter().find(|b| b.name() == branch)?;
        match branch.strategy {
            Strategy::Failover => branch.endpoints.last().map(|e| e.name.as_str()),
            Strategy::RoundRobin => None,
        }
    }

    /// Every branch with its endpoint list (`[endpoint] + backup_list`), in
    /// table order.
    pub fn branch_endpoints(&self) -> impl Iterator<Item = (&str, &[Arc<Endpoint>])> {
        self.branches.iter().map(|b| (b.name(), &b.endpoints[..]))
    }

    /// A short human summary, one line per entry, for `switchyard check`.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for b in &self.branches {
            let endpoints: Vec<&str> = b.endpoints.iter().map(|e| e.name.as_str()).collect();
            let strategy = match b.strategy {
                Strategy::Failover => "failover",
                Strategy::RoundRobin => "round_robin",
            };
            let required = if b.required { ", required" } else { "" };
            let registrable = if b.registrable { ", registrable" } else { "" };
            let mut list = endpoints.join(" -> ");
            if list.is_empty() {
                list = "(registered endpoints)".to_owned();
            }
            let outage = match b.outage {
                Outage::Wait | Outage::Answer => String::new(),
                Outage::DeadLetter { after: None } => ", outage dead_letter".to_owned(),
                Outage::DeadLetter { after: Some(after) } => {
                    format!(", outage dead_letter after {} ms", after.as_millis())
                }
            };
            let _ = writeln!(
                out,
                "  priority {:>3}  {:<20} filter {:<16} {} [{}{}{}{}]",
                b.priority, b.name, b.filter_name, list, strategy, required, registrable, outage
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amqp::Properties;
    use std::time::Duration;

    fn endpoint(name: &str) -> Arc<Endpoint> {
        Arc::new(Endpoint {
            name: name.to_owned(),
            broker: "main".to_owned(),
            exchange: String::new(),
            routing_key: name.to_owned(),
            declare_queue: None,
            confirm_timeout: Duration::from_secs(5),
            retries: 0,
            headers: Vec::new(),
            declare_queue_type: crate::destination::QueueType::Classic,
            probe_interval: Duration::from_secs(1),
        })
    }

    fn branch(
        name: &str,
        filter: Filter,
        priority: i32,
        endpoints: &[&str],
        strategy: Strategy,
    ) -> Branch {
        Branch::new(
            name,
            "f",
            Arc::new(filter),
            priority,
            endpoints.iter().map(|e| endpoint(e)).collect(),
            strategy,
        )
    }

    /// A message restricted to `only`, as a trusted `x-switchyard-only`
    /// reads (the trust decision itself is tested in `wire::trust`).
    fn message(routing_key: &str, only: Option<&[&str]>) -> Envelope {
        Envelope {
            delivery_tag: 1,
            exchange: String::new(),
            routing_key: routing_key.to_owned(),
            redelivered: false,
            properties: Properties::default(),
            body: Vec::new(),
            annotations: crate::wire::Annotations {
                trusted: true,
                only: only.map(|names| names.iter().map(|n| (*n).to_owned()).collect()),
                ..Default::default()
            },
        }
    }

    fn names(plans: &[BranchPlan]) -> Vec<&str> {
        plans.iter().map(|p| &*p.name).collect()
    }

    fn urgent() -> Filter {
        Filter::RoutingKey(TopicPattern::parse("urgent.#"))
    }

    #[test]
    fn the_last_endpoint_is_known_for_failover_branches_only() {
        let table = RoutingTable::new(vec![
            branch(
                "service",
                Filter::MatchAll,
                0,
                &["s1", "s2"],
                Strategy::Failover,
            ),
            branch("logging", Filter::MatchAll, 0, &["l"], Strategy::Failover),
            branch(
                "spread",
                Filter::MatchAll,
                0,
                &["a", "b"],
                Strategy::RoundRobin,
            ),
        ]);
        assert_eq!(table.last_endpoint("service"), Some("s2"));
        assert_eq!(table.last_endpoint("logging"), Some("l"));
        assert_eq!(table.last_endpoint("spread"), None);
        assert_eq!(table.last_endpoint("retired"), None);
    }

    #[test]
    fn only_the_highest_matching_priority_is_used() {
        let table = RoutingTable::new(vec![
            branch("service", Filter::MatchAll, 0, &["s"], Strategy::Failover),
            branch("logging", Filter::MatchAll, 0, &["l"], Strategy::Failover),
            branch("express", urgent(), 10, &["x"], Strategy::Failover),
        ]);
        assert_eq!(
            names(&table.route(&message("urgent.now", None))),
            ["express"]
        );
        assert_eq!(
            names(&table.route(&message("normal", None))),
            ["service", "logging"]
        );
    }

    #[test]
    fn no_match_is_no_route() {
        let table = RoutingTable::new(vec![branch(
            "express",
            urgent(),
            0,
            &["x"],
            Strategy::Failover,
        )]);
        assert!(table.route(&message("normal", None)).is_empty());
    }

    #[test]
    fn only_header_restricts_the_branches() {
        let table = RoutingTable::new(vec![
            branch("service", Filter::MatchAll, 0, &["s"], Strategy::Failover),
            branch("logging", Filter::MatchAll, 0, &["l"], Strategy::Failover),
        ]);
        assert_eq!(
            names(&table.route(&message("k", Some(&["logging"])))),
            ["logging"]
        );
        assert!(table.route(&message("k", Some(&["gone"]))).is_empty());
    }

    #[test]
    fn a_required_branch_ignores_the_only_header() {
        let urgent_audit =
            branch("urgent-audit", urgent(), 0, &["u"], Strategy::Failover).with_required(true);
        let table = RoutingTable::new(vec![
            branch("service", Filter::MatchAll, 0, &["s"], Strategy::Failover),
            branch("audit", Filter::MatchAll, 0, &["a"], Strategy::Failover).with_required(true),
            urgent_audit,
            branch("logging", Filter::MatchAll, 0, &["l"], Strategy::Failover),
        ]);
        // Named or not, a matching required branch is always taken.
        assert_eq!(
            names(&table.route(&message("k", Some(&["logging"])))),
            ["audit", "logging"]
        );
        assert_eq!(
            names(&table.route(&message("k", Some(&["gone"])))),
            ["audit"]
        );
        assert_eq!(
            names(&table.route(&message("urgent.x", Some(&["service"])))),
            ["service", "audit", "urgent-audit"]
        );
        // Without the header every matching branch is taken, as before.
        assert_eq!(
            names(&table.route(&message("k", None))),
            ["service", "audit", "logging"]
        );
        // A required branch still has to match.
        let only_required = RoutingTable::new(vec![
            branch("service", Filter::MatchAll, 0, &["s"], Strategy::Failover),
            branch("urgent-audit", urgent(), 0, &["u"], Strategy::Failover).with_required(true),
        ]);
        assert!(
            only_required
                .route(&message("normal", Some(&["gone"])))
                .is_empty()
        );
    }

    #[test]
    fn a_plan_carries_its_branch_outage() {
        let table = RoutingTable::new(vec![
            branch("held", Filter::MatchAll, 0, &["h"], Strategy::Failover),
            branch("dropped", Filter::MatchAll, 0, &["d"], Strategy::Failover)
                .with_outage(Outage::DeadLetter { after: None }),
        ]);
        let plans = table.route(&message("k", None));
        let outages: Vec<(&str, Outage)> = plans.iter().map(|p| (&*p.name, p.outage)).collect();
        let dropped = Outage::DeadLetter { after: None };
        assert_eq!(outages, [("held", Outage::Wait), ("dropped", dropped)]);
        assert_eq!(table.branches[0].outage(), Outage::Wait);
        assert!(!table.branches[0].required());
    }

    #[test]
    fn failover_always_starts_first_and_round_robin_rotates() {
        let order = |p: &BranchPlan| p.endpoints().map(|e| e.name.clone()).collect::<Vec<_>>();
        let failover = RoutingTable::new(vec![branch(
            "b",
            Filter::MatchAll,
            0,
            &["a", "b", "c"],
            Strategy::Failover,
        )]);
        for _ in 0..3 {
            assert_eq!(
                order(&failover.route(&message("k", None))[0]),
                ["a", "b", "c"]
            );
        }
        let rr = RoutingTable::new(vec![branch(
            "b",
            Filter::MatchAll,
            0,
            &["a", "b", "c"],
            Strategy::RoundRobin,
        )]);
        let starts: Vec<Vec<String>> = (0..4)
            .map(|_| order(&rr.route(&message("k", None))[0]))
            .collect();
        assert_eq!(starts[0], ["a", "b", "c"]);
        assert_eq!(starts[1], ["b", "c", "a"]);
        assert_eq!(starts[2], ["c", "a", "b"]);
        assert_eq!(starts[3], ["a", "b", "c"]);
    }

    #[test]
    fn round_robin_is_exact_when_many_threads_route_at_once() {
        let rr = RoutingTable::new(vec![branch(
            "b",
            Filter::MatchAll,
            0,
            &["a", "b", "c"],
            Strategy::RoundRobin,
        )]);
        let starts: Vec<String> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..6)
                .map(|_| {
                    s.spawn(|| {
                        (0..1500)
                            .map(|_| {
                                let plans = rr.route(&message("k", None));
                                plans[0].endpoints().next().unwrap().name.clone()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
        for name in ["a", "b", "c"] {
            assert_eq!(starts.iter().filter(|s| *s == name).count(), 3000, "{name}");
        }
        // The counter stays below the list length, so it never wraps.
        assert!(rr.branches[0].next_start.load(Ordering::Relaxed) < 3);
    }
}
