//! Row B1's mover: the thinnest lapin program that moves a queue into
//! another queue with the same guarantees per message as switchyard's F1 —
//! one consume with manual ack, one mandatory publish on a confirm-mode
//! channel, and the delivery's ack once that publish is confirmed. The
//! benchmark binary runs it as a process of its own by re-executing itself
//! with [`FLAG`], on a current-thread tokio runtime, with one connection
//! for consuming and one for publishing (as switchyard does).
//!
//! Row B1H runs it with [`HEADERS`]: each copy then also carries the two
//! headers switchyard adds to every copy (`x-switchyard-hops` and
//! `x-switchyard-publish-id`, both long long integers), so that the rows
//! say what those headers cost apart from everything else switchyard does.
//!
//! It is not a forwarder: no filters, no branches, no failover or backup,
//! no dead letters, no per-destination outcome, no reconnects, no timeouts,
//! no logs on the way. A nack, a return or any error ends it with a message
//! on stderr and a non-zero exit (the benchmark then fails the run). What
//! it measures is the floor that lapin and the broker set for any
//! AMQP-over-TCP client doing this work per message.

use std::collections::VecDeque;
use std::path::Path;
use std::process::ExitCode;

use futures_util::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties, PublisherConfirm};
use tokio::signal::unix::{SignalKind, signal};

use crate::support::harness::{Process, Wrap};

/// `<benchmark binary> --bare-forward <amqp-url> <source> <dest> <prefetch> <plain|headers>`
/// runs the bare forwarder instead of the benchmark.
pub const FLAG: &str = "--bare-forward";
/// The last argument for copies with switchyard's headers (row B1H).
pub const HEADERS: &str = "headers";
const PLAIN: &str = "plain";

/// Starts the bare forwarder from `source` to `dest` as a process of its
/// own (started through `wrap`), its stderr in a log named after
/// `prefix`; with `headers`, each copy carries switchyard's two headers.
pub fn spawn(
    prefix: &str,
    url: &str,
    (source, dest): (&str, &str),
    prefetch: u32,
    headers: bool,
    wrap: Wrap<'_>,
) -> Process {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let prefetch = prefetch.to_string();
    let kind = if headers { HEADERS } else { PLAIN };
    let args = [FLAG, url, source, dest, prefetch.as_str(), kind];
    Process::spawn_program(prefix, Path::new(&exe), &args, &[], wrap)
}

/// The bare forwarder's `main`: `args` are those after [`FLAG`].
pub fn main(args: &[String]) -> ExitCode {
    let [url, source, dest, prefetch, kind] = args else {
        eprintln!(
            "usage: {FLAG} <amqp-url> <source queue> <dest queue> <prefetch> <plain|headers>"
        );
        return ExitCode::from(2);
    };
    let headers = match kind.as_str() {
        HEADERS => true,
        PLAIN => false,
        other => {
            eprintln!("{FLAG}: {other:?} is neither {PLAIN} nor {HEADERS}");
            return ExitCode::from(2);
        }
    };
    let Ok(prefetch) = prefetch.parse::<u16>() else {
        eprintln!("{FLAG}: prefetch {prefetch:?} is not a number up to 65535");
        return ExitCode::from(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(forward(url, source, dest, prefetch, headers)),
        Err(e) => Err(format!("runtime: {e}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bare forwarder: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Moves `source` into `dest` until SIGTERM; then settles what is in
/// flight and closes (deliveries not yet published go back to `source`).
async fn forward(
    url: &str,
    source: &str,
    dest: &str,
    prefetch: u16,
    headers: bool,
) -> Result<(), String> {
    let err = |what: &'static str| move |e: lapin::Error| format!("{what}: {e}");
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    let connect = |side: &str| {
        let name = format!("{source}-bare-{side}");
        Connection::connect(
            url,
            ConnectionProperties::default().with_connection_name(name.into()),
        )
    };
    let inbound = connect("in").await.map_err(err("connect"))?;
    let outbound = connect("out").await.map_err(err("connect"))?;
    let consuming = inbound.create_channel().await.map_err(err("channel"))?;
    let publishing = outbound.create_channel().await.map_err(err("channel"))?;
    publishing
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(err("confirm.select"))?;
    consuming
        .basic_qos(prefetch, BasicQosOptions { global: false })
        .await
        .map_err(err("basic.qos"))?;
    let mut consumer = consuming
        .basic_consume(
            source.into(),
            "bare".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(err("basic.consume"))?;
    let mandatory = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    // Publishes not yet confirmed, in publish order (= delivery order),
    // each with the tag of the delivery it settles.
    let mut pending: VecDeque<(u64, PublisherConfirm)> = VecDeque::new();
    let mut running = true;
    while running || !pending.is_empty() {
        tokio::select! {
            _ = term.recv(), if running => running = false,
            delivery = consumer.next(), if running => {
                let delivery = delivery
                    .ok_or("the broker cancelled the consumer")?
                    .map_err(err("delivery"))?;
                let properties = if headers {
                    with_switchyard_headers(delivery.properties, delivery.delivery_tag)
                } else {
                    delivery.properties
                };
                let confirm = publishing
                    .basic_publish("".into(), dest.into(), mandatory, &delivery.data, properties)
                    .await
                    .map_err(err("basic.publish"))?;
                pending.push_back((delivery.delivery_tag, confirm));
            }
            first = async { (&mut pending.front_mut().expect("a publish in flight").1).await },
                if !pending.is_empty() => {
                confirmed(first)?;
                let (mut last, _) = pending.pop_front().expect("a publish in flight");
                // Every confirm already in: one ack for all of them.
                while let Some(next) = pending.front_mut().and_then(|(_, c)| c.now_or_never()) {
                    confirmed(next)?;
                    last = pending.pop_front().expect("a publish in flight").0;
                }
                consuming
                    .basic_ack(last, BasicAckOptions { multiple: true })
                    .await
                    .map_err(err("basic.ack"))?;
            }
        }
    }
    consuming
        .close(200, "done".into())
        .await
        .map_err(err("close"))?;
    publishing
        .close(200, "done".into())
        .await
        .map_err(err("close"))?;
    inbound
        .close(200, "done".into())
        .await
        .map_err(err("close"))?;
    outbound
        .close(200, "done".into())
        .await
        .map_err(err("close"))
}

/// `properties` with the two headers switchyard adds to every copy, as it
/// encodes them (the publish id here is the delivery tag).
fn with_switchyard_headers(properties: BasicProperties, tag: u64) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert("x-switchyard-hops".into(), AMQPValue::LongLongInt(1));
    headers.insert(
        "x-switchyard-publish-id".into(),
        AMQPValue::LongLongInt(i64::try_from(tag).unwrap_or(i64::MAX)),
    );
    properties.with_headers(headers)
}

/// A confirm that is an ack of a message that was not returned.
fn confirmed(confirm: lapin::Result<Confirmation>) -> Result<(), String> {
    match confirm.map_err(|e| format!("confirm: {e}"))? {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(r)) | Confirmation::Nack(Some(r)) => Err(format!(
            "returned by the broker: {} {}",
            r.reply_code, r.reply_text
        )),
        Confirmation::Nack(None) => Err("nacked by the broker".to_owned()),
        Confirmation::NotRequested => Err("no confirm requested".to_owned()),
    }
}
