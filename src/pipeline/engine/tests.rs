//! The engine against a scripted stand-in for the endpoints, under a paused
//! clock: failover order, retries, skipping down endpoints, suspects
//! retried alone, outage holds and their bound, a lost inbound channel, and a session's
//! replay on failover.

use super::{BranchRun, Engine, Outages, Walk};
use crate::amqp::AmqpValue;
use crate::broker::{Health, PublishFailure, Refusal};
use crate::config::Settings;
use crate::envelope::Envelope;
use crate::pipeline::outcome::{BranchOutcome, Outcome, Reason, Verdict};
use crate::pipeline::testkit::{Reply, Script, envelope, settings, suspect, unreachable};
use crate::telemetry::{Telemetry, sample};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn engine(script: &Arc<Script>) -> (Engine, Telemetry) {
    let telemetry = Telemetry::new();
    let engine = Engine::new(
        script.clone(),
        Outages::new(telemetry.clone()),
        telemetry.clone(),
    );
    (engine, telemetry)
}

/// One message through `settings`' table, every branch delivered.
async fn forward(engine: &Engine, settings: &Settings, message: &Arc<Envelope>) -> Outcome {
    let plans = settings.routing.route(message);
    engine
        .start(message, plans)
        .finish(engine, &CancellationToken::new())
        .await
}

/// The branch "service" over endpoints a, b (`extra`: more of its keys),
/// for a session's run.
fn session_branch(engine: &Engine, extra: &str) -> BranchRun {
    let settings = settings(&["a", "b"], "service", extra);
    let plans = settings.routing.route(&envelope("s-1", &[]));
    let Some(plan) = plans.into_iter().next() else {
        panic!("the branch routes every message");
    };
    BranchRun::new(plan, engine)
}

/// A walk of session "s" whose inbound channel is `lost` when cancelled.
fn session_walk<'a>(engine: &'a Engine, lost: &'a CancellationToken) -> Walk<'a> {
    Walk {
        engine,
        lost,
        session: Some("s"),
    }
}

fn delivered(branch: &str, endpoint: &str) -> BranchOutcome {
    BranchOutcome::Delivered {
        branch: branch.into(),
        endpoint: endpoint.to_owned(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_endpoint_fails_over_down_the_list_in_order() {
    let script = Script::new(|call, _| match call.endpoint.as_str() {
        "a" => Reply::Fail(PublishFailure::Nacked),
        "b" => Reply::Fail(PublishFailure::Returned {
            code: 312,
            text: "NO_ROUTE".to_owned(),
        }),
        _ => Reply::Ack,
    });
    let (engine, telemetry) = engine(&script);
    let settings = settings(&["a", "b", "c"], "service", "");
    let outcome = forward(&engine, &settings, &envelope("m1", &[])).await;
    assert_eq!(outcome.branches, [delivered("service", "c")]);
    assert_eq!(script.calls(), ["a:m1", "b:m1", "c:m1"]);
    let text = telemetry.render();
    for (from, to) in [("a", "b"), ("b", "c")] {
        let series =
            format!(r#"switchyard_failovers_total{{branch="service",from="{from}",to="{to}"}}"#);
        assert_eq!(sample(&text, &series), Some(1.0), "{series}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_is_retried_before_the_branch_moves_on_and_an_exhausted_list_fails() {
    let script = Script::new(|_, _| Reply::Fail(PublishFailure::Nacked));
    let (engine, _) = engine(&script);
    let settings = settings(&["a: retries = 2", "b"], "service", "");
    let outcome = forward(&engine, &settings, &envelope("m1", &[])).await;
    assert_eq!(script.calls(), ["a:m1", "a:m1", "a:m1", "b:m1"]);
    assert_eq!(
        outcome.branches,
        [BranchOutcome::Failed {
            branch: "service".into(),
            endpoint: Some("b".to_owned()),
            error: PublishFailure::Nacked,
        }]
    );
}

#[tokio::test(start_paused = true)]
async fn a_down_endpoint_is_skipped_while_a_later_one_is_up() {
    let script = Script::acking();
    let (engine, _) = engine(&script);
    let settings = settings(&["a", "b", "c"], "service", "");
    script.set_health("a", Health::Down);
    script.set_health("b", Health::Unreachable);
    let outcome = forward(&engine, &settings, &envelope("m1", &[])).await;
    assert_eq!(outcome.branches, [delivered("service", "c")]);
    // Every endpoint down: the list is tried from its start.
    script.set_health("c", Health::Down);
    forward(&engine, &settings, &envelope("m2", &[])).await;
    assert_eq!(script.calls(), ["c:m1", "a:m2"]);
}

#[tokio::test(start_paused = true)]
async fn a_suspect_is_retried_alone_on_the_same_endpoint_and_rejected_there() {
    let script = Script::new(|call, _| match call.mode {
        crate::broker::Mode::Normal => Reply::Fail(suspect()),
        crate::broker::Mode::Alone => {
            Reply::Fail(PublishFailure::Rejected(Refusal::FrameTooLarge {
                header: 200_000,
                frame_max: 131_072,
            }))
        }
    });
    let (engine, _) = engine(&script);
    let settings = settings(&["a", "b"], "service", "");
    let outcome = forward(&engine, &settings, &envelope("m1", &[])).await;
    assert_eq!(script.calls(), ["a:m1", "a:m1(alone)"], "never failed over");
    assert!(matches!(
        &outcome.branches[..],
        [BranchOutcome::Rejected { endpoint, .. }] if endpoint == "a"
    ));
}

#[tokio::test(start_paused = true)]
async fn an_outage_holds_the_message_by_default_until_an_endpoint_is_back() {
    // a refuses at once (its broker in backoff), then takes the message
    // once it is back; b never answers.
    let script = Script::new(|call, earlier| match (call.endpoint.as_str(), earlier) {
        ("a", 0) | ("b", _) => Reply::Fail(unreachable()),
        _ => Reply::After(Duration::from_millis(5), Box::new(Reply::Ack)),
    });
    let (engine, _) = engine(&script);
    let settings = settings(&["a", "b"], "service", "");
    script.set_health("a", Health::Unreachable);
    script.set_health("b", Health::Unreachable);
    let message = envelope("m1", &[]);
    let started = engine.start(&message, settings.routing.route(&message));
    let outages = engine.outages().clone();
    let lost = CancellationToken::new();
    let engine_for_task = engine.clone();
    let finished = tokio::spawn(async move { started.finish(&engine_for_task, &lost).await });
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(
        !finished.is_finished(),
        "held for as long as the outage lasts"
    );
    assert!(outages.any(), "counted as waiting, which pauses consuming");
    script.set_health("a", Health::Up);
    let outcome = finished.await.unwrap_or_default();
    assert_eq!(outcome.branches, [delivered("service", "a")]);
    assert!(!outages.any());
    assert_eq!(script.calls(), ["a:m1", "b:m1", "a:m1"]);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_broker_holds_the_message_and_is_tried_again_with_growing_pauses() {
    // Neither endpoint confirms for a minute; their health still reads up
    // (as before a publisher notices), so only the pauses stop a busy loop.
    let script = Script::new(|_, _| Reply::Fail(PublishFailure::Timeout(5000)));
    let (engine, _) = engine(&script);
    let settings = settings(&["a", "b"], "service", "");
    let message = envelope("m1", &[]);
    let started = engine.start(&message, settings.routing.route(&message));
    let lost = CancellationToken::new();
    let engine_for_task = engine.clone();
    let finished = tokio::spawn(async move { started.finish(&engine_for_task, &lost).await });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!finished.is_finished(), "held, not failed");
    let tries = script.calls().len();
    // Pauses double from 100 ms to 5 s: some 20 passes of two calls.
    assert!((4..=60).contains(&tries), "{tries} calls in a minute");
    finished.abort();
}

#[tokio::test(start_paused = true)]
async fn with_outage_dead_letter_an_outage_ends_the_branch_at_once_or_after_its_bound() {
    let script = Script::new(|_, _| Reply::Fail(unreachable()));
    let (engine, _) = engine(&script);
    let at_once = settings(&["a", "b"], "service", "outage = \"dead_letter\"");
    let outcome = forward(&engine, &at_once, &envelope("m1", &[])).await;
    assert!(
        matches!(&outcome.branches[..], [BranchOutcome::Outage { endpoint, .. }] if endpoint == "b"),
        "{outcome:?}"
    );
    let bounded = settings(
        &["a", "b"],
        "service",
        "outage = \"dead_letter\"\noutage_timeout_ms = 10000",
    );
    let message = envelope("m2", &[]);
    let started = engine.start(&message, bounded.routing.route(&message));
    let lost = CancellationToken::new();
    let engine_for_task = engine.clone();
    let finished = tokio::spawn(async move { started.finish(&engine_for_task, &lost).await });
    tokio::time::sleep(Duration::from_millis(9900)).await;
    assert!(!finished.is_finished(), "held within the bound");
    assert!(engine.outages().any());
    let outcome = finished.await.unwrap_or_default();
    assert!(matches!(
        &outcome.branches[..],
        [BranchOutcome::Outage { .. }]
    ));
    assert!(!engine.outages().any());
    let verdict = outcome.verdict();
    assert!(
        matches!(&verdict, Verdict::DeadLetter { cause, .. } if cause.reason() == Reason::Outage),
        "{verdict:?}"
    );
}

/// Forwards `message` through `settings` in a task of its own; the
/// outcome once it ends.
fn spawn_forward(
    engine: &Engine,
    settings: &Settings,
    message: &Arc<Envelope>,
) -> tokio::task::JoinHandle<Outcome> {
    let started = engine.start(message, settings.routing.route(message));
    let engine = engine.clone();
    let lost = CancellationToken::new();
    tokio::spawn(async move { started.finish(&engine, &lost).await })
}

/// Endpoints that refuse (nack) every copy, and endpoints that cannot be
/// reached until `set_health(_, Up)` says they are back (then they ack).
fn refusing_and_unreachable(refusing: &'static [&'static str]) -> Arc<Script> {
    Script::new(move |call, _| {
        if refusing.contains(&call.endpoint.as_str()) {
            Reply::Fail(PublishFailure::Nacked)
        } else if call.health == Health::Up {
            Reply::Ack
        } else {
            Reply::Fail(unreachable())
        }
    })
}

/// A refusal and an unreachable endpoint, in either order, in a list of
/// two or of three: the branch holds (never fails) until the endpoint that
/// did not refuse is back, and delivers there; a list whose every
/// endpoint refused fails.
#[tokio::test(start_paused = true)]
async fn a_refusal_and_an_unreachable_endpoint_together_hold_until_it_is_back() {
    let cases: [(&[&str], &[&str], &str); 4] = [
        // (list, refusing, reached once back)
        (&["a", "b"], &["a"], "b"),
        (&["a", "b"], &["b"], "a"),
        (&["a", "b", "c"], &["a", "c"], "b"),
        (&["a", "b", "c"], &["b"], "a"),
    ];
    for (list, refusing, back) in cases {
        let script = refusing_and_unreachable(refusing);
        let (engine, _) = engine(&script);
        let settings = settings(list, "service", "");
        for endpoint in list.iter().filter(|e| !refusing.contains(e)) {
            script.set_health(endpoint, Health::Unreachable);
        }
        let finished = spawn_forward(&engine, &settings, &envelope("m1", &[]));
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(
            !finished.is_finished(),
            "{list:?} refusing {refusing:?}: held"
        );
        assert!(engine.outages().any(), "counted as an outage hold");
        let refusals_while_held = script
            .calls()
            .iter()
            .filter(|c| refusing.iter().any(|r| c.starts_with(&format!("{r}:"))))
            .count();
        assert!(
            refusals_while_held <= refusing.len(),
            "{list:?}: the refusing endpoints are not asked again while nothing is back: {:?}",
            script.calls()
        );
        script.set_health(back, Health::Up);
        let outcome = finished.await.unwrap_or_default();
        assert_eq!(outcome.branches, [delivered("service", back)], "{list:?}");
        assert!(!engine.outages().any());
    }
    // Every endpoint refused: the list is exhausted.
    let script = refusing_and_unreachable(&["a", "b", "c"]);
    let (exhausted, _) = engine(&script);
    let all = settings(&["a", "b", "c"], "service", "");
    let outcome = forward(&exhausted, &all, &envelope("m1", &[])).await;
    assert!(
        matches!(&outcome.branches[..], [BranchOutcome::Failed { endpoint: Some(e), .. }] if e == "c"),
        "{outcome:?}"
    );
}

/// A refusal is remembered across holds: an endpoint that refused, then
/// one that was unreachable and refuses once back, and the list fails.
#[tokio::test(start_paused = true)]
async fn a_list_every_endpoint_of_which_refused_fails_across_holds() {
    let script = Script::new(|call, _| match (call.endpoint.as_str(), call.health) {
        ("b", Health::Unreachable) => Reply::Fail(unreachable()),
        _ => Reply::Fail(PublishFailure::Nacked),
    });
    let (engine, _) = engine(&script);
    let settings = settings(&["a", "b"], "service", "");
    script.set_health("b", Health::Unreachable);
    let finished = spawn_forward(&engine, &settings, &envelope("m1", &[]));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!finished.is_finished(), "held while b is unreachable");
    script.set_health("b", Health::Up);
    let outcome = finished.await.unwrap_or_default();
    assert!(
        matches!(&outcome.branches[..], [BranchOutcome::Failed { .. }]),
        "{outcome:?}"
    );
}

/// A round-robin branch, a session's branch and an HTTP request's branch
/// obey the same rule: a refusal beside an unreachable endpoint holds
/// (the HTTP request ends as an outage, answered 503, not 502).
#[tokio::test(start_paused = true)]
async fn round_robin_sessions_and_http_hold_a_refusal_beside_an_unreachable_endpoint() {
    // Round robin: whichever endpoint it starts on.
    for id in ["m1", "m2"] {
        let script = refusing_and_unreachable(&["a"]);
        let (engine, _) = engine(&script);
        let settings = settings(&["a", "b"], "service", "strategy = \"round_robin\"");
        script.set_health("b", Health::Unreachable);
        let finished = spawn_forward(&engine, &settings, &envelope(id, &[]));
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!finished.is_finished(), "round robin {id}: held");
        script.set_health("b", Health::Up);
        let outcome = finished.await.unwrap_or_default();
        assert_eq!(outcome.branches, [delivered("service", "b")], "{id}");
    }
    // A session: held, then the whole run replayed to the endpoint back.
    {
        let script = Script::new(|call, earlier| match call.endpoint.as_str() {
            "a" if earlier >= 1 => Reply::Fail(PublishFailure::Nacked),
            "a" => Reply::Ack,
            _ if call.health == Health::Up => Reply::Ack,
            _ => Reply::Fail(unreachable()),
        });
        let (engine, _) = engine(&script);
        script.set_health("b", Health::Unreachable);
        let mut branch = session_branch(&engine, "");
        let lost = CancellationToken::new();
        let walk = session_walk(&engine, &lost);
        let first = vec![envelope("s-1", &[])];
        assert!(matches!(
            branch.deliver(&first, None, &walk).await,
            BranchOutcome::Delivered { .. }
        ));
        let run = vec![envelope("s-1", &[]), envelope("s-2", &[])];
        let (outcome, ()) = tokio::join!(branch.deliver(&run, None, &walk), async {
            tokio::time::sleep(Duration::from_secs(600)).await;
            assert!(engine.outages().any(), "the session's branch holds");
            script.set_health("b", Health::Up);
        });
        assert_eq!(outcome, delivered("service", "b"));
        assert!(
            script
                .calls()
                .ends_with(&["b:s-1(replay)".to_owned(), "b:s-2".to_owned()]),
            "{:?}",
            script.calls()
        );
    }
    // HTTP: the request's branch answers instead of holding, as an outage.
    let script = refusing_and_unreachable(&["a"]);
    let (engine, _) = engine(&script);
    let settings = settings(&["a", "b"], "service", "");
    script.set_health("b", Health::Unreachable);
    let message = envelope("h1", &[]);
    let mut plans = settings.routing.route(&message);
    for plan in &mut plans {
        plan.outage = crate::routing::Outage::Answer;
    }
    let outcome = engine
        .start(&message, plans)
        .finish(&engine, &CancellationToken::new())
        .await;
    assert!(
        matches!(&outcome.branches[..], [BranchOutcome::Outage { endpoint, .. }] if endpoint == "b"),
        "{outcome:?}"
    );
    let verdict = outcome.verdict();
    assert!(
        matches!(&verdict, Verdict::DeadLetter { cause, .. } if cause.reason() == Reason::Outage),
        "an outage (503), not an exhausted list (502): {verdict:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_held_message_is_abandoned_when_the_inbound_channel_is_lost() {
    let script = Script::new(|_, _| Reply::Fail(unreachable()));
    let (engine, _) = engine(&script);
    script.set_health("a", Health::Unreachable);
    let settings = settings(&["a"], "service", "");
    let message = envelope("m1", &[]);
    let started = engine.start(&message, settings.routing.route(&message));
    let lost = CancellationToken::new();
    let cut = {
        let lost = lost.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            lost.cancel();
        }
    };
    let (outcome, ()) = tokio::join!(started.finish(&engine, &lost), cut);
    assert_eq!(
        outcome.branches,
        [BranchOutcome::Abandoned {
            branch: "service".into()
        }],
        "the broker redelivers it; nothing is dead-lettered"
    );
    assert!(!engine.outages().any());
}

#[tokio::test(start_paused = true)]
async fn no_attempt_starts_once_the_inbound_channel_is_lost() {
    let script = Script::new(|_, _| Reply::Fail(PublishFailure::Nacked));
    let (engine, _) = engine(&script);
    let settings = settings(&["a", "b"], "service", "");
    let message = envelope("m1", &[]);
    let started = engine.start(&message, settings.routing.route(&message));
    let lost = CancellationToken::new();
    lost.cancel();
    let outcome = started.finish(&engine, &lost).await;
    assert_eq!(
        script.calls(),
        ["a:m1"],
        "only the attempt already on the wire"
    );
    assert_eq!(
        outcome.branches,
        [BranchOutcome::Abandoned {
            branch: "service".into()
        }]
    );
}

#[tokio::test(start_paused = true)]
async fn a_session_replays_its_confirmed_prefix_to_the_next_endpoint() {
    // a takes two messages, then fails.
    let script = Script::new(|call, earlier| match call.endpoint.as_str() {
        "a" if earlier >= 2 => Reply::Fail(PublishFailure::Nacked),
        _ => Reply::Ack,
    });
    let (engine, telemetry) = engine(&script);
    let mut branch = session_branch(&engine, "");
    let mut run: Vec<Arc<Envelope>> = Vec::new();
    let lost = CancellationToken::new();
    let walk = session_walk(&engine, &lost);
    for id in ["s-1", "s-2", "s-3"] {
        run.push(envelope(id, &[]));
        let outcome = branch.deliver(&run, None, &walk).await;
        assert!(
            matches!(outcome, BranchOutcome::Delivered { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(
        script.calls(),
        [
            "a:s-1",
            "a:s-2",
            "a:s-3",
            "b:s-1(replay)",
            "b:s-2(replay)",
            "b:s-3"
        ]
    );
    assert_eq!(branch.holds(), 3, "the backup holds the whole set");
    let text = telemetry.render();
    let cases = [
        (
            r#"switchyard_messages_forwarded_total{branch="service",endpoint="a"}"#,
            2.0,
        ),
        (
            r#"switchyard_messages_forwarded_total{branch="service",endpoint="b"}"#,
            3.0,
        ),
        (
            r#"switchyard_replays_total{branch="service",endpoint="b"}"#,
            2.0,
        ),
        (
            r#"switchyard_failovers_total{branch="service",from="a",to="b"}"#,
            1.0,
        ),
    ];
    for (series, value) in cases {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_session_back_on_an_endpoint_goes_on_where_it_stopped_there() {
    let script = Script::new(|call, earlier| match (call.endpoint.as_str(), earlier) {
        ("a", 1) => Reply::Fail(unreachable()),
        ("b", _) => Reply::Fail(unreachable()),
        _ => Reply::Ack,
    });
    let (engine, _) = engine(&script);
    let mut branch = session_branch(&engine, "outage = \"wait\"");
    let lost = CancellationToken::new();
    let walk = session_walk(&engine, &lost);
    let mut run = vec![envelope("s-1", &[])];
    branch.deliver(&run, None, &walk).await;
    run.push(envelope("s-2", &[]));
    script.set_health("a", Health::Unreachable);
    script.set_health("b", Health::Unreachable);
    let recover = {
        let script = script.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            script.set_health("a", Health::Up);
        }
    };
    let (outcome, ()) = tokio::join!(branch.deliver(&run, None, &walk), recover);
    assert!(matches!(outcome, BranchOutcome::Delivered { ref endpoint, .. } if endpoint == "a"));
    assert_eq!(
        script.calls(),
        ["a:s-1", "a:s-2", "b:s-1(replay)", "a:s-2"],
        "back on a, only what a lacks"
    );
}

#[tokio::test(start_paused = true)]
async fn nacks_while_the_broker_settles_are_retried_on_the_same_endpoint_with_consuming_paused() {
    let script = Script::new(|call, earlier| match call.endpoint.as_str() {
        "a" if earlier < 5 => Reply::Fail(PublishFailure::NackedSettling),
        _ => Reply::Ack,
    });
    let (engine, telemetry) = engine(&script);
    let settings = settings(&["a", "b"], "service", "");
    let message = envelope("m1", &[]);
    let forwarding = {
        let engine = engine.clone();
        tokio::spawn(async move { forward(&engine, &settings, &message).await })
    };
    // The first pause is at least 100 ms: the branch holds by then.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        engine.outages().any(),
        "consuming pauses while the branch waits"
    );
    let Ok(outcome) = forwarding.await else {
        panic!("the forwarding task ended");
    };
    assert_eq!(outcome.branches, [delivered("service", "a")]);
    assert_eq!(script.calls(), ["a:m1"; 6], "never failed over to b");
    assert!(!engine.outages().any());
    let text = telemetry.render();
    assert_eq!(
        sample(
            &text,
            r#"switchyard_failovers_total{branch="service",from="a",to="b"}"#
        ),
        None
    );
}

/// The steps a recording engine's walk leaves for the journal: each
/// attempt in order with its outcome, a down endpoint skipped, and a
/// `traceparent` on every copy naming that attempt's span.
#[tokio::test(start_paused = true)]
async fn a_recording_walk_keeps_every_step_and_names_each_attempt_in_the_copys_traceparent() {
    use crate::journal::Attempted;
    let script = Script::new(|call, _| match call.endpoint.as_str() {
        "a" => Reply::Fail(PublishFailure::Nacked),
        "b" => Reply::Fail(PublishFailure::Returned {
            code: 312,
            text: "NO_ROUTE".to_owned(),
        }),
        _ => Reply::Ack,
    });
    script.set_health("c", Health::Down);
    let (engine, _) = engine(&script);
    let engine = engine.recording(true, 1.0);
    let settings = settings(&["a", "b", "c", "d"], "service", "");
    let producer = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let message = envelope(
        "m1",
        &[
            ("traceparent", AmqpValue::LongString(producer.into())),
            (
                "tracestate",
                AmqpValue::LongString("congo=t61rcWkgMzE".into()),
            ),
        ],
    );
    let outcome = forward(&engine, &settings, &message).await;
    assert_eq!(outcome.branches, [delivered("service", "d")]);
    let [trail] = outcome.trails.as_slice() else {
        panic!("one trail per branch: {:?}", outcome.trails);
    };
    let steps: Vec<(&str, &Attempted)> = trail
        .iter()
        .map(|t| (t.endpoint.name.as_str(), &t.outcome))
        .collect();
    assert_eq!(
        steps,
        [
            ("a", &Attempted::Nacked),
            ("b", &Attempted::Returned(312)),
            ("c", &Attempted::SkippedDown),
            ("d", &Attempted::Confirmed),
        ]
    );
    let published: Vec<u64> = trail.iter().map(|t| t.span).filter(|s| *s != 0).collect();
    let carried: Vec<String> = script
        .all_calls()
        .iter()
        .filter_map(|call| match call.header("traceparent") {
            Some(AmqpValue::LongString(s)) => Some(s.to_string()),
            _ => None,
        })
        .collect();
    let expected: Vec<String> = published
        .iter()
        .map(|span| format!("00-0af7651916cd43dd8448eb211c80319c-{span:016x}-01"))
        .collect();
    assert_eq!(carried, expected);
    for call in script.all_calls() {
        assert!(
            matches!(call.header("tracestate"), Some(AmqpValue::LongString(s)) if s.to_string() == "congo=t61rcWkgMzE"),
            "every copy carries the incoming tracestate"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_does_not_record_keeps_no_steps_and_still_carries_the_trace() {
    let script = Script::acking();
    let (engine, _) = engine(&script);
    let settings = settings(&["a"], "service", "");
    let outcome = forward(&engine, &settings, &envelope("m1", &[])).await;
    assert!(outcome.trails.iter().all(Vec::is_empty));
    let calls = script.all_calls();
    assert!(
        matches!(calls[0].header("traceparent"), Some(AmqpValue::LongString(s)) if s.to_string().starts_with("00-")),
        "a new trace is started and carried"
    );
}

#[tokio::test(start_paused = true)]
async fn a_drained_endpoint_is_passed_over_without_an_attempt_or_a_failover() {
    use crate::journal::Attempted;
    let script = Script::acking();
    let (engine, _) = engine(&script);
    let engine = engine.recording(true, 1.0);
    let settings = settings(&["a", "b"], "service", "");
    script.set_health("a", Health::Drained);
    let outcome = forward(&engine, &settings, &envelope("m1", &[])).await;
    assert_eq!(outcome.branches, [delivered("service", "b")]);
    assert_eq!(
        script.calls(),
        ["b:m1"],
        "nothing published to a drained endpoint"
    );
    let steps: Vec<(&str, &Attempted)> = outcome.trails[0]
        .iter()
        .map(|t| (t.endpoint.name.as_str(), &t.outcome))
        .collect();
    assert_eq!(
        steps,
        [
            ("a", &Attempted::SkippedDrained),
            ("b", &Attempted::Confirmed)
        ]
    );
    // Undrained, new messages return to it.
    script.set_health("a", Health::Up);
    forward(&engine, &settings, &envelope("m2", &[])).await;
    assert_eq!(script.calls(), ["b:m1", "a:m2"]);
}

#[tokio::test(start_paused = true)]
async fn a_list_left_with_nothing_but_drained_endpoints_holds_even_when_it_would_dead_letter() {
    let script = Script::acking();
    let (engine, _) = engine(&script);
    // `outage = "dead_letter"`: an outage would end the branch at once; a
    // drain never does.
    let settings = settings(&["a"], "service", "outage = \"dead_letter\"\n");
    script.set_health("a", Health::Drained);
    let message = envelope("m1", &[]);
    let started = engine.start(&message, settings.routing.route(&message));
    let outages = engine.outages().clone();
    let lost = CancellationToken::new();
    let engine_for_task = engine.clone();
    let finished = tokio::spawn(async move { started.finish(&engine_for_task, &lost).await });
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(!finished.is_finished(), "held while drained");
    assert!(outages.any(), "counted as holding, which pauses consuming");
    assert!(script.calls().is_empty(), "never published while drained");
    script.set_health("a", Health::Up);
    let outcome = finished.await.unwrap_or_default();
    assert_eq!(outcome.branches, [delivered("service", "a")]);
    assert_eq!(script.calls(), ["a:m1"]);
}
