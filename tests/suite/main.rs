//! The integration tests that share one test binary: each file of `tests/`
//! listed here is a module of it, so the test kit (`tests/support`) and the
//! crate are compiled and linked once for all of them instead of once per
//! file, and the tests of every file run side by side on the test
//! harness's threads. `cargo test --test suite failover::` runs one file's.
//!
//! Files stay out of it when they must have a process of their own: an
//! allocator that counts (`routing`, `http_key_memory`), tests that take
//! turns with the machine to themselves (`http_hostile`, which measures
//! latencies and memory), or the longest tests (`chaos`, `cluster`,
//! `walkthroughs`: `tests/slow/main.rs`). Every other file of `tests/` is listed here;
//! `tests/docs.rs` checks that each is in exactly one binary.

#[path = "../support/mod.rs"]
mod support;

#[path = "../admin.rs"]
mod admin;

#[path = "../alarms.rs"]
mod alarms;

#[path = "../any_bytes.rs"]
mod any_bytes;

#[path = "../architecture.rs"]
mod architecture;

#[path = "../attribution.rs"]
mod attribution;

#[path = "../body_filters.rs"]
mod body_filters;

#[path = "../cli.rs"]
mod cli;

#[path = "../consumer.rs"]
mod consumer;

#[path = "../control.rs"]
mod control;

#[path = "../control_group.rs"]
mod control_group;

#[path = "../control_trust.rs"]
mod control_trust;

#[path = "../ctl.rs"]
mod ctl;

#[path = "../dead_letter.rs"]
mod dead_letter;

#[path = "../dlq.rs"]
mod dlq;

#[path = "../docker_files.rs"]
mod docker_files;

#[path = "../docs.rs"]
mod docs;

#[path = "../failover.rs"]
mod failover;

#[path = "../faults.rs"]
mod faults;

#[path = "../forwarding.rs"]
mod forwarding;

#[path = "../help.rs"]
mod help;

#[path = "../hostile.rs"]
mod hostile;

#[path = "../http_alarm.rs"]
mod http_alarm;

#[path = "../http_hardening.rs"]
mod http_hardening;

#[path = "../http_ingress.rs"]
mod http_ingress;

#[path = "../http_sessions.rs"]
mod http_sessions;

#[path = "../journal.rs"]
mod journal;

#[path = "../journal_instances.rs"]
mod journal_instances;

#[path = "../journal_outage.rs"]
mod journal_outage;

#[path = "../logs.rs"]
mod logs;

#[path = "../loops_and_poison.rs"]
mod loops_and_poison;

#[path = "../otlp_export.rs"]
mod otlp_export;

#[path = "../outages.rs"]
mod outages;

#[path = "../permissions.rs"]
mod permissions;

#[path = "../process.rs"]
mod process;

#[path = "../quorum.rs"]
mod quorum;

#[path = "../quorum_big_header.rs"]
mod quorum_big_header;

#[path = "../reload.rs"]
mod reload;

#[path = "../session_processes.rs"]
mod session_processes;

#[path = "../sessions.rs"]
mod sessions;

#[path = "../small_faults.rs"]
mod small_faults;

#[path = "../support_smoke.rs"]
mod support_smoke;

#[path = "../tls.rs"]
mod tls;

#[path = "../topology.rs"]
mod topology;

#[path = "../trace_cmd.rs"]
mod trace_cmd;

#[path = "../trust.rs"]
mod trust;

#[path = "../vhosts.rs"]
mod vhosts;
