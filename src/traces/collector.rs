//! The collector's end of span export: `{endpoint}/v1/traces` parsed once
//! ([`Target`]), and one HTTP/1.1 connection to it ([`Client`], hyper's
//! client connection; rustls with the system's root certificates for
//! `https://`), kept open between requests and made again after any
//! failure. Every POST has a deadline; nothing is retried but a request
//! that found a kept-alive connection already closed by the collector,
//! once, on a new one.

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message as _;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

/// The OTLP/HTTP path of traces, under the endpoint.
pub const TRACES_PATH: &str = "/v1/traces";
/// OTLP/HTTP's binary encoding.
pub const PROTOBUF: &str = "application/x-protobuf";
/// The most of a collector's answer read (an OTLP answer is a few bytes).
const MAX_ANSWER: usize = 64 * 1024;

/// Why spans could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The endpoint is not an `http://` or `https://` URL with a host.
    #[error("\"{0}\" is not an http:// or https:// URL of a collector")]
    Endpoint(String),
    /// No TLS client could be set up for an `https://` endpoint.
    #[error("no TLS client for the collector: {0}")]
    TlsSetup(String),
    /// The TCP connection failed.
    #[error("cannot connect to the collector at {authority}: {source}")]
    Connect {
        /// `host:port`.
        authority: String,
        /// The socket's error.
        source: std::io::Error,
    },
    /// The TLS handshake failed.
    #[error("TLS with the collector at {authority} failed: {source}")]
    Tls {
        /// `host:port`.
        authority: String,
        /// rustls's error, as tokio-rustls reports it.
        source: std::io::Error,
    },
    /// HTTP failed (connection closed, malformed answer, ...).
    #[error("HTTP with the collector failed: {0}")]
    Http(#[from] hyper::Error),
    /// The request could not be built (never expected: its parts are checked).
    #[error("the request could not be built: {0}")]
    Request(#[from] hyper::http::Error),
    /// The collector answered with a status other than 2xx.
    #[error("the collector answered {0}")]
    Status(StatusCode),
    /// The collector's answer was longer than an OTLP answer can be.
    #[error("the collector's answer is too long")]
    Answer,
    /// No answer before the deadline.
    #[error("no answer from the collector in time")]
    TimedOut,
}

/// Where spans are POSTed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `https://`.
    pub tls: bool,
    /// The host to connect to (an IPv6 address without its brackets).
    pub host: String,
    /// The port (80 or 443 unless given).
    pub port: u16,
    /// `host[:port]` as written, for the `Host` header and messages.
    pub authority: String,
    /// The endpoint's own path, then [`TRACES_PATH`].
    pub path: String,
}

impl Target {
    /// The target of `endpoint` (`http://host:4318`, `https://host/otlp`).
    pub fn parse(endpoint: &str) -> Result<Self, ExportError> {
        let bad = || ExportError::Endpoint(endpoint.to_owned());
        let (tls, rest) = match endpoint.split_once("://") {
            Some(("http", rest)) => (false, rest),
            Some(("https", rest)) => (true, rest),
            _ => return Err(bad()),
        };
        let (authority, prefix) = match rest.find(['/', '?', '#']) {
            Some(at) if rest[at..].starts_with('/') => (&rest[..at], &rest[at..]),
            Some(_) => return Err(bad()),
            None => (rest, ""),
        };
        if authority.is_empty()
            || authority.contains('@')
            || authority.contains(char::is_whitespace)
            || prefix.contains(['?', '#'])
            || prefix.contains(char::is_whitespace)
        {
            return Err(bad());
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(bad)?;
            let port = match after {
                "" => default_port,
                _ => after
                    .strip_prefix(':')
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(bad)?,
            };
            (host, port)
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, port.parse().map_err(|_| bad())?),
                None => (authority, default_port),
            }
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Self {
            tls,
            host: host.to_owned(),
            port,
            authority: authority.to_owned(),
            path: format!("{}{TRACES_PATH}", prefix.trim_end_matches('/')),
        })
    }
}

/// One kept-alive connection to the collector.
pub struct Client {
    target: Target,
    tls: Option<TlsConnector>,
    /// The open connection, and the guard whose drop stops its driver.
    open: Option<(SendRequest<Full<Bytes>>, DropGuard)>,
    background: TaskTracker,
}

/// What the collector accepted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    /// Spans it said it rejected (OTLP partial success).
    pub rejected: u64,
    /// Why, as it said.
    pub message: String,
}

impl Client {
    /// A client of `target` whose connections are driven on `background`;
    /// for `https://`, with the system's root certificates.
    pub fn new(target: Target, background: TaskTracker) -> Result<Self, ExportError> {
        let tls = if target.tls {
            Some(tls_connector()?)
        } else {
            None
        };
        Ok(Self {
            target,
            tls,
            open: None,
            background,
        })
    }

    /// POSTs `body` (an encoded `ExportTraceServiceRequest`), answered by
    /// `deadline`.
    pub async fn post(&mut self, body: Bytes, deadline: Instant) -> Result<Accepted, ExportError> {
        let result = match timeout_at(deadline, self.post_once(body.clone())).await {
            // A kept-alive connection the collector had closed: once more.
            Ok(Err(ExportError::Http(e))) if e.is_canceled() || e.is_incomplete_message() => {
                self.open = None;
                timeout_at(deadline, self.post_once(body)).await
            }
            other => other,
        };
        let result = result.unwrap_or(Err(ExportError::TimedOut));
        if result.is_err() {
            // Whatever state the connection is in, it is not trusted again.
            self.open = None;
        }
        result
    }

    /// Closes the connection (a POST was given up on while it waited).
    pub fn abandon(&mut self) {
        self.open = None;
    }

    async fn post_once(&mut self, body: Bytes) -> Result<Accepted, ExportError> {
        let sender = match &mut self.open {
            Some((sender, _)) if !sender.is_closed() => sender,
            _ => {
                let opened = self.connect().await?;
                &mut self.open.insert(opened).0
            }
        };
        sender.ready().await?;
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.target.path.as_str())
            .header(header::HOST, self.target.authority.as_str())
            .header(header::CONTENT_TYPE, PROTOBUF)
            .body(Full::new(body))?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let answer = Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(e) => ExportError::Http(*e),
                Err(_) => ExportError::Answer,
            })?
            .to_bytes();
        if !status.is_success() {
            return Err(ExportError::Status(status));
        }
        // An empty or unreadable answer to a 2xx is a full success.
        let partial = ExportTraceServiceResponse::decode(answer)
            .ok()
            .and_then(|r| r.partial_success)
            .unwrap_or_default();
        Ok(Accepted {
            rejected: u64::try_from(partial.rejected_spans).unwrap_or(0),
            message: partial.error_message,
        })
    }

    async fn connect(&self) -> Result<(SendRequest<Full<Bytes>>, DropGuard), ExportError> {
        let target = &self.target;
        let stream = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|source| ExportError::Connect {
                authority: target.authority.clone(),
                source,
            })?;
        let _ = stream.set_nodelay(true);
        let stop = CancellationToken::new();
        let sender = match &self.tls {
            None => self.handshake(TokioIo::new(stream), &stop).await?,
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                    .map_err(|e| ExportError::TlsSetup(e.to_string()))?;
                let stream =
                    tls.connect(name, stream)
                        .await
                        .map_err(|source| ExportError::Tls {
                            authority: target.authority.clone(),
                            source,
                        })?;
                self.handshake(TokioIo::new(stream), &stop).await?
            }
        };
        Ok((sender, stop.drop_guard()))
    }

    /// HTTP/1.1 over `io`, its connection driven on the background tracker
    /// until it ends or `stop` is cancelled.
    async fn handshake<T>(
        &self,
        io: T,
        stop: &CancellationToken,
    ) -> Result<SendRequest<Full<Bytes>>, ExportError>
    where
        T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let (sender, connection) = hyper::client::conn::http1::handshake(io).await?;
        let stop = stop.clone();
        self.background.spawn(async move {
            tokio::select! {
                _ = connection => {}
                () = stop.cancelled() => {}
            }
        });
        Ok(sender)
    }
}

/// A TLS client with the system's root certificates (ring, as lapin's).
fn tls_connector() -> Result<TlsConnector, ExportError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(ExportError::TlsSetup(
            "no root certificate found on this system".to_owned(),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ExportError::TlsSetup(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_read_as_urls() {
        let t = Target::parse("http://127.0.0.1:4318").unwrap();
        assert_eq!(
            (t.tls, t.host.as_str(), t.port, t.path.as_str()),
            (false, "127.0.0.1", 4318, "/v1/traces")
        );
        assert_eq!(t.authority, "127.0.0.1:4318");
        let t = Target::parse("https://otel.example/collector/").unwrap();
        assert_eq!(
            (t.tls, t.host.as_str(), t.port, t.path.as_str()),
            (true, "otel.example", 443, "/collector/v1/traces")
        );
        let t = Target::parse("http://[::1]:4318/").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 4318));
        assert_eq!(t.authority, "[::1]:4318");
        assert_eq!(Target::parse("http://[::1]").unwrap().port, 80);
        for bad in [
            "",
            "127.0.0.1:4318",
            "ftp://host",
            "http://",
            "http://:4318",
            "http://host:port",
            "http://host:99999",
            "http://user:pw@host",
            "http://host?x=1",
            "http://host/a?x=1",
            "http://[::1",
            "http://[::1]x",
            "http://ho st",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad:?}");
        }
    }
}
