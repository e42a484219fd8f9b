//! `cargo bench --bench throughput [-- OPTIONS]`: switchyard, as its release
//! binary in a process of its own, against RabbitMQ's Shovel on the same
//! broker, from preloaded backlogs; medians of alternating rounds in one
//! table. `--help` lists the options; `bench/README.md` says how to run
//! it and `BENCHMARKS.md` how to read the output.
//!
//! Built on the integration tests' kit (`tests/support`): its broker client
//! preloads and polls, its harness writes the configurations and runs the
//! binary, its `rabbitmqctl` wrappers and private node do the rest.

#[path = "../../tests/support/mod.rs"]
mod support;

mod against;
mod bare;
mod callgrind;
mod instructions;
mod latency;
mod modes;
mod opts;
mod report;
mod rows;
mod target;
mod window;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use opts::Opts;
use rows::{Ctx, Row};
use support::harness::Process;
use support::otlp::OtlpReceiver;
use support::{NodeSetup, PrivateNode, delete_all_with_prefix, procfs, unique_prefix};
use target::{SHOVEL_PLUGIN, Target, redact};

fn main() -> ExitCode {
    // B1's mover: this binary re-executed as the bare forwarder.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(bare::FLAG) {
        return bare::main(&args[2..]);
    }
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(benchmark()),
        Err(e) => {
            eprintln!("throughput: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn benchmark() -> ExitCode {
    let opts = Opts::parse();
    if !opts.bench {
        eprintln!("throughput: a benchmark; run it with `cargo bench --bench throughput`");
        return ExitCode::SUCCESS;
    }
    if opts.rounds == 0 || opts.backlog == 0 {
        eprintln!("throughput: --rounds and --backlog must be at least 1");
        return ExitCode::FAILURE;
    }
    let run_prefix = unique_prefix("bench");
    let mut task = tokio::spawn(bench(opts.clone(), run_prefix.clone()));
    let (result, interrupted) = tokio::select! {
        r = &mut task => (r.unwrap_or_else(|e| Err(format!("{e}"))), false),
        _ = tokio::signal::ctrl_c() => {
            // Dropping the run kills its forwarder and stops a private node.
            task.abort();
            let _ = task.await;
            (Err("interrupted".to_owned()), true)
        }
    };
    if !opts.split_cores {
        // A rabbitmqctl call cut short may still be creating shovels (and
        // their queues): after an interruption, sweep twice.
        for _ in 0..if interrupted { 2 } else { 1 } {
            sweep(&run_prefix).await;
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The failure's message carries the forwarder's log.
            remove_temp_files(&run_prefix);
            eprintln!("throughput: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Removes whatever a failed or interrupted row left on the shared broker:
/// shovels first, then queues and exchanges.
async fn sweep(run_prefix: &str) {
    Target::shared()
        .await
        .clear_shovels_with_prefix(run_prefix)
        .await;
    delete_all_with_prefix(run_prefix).await;
}

/// The configuration and log files of the forwarders of this run.
fn remove_temp_files(run_prefix: &str) {
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in dir.flatten() {
        if entry.file_name().to_string_lossy().starts_with(run_prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Runs what the options ask for and prints the tables.
async fn bench(opts: Opts, run_prefix: String) -> Result<(), String> {
    let rows = opts.rows();
    if opts.instructions {
        callgrind::check_valgrind()?;
    }
    let against = match opts.against.clone() {
        Some(_) if !rows.iter().any(|r| r.is_forwarder()) => {
            return Err(
                "--against compares the forwarder rows: give F1 or F2 in --rows".to_owned(),
            );
        }
        // Building another revision takes minutes: off the runtime's threads.
        Some(spec) => Some(
            tokio::task::spawn_blocking(move || against::resolve(&spec))
                .await
                .map_err(|e| format!("--against: {e}"))??,
        ),
        None => None,
    };
    let mut node = None;
    let target = if opts.split_cores {
        if procfs::cores() < 2 {
            return Err("--split-cores needs two CPUs".to_owned());
        }
        eprintln!("starting a private node on CPU 0 ...");
        let setup = NodeSetup {
            plugins: vec![SHOVEL_PLUGIN.to_owned()],
            cpus: Some("0".to_owned()),
        };
        let started = PrivateNode::start_with(setup, |_| String::new()).await;
        let target = Target::private(&started);
        pin_all_threads(target.pid, "0").await?;
        node = Some(started);
        target
    } else {
        Target::shared().await
    };
    // The default run's latency baseline (LS) is a Shovel too; it runs at a
    // rate given or at half of F2's.
    let latency_shovel = !opts.scale
        && !opts.instructions
        && opts.latency_secs > 0.0
        && (opts.latency_rate.is_some() || rows.contains(&Row::F2));
    let shovel_note = if opts.split_cores || !(latency_shovel || rows.iter().any(|r| r.is_shovel()))
    {
        None
    } else {
        Some(target.ensure_shovel().await)
    };
    let ctx = Arc::new(Ctx {
        shovel_uri: match opts.shovel_uri.as_str() {
            "tcp" => target.url.clone(),
            _ => "amqp://".to_owned(),
        },
        target,
        prefetch: opts.prefetch,
        quorum: opts.quorum,
        stall: Duration::from_secs(opts.stall_secs),
        clock_ticks: procfs::clock_ticks_per_sec(),
        forwarder_cpus: opts.split_cores.then(|| "1".to_owned()),
        callgrind: opts.instructions.then(std::env::temp_dir),
        keep_counts: opts.keep_counts.clone(),
        against,
        otlp: if rows.contains(&Row::F2T) {
            Some(OtlpReceiver::counting().await)
        } else {
            None
        },
    });
    let mut left_out = Vec::new();
    if let Some(against) = &ctx.against {
        let p = format!("{run_prefix}-check");
        let configs: Vec<(&str, String)> = rows
            .iter()
            .filter(|r| r.is_forwarder())
            .map(|&r| (r.label(), rows::forwarder_toml(&ctx, &p, r)))
            .collect();
        left_out = against::check_configs(against, &p, &configs)?;
    }
    println!("{}", header(&opts, &ctx, shovel_note).await);
    if !left_out.is_empty() {
        println!(
            "- against: its configuration leaves out what it does not know (it runs as it \
             shipped, without them): {}\n",
            left_out.join(", ")
        );
    }

    let result = if opts.instructions {
        instructions::run(&opts, &ctx, &run_prefix, &rows).await
    } else if opts.scale {
        modes::scale(&opts, &ctx, &run_prefix, &rows).await
    } else if opts.split_cores {
        modes::split(&opts, &ctx, &run_prefix, &rows).await
    } else {
        modes::default_run(&opts, &ctx, &run_prefix, &rows).await
    };
    if let Some(node) = node {
        node.stop().await;
    }
    result
}

/// Confines every thread of process `pid` to `cpus`.
async fn pin_all_threads(pid: Option<u32>, cpus: &str) -> Result<(), String> {
    let pid = pid.ok_or("the private node's OS pid is unknown")?;
    let out = tokio::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .output()
        .await
        .map_err(|e| format!("taskset: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "taskset -a -p -c {cpus} {pid}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

async fn header(opts: &Opts, ctx: &Ctx, shovel_note: Option<String>) -> String {
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
    let mode = if opts.split_cores {
        "split cores: a private node confined to CPU 0, the forwarder to CPU 1"
    } else if opts.instructions {
        "instructions: each forwarder under valgrind's callgrind, on the shared broker"
    } else {
        "shared: broker and forwarder on any CPU"
    };
    let mut lines = vec![
        "# switchyard throughput benchmark".to_owned(),
        String::new(),
        format!(
            "- machine: {} CPUs ({}), load average {} at start",
            procfs::cores(),
            procfs::cpu_model().unwrap_or_else(|| "unknown model".to_owned()),
            procfs::load_average().unwrap_or_default()
        ),
        format!(
            "- broker: {} — {}",
            redact(&ctx.target.url),
            ctx.target.describe().await
        ),
        format!(
            "- forwarder: {binary} {} (git {git}), a process of its own",
            env!("CARGO_PKG_VERSION")
        ),
        format!("- mode: {mode}"),
        format!(
            "- settings: persistent bodies, prefetch {} (forwarder and Shovel), Shovel ack-mode \
             on-confirm over {}, backlog {} per source queue, {} round(s) in alternating order",
            opts.prefetch,
            if ctx.shovel_uri == "amqp://" {
                "amqp:// (direct, in-broker)"
            } else {
                "the broker's URL (TCP)"
            },
            if opts.scale {
                format!("{} and {}", opts.backlog, opts.scale_backlog)
            } else if opts.instructions {
                format!(
                    "{} and {}",
                    opts.instructions_backlog / 4,
                    opts.instructions_backlog
                )
            } else {
                opts.backlog.to_string()
            },
            opts.rounds
        ),
        format!("- queues: {}", queues_note(opts.quorum)),
    ];
    if opts.rows().iter().any(|r| matches!(r, Row::B1 | Row::B1H)) {
        lines.push(
            "- B1, B1H: this benchmark's binary re-executed as a bare lapin forwarder \
             (benches/throughput/bare.rs), a process of its own"
                .to_owned(),
        );
    }
    if opts
        .rows()
        .iter()
        .any(|r| matches!(r, Row::F1 | Row::F2 | Row::F2T))
    {
        lines.push(
            "- journal: on at its defaults in F1, F2 and F2T (a stream per run, removed after \
             it), off in F2N"
                .to_owned(),
        );
    }
    if let Some(receiver) = &ctx.otlp {
        lines.push(format!(
            "- F2T: spans over OTLP/HTTP, sample_ratio 1.0, to {} (the test kit's receiver in \
             this benchmark's process, decoding every request)",
            receiver.endpoint()
        ));
    }
    if let Some(against) = &ctx.against {
        lines.push(format!(
            "- against: {}; its forwarder rows (primed: F1', F2') run beside this build's in \
             every round, the two in alternating order",
            against.describe
        ));
        let memory = !opts.no_memory && opts.rows().contains(&Row::F2);
        if !opts.scale
            && !opts.instructions
            && !opts.split_cores
            && (memory || opts.latency_secs > 0.0)
        {
            lines.push(
                "- the memory run with 64 KiB bodies and the latency runs: this build only"
                    .to_owned(),
            );
        }
    }
    if let Some(note) = shovel_note {
        lines.push(format!("- shovel plugin: {note}"));
    }
    lines.join("\n")
}

/// What kind of queues the run declares.
fn queues_note(quorum: bool) -> &'static str {
    if quorum {
        "quorum (x-queue-type = quorum, durable): every source, destination, backup and \
         dead-letter queue"
    } else {
        "classic (declared without x-queue-type), durable"
    }
}
