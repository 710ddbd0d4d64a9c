//! `kelp fs`: file systems in the monitors' file-system map, with Ceph's command shape
//! (`ceph fs new|ls|status|rm|set|fail|add_data_pool|rm_data_pool`). The metadata servers
//! that serve them are `kelp mds` daemons; which one is active is in the same map.

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use kelp_client::{FsInfo, FsMap, Rados};
use kelp_maps::OsdMap;
use serde_json::json;

use crate::cmd::OutputFormat;
use crate::cmd::common;
use crate::cmd::mds::{mds_json, unix_ms};

#[derive(Subcommand, Debug)]
pub enum FsCommand {
    /// Create a file system on two existing pools: METADATA_POOL (replicated: the namespace is
    /// kept in omap, which erasure-coded pools lack; a fast device class pays off most here)
    /// and DATA_POOL, the default pool of file data. A standby MDS takes it at once.
    New(NewArgs),
    /// List file systems with their pools (a JSON array with -f json).
    Ls(ListArgs),
    /// Show file systems: the MDS holding rank 0 (state, incarnation, address, since when),
    /// the pools and the standby daemons.
    Status(StatusArgs),
    /// Remove a file system from the map (its pools and their objects stay). Refused while an
    /// MDS is active: `kelp fs fail NAME` first. Needs --yes-i-really-mean-it.
    Rm(RmArgs),
    /// Change a setting: max_mds (only 1 is supported), standby_count_wanted (health warns
    /// with fewer standbys; default 1), joinable (false: no MDS may take the file system;
    /// true undoes `kelp fs fail`).
    Set(SetArgs),
    /// Take a file system down: its active MDS is blocklisted and removed, and no MDS takes
    /// it until `kelp fs set NAME joinable true`.
    Fail(NameArgs),
    /// Add a data pool (files are placed there by layout; erasure-coded pools are fine here).
    #[command(name = "add_data_pool")]
    AddDataPool(PoolArgs),
    /// Remove a data pool other than the default one.
    #[command(name = "rm_data_pool")]
    RmDataPool(PoolArgs),
    // Client side of the file system (`mount`, `umount`) goes below.
    /// Mount a file system with FUSE and serve it until it is unmounted (`kelp fs umount`)
    /// or this process gets SIGINT/SIGTERM; run it in the background with `&` (or a service
    /// manager). File data goes straight between this client and the OSDs; the active MDS is
    /// found in the file-system map, and followed across failovers without remounting.
    Mount(crate::cmd::filesystem::MountArgs),
    /// Unmount a file system mounted with `kelp fs mount` (lazily if it is busy).
    Umount(crate::cmd::filesystem::UmountArgs),
}

#[derive(Args, Debug)]
pub struct NewArgs {
    /// The file system's name.
    pub name: String,
    /// The metadata pool (replicated).
    pub metadata_pool: String,
    /// The default data pool.
    pub data_pool: String,
    /// Accept an erasure-coded default data pool (better: a replicated default pool plus
    /// `kelp fs add_data_pool` for erasure-coded ones).
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Only this file system.
    pub name: Option<String>,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// The file system's name.
    pub name: String,
    /// Confirms the removal (the pools stay, but the file system is no longer served).
    #[arg(long)]
    pub yes_i_really_mean_it: bool,
}

#[derive(Args, Debug)]
pub struct SetArgs {
    /// The file system's name.
    pub name: String,
    /// max_mds, standby_count_wanted or joinable.
    pub key: String,
    /// The new value (a number; true/false for joinable).
    pub value: String,
}

#[derive(Args, Debug)]
pub struct NameArgs {
    /// The file system's name.
    pub name: String,
}

#[derive(Args, Debug)]
pub struct PoolArgs {
    /// The file system's name.
    pub name: String,
    /// The pool.
    pub pool: String,
}

fn pool_name(map: &OsdMap, id: u32) -> String {
    map.pools
        .get(&id)
        .map_or_else(|| format!("<pool {id}>"), |p| p.name.clone())
}

fn fs_json(fs: &FsInfo, map: &OsdMap) -> serde_json::Value {
    json!({
        "name": fs.name,
        "id": fs.id,
        "metadata_pool": pool_name(map, fs.metadata_pool),
        "metadata_pool_id": fs.metadata_pool,
        "data_pools": fs.data_pools.iter().map(|&p| pool_name(map, p)).collect::<Vec<_>>(),
        "data_pool_ids": fs.data_pools,
        "max_mds": fs.max_mds,
        "standby_count_wanted": fs.standby_count_wanted,
        "joinable": !fs.failed,
        "last_incarnation": fs.last_incarnation,
        "active": fs.active.as_ref().map(mds_json),
    })
}

fn print_status(fsmap: &FsMap, map: &OsdMap, only: Option<&str>) -> Result<()> {
    let now = unix_ms();
    let mut any = false;
    for fs in fsmap.filesystems.values() {
        if only.is_some_and(|n| n != fs.name) {
            continue;
        }
        any = true;
        let flag = if fs.failed {
            " (failed, not joinable)"
        } else {
            ""
        };
        println!("{} - fs id {}{flag}", fs.name, fs.id);
        println!(
            "{:<5} {:<8} {:<16} {:<12} {:<22} {:>8}",
            "RANK", "STATE", "MDS", "INCARNATION", "ADDR", "SINCE"
        );
        match &fs.active {
            Some(a) => println!(
                "{:<5} {:<8} {:<16} {:<12} {:<22} {:>8}",
                0,
                a.state.name(),
                a.name,
                a.incarnation,
                a.addr.to_string(),
                format!("{}s", now.saturating_sub(a.since_ms) / 1000)
            ),
            None => println!("{:<5} {:<8}", 0, "failed"),
        }
        println!("{:<24} {:<9} {:>4}", "POOL", "TYPE", "ID");
        println!(
            "{:<24} {:<9} {:>4}",
            pool_name(map, fs.metadata_pool),
            "metadata",
            fs.metadata_pool
        );
        for &p in &fs.data_pools {
            println!("{:<24} {:<9} {:>4}", pool_name(map, p), "data", p);
        }
        println!();
    }
    if let Some(n) = only.filter(|_| !any) {
        bail!("file system '{n}' does not exist");
    }
    if !any {
        println!("no file systems (create one with `kelp fs new NAME METADATA_POOL DATA_POOL`)");
    }
    println!("STANDBY MDS");
    for s in fsmap.standbys.values() {
        let wants =
            s.fs.as_deref()
                .map(|f| format!(" (for {f})"))
                .unwrap_or_default();
        println!("{} {}{wants}", s.name, s.addr);
    }
    Ok(())
}

async fn run_async(cmd: FsCommand, g: &common::Global, rados: Rados) -> Result<()> {
    match cmd {
        FsCommand::Mount(_) | FsCommand::Umount(_) => bail!("mount and umount run on their own"),
        FsCommand::New(a) => {
            rados
                .fs_new_with(&a.name, &a.metadata_pool, &a.data_pool, a.force)
                .await?;
            eprintln!(
                "new fs '{}' with metadata pool '{}' and data pool '{}'",
                a.name, a.metadata_pool, a.data_pool
            );
        }
        FsCommand::Ls(_) => {
            let fsmap = rados.fs_map().await?;
            let map = rados.osd_map();
            match g.format {
                OutputFormat::Json => {
                    let v: Vec<_> = fsmap
                        .filesystems
                        .values()
                        .map(|f| fs_json(f, &map))
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                }
                OutputFormat::Plain => {
                    if fsmap.filesystems.is_empty() {
                        println!("No filesystems enabled");
                    }
                    for f in fsmap.filesystems.values() {
                        let data: Vec<String> =
                            f.data_pools.iter().map(|&p| pool_name(&map, p)).collect();
                        println!(
                            "name: {}, metadata pool: {}, data pools: [{} ]",
                            f.name,
                            pool_name(&map, f.metadata_pool),
                            data.join(" ")
                        );
                    }
                }
            }
        }
        FsCommand::Status(a) => {
            let fsmap = rados.fs_map().await?;
            let map = rados.osd_map();
            match g.format {
                OutputFormat::Json => {
                    if let Some(n) = &a.name
                        && !fsmap.filesystems.contains_key(n)
                    {
                        bail!("file system '{n}' does not exist");
                    }
                    let v = json!({
                        "epoch": fsmap.epoch,
                        "filesystems": fsmap
                            .filesystems
                            .values()
                            .filter(|f| a.name.as_ref().is_none_or(|n| *n == f.name))
                            .map(|f| fs_json(f, &map))
                            .collect::<Vec<_>>(),
                        "standbys": fsmap.standbys.values().map(mds_json).collect::<Vec<_>>(),
                    });
                    println!("{}", serde_json::to_string_pretty(&v)?);
                }
                OutputFormat::Plain => print_status(&fsmap, &map, a.name.as_deref())?,
            }
        }
        FsCommand::Rm(a) => {
            // --yes-i-really-mean-it is checked in `run`, before connecting.
            rados.fs_rm(&a.name).await?;
            eprintln!("file system '{}' removed", a.name);
        }
        FsCommand::Set(a) => {
            rados.fs_set(&a.name, &a.key, &a.value).await?;
            eprintln!("set {} {} = {}", a.name, a.key, a.value);
        }
        FsCommand::Fail(a) => {
            rados.fs_fail(&a.name).await?;
            eprintln!("{} marked not joinable; its MDS failed", a.name);
        }
        FsCommand::AddDataPool(a) => {
            rados.fs_add_data_pool(&a.name, &a.pool).await?;
            eprintln!("added data pool '{}' to fs '{}'", a.pool, a.name);
        }
        FsCommand::RmDataPool(a) => {
            rados.fs_rm_data_pool(&a.name, &a.pool).await?;
            eprintln!("removed data pool '{}' from fs '{}'", a.pool, a.name);
        }
    }
    Ok(())
}

pub fn run(cmd: FsCommand, g: &common::Global) -> Result<ExitCode> {
    // the client side runs without a monitor command
    let cmd = match cmd {
        FsCommand::Mount(a) => return crate::cmd::filesystem::mount(a, g),
        FsCommand::Umount(a) => return crate::cmd::filesystem::umount(a),
        c => c,
    };
    if let FsCommand::Rm(a) = &cmd
        && !a.yes_i_really_mean_it
    {
        bail!(
            "removing file system '{}' takes it out of service; pass --yes-i-really-mean-it",
            a.name
        );
    }
    let rt = common::runtime()?;
    rt.block_on(async move {
        let rados = g.conf.connect().await?;
        run_async(cmd, g, rados).await?;
        Ok(ExitCode::SUCCESS)
    })
}
