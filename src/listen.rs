//! Why a listener of the forwarder's own (the HTTP ingress) cannot listen.
//! A leaf, so the pipeline's run error can name it without importing the
//! ingress that uses the pipeline.

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
