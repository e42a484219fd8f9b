//! What a process (or the whole machine) has used, from `/proc`: CPU time
//! in clock ticks and memory high-water marks. Linux only; every reader
//! returns `None` when the figure is not there (the process has exited).

use std::process::Command;

/// Clock ticks per second, the unit of the CPU times in `/proc` (`getconf
/// CLK_TCK`; 100 when it cannot be asked).
pub fn clock_ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// User plus system CPU time of process `pid`, all its threads, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// [`cpu_ticks`] of the calling process.
pub fn own_cpu_ticks() -> Option<u64> {
    stat_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// utime + stime of a `/proc/<pid>/stat` line. The command name in
/// parentheses may contain spaces, so fields are counted after its `)`.
fn stat_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    // After the name: state is field 3, utime field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`...), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_field_kib(&status, field)
}

fn status_field_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The process name (`/proc/<pid>/comm`).
pub fn process_name(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim().to_owned())
}

/// `(busy, total)` clock ticks of all CPUs together since boot (`/proc/stat`).
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let values: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let get = |i: usize| values.get(i).copied().unwrap_or(0);
    let idle = get(3) + get(4);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
    Some((busy, busy + idle))
}

/// Logical CPUs this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The first `model name` of `/proc/cpuinfo`.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, model)| model.trim().to_owned())
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`).
pub fn load_average() -> Option<String> {
    let load = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Bytes received on the TCP connection from `remote` to `local` that the
/// process owning `local` has not read yet (`rx_queue` of
/// `/proc/net/tcp`); `None` when no such IPv4 connection is listed.
pub fn unread_bytes(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let (local, remote) = (proc_net_addr(local)?, proc_net_addr(remote)?);
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1)? != &local || fields.get(2)? != &remote {
            return None;
        }
        let (_, rx) = fields.get(4)?.split_once(':')?;
        u64::from_str_radix(rx, 16).ok()
    })
}

/// An IPv4 address as `/proc/net/tcp` writes it: the address as a
/// little-endian word, then the port, both in upper-case hex.
fn proc_net_addr(addr: std::net::SocketAddr) -> Option<String> {
    let std::net::SocketAddr::V4(v4) = addr else {
        return None;
    };
    let word = u32::from_le_bytes(v4.ip().octets());
    Some(format!("{word:08X}:{:04X}", v4.port()))
}
