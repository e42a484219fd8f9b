//! Declaring a queue that may already exist: its type and the arguments
//! that matter are compared, the others an operator set are read back from
//! the broker's refusal and kept, and a mismatch that matters becomes one
//! line naming the argument, the queue's message count and what to change.

use super::operation::{Op, TopologyError, declare_queue, message_count, passive_queue};
use crate::amqp::{AmqpValue, FieldTable};
use crate::broker::connector::Connector;
use crate::destination::QueueType;
use crate::errors::one_line_text;

/// Most arguments of an existing queue that are read back and kept; the
/// broker knows fewer declarable arguments than this.
const MAX_ADOPTED: usize = 24;

/// The arguments that make a quorum queue's dead-lettering at-least-once.
const AT_LEAST_ONCE: [&str; 2] = ["x-dead-letter-strategy", "x-overflow"];

/// What a required argument stands for in the configuration, to say what
/// to change when a queue disagrees.
#[derive(Debug, Clone)]
pub(super) enum Setting {
    QueueType {
        type_key: String,
    },
    DeadLetterExchange,
    DeadLetterRoutingKey,
    SingleActiveConsumer,
    /// The journal's stream.
    Stream,
}

#[derive(Debug, Clone)]
struct Required {
    name: &'static str,
    /// `None`: the queue must not have this argument.
    value: Option<AmqpValue>,
    setting: Setting,
}

/// A queue as the configuration wants it.
#[derive(Debug, Clone)]
pub(super) struct QueueSpec<'a> {
    /// The configuration key naming the queue, for messages.
    key: String,
    name: &'a str,
    broker: &'a str,
    /// Create it if missing; otherwise it must already exist.
    create: bool,
    /// Arguments that must hold; an existing queue that differs is refused.
    required: Vec<Required>,
    /// Arguments a new queue gets; an existing queue keeps its own.
    preferred: Vec<(&'static str, AmqpValue)>,
}

impl<'a> QueueSpec<'a> {
    pub(super) fn new(key: &str, name: &'a str, broker: &'a str, create: bool) -> Self {
        Self {
            key: key.to_owned(),
            name,
            broker,
            create,
            required: Vec::new(),
            preferred: Vec::new(),
        }
    }

    /// A classic queue is declared without `x-queue-type` (the broker's
    /// default), so queues declared before this option existed still match.
    pub(super) fn typed(mut self, type_key: &str, queue_type: QueueType) -> Self {
        let value = match queue_type {
            QueueType::Classic => None,
            QueueType::Quorum => Some(AmqpValue::LongString("quorum".into())),
        };
        self.require(
            "x-queue-type",
            value,
            Setting::QueueType {
                type_key: type_key.to_owned(),
            },
        );
        self
    }

    pub(super) fn require(
        &mut self,
        name: &'static str,
        value: Option<AmqpValue>,
        setting: Setting,
    ) {
        self.required.push(Required {
            name,
            value,
            setting,
        });
    }

    pub(super) fn prefer(&mut self, name: &'static str, value: AmqpValue) {
        self.preferred.push((name, value));
    }

    fn arguments(&self) -> Vec<(String, AmqpValue)> {
        let required = self
            .required
            .iter()
            .filter_map(|r| Some((r.name.to_owned(), r.value.clone()?)));
        let preferred = self
            .preferred
            .iter()
            .map(|(name, value)| ((*name).to_owned(), value.clone()));
        required.chain(preferred).collect()
    }

    fn describe(&self) -> String {
        format!(
            "{} \"{}\" on broker \"{}\"",
            self.key, self.name, self.broker
        )
    }
}

/// Declares `spec` (or checks it exists, when it may not be created) and
/// redeclares it until the broker accepts: each refusal over an argument
/// that does not matter adopts the queue's own value; one over an argument
/// that matters is an error. Returns the arguments the broker accepted:
/// of those the broker compares, the queue has exactly these.
// Kept as one loop (about 80 lines): declare, read the refusal, adopt or fail.
pub(super) async fn ensure_queue(
    connector: &Connector,
    spec: &QueueSpec<'_>,
) -> Result<Vec<(String, AmqpValue)>, TopologyError> {
    if !spec.create {
        passive_queue(connector, spec.name)
            .await
            .map_err(|e| match e {
                Op::Refused(404, _) => TopologyError::Mismatch(format!(
                    "{} \"{}\" does not exist on broker \"{}\": create it, or set inbound.declare = true",
                    spec.key, spec.name, spec.broker
                )),
                other => other.into_error(&format!("{} \"{}\"", spec.key, spec.name)),
            })?;
    }
    let mut arguments = spec.arguments();
    let mut adopted: Vec<String> = Vec::new();
    loop {
        let table = table_of(&arguments);
        let text = match declare_queue(connector, spec.name, table).await {
            Ok(()) => return Ok(arguments),
            Err(Op::Refused(406, text)) => text,
            Err(other) => return Err(other.into_error(&spec.describe())),
        };
        let Some(mismatch) = Mismatch::parse(&text) else {
            return Err(refused(connector, spec, &text).await);
        };
        let required = spec.required.iter().find(|r| r.name == mismatch.arg);
        if let Some(required) = required
            && !same_setting(required, mismatch.current.as_ref())
        {
            return Err(mismatch_error(connector, spec, required, &mismatch, &text).await);
        }
        let learnable = mismatch.arg.starts_with("x-")
            && adopted.len() < MAX_ADOPTED
            && !adopted.contains(&mismatch.arg);
        let current = match &mismatch.current {
            _ if !learnable => return Err(refused(connector, spec, &text).await),
            None => None,
            Some(value) => {
                let sent = arguments
                    .iter()
                    .find(|(name, _)| *name == mismatch.arg)
                    .map(|(_, v)| v);
                match value.to_amqp(sent) {
                    Some(v) => Some(v),
                    None => return Err(refused(connector, spec, &text).await),
                }
            }
        };
        let preferred = spec.preferred.iter().any(|(name, _)| *name == mismatch.arg);
        let at_least_once = |arg: &str| AT_LEAST_ONCE.contains(&arg);
        if preferred
            && at_least_once(&mismatch.arg)
            && !adopted.iter().any(|arg| at_least_once(arg))
        {
            tracing::warn!(
                queue = %spec.name,
                argument = %mismatch.arg,
                current = %mismatch.current_text(),
                "{} exists without at-least-once dead-lettering (x-dead-letter-strategy = at-least-once, \
                 x-overflow = reject-publish): its dead letters are at-most-once; keeping it",
                spec.key
            );
        } else if required.is_none() {
            tracing::info!(
                queue = %spec.name,
                argument = %mismatch.arg,
                current = %mismatch.current_text(),
                "{} keeps its own {}",
                spec.key,
                mismatch.arg
            );
        }
        arguments.retain(|(name, _)| *name != mismatch.arg);
        if let Some(value) = current {
            arguments.push((mismatch.arg.clone(), value));
        }
        adopted.push(mismatch.arg);
    }
}

/// Whether the queue's `current` value satisfies `required`: only a
/// classic queue that names its type explicitly differs in form, not in fact.
fn same_setting(required: &Required, current: Option<&CurrentValue>) -> bool {
    match (&required.setting, &required.value, current) {
        (Setting::QueueType { .. }, None, Some(c)) => c.text == "classic",
        _ => false,
    }
}

/// The queue's current value of one argument, as the broker printed it.
#[derive(Debug, Clone, PartialEq)]
struct CurrentValue {
    text: String,
    /// The broker's type name (`longstr`, `long`, `bool`...); `None` for a
    /// queue property such as `durable`.
    kind: Option<String>,
}

impl CurrentValue {
    /// The same value as a declare argument, when its type can be sent
    /// back. The broker leaves the type out when it equals the type of the
    /// value `sent`, so that one stands in for it.
    fn to_amqp(&self, sent: Option<&AmqpValue>) -> Option<AmqpValue> {
        let kind = match (self.kind.as_deref(), sent) {
            (Some(kind), _) => kind,
            (None, Some(AmqpValue::LongString(_) | AmqpValue::ShortString(_))) => "longstr",
            (None, Some(AmqpValue::Boolean(_))) => "bool",
            (None, Some(AmqpValue::Double(_))) => "double",
            (
                None,
                Some(
                    AmqpValue::LongLongInt(_)
                    | AmqpValue::LongInt(_)
                    | AmqpValue::ShortInt(_)
                    | AmqpValue::ShortShortInt(_),
                ),
            ) => "long",
            (None, _) => return None,
        };
        match kind {
            "longstr" => Some(AmqpValue::LongString(self.text.as_str().into())),
            "long" | "signedint" | "short" | "byte" => {
                self.text.parse().ok().map(AmqpValue::LongLongInt)
            }
            "bool" => match self.text.as_str() {
                "true" => Some(AmqpValue::Boolean(true)),
                "false" => Some(AmqpValue::Boolean(false)),
                _ => None,
            },
            "double" => self.text.parse().ok().map(AmqpValue::Double),
            _ => None,
        }
    }
}

/// A broker refusal of the form "inequivalent arg 'K' for queue ...:
/// received X but current is Y".
#[derive(Debug, Clone, PartialEq)]
struct Mismatch {
    arg: String,
    /// `None`: the queue does not have the argument.
    current: Option<CurrentValue>,
}

impl Mismatch {
    fn parse(text: &str) -> Option<Self> {
        let rest = text.split_once("inequivalent arg '")?.1;
        let (arg, rest) = rest.split_once('\'')?;
        let current = rest.rsplit_once("but current is ")?.1.trim();
        let current = if current == "none" {
            None
        } else if let Some(typed) = current.strip_prefix("the value '") {
            let (value, kind) = typed.rsplit_once("' of type '")?;
            Some(CurrentValue {
                text: value.to_owned(),
                kind: Some(kind.trim_end_matches('\'').to_owned()),
            })
        } else {
            Some(CurrentValue {
                text: current.trim_matches('\'').to_owned(),
                kind: None,
            })
        };
        Some(Self {
            arg: arg.to_owned(),
            current,
        })
    }

    fn current_text(&self) -> String {
        self.current
            .as_ref()
            .map_or_else(|| "none".to_owned(), |c| format!("\"{}\"", c.text))
    }
}

fn display(value: Option<&AmqpValue>) -> String {
    match value {
        None => "none".to_owned(),
        Some(AmqpValue::LongString(s)) => format!("\"{s}\""),
        Some(AmqpValue::Boolean(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
    }
}

/// What to change in the configuration so it agrees with the queue.
fn advice(required: &Required, current: Option<&str>) -> String {
    match (&required.setting, current) {
        (Setting::QueueType { type_key }, None | Some("classic")) => {
            format!("set {type_key} = \"classic\"")
        }
        (Setting::QueueType { type_key }, Some("quorum")) => {
            format!("set {type_key} = \"quorum\"")
        }
        (Setting::QueueType { .. }, Some(other)) => format!(
            "switchyard declares classic and quorum queues, not \"{other}\"; use another queue"
        ),
        (Setting::DeadLetterExchange, Some(exchange)) => format!(
            "set dead_letter.exchange = \"{exchange}\", or dead_letter.mode = \"republish\""
        ),
        (Setting::DeadLetterExchange, None) => "in nack mode a nacked message would be discarded: \
             set inbound.dead_letter_by_policy = true if a policy sets its dead-letter exchange, \
             or dead_letter.mode = \"republish\""
            .to_owned(),
        (Setting::DeadLetterRoutingKey, Some(key)) => {
            format!("set dead_letter.routing_key = \"{key}\", or dead_letter.mode = \"republish\"")
        }
        (Setting::DeadLetterRoutingKey, None) => "its dead letters keep their own routing key \
             and miss dead_letter.routing_key: set dead_letter.mode = \"republish\""
            .to_owned(),
        (Setting::Stream, _) => "switchyard needs a stream by that name: set journal.stream (or \
             control.stream) to another name"
            .to_owned(),
        (Setting::SingleActiveConsumer, _) => {
            "set inbound.single_active_consumer = false".to_owned()
        }
    }
}

/// What deleting the queue would cost, said plainly.
fn deletion(spec: &QueueSpec<'_>, messages: Option<u32>) -> String {
    let recreate = if spec.create {
        "let switchyard declare it"
    } else {
        "recreate it as configured"
    };
    match messages {
        Some(0) => format!("or delete the queue (it is empty) and {recreate}"),
        Some(1) => "deleting the queue instead would discard the 1 message it holds".to_owned(),
        Some(n) => format!("deleting the queue instead would discard the {n} messages it holds"),
        None => "deleting the queue instead would discard the messages it holds".to_owned(),
    }
}

async fn mismatch_error(
    connector: &Connector,
    spec: &QueueSpec<'_>,
    required: &Required,
    mismatch: &Mismatch,
    text: &str,
) -> TopologyError {
    let messages = message_count(connector, spec.name).await;
    let current = mismatch.current.as_ref().map(|c| c.text.as_str());
    let wanted = match (&required.setting, &required.value) {
        (Setting::QueueType { .. }, None) => "\"classic\"".to_owned(),
        (_, value) => display(value.as_ref()),
    };
    TopologyError::Mismatch(format!(
        "{} has {} = {} where the configuration needs {}: {}; {} (broker: {})",
        spec.describe(),
        mismatch.arg,
        mismatch.current_text(),
        wanted,
        advice(required, current),
        deletion(spec, messages),
        one_line_text(text)
    ))
}

async fn refused(connector: &Connector, spec: &QueueSpec<'_>, text: &str) -> TopologyError {
    let holds = match message_count(connector, spec.name).await {
        Some(1) => "; it holds 1 message".to_owned(),
        Some(n) => format!("; it holds {n} messages"),
        None => String::new(),
    };
    TopologyError::Mismatch(format!(
        "{} exists with settings switchyard cannot match ({}){holds}: declare it durable, \
         non-exclusive and without auto-delete, or name another queue",
        spec.describe(),
        one_line_text(text)
    ))
}

fn table_of(arguments: &[(String, AmqpValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in arguments {
        table.insert(name.as_str().into(), value.clone());
    }
    table
}

#[cfg(test)]
mod tests {
    use super::{CurrentValue, Mismatch};
    use crate::amqp::AmqpValue;

    #[test]
    fn refusals_name_the_argument_and_the_queues_value() {
        let cases = [
            (
                "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': \
                 received none but current is the value 'quorum' of type 'longstr'",
                "x-queue-type",
                Some(("quorum", Some("longstr"))),
            ),
            (
                "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'q' in \
                 vhost '/': received the value 'a.dlx' of type 'longstr' but current is none",
                "x-dead-letter-exchange",
                None,
            ),
            (
                "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost 'v': \
                 received none but current is the value '10' of type 'signedint'",
                "x-max-length",
                Some(("10", Some("signedint"))),
            ),
            (
                "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': \
                 received 'true' but current is 'false'",
                "durable",
                Some(("false", None)),
            ),
            (
                "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-routing-key' for queue 'it''s' \
                 in vhost '/': received none but current is the value 'a ' of type 'b' of type 'longstr'",
                "x-dead-letter-routing-key",
                Some(("a ' of type 'b", Some("longstr"))),
            ),
        ];
        for (text, arg, current) in cases {
            let parsed = Mismatch::parse(text).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(parsed.arg, arg);
            let current = current.map(|(text, kind)| CurrentValue {
                text: text.to_owned(),
                kind: kind.map(str::to_owned),
            });
            assert_eq!(parsed.current, current, "{text}");
        }
        assert_eq!(Mismatch::parse("NOT_FOUND - no queue 'q'"), None);
    }

    #[test]
    fn adopted_values_keep_their_type_class() {
        let value = |text: &str, kind: &str| {
            CurrentValue {
                text: text.to_owned(),
                kind: Some(kind.to_owned()),
            }
            .to_amqp(None)
        };
        assert_eq!(value("10", "signedint"), Some(AmqpValue::LongLongInt(10)));
        assert_eq!(
            value("drop-head", "longstr"),
            Some(AmqpValue::LongString("drop-head".into()))
        );
        assert_eq!(value("true", "bool"), Some(AmqpValue::Boolean(true)));
        assert_eq!(value("x", "signedint"), None);
        assert_eq!(value("[]", "array"), None);
        // Untyped: the broker printed a value of the type that was sent.
        let untyped = |text: &str| CurrentValue {
            text: text.to_owned(),
            kind: None,
        };
        assert_eq!(untyped("false").to_amqp(None), None);
        assert_eq!(
            untyped("a.dlx").to_amqp(Some(&AmqpValue::LongString("".into()))),
            Some(AmqpValue::LongString("a.dlx".into()))
        );
        assert_eq!(
            untyped("7").to_amqp(Some(&AmqpValue::LongInt(3))),
            Some(AmqpValue::LongLongInt(7))
        );
    }
}
