//! `IoCtx`: object operations within one pool (and namespace).

use bytes::Bytes;
use kelp_proto::{ListCursor, ObjectLocator, OpKind, OpResult};
use kelp_types::PgId;

use crate::error::ClientError;
use crate::ops::{ReadOp, ReadResult, WriteOp, split_results};
use crate::rados::Rados;

/// An object's size, modification time and version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectStat {
    pub size: u64,
    pub mtime_ns: u64,
    pub version: u64,
}

/// Object operations in one pool.
#[derive(Clone)]
pub struct IoCtx {
    rados: Rados,
    pool: u32,
    pool_name: String,
    namespace: String,
    /// The snapshot context writes carry (`seq`, ids newest first); `(0, [])`: none.
    snapc: (u64, Vec<u64>),
    /// Reads see the objects as they were at this snapshot; writes are refused.
    read_snap: Option<u64>,
    /// Writes may go past the full flag, up to the OSDs' failsafe ratio (`set_full_try`).
    full_try: bool,
}

/// An object's snapshots, as `rados listsnaps` shows them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SnapSet {
    /// The newest snapshot context `seq` the object was written under.
    pub seq: u64,
    /// The head's size; `None` if the head does not exist (removed, its snapshots kept).
    pub head_size: Option<u64>,
    /// Clones, oldest first.
    pub clones: Vec<CloneInfo>,
}

/// One clone of an object: the snapshots it serves (newest first) and its size.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CloneInfo {
    pub id: u64,
    pub snaps: Vec<u64>,
    pub size: u64,
}

impl IoCtx {
    pub(crate) fn new(rados: Rados, pool: u32, pool_name: &str) -> IoCtx {
        IoCtx {
            rados,
            pool,
            pool_name: pool_name.to_string(),
            namespace: String::new(),
            snapc: (0, Vec::new()),
            read_snap: None,
            full_try: false,
        }
    }

    /// Writes through this context from now on may go past the cluster's full flag and the
    /// OSDs' full ratio, up to their failsafe ratio (Ceph's `FULL_TRY`, librados's
    /// `set_pool_full_try`). For the few writers that must work on a full cluster so that
    /// space can be freed (the file system's metadata server: its journal and the removal of
    /// deleted files' data); everything else keeps getting `Full`.
    pub fn set_full_try(&mut self, on: bool) {
        self.full_try = on;
    }

    /// Whether writes may go past the full flag ([`IoCtx::set_full_try`]).
    pub fn full_try(&self) -> bool {
        self.full_try
    }

    /// Writes from now on carry this snapshot context: `seq` is the newest snapshot id the
    /// writer knows, `snaps` the existing snapshot ids, newest first (all at most `seq`). The
    /// first write to an object after a new snapshot keeps its old state as a clone.
    pub fn set_snap_context(&mut self, seq: u64, snaps: Vec<u64>) -> Result<(), ClientError> {
        if !snaps.windows(2).all(|w| w[0] > w[1]) {
            return Err(ClientError::Invalid(format!(
                "snapshot ids must be strictly descending: {snaps:?}"
            )));
        }
        if let Some(&newest) = snaps.first()
            && newest > seq
        {
            return Err(ClientError::Invalid(format!(
                "snapshot id {newest} is above the context's seq {seq}"
            )));
        }
        self.snapc = (seq, snaps);
        Ok(())
    }

    /// The snapshot context writes carry: `(seq, snaps)`.
    pub fn snap_context(&self) -> (u64, Vec<u64>) {
        self.snapc.clone()
    }

    /// Reads (data, stat, xattrs, omap) see objects as they were at snapshot `snap`
    /// (`NotFound` if an object did not exist then); `None`: the live objects. Writes through
    /// an `IoCtx` with a read snapshot are refused (`ClientError::Invalid`).
    pub fn set_read_snap(&mut self, snap: Option<u64>) {
        self.read_snap = snap;
    }

    /// The read snapshot, if set.
    pub fn read_snap(&self) -> Option<u64> {
        self.read_snap
    }

    /// Sends `ops` on object `name` with this context's snapshot settings: a write gets the
    /// snapshot context first (if one is set), a read the read snapshot.
    async fn submit(
        &self,
        name: &str,
        mut ops: Vec<OpKind>,
        data: Bytes,
    ) -> Result<(kelp_proto::OsdOpReply, Bytes), ClientError> {
        let writes = ops.iter().any(OpKind::is_write);
        if writes {
            if let Some(snap) = self.read_snap {
                return Err(ClientError::Invalid(format!(
                    "writes are refused through an I/O context reading snapshot {snap}"
                )));
            }
            if self.snapc.0 > 0 {
                ops.insert(
                    0,
                    OpKind::SnapContext {
                        seq: self.snapc.0,
                        snaps: self.snapc.1.clone(),
                    },
                );
            }
            if self.full_try {
                ops.push(OpKind::FullTry);
            }
        } else if let Some(snap) = self.read_snap {
            ops.insert(0, OpKind::ReadAtSnap { snap });
        }
        self.rados.submit(&self.loc(name), ops, data).await
    }

    /// The object's snapshots: its clones and the snapshots each serves (`rados listsnaps`).
    pub async fn list_snaps(&self, name: &str) -> Result<SnapSet, ClientError> {
        let (_, data) = self
            .rados
            .submit(&self.loc(name), vec![OpKind::ListSnaps], Bytes::new())
            .await?;
        let info: kelp_proto::SnapSetInfo = kelp_proto::decode(&data, "snapset")?;
        Ok(SnapSet {
            seq: info.seq,
            head_size: info.head_size,
            clones: info
                .clones
                .into_iter()
                .map(|(id, snaps, size)| CloneInfo { id, snaps, size })
                .collect(),
        })
    }

    /// Makes object `name` what it was at snapshot `snap` (data, xattrs, omap), or removes it
    /// if it did not exist then. A write under this context's snapshot context (it may keep
    /// the current state as a clone first).
    pub async fn rollback(&self, name: &str, snap: u64) -> Result<(), ClientError> {
        self.submit(name, vec![OpKind::Rollback { snap }], Bytes::new())
            .await
            .map(drop)
    }

    pub fn pool_id(&self) -> u32 {
        self.pool
    }

    pub fn pool_name(&self) -> &str {
        &self.pool_name
    }

    /// Operates within `namespace` from now on (empty: the default namespace).
    pub fn set_namespace(&mut self, namespace: &str) {
        self.namespace = namespace.to_string();
    }

    /// The cluster handle this context belongs to.
    pub fn rados(&self) -> &Rados {
        &self.rados
    }

    pub(crate) fn loc(&self, name: &str) -> ObjectLocator {
        ObjectLocator {
            pool: self.pool,
            namespace: self.namespace.clone(),
            key: None,
            name: name.to_string(),
        }
    }

    /// Runs a compound write; returns the object's new version (0 if it was removed).
    pub async fn operate(&self, op: WriteOp, name: &str) -> Result<u64, ClientError> {
        let (reply, _) = self.submit(name, op.ops, op.data.freeze()).await?;
        Ok(reply.version)
    }

    /// Runs a compound read; one result per step.
    pub async fn operate_read(
        &self,
        op: ReadOp,
        name: &str,
    ) -> Result<Vec<ReadResult>, ClientError> {
        let (reply, data) = self.submit(name, op.ops, op.data.freeze()).await?;
        split_results(reply.outs, data)
    }

    /// Replaces the object's data (creating it).
    pub async fn write_full(&self, name: &str, data: impl Into<Bytes>) -> Result<u64, ClientError> {
        let data = data.into();
        let ops = vec![OpKind::WriteFull {
            len: data.len() as u64,
        }];
        Ok(self.submit(name, ops, data).await?.0.version)
    }

    /// Writes at `offset` (creating the object, extending it).
    pub async fn write(
        &self,
        name: &str,
        offset: u64,
        data: impl Into<Bytes>,
    ) -> Result<u64, ClientError> {
        let data = data.into();
        let ops = vec![OpKind::Write {
            offset,
            len: data.len() as u64,
        }];
        Ok(self.submit(name, ops, data).await?.0.version)
    }

    pub async fn append(&self, name: &str, data: impl Into<Bytes>) -> Result<u64, ClientError> {
        let data = data.into();
        let ops = vec![OpKind::Append {
            len: data.len() as u64,
        }];
        Ok(self.submit(name, ops, data).await?.0.version)
    }

    /// Reads `len` bytes at `offset` (`len == 0`: to the end). Short past the end.
    pub async fn read(&self, name: &str, offset: u64, len: u64) -> Result<Bytes, ClientError> {
        let (_, data) = self
            .submit(name, vec![OpKind::Read { offset, len }], Bytes::new())
            .await?;
        Ok(data)
    }

    pub async fn stat(&self, name: &str) -> Result<ObjectStat, ClientError> {
        let (reply, _) = self.submit(name, vec![OpKind::Stat], Bytes::new()).await?;
        match reply.outs.first() {
            Some(OpResult::Stat {
                size,
                mtime_ns,
                version,
            }) => Ok(ObjectStat {
                size: *size,
                mtime_ns: *mtime_ns,
                version: *version,
            }),
            other => Err(ClientError::Invalid(format!("stat returned {other:?}"))),
        }
    }

    pub async fn remove(&self, name: &str) -> Result<(), ClientError> {
        self.submit(name, vec![OpKind::Remove], Bytes::new())
            .await?;
        Ok(())
    }

    pub async fn truncate(&self, name: &str, size: u64) -> Result<(), ClientError> {
        self.operate(WriteOp::new().truncate(size), name)
            .await
            .map(drop)
    }

    pub async fn set_xattr(
        &self,
        name: &str,
        key: &str,
        value: impl AsRef<[u8]>,
    ) -> Result<(), ClientError> {
        self.operate(WriteOp::new().set_xattr(key, value), name)
            .await
            .map(drop)
    }

    pub async fn rm_xattr(&self, name: &str, key: &str) -> Result<(), ClientError> {
        self.operate(WriteOp::new().rm_xattr(key), name)
            .await
            .map(drop)
    }

    pub async fn get_xattr(&self, name: &str, key: &str) -> Result<Bytes, ClientError> {
        match self
            .operate_read(ReadOp::new().get_xattr(key), name)
            .await?
            .pop()
        {
            Some(ReadResult::Data(v)) => Ok(v),
            other => Err(ClientError::Invalid(format!("getxattr returned {other:?}"))),
        }
    }

    pub async fn get_xattrs(&self, name: &str) -> Result<Vec<(String, Bytes)>, ClientError> {
        match self
            .operate_read(ReadOp::new().get_xattrs(), name)
            .await?
            .pop()
        {
            Some(ReadResult::Pairs { entries, .. }) => Ok(entries),
            other => Err(ClientError::Invalid(format!(
                "getxattrs returned {other:?}"
            ))),
        }
    }

    pub async fn omap_set<K: AsRef<str>, V: AsRef<[u8]>>(
        &self,
        name: &str,
        entries: &[(K, V)],
    ) -> Result<(), ClientError> {
        self.operate(WriteOp::new().omap_set(entries), name)
            .await
            .map(drop)
    }

    pub async fn omap_rm_keys<K: AsRef<str>>(
        &self,
        name: &str,
        keys: &[K],
    ) -> Result<(), ClientError> {
        self.operate(WriteOp::new().omap_rm_keys(keys), name)
            .await
            .map(drop)
    }

    /// Up to `max` omap entries after `start_after` whose keys start with `prefix`, and
    /// whether more follow.
    pub async fn omap_get_vals(
        &self,
        name: &str,
        start_after: &str,
        prefix: &str,
        max: u32,
    ) -> Result<(Vec<(String, Bytes)>, bool), ClientError> {
        match self
            .operate_read(ReadOp::new().omap_get_vals(start_after, prefix, max), name)
            .await?
            .pop()
        {
            Some(ReadResult::Pairs { entries, more }) => Ok((entries, more)),
            other => Err(ClientError::Invalid(format!(
                "omap listing returned {other:?}"
            ))),
        }
    }

    /// Every object name in the pool (and this namespace), PG by PG.
    pub async fn list_objects(&self) -> Result<Vec<String>, ClientError> {
        let map = self.rados.osd_map();
        let pool = map
            .pools
            .get(&self.pool)
            .ok_or_else(|| ClientError::NoSuchPool(self.pool_name.clone()))?;
        let mut names = Vec::new();
        for seed in 0..pool.pg_num {
            let pg = PgId::new(self.pool, seed);
            let mut cursor: Option<ListCursor> = None;
            loop {
                let page = self.rados.list_pg(pg, cursor.take(), 1000).await?;
                names.extend(
                    page.objects
                        .into_iter()
                        .filter(|(ns, _)| *ns == self.namespace)
                        .map(|(_, n)| n),
                );
                match page.next {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
        }
        Ok(names)
    }
}
