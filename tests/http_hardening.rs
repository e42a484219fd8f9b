//! The HTTP ingress under abuse and over TLS: slow or oversized requests
//! are cut off with a clear answer, idle connections cannot hold the
//! listener, and queue-side forwarding goes on meanwhile; a TLS listener
//! serves HTTPS and nothing else.

use crate::support;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::time::Duration;
use support::config::{Forwarder, Value};
use support::harness::InProcess;
use support::ingress::{Client, start_ingress, stop_clean};
use support::{DEFAULT_TIMEOUT, TestBroker, unique_prefix};
use switchyard::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

async fn start(
    config: &Forwarder,
    broker: &TestBroker,
    p: &str,
) -> (InProcess, std::net::SocketAddr) {
    let inbound = format!("{p}.in");
    let (running, client) =
        start_ingress(config, Options::default(), Some((broker, &inbound))).await;
    (running, client.addr())
}

/// Everything the server sends on `stream` until it closes it (or
/// `within` passes: then `None`).
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut out = Vec::new();
    let read = tokio::time::timeout(within, stream.read_to_end(&mut out)).await;
    match read {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => None,
    }
}

#[tokio::test]
async fn slow_oversized_and_idle_clients_are_cut_off_and_forwarding_goes_on() {
    let p = unique_prefix("http-abuse");
    let broker = TestBroker::connect(&p).await;
    let config = Forwarder::new(&p).seed(&p).http(&[
        ("header_timeout_ms", Value::from(500u32)),
        ("request_timeout_ms", Value::from(1000u32)),
        ("max_connections", Value::from(50u32)),
    ]);
    let (running, addr) = start(&config, &broker, &p).await;
    let client = Client::new(addr);

    // Headers trickled and never finished: the connection is closed.
    let started = Instant::now();
    let mut slow = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    slow.write_all(b"POST /messages/k HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let answer = read_until_closed(&mut slow, Duration::from_secs(5)).await;
    assert!(answer.is_some(), "a slow client is cut off");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // A head over the limit is refused with 431, however fast it came.
    let mut big = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let header = format!("X-Big: {}\r\n", "a".repeat(100 * 1024));
    let request =
        format!("POST /messages/k HTTP/1.1\r\nHost: x\r\n{header}Content-Length: 0\r\n\r\n");
    let _ = big.write_all(request.as_bytes()).await;
    let answer = read_until_closed(&mut big, Duration::from_secs(5))
        .await
        .unwrap_or_default();
    assert!(
        answer.starts_with("HTTP/1.1 431"),
        "{}",
        answer.lines().next().unwrap_or_default()
    );

    // A body trickled past the request's time: 408, nothing published.
    let mut trickle = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    trickle
        .write_all(b"POST /messages/k HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let feeding = tokio::spawn(async move {
        for _ in 0..20 {
            if trickle.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), trickle.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    });
    let answer = feeding.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    // A thousand idle connections against 50 slots: each is closed (to
    // make room for a newer one, or after the header timeout), a real
    // request still gets through, and the inbound queue is forwarded
    // meanwhile.
    let mut idle = Vec::new();
    for _ in 0..1000 {
        match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => idle.push(stream),
            _ => break,
        }
    }
    assert!(idle.len() >= 100, "opened {} idle connections", idle.len());
    let queued: Vec<(&[u8], lapin::BasicProperties)> = (0..100)
        .map(|_| (&b"queued"[..], lapin::BasicProperties::default()))
        .collect();
    broker.publish_each("", &format!("{p}.in"), queued).await;
    let served = tokio::time::timeout(
        DEFAULT_TIMEOUT,
        client.post("/messages/k", &[], b"during the flood"),
    )
    .await
    .unwrap_or_else(|_| panic!("a request during the flood was not served"));
    assert_eq!(served.status, 202, "{}", served.text);
    broker
        .await_count(&format!("{p}.service"), 101, DEFAULT_TIMEOUT)
        .await;
    broker
        .await_count(&format!("{p}.logging"), 101, DEFAULT_TIMEOUT)
        .await;
    // Every idle connection the server took is closed by it.
    let mut closed = 0;
    for stream in &mut idle[..50] {
        if read_until_closed(stream, Duration::from_secs(10))
            .await
            .is_some()
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 50, "idle connections are closed by the server");
    drop(idle);
    stop_clean(running, &broker, &p).await;
}

/// A CA and a certificate for `localhost` and 127.0.0.1 signed by it, as
/// PEM files in `dir`; returns the CA's PEM.
fn certificates(dir: &std::path::Path) -> String {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "ingress test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
    let ca_cert = ca.self_signed(&ca_key).unwrap_or_else(|e| panic!("{e}"));
    let issuer = Issuer::new(ca, ca_key);
    let mut server = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .unwrap_or_else(|e| panic!("{e}"));
    server
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    server
        .extended_key_usages
        .push(ExtendedKeyUsagePurpose::ServerAuth);
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
    let cert = server
        .signed_by(&key, &issuer)
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("server.pem"), cert.pem()).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap_or_else(|e| panic!("{e}"));
    ca_cert.pem()
}

#[tokio::test]
async fn a_tls_listener_serves_https_and_refuses_plain_http() {
    let p = unique_prefix("http-tls");
    let broker = TestBroker::connect(&p).await;
    let dir = std::env::temp_dir().join(format!("{p}-certs"));
    let ca = certificates(&dir);
    let path = |name: &str| dir.join(name).display().to_string();
    let config = Forwarder::new(&p).seed(&p).http(&[
        ("cert_file", Value::from(path("server.pem"))),
        ("key_file", Value::from(path("server.key"))),
        ("tokens", Value::from(["t0ken"])),
    ]);
    let (running, addr) = start(&config, &broker, &p).await;

    let https = Client::tls(addr, &ca, "localhost");
    let auth = [("authorization", "Bearer t0ken")];
    let reply = https.post("/messages/k", &auth, b"secret work").await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    assert_eq!(broker.queue_len(&format!("{p}.service")).await, 1);
    assert_eq!(broker.queue_len(&format!("{p}.logging")).await, 1);

    let plain = Client::new(addr)
        .try_send("POST", "/messages/k", &auth, b"in the clear")
        .await;
    assert!(plain.is_err(), "plain HTTP to a TLS listener: {plain:?}");
    let other_ca = {
        let other = dir.join("other");
        certificates(&other)
    };
    let untrusted = Client::tls(addr, &other_ca, "localhost")
        .try_send("POST", "/messages/k", &auth, b"x")
        .await;
    assert!(
        untrusted.is_err(),
        "a client that does not trust the certificate"
    );
    assert_eq!(
        broker.queue_len(&format!("{p}.service")).await,
        1,
        "nothing more published"
    );
    let _ = std::fs::remove_dir_all(&dir);
    stop_clean(running, &broker, &p).await;
}
