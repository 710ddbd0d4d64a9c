//! Offline consistency check of a [`KelpStore`].
//!
//! Rebuilds the set of allocated units from every object's extent map and compares it with the
//! committed allocation bitmap: a unit referenced by two extents is a *double allocation*, a
//! referenced unit marked free is *used-but-free* (it could be handed out again and overwrite
//! live data), an allocated unit nobody references is a *leak*. It also decodes every record
//! (keys and values), checks extents against the object size and device, finds omap data
//! whose object is gone and checksum shards no record uses, and sums the inline data of small
//! objects against the store's counter of it. `deep` additionally reads every mapped block and verifies its crc32c (and every
//! object's inline data against its own), naming the object and offset of each mismatch.
//!
//! Run it on an idle store: it flushes, then reads the committed metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::alloc::Bitmap;
use crate::codec::Onode;
use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::kelpstore::{KelpStore, Via};
use crate::keys;
use crate::store::ObjectStore;

/// One inconsistency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FsckProblem {
    /// Stable name: `corrupt-record`, `orphan-object`, `bad-extent`, `double-allocation`,
    /// `used-but-free`, `leaked`, `checksum`, `orphan-omap`, `orphan-csum-shard`, `nid`,
    /// `inline-bytes`.
    pub kind: &'static str,
    pub detail: String,
}

impl fmt::Display for FsckProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FsckReport {
    pub collections: u64,
    pub objects: u64,
    pub omap_entries: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// Bytes of data kept inline in object records (small objects).
    pub inline_bytes: u64,
    /// Checksum blocks read and verified (deep only).
    pub blocks_verified: u64,
    pub problems: Vec<FsckProblem>,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
    fn problem(&mut self, kind: &'static str, detail: String) {
        self.problems.push(FsckProblem { kind, detail });
    }
}

/// Mount `dir`, check it, unmount.
pub fn fsck_dir(dir: &Path, deep: bool) -> Result<FsckReport> {
    let cfg = StoreConfig {
        cache_budget: kelp_types::ByteSize(64 << 20),
        ..StoreConfig::default()
    };
    let store = KelpStore::mount(dir, cfg)?;
    let report = store.fsck(deep)?;
    store.close()?;
    Ok(report)
}

fn kv_err(e: impl fmt::Display) -> StoreError {
    StoreError::kv("scanning metadata for fsck", e)
}

impl KelpStore {
    /// Check this (idle) store; see the module docs.
    pub fn fsck(&self, deep: bool) -> Result<FsckReport> {
        self.flush()?;
        let inner = &*self.inner;
        let geo = inner.geo;
        let mut rep = FsckReport::default();

        let mut colls = BTreeSet::new();
        for r in inner.meta.prefix([keys::COLL]) {
            let (k, _) = r.map_err(kv_err)?;
            match keys::decode_coll_key(&k) {
                Ok(c) => {
                    colls.insert(c);
                }
                Err(e) => rep.problem("corrupt-record", e.to_string()),
            }
        }
        rep.collections = colls.len() as u64;

        let mut used = Bitmap::new(geo.units);
        let mut nids = BTreeSet::new();
        // (nid, index) of every checksum shard a record needs.
        let mut shards = BTreeSet::new();
        let mut max_nid = 0;
        for r in inner.meta.prefix([keys::OBJ]) {
            let (k, v) = r.map_err(kv_err)?;
            let (coll, oid) = match keys::decode_obj_key(&k) {
                Ok(x) => x,
                Err(e) => {
                    rep.problem("corrupt-record", e.to_string());
                    continue;
                }
            };
            rep.objects += 1;
            if !colls.contains(&coll) {
                rep.problem(
                    "orphan-object",
                    format!("{oid} is in collection {coll}, which does not exist"),
                );
            }
            let on = match Onode::decode_with(&v, geo.bpu, |nid, i| {
                inner.meta.get(keys::csum_shard_key(nid, i)).map_err(kv_err)
            }) {
                Ok(o) => o,
                Err(e) => {
                    rep.problem("corrupt-record", format!("object {oid}: {e}"));
                    continue;
                }
            };
            if on.csums_sharded {
                shards.extend(
                    on.csum_shards(geo.bpu)
                        .into_iter()
                        .map(|(i, _)| (on.nid, i)),
                );
            }
            if !nids.insert(on.nid) {
                rep.problem("nid", format!("object {oid} reuses nid {}", on.nid));
            }
            max_nid = max_nid.max(on.nid);
            if let Some(i) = &on.inline {
                rep.inline_bytes += i.len() as u64;
                if deep {
                    match i.verified() {
                        Ok(_) => rep.blocks_verified += 1,
                        Err(actual) => rep.problem(
                            "checksum",
                            format!(
                                "object {oid}: inline data ({} bytes) has crc32c {actual:#010x}, \
                                 expected {:#010x}",
                                i.len(),
                                i.csum()
                            ),
                        ),
                    }
                }
            }
            let size_units = on.size.div_ceil(geo.unit);
            for e in &on.extents {
                if e.units == 0
                    || e.punit
                        .checked_add(e.units)
                        .is_none_or(|end| end > geo.units)
                    || e.lunit + e.units > size_units
                    || e.csums.len() as u64 != e.units * geo.bpu
                {
                    rep.problem(
                        "bad-extent",
                        format!(
                            "object {oid}: extent lunit {} punit {} units {} (size {}, device units {})",
                            e.lunit, e.punit, e.units, on.size, geo.units
                        ),
                    );
                    continue;
                }
                for u in e.punit..e.punit + e.units {
                    if used.get(u) {
                        rep.problem(
                            "double-allocation",
                            format!(
                                "data-file unit {u} (offset {}) is referenced again by {oid}",
                                u * geo.unit
                            ),
                        );
                    }
                }
                used.set_range(e.punit, e.units, true);
                rep.used_bytes += e.units * geo.unit;
                if deep {
                    // Read in slices of at most 256 units to bound memory.
                    let mut done = 0;
                    while done < e.units {
                        let n = (e.units - done).min(256);
                        let cs =
                            &e.csums[(done * geo.bpu) as usize..((done + n) * geo.bpu) as usize];
                        match inner.read_units_via(
                            &oid,
                            e.lunit + done,
                            e.punit + done,
                            n,
                            cs,
                            None,
                            Via::Device,
                        ) {
                            Ok(_) => rep.blocks_verified += n * geo.bpu,
                            Err(err @ StoreError::ChecksumMismatch { .. }) => {
                                rep.problem("checksum", err.to_string());
                            }
                            Err(err) => return Err(err),
                        }
                        done += n;
                    }
                }
            }
        }

        // Committed allocation bitmap.
        let mut committed = Bitmap::new(geo.units);
        for r in inner.meta.prefix([keys::BITMAP]) {
            let (k, v) = r.map_err(kv_err)?;
            match keys::decode_bitmap_key(&k).and_then(|c| committed.load_chunk(c, &v)) {
                Ok(()) => {}
                Err(e) => rep.problem("corrupt-record", e.to_string()),
            }
        }
        let mut leaked: Vec<(u64, u64)> = Vec::new();
        let mut used_free: Vec<(u64, u64)> = Vec::new();
        let push = |runs: &mut Vec<(u64, u64)>, u: u64| match runs.last_mut() {
            Some((s, n)) if *s + *n == u => *n += 1,
            _ => runs.push((u, 1)),
        };
        let mut free_units = 0;
        for u in 0..geo.units {
            match (used.get(u), committed.get(u)) {
                (true, false) => push(&mut used_free, u),
                (false, true) => push(&mut leaked, u),
                (false, false) => free_units += 1,
                (true, true) => {}
            }
        }
        rep.free_bytes = free_units * geo.unit;
        for (s, n) in used_free {
            rep.problem(
                "used-but-free",
                format!(
                    "units {s}..{} (offset {}) are referenced by objects but marked free",
                    s + n,
                    s * geo.unit
                ),
            );
        }
        for (s, n) in leaked {
            rep.problem(
                "leaked",
                format!(
                    "units {s}..{} (offset {}, {} bytes) are allocated but referenced by no object",
                    s + n,
                    s * geo.unit,
                    n * geo.unit
                ),
            );
        }

        let mut orphan_omap: BTreeMap<u64, u64> = BTreeMap::new();
        for r in inner.meta.prefix([keys::OMAP]) {
            let (k, _) = r.map_err(kv_err)?;
            rep.omap_entries += 1;
            match keys::omap_key_nid(&k) {
                Some(nid) if nids.contains(&nid) => {}
                Some(nid) => *orphan_omap.entry(nid).or_default() += 1,
                None => rep.problem("corrupt-record", format!("bad omap key {k:02x?}")),
            }
        }
        for (nid, n) in orphan_omap {
            rep.problem(
                "orphan-omap",
                format!("{n} omap entries belong to nid {nid}, which no object has"),
            );
        }
        let mut orphan_shards: BTreeMap<u64, u64> = BTreeMap::new();
        for r in inner.meta.prefix([keys::CSUM_SHARD]) {
            let (k, _) = r.map_err(kv_err)?;
            match keys::decode_csum_shard_key(&k) {
                Some(id) if shards.contains(&id) => {}
                Some((nid, _)) => *orphan_shards.entry(nid).or_default() += 1,
                None => rep.problem("corrupt-record", format!("bad checksum shard key {k:02x?}")),
            }
        }
        for (nid, n) in orphan_shards {
            rep.problem(
                "orphan-csum-shard",
                format!("{n} checksum shards belong to nid {nid}, whose record does not use them"),
            );
        }
        let counted = match inner.meta.get(keys::INLINE_BYTES).map_err(kv_err)? {
            None => Some(0),
            Some(v) => <[u8; 8]>::try_from(&v[..]).ok().map(u64::from_be_bytes),
        };
        if counted != Some(rep.inline_bytes) {
            rep.problem(
                "inline-bytes",
                format!(
                    "objects hold {} bytes of inline data, the store counts {counted:?}",
                    rep.inline_bytes
                ),
            );
        }
        if let Some(v) = inner.meta.get(keys::NEXT_NID).map_err(kv_err)? {
            let next = <[u8; 8]>::try_from(&v[..])
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            if next <= max_nid {
                rep.problem(
                    "nid",
                    format!("next nid {next} is not above the largest in use {max_nid}"),
                );
            }
        }
        Ok(rep)
    }
}
