//! `kelp osd`: run an OSD daemon (`run`), look after OSDs (`tree`, `ls`, `out`, `in`,
//! `down`) and set cluster flags (`set`, `unset`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use kelp_maps::OsdMap;
use kelp_proto::{MonCommand, MonReply};
use kelp_store::StoreConfig;

use crate::cmd::OutputFormat;
use crate::cmd::common::{self, ConfArgs};

#[derive(Subcommand, Debug)]
pub enum OsdCommand {
    /// Run OSD N from its store directory until SIGTERM/SIGINT. The store must exist
    /// (`kelp store mkfs DIR`); its id becomes the OSD's uuid, registered with the monitors
    /// on first start. Logs go to stderr (filter with RUST_LOG, default info).
    Run(RunArgs),
    /// The CRUSH hierarchy with each OSD's state (like `ceph osd tree`).
    Tree(ShowArgs),
    /// OSD ids with state and address.
    Ls(ShowArgs),
    /// Mark OSDs out: CRUSH stops placing data on them.
    Out(IdsArgs),
    /// Mark OSDs in again.
    In(IdsArgs),
    /// Mark OSDs down (a running OSD reports itself up again).
    Down(IdsArgs),
    /// Set a cluster flag (like `ceph osd set`): noout, noin, noup, nodown, norecover,
    /// nobackfill, norebalance, noscrub, nodeep-scrub, pause. See docs/HEALING.md.
    Set(FlagArgs),
    /// Clear a cluster flag (like `ceph osd unset`).
    Unset(FlagArgs),
}

#[derive(Args, Debug)]
pub struct FlagArgs {
    /// The flag: noout (down OSDs are not marked out), noin (booting OSDs are not marked
    /// in), noup (booting OSDs are not marked up), nodown (failure reports and lost sessions
    /// do not mark OSDs down), norecover / nobackfill (OSDs pause log recovery / backfill),
    /// norebalance, noscrub, nodeep-scrub, pause (clients hold reads and writes).
    pub flag: String,
    #[command(flatten)]
    pub conf: ConfArgs,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// OSD id.
    #[arg(long)]
    pub id: i32,
    /// Store directory.
    #[arg(long)]
    pub data: PathBuf,
    #[command(flatten)]
    pub conf: ConfArgs,
    /// Address to serve on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub addr: SocketAddr,
    /// CRUSH host bucket for this OSD (default: the machine's host name).
    #[arg(long)]
    pub host: Option<String>,
    /// CRUSH weight (conventionally the device size in TiB).
    #[arg(long, default_value_t = 1.0)]
    pub weight: f32,
    /// Store cache budget.
    #[arg(long, default_value = "256MiB")]
    pub cache: kelp_types::ByteSize,
    /// Write the daemon's pid to this file.
    #[arg(long)]
    pub pid_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    pub conf: ConfArgs,
    #[arg(long, value_enum, default_value = "plain")]
    pub format: OutputFormat,
}

#[derive(Args, Debug)]
pub struct IdsArgs {
    /// OSD ids (`3` or `osd.3`).
    #[arg(required = true)]
    pub ids: Vec<kelp_types::OsdId>,
    #[command(flatten)]
    pub conf: ConfArgs,
}

pub fn run(cmd: OsdCommand) -> Result<ExitCode> {
    match cmd {
        OsdCommand::Run(a) => run_daemon(a),
        OsdCommand::Tree(a) => show(a, true),
        OsdCommand::Ls(a) => show(a, false),
        OsdCommand::Out(a) => mark(a, |id| MonCommand::OsdOut { id }),
        OsdCommand::In(a) => mark(a, |id| MonCommand::OsdIn { id }),
        OsdCommand::Down(a) => mark(a, |id| MonCommand::OsdDown { id }),
        OsdCommand::Set(a) => set_flag(a, true),
        OsdCommand::Unset(a) => set_flag(a, false),
    }
}

fn set_flag(a: FlagArgs, on: bool) -> Result<ExitCode> {
    if kelp_maps::ClusterFlag::from_name(&a.flag).is_none() {
        let known: Vec<&str> = kelp_maps::ClusterFlag::ALL
            .iter()
            .map(|f| f.name())
            .collect();
        bail!("unknown flag '{}' (known: {})", a.flag, known.join(", "));
    }
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = a.conf.connect().await?;
        let reply = rados
            .mon_command(MonCommand::SetFlag {
                flag: a.flag.clone(),
                on,
            })
            .await?;
        match reply {
            MonReply::Done { epoch } => {
                let what = if on { "set" } else { "unset" };
                eprintln!("{} is {what} (osdmap epoch {epoch})", a.flag);
                Ok(ExitCode::SUCCESS)
            }
            other => bail!("unexpected reply {other:?}"),
        }
    })
}

fn run_daemon(a: RunArgs) -> Result<ExitCode> {
    common::init_logging("info");
    let conf_path = a.conf.path();
    let conf = kelp_client::ClusterConf::load(&conf_path)?;
    let keyring = kelp_msgr::Keyring::load(&conf.global.keyring)
        .with_context(|| format!("keyring {}", conf.global.keyring.display()))?;
    let weight = kelp_crush::weight_from_f32(a.weight)
        .with_context(|| format!("--weight {} is not a valid CRUSH weight", a.weight))?;
    let host = match a.host {
        Some(h) => h,
        None => hostname(),
    };
    if let Some(p) = &a.pid_file {
        common::write_pid_file(p)?;
    }
    let store = StoreConfig {
        cache_budget: a.cache,
        ..StoreConfig::default()
    };
    let opts = kelp_osd::daemon::DaemonOptions {
        id: a.id,
        data: a.data,
        mons: conf.global.mon_host,
        keyring,
        bind: a.addr,
        host,
        crush_weight: weight,
        store,
        osd: kelp_osd::OsdConfig::new(a.id),
    };
    let rt = common::runtime()?;
    let result = rt.block_on(kelp_osd::daemon::run(opts, common::shutdown_signal()));
    if let Some(p) = &a.pid_file {
        let _ = std::fs::remove_file(p);
    }
    result.with_context(|| format!("osd.{}", a.id))?;
    Ok(ExitCode::SUCCESS)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty() && !s.contains(char::is_whitespace))
        .unwrap_or_else(|| "localhost".to_string())
}

fn mark(a: IdsArgs, cmd: impl Fn(i32) -> MonCommand) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = a.conf.connect().await?;
        for id in &a.ids {
            let reply = rados.mon_command(cmd(id.0)).await?;
            match reply {
                MonReply::Done { epoch } => eprintln!("{id}: done (osdmap epoch {epoch})"),
                other => bail!("{id}: unexpected reply {other:?}"),
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn show(a: ShowArgs, tree: bool) -> Result<ExitCode> {
    let rt = common::runtime()?;
    let map = rt.block_on(async { Ok::<_, anyhow::Error>(a.conf.connect().await?.osd_map()) })?;
    match (a.format, tree) {
        (OutputFormat::Json, _) => println!("{}", serde_json::to_string_pretty(&osds_json(&map))?),
        (OutputFormat::Plain, true) => print!("{}", tree_text(&map)),
        (OutputFormat::Plain, false) => {
            for o in map.osds.values() {
                println!(
                    "osd.{}\t{}\t{}\t{}",
                    o.id,
                    if o.up { "up" } else { "down" },
                    if o.is_in() { "in" } else { "out" },
                    o.addr.map_or("-".to_string(), |a| a.to_string())
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn osds_json(map: &OsdMap) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = map
        .osds
        .values()
        .map(|o| {
            serde_json::json!({
                "id": o.id,
                "name": format!("osd.{}", o.id),
                "host": o.host,
                "status": if o.up { "up" } else { "down" },
                "in": o.is_in(),
                "reweight": o.weight as f64 / 65536.0,
                "crush_weight": map.crush.item_weight(o.id).map_or(0.0, |w| w as f64 / 65536.0),
                "addr": o.addr.map(|a| a.to_string()),
            })
        })
        .collect();
    serde_json::json!({ "epoch": map.epoch, "osds": nodes })
}

/// `ceph osd tree`-shaped text.
fn tree_text(map: &OsdMap) -> String {
    let mut out = format!(
        "{:>4}  {:>8}  {:<24}  {:>6}  {:>8}\n",
        "ID", "WEIGHT", "TYPE NAME", "STATUS", "REWEIGHT"
    );
    let crush = &map.crush;
    let roots: Vec<i32> = crush
        .buckets()
        .filter(|b| crush.parents_of(b.id).is_empty())
        .map(|b| b.id)
        .collect();
    fn walk(map: &OsdMap, id: i32, depth: usize, out: &mut String) {
        let crush = &map.crush;
        let indent = "    ".repeat(depth);
        if id >= 0 {
            let w = crush.item_weight(id).unwrap_or(0) as f64 / 65536.0;
            let (status, reweight) = match map.osds.get(&id) {
                Some(o) => (if o.up { "up" } else { "down" }, o.weight as f64 / 65536.0),
                None => ("dne", 0.0),
            };
            out.push_str(&format!(
                "{:>4}  {:>8.5}  {:<24}  {:>6}  {:>8.5}\n",
                id,
                w,
                format!("{indent}osd.{id}"),
                status,
                reweight
            ));
            return;
        }
        let Some(b) = crush.bucket(id) else { return };
        let tname = crush.type_name(b.type_id).unwrap_or("?");
        out.push_str(&format!(
            "{:>4}  {:>8.5}  {:<24}\n",
            id,
            b.weight as f64 / 65536.0,
            format!("{indent}{tname} {}", b.name)
        ));
        for &item in &b.items {
            walk(map, item, depth + 1, out);
        }
    }
    for r in roots {
        walk(map, r, 0, &mut out);
    }
    out
}
