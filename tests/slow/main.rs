//! The slow fault suites in one test binary: the chaos runs
//! (`tests/chaos.rs`) and the cluster tests (`tests/cluster.rs`). Each is
//! paced by its publishers and by its private brokers booting, stopping
//! and catching up rather than by the CPU, so the three run side by side
//! (the test harness's threads; see `.cargo/config.toml`) in about the
//! time of the longest instead of one after the other. They share no
//! broker: each has its own private node or cluster.
//! `cargo test --test slow cluster::` runs one file's.

#[path = "../support/mod.rs"]
mod support;

#[path = "../chaos.rs"]
mod chaos;

#[path = "../cluster.rs"]
mod cluster;
