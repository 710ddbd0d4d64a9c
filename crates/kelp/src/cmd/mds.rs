//! `kelp mds`: metadata server daemons as the monitors see them (`stat`, `fail`).

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use kelp_client::{FsMap, MdsInfo, MdsState};
use serde_json::json;

use crate::cmd::OutputFormat;
use crate::cmd::common;

#[derive(Subcommand, Debug)]
pub enum MdsCommand {
    /// One line per cluster, as Ceph's `ceph mds stat`: each file system with its rank 0
    /// (`cephfs:1 {0=a=up:active}`), then the standbys (`1 up:standby`). -f json prints the
    /// file-system map.
    Stat(StatArgs),
    /// Fail an MDS as if its beacons had stopped: an active one is blocklisted (it can never
    /// write again) and a standby takes its role; a standby is dropped (it registers again
    /// with its next beacon).
    Fail(FailArgs),
    // The MDS daemon itself (`run`) goes below.
    /// Run a metadata server daemon: it beacons to the monitors, waits as a standby until
    /// given rank 0 of a file system, replays that file system's journal and serves its
    /// namespace, journaling every change before answering and checkpointing every few
    /// seconds. It exits when fenced or when its role goes to another MDS.
    Run(Box<crate::cmd::filesystem::MdsRunArgs>),
}

#[derive(Args, Debug)]
pub struct StatArgs {}

#[derive(Args, Debug)]
pub struct FailArgs {
    /// The MDS daemon's name.
    pub name: String,
}

/// Wall-clock time, unix ms.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn mds_json(m: &MdsInfo) -> serde_json::Value {
    json!({
        "name": m.name,
        "addr": m.addr.to_string(),
        "instance": m.instance,
        "incarnation": m.incarnation,
        "state": m.state.to_string(),
        "since_ms": m.since_ms,
        "fs": m.fs,
    })
}

/// Ceph's `mds stat` line: `cephfs:1 {0=a=up:active} 1 up:standby`; a file system without an
/// active MDS shows `cephfs:0/1`, one that is failed adds `(failed)`.
pub fn mds_summary(fsmap: &FsMap) -> String {
    let mut parts: Vec<String> = fsmap
        .filesystems
        .values()
        .map(|fs| match &fs.active {
            Some(a) => format!("{}:1 {{0={}={}}}", fs.name, a.name, a.state),
            None if fs.failed => format!("{}:0/1 (failed)", fs.name),
            None => format!("{}:0/1", fs.name),
        })
        .collect();
    let standbys = fsmap.standbys.len();
    if standbys > 0 || parts.is_empty() {
        parts.push(format!("{standbys} {}", MdsState::Standby));
    }
    parts.join(" ")
}

pub fn run(cmd: MdsCommand, g: &common::Global) -> Result<ExitCode> {
    let cmd = match cmd {
        MdsCommand::Run(a) => return crate::cmd::filesystem::run_mds(*a, g),
        c => c,
    };
    let rt = common::runtime()?;
    rt.block_on(async move {
        let rados = g.conf.connect().await?;
        match cmd {
            MdsCommand::Stat(_) => {
                let fsmap = rados.fs_map().await?;
                match g.format {
                    OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&fsmap)?),
                    OutputFormat::Plain => println!("e{}: {}", fsmap.epoch, mds_summary(&fsmap)),
                }
            }
            MdsCommand::Fail(a) => {
                rados.mds_fail(&a.name).await?;
                eprintln!("failed mds '{}'", a.name);
            }
            MdsCommand::Run(_) => anyhow::bail!("mds run runs on its own"),
        }
        Ok(ExitCode::SUCCESS)
    })
}
