//! One branch's walk down its endpoint list, for an ordered run of one or
//! more messages: the only place that publishes, retries, fails over,
//! isolates suspects, waits out outages and replays.
//!
//! The run's messages go to one endpoint at a time, each after every
//! earlier one is confirmed there. [`BranchRun::deliver`] delivers the run's
//! newest message: the current endpoint first gets whatever earlier
//! messages of the run it lacks (replays, marked `x-switchyard-replay`),
//! then the new one. A run of one (an independent message) is just that
//! message, often already on the wire. Each endpoint's confirmed prefix of
//! the run is remembered, so a branch that comes back to an endpoint (after
//! an outage wait) goes on where it stopped there.
//!
//! On a failure (nack, return, timeout, channel or connection loss,
//! unreachable broker) the endpoint is tried again `retries` times, then the
//! branch moves to the next endpoint of its list that is up (or simply the
//! next when none after it is). A copy that failed because its channel
//! closed under it in a way one message may have caused is retried alone
//! on the same endpoint: if it fails alone, the broker refuses that message
//! itself and the branch ends `Rejected`. Once the inbound channel is lost
//! (the broker will redeliver) no new attempt is started.
//!
//! A transient failure (a nack while the broker settles after a node
//! change: a quorum queue electing its leader) is no attempt at all: the
//! same endpoint is tried again after a pause, counted as an outage hold
//! so that consuming pauses meanwhile.
//!
//! A branch fails only when every endpoint of its list has *refused* the
//! message (nacked it, returned it). An endpoint that could not be reached
//! for it (its broker unreachable, the connection lost under the publish,
//! no confirm in time, the forwarder's user refused, skipped as down, or
//! drained) has not refused it, even if every other endpoint did: the pass
//! ends in an outage, which with `outage = "wait"` (the default) holds the
//! message until one of the endpoints that did not refuse it is up again,
//! then walks the list again; with `"dead_letter"` it ends `Outage`, at
//! once or after `outage_timeout_ms` of holding. A refusal is remembered
//! across passes (the copy was refused there), so a list every endpoint of
//! which has refused the message fails, however long that took.

use super::Engine;
use super::outage::{Hold, HoldEnd};
use crate::amqp::{AmqpValue, ShortString};
use crate::backoff::Backoff;
use crate::broker::{Attempt, Health, Mode, PublishFailure};
use crate::destination::Endpoint;
use crate::envelope::Envelope;
use crate::journal::{Attempted, Tried};
use crate::pipeline::outcome::BranchOutcome;
use crate::routing::{BranchPlan, Outage};
use crate::telemetry::{Replay, Telemetry};
use crate::wire;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The first and the longest pause before a transient failure's endpoint
/// is tried again.
const TRANSIENT_FIRST: Duration = Duration::from_millis(200);
const TRANSIENT_MAX: Duration = Duration::from_secs(2);

/// Where one branch stands in its run.
pub struct BranchRun {
    plan: BranchPlan,
    /// The endpoint it sticks to, by its place in the plan's order.
    at: usize,
    /// How many messages of the run the current endpoint has confirmed.
    confirmed_here: usize,
    /// Other endpoints' confirmed prefixes, by place; only filled once the
    /// branch leaves an endpoint, so a run that never fails over allocates
    /// nothing.
    elsewhere: Vec<(usize, usize)>,
    /// The branch ended failed or rejected: its endpoint holds no complete
    /// prefix of the run any more.
    failed: bool,
    /// Every step of the walk, in order, for the journal and span export;
    /// `None` when neither is on.
    trail: Option<Vec<Tried>>,
    /// The span and start of the first attempt, submitted before the walk.
    submitted: Option<(u64, SystemTime)>,
}

/// What a walk needs besides its branch: the engine, the inbound channel's
/// loss, and the session the run belongs to, if any.
pub struct Walk<'a> {
    /// Publishes, reads health, counts outage waits, reports.
    pub engine: &'a Engine,
    /// Cancelled when the inbound channel is lost.
    pub lost: &'a CancellationToken,
    /// The session id, for a session's run.
    pub session: Option<&'a str>,
}

impl BranchRun {
    /// A branch that starts on the first endpoint of `plan` that is up, or
    /// the first of all when none is.
    pub fn new(plan: BranchPlan, engine: &Engine) -> Self {
        let at = first_usable(engine, &plan);
        let mut run = Self {
            plan,
            at,
            confirmed_here: 0,
            elsewhere: Vec::new(),
            failed: false,
            trail: engine.recording.then(Vec::new),
            submitted: None,
        };
        run.skipped(engine, 0..at, 0);
        run
    }

    /// The steps the walk has taken so far, in order (none when nothing
    /// records them).
    pub fn trail(&self) -> &[Tried] {
        self.trail.as_deref().unwrap_or_default()
    }

    /// Takes the steps recorded so far.
    pub fn take_trail(&mut self) -> Vec<Tried> {
        self.trail.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The branch name.
    pub fn name(&self) -> &Arc<str> {
        &self.plan.name
    }

    /// How many messages of the run the branch's endpoint holds, in order;
    /// 0 once the branch failed.
    pub fn holds(&self) -> usize {
        if self.failed { 0 } else { self.confirmed_here }
    }

    /// Publishes `envelope`, the first message of a run, to the endpoint
    /// the branch starts on, now: its outcome is `deliver`'s `first`.
    /// `None` when there is nothing to publish to (every endpoint drained,
    /// or none registered): `deliver` holds the message instead.
    pub fn submit(&mut self, engine: &Engine, envelope: &Arc<Envelope>) -> Option<Attempt> {
        let endpoint = self.plan.endpoint(self.at)?;
        if engine.publish.health(endpoint) == Health::Drained {
            return None;
        }
        let span = wire::nonzero_u64();
        self.submitted = Some((span, SystemTime::now()));
        let headers = self.headers(engine, envelope, span, false);
        Some(
            engine
                .publish
                .publish(endpoint, envelope, headers, Mode::Normal),
        )
    }

    /// Delivers the last message of `run` (every earlier one is delivered
    /// on this branch already). `first` is that message's publish to the
    /// current endpoint when it is already on the wire ([`Self::submit`]).
    // Kept whole (about 100 lines): the failover rules (retry, skip a down
    // endpoint, isolate a suspect, wait out an outage, replay) read as one
    // walk down the list; split, each rule would lose the state it shares.
    pub async fn deliver(
        &mut self,
        run: &[Arc<Envelope>],
        first: Option<Attempt>,
        walk: &Walk<'_>,
    ) -> BranchOutcome {
        let Some(newest) = run.len().checked_sub(1) else {
            return self.delivered_here();
        };
        let message_id = run[newest].message_id();
        let message_id: &str = &message_id;
        let telemetry = &walk.engine.telemetry;
        let mut first = first;
        let mut hold: Option<Hold> = None;
        let mut refused = Refused::default();
        loop {
            let mut last_error: Option<(String, PublishFailure)> = None;
            // The last failure of this pass that says nothing of the message.
            let mut last_outage: Option<(String, PublishFailure)> = None;
            // Whether any endpoint of this pass was tried at all, and
            // whether one was passed over drained.
            let (mut tried, mut drained) = (false, false);
            while let Some(endpoint) = self.plan.endpoint(self.at).cloned() {
                if first.is_none() && walk.engine.publish.health(&endpoint) == Health::Drained {
                    // Drained: passed over without a word, as the operator asked.
                    drained = true;
                    self.skipped(walk.engine, self.at..self.at + 1, newest);
                    self.move_to(self.at + 1);
                    continue;
                }
                tried = true;
                for attempt in 0..=endpoint.retries {
                    if first.is_none() && walk.lost.is_cancelled() {
                        return self.abandoned();
                    }
                    match self.attempt(&endpoint, run, first.take(), walk).await {
                        Ok(()) => return self.delivered_here(),
                        Err(PublishFailure::Rejected(error)) => {
                            telemetry.rejected(message_id, &self.plan.name, &endpoint.name, &error);
                            self.failed = true;
                            return BranchOutcome::Rejected {
                                branch: self.plan.name.clone(),
                                endpoint: endpoint.name.clone(),
                                error,
                            };
                        }
                        Err(error) => {
                            if error.is_outage() {
                                last_outage = Some((endpoint.name.clone(), error.clone()));
                            } else if attempt == endpoint.retries {
                                refused.insert(self.at, self.plan.len());
                            }
                            if attempt < endpoint.retries {
                                telemetry.retry(
                                    message_id,
                                    &self.plan.name,
                                    &endpoint.name,
                                    &error,
                                );
                            } else {
                                last_error = Some((endpoint.name.clone(), error));
                            }
                        }
                    }
                }
                let next = self.next_endpoint(walk.engine);
                self.skipped(walk.engine, self.at + 1..next, newest);
                let to = self
                    .plan
                    .endpoint(next)
                    .filter(|to| walk.engine.publish.health(to) != Health::Drained);
                if let (Some(to), Some((from, error))) = (to, &last_error) {
                    let session = walk.session.map(|session| Replay {
                        session,
                        replaying: newest - self.confirmed_at(next).min(newest),
                    });
                    let route = (from.as_str(), Some(to.name.as_str()));
                    telemetry.failover(message_id, &self.plan.name, route, error, session);
                }
                self.move_to(next);
            }
            let (endpoint, error) = match last_error {
                // Every endpoint refused it: the list is exhausted.
                Some(last) if refused.all(self.plan.len()) => {
                    return self.exhausted(telemetry, message_id, Some(last));
                }
                // One that did not refuse it (unreachable, skipped as down,
                // drained) may take it: held.
                Some(last) => last_outage.unwrap_or_else(|| self.unrefused(&refused, last)),
                // Nothing to publish to (every endpoint drained, or none
                // registered yet): held as an outage, never dead-lettered.
                None if !tried => (self.waiting_on(), PublishFailure::NoEndpoint),
                last => return self.exhausted(telemetry, message_id, last),
            };
            if walk.lost.is_cancelled() {
                return self.abandoned();
            }
            let deadline = match self.plan.outage {
                Outage::DeadLetter { .. } | Outage::Wait if !tried || drained => None,
                Outage::Wait => None,
                Outage::DeadLetter { after: None } | Outage::Answer => {
                    return self.outage(telemetry, message_id, endpoint, error);
                }
                Outage::DeadLetter { after: Some(after) } => {
                    Some(hold.as_ref().map_or_else(Instant::now, |h| h.since) + after)
                }
            };
            let hold = match &mut hold {
                Some(hold) => hold,
                None => {
                    telemetry.outage_hold(message_id, &self.plan.name, &endpoint, &error);
                    hold.insert(Hold::new())
                }
            };
            let publish = walk.engine.publish.as_ref();
            let outages = &walk.engine.outages;
            let held_from = Instant::now();
            // Back when one that did not refuse it is up: the others would
            // refuse it again.
            let unrefused: Vec<&Arc<Endpoint>> = (0..self.plan.len())
                .filter(|place| !refused.has(*place))
                .filter_map(|place| self.plan.endpoint(place))
                .collect();
            let ended = outages
                .hold(publish, &unrefused, hold, walk.lost, deadline)
                .await;
            self.held(newest, &endpoint, held_from.elapsed());
            match ended {
                HoldEnd::Recovered => {
                    telemetry.outage_retry(message_id, &self.plan.name);
                    let at = first_usable(walk.engine, &self.plan);
                    self.move_to(at);
                    self.skipped(walk.engine, 0..at, newest);
                }
                HoldEnd::Lost => return self.abandoned(),
                HoldEnd::Expired => {
                    return self.outage(telemetry, message_id, endpoint, error);
                }
            }
        }
    }

    fn abandoned(&self) -> BranchOutcome {
        BranchOutcome::Abandoned {
            branch: self.plan.name.clone(),
        }
    }

    /// The branch fails: its list ran out, `last` the endpoint that failed
    /// last and how.
    fn exhausted(
        &mut self,
        telemetry: &Telemetry,
        message_id: &str,
        last: Option<(String, PublishFailure)>,
    ) -> BranchOutcome {
        // A compiled list is never empty; `Stopped` stands for "nothing tried".
        let (endpoint, error) = match last {
            Some((endpoint, error)) => (Some(endpoint), error),
            None => (None, PublishFailure::Stopped),
        };
        self.failed = true;
        let route = (endpoint.as_deref().unwrap_or_default(), None);
        telemetry.failover(message_id, &self.plan.name, route, &error, None);
        BranchOutcome::Failed {
            branch: self.plan.name.clone(),
            endpoint,
            error,
        }
    }

    /// The branch gives up on an outage, as its `outage` setting says.
    fn outage(
        &mut self,
        telemetry: &Telemetry,
        message_id: &str,
        endpoint: String,
        error: PublishFailure,
    ) -> BranchOutcome {
        self.failed = true;
        let route = (endpoint.as_str(), None);
        telemetry.failover(message_id, &self.plan.name, route, &error, None);
        BranchOutcome::Outage {
            branch: self.plan.name.clone(),
            endpoint,
            error,
        }
    }

    fn delivered_here(&self) -> BranchOutcome {
        BranchOutcome::Delivered {
            branch: self.plan.name.clone(),
            endpoint: self
                .plan
                .endpoint(self.at)
                .map(|e| e.name.clone())
                .unwrap_or_default(),
        }
    }

    /// One attempt at `endpoint` ([`Self::catch_up`]), made again after a
    /// pause for as long as the endpoint fails transiently.
    async fn attempt(
        &mut self,
        endpoint: &Arc<Endpoint>,
        run: &[Arc<Envelope>],
        mut first: Option<Attempt>,
        walk: &Walk<'_>,
    ) -> Result<(), PublishFailure> {
        let mut pause: Option<Backoff> = None;
        loop {
            match self.catch_up(endpoint, run, first.take(), walk).await {
                Err(error) if error.is_transient() && !walk.lost.is_cancelled() => {
                    let delay = pause
                        .get_or_insert_with(|| Backoff::new(TRANSIENT_FIRST, TRANSIENT_MAX))
                        .next_delay();
                    if !walk.engine.outages.pause(delay, walk.lost).await {
                        return Err(error);
                    }
                }
                other => return other,
            }
        }
    }

    /// Sends `endpoint` every message of `run` it has not confirmed, one at
    /// a time, in order; all but the newest are replays. `first` is the
    /// newest message's publish, already on the wire.
    async fn catch_up(
        &mut self,
        endpoint: &Arc<Endpoint>,
        run: &[Arc<Envelope>],
        mut first: Option<Attempt>,
        walk: &Walk<'_>,
    ) -> Result<(), PublishFailure> {
        let newest = run.len() - 1;
        let publish = walk.engine.publish.as_ref();
        let telemetry = &walk.engine.telemetry;
        while self.confirmed_here < run.len() {
            let index = self.confirmed_here;
            let envelope = &run[index];
            let replay = index < newest;
            let (mut sent, mut span, mut started) = match (replay, first.take()) {
                (false, Some(first)) => {
                    let (span, started) = self.submitted.take().unwrap_or((0, SystemTime::now()));
                    (first.await, span, started)
                }
                (_, kept) => {
                    first = kept;
                    let (span, started) = (wire::nonzero_u64(), SystemTime::now());
                    let headers = self.headers(walk.engine, envelope, span, replay);
                    let sent = publish
                        .publish(endpoint, envelope, headers, Mode::Normal)
                        .await;
                    (sent, span, started)
                }
            };
            if let Err(error) = &sent
                && error.is_suspect()
                && !walk.lost.is_cancelled()
            {
                telemetry.isolating(
                    &envelope.message_id(),
                    &self.plan.name,
                    &endpoint.name,
                    error,
                );
                self.tried(endpoint, index, replay, (span, started), &sent);
                (span, started) = (wire::nonzero_u64(), SystemTime::now());
                let headers = self.headers(walk.engine, envelope, span, replay);
                sent = publish
                    .publish(endpoint, envelope, headers, Mode::Alone)
                    .await;
            }
            self.tried(endpoint, index, replay, (span, started), &sent);
            sent?;
            self.confirmed_here += 1;
            telemetry.forwarded(&envelope.message_id(), &self.plan.name, &endpoint.name);
            if replay {
                telemetry.replayed(&self.plan.name, &endpoint.name);
            }
        }
        Ok(())
    }

    /// The headers a copy of `envelope` carries on this branch: its copy
    /// id, its `traceparent` naming the publish span `span` (and the
    /// incoming `tracestate`), and the replay mark.
    fn headers(
        &self,
        engine: &Engine,
        envelope: &Envelope,
        span: u64,
        replay: bool,
    ) -> Vec<(ShortString, AmqpValue)> {
        let trace = &envelope.annotations.trace;
        let sampled = engine.sampled(trace);
        let mut headers = Vec::with_capacity(4);
        headers.push(self.copy_id(envelope));
        headers.push((
            wire::TRACEPARENT.into(),
            AmqpValue::LongString(trace.child(span, sampled).into()),
        ));
        if let Some(state) = &trace.state {
            headers.push((
                wire::TRACESTATE.into(),
                AmqpValue::LongString(state.as_str().into()),
            ));
        }
        if replay {
            headers.push((wire::REPLAY.into(), AmqpValue::Boolean(true)));
        }
        headers
    }

    /// Records one publish attempt at `endpoint` and how it ended.
    fn tried(
        &mut self,
        endpoint: &Arc<Endpoint>,
        index: usize,
        replay: bool,
        (span, started): (u64, SystemTime),
        sent: &Result<(), PublishFailure>,
    ) {
        let Some(trail) = &mut self.trail else {
            return;
        };
        trail.push(Tried {
            index: u32::try_from(index).unwrap_or(u32::MAX),
            endpoint: endpoint.clone(),
            outcome: attempted(sent),
            replay,
            span,
            started,
            ended: SystemTime::now(),
        });
    }

    /// Records the endpoints at `places` as skipped, being down or
    /// drained, on the way to the run's message `index`.
    fn skipped(&mut self, engine: &Engine, places: std::ops::Range<usize>, index: usize) {
        let Some(trail) = &mut self.trail else {
            return;
        };
        let now = SystemTime::now();
        for place in places {
            if let Some(endpoint) = self.plan.endpoint(place) {
                let outcome = match engine.publish.health(endpoint) {
                    Health::Drained => Attempted::SkippedDrained,
                    _ => Attempted::SkippedDown,
                };
                trail.push(Tried {
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                    endpoint: endpoint.clone(),
                    outcome,
                    replay: false,
                    span: 0,
                    started: now,
                    ended: now,
                });
            }
        }
    }

    /// What a hold says it waits on when no endpoint of the pass failed for
    /// an outage (the one that did not refuse was skipped as down or
    /// drained): the first such endpoint, or `last` when there is none.
    fn unrefused(
        &self,
        refused: &Refused,
        last: (String, PublishFailure),
    ) -> (String, PublishFailure) {
        (0..self.plan.len())
            .find(|place| !refused.has(*place))
            .and_then(|place| self.plan.endpoint(place))
            .map_or(last, |e| (e.name.clone(), PublishFailure::Down))
    }

    /// The endpoint a branch with nothing to publish to says it waits on:
    /// its first (`""` for a list with none).
    fn waiting_on(&self) -> String {
        self.plan
            .endpoint(0)
            .map(|e| e.name.clone())
            .unwrap_or_default()
    }

    /// Records an outage hold of the run's message `index` for `held`,
    /// after `endpoint` (by name) failed last.
    fn held(&mut self, index: usize, endpoint: &str, held: Duration) {
        let Some(trail) = &mut self.trail else {
            return;
        };
        let Some(endpoint) = self.plan.endpoints().find(|e| e.name == endpoint) else {
            return;
        };
        let ended = SystemTime::now();
        trail.push(Tried {
            index: u32::try_from(index).unwrap_or(u32::MAX),
            endpoint: endpoint.clone(),
            outcome: Attempted::Held(held),
            replay: false,
            span: 0,
            started: ended.checked_sub(held).unwrap_or(ended),
            ended,
        });
    }

    /// The `x-switchyard-copy-id` header of `envelope` on this branch.
    fn copy_id(&self, envelope: &Envelope) -> (ShortString, AmqpValue) {
        let id = envelope.copy_id(&self.plan.name);
        (wire::COPY_ID.into(), AmqpValue::LongString(id.into()))
    }

    /// The place after the current one to move to: the next endpoint that
    /// is up, or simply the next when none after it is.
    fn next_endpoint(&self, engine: &Engine) -> usize {
        let after = self.at + 1;
        let rest = || (after..).map_while(|i| self.plan.endpoint(i).map(|e| (i, e)));
        rest()
            .find(|(_, e)| engine.publish.health(e) == Health::Up)
            .or_else(|| rest().find(|(_, e)| engine.publish.health(e) != Health::Drained))
            .map_or(after, |(i, _)| i)
    }

    /// How many messages of the run the endpoint at `place` has confirmed.
    fn confirmed_at(&self, place: usize) -> usize {
        if place == self.at {
            return self.confirmed_here;
        }
        self.elsewhere
            .iter()
            .find(|(p, _)| *p == place)
            .map_or(0, |(_, n)| *n)
    }

    /// Sticks to the endpoint at `place` from now on, remembering what the
    /// current one has confirmed.
    fn move_to(&mut self, place: usize) {
        if place == self.at {
            return;
        }
        let here = self.confirmed_here;
        self.confirmed_here = self.confirmed_at(place);
        match self.elsewhere.iter_mut().find(|(p, _)| *p == self.at) {
            Some(entry) => entry.1 = here,
            None => self.elsewhere.push((self.at, here)),
        }
        self.at = place;
    }
}

/// The places of a branch's list whose endpoint refused the message (a
/// nack, a return): allocated at the first refusal, so a walk that
/// delivers allocates nothing.
#[derive(Debug, Default)]
struct Refused(Vec<bool>);

impl Refused {
    fn insert(&mut self, place: usize, len: usize) {
        if self.0.len() < len {
            self.0.resize(len, false);
        }
        if let Some(slot) = self.0.get_mut(place) {
            *slot = true;
        }
    }

    fn has(&self, place: usize) -> bool {
        self.0.get(place).copied().unwrap_or(false)
    }

    /// Whether every one of `len` places refused it.
    fn all(&self, len: usize) -> bool {
        len > 0 && (0..len).all(|place| self.has(place))
    }
}

/// The journal's word for how one publish ended.
fn attempted(sent: &Result<(), PublishFailure>) -> Attempted {
    match sent {
        Ok(()) => Attempted::Confirmed,
        Err(PublishFailure::Nacked | PublishFailure::NackedSettling) => Attempted::Nacked,
        Err(PublishFailure::Returned { code, .. }) => Attempted::Returned(*code),
        Err(PublishFailure::Timeout(_)) => Attempted::TimedOut,
        Err(PublishFailure::Broker(_)) => Attempted::Lost,
        Err(PublishFailure::Unreachable(_)) => Attempted::Unreachable,
        Err(PublishFailure::Rejected(_)) => Attempted::Refused,
        Err(PublishFailure::Down) => Attempted::SkippedDown,
        Err(PublishFailure::Stopped | PublishFailure::NoEndpoint) => Attempted::Stopped,
    }
}

/// Where a branch starts: the first endpoint of its order that is up, or
/// the first not drained when none is, or the first of all.
fn first_usable(engine: &Engine, plan: &BranchPlan) -> usize {
    let health = |e: &Arc<Endpoint>| engine.publish.health(e);
    plan.endpoints()
        .position(|e| health(e) == Health::Up)
        .or_else(|| plan.endpoints().position(|e| health(e) != Health::Drained))
        .unwrap_or_default()
}
