//! `kelp osd erasure-code-profile`: named erasure-code profiles (Ceph's `ceph osd
//! erasure-code-profile set|get|ls|rm`), kept by the monitors in the OSD map. A pool created
//! with `kelp pool create NAME --erasure PROFILE` takes a copy of the profile, so changing or
//! removing a profile later never changes an existing pool.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::cmd::OutputFormat;
use crate::cmd::common;

#[derive(Subcommand, Debug)]
pub enum EcProfileCommand {
    /// Create an erasure-code profile from KEY=VALUE settings (like `ceph osd
    /// erasure-code-profile set`).
    ///
    /// Keys: k (data shards, default 2), m (parity shards: how many
    /// may be lost, default 2), crush-failure-domain (CRUSH type each shard goes to a different
    /// one of: host (default), osd, rack...), crush-root (default `default`),
    /// crush-device-class (only OSDs of this class), stripe_unit (bytes of a stripe per shard,
    /// default 4K); plugin=jerasure|isa and technique=reed_sol_van are accepted for Ceph's
    /// profiles. Setting an existing profile to the same settings does nothing; to different
    /// ones needs --force (pools already made from it keep their own copy).
    Set(SetArgs),
    /// Print a profile: one KEY=VALUE line per setting (a JSON object with -f json).
    Get(NameArgs),
    /// List profile names (a JSON array with -f json).
    ///
    /// New clusters have `default` (k=2 m=2, one shard per host, as Ceph).
    Ls(LsArgs),
    /// Remove a profile. Refused while a pool created from it exists.
    Rm(NameArgs),
}

#[derive(Args, Debug)]
pub struct SetArgs {
    /// The profile's name.
    pub name: String,
    /// Settings, e.g. `k=4 m=2 crush-failure-domain=host`; keys left out take their defaults.
    #[arg(value_name = "KEY=VALUE")]
    pub settings: Vec<String>,
    /// Replace an existing profile of this name that has different settings.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct NameArgs {
    /// The profile's name.
    pub name: String,
}

#[derive(Args, Debug)]
pub struct LsArgs {}

pub fn run(cmd: EcProfileCommand, g: &common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async move {
        let rados = g.conf.connect().await?;
        match cmd {
            EcProfileCommand::Set(a) => {
                rados.ec_profile_set(&a.name, &a.settings, a.force).await?;
                eprintln!("erasure-code profile '{}' set", a.name);
            }
            EcProfileCommand::Get(a) => {
                let pairs = rados.ec_profile_get(&a.name).await?;
                match g.format {
                    OutputFormat::Json => {
                        let obj: serde_json::Map<String, serde_json::Value> = pairs
                            .into_iter()
                            .map(|(k, v)| (k, serde_json::Value::String(v)))
                            .collect();
                        println!("{}", serde_json::to_string_pretty(&obj)?);
                    }
                    OutputFormat::Plain => {
                        for (k, v) in pairs {
                            println!("{k}={v}");
                        }
                    }
                }
            }
            EcProfileCommand::Ls(_) => {
                let names = rados.ec_profile_ls().await?;
                match g.format {
                    OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&names)?),
                    OutputFormat::Plain => {
                        for n in names {
                            println!("{n}");
                        }
                    }
                }
            }
            EcProfileCommand::Rm(a) => {
                rados.ec_profile_rm(&a.name).await?;
                eprintln!("erasure-code profile '{}' removed", a.name);
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
