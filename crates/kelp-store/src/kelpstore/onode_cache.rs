//! The decoded object-record (onode) cache: sharded, charged at the heap the records hold,
//! within its share of the store's memory budget.

use super::*;

pub(super) const ONODE_CACHE_SHARDS: usize = 8;

/// Decoded object records of committed objects, so hot reads skip the database lookup and the
/// decode (a 4 MiB object's record carries 1024 checksums), and objects known to be absent
/// (`None`: a write to a new object looks it up twice, once to execute the op and once to
/// prepare the transaction). Filled only by readers holding `reuse` shared, from committed
/// values (never from the overlay); entries are dropped when a transaction touching them is
/// published (under `reuse` exclusively), so it never serves a stale record. Bounded in bytes;
/// when full, an arbitrary quarter is evicted.
#[derive(Default)]
pub(super) struct OnodeCacheShard {
    pub(super) map: HashMap<Vec<u8>, (Option<Arc<Onode>>, usize)>,
    pub(super) bytes: usize,
}

pub(super) struct OnodeCache {
    pub(super) shards: Vec<Mutex<OnodeCacheShard>>,
    pub(super) shard_cap: usize,
    /// Lookups that found an entry / found none (relaxed counters, for metrics).
    hits: AtomicU64,
    misses: AtomicU64,
}

impl OnodeCache {
    pub(super) fn new(bytes: u64) -> Self {
        OnodeCache {
            shards: (0..ONODE_CACHE_SHARDS)
                .map(|_| Mutex::new(OnodeCacheShard::default()))
                .collect(),
            shard_cap: (bytes as usize) / ONODE_CACHE_SHARDS,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
    pub(super) fn shard(&self, key: &[u8]) -> &Mutex<OnodeCacheShard> {
        &self.shards[kelp_types::crc32c(key) as usize % ONODE_CACHE_SHARDS]
    }
    /// `Some(None)`: known to be absent.
    pub(super) fn get(&self, key: &[u8]) -> Option<Option<Arc<Onode>>> {
        let found = lock(self.shard(key)).map.get(key).map(|(o, _)| o.clone());
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }
    /// Hits, misses, entries, bytes held and the budget (one short lock per shard).
    pub(super) fn stats(&self) -> (u64, u64, u64, u64, u64) {
        let (mut entries, mut bytes) = (0u64, 0u64);
        for sh in &self.shards {
            let sh = lock(sh);
            entries += sh.map.len() as u64;
            bytes += sh.bytes as u64;
        }
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
            entries,
            bytes,
            (self.shard_cap * ONODE_CACHE_SHARDS) as u64,
        )
    }
    /// Charged at the heap it holds (decoded record, key, table slot), not the encoded size:
    /// a decoded record is several times its encoding, and charging the encoding let the
    /// cache hold ~3x its budget (50 MiB for a 16 MiB budget, in a heap profile of an OSD).
    pub(super) fn insert(&self, key: Vec<u8>, onode: Option<Arc<Onode>>) {
        let slot = std::mem::size_of::<(Vec<u8>, (Option<Arc<Onode>>, usize))>() + 8;
        let cost = codec::heap_alloc(key.capacity())
            + slot
            + onode.as_deref().map_or(0, Onode::heap_bytes);
        if cost > self.shard_cap {
            return;
        }
        let mut sh = lock(self.shard(&key));
        if sh.bytes + cost > self.shard_cap {
            let target = self.shard_cap * 3 / 4;
            let victims: Vec<Vec<u8>> = sh.map.keys().take(sh.map.len() / 4 + 1).cloned().collect();
            for k in victims {
                if let Some((_, c)) = sh.map.remove(&k) {
                    sh.bytes -= c;
                }
                if sh.bytes <= target {
                    break;
                }
            }
        }
        if let Some((_, old)) = sh.map.insert(key, (onode, cost)) {
            sh.bytes -= old;
        }
        sh.bytes += cost;
    }
    pub(super) fn invalidate(&self, key: &[u8]) {
        let mut sh = lock(self.shard(key));
        if let Some((_, c)) = sh.map.remove(key) {
            sh.bytes -= c;
        }
    }
}
