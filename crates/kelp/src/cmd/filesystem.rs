//! `kelp fs mount|umount` (the FUSE client) and `kelp mds run` (the metadata server).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use kelp_fs::client::{ClientOptions, FsClient};
use kelp_fs::fuse::{KelpFuse, MountConfig};
use kelp_fs::mds::{Mds, MdsConfig};

use crate::cmd::common;

/// The metadata pool of a file system made by `kelp up`.
pub const DEFAULT_META_POOL: &str = "fs.meta";
/// The data pool of a file system made by `kelp up`.
pub const DEFAULT_DATA_POOL: &str = "fs.data";
/// The file system `kelp up` makes.
pub const DEFAULT_FS: &str = "kelpfs";

#[derive(Args, Debug)]
pub struct UmountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
}

#[derive(Args, Debug)]
pub struct MountArgs {
    /// Directory to mount on (must exist).
    pub mountpoint: PathBuf,
    /// The file system to mount.
    #[arg(long = "fs", default_value = DEFAULT_FS)]
    pub fs: String,
    /// Mount this directory of the file system as the root (e.g. `--subdir /projects/a`).
    #[arg(long, default_value = "/")]
    pub subdir: String,
    /// The metadata pool, when the file system is not in the monitors' file-system map
    /// (served by an MDS run with --meta-pool).
    #[arg(long, default_value = DEFAULT_META_POOL)]
    pub meta_pool: String,
    /// The data pool, when the file system is not in the file-system map.
    #[arg(long, default_value = DEFAULT_DATA_POOL)]
    pub data_pool: String,
    /// Seconds the kernel may cache attributes and directory entries, overriding the
    /// capabilities the metadata server grants (by default the kernel caches for as long as
    /// a capability is held, and drops its copy when another mount changes the file; 0: ask
    /// the metadata server every time).
    #[arg(long)]
    pub attr_timeout: Option<f64>,
    /// Talk to the metadata server at this address instead of the one the file system names.
    #[arg(long, hide = true)]
    pub mds_addr: Option<SocketAddr>,
}

#[derive(Args, Debug)]
pub struct MdsRunArgs {
    /// The daemon's name (`a` for mds.a).
    #[arg(long)]
    pub id: String,
    /// Serve only this file system when the monitors assign one (default: any).
    #[arg(long = "fs")]
    pub fs: Option<String>,
    /// Serve the file system in this metadata pool at once, on its own, without the
    /// monitors' file-system map (no standby takes over; clients find this MDS through the
    /// metadata pool).
    #[arg(long, requires = "data_pool")]
    pub meta_pool: Option<String>,
    /// The data pool of a --meta-pool file system (the MDS removes deleted files' data).
    #[arg(long, requires = "meta_pool")]
    pub data_pool: Option<String>,
    /// Address to serve clients on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: SocketAddr,
    /// Most inodes kept in memory: beyond it the least recently used inodes' capabilities
    /// are revoked from the clients and clean inodes are dropped.
    #[arg(long, default_value_t = 100_000)]
    pub cache_inodes: usize,
    /// Seconds between checkpoints (dirty metadata written back, journal trimmed).
    #[arg(long, default_value_t = 2.0)]
    pub checkpoint_interval: f64,
    /// Most journaled metadata updates not yet written back (a file create is about 5).
    /// When reached, changes wait while a checkpoint, started at once, writes them back:
    /// this bounds the memory they hold and the journal a restart or takeover replays.
    #[arg(long, default_value_t = kelp_fs::mds::DEFAULT_MAX_BACKLOG,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_backlog: usize,
    /// A directory fragment with more entries than this splits the directory into more
    /// fragments (Ceph's mds_bal_split_size).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub bal_split_size: u64,
    /// Bits a split adds: each fragment becomes 2^bits (Ceph's mds_bal_split_bits).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=24))]
    pub bal_split_bits: u8,
    /// A directory merges back one level when it holds fewer entries than this per fragment
    /// of that level (Ceph's mds_bal_merge_size; capped well below the split size).
    #[arg(long, default_value_t = 50)]
    pub bal_merge_size: u64,
    /// Directory where the daemon writes its pid file and `addr`.
    #[arg(long)]
    pub data: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: common::MetricsArgs,
}

/// `kelp fs umount`.
pub fn umount(a: UmountArgs) -> Result<ExitCode> {
    kelp_fs::fuse::unmount(&a.mountpoint)
        .with_context(|| format!("unmounting {}", a.mountpoint.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// `kelp fs mount`.
pub fn mount(a: MountArgs, g: &common::Global) -> Result<ExitCode> {
    common::init_logging("warn");
    let rt = common::runtime()?;
    let cfg = g.conf.client_config()?;
    let mut opts = ClientOptions::new(&a.meta_pool, &a.data_pool);
    opts.fs_name = Some(a.fs.clone());
    opts.mds_addr = a.mds_addr;
    let (client, root) = rt.block_on(async {
        let client = FsClient::connect(cfg, opts)
            .await
            .context("cannot reach the file system")?;
        let root = client
            .resolve(&a.subdir)
            .await
            .with_context(|| format!("--subdir {}", a.subdir))?;
        anyhow::Ok((client, root))
    })?;
    let mountpoint = a.mountpoint.clone();
    rt.spawn(async move {
        common::shutdown_signal().await;
        let _ = kelp_fs::fuse::unmount(&mountpoint);
    });
    let fs = KelpFuse::new(
        client,
        rt.handle().clone(),
        MountConfig {
            attr_ttl: a.attr_timeout.map(|t| Duration::from_secs_f64(t.max(0.0))),
            root,
            fs_name: format!("kelp:{}", a.fs),
        },
    );
    eprintln!("kelp fs: mounted {} on {}", a.fs, a.mountpoint.display());
    kelp_fs::fuse::mount(fs, &a.mountpoint)
        .with_context(|| format!("mounting on {}", a.mountpoint.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// `kelp mds run`.
pub fn run_mds(a: MdsRunArgs, g: &common::Global) -> Result<ExitCode> {
    common::init_logging("info");
    let rt = common::runtime()?;
    rt.block_on(async {
        let conf_path = g.conf.path();
        let conf = kelp_client::ClusterConf::load(&conf_path)
            .with_context(|| format!("reading {}", conf_path.display()))?;
        let keyring_path = g
            .conf
            .keyring
            .clone()
            .unwrap_or(conf.global.keyring.clone());
        let keys = kelp_msgr::Keyring::load(&keyring_path)
            .with_context(|| format!("keyring {}", keyring_path.display()))?;
        let rados = g.conf.connect().await?;
        let mut cfg = MdsConfig::new(
            &a.id,
            a.meta_pool.as_deref().unwrap_or_default(),
            a.data_pool.as_deref().unwrap_or_default(),
        );
        cfg.bind = a.bind;
        cfg.cache_inodes = a.cache_inodes;
        cfg.frag = kelp_fs::core::frag::FragConfig {
            split_size: usize::try_from(a.bal_split_size).unwrap_or(usize::MAX),
            split_bits: a.bal_split_bits,
            merge_size: usize::try_from(a.bal_merge_size).unwrap_or(usize::MAX),
        };
        cfg.checkpoint_interval = Duration::from_secs_f64(a.checkpoint_interval.max(0.05));
        cfg.max_backlog = a.max_backlog;
        let mds = Mds::bind(&a.id, a.bind, Arc::new(keys))
            .await
            .context("starting the metadata server")?;
        if let Some(dir) = &a.data {
            std::fs::create_dir_all(dir)?;
            common::write_pid_file(&dir.join("pid"))?;
            let tmp = dir.join("addr.tmp");
            std::fs::write(&tmp, format!("{}\n", mds.addr()))?;
            std::fs::rename(&tmp, dir.join("addr"))?;
        }
        // Like every daemon: process metrics at /metrics and a place in the service map.
        let daemon = format!("mds.{}", a.id);
        let mut addrs = std::collections::BTreeMap::new();
        addrs.insert("mds".to_string(), mds.addr().to_string());
        let mut msgrs = rados.messengers();
        msgrs.push(mds.messenger().clone());
        let _metrics = a
            .metrics
            .serve(
                &daemon,
                "mds",
                |reg| {
                    mds.register_metrics(reg);
                    common::register_msgr(reg, msgrs);
                },
                &mut addrs,
            )
            .await?;
        let _beacons = rados.spawn_service_beacons(daemon, "mds".into(), addrs);
        let standalone = a.meta_pool.is_some();
        let serve = async {
            if standalone {
                mds.activate(cfg, rados.clone()).await?;
                eprintln!("kelp mds: mds.{} serving on {}", a.id, mds.addr());
                Ok(format!("fenced: {}", mds.fenced().await))
            } else {
                eprintln!(
                    "kelp mds: mds.{} on {}, waiting for the monitors to give it a role",
                    a.id,
                    mds.addr()
                );
                kelp_fs::mds::run_in_fsmap(&mds, &rados, cfg, a.fs.clone()).await
            }
        };
        tokio::pin!(serve);
        tokio::select! {
            _ = common::shutdown_signal() => {
                // The daemon keeps beaconing while its last checkpoint writes back (the
                // monitors would otherwise fail it and fence it midway); fenced meanwhile,
                // it stops at once and the standby replays the journal.
                tokio::select! {
                    r = mds.shutdown() => r.context("final checkpoint")?,
                    r = &mut serve => {
                        let why: String = r.context("metadata server")?;
                        eprintln!("kelp mds: {why} while stopping; exiting");
                        return Ok(ExitCode::from(3));
                    }
                }
                eprintln!("kelp mds: stopped");
                Ok(ExitCode::SUCCESS)
            }
            r = &mut serve => {
                let why: String = r.context("metadata server")?;
                eprintln!("kelp mds: {why}; exiting");
                Ok(ExitCode::from(3))
            }
        }
    })
}
