//! The command line: `check` validates a configuration without
//! touching a broker, prints a summary without secrets, and reports an
//! invalid one as one line naming the file and the key, with exit code 2.
//! `--config` falls back to `$SWITCHYARD_CONFIG`, then `config/switchyard.toml`,
//! and `SWITCHYARD__SECTION__KEY` overrides a key. No broker is needed.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::harness::clean_command as switchyard;
use support::repo::root;

const REPO_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/switchyard.toml");

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run switchyard: {e}"))
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A temporary configuration file with a unique name, removed on drop.
struct TempConfig {
    path: PathBuf,
}

impl TempConfig {
    fn new(test: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{}.toml", support::unique_prefix(test)));
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        Self { path }
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn display(&self) -> String {
        self.path.display().to_string()
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn repo_config_text() -> String {
    std::fs::read_to_string(REPO_CONFIG).unwrap_or_else(|e| panic!("read {REPO_CONFIG}: {e}"))
}

/// The repository's configuration with `from` replaced by `to` (which must occur).
fn repo_config_with(from: &str, to: &str) -> String {
    let text = repo_config_text();
    assert!(
        text.contains(from),
        "{REPO_CONFIG} no longer contains {from:?}"
    );
    text.replacen(from, to, 1)
}

/// Asserts `check` on `config` fails with exit 2 and one line on stderr
/// starting with `switchyard: <path>: ` and containing every `needle`.
fn assert_invalid(config: &TempConfig, needles: &[&str]) -> String {
    let out = run(switchyard().arg("check").arg("--config").arg(config.path()));
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "check on an invalid config exits 2; stderr: {err}"
    );
    assert_no_panic(&err);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one line on stderr, got: {err:?}");
    let prefix = format!("switchyard: {}: ", config.display());
    assert!(
        lines[0].starts_with(&prefix),
        "stderr must start with {prefix:?}: {err:?}"
    );
    for needle in needles {
        assert!(
            lines[0].contains(needle),
            "stderr must mention {needle:?}: {err:?}"
        );
    }
    assert!(
        stdout(&out).trim().is_empty(),
        "no summary for an invalid config: {}",
        stdout(&out)
    );
    lines[0].to_string()
}

fn assert_no_panic(err: &str) {
    let lower = err.to_lowercase();
    assert!(
        !lower.contains("panicked") && !lower.contains("backtrace"),
        "no panic or backtrace: {err}"
    );
}

#[test]
fn check_prints_the_routing_table_without_the_password() {
    let out = run(switchyard().args(["check", "--config", REPO_CONFIG]));
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "stdout: {text}\nstderr: {err}");
    for needle in [
        "service",
        "logging",
        "primaryServiceQueue",
        "backupServiceQueue",
        "work.in",
        "admin: 127.0.0.1:9090",
    ] {
        assert!(
            text.contains(needle),
            "summary must mention {needle:?}:\n{text}"
        );
    }
    assert!(
        !text.contains("guest:guest") && !err.contains("guest:guest"),
        "the password must not be printed:\n{text}{err}"
    );
    assert!(
        text.contains("guest:***"),
        "the URI is shown redacted:\n{text}"
    );
}

#[test]
fn check_never_prints_a_password_and_needs_no_broker() {
    let secret = format!("pw-{}", support::unique_prefix("secret"));
    // Port 1: nothing listens there; check must not try to connect.
    let config = TempConfig::new(
        "cli-secret",
        &repo_config_with(
            "amqp://guest:guest@127.0.0.1:5672/%2f",
            &format!("amqp://alice:{secret}@127.0.0.1:1/%2f"),
        ),
    );
    let out = run(switchyard().arg("check").arg("--config").arg(config.path()));
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "stdout: {text}\nstderr: {err}");
    assert!(
        !text.contains(&secret) && !err.contains(&secret),
        "the password must not be printed:\n{text}{err}"
    );
    assert!(
        text.contains("alice:***"),
        "the URI is shown redacted:\n{text}"
    );
}

#[test]
fn check_reports_an_unknown_endpoint_in_the_filter_table() {
    let config = TempConfig::new(
        "cli-unknown-endpoint",
        &repo_config_with(
            "endpoint = \"primaryServiceQueue\"",
            "endpoint = \"noSuchEndpoint\"",
        ),
    );
    assert_invalid(&config, &["filter_table[0].endpoint", "noSuchEndpoint"]);
}

#[test]
fn check_reports_an_unknown_backup_list() {
    let config = TempConfig::new(
        "cli-unknown-backup-list",
        &repo_config_with(
            "backup_list = \"backupLoggingEndpoints\"",
            "backup_list = \"noSuchList\"",
        ),
    );
    assert_invalid(&config, &["filter_table[1].backup_list", "noSuchList"]);
}

#[test]
fn check_reports_an_unknown_key() {
    let config = TempConfig::new(
        "cli-unknown-key",
        &repo_config_with("prefetch = 1000\n", "prefetch = 1000\nprefetchh = 5\n"),
    );
    let line = assert_invalid(
        &config,
        &["inbound.prefetchh: unknown key; did you mean `prefetch`? (valid keys: broker, queue, "],
    );
    assert!(!line.contains("unknown field"), "{line}");

    let endpoint = TempConfig::new(
        "cli-unknown-endpoint-key",
        &repo_config_with(
            "routing_key = \"service.primary\"",
            "routingkey = \"service.primary\"",
        ),
    );
    assert_invalid(
        &endpoint,
        &[
            "endpoints.primaryServiceQueue.routingkey: unknown key; did you mean `routing_key`? \
             (valid keys: broker, exchange, routing_key, ",
        ],
    );

    let top_level = TempConfig::new(
        "cli-unknown-top-key",
        &format!("colour = \"blue\"\n{}", repo_config_text()),
    );
    assert_invalid(&top_level, &["colour: unknown key (valid keys: name, "]);
}

#[test]
fn check_reports_a_value_of_the_wrong_type_and_bad_toml() {
    let config = TempConfig::new(
        "cli-wrong-type",
        &repo_config_with("prefetch = 1000\n", "prefetch = \"lots\"\n"),
    );
    assert_invalid(&config, &["prefetch"]);

    let broken = TempConfig::new("cli-broken-toml", "[inbound\nbroker = \"main\"\n");
    assert_invalid(&broken, &[]);
}

#[test]
fn check_reports_a_missing_file() {
    let path = std::env::temp_dir().join(format!("{}.toml", support::unique_prefix("cli-missing")));
    let out = run(switchyard().arg("check").arg("--config").arg(&path));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert_no_panic(&err);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one line on stderr, got: {err:?}");
    assert!(
        lines[0].starts_with(&format!("switchyard: {}: ", path.display())),
        "stderr names the file: {err:?}"
    );
}

#[test]
fn config_defaults_to_the_environment_variable() {
    let config = TempConfig::new(
        "cli-env-config",
        &repo_config_with("queue = \"work.in\"", "queue = \"from.env.in\""),
    );
    // Run from the repository, where the default config/switchyard.toml exists:
    // the environment variable must win over it.
    let out = run(switchyard()
        .arg("check")
        .current_dir(root())
        .env("SWITCHYARD_CONFIG", config.path()));
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "stdout: {text}\nstderr: {err}");
    assert!(
        text.contains(&config.display()),
        "the summary names {}:\n{text}",
        config.display()
    );
    assert!(
        text.contains("from.env.in"),
        "the env file's queue:\n{text}"
    );
    assert!(!text.contains("work.in"), "not the default file:\n{text}");
}

#[test]
fn config_flag_wins_over_the_environment_variable() {
    let from_env = TempConfig::new(
        "cli-env-loses",
        &repo_config_with("queue = \"work.in\"", "queue = \"from.env.in\""),
    );
    let from_flag = TempConfig::new(
        "cli-flag-wins",
        &repo_config_with("queue = \"work.in\"", "queue = \"from.flag.in\""),
    );
    let out = run(switchyard()
        .arg("check")
        .arg("--config")
        .arg(from_flag.path())
        .env("SWITCHYARD_CONFIG", from_env.path()));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(text.contains(&from_flag.display()), "{text}");
    assert!(text.contains("from.flag.in"), "{text}");
    assert!(!text.contains("from.env.in"), "{text}");
}

#[test]
fn config_defaults_to_config_switchyard_toml() {
    let out = run(switchyard().arg("check").current_dir(root()));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(
        text.contains("config/switchyard.toml"),
        "the default file is named:\n{text}"
    );

    // Somewhere without that file, the error names it.
    let empty_dir = std::env::temp_dir().join(support::unique_prefix("cli-empty-dir"));
    std::fs::create_dir_all(&empty_dir).unwrap_or_else(|e| panic!("mkdir: {e}"));
    let out = run(switchyard().arg("check").current_dir(&empty_dir));
    let _ = std::fs::remove_dir(&empty_dir);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert_no_panic(&err);
    assert!(err.contains("config/switchyard.toml"), "{err}");
}

#[test]
fn environment_overrides_a_key() {
    let out = run(switchyard()
        .args(["check", "--config", REPO_CONFIG])
        .env("SWITCHYARD__INBOUND__PREFETCH", "7"));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(text.contains("prefetch 7"), "summary:\n{text}");
    assert!(!text.contains("prefetch 1000"), "summary:\n{text}");
}

/// An override that does not fit its key names the environment variable,
/// not the file (which is fine), and never repeats a password.
#[test]
fn an_invalid_environment_override_names_the_variable() {
    let cases = [
        ("SWITCHYARD__INBOUND__PREFETCH", "abc", "inbound.prefetch"),
        ("SWITCHYARD__INBOUND__PREFETCH", "0", "inbound.prefetch"),
        (
            "SWITCHYARD__INBOUND__NO_SUCH_KEY",
            "1",
            "inbound.no_such_key: unknown key (valid keys: broker, ",
        ),
        (
            "SWITCHYARD__INBOUND__PREFETCHH",
            "1",
            "inbound.prefetchh: unknown key; did you mean `prefetch`?",
        ),
        (
            "SWITCHYARD__BROKERS__MAIN__URI",
            "http://guest:env-secret@127.0.0.1/",
            "brokers.main.uri",
        ),
    ];
    for (var, value, key) in cases {
        let out = run(switchyard()
            .args(["check", "--config", REPO_CONFIG])
            .env(var, value));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {err}");
        assert_no_panic(&err);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err:?}");
        assert!(
            lines[0].starts_with(&format!("switchyard: environment variable {var}: ")),
            "{err}"
        );
        assert!(lines[0].contains(key), "{err}");
        assert!(!lines[0].contains(REPO_CONFIG), "{err}");
        assert!(!lines[0].contains("env-secret"), "{err}");
    }
    // The same key wrong in the file is still the file's fault.
    let config = TempConfig::new(
        "cli-prefetch",
        &repo_config_with("prefetch = 1000", "prefetch = 0"),
    );
    let line = assert_invalid(&config, &["inbound.prefetch"]);
    assert!(!line.contains("environment"), "{line}");
}

#[test]
fn run_rejects_an_invalid_override_before_any_io() {
    for format in ["text", "json"] {
        let out = run(switchyard()
            .args(["--log-format", format, "run", "--config", REPO_CONFIG])
            .env("SWITCHYARD__INBOUND__PREFETCH", "abc"));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("SWITCHYARD__INBOUND__PREFETCH"), "{err}");
        if format == "json" {
            for line in err.lines() {
                let value: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                assert_eq!(value["level"], "ERROR", "{line}");
            }
        }
    }
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    let out = run(switchyard().arg("no-such-command"));
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(&out));
    assert_no_panic(&stderr(&out));

    let out = run(switchyard().args(["check", "--no-such-flag"]));
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(&out));

    let out = run(&mut switchyard());
    assert_eq!(out.status.code(), Some(2), "no subcommand is a usage error");

    let out = run(switchyard().arg("--help"));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    for command in ["run", "check"] {
        assert!(text.contains(command), "--help lists {command:?}:\n{text}");
    }
}

#[test]
fn check_refuses_an_endpoint_that_routes_into_the_inbound_queue() {
    let config = TempConfig::new(
        "cli-loop",
        &repo_config_with(
            "routing_key = \"logging.backup\"\ndeclare_queue = \"logging.backup\"",
            "routing_key = \"work.in\"",
        ),
    );
    assert_invalid(
        &config,
        &[
            "endpoints.backupLoggingQueue.routing_key",
            "\"work.in\"",
            "would route every copy back into the inbound queue (a forwarding loop)",
        ],
    );

    // The same queue through an alias of the inbound's broker, overridden
    // from the environment: still a loop.
    let alias = TempConfig::new(
        "cli-loop-alias",
        &format!(
            "{}\n[brokers.alias]\nuri = \"amqp://guest:guest@localhost:5672/%2F\"\n",
            repo_config_with(
                "broker = \"main\"\nrouting_key = \"logging.backup\"",
                "broker = \"alias\"\nrouting_key = \"logging.backup\"",
            )
        ),
    );
    let out = run(switchyard()
        .arg("check")
        .arg("--config")
        .arg(alias.path())
        .env(
            "SWITCHYARD__ENDPOINTS__BACKUPLOGGINGQUEUE__ROUTING_KEY",
            "work.in",
        ));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(
        err.contains("endpoints.backupLoggingQueue.routing_key")
            && err.contains("broker \"alias\", which has the host, port and vhost of the inbound's broker \"main\""),
        "{err}"
    );

    let dead_letter = TempConfig::new(
        "cli-dead-letter-loop",
        &repo_config_with("queue = \"work.dlq\"", "queue = \"work.in\""),
    );
    assert_invalid(&dead_letter, &["dead_letter.queue", "(a dead-letter loop)"]);
}

/// `check` says whether sessions are on, with every setting, so an
/// environment override can be confirmed before anything runs.
#[test]
fn check_shows_the_sessions_settings_and_their_overrides() {
    let out = run(switchyard().args(["check", "--config", REPO_CONFIG]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("\nsessions: off\n"),
        "{}",
        stdout(&out)
    );

    let out = run(switchyard()
        .args(["check", "--config", REPO_CONFIG])
        .env("SWITCHYARD__SESSIONS__ENABLED", "yes")
        .env("SWITCHYARD__SESSIONS__IDLE_TIMEOUT_MS", "600000"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let expected = "\nsessions: on (id_header \"session-id\", end_header \"session-end\", \
                    idle_timeout_ms 600000, max_open 16, max_messages 50, max_bytes 16777216, \
                    closed_ttl_ms 60000)\n";
    assert!(stdout(&out).contains(expected), "{}", stdout(&out));
}

/// For a quorum inbound queue `check` says the delivery limit switchyard
/// creates it with (one above `max_redeliveries`) and the policy line for
/// a queue created without it; a classic queue has no delivery limit.
#[test]
fn check_says_what_delivery_limit_a_quorum_inbound_queue_needs() {
    let out = run(switchyard().args(["check", "--config", REPO_CONFIG]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stdout(&out).contains("delivery limit"), "{}", stdout(&out));

    let out = run(switchyard()
        .args(["check", "--config", REPO_CONFIG])
        .env("SWITCHYARD__INBOUND__QUEUE_TYPE", "quorum")
        .env("SWITCHYARD__INBOUND__MAX_REDELIVERIES", "4"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let expected = "\ndelivery limit: 5 (x-delivery-limit on the quorum queue when switchyard \
                    creates it; a queue created without it needs a policy, or a message whose \
                    header the client cannot read blocks it: rabbitmqctl set_policy -p '/' \
                    --apply-to queues 'switchyard-work.in' '^work\\.in$' \
                    '{\"dead-letter-exchange\":\"work.dlx\",\"dead-letter-routing-key\":\"work.dlq\",\
                    \"dead-letter-strategy\":\"at-least-once\",\"delivery-limit\":5,\
                    \"overflow\":\"reject-publish\"}')\nbrokers: ";
    assert!(stdout(&out).contains(expected), "{}", stdout(&out));
}

/// A filter's keys can come from the environment like any other, text
/// turned into the boolean or number the filter's kind takes.
#[test]
fn a_filter_can_be_overridden_from_the_environment() {
    let out = run(switchyard()
        .args(["check", "--config", REPO_CONFIG])
        .env("SWITCHYARD__FILTERS__ALL__TYPE", "header")
        .env("SWITCHYARD__FILTERS__ALL__HEADER", "tenant")
        .env("SWITCHYARD__FILTERS__ALL__EXISTS", "true"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run(switchyard()
        .args(["check", "--config", REPO_CONFIG])
        .env("SWITCHYARD__FILTERS__ALL__TYPE", "header")
        .env("SWITCHYARD__FILTERS__ALL__EXISTS", "true"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("filters.all.header: is required"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_cluster_nodes_entry_can_be_overridden_from_the_environment() {
    let config = TempConfig::new(
        "cli-uris",
        &repo_config_with(
            "uri = \"amqp://guest:guest@127.0.0.1:5672/%2f\"",
            "uris = [\"amqp://guest:guest@127.0.0.1:5672/%2f\", \"amqp://guest:guest@rabbit-2:5672/%2f\"]",
        ),
    );
    let out = run(switchyard()
        .args(["check", "--config", &config.display()])
        .env(
            "SWITCHYARD__BROKERS__MAIN__URIS__1",
            "amqp://guest:pw@rabbit-3:5673/%2f",
        ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(
            "main = amqp://guest:***@127.0.0.1:5672/%2f, amqp://guest:***@rabbit-3:5673/%2f"
        ),
        "{}",
        stdout(&out)
    );
    let out = run(switchyard()
        .args(["check", "--config", &config.display()])
        .env(
            "SWITCHYARD__BROKERS__MAIN__URIS__1",
            "amqp://guest:pw@rabbit-3/other",
        ));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("SWITCHYARD__BROKERS__MAIN__URIS__1")
            && err.contains("vhost \"other\" differs from uris[0]'s \"/\"")
            && !err.contains(":pw@"),
        "{err}"
    );
}
