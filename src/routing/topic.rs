//! AMQP topic patterns, matched exactly as RabbitMQ's topic exchange matches
//! binding keys: a key is split on `.` into words (empty words included, so
//! `a.` is `a` and an empty word), except that the empty key has no words at
//! all; `*` matches exactly one word, `#` zero or more. So `*` does not match
//! the empty key, while `#` and the empty pattern do. Matching allocates
//! nothing.

/// A parsed topic pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPattern {
    words: Vec<Word>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Word {
    Literal(String),
    One,
    Any,
}

impl TopicPattern {
    /// Parses a pattern; the empty pattern matches only the empty routing key.
    pub fn parse(pattern: &str) -> Self {
        let mut words: Vec<Word> = Vec::new();
        for w in Words::new(pattern) {
            let word = match w {
                "*" => Word::One,
                "#" => Word::Any,
                literal => Word::Literal(literal.to_owned()),
            };
            // `#.#` matches what `#` matches; one keeps backtracking linear.
            if !(word == Word::Any && words.last() == Some(&Word::Any)) {
                words.push(word);
            }
        }
        Self { words }
    }

    /// Whether `routing_key` matches.
    pub fn matches(&self, routing_key: &str) -> bool {
        // Wildcard matching over words: on a mismatch, the last `#` seen
        // takes one more word and matching resumes after it. A later `#`
        // can absorb anything an earlier one could, so only the last counts.
        let mut at = 0;
        let mut key = Words::new(routing_key);
        let mut last_any: Option<(usize, Words<'_>)> = None;
        loop {
            let mut ahead = key.clone();
            let Some(word) = ahead.next() else {
                return self.words[at..].iter().all(|w| *w == Word::Any);
            };
            match self.words.get(at) {
                Some(Word::Any) => {
                    at += 1;
                    last_any = Some((at, key.clone()));
                    continue;
                }
                Some(Word::One) => {
                    at += 1;
                    key = ahead;
                    continue;
                }
                Some(Word::Literal(l)) if l == word => {
                    at += 1;
                    key = ahead;
                    continue;
                }
                _ => {}
            }
            match &mut last_any {
                Some((after, absorbed)) => {
                    absorbed.next();
                    at = *after;
                    key = absorbed.clone();
                }
                None => return false,
            }
        }
    }
}

/// The words of a key or pattern, as RabbitMQ splits them.
#[derive(Debug, Clone)]
struct Words<'a> {
    rest: Option<&'a str>,
}

impl<'a> Words<'a> {
    fn new(key: &'a str) -> Self {
        Self {
            rest: (!key.is_empty()).then_some(key),
        }
    }
}

impl<'a> Iterator for Words<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = self.rest?;
        match rest.split_once('.') {
            Some((word, after)) => {
                self.rest = Some(after);
                Some(word)
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{TopicPattern, Words};

    #[test]
    fn keys_split_like_rabbitmq() {
        fn split(k: &str) -> Vec<&str> {
            Words::new(k).collect()
        }
        assert!(split("").is_empty());
        assert_eq!(split("a"), ["a"]);
        assert_eq!(split("a.b"), ["a", "b"]);
        assert_eq!(split("."), ["", ""]);
        assert_eq!(split("a."), ["a", ""]);
        assert_eq!(split(".a"), ["", "a"]);
        assert_eq!(split("a..b"), ["a", "", "b"]);
    }

    #[test]
    fn topic_patterns_match_like_a_topic_exchange() {
        // The same table, and more, is checked against a real topic
        // exchange in tests/routing.rs.
        let cases = [
            ("a.b.c", "a.b.c", true),
            ("a.b.c", "a.b", false),
            ("a.*.c", "a.b.c", true),
            ("a.*.c", "a.c", false),
            ("a.*", "a.b.c", false),
            ("a.#", "a", true),
            ("a.#", "a.b.c", true),
            ("#", "", true),
            ("#", "anything.at.all", true),
            ("#.c", "a.b.c", true),
            ("#.c", "c", true),
            ("#.c", "a.b", false),
            ("a.#.c", "a.c", true),
            ("a.#.c", "a.x.y.c", true),
            ("a.#.c", "a.x.c.d", false),
            ("a.#.c", "a.c.c", true),
            ("*.*", "a.b", true),
            ("orders.*.eu", "orders.new.eu", true),
            ("orders.*.eu", "orders.new.us", false),
            // The empty key has no words: `*` needs one.
            ("*", "", false),
            ("*.#", "", false),
            ("#.*", "", false),
            ("", "", true),
            ("", "a", false),
            ("#.#", "", true),
            // Empty words are words.
            ("*", ".", false),
            ("*.*", ".", true),
            (".", ".", true),
            ("*", "a.", false),
            ("a.*", "a.", true),
            ("a.#", "a.", true),
            ("a.*.b", "a..b", true),
            ("#.a.#", "x.a.y", true),
            ("#.a.#", "x.b.y", false),
            ("#.*.#", "", false),
            ("#.*.#", "x", true),
            ("#.b.#.b.#", "a.b.c.b", true),
            ("#.b.#.b.#", "a.b.c", false),
            ("a#", "a#", true),
            ("a#", "ab", false),
        ];
        for (pattern, key, expected) in cases {
            assert_eq!(
                TopicPattern::parse(pattern).matches(key),
                expected,
                "pattern {pattern:?} key {key:?}"
            );
        }
    }

    #[test]
    fn repeated_hashes_collapse() {
        assert_eq!(TopicPattern::parse("#.#.a"), TopicPattern::parse("#.a"));
        assert_ne!(TopicPattern::parse("#.*.a"), TopicPattern::parse("#.a"));
    }
}
