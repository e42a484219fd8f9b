//! The forwarder's own listeners (the admin endpoint, the HTTP ingress):
//! accepting within a bound of connections, and why one cannot listen. A
//! leaf, so the pipeline's run error can name it without importing the
//! ingress that uses the pipeline.

use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// The next connection, with the slot of `slots` it holds until dropped;
/// `None` once `stop` is cancelled. Waits for a free slot before
/// accepting, so connections past the bound wait in the listen backlog.
/// A failed accept (out of descriptors, most likely) is told to
/// `failed`, then the next is tried after a pause rather than in a spin.
pub async fn accept_within(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    stop: &CancellationToken,
    failed: impl Fn(&std::io::Error),
) -> Option<(TcpStream, OwnedSemaphorePermit)> {
    loop {
        let slot = tokio::select! {
            () = stop.cancelled() => return None,
            slot = slots.clone().acquire_owned() => slot.ok()?,
        };
        let accepted = tokio::select! {
            () = stop.cancelled() => return None,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => return Some((stream, slot)),
            Err(e) => {
                failed(&e);
                drop(slot);
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
