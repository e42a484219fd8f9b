//! The HTTP ingress (`[ingress.http]`): producers that cannot speak AMQP
//! send `POST /messages/{routing_key}` (or `PUT`) and the request becomes a
//! message that goes through the same screen, filter table, multicast,
//! backup walk and sessions as a consumed one. The answer says what
//! happened ([`answer`] lists every status): `202` only once every branch's
//! copy is confirmed. Requests are never dead-lettered; the caller holds
//! the outcome, and a retry with the same `Idempotency-Key` sends only the
//! branches not confirmed yet ([`idempotency`]).
//!
//! One request, in order: the bearer token (401), the path and method
//! (404, 405), `Content-Length` against `max_body_bytes` (413), a slot of
//! `max_in_flight` (429), the body within the limit and the request's time
//! (413, 408), the message ([`request`], 400), the key's record (200, 409),
//! then the intake: screened and routed (404, 415, 400, 409, 503), and
//! delivered by a task of the forwarder's that records its outcome even when
//! the caller has gone or timed out (504). [`server`] bounds connections and
//! the time to send headers, and speaks TLS when configured.

pub mod answer;
pub mod idempotency;
pub mod request;
pub mod server;

use crate::config::HttpIngress;
use crate::pipeline::intake::{Intake, NotTaken};
use crate::telemetry::Telemetry;
use answer::Answer;
use hyper::Request;
use hyper::body::Incoming;
use idempotency::{Begin, Records};
use std::sync::Arc;
use tokio::sync::{Semaphore, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What serving requests needs; one per listener, shared by its
/// connections.
pub struct Ingress {
    config: HttpIngress,
    intake: Intake,
    records: Records,
    in_flight: Arc<Semaphore>,
    /// The session headers copied into messages (`[sessions]`, when on).
    session_headers: Vec<String>,
    telemetry: Telemetry,
}

impl Ingress {
    /// An ingress delivering through `intake`.
    pub fn new(
        config: HttpIngress,
        sessions: Option<&crate::config::Sessions>,
        intake: Intake,
        telemetry: Telemetry,
    ) -> Self {
        // By their configured names, which the session lookup matches
        // exactly; the request's headers are found whatever their case.
        let session_headers = sessions
            .map(|s| vec![s.id_header.clone(), s.end_header.clone()])
            .unwrap_or_default();
        Self {
            records: Records::new(config.idempotency_ttl, config.idempotency_max_keys),
            in_flight: Arc::new(Semaphore::new(config.max_in_flight as usize)),
            config,
            intake,
            session_headers,
            telemetry,
        }
    }

    /// Answers one request.
    pub async fn handle(&self, request: Request<Incoming>) -> Answer {
        let started = Instant::now();
        let (answer, message_id) = self.answer(request, started).await;
        self.telemetry.http_answered(
            answer.status.as_u16(),
            started.elapsed(),
            message_id.as_deref().unwrap_or("-"),
            &answer.reason,
        );
        answer
    }

    async fn answer(
        &self,
        request: Request<Incoming>,
        started: Instant,
    ) -> (Answer, Option<String>) {
        let refused = |r: request::Refused| (Answer::refused(r.status, &r.reason), None);
        let config = &self.config;
        let deadline = started + config.request_timeout;
        if let Err(r) = request::check_head(request.headers())
            .and_then(|()| request::authorize(request.headers(), &config.tokens))
        {
            return refused(r);
        }
        let routing_key = match request::routing_key(request.method(), request.uri().path()) {
            Ok(key) => key,
            Err(r) => return refused(r),
        };
        if let Err(r) = request::check_length(request.headers(), config.max_body_bytes) {
            return refused(r);
        }
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            let why = format!(
                "{} requests are in flight, the most ingress.http.max_in_flight allows",
                config.max_in_flight
            );
            return refused(request::Refused {
                status: hyper::StatusCode::TOO_MANY_REQUESTS,
                reason: why,
            });
        };
        let (parts, body) = request.into_parts();
        let within = deadline.saturating_duration_since(Instant::now());
        let body = match request::read_body(body, config.max_body_bytes, within).await {
            Ok(body) => body,
            Err(r) => return refused(r),
        };
        let request = Request::from_parts(parts, ());
        let session_headers: Vec<&str> = self.session_headers.iter().map(String::as_str).collect();
        let envelope =
            match request::envelope(&request, routing_key, body, config, &session_headers) {
                Ok(envelope) => envelope,
                Err(r) => return refused(r),
            };
        let message_id = envelope.message_id().to_owned();
        let keyed = request.headers().contains_key(request::IDEMPOTENCY_KEY);
        // The routing key and the body: what a retry must repeat.
        let digest = envelope.content_uuid();
        let (ticket, skip) = if keyed {
            loop {
                match self.records.begin(&message_id, digest) {
                    Begin::Deliver(ticket, skip) => break (Some(ticket), skip),
                    Begin::Complete(body) => return (Answer::again(body), Some(message_id)),
                    Begin::Conflict => return (Answer::conflict(&message_id), Some(message_id)),
                    Begin::Wait(mut running) => {
                        let ended = running.wait_for(|done| *done);
                        if tokio::time::timeout_at(deadline, ended).await.is_err() {
                            return (Answer::timed_out(&message_id), Some(message_id));
                        }
                    }
                }
            }
        } else {
            (None, Vec::new())
        };
        let lost = CancellationToken::new();
        // The caller gone or out of time: no new attempt starts.
        let _stop_on_drop = lost.clone().drop_guard();
        let submitted = match self.intake.submit(envelope, &skip, lost.clone()) {
            Ok(submitted) => submitted,
            Err(why) => return (Answer::not_taken(&message_id, &why), Some(message_id)),
        };
        let (tell, told) = oneshot::channel();
        let id = message_id.clone();
        self.intake.spawn(async move {
            let answer = match submitted.delivery.await {
                Ok(outcome) => {
                    let answer = Answer::of(&id, &outcome, &skip);
                    let delivered: Vec<String> = outcome
                        .branches
                        .iter()
                        .filter_map(|b| match b {
                            crate::pipeline::outcome::BranchOutcome::Delivered {
                                branch, ..
                            } => Some(branch.to_string()),
                            _ => None,
                        })
                        .collect();
                    if let Some(ticket) = ticket {
                        let complete = (answer.status == hyper::StatusCode::ACCEPTED)
                            .then(|| answer.body.clone());
                        ticket.finish(&delivered, complete);
                    }
                    answer
                }
                Err(why) => Answer::not_taken(&id, &why),
            };
            drop(permit);
            let _ = tell.send(answer);
        });
        match tokio::time::timeout_at(deadline, told).await {
            Ok(Ok(answer)) => (answer, Some(message_id)),
            // The delivery task is gone only when the forwarder stops.
            Ok(Err(_)) => (
                Answer::not_taken(&message_id, &NotTaken::Stopping),
                Some(message_id),
            ),
            Err(_) => (Answer::timed_out(&message_id), Some(message_id)),
        }
    }
}
