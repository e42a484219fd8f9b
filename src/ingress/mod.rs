//! The HTTP ingress (`[ingress.http]`): producers that cannot speak AMQP
//! send `POST /messages/{routing_key}` (or `PUT`) and the request becomes a
//! message that goes through the same screen, filter table, multicast,
//! backup walk and sessions as a consumed one. The answer says what
//! happened (`answer` lists every status): `202` only once every branch's
//! copy is confirmed. Requests are never dead-lettered; the caller holds
//! the outcome, and a retry with the same `Idempotency-Key` sends only the
//! branches not confirmed yet ([`idempotency`]).
//!
//! One request, in order: a header it is made of given twice (400), the
//! bearer token (401), the path and method (404, 405), a transfer coding
//! other than chunked (501), `Content-Length` against `max_body_bytes`
//! (413), the body within the limit and `body_timeout_ms` (413, 408), the
//! message (`request`, 400), a slot of `max_in_flight` (429), so that a
//! body still arriving holds no slot, the key's record (200, 409),
//! then the intake: screened and routed (404, 415, 400, 409, 503), and
//! delivered by a task of the forwarder's that records its outcome even when
//! the caller has gone or timed out (504). [`server`] bounds connections and
//! the time to send headers, and speaks TLS when configured.

pub(crate) mod answer;
pub mod idempotency;
pub(crate) mod request;
pub mod server;

use crate::config::HttpIngress;
use crate::envelope::Envelope;
use crate::journal::{Said, Source};
use crate::listen::gate::BodyWatch;
use crate::pipeline::intake::{Intake, NotTaken};
use crate::pipeline::record;
use crate::telemetry::Telemetry;
use answer::Answer;
use hyper::Request;
use hyper::body::Incoming;
use idempotency::{Begin, Records, Ticket};
use std::sync::Arc;
use std::time::SystemTime;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
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
    /// The headers a request may give once only: the token and every one
    /// the message is made of.
    single_headers: Vec<String>,
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
        let single_headers = [
            hyper::header::AUTHORIZATION.as_str(),
            request::IDEMPOTENCY_KEY,
            hyper::header::CONTENT_TYPE.as_str(),
            request::CORRELATION_ID,
        ]
        .into_iter()
        .map(str::to_owned)
        .chain(config.forward_headers.iter().cloned())
        .chain(session_headers.iter().map(|h| h.to_ascii_lowercase()))
        .collect();
        Self {
            single_headers,
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
        let deadline = started + self.config.request_timeout;
        let (envelope, keyed, permit) = match self.read(request, started, deadline).await {
            Ok(read) => read,
            Err(r) => return (Answer::refused(r.status, &r.reason), None),
        };
        let message_id = envelope.message_id().into_owned();
        let answer = self.deliver(envelope, keyed, permit, deadline).await;
        (answer, Some(message_id))
    }

    /// Everything before a message exists: the head, the token, the path,
    /// the length, the body, the mapping, and only then a slot of
    /// `max_in_flight`. Returns the message, whether it carries an
    /// `Idempotency-Key`, and its slot.
    async fn read(
        &self,
        request: Request<Incoming>,
        started: Instant,
        deadline: Instant,
    ) -> Result<(Envelope, bool, OwnedSemaphorePermit), request::Refused> {
        let config = &self.config;
        let headers = request.headers();
        request::check_head(headers)?;
        request::check_single(headers, &self.single_headers)?;
        request::authorize(headers, &config.tokens)?;
        let routing_key = request::routing_key(request.method(), request.uri().path())?;
        request::check_transfer_coding(headers)?;
        request::check_length(headers, config.max_body_bytes)?;
        let watch = request.extensions().get::<BodyWatch>().cloned();
        let (parts, body) = request.into_parts();
        let body_deadline = started + config.body_timeout;
        let (by, late) = if body_deadline < deadline {
            (body_deadline, "ingress.http.body_timeout_ms")
        } else {
            (deadline, "ingress.http.request_timeout_ms")
        };
        // The gate measures the body's rate while it is read, and cuts it
        // (408) for a waiting client when it is too slow.
        let _reading = watch.as_ref().map(BodyWatch::reading);
        let cut = watch.as_ref().map(BodyWatch::cut).unwrap_or_default();
        let body = request::read_body(body, config.max_body_bytes, (by, late), &cut).await?;
        let request = Request::from_parts(parts, ());
        let envelope =
            request::envelope(&request, routing_key, body, config, &self.session_headers)?;
        let keyed = request.headers().contains_key(request::IDEMPOTENCY_KEY);
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            return Err(request::Refused {
                status: hyper::StatusCode::TOO_MANY_REQUESTS,
                reason: format!(
                    "{} requests are in flight, the most ingress.http.max_in_flight allows",
                    config.max_in_flight
                ),
            });
        };
        Ok((envelope, keyed, permit))
    }

    /// Delivers `envelope` (only what its key's record lacks) through the
    /// intake, on a task of the forwarder's that records the outcome even
    /// when the answer is not awaited any more, and answers by `deadline`.
    async fn deliver(
        &self,
        envelope: Envelope,
        keyed: bool,
        permit: OwnedSemaphorePermit,
        deadline: Instant,
    ) -> Answer {
        let id = envelope.message_id().into_owned();
        let (ticket, skip) = if keyed {
            match self.claim(&id, envelope.content_uuid(), deadline).await {
                Ok((ticket, skip)) => (Some(ticket), skip),
                Err(answer) => return answer,
            }
        } else {
            (None, Vec::new())
        };
        let lost = CancellationToken::new();
        // The caller gone or out of time: no new attempt starts.
        let _stop_on_drop = lost.clone().drop_guard();
        if envelope.annotations.trace.malformed {
            self.telemetry.trace_context_malformed(&id);
        }
        let journal = self.intake.recorder();
        // Made before the envelope goes; completed once it is answered.
        let mut entry = journal.wanted().then(|| {
            let received_at = SystemTime::now();
            record::entry(
                &envelope,
                Source::Http,
                received_at,
                Said::Acked,
                Vec::new(),
            )
        });
        let delivery = match self.intake.submit(envelope, &skip, lost.clone()) {
            Ok(delivery) => delivery,
            Err(why) => return Answer::not_taken(&id, &why),
        };
        let (tell, told) = oneshot::channel();
        let message_id = id.clone();
        self.intake.spawn(async move {
            let mut branches: Vec<_> = skip.iter().map(|b| record::earlier(b)).collect();
            let answer = match delivery.await {
                Ok(mut outcome) => {
                    if entry.is_some() {
                        branches.extend(record::branches(&mut outcome));
                    }
                    let now: Vec<String> = outcome.delivered().map(|b| b.to_string()).collect();
                    let earlier_and_now = [skip, now.clone()].concat();
                    let answer = Answer::of(&message_id, outcome, &earlier_and_now);
                    if let Some(ticket) = ticket {
                        ticket.finish(&now, answer.status == hyper::StatusCode::ACCEPTED);
                    }
                    answer
                }
                Err(why) => Answer::not_taken(&message_id, &why),
            };
            drop(permit);
            if let Some(mut entry) = entry.take() {
                entry.said = Said::Answered {
                    status: answer.status.as_u16(),
                    reason: answer.reason.clone(),
                };
                entry.branches = branches;
                entry.settled_at = SystemTime::now();
                journal.settled(entry);
            }
            let _ = tell.send(answer);
        });
        match tokio::time::timeout_at(deadline, told).await {
            Ok(Ok(answer)) => answer,
            // The delivery task is gone only when the forwarder stops.
            Ok(Err(_)) => Answer::not_taken(&id, &NotTaken::Stopping),
            Err(_) => Answer::timed_out(&id),
        }
    }

    /// The right to deliver under key `key` for a request of `digest`, and
    /// the branches its earlier tries confirmed; or the answer instead
    /// (the record's, a conflict, or a timeout waiting for an earlier try).
    async fn claim(
        &self,
        key: &str,
        digest: uuid::Uuid,
        deadline: Instant,
    ) -> Result<(Ticket, Vec<String>), Answer> {
        loop {
            match self.records.begin(key, digest) {
                Begin::Deliver(ticket, skip) => return Ok((ticket, skip)),
                Begin::Complete(delivered) => return Err(Answer::again(key, &delivered)),
                Begin::Conflict => return Err(Answer::conflict(key)),
                Begin::Wait(mut running) => {
                    let ended = running.wait_for(|done| *done);
                    if tokio::time::timeout_at(deadline, ended).await.is_err() {
                        return Err(Answer::timed_out(key));
                    }
                }
            }
        }
    }
}
