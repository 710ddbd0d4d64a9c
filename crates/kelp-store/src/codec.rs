//! Binary encodings of the records kept in the metadata database.
//!
//! Every value starts with a one-byte format version; decoders refuse versions they do not know
//! with [`StoreError::UnsupportedVersion`] and malformed input with [`StoreError::Corrupt`],
//! never a panic. Integers are LEB128 varints so that a small object's record stays a few dozen
//! bytes (the budget is 256 bytes of metadata per small object, key included).

use std::collections::BTreeMap;

use crate::error::{Result, StoreError};

/// The newest object-record version this code reads. Version 2 adds inline data ([`Inline`])
/// after the xattrs. A record without inline data is still written as version 1, byte for byte
/// as before, so stores written before inline data existed read the same and records of objects
/// in extents keep their size. Version 3 ([`ONODE_VERSION_SHARDED`]) leaves the checksums out.
pub const ONODE_VERSION: u8 = 3;
/// The version written for a record without inline data.
pub const ONODE_VERSION_PLAIN: u8 = 1;
/// The version written for a record with inline data.
pub const ONODE_VERSION_INLINE: u8 = 2;
/// The version written for an object with more than [`CSUM_SHARD_BLOCKS`] checksum blocks
/// mapped: version 1's layout without the checksums, which live in shard records of their own
/// (`keys::csum_shard_key`), so that a 4 KiB overwrite inside a 4 MiB object rewrites one
/// 257-byte shard and a ~20-byte record instead of a 4 KiB record.
pub const ONODE_VERSION_SHARDED: u8 = 3;
/// Checksum blocks per shard record: shard `i` of an object holds the checksums of its mapped
/// logical blocks `[i * CSUM_SHARD_BLOCKS, (i + 1) * CSUM_SHARD_BLOCKS)`, in order.
pub const CSUM_SHARD_BLOCKS: u64 = 64;
pub const CSUM_SHARD_VERSION: u8 = 1;
pub const DEFERRED_VERSION: u8 = 1;
pub const BITMAP_VERSION: u8 = 1;
pub const COLL_VERSION: u8 = 1;

/// Allocation units per bitmap chunk (one KV value of 512 bytes + version).
pub const BITMAP_CHUNK_UNITS: u64 = 4096;

pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn var(&mut self, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(b);
                return;
            }
            self.0.push(b | 0x80);
        }
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.var(b.len() as u64);
        self.0.extend_from_slice(b);
    }
}

pub struct Reader<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8], what: &'static str) -> Self {
        Reader { b, what }
    }
    fn bad(&self) -> StoreError {
        StoreError::corrupt(format!("truncated or malformed {}", self.what))
    }
    pub fn u8(&mut self) -> Result<u8> {
        let (&v, rest) = self.b.split_first().ok_or_else(|| self.bad())?;
        self.b = rest;
        Ok(v)
    }
    pub fn var(&mut self) -> Result<u64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.bad())
    }
    pub fn u32le(&mut self) -> Result<u32> {
        let (h, t) = self.b.split_at_checked(4).ok_or_else(|| self.bad())?;
        self.b = t;
        Ok(u32::from_le_bytes([h[0], h[1], h[2], h[3]]))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = usize::try_from(self.var()?).map_err(|_| self.bad())?;
        let (h, t) = self.b.split_at_checked(n).ok_or_else(|| self.bad())?;
        self.b = t;
        Ok(h)
    }
    pub fn version(&mut self, supported: u8, what: &'static str) -> Result<()> {
        let v = self.u8()?;
        if v == 0 || v > supported {
            return Err(StoreError::UnsupportedVersion {
                what,
                found: u32::from(v),
                supported: u32::from(supported),
            });
        }
        Ok(())
    }
    pub fn finish(&self) -> Result<()> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(StoreError::corrupt(format!(
                "trailing bytes in {}",
                self.what
            )))
        }
    }
}

/// A run of allocation units mapped contiguously: logical units `[lunit, lunit + units)` of the
/// object live at physical units `[punit, punit + units)` of the data device. `csums` has one
/// crc32c per checksum block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    pub lunit: u64,
    pub punit: u64,
    pub units: u64,
    pub csums: Vec<u32>,
}

/// An object's extended attributes, sorted by name: a vector, not a `BTreeMap`, because
/// objects carry one or two (the OSD's version attribute, a few user attributes) and a
/// `BTreeMap` allocates a ~540-byte node for even one entry, which made a cached 4 KiB
/// object's record ~800 bytes of heap instead of ~300.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Xattrs(Vec<(String, Vec<u8>)>);

impl Xattrs {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(name))
    }
    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<&Vec<u8>> {
        self.find(name).ok().map(|i| &self.0[i].1)
    }
    /// Sets `name`, returning its previous value.
    pub fn insert(&mut self, name: String, value: Vec<u8>) -> Option<Vec<u8>> {
        match self.find(&name) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (name, value));
                None
            }
        }
    }
    pub fn remove(&mut self, name: &str) -> Option<Vec<u8>> {
        self.find(name).ok().map(|i| self.0.remove(i).1)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Vec<u8>)> {
        self.0.iter().map(|(k, v)| (k, v))
    }
    pub fn to_map(&self) -> BTreeMap<String, Vec<u8>> {
        self.0.iter().cloned().collect()
    }
    /// Heap bytes held (allocations rounded up to 16 bytes, as allocators do).
    pub fn heap_bytes(&self) -> usize {
        let pair = std::mem::size_of::<(String, Vec<u8>)>();
        heap_alloc(self.0.capacity() * pair)
            + self
                .0
                .iter()
                .map(|(k, v)| heap_alloc(k.capacity()) + heap_alloc(v.capacity()))
                .sum::<usize>()
    }
}

impl<K: Into<String>, V: Into<Vec<u8>>> FromIterator<(K, V)> for Xattrs {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut x = Xattrs::default();
        for (k, v) in iter {
            x.insert(k.into(), v.into());
        }
        x
    }
}

/// What an allocation of `n` bytes takes from the heap (0 for none).
pub(crate) fn heap_alloc(n: usize) -> usize {
    if n == 0 { 0 } else { n.div_ceil(16) * 16 }
}

/// The whole content of a small object, kept in its record instead of in data-file extents
/// (see docs/STORE.md, "Small objects"), with its crc32c: the record is committed atomically
/// with the data, and a flipped byte is caught like one in a data block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inline {
    data: Vec<u8>,
    csum: u32,
}

impl Inline {
    /// `data` with its checksum computed now.
    pub fn new(data: Vec<u8>) -> Self {
        let csum = kelp_types::crc32c(&data);
        Inline { data, csum }
    }
    pub fn len(&self) -> usize {
        self.data.len()
    }
    /// The stored checksum.
    pub fn csum(&self) -> u32 {
        self.csum
    }
    /// The data if it matches its checksum, else `Err(actual crc32c)`.
    pub fn verified(&self) -> std::result::Result<&[u8], u32> {
        let actual = kelp_types::crc32c(&self.data);
        if actual == self.csum {
            Ok(&self.data)
        } else {
            Err(actual)
        }
    }
    /// Flip one bit of the data without updating the checksum (fault injection for tests).
    pub fn flip_bit(&mut self, at: usize) {
        if let Some(b) = self.data.get_mut(at) {
            *b ^= 1;
        }
    }
}

/// The record of one object ("onode", Ceph's word).
///
/// Invariants: `extents` sorted by `lunit`, non-overlapping, and lying below
/// `ceil(size / unit)`; bytes of a mapped unit beyond `size` are zero; unmapped units read as
/// zeros (holes). With `inline` set, `extents` is empty and the inline data is the whole
/// content (`len() == size`, never empty).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Onode {
    pub nid: u64,
    pub size: u64,
    /// Set once any omap key or header was written, so removing an omap-less object skips the
    /// omap range scan.
    pub has_omap: bool,
    pub extents: Vec<Extent>,
    pub xattrs: Xattrs,
    /// The content of a small object kept in the record (then `extents` is empty).
    pub inline: Option<Inline>,
    /// The stored record keeps its checksums in shard records (version 3): set by decoding,
    /// for the writer to know which shard records exist.
    pub csums_sharded: bool,
}

impl Onode {
    /// Bytes of inline data held (0 for an object in extents).
    pub fn inline_len(&self) -> u64 {
        self.inline.as_ref().map_or(0, |i| i.len() as u64)
    }

    /// Heap bytes a decoded record holds, behind an `Arc` (for the onode cache's budget).
    pub fn heap_bytes(&self) -> usize {
        heap_alloc(16 + std::mem::size_of::<Onode>())
            + heap_alloc(self.extents.capacity() * std::mem::size_of::<Extent>())
            + self
                .extents
                .iter()
                .map(|e| heap_alloc(e.csums.capacity() * 4))
                .sum::<usize>()
            + self.xattrs.heap_bytes()
            + self
                .inline
                .as_ref()
                .map_or(0, |i| heap_alloc(i.data.capacity()))
    }

    /// The record with its checksums in it (version 1, or 2 with inline data).
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(false)
    }

    /// Whether this object's record is stored with its checksums in shard records: more than
    /// [`CSUM_SHARD_BLOCKS`] checksum blocks mapped.
    pub fn wants_sharded_csums(&self, bpu: u64) -> bool {
        self.inline.is_none()
            && self.extents.iter().map(|e| e.units).sum::<u64>() * bpu > CSUM_SHARD_BLOCKS
    }

    /// The record without its checksums (version 3): they go to [`Onode::csum_shards`].
    pub fn encode_sharded(&self) -> Vec<u8> {
        debug_assert!(self.inline.is_none());
        self.encode_as(true)
    }

    /// The checksum shard records of this object, `(shard index, value)` in index order: the
    /// checksums of the mapped blocks of each shard's range, in block order.
    pub fn csum_shards(&self, bpu: u64) -> Vec<(u64, Vec<u8>)> {
        let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
        for e in &self.extents {
            let mut block = e.lunit * bpu;
            let mut rest = &e.csums[..];
            while !rest.is_empty() {
                let shard = block / CSUM_SHARD_BLOCKS;
                let n = ((shard + 1) * CSUM_SHARD_BLOCKS - block).min(rest.len() as u64) as usize;
                let (these, tail) = rest.split_at(n);
                if out.last().is_none_or(|(i, _)| *i != shard) {
                    let mut v = Vec::with_capacity(1 + 4 * CSUM_SHARD_BLOCKS as usize);
                    v.push(CSUM_SHARD_VERSION);
                    out.push((shard, v));
                }
                if let Some((_, v)) = out.last_mut() {
                    for c in these {
                        v.extend_from_slice(&c.to_le_bytes());
                    }
                }
                block += n as u64;
                rest = tail;
            }
        }
        out
    }

    /// Indices of the checksum shards whose content differs from `other`'s, if both map the
    /// same units (an in-place overwrite's case: a comparison of the checksum vectors, with no
    /// shard built); `None` if their extent maps differ.
    pub fn changed_csum_shards(&self, other: &Onode, bpu: u64) -> Option<Vec<u64>> {
        if self.extents.len() != other.extents.len()
            || self
                .extents
                .iter()
                .zip(&other.extents)
                .any(|(a, b)| (a.lunit, a.punit, a.units) != (b.lunit, b.punit, b.units))
        {
            return None;
        }
        let mut changed: Vec<u64> = Vec::new();
        for (a, b) in self.extents.iter().zip(&other.extents) {
            let first = a.lunit * bpu;
            let mut k = 0;
            while k < a.csums.len() {
                let shard = (first + k as u64) / CSUM_SHARD_BLOCKS;
                let end = (((shard + 1) * CSUM_SHARD_BLOCKS - first) as usize).min(a.csums.len());
                if a.csums[k..end] != b.csums[k..end] && changed.last() != Some(&shard) {
                    changed.push(shard);
                }
                k = end;
            }
        }
        Some(changed)
    }

    /// Checksum shard `i` (as in [`Onode::csum_shards`]), `None` if it covers no mapped block.
    pub fn csum_shard(&self, i: u64, bpu: u64) -> Option<Vec<u8>> {
        let (lo, hi) = (i * CSUM_SHARD_BLOCKS, (i + 1) * CSUM_SHARD_BLOCKS);
        let mut v: Option<Vec<u8>> = None;
        let from = self
            .extents
            .partition_point(|e| (e.lunit + e.units) * bpu <= lo);
        for e in &self.extents[from..] {
            let first = e.lunit * bpu;
            if first >= hi {
                break;
            }
            let a = (lo.max(first) - first) as usize;
            let b = (hi.min(first + e.units * bpu) - first) as usize;
            let out = v.get_or_insert_with(|| {
                let mut v = Vec::with_capacity(1 + 4 * CSUM_SHARD_BLOCKS as usize);
                v.push(CSUM_SHARD_VERSION);
                v
            });
            for c in &e.csums[a..b] {
                out.extend_from_slice(&c.to_le_bytes());
            }
        }
        v
    }

    fn encode_as(&self, sharded: bool) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(
            24 + self.extents.len() * 16 + self.inline_len() as usize,
        ));
        w.u8(if sharded {
            ONODE_VERSION_SHARDED
        } else if self.inline.is_some() {
            ONODE_VERSION_INLINE
        } else {
            ONODE_VERSION_PLAIN
        });
        w.var(self.nid);
        w.var(self.size);
        w.u8(u8::from(self.has_omap));
        w.var(self.extents.len() as u64);
        let mut next = 0;
        for e in &self.extents {
            w.var(e.lunit - next);
            w.var(e.punit);
            w.var(e.units);
            if !sharded {
                for c in &e.csums {
                    w.0.extend_from_slice(&c.to_le_bytes());
                }
            }
            next = e.lunit + e.units;
        }
        w.var(self.xattrs.len() as u64);
        for (k, v) in self.xattrs.iter() {
            w.bytes(k.as_bytes());
            w.bytes(v);
        }
        if let Some(i) = &self.inline {
            w.bytes(&i.data);
            w.0.extend_from_slice(&i.csum.to_le_bytes());
        }
        w.0
    }

    #[cfg(test)]
    /// Decode a record whose checksums are in it (versions 1 and 2); a version-3 record is
    /// refused as corrupt (its shards are needed: [`Onode::decode_with`]).
    pub fn decode(b: &[u8], blocks_per_unit: u64) -> Result<Onode> {
        Self::decode_with(b, blocks_per_unit, |nid, _| -> Result<Option<&[u8]>> {
            Err(StoreError::corrupt(format!(
                "record of object nid {nid} keeps its checksums in shard records, none given"
            )))
        })
    }

    /// Decode a record; `shard(nid, i)` fetches checksum shard `i` of a version-3 record.
    /// `blocks_per_unit` is a store constant (min_alloc_size / csum_block_size).
    pub fn decode_with<V: AsRef<[u8]>>(
        b: &[u8],
        blocks_per_unit: u64,
        mut shard: impl FnMut(u64, u64) -> Result<Option<V>>,
    ) -> Result<Onode> {
        let mut r = Reader::new(b, "object record");
        r.version(ONODE_VERSION, "object record")?;
        let version = b[0];
        let sharded = version == ONODE_VERSION_SHARDED;
        let nid = r.var()?;
        let size = r.var()?;
        let has_omap = r.u8()? != 0;
        let n = r.var()?;
        let mut extents = Vec::new();
        let mut next: u64 = 0;
        for _ in 0..n {
            let lunit = next
                .checked_add(r.var()?)
                .ok_or_else(|| StoreError::corrupt("extent offset overflow"))?;
            let punit = r.var()?;
            let units = r.var()?;
            let ncsum = units
                .checked_mul(blocks_per_unit)
                .filter(|&n| n <= 1 << 32)
                .ok_or_else(|| StoreError::corrupt("extent length overflow"))?;
            let mut csums = Vec::with_capacity(ncsum as usize);
            if !sharded {
                for _ in 0..ncsum {
                    csums.push(r.u32le()?);
                }
            }
            next = lunit
                .checked_add(units)
                .ok_or_else(|| StoreError::corrupt("extent length overflow"))?;
            extents.push(Extent {
                lunit,
                punit,
                units,
                csums,
            });
        }
        let nx = r.var()?;
        let mut xattrs = Xattrs(Vec::with_capacity(nx.min(1024) as usize));
        for _ in 0..nx {
            let k = String::from_utf8(r.bytes()?.to_vec())
                .map_err(|_| StoreError::corrupt("xattr name is not UTF-8"))?;
            let v = r.bytes()?.to_vec();
            xattrs.insert(k, v);
        }
        let inline = if version == ONODE_VERSION_INLINE {
            let data = r.bytes()?.to_vec();
            let csum = r.u32le()?;
            if data.is_empty() || data.len() as u64 != size || !extents.is_empty() {
                return Err(StoreError::corrupt(format!(
                    "inline data of {} bytes in an object of {size} bytes with {} extents",
                    data.len(),
                    extents.len()
                )));
            }
            Some(Inline { data, csum })
        } else {
            None
        };
        r.finish()?;
        if sharded {
            fill_csums(nid, &mut extents, blocks_per_unit, &mut shard)?;
        }
        Ok(Onode {
            nid,
            size,
            has_omap,
            extents,
            xattrs,
            inline,
            csums_sharded: sharded,
        })
    }

    /// Physical unit and checksums of logical unit `lunit`, if mapped.
    pub fn lookup(&self, lunit: u64, bpu: u64) -> Option<(u64, &[u32])> {
        let i = self.extents.partition_point(|e| e.lunit + e.units <= lunit);
        let e = self.extents.get(i)?;
        if e.lunit > lunit {
            return None;
        }
        let k = lunit - e.lunit;
        Some((
            e.punit + k,
            &e.csums[(k * bpu) as usize..((k + 1) * bpu) as usize],
        ))
    }

    /// Unmap logical units `[start, end)`; returns the freed physical runs `(punit, units)`.
    pub fn punch(&mut self, start: u64, end: u64, bpu: u64) -> Vec<(u64, u64)> {
        let mut freed = Vec::new();
        if start >= end {
            return freed;
        }
        let mut out = Vec::with_capacity(self.extents.len() + 1);
        for e in self.extents.drain(..) {
            let (es, ee) = (e.lunit, e.lunit + e.units);
            if ee <= start || es >= end {
                out.push(e);
                continue;
            }
            let cut_s = es.max(start);
            let cut_e = ee.min(end);
            freed.push((e.punit + (cut_s - es), cut_e - cut_s));
            if es < cut_s {
                let n = cut_s - es;
                out.push(Extent {
                    lunit: es,
                    punit: e.punit,
                    units: n,
                    csums: e.csums[..(n * bpu) as usize].to_vec(),
                });
            }
            if cut_e < ee {
                let skip = cut_e - es;
                out.push(Extent {
                    lunit: cut_e,
                    punit: e.punit + skip,
                    units: ee - cut_e,
                    csums: e.csums[(skip * bpu) as usize..].to_vec(),
                });
            }
        }
        self.extents = out;
        freed
    }

    /// Map a run whose logical range is currently unmapped (call `punch` first), merging with
    /// physically contiguous neighbours.
    pub fn insert(&mut self, ext: Extent) {
        let i = self.extents.partition_point(|e| e.lunit < ext.lunit);
        self.extents.insert(i, ext);
        // Merge with the next, then with the previous.
        if i + 1 < self.extents.len() {
            let (a, b) = (&self.extents[i], &self.extents[i + 1]);
            if a.lunit + a.units == b.lunit && a.punit + a.units == b.punit {
                let b = self.extents.remove(i + 1);
                let a = &mut self.extents[i];
                a.units += b.units;
                a.csums.extend(b.csums);
            }
        }
        if i > 0 {
            let (a, b) = (&self.extents[i - 1], &self.extents[i]);
            if a.lunit + a.units == b.lunit && a.punit + a.units == b.punit {
                let b = self.extents.remove(i);
                let a = &mut self.extents[i - 1];
                a.units += b.units;
                a.csums.extend(b.csums);
            }
        }
    }

    /// Replace the checksums of a mapped unit (in-place deferred overwrite).
    pub fn set_unit_csums(&mut self, lunit: u64, bpu: u64, csums: &[u32]) {
        let i = self.extents.partition_point(|e| e.lunit + e.units <= lunit);
        if let Some(e) = self.extents.get_mut(i)
            && e.lunit <= lunit
        {
            let k = ((lunit - e.lunit) * bpu) as usize;
            e.csums[k..k + bpu as usize].copy_from_slice(csums);
        }
    }
}

/// Fill the (empty) checksum vectors of a version-3 record's extents from its shard records.
/// Every shard the extents cover must be there and hold exactly their blocks' checksums.
fn fill_csums<V: AsRef<[u8]>>(
    nid: u64,
    extents: &mut [Extent],
    bpu: u64,
    shard: &mut impl FnMut(u64, u64) -> Result<Option<V>>,
) -> Result<()> {
    let corrupt = |i: u64, what: &str| {
        StoreError::corrupt(format!("checksum shard {i} of object nid {nid}: {what}"))
    };
    // The shard being read (index, value) and how many of its checksums are used so far.
    let mut cur: Option<(u64, V)> = None;
    let mut used = 0usize;
    let finish = |cur: &Option<(u64, V)>, used: usize| -> Result<()> {
        match cur {
            Some((i, v)) if v.as_ref().len() != 1 + 4 * used => Err(corrupt(
                *i,
                "holds more checksums than the blocks it covers",
            )),
            _ => Ok(()),
        }
    };
    for e in extents.iter_mut() {
        for k in 0..e.units * bpu {
            let i = (e.lunit * bpu + k) / CSUM_SHARD_BLOCKS;
            if cur.as_ref().is_none_or(|c| c.0 != i) {
                finish(&cur, used)?;
                let v = shard(nid, i)?.ok_or_else(|| corrupt(i, "missing"))?;
                match v.as_ref().first() {
                    Some(&CSUM_SHARD_VERSION) => {}
                    Some(&other) => {
                        return Err(StoreError::UnsupportedVersion {
                            what: "checksum shard",
                            found: u32::from(other),
                            supported: u32::from(CSUM_SHARD_VERSION),
                        });
                    }
                    None => return Err(corrupt(i, "empty")),
                }
                cur = Some((i, v));
                used = 0;
            }
            if let Some((i, v)) = &cur {
                let at = 1 + 4 * used;
                let c = v.as_ref().get(at..at + 4).ok_or_else(|| {
                    corrupt(*i, "holds fewer checksums than the blocks it covers")
                })?;
                e.csums.push(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                used += 1;
            }
        }
    }
    finish(&cur, used)
}

/// Deferred writes of one commit batch: whole allocation units to be written at `punit`.
pub fn encode_deferred(writes: &[(u64, &[u8])]) -> Vec<u8> {
    let size: usize = writes.iter().map(|(_, d)| d.len() + 12).sum();
    let mut w = Writer(Vec::with_capacity(size + 4));
    w.u8(DEFERRED_VERSION);
    w.var(writes.len() as u64);
    for (punit, data) in writes {
        w.var(*punit);
        w.bytes(data);
    }
    w.0
}

pub fn decode_deferred(b: &[u8]) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut r = Reader::new(b, "deferred write record");
    r.version(DEFERRED_VERSION, "deferred write record")?;
    let n = r.var()?;
    let mut out = Vec::new();
    for _ in 0..n {
        let punit = r.var()?;
        out.push((punit, r.bytes()?.to_vec()));
    }
    r.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(lunit: u64, punit: u64, units: u64) -> Extent {
        Extent {
            lunit,
            punit,
            units,
            csums: (0..units as u32).map(|i| i + punit as u32 * 100).collect(),
        }
    }

    #[test]
    fn onode_round_trips_and_refuses_garbage() {
        let mut o = Onode {
            nid: 7,
            size: 12345,
            has_omap: true,
            extents: vec![ext(0, 10, 2), ext(5, 100, 1)],
            xattrs: [("a", b"1".to_vec())].into_iter().collect(),
            inline: None,
            csums_sharded: false,
        };
        let b = o.encode();
        assert_eq!(Onode::decode(&b, 1).unwrap(), o);
        for cut in 0..b.len() {
            assert!(Onode::decode(&b[..cut], 1).is_err());
        }
        let mut future = b.clone();
        future[0] = 9;
        assert!(matches!(
            Onode::decode(&future, 1),
            Err(StoreError::UnsupportedVersion { found: 9, .. })
        ));
        // Punch the middle of the first extent.
        o.extents = vec![ext(0, 10, 4)];
        let freed = o.punch(1, 3, 1);
        assert_eq!(freed, vec![(11, 2)]);
        assert_eq!(o.lookup(0, 1).unwrap().0, 10);
        assert!(o.lookup(1, 1).is_none());
        assert_eq!(o.lookup(3, 1).unwrap().0, 13);
        o.insert(ext(1, 11, 2));
        assert_eq!(o.extents.len(), 1, "re-inserting the same run merges back");
    }

    /// Shards of a version-3 record, as the store keeps them (nid, index) -> value.
    fn shard_map(o: &Onode, bpu: u64) -> BTreeMap<(u64, u64), Vec<u8>> {
        o.csum_shards(bpu)
            .into_iter()
            .map(|(i, v)| ((o.nid, i), v))
            .collect()
    }

    #[test]
    fn large_objects_keep_their_checksums_in_shards_and_read_them_back() {
        // 2 blocks per unit: units 0..40 (80 blocks: shards 0 and 1), a hole, then units
        // 100..110 (blocks 200..220: shards 3); shard 2 is not needed.
        let bpu = 2;
        let wide = |lunit: u64, punit: u64, units: u64| Extent {
            lunit,
            punit,
            units,
            csums: (0..(units * bpu) as u32)
                .map(|i| i ^ (punit as u32) << 12)
                .collect(),
        };
        let o = Onode {
            nid: 42,
            size: 110 * 8192,
            extents: vec![wide(0, 500, 40), wide(100, 900, 10)],
            ..Onode::default()
        };
        assert!(o.wants_sharded_csums(bpu));
        let shards = shard_map(&o, bpu);
        assert_eq!(
            shards.keys().map(|k| k.1).collect::<Vec<_>>(),
            vec![0, 1, 3]
        );
        assert_eq!(shards[&(42, 0)].len(), 1 + 4 * 64);
        assert_eq!(shards[&(42, 1)].len(), 1 + 4 * 16);
        assert_eq!(shards[&(42, 3)].len(), 1 + 4 * 20);
        let b = o.encode_sharded();
        assert_eq!(b[0], ONODE_VERSION_SHARDED);
        assert!(
            b.len() < 20,
            "no checksums in the record: {} bytes",
            b.len()
        );
        let get = |m: &BTreeMap<(u64, u64), Vec<u8>>| {
            let m = m.clone();
            move |nid: u64, i: u64| -> Result<Option<Vec<u8>>> { Ok(m.get(&(nid, i)).cloned()) }
        };
        let d = Onode::decode_with(&b, bpu, get(&shards)).unwrap();
        assert!(d.csums_sharded);
        assert_eq!(
            Onode {
                csums_sharded: false,
                ..d.clone()
            },
            o
        );
        for i in 0..5 {
            assert_eq!(
                o.csum_shard(i, bpu),
                shards.get(&(42, i)).cloned(),
                "shard {i}"
            );
        }
        // The same units with checksums changed in shards 1 and 3 (units 35 and 105).
        let mut changed = o.clone();
        changed.extents[0].csums[70] ^= 1;
        changed.extents[1].csums[10] ^= 1;
        assert_eq!(changed.changed_csum_shards(&o, bpu), Some(vec![1, 3]));
        assert_eq!(o.changed_csum_shards(&o, bpu), Some(vec![]));
        let mut moved = o.clone();
        moved.extents[1].punit += 1;
        assert_eq!(moved.changed_csum_shards(&o, bpu), None);
        // Without its shards the record is refused, never read with missing checksums.
        assert!(Onode::decode(&b, bpu).is_err());
        let mut missing = shards.clone();
        missing.remove(&(42, 1));
        let e = Onode::decode_with(&b, bpu, get(&missing)).unwrap_err();
        assert!(e.to_string().contains("shard 1 of object nid 42"), "{e}");
        let mut long = shards.clone();
        long.get_mut(&(42, 3))
            .unwrap()
            .extend_from_slice(&[1, 2, 3, 4]);
        assert!(Onode::decode_with(&b, bpu, get(&long)).is_err());
        let mut short = shards.clone();
        short.get_mut(&(42, 0)).unwrap().truncate(1 + 4 * 63);
        assert!(Onode::decode_with(&b, bpu, get(&short)).is_err());
        let mut future = shards.clone();
        future.get_mut(&(42, 0)).unwrap()[0] = 9;
        assert!(matches!(
            Onode::decode_with(&b, bpu, get(&future)),
            Err(StoreError::UnsupportedVersion { found: 9, .. })
        ));
        for cut in 0..b.len() {
            assert!(Onode::decode_with(&b[..cut], bpu, get(&shards)).is_err());
        }
        // 64 blocks or fewer stay in the record.
        let small = Onode {
            nid: 1,
            size: 32 * 8192,
            extents: vec![wide(0, 7, 32)],
            ..Onode::default()
        };
        assert!(!small.wants_sharded_csums(bpu));
        assert!(
            Onode {
                extents: vec![wide(0, 7, 33)],
                ..small
            }
            .wants_sharded_csums(bpu)
        );
    }

    /// A v1 onode as written by the first release: must keep decoding.
    #[test]
    fn v1_fixture_still_decodes() {
        let fixture: &[u8] = &[
            1, 7, 0xb9, 0x60, 1, 2, 0, 10, 2, 0xe8, 3, 0, 0, 0xe9, 3, 0, 0, 3, 100, 1, 0x10, 0x27,
            0, 0, 1, 1, b'a', 1, b'1',
        ];
        let o = Onode::decode(fixture, 1).unwrap();
        assert_eq!(o.nid, 7);
        assert_eq!(o.size, 12345);
        assert!(o.has_omap);
        assert_eq!(o.extents, vec![ext(0, 10, 2), ext(5, 100, 1)]);
        assert_eq!(o.xattrs.get("a"), Some(&b"1".to_vec()));
        assert_eq!(
            o.encode(),
            fixture,
            "v1 encoding changed: bump ONODE_VERSION instead"
        );
    }

    #[test]
    fn inline_data_round_trips_as_v2_and_checks_its_crc() {
        let mut o = Onode {
            nid: 3,
            size: 5,
            xattrs: [("a", b"1".to_vec())].into_iter().collect(),
            inline: Some(Inline::new(b"hello".to_vec())),
            ..Onode::default()
        };
        let b = o.encode();
        assert_eq!(b[0], 2, "inline data needs version 2");
        assert_eq!(b.len(), 1 + 1 + 1 + 1 + 1 + 1 + 2 + 2 + 6 + 4);
        let d = Onode::decode(&b, 1).unwrap();
        assert_eq!(d, o);
        assert_eq!(d.inline.as_ref().unwrap().verified().unwrap(), b"hello");
        for cut in 0..b.len() {
            assert!(Onode::decode(&b[..cut], 1).is_err());
        }
        // A flipped data byte decodes (it is data) but fails verification.
        let mut bad = b.clone();
        bad[b.len() - 6] ^= 0x10;
        let d = Onode::decode(&bad, 1).unwrap();
        assert!(d.inline.as_ref().unwrap().verified().is_err());
        // Inline data must be the whole content and exclusive with extents.
        o.size = 6;
        assert!(Onode::decode(&o.encode(), 1).is_err());
        o.size = 5;
        o.extents = vec![ext(0, 1, 1)];
        assert!(Onode::decode(&o.encode(), 1).is_err());
        // Without inline data the record is written as version 1, as before.
        o.extents.clear();
        o.inline = None;
        assert_eq!(o.encode()[0], 1);
    }

    #[test]
    fn small_onode_is_small() {
        let o = Onode {
            nid: 1_000_000,
            size: 4096,
            has_omap: false,
            extents: vec![ext(0, 1_000_000, 1)],
            xattrs: Xattrs::default(),
            inline: None,
            csums_sharded: false,
        };
        assert!(o.encode().len() <= 20, "{}", o.encode().len());
    }

    #[test]
    fn xattrs_stay_sorted_and_replace_by_name() {
        let mut x = Xattrs::default();
        assert_eq!(x.insert("b".into(), b"2".to_vec()), None);
        assert_eq!(x.insert("a".into(), b"1".to_vec()), None);
        assert_eq!(x.insert("c".into(), b"3".to_vec()), None);
        assert_eq!(x.insert("b".into(), b"22".to_vec()), Some(b"2".to_vec()));
        let names: Vec<&String> = x.iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(x.get("b"), Some(&b"22".to_vec()));
        assert_eq!(x.remove("a"), Some(b"1".to_vec()));
        assert_eq!(x.remove("a"), None);
        assert_eq!(x.len(), 2);
        assert_eq!(x.to_map().keys().collect::<Vec<_>>(), ["b", "c"]);
        // Decoding keeps the order and content.
        let o = Onode {
            nid: 1,
            xattrs: x.clone(),
            ..Onode::default()
        };
        assert_eq!(Onode::decode(&o.encode(), 1).unwrap().xattrs, x);
    }

    #[test]
    fn heap_bytes_counts_what_a_decoded_record_holds() {
        let bare = Onode::default().heap_bytes();
        assert!(bare >= std::mem::size_of::<Onode>());
        let mut o = Onode {
            extents: vec![Extent {
                lunit: 0,
                punit: 9,
                units: 256,
                csums: vec![0; 256],
            }],
            ..Onode::default()
        };
        let with_csums = o.heap_bytes();
        assert!(with_csums >= bare + 256 * 4 + std::mem::size_of::<Extent>());
        o.xattrs.insert("@v".into(), 7u64.to_le_bytes().to_vec());
        assert!(o.heap_bytes() >= with_csums + std::mem::size_of::<(String, Vec<u8>)>() + 8);
    }
}
