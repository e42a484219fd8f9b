//! Every help text against what the binary does: the commands `--help`
//! lists are the ones that run, each command's stated exit codes are the
//! ones it exits with, `run --help`'s signals do what it says, and the
//! process keeps the name `switchyard` (it re-executes itself once at
//! start, for deeper thread stacks).

use crate::support;

use std::process::Output;
use std::time::Duration;

use lapin::BasicProperties;
use support::harness::{Process, base_toml, clean_command, seed_toml, wait_consumers};
use support::{
    DEFAULT_TIMEOUT, TestBroker, amqp_addr, amqp_url, delete_all_with_prefix, unique_prefix,
    wait_until,
};

/// `switchyard ARGS` run clean of the test's environment.
fn switchyard(args: &[&str]) -> Output {
    clean_command()
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run switchyard: {e}"))
}

/// `args --help` as printed; it must exit 0.
fn raw_help(args: &[&str]) -> String {
    let mut with_help = args.to_vec();
    with_help.push("--help");
    let out = switchyard(&with_help);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{args:?} --help: {text}");
    text
}

/// `args --help`, whitespace folded to single spaces; it must exit 0.
fn help(args: &[&str]) -> String {
    fold(&raw_help(args))
}

fn fold(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The description `args --help` gives `option`: the lines under the one
/// that names it, up to the blank line, folded.
fn option_help(args: &[&str], option: &str) -> String {
    let text = raw_help(args);
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(option))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    assert!(!lines.is_empty(), "{args:?} --help has no {option}: {text}");
    fold(&lines.join(" "))
}

/// The command names a help text lists under `Commands:`.
fn listed_commands(args: &[&str]) -> Vec<String> {
    let mut with_help = args.to_vec();
    with_help.push("--help");
    let out = switchyard(&with_help);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect()
}

/// The exit codes a help text states (`Exit codes: 0 ..., 2 ..., 1 ...`).
fn stated_exit_codes(help: &str) -> Vec<i32> {
    let Some((_, rest)) = help.split_once("Exit codes: ") else {
        panic!("no exit codes in: {help}");
    };
    let sentence = rest.split_once('.').map_or(rest, |(s, _)| s);
    sentence
        .split(", ")
        .filter_map(|part| part.split_whitespace().next()?.parse().ok())
        .collect()
}

fn temp_config(p: &str, toml: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("{p}-help.toml"));
    std::fs::write(&path, toml).unwrap_or_else(|e| panic!("write config: {e}"));
    path
}

#[test]
fn the_commands_listed_are_the_commands_that_run() {
    assert_eq!(
        listed_commands(&[]),
        ["run", "check", "dlq", "trace", "ctl"]
    );
    assert_eq!(listed_commands(&["dlq"]), ["inspect", "redrive"]);
    assert_eq!(
        listed_commands(&["ctl"]),
        [
            "status",
            "pause",
            "resume",
            "drain",
            "undrain",
            "register",
            "unregister"
        ]
    );
    for command in [
        &["run"][..],
        &["check"],
        &["dlq", "inspect"],
        &["dlq", "redrive"],
        &["ctl"],
    ] {
        help(command);
    }
    for unlisted in [&["serve"][..], &["dlq", "purge"]] {
        let out = switchyard(unlisted);
        assert_eq!(out.status.code(), Some(2), "{unlisted:?} is not a command");
    }
}

/// A newcomer finds every door from the help: the HTTP ingress, the admin
/// endpoint and reload, in the top-level summary and in `run --help`.
#[test]
fn help_names_the_ingress_the_admin_endpoint_and_reload() {
    for args in [&[][..], &["run"]] {
        let text = help(args);
        for door in [
            "[ingress.http]",
            "POST /messages/{routing_key}",
            "[admin] listen",
            "/healthz, /readyz and /metrics",
            "SIGHUP",
            "a change of the file",
        ] {
            assert!(
                text.contains(door),
                "{args:?} --help lacks {door:?}: {text}"
            );
        }
    }
}

/// Each `dlq` command's `--limit` states its own default and not the
/// other command's.
#[test]
fn each_dlq_limit_states_only_its_own_default() {
    let inspect = option_help(&["dlq", "inspect"], "--limit");
    let own = format!("[default: {}]", switchyard::dlq::DEFAULT_INSPECT_LIMIT);
    assert!(inspect.contains(&own), "{inspect}");
    assert!(!inspect.contains("all"), "{inspect}");
    assert!(!inspect.contains("redrive"), "{inspect}");
    let redrive = option_help(&["dlq", "redrive"], "--limit");
    assert!(redrive.contains("[default: all]"), "{redrive}");
    assert!(!redrive.contains("100"), "{redrive}");
    assert!(!redrive.contains("inspect"), "{redrive}");
}

/// `check`: 0 for a valid file, 2 for an invalid one, as its help says.
#[test]
fn check_exits_with_the_codes_its_help_states() {
    assert_eq!(stated_exit_codes(&help(&["check"])), [0, 2]);
    let p = unique_prefix("help-check");
    let valid = temp_config(&p, &seed_toml(&p, &base_toml(&p, "nack")));
    let out = switchyard(&["check", "--config", &valid.display().to_string()]);
    assert_eq!(out.status.code(), Some(0));
    let invalid = temp_config(&format!("{p}-bad"), "[inbound]\nprefetch = \"many\"\n");
    let out = switchyard(&["check", "--config", &invalid.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    for path in [valid, invalid] {
        let _ = std::fs::remove_file(path);
    }
}

/// `dlq inspect` and `dlq redrive`: 0 done, 2 usage, 1 a broker that
/// cannot be reached, as their help says.
#[test]
fn dlq_commands_exit_with_the_codes_their_help_states() {
    let p = unique_prefix("help-dlq");
    // Port 1: nothing listens there.
    let toml = seed_toml(&p, &base_toml(&p, "republish"))
        .replace(&amqp_url(), "amqp://guest:guest@127.0.0.1:1/%2f");
    let config = temp_config(&p, &toml);
    let config = config.display().to_string();
    for command in ["inspect", "redrive"] {
        assert_eq!(stated_exit_codes(&help(&["dlq", command])), [0, 2, 1]);
        let usage = switchyard(&["dlq", command, "--config", &config, "--since", "soon"]);
        assert_eq!(usage.status.code(), Some(2), "{command}: bad --since");
        let unreachable = switchyard(&["dlq", command, "--config", &config]);
        assert_eq!(unreachable.status.code(), Some(1), "{command}: no broker");
    }
    assert_eq!(stated_exit_codes(&help(&["trace"])), [0, 3, 2, 1]);
    let usage = switchyard(&["trace", "m-1", "--config", &config, "--since", "soon"]);
    assert_eq!(usage.status.code(), Some(2), "trace: bad --since");
    let unreachable = switchyard(&["trace", "m-1", "--config", &config]);
    assert_eq!(unreachable.status.code(), Some(1), "trace: no broker");
    let _ = std::fs::remove_file(config);
}

/// `run`: 2 for an invalid configuration, 1 for a refusal with
/// `--fail-fast`, 0 after SIGTERM; SIGHUP reloads and never ends it; and
/// the process is named `switchyard` all along.
#[tokio::test]
async fn run_does_what_its_help_says_of_signals_and_exit_codes() {
    let run_help = help(&["run"]);
    assert_eq!(stated_exit_codes(&run_help), [0, 2, 1]);
    assert!(
        run_help.contains("SIGHUP, or a change of the file on disk, reloads the configuration"),
        "{run_help}"
    );
    assert!(
        run_help.contains("SIGINT or SIGTERM stops consuming"),
        "{run_help}"
    );
    assert!(!run_help.contains("SIGHUP is logged"), "{run_help}");

    let p = unique_prefix("help-run");
    let invalid = temp_config(&p, "[inbound]\nqueue = 7\n");
    let out = switchyard(&["run", "--config", &invalid.display().to_string()]);
    assert_eq!(out.status.code(), Some(2), "an invalid configuration");
    let _ = std::fs::remove_file(invalid);

    let refused = seed_toml(&p, &base_toml(&p, "nack")).replace(
        &amqp_url(),
        &format!(
            "amqp://guest:wrong-{}@{}/%2f",
            &p[p.len() - 8..],
            amqp_addr()
        ),
    );
    let mut fail_fast = Process::spawn_with(&format!("{p}-ff"), &refused, &["--fail-fast"], &[]);
    assert_eq!(fail_fast.wait_exit(DEFAULT_TIMEOUT).await, Some(1));

    let broker = TestBroker::connect(&p).await;
    let inbound = format!("{p}.in");
    let mut process = Process::spawn(&p, &seed_toml(&p, &base_toml(&p, "nack")));
    wait_consumers(&broker, &inbound, 1).await;
    assert_eq!(
        process_name(process.pid()),
        "switchyard",
        "pgrep switchyard finds it"
    );
    process.signal("HUP");
    wait_until("the reload is live", DEFAULT_TIMEOUT, || async {
        process.log().contains("generation=2")
    })
    .await;
    assert!(process.exited().is_none(), "SIGHUP never ends it");
    broker
        .publish("", &inbound, b"after-hup", BasicProperties::default())
        .await;
    broker
        .await_count(&format!("{p}.service"), 1, DEFAULT_TIMEOUT)
        .await;
    assert_eq!(process_name(process.pid()), "switchyard");
    process.signal("TERM");
    assert_eq!(process.wait_exit(Duration::from_secs(15)).await, Some(0));
    delete_all_with_prefix(&p).await;
}

/// The name the kernel gives the process (`/proc/PID/comm`), which `pgrep`
/// and `ps -C` match.
fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/comm: {e}"))
        .trim()
        .to_owned()
}
