//! `kelp pg ls` and `kelp crush rule ls|dump`: placement as the cluster map has it.

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use kelp_crush::Step;

use crate::cmd::OutputFormat;
use crate::cmd::common::{self, ConfArgs};

#[derive(Args, Debug)]
pub struct PgLsArgs {
    /// Only this pool's PGs.
    #[arg(long)]
    pub pool: Option<String>,
    #[command(flatten)]
    pub conf: ConfArgs,
    #[arg(long, value_enum, default_value = "plain")]
    pub format: OutputFormat,
}

#[derive(Subcommand, Debug)]
pub enum PgCommand {
    /// Every PG with its state (derived from the map, plus the primaries' scrub state) and
    /// up/acting sets.
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
pub struct RuleArgs {
    #[command(flatten)]
    pub conf: ConfArgs,
    #[arg(long, value_enum, default_value = "plain")]
    pub format: OutputFormat,
}

pub fn run_pg(cmd: PgCommand) -> Result<ExitCode> {
    use crate::cmd::scrub;
    use kelp_proto::PgCommandKind;
    let a = match cmd {
        PgCommand::Ls(a) => a,
        PgCommand::Scrub(a) => return scrub::run_pg_scrub(a, PgCommandKind::Scrub { deep: false }),
        PgCommand::DeepScrub(a) => {
            return scrub::run_pg_scrub(a, PgCommandKind::Scrub { deep: true });
        }
        PgCommand::Repair(a) => return scrub::run_pg_scrub(a, PgCommandKind::Repair),
        PgCommand::ListInconsistent(a) => return scrub::run_list_inconsistent(a),
    };
    let rt = common::runtime()?;
    let (map, scrubs) = rt.block_on(async {
        let rados = a.conf.connect().await?;
        let scrubs = scrub::scrub_summaries(&rados, std::time::Duration::from_secs(2)).await;
        Ok::<_, anyhow::Error>((rados.osd_map(), scrubs))
    })?;
    let mut rows = Vec::new();
    for pool in map.pools.values() {
        if a.pool.as_deref().is_some_and(|p| p != pool.name) {
            continue;
        }
        for pg in map.pool_pgs(pool.id)? {
            let m = map.pg_mapping(pg)?;
            let n = m.acting.len() as u32;
            let state = if n >= pool.size {
                "active+clean"
            } else if n >= pool.min_size {
                "active+undersized+degraded"
            } else {
                "undersized+degraded+peered"
            };
            let mut state = state.to_string();
            for w in scrubs.get(&pg).map(|s| s.state_words()).unwrap_or_default() {
                state.push('+');
                state.push_str(w);
            }
            rows.push((pg, state, m));
        }
    }
    if let Some(p) = &a.pool
        && map.pool_by_name(p).is_none()
    {
        bail!("pool '{p}' does not exist");
    }
    match a.format {
        OutputFormat::Json => {
            let v: Vec<_> = rows
                .iter()
                .map(|(pg, state, m)| {
                    serde_json::json!({"pgid": pg.to_string(), "state": state, "up": m.up,
                        "up_primary": m.up_primary, "acting": m.acting, "acting_primary": m.acting_primary})
                })
                .collect();
            println!("{}", serde_json::json!({"epoch": map.epoch, "pg_stats": v}));
        }
        OutputFormat::Plain => {
            println!("{:<8} {:<28} {:<14} ACTING", "PG", "STATE", "UP");
            for (pg, state, m) in rows {
                println!(
                    "{:<8} {:<28} {:<14} {:?}p{}",
                    pg.to_string(),
                    state,
                    format!("{:?}p{}", m.up, m.up_primary),
                    m.acting,
                    m.acting_primary
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_rule(cmd: RuleCommand) -> Result<ExitCode> {
    let (a, dump) = match cmd {
        RuleCommand::Ls(a) => (a, false),
        RuleCommand::Dump(a) => (a, true),
    };
    let rt = common::runtime()?;
    let map = rt.block_on(async { Ok::<_, anyhow::Error>(a.conf.connect().await?.osd_map()) })?;
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
    match a.format {
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
