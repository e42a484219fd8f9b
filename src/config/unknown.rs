//! An unknown key, said with its path first and the nearest valid key:
//! `inbound.prefetchh: unknown key; did you mean `prefetch`? (valid keys: ...)`.
//!
//! The configuration crate hands the key's table as a typed path but the
//! key itself only inside serde's message, which [`UnknownKey::read`] (and
//! nothing else) reads.

use crate::errors::one_line_text;
use config::ConfigError;

/// A key a table does not take, and the keys it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct UnknownKey {
    /// The key as written.
    pub key: String,
    /// The keys the table takes, in their declared order.
    pub valid: Vec<String>,
}

impl UnknownKey {
    /// Reads serde's unknown-field message (`unknown field `k`, expected
    /// one of `a`, `b`` and its one-key, two-key and no-key shapes); `None`
    /// for any other text.
    pub fn read(message: &str) -> Option<Self> {
        let rest = message.strip_prefix("unknown field `")?;
        if let Some(key) = rest.strip_suffix("`, there are no fields") {
            return Some(Self::new(key, Vec::new()));
        }
        let (key, expected) = rest.rsplit_once("`, expected ")?;
        let list = expected.strip_prefix("one of ").unwrap_or(expected);
        let valid = list
            .split(", ")
            .flat_map(|part| part.split(" or "))
            .map(|name| name.strip_prefix('`')?.strip_suffix('`'))
            .collect::<Option<Vec<_>>>()?;
        Some(Self::new(
            key,
            valid.into_iter().map(str::to_owned).collect(),
        ))
    }

    fn new(key: &str, valid: Vec<String>) -> Self {
        Self {
            key: key.to_owned(),
            valid,
        }
    }

    /// `what`, the nearest valid key when one is close, and every valid key:
    /// `unknown key; did you mean `routing_key`? (valid keys: broker, ...)`.
    pub fn explain(&self, what: &str) -> String {
        let valid = if self.valid.is_empty() {
            "none".to_owned()
        } else {
            self.valid.join(", ")
        };
        match nearest(&self.key, &self.valid) {
            Some(near) => format!("{what}; did you mean `{near}`? (valid keys: {valid})"),
            None => format!("{what} (valid keys: {valid})"),
        }
    }
}

/// A configuration crate error as one line: an unknown key as
/// [`unknown_key`] says it, anything else in the crate's words.
pub(super) fn describe(error: &ConfigError) -> String {
    unknown_key(error).unwrap_or_else(|| one_line_text(&error.to_string()))
}

/// The error, if it is an unknown key, as its full path and
/// [`UnknownKey::explain`].
pub(super) fn unknown_key(error: &ConfigError) -> Option<String> {
    let (table, message) = match error {
        ConfigError::At { error, key, .. } => (key.as_deref(), error.as_ref()),
        other => (None, other),
    };
    let ConfigError::Message(text) = message else {
        return None;
    };
    let unknown = UnknownKey::read(text)?;
    Some(format!(
        "{}: {}",
        path(table, &unknown.key),
        unknown.explain("unknown key")
    ))
}

fn path(table: Option<&str>, key: &str) -> String {
    match table {
        Some(table) if !table.is_empty() => format!("{table}.{key}"),
        _ => key.to_owned(),
    }
}

/// The valid key closest to `key`, if it is close enough to be the one
/// meant; the first of equally close ones.
fn nearest<'a>(key: &str, valid: &'a [String]) -> Option<&'a str> {
    let typed = normalized(key);
    valid
        .iter()
        .map(|candidate| (distance(&typed, &normalized(candidate)), candidate))
        .filter(|(d, candidate)| close(*d, typed.chars().count(), candidate.chars().count()))
        .min_by_key(|(d, _)| *d)
        .map(|(_, candidate)| candidate.as_str())
}

/// Case and `-` for `_` are no difference at all.
fn normalized(key: &str) -> String {
    key.to_lowercase().replace('-', "_")
}

/// Close: two edits, or a third of the valid key's length when that is
/// more; never every character of the shorter key, which would make any
/// two-letter word a near miss for `in`.
fn close(distance: usize, typed_len: usize, valid_len: usize) -> bool {
    distance == 0 || (distance <= (valid_len / 3).max(2) && distance < typed_len.min(valid_len))
}

/// Levenshtein distance, by characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(diagonal + 1).min(row[j] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn reads_each_shape_of_the_unknown_field_message() {
        let cases = [
            (
                "unknown field `routingkey`, expected one of `broker`, `exchange`, `routing_key`",
                Some(UnknownKey::new(
                    "routingkey",
                    keys(&["broker", "exchange", "routing_key"]),
                )),
            ),
            (
                "unknown field `htp`, expected `http`",
                Some(UnknownKey::new("htp", keys(&["http"]))),
            ),
            (
                "unknown field `ur`, expected `uri` or `uris`",
                Some(UnknownKey::new("ur", keys(&["uri", "uris"]))),
            ),
            (
                "unknown field `header`, there are no fields",
                Some(UnknownKey::new("header", Vec::new())),
            ),
            ("invalid type: string \"x\", expected u32", None),
            ("unknown field `a`, expected something else", None),
            ("unknown variant `x`, expected `a`", None),
        ];
        for (message, expected) in cases {
            assert_eq!(UnknownKey::read(message), expected, "{message}");
        }
    }

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        for (a, b, d) in [
            ("", "", 0),
            ("abc", "", 3),
            ("prefetchh", "prefetch", 1),
            ("routingkey", "routing_key", 1),
            ("kitten", "sitting", 3),
            ("größe", "grösse", 2),
        ] {
            assert_eq!(distance(a, b), d, "{a} / {b}");
            assert_eq!(distance(b, a), d, "{b} / {a}");
        }
    }

    #[test]
    fn suggests_only_a_close_key() {
        let valid = keys(&[
            "broker",
            "queue",
            "prefetch",
            "shutdown_timeout_ms",
            "in",
            "routing_key",
        ]);
        for (typed, expected) in [
            ("prefetchh", Some("prefetch")),
            ("Prefetch", Some("prefetch")),
            ("routing-key", Some("routing_key")),
            ("ROUTING-KEY", Some("routing_key")),
            ("shutdown_timeout", Some("shutdown_timeout_ms")),
            ("quue", Some("queue")),
            ("im", Some("in")),
            ("xy", None),
            ("colour", None),
            ("max_retries", None),
        ] {
            assert_eq!(nearest(typed, &valid), expected, "{typed}");
        }
    }

    #[test]
    fn explains_with_and_without_a_suggestion() {
        let near = UnknownKey::new("routingkey", keys(&["broker", "routing_key"]));
        assert_eq!(
            near.explain("unknown key"),
            "unknown key; did you mean `routing_key`? (valid keys: broker, routing_key)"
        );
        let far = UnknownKey::new("colour", keys(&["broker", "routing_key"]));
        assert_eq!(
            far.explain("unknown key"),
            "unknown key (valid keys: broker, routing_key)"
        );
        let none = UnknownKey::new("colour", Vec::new());
        assert_eq!(
            none.explain("unknown key"),
            "unknown key (valid keys: none)"
        );
    }

    #[test]
    fn describes_other_errors_in_the_crates_words() {
        let error = ConfigError::Message("invalid   type:\n string".to_owned());
        assert_eq!(describe(&error), "invalid type: string");
        let nested = ConfigError::At {
            error: Box::new(ConfigError::Message("unknown variant `x`".to_owned())),
            origin: None,
            key: Some("inbound".to_owned()),
        };
        assert_eq!(describe(&nested), "unknown variant `x` for key `inbound`");
    }
}
