//! Sessions: a transaction over a set of messages that grows as they
//! arrive, forwarded in order, each branch keeping its endpoint and
//! replaying the set on failover. One session set (`set`) serves both
//! sources with the same rules; the sources differ only in how they hold
//! a session's messages and how they report.
//!
//! A message whose `sessions.id_header` has a non-empty text value belongs
//! to that session (`membership`). The set hands it:
//! - to the session's task when the session is open;
//! - to a new task when a slot is free (at most `sessions.max_open`);
//! - when every slot is taken: from the queue, to the waiting line (the
//!   session's messages stay unacked and unforwarded until a slot frees,
//!   while independent messages and open sessions keep flowing); over
//!   HTTP, back to the caller (`429`);
//! - and when the session was completed or ended less than
//!   `sessions.closed_ttl_ms` ago, the message is turned away as
//!   `session-closed` (dead-lettered alone, or refused `409`), so no
//!   service receives a set with a hole in it; unless `dlq redrive` sent
//!   it (it carries `x-switchyard-only`): a redriven set opens the session
//!   anew.
//!
//! Each task (`task` for the queue, `http` for callers) takes its
//! session's messages through one [`progress::Progress`]: the size limit,
//! the end marker, the branches chosen by the first message, and the idle
//! timeout (a timer in the task, for both). A queue session is settled as
//! one unit; one whose inbound channel is lost, or that is open when the
//! consumer stops, is abandoned: nothing of it is settled and the broker
//! redelivers the whole set, which is then forwarded again from its first
//! message. An HTTP request is answered once its own message is confirmed
//! on every branch.

mod http;
mod membership;
mod progress;
mod queue;
mod set;
mod task;
#[cfg(test)]
mod tests;

pub(crate) use http::{HttpSessions, Refused};
#[cfg(test)]
pub(crate) use membership::MAX_SESSION_ID_BYTES;
pub(crate) use membership::{Arrival, oversized_id};
pub(crate) use queue::Sessions;
