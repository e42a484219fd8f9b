//! The throttle of untrusted-header logs, every metric exposed from the
//! start, labelled series kept apart per handle, and the client library's
//! own log events filtered.

use super::sample;
use super::{Replay, Telemetry, once_a_minute};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

#[test]
fn an_untrusted_header_is_logged_at_most_once_a_minute_and_counted_every_time() {
    let last = AtomicU64::new(0);
    assert!(once_a_minute(&last, 1), "the first one is logged");
    assert!(!once_a_minute(&last, 2));
    assert!(!once_a_minute(&last, 60_000));
    assert!(once_a_minute(&last, 60_001), "a minute later");
    assert!(!once_a_minute(&last, 60_002));

    let telemetry = Telemetry::new();
    let ignored = crate::wire::Annotations::read(
        &crate::amqp::Properties::default().with_headers({
            let mut h = crate::amqp::FieldTable::default();
            h.insert(
                crate::wire::ONLY.into(),
                crate::amqp::AmqpValue::Boolean(true),
            );
            h
        }),
        false,
        &crate::wire::Reading::default(),
    )
    .ignored;
    for _ in 0..3 {
        telemetry.untrusted_headers("m", None, ignored);
    }
    let text = telemetry.render();
    let series = |h: &str| format!("switchyard_untrusted_headers_total{{header=\"{h}\"}}");
    assert_eq!(sample(&text, &series("x-switchyard-only")), Some(3.0));
    assert_eq!(
        sample(&text, &series("other")),
        Some(0.0),
        "every series from the start"
    );
}

#[test]
fn every_spec_metric_is_exposed_from_the_start() {
    let telemetry = Telemetry::new();
    telemetry.branch_known("service", &["primary", "backup"]);
    telemetry.reason_known("no-route");
    telemetry.endpoint_registered("primary");
    let text = telemetry.render();
    for name in [
        "switchyard_messages_consumed_total",
        "switchyard_messages_forwarded_total",
        "switchyard_failovers_total",
        "switchyard_dead_lettered_total",
        "switchyard_confirm_seconds",
        "switchyard_in_flight",
        "switchyard_sessions_open",
        "switchyard_endpoint_up",
        "switchyard_config_generation",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} in\n{text}"
        );
    }
    assert_eq!(
        sample(&text, "switchyard_messages_consumed_total"),
        Some(0.0)
    );
    assert_eq!(sample(&text, "switchyard_confirm_seconds_count"), Some(0.0));
}

#[test]
fn labelled_series_count_separately_and_handles_do_not_share() {
    let telemetry = Telemetry::new();
    let other = Telemetry::new();
    for _ in 0..3 {
        telemetry.forwarded("m", "service", "primary");
    }
    telemetry.forwarded("m", "logging", "primary");
    telemetry.clone().consumed();
    telemetry.failover("m", "service", ("primary", Some("backup")), &"nacked", None);
    let replay = Some(Replay {
        session: "s",
        replaying: 2,
    });
    telemetry.failover("m", "service", ("backup", Some("third")), &"nacked", replay);
    telemetry.failover("m", "service", ("third", None), &"nacked", None);
    telemetry.replayed("service", "third");
    telemetry.dead_lettered("m", "exhausted", "nacked", &[], &[], "nack");
    telemetry.endpoint_registered("primary");
    telemetry.endpoint_down("primary", "connection", &"gone");
    telemetry.confirmed(Duration::from_millis(3));
    let _in_flight = telemetry.transaction_started();
    telemetry.config_loaded(1, 2);
    let text = telemetry.render();
    let cases = [
        (
            r#"switchyard_messages_forwarded_total{branch="service",endpoint="primary"}"#,
            3.0,
        ),
        (
            r#"switchyard_messages_forwarded_total{branch="logging",endpoint="primary"}"#,
            1.0,
        ),
        ("switchyard_messages_consumed_total", 1.0),
        (
            r#"switchyard_failovers_total{branch="service",from="primary",to="backup"}"#,
            1.0,
        ),
        (
            r#"switchyard_failovers_total{branch="service",from="backup",to="third"}"#,
            1.0,
        ),
        (
            r#"switchyard_replays_total{branch="service",endpoint="third"}"#,
            1.0,
        ),
        (r#"switchyard_dead_lettered_total{reason="exhausted"}"#, 1.0),
        (r#"switchyard_endpoint_up{endpoint="primary"}"#, 0.0),
        ("switchyard_confirm_seconds_count", 1.0),
        (r#"switchyard_confirm_seconds_bucket{le="0.005"}"#, 1.0),
        (r#"switchyard_confirm_seconds_bucket{le="0.0025"}"#, 0.0),
        ("switchyard_in_flight", 1.0),
        ("switchyard_config_generation", 1.0),
    ];
    for (series, value) in cases {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    assert_eq!(
        text.matches("switchyard_failovers_total{").count(),
        2,
        "a session's failover counts as one; an exhausted list is not one"
    );
    assert_eq!(
        sample(&other.render(), "switchyard_messages_consumed_total"),
        Some(0.0)
    );
}

#[test]
fn the_librarys_warnings_are_dropped_and_its_debug_kept() {
    use tracing::Level;
    use tracing::callsite::DefaultCallsite;
    use tracing::metadata::{Kind, Metadata};
    macro_rules! meta {
        ($target:expr, $level:expr) => {{
            static CALLSITE: DefaultCallsite = DefaultCallsite::new(&META);
            static META: Metadata<'static> = Metadata::new(
                "event",
                $target,
                $level,
                None,
                None,
                None,
                tracing::field::FieldSet::new(&[], tracing::callsite::Identifier(&CALLSITE)),
                Kind::EVENT,
            );
            &META
        }};
    }
    assert!(!super::library_event_allowed(meta!(
        "lapin::returned_messages",
        Level::WARN
    )));
    assert!(!super::library_event_allowed(meta!(
        "lapin::io_loop",
        Level::ERROR
    )));
    assert!(!super::library_event_allowed(meta!("lapin", Level::INFO)));
    assert!(super::library_event_allowed(meta!(
        "lapin::channels",
        Level::DEBUG
    )));
    assert!(super::library_event_allowed(meta!(
        "switchyard::telemetry",
        Level::WARN
    )));
    assert!(super::library_event_allowed(meta!(
        "lapinator",
        Level::WARN
    )));
}
