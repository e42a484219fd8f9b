//! Answers: what happened to a request, as a status and a JSON body with
//! the message id, the branches delivered and failed, and the reason.
//!
//! | status | when |
//! | --- | --- |
//! | 202 | every branch confirmed |
//! | 200 | a retry of a key whose branches were all confirmed: the first answer |
//! | 400, 401, 405, 408, 413, 415, 431, 501 | refused before anything was published |
//! | 404 | no route (nothing published) |
//! | 409 | the key was used for another request, or the session is closed |
//! | 429 | `max_in_flight` reached, or every session slot taken (`Retry-After`) |
//! | 502 | a branch exhausted its list, or its broker refused the message |
//! | 503 | a broker blocks publishers, or a branch's whole list is down (`Retry-After`) |
//! | 504 | the request timed out before every confirm: the outcome is unknown |

use crate::pipeline::intake::NotTaken;
use crate::pipeline::outcome::{Barred, Outcome, Reason, Verdict};
use hyper::StatusCode;
use hyper::body::Bytes;
use serde_json::json;

/// Seconds a client is asked to wait after a 429.
pub const RETRY_AFTER_BUSY: u32 = 1;
/// Seconds a client is asked to wait after a 503.
pub const RETRY_AFTER_DOWN: u32 = 5;

/// One answer, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u32>,
    /// The JSON body: kept by the key's record, sent without a copy.
    pub body: Bytes,
    /// Why, one line, for the log.
    pub reason: String,
}

impl Answer {
    fn new(status: StatusCode, reason: String, body: serde_json::Value) -> Self {
        let retry_after = match status {
            StatusCode::TOO_MANY_REQUESTS => Some(RETRY_AFTER_BUSY),
            StatusCode::SERVICE_UNAVAILABLE => Some(RETRY_AFTER_DOWN),
            _ => None,
        };
        Self {
            status,
            retry_after,
            body: Bytes::from(body.to_string()),
            reason,
        }
    }

    /// A refusal before any message existed (no message id yet).
    pub fn refused(status: StatusCode, reason: &str) -> Self {
        Self::new(
            status,
            reason.to_owned(),
            json!({ "outcome": outcome_word(status), "reason": reason }),
        )
    }

    /// A message that was not taken: nothing published.
    pub fn not_taken(message_id: &str, why: &NotTaken) -> Self {
        let status = match why {
            NotTaken::Blocked
            | NotTaken::Starting
            | NotTaken::Stopping
            | NotTaken::Unrecorded
            | NotTaken::Paused => StatusCode::SERVICE_UNAVAILABLE,
            NotTaken::SessionsFull(_) => StatusCode::TOO_MANY_REQUESTS,
            NotTaken::Barred(Barred::NoRoute {
                unparsable_body: Some(_),
            }) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            NotTaken::Barred(Barred::NoRoute { .. }) => StatusCode::NOT_FOUND,
            NotTaken::Barred(
                Barred::SessionClosed { .. }
                | Barred::SessionEnded { .. }
                | Barred::SessionTimeout { .. },
            ) => StatusCode::CONFLICT,
            NotTaken::Barred(Barred::SessionTooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            NotTaken::Barred(_) => StatusCode::BAD_REQUEST,
        };
        let reason = why.to_string();
        Self::new(
            status,
            reason.clone(),
            json!({
                "message_id": message_id,
                "outcome": outcome_word(status),
                "delivered": [],
                "failed": [],
                "reason": reason,
            }),
        )
    }

    /// The key names another request.
    pub fn conflict(message_id: &str) -> Self {
        let reason = "this Idempotency-Key was used for a request with another routing key or body";
        Self::new(
            StatusCode::CONFLICT,
            reason.to_owned(),
            json!({ "message_id": message_id, "outcome": "conflict", "reason": reason }),
        )
    }

    /// The request timed out before every confirm; `delivered` are known.
    pub fn timed_out(message_id: &str) -> Self {
        let reason = "ingress.http.request_timeout_ms passed before every branch was confirmed; \
                      the outcome is unknown: retry with the same Idempotency-Key";
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            reason.to_owned(),
            json!({
                "message_id": message_id,
                "outcome": "timeout",
                "delivered": [],
                "failed": [],
                "reason": reason,
            }),
        )
    }

    /// What `outcome` says, its verdict told as a status: `delivered` are
    /// the branches confirmed by this try and earlier ones of the same key.
    pub fn of(message_id: &str, outcome: Outcome, delivered: &[String]) -> Self {
        let (status, reason, failed) = match outcome.verdict() {
            Verdict::Commit => (StatusCode::ACCEPTED, ACCEPTED, Vec::new()),
            // Only once the caller is gone or out of time: it is answered 504.
            Verdict::Abandon => (
                StatusCode::GATEWAY_TIMEOUT,
                "the request timed out before every branch was confirmed: retry with the same \
                 Idempotency-Key",
                Vec::new(),
            ),
            Verdict::DeadLetter { cause, .. } => {
                let failed = cause
                    .failed_branches()
                    .map(|f| {
                        let endpoint = f.endpoint.as_deref().unwrap_or_default();
                        failure(&f.branch, endpoint, &f.error.to_string())
                    })
                    .collect();
                if cause.reason() == Reason::Outage {
                    let reason = "every endpoint of a branch is unreachable: retry with the same \
                                  Idempotency-Key";
                    (StatusCode::SERVICE_UNAVAILABLE, reason, failed)
                } else {
                    let reason = "a branch exhausted its endpoint list";
                    (StatusCode::BAD_GATEWAY, reason, failed)
                }
            }
        };
        Self::new(
            status,
            reason.to_owned(),
            body(message_id, status, delivered, failed, reason),
        )
    }

    /// The first `202` of a key whose branches were all confirmed, given
    /// again with status 200: the same body, made anew from the record.
    pub fn again(message_id: &str, delivered: &[String]) -> Self {
        let accepted = body(
            message_id,
            StatusCode::ACCEPTED,
            delivered,
            Vec::new(),
            ACCEPTED,
        );
        Self {
            status: StatusCode::OK,
            retry_after: None,
            body: Bytes::from(accepted.to_string()),
            reason: "a retry of a request whose every branch was confirmed".to_owned(),
        }
    }
}

/// The reason of a `202`.
const ACCEPTED: &str = "every branch confirmed";

/// The JSON body of an answer about a message.
fn body(
    message_id: &str,
    status: StatusCode,
    delivered: &[String],
    failed: Vec<serde_json::Value>,
    reason: &str,
) -> serde_json::Value {
    json!({
        "message_id": message_id,
        "outcome": outcome_word(status),
        "delivered": delivered,
        "failed": failed,
        "reason": reason,
    })
}

fn failure(branch: &str, endpoint: &str, error: &str) -> serde_json::Value {
    json!({ "branch": branch, "endpoint": endpoint, "error": error })
}

/// The `outcome` word of a status.
fn outcome_word(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200 | 202 => "accepted",
        400 => "bad-request",
        401 => "unauthorized",
        404 => "no-route",
        405 => "method-not-allowed",
        408 => "request-timeout",
        409 => "conflict",
        413 => "too-large",
        415 => "unparsable-body",
        431 => "headers-too-large",
        429 => "busy",
        502 => "failed",
        501 => "not-implemented",
        503 => "unavailable",
        504 => "timeout",
        _ => "error",
    }
}
