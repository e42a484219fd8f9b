//! A real OTLP/HTTP trace receiver for tests (`OtlpReceiver`): a hyper
//! server on 127.0.0.1 that takes `POST /v1/traces`, decodes each body as
//! the OpenTelemetry project's `ExportTraceServiceRequest` and keeps every
//! span with its resource. It can be told to answer an error status or to
//! stall (read the request, never answer) instead; a counting one
//! (`OtlpReceiver::counting`) decodes alike but keeps only the requests,
//! for the throughput benchmark's hundreds of thousands of spans. Also a
//! collector address nothing listens on (`refusing_endpoint`).

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::polling::{POLL_INTERVAL, wait_until};

/// How the receiver answers the next requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 200 with an empty `ExportTraceServiceResponse`; spans are kept.
    Ok,
    /// This status; the spans are not kept.
    Status(u16),
    /// Reads the request and never answers.
    Stall,
}

/// One span as received, with the resource it came under.
#[derive(Debug, Clone)]
pub struct Received {
    /// The request's resource.
    pub resource: Resource,
    /// The span.
    pub span: Span,
}

impl Received {
    /// The span's string (or int, bool, as text) attribute `key`.
    pub fn attr(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }

    /// The resource's attribute `key`.
    pub fn resource_attr(&self, key: &str) -> Option<String> {
        attribute(&self.resource.attributes, key)
    }

    /// The span id as a number.
    pub fn span_id(&self) -> u64 {
        u64::from_be_bytes(self.span.span_id.as_slice().try_into().unwrap_or([0; 8]))
    }

    /// The parent span id as a number (`None`: a root).
    pub fn parent(&self) -> Option<u64> {
        let parent = self.span.parent_span_id.as_slice();
        (!parent.is_empty()).then(|| u64::from_be_bytes(parent.try_into().unwrap_or([0; 8])))
    }

    /// The trace id as a number.
    pub fn trace_id(&self) -> u128 {
        u128::from_be_bytes(self.span.trace_id.as_slice().try_into().unwrap_or([0; 16]))
    }
}

fn attribute(
    attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue],
    key: &str,
) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    match value.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Posted {
    /// Method and path, e.g. `POST /v1/traces`.
    pub request_line: String,
    /// Its `content-type`.
    pub content_type: Option<String>,
    /// Spans in it (0 if it did not decode).
    pub spans: usize,
    /// Whether the body decoded as an `ExportTraceServiceRequest`.
    pub decoded: bool,
}

#[derive(Default)]
struct State {
    /// Spans are counted in `posted` but not kept.
    counting: bool,
    answer: Mutex<Option<Answer>>,
    spans: Mutex<Vec<Received>>,
    posted: Mutex<Vec<Posted>>,
}

/// A running OTLP/HTTP receiver; stops when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    state: Arc<State>,
    server: JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl OtlpReceiver {
    /// A receiver on 127.0.0.1 (a free port) answering [`Answer::Ok`].
    pub async fn start() -> Self {
        Self::start_with(State::default()).await
    }

    /// [`Self::start`] keeping no span: [`Self::spans`] stays empty and
    /// [`Self::span_count`] counts what decoded.
    pub async fn counting() -> Self {
        Self::start_with(State {
            counting: true,
            ..State::default()
        })
        .await
    }

    async fn start_with(state: State) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind the OTLP receiver: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("the OTLP receiver's address: {e}"));
        let state = Arc::new(state);
        let server = tokio::spawn(serve(listener, state.clone()));
        Self {
            addr,
            state,
            server,
        }
    }

    /// The `[telemetry.otlp] endpoint` that reaches it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers the next requests so.
    pub fn answer(&self, answer: Answer) {
        *lock(&self.state.answer) = Some(answer);
    }

    /// Every span kept so far, in order of arrival.
    pub fn spans(&self) -> Vec<Received> {
        lock(&self.state.spans).clone()
    }

    /// Spans in every request so far that decoded, kept or not.
    pub fn span_count(&self) -> usize {
        lock(&self.state.posted).iter().map(|p| p.spans).sum()
    }

    /// Every request so far, kept or not.
    pub fn posted(&self) -> Vec<Posted> {
        lock(&self.state.posted).clone()
    }

    /// Waits until at least `n` spans are kept; panics after `timeout`.
    pub async fn wait_for_spans(&self, n: usize, timeout: Duration) -> Vec<Received> {
        wait_until(
            &format!("{n} spans reach the receiver"),
            timeout,
            || async { lock(&self.state.spans).len() >= n },
        )
        .await;
        self.spans()
    }

    /// Waits until at least `n` requests came (answered or not); panics
    /// after `timeout`.
    pub async fn wait_for_posts(&self, n: usize, timeout: Duration) {
        wait_until(
            &format!("{n} requests reach the receiver"),
            timeout,
            || async { lock(&self.state.posted).len() >= n },
        )
        .await;
    }
}

/// An `http://` endpoint on 127.0.0.1 where nothing listens: every
/// connection is refused.
pub fn refusing_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("bind a free port: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("free port: {e}"));
    drop(listener);
    format!("http://{addr}")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn serve(listener: TcpListener, state: Arc<State>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(POLL_INTERVAL).await;
            continue;
        };
        let state = state.clone();
        connections.spawn(async move {
            let service = service_fn(|request| receive(request, state.clone()));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

async fn receive(
    request: Request<Incoming>,
    state: Arc<State>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let request_line = format!("{} {}", request.method(), request.uri().path());
    let content_type = request
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let decoded = ExportTraceServiceRequest::decode(body).ok();
    let answer = lock(&state.answer).unwrap_or(Answer::Ok);
    let spans: Vec<Received> = decoded
        .iter()
        .flat_map(|r| &r.resource_spans)
        .flat_map(|rs| {
            let resource = rs.resource.clone().unwrap_or_default();
            rs.scope_spans
                .iter()
                .flat_map(|ss| &ss.spans)
                .map(move |span| Received {
                    resource: resource.clone(),
                    span: span.clone(),
                })
        })
        .collect();
    lock(&state.posted).push(Posted {
        request_line,
        content_type,
        spans: spans.len(),
        decoded: decoded.is_some(),
    });
    let status = match answer {
        Answer::Stall => std::future::pending().await,
        Answer::Status(status) => status,
        Answer::Ok if decoded.is_none() => 400,
        Answer::Ok => {
            if !state.counting {
                lock(&state.spans).extend(spans);
            }
            200
        }
    };
    let body = ExportTraceServiceResponse::default().encode_to_vec();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-protobuf"),
    );
    Ok(response)
}
