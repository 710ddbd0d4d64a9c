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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
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
/// they are hot ([`HotReads`]).
const CACHED_READ_MAX: u64 = 64 << 10;

/// Where a read may take its data from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Via {
    /// The page cache for small reads, the device otherwise.
    Cache,
    /// Always the device: fsck and deep scrubs look for damaged blocks a cached copy hides.
    Device,
}

/// A heap buffer whose usable part starts at a `DIO_ALIGN`-aligned address (O_DIRECT needs
/// aligned memory). Built from a `Vec` with slack, so no `unsafe` is needed.
pub(crate) struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Self {
        let raw = vec![0u8; len + DIO_ALIGN];
        let start = raw.as_ptr().align_offset(DIO_ALIGN);
        AlignedBuf { raw, start, len }
    }
    /// An aligned copy of `data` and the crc32c of every `block` bytes of it.
    pub fn copy_with_csums(data: &[u8], block: usize) -> (Self, Vec<u32>) {
        let mut raw: Vec<u8> = Vec::with_capacity(data.len() + DIO_ALIGN);
        let start = raw.as_ptr().align_offset(DIO_ALIGN);
        raw.resize(start, 0);
        let mut csums = Vec::with_capacity(data.len().div_ceil(block.max(1)));
        for chunk in data.chunks(block.max(1)) {
            let at = raw.len();
            raw.extend_from_slice(chunk);
            csums.push(kelp_types::crc32c(&raw[at..]));
        }
        let len = data.len();
        (AlignedBuf { raw, start, len }, csums)
    }
    pub fn copy_of(data: &[u8]) -> Self {
        Self::from_parts(&[data], data.len())
    }
    /// `parts` one after the other, then zeros up to `len` bytes; the copied part is not
    /// zeroed first (a 4 MiB write's bounce copy was 9% of its CPU profile in `memset`).
    pub fn from_parts(parts: &[&[u8]], len: usize) -> Self {
        let mut raw: Vec<u8> = Vec::with_capacity(len + DIO_ALIGN);
        let start = raw.as_ptr().align_offset(DIO_ALIGN);
        raw.resize(start, 0);
        for p in parts {
            raw.extend_from_slice(p);
        }
        raw.resize(start + len, 0);
        AlignedBuf { raw, start, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

const ONODE_CACHE_SHARDS: usize = 8;

/// Decoded object records of committed objects, so hot reads skip the database lookup and the
/// decode (a 4 MiB object's record carries 1024 checksums), and objects known to be absent
/// (`None`: a write to a new object looks it up twice, once to execute the op and once to
/// prepare the transaction). Filled only by readers holding `reuse` shared, from committed
/// values (never from the overlay); entries are dropped when a transaction touching them is
/// published (under `reuse` exclusively), so it never serves a stale record. Bounded in bytes;
/// when full, an arbitrary quarter is evicted.
#[derive(Default)]
struct OnodeCacheShard {
    map: HashMap<Vec<u8>, (Option<Arc<Onode>>, usize)>,
    bytes: usize,
}

struct OnodeCache {
    shards: Vec<Mutex<OnodeCacheShard>>,
    shard_cap: usize,
}

impl OnodeCache {
    fn new(bytes: u64) -> Self {
        OnodeCache {
            shards: (0..ONODE_CACHE_SHARDS)
                .map(|_| Mutex::new(OnodeCacheShard::default()))
                .collect(),
            shard_cap: (bytes as usize) / ONODE_CACHE_SHARDS,
        }
    }
    fn shard(&self, key: &[u8]) -> &Mutex<OnodeCacheShard> {
        &self.shards[kelp_types::crc32c(key) as usize % ONODE_CACHE_SHARDS]
    }
    /// `Some(None)`: known to be absent.
    fn get(&self, key: &[u8]) -> Option<Option<Arc<Onode>>> {
        lock(self.shard(key)).map.get(key).map(|(o, _)| o.clone())
    }
    /// Charged at the heap it holds (decoded record, key, table slot), not the encoded size:
    /// a decoded record is several times its encoding, and charging the encoding let the
    /// cache hold ~3x its budget (50 MiB for a 16 MiB budget, in a heap profile of an OSD).
    fn insert(&self, key: Vec<u8>, onode: Option<Arc<Onode>>) {
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
    fn invalidate(&self, key: &[u8]) {
        let mut sh = lock(self.shard(key));
        if let Some((_, c)) = sh.map.remove(key) {
            sh.bytes -= c;
        }
    }
}

/// The current transaction's not-yet-published unit contents: deferred units and new-extent
/// writes (consulted by reads made while preparing it, e.g. read-modify-write and clone).
pub(crate) type Staged<'a> = (&'a BTreeMap<u64, Arc<Vec<u8>>>, &'a [CowWrite]);
static EMPTY_DEFERRED: BTreeMap<u64, Arc<Vec<u8>>> = BTreeMap::new();

/// Completion of a transaction's new-extent data writes, which its submitter performs after
/// releasing the apply lock (so several writes proceed in parallel); the committer waits for it
/// before flushing the data file and committing the metadata that points at the data.
#[derive(Default)]
struct DataDone {
    state: Mutex<Option<std::result::Result<(), String>>>,
    cv: Condvar,
}

impl DataDone {
    fn finish(&self, r: std::result::Result<(), String>) {
        *lock(&self.state) = Some(r);
        self.cv.notify_all();
    }
    fn is_done(&self) -> bool {
        lock(&self.state).is_some()
    }
    fn wait(&self) -> std::result::Result<(), String> {
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

fn kv_config(dir: &Path, cfg: &StoreConfig) -> fjall::Config {
    fjall::Config::new(dir.join(META_DIR))
        .cache_size(cfg.block_cache_bytes())
        .max_write_buffer_size(cfg.write_buffer_bytes())
        .manual_journal_persist(true)
}

fn open_partitions(kv: &Keyspace) -> Result<(PartitionHandle, PartitionHandle)> {
    let meta = kv
        .open_partition(PARTITION, PartitionCreateOptions::default())
        .map_err(|e| StoreError::kv("opening the metadata partition", e))?;
    let deferred = kv
        .open_partition(DEFERRED_PARTITION, PartitionCreateOptions::default())
        .map_err(|e| StoreError::kv("opening the deferred-write partition", e))?;
    Ok((meta, deferred))
}

/// Most flush rounds of [`flush_recovered_memtables`]: each round flushes at least one queued
/// memtable (else the loop ends), so this only guards against a fjall change looping forever.
const MAX_RECOVERY_FLUSH_ROUNDS: usize = 100_000;

/// Recover the database *without* fjall's background threads and flush every memtable it
/// holds: the sealed memtables recovered from its sealed journals and the active ones (then the
/// keyspace is dropped and opened normally by the caller, with an empty write buffer).
///
/// Why: fjall 2.x wakes its flush worker once per *partition* with queued memtables at startup
/// (`start_background_threads` releases its semaphore `queue_count()` times), and each wake-up
/// flushes at most `flush_workers` memtables (`available_parallelism - 1`, capped at 4; 1 on a
/// 2-CPU machine). A store killed (or stopped while fjall had rotations pending) with two or
/// more sealed journals holding one partition therefore leaves sealed memtables queued that
/// no wake-up ever flushes: their bytes stay in fjall's write-buffer counter forever, the
/// monitor does not rotate partitions that have queued flushes, and once that counter is above
/// `max_write_buffer_size` every write halts for good ("write halt because of write buffer
/// saturation" every 10 ms, with an idle flusher) — during the write-ahead log replay of mount
/// or later under load. Stranded memtables also survived restarts (their journals were never
/// dropped), so they accumulated. Flushing here, in this thread, with no flush worker running,
/// uses fjall's inline flush (`force_flush`, which must not race a flush worker: none exists on
/// a keyspace from `create_or_recover`).
fn flush_recovered_memtables(dir: &Path, cfg: &StoreConfig) -> Result<()> {
    let kv = Keyspace::create_or_recover(kv_config(dir, cfg))
        .map_err(|e| StoreError::kv("recovering the metadata database", e))?;
    let (meta, deferred) = open_partitions(&kv)?;
    for p in [&meta, &deferred] {
        // Seal the active memtable too (queued like the recovered ones; the flush worker it
        // signals does not exist here), so the replay that follows starts with nothing buffered.
        p.rotate_memtable()
            .map_err(|e| StoreError::kv("sealing a recovered memtable", e))?;
    }
    let mut rounds = 0;
    loop {
        let before = kv.flushes_completed();
        kv.force_flush()
            .map_err(|e| StoreError::kv("flushing recovered memtables", e))?;
        if kv.flushes_completed() == before {
            break;
        }
        rounds += 1;
        if rounds >= MAX_RECOVERY_FLUSH_ROUNDS {
            return Err(StoreError::corrupt(
                "metadata database: recovered memtables do not drain",
            ));
        }
    }
    kv.persist(PersistMode::SyncAll)
        .map_err(|e| StoreError::kv("syncing the recovered metadata", e))?;
    Ok(())
}

/// During the write-ahead log replay (up to 64 MiB of batches applied back to back): once the
/// active memtables hold half the write buffer, seal the largest so that fjall's flush worker
/// starts on it at once, instead of letting the replay run into fjall's write halt and wait for
/// its monitor (which checks every 250 ms).
fn relieve_write_buffer(cfg: &StoreConfig, parts: &[&PartitionHandle]) -> Result<()> {
    use fjall::AbstractTree;
    let active: u64 = parts
        .iter()
        .map(|p| u64::from(p.tree.active_memtable_size()))
        .sum();
    if active <= cfg.write_buffer_bytes() / 2 {
        return Ok(());
    }
    if let Some(p) = parts.iter().max_by_key(|p| p.tree.active_memtable_size()) {
        p.rotate_memtable()
            .map_err(|e| StoreError::kv("sealing a metadata memtable", e))?;
    }
    Ok(())
}

fn open_kv(dir: &Path, cfg: &StoreConfig) -> Result<(Keyspace, PartitionHandle, PartitionHandle)> {
    flush_recovered_memtables(dir, cfg)?;
    let kv = kv_config(dir, cfg)
        .open()
        .map_err(|e| StoreError::kv("opening the metadata database", e))?;
    let (meta, deferred) = open_partitions(&kv)?;
    Ok((kv, meta, deferred))
}

fn take_lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StoreError::io(format!("opening {}", path.display()), e))?;
    // A store closed a moment ago can still look locked: a process forking a child at that
    // moment lends the child its descriptors until the child's exec, and the lock goes with
    // them. So a held lock is retried for a short while before it is reported.
    let deadline = std::time::Instant::now() + LOCK_RETRY;
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(f),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked {
                    path: dir.to_path_buf(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::io("locking the store", e));
            }
        }
    }
}

/// How long a held store lock is retried before mounting fails with `Locked`.
const LOCK_RETRY: Duration = Duration::from_secs(1);

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn random_id() -> String {
    // Not security relevant: distinguishes stores. Time, pid and std's random hash keys.
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(t);
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// Create a new store in `dir` (created if missing; must not already hold a store).
pub fn mkfs(dir: &Path, opts: &MkfsOptions) -> Result<Superblock> {
    let unit = opts.min_alloc_size.0;
    let cb = opts.csum_block_size.0;
    if cb < 512 || unit < cb || !unit.is_multiple_of(cb) || !unit.is_power_of_two() {
        return Err(StoreError::InvalidArgument {
            reason: format!(
                "min_alloc_size ({unit}) must be a power of two and a multiple of csum_block_size ({cb} >= 512)"
            ),
        });
    }
    let size = opts.size.0 / unit * unit;
    if size < 16 * unit {
        return Err(StoreError::InvalidArgument {
            reason: format!("store size {} is too small", opts.size),
        });
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| StoreError::io(format!("creating {}", dir.display()), e))?;
    if dir.join(superblock::FILE_NAME).exists() || dir.join(META_DIR).exists() {
        return Err(StoreError::AlreadyExists {
            path: dir.to_path_buf(),
        });
    }
    let _lock = take_lock(dir)?;
    let data = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(dir.join(DATA_FILE))
        .map_err(|e| StoreError::io("creating the data file", e))?;
    data.set_len(size)
        .map_err(|e| StoreError::io("sizing the data file", e))?;
    let grows = opts.grow && !opts.prewrite;
    let mut data_written = None;
    if opts.prewrite {
        grow::write_zeros(&dir.join(DATA_FILE), 0, size)?;
    } else if grows {
        // Sparse; the first step is written now, the rest as data arrives (grow.rs).
        let first = grow::step_bytes(size, unit);
        grow::write_zeros(&dir.join(DATA_FILE), 0, first)?;
        data_written = Some(first);
    } else {
        // Reserve the space now (no ENOSPC from the filesystem later); not all filesystems
        // can.
        let _ = rustix::fs::fallocate(&data, rustix::fs::FallocateFlags::empty(), 0, size);
    }
    data.sync_all()
        .map_err(|e| StoreError::io("syncing the data file", e))?;
    let sb = Superblock {
        format_version: FORMAT_VERSION,
        store_id: random_id(),
        data_size: size,
        min_alloc_size: unit,
        csum_block_size: cb,
        created_unix: now_unix(),
        data_prewritten: opts.prewrite,
        data_written,
    };
    let cfg = StoreConfig {
        cache_budget: kelp_types::ByteSize(32 << 20),
        ..StoreConfig::default()
    };
    {
        let (kv, meta, _) = open_kv(dir, &cfg)?;
        let mut batch = kv.batch().durability(Some(PersistMode::SyncAll));
        batch.insert(&meta, keys::SUPER, sb.encode());
        batch.insert(&meta, keys::NEXT_NID, 1u64.to_be_bytes().to_vec());
        let mut bm = Bitmap::new(size / unit);
        bm.mark_all_dirty();
        for (chunk, v) in bm.take_dirty() {
            batch.insert(&meta, keys::bitmap_key(chunk), v);
        }
        batch
            .commit()
            .map_err(|e| StoreError::kv("writing the initial metadata", e))?;
        kv.persist(PersistMode::SyncAll)
            .map_err(|e| StoreError::kv("syncing the initial metadata", e))?;
    }
    Wal::create(dir)?;
    // The superblock is written last: its presence means mkfs completed.
    sb.write(dir)?;
    Ok(sb)
}

/// Do the new extents named by a log record carry the data their checksums describe?
fn new_runs_intact(data: &File, sb: &Superblock, runs: &[NewRun]) -> Result<bool> {
    let unit = sb.min_alloc_size;
    let cb = sb.csum_block_size as usize;
    let bpu = (unit / sb.csum_block_size) as usize;
    let units_total = sb.data_size / unit;
    for (punit, units, csums) in runs {
        if punit.checked_add(*units).is_none_or(|e| e > units_total)
            || csums.len() != *units as usize * bpu
        {
            return Err(StoreError::corrupt(format!(
                "write-ahead log names units {punit}+{units} with {} checksums",
                csums.len()
            )));
        }
        let per_read = (8u64 << 20) / unit;
        let mut done = 0u64;
        while done < *units {
            let n = (units - done).min(per_read.max(1));
            let mut buf = AlignedBuf::zeroed((n * unit) as usize);
            data.read_exact_at(&mut buf, (punit + done) * unit)
                .map_err(|e| StoreError::io("verifying logged extents", e))?;
            let first = done as usize * bpu;
            for (i, block) in buf.chunks(cb).enumerate() {
                if kelp_types::crc32c(block) != csums[first + i] {
                    return Ok(false);
                }
            }
            done += n;
        }
    }
    Ok(true)
}

/// A 3-way merge of sorted `(key, value-or-tombstone)` sources; earlier sources win on equal
/// keys. Tombstones are skipped in the output.
fn merge_sources(mut sources: Vec<KvSource<'_>>, limit: usize) -> Result<Vec<(Vec<u8>, Value)>> {
    let mut heads: Vec<Option<(Vec<u8>, Option<Value>)>> = Vec::with_capacity(sources.len());
    for s in sources.iter_mut() {
        heads.push(s.next().transpose()?);
    }
    let mut out = Vec::new();
    while out.len() < limit {
        let mut best: Option<usize> = None;
        for (i, h) in heads.iter().enumerate() {
            if let Some((k, _)) = h {
                match best {
                    Some(b) if heads[b].as_ref().is_some_and(|(bk, _)| bk <= k) => {}
                    _ => best = Some(i),
                }
            }
        }
        let Some(b) = best else { break };
        let Some((key, value)) = heads[b].take() else {
            break;
        };
        heads[b] = sources[b].next().transpose()?;
        // Drop the same key from lower-priority sources.
        for i in 0..heads.len() {
            while heads[i].as_ref().is_some_and(|(k, _)| *k == key) {
                heads[i] = sources[i].next().transpose()?;
            }
        }
        if let Some(v) = value {
            out.push((key, v));
        }
    }
    Ok(out)
}

impl Inner {
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
            Some(v) => Onode::decode(&v, self.geo.bpu),
            None => Err(self.absent(coll, oid)?),
        }
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
            Some(Some(v)) => Ok(Arc::new(Onode::decode(&v, self.geo.bpu)?)),
            Some(None) => self.onode_for_read(coll, oid).map(Arc::new),
            None => match self
                .meta
                .get(&key)
                .map_err(|e| StoreError::kv("reading metadata", e))?
            {
                Some(v) => {
                    let on = Arc::new(Onode::decode(&v, self.geo.bpu)?);
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

/// Aligned read buffers kept for reuse: a read fills its buffer from the device, so a reused
/// one needs no zeroing (zeroing fresh 4 MiB buffers was ~19% of an OSD's CPU on 4 MiB reads).
#[derive(Default)]
pub(crate) struct BufPool(Mutex<Vec<AlignedBuf>>);

impl BufPool {
    /// Buffers kept, and the largest kept.
    const KEEP: usize = 6;
    const MAX: usize = 8 << 20;

    fn take(&self, len: usize) -> AlignedBuf {
        let mut pool = lock(&self.0);
        if let Some(i) = pool.iter().position(|b| b.raw.len() - b.start >= len) {
            let mut b = pool.swap_remove(i);
            b.len = len;
            return b;
        }
        drop(pool);
        AlignedBuf::zeroed(len)
    }

    fn keep(&self, b: AlignedBuf) {
        if b.raw.len() <= Self::MAX + DIO_ALIGN {
            let mut pool = lock(&self.0);
            if pool.len() < Self::KEEP {
                pool.push(b);
            }
        }
    }
}

/// A read buffer lent out as the owner of a `Bytes`; back to its pool when dropped.
struct PooledBuf {
    buf: Option<AlignedBuf>,
    pool: std::sync::Weak<BufPool>,
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or(&[])
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let (Some(b), Some(pool)) = (self.buf.take(), self.pool.upgrade()) {
            pool.keep(b);
        }
    }
}

/// A transaction being prepared: its staged metadata and space changes. Dropped without
/// effect (allocations returned) if any operation fails.
struct Txc<'a> {
    inner: &'a Inner,
    staged: BTreeMap<Vec<u8>, Option<Value>>,
    allocated: Vec<(u64, u64)>,
    freed: Vec<(u64, u64)>,
    deferred: BTreeMap<u64, Arc<Vec<u8>>>,
    cow: Vec<CowWrite>,
    /// The new extents of `cow` with their checksums (logged for verification at replay).
    new_runs: Vec<NewRun>,
    /// Aligned copy and checksums of the operation being applied, if made before the lock.
    pre: Option<PreCopied>,
    next_nid: u64,
    nid_used: bool,
    bytes: u64,
}

impl Txc<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Value>> {
        match self.staged.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.inner.get(key),
        }
    }

    fn put(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.bytes += (key.len() + value.as_ref().map_or(0, |v| v.len())) as u64;
        self.staged.insert(key, value.map(Value::from));
    }

    fn require_coll(&self, coll: CollectionId) -> Result<()> {
        let key = keys::coll_key(coll);
        let exists = match self.staged.get(&key) {
            Some(v) => v.is_some(),
            None if lock(&self.inner.known_colls).contains(&key) => true,
            None => {
                let found = self.inner.get(&key)?.is_some();
                if found {
                    lock(&self.inner.known_colls).insert(key);
                }
                found
            }
        };
        if !exists {
            return Err(StoreError::CollectionNotFound { coll });
        }
        Ok(())
    }

    /// The object's record as this transaction sees it. An object exists only in an existing
    /// collection (removing a collection requires it empty), so the collection is looked up
    /// only when the object is not found.
    fn onode(&self, coll: CollectionId, oid: &ObjectId) -> Result<Option<Onode>> {
        let key = keys::obj_key(coll, oid);
        let raw = match self.staged.get(&key) {
            Some(v) => v.clone(),
            None => match self.inner.onode_cache.get(&key) {
                // The cache holds only the newest published record: publishing invalidates it,
                // and readers fill it (holding `reuse` shared) only from the database when the
                // overlay has nothing newer.
                Some(Some(on)) => return Ok(Some(on.as_ref().clone())),
                Some(None) => None,
                None => {
                    let pending = {
                        let ov = self.inner.overlay.read().unwrap_or_else(|p| p.into_inner());
                        ov.get(&key).map(|(_, v)| v.clone())
                    };
                    match pending {
                        Some(v) => v,
                        None => {
                            // Committed, and nothing newer pending: fill the cache as a reader
                            // would (`prepare` holds `reuse` shared, and nothing is published
                            // while it holds `apply`). Objects a transaction touches without
                            // changing their record (a PG's log object, whose omap every write
                            // appends to) are then found without a database lookup.
                            let v = self.inner.kv_get(&key)?;
                            match &v {
                                Some(b) => {
                                    let on = Onode::decode(b, self.inner.geo.bpu)?;
                                    self.inner
                                        .onode_cache
                                        .insert(key, Some(Arc::new(on.clone())));
                                    return Ok(Some(on));
                                }
                                None => self.inner.onode_cache.insert(key, None),
                            }
                            v
                        }
                    }
                }
            },
        };
        match raw {
            Some(v) => Onode::decode(&v, self.inner.geo.bpu).map(Some),
            None => {
                self.require_coll(coll)?;
                Ok(None)
            }
        }
    }

    fn existing(&self, coll: CollectionId, oid: &ObjectId) -> Result<Onode> {
        self.onode(coll, oid)?
            .ok_or_else(|| StoreError::ObjectNotFound {
                coll,
                object: oid.clone(),
            })
    }

    fn new_onode(&mut self) -> Onode {
        let nid = self.next_nid;
        self.next_nid += 1;
        self.nid_used = true;
        Onode {
            nid,
            ..Onode::default()
        }
    }

    fn onode_or_new(&mut self, coll: CollectionId, oid: &ObjectId) -> Result<Onode> {
        match self.onode(coll, oid)? {
            Some(o) => Ok(o),
            None => Ok(self.new_onode()),
        }
    }

    fn save(&mut self, coll: CollectionId, oid: &ObjectId, on: &Onode) {
        self.put(keys::obj_key(coll, oid), Some(on.encode()));
    }

    fn allocate(&mut self, units: u64) -> Result<Vec<(u64, u64)>> {
        let inner = self.inner;
        let mut a = lock(&inner.alloc);
        loop {
            if let Some(runs) = a.allocate(units) {
                inner.kick_grower_if_low(&a);
                self.allocated.extend(&runs);
                return Ok(runs);
            }
            // A growing file with room beyond its frontier: wait for the grower (writers
            // outran it). Not on a thread that must not block.
            match &inner.grower {
                Some(g) if a.fits_after_growth(units) => {
                    if nowait::active() {
                        return Err(nowait::blocked());
                    }
                    g.kick(units.saturating_sub(a.usable_units()));
                    a = inner.grown.wait(a).unwrap_or_else(|p| p.into_inner());
                }
                _ => {
                    return Err(StoreError::NoSpace {
                        needed: units * inner.geo.unit,
                        free: a.free_units() * inner.geo.unit,
                    });
                }
            }
        }
    }

    fn check_range(offset: u64, len: u64) -> Result<u64> {
        offset
            .checked_add(len)
            .filter(|&e| e <= MAX_OBJECT_END)
            .ok_or_else(|| StoreError::InvalidArgument {
                reason: format!("range {offset}+{len} beyond the 16 TiB object limit"),
            })
    }

    /// Current content of logical unit `lunit` (zeros for a hole), verified.
    fn unit_content(&self, oid: &ObjectId, on: &Onode, lunit: u64) -> Result<AlignedBuf> {
        let bpu = self.inner.geo.bpu;
        match on.lookup(lunit, bpu) {
            Some((punit, csums)) => self.inner.read_units(
                oid,
                lunit,
                punit,
                1,
                csums,
                Some((&self.deferred, &self.cow)),
            ),
            None => Ok(AlignedBuf::zeroed(self.inner.geo.unit as usize)),
        }
    }

    /// Give logical unit `lunit` the content `data` through a deferred write: in place if the
    /// unit is mapped (the new content is durable in the metadata commit before the in-place
    /// write-back), else into a newly allocated unit.
    fn defer_unit(&mut self, on: &mut Onode, lunit: u64, data: AlignedBuf) -> Result<()> {
        let data = data.to_vec();
        let geo = self.inner.geo;
        let csums = geo.csums(&data);
        self.bytes += data.len() as u64;
        match on.lookup(lunit, geo.bpu) {
            Some((punit, _)) => {
                on.set_unit_csums(lunit, geo.bpu, &csums);
                self.deferred.insert(punit, Arc::new(data));
            }
            None => {
                let runs = self.allocate(1)?;
                let punit = runs[0].0;
                on.insert(Extent {
                    lunit,
                    punit,
                    units: 1,
                    csums,
                });
                self.deferred.insert(punit, Arc::new(data));
            }
        }
        Ok(())
    }

    /// Map logical units starting at `lunit` to new space holding `data[start..end]` (a whole
    /// number of units), replacing whatever was mapped there. The data is written by the
    /// submitter after the apply lock is released (or deferred, if small).
    fn write_new_units(
        &mut self,
        on: &mut Onode,
        lunit: u64,
        data: &Bytes,
        start: usize,
        end: usize,
        pre: Option<PreCopied>,
    ) -> Result<()> {
        let geo = self.inner.geo;
        let u = geo.unit as usize;
        let n = ((end - start) / u) as u64;
        if n == 0 {
            return Ok(());
        }
        let defer = ((end - start) as u64) <= self.inner.cfg.prefer_deferred_size.0;
        if !defer && nowait::active() {
            // New extents are written by the submitter after publishing: that waits for the
            // device.
            return Err(nowait::blocked());
        }
        let runs = self.allocate(n)?;
        let freed = on.punch(lunit, lunit + n, geo.bpu);
        self.freed.extend(freed);
        let mut done = start;
        let mut l = lunit;
        for (punit, units) in runs {
            let part = &data[done..done + units as usize * u];
            if defer {
                for (i, chunk) in part.chunks(u).enumerate() {
                    self.deferred
                        .insert(punit + i as u64, Arc::new(chunk.to_vec()));
                }
            }
            let (csums, cow_data, cow_start) = match (&pre, defer) {
                (Some(p), false) => {
                    let at = done - start;
                    let bpu = geo.bpu as usize;
                    let first = at / u * bpu;
                    (
                        p.csums[first..first + units as usize * bpu].to_vec(),
                        p.data.clone(),
                        at,
                    )
                }
                _ => (geo.csums(part), CowData::Shared(data.clone()), done),
            };
            if !defer {
                self.cow.push(CowWrite {
                    punit,
                    units,
                    data: cow_data,
                    start: cow_start,
                });
                self.new_runs.push((punit, units, csums.clone()));
            }
            on.insert(Extent {
                lunit: l,
                punit,
                units,
                csums,
            });
            self.bytes += part.len() as u64;
            done += units as usize * u;
            l += units;
        }
        Ok(())
    }

    fn write(&mut self, coll: CollectionId, oid: &ObjectId, off: u64, data: Bytes) -> Result<()> {
        let end = Self::check_range(off, data.len() as u64)?;
        let mut on = self.onode_or_new(coll, oid)?;
        if !data.is_empty() {
            let u = self.inner.geo.unit;
            let first = off / u;
            let last = end.div_ceil(u);
            let full_s = off.div_ceil(u);
            let full_e = end / u;
            let mut partial = vec![first];
            if last - 1 != first {
                partial.push(last - 1);
            }
            for p in partial {
                if p >= full_s && p < full_e {
                    continue;
                }
                let mut content = self.unit_content(oid, &on, p)?;
                let a = (p * u).max(off);
                let b = ((p + 1) * u).min(end);
                content[(a - p * u) as usize..(b - p * u) as usize]
                    .copy_from_slice(&data[(a - off) as usize..(b - off) as usize]);
                self.defer_unit(&mut on, p, content)?;
            }
            if full_s < full_e {
                let s = (full_s * u - off) as usize;
                let e = (full_e * u - off) as usize;
                let pre = self
                    .pre
                    .take()
                    .filter(|p| s == 0 && p.data.bytes().len() == e);
                self.write_new_units(&mut on, full_s, &data, s, e, pre)?;
            }
            on.size = on.size.max(end);
        }
        self.save(coll, oid, &on);
        Ok(())
    }

    /// Zero `[a, b)` of the object's units (punching whole units, rewriting partial ones).
    fn zero_range(&mut self, oid: &ObjectId, on: &mut Onode, a: u64, b: u64) -> Result<()> {
        if a >= b {
            return Ok(());
        }
        let u = self.inner.geo.unit;
        let bpu = self.inner.geo.bpu;
        let first = a / u;
        let last = b.div_ceil(u);
        let full_s = a.div_ceil(u);
        let full_e = b / u;
        let mut partial = vec![first];
        if last - 1 != first {
            partial.push(last - 1);
        }
        for p in partial {
            if (p >= full_s && p < full_e) || on.lookup(p, bpu).is_none() {
                continue;
            }
            let mut content = self.unit_content(oid, on, p)?;
            let s = (p * u).max(a);
            let e = ((p + 1) * u).min(b);
            content[(s - p * u) as usize..(e - p * u) as usize].fill(0);
            self.defer_unit(on, p, content)?;
        }
        if full_s < full_e {
            let freed = on.punch(full_s, full_e, bpu);
            self.freed.extend(freed);
        }
        Ok(())
    }

    fn remove_object(&mut self, coll: CollectionId, oid: &ObjectId, on: &Onode) -> Result<()> {
        self.freed.extend(
            on.extents
                .iter()
                .map(|e| (e.punit, e.units))
                .collect::<Vec<_>>(),
        );
        if on.has_omap {
            self.omap_clear(on.nid)?;
        }
        self.put(keys::obj_key(coll, oid), None);
        Ok(())
    }

    fn omap_clear(&mut self, nid: u64) -> Result<()> {
        let p = keys::omap_prefix(nid);
        let entries = self
            .inner
            .scan(Some(&self.staged), &p, &keys::prefix_end(&p), usize::MAX)?;
        for (k, _) in entries {
            self.put(k, None);
        }
        Ok(())
    }

    /// Apply one operation, taking ownership so that written data is not copied.
    fn apply(&mut self, op: Op) -> Result<()> {
        match op {
            Op::Write {
                coll,
                oid,
                offset,
                data,
            } => self.write(coll, &oid, offset, data),
            other => self.apply_ref(&other),
        }
    }

    fn apply_ref(&mut self, op: &Op) -> Result<()> {
        let geo = self.inner.geo;
        match op {
            Op::CreateCollection { coll } => {
                if self.get(&keys::coll_key(*coll))?.is_some() {
                    return Err(StoreError::CollectionExists { coll: *coll });
                }
                self.put(keys::coll_key(*coll), Some(vec![codec::COLL_VERSION]));
            }
            Op::RemoveCollection { coll } => {
                self.require_coll(*coll)?;
                let p = keys::obj_prefix(*coll);
                if !self
                    .inner
                    .scan(Some(&self.staged), &p, &keys::prefix_end(&p), 1)?
                    .is_empty()
                {
                    return Err(StoreError::CollectionNotEmpty { coll: *coll });
                }
                self.put(keys::coll_key(*coll), None);
            }
            Op::SplitCollection {
                src,
                dest,
                bits,
                rem,
            } => {
                if src == dest || *bits > 32 {
                    return Err(StoreError::InvalidArgument {
                        reason: format!("split {src} -> {dest} with {bits} bits"),
                    });
                }
                self.require_coll(*src)?;
                self.require_coll(*dest)?;
                let mask = keys::split_mask(*bits);
                let p = keys::obj_prefix(*src);
                let all =
                    self.inner
                        .scan(Some(&self.staged), &p, &keys::prefix_end(&p), usize::MAX)?;
                for (k, v) in all {
                    let (_, oid) = keys::decode_obj_key(&k)?;
                    if oid.hash & mask == rem & mask {
                        self.put(k, None);
                        self.put(keys::obj_key(*dest, &oid), Some(v.to_vec()));
                    }
                }
            }
            Op::Touch { coll, oid } => {
                if self.onode(*coll, oid)?.is_none() {
                    let on = self.new_onode();
                    self.save(*coll, oid, &on);
                }
            }
            Op::Write {
                coll,
                oid,
                offset,
                data,
            } => self.write(*coll, oid, *offset, data.clone())?,
            Op::Zero {
                coll,
                oid,
                offset,
                len,
            } => {
                let end = Self::check_range(*offset, *len)?;
                let mut on = self.onode_or_new(*coll, oid)?;
                if *len > 0 {
                    let zero_end = end.min(on.size);
                    self.zero_range(oid, &mut on, *offset, zero_end)?;
                    on.size = on.size.max(end);
                }
                self.save(*coll, oid, &on);
            }
            Op::Truncate { coll, oid, size } => {
                Self::check_range(*size, 0)?;
                let mut on = self.onode_or_new(*coll, oid)?;
                if *size < on.size {
                    let u = geo.unit;
                    // Zero the tail of the last kept unit, drop whole units after it.
                    let keep = size.div_ceil(u);
                    let freed = on.punch(keep, u64::MAX / 2, geo.bpu);
                    self.freed.extend(freed);
                    if size % u != 0 {
                        self.zero_range(oid, &mut on, *size, keep * u)?;
                    }
                }
                on.size = *size;
                self.save(*coll, oid, &on);
            }
            Op::Remove { coll, oid } => {
                let on = self.existing(*coll, oid)?;
                self.remove_object(*coll, oid, &on)?;
            }
            Op::SetXattrs { coll, oid, attrs } => {
                let mut on = self.existing(*coll, oid)?;
                for (k, v) in attrs {
                    on.xattrs.insert(k.clone(), v.clone());
                }
                self.save(*coll, oid, &on);
            }
            Op::RmXattr { coll, oid, name } => {
                let mut on = self.existing(*coll, oid)?;
                if on.xattrs.remove(name).is_some() {
                    self.save(*coll, oid, &on);
                }
            }
            Op::OmapSet { coll, oid, entries } => {
                let mut on = self.existing(*coll, oid)?;
                for (k, v) in entries {
                    self.put(keys::omap_key(on.nid, k), Some(v.clone()));
                }
                if !on.has_omap {
                    on.has_omap = true;
                    self.save(*coll, oid, &on);
                }
            }
            Op::OmapRemove {
                coll,
                oid,
                keys: ks,
            } => {
                let on = self.existing(*coll, oid)?;
                for k in ks {
                    self.put(keys::omap_key(on.nid, k), None);
                }
            }
            Op::OmapClear { coll, oid } => {
                let on = self.existing(*coll, oid)?;
                if on.has_omap {
                    self.omap_clear(on.nid)?;
                }
            }
            Op::OmapSetHeader { coll, oid, header } => {
                let mut on = self.existing(*coll, oid)?;
                self.put(keys::omap_header_key(on.nid), Some(header.clone()));
                if !on.has_omap {
                    on.has_omap = true;
                    self.save(*coll, oid, &on);
                }
            }
            Op::Clone { coll, src, dst } => {
                let s = self.existing(*coll, src)?;
                if src == dst {
                    return Ok(());
                }
                if let Some(old) = self.onode(*coll, dst)? {
                    self.remove_object(*coll, dst, &old)?;
                }
                let mut d = self.new_onode();
                d.size = s.size;
                d.xattrs = s.xattrs.clone();
                d.has_omap = s.has_omap;
                for e in &s.extents {
                    let data = self.inner.read_units(
                        src,
                        e.lunit,
                        e.punit,
                        e.units,
                        &e.csums,
                        Some((&self.deferred, &self.cow)),
                    )?;
                    let len = data.len();
                    self.write_new_units(
                        &mut d,
                        e.lunit,
                        &Bytes::copy_from_slice(&data),
                        0,
                        len,
                        None,
                    )?;
                }
                if s.has_omap {
                    let p = keys::omap_prefix(s.nid);
                    let entries = self.inner.scan(
                        Some(&self.staged),
                        &p,
                        &keys::prefix_end(&p),
                        usize::MAX,
                    )?;
                    for (k, v) in entries {
                        let mut nk = keys::omap_prefix(d.nid);
                        nk.extend_from_slice(&k[9..]);
                        self.put(nk, Some(v.to_vec()));
                    }
                }
                self.save(*coll, dst, &d);
            }
        }
        Ok(())
    }
}

impl KelpStore {
    /// Mount the store in `dir`: check the superblock, open the metadata, load the allocation
    /// bitmap, replay deferred writes left by a crash, start the committer.
    pub fn mount(dir: &Path, cfg: StoreConfig) -> Result<KelpStore> {
        let lock_file = take_lock(dir)?;
        let sb = Superblock::read(dir)?;
        // O_DIRECT: data I/O bypasses the page cache (no double caching, cache memory stays
        // within the configured budget, writes go straight to the device); fall back to
        // buffered I/O on filesystems without O_DIRECT (tmpfs).
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(flags)
                .open(dir.join(DATA_FILE))
        };
        let (data, direct) = match open(rustix::fs::OFlags::DIRECT.bits() as i32) {
            Ok(f) => (f, true),
            Err(_) => (
                open(0).map_err(|e| StoreError::io("opening the data file", e))?,
                false,
            ),
        };
        // Small reads (and hot large ones) go through the page cache, with this descriptor,
        // at random offsets: no read-ahead (it would fill the cache with neighbouring units
        // nobody asked for). Advisory only. Linux keeps it coherent with O_DIRECT writes
        // (cached pages of the range are invalidated).
        let data_buffered = open(0).map_err(|e| StoreError::io("opening the data file", e))?;
        let _ = rustix::fs::fadvise(&data_buffered, 0, None, rustix::fs::Advice::Random);
        let len = data
            .metadata()
            .map_err(|e| StoreError::io("inspecting the data file", e))?
            .len();
        if len < sb.data_size {
            return Err(StoreError::corrupt(format!(
                "data file is {len} bytes, superblock says {}",
                sb.data_size
            )));
        }
        // Reads are random; readahead would only pollute the page cache.
        let _ = rustix::fs::fadvise(&data, 0, None, rustix::fs::Advice::Random);
        let (kv, meta, deferred_part) = open_kv(dir, &cfg)?;
        let geo = Geometry {
            unit: sb.min_alloc_size,
            csum_block: sb.csum_block_size,
            bpu: sb.min_alloc_size / sb.csum_block_size,
            units: sb.data_size / sb.min_alloc_size,
        };
        let kv_sb = meta
            .get(keys::SUPER)
            .map_err(|e| StoreError::kv("reading the superblock copy", e))?
            .ok_or_else(|| StoreError::corrupt("metadata database has no superblock copy"))?;
        let kv_sb = Superblock::decode(&kv_sb, &dir.join(META_DIR))?;
        let mut sb = sb;
        // The copy in the database may lag behind the file's format version (upgrades) and
        // a growing file's frontier (rewritten in the file only).
        if (Superblock {
            format_version: sb.format_version,
            data_written: sb.data_written,
            ..kv_sb.clone()
        }) != sb
        {
            return Err(StoreError::corrupt(format!(
                "metadata database belongs to store {}, superblock to {}",
                kv_sb.store_id, sb.store_id
            )));
        }
        if sb.format_version < 2 {
            // Upgrade from version 1 (no write-ahead log; fjall's journal was synced, so the
            // database is complete): create the log, then declare version 2.
            let _ = std::fs::remove_file(dir.join(wal::WAL_FILE));
            Wal::create(dir)?;
            superblock::sync_dir(dir)?;
            sb.format_version = FORMAT_VERSION;
            sb.write(dir)?;
        }
        // Replay the write-ahead log: batches committed there may be missing from fjall.
        let (mut wal, mut payloads) = Wal::open(dir)?;
        // Only the last record can be torn: each record is written after the previous one's
        // flush completed. If its new extents are not all on the device, the crash came
        // during its flush: it was never acknowledged, and it is dropped.
        if let Some(last) = payloads.last() {
            let (runs, _) = wal::decode_record(last)?;
            if !new_runs_intact(&data, &sb, &runs)? {
                payloads.pop();
            }
        }
        for payload in &payloads {
            let mut b = kv.batch();
            for (part, k, v) in wal::decode_record(payload)?.1 {
                let p = if part == PART_META {
                    &meta
                } else {
                    &deferred_part
                };
                match v {
                    Some(v) => b.insert(p, k, v),
                    None => b.remove(p, k),
                }
            }
            b.commit()
                .map_err(|e| StoreError::kv("replaying the write-ahead log", e))?;
            relieve_write_buffer(&cfg, &[&meta, &deferred_part])?;
        }
        if kv_sb != sb {
            let mut b = kv.batch();
            b.insert(&meta, keys::SUPER, sb.encode());
            b.commit()
                .map_err(|e| StoreError::kv("updating the superblock copy", e))?;
        }
        kv.persist(PersistMode::SyncAll)
            .map_err(|e| StoreError::kv("syncing the replayed metadata", e))?;
        wal.restart()?;
        let next_nid = match meta
            .get(keys::NEXT_NID)
            .map_err(|e| StoreError::kv("reading the nid counter", e))?
        {
            Some(v) if v.len() == 8 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&v);
                u64::from_be_bytes(b)
            }
            _ => return Err(StoreError::corrupt("missing or malformed nid counter")),
        };
        let mut bitmap = Bitmap::new(geo.units);
        let mut seen = 0u32;
        for r in meta.prefix([keys::BITMAP]) {
            let (k, v) = r.map_err(|e| StoreError::kv("loading the allocation bitmap", e))?;
            let chunk = keys::decode_bitmap_key(&k)?;
            bitmap.load_chunk(chunk, &v)?;
            seen += 1;
        }
        if seen != bitmap.chunks() {
            return Err(StoreError::corrupt(format!(
                "allocation bitmap has {seen} chunks, expected {}",
                bitmap.chunks()
            )));
        }
        // A growing file: only units below the frontier are handed out (grow.rs). Nothing can
        // have been allocated beyond it.
        let frontier = sb
            .data_written
            .map_or(geo.units, |w| (w / geo.unit).min(geo.units));
        let mut alloc = Allocator::with_frontier(frontier, geo.units);
        let mut free_to_end = frontier == geo.units;
        for (off, len) in bitmap.free_runs() {
            if off <= frontier && off + len == geo.units {
                free_to_end = true;
            }
            if off < frontier {
                alloc.release(off, len.min(frontier - off));
            }
        }
        if !free_to_end {
            return Err(StoreError::corrupt(format!(
                "units beyond the written part of the data file ({} bytes) are allocated",
                frontier * geo.unit
            )));
        }
        let grower = sb.data_written.is_some().then(|| {
            let step = match cfg.grow_step.0 {
                0 => grow::step_bytes(sb.data_size, geo.unit),
                s => s.max(geo.unit),
            };
            Arc::new(Grower::new(step / geo.unit))
        });
        let onode_cache = OnodeCache::new(cfg.onode_cache_bytes());
        let hot_reads = HotReads::new(cfg.hot_read_window.0);
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            cfg,
            geo,
            sb,
            data,
            data_buffered,
            direct,
            kv,
            meta,
            deferred_part,
            _lock: lock_file,
            overlay: RwLock::new(BTreeMap::new()),
            pending_blocks: Mutex::new(HashMap::new()),
            inflight_cow: Mutex::new(BTreeMap::new()),
            pending_len: AtomicUsize::new(0),
            release_pending: AtomicUsize::new(0),
            inflight_len: AtomicUsize::new(0),
            onode_cache,
            known_colls: Mutex::new(HashSet::new()),
            read_bufs: Arc::new(BufPool::default()),
            hot_reads,
            alloc: Mutex::new(alloc),
            grower,
            grown: Condvar::new(),
            apply: Mutex::new(ApplyState {
                next_seq: 1,
                next_nid,
            }),
            reuse: RwLock::new(()),
            queue: Mutex::new(Queue::default()),
            queue_cv: Condvar::new(),
            durable_cv: Condvar::new(),
            failed: Mutex::new(None),
            bitmap: Mutex::new(Some(bitmap)),
            wal: Mutex::new(Some(wal)),
        });
        replay_deferred(&inner)?;
        let worker = inner.clone();
        let handle = std::thread::Builder::new()
            .name("kelp-store-commit".into())
            .spawn(move || committer(worker))
            .map_err(|e| StoreError::io("starting the commit thread", e))?;
        let store = KelpStore {
            inner,
            committer: Mutex::new(Some(handle)),
            grower: Mutex::new(None),
        };
        if let Some(g) = store.inner.grower.clone() {
            let worker = store.inner.clone();
            let handle = std::thread::Builder::new()
                .name("kelp-store-grow".into())
                .spawn(move || {
                    let w = &*worker;
                    let data_path = w.dir.join(DATA_FILE);
                    let target = grow::GrowTarget {
                        dir: &w.dir,
                        data_path: &data_path,
                        unit: w.geo.unit,
                        alloc: &w.alloc,
                        grown: &w.grown,
                    };
                    grow::run(g, target, w.sb.clone());
                })
                .map_err(|e| StoreError::io("starting the grow thread", e))?;
            *lock(&store.grower) = Some(handle);
            // a store mounted with little room below its frontier grows at once
            store.inner.kick_grower_if_low(&lock(&store.inner.alloc));
        }
        Ok(store)
    }

    /// Wait for queued transactions, stop the committer and flush deferred writes.
    pub fn close(self) -> Result<()> {
        self.shutdown();
        self.inner.check_failed()
    }

    fn shutdown(&self) {
        {
            let mut q = lock(&self.inner.queue);
            q.shutdown = true;
        }
        self.inner.queue_cv.notify_all();
        if let Some(h) = lock(&self.committer).take() {
            let _ = h.join();
        }
        if let Some(g) = &self.inner.grower {
            g.shutdown();
        }
        if let Some(h) = lock(&self.grower).take() {
            let _ = h.join();
        }
        // transactions still waiting for room get NoSpace rather than waiting forever
        lock(&self.inner.alloc).set_grow_failed(true);
        self.inner.grown.notify_all();
    }

    pub fn superblock(&self) -> &Superblock {
        &self.inner.sb
    }

    /// Free space in bytes (allocator view).
    pub fn free_bytes(&self) -> u64 {
        lock(&self.inner.alloc).free_units() * self.inner.geo.unit
    }

    /// On-disk size of the metadata database (allocated bytes; the write-ahead log is not
    /// included: it is a fixed 64 MiB).
    pub fn metadata_bytes(&self) -> u64 {
        dir_size(&self.inner.dir.join(META_DIR))
    }

    /// Flush the write buffers of both partitions to tables, so that fjall can drop the
    /// journals holding them (used before measuring metadata size: otherwise the journals,
    /// which also hold every deferred write's data until rotated, are counted).
    pub fn compact_metadata(&self) -> Result<()> {
        for p in [&self.inner.meta, &self.inner.deferred_part] {
            p.rotate_memtable_and_wait()
                .map_err(|e| StoreError::kv("flushing the metadata write buffer", e))?;
        }
        Ok(())
    }

    /// Drop the data file's pages from the OS page cache (benchmarks: cold reads).
    pub fn drop_data_cache(&self) -> Result<()> {
        self.inner
            .data
            .sync_data()
            .map_err(|e| StoreError::io("syncing the data file", e))?;
        rustix::fs::fadvise(&self.inner.data, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(|e| StoreError::io("dropping the page cache", e.into()))
    }

    /// Where the data of `oid` lives: `(data-file offset, length)` runs (tests, debugging).
    pub fn object_extents(&self, coll: CollectionId, oid: &ObjectId) -> Result<Vec<(u64, u64)>> {
        let on = self.inner.onode_for_read(coll, oid)?;
        let u = self.inner.geo.unit;
        Ok(on
            .extents
            .iter()
            .map(|e| (e.punit * u, e.units * u))
            .collect())
    }
}

/// Bytes allocated on disk under `p` (not apparent sizes: fjall's journals are 32 MiB sparse
/// files, mostly holes).
pub(crate) fn dir_size(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_size(&e.path()),
                Ok(m) => total += m.blocks() * 512,
                Err(_) => {}
            }
        }
    }
    total
}

impl Drop for KelpStore {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Write back deferred records a crash left behind, then drop them.
fn replay_deferred(inner: &Inner) -> Result<()> {
    let mut keys_done = Vec::new();
    for r in inner.deferred_part.prefix([keys::DEFERRED]) {
        let (k, v) = r.map_err(|e| StoreError::kv("reading deferred writes", e))?;
        for (punit, data) in codec::decode_deferred(&v)? {
            if punit >= inner.geo.units || data.len() as u64 != inner.geo.unit {
                return Err(StoreError::corrupt(format!(
                    "deferred write to unit {punit} of {} bytes",
                    data.len()
                )));
            }
            inner.writeback(&data, punit * inner.geo.unit, true)?;
        }
        keys_done.push(k.to_vec());
    }
    if !keys_done.is_empty() {
        inner
            .data
            .sync_data()
            .map_err(|e| StoreError::io("syncing replayed deferred writes", e))?;
        let mut b = inner.kv.batch().durability(Some(PersistMode::SyncData));
        for k in keys_done {
            b.remove(&inner.deferred_part, k);
        }
        b.commit()
            .map_err(|e| StoreError::kv("dropping replayed deferred records", e))?;
    }
    Ok(())
}

struct CommitterState {
    bitmap: Bitmap,
    wal: Wal,
    /// Deferred records whose units were written back but not yet flushed.
    unsynced: Unsynced,
    /// Deferred units of finished batches whose write-back waits to be joined by the next
    /// batches' (see `Gathered`).
    gathered: Gathered,
    /// Deferred records put into the database (by batches too large for the log; see
    /// `commit_kv`): their deletions must reach it too.
    kv_deferred: HashSet<Vec<u8>>,
}

/// One run of contiguous deferred units of finished batches, not yet written back: new small
/// objects get units one after the other, so consecutive batches usually continue the run,
/// and one `O_DIRECT` write then covers several batches instead of one write (a device round
/// trip the committer waits for) per batch. Their units stay in `pending_blocks` (readers
/// take them from there) and their `D` records in the log until the run is written; it is
/// written before the committer waits for work, before a batch with freed units or units
/// elsewhere is finished, once it holds `GATHER_MAX_UNITS`, and before a checkpoint.
#[derive(Default)]
struct Gathered {
    /// First unit of the run and the units' contents, in order.
    start: u64,
    units: Vec<Arc<Vec<u8>>>,
    /// `D` records of the batches in the run, the last of those batches, and their in-flight
    /// bytes: they are published as finished (`durable_seq`) once the run is written.
    dkeys: Vec<Vec<u8>>,
    last_seq: u64,
    bytes: u64,
}

/// Most units in a gathered run (1 MiB of 4 KiB units).
const GATHER_MAX_UNITS: usize = 256;

impl Gathered {
    /// Whether units `[off, off + len)` include a gathered one.
    fn overlaps(&self, off: u64, len: u64) -> bool {
        !self.units.is_empty()
            && off < self.start + self.units.len() as u64
            && self.start < off + len
    }

    /// Whether a batch's deferred units, one run starting at `first`, may join the run.
    fn joins(&self, first: u64, n: usize) -> bool {
        self.units.is_empty()
            || (first == self.start + self.units.len() as u64
                && self.units.len() + n <= GATHER_MAX_UNITS)
    }
}

/// Write the gathered run back (one `O_DIRECT` write), drop its units from `pending_blocks` and
/// list its `D` records as written back. Emptied even on an error (the store fails then).
fn write_gathered(inner: &Inner, g: &mut Gathered, unsynced: &mut Unsynced) -> Result<()> {
    if g.units.is_empty() {
        return Ok(());
    }
    let Gathered {
        start,
        units,
        dkeys,
        last_seq,
        bytes,
    } = std::mem::take(g);
    let parts: Vec<&[u8]> = units.iter().map(|d| d.as_slice()).collect();
    let buf = AlignedBuf::from_parts(&parts, parts.len() * inner.geo.unit as usize);
    inner.writeback(&buf, start * inner.geo.unit, true)?;
    {
        let _g = inner.reuse.write().unwrap_or_else(|p| p.into_inner());
        forget_written(inner, start..start + units.len() as u64, last_seq);
    }
    unsynced.keys.extend(dkeys);
    unsynced.bytes += units.len() as u64 * inner.geo.unit;
    publish_durable(inner, bytes, last_seq);
    Ok(())
}

/// Drop units just written back from `pending_blocks`, unless a later batch (after `last_seq`)
/// gave them new content meanwhile. The caller holds `reuse` exclusively.
fn forget_written(inner: &Inner, punits: impl Iterator<Item = u64>, last_seq: u64) {
    let mut pending = lock(&inner.pending_blocks);
    for punit in punits {
        if pending.get(&punit).is_some_and(|(s, _)| *s <= last_seq) {
            pending.remove(&punit);
        }
    }
    inner.pending_len.store(pending.len(), Ordering::Release);
}

#[derive(Default)]
struct Unsynced {
    keys: Vec<Vec<u8>>,
    /// Bytes of deferred data in the records of `keys`.
    bytes: u64,
}

/// A batch whose commit is durable and acknowledged: `finish_batch` writes its deferred units
/// back and then releases the freed units left to it.
struct DurableBatch {
    /// Freed units to release after the write-back (counted in `release_pending`).
    freed: Vec<(u64, u64)>,
    /// The batch's in-flight bytes.
    bytes: u64,
    deferred: BTreeMap<u64, Arc<Vec<u8>>>,
    dkey: Vec<u8>,
    /// Metadata keys of the batch (their overlay entries are dropped).
    merged: Vec<Vec<u8>>,
    last_seq: u64,
}

/// The commit thread: groups queued transactions into batches and makes each durable (see
/// `commit_batch`), acknowledges them, then does what follows the acknowledgements
/// (`finish_batch`: deferred write-back, releasing freed units) before taking the next batch.
///
/// Until 2026-11-26 (commit `f6df5b5`) a second thread, the finisher, did `finish_batch`, so that the next
/// batch's log write overlapped with the write-back. On the 2-vCPU reference VM, where
/// replicated 4 KiB writes are CPU-bound, handing every batch to another thread cost more than
/// the overlap gained: two more context switches per batch (the finisher's wake-up and its
/// park) on top of the write-back's own. Finishing in the committer gave +4-10 % 4 KiB writes
/// and 5-9 % less daemon CPU per write in a cluster, with `kelp store bench`'s 4 KiB writes
/// unchanged within noise (docs/benchmarks/rados.md, 2026-11-26 08:00-09:00 UTC).
fn committer(inner: Arc<Inner>) {
    let Some(bitmap) = lock(&inner.bitmap).take() else {
        return;
    };
    let Some(wal) = lock(&inner.wal).take() else {
        return;
    };
    let mut st = CommitterState {
        bitmap,
        wal,
        unsynced: Unsynced::default(),
        gathered: Gathered::default(),
        kv_deferred: HashSet::new(),
    };
    commit_loop(&inner, &mut st);
    let CommitterState {
        bitmap,
        mut wal,
        mut gathered,
        mut unsynced,
        ..
    } = st;
    // Clean unmount: make the database durable on its own, so the next mount replays nothing.
    if lock(&inner.failed).is_none()
        && let Err(e) = checkpoint(&inner, &mut wal, &mut gathered, &mut unsynced)
    {
        fail(&inner, &e.to_string());
    }
    *lock(&inner.bitmap) = Some(bitmap);
    *lock(&inner.wal) = Some(wal);
}

fn commit_loop(inner: &Inner, st: &mut CommitterState) {
    let idle = Duration::from_millis(inner.cfg.deferred_cleanup_ms.max(1));
    loop {
        let (batch, shutdown) = {
            let mut q = lock(&inner.queue);
            if q.items.is_empty() && !q.shutdown {
                // Written-back deferred records are dropped after `idle` without new commits.
                q.committer_waiting = true;
                if st.unsynced.keys.is_empty() {
                    q = inner.queue_cv.wait(q).unwrap_or_else(|p| p.into_inner());
                } else {
                    q = inner
                        .queue_cv
                        .wait_timeout(q, idle)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                q.committer_waiting = false;
            }
            let max = q.items.len().min(inner.cfg.max_batch_txns.max(1));
            let n = if inner.sb.data_written_ahead() {
                // One flush covers data and record: take everything queued, and write the
                // record while the data writes still run (`commit_batch`), so the record's
                // write does not queue on the device behind them.
                max
            } else {
                // The data file is flushed before the record: wait (without the queue lock)
                // for the head's data writes, then take the longest prefix whose data is on
                // the device; transactions still writing join a later batch instead of
                // holding this one back, so data writes overlap with flushes.
                let head = q.items.front().and_then(|p| p.data_done.clone());
                if let Some(dd) = head {
                    drop(q);
                    let _ = dd.wait();
                    q = lock(&inner.queue);
                }
                let max = q.items.len().min(inner.cfg.max_batch_txns.max(1));
                q.items
                    .iter()
                    .take(max)
                    .position(|p| p.data_done.as_ref().is_some_and(|d| !d.is_done()))
                    .unwrap_or(max)
                    .max(usize::from(max > 0))
            };
            let batch: Vec<Prepared> = q.items.drain(..n).collect();
            (batch, q.shutdown)
        };
        if batch.is_empty() {
            if shutdown {
                break;
            }
            if !st.unsynced.keys.is_empty()
                && let Err(e) = cleanup_deferred(inner, st)
            {
                fail(inner, &e.to_string());
            }
            continue;
        }
        if let Err(e) = commit_batch(inner, st, batch) {
            fail(inner, &e.to_string());
        }
        // The gathered run is written before the committer waits for work (only it drains
        // the queue, so a queue found non-empty here is still so when the loop takes the next
        // batch): a quiet store holds no unwritten units, and with few writers in flight no
        // unit waits in memory longer than one commit.
        let queue_empty = lock(&inner.queue).items.is_empty();
        if queue_empty && let Err(e) = write_gathered(inner, &mut st.gathered, &mut st.unsynced) {
            fail(inner, &e.to_string());
        }
    }
}

/// Make every batch applied to the database durable there, then start the log over.
///
/// The data file is flushed first: deferred write-backs of logged batches may be only in the
/// page cache, and their `D` records only in the log (not in the database), so once the log
/// starts over nothing could replay them.
///
/// Only the committer checkpoints, between batches: every committed batch's deferred units are
/// written back then (`finish_batch` runs right after each commit), once the gathered run is.
fn checkpoint(
    inner: &Inner,
    wal: &mut Wal,
    gathered: &mut Gathered,
    unsynced: &mut Unsynced,
) -> Result<()> {
    write_gathered(inner, gathered, unsynced)?;
    inner
        .data
        .sync_data()
        .map_err(|e| StoreError::io("flushing the data file", e))?;
    inner
        .kv
        .persist(PersistMode::SyncAll)
        .map_err(|e| StoreError::kv("syncing the metadata database", e))?;
    wal.restart()
}

/// Commit one metadata batch: durable in the write-ahead log (one `O_DIRECT` write and one
/// device flush), then applied to the database without a sync. A batch too large for the log
/// is committed to the database directly, synced, after a checkpoint (so no older logged batch
/// can be replayed over it). `wait_data` returns once the batch's new extents are written: a
/// logged record is written while they may still be in flight, and flushed after them.
///
/// Deferred-write records (`D`) of a logged batch stay in the log only: they are large (every
/// deferred unit's content), short-lived, and needed only to replay write-backs after a crash,
/// which replaying the log does (it puts them into the database, and their deletions, in
/// order); a checkpoint flushes the data file before the log starts over. Only a batch too
/// large for the log puts its `D` record into the database; `kv_deferred` names those
/// records, so that their deletions reach the database too.
fn commit_kv(
    inner: &Inner,
    wal: &mut Wal,
    (gathered, unsynced): (&mut Gathered, &mut Unsynced),
    kv_deferred: &mut HashSet<Vec<u8>>,
    verify: &[NewRun],
    ops: Vec<KvOp>,
    wait_data: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let payload = wal::encode_record(verify, &ops);
    let logged = wal.ever_fits(payload.len());
    if !wal.fits(payload.len()) {
        checkpoint(inner, wal, gathered, unsynced)?;
    }
    let mut wait_data = Some(wait_data);
    if !logged && let Some(w) = wait_data.take() {
        w()?;
    }
    if !logged && !verify.is_empty() {
        // Not logged, so not verifiable at replay: the new extents must be durable first.
        inner
            .data
            .sync_data()
            .map_err(|e| StoreError::io("flushing the data file", e))?;
    }
    if logged {
        wal.append_then_sync(&payload, || wait_data.take().map_or(Ok(()), |w| w()))?;
    }
    drop(payload);
    let mut b = inner.kv.batch();
    if !logged {
        b = b.durability(Some(PersistMode::SyncData));
    }
    for (part, k, v) in ops {
        let p = if part == PART_META {
            &inner.meta
        } else if logged && (v.is_some() || !kv_deferred.remove(&k)) {
            continue;
        } else {
            if v.is_some() {
                kv_deferred.insert(k.clone());
            } else {
                kv_deferred.remove(&k);
            }
            &inner.deferred_part
        };
        match v {
            Some(v) => b.insert(p, k, v),
            None => b.remove(p, k),
        }
    }
    b.commit()
        .map_err(|e| StoreError::kv("committing a metadata batch", e))
}

fn fail(inner: &Inner, reason: &str) {
    let mut f = lock(&inner.failed);
    if f.is_none() {
        *f = Some(reason.to_string());
    }
    drop(f);
    // Fail everything still queued.
    let items: Vec<Prepared> = lock(&inner.queue).items.drain(..).collect();
    for p in items {
        let _ = p.done.send(Err(StoreError::Failed {
            reason: reason.to_string(),
        }));
    }
    inner.durable_cv.notify_all();
}

fn cleanup_deferred(inner: &Inner, st: &mut CommitterState) -> Result<()> {
    // Taken before the flush: their write-backs are done, so the flush covers them.
    let keys = std::mem::take(&mut st.unsynced).keys;
    inner
        .data
        .sync_data()
        .map_err(|e| StoreError::io("flushing the data file", e))?;
    let ops = keys.into_iter().map(|k| (PART_DEFERRED, k, None)).collect();
    commit_kv(
        inner,
        &mut st.wal,
        (&mut st.gathered, &mut st.unsynced),
        &mut st.kv_deferred,
        &[],
        ops,
        || Ok(()),
    )
}

/// Deferred-write records are dropped (after a data-file flush) at the latest once this many
/// batches have accumulated; earlier if a batch flushes the data file anyway or when idle.
/// Each drop costs a data-file flush; the records themselves live in the log (bounded by its
/// size, and a checkpoint flushes the data file anyway), so the bound is loose: 64 batches /
/// 1 MiB here cost 5-20 % of a 4 KiB ingest (docs/benchmarks/store.md, 2026-11-25 01:45-03:00 UTC).
const CLEANUP_BATCHES: usize = 1024;
/// ... or once they hold this much data (bounds the dirty write-back in the page cache that the
/// flush then has to write).
const CLEANUP_BYTES: u64 = 16 << 20;

fn commit_batch(inner: &Inner, st: &mut CommitterState, batch: Vec<Prepared>) -> Result<()> {
    let last_seq = batch.last().map_or(0, |p| p.seq);
    // Deferred unit contents of the whole batch, last writer wins.
    let mut deferred: BTreeMap<u64, Arc<Vec<u8>>> = BTreeMap::new();
    for p in &batch {
        for (u, d) in &p.deferred {
            deferred.insert(*u, d.clone());
        }
    }
    let dkey = keys::deferred_key(last_seq);
    let result = (|| -> Result<Vec<Vec<u8>>> {
        inner.check_failed()?;
        // 1. New extents reach the device before the metadata that points at them is durable:
        //    with a data-file flush, they are written before it; otherwise (prewritten data
        //    file) the log record is written while they are still in flight and the log's
        //    flush follows them (see `wait_data` in `commit_kv`).
        let wait_data = || -> Result<()> {
            for p in &batch {
                if let Some(dd) = &p.data_done {
                    dd.wait().map_err(|reason| StoreError::Failed {
                        reason: format!("data write failed: {reason}"),
                    })?;
                }
            }
            Ok(())
        };
        let wrote = batch.iter().any(|p| p.wrote_data);
        // Records to drop: taken before the data flush below, which then covers their
        // write-backs (`finish_batch` lists a record only once its units are written back).
        let dropped = {
            let u = &mut st.unsynced;
            let due = wrote || u.keys.len() >= CLEANUP_BATCHES || u.bytes >= CLEANUP_BYTES;
            if due {
                std::mem::take(u).keys
            } else {
                Vec::new()
            }
        };
        let cleanup = !dropped.is_empty();
        // On a prewritten data file the new extents need no separate flush: the log's flush
        // (one device cache flush, after the data writes completed) makes both durable, and
        // replay verifies the last record's new extents (a crash during that flush may have
        // kept the record but not the data). Deferred write-backs go through the page cache,
        // so dropping their records still needs a real data-file sync.
        let data_flush = cleanup || (wrote && !inner.sb.data_written_ahead());
        if data_flush {
            wait_data()?;
            inner
                .data
                .sync_data()
                .map_err(|e| StoreError::io("flushing the data file", e))?;
        }
        let mut verify: Vec<NewRun> = Vec::new();
        if wrote && !data_flush {
            // Units that a deferred write of this batch also targets are left out: their
            // write-back may already have replaced the new extent's content.
            let bpu = inner.geo.bpu as usize;
            for p in &batch {
                for (punit, units, csums) in &p.new_runs {
                    let mut i = 0u64;
                    while i < *units {
                        if deferred.contains_key(&(punit + i)) {
                            i += 1;
                            continue;
                        }
                        let s = i;
                        while i < *units && !deferred.contains_key(&(punit + i)) {
                            i += 1;
                        }
                        verify.push((
                            punit + s,
                            i - s,
                            csums[s as usize * bpu..i as usize * bpu].to_vec(),
                        ));
                    }
                }
            }
        }
        // 2. One atomic metadata batch for every transaction of the group.
        let mut merged: BTreeMap<&[u8], &Option<Value>> = BTreeMap::new();
        for p in &batch {
            for (k, v) in &p.mutations {
                merged.insert(k, v);
            }
            for &(off, len) in &p.allocated {
                st.bitmap.set_range(off, len, true);
            }
            for &(off, len) in &p.freed {
                st.bitmap.set_range(off, len, false);
            }
        }
        let mut ops: Vec<KvOp> = Vec::with_capacity(merged.len() + 8);
        for (k, v) in &merged {
            ops.push((PART_META, k.to_vec(), v.as_ref().map(|v| v.to_vec())));
        }
        for (chunk, v) in st.bitmap.take_dirty() {
            ops.push((PART_META, keys::bitmap_key(chunk), Some(v)));
        }
        if !deferred.is_empty() {
            let list: Vec<(u64, &[u8])> =
                deferred.iter().map(|(u, d)| (*u, d.as_slice())).collect();
            ops.push((
                PART_DEFERRED,
                dkey.clone(),
                Some(codec::encode_deferred(&list)),
            ));
        }
        for k in dropped {
            ops.push((PART_DEFERRED, k, None));
        }
        commit_kv(
            inner,
            &mut st.wal,
            (&mut st.gathered, &mut st.unsynced),
            &mut st.kv_deferred,
            &verify,
            ops,
            wait_data,
        )?;
        Ok(merged.keys().map(|k| k.to_vec()).collect())
    })();
    let merged = match result {
        Ok(m) => m,
        Err(e) => {
            let reason = e.to_string();
            for p in batch {
                let _ = p.done.send(Err(StoreError::Failed {
                    reason: reason.clone(),
                }));
            }
            return Err(e);
        }
    };
    // The batch is durable: the committer acknowledges it at once (in commit order, as it
    // commits batches one after the other), before its write-back: acknowledging after the
    // previous batch's write-back put a device round trip on every acknowledgement's path,
    // and that fed on itself: small batches, each waiting for a device round trip, halved
    // `kelp store bench`'s 4 KiB writes (~25 000 instead of ~50 000 ops/s).
    let (freed, bytes) = release_and_ack(inner, batch, &deferred, &st.gathered);
    finish_batch(
        inner,
        (&mut st.gathered, &mut st.unsynced),
        DurableBatch {
            freed,
            bytes,
            deferred,
            dkey,
            merged,
            last_seq,
        },
    );
    Ok(())
}

/// Acknowledge a durable batch's transactions, releasing first the units it freed that no
/// write-back can clobber any more: every earlier batch is written back already except for the
/// gathered run, so those that neither the gathered run nor its own deferred writes target
/// (`finish_batch` releases the others after writing both). Releasing before the acknowledgement means a
/// client that waited for a delete finds the space free; units left for `finish_batch` (after
/// the batch's write-back) are counted in `release_pending` before it, and a transaction
/// refused for lack of space while some are pending waits for them and tries again (`submit`).
/// Returns the freed units left for `finish_batch` and the batch's in-flight bytes.
fn release_and_ack(
    inner: &Inner,
    batch: Vec<Prepared>,
    deferred: &BTreeMap<u64, Arc<Vec<u8>>>,
    gathered: &Gathered,
) -> (Vec<(u64, u64)>, u64) {
    let mut freed = Vec::new();
    let mut bytes = 0;
    if batch.iter().any(|p| !p.freed.is_empty()) {
        let _g = inner.reuse.write().unwrap_or_else(|p| p.into_inner());
        let mut a = lock(&inner.alloc);
        for p in &batch {
            for &(off, len) in &p.freed {
                if deferred.range(off..off + len).next().is_some() || gathered.overlaps(off, len) {
                    freed.push((off, len));
                } else {
                    a.release(off, len);
                }
            }
        }
    }
    inner
        .release_pending
        .fetch_add(freed.len(), Ordering::AcqRel);
    for p in batch {
        bytes += p.bytes;
        let _ = p.done.send(Ok(()));
    }
    (freed, bytes)
}

/// A batch's deferred units are written back with `O_DIRECT` when they form at most this many
/// runs of contiguous units, else through the page cache. Direct: no copy into newly allocated
/// page-cache pages (13.5 % of all CPU of replicated 4 KiB writes of new objects, whose units
/// are allocated one after the other) and no dirty pages for the kernel to write later; but
/// each run is one device round trip, made one after the other by the committer, so scattered
/// units (4 KiB overwrites, whose new units reuse freed space) halved the store's 4 KiB
/// overwrite rate at queue depth 16 (32 000 -> 15 700 ops/s); through the page cache those
/// are a memory copy each (their pages are usually cached: the space was written recently).
const WRITEBACK_DIRECT_RUNS: usize = 2;

/// After a batch's commit is durable and acknowledged (the committer, before it takes the next
/// batch): write the deferred units back, release the freed units left to it, and publish the
/// batch as done (`durable_seq`).
fn finish_batch(
    inner: &Inner,
    (gathered, unsynced): (&mut Gathered, &mut Unsynced),
    d: DurableBatch,
) {
    let DurableBatch {
        freed,
        bytes,
        deferred,
        dkey,
        merged,
        last_seq,
    } = d;
    // A batch whose deferred units form one run, and that leaves no freed units to release
    // after its write-back, joins the gathered run if it continues it (else the gathered run is
    // written first, and this batch starts a new one). Any other batch writes the gathered run
    // first: its freed units may be among the gathered ones, and must not be released before
    // their write-back.
    let first = deferred.keys().next().copied().unwrap_or(0);
    let gather = !deferred.is_empty()
        && freed.is_empty()
        && deferred.len() <= GATHER_MAX_UNITS
        && deferred.keys().next_back() == Some(&(first + deferred.len() as u64 - 1));
    let mut gathered_result = Ok(());
    if !gather || !gathered.joins(first, deferred.len()) {
        gathered_result = write_gathered(inner, gathered, unsynced);
    }
    if gather && gathered_result.is_ok() {
        if gathered.units.is_empty() {
            gathered.start = first;
        }
        gathered.units.extend(deferred.into_values());
        gathered.dkeys.push(dkey);
        gathered.last_seq = last_seq;
        // Published as finished with the run's write-back (`write_gathered`).
        gathered.bytes += bytes;
        drop_overlay(inner, merged, last_seq);
        return;
    }
    // What follows the acknowledgements only makes the data file catch up with the metadata
    // (and is replayed from the `D` record after a crash).
    // Write back deferred units (contiguous units in one write), then drop them from
    // `pending_blocks` and release freed space, excluding readers that may be using old extent
    // maps. The writes need no exclusion: until its unit leaves `pending_blocks`, every reader
    // takes a deferred unit from there (`apply_unwritten`, after its device read), whatever
    // it read from the device meanwhile; and the device holds the new content before any
    // reader can miss it there.
    let writeback = gathered_result.and_then(|()| {
        let u = inner.geo.unit as usize;
        let units: Vec<(&u64, &Arc<Vec<u8>>)> = deferred.iter().collect();
        let mut runs = Vec::new();
        let mut i = 0;
        while i < units.len() {
            let mut j = i + 1;
            while j < units.len() && *units[j].0 == *units[j - 1].0 + 1 && j - i < 256 {
                j += 1;
            }
            runs.push(i..j);
            i = j;
        }
        let direct = runs.len() <= WRITEBACK_DIRECT_RUNS;
        for r in runs {
            let off = *units[r.start].0 * inner.geo.unit;
            let parts: Vec<&[u8]> = units[r].iter().map(|(_, d)| d.as_slice()).collect();
            if !direct && parts.len() == 1 {
                // Through the page cache, one unit needs no aligned copy.
                inner.writeback(parts[0], off, false)?;
            } else {
                let buf = AlignedBuf::from_parts(&parts, parts.len() * u);
                inner.writeback(&buf, off, direct)?;
            }
        }
        let _g = inner.reuse.write().unwrap_or_else(|p| p.into_inner());
        forget_written(inner, deferred.keys().copied(), last_seq);
        let mut a = lock(&inner.alloc);
        for &(off, len) in &freed {
            a.release(off, len);
        }
        Ok(())
    });
    // Counted down even if the write-back failed: the store is failed then, and a waiting
    // transaction must see that rather than wait for space.
    inner
        .release_pending
        .fetch_sub(freed.len(), Ordering::AcqRel);
    if !deferred.is_empty() && writeback.is_ok() {
        unsynced.keys.push(dkey);
        unsynced.bytes += deferred.len() as u64 * inner.geo.unit;
    }
    publish_finished(inner, merged, bytes, last_seq);
    if let Err(e) = writeback {
        fail(inner, &e.to_string());
    }
}

/// A finished batch: drop its overlay entries, count its in-flight bytes down and publish it as
/// done.
fn publish_finished(inner: &Inner, merged: Vec<Vec<u8>>, bytes: u64, last_seq: u64) {
    drop_overlay(inner, merged, last_seq);
    publish_durable(inner, bytes, last_seq);
}

/// Drop a committed batch's overlay entries: its metadata is in the database.
fn drop_overlay(inner: &Inner, merged: Vec<Vec<u8>>, last_seq: u64) {
    let mut ov = inner.overlay.write().unwrap_or_else(|p| p.into_inner());
    for k in merged {
        if ov.get(&k).is_some_and(|(s, _)| *s <= last_seq) {
            ov.remove(&k);
        }
    }
}

/// Publish every batch up to `last_seq` as finished (`durable_seq`: `flush` returns once its
/// batches are, their deferred units written back) and count their in-flight bytes down.
fn publish_durable(inner: &Inner, bytes: u64, last_seq: u64) {
    let wake = {
        let mut q = lock(&inner.queue);
        q.inflight_bytes = q.inflight_bytes.saturating_sub(bytes);
        q.durable_seq = last_seq;
        q.durable_waiters > 0
    };
    if wake {
        inner.durable_cv.notify_all();
    }
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
        let mut txc = Txc {
            inner,
            staged: BTreeMap::new(),
            allocated: Vec::new(),
            freed: Vec::new(),
            deferred: BTreeMap::new(),
            cow: Vec::new(),
            new_runs: Vec::new(),
            pre: None,
            next_nid: st.next_nid,
            nid_used: false,
            bytes: 0,
        };
        let applied = {
            let _g = inner.reuse_shared()?;
            let mut pre = pre.into_iter();
            txn.ops.into_iter().try_for_each(|op| {
                txc.pre = pre.next().flatten();
                txc.apply(op)
            })
        };
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
                    result = Err(e.to_string());
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

    fn space(&self) -> Result<StoreSpace> {
        let geo = self.inner.geo;
        let free = lock(&self.inner.alloc).free_units();
        let total = geo.units * geo.unit;
        let available = (free * geo.unit).min(total);
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
