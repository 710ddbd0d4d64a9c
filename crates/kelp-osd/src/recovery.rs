//! Peering and recovery, the I/O around the pure `peering::plan`.
//!
//! When a map changes a PG's acting set, its primary stops serving the PG (client ops get
//! `Inactive` and retry), gathers every member's log (`PgQuery`), plans, and brings each member
//! that is behind or divergent to the authoritative history: itself first (pulling objects from
//! the authoritative member), then the others (`PgSync`: "pull these objects from me, then adopt
//! this log"). Only when every member is in sync does the PG serve again, so a member that
//! missed writes (an OSD that was down) never answers with stale data.
//!
//! `norecover` / `nobackfill` (Ceph's flags): a member that would need log recovery / backfill
//! is left out of the PG's writes ("left behind": the PG is active+degraded) while the flag is
//! set, provided `min_size` members are up to date (else the PG waits, inactive). A primary
//! that is behind still recovers itself, since it could not serve otherwise. When the flag is
//! cleared, the PG peers again and recovers the members left behind.
//!
//! Crash safety: a member applies the objects first and rewrites its log last; a crash in
//! between leaves the old log, so the next peering repeats the sync (copying an object twice is
//! harmless).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kelp_proto::{ErrorCode, PgPull, PgPullReply, PgQuery, PgQueryReply, PgSync, PgSyncReply};
use kelp_store::{CollectionId, ObjectId, ObjectStore, Op, StoreError, Transaction};
use kelp_types::PgId;
use tracing::{debug, info, warn};

use crate::peering::{MemberPlan, MemberReport, plan_with_authority};
use crate::pglog::{INTERNAL_NAMESPACE, LogEntry};
use crate::service::OsdService;

/// Objects copied per store transaction during a sync.
const SYNC_BATCH: usize = 32;

fn oid_for(pg: PgId, namespace: &str, name: &str) -> ObjectId {
    let hash = kelp_crush::object_hash(name, None, namespace);
    ObjectId::new(pg.pool.0, namespace, name, hash)
}

/// Reads an object's complete state (blocking).
pub(crate) fn read_state(
    store: &dyn ObjectStore,
    coll: CollectionId,
    oid: &ObjectId,
) -> Result<(PgPullReply, Bytes), StoreError> {
    let size = match store.stat(coll, oid) {
        Ok(st) => st.size,
        Err(StoreError::ObjectNotFound { .. }) => {
            return Ok((
                PgPullReply {
                    error: None,
                    exists: false,
                    size: 0,
                    xattrs: Vec::new(),
                    omap_header: None,
                    omap: Vec::new(),
                },
                Bytes::new(),
            ));
        }
        Err(e) => return Err(e),
    };
    let data = store.read(coll, oid, 0, size)?;
    let xattrs = store.xattrs(coll, oid)?.into_iter().collect();
    let omap_header = store.omap_header(coll, oid)?;
    let mut omap = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = store.omap_iter(coll, oid, after.as_deref(), 4096)?;
        let last = page.entries.last().map(|(k, _)| k.clone());
        omap.extend(page.entries);
        match last {
            Some(k) if page.more => after = Some(k),
            _ => break,
        }
    }
    Ok((
        PgPullReply {
            error: None,
            exists: true,
            size,
            xattrs,
            omap_header,
            omap,
        },
        Bytes::from(data),
    ))
}

/// Queues, in `txn`, making the local object exactly `state`.
pub(crate) fn apply_state(
    txn: &mut Transaction,
    coll: CollectionId,
    oid: &ObjectId,
    local_exists: bool,
    state: PgPullReply,
    data: Bytes,
) {
    if local_exists {
        txn.remove(coll, oid);
    }
    if !state.exists {
        return;
    }
    txn.touch(coll, oid);
    if !data.is_empty() {
        txn.write(coll, oid, 0, data.to_vec());
    }
    txn.truncate(coll, oid, state.size);
    if !state.xattrs.is_empty() {
        txn.push(Op::SetXattrs {
            coll,
            oid: oid.clone(),
            attrs: state.xattrs.into_iter().collect(),
        });
    }
    if let Some(h) = state.omap_header {
        txn.omap_set_header(coll, oid, h);
    }
    if !state.omap.is_empty() {
        txn.omap_set(
            coll,
            oid,
            state.omap.into_iter().collect::<BTreeMap<_, _>>(),
        );
    }
}

fn list_all(store: &dyn ObjectStore, coll: CollectionId) -> Result<Vec<ObjectId>, StoreError> {
    let mut out = Vec::new();
    let mut from: Option<ObjectId> = None;
    loop {
        let page = store.list_objects(coll, from.as_ref(), 1024)?;
        out.extend(
            page.objects
                .into_iter()
                .filter(|o| o.namespace != INTERNAL_NAMESPACE && o.snap == kelp_store::SNAP_HEAD),
        );
        match page.next {
            Some(n) => from = Some(n),
            None => return Ok(out),
        }
    }
}

impl OsdService {
    /// Answers a primary's query for this member's log of a PG.
    pub async fn pg_query(&self, q: PgQuery) -> PgQueryReply {
        let fail = |code, msg: String| PgQueryReply {
            error: Some((code, msg)),
            last_update: (0, 0),
            log_tail: 0,
            entries: Vec::new(),
            objects: None,
        };
        let map = self.map_at_least(q.epoch).await;
        if map.epoch < q.epoch {
            return fail(
                ErrorCode::Misdirected,
                format!("osd.{} has not seen epoch {} yet", self.id(), q.epoch),
            );
        }
        let Some(pg) = self.pg_handle(q.pg) else {
            return fail(
                ErrorCode::Misdirected,
                format!("osd.{} does not hold PG {}", self.id(), q.pg),
            );
        };
        let state = OsdService::settled_read(&pg).await;
        let objects = if q.want_objects {
            let store = self.store();
            let coll = state.meta.coll;
            match tokio::task::spawn_blocking(move || list_all(&*store, coll)).await {
                Ok(Ok(list)) => Some(list.into_iter().map(|o| (o.namespace, o.name)).collect()),
                Ok(Err(e)) => return fail(ErrorCode::Io, e.to_string()),
                Err(e) => return fail(ErrorCode::Io, e.to_string()),
            }
        } else {
            None
        };
        PgQueryReply {
            error: None,
            last_update: state.meta.info.last_update,
            log_tail: state.meta.info.log_tail,
            entries: state.meta.entries().into_iter().map(Into::into).collect(),
            objects,
        }
    }

    /// Serves one object's complete state to a recovering member.
    pub async fn pg_pull(&self, p: PgPull) -> (PgPullReply, Bytes) {
        let fail = |code, msg: String| {
            (
                PgPullReply {
                    error: Some((code, msg)),
                    exists: false,
                    size: 0,
                    xattrs: Vec::new(),
                    omap_header: None,
                    omap: Vec::new(),
                },
                Bytes::new(),
            )
        };
        let Some(pg) = self.pg_handle(p.pg) else {
            return fail(
                ErrorCode::Misdirected,
                format!("osd.{} does not hold PG {}", self.id(), p.pg),
            );
        };
        let state = OsdService::settled_read(&pg).await;
        let store = self.store();
        let coll = state.meta.coll;
        let oid = oid_for(p.pg, &p.namespace, &p.name);
        let result = tokio::task::spawn_blocking(move || read_state(&*store, coll, &oid)).await;
        drop(state);
        match result {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => fail(ErrorCode::Io, e.to_string()),
            Err(e) => fail(ErrorCode::Io, e.to_string()),
        }
    }

    /// Brings this member's copy of a PG to the authoritative history (see `PgSync`).
    pub async fn pg_sync(&self, s: PgSync) -> PgSyncReply {
        match self.sync_pg(s).await {
            Ok(()) => PgSyncReply { error: None },
            Err(e) => PgSyncReply {
                error: Some((ErrorCode::Io, e)),
            },
        }
    }

    async fn sync_pg(&self, s: PgSync) -> Result<(), String> {
        let map = self.map_at_least(s.epoch).await;
        let handle = self
            .pg_handle(s.pg)
            .ok_or_else(|| format!("osd.{} does not hold PG {}", self.id(), s.pg))?;
        let source_addr = map
            .osds
            .get(&s.source)
            .and_then(|o| o.addr)
            .ok_or_else(|| format!("osd.{} has no address", s.source))?;
        let mut state = OsdService::settled_write(&handle).await;
        let coll = state.meta.coll;
        let store = self.store();
        let wanted: BTreeSet<(String, String)> = s.objects.iter().cloned().collect();
        if s.keep_through.is_none() {
            // Backfill: drop what the authoritative member does not have.
            let st = store.clone();
            let local = tokio::task::spawn_blocking(move || list_all(&*st, coll))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            let mut txn = Transaction::new();
            for o in local {
                if !wanted.contains(&(o.namespace.clone(), o.name.clone())) {
                    txn.remove(coll, &o);
                }
            }
            if !txn.is_empty() {
                self.commit(txn).await?;
            }
        }
        let mut txn = Transaction::new();
        let mut in_txn = 0;
        for (ns, name) in &s.objects {
            let (remote, data) = self
                .peers()
                .pull(
                    s.source,
                    source_addr,
                    PgPull {
                        pg: s.pg,
                        epoch: s.epoch,
                        namespace: ns.clone(),
                        name: name.clone(),
                    },
                )
                .await?;
            if let Some((_, msg)) = remote.error {
                return Err(format!("pulling '{name}' from osd.{}: {msg}", s.source));
            }
            let oid = oid_for(s.pg, ns, name);
            let local_exists = store.exists(coll, &oid).map_err(|e| e.to_string())?;
            self.stats.count_recovered(1, data.len() as u64);
            apply_state(&mut txn, coll, &oid, local_exists, remote, data);
            in_txn += 1;
            if in_txn >= SYNC_BATCH {
                self.commit(std::mem::take(&mut txn)).await?;
                in_txn = 0;
            }
        }
        let entries: Vec<LogEntry> = s.entries.into_iter().map(Into::into).collect();
        let mut meta = state.meta.clone();
        meta.rewrite(&mut txn, s.keep_through, entries, s.log_tail, s.last_update);
        self.commit(txn).await?;
        state.meta = meta;
        debug!(pg = %s.pg, objects = s.objects.len(), "synced from osd.{}", s.source);
        Ok(())
    }

    async fn commit(&self, txn: Transaction) -> Result<(), String> {
        match self.store().submit(txn) {
            Ok(c) => c.await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Peers a PG as its primary at `epoch`, retrying until it succeeds or the map moves on.
    pub(crate) async fn peer(self: Arc<Self>, pg: PgId, epoch: u32) {
        self.peer_with_authority(pg, epoch, None).await
    }

    /// Peers a PG taking `authority`'s history as authoritative (see
    /// `peering::plan_with_authority`): rolls back writes that member refused.
    pub(crate) async fn peer_with_authority(
        self: Arc<Self>,
        pg: PgId,
        epoch: u32,
        authority: Option<i32>,
    ) {
        let mut attempt = 0u32;
        loop {
            let map = self.map();
            if map.epoch != epoch {
                return; // a newer map started its own peering
            }
            let Ok(m) = map.pg_mapping(pg) else { return };
            if m.acting_primary != self.id() {
                return;
            }
            match self.try_peer(pg, epoch, &m.acting, authority).await {
                Ok((recovered, left_behind)) => {
                    let flags = recovery_flags(&map);
                    if self.activate(pg, &m.acting, &left_behind, flags).await {
                        if recovered > 0 {
                            info!(%pg, epoch, recovered, "peered and recovered");
                        }
                        if !left_behind.is_empty() {
                            info!(
                                %pg, epoch, ?left_behind,
                                "active+degraded: recovery of these members paused by \
                                 norecover/nobackfill"
                            );
                        }
                    }
                    return;
                }
                Err(e) => {
                    attempt += 1;
                    if attempt == 1 || attempt.is_multiple_of(20) {
                        warn!(%pg, epoch, "peering failed (will retry): {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    /// One peering attempt; returns how many members were brought up to date, and the members
    /// left behind because `norecover` (log recovery) or `nobackfill` (backfill) is set.
    async fn try_peer(
        &self,
        pg: PgId,
        epoch: u32,
        acting: &[i32],
        authority: Option<i32>,
    ) -> Result<(usize, Vec<i32>), String> {
        let map = self.map();
        let handle = self.pg_handle(pg).ok_or("PG not open")?;
        let me = self.id();
        let mine = {
            let st = OsdService::settled_read(&handle).await;
            MemberReport {
                osd: me,
                last_update: st.meta.info.last_update,
                log_tail: st.meta.info.log_tail,
                entries: st.meta.entries(),
            }
        };
        let mut reports = vec![mine];
        for &osd in acting.iter().filter(|&&o| o != me) {
            let addr = map
                .osds
                .get(&osd)
                .and_then(|o| o.addr)
                .ok_or(format!("osd.{osd} has no address"))?;
            let r = self
                .peers()
                .query(
                    osd,
                    addr,
                    PgQuery {
                        pg,
                        epoch,
                        want_objects: false,
                    },
                )
                .await?;
            if let Some((_, msg)) = r.error {
                return Err(format!("osd.{osd}: {msg}"));
            }
            reports.push(MemberReport {
                osd,
                last_update: r.last_update,
                log_tail: r.log_tail,
                entries: r.entries.into_iter().map(Into::into).collect(),
            });
        }
        let Some(p) = plan_with_authority(&reports, authority) else {
            return Ok((0, Vec::new()));
        };
        // norecover / nobackfill: members that would need the paused kind of copy are left
        // out of the acting set's writes (the PG serves degraded) as long as min_size members
        // remain. The primary itself is still brought up to date, because it cannot serve
        // otherwise (Ceph likewise recovers the objects clients touch under norecover; Kelp has
        // no per-object missing set yet, so the primary copies all it misses).
        let (norecover, nobackfill) = recovery_flags(&map);
        let paused = |m: &MemberPlan| match m {
            MemberPlan::UpToDate => false,
            MemberPlan::Recover { .. } => norecover,
            MemberPlan::Backfill => nobackfill,
        };
        let left_behind: Vec<i32> = p
            .members
            .iter()
            .filter(|&(&osd, m)| osd != me && paused(m))
            .map(|(&osd, _)| osd)
            .collect();
        let min_size = map.pools.get(&pg.pool.0).map_or(1, |pool| pool.min_size) as usize;
        if acting.len() - left_behind.len() < min_size {
            return Err(format!(
                "recovery paused (norecover/nobackfill) and only {} of {} members are up to \
                 date, fewer than min_size {min_size}; waiting",
                acting.len() - left_behind.len(),
                acting.len()
            ));
        }
        let auth = reports
            .iter()
            .find(|r| r.osd == p.authoritative)
            .cloned()
            .ok_or("authoritative member vanished")?;
        let auth_objects = if p.members.values().any(|m| *m == MemberPlan::Backfill) {
            let reply = if auth.osd == me {
                self.pg_query(PgQuery {
                    pg,
                    epoch,
                    want_objects: true,
                })
                .await
            } else {
                let addr = map
                    .osds
                    .get(&auth.osd)
                    .and_then(|o| o.addr)
                    .ok_or("no address")?;
                self.peers()
                    .query(
                        auth.osd,
                        addr,
                        PgQuery {
                            pg,
                            epoch,
                            want_objects: true,
                        },
                    )
                    .await?
            };
            reply.objects.unwrap_or_default()
        } else {
            Vec::new()
        };
        let sync_for = |member: &MemberPlan, source: i32| -> Option<PgSync> {
            match member {
                MemberPlan::UpToDate => None,
                MemberPlan::Recover {
                    common_version,
                    objects,
                    entries,
                } => Some(PgSync {
                    pg,
                    epoch,
                    source,
                    objects: objects
                        .iter()
                        .map(|o| (o.namespace.clone(), o.name.clone()))
                        .collect(),
                    keep_through: Some(*common_version),
                    entries: entries.iter().cloned().map(Into::into).collect(),
                    log_tail: auth.log_tail,
                    last_update: p.last_update,
                }),
                MemberPlan::Backfill => Some(PgSync {
                    pg,
                    epoch,
                    source,
                    objects: auth_objects.clone(),
                    keep_through: None,
                    entries: auth.entries.iter().cloned().map(Into::into).collect(),
                    log_tail: auth.log_tail,
                    last_update: p.last_update,
                }),
            }
        };
        let mut recovered = 0;
        // The primary first, from the authoritative member…
        if let Some(sync) = p.members.get(&me).and_then(|m| sync_for(m, auth.osd)) {
            self.sync_pg(sync).await?;
            recovered += 1;
        }
        // …then every other member, from the primary.
        for (&osd, member) in &p.members {
            if osd == me || left_behind.contains(&osd) {
                continue;
            }
            let Some(sync) = sync_for(member, me) else {
                continue;
            };
            let addr = map
                .osds
                .get(&osd)
                .and_then(|o| o.addr)
                .ok_or(format!("osd.{osd} has no address"))?;
            let reply = self.peers().sync(osd, addr, sync).await?;
            if let Some((_, msg)) = reply.error {
                return Err(format!("osd.{osd} could not sync: {msg}"));
            }
            recovered += 1;
        }
        Ok((recovered, left_behind))
    }
}

/// `(norecover, nobackfill)` in `map`.
pub(crate) fn recovery_flags(map: &kelp_maps::OsdMap) -> (bool, bool) {
    (
        map.has_flag(kelp_maps::ClusterFlag::NoRecover),
        map.has_flag(kelp_maps::ClusterFlag::NoBackfill),
    )
}
