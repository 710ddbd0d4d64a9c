//! The snapshot trimmer: a background worker on every OSD that, for the PGs it is primary of
//! in pools with removed snapshots, drops those snapshots from the objects' snapsets and
//! deletes the clones left serving none (`crate::snapset::plan_trim`).
//!
//! Every change goes through the PG's ordinary write path (`OsdService::internal_op`): an
//! internal `SnapTrim` op on the head (resolved under the PG's write lock into the trimmed
//! snapset, so a concurrent client write never loses a clone), then a `Remove` of each clone
//! the head no longer lists — each a PG-log entry, replicated, recovered like any write. A
//! clone its head does not list (a trim interrupted between the two steps) is deleted too, so
//! trimming converges.
//!
//! Throttled: `osd_snap_trim_sleep` between trimmed objects; a PG is trimmed only while it is
//! active with its whole acting set in sync (not degraded, not recovering), and a PG trimmed
//! completely is scanned again only when its pool's removed set changes (or after
//! `RESCAN_INTERVAL`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use kelp_proto::{ObjectLocator, OpKind, OsdOp};
use kelp_types::PgId;
use tracing::{debug, warn};

use crate::exec::ExecError;
use crate::service::OsdService;
use crate::snapset;

/// How often the trimmer looks for work.
const SCAN_INTERVAL: Duration = Duration::from_secs(1);
/// A PG trimmed completely is scanned again when its pool's removed set changes, or after
/// this long (a writer with an old snapshot context can still make a clone for a snapshot
/// removed since; an interrupted trim can leave a clone its head no longer lists).
const RESCAN_INTERVAL: Duration = Duration::from_secs(60);

/// Starts the trimmer; it ends when the service is dropped.
pub fn start(service: &Arc<OsdService>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(Arc::downgrade(service)))
}

async fn run(service: Weak<OsdService>) {
    // Per PG: the removed snapshots count at its last complete pass, and when that was.
    let mut done: HashMap<PgId, (usize, std::time::Instant)> = HashMap::new();
    let mut reqid = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    loop {
        tokio::time::sleep(SCAN_INTERVAL).await;
        let Some(svc) = service.upgrade() else {
            return;
        };
        let map = svc.map();
        // The PGs to trim in this pass, with their clones: listed first, so that the work
        // left (`BackgroundWork::snaptrim_clones_left`) counts down over the whole pass.
        let mut todo = Vec::new();
        for (pgid, handle) in svc.pg_handles() {
            let Some(pool) = map.pools.get(&pgid.pool.0) else {
                continue;
            };
            if pool.removed_snaps.is_empty() {
                continue;
            }
            let Ok(mapping) = map.pg_mapping(pgid) else {
                continue;
            };
            if mapping.acting_primary != svc.id() {
                continue;
            }
            let (coll, clean) = {
                let state = handle.read().await;
                let members: Vec<i32> = mapping.acting_osds().collect();
                let clean = state.active.as_deref() == Some(&mapping.acting[..])
                    && members.len() == pool.size as usize
                    && state.left_behind.is_empty()
                    && state.failed_replicas.is_empty()
                    && state.recovery.is_none()
                    && members
                        .iter()
                        .all(|m| *m == svc.id() || state.write_to.contains(m));
                (state.meta.coll, clean)
            };
            if !clean {
                continue;
            }
            if done.get(&pgid).is_some_and(|(removed, at)| {
                *removed == pool.removed_snaps.len() && at.elapsed() < RESCAN_INTERVAL
            }) {
                continue;
            }
            match list_clones(&svc, coll).await {
                Ok(heads) => todo.push((pgid, coll, pool.removed_snaps.len(), heads)),
                Err(why) => debug!(pg = %pgid, "snapshot trim paused: {why}"),
            }
        }
        let left: u64 = todo
            .iter()
            .flat_map(|(_, _, _, heads)| heads.values())
            .map(|c| c.len() as u64)
            .sum();
        svc.stats()
            .snaptrim_clones_left
            .store(left, Ordering::Relaxed);
        for (pgid, coll, removed, heads) in todo {
            let mut remaining: u64 = heads.values().map(|c| c.len() as u64).sum();
            match trim_pg(
                &svc,
                pgid,
                coll,
                map.epoch,
                &mut reqid,
                heads,
                &mut remaining,
            )
            .await
            {
                Ok(()) => {
                    done.insert(pgid, (removed, std::time::Instant::now()));
                }
                Err(why) => {
                    debug!(pg = %pgid, "snapshot trim paused: {why}");
                    // what this PG had left is no longer being worked on in this pass
                    let _ = svc.stats().snaptrim_clones_left.fetch_update(
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                        |l| Some(l.saturating_sub(remaining)),
                    );
                }
            }
        }
        svc.stats().snaptrim_clones_left.store(0, Ordering::Relaxed);
        done.retain(|pg, _| map.pools.contains_key(&pg.pool.0));
    }
}

/// A PG's clone objects, grouped by head (namespace, name).
type Heads = BTreeMap<(String, String), Vec<u64>>;

/// Lists a PG's clone objects (on a blocking thread).
async fn list_clones(
    svc: &Arc<OsdService>,
    coll: kelp_store::CollectionId,
) -> Result<Heads, ExecError> {
    let store = svc.store_handle();
    tokio::task::spawn_blocking(move || -> Result<_, ExecError> {
        let mut heads: Heads = BTreeMap::new();
        let mut from = None;
        loop {
            let page = store.list_objects(coll, from.as_ref(), 1024)?;
            for oid in &page.objects {
                if let Some((ns, name, id)) = snapset::parse_clone(&oid.namespace, &oid.name) {
                    heads
                        .entry((ns.to_string(), name.to_string()))
                        .or_default()
                        .push(id);
                }
            }
            match page.next {
                Some(n) => from = Some(n),
                None => return Ok(heads),
            }
        }
    })
    .await
    .map_err(|e| ExecError {
        code: kelp_proto::ErrorCode::Io,
        message: format!("listing task failed: {e}"),
    })?
}

/// One pass over a PG: every object with clones (`heads`, from [`list_clones`]); each clone
/// examined counts down `snaptrim_clones_left` and `remaining` (the PG's clones not examined
/// yet).
async fn trim_pg(
    svc: &Arc<OsdService>,
    pg: PgId,
    coll: kelp_store::CollectionId,
    epoch: u32,
    reqid: &mut u64,
    heads: Heads,
    remaining: &mut u64,
) -> Result<(), ExecError> {
    let left = &svc.stats().snaptrim_clones_left;
    let mut count_down = |n: u64| {
        let n = n.min(*remaining);
        *remaining -= n;
        let _ = left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
            Some(l.saturating_sub(n))
        });
    };
    for ((namespace, name), clones) in heads {
        let head = ObjectLocator {
            pool: pg.pool.0,
            namespace,
            key: None,
            name,
        };
        let sleep = svc.recovery_config().snap_trim_sleep;
        // The head's snapset, trimmed under the PG's write lock.
        let (reply, _) = svc
            .internal_op(
                &trimmer_name(svc.id()),
                trim_op(pg, epoch, next(reqid), &head, vec![OpKind::SnapTrim]),
            )
            .await;
        if let Some((code, msg)) = reply.error {
            return Err(ExecError {
                code,
                message: format!("trimming '{}': {msg}", head.name),
            });
        }
        // Then every clone the head no longer lists (the primary checks that again).
        let listed = svc.head_clones(coll, &head).await?;
        let kept = clones.iter().filter(|id| listed.contains(id)).count() as u64;
        count_down(kept);
        for id in clones.into_iter().filter(|id| !listed.contains(id)) {
            let clone = snapset::clone_locator(&head, id);
            let (reply, _) = svc
                .internal_op(
                    &trimmer_name(svc.id()),
                    trim_op(pg, epoch, next(reqid), &clone, vec![OpKind::Remove]),
                )
                .await;
            match reply.error {
                None => debug!(%pg, object = %head.name, clone = id, "clone trimmed"),
                Some((kelp_proto::ErrorCode::NotFound, _)) => {}
                Some((code, message)) => {
                    warn!(%pg, object = %head.name, clone = id, "trimming a clone: {code:?}: {message}");
                    return Err(ExecError { code, message });
                }
            }
            count_down(1);
            if !sleep.is_zero() {
                tokio::time::sleep(sleep).await;
            }
        }
        if !sleep.is_zero() {
            tokio::time::sleep(sleep).await;
        }
    }
    Ok(())
}

fn next(reqid: &mut u64) -> u64 {
    *reqid += 1;
    *reqid
}

fn trimmer_name(osd: i32) -> String {
    format!("osd.{osd}.snaptrim")
}

fn trim_op(pg: PgId, epoch: u32, reqid: u64, object: &ObjectLocator, ops: Vec<OpKind>) -> OsdOp {
    OsdOp {
        reqid,
        epoch,
        pg,
        object: object.clone(),
        ops,
        // The OSD's own trimmer: never on a client blocklist.
        instance: String::new(),
    }
}
