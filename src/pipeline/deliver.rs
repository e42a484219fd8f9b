//! Deliver: publish one copy per branch and walk backup lists.
//!
//! [`start`] submits every branch's first attempt at once, in the order
//! messages arrive, so the happy path keeps inbound order per endpoint.
//! [`Started::finish`] then runs the branches concurrently: each awaits its
//! confirm and, on any failure (nack, return, timeout, channel loss,
//! unreachable broker), retries the endpoint if configured and moves on to
//! the next endpoint of its list. A delivered branch is never sent again.

use super::outcome::{BranchOutcome, Outcome};
use crate::broker::{PublishFailure, Publisher};
use crate::config::Endpoint;
use crate::envelope::Envelope;
use crate::routing::BranchPlan;
use crate::telemetry;
use futures_util::future::join_all;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

/// Publishers by endpoint name.
#[derive(Clone, Default)]
pub struct Publishers {
    by_endpoint: HashMap<String, Publisher>,
}

impl Publishers {
    /// Registers `publisher` under its endpoint's name.
    pub fn insert(&mut self, publisher: Publisher) {
        self.by_endpoint
            .insert(publisher.endpoint().name.clone(), publisher);
    }

    fn publish(&self, endpoint: &Endpoint, envelope: &Arc<Envelope>) -> Attempt {
        match self.by_endpoint.get(&endpoint.name) {
            Some(publisher) => Box::pin(publisher.publish(envelope.clone(), Vec::new())),
            // Unreachable with a compiled configuration: every endpoint has a publisher.
            None => Box::pin(std::future::ready(Err(PublishFailure::Channel(format!(
                "no publisher for endpoint \"{}\"",
                endpoint.name
            ))))),
        }
    }
}

/// A transaction whose first attempts are on the wire.
pub struct Started {
    envelope: Arc<Envelope>,
    publishers: Publishers,
    branches: Vec<(BranchPlan, Attempt)>,
}

type Attempt = std::pin::Pin<Box<dyn Future<Output = Result<(), PublishFailure>> + Send>>;

/// Submits the first attempt of every branch now.
pub fn start(envelope: &Arc<Envelope>, plans: Vec<BranchPlan>, publishers: &Publishers) -> Started {
    let branches = plans
        .into_iter()
        .map(|plan| {
            let first: Attempt = match plan.endpoints().next() {
                Some(endpoint) => publishers.publish(endpoint, envelope),
                None => Box::pin(std::future::ready(Err(PublishFailure::Channel(
                    "empty endpoint list".to_owned(),
                )))),
            };
            (plan, first)
        })
        .collect();
    Started {
        envelope: envelope.clone(),
        publishers: publishers.clone(),
        branches,
    }
}

impl Started {
    /// Runs every branch to its outcome.
    pub async fn finish(self) -> Outcome {
        let Started {
            envelope,
            publishers,
            branches,
        } = self;
        let walks = branches
            .into_iter()
            .map(|(plan, first)| walk(plan, first, &envelope, &publishers));
        Outcome {
            branches: join_all(walks).await,
        }
    }
}

async fn walk(
    plan: BranchPlan,
    first: Attempt,
    envelope: &Arc<Envelope>,
    publishers: &Publishers,
) -> BranchOutcome {
    let message_id = envelope.message_id();
    let endpoints: Vec<&Arc<Endpoint>> = plan.endpoints().collect();
    let mut first = Some(first);
    let mut last_error = None;
    for (i, endpoint) in endpoints.iter().enumerate() {
        for attempt in 0..=endpoint.retries {
            let outcome = match first.take() {
                Some(first) => first.await,
                None => publishers.publish(endpoint, envelope).await,
            };
            match outcome {
                Ok(()) => {
                    telemetry::forwarded(message_id, &plan.name, &endpoint.name);
                    return BranchOutcome::Delivered {
                        branch: plan.name.clone(),
                        endpoint: endpoint.name.clone(),
                    };
                }
                Err(error) => {
                    if attempt < endpoint.retries {
                        telemetry::retry(message_id, &plan.name, &endpoint.name, &error);
                    }
                    let next = endpoints.get(i + 1).map(|e| e.name.as_str());
                    if attempt == endpoint.retries {
                        telemetry::failover(message_id, &plan.name, &endpoint.name, next, &error);
                    }
                    last_error = Some(error);
                }
            }
        }
    }
    BranchOutcome::Failed {
        branch: plan.name.clone(),
        error: last_error.map_or_else(|| "no endpoint to try".to_owned(), |e| e.to_string()),
    }
}
