//! Object name → placement group → OSDs, as Ceph's OSDMap computes it for a pool:
//! hash the name (or locator key, prefixed by the namespace), fold the hash into `pg_num` with
//! `stable_mod`, turn the PG's seed into the CRUSH input (`pps`), and run the pool's rule.
//!
//! `stable_mod` is what lets `pg_num` grow one PG at a time: when it grows, only the objects of
//! the PG being split move, to the new PG.

use kelp_types::PgId;

use crate::error::Result;
use crate::hash::{crush_hash32_2, str_hash_rjenkins};
use crate::map::{CrushMap, ITEM_NONE, ItemId};

/// Separator between namespace and name in the hashed string (ASCII unit separator).
const NAMESPACE_SEPARATOR: u8 = 0x1f;

/// Ceph's `ceph_stable_mod`: `x mod b` for a `b` that is not a power of two, such that growing
/// `b` by one only remaps the values of one bucket. `bmask` is the next power of two minus one.
#[inline]
pub fn stable_mod(x: u32, b: u32, bmask: u32) -> u32 {
    if x & bmask < b {
        x & bmask
    } else {
        x & (bmask >> 1)
    }
}

/// The mask that goes with `pg_num` in `stable_mod`: `2^ceil(log2(pg_num)) - 1`.
pub fn pg_num_mask(pg_num: u32) -> u32 {
    if pg_num <= 1 {
        return 0;
    }
    let bits = 32 - (pg_num - 1).leading_zeros();
    if bits >= 32 {
        u32::MAX
    } else {
        (1u32 << bits) - 1
    }
}

/// The 32-bit placement hash of an object: of its locator `key` if set, else of its name, with
/// a non-empty namespace prepended as `namespace + '\x1f'`.
pub fn object_hash(name: &str, key: Option<&str>, namespace: &str) -> u32 {
    let base = key.filter(|k| !k.is_empty()).unwrap_or(name);
    if namespace.is_empty() {
        return str_hash_rjenkins(base.as_bytes());
    }
    let mut buf = Vec::with_capacity(namespace.len() + 1 + base.len());
    buf.extend_from_slice(namespace.as_bytes());
    buf.push(NAMESPACE_SEPARATOR);
    buf.extend_from_slice(base.as_bytes());
    str_hash_rjenkins(&buf)
}

/// The placement-relevant part of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPlacement {
    pub pool_id: u32,
    pub pg_num: u32,
    pub pgp_num: u32,
    /// Ceph's `hashpspool` flag (default on): mix the pool id into the CRUSH input so that
    /// pools do not all place PG n on the same OSDs.
    pub hashpspool: bool,
    pub crush_rule: u32,
    /// Replica count (or k+m for erasure-coded pools).
    pub size: usize,
    /// Erasure-coded pools keep positions (holes stay as `ITEM_NONE`).
    pub erasure: bool,
}

impl PoolPlacement {
    /// A replicated pool with `hashpspool`, `pgp_num == pg_num`.
    pub fn replicated(pool_id: u32, pg_num: u32, size: usize, crush_rule: u32) -> Self {
        PoolPlacement {
            pool_id,
            pg_num,
            pgp_num: pg_num,
            hashpspool: true,
            crush_rule,
            size,
            erasure: false,
        }
    }

    /// The PG an object belongs to.
    pub fn object_pg(&self, name: &str, key: Option<&str>, namespace: &str) -> PgId {
        let hash = object_hash(name, key, namespace);
        PgId::new(self.pool_id, self.raw_hash_to_ps(hash))
    }

    /// Folds a placement hash into a PG seed.
    pub fn raw_hash_to_ps(&self, hash: u32) -> u32 {
        stable_mod(hash, self.pg_num, pg_num_mask(self.pg_num))
    }

    /// The CRUSH input for a PG seed.
    pub fn pps(&self, ps: u32) -> u32 {
        let folded = stable_mod(ps, self.pgp_num, pg_num_mask(self.pgp_num));
        if self.hashpspool {
            crush_hash32_2(folded, self.pool_id)
        } else {
            folded.wrapping_add(self.pool_id)
        }
    }

    /// The raw CRUSH result for a PG seed, with `reweights` as the in/out vector.
    pub fn raw_osds(&self, map: &CrushMap, ps: u32, reweights: &[u32]) -> Result<Vec<ItemId>> {
        map.do_rule(self.crush_rule, self.pps(ps), self.size, reweights)
    }

    /// The up set: the raw set without OSDs that do not exist or are down (`is_up`). Replicated
    /// pools close the gaps; erasure-coded pools keep positions and mark them `ITEM_NONE`.
    pub fn up_osds(&self, raw: &[ItemId], is_up: impl Fn(ItemId) -> bool) -> Vec<ItemId> {
        if self.erasure {
            raw.iter()
                .map(|&o| {
                    if o != ITEM_NONE && is_up(o) {
                        o
                    } else {
                        ITEM_NONE
                    }
                })
                .collect()
        } else {
            raw.iter()
                .copied()
                .filter(|&o| o != ITEM_NONE && is_up(o))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(pg_num_mask(1), 0);
        assert_eq!(pg_num_mask(2), 1);
        assert_eq!(pg_num_mask(768), 1023);
        assert_eq!(pg_num_mask(256), 255);
        assert_eq!(pg_num_mask(257), 511);
    }

    #[test]
    fn stable_mod_is_mod_for_powers_of_two_and_stable_when_growing() {
        for x in 0..4096u32 {
            assert_eq!(stable_mod(x, 256, 255), x % 256);
        }
        // Growing pg_num from 12 to 13 moves only objects of PG (12 - 8) = 4 to the new PG 12.
        for x in 0..100_000u32 {
            let before = stable_mod(x, 12, pg_num_mask(12));
            let after = stable_mod(x, 13, pg_num_mask(13));
            assert!(before == after || (before == 4 && after == 12), "x={x}");
        }
    }
}
