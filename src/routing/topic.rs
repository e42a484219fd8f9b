//! AMQP topic patterns: words separated by `.`, `*` matches exactly one word,
//! `#` matches zero or more.

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
        let words = pattern
            .split('.')
            .map(|w| match w {
                "*" => Word::One,
                "#" => Word::Any,
                literal => Word::Literal(literal.to_owned()),
            })
            .collect();
        Self { words }
    }

    /// Whether `routing_key` matches.
    pub fn matches(&self, routing_key: &str) -> bool {
        let key: Vec<&str> = routing_key.split('.').collect();
        // reachable[j]: pattern prefix so far can consume exactly key[..j].
        let mut reachable = vec![false; key.len() + 1];
        reachable[0] = true;
        for word in &self.words {
            let mut next = vec![false; key.len() + 1];
            for j in 0..=key.len() {
                if !reachable[j] {
                    continue;
                }
                match word {
                    Word::Any => next[j..].iter_mut().for_each(|r| *r = true),
                    Word::One if j < key.len() => next[j + 1] = true,
                    Word::Literal(l) if j < key.len() && key[j] == l => next[j + 1] = true,
                    _ => {}
                }
            }
            reachable = next;
        }
        reachable[key.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::TopicPattern;

    #[test]
    fn topic_patterns_match_like_a_topic_exchange() {
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
            ("*.*", "a.b", true),
            ("orders.*.eu", "orders.new.eu", true),
            ("orders.*.eu", "orders.new.us", false),
        ];
        for (pattern, key, expected) in cases {
            assert_eq!(
                TopicPattern::parse(pattern).matches(key),
                expected,
                "pattern {pattern:?} key {key:?}"
            );
        }
    }
}
