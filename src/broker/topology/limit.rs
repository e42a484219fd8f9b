//! What a quorum inbound queue does with a message returned too often, as
//! startup finds it. Its `x-delivery-limit` is one of the arguments the
//! broker compares on a redeclaration, so the arguments it accepted say
//! whether the queue has one, and which. A policy's `delivery-limit` is not
//! visible over AMQP: a queue without the argument is reported with the
//! policy to set, in case no policy sets it (see
//! [`crate::config::delivery_limit_policy`]).

use super::super::connector::Connector;
use crate::amqp::AmqpValue;
use crate::config::{Inbound, delivery_limit_policy};
use crate::destination::{DeadLetter, DeadLetterMode};

/// The queue argument of a quorum queue's delivery limit.
pub(super) const DELIVERY_LIMIT: &str = "x-delivery-limit";

/// What startup found on a quorum inbound queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// A limit above `max_redeliveries`, and a dead-letter exchange for a
    /// message at the limit: as it should be.
    Limit(i64),
    /// A limit at or under `max_redeliveries`: the broker dead-letters a
    /// message that comes back before the forwarder's screen calls it
    /// `poison`.
    UnderScreen(i64),
    /// A limit and no dead-letter exchange argument: the broker drops a
    /// message at the limit (unless a policy gives the queue one).
    Drops(i64),
    /// No `x-delivery-limit` argument.
    Missing,
}

/// Logs what stops a message the client cannot read on the inbound queue,
/// and what to set when nothing may; nothing for a classic queue.
/// `arguments` are those the broker accepted for it.
pub(super) fn report_delivery_limit(
    connector: &Connector,
    (inbound, dl): (&Inbound, &DeadLetter),
    arguments: &[(String, AmqpValue)],
) {
    let Some(found) = find(inbound, dl, arguments) else {
        return;
    };
    let telemetry = connector.telemetry();
    let queue = inbound.queue.as_str();
    let policy = || {
        let (_, vhost) = connector.identity();
        delivery_limit_policy(inbound, dl, &vhost).unwrap_or_default()
    };
    match found {
        Found::Limit(limit) => telemetry.delivery_limit(queue, limit),
        Found::UnderScreen(limit) => {
            telemetry.delivery_limit_under_screen(queue, limit, inbound.max_redeliveries);
        }
        Found::Drops(limit) => telemetry.delivery_limit_drops(queue, limit, &policy()),
        Found::Missing => telemetry.delivery_limit_missing(queue, &policy()),
    }
}

fn find(inbound: &Inbound, dl: &DeadLetter, arguments: &[(String, AmqpValue)]) -> Option<Found> {
    inbound.delivery_limit()?;
    let argument = |name: &str| arguments.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let Some(limit) = argument(DELIVERY_LIMIT).and_then(integer) else {
        return Some(Found::Missing);
    };
    let by_policy = dl.mode == DeadLetterMode::Nack && inbound.dead_letter_by_policy;
    Some(
        if argument("x-dead-letter-exchange").is_none() && !by_policy {
            Found::Drops(limit)
        } else if limit <= i64::from(inbound.max_redeliveries) {
            Found::UnderScreen(limit)
        } else {
            Found::Limit(limit)
        },
    )
}

fn integer(value: &AmqpValue) -> Option<i64> {
    match value {
        AmqpValue::LongLongInt(v) => Some(*v),
        AmqpValue::LongInt(v) => Some(i64::from(*v)),
        AmqpValue::LongUInt(v) => Some(i64::from(*v)),
        AmqpValue::ShortInt(v) => Some(i64::from(*v)),
        AmqpValue::ShortUInt(v) => Some(i64::from(*v)),
        AmqpValue::ShortShortInt(v) => Some(i64::from(*v)),
        AmqpValue::ShortShortUInt(v) => Some(i64::from(*v)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{DELIVERY_LIMIT, Found, find};
    use crate::amqp::AmqpValue;
    use crate::config::Inbound;
    use crate::destination::{DeadLetter, DeadLetterMode, QueueType};

    fn inbound(queue_type: QueueType, by_policy: bool) -> Inbound {
        Inbound {
            dead_letter_by_policy: by_policy,
            ..Inbound::sample("q", queue_type)
        }
    }

    fn dead_letter(mode: DeadLetterMode) -> DeadLetter {
        DeadLetter {
            mode,
            exchange: "dlx".into(),
            routing_key: String::new(),
            queue: None,
            queue_type: QueueType::Classic,
        }
    }

    fn args(limit: Option<AmqpValue>, dlx: bool) -> Vec<(String, AmqpValue)> {
        let mut out = Vec::new();
        if dlx {
            out.push((
                "x-dead-letter-exchange".into(),
                AmqpValue::LongString("dlx".into()),
            ));
        }
        if let Some(limit) = limit {
            out.push((DELIVERY_LIMIT.into(), limit));
        }
        out
    }

    #[test]
    fn what_a_quorum_queue_does_at_its_limit() {
        let quorum = inbound(QueueType::Quorum, false);
        let republish = dead_letter(DeadLetterMode::Republish);
        let nack = dead_letter(DeadLetterMode::Nack);
        let cases = [
            (
                args(Some(AmqpValue::LongLongInt(11)), true),
                Found::Limit(11),
            ),
            (args(Some(AmqpValue::LongInt(50)), true), Found::Limit(50)),
            (
                args(Some(AmqpValue::ShortInt(10)), true),
                Found::UnderScreen(10),
            ),
            (
                args(Some(AmqpValue::LongLongInt(11)), false),
                Found::Drops(11),
            ),
            (args(None, true), Found::Missing),
            (
                args(Some(AmqpValue::LongString("11".into())), true),
                Found::Missing,
            ),
        ];
        for (arguments, want) in cases {
            assert_eq!(
                find(&quorum, &republish, &arguments),
                Some(want),
                "{arguments:?}"
            );
        }
        // A policy sets the dead-letter exchange: trusted, as in nack mode.
        let by_policy = inbound(QueueType::Quorum, true);
        let limit = args(Some(AmqpValue::LongLongInt(11)), false);
        assert_eq!(find(&by_policy, &nack, &limit), Some(Found::Limit(11)));
        let classic = inbound(QueueType::Classic, false);
        assert_eq!(find(&classic, &nack, &args(None, false)), None);
    }
}
