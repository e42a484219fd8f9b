//! The inbound queue's delivery limit: what ends the one loop the
//! forwarder cannot end itself.
//!
//! A message whose content header is larger than the connection's
//! `frame_max` cannot be read by the client, which closes the connection
//! on the frame; the message is neither forwarded nor settled, and the
//! broker hands it out again, for ever. A quorum queue makes one out of a
//! header just under the limit by adding `x-delivery-count` when it
//! redelivers. Only the broker can then remove it: a quorum queue
//! dead-letters a message returned more often than its delivery limit
//! (reason `delivery_limit`), through its dead-letter exchange, and drops
//! it when it has none. Classic queues have no delivery limit.
//!
//! switchyard declares a quorum inbound queue it creates with
//! `x-delivery-limit` one above `inbound.max_redeliveries`, so every
//! message it can read is still judged by its own screen first (`poison`).
//! A queue created without it gets it from a policy: this module writes
//! that policy as one `rabbitmqctl` line. Pure: no I/O.

use super::Inbound;
use crate::destination::{DeadLetter, QueueType};

impl Inbound {
    /// The `x-delivery-limit` a quorum inbound queue is declared with, and
    /// the limit its policy should set: one above `max_redeliveries`.
    /// `None` for a classic queue, which has no delivery limit.
    pub fn delivery_limit(&self) -> Option<u32> {
        (self.queue_type == QueueType::Quorum).then(|| self.max_redeliveries.saturating_add(1))
    }
}

/// The `rabbitmqctl set_policy` line that gives the inbound queue the
/// delivery limit, together with the dead-letter exchange and routing key
/// a message at the limit goes through, dead-lettered at least once (a
/// quorum queue's default is at most once, which can drop it; at least
/// once needs `overflow = reject-publish`) (a queue follows one policy, and
/// without a dead-letter exchange the broker drops the message at the
/// limit; the queue's own dead-letter arguments, if any, take precedence
/// over the policy's). `None` for a classic queue.
/// `vhost` is the inbound broker's.
pub fn delivery_limit_policy(
    inbound: &Inbound,
    dead_letter: &DeadLetter,
    vhost: &str,
) -> Option<String> {
    let limit = inbound.delivery_limit()?;
    let mut definition = serde_json::Map::new();
    definition.insert("delivery-limit".into(), limit.into());
    definition.insert(
        "dead-letter-exchange".into(),
        dead_letter.exchange.as_str().into(),
    );
    if !dead_letter.routing_key.is_empty() {
        definition.insert(
            "dead-letter-routing-key".into(),
            dead_letter.routing_key.as_str().into(),
        );
    }
    // As switchyard declares its own quorum queues: without these the
    // broker dead-letters at most once, and can drop a message at the limit.
    definition.insert("dead-letter-strategy".into(), "at-least-once".into());
    definition.insert("overflow".into(), "reject-publish".into());
    let definition = serde_json::Value::Object(definition).to_string();
    Some(format!(
        "rabbitmqctl set_policy -p {} --apply-to queues {} {} {}",
        shell_quote(vhost),
        shell_quote(&format!("switchyard-{}", inbound.queue)),
        shell_quote(&format!("^{}$", regex::escape(&inbound.queue))),
        shell_quote(&definition)
    ))
}

/// `text` as one single-quoted shell word.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::delivery_limit_policy;
    use crate::config::{BrokerSpec, Inbound};
    use crate::destination::{DeadLetter, DeadLetterMode, QueueType};

    fn inbound(queue: &str, queue_type: QueueType) -> Inbound {
        Inbound::sample(queue, queue_type)
    }

    fn dead_letter(exchange: &str, routing_key: &str) -> DeadLetter {
        DeadLetter {
            mode: DeadLetterMode::Republish,
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            queue: None,
            queue_type: QueueType::Classic,
        }
    }

    #[test]
    fn a_quorum_queue_gets_one_above_max_redeliveries_and_a_classic_one_none() {
        assert_eq!(inbound("q", QueueType::Quorum).delivery_limit(), Some(11));
        assert_eq!(inbound("q", QueueType::Classic).delivery_limit(), None);
        let mut most = inbound("q", QueueType::Quorum);
        most.max_redeliveries = u32::MAX;
        assert_eq!(most.delivery_limit(), Some(u32::MAX));
    }

    #[test]
    fn the_policy_line_names_the_vhost_the_queue_alone_and_its_dead_letters() {
        let broker = BrokerSpec::new("main", "amqp://u:secret@h:5672/%2f");
        let line = delivery_limit_policy(
            &inbound("work.in", QueueType::Quorum),
            &dead_letter("work.dlx", "work.dlq"),
            &broker.vhost(),
        );
        assert_eq!(
            line.as_deref(),
            Some(
                r#"rabbitmqctl set_policy -p '/' --apply-to queues 'switchyard-work.in' '^work\.in$' '{"dead-letter-exchange":"work.dlx","dead-letter-routing-key":"work.dlq","dead-letter-strategy":"at-least-once","delivery-limit":11,"overflow":"reject-publish"}'"#
            )
        );
        let odd = BrokerSpec::new("main", "amqp://u:secret@h/prod");
        let line = delivery_limit_policy(
            &inbound("it's (1)", QueueType::Quorum),
            &dead_letter("", "dlq"),
            &odd.vhost(),
        )
        .unwrap_or_default();
        assert!(
            line.starts_with("rabbitmqctl set_policy -p 'prod' "),
            "{line}"
        );
        assert!(line.contains(r#"'^it'\''s \(1\)$'"#), "{line}");
        assert!(line.contains(r#""dead-letter-exchange":"""#), "{line}");
        assert!(!line.contains("secret"), "{line}");
        let classic = delivery_limit_policy(
            &inbound("q", QueueType::Classic),
            &dead_letter("x", ""),
            &broker.vhost(),
        );
        assert_eq!(classic, None);
    }

    #[test]
    fn an_empty_routing_key_is_left_out() {
        let broker = BrokerSpec::new("main", "amqp://h");
        let line = delivery_limit_policy(
            &inbound("q", QueueType::Quorum),
            &dead_letter("x", ""),
            &broker.vhost(),
        )
        .unwrap_or_default();
        assert!(
            line.ends_with(r#"'{"dead-letter-exchange":"x","dead-letter-strategy":"at-least-once","delivery-limit":11,"overflow":"reject-publish"}'"#),
            "{line}"
        );
    }
}
