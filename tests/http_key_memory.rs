//! What the HTTP ingress remembers of an `Idempotency-Key` costs a bounded,
//! measured amount: the figure docs/http-ingress.md gives per key, counted
//! by the allocator while 10,000 keys of the longest length (255
//! characters) are remembered as a delivered request leaves them.

use std::time::Duration;
use switchyard::ingress::idempotency::{Begin, Records};

const KEYS: usize = 10_000;
/// What docs/http-ingress.md says a key costs at most, in bytes.
const DOCUMENTED_MAX_PER_KEY: usize = 700;

#[test]
fn a_remembered_key_costs_at_most_what_the_docs_say() {
    let records = Records::new(Duration::from_secs(600), KEYS * 2);
    let branches = ["service".to_owned(), "logging".to_owned()];
    let keys: Vec<String> = (0..KEYS).map(|i| format!("{i:0>255}")).collect();
    let remember = || {
        for key in &keys {
            let Begin::Deliver(ticket, _) = records.begin(key, uuid::Uuid::new_v4()) else {
                panic!("a new key is delivered");
            };
            ticket.finish(&branches, true);
        }
    };
    let counted = allocation_counter::measure(remember);
    let per_key = counted.bytes_current as usize / KEYS;
    eprintln!("{per_key} bytes per remembered 255-character key ({KEYS} keys)");
    assert_eq!(records.len(), KEYS);
    assert!(
        per_key <= DOCUMENTED_MAX_PER_KEY,
        "{per_key} bytes per key, over the documented {DOCUMENTED_MAX_PER_KEY}"
    );
}
