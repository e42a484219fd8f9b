//! Durations as operators type them on the command line (`10m`, `2h`,
//! `1d`, `1h30m`): `dlq --older-than` and `trace --since` read them alike.

use std::time::Duration;

/// Parses a duration: one or more `<number><unit>` with units `s`, `m`,
/// `h`, `d` (`10m`, `2h`, `1d`, `1h30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty; expected a duration such as 10m, 2h or 1d".to_owned());
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!(
                "expected a number at \"{rest}\" (e.g. 10m, 2h, 1d)"
            ));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("\"{}\" is too large", &rest[..digits]))?;
        let after = &rest[digits..];
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let seconds = match &after[..unit_len] {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            "" => {
                return Err(format!(
                    "\"{number}\" needs a unit: s, m, h or d (e.g. {number}m)"
                ));
            }
            other => return Err(format!("unknown unit \"{other}\" (use s, m, h or d)")),
        };
        total = number
            .checked_mul(seconds)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(|| "too large".to_owned())?;
        rest = &after[unit_len..];
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let cases = [
            ("10m", 600),
            ("2h", 7200),
            ("1d", 86_400),
            ("90s", 90),
            ("1h30m", 5400),
            (" 0s ", 0),
        ];
        for (text, secs) in cases {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_secs(secs)),
                "{text}"
            );
        }
    }

    #[test]
    fn bad_durations_say_why() {
        let cases = [
            ("", "empty"),
            ("10", "needs a unit"),
            ("10x", "unknown unit \"x\""),
            ("m", "expected a number"),
            ("-5m", "expected a number"),
            ("10mm", "unknown unit \"mm\""),
            ("99999999999999999999d", "too large"),
            ("999999999999999d", "too large"),
        ];
        for (text, needle) in cases {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
