//! `kelp fs mount|umount` (the FUSE client) and `kelp mds run` (the metadata server).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
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

#[derive(Subcommand, Debug)]
pub enum FsMountCommand {
    /// Mount a file system with FUSE and serve it until it is unmounted (`kelp fs umount`)
    /// or this process gets SIGINT/SIGTERM; run it in the background with `&` (or a service
    /// manager). File data goes straight between this client and the OSDs.
    Mount(MountArgs),
    /// Unmount a file system mounted with `kelp fs mount` (lazily if it is busy).
    Umount {
        /// The mount point.
        mountpoint: PathBuf,
    },
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
    /// The file system's metadata pool.
    #[arg(long, default_value = DEFAULT_META_POOL)]
    pub meta_pool: String,
    /// The file system's data pool.
    #[arg(long, default_value = DEFAULT_DATA_POOL)]
    pub data_pool: String,
    /// Seconds the kernel may cache attributes and directory entries (0: ask the metadata
    /// server every time, so changes made on other mounts are seen at once).
    #[arg(long, default_value_t = 0.0)]
    pub attr_timeout: f64,
    /// Talk to the metadata server at this address instead of the one the file system names.
    #[arg(long, hide = true)]
    pub mds_addr: Option<SocketAddr>,
}

#[derive(Subcommand, Debug)]
pub enum MdsRunCommand {
    /// Run a metadata server daemon: it serves the file system's namespace from its metadata
    /// pool, journals every change there before answering, and checkpoints every few seconds.
    Run(MdsRunArgs),
}

#[derive(Args, Debug)]
pub struct MdsRunArgs {
    /// The daemon's name (`a` for mds.a).
    #[arg(long)]
    pub id: String,
    /// The file system's metadata pool.
    #[arg(long, default_value = DEFAULT_META_POOL)]
    pub meta_pool: String,
    /// The file system's data pool (the MDS removes the data of deleted files).
    #[arg(long, default_value = DEFAULT_DATA_POOL)]
    pub data_pool: String,
    /// Address to serve clients on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: SocketAddr,
    /// Most inodes kept in memory.
    #[arg(long, default_value_t = 100_000)]
    pub cache_inodes: usize,
    /// Seconds between checkpoints (dirty metadata written back, journal trimmed).
    #[arg(long, default_value_t = 2.0)]
    pub checkpoint_interval: f64,
    /// Directory where the daemon writes its pid file and `addr`.
    #[arg(long)]
    pub data: Option<PathBuf>,
}

pub fn run_fs(c: FsMountCommand, g: &common::Global) -> Result<ExitCode> {
    match c {
        FsMountCommand::Mount(a) => mount(a, g),
        FsMountCommand::Umount { mountpoint } => {
            kelp_fs::fuse::unmount(&mountpoint)
                .with_context(|| format!("unmounting {}", mountpoint.display()))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn mount(a: MountArgs, g: &common::Global) -> Result<ExitCode> {
    common::init_logging("warn");
    let rt = common::runtime()?;
    let cfg = g.conf.client_config()?;
    let mut opts = ClientOptions::new(&a.meta_pool, &a.data_pool);
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
            attr_ttl: Duration::from_secs_f64(a.attr_timeout.max(0.0)),
            root,
            fs_name: format!("kelp:{}", a.fs),
        },
    );
    eprintln!("kelp fs: mounted {} on {}", a.fs, a.mountpoint.display());
    kelp_fs::fuse::mount(fs, &a.mountpoint)
        .with_context(|| format!("mounting on {}", a.mountpoint.display()))?;
    Ok(ExitCode::SUCCESS)
}

pub fn run_mds(c: MdsRunCommand, g: &common::Global) -> Result<ExitCode> {
    let MdsRunCommand::Run(a) = c;
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
        let mut cfg = MdsConfig::new(&a.id, &a.meta_pool, &a.data_pool);
        cfg.bind = a.bind;
        cfg.cache_inodes = a.cache_inodes;
        cfg.checkpoint_interval = Duration::from_secs_f64(a.checkpoint_interval.max(0.05));
        let mds = Mds::start(cfg, rados, Arc::new(keys))
            .await
            .context("starting the metadata server")?;
        if let Some(dir) = &a.data {
            std::fs::create_dir_all(dir)?;
            common::write_pid_file(&dir.join("pid"))?;
            let tmp = dir.join("addr.tmp");
            std::fs::write(&tmp, format!("{}\n", mds.addr()))?;
            std::fs::rename(&tmp, dir.join("addr"))?;
        }
        eprintln!("kelp mds: mds.{} serving on {}", a.id, mds.addr());
        tokio::select! {
            _ = common::shutdown_signal() => {
                mds.shutdown().await.context("final checkpoint")?;
                eprintln!("kelp mds: stopped");
                Ok(ExitCode::SUCCESS)
            }
            reason = mds.fenced() => {
                eprintln!("kelp mds: fenced ({reason}); exiting");
                Ok(ExitCode::from(3))
            }
        }
    })
}
