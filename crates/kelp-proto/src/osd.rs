//! Messages between clients and OSDs, and between a PG's primary and its replicas.
//!
//! An `OsdOp` is a compound operation on one object, applied atomically: guards first
//! (`AssertExists`, `AssertVersion`, `CmpXattr`), then mutations in order, or reads. Payloads of
//! the ops that carry data (`len` fields) are consecutive slices of the frame's data segment, in
//! op order; read results come back the same way in the reply's data segment.

use kelp_types::PgId;
use serde::{Deserialize, Serialize};

/// Names an object: its pool, namespace, optional locator key (hashed instead of the name for
/// placement) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectLocator {
    pub pool: u32,
    pub namespace: String,
    pub key: Option<String>,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmpOp {
    Eq,
    Ne,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpKind {
    // -- guards: the whole op fails with `Canceled` (or `NotFound`) if one does not hold
    AssertExists,
    /// The object's version must be exactly this.
    AssertVersion {
        version: u64,
    },
    /// Compare an xattr with `len` bytes of data.
    CmpXattr {
        name: String,
        op: CmpOp,
        len: u64,
    },
    // -- mutations
    /// Fails with `Exists` if `exclusive` and the object exists.
    Create {
        exclusive: bool,
    },
    WriteFull {
        len: u64,
    },
    Write {
        offset: u64,
        len: u64,
    },
    Append {
        len: u64,
    },
    Truncate {
        size: u64,
    },
    Zero {
        offset: u64,
        len: u64,
    },
    Remove,
    SetXattr {
        name: String,
        len: u64,
    },
    RmXattr {
        name: String,
    },
    /// Keys with the lengths of their values (values in data, in order).
    OmapSet {
        entries: Vec<(String, u64)>,
    },
    OmapRm {
        keys: Vec<String>,
    },
    OmapClear,
    OmapSetHeader {
        len: u64,
    },
    // -- reads
    /// `len == 0` reads to the end.
    Read {
        offset: u64,
        len: u64,
    },
    Stat,
    GetXattr {
        name: String,
    },
    GetXattrs,
    /// Up to `max` entries with keys `> start_after` that start with `prefix`.
    OmapGetVals {
        start_after: String,
        prefix: String,
        max: u32,
    },
    OmapGetValsByKeys {
        keys: Vec<String>,
    },
    OmapGetHeader,
    // -- guards added later (kept last: variants are numbered on the wire)
    /// Compare the omap value of `key` with `len` bytes of data; `len: None` stands for "no
    /// such key", so `Eq` with `None` requires the key to be absent and `Ne` present.
    CmpOmap {
        key: String,
        op: CmpOp,
        len: Option<u64>,
    },
    // -- self-managed snapshots (after the older variants: numbered on the wire)
    /// The writer's snapshot context, first in a write: `seq` is the newest snapshot id the
    /// writer knows, `snaps` the pool's existing snapshot ids, newest first. The first write
    /// after a snapshot keeps the old object as a clone.
    SnapContext {
        seq: u64,
        snaps: Vec<u64>,
    },
    /// First in a read: read the object as it was at snapshot `snap`.
    ReadAtSnap {
        snap: u64,
    },
    /// A read: the object's snapshot set (its clones), answered as `Data` holding an encoded
    /// [`SnapSetInfo`].
    ListSnaps,
    /// A write: make the object what it was at snapshot `snap` (data, xattrs, omap), or
    /// remove it if it did not exist then.
    Rollback {
        snap: u64,
    },
    // -- internal: inserted by a PG's primary (refused from clients), executed by members
    /// Copy the head to its clone `clone` (same PG), before the write's mutations.
    SnapClone {
        clone: u64,
    },
    /// Make the head a copy of its clone `clone` (a rollback).
    SnapRestore {
        clone: u64,
    },
    /// Last in a write: the head's snapshot set after it (encoded). Without the object, a
    /// set that still has clones keeps a *whiteout* head.
    SnapSetHead {
        snapset: Vec<u8>,
    },
    /// The background snapshot trimmer: drop removed snapshots from the head's set (the
    /// primary resolves it into `SnapSetHead`).
    SnapTrim,
    // -- op flags (after the older variants: numbered on the wire)
    /// A modifier anywhere in a write (Ceph's `FULL_TRY`): the write may go past the full
    /// flag and the full ratio, up to the OSD's failsafe ratio. Sent by clients that must be
    /// able to free space on a full cluster (the file system's metadata server); the primary
    /// takes it out before the op runs.
    FullTry,
}

impl OpKind {
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            OpKind::Create { .. }
                | OpKind::WriteFull { .. }
                | OpKind::Write { .. }
                | OpKind::Append { .. }
                | OpKind::Truncate { .. }
                | OpKind::Zero { .. }
                | OpKind::Remove
                | OpKind::SetXattr { .. }
                | OpKind::RmXattr { .. }
                | OpKind::OmapSet { .. }
                | OpKind::OmapRm { .. }
                | OpKind::OmapClear
                | OpKind::OmapSetHeader { .. }
                | OpKind::Rollback { .. }
                | OpKind::SnapClone { .. }
                | OpKind::SnapRestore { .. }
                | OpKind::SnapSetHead { .. }
                | OpKind::SnapTrim
        )
    }

    /// Ops only a PG's primary may put into an op (refused from clients).
    pub fn is_internal(&self) -> bool {
        matches!(
            self,
            OpKind::SnapClone { .. }
                | OpKind::SnapRestore { .. }
                | OpKind::SnapSetHead { .. }
                | OpKind::SnapTrim
        )
    }

    /// The [`OpKind::FullTry`] modifier: neither reads nor writes by itself.
    pub fn is_full_try(&self) -> bool {
        matches!(self, OpKind::FullTry)
    }

    /// The snapshot modifiers of an op (`SnapContext`, `ReadAtSnap`): neither reads nor
    /// writes by themselves.
    pub fn is_snap_modifier(&self) -> bool {
        matches!(self, OpKind::SnapContext { .. } | OpKind::ReadAtSnap { .. })
    }

    /// Whether the op is allowed while the cluster (or the OSD) is full: reads, guards and the
    /// mutations that only remove (objects, attributes, omap keys). Removals commit on a full
    /// store because they need no data space (their metadata lives outside the data device).
    pub fn allowed_when_full(&self) -> bool {
        !self.is_write()
            || matches!(
                self,
                OpKind::Remove | OpKind::RmXattr { .. } | OpKind::OmapRm { .. } | OpKind::OmapClear
            )
    }

    /// Bytes of the request's data segment this op consumes.
    pub fn data_len(&self) -> u64 {
        match self {
            OpKind::CmpOmap { len, .. } => len.unwrap_or(0),
            OpKind::CmpXattr { len, .. }
            | OpKind::WriteFull { len }
            | OpKind::Write { len, .. }
            | OpKind::Append { len }
            | OpKind::SetXattr { len, .. }
            | OpKind::OmapSetHeader { len } => *len,
            OpKind::OmapSet { entries } => entries.iter().map(|(_, l)| *l).sum(),
            _ => 0,
        }
    }
}

/// A client's compound op on one object, sent to the PG's primary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdOp {
    /// Unique per client instance (with `instance`): lets a resent write be recognised.
    pub reqid: u64,
    /// The client's OSD map epoch: an OSD with a newer map tells a stale client to refresh.
    pub epoch: u32,
    pub pg: PgId,
    pub object: ObjectLocator,
    pub ops: Vec<OpKind>,
    /// The client instance sending it (`Rados::instance`, e.g. `client.admin.5f3a…`): OSDs
    /// refuse every op of an instance on the OSD map's blocklist.
    pub instance: String,
}

/// Why an op failed. Stable codes, mapped to S3/NBD/errno at the edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The object does not exist (ENOENT).
    NotFound,
    /// Exclusive create of an existing object (EEXIST).
    Exists,
    /// A guard did not hold (ECANCELED).
    Canceled,
    /// The object exists but the asked-for attribute does not (ENODATA).
    NoData,
    /// The pool does not exist.
    NoSuchPool,
    /// This OSD is not the PG's primary in its map, or the client's map is older: refresh
    /// the map and resend.
    Misdirected,
    /// The PG has fewer than `min_size` replicas up: it does not serve I/O until it has.
    Inactive,
    /// Object or op larger than allowed.
    TooBig,
    /// The cluster (or this OSD) is full.
    Full,
    /// The request is malformed.
    Invalid,
    /// A stored checksum did not match (the data is not returned).
    Corrupt,
    /// Any other I/O failure on the OSD.
    Io,
    /// The pool cannot do this (omap on an erasure-coded pool: EOPNOTSUPP).
    NotSupported,
    /// The client instance is on the OSD map's blocklist (fenced; ESHUTDOWN, Ceph's
    /// EBLOCKLISTED). Final: the instance must reconnect as a new one.
    Blocklisted,
}

/// An object's snapshot set as `ListSnaps` returns it (Ceph's `rados listsnaps`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapSetInfo {
    /// The newest snapshot id the object has seen written under.
    pub seq: u64,
    /// The head's size, `None` if the head does not exist (removed, or a whiteout).
    pub head_size: Option<u64>,
    /// The clones, oldest first: (clone id, snapshot ids it serves (descending), size).
    pub clones: Vec<(u64, Vec<u64>, u64)>,
}

/// Per-op outputs; read payloads are in the reply's data segment in op order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpResult {
    None,
    /// `len` bytes of data.
    Data {
        len: u64,
    },
    Stat {
        size: u64,
        mtime_ns: u64,
        version: u64,
    },
    /// Names and value lengths.
    Xattrs {
        entries: Vec<(String, u64)>,
    },
    /// Keys and value lengths; `more` if the listing was cut at `max`.
    Omap {
        entries: Vec<(String, u64)>,
        more: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdOpReply {
    /// `None` on success.
    pub error: Option<(ErrorCode, String)>,
    /// The object's version after the op (writes) or as read.
    pub version: u64,
    /// The OSD's map epoch.
    pub epoch: u32,
    pub outs: Vec<OpResult>,
}

/// The primary's instruction to a replica: apply exactly these (already checked and resolved)
/// mutations as PG log entry `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepOp {
    pub pg: PgId,
    pub epoch: u32,
    /// (epoch, version) of the PG log entry this write becomes.
    pub log_epoch: u32,
    pub log_version: u64,
    pub reqid: (String, u64),
    /// Modification time the primary stamped on the write, so replicas store the same.
    pub mtime_ns: u64,
    pub object: ObjectLocator,
    pub ops: Vec<OpKind>,
    /// Kelp's own attributes to set after `ops` if the object exists then (an erasure-coded
    /// object's shard metadata, `@ec`: each shard gets its own).
    pub internal_xattrs: Vec<(String, Vec<u8>)>,
}

/// Lists the objects of one PG (served by its primary), in placement-hash order.
/// (Members answer `PgQuery` with `want_objects` for backfill instead.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgList {
    pub pg: PgId,
    pub epoch: u32,
    /// Resume after this cursor (from the previous reply), or from the start.
    pub cursor: Option<ListCursor>,
    pub max: u32,
}

/// A position in a PG's object order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListCursor {
    pub hash: u32,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgListReply {
    pub error: Option<(ErrorCode, String)>,
    pub epoch: u32,
    /// (namespace, name) of each object.
    pub objects: Vec<(String, String)>,
    /// Where to resume; `None` when the PG is exhausted.
    pub next: Option<ListCursor>,
}

/// Peering: ask a member of a PG for its log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgQuery {
    pub pg: PgId,
    pub epoch: u32,
    /// Also list every object the member holds (for a backfill).
    pub want_objects: bool,
    /// The asking primary's `last_update`: a member at exactly this point has the same history
    /// and leaves its log entries out of the reply (peering after an OSD failure then ships no
    /// logs at all).
    pub have: (u32, u64),
}

/// One PG-log entry on the wire (the OSD's `LogEntry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireLogEntry {
    pub epoch: u32,
    pub version: u64,
    pub object: ObjectLocator,
    pub reqid: (String, u64),
    pub deleted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgQueryReply {
    pub error: Option<(ErrorCode, String)>,
    pub last_update: (u32, u64),
    pub log_tail: u64,
    pub entries: Vec<WireLogEntry>,
    /// Every object the member holds (only when asked for a backfill listing).
    pub objects: Option<Vec<(String, String)>>,
    /// Erasure-coded pools: the shard position the member's objects were written for, as its
    /// PG records it (`None`: not recorded).
    pub ec_shard: Option<u32>,
}

/// Recovery: fetch the complete state of one object of a PG.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgPull {
    pub pg: PgId,
    pub epoch: u32,
    pub namespace: String,
    pub name: String,
    /// Erasure-coded pools: the shard the puller holds; the source rebuilds that shard from
    /// the PG's other members. `None`: the source's own copy (replicated pools, and the
    /// members' own shards that a rebuild gathers).
    pub shard: Option<u32>,
}

/// An object's complete state; its data is the reply's data segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgPullReply {
    pub error: Option<(ErrorCode, String)>,
    pub exists: bool,
    pub size: u64,
    /// Every stored attribute, Kelp's own (`@v`, `@m`) included.
    pub xattrs: Vec<(String, Vec<u8>)>,
    pub omap_header: Option<Vec<u8>>,
    pub omap: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Recovery: bring this member's copy of a PG closer to the authoritative one. In order:
/// remove every local object not in `keep_only` (backfill), copy (or delete) `objects` from
/// `source` (up to `parallel` at a time), then adopt `log`. A large recovery is a series of
/// syncs: object batches without a log, the log last (so a member that crashes halfway keeps its
/// old log, and the next peering repeats the work).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgSync {
    pub pg: PgId,
    pub epoch: u32,
    pub source: i32,
    pub objects: Vec<(String, String)>,
    pub keep_only: Option<Vec<(String, String)>>,
    pub parallel: u32,
    pub log: Option<SyncLog>,
}

/// The log a member adopts at the end of a [`PgSync`]: it keeps its own entries through
/// `keep_through` (none when `None`, which also takes `log_tail`) and appends `entries`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncLog {
    pub keep_through: Option<u64>,
    pub entries: Vec<WireLogEntry>,
    pub log_tail: u64,
    pub last_update: (u32, u64),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgSyncReply {
    pub error: Option<(ErrorCode, String)>,
    /// Objects the source could not deliver because every in-sync copy failed its checksum
    /// (unfound). They were skipped, and the sync's log was not adopted (the member stays
    /// behind until they are found, overwritten or removed).
    pub unfound: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepOpReply {
    pub error: Option<(ErrorCode, String)>,
    pub epoch: u32,
}

/// OSD → OSD heartbeat (`OSD_PING`): "are you alive?", with the sender's map epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdPing {
    pub from: i32,
    pub epoch: u32,
}

/// The answer to an [`OsdPing`]: the answering OSD and its map epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdPingReply {
    pub osd: i32,
    pub epoch: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode, encode};

    #[test]
    fn messages_round_trip_and_versions_are_checked() {
        let op = OsdOp {
            reqid: 7,
            epoch: 12,
            pg: PgId::new(1, 0x1a5),
            object: ObjectLocator {
                pool: 1,
                namespace: String::new(),
                key: None,
                name: "obj".into(),
            },
            ops: vec![
                OpKind::AssertVersion { version: 3 },
                OpKind::Write {
                    offset: 4096,
                    len: 10,
                },
                OpKind::SetXattr {
                    name: "a".into(),
                    len: 2,
                },
            ],
            instance: "client.admin.1".into(),
        };
        let bytes = encode(&op);
        assert_eq!(decode::<OsdOp>(&bytes, "op").unwrap(), op);
        assert_eq!(op.ops.iter().map(OpKind::data_len).sum::<u64>(), 12);
        let mut wrong = bytes.clone();
        wrong[0] = 2;
        assert!(matches!(
            decode::<OsdOp>(&wrong, "op"),
            Err(crate::ProtoError::Version { got: 2 })
        ));
        assert!(decode::<OsdOp>(&bytes[..bytes.len() / 2], "op").is_err());
        assert!(decode::<OsdOp>(&[], "op").is_err());
    }

    #[test]
    fn watch_messages_round_trip() {
        use crate::{
            WatchEvent, WatchEventKind, WatchOp, WatchReply, WatchRequest, WatchResult, WatcherId,
        };
        let req = WatchRequest {
            reqid: 1,
            epoch: 9,
            pg: PgId::new(2, 3),
            object: ObjectLocator {
                pool: 2,
                namespace: String::new(),
                key: None,
                name: "img".into(),
            },
            instance: "client.admin.ab".into(),
            op: WatchOp::NotifyAck {
                notify_id: 77,
                cookie: 4,
            },
        };
        assert_eq!(decode::<WatchRequest>(&encode(&req), "w").unwrap(), req);
        let w = WatcherId {
            instance: "client.x.1".into(),
            cookie: 4,
        };
        let reply = WatchReply {
            error: Some((ErrorCode::Blocklisted, "fenced".into())),
            epoch: 9,
            result: WatchResult::Notified {
                acks: vec![(w.clone(), 3)],
                timed_out: vec![w.clone()],
            },
        };
        assert_eq!(decode::<WatchReply>(&encode(&reply), "r").unwrap(), reply);
        let ev = WatchEvent {
            cookie: 4,
            object: req.object.clone(),
            kind: WatchEventKind::Notify {
                notify_id: 77,
                notifier: "client.n.2".into(),
            },
        };
        assert_eq!(decode::<WatchEvent>(&encode(&ev), "e").unwrap(), ev);
    }
}

/// Erasure-coded pools, primary → member: read byte ranges of the member's shard of an object,
/// once the member has applied every PG-log entry up to `after_version` (so a partial-stripe
/// write reads the bytes its predecessors left).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcRead {
    pub pg: PgId,
    pub epoch: u32,
    pub object: ObjectLocator,
    /// (offset, length) in the shard; the data comes back concatenated, each range padded
    /// with zeros to its full length.
    pub extents: Vec<(u64, u64)>,
    pub after_version: u64,
}

/// A member's answer to `EcRead`: whether it has the object, the object's version there and
/// its shard metadata (`@ec`), and the bytes as the reply's data segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcReadReply {
    pub error: Option<(ErrorCode, String)>,
    pub exists: bool,
    pub version: u64,
    pub meta: Option<Vec<u8>>,
}
