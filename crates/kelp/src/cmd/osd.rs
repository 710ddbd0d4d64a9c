//! `kelp osd`: run an OSD daemon (`run`), look after OSDs (`tree`, `ls`, `out`, `in`,
//! `down`), set cluster flags (`set`, `unset`) and manage erasure-code profiles
//! (`erasure-code-profile`, in `ec_profile.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use kelp_maps::OsdMap;
use kelp_proto::{MonCommand, MonReply};
use kelp_store::StoreConfig;

use crate::cmd::OutputFormat;
use crate::cmd::common;

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
    /// Remove an OSD from the cluster for good: its map entry, CRUSH item and key (like
    /// `ceph osd purge`). Refused unless the OSD is down and out, no PG maps to it any more
    /// and every PG is active+clean (drain it first with `kelp osd out N` and wait for the
    /// PGs to settle); `--force` removes it anyway, losing whatever only it held.
    Purge(PurgeArgs),
    /// Give up on a dead OSD's data (like `ceph osd lost`): PGs that are `down` or
    /// `incomplete` waiting for it (it was the last to hold their latest writes) stop waiting
    /// and serve what the other OSDs have. Writes only it held are lost for good. The OSD must
    /// be down; needs --yes-i-really-mean-it.
    Lost(LostArgs),
    /// Per-OSD capacity and usage from the OSDs' latest statistics reports (like
    /// `ceph osd df`): SIZE, USE, AVAIL, %USE, PGS (PGs whose acting set holds the OSD),
    /// STATUS (up/down, plus nearfull/backfillfull/full against the mon_osd_*_ratios).
    Df(ShowArgs),
    /// Queue a scrub of every PG each OSD is primary for (runs even with `noscrub`).
    Scrub(crate::cmd::scrub::OsdScrubArgs),
    /// Queue a deep scrub of every PG each OSD is primary for (runs even with `nodeep-scrub`).
    DeepScrub(crate::cmd::scrub::OsdScrubArgs),
    /// Set a cluster flag (like `ceph osd set`): noout, noin, noup, nodown, norecover,
    /// nobackfill, norebalance, noscrub, nodeep-scrub, pause. See docs/HEALING.md.
    Set(FlagArgs),
    /// Clear a cluster flag (like `ceph osd unset`).
    Unset(FlagArgs),
    /// Erasure-code profiles (like `ceph osd erasure-code-profile`): set, get, ls, rm.
    ///
    /// A profile says how an erasure-coded pool cuts objects (k data shards, m parity shards)
    /// and where CRUSH puts the shards; `kelp pool create NAME --erasure PROFILE` makes a pool
    /// from one.
    #[command(subcommand)]
    ErasureCodeProfile(crate::cmd::ec_profile::EcProfileCommand),
    /// Fence client instances (like `ceph osd blocklist`): add, rm, ls.
    ///
    /// OSDs refuse every operation of a blocklisted client instance (a `Rados` connection,
    /// named `ENTITY.NONCE`, as `kelp rados listwatchers` shows them) and drop its watches;
    /// `add` returns once the OSD map that has the entry is committed.
    #[command(subcommand)]
    Blocklist(BlocklistCommand),
    // --- osd perf (observability) ---
    /// Each up OSD's recent write latencies (like `ceph osd perf`): COMMIT_LAT(ms), the time
    /// from a write reaching the OSD's store layer until it is durable, and APPLY_LAT(ms), the
    /// time until it is executed and visible to reads. Each is the mean over the writes of
    /// the OSD's last statistics interval that had any (`osd_stats_interval`); 0 until the OSD
    /// has written. With --format json: `{"osd_perf_infos": [{"id", "perf_stats":
    /// {"commit_latency_ms", "apply_latency_ms", "commit_latency_ns", "apply_latency_ns"}}]}`.
    Perf(ShowArgs),
    // --- device classes and replicated rules (file-system metadata on the fastest class) ---
    /// Device classes and rules in the cluster's CRUSH map (like `ceph osd crush`):
    /// set-device-class, rm-device-class, rule create-replicated.
    #[command(subcommand)]
    Crush(OsdCrushCommand),
}

#[derive(Subcommand, Debug)]
pub enum OsdCrushCommand {
    /// Bind OSDs to a device class (`nvme`, `ssd`, `hdd` or any name). An OSD that has
    /// another class already is refused: `rm-device-class` it first. OSDs report the class of
    /// their data directory's device at boot (`kelp osd run --device-class` overrides it).
    SetDeviceClass {
        /// The class.
        class: String,
        /// OSD ids (`3` or `osd.3`).
        #[arg(required = true)]
        ids: Vec<kelp_types::OsdId>,
    },
    /// Remove OSDs' device class.
    RmDeviceClass {
        /// OSD ids (`3` or `osd.3`).
        #[arg(required = true)]
        ids: Vec<kelp_types::OsdId>,
    },
    /// CRUSH rules: `create-replicated`.
    #[command(subcommand)]
    Rule(OsdCrushRuleCommand),
}

#[derive(Subcommand, Debug)]
pub enum OsdCrushRuleCommand {
    /// Create a replicated rule: one replica under each of distinct FAILURE_DOMAIN buckets
    /// (`host`, `osd`...) of ROOT, only on OSDs of CLASS if given (`kelp pool create NAME
    /// --crush-rule NAME` uses it). An unknown root or type, or a class with no OSD under the
    /// root, is refused; an existing replicated rule of that name is left as it is.
    CreateReplicated {
        /// Rule name.
        name: String,
        /// The CRUSH root to take (`default`).
        root: String,
        /// The bucket type replicas are spread over (`host`, `osd`...).
        failure_domain: String,
        /// Device class (`nvme`, `ssd`, `hdd`...).
        class: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum BlocklistCommand {
    /// Blocklist INSTANCE, for EXPIRE_SECONDS if given (else until removed).
    Add {
        /// The client instance (`ENTITY.NONCE`, e.g. `client.admin.3f09c2d4e5a6b7c8`).
        instance: String,
        /// Remove the entry automatically after this many seconds.
        expire_seconds: Option<u64>,
    },
    /// Remove INSTANCE from the blocklist.
    Rm {
        /// The client instance.
        instance: String,
    },
    /// List the blocklist: each instance and when its entry expires.
    Ls,
}

#[derive(Args, Debug)]
pub struct FlagArgs {
    /// The flag: noout (down OSDs are not marked out), noin (booting OSDs are not marked
    /// in), noup (booting OSDs are not marked up), nodown (failure reports and lost sessions
    /// do not mark OSDs down), norecover / nobackfill (OSDs pause log recovery / backfill),
    /// norebalance, noscrub, nodeep-scrub, pause (clients hold reads and writes).
    pub flag: String,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// OSD id.
    #[arg(long)]
    pub id: i32,
    /// Store directory.
    #[arg(long)]
    pub data: PathBuf,
    /// Address to serve on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub addr: SocketAddr,
    /// CRUSH host bucket for this OSD (default: the machine's host name).
    #[arg(long)]
    pub host: Option<String>,
    /// CRUSH weight (conventionally the device size in TiB).
    #[arg(long, default_value_t = 1.0)]
    pub weight: f32,
    /// The store's memory budget (metadata block cache, record cache, write buffers,
    /// transactions in flight; docs/STORE.md). Default: `cache` in the `[osd]` section of the
    /// configuration file, else 256MiB.
    #[arg(long)]
    pub cache: Option<kelp_types::ByteSize>,
    /// Async worker threads of the daemon. Default: `threads` in the `[osd]` section of the
    /// configuration file, else one per CPU. Several OSDs sharing a machine run best with
    /// about CPUs ÷ OSDs each (`kelp up` sets it so): fewer threads, fewer wake-ups.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write the daemon's pid to this file.
    #[arg(long)]
    pub pid_file: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: crate::cmd::common::MetricsArgs,
    /// Device class to report at boot (`nvme`, `ssd`, `hdd`...) when CRUSH has none for this
    /// OSD yet. Default: the class of the data directory's block device (`nvme…` devices are
    /// nvme, non-rotational ones ssd, rotational ones hdd; none on tmpfs or overlay).
    #[arg(long)]
    pub device_class: Option<String>,
}

#[derive(Args, Debug)]
pub struct ShowArgs {}

#[derive(Args, Debug)]
pub struct PurgeArgs {
    /// OSD id (`3` or `osd.3`).
    pub id: kelp_types::OsdId,
    /// Skip the safety checks.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct LostArgs {
    /// OSD id (`3` or `osd.3`).
    pub id: kelp_types::OsdId,
    /// Confirms that the writes only this OSD held may be lost.
    #[arg(long)]
    pub yes_i_really_mean_it: bool,
}

#[derive(Args, Debug)]
pub struct IdsArgs {
    /// OSD ids (`3` or `osd.3`).
    #[arg(required = true)]
    pub ids: Vec<kelp_types::OsdId>,
}

pub fn run(cmd: OsdCommand, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    match cmd {
        OsdCommand::Run(a) => run_daemon(a, g),
        OsdCommand::Tree(a) => show(a, true, g),
        OsdCommand::Ls(a) => show(a, false, g),
        OsdCommand::Out(a) => mark(a, |id| MonCommand::OsdOut { id }, g),
        OsdCommand::In(a) => mark(a, |id| MonCommand::OsdIn { id }, g),
        OsdCommand::Down(a) => mark(a, |id| MonCommand::OsdDown { id }, g),
        OsdCommand::Set(a) => set_flag(a, true, g),
        OsdCommand::Unset(a) => set_flag(a, false, g),
        OsdCommand::Scrub(a) => crate::cmd::scrub::run_osd_scrub(a, false, g),
        OsdCommand::DeepScrub(a) => crate::cmd::scrub::run_osd_scrub(a, true, g),
        OsdCommand::Df(a) => df(a, g),
        OsdCommand::ErasureCodeProfile(c) => crate::cmd::ec_profile::run(c, g),
        OsdCommand::Blocklist(c) => blocklist(c, g),
        OsdCommand::Perf(a) => perf(a, g),
        OsdCommand::Crush(c) => osd_crush(c, g),
        OsdCommand::Lost(a) => {
            if !a.yes_i_really_mean_it {
                bail!(
                    "marking osd.{} lost gives up on every write only it held; if that is \
                     what you want, add --yes-i-really-mean-it",
                    a.id.0
                );
            }
            let rt = common::runtime()?;
            rt.block_on(async {
                let rados = g.conf.connect().await?;
                match rados
                    .mon_command(MonCommand::OsdLost { id: a.id.0 })
                    .await?
                {
                    MonReply::Done { .. } => {}
                    MonReply::Error { message } => bail!("osd.{}: {message}", a.id.0),
                    other => bail!("osd.{}: unexpected reply {other:?}", a.id.0),
                }
                eprintln!("osd.{}: marked lost", a.id.0);
                Ok(ExitCode::SUCCESS)
            })
        }
        OsdCommand::Purge(a) => {
            let rt = common::runtime()?;
            rt.block_on(async {
                let rados = g.conf.connect().await?;
                purge(&rados, a.id.0, a.force).await?;
                eprintln!("osd.{}: purged", a.id.0);
                Ok(ExitCode::SUCCESS)
            })
        }
    }
}

/// Why `osd` cannot be purged safely yet (`None`: it can).
pub fn purge_blocker(map: &OsdMap, osd: i32) -> Result<Option<String>> {
    let Some(o) = map.osds.get(&osd) else {
        bail!("osd.{osd} does not exist");
    };
    if o.up {
        return Ok(Some(format!("osd.{osd} is up: stop it first")));
    }
    if o.is_in() {
        return Ok(Some(format!(
            "osd.{osd} is in: mark it out (kelp osd out {osd}) and let its data move first"
        )));
    }
    for pool in map.pools.values() {
        for pg in map.pool_pgs(pool.id)? {
            let m = map.pg_mapping(pg)?;
            if m.up.contains(&osd) || m.acting.contains(&osd) {
                return Ok(Some(format!("pg {pg} still maps to osd.{osd}")));
            }
        }
    }
    Ok(None)
}

/// PGs not reported `active+clean` by their primaries (those still moving data, or unknown):
/// until there are none, an OSD that left may still hold the only complete copy of something.
pub async fn unclean_pgs(rados: &kelp_client::Rados) -> Result<Vec<String>> {
    match rados.mon_command(MonCommand::PgStats).await? {
        MonReply::PgStats(d) => Ok(d
            .pgs
            .iter()
            .filter(|p| p.state_name.parse() != Ok(kelp_health::PgState::ACTIVE_CLEAN))
            .map(|p| format!("pg {} is {}", p.stat.pg, p.state_name))
            .collect()),
        other => bail!("asking the monitors for PG states: unexpected reply {other:?}"),
    }
}

/// Removes `osd` from the map and its key from the monitors (after [`purge_blocker`] and
/// with every PG `active+clean`, unless `force`; like `ceph osd safe-to-destroy` + `purge`).
pub async fn purge(rados: &kelp_client::Rados, osd: i32, force: bool) -> Result<()> {
    if !force && let Some(why) = purge_blocker(&rados.osd_map(), osd)? {
        bail!("refusing to purge osd.{osd}: {why} (--force to remove it anyway)");
    }
    if !force {
        let unclean = unclean_pgs(rados).await?;
        if let Some(first) = unclean.first() {
            bail!(
                "refusing to purge osd.{osd}: {} PG(s) not active+clean yet ({first}); wait for the data to settle (--force to remove it anyway)",
                unclean.len()
            );
        }
    }
    match rados.mon_command(MonCommand::OsdRemove { id: osd }).await? {
        MonReply::Done { .. } => {}
        MonReply::Error { message } => bail!("removing osd.{osd}: {message}"),
        other => bail!("removing osd.{osd}: unexpected reply {other:?}"),
    }
    match rados
        .mon_command(MonCommand::AuthRm {
            entity: format!("osd.{osd}"),
        })
        .await?
    {
        MonReply::Done { .. } => Ok(()),
        MonReply::Error { message } => bail!("removing the key of osd.{osd}: {message}"),
        other => bail!("removing the key of osd.{osd}: unexpected reply {other:?}"),
    }
}

fn osd_crush(cmd: OsdCrushCommand, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let ids = |ids: &[kelp_types::OsdId]| ids.iter().map(|i| i.0).collect::<Vec<_>>();
    let (what, mon) = match &cmd {
        OsdCrushCommand::SetDeviceClass { class, ids: i } => (
            format!("set-device-class {class}"),
            MonCommand::CrushSetDeviceClass {
                class: class.clone(),
                osds: ids(i),
            },
        ),
        OsdCrushCommand::RmDeviceClass { ids: i } => (
            "rm-device-class".to_string(),
            MonCommand::CrushRmDeviceClass { osds: ids(i) },
        ),
        OsdCrushCommand::Rule(OsdCrushRuleCommand::CreateReplicated {
            name,
            root,
            failure_domain,
            class,
        }) => (
            format!("rule create-replicated {name}"),
            MonCommand::CrushRuleCreateReplicated {
                name: name.clone(),
                root: root.clone(),
                failure_domain: failure_domain.clone(),
                class: class.clone(),
            },
        ),
    };
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
        let epoch = match rados.mon_command(mon).await? {
            MonReply::Done { epoch } => epoch,
            MonReply::Error { message } => bail!("{what}: {message}"),
            other => bail!("{what}: unexpected reply {other:?}"),
        };
        // the caller may use the change at once (a pool on the new rule, say)
        rados.wait_for_epoch(epoch).await?;
        match cmd {
            OsdCrushCommand::SetDeviceClass { class, ids: i } => {
                for id in i {
                    eprintln!("osd.{}: device class {class}", id.0);
                }
            }
            OsdCrushCommand::RmDeviceClass { ids: i } => {
                for id in i {
                    eprintln!("osd.{}: no device class", id.0);
                }
            }
            OsdCrushCommand::Rule(OsdCrushRuleCommand::CreateReplicated { name, .. }) => {
                eprintln!("rule {name}: created (or already there)");
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn blocklist(cmd: BlocklistCommand, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
        match cmd {
            BlocklistCommand::Add {
                instance,
                expire_seconds,
            } => {
                let expire = expire_seconds.map(std::time::Duration::from_secs);
                let epoch = rados.blocklist_add(&instance, expire).await?;
                match expire_seconds {
                    Some(s) => {
                        eprintln!("blocklisting {instance} for {s} s (osdmap epoch {epoch})")
                    }
                    None => eprintln!("blocklisting {instance} (osdmap epoch {epoch})"),
                }
            }
            BlocklistCommand::Rm { instance } => {
                let listed = rados
                    .blocklist_ls()
                    .await?
                    .iter()
                    .any(|e| e.instance == instance);
                let epoch = rados.blocklist_rm(&instance).await?;
                if listed {
                    eprintln!("un-blocklisting {instance} (osdmap epoch {epoch})");
                } else {
                    eprintln!("{instance} isn't blocklisted");
                }
            }
            BlocklistCommand::Ls => {
                let entries = rados.blocklist_ls().await?;
                match g.format {
                    OutputFormat::Json => println!(
                        "{}",
                        serde_json::json!(
                            entries
                                .iter()
                                .map(|e| serde_json::json!({
                                    "addr": e.instance,
                                    "until": e.expires.map(format_unix_ms),
                                    "expires_ms": e.expires,
                                }))
                                .collect::<Vec<_>>()
                        )
                    ),
                    OutputFormat::Plain => {
                        for e in &entries {
                            match e.expires {
                                Some(ms) => println!("{} {}", e.instance, format_unix_ms(ms)),
                                None => println!("{} never", e.instance),
                            }
                        }
                        eprintln!("listed {} entries", entries.len());
                    }
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
fn format_unix_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

fn set_flag(a: FlagArgs, on: bool, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    if kelp_maps::ClusterFlag::from_name(&a.flag).is_none() {
        let known: Vec<&str> = kelp_maps::ClusterFlag::ALL
            .iter()
            .map(|f| f.name())
            .collect();
        bail!("unknown flag '{}' (known: {})", a.flag, known.join(", "));
    }
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
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

fn run_daemon(a: RunArgs, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    common::init_logging("info");
    let conf_path = g.conf.path();
    let conf = kelp_config::ClusterConf::load(&conf_path)?;
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
    let cache_budget = match (a.cache, &conf.osd.cache) {
        (Some(c), _) => c,
        (None, Some(text)) => text.parse::<kelp_types::ByteSize>().map_err(|e| {
            anyhow::anyhow!(
                "{}: [osd] cache = {text:?} is not a size: {e}",
                conf_path.display()
            )
        })?,
        (None, None) => StoreConfig::default().cache_budget,
    };
    let threads = a.threads.or(conf.osd.threads);
    if threads == Some(0) {
        bail!("the OSD needs at least one worker thread (--threads / [osd] threads)");
    }
    let store = StoreConfig {
        cache_budget,
        ..StoreConfig::default()
    };
    let opts = kelp_osd::daemon::DaemonOptions {
        id: a.id,
        data: a.data,
        mons: conf.global.mon_host,
        keyring,
        keyring_path: Some(conf.global.keyring.clone()),
        bind: a.addr,
        host,
        crush_weight: weight,
        store,
        osd: kelp_osd::OsdConfig::new(a.id),
        metrics_addr: a.metrics.addr(),
        device_class: a.device_class.clone(),
    };
    let rt = common::runtime_with_threads(threads)?;
    let result = rt.block_on(async {
        common::trim_heap_periodically();
        kelp_osd::daemon::run(opts, common::shutdown_signal()).await
    });
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

fn mark(
    a: IdsArgs,
    cmd: impl Fn(i32) -> MonCommand,
    g: &crate::cmd::common::Global,
) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async {
        let rados = g.conf.connect().await?;
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

fn show(_a: ShowArgs, tree: bool, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    let map = rt.block_on(async { Ok::<_, anyhow::Error>(g.conf.connect().await?.osd_map()) })?;
    match (g.format, tree) {
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

fn df(_a: ShowArgs, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    let digest = rt.block_on(async {
        let rados = g.conf.connect().await?;
        match rados.mon_command(MonCommand::PgStats).await? {
            MonReply::PgStats(d) => Ok(*d),
            other => bail!("unexpected reply from the monitors: {other:?}"),
        }
    })?;
    let status = |o: &kelp_proto::OsdSummary| {
        let state = if o.up { "up" } else { "down" };
        match o.fullness {
            kelp_proto::Fullness::Ok => state.to_string(),
            kelp_proto::Fullness::NearFull => format!("{state},nearfull"),
            kelp_proto::Fullness::BackfillFull => format!("{state},backfillfull"),
            kelp_proto::Fullness::Full => format!("{state},full"),
        }
    };
    let util = |used: u64, total: u64| {
        if total == 0 {
            0.0
        } else {
            used as f64 * 100.0 / total as f64
        }
    };
    let t = &digest.totals;
    match g.format {
        OutputFormat::Json => {
            let nodes: Vec<serde_json::Value> = digest
                .osds
                .iter()
                .map(|o| {
                    serde_json::json!({"id": o.id, "name": format!("osd.{}", o.id),
                        "kb": o.space.total / 1024, "kb_used": o.space.used / 1024,
                        "kb_avail": o.space.available / 1024,
                        "utilization": util(o.space.used, o.space.total),
                        "pgs": o.num_pgs, "status": status(o), "reported": o.reported})
                })
                .collect();
            let v = serde_json::json!({"nodes": nodes, "summary": {
                "total_kb": t.bytes_total / 1024, "total_kb_used": t.bytes_used / 1024,
                "total_kb_avail": t.bytes_avail / 1024,
                "average_utilization": util(t.bytes_used, t.bytes_total)}});
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        OutputFormat::Plain => {
            use crate::cmd::status::human_bytes;
            println!(
                "{:>4}  {:>10}  {:>10}  {:>10}  {:>6}  {:>4}  STATUS",
                "ID", "SIZE", "USE", "AVAIL", "%USE", "PGS"
            );
            for o in &digest.osds {
                if !o.reported {
                    println!(
                        "{:>4}  {:>10}  {:>10}  {:>10}  {:>6}  {:>4}  {} (no report)",
                        o.id,
                        "-",
                        "-",
                        "-",
                        "-",
                        o.num_pgs,
                        status(o)
                    );
                    continue;
                }
                println!(
                    "{:>4}  {:>10}  {:>10}  {:>10}  {:>6.2}  {:>4}  {}",
                    o.id,
                    human_bytes(o.space.total),
                    human_bytes(o.space.used),
                    human_bytes(o.space.available),
                    util(o.space.used, o.space.total),
                    o.num_pgs,
                    status(o)
                );
            }
            println!(
                "{:>4}  {:>10}  {:>10}  {:>10}  {:>6.2}",
                "TOTAL",
                human_bytes(t.bytes_total),
                human_bytes(t.bytes_used),
                human_bytes(t.bytes_avail),
                util(t.bytes_used, t.bytes_total)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `kelp osd perf`.
fn perf(_a: ShowArgs, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    let stats = rt.block_on(async {
        let rados = g.conf.connect().await?;
        match rados.mon_command(MonCommand::OsdPerf).await? {
            MonReply::OsdPerf(v) => Ok(v),
            other => bail!("unexpected reply from the monitors: {other:?}"),
        }
    })?;
    let ms = |ns: u64| ns as f64 / 1e6;
    match g.format {
        OutputFormat::Json => {
            let infos: Vec<serde_json::Value> = stats
                .iter()
                .map(|s| {
                    serde_json::json!({"id": s.id, "perf_stats": {
                        "commit_latency_ms": ms(s.perf.commit_latency_ns),
                        "apply_latency_ms": ms(s.perf.apply_latency_ns),
                        "commit_latency_ns": s.perf.commit_latency_ns,
                        "apply_latency_ns": s.perf.apply_latency_ns}})
                })
                .collect();
            let v = serde_json::json!({ "osd_perf_infos": infos });
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        OutputFormat::Plain => {
            println!(
                "{:>4}  {:>16}  {:>15}",
                "osd", "commit_lat(ms)", "apply_lat(ms)"
            );
            for s in &stats {
                println!(
                    "{:>4}  {:>16.3}  {:>15.3}",
                    s.id,
                    ms(s.perf.commit_latency_ns),
                    ms(s.perf.apply_latency_ns)
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
                "device_class": map.crush.device_class(o.id),
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

#[cfg(test)]
mod blocklist_tests {
    #[test]
    fn unix_ms_prints_as_utc() {
        assert_eq!(super::format_unix_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            super::format_unix_ms(1_795_000_000_123),
            "2026-11-18T11:06:40.123Z"
        );
    }
}
