//! Which publish a confirm, and a return, belong to. lapin attaches a
//! return to whichever confirm it resolves next, so every copy carries its
//! publish id and a return is attributed by the id it carries.

use super::actor::Actor;
use super::confirms::{Confirm, Confirmed, InFlight, drain_ready, fence, publish_id};
use super::request::{Mode, PublishFailure, Refusal};
use crate::broker::error::{BrokerError, Fault, Level};
use crate::broker::health::Down;
use futures_util::stream::FuturesUnordered;
use lapin::message::BasicReturnMessage;

impl Actor {
    /// Decides the outcome of `first` and of every other confirm that
    /// resolved with it.
    ///
    /// lapin attaches a return to whichever confirm it resolves next, and
    /// resolves all confirms of one multiple-ack frame in one walk under its
    /// acknowledgement lock. A return can therefore ride on a sibling of its
    /// own publish. So: collect what is ready, pass the lock once (the
    /// fence: any walk in progress has then finished and woken every
    /// sibling), collect again, attribute every return seen, and only then
    /// decide the confirms collected before the fence. Those collected after
    /// it wait for the next fence.
    pub(super) fn harvest(&mut self, first: Confirmed, in_flight: &mut FuturesUnordered<InFlight>) {
        // Two buffers kept across calls: a batch is often hundreds of
        // confirms, and growing fresh vectors showed in the profile.
        let mut batch = std::mem::take(&mut self.batch);
        let mut late = std::mem::take(&mut self.late);
        batch.push(first);
        drain_ready(in_flight, &mut batch);
        loop {
            fence(&batch);
            drain_ready(in_flight, &mut late);
            for (id, _, result) in batch.iter_mut().chain(late.iter_mut()) {
                if let Confirm::Ack(returned) | Confirm::Nack(returned) = result {
                    self.attribute(returned.take(), *id);
                }
            }
            self.decide(&mut batch);
            if late.is_empty() {
                break;
            }
            std::mem::swap(&mut batch, &mut late);
        }
        self.batch = batch;
        self.late = late;
        self.deadlines
            .forget_settled(|id| self.waiting.contains_key(&id));
    }

    /// Sends each publisher its outcome; returns were attributed already.
    /// Leaves `batch` empty.
    fn decide(&mut self, batch: &mut Vec<Confirmed>) {
        for (id, _, result) in batch.drain(..) {
            let mut outcome = match (self.returned.remove(&id), result) {
                (Some(returned), _) => Err(returned),
                (None, Confirm::Ack(_)) => Ok(()),
                (None, Confirm::Nack(_)) if self.connector.settling() => {
                    Err(PublishFailure::NackedSettling)
                }
                (None, Confirm::Nack(_)) => Err(PublishFailure::Nacked),
                (None, Confirm::NotRequested) => Err(PublishFailure::Broker(BrokerError {
                    code: None,
                    level: Level::Transport,
                    text: "channel is not in confirm mode".to_owned(),
                })),
                (None, Confirm::Failed(e)) => Err(PublishFailure::Broker(e)),
            };
            let Some(waiter) = self.waiting.remove(&id) else {
                continue;
            };
            if waiter.mode == Mode::Alone {
                self.alone_busy = None;
                // Alone on its channel, a refusal with a reply code is this message's own.
                if let Err(PublishFailure::Broker(e)) = &outcome
                    && e.fault() == Fault::Message
                    && e.code.is_some()
                {
                    outcome = Err(PublishFailure::Rejected(Refusal::Broker(e.clone())));
                }
            }
            match &outcome {
                Err(nack @ (PublishFailure::Nacked | PublishFailure::NackedSettling)) => {
                    self.nacked(&waiter, nack);
                }
                Ok(()) => {
                    self.telemetry.confirmed(waiter.sent_at.elapsed());
                    self.health.mark_up();
                }
                Err(PublishFailure::Broker(e)) => match e.fault() {
                    Fault::Message => {}
                    Fault::Endpoint => {
                        self.health.mark_down(Down::Channel, e);
                    }
                    Fault::Connection => {
                        self.health.mark_down(Down::Connection, e);
                    }
                    Fault::Refused => {
                        if self.health.mark_down(Down::Connection, e) {
                            let (user, vhost) = self.connector.identity();
                            self.telemetry.publish_refused(
                                &self.endpoint.name,
                                &user,
                                &vhost,
                                &self.endpoint.exchange,
                                e,
                            );
                        }
                    }
                },
                Err(_) => {}
            }
            let _ = waiter.reply.send(outcome);
        }
    }

    fn attribute(&mut self, returned: Option<Box<BasicReturnMessage>>, carrier: u64) {
        let Some(message) = returned else { return };
        let owner = publish_id(&message.delivery.properties).unwrap_or(carrier);
        if !self.waiting.contains_key(&owner) {
            self.telemetry.late_return(&self.endpoint.name, owner);
            return;
        }
        self.returned.insert(
            owner,
            PublishFailure::Returned {
                code: message.reply_code,
                text: message.reply_text.to_string(),
            },
        );
    }
}
