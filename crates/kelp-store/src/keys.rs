//! The key schema of the metadata database. One flat, ordered key space; the first byte says
//! what a key is:
//!
//! | key | value |
//! |---|---|
//! | `S` | superblock copy (JSON, carries `format_version`) |
//! | `N` | next object number (`nid`), u64 big-endian |
//! | `C` pool:u32 seed:u32 | collection record (`codec::COLL_VERSION`) |
//! | `O` pool:u32 seed:u32 objkey | object record / onode (`codec::Onode`) |
//! | `M` nid:u64 `0x00` | omap header |
//! | `M` nid:u64 `0x01` key | omap value |
//! | `K` nid:u64 shard:u64 | checksums of an object's blocks `[shard * 64, shard * 64 + 64)` (`codec::CSUM_SHARD_BLOCKS`), for a version-3 object record |
//! | `B` chunk:u32 | allocation bitmap chunk (`codec::BITMAP_CHUNK_UNITS` units) |
//! | `D` seq:u64 | deferred writes of one commit batch, not yet known to be on the data device |
//!
//! `objkey` = hash:u32 pool:u32 esc(namespace) esc(name) snap:u64, integers big-endian and
//! strings escaped (`00` -> `00 FF`, terminated by `00 01`), so that byte order of keys equals
//! [`ObjectId`]'s `Ord`. Omap lives under the object's `nid`, not its name, so a PG split moves
//! only object records.

use kelp_types::{PgId, PoolId};

use crate::error::{Result, StoreError};
use crate::types::{CollectionId, ObjectId};

pub const SUPER: &[u8] = b"S";
pub const NEXT_NID: &[u8] = b"N";
/// Bytes of inline object data in the store (u64 big-endian; absent = 0), for `space`.
pub const INLINE_BYTES: &[u8] = b"I";
pub const COLL: u8 = b'C';
pub const OBJ: u8 = b'O';
pub const OMAP: u8 = b'M';
pub const CSUM_SHARD: u8 = b'K';
pub const BITMAP: u8 = b'B';
pub const DEFERRED: u8 = b'D';

/// Mask selecting the low `bits` bits of a placement hash.
pub fn split_mask(bits: u8) -> u32 {
    if bits >= 32 {
        u32::MAX
    } else {
        (1u32 << bits) - 1
    }
}

fn put_coll(k: &mut Vec<u8>, c: CollectionId) {
    k.extend_from_slice(&c.0.pool.0.to_be_bytes());
    k.extend_from_slice(&c.0.seed.to_be_bytes());
}

fn put_str(k: &mut Vec<u8>, s: &str) {
    for &b in s.as_bytes() {
        if b == 0 {
            k.extend_from_slice(&[0, 0xFF]);
        } else {
            k.push(b);
        }
    }
    k.extend_from_slice(&[0, 1]);
}

pub fn coll_key(c: CollectionId) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(COLL);
    put_coll(&mut k, c);
    k
}

pub fn decode_coll_key(k: &[u8]) -> Result<CollectionId> {
    if k.len() != 9 || k[0] != COLL {
        return Err(StoreError::corrupt(format!("bad collection key {k:02x?}")));
    }
    let pool = u32::from_be_bytes([k[1], k[2], k[3], k[4]]);
    let seed = u32::from_be_bytes([k[5], k[6], k[7], k[8]]);
    Ok(CollectionId(PgId::new(pool, seed)))
}

/// Prefix of every object key of a collection.
pub fn obj_prefix(c: CollectionId) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(OBJ);
    put_coll(&mut k, c);
    k
}

pub fn obj_key(c: CollectionId, o: &ObjectId) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + 24 + o.namespace.len() + o.name.len());
    k.push(OBJ);
    put_coll(&mut k, c);
    k.extend_from_slice(&o.hash.to_be_bytes());
    k.extend_from_slice(&o.pool.0.to_be_bytes());
    put_str(&mut k, &o.namespace);
    put_str(&mut k, &o.name);
    k.extend_from_slice(&o.snap.to_be_bytes());
    k
}

struct Cursor<'a> {
    b: &'a [u8],
}

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (h, t) = self.b.split_at_checked(N)?;
        self.b = t;
        h.try_into().ok()
    }
    fn string(&mut self) -> Option<String> {
        let mut out = Vec::new();
        loop {
            let (&b, rest) = self.b.split_first()?;
            self.b = rest;
            if b != 0 {
                out.push(b);
                continue;
            }
            let (&esc, rest) = self.b.split_first()?;
            self.b = rest;
            match esc {
                0xFF => out.push(0),
                1 => return String::from_utf8(out).ok(),
                _ => return None,
            }
        }
    }
}

/// Inverse of [`obj_key`].
pub fn decode_obj_key(k: &[u8]) -> Result<(CollectionId, ObjectId)> {
    let bad = || StoreError::corrupt(format!("bad object key {k:02x?}"));
    let mut c = Cursor { b: k };
    if c.take::<1>().ok_or_else(bad)? != [OBJ] {
        return Err(bad());
    }
    let pool = u32::from_be_bytes(c.take().ok_or_else(bad)?);
    let seed = u32::from_be_bytes(c.take().ok_or_else(bad)?);
    let hash = u32::from_be_bytes(c.take().ok_or_else(bad)?);
    let opool = u32::from_be_bytes(c.take().ok_or_else(bad)?);
    let namespace = c.string().ok_or_else(bad)?;
    let name = c.string().ok_or_else(bad)?;
    let snap = u64::from_be_bytes(c.take().ok_or_else(bad)?);
    if !c.b.is_empty() {
        return Err(bad());
    }
    Ok((
        CollectionId(PgId::new(pool, seed)),
        ObjectId {
            hash,
            pool: PoolId(opool),
            namespace,
            name,
            snap,
        },
    ))
}

pub fn omap_prefix(nid: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(OMAP);
    k.extend_from_slice(&nid.to_be_bytes());
    k
}

pub fn omap_header_key(nid: u64) -> Vec<u8> {
    let mut k = omap_prefix(nid);
    k.push(0);
    k
}

/// Prefix of all omap entries (not the header) of `nid`.
pub fn omap_entries_prefix(nid: u64) -> Vec<u8> {
    let mut k = omap_prefix(nid);
    k.push(1);
    k
}

pub fn omap_key(nid: u64, key: &[u8]) -> Vec<u8> {
    let mut k = omap_entries_prefix(nid);
    k.extend_from_slice(key);
    k
}

/// nid of any `M` key.
pub fn omap_key_nid(k: &[u8]) -> Option<u64> {
    if k.first() != Some(&OMAP) {
        return None;
    }
    Some(u64::from_be_bytes(k.get(1..9)?.try_into().ok()?))
}

/// Prefix of every checksum shard key of object `nid`.
pub fn csum_shard_prefix(nid: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(CSUM_SHARD);
    k.extend_from_slice(&nid.to_be_bytes());
    k
}

pub fn csum_shard_key(nid: u64, shard: u64) -> Vec<u8> {
    let mut k = csum_shard_prefix(nid);
    k.extend_from_slice(&shard.to_be_bytes());
    k
}

/// `(nid, shard)` of a `K` key.
pub fn decode_csum_shard_key(k: &[u8]) -> Option<(u64, u64)> {
    if k.len() != 17 || k[0] != CSUM_SHARD {
        return None;
    }
    Some((
        u64::from_be_bytes(k[1..9].try_into().ok()?),
        u64::from_be_bytes(k[9..17].try_into().ok()?),
    ))
}

pub fn bitmap_key(chunk: u32) -> Vec<u8> {
    let mut k = vec![BITMAP];
    k.extend_from_slice(&chunk.to_be_bytes());
    k
}

pub fn decode_bitmap_key(k: &[u8]) -> Result<u32> {
    match k {
        [BITMAP, a, b, c, d] => Ok(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => Err(StoreError::corrupt(format!("bad bitmap key {k:02x?}"))),
    }
}

pub fn deferred_key(seq: u64) -> Vec<u8> {
    let mut k = vec![DEFERRED];
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The smallest key strictly greater than every key starting with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xFF; prefix.len() + 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_keys_sort_like_object_ids_and_round_trip() {
        let c = CollectionId::new(1, 2);
        let mut ids = vec![
            ObjectId::new(1, "", "a", 5),
            ObjectId::new(1, "", "a\0", 5),
            ObjectId::new(1, "", "ab", 5),
            ObjectId::new(1, "", "a", 4),
            ObjectId::new(1, "ns", "", 5),
            ObjectId::new(1, "", "a", 5).with_snap(3),
            ObjectId::new(2, "", "", 5),
            ObjectId::new(1, "", "zz", u32::MAX),
            ObjectId::hash_start(5),
        ];
        ids.sort();
        let keys: Vec<Vec<u8>> = ids.iter().map(|o| obj_key(c, o)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        for (k, o) in keys.iter().zip(&ids) {
            assert_eq!(decode_obj_key(k).unwrap(), (c, o.clone()));
        }
        assert!(decode_obj_key(&keys[0][..keys[0].len() - 1]).is_err());
    }

    #[test]
    fn prefix_end_bounds_the_prefix() {
        assert_eq!(prefix_end(b"M\x00\xff"), b"M\x01".to_vec());
        assert!(
            obj_key(
                CollectionId::new(1, 0),
                &ObjectId::new(1, "", "x", u32::MAX)
            ) < prefix_end(&obj_prefix(CollectionId::new(1, 0)))
        );
    }
}
