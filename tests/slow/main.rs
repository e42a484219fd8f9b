//! The longest tests in one test binary: the slow fault suites, the chaos
//! runs (`tests/chaos.rs`) and the cluster tests (`tests/cluster.rs`), and
//! the walkthroughs (`tests/walkthroughs.rs`). Each is paced by its
//! publishers, its shell steps and its private brokers booting, stopping
//! and catching up rather than by the CPU, so the five run side by side
//! (the test harness's threads; see `.cargo/config.toml`) in about the
//! time of the longest instead of one after the other, or at the tail of
//! the `suite` binary. They share no broker: each has its own private
//! node or cluster. `cargo test --test slow cluster::` runs one file's.

#[path = "../support/mod.rs"]
mod support;

#[path = "../chaos.rs"]
mod chaos;

#[path = "../cluster.rs"]
mod cluster;

#[path = "../walkthroughs.rs"]
mod walkthroughs;
