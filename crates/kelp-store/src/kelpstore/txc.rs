//! Preparing a transaction: its staged metadata, the space it allocates and frees, copy-on-write
//! and deferred writes (`Txc`). Serialised by the apply lock; nothing here waits for the device
//! except reads of current content and, on a growing data file, room below the frontier.

use super::*;

/// A transaction being prepared: its staged metadata and space changes. Dropped without
/// effect (allocations returned) if any operation fails.
pub(super) struct Txc<'a> {
    pub(super) inner: &'a Inner,
    pub(super) staged: BTreeMap<Vec<u8>, Option<Value>>,
    pub(super) allocated: Vec<(u64, u64)>,
    pub(super) freed: Vec<(u64, u64)>,
    pub(super) deferred: BTreeMap<u64, Arc<Vec<u8>>>,
    pub(super) cow: Vec<CowWrite>,
    /// The new extents of `cow` with their checksums (logged for verification at replay).
    pub(super) new_runs: Vec<NewRun>,
    /// Aligned copy and checksums of the operation being applied, if made before the lock.
    pub(super) pre: Option<PreCopied>,
    pub(super) next_nid: u64,
    pub(super) nid_used: bool,
    /// nids from this one on were allocated by this transaction (no stored record).
    pub(super) first_new_nid: u64,
    /// Each existing object's record as it was before this transaction (the first time the
    /// transaction loaded it), by nid: which checksum shard records are stored for it.
    pub(super) before: HashMap<u64, Arc<Onode>>,
    /// The records this transaction wrote (last save of each key), for the onode cache.
    pub(super) saved: HashMap<Vec<u8>, Arc<Onode>>,
    /// Change of the store's inline data bytes made by this transaction.
    pub(super) inline_delta: i64,
    pub(super) bytes: u64,
}

impl<'a> Txc<'a> {
    /// An empty transaction whose new objects get nids from `next_nid` on.
    pub(super) fn new(inner: &'a Inner, next_nid: u64) -> Self {
        Txc {
            inner,
            staged: BTreeMap::new(),
            allocated: Vec::new(),
            freed: Vec::new(),
            deferred: BTreeMap::new(),
            cow: Vec::new(),
            new_runs: Vec::new(),
            pre: None,
            next_nid,
            nid_used: false,
            first_new_nid: next_nid,
            before: HashMap::new(),
            saved: HashMap::new(),
            inline_delta: 0,
            bytes: 0,
        }
    }

    pub(super) fn get(&self, key: &[u8]) -> Result<Option<Value>> {
        match self.staged.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.inner.get(key),
        }
    }

    pub(super) fn put(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.bytes += (key.len() + value.as_ref().map_or(0, |v| v.len())) as u64;
        if key.first() == Some(&keys::OBJ) {
            self.saved.remove(&key);
        }
        self.staged.insert(key, value.map(Value::from));
    }

    pub(super) fn require_coll(&self, coll: CollectionId) -> Result<()> {
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
    pub(super) fn onode(&mut self, coll: CollectionId, oid: &ObjectId) -> Result<Option<Onode>> {
        let found = self.load_onode(coll, oid)?;
        if let Some((on, shared)) = &found
            && on.nid < self.first_new_nid
            && !self.before.contains_key(&on.nid)
        {
            let prior = shared.clone().unwrap_or_else(|| Arc::new(on.clone()));
            self.before.insert(on.nid, prior);
        }
        Ok(found.map(|(on, _)| on))
    }

    /// Decode a record as this transaction sees it: checksum shards through the same layers.
    fn decode(&self, raw: &[u8]) -> Result<Onode> {
        Onode::decode_with(raw, self.inner.geo.bpu, |nid, i| {
            self.get(&keys::csum_shard_key(nid, i))
        })
    }

    /// The record, and the cache's shared copy of it if it came from there.
    fn load_onode(
        &self,
        coll: CollectionId,
        oid: &ObjectId,
    ) -> Result<Option<(Onode, Option<Arc<Onode>>)>> {
        let key = keys::obj_key(coll, oid);
        // Saved by this transaction: its decoded copy (decoding the staged record would fetch
        // the shards it did not change from the database).
        if let Some(on) = self.saved.get(&key) {
            return Ok(Some((on.as_ref().clone(), Some(on.clone()))));
        }
        let raw = match self.staged.get(&key) {
            Some(v) => v.clone(),
            None => match self.inner.onode_cache.get(&key) {
                // The cache holds only the newest published record: publishing invalidates it,
                // and readers fill it (holding `reuse` shared) only from the database when the
                // overlay has nothing newer.
                Some(Some(on)) => return Ok(Some((on.as_ref().clone(), Some(on)))),
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
                                    let on = self.decode(b)?;
                                    let shared = Arc::new(on.clone());
                                    self.inner.onode_cache.insert(key, Some(shared.clone()));
                                    return Ok(Some((on, Some(shared))));
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
            Some(v) => Ok(Some((self.decode(&v)?, None))),
            None => {
                self.require_coll(coll)?;
                Ok(None)
            }
        }
    }

    pub(super) fn existing(&mut self, coll: CollectionId, oid: &ObjectId) -> Result<Onode> {
        self.onode(coll, oid)?
            .ok_or_else(|| StoreError::ObjectNotFound {
                coll,
                object: oid.clone(),
            })
    }

    pub(super) fn new_onode(&mut self) -> Onode {
        let nid = self.next_nid;
        self.next_nid += 1;
        self.nid_used = true;
        Onode {
            nid,
            ..Onode::default()
        }
    }

    pub(super) fn onode_or_new(&mut self, coll: CollectionId, oid: &ObjectId) -> Result<Onode> {
        match self.onode(coll, oid)? {
            Some(o) => Ok(o),
            None => Ok(self.new_onode()),
        }
    }

    /// Stage `on` as the object's record (and keep it, decoded, for the onode cache).
    pub(super) fn save(&mut self, coll: CollectionId, oid: &ObjectId, mut on: Onode) {
        let bpu = self.inner.geo.bpu;
        let key = keys::obj_key(coll, oid);
        let sharded = on.wants_sharded_csums(bpu);
        if sharded {
            self.put(key.clone(), Some(on.encode_sharded()));
            let same_units = match self.before.get(&on.nid) {
                Some(b) if b.csums_sharded => on.changed_csum_shards(b, bpu),
                _ => None,
            };
            match same_units {
                // Only the changed shards are built and put.
                Some(changed) => {
                    self.drop_staged_csum_shards(on.nid);
                    for i in changed {
                        self.put(keys::csum_shard_key(on.nid, i), on.csum_shard(i, bpu));
                    }
                }
                None => self.set_csum_shards(on.nid, on.csum_shards(bpu)),
            }
        } else {
            self.put(key.clone(), Some(on.encode()));
            self.set_csum_shards(on.nid, Vec::new());
        }
        on.csums_sharded = sharded;
        self.saved.insert(key, Arc::new(on));
    }

    /// Forget the shards an earlier save of this transaction staged for `nid` (the caller
    /// puts again those that still differ from the stored ones).
    fn drop_staged_csum_shards(&mut self, nid: u64) {
        let prefix = keys::csum_shard_prefix(nid);
        let stale: Vec<Vec<u8>> = self
            .staged
            .range(prefix.clone()..keys::prefix_end(&prefix))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            self.staged.remove(&k);
        }
    }

    /// Make object `nid`'s checksum shard records `new` (sorted by index): put the shards that
    /// differ from those stored before this transaction, delete those no longer wanted, and
    /// drop staged ones that an earlier save of this transaction put and that now match what
    /// is stored.
    fn set_csum_shards(&mut self, nid: u64, new: Vec<(u64, Vec<u8>)>) {
        let bpu = self.inner.geo.bpu;
        let old = match self.before.get(&nid) {
            Some(b) if b.csums_sharded => b.csum_shards(bpu),
            _ => Vec::new(),
        };
        self.drop_staged_csum_shards(nid);
        // Both lists are sorted by index: walk them together.
        let mut old = old.into_iter().peekable();
        for (i, v) in new {
            while let Some((j, _)) = old.next_if(|(j, _)| *j < i) {
                self.put(keys::csum_shard_key(nid, j), None);
            }
            match old.next_if(|(j, _)| *j == i) {
                Some((_, stored)) if stored == v => {}
                _ => self.put(keys::csum_shard_key(nid, i), Some(v)),
            }
        }
        for (j, _) in old {
            self.put(keys::csum_shard_key(nid, j), None);
        }
    }

    pub(super) fn allocate(&mut self, units: u64) -> Result<Vec<(u64, u64)>> {
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
                    g.kick(units);
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

    pub(super) fn check_range(offset: u64, len: u64) -> Result<u64> {
        offset
            .checked_add(len)
            .filter(|&e| e <= MAX_OBJECT_END)
            .ok_or_else(|| StoreError::InvalidArgument {
                reason: format!("range {offset}+{len} beyond the 16 TiB object limit"),
            })
    }

    /// Current content of logical unit `lunit` (zeros for a hole), verified.
    pub(super) fn unit_content(
        &self,
        oid: &ObjectId,
        on: &Onode,
        lunit: u64,
    ) -> Result<AlignedBuf> {
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
    pub(super) fn defer_unit(
        &mut self,
        on: &mut Onode,
        lunit: u64,
        data: AlignedBuf,
    ) -> Result<()> {
        self.defer_unit_vec(on, lunit, data.to_vec())
    }

    /// [`Self::defer_unit`] for content already in a vector (one whole unit).
    fn defer_unit_vec(&mut self, on: &mut Onode, lunit: u64, data: Vec<u8>) -> Result<()> {
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
    pub(super) fn write_new_units(
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
        if defer && (lunit..lunit + n).any(|l| on.lookup(l, geo.bpu).is_some()) {
            // A small overwrite of mapped units (an RBD image's 4 KiB random writes inside
            // its 4 MiB objects): overwrite them in place through the commit, as partial
            // writes do, instead of moving them to new units. Moving them split the object's
            // extent map at every write (a 4 MiB object ended as up to 1024 extents, each
            // with its own checksum vector, encoded, logged and decoded again per write) and
            // changed two allocation-bitmap chunks per write.
            for (i, chunk) in data[start..end].chunks(u).enumerate() {
                self.defer_unit_vec(on, lunit + i as u64, chunk.to_vec())?;
            }
            return Ok(());
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

    /// Make `data` the object's whole content and size, kept inline (nothing for empty data);
    /// the caller has checked that it is small enough and that no extent is mapped.
    pub(super) fn set_inline(&mut self, on: &mut Onode, data: Vec<u8>) {
        self.inline_delta -= on.inline_len() as i64;
        on.size = data.len() as u64;
        on.inline = (!data.is_empty()).then(|| codec::Inline::new(data));
        self.inline_delta += on.inline_len() as i64;
    }

    /// The content of an object without extents (inline data, or zeros for holes), verified.
    pub(super) fn small_content(&self, oid: &ObjectId, on: &Onode) -> Result<Vec<u8>> {
        if on.inline.is_some() {
            return self.inner.inline_data(oid, on).map(<[u8]>::to_vec);
        }
        Ok(vec![0; on.size as usize])
    }

    /// Move an inline object's data into unit 0 of the data file (it grows past the inline
    /// threshold); `overwritten`: the caller's write replaces all of unit 0, so the data is
    /// only dropped. No-op for an object in extents.
    pub(super) fn spill(
        &mut self,
        oid: &ObjectId,
        on: &mut Onode,
        overwritten: bool,
    ) -> Result<()> {
        if on.inline.is_none() {
            return Ok(());
        }
        let data = self.inner.inline_data(oid, on)?.to_vec();
        self.inline_delta -= on.inline_len() as i64;
        on.inline = None;
        if !overwritten {
            let mut content = AlignedBuf::zeroed(self.inner.geo.unit as usize);
            content[..data.len()].copy_from_slice(&data);
            self.defer_unit(on, 0, content)?;
        }
        Ok(())
    }

    pub(super) fn write(
        &mut self,
        coll: CollectionId,
        oid: &ObjectId,
        off: u64,
        data: Bytes,
    ) -> Result<()> {
        let end = Self::check_range(off, data.len() as u64)?;
        let mut on = self.onode_or_new(coll, oid)?;
        let new_size = on.size.max(end);
        if !data.is_empty() && on.extents.is_empty() && new_size <= self.inner.inline_max() {
            // Small enough to keep (or start keeping) in the record. A write of the whole
            // content does not read (nor verify) the old one, so it heals damaged data.
            let mut content = if off == 0 && end >= on.size {
                Vec::with_capacity(end as usize)
            } else {
                self.small_content(oid, &on)?
            };
            content.resize(new_size as usize, 0);
            content[off as usize..end as usize].copy_from_slice(&data);
            self.set_inline(&mut on, content);
        } else if !data.is_empty() {
            let u = self.inner.geo.unit;
            self.spill(oid, &mut on, off == 0 && end >= u)?;
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
        self.save(coll, oid, on);
        Ok(())
    }

    /// Zero `[a, b)` of the object's units (punching whole units, rewriting partial ones).
    pub(super) fn zero_range(
        &mut self,
        oid: &ObjectId,
        on: &mut Onode,
        a: u64,
        b: u64,
    ) -> Result<()> {
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

    pub(super) fn remove_object(
        &mut self,
        coll: CollectionId,
        oid: &ObjectId,
        on: &Onode,
    ) -> Result<()> {
        self.inline_delta -= on.inline_len() as i64;
        self.freed.extend(
            on.extents
                .iter()
                .map(|e| (e.punit, e.units))
                .collect::<Vec<_>>(),
        );
        if on.has_omap {
            self.omap_clear(on.nid)?;
        }
        self.set_csum_shards(on.nid, Vec::new());
        self.put(keys::obj_key(coll, oid), None);
        Ok(())
    }

    pub(super) fn omap_clear(&mut self, nid: u64) -> Result<()> {
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
    pub(super) fn apply(&mut self, op: Op) -> Result<()> {
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

    pub(super) fn apply_ref(&mut self, op: &Op) -> Result<()> {
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
                    self.save(*coll, oid, on);
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
                let new_size = on.size.max(end);
                if *len > 0 && on.inline.is_some() && new_size <= self.inner.inline_max() {
                    let mut content = self.small_content(oid, &on)?;
                    let zero_end = end.min(on.size) as usize;
                    content[(*offset as usize).min(zero_end)..zero_end].fill(0);
                    content.resize(new_size as usize, 0);
                    self.set_inline(&mut on, content);
                } else if *len > 0 {
                    self.spill(oid, &mut on, false)?;
                    let zero_end = end.min(on.size);
                    self.zero_range(oid, &mut on, *offset, zero_end)?;
                    on.size = on.size.max(end);
                }
                self.save(*coll, oid, on);
            }
            Op::Truncate { coll, oid, size } => {
                Self::check_range(*size, 0)?;
                let mut on = self.onode_or_new(*coll, oid)?;
                if *size <= self.inner.inline_max()
                    && (on.inline.is_some() || !on.extents.is_empty())
                {
                    // Small enough for the record: an inline object stays inline, and one in
                    // extents moves its remaining bytes (all in unit 0) into the record.
                    let mut content = if *size == 0 {
                        Vec::new()
                    } else if on.inline.is_some() {
                        self.small_content(oid, &on)?
                    } else {
                        let unit0 = self.unit_content(oid, &on, 0)?;
                        unit0[..(*size).min(on.size) as usize].to_vec()
                    };
                    content.resize(*size as usize, 0);
                    let freed = on.punch(0, u64::MAX / 2, geo.bpu);
                    self.freed.extend(freed);
                    self.set_inline(&mut on, content);
                    self.save(*coll, oid, on);
                    return Ok(());
                }
                self.spill(oid, &mut on, false)?;
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
                self.save(*coll, oid, on);
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
                self.save(*coll, oid, on);
            }
            Op::RmXattr { coll, oid, name } => {
                let mut on = self.existing(*coll, oid)?;
                if on.xattrs.remove(name).is_some() {
                    self.save(*coll, oid, on);
                }
            }
            Op::OmapSet { coll, oid, entries } => {
                let mut on = self.existing(*coll, oid)?;
                for (k, v) in entries {
                    self.put(keys::omap_key(on.nid, k), Some(v.clone()));
                }
                if !on.has_omap {
                    on.has_omap = true;
                    self.save(*coll, oid, on);
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
                    self.save(*coll, oid, on);
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
                if s.inline.is_some() {
                    let data = self.inner.inline_data(src, &s)?.to_vec();
                    self.set_inline(&mut d, data);
                }
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
                self.save(*coll, dst, d);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;
    use crate::workload::{CRASH_COLLS, test_hash};
    use crate::{MkfsOptions, ObjectStore, StoreConfig, Transaction};

    const U: usize = 4096;

    fn record(s: &KelpStore, coll: CollectionId, oid: &ObjectId) -> Onode {
        let _g = s.inner.reuse_shared().unwrap();
        s.inner.onode_for_read(coll, oid).unwrap()
    }

    fn write(s: &KelpStore, coll: CollectionId, oid: &ObjectId, off: usize, data: &[u8]) {
        s.submit(
            Transaction::new()
                .write(coll, oid, off as u64, data.to_vec())
                .clone(),
        )
        .unwrap()
        .wait()
        .unwrap();
    }

    #[test]
    fn small_whole_unit_overwrites_stay_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let opts = MkfsOptions {
            size: kelp_types::ByteSize(64 << 20),
            ..MkfsOptions::default()
        };
        crate::mkfs(dir.path(), &opts).unwrap();
        let coll = CRASH_COLLS[0];
        let oid = ObjectId::new(1, "", "big", test_hash("big"));
        let mut model = vec![0u8; 16 * U];
        for (i, b) in model.iter_mut().enumerate() {
            *b = (i / U) as u8 + 1;
        }
        let s = KelpStore::mount(dir.path(), StoreConfig::default()).unwrap();
        s.submit(Transaction::new().create_collection(coll).clone())
            .unwrap()
            .wait()
            .unwrap();
        // 64 KiB: above `prefer_deferred_size`, so one new extent of 16 units.
        write(&s, coll, &oid, 0, &model);
        let before = record(&s, coll, &oid);
        assert_eq!(before.extents.len(), 1, "{before:?}");
        let free_before = s.stats().free_extent_bytes;
        // 4 KiB and 8 KiB whole-unit overwrites (deferred): in place, same units, no space.
        for (off, len, fill) in [(2 * U, U, 0xa1u8), (5 * U, 2 * U, 0xb2), (2 * U, U, 0xc3)] {
            write(&s, coll, &oid, off, &vec![fill; len]);
            model[off..off + len].fill(fill);
        }
        let after = record(&s, coll, &oid);
        assert_eq!(after.extents.len(), 1, "{after:?}");
        assert_eq!(after.extents[0].punit, before.extents[0].punit);
        assert_ne!(after.extents[0].csums, before.extents[0].csums);
        assert_eq!(s.stats().free_extent_bytes, free_before);
        // 8 KiB across the end: the mapped last unit in place, the next one newly allocated.
        write(&s, coll, &oid, 15 * U, &[0xd4; 2 * U]);
        model[15 * U..].fill(0xd4);
        model.resize(17 * U, 0xd4);
        let grown = record(&s, coll, &oid);
        assert_eq!(grown.extents[0].punit, before.extents[0].punit);
        assert_eq!(grown.extents.iter().map(|e| e.units).sum::<u64>(), 17);
        assert_eq!(s.read(coll, &oid, 0, 17 * U as u64).unwrap(), model);
        drop(s);
        // After a remount (replay of whatever was not yet checkpointed), the same content,
        // verified against the stored checksums, and a clean deep fsck.
        let s = KelpStore::mount(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(s.read(coll, &oid, 0, 17 * U as u64).unwrap(), model);
        let report = s.fsck(true).unwrap();
        assert!(report.problems.is_empty(), "{report:?}");
    }

    fn fresh(mib: u64) -> (tempfile::TempDir, KelpStore) {
        let dir = tempfile::tempdir().unwrap();
        let opts = MkfsOptions {
            size: kelp_types::ByteSize(mib << 20),
            ..MkfsOptions::default()
        };
        crate::mkfs(dir.path(), &opts).unwrap();
        let s = KelpStore::mount(dir.path(), StoreConfig::default()).unwrap();
        for c in &CRASH_COLLS[..2] {
            s.submit(Transaction::new().create_collection(*c).clone())
                .unwrap()
                .wait()
                .unwrap();
        }
        (dir, s)
    }

    fn run(s: &KelpStore, t: &mut Transaction) {
        s.submit(t.clone()).unwrap().wait().unwrap();
    }

    /// The metadata a transaction would write, prepared as the store does but not published.
    fn staged_by(s: &KelpStore, t: Transaction) -> BTreeMap<Vec<u8>, Option<Value>> {
        let inner = &*s.inner;
        let mut txc = Txc::new(inner, 1 << 40);
        let _g = inner.reuse_shared().unwrap();
        for op in t.ops {
            txc.apply(op).unwrap();
        }
        std::mem::take(&mut txc.staged)
    }

    /// Checksum shard records stored for `nid` (index, value).
    fn shards(s: &KelpStore, nid: u64) -> Vec<(u64, Value)> {
        let p = keys::csum_shard_prefix(nid);
        s.inner
            .scan(None, &p, &keys::prefix_end(&p), usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (keys::decode_csum_shard_key(&k).unwrap().1, v))
            .collect()
    }

    fn stored_version(s: &KelpStore, coll: CollectionId, oid: &ObjectId) -> u8 {
        s.inner.get(&keys::obj_key(coll, oid)).unwrap().unwrap()[0]
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i / 4096) as u8 ^ seed ^ i as u8)
            .collect()
    }

    #[test]
    fn a_small_overwrite_of_a_large_object_rewrites_one_checksum_shard() {
        let (dir, s) = fresh(64);
        let coll = CRASH_COLLS[0];
        let oid = ObjectId::new(1, "", "img.0", test_hash("img.0"));
        let mut model = pattern(256 * U, 1);
        run(&s, Transaction::new().write(coll, &oid, 0, model.clone()));
        let nid = record(&s, coll, &oid).nid;
        assert_eq!(stored_version(&s, coll, &oid), codec::ONODE_VERSION_SHARDED);
        assert_eq!(
            shards(&s, nid).iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        // A 4 KiB overwrite of unit 100 (shard 1): the record without checksums and one shard.
        let staged = staged_by(
            &s,
            Transaction::new()
                .write(coll, &oid, 100 * U as u64, vec![7u8; U])
                .clone(),
        );
        let staged_shards: Vec<_> = staged
            .keys()
            .filter_map(|k| keys::decode_csum_shard_key(k))
            .collect();
        assert_eq!(staged_shards, vec![(nid, 1)]);
        let rec = staged[&keys::obj_key(coll, &oid)].as_ref().unwrap();
        assert!(rec.len() < 32, "record of {} bytes", rec.len());
        let meta_bytes: usize = staged
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()))
            .sum();
        assert!(
            meta_bytes < 600,
            "{meta_bytes} bytes of metadata for a 4 KiB write"
        );
        // Written for real: read back (the cache is bypassed by a remount below).
        run(
            &s,
            Transaction::new().write(coll, &oid, 100 * U as u64, vec![7u8; U]),
        );
        model[100 * U..101 * U].fill(7);
        assert_eq!(s.read(coll, &oid, 0, 256 * U as u64).unwrap(), model);
        // Two saves in one transaction: the second undoes the first's shard change.
        let old = model[10 * U..11 * U].to_vec();
        run(
            &s,
            Transaction::new()
                .write(coll, &oid, 10 * U as u64, vec![9u8; U])
                .write(coll, &oid, 10 * U as u64, old),
        );
        // A clone gets shards of its own; overwriting it leaves the source alone.
        let copy = ObjectId::new(1, "", "img.copy", test_hash("img.copy"));
        run(&s, Transaction::new().clone_object(coll, &oid, &copy));
        run(
            &s,
            Transaction::new().write(coll, &copy, 200 * U as u64, vec![3u8; 2 * U]),
        );
        let mut copy_model = model.clone();
        copy_model[200 * U..202 * U].fill(3);
        // Truncated below 64 blocks: checksums back in the record, shards deleted.
        run(&s, Transaction::new().truncate(coll, &oid, 50 * U as u64));
        model.truncate(50 * U);
        assert_eq!(stored_version(&s, coll, &oid), codec::ONODE_VERSION_PLAIN);
        assert!(shards(&s, nid).is_empty());
        // Grown again, moved by a split, then removed.
        run(
            &s,
            Transaction::new().write(coll, &oid, 50 * U as u64, pattern(100 * U, 5)),
        );
        model.extend(pattern(100 * U, 5));
        assert_eq!(shards(&s, nid).len(), 3);
        let dest = CRASH_COLLS[1];
        run(
            &s,
            Transaction::new().split_collection(coll, dest, 32, oid.hash),
        );
        assert_eq!(s.read(dest, &oid, 0, 150 * U as u64).unwrap(), model);
        run(
            &s,
            Transaction::new().write(dest, &oid, 140 * U as u64, vec![4u8; U]),
        );
        model[140 * U..141 * U].fill(4);
        drop(s);
        let s = KelpStore::mount(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(s.read(dest, &oid, 0, 150 * U as u64).unwrap(), model);
        assert_eq!(s.read(coll, &copy, 0, 256 * U as u64).unwrap(), copy_model);
        let report = s.fsck(true).unwrap();
        assert!(report.problems.is_empty(), "{report:?}");
        let copy_nid = record(&s, coll, &copy).nid;
        run(
            &s,
            Transaction::new().remove(dest, &oid).remove(coll, &copy),
        );
        assert!(shards(&s, nid).is_empty());
        assert!(shards(&s, copy_nid).is_empty());
        let report = s.fsck(true).unwrap();
        assert!(report.problems.is_empty(), "{report:?}");
    }

    /// Records written before checksum shards existed (version 1, all checksums inside) read
    /// as before and are rewritten as version 3 by their next change; fsck names a shard no
    /// record uses.
    #[test]
    fn large_records_with_their_checksums_inside_still_read_and_convert() {
        let (dir, s) = fresh(64);
        let coll = CRASH_COLLS[0];
        let oid = ObjectId::new(1, "", "old", test_hash("old"));
        let mut model = pattern(128 * U, 2);
        run(&s, Transaction::new().write(coll, &oid, 0, model.clone()));
        drop(s);
        // Rewrite the record as an older release would have: version 1, no shard records.
        {
            let s = KelpStore::mount(dir.path(), StoreConfig::default()).unwrap();
            let inner = &*s.inner;
            let on = record(&s, coll, &oid);
            let mut b = inner.kv.batch().durability(Some(PersistMode::SyncAll));
            b.insert(&inner.meta, keys::obj_key(coll, &oid), on.encode());
            for (i, _) in shards(&s, on.nid) {
                b.remove(&inner.meta, keys::csum_shard_key(on.nid, i));
            }
            b.commit().unwrap();
            s.close().unwrap();
        }
        let s = KelpStore::mount(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(stored_version(&s, coll, &oid), codec::ONODE_VERSION_PLAIN);
        assert_eq!(s.read(coll, &oid, 0, 128 * U as u64).unwrap(), model);
        run(
            &s,
            Transaction::new().write(coll, &oid, 70 * U as u64, vec![8u8; U]),
        );
        model[70 * U..71 * U].fill(8);
        assert_eq!(stored_version(&s, coll, &oid), codec::ONODE_VERSION_SHARDED);
        let nid = record(&s, coll, &oid).nid;
        assert_eq!(shards(&s, nid).len(), 2);
        drop(s);
        let s = KelpStore::mount(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(s.read(coll, &oid, 0, 128 * U as u64).unwrap(), model);
        let report = s.fsck(true).unwrap();
        assert!(report.problems.is_empty(), "{report:?}");
        s.close().unwrap();
        // A stray shard (of an object that has none) is reported.
        {
            let s = KelpStore::mount(dir.path(), StoreConfig::default()).unwrap();
            let inner = &*s.inner;
            let mut b = inner.kv.batch().durability(Some(PersistMode::SyncAll));
            b.insert(
                &inner.meta,
                keys::csum_shard_key(nid + 1000, 0),
                vec![1u8; 5],
            );
            b.commit().unwrap();
            let report = s.fsck(false).unwrap();
            assert!(
                report
                    .problems
                    .iter()
                    .any(|p| p.kind == "orphan-csum-shard" && p.detail.contains("nid")),
                "{report:?}"
            );
        }
    }
}
