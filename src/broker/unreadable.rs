//! A message the client cannot read, and the consumer that lets it pass.
//!
//! A content header larger than the connection's `frame_max` (a quorum
//! queue adds `x-delivery-count` when it redelivers, which can take a
//! header just under the limit past it) makes the client close the
//! consuming connection as the frame arrives: the message is neither read
//! nor settled, and the broker returns it, with every unacked message of
//! the connection, to the head of the queue, and delivers it first again.
//! At the full prefetch each such loss would raise the delivery count of
//! the whole window and push the messages behind it towards `poison`.
//!
//! After such a loss the consumer therefore takes messages one at a time
//! (prefetch 1) until those returned with it have passed: the first
//! delivery that is not a redelivery, or as many deliveries as were
//! unacked when it was lost (the prefetch in effect). Each further loss
//! returns the unreadable message alone (a quorum queue puts it behind the
//! messages returned before it, which then pass it), until the queue's
//! delivery limit dead-letters it (see
//! [`crate::config::delivery_limit_policy`]); then the
//! consumer opens again at the configured prefetch (a quorum queue fixes a
//! consumer's prefetch when it consumes, so it is reopened, not re-qos'd).
//!
//! Losses in a row past the queue's expected limit mean no limit ends it
//! (a classic queue, or a quorum queue without one): the consumer then
//! waits a backoff before each reopening, so that it does not reconnect
//! many times a second for as long as the message stays.

use super::error::{BrokerError, Level, code};
use crate::backoff::Backoff;
use crate::config::Inbound;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The first wait between reopenings once no limit ends the losses, and
/// the longest.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Shared by the successive inbound channels of one consume loop: whether
/// they take messages one at a time, and for how long.
#[derive(Debug, Clone, Default)]
pub struct SingleFile(Arc<Mutex<Option<Narrowed>>>);

#[derive(Debug)]
struct Narrowed {
    /// The queue it applies to; another queue (after a reload) starts anew.
    queue: String,
    /// Deliveries still to take one at a time, at most.
    remaining: u32,
    /// Unreadable losses since a message was last read.
    losses: u32,
    /// Losses beyond which no limit is ending them.
    patience: u32,
    backoff: Backoff,
    /// The wait before the next opening.
    delay: Duration,
}

/// How a channel about to open consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Opening {
    /// The prefetch to consume with.
    pub(super) prefetch: u16,
    /// While one at a time: the deliveries still to take so.
    pub(super) remaining: Option<u32>,
    /// How long to wait before opening.
    pub(super) delay: Duration,
}

/// What is known of a loss to an unreadable message, for its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Loss {
    /// Unreadable losses since a message was last read.
    pub(super) losses: u32,
    /// Deliveries the consumer now takes one at a time, at most.
    pub(super) single_file: u32,
    /// The wait before it opens again: none while the losses may be the
    /// queue's limit at work.
    pub(super) delay: Duration,
}

impl SingleFile {
    fn state(&self) -> std::sync::MutexGuard<'_, Option<Narrowed>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How to consume `inbound` now.
    pub(super) fn opening(&self, inbound: &Inbound) -> Opening {
        let mut state = self.state();
        match state.as_mut().filter(|n| n.queue == inbound.queue) {
            Some(narrowed) => Opening {
                prefetch: 1,
                remaining: Some(narrowed.remaining),
                delay: std::mem::take(&mut narrowed.delay),
            },
            None => Opening {
                prefetch: inbound.prefetch,
                remaining: None,
                delay: Duration::ZERO,
            },
        }
    }

    /// The consumer of `inbound` was lost to an unreadable message while
    /// `window` messages could be unacked on it (its prefetch): the next
    /// ones open one at a time, for at least that many deliveries.
    pub(super) fn lost(&self, inbound: &Inbound, window: u16, remaining: Option<u32>) -> Loss {
        let remaining = remaining.unwrap_or(0).max(u32::from(window));
        let mut state = self.state();
        let mut narrowed = match state.take().filter(|n| n.queue == inbound.queue) {
            Some(mut narrowed) => {
                narrowed.losses = narrowed.losses.saturating_add(1);
                narrowed.remaining = remaining;
                narrowed
            }
            None => Narrowed {
                queue: inbound.queue.clone(),
                remaining,
                losses: 1,
                // A quorum queue dead-letters the message after its limit's
                // returns; a classic queue never does.
                patience: inbound
                    .delivery_limit()
                    .map_or(1, |limit| limit.saturating_add(1)),
                backoff: Backoff::new(BACKOFF_FIRST, BACKOFF_MAX),
                delay: Duration::ZERO,
            },
        };
        if narrowed.losses > narrowed.patience {
            narrowed.delay = narrowed.backoff.next_delay();
        }
        let loss = Loss {
            losses: narrowed.losses,
            single_file: narrowed.remaining,
            delay: narrowed.delay,
        };
        *state = Some(narrowed);
        loss
    }

    /// A message was read while taking them one at a time: the unreadable
    /// one is no longer at the head. `remaining` is what is left to take
    /// so; `None` once they have passed.
    pub(super) fn read(&self, remaining: Option<u32>) {
        let mut state = self.state();
        match remaining {
            Some(remaining) => {
                if let Some(narrowed) = state.as_mut() {
                    narrowed.remaining = remaining;
                    narrowed.losses = 0;
                    narrowed.backoff.reset();
                }
            }
            None => *state = None,
        }
    }
}

/// The deliveries still to take one at a time after a delivery
/// (`redelivered` or not) was read with `remaining` left; `None` once the
/// returned messages have passed.
pub(super) fn after_delivery(remaining: u32, redelivered: bool) -> Option<u32> {
    let left = remaining.saturating_sub(1);
    (redelivered && left > 0).then_some(left)
}

/// The size of the frame `error` names when the client closed the
/// connection on a frame larger than `frame_max` (`FRAME_ERROR`, "frame
/// too large: N bytes"); `None` for any other error.
pub(super) fn oversized_frame(error: &BrokerError) -> Option<usize> {
    if error.code != Some(code::FRAME_ERROR) || error.level != Level::Connection {
        return None;
    }
    error
        .text
        .strip_prefix("frame too large: ")?
        .strip_suffix(" bytes")?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::{Opening, SingleFile, after_delivery, oversized_frame};
    use crate::broker::error::{BrokerError, Level};
    use crate::config::Inbound;
    use crate::destination::QueueType;
    use std::time::Duration;

    fn inbound(queue: &str, queue_type: QueueType) -> Inbound {
        Inbound {
            prefetch: 500,
            max_redeliveries: 3,
            ..Inbound::sample(queue, queue_type)
        }
    }

    fn full(prefetch: u16) -> Opening {
        Opening {
            prefetch,
            remaining: None,
            delay: Duration::ZERO,
        }
    }

    #[test]
    fn one_at_a_time_until_the_returned_messages_have_passed() {
        let queue = inbound("q", QueueType::Quorum);
        let single = SingleFile::default();
        assert_eq!(single.opening(&queue), full(500));
        let loss = single.lost(&queue, 500, None);
        assert_eq!((loss.losses, loss.single_file), (1, 500));
        let opening = single.opening(&queue);
        assert_eq!((opening.prefetch, opening.remaining), (1, Some(500)));
        // Two returned messages read, then the unreadable one again: the
        // window is what is left, not the prefetch of one.
        let left = after_delivery(500, true).and_then(|r| after_delivery(r, true));
        assert_eq!(left, Some(498));
        single.read(left);
        let loss = single.lost(&queue, 1, left);
        assert_eq!((loss.losses, loss.single_file), (1, 498));
        // A first delivery: the returned ones have passed.
        assert_eq!(after_delivery(498, false), None);
        single.read(None);
        assert_eq!(single.opening(&queue), full(500));
        // As many deliveries as the window: passed too.
        assert_eq!(after_delivery(1, true), None);
        // Another queue (a reload) starts anew.
        single.lost(&queue, 500, None);
        assert_eq!(
            single.opening(&inbound("other", QueueType::Quorum)),
            full(500)
        );
    }

    #[test]
    fn losses_past_the_limit_back_off_until_a_message_is_read() {
        // max_redeliveries 3: the queue's limit is 4, so up to 5 losses in
        // a row are the limit at work.
        let queue = inbound("q", QueueType::Quorum);
        let single = SingleFile::default();
        for _ in 0..5 {
            assert_eq!(single.lost(&queue, 1, Some(10)).delay, Duration::ZERO);
            assert_eq!(single.opening(&queue).delay, Duration::ZERO);
        }
        let delay = single.lost(&queue, 1, Some(10)).delay;
        assert!(
            delay > Duration::ZERO && delay <= Duration::from_millis(100),
            "{delay:?}"
        );
        assert_eq!(single.opening(&queue).delay, delay);
        assert_eq!(
            single.opening(&queue).delay,
            Duration::ZERO,
            "waited once per loss"
        );
        single.read(Some(9));
        assert_eq!(single.lost(&queue, 1, Some(9)).delay, Duration::ZERO);
        // A classic queue has no limit: the second loss in a row waits.
        let classic = inbound("c", QueueType::Classic);
        let single = SingleFile::default();
        single.lost(&classic, 500, None);
        assert_eq!(single.opening(&classic).delay, Duration::ZERO);
        single.lost(&classic, 1, Some(499));
        assert!(single.opening(&classic).delay > Duration::ZERO);
    }

    #[test]
    fn the_frame_size_is_read_from_the_clients_refusal() {
        let error = |code: u16, level: Level, text: &str| BrokerError {
            code: Some(code),
            level,
            text: text.to_owned(),
        };
        let too_large = "frame too large: 131074 bytes";
        assert_eq!(
            oversized_frame(&error(501, Level::Connection, too_large)),
            Some(131_074)
        );
        let others = [
            error(
                501,
                Level::Connection,
                "heartbeat frame received on channel 1",
            ),
            error(501, Level::Connection, "frame too large: many bytes"),
            error(320, Level::Connection, too_large),
            error(501, Level::Channel, too_large),
        ];
        for other in others {
            assert_eq!(oversized_frame(&other), None, "{other:?}");
        }
    }
}
