//! The I/O side of the erasure-coded backend (`crate::ec` makes the decisions): reading a
//! shard from this OSD's store or from another member over `Peers`, and the attributes an EC
//! object's primary shard carries.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use kelp_proto::{EcRead, EcReadReply, ErrorCode, ObjectLocator};
use kelp_store::{CollectionId, ObjectId, ObjectStore, StoreError};
use kelp_types::PgId;

use crate::ec::{EC_ATTR, EcMeta, EcObjectAttrs, ShardBytes, ShardIo};
use crate::exec::ExecError;
use crate::host::Peers;

const VERSION_ATTR: &str = "@v";
const MTIME_ATTR: &str = "@m";
const USER_PREFIX: &str = "_";

fn u64_of(v: Option<&Vec<u8>>) -> u64 {
    v.and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map_or(0, u64::from_le_bytes)
}

/// Which OSD holds which shard of a PG of an erasure-coded pool: position `i` of the acting
/// set holds shard `i` (`None`: a hole, no OSD serves that shard).
pub fn positions(m: &kelp_maps::PgMapping) -> Vec<Option<i32>> {
    m.acting_shards()
        .iter()
        .map(|&o| (o != kelp_maps::ITEM_NONE && o >= 0).then_some(o))
        .collect()
}

/// The shard position `osd` holds, if any.
pub fn position(members: &[Option<i32>], osd: i32) -> Option<usize> {
    members.iter().position(|&m| m == Some(osd))
}

/// The members that may be read: the primary itself, the members it writes to, and donors
/// (members left behind whose objects are another position's shards: each object says which
/// shard it is). Other members left behind for recovery are not.
pub(crate) fn readable(
    members: &[Option<i32>],
    me: i32,
    state: &crate::pg::PgState,
) -> Vec<Option<i32>> {
    members
        .iter()
        .map(|m| m.filter(|&o| o == me || state.write_to.contains(&o) || state.donors.contains(&o)))
        .collect()
}

/// Every stored attribute of an object, Kelp's own included.
pub type RawXattrs = Vec<(String, Vec<u8>)>;

/// An EC object's attributes as this OSD's shard holds them, and every stored attribute as is
/// (blocking: store I/O).
pub fn local_state(
    store: &dyn ObjectStore,
    coll: CollectionId,
    oid: &ObjectId,
) -> Result<(EcObjectAttrs, RawXattrs), ExecError> {
    let attrs = local_attrs(store, coll, oid)?;
    if !attrs.exists {
        return Ok((attrs, Vec::new()));
    }
    let raw = store.xattrs(coll, oid)?.into_iter().collect();
    Ok((attrs, raw))
}

/// An EC object's attributes as this OSD's shard holds them (blocking: store I/O).
pub fn local_attrs(
    store: &dyn ObjectStore,
    coll: CollectionId,
    oid: &ObjectId,
) -> Result<EcObjectAttrs, ExecError> {
    let attrs = match store.xattrs(coll, oid) {
        Ok(a) => a,
        Err(StoreError::ObjectNotFound { .. }) => return Ok(EcObjectAttrs::default()),
        Err(e) => return Err(e.into()),
    };
    let meta = attrs.get(EC_ATTR).map(|b| EcMeta::decode(b)).transpose()?;
    let xattrs: BTreeMap<String, Vec<u8>> = attrs
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(USER_PREFIX)
                .map(|n| (n.to_string(), v.clone()))
        })
        .collect();
    Ok(EcObjectAttrs {
        exists: true,
        version: u64_of(attrs.get(VERSION_ATTR)),
        mtime_ns: u64_of(attrs.get(MTIME_ATTR)),
        meta,
        xattrs,
    })
}

/// Reads `ranges` of this OSD's shard of an object (blocking), each padded with zeros to its
/// length. A shard failing its checksum is an error (`Corrupt`): the caller rebuilds it.
pub fn read_local_shard(
    store: &dyn ObjectStore,
    coll: CollectionId,
    oid: &ObjectId,
    ranges: &[(u64, u64)],
) -> Result<(EcReadReply, Bytes), ExecError> {
    let attrs = match store.xattrs(coll, oid) {
        Ok(a) => a,
        Err(StoreError::ObjectNotFound { .. }) => {
            let data = ranges.iter().map(|r| r.1 as usize).sum();
            return Ok((
                EcReadReply {
                    error: None,
                    exists: false,
                    version: 0,
                    meta: None,
                },
                Bytes::from(vec![0; data]),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let data = if let [(offset, len)] = ranges {
        // One range (the usual read): the store's own read buffer is the reply, no copy.
        let got = store.read_bytes(coll, oid, *offset, *len)?;
        if got.len() as u64 == *len {
            got
        } else {
            let mut padded = Vec::from(got);
            padded.resize(*len as usize, 0);
            Bytes::from(padded)
        }
    } else {
        let mut data = Vec::with_capacity(ranges.iter().map(|r| r.1 as usize).sum());
        for &(offset, len) in ranges {
            let got = store.read(coll, oid, offset, len)?;
            let n = got.len().min(len as usize);
            data.extend_from_slice(&got[..n]);
            data.resize(data.len() + (len as usize - n), 0);
        }
        Bytes::from(data)
    };
    Ok((
        EcReadReply {
            error: None,
            exists: true,
            version: u64_of(attrs.get(VERSION_ATTR)),
            meta: attrs.get(EC_ATTR).cloned(),
        },
        data,
    ))
}

/// Whether a read of `ranges` of a shard is worth trying on the async worker first
/// (`kelp_store::nowait::attempt`): a range larger than the store serves without blocking is
/// always refused there, after the object's lookup for nothing (a 4 MiB read of a 4+2 pool
/// asks each shard for 1 MiB), so such a read goes straight to a blocking thread.
pub(crate) fn try_without_blocking(ranges: &[(u64, u64)]) -> bool {
    ranges
        .iter()
        .all(|&(_, len)| kelp_store::nowait::may_read(len))
}

/// [`read_local_shard`] from async code: on the calling worker when the store can answer
/// from memory ([`try_without_blocking`], then `kelp_store::nowait::attempt`), else on a
/// blocking thread.
pub async fn read_local_shard_async(
    store: Arc<dyn ObjectStore>,
    coll: CollectionId,
    oid: ObjectId,
    ranges: Vec<(u64, u64)>,
) -> Result<(EcReadReply, Bytes), ExecError> {
    let small = try_without_blocking(&ranges);
    let read = move || read_local_shard(&*store, coll, &oid, &ranges);
    if small && let Some(r) = kelp_store::nowait::attempt(read.clone()) {
        return r;
    }
    tokio::task::spawn_blocking(read)
        .await
        .map_err(|e| ExecError {
            code: ErrorCode::Io,
            message: format!("shard read task failed: {e}"),
        })?
}

/// Splits a shard read's data segment into its ranges (views of it, no copy).
fn split_ranges(data: &Bytes, ranges: &[(u64, u64)]) -> Result<Vec<Bytes>, ExecError> {
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    if data.len() as u64 != total {
        return Err(ExecError {
            code: ErrorCode::Io,
            message: format!("a shard read returned {} bytes, not {total}", data.len()),
        });
    }
    let mut at = 0usize;
    Ok(ranges
        .iter()
        .map(|&(_, len)| {
            let b = data.slice(at..at + len as usize);
            at += len as usize;
            b
        })
        .collect())
}

/// The shards of one object of one PG, as its primary (or a member rebuilding a shard) reaches
/// them: position `i` of `members` holds shard `i`.
pub struct PgShardIo {
    pub me: i32,
    pub store: Arc<dyn ObjectStore>,
    pub coll: CollectionId,
    pub oid: ObjectId,
    pub pg: PgId,
    pub epoch: u32,
    pub object: ObjectLocator,
    /// Per shard position: the member holding it and where it listens, if it may be read.
    pub members: Vec<Option<(i32, Option<SocketAddr>)>>,
    pub peers: Arc<dyn Peers>,
    /// Members answer once they have applied the PG's log up to this version.
    pub after_version: u64,
}

#[async_trait::async_trait]
impl ShardIo for PgShardIo {
    fn readable(&self) -> Vec<bool> {
        self.members.iter().map(Option::is_some).collect()
    }

    async fn read_shard(
        &self,
        shard: usize,
        ranges: &[(u64, u64)],
    ) -> Result<ShardBytes, ExecError> {
        let Some(Some((osd, addr))) = self.members.get(shard) else {
            return Err(ExecError {
                code: ErrorCode::Io,
                message: format!("shard {shard} has no readable member"),
            });
        };
        let (reply, data) = if *osd == self.me {
            read_local_shard_async(
                self.store.clone(),
                self.coll,
                self.oid.clone(),
                ranges.to_vec(),
            )
            .await?
        } else {
            let Some(addr) = addr else {
                return Err(ExecError {
                    code: ErrorCode::Io,
                    message: format!("osd.{osd} has no address"),
                });
            };
            let req = EcRead {
                pg: self.pg,
                epoch: self.epoch,
                object: self.object.clone(),
                extents: ranges.to_vec(),
                after_version: self.after_version,
            };
            let (reply, data) =
                self.peers
                    .ec_read(*osd, *addr, req)
                    .await
                    .map_err(|e| ExecError {
                        code: ErrorCode::Io,
                        message: e.to_string(),
                    })?;
            (reply, data)
        };
        if let Some((code, message)) = reply.error {
            return Err(ExecError { code, message });
        }
        // A member whose position changed holds another position's shard until its backfill
        // rewrites the object: its bytes are that shard's.
        let held = match reply.meta.as_deref().filter(|_| reply.exists) {
            Some(meta) => EcMeta::decode(meta)?.shard as usize,
            None => shard,
        };
        Ok(ShardBytes {
            version: if reply.exists { reply.version } else { 0 },
            held,
            ranges: split_ranges(&data, ranges)?,
        })
    }
}

/// A member's answer to an `EcRead` as bytes on the wire.
pub fn reply_bytes(result: Result<(EcReadReply, Bytes), ExecError>) -> (EcReadReply, Bytes) {
    match result {
        Ok((reply, data)) => (reply, data),
        Err(e) => (
            EcReadReply {
                error: Some((e.code, e.message)),
                exists: false,
                version: 0,
                meta: None,
            },
            Bytes::new(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_shard_reads_skip_the_non_blocking_attempt() {
        let max = kelp_store::nowait::READ_MAX;
        assert!(try_without_blocking(&[]));
        assert!(try_without_blocking(&[(0, 4096)]));
        assert!(try_without_blocking(&[(0, max), (1 << 20, 4096)]));
        // 1 MiB: the shard of a 4 MiB read of a 4+2 pool.
        assert!(!try_without_blocking(&[(0, 1 << 20)]));
        assert!(!try_without_blocking(&[(0, 4096), (8192, max + 1)]));
    }
}
