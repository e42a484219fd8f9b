//! `--since`: where in the stream a trace starts reading. A duration back
//! from now (`30s`, `90m`, `24h`, `7d`, or several, `1h30m`) or an RFC 3339
//! time, taken to the whole second (the stream is addressed in seconds).

use crate::duration::parse_duration;
use std::fmt;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// `--since` when it is not given.
pub const DEFAULT_SINCE: &str = "24h";

/// The part of the stream a trace reads: from `start` to the stream's end
/// when the command started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Unix seconds of the first chunk read.
    pub start: i64,
    /// The duration as given, when `--since` was one.
    pub given: Option<String>,
}

impl Window {
    /// The window `since` names (a duration or an RFC 3339 time), at
    /// `now` (unix seconds).
    pub fn parse(since: &str, now: i64) -> Result<Self, String> {
        let since = since.trim();
        if let Ok(at) = OffsetDateTime::parse(since, &Rfc3339) {
            return Ok(Self {
                start: at.unix_timestamp(),
                given: None,
            });
        }
        let back = parse_duration(since).map_err(|e| {
            format!(
                "{e}; expected a duration (30s, 90m, 24h, 7d) or an RFC 3339 time \
                 (2026-12-05T13:00:00Z)"
            )
        })?;
        let back = i64::try_from(back.as_secs()).map_err(|_| "too large".to_owned())?;
        Ok(Self {
            start: now.saturating_sub(back),
            given: Some(since.to_owned()),
        })
    }

    /// The stream offset to read from: unix seconds, none before 1970.
    pub fn from_secs(&self) -> u64 {
        u64::try_from(self.start).unwrap_or(0)
    }
}

/// `since 2026-12-05T13:00:00Z (24h)`.
impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = OffsetDateTime::from_unix_timestamp(self.start)
            .ok()
            .and_then(|at| at.format(&Rfc3339).ok())
            .unwrap_or_else(|| self.start.to_string());
        write!(f, "since {at}")?;
        if let Some(given) = &self.given {
            write!(f, " ({given})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_475_600; // 2026-12-05T13:00:00Z

    #[test]
    fn durations_reach_back_from_now() {
        for (text, secs) in [
            ("24h", 86_400),
            ("90m", 5400),
            ("7d", 604_800),
            ("30s", 30),
            ("1h30m", 5400),
        ] {
            let window = Window::parse(text, NOW).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(window.start, NOW - secs, "{text}");
            assert_eq!(window.given.as_deref(), Some(text));
        }
        let day = Window::parse("24h", NOW + 86_400).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(day.to_string(), "since 2026-12-05T13:00:00Z (24h)");
    }

    #[test]
    fn a_time_is_taken_as_given_to_the_second() {
        let window =
            Window::parse("2026-12-05T14:00:00.750+01:00", NOW).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(window.start, NOW);
        assert_eq!(window.to_string(), "since 2026-12-05T13:00:00Z");
        let early = Window::parse("1960-01-01T00:00:00Z", NOW).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(early.from_secs(), 0);
    }

    #[test]
    fn anything_else_says_what_is_expected() {
        for bad in [
            "",
            "soon",
            "24",
            "h",
            "24x",
            "-1h",
            "1.5h",
            "2026-12-05",
            "999999999999999d",
        ] {
            let err = Window::parse(bad, NOW).err().unwrap_or_default();
            assert!(
                err.contains("expected a duration") || err.contains("too large"),
                "{bad:?}: {err}"
            );
        }
    }
}
