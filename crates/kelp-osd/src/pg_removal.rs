//! The remover of deleted pools' PGs: a background worker on every OSD that deletes the
//! collections (PG copies) of pools that no longer exist, so that `pool rm` frees the space.
//!
//! Why it is safe: pool ids are never reused (the map's `pool_max` only grows), and once a map
//! lacks a pool every later map lacks it, so a collection of a pool absent from the current map
//! can only be garbage. The service stops serving such PGs the moment the map arrives (their
//! handles are dropped in `OsdService::set_map`, so client ops are refused as for any unknown
//! pool and replica writes as misdirected), and never opens them again (`open_pgs` and
//! `pg_or_stray` skip queued PGs and collections marked for removal).
//!
//! How: the worker looks for such collections at start and whenever the map's set of pools
//! changes, counts their objects (the work left, reported as `deleting_pgs_left` /
//! `deleting_objects_left` in the OSD's statistics, which the manager shows as the
//! `pool-deletion` progress item), and removes them one PG at a time:
//!
//! 1. the PG's metadata object gets the `REMOVING_ATTR` mark, durably, before anything is
//!    deleted: a half-removed collection is never opened again, whatever map the OSD sees;
//! 2. objects are removed `osd_target_transaction_size` per transaction (data, xattrs, omap,
//!    EC shards and snapshot clones alike: everything in the collection), each transaction
//!    followed by `osd_delete_sleep` (or a yield), so the remover never crowds out client I/O;
//! 3. the last transaction removes the metadata object and the collection itself.
//!
//! Every step is one atomic store transaction, so a crash (kill -9) at any point leaves a
//! collection that is either untouched, marked and partly emptied, or gone; a restart finds it
//! again (its pool is still absent) and finishes it.
//!
//! The queue and the batch planning are pure ([`RemovalQueue`], [`doomed`], [`plan_batch`]);
//! the steps ([`remove_step`]) are blocking store I/O, which the worker (`crate::pg_remover`)
//! runs on blocking threads.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kelp_store::{CollectionId, ObjectId, ObjectStore, StoreError, Transaction};
use kelp_types::PgId;
use tokio::sync::Notify;
use tracing::debug;

use crate::pglog::PgMeta;

/// The xattr on a PG's metadata object that marks the collection as being removed.
pub const REMOVING_ATTR: &str = "_removing";

/// PGs queued for removal, with the objects each still holds (pure bookkeeping).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RemovalQueue {
    pgs: BTreeMap<PgId, u64>,
}

impl RemovalQueue {
    /// Queues `pg` holding `objects` objects; false if it was queued already (its count is kept:
    /// the worker may have removed some since).
    pub fn queue(&mut self, pg: PgId, objects: u64) -> bool {
        if self.pgs.contains_key(&pg) {
            return false;
        }
        self.pgs.insert(pg, objects);
        true
    }

    pub fn contains(&self, pg: PgId) -> bool {
        self.pgs.contains_key(&pg)
    }

    /// The PG to work on next (lowest id first, so a removal started is finished first).
    pub fn next(&self) -> Option<PgId> {
        self.pgs.keys().next().copied()
    }

    /// `n` objects of `pg` were removed.
    pub fn removed(&mut self, pg: PgId, n: u64) {
        if let Some(left) = self.pgs.get_mut(&pg) {
            *left = left.saturating_sub(n);
        }
    }

    /// `pg`'s collection is gone.
    pub fn finished(&mut self, pg: PgId) {
        self.pgs.remove(&pg);
    }

    pub fn pgs_left(&self) -> u64 {
        self.pgs.len() as u64
    }

    pub fn objects_left(&self) -> u64 {
        self.pgs.values().sum()
    }
}

/// Whether `pool` was deleted as of a map with `pools` and `pool_max`: an id the map has
/// used (ids are never reused) that it no longer has. A pool newer than the map (an id above
/// its `pool_max`: created after it, its PGs made under a later map) is never taken for one.
pub fn pool_deleted(pool: u32, pools: &impl Fn(u32) -> bool, pool_max: u32) -> bool {
    pool <= pool_max && !pools(pool)
}

/// The collections to remove: those of pools deleted as of the map (`pool_exists`,
/// `pool_max`; see [`pool_deleted`]), not queued yet.
pub fn doomed(
    collections: &[CollectionId],
    pool_exists: impl Fn(u32) -> bool,
    pool_max: u32,
    queue: &RemovalQueue,
) -> Vec<PgId> {
    collections
        .iter()
        .map(|c| c.0)
        .filter(|pg| pool_deleted(pg.pool.0, &pool_exists, pool_max) && !queue.contains(*pg))
        .collect()
}

/// The objects of one listed page to remove in the next transaction: at most `max`, never the
/// PG's metadata object `meta` (it carries the removal mark and goes last, with the collection).
pub fn plan_batch(page: &[ObjectId], meta: &ObjectId, max: usize) -> Vec<ObjectId> {
    page.iter()
        .filter(|o| *o != meta)
        .take(max.max(1))
        .cloned()
        .collect()
}

/// The remover's shared state: the queue (read by the service to refuse opening queued PGs)
/// and the worker's wake-up.
#[derive(Debug, Default)]
pub struct Removals {
    queue: Mutex<RemovalQueue>,
    wake: Notify,
}

impl Removals {
    /// Whether `pg` is queued for removal.
    pub fn is_queued(&self, pg: PgId) -> bool {
        self.lock().contains(pg)
    }

    /// Tells the worker to look for new work (a map changed the pools).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Resolves at the next [`Removals::wake`] (or at once if one came since the last wait).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// (PGs, objects) left.
    pub fn left(&self) -> (u64, u64) {
        let q = self.lock();
        (q.pgs_left(), q.objects_left())
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, RemovalQueue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `coll` is marked as being removed (blocking: one store read).
pub fn is_marked(store: &dyn ObjectStore, coll: CollectionId) -> Result<bool, StoreError> {
    match store.xattr(coll, &PgMeta::meta_oid(coll), REMOVING_ATTR) {
        Ok(v) => Ok(v.is_some()),
        Err(StoreError::ObjectNotFound { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// One transaction of a removal: up to `batch` objects listed from `from`, or, when none is
/// left, the metadata object and the collection. Returns the step and where the next listing
/// starts.
pub fn remove_step(
    store: &dyn ObjectStore,
    coll: CollectionId,
    from: Option<ObjectId>,
    batch: usize,
) -> Result<(Step, Option<ObjectId>), StoreError> {
    if !store.collection_exists(coll)? {
        return Ok((Step::Gone, None));
    }
    let meta = PgMeta::meta_oid(coll);
    let page = store.list_objects(coll, from.as_ref(), batch.max(1) + 1)?;
    let doomed = plan_batch(&page.objects, &meta, batch);
    if !doomed.is_empty() {
        let mut txn = Transaction::new();
        for oid in &doomed {
            txn.remove(coll, oid);
        }
        store.submit(txn)?.wait()?;
        // listing is inclusive of its start, and the last removed object is gone
        return Ok((Step::Removed(doomed.len() as u64), doomed.last().cloned()));
    }
    if page.next.is_some() {
        // only the metadata object in this page, more after it
        return Ok((Step::Removed(0), page.next));
    }
    if from.is_some() {
        // the end of one pass: look once more from the start (a straggling replica write
        // may have added an object behind the cursor)
        return Ok((Step::Removed(0), None));
    }
    let mut txn = Transaction::new();
    if store.exists(coll, &meta)? {
        txn.remove(coll, &meta);
    }
    txn.remove_collection(coll);
    match store.submit(txn).and_then(|c| c.wait()) {
        Ok(()) => Ok((Step::Gone, None)),
        Err(StoreError::CollectionNotEmpty { .. }) => {
            debug!(%coll, "an object appeared during removal; another pass");
            Ok((Step::Removed(0), None))
        }
        Err(e) => Err(e),
    }
}

/// Objects in `coll` (0 if it does not exist; blocking: lists them all).
pub fn count_objects(store: &dyn ObjectStore, coll: CollectionId) -> Result<u64, StoreError> {
    let mut n = 0u64;
    let mut from: Option<ObjectId> = None;
    loop {
        let page = match store.list_objects(coll, from.as_ref(), 1024) {
            Ok(p) => p,
            Err(StoreError::CollectionNotFound { .. }) => return Ok(n),
            Err(e) => return Err(e),
        };
        n += page.objects.len() as u64;
        match page.next {
            Some(next) => from = Some(next),
            None => return Ok(n),
        }
    }
}

/// What one step of a PG's removal did.
pub enum Step {
    /// Removed this many objects; more may be left.
    Removed(u64),
    /// The collection is gone (removed now, or it did not exist).
    Gone,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pg(pool: u32, seed: u32) -> PgId {
        PgId::new(pool, seed)
    }

    #[test]
    fn the_queue_counts_down_and_keeps_counts_of_requeued_pgs() {
        let mut q = RemovalQueue::default();
        assert!(q.queue(pg(3, 1), 100));
        assert!(q.queue(pg(3, 0), 50));
        assert!(q.queue(pg(2, 7), 10));
        assert_eq!((q.pgs_left(), q.objects_left()), (3, 160));
        // lowest first: a removal once started is finished before the next
        assert_eq!(q.next(), Some(pg(2, 7)));
        q.removed(pg(2, 7), 4);
        // a rescan finds it again: its count is not reset
        assert!(!q.queue(pg(2, 7), 10));
        assert_eq!(q.objects_left(), 156);
        q.removed(pg(2, 7), 100);
        assert_eq!(q.objects_left(), 150, "counts never go below zero");
        q.finished(pg(2, 7));
        assert_eq!(q.next(), Some(pg(3, 0)));
        assert!(!q.contains(pg(2, 7)));
        q.finished(pg(3, 0));
        q.finished(pg(3, 1));
        assert_eq!((q.pgs_left(), q.objects_left(), q.next()), (0, 0, None));
    }

    #[test]
    fn only_collections_of_missing_pools_are_doomed() {
        let colls: Vec<CollectionId> = [pg(1, 0), pg(1, 1), pg(2, 0), pg(4, 3), pg(4, 4)]
            .into_iter()
            .map(CollectionId)
            .collect();
        let mut q = RemovalQueue::default();
        q.queue(pg(4, 3), 1);
        let d = doomed(&colls, |p| p == 1, 4, &q);
        assert_eq!(d, vec![pg(2, 0), pg(4, 4)]);
        assert!(doomed(&colls, |_| true, 4, &RemovalQueue::default()).is_empty());
        // Pools newer than the map (created after it: ids above its pool_max) are never
        // taken for deleted ones, whatever the map says of them.
        let d = doomed(&colls, |p| p == 1, 2, &RemovalQueue::default());
        assert_eq!(d, vec![pg(2, 0)]);
        assert!(doomed(&colls, |_| false, 0, &RemovalQueue::default()).is_empty());
    }

    #[test]
    fn batches_hold_the_metadata_object_back_and_respect_the_size() {
        let coll = CollectionId(pg(5, 2));
        let meta = PgMeta::meta_oid(coll);
        let objs: Vec<ObjectId> = (0..10)
            .map(|i| ObjectId::new(5, "", &format!("o{i}"), i))
            .collect();
        let mut page = objs.clone();
        page.insert(3, meta.clone());
        let b = plan_batch(&page, &meta, 4);
        assert_eq!(b, objs[..4].to_vec());
        assert!(!plan_batch(&page, &meta, 100).contains(&meta));
        assert_eq!(
            plan_batch(&page, &meta, 0).len(),
            1,
            "a batch is never empty"
        );
        assert!(plan_batch(std::slice::from_ref(&meta), &meta, 4).is_empty());
    }

    /// A whole removal against the in-memory store, interrupted and resumed: objects with
    /// omap and xattrs, the metadata object held to the end, the collection gone, other
    /// collections untouched.
    #[test]
    fn steps_empty_the_collection_and_survive_a_restart_between_them() {
        let store = kelp_store::MemStore::new();
        let coll = CollectionId(pg(7, 0));
        let other = CollectionId(pg(8, 0));
        let mut txn = Transaction::new();
        PgMeta::create(&mut txn, coll, 100);
        PgMeta::create(&mut txn, other, 100);
        for i in 0..25u32 {
            let oid = ObjectId::new(7, "", &format!("obj-{i}"), i);
            txn.write(coll, &oid, 0, vec![7u8; 100]);
            txn.set_xattr(coll, &oid, "a", vec![1]);
            let mut omap = BTreeMap::new();
            omap.insert(b"k".to_vec(), b"v".to_vec());
            txn.omap_set(coll, &oid, omap);
        }
        txn.touch(other, &ObjectId::new(8, "", "keep", 1));
        store.submit(txn).unwrap().wait().unwrap();
        assert_eq!(count_objects(&store, coll).unwrap(), 26);

        // two steps, then "a restart": the cursor is lost, the next pass starts over
        let (s, next) = remove_step(&store, coll, None, 10).unwrap();
        assert!(matches!(s, Step::Removed(10)));
        let (s, _) = remove_step(&store, coll, next, 10).unwrap();
        assert!(matches!(s, Step::Removed(10)));
        assert_eq!(count_objects(&store, coll).unwrap(), 6);
        let mut from = None;
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 20, "the removal converges");
            match remove_step(&store, coll, from.take(), 10).unwrap() {
                (Step::Gone, _) => break,
                (Step::Removed(_), next) => from = next,
            }
        }
        assert!(!store.collection_exists(coll).unwrap());
        assert_eq!(count_objects(&store, other).unwrap(), 2);
        // removing what is gone is done
        assert!(matches!(
            remove_step(&store, coll, None, 10).unwrap().0,
            Step::Gone
        ));
    }
}
