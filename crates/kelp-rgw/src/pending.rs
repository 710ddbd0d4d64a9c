//! Pending-entry keys that are reused.
//!
//! Every upload records a pending entry in its key's index shard before writing data and
//! removes it in the commit (see [`crate::index`]). With one new key per upload each removal
//! left a tombstone that the OSDs' metadata database keeps until its last level, which an
//! index never reaches: an ingest of 5 million objects left 5 million tombstones in the index
//! shards, merged by every compaction and walked by every scan of the pending range (the
//! collector's, each pass). So the key is taken from a pool of this gateway's slots instead:
//! `p<gateway>.<shard object>.<n>`, where `n` is free while no upload of this gateway holds
//! it. A key then alternates between set and removed, and compaction keeps only its newest
//! version: the shard holds at most as many pending keys as uploads ran in it at once.
//!
//! A slot is reused only once its entry is known to be gone (the commit or the abandonment
//! removed it): an upload whose commit failed leaves its entry for the collector, and its slot
//! is retired rather than handed to the next upload, which would otherwise overwrite it.
//! Keys name the shard object the upload started in, so entries that a reshard merges from
//! several old shards into one new shard never share a key.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::layout::PENDING_PREFIX;

/// Free slot numbers per shard object, and the next number never used.
#[derive(Default)]
struct Pools {
    free: HashMap<String, BTreeSet<u32>>,
    next: HashMap<String, u32>,
}

/// The gateway's pending-key slots.
pub(crate) struct SlotPool {
    gateway: String,
    pools: Mutex<Pools>,
}

impl SlotPool {
    pub fn new(gateway: String) -> Arc<SlotPool> {
        Arc::new(SlotPool {
            gateway,
            pools: Mutex::new(Pools::default()),
        })
    }

    /// Takes a free slot of `shard_obj` (the lowest free one, so a steady load reuses the same
    /// few keys).
    pub fn take(self: &Arc<Self>, shard_obj: &str) -> Lease {
        let n = {
            let mut p = self.pools.lock().expect("pending slot pools");
            match p.free.get_mut(shard_obj).and_then(BTreeSet::pop_first) {
                Some(n) => n,
                None => {
                    let next = p.next.entry(shard_obj.to_string()).or_insert(0);
                    let n = *next;
                    *next += 1;
                    n
                }
            }
        };
        Lease {
            pool: self.clone(),
            shard_obj: shard_obj.to_string(),
            n,
            key: format!("{PENDING_PREFIX}{}.{shard_obj}.{n}", self.gateway),
            reusable: AtomicBool::new(false),
        }
    }

    fn give_back(&self, shard_obj: &str, n: u32) {
        let mut p = self.pools.lock().expect("pending slot pools");
        p.free.entry(shard_obj.to_string()).or_default().insert(n);
    }
}

/// One upload's hold on a slot; the slot goes back to the pool when the lease is dropped, if
/// [`Lease::entry_removed`] was called.
pub(crate) struct Lease {
    pool: Arc<SlotPool>,
    shard_obj: String,
    n: u32,
    key: String,
    reusable: AtomicBool,
}

impl Lease {
    /// The upload's pending entry is gone from the index: the slot may be reused.
    pub fn entry_removed(&self) {
        self.reusable.store(true, Ordering::Relaxed);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if *self.reusable.get_mut() {
            self.pool.give_back(&self.shard_obj, self.n);
        }
    }
}

/// An upload's pending entry: its omap key and the value it was written with. Cheap to clone
/// (a background abandonment holds a clone).
#[derive(Clone)]
pub struct PendingEntry {
    lease: Arc<Lease>,
    pub(crate) value: Bytes,
}

impl PendingEntry {
    pub(crate) fn new(lease: Lease, value: Bytes) -> PendingEntry {
        PendingEntry {
            lease: Arc::new(lease),
            value,
        }
    }
    /// The omap key of the entry.
    pub fn key(&self) -> &str {
        &self.lease.key
    }
    /// The entry was removed from the index (by its commit or abandonment).
    pub(crate) fn removed(&self) {
        self.lease.entry_removed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_only_after_their_entry_was_removed() {
        let pool = SlotPool::new("gw1".into());
        let a = pool.take("b.0");
        let b = pool.take("b.0");
        assert_eq!(a.key, "pgw1.b.0.0");
        assert_eq!(b.key, "pgw1.b.0.1");
        // Another shard object has its own numbers and keys.
        assert_eq!(pool.take("b.1").key, "pgw1.b.1.0");
        a.entry_removed();
        drop(a);
        // Not removed (a failed commit): retired, never handed out again.
        drop(b);
        assert_eq!(pool.take("b.0").key, "pgw1.b.0.0");
        let c = pool.take("b.0");
        assert_eq!(c.key, "pgw1.b.0.2");
    }

    #[test]
    fn a_clone_keeps_the_slot_until_the_last_one_goes() {
        let pool = SlotPool::new("g".into());
        let e = PendingEntry::new(pool.take("s"), Bytes::from_static(b"v"));
        let bg = e.clone();
        e.removed();
        drop(e);
        // The background holder still has it.
        assert_eq!(pool.take("s").key, "pg.s.1");
        drop(bg);
        assert_eq!(pool.take("s").key, "pg.s.0");
    }
}
