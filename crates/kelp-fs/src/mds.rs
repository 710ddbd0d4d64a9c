//! The metadata server daemon: the I/O around the pure [`Namespace`] core.
//!
//! - Requests arrive over kelp-msgr (authenticated with the cluster keyring); each is decoded
//!   and checked before it reaches the core, and a malformed one gets an error reply, never a
//!   panic.
//! - Operations run one at a time against the cache (simple and obviously serializable); a
//!   mutation's updates are queued for the journal, and one writer appends whatever has
//!   queued in a single RADOS append (group commit). A client mutation gets an early
//!   ("unsafe") reply at once: the client keeps the request until an [`Op::Sync`] says it is
//!   journaled, and sends it again to an MDS that takes over meanwhile (see
//!   docs/FILESYSTEM.md "Early replies"). Every other reply that changed something, and any
//!   reply showing another client's change not yet journaled, waits for the journal.
//! - A checkpoint every `checkpoint_interval` writes the dirty state to the inode and
//!   directory objects, moves the journal head and removes the old segments, so a restart
//!   replays at most a few seconds of journal.
//! - Fencing: once the monitors blocklist this MDS's RADOS instance, its journal writes fail
//!   with `Blocklisted`; the daemon then stops (it must never answer from a stale view).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use kelp_client::{ClientError, IoCtx, Rados, WriteOp};
use kelp_msgr::{KeyLookup, Messenger, RemoteError, Request, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, watch};
use tracing::{debug, error, info, warn};

use crate::caps::{CAP_ALL, CapTable};
use crate::core::requests::{RequestTable, StoredRequests};
use crate::core::{Namespace, Need, Step, frag};
use crate::error::{FsError, Result};
use crate::journal::{self, Entry, Head};
use crate::locks::{LOCK_SESSION_GRACE, LockTable, StoredLocks};
use crate::types::*;

/// Where the active MDS of a file system says it listens (an object in the metadata pool),
/// until the monitors' file-system map records it.
pub const ADDR_OBJECT: &str = "mds.addr";

/// Default [`MdsConfig::max_backlog`]: about 20 000 file creates (a create journals ~5
/// updates), which a checkpoint writes back in a few seconds on a small cluster.
pub const DEFAULT_MAX_BACKLOG: usize = 100_000;

/// Settings of one MDS.
#[derive(Debug, Clone)]
pub struct MdsConfig {
    /// The daemon's name (`a` for `mds.a`).
    pub name: String,
    pub meta_pool: String,
    pub data_pool: String,
    /// The file system in the monitors' map this MDS serves (`None`: standalone), whose data
    /// pools file layouts may name.
    pub fs_name: Option<String>,
    /// Address to serve clients on (port 0: any).
    pub bind: SocketAddr,
    /// Most inodes kept in the cache (clean ones beyond it are dropped at each checkpoint).
    pub cache_inodes: usize,
    /// How often dirty metadata is written back and the journal trimmed.
    pub checkpoint_interval: Duration,
    /// Most journaled updates not yet written back to their objects. When reached, changes
    /// wait while a checkpoint (started at once) writes them back: this bounds the memory
    /// they hold and the journal a restart or a takeover replays, whatever the change rate.
    pub max_backlog: usize,
    /// When directories split into fragments and merge (`core::frag`).
    pub frag: frag::FragConfig,
}

impl MdsConfig {
    pub fn new(name: &str, meta_pool: &str, data_pool: &str) -> MdsConfig {
        MdsConfig {
            name: name.into(),
            meta_pool: meta_pool.into(),
            data_pool: data_pool.into(),
            fs_name: None,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            cache_inodes: 100_000,
            checkpoint_interval: Duration::from_secs(2),
            max_backlog: DEFAULT_MAX_BACKLOG,
            frag: frag::FragConfig::default(),
        }
    }
}

/// What the MDS publishes about itself in [`ADDR_OBJECT`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MdsAddr {
    pub v: u8,
    pub name: String,
    pub addr: SocketAddr,
    /// The RADOS instance (what the monitors blocklist to fence it).
    pub instance: String,
}

struct State {
    ns: Namespace,
    /// Updates queued for the journal since the last checkpoint, in order.
    pending: Vec<Update>,
}

// early replies (unsafe until journaled)
/// Most changes applied but not yet journaled for which the MDS still replies early; past
/// it, replies wait for the journal (which bounds what a takeover must skip, see
/// `core::REPLAY_INO_GAP`).
pub const MAX_UNSAFE_ENTRIES: u64 = 4096;
/// Most bytes of entries one journal append carries.
const MAX_APPEND_BYTES: usize = 4 << 20;
/// Longest the journal writer lets entries gather while nobody waits for them.
const JOURNAL_LINGER: Duration = Duration::from_millis(5);

/// Counts a request waiting for the journal while it lives (see [`Inner::linger`]).
struct JournalWaiter<'a>(&'a Inner);

impl<'a> JournalWaiter<'a> {
    fn new(inner: &'a Inner) -> JournalWaiter<'a> {
        inner
            .journal_waiters
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        inner.urgent.notify_one();
        JournalWaiter(inner)
    }
}

impl Drop for JournalWaiter<'_> {
    fn drop(&mut self) {
        self.0
            .journal_waiters
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What waits for the journal writer.
enum Queued {
    /// An encoded entry and its seq.
    Entry(u64, Vec<u8>),
    /// A checkpoint's request to close the segment after the entries before it: answered
    /// with (the first segment not yet checkpointed, the segment appended to from now on).
    Roll(tokio::sync::oneshot::Sender<(u64, u64)>),
}

/// Journal entries encoded and waiting for the writer.
#[derive(Default)]
struct JournalQueue {
    /// In seq order.
    entries: Vec<Queued>,
    /// The last seq given to an entry.
    assigned: u64,
    /// Inodes changed by entries not yet in RADOS: (client that changed it, seq). A reply to
    /// another client that shows one waits until that seq is journaled.
    unjournaled: HashMap<Ino, (u64, u64)>,
    /// The journal writer has stopped (fenced, or an append failed).
    writer_stopped: bool,
}

/// The journal's write side (one append at a time).
struct JournalWriter {
    /// Segment appended to now.
    segment: u64,
    segment_bytes: u64,
    /// First segment not yet checkpointed (the head).
    first_segment: u64,
}

/// The inodes a journal entry's updates change.
fn updated_inos(updates: &[Update]) -> impl Iterator<Item = Ino> + '_ {
    updates.iter().filter_map(|u| match u {
        Update::PutInode(i) => Some(i.ino),
        Update::DelInode(i) | Update::DelDir(i) | Update::AddStray(i) | Update::DelStray(i) => {
            Some(*i)
        }
        Update::PutDentry { dir, .. }
        | Update::DelDentry { dir, .. }
        | Update::Fragment { dir, .. } => Some(*dir),
        Update::Locks { ino, .. } | Update::PutInline { ino, .. } | Update::DelInline(ino) => {
            Some(*ino)
        }
        Update::NextIno(_) | Update::Request { .. } => None,
    })
}

/// The inodes a request names (what its reply may show besides the inode it answers with).
fn named_inos(op: &Op) -> Vec<Ino> {
    match op {
        Op::Lookup { parent, .. } => vec![*parent],
        Op::Link { ino, parent, .. } => vec![*ino, *parent],
        Op::Mknod { .. }
        | Op::Mkdir { .. }
        | Op::Symlink { .. }
        | Op::Unlink { .. }
        | Op::Rmdir { .. }
        | Op::Rename { .. } => op.changed_dirs(),
        Op::GetAttr { ino }
        | Op::SetAttr { ino, .. }
        | Op::ReadDir { ino, .. }
        | Op::SetXattr { ino, .. }
        | Op::GetXattr { ino, .. }
        | Op::ListXattr { ino }
        | Op::RemoveXattr { ino, .. }
        | Op::Written { ino, .. }
        | Op::WrittenInline { ino, .. }
        | Op::ReadInline { ino }
        | Op::Uninline { ino }
        | Op::Open { ino, .. }
        | Op::Close { ino }
        | Op::GetLk { ino, .. }
        | Op::SetLk { ino, .. }
        | Op::ReleaseLocks { ino, .. } => vec![*ino],
        Op::CloseMany { inos } => inos.clone(),
        Op::Reconnect { opens } => opens.iter().map(|(i, _)| *i).collect(),
        Op::CapPoll { .. } | Op::Sync | Op::TakeInos => Vec::new(),
    }
}

struct Inner {
    cfg: MdsConfig,
    rados: Rados,
    meta: IoCtx,
    /// Where the file system keeps its inodes.
    layout: InodeLayout,
    data: IoCtx,
    state: Mutex<State>,
    fenced: Arc<watch::Sender<Option<String>>>,
    /// When this MDS took over (strays wait `STRAY_PURGE_GRACE` from then).
    activated: std::time::Instant,
    /// Capabilities: who may cache what (see `caps.rs`), and the revoke long-polls.
    caps: std::sync::Mutex<CapState>,
    /// Bumped whenever a revoke is queued or acknowledged (wakes polls and waiters).
    caps_changed: watch::Sender<u64>,
    /// Client requests served (not counting revoke polls): what `kelp.mds.stats` shows.
    requests: std::sync::atomic::AtomicU64,
    // completed requests (idempotent retries)
    /// Revokes that completed requests still wait for, by (client, tid): a retry of one of
    /// them, answered from the completed-request table, waits for them too.
    revoking: std::sync::Mutex<HashMap<(u64, u64), Vec<u64>>>,
    /// Prometheus metrics (`crate::metrics`), shared with the [`Mds`] handle.
    metrics: Arc<crate::metrics::MdsMetrics>,
    // early replies (unsafe until journaled)
    /// Entries applied to the cache, waiting for the journal writer.
    queue: std::sync::Mutex<JournalQueue>,
    /// The journal's write side.
    writer: Mutex<JournalWriter>,
    /// The last seq in RADOS.
    committed: watch::Sender<u64>,
    /// Wakes the journal writer.
    kick: tokio::sync::Notify,
    /// Requests waiting for the journal now ([`Inner::wait_committed`]): while there are
    /// none, the writer lets entries gather for up to [`JOURNAL_LINGER`] before appending.
    journal_waiters: std::sync::atomic::AtomicUsize,
    /// Ends the writer's linger at once (someone started waiting for the journal).
    urgent: tokio::sync::Notify,
    /// Held by the checkpoint running (one at a time).
    checkpointing: Mutex<()>,
    /// Journaled (or queued) updates not yet written back, those of a running checkpoint
    /// included ([`MdsConfig::max_backlog`]).
    backlog: std::sync::atomic::AtomicUsize,
    /// Bumped when a checkpoint ends (wakes changes waiting for the backlog to shrink).
    written_back: watch::Sender<u64>,
    /// Starts a checkpoint before the next interval (the backlog is full).
    checkpoint_now: tokio::sync::Notify,
    // locks across a restart
    /// When each client last sent a request (a lock holder silent for
    /// [`LOCK_SESSION_GRACE`] loses its locks).
    last_seen: std::sync::Mutex<HashMap<u64, std::time::Instant>>,
}

/// The capability table plus what the daemon knows of each client's revoke poll.
struct CapState {
    table: CapTable,
    /// When each client last started a revoke poll (a client that stops polling for
    /// [`CAP_SESSION_GRACE`] has lost its session, and with it every capability).
    polls: HashMap<u64, std::time::Instant>,
    /// Clients with a change of their own waiting for revokes: never waited for in turn
    /// (their kernel may hold the directory lock that their own invalidation needs).
    waiting: HashMap<u64, u32>,
    /// Inodes whose exclusive capability a request waits to see settled: not granted
    /// again meanwhile (the waiter would never get its turn).
    excl_waiters: HashMap<Ino, u32>,
}

/// Which applied [`Inner::apply_locked`] gives: the answer, or the inode on which another
/// client's exclusive capability must settle first (with the revokes to wait for).
/// (Short-lived: returned and matched at once, so the size of `Done` costs nothing worth a
/// box.)
#[allow(clippy::large_enum_variant)]
enum Applied {
    /// The reply, its grants, the revokes it waits for, and the seq of its journal entry
    /// (`None`: it changed nothing).
    Done(Reply, Option<CapGrants>, Vec<u64>, Option<u64>),
    Excl(Ino, Vec<u64>),
}

/// What [`Inner::handle_safe`] gives: the reply, the seq of the journal entry it queued
/// (`None`: it changed nothing), and whether it was answered from the completed-request
/// table.
struct Handled {
    reply: Reply,
    seq: Option<u64>,
    retried: bool,
}

/// The inodes an operation reads or changes the size or times of, and the directories whose
/// entries it reads or changes, named in the request: another client's exclusive capability
/// on each is settled before the operation is applied (a file's holder flushes the size and
/// mtime it deferred, a directory's holder sends the creates it answered itself).
fn excl_targets(op: &Op) -> Vec<Ino> {
    match op {
        Op::GetAttr { ino }
        | Op::SetAttr { ino, .. }
        | Op::Written { ino, .. }
        | Op::WrittenInline { ino, .. }
        | Op::ReadInline { ino }
        | Op::Uninline { ino }
        | Op::Open { ino, .. }
        | Op::ReadDir { ino, .. } => vec![*ino],
        Op::Link { ino, parent, .. } => vec![*ino, *parent],
        Op::Lookup { parent, .. } => vec![*parent],
        op => op.changed_dirs(),
    }
}

/// The directory entry an operation may remove a directory through (`rmdir`, or a rename
/// over an empty directory): another client's creates in that directory, answered by the
/// client itself, reach the MDS first (the directory is not empty then).
fn removed_dir_entry(op: &Op) -> Option<(Ino, &str)> {
    match op {
        Op::Rmdir { parent, name } => Some((*parent, name)),
        Op::Rename {
            new_parent,
            new_name,
            ..
        } => Some((*new_parent, new_name)),
        _ => None,
    }
}

/// A change of a quota or a layout on a directory: every exclusive capability settles
/// before it is applied (sizes deferred and creates answered by clients were made under
/// the old rules, and count under them) and again after it (none is kept under the new).
fn settles_every_excl(op: &Op) -> bool {
    match op {
        Op::SetXattr { name, .. } | Op::RemoveXattr { name, .. } => {
            name == XATTR_QUOTA_MAX_BYTES
                || name == XATTR_QUOTA_MAX_FILES
                || name.contains(".layout.")
        }
        _ => false,
    }
}

/// How long a client may go without starting a revoke poll before the MDS drops its
/// session's capabilities (a client polls again at once after each answer).
pub const CAP_SESSION_GRACE: Duration = Duration::from_secs(10);

/// The virtual extended attribute (read on any inode) that shows the MDS's counters as JSON.
pub const STATS_XATTR: &str = "kelp.mds.stats";

/// What `kelp.mds.stats` shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MdsStats {
    /// Client requests served (revoke polls not counted).
    pub requests: u64,
    /// Inodes in the cache.
    pub cached_inodes: usize,
    /// The cache budget (`--cache-inodes`).
    pub cache_budget: usize,
    /// Inodes on which some client holds a capability.
    pub cap_inodes: usize,
    /// Requests served, by operation (`readdir`, `written`, `open`, ...).
    #[serde(default)]
    pub ops: BTreeMap<String, u64>,
    /// Journaled updates not yet written back by a checkpoint (bounded by `--max-backlog`).
    #[serde(default)]
    pub unwritten_updates: usize,
    /// Bytes of small files' inline data held in memory (changed since the last checkpoint
    /// began, or read back since).
    #[serde(default)]
    pub inline_bytes: usize,
}

/// How long after taking over an MDS leaves strays alone, so that every client with open
/// files re-registers them first (clients check in every `client::KEEPALIVE` while they hold
/// files open, and retry a lost MDS for up to their reconnect timeout).
pub const STRAY_PURGE_GRACE: Duration = Duration::from_secs(30);

/// A metadata server: its messenger listens from [`Mds::bind`] on, and it serves a file
/// system once [`Mds::activate`] has replayed that file system's journal (before, requests
/// are answered with ESHUTDOWN, which sends clients looking for the active MDS).
pub struct Mds {
    slot: Arc<OnceLock<Arc<Inner>>>,
    fenced: Arc<watch::Sender<Option<String>>>,
    msgr: Messenger,
    addr: SocketAddr,
    metrics: Arc<crate::metrics::MdsMetrics>,
}

impl Mds {
    /// Replays the journal, loads (or creates) the root, and starts serving on `cfg.bind`
    /// (a standalone MDS, without the monitors' file-system map). `keys` authenticates clients
    /// (the cluster keyring).
    pub async fn start(cfg: MdsConfig, rados: Rados, keys: Arc<dyn KeyLookup>) -> Result<Mds> {
        let mds = Mds::bind(&cfg.name, cfg.bind, keys).await?;
        mds.activate(cfg, rados).await?;
        Ok(mds)
    }

    /// Starts listening as `mds.NAME` on `bind`, serving nothing yet.
    pub async fn bind(name: &str, bind: SocketAddr, keys: Arc<dyn KeyLookup>) -> Result<Mds> {
        let slot: Arc<OnceLock<Arc<Inner>>> = Arc::default();
        let metrics = Arc::new(crate::metrics::MdsMetrics::default());
        let msgr = Messenger::builder(format!("mds.{name}"))
            .keys(keys)
            .dispatcher(Arc::new(Dispatcher {
                slot: slot.clone(),
                metrics: metrics.clone(),
            }))
            .build()?;
        let addr = msgr.bind(bind).await?;
        let (fenced, _) = watch::channel(None);
        Ok(Mds {
            slot,
            fenced: Arc::new(fenced),
            msgr,
            addr,
            metrics,
        })
    }

    /// Takes the file system of `cfg`: replays its journal, loads (or creates) the root,
    /// publishes this MDS's address in the metadata pool, and serves.
    pub async fn activate(&self, cfg: MdsConfig, rados: Rados) -> Result<()> {
        let mut meta = rados.ioctx(&cfg.meta_pool).await?;
        // the journal and the metadata objects are written past a full cluster's flag (up to
        // the OSDs' failsafe ratio), so that deletes go on and free space
        meta.set_full_try(true);
        let data = rados.ioctx(&cfg.data_pool).await?;
        let layout = inode_layout(&meta).await?;
        let (segment, next_ino, requests, locks) = replay(&meta, layout).await?;
        // numbers delegated to clients are never allocated again
        let delegations = load_delegations(&meta).await?;
        let next_ino = delegations.iter().map(|d| d.end).fold(next_ino, Ino::max);
        // unsafe replies of an MDS that died may have given numbers from `next_ino` on:
        // allocate past them, and let only their replays have them
        let mut zones = load_zones(&meta).await?;
        zones.push(next_ino);
        let skip = zones.len().saturating_sub(journal::ZONES_KEPT);
        zones.drain(..skip);
        save_zones(&meta, &zones).await?;
        let start = next_ino.saturating_add(crate::core::REPLAY_INO_GAP);
        apply_updates(&meta, layout, &[Update::NextIno(start)]).await?;
        let mut ns = Namespace::new(start);
        ns.set_replay_zones(zones);
        ns.set_delegations(delegations);
        ns.set_requests(requests);
        ns.set_locks(locks);
        ns.set_frag_config(cfg.frag);
        let strays = load_strays(&meta).await?;
        ns.set_strays(strays);
        ns.set_data_pools(data_pools(&rados, &cfg).await?, data.pool_id());
        let mut st = State {
            ns,
            pending: Vec::new(),
        };
        match load_inode(&meta, layout, ROOT_INO).await? {
            Some(root) => st.ns.insert_inode(root),
            None => {
                info!("no root directory: creating a new file system");
                let updates = st.ns.make_root(Time::now());
                apply_updates(&meta, layout, &updates).await?;
                st.ns.mark_clean();
            }
        }
        let inner = Arc::new(Inner {
            cfg: cfg.clone(),
            rados: rados.clone(),
            meta,
            layout,
            data,
            state: Mutex::new(st),
            fenced: self.fenced.clone(),
            activated: std::time::Instant::now(),
            caps: std::sync::Mutex::new(CapState {
                table: CapTable::new(CAP_LEASE.as_millis() as u64),
                polls: HashMap::new(),
                waiting: HashMap::new(),
                excl_waiters: HashMap::new(),
            }),
            caps_changed: watch::channel(0).0,
            requests: std::sync::atomic::AtomicU64::new(0),
            revoking: std::sync::Mutex::new(HashMap::new()),
            metrics: self.metrics.clone(),
            last_seen: std::sync::Mutex::new(HashMap::new()),
            queue: std::sync::Mutex::new(JournalQueue::default()),
            writer: Mutex::new(JournalWriter {
                segment,
                segment_bytes: 0,
                first_segment: segment,
            }),
            committed: watch::channel(0).0,
            kick: tokio::sync::Notify::new(),
            journal_waiters: std::sync::atomic::AtomicUsize::new(0),
            urgent: tokio::sync::Notify::new(),
            checkpointing: Mutex::new(()),
            backlog: std::sync::atomic::AtomicUsize::new(0),
            written_back: watch::channel(0).0,
            checkpoint_now: tokio::sync::Notify::new(),
        });
        let published = MdsAddr {
            v: RECORD_VERSION,
            name: cfg.name.clone(),
            addr: self.addr,
            instance: rados.instance(),
        };
        inner
            .meta
            .write_full(
                ADDR_OBJECT,
                serde_json::to_vec(&published).expect("serializable"),
            )
            .await
            .map_err(|e| inner.check_fenced(e))?;
        if self.slot.set(inner.clone()).is_err() {
            return Err(FsError::Config(
                "this MDS already serves a file system".into(),
            ));
        }
        info!(addr = %self.addr, "mds.{} serving", cfg.name);
        let writer = inner.clone();
        tokio::spawn(async move { writer.journal_writer().await });
        tokio::spawn(async move { inner.background().await });
        Ok(())
    }

    /// Where clients reach this MDS.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The messenger clients reach this MDS on (for its statistics).
    pub fn messenger(&self) -> &Messenger {
        &self.msgr
    }

    /// Exports this MDS's metrics (`crate::metrics`) into `reg`: live from bind on, the
    /// session and capability figures once it serves a file system.
    pub fn register_metrics(&self, reg: &mut kelp_metrics::Registry) {
        let slot = self.slot.clone();
        self.metrics.register(reg, move || match slot.get() {
            None => crate::metrics::MdsState::default(),
            Some(inner) => {
                let caps = inner.caps.lock().unwrap_or_else(|p| p.into_inner());
                crate::metrics::MdsState {
                    active: !inner.is_fenced(),
                    cache_budget: inner.cfg.cache_inodes,
                    sessions: caps
                        .polls
                        .values()
                        .filter(|t| t.elapsed() < CAP_SESSION_GRACE)
                        .count(),
                    cap_inodes: caps.table.inodes_with_grants(),
                }
            }
        });
    }

    /// Resolves when the MDS has been fenced (blocklisted), with the reason.
    pub async fn fenced(&self) -> String {
        let mut rx = self.fenced.subscribe();
        loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                return r;
            }
            if rx.changed().await.is_err() {
                return "stopped".into();
            }
        }
    }

    /// Writes back everything dirty (a clean stop leaves an empty journal).
    pub async fn shutdown(&self) -> Result<()> {
        self.msgr.shutdown();
        match self.slot.get() {
            Some(inner) => inner.checkpoint().await,
            None => Ok(()),
        }
    }
}

/// Reads the head and every segment after it and writes their updates to the objects;
/// returns the segment to append to next, the next free inode number, the completed
/// requests (the checkpointed table plus the journal's records) and the advisory locks
/// (likewise).
async fn replay(meta: &IoCtx, layout: InodeLayout) -> Result<(u64, Ino, RequestTable, LockTable)> {
    let head = match meta.read(journal::HEAD_OBJECT, 0, 0).await {
        Ok(b) => serde_json::from_slice::<Head>(&b).map_err(|e| FsError::Malformed {
            what: "journal head".into(),
            detail: e.to_string(),
        })?,
        Err(ClientError::NotFound { .. }) => Head {
            v: RECORD_VERSION,
            first_segment: 0,
        },
        Err(e) => return Err(e.into()),
    };
    let mut seg = head.first_segment;
    let mut updates = Vec::new();
    loop {
        match meta.read(&journal::segment_object(seg), 0, 0).await {
            Ok(b) => {
                let entries = journal::decode_segment(&b)?;
                info!(segment = seg, entries = entries.len(), "replaying journal");
                updates.extend(entries.into_iter().flat_map(|e| e.updates));
                seg += 1;
            }
            Err(ClientError::NotFound { .. }) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let mut requests = load_requests(meta).await?;
    let mut locks = load_locks(meta).await?;
    if !updates.is_empty() {
        updates.iter().for_each(|u| requests.apply(u));
        for u in &updates {
            if let Update::Locks { ino, held } = u {
                locks.restore(*ino, held);
            }
        }
        apply_updates(meta, layout, &updates).await?;
        save_requests(meta, &requests).await?;
        save_locks(meta, &locks.snapshot()).await?;
    }
    if seg != head.first_segment {
        trim(meta, head.first_segment, seg).await?;
    }
    let next_ino = match meta.read(journal::INOTABLE_OBJECT, 0, 0).await {
        Ok(b) => {
            serde_json::from_slice::<InoTable>(&b)
                .map_err(|e| FsError::Malformed {
                    what: "inode table".into(),
                    detail: e.to_string(),
                })?
                .next_ino
        }
        Err(ClientError::NotFound { .. }) => FIRST_INO,
        Err(e) => return Err(e.into()),
    };
    Ok((seg, next_ino, requests, locks))
}

/// The JSON record stored in the metadata-pool object `obj` (`None`: there is none); `what`
/// names it in the error for a malformed one.
async fn load_record<T: serde::de::DeserializeOwned>(
    meta: &IoCtx,
    obj: &str,
    what: &str,
) -> Result<Option<T>> {
    match meta.read(obj, 0, 0).await {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| FsError::Malformed {
                what: what.into(),
                detail: e.to_string(),
            }),
        Err(ClientError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The advisory locks as the last checkpoint (or replay) stored them.
async fn load_locks(meta: &IoCtx) -> Result<LockTable> {
    let stored: Option<StoredLocks> =
        load_record(meta, journal::LOCKS_OBJECT, "lock table").await?;
    Ok(stored.map_or_else(LockTable::default, |s| LockTable::from_stored(&s)))
}

async fn save_locks(meta: &IoCtx, locks: &StoredLocks) -> Result<()> {
    meta.write_full(
        journal::LOCKS_OBJECT,
        serde_json::to_vec(locks).expect("serializable"),
    )
    .await?;
    Ok(())
}

/// The completed-request table as the last checkpoint (or replay) stored it.
async fn load_requests(meta: &IoCtx) -> Result<RequestTable> {
    let stored: Option<StoredRequests> =
        load_record(meta, journal::REQUESTS_OBJECT, "completed-request table").await?;
    Ok(stored.map(|s| s.table).unwrap_or_default())
}

async fn save_requests(meta: &IoCtx, table: &RequestTable) -> Result<()> {
    let rec = StoredRequests {
        v: RECORD_VERSION,
        table: table.clone(),
    };
    meta.write_full(
        journal::REQUESTS_OBJECT,
        serde_json::to_vec(&rec).expect("serializable"),
    )
    .await?;
    Ok(())
}

/// Moves the head to `to` and removes segments `from..to`.
async fn trim(meta: &IoCtx, from: u64, to: u64) -> Result<()> {
    let head = Head {
        v: RECORD_VERSION,
        first_segment: to,
    };
    meta.write_full(
        journal::HEAD_OBJECT,
        serde_json::to_vec(&head).expect("serializable"),
    )
    .await?;
    for s in from..to {
        match meta.remove(&journal::segment_object(s)).await {
            Ok(()) | Err(ClientError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[derive(Debug, Serialize, Deserialize)]
struct InoTable {
    v: u8,
    next_ino: Ino,
}

// early replies (unsafe until journaled)
/// The inode-number ranges recent takeovers skipped (`journal::ZONES_OBJECT`).
async fn load_zones(meta: &IoCtx) -> Result<Vec<Ino>> {
    let stored: Option<journal::StoredZones> =
        load_record(meta, journal::ZONES_OBJECT, "inode-number zones").await?;
    Ok(stored.map(|s| s.zones).unwrap_or_default())
}

// creates without a round trip (delegated inode numbers)
/// The inode-number ranges delegated to clients (`journal::DELEGATIONS_OBJECT`).
async fn load_delegations(meta: &IoCtx) -> Result<Vec<crate::core::Delegation>> {
    let stored: Option<journal::StoredDelegations> =
        load_record(meta, journal::DELEGATIONS_OBJECT, "delegated inode numbers").await?;
    Ok(stored.map(|s| s.ranges).unwrap_or_default())
}

async fn save_zones(meta: &IoCtx, zones: &[Ino]) -> Result<()> {
    let rec = journal::StoredZones {
        v: RECORD_VERSION,
        zones: zones.to_vec(),
    };
    meta.write_full(
        journal::ZONES_OBJECT,
        serde_json::to_vec(&rec).expect("serializable"),
    )
    .await?;
    Ok(())
}

/// Where a file system keeps its inodes ([`journal::StoredFormat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InodeLayout {
    /// One object per inode ([`inode_object`]): file systems made before the inode table.
    Objects,
    /// Omap keys in inode-table shards ([`inode_shard_object`]).
    Table,
}

/// What a file system with the inode table keeps in its root's old inode object: not an
/// inode record, so that an MDS built before the table, which reads the root from there,
/// refuses to start (a malformed root) instead of making an empty namespace beside the
/// stored one.
const ROOT_INODE_OBJECT_GUARD: &str = r#"{"v":255,"moved":"this file system keeps its inodes in the inode table (mds.inodes.*, see mds.format): this MDS is too old to serve it"}"#;

/// The file system's inode layout: as its format record says; a file system without one is
/// either new (it gets the inode table, recorded before anything else is written) or was
/// made before the record existed (its root has an inode object: it keeps that layout).
async fn inode_layout(meta: &IoCtx) -> Result<InodeLayout> {
    let stored: Option<journal::StoredFormat> =
        load_record(meta, journal::FORMAT_OBJECT, "file-system format").await?;
    let table = match stored {
        Some(f) => f.inode_table,
        None => {
            let old = match meta.stat(&inode_object(ROOT_INO)).await {
                Ok(_) => true,
                Err(ClientError::NotFound { .. }) => false,
                Err(e) => return Err(e.into()),
            };
            let rec = journal::StoredFormat {
                v: RECORD_VERSION,
                inode_table: !old,
            };
            meta.write_full(
                journal::FORMAT_OBJECT,
                serde_json::to_vec(&rec).expect("serializable"),
            )
            .await?;
            !old
        }
    };
    if !table {
        return Ok(InodeLayout::Objects);
    }
    // after the format record (which says how to read it), at every start: idempotent
    meta.write_full(&inode_object(ROOT_INO), ROOT_INODE_OBJECT_GUARD.as_bytes())
        .await?;
    Ok(InodeLayout::Table)
}

async fn load_inode(meta: &IoCtx, layout: InodeLayout, ino: Ino) -> Result<Option<Inode>> {
    let bytes = match layout {
        InodeLayout::Objects => match meta.read(&inode_object(ino), 0, 0).await {
            Ok(b) => b,
            Err(ClientError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        },
        InodeLayout::Table => {
            let key = inode_key(ino);
            let read = kelp_client::ReadOp::new().omap_get_vals_by_keys(&[&key]);
            match meta.operate_read(read, &inode_shard_object(ino)).await {
                Ok(mut r) => match r.pop() {
                    Some(kelp_client::ReadResult::Pairs { entries, .. }) => {
                        match entries.into_iter().find(|(k, _)| *k == key) {
                            Some((_, v)) => v,
                            None => return Ok(None),
                        }
                    }
                    other => {
                        return Err(FsError::Malformed {
                            what: format!("inode table read of {ino:x}"),
                            detail: format!("{other:?}"),
                        });
                    }
                },
                Err(ClientError::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    };
    let s: StoredInode = serde_json::from_slice(&bytes).map_err(|e| FsError::Malformed {
        what: format!("inode {ino:x}"),
        detail: e.to_string(),
    })?;
    Ok(Some(s.inode))
}

/// A directory's entries: the union of its `2^bits` fragment objects (`core::frag`).
async fn load_dir(meta: &IoCtx, ino: Ino, bits: u8) -> Result<BTreeMap<String, Dentry>> {
    let mut out = BTreeMap::new();
    let reads: Vec<futures::future::BoxFuture<'_, Result<OmapEntries>>> =
        frag::frag_objects(ino, bits)
            .map(|obj| -> futures::future::BoxFuture<'_, _> {
                Box::pin(async move { read_omap(meta, &obj).await })
            })
            .collect();
    let mut frags = futures::stream::iter(reads).buffer_unordered(16);
    while let Some(page) = frags.next().await {
        for (k, v) in page? {
            let d: StoredDentry = serde_json::from_slice(&v).map_err(|e| FsError::Malformed {
                what: format!("dentry {k} of {ino:x}"),
                detail: e.to_string(),
            })?;
            out.insert(k, d.dentry);
        }
    }
    Ok(out)
}

/// An object's omap entries: key, value.
type OmapEntries = Vec<(String, Vec<u8>)>;

/// Every omap entry of `obj` (none if it does not exist).
async fn read_omap(meta: &IoCtx, obj: &str) -> Result<OmapEntries> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let (page, more) = match meta.omap_get_vals(obj, &after, "", 1000).await {
            Ok(p) => p,
            Err(ClientError::NotFound { .. }) => return Ok(out),
            Err(e) => return Err(e.into()),
        };
        if let Some((k, _)) = page.last() {
            after = k.clone();
        }
        out.extend(page.into_iter().map(|(k, v)| (k, v.to_vec())));
        if !more {
            return Ok(out);
        }
    }
}

/// Moves the stored entries of `old` objects into directory `dir`'s layout of `2^bits`
/// fragments: each object is copied, then removed, so that a crash at any point leaves
/// every entry in an old object or in its new one (a replay moves the rest).
async fn move_fragments(meta: &IoCtx, dir: Ino, bits: u8, old: Vec<String>) -> Result<()> {
    for obj in old {
        let entries = read_omap(meta, &obj).await?;
        if !entries.is_empty() {
            let mut by_frag: BTreeMap<u32, Vec<(String, Vec<u8>)>> = BTreeMap::new();
            for (k, v) in entries {
                by_frag
                    .entry(frag::frag_of(&k, bits))
                    .or_default()
                    .push((k, v));
            }
            for (f, puts) in by_frag {
                let op = WriteOp::new().create(false).omap_set(&puts);
                meta.operate(op, &frag::frag_object(dir, bits, f)).await?;
            }
        }
        match meta.remove(&obj).await {
            Ok(()) | Err(ClientError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

async fn load_strays(meta: &IoCtx) -> Result<Vec<Ino>> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let (page, more) = match meta
            .omap_get_vals(journal::STRAY_OBJECT, &after, "", 1000)
            .await
        {
            Ok(p) => p,
            Err(ClientError::NotFound { .. }) => return Ok(out),
            Err(e) => return Err(e.into()),
        };
        for (k, _) in page {
            if let Ok(i) = Ino::from_str_radix(&k, 16) {
                out.push(i);
            }
            after = k;
        }
        if !more {
            return Ok(out);
        }
    }
}

/// Writes a run of updates to the objects, last update per key winning.
async fn apply_updates(meta: &IoCtx, layout: InodeLayout, updates: &[Update]) -> Result<()> {
    let mut inodes: HashMap<Ino, Option<&Inode>> = HashMap::new();
    // directories: their entries, layouts and removal (`core::frag`)
    let dirs = frag::plan_dirs(updates);
    let mut next_ino = None;
    let mut strays: BTreeMap<Ino, bool> = BTreeMap::new();
    // inline data: the last change of each file's
    let mut inline: HashMap<Ino, Option<&InlineData>> = HashMap::new();
    for u in updates {
        match u {
            Update::PutInline { ino, data } => {
                inline.insert(*ino, Some(data));
            }
            Update::DelInline(ino) => {
                inline.insert(*ino, None);
            }
            Update::PutInode(i) => {
                inodes.insert(i.ino, Some(i));
            }
            Update::DelInode(i) => {
                inodes.insert(*i, None);
            }
            Update::PutDentry { .. }
            | Update::DelDentry { .. }
            | Update::DelDir(_)
            | Update::Fragment { .. } => {}
            Update::NextIno(n) => next_ino = Some(next_ino.unwrap_or(0).max(*n)),
            Update::AddStray(i) => {
                strays.insert(*i, true);
            }
            Update::DelStray(i) => {
                strays.insert(*i, false);
            }
            // the completed-request table is written whole (`save_requests`)
            Update::Request { .. } => {}
            // the lock table is written whole (`save_locks`)
            Update::Locks { .. } => {}
        }
    }
    // first the directories that changed layout: their entries move to the new fragments
    // before anything is written there
    let mut moves: Vec<futures::future::BoxFuture<'_, Result<()>>> = Vec::new();
    for (dir, plan) in &dirs {
        let old = plan.old_objects(*dir);
        if !old.is_empty() {
            moves.push(Box::pin(move_fragments(meta, *dir, plan.bits, old)));
        }
    }
    let mut moves = futures::stream::iter(moves).buffer_unordered(16);
    while let Some(r) = moves.next().await {
        r?;
    }
    drop(moves);
    let mut jobs: Vec<futures::future::BoxFuture<'_, Result<()>>> = Vec::new();
    match layout {
        InodeLayout::Objects => {
            for (ino, i) in inodes {
                jobs.push(Box::pin(async move {
                    match i {
                        Some(i) => {
                            meta.write_full(&inode_object(ino), inode_record(i)).await?;
                        }
                        None => match meta.remove(&inode_object(ino)).await {
                            Ok(()) | Err(ClientError::NotFound { .. }) => {}
                            Err(e) => return Err(e.into()),
                        },
                    }
                    Ok(())
                }));
            }
        }
        InodeLayout::Table => {
            // one omap update per shard, whatever the number of its inodes that changed
            type ShardChange = (Vec<(String, Vec<u8>)>, Vec<String>);
            let mut shards: BTreeMap<String, ShardChange> = BTreeMap::new();
            for (ino, i) in inodes {
                let (puts, dels) = shards.entry(inode_shard_object(ino)).or_default();
                match i {
                    Some(i) => puts.push((inode_key(ino), inode_record(i))),
                    None => dels.push(inode_key(ino)),
                }
            }
            for (object, (puts, dels)) in shards {
                jobs.push(Box::pin(async move {
                    meta.operate(omap_change(&puts, &dels), &object).await?;
                    // a shard whose inodes are all gone goes too (only this MDS writes
                    // shards, one checkpoint at a time: nothing adds a key meanwhile)
                    if puts.is_empty() && meta.omap_get_vals(&object, "", "", 1).await?.0.is_empty()
                    {
                        match meta.remove(&object).await {
                            Ok(()) | Err(ClientError::NotFound { .. }) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Ok(())
                }));
            }
        }
    }
    for (dir, plan) in &dirs {
        if plan.removed {
            for obj in plan.all_objects(*dir) {
                jobs.push(Box::pin(async move {
                    match meta.remove(&obj).await {
                        Ok(()) | Err(ClientError::NotFound { .. }) => Ok(()),
                        Err(e) => Err(e.into()),
                    }
                }));
            }
            continue;
        }
        for frag::FragWrite { object, puts, dels } in plan.writes(*dir) {
            jobs.push(Box::pin(async move {
                let puts: Vec<(&str, Vec<u8>)> = puts
                    .into_iter()
                    .map(|(n, d)| {
                        let rec = StoredDentry {
                            v: RECORD_VERSION,
                            dentry: d,
                        };
                        (n, serde_json::to_vec(&rec).expect("serializable"))
                    })
                    .collect();
                meta.operate(omap_change(&puts, &dels), &object).await?;
                Ok(())
            }));
        }
    }
    // one omap update per inline shard
    type InlineChange<'a> = (Vec<(String, &'a [u8])>, Vec<String>);
    let mut inline_shards: BTreeMap<String, InlineChange> = BTreeMap::new();
    for (ino, d) in inline {
        let (puts, dels) = inline_shards.entry(inline_shard_object(ino)).or_default();
        match d {
            Some(d) => puts.push((inode_key(ino), &d.0[..])),
            None => dels.push(inode_key(ino)),
        }
    }
    for (object, (puts, dels)) in inline_shards {
        jobs.push(Box::pin(async move {
            meta.operate(omap_change(&puts, &dels), &object).await?;
            Ok(())
        }));
    }
    if let Some(n) = next_ino {
        jobs.push(Box::pin(async move {
            let t = InoTable {
                v: RECORD_VERSION,
                next_ino: n,
            };
            meta.write_full(
                journal::INOTABLE_OBJECT,
                serde_json::to_vec(&t).expect("serializable"),
            )
            .await?;
            Ok(())
        }));
    }
    if !strays.is_empty() {
        jobs.push(Box::pin(async move {
            let add: Vec<(String, &[u8])> = strays
                .iter()
                .filter(|(_, a)| **a)
                .map(|(i, _)| (format!("{i:x}"), &b""[..]))
                .collect();
            let del: Vec<String> = strays
                .iter()
                .filter(|(_, a)| !**a)
                .map(|(i, _)| format!("{i:x}"))
                .collect();
            meta.operate(omap_change(&add, &del), journal::STRAY_OBJECT)
                .await?;
            Ok(())
        }));
    }
    let mut results = futures::stream::iter(jobs).buffer_unordered(16);
    while let Some(r) = results.next().await {
        r?;
    }
    Ok(())
}

/// The inline data of `ino` as the last write-back stored it (`None`: none).
async fn load_inline(meta: &IoCtx, ino: Ino) -> Result<Option<Bytes>> {
    let key = inode_key(ino);
    let read = kelp_client::ReadOp::new().omap_get_vals_by_keys(&[&key]);
    match meta.operate_read(read, &inline_shard_object(ino)).await {
        Ok(mut r) => match r.pop() {
            Some(kelp_client::ReadResult::Pairs { entries, .. }) => {
                Ok(entries.into_iter().find(|(k, _)| *k == key).map(|(_, v)| v))
            }
            other => Err(FsError::Malformed {
                what: format!("inline data read of {ino:x}"),
                detail: format!("{other:?}"),
            }),
        },
        Err(ClientError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// An inode as stored.
fn inode_record(i: &Inode) -> Vec<u8> {
    let rec = StoredInode {
        v: RECORD_VERSION,
        inode: i.clone(),
    };
    serde_json::to_vec(&rec).expect("serializable")
}

/// One write of an omap object: creates it if missing (an object whose first key was added
/// and removed between two checkpoints may not exist yet), sets `puts`, removes `dels`.
fn omap_change<K: AsRef<str>, V: AsRef<[u8]>, D: AsRef<str>>(
    puts: &[(K, V)],
    dels: &[D],
) -> WriteOp {
    let mut op = WriteOp::new().create(false);
    if !puts.is_empty() {
        op = op.omap_set(puts);
    }
    if !dels.is_empty() {
        op = op.omap_rm_keys(dels);
    }
    op
}

impl Inner {
    /// Maps a RADOS error, noting when it means this MDS has been fenced.
    fn check_fenced(&self, e: ClientError) -> FsError {
        if let ClientError::Blocklisted(m) = &e {
            error!("this MDS has been blocklisted: {m}; stopping");
            self.fenced.send_replace(Some(m.clone()));
            return FsError::Fenced(m.clone());
        }
        e.into()
    }

    /// [`Inner::check_fenced`] for a RADOS error inside an [`FsError`].
    fn fenced_error(&self, e: FsError) -> FsError {
        match e {
            FsError::Rados(c) => self.check_fenced(c),
            e => e,
        }
    }

    /// The cache already holds an update whose journal entry failed: later ops would build
    /// on a change that replay cannot know of. So the MDS stops serving (as if fenced): it
    /// exits, and a standby or a restart replays the journal, which holds only what was
    /// acknowledged.
    fn stop_on_journal_failure(&self, e: &FsError) {
        error!("journal write failed: {e}; stopping so that a replay rebuilds the namespace");
        if !self.is_fenced() {
            self.fenced
                .send_replace(Some(format!("journal write failed: {e}")));
        }
    }

    fn is_fenced(&self) -> bool {
        self.fenced.borrow().is_some()
    }

    /// Runs one client operation to its reply, with the capabilities the reply grants and
    /// whether it is unsafe (applied, and answered before its journal entry is in RADOS).
    async fn handle(
        &self,
        req: RequestId,
        caller: Caller,
        op: &Op,
    ) -> (Reply, Option<CapGrants>, bool) {
        let (
            Handled {
                reply,
                seq,
                retried,
            },
            grants,
        ) = match self.handle_safe(req, caller, op).await {
            Ok(r) => r,
            Err(reply) => return (reply, None, false),
        };
        // early replies (unsafe until journaled)
        let client = req.client;
        // (a client writes the data objects of a file once its inline data is moved out:
        // that must be journaled first, or an MDS taking over would move it out again, over
        // those writes)
        let early = req.tid != 0 && op.is_mutation() && !matches!(op, Op::Uninline { .. });
        let mut wait = match seq {
            Some(s) if !early || s > self.committed() + MAX_UNSAFE_ENTRIES => Some(s),
            // a retry answered from the table: what it answers may not be journaled yet
            None if retried => Some(self.assigned()),
            _ => None,
        };
        // what the reply shows of another client's change waits for that change's entry
        wait = wait.max(self.unjournaled_dependency(client, op, &reply));
        if let Some(s) = wait
            && !self.wait_committed(s).await
        {
            return (Reply::Err(errno::ESHUTDOWN), None, false);
        }
        let unsafe_reply = seq.is_some_and(|s| s > self.committed());
        (reply, grants, unsafe_reply)
    }

    /// [`Inner::handle`] up to the journal: the reply, its grants, the seq of the entry
    /// it queued and whether it was answered from the completed-request table; `Err`: a
    /// reply to send as it is.
    async fn handle_safe(
        &self,
        req: RequestId,
        caller: Caller,
        op: &Op,
    ) -> std::result::Result<(Handled, Option<CapGrants>), Reply> {
        let client = req.client;
        if self.is_fenced() {
            return Err(Reply::Err(errno::ESHUTDOWN));
        }
        if let Op::Sync = op {
            // every change applied before this request arrived is journaled on return
            return Err(if self.wait_committed(self.assigned()).await {
                Reply::Ok
            } else {
                Reply::Err(errno::ESHUTDOWN)
            });
        }
        if client != 0 {
            self.last_seen
                .lock()
                .expect("last_seen lock")
                .insert(client, std::time::Instant::now());
        }
        if let Op::SetXattr { name, .. } = op
            && name.ends_with(".layout.pool")
        {
            // a pool added to the file system since this MDS started may be named
            match data_pools(&self.rados, &self.cfg).await {
                Ok(pools) => {
                    let default = self.data.pool_id();
                    self.state.lock().await.ns.set_data_pools(pools, default);
                }
                Err(e) => warn!("reading the file system's data pools: {e}"),
            }
        }
        if let Op::CapPoll { ack } = op {
            return Err(self.cap_poll(client, ack).await);
        }
        if let Op::GetXattr { name, .. } = op
            && name == STATS_XATTR
        {
            let stats = self.stats().await;
            return Err(Reply::Xattr(
                serde_json::to_vec(&stats).expect("serializable"),
            ));
        }
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A full cluster: changes that would take space are refused up front; deletes and
        // truncates go on (the journal writes past the full flag, `set_full_try`), so that
        // users can free space. Reads, lookups, opens and closes go on.
        // (a create its mount answered before the flag was set is made: the file exists for
        // its program already, and the mount answers none itself while the flag is set)
        if !op.allowed_when_full() && !req.delegated && self.meta.rados().cluster_full() {
            return Err(Reply::Err(errno::ENOSPC));
        }
        if settles_every_excl(op) {
            let ids = self.revoke_all_excl();
            self.wait_revokes(client, &ids).await;
        }
        if let Op::TakeInos = op {
            return Err(self.take_inos(client).await);
        }
        let (reply, grants, mut revokes, seq, retried, st) = loop {
            let mut st = self.state.lock().await;
            if self.is_fenced() {
                // stopped while this op waited for the lock
                return Err(Reply::Err(errno::ESHUTDOWN));
            }
            if op.is_mutation()
                && self.backlog.load(std::sync::atomic::Ordering::Relaxed) >= self.cfg.max_backlog
            {
                // a change waits while the backlog is full; checked under the state lock, so
                // requests arriving together (creates sent behind come many at once) never
                // overshoot the bound
                drop(st);
                if !self.wait_for_backlog().await {
                    return Err(Reply::Err(errno::ESHUTDOWN));
                }
                continue;
            }
            let retried = req.tid != 0 && op.is_mutation() && st.ns.completed(client, req.tid);
            // Another client's exclusive capability on the inodes is settled first: its
            // holder flushes the size and mtime it deferred (or sends the creates it
            // answered itself) before it acknowledges.
            let (ino, wait) = excl_targets(op)
                .into_iter()
                .map(|ino| (ino, self.revoke_excl(client, ino)))
                .find(|(_, wait)| !wait.is_empty())
                .unwrap_or_default();
            if wait.is_empty() {
                match self.apply_locked(&mut st, req, caller, op).await {
                    Applied::Done(reply, grants, revokes, seq) => {
                        break (reply, grants, revokes, seq, retried, st);
                    }
                    Applied::Excl(ino, wait) => {
                        drop(st);
                        self.wait_excl(client, ino, &wait).await;
                    }
                }
            } else {
                drop(st);
                self.wait_excl(client, ino, &wait).await;
            }
        };
        // metrics: the cache's size after this op
        self.metrics.cached_inodes.set(st.ns.cached_inodes() as i64);
        let key = (client, req.tid);
        let tracked = req.tid != 0 && op.is_mutation();
        if tracked {
            let mut waiting = self.revoking.lock().expect("revoking lock");
            if revokes.is_empty() {
                // a retry answered from the table: its original may still wait for revokes
                revokes = waiting.get(&key).cloned().unwrap_or_default();
            } else {
                waiting.insert(key, revokes.clone());
            }
        }
        drop(st);
        if !revokes.is_empty() {
            self.wait_revokes(client, &revokes).await;
        }
        if tracked {
            self.revoking.lock().expect("revoking lock").remove(&key);
        }
        Ok((
            Handled {
                reply,
                seq,
                retried,
            },
            grants,
        ))
    }

    // early replies (unsafe until journaled)
    /// The last seq given to a journal entry.
    fn assigned(&self) -> u64 {
        self.queue.lock().expect("journal queue lock").assigned
    }

    /// The last seq in RADOS.
    fn committed(&self) -> u64 {
        *self.committed.borrow()
    }

    /// Waits until the entry `seq` is in RADOS; `false` if the MDS stopped first (its
    /// journal failed or it was fenced).
    async fn wait_committed(&self, seq: u64) -> bool {
        let mut done = self.committed.subscribe();
        let mut fenced = self.fenced.subscribe();
        if *done.borrow_and_update() >= seq {
            return true;
        }
        let _waiting = JournalWaiter::new(self);
        loop {
            if *done.borrow_and_update() >= seq {
                return true;
            }
            if fenced.borrow_and_update().is_some() {
                return false;
            }
            tokio::select! {
                r = done.changed() => if r.is_err() { return false },
                r = fenced.changed() => if r.is_err() { return false },
            }
        }
    }

    /// The latest unjournaled entry of another client that changed an inode `op` names or
    /// `reply` answers with (the reply waits for it: no client sees a change that a takeover
    /// could lose while the client that made it is not there to send it again).
    fn unjournaled_dependency(&self, client: u64, op: &Op, reply: &Reply) -> Option<u64> {
        let q = self.queue.lock().expect("journal queue lock");
        if q.unjournaled.is_empty() {
            return None;
        }
        let committed = self.committed();
        let answered = match reply {
            Reply::Attr(i) => Some(i.ino),
            _ => None,
        };
        named_inos(op)
            .into_iter()
            .chain(answered)
            .filter_map(|i| q.unjournaled.get(&i))
            .filter(|(c, s)| *c != client && *s > committed)
            .map(|(_, s)| *s)
            .max()
    }

    /// Revokes other clients' exclusive capability on `ino` (see `CapTable::revoke_excl`);
    /// returns the revokes to wait for.
    fn revoke_excl(&self, client: u64, ino: Ino) -> Vec<u64> {
        let now = self.now_ms();
        let ids = self
            .caps
            .lock()
            .expect("caps lock")
            .table
            .revoke_excl(client, ino, now);
        self.revokes_queued(ids)
    }

    /// Wakes the revoke polls when `ids` (revokes just issued) is not empty; returns them.
    fn revokes_queued(&self, ids: Vec<u64>) -> Vec<u64> {
        if !ids.is_empty() {
            self.caps_changed.send_modify(|n| *n += 1);
        }
        ids
    }

    /// Revokes every exclusive capability (a quota or layout change); returns the revokes.
    fn revoke_all_excl(&self) -> Vec<u64> {
        let now = self.now_ms();
        let ids = self
            .caps
            .lock()
            .expect("caps lock")
            .table
            .revoke_all_excl(now);
        self.revokes_queued(ids)
    }

    // creates without a round trip (delegated inode numbers)
    /// Delegates a range of inode numbers to `client` ([`Op::TakeInos`]), stored before the
    /// answer (under the state lock, so that two stores never cross).
    async fn take_inos(&self, client: u64) -> Reply {
        let mut st = self.state.lock().await;
        let d = st.ns.delegate(client);
        let stored = journal::StoredDelegations {
            v: RECORD_VERSION,
            ranges: st.ns.delegations().to_vec(),
        };
        match self
            .meta
            .write_full(
                journal::DELEGATIONS_OBJECT,
                serde_json::to_vec(&stored).expect("serializable"),
            )
            .await
        {
            Ok(_) => Reply::Inos {
                start: d.start,
                end: d.end,
            },
            Err(e) => {
                let e = self.check_fenced(e);
                warn!("storing the delegated inode numbers: {e}");
                Reply::Err(e.errno())
            }
        }
    }

    /// Waits for the exclusive capability on `ino` to settle (no new one is granted on it
    /// meanwhile).
    async fn wait_excl(&self, client: u64, ino: Ino, ids: &[u64]) {
        *self
            .caps
            .lock()
            .expect("caps lock")
            .excl_waiters
            .entry(ino)
            .or_default() += 1;
        self.wait_revokes(client, ids).await;
        let mut caps = self.caps.lock().expect("caps lock");
        if let Some(n) = caps.excl_waiters.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                caps.excl_waiters.remove(&ino);
            }
        }
    }

    /// The state-locked part of [`Inner::handle`]: applies `op`, journals it, revokes what
    /// it changed from the other clients and grants what the reply lets this one cache.
    async fn apply_locked(
        &self,
        st: &mut State,
        req: RequestId,
        caller: Caller,
        op: &Op,
    ) -> Applied {
        let client = req.client;
        for _ in 0..64 {
            if let Some(child) = removed_dir_entry(op).and_then(|(p, n)| st.ns.cached_child(p, n)) {
                // creates another client answered itself in it come first
                let wait = self.revoke_excl(client, child);
                if !wait.is_empty() {
                    return Applied::Excl(child, wait);
                }
            }
            if let Op::Uninline { ino } = op
                && let Some(i) = st.ns.cached(*ino).filter(|i| i.inline).cloned()
            {
                // the data goes to the file's first object before the inode says so
                let written = match st.ns.inline_data(&i) {
                    Some(d) => self.write_out_inline(&i, d).await,
                    None => match load_inline(&self.meta, i.ino).await {
                        Ok(d) => {
                            st.ns.insert_inline(i.ino, d);
                            continue;
                        }
                        Err(e) => Err(e),
                    },
                };
                if let Err(e) = written {
                    warn!(ino = i.ino, "moving inline data out to its object: {e}");
                    return Applied::Done(Reply::Err(e.errno()), None, Vec::new(), None);
                }
            }
            let step = st.ns.apply_request(req, caller, op, Time::now());
            match step {
                Step::Need(need) => {
                    let loaded = match need {
                        Need::Inode(ino) => match load_inode(&self.meta, self.layout, ino).await {
                            Ok(Some(i)) => {
                                st.ns.insert_inode(i);
                                Ok(())
                            }
                            Ok(None) => {
                                return Applied::Done(
                                    Reply::Err(errno::ENOENT),
                                    None,
                                    Vec::new(),
                                    None,
                                );
                            }
                            Err(e) => Err(e),
                        },
                        Need::Probe(ino) => match load_inode(&self.meta, self.layout, ino).await {
                            Ok(Some(i)) => {
                                st.ns.insert_inode(i);
                                Ok(())
                            }
                            Ok(None) => {
                                st.ns.note_absent(ino);
                                Ok(())
                            }
                            Err(e) => Err(e),
                        },
                        Need::Inline(ino) => match load_inline(&self.meta, ino).await {
                            Ok(d) => {
                                st.ns.insert_inline(ino, d);
                                Ok(())
                            }
                            Err(e) => Err(e),
                        },
                        Need::Dir(ino) => {
                            match load_dir(&self.meta, ino, st.ns.frag_bits(ino)).await {
                                Ok(d) => {
                                    st.ns.insert_dir(ino, d);
                                    Ok(())
                                }
                                Err(e) => Err(e),
                            }
                        }
                    };
                    if let Err(e) = loaded {
                        warn!("loading {need:?}: {e}");
                        return Applied::Done(Reply::Err(e.errno()), None, Vec::new(), None);
                    }
                }
                Step::Done {
                    reply,
                    updates,
                    invalidate,
                } => {
                    let mut revokes = Vec::new();
                    let mut changed = Vec::new();
                    let mut seq = None;
                    if updates.is_empty()
                        && let Reply::Attr(i) = &reply
                    {
                        // an answer about an inode found on the way (a lookup): another
                        // client's exclusive capability on it settles first
                        let wait = self.revoke_excl(client, i.ino);
                        if !wait.is_empty() {
                            return Applied::Excl(i.ino, wait);
                        }
                    }
                    if !updates.is_empty() {
                        let deleted: Vec<Ino> = updates
                            .iter()
                            .filter_map(|u| match u {
                                Update::DelInode(i) => Some(*i),
                                _ => None,
                            })
                            .collect();
                        seq = Some(self.journal(st, client, updates));
                        (revokes, changed) = self.revoke_changed(client, op, &invalidate, &deleted);
                        if settles_every_excl(op) {
                            // settled before, and again for any granted meanwhile: nothing is
                            // deferred or created by a client under the new rules unchecked
                            revokes.extend(self.revoke_all_excl());
                        }
                    }
                    // write-back (the exclusive capability) only where no byte quota is
                    // above the file: the MDS checks a growth when it learns of it
                    let excl_ok = match (op, &reply) {
                        (
                            Op::Open { .. }
                            | Op::Written { .. }
                            | Op::WrittenInline { .. }
                            | Op::GetAttr { .. }
                            | Op::Mknod { open: true, .. },
                            Reply::Attr(i),
                        ) => st.ns.byte_quota_above(i.ino) == Some(false),
                        // a directory's maker may create in it by itself where nothing above
                        // needs checking (`core::delegate`)
                        (Op::Mkdir { .. }, Reply::Attr(i)) => st.ns.creates_delegable(i.ino),
                        _ => false,
                    };
                    let answered = match &reply {
                        Reply::Attr(i) => i.ino,
                        _ => 0,
                    };
                    let updated: Vec<Inode> = changed
                        .iter()
                        .filter(|i| **i != answered)
                        .filter_map(|i| st.ns.cached(*i).cloned())
                        .collect();
                    let grants =
                        self.grant_for_reply(client, op, &reply, changed, updated, excl_ok);
                    return Applied::Done(reply, grants, revokes, seq);
                }
            }
        }
        Applied::Done(Reply::Err(errno::EIO), None, Vec::new(), None)
    }

    /// Writes inline file `i`'s data to its first data object ([`Op::Uninline`]).
    async fn write_out_inline(&self, i: &Inode, data: Bytes) -> Result<()> {
        let io = match i.layout.pool {
            Some(p) if p != self.data.pool_id() => self.rados.ioctx_by_id(p)?,
            _ => self.data.clone(),
        };
        io.write_full(&data_object(i.ino, 0), data)
            .await
            .map(drop)
            .map_err(|e| self.check_fenced(e))
    }

    fn now_ms(&self) -> u64 {
        self.activated.elapsed().as_millis() as u64
    }

    /// A change by `client` was journaled: revokes what other clients may cache of the
    /// changed inodes and directories. Returns the revokes to wait for and the inodes that
    /// changed (the changer drops its own cached copies of them).
    fn revoke_changed(
        &self,
        client: u64,
        op: &Op,
        inval: &Invalidate,
        deleted: &[Ino],
    ) -> (Vec<u64>, Vec<Ino>) {
        // a change of the data (size, contents) takes the read cache too; an attribute
        // change leaves the pages valid
        let data_change = matches!(
            op,
            Op::Written { .. }
                | Op::WrittenInline { .. }
                | Op::Uninline { .. }
                | Op::SetAttr {
                    set: SetAttr { size: Some(_), .. },
                    ..
                }
        );
        let mut what: BTreeMap<Ino, (u8, Vec<String>)> = BTreeMap::new();
        for ino in &inval.inodes {
            let mask = if data_change || deleted.contains(ino) {
                CAP_ALL
            } else {
                CAP_SHARED | CAP_EXCL
            };
            what.entry(*ino).or_default().0 |= mask;
        }
        for (dir, name) in &inval.entries {
            let e = what.entry(*dir).or_default();
            e.0 |= CAP_SHARED | CAP_EXCL;
            e.1.push(name.clone());
        }
        let now = self.now_ms();
        let mut caps = self.caps.lock().expect("caps lock");
        let mut ids = Vec::new();
        for (ino, (mask, names)) in &what {
            ids.extend(
                caps.table
                    .revoke_for_change(client, *ino, *mask, names, now),
            );
        }
        drop(caps);
        if !ids.is_empty() {
            self.metrics.revoked_change.inc_by(ids.len() as u64);
            self.caps_changed.send_modify(|n| *n += 1);
        }
        (ids, what.into_keys().collect())
    }

    /// What the reply to `op` lets `client` cache: the attributes it carries, the entry's
    /// directory for an entry reply, and the read cache for an open. Nothing for a client
    /// that keeps no revoke poll (it could not be told to drop it).
    ///
    /// The exclusive capability (`excl_ok`: no byte quota above the file) comes with an
    /// open for writing, and is renewed by a `Written` asking for it and by a `GetAttr` of
    /// a client that holds it; never while another request waits for it to settle.
    fn grant_for_reply(
        &self,
        client: u64,
        op: &Op,
        reply: &Reply,
        changed: Vec<Ino>,
        updated: Vec<Inode>,
        excl_ok: bool,
    ) -> Option<CapGrants> {
        let mut want: Vec<(Ino, u8)> = Vec::new();
        // Some(true): asks for it; Some(false): keeps it if held
        let excl = match op {
            Op::Open { write: true, .. }
            | Op::Mknod {
                open: true,
                write: true,
                ..
            } => Some(true),
            Op::Written { renew: true, .. }
            | Op::WrittenInline { renew: true, .. }
            | Op::GetAttr { .. } => Some(false),
            Op::Mkdir { .. } => Some(true),
            _ => None,
        }
        .filter(|_| excl_ok);
        let mut excl_for = None;
        match (op, reply) {
            // the read cache comes with an open, and with the attributes a read through the
            // page cache asks for (so the pages it leaves are revoked with the next change)
            (Op::Open { .. } | Op::GetAttr { .. }, Reply::Attr(i)) => {
                let read = if i.kind() == S_IFREG { CAP_READ } else { 0 };
                want.push((i.ino, CAP_SHARED | read));
                if i.kind() == S_IFREG {
                    excl_for = excl.map(|ask| (i.ino, ask));
                }
            }
            (Op::Written { .. } | Op::WrittenInline { .. }, Reply::Attr(i)) => {
                want.push((i.ino, CAP_SHARED));
                excl_for = excl.map(|ask| (i.ino, ask));
            }
            // a create that also opens: the entry's grants and an open's
            (
                Op::Mknod {
                    parent, open: true, ..
                },
                Reply::Attr(i),
            ) => {
                want.push((*parent, CAP_SHARED));
                let read = if i.kind() == S_IFREG { CAP_READ } else { 0 };
                want.push((i.ino, CAP_SHARED | read));
                if i.kind() == S_IFREG {
                    excl_for = excl.map(|ask| (i.ino, ask));
                }
            }
            // a new directory: its maker holds it exclusively, to create in it by itself
            (Op::Mkdir { parent, .. }, Reply::Attr(i)) => {
                want.push((*parent, CAP_SHARED));
                want.push((i.ino, CAP_SHARED));
                excl_for = excl.map(|ask| (i.ino, ask));
            }
            (
                Op::Lookup { parent, .. }
                | Op::Mknod { parent, .. }
                | Op::Symlink { parent, .. }
                | Op::Link { parent, .. },
                Reply::Attr(i),
            ) => {
                want.push((*parent, CAP_SHARED));
                want.push((i.ino, CAP_SHARED));
            }
            (_, Reply::Attr(i)) => want.push((i.ino, CAP_SHARED)),
            (Op::ReadDir { ino, .. }, Reply::Entries { .. }) => want.push((*ino, CAP_SHARED)),
            _ => {}
        }
        let now = self.now_ms();
        let mut caps = self.caps.lock().expect("caps lock");
        let live = caps
            .polls
            .get(&client)
            .is_some_and(|t| t.elapsed() < CAP_SESSION_GRACE);
        let mut granted = Vec::new();
        if live {
            if let Some((ino, ask)) = excl_for
                && !caps.excl_waiters.contains_key(&ino)
                && (ask || caps.table.held(client, ino, now) & CAP_EXCL != 0)
                && let Some(w) = want.iter_mut().find(|(i, _)| *i == ino)
            {
                w.1 |= CAP_READ | CAP_EXCL;
            }
            for (ino, w) in want {
                let g = caps.table.grant(client, ino, w, now);
                if g.granted != 0 {
                    granted.push((ino, g.granted));
                }
            }
        }
        drop(caps);
        self.metrics.caps_granted.inc_by(granted.len() as u64);
        if granted.is_empty() && changed.is_empty() {
            return None;
        }
        Some(CapGrants {
            v: PROTOCOL_VERSION,
            lease_ms: CAP_LEASE.as_millis() as u64,
            caps: granted,
            changed,
            updated,
        })
    }

    /// Waits until every revoke in `ids` is acknowledged, expired, or owed by a client that
    /// lost its session (stopped polling) or is itself waiting for revokes.
    async fn wait_revokes(&self, client: u64, ids: &[u64]) {
        let mut rx = self.caps_changed.subscribe();
        *self
            .caps
            .lock()
            .expect("caps lock")
            .waiting
            .entry(client)
            .or_default() += 1;
        loop {
            let now = self.now_ms();
            let pending = {
                let mut caps = self.caps.lock().expect("caps lock");
                let owing = caps.table.unsettled_clients(ids, now);
                let mut still = false;
                for c in owing {
                    let alive = caps
                        .polls
                        .get(&c)
                        .is_some_and(|t| t.elapsed() < CAP_SESSION_GRACE);
                    if !alive {
                        info!(
                            client = c,
                            "client stopped polling for revokes: dropping its capabilities"
                        );
                        caps.table.drop_client(c);
                        caps.polls.remove(&c);
                    } else if !caps.waiting.contains_key(&c) {
                        still = true;
                    }
                }
                still
            };
            if !pending {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(250), rx.changed()).await;
        }
        let mut caps = self.caps.lock().expect("caps lock");
        if let Some(n) = caps.waiting.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                caps.waiting.remove(&client);
            }
        }
    }

    /// A client's revoke poll: takes its acknowledgements, then answers with its revokes
    /// as soon as there are some (or with none after `CAP_POLL_WINDOW`).
    async fn cap_poll(&self, client: u64, ack: &[u64]) -> Reply {
        let mut rx = self.caps_changed.subscribe();
        {
            let mut caps = self.caps.lock().expect("caps lock");
            caps.polls.insert(client, std::time::Instant::now());
            if !ack.is_empty() {
                caps.table.ack(client, ack);
            }
        }
        if !ack.is_empty() {
            self.caps_changed.send_modify(|n| *n += 1);
        }
        let deadline = tokio::time::Instant::now() + CAP_POLL_WINDOW;
        loop {
            {
                let mut caps = self.caps.lock().expect("caps lock");
                if caps.table.has_outbox(client) {
                    return Reply::Revokes(caps.table.take_outbox(client));
                }
            }
            if self.is_fenced() {
                return Reply::Err(errno::ESHUTDOWN);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return Reply::Revokes(Vec::new()),
            }
        }
    }

    async fn stats(&self) -> MdsStats {
        let (cached_inodes, inline_bytes) = {
            let st = self.state.lock().await;
            (st.ns.cached_inodes(), st.ns.inline_bytes())
        };
        let cap_inodes = self
            .caps
            .lock()
            .expect("caps lock")
            .table
            .inodes_with_grants();
        MdsStats {
            requests: self.requests.load(std::sync::atomic::Ordering::Relaxed),
            cached_inodes,
            cache_budget: self.cfg.cache_inodes,
            cap_inodes,
            ops: self.metrics.op_counts(),
            unwritten_updates: self.backlog.load(std::sync::atomic::Ordering::Relaxed),
            inline_bytes,
        }
    }

    /// The memory budget: revokes the capabilities of the least recently used inodes beyond
    /// `cache_inodes` (so that no client pins them), and forgets expired leases.
    fn enforce_cap_budget(&self) {
        let now = self.now_ms();
        let mut caps = self.caps.lock().expect("caps lock");
        let ids = caps.table.enforce_budget(self.cfg.cache_inodes, now);
        caps.polls
            .retain(|_, t| t.elapsed() < CAP_SESSION_GRACE * 6);
        drop(caps);
        if !ids.is_empty() {
            self.metrics.revoked_budget.inc_by(ids.len() as u64);
            debug!(revokes = ids.len(), "capability budget");
            self.caps_changed.send_modify(|n| *n += 1);
        }
    }

    /// Queues one entry of `client`'s updates for the journal and returns its seq (the
    /// writer appends it soon, with whatever else has queued; [`Inner::wait_committed`]
    /// waits for it). Called with the state locked, so seqs follow the order the changes
    /// were applied in.
    fn journal(&self, st: &mut State, client: u64, updates: Vec<Update>) -> u64 {
        let mut q = self.queue.lock().expect("journal queue lock");
        q.assigned += 1;
        let seq = q.assigned;
        let entry = Entry {
            v: journal::JOURNAL_VERSION,
            seq,
            updates,
        };
        let bytes = journal::encode(&entry);
        for ino in updated_inos(&entry.updates) {
            q.unjournaled.insert(ino, (client, seq));
        }
        q.entries.push(Queued::Entry(seq, bytes));
        drop(q);
        let backlog = self
            .backlog
            .fetch_add(entry.updates.len(), std::sync::atomic::Ordering::Relaxed)
            + entry.updates.len();
        if backlog >= self.cfg.max_backlog / 2 {
            // under a heavy load checkpoints run back to back rather than every interval,
            // so that changes seldom find the backlog full
            self.checkpoint_now.notify_one();
        }
        st.pending.extend(entry.updates);
        self.kick.notify_one();
        seq
    }

    /// Appends everything queued, in order, a batch per RADOS append, and closes the segment
    /// where a checkpoint asked. A failed append stops the MDS (the cache holds changes the
    /// journal lacks).
    async fn flush_journal(&self) -> Result<()> {
        let mut w = self.writer.lock().await;
        loop {
            let (bytes, last) = {
                let mut q = self.queue.lock().expect("journal queue lock");
                if let Some(Queued::Roll(_)) = q.entries.first()
                    && let Queued::Roll(tx) = q.entries.remove(0)
                {
                    drop(q);
                    if w.segment_bytes > 0 {
                        self.close_segment(&mut w);
                    }
                    let _ = tx.send((w.first_segment, w.segment));
                    continue;
                }
                let mut size = 0;
                let mut n = 0;
                for item in &q.entries {
                    match item {
                        Queued::Entry(_, b) if n == 0 || size + b.len() <= MAX_APPEND_BYTES => {
                            size += b.len();
                            n += 1;
                        }
                        _ => break,
                    }
                }
                if n == 0 {
                    return Ok(());
                }
                let mut bytes = Vec::with_capacity(size);
                let mut last = 0;
                for item in q.entries.drain(..n) {
                    if let Queued::Entry(seq, b) = item {
                        bytes.extend_from_slice(&b);
                        last = seq;
                    }
                }
                (bytes, last)
            };
            // a segment's size counts the entries (what a replay of it reads through)
            let len = bytes.len() as u64;
            let bytes = journal::pack(bytes);
            let stored = bytes.len() as u64;
            if let Err(e) = self
                .meta
                .append(&journal::segment_object(w.segment), bytes)
                .await
            {
                let e = self.check_fenced(e);
                self.stop_on_journal_failure(&e);
                return Err(e);
            }
            w.segment_bytes += len;
            if w.segment_bytes >= journal::SEGMENT_BYTES {
                self.close_segment(&mut w);
            }
            self.queue
                .lock()
                .expect("journal queue lock")
                .unjournaled
                .retain(|_, (_, s)| *s > last);
            self.committed.send_replace(last);
            // metrics
            self.metrics.journal_appends.inc();
            self.metrics.journal_bytes.inc_by(stored);
            self.note_open_segments(&w);
        }
    }

    /// Later appends go to a new segment.
    fn close_segment(&self, w: &mut JournalWriter) {
        w.segment += 1;
        w.segment_bytes = 0;
        self.metrics.journal_segments.inc();
    }

    /// The journal writer: appends whatever has queued each time it is woken, until the MDS
    /// stops.
    async fn journal_writer(self: Arc<Self>) {
        loop {
            self.kick.notified().await;
            if self.is_fenced() {
                break;
            }
            self.linger().await;
            if let Err(e) = self.flush_journal().await {
                warn!("journal writer stopped: {e}");
                break;
            }
        }
        // A checkpoint waiting for its segment to close (a stop's last one, say) learns
        // that it never will, instead of waiting forever; later ones are refused.
        let mut q = self.queue.lock().expect("journal queue lock");
        q.writer_stopped = true;
        q.entries.retain(|e| !matches!(e, Queued::Roll(_)));
    }

    /// Lets entries gather while nobody waits for them: early replies have answered their
    /// clients already, so appending a few milliseconds later costs nothing but merges
    /// many small appends (each a replicated write) into one. Ends at once when a request
    /// starts waiting for the journal, a checkpoint asks to close the segment, or enough
    /// has queued for a full append.
    async fn linger(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let deadline = tokio::time::Instant::now() + JOURNAL_LINGER;
        loop {
            let urgent = self.urgent.notified();
            tokio::pin!(urgent);
            urgent.as_mut().enable();
            if self.journal_waiters.load(SeqCst) > 0 || self.queue_is_due() {
                return;
            }
            if tokio::time::timeout_at(deadline, urgent).await.is_err() {
                return;
            }
        }
    }

    /// Whether the queue holds a checkpoint's segment close, a full append's bytes, or
    /// entries that must not stay unsafe longer.
    fn queue_is_due(&self) -> bool {
        let q = self.queue.lock().expect("journal queue lock");
        let mut bytes = 0;
        for e in &q.entries {
            match e {
                Queued::Roll(_) => return true,
                Queued::Entry(_, b) => bytes += b.len(),
            }
        }
        bytes >= MAX_APPEND_BYTES || q.assigned > self.committed() + MAX_UNSAFE_ENTRIES / 2
    }

    /// Waits while the backlog of updates not yet written back is at `max_backlog`, having
    /// asked for a checkpoint; `false` if the MDS stopped meanwhile.
    async fn wait_for_backlog(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if self.backlog.load(Relaxed) < self.cfg.max_backlog {
            return true;
        }
        let mut done = self.written_back.subscribe();
        loop {
            if self.is_fenced() {
                return false;
            }
            if self.backlog.load(Relaxed) < self.cfg.max_backlog {
                return true;
            }
            self.checkpoint_now.notify_one();
            // woken when a checkpoint ends; the second bounds a missed wake-up
            let _ = tokio::time::timeout(Duration::from_secs(1), done.changed()).await;
        }
    }

    /// Writes back what is dirty, then trims the journal. Requests go on meanwhile: the
    /// state is locked only to take the updates to write (whose inodes and directories stay
    /// cached until they are written) and to queue the segment's close right after their
    /// entries, so the journal never blocks the MDS here.
    async fn checkpoint(&self) -> Result<()> {
        let _one = self.checkpointing.lock().await;
        let (pending, requests, locks, rolled) = {
            let mut st = self.state.lock().await;
            if st.pending.is_empty() {
                return Ok(());
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            {
                let mut q = self.queue.lock().expect("journal queue lock");
                if q.writer_stopped {
                    return Err(FsError::Fenced("the journal writer stopped".into()));
                }
                q.entries.push(Queued::Roll(tx));
            }
            self.kick.notify_one();
            self.urgent.notify_one();
            st.ns.begin_writeback();
            let pending = std::mem::take(&mut st.pending);
            let requests = st.ns.requests_snapshot(Time::now());
            let locks = st.ns.locks_snapshot();
            (pending, requests, locks, rx)
        };
        // the entries of `pending` are journaled once the segment is closed after them
        let written = match rolled.await {
            Ok(segments) => match apply_updates(&self.meta, self.layout, &pending).await {
                Ok(()) => match save_requests(&self.meta, &requests).await {
                    Ok(()) => save_locks(&self.meta, &locks).await.map(|()| segments),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            },
            Err(_) => Err(FsError::Fenced("the journal writer stopped".into())),
        };
        let mut st = self.state.lock().await;
        let (from, to) = match written {
            Ok(segments) => segments,
            Err(e) => {
                // the next checkpoint writes them again, before what came since
                let newer = std::mem::replace(&mut st.pending, pending);
                st.pending.extend(newer);
                st.ns.abort_writeback();
                self.written_back.send_modify(|n| *n += 1);
                return Err(self.fenced_error(e));
            }
        };
        st.ns.end_writeback();
        self.backlog
            .fetch_sub(pending.len(), std::sync::atomic::Ordering::Relaxed);
        self.written_back.send_modify(|n| *n += 1);
        st.ns.evict_to(self.cfg.cache_inodes);
        self.metrics.cached_inodes.set(st.ns.cached_inodes() as i64);
        drop(st);
        trim(&self.meta, from, to)
            .await
            .map_err(|e| self.fenced_error(e))?;
        let mut w = self.writer.lock().await;
        w.first_segment = to;
        debug!(updates = pending.len(), segment = to, "checkpoint");
        // metrics
        self.metrics.checkpoints.inc();
        self.note_open_segments(&w);
        Ok(())
    }

    /// Metrics: the journal segments a restart would replay now.
    fn note_open_segments(&self, w: &JournalWriter) {
        let open = w.segment.saturating_sub(w.first_segment) + u64::from(w.segment_bytes > 0);
        self.metrics.journal_segments_open.set(open as i64);
    }

    /// Checkpoints and purges strays until fenced.
    async fn background(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.cfg.checkpoint_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.checkpoint_now.notified() => {}
            }
            if self.is_fenced() {
                return;
            }
            self.enforce_cap_budget();
            if let Err(e) = self.checkpoint().await {
                self.metrics.checkpoint_failures.inc();
                warn!("checkpoint failed: {e}");
            }
            // also when nothing changed: reads alone fill the cache too
            self.state.lock().await.ns.evict_to(self.cfg.cache_inodes);
            self.release_silent_lock_holders().await;
            if let Err(e) = self.purge().await {
                warn!("purging strays failed: {e}");
            }
        }
    }

    /// Releases (journaled) the locks of clients not heard from for [`LOCK_SESSION_GRACE`]
    /// (counted from the takeover for clients not heard from since).
    async fn release_silent_lock_holders(&self) {
        if self.activated.elapsed() < LOCK_SESSION_GRACE {
            return;
        }
        let mut st = self.state.lock().await;
        let silent: Vec<u64> = {
            let seen = self.last_seen.lock().expect("last_seen lock");
            st.ns
                .lock_holders()
                .into_iter()
                .filter(|c| {
                    seen.get(c)
                        .is_none_or(|t| t.elapsed() >= LOCK_SESSION_GRACE)
                })
                .collect()
        };
        for client in silent {
            info!(
                client,
                "client silent for {LOCK_SESSION_GRACE:?}: releasing its locks"
            );
            let updates = st.ns.drop_locks_of(client);
            if updates.is_empty() {
                continue;
            }
            // journaled with the next append (the release is made again if it is lost)
            self.journal(&mut st, 0, updates);
        }
    }

    /// Removes the data of unlinked, closed files, then their inodes. Not in the first
    /// `STRAY_PURGE_GRACE` after taking over: the open-file table starts empty, and clients
    /// re-register their open files when they reconnect (an idle client within its
    /// `client::KEEPALIVE`), so an unlinked file still open somewhere is not purged.
    async fn purge(&self) -> Result<()> {
        if self.activated.elapsed() < STRAY_PURGE_GRACE {
            return Ok(());
        }
        let ready = self.state.lock().await.ns.purgeable();
        let started = std::time::Instant::now();
        for ino in ready {
            // A pass is bounded, so that checkpoints (and changes waiting for the backlog to
            // shrink) are not held up by a large purge: the rest goes on at once after the
            // next checkpoint.
            if started.elapsed() >= self.cfg.checkpoint_interval
                || self.backlog.load(std::sync::atomic::Ordering::Relaxed) >= self.cfg.max_backlog
            {
                self.checkpoint_now.notify_one();
                break;
            }
            let inode = match self
                .handle(
                    RequestId::default(),
                    Caller::default(),
                    &Op::GetAttr { ino },
                )
                .await
                .0
            {
                Reply::Attr(i) => Some(i),
                _ => None,
            };
            // an inline file has no data objects (its data goes with the purge's journal entry)
            if let Some(i) = inode.as_ref().filter(|i| !i.inline) {
                let objects = i.size.div_ceil(i.object_size.max(1));
                let data = match i.layout.pool {
                    Some(p) if p != self.data.pool_id() => match self.rados.ioctx_by_id(p) {
                        Ok(io) => io,
                        Err(ClientError::NoSuchPool(_)) => continue, // removed with its data
                        Err(e) => return Err(e.into()),
                    },
                    _ => self.data.clone(),
                };
                for idx in 0..objects.max(1) {
                    match data.remove(&data_object(ino, idx)).await {
                        Ok(()) | Err(ClientError::NotFound { .. }) => {}
                        Err(e) => return Err(self.check_fenced(e)),
                    }
                }
            }
            let mut st = self.state.lock().await;
            if !st.ns.purgeable().contains(&ino) {
                continue; // opened again meanwhile
            }
            let updates = st.ns.purged(ino, inode.as_ref().is_some_and(|i| i.inline));
            // journaled with the next append (a purge lost with the MDS is made again)
            self.journal(&mut st, 0, updates);
        }
        Ok(())
    }
}

/// Serves as the monitors' file-system map assigns: beacons every second (as a standby
/// until given a role), and when given rank 0 of a file system replays its journal (beaconing
/// `replay`), then serves it (beaconing `active`). Returns why it stopped: told to by the
/// monitors (its role went to another MDS), or fenced (its RADOS instance blocklisted).
pub async fn run_in_fsmap(
    mds: &Mds,
    rados: &Rados,
    base: MdsConfig,
    want_fs: Option<String>,
) -> Result<String> {
    use kelp_client::{MdsAssignment, MdsBeacon, MdsState};
    let (state_tx, state_rx) = watch::channel((MdsState::Standby, 0u64));
    let (assign_tx, mut assign_rx) = tokio::sync::mpsc::channel(4);
    let beacon_task = {
        let rados = rados.clone();
        let name = base.name.clone();
        let addr = mds.addr();
        let want_fs = want_fs.clone();
        tokio::spawn(async move {
            // `mds_beacon_interval` from the central config, read again every 30 beacons so
            // that `kelp config set` reaches a running MDS.
            let mut interval = Duration::from_secs(1);
            let mut sent = 0u64;
            loop {
                if sent.is_multiple_of(30) {
                    match rados.mds_beacon_interval(&name).await {
                        Ok(d) => {
                            interval = d.clamp(Duration::from_millis(100), Duration::from_secs(60))
                        }
                        Err(e) => warn!("reading mds_beacon_interval: {e}"),
                    }
                }
                sent += 1;
                let (state, incarnation) = *state_rx.borrow();
                let beacon = MdsBeacon {
                    name: name.clone(),
                    addr,
                    instance: rados.instance(),
                    fs: want_fs.clone(),
                    state,
                    incarnation,
                };
                match rados.mds_beacon(&beacon).await {
                    Ok(a) => {
                        if assign_tx.send(a).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => warn!("beacon to the monitors failed: {e}"),
                }
                tokio::time::sleep(interval).await;
            }
        })
    };
    let _stop_beacons = AbortOnDrop(beacon_task);
    loop {
        tokio::select! {
            a = assign_rx.recv() => match a {
                None | Some(MdsAssignment::Stop) => {
                    return Ok("the monitors gave this MDS's role to another".into());
                }
                Some(MdsAssignment::Active { fs, incarnation }) => {
                    if state_tx.borrow().0 != MdsState::Standby {
                        continue;
                    }
                    info!(fs, incarnation, "given rank 0: replaying the journal");
                    state_tx.send_replace((MdsState::Replay, incarnation));
                    let map = rados.fs_map().await?;
                    let info = map.filesystems.get(&fs).ok_or_else(|| {
                        FsError::Config(format!("file system {fs} is not in the map"))
                    })?;
                    let osd_map = rados.osd_map();
                    let pool_name = |id: u32| {
                        osd_map
                            .pools
                            .get(&id)
                            .map(|p| p.name.clone())
                            .ok_or_else(|| FsError::Config(format!("pool {id} of {fs} is gone")))
                    };
                    let mut cfg = base.clone();
                    cfg.fs_name = Some(fs.clone());
                    cfg.meta_pool = pool_name(info.metadata_pool)?;
                    cfg.data_pool = pool_name(*info.data_pools.first().ok_or_else(|| {
                        FsError::Config(format!("file system {fs} has no data pool"))
                    })?)?;
                    mds.activate(cfg, rados.clone()).await?;
                    state_tx.send_replace((MdsState::Active, incarnation));
                    info!(fs, incarnation, "active");
                }
                Some(MdsAssignment::Standby) => {}
            },
            reason = mds.fenced() => return Ok(format!("fenced: {reason}")),
        }
    }
}

/// The file system's data pools (name -> id), which file layouts may name: from the
/// monitors' map, or the one data pool of a standalone MDS.
async fn data_pools(rados: &Rados, cfg: &MdsConfig) -> Result<BTreeMap<String, u32>> {
    let osd_map = rados.osd_map();
    let mut out = BTreeMap::new();
    if let Some(fs) = &cfg.fs_name
        && let Some(info) = rados.fs_map().await?.filesystems.get(fs)
    {
        for id in &info.data_pools {
            if let Some(p) = osd_map.pools.get(id) {
                out.insert(p.name.clone(), *id);
            }
        }
    }
    if out.is_empty()
        && let Some(p) = osd_map.pool_by_name(&cfg.data_pool)
    {
        out.insert(p.name.clone(), p.id);
    }
    Ok(out)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Dispatcher {
    slot: Arc<OnceLock<Arc<Inner>>>,
    metrics: Arc<crate::metrics::MdsMetrics>,
}

/// Decodes a request envelope; every malformed input is an error, never a panic.
pub fn decode_request(meta: &[u8]) -> std::result::Result<Envelope, RemoteError> {
    let env: Envelope = serde_json::from_slice(meta)
        .map_err(|e| RemoteError::new(errno::EPROTO as u32, format!("malformed request: {e}")))?;
    if env.v != PROTOCOL_VERSION {
        return Err(RemoteError::new(
            errno::EPROTO as u32,
            format!(
                "protocol version {} (this MDS speaks {PROTOCOL_VERSION})",
                env.v
            ),
        ));
    }
    Ok(env)
}

#[async_trait]
impl kelp_msgr::Dispatcher for Dispatcher {
    async fn handle_request(&self, req: Request) -> std::result::Result<Response, RemoteError> {
        if req.msg_type != MSG_MDS_REQUEST {
            return Err(RemoteError::new(
                errno::EPROTO as u32,
                format!("unknown message type {:#x}", req.msg_type),
            ));
        }
        let env = decode_request(&req.meta)?;
        let timer = self.metrics.start(&env.op);
        let (reply, grants, unsafe_reply) = match self.slot.get() {
            Some(inner) => {
                let req = RequestId {
                    client: env.client,
                    tid: env.tid,
                    oldest: env.oldest_tid,
                    ino_hint: env.ino_hint,
                    delegated: env.delegated,
                };
                inner.handle(req, env.caller, &env.op).await
            }
            None => (Reply::Err(errno::ESHUTDOWN), None, false),
        };
        timer.finish(!matches!(reply, Reply::Err(_)));
        let meta = serde_json::to_vec(&reply).expect("replies serialize");
        // what the reply grants travels in the data part (empty: nothing granted)
        let data = match grants {
            Some(g) => Bytes::from(serde_json::to_vec(&g).expect("grants serialize")),
            None => Bytes::new(),
        };
        let kind = if unsafe_reply {
            MSG_MDS_UNSAFE
        } else {
            MSG_MDS_REQUEST
        };
        Ok(Response::new(kind, meta, data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_requests_are_errors_not_panics() {
        let good = serde_json::to_vec(&Envelope {
            v: PROTOCOL_VERSION,
            client: 1,
            caller: Caller::default(),
            op: Op::GetAttr { ino: 1 },
            tid: 1,
            oldest_tid: 1,
            ino_hint: None,
            delegated: false,
        })
        .unwrap();
        assert!(decode_request(&good).is_ok());
        // every truncation, and every single-byte corruption of a valid request
        for n in 0..good.len() {
            let _ = decode_request(&good[..n]);
            for b in [0u8, b'"', b'}', 0xff, b'9'] {
                let mut bad = good.clone();
                bad[n] = b;
                let _ = decode_request(&bad);
            }
        }
        let mut x: u64 = 0x1234_5678;
        for _ in 0..2000 {
            let len = (x % 300) as usize;
            let mut buf = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf.push(x as u8);
            }
            assert!(decode_request(&buf).is_err());
        }
        let old = good.clone().into_iter().collect::<Vec<u8>>();
        let text = String::from_utf8(old)
            .unwrap()
            .replace("\"v\":1", "\"v\":99");
        assert!(decode_request(text.as_bytes()).is_err());
    }
}
