//! `kelp watch` (`kelp -w`): the status once, then one line per cluster event, as Ceph's
//! `ceph -w`. The events are the cluster log the monitors keep (OSDs up/down/in/out, pools,
//! flags, health checks, manager failovers, scrub errors, `kelp log add`), streamed as new
//! entries appear, plus the PG state counts and the file systems' MDS roles (`mds: …`, as
//! `kelp mds stat`) whenever they change. Monitors without a cluster
//! log: events are found by comparing successive looks at the cluster ([`Snapshot`]): health
//! and its checks, OSDs up/down/in/out/created/removed, pools created/removed.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use clap::Args;

use crate::cmd::common::{self, Global};
use crate::cmd::status::{Report, print_status, report};

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Seconds between two looks at the cluster.
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    pub interval: f64,
}

impl Default for WatchArgs {
    fn default() -> Self {
        WatchArgs { interval: 1.0 }
    }
}

/// What `kelp watch` compares between two looks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub health: String,
    /// check name -> (severity, summary)
    pub checks: BTreeMap<String, (String, String)>,
    /// osd id -> (up, in)
    pub osds: BTreeMap<i32, (bool, bool)>,
    pub pools: BTreeSet<String>,
    pub pgs_by_state: BTreeMap<String, u32>,
    /// File systems and MDS roles, as `kelp mds stat` prints them (empty without any).
    pub mds: String,
}

impl Snapshot {
    pub fn of(r: &Report) -> Snapshot {
        Snapshot {
            health: r.status().to_string(),
            checks: r
                .checks
                .iter()
                .map(|c| {
                    (
                        c.code.to_string(),
                        (c.severity.to_string(), c.summary.clone()),
                    )
                })
                .collect(),
            osds: r
                .map
                .osds
                .iter()
                .map(|(id, o)| (*id, (o.up, o.weight > 0)))
                .collect(),
            pools: r.map.pools.values().map(|p| p.name.clone()).collect(),
            pgs_by_state: r.pgs_by_state.clone(),
            mds: r
                .fsmap
                .as_ref()
                .filter(|f| !f.filesystems.is_empty() || !f.standbys.is_empty())
                .map(crate::cmd::mds::mds_summary)
                .unwrap_or_default(),
        }
    }

    /// The events between `self` (before) and `now`, one line each.
    pub fn events(&self, now: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        for (id, &(up, inn)) in &now.osds {
            match self.osds.get(id) {
                None => out.push(format!("osd.{id} created")),
                Some(&(was_up, was_in)) => {
                    if was_up != up {
                        out.push(format!("osd.{id} {}", if up { "up" } else { "down" }));
                    }
                    if was_in != inn {
                        out.push(format!("osd.{id} {}", if inn { "in" } else { "out" }));
                    }
                }
            }
        }
        for id in self.osds.keys().filter(|id| !now.osds.contains_key(id)) {
            out.push(format!("osd.{id} removed"));
        }
        for p in now.pools.difference(&self.pools) {
            out.push(format!("pool '{p}' created"));
        }
        for p in self.pools.difference(&now.pools) {
            out.push(format!("pool '{p}' removed"));
        }
        if self.pgs_by_state != now.pgs_by_state {
            let total: u32 = now.pgs_by_state.values().sum();
            let states: Vec<String> = now
                .pgs_by_state
                .iter()
                .map(|(s, n)| format!("{n} {s}"))
                .collect();
            out.push(format!("pgmap: {total} pgs: {}", states.join(", ")));
        }
        if self.mds != now.mds && !now.mds.is_empty() {
            out.push(format!("mds: {}", now.mds));
        }
        for (name, (sev, summary)) in &now.checks {
            if self.checks.get(name).map(|(_, s)| s) != Some(summary) {
                out.push(format!("[{}] {name}: {summary}", short_severity(sev)));
            }
        }
        for name in self.checks.keys().filter(|n| !now.checks.contains_key(*n)) {
            out.push(format!("[INF] {name} cleared"));
        }
        if self.health != now.health {
            out.push(format!("health: {} -> {}", self.health, now.health));
        }
        out
    }
}

fn short_severity(sev: &str) -> &str {
    match sev {
        "HEALTH_ERR" => "ERR",
        "HEALTH_WARN" => "WRN",
        _ => "INF",
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a time since the Unix epoch (UTC).
pub fn utc_timestamp(t: Duration) -> String {
    let secs = t.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // civil date from days since 1970-01-01 (Howard Hinnant's algorithm)
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        t.subsec_millis()
    )
}

fn now() -> String {
    utc_timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

pub fn run(a: WatchArgs, g: &Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    let interval = Duration::from_secs_f64(a.interval.clamp(0.1, 3600.0));
    rt.block_on(async {
        let r = report(&g.conf).await?;
        print_status(&r);
        println!();
        let mut prev = Snapshot::of(&r);
        let mut unreachable = false;
        // the cluster log's newest entry so far (`None`: the monitors keep no log)
        let rados = g.conf.connect().await?;
        let mut log_seq: Option<u64> = crate::cmd::mgr::log_last(&rados, 1)
            .await
            .ok()
            .map(|e| e.last().map_or(0, |e| e.seq));
        loop {
            tokio::select! {
                _ = common::shutdown_signal() => return Ok(ExitCode::SUCCESS),
                _ = tokio::time::sleep(interval) => {}
            }
            match report(&g.conf).await {
                Ok(r) => {
                    if unreachable {
                        println!("{} the monitors answer again", now());
                        unreachable = false;
                    }
                    let snap = Snapshot::of(&r);
                    if let Some(seen) = log_seq {
                        if let Ok(entries) = crate::cmd::mgr::log_last(&rados, 1000).await {
                            for e in entries.iter().filter(|e| e.seq > seen) {
                                println!("{}", crate::cmd::mgr::log_line(e));
                                log_seq = Some(e.seq);
                            }
                        }
                        // the log has the other events; PG state counts are not logged
                        for e in prev
                            .events(&snap)
                            .into_iter()
                            .filter(|e| e.starts_with("pgmap:"))
                        {
                            println!("{} {e}", now());
                        }
                    } else {
                        for e in prev.events(&snap) {
                            println!("{} {e}", now());
                        }
                    }
                    prev = snap;
                }
                Err(e) if !unreachable => {
                    println!("{} cannot reach the cluster: {e:#}", now());
                    unreachable = true;
                }
                Err(_) => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(osds: &[(i32, bool, bool)], pgs: &[(&str, u32)], health: &str) -> Snapshot {
        Snapshot {
            health: health.into(),
            checks: BTreeMap::new(),
            osds: osds.iter().map(|&(i, u, n)| (i, (u, n))).collect(),
            pools: BTreeSet::from(["data".to_string()]),
            pgs_by_state: pgs.iter().map(|&(s, n)| (s.to_string(), n)).collect(),
            mds: String::new(),
        }
    }

    #[test]
    fn events_name_what_changed_and_nothing_else() {
        let a = snap(
            &[(0, true, true), (1, true, true)],
            &[("active+clean", 8)],
            "HEALTH_OK",
        );
        assert!(a.events(&a).is_empty(), "no change, no event");
        let mut b = snap(
            &[(0, true, true), (1, false, true), (2, true, true)],
            &[("active+clean", 5), ("active+undersized+degraded", 3)],
            "HEALTH_WARN",
        );
        b.checks.insert(
            "OSD_DOWN".into(),
            ("HEALTH_WARN".into(), "1 osds down".into()),
        );
        b.pools.insert("images".into());
        b.mds = "cephfs:1 {0=a=up:active}".into();
        assert_eq!(
            a.events(&b),
            vec![
                "osd.1 down",
                "osd.2 created",
                "pool 'images' created",
                "pgmap: 8 pgs: 5 active+clean, 3 active+undersized+degraded",
                "mds: cephfs:1 {0=a=up:active}",
                "[WRN] OSD_DOWN: 1 osds down",
                "health: HEALTH_OK -> HEALTH_WARN",
            ]
        );
        let c = snap(
            &[(0, true, true), (2, true, false)],
            &[("active+clean", 8)],
            "HEALTH_OK",
        );
        let back = b.events(&c);
        assert!(back.contains(&"osd.2 out".to_string()), "{back:?}");
        assert!(back.contains(&"osd.1 removed".to_string()), "{back:?}");
        assert!(
            back.contains(&"pool 'images' removed".to_string()),
            "{back:?}"
        );
        assert!(
            back.contains(&"[INF] OSD_DOWN cleared".to_string()),
            "{back:?}"
        );
    }

    #[test]
    fn timestamps_are_utc_iso() {
        assert_eq!(utc_timestamp(Duration::ZERO), "1970-01-01T00:00:00.000Z");
        // 2026-11-26T13:53:46.250Z
        assert_eq!(
            utc_timestamp(Duration::from_millis(1_795_701_226_250)),
            "2026-11-26T13:53:46.250Z"
        );
        assert_eq!(
            utc_timestamp(Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
    }
}
