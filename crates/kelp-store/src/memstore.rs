//! An in-memory [`ObjectStore`]: the reference model of the interface's semantics and a fast
//! backend for tests of higher layers. Nothing is durable (every `Commit` is already resolved);
//! atomicity comes from an undo log: every object or collection is saved before its first
//! change and restored if a later operation of the transaction fails.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;

use crate::error::{Result, StoreError};
use crate::store::{ObjectStore, StoreSpace};
use crate::types::{
    CollectionId, Commit, ListPage, ObjectId, ObjectStat, OmapPage, Op, Transaction,
};

#[derive(Debug, Clone, Default)]
struct MemObject {
    data: Vec<u8>,
    xattrs: BTreeMap<String, Vec<u8>>,
    omap_header: Option<Vec<u8>>,
    omap: BTreeMap<Vec<u8>, Vec<u8>>,
}

type Coll = BTreeMap<ObjectId, MemObject>;

/// The in-memory store.
#[derive(Debug, Default)]
pub struct MemStore {
    colls: Mutex<BTreeMap<CollectionId, Coll>>,
    /// Bytes of object data it may hold (`None`: unbounded, reported as [`NOMINAL_CAPACITY`]).
    capacity: Option<u64>,
}

/// The capacity an unbounded `MemStore` reports.
pub const NOMINAL_CAPACITY: u64 = 1 << 40;

/// Object data bytes held (what counts against the capacity; attributes and omap are
/// metadata, as in `KelpStore`).
fn data_bytes(colls: &BTreeMap<CollectionId, Coll>) -> u64 {
    colls
        .values()
        .flat_map(|c| c.values())
        .map(|o| o.data.len() as u64)
        .sum()
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that refuses (`NoSpace`) transactions that would leave more than `bytes` of
    /// object data in it; transactions that do not grow the data still commit.
    pub fn with_capacity(bytes: u64) -> Self {
        MemStore {
            colls: Mutex::default(),
            capacity: Some(bytes),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&BTreeMap<CollectionId, Coll>) -> Result<T>) -> Result<T> {
        let guard = self.colls.lock().unwrap_or_else(|p| p.into_inner());
        f(&guard)
    }

    fn object<'a>(
        colls: &'a BTreeMap<CollectionId, Coll>,
        coll: CollectionId,
        oid: &ObjectId,
    ) -> Result<&'a MemObject> {
        colls
            .get(&coll)
            .ok_or(StoreError::CollectionNotFound { coll })?
            .get(oid)
            .ok_or_else(|| StoreError::ObjectNotFound {
                coll,
                object: oid.clone(),
            })
    }
}

/// What a transaction changed, so that a failed transaction can be rolled back: the original
/// value of every touched object and collection (`None`: did not exist).
#[derive(Default)]
struct Undo {
    objects: Vec<(CollectionId, ObjectId, Option<MemObject>)>,
    colls: Vec<(CollectionId, Option<Coll>)>,
}

impl Undo {
    fn rollback(self, colls: &mut BTreeMap<CollectionId, Coll>) {
        // Newest first, so the oldest saved value wins.
        for (c, o, before) in self.objects.into_iter().rev() {
            if let Some(coll) = colls.get_mut(&c) {
                match before {
                    Some(obj) => coll.insert(o, obj),
                    None => coll.remove(&o),
                };
            }
        }
        for (c, before) in self.colls.into_iter().rev() {
            match before {
                Some(coll) => colls.insert(c, coll),
                None => colls.remove(&c),
            };
        }
    }
}

struct Apply<'a> {
    colls: &'a mut BTreeMap<CollectionId, Coll>,
    undo: Undo,
}

impl Apply<'_> {
    fn coll_mut(&mut self, coll: CollectionId) -> Result<&mut Coll> {
        self.colls
            .get_mut(&coll)
            .ok_or(StoreError::CollectionNotFound { coll })
    }

    fn save_coll(&mut self, coll: CollectionId) {
        let before = self.colls.get(&coll).cloned();
        self.undo.colls.push((coll, before));
    }

    /// The object, saved for rollback; created if `create`.
    fn obj(&mut self, coll: CollectionId, oid: &ObjectId, create: bool) -> Result<&mut MemObject> {
        let c = self
            .colls
            .get_mut(&coll)
            .ok_or(StoreError::CollectionNotFound { coll })?;
        let before = c.get(oid).cloned();
        if before.is_none() && !create {
            return Err(StoreError::ObjectNotFound {
                coll,
                object: oid.clone(),
            });
        }
        self.undo.objects.push((coll, oid.clone(), before));
        Ok(c.entry(oid.clone()).or_default())
    }

    fn apply(&mut self, op: &Op) -> Result<()> {
        match op {
            Op::CreateCollection { coll } => {
                if self.colls.contains_key(coll) {
                    return Err(StoreError::CollectionExists { coll: *coll });
                }
                self.save_coll(*coll);
                self.colls.insert(*coll, Coll::new());
            }
            Op::RemoveCollection { coll } => {
                if !self.coll_mut(*coll)?.is_empty() {
                    return Err(StoreError::CollectionNotEmpty { coll: *coll });
                }
                self.save_coll(*coll);
                self.colls.remove(coll);
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
                self.coll_mut(*dest)?;
                self.coll_mut(*src)?;
                self.save_coll(*src);
                self.save_coll(*dest);
                let mask = crate::keys::split_mask(*bits);
                let source = self.coll_mut(*src)?;
                let moving: Vec<ObjectId> = source
                    .keys()
                    .filter(|o| o.hash & mask == *rem & mask)
                    .cloned()
                    .collect();
                let mut moved = Vec::new();
                for o in moving {
                    if let Some(obj) = source.remove(&o) {
                        moved.push((o, obj));
                    }
                }
                self.coll_mut(*dest)?.extend(moved);
            }
            Op::Touch { coll, oid } => {
                self.obj(*coll, oid, true)?;
            }
            Op::Write {
                coll,
                oid,
                offset,
                data,
            } => {
                let end = end_of(*offset, data.len() as u64)?;
                let obj = self.obj(*coll, oid, true)?;
                if !data.is_empty() {
                    if obj.data.len() < end {
                        obj.data.resize(end, 0);
                    }
                    obj.data[*offset as usize..end].copy_from_slice(data);
                }
            }
            Op::Zero {
                coll,
                oid,
                offset,
                len,
            } => {
                let end = end_of(*offset, *len)?;
                let obj = self.obj(*coll, oid, true)?;
                if *len > 0 {
                    if obj.data.len() < end {
                        obj.data.resize(end, 0);
                    }
                    obj.data[*offset as usize..end].fill(0);
                }
            }
            Op::Truncate { coll, oid, size } => {
                let size = end_of(*size, 0)?;
                self.obj(*coll, oid, true)?.data.resize(size, 0);
            }
            Op::Remove { coll, oid } => {
                self.obj(*coll, oid, false)?;
                self.coll_mut(*coll)?.remove(oid);
            }
            Op::SetXattrs { coll, oid, attrs } => {
                let obj = self.obj(*coll, oid, false)?;
                obj.xattrs
                    .extend(attrs.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            Op::RmXattr { coll, oid, name } => {
                self.obj(*coll, oid, false)?.xattrs.remove(name);
            }
            Op::OmapSet { coll, oid, entries } => {
                let obj = self.obj(*coll, oid, false)?;
                obj.omap
                    .extend(entries.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            Op::OmapRemove { coll, oid, keys } => {
                let obj = self.obj(*coll, oid, false)?;
                for k in keys {
                    obj.omap.remove(k);
                }
            }
            Op::OmapClear { coll, oid } => {
                let obj = self.obj(*coll, oid, false)?;
                obj.omap.clear();
                obj.omap_header = None;
            }
            Op::OmapSetHeader { coll, oid, header } => {
                self.obj(*coll, oid, false)?.omap_header = Some(header.clone());
            }
            Op::Clone { coll, src, dst } => {
                let copy = self.obj(*coll, src, false)?.clone();
                *self.obj(*coll, dst, true)? = copy;
            }
        }
        Ok(())
    }
}

fn end_of(offset: u64, len: u64) -> Result<usize> {
    offset
        .checked_add(len)
        .and_then(|e| usize::try_from(e).ok())
        .ok_or_else(|| StoreError::InvalidArgument {
            reason: format!("range {offset}+{len} overflows"),
        })
}

impl ObjectStore for MemStore {
    fn submit(&self, txn: Transaction) -> Result<Commit> {
        let mut colls = self.colls.lock().unwrap_or_else(|p| p.into_inner());
        let mut apply = Apply {
            colls: &mut colls,
            undo: Undo::default(),
        };
        let before = self.capacity.map(|_| data_bytes(apply.colls));
        for op in &txn.ops {
            if let Err(e) = apply.apply(op) {
                let undo = std::mem::take(&mut apply.undo);
                undo.rollback(apply.colls);
                return Err(e);
            }
        }
        if let (Some(cap), Some(before)) = (self.capacity, before) {
            let after = data_bytes(apply.colls);
            if after > cap && after > before {
                let undo = std::mem::take(&mut apply.undo);
                undo.rollback(apply.colls);
                return Err(StoreError::NoSpace {
                    needed: after - before,
                    free: cap.saturating_sub(before),
                });
            }
        }
        Ok(Commit::done())
    }

    fn space(&self) -> Result<StoreSpace> {
        let total = self.capacity.unwrap_or(NOMINAL_CAPACITY);
        let used = self.with(|c| Ok(data_bytes(c)))?.min(total);
        Ok(StoreSpace {
            total,
            used,
            available: total - used,
        })
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn list_collections(&self) -> Result<Vec<CollectionId>> {
        self.with(|c| Ok(c.keys().copied().collect()))
    }

    fn collection_exists(&self, coll: CollectionId) -> Result<bool> {
        self.with(|c| Ok(c.contains_key(&coll)))
    }

    fn list_objects(
        &self,
        coll: CollectionId,
        start: Option<&ObjectId>,
        max: usize,
    ) -> Result<ListPage> {
        self.with(|c| {
            let c = c
                .get(&coll)
                .ok_or(StoreError::CollectionNotFound { coll })?;
            let lower = match start {
                Some(s) => Bound::Included(s.clone()),
                None => Bound::Unbounded,
            };
            let mut it = c.range((lower, Bound::Unbounded)).map(|(k, _)| k.clone());
            let objects: Vec<ObjectId> = it.by_ref().take(max).collect();
            Ok(ListPage {
                objects,
                next: it.next(),
            })
        })
    }

    fn stat(&self, coll: CollectionId, oid: &ObjectId) -> Result<ObjectStat> {
        self.with(|c| {
            Ok(ObjectStat {
                size: Self::object(c, coll, oid)?.data.len() as u64,
            })
        })
    }

    fn read(&self, coll: CollectionId, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.with(|c| {
            let data = &Self::object(c, coll, oid)?.data;
            let start = (offset.min(data.len() as u64)) as usize;
            let end = (offset.saturating_add(len).min(data.len() as u64)) as usize;
            Ok(data[start..end].to_vec())
        })
    }

    fn xattrs(&self, coll: CollectionId, oid: &ObjectId) -> Result<BTreeMap<String, Vec<u8>>> {
        self.with(|c| Ok(Self::object(c, coll, oid)?.xattrs.clone()))
    }

    fn omap_header(&self, coll: CollectionId, oid: &ObjectId) -> Result<Option<Vec<u8>>> {
        self.with(|c| Ok(Self::object(c, coll, oid)?.omap_header.clone()))
    }

    fn omap_get(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
        keys: &[Vec<u8>],
    ) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
        self.with(|c| {
            let o = Self::object(c, coll, oid)?;
            Ok(keys
                .iter()
                .filter_map(|k| o.omap.get(k).map(|v| (k.clone(), v.clone())))
                .collect())
        })
    }

    fn omap_iter(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<OmapPage> {
        self.with(|c| {
            let o = Self::object(c, coll, oid)?;
            let lower = match after {
                Some(a) => Bound::Excluded(a.to_vec()),
                None => Bound::Unbounded,
            };
            let mut it = o
                .omap
                .range::<Vec<u8>, _>((lower, Bound::Unbounded))
                .map(|(k, v)| (k.clone(), v.clone()));
            let entries: Vec<_> = it.by_ref().take(max).collect();
            Ok(OmapPage {
                entries,
                more: it.next().is_some(),
            })
        })
    }
}
