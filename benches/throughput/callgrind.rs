//! Running a mover under valgrind's callgrind and reading back what it
//! counted.

use std::path::{Path, PathBuf};

/// The forwarder's environment under callgrind: the thread stack it
/// needs (`THREAD_STACK` of a release build) already set, so that it does
/// not re-execute itself to raise it, which callgrind cannot follow.
pub const FORWARDER_ENV: [(&str, &str); 1] = [("RUST_MIN_STACK", "134217728")];

/// Where the counts of the run named `prefix` go.
pub fn out_file(dir: &Path, prefix: &str) -> PathBuf {
    dir.join(format!("{prefix}.callgrind"))
}

/// The total instructions in a callgrind output file (its `totals:` or
/// `summary:` line); the file is removed.
pub fn read_total(out: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(out)
        .map_err(|e| format!("callgrind wrote no counts to {}: {e}", out.display()))?;
    let total = text
        .lines()
        .find_map(|line| {
            let value = line
                .strip_prefix("totals:")
                .or_else(|| line.strip_prefix("summary:"))?;
            value.split_whitespace().next()?.parse::<u64>().ok()
        })
        .ok_or_else(|| format!("no totals line in {}", out.display()))?;
    let _ = std::fs::remove_file(out);
    Ok(total)
}

/// Fails with a clear line when valgrind is not installed.
pub fn check_valgrind() -> Result<(), String> {
    match std::process::Command::new("valgrind")
        .arg("--version")
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err("--instructions needs valgrind (Debian: apt install valgrind)".to_owned()),
    }
}
