//! The admin endpoint from outside: a plain HTTP/1.1 GET over a TCP stream
//! and a strict reader of the Prometheus text format.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An HTTP response: status code, headers (lower-case names) and body.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// `GET path` on `addr` with `Connection: close`; `Err` when the connection
/// fails (nothing listens). Panics on a malformed response.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<HttpResponse> {
    http_request(addr, "GET", path).await
}

/// Sends `method path` and reads the whole response.
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> std::io::Result<HttpResponse> {
    http_send(addr, method, path, &[], b"").await
}

/// Sends `method path` with `headers` and `body` (with its
/// `Content-Length`) and reads the whole response.
pub async fn http_send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || matches!(method, "POST" | "PUT") {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8(raw).unwrap_or_else(|e| panic!("response is not UTF-8: {e}"));
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in {text:?}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    if let Some(length) = headers.get("content-length") {
        let length: usize = length.parse().unwrap_or_else(|e| panic!("{length}: {e}"));
        assert_eq!(body.len(), length, "body length matches content-length");
    }
    Ok(HttpResponse {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// A listener on a free loopback port, for the forwarder's admin endpoint
/// to serve on (`Options::admin`), and its address.
pub fn admin_listener() -> (std::net::TcpListener, SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("bind an admin port: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("admin addr: {e}"));
    (listener, addr)
}

/// A loopback address nothing listens on, for an admin endpoint.
pub fn free_admin_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("bind a free port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("admin addr: {e}"))
}

/// One sample's identity: metric name and labels.
pub type Series = (String, BTreeMap<String, String>);

/// A parsed `/metrics` page.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Every sample.
    pub samples: BTreeMap<Series, f64>,
    /// Declared metric families and their type.
    pub types: BTreeMap<String, String>,
}

impl Metrics {
    /// Parses the Prometheus text format (0.0.4), panicking on any line that
    /// is neither a `# HELP` / `# TYPE` comment nor a sample of a declared
    /// family, and on a series that appears twice.
    pub fn parse(text: &str) -> Self {
        let mut metrics = Metrics::default();
        let mut seen = BTreeSet::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("bad TYPE line {line:?}"));
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                    "unknown type in {line:?}"
                );
                assert!(valid_name(name), "bad metric name in {line:?}");
                metrics.types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            assert!(!line.starts_with('#'), "unexpected comment {line:?}");
            let (series, value) = parse_sample(line);
            let family = metrics.family_of(&series.0);
            assert!(
                family.is_some(),
                "sample {line:?} belongs to no declared family"
            );
            assert!(seen.insert(series.clone()), "duplicate series {line:?}");
            metrics.samples.insert(series, value);
        }
        metrics
    }

    fn family_of<'a>(&self, name: &'a str) -> Option<&'a str> {
        if self.types.contains_key(name) {
            return Some(name);
        }
        ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(move |suffix| {
                let base = name.strip_suffix(suffix)?;
                (self.types.get(base).map(String::as_str) == Some("histogram")).then_some(base)
            })
    }

    /// The value of `name` with exactly `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples.get(&(name.to_owned(), labels)).copied()
    }

    /// The value of `name` with exactly `labels`, 0 when absent.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// The sum of every series of `name`.
    pub fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|(_, v)| v)
            .sum()
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_sample(line: &str) -> (Series, f64) {
    let (series, value) = line
        .rsplit_once(' ')
        .unwrap_or_else(|| panic!("no value in {line:?}"));
    let value: f64 = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse()
            .unwrap_or_else(|e| panic!("bad value in {line:?}: {e}")),
    };
    let (name, labels) = match series.split_once('{') {
        None => (series, BTreeMap::new()),
        Some((name, rest)) => {
            let inner = rest
                .strip_suffix('}')
                .unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
            (name, parse_labels(inner, line))
        }
    };
    assert!(valid_name(name), "bad metric name in {line:?}");
    ((name.to_owned(), labels), value)
}

fn parse_labels(mut rest: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad label in {line:?}"));
        assert!(valid_name(key), "bad label name in {line:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => panic!("bad escape in {line:?}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unclosed label value in {line:?}"),
            }
        };
        labels.insert(key.to_owned(), value);
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    labels
}
