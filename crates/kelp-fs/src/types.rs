//! The file system's data model and the client <-> MDS protocol.
//!
//! Everything here is serialized (to the metadata pool, to the journal, to the wire) and
//! therefore versioned: stored records carry a `v` field and the wire messages go inside a
//! [`Envelope`] whose version the MDS checks before it looks further.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// An inode number. The root directory is [`ROOT_INO`], as FUSE wants it.
pub type Ino = u64;

/// The root directory's inode number.
pub const ROOT_INO: Ino = 1;
/// The first inode number handed out to files (below it: reserved).
pub const FIRST_INO: Ino = 0x100;
/// The protocol version this build speaks (client and MDS).
pub const PROTOCOL_VERSION: u16 = 1;
/// The version of stored records (inodes, dentries, journal entries).
pub const RECORD_VERSION: u8 = 1;
/// Longest name of a directory entry, in bytes (as most local file systems).
pub const NAME_MAX: usize = 255;

/// Why `name` cannot be a directory entry (EINVAL: empty, `.`, `..`, or with a `/`;
/// ENAMETOOLONG: past [`NAME_MAX`]), if it cannot.
pub fn name_error(name: &str) -> Option<i32> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        Some(errno::EINVAL)
    } else if name.len() > NAME_MAX {
        Some(errno::ENAMETOOLONG)
    } else {
        None
    }
}
/// Largest extended attribute value.
pub const XATTR_SIZE_MAX: usize = 65536;
/// Default size of the data objects a file is striped over (CephFS's default).
pub const DEFAULT_OBJECT_SIZE: u64 = 4 << 20;
/// msgr message type of a client request to the MDS (and its reply).
pub const MSG_MDS_REQUEST: u16 = 0x4d01;
/// msgr message type of an MDS push to a client (invalidations).
pub const MSG_MDS_PUSH: u16 = 0x4d02;
// early replies (unsafe until journaled)
/// msgr message type of an "unsafe" reply: the change is applied and visible, but its
/// journal entry may not be in RADOS yet. The client keeps the request until an
/// [`Op::Sync`] answers, and sends it again to an MDS that takes over meanwhile.
pub const MSG_MDS_UNSAFE: u16 = 0x4d03;

/// The file-type bits of a mode (`S_IFMT`).
pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;
pub const S_ISGID: u32 = 0o2000;
pub const S_ISUID: u32 = 0o4000;
pub const S_IXGRP: u32 = 0o0010;

/// The mode a file takes when its set-user-ID and set-group-ID bits are killed, as Linux
/// kills them on a `chown`, and on a write or truncate by a caller without `CAP_FSETID`:
/// set-user-ID always, set-group-ID when the group may execute (without it, the bit marks
/// mandatory locking, not privilege). `None`: nothing to kill (or a directory, whose bits
/// mean something else and stay).
pub fn killed_mode(mode: u32) -> Option<u32> {
    if mode & S_IFMT == S_IFDIR {
        return None;
    }
    let mut m = mode & !S_ISUID;
    if m & S_IXGRP != 0 {
        m &= !S_ISGID;
    }
    (m != mode).then_some(m)
}

/// A point in time: seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct Time {
    pub secs: i64,
    pub nanos: u32,
}

impl Time {
    /// The current wall-clock time.
    pub fn now() -> Time {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: d.subsec_nanos(),
        }
    }

    pub fn to_system(self) -> std::time::SystemTime {
        let base = std::time::UNIX_EPOCH;
        if self.secs >= 0 {
            base + std::time::Duration::new(self.secs.unsigned_abs(), self.nanos)
        } else {
            base - std::time::Duration::from_secs(self.secs.unsigned_abs())
                + std::time::Duration::from_nanos(u64::from(self.nanos))
        }
    }

    pub fn from_system(t: std::time::SystemTime) -> Time {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Time {
                secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let mut secs = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
                let mut nanos = d.subsec_nanos();
                if nanos > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - nanos;
                }
                Time { secs, nanos }
            }
        }
    }
}

/// An inode: what `stat` shows, plus a symlink's target and the extended attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Inode {
    pub ino: Ino,
    /// Type and permission bits (`st_mode`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub rdev: u32,
    /// A directory's parent (a directory has exactly one link to it); for other inodes the
    /// directory of their primary link, under whose statistics and quota they count (0: none,
    /// e.g. once that link is gone while other hard links remain).
    pub parent: Ino,
    /// A symlink's target.
    #[serde(default)]
    pub target: String,
    #[serde(default)]
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// Size of the data objects the file is striped over.
    pub object_size: u64,
    /// Bumped on every change; clients use it to tell whether their cached copy is current.
    #[serde(default)]
    pub version: u64,
    /// A directory's recursive statistics and quota (zero for other inodes).
    #[serde(default)]
    pub dirstat: DirStat,
    /// A regular file: the pool of its data objects. A directory: the layout new files below
    /// it take. `None` fields: as the directories above (at the top, the file system's default
    /// data pool and [`DEFAULT_OBJECT_SIZE`]).
    #[serde(default)]
    pub layout: Layout,
    /// A directory's fragment layout: its entries are spread over `2^frag_bits` omap objects
    /// by a hash of the name (`core::frag`); 0, one object (older records: always 0).
    #[serde(default)]
    pub frag_bits: u8,
    /// A regular file whose data lives with its inode in the metadata pool, not in data
    /// objects ([`InlineData`]): the bytes [`Op::ReadInline`] gives, zeros after them up to
    /// `size`. Set by the first flush of a small file the client created itself
    /// ([`Op::WrittenInline`]); cleared when the data moves out to its object
    /// ([`Op::Uninline`]) or the file is cut to nothing.
    #[serde(default, skip_serializing_if = "is_false")]
    pub inline: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

// inline data
/// Most bytes of data a file keeps with its inode ([`Inode::inline`]): a small file's
/// write, replicated to a data object of its own, costs the OSDs more than all of its
/// metadata; kept inline, it is journaled with the close's size and written back with the
/// inodes of its shard.
pub const INLINE_MAX: usize = 4096;

/// A small file's data, as the MDS keeps it ([`Inode::inline`]); base64 in JSON (the
/// protocol and the journal), raw bytes in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InlineData(pub bytes::Bytes);

impl Serialize for InlineData {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for InlineData {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use base64::Engine;
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)?;
        if bytes.len() > INLINE_MAX {
            return Err(serde::de::Error::custom(format!(
                "{} bytes of inline data (at most {INLINE_MAX})",
                bytes.len()
            )));
        }
        Ok(InlineData(bytes.into()))
    }
}

/// The metadata-pool object whose omap holds the inline data of inode `ino` (key
/// [`inode_key`]), beside its [`inode_shard_object`].
pub fn inline_shard_object(ino: Ino) -> String {
    format!("mds.inline.{:x}", ino >> INODE_SHARD_BITS)
}

/// A file layout (as CephFS's): which data pool a file's objects go to and how big they are.
/// A file's object size is kept in [`Inode::object_size`]; `object_size` here is set on
/// directories only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Layout {
    /// A data pool of the file system (by id).
    pub pool: Option<u32>,
    pub object_size: Option<u64>,
}

/// Virtual extended attributes of layouts: a directory's (set by root or its owner; removing
/// clears) and a file's (set only while the file is empty). Values: a data pool's name, an
/// object size in bytes.
pub const XATTR_DIR_LAYOUT_POOL: &str = "kelp.dir.layout.pool";
pub const XATTR_DIR_LAYOUT_OBJECT_SIZE: &str = "kelp.dir.layout.object_size";
pub const XATTR_FILE_LAYOUT_POOL: &str = "kelp.file.layout.pool";
pub const XATTR_FILE_LAYOUT_OBJECT_SIZE: &str = "kelp.file.layout.object_size";
/// Smallest and largest object size a layout may name.
pub const MIN_OBJECT_SIZE: u64 = 64 << 10;
pub const MAX_OBJECT_SIZE: u64 = 1 << 30;

/// What lies below a directory, and the quota on it. Regular files count under their
/// primary link only: the directory they were created in or last renamed to (the inode's
/// `parent`); a hard link elsewhere adds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DirStat {
    /// Bytes of the regular files below the directory (their sizes).
    pub rbytes: u64,
    /// Entries below it (files, directories, symlinks, ...), not the directory itself.
    pub rentries: u64,
    /// Quota on `rbytes` (0: none).
    pub max_bytes: u64,
    /// Quota on `rentries` (0: none).
    pub max_files: u64,
}

/// Virtual extended attributes of directories: the quota (set by root; `0` or removing the
/// attribute clears it) and the recursive statistics (read only).
pub const XATTR_QUOTA_MAX_BYTES: &str = "kelp.quota.max_bytes";
pub const XATTR_QUOTA_MAX_FILES: &str = "kelp.quota.max_files";
pub const XATTR_DIR_RBYTES: &str = "kelp.dir.rbytes";
pub const XATTR_DIR_RENTRIES: &str = "kelp.dir.rentries";

impl Inode {
    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
    pub fn kind(&self) -> u32 {
        self.mode & S_IFMT
    }
}

/// A directory entry: the name's inode and its type (so `readdir` needs no inode reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dentry {
    pub ino: Ino,
    /// `S_IFMT` bits of the inode.
    pub kind: u32,
}

/// Who asks: the caller's credentials, as FUSE passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// A time to set: a given one or the MDS's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetTime {
    Now,
    At(Time),
}

/// The attributes a `setattr` changes (`None`: unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

impl SetAttr {
    /// Applies the mode, owner and atime it sets to `i` (`SetTime::Now` as `now`); size and
    /// mtime are the caller's (they come with other rules).
    pub fn apply_attrs(&self, i: &mut Inode, now: Time) {
        if let Some(m) = self.mode {
            i.mode = (i.mode & S_IFMT) | (m & !S_IFMT);
        }
        i.uid = self.uid.unwrap_or(i.uid);
        i.gid = self.gid.unwrap_or(i.gid);
        if let Some(t) = self.atime {
            i.atime = t.at(now);
        }
    }
}

impl SetTime {
    /// The time it names (`Now` as `now`).
    pub fn at(self, now: Time) -> Time {
        match self {
            SetTime::Now => now,
            SetTime::At(t) => t,
        }
    }
}

/// `rename` flags (Linux's values).
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
/// `setxattr` flags (Linux's values).
pub const XATTR_CREATE: u32 = 1;
pub const XATTR_REPLACE: u32 = 2;

/// A namespace operation, as the client sends it and the core applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Lookup {
        parent: Ino,
        name: String,
    },
    GetAttr {
        ino: Ino,
    },
    SetAttr {
        ino: Ino,
        set: SetAttr,
    },
    /// Creates a regular file, device, fifo or socket (`mode` holds the type).
    Mknod {
        parent: Ino,
        name: String,
        mode: u32,
        rdev: u32,
        /// With `O_EXCL` semantics: fail with EEXIST if the name exists; otherwise an existing
        /// regular file is returned (open of `O_CREAT` without `O_EXCL`).
        exclusive: bool,
        /// Also opens the file for the client (a `create`: one request instead of a create
        /// and an [`Op::Open`]); `write` as for [`Op::Open`].
        #[serde(default)]
        open: bool,
        #[serde(default)]
        write: bool,
    },
    Mkdir {
        parent: Ino,
        name: String,
        mode: u32,
    },
    Symlink {
        parent: Ino,
        name: String,
        target: String,
    },
    Link {
        ino: Ino,
        parent: Ino,
        name: String,
    },
    Unlink {
        parent: Ino,
        name: String,
    },
    Rmdir {
        parent: Ino,
        name: String,
    },
    Rename {
        parent: Ino,
        name: String,
        new_parent: Ino,
        new_name: String,
        flags: u32,
    },
    /// Up to `max` entries after `after` (name order).
    ReadDir {
        ino: Ino,
        after: Option<String>,
        max: u32,
    },
    SetXattr {
        ino: Ino,
        name: String,
        value: Vec<u8>,
        flags: u32,
    },
    GetXattr {
        ino: Ino,
        name: String,
    },
    ListXattr {
        ino: Ino,
    },
    RemoveXattr {
        ino: Ino,
        name: String,
    },
    /// The client wrote up to `end` (exclusive) at `mtime`: the size grows to at least `end`.
    Written {
        ino: Ino,
        end: u64,
        mtime: Time,
        /// The writer holds the exclusive capability and asks to keep it (its lease is
        /// renewed); a flush answering a revoke asks nothing.
        #[serde(default)]
        renew: bool,
        /// The change time (default: `mtime`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ctime: Option<Time>,
        /// Mode, owner and atime set under the exclusive capability (size and mtime are
        /// refused here: they are `end` and `mtime`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        set: Option<SetAttr>,
    },
    // inline data
    /// [`Op::Written`] of a file the client created itself and whose writes it kept: `data`
    /// is the file's whole content so far (`end` may be past it: zeros), kept with the inode
    /// ([`Inode::inline`]). Only the exclusive holder sends it, and only for a file that has
    /// no data objects (an MDS that does not keep inline data refuses it: the client writes
    /// the data out and sends [`Op::Written`]).
    WrittenInline {
        ino: Ino,
        end: u64,
        mtime: Time,
        #[serde(default)]
        renew: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ctime: Option<Time>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        set: Option<SetAttr>,
        data: InlineData,
    },
    /// The data of an inline file ([`Reply::Inline`]; ENODATA: the file is not inline).
    ReadInline {
        ino: Ino,
    },
    /// Moves an inline file's data out to its first data object (the MDS writes it), before
    /// a client writes the file through its objects ([`Reply::Attr`]; a file that is not
    /// inline is answered as it is).
    Uninline {
        ino: Ino,
    },
    /// A client opened the file (it stays readable after its last unlink until closed).
    Open {
        ino: Ino,
        /// Opened for writing: the reply may grant the exclusive capability (write-back of
        /// size and mtime, see `caps.rs`).
        #[serde(default)]
        write: bool,
    },
    /// A client closed its last handle on the file.
    Close {
        ino: Ino,
    },
    /// A client (re)connected: these are the files it holds open (replaces what the MDS
    /// knew of it).
    Reconnect {
        opens: Vec<(Ino, u32)>,
    },
    /// `F_GETLK`: the lock that would block this one, if any.
    GetLk {
        ino: Ino,
        lock: crate::locks::Lock,
    },
    /// `F_SETLK` (and `flock`): take or release a lock; EAGAIN when another owner blocks it.
    SetLk {
        ino: Ino,
        lock: crate::locks::Lock,
    },
    /// The lock owner closed the file: release its locks on it.
    ReleaseLocks {
        ino: Ino,
        owner: u64,
    },
    // capabilities (caps): the revoke long-poll
    /// Acknowledges revokes (their kernel caches are dropped) and waits, up to
    /// [`CAP_POLL_WINDOW`], for the next ones ([`Reply::Revokes`]). A client keeps one
    /// outstanding; the MDS grants capabilities only to clients that do.
    CapPoll {
        ack: Vec<u64>,
    },
    // open/close (fswb): closes batched by the client
    /// The client closed its last handles on these files, each as an [`Op::Close`] (an
    /// inode named twice is closed twice). Clients send their closes a moment late, in
    /// batches, and reopen a file still registered without asking the MDS.
    CloseMany {
        inos: Vec<Ino>,
    },
    // early replies (unsafe until journaled)
    /// Answered once every change the MDS had applied when it arrived is in the journal in
    /// RADOS (what `fsync` and the client's periodic sync wait for).
    Sync,
    // creates without a round trip (delegated inode numbers)
    /// Hands the client a range of inode numbers ([`Reply::Inos`]) for the files it creates
    /// itself in a directory it holds exclusively, sending the creates behind
    /// ([`Envelope::delegated`]). The range is stored before the answer, so that an MDS that
    /// takes over still gives the creates those numbers.
    TakeInos,
}

impl Op {
    /// The directories whose entries the operation changes (a create, link, removal or
    /// rename), by the numbers the request names.
    pub fn changed_dirs(&self) -> Vec<Ino> {
        match self {
            Op::Mknod { parent, .. }
            | Op::Mkdir { parent, .. }
            | Op::Symlink { parent, .. }
            | Op::Link { parent, .. }
            | Op::Unlink { parent, .. }
            | Op::Rmdir { parent, .. } => vec![*parent],
            Op::Rename {
                parent, new_parent, ..
            } => vec![*parent, *new_parent],
            _ => Vec::new(),
        }
    }

    /// Whether the operation changes the namespace (and so is journaled).
    pub fn is_mutation(&self) -> bool {
        !matches!(
            self,
            Op::Lookup { .. }
                | Op::GetAttr { .. }
                | Op::ReadDir { .. }
                | Op::GetXattr { .. }
                | Op::ListXattr { .. }
                | Op::Open { .. }
                | Op::Close { .. }
                | Op::Reconnect { .. }
                | Op::GetLk { .. }
                | Op::SetLk { .. }
                | Op::ReleaseLocks { .. }
                | Op::CapPoll { .. }
                | Op::CloseMany { .. }
                | Op::Sync
                | Op::TakeInos
                | Op::ReadInline { .. }
        )
    }
}

impl Op {
    // full cluster: what goes on while the OSD map's full flag is set
    /// Whether the MDS performs this mutation while the cluster is full: the ones that free
    /// space or only record what is already written (unlink, rmdir, a truncate, dropping an
    /// extended attribute, the size of data already written). Everything else that changes
    /// the namespace gets ENOSPC. (Its journal and metadata objects are written past the full
    /// flag, up to the OSDs' failsafe ratio.)
    pub fn allowed_when_full(&self) -> bool {
        match self {
            Op::Unlink { .. }
            | Op::Rmdir { .. }
            | Op::RemoveXattr { .. }
            | Op::Written { .. }
            | Op::WrittenInline { .. } => true,
            Op::SetAttr { set, .. } => set.size.is_some(),
            op => !op.is_mutation(),
        }
    }
}

/// The answer to an [`Op`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The inode looked up, created or changed.
    Attr(Inode),
    Entries {
        entries: Vec<(String, Dentry)>,
        more: bool,
    },
    Xattr(Vec<u8>),
    XattrNames(Vec<String>),
    /// The blocking lock (`None`: the request would succeed).
    Lock(Option<crate::locks::Lock>),
    Ok,
    /// The operation failed with this errno.
    Err(i32),
    // capabilities (caps)
    /// Capabilities taken away from this client ([`Op::CapPoll`]).
    Revokes(Vec<CapRevoke>),
    // creates without a round trip (delegated inode numbers)
    /// The inode numbers `[start, end)`, this client's to give ([`Op::TakeInos`]).
    Inos {
        start: Ino,
        end: Ino,
    },
    /// An inline file's data ([`Op::ReadInline`]).
    Inline(InlineData),
}

// capabilities (caps)
/// Capability: cache the inode's attributes and (for a directory) its entries. Shared.
pub const CAP_SHARED: u8 = 1;
/// Capability: keep the file's pages cached across opens. Shared.
pub const CAP_READ: u8 = 2;
/// Capability: buffer writes / exclusive use; conflicts with every other client's caps.
pub const CAP_EXCL: u8 = 4;
/// How long a granted capability lasts (counted by the client from when it sent the
/// request that was answered with it).
pub const CAP_LEASE: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the MDS holds an [`Op::CapPoll`] with nothing to say before answering.
pub const CAP_POLL_WINDOW: std::time::Duration = std::time::Duration::from_secs(5);

/// A capability taken away: drop what is cached of `ino` (`caps`), and of the directory
/// entries `names` when `ino` is a directory whose entries changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapRevoke {
    pub id: u64,
    pub ino: Ino,
    pub caps: u8,
    #[serde(default)]
    pub names: Vec<String>,
}

/// What an MDS reply grants (carried in the response's data part, empty when nothing is
/// granted): `caps` per inode, for `lease_ms` from the request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapGrants {
    pub v: u16,
    pub lease_ms: u64,
    pub caps: Vec<(Ino, u8)>,
    /// Inodes this request changed: the requester drops its own cached copies of them.
    #[serde(default)]
    pub changed: Vec<Ino>,
    /// Those of them (besides the one the reply carries) as they are after the change: the
    /// requester caches them where it holds the shared capability (a create's directory, so
    /// that the kernel's next look at its attributes needs no request).
    #[serde(default)]
    pub updated: Vec<Inode>,
}

/// A request on the wire: version, who the client is, who asks, what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub v: u16,
    /// The client's id (random per mount), under which the MDS keeps its open files.
    pub client: u64,
    pub caller: Caller,
    pub op: Op,
    // completed requests (idempotent retries)
    /// This request's transaction id, kept when the client retries it (0: none; the request
    /// is then never answered from the completed-request table).
    #[serde(default)]
    pub tid: u64,
    /// The client's oldest request still unanswered: it never retries one below, so the MDS
    /// forgets their completions.
    #[serde(default)]
    pub oldest_tid: u64,
    // early replies (unsafe until journaled)
    /// A create sent again to an MDS that took over after an unsafe reply: the inode number
    /// that reply gave, which the new MDS reuses if it is one a lost journal entry held
    /// (`core::Namespace::new_inode`).
    #[serde(default)]
    pub ino_hint: Option<Ino>,
    // creates without a round trip (delegated inode numbers)
    /// A create the client answered itself: `ino_hint` is a number of a range the MDS
    /// delegated to it ([`Op::TakeInos`]), which the file must get (or the create is refused
    /// with ESTALE), never another.
    #[serde(default)]
    pub delegated: bool,
}

// completed requests (idempotent retries)
/// Which client request this is, for the completed-request table (`core/requests.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestId {
    pub client: u64,
    /// 0: not tracked.
    pub tid: u64,
    /// The client's oldest unanswered tid.
    pub oldest: u64,
    /// [`Envelope::ino_hint`].
    pub ino_hint: Option<Ino>,
    /// [`Envelope::delegated`].
    pub delegated: bool,
}

/// What a completed mutation answered, as the completed-request table keeps it: enough to
/// answer a retry again (an `Attr` reply is given with the inode's current attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Done {
    Ok,
    Attr(Ino),
}

impl Done {
    /// The record of a successful reply (`None`: a reply that is not recorded).
    pub fn of(reply: &Reply) -> Option<Done> {
        match reply {
            Reply::Ok => Some(Done::Ok),
            Reply::Attr(i) => Some(Done::Attr(i.ino)),
            _ => None,
        }
    }
}

/// An MDS push to a client: drop what is cached of these inodes / directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invalidate {
    pub v: u16,
    pub inodes: Vec<Ino>,
    /// (directory, name) entries that changed.
    pub entries: Vec<(Ino, String)>,
}

/// One change to the stored namespace; journal entries are lists of these. Each is
/// idempotent, so replaying a journal twice gives the same result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Update {
    PutInode(Inode),
    DelInode(Ino),
    PutDentry {
        dir: Ino,
        name: String,
        dentry: Dentry,
        /// The directory's fragment bits when the entry was written (older entries: 0).
        #[serde(default)]
        bits: u8,
    },
    DelDentry {
        dir: Ino,
        name: String,
        /// As [`Update::PutDentry::bits`].
        #[serde(default)]
        bits: u8,
    },
    /// A directory was removed: its (empty) entry object goes too.
    DelDir(Ino),
    NextIno(Ino),
    /// An inode whose last link went while it was open: purged once closed.
    AddStray(Ino),
    DelStray(Ino),
    // completed requests (idempotent retries); journal entries of version 2 on
    /// The client's request `tid` completed with `done` at `at`; the client's completions
    /// below `oldest` are forgotten. Journaled with the request's other updates.
    Request {
        client: u64,
        tid: u64,
        oldest: u64,
        done: Done,
        at: Time,
    },
    // directory fragments
    /// The directory's entries move from `2^from` fragment objects to `2^to` (a split or a
    /// merge, `core::frag`); journaled with the change that caused it, and applied to the
    /// stored objects at the next checkpoint or replay.
    Fragment {
        dir: Ino,
        from: u8,
        to: u8,
    },
    // locks across a restart
    /// The advisory locks held on `ino` after a change: (client, lock) (`locks.rs`).
    Locks {
        ino: Ino,
        held: Vec<(u64, crate::locks::Lock)>,
    },
    // inline data
    /// An inline file's data, whole ([`Inode::inline`]; key [`inode_key`] in its
    /// [`inline_shard_object`]).
    PutInline {
        ino: Ino,
        data: InlineData,
    },
    /// The file's inline data is gone (moved out, cut to nothing, or the file purged).
    DelInline(Ino),
}

/// Errno values used by the core (Linux's numbers; the protocol carries them as they are).
pub mod errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const EAGAIN: i32 = 11;
    pub const E2BIG: i32 = 7;
    pub const EEXIST: i32 = 17;
    pub const EXDEV: i32 = 18;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const ENOSPC: i32 = 28;
    pub const EMLINK: i32 = 31;
    pub const ERANGE: i32 = 34;
    pub const ENAMETOOLONG: i32 = 36;
    pub const ENOTEMPTY: i32 = 39;
    pub const ESTALE: i32 = 116;
    pub const ENODATA: i32 = 61;
    pub const EPROTO: i32 = 71;
    pub const EOPNOTSUPP: i32 = 95;
    pub const ESHUTDOWN: i32 = 108;
    pub const EDQUOT: i32 = 122;
}

/// The name of a file's data object `index` (CephFS's `<ino hex>.<index 8 hex>`).
pub fn data_object(ino: Ino, index: u64) -> String {
    format!("{ino:x}.{index:08x}")
}

/// The metadata-pool object holding an inode, in a file system made without the inode
/// table (`journal::StoredFormat::inode_table`).
pub fn inode_object(ino: Ino) -> String {
    format!("{ino:x}.inode")
}

/// Inode numbers per inode-table shard: numbers are given out in order, so the inodes
/// made together (an untar, a build) share a few shards, and a checkpoint writes them
/// back in one omap update per shard instead of one object write per inode.
pub const INODE_SHARD_BITS: u32 = 10;

/// The metadata-pool object whose omap holds inode `ino` (key [`inode_key`]), in a file
/// system made with the inode table.
pub fn inode_shard_object(ino: Ino) -> String {
    format!("mds.inodes.{:x}", ino >> INODE_SHARD_BITS)
}

/// An inode's omap key in its [`inode_shard_object`].
pub fn inode_key(ino: Ino) -> String {
    format!("{ino:x}")
}

/// The metadata-pool object whose omap holds a directory's entries.
pub fn dir_object(ino: Ino) -> String {
    format!("{ino:x}.dir")
}

/// A stored inode record.
#[derive(Debug, Serialize, Deserialize)]
pub struct StoredInode {
    pub v: u8,
    pub inode: Inode,
}

/// A stored directory entry (omap value).
#[derive(Debug, Serialize, Deserialize)]
pub struct StoredDentry {
    pub v: u8,
    pub dentry: Dentry,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As Linux: set-user-ID always goes, set-group-ID only with group execute; a directory
    /// keeps both; nothing to kill is `None`.
    #[test]
    fn killing_privileges_clears_setuid_and_an_executable_setgid() {
        assert_eq!(killed_mode(S_IFREG | 0o6755), Some(S_IFREG | 0o0755));
        assert_eq!(killed_mode(S_IFREG | 0o6745), Some(S_IFREG | 0o2745));
        assert_eq!(killed_mode(S_IFREG | 0o4700), Some(S_IFREG | 0o0700));
        assert_eq!(killed_mode(S_IFREG | 0o2745), None);
        assert_eq!(killed_mode(S_IFREG | 0o0777), None);
        assert_eq!(killed_mode(S_IFDIR | 0o6777), None);
        assert_eq!(killed_mode(S_IFLNK | 0o0777), None);
    }
}
