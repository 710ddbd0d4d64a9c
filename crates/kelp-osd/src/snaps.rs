//! Self-managed snapshots on the PG's primary: reading a head's snapshot state from the store,
//! separating a client's snapshot modifiers from its ops, and answering what a read at a
//! snapshot reads. The decisions are `crate::snapset`'s (pure); the service calls these before
//! its read and write paths, so clones, whiteouts and snapsets then travel as ordinary ops.

use std::collections::BTreeSet;

use kelp_proto::{ErrorCode, ObjectLocator, OpKind, SnapSetInfo};
use kelp_store::{CollectionId, ObjectStore, StoreError};

use crate::exec::ExecError;
use crate::snapset::{self, HeadFacts, SnapContext, SnapSet, SnapTarget};

fn err<T>(code: ErrorCode, message: impl Into<String>) -> Result<T, ExecError> {
    Err(ExecError {
        code,
        message: message.into(),
    })
}

/// The snapshot modifiers of a client's op, taken out of its op list.
#[derive(Debug, Clone, Default)]
pub(crate) struct SnapRequest {
    pub snapc: Option<SnapContext>,
    pub read_snap: Option<u64>,
    pub list_snaps: bool,
    /// The background trimmer's op (`SnapTrim`).
    pub trim: bool,
}

/// Whether an op list needs the snapshot handling at all (pools without snapshots skip it).
pub(crate) fn mentions_snapshots(ops: &[OpKind]) -> bool {
    ops.iter().any(|o| {
        o.is_snap_modifier()
            || o.is_internal()
            || matches!(o, OpKind::ListSnaps | OpKind::Rollback { .. })
    })
}

/// Takes the snapshot modifiers (`SnapContext`, `ReadAtSnap`, `ListSnaps`) out of `ops`;
/// refuses internal ops unless the OSD itself sent them (`internal`).
pub(crate) fn split_ops(
    ops: Vec<OpKind>,
    internal: bool,
) -> Result<(SnapRequest, Vec<OpKind>), ExecError> {
    let mut req = SnapRequest::default();
    let mut rest = Vec::with_capacity(ops.len());
    for op in ops {
        match op {
            OpKind::SnapContext { seq, snaps } => {
                let snapc = SnapContext { seq, snaps };
                if !snapc.is_valid() {
                    return err(
                        ErrorCode::Invalid,
                        format!(
                            "invalid snapshot context: seq {} snaps {:?} (ids must descend, none above seq)",
                            snapc.seq, snapc.snaps
                        ),
                    );
                }
                req.snapc = Some(snapc);
            }
            OpKind::ReadAtSnap { snap } => req.read_snap = Some(snap),
            OpKind::ListSnaps => req.list_snaps = true,
            OpKind::SnapTrim if internal => req.trim = true,
            op if op.is_internal() && !internal => {
                return err(
                    ErrorCode::Invalid,
                    format!("{op:?} is an OSD-internal operation"),
                );
            }
            op => rest.push(op),
        }
    }
    if req.list_snaps && !rest.is_empty() {
        return err(ErrorCode::Invalid, "list-snaps is an op of its own");
    }
    let writes = rest.iter().any(OpKind::is_write) || req.trim;
    if writes && req.read_snap.is_some() {
        return err(
            ErrorCode::Invalid,
            "writes through a snapshot read context are refused (a snapshot is read-only)",
        );
    }
    Ok((req, rest))
}

/// Reads the head's snapshot state (blocking). `ec`: the logical size is the one in the shard
/// metadata.
pub(crate) fn read_head(
    store: &dyn ObjectStore,
    coll: CollectionId,
    head: &ObjectLocator,
    ec: bool,
) -> Result<HeadFacts, ExecError> {
    let oid = crate::exec::object_id(head);
    let attrs = match store.xattrs(coll, &oid) {
        Ok(a) => a,
        Err(StoreError::ObjectNotFound { .. }) => return Ok(HeadFacts::default()),
        Err(e) => return Err(e.into()),
    };
    let snapset = match attrs.get(snapset::SNAPSET_ATTR) {
        None => SnapSet::default(),
        Some(b) => match SnapSet::decode(b) {
            Some(s) => s,
            None => {
                return err(
                    ErrorCode::Corrupt,
                    format!("object '{}' has an unreadable snapset", head.name),
                );
            }
        },
    };
    let whiteout = attrs.contains_key(snapset::WHITEOUT_ATTR);
    let size = if whiteout {
        0
    } else if ec {
        match attrs.get(crate::ec::EC_ATTR) {
            Some(m) => crate::ec::EcMeta::decode(m)?.size,
            None => 0,
        }
    } else {
        store.stat(coll, &oid)?.size
    };
    Ok(HeadFacts {
        exists: !whiteout,
        whiteout,
        size,
        snapset,
    })
}

/// What a read on a head in a pool with snapshots does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadTarget {
    /// Read this object (the head, or a clone).
    Object(ObjectLocator),
    /// Answer `ListSnaps` with this.
    List(SnapSetInfo),
    NotFound(String),
}

pub(crate) fn read_target(
    head_loc: &ObjectLocator,
    head: &HeadFacts,
    req: &SnapRequest,
    removed: &BTreeSet<u64>,
) -> ReadTarget {
    if req.list_snaps && !head.exists && !head.whiteout {
        return ReadTarget::NotFound(format!("object '{}' does not exist", head_loc.name));
    }
    if req.list_snaps {
        return ReadTarget::List(head.snapset.info(head.exists.then_some(head.size)));
    }
    let absent = || ReadTarget::NotFound(format!("object '{}' does not exist", head_loc.name));
    match req.read_snap {
        None if head.exists => ReadTarget::Object(head_loc.clone()),
        None => absent(),
        Some(snap) => match snapset::resolve_read(head, snap, removed) {
            SnapTarget::Head => ReadTarget::Object(head_loc.clone()),
            SnapTarget::Clone(id) => ReadTarget::Object(snapset::clone_locator(head_loc, id)),
            SnapTarget::Absent => ReadTarget::NotFound(format!(
                "object '{}' did not exist at snapshot {snap}",
                head_loc.name
            )),
        },
    }
}

/// An erasure-coded write in a pool with snapshots: the client's ops go through the
/// erasure-code planner (`ec::plan_write`) as usual, and every member's shard ops get the
/// clone before and the snapset after; a rollback (or a write of nothing but the snapset)
/// needs no stripe planning: each member copies its own shard. The statistics delta counts
/// clones and whiteouts as stored objects, as `exec` does.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn plan_ec_write(
    profile: &kelp_ec::Profile,
    before: crate::ec::EcBefore,
    plan: &snapset::WritePlan,
    head: &HeadFacts,
    shards: usize,
    data: &bytes::Bytes,
    limits: &crate::exec::Limits,
    io: &dyn crate::ec::ShardIo,
) -> Result<crate::ec::EcWrite, ExecError> {
    let stored_before = i64::from(head.exists || head.whiteout);
    let mut w = if plan.restores.is_some() || plan.body.is_empty() {
        let restored = plan
            .restores
            .and_then(|id| plan.snapset.clones.iter().find(|c| c.id == id))
            .map(|c| c.size);
        let stat_delta = match restored {
            Some(size) => crate::exec::StatDelta {
                objects: 1 - stored_before,
                bytes: size as i64 - head.size as i64,
            },
            None if head.whiteout && !snapset::keeps_whiteout(&plan.snapset) => {
                crate::exec::StatDelta {
                    objects: -1,
                    bytes: 0,
                }
            }
            None => crate::exec::StatDelta::default(),
        };
        crate::ec::EcWrite {
            shards: (0..shards)
                .map(|_| crate::ec::ShardOps {
                    ops: plan.body.clone(),
                    data: bytes::BytesMut::new(),
                })
                .collect(),
            after: None,
            stat_delta,
        }
    } else {
        let mut w = crate::ec::plan_write(profile, before, &plan.body, data, limits, io).await?;
        // The planner saw a whiteout as no object, and does not know the whiteout a removal
        // with clones left becomes.
        if head.whiteout {
            w.stat_delta.objects -= 1;
        }
        if w.after.is_none() && snapset::keeps_whiteout(&plan.snapset) {
            w.stat_delta.objects += 1;
        }
        w
    };
    if let Some(c) = &plan.clone {
        w.stat_delta.objects += 1;
        w.stat_delta.bytes += c.size as i64;
    }
    for shard in &mut w.shards {
        let mut ops = plan.pre.clone();
        ops.append(&mut shard.ops);
        ops.extend(plan.post.iter().cloned());
        shard.ops = ops;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_may_not_send_internal_ops_and_snapshots_are_read_only() {
        assert!(split_ops(vec![OpKind::SnapClone { clone: 1 }], false).is_err());
        assert!(split_ops(vec![OpKind::SnapTrim], false).is_err());
        assert!(split_ops(vec![OpKind::SnapTrim], true).unwrap().0.trim);
        assert!(
            split_ops(
                vec![OpKind::ReadAtSnap { snap: 1 }, OpKind::WriteFull { len: 0 }],
                false
            )
            .is_err()
        );
        assert!(
            split_ops(
                vec![OpKind::SnapContext {
                    seq: 1,
                    snaps: vec![2]
                }],
                false
            )
            .is_err()
        );
        let (req, rest) = split_ops(
            vec![
                OpKind::SnapContext {
                    seq: 2,
                    snaps: vec![2, 1],
                },
                OpKind::WriteFull { len: 3 },
            ],
            false,
        )
        .unwrap();
        assert_eq!(req.snapc.unwrap().seq, 2);
        assert_eq!(rest, vec![OpKind::WriteFull { len: 3 }]);
    }

    #[test]
    fn reads_of_a_whiteout_find_nothing_but_its_snapshots_do() {
        let loc = ObjectLocator {
            pool: 1,
            namespace: String::new(),
            key: None,
            name: "o".into(),
        };
        let head = HeadFacts {
            exists: false,
            whiteout: true,
            size: 0,
            snapset: SnapSet {
                seq: 2,
                clones: vec![snapset::CloneInfo {
                    id: 2,
                    snaps: vec![2],
                    size: 9,
                }],
            },
        };
        let none = BTreeSet::new();
        assert!(matches!(
            read_target(&loc, &head, &SnapRequest::default(), &none),
            ReadTarget::NotFound(_)
        ));
        let at2 = SnapRequest {
            read_snap: Some(2),
            ..SnapRequest::default()
        };
        assert_eq!(
            read_target(&loc, &head, &at2, &none),
            ReadTarget::Object(snapset::clone_locator(&loc, 2))
        );
        let list = SnapRequest {
            list_snaps: true,
            ..SnapRequest::default()
        };
        assert_eq!(
            read_target(&loc, &head, &list, &none),
            ReadTarget::List(SnapSetInfo {
                seq: 2,
                head_size: None,
                clones: vec![(2, vec![2], 9)]
            })
        );
    }
}
