//! Configuration of the durable store. Geometry ([`MkfsOptions`]) is fixed at `mkfs` time and
//! recorded in the superblock; [`StoreConfig`] may change between mounts.

use kelp_types::ByteSize;
use serde::{Deserialize, Serialize};

/// Fixed at `mkfs`; stored in the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MkfsOptions {
    /// Size of the data file (created sparse). Default 16 GiB.
    pub size: ByteSize,
    /// Allocation unit of the data device; writes that do not cover whole units are deferred
    /// (carried in the metadata commit and applied afterwards). Default 4 KiB.
    pub min_alloc_size: ByteSize,
    /// Every `csum_block_size` bytes of data carry one crc32c, verified on every read.
    /// Must divide `min_alloc_size`. Default 4 KiB.
    pub csum_block_size: ByteSize,
    /// Write the whole data file with zeros at mkfs instead of only reserving it (fallocate).
    /// Written extents need no filesystem metadata when overwritten, so each group commit
    /// needs one device flush instead of two (see docs/STORE.md); costs one sequential write
    /// of `size` at mkfs. Default false (fast mkfs for tests and `kelp up`).
    pub prewrite: bool,
    /// Create the data file sparse and write it with zeros in large steps as data arrives
    /// (the first step at mkfs, the next ones by a background thread before the allocator
    /// needs them): commits need one device flush, as with `prewrite`, and mkfs takes well
    /// under a second and almost no disk. Ignored with `prewrite`. Default false.
    pub grow: bool,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            size: ByteSize(16 << 30),
            min_alloc_size: ByteSize(4096),
            csum_block_size: ByteSize(4096),
            prewrite: false,
            grow: false,
        }
    }
}

/// Runtime options of a mounted store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Hard budget for the store's memory: metadata block cache (1/8), decoded object-record
    /// cache (1/4, charged at the heap the records hold), metadata write buffers (1/4) and
    /// transactions prepared but not yet durable (1/8). The last quarter is headroom for the
    /// process and allocator, so a process running a store stays within it. Default 256 MiB.
    pub cache_budget: ByteSize,
    /// Whole-unit writes up to this size are also deferred (carried in the metadata commit)
    /// instead of being written to new extents and flushed before the commit; saves one device
    /// flush per commit for small writes. They still go to freshly allocated units, never over
    /// live data. 0 disables. Default 8 KiB (measured on the reference VM: deferring 4 KiB
    /// writes gives 2-5x the IOPS of writing them to new extents, while from 16 KiB on new
    /// extents win, 2x at 64 KiB, since deferred data is written twice and fills the log;
    /// see docs/BENCHMARKS.md).
    pub prefer_deferred_size: ByteSize,
    /// Most transactions that share one group commit (one flush). Default 512.
    pub max_batch_txns: usize,
    /// After this long without new commits, deferred writes already applied are flushed and
    /// their records dropped from the metadata database. Default 200 ms.
    pub deferred_cleanup_ms: u64,
    /// Reads larger than 64 KiB go to the device (`O_DIRECT`) unless the same range was read
    /// before within the last `hot_read_window` bytes of such reads: then they go through the
    /// kernel's page cache, and later reads are answered from it (docs/STORE.md, "Reads").
    /// Also bounds how much of the page cache large reads fill. 0: large reads always go to
    /// the device. Default 1 GiB.
    pub hot_read_window: ByteSize,
    /// A growing data file (`MkfsOptions::grow`) is written with zeros this much at a time,
    /// ahead of the allocator. 0: 1/64 of the file, between 64 MiB and 512 MiB (the default;
    /// smaller steps are for tests that must see the file grow often).
    pub grow_step: ByteSize,
    /// Objects of at most this many bytes keep their data inline in their metadata record
    /// instead of in an allocation unit of the data file (docs/STORE.md, "Small objects"): a
    /// 1 KiB erasure-coded shard then costs about 1 KiB, not 4 KiB. Capped at half of
    /// `min_alloc_size`; 0 disables (existing inline objects stay readable). Default 2 KiB.
    pub inline_max: ByteSize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            cache_budget: ByteSize(256 << 20),
            prefer_deferred_size: ByteSize(8 << 10),
            max_batch_txns: 512,
            deferred_cleanup_ms: 200,
            hot_read_window: ByteSize(1 << 30),
            grow_step: ByteSize(0),
            inline_max: ByteSize(2 << 10),
        }
    }
}

impl StoreConfig {
    pub(crate) fn block_cache_bytes(&self) -> u64 {
        self.cache_budget.0 / 8
    }
    pub(crate) fn onode_cache_bytes(&self) -> u64 {
        self.cache_budget.0 / 4
    }
    pub(crate) fn write_buffer_bytes(&self) -> u64 {
        (self.cache_budget.0 / 4).max(4 << 20)
    }
    pub(crate) fn inflight_bytes(&self) -> u64 {
        (self.cache_budget.0 / 8).max(8 << 20)
    }
}
