//! Every lapin type lives behind this module: connections, confirm channels,
//! the inbound consumer and its acknowledgements, topology declarations and
//! reconnection. The rest of the crate speaks in envelopes, endpoints and
//! outcomes.
//!
//! - `connector`: one supervised connection per broker and role, rebuilt
//!   on demand with jittered backoff.
//! - `publisher`: one long-lived confirm channel per endpoint; many
//!   publishes in flight, each confirm (and return) attributed to its own
//!   publish.
//! - `inbound`: the consuming connection: qos, peek-lock consume, and the
//!   settle actor that batches acks.
//! - `unreadable`: a message the client cannot read (a header over
//!   `frame_max`), and the one-at-a-time consumer that lets it pass.
//! - `topology`: startup declarations and the dead-letter checks.
//! - `dlq_reader`: the dead-letter queue read without removing, and
//!   copies put back on the inbound queue, for `dlq inspect` / `redrive`.
//! - `journal_reader`: the journal's stream read for `switchyard trace`:
//!   checked, its tail found, followed from a point in time.
//! - `error`: broker errors with their reply codes, classified by fault.
//! - `health`: endpoint health, marked by publishers, read by deliveries.
//! - `registry`: the publishers of one configuration by endpoint, behind
//!   the `Publish` seam the delivery engine uses.
//! - [`frame_size`]: content header size, checked before publishing.
//! - `tls`: the PEM files of `amqps://` brokers, read at load time, and
//!   TLS failures told apart from other connect errors.

mod closing;
mod connector;
mod control_stream;
mod dlq_reader;
mod error;
pub mod frame_size;
mod health;
mod inbound;
mod journal_channel;
mod journal_reader;
mod publisher;
mod registry;
mod stream_append;
mod tls;
mod topology;
mod unreadable;

#[cfg(test)]
pub(crate) use connector::ConnectFailure;
pub(crate) use connector::{Blocking, ConnectError, Connector, Role};
pub(crate) use control_stream::{ControlStream, ControlStreamError, Start, StreamRecord};
pub(crate) use dlq_reader::{DlqReader, ReadError, RepublishError};
#[cfg(test)]
pub(crate) use error::BrokerError;
pub(crate) use error::{Level, code};
pub(crate) use health::{Drains, EndpointHealth};
pub(crate) use inbound::{ConsumeError, InboundChannel, Receipt, open_inbound};
#[cfg(test)]
pub(crate) use inbound::{Settled, SettledLog};
pub(crate) use journal_channel::{BATCH_RECORDS, JournalChannel, JournalWriteError};
pub use journal_reader::{Batch, Follower, JournalReadError, JournalReader};
pub(crate) use publisher::{Mode, PublishFailure, Publisher, Refusal};
pub(crate) use registry::{Attempt, Health, Publish, Publishers};
pub(crate) use topology::{
    TopologyError, declare_endpoint_queue, prepare_inbound, redeclare_inbound,
};
pub(crate) use unreadable::SingleFile;
