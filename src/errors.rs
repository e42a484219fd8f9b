//! Errors as one line: an error and the causes under it (its `source`
//! chain), each said once. Errors here keep their cause typed at every
//! module boundary, so code classifies by type, and people read this line.
//! A text from elsewhere (a parser's message, a broker's reply) is folded
//! onto one line the same way everywhere, by [`one_line_text`].

use std::borrow::Cow;

use std::error::Error;

/// `error`, then each cause not already said, joined with `": "`.
pub fn one_line(error: &(dyn Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let text = e.to_string();
        // A cause whose words the line already has (or that only repeats
        // the line with more in front) adds nothing.
        if !line.contains(&text) && !text.contains(&line) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = e.source();
    }
    line
}

/// `text` on one line: every run of whitespace, line breaks included, as
/// one space, and none at either end.
pub fn one_line_text(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `c` could rewrite what a terminal or a log line shows: a
/// control character (a line break, an escape sequence's start) or a
/// bidirectional formatting character (which reorders what follows it).
pub fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every [`unprintable`] character written as an escape
/// (`\n`, `\u{1b}`, `\u{202e}`), so that text from a message, a producer
/// or a broker can be shown on a terminal or in a log line as the text it
/// is, and never as a command to the terminal or a line of its own.
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unprintable) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unprintable(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::{escaped, one_line, one_line_text};

    #[test]
    fn unprintable_characters_are_written_as_escapes() {
        assert_eq!(escaped("plain é"), "plain é");
        assert_eq!(
            escaped("a\u{1b}[2J\nb\u{202e}c\td"),
            "a\\u{1b}[2J\\nb\\u{202e}c\\td"
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot start")]
    struct Top(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open a channel: {0}")]
    struct Middle(#[source] Bottom);

    #[derive(Debug, thiserror::Error)]
    #[error("403 ACCESS_REFUSED")]
    struct Bottom;

    #[test]
    fn each_cause_is_said_once() {
        assert_eq!(
            one_line(&Top(Middle(Bottom))),
            "cannot start: cannot open a channel: 403 ACCESS_REFUSED"
        );
        assert_eq!(
            one_line(&Middle(Bottom)),
            "cannot open a channel: 403 ACCESS_REFUSED"
        );
    }

    #[test]
    fn a_text_folds_onto_one_line() {
        assert_eq!(
            one_line_text("  expected `,`\n  at line 3,\tcolumn 7 \r\n"),
            "expected `,` at line 3, column 7"
        );
        assert_eq!(one_line_text("already one line"), "already one line");
        assert_eq!(one_line_text(" \n\t "), "");
    }
}
