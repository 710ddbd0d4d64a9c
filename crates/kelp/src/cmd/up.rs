//! `kelp up`, `kelp down`, `kelp daemon`: a whole local cluster in one directory.
//!
//! Layout of DIR (default `./kelp-data`):
//!   kelp.conf            cluster configuration (monitors, keyring path)
//!   keyring              secrets of client.admin, every mon.X and osd.N (mode 0600)
//!   mon.X/               monitor data        osd.N/   OSD store
//!   logs/NAME.log        each daemon's log   run/NAME.pid   each running daemon's pid
//!
//! Every daemon is its own process (`kelp mon run --id a …`, `kelp osd run --id 2 …`) in its
//! own process group, so Ctrl-C in the terminal reaches only `kelp up`, which then stops the
//! daemons in order (OSDs first, so they can report themselves down). A daemon that dies is
//! logged and left down, like a failed disk, until `kelp daemon start NAME` brings it back.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use kelp_maps::PoolSpec;
use kelp_msgr::{Keyring, generate_secret};

use crate::cmd::common;

const DEFAULT_POOL: &str = "data";

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Cluster directory (created if missing, reopened if it holds a cluster; default:
    /// --cluster, else ./kelp-data).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// OSDs to create (only when creating the cluster).
    #[arg(long, default_value_t = 3)]
    pub osds: u32,
    /// Monitors to create (1, 3 or 5; only when creating the cluster).
    #[arg(long, default_value_t = 1)]
    pub mons: u32,
    /// Size of each OSD's data file (only when creating the cluster). Default: from the free
    /// space of the file system holding DIR — 80 % of what is left after the daemons' own
    /// files, shared by the OSDs, at most 16 GiB each and at least 256 MiB (`kelp up` says
    /// what it chose). The files grow as data arrives, so a large size costs no disk up front.
    #[arg(long)]
    pub osd_size: Option<kelp_types::ByteSize>,
    #[command(flatten)]
    pub files: OsdFileArgs,
    /// Placement groups of the default pool.
    #[arg(long, default_value_t = 64)]
    pub pg_num: u32,
    /// Start the daemons in the background and return once the cluster is healthy;
    /// stop it with `kelp down`.
    #[arg(long)]
    pub detach: bool,
    /// How long to wait for the cluster to become healthy.
    #[arg(long, default_value_t = 120)]
    pub timeout_secs: u64,
    /// Port of the S3 gateway (`kelp rgw`) on 127.0.0.1; a free port is picked if it is
    /// taken. Chosen once, when the gateway is first set up.
    #[arg(long, default_value_t = 7480)]
    pub rgw_port: u16,
    /// Do not run an S3 gateway.
    #[arg(long)]
    pub no_rgw: bool,
    /// Port of the NBD server (`kelp nbd`, exporting the block images) on 127.0.0.1; a free
    /// port is picked if it is taken. Chosen once, when the server is first set up.
    #[arg(long, default_value_t = crate::cmd::nbd::DEFAULT_PORT)]
    pub nbd_port: u16,
    /// Do not run an NBD server.
    #[arg(long)]
    pub no_nbd: bool,
    /// Erasure-code the S3 gateway's object data, K data + M parity shards per object (e.g.
    /// `4+2`: any 2 OSDs may fail, 1.5× raw space instead of 3×). Makes the profile
    /// `kelp-K-M` (crush-failure-domain=osd: this is one host, so each shard goes to another
    /// OSD), creates at least K+M OSDs (more --osds are kept; fewer are raised to K+M, and
    /// `kelp up` says so) and the data pool `kelp.rgw.data` erasure-coded from it, while the
    /// bucket index, users and the default pool stay replicated. Applies when the data pool is
    /// created: refused if it already exists replicated. See docs/ERASURE-CODING.md.
    #[arg(long, value_name = "K+M", value_parser = parse_ec_spec)]
    pub ec: Option<EcSpec>,
    // Manager and dashboard.
    /// Port of the web dashboard of the active manager (`kelp mgr`, mgr.x) on 127.0.0.1; a
    /// free port is picked if it is taken. A cluster with several monitors also runs a
    /// standby manager, mgr.y, on another port. Chosen once, when the managers are set up.
    #[arg(long, default_value_t = 8443)]
    pub dashboard_port: u16,
    /// Do not run managers (no dashboard, no progress items).
    #[arg(long)]
    pub no_mgr: bool,
    // File system.
    /// Do not set up a file system. By default `kelp up` makes the pools `fs.meta`
    /// (metadata, replicated) and `fs.data`, the file system `kelpfs` on them, and runs two
    /// metadata servers, mds.a and mds.b (one active, one standby that takes over if it
    /// dies); mount it with `kelp fs mount /mnt/kelp`.
    #[arg(long)]
    pub no_fs: bool,
}

/// `kelp up --ec K+M`: an erasure code of `k` data and `m` parity shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EcSpec {
    pub k: u32,
    pub m: u32,
}

impl EcSpec {
    /// Shards per object: the OSDs the pool needs (one shard per OSD).
    pub fn size(&self) -> u32 {
        self.k + self.m
    }

    /// The profile `kelp up` makes for it.
    pub fn profile_name(&self) -> String {
        format!("kelp-{}-{}", self.k, self.m)
    }

    /// The profile's `key=value` words (`kelp osd erasure-code-profile set`).
    fn profile_words(&self) -> Vec<String> {
        vec![
            format!("k={}", self.k),
            format!("m={}", self.m),
            // One host: shards spread over OSDs.
            "crush-failure-domain=osd".to_string(),
        ]
    }
}

impl std::fmt::Display for EcSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.k, self.m)
    }
}

/// Parses `--ec K+M` (`4+2`), refusing what is not a usable erasure code with the reason.
fn parse_ec_spec(text: &str) -> Result<EcSpec> {
    let Some((k, m)) = text.split_once('+') else {
        bail!(
            "'{text}' is not K+M: give data and parity shards per object, such as 4+2 (4 data \
             shards, 2 parity shards: any 2 OSDs may fail)"
        );
    };
    let number = |what: &str, v: &str| -> Result<u32> {
        v.trim()
            .parse::<u32>()
            .map_err(|_| anyhow::anyhow!("{what} '{v}' is not a whole number (K+M, such as 4+2)"))
    };
    let (k, m) = (number("K", k)?, number("M", m)?);
    if k == 0 {
        bail!("K (data shards per object) must be at least 1, as in 2+1 or 4+2");
    }
    if m == 0 {
        bail!(
            "M (parity shards per object) must be at least 1: with no parity a lost \
             OSD loses data (use a replicated pool instead)"
        );
    }
    let spec = EcSpec { k, m };
    kelp_ec::Profile::from_words(&spec.profile_words())?;
    Ok(spec)
}

/// The gateway's directory in a cluster directory (holds its port, address and pid).
const RGW_DIR: &str = "rgw.gw";
/// The NBD server's directory in a cluster directory (its port, address and pid).
const NBD_DIR: &str = "nbd.0";
/// The managers' directories: `mgr.x` (and `mgr.y` with several monitors).
const MGR_PREFIX: &str = "mgr.";
/// The metadata servers' directories: `mds.a` (first active) and `mds.b` (standby).
const MDS_PREFIX: &str = "mds.";
/// The metadata servers `kelp up` runs.
const MDS_NAMES: [&str; 2] = ["mds.a", "mds.b"];
/// The dashboard user `kelp up` creates (role admin); its key is in `DIR/dashboard.key`.
const DASHBOARD_ADMIN: &str = "admin";
/// The S3 user `kelp up` creates.
const DEFAULT_S3_USER: &str = "kelp";

/// Sets up the gateway of the cluster in `dir` (its port) unless it exists.
fn create_rgw(dir: &Path, port: u16) -> Result<()> {
    create_service_dir(dir, RGW_DIR, port, "the S3 gateway")
}

/// Sets up a service's directory `name` in `dir` with the port it will listen on (`port`, or a
/// free one if that is taken), unless it exists.
fn create_service_dir(dir: &Path, name: &str, port: u16, what: &str) -> Result<()> {
    let gw = dir.join(name);
    if gw.join("port").exists() {
        return Ok(());
    }
    std::fs::create_dir_all(&gw)?;
    let port = if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
        port
    } else {
        let p = free_port()?;
        eprintln!("port {port} is taken; {what} will use port {p}");
        p
    };
    std::fs::write(gw.join("port"), format!("{port}\n"))?;
    Ok(())
}

#[derive(Args, Debug)]
pub struct DownArgs {
    /// Cluster directory (default: --cluster, else ./kelp-data).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum DaemonCommand {
    /// Start one daemon (`mon.a`, `osd.2`) of the cluster in DIR, in the background.
    Start(DaemonArgs),
    /// Stop one daemon (SIGTERM, then SIGKILL after 20 s).
    Stop(DaemonArgs),
    /// Stop, then start one daemon.
    Restart(DaemonArgs),
    /// Add an OSD to the cluster in DIR: a key (from the monitors, appended to DIR/keyring),
    /// a store of --osd-size, and the daemon, started in the background. CRUSH then moves a
    /// share of the data onto it.
    AddOsd(AddOsdArgs),
    /// Remove an OSD from the cluster in DIR for good: wait until every PG is active+clean,
    /// stop it, purge it from the map and the monitors' keys, delete its store. Refused
    /// unless it was marked out (`kelp osd out N`) and no PG maps to it any more; --force
    /// skips the checks and the wait.
    RemoveOsd(RemoveOsdArgs),
    // --- service map (metrics) ---
    /// List every daemon of the cluster from the monitors' service map (any cluster, not
    /// only `kelp up`'s): name, kind, status (up, or stale when its beacon is late) and the
    /// URL of its Prometheus metrics. `-f json` for scripts and Prometheus file_sd
    /// (docs/METRICS.md).
    Ls(crate::cmd::service_map::DaemonLsArgs),
}

#[derive(Args, Debug)]
pub struct AddOsdArgs {
    /// Cluster directory (default: --cluster, else ./kelp-data).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Size of the new OSD's data file. Default: the size of osd.0's if the file system has
    /// room for it, else as `kelp up` chooses from the free space (at most 16 GiB); the file
    /// grows as data arrives.
    #[arg(long)]
    pub osd_size: Option<kelp_types::ByteSize>,
    #[command(flatten)]
    pub files: OsdFileArgs,
}

/// How new OSD data files are laid out on disk.
#[derive(Args, Debug, Clone, Copy)]
pub struct OsdFileArgs {
    /// Write each new OSD's whole data file with zeros when it is created (`kelp store mkfs
    /// --prewrite`): one sequential write of N × --osd-size before the cluster starts, and N ×
    /// --osd-size of disk at once. For benchmarks that must not include the files' growth.
    /// By default the files start sparse and are written with zeros in steps ahead of the
    /// data (`kelp store mkfs --grow`), which gives writes the same speed once written.
    #[arg(long, conflicts_with = "no_prewrite")]
    pub prewrite: bool,
    /// Only reserve each new OSD's data file (fallocate) instead of growing it: every commit
    /// that writes new data then costs a file-system journal commit and a second flush
    /// (large writes 1.5-2.5× slower; docs/STORE.md). For comparisons only.
    #[arg(long)]
    pub no_prewrite: bool,
}

impl OsdFileArgs {
    fn mkfs_flag(&self) -> Option<&'static str> {
        if self.prewrite {
            Some("--prewrite")
        } else if self.no_prewrite {
            None
        } else {
            Some("--grow")
        }
    }
}

/// Most and least `kelp up` gives an OSD when it sizes the data files itself.
const AUTO_OSD_MAX: u64 = 16 << 30;
const AUTO_OSD_MIN: u64 = 256 << 20;
/// Disk each OSD needs besides its data file (write-ahead log 64 MiB, metadata, log file), and
/// the cluster besides its OSDs (monitors, gateway, logs).
const PER_OSD_OVERHEAD: u64 = 192 << 20;
const CLUSTER_OVERHEAD: u64 = 256 << 20;

/// Bytes free for an unprivileged writer on the file system holding `dir`.
fn free_space(dir: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .context("the cluster directory's path holds a NUL byte")?;
    // SAFETY: statvfs writes into the struct we pass; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("reading the free space of {}", dir.display()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// The size `kelp up` gives each of `osds` new OSDs when `--osd-size` is not given, from
/// `free` bytes: 80 % of what is left after the daemons' own files, shared, rounded down to
/// 64 MiB, at most [`AUTO_OSD_MAX`]; an error when that is under [`AUTO_OSD_MIN`].
fn auto_osd_size(free: u64, osds: u64, overhead: u64) -> Result<u64> {
    let osds = osds.max(1);
    let left = free.saturating_sub(overhead + osds * PER_OSD_OVERHEAD) / 10 * 8;
    let each = (left / osds / (64 << 20) * (64 << 20)).min(AUTO_OSD_MAX);
    if each < AUTO_OSD_MIN {
        let needed = overhead + osds * (PER_OSD_OVERHEAD + AUTO_OSD_MIN * 10 / 8);
        bail!(
            "only {} free: {osds} OSD(s) need about {} (data files of at least {} each); free \
             some space, use another --dir, or choose --osd-size yourself",
            kelp_types::ByteSize(free / (1 << 20) * (1 << 20)),
            kelp_types::ByteSize(needed.div_ceil(64 << 20) * (64 << 20)),
            kelp_types::ByteSize(AUTO_OSD_MIN)
        );
    }
    Ok(each)
}

/// The data-file size for `osds` new OSDs in `dir`: `--osd-size` if given (checked against the
/// free space where the files are written up front), else [`auto_osd_size`]. Says what it chose.
fn choose_osd_size(
    dir: &Path,
    osds: u64,
    given: Option<kelp_types::ByteSize>,
    files: OsdFileArgs,
    overhead: u64,
) -> Result<kelp_types::ByteSize> {
    use kelp_types::ByteSize;
    let free = free_space(dir)?;
    let how = if files.prewrite {
        "written with zeros now"
    } else if files.no_prewrite {
        "reserved now"
    } else {
        "growing as data arrives"
    };
    let Some(size) = given else {
        let each = auto_osd_size(free, osds, overhead)?;
        let why = if each == AUTO_OSD_MAX {
            "the most `kelp up` chooses".to_string()
        } else {
            format!(
                "sized to the {} free",
                ByteSize(free / (1 << 20) * (1 << 20))
            )
        };
        eprintln!(
            "OSD data files: {osds} × {} ({why}; {how}; --osd-size to choose)",
            ByteSize(each)
        );
        return Ok(ByteSize(each));
    };
    let total = size.0.saturating_mul(osds);
    if (files.prewrite || files.no_prewrite) && total + osds * PER_OSD_OVERHEAD > free {
        bail!(
            "{osds} OSD data file(s) of {size} need {} now but only {} is free in {}",
            ByteSize(total),
            ByteSize(free / (1 << 20) * (1 << 20)),
            dir.display()
        );
    }
    if total > free {
        eprintln!(
            "warning: {osds} OSD data file(s) of {size} can grow to {} but only {} is free: \
             the OSDs report themselves full when the file system fills up",
            ByteSize(total),
            ByteSize(free / (1 << 20) * (1 << 20))
        );
    }
    eprintln!("OSD data files: {osds} × {size} ({how})");
    Ok(size)
}

#[derive(Args, Debug)]
pub struct RemoveOsdArgs {
    /// OSD id (`3` or `osd.3`).
    pub id: kelp_types::OsdId,
    /// Cluster directory (default: --cluster, else ./kelp-data).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Remove it even if it is in or PGs still map to it (whatever only it holds is lost).
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// `mon.NAME`, `osd.N` or `rgw.gw`.
    pub name: String,
    /// Cluster directory (default: --cluster, else ./kelp-data).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// One daemon of the cluster.
#[derive(Debug, Clone)]
struct Daemon {
    name: String,
    args: Vec<String>,
}

/// The directory of an existing cluster: `dir`, else --cluster, else ./kelp-data.
fn existing_dir(g: &common::Global, dir: Option<&Path>) -> Result<PathBuf> {
    let d = g.conf.cluster_dir(dir);
    d.canonicalize()
        .with_context(|| format!("{} does not exist (no cluster there)", d.display()))
}

fn abs(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    dir.canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

fn kelp_exe() -> Result<PathBuf> {
    std::env::current_exe().context("locating the kelp binary")
}

fn run_quiet(args: &[String]) -> Result<()> {
    let out = Command::new(kelp_exe()?)
        .args(args)
        .output()
        .with_context(|| format!("running kelp {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "kelp {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Creates a new cluster's files (keys, config, monitor and OSD data). No daemon runs yet.
fn create(dir: &Path, a: &UpArgs) -> Result<()> {
    if !matches!(a.mons, 1 | 3 | 5) {
        bail!("--mons must be 1, 3 or 5");
    }
    if a.osds == 0 {
        bail!("--osds must be at least 1");
    }
    // Chosen first: a file system too small for any cluster is refused before anything is
    // written.
    let osd_size = choose_osd_size(dir, a.osds as u64, a.osd_size, a.files, CLUSTER_OVERHEAD)?;
    let fsid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().to_string())
        .context("generating a cluster id")?;
    let names: Vec<String> = (0..a.mons)
        .map(|i| ((b'a' + i as u8) as char).to_string())
        .collect();
    let mut mons: Vec<(String, SocketAddr)> = Vec::new();
    for n in &names {
        mons.push((n.clone(), SocketAddr::from(([127, 0, 0, 1], free_port()?))));
    }
    let mut keyring = Keyring::new();
    keyring.insert("client.admin", generate_secret())?;
    for n in &names {
        keyring.insert(&format!("mon.{n}"), generate_secret())?;
    }
    for i in 0..a.osds {
        keyring.insert(&format!("osd.{i}"), generate_secret())?;
    }
    keyring.save(dir.join("keyring"))?;
    let conf = kelp_config::ClusterConf {
        global: kelp_config::GlobalSection {
            fsid: fsid.clone(),
            mon_host: mons.iter().map(|(_, a)| *a).collect(),
            keyring: PathBuf::from("keyring"),
        },
        // The OSDs share one machine: half the store's default memory budget each (no
        // measured cost in `kelp rados bench`; docs/benchmarks/rados.md, 2026-11-25 16:58-18:41 UTC).
        osd: kelp_config::OsdSection {
            cache: Some(UP_OSD_CACHE.to_string()),
            threads: None,
        },
    };
    let text = toml::to_string(&conf).context("writing kelp.conf")?;
    std::fs::write(
        dir.join("kelp.conf"),
        format!("# Kelp cluster configuration, written by `kelp up`.\n{text}"),
    )?;
    // One host: spread replicas over OSDs.
    let domain = "osd";
    for (n, _) in &mons {
        let mut args = vec![
            "mon".to_string(),
            "mkfs".into(),
            "--id".into(),
            n.clone(),
            "--data".into(),
            dir.join(format!("mon.{n}")).display().to_string(),
            "--fsid".into(),
            fsid.clone(),
            "--keyring".into(),
            dir.join("keyring").display().to_string(),
            "--failure-domain".into(),
            domain.into(),
        ];
        for (m, addr) in &mons {
            args.push("--mon".into());
            args.push(format!("{m}={addr}"));
        }
        run_quiet(&args)?;
    }
    if a.files.prewrite {
        eprintln!(
            "writing {} OSD data files of {osd_size} with zeros (once, at creation)…",
            a.osds
        );
    }
    // The OSDs' stores are made in parallel: with --prewrite, writing their files is most of
    // a new cluster's set-up time, and the device takes several streams at once.
    let files = a.files;
    std::thread::scope(|s| {
        let made: Vec<_> = (0..a.osds)
            .map(|i| {
                let d = dir.join(format!("osd.{i}"));
                s.spawn(move || mkfs_osd(&d, osd_size, files))
            })
            .collect();
        made.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("creating an OSD's store panicked"))?
        })
    })
}

/// Removes what a failed [`create`] wrote into `dir` (and nothing else that may be there), so
/// that the next `kelp up` creates the cluster afresh instead of reopening half of one.
fn remove_partial_cluster(dir: &Path) {
    let _ = std::fs::remove_file(dir.join("kelp.conf"));
    let _ = std::fs::remove_file(dir.join("keyring"));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("mon.") || name.starts_with("osd.") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Makes an OSD's store in `dir` (`kelp store mkfs`).
fn mkfs_osd(dir: &Path, size: kelp_types::ByteSize, files: OsdFileArgs) -> Result<()> {
    let mut args = vec![
        "store".to_string(),
        "mkfs".into(),
        dir.display().to_string(),
        "--size".into(),
        size.0.to_string(),
    ];
    args.extend(files.mkfs_flag().map(String::from));
    run_quiet(&args)
}

/// The store memory budget `kelp up` writes into a new cluster's `kelp.conf` (`[osd] cache`).
/// 96 MiB since 2026-11-25 (128 before): OSD RSS after the RADOS benchmark 149-155 instead of
/// 163-169 MiB, 4 KiB random reads of a bigger working set up to a quarter slower
/// (docs/benchmarks/memory.md).
const UP_OSD_CACHE: &str = "96MiB";

/// Async worker threads for each of `osds` OSDs sharing this machine.
fn osd_threads(osds: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus / osds.max(1)).max(1)
}

/// The daemons of the cluster in `dir`, monitors first.
fn daemons(dir: &Path) -> Result<Vec<Daemon>> {
    let conf = dir.join("kelp.conf").display().to_string();
    let mut mons = Vec::new();
    let mut osds = Vec::new();
    let mut rgws = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().to_string();
        if let Some(m) = name.strip_prefix("mon.") {
            mons.push(Daemon {
                name: name.clone(),
                args: vec![
                    "mon".into(),
                    "run".into(),
                    "--id".into(),
                    m.to_string(),
                    "--data".into(),
                    dir.join(&name).display().to_string(),
                ],
            });
        } else if name == RGW_DIR {
            let port = std::fs::read_to_string(dir.join(&name).join("port"))
                .with_context(|| format!("reading {}/{name}/port", dir.display()))?;
            rgws.push(Daemon {
                name: name.clone(),
                args: vec![
                    "rgw".into(),
                    "-c".into(),
                    conf.clone(),
                    "--port".into(),
                    port.trim().to_string(),
                    "--data".into(),
                    dir.join(&name).display().to_string(),
                ],
            });
        } else if let Some(id) = name.strip_prefix(MGR_PREFIX) {
            let port = std::fs::read_to_string(dir.join(&name).join("port"))
                .with_context(|| format!("reading {}/{name}/port", dir.display()))?;
            rgws.push(Daemon {
                name: name.clone(),
                args: vec![
                    "mgr".into(),
                    "run".into(),
                    "--id".into(),
                    id.to_string(),
                    "-c".into(),
                    conf.clone(),
                    "--any-port-if-taken".into(),
                    "--dashboard-addr".into(),
                    format!("127.0.0.1:{}", port.trim()),
                    "--data".into(),
                    dir.join(&name).display().to_string(),
                ],
            });
        } else if let Some(id) = name.strip_prefix(MDS_PREFIX) {
            rgws.push(Daemon {
                name: name.clone(),
                args: vec![
                    "mds".into(),
                    "run".into(),
                    "--id".into(),
                    id.to_string(),
                    "-c".into(),
                    conf.clone(),
                    "--data".into(),
                    dir.join(&name).display().to_string(),
                ],
            });
        } else if name == NBD_DIR {
            let port = std::fs::read_to_string(dir.join(&name).join("port"))
                .with_context(|| format!("reading {}/{name}/port", dir.display()))?;
            rgws.push(Daemon {
                name: name.clone(),
                args: vec![
                    "nbd".into(),
                    "-c".into(),
                    conf.clone(),
                    "--any-port-if-taken".into(),
                    "--bind".into(),
                    format!("127.0.0.1:{}", port.trim()),
                    "--data".into(),
                    dir.join(&name).display().to_string(),
                ],
            });
        } else if let Some(id) = name.strip_prefix("osd.")
            && let Ok(id) = id.parse::<u32>()
        {
            osds.push((
                id,
                Daemon {
                    name: name.clone(),
                    args: vec![
                        "osd".into(),
                        "run".into(),
                        "--id".into(),
                        id.to_string(),
                        "--data".into(),
                        dir.join(&name).display().to_string(),
                        "-c".into(),
                        conf.clone(),
                        "--host".into(),
                        "localhost".into(),
                    ],
                },
            ));
        }
    }
    // The OSDs share this machine's CPUs: about CPUs / OSDs async workers each (at least one),
    // unless kelp.conf's `[osd] threads` says otherwise. Fewer workers than CPUs per OSD means
    // fewer cross-thread wake-ups per replicated write (docs/benchmarks/rados.md, 2026-11-25).
    let conf_threads = kelp_config::ClusterConf::load(&dir.join("kelp.conf"))
        .map(|c| c.osd.threads)
        .unwrap_or(None);
    if conf_threads.is_none() && !osds.is_empty() {
        let threads = osd_threads(osds.len());
        for (_, d) in &mut osds {
            d.args.push("--threads".into());
            d.args.push(threads.to_string());
        }
    }
    mons.sort_by(|a, b| a.name.cmp(&b.name));
    osds.sort_by_key(|(id, _)| *id);
    mons.extend(osds.into_iter().map(|(_, d)| d));
    mons.extend(rgws);
    if mons.is_empty() {
        bail!(
            "{} holds no cluster (run `kelp up --dir {}`)",
            dir.display(),
            dir.display()
        );
    }
    Ok(mons)
}

fn pid_file(dir: &Path, name: &str) -> PathBuf {
    dir.join("run").join(format!("{name}.pid"))
}

/// The pid of a running daemon of this cluster (its command line must name the daemon's
/// data directory, so a stale pid file never makes us signal an unrelated process).
fn running_pid(dir: &Path, name: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_file(dir, name))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // A process that has only just been spawned may not show its arguments yet: wait a moment.
    let mut cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    for _ in 0..50 {
        if !cmdline.is_empty() || !alive(pid) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    }
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    let data = dir.join(name).display().to_string();
    cmdline.contains(&data).then_some(pid)
}

/// Starts a daemon in the background (its own process group), logging to DIR/logs.
fn start(dir: &Path, d: &Daemon) -> Result<std::process::Child> {
    if let Some(pid) = running_pid(dir, &d.name) {
        bail!("{} is already running (pid {pid})", d.name);
    }
    std::fs::create_dir_all(dir.join("logs"))?;
    std::fs::create_dir_all(dir.join("run"))?;
    let log_path = dir.join("logs").join(format!("{}.log", d.name));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let child = Command::new(kelp_exe()?)
        .args(&d.args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", d.name))?;
    common::write_pid_file_for(&pid_file(dir, &d.name), child.id())?;
    Ok(child)
}

fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) has no memory-safety preconditions; pid was checked to be ours.
    unsafe { libc::kill(pid, sig) == 0 }
}

fn alive(pid: i32) -> bool {
    // A zombie child still answers kill(pid, 0); look at its state too. The main thread of an
    // exiting process turns zombie before its other threads are gone (one blocked in a disk
    // flush can take seconds), and those still hold its files — an OSD's store lock among
    // them — so it is alive while any other thread is listed.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let zombie = stat
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'));
            !zombie
                || std::fs::read_dir(format!("/proc/{pid}/task"))
                    .map(|d| d.count() > 1)
                    .unwrap_or(false)
        }
        Err(_) => false,
    }
}

/// Stops one daemon: SIGTERM, then SIGKILL after `grace`. Returns whether it was running.
fn stop(dir: &Path, name: &str, grace: Duration) -> bool {
    let Some(pid) = running_pid(dir, name) else {
        let _ = std::fs::remove_file(pid_file(dir, name));
        return false;
    };
    signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(pid) {
        eprintln!("{name} did not stop within {grace:?}: killing it");
        signal(pid, libc::SIGKILL);
    }
    let _ = std::fs::remove_file(pid_file(dir, name));
    true
}

fn stop_all(dir: &Path) -> Result<usize> {
    let mut list = daemons(dir)?;
    // OSDs first (they report themselves down to the monitors), then monitors.
    list.reverse();
    let mut n = 0;
    for d in &list {
        if stop(dir, &d.name, Duration::from_secs(20)) {
            eprintln!("stopped {}", d.name);
            n += 1;
        }
    }
    Ok(n)
}

/// Fails if a daemon that was started has died, quoting the end of its log.
///
/// Liveness here is "the pid exists and is not a zombie", deliberately not the command-line
/// check of `running_pid`: right after `spawn` returns, the kernel may not have set up the new
/// program's arguments yet, so `/proc/PID/cmdline` can read empty for a healthy daemon.
fn check_started(dir: &Path) -> Result<()> {
    for d in daemons(dir)? {
        let pid = std::fs::read_to_string(pid_file(dir, &d.name))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if pid.is_some_and(|pid| !alive(pid)) {
            let log = dir.join("logs").join(format!("{}.log", d.name));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "{} stopped while the cluster was starting; the end of {}:\n  {}",
                d.name,
                log.display(),
                tail.join("\n  ")
            );
        }
    }
    Ok(())
}

fn admin_conf(dir: &Path) -> crate::cmd::common::ConfArgs {
    crate::cmd::common::ConfArgs::for_dir(dir)
}

/// Waits until the monitors answer a status command with a cluster map.
async fn wait_monitors(dir: &Path, timeout: Duration) -> Result<()> {
    let mut cfg = admin_conf(dir).client_config()?;
    cfg.mon_timeout = Duration::from_secs(2);
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = async {
            let rados = kelp_client::Rados::connect(cfg.clone()).await?;
            rados.mon_command(kelp_proto::MonCommand::Status).await
        };
        match attempt.await {
            Ok(kelp_proto::MonReply::Status(_)) => return Ok(()),
            Ok(other) => tracing::debug!("monitors not ready: {other:?}"),
            Err(e) => tracing::debug!("monitors not ready: {e}"),
        }
        check_started(dir)?;
        if Instant::now() >= deadline {
            bail!(
                "the monitors did not come up within {timeout:?} (see {}/logs/mon.*.log)",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every OSD is up; creates the default pool on a new cluster.
async fn wait_osds(
    dir: &Path,
    new: bool,
    pg_num: u32,
    osds: usize,
    timeout: Duration,
) -> Result<()> {
    let conf = admin_conf(dir);
    let deadline = Instant::now() + timeout;
    let rados = conf.connect().await?;
    let want_osds = osds;
    loop {
        let map = rados.osd_map();
        if map.num_up() >= want_osds && want_osds > 0 {
            break;
        }
        check_started(dir)?;
        if Instant::now() >= deadline {
            bail!(
                "only {} of {want_osds} OSDs came up within {timeout:?} (see {}/logs/)",
                map.num_up(),
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The object pool, and the block images' pool (`kelp rbd`, `kelp nbd`).
    if new {
        for pool in [DEFAULT_POOL, crate::cmd::rbd::DEFAULT_POOL] {
            ensure_replicated_pool(&rados, pool, pg_num, osds).await?;
        }
    }
    Ok(())
}

/// Makes the replicated pool `pool` (`pg_num` PGs, up to 3 copies on `osds` OSDs) unless it
/// exists.
async fn ensure_replicated_pool(
    rados: &kelp_client::Rados,
    pool: &str,
    pg_num: u32,
    osds: usize,
) -> Result<()> {
    if rados.osd_map().pool_by_name(pool).is_some() {
        return Ok(());
    }
    rados
        .create_pool(PoolSpec {
            name: pool.into(),
            pg_num: Some(pg_num),
            size: Some((osds as u32).min(3)),
            min_size: None,
            crush_rule: None,
            erasure: None,
        })
        .await
        .map(drop)
        .with_context(|| format!("creating pool '{pool}'"))
}

/// Waits until every OSD is up and every PG of every pool (the gateway's too) is active+clean.
async fn wait_ready(dir: &Path, timeout: Duration) -> Result<()> {
    let rados = admin_conf(dir).connect().await?;
    crate::cmd::status::wait_ready(&rados, timeout, || check_started(dir)).await
}

pub fn run_up(mut a: UpArgs, g: &common::Global) -> Result<ExitCode> {
    common::init_logging("warn");
    let dir = abs(&g.conf.cluster_dir(a.dir.as_deref()))?;
    let new = !dir.join("kelp.conf").exists();
    if let Some(ec) = a.ec {
        if new && a.osds < ec.size() {
            eprintln!(
                "--ec {ec} puts each object's {} shards on {} different OSDs: creating {} OSDs \
                 instead of {}",
                ec.size(),
                ec.size(),
                ec.size(),
                a.osds
            );
            a.osds = ec.size();
        } else if !new {
            let osds = daemons(&dir)?
                .iter()
                .filter(|d| d.name.starts_with("osd."))
                .count();
            if osds < ec.size() as usize {
                bail!(
                    "--ec {ec} needs {} OSDs (one per shard) but the cluster in {} has {osds}: \
                     add OSDs first (`kelp daemon add-osd --dir {}`)",
                    ec.size(),
                    dir.display(),
                    dir.display()
                );
            }
        }
    }
    if new {
        eprintln!(
            "creating a new cluster in {} ({} monitor(s), {} OSDs)…",
            dir.display(),
            a.mons,
            a.osds
        );
        if let Err(e) = create(&dir, &a) {
            remove_partial_cluster(&dir);
            return Err(e);
        }
    } else {
        eprintln!("reopening the cluster in {}…", dir.display());
    }
    if !a.no_rgw {
        create_rgw(&dir, a.rgw_port)?;
    }
    if !a.no_nbd {
        create_service_dir(&dir, NBD_DIR, a.nbd_port, "the NBD server")?;
    }
    if !a.no_mgr {
        create_mgrs(&dir, a.dashboard_port)?;
    }
    // The file system is made once, with its MDS directories (removed again if that fails).
    let make_fs = !a.no_fs && !dir.join(MDS_NAMES[0]).exists();
    if make_fs {
        for name in MDS_NAMES {
            std::fs::create_dir_all(dir.join(name))
                .with_context(|| format!("creating {}/{name}", dir.display()))?;
        }
    }
    let list: Vec<Daemon> = daemons(&dir)?
        .into_iter()
        .filter(|d| !((a.no_rgw && d.name == RGW_DIR) || (a.no_nbd && d.name == NBD_DIR)))
        .filter(|d| !(a.no_mgr && d.name.starts_with(MGR_PREFIX)))
        .filter(|d| !(a.no_fs && d.name.starts_with(MDS_PREFIX)))
        .collect();
    let osd_count = list.iter().filter(|d| d.name.starts_with("osd.")).count();
    let rt = common::runtime()?;
    let mut children = Vec::new();
    let started = (|| -> Result<()> {
        // Monitors first; OSDs once the monitors answer.
        for d in list.iter().filter(|d| d.name.starts_with("mon.")) {
            if running_pid(&dir, &d.name).is_some() {
                eprintln!("{} is already running", d.name);
                continue;
            }
            children.push((d.name.clone(), start(&dir, d)?));
        }
        rt.block_on(wait_monitors(&dir, Duration::from_secs(a.timeout_secs)))?;
        for d in list.iter().filter(|d| d.name.starts_with("osd.")) {
            if running_pid(&dir, &d.name).is_some() {
                eprintln!("{} is already running", d.name);
                continue;
            }
            children.push((d.name.clone(), start(&dir, d)?));
        }
        rt.block_on(wait_osds(
            &dir,
            new,
            a.pg_num,
            osd_count,
            Duration::from_secs(a.timeout_secs),
        ))?;
        if let Some(ec) = a.ec {
            rt.block_on(setup_ec(&dir, ec, !a.no_rgw))?;
        }
        for d in list.iter().filter(|d| d.name == RGW_DIR) {
            if running_pid(&dir, &d.name).is_some() {
                eprintln!("{} is already running", d.name);
            } else {
                let _ = std::fs::remove_file(dir.join(RGW_DIR).join("addr"));
                children.push((d.name.clone(), start(&dir, d)?));
            }
            rt.block_on(wait_rgw(&dir, Duration::from_secs(a.timeout_secs)))?;
        }
        for d in list.iter().filter(|d| d.name == NBD_DIR) {
            if running_pid(&dir, &d.name).is_some() {
                eprintln!("{} is already running", d.name);
            } else {
                let _ = std::fs::remove_file(dir.join(NBD_DIR).join("addr"));
                children.push((d.name.clone(), start(&dir, d)?));
            }
            rt.block_on(wait_nbd(&dir, Duration::from_secs(a.timeout_secs)))?;
        }
        // The file system: its pools and map entry (once), then its MDS daemons; the first
        // to beacon becomes active, the other stands by.
        if make_fs {
            rt.block_on(setup_fs(&dir, osd_count))?;
        }
        let mut any_mds = false;
        for d in list.iter().filter(|d| d.name.starts_with(MDS_PREFIX)) {
            any_mds = true;
            if running_pid(&dir, &d.name).is_some() {
                eprintln!("{} is already running", d.name);
            } else {
                children.push((d.name.clone(), start(&dir, d)?));
            }
        }
        if any_mds {
            rt.block_on(wait_mds(&dir, Duration::from_secs(a.timeout_secs)))?;
        }
        // Managers: the first to beacon becomes active and serves the dashboard; mgr.x is
        // started first and the others once it is active, so that it is the active one.
        let mut mgrs: Vec<&Daemon> = list
            .iter()
            .filter(|d| d.name.starts_with(MGR_PREFIX))
            .collect();
        mgrs.sort_by(|a, b| a.name.cmp(&b.name));
        for (i, d) in mgrs.iter().enumerate() {
            if running_pid(&dir, &d.name).is_some() {
                eprintln!("{} is already running", d.name);
            } else {
                children.push((d.name.clone(), start(&dir, d)?));
            }
            if i == 0 {
                rt.block_on(setup_dashboard(&dir, Duration::from_secs(a.timeout_secs)))?;
            }
        }
        // Only now "up": a client may write the moment this returns, to any pool.
        rt.block_on(wait_ready(&dir, Duration::from_secs(a.timeout_secs)))?;
        Ok(())
    })();
    if let Err(e) = started {
        eprintln!("kelp up: {e:#}; stopping the cluster");
        stop_all(&dir)?;
        if make_fs {
            for name in MDS_NAMES {
                let _ = std::fs::remove_dir_all(dir.join(name));
            }
        }
        return Err(e);
    }
    let dashboard = (!a.no_mgr).then(|| dashboard_url(&dir, &rt)).flatten();
    print_banner(&dir, a.detach, a.ec, !a.no_rgw, dashboard, !a.no_fs)?;
    if a.detach {
        return Ok(ExitCode::SUCCESS);
    }
    // Supervise until Ctrl-C / SIGTERM: report deaths, leave dead daemons down.
    let stop_now = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook_consts::SIGINT, signal_hook_consts::SIGTERM] {
        signal_hook::flag::register(sig, stop_now.clone()).context("installing signal handlers")?;
    }
    while !stop_now.load(std::sync::atomic::Ordering::Relaxed) {
        children.retain_mut(|(name, child)| match child.try_wait() {
            Ok(Some(status)) => {
                eprintln!(
                    "{name} exited ({status}); it stays down until `kelp daemon start {name} --dir {}`",
                    dir.display()
                );
                let _ = std::fs::remove_file(pid_file(&dir, name));
                false
            }
            _ => true,
        });
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("stopping the cluster…");
    stop_all(&dir)?;
    for (_, mut child) in children {
        let _ = child.wait();
    }
    eprintln!(
        "cluster stopped; `kelp up --dir {}` starts it again",
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `kelp up --ec K+M`: makes the profile `kelp-K-M` (if missing; refused if one of that name
/// differs) and, for the gateway, its pools with the data pool erasure-coded from it (refused
/// if the data pool exists of another kind). Before the gateway starts, so that it finds its
/// data pool made.
async fn setup_ec(dir: &Path, ec: EcSpec, rgw: bool) -> Result<()> {
    let rados = admin_conf(dir).connect().await?;
    let profile = ec.profile_name();
    rados
        .ec_profile_set(&profile, &ec.profile_words(), false)
        .await
        .with_context(|| format!("--ec {ec}: making the erasure-code profile '{profile}'"))?;
    if rgw {
        crate::cmd::rgw::open_default_pools(rados, Some(profile.clone()))
            .await
            .with_context(|| {
                format!("--ec {ec}: putting the S3 data pool on erasure-code profile '{profile}'")
            })?;
    }
    Ok(())
}

/// Waits until the gateway serves, then makes sure the default S3 user exists and its keys
/// are in DIR/s3.env.
/// Waits until the NBD server accepts connections (it writes its address once it listens).
async fn wait_nbd(dir: &Path, timeout: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    let addr_file = dir.join(NBD_DIR).join("addr");
    loop {
        if let Ok(text) = std::fs::read_to_string(&addr_file)
            && let Ok(addr) = text.trim().parse::<SocketAddr>()
            && tokio::net::TcpStream::connect(addr).await.is_ok()
        {
            // The port it got (asked for any free port, or its port was taken) becomes its
            // port: a restarted server comes back at the same address, so clients reconnect.
            let port_file = dir.join(NBD_DIR).join("port");
            if std::fs::read_to_string(&port_file)
                .is_ok_and(|p| p.trim() != addr.port().to_string())
            {
                std::fs::write(&port_file, format!("{}\n", addr.port()))?;
            }
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "the NBD server did not start within {timeout:?} (see {}/logs/{NBD_DIR}.log)",
                dir.display()
            );
        }
        if running_pid(dir, NBD_DIR).is_none() {
            bail!(
                "the NBD server exited (see {}/logs/{NBD_DIR}.log)",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_rgw(dir: &Path, timeout: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    let addr_file = dir.join(RGW_DIR).join("addr");
    let addr: SocketAddr = loop {
        if let Ok(text) = std::fs::read_to_string(&addr_file)
            && let Ok(addr) = text.trim().parse::<SocketAddr>()
            && answers_http(addr).await
        {
            break addr;
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "the S3 gateway did not start within {timeout:?} (see {}/logs/{RGW_DIR}.log)",
                dir.display()
            );
        }
        if running_pid(dir, RGW_DIR).is_none() {
            bail!(
                "the S3 gateway exited (see {}/logs/{RGW_DIR}.log)",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let rados = admin_conf(dir).connect().await?;
    let key = crate::cmd::rgw::ensure_default_user(rados, DEFAULT_S3_USER).await?;
    let env = format!(
        "# S3 credentials of the default user '{DEFAULT_S3_USER}', written by `kelp up`.\n\
         # Use with: set -a; . {}/s3.env; set +a\n\
         AWS_ACCESS_KEY_ID={}\nAWS_SECRET_ACCESS_KEY={}\nAWS_ENDPOINT_URL=http://{addr}\n\
         AWS_DEFAULT_REGION=us-east-1\n",
        dir.display(),
        key.access_key,
        key.secret_key
    );
    let tmp = dir.join("s3.env.tmp");
    std::fs::write(&tmp, env)?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    std::fs::rename(&tmp, dir.join("s3.env"))?;
    Ok(())
}

/// Whether an HTTP server at `addr` answers a request (any status: an anonymous `GET /` is
/// refused by a working gateway, and that is an answer).
async fn answers_http(addr: SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head.starts_with(b"HTTP/1."))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Ok(true))
    )
}

/// `kelp up`'s file system: the pools `fs.meta` and `fs.data` (unless they exist), the file
/// system `kelpfs` on them (unless the map has it).
async fn setup_fs(dir: &Path, osds: usize) -> Result<()> {
    use crate::cmd::filesystem::{DEFAULT_DATA_POOL, DEFAULT_FS, DEFAULT_META_POOL};
    let rados = admin_conf(dir).connect().await?;
    if rados.osd_map().pool_by_name(DEFAULT_META_POOL).is_none() {
        create_meta_pool(&rados, DEFAULT_META_POOL, 16, osds).await?;
    }
    ensure_replicated_pool(&rados, DEFAULT_DATA_POOL, 32, osds).await?;
    let exists = match rados.mon_command(kelp_proto::MonCommand::FsMapGet).await? {
        kelp_proto::MonReply::FsMap(m) => m.filesystems.contains_key(DEFAULT_FS),
        other => bail!("reading the file-system map: {other:?}"),
    };
    if !exists {
        match rados
            .mon_command(kelp_proto::MonCommand::FsNew {
                name: DEFAULT_FS.into(),
                metadata_pool: DEFAULT_META_POOL.into(),
                data_pool: DEFAULT_DATA_POOL.into(),
                force: false,
            })
            .await?
        {
            kelp_proto::MonReply::Done { .. } => {}
            other => bail!("creating the file system '{DEFAULT_FS}': {other:?}"),
        }
    }
    Ok(())
}

/// The metadata pool on the fastest device class present (nvme, then ssd, then hdd) that
/// has an OSD for every copy, through the replicated rule `replicated_CLASS` (made if
/// missing); on the default rule when no OSD reported a class of known speed. Says which.
async fn create_meta_pool(
    rados: &kelp_client::Rados,
    pool: &str,
    pg_num: u32,
    osds: usize,
) -> Result<()> {
    let size = (osds as u32).min(3);
    // kelp up's OSDs share one host: copies go to distinct OSDs, as with the default rule
    let class = rados
        .osd_map()
        .fastest_class_for("default", "osd", size)
        .unwrap_or_else(|e| {
            eprintln!("metadata pool '{pool}': cannot choose a device class ({e})");
            None
        });
    let rule = match &class {
        Some(class) => {
            let rule = format!("replicated_{class}");
            let cmd = kelp_proto::MonCommand::CrushRuleCreateReplicated {
                name: rule.clone(),
                root: "default".into(),
                failure_domain: "osd".into(),
                class: Some(class.clone()),
            };
            match rados.mon_command(cmd).await? {
                kelp_proto::MonReply::Done { epoch } => {
                    rados.wait_for_epoch(epoch).await?;
                }
                other => bail!("creating the CRUSH rule {rule}: {other:?}"),
            }
            eprintln!("metadata pool '{pool}': on device class {class} (CRUSH rule {rule})");
            Some(rule)
        }
        None => {
            eprintln!(
                "metadata pool '{pool}': no OSD reported a device class (nvme, ssd, hdd):                  default CRUSH rule"
            );
            None
        }
    };
    rados
        .create_pool(PoolSpec {
            name: pool.into(),
            pg_num: Some(pg_num),
            size: Some(size),
            min_size: None,
            crush_rule: rule,
            erasure: None,
        })
        .await
        .map(drop)
        .with_context(|| format!("creating pool '{pool}'"))
}

/// Waits until every file system in the map has an active MDS, and the standbys they want
/// have beaconed (so that health is not warning about them).
async fn wait_mds(dir: &Path, timeout: Duration) -> Result<()> {
    let rados = admin_conf(dir).connect().await?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Ok(kelp_proto::MonReply::FsMap(m)) =
            rados.mon_command(kelp_proto::MonCommand::FsMapGet).await
            && m.filesystems.values().all(|f| {
                f.active
                    .as_ref()
                    .is_some_and(|a| a.state == kelp_proto::MdsState::Active)
            })
            && m.standbys.len() as u32
                >= m.filesystems
                    .values()
                    .map(|f| f.standby_count_wanted)
                    .max()
                    .unwrap_or(0)
        {
            return Ok(());
        }
        check_started(dir)?;
        if std::time::Instant::now() > deadline {
            bail!(
                "no MDS became active within {timeout:?} (see {}/logs/mds.a.log)",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sets up the managers' directories (`mgr.x`, and `mgr.y` when the cluster has several
/// monitors) with their dashboard ports, unless they exist.
fn create_mgrs(dir: &Path, port: u16) -> Result<()> {
    create_service_dir(dir, "mgr.x", port, "the dashboard")?;
    let mons = kelp_config::ClusterConf::load(&dir.join("kelp.conf"))
        .map(|c| c.global.mon_host.len())
        .unwrap_or(1);
    if mons > 1 {
        create_service_dir(
            dir,
            "mgr.y",
            if port == 0 { 0 } else { port.saturating_add(1) },
            "the standby dashboard",
        )?;
    }
    Ok(())
}

/// Waits until a manager is active, and makes the dashboard's admin user (its key in
/// `DIR/dashboard.key`, mode 0600).
async fn setup_dashboard(dir: &Path, timeout: Duration) -> Result<()> {
    let rados = admin_conf(dir).connect().await?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Ok(kelp_proto::MonReply::MgrMap(m)) =
            rados.mon_command(kelp_proto::MonCommand::MgrStat).await
            && m.active.is_some()
        {
            break;
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "no manager became active within {timeout:?} (see {}/logs/mgr.x.log)",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let key = crate::cmd::mgr::dashboard_user_create(
        &rados,
        DASHBOARD_ADMIN,
        kelp_mgr::auth::Role::Admin,
    )
    .await?;
    let path = dir.join("dashboard.key");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        writeln!(f, "{key}")?;
    }
    Ok(())
}

/// The active manager's dashboard URL.
fn dashboard_url(dir: &Path, rt: &tokio::runtime::Runtime) -> Option<String> {
    rt.block_on(async {
        let rados = admin_conf(dir).connect().await.ok()?;
        match rados.mon_command(kelp_proto::MonCommand::MgrStat).await {
            Ok(kelp_proto::MonReply::MgrMap(m)) => m.active.map(|a| a.dashboard_url),
            _ => None,
        }
    })
}

/// `ec`: `kelp up --ec`, whose profile (and, with `rgw`, S3 data pool) it names.
fn print_banner(
    dir: &Path,
    detached: bool,
    ec: Option<EcSpec>,
    rgw: bool,
    dashboard: Option<String>,
    fs: bool,
) -> Result<()> {
    let conf = kelp_config::ClusterConf::load(&dir.join("kelp.conf"))?;
    let list = daemons(dir)?;
    let osds = list.iter().filter(|d| d.name.starts_with("osd.")).count();
    let mons: Vec<String> = conf.global.mon_host.iter().map(|a| a.to_string()).collect();
    println!("Kelp cluster is up ({}).", dir.display());
    println!("  monitors:  {}", mons.join(", "));
    println!(
        "  OSDs:      {osds} (stores in {}/osd.N, logs in {}/logs/)",
        dir.display(),
        dir.display()
    );
    println!(
        "  pools:     '{DEFAULT_POOL}' (objects), '{}' (block images), replicated",
        crate::cmd::rbd::DEFAULT_POOL
    );
    if let Some(ec) = ec {
        let profile = ec.profile_name();
        if rgw {
            println!(
                "  S3 data:   pool 'kelp.rgw.data', erasure-coded {ec} (profile '{profile}'; \
                 bucket index and users replicated)"
            );
        } else {
            println!(
                "  EC:        profile '{profile}' ({ec}; kelp pool create NAME --erasure {profile})"
            );
        }
    }
    println!(
        "  config:    {}/kelp.conf   (export KELP_CONF={}/kelp.conf)",
        dir.display(),
        dir.display()
    );
    println!("  key:       client.admin in {}/keyring", dir.display());
    if let Ok(addr) = std::fs::read_to_string(dir.join(NBD_DIR).join("addr"))
        && list.iter().any(|d| d.name == NBD_DIR)
    {
        println!(
            "  NBD:       nbd://{}/{}/IMAGE   (kelp rbd create IMAGE --size 10G; qemu-img info nbd://{}/{}/IMAGE)",
            addr.trim(),
            crate::cmd::rbd::DEFAULT_POOL,
            addr.trim(),
            crate::cmd::rbd::DEFAULT_POOL,
        );
    }
    if let Ok(addr) = std::fs::read_to_string(dir.join(RGW_DIR).join("addr"))
        && list.iter().any(|d| d.name == RGW_DIR)
    {
        println!(
            "  S3:        http://{}   (keys in {}/s3.env: set -a; . {}/s3.env; set +a)",
            addr.trim(),
            dir.display(),
            dir.display()
        );
    }
    let mds = list.iter().any(|d| d.name.starts_with(MDS_PREFIX));
    if fs && mds {
        println!(
            "  FS:        '{}' (pools '{}', '{}'; MDS mds.a active, mds.b standby)",
            crate::cmd::filesystem::DEFAULT_FS,
            crate::cmd::filesystem::DEFAULT_META_POOL,
            crate::cmd::filesystem::DEFAULT_DATA_POOL
        );
    }
    if let Some(url) = dashboard {
        println!(
            "  dashboard: {url}   (log in as '{DASHBOARD_ADMIN}' with the key in {}/dashboard.key)",
            dir.display()
        );
    }
    println!();
    println!("Try:");
    println!("  kelp status");
    println!(
        "  kelp rados -p {DEFAULT_POOL} put hello /etc/hostname && kelp rados -p {DEFAULT_POOL} ls"
    );
    println!("  kelp rados -p {DEFAULT_POOL} bench 10 write");
    if list.iter().any(|d| d.name == RGW_DIR) {
        println!(
            "  set -a; . {}/s3.env; set +a; aws s3 mb s3://photos && aws s3 ls",
            dir.display()
        );
    }
    if fs && mds {
        println!(
            "  mkdir -p /mnt/kelp && kelp fs mount /mnt/kelp &   (then ls /mnt/kelp; kelp fs umount /mnt/kelp)"
        );
    }
    if detached {
        println!("Stop it with: kelp down --dir {}", dir.display());
    } else {
        println!("Ctrl-C stops the cluster.");
    }
    Ok(())
}

pub fn run_down(a: DownArgs, g: &common::Global) -> Result<ExitCode> {
    let dir = existing_dir(g, a.dir.as_deref())?;
    let n = stop_all(&dir)?;
    eprintln!("stopped {n} daemon(s)");
    Ok(ExitCode::SUCCESS)
}

pub fn run_daemon(cmd: DaemonCommand, g: &common::Global) -> Result<ExitCode> {
    let (a, action) = match cmd {
        DaemonCommand::Start(a) => (a, "start"),
        DaemonCommand::Stop(a) => (a, "stop"),
        DaemonCommand::Restart(a) => (a, "restart"),
        DaemonCommand::AddOsd(a) => return add_osd(a, g),
        DaemonCommand::RemoveOsd(a) => return remove_osd(a, g),
        DaemonCommand::Ls(a) => return crate::cmd::service_map::run_ls(a, g),
    };
    let dir = existing_dir(g, a.dir.as_deref())?;
    let list = daemons(&dir)?;
    let Some(d) = list.iter().find(|d| d.name == a.name) else {
        let names: Vec<&str> = list.iter().map(|d| d.name.as_str()).collect();
        bail!(
            "no daemon '{}' in {} (daemons: {})",
            a.name,
            dir.display(),
            names.join(", ")
        );
    };
    if action != "start" {
        if stop(&dir, &d.name, Duration::from_secs(20)) {
            eprintln!("stopped {}", d.name);
        } else if action == "stop" {
            eprintln!("{} was not running", d.name);
        }
    }
    if action != "stop" {
        let child = start(&dir, d)?;
        eprintln!("started {} (pid {})", d.name, child.id());
    }
    Ok(ExitCode::SUCCESS)
}

fn add_osd(a: AddOsdArgs, g: &common::Global) -> Result<ExitCode> {
    let dir = existing_dir(g, a.dir.as_deref())?;
    let rt = common::runtime()?;
    let id = rt.block_on(async {
        let rados = admin_conf(&dir).connect().await?;
        // the next id neither the map nor the directory has used
        let mut next = rados.osd_map().osds.keys().max().map_or(0, |m| m + 1);
        for entry in std::fs::read_dir(&dir)? {
            let name = entry?.file_name().to_string_lossy().to_string();
            if let Some(n) = name
                .strip_prefix("osd.")
                .and_then(|n| n.parse::<i32>().ok())
            {
                next = next.max(n + 1);
            }
        }
        let entity = format!("osd.{next}");
        let secret = match rados
            .mon_command(kelp_proto::MonCommand::AuthGetOrCreate {
                entity: entity.clone(),
            })
            .await?
        {
            kelp_proto::MonReply::Key { secret, .. } => secret,
            other => bail!("creating a key for {entity}: {other:?}"),
        };
        let secret = kelp_msgr::Secret::from_base64(&secret)
            .with_context(|| format!("the monitors returned a bad key for {entity}"))?;
        let path = dir.join("keyring");
        let mut keyring =
            Keyring::load(&path).with_context(|| format!("reading {}", path.display()))?;
        keyring.insert(&entity, secret)?;
        keyring.save(&path)?;
        Ok::<_, anyhow::Error>(next)
    })?;
    let name = format!("osd.{id}");
    // By default the new OSD is as large as the cluster's others (CRUSH weights them alike),
    // when that fits; else as `kelp up` would size it now.
    let like_others = a.osd_size.or_else(|| {
        let sb = kelp_store::Superblock::read(&dir.join("osd.0")).ok()?;
        let free = free_space(&dir).ok()?;
        (sb.data_size + PER_OSD_OVERHEAD <= free).then_some(kelp_types::ByteSize(sb.data_size))
    });
    let size = choose_osd_size(&dir, 1, like_others, a.files, 0)?;
    mkfs_osd(&dir.join(&name), size, a.files)?;
    let d = daemons(&dir)?
        .into_iter()
        .find(|d| d.name == name)
        .context("the new OSD's directory is missing")?;
    let child = start(&dir, &d)?;
    eprintln!("started {name} (pid {})", child.id());
    rt.block_on(async {
        let rados = admin_conf(&dir).connect().await?;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if rados.osd_map().osds.get(&id).is_some_and(|o| o.up) {
                eprintln!("{name} is up and in; CRUSH now places data on it");
                return Ok(ExitCode::SUCCESS);
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "{name} did not come up within 60 s (see {}/logs)",
                    dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Waits (up to 5 minutes) until every PG is reported active+clean.
async fn wait_clean(rados: &kelp_client::Rados, name: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let unclean = crate::cmd::osd::unclean_pgs(rados).await?;
        let Some(first) = unclean.first() else {
            return Ok(());
        };
        if std::time::Instant::now() > deadline {
            bail!(
                "refusing to remove {name}: {} PG(s) still not active+clean after 5 minutes ({first})",
                unclean.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn remove_osd(a: RemoveOsdArgs, g: &common::Global) -> Result<ExitCode> {
    let dir = existing_dir(g, a.dir.as_deref())?;
    let id = a.id.0;
    let name = format!("osd.{id}");
    let rt = common::runtime()?;
    let rados = rt.block_on(admin_conf(&dir).connect())?;
    if !a.force {
        // everything but "it is up": that is what stopping it is for
        let mut map = (*rados.osd_map()).clone();
        if let Some(o) = map.osds.get_mut(&id) {
            o.up = false;
        }
        if let Some(why) = crate::cmd::osd::purge_blocker(&map, id)? {
            bail!("refusing to remove {name}: {why} (--force to remove it anyway)");
        }
    }
    if !a.force {
        // its data must be complete elsewhere before it goes: wait for the PGs to settle
        rt.block_on(wait_clean(&rados, &name))?;
    }
    if stop(&dir, &name, Duration::from_secs(20)) {
        eprintln!("stopped {name}");
    }
    rt.block_on(async {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while rados.osd_map().osds.get(&id).is_some_and(|o| o.up) {
            if std::time::Instant::now() > deadline {
                rados
                    .mon_command(kelp_proto::MonCommand::OsdDown { id })
                    .await?;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !a.force {
            // its going down changed the map: the PGs report again
            wait_clean(&rados, &name).await?;
        }
        crate::cmd::osd::purge(&rados, id, a.force).await
    })?;
    let store = dir.join(&name);
    if store.exists() {
        std::fs::remove_dir_all(&store).with_context(|| format!("deleting {}", store.display()))?;
    }
    eprintln!("{name} removed");
    Ok(ExitCode::SUCCESS)
}

mod signal_hook_consts {
    pub const SIGINT: i32 = libc::SIGINT;
    pub const SIGTERM: i32 = libc::SIGTERM;
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn osd_files_are_sized_from_free_space_with_a_cap_and_a_floor() {
        // plenty of room: the cap
        assert_eq!(
            auto_osd_size(80 * GIB, 3, CLUSTER_OVERHEAD).unwrap(),
            16 * GIB
        );
        // 2 GiB free, three OSDs: small OSDs that all fit, with room to spare
        let each = auto_osd_size(2 * GIB, 3, CLUSTER_OVERHEAD).unwrap();
        assert!((AUTO_OSD_MIN..=512 << 20).contains(&each), "{each}");
        assert!(3 * (each + PER_OSD_OVERHEAD) + CLUSTER_OVERHEAD < 2 * GIB);
        assert_eq!(each % (64 << 20), 0);
        // too little: a clear refusal that says how much is needed
        let e = auto_osd_size(GIB / 2, 3, CLUSTER_OVERHEAD)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("only 512MiB free") && e.contains("--osd-size"),
            "{e}"
        );
    }
}
