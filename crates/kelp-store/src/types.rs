//! Names and transactions: the vocabulary shared by every [`crate::ObjectStore`].
//!
//! Invariants kept here:
//! - [`ObjectId`]'s derived `Ord` (placement hash, pool, namespace, name, snapshot) is *the*
//!   order in which a collection is listed; the on-disk key encoding (`crate::keys`) preserves
//!   it byte for byte, so backfill and scrub can walk a PG in hash order and resume from any
//!   position.
//! - A [`Transaction`] is a list of operations applied all-or-nothing, in order.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use kelp_types::{PgId, PoolId};
use tokio::sync::oneshot;

use crate::error::StoreError;

/// A collection holds the objects of one placement group on this OSD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CollectionId(pub PgId);

impl CollectionId {
    pub fn new(pool: u32, seed: u32) -> Self {
        CollectionId(PgId::new(pool, seed))
    }
}

impl fmt::Display for CollectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_head", self.0)
    }
}

/// Snapshot id of the live ("head") version of an object, as Ceph's `CEPH_NOSNAP`.
pub const SNAP_HEAD: u64 = u64::MAX - 1;

/// An object name. The field order is the sort order: objects are ordered by their placement
/// `hash` first (the 32-bit hash the OSD computes from the name; CRUSH maps it to a PG), so a
/// split by hash bits and a walk in hash order are both cheap.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    pub hash: u32,
    pub pool: PoolId,
    pub namespace: String,
    pub name: String,
    /// [`SNAP_HEAD`] for the live object, otherwise the snapshot id of a clone.
    pub snap: u64,
}

impl ObjectId {
    /// The head version of `name` in `pool`/`namespace` with placement hash `hash`.
    pub fn new(pool: u32, namespace: &str, name: &str, hash: u32) -> Self {
        ObjectId {
            hash,
            pool: PoolId(pool),
            namespace: namespace.to_string(),
            name: name.to_string(),
            snap: SNAP_HEAD,
        }
    }

    /// Same object, snapshot `snap`.
    pub fn with_snap(mut self, snap: u64) -> Self {
        self.snap = snap;
        self
    }

    /// The smallest possible id with this hash: a listing position "start of hash `hash`".
    pub fn hash_start(hash: u32) -> Self {
        ObjectId {
            hash,
            pool: PoolId(0),
            namespace: String::new(),
            name: String::new(),
            snap: 0,
        }
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{:08x}:", self.pool, self.hash)?;
        if !self.namespace.is_empty() {
            write!(f, "{}/", self.namespace)?;
        }
        write!(f, "{}", self.name)?;
        if self.snap == SNAP_HEAD {
            write!(f, "@head")
        } else {
            write!(f, "@{}", self.snap)
        }
    }
}

/// One operation inside a [`Transaction`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create an empty collection; fails if it exists.
    CreateCollection { coll: CollectionId },
    /// Remove an empty collection; fails if it has objects.
    RemoveCollection { coll: CollectionId },
    /// Move every object of `src` whose `hash & ((1 << bits) - 1) == rem` into `dest` (which must
    /// exist). This is how a PG splits when `pg_num` grows.
    SplitCollection {
        src: CollectionId,
        dest: CollectionId,
        bits: u8,
        rem: u32,
    },
    /// Create the object if missing; no-op otherwise.
    Touch { coll: CollectionId, oid: ObjectId },
    /// Write `data` at `offset` (creating the object, extending its size). `Bytes`, so that a
    /// payload received from the network reaches the store without a copy.
    Write {
        coll: CollectionId,
        oid: ObjectId,
        offset: u64,
        data: Bytes,
    },
    /// Make `[offset, offset + len)` read as zeros (creating the object, extending its size).
    Zero {
        coll: CollectionId,
        oid: ObjectId,
        offset: u64,
        len: u64,
    },
    /// Set the size, dropping data beyond it or extending with zeros (creating the object).
    Truncate {
        coll: CollectionId,
        oid: ObjectId,
        size: u64,
    },
    /// Remove the object with its data, xattrs and omap; fails if missing.
    Remove { coll: CollectionId, oid: ObjectId },
    /// Set extended attributes; the object must exist.
    SetXattrs {
        coll: CollectionId,
        oid: ObjectId,
        attrs: BTreeMap<String, Vec<u8>>,
    },
    /// Remove one extended attribute (absent is fine); the object must exist.
    RmXattr {
        coll: CollectionId,
        oid: ObjectId,
        name: String,
    },
    /// Set omap entries; the object must exist.
    OmapSet {
        coll: CollectionId,
        oid: ObjectId,
        entries: BTreeMap<Vec<u8>, Vec<u8>>,
    },
    /// Remove omap keys (absent keys are fine); the object must exist.
    OmapRemove {
        coll: CollectionId,
        oid: ObjectId,
        keys: Vec<Vec<u8>>,
    },
    /// Remove all omap entries and the omap header; the object must exist.
    OmapClear { coll: CollectionId, oid: ObjectId },
    /// Set the omap header; the object must exist.
    OmapSetHeader {
        coll: CollectionId,
        oid: ObjectId,
        header: Vec<u8>,
    },
    /// Make `dst` a full copy of `src` (data, xattrs, omap), replacing `dst` if it exists.
    Clone {
        coll: CollectionId,
        src: ObjectId,
        dst: ObjectId,
    },
}

/// An ordered list of operations applied atomically.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transaction {
    pub ops: Vec<Op>,
}

impl Transaction {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    pub fn push(&mut self, op: Op) -> &mut Self {
        self.ops.push(op);
        self
    }
    pub fn create_collection(&mut self, coll: CollectionId) -> &mut Self {
        self.push(Op::CreateCollection { coll })
    }
    pub fn remove_collection(&mut self, coll: CollectionId) -> &mut Self {
        self.push(Op::RemoveCollection { coll })
    }
    pub fn split_collection(
        &mut self,
        src: CollectionId,
        dest: CollectionId,
        bits: u8,
        rem: u32,
    ) -> &mut Self {
        self.push(Op::SplitCollection {
            src,
            dest,
            bits,
            rem,
        })
    }
    pub fn touch(&mut self, coll: CollectionId, oid: &ObjectId) -> &mut Self {
        self.push(Op::Touch {
            coll,
            oid: oid.clone(),
        })
    }
    pub fn write(
        &mut self,
        coll: CollectionId,
        oid: &ObjectId,
        offset: u64,
        data: impl Into<Bytes>,
    ) -> &mut Self {
        self.push(Op::Write {
            coll,
            oid: oid.clone(),
            offset,
            data: data.into(),
        })
    }
    pub fn zero(&mut self, coll: CollectionId, oid: &ObjectId, offset: u64, len: u64) -> &mut Self {
        self.push(Op::Zero {
            coll,
            oid: oid.clone(),
            offset,
            len,
        })
    }
    pub fn truncate(&mut self, coll: CollectionId, oid: &ObjectId, size: u64) -> &mut Self {
        self.push(Op::Truncate {
            coll,
            oid: oid.clone(),
            size,
        })
    }
    pub fn remove(&mut self, coll: CollectionId, oid: &ObjectId) -> &mut Self {
        self.push(Op::Remove {
            coll,
            oid: oid.clone(),
        })
    }
    pub fn set_xattr(
        &mut self,
        coll: CollectionId,
        oid: &ObjectId,
        name: &str,
        value: Vec<u8>,
    ) -> &mut Self {
        self.push(Op::SetXattrs {
            coll,
            oid: oid.clone(),
            attrs: BTreeMap::from([(name.to_string(), value)]),
        })
    }
    pub fn rm_xattr(&mut self, coll: CollectionId, oid: &ObjectId, name: &str) -> &mut Self {
        self.push(Op::RmXattr {
            coll,
            oid: oid.clone(),
            name: name.to_string(),
        })
    }
    pub fn omap_set(
        &mut self,
        coll: CollectionId,
        oid: &ObjectId,
        entries: BTreeMap<Vec<u8>, Vec<u8>>,
    ) -> &mut Self {
        self.push(Op::OmapSet {
            coll,
            oid: oid.clone(),
            entries,
        })
    }
    pub fn omap_remove(
        &mut self,
        coll: CollectionId,
        oid: &ObjectId,
        keys: Vec<Vec<u8>>,
    ) -> &mut Self {
        self.push(Op::OmapRemove {
            coll,
            oid: oid.clone(),
            keys,
        })
    }
    pub fn omap_clear(&mut self, coll: CollectionId, oid: &ObjectId) -> &mut Self {
        self.push(Op::OmapClear {
            coll,
            oid: oid.clone(),
        })
    }
    pub fn omap_set_header(
        &mut self,
        coll: CollectionId,
        oid: &ObjectId,
        header: Vec<u8>,
    ) -> &mut Self {
        self.push(Op::OmapSetHeader {
            coll,
            oid: oid.clone(),
            header,
        })
    }
    pub fn clone_object(
        &mut self,
        coll: CollectionId,
        src: &ObjectId,
        dst: &ObjectId,
    ) -> &mut Self {
        self.push(Op::Clone {
            coll,
            src: src.clone(),
            dst: dst.clone(),
        })
    }
}

/// Size and identity of a stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStat {
    pub size: u64,
}

/// One page of a collection listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// Objects in [`ObjectId`] order, starting at the requested position (inclusive).
    pub objects: Vec<ObjectId>,
    /// Where the next page starts, or `None` when the listing is complete.
    pub next: Option<ObjectId>,
}

/// One page of an object's omap, in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OmapPage {
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
    /// True when more entries follow the last one returned.
    pub more: bool,
}

/// Resolves once a submitted transaction is durable (or the store failed to make it so).
///
/// Also usable from synchronous code with [`Commit::wait`].
#[must_use = "a transaction is only durable once its Commit resolves"]
pub struct Commit {
    inner: CommitInner,
}

enum CommitInner {
    Done(Option<Result<(), StoreError>>),
    Pending(oneshot::Receiver<Result<(), StoreError>>),
}

impl Commit {
    /// An already-durable commit (the in-memory store).
    pub fn done() -> Self {
        Commit {
            inner: CommitInner::Done(Some(Ok(()))),
        }
    }

    pub(crate) fn pending() -> (oneshot::Sender<Result<(), StoreError>>, Self) {
        let (tx, rx) = oneshot::channel();
        (
            tx,
            Commit {
                inner: CommitInner::Pending(rx),
            },
        )
    }

    /// Blocks the calling thread until durable. Must not be called from an async task.
    pub fn wait(self) -> Result<(), StoreError> {
        match self.inner {
            CommitInner::Done(r) => r.unwrap_or(Ok(())),
            CommitInner::Pending(rx) => rx.blocking_recv().unwrap_or_else(|_| {
                Err(StoreError::Failed {
                    reason: "store shut down before the transaction committed".into(),
                })
            }),
        }
    }
}

impl Future for Commit {
    type Output = Result<(), StoreError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().inner {
            CommitInner::Done(r) => Poll::Ready(r.take().unwrap_or(Ok(()))),
            CommitInner::Pending(rx) => Pin::new(rx).poll(cx).map(|r| {
                r.unwrap_or_else(|_| {
                    Err(StoreError::Failed {
                        reason: "store shut down before the transaction committed".into(),
                    })
                })
            }),
        }
    }
}
