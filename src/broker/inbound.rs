//! The inbound side: qos, peek-lock consume, and settlement.
//!
//! Deliveries become [`Envelope`]s with a [`Receipt`]. Receipts are settled
//! through one task per channel that keeps delivery order: every ack it
//! sends covers only settled messages, a run of settled messages at the head
//! goes out as one `multiple` ack, and a slow message holds back the acks
//! of the messages behind it for no more than [`BEHIND_ACK_DELAY`]. A
//! receipt dropped unsettled requeues its message, so nothing leaks a
//! prefetch slot.
//!
//! A consumer lost to a message the client cannot read opens the next ones
//! one message at a time until the messages returned with it have passed
//! (see `unreadable`).

use super::closing::close_channel;
use super::connector::{ConnectError, Connector};
use super::error::{BrokerError, code};
use super::unreadable::{SingleFile, after_delivery, oversized_frame};
use crate::amqp::{FieldTable, short_text};
use crate::config::Inbound;
use crate::destination::QueueType;
use crate::envelope::Envelope;
use crate::telemetry::{Telemetry, UnreadableLoss};
use crate::wire::{Annotations, Reading, Trust};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::{Channel, Consumer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long stopping the consumer waits for `basic.cancel-ok`, and closing
/// the channel for its pending settlements to go out.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why consuming could not start or stopped. Transient: reopen later.
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    /// No channel to the inbound broker.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// `basic.qos` or `basic.consume` was refused.
    #[error("cannot consume from \"{queue}\": {error}")]
    Consume {
        /// The inbound queue.
        queue: String,
        /// The broker's answer.
        #[source]
        error: BrokerError,
    },
    /// `basic.qos` or `basic.consume` was not answered in time.
    #[error("cannot consume from \"{queue}\": no answer within {} s", OPEN_TIMEOUT.as_secs())]
    Unanswered {
        /// The inbound queue.
        queue: String,
    },
    /// The consumer failed while delivering.
    #[error("consumer failed: {0}")]
    Delivery(#[source] BrokerError),
    /// A delivery's content header was larger than the connection's
    /// `frame_max`: the client closed the connection on it.
    #[error(
        "a delivery's content header frame of {frame} bytes exceeds frame_max {frame_max}: \
         the client cannot read it"
    )]
    Unreadable {
        /// The frame's size in bytes.
        frame: usize,
        /// The connection's negotiated `frame_max`.
        frame_max: u32,
    },
}

impl ConsumeError {
    /// Whether the broker said the inbound queue does not exist.
    pub fn queue_not_found(&self) -> bool {
        matches!(self, Self::Consume { error, .. } if error.code == Some(code::NOT_FOUND))
    }

    /// Whether a message the client cannot read ended the consumer (already
    /// logged, with what is known of it).
    pub fn unreadable(&self) -> bool {
        matches!(self, Self::Unreadable { .. })
    }
}

/// A consuming channel with its settle task.
pub struct InboundChannel {
    channel: Channel,
    /// Cancelled once the channel is lost: its receipts can no longer settle.
    lost: CancellationToken,
    consumer: Consumer,
    consumer_tag: String,
    settle: mpsc::UnboundedSender<Settle>,
    settler: JoinHandle<()>,
    /// Messages delivered and not yet acked or rejected, as the settle task
    /// last counted them: what the broker redelivers if it is cut short.
    unacked: Arc<AtomicUsize>,
    /// How its deliveries' headers are read.
    reading: Reading,
    inbound: Inbound,
    /// The prefetch it consumes with: `inbound.prefetch`, or 1 while the
    /// messages returned with an unreadable one pass.
    prefetch: u16,
    /// The connection's negotiated `frame_max`.
    frame_max: u32,
    single_file: SingleFile,
    /// While one at a time: the deliveries still to take so.
    remaining: Option<u32>,
    /// The returned messages have just passed; see [`InboundChannel::returned_passed`].
    passed: bool,
    telemetry: Telemetry,
}

enum Settle {
    Track(u64),
    Ack(u64),
    Reject { tag: u64, requeue: bool },
}

/// The right to settle one inbound message, exactly once.
pub struct Receipt {
    tag: u64,
    settle: Option<mpsc::UnboundedSender<Settle>>,
    lost: CancellationToken,
}

impl Receipt {
    /// Cancelled when the channel this message came on is lost: it can no
    /// longer be acked, and the broker will redeliver it.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Acknowledge: the message is done.
    pub fn ack(mut self) {
        if let Some(settle) = self.settle.take() {
            let _ = settle.send(Settle::Ack(self.tag));
        }
    }

    /// `basic.nack`: dead-letter it through the queue's DLX (`requeue =
    /// false`) or hand it back to the queue (`requeue = true`).
    pub fn reject(mut self, requeue: bool) {
        if let Some(settle) = self.settle.take() {
            let _ = settle.send(Settle::Reject {
                tag: self.tag,
                requeue,
            });
        }
    }
}

/// How a message was settled, as a test reads it back.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Acked.
    Ack,
    /// Nacked without requeue: dead-lettered through the queue's DLX.
    DeadLetter,
    /// Handed back to the queue (nacked with requeue, or dropped).
    Requeue,
}

/// Receipts that settle into a log instead of a channel, for unit tests of
/// what the pipeline settles.
#[cfg(test)]
pub struct SettledLog {
    sender: mpsc::UnboundedSender<Settle>,
    log: mpsc::UnboundedReceiver<Settle>,
    lost: CancellationToken,
}

#[cfg(test)]
impl Default for SettledLog {
    /// An empty log whose receipts share one inbound channel.
    fn default() -> Self {
        let (sender, log) = mpsc::unbounded_channel();
        Self {
            sender,
            log,
            lost: CancellationToken::new(),
        }
    }
}

#[cfg(test)]
impl SettledLog {
    /// A receipt for delivery `tag`.
    pub fn receipt(&self, tag: u64) -> Receipt {
        Receipt {
            tag,
            settle: Some(self.sender.clone()),
            lost: self.lost.clone(),
        }
    }

    /// Every settlement so far, by tag, in order.
    pub fn drain(&mut self) -> Vec<(u64, Settled)> {
        let mut out = Vec::new();
        while let Ok(settle) = self.log.try_recv() {
            out.push(match settle {
                Settle::Track(_) => continue,
                Settle::Ack(tag) => (tag, Settled::Ack),
                Settle::Reject {
                    tag,
                    requeue: false,
                } => (tag, Settled::DeadLetter),
                Settle::Reject { tag, requeue: true } => (tag, Settled::Requeue),
            });
        }
        out
    }
}

impl Drop for Receipt {
    fn drop(&mut self) {
        if let Some(settle) = self.settle.take() {
            let _ = settle.send(Settle::Reject {
                tag: self.tag,
                requeue: true,
            });
        }
    }
}

/// Opens a consuming channel on `connector`: qos, then `basic.consume` with
/// manual acks; one message at a time while `single_file` says so.
pub async fn open_inbound(
    connector: &Connector,
    name: &str,
    inbound: &Inbound,
    single_file: &SingleFile,
) -> Result<InboundChannel, ConsumeError> {
    let opening = single_file.opening(inbound);
    if !opening.delay.is_zero() {
        tokio::time::sleep(opening.delay).await;
    }
    let channel = connector.channel(false, OPEN_TIMEOUT).await?;
    let consumer_tag = format!("{name}-{}", uuid::Uuid::new_v4().simple());
    let start = async {
        channel
            .basic_qos(opening.prefetch, BasicQosOptions { global: false })
            .await?;
        channel
            .basic_consume(
                inbound.queue.as_str().into(),
                consumer_tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
    };
    let consumer = match tokio::time::timeout(OPEN_TIMEOUT, start).await {
        Ok(Ok(consumer)) => consumer,
        Ok(Err(e)) => {
            return Err(ConsumeError::Consume {
                queue: inbound.queue.clone(),
                error: BrokerError::from_lapin(&e),
            });
        }
        Err(_) => {
            return Err(ConsumeError::Unanswered {
                queue: inbound.queue.clone(),
            });
        }
    };
    let (settle, rx) = mpsc::unbounded_channel();
    let unacked = Arc::new(AtomicUsize::new(0));
    let settler = tokio::spawn(settle_loop(channel.clone(), rx, unacked.clone()));
    Ok(InboundChannel {
        channel,
        lost: CancellationToken::new(),
        consumer,
        consumer_tag,
        settle,
        settler,
        unacked,
        reading: reading(inbound),
        inbound: inbound.clone(),
        prefetch: opening.prefetch,
        frame_max: connector.frame_max(),
        single_file: single_file.clone(),
        remaining: opening.remaining,
        passed: false,
        telemetry: connector.telemetry().clone(),
    })
}

/// How deliveries of the `inbound` queue are read.
pub fn reading(inbound: &Inbound) -> Reading {
    Reading {
        trust: Trust::new(inbound.trusted_users.clone()),
        quorum: inbound.queue_type == QueueType::Quorum,
    }
}

impl InboundChannel {
    /// The next delivery. `None` when the consumer ended (channel or
    /// connection lost, or cancelled); the caller reopens.
    pub async fn next(&mut self) -> Option<Result<(Envelope, Receipt), ConsumeError>> {
        let delivery = match self.consumer.next().await? {
            Ok(delivery) => delivery,
            Err(e) => return Some(Err(self.failed(&e))),
        };
        if let Some(remaining) = self.remaining {
            self.remaining = after_delivery(remaining, delivery.redelivered);
            self.single_file.read(self.remaining);
            if self.remaining.is_none() {
                self.passed = true;
                self.telemetry
                    .unreadable_passed(&self.inbound.queue, self.inbound.prefetch);
            }
        }
        let tag = delivery.delivery_tag;
        let _ = self.settle.send(Settle::Track(tag));
        let annotations =
            Annotations::read(&delivery.properties, delivery.redelivered, &self.reading);
        let envelope = Envelope {
            delivery_tag: tag,
            exchange: short_text(&delivery.exchange).into_owned(),
            routing_key: short_text(&delivery.routing_key).into_owned(),
            redelivered: delivery.redelivered,
            properties: delivery.properties,
            body: delivery.data,
            annotations,
        };
        let receipt = Receipt {
            tag,
            settle: Some(self.settle.clone()),
            lost: self.lost.clone(),
        };
        Some(Ok((envelope, receipt)))
    }

    /// Why the consumer failed. A message the client cannot read is logged
    /// with what is known of it (its id is not), and the next consumers
    /// take messages one at a time.
    fn failed(&self, error: &lapin::Error) -> ConsumeError {
        let error = BrokerError::from_lapin(error);
        let Some(frame) = oversized_frame(&error) else {
            return ConsumeError::Delivery(error);
        };
        let loss = self
            .single_file
            .lost(&self.inbound, self.prefetch, self.remaining);
        self.telemetry.unreadable_message(
            &self.inbound.queue,
            &UnreadableLoss {
                frame,
                frame_max: self.frame_max,
                held_unacked: self.unacked.load(Ordering::Relaxed),
                losses: loss.losses,
                single_file: loss.single_file,
                next_try: loss.delay,
                delivery_limit: self.inbound.delivery_limit(),
            },
        );
        ConsumeError::Unreadable {
            frame,
            frame_max: self.frame_max,
        }
    }

    /// True, once, when the messages returned with one the client could not
    /// read have passed: the consumer should be opened again, at the
    /// configured prefetch.
    pub fn returned_passed(&mut self) -> bool {
        std::mem::take(&mut self.passed)
    }

    /// The prefetch it consumes with.
    pub fn prefetch(&self) -> u16 {
        self.prefetch
    }

    /// Whether the channel is still open (a consumer that ended on an open
    /// channel was cancelled by the broker).
    pub fn is_open(&self) -> bool {
        self.channel.status().connected()
    }

    /// Completes once the channel is no longer open, checked every
    /// `every`: how a consumer that takes nothing for a while (an outage
    /// held, publishers blocked, the journal on hold) still learns that its
    /// channel is gone, so the transactions holding its receipts stop.
    pub fn closed(&self, every: Duration) -> impl Future<Output = ()> + Send + 'static {
        let channel = self.channel.clone();
        async move {
            loop {
                tokio::time::sleep(every).await;
                if !channel.status().connected() {
                    return;
                }
            }
        }
    }

    /// Stops the broker from sending more (`basic.cancel`). Deliveries
    /// already buffered are never handed out and go back to the queue when
    /// the channel closes.
    pub async fn stop_consuming(&self) {
        let cancel = self.channel.basic_cancel(
            self.consumer_tag.as_str().into(),
            BasicCancelOptions::default(),
        );
        if tokio::time::timeout(STOP_TIMEOUT, cancel).await.is_err() {
            self.telemetry
                .consumer_stop_timed_out(&self.inbound.queue, STOP_TIMEOUT);
        }
    }

    /// Marks the channel lost: transactions still holding its receipts stop
    /// starting new publishes (their messages come back anyway).
    pub fn mark_lost(&self) {
        self.lost.cancel();
    }

    /// Sends every pending settlement, then closes the channel; the broker
    /// requeues whatever is still unacked.
    pub async fn close(self) {
        drop(self.settle);
        drop(self.consumer);
        if tokio::time::timeout(STOP_TIMEOUT, self.settler)
            .await
            .is_err()
        {
            let unacked = self.unacked.load(Ordering::Relaxed);
            self.telemetry
                .inbound_close_timed_out(&self.inbound.queue, unacked, STOP_TIMEOUT);
        }
        close_channel(&self.channel, "switchyard: shutdown", &self.telemetry).await;
    }
}

/// How long messages settled behind an unsettled one wait for it before
/// they are acked one by one. Transactions end slightly out of delivery
/// order all the time (the runtime runs the task it woke last first), and
/// acking each of those at once made a quarter of all acks single ones:
/// the broker handles one `multiple` ack far more cheaply than many single
/// ones (measured in BENCHMARKS.md, "Acks"). A message that stays unsettled
/// for longer, waiting for a slow confirm, holds the others back no longer
/// than this.
const BEHIND_ACK_DELAY: Duration = Duration::from_millis(20);

/// Applies settlements in delivery order, counting in `unacked` the
/// messages not acked or rejected yet. Ends when every receipt and the
/// channel handle are gone, after acking everything settled.
async fn settle_loop(
    channel: Channel,
    mut rx: mpsc::UnboundedReceiver<Settle>,
    unacked: Arc<AtomicUsize>,
) {
    let mut outstanding = Outstanding::default();
    let mut failed = false;
    let mut batch = Vec::new();
    // When the messages settled behind an unsettled one are acked singly.
    let mut behind_due: Option<Instant> = None;
    loop {
        let behind = async {
            match behind_due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let received = tokio::select! {
            received = rx.recv_many(&mut batch, 4096) => received,
            () = behind => {
                behind_due = None;
                ack_behind(&channel, &mut outstanding, &mut failed).await;
                unacked.store(outstanding.len(), Ordering::Relaxed);
                continue;
            }
        };
        if received == 0 {
            break;
        }
        for settle in batch.drain(..) {
            match settle {
                Settle::Track(tag) => outstanding.track(tag),
                Settle::Ack(tag) => outstanding.settle(tag),
                Settle::Reject { tag, requeue } => {
                    outstanding.forget(tag);
                    let options = BasicNackOptions {
                        multiple: false,
                        requeue,
                    };
                    report(&mut failed, channel.basic_nack(tag, options).await);
                }
            }
        }
        if let Some(last) = outstanding.take_head() {
            report(
                &mut failed,
                channel
                    .basic_ack(last, BasicAckOptions { multiple: true })
                    .await,
            );
        }
        if !outstanding.any_settled() {
            behind_due = None;
        } else if behind_due.is_none() {
            behind_due = Some(Instant::now() + BEHIND_ACK_DELAY);
        }
        unacked.store(outstanding.len(), Ordering::Relaxed);
    }
    ack_behind(&channel, &mut outstanding, &mut failed).await;
}

/// Acks, one by one, every settled message still waiting behind an
/// unsettled one.
async fn ack_behind(channel: &Channel, outstanding: &mut Outstanding, failed: &mut bool) {
    for tag in outstanding.take_settled() {
        report(
            failed,
            channel
                .basic_ack(tag, BasicAckOptions { multiple: false })
                .await,
        );
    }
}

/// Delivered messages not yet acked or rejected, in delivery order, and
/// which of them are settled (ready to ack). Taking the settled run at the
/// head costs the length of that run, not of everything outstanding: the
/// settle task does it once per wake-up, with up to `prefetch` outstanding.
#[derive(Default)]
struct Outstanding {
    /// Delivery tag -> settled.
    tags: BTreeMap<u64, bool>,
    /// How many of `tags` are settled.
    settled: usize,
}

impl Outstanding {
    fn track(&mut self, tag: u64) {
        self.tags.insert(tag, false);
    }

    fn settle(&mut self, tag: u64) {
        if let Some(ready) = self.tags.get_mut(&tag)
            && !*ready
        {
            *ready = true;
            self.settled += 1;
        }
    }

    fn forget(&mut self, tag: u64) {
        if self.tags.remove(&tag) == Some(true) {
            self.settled -= 1;
        }
    }

    fn any_settled(&self) -> bool {
        self.settled > 0
    }

    /// Messages not acked or rejected yet, settled or not.
    fn len(&self) -> usize {
        self.tags.len()
    }

    /// Removes the run of settled messages at the head; the last tag of it,
    /// which one `multiple` ack covers.
    fn take_head(&mut self) -> Option<u64> {
        let (last, run) = self
            .tags
            .iter()
            .take_while(|(_, ready)| **ready)
            .fold((None, 0), |(_, run), (tag, _)| (Some(*tag), run + 1));
        let last = last?;
        self.tags = self.tags.split_off(&last);
        self.tags.remove(&last);
        self.settled -= run;
        Some(last)
    }

    /// Removes every settled message, head or not; their tags in order.
    fn take_settled(&mut self) -> Vec<u64> {
        let settled: Vec<u64> = self
            .tags
            .iter()
            .filter(|(_, ready)| **ready)
            .map(|(tag, _)| *tag)
            .collect();
        for tag in &settled {
            self.tags.remove(tag);
        }
        self.settled = 0;
        settled
    }
}

/// Logs the first settlement that could not be sent; the broker redelivers
/// every unacked message of a dead channel, so there is nothing else to do.
fn report(failed: &mut bool, result: lapin::Result<()>) {
    if let Err(e) = result
        && !*failed
    {
        *failed = true;
        tracing::warn!(error = %e, "inbound channel lost; unacked messages will be redelivered by the broker");
    }
}

#[cfg(test)]
mod tests {
    use super::Outstanding;

    #[test]
    fn the_settled_head_goes_at_once_and_those_behind_an_unsettled_one_wait() {
        let mut out = Outstanding::default();
        for tag in 1..=5 {
            out.track(tag);
        }
        out.settle(2);
        out.settle(3);
        assert_eq!(
            out.take_head(),
            None,
            "1 is not settled: nothing at the head"
        );
        assert!(out.any_settled(), "2 and 3 wait behind 1");
        out.settle(1);
        out.settle(1);
        assert_eq!(out.take_head(), Some(3), "one multiple ack covers 1 to 3");
        assert!(!out.any_settled());
        assert_eq!(out.len(), 2, "4 and 5 are not acked yet");
        out.settle(5);
        out.forget(4);
        assert_eq!(out.take_head(), Some(5));
        out.track(6);
        out.track(7);
        out.settle(7);
        assert_eq!(out.take_settled(), vec![7], "past the wait: acked singly");
        assert!(!out.any_settled());
        assert_eq!(out.take_head(), None);
    }
}
