//! The journal as an operator reads it: `switchyard trace` run as a user
//! runs it, on a configuration file written for the test, and waited for
//! until the records a test expects have been written.

use super::DEFAULT_TIMEOUT;
use super::harness::clean_command;
use serde_json::Value;
use std::time::Duration;
use tokio::time::Instant;

/// What one `switchyard trace --json` printed.
#[derive(Debug)]
pub struct Traced {
    /// The exit code.
    pub code: Option<i32>,
    /// One JSON object per record, in the order printed.
    pub records: Vec<Value>,
    pub stdout: String,
    pub stderr: String,
}

impl Traced {
    /// The records of `instance`.
    pub fn of_instance(&self, instance: &str) -> Vec<&Value> {
        self.records
            .iter()
            .filter(|r| r["instance"] == instance)
            .collect()
    }
}

/// Runs `switchyard ARGS --config FILE`, the file holding `toml`.
pub async fn switchyard(toml: &str, args: &[&str]) -> std::process::Output {
    let dir = std::env::temp_dir().join(format!("sy-cli-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let path = dir.join("switchyard.toml");
    std::fs::write(&path, toml).unwrap_or_else(|e| panic!("{e}"));
    let mut command = clean_command();
    command.args(args).arg("--config").arg(&path);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("cannot run switchyard: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    output
}

/// Runs `switchyard trace ID` on a file holding `toml`, with `args` after
/// it (`--json` for [`Traced::records`]).
pub async fn trace(toml: &str, id: &str, args: &[&str]) -> Traced {
    let mut all = vec!["trace", id];
    all.extend_from_slice(args);
    let output = switchyard(toml, &all).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let records = if args.contains(&"--json") {
        stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    } else {
        Vec::new()
    };
    Traced {
        code: output.status.code(),
        records,
        stdout,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The records of `id` once there are at least `n` of them (the writer
/// batches, so the last may come a moment after the message settled).
pub async fn records(toml: &str, id: &str, n: usize) -> Vec<Value> {
    records_within(toml, id, n, DEFAULT_TIMEOUT).await
}

/// [`records`] with a chosen deadline.
pub async fn records_within(toml: &str, id: &str, n: usize, within: Duration) -> Vec<Value> {
    let deadline = Instant::now() + within;
    loop {
        let traced = trace(toml, id, &["--json"]).await;
        if traced.records.len() >= n {
            return traced.records;
        }
        assert!(
            Instant::now() < deadline,
            "{n} records of {id} not written within {within:?}: {traced:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each attempt of `branch` in `record` as `endpoint:outcome`.
pub fn attempts(record: &Value, branch: &str) -> Vec<String> {
    let branches = record["branches"].as_array().cloned().unwrap_or_default();
    let Some(found) = branches.iter().find(|b| b["branch"] == branch) else {
        panic!("no branch {branch} in {record}");
    };
    found["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            let mut step = format!(
                "{}:{}",
                a["endpoint"].as_str().unwrap_or_default(),
                a["outcome"].as_str().unwrap_or_default()
            );
            if let Some(code) = a["reply_code"].as_u64() {
                step.push_str(&format!(":{code}"));
            }
            if a["replay"] == true {
                step.push_str(":replay");
            }
            step
        })
        .collect()
}

/// The result word of `branch` in `record`.
pub fn result(record: &Value, branch: &str) -> String {
    let branches = record["branches"].as_array().cloned().unwrap_or_default();
    branches
        .iter()
        .find(|b| b["branch"] == branch)
        .and_then(|b| b["result"].as_str())
        .unwrap_or_default()
        .to_owned()
}
