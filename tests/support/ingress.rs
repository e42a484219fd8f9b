//! The HTTP ingress from outside: a listener for the forwarder to serve on,
//! and hyper's own HTTP/1.1 client connection, over TCP or TLS, sending
//! one request per connection.

use super::TestBroker;
use super::config::Forwarder;
use super::harness::{InProcess, wait_consumers};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// A loopback listener on a free port, for `Options::http`, and its address.
pub fn ingress_listener() -> (std::net::TcpListener, SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("bind a free port: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("ingress addr: {e}"));
    (listener, addr)
}

/// Starts `config` in this process with its ingress on a fresh loopback
/// port and `options` otherwise, and waits until it consumes `inbound` on
/// `broker` (its topology is prepared then) when given.
pub async fn start_ingress(
    config: &Forwarder,
    options: switchyard::Options,
    inbound: Option<(&TestBroker, &str)>,
) -> (InProcess, Client) {
    let (listener, addr) = ingress_listener();
    let options = switchyard::Options {
        http: Some(listener),
        ..options
    };
    let running = InProcess::start_with(&config.toml(), options);
    if let Some((broker, queue)) = inbound {
        wait_consumers(broker, queue, 1).await;
    }
    (running, Client::new(addr))
}

/// Stops `running` after checking that nothing was dead-lettered (HTTP
/// requests never are: `<p>.dlq` is empty or absent), and deletes every
/// queue and exchange of prefix `p`.
pub async fn stop_clean(running: InProcess, broker: &TestBroker, p: &str) {
    let dead = broker.try_queue_len(&format!("{p}.dlq")).await;
    assert!(matches!(dead, None | Some(0)), "dead-lettered: {dead:?}");
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    super::delete_all_with_prefix(p).await;
}

/// An answer: status, headers (lower-case names), body as text and, when
/// it is JSON, parsed.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub text: String,
    pub json: serde_json::Value,
}

impl Reply {
    /// A list of strings in the JSON body (`delivered`, say), sorted.
    pub fn names(&self, field: &str) -> Vec<String> {
        let mut names: Vec<String> = self.json[field]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|i| match i {
                        serde_json::Value::String(s) => s.clone(),
                        other => other["branch"].as_str().unwrap_or_default().to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

/// Where and how to reach an ingress.
#[derive(Clone)]
pub struct Client {
    addr: SocketAddr,
    tls: Option<(tokio_rustls::TlsConnector, String)>,
}

impl Client {
    /// Plain HTTP to `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Self { addr, tls: None }
    }

    /// The address it sends to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// HTTPS to `addr`, trusting the CA certificates in `ca_pem` and
    /// checking the certificate is for `server_name`.
    pub fn tls(addr: SocketAddr, ca_pem: &str, server_name: &str) -> Self {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots
                .add(cert.unwrap_or_else(|e| panic!("CA pem: {e}")))
                .unwrap_or_else(|e| panic!("CA: {e}"));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|e| panic!("{e}"))
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        Self {
            addr,
            tls: Some((connector, server_name.to_owned())),
        }
    }

    /// `POST path` with `headers` and `body`.
    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
        self.send("POST", path, headers, body).await
    }

    /// Sends one request and reads the whole answer; panics when the
    /// connection fails.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        self.try_send(method, path, headers, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// [`Self::send`], with a failed connection as an error.
    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Reply, String> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(|e| e.to_string())?;
        match &self.tls {
            None => exchange(tcp, self.addr, method, path, headers, body).await,
            Some((connector, name)) => {
                let name = rustls::pki_types::ServerName::try_from(name.clone())
                    .map_err(|e| e.to_string())?;
                let stream = connector
                    .connect(name, tcp)
                    .await
                    .map_err(|e| e.to_string())?;
                exchange(stream, self.addr, method, path, headers, body).await
            }
        }
    }
}

async fn exchange<S>(
    stream: S,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Reply, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::copy_from_slice(body)))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    Ok(Reply {
        status,
        headers,
        text,
        json,
    })
}
