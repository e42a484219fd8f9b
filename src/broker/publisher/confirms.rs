//! A confirm as it comes back from the wire, kept compact, with the
//! channel it went out on; and the two steps attribution takes over them:
//! collecting every confirm ready now, and passing lapin's acknowledgement
//! lock once (the fence, see `Actor::harvest`).

use crate::broker::error::BrokerError;
use crate::envelope::value_text;
use crate::wire;
use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::message::BasicReturnMessage;
use lapin::{BasicProperties, Channel, Confirmation};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A channel as the actor holds it. Every publish keeps a handle to the
/// channel it went out on (for the fence in [`Actor::harvest`]). Cloning a
/// lapin `Channel` bumps some fifteen reference counts that its I/O thread
/// also touches. One `Arc` per publish instead, with a leaner consume loop,
/// took about 3% off the forwarder's instructions per message
/// (BENCHMARKS.md, "Instructions per message").
pub(super) type SharedChannel = Arc<Channel>;

/// One publish's confirm: its id, the channel it went out on, the result.
pub(super) type Confirmed = (u64, SharedChannel, Confirm);

/// A confirm as the actor keeps it. lapin's `Confirmation` is some 470
/// bytes, nearly all of it room for a returned message that is rarely
/// there, and each confirm is moved several times between the wire and its
/// decision: the returned message is boxed instead, when there is one.
pub(super) enum Confirm {
    Ack(Option<Box<BasicReturnMessage>>),
    Nack(Option<Box<BasicReturnMessage>>),
    NotRequested,
    Failed(BrokerError),
}

impl From<lapin::Result<Confirmation>> for Confirm {
    fn from(result: lapin::Result<Confirmation>) -> Self {
        match result {
            Ok(Confirmation::Ack(returned)) => Self::Ack(returned.map(Box::new)),
            Ok(Confirmation::Nack(returned)) => Self::Nack(returned.map(Box::new)),
            Ok(Confirmation::NotRequested) => Self::NotRequested,
            Err(e) => Self::Failed(BrokerError::from_lapin(&e)),
        }
    }
}
pub(super) type InFlight = Pin<Box<dyn Future<Output = Confirmed> + Send>>;

/// Moves every confirm that is ready now into `into`.
pub(super) fn drain_ready(in_flight: &mut FuturesUnordered<InFlight>, into: &mut Vec<Confirmed>) {
    while let Some(Some(done)) = in_flight.next().now_or_never() {
        into.push(done);
    }
}

/// Takes and releases the acknowledgement lock of every channel in `batch`
/// (`wait_for_confirms` takes it first thing; it is not awaited), so a
/// multiple-ack walk that was in progress has completed.
pub(super) fn fence(batch: &[Confirmed]) {
    let mut fenced: Vec<u16> = Vec::new();
    for (_, channel, _) in batch {
        if !fenced.contains(&channel.id()) {
            fenced.push(channel.id());
            let _ = channel.wait_for_confirms().now_or_never();
        }
    }
}

pub(super) fn publish_id(properties: &BasicProperties) -> Option<u64> {
    let value = properties
        .headers()
        .as_ref()?
        .inner()
        .get(wire::PUBLISH_ID)?;
    value_text(value)?.parse().ok()
}
