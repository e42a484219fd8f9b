//! What the compilers of every section share: their result, and the list
//! of defined names an unknown reference is answered with.

use crate::config::InvalidKey;
use std::collections::BTreeMap;

pub(super) type Result<T> = std::result::Result<T, InvalidKey>;

pub(super) fn names<V>(map: &BTreeMap<String, V>) -> String {
    if map.is_empty() {
        "none".to_owned()
    } else {
        map.keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }
}
