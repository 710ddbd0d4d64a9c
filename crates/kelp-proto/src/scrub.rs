//! Scrub and repair messages: the primary asks each member of a PG for a *scrub map* of one
//! chunk of objects, compares them, and pushes the authoritative copy of a bad object to the
//! members that hold a bad one. Operators reach a PG's primary with `PgCommand` (scrub, deep
//! scrub, repair, list the inconsistencies) and an OSD with `OsdScrubCommand` (every PG it is
//! primary for).
//!
//! `PgScrubSummary` is the per-PG summary an OSD keeps (stamps, error counts, what is running);
//! its fields default, so it can be embedded in a later PG statistics report.

use kelp_types::PgId;
use serde::{Deserialize, Serialize};

use crate::osd::{ErrorCode, ListCursor, PgPullReply};

/// Primary → member: describe the objects in `[start, end)` (placement-hash order; `None`
/// bounds are the PG's beginning and end).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubMapRequest {
    pub pg: PgId,
    pub epoch: u32,
    pub start: Option<ListCursor>,
    pub end: Option<ListCursor>,
    /// Also read every byte (the store verifies its checksums) and digest the data.
    pub deep: bool,
}

/// What one member found for one object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubObject {
    pub hash: u32,
    pub namespace: String,
    pub name: String,
    pub size: u64,
    /// The object's version (its `@v` attribute; 0 if it has none).
    pub version: u64,
    /// crc32c over the object's attributes except the version, in name order.
    pub attrs_digest: u32,
    /// crc32c over the omap header and every (key, value), in key order.
    pub omap_digest: u32,
    /// crc32c of the data (deep scrub only).
    pub data_digest: Option<u32>,
    /// The store could not read the object (a checksum mismatch names the offset).
    pub read_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubMapReply {
    pub error: Option<(ErrorCode, String)>,
    pub objects: Vec<ScrubObject>,
}

/// Primary → member (repair): make the object exactly `state` (the data is the frame's data
/// segment); `state.exists == false` removes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgPush {
    pub pg: PgId,
    pub epoch: u32,
    /// The object's placement hash (from the scrub maps).
    pub hash: u32,
    pub namespace: String,
    pub name: String,
    pub state: PgPullReply,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgPushReply {
    pub error: Option<(ErrorCode, String)>,
}

/// What an operator asks of a PG (sent to its primary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PgCommandKind {
    /// Queue a scrub (`deep`: a deep scrub). Explicit requests ignore `noscrub`.
    Scrub { deep: bool },
    /// Queue a deep scrub that repairs what it finds.
    Repair,
    /// The current summary only.
    Status,
    /// The summary and every inconsistent object of the last scrub.
    ListInconsistent,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgCommand {
    pub pg: PgId,
    pub epoch: u32,
    pub kind: PgCommandKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgCommandReply {
    pub error: Option<(ErrorCode, String)>,
    pub epoch: u32,
    /// The answering primary.
    pub osd: i32,
    pub summary: PgScrubSummary,
    /// For `ListInconsistent`.
    pub inconsistent: Vec<InconsistentObject>,
    /// For `Scrub`/`Repair`: the request's sequence number; the request has completed once
    /// `summary.completed_seq >= queued_seq`.
    pub queued_seq: u64,
}

/// Client → OSD: act on every PG the OSD is primary for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OsdScrubCommand {
    /// Queue a scrub of each of them.
    Scrub { deep: bool },
    /// Only report their summaries.
    Summaries,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdScrubReply {
    pub error: Option<(ErrorCode, String)>,
    pub osd: i32,
    /// Each PG this OSD is acting primary for, with its summary.
    pub pgs: Vec<(PgId, PgScrubSummary)>,
}

/// Per-PG scrub state, kept by the primary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PgScrubSummary {
    /// Unix seconds of the last completed scrub (deep scrubs count); 0 = never.
    pub last_scrub_stamp: u64,
    /// Unix seconds of the last completed deep scrub; 0 = never.
    pub last_deep_scrub_stamp: u64,
    /// Errors the last scrub found (one per bad copy of an object), after any repair.
    pub num_scrub_errors: u64,
    /// Objects the last scrub found inconsistent, after any repair.
    pub num_objects_inconsistent: u64,
    /// Objects the last scrub found but could not repair (no good copy).
    pub num_objects_unrepairable: u64,
    /// Objects repaired by the last repair.
    pub num_objects_repaired: u64,
    /// A scrub is running now.
    pub scrubbing: bool,
    /// …and it is deep.
    pub deep: bool,
    /// …and it repairs.
    pub repair: bool,
    /// Highest request sequence number completed (see `PgCommandReply::queued_seq`).
    pub completed_seq: u64,
    /// Objects examined by the last completed scrub.
    pub objects_scrubbed: u64,
    /// Why the last scrub did not complete, if it did not.
    pub last_error: Option<String>,
}

impl PgScrubSummary {
    /// The states this summary adds to a PG's state (`scrubbing`, `deep`, `inconsistent`,
    /// `repair`).
    pub fn state(&self) -> crate::PgState {
        use crate::PgStateFlag as F;
        let mut s = crate::PgState::UNKNOWN;
        if self.num_objects_inconsistent > 0 {
            s.insert(F::Inconsistent);
        }
        if self.scrubbing {
            s.insert(F::Scrubbing);
            if self.deep {
                s.insert(F::Deep);
            }
            if self.repair {
                s.insert(F::Repair);
            }
        }
        s
    }

    /// The names of [`PgScrubSummary::state`], in Ceph's order.
    pub fn state_words(&self) -> Vec<&'static str> {
        self.state().names()
    }
}

/// One kind of damage to one copy of an object (Ceph's `rados list-inconsistent-obj` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ShardError {
    /// The member does not have the object.
    Missing,
    /// The member could not read it (checksum mismatch or I/O error).
    ReadError,
    SizeMismatch,
    VersionMismatch,
    AttrMismatch,
    OmapDigestMismatch,
    DataDigestMismatch,
    /// The member has an object the PG log says was deleted.
    Stale,
}

impl ShardError {
    pub fn name(self) -> &'static str {
        match self {
            ShardError::Missing => "missing",
            ShardError::ReadError => "read_error",
            ShardError::SizeMismatch => "size_mismatch",
            ShardError::VersionMismatch => "version_mismatch",
            ShardError::AttrMismatch => "attr_value_mismatch",
            ShardError::OmapDigestMismatch => "omap_digest_mismatch",
            ShardError::DataDigestMismatch => "data_digest_mismatch",
            ShardError::Stale => "stale",
        }
    }
}

/// One member's copy of an inconsistent object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardReport {
    pub osd: i32,
    pub primary: bool,
    /// Empty for a good copy.
    pub errors: Vec<ShardError>,
    /// What the member reported (`None` if it does not have the object).
    pub object: Option<ScrubObject>,
}

/// An object whose copies disagree, with the copy chosen as authoritative.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InconsistentObject {
    pub namespace: String,
    pub name: String,
    /// The member whose copy is authoritative; `None` if no copy is usable.
    pub auth_osd: Option<i32>,
    /// The authoritative version.
    pub version: u64,
    /// Union of the shards' errors.
    pub errors: Vec<ShardError>,
    pub shards: Vec<ShardReport>,
}

impl InconsistentObject {
    /// Members whose copy is bad.
    pub fn bad_osds(&self) -> Vec<i32> {
        self.shards
            .iter()
            .filter(|s| !s.errors.is_empty())
            .map(|s| s.osd)
            .collect()
    }
}
