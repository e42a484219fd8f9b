//! Screen: checks a message before routing and returns the verdict for one
//! that must not be forwarded. Today that is a message whose headers nest
//! deeper than [`MAX_HEADER_DEPTH`]: it is dead-lettered as `malformed` and
//! never reaches a branch. The check never recurses and never formats a
//! header value.

use super::outcome::{Reason, Verdict};
use crate::envelope::{Envelope, MAX_HEADER_DEPTH};

/// `None` when `envelope` may be routed; otherwise the dead-letter verdict.
pub fn screen(envelope: &Envelope) -> Option<Verdict> {
    let depth = envelope.header_depth();
    (depth > MAX_HEADER_DEPTH).then(|| Verdict::DeadLetter {
        reason: Reason::Malformed,
        error: format!("headers nest {depth} levels deep (limit {MAX_HEADER_DEPTH})"),
        failed: Vec::new(),
        delivered: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::{AmqpValue, FieldArray, FieldTable, Properties};

    fn with_depth(depth: usize) -> Envelope {
        let mut value = AmqpValue::Boolean(true);
        for _ in 0..depth {
            value = AmqpValue::FieldArray(FieldArray::from(vec![value]));
        }
        let mut headers = FieldTable::default();
        headers.insert("h".into(), value);
        Envelope {
            delivery_tag: 1,
            exchange: String::new(),
            routing_key: String::new(),
            redelivered: false,
            properties: Properties::default().with_headers(headers),
            body: Vec::new(),
        }
    }

    #[test]
    fn headers_at_the_limit_pass() {
        assert_eq!(screen(&with_depth(0)), None);
        assert_eq!(screen(&with_depth(MAX_HEADER_DEPTH)), None);
    }

    #[test]
    fn deeper_headers_are_malformed_with_the_depth_in_the_error() {
        assert_eq!(
            screen(&with_depth(3000)),
            Some(Verdict::DeadLetter {
                reason: Reason::Malformed,
                error: "headers nest 3000 levels deep (limit 64)".to_owned(),
                failed: Vec::new(),
                delivered: Vec::new(),
            })
        );
        assert!(screen(&with_depth(MAX_HEADER_DEPTH + 1)).is_some());
    }
}
