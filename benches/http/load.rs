//! The load: `clients` tasks, each on a keep-alive HTTP/1.1 connection of
//! its own (hyper's client connection) or, for the AMQP floor, a confirm
//! channel of its own, sending the row's one request again and again. Closed loop for the maximum rate (each client sends its
//! next request as soon as the answer is in), open loop for latency (a
//! fixed schedule, each request due at `start + i / rate`; a free client
//! takes the next one, waits until it is due and sends it; its latency is
//! counted from when it was due, so a client that falls behind shows in
//! the figures instead of slowing the schedule down).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HOST, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Confirmation};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What every request of a row is, and which answers count.
pub enum Shape {
    Http(HttpShape),
    Amqp(AmqpShape),
}

/// One HTTP request.
pub struct HttpShape {
    pub addr: SocketAddr,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Whether an answer (status, body) is an accepted request.
    pub accepts: fn(u16, &[u8]) -> bool,
}

/// One "request" straight over AMQP: the body published to each queue
/// through the default exchange (mandatory, persistent), both confirms
/// awaited.
pub struct AmqpShape {
    pub connection: lapin::Connection,
    pub queues: Vec<String>,
    pub body: Vec<u8>,
}

impl Shape {
    /// A POST of `body` to `path` on `addr` with `headers` (and `Host`).
    pub fn post(
        addr: SocketAddr,
        path: &str,
        headers: &[(&'static str, String)],
        body: Vec<u8>,
        accepts: fn(u16, &[u8]) -> bool,
    ) -> Result<Self, String> {
        let uri: Uri = path.parse().map_err(|e| format!("path {path:?}: {e}"))?;
        let mut map = HeaderMap::new();
        let value = |v: &str| HeaderValue::from_str(v).map_err(|e| format!("header {v:?}: {e}"));
        map.insert(HOST, value(&addr.to_string())?);
        for (name, v) in headers {
            map.insert(HeaderName::from_static(name), value(v)?);
        }
        Ok(Self::Http(HttpShape {
            addr,
            uri,
            headers: map,
            body: Bytes::from(body),
            accepts,
        }))
    }
}

impl HttpShape {
    fn request(&self) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(self.body.clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        *request.headers_mut() = self.headers.clone();
        request
    }
}

/// How one request ended.
enum Answer {
    Accepted,
    /// Answered, not accepted: the status (or what the broker said) and
    /// the body.
    Refused(String, String),
    /// No answer: the connection or the request failed.
    Failed(String),
}

/// One client's connection.
enum Conn {
    Http(HttpConn),
    Amqp(lapin::Channel),
}

impl Conn {
    async fn open(shape: &Shape) -> Result<Self, String> {
        match shape {
            Shape::Http(http) => {
                let mut conn = HttpConn {
                    addr: http.addr,
                    sender: None,
                    opened: 0,
                };
                conn.ready().await?;
                Ok(Self::Http(conn))
            }
            Shape::Amqp(amqp) => {
                let channel = amqp
                    .connection
                    .create_channel()
                    .await
                    .map_err(|e| format!("open a channel: {e}"))?;
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await
                    .map_err(|e| format!("confirm.select: {e}"))?;
                Ok(Self::Amqp(channel))
            }
        }
    }

    async fn send(&mut self, shape: &Shape) -> Answer {
        match (self, shape) {
            (Self::Http(conn), Shape::Http(http)) => match conn.send(http).await {
                Ok((status, body)) if (http.accepts)(status, &body) => Answer::Accepted,
                Ok((status, body)) => Answer::Refused(
                    status.to_string(),
                    String::from_utf8_lossy(&body).chars().take(300).collect(),
                ),
                Err(e) => Answer::Failed(e),
            },
            (Self::Amqp(channel), Shape::Amqp(amqp)) => publish(channel, amqp).await,
            _ => Answer::Failed("a connection of the wrong kind".to_owned()),
        }
    }

    /// Connections opened beyond the first.
    fn reconnects(&self) -> u64 {
        match self {
            Self::Http(conn) => conn.opened.saturating_sub(1),
            Self::Amqp(_) => 0,
        }
    }
}

/// Publishes the body to every queue of `amqp`, then awaits every confirm.
async fn publish(channel: &lapin::Channel, amqp: &AmqpShape) -> Answer {
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/octet-stream".into());
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let mut confirms = Vec::with_capacity(amqp.queues.len());
    for queue in &amqp.queues {
        let published = channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                options,
                &amqp.body,
                properties.clone(),
            )
            .await;
        match published {
            Ok(confirm) => confirms.push(confirm),
            Err(e) => return Answer::Failed(format!("publish to {queue}: {e}")),
        }
    }
    let mut answer = Answer::Accepted;
    for confirm in confirms {
        match tokio::time::timeout(REQUEST_TIMEOUT, confirm).await {
            Ok(Ok(Confirmation::Ack(None))) => {}
            Ok(Ok(Confirmation::Ack(Some(_)))) => {
                answer = Answer::Refused("returned".to_owned(), String::new());
            }
            Ok(Ok(other)) => answer = Answer::Refused(format!("{other:?}"), String::new()),
            Ok(Err(e)) => return Answer::Failed(format!("confirm: {e}")),
            Err(_) => return Answer::Failed(format!("no confirm within {REQUEST_TIMEOUT:?}")),
        }
    }
    answer
}

/// One client's HTTP connection, opened again when the server has closed it.
struct HttpConn {
    addr: SocketAddr,
    sender: Option<SendRequest<Full<Bytes>>>,
    opened: u64,
}

impl HttpConn {
    /// A sender ready for a request: the open one, or a new connection.
    async fn ready(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        let alive = match self.sender.as_mut() {
            Some(sender) => sender.ready().await.is_ok(),
            None => false,
        };
        if !alive {
            self.sender = None;
            let tcp = TcpStream::connect(self.addr)
                .await
                .map_err(|e| format!("connect {}: {e}", self.addr))?;
            let _ = tcp.set_nodelay(true);
            let (sender, connection) = http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| format!("handshake with {}: {e}", self.addr))?;
            // Ends when either side closes the connection.
            tokio::spawn(async move {
                let _ = connection.await;
            });
            self.sender = Some(sender);
            self.opened += 1;
        }
        match self.sender.as_mut() {
            Some(sender) => Ok(sender),
            None => Err("no connection".to_owned()),
        }
    }

    /// Sends one request and reads the whole answer: `(status, body)`.
    async fn send(&mut self, shape: &HttpShape) -> Result<(u16, Bytes), String> {
        let exchange = async {
            let sender = self.ready().await?;
            let response = sender
                .send_request(shape.request())
                .await
                .map_err(|e| format!("request: {e}"))?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("answer body: {e}"))?
                .to_bytes();
            Ok((status, body))
        };
        let result = match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
        };
        if result.is_err() {
            // Whatever state the connection is in, the next request gets a new one.
            self.sender = None;
        }
        result
    }
}

/// What a set of requests got.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Requests answered as the row accepts them.
    pub accepted: u64,
    /// Every other answer by status (or transport error), with a count
    /// and the first body seen.
    pub others: BTreeMap<String, (u64, String)>,
    /// Latencies in microseconds (open loop only).
    pub latencies_us: Vec<u64>,
    /// Connections opened beyond the first of each client.
    pub reconnects: u64,
}

impl Tally {
    fn record(&mut self, answer: Answer) {
        let (key, sample) = match answer {
            Answer::Accepted => {
                self.accepted += 1;
                return;
            }
            Answer::Refused(key, sample) => (key, sample),
            Answer::Failed(e) => ("error".to_owned(), e),
        };
        let entry = self.others.entry(key).or_insert((0, sample));
        entry.0 += 1;
    }

    fn merge(&mut self, other: Tally) {
        self.accepted += other.accepted;
        for (key, (n, sample)) in other.others {
            self.others.entry(key).or_insert((0, sample)).0 += n;
        }
        self.latencies_us.extend(other.latencies_us);
        self.reconnects += other.reconnects;
    }

    /// Answers that were not accepted.
    pub fn refused(&self) -> u64 {
        self.others.values().map(|(n, _)| n).sum()
    }

    /// The `q` quantile (0..=1) of the latencies, in milliseconds.
    pub fn latency_ms(&self, q: f64) -> Option<f64> {
        let mut sorted = self.latencies_us.clone();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_unstable();
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        Some(sorted[rank - 1] as f64 / 1000.0)
    }

    /// One line per kind of refusal: status, count, first body.
    pub fn refusal_lines(&self) -> Vec<String> {
        self.others
            .iter()
            .map(|(key, (n, sample))| format!("{n} × {key}: {sample}"))
            .collect()
    }
}

/// How the requests are paced.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// Back to back for this long.
    Closed(Duration),
    /// `rate` requests per second on a fixed schedule, for this long.
    Open { rate: f64, secs: f64 },
}

/// What one phase measured: its tally and how long it took, first request
/// to last answer.
#[derive(Debug, Clone)]
pub struct Phase {
    pub tally: Tally,
    pub elapsed: Duration,
}

impl Phase {
    /// Accepted requests per second.
    pub fn rate(&self) -> f64 {
        self.tally.accepted as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Opens `clients` connections to the shape's server, then runs the
/// phase; returns once every answer is in, with what `at_start` returned:
/// it runs once every connection is open, just before the first request
/// (the CPU readings).
pub async fn run<T>(
    shape: &Arc<Shape>,
    clients: usize,
    pace: Pace,
    at_start: impl FnOnce() -> T,
) -> Result<(Phase, T), String> {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(Conn::open(shape).await?);
    }
    let started = at_start();
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(clients);
    for mut conn in conns {
        let shape = shape.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            match pace {
                Pace::Closed(length) => {
                    let until = start + length;
                    while Instant::now() < until {
                        let answer = conn.send(&shape).await;
                        tally.record(answer);
                    }
                }
                Pace::Open { rate, secs } => {
                    let total = (rate * secs).round() as u64;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= total {
                            break;
                        }
                        let due = start + Duration::from_secs_f64(i as f64 / rate);
                        tokio::time::sleep_until(due).await;
                        let answer = conn.send(&shape).await;
                        tally
                            .latencies_us
                            .push(due.elapsed().as_micros().min(u128::from(u64::MAX)) as u64);
                        tally.record(answer);
                    }
                }
            }
            tally.reconnects = conn.reconnects();
            tally
        }));
    }
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(
            task.await
                .map_err(|e| format!("a client task failed: {e}"))?,
        );
    }
    let phase = Phase {
        tally,
        elapsed: start.elapsed(),
    };
    Ok((phase, started))
}
