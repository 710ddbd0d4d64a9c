//! The OSD's request handling: client ops on the PGs it is primary for, replica writes from
//! other primaries, and map changes.
//!
//! Hot path: every client op and replica write of the cluster passes through here.
//!
//! Write path (replicated pools), pipelined per PG: the primary takes the PG's write lock (ops
//! on one PG are applied in order), checks that the acting set has at least `min_size` members,
//! assigns the next PG-log version, executes the op and submits the transaction (data + log
//! entry) to its store — which makes it readable, not yet durable — and queues the same ops with
//! the same version to every other acting member, in version order. Then it *releases* the lock
//! and waits for its own commit and the replicas' answers, so the round trips and flushes of
//! successive writes to one PG overlap (the store applies transactions in submission order, and
//! a replica applies a PG's writes strictly in version order, waiting briefly for a predecessor
//! that the network delivered late). The client is answered only when every member has
//! committed its write durably; if any fails, the client gets an error and retries (the
//! duplicate-request check keeps a retried write from applying twice, and waits for the
//! original if it is still in flight).
//!
//! A write between submission and the last answer is "in flight". Reads of an object with a
//! write in flight wait until it settles, so a read never returns data that is not yet on every
//! replica; peering queries and syncs wait until no write of the PG is in flight.
//!
//! The network is behind the `Peers` trait, so a whole cluster of services can be tested in
//! one process; the daemon implements it over the messenger.
//!
//! Peering, recovery and scrub are not here: `OsdService` implements the narrow interfaces
//! those workers are written against (`host::PgHost`, `recovery::RecoveryHost`,
//! `scrub::ScrubHost`), starts them (`recovery::peer` on a map change or a failed write,
//! `scrub::repair_from_replica` on a damaged read, `scrub::start`) and hands them their
//! requests. The dependency is one-way: this module uses them, they never name it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kelp_maps::OsdMap;
use kelp_proto::{
    ActivationVerdict, EcRead, EcReadReply, ErrorCode, ListCursor, MonCommand, ObjectLocator,
    OpResult, OsdOp, OsdOpReply, OsdScrubCommand, OsdScrubReply, PgActivation, PgCommand,
    PgCommandReply, PgList, PgListReply, PgPull, PgPullReply, PgPush, PgPushReply, PgQuery,
    PgQueryReply, PgScrubSummary, PgSync, PgSyncReply, RepOp, RepOpReply, ScrubMapReply,
    ScrubMapRequest,
};
use kelp_store::{CollectionId, ObjectId, ObjectStore, Transaction};
use kelp_types::PgId;
use tokio::sync::{RwLock, oneshot, watch};

use crate::admission;
use crate::error::OsdError;
use crate::exec::{ExecError, Executed, Limits, Stamp, execute};
use crate::host::PgHost;
use crate::pg::{InFlight, PgHandle, PgState};
use crate::pglog::{LogAppend, LogEntry, PgMeta};
use crate::recovery::{self, Recovery, RecoveryConfig, RecoveryHost};
use crate::scrub::{self, ScrubConfig, ScrubHost, Scrubber};
use crate::stats::{OsdStats, ReportSource};
use crate::{ec, ec_io};

/// OSD settings (Ceph's names where the concept is Ceph's).
#[derive(Debug, Clone)]
pub struct OsdConfig {
    pub id: i32,
    /// `osd_max_pg_log_entries`: log entries kept per PG.
    pub max_pg_log_entries: usize,
    pub limits: Limits,
    /// How long a client op waits for this OSD to catch up with the client's newer map.
    pub map_wait: Duration,
    /// Scrub settings (the initial ones; the central config may change them at runtime).
    pub scrub: ScrubConfig,
}

impl OsdConfig {
    pub fn new(id: i32) -> Self {
        OsdConfig {
            id,
            max_pg_log_entries: 3000,
            limits: Limits::default(),
            map_wait: Duration::from_secs(5),
            scrub: ScrubConfig::default(),
        }
    }
}

pub use crate::host::Peers;

/// An activation record on its way to the monitors, with where their verdict goes.
pub type ActivationRequest = (
    kelp_proto::PgActivation,
    tokio::sync::oneshot::Sender<Result<kelp_proto::ActivationVerdict, OsdError>>,
);

pub struct OsdService {
    cfg: OsdConfig,
    store: Arc<dyn ObjectStore>,
    peers: Arc<dyn Peers>,
    map_tx: watch::Sender<Arc<OsdMap>>,
    pgs: Mutex<HashMap<PgId, PgHandle>>,
    /// Client I/O counters, the full-ratio failsafe and PG count caches (`crate::stats`).
    stats: OsdStats,
    /// Scrub settings, queue and summaries (`crate::scrub`, through `ScrubHost`).
    scrubber: Scrubber,
    /// Recovery throttles and slots, and the PGs peering now (`crate::recovery`, through
    /// `RecoveryHost`).
    recovery: Recovery,
    /// Commands to the monitors (a `pg_temp` request); unset in tests without monitors.
    mon_link: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<kelp_proto::MonCommand>>,
    /// PG activation records to the monitors (`PgActivate`, batched by the daemon); unset in
    /// tests without monitors, where every activation is accepted.
    activation_link: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<ActivationRequest>>,
    /// When this OSD last served a client op (ms since `started`), for recovery's scheduler.
    last_client_op_ms: AtomicU64,
    started: Instant,
    /// PG mappings of the current map, for the client-op path.
    mappings: kelp_maps::MappingCache,
    /// Watchers of this OSD's primary objects and notifies in progress (`crate::watch`).
    watches: Arc<crate::watch::Watches>,
    /// Prometheus metrics: per-op counters and latency, the last report (`crate::metrics`).
    metrics: crate::metrics::OsdMetrics,
    /// PGs of deleted pools queued for removal (`crate::pg_removal`): never opened again.
    removals: Arc<crate::pg_removal::Removals>,
}

/// Clients count as busy on an OSD for this long after their last op.
const CLIENTS_BUSY_FOR: Duration = Duration::from_millis(200);

fn refuse(refusal: &admission::Refusal, epoch: u32) -> (OsdOpReply, Bytes) {
    reply_err(refusal.code(), refusal.to_string(), epoch)
}

fn reply_err(code: ErrorCode, message: impl Into<String>, epoch: u32) -> (OsdOpReply, Bytes) {
    (
        OsdOpReply {
            error: Some((code, message.into())),
            version: 0,
            epoch,
            outs: Vec::new(),
        },
        Bytes::new(),
    )
}

/// Whose counter a write's request id belongs to, for telling a resend from a new write: the
/// client instance (`ENTITY.NONCE`, one per RADOS connection), bound to the authenticated
/// entity. Several processes may authenticate as one entity (every daemon and tool that uses
/// `client.admin`) and each numbers its ops from its own counter, so keyed on the entity alone
/// a new write of one process could be taken for a resend of another's and acknowledged
/// without being applied.
pub fn reqid_owner(entity: &str, instance: &str) -> String {
    if instance.is_empty() {
        return entity.to_string();
    }
    match instance.strip_prefix(entity) {
        Some(rest) if rest.starts_with('.') => instance.to_string(),
        _ => format!("{entity}/{instance}"),
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl OsdService {
    pub fn new(
        cfg: OsdConfig,
        store: Arc<dyn ObjectStore>,
        peers: Arc<dyn Peers>,
        map: OsdMap,
    ) -> Arc<OsdService> {
        let (map_tx, _) = watch::channel(Arc::new(map));
        let scrubber = Scrubber::new(cfg.scrub.clone());
        Arc::new(OsdService {
            scrubber,
            cfg,
            store,
            peers,
            map_tx,
            pgs: Mutex::new(HashMap::new()),
            stats: OsdStats::default(),
            metrics: crate::metrics::OsdMetrics::default(),
            recovery: Recovery::default(),
            mon_link: std::sync::OnceLock::new(),
            activation_link: std::sync::OnceLock::new(),
            last_client_op_ms: AtomicU64::new(u64::MAX),
            started: Instant::now(),
            mappings: kelp_maps::MappingCache::new(),
            watches: Arc::default(),
            removals: Arc::default(),
        })
    }

    /// Watch/notify state (`crate::watch`): the daemon runs its expiry ticks and sets its
    /// timeout.
    pub fn watches(&self) -> &Arc<crate::watch::Watches> {
        &self.watches
    }

    /// A watch operation: admitted like a stat of the object (this OSD must be the active
    /// primary, the instance not fenced; watching, notifying and listing need the object to
    /// exist), then served by the watch table.
    pub async fn watch_op(
        self: &Arc<Self>,
        peer: kelp_msgr::Peer,
        req: kelp_proto::WatchRequest,
        data: Bytes,
    ) -> (kelp_proto::WatchReply, Bytes) {
        use kelp_proto::WatchOp;
        let stat = OsdOp {
            reqid: req.reqid,
            epoch: req.epoch,
            pg: req.pg,
            object: req.object.clone(),
            ops: vec![kelp_proto::OpKind::Stat],
            instance: req.instance.clone(),
        };
        let (reply, _) = self.client_op(peer.entity(), stat, Bytes::new()).await;
        let needs_object = matches!(
            req.op,
            WatchOp::Watch { .. } | WatchOp::Notify { .. } | WatchOp::ListWatchers
        );
        match reply.error {
            Some((ErrorCode::NotFound, _)) if !needs_object => {}
            Some(error) => {
                let result = kelp_proto::WatchResult::None;
                let epoch = reply.epoch;
                let error = Some(error);
                return (
                    kelp_proto::WatchReply {
                        error,
                        epoch,
                        result,
                    },
                    Bytes::new(),
                );
            }
            None => {}
        }
        self.watches.handle(peer, &req, data, reply.epoch).await
    }

    /// Where this OSD sends commands for the monitors (the daemon forwards them).
    pub fn set_mon_link(&self, tx: tokio::sync::mpsc::UnboundedSender<kelp_proto::MonCommand>) {
        let _ = self.mon_link.set(tx);
    }

    /// Where activation records go (see `ActivationRequest`).
    pub fn set_activation_link(&self, tx: tokio::sync::mpsc::UnboundedSender<ActivationRequest>) {
        let _ = self.activation_link.set(tx);
    }

    /// Waits (at most `limit`) until no PG of this OSD is peering, so that a statistics report
    /// shows the states peering settles on rather than the few milliseconds of peering after a
    /// map change (a PG still peering after `limit` is reported as peering).
    pub async fn settle_peering(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.recovery.peering() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether any PG of this OSD is peering right now.
    pub fn is_peering(&self) -> bool {
        self.recovery.peering() > 0
    }

    pub fn id(&self) -> i32 {
        self.cfg.id
    }

    pub fn map(&self) -> Arc<OsdMap> {
        self.map_tx.borrow().clone()
    }

    /// Installs a newer map and makes sure this OSD holds a PG for every PG whose acting set
    /// includes it (creating empty ones on first sight). Older maps are ignored.
    pub async fn set_map(self: &Arc<Self>, map: OsdMap) -> Result<(), ExecError> {
        if map.epoch <= self.map().epoch && !self.pgs.lock().expect("pg table").is_empty() {
            return Ok(());
        }
        let map = Arc::new(map);
        let me = self.cfg.id;
        let mut wanted = Vec::new();
        for pool in map.pools.values() {
            for seed in 0..pool.pg_num {
                let pg = PgId::new(pool.id, seed);
                if let Ok(m) = map.pg_mapping(pg)
                    && (m.acting.contains(&me) || m.up.contains(&me))
                {
                    wanted.push(pg);
                }
            }
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.open_pgs(&wanted))
            .await
            .map_err(|e| ExecError {
                code: ErrorCode::Io,
                message: format!("PG setup task failed: {e}"),
            })??;
        self.map_tx.send_replace(map.clone());
        // PGs of pools the map no longer has stop serving now; their collections go to the
        // remover (`crate::pg_removal`).
        let dropped = {
            let mut pgs = self.pgs.lock().expect("pg table");
            let before = pgs.len();
            pgs.retain(|pg, _| map.pools.contains_key(&pg.pool.0));
            before - pgs.len()
        };
        if dropped > 0 {
            tracing::info!(dropped, epoch = map.epoch, "PGs of deleted pools closed");
        }
        self.removals.wake();
        // Peer every PG this OSD is primary of whose acting set changed.
        for pool in map.pools.values() {
            for seed in 0..pool.pg_num {
                let pg = PgId::new(pool.id, seed);
                let Ok(m) = map.pg_mapping(pg) else { continue };
                let Some(handle) = self.pg(pg) else { continue };
                if m.acting_primary != me {
                    let mut st = handle.write().await;
                    if st.active.is_some() {
                        st.deactivate();
                    }
                    continue;
                }
                let repeer = {
                    let st = handle.read().await;
                    st.active.as_deref() != Some(&m.acting[..])
                        || st.peered_up != m.up
                        || (!st.left_behind.is_empty()
                            && st.recovery_flags != crate::peering_machine::RecoveryFlags::of(&map))
                };
                if repeer {
                    let peering = recovery::peer(self.clone(), pg, map.epoch);
                    handle.write().await.deactivate();
                    tokio::spawn(peering);
                }
            }
        }
        self.watches.on_map(&map, |pg| {
            map.pg_mapping(pg).is_ok_and(|m| m.acting_primary == me)
        });
        Ok(())
    }

    /// Loads or creates the given PGs (blocking: store I/O).
    fn open_pgs(&self, wanted: &[PgId]) -> Result<(), ExecError> {
        let mut create = Transaction::new();
        let mut opened = Vec::new();
        for &pg in wanted {
            if self.pgs.lock().expect("pg table").contains_key(&pg) {
                continue;
            }
            let coll = CollectionId(pg);
            if self.removals.is_queued(pg) {
                continue;
            }
            let exists = self.store.collection_exists(coll)?;
            if exists && crate::pg_removal::is_marked(&*self.store, coll)? {
                // a removal was started (its pool is deleted): never serve it again
                self.removals.wake();
                continue;
            }
            let meta = if exists {
                PgMeta::load(&*self.store, coll, self.cfg.max_pg_log_entries, &mut create)?
            } else {
                PgMeta::create(&mut create, coll, self.cfg.max_pg_log_entries)
            };
            self.scrubber.load(&*self.store, pg);
            opened.push((pg, meta));
        }
        if !create.is_empty() {
            self.store.submit(create)?.wait()?;
        }
        let mut pgs = self.pgs.lock().expect("pg table");
        for (pg, meta) in opened {
            pgs.entry(pg)
                .or_insert_with(|| Arc::new(RwLock::new(PgState::new(meta))));
        }
        Ok(())
    }

    fn pg(&self, pg: PgId) -> Option<PgHandle> {
        self.pgs.lock().expect("pg table").get(&pg).cloned()
    }

    /// Every PG this OSD holds.
    pub(crate) fn pg_handles(&self) -> Vec<(PgId, PgHandle)> {
        let pgs = self.pgs.lock().expect("pg table");
        pgs.iter().map(|(pg, h)| (*pg, h.clone())).collect()
    }

    /// This OSD's statistics report: store usage, client I/O counters, and its primary PGs
    /// (`crate::stats`).
    pub async fn stats_report(&self) -> kelp_proto::OsdStatsReport {
        let map = self.map();
        let report = OsdStats::report(ReportSource {
            me: self.cfg.id,
            map: &map,
            store: self.store.clone(),
            pgs: self.pg_handles(),
            stats: &self.stats,
        })
        .await;
        self.metrics.note_report(&report);
        report
    }

    /// The remover of deleted pools' PGs' queue (`crate::pg_removal`).
    pub(crate) fn removals(&self) -> &Arc<crate::pg_removal::Removals> {
        &self.removals
    }

    /// This OSD's Prometheus metrics.
    pub fn metrics(&self) -> &crate::metrics::OsdMetrics {
        &self.metrics
    }

    /// Counters and the full-ratio failsafe behind this OSD's stats reports.
    /// The object store's cache and allocation figures (for the metrics; cheap, no I/O).
    pub fn store_stats(&self) -> kelp_store::StoreStats {
        self.store.stats()
    }

    pub fn stats(&self) -> &OsdStats {
        &self.stats
    }

    /// Resolves once a map newer than `epoch` no longer has `osd` in `pg`'s acting or up set.
    async fn left_pg(&self, pg: PgId, osd: i32, epoch: u32) {
        let mut rx = self.map_tx.subscribe();
        let left = rx
            .wait_for(|m| {
                m.epoch > epoch
                    && m.pg_mapping(pg)
                        .map_or(true, |x| !x.acting.contains(&osd) && !x.up.contains(&osd))
            })
            .await
            .map(|_| ());
        if left.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether this OSD has peered `pg` for exactly `acting`.
    pub async fn is_active(&self, pg: PgId, acting: &[i32]) -> bool {
        match self.pg(pg) {
            Some(h) => h.read().await.active.as_deref() == Some(acting),
            None => false,
        }
    }

    /// Whether this OSD has peered `pg` for exactly `acting` and every member is in sync (no
    /// member left behind for recovery).
    pub async fn is_active_in_sync(&self, pg: PgId, acting: &[i32]) -> bool {
        match self.pg(pg) {
            Some(h) => {
                let st = h.read().await;
                st.active.as_deref() == Some(acting) && st.left_behind.is_empty()
            }
            None => false,
        }
    }

    /// Handles a client op; returns the reply and its data segment. Writes are refused with
    /// `Full` while the map's `full` flag is set or this OSD's store is past the full ratio
    /// (removals pass; a write flagged [`OpKind::FullTry`] passes up to the failsafe ratio);
    /// successful ops are counted for the stats reports.
    pub async fn client_op(
        self: &Arc<Self>,
        client: &str,
        mut op: OsdOp,
        data: Bytes,
    ) -> (OsdOpReply, Bytes) {
        let full_try = op.ops.iter().any(kelp_proto::OpKind::is_full_try);
        if full_try {
            op.ops.retain(|o| !o.is_full_try());
        }
        // Fencing first, with a map at least as new as the client's (the blocklisting client
        // sends ops at the epoch that has its entry).
        let mut map = self.map();
        if map.epoch < op.epoch {
            map = self.map_at_least(op.epoch).await;
        }
        if let Some((code, message)) = crate::watch::fenced(&map, &op.instance) {
            return reply_err(code, message, map.epoch);
        }
        let is_write = op.ops.iter().any(|o| o.is_write());
        if is_write {
            let mut map = self.map();
            if map.epoch < op.epoch {
                map = self.map_at_least(op.epoch).await;
            }
            let full = map.has_flag(kelp_maps::ClusterFlag::Full);
            if let Some(refusal) =
                self.stats
                    .refuse_full(self.cfg.id, full, full_try, &op.ops, &*self.store)
            {
                return reply_err(refusal.code(), refusal.to_string(), map.epoch);
            }
        }
        let in_bytes = data.len() as u64;
        self.last_client_op_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
        let timer = self.metrics.op_started(&op.ops);
        let (reply, out) = self.serve_client_op(client, op, data, false).await;
        timer.finish(reply.error.is_none(), in_bytes, out.len() as u64);
        if reply.error.is_none() {
            let bytes = if is_write { in_bytes } else { out.len() as u64 };
            self.stats.count_op(is_write, bytes);
        }
        (reply, out)
    }

    /// An op the OSD sends itself through the client path (the snapshot trimmer): internal
    /// ops allowed, ordered, logged and replicated as any client write.
    pub(crate) async fn internal_op(
        self: &Arc<Self>,
        client: &str,
        op: OsdOp,
    ) -> (OsdOpReply, Bytes) {
        self.serve_client_op(client, op, Bytes::new(), true).await
    }

    async fn serve_client_op(
        self: &Arc<Self>,
        client: &str,
        mut op: OsdOp,
        data: Bytes,
        internal: bool,
    ) -> (OsdOpReply, Bytes) {
        let map = self.map_at_least(op.epoch).await;
        let epoch = map.epoch;
        // Admission (`crate::admission`): the map's say first, then the PG's state.
        let pool = map.pools.get(&op.pg.pool.0);
        let mapping = pool.map(|_| self.mappings.get(&map, op.pg));
        // A snapshot clone (the trimmer's ops) is placed by its head.
        let placed = match crate::snapset::parse_clone(&op.object.namespace, &op.object.name) {
            Some(_) => std::borrow::Cow::Owned(crate::snapset::head_locator(&op.object)),
            None => std::borrow::Cow::Borrowed(&op.object),
        };
        let placement = admission::admit_placement(&admission::OpFacts {
            me: self.cfg.id,
            epoch,
            pg: op.pg,
            pool: pool.map(|p| admission::PoolFacts {
                id: p.id,
                size: p.size,
                min_size: p.min_size,
            }),
            object_pool: op.object.pool,
            object_name: &op.object.name,
            object_pg: pool.map(|p| {
                p.placement()
                    .object_pg(&placed.name, placed.key.as_deref(), &placed.namespace)
            }),
            mapping: match &mapping {
                Some(Ok(m)) => admission::Mapping::Mapped {
                    primary: m.acting_primary,
                    acting: &m.acting[..],
                },
                Some(Err(e)) => admission::Mapping::Unmappable(e.to_string()),
                None => {
                    admission::Mapping::Unmappable(format!("pool {} does not exist", op.pg.pool))
                }
            },
        });
        if let Err(refusal) = placement {
            return refuse(&refusal, epoch);
        }
        let Some(Ok(mapping)) = mapping else {
            unreachable!("admitted ops have a mapping")
        };
        // Erasure-coded pool: its code and which member holds which shard.
        let ec = pool
            .and_then(|p| p.ec())
            .map(|profile| (profile.clone(), ec_io::positions(&mapping)));
        let Some(pg) = self.pg(op.pg) else {
            return refuse(&admission::Refusal::NotOpen { pg: op.pg }, epoch);
        };
        let is_write = op.ops.iter().any(|o| o.is_write());
        // Self-managed snapshots (`crate::snaps`): in a pool with snapshots, or for an op that
        // names them, the snapshot modifiers are taken out here and resolved below.
        if !internal && crate::snapset::is_clone_namespace(&op.object.namespace) {
            return reply_err(
                ErrorCode::Invalid,
                "namespaces starting with \x1f are Kelp's own",
                epoch,
            );
        }
        let snap_pool = pool.filter(|p| p.snap_seq > 0);
        let snap_mode = snap_pool.is_some() || crate::snaps::mentions_snapshots(&op.ops);
        let removed_snaps = snap_pool.map(|p| &p.removed_snaps);
        let mut snap_req = crate::snaps::SnapRequest::default();
        if snap_mode {
            match crate::snaps::split_ops(std::mem::take(&mut op.ops), internal) {
                Ok((req, ops)) => {
                    snap_req = req;
                    op.ops = ops;
                }
                Err(e) => return reply_err(e.code, e.message, epoch),
            }
        }
        if !is_write {
            let state = loop {
                let state = pg.read().await;
                if !state.in_flight_on(&op.object) {
                    break state;
                }
                // A write to this object is not yet on every replica: wait for it to settle.
                let changed = state.changed.clone();
                let settled = changed.notified();
                drop(state);
                settled.await;
            };
            if let Err(refusal) =
                admission::admit_to_pg(op.pg, &mapping.acting, state.active.as_deref(), false, &[])
            {
                return refuse(&refusal, epoch);
            }
            if snap_mode && !crate::snapset::is_clone_namespace(&op.object.namespace) {
                let head = match self
                    .snap_head(state.meta.coll, &op.object, ec.is_some())
                    .await
                {
                    Ok(h) => h,
                    Err(e) => return reply_err(e.code, e.message, epoch),
                };
                let empty = std::collections::BTreeSet::new();
                match crate::snaps::read_target(
                    &op.object,
                    &head,
                    &snap_req,
                    removed_snaps.unwrap_or(&empty),
                ) {
                    crate::snaps::ReadTarget::Object(loc) => op.object = loc,
                    crate::snaps::ReadTarget::NotFound(why) => {
                        return reply_err(ErrorCode::NotFound, why, epoch);
                    }
                    crate::snaps::ReadTarget::List(info) => {
                        let bytes = kelp_proto::encode(&info);
                        return (
                            OsdOpReply {
                                error: None,
                                version: 0,
                                epoch,
                                outs: vec![OpResult::Data {
                                    len: bytes.len() as u64,
                                }],
                            },
                            Bytes::from(bytes),
                        );
                    }
                }
            }
            if let Some((profile, members)) = &ec {
                // Held: no write of the PG starts while the shards are gathered.
                let readable = ec_io::readable(members, self.cfg.id, &state);
                let reply = self
                    .ec_read_op(profile, &state, readable, &op, &data, epoch)
                    .await;
                drop(state);
                return reply;
            }
            let store = self.store.clone();
            let limits = self.cfg.limits;
            let coll = state.meta.coll;
            let stamp = Stamp {
                version: 0,
                mtime_ns: 0,
            };
            // First right here, if the store can answer from memory (onode cache, page cache:
            // `kelp_store::nowait`), else on a blocking thread. Reads that need the device never
            // run on the async worker: under I/O contention from other processes a slow pread
            // stalled both workers and reads fell 3-6x (measured 2026-11-22).
            let inline = kelp_store::nowait::attempt(|| {
                execute(&*store, coll, &op.object, &op.ops, &data, stamp, &limits)
            });
            let (pgid, object, ops, op_data) =
                (op.pg, op.object.clone(), op.ops.clone(), data.clone());
            let result = match inline {
                Some(done) => Ok(done),
                None => {
                    tokio::task::spawn_blocking(move || {
                        execute(&*store, coll, &op.object, &op.ops, &data, stamp, &limits)
                    })
                    .await
                }
            };
            drop(state);
            if let Ok(Err(e)) = &result
                && e.code == ErrorCode::Corrupt
            {
                // This copy failed its checksum: never answer from it. Fetch a good copy from
                // another member (which also repairs this one) and read again.
                if let Err(why) = scrub::repair_from_replica(&**self, pgid, &object).await {
                    return reply_err(
                        ErrorCode::Corrupt,
                        format!("osd.{}: {}; {why}", self.cfg.id, e.message),
                        epoch,
                    );
                }
                let state = pg.read().await;
                let store = self.store.clone();
                let result = tokio::task::spawn_blocking(move || {
                    execute(&*store, coll, &object, &ops, &op_data, stamp, &limits)
                })
                .await;
                drop(state);
                return match result {
                    Ok(Ok(done)) => ok_reply(done, epoch),
                    Ok(Err(e)) => reply_err(e.code, e.message, epoch),
                    Err(e) => reply_err(ErrorCode::Io, format!("read task failed: {e}"), epoch),
                };
            }
            return match result {
                Ok(Ok(done)) => ok_reply(done, epoch),
                Ok(Err(e)) => reply_err(e.code, e.message, epoch),
                Err(e) => reply_err(ErrorCode::Io, format!("read task failed: {e}"), epoch),
            };
        }

        // ---- write: ordered per PG, applied on every acting member before the ack
        let reqid = (reqid_owner(client, &op.instance), op.reqid);
        let oid = crate::exec::object_id(&op.object);
        let mut state = loop {
            let mut state = pg.write().await;
            if state.active.as_deref() == Some(&mapping.acting[..]) {
                state
                    .failed_replicas
                    .retain(|osd| mapping.acting.contains(osd));
            }
            if let Err(refusal) = admission::admit_to_pg(
                op.pg,
                &mapping.acting,
                state.active.as_deref(),
                true,
                &state.failed_replicas,
            ) {
                return refuse(&refusal, epoch);
            }
            if state.recovery_block || state.scrub_block.as_ref().is_some_and(|b| b.blocks(&oid)) {
                // The primary is comparing this object's chunk across the members, or handing
                // a recovered member the last writes.
                let changed = state.changed.clone();
                let settled = changed.notified();
                drop(state);
                settled.await;
                continue;
            }
            let Some(version) = state.meta.applied_version(&reqid) else {
                break state;
            };
            if !state.in_flight.contains_key(&version) {
                return (
                    OsdOpReply {
                        error: None,
                        version,
                        epoch,
                        outs: op.ops.iter().map(|_| OpResult::None).collect(),
                    },
                    Bytes::new(),
                );
            }
            // A resend of a write still in flight: answer once the original has settled.
            let changed = state.changed.clone();
            let settled = changed.notified();
            drop(state);
            settled.await;
        };
        // Fenced while it waited for the PG (the blocklisting map arrived meanwhile).
        if let Some((code, message)) = crate::watch::fenced(&self.map(), &op.instance) {
            return reply_err(code, message, epoch);
        }
        // Snapshots: plan the clone, a rollback and the new snapset under the PG's write lock
        // (`crate::snapset::plan_write`); the trimmer's op becomes the trimmed snapset.
        let mut snap_plan: Option<(crate::snapset::WritePlan, crate::snapset::HeadFacts)> = None;
        if snap_mode {
            let empty = std::collections::BTreeSet::new();
            let removed = removed_snaps.unwrap_or(&empty);
            if let Some((_, _, clone)) =
                crate::snapset::parse_clone(&op.object.namespace, &op.object.name)
            {
                // The trimmer deleting a clone: only once the head's snapset no longer has it.
                let head_loc = crate::snapset::head_locator(&op.object);
                match self
                    .snap_head(state.meta.coll, &head_loc, ec.is_some())
                    .await
                {
                    Ok(h) if h.snapset.clones.iter().any(|c| c.id == clone) => {
                        return reply_err(ErrorCode::Canceled, "the clone is still in use", epoch);
                    }
                    Ok(_) => {}
                    Err(e) => return reply_err(e.code, e.message, epoch),
                }
            } else {
                let head = match self
                    .snap_head(state.meta.coll, &op.object, ec.is_some())
                    .await
                {
                    Ok(h) => h,
                    Err(e) => return reply_err(e.code, e.message, epoch),
                };
                let plan = if snap_req.trim {
                    let Some(trim) = crate::snapset::plan_trim(&head.snapset, removed) else {
                        return ok_reply(Executed::default(), epoch);
                    };
                    crate::snapset::WritePlan {
                        pre: Vec::new(),
                        body: Vec::new(),
                        post: vec![kelp_proto::OpKind::SnapSetHead {
                            snapset: trim.snapset.encode(),
                        }],
                        clone: None,
                        snapset: trim.snapset,
                        restores: None,
                    }
                } else {
                    crate::snapset::plan_write(
                        &head,
                        &snap_req.snapc.clone().unwrap_or_default(),
                        &op.ops,
                        removed,
                    )
                };
                op.ops = plan.ops();
                snap_plan = Some((plan, head));
            }
        }
        let stamp = Stamp {
            version: state.meta.next_version(),
            mtime_ns: now_ns(),
        };
        let plan = state.meta.plan_append(epoch, stamp.version);
        let entry = LogEntry {
            epoch,
            version: stamp.version,
            object: op.object.clone(),
            reqid: reqid.clone(),
            deleted: false,
        };
        // Erasure-coded pools: every member gets its own shard's ops (`crate::ec`).
        let ec_write = match &ec {
            Some((profile, members)) => {
                let mut before = match self.ec_before(state.meta.coll, &op.object).await {
                    Ok(b) => b,
                    Err(e) => return reply_err(e.code, e.message, epoch),
                };
                let readable = ec_io::readable(members, self.cfg.id, &state);
                let io = self.shard_io(
                    op.pg,
                    epoch,
                    &op.object,
                    state.meta.coll,
                    readable,
                    stamp.version - 1,
                );
                match &snap_plan {
                    Some((sp, head)) => {
                        if head.whiteout {
                            // A whiteout is no object to the erasure code.
                            before.exists = false;
                            before.meta = None;
                        }
                        match crate::snaps::plan_ec_write(
                            profile,
                            before,
                            sp,
                            head,
                            members.len(),
                            &data,
                            &self.cfg.limits,
                            &io,
                        )
                        .await
                        {
                            Ok(w) => Some((w, members.clone())),
                            Err(e) => return reply_err(e.code, e.message, epoch),
                        }
                    }
                    None => {
                        match ec::plan_write(profile, before, &op.ops, &data, &self.cfg.limits, &io)
                            .await
                        {
                            Ok(w) => Some((w, members.clone())),
                            Err(e) => return reply_err(e.code, e.message, epoch),
                        }
                    }
                }
            }
            None => None,
        };
        let (my_ops, my_data, my_internal) = match &ec_write {
            Some((w, members)) => {
                let Some(me) = ec_io::position(members, self.cfg.id) else {
                    return reply_err(
                        ErrorCode::Misdirected,
                        format!("osd.{} holds no shard of PG {}", self.cfg.id, op.pg),
                        epoch,
                    );
                };
                (
                    w.shards[me].ops.clone(),
                    Bytes::copy_from_slice(&w.shards[me].data),
                    w.internal_xattrs(me),
                )
            }
            None => (op.ops.clone(), data.clone(), Vec::new()),
        };
        let plan = plan.for_ec_shard(&state.meta, ec::held_shard(&my_internal));
        let (mut done, entry, plan, commit) = match self
            .apply_locally(
                state.meta.coll,
                &my_ops,
                &my_data,
                stamp,
                plan,
                entry,
                &my_internal,
            )
            .await
        {
            Ok(Applied::Write(w)) => {
                let AppliedWrite {
                    done,
                    entry,
                    plan,
                    commit,
                    started,
                } = *w;
                (done, entry, plan, self.committed(commit, started))
            }
            Ok(Applied::NotAWrite(done)) => return ok_reply(done, epoch),
            Err(e) => return reply_err(e.code, e.message, epoch),
        };
        if let Some((w, _)) = &ec_write {
            // The PG counts logical bytes, not this member's shard.
            done.stat_delta = w.stat_delta;
        }
        let prev = state.meta.info.last_update;
        state.meta.commit_append(plan, entry);
        self.stats
            .count_write(op.pg, prev, state.meta.info.last_update, done.stat_delta);
        state.in_flight.insert(stamp.version, op.object.clone());
        state.changed.notify_waiters();
        let guard = InFlight::new(pg.clone(), stamp.version);
        let write_to = state.write_to.clone();
        let repop = RepOp {
            pg: op.pg,
            epoch,
            log_epoch: epoch,
            log_version: stamp.version,
            reqid,
            mtime_ns: stamp.mtime_ns,
            object: op.object,
            ops: op.ops,
            internal_xattrs: Vec::new(),
        };
        let mut replicas = Vec::new();
        let mut unreachable = Vec::new();
        for &osd in &write_to {
            let Some(addr) = map.osds.get(&osd).and_then(|o| o.addr) else {
                unreachable.push((osd, format!("replica osd.{osd} has no address")));
                continue;
            };
            let peers = self.peers.clone();
            let (r, d) = match &ec_write {
                Some((w, members)) => {
                    let Some(pos) = ec_io::position(members, osd) else {
                        unreachable.push((osd, format!("osd.{osd} holds no shard of the PG")));
                        continue;
                    };
                    let mut r = repop.clone();
                    r.ops.clone_from(&w.shards[pos].ops);
                    r.internal_xattrs = w.internal_xattrs(pos);
                    (r, Bytes::copy_from_slice(&w.shards[pos].data))
                }
                None => (repop.clone(), data.clone()),
            };
            let left = self.left_pg(op.pg, osd, epoch);
            replicas.push(async move {
                // A replica that a newer map drops (e.g. marked down after it froze) will not
                // answer in time: stop waiting for it then, not at the call's timeout, so the
                // client's retry meets the re-peered PG at once.
                let result = tokio::select! {
                    r = peers.repop(osd, addr, r, d) => r,
                    () = left => Err(OsdError::PeerUnreachable {
                        osd,
                        reason: "it left the acting set".into(),
                    }),
                };
                (osd, result)
            });
        }
        // Queue the replica writes while still holding the lock, so they leave in version order.
        let mut remote = Box::pin(futures::future::join_all(replicas));
        let early = match futures::poll!(remote.as_mut()) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        };
        drop(state);

        let remote = async {
            match early {
                Some(r) => r,
                None => remote.await,
            }
        };
        let (local, remote) = tokio::join!(commit, remote);

        let mut state = pg.write().await;
        guard.settle(&mut state);
        if let Err(e) = local {
            // Readable here but not durable, and replicas may have applied it: this copy may now
            // be behind them. Stop serving the PG and peer again, which reconciles the histories.
            state.deactivate();
            tokio::spawn(recovery::peer(self.clone(), op.pg, epoch));
            let e = ExecError::from(e);
            return reply_err(e.code, format!("osd.{}: {}", self.cfg.id, e.message), epoch);
        }
        let mut failures: Vec<(i32, Option<ErrorCode>, String)> = unreachable
            .into_iter()
            .map(|(osd, why)| (osd, None, why))
            .collect();
        for (osd, result) in remote {
            match result {
                Ok(RepOpReply { error: None, .. }) => {}
                Ok(RepOpReply {
                    error: Some((code, msg)),
                    ..
                }) => failures.push((osd, Some(code), format!("{code:?}: {msg}"))),
                Err(e) => failures.push((osd, None, e.to_string())),
            }
        }
        if failures.is_empty() {
            return ok_reply(done, epoch);
        }
        let detail: Vec<String> = failures
            .iter()
            .map(|(osd, _, why)| format!("osd.{osd}: {why}"))
            .collect();
        let classified = admission::classify_replica_failures(
            &failures
                .iter()
                .map(|(osd, code, _)| (*osd, *code))
                .collect::<Vec<_>>(),
        );
        let missed = match classified {
            admission::ReplicaFailures::AllFull { authority } => {
                // Roll the write back on every member (see `ReplicaFailures::AllFull`).
                state.deactivate();
                tokio::spawn(recovery::peer_with_authority(
                    self.clone(),
                    op.pg,
                    epoch,
                    Some(authority),
                ));
                return reply_err(
                    ErrorCode::Full,
                    format!(
                        "a replica has no space for the write ({})",
                        detail.join("; ")
                    ),
                    epoch,
                );
            }
            admission::ReplicaFailures::Missed { osds } => osds,
        };
        for osd in &missed {
            if !state.failed_replicas.contains(osd) {
                state.failed_replicas.push(*osd);
            }
            // No more writes for it (it would wait for the one it missed): peering below or
            // the next map brings it back.
            state.write_to.retain(|o| o != osd);
        }
        // A failed replica that the current map still has in the PG (a timeout, a lost
        // connection, an OSD restarted before anyone noticed): peer again rather than refuse
        // writes until the next map change (`admission::repeer_after_failures`).
        let current = self.map();
        let current_mapping = current.pg_mapping(op.pg).ok();
        if admission::repeer_after_failures(
            self.cfg.id,
            epoch,
            current.epoch,
            current_mapping
                .as_ref()
                .map(|m| (m.acting_primary, &m.acting[..], &m.up[..])),
            &state.failed_replicas,
            state.active.is_some(),
        ) {
            state.deactivate();
            tokio::spawn(recovery::peer(self.clone(), op.pg, epoch));
        }
        reply_err(
            ErrorCode::Io,
            format!(
                "the write is not on every replica ({}); retry",
                detail.join("; ")
            ),
            epoch,
        )
    }

    /// Executes a write op and submits its transaction, with the log entry staged into it, to
    /// the store: on the async worker if the store can do it without waiting for the device,
    /// else on a blocking thread. The caller holds the PG's write lock. `internal`: Kelp's own
    /// attributes to set too (an erasure-coded shard's metadata).
    #[allow(clippy::too_many_arguments)]
    async fn apply_locally(
        &self,
        coll: CollectionId,
        ops: &[kelp_proto::OpKind],
        data: &Bytes,
        stamp: Stamp,
        plan: LogAppend,
        mut entry: LogEntry,
        internal: &[(String, Vec<u8>)],
    ) -> Result<Applied, ExecError> {
        let started = Instant::now();
        let store = self.store.clone();
        let limits = self.cfg.limits;
        // Right here if the store can take it without waiting (`kelp_store::nowait`: deferred
        // small writes, no device I/O), else on a blocking thread. A refused attempt applied
        // nothing.
        let inline = kelp_store::nowait::attempt(|| {
            let mut entry = entry.clone();
            apply_now(
                &*store, coll, ops, data, stamp, &limits, &plan, &mut entry, internal,
            )
            .map(|a| (a, entry))
        });
        let applied = match inline {
            Some(result) => {
                let (applied, entry) = result?;
                applied.into_applied(entry, plan, started)
            }
            None => {
                let (ops, data, internal) = (ops.to_vec(), data.clone(), internal.to_vec());
                tokio::task::spawn_blocking(move || {
                    let applied = apply_now(
                        &*store, coll, &ops, &data, stamp, &limits, &plan, &mut entry, &internal,
                    )?;
                    Ok::<_, ExecError>(applied.into_applied(entry, plan, started))
                })
                .await
                .map_err(|e| ExecError {
                    code: ErrorCode::Io,
                    message: format!("op task failed: {e}"),
                })??
            }
        };
        if matches!(applied, Applied::Write(_)) {
            self.stats.note_apply(started.elapsed());
        }
        Ok(applied)
    }

    /// Waits for a write's commit and counts its commit latency (`kelp osd perf`).
    async fn committed(
        &self,
        commit: kelp_store::Commit,
        started: Instant,
    ) -> Result<(), kelp_store::StoreError> {
        let r = commit.await;
        if r.is_ok() {
            self.stats.note_commit(started.elapsed());
        }
        r
    }

    /// A head's snapshot state on this OSD (`crate::snaps::read_head`), from memory when the
    /// store can, else on a blocking thread.
    async fn snap_head(
        &self,
        coll: CollectionId,
        head: &kelp_proto::ObjectLocator,
        ec: bool,
    ) -> Result<crate::snapset::HeadFacts, ExecError> {
        let store = self.store.clone();
        let head = head.clone();
        let read = move || crate::snaps::read_head(&*store, coll, &head, ec);
        match kelp_store::nowait::attempt(read.clone()) {
            Some(r) => r,
            None => tokio::task::spawn_blocking(read)
                .await
                .map_err(|e| ExecError {
                    code: ErrorCode::Io,
                    message: format!("snapset read task failed: {e}"),
                })?,
        }
    }

    /// This OSD's store (the snapshot trimmer lists clones with it).
    pub(crate) fn store_handle(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// The clone ids `head`'s snapset lists on this OSD.
    pub(crate) async fn head_clones(
        &self,
        coll: CollectionId,
        head: &kelp_proto::ObjectLocator,
    ) -> Result<Vec<u64>, ExecError> {
        let h = self.snap_head(coll, head, true).await?;
        Ok(h.snapset.clones.iter().map(|c| c.id).collect())
    }

    /// An erasure-coded object as this OSD's shard shows it before a write.
    async fn ec_before(
        &self,
        coll: CollectionId,
        object: &kelp_proto::ObjectLocator,
    ) -> Result<ec::EcBefore, ExecError> {
        let a = self.ec_attrs(coll, object).await?;
        Ok(ec::EcBefore {
            exists: a.exists,
            version: a.version,
            meta: a.meta,
        })
    }

    /// An erasure-coded object's attributes on this OSD's shard (from memory when the store
    /// can, else on a blocking thread).
    async fn ec_attrs(
        &self,
        coll: CollectionId,
        object: &kelp_proto::ObjectLocator,
    ) -> Result<ec::EcObjectAttrs, ExecError> {
        let store = self.store.clone();
        let oid = crate::exec::object_id(object);
        let read = move || ec_io::local_attrs(&*store, coll, &oid);
        match kelp_store::nowait::attempt(read.clone()) {
            Some(r) => r,
            None => tokio::task::spawn_blocking(read)
                .await
                .map_err(|e| ExecError {
                    code: ErrorCode::Io,
                    message: format!("attribute read task failed: {e}"),
                })?,
        }
    }

    /// How the EC backend reaches the shards of `object` (`readable`: per shard position, the
    /// member to read it from).
    fn shard_io(
        &self,
        pg: PgId,
        epoch: u32,
        object: &kelp_proto::ObjectLocator,
        coll: CollectionId,
        readable: Vec<Option<i32>>,
        after_version: u64,
    ) -> ec_io::PgShardIo {
        let map = self.map();
        ec_io::PgShardIo {
            me: self.cfg.id,
            store: self.store.clone(),
            coll,
            oid: crate::exec::object_id(object),
            pg,
            epoch,
            object: object.clone(),
            members: readable
                .into_iter()
                .map(|m| m.map(|osd| (osd, map.osds.get(&osd).and_then(|o| o.addr))))
                .collect(),
            peers: self.peers.clone(),
            after_version,
        }
    }

    /// A client's read of an object of an erasure-coded pool (the caller holds the PG's read
    /// lock, so no write starts meanwhile).
    async fn ec_read_op(
        &self,
        profile: &kelp_ec::Profile,
        state: &PgState,
        readable: Vec<Option<i32>>,
        op: &OsdOp,
        data: &Bytes,
        epoch: u32,
    ) -> (OsdOpReply, Bytes) {
        let coll = state.meta.coll;
        let attrs = match self.ec_attrs(coll, &op.object).await {
            Ok(a) => a,
            Err(e) => return reply_err(e.code, e.message, epoch),
        };
        let io = self.shard_io(
            op.pg,
            epoch,
            &op.object,
            coll,
            readable,
            state.meta.info.last_update.1,
        );
        let fast_read = self
            .map()
            .pools
            .get(&op.pg.pool.0)
            .is_some_and(|p| p.fast_read);
        match ec::read(
            profile,
            fast_read,
            &attrs,
            &op.object.name,
            &op.ops,
            data,
            &self.cfg.limits,
            &io,
        )
        .await
        {
            Ok(r) => (
                OsdOpReply {
                    error: None,
                    version: r.version,
                    epoch,
                    outs: r.outs,
                },
                Bytes::from(r.data),
            ),
            Err(e) => reply_err(e.code, e.message, epoch),
        }
    }

    /// Erasure-coded pools: serves ranges of this member's shard of an object to the PG's
    /// primary, once this member has applied the PG's log up to `after_version`.
    pub async fn ec_read(&self, r: EcRead) -> (EcReadReply, Bytes) {
        let fail = |code, message: String| ec_io::reply_bytes(Err(ExecError { code, message }));
        let Some(pg) = self.pg(r.pg) else {
            return fail(
                ErrorCode::Misdirected,
                format!("osd.{} does not hold PG {}", self.cfg.id, r.pg),
            );
        };
        let deadline = Instant::now() + self.cfg.map_wait;
        let state = loop {
            let state = pg.read().await;
            if state.meta.next_version() > r.after_version {
                break state;
            }
            let changed = state.changed.clone();
            let settled = changed.notified();
            drop(state);
            if tokio::time::timeout_at(deadline.into(), settled)
                .await
                .is_err()
            {
                return fail(
                    ErrorCode::Io,
                    format!(
                        "PG {} on osd.{} has not applied version {} yet",
                        r.pg, self.cfg.id, r.after_version
                    ),
                );
            }
        };
        let oid = crate::exec::object_id(&r.object);
        let result =
            ec_io::read_local_shard_async(self.store.clone(), state.meta.coll, oid, r.extents)
                .await;
        drop(state);
        ec_io::reply_bytes(result)
    }

    /// Erasure-coded pools: rebuilds shard `shard` of an object from the PG's other members
    /// for a member that misses it (recovery's pull). Fewer than `k` shards at this member's
    /// version of the object is `Corrupt`: the puller reports the object unfound.
    async fn ec_pull(&self, p: PgPull, shard: u32) -> (PgPullReply, Bytes) {
        let fail = |code, msg: String| crate::object_state::pull_reply(Some((code, msg)));
        let map = self.map_at_least(p.epoch).await;
        let Some(profile) = map
            .pools
            .get(&p.pg.pool.0)
            .and_then(|pool| pool.ec())
            .cloned()
        else {
            return fail(
                ErrorCode::Invalid,
                format!("pool {} is not erasure-coded", p.pg.pool),
            );
        };
        let Some(handle) = RecoveryHost::pg_or_stray(self, p.pg).await else {
            return fail(
                ErrorCode::Misdirected,
                format!("osd.{} does not hold PG {}", self.cfg.id, p.pg),
            );
        };
        let state = loop {
            let state = handle.read().await;
            if !state.in_flight_named(&p.namespace, &p.name) {
                break state;
            }
            let changed = state.changed.clone();
            let settled = changed.notified();
            drop(state);
            settled.await;
        };
        let object = kelp_proto::ObjectLocator {
            pool: p.pg.pool.0,
            namespace: p.namespace.clone(),
            key: None,
            name: p.name.clone(),
        };
        let coll = state.meta.coll;
        let store = self.store.clone();
        let oid = crate::exec::object_id(&object);
        let local = {
            let oid = oid.clone();
            tokio::task::spawn_blocking(move || ec_io::local_state(&*store, coll, &oid)).await
        };
        let (attrs, raw) = match local {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => return fail(e.code, e.message),
            Err(e) => return fail(ErrorCode::Io, format!("attribute read task failed: {e}")),
        };
        if !attrs.exists {
            drop(state);
            return crate::object_state::pull_reply(None);
        }
        let Some(meta) = attrs.meta else {
            return fail(
                ErrorCode::Corrupt,
                format!("osd.{}: '{}' has no shard metadata", self.cfg.id, p.name),
            );
        };
        let Ok(mapping) = map.pg_mapping(p.pg) else {
            return fail(ErrorCode::Misdirected, format!("PG {} is not mapped", p.pg));
        };
        // The members in sync if this OSD is the PG's primary (members left behind would only
        // fail the version check), else every other member; never the puller's own position.
        let mut members = ec_io::positions(&mapping);
        if mapping.acting_primary == self.cfg.id {
            members = ec_io::readable(&members, self.cfg.id, &state);
        }
        let members: Vec<Option<i32>> = members
            .into_iter()
            .enumerate()
            .map(|(i, m)| m.filter(|_| i != shard as usize))
            .collect();
        let io = self.shard_io(p.pg, map.epoch, &object, coll, members, 0);
        let data = match meta.layout(&profile) {
            Some(layout) => {
                match ec::rebuild_shard(&io, &layout, attrs.version, meta.size, shard as usize)
                    .await
                {
                    Ok(d) => d,
                    Err(e) => {
                        return fail(
                            ErrorCode::Corrupt,
                            format!("rebuilding shard {shard} of '{}': {}", p.name, e.message),
                        );
                    }
                }
            }
            None => Vec::new(),
        };
        drop(state);
        let mut xattrs: Vec<(String, Vec<u8>)> =
            raw.into_iter().filter(|(k, _)| k != ec::EC_ATTR).collect();
        xattrs.push((
            ec::EC_ATTR.to_string(),
            ec::EcMeta { shard, ..meta }.encode(),
        ));
        (
            PgPullReply {
                error: None,
                exists: true,
                size: data.len() as u64,
                xattrs,
                omap_header: None,
                omap: Vec::new(),
            },
            Bytes::from(data),
        )
    }

    /// Applies a primary's replicated write. Writes to one PG are applied in version order: a
    /// write that arrives ahead of its predecessor (the messenger serves requests concurrently)
    /// waits for it, up to `map_wait`; past that the replica is considered to need recovery.
    pub async fn repop(&self, op: RepOp, data: Bytes) -> RepOpReply {
        let map = self.map_at_least(op.epoch).await;
        let epoch = map.epoch;
        let fail = |code, msg: String| RepOpReply {
            error: Some((code, msg)),
            epoch,
        };
        let Some(pg) = self.pg(op.pg) else {
            return fail(
                ErrorCode::Misdirected,
                format!("osd.{} does not hold PG {}", self.cfg.id, op.pg),
            );
        };
        let deadline = Instant::now() + self.cfg.map_wait;
        let mut state = loop {
            let state = pg.write().await;
            let next = state.meta.next_version();
            let wait_for_turn = op.log_version > next;
            if op.log_version == next {
                break state;
            }
            if op.log_version < next && !state.in_flight.contains_key(&op.log_version) {
                // Already applied and durable (a resend after a lost reply).
                return RepOpReply { error: None, epoch };
            }
            // Either the original of this resend is still in flight, or a predecessor has
            // not arrived yet: wait for the PG to change.
            let changed = state.changed.clone();
            let settled = changed.notified();
            drop(state);
            if tokio::time::timeout_at(deadline.into(), settled)
                .await
                .is_err()
            {
                let next = pg.read().await.meta.next_version();
                return fail(
                    ErrorCode::Io,
                    if wait_for_turn {
                        format!(
                            "PG {} on osd.{} is at version {}, the write is {}: it needs recovery",
                            op.pg,
                            self.cfg.id,
                            next - 1,
                            op.log_version
                        )
                    } else {
                        format!("write {} of PG {} did not settle", op.log_version, op.pg)
                    },
                );
            }
        };
        let stamp = Stamp {
            version: op.log_version,
            mtime_ns: op.mtime_ns,
        };
        let plan = state
            .meta
            .plan_append(op.log_epoch, op.log_version)
            .for_ec_shard(&state.meta, ec::held_shard(&op.internal_xattrs));
        let entry = LogEntry {
            epoch: op.log_epoch,
            version: op.log_version,
            object: op.object.clone(),
            reqid: op.reqid,
            deleted: false,
        };
        let commit = match self
            .apply_locally(
                state.meta.coll,
                &op.ops,
                &data,
                stamp,
                plan,
                entry,
                &op.internal_xattrs,
            )
            .await
        {
            Ok(Applied::Write(w)) => {
                let AppliedWrite {
                    entry,
                    plan,
                    commit,
                    started,
                    ..
                } = *w;
                state.meta.commit_append(plan, entry);
                self.committed(commit, started)
            }
            Ok(Applied::NotAWrite(_)) => {
                return fail(ErrorCode::Invalid, "a replica write without writes".into());
            }
            Err(e) => return fail(e.code, e.message),
        };
        state.in_flight.insert(op.log_version, op.object);
        state.changed.notify_waiters();
        let guard = InFlight::new(pg.clone(), op.log_version);
        drop(state);
        let committed = commit.await;
        guard.settle(&mut *pg.write().await);
        match committed {
            Ok(()) => RepOpReply { error: None, epoch },
            Err(e) => fail(ErrorCode::Io, format!("commit failed: {e}")),
        }
    }

    /// Lists a page of a PG's objects (as its primary), skipping Kelp's internal objects.
    pub async fn pg_list(&self, req: PgList) -> PgListReply {
        let map = self.map_at_least(req.epoch).await;
        let epoch = map.epoch;
        let fail = |code, msg: String| PgListReply {
            error: Some((code, msg)),
            epoch,
            objects: Vec::new(),
            next: None,
        };
        match map.pg_mapping(req.pg) {
            Ok(m) if m.acting_primary == self.cfg.id => {}
            Ok(_) => {
                return fail(
                    ErrorCode::Misdirected,
                    format!("osd.{} is not the primary of PG {}", self.cfg.id, req.pg),
                );
            }
            Err(e) => return fail(ErrorCode::NoSuchPool, e.to_string()),
        }
        let Some(pg) = self.pg(req.pg) else {
            return fail(
                ErrorCode::Misdirected,
                format!("PG {} is not open here yet", req.pg),
            );
        };
        let state = pg.read().await;
        let store = self.store.clone();
        let coll = state.meta.coll;
        let max = req.max.clamp(1, 10_000) as usize;
        // A pool with snapshots may hold whiteouts (removed heads kept for their clones).
        let whiteouts = map
            .pools
            .get(&req.pg.pool.0)
            .is_some_and(|p| p.snap_seq > 0);
        let start = req
            .cursor
            .map(|c| ObjectId::new(req.pg.pool.0, &c.namespace, &c.name, c.hash));
        let listed = tokio::task::spawn_blocking(move || -> Result<_, ExecError> {
            let mut objects = Vec::new();
            let mut from = start;
            let mut skip_first = from.is_some();
            loop {
                let page = store.list_objects(coll, from.as_ref(), max + 1)?;
                for oid in &page.objects {
                    if std::mem::take(&mut skip_first) && Some(oid) == from.as_ref() {
                        continue;
                    }
                    if oid.namespace.starts_with('\u{1f}') || oid.snap != kelp_store::SNAP_HEAD {
                        continue;
                    }
                    if whiteouts
                        && store
                            .xattr(coll, oid, crate::snapset::WHITEOUT_ATTR)?
                            .is_some()
                    {
                        continue;
                    }
                    if objects.len() == max {
                        return Ok((objects, Some(oid.clone())));
                    }
                    objects.push(oid.clone());
                }
                match page.next {
                    Some(next) => {
                        from = Some(next);
                    }
                    None => return Ok((objects, None)),
                }
            }
        })
        .await;
        drop(state);
        match listed {
            Ok(Ok((objects, next))) => {
                // `next` is the first object not returned: resume *at* it by pointing the
                // cursor just before it (the cursor is exclusive).
                let next = match (next, objects.last()) {
                    (Some(_), Some(last)) => Some(ListCursor {
                        hash: last.hash,
                        namespace: last.namespace.clone(),
                        name: last.name.clone(),
                    }),
                    _ => None,
                };
                PgListReply {
                    error: None,
                    epoch,
                    objects: objects.into_iter().map(|o| (o.namespace, o.name)).collect(),
                    next,
                }
            }
            Ok(Err(e)) => fail(e.code, e.message),
            Err(e) => fail(ErrorCode::Io, format!("listing task failed: {e}")),
        }
    }

    /// (last_update, number of log entries) of a PG this OSD holds.
    pub async fn pg_info(&self, pg: PgId) -> Option<((u32, u64), usize)> {
        let handle = self.pg(pg)?;
        let state = handle.read().await;
        Some((state.meta.info.last_update, state.meta.len()))
    }
}

/// Requests and settings that peering, recovery and scrub handle: the service hands them to
/// `crate::recovery` and `crate::scrub`, which reach the service back only through
/// `RecoveryHost` and `ScrubHost` (below).
impl OsdService {
    /// Answers a primary's query for this member's log of a PG.
    pub async fn pg_query(&self, q: PgQuery) -> PgQueryReply {
        recovery::pg_query(self, q).await
    }

    /// Serves one object's complete state to a recovering member.
    pub async fn pg_pull(&self, p: PgPull) -> (PgPullReply, Bytes) {
        if let Some(shard) = p.shard {
            return self.ec_pull(p, shard).await;
        }
        recovery::pg_pull(self, p).await
    }

    /// Brings this member's copy of a PG closer to the authoritative history (see `PgSync`).
    pub async fn pg_sync(&self, s: PgSync) -> PgSyncReply {
        recovery::pg_sync(self, s).await
    }

    /// Applies new recovery throttles (from the central config).
    pub fn set_recovery_config(&self, cfg: RecoveryConfig) {
        self.recovery.set_config(cfg);
    }

    /// The recovery throttles in force.
    pub fn recovery_config(&self) -> RecoveryConfig {
        self.recovery.config()
    }

    /// A member's scrub map of a range of one of its PGs.
    pub async fn scrub_map(&self, req: ScrubMapRequest) -> ScrubMapReply {
        scrub::scrub_map(self, req).await
    }

    /// Installs a repaired copy of one object (sent by the PG's primary).
    pub async fn pg_push(&self, p: PgPush, data: Bytes) -> PgPushReply {
        scrub::pg_push(self, p, data).await
    }

    /// An operator's request to a PG's primary (scrub, repair, status, inconsistent objects).
    pub async fn pg_command(&self, c: PgCommand) -> PgCommandReply {
        scrub::pg_command(self, c).await
    }

    /// An operator's request to this OSD about every PG it is primary for.
    pub async fn osd_scrub_command(&self, c: OsdScrubCommand) -> OsdScrubReply {
        scrub::osd_scrub_command(self, c).await
    }

    /// Replaces the scrub settings (from the central config).
    pub fn set_scrub_config(&self, cfg: ScrubConfig) {
        self.scrubber.set_config(cfg);
    }

    /// The scrub settings in force.
    pub fn scrub_config(&self) -> ScrubConfig {
        self.scrubber.config()
    }

    /// A PG's scrub summary as this OSD keeps it (meaningful on the PG's primary): what a PG
    /// statistics report to the monitors should carry.
    pub fn scrub_summary(&self, pg: PgId) -> Option<PgScrubSummary> {
        self.scrubber.summary_of(pg)
    }

    /// Runs queued and scheduled scrubs, one at a time, until the service is dropped.
    pub fn start_scrubber(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        scrub::start(self)
    }
}

impl PgHost for OsdService {
    fn id(&self) -> i32 {
        self.cfg.id
    }

    fn map(&self) -> Arc<OsdMap> {
        self.map_tx.borrow().clone()
    }

    async fn map_at_least(&self, epoch: u32) -> Arc<OsdMap> {
        let mut rx = self.map_tx.subscribe();
        let wait = rx.wait_for(|m| m.epoch >= epoch);
        match tokio::time::timeout(self.cfg.map_wait, wait).await {
            Ok(Ok(m)) => m.clone(),
            _ => PgHost::map(self),
        }
    }

    fn pg_handle(&self, pg: PgId) -> Option<PgHandle> {
        self.pg(pg)
    }

    fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    fn peers(&self) -> Arc<dyn Peers> {
        self.peers.clone()
    }
}

impl RecoveryHost for OsdService {
    async fn pg_or_stray(&self, pg: PgId) -> Option<PgHandle> {
        if let Some(h) = self.pg(pg) {
            return Some(h);
        }
        // A PG of a deleted pool is never opened again (`crate::pg_removal`).
        if !PgHost::map(self).pools.contains_key(&pg.pool.0) {
            return None;
        }
        // Rare (a peering after a restart) and small (one PG's log): opened inline.
        let opened = match self.store.collection_exists(CollectionId(pg)) {
            Ok(true) => self.open_pgs(&[pg]),
            Ok(false) => Ok(()),
            Err(e) => Err(e.into()),
        };
        if let Err(e) = opened {
            tracing::warn!(%pg, "opening a stray copy: {}", e.message);
        }
        self.pg(pg)
    }

    fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    fn stats(&self) -> &OsdStats {
        &self.stats
    }

    /// Whether clients used this OSD in the last `CLIENTS_BUSY_FOR`.
    fn clients_busy(&self) -> bool {
        let last = self.last_client_op_ms.load(Ordering::Relaxed);
        let now = self.started.elapsed().as_millis() as u64;
        last != u64::MAX && now.saturating_sub(last) < CLIENTS_BUSY_FOR.as_millis() as u64
    }

    /// Without monitors (tests) the verdict is `Recorded` at once.
    fn send_activation(
        &self,
        a: PgActivation,
    ) -> oneshot::Receiver<Result<ActivationVerdict, OsdError>> {
        let (tx, rx) = oneshot::channel();
        match self.activation_link.get() {
            Some(link) => {
                if let Err(e) = link.send((a, tx)) {
                    let _ = e.0.1.send(Err(OsdError::MonLinkClosed));
                }
            }
            None => {
                let _ = tx.send(Ok(ActivationVerdict::Recorded));
            }
        }
        rx
    }

    fn can_request_pg_temp(&self) -> bool {
        self.mon_link.get().is_some()
    }

    fn request_pg_temp(&self, pg: PgId, osds: Vec<i32>) -> Result<(), OsdError> {
        match self.mon_link.get() {
            Some(link) => link
                .send(MonCommand::PgTemp { pg, osds })
                .map_err(|_| OsdError::MonLinkClosed),
            None => Err(OsdError::MonLinkClosed),
        }
    }

    async fn repair_from_replica(&self, pg: PgId, object: &ObjectLocator) -> Result<i32, OsdError> {
        scrub::repair_from_replica(self, pg, object).await
    }
}

impl ScrubHost for OsdService {
    fn scrubber(&self) -> &Scrubber {
        &self.scrubber
    }
}

/// Executes a write op and submits its transaction with the log entry staged into it.
#[allow(clippy::too_many_arguments)]
fn apply_now(
    store: &dyn ObjectStore,
    coll: CollectionId,
    ops: &[kelp_proto::OpKind],
    data: &Bytes,
    stamp: Stamp,
    limits: &crate::exec::Limits,
    plan: &LogAppend,
    entry: &mut LogEntry,
    internal: &[(String, Vec<u8>)],
) -> Result<AppliedNow, ExecError> {
    let mut done = execute(store, coll, &entry.object, ops, data, stamp, limits)?;
    if !done.is_write {
        return Ok(AppliedNow::NotAWrite(done));
    }
    // A whiteout head stays stored (it carries the snapset): recovery copies it.
    entry.deleted = !done.exists_after && !done.whiteout_after;
    if done.exists_after && !internal.is_empty() {
        // An erasure-coded shard's own metadata (`ec::EC_ATTR`), set by the primary.
        done.txn.push(kelp_store::Op::SetXattrs {
            coll,
            oid: crate::exec::object_id(&entry.object),
            attrs: internal.iter().cloned().collect(),
        });
    }
    plan.stage(&mut done.txn, entry);
    let commit = store.submit(std::mem::take(&mut done.txn))?;
    Ok(AppliedNow::Write(done, commit))
}

/// What `apply_now` did, before the log entry and plan are attached.
enum AppliedNow {
    Write(Executed, kelp_store::Commit),
    NotAWrite(Executed),
}

impl AppliedNow {
    fn into_applied(self, entry: LogEntry, plan: LogAppend, started: Instant) -> Applied {
        match self {
            AppliedNow::Write(done, commit) => Applied::Write(Box::new(AppliedWrite {
                done,
                entry,
                plan,
                commit,
                started,
            })),
            AppliedNow::NotAWrite(done) => Applied::NotAWrite(done),
        }
    }
}

/// A write `apply_locally` submitted.
struct AppliedWrite {
    done: Executed,
    entry: LogEntry,
    plan: LogAppend,
    commit: kelp_store::Commit,
    /// When `apply_locally` began (the start of its apply and commit latency).
    started: Instant,
}

/// What `apply_locally` did.
enum Applied {
    /// A write, readable in the store; durable once `commit` resolves.
    Write(Box<AppliedWrite>),
    /// The op turned out to change nothing (no log entry, nothing to replicate).
    NotAWrite(Executed),
}

fn ok_reply(done: Executed, epoch: u32) -> (OsdOpReply, Bytes) {
    (
        OsdOpReply {
            error: None,
            version: done.version,
            epoch,
            outs: done.outs,
        },
        done.out_data.into_bytes(),
    )
}
