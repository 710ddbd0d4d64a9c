//! The file-system client: a session with the MDS for metadata, and the data path straight
//! to the data pool (a file's bytes live in objects `<ino hex>.<index 8 hex>` of
//! `object_size` bytes each; a missing object or a short one reads as zeros, which is what
//! makes files sparse).
//!
//! The MDS session survives MDS restarts and moves: a call that finds the connection broken
//! looks up where the MDS is now, reconnects, re-registers this client's open files, and
//! retries, until `reconnect_timeout`.
//!
//! Capabilities: replies may grant leases (see `caps.rs`); while one is held the client
//! answers `getattr` from its own copy and the FUSE layer lets the kernel cache for the
//! lease's remainder. A task keeps a revoke poll outstanding at the MDS; a revoke first
//! drops the lease here, then waits for kernel replies that may have read it, then has the
//! kernel's caches invalidated (the mount's invalidator), and only then is acknowledged.
//! A broken poll or a new MDS connection drops every lease (the MDS may have dropped them).
//!
//! Write-back: while this client holds a file's exclusive capability (granted with an open
//! for writing when no other client caches the file and no byte quota is above it), a
//! buffered write is answered once its data is on its way to RADOS (`behind.rs`), and the new
//! size, the times, mode and owner stay here (dirty) instead of going to the MDS. They are
//! flushed (`Op::Written`) by `fsync` (after the writes are stored), by the kernel's flush at
//! each `close` (without waiting for them, and sent behind the close: the file's size lock
//! orders every later flush after it), by the revoke of the capability (after they are
//! stored, before it is acknowledged: the MDS answers no other client about the file until
//! then), at least every [`FLUSH_INTERVAL`], and at unmount. A client killed with dirty state
//! loses what it kept of files never fsynced or closed.
//!
//! Complete directories: a directory this client made, or listed whole, under its shared
//! lease has every name known here while the lease holds; a lookup of another name is
//! answered `ENOENT` without the MDS.
//!
//! Directory listings: a listing read under the directory's shared lease may be cached by
//! the kernel (`FOPEN_CACHE_DIR`) and kept across opens while that lease stays held; its
//! revoke drops the kernel's copy.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_client::{ClientConfig, ClientError, IoCtx, Rados};
use kelp_msgr::{Connection, Messenger, MsgrError};
use tracing::{debug, error, info, warn};

use crate::behind::{Claim, WriteBehind};
use crate::error::{FsError, Result};
use crate::mds::{ADDR_OBJECT, MdsAddr};
use crate::types::*;

/// How often a client with open files checks in with the MDS (see [`FsClient::connect`]).
pub const KEEPALIVE: Duration = Duration::from_secs(5);

/// Longest a size or mtime written under the exclusive capability stays unknown to the MDS.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);

/// An exclusive lease with less than this left is renewed while the file is open.
const EXCL_RENEW_BEFORE: Duration = Duration::from_secs(10);

/// How long a file's last close waits before it is sent to the MDS (batched with others):
/// an open meanwhile needs no MDS request.
pub const CLOSE_DELAY: Duration = Duration::from_secs(1);

/// How a client finds and talks to its file system.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The file system's name in the monitors' file-system map: its pools and active MDS are
    /// taken from there. When the map has no such file system, `meta_pool`/`data_pool` are
    /// used and the MDS address is read from the metadata pool (a standalone MDS).
    pub fs_name: Option<String>,
    pub meta_pool: String,
    pub data_pool: String,
    /// The MDS's address, if known (otherwise read from the metadata pool).
    pub mds_addr: Option<SocketAddr>,
    /// Deadline of one MDS call.
    pub call_timeout: Duration,
    /// How long calls keep trying to reach an MDS before failing with EIO.
    pub reconnect_timeout: Duration,
}

impl ClientOptions {
    pub fn new(meta_pool: &str, data_pool: &str) -> ClientOptions {
        ClientOptions {
            fs_name: None,
            meta_pool: meta_pool.into(),
            data_pool: data_pool.into(),
            mds_addr: None,
            call_timeout: Duration::from_secs(10),
            reconnect_timeout: Duration::from_secs(120),
        }
    }
}

/// A mounted file system's client side.
pub struct FsClient {
    rados: Rados,
    meta: IoCtx,
    data: IoCtx,
    msgr: Messenger,
    conn: tokio::sync::Mutex<Option<Connection>>,
    /// Connections to an MDS begun so far: a reply that comes over an older one than the
    /// current one is not taken (its MDS may have been replaced meanwhile, before it
    /// journaled the change), the request goes again to the current one.
    conns: AtomicU64,
    id: u64,
    opts: ClientOptions,
    /// Whether the monitors' file-system map names the file system (and its MDS).
    in_map: bool,
    /// Open handles per inode (re-registered with a new MDS on reconnect).
    opens: std::sync::Mutex<HashMap<Ino, u32>>,
    // open/close (fswb)
    /// Files closed here whose closes the MDS has not been sent yet: how many, and when the
    /// last one was (sent after [`CLOSE_DELAY`]; an open before reuses one).
    closing: std::sync::Mutex<HashMap<Ino, (u32, Instant)>>,
    // capabilities (caps)
    caps: std::sync::Mutex<CapCache>,
    /// Kernel replies between reading a lease and reaching the kernel (see `begin_reply`).
    replying: AtomicU64,
    invalidator: std::sync::OnceLock<Invalidator>,
    /// MDS requests sent (revoke polls not counted).
    calls: AtomicU64,
    // completed requests (idempotent retries)
    tids: std::sync::Mutex<Tids>,
    // early replies (unsafe until journaled)
    /// Changes the MDS answered before journaling them, by tid (their tids stay
    /// unanswered): sent again to an MDS that takes over, until an [`Op::Sync`] answers.
    unjournaled: std::sync::Mutex<BTreeMap<u64, Envelope>>,
    // write-back (exclusive capability)
    /// Held per inode from reading a dirty size to the MDS's answer, and across a truncate:
    /// a flush that read the size before a truncate must not reach the MDS after it (the MDS
    /// keeps the larger of the file's size and a written end). Per inode, never shared
    /// between inodes: a revoke's flush waits only for a change to the same file, which
    /// never waits for a revoke of this client's own capability on it.
    size_locks: std::sync::Mutex<HashMap<Ino, Arc<tokio::sync::Mutex<()>>>>,
    /// Data writes in flight (see `behind.rs`).
    behind: Arc<WriteBehind>,
    // creates without a round trip (delegated inode numbers)
    /// Creates and unlinks answered here and sent behind (see [`FsClient::create_now`],
    /// [`FsClient::unlink_now`]).
    sent_behind: std::sync::Mutex<SentBehind>,
    /// Woken when a change sent behind is answered.
    behind_done: tokio::sync::Notify,
    /// Held by the request that syncs because [`MAX_UNJOURNALED`] is reached.
    syncing: tokio::sync::Mutex<()>,
    // inline data
    /// Files this client created for writing ([`FsClient::create_now`], or
    /// [`FsClient::create`] of an empty file it holds exclusively) whose writes it keeps
    /// here, while they fit in [`INLINE_MAX`], until their first flush carries them to the
    /// MDS as the file's inline data ([`Op::WrittenInline`]): no data object is written.
    inline_bufs: std::sync::Mutex<HashMap<Ino, InlineBuf>>,
    /// Whether the MDS keeps inline data (`false` once it refused it as unknown).
    inline_ok: AtomicBool,
}

// inline data
/// A small file's content kept by its creator ([`FsClient::inline_bufs`]).
#[derive(Debug, Default)]
struct InlineBuf {
    data: Vec<u8>,
    /// A flush is carrying it (or a spill writing it out): writes wait for that to end;
    /// reads are still answered from it.
    sending: bool,
}

/// How a write of a file goes, as far as inline data is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InlineRoute {
    /// Kept in the file's [`InlineBuf`]: done.
    Kept,
    /// Through the data objects.
    Plain,
    /// Not decidable at once: a buffer to write out or a flush to wait for, inline data to
    /// move out first, or an inode not cached ([`FsClient::make_plain`]).
    Slow,
}

// creates without a round trip (delegated inode numbers)
/// Most changes answered here and not yet answered by the MDS; past it, creates and unlinks
/// wait for it.
pub const MAX_SENT_BEHIND: usize = 1024;

/// A change answered here and sent behind.
#[derive(Debug)]
enum SentOp {
    /// The create of this inode.
    Create(Ino),
    /// The unlink of `name` in `parent`.
    Unlink { parent: Ino, name: String },
}

/// The inode numbers the MDS delegated to this client, and the creates and unlinks it sent
/// behind.
#[derive(Debug, Default)]
struct SentBehind {
    /// Numbers not yet given: `[next, end)` ranges, in order.
    inos: std::collections::VecDeque<(Ino, Ino)>,
    /// An [`Op::TakeInos`] is on its way.
    taking: bool,
    /// The sequence number of the last change sent behind.
    last: u64,
    /// Those not yet answered, by sequence number.
    pending: BTreeMap<u64, SentOp>,
    /// How many of them are unlinks.
    unlinks: usize,
}

impl SentBehind {
    /// Numbers left to give.
    fn left(&self) -> u64 {
        self.inos.iter().map(|(a, b)| b - a).sum()
    }

    /// Whether a change sent behind and not yet answered is the unlink of `name` in `dir`
    /// (a create of that name waits for it: the MDS may handle the two in either order).
    fn unlinking(&self, dir: Ino, name: &str) -> bool {
        self.unlinks > 0
            && self.pending.values().any(
                |p| matches!(p, SentOp::Unlink { parent, name: n, .. } if *parent == dir && n == name),
            )
    }

    /// The next number to give.
    fn take(&mut self) -> Option<Ino> {
        let (next, end) = self.inos.front_mut()?;
        let ino = *next;
        *next += 1;
        if *next >= *end {
            self.inos.pop_front();
        }
        Some(ino)
    }
}

/// A file's size lock (see [`FsClient::size_locks`]); forgotten with its last holder.
struct SizeLock<'a> {
    client: &'a FsClient,
    ino: Ino,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for SizeLock<'_> {
    fn drop(&mut self) {
        let mut locks = self.client.size_locks.lock().expect("size locks");
        drop(self.guard.take());
        if locks
            .get(&self.ino)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            locks.remove(&self.ino);
        }
    }
}

// early replies (unsafe until journaled)
/// Most unjournaled changes a client keeps: past it, the next request first waits for the
/// journal ([`FsClient::sync_mds`]).
pub const MAX_UNJOURNALED: usize = 1024;

// completed requests (idempotent retries)
/// The tids of one client's MDS requests: a new one per request (a retry keeps its
/// request's), and which are still unanswered (the MDS forgets completions below the least).
#[derive(Debug, Default)]
struct Tids {
    last: u64,
    unanswered: std::collections::BTreeSet<u64>,
}

impl Tids {
    /// A new request: its tid and the oldest tid unanswered (itself included).
    fn begin(&mut self) -> (u64, u64) {
        self.last += 1;
        self.unanswered.insert(self.last);
        let oldest = self.unanswered.first().copied().unwrap_or(self.last);
        (self.last, oldest)
    }

    /// The request `tid` got its answer (or was given up): it is never sent again.
    fn end(&mut self, tid: u64) {
        self.unanswered.remove(&tid);
    }
}

/// Ends a request's tid when its call returns (or is dropped).
struct Unanswered<'a>(&'a FsClient, u64);

impl Unanswered<'_> {
    /// The request stays unanswered (its tid stays open) after the call returns.
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        self.0.tids.lock().expect("tids lock").end(self.1);
    }
}

/// Runs a write's data jobs; a failure is kept on its claim (for the file's next `write`,
/// `fsync` or `close`) and returned.
async fn store_data<F>(mut claim: Claim, jobs: Vec<F>) -> Option<FsError>
where
    F: Future<Output = std::result::Result<(), ClientError>>,
{
    let failed = futures::future::join_all(jobs)
        .await
        .into_iter()
        .find_map(|r| r.err())
        .map(FsError::from);
    if let Some(e) = &failed {
        claim.failed(e.errno());
    }
    failed
}

/// The data of a buffered write, stored after its call returned: a failure is logged (and
/// reported by the file's next `write`, `fsync` or `close`).
async fn stored_behind(
    stored: impl Future<Output = Option<FsError>>,
    ino: Ino,
    off: u64,
    end: u64,
) {
    if let Some(e) = stored.await {
        error!(
            ino,
            off,
            end,
            "a buffered write failed: {e} (the file's next write, fsync or close reports it)"
        );
    }
}

/// Drops the kernel's cached copies named by revokes (blocking; the mount provides it).
pub type Invalidator = Arc<dyn Fn(&[CapRevoke]) + Send + Sync>;

/// What this client may cache, per the leases the MDS granted.
#[derive(Default)]
struct CapCache {
    /// Bumped by every revoke: a reply that was in flight meanwhile grants nothing.
    epoch: u64,
    /// Capabilities held per inode, and until when this client trusts them.
    leases: HashMap<Ino, (u8, Instant)>,
    /// Attributes held under a shared lease.
    inodes: HashMap<Ino, Inode>,
    /// Names the kernel may cache per directory (dropped when the directory's lease goes).
    names: HashMap<Ino, HashSet<String>>,
    // write-back (exclusive capability)
    /// Sizes and mtimes written under the exclusive capability that the MDS has not
    /// acknowledged yet (kept until it has, so replies in between never show less).
    dirty: HashMap<Ino, Dirty>,
    /// The MDS's answer to each recent flush of a dirty record, with the last tid sent
    /// before it: a reply to an earlier request may arrive after the flush took the dirty
    /// record away, and must not show the file as it was before the flush.
    flushed: HashMap<Ino, (Inode, u64)>,
    /// Directories whose listing the kernel may keep cached: read under the shared lease
    /// that is still held, with no revoke since.
    listed: HashSet<Ino>,
    // complete directories (negative lookups answered here)
    /// Every name of a directory, known while this client holds the directory's shared
    /// lease with no revoke since: made by its own `mkdir` (empty) or a whole listing, kept
    /// up to date by its own changes. A lookup of a name not in it needs no MDS request.
    complete: HashMap<Ino, HashSet<String>>,
    /// Bumped by each change of directory entries this client makes: a listing read while
    /// one ran may miss its name, so it does not make its directory complete.
    entry_changes: u64,
    /// The files this client created itself without asking ([`FsClient::create_now`]), by
    /// directory and name, while the name is known to be theirs: their inode and the create's
    /// sequence number among the changes sent behind. Their unlinks may be answered here too
    /// ([`FsClient::unlink_now`]).
    made: HashMap<Ino, HashMap<String, (Ino, u64)>>,
}

/// A file's size, times and attributes not yet known to the MDS.
#[derive(Debug, Clone)]
struct Dirty {
    end: u64,
    mtime: Time,
    ctime: Time,
    /// Mode, owner and atime set here (never size or mtime: those are `end` and `mtime`).
    attrs: SetAttr,
    /// Bumped by every change: a flush removes the entry only if nothing changed since.
    generation: u64,
}

impl Dirty {
    /// What the MDS is told of it: the end written, the times, the attributes set.
    fn written(&self, ino: Ino, end: u64, renew: bool) -> Op {
        Op::Written {
            ino,
            end: self.end.max(end),
            mtime: self.mtime,
            renew,
            ctime: Some(self.ctime),
            set: (self.attrs != SetAttr::default()).then(|| self.attrs.clone()),
        }
    }

    /// [`Dirty::written`] carrying the file's whole content as inline data.
    fn written_inline(&self, ino: Ino, renew: bool, data: Bytes) -> Op {
        Op::WrittenInline {
            ino,
            end: self.end.max(data.len() as u64),
            mtime: self.mtime,
            renew,
            ctime: Some(self.ctime),
            set: (self.attrs != SetAttr::default()).then(|| self.attrs.clone()),
            data: InlineData(data),
        }
    }
}

impl CapCache {
    // inline data
    /// Whether this client's copy of `ino` (with what it flushed since) is inline; `None`
    /// when it has no copy.
    fn inline_flag(&self, ino: Ino) -> Option<bool> {
        let cached = self.inodes.get(&ino)?;
        Some(match self.flushed.get(&ino) {
            Some((newer, _)) if newer.version > cached.version => newer.inline,
            _ => cached.inline,
        })
    }

    /// The MDS moved `ino`'s inline data out ([`Op::Uninline`]): the copies here say so.
    fn uninlined(&mut self, ino: Ino) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.inline = false;
        }
        if let Some((i, _)) = self.flushed.get_mut(&ino) {
            i.inline = false;
        }
    }

    /// Shows what this client wrote and the MDS has not acknowledged yet in `i`.
    fn overlay(&self, i: &mut Inode) {
        if let Some((newer, _)) = self.flushed.get(&i.ino)
            && newer.version > i.version
        {
            *i = newer.clone();
        }
        if let Some(d) = self.dirty.get(&i.ino) {
            i.size = i.size.max(d.end);
            i.mtime = d.mtime;
            i.ctime = d.ctime;
            d.attrs.apply_attrs(i, d.ctime);
        }
    }

    /// The dirty record of `i` (as this client shows it), made if there is none.
    fn dirty_of(&mut self, i: &Inode) -> &mut Dirty {
        self.dirty.entry(i.ino).or_insert_with(|| Dirty {
            end: 0,
            mtime: i.mtime,
            ctime: i.ctime,
            attrs: SetAttr::default(),
            generation: 0,
        })
    }

    /// A write up to `end` made under the exclusive capability: the new end and mtime are
    /// kept (dirty) and shown.
    fn note_written(&mut self, inode: &Inode, end: u64, mtime: Time) {
        // both times are set here: the record needs no copy of the inode to start
        let d = self.dirty_of(inode);
        d.end = d.end.max(end);
        d.mtime = mtime;
        d.ctime = mtime;
        d.generation += 1;
        let size = d.end;
        if let Some(i) = self.inodes.get_mut(&inode.ino) {
            i.size = i.size.max(size);
            i.mtime = mtime;
            i.ctime = mtime;
        }
    }

    // complete directories (negative lookups answered here)
    /// This client's change of directory entries `op` ended (`ok`: the MDS made it): the
    /// complete directories it touched learn the names it made and removed; a failed one
    /// leaves them unknown (they are asked of the MDS again).
    fn entries_changed(&mut self, op: &Op, ok: bool) {
        self.entry_changes += 1;
        // (directory, name, whether the change made it)
        let names: Vec<(Ino, &str, bool)> = match op {
            Op::Mknod { parent, name, .. }
            | Op::Mkdir { parent, name, .. }
            | Op::Symlink { parent, name, .. }
            | Op::Link { parent, name, .. } => vec![(*parent, name, true)],
            Op::Unlink { parent, name } | Op::Rmdir { parent, name } => {
                vec![(*parent, name, false)]
            }
            Op::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => {
                let mut v = vec![(*new_parent, new_name.as_str(), true)];
                // an exchange keeps both names
                if *flags & RENAME_EXCHANGE == 0 {
                    v.insert(0, (*parent, name.as_str(), false));
                }
                v
            }
            _ => return,
        };
        // names that no longer (or not only) name the file made here
        let gone: Vec<(Ino, &str)> = match op {
            Op::Unlink { parent, name } | Op::Rmdir { parent, name } => vec![(*parent, name)],
            // both sides: a rename takes the old name and replaces the new one, an exchange
            // swaps the two
            Op::Rename {
                parent,
                name,
                new_parent,
                new_name,
                ..
            } => vec![(*parent, name), (*new_parent, new_name)],
            // a second name: the file's unlink is the MDS's to answer
            Op::Link { ino, .. } => {
                self.made
                    .values_mut()
                    .for_each(|m| m.retain(|_, (i, _)| i != ino));
                Vec::new()
            }
            // new names: none of them was a file made here
            _ => Vec::new(),
        };
        for (dir, name) in gone {
            if let Some(m) = self.made.get_mut(&dir) {
                m.remove(name);
            }
        }
        for (dir, name, made) in names {
            if !ok {
                self.complete.remove(&dir);
            } else if let Some(names) = self.complete.get_mut(&dir) {
                if made {
                    names.insert(name.to_string());
                } else {
                    names.remove(name);
                }
            }
        }
    }

    /// Whether `name` is known to be absent from `dir` (complete, lease still held). A name
    /// longer than `NAME_MAX` is left to the MDS, which answers `ENAMETOOLONG`.
    fn known_absent(&self, dir: Ino, name: &str) -> bool {
        name.len() <= NAME_MAX
            && self.valid(dir, CAP_SHARED).is_some()
            && self
                .complete
                .get(&dir)
                .is_some_and(|names| !names.contains(name))
    }

    /// A change of `dir`'s entries made here at `now`: its cached times move.
    fn dir_times(&mut self, dir: Ino, now: Time) {
        if let Some(d) = self.inodes.get_mut(&dir) {
            d.mtime = now;
            d.ctime = now;
        }
    }

    fn valid(&self, ino: Ino, cap: u8) -> Option<Instant> {
        self.leases
            .get(&ino)
            .filter(|(c, until)| c & cap != 0 && *until > Instant::now())
            .map(|(_, until)| *until)
    }
}

/// Margin by which a client trusts a lease less long than the MDS grants it.
const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// Held while a kernel reply carries what a lease allows (see [`FsClient::begin_reply`]).
pub struct ReplyGuard<'a>(&'a AtomicU64);

impl Drop for ReplyGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FsClient {
    pub async fn connect(cfg: ClientConfig, mut opts: ClientOptions) -> Result<Arc<FsClient>> {
        let msgr = Messenger::builder(cfg.entity.clone())
            .secret(cfg.secret.clone())
            .build()?;
        let rados = Rados::connect(cfg).await?;
        let mut in_map = false;
        if let Some(fs) = &opts.fs_name {
            let map = rados.fs_map().await?;
            if let Some(info) = map.filesystems.get(fs) {
                let osd_map = rados.osd_map();
                let name = |id: u32| {
                    osd_map
                        .pools
                        .get(&id)
                        .map(|p| p.name.clone())
                        .ok_or_else(|| FsError::Config(format!("pool {id} of {fs} is gone")))
                };
                opts.meta_pool = name(info.metadata_pool)?;
                opts.data_pool = name(*info.data_pools.first().ok_or_else(|| {
                    FsError::Config(format!("file system {fs} has no data pool"))
                })?)?;
                in_map = true;
            }
        }
        let meta = rados.ioctx(&opts.meta_pool).await?;
        let data = rados.ioctx(&opts.data_pool).await?;
        let id = u64::from_str_radix(
            &format!("{:x}", std::process::id() as u64 ^ Time::now().nanos as u64),
            16,
        )
        .unwrap_or(1)
            ^ (Time::now().secs as u64) << 20;
        let c = Arc::new(FsClient {
            rados,
            meta,
            data,
            msgr,
            conn: tokio::sync::Mutex::new(None),
            conns: AtomicU64::new(0),
            id,
            opts,
            in_map,
            opens: std::sync::Mutex::new(HashMap::new()),
            closing: std::sync::Mutex::new(HashMap::new()),
            caps: std::sync::Mutex::new(CapCache::default()),
            replying: AtomicU64::new(0),
            invalidator: std::sync::OnceLock::new(),
            calls: AtomicU64::new(0),
            tids: std::sync::Mutex::new(Tids::default()),
            unjournaled: std::sync::Mutex::new(BTreeMap::new()),
            size_locks: std::sync::Mutex::new(HashMap::new()),
            behind: Arc::default(),
            sent_behind: std::sync::Mutex::new(SentBehind::default()),
            behind_done: tokio::sync::Notify::new(),
            syncing: tokio::sync::Mutex::new(()),
            inline_bufs: std::sync::Mutex::new(HashMap::new()),
            inline_ok: AtomicBool::new(true),
        });
        c.getattr(Caller::default(), ROOT_INO).await?;
        // While files are open, a call every KEEPALIVE notices a failed-over MDS even when the
        // mount is idle, and re-registers the open files with the new one before it may purge
        // unlinked files (it waits `STRAY_PURGE_GRACE` after taking over).
        let weak = Arc::downgrade(&c);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(KEEPALIVE);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(c) = weak.upgrade() else { return };
                if c.opens.lock().expect("opens lock").is_empty() {
                    continue;
                }
                if let Err(e) = c.getattr(Caller::default(), ROOT_INO).await {
                    warn!("MDS keepalive: {e}");
                }
            }
        });
        // Write-back: dirty sizes reach the MDS within FLUSH_INTERVAL, and the exclusive
        // leases of open files are renewed before they run out.
        let weak = Arc::downgrade(&c);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(FLUSH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(c) = weak.upgrade() else { return };
                if let Err(e) = c.flush_all().await {
                    warn!("flushing file sizes to the MDS: {e}");
                }
                c.forget_flushed();
                c.renew_exclusive().await;
                if let Err(e) = c.send_closes(CLOSE_DELAY).await {
                    warn!("sending closes to the MDS: {e}");
                }
                // changes answered early are in the MDS's journal within a tick
                if let Err(e) = c.sync_mds().await {
                    warn!("waiting for the MDS's journal: {e}");
                }
            }
        });
        // The revoke poll: always one outstanding, acknowledging the previous batch once
        // the kernel has dropped what it named.
        let weak = Arc::downgrade(&c);
        tokio::spawn(async move {
            let mut ack: Vec<u64> = Vec::new();
            loop {
                let Some(c) = weak.upgrade() else { return };
                match c.poll_revokes(&ack).await {
                    Ok(revokes) => {
                        ack = revokes.iter().map(|r| r.id).collect();
                        if !revokes.is_empty() {
                            c.apply_revokes(revokes).await;
                        }
                    }
                    Err(e) => {
                        debug!("revoke poll: {e}");
                        // the MDS drops this session's capabilities when it stops hearing
                        // from it: drop them here too
                        c.drop_all_leases();
                        drop(c);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Ok(c)
    }

    /// Sets what drops the kernel's caches on a revoke (the FUSE mount's notifier).
    pub fn set_invalidator(&self, f: Invalidator) {
        let _ = self.invalidator.set(f);
    }

    /// MDS requests this client sent (revoke polls not counted).
    pub fn mds_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// One revoke poll on the current connection (no retries: a failure means the session
    /// may be gone).
    async fn poll_revokes(&self, ack: &[u64]) -> Result<Vec<CapRevoke>> {
        let (conn, _) = self.connection().await?;
        let env = self.untracked(Op::CapPoll { ack: ack.to_vec() });
        let meta = serde_json::to_vec(&env).expect("requests serialize");
        let resp = match conn
            .call(
                MSG_MDS_REQUEST,
                meta,
                Bytes::new(),
                CAP_POLL_WINDOW + Duration::from_secs(3),
            )
            .await
        {
            Ok(r) => r,
            Err(e) => {
                if !matches!(e, MsgrError::Remote { .. }) {
                    *self.conn.lock().await = None;
                }
                return Err(e.into());
            }
        };
        match decode_reply(&resp.meta)? {
            Reply::Revokes(r) => Ok(r),
            Reply::Err(e) => {
                if e == errno::ESHUTDOWN {
                    *self.conn.lock().await = None;
                }
                Err(FsError::Errno(e))
            }
            r => Err(unexpected(r)),
        }
    }

    /// Drops what the revokes take away: here first (so no kernel reply starts with it),
    /// then, once the kernel replies that read a lease before are through, in the kernel.
    /// A revoke of the exclusive capability first sends the size and mtime it kept.
    async fn apply_revokes(&self, mut revokes: Vec<CapRevoke>) {
        let mut flush = Vec::new();
        {
            let mut caps = self.caps.lock().expect("caps lock");
            caps.epoch += 1;
            for r in &mut revokes {
                if r.caps & CAP_EXCL != 0
                    && (caps.dirty.contains_key(&r.ino) || self.behind.busy(r.ino))
                {
                    flush.push(r.ino);
                }
                if r.caps & CAP_SHARED != 0 {
                    caps.inodes.remove(&r.ino);
                    caps.complete.remove(&r.ino);
                    caps.made.remove(&r.ino);
                    if let Some(names) = caps.names.remove(&r.ino) {
                        r.names.extend(names);
                    }
                    if caps.listed.remove(&r.ino) {
                        // the kernel's cached listing is the directory's pages
                        r.caps |= CAP_READ;
                    }
                }
                if let Some((held, _)) = caps.leases.get_mut(&r.ino) {
                    *held &= !r.caps;
                    if *held == 0 {
                        caps.leases.remove(&r.ino);
                    }
                }
            }
        }
        if revokes.iter().any(|r| r.caps & CAP_EXCL != 0) {
            // the creates answered here under a directory's exclusive lease (gone here
            // already: no more are) reach the MDS before the revoke is acknowledged
            self.settle_behind().await;
        }
        for ino in flush {
            // the exclusive lease is gone here already: a write from now on is sent itself
            if let Err(e) = self.flush(ino).await {
                warn!("flushing the size of {ino:x} for a revoke: {e}");
            }
        }
        self.wait_replies().await;
        if let Some(inv) = self.invalidator.get().cloned() {
            let r = tokio::task::spawn_blocking(move || inv(&revokes)).await;
            if let Err(e) = r {
                warn!("invalidating the kernel's caches: {e}");
            }
        }
    }

    /// Waits until no kernel reply that may have read a lease before now is on its way.
    async fn wait_replies(&self) {
        let start = Instant::now();
        while self.replying.load(Ordering::SeqCst) > 0 && start.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Forgets every lease (the session may be gone) and has the kernel drop what it
    /// cached under them, without waiting (this may run inside a kernel request).
    fn drop_all_leases(&self) {
        let revokes: Vec<CapRevoke> = {
            let mut caps = self.caps.lock().expect("caps lock");
            caps.epoch += 1;
            let mut names = std::mem::take(&mut caps.names);
            caps.inodes.clear();
            // dirty sizes stay: they are flushed without a lease
            caps.listed.clear();
            caps.complete.clear();
            caps.made.clear();
            let leases = std::mem::take(&mut caps.leases);
            let mut inos: HashSet<Ino> = leases.into_keys().collect();
            inos.extend(names.keys().copied());
            inos.into_iter()
                .map(|ino| CapRevoke {
                    id: 0,
                    ino,
                    caps: crate::caps::CAP_ALL,
                    names: names
                        .remove(&ino)
                        .map(|n| n.into_iter().collect())
                        .unwrap_or_default(),
                })
                .collect()
        };
        if revokes.is_empty() {
            return;
        }
        if let Some(inv) = self.invalidator.get().cloned() {
            tokio::task::spawn_blocking(move || inv(&revokes));
        }
    }

    /// Marks a kernel reply that carries what a lease allows: revokes wait until it is
    /// sent, so the kernel never receives a lease's cache time after the lease was revoked.
    /// Read the lease ([`FsClient::attr_ttl`] and others) after this.
    pub fn begin_reply(&self) -> ReplyGuard<'_> {
        self.replying.fetch_add(1, Ordering::SeqCst);
        ReplyGuard(&self.replying)
    }

    /// How long the kernel may cache `ino`'s attributes (what remains of its shared lease).
    pub fn attr_ttl(&self, ino: Ino) -> Duration {
        let caps = self.caps.lock().expect("caps lock");
        caps.valid(ino, CAP_SHARED).map_or(Duration::ZERO, |u| {
            u.saturating_duration_since(Instant::now())
        })
    }

    /// How long the kernel may cache the entry `name` of `parent` naming `ino` (both leases).
    pub fn entry_ttl(&self, parent: Ino, ino: Ino) -> Duration {
        let caps = self.caps.lock().expect("caps lock");
        match (caps.valid(parent, CAP_SHARED), caps.valid(ino, CAP_SHARED)) {
            (Some(a), Some(b)) => a.min(b).saturating_duration_since(Instant::now()),
            _ => Duration::ZERO,
        }
    }

    /// Whether this client holds the read cache of `ino` (its pages stay valid across
    /// opens: nobody changed the file since they were read).
    pub fn has_read_cache(&self, ino: Ino) -> bool {
        self.caps
            .lock()
            .expect("caps lock")
            .valid(ino, CAP_READ)
            .is_some()
    }

    /// A direct (`O_DIRECT`) write of `ino` reached the data objects around the kernel's
    /// page cache: this mount's cached pages of the file may be stale. The read cache is
    /// given up here (the next open drops the pages instead of keeping them), and with
    /// `cached_opens` (a handle that reads through the page cache is open) the kernel drops
    /// them now, before the write is acknowledged.
    pub async fn direct_written(&self, ino: Ino, cached_opens: bool) {
        {
            let mut caps = self.caps.lock().expect("caps lock");
            if let Some((held, _)) = caps.leases.get_mut(&ino) {
                *held &= !CAP_READ;
            }
        }
        if cached_opens {
            self.drop_kernel_pages(ino).await;
        }
    }

    /// Has the kernel drop its cached pages (and attributes) of `ino`.
    pub async fn drop_kernel_pages(&self, ino: Ino) {
        self.drop_kernel_copy(ino, CAP_READ).await;
    }

    /// Has the kernel drop its cached attributes of `ino` (`caps`: and its pages, with
    /// [`CAP_READ`]).
    async fn drop_kernel_copy(&self, ino: Ino, caps: u8) {
        if let Some(inv) = self.invalidator.get().cloned() {
            let what = [CapRevoke {
                id: 0,
                ino,
                caps,
                names: Vec::new(),
            }];
            if let Err(e) = tokio::task::spawn_blocking(move || inv(&what)).await {
                warn!("dropping the kernel's copy of {ino:x}: {e}");
            }
        }
    }

    /// Records what a reply granted (unless a revoke arrived while it was in flight).
    fn take_grants(&self, op: &Op, reply: &Reply, data: &[u8], epoch: u64, sent: Instant) {
        if data.is_empty() {
            return;
        }
        let Ok(g) = serde_json::from_slice::<CapGrants>(data) else {
            return;
        };
        let mut caps = self.caps.lock().expect("caps lock");
        for ino in &g.changed {
            caps.inodes.remove(ino);
        }
        if caps.epoch != epoch {
            return;
        }
        let until = sent + Duration::from_millis(g.lease_ms).saturating_sub(LEASE_MARGIN);
        for (ino, c) in &g.caps {
            if caps.valid(*ino, CAP_SHARED).is_none() {
                // a listing cached under an earlier lease may have missed revokes
                caps.listed.remove(ino);
                caps.complete.remove(ino);
            }
            let e = caps.leases.entry(*ino).or_insert((0, until));
            if e.1 <= Instant::now() {
                e.0 = 0;
            }
            e.0 |= c;
            e.1 = until;
        }
        // the change's other inodes as they are now (a create's directory), where this client
        // may cache them
        for i in &g.updated {
            if caps.valid(i.ino, CAP_SHARED).is_some() {
                let mut i = i.clone();
                caps.overlay(&mut i);
                caps.inodes.insert(i.ino, i);
            }
        }
        let shared = |ino: Ino| g.caps.iter().any(|(i, c)| *i == ino && c & CAP_SHARED != 0);
        if let Reply::Attr(i) = reply
            && shared(i.ino)
        {
            caps.inodes.insert(i.ino, i.clone());
            if matches!(op, Op::Mkdir { .. }) {
                // made just now by this client, under the lease: no entries yet
                caps.complete.insert(i.ino, HashSet::new());
            }
        }
        let entry = match op {
            Op::Lookup { parent, name }
            | Op::Mknod { parent, name, .. }
            | Op::Mkdir { parent, name, .. }
            | Op::Symlink { parent, name, .. }
            | Op::Link { parent, name, .. } => Some((*parent, name)),
            _ => None,
        };
        if let Some((parent, name)) = entry
            && shared(parent)
        {
            caps.names.entry(parent).or_default().insert(name.clone());
        }
    }

    pub fn rados(&self) -> &Rados {
        &self.rados
    }

    async fn mds_addr(&self) -> Result<SocketAddr> {
        if let Some(a) = self.opts.mds_addr {
            return Ok(a);
        }
        if self.in_map
            && let Some(fs) = &self.opts.fs_name
        {
            let map = self.rados.fs_map().await?;
            return map
                .filesystems
                .get(fs)
                .and_then(|i| i.active.as_ref())
                .filter(|a| a.state == kelp_client::MdsState::Active)
                .map(|a| a.addr)
                .ok_or_else(|| FsError::Config(format!("file system {fs} has no active MDS")));
        }
        let b = self.meta.read(ADDR_OBJECT, 0, 0).await?;
        let a: MdsAddr = serde_json::from_slice(&b).map_err(|e| FsError::Malformed {
            what: "MDS address".into(),
            detail: e.to_string(),
        })?;
        Ok(a.addr)
    }

    /// Sends `op` to the MDS and returns its reply (errno replies as `FsError::Errno`).
    ///
    /// Every retry (after a broken connection, a timeout, or to the MDS that took over) sends
    /// the same request with the same tid, so that a mutation the MDS completed but whose
    /// reply was lost is answered from its completed-request table, not applied twice.
    pub async fn call(&self, caller: Caller, op: Op) -> Result<Reply> {
        if !matches!(op, Op::TakeInos) {
            // creates answered here come first (the MDS may handle requests out of order)
            self.settle_behind().await;
        }
        self.call_as(caller, op, None).await
    }

    /// [`FsClient::call`] without waiting for the creates sent behind; `delegated`: the
    /// request is one of them, with the inode number given here.
    async fn call_as(&self, caller: Caller, op: Op, delegated: Option<Ino>) -> Result<Reply> {
        if self.unjournaled.lock().expect("unjournaled lock").len() >= MAX_UNJOURNALED {
            // one sync at a time: the requests that find the limit reached wait for it
            let _one = self.syncing.lock().await;
            if self.unjournaled.lock().expect("unjournaled lock").len() >= MAX_UNJOURNALED {
                self.sync_journal().await?;
            }
        }
        // a change of a directory's entries by this mount: its cached listing is read again
        let dirs = op.changed_dirs();
        dirs.iter().for_each(|d| self.dir_changed(*d));
        let names = (!dirs.is_empty()).then(|| op.clone());
        let r = self.call_once(caller, op, delegated).await;
        dirs.iter().for_each(|d| self.dir_changed(*d));
        if let Some(op) = names {
            self.caps
                .lock()
                .expect("caps lock")
                .entries_changed(&op, r.is_ok());
        }
        r
    }

    async fn call_once(&self, caller: Caller, op: Op, delegated: Option<Ino>) -> Result<Reply> {
        let (mut env, _unanswered) = self.envelope(caller, op);
        if delegated.is_some() {
            env.ino_hint = delegated;
            env.delegated = true;
        }
        let meta = Bytes::from(serde_json::to_vec(&env).expect("requests serialize"));
        self.calls.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let mut delay = Duration::from_millis(50);
        loop {
            let conn = self.connection().await;
            let err = match conn {
                Ok((conn, made)) => {
                    let epoch = self.caps.lock().expect("caps lock").epoch;
                    let sent = Instant::now();
                    match conn
                        .call(
                            MSG_MDS_REQUEST,
                            meta.clone(),
                            Bytes::new(),
                            self.opts.call_timeout,
                        )
                        .await
                    {
                        Ok(_) if self.conns.load(Ordering::SeqCst) != made => {
                            // answered by an MDS this client has since left: it may have
                            // been replaced before journaling the change
                            warn!(
                                tid = env.tid,
                                "an answer over an old MDS connection: sending it again"
                            );
                            continue;
                        }
                        Ok(resp) => {
                            let mut reply = decode_reply(&resp.meta)?;
                            if let Reply::Attr(i) = &mut reply {
                                self.caps.lock().expect("caps lock").overlay(i);
                            }
                            self.take_grants(&env.op, &reply, &resp.data, epoch, sent);
                            if resp.msg_type == MSG_MDS_UNSAFE && !matches!(reply, Reply::Err(_)) {
                                match self.keep_unjournaled(env, &reply, made) {
                                    None => {
                                        _unanswered.keep();
                                        return Ok(reply);
                                    }
                                    Some(back) => {
                                        warn!(
                                            tid = back.tid,
                                            "an early answer over an old MDS connection: sending it again"
                                        );
                                        env = back;
                                        continue;
                                    }
                                }
                            }
                            match reply {
                                Reply::Err(e) if e == errno::ESHUTDOWN => {
                                    // a fenced MDS: find the one that replaced it
                                    *self.conn.lock().await = None;
                                    FsError::Errno(e)
                                }
                                Reply::Err(e) => return Err(FsError::Errno(e)),
                                r => return Ok(r),
                            }
                        }
                        Err(MsgrError::Remote { error: r, .. }) => {
                            return Err(FsError::Errno(if r.code < 4096 {
                                r.code as i32
                            } else {
                                errno::EIO
                            }));
                        }
                        Err(e) => {
                            *self.conn.lock().await = None;
                            FsError::from(e)
                        }
                    }
                }
                Err(e) => e,
            };
            if start.elapsed() > self.opts.reconnect_timeout {
                return Err(err);
            }
            warn!("MDS unreachable ({err}); retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// The envelope of a new request: the next tid, and the oldest tid still unanswered
    /// (this one included) until the guard drops.
    fn envelope(&self, caller: Caller, op: Op) -> (Envelope, Unanswered<'_>) {
        let (tid, oldest_tid) = self.tids.lock().expect("tids lock").begin();
        let env = Envelope {
            v: PROTOCOL_VERSION,
            client: self.id,
            caller,
            op,
            tid,
            oldest_tid,
            ino_hint: None,
            delegated: false,
        };
        (env, Unanswered(self, tid))
    }

    /// A request that is not tracked in the completed-request table (no tid).
    fn untracked(&self, op: Op) -> Envelope {
        Envelope {
            v: PROTOCOL_VERSION,
            client: self.id,
            caller: Caller::default(),
            op,
            tid: 0,
            oldest_tid: 0,
            ino_hint: None,
            delegated: false,
        }
    }

    /// The MDS connection. A new one first drops every lease, sends the changes not known
    /// to be journaled again (the MDS may be a new one that lacks them) and re-registers the
    /// open files, before any other request uses it.
    /// Also returns the connection's number (see [`FsClient::conns`]).
    async fn connection(&self) -> Result<(Connection, u64)> {
        let mut c = self.conn.lock().await;
        if let Some(conn) = &*c {
            return Ok((conn.clone(), self.conns.load(Ordering::SeqCst)));
        }
        // from here on, replies over the previous connection are not kept: their changes
        // are either in the kept set sent again below, or go again themselves
        let made = {
            let _kept = self.unjournaled.lock().expect("unjournaled lock");
            self.conns.fetch_add(1, Ordering::SeqCst) + 1
        };
        let addr = self.mds_addr().await?;
        self.msgr.disconnect(addr);
        let conn = self.msgr.connect(addr).await?;
        info!(%addr, "connected to the MDS");
        self.drop_all_leases();
        self.replay_unjournaled(&conn).await?;
        self.reregister(&conn).await;
        *c = Some(conn.clone());
        Ok((conn, made))
    }

    // early replies (unsafe until journaled)
    /// Keeps a change the MDS answered before journaling it (a create with the inode
    /// number it was given, which an MDS that takes over reuses).
    /// The envelope back: the reply came over connection `made`, older than the current one,
    /// and the request is not kept (it goes again).
    fn keep_unjournaled(&self, mut env: Envelope, reply: &Reply, made: u64) -> Option<Envelope> {
        if let (Op::Mknod { .. } | Op::Mkdir { .. } | Op::Symlink { .. }, Reply::Attr(i)) =
            (&env.op, reply)
        {
            env.ino_hint = Some(i.ino);
        }
        let mut kept = self.unjournaled.lock().expect("unjournaled lock");
        if self.conns.load(Ordering::SeqCst) != made {
            return Some(env);
        }
        kept.insert(env.tid, env);
        None
    }

    /// Forgets kept changes (journaled, or refused when sent again): their tids end.
    fn forget_unjournaled(&self, tids: &[u64]) {
        let mut u = self.unjournaled.lock().expect("unjournaled lock");
        let mut t = self.tids.lock().expect("tids lock");
        for tid in tids {
            u.remove(tid);
            t.end(*tid);
        }
    }

    /// Waits until every change the MDS has answered this client so far is in its journal
    /// in RADOS (`fsync`, the periodic sync, unmount), the creates sent behind included.
    pub async fn sync_mds(&self) -> Result<()> {
        self.settle_behind().await;
        self.sync_journal().await
    }

    /// [`FsClient::sync_mds`] without waiting for the creates sent behind.
    async fn sync_journal(&self) -> Result<()> {
        let tids: Vec<u64> = self
            .unjournaled
            .lock()
            .expect("unjournaled lock")
            .keys()
            .copied()
            .collect();
        if tids.is_empty() {
            return Ok(());
        }
        match self.call_once(Caller::default(), Op::Sync, None).await? {
            Reply::Ok => {
                self.forget_unjournaled(&tids);
                Ok(())
            }
            r => Err(unexpected(r)),
        }
    }

    /// Sends the kept changes again, oldest first, on a new connection: an MDS that has them
    /// (journaled, or the same MDS) answers from its completed-request table; one that took
    /// over without them makes them again. One it refuses is logged and forgotten (as if the
    /// MDS had failed before answering it the first time).
    async fn replay_unjournaled(&self, conn: &Connection) -> Result<()> {
        let kept: Vec<Envelope> = self
            .unjournaled
            .lock()
            .expect("unjournaled lock")
            .values()
            .cloned()
            .collect();
        if kept.is_empty() {
            return Ok(());
        }
        warn!(
            changes = kept.len(),
            "sending changes not known to be journaled to the MDS again"
        );
        for env in kept {
            let meta = Bytes::from(serde_json::to_vec(&env).expect("requests serialize"));
            let resp = conn
                .call(MSG_MDS_REQUEST, meta, Bytes::new(), self.opts.call_timeout)
                .await?;
            match decode_reply(&resp.meta)? {
                Reply::Err(e) if e == errno::ESHUTDOWN => return Err(FsError::Errno(e)),
                Reply::Err(e) => {
                    error!(
                        tid = env.tid,
                        op = ?env.op,
                        errno = e,
                        "a change the previous MDS answered could not be made again after the takeover"
                    );
                    self.forget_unjournaled(&[env.tid]);
                }
                _ if resp.msg_type != MSG_MDS_UNSAFE => self.forget_unjournaled(&[env.tid]),
                _ => {}
            }
        }
        Ok(())
    }

    /// Tells a (new) MDS which files this client holds open.
    async fn reregister(&self, conn: &Connection) {
        let mut counts: HashMap<Ino, u32> = self.opens.lock().expect("opens lock").clone();
        // closes not sent yet are registrations the MDS is told of as well
        for (ino, (n, _)) in self.closing.lock().expect("closing lock").iter() {
            *counts.entry(*ino).or_default() += n;
        }
        // a create sent behind and not yet answered registers its own open when it is made
        for p in self
            .sent_behind
            .lock()
            .expect("sent-behind lock")
            .pending
            .values()
        {
            if let SentOp::Create(ino) = p
                && let Some(n) = counts.get_mut(ino)
            {
                *n = n.saturating_sub(1);
            }
        }
        let opens: Vec<(Ino, u32)> = counts.into_iter().collect();
        let env = self.untracked(Op::Reconnect { opens });
        let meta = serde_json::to_vec(&env).expect("requests serialize");
        if let Err(e) = conn
            .call(MSG_MDS_REQUEST, meta, Bytes::new(), self.opts.call_timeout)
            .await
        {
            warn!("re-registering open files: {e}");
        }
    }

    async fn attr_call(&self, caller: Caller, op: Op) -> Result<Inode> {
        match self.call(caller, op).await? {
            Reply::Attr(i) => Ok(i),
            r => Err(unexpected(r)),
        }
    }

    async fn ok_call(&self, caller: Caller, op: Op) -> Result<()> {
        match self.call(caller, op).await? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    pub async fn lookup(&self, caller: Caller, parent: Ino, name: &str) -> Result<Inode> {
        if self.known_absent(parent, name) {
            return Err(FsError::Errno(errno::ENOENT));
        }
        self.attr_call(
            caller,
            Op::Lookup {
                parent,
                name: name.into(),
            },
        )
        .await
    }

    /// Whether `name` is known here to be absent from `parent` (a complete directory).
    pub fn known_absent(&self, parent: Ino, name: &str) -> bool {
        self.caps
            .lock()
            .expect("caps lock")
            .known_absent(parent, name)
    }

    /// This client's copy of `ino`, while it holds the shared lease on it.
    pub fn cached_attr(&self, ino: Ino) -> Option<Inode> {
        self.cached(ino, Inode::clone)
    }

    /// `f` of this client's copy of `ino`, while it holds the shared lease on it.
    fn cached<T>(&self, ino: Ino, f: impl FnOnce(&Inode) -> T) -> Option<T> {
        let caps = self.caps.lock().expect("caps lock");
        caps.valid(ino, CAP_SHARED)?;
        caps.inodes.get(&ino).map(f)
    }

    /// The inode's attributes: this client's copy while it holds a shared lease on it.
    pub async fn getattr(&self, caller: Caller, ino: Ino) -> Result<Inode> {
        if let Some(i) = self.cached_attr(ino) {
            return Ok(i);
        }
        self.attr_call(caller, Op::GetAttr { ino }).await
    }

    /// The attributes for a read through the page cache: the MDS's reply grants the read
    /// cache when this client does not hold it, so that the pages the kernel keeps from the
    /// read are dropped by the revoke of the next change by another client.
    pub async fn getattr_for_read(&self, caller: Caller, ino: Ino) -> Result<Inode> {
        if self.has_read_cache(ino) {
            return self.getattr(caller, ino).await;
        }
        self.attr_call(caller, Op::GetAttr { ino }).await
    }

    /// Changes attributes; a size change also cuts (or leaves sparse) the data objects.
    ///
    /// Under the exclusive capability a change of mode, owner or times is made here and
    /// sent with the size at the next flush (the kernel has checked the caller may make it,
    /// as for every setattr: `default_permissions`).
    pub async fn setattr(&self, caller: Caller, ino: Ino, set: SetAttr) -> Result<Inode> {
        if let Some(i) = self.set_locally(ino, &set) {
            return Ok(i);
        }
        // what this client kept of the file must not come after this change and undo it
        let _sizes = self.size_lock(ino).await;
        self.flush_locked(ino, true).await?;
        if let Some(size) = set.size {
            let old = self.getattr(caller, ino).await?;
            if size < old.size {
                self.truncate_data(&old, size).await?;
            }
        }
        self.attr_call(caller, Op::SetAttr { ino, set }).await
    }

    /// Kills `ino`'s set-user-ID and set-group-ID bits if it has them ([`killed_mode`]): the
    /// mount does it for the kernel (`FUSE_HANDLE_KILLPRIV_V2`) before a write, truncate or
    /// `fallocate` by a caller without `CAP_FSETID`. Made as the file system's own change,
    /// not the caller's (who need not own the file to write it); the kernel's copy of the
    /// attributes is dropped (it learns the new mode at its next look).
    pub async fn kill_privs(&self, ino: Ino) -> Result<()> {
        let i = self.getattr(Caller::default(), ino).await?;
        if let Some(mode) = killed_mode(i.mode) {
            let set = SetAttr {
                mode: Some(mode),
                ..SetAttr::default()
            };
            self.setattr(Caller::default(), ino, set).await?;
            self.drop_kernel_copy(ino, CAP_SHARED).await;
        }
        Ok(())
    }

    /// Whether this client's copy of `ino` shows no set-user-ID or set-group-ID bit to kill
    /// (`false` when it holds no copy).
    pub fn nothing_to_kill(&self, ino: Ino) -> bool {
        self.cached(ino, |i| killed_mode(i.mode).is_none())
            .unwrap_or(false)
    }

    /// [`FsClient::setattr`] under the exclusive capability: the new attributes, or `None`
    /// when the capability (or the cached inode) is not here, or the size changes.
    pub fn set_locally(&self, ino: Ino, set: &SetAttr) -> Option<Inode> {
        if set.size.is_some() {
            return None;
        }
        let mut caps = self.caps.lock().expect("caps lock");
        caps.valid(ino, CAP_EXCL)?;
        // (a directory's exclusive lease is for creates in it: its attributes go to the MDS)
        let mut shown = caps
            .inodes
            .get(&ino)
            .filter(|i| i.kind() == S_IFREG)?
            .clone();
        caps.overlay(&mut shown);
        let now = Time::now();
        let d = caps.dirty_of(&shown);
        d.attrs.mode = set.mode.or(d.attrs.mode);
        d.attrs.uid = set.uid.or(d.attrs.uid);
        d.attrs.gid = set.gid.or(d.attrs.gid);
        d.attrs.atime = set.atime.map(|t| SetTime::At(t.at(now))).or(d.attrs.atime);
        if let Some(t) = set.mtime {
            d.mtime = t.at(now);
        }
        d.ctime = now;
        d.generation += 1;
        let mtime = d.mtime;
        set.apply_attrs(&mut shown, now);
        shown.mtime = mtime;
        shown.ctime = now;
        caps.inodes.insert(ino, shown.clone());
        Some(shown)
    }

    pub async fn mknod(
        &self,
        caller: Caller,
        parent: Ino,
        name: &str,
        mode: u32,
        rdev: u32,
        exclusive: bool,
    ) -> Result<Inode> {
        self.attr_call(
            caller,
            Op::Mknod {
                parent,
                name: name.into(),
                mode,
                rdev,
                exclusive,
                open: false,
                write: false,
            },
        )
        .await
    }

    // creates without a round trip (delegated inode numbers)
    /// Creates the regular file `name` in `parent` without waiting for the MDS, when this
    /// client may (`core::delegate`): it holds the directory exclusively (it made it, where
    /// no quota or layout applies), knows every name in it, and has an inode number the MDS
    /// delegated to it. The file is opened (for writing if `write`), shown at once, and
    /// its create goes to the MDS behind, on `rt`; every later request of this client, and
    /// the answer to a revoke of the directory's lease, waits for it first, so the MDS and
    /// other clients see the creates in order. `None`: the caller asks the MDS.
    pub fn create_now(
        self: &Arc<Self>,
        rt: &tokio::runtime::Handle,
        caller: Caller,
        parent: Ino,
        name: &str,
        mode: u32,
        write: bool,
    ) -> Option<Inode> {
        if mode & S_IFMT != S_IFREG || name_error(name).is_some() || self.rados.cluster_full() {
            return None;
        }
        let (i, seq) = {
            let mut caps = self.caps.lock().expect("caps lock");
            let until = caps.valid(parent, CAP_EXCL)?;
            if !caps.known_absent(parent, name) {
                return None;
            }
            let p = caps.inodes.get(&parent).filter(|p| p.is_dir())?.clone();
            let mut creates = self.sent_behind.lock().expect("sent-behind lock");
            if creates.pending.len() >= MAX_SENT_BEHIND {
                return None;
            }
            if creates.left() < crate::core::DELEGATION_SIZE / 4 && !creates.taking {
                creates.taking = true;
                let c = Arc::clone(self);
                rt.spawn(async move { c.take_inos().await });
            }
            if creates.unlinking(parent, name) {
                return None;
            }
            let ino = creates.take()?;
            creates.last += 1;
            let seq = creates.last;
            creates.pending.insert(seq, SentOp::Create(ino));
            drop(creates);
            // as the MDS makes it (`Namespace::new_inode`, the default layout)
            let now = Time::now();
            let i = Inode {
                ino,
                mode,
                uid: caller.uid,
                gid: if p.mode & S_ISGID != 0 {
                    p.gid
                } else {
                    caller.gid
                },
                nlink: 1,
                atime: now,
                mtime: now,
                ctime: now,
                parent,
                object_size: p.object_size,
                ..Inode::default()
            };
            // what the MDS grants with a create that opens (`Mds::grant_for_reply`)
            let held = CAP_SHARED | CAP_READ | if write { CAP_EXCL } else { 0 };
            caps.leases.insert(ino, (held, until));
            caps.inodes.insert(ino, i.clone());
            if let Some(names) = caps.complete.get_mut(&parent) {
                names.insert(name.to_string());
            }
            caps.names
                .entry(parent)
                .or_default()
                .insert(name.to_string());
            caps.made
                .entry(parent)
                .or_default()
                .insert(name.to_string(), (ino, seq));
            caps.listed.remove(&parent);
            caps.dir_times(parent, now);
            (i, seq)
        };
        *self
            .opens
            .lock()
            .expect("opens lock")
            .entry(i.ino)
            .or_default() += 1;
        if write && self.inline_ok.load(Ordering::Relaxed) {
            self.inline_bufs
                .lock()
                .expect("inline lock")
                .insert(i.ino, InlineBuf::default());
        }
        let c = Arc::clone(self);
        let op = Op::Mknod {
            parent,
            name: name.to_string(),
            mode,
            rdev: 0,
            exclusive: true,
            open: true,
            write,
        };
        let ino = i.ino;
        rt.spawn(async move {
            let r = c.call_as(caller, op.clone(), Some(ino)).await;
            match r {
                Ok(Reply::Attr(made)) if made.ino == ino => {}
                Ok(r) => c.create_refused(&op, ino, unexpected(r)).await,
                Err(e) => c.create_refused(&op, ino, e).await,
            }
            c.answered_behind(seq);
        });
        Some(i)
    }

    /// A change sent behind (`seq`) was answered: the requests waiting for it go on.
    fn answered_behind(&self, seq: u64) {
        let mut sent = self.sent_behind.lock().expect("sent-behind lock");
        if let Some(SentOp::Unlink { .. }) = sent.pending.remove(&seq) {
            sent.unlinks -= 1;
        }
        drop(sent);
        self.behind_done.notify_waiters();
    }

    /// Removes the file `name` of `parent` without waiting for the MDS, when this client may:
    /// it holds the directory exclusively and made the file there itself
    /// ([`FsClient::create_now`]); the file has no other name, is not open here, and has no
    /// size, attributes or data writes on their way. The unlink goes to the MDS behind (after
    /// the file's own create, when that is still on its way); every later request of this
    /// client, its `fsync` and `Sync`, and its answer to a revoke of the directory's lease wait
    /// for it first. A create of the same name waits for it too (asks the MDS). `false`: the
    /// caller asks the MDS.
    pub fn unlink_now(
        self: &Arc<Self>,
        rt: &tokio::runtime::Handle,
        caller: Caller,
        parent: Ino,
        name: &str,
    ) -> bool {
        let (ino, created, seq, sizes) = {
            let mut caps = self.caps.lock().expect("caps lock");
            if caps.valid(parent, CAP_EXCL).is_none()
                || !caps.complete.get(&parent).is_some_and(|n| n.contains(name))
            {
                return false;
            }
            let Some((ino, created)) = caps.made.get(&parent).and_then(|m| m.get(name)).copied()
            else {
                return false;
            };
            let alone = caps.inodes.get(&ino).is_some_and(|i| {
                i.kind() == S_IFREG && i.nlink == 1 && i.ino == ino && i.parent == parent
            });
            if !alone
                || caps.dirty.contains_key(&ino)
                || self.behind.busy(ino)
                || self.opens.lock().expect("opens lock").contains_key(&ino)
            {
                return false;
            }
            let mut sent = self.sent_behind.lock().expect("sent-behind lock");
            if sent.pending.len() >= MAX_SENT_BEHIND {
                return false;
            }
            // no size or attributes of the file are on their way either
            let Ok(sizes) = self.size_lock_of(ino).try_lock_owned() else {
                return false;
            };
            sent.last += 1;
            let seq = sent.last;
            sent.pending.insert(
                seq,
                SentOp::Unlink {
                    parent,
                    name: name.to_string(),
                },
            );
            sent.unlinks += 1;
            drop(sent);
            // as the MDS leaves it: the name gone, the directory's times moved
            caps.entry_changes += 1;
            if let Some(names) = caps.complete.get_mut(&parent) {
                names.remove(name);
            }
            if let Some(names) = caps.names.get_mut(&parent) {
                names.remove(name);
            }
            if let Some(m) = caps.made.get_mut(&parent) {
                m.remove(name);
            }
            caps.listed.remove(&parent);
            caps.inodes.remove(&ino);
            caps.leases.remove(&ino);
            caps.flushed.remove(&ino);
            caps.dir_times(parent, Time::now());
            (ino, created, seq, sizes)
        };
        let c = Arc::clone(self);
        let name = name.to_string();
        rt.spawn(async move {
            let _held = SizeLock {
                client: &c,
                ino,
                guard: Some(sizes),
            };
            // the MDS may handle two requests in either order: the file's create goes first
            c.wait_behind(|b| !b.pending.contains_key(&created)).await;
            let op = Op::Unlink {
                parent,
                name: name.clone(),
            };
            match c.call_as(caller, op, None).await {
                Ok(Reply::Ok) => {}
                Ok(r) => c.unlink_refused(parent, &name, ino, unexpected(r)),
                Err(e) => c.unlink_refused(parent, &name, ino, e),
            }
            c.answered_behind(seq);
        });
        true
    }

    /// An unlink answered here was refused by the MDS (it cannot happen while the rules of
    /// [`FsClient::unlink_now`] hold; logged loudly): the directory is no longer known
    /// whole, so the next lookup of the name asks the MDS, which still has the file.
    fn unlink_refused(&self, parent: Ino, name: &str, ino: Ino, e: FsError) {
        error!(
            ino,
            parent,
            name,
            "the MDS refused an unlink this mount had answered ({e}): the file is still there"
        );
        self.caps
            .lock()
            .expect("caps lock")
            .complete
            .remove(&parent);
    }

    /// Asks the MDS for more inode numbers to give (in the background).
    async fn take_inos(&self) {
        let r = self.call_as(Caller::default(), Op::TakeInos, None).await;
        let mut creates = self.sent_behind.lock().expect("sent-behind lock");
        creates.taking = false;
        match r {
            Ok(Reply::Inos { start, end }) if start < end => creates.inos.push_back((start, end)),
            Ok(r) => warn!("asking the MDS for inode numbers: {}", unexpected(r)),
            // an MDS without delegation: creates keep asking it
            Err(e) => debug!("asking the MDS for inode numbers: {e}"),
        }
    }

    /// A create answered here was refused by the MDS (it cannot happen while the rules of
    /// `core::delegate` hold; logged loudly): the file is taken back out of this client's
    /// and the kernel's caches, and its next `write`, `fsync` or `close` fails with EIO.
    async fn create_refused(&self, op: &Op, ino: Ino, e: FsError) {
        let Op::Mknod { parent, name, .. } = op else {
            return;
        };
        error!(
            ino,
            parent,
            name,
            "the MDS refused a create this mount had answered ({e}): the file is gone"
        );
        {
            let mut caps = self.caps.lock().expect("caps lock");
            caps.inodes.remove(&ino);
            caps.leases.remove(&ino);
            caps.dirty.remove(&ino);
            caps.complete.remove(parent);
            if let Some(names) = caps.names.get_mut(parent) {
                names.remove(name);
            }
            if let Some(m) = caps.made.get_mut(parent) {
                m.remove(name);
            }
        }
        self.opens.lock().expect("opens lock").remove(&ino);
        self.behind.keep_error(ino, errno::EIO);
        if let Some(inv) = self.invalidator.get().cloned() {
            let gone = [
                CapRevoke {
                    id: 0,
                    ino: *parent,
                    caps: CAP_SHARED,
                    names: vec![name.clone()],
                },
                CapRevoke {
                    id: 0,
                    ino,
                    caps: CAP_SHARED | CAP_READ,
                    names: Vec::new(),
                },
            ];
            if let Err(e) = tokio::task::spawn_blocking(move || inv(&gone)).await {
                warn!("dropping the kernel's entry of a refused create: {e}");
            }
        }
    }

    /// Waits until the creates and unlinks sent behind so far are answered (not later ones).
    async fn settle_behind(&self) {
        let upto = self.sent_behind.lock().expect("sent-behind lock").last;
        self.wait_behind(|b| {
            b.pending
                .first_key_value()
                .is_none_or(|(seq, _)| *seq > upto)
        })
        .await
    }

    /// Waits until `done` holds of the changes sent behind (checked after each answer).
    async fn wait_behind(&self, done: impl Fn(&SentBehind) -> bool) {
        loop {
            let answered = self.behind_done.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if done(&self.sent_behind.lock().expect("sent-behind lock")) {
                return;
            }
            answered.await;
        }
    }

    /// Creates a regular file (or returns the existing one, without `exclusive`) and opens
    /// it, in one MDS request; `write` as for [`FsClient::open`].
    pub async fn create(
        &self,
        caller: Caller,
        parent: Ino,
        name: &str,
        mode: u32,
        exclusive: bool,
        write: bool,
    ) -> Result<Inode> {
        let i = self
            .attr_call(
                caller,
                Op::Mknod {
                    parent,
                    name: name.into(),
                    mode,
                    rdev: 0,
                    exclusive,
                    open: true,
                    write,
                },
            )
            .await?;
        let again = {
            let mut o = self.opens.lock().expect("opens lock");
            let n = o.entry(i.ino).or_default();
            *n += 1;
            *n > 1
        };
        if again {
            // an existing file this client had open already: the MDS counts one open per
            // client, so the one the create added goes again
            self.ok_call(Caller::default(), Op::Close { ino: i.ino })
                .await?;
        } else if write
            && i.kind() == S_IFREG
            && i.size == 0
            && !i.inline
            && i.layout.pool.is_none()
            && self.has_exclusive(i.ino)
            && self.inline_ok.load(Ordering::Relaxed)
        {
            // an empty file held exclusively: its writes are kept (inline data) as those
            // of a file made by `create_now` (not where a layout names the pool for data)
            self.inline_bufs
                .lock()
                .expect("inline lock")
                .entry(i.ino)
                .or_default();
        }
        Ok(i)
    }

    pub async fn mkdir(&self, caller: Caller, parent: Ino, name: &str, mode: u32) -> Result<Inode> {
        self.attr_call(
            caller,
            Op::Mkdir {
                parent,
                name: name.into(),
                mode,
            },
        )
        .await
    }

    pub async fn symlink(
        &self,
        caller: Caller,
        parent: Ino,
        name: &str,
        target: &str,
    ) -> Result<Inode> {
        self.attr_call(
            caller,
            Op::Symlink {
                parent,
                name: name.into(),
                target: target.into(),
            },
        )
        .await
    }

    pub async fn link(&self, caller: Caller, ino: Ino, parent: Ino, name: &str) -> Result<Inode> {
        self.attr_call(
            caller,
            Op::Link {
                ino,
                parent,
                name: name.into(),
            },
        )
        .await
    }

    pub async fn unlink(&self, caller: Caller, parent: Ino, name: &str) -> Result<()> {
        self.ok_call(
            caller,
            Op::Unlink {
                parent,
                name: name.into(),
            },
        )
        .await
    }

    pub async fn rmdir(&self, caller: Caller, parent: Ino, name: &str) -> Result<()> {
        self.ok_call(
            caller,
            Op::Rmdir {
                parent,
                name: name.into(),
            },
        )
        .await
    }

    pub async fn rename(
        &self,
        caller: Caller,
        parent: Ino,
        name: &str,
        new_parent: Ino,
        new_name: &str,
        flags: u32,
    ) -> Result<()> {
        self.ok_call(
            caller,
            Op::Rename {
                parent,
                name: name.into(),
                new_parent,
                new_name: new_name.into(),
                flags,
            },
        )
        .await
    }

    /// Every entry of a directory, in name order.
    pub async fn readdir(&self, caller: Caller, ino: Ino) -> Result<Vec<(String, Dentry)>> {
        let mut out: Vec<(String, Dentry)> = Vec::new();
        loop {
            let after = out.last().map(|(n, _)| n.clone());
            match self
                .call(
                    caller,
                    Op::ReadDir {
                        ino,
                        after,
                        max: 1024,
                    },
                )
                .await?
            {
                Reply::Entries { entries, more } => {
                    out.extend(entries);
                    if !more {
                        return Ok(out);
                    }
                }
                r => return Err(unexpected(r)),
            }
        }
    }

    pub async fn setxattr(
        &self,
        caller: Caller,
        ino: Ino,
        name: &str,
        value: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.ok_call(
            caller,
            Op::SetXattr {
                ino,
                name: name.into(),
                value: value.to_vec(),
                flags,
            },
        )
        .await
    }

    /// An extended attribute from this client's copy of `ino` (not Kelp's virtual `kelp.`
    /// ones), while it holds the shared lease: `None` when the MDS must be asked.
    pub fn cached_xattr(&self, ino: Ino, name: &str) -> Option<Result<Vec<u8>>> {
        if name.starts_with("kelp.") {
            return None;
        }
        self.cached(ino, |i| {
            i.xattrs
                .get(name)
                .cloned()
                .ok_or(FsError::Errno(errno::ENODATA))
        })
    }

    /// An inode's extended attribute: from this client's copy while it holds the shared
    /// lease (a change of them revokes it), except the MDS's virtual `kelp.` ones.
    pub async fn getxattr(&self, caller: Caller, ino: Ino, name: &str) -> Result<Vec<u8>> {
        if let Some(x) = self.cached_xattr(ino, name) {
            return x;
        }
        match self
            .call(
                caller,
                Op::GetXattr {
                    ino,
                    name: name.into(),
                },
            )
            .await?
        {
            Reply::Xattr(v) => Ok(v),
            r => Err(unexpected(r)),
        }
    }

    pub async fn listxattr(&self, caller: Caller, ino: Ino) -> Result<Vec<String>> {
        if let Some(names) = self.cached(ino, |i| i.xattrs.keys().cloned().collect()) {
            return Ok(names);
        }
        match self.call(caller, Op::ListXattr { ino }).await? {
            Reply::XattrNames(v) => Ok(v),
            r => Err(unexpected(r)),
        }
    }

    pub async fn removexattr(&self, caller: Caller, ino: Ino, name: &str) -> Result<()> {
        self.ok_call(
            caller,
            Op::RemoveXattr {
                ino,
                name: name.into(),
            },
        )
        .await
    }

    /// Registers an open handle (an unlinked file stays until its last close). The first
    /// open `write`-ing may be granted the exclusive capability (write-back).
    pub async fn open(&self, caller: Caller, ino: Ino, write: bool) -> Result<Inode> {
        let first = {
            let mut o = self.opens.lock().expect("opens lock");
            let n = o.entry(ino).or_default();
            *n += 1;
            *n == 1
        };
        if first {
            let reuse = {
                let mut closing = self.closing.lock().expect("closing lock");
                match closing.get_mut(&ino) {
                    // still registered at the MDS (its close not sent yet): reopened without
                    // a request, unless writing needs the exclusive capability it lacks
                    Some((n, _)) if !write || self.has_exclusive(ino) => {
                        *n -= 1;
                        if *n == 0 {
                            closing.remove(&ino);
                        }
                        true
                    }
                    _ => false,
                }
            };
            if reuse {
                return match self.getattr(caller, ino).await {
                    Ok(i) => Ok(i),
                    Err(e) => {
                        self.forget_open(ino);
                        self.closed_later(ino);
                        Err(e)
                    }
                };
            }
            match self.attr_call(caller, Op::Open { ino, write }).await {
                Ok(i) => Ok(i),
                Err(e) => {
                    self.forget_open(ino);
                    Err(e)
                }
            }
        } else {
            self.getattr(caller, ino).await
        }
    }

    fn forget_open(&self, ino: Ino) -> bool {
        let mut o = self.opens.lock().expect("opens lock");
        match o.get_mut(&ino) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                o.remove(&ino);
                true
            }
            None => false,
        }
    }

    /// Whether this client keeps a size, time or attribute of `ino` the MDS has not
    /// acknowledged, or has writes of it in flight.
    pub fn has_dirty(&self, ino: Ino) -> bool {
        self.behind.busy(ino)
            || self
                .caps
                .lock()
                .expect("caps lock")
                .dirty
                .contains_key(&ino)
    }

    /// The errno of a buffered write of `ino` that failed in the background (reported once:
    /// by the file's next `write`, `fsync` or `close`).
    pub fn write_error(&self, ino: Ino) -> Option<i32> {
        self.behind.take_error(ino)
    }

    /// Closes a handle at once when that needs no MDS request (nothing kept to flush):
    /// `false` leaves it to [`FsClient::close`].
    pub fn close_quick(&self, ino: Ino) -> bool {
        if self.has_dirty(ino) {
            return false;
        }
        if self.forget_open(ino) {
            self.closed_later(ino);
        }
        true
    }

    /// Closes a handle; the last one's close reaches the MDS [`CLOSE_DELAY`] later, batched.
    pub async fn close(&self, ino: Ino) -> Result<()> {
        if self.forget_open(ino) {
            let flushed = self.flush(ino).await;
            self.closed_later(ino);
            flushed?;
        }
        Ok(())
    }

    /// Notes a close to send the MDS later.
    fn closed_later(&self, ino: Ino) {
        let mut closing = self.closing.lock().expect("closing lock");
        let e = closing.entry(ino).or_insert((0, Instant::now()));
        e.0 += 1;
        e.1 = Instant::now();
    }

    /// Sends the closes noted at least `older` ago, in one request.
    pub async fn send_closes(&self, older: Duration) -> Result<()> {
        let inos: Vec<Ino> = {
            let mut closing = self.closing.lock().expect("closing lock");
            let due: Vec<(Ino, u32)> = closing
                .iter()
                .filter(|(_, (_, at))| at.elapsed() >= older)
                .map(|(ino, (n, _))| (*ino, *n))
                .collect();
            due.iter().for_each(|(ino, _)| {
                closing.remove(ino);
            });
            due.into_iter()
                .flat_map(|(ino, n)| std::iter::repeat_n(ino, n as usize))
                .collect()
        };
        if inos.is_empty() {
            return Ok(());
        }
        // the MDS may purge a closed, unlinked file's objects: its writes are stored, and
        // its size (which the purge reads) is known there, first
        for ino in &inos {
            self.behind.settle(*ino).await;
            drop(self.size_lock(*ino).await);
        }
        self.ok_call(Caller::default(), Op::CloseMany { inos })
            .await
    }

    // write-back (exclusive capability)
    /// Sends the size and mtime written under the exclusive capability (if any) to the MDS,
    /// journaled when this returns (`fsync`, `close`, a revoke, the periodic flush).
    pub async fn flush(&self, ino: Ino) -> Result<()> {
        let _held = self.size_lock(ino).await;
        self.flush_locked(ino, true).await
    }

    /// [`FsClient::flush`] at a close: the MDS gets the size, times and attributes kept here
    /// before the close returns (so another client, also one served by an MDS that takes
    /// over, sees them), without waiting for the writes in flight to be stored (they are
    /// before the MDS answers another client about the file: it revokes the capability).
    pub async fn flush_at_close(&self, ino: Ino) -> Result<()> {
        let _held = self.size_lock(ino).await;
        self.flush_locked(ino, false).await
    }

    /// [`FsClient::flush_at_close`] without waiting for the MDS: when the file's size lock
    /// is free it is taken here, on the caller's thread (so every later change of the
    /// file's size, a revoke's flush, an `fsync`, the close sent to the MDS, is ordered
    /// after this one), and the size, times and attributes kept here go to the MDS on `rt`
    /// behind the close. A flush the MDS refuses (a byte quota set since the capability
    /// was granted) or that cannot reach it is logged and reported by the file's next
    /// `write`, `fsync` or `close`. `false`: the lock is busy; the caller waits instead.
    pub fn flush_behind_close(self: &Arc<Self>, rt: &tokio::runtime::Handle, ino: Ino) -> bool {
        let Ok(guard) = self.size_lock_of(ino).try_lock_owned() else {
            return false;
        };
        let c = Arc::clone(self);
        rt.spawn(async move {
            let _held = SizeLock {
                client: &c,
                ino,
                guard: Some(guard),
            };
            if let Err(e) = c.flush_locked(ino, false).await {
                warn!(
                    ino,
                    "sending the size kept at a close: {e} (the file's next write, fsync or close reports it)"
                );
                c.behind.keep_error(ino, e.errno());
            }
        });
        true
    }

    async fn size_lock(&self, ino: Ino) -> SizeLock<'_> {
        SizeLock {
            client: self,
            ino,
            guard: Some(self.size_lock_of(ino).lock_owned().await),
        }
    }

    /// The size lock of `ino` (made if there is none; forgotten with its last holder).
    fn size_lock_of(&self, ino: Ino) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(
            self.size_locks
                .lock()
                .expect("size locks")
                .entry(ino)
                .or_default(),
        )
    }

    /// [`FsClient::flush`] with the inode's size lock held by the caller; `settle`: once the
    /// writes in flight are stored.
    async fn flush_locked(&self, ino: Ino, settle: bool) -> Result<()> {
        if settle {
            self.behind.settle(ino).await;
        }
        let failed = self.behind.take_error(ino);
        let (d, renew) = {
            let caps = self.caps.lock().expect("caps lock");
            match caps.dirty.get(&ino) {
                Some(d) => (d.clone(), caps.valid(ino, CAP_EXCL).is_some()),
                None => {
                    // nothing written: a kept file stays empty, with no inline data
                    self.inline_bufs.lock().expect("inline lock").remove(&ino);
                    return failed.map_or(Ok(()), |e| Err(FsError::Errno(e)));
                }
            }
        };
        let inline = self.inline_to_send(ino);
        let sent_inline = inline.is_some();
        let r = match inline {
            Some(data) => self.flush_inline(ino, &d, renew, data).await,
            None => {
                self.attr_call(Caller::default(), d.written(ino, 0, renew))
                    .await
            }
        };
        let refused = matches!(r, Err(FsError::Errno(errno::EDQUOT)));
        if r.is_ok() || refused {
            self.dirty_sent(ino, d.generation, r.as_ref().ok());
        }
        if sent_inline {
            // (refused over a quota: the kept bytes go, as the take-back below zeroes them)
            self.inline_done(ino, r.as_ref().ok(), refused);
        }
        if refused {
            // over a quota set since: the bytes past the recorded end never show
            self.take_back(ino, 0, d.end).await;
        }
        if let Some(e) = failed {
            return Err(FsError::Errno(e));
        }
        r.map(drop)
    }

    // inline data
    /// The kept content of `ino` for a flush to carry (marked as being sent), if any.
    fn inline_to_send(&self, ino: Ino) -> Option<Bytes> {
        let mut bufs = self.inline_bufs.lock().expect("inline lock");
        let b = bufs.get_mut(&ino)?;
        b.sending = true;
        Some(Bytes::copy_from_slice(&b.data))
    }

    /// Sends the size and attributes of `d` with the kept content `data` as the file's
    /// inline data ([`Op::WrittenInline`]), with the size lock held. An MDS that refuses
    /// it gets the data written to the data objects and a plain [`Op::Written`]. Once this
    /// succeeds the buffer goes ([`FsClient::inline_done`]): later writes go through the
    /// objects, moving the inline data out first.
    async fn flush_inline(&self, ino: Ino, d: &Dirty, renew: bool, data: Bytes) -> Result<Inode> {
        let r = self
            .attr_call(
                Caller::default(),
                d.written_inline(ino, renew, data.clone()),
            )
            .await;
        match r {
            Err(FsError::Errno(e @ (errno::EPROTO | errno::EINVAL | errno::EOPNOTSUPP))) => {
                if e == errno::EPROTO {
                    // an MDS that does not know inline data
                    self.inline_ok.store(false, Ordering::Relaxed);
                }
                debug!(
                    ino,
                    errno = e,
                    "inline data refused: written to the data objects"
                );
                self.write_out(ino, &data).await?;
                self.attr_call(Caller::default(), d.written(ino, 0, renew))
                    .await
            }
            r => r,
        }
    }

    /// A flush that carried `ino`'s kept content ended (`reply`: the MDS's answer, `None`
    /// if it failed): the content is the MDS's now (or `refused`, gone), or is kept for the
    /// next flush.
    fn inline_done(&self, ino: Ino, reply: Option<&Inode>, refused: bool) {
        if let Some(i) = reply {
            // this client's copy says where the data is before the buffer goes
            let mut caps = self.caps.lock().expect("caps lock");
            if let Some(c) = caps.inodes.get_mut(&ino).filter(|c| c.version <= i.version) {
                c.inline = i.inline;
            }
        }
        let mut bufs = self.inline_bufs.lock().expect("inline lock");
        if reply.is_some() || refused {
            bufs.remove(&ino);
        } else if let Some(b) = bufs.get_mut(&ino) {
            b.sending = false;
        }
    }

    /// Writes a kept content to the file's data objects.
    async fn write_out(&self, ino: Ino, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let i = self.layout_of(ino).await?;
        for r in futures::future::join_all(self.data_jobs(&i, 0, data)?).await {
            r?;
        }
        Ok(())
    }

    /// `ino`'s inode for its layout (pool, object size): this client's copy if it has
    /// one, else the MDS's.
    async fn layout_of(&self, ino: Ino) -> Result<Inode> {
        let cached = self
            .caps
            .lock()
            .expect("caps lock")
            .inodes
            .get(&ino)
            .cloned();
        match cached {
            Some(i) => Ok(i),
            None => self.getattr(Caller::default(), ino).await,
        }
    }

    /// Keeps a buffered write of `data` at `off` in the file's [`InlineBuf`] if it has one
    /// and the write fits; with the caps lock held and the exclusive capability checked.
    fn keep_inline(
        &self,
        caps: &mut CapCache,
        inode: &Inode,
        off: u64,
        data: &[u8],
    ) -> InlineRoute {
        let ino = inode.ino;
        let end = off + data.len() as u64;
        let mut bufs = self.inline_bufs.lock().expect("inline lock");
        if let Some(b) = bufs.get_mut(&ino) {
            if b.sending || end > INLINE_MAX as u64 {
                return InlineRoute::Slow;
            }
            let (off, end) = (off as usize, end as usize);
            if b.data.len() < end {
                b.data.resize(end, 0);
            }
            b.data[off..end].copy_from_slice(data);
            caps.note_written(inode, end as u64, Time::now());
            return InlineRoute::Kept;
        }
        drop(bufs);
        match caps.inline_flag(ino) {
            Some(false) => InlineRoute::Plain,
            _ => InlineRoute::Slow,
        }
    }

    /// Makes `ino` a file written through its data objects: a kept content is written out
    /// there (a flush in flight is waited for), inline data is moved out by the MDS
    /// ([`Op::Uninline`]).
    /// Takes the file's size lock: never call it with that lock held.
    pub async fn make_plain(&self, ino: Ino) -> Result<()> {
        let _held = self.size_lock(ino).await;
        // (no flush is in flight while the size lock is held here)
        let kept = {
            let mut bufs = self.inline_bufs.lock().expect("inline lock");
            bufs.get_mut(&ino).map(|b| {
                b.sending = true;
                b.data.clone()
            })
        };
        if let Some(data) = kept {
            let r = self.write_out(ino, &data).await;
            let mut bufs = self.inline_bufs.lock().expect("inline lock");
            match r {
                Ok(()) => {
                    bufs.remove(&ino);
                }
                Err(e) => {
                    if let Some(b) = bufs.get_mut(&ino) {
                        b.sending = false;
                    }
                    return Err(e);
                }
            }
            return Ok(());
        }
        let flag = self.caps.lock().expect("caps lock").inline_flag(ino);
        let inline = match flag {
            Some(f) => f,
            None => {
                self.attr_call(Caller::default(), Op::GetAttr { ino })
                    .await?
                    .inline
            }
        };
        if inline {
            self.attr_call(Caller::default(), Op::Uninline { ino })
                .await?;
            self.caps.lock().expect("caps lock").uninlined(ino);
        }
        Ok(())
    }

    /// The data of `[off, off+len)` of `inode` if it lives inline (kept here, or with the
    /// MDS); `None`: read the data objects.
    async fn read_inline(&self, inode: &Inode, off: u64, len: u64) -> Result<Option<Vec<u8>>> {
        let kept = self
            .inline_bufs
            .lock()
            .expect("inline lock")
            .get(&inode.ino)
            .map(|b| Bytes::copy_from_slice(&b.data));
        // (a copy from before this client's own flush made the file inline may say not)
        let inline = inode.inline
            || self.caps.lock().expect("caps lock").inline_flag(inode.ino) == Some(true);
        let data = match kept {
            Some(d) => d,
            None if inline => {
                match self
                    .call(Caller::default(), Op::ReadInline { ino: inode.ino })
                    .await
                {
                    Ok(Reply::Inline(d)) => d.0,
                    // moved out meanwhile: in the objects
                    Err(FsError::Errno(errno::ENODATA)) => return Ok(None),
                    Ok(r) => return Err(unexpected(r)),
                    Err(e) => return Err(e),
                }
            }
            None => return Ok(None),
        };
        // the bytes kept, zeros after them up to the end asked
        let mut out = vec![0u8; len as usize];
        if (off as usize) < data.len() {
            let have = &data[off as usize..data.len().min((off + len) as usize)];
            out[..have.len()].copy_from_slice(have);
        }
        Ok(Some(out))
    }

    /// Flushes every dirty size (the periodic flush, and unmount).
    pub async fn flush_all(&self) -> Result<()> {
        self.behind.settle_all().await;
        let inos: Vec<Ino> = self
            .caps
            .lock()
            .expect("caps lock")
            .dirty
            .keys()
            .copied()
            .collect();
        let mut out = Ok(());
        for ino in inos {
            if let Err(e) = self.flush(ino).await {
                out = Err(e);
            }
        }
        out
    }

    /// The MDS took the dirty record of `ino` at `generation` (answering `reply`): it goes
    /// unless changed since, and the answer shows in replies to requests sent before it.
    fn dirty_sent(&self, ino: Ino, generation: u64, reply: Option<&Inode>) {
        let sent = self.tids.lock().expect("tids lock").last;
        let mut caps = self.caps.lock().expect("caps lock");
        if caps
            .dirty
            .get(&ino)
            .is_some_and(|now| now.generation == generation)
        {
            caps.dirty.remove(&ino);
        }
        if let Some(i) = reply {
            caps.flushed.insert(ino, (i.clone(), sent));
        }
    }

    /// Forgets the flushes every request sent before has had its answer to.
    fn forget_flushed(&self) {
        let oldest = {
            let tids = self.tids.lock().expect("tids lock");
            tids.unanswered.first().copied().unwrap_or(tids.last + 1)
        };
        self.caps
            .lock()
            .expect("caps lock")
            .flushed
            .retain(|_, (_, sent)| *sent >= oldest);
    }

    /// Renews the exclusive leases of open files that are about to run out (a `GetAttr`
    /// of the holder renews it at the MDS).
    async fn renew_exclusive(&self) {
        let soon = Instant::now() + EXCL_RENEW_BEFORE;
        let due: Vec<Ino> = {
            let caps = self.caps.lock().expect("caps lock");
            let opens = self.opens.lock().expect("opens lock");
            caps.leases
                .iter()
                .filter(|(ino, (c, until))| {
                    c & CAP_EXCL != 0
                        && *until > Instant::now()
                        && *until < soon
                        && opens.contains_key(ino)
                })
                .map(|(ino, _)| *ino)
                .collect()
        };
        for ino in due {
            if let Err(e) = self.attr_call(Caller::default(), Op::GetAttr { ino }).await {
                debug!("renewing the exclusive lease of {ino:x}: {e}");
            }
        }
    }

    /// Whether this client holds `ino`'s exclusive capability (its writes are written back).
    pub fn has_exclusive(&self, ino: Ino) -> bool {
        self.caps
            .lock()
            .expect("caps lock")
            .valid(ino, CAP_EXCL)
            .is_some()
    }

    // directory listings cached by the kernel
    /// Whether the kernel's cached listing of `dir` is current (read under the shared lease
    /// still held, no revoke since): an open of it may keep it (`FOPEN_KEEP_CACHE`).
    pub fn listing_cached(&self, dir: Ino) -> bool {
        let caps = self.caps.lock().expect("caps lock");
        caps.listed.contains(&dir) && caps.valid(dir, CAP_SHARED).is_some()
    }

    /// Reads `dir`'s entries for the kernel to cache; `true` when it may keep them (the
    /// shared lease was held throughout, no revoke came meanwhile).
    pub async fn readdir_for_cache(
        &self,
        caller: Caller,
        dir: Ino,
    ) -> Result<(Vec<(String, Dentry)>, bool)> {
        let (epoch, changes) = {
            let caps = self.caps.lock().expect("caps lock");
            (caps.epoch, caps.entry_changes)
        };
        let entries = self.readdir(caller, dir).await?;
        let mut caps = self.caps.lock().expect("caps lock");
        let keep = caps.epoch == epoch && caps.valid(dir, CAP_SHARED).is_some();
        if keep {
            caps.listed.insert(dir);
            if caps.entry_changes == changes {
                // no change of this client's ran meanwhile: the listing is every name
                let names = entries.iter().map(|(n, _)| n.clone()).collect();
                caps.complete.insert(dir, names);
            }
        } else {
            caps.listed.remove(&dir);
        }
        Ok((entries, keep))
    }

    /// This mount changed `dir`'s entries: its cached listing is read again at the next open.
    fn dir_changed(&self, dir: Ino) {
        self.caps.lock().expect("caps lock").listed.remove(&dir);
    }

    /// The lock that would block `lock`, if any (`F_GETLK`).
    pub async fn getlk(
        &self,
        ino: Ino,
        lock: crate::locks::Lock,
    ) -> Result<Option<crate::locks::Lock>> {
        match self
            .call(Caller::default(), Op::GetLk { ino, lock })
            .await?
        {
            Reply::Lock(l) => Ok(l),
            r => Err(unexpected(r)),
        }
    }

    /// Takes or releases a lock; with `wait`, retries until the lock is free.
    pub async fn setlk(&self, ino: Ino, lock: crate::locks::Lock, wait: bool) -> Result<()> {
        let mut delay = Duration::from_millis(10);
        loop {
            match self
                .ok_call(Caller::default(), Op::SetLk { ino, lock })
                .await
            {
                Err(FsError::Errno(errno::EAGAIN)) if wait => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(500));
                }
                r => return r,
            }
        }
    }

    /// Releases the locks `owner` holds on `ino`.
    pub async fn release_locks(&self, ino: Ino, owner: u64) -> Result<()> {
        self.ok_call(Caller::default(), Op::ReleaseLocks { ino, owner })
            .await
    }

    /// Reads up to `len` bytes at `off` of the file (short at its end).
    pub async fn read(&self, inode: &Inode, off: u64, len: u64) -> Result<Vec<u8>> {
        // this client's buffered writes are stored before it reads what they cover
        self.behind.settle(inode.ino).await;
        if off >= inode.size {
            return Ok(Vec::new());
        }
        let len = len.min(inode.size - off);
        if let Some(d) = self.read_inline(inode, off, len).await? {
            return Ok(d);
        }
        let os = inode.object_size.max(1);
        let data = &self.data_for(inode)?;
        let mut jobs = Vec::new();
        let mut pos = off;
        while pos < off + len {
            let idx = pos / os;
            let in_obj = pos % os;
            let n = (os - in_obj).min(off + len - pos);
            let name = data_object(inode.ino, idx);
            jobs.push(async move {
                match data.read(&name, in_obj, n).await {
                    Ok(b) => Ok((n, b)),
                    Err(ClientError::NotFound { .. }) => Ok((n, Bytes::new())),
                    Err(e) => Err(FsError::from(e)),
                }
            });
            pos += n;
        }
        let mut out = Vec::with_capacity(len as usize);
        for r in futures::future::join_all(jobs).await {
            let (n, b) = r?;
            let take = b.len().min(n as usize);
            out.extend_from_slice(&b[..take]);
            out.resize(out.len() + (n as usize - take), 0);
        }
        Ok(out)
    }

    /// Writes `data` at `off` straight to the data objects (durable when it returns: RADOS
    /// acknowledges a write once it is stored), then tells the MDS the new end and mtime,
    /// or, under the exclusive capability, keeps them to flush later (write-back).
    pub async fn write(&self, inode: &Inode, off: u64, data: &[u8], buffered: bool) -> Result<()> {
        let ino = inode.ino;
        if let Some(e) = self.behind.take_error(ino) {
            return Err(FsError::Errno(e));
        }
        let end = off
            .checked_add(data.len() as u64)
            .ok_or(FsError::Errno(libc::EFBIG))?;
        // inline data: kept with the file's other writes, or the file made plain first
        let route = {
            let mut caps = self.caps.lock().expect("caps lock");
            if buffered && caps.valid(ino, CAP_EXCL).is_some() && !self.rados.cluster_full() {
                self.keep_inline(&mut caps, inode, off, data)
            } else if caps.inline_flag(ino) == Some(false)
                && !self
                    .inline_bufs
                    .lock()
                    .expect("inline lock")
                    .contains_key(&ino)
            {
                InlineRoute::Plain
            } else {
                InlineRoute::Slow
            }
        };
        match route {
            InlineRoute::Kept => return Ok(()),
            InlineRoute::Plain => {}
            InlineRoute::Slow => self.make_plain(ino).await?,
        }
        let jobs = self.data_jobs(inode, off, data)?;
        // Write-behind: answered once the data is on its way, under the exclusive capability
        // (no other client reads the file until the revoke, which waits for it) and while
        // the cluster has room (a full one refuses it here, not later).
        let behind = buffered && self.has_exclusive(ino) && !self.rados.cluster_full();
        let claim = self.behind.claim(ino, off, end, behind).await;
        let stored = store_data(claim, jobs);
        if behind {
            tokio::spawn(stored_behind(stored, ino, off, end));
        } else if let Some(e) = stored.await {
            return Err(e);
        }
        self.note_written(inode, off, end).await
    }

    /// [`FsClient::write`] answered at once, on the caller's thread (the FUSE loop): a
    /// buffered write under the exclusive capability, with no failure to report, no write
    /// in flight over the same bytes and room for it in flight. Its data goes out on `rt`.
    /// `None`: the write was not made; the caller takes [`FsClient::write`].
    pub fn write_now(
        &self,
        rt: &tokio::runtime::Handle,
        inode: &Inode,
        off: u64,
        data: &[u8],
    ) -> Option<Result<()>> {
        let ino = inode.ino;
        let end = off.checked_add(data.len() as u64)?;
        if self.rados.cluster_full() || self.behind.has_error(ino) || !self.has_exclusive(ino) {
            // (checked before the data is copied; again below, under the lock)
            return None;
        }
        {
            let mut caps = self.caps.lock().expect("caps lock");
            caps.valid(ino, CAP_EXCL)?;
            match self.keep_inline(&mut caps, inode, off, data) {
                InlineRoute::Kept => return Some(Ok(())),
                InlineRoute::Slow => return None,
                InlineRoute::Plain => {}
            }
        }
        let jobs = self.data_jobs(inode, off, data).ok()?;
        let claim = self.behind.try_claim(ino, off, end)?;
        let mut caps = self.caps.lock().expect("caps lock");
        // The capability is checked under the lock its revoke takes to drop it: a revoke
        // after this point settles this write (claimed before) and flushes its end.
        caps.valid(ino, CAP_EXCL)?;
        rt.spawn(stored_behind(store_data(claim, jobs), ino, off, end));
        caps.note_written(inode, end, Time::now());
        Some(Ok(()))
    }

    /// The writes of `data` at `off` to the file's objects, one per object it touches.
    fn data_jobs(
        &self,
        inode: &Inode,
        off: u64,
        data: &[u8],
    ) -> Result<Vec<impl Future<Output = std::result::Result<(), ClientError>> + Send + use<>>>
    {
        let os = inode.object_size.max(1);
        let end = off + data.len() as u64;
        let data_io = self.data_for(inode)?;
        let mut jobs = Vec::new();
        let mut pos = off;
        while pos < end {
            let idx = pos / os;
            let in_obj = pos % os;
            let n = (os - in_obj).min(end - pos);
            let start = (pos - off) as usize;
            let piece = Bytes::copy_from_slice(&data[start..start + n as usize]);
            let name = data_object(inode.ino, idx);
            let io = data_io.clone();
            jobs.push(async move { io.write(&name, in_obj, piece).await.map(drop) });
            pos += n;
        }
        Ok(jobs)
    }

    /// After a write's data is stored (or on its way, under the exclusive capability): the
    /// new end and mtime are kept here, or sent to the MDS.
    async fn note_written(&self, inode: &Inode, off: u64, end: u64) -> Result<()> {
        let ino = inode.ino;
        let mtime = Time::now();
        let kept = {
            let mut caps = self.caps.lock().expect("caps lock");
            if caps.valid(ino, CAP_EXCL).is_some() {
                caps.note_written(inode, end, mtime);
                return Ok(());
            }
            caps.dirty.get(&ino).cloned()
        };
        // Without the capability the size goes to the MDS now (with what an earlier
        // exclusive holding kept, if that is not flushed yet), once every earlier buffered
        // write of the file is stored.
        self.behind.settle(ino).await;
        let op = match &kept {
            Some(d) => {
                let mut d = d.clone();
                d.mtime = mtime;
                d.ctime = mtime;
                d.written(ino, end, false)
            }
            None => Op::Written {
                ino,
                end,
                mtime,
                renew: false,
                ctime: None,
                set: None,
            },
        };
        let written = self.attr_call(Caller::default(), op).await;
        match written {
            Ok(i) => {
                if let Some(d) = kept {
                    self.dirty_sent(ino, d.generation, Some(&i));
                }
                Ok(())
            }
            Err(FsError::Errno(errno::EDQUOT)) => {
                self.take_back(ino, off, end).await;
                Err(FsError::Errno(errno::EDQUOT))
            }
            Err(e) => Err(e),
        }
    }

    /// A write past the end was refused (over a quota) after its data reached the objects:
    /// zero what lies past the recorded end, so that a later growth of the file never shows
    /// bytes whose write failed.
    async fn take_back(&self, ino: Ino, off: u64, end: u64) {
        let cleared = async {
            let mut cur = self.getattr(Caller::default(), ino).await?;
            let from = off.max(cur.size);
            if from < end {
                cur.size = end;
                self.zero(&cur, from, end - from).await?;
            }
            Ok::<(), FsError>(())
        };
        if let Err(e) = cleared.await {
            warn!(ino, off, end, error = %e, "could not zero the data of a refused write");
        }
    }

    /// Cuts the data objects of `inode` down to `size` bytes.
    pub async fn truncate_data(&self, inode: &Inode, size: u64) -> Result<()> {
        if inode.inline {
            // no data objects: the MDS cuts the inline data with the size
            return Ok(());
        }
        self.behind.settle(inode.ino).await;
        let os = inode.object_size.max(1);
        let last = inode.size.div_ceil(os);
        let keep = size.div_ceil(os);
        let data = self.data_for(inode)?;
        for idx in keep..last.max(keep) {
            match data.remove(&data_object(inode.ino, idx)).await {
                Ok(()) | Err(ClientError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if !size.is_multiple_of(os) {
            // a truncate only frees space: it goes on while the cluster is full
            let mut data = data;
            data.set_full_try(true);
            match data
                .truncate(&data_object(inode.ino, size / os), size % os)
                .await
            {
                Ok(()) | Err(ClientError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Zeroes `[off, off+len)` of the data (punching holes).
    /// The data must not be inline ([`FsClient::make_plain`] first).
    pub async fn zero(&self, inode: &Inode, off: u64, len: u64) -> Result<()> {
        self.behind.settle(inode.ino).await;
        let os = inode.object_size.max(1);
        let end = (off + len).min(inode.size);
        let data = self.data_for(inode)?;
        let mut pos = off;
        while pos < end {
            let idx = pos / os;
            let in_obj = pos % os;
            let n = (os - in_obj).min(end - pos);
            let name = data_object(inode.ino, idx);
            let r = if in_obj == 0 && n == os {
                data.remove(&name).await
            } else {
                data.operate(kelp_client::WriteOp::new().zero(in_obj, n), &name)
                    .await
                    .map(drop)
            };
            match r {
                Ok(()) | Err(ClientError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            pos += n;
        }
        Ok(())
    }

    /// Where `inode`'s data objects live: its layout's pool, or the default data pool.
    fn data_for(&self, inode: &Inode) -> Result<IoCtx> {
        match inode.layout.pool {
            Some(p) if p != self.data.pool_id() => Ok(self.rados.ioctx_by_id(p)?),
            _ => Ok(self.data.clone()),
        }
    }

    /// The path's inode (from the root, no symlinks followed).
    pub async fn resolve(&self, path: &str) -> Result<Ino> {
        let mut ino = ROOT_INO;
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            ino = self.lookup(Caller::default(), ino, part).await?.ino;
        }
        Ok(ino)
    }

    /// The cluster's (total, available) bytes.
    pub async fn space(&self) -> Result<(u64, u64)> {
        match self
            .rados
            .mon_command(kelp_proto::MonCommand::PgStats)
            .await?
        {
            kelp_proto::MonReply::PgStats(d) => Ok((d.totals.bytes_total, d.totals.bytes_avail)),
            other => Err(FsError::Malformed {
                what: "statistics reply".into(),
                detail: format!("{other:?}"),
            }),
        }
    }
}

/// An MDS reply's meta segment, decoded.
fn decode_reply(meta: &[u8]) -> Result<Reply> {
    serde_json::from_slice(meta).map_err(|e| FsError::Malformed {
        what: "MDS reply".into(),
        detail: e.to_string(),
    })
}

fn unexpected(r: Reply) -> FsError {
    FsError::Malformed {
        what: "MDS reply".into(),
        detail: format!("unexpected {r:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tids_grow_and_the_oldest_unanswered_one_is_named() {
        let mut t = Tids::default();
        assert_eq!(t.begin(), (1, 1));
        assert_eq!(t.begin(), (2, 1));
        assert_eq!(t.begin(), (3, 1));
        // 1 answered: 2 is now the oldest still open
        t.end(1);
        assert_eq!(t.begin(), (4, 2));
        t.end(2);
        t.end(3);
        t.end(4);
        // nothing open: a new request is its own oldest
        assert_eq!(t.begin(), (5, 5));
    }

    fn leased(caps: &mut CapCache, ino: Ino, cap: u8) {
        caps.leases
            .insert(ino, (cap, Instant::now() + Duration::from_secs(30)));
    }

    #[test]
    fn a_file_made_here_stops_being_unlinked_here_once_its_name_may_name_another() {
        let mut caps = CapCache::default();
        let (d, e): (Ino, Ino) = (0x10, 0x11);
        for (name, ino) in [("a", 1), ("b", 2), ("c", 3), ("f", 4), ("g", 5)] {
            caps.made
                .entry(d)
                .or_default()
                .insert(name.into(), (ino, ino));
        }
        let rename = |name: &str, new_parent: Ino, new_name: &str, flags: u32| Op::Rename {
            parent: d,
            name: name.into(),
            new_parent,
            new_name: new_name.into(),
            flags,
        };
        let left = |caps: &CapCache| {
            let mut v: Vec<String> = caps.made[&d].keys().cloned().collect();
            v.sort();
            v
        };
        // an exchange swaps the files behind both names
        caps.entries_changed(&rename("a", d, "b", RENAME_EXCHANGE), true);
        assert_eq!(left(&caps), ["c", "f", "g"]);
        // a rename takes the old name and replaces the new one
        caps.entries_changed(&rename("c", e, "x", 0), true);
        caps.entries_changed(&rename("z", d, "f", 0), true);
        assert_eq!(left(&caps), ["g"]);
        // a second name, anywhere, and the unlink is the MDS's
        caps.entries_changed(
            &Op::Link {
                ino: 5,
                parent: e,
                name: "y".into(),
            },
            true,
        );
        assert!(left(&caps).is_empty());
    }

    #[test]
    fn a_complete_directory_answers_for_missing_names_until_it_is_not_known() {
        let mut caps = CapCache::default();
        let d: Ino = 0x10;
        leased(&mut caps, d, CAP_SHARED);
        assert!(!caps.known_absent(d, "a"), "not complete: asks the MDS");
        caps.complete.insert(d, HashSet::new());
        assert!(caps.known_absent(d, "a"));
        assert!(
            !caps.known_absent(d, &"n".repeat(NAME_MAX + 1)),
            "too long: the MDS says so"
        );
        let mknod = |name: &str| Op::Mknod {
            parent: d,
            name: name.into(),
            mode: S_IFREG | 0o644,
            rdev: 0,
            exclusive: true,
            open: true,
            write: true,
        };
        caps.entries_changed(&mknod("a"), true);
        assert!(!caps.known_absent(d, "a"), "made here");
        let rename = |name: &str, new_name: &str, flags: u32| Op::Rename {
            parent: d,
            name: name.into(),
            new_parent: d,
            new_name: new_name.into(),
            flags,
        };
        caps.entries_changed(&rename("a", "b", 0), true);
        assert!(caps.known_absent(d, "a") && !caps.known_absent(d, "b"));
        caps.entries_changed(&mknod("c"), true);
        caps.entries_changed(&rename("b", "c", RENAME_EXCHANGE), true);
        assert!(!caps.known_absent(d, "b") && !caps.known_absent(d, "c"));
        caps.entries_changed(
            &Op::Unlink {
                parent: d,
                name: "c".into(),
            },
            true,
        );
        assert!(caps.known_absent(d, "c"));
        // a change that failed leaves the directory unknown
        caps.entries_changed(&mknod("b"), false);
        assert!(!caps.known_absent(d, "zzz"));
        // so does a lapsed lease
        caps.complete.insert(d, HashSet::new());
        caps.leases.insert(d, (CAP_SHARED, Instant::now()));
        assert!(!caps.known_absent(d, "zzz"));
    }

    #[test]
    fn a_reply_older_than_a_flush_shows_the_flushed_file() {
        let mut caps = CapCache::default();
        let mut old = Inode {
            ino: 5,
            mode: S_IFREG | 0o666,
            nlink: 1,
            parent: 1,
            object_size: 1 << 22,
            version: 3,
            ..Inode::default()
        };
        // dirty here: a size and a mode the MDS has not taken yet
        let now = Time { secs: 9, nanos: 0 };
        let d = caps.dirty_of(&old);
        d.end = 5;
        d.attrs.mode = Some(0o644);
        d.ctime = now;
        let mut shown = old.clone();
        caps.overlay(&mut shown);
        assert_eq!((shown.size, shown.mode & 0o7777), (5, 0o644));
        // flushed: the MDS answered version 5; a reply to an earlier request (version 4)
        // arrives afterwards
        let mut flushed = shown.clone();
        flushed.version = 5;
        caps.dirty.remove(&5);
        caps.flushed.insert(5, (flushed, 7));
        old.version = 4;
        old.nlink = 2;
        let mut late = old.clone();
        caps.overlay(&mut late);
        assert_eq!((late.size, late.mode & 0o7777, late.version), (5, 0o644, 5));
        // a newer reply is shown as it is
        let mut newer = old.clone();
        newer.version = 6;
        caps.overlay(&mut newer);
        assert_eq!((newer.size, newer.nlink), (0, 2));
    }
}
