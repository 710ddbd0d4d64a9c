//! The durable store: data in one large file (`DIR/block`) managed by an extent allocator,
//! metadata in an embedded LSM key/value database (fjall, `DIR/meta`), identity and geometry
//! in `DIR/superblock`. See `docs/STORE.md` for the full design; the invariants this module
//! keeps are:
//!
//! 1. **No live data is overwritten before its replacement is durable.** Whole allocation
//!    units are written to *newly allocated* units and the data file is flushed before the
//!    metadata commit that points at them. Units freed by a transaction return to the allocator
//!    only after that transaction's commit is durable, so committed metadata never points at
//!    reused space.
//! 2. **Deferred writes** (a write that covers only part of an allocation unit, and optionally
//!    small whole-unit writes) carry the full new unit content inside the metadata commit
//!    (`D` record). After the commit the committer writes them to the data file; the `D`
//!    record is deleted in a later commit, after a data-file flush. Mount replays any `D`
//!    records still present, so a crash between commit and write-back loses nothing. A unit is
//!    released only after the deferred writes of its batch were written back, so replay can
//!    never clobber a unit that has a new owner.
//! 3. **One metadata batch per group commit**: the committer thread takes every prepared
//!    transaction in the queue (in submission order), flushes the data file once, writes one
//!    atomic batch (object records, omap, bitmap chunks, deferred record) and syncs the journal
//!    once, then acknowledges all of them (in commit order), and only then writes back their
//!    deferred units and releases what must wait for that write-back. A crash leaves a prefix
//!    of the batches.
//! 4. **Prepared-but-not-durable state is readable**: the `overlay` holds the metadata of
//!    transactions between `submit` and their commit, and `pending_blocks` the unit contents of
//!    deferred writes not yet written back; reads consult both before the database/data file.
//! 5. **Every block read is verified** against its crc32c; a mismatch is
//!    [`StoreError::ChecksumMismatch`], never data.
//!
//! Hot paths: `submit`/`prepare` (serialised by the apply lock) and `read`.

mod buf;
mod commit;
mod mount;
mod onode_cache;
mod txc;

use buf::PooledBuf;
pub(crate) use buf::{AlignedBuf, BufPool};
use commit::committer;
pub use mount::mkfs;
use mount::*;
use onode_cache::OnodeCache;
use txc::Txc;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fjall::{Keyspace, PartitionCreateOptions, PartitionHandle, PersistMode};
use tokio::sync::oneshot;

use crate::alloc::{Allocator, Bitmap};
use crate::codec::{self, Extent, Onode};
use crate::config::{MkfsOptions, StoreConfig};
use crate::error::{Result, StoreError};
use crate::grow::{self, Grower};
use crate::hotread::{HotReads, Plan};
use crate::keys;
use crate::nowait;
use crate::store::{ObjectStore, StoreSpace};
use crate::superblock::{self, FORMAT_VERSION, Superblock};
use crate::types::{
    CollectionId, Commit, ListPage, ObjectId, ObjectStat, OmapPage, Op, Transaction,
};
use crate::wal::{self, KvOp, PART_DEFERRED, PART_META, Wal};

const DATA_FILE: &str = "block";
const META_DIR: &str = "meta";
const LOCK_FILE: &str = "lock";
const PARTITION: &str = "meta";
/// Deferred-write records (`D` keys) live in their own partition: they are large, short-lived
/// and deleted soon after being written, and must not add compaction work to the metadata tree.
const DEFERRED_PARTITION: &str = "deferred";
/// Largest object offset accepted (16 TiB): keeps unit arithmetic far from overflow.
const MAX_OBJECT_END: u64 = 1 << 44;

type Value = Arc<[u8]>;
/// Pending metadata: key -> (seq of the transaction that wrote it, value or deletion).
type Overlay = BTreeMap<Vec<u8>, (u64, Option<Value>)>;
/// Deferred unit contents not yet written back: punit -> (seq, content).
type PendingUnits = HashMap<u64, (u64, Arc<Vec<u8>>)>;
/// A sorted source of `(key, value-or-tombstone)` for `merge_sources`.
type KvSource<'a> = Box<dyn Iterator<Item = Result<(Vec<u8>, Option<Value>)>> + 'a>;

/// Alignment of buffers, offsets and lengths for O_DIRECT I/O on the data file.
const DIO_ALIGN: usize = 4096;

/// Reads of at most this many bytes go through the page cache (deferred write-back fills it
/// too): the kernel's cache is the store's data cache, outside the store's own memory budget
/// and reclaimed under pressure. Larger reads go straight to the device (`O_DIRECT`) unless
/// they are hot ([`HotReads`]). Also the largest read served in non-blocking mode
/// ([`nowait::READ_MAX`]).
const CACHED_READ_MAX: u64 = nowait::READ_MAX;

/// Where a read may take its data from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Via {
    /// The page cache for small reads, the device otherwise.
    Cache,
    /// Always the device: fsck and deep scrubs look for damaged blocks a cached copy hides.
    Device,
}

/// The current transaction's not-yet-published unit contents: deferred units and new-extent
/// writes (consulted by reads made while preparing it, e.g. read-modify-write and clone).
pub(crate) type Staged<'a> = (&'a BTreeMap<u64, Arc<Vec<u8>>>, &'a [CowWrite]);

static EMPTY_DEFERRED: BTreeMap<u64, Arc<Vec<u8>>> = BTreeMap::new();

/// Completion of a transaction's new-extent data writes, which its submitter performs after
/// releasing the apply lock (so several writes proceed in parallel); the committer waits for it
/// before flushing the data file and committing the metadata that points at the data.
/// Every waiter sees the one outcome, hence the shared error.
#[derive(Default)]
struct DataDone {
    state: Mutex<Option<std::result::Result<(), Arc<StoreError>>>>,
    cv: Condvar,
}

impl DataDone {
    fn finish(&self, r: std::result::Result<(), Arc<StoreError>>) {
        *lock(&self.state) = Some(r);
        self.cv.notify_all();
    }
    fn is_done(&self) -> bool {
        lock(&self.state).is_some()
    }
    fn wait(&self) -> std::result::Result<(), Arc<StoreError>> {
        let mut g = lock(&self.state);
        loop {
            if let Some(r) = &*g {
                return r.clone();
            }
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Data of new extents: the caller's buffer (written as it is when it is aligned for
/// `O_DIRECT`, copied to an aligned buffer otherwise), or an aligned copy made with its
/// checksums before the apply lock ([`PreCopied`]).
#[derive(Clone)]
pub(crate) enum CowData {
    Shared(Bytes),
    Aligned(Arc<AlignedBuf>),
}

impl CowData {
    fn bytes(&self) -> &[u8] {
        match self {
            CowData::Shared(v) => v,
            CowData::Aligned(b) => b,
        }
    }
}

/// New-extent data of a prepared transaction: `data[start..start + units * unit]` goes to
/// physical unit `punit`.
#[derive(Clone)]
pub(crate) struct CowWrite {
    punit: u64,
    units: u64,
    data: CowData,
    start: usize,
}

/// The whole units at the start of a large, unit-aligned write with one crc32c per checksum
/// block, computed before the apply lock is taken (keeps 4 MiB of crc out of the serialised
/// section). A caller's buffer that starts on a `DIO_ALIGN` boundary (the messenger aligns
/// large received payloads) is kept as it is and written straight from; any other is copied
/// to an aligned buffer in the same pass as the checksums (checksumming each block right after
/// copying it reads it from cache).
pub(crate) struct PreCopied {
    data: CowData,
    csums: Vec<u32>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Data-device geometry, from the superblock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    /// Allocation unit (min_alloc_size), bytes.
    pub unit: u64,
    pub csum_block: u64,
    /// Checksum blocks per unit.
    pub bpu: u64,
    /// Units on the device.
    pub units: u64,
}

impl Geometry {
    fn csums(&self, unit_data: &[u8]) -> Vec<u32> {
        unit_data
            .chunks(self.csum_block as usize)
            .map(kelp_types::crc32c)
            .collect()
    }
}

/// A run of newly written units: (first physical unit, units, one crc32c per checksum block).
pub(crate) type NewRun = (u64, u64, Vec<u32>);

struct ApplyState {
    next_seq: u64,
    next_nid: u64,
    /// Bytes of inline object data once every prepared transaction commits (persisted as
    /// `keys::INLINE_BYTES` in each transaction that changes it).
    inline_bytes: u64,
}

struct Prepared {
    seq: u64,
    mutations: Vec<(Vec<u8>, Option<Value>)>,
    allocated: Vec<(u64, u64)>,
    freed: Vec<(u64, u64)>,
    deferred: Vec<(u64, Arc<Vec<u8>>)>,
    wrote_data: bool,
    /// New extents written by the submitter: (punit, units, checksums).
    new_runs: Vec<NewRun>,
    data_done: Option<Arc<DataDone>>,
    bytes: u64,
    done: oneshot::Sender<Result<()>>,
    /// The records this transaction writes, decoded: they go into the onode cache when it
    /// is published, so the next write of a busy object finds its record there.
    onodes: Vec<(Vec<u8>, Arc<Onode>)>,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Prepared>,
    inflight_bytes: u64,
    durable_seq: u64,
    shutdown: bool,
    /// The committer is waiting on `queue_cv` (a submitter wakes it only then: std's condvar
    /// makes a futex system call on every notify, waiter or not, and a busy committer takes
    /// the next batch without one).
    committer_waiting: bool,
    /// Threads waiting on `durable_cv` (notified only when there are some).
    durable_waiters: usize,
}

pub(crate) struct Inner {
    pub dir: PathBuf,
    pub cfg: StoreConfig,
    pub geo: Geometry,
    pub sb: Superblock,
    pub data: File,
    /// The data file is open with O_DIRECT (all buffers and offsets aligned).
    direct: bool,
    /// The same file without O_DIRECT, for reads through the page cache.
    data_buffered: File,
    pub kv: Keyspace,
    pub meta: PartitionHandle,
    deferred_part: PartitionHandle,
    _lock: File,
    /// Metadata of transactions submitted but not yet durable: key -> (seq, value or deletion).
    overlay: RwLock<Overlay>,
    /// Unit contents of deferred writes not yet written back: punit -> (seq, content).
    pending_blocks: Mutex<PendingUnits>,
    /// New-extent data being written by submitters: start punit -> run (removed once written).
    inflight_cow: Mutex<BTreeMap<u64, CowWrite>>,
    /// Sizes of the two maps above, so the read hot path can skip their locks when both are
    /// empty. Entries are only added while `reuse` is held exclusively, so a reader holding it
    /// shared never misses one.
    pending_len: AtomicUsize,
    /// Freed extents of acknowledged batches that the committer has yet to release (after the
    /// batch's write-back); a transaction refused for lack of space waits for them.
    release_pending: AtomicUsize,
    inflight_len: AtomicUsize,
    /// Bytes of inline object data as published (readers' view), counted in `space`.
    inline_bytes: AtomicU64,
    onode_cache: OnodeCache,
    /// Keys of collections a transaction found to exist, so the next ones skip the lookup.
    /// Filled and emptied only under `apply` (transactions and publishing; removals also under
    /// `reuse` exclusively), so it never lists a collection whose removal was published, and a
    /// reader holding `reuse` shared may trust it too.
    known_colls: Mutex<HashSet<Vec<u8>>>,
    /// Read buffers for reuse; large reads lend theirs out as `Bytes` ([`BufPool`]).
    read_bufs: Arc<BufPool>,
    /// Recent large reads: which of them go through the page cache.
    hot_reads: HotReads,
    alloc: Mutex<Allocator>,
    /// The grower of a data file that grows (grow.rs), `None` for other files.
    grower: Option<Arc<Grower>>,
    /// Notified, with `alloc` held, when a growing data file's frontier moved or growing
    /// failed: transactions waiting for room below the frontier wait on it.
    grown: Condvar,
    apply: Mutex<ApplyState>,
    /// Readers hold it shared while they use an extent map; the committer (`release_and_ack`,
    /// `finish_batch`) holds it exclusively while it releases freed units and drops written-back
    /// deferred units from `pending_blocks`.
    reuse: RwLock<()>,
    queue: Mutex<Queue>,
    queue_cv: Condvar,
    durable_cv: Condvar,
    failed: Mutex<Option<String>>,
    /// Committed allocation state; owned by the committer while mounted.
    bitmap: Mutex<Option<Bitmap>>,
    /// The write-ahead log; owned by the committer while mounted.
    wal: Mutex<Option<Wal>>,
}

/// The durable object store. Dropping it (or [`KelpStore::close`]) waits for queued
/// transactions to commit.
pub struct KelpStore {
    pub(crate) inner: Arc<Inner>,
    committer: Mutex<Option<JoinHandle<()>>>,
    grower: Mutex<Option<JoinHandle<()>>>,
}

impl Inner {
    /// Largest object kept inline: `inline_max`, capped at half an allocation unit.
    fn inline_max(&self) -> u64 {
        self.cfg.inline_max.0.min(self.geo.unit / 2)
    }

    /// The verified inline data of `on` (which must have some).
    fn inline_data<'a>(&self, oid: &ObjectId, on: &'a Onode) -> Result<&'a [u8]> {
        let Some(i) = &on.inline else {
            return Ok(&[]);
        };
        i.verified().map_err(|actual| StoreError::ChecksumMismatch {
            object: oid.to_string(),
            offset: 0,
            expected: i.csum(),
            actual,
        })
    }

    /// Waits on `durable_cv` (at most `timeout`), counted in `durable_waiters` so that a
    /// finished batch notifies only when someone waits.
    fn wait_durable<'a>(
        &self,
        mut q: MutexGuard<'a, Queue>,
        timeout: Option<Duration>,
    ) -> MutexGuard<'a, Queue> {
        q.durable_waiters += 1;
        let mut q = match timeout {
            None => self.durable_cv.wait(q).unwrap_or_else(|p| p.into_inner()),
            Some(t) => {
                self.durable_cv
                    .wait_timeout(q, t)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
        };
        q.durable_waiters -= 1;
        q
    }

    /// Wakes the grower when the units left below a growing file's frontier run low.
    fn kick_grower_if_low(&self, a: &Allocator) {
        if let Some(g) = &self.grower
            && g.low(a.usable_units(), a.growable_units())
        {
            g.kick(0);
        }
    }

    fn check_failed(&self) -> Result<()> {
        match &*lock(&self.failed) {
            Some(reason) => Err(StoreError::Failed {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn kv_get(&self, key: &[u8]) -> Result<Option<Value>> {
        self.meta
            .get(key)
            .map(|v| v.map(|s| Value::from(&s[..])))
            .map_err(|e| StoreError::kv("reading metadata", e))
    }

    /// `reuse` held shared, as readers hold it; in non-blocking mode only if it is free now
    /// (a publishing committer holds it exclusively for a moment).
    fn reuse_shared(&self) -> Result<std::sync::RwLockReadGuard<'_, ()>> {
        if nowait::active() {
            return match self.reuse.try_read() {
                Ok(g) => Ok(g),
                Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => Err(nowait::blocked()),
            };
        }
        Ok(self.reuse.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Committed-or-pending value of `key` (readers' view).
    fn get(&self, key: &[u8]) -> Result<Option<Value>> {
        {
            let ov = self.overlay.read().unwrap_or_else(|p| p.into_inner());
            if let Some((_, v)) = ov.get(key) {
                return Ok(v.clone());
            }
        }
        self.kv_get(key)
    }

    /// Keys in `[start, end)`, merged view of `staged` (if any), the overlay and the database.
    fn scan(
        &self,
        staged: Option<&BTreeMap<Vec<u8>, Option<Value>>>,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Value)>> {
        if start >= end {
            return Ok(Vec::new());
        }
        if nowait::active() {
            // A range scan may read many table blocks: never on an async worker.
            return Err(nowait::blocked());
        }
        let range = (
            std::ops::Bound::Included(start.to_vec()),
            std::ops::Bound::Excluded(end.to_vec()),
        );
        let mut sources: Vec<KvSource<'static>> = Vec::new();
        if let Some(st) = staged {
            let v: Vec<_> = st
                .range(range.clone())
                .map(|(k, v)| Ok((k.clone(), v.clone())))
                .collect();
            sources.push(Box::new(v.into_iter()));
        }
        // Overlay before the database iterator: see the module docs (a key missing from the
        // overlay snapshot is already in the database).
        let ov: Vec<_> = self
            .overlay
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .range(range)
            .map(|(k, (_, v))| Ok((k.clone(), v.clone())))
            .collect();
        sources.push(Box::new(ov.into_iter()));
        let kv = self.meta.range(start.to_vec()..end.to_vec()).map(|r| {
            r.map(|(k, v)| (k.to_vec(), Some(Value::from(&v[..]))))
                .map_err(|e| StoreError::kv("scanning metadata", e))
        });
        sources.push(Box::new(kv));
        merge_sources(sources, limit)
    }

    /// Read `buf.len()` bytes at `off`: through the page cache if `cached`, else directly
    /// from the device. In non-blocking mode ([`nowait`]) only what the page cache holds, with
    /// `RWF_NOWAIT`: a miss, a partly cached range or any error is "would block", and the
    /// caller retries on a thread that may wait.
    fn read_raw(&self, off: u64, buf: &mut [u8], cached: bool) -> Result<()> {
        if nowait::active() {
            return if self.read_cached_only(off, buf) {
                Ok(())
            } else {
                Err(nowait::blocked())
            };
        }
        let file = if cached {
            &self.data_buffered
        } else {
            &self.data
        };
        file.read_exact_at(buf, off)
            .map_err(|e| StoreError::io(format!("reading the data file at {off}"), e))
    }

    /// Fill `buf` from the page cache only (`RWF_NOWAIT`): false if any of it is not cached
    /// (the caller then reads the device).
    fn read_cached_only(&self, off: u64, buf: &mut [u8]) -> bool {
        let mut done = 0;
        while done < buf.len() {
            match rustix::io::preadv2(
                &self.data_buffered,
                &mut [std::io::IoSliceMut::new(&mut buf[done..])],
                off + done as u64,
                rustix::io::ReadWriteFlags::NOWAIT,
            ) {
                Ok(n) if n > 0 => done += n,
                _ => return false,
            }
        }
        true
    }

    /// Deferred write-back of one run of units (durable at the next data-file flush).
    /// `direct`: straight to the device (`O_DIRECT`; Linux invalidates cached pages of the
    /// range, so cached small reads stay coherent), else through the page cache (Linux writes
    /// dirty pages of a range back before an `O_DIRECT` access to it). See [`WRITEBACK_DIRECT_RUNS`].
    fn writeback(&self, data: &[u8], off: u64, direct: bool) -> Result<()> {
        if direct {
            return self.dev_write(data, off);
        }
        self.data_buffered
            .write_all_at(data, off)
            .map_err(|e| StoreError::io(format!("writing back deferred data at {off}"), e))
    }

    /// Write whole units at `off` (copied to an aligned buffer when O_DIRECT needs it).
    fn dev_write(&self, data: &[u8], off: u64) -> Result<()> {
        let r = if self.direct && data.as_ptr().align_offset(DIO_ALIGN) != 0 {
            self.data.write_all_at(&AlignedBuf::copy_of(data), off)
        } else {
            self.data.write_all_at(data, off)
        };
        r.map_err(|e| StoreError::io(format!("writing the data file at {off}"), e))
    }

    /// A read of `[off, off+len)` that lies inside one extent, as `Bytes` over the read
    /// buffer itself (it returns to the pool when the last `Bytes` is dropped); `None` if the
    /// range spans extents or holes (the caller assembles it with [`Inner::read_onode`]).
    fn read_in_extent(
        &self,
        oid: &ObjectId,
        on: &Onode,
        off: u64,
        len: u64,
    ) -> Result<Option<bytes::Bytes>> {
        let u = self.geo.unit;
        let first = off / u;
        let last = (off + len).div_ceil(u);
        let i0 = on.extents.partition_point(|e| e.lunit + e.units <= first);
        let Some(e) = on.extents.get(i0) else {
            return Ok(None);
        };
        if len == 0 || e.lunit > first || e.lunit + e.units < last {
            return Ok(None);
        }
        let data = self.read_extent_units(oid, e, first, last, None, Via::Cache)?;
        let at = (off - first * u) as usize;
        let owner = PooledBuf {
            buf: Some(data),
            pool: Arc::downgrade(&self.read_bufs),
        };
        Ok(Some(
            bytes::Bytes::from_owner(owner).slice(at..at + len as usize),
        ))
    }

    /// Logical units `[s, t)` of object `oid`, all inside extent `e`, read and verified.
    fn read_extent_units(
        &self,
        oid: &ObjectId,
        e: &Extent,
        s: u64,
        t: u64,
        staged: Option<Staged<'_>>,
        via: Via,
    ) -> Result<AlignedBuf> {
        let k = s - e.lunit;
        let bpu = self.geo.bpu;
        let csums = &e.csums[(k * bpu) as usize..((t - e.lunit) * bpu) as usize];
        self.read_units_via(oid, s, e.punit + k, t - s, csums, staged, via)
    }

    /// Read `units` physical units starting at `punit` and verify them against `csums`
    /// (one per checksum block). `staged` overrides (current transaction's deferred units) and
    /// `pending_blocks` take precedence over the device. `lunit` only names the error offset.
    ///
    /// Reads of at most [`CACHED_READ_MAX`], and larger reads of hot ranges ([`HotReads`]),
    /// go through the page cache (which they fill on a miss); a checksum mismatch
    /// there is read again from the device before it is reported, so a stale cached page can
    /// never pass for corruption.
    pub(crate) fn read_units(
        &self,
        oid: &ObjectId,
        lunit: u64,
        punit: u64,
        units: u64,
        csums: &[u32],
        staged: Option<Staged<'_>>,
    ) -> Result<AlignedBuf> {
        self.read_units_via(oid, lunit, punit, units, csums, staged, Via::Cache)
    }

    /// [`Inner::read_units`], choosing whether the read may come from the page cache.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_units_via(
        &self,
        oid: &ObjectId,
        lunit: u64,
        punit: u64,
        units: u64,
        csums: &[u32],
        staged: Option<Staged<'_>>,
        via: Via,
    ) -> Result<AlignedBuf> {
        let u = self.geo.unit as usize;
        let bytes = units * self.geo.unit;
        let small = bytes <= CACHED_READ_MAX;
        if nowait::active() && (via == Via::Device || !small) {
            return Err(nowait::blocked());
        }
        let plan = match via {
            Via::Device => Plan::Direct,
            Via::Cache if small => Plan::Fill,
            Via::Cache => self.hot_reads.plan(punit, units, bytes),
        };
        let off = punit * self.geo.unit;
        let mut buf = self.read_bufs.take(units as usize * u);
        // Whether the bytes came through the page cache (then a mismatch is re-read directly).
        let cached = match plan {
            Plan::Direct => {
                self.read_raw(off, &mut buf, false)?;
                false
            }
            Plan::Fill => {
                self.read_raw(off, &mut buf, true)?;
                true
            }
            Plan::Cached if self.read_cached_only(off, &mut buf) => true,
            Plan::Cached => {
                self.hot_reads.missed(punit, units);
                self.read_raw(off, &mut buf, false)?;
                false
            }
        };
        self.apply_unwritten(punit, &mut buf, staged);
        match self.verify_units(oid, lunit, &buf, csums) {
            Ok(()) => Ok(buf),
            // Possibly a stale page-cache copy: only the direct read may call it corrupt.
            Err(_) if nowait::active() => Err(nowait::blocked()),
            Err(_) if cached && self.direct => {
                self.read_raw(off, &mut buf, false)?;
                self.apply_unwritten(punit, &mut buf, staged);
                self.verify_units(oid, lunit, &buf, csums).map(|()| buf)
            }
            Err(e) => Err(e),
        }
    }

    /// Overwrite the units of `buf` (starting at `punit`) whose newest content is not on the
    /// device yet. Newest first: this transaction's deferred units, then deferred units of
    /// prepared transactions, then new-extent data still being written.
    fn apply_unwritten(&self, punit: u64, buf: &mut [u8], staged: Option<Staged<'_>>) {
        let u = self.geo.unit as usize;
        let units = (buf.len() / u) as u64;
        let (st_def, st_cow) = staged.unwrap_or((&EMPTY_DEFERRED, &[]));
        if self.pending_len.load(Ordering::Acquire) == 0
            && self.inflight_len.load(Ordering::Acquire) == 0
            && st_def.is_empty()
            && st_cow.is_empty()
        {
            return;
        }
        let pending = lock(&self.pending_blocks);
        let cow = lock(&self.inflight_cow);
        if pending.is_empty() && cow.is_empty() && st_def.is_empty() && st_cow.is_empty() {
            return;
        }
        let from_cow = |w: &CowWrite, p: u64| -> Option<Vec<u8>> {
            (p >= w.punit && p < w.punit + w.units).then(|| {
                let at = w.start + ((p - w.punit) as usize) * u;
                w.data.bytes()[at..at + u].to_vec()
            })
        };
        for i in 0..units {
            let p = punit + i;
            let found = st_def
                .get(&p)
                .map(|d| d.to_vec())
                .or_else(|| st_cow.iter().rev().find_map(|w| from_cow(w, p)))
                .or_else(|| pending.get(&p).map(|(_, d)| d.to_vec()))
                .or_else(|| {
                    cow.range(..=p)
                        .next_back()
                        .and_then(|(_, w)| from_cow(w, p))
                });
            if let Some(d) = found {
                buf[i as usize * u..(i as usize + 1) * u].copy_from_slice(&d);
            }
        }
    }

    /// Check `buf` (units from logical unit `lunit` on) against `csums`.
    fn verify_units(&self, oid: &ObjectId, lunit: u64, buf: &[u8], csums: &[u32]) -> Result<()> {
        let cb = self.geo.csum_block as usize;
        for (i, (block, &expected)) in buf.chunks(cb).zip(csums).enumerate() {
            let actual = kelp_types::crc32c(block);
            if actual != expected {
                return Err(StoreError::ChecksumMismatch {
                    object: oid.to_string(),
                    offset: lunit * self.geo.unit + (i * cb) as u64,
                    expected,
                    actual,
                });
            }
        }
        Ok(())
    }

    fn onode_for_read(&self, coll: CollectionId, oid: &ObjectId) -> Result<Onode> {
        match self.get(&keys::obj_key(coll, oid))? {
            Some(v) => self.decode_onode(&v),
            None => Err(self.absent(coll, oid)?),
        }
    }

    /// Decode a record as published (overlay, then database), checksum shards included. The
    /// caller holds `reuse` shared, so the record and its shards are of one transaction.
    fn decode_onode(&self, raw: &[u8]) -> Result<Onode> {
        Onode::decode_with(raw, self.geo.bpu, |nid, i| {
            self.get(&keys::csum_shard_key(nid, i))
        })
    }

    /// The error for an object that is not there: its collection's, if that is missing too.
    fn absent(&self, coll: CollectionId, oid: &ObjectId) -> Result<StoreError> {
        let key = keys::coll_key(coll);
        let known = lock(&self.known_colls).contains(&key);
        Ok(if !known && self.get(&key)?.is_none() {
            StoreError::CollectionNotFound { coll }
        } else {
            StoreError::ObjectNotFound {
                coll,
                object: oid.clone(),
            }
        })
    }

    /// `onode_cached` for callers that read no extents (omap reads): takes `reuse` itself.
    fn onode_locked(&self, coll: CollectionId, oid: &ObjectId) -> Result<Arc<Onode>> {
        let _g = self.reuse_shared()?;
        self.onode_cached(coll, oid)
    }

    /// Like `onode_for_read`, through the onode cache. The caller must hold `reuse` shared.
    fn onode_cached(&self, coll: CollectionId, oid: &ObjectId) -> Result<Arc<Onode>> {
        let key = keys::obj_key(coll, oid);
        match self.onode_cache.get(&key) {
            Some(Some(o)) => return Ok(o),
            Some(None) => return Err(self.absent(coll, oid)?),
            None => {}
        }
        let pending = {
            let ov = self.overlay.read().unwrap_or_else(|p| p.into_inner());
            ov.get(&key).map(|(_, v)| v.clone())
        };
        match pending {
            Some(Some(v)) => Ok(Arc::new(self.decode_onode(&v)?)),
            Some(None) => self.onode_for_read(coll, oid).map(Arc::new),
            None => match self
                .meta
                .get(&key)
                .map_err(|e| StoreError::kv("reading metadata", e))?
            {
                Some(v) => {
                    let on = Arc::new(self.decode_onode(&v)?);
                    self.onode_cache.insert(key, Some(on.clone()));
                    Ok(on)
                }
                // Neither pending nor committed (a write's stat of a new object): only the
                // collection is left to look up.
                None => {
                    self.onode_cache.insert(key, None);
                    Err(self.absent(coll, oid)?)
                }
            },
        }
    }

    /// Bytes `[off, off+len)` of an object (already clipped to its size).
    fn read_onode(
        &self,
        oid: &ObjectId,
        on: &Onode,
        off: u64,
        len: u64,
        staged: Option<Staged<'_>>,
        via: Via,
    ) -> Result<Vec<u8>> {
        if on.inline.is_some() {
            // The whole (small) content is in the record: verified as a whole.
            let data = self.inline_data(oid, on)?;
            let s = (off as usize).min(data.len());
            let mut out = data[s..(s + len as usize).min(data.len())].to_vec();
            out.resize(len as usize, 0);
            return Ok(out);
        }
        // Filled in order, zeros only where no extent is (holes, or past the last extent).
        let mut out = Vec::with_capacity(len as usize);
        if len == 0 {
            return Ok(out);
        }
        let u = self.geo.unit;
        let first = off / u;
        let last = (off + len).div_ceil(u);
        let i0 = on.extents.partition_point(|e| e.lunit + e.units <= first);
        for e in &on.extents[i0..] {
            if e.lunit >= last {
                break;
            }
            let s = e.lunit.max(first);
            let t = (e.lunit + e.units).min(last);
            let data = self.read_extent_units(oid, e, s, t, staged, via)?;
            // Append the overlap of [s*u, t*u) and [off, off+len).
            let a = (s * u).max(off);
            let b = (t * u).min(off + len);
            let at = (a - off) as usize;
            let src = &data[(a - s * u) as usize..(b - s * u) as usize];
            if out.len() <= at {
                out.resize(at, 0);
                out.extend_from_slice(src);
            } else {
                // Extents never overlap; if they did, the later one wins, as before.
                let end = at + src.len();
                if out.len() < end {
                    out.resize(end, 0);
                }
                out[at..end].copy_from_slice(src);
            }
            self.read_bufs.keep(data);
        }
        out.resize(len as usize, 0);
        Ok(out)
    }
}

/// `[offset, offset+len)` clipped to the object's size, as (start, length).
fn clip(on: &Onode, offset: u64, len: u64) -> (u64, u64) {
    let start = offset.min(on.size);
    (start, offset.saturating_add(len).min(on.size) - start)
}

impl KelpStore {
    /// Checksums, and aligned copies where needed, of the large unit-aligned writes of `txn`
    /// (see [`PreCopied`]), one entry per operation.
    /// Whether a write of `txn` is large enough to go to new extents (not deferred): its data
    /// is written by the submitter, waiting for the device (see `prepare` and `precopy`).
    fn writes_new_extents(&self, txn: &Transaction) -> bool {
        let geo = self.inner.geo;
        let min = self.inner.cfg.prefer_deferred_size.0.max(geo.unit);
        txn.ops
            .iter()
            .any(|op| matches!(op, Op::Write { data, .. } if data.len() as u64 > min))
    }

    fn precopy(&self, txn: &Transaction) -> Vec<Option<PreCopied>> {
        let geo = self.inner.geo;
        let min = self.inner.cfg.prefer_deferred_size.0.max(geo.unit);
        txn.ops
            .iter()
            .map(|op| match op {
                Op::Write { offset, data, .. }
                    if offset % geo.unit == 0 && data.len() as u64 > min =>
                {
                    let full = (data.len() as u64 / geo.unit * geo.unit) as usize;
                    if data.as_ptr().align_offset(DIO_ALIGN) == 0 {
                        let data = data.slice(..full);
                        return Some(PreCopied {
                            csums: geo.csums(&data),
                            data: CowData::Shared(data),
                        });
                    }
                    let (buf, csums) =
                        AlignedBuf::copy_with_csums(&data[..full], geo.csum_block as usize);
                    Some(PreCopied {
                        data: CowData::Aligned(Arc::new(buf)),
                        csums,
                    })
                }
                _ => None,
            })
            .collect()
    }

    fn prepare(
        &self,
        st: &mut ApplyState,
        txn: Transaction,
        pre: Vec<Option<PreCopied>>,
    ) -> Result<(Prepared, Vec<CowWrite>)> {
        let inner = &*self.inner;
        let mut txc = Txc::new(inner, st.next_nid);
        let applied = {
            let _g = inner.reuse_shared()?;
            let mut pre = pre.into_iter();
            txn.ops.into_iter().try_for_each(|op| {
                txc.pre = pre.next().flatten();
                txc.apply(op)
            })
        };
        // Inline data takes no allocation unit, but it is data: a full store refuses it too
        // (metadata-only transactions still pass).
        let applied = applied.and_then(|()| {
            let grow = u64::try_from(txc.inline_delta).unwrap_or(0);
            let free = lock(&inner.alloc).free_units() * inner.geo.unit;
            match free.checked_sub(st.inline_bytes) {
                Some(room) if room >= grow => Ok(()),
                _ if grow == 0 => Ok(()),
                room => Err(StoreError::NoSpace {
                    needed: grow,
                    free: room.unwrap_or(0),
                }),
            }
        });
        if let Err(e) = applied {
            let mut a = lock(&inner.alloc);
            for &(off, len) in &txc.allocated {
                a.release(off, len);
            }
            return Err(e);
        }
        if txc.nid_used {
            st.next_nid = txc.next_nid;
            txc.put(
                keys::NEXT_NID.to_vec(),
                Some(txc.next_nid.to_be_bytes().to_vec()),
            );
        }
        if txc.inline_delta != 0 {
            st.inline_bytes = st.inline_bytes.saturating_add_signed(txc.inline_delta);
            txc.put(
                keys::INLINE_BYTES.to_vec(),
                Some(st.inline_bytes.to_be_bytes().to_vec()),
            );
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let (done, _) = oneshot::channel();
        let cow = std::mem::take(&mut txc.cow);
        Ok((
            Prepared {
                seq,
                mutations: txc.staged.into_iter().collect(),
                allocated: txc.allocated,
                freed: txc.freed,
                deferred: txc.deferred.into_iter().collect(),
                wrote_data: !cow.is_empty(),
                new_runs: txc.new_runs,
                data_done: None,
                bytes: txc.bytes + 256,
                done,
                onodes: txc.saved.into_iter().collect(),
            },
            cow,
        ))
    }
}

impl ObjectStore for KelpStore {
    fn submit(&self, txn: Transaction) -> Result<Commit> {
        let inner = &*self.inner;
        // Non-blocking mode (`nowait`): only a transaction that needs no device I/O and no
        // waiting (deferred writes, metadata) is accepted, and every refusal comes before
        // anything is applied, so the caller can submit it again on a blocking thread.
        let nowait = nowait::active();
        if nowait && (nowait::has_blocked() || self.writes_new_extents(&txn)) {
            return Err(nowait::blocked());
        }
        inner.check_failed()?;
        let pre = self.precopy(&txn);
        let mut st = if nowait {
            match inner.apply.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return Err(nowait::blocked()),
            }
        } else {
            lock(&inner.apply)
        };
        // Throttle: bound memory held by transactions that are prepared but not durable.
        {
            let mut q = lock(&inner.queue);
            while q.inflight_bytes > inner.cfg.inflight_bytes() && q.durable_seq + 1 < st.next_seq {
                if nowait {
                    return Err(nowait::blocked());
                }
                q = inner.wait_durable(q, None);
                if lock(&inner.failed).is_some() {
                    break;
                }
            }
        }
        inner.check_failed()?;
        let nid_before = st.next_nid;
        let inline_before = st.inline_bytes;
        // Units freed by acknowledged batches may still wait for their batch's write-back (see
        // `release_and_ack`): a transaction refused for lack of space then waits until every
        // earlier batch is finished and tries once more, so space that a delete acknowledged
        // freed is always there for the next transaction.
        let waiting_release = inner.release_pending.load(Ordering::Acquire) > 0;
        let retry = (waiting_release && !nowait).then(|| txn.clone());
        let (mut p, cow) = match self.prepare(&mut st, txn, pre) {
            Err(StoreError::NoSpace { .. }) if waiting_release && nowait => {
                return Err(nowait::blocked());
            }
            Err(StoreError::NoSpace { .. }) if retry.is_some() => {
                {
                    let mut q = lock(&inner.queue);
                    while q.durable_seq + 1 < st.next_seq {
                        inner.check_failed()?;
                        q = inner.wait_durable(q, None);
                    }
                }
                inner.check_failed()?;
                let txn = retry.unwrap_or_default();
                let pre = self.precopy(&txn);
                self.prepare(&mut st, txn, pre)?
            }
            r => r?,
        };
        let (tx, commit) = Commit::pending();
        p.done = tx;
        let data_done = (!cow.is_empty()).then(|| Arc::new(DataDone::default()));
        p.data_done = data_done.clone();
        {
            // Publish metadata, deferred unit contents and in-flight new-extent data together:
            // a reader (holding `reuse` shared) sees all or none of them, so checksums and
            // contents always match.
            let _g = if nowait {
                // Publish only if nothing in the attempt needed to block (a caller's result is
                // then kept) and no reader is in (a blocking one may be waiting for the
                // device); else undo the preparation, which nobody has seen (`apply` is held
                // throughout).
                let guard = match inner.reuse.try_write() {
                    Ok(g) if !nowait::has_blocked() => Some(g),
                    Err(std::sync::TryLockError::Poisoned(p)) if !nowait::has_blocked() => {
                        Some(p.into_inner())
                    }
                    _ => None,
                };
                match guard {
                    Some(g) => g,
                    None => {
                        let mut a = lock(&inner.alloc);
                        for &(off, len) in &p.allocated {
                            a.release(off, len);
                        }
                        st.next_seq = p.seq;
                        st.next_nid = nid_before;
                        st.inline_bytes = inline_before;
                        return Err(nowait::blocked());
                    }
                }
            } else {
                inner.reuse.write().unwrap_or_else(|p| p.into_inner())
            };
            let mut pending = lock(&inner.pending_blocks);
            for (punit, d) in &p.deferred {
                pending.insert(*punit, (p.seq, d.clone()));
            }
            inner.pending_len.store(pending.len(), Ordering::Release);
            let mut inflight = lock(&inner.inflight_cow);
            for w in &cow {
                inflight.insert(w.punit, w.clone());
            }
            inner.inflight_len.store(inflight.len(), Ordering::Release);
            let mut ov = inner.overlay.write().unwrap_or_else(|p| p.into_inner());
            for (k, v) in &p.mutations {
                if k.first() == Some(&keys::OBJ) {
                    inner.onode_cache.invalidate(k);
                } else if k.first() == Some(&keys::COLL) && v.is_none() {
                    lock(&inner.known_colls).remove(k);
                }
                ov.insert(k.clone(), (p.seq, v.clone()));
            }
            // The newest published records (as `invalidate` above leaves none older).
            for (k, on) in std::mem::take(&mut p.onodes) {
                inner.onode_cache.insert(k, Some(on));
            }
            inner.inline_bytes.store(st.inline_bytes, Ordering::Release);
        }
        let wake = {
            let mut q = lock(&inner.queue);
            q.inflight_bytes += p.bytes;
            q.items.push_back(p);
            q.committer_waiting
        };
        if wake {
            inner.queue_cv.notify_one();
        }
        drop(st);
        // New-extent data is written outside the apply lock, so the writes of concurrent
        // submitters overlap; the committer waits for `data_done` before committing.
        if let Some(dd) = data_done {
            let u = inner.geo.unit as usize;
            let mut result = Ok(());
            for w in &cow {
                let part = &w.data.bytes()[w.start..w.start + w.units as usize * u];
                if let Err(e) = inner.dev_write(part, w.punit * inner.geo.unit) {
                    result = Err(Arc::new(e));
                    break;
                }
            }
            if result.is_ok() {
                let mut inflight = lock(&inner.inflight_cow);
                for w in &cow {
                    inflight.remove(&w.punit);
                }
                inner.inflight_len.store(inflight.len(), Ordering::Release);
            }
            dd.finish(result);
        }
        Ok(commit)
    }

    fn stats(&self) -> crate::store::StoreStats {
        let (hits, misses, entries, bytes, capacity) = self.inner.onode_cache.stats();
        let unit = self.inner.geo.unit;
        let alloc = lock(&self.inner.alloc);
        let (extents, largest) = alloc.fragments();
        let free = alloc.usable_units();
        drop(alloc);
        crate::store::StoreStats {
            onode_cache_hits: hits,
            onode_cache_misses: misses,
            onode_cache_entries: entries,
            onode_cache_bytes: bytes,
            onode_cache_capacity_bytes: capacity,
            free_extents: extents,
            largest_free_extent_bytes: largest * unit,
            free_extent_bytes: free * unit,
        }
    }

    fn space(&self) -> Result<StoreSpace> {
        let geo = self.inner.geo;
        let free = lock(&self.inner.alloc).free_units();
        let total = geo.units * geo.unit;
        // Inline object data lives in the metadata database, but it is object data: counted
        // as used, so that usage and `kelp df` reflect what small objects hold.
        let inline = self.inner.inline_bytes.load(Ordering::Acquire);
        let available = (free * geo.unit).saturating_sub(inline).min(total);
        Ok(StoreSpace {
            total,
            used: total - available,
            available,
        })
    }

    fn flush(&self) -> Result<()> {
        let inner = &*self.inner;
        let target = lock(&inner.apply).next_seq - 1;
        let mut q = lock(&inner.queue);
        while q.durable_seq < target {
            if lock(&inner.failed).is_some() {
                break;
            }
            q = inner.wait_durable(q, Some(Duration::from_millis(100)));
        }
        drop(q);
        inner.check_failed()
    }

    fn list_collections(&self) -> Result<Vec<CollectionId>> {
        let p = [keys::COLL];
        self.inner
            .scan(None, &p, &keys::prefix_end(&p), usize::MAX)?
            .into_iter()
            .map(|(k, _)| keys::decode_coll_key(&k))
            .collect()
    }

    fn collection_exists(&self, coll: CollectionId) -> Result<bool> {
        Ok(self.inner.get(&keys::coll_key(coll))?.is_some())
    }

    fn list_objects(
        &self,
        coll: CollectionId,
        start: Option<&ObjectId>,
        max: usize,
    ) -> Result<ListPage> {
        if !self.collection_exists(coll)? {
            return Err(StoreError::CollectionNotFound { coll });
        }
        let p = keys::obj_prefix(coll);
        let from = match start {
            Some(o) => keys::obj_key(coll, o),
            None => p.clone(),
        };
        let mut got = self
            .inner
            .scan(None, &from, &keys::prefix_end(&p), max.saturating_add(1))?;
        let next = if got.len() > max {
            got.pop()
                .map(|(k, _)| keys::decode_obj_key(&k).map(|x| x.1))
                .transpose()?
        } else {
            None
        };
        let objects = got
            .into_iter()
            .map(|(k, _)| keys::decode_obj_key(&k).map(|x| x.1))
            .collect::<Result<Vec<_>>>()?;
        Ok(ListPage { objects, next })
    }

    fn stat(&self, coll: CollectionId, oid: &ObjectId) -> Result<ObjectStat> {
        let _g = self.inner.reuse_shared()?;
        let on = self.inner.onode_cached(coll, oid)?;
        Ok(ObjectStat { size: on.size })
    }

    fn read(&self, coll: CollectionId, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>> {
        let _g = self.inner.reuse_shared()?;
        let on = self.inner.onode_cached(coll, oid)?;
        let (start, len) = clip(&on, offset, len);
        self.inner
            .read_onode(oid, &on, start, len, None, Via::Cache)
    }

    fn read_from_device(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        let _g = self.inner.reuse_shared()?;
        let on = self.inner.onode_cached(coll, oid)?;
        let (start, len) = clip(&on, offset, len);
        self.inner
            .read_onode(oid, &on, start, len, None, Via::Device)
    }

    fn read_bytes(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<bytes::Bytes> {
        /// Below this a copy costs less than lending the buffer out.
        const LEND_MIN: u64 = 64 << 10;
        let _g = self.inner.reuse_shared()?;
        let on = self.inner.onode_cached(coll, oid)?;
        let (start, len) = clip(&on, offset, len);
        if len >= LEND_MIN
            && let Some(b) = self.inner.read_in_extent(oid, &on, start, len)?
        {
            return Ok(b);
        }
        self.inner
            .read_onode(oid, &on, start, len, None, Via::Cache)
            .map(bytes::Bytes::from)
    }

    fn xattrs(&self, coll: CollectionId, oid: &ObjectId) -> Result<BTreeMap<String, Vec<u8>>> {
        // Through the onode cache, like `read`: a client read op asks for the xattrs (version)
        // and then the data, and the uncached lookup was ~8% of a 4 KiB-read OSD's CPU.
        let _g = self.inner.reuse_shared()?;
        Ok(self.inner.onode_cached(coll, oid)?.xattrs.to_map())
    }

    fn omap_header(&self, coll: CollectionId, oid: &ObjectId) -> Result<Option<Vec<u8>>> {
        let on = self.inner.onode_locked(coll, oid)?;
        if !on.has_omap {
            return Ok(None);
        }
        Ok(self
            .inner
            .get(&keys::omap_header_key(on.nid))?
            .map(|v| v.to_vec()))
    }

    fn omap_get(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
        keys_wanted: &[Vec<u8>],
    ) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
        let on = self.inner.onode_locked(coll, oid)?;
        let mut out = BTreeMap::new();
        if !on.has_omap {
            return Ok(out);
        }
        for k in keys_wanted {
            if let Some(v) = self.inner.get(&keys::omap_key(on.nid, k))? {
                out.insert(k.clone(), v.to_vec());
            }
        }
        Ok(out)
    }

    fn omap_iter(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<OmapPage> {
        let on = self.inner.onode_locked(coll, oid)?;
        if !on.has_omap {
            return Ok(OmapPage {
                entries: Vec::new(),
                more: false,
            });
        }
        let p = keys::omap_entries_prefix(on.nid);
        let from = match after {
            Some(a) => {
                let mut k = keys::omap_key(on.nid, a);
                k.push(0); // smallest key strictly after `a`
                k
            }
            None => p.clone(),
        };
        let mut got = self
            .inner
            .scan(None, &from, &keys::prefix_end(&p), max.saturating_add(1))?;
        let more = got.len() > max;
        got.truncate(max);
        Ok(OmapPage {
            entries: got
                .into_iter()
                .map(|(k, v)| (k[p.len()..].to_vec(), v.to_vec()))
                .collect(),
            more,
        })
    }
}
