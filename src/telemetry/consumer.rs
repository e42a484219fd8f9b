//! The inbound consumer: lost, cancelled, moving node, stopping, and
//! consuming again; a message it cannot read, and the inbound queue's
//! delivery limit that ends one.

use super::{Telemetry, millis};
use std::time::Duration;

/// What is known of a consumer lost to a message the client cannot read:
/// not its id, nor anything else the unread header holds.
#[derive(Debug, Clone, Copy)]
pub struct UnreadableLoss {
    /// The size of its content header frame.
    pub frame: usize,
    /// The connection's negotiated `frame_max`.
    pub frame_max: u32,
    /// Messages the consumer held unacked, which the broker returns with it.
    pub held_unacked: usize,
    /// Such losses since a message was last read.
    pub losses: u32,
    /// Deliveries the consumer now takes one at a time, at most.
    pub single_file: u32,
    /// The wait before consuming again (none while the queue's delivery
    /// limit may be what ends the losses).
    pub next_try: Duration,
    /// The delivery limit switchyard declares on the queue; `None` for a
    /// classic queue, which has none.
    pub delivery_limit: Option<u32>,
}

impl Telemetry {
    /// The inbound consumer was lost and is being reopened.
    pub fn consumer_lost(&self, queue: &str, error: &str) {
        tracing::warn!(queue, error, "inbound consumer lost; reconnecting");
    }

    /// `basic.cancel` was not answered within `bound`: the consumer is left
    /// as it is; what the broker still delivers goes back to the queue when
    /// the channel closes.
    pub fn consumer_stop_timed_out(&self, queue: &str, bound: Duration) {
        tracing::warn!(
            queue,
            bound_ms = millis(bound),
            "stopping the inbound consumer timed out; what the broker still delivers goes back \
             to the queue when the channel closes"
        );
    }

    /// The settlements of an inbound channel being closed did not all go
    /// out within `bound`: the channel closes with `unacked` messages that
    /// the broker redelivers.
    pub fn inbound_close_timed_out(&self, queue: &str, unacked: usize, bound: Duration) {
        tracing::warn!(
            queue,
            unacked,
            bound_ms = millis(bound),
            "inbound channel closed with messages unacked; the broker redelivers them"
        );
    }

    /// The broker cancelled the consumer on a channel still open: it
    /// consumes again once the messages it holds have settled there.
    pub fn consumer_cancelled(&self, queue: &str) {
        tracing::warn!(
            queue,
            "inbound consumer cancelled by the broker (a quorum queue moving its leader, or the \
             queue deleted); consuming again once its messages have settled"
        );
    }

    /// The consumer's broker connection moved to a more preferred node: the
    /// consumer stops, lets its messages settle, and consumes there.
    pub fn consumer_moving(&self, queue: &str) {
        tracing::info!(
            queue,
            "consumer moving to a more preferred node once its messages have settled"
        );
    }

    /// The inbound consumer is (again) consuming.
    pub fn consuming(&self, queue: &str, prefetch: u16) {
        tracing::info!(queue, prefetch, "consuming");
    }

    /// The quorum inbound queue has a delivery limit above
    /// `max_redeliveries` and a dead-letter exchange for a message at it.
    pub fn delivery_limit(&self, queue: &str, limit: i64) {
        tracing::info!(
            queue,
            delivery_limit = limit,
            "inbound queue has a delivery limit: the broker dead-letters a message returned more \
             often (reason delivery_limit), one the client cannot read included"
        );
    }

    /// The quorum inbound queue's delivery limit is not above
    /// `max_redeliveries`: the broker dead-letters messages before the
    /// screen would.
    pub fn delivery_limit_under_screen(&self, queue: &str, limit: i64, max_redeliveries: u32) {
        tracing::warn!(
            queue,
            delivery_limit = limit,
            max_redeliveries,
            "inbound queue's delivery limit is not above inbound.max_redeliveries: the broker \
             dead-letters a message returned that often (reason delivery_limit, without \
             switchyard's record) before switchyard would call it poison"
        );
    }

    /// The quorum inbound queue has a delivery limit but no dead-letter
    /// exchange argument: `fix` is the policy that gives it one.
    pub fn delivery_limit_drops(&self, queue: &str, limit: i64, fix: &str) {
        tracing::warn!(
            queue,
            delivery_limit = limit,
            fix,
            "inbound queue has a delivery limit but no dead-letter exchange: unless a policy \
             gives it one, the broker drops a message at the limit, one the client cannot read \
             included; set one"
        );
    }

    /// The quorum inbound queue has no `x-delivery-limit`: `fix` is the
    /// policy that sets one.
    pub fn delivery_limit_missing(&self, queue: &str, fix: &str) {
        tracing::warn!(
            queue,
            fix,
            "inbound queue has no x-delivery-limit: unless a policy sets delivery-limit \
             (switchyard cannot see policies), a message whose header the client cannot read \
             comes back for ever and holds up the queue; set one"
        );
    }

    /// The consumer was lost to a message whose content header the client
    /// cannot read; it consumes one message at a time until the messages
    /// returned with it have passed.
    pub fn unreadable_message(&self, queue: &str, loss: &UnreadableLoss) {
        let ends = match loss.delivery_limit {
            Some(limit) => format!(
                "a quorum queue dead-letters it once returned more often than its delivery limit \
                 (reason delivery_limit): switchyard creates the queue with {limit}, and \
                 `switchyard check` prints the policy for a queue created without it"
            ),
            None => "a classic queue has no delivery limit: it comes back until it is removed"
                .to_owned(),
        };
        tracing::warn!(
            queue,
            frame_bytes = loss.frame,
            frame_max = loss.frame_max,
            held_unacked = loss.held_unacked,
            losses = loss.losses,
            single_file = loss.single_file,
            next_try_ms = millis(loss.next_try),
            ends = ends.as_str(),
            "a message whose content header is over frame_max closed the consuming connection \
             (its id is unknown: the client cannot read it); the broker returns it with the \
             unacked messages; consuming one at a time until they have passed"
        );
    }

    /// The messages returned with one the client could not read have
    /// passed: the consumer opens again at `prefetch`.
    pub fn unreadable_passed(&self, queue: &str, prefetch: u16) {
        tracing::info!(
            queue,
            prefetch,
            "the messages returned with an unreadable one have passed; consuming at the \
             configured prefetch again"
        );
    }
}
