//! Consume: deliveries → transactions, under peek-lock.
//!
//! Each delivery is routed and its first publishes submitted inline, in
//! arrival order; the rest of its transaction (confirms, failovers,
//! settlement) runs as a tracked task, so a slow endpoint delays only its
//! own messages. A permit per message bounds the work in flight by
//! `prefetch`, across consumer reconnects too: a transaction keeps its
//! permit until it ends, even when the channel it came on is gone. While a
//! publishing broker blocks publishers (a resource alarm), no new message is
//! taken. When the consumer is lost it is reopened (the queue re-declared
//! first when `inbound.declare` is on); transactions of the lost channel
//! start no new publishes, and the broker redelivers their messages
//! (at-least-once).

use super::Forwarder;
use super::deliver;
use super::outcome::Verdict;
use crate::broker::{InboundChannel, Receipt, open_inbound, redeclare_inbound};
use crate::envelope::Envelope;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Consumes until `shutdown`; returns the channel still open, to be closed
/// once in-flight transactions have drained.
pub(super) async fn consume_until(
    forwarder: &Forwarder,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) -> Option<InboundChannel> {
    let queue = &forwarder.settings.inbound.queue;
    let telemetry = &forwarder.telemetry;
    let mut delay = Duration::from_millis(100);
    let mut reopening = false;
    while !shutdown.is_cancelled() {
        if reopening && forwarder.settings.inbound.declare {
            // A deleted inbound queue comes back; anything else is logged by
            // the open below.
            let _ = redeclare_inbound(forwarder.topology_connector(), &forwarder.settings).await;
        }
        reopening = true;
        let mut inbound =
            match open_inbound(&forwarder.consume_connector, &forwarder.settings).await {
                Ok(inbound) => inbound,
                Err(why) => {
                    telemetry.consumer_lost(queue, &why.to_string());
                    tokio::select! {
                        () = shutdown.cancelled() => return None,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
        delay = Duration::from_millis(100);
        telemetry.consuming(queue, forwarder.settings.inbound.prefetch);
        forwarder.consuming.store(true, Ordering::Relaxed);
        loop {
            let ready = async {
                let permit = forwarder.permits.clone().acquire_owned().await;
                forwarder.wait_until_publishing().await;
                permit
            };
            let permit = tokio::select! {
                biased;
                () = shutdown.cancelled() => None,
                permit = ready => permit.ok(),
            };
            let Some(permit) = permit else {
                forwarder.consuming.store(false, Ordering::Relaxed);
                inbound.stop_consuming().await;
                return Some(inbound);
            };
            tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                    forwarder.consuming.store(false, Ordering::Relaxed);
                    inbound.stop_consuming().await;
                    return Some(inbound);
                }
                next = inbound.next() => match next {
                    Some(Ok((envelope, receipt))) => {
                        dispatch(forwarder, tracker, envelope, receipt, permit)
                    }
                    Some(Err(why)) => {
                        telemetry.consumer_lost(queue, &why.to_string());
                        break;
                    }
                    None => {
                        telemetry.consumer_lost(queue, "consumer ended");
                        break;
                    }
                },
            }
        }
        forwarder.consuming.store(false, Ordering::Relaxed);
        inbound.mark_lost();
        tokio::spawn(inbound.close());
    }
    None
}

/// Routes one message and starts its transaction, which holds `permit`.
fn dispatch(
    forwarder: &Forwarder,
    tracker: &TaskTracker,
    envelope: Envelope,
    receipt: Receipt,
    permit: OwnedSemaphorePermit,
) {
    let telemetry = forwarder.telemetry.clone();
    telemetry.consumed();
    let envelope = Arc::new(envelope);
    let refused = forwarder.screen.check(&envelope);
    let started = match refused {
        Some(verdict) => Err(verdict),
        None => {
            // The transaction keeps the table it was routed with, whatever reloads later.
            let table = forwarder.routing.borrow().clone();
            let plans = table.route(&envelope);
            if plans.is_empty() {
                Err(Verdict::no_route())
            } else {
                Ok(deliver::start(&envelope, plans, &forwarder.publishers))
            }
        }
    };
    let settler = forwarder.settler.clone();
    let abandon = forwarder.abandon.clone();
    telemetry.transaction_started();
    tracker.spawn(async move {
        let transaction = async {
            let verdict = match started {
                Ok(started) => started.finish(receipt.lost()).await.verdict(),
                Err(verdict) => verdict,
            };
            settler.settle(&envelope, receipt, verdict).await;
        };
        // Abandoned at the shutdown bound: dropping the receipt requeues the message.
        tokio::select! {
            biased;
            () = abandon.cancelled() => {}
            () = transaction => {}
        }
        drop(permit);
        telemetry.transaction_ended();
    });
}
