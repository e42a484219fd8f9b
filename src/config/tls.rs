//! The PEM files of an `amqps://` broker (`ca_file`, `client_cert_file`,
//! `client_key_file`), read and checked when the configuration is loaded,
//! so a connection never finds a bad file. Errors name the path, never the
//! contents.

use super::ClientIdentity;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{InconsistentKeys, RootCertStore};
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
