//! Recent: keys remembered for a while, bounded by age and by count. What
//! producers name (session ids, `Idempotency-Key`s) is remembered here, so
//! no producer can grow the forwarder's memory without bound.
//!
//! Each key is kept once, shared by the map and the order of use; a key
//! used again goes to the back of the order, and its older place there is
//! skipped as stale. [`Recent::forget`] drops keys from the front (least
//! recently used first) while they are older than the age given, or while
//! there are more than the count allows; a key the caller pins (a try still
//! running) stops it, so a pinned key is never forgotten.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Values by key, with when each was last used.
#[derive(Debug)]
pub(crate) struct Recent<V> {
    by_key: HashMap<Arc<str>, Entry<V>>,
    /// Keys by last use, oldest first; an entry whose time is not its
    /// key's any more is stale.
    order: VecDeque<(Instant, Arc<str>)>,
    max: usize,
}

#[derive(Debug)]
struct Entry<V> {
    used: Instant,
    value: V,
}

impl<V> Recent<V> {
    /// Nothing remembered; at most `max` keys once [`Self::forget`] ran.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            by_key: HashMap::new(),
            order: VecDeque::new(),
            max,
        }
    }

    /// The value of `key`.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &str) -> Option<&V> {
        self.by_key.get(key).map(|e| &e.value)
    }

    /// The value of `key`, to change.
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.by_key.get_mut(key).map(|e| &mut e.value)
    }

    /// When `key` was last used.
    pub(crate) fn used(&self, key: &str) -> Option<Instant> {
        self.by_key.get(key).map(|e| e.used)
    }

    /// The map's own copy of `key`, when it is remembered.
    pub(crate) fn key(&self, key: &str) -> Option<Arc<str>> {
        self.by_key.get_key_value(key).map(|(k, _)| k.clone())
    }

    /// Remembers `value` under `key`, used `now` (replacing what it held).
    pub(crate) fn insert(&mut self, key: Arc<str>, value: V, now: Instant) {
        self.by_key.insert(key.clone(), Entry { used: now, value });
        self.order.push_back((now, key));
    }

    /// Marks `key` used `now`, when it is remembered.
    pub(crate) fn touch(&mut self, key: &str, now: Instant) {
        let Some((key, entry)) = self.by_key.get_key_value(key) else {
            return;
        };
        let key = key.clone();
        if entry.used != now {
            self.order.push_back((now, key.clone()));
        }
        if let Some(entry) = self.by_key.get_mut(&key) {
            entry.used = now;
        }
    }

    /// Forgets `key`.
    pub(crate) fn remove(&mut self, key: &str) -> Option<V> {
        self.by_key.remove(key).map(|e| e.value)
    }

    /// Forgets the least recently used keys while they were last used more
    /// than `age` before `now` or more than the count allows, stopping at
    /// the first key `pinned` keeps.
    pub(crate) fn forget(&mut self, now: Instant, age: Duration, pinned: impl Fn(&V) -> bool) {
        while let Some((used, key)) = self.order.front() {
            let Some(entry) = self.by_key.get(key).filter(|e| e.used == *used) else {
                self.order.pop_front();
                continue;
            };
            let old = now.saturating_duration_since(*used) > age;
            if !(old || self.by_key.len() > self.max) || pinned(&entry.value) {
                return;
            }
            if let Some((_, key)) = self.order.pop_front() {
                self.by_key.remove(&key);
            }
        }
    }

    /// How many keys are remembered.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn keys_older_than_the_age_are_forgotten_and_a_used_key_is_kept() {
        let mut recent = Recent::new(10);
        let start = Instant::now();
        recent.insert("a".into(), 1, start);
        recent.insert("b".into(), 2, start);
        tokio::time::advance(Duration::from_secs(50)).await;
        recent.touch("a", Instant::now());
        tokio::time::advance(Duration::from_secs(20)).await;
        recent.forget(Instant::now(), Duration::from_secs(60), |_| false);
        assert_eq!(recent.get("a"), Some(&1), "used 20 s ago");
        assert_eq!(recent.get("b"), None, "used 70 s ago");
        assert_eq!(recent.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_count_the_least_recently_used_go_first() {
        let mut recent = Recent::new(3);
        for (i, key) in ["a", "b", "a", "c", "d"].into_iter().enumerate() {
            recent.insert(key.into(), i, Instant::now());
            recent.forget(Instant::now(), HOUR, |_| false);
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        let mut kept: Vec<&str> = ["a", "b", "c", "d"]
            .into_iter()
            .filter(|k| recent.get(k).is_some())
            .collect();
        kept.sort_unstable();
        assert_eq!(kept, ["a", "c", "d"], "a was used again after b");
        assert_eq!(recent.get("a"), Some(&2), "its latest value");
        for i in 0..10 {
            recent.insert(format!("s{i}").into(), 0, Instant::now());
            recent.forget(Instant::now(), HOUR, |_| false);
        }
        assert_eq!(recent.len(), 3);
        assert!(recent.order.len() <= 3 + 2, "stale places do not pile up");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pinned_key_is_never_forgotten_and_holds_the_ones_behind_it() {
        let mut recent = Recent::new(1);
        recent.insert("running".into(), true, Instant::now());
        recent.insert("done".into(), false, Instant::now());
        tokio::time::advance(2 * HOUR).await;
        recent.forget(Instant::now(), HOUR, |running| *running);
        assert_eq!(recent.len(), 2);
        if let Some(running) = recent.get_mut("running") {
            *running = false;
        }
        recent.forget(Instant::now(), HOUR, |running| *running);
        assert_eq!(recent.len(), 0);
        assert_eq!(recent.key("done"), None);
    }
}
