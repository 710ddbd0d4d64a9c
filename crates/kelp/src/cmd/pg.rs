//! `kelp pg ls` and `kelp crush rule ls|dump`: placement as the cluster map has it.

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use kelp_crush::Step;
use kelp_proto::{MonCommand, MonReply};

use crate::cmd::OutputFormat;
use crate::cmd::common;

#[derive(Args, Debug)]
pub struct PgLsArgs {
    /// Only this pool's PGs.
    #[arg(long)]
    pub pool: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum PgCommand {
    /// Every PG with its state, objects and bytes as its primary last reported them (through
    /// the leader monitor), and its up/acting sets.
    Ls(PgLsArgs),
    /// Queue a scrub of the PG on its primary: object sets, sizes, versions, attributes and
    /// omaps compared across the acting set. Runs even with the `noscrub` flag set.
    Scrub(crate::cmd::scrub::PgScrubArgs),
    /// Queue a deep scrub: a scrub that also reads every byte on every member (checksums
    /// verified) and compares data digests.
    DeepScrub(crate::cmd::scrub::PgScrubArgs),
    /// Deep-scrub the PG and copy the authoritative version of every inconsistent object to
    /// the members whose copy is bad, then verify.
    Repair(crate::cmd::scrub::PgScrubArgs),
    /// The inconsistent objects the PG's last scrub found: per object the errors, the
    /// authoritative copy and the bad ones (like `rados list-inconsistent-obj`).
    ListInconsistent(crate::cmd::scrub::ListInconsistentArgs),
}

#[derive(Subcommand, Debug)]
pub enum RuleCommand {
    /// Rule names.
    Ls(RuleArgs),
    /// Rules with their steps (JSON with --format json).
    Dump(RuleArgs),
}

#[derive(Args, Debug)]
pub struct RuleArgs {}

pub fn run_pg(cmd: PgCommand, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    use crate::cmd::scrub;
    use kelp_proto::PgCommandKind;
    let a = match cmd {
        PgCommand::Ls(a) => a,
        PgCommand::Scrub(a) => {
            return scrub::run_pg_scrub(a, PgCommandKind::Scrub { deep: false }, g);
        }
        PgCommand::DeepScrub(a) => {
            return scrub::run_pg_scrub(a, PgCommandKind::Scrub { deep: true }, g);
        }
        PgCommand::Repair(a) => return scrub::run_pg_scrub(a, PgCommandKind::Repair, g),
        PgCommand::ListInconsistent(a) => return scrub::run_list_inconsistent(a, g),
    };
    let rt = common::runtime()?;
    let (map, digest, scrubs) = rt.block_on(async {
        let rados = g.conf.connect().await?;
        let digest = match rados.mon_command(MonCommand::PgStats).await? {
            MonReply::PgStats(d) => *d,
            other => bail!("unexpected reply from the monitors: {other:?}"),
        };
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            rados.wait_for_epoch(digest.epoch),
        )
        .await;
        // scrub states come from the primaries themselves (one request per up OSD)
        let scrubs = scrub::scrub_summaries(&rados, std::time::Duration::from_secs(2)).await;
        Ok::<_, anyhow::Error>((rados.osd_map(), digest, scrubs))
    })?;
    let pool_id = match &a.pool {
        Some(p) => match map.pool_by_name(p) {
            Some(pool) => Some(pool.id),
            None => bail!("pool '{p}' does not exist"),
        },
        None => None,
    };
    let rows: Vec<_> = digest
        .pgs
        .iter()
        .filter(|p| pool_id.is_none_or(|id| p.stat.pg.pool.0 == id))
        .map(|p| {
            let m = map.pg_mapping(p.stat.pg).ok();
            (p, m)
        })
        .collect();
    let state_of = |p: &kelp_proto::PgSummary| {
        kelp_health::pg_state_with_scrub(&p.state_name, scrubs.get(&p.stat.pg))
    };
    match g.format {
        OutputFormat::Json => {
            let v: Vec<_> = rows
                .iter()
                .map(|(p, m)| {
                    let st = &p.stat;
                    serde_json::json!({"pgid": st.pg.to_string(), "state": state_of(p),
                        "num_objects": st.num_objects, "num_bytes": st.num_bytes,
                        "num_objects_degraded": st.num_objects_degraded,
                        "num_objects_misplaced": st.num_objects_misplaced,
                        "num_objects_unfound": st.num_objects_unfound,
                        "last_update": format!("{}'{}", st.last_update.0, st.last_update.1),
                        "reported_epoch": st.reported_epoch,
                        "scrub": st.scrub.as_ref().map(|s| serde_json::json!({
                            "last_scrub_stamp_ns": s.last_scrub_stamp_ns,
                            "last_deep_scrub_stamp_ns": s.last_deep_scrub_stamp_ns,
                            "num_inconsistent": s.num_inconsistent})),
                        "up": m.as_ref().map(|m| m.up_shards().to_vec()), "up_primary": m.as_ref().map(|m| m.up_primary),
                        "acting": m.as_ref().map(|m| m.acting_shards().to_vec()), "acting_primary": m.as_ref().map(|m| m.acting_primary)})
                })
                .collect();
            println!("{}", serde_json::json!({"epoch": map.epoch, "pg_stats": v}));
        }
        OutputFormat::Plain => {
            println!(
                "{:<8} {:>8} {:>8} {:>9} {:>10} {:<30} {:<14} ACTING",
                "PG", "OBJECTS", "DEGRADED", "MISPLACED", "BYTES", "STATE", "UP"
            );
            for (p, m) in rows {
                let st = &p.stat;
                let (up, acting) = match &m {
                    Some(m) => (
                        format!("{}p{}", osd_set(m.up_shards()), m.up_primary),
                        format!("{}p{}", osd_set(m.acting_shards()), m.acting_primary),
                    ),
                    None => ("-".into(), "-".into()),
                };
                println!(
                    "{:<8} {:>8} {:>8} {:>9} {:>10} {:<30} {:<14} {}",
                    st.pg.to_string(),
                    st.num_objects,
                    st.num_objects_degraded,
                    st.num_objects_misplaced,
                    st.num_bytes,
                    state_of(p),
                    up,
                    acting
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `[0, 1, 2]`; an erasure-coded pool's hole (a shard position with no OSD) prints as `NONE`,
/// as Ceph prints it.
fn osd_set(osds: &[i32]) -> String {
    let items: Vec<String> = osds
        .iter()
        .map(|&o| {
            if o == kelp_maps::ITEM_NONE {
                "NONE".to_string()
            } else {
                o.to_string()
            }
        })
        .collect();
    format!("[{}]", items.join(", "))
}

pub fn run_rule(cmd: RuleCommand, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let (_a, dump) = match cmd {
        RuleCommand::Ls(a) => (a, false),
        RuleCommand::Dump(a) => (a, true),
    };
    let rt = common::runtime()?;
    let map = rt.block_on(async { Ok::<_, anyhow::Error>(g.conf.connect().await?.osd_map()) })?;
    let crush = &map.crush;
    if !dump {
        for r in crush.rules() {
            println!("{}", r.name);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let rules: Vec<serde_json::Value> = crush
        .rules()
        .map(|r| {
            let steps: Vec<serde_json::Value> = r
                .steps
                .iter()
                .map(|s| match *s {
                    Step::Take(item) => serde_json::json!({"op": "take", "item": item,
                        "item_name": crush.item_name(item)}),
                    Step::Choose { leaf, indep, num, type_id } => serde_json::json!({
                        "op": format!("{}_{}", if leaf { "chooseleaf" } else { "choose" }, if indep { "indep" } else { "firstn" }),
                        "num": num, "type": crush.type_name(type_id)}),
                    Step::Emit => serde_json::json!({"op": "emit"}),
                    other => serde_json::json!({"op": format!("{other:?}")}),
                })
                .collect();
            serde_json::json!({"rule_id": r.id, "rule_name": r.name,
                "type": if r.rule_type == kelp_crush::RULE_TYPE_ERASURE { 3 } else { 1 }, "steps": steps})
        })
        .collect();
    match g.format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&rules)?),
        OutputFormat::Plain => {
            // Ceph's text form of the rules is the most readable dump.
            let text = crush.to_text();
            if let Some(i) = text.find("# rules") {
                print!("{}", &text[i..]);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
