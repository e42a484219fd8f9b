//! The forwarder's own listeners (the admin endpoint, the HTTP ingress):
//! accepting within a bound of connections ([`gate`]), bearer tokens
//! ([`bearer`]), and why one cannot listen. A leaf, so the pipeline's run error can name it without
//! importing the ingress that uses the pipeline.

pub mod bearer;
pub mod gate;

use gate::{Arrived, Gate};
use socket2::SockRef;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Connections the system may hold for a listener before it accepts them
/// (the kernel caps it at `net.core.somaxconn`). A burst of clients past
/// the backlog has its handshakes dropped, a real client's among them,
/// which then waits a second for its retry: the backlog should outlast a
/// burst while the accept loop, which never waits for a slot, drains it.
pub const BACKLOG: i32 = 4096;

/// Gives `listener` the [`BACKLOG`] (listening again on a listening socket
/// only changes its backlog); a system that refuses keeps the one it had.
pub fn deepen_backlog(listener: &TcpListener) {
    let _ = SockRef::from(listener).listen(BACKLOG);
}

/// The next connection, in `gate`'s lobby; `None` once `stop` is
/// cancelled. The caller waits for its first byte
/// ([`Arrived::first_byte`]) before serving it. A failed accept (out of
/// descriptors, most likely) is told to `failed`, then the next is tried
/// after a pause rather than in a spin.
pub async fn accept_within(
    listener: &TcpListener,
    gate: &Gate,
    stop: &CancellationToken,
    failed: impl Fn(&std::io::Error),
) -> Option<Arrived> {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return None,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                // Answers are small and written whole: no delay for more.
                let _ = stream.set_nodelay(true);
                return gate.arrive(stream, stop).await;
            }
            Err(e) => {
                failed(&e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Why the HTTP ingress cannot listen.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The address cannot be bound.
    #[error("ingress.http.listen {addr}: cannot listen: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The certificate and key do not make a TLS configuration.
    #[error("ingress.http.cert_file: cannot serve TLS with it: {0}")]
    Tls(String),
}
