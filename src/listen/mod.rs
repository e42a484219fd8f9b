//! The forwarder's own listeners (the admin endpoint, the HTTP ingress):
//! accepting within a bound of connections ([`gate`]), and why one cannot
//! listen. A leaf, so the pipeline's run error can name it without
//! importing the ingress that uses the pipeline.

pub mod gate;

use gate::{Admitted, Gate, Watched};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The next connection, watched for its first byte, with its place in
/// `gate`; `None` once `stop` is cancelled. A connection is accepted
/// before its slot is found, so that a full gate makes room only for a
/// client that is really there ([`Gate::admit`]); `shed` is told each
/// connection closed for room. A failed accept (out of descriptors, most
/// likely) is told to `failed`, then the next is tried after a pause
/// rather than in a spin.
pub async fn accept_within(
    listener: &TcpListener,
    gate: &Gate,
    stop: &CancellationToken,
    failed: impl Fn(&std::io::Error),
    shed: impl Fn(),
) -> Option<(Watched<TcpStream>, Admitted)> {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return None,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                // Answers are small and written whole: no delay for more.
                let _ = stream.set_nodelay(true);
                let (admitted, closed) = gate.admit(stop).await?;
                if closed {
                    shed();
                }
                return Some((admitted.watch(stream), admitted));
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
