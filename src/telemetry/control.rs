//! The group's commands as the log and metrics tell them: paused and
//! resumed, endpoints drained and undrained, service instances registered,
//! unregistered and lapsed, and the control stream's own troubles. Tokens
//! are never logged; who sent a command is the instance that took it.

use super::metrics::{BranchLabels, WhyLabels};
use super::{Telemetry, lock, once_a_minute};
use std::fmt::Display;
use std::time::Duration;

impl Telemetry {
    /// The group was paused or resumed (`by`: the instance that took the
    /// command).
    pub fn paused(&self, paused: bool, by: &str) {
        if paused {
            tracing::warn!(
                by,
                "paused: no new message is taken until resumed; work in flight finishes"
            );
        } else {
            tracing::info!(by, "resumed: taking messages again");
        }
        self.metrics.paused.set(i64::from(paused));
    }

    /// An endpoint was drained or undrained.
    pub fn endpoint_drained(&self, endpoint: &str, drained: bool, by: &str) {
        if drained {
            tracing::warn!(
                endpoint,
                by,
                "endpoint drained: every list skips it, without failing it, until undrained"
            );
        } else {
            tracing::info!(endpoint, by, "endpoint undrained: traffic returns to it");
        }
        {
            let mut set = self
                .metrics
                .drained
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if drained {
                set.insert(endpoint.to_owned());
            } else {
                set.remove(endpoint);
            }
        }
        self.endpoint_state(endpoint);
    }

    /// A service instance joined a branch (or changed its destination).
    pub fn registered(&self, branch: &str, endpoint: &str, routing_key: &str, ttl: Duration) {
        lock(&self.metrics.retired).remove(endpoint);
        tracing::info!(
            branch,
            endpoint,
            routing_key,
            ttl_ms = ttl.as_millis() as u64,
            "service instance registered: it joins the branch's list for new messages"
        );
    }

    /// A service instance left a branch: `why` is `unregistered` or
    /// `lapsed` (its lease ended without a renewal).
    pub fn unregistered(&self, branch: &str, endpoint: &str, why: &str) {
        tracing::info!(
            branch,
            endpoint,
            why,
            "service instance left the branch's list"
        );
        lock(&self.metrics.retired).insert(endpoint.to_owned());
        self.forget_endpoint(endpoint);
    }

    /// How many instances are registered into `branch` now.
    pub fn registrations(&self, branch: &str, count: usize) {
        self.metrics
            .registrations
            .get_or_create(&BranchLabels {
                branch: branch.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// The group's state was read back from the control stream: work may
    /// be taken now.
    pub fn control_recovered(&self, stream: &str, paused: bool, drained: usize, registered: usize) {
        tracing::info!(
            stream,
            paused,
            drained,
            registered,
            "group state recovered from the control stream"
        );
    }

    /// The group's state was taken from what the control stream delivered,
    /// without this instance's own marker, which could not be written (a
    /// broker blocking publishers, say): work may be taken now.
    pub fn control_recovered_unmarked(
        &self,
        stream: &str,
        paused: bool,
        drained: usize,
        registered: usize,
    ) {
        tracing::warn!(
            stream,
            paused,
            drained,
            registered,
            "group state taken from the control stream without this instance's marker, which \
             could not be written (does the broker block publishers?)"
        );
    }

    /// The control stream cannot be followed or written now; tried again
    /// after `retry`.
    pub fn control_unavailable(&self, stream: &str, error: &dyn Display, retry: Duration) {
        tracing::warn!(
            stream,
            %error,
            retry_ms = retry.as_millis() as u64,
            "control stream unavailable: commands wait, the state in force stays"
        );
    }

    /// The broker refuses the control stream itself (a permission, a
    /// queue of another type by its name): no work is taken until it is
    /// fixed, as the group's state cannot be known.
    pub fn control_refused(&self, stream: &str, error: &dyn Display, retry: Duration) {
        tracing::error!(
            stream,
            %error,
            retry_ms = retry.as_millis() as u64,
            "the broker refuses the control stream: grant the forwarder's user configure, write \
             and read on it, name another with control.stream, or set [control] enabled = \
             false; no work is taken until the group's state can be read"
        );
    }

    /// A record of the control stream could not be read: skipped.
    /// A control record whose `user_id` is not one of the group's writers
    /// was skipped (a producer's); counted, logged at most once a minute.
    pub fn stream_record_ignored(&self, stream: &str, offset: u64, writer: Option<&str>) {
        self.control_ignored("writer");
        if once_a_minute(&self.metrics.control_ignored_logged_ms, self.now_ms()) {
            tracing::warn!(
                stream,
                offset,
                user_id = writer.unwrap_or("-"),
                "ignored a control record not published by the group's user (inbound.trusted_users \
                 or the stream broker's own): grant no one else write on the stream (logged at \
                 most once a minute; switchyard_control_records_ignored_total counts them all)"
            );
        }
    }

    /// A command record the configuration in force does not allow was not
    /// applied; counted, logged at most once a minute.
    pub fn control_record_refused(&self, offset: u64, instance: &str, refusal: &dyn Display) {
        self.control_ignored("refused");
        if once_a_minute(&self.metrics.control_ignored_logged_ms, self.now_ms()) {
            tracing::warn!(
                offset,
                instance,
                reason = %refusal,
                "a control record was not applied: the configuration in force does not allow it \
                 (logged at most once a minute; switchyard_control_records_ignored_total counts \
                 them all)"
            );
        }
    }

    /// A request to `/control` or `/registry` came without a valid token.
    pub fn admin_unauthorized(&self) {
        self.metrics.admin_unauthorized.inc();
    }

    fn control_ignored(&self, why: &'static str) {
        self.metrics
            .control_ignored
            .get_or_create(&WhyLabels { why })
            .inc();
    }

    pub fn control_record_unreadable(&self, offset: u64, error: &dyn Display) {
        tracing::warn!(offset, %error, "control stream record unreadable; skipped");
    }

    /// The stream was trimmed by retention and no snapshot was found
    /// before this instance's own marker: it knows only what it read.
    pub fn control_state_partial(&self, stream: &str, first: u64) {
        tracing::warn!(
            stream,
            first_offset = first,
            "the control stream's oldest records were trimmed and no snapshot followed: the \
             state known is what the remaining records say"
        );
    }
}
