//! An HTTP request read into a message: the path's routing key, the bearer
//! token, the body within its limits, and the properties and headers the
//! message is made of. Anything wrong is a [`Refused`] with its status;
//! nothing is published for it.

use crate::amqp::{AmqpValue, FieldTable, Properties, ShortString};
use crate::config::HttpIngress;
use crate::envelope::Envelope;
use crate::listen::bearer::{Bearer, bearer};
use crate::wire;
use http_body_util::BodyExt;
use hyper::body::Body;
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, TRANSFER_ENCODING};
use hyper::{Method, Request, StatusCode};
use std::time::{SystemTime, UNIX_EPOCH};

/// The path prefix of the one route.
pub const MESSAGES: &str = "/messages/";
/// The request header that names a message for retries.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The request header copied into `correlation_id`.
pub const CORRELATION_ID: &str = "x-correlation-id";
/// The method and the path of the request, as the forwarder's annotations.
pub const HTTP_METHOD: &str = "x-switchyard-http-method";
pub const HTTP_PATH: &str = "x-switchyard-http-path";

/// The most a request's headers may take. The server refuses a longer head
/// while reading it; one that arrived whole in one read is refused here.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The longest text an AMQP short string (message_id, routing key,
/// content_type, correlation_id) holds.
const SHORT_MAX: usize = 255;

/// A request refused before anything was published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The answer's status.
    pub status: StatusCode,
    /// Why, one line.
    pub reason: String,
}

impl Refused {
    fn new(status: StatusCode, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
        }
    }

    fn bad(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, reason)
    }
}

/// The routing key `POST|PUT /messages/{routing_key}` names, percent-decoded.
pub fn routing_key(method: &Method, path: &str) -> Result<String, Refused> {
    let Some(key) = path.strip_prefix(MESSAGES) else {
        return Err(Refused::new(
            StatusCode::NOT_FOUND,
            "no such path: send POST /messages/{routing_key}",
        ));
    };
    if method != Method::POST && method != Method::PUT {
        return Err(Refused::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "use POST or PUT on /messages/{routing_key}",
        ));
    }
    let key = percent_decode(key)
        .ok_or_else(|| Refused::bad("the routing key in the path is not percent-encoded UTF-8"))?;
    if key.is_empty() || key.len() > SHORT_MAX {
        return Err(Refused::bad(format!(
            "the routing key must be 1 to {SHORT_MAX} bytes, not {}",
            key.len()
        )));
    }
    Ok(key)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `Ok` when no tokens are configured or the request carries one of them
/// as `Authorization: Bearer <token>` (the scheme in any case, RFC 9110).
pub fn authorize(headers: &HeaderMap, tokens: &[String]) -> Result<(), Refused> {
    if tokens.is_empty() {
        return Ok(());
    }
    match bearer(headers, tokens) {
        Bearer::Accepted => Ok(()),
        Bearer::Missing => Err(Refused::new(
            StatusCode::UNAUTHORIZED,
            "missing bearer token: send Authorization: Bearer <token>",
        )),
        Bearer::Wrong => Err(Refused::new(StatusCode::UNAUTHORIZED, "wrong bearer token")),
    }
}

/// Headers over [`MAX_HEADER_BYTES`] in all are refused (431).
pub fn check_head(headers: &HeaderMap) -> Result<(), Refused> {
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if bytes > MAX_HEADER_BYTES {
        return Err(Refused::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!("the headers take {bytes} bytes, over the limit of {MAX_HEADER_BYTES}"),
        ));
    }
    Ok(())
}

/// A header the message is made of (or the token) given twice is refused:
/// which one a proxy and the forwarder each took would be a guess.
pub fn check_single(headers: &HeaderMap, names: &[String]) -> Result<(), Refused> {
    for name in names {
        if headers.get_all(name.as_str()).iter().nth(1).is_some() {
            return Err(Refused::bad(format!(
                "the {name} header is given more than once; send it once"
            )));
        }
    }
    Ok(())
}

/// A body in any transfer coding but `chunked` is refused (501): the
/// forwarder would otherwise pass on bytes it did not decode.
pub fn check_transfer_coding(headers: &HeaderMap) -> Result<(), Refused> {
    let codings = headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(str::trim);
    for coding in codings {
        if !coding.eq_ignore_ascii_case("chunked") {
            return Err(Refused::new(
                StatusCode::NOT_IMPLEMENTED,
                "the only Transfer-Encoding taken is chunked; send the body as it is",
            ));
        }
    }
    Ok(())
}

/// A `Content-Length` over the limit is refused before the body is read.
pub fn check_length(headers: &HeaderMap, max: u64) -> Result<(), Refused> {
    let length = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match length {
        Some(length) if length > max => Err(too_large(max)),
        _ => Ok(()),
    }
}

/// The gate cut the body for a client waiting for a connection slot.
fn too_slow() -> Refused {
    Refused::new(
        StatusCode::REQUEST_TIMEOUT,
        format!(
            "the body arrived slower than {} bytes a second while other clients waited for a \
             connection (ingress.http.max_connections)",
            crate::listen::gate::MIN_BODY_RATE
        ),
    )
}

fn too_large(max: u64) -> Refused {
    Refused::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the body is over ingress.http.max_body_bytes ({max} bytes)"),
    )
}

/// Reads the whole body, at most `max` bytes, by `deadline` (`late` says
/// which limit that is, for the 408). Each piece is copied into one buffer
/// and let go at once: HTTP's read buffer is shared by the pieces cut from
/// it, so keeping them would cost a buffer per read, kilobytes for a byte
/// trickled alone. The buffer grows with what arrived, never sized by
/// `Content-Length` ahead of the bytes, and ends no larger than the body's
/// declared length.
pub async fn read_body(
    mut body: Incoming,
    max: u64,
    (deadline, late): (tokio::time::Instant, &str),
    cut: &tokio_util::sync::CancellationToken,
) -> Result<Vec<u8>, Refused> {
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    let declared = body
        .size_hint()
        .exact()
        .map_or(limit, |n| usize::try_from(n).unwrap_or(limit));
    let mut buffer = Vec::new();
    loop {
        let next = tokio::select! {
            next = tokio::time::timeout_at(deadline, body.frame()) => next,
            () = cut.cancelled() => return Err(too_slow()),
        };
        let frame = match next {
            Err(_) => {
                return Err(Refused::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("the body did not arrive within {late}"),
                ));
            }
            Ok(None) => return Ok(buffer),
            Ok(Some(Err(e))) => {
                return Err(Refused::bad(format!("the body could not be read: {e}")));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers: nothing of the message
        };
        let needed = buffer.len() + data.len();
        if needed > limit {
            return Err(too_large(max));
        }
        if needed > buffer.capacity() {
            // Double as a Vec would, but never past the declared length.
            let wanted = (buffer.capacity() * 2)
                .max(needed)
                .min(declared.max(needed));
            buffer.reserve_exact(wanted - buffer.len());
        }
        buffer.extend_from_slice(&data);
    }
}

/// The message a request makes, as docs/http-ingress.md documents it: the
/// body byte for byte, `Idempotency-Key` (or a new UUID) as `message_id`,
/// `Content-Type`, `X-Correlation-Id`, persistent, stamped now, the
/// `forward_headers` and session headers present, and the method and path
/// as the forwarder's annotations.
pub fn envelope(
    request: &Request<()>,
    routing_key: String,
    body: Vec<u8>,
    config: &HttpIngress,
    session_headers: &[String],
) -> Result<Envelope, Refused> {
    let headers = request.headers();
    let short = |name: &str| -> Result<Option<ShortString>, Refused> {
        let Some(value) = headers.get(name) else {
            return Ok(None);
        };
        let text = value
            .to_str()
            .map_err(|_| Refused::bad(format!("{name} is not visible ASCII")))?;
        if text.is_empty() || text.len() > SHORT_MAX {
            return Err(Refused::bad(format!(
                "{name} must be 1 to {SHORT_MAX} characters, not {}",
                text.len()
            )));
        }
        Ok(Some(text.into()))
    };
    let message_id = match short(IDEMPOTENCY_KEY)? {
        Some(key) => key,
        None => uuid::Uuid::new_v4().to_string().into(),
    };
    let mut table = FieldTable::default();
    for name in config.forward_headers.iter().chain(session_headers) {
        if let Some(value) = headers.get(name.as_str()) {
            let text = value
                .to_str()
                .map_err(|_| Refused::bad(format!("{name} is not visible ASCII")))?;
            table.insert(
                name.as_str().into(),
                AmqpValue::LongString(text.as_bytes().to_vec().into()),
            );
        }
    }
    table.insert(
        HTTP_METHOD.into(),
        AmqpValue::LongString(request.method().as_str().into()),
    );
    table.insert(
        HTTP_PATH.into(),
        AmqpValue::LongString(request.uri().path().into()),
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut properties = Properties::default()
        .with_message_id(message_id)
        .with_delivery_mode(2)
        .with_timestamp(now)
        .with_headers(table);
    if let Some(content_type) = short(CONTENT_TYPE.as_str())? {
        properties = properties.with_content_type(content_type);
    }
    if let Some(correlation_id) = short(CORRELATION_ID)? {
        properties = properties.with_correlation_id(correlation_id);
    }
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let trace = wire::Trace::from_texts(
        text(wire::TRACEPARENT),
        text(wire::TRACESTATE),
        headers.contains_key(wire::TRACEPARENT),
    );
    Ok(Envelope {
        delivery_tag: 0,
        exchange: String::new(),
        routing_key,
        redelivered: false,
        properties,
        body,
        annotations: wire::Annotations {
            trace,
            ..wire::Annotations::default()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::AUTHORIZATION;

    #[test]
    fn the_path_names_the_routing_key() {
        let post = Method::POST;
        assert_eq!(
            routing_key(&post, "/messages/orders.eu"),
            Ok("orders.eu".to_owned())
        );
        assert_eq!(
            routing_key(&Method::PUT, "/messages/a%2Fb%20c"),
            Ok("a/b c".to_owned())
        );
        let status = |m: &Method, p: &str| routing_key(m, p).map_err(|r| r.status);
        assert_eq!(status(&post, "/other"), Err(StatusCode::NOT_FOUND));
        assert_eq!(
            status(&Method::GET, "/messages/x"),
            Err(StatusCode::METHOD_NOT_ALLOWED)
        );
        assert_eq!(status(&post, "/messages/"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(status(&post, "/messages/%zz"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(status(&post, "/messages/%ff"), Err(StatusCode::BAD_REQUEST));
        let long = format!("/messages/{}", "k".repeat(256));
        assert_eq!(status(&post, &long), Err(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn a_token_is_required_only_when_some_are_set() {
        let mut headers = HeaderMap::new();
        assert!(authorize(&headers, &[]).is_ok());
        let tokens = ["s3cret".to_owned(), "other".to_owned()];
        assert_eq!(
            authorize(&headers, &tokens).map_err(|r| r.status),
            Err(StatusCode::UNAUTHORIZED)
        );
        for (value, ok) in [
            ("Bearer s3cret", true),
            ("Bearer other", true),
            // The scheme is case-insensitive (RFC 9110), the token is not.
            ("bearer s3cret", true),
            ("BEARER s3cret", true),
            ("BeArEr  s3cret ", true),
            ("Bearer S3CRET", false),
            ("Bearer s3cre", false),
            ("Bearer s3cretx", false),
            ("Bearers3cret", false),
            ("Basic s3cret", false),
            ("s3cret", false),
        ] {
            headers.insert(
                AUTHORIZATION,
                value.parse().unwrap_or_else(|e| panic!("{e}")),
            );
            assert_eq!(authorize(&headers, &tokens).is_ok(), ok, "{value}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            let name = hyper::header::HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|e| panic!("{e}"));
            map.append(name, value.parse().unwrap_or_else(|e| panic!("{e}")));
        }
        map
    }

    #[test]
    fn a_header_the_message_is_made_of_comes_once() {
        let single = [AUTHORIZATION.as_str(), IDEMPOTENCY_KEY, "x-tenant"].map(str::to_owned);
        let once = headers(&[
            ("authorization", "Bearer a"),
            ("x-other", "1"),
            ("x-other", "2"),
        ]);
        assert!(check_single(&once, &single).is_ok(), "others may repeat");
        for twice in ["authorization", "idempotency-key", "X-Tenant"] {
            let given = headers(&[(twice, "a"), (twice, "b")]);
            let refused = check_single(&given, &single).map_err(|r| r.status);
            assert_eq!(refused, Err(StatusCode::BAD_REQUEST), "{twice}");
        }
    }

    #[test]
    fn only_the_chunked_transfer_coding_is_taken() {
        for (codings, ok) in [
            (&[][..], true),
            (&["chunked"][..], true),
            (&["Chunked"][..], true),
            (&["gzip, chunked"][..], false),
            (&["gzip", "chunked"][..], false),
            (&["deflate"][..], false),
        ] {
            let pairs: Vec<(&str, &str)> =
                codings.iter().map(|c| ("transfer-encoding", *c)).collect();
            let checked = check_transfer_coding(&headers(&pairs)).map_err(|r| r.status);
            let expected = if ok {
                Ok(())
            } else {
                Err(StatusCode::NOT_IMPLEMENTED)
            };
            assert_eq!(checked, expected, "{codings:?}");
        }
    }

    #[test]
    fn a_forwarded_header_must_be_visible_ascii() {
        let config = crate::config::load_str(
            "[brokers.main]\nuri = \"amqp://localhost\"\n[endpoints.e]\nbroker = \"main\"\n\
             routing_key = \"q\"\n[filters.all]\ntype = \"match_all\"\n[[filter_table]]\n\
             filter = \"all\"\nendpoint = \"e\"\n[ingress.http]\nlisten = \"8080\"\n\
             forward_headers = [\"x-tenant\"]\n",
            "test.toml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let Some(http) = config.http.as_ref() else {
            panic!("the ingress is configured");
        };
        let request = |value: &[u8]| {
            Request::builder()
                .method(Method::POST)
                .uri("/messages/k")
                .header(
                    "x-tenant",
                    hyper::header::HeaderValue::from_bytes(value).unwrap_or_else(|e| panic!("{e}")),
                )
                .body(())
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let made = envelope(&request(b"acme corp"), "k".into(), Vec::new(), http, &[]);
        assert!(made.is_ok(), "{made:?}");
        let refused = envelope(&request(b"caf\xc3\xa9"), "k".into(), Vec::new(), http, &[]);
        assert_eq!(
            refused.map(|_| ()).map_err(|r| r.status),
            Err(StatusCode::BAD_REQUEST)
        );
    }
}
