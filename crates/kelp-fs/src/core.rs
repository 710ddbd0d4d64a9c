//! The MDS core: namespace operations as a pure state machine over a cache of inodes and
//! directories.
//!
//! Events in, decisions out: [`Namespace::apply`] takes an operation and either answers it
//! (a [`Reply`] plus the [`Update`]s to journal), or says which object it must see first
//! ([`Step::Need`]); the daemon loads it ([`Namespace::insert_inode`] /
//! [`Namespace::insert_dir`]) and applies again. An operation never changes the cache before
//! every object it reads is loaded, so a `Need` leaves no trace.
//!
//! Invariants kept: a directory's `nlink` is 2 + its subdirectories; a directory has one
//! parent and is never moved below itself; a name maps to one inode; an inode whose last link
//! goes away is either removed (closed) or kept as a stray until its last close.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::locks::LockTable;
use crate::types::*;
pub use delegate::{DELEGATION_SIZE, Delegation};
use quota::{Acct, home, weight};

/// What [`Namespace::apply`] needs loaded before it can decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Need {
    Inode(Ino),
    Dir(Ino),
    // early replies (unsafe until journaled)
    /// Whether the inode exists at all: load it if it does ([`Namespace::insert_inode`]),
    /// else say so with [`Namespace::note_absent`] (a replayed create's inode-number hint).
    Probe(Ino),
    // inline data
    /// An inline file's data: load it ([`Namespace::insert_inline`]).
    Inline(Ino),
}

/// The outcome of one step: answered, or blocked on a load. (Short-lived: returned and
/// matched at once, so the size of `Done` costs nothing worth a box.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Done {
        reply: Reply,
        updates: Vec<Update>,
        /// What other clients must drop from their caches.
        invalidate: Invalidate,
    },
    Need(Need),
}

fn neg(w: (i64, i64)) -> (i64, i64) {
    (-w.0, -w.1)
}

/// Internal short-circuit: a missing object or an errno.
enum Stop {
    Need(Need),
    Err(i32),
}

type R<T> = Result<T, Stop>;

/// The cached namespace. Only what has been loaded is here; dirty entries (changed since the
/// last checkpoint) are never evicted.
#[derive(Debug, Default)]
pub struct Namespace {
    inodes: HashMap<Ino, Inode>,
    dirs: HashMap<Ino, BTreeMap<String, Dentry>>,
    dirty_inodes: HashSet<Ino>,
    dirty_dirs: HashSet<Ino>,
    /// Inodes and directories whose changes a checkpoint is writing back now
    /// ([`Namespace::begin_writeback`]): their stored objects may still be older, so they
    /// stay cached (and are never loaded over) until [`Namespace::end_writeback`].
    flushing_inodes: HashSet<Ino>,
    flushing_dirs: HashSet<Ino>,
    /// Open handles per inode: client id -> count.
    opens: HashMap<Ino, HashMap<u64, u32>>,
    strays: HashSet<Ino>,
    locks: LockTable,
    next_ino: Ino,
    default_object_size: u64,
    /// The file system's data pools, name -> id (layouts may name only these).
    data_pools: BTreeMap<String, u32>,
    /// The pool of files whose layout names none.
    default_pool: Option<u32>,
    /// Completed client requests, answered again when retried (`requests.rs`).
    requests: requests::RequestTable,
    // directory fragments
    /// When directories split into fragments and merge again (`frag.rs`).
    frag: frag::FragConfig,
    /// Fragment sizes of the large directories (kept from their first split check on,
    /// dropped whenever the directory is loaded again or changes layout).
    frag_sizes: HashMap<Ino, Vec<u32>>,
    // early replies (unsafe until journaled)
    /// Starts of the inode-number ranges ([`REPLAY_INO_GAP`] long) that recent MDS
    /// incarnations skipped when they took over: a create answered unsafe by an MDS that
    /// died before journaling it holds a number in one of them, and only such creates, sent
    /// again with [`RequestId::ino_hint`], are given numbers there.
    replay_zones: Vec<Ino>,
    /// The hint of the request being applied (taken by [`Namespace::new_inode`]).
    ino_hint: Option<Ino>,
    /// Inode numbers in the replay zones or in delegated ranges of an earlier MDS found
    /// unused in the metadata pool (by a [`Need::Probe`]) and not given since.
    probed_absent: HashSet<Ino>,
    // creates without a round trip (delegated inode numbers)
    /// The inode-number ranges delegated to clients (`delegate.rs`), oldest first.
    delegations: Vec<delegate::Delegation>,
    /// The ranges this MDS delegated, by start: which of their numbers it has given.
    fresh: HashMap<Ino, delegate::Given>,
    // inline data
    /// Inline data ([`Inode::inline`]) changed since the last write-back began, being
    /// written back, or loaded for a read (dropped when a write-back ends), by inode.
    inline: HashMap<Ino, bytes::Bytes>,
    inline_dirty: HashSet<Ino>,
    inline_flushing: HashSet<Ino>,
}

// early replies (unsafe until journaled)
/// How far past the journaled next inode number an MDS starts allocating when it takes over.
/// More than the inode numbers the changes not yet journaled can hold when an MDS dies (each
/// takes at most one, and the daemon answers early only while fewer than
/// `mds::MAX_UNSAFE_ENTRIES` are unjournaled), so a number an unsafe reply gave is never
/// given to another file.
pub const REPLAY_INO_GAP: Ino = 1 << 20;

impl Namespace {
    pub fn new(next_ino: Ino) -> Namespace {
        Namespace {
            next_ino: next_ino.max(FIRST_INO),
            default_object_size: DEFAULT_OBJECT_SIZE,
            ..Namespace::default()
        }
    }

    // early replies (unsafe until journaled)
    /// The inode-number ranges a replayed create may reuse a number from (see
    /// [`Namespace::replay_zones`]).
    pub fn set_replay_zones(&mut self, zones: Vec<Ino>) {
        self.replay_zones = zones;
    }

    /// Whether inode number `h` lies in a range a takeover skipped (no journaled change
    /// allocated there: only replayed creates are given numbers from it).
    fn in_replay_zone(&self, h: Ino) -> bool {
        h < self.next_ino
            && self
                .replay_zones
                .iter()
                .any(|z| (*z..z.saturating_add(REPLAY_INO_GAP)).contains(&h))
    }

    /// Whether inode number `h` may be in use without this MDS knowing (a skipped range, or
    /// a range an earlier MDS delegated): it is given only after a probe.
    fn needs_probing(&self, h: Ino) -> bool {
        self.in_replay_zone(h) || (self.delegation_of(h).is_some() && self.fresh_given(h).is_none())
    }

    /// What a replayed or delegated create's hint `h` needs first: whether an inode has the
    /// number.
    pub(crate) fn hint_needs_probe(&self, h: Ino) -> bool {
        self.needs_probing(h) && !self.inodes.contains_key(&h) && !self.probed_absent.contains(&h)
    }

    /// A [`Need::Probe`] found no inode `ino` in the metadata pool.
    pub fn note_absent(&mut self, ino: Ino) {
        if self.needs_probing(ino) && !self.inodes.contains_key(&ino) {
            self.probed_absent.insert(ino);
        }
    }

    /// Whether a replayed or delegated create may be given inode number `h`: in a skipped
    /// or delegated range, and known to be unused (probed, or never given by this MDS).
    fn hint_allowed(&self, h: Ino) -> bool {
        if self.inodes.contains_key(&h) {
            return false;
        }
        match self.fresh_given(h) {
            Some(given) => !given,
            None => self.needs_probing(h) && self.probed_absent.contains(&h),
        }
    }

    /// A fresh file system's root directory (owned by root, mode 0755) and its updates.
    pub fn make_root(&mut self, now: Time) -> Vec<Update> {
        let root = Inode {
            ino: ROOT_INO,
            mode: S_IFDIR | 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 2,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
            parent: ROOT_INO,
            target: String::new(),
            xattrs: BTreeMap::new(),
            object_size: self.default_object_size,
            version: 1,
            dirstat: DirStat::default(),
            layout: Layout::default(),
            frag_bits: 0,
            inline: false,
        };
        self.inodes.insert(ROOT_INO, root.clone());
        self.dirs.insert(ROOT_INO, BTreeMap::new());
        self.dirty_inodes.insert(ROOT_INO);
        self.dirty_dirs.insert(ROOT_INO);
        vec![Update::PutInode(root), Update::NextIno(self.next_ino)]
    }

    pub fn insert_inode(&mut self, inode: Inode) {
        if !self.dirty_inodes.contains(&inode.ino) && !self.flushing_inodes.contains(&inode.ino) {
            self.inodes.insert(inode.ino, inode);
        }
    }

    /// Inline data loaded for [`Need::Inline`] (`None`: none stored, the file reads as zeros).
    pub fn insert_inline(&mut self, ino: Ino, data: Option<bytes::Bytes>) {
        if !self.inline_dirty.contains(&ino) && !self.inline_flushing.contains(&ino) {
            self.inline.insert(ino, data.unwrap_or_default());
        }
    }

    /// The data of inline file `i`, if in memory.
    pub fn inline_data(&self, i: &Inode) -> Option<bytes::Bytes> {
        self.inline.get(&i.ino).cloned()
    }

    /// The data of inline file `i`, if in memory ([`Need::Inline`] if not).
    fn inline_of(&self, i: &Inode) -> R<bytes::Bytes> {
        match self.inline.get(&i.ino) {
            Some(d) => Ok(d.clone()),
            None => Err(Stop::Need(Need::Inline(i.ino))),
        }
    }

    /// Sets (non-empty `data`) or drops the inline data of `i` (not yet `put`).
    fn set_inline(&mut self, i: &mut Inode, data: bytes::Bytes, upd: &mut Vec<Update>) {
        let was = i.inline;
        i.inline = !data.is_empty();
        if i.inline {
            self.inline.insert(i.ino, data.clone());
            upd.push(Update::PutInline {
                ino: i.ino,
                data: InlineData(data),
            });
        } else {
            self.inline.insert(i.ino, bytes::Bytes::new());
            if was {
                upd.push(Update::DelInline(i.ino));
            }
        }
        self.inline_dirty.insert(i.ino);
    }

    pub fn insert_dir(&mut self, ino: Ino, entries: BTreeMap<String, Dentry>) {
        if !self.dirty_dirs.contains(&ino) && !self.flushing_dirs.contains(&ino) {
            self.frag_sizes.remove(&ino);
            self.dirs.insert(ino, entries);
        }
    }

    /// When directories split into fragments and merge (`frag.rs`).
    pub fn set_frag_config(&mut self, cfg: frag::FragConfig) {
        self.frag = cfg;
    }

    /// The fragment bits of directory `ino`, as its cached inode says (a [`Need::Dir`] is
    /// only asked once the directory's inode is cached).
    pub fn frag_bits(&self, ino: Ino) -> u8 {
        self.inodes.get(&ino).map_or(0, frag::bits_of)
    }

    /// The file system's data pools (name -> id), which layouts may name, and the default
    /// one.
    pub fn set_data_pools(&mut self, pools: BTreeMap<String, u32>, default: u32) {
        self.data_pools = pools;
        self.default_pool = Some(default);
    }

    pub fn set_strays(&mut self, strays: impl IntoIterator<Item = Ino>) {
        self.strays = strays.into_iter().collect();
    }

    /// Strays no client has open: ready to purge.
    pub fn purgeable(&self) -> Vec<Ino> {
        self.strays
            .iter()
            .copied()
            .filter(|i| !self.opens.contains_key(i))
            .collect()
    }

    /// A stray was purged (its data removed): forget it and its inode.
    /// `inline`: the inode (as the purge read it) keeps its data inline, which goes too.
    pub fn purged(&mut self, ino: Ino, inline: bool) -> Vec<Update> {
        self.strays.remove(&ino);
        self.inodes.remove(&ino);
        self.dirty_inodes.insert(ino);
        let mut upd = vec![Update::DelInode(ino), Update::DelStray(ino)];
        if inline {
            self.inline.insert(ino, bytes::Bytes::new());
            self.inline_dirty.insert(ino);
            upd.push(Update::DelInline(ino));
        }
        upd
    }

    /// The cached inode `ino`, if cached.
    pub fn cached(&self, ino: Ino) -> Option<&Inode> {
        self.inodes.get(&ino)
    }

    /// The inode `name` in `dir` names, if the directory's entries are cached.
    pub fn cached_child(&self, dir: Ino, name: &str) -> Option<Ino> {
        self.dirs.get(&dir)?.get(name).map(|d| d.ino)
    }

    pub fn cached_inodes(&self) -> usize {
        self.inodes.len()
    }

    /// The checkpoint has written every dirty object: they may be evicted again.
    pub fn mark_clean(&mut self) {
        self.begin_writeback();
        self.end_writeback();
    }

    /// A checkpoint starts writing back every change so far: what is dirty now is being
    /// flushed (changes from now on mark their objects dirty again).
    pub fn begin_writeback(&mut self) {
        self.flushing_inodes.extend(self.dirty_inodes.drain());
        self.flushing_dirs.extend(self.dirty_dirs.drain());
        self.inline_flushing.extend(self.inline_dirty.drain());
    }

    /// The write-back begun last is in the stored objects. Inline data not changed since
    /// is dropped from memory (a read loads it again).
    pub fn end_writeback(&mut self) {
        self.flushing_inodes.clear();
        self.flushing_dirs.clear();
        self.inline_flushing.clear();
        let dirty = &self.inline_dirty;
        self.inline.retain(|ino, _| dirty.contains(ino));
    }

    /// The write-back begun last failed: its objects are dirty again.
    pub fn abort_writeback(&mut self) {
        self.dirty_inodes.extend(self.flushing_inodes.drain());
        self.dirty_dirs.extend(self.flushing_dirs.drain());
        self.inline_dirty.extend(self.inline_flushing.drain());
    }

    /// Bytes of inline data held in memory.
    pub fn inline_bytes(&self) -> usize {
        self.inline.values().map(bytes::Bytes::len).sum()
    }

    /// Drops clean cached objects until at most `budget` inodes are cached (open and dirty
    /// ones stay).
    pub fn evict_to(&mut self, budget: usize) {
        if self.inodes.len() <= budget {
            return;
        }
        let excess = self.inodes.len() - budget;
        let victims: Vec<Ino> = self
            .inodes
            .keys()
            .copied()
            .filter(|i| {
                *i != ROOT_INO
                    && !self.dirty_inodes.contains(i)
                    && !self.flushing_inodes.contains(i)
                    && !self.opens.contains_key(i)
            })
            .take(excess)
            .collect();
        for v in victims {
            self.inodes.remove(&v);
            if !self.dirty_dirs.contains(&v) && !self.flushing_dirs.contains(&v) {
                self.dirs.remove(&v);
                self.frag_sizes.remove(&v);
            }
        }
    }

    /// Forgets every open handle of `client` (it reconnected and says which it holds; its
    /// locks stay: its processes still hold them).
    pub fn drop_client(&mut self, client: u64) {
        self.opens.retain(|_, m| {
            m.remove(&client);
            !m.is_empty()
        });
    }

    // locks across a restart
    /// The lock table a replay rebuilt (at activation).
    pub fn set_locks(&mut self, locks: LockTable) {
        self.locks = locks;
    }

    /// The lock table as the checkpoint stores it.
    pub fn locks_snapshot(&self) -> crate::locks::StoredLocks {
        self.locks.snapshot()
    }

    /// The clients holding some lock.
    pub fn lock_holders(&self) -> std::collections::BTreeSet<u64> {
        self.locks.holders()
    }

    /// Releases every lock of `client` (it went away); the updates to journal.
    pub fn drop_locks_of(&mut self, client: u64) -> Vec<Update> {
        let inodes = self.locks.inodes_of(client);
        self.locks.drop_client(client);
        inodes
            .into_iter()
            .map(|ino| Update::Locks {
                ino,
                held: self.locks.held_on(ino),
            })
            .collect()
    }

    fn inode(&self, ino: Ino) -> R<&Inode> {
        self.inodes.get(&ino).ok_or(Stop::Need(Need::Inode(ino)))
    }

    fn dir(&self, ino: Ino) -> R<&BTreeMap<String, Dentry>> {
        match self.dirs.get(&ino) {
            Some(d) => Ok(d),
            None => {
                // its inode first: it says which fragment objects hold the entries
                self.inode(ino)?;
                Err(Stop::Need(Need::Dir(ino)))
            }
        }
    }

    /// The directory `ino` (an inode that is a directory, still linked) and its entries.
    fn live_dir(&self, ino: Ino) -> R<(&Inode, &BTreeMap<String, Dentry>)> {
        let i = self.inode(ino)?;
        if !i.is_dir() {
            return Err(Stop::Err(errno::ENOTDIR));
        }
        if i.nlink == 0 {
            return Err(Stop::Err(errno::ENOENT));
        }
        Ok((i, self.dir(ino)?))
    }

    fn check_name(name: &str) -> R<()> {
        name_error(name).map_or(Ok(()), |e| Err(Stop::Err(e)))
    }

    /// Applies `op` for `client`/`caller` at `now`.
    pub fn apply(&mut self, client: u64, caller: Caller, op: &Op, now: Time) -> Step {
        let mut upd = Vec::new();
        let mut inval = Invalidate {
            v: PROTOCOL_VERSION,
            inodes: Vec::new(),
            entries: Vec::new(),
        };
        match self.apply_inner(client, caller, op, now, &mut upd, &mut inval) {
            Ok(reply) => {
                let touched: std::collections::BTreeSet<Ino> = upd
                    .iter()
                    .filter_map(|u| match u {
                        Update::PutDentry { dir, .. } | Update::DelDentry { dir, .. } => Some(*dir),
                        _ => None,
                    })
                    .collect();
                for dir in touched {
                    self.refragment(dir, &mut upd, &mut inval);
                }
                for u in &upd {
                    match u {
                        Update::PutInode(i) => {
                            self.dirty_inodes.insert(i.ino);
                        }
                        Update::DelInode(i) => {
                            self.dirty_inodes.insert(*i);
                        }
                        Update::PutDentry { dir, .. } | Update::DelDentry { dir, .. } => {
                            self.dirty_dirs.insert(*dir);
                        }
                        Update::DelDir(d) | Update::Fragment { dir: d, .. } => {
                            self.dirty_dirs.insert(*d);
                        }
                        _ => {}
                    }
                }
                Step::Done {
                    reply,
                    updates: upd,
                    invalidate: inval,
                }
            }
            Err(Stop::Err(e)) => Step::Done {
                reply: Reply::Err(e),
                updates: Vec::new(),
                invalidate: inval,
            },
            Err(Stop::Need(n)) => Step::Need(n),
        }
    }

    fn put(&mut self, mut inode: Inode, upd: &mut Vec<Update>, inval: &mut Invalidate) {
        inode.version += 1;
        inval.inodes.push(inode.ino);
        upd.push(Update::PutInode(inode.clone()));
        self.inodes.insert(inode.ino, inode);
    }

    fn put_dentry(
        &mut self,
        dir: Ino,
        name: &str,
        d: Dentry,
        upd: &mut Vec<Update>,
        inval: &mut Invalidate,
    ) {
        let bits = self.frag_bits(dir);
        let old = self
            .dirs
            .get_mut(&dir)
            .expect("callers load the directory first")
            .insert(name.to_string(), d);
        if old.is_none()
            && let Some(sizes) = self.frag_sizes.get_mut(&dir)
            && let Some(n) = sizes.get_mut(frag::frag_of(name, bits) as usize)
        {
            *n += 1;
        }
        inval.entries.push((dir, name.to_string()));
        upd.push(Update::PutDentry {
            dir,
            name: name.to_string(),
            dentry: d,
            bits,
        });
    }

    fn del_dentry(&mut self, dir: Ino, name: &str, upd: &mut Vec<Update>, inval: &mut Invalidate) {
        let bits = self.frag_bits(dir);
        let old = self
            .dirs
            .get_mut(&dir)
            .expect("callers load the directory first")
            .remove(name);
        if old.is_some()
            && let Some(sizes) = self.frag_sizes.get_mut(&dir)
            && let Some(n) = sizes.get_mut(frag::frag_of(name, bits) as usize)
        {
            *n = n.saturating_sub(1);
        }
        inval.entries.push((dir, name.to_string()));
        upd.push(Update::DelDentry {
            dir,
            name: name.to_string(),
            bits,
        });
    }

    /// After a change of `dir`'s entries: splits it into more fragments when one grew past
    /// the split size, or merges it back when it shrank (`frag.rs`). The new layout is
    /// journaled with the change that caused it.
    fn refragment(&mut self, dir: Ino, upd: &mut Vec<Update>, inval: &mut Invalidate) {
        let Some(inode) = self.inodes.get(&dir) else {
            return;
        };
        if !inode.is_dir() || inode.nlink == 0 {
            return;
        }
        let Some(entries) = self.dirs.get(&dir) else {
            return;
        };
        let bits = inode.frag_bits;
        let sizes = &mut self.frag_sizes;
        let to = self.frag.relayout(bits, entries.len(), || {
            let s = sizes
                .entry(dir)
                .or_insert_with(|| frag::frag_sizes(entries, bits));
            s.iter().copied().max().unwrap_or(0) as usize
        });
        let Some(to) = to.filter(|t| *t != bits) else {
            return;
        };
        let mut i = inode.clone();
        i.frag_bits = to;
        self.frag_sizes.remove(&dir);
        upd.push(Update::Fragment {
            dir,
            from: bits,
            to,
        });
        self.put(i, upd, inval);
    }

    /// One link of `inode` went away: update it, and remove it (or make it a stray) at zero.
    fn drop_link(
        &mut self,
        mut inode: Inode,
        now: Time,
        upd: &mut Vec<Update>,
        inval: &mut Invalidate,
    ) {
        let ino = inode.ino;
        if inode.is_dir() {
            inode.nlink = 0;
        } else {
            inode.nlink = inode.nlink.saturating_sub(1);
        }
        inode.ctime = now;
        if inode.nlink > 0 {
            self.put(inode, upd, inval);
            return;
        }
        if inode.is_dir() {
            self.dirs.remove(&ino);
            self.frag_sizes.remove(&ino);
            if inode.frag_bits > 0 {
                // its fragment objects go with it (`DelDir` removes every layout named)
                upd.push(Update::Fragment {
                    dir: ino,
                    from: inode.frag_bits,
                    to: 0,
                });
            }
            upd.push(Update::DelDir(ino));
        }
        if inode.kind() == S_IFREG && (self.opens.contains_key(&ino) || inode.size > 0) {
            // Data to purge (now or after the last close): keep the inode as a stray.
            self.strays.insert(ino);
            upd.push(Update::AddStray(ino));
            self.put(inode, upd, inval);
        } else {
            self.inodes.remove(&ino);
            inval.inodes.push(ino);
            upd.push(Update::DelInode(ino));
        }
    }

    fn new_inode(&mut self, parent: &Inode, caller: Caller, mode: u32, now: Time) -> Inode {
        let ino = match self.ino_hint.take() {
            Some(h) if self.hint_allowed(h) => {
                self.probed_absent.remove(&h);
                self.mark_given(h);
                h
            }
            _ => {
                let ino = self.next_ino;
                self.next_ino += 1;
                ino
            }
        };
        let mut mode = mode;
        let gid = if parent.mode & S_ISGID != 0 {
            if mode & S_IFMT == S_IFDIR {
                mode |= S_ISGID;
            }
            parent.gid
        } else {
            caller.gid
        };
        Inode {
            ino,
            mode,
            uid: caller.uid,
            gid,
            size: 0,
            nlink: 1,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
            parent: parent.ino,
            target: String::new(),
            xattrs: BTreeMap::new(),
            object_size: self.default_object_size,
            version: 0,
            dirstat: DirStat::default(),
            layout: Layout::default(),
            frag_bits: 0,
            inline: false,
        }
    }

    /// Whether `dir` is `ancestor` or lies below it (walking parents up to the root).
    fn is_under(&self, mut dir: Ino, ancestor: Ino) -> R<bool> {
        for _ in 0..4096 {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            dir = self.inode(dir)?.parent;
        }
        Err(Stop::Err(errno::EIO))
    }

    fn apply_inner(
        &mut self,
        client: u64,
        caller: Caller,
        op: &Op,
        now: Time,
        upd: &mut Vec<Update>,
        inval: &mut Invalidate,
    ) -> R<Reply> {
        match op {
            Op::Lookup { parent, name } => {
                if name.len() > NAME_MAX {
                    return Err(Stop::Err(errno::ENAMETOOLONG));
                }
                let (_, entries) = self.live_dir(*parent)?;
                let d = *entries.get(name).ok_or(Stop::Err(errno::ENOENT))?;
                Ok(Reply::Attr(self.inode(d.ino)?.clone()))
            }
            Op::GetAttr { ino } => Ok(Reply::Attr(self.inode(*ino)?.clone())),
            Op::SetAttr { ino, set } => {
                let mut i = self.inode(*ino)?.clone();
                set.apply_attrs(&mut i, now);
                let mut acct = Acct::default();
                if let Some(s) = set.size {
                    if i.is_dir() {
                        return Err(Stop::Err(errno::EISDIR));
                    }
                    if let Some(h) = home(&i).filter(|_| i.kind() == S_IFREG) {
                        let delta = i128::from(s) - i128::from(i.size);
                        let delta = i64::try_from(delta).unwrap_or(i64::MAX);
                        acct.add(&self.ancestors(h)?, (delta, 0));
                        self.check_quota(&acct)?;
                    }
                    if i.inline && s < i.size {
                        // the inline data is cut with the file (to nothing: no longer inline)
                        let data = self.inline_of(&i)?;
                        let keep = data.slice(..data.len().min(s as usize));
                        self.set_inline(&mut i, keep, upd);
                    }
                    i.size = s;
                    i.mtime = now;
                }
                if let Some(t) = set.mtime {
                    i.mtime = t.at(now);
                }
                i.ctime = now;
                self.put(i.clone(), upd, inval);
                self.commit_acct(acct, upd);
                Ok(Reply::Attr(self.inode(*ino)?.clone()))
            }
            Op::Mknod {
                parent,
                name,
                mode,
                rdev,
                exclusive,
                open,
                ..
            } => {
                Self::check_name(name)?;
                let (p, entries) = self.live_dir(*parent)?;
                let reply = if let Some(d) = entries.get(name) {
                    let existing = self.inode(d.ino)?;
                    if *exclusive || existing.kind() != S_IFREG || mode & S_IFMT != S_IFREG {
                        return Err(Stop::Err(errno::EEXIST));
                    }
                    Reply::Attr(existing.clone())
                } else {
                    let p = p.clone();
                    let acct = self.admit_entry(p.ino)?;
                    let mut i = self.new_inode(&p, caller, *mode, now);
                    i.rdev = *rdev;
                    self.create_common(p, name, i, acct, now, upd, inval)?
                };
                if *open && let Reply::Attr(i) = &reply {
                    *self
                        .opens
                        .entry(i.ino)
                        .or_default()
                        .entry(client)
                        .or_default() += 1;
                }
                Ok(reply)
            }
            Op::Mkdir { parent, name, mode } => {
                Self::check_name(name)?;
                let (p, entries) = self.live_dir(*parent)?;
                if entries.contains_key(name) {
                    return Err(Stop::Err(errno::EEXIST));
                }
                let p = p.clone();
                let acct = self.admit_entry(p.ino)?;
                let mut i = self.new_inode(&p, caller, S_IFDIR | (mode & 0o7777), now);
                i.nlink = 2;
                self.dirs.insert(i.ino, BTreeMap::new());
                self.dirty_dirs.insert(i.ino);
                self.create_common(p, name, i, acct, now, upd, inval)
            }
            Op::Symlink {
                parent,
                name,
                target,
            } => {
                Self::check_name(name)?;
                if target.len() > 4095 {
                    return Err(Stop::Err(errno::ENAMETOOLONG));
                }
                let (p, entries) = self.live_dir(*parent)?;
                if entries.contains_key(name) {
                    return Err(Stop::Err(errno::EEXIST));
                }
                let p = p.clone();
                let acct = self.admit_entry(p.ino)?;
                let mut i = self.new_inode(&p, caller, S_IFLNK | 0o777, now);
                i.size = target.len() as u64;
                i.target = target.clone();
                self.create_common(p, name, i, acct, now, upd, inval)
            }
            Op::Link { ino, parent, name } => {
                Self::check_name(name)?;
                let (p, entries) = self.live_dir(*parent)?;
                if entries.contains_key(name) {
                    return Err(Stop::Err(errno::EEXIST));
                }
                let p = p.clone();
                let mut i = self.inode(*ino)?.clone();
                if i.is_dir() {
                    return Err(Stop::Err(errno::EPERM));
                }
                if i.nlink == 0 {
                    return Err(Stop::Err(errno::ENOENT));
                }
                if i.nlink >= 65000 {
                    return Err(Stop::Err(errno::EMLINK));
                }
                // a file no directory counts any more (its primary link went) is adopted
                let mut acct = Acct::default();
                if home(&i).is_none() {
                    acct.add(&self.ancestors(p.ino)?, weight(&i));
                    self.check_quota(&acct)?;
                    i.parent = p.ino;
                }
                i.nlink += 1;
                i.ctime = now;
                let d = Dentry {
                    ino: i.ino,
                    kind: i.kind(),
                };
                self.put(i, upd, inval);
                self.put_dentry(p.ino, name, d, upd, inval);
                self.touch_dir(p, 0, now, upd, inval);
                self.commit_acct(acct, upd);
                Ok(Reply::Attr(self.inode(*ino)?.clone()))
            }
            Op::Unlink { parent, name } | Op::Rmdir { parent, name } => {
                let rmdir = matches!(op, Op::Rmdir { .. });
                if rmdir && name == "." {
                    return Err(Stop::Err(errno::EINVAL));
                }
                if rmdir && name == ".." {
                    return Err(Stop::Err(errno::ENOTEMPTY));
                }
                let (p, entries) = self.live_dir(*parent)?;
                let d = *entries.get(name).ok_or(Stop::Err(errno::ENOENT))?;
                let p = p.clone();
                let mut i = self.inode(d.ino)?.clone();
                if rmdir {
                    if !i.is_dir() {
                        return Err(Stop::Err(errno::ENOTDIR));
                    }
                    if !self.dir(i.ino)?.is_empty() {
                        return Err(Stop::Err(errno::ENOTEMPTY));
                    }
                } else if i.is_dir() {
                    return Err(Stop::Err(errno::EISDIR));
                }
                let mut acct = Acct::default();
                if home(&i) == Some(p.ino) {
                    acct.add(&self.ancestors(p.ino)?, neg(weight(&i)));
                    if !i.is_dir() {
                        i.parent = 0; // its primary link goes: no directory counts it now
                    }
                }
                self.del_dentry(p.ino, name, upd, inval);
                let sub = if rmdir { -1 } else { 0 };
                self.touch_dir(p, sub, now, upd, inval);
                self.drop_link(i, now, upd, inval);
                self.commit_acct(acct, upd);
                Ok(Reply::Ok)
            }
            Op::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => self.rename(
                *parent,
                name,
                *new_parent,
                new_name,
                *flags,
                now,
                upd,
                inval,
            ),
            Op::ReadDir { ino, after, max } => {
                let (_, entries) = self.live_dir(*ino)?;
                let max = (*max).clamp(1, 4096) as usize;
                let iter: Box<dyn Iterator<Item = (&String, &Dentry)>> = match after {
                    Some(a) => Box::new(entries.range::<str, _>((
                        std::ops::Bound::Excluded(a.as_str()),
                        std::ops::Bound::Unbounded,
                    ))),
                    None => Box::new(entries.iter()),
                };
                let mut out = Vec::new();
                let mut more = false;
                for (n, d) in iter {
                    if out.len() == max {
                        more = true;
                        break;
                    }
                    out.push((n.clone(), *d));
                }
                Ok(Reply::Entries { entries: out, more })
            }
            Op::SetXattr {
                ino,
                name,
                value,
                flags,
            } => {
                if name.is_empty() || name.len() > 255 {
                    return Err(Stop::Err(errno::ERANGE));
                }
                if value.len() > XATTR_SIZE_MAX {
                    return Err(Stop::Err(errno::E2BIG));
                }
                if let Some(r) =
                    self.set_virtual_xattr(caller, *ino, name, Some(value), now, upd, inval)
                {
                    return r;
                }
                let mut i = self.inode(*ino)?.clone();
                let exists = i.xattrs.contains_key(name);
                if flags & XATTR_CREATE != 0 && exists {
                    return Err(Stop::Err(errno::EEXIST));
                }
                if flags & XATTR_REPLACE != 0 && !exists {
                    return Err(Stop::Err(errno::ENODATA));
                }
                if i.xattrs.values().map(Vec::len).sum::<usize>() + value.len() > 1 << 20 {
                    return Err(Stop::Err(errno::ENOSPC));
                }
                i.xattrs.insert(name.clone(), value.clone());
                i.ctime = now;
                self.put(i, upd, inval);
                Ok(Reply::Ok)
            }
            Op::GetXattr { ino, name } => {
                if let Some(r) = self.get_virtual_xattr(*ino, name) {
                    return r;
                }
                let i = self.inode(*ino)?;
                i.xattrs
                    .get(name)
                    .map(|v| Reply::Xattr(v.clone()))
                    .ok_or(Stop::Err(errno::ENODATA))
            }
            Op::ListXattr { ino } => Ok(Reply::XattrNames(
                self.inode(*ino)?.xattrs.keys().cloned().collect(),
            )),
            Op::RemoveXattr { ino, name } => {
                if let Some(r) = self.set_virtual_xattr(caller, *ino, name, None, now, upd, inval) {
                    return r;
                }
                let mut i = self.inode(*ino)?.clone();
                if i.xattrs.remove(name).is_none() {
                    return Err(Stop::Err(errno::ENODATA));
                }
                i.ctime = now;
                self.put(i, upd, inval);
                Ok(Reply::Ok)
            }
            Op::Written {
                ino,
                end,
                mtime,
                ctime,
                set,
                ..
            }
            | Op::WrittenInline {
                ino,
                end,
                mtime,
                ctime,
                set,
                ..
            } => {
                let mut i = self.inode(*ino)?.clone();
                if i.kind() != S_IFREG
                    || set
                        .as_ref()
                        .is_some_and(|s| s.size.is_some() || s.mtime.is_some())
                {
                    return Err(Stop::Err(errno::EINVAL));
                }
                let inline = match op {
                    // only a file without data objects takes inline data: one already
                    // inline, or one still empty (its writer kept every write)
                    Op::WrittenInline { data, .. }
                        if data.0.len() as u64 <= *end && (i.inline || i.size == 0) =>
                    {
                        Some(data.0.clone())
                    }
                    Op::WrittenInline { .. } => return Err(Stop::Err(errno::EINVAL)),
                    // a write past the end of an inline file that did not move the data
                    // out first (`Op::Uninline`)
                    _ if i.inline && *end > i.size => return Err(Stop::Err(errno::EINVAL)),
                    _ => None,
                };
                let mut acct = Acct::default();
                let grow = end.saturating_sub(i.size);
                if let Some(h) = home(&i).filter(|_| grow > 0) {
                    let grow = i64::try_from(grow).unwrap_or(i64::MAX);
                    acct.add(&self.ancestors(h)?, (grow, 0));
                    self.check_quota(&acct)?;
                }
                if let Some(data) = inline {
                    self.set_inline(&mut i, data, upd);
                }
                i.size = i.size.max(*end);
                i.mtime = *mtime;
                i.ctime = ctime.unwrap_or(*mtime);
                if let Some(set) = set {
                    set.apply_attrs(&mut i, now);
                }
                self.put(i, upd, inval);
                self.commit_acct(acct, upd);
                Ok(Reply::Attr(self.inode(*ino)?.clone()))
            }
            Op::ReadInline { ino } => {
                let i = self.inode(*ino)?;
                if !i.inline {
                    return Err(Stop::Err(errno::ENODATA));
                }
                Ok(Reply::Inline(InlineData(self.inline_of(i)?)))
            }
            // the daemon writes the data to the file's first object before this is applied
            Op::Uninline { ino } => {
                let mut i = self.inode(*ino)?.clone();
                if i.inline {
                    self.set_inline(&mut i, bytes::Bytes::new(), upd);
                    self.put(i, upd, inval);
                }
                Ok(Reply::Attr(self.inode(*ino)?.clone()))
            }
            Op::Open { ino, write } => {
                let i = self.inode(*ino)?.clone();
                if i.nlink == 0 && !self.opens.contains_key(ino) {
                    return Err(Stop::Err(errno::ENOENT));
                }
                if *write
                    && i.kind() == S_IFREG
                    && let Some(h) = home(&i)
                {
                    // loaded so that the daemon can tell whether a byte quota is above
                    // (no write-back there: see `Namespace::byte_quota_above`)
                    self.ancestors(h)?;
                }
                *self
                    .opens
                    .entry(*ino)
                    .or_default()
                    .entry(client)
                    .or_default() += 1;
                Ok(Reply::Attr(i))
            }
            Op::Close { ino } => {
                self.close_for(client, *ino);
                Ok(Reply::Ok)
            }
            Op::CloseMany { inos } => {
                inos.iter().for_each(|ino| self.close_for(client, *ino));
                Ok(Reply::Ok)
            }
            // the daemon answers it once the journal has caught up: nothing to apply
            Op::Sync => Ok(Reply::Ok),
            // answered by the daemon (it stores the range before the answer)
            Op::TakeInos => Err(Stop::Err(errno::EINVAL)),
            Op::Reconnect { opens } => {
                self.drop_client(client);
                for (ino, n) in opens {
                    if *n > 0 {
                        self.opens.entry(*ino).or_default().insert(client, *n);
                    }
                }
                Ok(Reply::Ok)
            }
            Op::GetLk { ino, lock } => Ok(Reply::Lock(self.locks.test(*ino, client, lock))),
            Op::SetLk { ino, lock } => {
                if !matches!(
                    lock.typ,
                    crate::locks::F_RDLCK | crate::locks::F_WRLCK | crate::locks::F_UNLCK
                ) || lock.start > lock.end
                {
                    return Err(Stop::Err(errno::EINVAL));
                }
                let before = self.locks.held_on(*ino);
                if self.locks.set(*ino, client, lock) {
                    self.journal_locks(*ino, before, upd);
                    Ok(Reply::Ok)
                } else {
                    Err(Stop::Err(errno::EAGAIN))
                }
            }
            // capabilities are the daemon's (caps.rs), never the namespace's
            Op::CapPoll { .. } => Err(Stop::Err(errno::EINVAL)),
            Op::ReleaseLocks { ino, owner } => {
                let before = self.locks.held_on(*ino);
                self.locks.release_owner(*ino, client, *owner);
                self.journal_locks(*ino, before, upd);
                Ok(Reply::Ok)
            }
        }
    }

    /// `client` closed `ino` (one of its registrations goes).
    fn close_for(&mut self, client: u64, ino: Ino) {
        if let Some(m) = self.opens.get_mut(&ino) {
            if let Some(c) = m.get_mut(&client) {
                *c = c.saturating_sub(1);
                if *c == 0 {
                    m.remove(&client);
                }
            }
            if m.is_empty() {
                self.opens.remove(&ino);
            }
        }
    }

    /// The locks on `ino` changed from `before`: journal them (nothing when they did not).
    fn journal_locks(
        &self,
        ino: Ino,
        before: Vec<(u64, crate::locks::Lock)>,
        upd: &mut Vec<Update>,
    ) {
        let held = self.locks.held_on(ino);
        if held != before {
            upd.push(Update::Locks { ino, held });
        }
    }

    /// The accounting of one new entry in `dir` (refused, EDQUOT, over a quota above it) and
    /// the layout a new file there takes.
    fn admit_entry(&self, dir: Ino) -> R<(Acct, Layout)> {
        let chain = self.ancestors(dir)?;
        let mut acct = Acct::default();
        acct.add(&chain, (0, 1));
        self.check_quota(&acct)?;
        Ok((acct, self.inherited_layout(&chain)))
    }

    /// Links the new inode `i` as `name` in `p` and journals both (and `acct`, from
    /// [`Namespace::admit_entry`]).
    #[allow(clippy::too_many_arguments)]
    fn create_common(
        &mut self,
        p: Inode,
        name: &str,
        mut i: Inode,
        (acct, layout): (Acct, Layout),
        now: Time,
        upd: &mut Vec<Update>,
        inval: &mut Invalidate,
    ) -> R<Reply> {
        if i.kind() == S_IFREG {
            i.layout.pool = layout.pool;
            i.object_size = layout.object_size.unwrap_or(i.object_size);
        }
        let d = Dentry {
            ino: i.ino,
            kind: i.kind(),
        };
        let ino = i.ino;
        let sub = i32::from(i.is_dir());
        upd.push(Update::NextIno(self.next_ino));
        self.put(i, upd, inval);
        self.put_dentry(p.ino, name, d, upd, inval);
        self.touch_dir(p, sub, now, upd, inval);
        self.commit_acct(acct, upd);
        Ok(Reply::Attr(self.inode(ino)?.clone()))
    }

    /// A directory's entries changed: mtime/ctime now, nlink by `subdirs`.
    fn touch_dir(
        &mut self,
        mut p: Inode,
        subdirs: i32,
        now: Time,
        upd: &mut Vec<Update>,
        inval: &mut Invalidate,
    ) {
        p.mtime = now;
        p.ctime = now;
        p.nlink = p.nlink.saturating_add_signed(subdirs);
        self.put(p, upd, inval);
    }

    #[allow(clippy::too_many_arguments)]
    fn rename(
        &mut self,
        parent: Ino,
        name: &str,
        new_parent: Ino,
        new_name: &str,
        flags: u32,
        now: Time,
        upd: &mut Vec<Update>,
        inval: &mut Invalidate,
    ) -> R<Reply> {
        if flags & !(RENAME_NOREPLACE) != 0 {
            return Err(Stop::Err(errno::EINVAL));
        }
        Self::check_name(new_name)?;
        if name == "." || name == ".." {
            return Err(Stop::Err(errno::EINVAL));
        }
        // load everything first
        let (_, src_entries) = self.live_dir(parent)?;
        let sd = *src_entries.get(name).ok_or(Stop::Err(errno::ENOENT))?;
        let (_, dst_entries) = self.live_dir(new_parent)?;
        let dd = dst_entries.get(new_name).copied();
        let src = self.inode(sd.ino)?.clone();
        let dst = match dd {
            Some(d) => Some(self.inode(d.ino)?.clone()),
            None => None,
        };
        if src.is_dir() && self.is_under(new_parent, src.ino)? {
            return Err(Stop::Err(errno::EINVAL));
        }
        if let Some(dst) = &dst {
            if flags & RENAME_NOREPLACE != 0 {
                return Err(Stop::Err(errno::EEXIST));
            }
            if dst.ino == src.ino {
                return Ok(Reply::Ok); // same file: POSIX says do nothing
            }
            match (src.is_dir(), dst.is_dir()) {
                (true, false) => return Err(Stop::Err(errno::ENOTDIR)),
                (false, true) => return Err(Stop::Err(errno::EISDIR)),
                (true, true) => {
                    if !self.dir(dst.ino)?.is_empty() {
                        return Err(Stop::Err(errno::ENOTEMPTY));
                    }
                    // the destination's parent chain must not pass through it either
                }
                (false, false) => {}
            }
        }
        // statistics: the moved entry leaves the directories above `parent` for those
        // above `new_parent` (a move across a quota it would exceed is EXDEV, as CephFS
        // clients answer, so that `mv` falls back to copying)
        let mut acct = Acct::default();
        let src_home = home(&src) == Some(parent);
        if src_home && parent != new_parent {
            acct.add(&self.ancestors(parent)?, neg(weight(&src)));
            acct.add(&self.ancestors(new_parent)?, weight(&src));
        }
        let dst_home = dst.as_ref().is_some_and(|d| home(d) == Some(new_parent));
        if let Some(d) = dst.as_ref().filter(|_| dst_home) {
            acct.add(&self.ancestors(new_parent)?, neg(weight(d)));
        }
        if self.check_quota(&acct).is_err() {
            return Err(Stop::Err(errno::EXDEV));
        }
        // decide, then change
        let moving_dir = src.is_dir();
        let mut replaced_dir = false;
        if let Some(mut dst) = dst {
            replaced_dir = dst.is_dir();
            if dst_home && !replaced_dir {
                dst.parent = 0;
            }
            self.drop_link(dst, now, upd, inval);
        }
        self.del_dentry(parent, name, upd, inval);
        self.put_dentry(
            new_parent,
            new_name,
            Dentry {
                ino: src.ino,
                kind: src.kind(),
            },
            upd,
            inval,
        );
        let mut moved = src;
        moved.ctime = now;
        if moving_dir || src_home {
            moved.parent = new_parent;
        }
        self.put(moved, upd, inval);
        let old_p = self.inode(parent)?.clone();
        if parent == new_parent {
            let delta = if replaced_dir { -1 } else { 0 };
            self.touch_dir(old_p, delta, now, upd, inval);
        } else {
            let d_old = if moving_dir { -1 } else { 0 };
            let d_new = i32::from(moving_dir) - i32::from(replaced_dir);
            self.touch_dir(old_p, d_old, now, upd, inval);
            let new_p = self.inode(new_parent)?.clone();
            self.touch_dir(new_p, d_new, now, upd, inval);
        }
        self.commit_acct(acct, upd);
        Ok(Reply::Ok)
    }
}

mod delegate;
pub mod frag;
mod layout;
mod quota;
pub mod requests;
#[cfg(test)]
mod tests;
