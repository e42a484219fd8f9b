//! TLS to the broker: `amqps://` with a CA file, a client certificate when
//! the broker requires one, and verification that cannot be turned off. A
//! private node gets a TLS listener with certificates the test generates;
//! the forwarder forwards over it, and a broker certificate from an unknown
//! CA, or for another host, is refused with a log line that says TLS and
//! names the broker. `check` refuses a missing CA file.

use crate::support;

use lapin::BasicProperties;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::PathBuf;
use std::process::Command;
use support::harness::{InProcess, Process, seed_toml, top_toml_at};
use support::node::PrivateNode;
use support::{DEFAULT_TIMEOUT, TestBroker, unique_prefix, wait_until};

const MESSAGES: u32 = 200;
/// The client certificate's common name, as the broker reports it.
const CLIENT_CN: &str = "switchyard-tls-test-client";

/// Certificates for one test, in a directory the `rabbitmq` user can read:
/// `ca.pem`; `server.pem`/`server.key` for `localhost` and `127.0.0.1`
/// signed by it; `client.pem`/`client.key` signed by it; and `other-ca.pem`,
/// a CA that signed nothing here.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn generate(prefix: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("{prefix}-pki"));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca_cert, issuer) = new_ca("switchyard test CA");
        let (other_ca, _) = new_ca("another CA");

        let mut server =
            CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        server
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
        let server_key = KeyPair::generate().unwrap();
        let server = server.signed_by(&server_key, &issuer).unwrap();

        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(DnType::CommonName, CLIENT_CN);
        client
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ClientAuth);
        let client_key = KeyPair::generate().unwrap();
        let client = client.signed_by(&client_key, &issuer).unwrap();

        for (name, pem) in [
            ("ca.pem", ca_cert.pem()),
            ("other-ca.pem", other_ca.pem()),
            ("server.pem", server.pem()),
            ("server.key", server_key.serialize_pem()),
            ("client.pem", client.pem()),
            ("client.key", client_key.serialize_pem()),
        ] {
            std::fs::write(dir.join(name), pem).unwrap();
        }
        // The node runs as the rabbitmq user, which must read its files.
        let status = Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "chmod {}", dir.display());
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// `rabbitmq.conf` lines for a TLS listener on `port` that verifies
    /// client certificates and, if `require_client_cert`, insists on one.
    fn listener_conf(&self, port: u16, require_client_cert: bool) -> String {
        format!(
            "listeners.ssl.default = {port}\n\
             ssl_options.cacertfile = {}\n\
             ssl_options.certfile = {}\n\
             ssl_options.keyfile = {}\n\
             ssl_options.verify = verify_peer\n\
             ssl_options.fail_if_no_peer_cert = {require_client_cert}\n",
            self.path("ca.pem"),
            self.path("server.pem"),
            self.path("server.key"),
        )
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn new_ca(name: &str) -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert, Issuer::new(params, key))
}

/// The seed scenario for prefix `p` on broker "main" at `uri`, with `tls`
/// lines added to `[brokers.main]`.
fn tls_toml(p: &str, uri: &str, tls: &str) -> String {
    let top = top_toml_at(uri, p, "nack", 5000, 100);
    let with_tls = top.replace(
        &format!("uri = \"{uri}\"\n"),
        &format!("uri = \"{uri}\"\n{tls}\n"),
    );
    assert_ne!(top, with_tls);
    seed_toml(p, &with_tls)
}

/// Publishes `MESSAGES` messages to `<p>.in` through `broker` and checks
/// that each arrives exactly once in the service and the logging queue.
async fn forward_and_count(broker: &TestBroker, p: &str) {
    for i in 0..MESSAGES {
        let props = BasicProperties::default().with_message_id(format!("m{i:04}").into());
        broker
            .publish(
                "",
                &format!("{p}.in"),
                format!("body {i}").as_bytes(),
                props,
            )
            .await;
    }
    for branch in ["service", "logging"] {
        let queue = format!("{p}.{branch}");
        broker.await_count(&queue, MESSAGES, DEFAULT_TIMEOUT).await;
        let mut got: Vec<(String, String)> = broker
            .get_all(&queue)
            .await
            .iter()
            .map(|m| {
                let id = m.properties.message_id().as_ref().map(|id| id.to_string());
                (id.unwrap_or_default(), m.body_str())
            })
            .collect();
        got.sort();
        let expected: Vec<(String, String)> = (0..MESSAGES)
            .map(|i| (format!("m{i:04}"), format!("body {i}")))
            .collect();
        assert_eq!(got, expected, "{queue}: every message once, intact");
    }
    assert_eq!(broker.queue_len(&format!("{p}.in")).await, 0);
}

/// `(ssl, peer certificate subject)` of the node's connections whose
/// client-provided name starts with `p`.
async fn tls_connections(node: &PrivateNode, p: &str) -> Vec<(bool, String)> {
    let out = node
        .rabbitmqctl(&[
            "list_connections",
            "--silent",
            "ssl",
            "peer_cert_subject",
            "client_properties",
        ])
        .await;
    out.lines()
        .filter(|line| line.contains(&format!("\"{p}/")))
        .map(|line| {
            let mut fields = line.split('\t');
            let ssl = fields.next().unwrap_or("").trim() == "true";
            let subject = fields.next().unwrap_or("").trim().to_string();
            (ssl, subject)
        })
        .collect()
}

/// Waits until the real binary's log says `what`, and returns the log.
async fn log_says(process: &Process, what: &str) -> String {
    wait_until(
        &format!("the log says {what:?}"),
        DEFAULT_TIMEOUT,
        || async { process.log().contains(what) },
    )
    .await;
    process.log()
}

#[tokio::test]
async fn forwards_over_tls_and_refuses_an_unknown_ca_or_another_host() {
    let p = unique_prefix("tls");
    let pki = Pki::generate(&p);
    let node = PrivateNode::start_with_conf(|port| pki.listener_conf(port, false)).await;
    let port = node.extra_port();
    let broker = TestBroker::connect_to(&node.amqp_url(), &format!("{p}-client")).await;

    // The broker's CA from ca_file: messages are forwarded, over TLS.
    let uri = format!("amqps://guest:guest@localhost:{port}/%2f");
    let toml = tls_toml(&p, &uri, &format!("ca_file = \"{}\"", pki.path("ca.pem")));
    let forwarder = InProcess::start_consuming(&toml, &broker, &format!("{p}.in")).await;
    forward_and_count(&broker, &p).await;
    let connections = tls_connections(&node, &p).await;
    assert!(
        connections.len() >= 2,
        "consuming and publishing connections: {connections:?}"
    );
    assert!(
        connections.iter().all(|(ssl, _)| *ssl),
        "every connection of the forwarder uses TLS: {connections:?}"
    );
    forwarder.stop().await.unwrap();

    // Another CA: the broker's certificate is refused, and the log says so.
    let wrong_ca = unique_prefix("tls-wrong-ca");
    let unknown = Process::spawn(
        &wrong_ca,
        &tls_toml(
            &wrong_ca,
            &uri,
            &format!("ca_file = \"{}\"", pki.path("other-ca.pem")),
        ),
    );
    // A host the certificate does not name (another loopback address).
    let wrong_host = unique_prefix("tls-wrong-host");
    let other_host = Process::spawn(
        &wrong_host,
        &tls_toml(
            &wrong_host,
            &format!("amqps://guest:guest@127.0.0.2:{port}/%2f"),
            &format!("ca_file = \"{}\"", pki.path("ca.pem")),
        ),
    );
    let log = log_says(
        &unknown,
        "TLS handshake with broker main failed: invalid peer certificate: UnknownIssuer",
    )
    .await;
    assert!(
        log.contains("brokers.main.ca_file"),
        "the hint names the key:\n{log}"
    );
    let log = log_says(
        &other_host,
        "TLS handshake with broker main failed: invalid peer certificate: certificate not valid for name",
    )
    .await;
    assert!(
        log.contains("brokers.main.uri"),
        "the hint names the key:\n{log}"
    );
    // Neither got as far as the broker: nothing of theirs was declared.
    for prefix in [&wrong_ca, &wrong_host] {
        assert!(!broker.queue_exists(&format!("{prefix}.in")).await);
        assert!(tls_connections(&node, prefix).await.is_empty());
    }
    drop((unknown, other_host));
    broker.close().await;
    node.stop().await;
}

#[tokio::test]
async fn a_client_certificate_is_shown_to_a_broker_that_requires_one() {
    let p = unique_prefix("tls-client");
    let pki = Pki::generate(&p);
    let node = PrivateNode::start_with_conf(|port| pki.listener_conf(port, true)).await;
    let uri = format!("amqps://guest:guest@localhost:{}/%2f", node.extra_port());
    let broker = TestBroker::connect_to(&node.amqp_url(), &format!("{p}-client")).await;

    // Without a client certificate the broker ends the handshake.
    let anonymous = unique_prefix("tls-anonymous");
    let refused = Process::spawn(
        &anonymous,
        &tls_toml(
            &anonymous,
            &uri,
            &format!("ca_file = \"{}\"", pki.path("ca.pem")),
        ),
    );
    let log = log_says(
        &refused,
        "TLS handshake with broker main failed: received fatal alert",
    )
    .await;
    assert!(
        log.contains("brokers.main.client_cert_file"),
        "the hint names the key:\n{log}"
    );
    assert!(!broker.queue_exists(&format!("{anonymous}.in")).await);
    drop(refused);

    // With one, messages are forwarded and the broker saw the certificate.
    let tls = format!(
        "ca_file = \"{}\"\nclient_cert_file = \"{}\"\nclient_key_file = \"{}\"",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    );
    let forwarder =
        InProcess::start_consuming(&tls_toml(&p, &uri, &tls), &broker, &format!("{p}.in")).await;
    forward_and_count(&broker, &p).await;
    let connections = tls_connections(&node, &p).await;
    assert!(connections.len() >= 2, "{connections:?}");
    assert!(
        connections
            .iter()
            .all(|(ssl, subject)| *ssl && subject.contains(CLIENT_CN)),
        "every connection shows the client certificate: {connections:?}"
    );
    forwarder.stop().await.unwrap();
    broker.close().await;
    node.stop().await;
}

#[test]
fn check_refuses_a_missing_ca_file_naming_the_key_and_the_path() {
    let p = unique_prefix("tls-check");
    let pki = Pki::generate(&p);
    let config = pki.dir.join("switchyard.toml");
    let write = |tls: &str| {
        let toml = tls_toml(&p, "amqps://guest:guest@localhost:5671/%2f", tls);
        std::fs::write(&config, toml).unwrap();
    };
    let check = || {
        Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["check", "--config"])
            .arg(&config)
            // Relative files are found next to the configuration, not here.
            .current_dir("/")
            .env_remove("SWITCHYARD_CONFIG")
            .output()
            .unwrap()
    };

    write("ca_file = \"missing-ca.pem\"");
    let out = check();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "switchyard: {}: brokers.main.ca_file: cannot read \"{}\": No such file or directory (os error 2)",
            config.display(),
            pki.path("missing-ca.pem")
        )
    );

    write(
        "ca_file = \"ca.pem\"\nclient_cert_file = \"client.pem\"\nclient_key_file = \"client.key\"",
    );
    let out = check();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
