//! Sessions: a transaction over a set of inbound messages that grows as
//! they arrive, forwarded in order and settled as one unit.
//!
//! A message whose `sessions.id_header` has a non-empty text value belongs
//! to that session; `Sessions::admit` hands it over:
//! - to the session's task when the session is open;
//! - to a new task when a slot is free (at most `sessions.max_open`);
//! - otherwise to the waiting line: the session's messages stay unacked and
//!   unforwarded until a slot frees, while independent messages and open
//!   sessions keep flowing;
//! - and when the session was completed or dead-lettered less than
//!   `sessions.closed_ttl_ms` ago, the message is dead-lettered alone as
//!   `session-closed`, so no service receives a set with a hole in it;
//!   unless `dlq redrive` sent it (it carries `x-switchyard-only`): a
//!   redriven set opens the session anew.
//!
//! The task (`task`) forwards the set through the delivery engine, each
//! branch a run that keeps its endpoint and replays on failover, and
//! settles it. `registry` keeps the slots and the closed sessions;
//! `membership` says which session a message belongs to and whether it
//! ends it. A session whose inbound channel
//! is lost, or that is open when the consumer stops, is abandoned: nothing
//! of it is settled and the broker redelivers the whole set, which is then
//! forwarded again from its first message.

mod membership;
mod registry;
mod task;
#[cfg(test)]
mod tests;

pub(crate) use membership::{Arrival, is_end, oversized_id, session_id};
pub(crate) use registry::Sessions;
