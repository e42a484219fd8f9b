//! `[brokers.NAME]`: each broker's node URIs and the PEM files of an
//! `amqps://` one.

use super::shared::Result;
use crate::config::raw::{RawBroker, RawConfig};
use crate::config::{
    BrokerSpec, IdentityError, InvalidKey, Tls, read_ca_file, read_client_identity,
};
use crate::uri::validate_uri;
use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

pub(super) fn compile_brokers(raw: &RawConfig) -> Result<BTreeMap<String, Arc<BrokerSpec>>> {
    if raw.brokers.is_empty() {
        return Err(InvalidKey::new(
            "brokers",
            "no broker defined; add a [brokers.NAME] with a uri",
        ));
    }
    raw.brokers
        .iter()
        .map(|(name, b)| {
            let uris = broker_uris(name, b)?;
            let tls = compile_tls(name, b, uris[0].starts_with("amqps://"))?;
            let spec = BrokerSpec::cluster(name, uris).with_tls(tls);
            Ok((name.clone(), Arc::new(spec)))
        })
        .collect()
}

/// A broker's node URIs, preferred first: its `uri`, or its `uris`, which
/// must agree on scheme, vhost and user (one broker, several nodes).
fn broker_uris(name: &str, b: &RawBroker) -> Result<Vec<String>> {
    let key = |k: &str| format!("brokers.{name}.{k}");
    let uris = match (&b.uri, &b.uris) {
        (Some(uri), None) => {
            validate_uri(uri).map_err(|why| InvalidKey::new(key("uri"), why))?;
            return Ok(vec![uri.clone()]);
        }
        (Some(_), Some(_)) => {
            return Err(InvalidKey::new(
                key("uris"),
                "give either uri (one node) or uris (a cluster's nodes), not both",
            ));
        }
        (None, None) => {
            return Err(InvalidKey::new(
                key("uri"),
                "missing; give uri (one node) or uris (a cluster's nodes, preferred first)",
            ));
        }
        (None, Some(uris)) => uris,
    };
    let Some(first) = uris.first() else {
        return Err(InvalidKey::new(
            key("uris"),
            "is empty; list the cluster's nodes, preferred first",
        ));
    };
    let identity = |uri: &str| {
        let parsed = lapin::uri::AMQPUri::from_str(uri).ok()?;
        let scheme = uri.split_once("://").map(|(s, _)| s.to_owned())?;
        Some((scheme, parsed.vhost, parsed.authority.userinfo.username))
    };
    for (i, uri) in uris.iter().enumerate() {
        let at = format!("brokers.{name}.uris[{i}]");
        validate_uri(uri).map_err(|why| InvalidKey::new(at.clone(), why))?;
        let (Some(ours), Some(theirs)) = (identity(uri), identity(first)) else {
            continue;
        };
        let differs = |what: &str, a: &str, b: &str| {
            InvalidKey::new(
                at.clone(),
                format!(
                    "{what} \"{a}\" differs from uris[0]'s \"{b}\"; the nodes of one broker share \
                     {what}, list another cluster as another broker"
                ),
            )
        };
        if ours.0 != theirs.0 {
            return Err(differs("scheme", &ours.0, &theirs.0));
        }
        if ours.1 != theirs.1 {
            return Err(differs("vhost", &ours.1, &theirs.1));
        }
        if ours.2 != theirs.2 {
            return Err(differs("user", &ours.2, &theirs.2));
        }
    }
    Ok(uris.clone())
}

/// Reads and checks the PEM files of an `amqps://` broker.
fn compile_tls(name: &str, b: &RawBroker, amqps: bool) -> Result<Tls> {
    let key = |k: &str| format!("brokers.{name}.{k}");
    let files = [
        ("ca_file", &b.ca_file),
        ("client_cert_file", &b.client_cert_file),
        ("client_key_file", &b.client_key_file),
    ];
    if !amqps {
        if let Some((k, _)) = files.iter().find(|(_, f)| f.is_some()) {
            return Err(InvalidKey::new(
                key(k),
                "applies only to an amqps:// uri; use amqps:// or remove it",
            ));
        }
        return Ok(Tls::default());
    }
    let ca_pem = match &b.ca_file {
        None => None,
        Some(path) => Some(read_ca_file(path).map_err(|why| InvalidKey::new(key("ca_file"), why))?),
    };
    let client = match (&b.client_cert_file, &b.client_key_file) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(InvalidKey::new(
                key("client_key_file"),
                "missing: client_cert_file needs its private key; set both or neither",
            ));
        }
        (None, Some(_)) => {
            return Err(InvalidKey::new(
                key("client_cert_file"),
                "missing: client_key_file needs its certificate; set both or neither",
            ));
        }
        (Some(cert), Some(private)) => {
            Some(read_client_identity(cert, private).map_err(|e| match e {
                IdentityError::Cert(why) => InvalidKey::new(key("client_cert_file"), why),
                IdentityError::Key(why) => InvalidKey::new(key("client_key_file"), why),
            })?)
        }
    };
    Ok(Tls { ca_pem, client })
}
