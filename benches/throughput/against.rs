//! `--against REV|PATH`: another build of switchyard whose forwarder rows
//! run beside this build's in the same rounds, so that a change is
//! measured against the build before it on the same machine minutes
//! apart, not against figures taken on another day.
//!
//! PATH is a switchyard binary, used as it is. REV is a git revision of
//! this repository: it is checked out in a temporary `git worktree` (in
//! the temporary directory, removed after the build) and built with
//! `cargo build --release --bin switchyard` into `against/target` under
//! this build's target directory; the binary is kept there as
//! `against/<commit>/switchyard`, so a second run against the same commit
//! builds nothing and one against another commit compiles only the crate
//! (a new `against/target` starts as a copy of this build's `release`).
//!
//! Every configuration the other build runs on is first fitted to it: it
//! checks it (`switchyard check`, which connects to nothing), and a table
//! or key it does not know (an older build, before `[journal]` or
//! `[control]`) is left out and the file checked again, so the build before
//! a feature runs as it shipped, without it. The header names what was
//! left out; anything else it refuses fails the run before any row runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::harness::Process;

/// The other build.
#[derive(Debug, Clone)]
pub struct Against {
    /// Its switchyard binary.
    pub binary: PathBuf,
    /// What the tables call it: the short commit, or `other` for a binary
    /// (whose path the header gives).
    pub label: String,
    /// What the header says of it: which commit and how it was built.
    pub describe: String,
}

/// Resolves `spec`: an existing file is a binary, anything else a git
/// revision, built unless a build of that commit is already kept.
pub fn resolve(spec: &str) -> Result<Against, String> {
    let path = Path::new(spec);
    if path.is_file() {
        let binary = path
            .canonicalize()
            .map_err(|e| format!("--against {spec}: {e}"))?;
        let version = run_quiet(Command::new(&binary).arg("--version"))
            .map_or_else(|_| "version unknown".to_owned(), |v| v.trim().to_owned());
        return Ok(Against {
            label: "other".to_owned(),
            describe: format!("the binary {} ({version})", binary.display()),
            binary,
        });
    }
    let repo = env!("CARGO_MANIFEST_DIR");
    let commit = git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{spec}^{{commit}}"),
        ],
    )
    .map_err(|_| format!("--against {spec}: neither a file nor a git revision of {repo}"))?;
    let short = git(repo, &["rev-parse", "--short", &commit])?;
    let subject = git(repo, &["log", "-1", "--format=%cs %s", &commit])?;
    let target = target_dir()?;
    let kept = target.join("against").join(&commit);
    let binary = kept.join("switchyard");
    let how = if binary.is_file() {
        eprintln!(
            "--against {spec}: commit {short}, built before: {}",
            binary.display()
        );
        "built by an earlier run (kept)"
    } else {
        let against_target = target.join("against").join("target");
        seed(&target, &against_target);
        build(repo, &commit, &short, &against_target, &binary)?;
        "built now"
    };
    Ok(Against {
        label: short.clone(),
        describe: format!(
            "commit {commit} ({subject}), `cargo build --release --bin switchyard` in a \
             temporary worktree, {how}: {}",
            relative(&binary)
        ),
        binary,
    })
}

/// This build's target directory: the one the switchyard binary is in.
fn target_dir() -> Result<PathBuf, String> {
    Path::new(Process::binary())
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("no target directory above {}", Process::binary()))
}

/// `path` relative to the repository when it is inside it.
fn relative(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Seeds a new `against_target` with a copy of this build's
/// `release` directory, so that the dependencies both builds share are
/// not compiled again (cargo rebuilds whatever does not match).
fn seed(target: &Path, against_target: &Path) {
    let release = target.join("release");
    if against_target.exists() || !release.is_dir() {
        return;
    }
    eprintln!(
        "--against: seeding {} from {} ...",
        relative(against_target),
        relative(&release)
    );
    let copied = std::fs::create_dir_all(against_target)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            run_quiet(
                Command::new("cp")
                    .args(["-a", "--reflink=auto"])
                    .arg(&release)
                    .arg(against_target),
            )
        });
    if let Err(e) = copied {
        eprintln!("warning: seeding {}: {e}", relative(against_target));
    }
}

/// Checks out `commit` in a temporary worktree, builds its switchyard
/// binary into `target_dir`, copies it to `binary` and removes the
/// worktree, whether the build succeeded or not.
fn build(
    repo: &str,
    commit: &str,
    short: &str,
    target_dir: &Path,
    binary: &Path,
) -> Result<(), String> {
    let tree = std::env::temp_dir().join(format!("switchyard-against-{short}"));
    let tree_arg = tree.display().to_string();
    // A worktree left by an interrupted run is removed first.
    let _ = git(repo, &["worktree", "remove", "--force", &tree_arg]);
    let _ = git(repo, &["worktree", "prune"]);
    git(repo, &["worktree", "add", "--detach", &tree_arg, commit])?;
    eprintln!(
        "--against: building commit {short} (cargo build --release --bin switchyard, target dir {}) ...",
        relative(target_dir)
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--bin",
            "switchyard",
            "--target-dir",
        ])
        .arg(target_dir)
        .current_dir(&tree)
        .env_remove("CARGO_TARGET_DIR")
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status();
    let built = target_dir.join("release").join("switchyard");
    let copied = match status {
        Ok(s) if s.success() => binary
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::copy(&built, binary))
            .map(|_| ())
            .map_err(|e| format!("copying {} to {}: {e}", built.display(), binary.display())),
        Ok(s) => Err(format!("building commit {short} failed ({s})")),
        Err(e) => Err(format!("cannot run cargo to build commit {short}: {e}")),
    };
    if let Err(e) = git(repo, &["worktree", "remove", "--force", &tree_arg]) {
        eprintln!("warning: removing the worktree {tree_arg}: {e}");
    }
    copied
}

/// Fits each of `configs` (a row's name and the TOML it runs on) to the
/// other build ([`fit`]); the keys left out, for the header.
pub fn check_configs(
    against: &Against,
    prefix: &str,
    configs: &[(&str, String)],
) -> Result<Vec<String>, String> {
    let mut left_out = Vec::new();
    for (row, toml) in configs {
        let (_, dropped) = fit(against, &format!("{prefix}-{row}"), toml).map_err(|e| {
            format!(
                "the build against ({}) refuses the configuration this benchmark writes for \
                 {row}: {e}",
                against.label
            )
        })?;
        for key in dropped {
            if !left_out.contains(&key) {
                left_out.push(key);
            }
        }
    }
    Ok(left_out)
}

/// `toml` with whatever the other build does not know left out (whole
/// tables, or keys of a table), checked by it; and what was left out.
pub fn fit(against: &Against, name: &str, toml: &str) -> Result<(String, Vec<String>), String> {
    let mut toml = toml.to_owned();
    let mut dropped = Vec::new();
    let path = std::env::temp_dir().join(format!("{name}-check.toml"));
    for _ in 0..16 {
        std::fs::write(&path, &toml).map_err(|e| format!("write {}: {e}", path.display()))?;
        let mut command = Command::new(&against.binary);
        command.arg("check").arg("--config").arg(&path);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("SWITCHYARD") {
                command.env_remove(key);
            }
        }
        let result = run_quiet(&mut command);
        let error = match result {
            Ok(_) => {
                let _ = std::fs::remove_file(&path);
                return Ok((toml, dropped));
            }
            Err(e) => e,
        };
        let Some(key) = unknown_key(&error).filter(|k| !dropped.contains(k)) else {
            let _ = std::fs::remove_file(&path);
            return Err(error.trim().to_owned());
        };
        toml = without(&toml, &key);
        dropped.push(key);
    }
    let _ = std::fs::remove_file(&path);
    Err("too many keys it does not know".to_owned())
}

/// The key a `check` error names as unknown: `journal: unknown key ...`
/// (`table.key` inside a table), or serde's ``unknown field `journal` ``
/// (a top-level table or key).
fn unknown_key(error: &str) -> Option<String> {
    if let Some(at) = error.find(": unknown key") {
        let before = &error[..at];
        let start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .map_or(0, |i| i + 1);
        let key = &before[start..];
        return (!key.is_empty()).then(|| key.to_owned());
    }
    let at = error.find("unknown field `")? + "unknown field `".len();
    let len = error[at..].find('`')?;
    Some(error[at..at + len].to_owned())
}

/// `toml` without `key`: a top-level table `[key]` (and its subtables
/// `[key.x]`), a top-level `key = ...`, or `key = ...` inside the table a
/// dotted `table.key` names.
fn without(toml: &str, key: &str) -> String {
    let (table, leaf) = match key.rsplit_once('.') {
        Some((table, leaf)) => (Some(table), leaf),
        None => (None, key),
    };
    let mut out = String::with_capacity(toml.len());
    let mut current: Option<String> = None;
    let mut skipping = false;
    for line in toml.lines() {
        let trimmed = line.trim();
        if let Some(name) = trimmed
            .strip_prefix("[[")
            .and_then(|r| r.strip_suffix("]]"))
            .or_else(|| trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']')))
        {
            let name = name.trim().to_owned();
            skipping = table.is_none() && (name == leaf || name.starts_with(&format!("{leaf}.")));
            current = Some(name);
            if skipping {
                continue;
            }
        } else if skipping {
            continue;
        } else {
            let assigns = |k: &str| {
                trimmed
                    .strip_prefix(k)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            };
            let here = current.as_deref() == table;
            if here && assigns(leaf) {
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `git args...` in `repo`; its output, trimmed.
fn git(repo: &str, args: &[&str]) -> Result<String, String> {
    run_quiet(Command::new("git").args(args).current_dir(repo))
        .map(|out| out.trim().to_owned())
        .map_err(|e| format!("git {}: {}", args.join(" "), e.trim()))
}

/// Runs `command`; its stdout on success, its stderr (or why it could not
/// start) otherwise.
fn run_quiet(command: &mut Command) -> Result<String, String> {
    let out = command.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stderr.lines().chain(stdout.lines()).collect();
        Err(format!("{}: {}", out.status, lines.join(" | ")))
    }
}
