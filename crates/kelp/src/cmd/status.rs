//! `kelp status` and `kelp health`: the cluster at a glance, shaped like Ceph's.
//!
//! Health checks and PG states are derived from the OSD map (which OSDs are up and in, and so
//! how many replicas each PG's acting set has). Until OSDs report PG statistics (recovery
//! progress, object counts, usage, I/O rates), states such as `recovering` are not shown.
//! Scrub state (`+inconsistent`, `+scrubbing…`) and the `OSD_SCRUB_ERRORS`/`PG_DAMAGED` checks
//! come from asking each up OSD for its primary PGs' scrub summaries (`cmd::scrub`).

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use kelp_maps::OsdMap;
use kelp_proto::{ClusterStatus, MonCommand, MonReply};

use crate::cmd::OutputFormat;
use crate::cmd::common::{self, ConfArgs};

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub conf: ConfArgs,
    #[arg(long, value_enum, default_value = "plain")]
    pub format: OutputFormat,
}

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// `detail` lists what each check found.
    #[arg(value_parser = ["detail"])]
    pub detail: Option<String>,
    #[command(flatten)]
    pub conf: ConfArgs,
    #[arg(long, value_enum, default_value = "plain")]
    pub format: OutputFormat,
}

/// One failed health check (Ceph's stable names).
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub severity: &'static str,
    pub summary: String,
    pub detail: Vec<String>,
}

pub struct Report {
    pub map: std::sync::Arc<OsdMap>,
    pub mon: Option<ClusterStatus>,
    pub checks: Vec<Check>,
    pub pgs_by_state: BTreeMap<String, u32>,
    pub num_pgs: u32,
}

impl Report {
    pub fn status(&self) -> &'static str {
        if self.checks.iter().any(|c| c.severity == "HEALTH_ERR") {
            "HEALTH_ERR"
        } else if self.checks.is_empty() {
            "HEALTH_OK"
        } else {
            "HEALTH_WARN"
        }
    }
}

/// Gathers the map and monitor status and evaluates the health checks.
pub async fn report(conf: &ConfArgs) -> Result<Report> {
    let rados = conf.connect().await?;
    let map = rados.osd_map();
    let mon = match rados.mon_command(MonCommand::Status).await {
        Ok(MonReply::Status(s)) => Some(s),
        _ => None,
    };
    let mut checks = Vec::new();
    let down: Vec<String> = map
        .osds
        .values()
        .filter(|o| !o.up && o.is_in())
        .map(|o| format!("osd.{} is down", o.id))
        .collect();
    if !down.is_empty() {
        checks.push(Check {
            name: "OSD_DOWN",
            severity: "HEALTH_WARN",
            summary: format!("{} osds down", down.len()),
            detail: down,
        });
    }
    if !map.flags.is_empty() {
        let flags: Vec<String> = map.flags.iter().map(|f| f.to_string()).collect();
        checks.push(Check {
            name: "OSDMAP_FLAGS",
            severity: "HEALTH_WARN",
            summary: format!("{} flag(s) set", flags.join(",")),
            detail: vec![],
        });
    }
    // Scrub state and errors, asked from the primaries until OSDs report PG statistics.
    let scrubs =
        crate::cmd::scrub::scrub_summaries(&rados, std::time::Duration::from_secs(2)).await;
    let mut pgs_by_state: BTreeMap<String, u32> = BTreeMap::new();
    let mut inactive = Vec::new();
    let mut degraded = Vec::new();
    let mut num_pgs = 0;
    for pool in map.pools.values() {
        for pg in map.pool_pgs(pool.id)? {
            num_pgs += 1;
            let m = map.pg_mapping(pg)?;
            let have = m.acting.len() as u32;
            let state = if have >= pool.size {
                "active+clean"
            } else if have >= pool.min_size {
                degraded.push(format!(
                    "pg {pg} is active+undersized+degraded, acting {:?}",
                    m.acting
                ));
                "active+undersized+degraded"
            } else {
                inactive.push(format!(
                    "pg {pg} is inactive: {have} of {} replicas, min_size {}",
                    pool.size, pool.min_size
                ));
                "undersized+degraded+peered"
            };
            let mut state = state.to_string();
            for w in scrubs.get(&pg).map(|s| s.state_words()).unwrap_or_default() {
                state.push('+');
                state.push_str(w);
            }
            *pgs_by_state.entry(state).or_default() += 1;
        }
    }
    if !inactive.is_empty() {
        checks.push(Check {
            name: "PG_AVAILABILITY",
            severity: "HEALTH_ERR",
            summary: format!("Reduced data availability: {} pgs inactive", inactive.len()),
            detail: inactive,
        });
    }
    if !degraded.is_empty() {
        checks.push(Check {
            name: "PG_DEGRADED",
            severity: "HEALTH_WARN",
            summary: format!(
                "Degraded data redundancy: {} pgs undersized",
                degraded.len()
            ),
            detail: degraded,
        });
    }
    checks.extend(crate::cmd::scrub::scrub_checks(&scrubs));
    if map.osds.is_empty() {
        checks.push(Check {
            name: "TOO_FEW_OSDS",
            severity: "HEALTH_WARN",
            summary: "no OSDs".into(),
            detail: vec![],
        });
    }
    Ok(Report {
        map,
        mon,
        checks,
        pgs_by_state,
        num_pgs,
    })
}

pub fn status_json(r: &Report) -> serde_json::Value {
    let checks: serde_json::Map<String, serde_json::Value> = r
        .checks
        .iter()
        .map(|c| {
            (
                c.name.to_string(),
                serde_json::json!({"severity": c.severity,
                    "summary": {"message": c.summary, "count": c.detail.len()},
                    "detail": c.detail.iter().map(|d| serde_json::json!({"message": d})).collect::<Vec<_>>()}),
            )
        })
        .collect();
    let map = &r.map;
    serde_json::json!({
        "fsid": map.fsid,
        "health": {"status": r.status(), "checks": checks},
        "monmap": r.mon.as_ref().map(|m| serde_json::json!({
            "num_mons": m.monitors.len(),
            "quorum_names": m.monitors.iter().filter(|(_, q)| *q).map(|(n, _)| n.clone()).collect::<Vec<_>>(),
            "leader": m.leader,
        })),
        "osdmap": {"epoch": map.epoch, "num_osds": map.osds.len(), "num_up_osds": map.num_up(),
            "num_in_osds": map.num_in(), "flags": map.flags.iter().map(|f| f.to_string()).collect::<Vec<_>>()},
        "pgmap": {"num_pools": map.pools.len(), "num_pgs": r.num_pgs,
            "pgs_by_state": r.pgs_by_state.iter().map(|(s, c)| serde_json::json!({"state_name": s, "count": c})).collect::<Vec<_>>()},
    })
}

pub fn run_status(a: StatusArgs) -> Result<ExitCode> {
    let rt = common::runtime()?;
    let r = rt.block_on(report(&a.conf))?;
    if a.format == OutputFormat::Json {
        println!("{}", serde_json::to_string_pretty(&status_json(&r))?);
        return Ok(ExitCode::SUCCESS);
    }
    let map = &r.map;
    println!("  cluster:");
    println!("    id:     {}", map.fsid);
    println!("    health: {}", r.status());
    for c in &r.checks {
        println!("            {}: {}", c.name, c.summary);
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
    println!(
        "    osd: {} osds: {} up, {} in; epoch e{}",
        map.osds.len(),
        map.num_up(),
        map.num_in(),
        map.epoch
    );
    println!();
    println!("  data:");
    println!("    pools:   {} pools, {} pgs", map.pools.len(), r.num_pgs);
    for (state, count) in &r.pgs_by_state {
        println!("    pgs:     {count} {state}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_health(a: HealthArgs) -> Result<ExitCode> {
    let rt = common::runtime()?;
    let r = rt.block_on(report(&a.conf))?;
    if a.format == OutputFormat::Json {
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
            println!("[{}] {}: {}", &c.severity[7..], c.name, c.summary);
            for d in &c.detail {
                println!("    {d}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
