//! One branch of a session: every message goes to the same endpoint, in
//! arrival order, one confirm at a time, so an endpoint never holds a later
//! message of the session without every earlier one.
//!
//! When the endpoint fails (after its retries) the branch moves to the next
//! endpoint of its list and first replays the messages that endpoint lacks,
//! in order, marked `x-switchyard-replay`, then sends the new one. Each
//! endpoint's confirmed prefix is remembered, so a branch that comes back to
//! an endpoint (after an outage wait) continues where it stopped there.

use super::super::deliver::Publishers;
use crate::amqp::AmqpValue;
use crate::broker::{Mode, PublishFailure};
use crate::destination::Endpoint;
use crate::envelope::Envelope;
use crate::routing::{BranchPlan, Outage};
use crate::wire;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Where one branch of a session stands.
pub(super) struct Affinity {
    pub(super) plan: BranchPlan,
    endpoints: Vec<Arc<Endpoint>>,
    /// Index of the endpoint the session sticks to.
    at: usize,
    /// Per endpoint: how many messages of the set it has confirmed, a prefix.
    confirmed: Vec<usize>,
    /// How many messages of the set this branch delivered somewhere.
    pub(super) delivered: usize,
}

/// How delivering one message on one branch ended.
#[derive(Debug)]
pub(super) enum Step {
    Delivered,
    /// Every endpoint of the list failed.
    Failed {
        endpoint: String,
        error: String,
    },
    /// The broker refused the message itself.
    Rejected {
        endpoint: String,
        error: String,
    },
    /// The inbound channel is gone: the broker redelivers the set.
    Abandoned,
}

/// What a branch needs from its session to publish.
pub(super) struct Context<'a> {
    pub(super) publishers: &'a Publishers,
    pub(super) session: &'a str,
    pub(super) lost: &'a CancellationToken,
}

impl Affinity {
    /// A branch that starts on the first endpoint of `plan` that is up.
    pub(super) fn new(plan: BranchPlan, publishers: &Publishers) -> Self {
        let endpoints: Vec<Arc<Endpoint>> = plan.endpoints().cloned().collect();
        let at = publishers.first_usable(&plan);
        Self {
            confirmed: vec![0; endpoints.len()],
            plan,
            endpoints,
            at,
            delivered: 0,
        }
    }

    /// Delivers the last message of `set` (every earlier one is delivered
    /// on this branch already).
    pub(super) async fn deliver(&mut self, set: &[Arc<Envelope>], cx: &Context<'_>) -> Step {
        let Some(newest) = set.len().checked_sub(1) else {
            return Step::Delivered;
        };
        let message_id = set[newest].message_id();
        let telemetry = cx.publishers.telemetry();
        loop {
            let mut last_error = None;
            while let Some(endpoint) = self.endpoints.get(self.at).cloned() {
                for attempt in 0..=endpoint.retries {
                    if cx.lost.is_cancelled() {
                        return Step::Abandoned;
                    }
                    match self.catch_up(&endpoint, set, cx).await {
                        Ok(()) => {
                            self.delivered = self.delivered.max(set.len());
                            telemetry.forwarded(message_id, &self.plan.name, &endpoint.name);
                            return Step::Delivered;
                        }
                        Err(PublishFailure::Rejected(error)) => {
                            telemetry.rejected(message_id, &self.plan.name, &endpoint.name, &error);
                            return Step::Rejected {
                                endpoint: endpoint.name.clone(),
                                error,
                            };
                        }
                        Err(error) if attempt < endpoint.retries => {
                            telemetry.retry(message_id, &self.plan.name, &endpoint.name, &error);
                        }
                        Err(error) => last_error = Some((endpoint.name.clone(), error)),
                    }
                }
                let next = self.next_endpoint(cx.publishers);
                if let (Some(to), Some((from, error))) = (self.endpoints.get(next), &last_error) {
                    let has = self.confirmed[next].min(newest);
                    telemetry.session_failover(
                        cx.session,
                        message_id,
                        &self.plan.name,
                        (from, &to.name),
                        newest - has,
                        error,
                    );
                }
                self.at = next;
            }
            let (endpoint, error) = last_error.map_or_else(
                || (String::new(), "no endpoint to try".to_owned()),
                |(endpoint, e)| (endpoint, e.to_string()),
            );
            if self.plan.outage == Outage::Wait
                && cx.publishers.all_unreachable(&self.plan)
                && !cx.lost.is_cancelled()
            {
                cx.publishers
                    .wait_for_recovery(&self.plan, message_id, cx.lost)
                    .await;
                self.at = cx.publishers.first_usable(&self.plan);
                continue;
            }
            telemetry.failover(message_id, &self.plan.name, &endpoint, None, &error);
            return Step::Failed { endpoint, error };
        }
    }

    /// Sends `endpoint` every message of `set` it has not confirmed, one at
    /// a time, in order; all but the newest are replays.
    async fn catch_up(
        &mut self,
        endpoint: &Endpoint,
        set: &[Arc<Envelope>],
        cx: &Context<'_>,
    ) -> Result<(), PublishFailure> {
        let newest = set.len() - 1;
        while self.confirmed[self.at] < set.len() {
            let index = self.confirmed[self.at];
            let envelope = &set[index];
            let extra = || {
                if index < newest {
                    vec![(wire::REPLAY.into(), AmqpValue::Boolean(true))]
                } else {
                    Vec::new()
                }
            };
            let mut sent = cx
                .publishers
                .publish_with(endpoint, envelope, extra(), Mode::Normal)
                .await;
            if let Err(error) = &sent
                && error.is_suspect()
                && !cx.lost.is_cancelled()
            {
                let telemetry = cx.publishers.telemetry();
                telemetry.isolating(
                    envelope.message_id(),
                    &self.plan.name,
                    &endpoint.name,
                    error,
                );
                sent = cx
                    .publishers
                    .publish_with(endpoint, envelope, extra(), Mode::Alone)
                    .await;
            }
            sent?;
            self.confirmed[self.at] += 1;
        }
        Ok(())
    }

    /// The endpoint after the current one to move to: the next one that is
    /// up, or simply the next when none after it is.
    fn next_endpoint(&self, publishers: &Publishers) -> usize {
        let after = self.at + 1;
        self.endpoints
            .iter()
            .enumerate()
            .skip(after)
            .find(|(_, e)| publishers.is_up(e))
            .map_or(after, |(i, _)| i)
    }
}
