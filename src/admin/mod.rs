//! The admin HTTP endpoint (`[admin] listen`), plain HTTP/1.1:
//!
//! - `GET /healthz`: 200 while the process runs.
//! - `GET /readyz`: 200 while the forwarder serves (consuming, and every
//!   branch has an endpoint up, see [`crate::Readiness`]); otherwise 503 with the
//!   reason in the body.
//! - `GET /metrics`: every metric in the Prometheus text format.
//! - `/control/...` and `/registry/...`: commands to the group, with a
//!   bearer token of `admin.tokens` (see [`control`]).
//!
//! Anything else is 404 (405 for another method on these paths). Anyone
//! who can reach the port can hold its resources only so far: at most
//! [`MAX_CONNECTIONS`] connections are served at once, each serves one
//! request, whose headers must arrive within 5 s and fit in 16 KiB. A
//! connection takes one of them only once its client has sent a byte;
//! until then it waits in a lobby of its own, where under a flood of idle
//! connections the one waiting longest makes room for the newest
//! ([`crate::listen::gate`]), so a probe answers whatever the flood. The
//! server
//! stops accepting when its stop token is cancelled, which the forwarder's
//! run does once it has stopped, and gives open connections a moment to
//! finish their request; how many were still open past it is logged.

mod control;

use crate::control::Steer;
use crate::listen::gate::{Gate, Served};
use crate::telemetry::{Listener, METRICS_CONTENT_TYPE, Telemetry};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A slow client may take this long to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once, each once its client has sent a byte (each
/// serves one request, which takes microseconds). Connections that have
/// sent nothing wait apart, in the gate's lobby.
pub const MAX_CONNECTIONS: usize = 32;
/// The most a request may take in memory, headers included.
const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// How long open connections get to finish once the server stops.
const DRAIN: Duration = Duration::from_secs(1);

/// Whether the forwarder serves: `Ok`, or why not (its `Display` is the
/// line `/readyz` answers).
pub type Ready<E> = Arc<dyn Fn() -> Result<(), E> + Send + Sync>;

/// Why the admin endpoint cannot listen.
#[derive(Debug, thiserror::Error)]
#[error("admin.listen {addr}: cannot listen: {source}{}", hint(source))]
pub struct AdminError {
    /// The address asked for.
    addr: String,
    /// What the system said.
    source: std::io::Error,
}

/// What to do about an address that cannot be listened on.
fn hint(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => {
            "; another process listens there (a second switchyard on this host?): give this \
             instance its own port with admin.listen or SWITCHYARD__ADMIN__LISTEN (e.g. \
             SWITCHYARD__ADMIN__LISTEN=127.0.0.1:9091), or leave admin.listen out to disable it"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            "; no interface of this host has that address: use 127.0.0.1, 0.0.0.0 or one of \
             its own addresses"
        }
        std::io::ErrorKind::PermissionDenied => {
            "; ports below 1024 need privileges: use a port of 1024 or above"
        }
        _ => "",
    }
}

/// A bound admin listener, not serving yet.
#[derive(Debug)]
pub struct Admin {
    listener: TcpListener,
    addr: SocketAddr,
}

impl Admin {
    /// Binds `addr`.
    pub async fn bind(addr: SocketAddr) -> Result<Self, AdminError> {
        let error = |source| AdminError {
            addr: addr.to_string(),
            source,
        };
        let listener = TcpListener::bind(addr).await.map_err(error)?;
        let addr = listener.local_addr().map_err(error)?;
        Ok(Self { listener, addr })
    }

    /// Takes a listener bound by the caller (tests bind port 0 and read the
    /// port back before starting the forwarder).
    pub fn from_std(listener: std::net::TcpListener) -> Result<Self, AdminError> {
        let error = |source| AdminError {
            addr: "(given listener)".to_owned(),
            source,
        };
        listener.set_nonblocking(true).map_err(error)?;
        let addr = listener.local_addr().map_err(error)?;
        let listener = TcpListener::from_std(listener).map_err(error)?;
        Ok(Self { listener, addr })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `stop` is cancelled, then lets open connections finish
    /// for a moment.
    pub async fn serve<E: Display + 'static>(
        self,
        telemetry: Telemetry,
        readiness: Ready<E>,
        steering: Option<Arc<dyn Steer>>,
        stop: CancellationToken,
    ) {
        crate::listen::deepen_backlog(&self.listener);
        let connections = TaskTracker::new();
        let counted = telemetry.clone();
        let gate = Gate::new(MAX_CONNECTIONS, move || {
            counted.connection_shed(Listener::Admin);
        });
        let failed = |e: &std::io::Error| telemetry.admin_connection_failed(e);
        while let Some(arrived) =
            crate::listen::accept_within(&self.listener, &gate, &stop, failed).await
        {
            let (telemetry, readiness, stop) = (telemetry.clone(), readiness.clone(), stop.clone());
            let steering = steering.clone();
            connections.spawn(async move {
                let Some(Served { stream, admitted }) =
                    arrived.first_byte(HEADER_TIMEOUT, &stop).await
                else {
                    return; // sent nothing in time, or closed for room
                };
                let busy = admitted.busy();
                let service = service_fn(|request: Request<Incoming>| {
                    busy.hold();
                    let (steering, counting) = (steering.clone(), telemetry.clone());
                    let response = match control::owns(request.uri().path()) {
                        false => Ok(respond(&request, &telemetry, &readiness)),
                        true => Err(request),
                    };
                    async move {
                        let response = match response {
                            Ok(response) => response,
                            Err(request) => {
                                control::respond(request, steering.as_deref(), &counting).await
                            }
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                let connection = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    // One request per connection: an idle keep-alive
                    // connection would hold its slot with no bound.
                    .keep_alive(false)
                    .max_buf_size(MAX_REQUEST_BYTES)
                    .serve_connection(TokioIo::new(stream), service);
                let mut connection = std::pin::pin!(connection);
                let shed = admitted.shed();
                let result = tokio::select! {
                    result = connection.as_mut() => result,
                    // Closed for room: it had sent no request to answer.
                    () = shed.cancelled() => Ok(()),
                    () = stop.cancelled() => {
                        connection.as_mut().graceful_shutdown();
                        tokio::time::timeout(DRAIN, connection).await.unwrap_or(Ok(()))
                    }
                };
                if let Err(e) = result {
                    telemetry.admin_connection_failed(&e);
                }
            });
        }
        connections.close();
        if tokio::time::timeout(DRAIN * 2, connections.wait())
            .await
            .is_err()
        {
            telemetry.connections_left(Listener::Admin, connections.len(), DRAIN * 2);
        }
    }
}

fn respond<E: Display>(
    request: &Request<Incoming>,
    telemetry: &Telemetry,
    readiness: &Ready<E>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    if !matches!(path, "/healthz" | "/readyz" | "/metrics") {
        return text(
            StatusCode::NOT_FOUND,
            "not found: try /healthz, /readyz, /metrics or /control/status\n".to_owned(),
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".to_owned());
    }
    match path {
        "/healthz" => text(StatusCode::OK, "ok\n".to_owned()),
        "/readyz" => match readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n".to_owned()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        _ => {
            let mut response = Response::new(Full::new(Bytes::from(telemetry.render())));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE));
            response
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
