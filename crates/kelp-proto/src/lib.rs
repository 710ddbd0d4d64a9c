//! Kelp's wire messages. The messenger (`kelp-msgr`) moves frames of `(msg_type, meta, data)`;
//! this crate says what the `meta` of each `msg_type` contains. Bulk data (object payloads)
//! never goes through serde: it rides in the frame's `data` segment as `Bytes`, and a message's
//! metadata says how long each op's share of it is.
//!
//! Versioning: every `meta` starts with one version byte (`PROTO_VERSION`), followed by the
//! postcard encoding of the message. A receiver refuses versions it does not know with a clear
//! error instead of misreading them; a new field or variant means a new version, and the old
//! one stays readable (see `docs/RADOS.md`).

mod codec;
mod mon;
mod osd;
mod scrub;
mod stats;
mod watch;

pub use codec::{PROTO_VERSION, ProtoError, decode, encode};
pub use mon::{
    ActivationVerdict, BlocklistEntry, ClusterStatus, ConfigEntry, MapUpdate, MonCommand, MonReply,
    OsdBoot, OsdFailure, PgActivation, PgRecord, ServiceEntry, Subscribe,
};
// File-system map and MDS roles (types of the pure map in kelp-maps, used on the wire).
pub use mon::{FsInfo, FsMap, MdsAssignment, MdsBeacon, MdsInfo, MdsState};
// Manager, progress and cluster log.
pub use mon::{LogEntry, LogLevel, MgrInfo, MgrMap, ProgressItem, ProgressKind};
pub use osd::{
    CmpOp, EcRead, EcReadReply, ErrorCode, ListCursor, ObjectLocator, OpKind, OpResult, OsdOp,
    OsdOpReply, OsdPing, OsdPingReply, PgList, PgListReply, PgPull, PgPullReply, PgQuery,
    PgQueryReply, PgSync, PgSyncReply, RepOp, RepOpReply, SnapSetInfo, SyncLog, WireLogEntry,
};
pub use scrub::{
    InconsistentObject, OsdScrubCommand, OsdScrubReply, PgCommand, PgCommandKind, PgCommandReply,
    PgPush, PgPushReply, PgScrubSummary, ScrubMapReply, ScrubMapRequest, ScrubObject, ShardError,
    ShardReport,
};
pub use stats::{
    BackgroundWork, Fullness, IoCounters, IoRates, OsdPerf, OsdPerfStat, OsdSpace, OsdStatsReport,
    OsdStatsReportV1, OsdStatsReportV2, OsdSummary, PG_STATE_ORDER, PgMapDigest, PgMapTotals,
    PgScrubStat, PgStat, PgState, PgStateFlag, PgSummary, RecoveryCounters, RecoveryRates,
    StatsAck, UnknownPgState, pg_state_name,
};
pub use watch::{
    WatchEvent, WatchEventKind, WatchOp, WatchReply, WatchRequest, WatchResult, WatcherId,
};

/// Message types carried in the messenger's frame header.
pub mod msg_type {
    /// Client/daemon → monitor: a `MonCommand`; reply `MonReply`.
    pub const MON_COMMAND: u16 = 0x0100;
    /// Client/daemon → monitor: `Subscribe`; reply `MapUpdate`; later updates are pushed as
    /// one-way `MON_MAP_UPDATE` frames on the same connection.
    pub const MON_SUBSCRIBE: u16 = 0x0101;
    /// Monitor → subscriber (one-way push): `MapUpdate`.
    pub const MON_MAP_UPDATE: u16 = 0x0102;
    /// OSD → monitor: `OsdBoot`; reply `MonReply`.
    pub const MON_OSD_BOOT: u16 = 0x0103;
    /// OSD → leader monitor: `OsdStatsReport`; reply `MonReply::StatsAck` (or `NotLeader`).
    pub const MON_OSD_STATS: u16 = 0x0104;
    /// OSD → monitor: `OsdFailure` (a heartbeat peer is silent, or alive again); reply
    /// `MonReply` (`Done`, or `NotLeader`). Leader only.
    pub const MON_OSD_FAILURE: u16 = 0x0110;
    /// Monitor ↔ monitor: Raft traffic (opaque to this crate; encoded by kelp-mon).
    pub const MON_RAFT: u16 = 0x0180;
    /// Client → primary OSD: `OsdOp` (+ data); reply `OsdOpReply` (+ data).
    pub const OSD_OP: u16 = 0x0200;
    /// Primary → replica OSD: `RepOp` (+ data); reply `RepOpReply`.
    pub const OSD_REPOP: u16 = 0x0201;
    /// Client → primary OSD: `PgList`; reply `PgListReply`.
    pub const OSD_PGLS: u16 = 0x0202;
    /// Primary → member: `PgQuery`; reply `PgQueryReply` (peering).
    pub const OSD_PG_QUERY: u16 = 0x0210;
    /// Member → source: `PgPull`; reply `PgPullReply` + object data (recovery).
    pub const OSD_PG_PULL: u16 = 0x0211;
    /// Primary → member: `PgSync`; reply `PgSyncReply` (recovery).
    pub const OSD_PG_SYNC: u16 = 0x0212;
    /// Primary → member: `ScrubMapRequest`; reply `ScrubMapReply` (scrub).
    pub const OSD_SCRUB_MAP: u16 = 0x0220;
    /// Primary → member: `PgPush` + object data; reply `PgPushReply` (repair).
    pub const OSD_PG_PUSH: u16 = 0x0221;
    /// Client → primary OSD: `PgCommand`; reply `PgCommandReply` (scrub, repair, reports).
    pub const OSD_PG_COMMAND: u16 = 0x0222;
    /// Client → one OSD: `OsdScrubCommand`; reply `OsdScrubReply`.
    pub const OSD_SCRUB_COMMAND: u16 = 0x0223;
    /// OSD → OSD: `OsdPing`; reply `OsdPingReply` (peer heartbeats).
    pub const OSD_PING: u16 = 0x0224;
    /// Primary → member: `EcRead`; reply `EcReadReply` + shard bytes (erasure-coded pools).
    pub const OSD_EC_READ: u16 = 0x0230;
    /// Client → primary OSD: `WatchRequest` (+ payload); reply `WatchReply` (+ notify replies).
    pub const OSD_WATCH: u16 = 0x0240;
    /// Primary OSD → watching client (one-way push): `WatchEvent` (+ notify payload).
    pub const OSD_WATCH_EVENT: u16 = 0x0241;
}
