//! Deliver: publish one copy per branch and walk backup lists.
//!
//! [`start`] submits every branch's first attempt at once, in the order
//! messages arrive, so the happy path keeps inbound order per endpoint.
//! [`Started::finish`] then runs the branches concurrently: each awaits its
//! confirm and, on any failure (nack, return, timeout, channel loss,
//! unreachable broker), retries the endpoint if configured and moves on to
//! the next endpoint of its list. A delivered branch is never sent again.
//!
//! Endpoints marked down are skipped while another endpoint of the list is
//! up. A copy that failed because its channel closed under it in a way one
//! message may have caused is retried alone on the same endpoint, not
//! failed over: if it fails alone, the broker refuses that message itself
//! and the branch ends `Rejected`. Once the inbound channel is lost (the
//! message will be redelivered anyway) no new attempt is started.
//!
//! A branch with `outage = "wait"` whose every endpoint is unreachable at
//! the connection level does not fail: it waits (its message unacked, and
//! consuming paused while any branch waits) until a probe finds one of its
//! endpoints up, then walks its list again.

use super::outcome::{BranchOutcome, Outcome};
use crate::amqp::{AmqpValue, ShortString};
use crate::broker::{Mode, PublishFailure, Publisher};
use crate::destination::Endpoint;
use crate::envelope::Envelope;
use crate::routing::{BranchPlan, Outage};
use crate::telemetry::Telemetry;
use futures_util::future::join_all;
use rustc_hash::FxHashMap;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Publishers by endpoint name, with the health epoch they share.
#[derive(Clone)]
pub struct Publishers {
    by_endpoint: Arc<FxHashMap<String, Publisher>>,
    /// Bumped on every endpoint health change.
    health: watch::Receiver<u64>,
    /// How many branches are waiting out an outage now.
    waiting: Arc<watch::Sender<usize>>,
    telemetry: Telemetry,
}

impl Publishers {
    /// Publishers from their handles; `health` follows their health epoch.
    pub fn new(
        publishers: impl IntoIterator<Item = Publisher>,
        health: watch::Receiver<u64>,
        telemetry: Telemetry,
    ) -> Self {
        Self {
            by_endpoint: Arc::new(
                publishers
                    .into_iter()
                    .map(|p| (p.endpoint().name.clone(), p))
                    .collect(),
            ),
            health,
            waiting: Arc::new(watch::Sender::new(0)),
            telemetry,
        }
    }

    /// Whether a branch is waiting out an outage now.
    pub fn in_outage(&self) -> bool {
        *self.waiting.borrow() > 0
    }

    /// Returns once no branch is waiting out an outage.
    pub async fn no_outage(&self) {
        let _ = self.waiting.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Every publisher.
    pub fn all(&self) -> impl Iterator<Item = &Publisher> {
        self.by_endpoint.values()
    }

    /// Whether the endpoint named `name` is up (an unknown name is not).
    pub fn endpoint_up(&self, name: &str) -> bool {
        self.by_endpoint
            .get(name)
            .is_some_and(|p| p.health().is_up())
    }

    pub(super) fn get(&self, endpoint: &Endpoint) -> Option<&Publisher> {
        self.by_endpoint.get(&endpoint.name)
    }

    pub(super) fn is_up(&self, endpoint: &Endpoint) -> bool {
        self.get(endpoint).is_none_or(|p| p.health().is_up())
    }

    fn publish(&self, endpoint: &Endpoint, envelope: &Arc<Envelope>, mode: Mode) -> Attempt {
        self.publish_with(endpoint, envelope, Vec::new(), mode)
    }

    /// Publishes one copy with `extra` headers added.
    pub(super) fn publish_with(
        &self,
        endpoint: &Endpoint,
        envelope: &Arc<Envelope>,
        extra: Vec<(ShortString, AmqpValue)>,
        mode: Mode,
    ) -> Attempt {
        match self.get(endpoint) {
            Some(publisher) => Box::pin(publisher.publish(envelope.clone(), extra, mode)),
            // Unreachable with a compiled configuration: every endpoint has a publisher.
            None => Box::pin(std::future::ready(Err(PublishFailure::Stopped))),
        }
    }

    /// Where a branch starts: the first endpoint of its order that is up,
    /// or the first of all when none is.
    pub(super) fn first_usable(&self, plan: &BranchPlan) -> usize {
        plan.endpoints()
            .position(|e| self.is_up(e))
            .unwrap_or_default()
    }
}

impl Publishers {
    /// Waits, counted as waiting (which pauses consuming), until an
    /// endpoint of `plan` is up or `orphaned` is cancelled.
    pub(super) async fn wait_for_recovery(
        &self,
        plan: &BranchPlan,
        message_id: &str,
        orphaned: &CancellationToken,
    ) {
        self.telemetry.outage_wait(message_id, &plan.name);
        self.waiting.send_modify(|n| *n += 1);
        let mut health = self.health.clone();
        loop {
            if plan.endpoints().any(|e| self.is_up(e)) {
                break;
            }
            tokio::select! {
                () = orphaned.cancelled() => break,
                changed = health.changed() => if changed.is_err() { break },
            }
        }
        self.waiting.send_modify(|n| *n -= 1);
        self.telemetry.outage_over(message_id, &plan.name);
    }

    /// Whether every endpoint of `plan` is unreachable at the connection
    /// level (an outage, not a refusal).
    pub(super) fn all_unreachable(&self, plan: &BranchPlan) -> bool {
        plan.endpoints()
            .all(|e| self.get(e).is_some_and(|p| p.health().is_unreachable()))
    }

    /// The telemetry handle deliveries report to.
    pub(super) fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }
}

/// A transaction whose first attempts are on the wire.
pub struct Started {
    envelope: Arc<Envelope>,
    publishers: Publishers,
    branches: Vec<(BranchPlan, usize, Attempt)>,
}

pub(super) type Attempt =
    std::pin::Pin<Box<dyn Future<Output = Result<(), PublishFailure>> + Send>>;

/// Submits the first attempt of every branch now.
pub fn start(envelope: &Arc<Envelope>, plans: Vec<BranchPlan>, publishers: &Publishers) -> Started {
    let branches = plans
        .into_iter()
        .map(|plan| {
            let at = publishers.first_usable(&plan);
            let first: Attempt = match plan.endpoints().nth(at) {
                Some(endpoint) => publishers.publish(endpoint, envelope, Mode::Normal),
                None => Box::pin(std::future::ready(Err(PublishFailure::Stopped))),
            };
            (plan, at, first)
        })
        .collect();
    Started {
        envelope: envelope.clone(),
        publishers: publishers.clone(),
        branches,
    }
}

impl Started {
    /// Runs every branch to its outcome. `orphaned` is cancelled when the
    /// inbound channel is lost: no new attempt starts after that.
    pub async fn finish(self, orphaned: &CancellationToken) -> Outcome {
        let Started {
            envelope,
            publishers,
            branches,
        } = self;
        let walks = branches.into_iter().map(|(plan, at, first)| {
            Walk {
                plan,
                envelope: &envelope,
                publishers: &publishers,
                orphaned,
            }
            .run(at, first)
        });
        // Each walk is boxed where it is made. Held inline, or side by side
        // in `join_all`'s one slice, walks made every transaction's task
        // larger to allocate and to move (the layout keeps a moved-from
        // walk's slot until its scope ends).
        let mut walks = walks.map(Box::pin);
        // One branch (one-to-one forwarding) needs no join.
        let branches = if walks.len() == 1 {
            match walks.next() {
                Some(walk) => vec![walk.await],
                None => Vec::new(),
            }
        } else {
            join_all(walks).await
        };
        Outcome { branches }
    }
}

/// One branch's way down its endpoint list.
struct Walk<'a> {
    plan: BranchPlan,
    envelope: &'a Arc<Envelope>,
    publishers: &'a Publishers,
    orphaned: &'a CancellationToken,
}

impl Walk<'_> {
    async fn run(self, at: usize, first: Attempt) -> BranchOutcome {
        let mut outcome = self.walk(at, Some(first)).await;
        while matches!(outcome, BranchOutcome::Failed { .. })
            && self.plan.outage == Outage::Wait
            && self.all_unreachable()
            && !self.orphaned.is_cancelled()
        {
            self.wait_for_recovery().await;
            outcome = self
                .walk(self.publishers.first_usable(&self.plan), None)
                .await;
        }
        outcome
    }

    async fn wait_for_recovery(&self) {
        let message_id = self.envelope.message_id();
        self.publishers
            .wait_for_recovery(&self.plan, message_id, self.orphaned)
            .await;
    }

    fn all_unreachable(&self) -> bool {
        self.publishers.all_unreachable(&self.plan)
    }

    async fn walk(&self, at: usize, first: Option<Attempt>) -> BranchOutcome {
        let plan = &self.plan;
        let telemetry = &self.publishers.telemetry;
        let message_id = self.envelope.message_id();
        let endpoints: Vec<&Arc<Endpoint>> = plan.endpoints().collect();
        let mut first = first;
        let mut last_error = None;
        for (i, endpoint) in endpoints.iter().enumerate().skip(at) {
            if first.is_none() && self.skippable(endpoint, &endpoints[i + 1..]) {
                continue;
            }
            for attempt in 0..=endpoint.retries {
                if first.is_none() && self.orphaned.is_cancelled() {
                    return BranchOutcome::Abandoned {
                        branch: plan.name.clone(),
                    };
                }
                let outcome = match first.take() {
                    Some(first) => first.await,
                    None => self.attempt(endpoint, Mode::Normal).await,
                };
                let outcome = match outcome {
                    Err(e) if e.is_suspect() && !self.orphaned.is_cancelled() => {
                        telemetry.isolating(message_id, &plan.name, &endpoint.name, &e);
                        self.attempt(endpoint, Mode::Alone).await
                    }
                    other => other,
                };
                match outcome {
                    Ok(()) => {
                        telemetry.forwarded(message_id, &plan.name, &endpoint.name);
                        return BranchOutcome::Delivered {
                            branch: plan.name.clone(),
                            endpoint: endpoint.name.clone(),
                        };
                    }
                    Err(PublishFailure::Rejected(why)) => {
                        telemetry.rejected(message_id, &plan.name, &endpoint.name, &why);
                        return BranchOutcome::Rejected {
                            branch: plan.name.clone(),
                            endpoint: endpoint.name.clone(),
                            error: why,
                        };
                    }
                    Err(error) => {
                        if attempt < endpoint.retries {
                            telemetry.retry(message_id, &plan.name, &endpoint.name, &error);
                        } else {
                            let next = endpoints.get(i + 1).map(|e| e.name.as_str());
                            telemetry.failover(
                                message_id,
                                &plan.name,
                                &endpoint.name,
                                next,
                                &error,
                            );
                        }
                        last_error = Some((endpoint.name.clone(), error));
                    }
                }
            }
        }
        let (endpoint, error) = last_error.map_or_else(
            || (String::new(), "no endpoint to try".to_owned()),
            |(endpoint, e)| (endpoint, e.to_string()),
        );
        BranchOutcome::Failed {
            branch: plan.name.clone(),
            endpoint,
            error,
        }
    }

    fn attempt(&self, endpoint: &Endpoint, mode: Mode) -> Attempt {
        self.publishers.publish(endpoint, self.envelope, mode)
    }

    /// A down endpoint is skipped while one after it in the list is up.
    fn skippable(&self, endpoint: &Endpoint, after: &[&Arc<Endpoint>]) -> bool {
        !self.publishers.is_up(endpoint) && after.iter().any(|e| self.publishers.is_up(e))
    }
}
