//! Consume: deliveries → transactions, under peek-lock.
//!
//! Each delivery is routed and its first publishes submitted inline, in
//! arrival order; the rest of its transaction (confirms, failovers,
//! settlement) runs as a tracked task, so up to `prefetch` messages are in
//! flight and a slow endpoint delays only its own messages. When the
//! consumer is lost it is reopened; transactions of the lost channel finish
//! their publishes, their acks fail, and the broker redelivers them
//! (at-least-once).

use super::Forwarder;
use super::deliver;
use super::outcome::Verdict;
use crate::broker::{InboundSession, Receipt, open_inbound};
use crate::envelope::Envelope;
use crate::telemetry;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Consumes until `shutdown`; returns the session still open, to be closed
/// once in-flight transactions have drained.
pub(super) async fn consume_until(
    forwarder: &Forwarder,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) -> Option<InboundSession> {
    let queue = &forwarder.settings.inbound.queue;
    let mut delay = Duration::from_millis(100);
    while !shutdown.is_cancelled() {
        let mut session =
            match open_inbound(&forwarder.consume_connector, &forwarder.settings).await {
                Ok(session) => session,
                Err(why) => {
                    telemetry::consumer_lost(queue, &why.to_string());
                    tokio::select! {
                        () = shutdown.cancelled() => return None,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
        delay = Duration::from_millis(100);
        telemetry::consuming(queue, forwarder.settings.inbound.prefetch);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                    session.stop_consuming().await;
                    return Some(session);
                }
                next = session.next() => match next {
                    Some(Ok((envelope, receipt))) => dispatch(forwarder, tracker, envelope, receipt),
                    Some(Err(why)) => {
                        telemetry::consumer_lost(queue, &why.to_string());
                        break;
                    }
                    None => {
                        telemetry::consumer_lost(queue, "consumer ended");
                        break;
                    }
                },
            }
        }
        tokio::spawn(session.close());
    }
    None
}

/// Routes one message and starts its transaction.
fn dispatch(forwarder: &Forwarder, tracker: &TaskTracker, envelope: Envelope, receipt: Receipt) {
    telemetry::consumed();
    let envelope = Arc::new(envelope);
    if let Some(verdict) = super::screen::screen(&envelope) {
        let settler = forwarder.settler.clone();
        tracker.spawn(async move { settler.settle(&envelope, receipt, verdict).await });
        return;
    }
    // The transaction keeps the table it was routed with, whatever reloads later.
    let table = forwarder.routing.borrow().clone();
    let plans = table.route(&envelope);
    let settler = forwarder.settler.clone();
    if plans.is_empty() {
        tracker.spawn(async move {
            settler
                .settle(&envelope, receipt, Verdict::no_route())
                .await
        });
        return;
    }
    let started = deliver::start(&envelope, plans, &forwarder.publishers);
    let abandon = forwarder.abandon.clone();
    telemetry::in_flight(1);
    tracker.spawn(async move {
        let transaction = async {
            let outcome = started.finish().await;
            settler.settle(&envelope, receipt, outcome.verdict()).await;
        };
        // Abandoned at the shutdown bound: dropping the receipt requeues the message.
        tokio::select! {
            biased;
            () = abandon.cancelled() => {}
            () = transaction => {}
        }
        telemetry::in_flight(-1);
    });
}
