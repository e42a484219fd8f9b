//! TLS to `amqps://` brokers.
//!
//! The PEM files a broker's configuration names were read and checked when
//! the configuration was loaded (`config::tls`), so a connection never
//! finds a bad file. [`connect`] opens a connection
//! with the broker's CA certificates (trusted in addition to the system's
//! roots) and client certificate. The broker's certificate is always
//! verified, chain and host name; there is no way to turn that off.
//! [`failure`] tells a TLS failure apart from other connect errors so the
//! log can say which broker's TLS handshake failed and why.

use crate::config::{BrokerSpec, Tls};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::{Connection, ConnectionProperties};
use rustls::{AlertDescription, CertificateError};

/// Opens a connection to node `node` of `spec`; an `amqps://` one trusts
/// the broker's CA certificates besides the system's roots and shows its
/// client certificate when the broker asks for one.
pub async fn connect(
    spec: &BrokerSpec,
    node: usize,
    properties: ConnectionProperties,
) -> lapin::Result<Connection> {
    // What `Connection::connect` uses: the current tokio runtime.
    let runtime = lapin::runtime::default_runtime()?;
    let uri = spec.secret_uri_of(node);
    Connection::connect_with_config(uri, properties, config(&spec.tls), runtime).await
}

fn config(tls: &Tls) -> OwnedTLSConfig {
    OwnedTLSConfig {
        identity: tls.client.as_ref().map(|c| OwnedIdentity::PKCS8 {
            pem: c.cert_pem.clone(),
            key: c.secret_key_pem().to_vec(),
        }),
        cert_chain: tls.ca_pem.clone(),
    }
}

/// A failed TLS handshake with a broker (or a TLS alert from it): the
/// broker, the TLS error, and for the usual causes the setting to check.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("TLS handshake with broker {broker} failed: {error}{}", hint(.error, .broker, .uri_key))]
pub struct TlsFailure {
    /// The broker's name.
    broker: String,
    /// The key of its URIs: `uri` or `uris`.
    uri_key: &'static str,
    /// What the TLS library said.
    #[source]
    error: rustls::Error,
}

/// When `error` is a failed TLS handshake (or a TLS alert from the
/// broker), that failure; `None` for any other error.
pub fn failure(error: &lapin::Error, spec: &BrokerSpec) -> Option<TlsFailure> {
    Some(TlsFailure {
        broker: spec.name.clone(),
        uri_key: spec.uri_key(),
        error: tls_error(error)?.clone(),
    })
}

/// The setting to check for the usual causes of `tls`, said after it.
fn hint(tls: &rustls::Error, broker: &str, uri_key: &str) -> String {
    match tls {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
            " (the broker's certificate is not signed by a CA in brokers.{broker}.ca_file \
             or the system's roots)"
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => {
            format!(
                " (the broker's certificate is not valid for the host in brokers.{broker}.{uri_key})"
            )
        }
        rustls::Error::AlertReceived(AlertDescription::CertificateRequired) => format!(
            " (the broker requires a client certificate: set brokers.{broker}.client_cert_file \
             and client_key_file)"
        ),
        rustls::Error::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown,
        ) => format!(
            " (the broker does not accept the client certificate in \
             brokers.{broker}.client_cert_file)"
        ),
        _ => String::new(),
    }
}

/// The rustls error somewhere in `error`'s source chain, if any.
fn tls_error(error: &lapin::Error) -> Option<&rustls::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // An io::Error carrying a rustls error does not always list it as
        // its source; its inner error is reached with `get_ref`.
        if let Some(tls) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls);
        }
        cause = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::TlsFailure;
    use rustls::{AlertDescription, CertificateError};

    fn said(error: rustls::Error) -> String {
        let failure = TlsFailure {
            broker: "main".to_owned(),
            uri_key: "uri",
            error,
        };
        crate::errors::one_line(&failure)
    }

    #[test]
    fn a_tls_failure_names_the_broker_and_the_setting_to_check() {
        assert_eq!(
            said(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer
            )),
            "TLS handshake with broker main failed: invalid peer certificate: UnknownIssuer \
             (the broker's certificate is not signed by a CA in brokers.main.ca_file or the \
             system's roots)"
        );
        assert_eq!(
            said(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName
            )),
            "TLS handshake with broker main failed: invalid peer certificate: NotValidForName \
             (the broker's certificate is not valid for the host in brokers.main.uri)"
        );
        assert_eq!(
            said(rustls::Error::AlertReceived(
                AlertDescription::CertificateRequired
            )),
            "TLS handshake with broker main failed: received fatal alert: CertificateRequired \
             (the broker requires a client certificate: set brokers.main.client_cert_file and \
             client_key_file)"
        );
        assert_eq!(
            said(rustls::Error::DecryptError),
            "TLS handshake with broker main failed: cannot decrypt peer's message"
        );
    }
}
