//! The FUSE adapter: a thin translation from `fuser`'s callbacks to [`FsClient`] calls.
//!
//! fuser calls the methods on one thread; each one hands its work to the tokio runtime and
//! replies from there, so slow RADOS calls never hold up other requests. Errors become errno
//! here and only here (`FsError::errno`: ENOSPC for a full cluster, EIO for anything without
//! a more precise meaning, never a silent success).
//!
//! Kernel caching follows the capabilities the MDS grants (see `caps.rs`): attributes and
//! entries are cached for what remains of the shared lease on the inode (and on the
//! directory, for an entry), and a file's pages are kept at open (`FOPEN_KEEP_CACHE`) while
//! its read lease is held; a revoke has the kernel drop them (the notifier's `inval_inode`
//! and `inval_entry`) before it is acknowledged. `attr_ttl` overrides the lease times.
//!
//! Write-back: a file opened for writing may come with the exclusive capability; its writes
//! then keep the size and mtime in the client (see `client.rs`) until `fsync`, the flush of
//! each `close` (sent behind it), a revoke, the periodic flush or unmount sends them to the
//! MDS. Such a write is answered on the FUSE thread itself once its data is on its way, when
//! no write in flight overlaps it (`FsClient::write_now`).
//!
//! Directory listings are cached by the kernel (`FOPEN_CACHE_DIR`) when read under the
//! directory's shared lease, and kept across opens (`FOPEN_KEEP_CACHE`) while it is held; the
//! revoke drops them (`inval_inode` with the pages), and a change made through this mount
//! has the next open read the listing again.
//!
//! An open with `O_DIRECT` bypasses the page cache (`FOPEN_DIRECT_IO` for that handle, with
//! asynchronous direct I/O so that `libaio` keeps several requests in flight): its reads and
//! writes go straight to RADOS like every other write. A direct write goes around the pages
//! that cached opens of the same inode on this mount may hold, so it has the kernel drop them
//! before it is acknowledged; other mounts drop theirs on the MDS's revoke, as for any write.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow,
};

use crate::client::FsClient;
use crate::error::{FsError, Result};
use crate::locks::Lock;
use crate::types::*;

/// How a mount behaves.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// How long the kernel may cache attributes and directory entries; `None`: as long as
    /// the capabilities the MDS granted allow.
    pub attr_ttl: Option<Duration>,
    /// The directory shown as the mount's root (`--subdir`), by inode.
    pub root: Ino,
    /// Name shown in /proc/mounts (`kelp:NAME`).
    pub fs_name: String,
}

/// The open flags of an `O_DIRECT` handle: no page cache, and direct writes that do not
/// grow the file may run in parallel (the kernel would otherwise take the inode lock for
/// each; RADOS orders overlapping writes itself). `FOPEN_PARALLEL_DIRECT_WRITES` is Linux
/// 6.2's bit 6, not named by fuser 0.15; older kernels ignore it.
const DIRECT_OPEN: u32 = fuser::consts::FOPEN_DIRECT_IO | (1 << 6);

/// A directory's entries, read at opendir and served from here by readdir.
type Listing = Vec<(String, Dentry)>;

struct Handle {
    ino: Ino,
    append: bool,
    /// Opened with `O_DIRECT`: no page cache for this handle.
    direct: bool,
    object_size: u64,
    pool: Option<u32>,
}

impl Handle {
    /// The handle of an open of `i` with the open's `flags`.
    fn of(i: &Inode, flags: i32) -> Handle {
        Handle {
            ino: i.ino,
            append: flags & libc::O_APPEND != 0,
            direct: flags & libc::O_DIRECT != 0,
            object_size: i.object_size,
            pool: i.layout.pool,
        }
    }
}

/// What the kernel is told of an open with `flags`: no page cache for `O_DIRECT`; `keep`:
/// the file's cached pages are current (read under a read lease still held).
fn open_flags(flags: i32, keep: bool) -> u32 {
    if flags & libc::O_DIRECT != 0 {
        DIRECT_OPEN
    } else if keep {
        fuser::consts::FOPEN_KEEP_CACHE
    } else {
        0
    }
}

/// The FUSE file system.
pub struct KelpFuse {
    client: Arc<FsClient>,
    rt: tokio::runtime::Handle,
    cfg: MountConfig,
    handles: Arc<Mutex<HashMap<u64, Handle>>>,
    dirs: Arc<Mutex<HashMap<u64, Listing>>>,
    /// (inode, lock owner) pairs that took a lock here: released at flush/release.
    locked: Arc<Mutex<HashSet<(Ino, u64)>>>,
    next_fh: AtomicU64,
    /// The kernel took `FUSE_HANDLE_KILLPRIV_V2`: the mount kills set-user-ID and
    /// set-group-ID bits on chown, and on writes, truncates and `fallocate` by callers
    /// without `CAP_FSETID` (the kernel then neither asks for a file's attributes before
    /// each `chown` nor checks its privileges before every write).
    killpriv: bool,
}

/// `FUSE_HANDLE_KILLPRIV_V2` (protocol 7.33; fuser has no name for it): the file system
/// kills set-user-ID and set-group-ID bits itself.
const FUSE_HANDLE_KILLPRIV_V2: u32 = 1 << 28;

fn caller(req: &Request<'_>) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn kind(mode: u32) -> FileType {
    match mode & S_IFMT {
        S_IFDIR => FileType::Directory,
        S_IFLNK => FileType::Symlink,
        0o020000 => FileType::CharDevice,
        0o060000 => FileType::BlockDevice,
        0o010000 => FileType::NamedPipe,
        0o140000 => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn name_of(name: &OsStr) -> Result<String> {
    name.to_str()
        .map(str::to_string)
        .ok_or(FsError::Errno(libc::EILSEQ))
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(Time::from_system(t)),
    }
}

/// The kernel cache time of a reply: the `--attr-timeout` override, or the lease's remainder.
#[derive(Clone, Copy)]
struct Ttl(Option<Duration>);

impl Ttl {
    fn attr(self, c: &FsClient, ino: Ino) -> Duration {
        self.0.unwrap_or_else(|| c.attr_ttl(ino))
    }
    fn entry(self, c: &FsClient, parent: Ino, ino: Ino) -> Duration {
        self.0.unwrap_or_else(|| c.entry_ttl(parent, ino))
    }
}

impl KelpFuse {
    pub fn new(client: Arc<FsClient>, rt: tokio::runtime::Handle, cfg: MountConfig) -> KelpFuse {
        KelpFuse {
            client,
            rt,
            cfg,
            handles: Arc::default(),
            dirs: Arc::default(),
            locked: Arc::default(),
            next_fh: AtomicU64::new(1),
            killpriv: false,
        }
    }

    fn ino_in(&self, ino: u64) -> Ino {
        if ino == fuser::FUSE_ROOT_ID {
            self.cfg.root
        } else {
            ino
        }
    }

    fn attr(root: Ino, i: &Inode) -> FileAttr {
        let ino = if i.ino == root {
            fuser::FUSE_ROOT_ID
        } else {
            i.ino
        };
        FileAttr {
            ino,
            size: i.size,
            blocks: i.size.div_ceil(512),
            atime: i.atime.to_system(),
            mtime: i.mtime.to_system(),
            ctime: i.ctime.to_system(),
            crtime: SystemTime::UNIX_EPOCH,
            kind: kind(i.mode),
            perm: (i.mode & 0o7777) as u16,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            blksize: 65536,
            flags: 0,
        }
    }

    /// Runs `f` on the runtime (the reply is sent from inside `f`).
    fn spawn<F>(&self, f: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.rt.spawn(f);
    }

    fn ctx(&self) -> (Arc<FsClient>, Ino, Ttl) {
        (self.client.clone(), self.cfg.root, Ttl(self.cfg.attr_ttl))
    }

    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }
}

impl Filesystem for KelpFuse {
    fn init(
        &mut self,
        _req: &Request<'_>,
        config: &mut KernelConfig,
    ) -> std::result::Result<(), libc::c_int> {
        let _ = config.set_max_write(1 << 20);
        // fcntl and flock locks are decided by the MDS, so they hold across mounts
        let _ = config
            .add_capabilities(fuser::consts::FUSE_POSIX_LOCKS | fuser::consts::FUSE_FLOCK_LOCKS);
        // O_DIRECT requests from libaio and io_uring reach us concurrently, not one by one
        let _ = config.add_capabilities(fuser::consts::FUSE_ASYNC_DIO);
        // set-user-ID and set-group-ID bits are killed here (see `killpriv`)
        self.killpriv = config.add_capabilities(FUSE_HANDLE_KILLPRIV_V2).is_ok();
        Ok(())
    }

    fn lookup(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let (c, root, ttl) = self.ctx();
        let (who, parent) = (caller(req), self.ino_in(parent));
        let name = name_of(name);
        if name.as_ref().is_ok_and(|n| c.known_absent(parent, n)) {
            // a complete directory: answered here, without a trip through the runtime
            return reply.error(libc::ENOENT);
        }
        self.spawn(async move {
            let r = async { c.lookup(who, parent, &name?).await }.await;
            match r {
                Ok(i) => {
                    let _g = c.begin_reply();
                    reply.entry(&ttl.entry(&c, parent, i.ino), &Self::attr(root, &i), 0)
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn getattr(&mut self, req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        let (c, root, ttl) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        {
            let _g = c.begin_reply();
            if let Some(i) = c.cached_attr(ino) {
                // under the shared lease: answered here, without a trip through the runtime
                return reply.attr(&ttl.attr(&c, i.ino), &Self::attr(root, &i));
            }
        }
        self.spawn(async move {
            match c.getattr(who, ino).await {
                Ok(i) => {
                    let _g = c.begin_reply();
                    reply.attr(&ttl.attr(&c, i.ino), &Self::attr(root, &i))
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn setattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let (c, root, ttl) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        let mut set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        // A chown kills set-user-ID and set-group-ID bits, and so does a truncate by a caller
        // without CAP_FSETID (`killpriv`): with the change, from the mode cached here or asked.
        let kill = self.killpriv
            && mode.is_none()
            && (uid.is_some() || gid.is_some() || (size.is_some() && who.uid != 0));
        let mut ask = false;
        if kill {
            match c.cached_attr(ino) {
                Some(i) => set.mode = killed_mode(i.mode),
                None => ask = true,
            }
        }
        if !ask {
            let _g = c.begin_reply();
            if let Some(i) = c.set_locally(ino, &set) {
                // under the exclusive capability: made here
                return reply.attr(&ttl.attr(&c, i.ino), &Self::attr(root, &i));
            }
        }
        self.spawn(async move {
            let r = async {
                if ask {
                    set.mode = killed_mode(c.getattr(who, ino).await?.mode);
                }
                c.setattr(who, ino, set).await
            };
            match r.await {
                Ok(i) => {
                    let _g = c.begin_reply();
                    reply.attr(&ttl.attr(&c, i.ino), &Self::attr(root, &i))
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn readlink(&mut self, req: &Request<'_>, ino: u64, reply: ReplyData) {
        let (c, _, _) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        self.spawn(async move {
            match c.getattr(who, ino).await {
                Ok(i) if i.kind() == S_IFLNK => reply.data(i.target.as_bytes()),
                Ok(_) => reply.error(libc::EINVAL),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn mknod(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (c, root, ttl) = self.ctx();
        let (who, parent) = (caller(req), self.ino_in(parent));
        let name = name_of(name);
        self.spawn(async move {
            let r = async { c.mknod(who, parent, &name?, mode, rdev, true).await }.await;
            match r {
                Ok(i) => {
                    let _g = c.begin_reply();
                    reply.entry(&ttl.entry(&c, parent, i.ino), &Self::attr(root, &i), 0)
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn mkdir(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let (c, root, ttl) = self.ctx();
        let (who, parent) = (caller(req), self.ino_in(parent));
        let name = name_of(name);
        self.spawn(async move {
            let r = async { c.mkdir(who, parent, &name?, mode).await }.await;
            match r {
                Ok(i) => {
                    let _g = c.begin_reply();
                    reply.entry(&ttl.entry(&c, parent, i.ino), &Self::attr(root, &i), 0)
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn unlink(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let (c, _, _) = self.ctx();
        let (who, parent) = (caller(req), self.ino_in(parent));
        let name = name_of(name);
        if let Ok(n) = &name
            && c.unlink_now(&self.rt, who, parent, n)
        {
            // a file this mount made in a directory it made: answered here, sent behind
            return reply.ok();
        }
        self.spawn(async move {
            match async { c.unlink(who, parent, &name?).await }.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn rmdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let (c, _, _) = self.ctx();
        let (who, parent) = (caller(req), self.ino_in(parent));
        let name = name_of(name);
        self.spawn(async move {
            match async { c.rmdir(who, parent, &name?).await }.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn symlink(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (c, root, ttl) = self.ctx();
        let (who, parent) = (caller(req), self.ino_in(parent));
        let name = name_of(link_name);
        let target = name_of(target.as_os_str());
        self.spawn(async move {
            let r = async { c.symlink(who, parent, &name?, &target?).await }.await;
            match r {
                Ok(i) => {
                    let _g = c.begin_reply();
                    reply.entry(&ttl.entry(&c, parent, i.ino), &Self::attr(root, &i), 0)
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn rename(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let (c, _, _) = self.ctx();
        let who = caller(req);
        let (parent, newparent) = (self.ino_in(parent), self.ino_in(newparent));
        let (name, newname) = (name_of(name), name_of(newname));
        self.spawn(async move {
            let r = async {
                c.rename(who, parent, &name?, newparent, &newname?, flags)
                    .await
            }
            .await;
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn link(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let (c, root, ttl) = self.ctx();
        let who = caller(req);
        let (ino, newparent) = (self.ino_in(ino), self.ino_in(newparent));
        let name = name_of(newname);
        self.spawn(async move {
            match async { c.link(who, ino, newparent, &name?).await }.await {
                Ok(i) => {
                    let _g = c.begin_reply();
                    reply.entry(&ttl.entry(&c, newparent, i.ino), &Self::attr(root, &i), 0)
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn open(&mut self, req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let (c, _, _) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        let fh = self.new_fh();
        let handles = self.handles.clone();
        self.spawn(async move {
            // pages read under a read lease that is still held are current: keep them
            let keep = c.has_read_cache(ino);
            let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
            match c.open(who, ino, write).await {
                Ok(i) => {
                    handles
                        .lock()
                        .expect("handles lock")
                        .insert(fh, Handle::of(&i, flags));
                    reply.opened(fh, open_flags(flags, keep))
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (c, root, ttl) = self.ctx();
        let (who, parent) = (caller(req), self.ino_in(parent));
        let name = name_of(name);
        let fh = self.new_fh();
        let handles = self.handles.clone();
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        // the new file's handle is registered and the kernel answered, as for an open
        let created = move |i: Inode, reply: ReplyCreate| {
            handles
                .lock()
                .expect("handles lock")
                .insert(fh, Handle::of(&i, flags));
            let _g = c.begin_reply();
            let t = ttl.entry(&c, parent, i.ino);
            reply.created(&t, &Self::attr(root, &i), 0, fh, open_flags(flags, false))
        };
        if let Ok(n) = &name
            && let Some(i) = self
                .client
                .create_now(&self.rt, who, parent, n, mode, write)
        {
            // a directory this mount made: answered here, the create sent behind
            return created(i, reply);
        }
        let c = self.client.clone();
        self.spawn(async move {
            let r = async {
                let exclusive = flags & libc::O_EXCL != 0;
                c.create(who, parent, &name?, mode, exclusive, write).await
            }
            .await;
            match r {
                Ok(i) => created(i, reply),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn read(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let (c, _, _) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        let direct = self
            .handles
            .lock()
            .expect("handles lock")
            .get(&fh)
            .is_some_and(|h| h.direct);
        self.spawn(async move {
            if direct {
                let r = async {
                    let i = c.getattr(who, ino).await?;
                    c.read(&i, offset.max(0) as u64, u64::from(size)).await
                }
                .await;
                match r {
                    Ok(d) => reply.data(&d),
                    Err(e) => reply.error(e.errno()),
                }
                return;
            }
            // The kernel keeps what this read returns as pages: read under the read cache,
            // and let a revoke that comes meanwhile wait for the reply, so that it drops them.
            let i = match c.getattr_for_read(who, ino).await {
                Ok(i) => i,
                Err(e) => return reply.error(e.errno()),
            };
            let kept = {
                let _g = c.begin_reply();
                match c.read(&i, offset.max(0) as u64, u64::from(size)).await {
                    Ok(d) => reply.data(&d),
                    Err(e) => return reply.error(e.errno()),
                }
                c.has_read_cache(ino)
            };
            if !kept {
                // the read cache went while reading: these pages would outlive it unseen
                c.drop_kernel_pages(ino).await;
            }
        });
    }

    fn write(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let (c, _, _) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        // a writer without CAP_FSETID kills set-user-ID and set-group-ID bits (`killpriv`)
        let kill = self.killpriv
            && write_flags & fuser::consts::FUSE_WRITE_KILL_PRIV != 0
            && !c.nothing_to_kill(ino);
        let (append, direct, object_size, pool, cached_opens) = {
            let handles = self.handles.lock().expect("handles lock");
            let cached_opens = handles.values().any(|h| h.ino == ino && !h.direct);
            match handles.get(&fh) {
                Some(h) => (h.append, h.direct, h.object_size, h.pool, cached_opens),
                None => (false, false, DEFAULT_OBJECT_SIZE, None, cached_opens),
            }
        };
        // the write needs only the layout
        let layout_only = Inode {
            ino,
            mode: S_IFREG,
            nlink: 1,
            layout: Layout {
                pool,
                object_size: None,
            },
            object_size,
            ..Inode::default()
        };
        if !append
            && !direct
            && !kill
            && let Some(r) = c.write_now(&self.rt, &layout_only, offset.max(0) as u64, data)
        {
            // write-behind: answered here, without a trip through the runtime
            return match r {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => reply.error(e.errno()),
            };
        }
        let data = data.to_vec();
        self.spawn(async move {
            let r = async {
                if kill {
                    c.kill_privs(ino).await?;
                }
                let mut i = if append {
                    c.getattr(who, ino).await?
                } else {
                    layout_only
                };
                i.object_size = object_size;
                let off = if append { i.size } else { offset.max(0) as u64 };
                c.write(&i, off, &data, !direct).await?;
                if direct {
                    // pages cached before the write are stale now
                    c.direct_written(ino, cached_opens).await;
                }
                Ok::<_, FsError>(())
            }
            .await;
            match r {
                Ok(_) => reply.written(data.len() as u32),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn flush(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, owner: u64, reply: ReplyEmpty) {
        // A close: it reports a buffered write of the file that failed, drops the closing
        // owner's POSIX locks, and sends the MDS what this mount kept of the file (size,
        // times, attributes) without waiting for the writes in flight to be stored, and
        // (when no lock is dropped) without waiting for the MDS's answer.
        let ino = self.ino_in(ino);
        let locked = self.locked.lock().expect("locks").remove(&(ino, owner));
        let (c, _, _) = self.ctx();
        let failed = c.write_error(ino);
        if failed.is_none() && !locked && !c.has_dirty(ino) {
            // nothing to send: answered here, without a trip through the runtime
            return reply.ok();
        }
        if failed.is_none() && !locked && c.flush_behind_close(&self.rt, ino) {
            // what this mount kept of the file goes to the MDS behind the close
            return reply.ok();
        }
        self.spawn(async move {
            let r = async {
                if failed.is_none() {
                    c.flush_at_close(ino).await?;
                }
                if locked {
                    c.release_locks(ino, owner).await?;
                }
                failed.map_or(Ok(()), |e| Err(FsError::Errno(e)))
            }
            .await;
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn getlk(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        lock_owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let (c, _, _) = self.ctx();
        let ino = self.ino_in(ino);
        let lock = Lock {
            owner: lock_owner,
            start,
            end,
            typ,
            pid,
        };
        self.spawn(async move {
            match c.getlk(ino, lock).await {
                Ok(Some(l)) => reply.locked(l.start, l.end, l.typ, l.pid),
                Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn setlk(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        lock_owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let (c, _, _) = self.ctx();
        let ino = self.ino_in(ino);
        if typ != libc::F_UNLCK {
            self.locked.lock().expect("locks").insert((ino, lock_owner));
        }
        let lock = Lock {
            owner: lock_owner,
            start,
            end,
            typ,
            pid,
        };
        self.spawn(async move {
            match c.setlk(ino, lock, sleep).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let (c, _, _) = self.ctx();
        let h = self.handles.lock().expect("handles lock").remove(&fh);
        // flock locks belong to the open file: its release drops them
        let owner = lock_owner.filter(|o| {
            h.as_ref()
                .is_some_and(|h| self.locked.lock().expect("locks").remove(&(h.ino, *o)))
        });
        if owner.is_none() && h.as_ref().is_none_or(|h| c.close_quick(h.ino)) {
            // no lock to drop and nothing to flush
            return reply.ok();
        }
        self.spawn(async move {
            if let (Some(h), Some(o)) = (&h, owner)
                && let Err(e) = c.release_locks(h.ino, o).await
            {
                tracing::warn!("releasing locks on {:x}: {e}", h.ino);
            }
            if let Some(h) = h
                && let Err(e) = c.close(h.ino).await
            {
                tracing::warn!("closing {:x}: {e}", h.ino);
            }
            reply.ok();
        });
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _ds: bool, reply: ReplyEmpty) {
        // data is durable when a write is acknowledged; the size (and mtime) kept under the
        // exclusive capability, and every change the MDS answered early (the file's create
        // among them), are in the MDS's journal before this returns
        let (c, _, _) = self.ctx();
        let ino = self.ino_in(ino);
        self.spawn(async move {
            match async { c.flush(ino).await.and(c.sync_mds().await) }.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _ds: bool, reply: ReplyEmpty) {
        // the directory's entries are durable once the MDS's journal holds every change it
        // answered this mount early
        let (c, _, _) = self.ctx();
        self.spawn(async move {
            match c.sync_mds().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn opendir(&mut self, req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        let (c, _, _) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        let fh = self.new_fh();
        let dirs = self.dirs.clone();
        self.spawn(async move {
            {
                // a revoke waits for this reply before it drops the kernel's listing
                let _g = c.begin_reply();
                if c.listing_cached(ino) {
                    // the kernel's listing is current: no readdir reaches the MDS (if the
                    // kernel has lost part of it, `readdir` reads it then)
                    let flags = fuser::consts::FOPEN_CACHE_DIR | fuser::consts::FOPEN_KEEP_CACHE;
                    return reply.opened(fh, flags);
                }
            }
            match c.readdir_for_cache(who, ino).await {
                Ok((entries, keep)) => {
                    dirs.lock().expect("dirs lock").insert(fh, entries);
                    let _g = c.begin_reply();
                    // a fresh cache (without KEEP_CACHE the kernel drops the old one), kept
                    // only while the lease it was read under stays
                    let flags = if keep && c.listing_cached(ino) {
                        fuser::consts::FOPEN_CACHE_DIR
                    } else {
                        0
                    };
                    reply.opened(fh, flags)
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn readdir(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        reply: ReplyDirectory,
    ) {
        let root = self.cfg.root;
        {
            let dirs = self.dirs.lock().expect("dirs lock");
            if let Some(entries) = dirs.get(&fh) {
                fill_dir(reply, ino, root, entries, offset);
                return;
            }
        }
        // opened on the kernel's cached listing, which it no longer has all of
        let (c, _, _) = self.ctx();
        let (who, dir) = (caller(req), self.ino_in(ino));
        let dirs = self.dirs.clone();
        self.spawn(async move {
            match c.readdir_for_cache(who, dir).await {
                Ok((entries, keep)) => {
                    {
                        let _g = c.begin_reply();
                        fill_dir(reply, ino, root, &entries, offset);
                    }
                    dirs.lock().expect("dirs lock").insert(fh, entries);
                    if !keep {
                        // a revoke came meanwhile: what the kernel cached from this is stale
                        c.drop_kernel_pages(dir).await;
                    }
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn releasedir(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _f: i32, reply: ReplyEmpty) {
        self.dirs.lock().expect("dirs lock").remove(&fh);
        reply.ok();
    }

    fn destroy(&mut self) {
        // unmount: sizes kept under exclusive capabilities reach the MDS
        let c = self.client.clone();
        let flushed = self.rt.block_on(async move {
            // bounded: an unreachable MDS must not hold the unmount up for long
            tokio::time::timeout(Duration::from_secs(10), async {
                c.flush_all().await?;
                c.send_closes(Duration::ZERO).await?;
                c.sync_mds().await
            })
            .await
        });
        match flushed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("flushing file sizes at unmount: {e}"),
            Err(_) => tracing::warn!("flushing file sizes at unmount: the MDS did not answer"),
        }
    }
    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let (c, _, _) = self.ctx();
        self.spawn(async move {
            match c.space().await {
                Ok((total, avail)) => {
                    let bs = 4096u64;
                    reply.statfs(
                        total / bs,
                        avail / bs,
                        avail / bs,
                        u64::MAX >> 1,
                        u64::MAX >> 1,
                        bs as u32,
                        NAME_MAX as u32,
                        bs as u32,
                    )
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn setxattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (c, _, _) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        let name = name_of(name);
        let value = value.to_vec();
        self.spawn(async move {
            let r = async { c.setxattr(who, ino, &name?, &value, flags as u32).await }.await;
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn getxattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        let (c, _, _) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        let name = name_of(name);
        let answer = move |r: Result<Vec<u8>>| match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(libc::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(e.errno()),
        };
        if let Some(x) = name.as_ref().ok().and_then(|n| c.cached_xattr(ino, n)) {
            // from the cached inode (the kernel asks for security.capability before every
            // write): answered here, without a trip through the runtime
            return answer(x);
        }
        self.spawn(async move { answer(async { c.getxattr(who, ino, &name?).await }.await) });
    }

    fn listxattr(&mut self, req: &Request<'_>, ino: u64, size: u32, reply: ReplyXattr) {
        let (c, _, _) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        self.spawn(async move {
            match c.listxattr(who, ino).await {
                Ok(names) => {
                    let mut buf = Vec::new();
                    for n in names {
                        buf.extend_from_slice(n.as_bytes());
                        buf.push(0);
                    }
                    if size == 0 {
                        reply.size(buf.len() as u32)
                    } else if buf.len() > size as usize {
                        reply.error(libc::ERANGE)
                    } else {
                        reply.data(&buf)
                    }
                }
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn removexattr(&mut self, req: &Request<'_>, ino: u64, name: &OsStr, reply: ReplyEmpty) {
        let (c, _, _) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        let name = name_of(name);
        self.spawn(async move {
            match async { c.removexattr(who, ino, &name?).await }.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.errno()),
            }
        });
    }

    fn access(&mut self, _req: &Request<'_>, _ino: u64, _mask: i32, reply: ReplyEmpty) {
        // permission bits are checked by the kernel (default_permissions)
        reply.ok();
    }

    fn fallocate(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let (c, _, _) = self.ctx();
        let (who, ino) = (caller(req), self.ino_in(ino));
        let (offset, length) = (offset.max(0) as u64, length.max(0) as u64);
        // as a write: a caller without CAP_FSETID kills set-user-ID and set-group-ID bits
        let kill = self.killpriv && who.uid != 0;
        self.spawn(async move {
            let r = async {
                let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                if ![0, libc::FALLOC_FL_KEEP_SIZE, punch].contains(&mode) {
                    return Err(FsError::Errno(libc::EOPNOTSUPP));
                }
                if kill {
                    c.kill_privs(ino).await?;
                }
                let i = c.getattr(who, ino).await?;
                match mode {
                    // allocate: objects are thin, so only the size may grow
                    0 => {
                        let end = offset + length;
                        if end > i.size {
                            c.setattr(
                                who,
                                ino,
                                SetAttr {
                                    size: Some(end),
                                    ..SetAttr::default()
                                },
                            )
                            .await?;
                        }
                        Ok(())
                    }
                    libc::FALLOC_FL_KEEP_SIZE => Ok(()),
                    // the punch (the only mode left), in the data objects
                    _ => {
                        c.make_plain(ino).await?;
                        c.zero(&i, offset, length).await
                    }
                }
            }
            .await;
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.errno()),
            }
        });
    }
}

/// Replies to a readdir from `entries` (after `.` and `..`), from `offset` on.
fn fill_dir(
    mut reply: ReplyDirectory,
    ino: u64,
    root: Ino,
    entries: &[(String, Dentry)],
    offset: i64,
) {
    let mut idx = offset.max(0) as usize;
    loop {
        let full = match idx {
            0 => reply.add(ino, 1, FileType::Directory, "."),
            1 => reply.add(ino, 2, FileType::Directory, ".."),
            n => match entries.get(n - 2) {
                Some((name, d)) => {
                    let i = if d.ino == root {
                        fuser::FUSE_ROOT_ID
                    } else {
                        d.ino
                    };
                    reply.add(i, (n + 1) as i64, kind(d.kind), name)
                }
                None => break,
            },
        };
        if full {
            break;
        }
        idx += 1;
    }
    reply.ok();
}

/// Mounts the file system at `mountpoint` and serves it until it is unmounted.
pub fn mount(fs: KelpFuse, mountpoint: &Path) -> Result<()> {
    let mut options = vec![
        MountOption::FSName(fs.cfg.fs_name.clone()),
        MountOption::Subtype("kelp".into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
        MountOption::Exec,
    ];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        options.push(MountOption::AllowOther);
        options.push(MountOption::Suid);
        options.push(MountOption::Dev);
    }
    let client = fs.client.clone();
    let root = fs.cfg.root;
    let mut session = fuser::Session::new(fs, mountpoint, &options)?;
    let notifier = session.notifier();
    // A revoke drops the kernel's copies: attributes (an inode), pages (with the read
    // lease), and directory entries. Errors mean the kernel holds nothing of it (ENOENT).
    client.set_invalidator(Arc::new(move |revokes: &[CapRevoke]| {
        for r in revokes {
            let k = if r.ino == root {
                fuser::FUSE_ROOT_ID
            } else {
                r.ino
            };
            let pages = r.caps & CAP_READ != 0;
            let _ = notifier.inval_inode(k, if pages { 0 } else { -1 }, 0);
            for name in &r.names {
                let _ = notifier.inval_entry(k, OsStr::new(name));
            }
        }
    }));
    session.run()?;
    Ok(())
}

/// Unmounts a Kelp mount (lazily if it is busy).
pub fn unmount(mountpoint: &Path) -> Result<()> {
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(mountpoint)
        .stderr(std::process::Stdio::null())
        .status();
    if matches!(status, Ok(s) if s.success()) {
        return Ok(());
    }
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| FsError::Config("mount point with a NUL byte".into()))?;
    // SAFETY: c is a valid NUL-terminated path; umount2 only reads it.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}
