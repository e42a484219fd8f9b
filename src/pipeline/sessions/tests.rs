//! Sessions against a scripted stand-in for the endpoints, under a paused
//! clock: the idle timeout, the size limit and the closed-session memory
//! for both sources (the queue's [`Bench`], the HTTP ingress's
//! [`Callers`]), a failover mid-session replayed and acked as a set, and
//! what a session's dead letters record about the branches that hold each
//! message.

use super::{Arrival, HttpSessions, Refused, Sessions};
use crate::amqp::{AmqpValue, FieldTable, Properties};
use crate::broker::{PublishFailure, Settled, SettledLog};
use crate::config::Settings;
use crate::envelope::Envelope;
use crate::pipeline::admit::{Membership, route_for_caller};
use crate::pipeline::generation::Generation;
use crate::pipeline::outcome::{Barred, Outcome};
use crate::pipeline::testkit::{Call, Reply, Script, envelope, load, settings, settings_toml};
use crate::telemetry::{Telemetry, sample};
use crate::wire::{self, Annotations, Reading, Trust};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A second branch, "logging", over endpoint `l`.
const LOGGING: &str = "\n[endpoints.l]\nbroker = \"main\"\nrouting_key = \"l\"\n\n\
    [[filter_table]]\nname = \"logging\"\nfilter = \"all\"\nendpoint = \"l\"\n";

struct Bench {
    sessions: Sessions,
    generation: Arc<Generation>,
    /// The live generation, as the forwarder's watch holds it.
    live: watch::Sender<Arc<Generation>>,
    settled: SettledLog,
    permits: Arc<Semaphore>,
    script: Arc<Script>,
    telemetry: Telemetry,
}

impl Bench {
    /// Sessions over `settings` (which must turn them on), delivering through `script`.
    fn new(settings: Settings, script: Arc<Script>) -> Self {
        let telemetry = Telemetry::new();
        let generation = Generation::scripted(settings, script.clone(), telemetry.clone());
        let generation = Arc::new(generation);
        let live = watch::Sender::new(generation.clone());
        Self {
            sessions: Sessions::new(
                TaskTracker::new(),
                CancellationToken::new(),
                telemetry.clone(),
                live.subscribe(),
            ),
            generation,
            live,
            settled: SettledLog::default(),
            permits: Arc::new(Semaphore::new(1000)),
            script,
            telemetry,
        }
    }

    /// Message `tag` of session `id`, the last of it when `end`.
    async fn admit(&self, tag: u64, id: &str, end: bool) {
        self.admit_by(tag, "session-id", id, end).await;
    }

    /// [`Self::admit`] with the id in header `header`.
    async fn admit_by(&self, tag: u64, header: &str, id: &str, end: bool) {
        let mut headers = vec![(header, AmqpValue::LongString(id.into()))];
        if end {
            headers.push(("session-end", AmqpValue::Boolean(true)));
        }
        self.admit_as(tag, envelope(&format!("{id}-{tag}"), &headers))
            .await;
    }

    /// Admits `envelope` with delivery tag `tag`.
    async fn admit_as(&self, tag: u64, envelope: Arc<Envelope>) {
        let permit = match self.permits.clone().acquire_owned().await {
            Ok(permit) => permit,
            Err(e) => panic!("{e}"),
        };
        let (session, generation) =
            session_of(self.sessions.membership(), &envelope, &self.generation);
        let arrival = Arrival {
            refused: generation.screen.check(&envelope),
            envelope,
            receipt: self.settled.receipt(tag),
            permit,
            received_at: std::time::SystemTime::now(),
        };
        self.sessions.admit(session, arrival, &generation);
        // Lets the session's task take it.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    /// Switches to `settings`, as a reload does.
    fn reload(&mut self, settings: Settings) {
        let generation =
            Generation::scripted(settings, self.script.clone(), self.telemetry.clone());
        self.generation = Arc::new(generation);
        self.live.send_replace(self.generation.clone());
    }

    /// Whether a message with `header: id` would belong to a session now.
    fn is_member(&self, header: &str, id: &str) -> bool {
        let envelope = envelope("probe", &[(header, AmqpValue::LongString(id.into()))]);
        self.sessions
            .membership()
            .member(&envelope, &self.generation)
            .is_some()
    }

    fn dead_lettered(&self, reason: &str) -> f64 {
        let series = format!(r#"switchyard_dead_lettered_total{{reason="{reason}"}}"#);
        sample(&self.telemetry.render(), &series).unwrap_or(0.0)
    }
}

/// The session `envelope` belongs to, and the generation it goes under.
fn session_of(
    sessions: &impl Membership,
    envelope: &Envelope,
    generation: &Arc<Generation>,
) -> (Arc<str>, Arc<Generation>) {
    match sessions.member(envelope, generation) {
        Some(member) => member,
        None => panic!("{} belongs to no session", envelope.message_id()),
    }
}

/// The HTTP ingress's sessions over the same stand-in: each request
/// answered once delivered, or refused.
struct Callers {
    sessions: HttpSessions,
    generation: Arc<Generation>,
    script: Arc<Script>,
}

impl Callers {
    fn new(settings: Settings, script: Arc<Script>) -> Self {
        let telemetry = Telemetry::new();
        let generation = Generation::scripted(settings, script.clone(), telemetry.clone());
        let sessions = HttpSessions::new(
            TaskTracker::new(),
            CancellationToken::new(),
            telemetry,
            route_for_caller,
        );
        Self {
            sessions,
            generation: Arc::new(generation),
            script,
        }
    }

    /// Request `n` of session `id`, the last of it when `end`: its answer.
    async fn send(&self, n: u64, id: &str, end: bool) -> Result<Outcome, Refused> {
        let mut headers = vec![("session-id", AmqpValue::LongString(id.into()))];
        if end {
            headers.push(("session-end", AmqpValue::Boolean(true)));
        }
        let envelope = envelope(&format!("{id}-{n}"), &headers);
        let (id, generation) = session_of(self.sessions.membership(), &envelope, &self.generation);
        let answer = self
            .sessions
            .submit(id, envelope, &generation, CancellationToken::new())?;
        answer.await
    }
}

/// Whether `answer` delivered its message on every branch.
fn delivered(answer: &Result<Outcome, Refused>) -> bool {
    answer.as_ref().is_ok_and(Outcome::all_delivered)
}

/// The reason a refused request was barred for.
fn refused(answer: Result<Outcome, Refused>) -> Option<&'static str> {
    match answer {
        Err(Refused::Barred(barred)) => Some(barred.reason().as_str()),
        _ => None,
    }
}

const SESSIONS: &str = "\n[sessions]\nenabled = true\nmax_open = 4\nmax_messages = 10\n";

fn on(extra: &str) -> Settings {
    settings(&["a", "b"], "service", &format!("{extra}{SESSIONS}"))
}

fn acks(tags: &[u64]) -> Vec<(u64, Settled)> {
    tags.iter().map(|t| (*t, Settled::Ack)).collect()
}

fn dead_letters(tags: &[u64]) -> Vec<(u64, Settled)> {
    tags.iter().map(|t| (*t, Settled::DeadLetter)).collect()
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_closes_after_its_timeout_from_either_source() {
    let mut bench = Bench::new(on(""), Script::acking());
    bench.admit(1, "s", false).await;
    bench.admit(2, "s", false).await;
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(
        bench.settled.drain(),
        [],
        "acks held while the session is open"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(bench.settled.drain(), dead_letters(&[1, 2]));
    assert_eq!(bench.dead_lettered("session-timeout"), 2.0);
    bench.admit(3, "s", false).await;
    assert_eq!(bench.settled.drain(), dead_letters(&[3]), "closed since");

    // Over HTTP the same timer closes the session; a caller holds the rest.
    let callers = Callers::new(on(""), Script::acking());
    assert!(delivered(&callers.send(1, "s", false).await));
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(delivered(&callers.send(2, "s", false).await), "still open");
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(
        refused(callers.send(3, "s", false).await),
        Some("session-closed")
    );
    assert_eq!(callers.script.calls(), ["a:s-1", "a:s-2"]);
}

#[tokio::test(start_paused = true)]
async fn a_pause_stops_an_open_sessions_idle_clock_from_either_source() {
    let mut bench = Bench::new(on(""), Script::acking());
    bench.admit(1, "s", false).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    bench.generation.group.set_paused(true);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(bench.settled.drain(), [], "ten minutes paused: still open");
    bench.generation.group.set_paused(false);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(bench.settled.drain(), [], "its whole timeout again");
    bench.admit(2, "s", true).await;
    assert_eq!(bench.settled.drain(), acks(&[1, 2]), "completed whole");
    assert_eq!(bench.dead_lettered("session-timeout"), 0.0);
    // Resumed, the clock runs again.
    bench.admit(3, "t", false).await;
    bench.generation.group.set_paused(true);
    bench.generation.group.set_paused(false);
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(bench.settled.drain(), dead_letters(&[3]));

    // Over HTTP too.
    let callers = Callers::new(on(""), Script::acking());
    assert!(delivered(&callers.send(1, "s", false).await));
    callers.generation.group.set_paused(true);
    tokio::time::sleep(Duration::from_secs(600)).await;
    callers.generation.group.set_paused(false);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(delivered(&callers.send(2, "s", true).await), "still open");
    assert_eq!(callers.script.calls(), ["a:s-1", "a:s-2"]);
}

/// "service" over `a`, and "workers": registrable, round robin, with no
/// endpoint until `w` is given.
fn with_workers(w: Option<&str>) -> Settings {
    let endpoint = w.map_or(String::new(), |w| format!("endpoint = \"{w}\"\n"));
    let workers = format!(
        "\n[[filter_table]]\nname = \"workers\"\nfilter = \"all\"\nregistrable = true\n\
         strategy = \"round_robin\"\n{endpoint}{SESSIONS}"
    );
    let toml = settings_toml(&["a"], "service", &workers);
    match w {
        Some(w) => load(&format!(
            "{toml}\n[endpoints.{w}]\nbroker = \"main\"\nrouting_key = \"{w}\"\n"
        )),
        None => load(&toml),
    }
}

#[tokio::test(start_paused = true)]
async fn a_session_whose_first_message_finds_no_registered_endpoint_waits_for_one() {
    let mut bench = Bench::new(with_workers(None), Script::acking());
    bench.admit(1, "s", false).await;
    bench.admit(2, "s", true).await;
    // Past the idle timeout: held as an outage (consuming paused), not
    // dead-lettered, nothing published.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(bench.settled.drain(), [], "held");
    assert!(
        bench.script.calls().is_empty(),
        "{:?}",
        bench.script.calls()
    );
    assert!(bench.generation.engine.outages().any(), "counted as a hold");

    // A service registers: a new live generation where "workers" has `w`.
    let before = bench.generation.clone();
    bench.reload(with_workers(Some("w")));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(bench.settled.drain(), acks(&[1, 2]));
    let mut calls = bench.script.calls();
    calls.sort();
    assert_eq!(calls, ["a:s-1", "a:s-2", "w:s-1", "w:s-2"]);
    assert!(!before.engine.outages().any(), "the hold ended");
    assert_eq!(bench.dead_lettered("session-timeout"), 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_failover_mid_session_replays_the_set_and_it_is_acked_as_one() {
    let script = Script::new(|call, earlier| match call.endpoint.as_str() {
        "a" if earlier >= 2 => Reply::Fail(PublishFailure::Nacked),
        _ => Reply::Ack,
    });
    let mut bench = Bench::new(on(""), script);
    bench.admit(1, "s", false).await;
    bench.admit(2, "s", false).await;
    bench.admit(3, "s", false).await;
    assert_eq!(bench.settled.drain(), []);
    bench.admit(4, "s", true).await;
    assert_eq!(
        bench.script.calls(),
        [
            "a:s-1",
            "a:s-2",
            "a:s-3",
            "b:s-1(replay)",
            "b:s-2(replay)",
            "b:s-3",
            "b:s-4"
        ]
    );
    assert_eq!(bench.settled.drain(), acks(&[1, 2, 3, 4]));
}

#[tokio::test(start_paused = true)]
async fn a_session_over_max_messages_ends_from_either_source() {
    let limited = settings(
        &["a"],
        "service",
        "\n[sessions]\nenabled = true\nmax_open = 4\nmax_messages = 2\n",
    );
    let mut bench = Bench::new(limited.clone(), Script::acking());
    for tag in 1..=3 {
        bench.admit(tag, "s", false).await;
    }
    assert_eq!(bench.settled.drain(), dead_letters(&[1, 2, 3]));
    assert_eq!(bench.dead_lettered("session-too-large"), 3.0);
    assert_eq!(
        bench.script.calls(),
        ["a:s-1", "a:s-2"],
        "the third never went out"
    );

    // Over HTTP the request that outgrows it is refused and the session ends.
    let callers = Callers::new(limited, Script::acking());
    for n in 1..=2 {
        assert!(delivered(&callers.send(n, "s", false).await));
    }
    assert_eq!(
        refused(callers.send(3, "s", false).await),
        Some("session-too-large")
    );
    assert_eq!(
        refused(callers.send(4, "s", false).await),
        Some("session-closed")
    );
    assert_eq!(callers.script.calls(), ["a:s-1", "a:s-2"]);
}

#[tokio::test(start_paused = true)]
async fn a_closed_session_turns_late_messages_away_until_its_ttl_runs_out_from_either_source() {
    let mut bench = Bench::new(on(""), Script::acking());
    bench.admit(1, "s", true).await;
    assert_eq!(bench.settled.drain(), acks(&[1]));
    bench.admit(2, "s", false).await;
    assert_eq!(bench.settled.drain(), dead_letters(&[2]));
    assert_eq!(bench.dead_lettered("session-closed"), 1.0);
    tokio::time::sleep(Duration::from_secs(61)).await;
    bench.admit(3, "s", true).await;
    assert_eq!(
        bench.settled.drain(),
        acks(&[3]),
        "a new session of the same id"
    );
    assert_eq!(bench.script.calls(), ["a:s-1", "a:s-3"]);

    let callers = Callers::new(on(""), Script::acking());
    assert!(delivered(&callers.send(1, "s", true).await));
    assert_eq!(
        refused(callers.send(2, "s", false).await),
        Some("session-closed")
    );
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(
        delivered(&callers.send(3, "s", true).await),
        "a new session of the same id"
    );
    assert_eq!(callers.script.calls(), ["a:s-1", "a:s-3"]);
}

/// A redriven set reopens a closed session only when the mark is trusted
/// (`dlq redrive` publishes as the forwarder's user); a producer's
/// `x-switchyard-redriven` or `x-switchyard-only` does not.
#[tokio::test(start_paused = true)]
async fn only_a_trusted_redrive_reopens_a_closed_session() {
    let mut bench = Bench::new(on(""), Script::acking());
    bench.admit(1, "s", true).await;
    assert_eq!(bench.settled.drain(), acks(&[1]));
    let reading = Reading {
        trust: Trust::new(vec!["guest".to_owned()]),
        quorum: false,
    };
    let redriven = |tag: u64, user: Option<&str>| {
        let mut headers = FieldTable::default();
        headers.insert("session-id".into(), AmqpValue::LongString("s".into()));
        headers.insert("session-end".into(), AmqpValue::Boolean(true));
        headers.insert(wire::REDRIVEN.into(), AmqpValue::Boolean(true));
        headers.insert(wire::ONLY.into(), AmqpValue::LongString("service".into()));
        let mut properties = Properties::default()
            .with_message_id(format!("s-{tag}").into())
            .with_headers(headers);
        if let Some(user) = user {
            properties = properties.with_user_id(user.into());
        }
        Arc::new(Envelope {
            delivery_tag: tag,
            exchange: String::new(),
            routing_key: "in".to_owned(),
            redelivered: false,
            annotations: Annotations::read(&properties, false, &reading),
            properties,
            body: Vec::new(),
        })
    };
    bench.admit_as(2, redriven(2, None)).await;
    bench.admit_as(3, redriven(3, Some("producer"))).await;
    assert_eq!(bench.settled.drain(), dead_letters(&[2, 3]));
    assert_eq!(bench.dead_lettered("session-closed"), 2.0);
    bench.admit_as(4, redriven(4, Some("guest"))).await;
    assert_eq!(
        bench.settled.drain(),
        acks(&[4]),
        "reopened by the trusted redrive"
    );
    assert_eq!(bench.script.calls(), ["a:s-1", "a:s-4"]);
}

/// The dead letters the script received, by message: (failed, delivered).
fn records(script: &Script) -> Vec<(String, Vec<String>, Vec<String>)> {
    let names = |call: &Call, header: &str| match call.header(header) {
        Some(AmqpValue::FieldArray(items)) => items
            .as_slice()
            .iter()
            .map(|v| match v {
                AmqpValue::LongString(s) => s.to_string(),
                other => format!("{other:?}"),
            })
            .collect(),
        _ => Vec::new(),
    };
    script
        .all_calls()
        .iter()
        .filter(|c| c.endpoint == "dead-letter")
        .map(|c| {
            (
                c.message_id.clone(),
                names(c, wire::FAILED),
                names(c, wire::DELIVERED),
            )
        })
        .collect()
}

fn republish() -> Settings {
    let toml = settings_toml(&["a", "b"], "service", &format!("{LOGGING}{SESSIONS}"));
    load(&toml.replace("mode = \"nack\"", "mode = \"republish\""))
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_session_records_that_every_branch_holds_its_messages() {
    let mut bench = Bench::new(republish(), Script::acking());
    bench.admit(1, "s", false).await;
    bench.admit(2, "s", false).await;
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(
        bench.settled.drain(),
        acks(&[1, 2]),
        "republished, then acked"
    );
    let both = vec!["service".to_owned(), "logging".to_owned()];
    assert_eq!(
        records(&bench.script),
        [
            ("s-1".to_owned(), vec![], both.clone()),
            ("s-2".to_owned(), vec![], both)
        ],
        "nothing is missing: a redrive sends nothing again"
    );
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_session_records_the_failed_branch_on_every_message() {
    // The service branch's endpoints take one message each, then refuse.
    let script = Script::new(|call, earlier| match call.endpoint.as_str() {
        "a" | "b" if earlier >= 1 => Reply::Fail(PublishFailure::Nacked),
        _ => Reply::Ack,
    });
    let mut bench = Bench::new(republish(), script);
    bench.admit(1, "s", false).await;
    bench.admit(2, "s", false).await;
    assert_eq!(bench.settled.drain(), acks(&[1, 2]));
    let failed = vec!["service".to_owned()];
    let logging = vec!["logging".to_owned()];
    assert_eq!(
        records(&bench.script),
        [
            ("s-1".to_owned(), failed.clone(), logging.clone()),
            ("s-2".to_owned(), failed, logging)
        ],
        "the set must reach the service branch whole; logging holds it"
    );
}

#[tokio::test(start_paused = true)]
async fn sessions_turned_off_mid_session_finish_as_sessions() {
    let mut bench = Bench::new(on(""), Script::acking());
    bench.admit(1, "s", false).await;
    bench.admit(2, "s", false).await;
    bench.reload(settings(&["a", "b"], "service", ""));
    assert!(!bench.is_member("session-id", "t"), "no new session opens");
    bench.admit(3, "s", true).await;
    assert_eq!(bench.settled.drain(), acks(&[1, 2, 3]), "acked as one set");
    assert_eq!(bench.script.calls(), ["a:s-1", "a:s-2", "a:s-3"]);
    assert!(
        !bench.is_member("session-id", "s"),
        "closed, and sessions are off"
    );
}

#[tokio::test(start_paused = true)]
async fn a_renamed_id_header_keeps_open_sessions_and_names_new_ones() {
    let mut bench = Bench::new(on(""), Script::acking());
    bench.admit(1, "s", false).await;
    let renamed = format!("{SESSIONS}id_header = \"sid\"\n");
    bench.reload(settings(&["a", "b"], "service", &renamed));
    assert!(
        bench.is_member("session-id", "s"),
        "the open session keeps its header"
    );
    assert!(
        !bench.is_member("session-id", "t"),
        "the old header opens nothing new"
    );
    bench.admit_by(2, "sid", "t", false).await;
    bench.admit(3, "s", true).await;
    assert_eq!(bench.settled.drain(), acks(&[1, 3]));
    bench.admit_by(4, "sid", "t", true).await;
    assert_eq!(bench.settled.drain(), acks(&[2, 4]));
}

#[tokio::test(start_paused = true)]
async fn changed_limits_apply_to_sessions_opened_after_the_reload() {
    let mut bench = Bench::new(on(""), Script::acking());
    bench.admit(1, "s", false).await;
    let small = SESSIONS.replace("max_messages = 10", "max_messages = 2");
    bench.reload(settings(&["a", "b"], "service", &small));
    for tag in 2..=3 {
        bench.admit(tag, "s", false).await;
    }
    bench.admit(4, "s", true).await;
    assert_eq!(
        bench.settled.drain(),
        acks(&[1, 2, 3, 4]),
        "the old limit of 10"
    );
    for tag in 5..=7 {
        bench.admit(tag, "u", false).await;
    }
    assert_eq!(
        bench.settled.drain(),
        dead_letters(&[5, 6, 7]),
        "the new limit of 2"
    );
}

#[tokio::test(start_paused = true)]
async fn over_http_a_new_session_past_max_open_is_refused_and_a_first_message_without_a_route_opens_none()
 {
    let callers = Callers::new(on(""), Script::acking());
    for n in 1..=4 {
        let id = format!("s{n}");
        assert!(delivered(&callers.send(n, &id, false).await));
    }
    assert!(matches!(
        callers.send(5, "s5", false).await,
        Err(Refused::Full(4))
    ));
    assert!(
        delivered(&callers.send(6, "s1", true).await),
        "an open one goes on"
    );
    assert!(
        delivered(&callers.send(7, "s5", true).await),
        "a slot freed"
    );

    let filtered = "[filters.kind]\ntype = \"header\"\nheader = \"kind\"\nexists = true\n";
    let toml = crate::pipeline::testkit::settings_toml(&["a"], "service", SESSIONS)
        .replace("filter = \"all\"", "filter = \"kind\"");
    let unrouted = Callers::new(load(&format!("{toml}\n{filtered}")), Script::acking());
    for n in 1..=2 {
        assert_eq!(
            unrouted.send(n, "s", false).await.err(),
            Some(Refused::Barred(Barred::NoRoute {
                unparsable_body: None
            })),
            "refused each time, never session-closed"
        );
    }
}
