//! `switchyard ctl`, the real binary, against one running instance (the
//! seed scenario with a registrable round-robin branch "workers"): every
//! command (`status`, `pause`, `resume`, `drain`, `undrain`, `register`,
//! `unregister`) exits 0, says what it did, and changes what the
//! instance's own `/control/status` shows; `--json` prints the server's
//! JSON on one line; a registration made this way takes messages. The
//! admin address and token come from the configuration, from `--admin`
//! with `$SWITCHYARD_ADMIN_TOKEN` (no configuration at all), or from
//! `--token`, in that order of precedence. A wrong token, an unknown
//! endpoint and a branch that is not registrable exit 1 with one line
//! giving the server's status and reason; a bad `--ttl`, a bad `--admin`
//! and no token anywhere exit 2; nothing listening exits 1. The token
//! never appears in the instance's log.

use crate::support;

use lapin::BasicProperties;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use support::config::{Branch, Forwarder};
use support::control::{ControlClient, endpoint_state, registered};
use support::harness::{Process, clean_command, wait_consumers};
use support::{
    DEFAULT_TIMEOUT, TestBroker, delete_all_with_prefix, free_admin_addr, tally, unique_prefix,
    wait_for,
};

/// What one run of `switchyard ctl` left.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\nstdout: {}\nstderr: {}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl Ran {
    /// Asserts it exited 0 with nothing on stderr; its stdout.
    fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "{self}");
        assert!(self.stderr.trim().is_empty(), "{self}");
        &self.stdout
    }

    /// Asserts it exited `code` with exactly one line on stderr, starting
    /// `switchyard: `, and nothing on stdout; that line.
    fn failed(&self, code: i32) -> &str {
        assert_eq!(self.code, Some(code), "{self}");
        assert!(self.stdout.trim().is_empty(), "{self}");
        let lines: Vec<&str> = self.stderr.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {self}");
        assert!(lines[0].starts_with("switchyard: "), "{self}");
        let lower = lines[0].to_lowercase();
        assert!(!lower.contains("panicked"), "{self}");
        lines[0]
    }
}

/// `switchyard ctl ARGS` with `env` added to a clean environment, run in
/// the temporary directory (where no `config/switchyard.toml` is found).
async fn ctl(args: &[&str], env: &[(&str, &str)]) -> Ran {
    let out = tokio::process::Command::from(clean_command())
        .arg("ctl")
        .args(args)
        .envs(env.iter().copied())
        .current_dir(std::env::temp_dir())
        .output()
        .await
        .unwrap_or_else(|e| panic!("run switchyard ctl {args:?}: {e}"));
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A token no log line could contain by chance.
fn fresh_token() -> String {
    format!("tok{}", uuid::Uuid::new_v4().simple())
}

/// One running instance: the seed scenario and a registrable "workers"
/// branch, an admin endpoint taking `token`.
struct Instance {
    process: Process,
    control: ControlClient,
    config: String,
}

impl Instance {
    async fn start(p: &str, token: &str) -> Self {
        let addr = free_admin_addr();
        let toml = Forwarder::new(p)
            .seed(p)
            .branch(Branch::registrable("workers", "all").set("strategy", "round_robin"))
            .admin(&addr.to_string())
            .admin_key("tokens", [token])
            .toml();
        let process = Process::spawn(p, &toml);
        let config = process
            .config_path()
            .unwrap_or_else(|| panic!("the instance has a configuration file"))
            .display()
            .to_string();
        let instance = Self {
            process,
            control: ControlClient::new(addr, token),
            config,
        };
        instance.control.recovered().await;
        instance
    }

    fn addr(&self) -> SocketAddr {
        self.control.addr
    }

    /// `switchyard ctl --config <its configuration> ARGS`.
    async fn ctl(&self, args: &[&str]) -> Ran {
        let mut all = vec!["--config", self.config.as_str()];
        all.extend_from_slice(args);
        ctl(&all, &[]).await
    }

    /// Stops it with SIGTERM; it must exit 0. Its log.
    async fn stop(mut self) -> String {
        self.process.signal("TERM");
        assert_eq!(
            self.process.wait_exit(DEFAULT_TIMEOUT).await,
            Some(0),
            "SIGTERM ends it cleanly; log:\n{}",
            self.process.log()
        );
        self.process.log()
    }
}

/// The line of `status`'s human output listing `endpoint`.
fn endpoint_line<'a>(stdout: &'a str, endpoint: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(endpoint))
        .unwrap_or_else(|| panic!("no line for {endpoint}:\n{stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ctl_command_changes_the_running_instance_and_says_what_it_did() {
    let p = unique_prefix("ctl-commands");
    let broker = TestBroker::connect(&p).await;
    let w1 = format!("{p}.w1");
    broker.declare_queue(&w1).await;
    let token = fresh_token();
    let instance = Instance::start(&p, &token).await;
    let name = instance.control.status().await["instance"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!name.is_empty());

    // status, for a person.
    let ran = instance.ctl(&["status"]).await;
    let text = ran.ok();
    assert!(
        text.starts_with(&format!(
            "group {p} (instance {name}), configuration generation "
        )),
        "{text}"
    );
    for line in [
        "paused: no",
        "endpoints:",
        "registrations: none",
        "instances:",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in:\n{text}");
    }
    for endpoint in ["service", "service_backup", "logging", "logging_backup"] {
        assert!(endpoint_line(text, endpoint).ends_with(" up"), "{text}");
    }
    assert!(text.contains(&name), "{text}");

    // status as the server's JSON, on one line; the flag before or after.
    for args in [["--json", "status"], ["status", "--json"]] {
        let ran = instance.ctl(&args).await;
        let out = ran.ok();
        assert_eq!(out.lines().count(), 1, "{ran}");
        let json: Value =
            serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {ran}"));
        assert_eq!(json["paused"], false, "{json}");
        assert_eq!(json["group"], p.as_str(), "{json}");
        assert_eq!(json["instance"], name.as_str(), "{json}");
        assert_eq!(json["control"], true, "{json}");
        assert_eq!(json["recovered"], true, "{json}");
    }

    // pause, then resume.
    let ran = instance.ctl(&["pause"]).await;
    assert!(ran.ok().starts_with("paused: "), "{ran}");
    let status = instance.control.status().await;
    assert_eq!(status["paused"], true, "{status}");
    assert_eq!(status["paused_by"]["instance"], name.as_str(), "{status}");
    let ran = instance.ctl(&["status"]).await;
    let paused_line = ran
        .ok()
        .lines()
        .find(|l| l.starts_with("paused: "))
        .unwrap_or_else(|| panic!("no paused line: {ran}"));
    assert!(
        paused_line.starts_with("paused: yes, since ")
            && paused_line.ends_with(&format!("(by {name})")),
        "{paused_line}"
    );
    let ran = instance.ctl(&["resume"]).await;
    assert!(ran.ok().starts_with("resumed"), "{ran}");
    assert_eq!(instance.control.status().await["paused"], false);

    // drain, then undrain.
    let ran = instance.ctl(&["drain", "service"]).await;
    assert!(ran.ok().starts_with("drained service"), "{ran}");
    let status = instance.control.status().await;
    assert_eq!(
        endpoint_state(&status, "service").as_deref(),
        Some("drained")
    );
    let ran = instance.ctl(&["status"]).await;
    assert!(
        endpoint_line(ran.ok(), "service").ends_with(" drained"),
        "{ran}"
    );
    let ran = instance.ctl(&["undrain", "service"]).await;
    assert!(ran.ok().starts_with("undrained service"), "{ran}");
    let status = instance.control.status().await;
    assert_eq!(endpoint_state(&status, "service").as_deref(), Some("up"));

    // register, which takes messages, then unregister.
    let args = [
        "register",
        "workers",
        "w1",
        "--routing-key",
        w1.as_str(),
        "--ttl",
        "30s",
    ];
    let ran = instance.ctl(&args).await;
    assert!(
        ran.ok().starts_with("registered w1 into workers for 30 s"),
        "{ran}"
    );
    let status = instance.control.status().await;
    assert_eq!(registered(&status, "workers"), ["w1"], "{status}");
    let registration = &status["registrations"][0];
    assert_eq!(registration["routing_key"], w1.as_str(), "{status}");
    assert_eq!(registration["ttl_ms"], 30_000, "{status}");
    assert_eq!(registration["exchange"], "", "{status}");
    assert_eq!(registration["broker"], "main", "{status}");
    let ran = instance.ctl(&["status"]).await;
    assert!(
        ran.ok()
            .lines()
            .any(|l| l.trim_start().starts_with("workers/w1 ") && l.contains(&w1)),
        "{ran}"
    );
    wait_for("w1 is up", DEFAULT_TIMEOUT, || async {
        let status = instance.control.status().await;
        (endpoint_state(&status, "w1").as_deref() == Some("up")).then_some(())
    })
    .await;
    let inbound = format!("{p}.in");
    wait_consumers(&broker, &inbound, 1).await;
    let bodies: Vec<String> = (0..10).map(|i| format!("{p}-{i}")).collect();
    broker
        .publish_many("", &inbound, &bodies, BasicProperties::default())
        .await;
    for queue in [format!("{p}.service"), format!("{p}.logging"), w1.clone()] {
        broker.await_count(&queue, 10, DEFAULT_TIMEOUT).await;
        let copies = tally(&broker.get_all(&queue).await);
        let expected = bodies.iter().map(|b| (b.clone(), 1)).collect();
        assert_eq!(copies, expected, "{queue}: each message once");
    }
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    let ran = instance.ctl(&["unregister", "workers", "w1"]).await;
    assert!(
        ran.ok().starts_with("unregistered w1 from workers"),
        "{ran}"
    );
    let status = instance.control.status().await;
    assert!(registered(&status, "workers").is_empty(), "{status}");

    let log = instance.stop().await;
    assert!(!log.contains(&token), "the token is in the log:\n{log}");
    delete_all_with_prefix(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_takes_its_token_in_order_and_reports_refusals_with_the_servers_reason() {
    let p = unique_prefix("ctl-refusals");
    let token = fresh_token();
    let wrong = fresh_token();
    let instance = Instance::start(&p, &token).await;
    let addr = instance.addr().to_string();
    let url = format!("http://{addr}/");

    // --admin and $SWITCHYARD_ADMIN_TOKEN, and no configuration anywhere.
    let ran = ctl(
        &["--admin", &addr, "status"],
        &[("SWITCHYARD_ADMIN_TOKEN", &token)],
    )
    .await;
    assert!(ran.ok().lines().any(|l| l == "paused: no"), "{ran}");
    // --admin as a URL and --token.
    let ran = ctl(
        &["--admin", &url, "--token", &token, "--json", "status"],
        &[],
    )
    .await;
    let json: Value = serde_json::from_str(ran.ok()).unwrap_or_else(|e| panic!("{e}: {ran}"));
    assert_eq!(json["group"], p.as_str());
    assert!(!ran.stdout.contains(&token), "{ran}");

    // --token before the environment, the environment before the
    // configuration: the wrong one is refused each time.
    for (args, env) in [
        (
            vec!["--config", instance.config.as_str(), "--token", &wrong],
            vec![("SWITCHYARD_ADMIN_TOKEN", token.as_str())],
        ),
        (
            vec!["--config", instance.config.as_str()],
            vec![("SWITCHYARD_ADMIN_TOKEN", wrong.as_str())],
        ),
    ] {
        let mut args = args;
        args.push("pause");
        let ran = ctl(&args, &env).await;
        let line = ran.failed(1);
        assert!(
            line.contains("401") && line.contains("unauthorized"),
            "{ran}"
        );
        assert!(!line.contains(&wrong) && !line.contains(&token), "{ran}");
    }
    assert_eq!(
        instance.control.status().await["paused"],
        false,
        "nothing refused was carried out"
    );

    // Refused by the server: its status and reason, one line, exit 1.
    let ran = instance.ctl(&["drain", "nope"]).await;
    let line = ran.failed(1);
    assert!(
        line.starts_with("switchyard: refused (404 Not Found): unknown endpoint \"nope\""),
        "{ran}"
    );
    let ran = instance
        .ctl(&["register", "service", "w1", "--routing-key", "k"])
        .await;
    let line = ran.failed(1);
    assert!(
        line.starts_with("switchyard: refused (409 Conflict): ")
            && line.contains("not registrable"),
        "{ran}"
    );
    let ran = instance.ctl(&["unregister", "workers", "ghost"]).await;
    assert!(
        ran.failed(1)
            .starts_with("switchyard: refused (404 Not Found): "),
        "{ran}"
    );
    let status = instance.control.status().await;
    assert_eq!(status["offset"], Value::Null, "no command was written");
    assert_eq!(endpoint_state(&status, "service").as_deref(), Some("up"));

    let log = instance.stop().await;
    assert!(!log.contains(&token), "the token is in the log:\n{log}");
    assert!(
        !log.contains(&wrong),
        "the wrong token is in the log:\n{log}"
    );
    delete_all_with_prefix(&p).await;
}

/// A configuration file of the test's own, removed on drop.
struct TempConfig(PathBuf);

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn ctl_usage_errors_exit_2_and_an_unreachable_endpoint_exits_1() {
    let p = unique_prefix("ctl-usage");
    let nowhere = free_admin_addr().to_string();

    let ran = ctl(
        &[
            "--admin",
            &nowhere,
            "--token",
            "t",
            "register",
            "workers",
            "w1",
            "--routing-key",
            "k",
            "--ttl",
            "banana",
        ],
        &[],
    )
    .await;
    assert!(ran.failed(2).contains("--ttl banana"), "{ran}");

    let ran = ctl(
        &["--admin", "not-an-address", "--token", "t", "status"],
        &[],
    )
    .await;
    assert!(ran.failed(2).contains("not-an-address"), "{ran}");

    // No --token, no $SWITCHYARD_ADMIN_TOKEN, no admin.tokens.
    let path = std::env::temp_dir().join(format!("{p}-no-tokens.toml"));
    let toml = Forwarder::new(&p).seed(&p).admin(&nowhere).toml();
    std::fs::write(&path, toml).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    let config = TempConfig(path);
    let config_path = config.0.display().to_string();
    for args in [
        vec!["--config", config_path.as_str(), "status"],
        vec![
            "--config",
            config_path.as_str(),
            "--admin",
            &nowhere,
            "pause",
        ],
    ] {
        let ran = ctl(&args, &[]).await;
        assert!(ran.failed(2).contains("no token"), "{ran}");
    }

    // Nothing listens there.
    let ran = ctl(&["--admin", &nowhere, "--token", "t", "status"], &[]).await;
    let line = ran.failed(1);
    assert!(
        line.contains("cannot reach the admin endpoint") && line.contains(&nowhere),
        "{ran}"
    );
}
