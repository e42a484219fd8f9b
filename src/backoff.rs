//! The one backoff: exponential from a first step to a cap, with jitter
//! between half and all of each step, so that many clients retrying the
//! same broker spread out instead of arriving together.

use std::time::Duration;

/// Waits between tries of one thing that keeps failing.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    /// Steps of `first`, doubling up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            failures: 0,
        }
    }

    /// Counts one more failure and returns how long to wait before the
    /// next try.
    pub fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        jittered(self.step())
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// How many failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The current step before jitter: `first`, doubled once per failure
    /// after the first, capped at `max`.
    fn step(&self) -> Duration {
        self.first
            .saturating_mul(1 << self.failures.saturating_sub(1).min(16))
            .min(self.max)
    }
}

/// Between half and all of `step`.
fn jittered(step: Duration) -> Duration {
    let millis = u64::try_from(step.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(millis / 2 + fastrand::u64(0..=millis / 2))
}

#[cfg(test)]
mod tests {
    use super::Backoff;
    use std::time::Duration;

    #[test]
    fn steps_grow_are_jittered_capped_and_start_over() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(5));
        for _ in 0..100 {
            let mut backoff = Backoff::new(first, max);
            let one = backoff.next_delay();
            assert!(one >= first / 2 && one <= first, "{one:?}");
            backoff.next_delay();
            let three = backoff.next_delay();
            assert!(three >= first * 2 && three <= first * 4, "{three:?}");
            for _ in 0..40 {
                backoff.next_delay();
            }
            let capped = backoff.next_delay();
            assert!(capped >= max / 2 && capped <= max, "{capped:?}");
            backoff.reset();
            assert!(backoff.next_delay() <= first);
        }
    }
}
