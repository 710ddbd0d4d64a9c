//! The process's CPU, memory, threads, file descriptors and start time, read from `/proc/self`
//! at scrape time (a few small reads; nothing is kept between scrapes).

use crate::{COMMON_METRICS, Snapshot};

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

fn page_size() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as f64 } else { 4096.0 }
}

/// Fields of `/proc/self/stat` after the command name (field 3, the state, is index 0).
fn stat_fields() -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(
        rest.split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

fn boot_time() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// When this process started, in seconds since the Unix epoch (read once at registration).
pub fn start_time_seconds() -> Option<f64> {
    let f = stat_fields()?;
    // field 22 (starttime, in clock ticks since boot) is index 19
    let start_ticks = *f.get(19)? as f64;
    Some(boot_time()? as f64 + start_ticks / clock_ticks())
}

fn max_fds() -> Option<f64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Adds the process metrics of [`COMMON_METRICS`] to `s`.
pub fn collect(s: &mut Snapshot, start: Option<f64>) {
    if let Some(f) = stat_fields() {
        // utime, stime: fields 14, 15; num_threads 20; vsize 23; rss 24 (pages)
        let get = |field: usize| f.get(field - 3).copied().unwrap_or(0) as f64;
        s.set(&COMMON_METRICS[1], &[], (get(14) + get(15)) / clock_ticks());
        s.set(&COMMON_METRICS[2], &[], get(24) * page_size());
        s.set(&COMMON_METRICS[3], &[], get(23));
        s.set(&COMMON_METRICS[6], &[], get(20));
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        s.set(&COMMON_METRICS[4], &[], dir.count() as f64);
    }
    if let Some(m) = max_fds() {
        s.set(&COMMON_METRICS[5], &[], m);
    }
    if let Some(t) = start {
        s.set(&COMMON_METRICS[7], &[], t);
    }
}
