//! Admit: the one place a message is screened, placed in its session and
//! routed, whichever source it came from. [`admit`] returns a typed
//! [`Admission`]; the two sources (the queue's consumer and the HTTP
//! ingress's intake) differ only in how they hold the work (a delivery
//! receipt; a caller's deadline) and how they report (settle; answer).
//!
//! The order is the same for both: the screen ([`Screen`]: `malformed`,
//! `loop`, `poison`) and the session id's length; then session membership
//! (a session's message goes to its session even when barred: from the
//! queue, the whole set is dead-lettered with it); then the filter table
//! (`no-route`, saying when a body filter could not parse the body). A
//! session's branches are chosen by its first message, through [`route`]
//! too.
//!
//! [`Screen`]: super::screen::Screen

use super::generation::Generation;
use super::outcome::Barred;
use super::sessions::oversized_id;
use crate::envelope::Envelope;
use crate::routing::{BranchPlan, Outage, RoutingTable};
use std::sync::Arc;

/// What becomes of a message.
pub(crate) enum Admission {
    /// An independent message, and the branches it takes.
    Route(Vec<BranchPlan>),
    /// A message of session `id`, to be placed under `generation` (the one
    /// the session opened with); `barred` when the screen bars it.
    Session {
        id: Arc<str>,
        generation: Arc<Generation>,
        barred: Option<Barred>,
    },
    /// Not to be forwarded, and why.
    Barred(Barred),
}

/// Which session a message belongs to, and the generation it is placed
/// under; both sources' session sets answer it.
pub(crate) trait Membership {
    fn member(
        &self,
        envelope: &Envelope,
        generation: &Arc<Generation>,
    ) -> Option<(Arc<str>, Arc<Generation>)>;
}

/// Screens `envelope` under `generation`, finds its session through
/// `sessions`, and routes it when it is independent.
pub(crate) fn admit(
    generation: &Arc<Generation>,
    envelope: &Envelope,
    sessions: &impl Membership,
) -> Admission {
    let barred = generation.screen.check(envelope).or_else(|| {
        let config = generation.settings.sessions.as_ref()?;
        oversized_id(envelope, config)
    });
    if let Some((id, generation)) = sessions.member(envelope, generation) {
        return Admission::Session {
            id,
            generation,
            barred,
        };
    }
    if let Some(barred) = barred {
        return Admission::Barred(barred);
    }
    match route(&generation.settings.routing, envelope) {
        Ok(plans) => Admission::Route(plans),
        Err(barred) => Admission::Barred(barred),
    }
}

/// The branches `envelope` takes, or `no-route` (saying when a body filter
/// could not parse the body).
pub(crate) fn route(
    routing: &RoutingTable,
    envelope: &Envelope,
) -> Result<Vec<BranchPlan>, Barred> {
    let (plans, unparsable_body) = routing.route_reading_body(envelope);
    if plans.is_empty() {
        Err(Barred::NoRoute { unparsable_body })
    } else {
        Ok(plans)
    }
}

/// [`route`] for a caller who waits: a branch whose every endpoint is down
/// ends at once as an outage (the caller is told to come back) instead of
/// holding the message.
pub(crate) fn route_for_caller(
    generation: &Generation,
    envelope: &Envelope,
) -> Result<Vec<BranchPlan>, Barred> {
    let plans = route(&generation.settings.routing, envelope)?;
    Ok(plans.into_iter().map(for_caller).collect())
}

/// `plan`, ending at once on an outage.
pub(crate) fn for_caller(mut plan: BranchPlan) -> BranchPlan {
    plan.outage = Outage::Answer;
    plan
}

#[cfg(test)]
mod tests {
    //! Every way `admit` bars a message, through both sources' session
    //! sets: the queue's and the HTTP ingress's admit alike.

    use super::*;
    use crate::amqp::{AmqpValue, FieldTable};
    use crate::config::Settings;
    use crate::envelope::MAX_HEADER_DEPTH;
    use crate::pipeline::sessions::{HttpSessions, Sessions};
    use crate::pipeline::testkit::{Script, envelope, settings};
    use crate::routing::Unparsable;
    use crate::telemetry::Telemetry;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    const SESSIONS: &str = "\n[sessions]\nenabled = true\nmax_open = 4\nmax_messages = 10\n";

    /// What `envelope` is admitted as under `settings`, from the queue and
    /// over HTTP.
    fn from_both(settings: Settings, envelope: &Envelope) -> [Admission; 2] {
        let telemetry = Telemetry::new();
        let generation = Generation::scripted(settings, Script::acking(), telemetry.clone());
        let generation = Arc::new(generation);
        let (tracker, abandon) = (TaskTracker::new(), CancellationToken::new());
        let generations = tokio::sync::watch::channel(generation.clone()).1;
        let queue = Sessions::new(
            tracker.clone(),
            abandon.clone(),
            telemetry.clone(),
            generations,
        );
        let http = HttpSessions::new(tracker, abandon, telemetry, route_for_caller);
        [
            admit(&generation, envelope, queue.membership()),
            admit(&generation, envelope, http.membership()),
        ]
    }

    fn barred(admissions: [Admission; 2]) -> [Barred; 2] {
        admissions.map(|admission| match admission {
            Admission::Barred(barred) => barred,
            Admission::Route(_) => panic!("routed"),
            Admission::Session { id, .. } => panic!("placed in session {id}"),
        })
    }

    fn plain() -> Settings {
        settings(&["a"], "service", SESSIONS)
    }

    /// One branch whose entry takes filter `kind`, of the TOML `filter`.
    fn filtered(filter: &str) -> Settings {
        let toml = crate::pipeline::testkit::settings_toml(&["a"], "service", "")
            .replace("filter = \"all\"", "filter = \"kind\"");
        crate::pipeline::testkit::load(&format!("{toml}\n[filters.kind]\n{filter}"))
    }

    fn changed(envelope: &Envelope, change: impl FnOnce(&mut Envelope)) -> Envelope {
        let mut envelope = envelope.clone();
        change(&mut envelope);
        envelope
    }

    #[tokio::test]
    async fn an_independent_message_is_routed_by_both_sources() {
        for admission in from_both(plain(), &envelope("m", &[])) {
            let Admission::Route(plans) = admission else {
                panic!("not routed");
            };
            assert_eq!(plans.len(), 1);
        }
    }

    #[tokio::test]
    async fn headers_nested_too_deep_are_malformed_from_both_sources() {
        let mut value = AmqpValue::Boolean(true);
        for _ in 0..MAX_HEADER_DEPTH + 1 {
            let mut table = FieldTable::default();
            table.insert("n".into(), value);
            value = AmqpValue::FieldTable(table);
        }
        let deep = envelope("m", &[("deep", value)]);
        for barred in barred(from_both(plain(), &deep)) {
            assert!(
                matches!(barred, Barred::Malformed { limit, .. } if limit == MAX_HEADER_DEPTH),
                "{barred:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_message_at_max_hops_is_a_loop_from_both_sources() {
        let looping = changed(&envelope("m", &[]), |e| e.annotations.hops = 8);
        for barred in barred(from_both(plain(), &looping)) {
            assert_eq!(barred, Barred::Loop { hops: 8, max: 8 });
        }
    }

    #[tokio::test]
    async fn a_message_redelivered_too_often_is_poison_from_both_sources() {
        let redelivered = changed(&envelope("m", &[]), |e| {
            e.redelivered = true;
            e.annotations.delivery_count = Some(11);
        });
        for barred in barred(from_both(plain(), &redelivered)) {
            assert_eq!(
                barred,
                Barred::Poison {
                    deliveries: 12,
                    max: 10
                }
            );
        }
    }

    #[tokio::test]
    async fn a_session_id_too_long_is_barred_from_both_sources() {
        let id = "s".repeat(crate::pipeline::sessions::MAX_SESSION_ID_BYTES + 1);
        let long = envelope("m", &[("session-id", AmqpValue::LongString(id.into()))]);
        for barred in barred(from_both(plain(), &long)) {
            assert!(
                matches!(barred, Barred::SessionIdTooLong { bytes: 257, .. }),
                "{barred:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_message_no_filter_matches_is_no_route_from_both_sources() {
        let settings = filtered("type = \"header\"\nheader = \"kind\"\nexists = true\n");
        for barred in barred(from_both(settings, &envelope("m", &[]))) {
            assert_eq!(
                barred,
                Barred::NoRoute {
                    unparsable_body: None
                }
            );
        }
    }

    #[tokio::test]
    async fn a_body_no_body_filter_can_read_is_no_route_saying_so_from_both_sources() {
        let settings = filtered("type = \"json\"\npointer = \"/kind\"\nexists = true\n");
        let unreadable = changed(&envelope("m", &[]), |e| e.body = b"not json".to_vec());
        for barred in barred(from_both(settings, &unreadable)) {
            assert_eq!(
                barred,
                Barred::NoRoute {
                    unparsable_body: Some(Unparsable::Json)
                }
            );
        }
    }

    #[tokio::test]
    async fn a_barred_message_of_a_session_goes_to_its_session_with_the_bar() {
        let looping = changed(
            &envelope("m", &[("session-id", AmqpValue::LongString("s".into()))]),
            |e| e.annotations.hops = 8,
        );
        for admission in from_both(plain(), &looping) {
            let Admission::Session { id, barred, .. } = admission else {
                panic!("not placed in its session");
            };
            assert_eq!(&*id, "s");
            assert_eq!(barred, Some(Barred::Loop { hops: 8, max: 8 }));
        }
    }

    #[tokio::test]
    async fn a_caller_is_never_held_through_an_outage() {
        let plans = route_for_caller(
            &Generation::scripted(plain(), Script::acking(), Telemetry::new()),
            &envelope("m", &[]),
        );
        let Ok(plans) = plans else {
            panic!("not routed");
        };
        assert!(plans.iter().all(|p| p.outage == Outage::Answer));
    }

    /// A no-route says when the body parsed as none of the formats body
    /// filters asked for, and which; a body that parsed as one and matched
    /// nothing, or no body filter, says nothing of the body.
    #[test]
    fn a_no_route_says_which_format_the_body_did_not_parse_as() {
        use crate::pipeline::testkit::{load, settings_toml};
        let json = "[filters.body]\ntype = \"json\"\npointer = \"/kind\"\nequals = \"order\"\n";
        let xpath = "[filters.body]\ntype = \"xpath\"\nexpression = \"/order\"\n";
        let either = "[filters.body]\ntype = \"or\"\nfilters = [\"j\", \"x\"]\n\
                      [filters.j]\ntype = \"json\"\npointer = \"/kind\"\nexists = true\n\
                      [filters.x]\ntype = \"xpath\"\nexpression = \"/order\"\n";
        let header = "[filters.body]\ntype = \"header\"\nheader = \"kind\"\nexists = true\n";
        let cases = [
            (json, "not json", Some(Unparsable::Json)),
            (json, "{\"kind\": \"invoice\"}", None),
            (xpath, "not xml", Some(Unparsable::Xml)),
            (xpath, "<invoice/>", None),
            (either, "neither", Some(Unparsable::JsonAndXml)),
            (either, "{}", None),
            (either, "<invoice/>", None),
            (header, "not json", None),
        ];
        for (filters, body, expected) in cases {
            let toml = settings_toml(&["a"], "service", "")
                .replace("filter = \"all\"", "filter = \"body\"");
            let settings = load(&format!("{toml}\n{filters}"));
            let routed = route(&settings.routing, &envelope(body, &[]));
            let Err(Barred::NoRoute { unparsable_body }) = routed else {
                panic!("{body}: expected no route");
            };
            assert_eq!(unparsable_body, expected, "{body} through\n{filters}");
        }
    }
}
