//! The metrics behind [`super::Telemetry`]: one `prometheus-client`
//! registry with every series the forwarder exports, and the per-route
//! counters that make counting a forwarded copy allocation-free once its
//! series exists.

use crate::wire::Kind;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Instant;

/// Upper bounds of the confirm-latency buckets, in seconds: from a fast
/// local broker (well under a millisecond) to a confirm timeout.
const CONFIRM_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct RouteLabels {
    pub(super) branch: Arc<str>,
    pub(super) endpoint: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct FailoverLabels {
    pub(super) branch: String,
    pub(super) from: String,
    pub(super) to: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub(super) reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ListenerLabels {
    pub(super) listener: &'static str,
}

/// The refusals of the HTTP ingress logged apart, each at most once a
/// second; any other code shares the last throttle.
pub(super) const REFUSAL_CODES: [u16; 12] =
    [400, 401, 403, 404, 405, 408, 409, 413, 415, 429, 431, 501];

/// One refusal code's log throttle.
#[derive(Default)]
pub(super) struct RefusalLog {
    /// When it was last logged, in milliseconds since `started` (0: never).
    pub(super) logged_ms: AtomicU64,
    /// Refusals since that line.
    pub(super) since: AtomicU64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct HeaderLabels {
    pub(super) header: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct NodeLabels {
    pub(super) broker: String,
    pub(super) role: String,
    pub(super) node: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct WhyLabels {
    pub(super) why: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct CodeLabels {
    pub(super) code: u16,
}

/// Upper bounds of the HTTP request-latency buckets, in seconds.
const REQUEST_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0,
];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct EndpointLabels {
    pub(super) endpoint: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct EndpointStateLabels {
    pub(super) endpoint: String,
    pub(super) state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct BranchLabels {
    pub(super) branch: String,
}

/// Branch -> endpoint -> counter.
pub(super) type ByRoute = HashMap<Arc<str>, HashMap<Arc<str>, Counter>>;

/// Counters labelled by branch and endpoint, found by `&str` without
/// allocating once a series exists.
#[derive(Default)]
pub(super) struct RouteCounters {
    pub(super) family: Family<RouteLabels, Counter>,
    pub(super) cache: RwLock<ByRoute>,
}

impl RouteCounters {
    pub(super) fn inc(&self, branch: &str, endpoint: &str) {
        {
            let cache = self.cache.read().unwrap_or_else(|e| e.into_inner());
            if let Some(counter) = cache.get(branch).and_then(|m| m.get(endpoint)) {
                counter.inc();
                return;
            }
        }
        self.get(branch, endpoint).inc();
    }

    /// Removes every series of `endpoint`, whatever the branch.
    pub(super) fn forget(&self, endpoint: &str) {
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        for (branch, endpoints) in cache.iter_mut() {
            if endpoints.remove(endpoint).is_some() {
                self.family.remove(&RouteLabels {
                    branch: branch.clone(),
                    endpoint: endpoint.into(),
                });
            }
        }
    }

    /// The series, created (at zero) if need be.
    pub(super) fn get(&self, branch: &str, endpoint: &str) -> Counter {
        let labels = RouteLabels {
            branch: branch.into(),
            endpoint: endpoint.into(),
        };
        let counter = self.family.get_or_create_owned(&labels);
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(labels.branch)
            .or_default()
            .insert(labels.endpoint, counter.clone());
        counter
    }
}

pub(super) struct Metrics {
    pub(super) registry: Registry,
    pub(super) consumed: Counter,
    pub(super) forwarded: RouteCounters,
    pub(super) retries: RouteCounters,
    pub(super) replays: RouteCounters,
    pub(super) failovers: Family<FailoverLabels, Counter>,
    /// The label sets of `failovers`, so that an endpoint's can be found.
    pub(super) failover_series: std::sync::Mutex<rustc_hash::FxHashSet<FailoverLabels>>,
    /// Registered endpoints that left: their series are removed, and again
    /// when their publisher stops (a copy in flight may have made one).
    pub(super) retired: std::sync::Mutex<rustc_hash::FxHashSet<String>>,
    pub(super) dead_lettered: Family<ReasonLabels, Counter>,
    pub(super) confirm_seconds: Histogram,
    pub(super) in_flight: Gauge,
    pub(super) sessions_open: Gauge,
    pub(super) outage_holds: Gauge,
    pub(super) broker_node: Family<NodeLabels, Gauge>,
    pub(super) endpoint_up: Family<EndpointLabels, Gauge>,
    pub(super) endpoint_state: Family<EndpointStateLabels, Gauge>,
    /// Endpoints drained now, for `endpoint_state`.
    pub(super) drained: std::sync::Mutex<rustc_hash::FxHashSet<String>>,
    pub(super) paused: Gauge,
    pub(super) registrations: Family<BranchLabels, Gauge>,
    pub(super) config_generation: Gauge,
    pub(super) http_requests: Family<CodeLabels, Counter>,
    pub(super) http_seconds: Histogram,
    /// By [`REFUSAL_CODES`] index, then one for any other code.
    pub(super) refusal_logs: [RefusalLog; REFUSAL_CODES.len() + 1],
    pub(super) connections_shed: Family<ListenerLabels, Counter>,
    /// By [`Kind`] index: ignored headers of untrusted messages.
    pub(super) untrusted_headers: Vec<Counter>,
    /// By [`Kind`] index: when that kind was last logged, in milliseconds
    /// since `started` (0: never).
    pub(super) untrusted_logged_ms: Vec<AtomicU64>,
    pub(super) journal_records: Counter,
    pub(super) journal_dropped: Counter,
    pub(super) journal_writable: Gauge,
    /// When a drop was last logged, in milliseconds since `started`.
    pub(super) journal_dropped_logged_ms: AtomicU64,
    /// Drops since that line.
    pub(super) journal_dropped_since: AtomicU64,
    pub(super) trace_context_malformed: Counter,
    pub(super) spans_exported: Counter,
    pub(super) spans_dropped: Counter,
    pub(super) spans_dropped_logged_ms: AtomicU64,
    /// Spans dropped since the last `spans dropped` line.
    pub(super) spans_dropped_since: AtomicU64,
    /// Control records not applied: `writer` (not the group's), `refused`
    /// (a rule of the configuration in force).
    pub(super) control_ignored: Family<WhyLabels, Counter>,
    pub(super) control_ignored_logged_ms: AtomicU64,
    pub(super) admin_unauthorized: Counter,
    pub(super) started: Instant,
}

impl Metrics {
    // One registration per metric, in the order docs/operations.md lists
    // them: long, but split it would scatter one list over several places.
    pub(super) fn new() -> Self {
        let mut metrics = Self {
            registry: Registry::default(),
            consumed: Counter::default(),
            forwarded: RouteCounters::default(),
            retries: RouteCounters::default(),
            replays: RouteCounters::default(),
            failovers: Family::default(),
            failover_series: std::sync::Mutex::default(),
            retired: std::sync::Mutex::default(),
            dead_lettered: Family::default(),
            confirm_seconds: Histogram::new(CONFIRM_BUCKETS),
            in_flight: Gauge::default(),
            sessions_open: Gauge::default(),
            outage_holds: Gauge::default(),
            broker_node: Family::default(),
            endpoint_up: Family::default(),
            endpoint_state: Family::default(),
            drained: std::sync::Mutex::default(),
            paused: Gauge::default(),
            registrations: Family::default(),
            config_generation: Gauge::default(),
            http_requests: Family::default(),
            http_seconds: Histogram::new(REQUEST_BUCKETS),
            refusal_logs: std::array::from_fn(|_| RefusalLog::default()),
            connections_shed: Family::default(),
            untrusted_headers: Vec::new(),
            untrusted_logged_ms: Kind::all().map(|_| AtomicU64::new(0)).collect(),
            journal_records: Counter::default(),
            journal_dropped: Counter::default(),
            journal_writable: Gauge::default(),
            journal_dropped_logged_ms: AtomicU64::new(0),
            journal_dropped_since: AtomicU64::new(0),
            trace_context_malformed: Counter::default(),
            spans_exported: Counter::default(),
            spans_dropped: Counter::default(),
            spans_dropped_logged_ms: AtomicU64::new(0),
            spans_dropped_since: AtomicU64::new(0),
            control_ignored: Family::default(),
            control_ignored_logged_ms: AtomicU64::new(0),
            admin_unauthorized: Counter::default(),
            started: Instant::now(),
        };
        let untrusted: Family<HeaderLabels, Counter> = Family::default();
        metrics.untrusted_headers = Kind::all()
            .map(|kind| {
                let header = kind.label();
                untrusted.get_or_create(&HeaderLabels { header }).clone()
            })
            .collect();
        let r = &mut metrics.registry;
        r.register(
            "switchyard_untrusted_headers",
            "Messages from users not in inbound.trusted_users that carried one of the forwarder's headers, ignored and stripped, by header (other: a name the forwarder does not use)",
            untrusted,
        );
        // Counters are registered without `_total`: the encoder appends it.
        r.register(
            "switchyard_messages_consumed",
            "Messages taken from the inbound queue",
            metrics.consumed.clone(),
        );
        r.register(
            "switchyard_messages_forwarded",
            "Copies confirmed by an endpoint, by branch and endpoint",
            metrics.forwarded.family.clone(),
        );
        r.register(
            "switchyard_endpoint_retries",
            "Attempts repeated on the same endpoint (endpoints.X.retries), by branch and endpoint",
            metrics.retries.family.clone(),
        );
        r.register(
            "switchyard_replays",
            "Copies of a session's earlier messages sent again to the endpoint a branch failed over to, by branch and endpoint",
            metrics.replays.family.clone(),
        );
        r.register(
            "switchyard_failovers",
            "Branches that moved from one endpoint of their list to the next",
            metrics.failovers.clone(),
        );
        r.register(
            "switchyard_dead_lettered",
            "Messages dead-lettered, by reason",
            metrics.dead_lettered.clone(),
        );
        r.register(
            "switchyard_confirm_seconds",
            "Time from publishing a copy to its confirm, per confirmed copy",
            metrics.confirm_seconds.clone(),
        );
        r.register(
            "switchyard_in_flight",
            "Inbound messages whose transaction has not ended",
            metrics.in_flight.clone(),
        );
        r.register(
            "switchyard_sessions_open",
            "Sessions open now",
            metrics.sessions_open.clone(),
        );
        r.register(
            "switchyard_outage_holds",
            "Branches holding a message for an outage now; consuming pauses while above 0",
            metrics.outage_holds.clone(),
        );
        r.register(
            "switchyard_broker_node",
            "1 for the node (host:port as configured) a broker's consuming or publishing connection uses, 0 for its other nodes",
            metrics.broker_node.clone(),
        );
        r.register(
            "switchyard_endpoint_up",
            "1 while an endpoint is used, 0 while it is down and probed",
            metrics.endpoint_up.clone(),
        );
        r.register(
            "switchyard_endpoint_state",
            "1 for an endpoint's state now (up, down or drained), 0 for the other two",
            metrics.endpoint_state.clone(),
        );
        r.register(
            "switchyard_paused",
            "1 while the group is paused (no new message taken), 0 otherwise",
            metrics.paused.clone(),
        );
        r.register(
            "switchyard_registrations",
            "Service instances registered into a branch now, by branch",
            metrics.registrations.clone(),
        );
        r.register(
            "switchyard_config_generation",
            "Generation of the routing configuration now live (0 before the first)",
            metrics.config_generation.clone(),
        );
        r.register(
            "switchyard_http_requests",
            "Requests the HTTP ingress answered, by status code",
            metrics.http_requests.clone(),
        );
        r.register(
            "switchyard_http_request_seconds",
            "Time from a request's headers to its answer, per answered request of the HTTP ingress",
            metrics.http_seconds.clone(),
        );
        r.register(
            "switchyard_connections_shed",
            "Connections a listener (admin or ingress) closed to make room for a new one: the one waiting longest without sending a byte when its lobby was full, or one between requests when its slots were",
            metrics.connections_shed.clone(),
        );
        r.register(
            "switchyard_journal_records",
            "Records written to the journal stream and confirmed",
            metrics.journal_records.clone(),
        );
        r.register(
            "switchyard_journal_dropped",
            "Records the journal could not write (its buffer full while the stream could not be written, or left at shutdown)",
            metrics.journal_dropped.clone(),
        );
        r.register(
            "switchyard_journal_writable",
            "1 while the journal's last write was confirmed, 0 while it cannot write (0 with the journal off)",
            metrics.journal_writable.clone(),
        );
        r.register(
            "switchyard_trace_context_malformed",
            "Messages or requests whose traceparent was malformed: a new trace was started",
            metrics.trace_context_malformed.clone(),
        );
        r.register(
            "switchyard_spans_exported",
            "Spans the OTLP collector accepted",
            metrics.spans_exported.clone(),
        );
        r.register(
            "switchyard_spans_dropped",
            "Spans not exported: the export queue was full or the collector refused or could not be reached",
            metrics.spans_dropped.clone(),
        );
        r.register(
            "switchyard_control_records_ignored",
            "Control stream records not applied, by why: writer (its user_id is not one of the group's writers: a producer's), refused (the configuration in force does not allow it)",
            metrics.control_ignored.clone(),
        );
        r.register(
            "switchyard_admin_unauthorized",
            "Requests to the admin endpoint's /control and /registry refused for a missing or wrong token (401)",
            metrics.admin_unauthorized.clone(),
        );
        metrics
    }
}
