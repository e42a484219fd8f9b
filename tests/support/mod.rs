//! Shared support for switchyard's integration tests: configurations as
//! typed values (`config::Forwarder`), a real-broker test client
//! (`TestBroker`), polling helpers, `rabbitmqctl` wrappers, an
//! in-process TCP fault-injection proxy (`FaultProxy`), a listener that
//! never answers (`BlackHole`), an HTTP client and metrics reader for the
//! admin endpoint (`http_get`, `Metrics`), a private RabbitMQ node
//! (`PrivateNode`) for faults the shared broker must not see, and a raw AMQP
//! client (`raw`) for messages a client library cannot be trusted to decode,
//! CPU and memory readings from `/proc` (`procfs`) for measurements, a
//! vhost and user of a test's own (`vhost::TestVhost`) for permission
//! changes, copies counted by body or id (`tally`), a real OTLP/HTTP
//! trace receiver that can answer errors or stall (`otlp`), and the crate
//! root (`repo::root`).
//!
//! Every test names all of its queues, exchanges and connections with a
//! `unique_prefix`, so tests can run in parallel and repeatedly against the
//! same broker.
#![allow(dead_code)]

pub mod broker;
pub mod cluster;
pub mod config;
pub mod control;
pub mod counting;
pub mod harness;
pub mod http;
pub mod ingress;
pub mod journal;
pub mod node;
pub mod otlp;
pub mod polling;
pub mod procfs;
pub mod proxy;
pub mod rabbitmqctl;
pub mod raw;
pub mod repo;
pub mod sessions;
pub mod vhost;

// Each test binary uses a different part of the kit.
#[allow(unused_imports)]
pub use broker::*;
#[allow(unused_imports)]
pub use counting::*;
#[allow(unused_imports)]
pub use http::*;
#[allow(unused_imports)]
pub use node::*;
#[allow(unused_imports)]
pub use polling::*;
#[allow(unused_imports)]
pub use proxy::*;
#[allow(unused_imports)]
pub use rabbitmqctl::*;
