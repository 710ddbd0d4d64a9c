//! The PG log: one entry per write, `(epoch, version)`-stamped, stored in the omap of the PG's
//! metadata object in the same store transaction as the write itself. After a crash the log
//! and the data therefore agree; peering compares members' logs to find what each is missing,
//! and recovery replays the difference.
//!
//! Layout: the metadata object lives in the PG's collection under a namespace no client can
//! use (`INTERNAL_NAMESPACE`); its omap header holds the `PgInfo`, and the log is a ring of
//! `max_entries` slots: the entry of `version` is the omap key `version % slots` (8 bytes
//! big-endian) with the encoded entry as value, each value starting with a format version byte.
//! An append overwrites the slot of the entry it trims instead of deleting it: a deletion is a
//! tombstone that the metadata database carries down to its last level (never reached by an
//! OSD's metadata) and merges forever, three of them per S3 PUT, while an overwritten value is
//! dropped by the first compaction that sees both. Slots whose entry is outside `(log_tail,
//! last_update]` are stale and ignored. The slot count is the metadata object's `log_slots`
//! attribute; a store written with another count (a changed `osd_max_pg_log_entries`) or before
//! the ring (entries keyed by their version, no attribute) is laid out again when it is loaded.
//!
//! Invariants: versions are dense and increasing (`last_update.1` is the newest entry's
//! version); the log holds the entries `(tail, last_update]`; at most `max_entries` are kept.
//!
//! Memory: every PG keeps its whole log in memory (writes consult it for resent requests,
//! peering sends it), so with thousands of entries per PG and dozens of PGs per OSD the log is
//! one of the OSD's largest allocations. Each entry is therefore held as its encoded bytes (the
//! omap value, ~60 bytes for a typical name) and the resent-request index holds only versions,
//! keyed by a hash of the request id and confirmed against the entry itself: ~130 bytes per
//! entry instead of ~320 for decoded entries with a map of cloned request ids.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use kelp_proto::ObjectLocator;
use kelp_store::{CollectionId, ObjectId, ObjectStore, StoreError, Transaction};
use serde::{Deserialize, Serialize};

/// Namespace of Kelp's own per-PG objects; client ops in it are refused.
pub const INTERNAL_NAMESPACE: &str = "\u{1f}kelp";
const FORMAT: u8 = 1;
/// Attribute of the metadata object: the ring's slot count (u64 LE).
const SLOTS_ATTR: &str = "log_slots";
/// Attribute of the metadata object, erasure-coded pools only: the shard position this
/// member's objects were written for (u32 LE). Absent in PGs from before it was kept: those
/// hold the shard of the position they are at.
const EC_SHARD_ATTR: &str = "ec_shard";

/// Ring slots for a cap of `max_entries` (a cap of 0 keeps no entry, but the newest is still
/// written before it is trimmed).
fn ring_slots(max_entries: usize) -> u64 {
    (max_entries as u64).max(1)
}

/// One write as the log remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub epoch: u32,
    pub version: u64,
    pub object: ObjectLocator,
    /// The client request that made it, to answer a resent request without applying it twice.
    pub reqid: (String, u64),
    /// Whether the object was deleted by this write.
    pub deleted: bool,
}

/// The PG's persistent summary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgInfo {
    /// (epoch, version) of the newest write.
    pub last_update: (u32, u64),
    /// Version just before the oldest entry still in the log.
    pub log_tail: u64,
}

/// One planned log append (see [`PgMeta::plan_append`]).
#[derive(Debug, Clone)]
pub struct LogAppend {
    coll: CollectionId,
    info: PgInfo,
    slots: u64,
    /// Erasure-coded pools: a new shard-position record to stage with the entry.
    ec_shard: Option<u32>,
}

fn set_ec_shard(txn: &mut Transaction, coll: CollectionId, shard: u32) {
    let oid = PgMeta::meta_oid(coll);
    txn.set_xattr(coll, &oid, EC_SHARD_ATTR, shard.to_le_bytes().to_vec());
}

impl LogAppend {
    /// Adds the entry, the trimming and the new info to `txn`.
    pub fn stage(&self, txn: &mut Transaction, entry: &LogEntry) {
        let oid = PgMeta::meta_oid(self.coll);
        let mut add = std::collections::BTreeMap::new();
        add.insert(slot_key(entry.version, self.slots), encode(entry));
        txn.omap_set(self.coll, &oid, add);
        txn.omap_set_header(self.coll, &oid, encode(&self.info));
        if let Some(shard) = self.ec_shard {
            set_ec_shard(txn, self.coll, shard);
        }
    }

    /// Erasure-coded pools: this write is for shard position `shard`; the PG's record of its
    /// position is staged with the entry if it differs.
    pub fn for_ec_shard(mut self, meta: &PgMeta, shard: Option<u32>) -> LogAppend {
        self.ec_shard = shard.filter(|&s| meta.ec_shard != Some(s));
        self
    }
}

/// One log entry as memory keeps it: its encoded form (the omap value), plus what the write
/// path needs without decoding.
#[derive(Debug, Clone)]
struct HeldEntry {
    version: u64,
    reqid_hash: u64,
    encoded: Box<[u8]>,
}

impl HeldEntry {
    fn decode(&self) -> LogEntry {
        decode(&self.encoded, "log entry").expect("held log entries were encoded or checked here")
    }
}

/// In-memory view of a PG's log, kept in step with the store.
#[derive(Debug, Clone)]
pub struct PgMeta {
    pub coll: CollectionId,
    pub info: PgInfo,
    log: VecDeque<HeldEntry>,
    /// `(request id hash, version)` of the entries in `log`.
    dups: HashTable<(u64, u64)>,
    hasher: RandomState,
    max_entries: usize,
    /// Erasure-coded pools: the shard position this member's objects belong to, if recorded.
    pub ec_shard: Option<u32>,
}

/// The omap key of `version` in a ring of `slots`.
fn slot_key(version: u64, slots: u64) -> Vec<u8> {
    (version % slots).to_be_bytes().to_vec()
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![FORMAT];
    out.extend(postcard::to_stdvec(v).expect("encoding into a Vec cannot fail"));
    out
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T, StoreError> {
    match bytes.split_first() {
        Some((&FORMAT, body)) => postcard::from_bytes(body).map_err(|e| StoreError::Failed {
            reason: format!("corrupt PG {what}: {e}"),
        }),
        Some((v, _)) => Err(StoreError::Failed {
            reason: format!("PG {what} has unknown format version {v}"),
        }),
        None => Err(StoreError::Failed {
            reason: format!("PG {what} is empty"),
        }),
    }
}

impl From<LogEntry> for kelp_proto::WireLogEntry {
    fn from(e: LogEntry) -> Self {
        kelp_proto::WireLogEntry {
            epoch: e.epoch,
            version: e.version,
            object: e.object,
            reqid: e.reqid,
            deleted: e.deleted,
        }
    }
}

impl From<kelp_proto::WireLogEntry> for LogEntry {
    fn from(e: kelp_proto::WireLogEntry) -> Self {
        LogEntry {
            epoch: e.epoch,
            version: e.version,
            object: e.object,
            reqid: e.reqid,
            deleted: e.deleted,
        }
    }
}

impl PgMeta {
    /// The metadata object of a PG.
    pub fn meta_oid(coll: CollectionId) -> ObjectId {
        ObjectId::new(coll.0.pool.0, INTERNAL_NAMESPACE, "pgmeta", coll.0.seed)
    }

    /// Queues the creation of an empty PG (collection, metadata object, info).
    pub fn create(txn: &mut Transaction, coll: CollectionId, max_entries: usize) -> PgMeta {
        let oid = Self::meta_oid(coll);
        let info = PgInfo::default();
        txn.create_collection(coll);
        txn.touch(coll, &oid);
        txn.omap_set_header(coll, &oid, encode(&info));
        txn.set_xattr(
            coll,
            &oid,
            SLOTS_ATTR,
            ring_slots(max_entries).to_le_bytes().to_vec(),
        );
        PgMeta::empty(coll, info, max_entries)
    }

    fn slots(&self) -> u64 {
        ring_slots(self.max_entries)
    }

    fn empty(coll: CollectionId, info: PgInfo, max_entries: usize) -> PgMeta {
        PgMeta {
            coll,
            info,
            log: VecDeque::new(),
            dups: HashTable::new(),
            hasher: RandomState::new(),
            max_entries,
            ec_shard: None,
        }
    }

    /// Records (in `txn`, and here) that this member's objects are written for shard
    /// position `shard` from now on. Nothing is staged when that is already the record.
    pub fn stage_ec_shard(&mut self, txn: &mut Transaction, shard: u32) {
        if self.ec_shard == Some(shard) {
            return;
        }
        set_ec_shard(txn, self.coll, shard);
        self.ec_shard = Some(shard);
    }

    /// Loads a PG's info and log from the store. If the store holds the log in another layout
    /// (another slot count, or keyed by version from before the ring), `txn` gets the rewrite
    /// into this cap's ring; it must be submitted before the next append.
    pub fn load(
        store: &dyn ObjectStore,
        coll: CollectionId,
        max_entries: usize,
        txn: &mut Transaction,
    ) -> Result<PgMeta, StoreError> {
        let oid = Self::meta_oid(coll);
        let info: PgInfo = match store.omap_header(coll, &oid)? {
            Some(h) => decode(&h, "info")?,
            None => PgInfo::default(),
        };
        let stored_slots = store
            .xattr(coll, &oid, SLOTS_ATTR)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map(u64::from_le_bytes);
        let mut meta = PgMeta::empty(coll, info, max_entries);
        meta.ec_shard = store
            .xattr(coll, &oid, EC_SHARD_ATTR)?
            .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
            .map(u32::from_le_bytes);
        let mut keys = Vec::new();
        let mut found = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = store.omap_iter(coll, &oid, after.as_deref(), 1024)?;
            for (k, v) in &page.entries {
                let entry: LogEntry = decode(v, "log entry")?;
                // Stale ring slots: trimmed entries not yet overwritten, or entries of a
                // history that peering replaced with a shorter one.
                if entry.version > meta.info.log_tail && entry.version <= meta.info.last_update.1 {
                    found.push((entry, v.clone().into_boxed_slice()));
                }
                keys.push(k.clone());
            }
            match page.entries.last() {
                Some((k, _)) if page.more => after = Some(k.clone()),
                _ => break,
            }
        }
        found.sort_by_key(|(e, _)| e.version);
        found.dedup_by_key(|(e, _)| e.version);
        // A smaller cap than the log was written with: the oldest entries go.
        let excess = found.len().saturating_sub(max_entries);
        if excess > 0 {
            meta.info.log_tail = found[excess - 1].0.version;
        }
        for (entry, encoded) in found.into_iter().skip(excess) {
            meta.push_held(&entry, encoded);
        }
        if stored_slots != Some(meta.slots()) || excess > 0 {
            let slots = meta.slots();
            txn.omap_remove(coll, &oid, keys);
            let add: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = meta
                .log
                .iter()
                .map(|h| (slot_key(h.version, slots), h.encoded.to_vec()))
                .collect();
            if !add.is_empty() {
                txn.omap_set(coll, &oid, add);
            }
            txn.omap_set_header(coll, &oid, encode(&meta.info));
            txn.set_xattr(coll, &oid, SLOTS_ATTR, slots.to_le_bytes().to_vec());
        }
        Ok(meta)
    }

    /// The version the next write gets.
    pub fn next_version(&self) -> u64 {
        self.info.last_update.1 + 1
    }

    fn reqid_hash(&self, reqid: &(String, u64)) -> u64 {
        self.hasher.hash_one(reqid)
    }

    /// The held entry of `version`, if the log has it.
    fn held(&self, version: u64) -> Option<&HeldEntry> {
        // Versions are dense, so the position follows from the oldest one; the search is only a
        // guard against a log that broke that invariant.
        let first = self.log.front()?.version;
        let at = usize::try_from(version.checked_sub(first)?).ok()?;
        match self.log.get(at) {
            Some(held) if held.version == version => Some(held),
            _ => self
                .log
                .binary_search_by_key(&version, |h| h.version)
                .ok()
                .map(|i| &self.log[i]),
        }
    }

    /// Appends an entry to the in-memory log and indexes its request id.
    fn push_held(&mut self, entry: &LogEntry, encoded: Box<[u8]>) {
        let reqid_hash = self.reqid_hash(&entry.reqid);
        self.dups
            .insert_unique(reqid_hash, (reqid_hash, entry.version), |&(h, _)| h);
        self.log.push_back(HeldEntry {
            version: entry.version,
            reqid_hash,
            encoded,
        });
    }

    /// Drops the oldest in-memory entry and its index slot; returns its version.
    fn pop_oldest(&mut self) -> Option<u64> {
        let old = self.log.pop_front()?;
        if let Ok(slot) = self
            .dups
            .find_entry(old.reqid_hash, |&(_, v)| v == old.version)
        {
            slot.remove();
        }
        Some(old.version)
    }

    fn reindex(&mut self) {
        self.dups.clear();
        for held in &self.log {
            self.dups.insert_unique(
                held.reqid_hash,
                (held.reqid_hash, held.version),
                |&(h, _)| h,
            );
        }
    }

    /// If this request was already applied (a client resend), the version it got.
    pub fn applied_version(&self, reqid: &(String, u64)) -> Option<u64> {
        let hash = self.reqid_hash(reqid);
        self.dups
            .find(hash, |&(h, v)| {
                h == hash && self.held(v).is_some_and(|e| e.decode().reqid == *reqid)
            })
            .map(|&(_, v)| v)
    }

    /// Adds `entry` to the log inside `txn` (the transaction that carries the write), updates
    /// the info, and trims the oldest entries beyond `max_entries`.
    pub fn append(&mut self, txn: &mut Transaction, entry: LogEntry) {
        let plan = self.plan_append(entry.epoch, entry.version);
        plan.stage(txn, &entry);
        self.commit_append(plan, entry);
    }

    /// What appending the next entry, `(epoch, version)`, will change: computed before the write
    /// executes, so the store transaction can be built without cloning the in-memory log (the
    /// write path's hot spot: a 3000-entry log copied per write). The PG must not change between
    /// this and `commit_append` (the caller holds the PG's write lock).
    pub fn plan_append(&self, epoch: u32, version: u64) -> LogAppend {
        debug_assert_eq!(version, self.next_version());
        let excess = (self.log.len() + 1).saturating_sub(self.max_entries);
        // The newest trimmed version (the new entry itself when max_entries is 0); the entries
        // trimmed keep their slots until the ring comes round to them.
        let log_tail = if excess > self.log.len() {
            version
        } else if excess > 0 {
            self.log[excess - 1].version
        } else {
            self.info.log_tail
        };
        LogAppend {
            coll: self.coll,
            info: PgInfo {
                last_update: (epoch, version),
                log_tail,
            },
            slots: self.slots(),
            ec_shard: None,
        }
    }

    /// Makes the in-memory log match a staged `plan` once its transaction was submitted.
    pub fn commit_append(&mut self, plan: LogAppend, entry: LogEntry) {
        debug_assert_eq!(plan.info.last_update, (entry.epoch, entry.version));
        self.push_held(&entry, encode(&entry).into_boxed_slice());
        while self.log.len() > self.max_entries {
            self.pop_oldest();
        }
        self.info = plan.info;
        if plan.ec_shard.is_some() {
            self.ec_shard = plan.ec_shard;
        }
    }

    /// Entries newer than `version`, or `None` if the log no longer reaches back that far
    /// (the caller must then fall back to backfill).
    pub fn entries_after(&self, version: u64) -> Option<Vec<LogEntry>> {
        if version < self.info.log_tail {
            return None;
        }
        Some(
            self.log
                .iter()
                .filter(|e| e.version > version)
                .map(HeldEntry::decode)
                .collect(),
        )
    }

    /// Replaces the log's newest part with the authoritative history: keeps the entries up to
    /// `keep_through` (none when `None`, which also takes the authoritative `log_tail`), then
    /// appends `entries` (which continue from `keep_through`), all inside `txn`.
    pub fn rewrite(
        &mut self,
        txn: &mut Transaction,
        keep_through: Option<u64>,
        entries: Vec<LogEntry>,
        log_tail: u64,
        last_update: (u32, u64),
    ) {
        let oid = Self::meta_oid(self.coll);
        let slots = self.slots();
        let keep = |e: &HeldEntry| keep_through.is_some_and(|v| e.version <= v);
        // Slots of the replaced entries: removed unless an entry kept or added takes them.
        let mut freed: std::collections::BTreeSet<Vec<u8>> = self
            .log
            .iter()
            .filter(|e| !keep(e))
            .map(|e| slot_key(e.version, slots))
            .collect();
        self.log.retain(|e| keep(e));
        if keep_through.is_none() {
            self.info.log_tail = log_tail;
        }
        self.reindex();
        for e in entries {
            self.push_held(&e, encode(&e).into_boxed_slice());
        }
        self.info.last_update = last_update;
        while self.log.len() > self.max_entries {
            if let Some(old) = self.pop_oldest() {
                self.info.log_tail = old;
            }
        }
        let add: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = self
            .log
            .iter()
            .filter(|h| keep_through.is_none_or(|k| h.version > k))
            .map(|h| (slot_key(h.version, slots), h.encoded.to_vec()))
            .collect();
        for h in &self.log {
            freed.remove(&slot_key(h.version, slots));
        }
        if !freed.is_empty() {
            txn.omap_remove(self.coll, &oid, freed.into_iter().collect());
        }
        if !add.is_empty() {
            txn.omap_set(self.coll, &oid, add);
        }
        txn.omap_set_header(self.coll, &oid, encode(&self.info));
    }

    /// Every entry, oldest first.
    pub fn entries(&self) -> Vec<LogEntry> {
        self.log.iter().map(HeldEntry::decode).collect()
    }

    pub fn len(&self) -> usize {
        self.log.len()
    }

    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kelp_store::MemStore;

    fn entry(version: u64, client: &str, tid: u64) -> LogEntry {
        LogEntry {
            epoch: 3,
            version,
            object: ObjectLocator {
                pool: 1,
                namespace: String::new(),
                key: None,
                name: format!("obj-{version}"),
            },
            reqid: (client.to_string(), tid),
            deleted: version.is_multiple_of(7),
        }
    }

    /// Appends versions `from..=to`, each in its own committed transaction.
    fn append_range(store: &MemStore, meta: &mut PgMeta, from: u64, to: u64) {
        for v in from..=to {
            let mut t = Transaction::new();
            meta.append(&mut t, entry(v, &format!("client.{}", v % 5), v));
            store.submit(t).unwrap().wait().unwrap();
        }
    }

    /// Loads the PG's log with cap `max`, submitting any relayout the load staged.
    fn load(store: &MemStore, coll: CollectionId, max: usize) -> PgMeta {
        let mut t = Transaction::new();
        let meta = PgMeta::load(store, coll, max, &mut t).unwrap();
        if !t.is_empty() {
            store.submit(t).unwrap().wait().unwrap();
        }
        meta
    }

    /// The omap keys (as numbers) of the PG's metadata object.
    fn stored_keys(store: &MemStore, coll: CollectionId) -> Vec<u64> {
        let page = store
            .omap_iter(coll, &PgMeta::meta_oid(coll), None, 100_000)
            .unwrap();
        assert!(!page.more);
        page.entries
            .iter()
            .map(|(k, _)| u64::from_be_bytes(k[..].try_into().unwrap()))
            .collect()
    }

    fn fresh(max: usize) -> (MemStore, PgMeta) {
        let store = MemStore::with_capacity(1 << 30);
        let coll = CollectionId::new(1, 4);
        let mut t = Transaction::new();
        let meta = PgMeta::create(&mut t, coll, max);
        store.submit(t).unwrap().wait().unwrap();
        (store, meta)
    }

    #[test]
    fn resent_requests_are_found_until_trimmed() {
        let (store, mut meta) = fresh(50);
        append_range(&store, &mut meta, 1, 120);
        assert_eq!(meta.len(), 50);
        assert_eq!(meta.info.log_tail, 70);
        assert_eq!(meta.info.last_update, (3, 120));
        for v in 71..=120 {
            let reqid = (format!("client.{}", v % 5), v);
            assert_eq!(meta.applied_version(&reqid), Some(v), "v{v}");
        }
        // Trimmed, another client's tid, and an unknown client are not resends.
        assert_eq!(meta.applied_version(&("client.0".into(), 70)), None);
        assert_eq!(meta.applied_version(&("client.1".into(), 120)), None);
        assert_eq!(meta.applied_version(&("client.9".into(), 100)), None);
        let all = meta.entries();
        assert_eq!(all.len(), 50);
        assert_eq!(all[0], entry(71, "client.1", 71));
        assert_eq!(all[49], entry(120, "client.0", 120));
        assert_eq!(meta.entries_after(69), None);
        let after = meta.entries_after(110).unwrap();
        assert_eq!(
            after.iter().map(|e| e.version).collect::<Vec<_>>(),
            (111..=120).collect::<Vec<_>>()
        );
        assert!(meta.entries_after(120).unwrap().is_empty());
    }

    #[test]
    fn load_rebuilds_the_same_log_and_index() {
        let (store, mut meta) = fresh(40);
        append_range(&store, &mut meta, 1, 90);
        let loaded = load(&store, meta.coll, 40);
        assert_eq!(loaded.info, meta.info);
        assert_eq!(loaded.entries(), meta.entries());
        for v in 51..=90 {
            let reqid = (format!("client.{}", v % 5), v);
            assert_eq!(loaded.applied_version(&reqid), Some(v));
        }
        assert_eq!(loaded.applied_version(&("client.0".into(), 50)), None);
        // The store holds exactly the kept entries, one per ring slot.
        assert_eq!(stored_keys(&store, meta.coll), (0..40).collect::<Vec<_>>());
    }

    #[test]
    fn appends_overwrite_ring_slots_instead_of_deleting() {
        let (store, mut meta) = fresh(7);
        for v in 1..=100 {
            let mut t = Transaction::new();
            meta.append(&mut t, entry(v, "client.0", v));
            // One key set, nothing removed (a removal is a tombstone in the database).
            assert!(
                !t.ops
                    .iter()
                    .any(|op| matches!(op, kelp_store::Op::OmapRemove { .. })),
                "v{v}"
            );
            store.submit(t).unwrap().wait().unwrap();
            assert!(stored_keys(&store, meta.coll).len() <= 7);
        }
        let loaded = load(&store, meta.coll, 7);
        assert_eq!(loaded.entries(), meta.entries());
        assert_eq!(
            loaded
                .entries()
                .iter()
                .map(|e| e.version)
                .collect::<Vec<_>>(),
            (94..=100).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_log_keyed_by_version_is_laid_out_as_a_ring_when_loaded() {
        // The layout before the ring: one key per version, trimmed ones deleted, no slot count.
        let store = MemStore::with_capacity(1 << 30);
        let coll = CollectionId::new(1, 4);
        let oid = PgMeta::meta_oid(coll);
        let mut t = Transaction::new();
        t.create_collection(coll).touch(coll, &oid);
        let mut add = std::collections::BTreeMap::new();
        for v in 31..=60u64 {
            add.insert(v.to_be_bytes().to_vec(), encode(&entry(v, "client.1", v)));
        }
        t.omap_set(coll, &oid, add);
        let info = PgInfo {
            last_update: (3, 60),
            log_tail: 30,
        };
        t.omap_set_header(coll, &oid, encode(&info));
        store.submit(t).unwrap().wait().unwrap();

        let mut meta = load(&store, coll, 50);
        assert_eq!(meta.info, info);
        let want: Vec<LogEntry> = (31..=60).map(|v| entry(v, "client.1", v)).collect();
        assert_eq!(meta.entries(), want);
        let mut slots: Vec<u64> = (31..=60).map(|v| v % 50).collect();
        slots.sort_unstable();
        assert_eq!(stored_keys(&store, coll), slots);
        // Appends continue in the ring, and a reload (nothing left to lay out) agrees.
        append_range(&store, &mut meta, 61, 75);
        let mut t = Transaction::new();
        let loaded = PgMeta::load(&store, coll, 50, &mut t).unwrap();
        assert!(t.is_empty());
        assert_eq!(loaded.entries(), meta.entries());
        assert_eq!(loaded.info, meta.info);
    }

    #[test]
    fn a_changed_cap_relays_the_ring() {
        let (store, mut meta) = fresh(40);
        append_range(&store, &mut meta, 1, 90);
        // Smaller: the newest 10 stay and the tail follows.
        let small = load(&store, meta.coll, 10);
        assert_eq!(
            small
                .entries()
                .iter()
                .map(|e| e.version)
                .collect::<Vec<_>>(),
            (81..=90).collect::<Vec<_>>()
        );
        assert_eq!(small.info.log_tail, 80);
        assert_eq!(stored_keys(&store, meta.coll), (0..10).collect::<Vec<_>>());
        assert_eq!(load(&store, meta.coll, 10).entries(), small.entries());
        // Larger: every entry stays, in the new slots.
        let mut big = load(&store, meta.coll, 64);
        assert_eq!(big.entries(), small.entries());
        append_range(&store, &mut big, 91, 200);
        let again = load(&store, meta.coll, 64);
        assert_eq!(again.entries(), big.entries());
        assert_eq!(again.len(), 64);
        assert_eq!(stored_keys(&store, meta.coll).len(), 64);
    }

    #[test]
    fn rewrite_replaces_the_newest_entries_and_their_requests() {
        let (store, mut meta) = fresh(30);
        append_range(&store, &mut meta, 1, 20);
        // The authority diverged after version 15: its 16..=25 came from other requests.
        let theirs: Vec<LogEntry> = (16..=25).map(|v| entry(v, "client.other", v)).collect();
        let mut t = Transaction::new();
        meta.rewrite(&mut t, Some(15), theirs.clone(), 0, (4, 25));
        store.submit(t).unwrap().wait().unwrap();
        assert_eq!(meta.info.last_update, (4, 25));
        assert_eq!(meta.applied_version(&("client.1".into(), 16)), None);
        assert_eq!(meta.applied_version(&("client.other".into(), 16)), Some(16));
        assert_eq!(meta.applied_version(&("client.0".into(), 15)), Some(15));
        let loaded = load(&store, meta.coll, 30);
        assert_eq!(loaded.entries(), meta.entries());
        assert_eq!(loaded.entries()[15..], theirs[..]);

        // A rewrite from nothing takes the authority's tail and trims to the cap.
        let theirs: Vec<LogEntry> = (100..=140).map(|v| entry(v, "client.x", v)).collect();
        let mut t = Transaction::new();
        meta.rewrite(&mut t, None, theirs, 99, (5, 140));
        store.submit(t).unwrap().wait().unwrap();
        assert_eq!(meta.len(), 30);
        assert_eq!(meta.info.log_tail, 110);
        assert_eq!(meta.applied_version(&("client.x".into(), 110)), None);
        assert_eq!(meta.applied_version(&("client.x".into(), 111)), Some(111));
        assert_eq!(meta.applied_version(&("client.0".into(), 15)), None);
        let loaded = load(&store, meta.coll, 30);
        assert_eq!(loaded.entries(), meta.entries());
        assert_eq!(loaded.info, meta.info);
    }

    #[test]
    fn a_zero_cap_keeps_nothing() {
        let (store, mut meta) = fresh(0);
        append_range(&store, &mut meta, 1, 5);
        assert!(meta.is_empty());
        assert_eq!(meta.info.log_tail, 5);
        assert_eq!(meta.applied_version(&("client.0".into(), 5)), None);
    }
}
