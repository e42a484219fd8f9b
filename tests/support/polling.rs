//! Waiting for a condition with a deadline instead of sleeping.

use std::future::Future;
use std::time::Duration;

/// Interval between two polls in `wait_until` / `wait_for` / `await_count`.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// A generous default timeout for broker-side conditions in tests.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);
/// The deadline for a wait whose length grows with the number of messages
/// (thousands through a debug build on a loaded machine).
pub const BULK_TIMEOUT: Duration = Duration::from_secs(90);

/// Polls `cond` every ~50 ms until it returns true; panics naming `what` after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_every(what, timeout, POLL_INTERVAL, cond).await;
}

/// [`wait_until`], polling every `interval`.
pub async fn wait_until_every<F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut cond: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting until {what}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// Polls `probe` every ~50 ms until it yields `Some(value)`; panics naming `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
