//! `kelp daemon ls`: the service map (every daemon's beacon, kept by the leader monitor) with
//! each daemon's metrics URL, for people and for Prometheus service discovery
//! (docs/METRICS.md); and the hidden `kelp metrics-doc`, which prints the metric reference of
//! docs/METRICS.md from the daemons' metric tables.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::cmd::OutputFormat;
use crate::cmd::common;

/// `kelp daemon ls`.
#[derive(Args, Debug)]
pub struct DaemonLsArgs {}

fn age(ms: u64) -> String {
    match ms / 1000 {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

pub fn run_ls(_a: DaemonLsArgs, g: &common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async move {
        let rados = g.conf.connect().await?;
        let daemons = rados.service_map().await?;
        match g.format {
            OutputFormat::Json => {
                let v: Vec<serde_json::Value> = daemons
                    .iter()
                    .map(|d| {
                        serde_json::json!({
                            "name": d.name,
                            "kind": d.kind,
                            "status": if d.stale { "stale" } else { "up" },
                            "metrics_url": d.addrs.get("metrics"),
                            "addrs": d.addrs,
                            "version": d.version,
                            "last_beacon_secs": d.age_ms as f64 / 1000.0,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
            OutputFormat::Plain => {
                let w = daemons
                    .iter()
                    .map(|d| d.name.len())
                    .max()
                    .unwrap_or(4)
                    .max(4);
                println!(
                    "{:<w$}  {:<4}  {:<6}  {:>5}  METRICS_URL",
                    "NAME", "KIND", "STATUS", "BEACON"
                );
                for d in &daemons {
                    println!(
                        "{:<w$}  {:<4}  {:<6}  {:>5}  {}",
                        d.name,
                        d.kind,
                        if d.stale { "stale" } else { "up" },
                        age(d.age_ms),
                        d.addrs.get("metrics").map_or("-", String::as_str),
                    );
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Every daemon's metric table, in the order docs/METRICS.md lists them.
pub fn metric_tables() -> Vec<kelp_metrics::MetricTable> {
    vec![
        kelp_metrics::COMMON_TABLE,
        kelp_metrics::MSGR_TABLE,
        kelp_mon::metrics::TABLE,
        kelp_osd::metrics::TABLE,
        kelp_rgw::metrics::TABLE,
        kelp_nbd::metrics::TABLE,
        kelp_mgr::metrics::TABLE,
        // MDS metrics
        kelp_fs::metrics::TABLE,
    ]
}

/// The generated part of docs/METRICS.md.
pub fn metrics_reference() -> String {
    kelp_metrics::doc::markdown(&metric_tables())
}

pub fn run_metrics_doc() -> Result<ExitCode> {
    print!("{}", metrics_reference());
    Ok(ExitCode::SUCCESS)
}
