//! TLS to `amqps://` brokers.
//!
//! The PEM files a broker's configuration names are read and checked when
//! the configuration is loaded ([`read_ca_file`], [`read_client_identity`]),
//! so a connection never finds a bad file. [`connect`] opens a connection
//! with the broker's CA certificates (trusted in addition to the system's
//! roots) and client certificate. The broker's certificate is always
//! verified, chain and host name; there is no way to turn that off.
//! [`failure`] tells a TLS failure apart from other connect errors so the
//! log can say which broker's TLS handshake failed and why.

use crate::config::{BrokerSpec, ClientIdentity, Tls};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::{Connection, ConnectionProperties};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{AlertDescription, CertificateError, InconsistentKeys, RootCertStore};
use std::path::Path;

/// Which of a client identity's two files is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityError {
    /// The certificate file, and why.
    Cert(String),
    /// The key file, and why.
    Key(String),
}

/// Reads a PEM file of CA certificates; every certificate in it must parse.
/// The error names the path, never the contents.
pub fn read_ca_file(path: &Path) -> Result<String, String> {
    let text = read_pem_text(path)?;
    let certs = certificates(&text, path)?;
    let count = certs.len();
    let (_, ignored) = RootCertStore::empty().add_parsable_certificates(certs);
    if ignored > 0 {
        return Err(format!(
            "\"{}\": {ignored} of its {count} PEM certificate(s) cannot be parsed as X.509",
            path.display()
        ));
    }
    Ok(text)
}

/// Reads a client certificate chain and its private key (PEM) and checks
/// that the key is the certificate's.
pub fn read_client_identity(
    cert_path: &Path,
    key_path: &Path,
) -> Result<ClientIdentity, IdentityError> {
    let cert_text = read_pem_text(cert_path).map_err(IdentityError::Cert)?;
    let certs = certificates(&cert_text, cert_path).map_err(IdentityError::Cert)?;
    let key_text = read_pem_text(key_path).map_err(IdentityError::Key)?;
    let key = PrivateKeyDer::from_pem_slice(key_text.as_bytes()).map_err(|e| {
        IdentityError::Key(match e {
            pem::Error::NoItemsFound => format!(
                "\"{}\" holds no PEM private key (-----BEGIN PRIVATE KEY-----)",
                key_path.display()
            ),
            other => format!("\"{}\" is not valid PEM: {other}", key_path.display()),
        })
    })?;
    let provider = rustls::crypto::ring::default_provider();
    if let Err(e) = rustls::sign::CertifiedKey::from_der(certs, key, &provider) {
        return Err(match e {
            rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => {
                IdentityError::Key(format!(
                    "\"{}\" is not the private key of the certificate in \"{}\"",
                    key_path.display(),
                    cert_path.display()
                ))
            }
            other => IdentityError::Key(format!(
                "\"{}\" cannot be used with the certificate in \"{}\": {other}",
                key_path.display(),
                cert_path.display()
            )),
        });
    }
    Ok(ClientIdentity::new(
        cert_text.into_bytes(),
        key_text.into_bytes(),
    ))
}

fn read_pem_text(path: &Path) -> Result<String, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("cannot read \"{}\": {e}", path.display()))?;
    String::from_utf8(bytes)
        .map_err(|_| format!("\"{}\" is not a PEM file (not text)", path.display()))
}

fn certificates(text: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("\"{}\" is not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "\"{}\" holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

/// Opens a connection to `spec`; an `amqps://` one trusts the broker's CA
/// certificates besides the system's roots and shows its client
/// certificate when the broker asks for one.
pub async fn connect(
    spec: &BrokerSpec,
    properties: ConnectionProperties,
) -> lapin::Result<Connection> {
    // What `Connection::connect` uses: the current tokio runtime.
    let runtime = lapin::runtime::default_runtime()?;
    Connection::connect_with_config(spec.secret_uri(), properties, config(&spec.tls), runtime).await
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

/// When `error` is a failed TLS handshake (or a TLS alert from the broker),
/// one line that says so, names the broker and, for the usual causes, the
/// setting to check; `None` for any other error.
pub fn failure(error: &lapin::Error, broker: &str) -> Option<String> {
    let tls = tls_error(error)?;
    let hint = match tls {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
            " (the broker's certificate is not signed by a CA in brokers.{broker}.ca_file \
             or the system's roots)"
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => {
            format!(" (the broker's certificate is not valid for the host in brokers.{broker}.uri)")
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
    };
    Some(format!(
        "TLS handshake with broker {broker} failed: {tls}{hint}"
    ))
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
