//! How a value is tested: a header's, a property's or a JSON body's, each
//! by its text form, numbers formatted on the stack.

use crate::amqp::AmqpValue;
use regex::Regex;
use std::fmt::{self, Display, Write as _};

/// How a value is tested.
#[derive(Debug)]
pub enum ValueTest {
    /// Text form equals.
    Equals(String),
    /// Present, whatever its value.
    Exists,
    /// Text form matches the regular expression (unanchored, like `grep`).
    Regex(Regex),
    /// Text form is one of these.
    In(Vec<String>),
}

impl ValueTest {
    /// Tests a present value's text form.
    pub(super) fn text(&self, value: &str) -> bool {
        match self {
            Self::Exists => true,
            Self::Equals(expected) => value == expected,
            Self::Regex(re) => re.is_match(value),
            Self::In(options) => options.iter().any(|o| o == value),
        }
    }

    /// Tests the text form of a number, formatted on the stack.
    pub(super) fn display(&self, value: impl Display) -> bool {
        let mut text = StackText::default();
        if write!(text, "{value}").is_ok() {
            self.text(text.as_str())
        } else {
            self.text(&value.to_string())
        }
    }

    /// Tests a present header value: scalars by their text form (the same as
    /// [`crate::envelope::value_text`]); values without one satisfy only
    /// [`ValueTest::Exists`].
    pub(super) fn amqp(&self, value: &AmqpValue) -> bool {
        match value {
            AmqpValue::Boolean(b) => self.text(if *b { "true" } else { "false" }),
            AmqpValue::ShortShortInt(n) => self.display(n),
            AmqpValue::ShortShortUInt(n) => self.display(n),
            AmqpValue::ShortInt(n) => self.display(n),
            AmqpValue::ShortUInt(n) => self.display(n),
            AmqpValue::LongInt(n) => self.display(n),
            AmqpValue::LongUInt(n) => self.display(n),
            AmqpValue::LongLongInt(n) => self.display(n),
            AmqpValue::Float(f) => self.display(f),
            AmqpValue::Double(f) => self.display(f),
            AmqpValue::Timestamp(t) => self.display(t),
            AmqpValue::ShortString(s) => self.text(s.as_str()),
            AmqpValue::LongString(s) => self.text(&String::from_utf8_lossy(s.as_bytes())),
            AmqpValue::DecimalValue(_)
            | AmqpValue::FieldArray(_)
            | AmqpValue::FieldTable(_)
            | AmqpValue::ByteArray(_)
            | AmqpValue::Void => matches!(self, Self::Exists),
        }
    }

    /// Tests a present JSON value: strings as they are, numbers in decimal
    /// (integers exactly, others as a header's float is written), booleans
    /// as `true`/`false`; null, arrays and objects satisfy only
    /// [`ValueTest::Exists`].
    pub(super) fn json(&self, value: &serde_json::Value) -> bool {
        use serde_json::Value as J;
        match value {
            J::String(s) => self.text(s),
            J::Bool(b) => self.text(if *b { "true" } else { "false" }),
            J::Number(n) => {
                if let Some(i) = n.as_i64() {
                    self.display(i)
                } else if let Some(u) = n.as_u64() {
                    self.display(u)
                } else {
                    n.as_f64().is_some_and(|f| self.display(f))
                }
            }
            J::Null | J::Array(_) | J::Object(_) => matches!(self, Self::Exists),
        }
    }
}

/// A short text formatted without allocating; writing past its capacity
/// fails, and the caller formats on the heap instead.
struct StackText {
    buf: [u8; 64],
    len: usize,
}

impl Default for StackText {
    fn default() -> Self {
        Self {
            buf: [0; 64],
            len: 0,
        }
    }
}

impl StackText {
    fn as_str(&self) -> &str {
        // Only whole `str`s are ever written, so this is always UTF-8.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let slot = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}
