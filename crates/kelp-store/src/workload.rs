//! Deterministic random workloads shared by the crash test (`tests/crash.rs` and its child
//! binary), the conformance tests and `kelp store bench`. A transaction is a pure function of
//! `(seed, id)`, so a test can regenerate exactly what a killed child submitted and replay it
//! against the in-memory model.

use std::collections::BTreeMap;

use crate::types::{CollectionId, ObjectId, Transaction};

/// SplitMix64 finaliser: a good 64-bit mix.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Small fast PRNG (SplitMix64 sequence). Not for cryptography.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix(self.0)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// `n` pseudo-random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// A placement hash for tests and benchmarks (the OSD passes the real CRUSH hash).
pub fn test_hash(name: &str) -> u32 {
    kelp_types::crc32c(name.as_bytes())
}

/// Collections used by the crash workload.
pub const CRASH_COLLS: [CollectionId; 2] = [
    CollectionId(kelp_types::PgId {
        pool: kelp_types::PoolId(1),
        seed: 0,
    }),
    CollectionId(kelp_types::PgId {
        pool: kelp_types::PoolId(1),
        seed: 1,
    }),
];

/// The object whose `txn` xattr records the id of the last applied crash transaction.
pub fn marker() -> ObjectId {
    ObjectId::new(1, "", "marker", 0)
}

fn crash_obj(i: u64) -> ObjectId {
    let name = format!("obj{i}");
    ObjectId::new(
        1,
        if i.is_multiple_of(3) { "ns" } else { "" },
        &name,
        test_hash(&name),
    )
}

/// Creates the crash workload's collections.
pub fn crash_setup() -> Transaction {
    let mut t = Transaction::new();
    for c in CRASH_COLLS {
        t.create_collection(c);
    }
    t
}

/// The last applied crash transaction id recorded in a store (0 if none).
pub fn crash_applied_id(store: &dyn crate::ObjectStore) -> crate::Result<u64> {
    match store.xattr(CRASH_COLLS[0], &marker(), "txn") {
        Ok(Some(v)) if v.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&v);
            Ok(u64::from_le_bytes(b))
        }
        Ok(_) => Ok(0),
        Err(crate::StoreError::ObjectNotFound { .. }) => Ok(0),
        Err(e) => Err(e),
    }
}

/// Transaction number `id` (>= 1) of the crash workload: 1-4 random operations mixing partial
/// and whole-unit writes, zeroing, truncation, removal, xattrs, omap and clones, always valid
/// whatever the current state, plus the marker update that makes partial application visible.
/// A third of the objects (`obj8`..`obj11`) stay mostly small: writes, zeroing and truncation
/// within the first 3 KiB, with an occasional write that grows them to several units, so the
/// store's inline data (objects up to 2 KiB), its growth into extents and its return by a
/// truncation are all exercised, also against clones of and onto large objects.
pub fn crash_txn(seed: u64, id: u64) -> Transaction {
    let mut r = Rng::new(splitmix(seed ^ id.wrapping_mul(0x2545_F491_4F6C_DD1D)));
    let mut t = Transaction::new();
    let nops = 1 + r.below(4);
    for _ in 0..nops {
        let coll = CRASH_COLLS[r.below(2) as usize];
        let i = r.below(12);
        let small = i >= 8;
        let o = crash_obj(i);
        match r.below(12) {
            0..=3 if small => {
                let off = r.below(2500);
                let len = match r.below(8) {
                    0 => 4096 + r.below(8000),
                    _ => 1 + r.below(1500),
                } as usize;
                t.write(coll, &o, off, r.bytes(len));
            }
            4 if small => {
                t.zero(coll, &o, r.below(3000), r.below(1500));
            }
            5 if small => {
                t.truncate(coll, &o, r.below(3000));
            }
            0..=3 => {
                let off = match r.below(3) {
                    0 => 0,
                    1 => r.below(300_000),
                    _ => r.below(64) * 4096,
                };
                let len = match r.below(4) {
                    0 => 1 + r.below(100),
                    1 => 4096,
                    2 => 4096 * (1 + r.below(16)),
                    _ => 1 + r.below(200_000),
                } as usize;
                t.write(coll, &o, off, r.bytes(len));
            }
            4 => {
                let off = r.below(300_000);
                let len = r.below(100_000);
                t.zero(coll, &o, off, len);
            }
            5 => {
                t.truncate(coll, &o, r.below(300_000));
            }
            6 => {
                t.touch(coll, &o).remove(coll, &o);
            }
            7 => {
                let name = format!("a{}", r.below(4));
                let len = r.below(64) as usize;
                t.touch(coll, &o).set_xattr(coll, &o, &name, r.bytes(len));
            }
            8 => {
                let mut m = BTreeMap::new();
                for _ in 0..1 + r.below(5) {
                    let vlen = r.below(100) as usize;
                    m.insert(format!("k{:03}", r.below(50)).into_bytes(), r.bytes(vlen));
                }
                t.touch(coll, &o).omap_set(coll, &o, m);
            }
            9 => {
                let keys = (0..1 + r.below(5))
                    .map(|_| format!("k{:03}", r.below(50)).into_bytes())
                    .collect();
                t.touch(coll, &o).omap_remove(coll, &o, keys);
            }
            10 => {
                t.touch(coll, &o);
                if r.below(2) == 0 {
                    t.omap_clear(coll, &o);
                } else {
                    let len = r.below(40) as usize;
                    t.omap_set_header(coll, &o, r.bytes(len));
                }
            }
            _ => {
                let dst = crash_obj(r.below(12));
                t.touch(coll, &o).clone_object(coll, &o, &dst);
            }
        }
    }
    let m = marker();
    t.touch(CRASH_COLLS[0], &m)
        .set_xattr(CRASH_COLLS[0], &m, "txn", id.to_le_bytes().to_vec());
    t
}

/// Full logical content of a store (for comparing two stores): per collection, per object:
/// (data, xattrs, omap header, omap).
#[allow(clippy::type_complexity)]
pub fn dump(
    store: &dyn crate::ObjectStore,
) -> crate::Result<
    BTreeMap<
        CollectionId,
        BTreeMap<
            ObjectId,
            (
                Vec<u8>,
                BTreeMap<String, Vec<u8>>,
                Option<Vec<u8>>,
                Vec<(Vec<u8>, Vec<u8>)>,
            ),
        >,
    >,
> {
    let mut out = BTreeMap::new();
    for c in store.list_collections()? {
        let mut objs = BTreeMap::new();
        let mut pos: Option<ObjectId> = None;
        loop {
            let page = store.list_objects(c, pos.as_ref(), 7)?;
            for o in page.objects {
                let size = store.stat(c, &o)?.size;
                let data = store.read(c, &o, 0, size)?;
                let x = store.xattrs(c, &o)?;
                let h = store.omap_header(c, &o)?;
                let mut omap = Vec::new();
                let mut after: Option<Vec<u8>> = None;
                loop {
                    let p = store.omap_iter(c, &o, after.as_deref(), 5)?;
                    after = p.entries.last().map(|e| e.0.clone());
                    omap.extend(p.entries);
                    if !p.more {
                        break;
                    }
                }
                objs.insert(o, (data, x, h, omap));
            }
            match page.next {
                Some(n) => pos = Some(n),
                None => break,
            }
        }
        out.insert(c, objs);
    }
    Ok(out)
}
