//! The ingress listener: HTTP/1.1 with keep-alive, over TLS when
//! `cert_file` and `key_file` are set. At most `max_connections` are served
//! at once, each once its client has sent a first byte (connections that
//! have not wait apart, in a lobby where the longest waiting makes room
//! for the newest); past it a client that has sent a byte takes the place
//! of a connection between requests, and waits only while every one is
//! handling a request ([`crate::listen::gate`]). A client must send its
//! first byte, and then each request's headers, within
//! `header_timeout_ms` (an idle keep-alive connection is closed after as
//! long) and they must fit in [`MAX_HEADER_BYTES`]; a refused token closes
//! the connection after its 401. It stops accepting when its stop token is
//! cancelled and gives open connections a moment to finish; how many were
//! still open past it is logged.

use super::Ingress;
use super::answer::Answer;
use crate::config::{ClientIdentity, HttpIngress};
pub use crate::listen::ListenError;
use crate::listen::gate::{BodyWatch, BusyMarker, Gate, Served};
use crate::telemetry::{self, Telemetry};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONNECTION, CONTENT_TYPE, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The most a request's head (request line and headers) may take.
pub use super::request::MAX_HEADER_BYTES;
/// How long open connections get to finish once the listener stops.
const DRAIN: Duration = Duration::from_secs(2);

/// A bound listener, not serving yet.
pub struct Listener {
    listener: TcpListener,
    addr: SocketAddr,
    tls: Option<TlsAcceptor>,
}

impl Listener {
    /// Binds `config.listen` (or takes `given`, bound by the caller) and
    /// prepares TLS.
    pub async fn bind(
        config: &HttpIngress,
        given: Option<std::net::TcpListener>,
    ) -> Result<Self, ListenError> {
        let error = |addr: String| {
            move |source| ListenError::Bind {
                addr: addr.clone(),
                source,
            }
        };
        let listener = match given {
            Some(listener) => {
                let e = error("(given listener)".to_owned());
                listener.set_nonblocking(true).map_err(&e)?;
                TcpListener::from_std(listener).map_err(e)?
            }
            None => TcpListener::bind(config.listen)
                .await
                .map_err(error(config.listen.to_string()))?,
        };
        let addr = listener
            .local_addr()
            .map_err(error(config.listen.to_string()))?;
        let tls = config.tls.as_ref().map(acceptor).transpose()?;
        Ok(Self {
            listener,
            addr,
            tls,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether it speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Serves `ingress` until `stop` is cancelled.
    pub async fn serve(self, ingress: Arc<Ingress>, stop: CancellationToken) {
        let telemetry = ingress.telemetry.clone();
        crate::listen::deepen_backlog(&self.listener);
        let config = &ingress.config;
        let connections = TaskTracker::new();
        let counted = telemetry.clone();
        let gate = Gate::new(config.max_connections, move || {
            counted.connection_shed(telemetry::Listener::Ingress);
        });
        let failed = |e: &std::io::Error| telemetry.http_accept_failed(e);
        while let Some(arrived) =
            crate::listen::accept_within(&self.listener, &gate, &stop, failed).await
        {
            let (ingress, stop, tls) = (ingress.clone(), stop.clone(), self.tls.clone());
            connections.spawn(async move {
                let header_timeout = ingress.config.header_timeout;
                let Some(Served { stream, admitted }) =
                    arrived.first_byte(header_timeout, &stop).await
                else {
                    return; // sent nothing in time, or closed for room
                };
                let closed = admitted.shed();
                let busy = (admitted.busy(), admitted.body_watch());
                let serve = async {
                    match tls {
                        None => serve_connection(stream, ingress, busy, stop).await,
                        Some(tls) => {
                            // The handshake is bounded like the headers it precedes.
                            match tokio::time::timeout(header_timeout, tls.accept(stream)).await {
                                Ok(Ok(stream)) => {
                                    serve_connection(stream, ingress, busy, stop).await;
                                }
                                Ok(Err(e)) => ingress.telemetry.http_connection_failed(&e),
                                Err(_) => ingress
                                    .telemetry
                                    .http_connection_failed(&"TLS handshake timed out"),
                            }
                        }
                    }
                };
                // Closed for room: no request of it was being handled.
                tokio::select! {
                    () = serve => {}
                    () = closed.cancelled() => {}
                }
            });
        }
        connections.close();
        if tokio::time::timeout(DRAIN * 2, connections.wait())
            .await
            .is_err()
        {
            telemetry.connections_left(telemetry::Listener::Ingress, connections.len(), DRAIN * 2);
        }
    }
}

/// How long a connection whose body was cut has to write its 408.
const CUT_DRAIN: Duration = Duration::from_millis(200);

/// Serves one connection's requests until it closes or `stop`, each
/// marked busy while it is handled, its body watched by the gate.
async fn serve_connection<S>(
    stream: S,
    ingress: Arc<Ingress>,
    (busy, body): (BusyMarker, BodyWatch),
    stop: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let telemetry: Telemetry = ingress.telemetry.clone();
    let header_timeout = ingress.config.header_timeout;
    let cut = body.cut();
    let service = service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        let ingress = ingress.clone();
        request.extensions_mut().insert(body.clone());
        let busy = busy.enter();
        async move {
            let answer = ingress.handle(request).await;
            drop(busy);
            Ok::<_, Infallible>(response(answer))
        }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(MAX_HEADER_BYTES)
        .max_header_size(MAX_HEADER_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::time::timeout(DRAIN, connection).await.unwrap_or(Ok(()))
        }
        // Its body was cut for a waiting client: the 408 is written, and
        // the connection closed without reading the rest of the body.
        () = cut.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::time::timeout(CUT_DRAIN, connection).await.unwrap_or(Ok(()))
        }
    };
    if let Err(e) = result {
        match refused_by_hyper(&e) {
            Some((code, reason)) => telemetry.http_refused(code, "-", reason),
            None => telemetry.http_connection_failed(&e),
        }
    }
}

/// The answer hyper itself sent before closing on `error`, if any: a head
/// too large (431; a URI too long is counted there too) or malformed (400).
fn refused_by_hyper(error: &hyper::Error) -> Option<(u16, &'static str)> {
    if error.is_parse_too_large() {
        Some((431, "the request head is over the limit"))
    } else if error.is_parse() {
        Some((400, "the request head is not HTTP/1.1"))
    } else {
        None
    }
}

/// An answer as an HTTP response.
fn response(answer: Answer) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(answer.body));
    *response.status_mut() = answer.status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(seconds) = answer.retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    if answer.status == StatusCode::UNAUTHORIZED {
        headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        // A client without the token keeps no connection open.
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    if answer.status == StatusCode::REQUEST_TIMEOUT {
        // Its body was not read to the end: the connection cannot carry
        // another request, and its slot goes to the next client.
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A TLS acceptor for `identity` (HTTP/1.1 only).
fn acceptor(identity: &ClientIdentity) -> Result<TlsAcceptor, ListenError> {
    let tls = |e: &dyn std::fmt::Display| ListenError::Tls(e.to_string());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&identity.cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| tls(&e))?;
    let key = PrivateKeyDer::from_pem_slice(identity.secret_key_pem()).map_err(|e| tls(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls(&e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
