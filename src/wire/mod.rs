//! The wire contract: every `x-switchyard-*` header the forwarder reads or
//! writes, named once, and [`trust`], which decides once per delivery which
//! of them count. Producers' headers with the [`OWN_PREFIX`] are never
//! forwarded as they came: each copy and dead letter carries only what the
//! forwarder itself sets ([`foreign`] is what it keeps), and only a trusted
//! message's annotations are read (docs/configuration.md lists them with
//! their meaning, docs/guarantees.md who may write them).

pub mod traceparent;
pub mod trust;

pub use traceparent::{TRACEPARENT, TRACESTATE, Trace, nonzero_u64};
pub use trust::{Annotations, Ignored, Kind, Reading, Trust};

use crate::amqp::{AmqpValue, FieldTable, ShortString};

/// Prefix of every header the forwarder owns; producers' are stripped.
pub const OWN_PREFIX: &str = "x-switchyard-";

/// The only branches a message should reach (set by `dlq redrive`).
pub const ONLY: &str = "x-switchyard-only";
/// Set by `dlq redrive` on what it puts back: a closed session opens anew.
pub const REDRIVEN: &str = "x-switchyard-redriven";
/// How many times a message was forwarded.
pub const HOPS: &str = "x-switchyard-hops";
/// The identity of one publish attempt, for attributing returns.
pub const PUBLISH_ID: &str = "x-switchyard-publish-id";
/// A copy a branch sends again to its next endpoint after a failover
/// mid-session.
pub const REPLAY: &str = "x-switchyard-replay";
/// On a session's dead letters, the session they belong to.
pub const SESSION: &str = "x-switchyard-session";
/// On every copy: the same for every delivery of one inbound message to one
/// branch, on every redelivery and every forwarder instance, for consumers
/// that deduplicate (`Envelope::copy_id` says how it is made).
pub const COPY_ID: &str = "x-switchyard-copy-id";
/// The startup probe of the dead-letter route, which is not a dead letter.
pub const PROBE: &str = "x-switchyard-probe";

/// Why a message was dead-lettered (a reason word).
pub const REASON: &str = "x-switchyard-reason";
/// A dead letter's last error, one line.
pub const ERROR: &str = "x-switchyard-error";
/// The branches that failed (an array of names).
pub const FAILED: &str = "x-switchyard-failed";
/// For each branch of [`FAILED`] in the same order, the endpoint that
/// refused it last (`""`: none was tried).
pub const FAILED_ENDPOINTS: &str = "x-switchyard-failed-endpoints";
/// The branches already delivered (an array of names).
pub const DELIVERED: &str = "x-switchyard-delivered";
/// The queue the message was consumed from.
pub const SOURCE_QUEUE: &str = "x-switchyard-source-queue";
/// When it was dead-lettered, in unix milliseconds.
pub const DEAD_LETTERED_AT: &str = "x-switchyard-dead-lettered-at";
/// On a dead letter the broker refused as it was: how many of the
/// producer's headers were left out.
pub const REMOVED_HEADERS: &str = "x-switchyard-removed-headers";

/// Header in which quorum queues count earlier deliveries (the broker's,
/// not the forwarder's).
pub const DELIVERY_COUNT: &str = "x-delivery-count";

/// Every header of the forwarder's, in a fixed order: the labels of
/// `switchyard_untrusted_headers_total` (any other `x-switchyard-*` name
/// counts as `other`).
pub const KNOWN: [&str; 16] = [
    ONLY,
    HOPS,
    REDRIVEN,
    PUBLISH_ID,
    REPLAY,
    SESSION,
    COPY_ID,
    PROBE,
    REASON,
    ERROR,
    FAILED,
    FAILED_ENDPOINTS,
    DELIVERED,
    SOURCE_QUEUE,
    DEAD_LETTERED_AT,
    REMOVED_HEADERS,
];

/// Whether header `name` is the forwarder's to write.
pub fn is_own(name: &str) -> bool {
    name.starts_with(OWN_PREFIX)
}

/// The headers of `headers` that are not the forwarder's: what a copy or a
/// dead letter keeps of a message's own headers, whoever sent it.
pub fn foreign(headers: &FieldTable) -> impl Iterator<Item = (&ShortString, &AmqpValue)> {
    headers
        .inner()
        .iter()
        .filter(|(name, _)| !is_own(name.as_str()))
}
