//! The inbound consumer: lost, cancelled, moving node, stopping, and
//! consuming again; the inbound queue's delivery limit.

use super::{Telemetry, millis};
use std::time::Duration;

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
            "inbound queue has no x-delivery-limit: unless a policy sets delivery-limit (switchyard \
             cannot see policies), a message whose header the client cannot read comes back for \
             ever and holds up the queue; set one"
        );
    }
}
