//! W3C Trace Context (version 00): the `traceparent` and `tracestate` a
//! message or request carries, read once when it arrives, and the
//! `traceparent` each copy carries: the same trace, with the forwarder's
//! publish span as its parent.

use crate::amqp::{AmqpValue, FieldTable};
use std::fmt::Write as _;

/// The header (and HTTP header) naming the producer's span.
pub const TRACEPARENT: &str = "traceparent";
/// Vendor-specific trace state, carried unchanged.
pub const TRACESTATE: &str = "tracestate";

/// The longest `tracestate` carried (W3C allows 32 members of up to 256
/// bytes; anything longer is dropped, not truncated).
const MAX_TRACESTATE: usize = 8192;

/// One message's place in a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The trace, the producer's or a new one.
    pub trace_id: u128,
    /// The producer's span; `None` for a new trace.
    pub parent: Option<u64>,
    /// The forwarder's own span for this message (the forward).
    pub span: u64,
    /// The producer's sampled flag; `None` for a new trace (the sampler
    /// decides).
    pub sampled: Option<bool>,
    /// The incoming `tracestate`, as it came.
    pub state: Option<String>,
    /// A `traceparent` was present but malformed (a new trace was started).
    pub malformed: bool,
}

impl Default for Trace {
    /// A new trace.
    fn default() -> Self {
        Self {
            trace_id: nonzero_u128(),
            parent: None,
            span: nonzero_u64(),
            sampled: None,
            state: None,
            malformed: false,
        }
    }
}

impl Trace {
    /// The trace a message's headers continue, or a new one.
    pub fn from_headers(headers: Option<&FieldTable>) -> Self {
        let text = |name: &str| match headers?.inner().get(name)? {
            AmqpValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AmqpValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        };
        Self::from_texts(
            text(TRACEPARENT),
            text(TRACESTATE),
            headers.is_some_and(|h| h.inner().contains_key(TRACEPARENT)),
        )
    }

    /// The trace of `traceparent` (present: `present`) and `tracestate`.
    pub fn from_texts(traceparent: Option<&str>, tracestate: Option<&str>, present: bool) -> Self {
        match traceparent.and_then(parse) {
            Some((trace_id, parent, sampled)) => Self {
                trace_id,
                parent: Some(parent),
                sampled: Some(sampled),
                state: tracestate
                    .filter(|s| s.len() <= MAX_TRACESTATE && s.is_ascii())
                    .map(str::to_owned),
                ..Self::default()
            },
            None => Self {
                malformed: present,
                ..Self::default()
            },
        }
    }

    /// The trace id as 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    /// The `traceparent` of a copy published in span `span`.
    pub fn child(&self, span: u64, sampled: bool) -> String {
        let mut out = String::with_capacity(55);
        let _ = write!(
            out,
            "00-{:032x}-{:016x}-{}",
            self.trace_id,
            span,
            if sampled { "01" } else { "00" }
        );
        out
    }
}

/// `version-traceid-parentid-flags` of version 00: the trace id, the
/// parent span and the sampled flag. All-zero ids are invalid. A higher
/// version is read as 00 when its first four fields are well formed, as
/// the specification asks.
fn parse(text: &str) -> Option<(u128, u64, bool)> {
    let text = text.trim();
    let mut parts = text.split('-');
    let version = parts.next()?;
    let trace_id = parts.next()?;
    let parent = parts.next()?;
    let flags = parts.next()?;
    let rest = parts.next();
    let hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !hex(version, 2)
        || version == "ff"
        || !hex(trace_id, 32)
        || !hex(parent, 16)
        || !hex(flags, 2)
    {
        return None;
    }
    if version == "00" && rest.is_some() {
        return None;
    }
    let trace_id = u128::from_str_radix(trace_id, 16)
        .ok()
        .filter(|t| *t != 0)?;
    let parent = u64::from_str_radix(parent, 16).ok().filter(|p| *p != 0)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((trace_id, parent, flags & 1 == 1))
}

/// A random span id (never zero, which W3C reserves).
pub fn nonzero_u64() -> u64 {
    fastrand::u64(1..)
}

fn nonzero_u128() -> u128 {
    fastrand::u128(1..)
}

/// Whether a new trace is sampled at `ratio` (0.0 to 1.0): decided by the
/// trace id, so every instance decides the same for one trace.
pub fn sampled_at(trace_id: u128, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    // The low 56 bits, as the OpenTelemetry ratio sampler reads them.
    let low = (trace_id as u64) & ((1 << 56) - 1);
    (low as f64) < ratio * (1u64 << 56) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_continued() {
        let trace = Trace::from_texts(Some(GOOD), Some("congo=t61rcWkgMzE"), true);
        assert_eq!(trace.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(trace.parent, Some(0x00f0_67aa_0ba9_02b7));
        assert_eq!(trace.sampled, Some(true));
        assert_eq!(trace.state.as_deref(), Some("congo=t61rcWkgMzE"));
        assert!(!trace.malformed);
        let child = trace.child(0xabcd, true);
        assert_eq!(
            child,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-000000000000abcd-01"
        );
        assert_eq!(parse(&child), Some((trace.trace_id, 0xabcd, true)));
    }

    #[test]
    fn malformed_traceparents_start_a_new_trace_and_say_so() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
        ] {
            let trace = Trace::from_texts(Some(bad), Some("a=b"), true);
            assert!(trace.malformed, "{bad:?}");
            assert_eq!(trace.parent, None, "{bad:?}");
            assert_eq!(trace.state, None, "{bad:?}");
            assert_ne!(trace.trace_id, 0);
        }
        let absent = Trace::from_texts(None, None, false);
        assert!(!absent.malformed);
        assert_eq!(absent.parent, None);
    }

    #[test]
    fn a_later_version_is_read_as_00() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more";
        let trace = Trace::from_texts(Some(later), None, true);
        assert_eq!(trace.parent, Some(0x00f0_67aa_0ba9_02b7));
        assert_eq!(trace.sampled, Some(false));
    }

    #[test]
    fn the_ratio_samples_by_trace_id() {
        assert!(sampled_at(u128::MAX, 1.0));
        assert!(!sampled_at(1, 0.0));
        let sampled = (0..10_000u128)
            .filter(|i| sampled_at(fastrand::u128(..) ^ i, 0.25))
            .count();
        assert!((2_000..3_000).contains(&sampled), "{sampled}");
    }
}
