//! `kelp pool`: create, list, inspect, change and delete pools.

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use kelp_maps::{Pool, PoolSpec};
use kelp_proto::{MonCommand, MonReply};

use crate::cmd::OutputFormat;
use crate::cmd::common;

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Create a replicated pool.
    Create(CreateArgs),
    /// List pools.
    Ls(ListArgs),
    /// Delete a pool and every object in it. Needs --yes-i-really-mean-it.
    Rm(RmArgs),
    /// Show a pool's settings (all, or one KEY).
    Get(GetArgs),
    /// Change a pool setting: size, min_size or crush_rule.
    Set(SetArgs),
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The new pool's name.
    pub name: String,
    /// Number of placement groups (default 32).
    #[arg(long)]
    pub pg_num: Option<u32>,
    /// Replicas to keep (default 3).
    #[arg(long)]
    pub size: Option<u32>,
    /// Fewest replicas that still serve I/O (default size - size/2).
    #[arg(long)]
    pub min_size: Option<u32>,
    /// CRUSH rule name or id (default replicated_rule).
    #[arg(long)]
    pub rule: Option<String>,
}

#[derive(Args, Debug)]
pub struct ListArgs {}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// The pool to delete.
    pub name: String,
    /// Confirms that every object of the pool is to be deleted.
    #[arg(long)]
    pub yes_i_really_mean_it: bool,
}

#[derive(Args, Debug)]
pub struct GetArgs {
    /// The pool.
    pub name: String,
    /// One of: size, min_size, pg_num, pgp_num, crush_rule, id (default: all).
    pub key: Option<String>,
}

#[derive(Args, Debug)]
pub struct SetArgs {
    /// The pool.
    pub name: String,
    /// size, min_size or crush_rule.
    pub key: String,
    /// The new value (a number; for crush_rule the rule's name or id).
    pub value: String,
}

fn pool_json(p: &Pool) -> serde_json::Value {
    serde_json::json!({
        "id": p.id, "name": p.name, "type": "replicated", "size": p.size, "min_size": p.min_size,
        "pg_num": p.pg_num, "pgp_num": p.pgp_num, "crush_rule": p.crush_rule,
        "flags": if p.hashpspool { vec!["hashpspool"] } else { vec![] },
    })
}

pub fn run(cmd: PoolCommand, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async move {
        match cmd {
            PoolCommand::Create(a) => {
                let rados = g.conf.connect().await?;
                let spec = PoolSpec {
                    name: a.name.clone(),
                    pg_num: a.pg_num,
                    size: a.size,
                    min_size: a.min_size,
                    crush_rule: a.rule,
                    erasure: None,
                };
                let id = rados.create_pool(spec).await?;
                eprintln!("pool '{}' created (id {id})", a.name);
            }
            PoolCommand::Ls(_) => {
                let map = g.conf.connect().await?.osd_map();
                match g.format {
                    OutputFormat::Json => {
                        let v: Vec<_> = map.pools.values().map(pool_json).collect();
                        println!("{}", serde_json::to_string_pretty(&v)?);
                    }
                    OutputFormat::Plain => {
                        for p in map.pools.values() {
                            println!("{}", p.name);
                        }
                    }
                }
            }
            PoolCommand::Rm(a) => {
                if !a.yes_i_really_mean_it {
                    bail!(
                        "deleting pool '{}' destroys all its objects; pass --yes-i-really-mean-it",
                        a.name
                    );
                }
                let rados = g.conf.connect().await?;
                rados.delete_pool(&a.name).await?;
                eprintln!("pool '{}' deleted", a.name);
            }
            PoolCommand::Get(a) => {
                let map = g.conf.connect().await?.osd_map();
                let Some(p) = map.pool_by_name(&a.name) else {
                    bail!("pool '{}' does not exist", a.name);
                };
                let all = pool_json(p);
                match &a.key {
                    Some(k) => match all.get(k.as_str()) {
                        Some(v) if g.format == OutputFormat::Json => {
                            println!("{}", serde_json::json!({ k.as_str(): v }))
                        }
                        Some(v) => println!("{k}: {v}"),
                        None => bail!("unknown pool setting '{k}'"),
                    },
                    None if g.format == OutputFormat::Json => {
                        println!("{}", serde_json::to_string_pretty(&all)?)
                    }
                    None => {
                        if let Some(obj) = all.as_object() {
                            for (k, v) in obj {
                                println!("{k}: {v}");
                            }
                        }
                    }
                }
            }
            PoolCommand::Set(a) => {
                let rados = g.conf.connect().await?;
                let reply = rados
                    .mon_command(MonCommand::PoolSet {
                        name: a.name.clone(),
                        key: a.key.clone(),
                        value: a.value.clone(),
                    })
                    .await?;
                match reply {
                    MonReply::Done { epoch } => {
                        eprintln!(
                            "set pool '{}' {} = {} (osdmap epoch {epoch})",
                            a.name, a.key, a.value
                        )
                    }
                    other => bail!("unexpected reply {other:?}"),
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
