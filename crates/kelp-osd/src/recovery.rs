//! Peering and recovery: the I/O around the pure `peering::plan` and
//! `peering_machine::PeeringMachine` (which makes every peering decision described below).
//!
//! When a map changes a PG's acting or up set, its primary stops serving the PG (client ops get
//! `Inactive` and retry), gathers the logs of the acting members and of the up members outside
//! the acting set (backfill targets, while a `pg_temp` keeps the old members acting), and plans.
//! Then:
//! * a primary that is behind by its log catches up first (pulling the objects it misses from
//!   the authoritative member), since it serves every read; a primary that needs a backfill
//!   (a new OSD that CRUSH made primary) asks the monitors for a `pg_temp` naming the members
//!   that have the data, so one of them serves the PG while this OSD is backfilled;
//! * the PG goes active at once with the members in sync (at least `min_size`; if fewer are,
//!   enough are synced first), and every other member is *left behind*: it gets no writes
//!   while a background task brings it up to date (`recover_member`): copy what it misses (log
//!   recovery) or every object (backfill) in batches, hand it the log, repeat for what changed
//!   meanwhile, and finally, with client writes held back for the few objects written since,
//!   give it the last writes and add it to the write set. Clients are served throughout, by a
//!   degraded PG; only that final hand-over makes writes to the PG wait (for one batch).
//! * once every backfill target has joined, the primary asks the monitors to drop the
//!   `pg_temp`; the up set becomes the acting set and peers again with everyone in sync.
//!
//! Throttles (central config, changeable at runtime): `osd_max_backfills` PGs recover at once
//! per primary OSD (the others wait: `recovery_wait`/`backfill_wait`), `osd_recovery_max_active`
//! objects at once per OSD, `osd_recovery_sleep` between batches, and `osd_recovery_op_priority`
//! (1–63, against the clients' 63) sets the share of time recovery may use while clients are
//! busy on this OSD.
//!
//! `norecover` / `nobackfill` (Ceph's flags): a member that would need log recovery / backfill
//! stays left behind with no background task while the flag is set, provided `min_size`
//! members are up to date (else the PG waits, inactive). A primary that is behind still
//! recovers itself. When the flag is cleared, the PG peers again and recovers the members left
//! behind.
//!
//! Crash safety: a member applies the objects first and rewrites its log last; a crash in
//! between leaves the old log, so the next peering repeats the sync (copying an object twice is
//! harmless). A member left behind never serves a read.
//!
//! The OSD around this module is a `RecoveryHost` (a `PgHost` plus the recovery state, the
//! stats, the monitors and a repair on read, see below): the service implements it and calls
//! `peer`/`peer_with_authority` and the member-side requests (`pg_query`, `pg_pull`,
//! `pg_sync`); nothing here names the service, so the modules do not refer to each other.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use kelp_proto::{
    ActivationVerdict, ErrorCode, ObjectLocator, PgActivation, PgPull, PgPullReply, PgQuery,
    PgQueryReply, PgSync, PgSyncReply, SyncLog,
};
use kelp_store::{StoreError, Transaction};
use kelp_types::PgId;
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use crate::error::OsdError;
use crate::host::PgHost;
use crate::object_state::{apply_state, list_all, oid_for, peer_addr, read_state};
use crate::peering::MemberReport;
pub(crate) use crate::peering_machine::PeeringBlocked;
use crate::peering_machine::{
    Action, EC_SHARD_MIXED, Event, Job, Lagging, Outcome, PeeringMachine, PeeringStart,
    RecoveryFlags, names, split_paused, write_targets,
};
use crate::pg::{PgHandle, settled_read, settled_write};
use crate::pglog::LogEntry;
pub use crate::recovery_throttle::RecoveryConfig;
use crate::recovery_throttle::RecoveryCtl;
use crate::stats::OsdStats;

/// What peering and recovery need from the OSD they run in, beyond `PgHost`: the recovery
/// state it keeps for them, its statistics, whether clients are busy, the monitors (activation
/// records, `pg_temp` requests), and the repair of a damaged primary copy. That repair is
/// scrub's (`scrub::repair_from_replica`); recovery reaches it only through this trait, so it
/// does not depend on `scrub`.
pub(crate) trait RecoveryHost: PgHost {
    /// The PG, opened from the store if this OSD holds a copy it has not opened (a stray: no
    /// longer mapped here, but asked for its history by a primary).
    fn pg_or_stray(&self, pg: PgId) -> impl Future<Output = Option<PgHandle>> + Send;

    /// This OSD's recovery throttles and count of PGs peering.
    fn recovery(&self) -> &Recovery;

    /// Recovery counters, PG counts and state-change notices for the stats reports.
    fn stats(&self) -> &OsdStats;

    /// Whether clients used this OSD in the last moments (recovery then leaves them their
    /// share: `RecoveryConfig::priority_pause`).
    fn clients_busy(&self) -> bool;

    /// Queues an activation record for the monitors; the receiver gets their verdict.
    fn send_activation(
        &self,
        activation: PgActivation,
    ) -> oneshot::Receiver<Result<ActivationVerdict, OsdError>>;

    /// Whether this OSD can ask the monitors for a `pg_temp` (not in tests without monitors).
    fn can_request_pg_temp(&self) -> bool;

    /// Asks the monitors for a `pg_temp` of `pg` naming `osds` (none: drop it).
    fn request_pg_temp(&self, pg: PgId, osds: Vec<i32>) -> Result<(), OsdError>;

    /// Replaces this primary's damaged copy of `object` with a good copy from a member in sync;
    /// returns that member.
    fn repair_from_replica(
        &self,
        pg: PgId,
        object: &ObjectLocator,
    ) -> impl Future<Output = Result<i32, OsdError>> + Send;
}

/// The recovery state of one OSD, shared by all its PGs: the throttles and the slots that
/// enforce them, and how many PGs it is peering right now (as their primary). The service
/// keeps it; peering and recovery reach it through `RecoveryHost::recovery`.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    ctl: RecoveryCtl,
    peering: AtomicUsize,
}

impl Recovery {
    /// How many PGs this OSD is peering right now.
    pub(crate) fn peering(&self) -> usize {
        self.peering.load(Ordering::Relaxed)
    }

    /// The recovery throttles in force.
    pub(crate) fn config(&self) -> RecoveryConfig {
        self.ctl.cfg()
    }

    /// Applies new recovery throttles (from the central config).
    pub(crate) fn set_config(&self, cfg: RecoveryConfig) {
        let mut cur = self.ctl.cfg.lock().unwrap_or_else(|p| p.into_inner());
        if *cur != cfg {
            info!(?cfg, "recovery settings changed");
            *cur = cfg;
        }
        drop(cur);
        // A higher limit may let waiters in.
        self.ctl.pgs.freed.notify_waiters();
        self.ctl.objects.freed.notify_waiters();
    }
}

/// Objects copied per store transaction during a sync, at most…
const SYNC_BATCH: usize = 32;
/// …and at most about this many bytes: a large recovery transaction would hold up the client
/// writes committed behind it in the store.
const SYNC_BATCH_BYTES: u64 = 1 << 20;
/// When at most this many objects changed since the last round, the next round is the final
/// one (done with client writes held back). Each round copies only what changed during the
/// previous one, so under load the rounds shrink quickly (a 4 MiB object copy takes a few ms).
const FINAL_ROUND_OBJECTS: usize = 2;
/// Catch-up rounds (without holding writes back) before the final one.
const MAX_CATCH_UP_ROUNDS: usize = 8;
/// The final hand-over gives up (and is retried) after this long, so client writes never wait
/// longer for it.
const FINAL_ROUND_TIMEOUT: Duration = Duration::from_secs(5);

pub use crate::pg::RecoveryProgress;

/// Object → the PG version its copy on the member being recovered is at least as new as.
type CopiedAt = BTreeMap<(String, String), u64>;

/// Round one of bringing a member up to date (see `first_round`).
struct FirstRound {
    objects: Vec<(String, String)>,
    keep_only: Option<Vec<(String, String)>>,
    log: SyncLog,
}

/// Why a background recovery step stopped.
#[derive(Debug)]
enum RecoveryError {
    /// The PG peered again (or stopped being this OSD's): the new interval takes over.
    Interrupted,
    /// The log no longer reaches back to the member's copy: backfill instead.
    LogTrimmed,
    /// These objects could not be copied: every in-sync copy is unreadable. The member
    /// stays behind (the rest was copied) until they are overwritten, removed or repaired.
    Unfound(Vec<(String, String)>),
    Failed(OsdError),
}

impl From<OsdError> for RecoveryError {
    fn from(e: OsdError) -> Self {
        RecoveryError::Failed(e)
    }
}

/// Counts a PG as peering until dropped.
struct PeeringCount<H: RecoveryHost>(Arc<H>);

impl<H: RecoveryHost> Drop for PeeringCount<H> {
    fn drop(&mut self) {
        self.0.recovery().peering.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Clears a PG's `recovery_block` if the final hand-over is abandoned (cancelled task).
struct BlockGuard {
    handle: Option<PgHandle>,
    interval: u64,
}

impl BlockGuard {
    fn disarm(mut self) {
        self.handle = None;
    }
}

impl Drop for BlockGuard {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        let interval = self.interval;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let mut st = handle.write().await;
                if st.interval == interval && st.recovery_block {
                    st.recovery_block = false;
                    st.changed.notify_waiters();
                }
            });
        }
    }
}

/// Answers a primary's query for this member's log of a PG.
pub(crate) async fn pg_query<H: RecoveryHost>(host: &H, q: PgQuery) -> PgQueryReply {
    let fail = |code, msg: String| PgQueryReply {
        error: Some((code, msg)),
        last_update: (0, 0),
        log_tail: 0,
        entries: Vec::new(),
        objects: None,
        ec_shard: None,
    };
    let map = host.map_at_least(q.epoch).await;
    if map.epoch < q.epoch {
        return fail(
            ErrorCode::Misdirected,
            format!("osd.{} has not seen epoch {} yet", host.id(), q.epoch),
        );
    }
    let Some(pg) = host.pg_or_stray(q.pg).await else {
        return fail(
            ErrorCode::Misdirected,
            format!("osd.{} does not hold PG {}", host.id(), q.pg),
        );
    };
    let state = settled_read(&pg).await;
    let objects = if q.want_objects {
        let store = host.store();
        let coll = state.meta.coll;
        match tokio::task::spawn_blocking(move || list_all(&*store, coll)).await {
            Ok(Ok(list)) => Some(list.into_iter().map(|o| (o.namespace, o.name)).collect()),
            Ok(Err(e)) => return fail(ErrorCode::Io, e.to_string()),
            Err(e) => return fail(ErrorCode::Io, e.to_string()),
        }
    } else {
        None
    };
    let same = state.meta.info.last_update == q.have && q.have != (0, 0);
    PgQueryReply {
        error: None,
        last_update: state.meta.info.last_update,
        log_tail: state.meta.info.log_tail,
        entries: if same {
            Vec::new()
        } else {
            state.meta.entries().into_iter().map(Into::into).collect()
        },
        objects,
        ec_shard: state.meta.ec_shard,
    }
}

/// Serves one object's complete state to a recovering member. Waits only for writes to
/// this object that are still in flight (a PG under load always has some).
pub(crate) async fn pg_pull<H: RecoveryHost>(host: &H, p: PgPull) -> (PgPullReply, Bytes) {
    let fail = |code, msg: String| crate::object_state::pull_reply(Some((code, msg)));
    let Some(pg) = host.pg_or_stray(p.pg).await else {
        return fail(
            ErrorCode::Misdirected,
            format!("osd.{} does not hold PG {}", host.id(), p.pg),
        );
    };
    let state = loop {
        let state = pg.read().await;
        if !state.in_flight_named(&p.namespace, &p.name) {
            break state;
        }
        let changed = state.changed.clone();
        let settled = changed.notified();
        drop(state);
        settled.await;
    };
    let store = host.store();
    let coll = state.meta.coll;
    let oid = oid_for(p.pg, &p.namespace, &p.name);
    let read = {
        let (store, oid) = (store.clone(), oid.clone());
        move || read_state(&*store, coll, &oid)
    };
    let result = tokio::task::spawn_blocking(read.clone()).await;
    drop(state);
    let damaged = match result {
        Ok(Ok(r)) => return r,
        Ok(Err(e @ StoreError::ChecksumMismatch { .. })) => e.to_string(),
        Ok(Err(e)) => return fail(ErrorCode::Io, e.to_string()),
        Err(e) => return fail(ErrorCode::Io, e.to_string()),
    };
    // This copy failed its checksum. The primary repairs it from a member in sync and
    // serves the good copy; a replica (or a primary without a good copy anywhere) answers
    // `Corrupt`, and the puller counts the object as unfound.
    let primary = host
        .map()
        .pg_mapping(p.pg)
        .is_ok_and(|m| m.acting_primary == host.id());
    if !primary {
        return fail(ErrorCode::Corrupt, format!("osd.{}: {damaged}", host.id()));
    }
    let object = kelp_proto::ObjectLocator {
        pool: p.pg.pool.0,
        namespace: p.namespace.clone(),
        key: None,
        name: p.name.clone(),
    };
    if let Err(why) = host.repair_from_replica(p.pg, &object).await {
        return fail(
            ErrorCode::Corrupt,
            format!("osd.{}: {damaged}; {why}", host.id()),
        );
    }
    let state = pg.read().await;
    let result = tokio::task::spawn_blocking(read).await;
    drop(state);
    match result {
        Ok(Ok(r)) => r,
        Ok(Err(e @ StoreError::ChecksumMismatch { .. })) => fail(ErrorCode::Corrupt, e.to_string()),
        Ok(Err(e)) => fail(ErrorCode::Io, e.to_string()),
        Err(e) => fail(ErrorCode::Io, e.to_string()),
    }
}

/// Brings this member's copy of a PG closer to the authoritative history (see `PgSync`).
pub(crate) async fn pg_sync<H: RecoveryHost>(host: &H, s: PgSync) -> PgSyncReply {
    match sync_pg(host, s).await {
        Ok(unfound) => PgSyncReply {
            error: None,
            unfound,
        },
        Err(e) => PgSyncReply {
            error: Some((ErrorCode::Io, e.to_string())),
            unfound: Vec::new(),
        },
    }
}

/// Applies a sync; returns the objects the source could not deliver (every in-sync copy
/// damaged): they are skipped and the sync's log is not adopted.
async fn sync_pg<H: RecoveryHost>(host: &H, s: PgSync) -> Result<Vec<(String, String)>, OsdError> {
    let map = host.map_at_least(s.epoch).await;
    let handle = host
        .pg_handle(s.pg)
        .ok_or(OsdError::PgNotOpen { pg: s.pg })?;
    let mut state = settled_write(&handle).await;
    // Objects come and go here without write deltas: the PG's count stops following writes
    // and is recounted (after this sync releases the PG) if this member is its primary.
    host.stats().forget_count(s.pg);
    let coll = state.meta.coll;
    let store = host.store();
    // Erasure-coded pools: objects are rewritten as this member's shard from here on; until
    // the sync is complete the PG records a mix (it matches no position: peering backfills it
    // again), then the position.
    let ec_shard = crate::ec::shard_of(&map, s.pg, host.id());
    if ec_shard.is_some_and(|p| state.meta.ec_shard != Some(p)) {
        let mut txn = Transaction::new();
        state.meta.stage_ec_shard(&mut txn, EC_SHARD_MIXED);
        host.commit(txn).await?;
    }
    if let Some(keep) = s.keep_only {
        // Backfill: drop what the authoritative member does not have.
        let wanted: BTreeSet<(String, String)> = keep.into_iter().collect();
        let st = store.clone();
        let local = tokio::task::spawn_blocking(move || list_all(&*st, coll))
            .await
            .map_err(|e| OsdError::task("listing", e))??;
        let mut txn = Transaction::new();
        for o in local {
            if !wanted.contains(&(o.namespace.clone(), o.name.clone())) {
                txn.remove(coll, &o);
            }
        }
        if !txn.is_empty() {
            host.commit(txn).await?;
        }
    }
    let mut txn = Transaction::new();
    let mut unfound = Vec::new();
    if !s.objects.is_empty() {
        let source = s.source;
        let source_addr = map.osds.get(&source).and_then(|o| o.addr).ok_or_else(|| {
            OsdError::PeerUnreachable {
                osd: source,
                reason: "it has no address".into(),
            }
        })?;
        let (pg, epoch) = (s.pg, s.epoch);
        // Erasure-coded pools: pull this member's own shard, rebuilt by the source.
        let shard = ec_shard;
        let peers = host.peers();
        let (mut in_txn, mut txn_bytes) = (0, 0u64);
        let (mut objects, mut bytes) = (0u64, 0u64);
        // Snapshot clones a pulled head lists and this member lacks are pulled in a second
        // round (a clone is made in the same write, under the head's log entry, and never
        // changes after): a member that missed the write gets its clones too.
        let mut round = s.objects;
        let mut seen: BTreeSet<(String, String)> = round.iter().cloned().collect();
        while !round.is_empty() {
            let mut clones_wanted: Vec<(String, String)> = Vec::new();
            let mut pulls = futures::stream::iter(std::mem::take(&mut round))
                .map(|(namespace, name)| {
                    let peers = peers.clone();
                    async move {
                        let req = PgPull {
                            pg,
                            epoch,
                            namespace: namespace.clone(),
                            name: name.clone(),
                            shard,
                        };
                        (namespace, name, peers.pull(source, source_addr, req).await)
                    }
                })
                .buffered(s.parallel.clamp(1, 64) as usize);
            while let Some((ns, name, pulled)) = pulls.next().await {
                let (remote, data) = pulled?;
                match remote.error {
                    Some((ErrorCode::Corrupt, msg)) => {
                        warn!(%pg, object = %name, "unfound: no readable copy at osd.{source}: {msg}");
                        unfound.push((ns, name));
                        continue;
                    }
                    Some((_, msg)) => {
                        return Err(OsdError::Remote {
                            osd: source,
                            code: ErrorCode::Io,
                            message: format!("pulling '{name}': {msg}"),
                        });
                    }
                    None => {}
                }
                let oid = oid_for(pg, &ns, &name);
                let local_exists = store.exists(coll, &oid)?;
                for clone in crate::snapset::listed_clones(&ns, &name, &remote.xattrs) {
                    if !seen.contains(&clone)
                        && !store.exists(coll, &oid_for(pg, &clone.0, &clone.1))?
                    {
                        seen.insert(clone.clone());
                        clones_wanted.push(clone);
                    }
                }
                objects += 1;
                bytes += data.len() as u64;
                txn_bytes += data.len() as u64;
                host.stats().count_recovered(1, data.len() as u64);
                apply_state(&mut txn, coll, &oid, local_exists, remote, data);
                in_txn += 1;
                if in_txn >= SYNC_BATCH || txn_bytes >= SYNC_BATCH_BYTES {
                    host.commit(std::mem::take(&mut txn)).await?;
                    (in_txn, txn_bytes) = (0, 0);
                }
            }
            drop(pulls);
            round = clones_wanted;
        }
        debug!(%pg, objects, bytes, "copied from osd.{source}");
    }
    if let Some(log) = s.log.filter(|_| unfound.is_empty()) {
        let entries: Vec<LogEntry> = log.entries.into_iter().map(Into::into).collect();
        let mut meta = state.meta.clone();
        meta.rewrite(
            &mut txn,
            log.keep_through,
            entries,
            log.log_tail,
            log.last_update,
        );
        if let Some(shard) = ec_shard {
            meta.stage_ec_shard(&mut txn, shard);
        }
        host.commit(txn).await?;
        state.meta = meta;
    } else if !txn.is_empty() {
        host.commit(txn).await?;
    }
    Ok(unfound)
}

/// Peers a PG as its primary at `epoch`, retrying until it succeeds or the map moves on.
/// The PG counts as peering (for the stats reports) from this call on, so call it before
/// deactivating the PG, then spawn the future.
pub(crate) fn peer<H: RecoveryHost>(
    host: Arc<H>,
    pg: PgId,
    epoch: u32,
) -> impl Future<Output = ()> + Send + 'static {
    peer_with_authority(host, pg, epoch, None)
}

/// Peers a PG taking `authority`'s history as authoritative (see
/// `peering::plan_with_authority`): rolls back writes that member refused.
pub(crate) fn peer_with_authority<H: RecoveryHost>(
    host: Arc<H>,
    pg: PgId,
    epoch: u32,
    authority: Option<i32>,
) -> impl Future<Output = ()> + Send + 'static {
    host.recovery().peering.fetch_add(1, Ordering::Relaxed);
    let counted = PeeringCount(host.clone());
    async move {
        let _counted = counted;
        peer_now(host, pg, epoch, authority).await
    }
}

async fn peer_now<H: RecoveryHost>(host: Arc<H>, pg: PgId, epoch: u32, authority: Option<i32>) {
    let mut attempt = 0u32;
    let started = Instant::now();
    // OSDs outside the PG's sets that the monitors' record says hold its history.
    let mut strays: Vec<i32> = Vec::new();
    let mut blocked_logged = None;
    loop {
        let map = host.map();
        if map.epoch != epoch {
            return; // a newer map started its own peering
        }
        let Ok(m) = map.pg_mapping(pg) else { return };
        if m.acting_primary != host.id() {
            return;
        }
        match try_peer(&*host, pg, epoch, &m.acting, &m.up, &strays, authority).await {
            Outcome::Superseded => return,
            Outcome::Active { recovered, lagging } => {
                let flags = recovery_flags(&map);
                let left: Vec<i32> = lagging.iter().map(|l| l.osd).collect();
                let donors: Vec<i32> = lagging.iter().filter(|l| l.donor).map(|l| l.osd).collect();
                let members = Members {
                    acting: &m.acting,
                    up: &m.up,
                    left_behind: &left,
                    donors: &donors,
                };
                let Some(interval) = activate(&*host, pg, members, flags, epoch).await else {
                    return;
                };
                if blocked_logged.is_some() {
                    info!(%pg, epoch, "unblocked: peered with the PG's latest history");
                }
                let ms = started.elapsed().as_millis();
                if recovered > 0 || ms >= 250 {
                    info!(%pg, epoch, recovered, ms, "peered");
                } else {
                    debug!(%pg, epoch, ms, "peered");
                }
                let (run, wait) = split_paused(lagging, flags);
                if !wait.is_empty() {
                    let ids: Vec<i32> = wait.iter().map(|l| l.osd).collect();
                    info!(
                        %pg, epoch, ?ids,
                        "active+degraded: recovery of these members paused by \
                         norecover/nobackfill"
                    );
                }
                if !run.is_empty() || m.acting != m.up {
                    tokio::spawn(recover_in_background(host.clone(), pg, interval, run));
                }
                return;
            }
            Outcome::AwaitingPgTemp => {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Outcome::Blocked {
                probe,
                blocked,
                record,
            } => {
                if let Some(h) = host.pg_handle(pg) {
                    let mut st = h.write().await;
                    if st.blocked != blocked {
                        st.blocked = blocked;
                        host.stats().state_changed.notify_one();
                    }
                }
                if blocked != blocked_logged {
                    match blocked {
                        Some(PeeringBlocked::Down) => warn!(
                            %pg, epoch, members = ?record.members,
                            "down: every OSD with the PG's latest writes is down; waiting \
                             for one of them (or `kelp osd lost`)"
                        ),
                        Some(PeeringBlocked::Incomplete) => warn!(
                            %pg, epoch, members = ?record.members,
                            "incomplete: the OSDs that should have the PG's latest writes \
                             answered without them; waiting (or `kelp osd lost`)"
                        ),
                        None => {}
                    }
                    blocked_logged = blocked;
                }
                if probe.is_empty() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                } else {
                    debug!(%pg, epoch, ?probe, "asking the OSDs of the PG's last record");
                    for o in probe {
                        if !strays.contains(&o) {
                            strays.push(o);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            Outcome::Failed(e) => {
                attempt += 1;
                if attempt == 1 || attempt.is_multiple_of(20) {
                    warn!(%pg, epoch, "peering failed (will retry): {e}");
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// Who a PG is activated with (see [`activate`]).
struct Members<'a> {
    acting: &'a [i32],
    up: &'a [i32],
    /// Not in sync yet: no writes until recovery brings them up to date.
    left_behind: &'a [i32],
    /// Erasure-coded pools: members left behind that are read for another position's shard.
    donors: &'a [i32],
}

/// Marks a PG active for `acting` and `up` (after peering): writes go to every member
/// except those `left_behind` (not in sync yet). Returns the new interval, or `None` if the
/// map moved on meanwhile.
async fn activate<H: RecoveryHost>(
    host: &H,
    pg: PgId,
    members: Members<'_>,
    recovery_flags: RecoveryFlags,
    record_epoch: u32,
) -> Option<u64> {
    let Members {
        acting,
        up,
        left_behind,
        donors,
    } = members;
    let map = host.map();
    let me = host.id();
    let still = map
        .pg_mapping(pg)
        .is_ok_and(|m| m.acting == acting && m.up == up && m.acting_primary == me);
    if !still {
        return None;
    }
    let handle = host.pg_handle(pg)?;
    let mut state = handle.write().await;
    state.deactivate();
    state.active = Some(acting.to_vec());
    state.peered_up = up.to_vec();
    state.write_to = write_targets(me, acting, up, left_behind);
    // Peering brought every member to one history: nobody has a missed write any more.
    state.failed_replicas.clear();
    state.left_behind = left_behind.to_vec();
    state.donors = donors.to_vec();
    state.recovery_flags = recovery_flags;
    state.record_epoch = record_epoch;
    host.stats().state_changed.notify_one();
    Some(state.interval)
}

/// Asks a member for its log (left out if it is at `have`) and, with `want_objects`, its
/// object listing.
async fn query_member<H: PgHost>(
    host: &H,
    map: &kelp_maps::OsdMap,
    pg: PgId,
    epoch: u32,
    osd: i32,
    have: (u32, u64),
    want_objects: bool,
) -> Result<PgQueryReply, OsdError> {
    let addr = peer_addr(map, osd)?;
    let q = PgQuery {
        pg,
        epoch,
        want_objects,
        have,
    };
    let r = host.peers().query(osd, addr, q).await?;
    match r.error {
        Some(e) => Err(OsdError::remote(osd, e)),
        None => Ok(r),
    }
}

/// Sends a sync that must apply in full: objects found unreadable on every in-sync copy
/// (unfound) make it fail.
async fn send_sync<H: PgHost>(host: &H, osd: i32, sync: PgSync) -> Result<(), OsdError> {
    let unfound = send_sync_unfound(host, osd, sync).await?;
    if unfound.is_empty() {
        Ok(())
    } else {
        Err(OsdError::Unfound { objects: unfound })
    }
}

/// Sends a sync; returns the objects the member skipped as unfound.
async fn send_sync_unfound<H: PgHost>(
    host: &H,
    osd: i32,
    sync: PgSync,
) -> Result<Vec<(String, String)>, OsdError> {
    let map = host.map();
    let addr = peer_addr(&map, osd)?;
    let reply = host.peers().sync(osd, addr, sync).await?;
    match reply.error {
        Some((code, msg)) => Err(OsdError::Remote {
            osd,
            code,
            message: format!("could not sync: {msg}"),
        }),
        None => Ok(reply.unfound),
    }
}

/// One peering attempt: gathers what `PeeringMachine` starts from, performs its actions
/// in order and feeds their results back until it reaches an outcome. Every decision is
/// the machine's; this only does the I/O.
async fn try_peer<H: RecoveryHost>(
    host: &H,
    pg: PgId,
    epoch: u32,
    acting: &[i32],
    up: &[i32],
    strays: &[i32],
    authority: Option<i32>,
) -> Outcome {
    let map = host.map();
    let Some(handle) = host.pg_handle(pg) else {
        return Outcome::Failed(OsdError::PgNotOpen { pg });
    };
    let (primary, primary_ec_shard) = {
        let st = settled_read(&handle).await;
        let report = MemberReport {
            osd: host.id(),
            last_update: st.meta.info.last_update,
            log_tail: st.meta.info.log_tail,
            entries: st.meta.entries(),
        };
        (report, st.meta.ec_shard)
    };
    let start = PeeringStart {
        pg,
        epoch,
        me: host.id(),
        acting: acting.to_vec(),
        up: up.to_vec(),
        strays: strays.to_vec(),
        authority,
        min_size: map.pools.get(&pg.pool.0).map_or(1, |pool| pool.min_size) as usize,
        min_agree: map
            .pools
            .get(&pg.pool.0)
            .and_then(|pool| pool.ec())
            .map_or(1, |code| code.k as usize),
        flags: recovery_flags(&map),
        up_osds: map.osds.keys().copied().filter(|&o| map.is_up(o)).collect(),
        // Erasure-coded pools keep shard positions, which a `pg_temp` of members that have the
        // data would not: their primaries catch up by rebuilding their shards instead.
        can_request_pg_temp: host.can_request_pg_temp()
            && map.pools.get(&pg.pool.0).is_none_or(|p| p.ec().is_none()),
        parallel: host.recovery().config().max_active as u32,
        primary,
        ec_positions: crate::ec::shard_positions(&map, pg),
        primary_ec_shard,
    };
    let (mut machine, first) = PeeringMachine::new(start);
    let mut queue: std::collections::VecDeque<Action> = first.into();
    while let Some(action) = queue.pop_front() {
        if machine.outcome().is_some() {
            break;
        }
        let now = host.map().epoch;
        if now != epoch {
            machine.handle(Event::NewMap { epoch: now });
            break;
        }
        let event = perform(host, &map, pg, epoch, action).await;
        queue.extend(machine.handle(event));
    }
    if !machine.moved().is_empty() {
        info!(
            %pg, epoch, moved = ?machine.moved(),
            "members moved to another shard position: backfilling them"
        );
    }
    machine.into_outcome().unwrap_or_else(|| {
        Outcome::Failed(OsdError::PgBusy {
            pg,
            reason: "peering stopped without an outcome".into(),
        })
    })
}

/// Performs one of peering's actions; returns what happened.
async fn perform<H: RecoveryHost>(
    host: &H,
    map: &kelp_maps::OsdMap,
    pg: PgId,
    epoch: u32,
    action: Action,
) -> Event {
    match action {
        Action::Query { osd, have } => Event::Queried {
            osd,
            result: query_member(host, map, pg, epoch, osd, have, false).await,
        },
        Action::List { osd } => Event::Listed {
            osd,
            result: query_member(host, map, pg, epoch, osd, (0, 0), true)
                .await
                .map(|r| r.objects.unwrap_or_default()),
        },
        Action::RequestPgTemp { osds, why } => {
            info!(%pg, epoch, temp = ?osds, "{why}: asking for a pg_temp");
            Event::PgTempRequested(host.request_pg_temp(pg, osds))
        }
        Action::SyncPrimary(sync) => Event::PrimarySynced(sync_pg(host, sync).await),
        Action::SyncMember { osd, job } => {
            let result = match full_sync(host, pg, epoch, &job).await {
                Ok(sync) => send_sync(host, osd, sync).await,
                Err(e) => Err(e),
            };
            Event::MemberSynced { osd, result }
        }
        Action::RecordActivation(activation) => {
            let verdict = match host.send_activation(activation).await {
                Ok(v) => v,
                Err(_) => Err(OsdError::Monitor {
                    reason: "the monitor link dropped the activation".into(),
                }),
            };
            Event::Verdict(verdict)
        }
    }
}

/// What brings a member left behind to this primary's history as of now: the objects to
/// copy, for a backfill the listing to keep (everything else is removed), and the log to
/// adopt afterwards.
async fn first_round<H: PgHost>(
    host: &H,
    handle: &PgHandle,
    job: &Job,
) -> Result<FirstRound, OsdError> {
    Ok(match job {
        Job::Recover {
            keep_through,
            objects,
            entries,
            log_tail,
            base,
        } => FirstRound {
            objects: objects.clone(),
            keep_only: None,
            log: SyncLog {
                keep_through: Some(*keep_through),
                entries: entries.iter().cloned().map(Into::into).collect(),
                log_tail: *log_tail,
                last_update: *base,
            },
        },
        Job::Backfill => {
            let (log, listing) = snapshot(host, handle).await?;
            FirstRound {
                objects: listing.clone(),
                keep_only: Some(listing),
                log,
            }
        }
    })
}

/// One sync that brings a member all the way to this primary's history (while the PG is not
/// serving).
async fn full_sync<H: RecoveryHost>(
    host: &H,
    pg: PgId,
    epoch: u32,
    job: &Job,
) -> Result<PgSync, OsdError> {
    let handle = host.pg_handle(pg).ok_or(OsdError::PgNotOpen { pg })?;
    let round = first_round(host, &handle, job).await?;
    Ok(PgSync {
        pg,
        epoch,
        source: host.id(),
        objects: round.objects,
        keep_only: round.keep_only,
        parallel: host.recovery().config().max_active as u32,
        log: Some(round.log),
    })
}

/// This primary's whole log and object listing, taken together (writes wait meanwhile).
async fn snapshot<H: PgHost>(
    host: &H,
    handle: &PgHandle,
) -> Result<(SyncLog, Vec<(String, String)>), OsdError> {
    let st = handle.read().await;
    let store = host.store();
    let coll = st.meta.coll;
    let listing = tokio::task::spawn_blocking(move || list_all(&*store, coll))
        .await
        .map_err(|e| OsdError::task("listing", e))??;
    let log = SyncLog {
        keep_through: None,
        entries: st.meta.entries().into_iter().map(Into::into).collect(),
        log_tail: st.meta.info.log_tail,
        last_update: st.meta.info.last_update,
    };
    Ok((
        log,
        listing.into_iter().map(|o| (o.namespace, o.name)).collect(),
    ))
}

/// Whether `interval` is still the PG's current one.
async fn current(handle: &PgHandle, interval: u64) -> bool {
    handle.read().await.interval == interval
}

/// Brings the members left behind at activation up to date one by one, each joining the
/// write set when done; then, if a `pg_temp` is in force and every up member is in the
/// write set, asks the monitors to drop it.
async fn recover_in_background<H: RecoveryHost>(
    host: Arc<H>,
    pg: PgId,
    interval: u64,
    lagging: Vec<Lagging>,
) {
    let Some(handle) = host.pg_handle(pg) else {
        return;
    };
    if !lagging.is_empty() {
        let backfill = lagging.iter().any(|l| matches!(l.job, Job::Backfill));
        let mut degraded = 0;
        let pg_objects = {
            let coll = handle.read().await.meta.coll;
            let store = host.store();
            tokio::task::spawn_blocking(move || list_all(&*store, coll).map(|l| l.len()))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(0) as u64
        };
        for l in lagging.iter().filter(|l| l.in_acting) {
            degraded += match &l.job {
                Job::Recover { objects, .. } => objects.len() as u64,
                Job::Backfill => pg_objects,
            };
        }
        {
            let mut st = handle.write().await;
            if st.interval != interval {
                return;
            }
            st.recovery = Some(RecoveryProgress {
                backfill,
                waiting: true,
                degraded,
            });
        }
        let this = host.clone();
        let _slot = host
            .recovery()
            .ctl
            .pgs
            .acquire(1, move || this.recovery().config().max_backfills)
            .await;
        let started = Instant::now();
        for mut l in lagging {
            let mut failures = 0u32;
            let mut reported_unfound = 0;
            let member_started = Instant::now();
            loop {
                match recover_member(&*host, pg, &handle, interval, &mut l).await {
                    Ok(()) => {
                        let mut st = handle.write().await;
                        if st.interval == interval && !st.unfound.is_empty() {
                            info!(%pg, "osd.{}: the unfound objects were found", l.osd);
                            st.unfound.clear();
                            host.stats().state_changed.notify_one();
                        }
                        break;
                    }
                    Err(RecoveryError::Unfound(objects)) => {
                        // Nothing to copy them from: report them, and retry now and then
                        // (a client may overwrite or remove them, a repair may fix one).
                        if objects.len() != reported_unfound {
                            let names: Vec<&str> =
                                objects.iter().take(20).map(|o| o.1.as_str()).collect();
                            warn!(
                                %pg, count = objects.len(), ?names,
                                "osd.{}: objects unfound (every in-sync copy unreadable); \
                                 the member stays behind until they are overwritten, \
                                 removed or repaired",
                                l.osd
                            );
                            reported_unfound = objects.len();
                        }
                        {
                            let mut st = handle.write().await;
                            if st.interval != interval {
                                return;
                            }
                            st.unfound = objects.into_iter().collect();
                            host.stats().state_changed.notify_one();
                        }
                        tokio::time::sleep(UNFOUND_RETRY).await;
                    }
                    Err(RecoveryError::Interrupted) => return,
                    Err(RecoveryError::LogTrimmed) => {
                        debug!(%pg, "osd.{}: the log moved past it; backfilling", l.osd);
                        l.job = Job::Backfill;
                    }
                    Err(RecoveryError::Failed(e)) => {
                        failures += 1;
                        if failures == 1 || failures.is_multiple_of(30) {
                            warn!(%pg, "recovering osd.{} (will retry): {e}", l.osd);
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                if !current(&handle, interval).await {
                    return;
                }
            }
            info!(%pg, "osd.{} recovered in {:.1} s", l.osd, started.elapsed().as_secs_f64());
            // Leave clients their share before the slot goes to the next member or PG.
            let pause = host
                .recovery()
                .config()
                .priority_pause(member_started.elapsed(), host.clients_busy());
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
        let mut st = handle.write().await;
        if st.interval != interval {
            return;
        }
        st.recovery = None;
        host.stats().state_changed.notify_one();
    }
    drop_pg_temp_when_done(&*host, pg, &handle, interval).await;
}

async fn drop_pg_temp_when_done<H: RecoveryHost>(
    host: &H,
    pg: PgId,
    handle: &PgHandle,
    interval: u64,
) {
    let map = host.map();
    let Ok(m) = map.pg_mapping(pg) else { return };
    if m.acting == m.up || m.acting_primary != host.id() {
        return;
    }
    {
        let st = handle.read().await;
        let me = host.id();
        if st.interval != interval || !m.up.iter().all(|o| *o == me || st.write_to.contains(o)) {
            return;
        }
    }
    if host.can_request_pg_temp() {
        info!(%pg, up = ?m.up, "backfill done: dropping the pg_temp");
        let _ = host.request_pg_temp(pg, Vec::new());
    }
}

/// Copies `objects` to `osd` in batches of `osd_recovery_max_active` (the first carrying
/// `keep_only`), with `osd_recovery_sleep` between batches when `throttled` (round one;
/// the catch-up rounds run unthrottled, since the longer a round takes the more objects
/// clients change during it, and the next round copies those again). Records in
/// `copied_at` the PG version each object's copy is at least as new as (the version before
/// its batch was sent: the copy is read later, after every write up to it).
#[allow(clippy::too_many_arguments)]
async fn copy_objects<H: RecoveryHost>(
    host: &H,
    pg: PgId,
    handle: &PgHandle,
    interval: u64,
    osd: i32,
    in_acting: bool,
    throttled: bool,
    objects: &[(String, String)],
    mut keep_only: Option<Vec<(String, String)>>,
    copied_at: &mut CopiedAt,
) -> Result<(), RecoveryError> {
    let mut done = 0;
    let mut unfound = Vec::new();
    loop {
        let at = {
            let st = handle.read().await;
            if st.interval != interval {
                return Err(RecoveryError::Interrupted);
            }
            st.meta.info.last_update.1
        };
        let cfg = host.recovery().config();
        let left = objects.len() - done;
        let slots = host
            .recovery()
            .ctl
            .objects
            .acquire(left.min(cfg.max_active), || {
                host.recovery().config().max_active
            })
            .await;
        let n = slots.count().min(left);
        let missed = send_sync_unfound(
            host,
            osd,
            PgSync {
                pg,
                epoch: host.map().epoch,
                source: host.id(),
                objects: objects[done..done + n].to_vec(),
                keep_only: keep_only.take(),
                parallel: n as u32,
                log: None,
            },
        )
        .await?;
        drop(slots);
        for o in &objects[done..done + n] {
            copied_at.insert(o.clone(), at);
        }
        done += n;
        if in_acting && n > 0 {
            let mut st = handle.write().await;
            if let Some(p) = st.recovery.as_mut() {
                p.degraded = p.degraded.saturating_sub(n as u64);
            }
        }
        unfound.extend(missed);
        if done >= objects.len() {
            return if unfound.is_empty() {
                Ok(())
            } else {
                Err(RecoveryError::Unfound(unfound))
            };
        }
        if throttled && !cfg.sleep.is_zero() {
            tokio::time::sleep(cfg.sleep).await;
        }
    }
}

/// Brings one member left behind up to date and adds it to the PG's write set.
async fn recover_member<H: RecoveryHost>(
    host: &H,
    pg: PgId,
    handle: &PgHandle,
    interval: u64,
    l: &mut Lagging,
) -> Result<(), RecoveryError> {
    {
        let mut st = handle.write().await;
        if st.interval != interval {
            return Err(RecoveryError::Interrupted);
        }
        if let Some(p) = st.recovery.as_mut() {
            p.waiting = false;
            p.backfill = matches!(l.job, Job::Backfill);
        }
    }
    let mut copied_at = CopiedAt::new();
    // Round one: what peering found missing, or everything.
    let round = first_round(host, handle, &l.job).await?;
    let mut base = round.log.last_update;
    copy_objects(
        host,
        pg,
        handle,
        interval,
        l.osd,
        l.in_acting,
        true,
        &round.objects,
        round.keep_only,
        &mut copied_at,
    )
    .await?;
    send_log(host, pg, l.osd, round.log).await?;
    // Catch-up rounds for what clients changed meanwhile, without holding writes back.
    for _ in 0..MAX_CATCH_UP_ROUNDS {
        let (log, objects) = changes_since(handle, interval, base.1, &copied_at).await?;
        if objects.len() <= FINAL_ROUND_OBJECTS {
            break;
        }
        let next = log.last_update;
        copy_objects(
            host,
            pg,
            handle,
            interval,
            l.osd,
            false,
            false,
            &objects,
            None,
            &mut copied_at,
        )
        .await?;
        send_log(host, pg, l.osd, log).await?;
        base = next;
    }
    // The hand-over: hold client writes back, give the member the last writes, let it join.
    {
        let mut st = handle.write().await;
        if st.interval != interval {
            return Err(RecoveryError::Interrupted);
        }
        st.recovery_block = true;
    }
    let guard = BlockGuard {
        handle: Some(handle.clone()),
        interval,
    };
    let handed = tokio::time::timeout(FINAL_ROUND_TIMEOUT, async {
        // Writes admitted before the block settle first.
        drop(settled_read(handle).await);
        let (log, objects) = changes_since(handle, interval, base.1, &copied_at).await?;
        let epoch = host.map().epoch;
        let unfound = send_sync_unfound(
            host,
            l.osd,
            PgSync {
                pg,
                epoch,
                source: host.id(),
                parallel: objects.len().clamp(1, 64) as u32,
                objects,
                keep_only: None,
                log: Some(log),
            },
        )
        .await?;
        if !unfound.is_empty() {
            return Err(RecoveryError::Unfound(unfound));
        }
        Ok::<(), RecoveryError>(())
    })
    .await;
    let mut st = handle.write().await;
    guard.disarm();
    if st.interval != interval {
        return Err(RecoveryError::Interrupted);
    }
    st.recovery_block = false;
    st.changed.notify_waiters();
    match handed {
        Ok(Ok(())) => {
            st.left_behind.retain(|&o| o != l.osd);
            if !st.write_to.contains(&l.osd) {
                st.write_to.push(l.osd);
            }
            host.stats().state_changed.notify_one();
            // Record the bigger write set (queued under the PG lock, so before any later
            // peering's record): the PG stays available while any of them is up.
            let me = host.id();
            let members: Vec<i32> = std::iter::once(me)
                .chain(st.write_to.iter().copied())
                .collect();
            let verdict = host.send_activation(kelp_proto::PgActivation {
                pg,
                primary: me,
                record: kelp_proto::PgRecord {
                    epoch: st.record_epoch,
                    members,
                    last_update: st.meta.info.last_update,
                },
                heard: vec![(me, st.meta.info.last_update)],
            });

            tokio::spawn(async move {
                match verdict.await {
                    Ok(Ok(kelp_proto::ActivationVerdict::Recorded)) => {}
                    other => debug!(%pg, "recording the grown write set: {other:?}"),
                }
            });
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(RecoveryError::Failed(OsdError::PeerUnreachable {
            osd: l.osd,
            reason: format!(
                "the final hand-over took over {} s",
                FINAL_ROUND_TIMEOUT.as_secs()
            ),
        })),
    }
}

/// The log entries after `version` (as a sync log) and the objects they changed after their
/// last copy (`copied_at`; objects never copied, after `version`).
async fn changes_since(
    handle: &PgHandle,
    interval: u64,
    version: u64,
    copied_at: &CopiedAt,
) -> Result<(SyncLog, Vec<(String, String)>), RecoveryError> {
    let st = handle.read().await;
    if st.interval != interval {
        return Err(RecoveryError::Interrupted);
    }
    let entries = st
        .meta
        .entries_after(version)
        .ok_or(RecoveryError::LogTrimmed)?;
    let objects = names(
        entries
            .iter()
            .filter(|e| {
                let key = (e.object.namespace.clone(), e.object.name.clone());
                copied_at.get(&key).is_none_or(|&at| e.version > at)
            })
            .map(|e| e.object.clone()),
    );
    Ok((
        SyncLog {
            keep_through: Some(version),
            entries: entries.into_iter().map(Into::into).collect(),
            log_tail: st.meta.info.log_tail,
            last_update: st.meta.info.last_update,
        },
        objects,
    ))
}

async fn send_log<H: PgHost>(
    host: &H,
    pg: PgId,
    osd: i32,
    log: SyncLog,
) -> Result<(), RecoveryError> {
    let sync = PgSync {
        pg,
        epoch: host.map().epoch,
        source: host.id(),
        objects: Vec::new(),
        keep_only: None,
        parallel: 1,
        log: Some(log),
    };
    Ok(send_sync(host, osd, sync).await?)
}

/// How often recovery tries again to copy objects that were unfound.
const UNFOUND_RETRY: Duration = Duration::from_secs(5);

/// `(norecover, nobackfill)` in `map`.
pub(crate) fn recovery_flags(map: &kelp_maps::OsdMap) -> RecoveryFlags {
    RecoveryFlags::of(map)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use kelp_proto::WireLogEntry;
    use kelp_store::{CollectionId, ObjectStore};

    use super::*;
    use crate::host::fake::{FakeOsd, map};
    use crate::pglog::PgMeta;

    /// What `RecoveryHost` adds to the fake OSD; pg_temp requests are recorded.
    #[derive(Default)]
    struct Bits {
        recovery: Recovery,
        stats: OsdStats,
        pg_temps: Mutex<Vec<(PgId, Vec<i32>)>>,
    }

    impl RecoveryHost for FakeOsd<Bits> {
        async fn pg_or_stray(&self, pg: PgId) -> Option<PgHandle> {
            self.pg_handle(pg)
        }
        fn recovery(&self) -> &Recovery {
            &self.extra.recovery
        }
        fn stats(&self) -> &OsdStats {
            &self.extra.stats
        }
        fn clients_busy(&self) -> bool {
            false
        }
        fn send_activation(
            &self,
            _: PgActivation,
        ) -> oneshot::Receiver<Result<ActivationVerdict, OsdError>> {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(Ok(ActivationVerdict::Recorded));
            rx
        }
        fn can_request_pg_temp(&self) -> bool {
            true
        }
        fn request_pg_temp(&self, pg: PgId, osds: Vec<i32>) -> Result<(), OsdError> {
            self.extra
                .pg_temps
                .lock()
                .expect("pg_temps")
                .push((pg, osds));
            Ok(())
        }
        async fn repair_from_replica(&self, pg: PgId, _: &ObjectLocator) -> Result<i32, OsdError> {
            Err(OsdError::PgBusy {
                pg,
                reason: "no repair in this test".into(),
            })
        }
    }

    fn entry(pool: u32, name: &str, version: u64) -> WireLogEntry {
        WireLogEntry {
            epoch: 1,
            version,
            object: ObjectLocator {
                pool,
                namespace: String::new(),
                key: None,
                name: name.into(),
            },
            reqid: ("client.1".into(), version),
            deleted: false,
        }
    }

    fn names(store: &dyn ObjectStore, pg: PgId) -> Vec<String> {
        let mut out: Vec<String> = list_all(store, CollectionId(pg))
            .expect("list")
            .into_iter()
            .map(|o| o.name)
            .collect();
        out.sort();
        out
    }

    /// A backfill sync (`keep_only`, no objects to pull) removes the objects the authoritative
    /// member does not have and adopts its log, in memory and in the store; a query from a
    /// primary already at that version then ships no entries.
    #[tokio::test]
    async fn a_backfill_sync_drops_what_the_authority_lacks_and_adopts_its_log() {
        let (m, pool) = map(3, 1);
        let pg = PgId::new(pool, 0);
        let epoch = m.epoch;
        let osd = FakeOsd::new(1, m, Bits::default());
        let handle = osd.open(pg);
        let mut txn = Transaction::new();
        for name in ["a", "b", "c"] {
            txn.touch(CollectionId(pg), &oid_for(pg, "", name));
        }
        osd.commit(txn).await.expect("objects");
        assert_eq!(names(&*osd.store, pg), ["a", "b", "c"]);

        let log = SyncLog {
            keep_through: None,
            entries: vec![entry(pool, "a", 4), entry(pool, "a", 5)],
            log_tail: 3,
            last_update: (1, 5),
        };
        let reply = pg_sync(
            &osd,
            PgSync {
                pg,
                epoch,
                source: 0,
                objects: Vec::new(),
                keep_only: Some(vec![(String::new(), "a".into())]),
                parallel: 1,
                log: Some(log),
            },
        )
        .await;
        assert_eq!(reply.error, None);
        assert!(reply.unfound.is_empty());
        assert_eq!(names(&*osd.store, pg), ["a"]);
        assert_eq!(handle.read().await.meta.info.last_update, (1, 5));
        let mut fixup = Transaction::new();
        let stored = PgMeta::load(&*osd.store, CollectionId(pg), 100, &mut fixup).expect("load");
        assert_eq!(stored.info.last_update, (1, 5));
        assert_eq!(stored.info.log_tail, 3);
        assert_eq!(stored.len(), 2);

        let query = |have| PgQuery {
            pg,
            epoch,
            want_objects: false,
            have,
        };
        let behind = pg_query(&osd, query((1, 4))).await;
        assert_eq!(behind.error, None);
        assert_eq!(behind.last_update, (1, 5));
        assert_eq!(behind.entries.len(), 2);
        let same = pg_query(&osd, query((1, 5))).await;
        assert_eq!(same.last_update, (1, 5));
        assert!(same.entries.is_empty());
    }

    /// A PG counts as peering from the call to `peer` until its future is done (here at once:
    /// this OSD is not the PG's primary).
    #[tokio::test]
    async fn a_pg_counts_as_peering_until_its_peering_ends() {
        let (m, pool) = map(3, 1);
        let pg = PgId::new(pool, 0);
        let primary = m.pg_mapping(pg).expect("mapping").acting_primary;
        let other = (0..3).find(|&o| o != primary).expect("another OSD");
        let epoch = m.epoch;
        let osd = Arc::new(FakeOsd::new(other, m, Bits::default()));
        osd.open(pg);
        let peering = peer(osd.clone(), pg, epoch);
        assert_eq!(osd.recovery().peering(), 1);
        peering.await;
        assert_eq!(osd.recovery().peering(), 0);
        assert!(osd.extra.pg_temps.lock().expect("pg_temps").is_empty());
    }
}
