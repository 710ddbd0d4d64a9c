//! The [`ObjectStore`] interface implemented by [`crate::KelpStore`] (durable) and
//! [`crate::MemStore`] (in memory, for fast tests).
//!
//! Contract (checked by `tests/conformance.rs` against both implementations):
//! - `submit` applies a transaction atomically: either every operation takes effect or, if any
//!   fails validation (missing object, full device...), none does and the error is returned.
//! - Transactions are applied in submission order. Once `submit` returns `Ok`, reads observe the
//!   transaction ("readable"); the returned [`Commit`] resolves once it is durable, i.e. it
//!   survives a crash or power loss. After a crash, the store holds a prefix of the submitted
//!   transactions that includes every one whose `Commit` resolved `Ok`.
//! - Reads never return data that fails its checksum: they return
//!   [`StoreError::ChecksumMismatch`] instead.
//! - Reads are synchronous and may block on disk I/O; call them from a blocking context (a
//!   thread, or `tokio::task::spawn_blocking`).

use std::collections::BTreeMap;

use crate::error::Result;
use crate::types::{CollectionId, Commit, ListPage, ObjectId, ObjectStat, OmapPage, Transaction};

/// A store's capacity and usage, bytes (what `statfs` is to a file system). `used` counts
/// space holding data (allocated units on a device); metadata kept elsewhere (the KV
/// database of `KelpStore`) is not counted, which is also why metadata-only transactions
/// (deletes, attribute and omap removals) still commit when `available` is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreSpace {
    pub total: u64,
    pub used: u64,
    pub available: u64,
}

impl StoreSpace {
    /// `used / total` (0 for an empty-capacity store).
    pub fn ratio(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.used as f64 / self.total as f64
        }
    }
}

/// A store's cache and allocation figures, for its owner's metrics. Cheap to take (counters
/// and a few short locks, no I/O); a store without a cache reports zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Object-record (onode) cache lookups that found the record (or its known absence).
    pub onode_cache_hits: u64,
    /// Object-record cache lookups that had to read the metadata database.
    pub onode_cache_misses: u64,
    /// Records (and known absences) in the object-record cache now.
    pub onode_cache_entries: u64,
    /// Heap the object-record cache holds now, bytes.
    pub onode_cache_bytes: u64,
    /// The object-record cache's budget, bytes.
    pub onode_cache_capacity_bytes: u64,
    /// Free extents of the data device (below the written frontier): many small extents for
    /// the same free space means fragmentation.
    pub free_extents: u64,
    /// The largest free extent, bytes (the largest write that fits in one piece).
    pub largest_free_extent_bytes: u64,
    /// Free space in those extents, bytes.
    pub free_extent_bytes: u64,
}

pub trait ObjectStore: Send + Sync {
    /// Cache and allocation figures ([`StoreStats`]); zeros by default.
    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }

    /// Apply `txn` atomically; the returned future resolves once it is durable.
    fn submit(&self, txn: Transaction) -> Result<Commit>;

    /// Capacity and usage of the data device. Cheap (no I/O): called for every stats report
    /// and for the OSD's full-ratio failsafe.
    fn space(&self) -> Result<StoreSpace>;

    /// Wait until everything submitted so far is durable.
    fn flush(&self) -> Result<()>;

    /// All collections, in order.
    fn list_collections(&self) -> Result<Vec<CollectionId>>;

    fn collection_exists(&self, coll: CollectionId) -> Result<bool>;

    /// Up to `max` objects of `coll` in [`ObjectId`] order, starting at `start` (inclusive; `None`
    /// for the beginning).
    fn list_objects(
        &self,
        coll: CollectionId,
        start: Option<&ObjectId>,
        max: usize,
    ) -> Result<ListPage>;

    /// Size of an object; `ObjectNotFound` if it does not exist.
    fn stat(&self, coll: CollectionId, oid: &ObjectId) -> Result<ObjectStat>;

    /// Whether the object exists (collection must exist).
    fn exists(&self, coll: CollectionId, oid: &ObjectId) -> Result<bool> {
        match self.stat(coll, oid) {
            Ok(_) => Ok(true),
            Err(crate::StoreError::ObjectNotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Read `[offset, offset + len)`, clipped to the object size (short or empty past the end).
    fn read(&self, coll: CollectionId, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>>;

    /// Like [`ObjectStore::read`], but every byte comes from the device, none from a cache (a
    /// small read may otherwise be served from the page cache): deep scrubs use it to find
    /// damaged blocks that a cached good copy would hide.
    fn read_from_device(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        self.read(coll, oid, offset, len)
    }

    /// Like [`ObjectStore::read`], as `Bytes`: a store may hand out its own read buffer
    /// instead of copying it (the OSD sends a large read's reply straight from it).
    fn read_bytes(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<bytes::Bytes> {
        self.read(coll, oid, offset, len).map(bytes::Bytes::from)
    }

    /// All extended attributes of an object.
    fn xattrs(&self, coll: CollectionId, oid: &ObjectId) -> Result<BTreeMap<String, Vec<u8>>>;

    /// One extended attribute, `None` if unset.
    fn xattr(&self, coll: CollectionId, oid: &ObjectId, name: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.xattrs(coll, oid)?.remove(name))
    }

    /// The omap header, `None` if unset.
    fn omap_header(&self, coll: CollectionId, oid: &ObjectId) -> Result<Option<Vec<u8>>>;

    /// The values of those `keys` that are set.
    fn omap_get(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
        keys: &[Vec<u8>],
    ) -> Result<BTreeMap<Vec<u8>, Vec<u8>>>;

    /// Up to `max` omap entries in key order, strictly after `after` (`None`: from the first).
    fn omap_iter(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<OmapPage>;
}
