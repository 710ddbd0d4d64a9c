//! An object's complete state as recovery and repair move it between members: read it whole
//! (`read_state`, blocking), install it in a transaction (`apply_state`), list a PG's objects
//! (`list_all`), and find a member's address (`peer_addr`). Shared by `recovery` (log
//! recovery and backfill) and `scrub` (repair), so neither depends on the other.

use std::collections::BTreeMap;

use bytes::Bytes;
use kelp_proto::PgPullReply;
use kelp_store::{CollectionId, ObjectId, ObjectStore, Op, StoreError, Transaction};
use kelp_types::PgId;

use crate::error::OsdError;
use crate::pglog::INTERNAL_NAMESPACE;

/// A snapshot clone is placed by its head's hash (`crate::snapset`).
pub(crate) fn oid_for(pg: PgId, namespace: &str, name: &str) -> ObjectId {
    let hash = match crate::snapset::parse_clone(namespace, name) {
        Some((ns, head, _)) => kelp_crush::object_hash(head, None, ns),
        None => kelp_crush::object_hash(name, None, namespace),
    };
    ObjectId::new(pg.pool.0, namespace, name, hash)
}

/// A pull's answer when the object cannot be served (`error`), or does not exist (`None`).
pub(crate) fn pull_reply(error: Option<(kelp_proto::ErrorCode, String)>) -> (PgPullReply, Bytes) {
    (
        PgPullReply {
            error,
            exists: false,
            size: 0,
            xattrs: Vec::new(),
            omap_header: None,
            omap: Vec::new(),
        },
        Bytes::new(),
    )
}

/// Reads an object's complete state (blocking).
pub(crate) fn read_state(
    store: &dyn ObjectStore,
    coll: CollectionId,
    oid: &ObjectId,
) -> Result<(PgPullReply, Bytes), StoreError> {
    let size = match store.stat(coll, oid) {
        Ok(st) => st.size,
        Err(StoreError::ObjectNotFound { .. }) => {
            return Ok((
                PgPullReply {
                    error: None,
                    exists: false,
                    size: 0,
                    xattrs: Vec::new(),
                    omap_header: None,
                    omap: Vec::new(),
                },
                Bytes::new(),
            ));
        }
        Err(e) => return Err(e),
    };
    let data = store.read(coll, oid, 0, size)?;
    let xattrs = store.xattrs(coll, oid)?.into_iter().collect();
    let omap_header = store.omap_header(coll, oid)?;
    let mut omap = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = store.omap_iter(coll, oid, after.as_deref(), 4096)?;
        let last = page.entries.last().map(|(k, _)| k.clone());
        omap.extend(page.entries);
        match last {
            Some(k) if page.more => after = Some(k),
            _ => break,
        }
    }
    Ok((
        PgPullReply {
            error: None,
            exists: true,
            size,
            xattrs,
            omap_header,
            omap,
        },
        Bytes::from(data),
    ))
}

/// Queues, in `txn`, making the local object exactly `state`.
pub(crate) fn apply_state(
    txn: &mut Transaction,
    coll: CollectionId,
    oid: &ObjectId,
    local_exists: bool,
    state: PgPullReply,
    data: Bytes,
) {
    if local_exists {
        txn.remove(coll, oid);
    }
    if !state.exists {
        return;
    }
    txn.touch(coll, oid);
    if !data.is_empty() {
        txn.write(coll, oid, 0, data.to_vec());
    }
    txn.truncate(coll, oid, state.size);
    if !state.xattrs.is_empty() {
        txn.push(Op::SetXattrs {
            coll,
            oid: oid.clone(),
            attrs: state.xattrs.into_iter().collect(),
        });
    }
    if let Some(h) = state.omap_header {
        txn.omap_set_header(coll, oid, h);
    }
    if !state.omap.is_empty() {
        txn.omap_set(
            coll,
            oid,
            state.omap.into_iter().collect::<BTreeMap<_, _>>(),
        );
    }
}

pub(crate) fn list_all(
    store: &dyn ObjectStore,
    coll: CollectionId,
) -> Result<Vec<ObjectId>, StoreError> {
    let mut out = Vec::new();
    let mut from: Option<ObjectId> = None;
    loop {
        let page = store.list_objects(coll, from.as_ref(), 1024)?;
        out.extend(
            page.objects
                .into_iter()
                .filter(|o| o.namespace != INTERNAL_NAMESPACE && o.snap == kelp_store::SNAP_HEAD),
        );
        match page.next {
            Some(n) => from = Some(n),
            None => return Ok(out),
        }
    }
}

/// Where `osd` listens, per `map`.
pub(crate) fn peer_addr(
    map: &kelp_maps::OsdMap,
    osd: i32,
) -> Result<std::net::SocketAddr, OsdError> {
    map.osds
        .get(&osd)
        .and_then(|o| o.addr)
        .ok_or_else(|| OsdError::PeerUnreachable {
            osd,
            reason: "it has no address".into(),
        })
}
