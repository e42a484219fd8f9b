//! `/control` and `/registry` on the admin endpoint: commands to the
//! group, in JSON both ways.
//!
//! | request | command |
//! | --- | --- |
//! | `GET /control/status` | none: the group's state |
//! | `POST /control/pause`, `POST /control/resume` | pause, resume |
//! | `POST /control/endpoints/{name}/drain`, `.../undrain` | drain, undrain |
//! | `PUT /registry/{branch}/{name}` | register (or renew) |
//! | `DELETE /registry/{branch}/{name}` | unregister |
//!
//! Without `admin.tokens` every such path answers 403; a missing or
//! wrong bearer token 401, saying neither which. A refused command
//! changes nothing and says why (`{"error": ...}`): 404 unknown, 409 a
//! clash, 400 invalid, 429 too many registrations, 413 a body over 16 KiB.
//! A command carried out answers 200 with the status once this instance
//! has applied it.

use crate::control::{Command, Refusal, RegisterRequest, Steer, SteerError, SubmitError};
use crate::listen::bearer::{Bearer, bearer};
use crate::telemetry::Telemetry;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

/// The largest request body taken.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// How long a body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `path` is one of control's.
pub fn owns(path: &str) -> bool {
    path == "/control"
        || path.starts_with("/control/")
        || path == "/registry"
        || path.starts_with("/registry/")
}

/// Answers one request to a control path.
pub async fn respond(
    request: Request<Incoming>,
    steering: Option<&dyn Steer>,
    telemetry: &Telemetry,
) -> Response<Full<Bytes>> {
    let Some(steering) = steering else {
        return error(StatusCode::FORBIDDEN, "control is off on this instance");
    };
    let Some(tokens) = steering.tokens() else {
        return error(
            StatusCode::FORBIDDEN,
            "control is off on this instance ([control] enabled = false)",
        );
    };
    if tokens.is_empty() {
        return error(
            StatusCode::FORBIDDEN,
            "control needs admin.tokens, and none are set on this instance",
        );
    }
    if bearer(request.headers(), &tokens) != Bearer::Accepted {
        telemetry.admin_unauthorized();
        let mut response = error(StatusCode::UNAUTHORIZED, "unauthorized");
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let command = match (parts.as_slice(), &method) {
        (["control", "status"], &Method::GET) => return ok(steering.status()),
        (["control", "pause"], &Method::POST) => Command::Pause,
        (["control", "resume"], &Method::POST) => Command::Resume,
        (["control", "endpoints", name, "drain"], &Method::POST) => Command::Drain(decode(name)),
        (["control", "endpoints", name, "undrain"], &Method::POST) => {
            Command::Undrain(decode(name))
        }
        (["registry", branch, name], &Method::PUT) => {
            let request = match body::<RegisterRequest>(request).await {
                Ok(request) => request,
                Err(response) => return response,
            };
            Command::Register {
                branch: decode(branch),
                name: decode(name),
                request,
            }
        }
        (["registry", branch, name], &Method::DELETE) => Command::Unregister {
            branch: decode(branch),
            name: decode(name),
        },
        (
            ["control", "status" | "pause" | "resume"]
            | ["control", "endpoints", _, "drain" | "undrain"]
            | ["registry", _, _],
            _,
        ) => return error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here"),
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                "not found: try GET /control/status, POST /control/pause or /control/resume, \
                 POST /control/endpoints/{name}/drain or /undrain, PUT or DELETE \
                 /registry/{branch}/{name}",
            );
        }
    };
    match steering.command(command).await {
        Ok(status) => ok(status),
        Err(SteerError::Refused(refusal) | SteerError::Submit(SubmitError::Refused(refusal))) => {
            let status = match &refusal {
                Refusal::NotFound(_) => StatusCode::NOT_FOUND,
                Refusal::Conflict(_) => StatusCode::CONFLICT,
                Refusal::Invalid(_) => StatusCode::BAD_REQUEST,
                Refusal::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            };
            error(status, &refusal.to_string())
        }
        Err(SteerError::Submit(e @ SubmitError::Off)) => {
            error(StatusCode::FORBIDDEN, &e.to_string())
        }
        Err(SteerError::Submit(e @ SubmitError::Unavailable(_))) => {
            let mut response = error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
        Err(SteerError::Submit(e @ SubmitError::NotApplied)) => {
            error(StatusCode::GATEWAY_TIMEOUT, &e.to_string())
        }
    }
}

/// A path segment, percent-decoded (`%2F` and the like); left as it is
/// when it does not decode.
fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| segment.to_owned())
}

/// The request's JSON body, at most [`MAX_BODY_BYTES`].
async fn body<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<T, Response<Full<Bytes>>> {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the body is over {MAX_BODY_BYTES} bytes"),
        )
    };
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let limited = Limited::new(request.into_body(), MAX_BODY_BYTES);
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, limited.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Ok(Err(_)) => return Err(error(StatusCode::BAD_REQUEST, "the body could not be read")),
        Err(_) => {
            return Err(error(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive in time",
            ));
        }
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            &format!(
                "the body is not the JSON expected ({e}): send {{\"routing_key\": \"...\", \
                 \"ttl_ms\": 30000}}, optionally with \"broker\" and \"exchange\""
            ),
        )
    })
}

fn ok(status: Value) -> Response<Full<Bytes>> {
    json_response(StatusCode::OK, &status)
}

fn error(status: StatusCode, reason: &str) -> Response<Full<Bytes>> {
    json_response(status, &json!({ "error": reason }))
}

fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut text = body.to_string();
    text.push('\n');
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
