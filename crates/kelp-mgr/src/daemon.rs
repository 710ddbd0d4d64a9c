//! The manager daemon: beacons to the monitors every second, and while it is the active
//! manager polls the cluster every `poll_interval`, keeps the I/O time series, derives the
//! progress items and publishes them, and serves the dashboard ([`crate::http`]).
//!
//! A standby beacons and serves only a redirect to the active manager's dashboard (or 503 when
//! none is known). When the monitors make it active (the active one fell silent for
//! `mgr_beacon_grace`), it starts polling at once; its time series start empty.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kelp_client::{ClientConfig, Rados};
use kelp_proto::{
    LogEntry, LogLevel, MgrMap, MonCommand, MonReply, OsdScrubCommand, PgScrubSummary, ProgressItem,
};
use kelp_types::PgId;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::auth::{self, Role, Users};
use crate::error::MgrError;
use crate::progress::{Observation, ProgressTracker, with_wave_etas};
use crate::series::{IoSample, Ring};
use crate::view::{BucketInfo, View};

/// What `kelp mgr run` passes.
#[derive(Debug, Clone)]
pub struct MgrOptions {
    /// `x` of `mgr.x`.
    pub name: String,
    pub client: ClientConfig,
    /// Where the dashboard listens (port 0: any free port).
    pub dashboard_addr: SocketAddr,
    /// Seconds between two polls of the cluster while active.
    pub poll_interval: Duration,
    /// Samples of the I/O series kept.
    pub series_len: usize,
    /// How long finished progress items stay listed.
    pub keep_finished: Duration,
    /// A file to write the dashboard's bound address into (`HOST:PORT`).
    pub addr_file: Option<std::path::PathBuf>,
    /// Listen on any free port of the same address when `dashboard_addr`'s port is taken.
    pub any_port_if_taken: bool,
    /// Where to serve Prometheus metrics (`None`: no endpoint). Either way the daemon
    /// announces itself in the service map (`kelp daemon ls`).
    pub metrics_addr: Option<SocketAddr>,
}

impl MgrOptions {
    pub fn new(name: &str, client: ClientConfig, dashboard_addr: SocketAddr) -> MgrOptions {
        MgrOptions {
            name: name.to_string(),
            client,
            dashboard_addr,
            poll_interval: Duration::from_secs(2),
            series_len: 900,
            keep_finished: Duration::from_secs(300),
            addr_file: None,
            any_port_if_taken: false,
            metrics_addr: None,
        }
    }
}

/// State shared by the loops and the HTTP handlers.
pub struct Shared {
    pub name: String,
    pub instance: String,
    /// This daemon's dashboard URL (`http://HOST:PORT/`).
    pub url: String,
    pub rados: Rados,
    pub active: AtomicBool,
    pub mgrmap: RwLock<MgrMap>,
    pub view: RwLock<Option<Arc<View>>>,
    pub series: Mutex<Ring<IoSample>>,
    pub progress: RwLock<Vec<ProgressItem>>,
    users: Mutex<(Users, Option<Instant>)>,
    /// One look at the users at a time.
    refresh: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Bounds every call to the monitors from the loops (their own deadline is long).
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

impl Shared {
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// The active manager's dashboard URL, if another daemon is active.
    pub fn active_url(&self) -> Option<String> {
        let m = self.mgrmap.read().unwrap_or_else(|p| p.into_inner());
        m.active
            .as_ref()
            .filter(|a| a.name != self.name && !a.dashboard_url.is_empty())
            .map(|a| a.dashboard_url.clone())
    }

    pub fn view(&self) -> Option<Arc<View>> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub async fn mon(&self, cmd: MonCommand) -> Option<MonReply> {
        match tokio::time::timeout(CALL_TIMEOUT, self.rados.mon_command(cmd)).await {
            Ok(Ok(r)) => Some(r),
            Ok(Err(e)) => {
                debug!(error = %e, "monitor command failed");
                None
            }
            Err(_) => None,
        }
    }

    /// The role of `name` logging in with `key`. The users are looked up again when the cache
    /// does not know these credentials (or is 30 s old), at most once a second: a failed
    /// attempt waits for the next look (which also slows down guessing).
    pub async fn authenticate(&self, name: &str, key: &str) -> Option<Role> {
        let fresh = |u: &(Users, Option<Instant>)| {
            u.1.is_some_and(|t| t.elapsed() < Duration::from_secs(30))
        };
        {
            let u = lock(&self.users);
            if let Some(role) = u.0.check(name, key)
                && fresh(&u)
            {
                return Some(role);
            }
        }
        let _one_at_a_time = self.refresh.lock().await;
        let since = {
            let u = lock(&self.users);
            if let Some(role) = u.0.check(name, key)
                && fresh(&u)
            {
                return Some(role);
            }
            u.1.map(|t| t.elapsed())
        };
        if let Some(since) = since
            && since < Duration::from_secs(1)
        {
            tokio::time::sleep(Duration::from_secs(1) - since).await;
        }
        self.refresh_users().await;
        lock(&self.users).0.check(name, key)
    }

    async fn refresh_users(&self) {
        lock(&self.users).1 = Some(Instant::now());
        let Some(MonReply::Entities(entities)) = self.mon(MonCommand::AuthList).await else {
            return;
        };
        let dashboard: Vec<String> = entities
            .into_iter()
            .filter(|e| auth::parse_entity(e).is_some())
            .collect();
        let missing: Vec<String> = {
            let mut u = lock(&self.users);
            u.0.retain_entities(&dashboard);
            dashboard
                .iter()
                .filter(|e| {
                    auth::parse_entity(e).is_some_and(|(role, name)| !u.0.contains(name, role))
                })
                .cloned()
                .collect()
        };
        for entity in missing {
            // `AuthGet`, never `AuthGetOrCreate`: a user removed since the list stays removed
            if let Some(MonReply::Key { secret, .. }) = self
                .mon(MonCommand::AuthGet {
                    entity: entity.clone(),
                })
                .await
                && let Some((role, name)) = auth::parse_entity(&entity)
            {
                lock(&self.users).0.insert(name, role, secret);
            }
        }
    }
}

/// Runs the manager until `shutdown` resolves.
pub async fn run(
    opts: MgrOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), MgrError> {
    if !auth::valid_user_name(&opts.name) {
        return Err(MgrError::InvalidName(opts.name.clone()));
    }
    let rados = Rados::connect(opts.client.clone())
        .await
        .map_err(MgrError::Connect)?;
    let listener = match TcpListener::bind(opts.dashboard_addr).await {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && opts.any_port_if_taken => {
            let mut any = opts.dashboard_addr;
            any.set_port(0);
            warn!(addr = %opts.dashboard_addr, "dashboard port taken: listening on a free port");
            TcpListener::bind(any).await
        }
        other => other,
    }
    .map_err(|source| MgrError::Bind {
        addr: opts.dashboard_addr,
        source,
    })?;
    let local = listener.local_addr().map_err(|source| MgrError::Bind {
        addr: opts.dashboard_addr,
        source,
    })?;
    let url = format!("http://{local}/");
    if let Some(path) = &opts.addr_file {
        std::fs::write(path, format!("{local}\n")).map_err(|source| MgrError::AddrFile {
            path: path.clone(),
            source,
        })?;
    }
    let shared = Arc::new(Shared {
        name: opts.name.clone(),
        instance: format!("{:016x}", rand::random::<u64>()),
        url: url.clone(),
        rados,
        active: AtomicBool::new(false),
        mgrmap: RwLock::new(MgrMap::default()),
        view: RwLock::new(None),
        series: Mutex::new(Ring::new(opts.series_len)),
        progress: RwLock::new(Vec::new()),
        users: Mutex::new((Users::default(), None)),
        refresh: tokio::sync::Mutex::new(()),
    });
    info!(mgr = %opts.name, dashboard = %url, "manager started");
    let daemon = format!("mgr.{}", opts.name);
    let mut addrs = BTreeMap::new();
    addrs.insert("dashboard".to_string(), url.clone());
    let _metrics = match opts.metrics_addr {
        Some(at) => {
            let mut reg = kelp_metrics::Registry::new();
            reg.register_common(&daemon, "mgr");
            crate::metrics::register(&mut reg, shared.clone());
            let m = kelp_metrics::serve(at, Arc::new(reg))
                .await
                .map_err(MgrError::Metrics)?;
            info!(url = %m.url(), "metrics endpoint");
            addrs.insert("metrics".to_string(), m.url());
            Some(m)
        }
        None => None,
    };
    let beacons = shared
        .rados
        .spawn_service_beacons(daemon, "mgr".into(), addrs);
    let tasks = [
        tokio::spawn(beacon_loop(shared.clone())),
        tokio::spawn(poll_loop(shared.clone(), opts.clone())),
        tokio::spawn(crate::http::serve(listener, shared.clone())),
    ];
    shutdown.await;
    beacons.abort();
    for t in &tasks {
        t.abort();
    }
    info!(mgr = %opts.name, "manager stopped");
    Ok(())
}

async fn beacon_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let reply = shared
            .mon(MonCommand::MgrBeacon {
                name: shared.name.clone(),
                dashboard_url: shared.url.clone(),
                instance: shared.instance.clone(),
            })
            .await;
        match reply {
            Some(MonReply::MgrBeacon { active, map }) => {
                let was = shared.active.swap(active, Ordering::Relaxed);
                if was != active {
                    info!(mgr = %shared.name, active, "manager role changed");
                }
                *shared.mgrmap.write().unwrap_or_else(|p| p.into_inner()) = map;
            }
            other => {
                debug!(?other, "beacon not acknowledged");
            }
        }
    }
}

async fn poll_loop(shared: Arc<Shared>, opts: MgrOptions) {
    let mut tick = tokio::time::interval(opts.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tracker = ProgressTracker::new(opts.keep_finished.as_millis() as u64);
    let mut scrub_codes: Option<BTreeMap<String, String>> = None;
    let mut buckets: (Vec<BucketInfo>, Option<Instant>) = (Vec::new(), None);
    loop {
        tick.tick().await;
        if !shared.is_active() {
            // a standby keeps nothing: it starts afresh when it becomes active
            scrub_codes = None;
            *shared.view.write().unwrap_or_else(|p| p.into_inner()) = None;
            continue;
        }
        if buckets
            .1
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            buckets = (read_buckets(&shared.rados).await, Some(Instant::now()));
        }
        let view = poll(&shared, buckets.0.clone()).await;
        let now = view.at_ms;
        // time series
        if let Some(d) = &view.digest {
            lock(&shared.series).push(IoSample {
                t_ms: now,
                read_bytes_sec: d.totals.rates.read_bytes_sec,
                write_bytes_sec: d.totals.rates.write_bytes_sec,
                read_op_per_sec: d.totals.rates.read_op_per_sec,
                write_op_per_sec: d.totals.rates.write_op_per_sec,
                recovering_objects_per_sec: d.recovery.recovering_objects_per_sec,
                recovering_bytes_per_sec: d.recovery.recovering_bytes_per_sec,
            });
        }
        // progress
        tracker.observe(&observation(&view));
        let items = with_wave_etas(tracker.items(), now);
        *shared.progress.write().unwrap_or_else(|p| p.into_inner()) = items.clone();
        let _ = shared
            .mon(MonCommand::ProgressReport {
                mgr: shared.name.clone(),
                items,
            })
            .await;
        // scrub errors into the cluster log (the monitors do not see scrub summaries)
        let codes: BTreeMap<String, String> = kelp_health::scrub_checks(&view.scrubs)
            .into_iter()
            .map(|c| (c.code.to_string(), c.summary))
            .collect();
        if let Some(before) = &scrub_codes {
            let mut entries = Vec::new();
            for (code, summary) in &codes {
                if !before.contains_key(code) {
                    entries.push(log_entry(
                        &shared.name,
                        LogLevel::Error,
                        format!("Health check failed: {summary} ({code})"),
                    ));
                }
            }
            for (code, summary) in before {
                if !codes.contains_key(code) {
                    entries.push(log_entry(
                        &shared.name,
                        LogLevel::Info,
                        format!("Health check cleared: {code} (was: {summary})"),
                    ));
                }
            }
            if !entries.is_empty() {
                let _ = shared.mon(MonCommand::LogAppend { entries }).await;
            }
        }
        scrub_codes = Some(codes);
        *shared.view.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(view));
    }
}

fn log_entry(mgr: &str, level: LogLevel, message: String) -> LogEntry {
    LogEntry {
        seq: 0,
        stamp_ms: 0,
        level,
        who: format!("mgr.{mgr}"),
        message,
    }
}

fn observation(v: &View) -> Observation {
    let t = v.digest.as_ref().map(|d| d.totals).unwrap_or_default();
    Observation {
        now_ms: v.at_ms,
        degraded: t.degraded_objects,
        misplaced: t.misplaced_objects,
        scrubbing: v
            .scrubs
            .iter()
            .filter(|(_, s)| s.scrubbing)
            .map(|(pg, s)| (*pg, s.deep))
            .collect(),
        stamps: v
            .scrubs
            .iter()
            .map(|(pg, s)| (*pg, (s.last_scrub_stamp, s.last_deep_scrub_stamp)))
            .collect(),
        resharding: v
            .buckets
            .iter()
            .filter_map(|b| b.reshard.map(|(s, t)| (b.name.clone(), s, t)))
            .collect(),
        snaptrim_left: v.digest.as_ref().map_or(0, |d| d.work.snaptrim_clones_left),
        deleting_left: v
            .digest
            .as_ref()
            .map_or(0, |d| d.work.deleting_objects_left),
        recovered: v
            .digest
            .as_ref()
            .map(|d| d.recovered_objects.clone())
            .unwrap_or_default(),
    }
}

/// One look at the cluster: status, statistics digest, map, scrub summaries.
async fn poll(shared: &Shared, buckets: Vec<BucketInfo>) -> View {
    let status = match shared.mon(MonCommand::Status).await {
        Some(MonReply::Status(s)) => Some(s),
        _ => None,
    };
    let digest = match shared.mon(MonCommand::PgStats).await {
        Some(MonReply::PgStats(d)) => Some(*d),
        _ => None,
    };
    if let Some(d) = &digest {
        let _ = tokio::time::timeout(Duration::from_secs(1), shared.rados.wait_for_epoch(d.epoch))
            .await;
    }
    let map = shared.rados.osd_map();
    let scrubs = scrub_summaries(&shared.rados, &map).await;
    let mgrmap = shared
        .mgrmap
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    View::new(unix_ms(), map, status, digest, scrubs, mgrmap, buckets)
}

async fn scrub_summaries(rados: &Rados, map: &kelp_maps::OsdMap) -> BTreeMap<PgId, PgScrubSummary> {
    let asks = map.osds.values().filter(|o| o.up).map(|o| {
        let id = o.id;
        async move {
            rados
                .osd_scrub_command(id, OsdScrubCommand::Summaries, Duration::from_secs(2))
                .await
        }
    });
    let mut out = BTreeMap::new();
    for r in futures::future::join_all(asks).await.into_iter().flatten() {
        out.extend(r.pgs);
    }
    out
}

/// The S3 gateway's metadata pool (see kelp-rgw's `layout`).
pub const RGW_META_POOL: &str = "kelp.rgw.meta";
/// At most this many buckets are read per look.
const MAX_BUCKETS: usize = 10_000;

/// The buckets the gateways recorded: names and owners from the `buckets` omap of the
/// metadata pool, details from each `bucket.<name>` record (JSON).
async fn read_buckets(rados: &Rados) -> Vec<BucketInfo> {
    if rados.osd_map().pool_by_name(RGW_META_POOL).is_none() {
        return Vec::new();
    }
    let Ok(io) = rados.ioctx(RGW_META_POOL).await else {
        return Vec::new();
    };
    let mut names: Vec<(String, String)> = Vec::new();
    let mut after = String::new();
    loop {
        let Ok(Ok((page, more))) =
            tokio::time::timeout(CALL_TIMEOUT, io.omap_get_vals("buckets", &after, "", 1000)).await
        else {
            break;
        };
        if let Some((k, _)) = page.last() {
            after = k.clone();
        }
        names.extend(
            page.into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned())),
        );
        if !more || names.len() >= MAX_BUCKETS {
            break;
        }
    }
    let usage = read_bucket_usage(&io).await;
    let (io, usage) = (&io, &usage);
    futures::stream::iter(names)
        .map(|(name, owner)| async move {
            let record =
                tokio::time::timeout(CALL_TIMEOUT, io.read(&format!("bucket.{name}"), 0, 1 << 20))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
            let r = record.unwrap_or_default();
            BucketInfo {
                owner: r["owner"].as_str().map_or(owner, str::to_string),
                shards: r["shards"].as_u64().unwrap_or(0) as u32,
                created_ms: r["created_ns"].as_u64().unwrap_or(0) / 1_000_000,
                reshard: r.get("reshard").and_then(|t| {
                    Some((
                        t["shards"].as_u64()? as u32,
                        t["started_ns"].as_u64().unwrap_or(0) / 1_000_000,
                    ))
                }),
                usage: usage.get(&name).copied(),
                name,
            }
        })
        .buffered(16)
        .collect()
        .await
}

/// The gateways' count of each bucket's objects and stored bytes: the omap of
/// `bucket_usage` in the metadata pool (kelp-rgw's `usage`), bucket -> JSON.
async fn read_bucket_usage(io: &kelp_client::IoCtx) -> HashMap<String, (u64, u64)> {
    let mut out = HashMap::new();
    let mut after = String::new();
    loop {
        let Ok(Ok((page, more))) = tokio::time::timeout(
            CALL_TIMEOUT,
            io.omap_get_vals(RGW_USAGE_OBJ, &after, "", 1000),
        )
        .await
        else {
            break;
        };
        if let Some((k, _)) = page.last() {
            after = k.clone();
        }
        let n = page.len();
        for (k, v) in page {
            if let Ok(u) = serde_json::from_slice::<serde_json::Value>(&v) {
                let objects = u["objects"].as_u64().unwrap_or(0);
                out.insert(k, (objects, u["bytes"].as_u64().unwrap_or(0)));
            }
        }
        if !more || n == 0 || out.len() >= MAX_BUCKETS {
            break;
        }
    }
    out
}

/// The object of the metadata pool where the gateways publish bucket usage.
pub const RGW_USAGE_OBJ: &str = "bucket_usage";

/// Logs a failure of an admin action for the operator.
pub fn warn_action(what: &str, e: &dyn std::fmt::Display) {
    warn!(action = what, error = %e, "dashboard action failed");
}
