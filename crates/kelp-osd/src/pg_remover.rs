//! The worker of `crate::pg_removal`: finds the collections of deleted pools (at start, on
//! every map that changes the set of pools, and every `RESCAN_INTERVAL`), queues them with
//! their object counts, and removes them one PG at a time with `pg_removal::remove_step`,
//! `osd_target_transaction_size` objects per transaction and `osd_delete_sleep` between
//! transactions (read at every step, so `kelp config set` applies at once). Work left is
//! published in the OSD's statistics (`deleting_pgs_left`, `deleting_objects_left`).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use kelp_store::{CollectionId, ObjectId, StoreError, Transaction};
use kelp_types::PgId;
use tracing::{info, warn};

use crate::exec::ExecError;
use crate::pg_removal::{
    REMOVING_ATTR, Removals, Step, count_objects, doomed, is_marked, pool_deleted, remove_step,
};
use crate::pglog::PgMeta;
use crate::service::OsdService;

/// How long the worker waits after a failed step before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How often the worker looks for collections of deleted pools even without a map change (a
/// listing that failed, a PG that a peering task opened in a race).
const RESCAN_INTERVAL: Duration = Duration::from_secs(30);

/// Starts the remover; it ends when the service is dropped.
pub fn start(service: &Arc<OsdService>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(Arc::downgrade(service)))
}

async fn run(service: Weak<OsdService>) {
    let Some(svc) = service.upgrade() else {
        return;
    };
    let removals = svc.removals().clone();
    drop(svc);
    // The pool set the last complete scan was made for.
    let mut scanned: Option<BTreeSet<u32>> = None;
    let mut scanned_at = std::time::Instant::now();
    loop {
        let Some(svc) = service.upgrade() else {
            return;
        };
        let map = svc.map();
        let pools: BTreeSet<u32> = map.pools.keys().copied().collect();
        if scanned.as_ref() != Some(&pools) || scanned_at.elapsed() >= RESCAN_INTERVAL {
            match scan(&svc, &removals, &pools, map.pool_max).await {
                Ok(()) => {
                    scanned = Some(pools);
                    scanned_at = std::time::Instant::now();
                }
                Err(e) => warn!("looking for PGs of deleted pools: {}", e.message),
            }
        }
        publish(&svc, &removals);
        let next = removals.lock().next();
        let Some(pg) = next else {
            drop(svc);
            tokio::select! {
                () = removals.woken() => {}
                () = tokio::time::sleep(RESCAN_INTERVAL) => {}
            }
            continue;
        };
        if let Err(e) = remove_pg(&svc, &removals, pg).await {
            warn!(%pg, "removing the PG of a deleted pool (will retry): {}", e.message);
            drop(svc);
            tokio::time::sleep(RETRY_AFTER).await;
        }
    }
}

/// Queues every collection of a pool deleted as of a map with `pools` and `pool_max`, with
/// its object count. A PG of a pool created since (its collection made under a newer map while
/// this scan ran) has an id above `pool_max` and is left alone; each PG is checked against the
/// newest map again before it is queued.
async fn scan(
    svc: &Arc<OsdService>,
    removals: &Arc<Removals>,
    pools: &BTreeSet<u32>,
    pool_max: u32,
) -> Result<(), ExecError> {
    let store = svc.store_handle();
    let pools = pools.clone();
    let removals_for_task = removals.clone();
    let found = blocking(move || {
        let colls = store.list_collections()?;
        let todo = doomed(
            &colls,
            |p| pools.contains(&p),
            pool_max,
            &removals_for_task.lock().clone(),
        );
        let mut out = Vec::with_capacity(todo.len());
        for pg in todo {
            out.push((pg, count_objects(&*store, CollectionId(pg))?));
        }
        Ok(out)
    })
    .await?;
    let map = svc.map();
    let mut q = removals.lock();
    for (pg, objects) in found {
        if !pool_deleted(pg.pool.0, &|p| map.pools.contains_key(&p), map.pool_max) {
            continue;
        }
        if q.queue(pg, objects) {
            info!(%pg, objects, "queued the PG of a deleted pool for removal");
        }
    }
    Ok(())
}

/// Copies the queue's counts into the statistics report.
fn publish(svc: &OsdService, removals: &Removals) {
    let (pgs, objects) = removals.left();
    let st = svc.stats();
    st.deleting_pgs_left.store(pgs, Ordering::Relaxed);
    st.deleting_objects_left.store(objects, Ordering::Relaxed);
}

/// Removes one PG's collection, a transaction at a time.
async fn remove_pg(
    svc: &Arc<OsdService>,
    removals: &Arc<Removals>,
    pg: PgId,
) -> Result<(), ExecError> {
    let store = svc.store_handle();
    let coll = CollectionId(pg);
    // 1. The mark, durable before the first object goes.
    {
        let store = store.clone();
        blocking(move || {
            if !store.collection_exists(coll)? || is_marked(&*store, coll)? {
                return Ok(());
            }
            let meta = PgMeta::meta_oid(coll);
            let mut txn = Transaction::new();
            txn.touch(coll, &meta);
            txn.set_xattr(coll, &meta, REMOVING_ATTR, vec![1]);
            store.submit(txn)?.wait()?;
            Ok(())
        })
        .await?;
    }
    // 2. and 3. Batches of objects, then the collection.
    let mut from: Option<ObjectId> = None;
    loop {
        let batch = svc.recovery_config().delete_batch;
        let store = store.clone();
        let start = from.clone();
        let (step, last) = blocking(move || remove_step(&*store, coll, start, batch)).await?;
        match step {
            Step::Gone => {
                removals.lock().finished(pg);
                publish(svc, removals);
                info!(%pg, "removed the PG of a deleted pool");
                return Ok(());
            }
            Step::Removed(n) => {
                removals.lock().removed(pg, n);
                publish(svc, removals);
                from = last;
            }
        }
        let pause = svc.recovery_config().delete_sleep;
        if pause.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(pause).await;
        }
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ExecError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ExecError {
            code: kelp_proto::ErrorCode::Io,
            message: format!("removal task failed: {e}"),
        })?
        .map_err(Into::into)
}
