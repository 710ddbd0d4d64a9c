//! Scrub and repair: the PG's primary compares every member's copy of every object.
//!
//! A scrub walks the PG in placement-hash order, in chunks of at most `osd_scrub_chunk_max`
//! objects, sleeping `osd_scrub_sleep` between chunks so that client I/O keeps its share.
//! For each chunk the primary blocks client *writes* to objects in the chunk's range (reads
//! continue), waits until no write to the range is in flight, and asks every acting member for
//! its *scrub map* of the range: per object its size, version, a digest of its attributes and of
//! its omap, and — in a deep scrub — a digest of its data, read in full so that the store
//! verifies every block's crc32c (a failing block becomes a read error, never data). Because
//! writes to the range are held back, every member describes the same history. The primary then
//! compares the maps (`compare_chunk`, pure), picks the authoritative copy of each object
//! (`choose_authoritative`: a copy without a read error; then the version the PG log names as
//! the newest; then the majority; then the primary), and, in a repair, pushes the
//! authoritative copy to every member whose copy is bad before it re-reads the chunk (deep) to
//! verify. Only then are writes to the range let through.
//!
//! The primary keeps each PG's summary (stamps, error counts) and the inconsistent objects of
//! its last scrub; both are also stored as an attribute of the PG's metadata object, so they
//! survive a restart. Scheduled scrubs follow `osd_scrub_min_interval`,
//! `osd_scrub_max_interval`, `osd_deep_scrub_interval` and `osd_scrub_load_threshold` and
//! honour the `noscrub`/`nodeep-scrub` flags; operator requests ignore the flags, as in Ceph.
//! One scrub runs at a time per OSD (Ceph's `osd_max_scrubs = 1`).
//!
//! The OSD around this module is a `ScrubHost` (a `PgHost` that keeps the `Scrubber`): the
//! service implements it and calls `start`, the member-side requests (`scrub_map`, `pg_push`),
//! the operator commands and `repair_from_replica`; nothing here names the service.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kelp_maps::{ClusterFlag, OsdMap};
use kelp_proto::{
    ConfigEntry, ErrorCode, InconsistentObject, OsdScrubCommand, OsdScrubReply, PgCommand,
    PgCommandKind, PgCommandReply, PgPull, PgPullReply, PgPush, PgPushReply, PgScrubSummary,
    ScrubMapReply, ScrubMapRequest, ScrubObject, ShardError, ShardReport,
};
use kelp_store::{CollectionId, ObjectId, ObjectStore, Transaction};
use kelp_types::PgId;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::error::OsdError;
use crate::host::PgHost;
use crate::object_state::{apply_state, peer_addr, read_state};
use crate::pg::{PgHandle, PgState};
use crate::pglog::PgMeta;
pub(crate) use crate::scrub_map::ScrubBlock;
pub use crate::scrub_map::{Authority, LogHint, choose_authoritative, compare_chunk};
use crate::scrub_map::{build_map, cursor_oid, in_range, oid_cursor};

/// What scrub and repair need from the OSD they run in, beyond `PgHost`: the scrub
/// bookkeeping it keeps for them.
pub(crate) trait ScrubHost: PgHost {
    /// This OSD's scrub settings, queue, summaries and inconsistent objects.
    fn scrubber(&self) -> &Scrubber;
}

/// Attribute of the PG metadata object holding the scrub record.
const RECORD_ATTR: &str = "scrub";
const RECORD_FORMAT: u8 = 1;

/// Scrub settings (Ceph's names and defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct ScrubConfig {
    /// `osd_scrub_chunk_max`: objects compared per chunk (writes to a chunk wait while it is
    /// compared).
    pub chunk_max: usize,
    /// `osd_scrub_sleep`: pause between chunks.
    pub sleep: Duration,
    /// `osd_scrub_min_interval`: a PG is scrubbed on schedule once this long has passed since
    /// its last scrub, if the load allows.
    pub min_interval: Duration,
    /// `osd_scrub_max_interval`: past this, a PG is scrubbed whatever the load.
    pub max_interval: Duration,
    /// `osd_deep_scrub_interval`: a PG is deep-scrubbed on schedule this long after its last
    /// deep scrub.
    pub deep_interval: Duration,
    /// `osd_scrub_load_threshold`: scheduled scrubs (below `max_interval`) wait while the
    /// 1-minute load average divided by the number of CPUs is above this.
    pub load_threshold: f64,
    /// How often the scheduler looks for due PGs.
    pub tick: Duration,
}

impl Default for ScrubConfig {
    fn default() -> Self {
        use kelp_config::keys;
        ScrubConfig {
            chunk_max: keys::OSD_SCRUB_CHUNK_MAX.default.as_u64() as _,
            sleep: keys::OSD_SCRUB_SLEEP.default.as_duration(),
            min_interval: keys::OSD_SCRUB_MIN_INTERVAL.default.as_duration(),
            max_interval: keys::OSD_SCRUB_MAX_INTERVAL.default.as_duration(),
            deep_interval: keys::OSD_DEEP_SCRUB_INTERVAL.default.as_duration(),
            load_threshold: keys::OSD_SCRUB_LOAD_THRESHOLD.default.as_f64() as _,
            tick: Duration::from_secs(1),
        }
    }
}

impl ScrubConfig {
    /// Applies one central-config key; false if the key is not a scrub key or the value does
    /// not parse.
    pub fn set(&mut self, key: &str, value: &str) -> bool {
        let secs = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|s| *s >= 0.0 && s.is_finite())
        };
        match key {
            "osd_scrub_chunk_max" => match value.parse::<usize>() {
                Ok(n) if n > 0 => self.chunk_max = n,
                _ => return false,
            },
            "osd_scrub_sleep" => match secs() {
                Some(s) => self.sleep = Duration::from_secs_f64(s),
                None => return false,
            },
            "osd_scrub_min_interval" => match secs() {
                Some(s) => self.min_interval = Duration::from_secs_f64(s),
                None => return false,
            },
            "osd_scrub_max_interval" => match secs() {
                Some(s) => self.max_interval = Duration::from_secs_f64(s),
                None => return false,
            },
            "osd_deep_scrub_interval" => match secs() {
                Some(s) => self.deep_interval = Duration::from_secs_f64(s),
                None => return false,
            },
            "osd_scrub_load_threshold" => match secs() {
                Some(s) => self.load_threshold = s,
                None => return false,
            },
            _ => return false,
        }
        true
    }

    /// This OSD's scrub settings from the central config table: `osd.N` over `osd` over
    /// `global` over `self` (the local defaults).
    pub fn with_central(&self, entries: &[ConfigEntry], osd: i32) -> ScrubConfig {
        let me = format!("osd.{osd}");
        let mut out = self.clone();
        for who in ["global", "osd", me.as_str()] {
            for e in entries.iter().filter(|e| e.who == who) {
                out.set(&e.key, &e.value);
            }
        }
        out
    }
}

/// Which scheduled scrub a PG is due for, if any: `Some(true)` deep, `Some(false)` shallow.
/// `now` and the summary's stamps are Unix seconds.
pub fn scheduled_kind(
    now: u64,
    s: &PgScrubSummary,
    cfg: &ScrubConfig,
    flags: (bool, bool),
    load_ok: bool,
) -> Option<bool> {
    let (noscrub, nodeep) = flags;
    let since = |stamp: u64| Duration::from_secs(now.saturating_sub(stamp));
    let must = since(s.last_scrub_stamp) >= cfg.max_interval;
    let deep_due = since(s.last_deep_scrub_stamp) >= cfg.deep_interval;
    if deep_due && !nodeep && (load_ok || must) {
        return Some(true);
    }
    let due = since(s.last_scrub_stamp) >= cfg.min_interval && (load_ok || must);
    if due && !noscrub {
        return Some(false);
    }
    None
}

/// The 1-minute load average per CPU is at most `threshold` (true if it cannot be read).
fn load_ok(threshold: f64) -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/loadavg") else {
        return true;
    };
    let Some(load) = s
        .split_whitespace()
        .next()
        .and_then(|v| v.parse::<f64>().ok())
    else {
        return true;
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    load / cpus <= threshold
}

// ---------------------------------------------------------------------------------------------
// Per-OSD scrub state.

/// The part of a PG's scrub state that is stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Record {
    summary: PgScrubSummary,
    inconsistent: Vec<InconsistentObject>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Request {
    deep: bool,
    repair: bool,
    seq: u64,
}

#[derive(Debug, Default)]
struct PgScrub {
    summary: PgScrubSummary,
    inconsistent: Vec<InconsistentObject>,
    queued: Option<Request>,
}

/// Scrub bookkeeping of one OSD.
#[derive(Debug)]
pub struct Scrubber {
    cfg: Mutex<ScrubConfig>,
    pgs: Mutex<HashMap<PgId, PgScrub>>,
    next_seq: Mutex<u64>,
    wake: Arc<Notify>,
}

impl Scrubber {
    pub fn new(cfg: ScrubConfig) -> Scrubber {
        Scrubber {
            cfg: Mutex::new(cfg),
            pgs: Mutex::new(HashMap::new()),
            next_seq: Mutex::new(0),
            wake: Arc::new(Notify::new()),
        }
    }

    /// The scrub settings in force.
    pub(crate) fn config(&self) -> ScrubConfig {
        self.cfg.lock().expect("scrub config").clone()
    }

    /// Replaces the scrub settings (from the central config).
    pub(crate) fn set_config(&self, cfg: ScrubConfig) {
        let mut cur = self.cfg.lock().expect("scrub config");
        if *cur != cfg {
            info!(?cfg, "scrub settings changed");
            *cur = cfg;
        }
    }

    /// Loads a PG's stored record (blocking), or starts its stamps now so that a new PG is not
    /// scrubbed at once.
    pub(crate) fn load(&self, store: &dyn ObjectStore, pg: PgId) {
        let coll = CollectionId(pg);
        let stored = store
            .xattr(coll, &PgMeta::meta_oid(coll), RECORD_ATTR)
            .ok()
            .flatten()
            .and_then(|v| match v.split_first() {
                Some((&RECORD_FORMAT, body)) => postcard::from_bytes::<Record>(body).ok(),
                _ => None,
            });
        let rec = stored.unwrap_or_else(|| {
            let now = now_secs();
            Record {
                summary: PgScrubSummary {
                    last_scrub_stamp: now,
                    last_deep_scrub_stamp: now,
                    ..PgScrubSummary::default()
                },
                inconsistent: Vec::new(),
            }
        });
        let mut pgs = self.pgs.lock().expect("scrub table");
        let e = pgs.entry(pg).or_default();
        e.summary = rec.summary;
        e.summary.scrubbing = false;
        e.inconsistent = rec.inconsistent;
    }

    /// A PG's scrub summary, if this OSD keeps one for it.
    pub(crate) fn summary_of(&self, pg: PgId) -> Option<PgScrubSummary> {
        self.pgs
            .lock()
            .expect("scrub table")
            .get(&pg)
            .map(|p| p.summary.clone())
    }

    fn summary(&self, pg: PgId) -> PgScrubSummary {
        self.summary_of(pg).unwrap_or_default()
    }

    /// Queues a request (merged with one already queued); returns its sequence number.
    fn queue(&self, pg: PgId, deep: bool, repair: bool) -> u64 {
        let seq = {
            let mut n = self.next_seq.lock().expect("scrub seq");
            *n += 1;
            *n
        };
        let mut pgs = self.pgs.lock().expect("scrub table");
        let e = pgs.entry(pg).or_default();
        // Sequence numbers are per OSD; a PG's completed_seq must not jump past a request
        // queued for it, so a merged request takes the newest number.
        e.queued = Some(match e.queued {
            Some(q) => Request {
                deep: q.deep || deep,
                repair: q.repair || repair,
                seq,
            },
            None => Request { deep, repair, seq },
        });
        drop(pgs);
        self.wake.notify_one();
        seq
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Result of scrubbing one PG.
struct Outcome {
    objects: u64,
    inconsistent: Vec<InconsistentObject>,
    repaired: u64,
}

/// Clears a PG's scrub block when dropped (also on cancellation).
struct BlockGuard {
    pg: Option<PgHandle>,
}

impl BlockGuard {
    async fn release(mut self) {
        if let Some(pg) = self.pg.take() {
            let mut st = pg.write().await;
            st.scrub_block = None;
            st.changed.notify_waiters();
        }
    }
}

impl Drop for BlockGuard {
    fn drop(&mut self) {
        let Some(pg) = self.pg.take() else { return };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let mut st = pg.write().await;
                st.scrub_block = None;
                st.changed.notify_waiters();
            });
        }
    }
}

fn blocking_err(e: tokio::task::JoinError) -> OsdError {
    OsdError::task("scrub", e)
}

/// Runs queued and scheduled scrubs, one at a time, until the host is dropped.
pub(crate) fn start<H: ScrubHost>(host: &Arc<H>) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(host);
    tokio::spawn(async move {
        loop {
            let Some(this) = weak.upgrade() else { return };
            let tick = this.scrubber().config().tick;
            match next_scrub(&*this) {
                Some((pg, req)) => run_scrub(&*this, pg, req).await,
                None => {
                    let wake = this.scrubber().wake.clone();
                    drop(this);
                    let _ = tokio::time::timeout(tick, wake.notified()).await;
                }
            }
        }
    })
}

/// The PG to scrub next: an operator request first (repairs, then deep), else a PG whose
/// schedule is due.
fn next_scrub<H: ScrubHost>(host: &H) -> Option<(PgId, Request)> {
    let map = host.map();
    let me = host.id();
    let primary_of = |pg: PgId| map.pg_mapping(pg).is_ok_and(|m| m.acting_primary == me);
    let s = host.scrubber();
    let mut pgs = s.pgs.lock().expect("scrub table");
    let queued = pgs
        .iter()
        .filter_map(|(&pg, p)| p.queued.map(|q| (pg, q)))
        .filter(|(pg, _)| primary_of(*pg))
        .max_by_key(|(_, q)| (q.repair, q.deep, std::cmp::Reverse(q.seq)));
    if let Some((pg, q)) = queued {
        if let Some(p) = pgs.get_mut(&pg) {
            p.queued = None;
        }
        return Some((pg, q));
    }
    let cfg = s.config();
    let flags = (
        map.flags.contains(&ClusterFlag::NoScrub),
        map.flags.contains(&ClusterFlag::NoDeepScrub),
    );
    if flags.0 && flags.1 {
        return None;
    }
    let now = now_secs();
    let load = load_ok(cfg.load_threshold);
    // Only PGs that serve I/O now with every member in sync (a member still being
    // recovered holds stale copies; a busy lock just means "not this tick").
    let active = |pg: PgId| {
        let Ok(m) = map.pg_mapping(pg) else {
            return false;
        };
        host.pg_handle(pg).is_some_and(|h| {
            h.try_read().is_ok_and(|st| {
                st.active.as_deref() == Some(&m.acting[..]) && st.left_behind.is_empty()
            })
        })
    };
    let mut due: Vec<(u64, PgId, bool)> = pgs
        .iter()
        .filter(|(pg, _)| primary_of(**pg) && active(**pg))
        .filter_map(|(&pg, p)| {
            scheduled_kind(now, &p.summary, &cfg, flags, load).map(|deep| {
                let stamp = if deep {
                    p.summary.last_deep_scrub_stamp
                } else {
                    p.summary.last_scrub_stamp
                };
                (stamp, pg, deep)
            })
        })
        .collect();
    due.sort();
    let (_, pg, deep) = due.first().copied()?;
    Some((
        pg,
        Request {
            deep,
            repair: false,
            seq: 0,
        },
    ))
}

/// Scrubs one PG and records the outcome (in memory and in the store).
async fn run_scrub<H: ScrubHost>(host: &H, pg: PgId, req: Request) {
    let s = host.scrubber();
    {
        let mut pgs = s.pgs.lock().expect("scrub table");
        let p = pgs.entry(pg).or_default();
        p.summary.scrubbing = true;
        p.summary.deep = req.deep || req.repair;
        p.summary.repair = req.repair;
    }
    let deep = req.deep || req.repair;
    let started = std::time::Instant::now();
    let result = scrub_pg(host, pg, deep, req.repair).await;
    let record = {
        let mut pgs = s.pgs.lock().expect("scrub table");
        let p = pgs.entry(pg).or_default();
        p.summary.scrubbing = false;
        p.summary.deep = false;
        p.summary.repair = false;
        p.summary.completed_seq = p.summary.completed_seq.max(req.seq);
        match result {
            Ok(out) => {
                let now = now_secs();
                p.summary.last_scrub_stamp = now;
                if deep {
                    p.summary.last_deep_scrub_stamp = now;
                }
                p.summary.objects_scrubbed = out.objects;
                p.summary.num_objects_inconsistent = out.inconsistent.len() as u64;
                p.summary.num_scrub_errors = out
                    .inconsistent
                    .iter()
                    .map(|o| o.bad_osds().len() as u64)
                    .sum();
                p.summary.num_objects_unrepairable = out
                    .inconsistent
                    .iter()
                    .filter(|o| o.auth_osd.is_none())
                    .count() as u64;
                p.summary.num_objects_repaired = out.repaired;
                p.summary.last_error = None;
                let level = if out.inconsistent.is_empty() {
                    tracing::Level::INFO
                } else {
                    tracing::Level::WARN
                };
                if level == tracing::Level::WARN {
                    warn!(%pg, deep, repair = req.repair, objects = out.objects,
                        inconsistent = out.inconsistent.len(), repaired = out.repaired,
                        "scrub found inconsistent objects");
                } else {
                    info!(%pg, deep, repair = req.repair, objects = out.objects,
                        repaired = out.repaired, elapsed = ?started.elapsed(), "scrub ok");
                }
                p.inconsistent = out.inconsistent;
                Some(Record {
                    summary: p.summary.clone(),
                    inconsistent: p.inconsistent.clone(),
                })
            }
            Err(e) => {
                warn!(%pg, deep, "scrub did not complete: {e}");
                p.summary.last_error = Some(e.to_string());
                None
            }
        }
    };
    if let Some(rec) = record
        && let Err(e) = save_record(host, pg, &rec).await
    {
        warn!(%pg, "storing the scrub record: {e}");
    }
}

async fn save_record<H: PgHost>(host: &H, pg: PgId, rec: &Record) -> Result<(), OsdError> {
    let mut value = vec![RECORD_FORMAT];
    value.extend(postcard::to_stdvec(rec).map_err(|e| OsdError::Encoding {
        what: "scrub record",
        reason: e.to_string(),
    })?);
    let coll = CollectionId(pg);
    let mut txn = Transaction::new();
    let mut attrs = BTreeMap::new();
    attrs.insert(RECORD_ATTR.to_string(), value);
    txn.push(kelp_store::Op::SetXattrs {
        coll,
        oid: PgMeta::meta_oid(coll),
        attrs,
    });
    host.commit(txn).await
}

/// The acting set this OSD serves `pg` for as its primary at the current map.
async fn serving<H: PgHost>(
    host: &H,
    pg: PgId,
) -> Result<(Arc<OsdMap>, Vec<i32>, PgHandle), OsdError> {
    let map = host.map();
    let m = map.pg_mapping(pg).map_err(|_| OsdError::NoSuchPg { pg })?;
    if m.acting_primary != host.id() {
        return Err(OsdError::NotPrimary {
            pg,
            epoch: map.epoch,
            osd: host.id(),
        });
    }
    let handle = host.pg_handle(pg).ok_or(OsdError::PgNotOpen { pg })?;
    {
        let st = handle.read().await;
        if st.active.as_deref() != Some(&m.acting[..]) {
            return Err(OsdError::PgBusy {
                pg,
                reason: "not active".into(),
            });
        }
        if !st.left_behind.is_empty() {
            return Err(OsdError::PgBusy {
                pg,
                reason: format!(
                    "recovering members {:?}: scrub it once they are in sync",
                    st.left_behind
                ),
            });
        }
    }
    Ok((map, m.acting, handle))
}

/// Holds back writes to `[start, end)` once none is in flight there.
async fn block_range(
    handle: &PgHandle,
    acting: &[i32],
    start: Option<&ObjectId>,
    end: Option<&ObjectId>,
) -> Result<BlockGuard, OsdError> {
    loop {
        let mut st = handle.write().await;
        if st.active.as_deref() != Some(acting) {
            return Err(OsdError::PgBusy {
                pg: st.meta.coll.0,
                reason: "re-peered during the scrub".into(),
            });
        }
        let busy = st
            .in_flight
            .values()
            .any(|o| in_range(&crate::exec::object_id(o), start, end));
        if !busy {
            st.scrub_block = Some(ScrubBlock {
                start: start.cloned(),
                end: end.cloned(),
            });
            return Ok(BlockGuard {
                pg: Some(handle.clone()),
            });
        }
        let changed = st.changed.clone();
        let settled = changed.notified();
        drop(st);
        settled.await;
    }
}

/// Every member's scrub map of `[start, end)`.
async fn gather_maps<H: PgHost>(
    host: &H,
    pg: PgId,
    map: &OsdMap,
    acting: &[i32],
    start: Option<&ObjectId>,
    end: Option<&ObjectId>,
    deep: bool,
) -> Result<BTreeMap<i32, Vec<ScrubObject>>, OsdError> {
    let me = host.id();
    let req = ScrubMapRequest {
        pg,
        epoch: map.epoch,
        start: start.map(oid_cursor),
        end: end.map(oid_cursor),
        deep,
    };
    let mut remote = Vec::new();
    for &osd in acting.iter().filter(|&&o| o != me) {
        let addr = peer_addr(map, osd)?;
        let peers = host.peers();
        let r = req.clone();
        remote.push(async move { (osd, peers.scrub_map(osd, addr, r).await) });
    }
    let local = async {
        let store = host.store();
        let coll = CollectionId(pg);
        let (s, e) = (start.cloned(), end.cloned());
        let ec = crate::ec::shard_of(map, pg, me).is_some();
        tokio::task::spawn_blocking(move || {
            build_map(&*store, coll, s.as_ref(), e.as_ref(), deep, ec)
        })
        .await
        .map_err(blocking_err)?
        .map_err(OsdError::from)
    };
    let (local, remote) = tokio::join!(local, futures::future::join_all(remote));
    let mut maps = BTreeMap::new();
    maps.insert(me, local?);
    for (osd, r) in remote {
        let r = r?;
        if let Some(e) = r.error {
            return Err(OsdError::remote(osd, e));
        }
        maps.insert(osd, r.objects);
    }
    Ok(maps)
}

/// Scrubs every chunk of a PG (repairing what it can if `repair`).
async fn scrub_pg<H: ScrubHost>(
    host: &H,
    pg: PgId,
    deep: bool,
    repair: bool,
) -> Result<Outcome, OsdError> {
    // A PG that is still peering (an OSD just restarted) gets a moment to activate.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (map, acting, handle) = loop {
        match serving(host, pg).await {
            Ok(s) => break s,
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    let coll = CollectionId(pg);
    let mut out = Outcome {
        objects: 0,
        inconsistent: Vec::new(),
        repaired: 0,
    };
    let mut start: Option<ObjectId> = None;
    loop {
        let cfg = host.scrubber().config();
        let store = host.store();
        let from = start.clone();
        let max = cfg.chunk_max.max(1);
        let page =
            tokio::task::spawn_blocking(move || store.list_objects(coll, from.as_ref(), max))
                .await
                .map_err(blocking_err)??;
        let end = page.next;
        let block = block_range(&handle, &acting, start.as_ref(), end.as_ref()).await?;
        let result = scrub_chunk(
            host,
            pg,
            &map,
            &acting,
            &handle,
            start.as_ref(),
            end.as_ref(),
            deep,
            repair,
        )
        .await;
        block.release().await;
        let (objects, bad, repaired) = result?;
        out.objects += objects;
        out.inconsistent.extend(bad);
        out.repaired += repaired;
        if host.map().pg_mapping(pg).map(|m| m.acting).ok().as_deref() != Some(&acting[..]) {
            return Err(OsdError::PgBusy {
                pg,
                reason: "the acting set changed during the scrub".into(),
            });
        }
        match end {
            None => return Ok(out),
            Some(e) => start = Some(e),
        }
        if !cfg.sleep.is_zero() {
            tokio::time::sleep(cfg.sleep).await;
        }
    }
}

/// One chunk, with writes to it held back: compare, repair, verify. Returns (objects
/// seen, inconsistent objects left, objects repaired).
#[allow(clippy::too_many_arguments)]
async fn scrub_chunk<H: ScrubHost>(
    host: &H,
    pg: PgId,
    map: &OsdMap,
    acting: &[i32],
    handle: &PgHandle,
    start: Option<&ObjectId>,
    end: Option<&ObjectId>,
    deep: bool,
    repair: bool,
) -> Result<(u64, Vec<InconsistentObject>, u64), OsdError> {
    let me = host.id();
    let log_hints = |st: &PgState| {
        let mut h = HashMap::new();
        for e in st.meta.entries() {
            h.insert(
                (e.object.namespace.clone(), e.object.name.clone()),
                LogHint {
                    version: e.version,
                    deleted: e.deleted,
                },
            );
        }
        h
    };
    let hints = log_hints(&*handle.read().await);
    let maps = gather_maps(host, pg, map, acting, start, end, deep).await?;
    let objects = maps
        .values()
        .flat_map(|v| v.iter().map(|o| (o.hash, &o.namespace, &o.name)))
        .collect::<BTreeSet<_>>()
        .len() as u64;
    let mut bad = compare_chunk(&maps, me, &hints);
    if deep && let Some(profile) = map.pools.get(&pg.pool.0).and_then(|p| p.ec()) {
        bad.extend(ec_parity_errors(host, pg, map, profile, &maps, &bad).await?);
    }
    if !repair || bad.is_empty() {
        return Ok((objects, bad, 0));
    }
    let mut repaired = 0;
    for obj in &bad {
        let hash = maps
            .values()
            .flatten()
            .find(|o| o.namespace == obj.namespace && o.name == obj.name)
            .map_or(0, |o| o.hash);
        let oid = ObjectId::new(pg.pool.0, &obj.namespace, &obj.name, hash);
        let (state, data) = match obj.auth_osd {
            None if obj.errors.contains(&ShardError::Stale) => (absent(), Bytes::new()),
            None => continue, // nothing good to copy
            Some(osd) if osd == me => {
                let store = host.store();
                let o = oid.clone();
                tokio::task::spawn_blocking(move || read_state(&*store, CollectionId(pg), &o))
                    .await
                    .map_err(blocking_err)??
            }
            Some(osd) => {
                let addr = peer_addr(map, osd)?;
                let (r, d) = host
                    .peers()
                    .pull(
                        osd,
                        addr,
                        PgPull {
                            pg,
                            epoch: map.epoch,
                            namespace: obj.namespace.clone(),
                            name: obj.name.clone(),
                            shard: None,
                        },
                    )
                    .await?;
                if let Some((code, msg)) = r.error {
                    return Err(OsdError::Remote {
                        osd,
                        code,
                        message: format!("pulling '{}': {msg}", obj.name),
                    });
                }
                (r, d)
            }
        };
        let ec_pool = crate::ec::shard_of(map, pg, me).is_some();
        for bad_osd in obj.bad_osds() {
            // Erasure-coded pools: every member holds a different shard; a bad one is rebuilt
            // for its position from the others, never copied from another member.
            let (state, data) = if ec_pool {
                let shard = crate::ec::shard_of(map, pg, bad_osd);
                let source = if bad_osd == me {
                    obj.auth_osd.filter(|&a| a != me)
                } else {
                    Some(me)
                };
                let Some(source) = source else { continue };
                let addr = peer_addr(map, source)?;
                let (r, d) = host
                    .peers()
                    .pull(
                        source,
                        addr,
                        PgPull {
                            pg,
                            epoch: map.epoch,
                            namespace: obj.namespace.clone(),
                            name: obj.name.clone(),
                            shard,
                        },
                    )
                    .await?;
                if let Some((code, msg)) = r.error {
                    return Err(OsdError::Remote {
                        osd: source,
                        code,
                        message: format!("rebuilding '{}': {msg}", obj.name),
                    });
                }
                (r, d)
            } else {
                (state.clone(), data.clone())
            };
            let push = PgPush {
                pg,
                epoch: map.epoch,
                hash,
                namespace: obj.namespace.clone(),
                name: obj.name.clone(),
                state: state.clone(),
            };
            let reply = if bad_osd == me {
                pg_push(host, push, data.clone()).await
            } else {
                let addr = peer_addr(map, bad_osd)?;
                host.peers().push(bad_osd, addr, push, data.clone()).await?
            };
            if let Some((code, msg)) = reply.error {
                return Err(OsdError::Remote {
                    osd: bad_osd,
                    code,
                    message: format!("repairing '{}': {msg}", obj.name),
                });
            }
        }
        info!(%pg, object = %obj.name, auth = ?obj.auth_osd, bad = ?obj.bad_osds(), "repaired");
        repaired += 1;
    }
    // Verify: the chunk again, deep, with writes still held back.
    let maps = gather_maps(host, pg, map, acting, start, end, true).await?;
    let left = compare_chunk(&maps, me, &hints);
    Ok((objects, left, repaired))
}

/// Deep scrub of an erasure-coded PG: shards hold different bytes, so their comparison
/// (`compare_chunk`) covers metadata and read errors only; here the primary reads every shard
/// of each object the comparison found consistent and checks that parity agrees with the data
/// (`ec::check_parity`). A single shard to blame is reported bad (repair rebuilds it from the
/// others); a disagreement no single shard explains is reported with no copy to trust.
async fn ec_parity_errors<H: ScrubHost>(
    host: &H,
    pg: PgId,
    map: &OsdMap,
    profile: &kelp_ec::Profile,
    maps: &BTreeMap<i32, Vec<ScrubObject>>,
    already: &[InconsistentObject],
) -> Result<Vec<InconsistentObject>, OsdError> {
    let me = host.id();
    let Some(mine) = maps.get(&me) else {
        return Ok(Vec::new());
    };
    let Ok(mapping) = map.pg_mapping(pg) else {
        return Ok(Vec::new());
    };
    let members = crate::ec_io::positions(&mapping);
    let mut out = Vec::new();
    for o in mine {
        if o.read_error.is_some()
            || already
                .iter()
                .any(|b| b.namespace == o.namespace && b.name == o.name)
        {
            continue;
        }
        let object = kelp_proto::ObjectLocator {
            pool: pg.pool.0,
            namespace: o.namespace.clone(),
            key: None,
            name: o.name.clone(),
        };
        let oid = ObjectId::new(pg.pool.0, &o.namespace, &o.name, o.hash);
        let store = host.store();
        let coll = CollectionId(pg);
        let attrs = {
            let oid = oid.clone();
            tokio::task::spawn_blocking(move || crate::ec_io::local_attrs(&*store, coll, &oid))
                .await
                .map_err(blocking_err)?
        };
        let Ok(attrs) = attrs else { continue };
        let Some(meta) = attrs.meta else { continue };
        let Some(layout) = meta.layout(profile) else {
            continue;
        };
        let io = crate::ec_io::PgShardIo {
            me,
            store: host.store(),
            coll,
            oid,
            pg,
            epoch: map.epoch,
            object,
            members: members
                .iter()
                .map(|m| m.map(|osd| (osd, map.osds.get(&osd).and_then(|i| i.addr))))
                .collect(),
            peers: host.peers(),
            after_version: 0,
        };
        let found = crate::ec::check_parity(&io, &layout, attrs.version, meta.size)
            .await
            .map_err(|e| OsdError::Remote {
                osd: me,
                code: e.code,
                message: e.message,
            })?;
        let culprit = match found {
            crate::ec::ParityCheck::Consistent | crate::ec::ParityCheck::Skipped => continue,
            crate::ec::ParityCheck::BadShard(pos) => members.get(pos).copied().flatten(),
            crate::ec::ParityCheck::Unlocated => None,
        };
        warn!(%pg, object = %o.name, ?culprit, "erasure-coded shards disagree with their parity");
        let shards = members
            .iter()
            .flatten()
            .map(|&osd| ShardReport {
                osd,
                primary: osd == me,
                errors: if culprit.is_none_or(|c| c == osd) {
                    vec![ShardError::DataDigestMismatch]
                } else {
                    Vec::new()
                },
                object: maps
                    .get(&osd)
                    .and_then(|v| {
                        v.iter()
                            .find(|x| x.name == o.name && x.namespace == o.namespace)
                    })
                    .cloned(),
            })
            .collect();
        out.push(InconsistentObject {
            namespace: o.namespace.clone(),
            name: o.name.clone(),
            auth_osd: culprit.and_then(|c| members.iter().flatten().copied().find(|&m| m != c)),
            version: o.version,
            errors: vec![ShardError::DataDigestMismatch],
            shards,
        });
    }
    Ok(out)
}

/// A member's scrub map of a range of one of its PGs.
pub(crate) async fn scrub_map<H: PgHost>(host: &H, req: ScrubMapRequest) -> ScrubMapReply {
    let fail = |code, msg: String| ScrubMapReply {
        error: Some((code, msg)),
        objects: Vec::new(),
    };
    let map = host.map_at_least(req.epoch).await;
    if map.epoch < req.epoch {
        return fail(
            ErrorCode::Misdirected,
            format!("osd.{} has not seen epoch {} yet", host.id(), req.epoch),
        );
    }
    if host.pg_handle(req.pg).is_none() {
        return fail(
            ErrorCode::Misdirected,
            format!("osd.{} does not hold PG {}", host.id(), req.pg),
        );
    }
    let store = host.store();
    let coll = CollectionId(req.pg);
    let start = req.start.as_ref().map(|c| cursor_oid(req.pg, c));
    let end = req.end.as_ref().map(|c| cursor_oid(req.pg, c));
    let deep = req.deep;
    let ec = crate::ec::shard_of(&host.map(), req.pg, host.id()).is_some();
    match tokio::task::spawn_blocking(move || {
        build_map(&*store, coll, start.as_ref(), end.as_ref(), deep, ec)
    })
    .await
    {
        Ok(Ok(objects)) => ScrubMapReply {
            error: None,
            objects,
        },
        Ok(Err(e)) => fail(ErrorCode::Io, e.to_string()),
        Err(e) => fail(ErrorCode::Io, blocking_err(e).to_string()),
    }
}

/// Installs a repaired copy of one object (sent by the PG's primary, whose writes to the
/// object are held back meanwhile).
pub(crate) async fn pg_push<H: PgHost>(host: &H, p: PgPush, data: Bytes) -> PgPushReply {
    let fail = |code, msg: String| PgPushReply {
        error: Some((code, msg)),
    };
    if host.pg_handle(p.pg).is_none() {
        return fail(
            ErrorCode::Misdirected,
            format!("osd.{} does not hold PG {}", host.id(), p.pg),
        );
    }
    let coll = CollectionId(p.pg);
    let oid = ObjectId::new(p.pg.pool.0, &p.namespace, &p.name, p.hash);
    let store = host.store();
    let o = oid.clone();
    let exists = match tokio::task::spawn_blocking(move || store.exists(coll, &o)).await {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => return fail(ErrorCode::Io, e.to_string()),
        Err(e) => return fail(ErrorCode::Io, blocking_err(e).to_string()),
    };
    let mut txn = Transaction::new();
    apply_state(&mut txn, coll, &oid, exists, p.state, data);
    if txn.is_empty() {
        return PgPushReply { error: None };
    }
    match host.commit(txn).await {
        Ok(()) => PgPushReply { error: None },
        Err(e) => fail(ErrorCode::Io, e.to_string()),
    }
}

/// An operator's request to a PG's primary.
pub(crate) async fn pg_command<H: ScrubHost>(host: &H, c: PgCommand) -> PgCommandReply {
    let map = host.map_at_least(c.epoch).await;
    let mut reply = PgCommandReply {
        error: None,
        epoch: map.epoch,
        osd: host.id(),
        summary: PgScrubSummary::default(),
        inconsistent: Vec::new(),
        queued_seq: 0,
    };
    match map.pg_mapping(c.pg) {
        Ok(m) if m.acting_primary == host.id() => {}
        Ok(_) => {
            reply.error = Some((
                ErrorCode::Misdirected,
                format!("osd.{} is not the primary of PG {}", host.id(), c.pg),
            ));
            return reply;
        }
        Err(e) => {
            reply.error = Some((ErrorCode::NoSuchPool, e.to_string()));
            return reply;
        }
    }
    if host.pg_handle(c.pg).is_none() {
        reply.error = Some((
            ErrorCode::Inactive,
            format!("PG {} is not open here yet", c.pg),
        ));
        return reply;
    }
    let s = host.scrubber();
    match c.kind {
        PgCommandKind::Scrub { deep } => reply.queued_seq = s.queue(c.pg, deep, false),
        PgCommandKind::Repair => reply.queued_seq = s.queue(c.pg, true, true),
        PgCommandKind::Status => {}
        PgCommandKind::ListInconsistent => {
            reply.inconsistent = s
                .pgs
                .lock()
                .expect("scrub table")
                .get(&c.pg)
                .map(|p| p.inconsistent.clone())
                .unwrap_or_default();
        }
    }
    reply.summary = s.summary(c.pg);
    reply
}

/// An operator's request to this OSD about every PG it is primary for.
pub(crate) async fn osd_scrub_command<H: ScrubHost>(host: &H, c: OsdScrubCommand) -> OsdScrubReply {
    let map = host.map();
    let me = host.id();
    let mut pgs = Vec::new();
    for pool in map.pools.values() {
        for seed in 0..pool.pg_num {
            let pg = PgId::new(pool.id, seed);
            if map.pg_mapping(pg).is_ok_and(|m| m.acting_primary == me)
                && host.pg_handle(pg).is_some()
            {
                pgs.push(pg);
            }
        }
    }
    let s = host.scrubber();
    if let OsdScrubCommand::Scrub { deep } = c {
        for &pg in &pgs {
            s.queue(pg, deep, false);
        }
    }
    OsdScrubReply {
        error: None,
        osd: me,
        pgs: pgs.into_iter().map(|pg| (pg, s.summary(pg))).collect(),
    }
}

/// A client read (or a recovery pull) found this primary's copy of `object` damaged: copy
/// it from another member in sync (writes to the PG wait meanwhile; members left behind
/// for recovery may hold an older version and are never used), so the read can be answered
/// from a good copy. Errors if no member has a good copy.
pub(crate) async fn repair_from_replica<H: ScrubHost>(
    host: &H,
    pg: PgId,
    object: &kelp_proto::ObjectLocator,
) -> Result<i32, OsdError> {
    if object.key.is_some() {
        return Err(OsdError::Unsupported {
            reason: "objects with a locator key cannot be fetched from a replica yet".into(),
        });
    }
    let handle = host.pg_handle(pg).ok_or(OsdError::PgNotOpen { pg })?;
    let map = host.map();
    let state = loop {
        let st = handle.write().await;
        if !st.in_flight.values().any(|o| o == object) {
            break st;
        }
        let changed = st.changed.clone();
        let settled = changed.notified();
        drop(st);
        settled.await;
    };
    let oid = crate::exec::object_id(object);
    let mut why = Vec::new();
    // While the PG peers, its write set is the previous interval's, and a member being
    // synced now holds its copy locked until this pull answers: never ask then.
    if state.active.is_none() {
        return Err(OsdError::PgBusy {
            pg,
            reason: "peering".into(),
        });
    }
    let in_sync: Vec<i32> = state
        .write_to
        .iter()
        .copied()
        .filter(|o| !state.failed_replicas.contains(o))
        .collect();
    if in_sync.is_empty() {
        why.push("no other member is in sync".to_string());
    }
    for &osd in in_sync.iter().filter(|&&o| o != host.id()) {
        let Some(addr) = map.osds.get(&osd).and_then(|o| o.addr) else {
            continue;
        };
        let pulled = host
            .peers()
            .pull(
                osd,
                addr,
                PgPull {
                    pg,
                    epoch: map.epoch,
                    namespace: object.namespace.clone(),
                    name: object.name.clone(),
                    // Erasure-coded pools: this member's own shard, rebuilt by the other.
                    shard: crate::ec::shard_of(&map, pg, host.id()),
                },
            )
            .await;
        let (r, data) = match pulled {
            Ok(x) => x,
            Err(e) => {
                why.push(e.to_string());
                continue;
            }
        };
        if let Some((_, msg)) = r.error {
            why.push(format!("osd.{osd}: {msg}"));
            continue;
        }
        if !r.exists {
            why.push(format!("osd.{osd} does not have it"));
            continue;
        }
        let mut txn = Transaction::new();
        apply_state(&mut txn, state.meta.coll, &oid, true, r, data);
        host.commit(txn).await?;
        drop(state);
        warn!(%pg, object = %object.name, "read error on the primary's copy; repaired from osd.{osd}");
        let mut pgs = host.scrubber().pgs.lock().expect("scrub table");
        pgs.entry(pg).or_default().summary.num_objects_repaired += 1;
        return Ok(osd);
    }
    Err(OsdError::NoGoodCopy {
        object: object.name.clone(),
        tried: why,
    })
}

fn absent() -> PgPullReply {
    PgPullReply {
        error: None,
        exists: false,
        size: 0,
        xattrs: Vec::new(),
        omap_header: None,
        omap: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[allow(unused_imports)]
    use crate::scrub_map::*;

    fn obj(name: &str, size: u64, version: u64, data: u32) -> ScrubObject {
        ScrubObject {
            hash: 7,
            namespace: String::new(),
            name: name.into(),
            size,
            version,
            attrs_digest: 11,
            omap_digest: 13,
            data_digest: Some(data),
            read_error: None,
        }
    }

    fn maps(copies: Vec<(i32, Vec<ScrubObject>)>) -> BTreeMap<i32, Vec<ScrubObject>> {
        copies.into_iter().collect()
    }

    #[test]
    fn identical_copies_are_consistent() {
        let m = maps(vec![
            (0, vec![obj("a", 10, 3, 99)]),
            (1, vec![obj("a", 10, 3, 99)]),
            (2, vec![obj("a", 10, 3, 99)]),
        ]);
        assert!(compare_chunk(&m, 0, &HashMap::new()).is_empty());
    }

    #[test]
    fn a_flipped_replica_is_named_and_the_majority_wins() {
        let m = maps(vec![
            (0, vec![obj("a", 10, 3, 99)]),
            (1, vec![obj("a", 10, 3, 98)]),
            (2, vec![obj("a", 10, 3, 99)]),
        ]);
        let bad = compare_chunk(&m, 0, &HashMap::new());
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].name, "a");
        assert_eq!(bad[0].auth_osd, Some(0));
        assert_eq!(bad[0].bad_osds(), vec![1]);
        assert_eq!(bad[0].errors, vec![ShardError::DataDigestMismatch]);
    }

    #[test]
    fn a_read_error_on_the_primary_makes_a_replica_authoritative() {
        let mut broken = obj("a", 10, 3, 0);
        broken.data_digest = None;
        broken.read_error = Some("checksum mismatch at offset 0".into());
        let m = maps(vec![
            (0, vec![broken]),
            (1, vec![obj("a", 10, 3, 99)]),
            (2, vec![obj("a", 10, 3, 99)]),
        ]);
        let bad = compare_chunk(&m, 0, &HashMap::new());
        assert_eq!(bad[0].auth_osd, Some(1));
        assert_eq!(bad[0].bad_osds(), vec![0]);
        assert_eq!(bad[0].errors, vec![ShardError::ReadError]);
    }

    #[test]
    fn the_log_version_beats_the_majority() {
        // Two members at version 3, one at 4 which the log names: the newer copy is right.
        let m = maps(vec![
            (0, vec![obj("a", 10, 3, 1)]),
            (1, vec![obj("a", 12, 4, 2)]),
            (2, vec![obj("a", 10, 3, 1)]),
        ]);
        let mut log = HashMap::new();
        log.insert(
            (String::new(), "a".to_string()),
            LogHint {
                version: 4,
                deleted: false,
            },
        );
        let bad = compare_chunk(&m, 0, &log);
        assert_eq!(bad[0].auth_osd, Some(1));
        assert_eq!(bad[0].bad_osds(), vec![0, 2]);
        assert!(bad[0].errors.contains(&ShardError::SizeMismatch));
        assert!(bad[0].errors.contains(&ShardError::VersionMismatch));
        // Without the log hint the newest version still wins over the majority.
        let bad = compare_chunk(&m, 0, &HashMap::new());
        assert_eq!(bad[0].auth_osd, Some(1));
    }

    #[test]
    fn missing_and_stale_copies() {
        let m = maps(vec![
            (0, vec![obj("a", 10, 3, 1)]),
            (1, vec![]),
            (2, vec![obj("a", 10, 3, 1), obj("b", 1, 2, 5)]),
        ]);
        let mut log = HashMap::new();
        log.insert(
            (String::new(), "b".to_string()),
            LogHint {
                version: 5,
                deleted: true,
            },
        );
        let bad = compare_chunk(&m, 0, &log);
        assert_eq!(bad.len(), 2);
        assert_eq!(bad[0].name, "a");
        assert_eq!(bad[0].bad_osds(), vec![1]);
        assert_eq!(bad[0].errors, vec![ShardError::Missing]);
        assert_eq!(bad[1].name, "b");
        assert_eq!(bad[1].auth_osd, None);
        assert_eq!(bad[1].bad_osds(), vec![2]);
        assert_eq!(bad[1].errors, vec![ShardError::Stale]);
    }

    #[test]
    fn no_usable_copy_is_unrepairable() {
        let mut broken = obj("a", 10, 3, 0);
        broken.read_error = Some("checksum".into());
        let m = maps(vec![(0, vec![broken.clone()]), (1, vec![broken])]);
        let bad = compare_chunk(&m, 0, &HashMap::new());
        assert_eq!(bad[0].auth_osd, None);
        assert_eq!(bad[0].bad_osds(), vec![0, 1]);
    }

    #[test]
    fn ties_prefer_the_primary_then_the_lowest_id() {
        let a = obj("a", 10, 3, 1);
        let b = obj("a", 10, 3, 2);
        let mut copies = BTreeMap::new();
        copies.insert(4, Some(&a));
        copies.insert(2, Some(&b));
        assert_eq!(choose_authoritative(&copies, 4, None), Authority::Copy(4));
        assert_eq!(choose_authoritative(&copies, 9, None), Authority::Copy(2));
        // Shallow maps (no data digest) of identical metadata agree.
        let mut s = obj("a", 10, 3, 0);
        s.data_digest = None;
        let m = maps(vec![(0, vec![s.clone()]), (1, vec![s])]);
        assert!(compare_chunk(&m, 0, &HashMap::new()).is_empty());
    }

    #[test]
    fn schedule_follows_intervals_flags_and_load() {
        let cfg = ScrubConfig::default();
        let day = 86_400;
        let s = PgScrubSummary {
            last_scrub_stamp: 1000,
            last_deep_scrub_stamp: 1000,
            ..Default::default()
        };
        let f = (false, false);
        assert_eq!(scheduled_kind(1000 + day - 1, &s, &cfg, f, true), None);
        assert_eq!(scheduled_kind(1000 + day, &s, &cfg, f, true), Some(false));
        // Too busy: waits until the max interval, then scrubs anyway.
        assert_eq!(scheduled_kind(1000 + day, &s, &cfg, f, false), None);
        assert_eq!(
            scheduled_kind(1000 + 7 * day, &s, &cfg, f, false),
            Some(true)
        );
        // noscrub stops shallow scrubs; nodeep-scrub deep ones.
        assert_eq!(
            scheduled_kind(1000 + day, &s, &cfg, (true, false), true),
            None
        );
        assert_eq!(
            scheduled_kind(1000 + 7 * day, &s, &cfg, (false, true), true),
            Some(false)
        );
        assert_eq!(
            scheduled_kind(1000 + 7 * day, &s, &cfg, (true, true), true),
            None
        );
    }

    #[test]
    fn central_config_overrides_in_order() {
        let e = |who: &str, key: &str, value: &str| ConfigEntry {
            who: who.into(),
            key: key.into(),
            value: value.into(),
        };
        let entries = vec![
            e("osd.3", "osd_scrub_chunk_max", "5"),
            e("osd", "osd_scrub_chunk_max", "7"),
            e("global", "osd_scrub_sleep", "0.25"),
            e("osd", "osd_max_backfills", "2"),
        ];
        let c = ScrubConfig::default().with_central(&entries, 3);
        assert_eq!(c.chunk_max, 5);
        assert_eq!(c.sleep, Duration::from_millis(250));
        let c = ScrubConfig::default().with_central(&entries, 1);
        assert_eq!(c.chunk_max, 7);
        assert!(!ScrubConfig::default().set("osd_scrub_chunk_max", "0"));
    }

    impl ScrubHost for crate::host::fake::FakeOsd<Scrubber> {
        fn scrubber(&self) -> &Scrubber {
            &self.extra
        }
    }

    /// Operator requests reach only the PG's primary, and the scrubber takes them repairs
    /// first, then deep scrubs, then shallow ones, whatever order they came in; a PG that is
    /// due on schedule but not active (none is, here) is not taken.
    #[tokio::test]
    async fn operator_requests_are_taken_repairs_first() {
        use kelp_proto::{OsdScrubCommand, PgCommand, PgCommandKind};

        let (map, pool) = crate::host::fake::map(3, 16);
        let epoch = map.epoch;
        let primary = |seed| {
            map.pg_mapping(PgId::new(pool, seed))
                .expect("mapping")
                .acting_primary
        };
        let me = (0..3)
            .max_by_key(|&osd| (0..16).filter(|&seed| primary(seed) == osd).count())
            .expect("an OSD");
        let (mine, theirs): (Vec<PgId>, Vec<PgId>) = (0..16)
            .map(|seed| PgId::new(pool, seed))
            .partition(|&pg| map.pg_mapping(pg).expect("mapping").acting_primary == me);
        assert!(mine.len() >= 3 && !theirs.is_empty(), "{mine:?} {theirs:?}");
        let osd = crate::host::fake::FakeOsd::new(me, map, Scrubber::new(ScrubConfig::default()));
        for &pg in mine.iter().chain(&theirs) {
            osd.open(pg);
        }
        let command = |pg, kind| PgCommand { pg, epoch, kind };

        let refused = pg_command(&osd, command(theirs[0], PgCommandKind::Repair)).await;
        assert_eq!(refused.error.map(|e| e.0), Some(ErrorCode::Misdirected));

        let (a, b, c) = (mine[0], mine[1], mine[2]);
        let shallow = pg_command(&osd, command(a, PgCommandKind::Scrub { deep: false })).await;
        let deep = pg_command(&osd, command(b, PgCommandKind::Scrub { deep: true })).await;
        let repair = pg_command(&osd, command(c, PgCommandKind::Repair)).await;
        assert_eq!(shallow.error, None);
        assert!(shallow.queued_seq < deep.queued_seq && deep.queued_seq < repair.queued_seq);

        let taken: Vec<(PgId, bool, bool)> = std::iter::from_fn(|| next_scrub(&osd))
            .map(|(pg, r)| (pg, r.deep, r.repair))
            .collect();
        assert_eq!(
            taken,
            [(c, true, true), (b, true, false), (a, false, false)]
        );

        // `osd scrub` queues every PG this OSD is primary for, and only those.
        let all = osd_scrub_command(&osd, OsdScrubCommand::Scrub { deep: false }).await;
        let listed: BTreeSet<PgId> = all.pgs.iter().map(|(pg, _)| *pg).collect();
        assert_eq!(listed, mine.iter().copied().collect());
        assert_eq!(std::iter::from_fn(|| next_scrub(&osd)).count(), mine.len());
    }
}
