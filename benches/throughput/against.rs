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
//! Before any row runs, the other build checks (`switchyard check`) every
//! configuration the benchmark will give it: an older build that does not
//! know a key fails the run there, saying which key, rather than midway.

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

/// Has the other build check `configs` (a row's name and the TOML it
/// runs on) with `switchyard check`, which connects to nothing; each is
/// written to a file named after `prefix` for it.
pub fn check_configs(
    against: &Against,
    prefix: &str,
    configs: &[(&str, String)],
) -> Result<(), String> {
    for (row, toml) in configs {
        let path = std::env::temp_dir().join(format!("{prefix}-{row}.toml"));
        std::fs::write(&path, toml).map_err(|e| format!("write {}: {e}", path.display()))?;
        let mut command = Command::new(&against.binary);
        command.arg("check").arg("--config").arg(&path);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("SWITCHYARD") {
                command.env_remove(key);
            }
        }
        let result = run_quiet(&mut command);
        let _ = std::fs::remove_file(&path);
        if let Err(e) = result {
            return Err(format!(
                "the build against ({}) refuses the configuration this benchmark writes for {row} \
                 (a key it does not know?): {}",
                against.label,
                e.trim()
            ));
        }
    }
    Ok(())
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
