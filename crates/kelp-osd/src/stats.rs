//! What an OSD reports to the monitors (`OsdStatsReport`) and its own full-ratio failsafe.
//!
//! - Client I/O counters are cumulative since start and counted once per client op that
//!   succeeded on this OSD as primary (replica writes are not client I/O), so the monitors'
//!   rates summed over OSDs count each client op once.
//! - Recovery counters are cumulative since start and counted by the OSD that receives a
//!   recovered object (once per object applied, with its data length), so summed over OSDs
//!   they count each copy made once ([`OsdStats::count_recovered`]).
//! - Per PG this OSD is the acting primary of: its state ([`pg_state_flags`], a pure function
//!   of what the OSD knows), object and byte counts, degraded and misplaced copies. A PG is
//!   counted from the store once (holding its write lock, so the count is exact at its
//!   `last_update`); from then on every write the primary applies adds its delta
//!   ([`OsdStats::count_write`]), so a PG of millions of objects under load is never listed
//!   again. The chain breaks when the PG's history moves any other way (peering, a sync from
//!   another member): then it is recounted, for a PG that keeps changing at most every
//!   [`recount_after`], and every count is refreshed after [`refresh_after`] in case some
//!   path changed objects without a delta.
//! - Failsafe: a client write is refused with `Full` when this OSD's own store is at or past
//!   the full ratio (which the leader sends back with every report), even before the map's
//!   `full` flag arrives. The store's usage is looked at most every
//!   [`SPACE_CHECK_EVERY`], so the write path never pays for it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kelp_proto::{
    BackgroundWork, IoCounters, OpKind, OsdPerf, OsdSpace, OsdStatsReport, PgStat, PgStateFlag,
    RecoveryCounters,
};
use kelp_store::{ObjectStore, StoreSpace};
use kelp_types::PgId;

use crate::pg::PgHandle;

/// How stale the failsafe's view of the store's usage may be.
pub const SPACE_CHECK_EVERY: Duration = Duration::from_millis(100);

/// The default full ratio until the monitors say otherwise (`mon_osd_full_ratio`), millionths.
pub const DEFAULT_FULL_RATIO_PPM: u32 = 950_000;

/// A PG's object and byte count, the `last_update` and the time it was counted at.
#[derive(Debug, Clone, Copy)]
struct PgCount {
    last_update: (u32, u64),
    /// The count follows the PG's writes (false once objects changed without deltas).
    current: bool,
    objects: u64,
    bytes: u64,
    at: Instant,
}

impl PgCount {
    /// Whether the count can be reused: it is current (counted, or kept up by write deltas, up
    /// to the PG's `last_update`), or it was counted less than [`recount_after`] ago (big PGs
    /// whose history moves without deltas are not rescanned every report); and in any case it
    /// is younger than [`refresh_after`].
    fn reusable(&self, last_update: (u32, u64)) -> bool {
        let age = self.at.elapsed();
        // `>=`: the report read `last_update` before this look, and writes since may have
        // carried the count further
        age < refresh_after(self.objects)
            && ((self.current && self.last_update >= last_update)
                || age < recount_after(self.objects))
    }
}

/// How long a count of a PG whose history moved without deltas is reused: 2 s plus 1 s per
/// 1000 objects (a recount lists and stats every object).
pub fn recount_after(objects: u64) -> Duration {
    Duration::from_secs(2) + Duration::from_millis(objects)
}

/// The age at which even a current count is recounted: 10 minutes plus 10 s per 1000 objects,
/// a bound on the drift of a path that changes objects without a delta.
pub fn refresh_after(objects: u64) -> Duration {
    Duration::from_secs(600) + Duration::from_millis(objects.saturating_mul(10))
}

/// What [`OsdStats::perf`] compares against: the latency sums at the previous report and the
/// means it reported.
#[derive(Debug, Default, Clone, Copy)]
struct PerfWindow {
    apply: (u64, u64),
    commit: (u64, u64),
    last: OsdPerf,
}

/// The mean of the writes between `prev` and `now` ((sum ns, count)), or `held` if there were
/// none.
fn window_mean(prev: (u64, u64), now: (u64, u64), held: u64) -> u64 {
    let n = now.1.saturating_sub(prev.1);
    if n == 0 {
        return held;
    }
    // at least 1 ns: a write happened, and "0" reads as "no data"
    (now.0.saturating_sub(prev.0) / n).max(1)
}

/// Counters and caches behind the reports (one per OSD service).
#[derive(Debug)]
pub struct OsdStats {
    read_ops: AtomicU64,
    read_bytes: AtomicU64,
    write_ops: AtomicU64,
    write_bytes: AtomicU64,
    recovered_objects: AtomicU64,
    recovered_bytes: AtomicU64,
    full_ratio_ppm: AtomicU32,
    /// (when, used/total in millionths) of the last look at the store's usage.
    space_seen: Mutex<Option<(Instant, u32)>>,
    counts: Mutex<HashMap<PgId, PgCount>>,
    /// Write latencies since start: (sum ns, count) of applies and of commits.
    apply_ns: AtomicU64,
    applies: AtomicU64,
    commit_ns: AtomicU64,
    commits: AtomicU64,
    /// The sums at the previous report and the latencies reported then.
    perf_window: Mutex<PerfWindow>,
    /// Background work left (`BackgroundWork`), set by the snapshot trimmer and the remover
    /// of deleted pools' PGs.
    pub(crate) snaptrim_clones_left: AtomicU64,
    pub(crate) deleting_objects_left: AtomicU64,
    pub(crate) deleting_pgs_left: AtomicU64,
    /// Notified when a PG of this OSD changes state (activated, a member recovered): the
    /// daemon then reports soon instead of at the next interval, so the monitors' view of
    /// short states (peering) is as short as the states themselves.
    pub(crate) state_changed: tokio::sync::Notify,
}

impl Default for OsdStats {
    fn default() -> Self {
        OsdStats {
            read_ops: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            write_ops: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            recovered_objects: AtomicU64::new(0),
            recovered_bytes: AtomicU64::new(0),
            full_ratio_ppm: AtomicU32::new(DEFAULT_FULL_RATIO_PPM),
            space_seen: Mutex::new(None),
            counts: Mutex::new(HashMap::new()),
            apply_ns: AtomicU64::new(0),
            applies: AtomicU64::new(0),
            commit_ns: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            perf_window: Mutex::new(PerfWindow::default()),
            snaptrim_clones_left: AtomicU64::new(0),
            deleting_objects_left: AtomicU64::new(0),
            deleting_pgs_left: AtomicU64::new(0),
            state_changed: tokio::sync::Notify::new(),
        }
    }
}

fn ppm(space: &StoreSpace) -> u32 {
    if space.total == 0 {
        return 0;
    }
    ((space.used as u128 * 1_000_000) / space.total as u128).min(u32::MAX as u128) as u32
}

impl OsdStats {
    /// Counts one successful client op.
    pub fn count_op(&self, is_write: bool, bytes: u64) {
        if is_write {
            self.write_ops.fetch_add(1, Ordering::Relaxed);
            self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.read_ops.fetch_add(1, Ordering::Relaxed);
            self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub fn io(&self) -> IoCounters {
        IoCounters {
            read_ops: self.read_ops.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_ops: self.write_ops.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
        }
    }

    /// Counts recovery work: `objects` pulled from another member and applied here, `bytes` of
    /// their data.
    pub(crate) fn count_recovered(&self, objects: u64, bytes: u64) {
        self.recovered_objects.fetch_add(objects, Ordering::Relaxed);
        self.recovered_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn recovery(&self) -> RecoveryCounters {
        RecoveryCounters {
            objects: self.recovered_objects.load(Ordering::Relaxed),
            bytes: self.recovered_bytes.load(Ordering::Relaxed),
        }
    }

    /// Counts one write's apply latency (execution and hand-over to the store).
    pub(crate) fn note_apply(&self, took: Duration) {
        self.apply_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        self.applies.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one write's commit latency (from reaching the store layer to durable).
    pub(crate) fn note_commit(&self, took: Duration) {
        self.commit_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
    }

    /// The mean latencies of the writes since the previous call (one per report), or, if there
    /// were none, the previous figures.
    pub fn perf(&self) -> OsdPerf {
        let apply = (
            self.apply_ns.load(Ordering::Relaxed),
            self.applies.load(Ordering::Relaxed),
        );
        let commit = (
            self.commit_ns.load(Ordering::Relaxed),
            self.commits.load(Ordering::Relaxed),
        );
        let mut w = self.perf_window.lock().unwrap_or_else(|p| p.into_inner());
        let perf = OsdPerf {
            commit_latency_ns: window_mean(w.commit, commit, w.last.commit_latency_ns),
            apply_latency_ns: window_mean(w.apply, apply, w.last.apply_latency_ns),
        };
        *w = PerfWindow {
            apply,
            commit,
            last: perf,
        };
        perf
    }

    /// Background work left on this OSD.
    pub fn work(&self) -> BackgroundWork {
        BackgroundWork {
            snaptrim_clones_left: self.snaptrim_clones_left.load(Ordering::Relaxed),
            deleting_objects_left: self.deleting_objects_left.load(Ordering::Relaxed),
            deleting_pgs_left: self.deleting_pgs_left.load(Ordering::Relaxed),
        }
    }

    /// Sets the full ratio (from the monitors' answer to a report).
    pub fn set_full_ratio_ppm(&self, ppm: u32) {
        self.full_ratio_ppm
            .store(ppm.min(1_000_000), Ordering::Relaxed);
    }

    pub fn full_ratio_ppm(&self) -> u32 {
        self.full_ratio_ppm.load(Ordering::Relaxed)
    }

    /// The store's usage in millionths, looked up at most every [`SPACE_CHECK_EVERY`].
    fn usage_ppm(&self, store: &dyn ObjectStore) -> Option<u32> {
        let mut seen = self.space_seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, used)) = *seen
            && at.elapsed() < SPACE_CHECK_EVERY
        {
            return Some(used);
        }
        let used = ppm(&store.space().ok()?);
        *seen = Some((Instant::now(), used));
        Some(used)
    }

    /// Why a client op must be refused as full, if it must: the map says the cluster is full,
    /// or this OSD's store is at or past the full ratio. Ops that only read or remove pass;
    /// `full_try` ops (`OpKind::FullTry`) pass up to the failsafe ratio.
    pub fn refuse_full(
        &self,
        osd: i32,
        map_full: bool,
        full_try: bool,
        ops: &[OpKind],
        store: &dyn ObjectStore,
    ) -> Option<crate::admission::Refusal> {
        // The decision is `admission::refuse_full`; this gathers its inputs (the store's usage
        // only when it matters).
        let writes = !ops.iter().all(OpKind::allowed_when_full);
        let used = if writes && (!map_full || full_try) {
            self.usage_ppm(store)
        } else {
            None
        };
        crate::admission::refuse_full(osd, writes, map_full, full_try, used, self.full_ratio_ppm())
    }

    fn cached_count(&self, pg: PgId, last_update: (u32, u64)) -> Option<(u64, u64)> {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts
            .get(&pg)
            .filter(|c| c.reusable(last_update))
            .map(|c| (c.objects, c.bytes))
    }

    /// Adds one write's delta to `pg`'s count, if the count is current up to `prev` (the PG's
    /// `last_update` before the write) and moves it to `now`. The primary calls this under the
    /// PG's write lock, in version order.
    pub(crate) fn count_write(
        &self,
        pg: PgId,
        prev: (u32, u64),
        now: (u32, u64),
        delta: crate::exec::StatDelta,
    ) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = counts.get_mut(&pg)
            && c.current
            && c.last_update == prev
        {
            c.objects = c.objects.saturating_add_signed(delta.objects);
            c.bytes = c.bytes.saturating_add_signed(delta.bytes);
            c.last_update = now;
        }
    }

    /// The `last_update` `pg`'s count is current at (tests).
    #[cfg(test)]
    fn count_write_probe(&self, pg: PgId) -> Option<(u32, u64)> {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(&pg).map(|c| c.last_update)
    }

    /// Marks `pg`'s count stale: its objects changed without deltas (a sync from another
    /// member). It is still shown until [`recount_after`] (a recovery syncing a PG over and
    /// over does not make every report recount it, holding its writes), then recounted.
    pub(crate) fn forget_count(&self, pg: PgId) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = counts.get_mut(&pg) {
            c.current = false;
        }
    }

    fn store_count(&self, pg: PgId, last_update: (u32, u64), objects: u64, bytes: u64) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.insert(
            pg,
            PgCount {
                last_update,
                current: true,
                objects,
                bytes,
                at: Instant::now(),
            },
        );
    }
}

/// What the primary knows about one of its PGs, for [`pg_state_flags`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgFacts {
    /// The PG has been peered for the current acting set.
    pub peered: bool,
    pub acting: usize,
    pub size: u32,
    pub min_size: u32,
    /// Some acting replicas missed a write (they need recovery).
    pub replicas_behind: bool,
    /// Acting members that are not in the up set (`pg_temp`).
    pub acting_not_up: usize,
    /// The acting set differs from the up set.
    pub remapped: bool,
    /// Background recovery of members left behind: `Some(backfill)` while it runs.
    pub recovering: Option<bool>,
    /// Background recovery waits for an `osd_max_backfills` slot: `Some(backfill)`.
    pub recovery_waiting: Option<bool>,
    /// Peering is blocked: `Some(true)` down (every OSD with the latest writes is down),
    /// `Some(false)` incomplete (those that answered lost their copy).
    pub blocked: Option<bool>,
}

/// The PG's states, as Ceph names them, from what its primary knows.
pub fn pg_state_flags(f: &PgFacts) -> Vec<PgStateFlag> {
    let mut s = Vec::new();
    if !f.peered {
        s.push(match f.blocked {
            Some(true) => PgStateFlag::Down,
            Some(false) => PgStateFlag::Incomplete,
            None => PgStateFlag::Peering,
        });
    } else if (f.acting as u32) < f.min_size {
        s.push(PgStateFlag::Peered);
    } else {
        s.push(PgStateFlag::Active);
    }
    let undersized = (f.acting as u32) < f.size;
    if undersized {
        s.push(PgStateFlag::Undersized);
    }
    if undersized || f.replicas_behind {
        s.push(PgStateFlag::Degraded);
    }
    if f.remapped {
        s.push(PgStateFlag::Remapped);
    }
    match (f.recovering, f.recovery_waiting) {
        (Some(true), _) => s.push(PgStateFlag::Backfilling),
        (Some(false), _) => s.push(PgStateFlag::Recovering),
        (None, Some(true)) => s.push(PgStateFlag::BackfillWait),
        (None, Some(false)) => s.push(PgStateFlag::RecoveryWait),
        (None, None) => {}
    }
    if f.peered
        && !undersized
        && !f.replicas_behind
        && f.acting_not_up == 0
        && !f.remapped
        && f.recovering.is_none()
        && f.recovery_waiting.is_none()
    {
        s.push(PgStateFlag::Clean);
    }
    s
}

/// Degraded copies: the copies the acting set lacks for every object, plus `behind` (copies
/// that acting members left behind still miss); misplaced copies: those on acting members
/// outside the up set.
pub fn degraded_and_misplaced(f: &PgFacts, objects: u64, behind: u64) -> (u64, u64) {
    let missing = u64::from(f.size.saturating_sub(f.acting as u32));
    (objects * missing + behind, objects * f.acting_not_up as u64)
}

/// What a statistics report is made from: the OSD's id, its current map, its store, the PGs it
/// holds and its counters. (`OsdService::stats_report` passes its own; nothing else of the
/// service is needed.)
pub(crate) struct ReportSource<'a> {
    pub me: i32,
    pub map: &'a kelp_maps::OsdMap,
    pub store: std::sync::Arc<dyn ObjectStore>,
    pub pgs: Vec<(PgId, PgHandle)>,
    pub stats: &'a OsdStats,
}

impl OsdStats {
    /// An OSD's report: store usage, client I/O counters, and its primary PGs.
    pub(crate) async fn report(src: ReportSource<'_>) -> OsdStatsReport {
        let ReportSource {
            me,
            map,
            store,
            pgs: handles,
            stats,
        } = src;
        let space = store.space().unwrap_or_default();
        let mut pgs = Vec::new();
        for (pg, handle) in handles {
            let Ok(m) = map.pg_mapping(pg) else { continue };
            if m.acting_primary != me {
                continue;
            }
            let Some(pool) = map.pools.get(&pg.pool.0) else {
                continue;
            };
            let (peered, behind, coll, last_update, recovery, blocked, unfound) = {
                let state = handle.read().await;
                // replicas that missed a write, and acting members left behind (recovering,
                // waiting, or paused by norecover/nobackfill): both hold degraded copies
                let mut behind: Vec<i32> = state
                    .failed_replicas
                    .iter()
                    .chain(&state.left_behind)
                    .copied()
                    .filter(|o| m.acting.contains(o))
                    .collect();
                behind.sort_unstable();
                behind.dedup();
                (
                    state.active.as_deref() == Some(&m.acting[..]),
                    behind.len(),
                    state.meta.coll,
                    state.meta.info.last_update,
                    state.recovery,
                    state
                        .blocked
                        .map(|b| b == crate::peering_machine::PeeringBlocked::Down),
                    state.unfound.len() as u64,
                )
            };
            let (objects, bytes) = match stats.cached_count(pg, last_update) {
                Some(c) => c,
                None => {
                    // Counted with the PG's writes held back, so that the count is exact at
                    // its last_update and the writes' deltas can carry it on from there.
                    let state = handle.write().await;
                    let last_update = state.meta.info.last_update;
                    let st = store.clone();
                    let ec = pool.ec().is_some();
                    let counted =
                        tokio::task::spawn_blocking(move || count_objects(&*st, coll, ec)).await;
                    match counted {
                        Ok(Ok((o, b))) => {
                            stats.store_count(pg, last_update, o, b);
                            (o, b)
                        }
                        _ => (0, 0),
                    }
                }
            };
            let facts = PgFacts {
                peered,
                acting: m.acting.len(),
                size: pool.size,
                min_size: pool.min_size,
                replicas_behind: behind > 0,
                acting_not_up: m.acting.iter().filter(|o| !m.up.contains(o)).count(),
                remapped: m.acting != m.up,
                recovering: recovery.filter(|r| !r.waiting).map(|r| r.backfill),
                recovery_waiting: recovery.filter(|r| r.waiting).map(|r| r.backfill),
                blocked,
            };
            // Copies the members left behind still miss: what background recovery counts down,
            // or (paused, or a replica that missed a write) every object, at least one each.
            let behind_copies = match recovery {
                Some(r) => r.degraded,
                None => (objects * behind as u64).max(behind as u64),
            };
            let (degraded, misplaced) = degraded_and_misplaced(&facts, objects, behind_copies);
            pgs.push(PgStat {
                pg,
                state: pg_state_flags(&facts),
                up: m.up.clone(),
                acting: m.acting.clone(),
                num_objects: objects,
                num_bytes: bytes,
                num_objects_degraded: degraded,
                num_objects_misplaced: misplaced,
                num_objects_unfound: unfound,
                last_update,
                reported_epoch: map.epoch,
                scrub: None,
            });
        }
        pgs.sort_by_key(|p| p.pg);
        OsdStatsReport {
            osd: me,
            epoch: map.epoch,
            space: OsdSpace {
                total: space.total,
                used: space.used,
                available: space.available,
            },
            io: stats.io(),
            pgs,
            recovery: stats.recovery(),
            perf: stats.perf(),
            work: stats.work(),
        }
    }
}

/// Objects and data bytes of a PG's collection, Kelp's internal objects (namespace `\x1f…`)
/// excluded but snapshot clones (and whiteout heads, of no bytes) included.
/// Objects and logical bytes of a PG in the store. `ec`: its objects are erasure-coded
/// shards, whose logical size is the one in their shard metadata (`ec::EcMeta`), not their
/// own (about 1/k of it): the count must agree with the logical deltas writes add to it.
fn count_objects(
    store: &dyn ObjectStore,
    coll: kelp_store::CollectionId,
    ec: bool,
) -> Result<(u64, u64), kelp_store::StoreError> {
    let (mut objects, mut bytes) = (0, 0);
    let mut from = None;
    loop {
        let page = store.list_objects(coll, from.as_ref(), 1024)?;
        for oid in &page.objects {
            // Snapshot clones count (as writes' deltas count them); other internal objects
            // do not.
            if (oid.namespace.starts_with('\u{1f}')
                && !crate::snapset::is_clone_namespace(&oid.namespace))
                || oid.snap != kelp_store::SNAP_HEAD
            {
                continue;
            }
            let size = if ec {
                store.xattrs(coll, oid).map(|attrs| {
                    attrs
                        .get(crate::ec::EC_ATTR)
                        .and_then(|m| crate::ec::EcMeta::decode(m).ok())
                        .map_or(0, |m| m.size)
                })
            } else {
                store.stat(coll, oid).map(|st| st.size)
            };
            match size {
                Ok(size) => {
                    objects += 1;
                    bytes += size;
                }
                // Removed since the listing: not there any more.
                Err(kelp_store::StoreError::ObjectNotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        match page.next {
            Some(next) => from = Some(next),
            None => return Ok((objects, bytes)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kelp_proto::pg_state_name;

    fn facts(peered: bool, acting: usize) -> PgFacts {
        PgFacts {
            peered,
            acting,
            size: 3,
            min_size: 2,
            replicas_behind: false,
            acting_not_up: 0,
            remapped: false,
            recovering: None,
            recovery_waiting: None,
            blocked: None,
        }
    }

    #[test]
    fn perf_is_the_last_busy_interval_mean() {
        let s = OsdStats::default();
        assert_eq!(s.perf(), OsdPerf::default());
        s.note_apply(Duration::from_micros(100));
        s.note_apply(Duration::from_micros(300));
        s.note_commit(Duration::from_millis(2));
        let p = s.perf();
        assert_eq!(p.apply_latency_ns, 200_000);
        assert_eq!(p.commit_latency_ns, 2_000_000);
        // an idle interval keeps the figures
        assert_eq!(s.perf(), p);
        s.note_commit(Duration::from_millis(4));
        let q = s.perf();
        assert_eq!(q.commit_latency_ns, 4_000_000);
        assert_eq!(q.apply_latency_ns, 200_000);
    }

    #[test]
    fn recovery_counters_accumulate() {
        let s = OsdStats::default();
        assert_eq!(s.recovery(), RecoveryCounters::default());
        s.count_recovered(1, 4 << 20);
        s.count_recovered(1, 0);
        assert_eq!(
            s.recovery(),
            RecoveryCounters {
                objects: 2,
                bytes: 4 << 20
            }
        );
        // client I/O counters are separate
        assert_eq!(s.io(), IoCounters::default());
    }

    #[test]
    fn write_deltas_carry_a_count_only_while_it_is_current() {
        use crate::exec::StatDelta;
        let s = OsdStats::default();
        let pg = PgId::new(1, 3);
        let d = |objects, bytes| StatDelta { objects, bytes };
        // nothing counted yet: deltas have nothing to carry
        s.count_write(pg, (1, 0), (1, 1), d(1, 10));
        assert_eq!(s.cached_count(pg, (1, 1)), None);
        s.store_count(pg, (1, 1), 5, 100);
        s.count_write(pg, (1, 1), (1, 2), d(1, 10));
        s.count_write(pg, (1, 2), (2, 3), d(0, -30));
        s.count_write(pg, (2, 3), (2, 4), d(-1, -4));
        assert_eq!(s.cached_count(pg, (2, 4)), Some((5, 76)));
        // a gap (the history moved without deltas): the count stops following ...
        s.count_write(pg, (2, 9), (2, 10), d(1, 1));
        assert_eq!(s.count_write_probe(pg), Some((2, 4)));
        // ... and is reused only while young, then recounted
        assert_eq!(s.cached_count(pg, (2, 10)), Some((5, 76)));
        let old = Instant::now() - recount_after(5) - Duration::from_millis(1);
        s.counts.lock().unwrap().get_mut(&pg).unwrap().at = old;
        assert_eq!(s.cached_count(pg, (2, 10)), None);
        assert_eq!(
            s.cached_count(pg, (2, 4)),
            Some((5, 76)),
            "still current at (2, 4)"
        );
        // a sync changed objects: stale even at its own last_update, and deltas stop
        s.forget_count(pg);
        assert_eq!(s.cached_count(pg, (2, 4)), None);
        s.count_write(pg, (2, 4), (2, 5), d(1, 1));
        assert_eq!(s.count_write_probe(pg), Some((2, 4)));
        // while young, a stale count is still shown
        s.store_count(pg, (2, 4), 5, 76);
        s.forget_count(pg);
        assert_eq!(s.cached_count(pg, (2, 4)), Some((5, 76)));
        // saturating, never wrapping below zero
        s.store_count(pg, (3, 1), 0, 0);
        s.count_write(pg, (3, 1), (3, 2), d(-1, -5));
        assert_eq!(s.cached_count(pg, (3, 2)), Some((0, 0)));
        for n in [0, 1_000, 1_000_000] {
            assert!(refresh_after(n) > recount_after(n));
        }
    }

    #[test]
    fn states_from_facts() {
        let name = |f: &PgFacts| pg_state_name(&pg_state_flags(f));
        assert_eq!(name(&facts(true, 3)), "active+clean");
        assert_eq!(name(&facts(false, 3)), "peering");
        let mut f = facts(false, 1);
        f.blocked = Some(true);
        assert_eq!(name(&f), "down+undersized+degraded");
        f.blocked = Some(false);
        assert_eq!(name(&f), "undersized+degraded+incomplete");
        assert_eq!(name(&facts(true, 2)), "active+undersized+degraded");
        assert_eq!(name(&facts(true, 1)), "undersized+degraded+peered");
        let mut f = facts(true, 3);
        f.replicas_behind = true;
        assert_eq!(name(&f), "active+degraded");
        let mut f = facts(true, 3);
        f.remapped = true;
        f.acting_not_up = 1;
        assert_eq!(name(&f), "active+remapped");
        let mut g = facts(true, 2);
        g.remapped = true;
        g.recovering = Some(true);
        assert_eq!(name(&g), "active+undersized+degraded+remapped+backfilling");
        g.recovering = None;
        g.recovery_waiting = Some(false);
        assert_eq!(
            name(&g),
            "active+recovery_wait+undersized+degraded+remapped"
        );
        assert_eq!(degraded_and_misplaced(&f, 10, 0), (0, 10));
        assert_eq!(degraded_and_misplaced(&facts(true, 1), 10, 0), (20, 0));
    }

    #[test]
    fn erasure_coded_pgs_count_logical_bytes() {
        use kelp_store::{CollectionId, MemStore, ObjectId, Transaction};
        let store = MemStore::new();
        let coll = CollectionId::new(2, 0);
        let oid = ObjectId::new(2, "", "obj", 0);
        let bare = ObjectId::new(2, "", "no-data", 1);
        let mut t = Transaction::new();
        t.create_collection(coll);
        // shard 1 of a 3000-byte object in a 2+1 pool: 1536 bytes of shard
        t.write(coll, &oid, 0, vec![7u8; 1536]);
        let meta = crate::ec::EcMeta {
            shard: 1,
            size: 3000,
            chunk: 1536,
        };
        t.set_xattr(coll, &oid, crate::ec::EC_ATTR, meta.encode());
        // an object without data has no shard metadata
        t.touch(coll, &bare);
        store.submit(t).unwrap().wait().unwrap();
        assert_eq!(count_objects(&store, coll, true).unwrap(), (2, 3000));
        assert_eq!(count_objects(&store, coll, false).unwrap(), (2, 1536));
    }

    #[test]
    fn failsafe_refuses_growing_writes_only() {
        let store = kelp_store::MemStore::with_capacity(1000);
        let s = OsdStats::default();
        let write = [OpKind::WriteFull { len: 10 }];
        let delete = [OpKind::Remove];
        assert!(s.refuse_full(0, false, false, &write, &store).is_none());
        assert!(s.refuse_full(0, true, false, &write, &store).is_some());
        assert!(s.refuse_full(0, true, false, &delete, &store).is_none());
        // Past the ratio of its own store (after the check interval).
        let coll = kelp_store::CollectionId(PgId::new(1, 0));
        let oid = kelp_store::ObjectId::new(1, "", "x", 0);
        let mut t = kelp_store::Transaction::new();
        t.create_collection(coll).write(coll, &oid, 0, vec![0; 960]);
        store.submit(t).unwrap().wait().unwrap();
        std::thread::sleep(SPACE_CHECK_EVERY + Duration::from_millis(10));
        let why = s
            .refuse_full(3, false, false, &write, &store)
            .expect("refused")
            .to_string();
        assert!(why.contains("osd.3") && why.contains("96.0%"), "{why}");
        assert!(s.refuse_full(3, false, false, &delete, &store).is_none());
        // a FullTry write passes the full flag, but not the failsafe ratio
        assert!(s.refuse_full(3, true, true, &write, &store).is_none());
        s.set_full_ratio_ppm(990_000);
        assert!(s.refuse_full(3, false, false, &write, &store).is_none());
    }
}
