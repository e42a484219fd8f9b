//! The AMQP properties a `property` filter tests, by the names the
//! configuration gives them.

use super::value::ValueTest;
use crate::amqp::{ShortString, short_text};
use crate::envelope::Envelope;

/// The AMQP properties a `property` filter can test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Property {
    /// `content_type`
    ContentType,
    /// `content_encoding`
    ContentEncoding,
    /// `type`
    Type,
    /// `app_id`
    AppId,
    /// `correlation_id`
    CorrelationId,
    /// `reply_to`
    ReplyTo,
    /// `user_id`
    UserId,
    /// `message_id`
    MessageId,
    /// `priority`
    Priority,
    /// `expiration`
    Expiration,
}

impl Property {
    /// Every name accepted in configuration, for error messages.
    pub const NAMES: &'static [&'static str] = &[
        "content_type",
        "content_encoding",
        "type",
        "app_id",
        "correlation_id",
        "reply_to",
        "user_id",
        "message_id",
        "priority",
        "expiration",
    ];

    /// Parses a configuration name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "content_type" => Self::ContentType,
            "content_encoding" => Self::ContentEncoding,
            "type" => Self::Type,
            "app_id" => Self::AppId,
            "correlation_id" => Self::CorrelationId,
            "reply_to" => Self::ReplyTo,
            "user_id" => Self::UserId,
            "message_id" => Self::MessageId,
            "priority" => Self::Priority,
            "expiration" => Self::Expiration,
            _ => return None,
        })
    }

    pub(super) fn test(self, envelope: &Envelope, test: &ValueTest) -> bool {
        let p = &envelope.properties;
        let text = |s: &Option<ShortString>| s.as_ref().is_some_and(|s| test.text(&short_text(s)));
        match self {
            Self::ContentType => text(p.content_type()),
            Self::ContentEncoding => text(p.content_encoding()),
            Self::Type => text(p.kind()),
            Self::AppId => text(p.app_id()),
            Self::CorrelationId => text(p.correlation_id()),
            Self::ReplyTo => text(p.reply_to()),
            Self::UserId => text(p.user_id()),
            Self::MessageId => text(p.message_id()),
            Self::Expiration => text(p.expiration()),
            Self::Priority => p.priority().is_some_and(|n| test.display(n)),
        }
    }
}
