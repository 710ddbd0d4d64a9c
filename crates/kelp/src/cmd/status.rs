//! `kelp status` and `kelp health`: the cluster at a glance, shaped like Ceph's.
//!
//! PG states, object counts, usage and client I/O rates come from the leader monitor's digest
//! of the OSDs' statistics reports (`MonCommand::PgStats`); OSD up/in and flags come from the
//! OSD map. The health checks (Ceph's names: `OSD_DOWN`, `OSDMAP_FLAGS`, `OSD_FULL`, …,
//! `PG_DAMAGED`) and PG state names are computed by `kelp-health`; this module gathers its
//! inputs from the cluster and prints the results.
//!
//! While objects are degraded or misplaced, the recovery rate (the leader's sum of the OSDs'
//! recovery counters, Ceph's `recovering_objects_per_sec` / `recovering_bytes_per_sec`) and a
//! progress bar with an ETA are shown ([`recovery_progress`]): the bar is the share of PGs
//! `active+clean`, the ETA the degraded and misplaced copies left divided by the objects
//! recovered per second.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use kelp_health::{HealthCheck, Severity};
use kelp_maps::OsdMap;
use kelp_proto::{ClusterStatus, MonCommand, MonReply, PgMapDigest, PgMapTotals, RecoveryRates};

use crate::cmd::OutputFormat;
use crate::cmd::common::{self, ConfArgs};

#[derive(Args, Debug, Default)]
pub struct StatusArgs {}

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// `detail` lists what each check found.
    #[arg(value_parser = ["detail"])]
    pub detail: Option<String>,
    /// First wait until every OSD is up and every PG of every pool is active+clean (what
    /// `kelp up` waits for; e.g. after `kelp daemon start osd.2`, until recovery is done);
    /// fails after --timeout saying what is still not ready.
    #[arg(long)]
    pub wait: bool,
    /// Seconds --wait waits at most.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub timeout: u64,
}

pub struct Report {
    pub map: std::sync::Arc<OsdMap>,
    pub mon: Option<ClusterStatus>,
    /// The leader's statistics digest (`None` if the monitors could not give one).
    pub digest: Option<PgMapDigest>,
    pub checks: Vec<HealthCheck>,
    pub pgs_by_state: BTreeMap<String, u32>,
    pub num_pgs: u32,
    /// The file-system map (`None` if the monitors could not give it).
    pub fsmap: Option<kelp_client::FsMap>,
    // Manager and its progress items.
    /// The manager map (`None` if the monitors did not give one).
    pub mgr: Option<kelp_proto::MgrMap>,
    /// The long operations the active manager follows (empty without one).
    pub progress_items: Vec<kelp_proto::ProgressItem>,
}

impl Report {
    pub fn status(&self) -> Severity {
        kelp_health::overall(&self.checks)
    }

    pub fn totals(&self) -> PgMapTotals {
        self.digest.as_ref().map(|d| d.totals).unwrap_or_default()
    }

    pub fn recovery_rates(&self) -> RecoveryRates {
        self.digest.as_ref().map(|d| d.recovery).unwrap_or_default()
    }

    /// PGs whose state is active and clean (scrubbing or not), not stale.
    pub fn clean_pgs(&self) -> u32 {
        kelp_health::clean_pgs(&self.pgs_by_state)
    }

    pub fn progress(&self) -> Option<RecoveryProgress> {
        recovery_progress(
            &self.totals(),
            &self.recovery_rates(),
            self.clean_pgs(),
            self.num_pgs,
        )
    }
}

/// Where a recovery stands, for the `progress:` section and the JSON `pgmap.recovery_progress`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecoveryProgress {
    /// Degraded plus misplaced object copies still to recover.
    pub remaining_objects: u64,
    pub clean_pgs: u32,
    pub num_pgs: u32,
    /// Share of PGs active+clean, 0..=1 (what the bar shows).
    pub fraction: f64,
    pub objects_per_sec: u64,
    pub bytes_per_sec: u64,
    /// `remaining_objects / objects_per_sec`, rounded up; `None` while nothing is recovered or
    /// no copies are known to be left.
    pub eta_secs: Option<u64>,
}

/// The recovery's progress, or `None` when there is nothing to recover: no degraded or
/// misplaced copies, and no recovery running for PGs that are not clean yet.
pub fn recovery_progress(
    t: &PgMapTotals,
    r: &RecoveryRates,
    clean_pgs: u32,
    num_pgs: u32,
) -> Option<RecoveryProgress> {
    let remaining = t.degraded_objects + t.misplaced_objects;
    let running = r.recovering_objects_per_sec > 0 && clean_pgs < num_pgs;
    if remaining == 0 && !running {
        return None;
    }
    let fraction = if num_pgs == 0 {
        0.0
    } else {
        (f64::from(clean_pgs) / f64::from(num_pgs)).clamp(0.0, 1.0)
    };
    // no ETA without a rate, nor while the copies left are not known (PGs recovering as they
    // peer report no degraded counts yet)
    let eta_secs = (r.recovering_objects_per_sec > 0 && remaining > 0)
        .then(|| remaining.div_ceil(r.recovering_objects_per_sec));
    Some(RecoveryProgress {
        remaining_objects: remaining,
        clean_pgs,
        num_pgs,
        fraction,
        objects_per_sec: r.recovering_objects_per_sec,
        bytes_per_sec: r.recovering_bytes_per_sec,
        eta_secs,
    })
}

/// A `width`-character bar like Ceph's progress module: `[=====.....]`.
pub fn progress_bar(fraction: f64, width: usize) -> String {
    let done = ((fraction.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("[{}{}]", "=".repeat(done), ".".repeat(width - done))
}

/// A duration the way Ceph's progress module prints it: `45s`, `3m`, `2h`.
pub fn short_duration(secs: u64) -> String {
    if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m", secs.div_ceil(60))
    } else {
        format!("{}h", secs.div_ceil(3600))
    }
}

/// The `recovery:` rate line of the `io:` section (`45 MiB/s, 11 objects/s`).
pub fn recovery_rate_line(r: &RecoveryRates) -> String {
    format!(
        "{}/s, {} objects/s",
        human_bytes(r.recovering_bytes_per_sec),
        r.recovering_objects_per_sec
    )
}

/// The `progress:` section's lines (without their indentation).
pub fn progress_lines(p: &RecoveryProgress) -> [String; 2] {
    let eta = match p.eta_secs {
        Some(s) => format!("(remaining: {})", short_duration(s)),
        None if p.objects_per_sec == 0 => {
            "(remaining: unknown, nothing recovered in the last report)".to_string()
        }
        None => "(remaining: unknown)".to_string(),
    };
    let left = if p.remaining_objects > 0 {
        format!("{} objects to recover, ", p.remaining_objects)
    } else {
        String::new()
    };
    [
        format!(
            "Global Recovery Event: {left}{}/{} pgs active+clean",
            p.clean_pgs, p.num_pgs
        ),
        format!("  {} {eta}", progress_bar(p.fraction, 28)),
    ]
}

/// Bytes the way Ceph prints them (`4.5 MiB`, `300 GiB`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 || v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Adds to `PG_AVAILABILITY`'s detail, for each `down` or `incomplete` PG, the OSDs it waits
/// for: the members of its activation record (asked from the monitors).
async fn explain_blocked_pgs(
    rados: &kelp_client::Rados,
    map: &OsdMap,
    d: &PgMapDigest,
    checks: &mut [HealthCheck],
) {
    for p in kelp_health::blocked_pgs(d) {
        let Ok(MonReply::PgRecord(Some(r))) = rados
            .mon_command(MonCommand::PgRecordGet { pg: p.stat.pg })
            .await
        else {
            continue;
        };
        let members: Vec<(i32, bool)> = r.members.iter().map(|o| (*o, map.is_up(*o))).collect();
        kelp_health::explain_blocked_pg(checks, p, &members);
    }
}

/// Gathers the map, the monitor status and the statistics digest, and evaluates the health
/// checks.
pub async fn report(conf: &ConfArgs) -> Result<Report> {
    let rados = conf.connect().await?;
    let mon = match rados.mon_command(MonCommand::Status).await {
        Ok(MonReply::Status(s)) => Some(s),
        _ => None,
    };
    let digest = match rados.mon_command(MonCommand::PgStats).await {
        Ok(MonReply::PgStats(d)) => Some(*d),
        _ => None,
    };
    // The digest was computed against the leader's map: use a map at least that new.
    if let Some(d) = &digest {
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            rados.wait_for_epoch(d.epoch),
        )
        .await;
    }
    let map = rados.osd_map();
    // scrub states and errors come from the primaries themselves (one request per up OSD)
    let scrubs =
        crate::cmd::scrub::scrub_summaries(&rados, std::time::Duration::from_secs(2)).await;
    let mut checks = kelp_health::health_checks(&map, digest.as_ref(), &scrubs);
    if let Some(d) = &digest {
        explain_blocked_pgs(&rados, &map, d, &mut checks).await;
    }
    let fsmap = rados.fs_map().await.ok();
    if let Some(f) = &fsmap {
        checks.extend(kelp_health::fs_checks(f));
    }
    let mut pgs_by_state: BTreeMap<String, u32> = BTreeMap::new();
    let mut num_pgs = 0;
    match &digest {
        Some(d) => {
            for p in &d.pgs {
                num_pgs += 1;
                let state = kelp_health::pg_state_with_scrub(&p.state_name, scrubs.get(&p.stat.pg));
                *pgs_by_state.entry(state).or_default() += 1;
            }
        }
        None => {
            for pool in map.pools.values() {
                num_pgs += pool.pg_num;
                *pgs_by_state.entry("unknown".into()).or_default() += pool.pg_num;
            }
        }
    }
    let mgr = match rados.mon_command(MonCommand::MgrStat).await {
        Ok(MonReply::MgrMap(m)) => Some(m),
        _ => None,
    };
    let progress_items = crate::cmd::mgr::progress_items(&rados).await;
    Ok(Report {
        map,
        mon,
        digest,
        checks,
        pgs_by_state,
        num_pgs,
        fsmap,
        mgr,
        progress_items,
    })
}

pub fn status_json(r: &Report) -> serde_json::Value {
    let checks: serde_json::Map<String, serde_json::Value> = r
        .checks
        .iter()
        .map(|c| {
            (
                c.code.to_string(),
                serde_json::json!({"severity": c.severity.as_str(),
                    "summary": {"message": c.summary, "count": c.detail.len()},
                    "detail": c.detail.iter().map(|d| serde_json::json!({"message": d})).collect::<Vec<_>>()}),
            )
        })
        .collect();
    let map = &r.map;
    let t = r.totals();
    serde_json::json!({
        "fsid": map.fsid,
        "health": {"status": r.status().as_str(), "checks": checks},
        "monmap": r.mon.as_ref().map(|m| serde_json::json!({
            "num_mons": m.monitors.len(),
            "quorum_names": m.monitors.iter().filter(|(_, q)| *q).map(|(n, _)| n.clone()).collect::<Vec<_>>(),
            "leader": m.leader,
        })),
        "fsmap": r.fsmap.as_ref().map(|f| serde_json::json!({
            "epoch": f.epoch,
            "by_rank": f.filesystems.values().filter_map(|fs| fs.active.as_ref().map(|a| serde_json::json!({
                "filesystem_id": fs.id, "filesystem_name": fs.name, "rank": 0,
                "name": a.name, "status": a.state.to_string(), "incarnation": a.incarnation}))).collect::<Vec<_>>(),
            "up:standby": f.standbys.len(),
            "summary": crate::cmd::mds::mds_summary(f),
        })),
        "mgrmap": r.mgr.as_ref().map(crate::cmd::mgr::mgr_map_json),
        "progress_events": r.progress_items.iter().map(crate::cmd::mgr::progress_item_json).collect::<Vec<_>>(),
        "osdmap": {"epoch": map.epoch, "num_osds": map.osds.len(), "num_up_osds": map.num_up(),
            "num_in_osds": map.num_in(), "flags": map.flags.iter().map(|f| f.to_string()).collect::<Vec<_>>()},
        "pgmap": {"num_pools": map.pools.len(), "num_pgs": r.num_pgs,
            "pgs_by_state": r.pgs_by_state.iter().map(|(s, c)| serde_json::json!({"state_name": s, "count": c})).collect::<Vec<_>>(),
            "num_objects": t.num_objects, "data_bytes": t.data_bytes, "bytes_used": t.bytes_used,
            "bytes_avail": t.bytes_avail, "bytes_total": t.bytes_total,
            "read_bytes_sec": t.rates.read_bytes_sec, "write_bytes_sec": t.rates.write_bytes_sec,
            "read_op_per_sec": t.rates.read_op_per_sec, "write_op_per_sec": t.rates.write_op_per_sec,
            "degraded_objects": t.degraded_objects, "degraded_total": t.degraded_total,
            "degraded_ratio": if t.degraded_total == 0 { 0.0 } else { t.degraded_objects as f64 / t.degraded_total as f64 },
            "misplaced_objects": t.misplaced_objects, "misplaced_total": t.degraded_total,
            "misplaced_ratio": if t.degraded_total == 0 { 0.0 } else { t.misplaced_objects as f64 / t.degraded_total as f64 },
            "unfound_objects": t.unfound_objects,
            "recovering_objects_per_sec": r.recovery_rates().recovering_objects_per_sec,
            "recovering_bytes_per_sec": r.recovery_rates().recovering_bytes_per_sec,
            "recovery_progress": r.progress().map(|p| serde_json::json!({
                "remaining_objects": p.remaining_objects, "clean_pgs": p.clean_pgs,
                "num_pgs": p.num_pgs, "fraction": p.fraction, "eta_secs": p.eta_secs})),
        },
    })
}

pub fn run_status(_a: StatusArgs, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    let r = rt.block_on(report(&g.conf))?;
    if g.format == OutputFormat::Json {
        println!("{}", serde_json::to_string_pretty(&status_json(&r))?);
        return Ok(ExitCode::SUCCESS);
    }
    print_status(&r);
    Ok(ExitCode::SUCCESS)
}

/// Prints a report the way `ceph -s` does.
pub fn print_status(r: &Report) {
    let map = &r.map;
    println!("  cluster:");
    println!("    id:     {}", map.fsid);
    println!("    health: {}", r.status());
    for c in &r.checks {
        println!("            {}: {}", c.code, c.summary);
    }
    println!();
    println!("  services:");
    if let Some(m) = &r.mon {
        let quorum: Vec<&str> = m
            .monitors
            .iter()
            .filter(|(_, q)| *q)
            .map(|(n, _)| n.as_str())
            .collect();
        println!(
            "    mon: {} daemons, quorum {} (leader {})",
            m.monitors.len(),
            quorum.join(","),
            m.leader.as_deref().unwrap_or("none")
        );
    }
    if let Some(m) = &r.mgr {
        match &m.active {
            Some(a) => {
                let standbys: Vec<&str> = m.standbys.iter().map(|s| s.name.as_str()).collect();
                if standbys.is_empty() {
                    println!("    mgr: {}(active)", a.name);
                } else {
                    println!(
                        "    mgr: {}(active), standbys: {}",
                        a.name,
                        standbys.join(", ")
                    );
                }
            }
            None => println!("    mgr: no daemons active"),
        }
    }
    println!(
        "    osd: {} osds: {} up, {} in; epoch e{}",
        map.osds.len(),
        map.num_up(),
        map.num_in(),
        map.epoch
    );
    if let Some(f) = r
        .fsmap
        .as_ref()
        .filter(|f| !f.filesystems.is_empty() || !f.standbys.is_empty())
    {
        println!("    mds: {}", crate::cmd::mds::mds_summary(f));
    }
    println!();
    println!("  data:");
    println!("    pools:   {} pools, {} pgs", map.pools.len(), r.num_pgs);
    let t = r.totals();
    if r.digest.is_some() {
        println!(
            "    objects: {} objects, {}",
            t.num_objects,
            human_bytes(t.data_bytes)
        );
        println!(
            "    usage:   {} used, {} / {} avail",
            human_bytes(t.bytes_used),
            human_bytes(t.bytes_avail),
            human_bytes(t.bytes_total)
        );
    }
    let mut first = true;
    let mut pgs_line = |text: String| {
        println!(
            "    {}{text}",
            if first { "pgs:     " } else { "         " }
        );
        first = false;
    };
    if t.degraded_objects > 0 {
        pgs_line(format!(
            "{}/{} objects degraded ({:.3}%)",
            t.degraded_objects,
            t.degraded_total,
            kelp_health::percent(t.degraded_objects, t.degraded_total)
        ));
    }
    if t.misplaced_objects > 0 {
        pgs_line(format!(
            "{}/{} objects misplaced ({:.3}%)",
            t.misplaced_objects,
            t.degraded_total,
            kelp_health::percent(t.misplaced_objects, t.degraded_total)
        ));
    }
    for (state, count) in &r.pgs_by_state {
        pgs_line(format!("{count} {state}"));
    }
    let rt = t.rates;
    let rec = r.recovery_rates();
    let client = rt.read_bytes_sec + rt.write_bytes_sec + rt.read_op_per_sec + rt.write_op_per_sec;
    let recovering = rec.recovering_objects_per_sec + rec.recovering_bytes_per_sec;
    if client + recovering > 0 {
        println!();
        println!("  io:");
        if client > 0 {
            println!(
                "    client:   {}/s rd, {}/s wr, {} op/s rd, {} op/s wr",
                human_bytes(rt.read_bytes_sec),
                human_bytes(rt.write_bytes_sec),
                rt.read_op_per_sec,
                rt.write_op_per_sec
            );
        }
        if recovering > 0 {
            println!("    recovery: {}", recovery_rate_line(&rec));
        }
    }
    // The manager's items when it follows the work (they include recovery); otherwise the
    // recovery estimate computed here.
    let running: Vec<&kelp_proto::ProgressItem> = r
        .progress_items
        .iter()
        .filter(|p| p.finished_ms.is_none())
        .collect();
    if !running.is_empty() {
        println!();
        println!("  progress:");
        for p in running {
            for l in crate::cmd::mgr::progress_item_lines(p) {
                println!("    {l}");
            }
        }
    } else if let Some(p) = r.progress() {
        println!();
        println!("  progress:");
        for l in progress_lines(&p) {
            println!("    {l}");
        }
    }
}

/// What keeps the cluster from being ready for clients: OSDs of the map that are not up, and
/// PGs of any pool that are not `active+clean` (PGs no OSD has reported yet count as not
/// ready, and so do statistics older than the map). Empty when ready.
pub async fn not_ready(rados: &kelp_client::Rados) -> Result<Vec<String>> {
    let digest = match rados.mon_command(MonCommand::PgStats).await? {
        MonReply::PgStats(d) => d,
        other => anyhow::bail!("asking the monitors for PG states: unexpected reply {other:?}"),
    };
    // the client's map may trail the leader's digest: catch up first, briefly
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        rados.wait_for_epoch(digest.epoch),
    )
    .await;
    Ok(kelp_health::readiness(&rados.osd_map(), &digest))
}

/// Waits until [`not_ready`] is empty; after `timeout`, an error naming what is still not
/// ready. `check` runs on every round (e.g. to fail early when a daemon died).
pub async fn wait_ready(
    rados: &kelp_client::Rados,
    timeout: std::time::Duration,
    mut check: impl FnMut() -> Result<()>,
) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let why = match not_ready(rados).await {
            Ok(w) => w,
            Err(e) => vec![format!("{e:#}")],
        };
        if why.is_empty() {
            return Ok(());
        }
        check()?;
        if std::time::Instant::now() >= deadline {
            anyhow::bail!(
                "the cluster is not ready after {}s: {} (see `kelp health detail`)",
                timeout.as_secs(),
                why.join("; ")
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

pub fn run_health(a: HealthArgs, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    if a.wait {
        rt.block_on(async {
            let rados = g.conf.connect().await?;
            wait_ready(&rados, std::time::Duration::from_secs(a.timeout), || Ok(())).await
        })?;
    }
    let r = rt.block_on(report(&g.conf))?;
    if g.format == OutputFormat::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status_json(&r)["health"])?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let summary: Vec<String> = r.checks.iter().map(|c| c.summary.clone()).collect();
    if summary.is_empty() {
        println!("{}", r.status());
    } else {
        println!("{} {}", r.status(), summary.join("; "));
    }
    if a.detail.is_some() {
        for c in &r.checks {
            println!("[{}] {}: {}", c.severity.short(), c.code, c.summary);
            for d in &c.detail {
                println!("    {d}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_like_ceph() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(300 << 20), "300 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
    }

    fn totals(degraded: u64, misplaced: u64) -> PgMapTotals {
        PgMapTotals {
            degraded_objects: degraded,
            misplaced_objects: misplaced,
            degraded_total: 2304,
            ..PgMapTotals::default()
        }
    }

    fn rates(objects: u64, bytes: u64) -> RecoveryRates {
        RecoveryRates {
            recovering_objects_per_sec: objects,
            recovering_bytes_per_sec: bytes,
        }
    }

    #[test]
    fn no_progress_when_nothing_to_recover() {
        assert_eq!(
            recovery_progress(&totals(0, 0), &rates(0, 0), 128, 128),
            None
        );
        // a leftover rate after everything is clean is no recovery
        assert_eq!(
            recovery_progress(&totals(0, 0), &rates(5, 5 << 22), 128, 128),
            None
        );
        // PGs still unclean with objects being copied (counts not reported yet): shown, with
        // no ETA (nothing known to be left)
        let p = recovery_progress(&totals(0, 0), &rates(5, 5 << 22), 96, 128).unwrap();
        assert_eq!(p.eta_secs, None);
        assert_eq!(
            progress_lines(&p),
            [
                "Global Recovery Event: 96/128 pgs active+clean".to_string(),
                "  [=====================.......] (remaining: unknown)".to_string()
            ]
        );
    }

    #[test]
    fn progress_eta_and_bar() {
        let p = recovery_progress(&totals(300, 20), &rates(11, 45 << 20), 96, 128).unwrap();
        assert_eq!(p.remaining_objects, 320);
        assert_eq!(p.eta_secs, Some(30)); // 320 / 11 = 29.1, rounded up
        assert!((p.fraction - 0.75).abs() < 1e-9);
        assert_eq!(
            recovery_rate_line(&rates(11, 45 << 20)),
            "45 MiB/s, 11 objects/s"
        );
        let [head, bar] = progress_lines(&p);
        assert_eq!(
            head,
            "Global Recovery Event: 320 objects to recover, 96/128 pgs active+clean"
        );
        assert_eq!(bar, "  [=====================.......] (remaining: 30s)");
        // no rate yet: no ETA
        let p = recovery_progress(&totals(300, 0), &rates(0, 0), 0, 128).unwrap();
        assert_eq!(p.eta_secs, None);
        assert!(
            progress_lines(&p)[1]
                .starts_with("  [............................] (remaining: unknown")
        );
    }

    #[test]
    fn bars_and_durations() {
        assert_eq!(progress_bar(0.0, 4), "[....]");
        assert_eq!(progress_bar(0.5, 4), "[==..]");
        assert_eq!(progress_bar(1.0, 4), "[====]");
        assert_eq!(progress_bar(7.0, 4), "[====]");
        assert_eq!(progress_bar(-1.0, 4), "[....]");
        assert_eq!(short_duration(0), "0s");
        assert_eq!(short_duration(59), "59s");
        assert_eq!(short_duration(61), "2m");
        assert_eq!(short_duration(3599), "60m");
        assert_eq!(short_duration(3600), "1h");
        assert_eq!(short_duration(3601), "2h");
    }
}
