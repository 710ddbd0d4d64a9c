//! `kelp pg scrub|deep-scrub|repair|list-inconsistent` and `kelp osd scrub|deep-scrub`.
//!
//! PG commands go to the PG's primary OSD, located from the client's OSD map exactly as object
//! ops are (no monitor in the path); OSD commands go to that OSD. A scrub request is queued on
//! the primary and the command returns at once, as in Ceph, unless `--wait` is given: then it
//! polls the primary until the request has completed and prints the outcome.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use kelp_client::Rados;
use kelp_proto::{
    InconsistentObject, OsdScrubCommand, PgCommandKind, PgCommandReply, PgScrubSummary,
};
use kelp_types::{OsdId, PgId};

use crate::cmd::OutputFormat;
use crate::cmd::common;

#[derive(Args, Debug)]
pub struct PgScrubArgs {
    /// The PG (`POOL.SEED_HEX`, e.g. `1.1a`).
    pub pgid: PgId,
    /// Wait until the scrub (or repair) has completed and print what it found; with
    /// `repair`, exit with status 1 if inconsistencies remain.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
}

#[derive(Args, Debug)]
pub struct ListInconsistentArgs {
    /// The PG (`POOL.SEED_HEX`).
    pub pgid: PgId,
}

#[derive(Args, Debug)]
pub struct OsdScrubArgs {
    /// OSD ids (`3` or `osd.3`).
    #[arg(required = true)]
    pub ids: Vec<OsdId>,
}

/// `kelp pg scrub|deep-scrub|repair PGID [--wait]`.
pub fn run_pg_scrub(
    a: PgScrubArgs,
    kind: PgCommandKind,
    g: &crate::cmd::common::Global,
) -> Result<ExitCode> {
    let verb = match kind {
        PgCommandKind::Scrub { deep: false } => "scrub",
        PgCommandKind::Scrub { deep: true } => "deep-scrub",
        PgCommandKind::Repair => "repair",
        _ => bail!("not a scrub request"),
    };
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
        let reply = rados.pg_command(a.pgid, kind).await?;
        println!("instructing pg {} on osd.{} to {verb}", a.pgid, reply.osd);
        if !a.wait {
            return Ok(ExitCode::SUCCESS);
        }
        let done = wait_for(&rados, a.pgid, reply.queued_seq, a.timeout_secs).await?;
        let s = &done.summary;
        if let Some(e) = &s.last_error {
            bail!("pg {}: the {verb} did not complete: {e}", a.pgid);
        }
        println!(
            "pg {} {verb} done: {} objects, {} inconsistent, {} scrub errors, {} repaired",
            a.pgid,
            s.objects_scrubbed,
            s.num_objects_inconsistent,
            s.num_scrub_errors,
            s.num_objects_repaired
        );
        if kind == PgCommandKind::Repair && s.num_objects_inconsistent > 0 {
            return Ok(ExitCode::FAILURE);
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Polls the primary until the request `seq` has completed.
async fn wait_for(rados: &Rados, pg: PgId, seq: u64, timeout_secs: u64) -> Result<PgCommandReply> {
    let deadline = Instant::now() + Duration::from_secs(timeout_secs);
    let mut asked = None;
    loop {
        let r = rados.pg_command(pg, PgCommandKind::Status).await?;
        // A new primary (the map changed) does not know the request: ask it again.
        if r.osd != asked.unwrap_or(r.osd) {
            bail!(
                "pg {pg}: the primary moved from osd.{} to osd.{} before the request completed",
                asked.unwrap_or(r.osd),
                r.osd
            );
        }
        asked = Some(r.osd);
        if r.summary.completed_seq >= seq && !r.summary.scrubbing {
            return Ok(r);
        }
        if Instant::now() >= deadline {
            bail!("pg {pg}: not done after {timeout_secs} s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kelp pg list-inconsistent PGID`.
pub fn run_list_inconsistent(
    a: ListInconsistentArgs,
    g: &crate::cmd::common::Global,
) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
        let r = rados
            .pg_command(a.pgid, PgCommandKind::ListInconsistent)
            .await?;
        match g.format {
            OutputFormat::Json => {
                let v = serde_json::json!({
                    "pgid": a.pgid.to_string(),
                    "primary": r.osd,
                    "epoch": r.epoch,
                    "summary": summary_json(&r.summary),
                    "inconsistents": r.inconsistent.iter().map(object_json).collect::<Vec<_>>(),
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
            OutputFormat::Plain => {
                if r.summary.last_scrub_stamp == 0 && r.summary.last_deep_scrub_stamp == 0 {
                    println!("pg {} has not been scrubbed", a.pgid);
                }
                for o in &r.inconsistent {
                    let errors: Vec<&str> = o.errors.iter().map(|e| e.name()).collect();
                    println!(
                        "{}{} version {} errors {} auth {}",
                        if o.namespace.is_empty() {
                            String::new()
                        } else {
                            format!("{}/", o.namespace)
                        },
                        o.name,
                        o.version,
                        errors.join(","),
                        o.auth_osd
                            .map_or("none (unrepairable)".to_string(), |x| format!("osd.{x}"))
                    );
                    for s in o.shards.iter().filter(|s| !s.errors.is_empty()) {
                        let e: Vec<&str> = s.errors.iter().map(|e| e.name()).collect();
                        let why = s
                            .object
                            .as_ref()
                            .and_then(|x| x.read_error.clone())
                            .map_or(String::new(), |r| format!(" ({r})"));
                        println!("    osd.{}: {}{why}", s.osd, e.join(","));
                    }
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn summary_json(s: &PgScrubSummary) -> serde_json::Value {
    serde_json::json!({
        "last_scrub_stamp": s.last_scrub_stamp,
        "last_deep_scrub_stamp": s.last_deep_scrub_stamp,
        "num_scrub_errors": s.num_scrub_errors,
        "num_objects_inconsistent": s.num_objects_inconsistent,
        "num_objects_unrepairable": s.num_objects_unrepairable,
        "num_objects_repaired": s.num_objects_repaired,
        "objects_scrubbed": s.objects_scrubbed,
        "state": s.state_words(),
        "last_error": s.last_error,
    })
}

/// One object in `rados list-inconsistent-obj`'s shape.
fn object_json(o: &InconsistentObject) -> serde_json::Value {
    serde_json::json!({
        "object": {"name": o.name, "nspace": o.namespace, "version": o.version},
        "errors": o.errors.iter().map(|e| e.name()).collect::<Vec<_>>(),
        "auth_osd": o.auth_osd,
        "bad_osds": o.bad_osds(),
        "shards": o.shards.iter().map(|s| serde_json::json!({
            "osd": s.osd,
            "primary": s.primary,
            "errors": s.errors.iter().map(|e| e.name()).collect::<Vec<_>>(),
            "size": s.object.as_ref().map(|x| x.size),
            "version": s.object.as_ref().map(|x| x.version),
            "data_digest": s.object.as_ref().and_then(|x| x.data_digest).map(|d| format!("0x{d:08x}")),
            "omap_digest": s.object.as_ref().map(|x| format!("0x{:08x}", x.omap_digest)),
            "read_error": s.object.as_ref().and_then(|x| x.read_error.clone()),
        })).collect::<Vec<_>>(),
    })
}

/// `kelp osd scrub|deep-scrub N…`: every PG each OSD is primary for.
pub fn run_osd_scrub(
    a: OsdScrubArgs,
    deep: bool,
    g: &crate::cmd::common::Global,
) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
        for id in &a.ids {
            let r = rados
                .osd_scrub_command(
                    id.0,
                    OsdScrubCommand::Scrub { deep },
                    Duration::from_secs(10),
                )
                .await?;
            println!(
                "osd.{} instructed to {} {} pgs",
                id.0,
                if deep { "deep-scrub" } else { "scrub" },
                r.pgs.len()
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Scrub summaries of every PG, asked from every up OSD (each answers for the PGs it is
/// primary for). OSDs that do not answer within `timeout` are left out.
pub async fn scrub_summaries(rados: &Rados, timeout: Duration) -> BTreeMap<PgId, PgScrubSummary> {
    let map = rados.osd_map();
    let asks = map.osds.values().filter(|o| o.up).map(|o| {
        let rados = rados.clone();
        let id = o.id;
        async move {
            rados
                .osd_scrub_command(id, OsdScrubCommand::Summaries, timeout)
                .await
        }
    });
    let mut out = BTreeMap::new();
    for r in futures::future::join_all(asks).await.into_iter().flatten() {
        out.extend(r.pgs);
    }
    out
}
