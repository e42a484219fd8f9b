//! `cargo bench --bench http [-- OPTIONS]`: switchyard's HTTP ingress (its
//! release binary, a process of its own) against the management plugin's
//! HTTP publish API, on one private RabbitMQ node in one run: requests per
//! second with 64 concurrent keep-alive clients, CPU per request on both
//! sides, and p50/p99 latency at half each row's maximum rate. `--help`
//! lists the options; `bench/README.md` says how to run it and
//! `BENCHMARKS.md` how to read the output.
//!
//! Built on the integration tests' kit (`tests/support`): its private node
//! (with `rabbitmq_management`), broker client, configuration builder,
//! process harness and `/proc` readers.

#[path = "../../tests/support/mod.rs"]
mod support;

mod cpu;
mod load;
mod opts;
mod report;
mod rows;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use opts::{Opts, Row};
use rows::{Ctx, Outcome};
use support::harness::Process;
use support::{NodeSetup, PrivateNode, procfs, try_rabbitmqctl, unique_prefix};

/// The plugin that serves M.
const MANAGEMENT_PLUGIN: &str = "rabbitmq_management";

fn main() -> ExitCode {
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(benchmark()),
        Err(e) => {
            eprintln!("http: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn benchmark() -> ExitCode {
    let opts = Opts::parse().resolved();
    if !opts.bench {
        eprintln!("http: a benchmark; run it with `cargo bench --bench http`");
        return ExitCode::SUCCESS;
    }
    if let Some(why) = opts.invalid() {
        eprintln!("http: {why}");
        return ExitCode::FAILURE;
    }
    // Dropping the run (Ctrl-C) kills the forwarder and stops the node.
    let mut task = tokio::spawn(bench(opts));
    let result = tokio::select! {
        r = &mut task => r.unwrap_or_else(|e| Err(format!("{e}"))),
        _ = tokio::signal::ctrl_c() => {
            task.abort();
            let _ = task.await;
            Err("interrupted".to_owned())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("http: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Starts the node, runs the rows, prints the tables, stops the node.
async fn bench(opts: Opts) -> Result<(), String> {
    let run_prefix = unique_prefix("http-bench");
    eprintln!("starting a private node with {MANAGEMENT_PLUGIN} ...");
    let setup = NodeSetup {
        plugins: vec![MANAGEMENT_PLUGIN.to_owned()],
        ..NodeSetup::default()
    };
    let node = PrivateNode::start_with(setup, |port| {
        format!("management.tcp.port = {port}\nmanagement.tcp.ip = 127.0.0.1\n")
    })
    .await;
    let management = SocketAddr::from(([127, 0, 0, 1], node.extra_port()));
    let ctx = Arc::new(Ctx {
        opts: opts.clone(),
        amqp_url: node.amqp_url(),
        management,
        broker_pid: node.os_pid(),
        clock_ticks: procfs::clock_ticks_per_sec(),
    });
    let header = report::Header {
        machine: format!(
            "{} CPUs ({}), load average {} at start",
            procfs::cores(),
            procfs::cpu_model().unwrap_or_else(|| "unknown model".to_owned()),
            procfs::load_average().unwrap_or_default()
        ),
        broker: describe(&node).await,
        forwarder: forwarder_line().await,
        management_port: management.port(),
    };
    println!("{}", report::header(&opts, &header));

    let mut rounds: Vec<Vec<Outcome>> = Vec::new();
    let mut failure = None;
    'rounds: for round in 1..=opts.rounds {
        let mut outcomes: Vec<Outcome> = Vec::new();
        for row in &opts.rows {
            let p = format!("{run_prefix}-r{round}-{}", row.label().to_ascii_lowercase());
            // A's latency run carries H's traffic: at H's rate when H ran.
            let h_rate = outcomes
                .iter()
                .find(|o| o.row == Row::H)
                .and_then(|h| h.latency.as_ref().map(|(rate, _)| *rate));
            let latency_rate = match row {
                Row::A => opts.latency_rate.or(h_rate),
                _ => opts.latency_rate,
            };
            eprintln!("round {round} row {}: {} ...", row.label(), row.what());
            match rows::run(ctx.clone(), *row, p, latency_rate).await {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) => {
                    failure = Some(e);
                    rounds.push(outcomes);
                    break 'rounds;
                }
            }
        }
        rounds.push(outcomes);
    }
    node.stop().await;
    if rounds.iter().any(|r| !r.is_empty()) {
        println!("{}", report::table(&rounds));
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// "RabbitMQ 3.x.y on Erlang/OTP n, ...", asked from the node itself.
async fn describe(node: &PrivateNode) -> String {
    let eval = |expr: &'static str| async move {
        try_rabbitmqctl(&["-n", node.node_name(), "eval", expr])
            .await
            .map(|v| v.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|_| "?".to_owned())
    };
    let version = eval("{ok, V} = application:get_key(rabbit, vsn), V.").await;
    let otp = eval("erlang:system_info(otp_release).").await;
    let schedulers = eval("erlang:system_info(schedulers_online).").await;
    let pid = node
        .os_pid()
        .map_or("unknown".to_owned(), |p| p.to_string());
    format!(
        "RabbitMQ {version} on Erlang/OTP {otp}, {schedulers} scheduler(s) online, OS pid {pid}"
    )
}

/// The binary, its version and the commit it was built from.
async fn forwarder_line() -> String {
    let git = tokio::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .await
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    let binary = Process::binary();
    let binary = binary
        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .map_or(binary, |b| b.trim_start_matches('/'));
    format!(
        "{binary} {} (git {git}), a process of its own",
        env!("CARGO_PKG_VERSION")
    )
}
