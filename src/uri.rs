//! Broker URIs as the configuration gives them: checked, compared,
//! shown without their password. Parsing uses the client library's own URI
//! parser, so what passes here is what it connects to.

use std::str::FromStr;

/// Checks that `uri` is an `amqp://` or `amqps://` URI lapin can use. The
/// error never repeats the URI, so it cannot leak credentials.
pub fn validate_uri(uri: &str) -> Result<(), String> {
    if !(uri.starts_with("amqp://") || uri.starts_with("amqps://")) {
        return Err("must start with amqp:// or amqps://".to_owned());
    }
    lapin::uri::AMQPUri::from_str(uri)
        .map(|_| ())
        .map_err(|e| format!("not a valid AMQP URI: {}", redact_in(&e.to_string(), uri)))
}

/// Whether two broker URIs reach the same virtual host: same host (the
/// loopback names `localhost`, `127.0.0.1` and `::1` count as one), same
/// port (defaults applied) and same vhost. URIs that do not parse never match.
pub fn same_vhost(a: &str, b: &str) -> bool {
    match (vhost_address(a), vhost_address(b)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

fn vhost_address(uri: &str) -> Option<(String, u16, String)> {
    let parsed = lapin::uri::AMQPUri::from_str(uri).ok()?;
    let rest = uri.split_once("://")?.1;
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or(v6, |(h, _)| h),
        None => host_port.split_once(':').map_or(host_port, |(h, _)| h),
    }
    .to_ascii_lowercase();
    let host = match host.as_str() {
        "127.0.0.1" | "::1" | "" => "localhost".to_owned(),
        _ => host,
    };
    Some((host, parsed.authority.port, parsed.vhost))
}

/// The node `uri` names, as `host:port` with the scheme's default port
/// when it names none; `?` for a URI that does not parse.
pub fn node_of(uri: &str) -> String {
    match lapin::uri::AMQPUri::from_str(uri) {
        Ok(parsed) => format!("{}:{}", parsed.authority.host, parsed.authority.port),
        Err(_) => "?".to_owned(),
    }
}

/// `uri` with its password replaced by `***`.
pub fn redact_uri(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => uri.to_owned(),
    }
}

fn redact_in(text: &str, uri: &str) -> String {
    text.replace(uri, &redact_uri(uri))
}

#[cfg(test)]
mod tests {
    use crate::uri::{node_of, redact_uri, same_vhost, validate_uri};

    #[test]
    fn redaction_hides_the_password_only() {
        let cases = [
            (
                "amqp://guest:guest@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            (
                "amqps://u:p%40ss@host/vh?heartbeat=10",
                "amqps://u:***@host/vh?heartbeat=10",
            ),
            ("amqp://127.0.0.1:5672", "amqp://127.0.0.1:5672"),
            ("amqp://user@host/", "amqp://user:***@host/"),
        ];
        for (uri, expected) in cases {
            assert_eq!(redact_uri(uri), expected);
        }
    }

    #[test]
    fn the_node_is_the_host_and_port_with_the_default_port_filled_in() {
        let cases = [
            ("amqp://guest:guest@127.0.0.1:5672/%2f", "127.0.0.1:5672"),
            ("amqp://u:p@rabbit-2.internal/vh", "rabbit-2.internal:5672"),
            ("amqps://u:p@rabbit/vh", "rabbit:5671"),
            ("amqp://u:p@rabbit:5673/", "rabbit:5673"),
            ("not a uri", "?"),
        ];
        for (uri, node) in cases {
            assert_eq!(node_of(uri), node, "{uri}");
        }
    }

    #[test]
    fn uri_validation_rejects_other_schemes_without_echoing_secrets() {
        assert!(validate_uri("amqp://guest:guest@127.0.0.1:5672/%2f").is_ok());
        let err = validate_uri("http://guest:secret@host/").unwrap_err();
        assert!(!err.contains("secret"), "{err}");
        let err = validate_uri("amqp://guest:secret@host:notaport/").unwrap_err();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn same_vhost_compares_host_port_and_vhost() {
        let main = "amqp://guest:guest@127.0.0.1:5672/%2f";
        let same = [
            main,
            "amqp://other:pw@localhost/%2F",
            "amqp://guest:guest@[::1]:5672/%2f?heartbeat=5",
            "amqp://LOCALHOST:5672",
        ];
        for uri in same {
            assert!(same_vhost(main, uri), "{uri}");
        }
        let different = [
            "amqp://guest:guest@127.0.0.1:5673/%2f",
            "amqp://guest:guest@127.0.0.1:5672/other",
            "amqp://guest:guest@127.0.0.1:5672/",
            "amqp://guest:guest@rabbit.example:5672/%2f",
            "amqps://guest:guest@127.0.0.1/%2f",
            "not a uri",
        ];
        for uri in different {
            assert!(!same_vhost(main, uri), "{uri}");
        }
    }
}
