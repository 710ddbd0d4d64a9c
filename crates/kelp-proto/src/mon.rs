//! Messages between clients/daemons and the monitors.

use std::net::SocketAddr;

use kelp_maps::PoolSpec;
pub use kelp_maps::{FsInfo, FsMap, MdsAssignment, MdsBeacon, MdsInfo, MdsState};

use crate::stats::{PgMapDigest, StatsAck};
use serde::{Deserialize, Serialize};

/// A request to the monitors. Those that change cluster state go through the Raft log; the
/// reply says at which OSD map epoch the change is visible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MonCommand {
    Status,
    /// Registers an OSD (or returns the id of the one with this uuid). With `id`, that id is
    /// required (it must be free or already this uuid's).
    OsdCreate {
        id: Option<i32>,
        uuid: String,
        host: String,
        crush_weight: u32,
    },
    OsdDown {
        id: i32,
    },
    OsdOut {
        id: i32,
    },
    OsdIn {
        id: i32,
    },
    /// In/out weight, 16.16.
    OsdReweight {
        id: i32,
        weight: u32,
    },
    OsdRemove {
        id: i32,
    },
    PoolCreate(PoolSpec),
    PoolDelete {
        name: String,
    },
    PoolSet {
        name: String,
        key: String,
        value: String,
    },
    SetFlag {
        flag: String,
        on: bool,
    },
    ConfigSet {
        who: String,
        key: String,
        value: String,
    },
    ConfigRm {
        who: String,
        key: String,
    },
    ConfigDump,
    /// Returns the entity's secret, creating it if missing.
    AuthGetOrCreate {
        entity: String,
    },
    AuthRm {
        entity: String,
    },
    AuthList,
    /// The leader's statistics digest (PG states, usage, client I/O rates): answered from the
    /// OSDs' latest reports, held in the leader's memory only.
    PgStats,
    /// A PG's temporary acting set (`pg_temp`), asked for by the PG's primary while data moves:
    /// the members that have the PG's data keep serving it while new members are backfilled.
    /// An empty list removes it.
    PgTemp {
        pg: kelp_types::PgId,
        osds: Vec<i32>,
    },
    /// PG primaries, before a PG serves (or after a member joined its write set): record who
    /// holds every acknowledged write of the PG from now on. The monitors keep the latest
    /// record per PG and accept a new one only from a peering that heard from a member of the
    /// previous one (see `PgActivation`). Answered with `PgActivated`, one verdict per entry.
    PgActivate {
        activations: Vec<PgActivation>,
    },
    /// A PG's latest activation record (`PgRecord`), if any.
    PgRecordGet {
        pg: kelp_types::PgId,
    },
    /// Gives up on the data only `id` had (`kelp osd lost`): the OSD, which must be down, is
    /// taken out of every PG's activation record, so PGs waiting for it (`down`) peer with
    /// what the other OSDs have. Writes only it held are lost.
    OsdLost {
        id: i32,
    },
    // Variants are numbered by position on the wire: new ones go at the end.
    /// `kelp osd erasure-code-profile set NAME WORDS… [--force]`: creates a profile from
    /// `key=value` words (validated by the monitors, `kelp_ec::Profile::from_words`). Setting
    /// an existing profile to the same settings is a no-op; to different ones is refused
    /// unless `force` (pools made from it keep their own copy). Answered with `Done`.
    EcProfileSet {
        name: String,
        words: Vec<String>,
        force: bool,
    },
    /// One profile's `key=value` pairs: answered with `EcProfile`.
    EcProfileGet {
        name: String,
    },
    /// Every profile's name: answered with `EcProfileNames`.
    EcProfileLs,
    /// Removes a profile no pool was made from. Answered with `Done`.
    EcProfileRm {
        name: String,
    },
    /// `kelp osd blocklist add INSTANCE [EXPIRE]`: fences a client instance; OSDs refuse its
    /// ops from the answered epoch on. `expire_secs`: removed automatically after that long
    /// (the leader turns it into a wall-clock time). Answered with `Done`.
    BlocklistAdd {
        instance: String,
        expire_secs: Option<u64>,
    },
    /// `kelp osd blocklist rm INSTANCE`. Answered with `Done`.
    BlocklistRm {
        instance: String,
    },
    /// `kelp osd blocklist ls`: answered with `Blocklist`.
    BlocklistLs,
    /// Allocates a self-managed snapshot id in `pool` (the pool's `snap_seq + 1`): answered
    /// with `SnapId`.
    PoolSnapCreate {
        pool: String,
    },
    /// Marks self-managed snapshot `snap` of `pool` removed (its clones are trimmed in the
    /// background). Answered with `Done`.
    PoolSnapRemove {
        pool: String,
        snap: u64,
    },
    // File-system map and MDS roles (`kelp fs`, `kelp mds`).
    /// `kelp fs new NAME METADATA_POOL DATA_POOL [--force]`. Answered with `Done`.
    FsNew {
        name: String,
        metadata_pool: String,
        data_pool: String,
        /// Accept an erasure-coded default data pool.
        force: bool,
    },
    /// `kelp fs rm NAME`: refused while an MDS is active (fail the fs first). `Done`.
    FsRm {
        name: String,
    },
    /// `kelp fs set NAME KEY VALUE` (`max_mds`, `standby_count_wanted`, `joinable`). `Done`.
    FsSet {
        name: String,
        key: String,
        value: String,
    },
    /// `kelp fs add_data_pool NAME POOL`. `Done`.
    FsAddDataPool {
        name: String,
        pool: String,
    },
    /// `kelp fs rm_data_pool NAME POOL`. `Done`.
    FsRmDataPool {
        name: String,
        pool: String,
    },
    /// `kelp fs fail NAME`: fences and removes the active MDS, and lets no MDS take the file
    /// system until `fs set NAME joinable true`. `Done`.
    FsFail {
        name: String,
    },
    /// The file-system map: answered with `FsMap`.
    FsMapGet,
    /// An MDS's beacon (every `mds_beacon_interval`): answered with `MdsAssignment`.
    MdsBeacon(MdsBeacon),
    /// `kelp mds fail NAME`: as if its beacons had stopped (an active MDS is fenced and a
    /// standby takes its role). `Done`.
    MdsFail {
        name: String,
    },
    // --- service map (metrics): daemons say who they are and where their endpoints are ---
    /// A daemon's beacon for the service map, sent every few seconds (kept by the leader in
    /// memory; an entry not renewed goes `stale`, then away). `addrs` maps an endpoint's kind
    /// to its URL (`"metrics"` → `http://127.0.0.1:9283/metrics`). Answered with `Done`.
    ServiceBeacon {
        /// `osd.3`, `mon.a`, `rgw.gw1`, `nbd.0`, …
        name: String,
        /// `mon`, `osd`, `rgw`, `nbd`, `mgr`, `mds`, …
        kind: String,
        addrs: std::collections::BTreeMap<String, String>,
        version: String,
    },
    /// The service map: every daemon that sent a beacon recently. Answered with `ServiceMap`.
    ServiceMap,
    // Manager (kelp mgr), progress of long work and the cluster log.
    /// A manager daemon says it is alive (every second): `name` (`x` of `mgr.x`), where its
    /// dashboard listens, and a random id of this run (a restarted daemon is a new instance).
    /// The leader keeps the manager map (`MgrMap`) in memory and answers with `MgrBeacon`:
    /// whether this daemon is the active one.
    MgrBeacon {
        name: String,
        dashboard_url: String,
        instance: String,
    },
    /// The manager map: answered with `MgrMap`.
    MgrStat,
    /// The active manager publishes its progress items (replacing the previous list); a
    /// report from a manager that is not the active one is refused.
    ProgressReport {
        mgr: String,
        items: Vec<ProgressItem>,
    },
    /// The last progress items published: answered with `Progress`.
    ProgressGet,
    /// The newest `n` entries of the cluster log, oldest first: answered with `ClusterLog`.
    LogLast {
        n: u32,
    },
    /// Appends entries to the cluster log (`kelp log TEXT`, the manager's scrub-error events);
    /// their `seq` is assigned by the monitors, a zero `stamp_ms` is set by the leader.
    LogAppend {
        entries: Vec<LogEntry>,
    },
    // --- osd perf and manager fixes (observability) ---
    /// `kelp osd perf`: each OSD's recent commit and apply latency, from its latest stats
    /// report (answered by the leader from memory): `OsdPerf`.
    OsdPerf,
    /// An entity's secret: `Key`, or `Error` if it has none (never creates one, unlike
    /// `AuthGetOrCreate`: a reader cannot bring back an entity removed meanwhile).
    AuthGet {
        entity: String,
    },
    // --- device classes and replicated rules (file-system metadata on the fastest class) ---
    /// `osd crush set-device-class CLASS OSD...`: binds the OSDs to a device class (refused for
    /// an OSD of another class: remove that first): `Done`.
    CrushSetDeviceClass {
        class: String,
        osds: Vec<i32>,
    },
    /// `osd crush rm-device-class OSD...`: `Done`.
    CrushRmDeviceClass {
        osds: Vec<i32>,
    },
    /// `osd crush rule create-replicated NAME ROOT FAILURE_DOMAIN [CLASS]`: `Done` (also when
    /// a replicated rule of that name exists).
    CrushRuleCreateReplicated {
        name: String,
        root: String,
        failure_domain: String,
        class: Option<String>,
    },
}

/// One daemon in the service map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceEntry {
    pub name: String,
    pub kind: String,
    pub addrs: std::collections::BTreeMap<String, String>,
    pub version: String,
    /// Milliseconds since the leader last heard its beacon.
    pub age_ms: u64,
    /// Whether the beacon is older than the stale threshold (the daemon may be gone).
    pub stale: bool,
}

/// One blocklisted client instance, and when its entry expires (unix ms; `None`: never).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlocklistEntry {
    pub instance: String,
    pub expires: Option<u64>,
}

/// The members that held every acknowledged write of a PG when it last went active (the
/// monitors' `pg_history`). Written by the PG's primary through `PgActivate` before the PG
/// serves: any member of it has the PG's whole history from then on (every write a primary
/// acknowledges is on every member of its write set), so a later peering that hears from one
/// of them cannot miss an acknowledged write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgRecord {
    /// OSD map epoch the primary peered at.
    pub epoch: u32,
    /// The write set: the primary and the members in sync with it. Empty once every member
    /// was declared lost.
    pub members: Vec<i32>,
    /// The PG's `last_update` (epoch, version) when it went active: every member had at least
    /// this much.
    pub last_update: (u32, u64),
}

/// One primary's request to record a PG's new write set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgActivation {
    pub pg: kelp_types::PgId,
    pub primary: i32,
    /// The new record.
    pub record: PgRecord,
    /// The members whose logs this peering used, with their `last_update`.
    pub heard: Vec<(i32, (u32, u64))>,
}

/// The monitors' answer to one `PgActivation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActivationVerdict {
    /// Recorded: the PG may serve.
    Recorded,
    /// The peering heard from no member of the current record with its history: the PG must
    /// find one of them (or wait for one to come back) before it serves.
    Blocked { current: PgRecord },
    /// A record from a newer peering exists (this primary's map is old).
    Stale { current: PgRecord },
    /// The PG does not exist (pool deleted).
    NoSuchPg,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigEntry {
    /// `global`, a daemon type (`osd`, `mon`, `client`) or one daemon (`osd.3`).
    pub who: String,
    pub key: String,
    pub value: String,
}

/// A summary of the cluster as the monitors see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub fsid: String,
    pub epoch: u32,
    pub num_osds: u32,
    pub num_up_osds: u32,
    pub num_in_osds: u32,
    pub num_pools: u32,
    pub num_pgs: u32,
    pub flags: Vec<String>,
    /// Monitor names and whether each is in the quorum.
    pub monitors: Vec<(String, bool)>,
    pub leader: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MonReply {
    /// Done; the state is visible from this OSD map epoch on.
    Done {
        epoch: u32,
    },
    OsdId {
        id: i32,
        epoch: u32,
    },
    PoolId {
        id: u32,
        epoch: u32,
    },
    Status(ClusterStatus),
    Config(Vec<ConfigEntry>),
    /// An entity's secret, base64.
    Key {
        entity: String,
        secret: String,
    },
    Entities(Vec<String>),
    /// This monitor is not the leader; retry at `leader` (a monitor address) if known.
    NotLeader {
        leader: Option<SocketAddr>,
    },
    /// Refused, with a message for the operator.
    Error {
        message: String,
    },
    /// The statistics digest (`PgStats`).
    PgStats(Box<PgMapDigest>),
    /// A stats report was taken (`MON_OSD_STATS`).
    StatsAck(StatsAck),
    /// `PgActivate`'s verdicts, in request order.
    PgActivated(Vec<ActivationVerdict>),
    /// `PgRecordGet`.
    PgRecord(Option<PgRecord>),
    // New variants at the end (wire numbering).
    /// `EcProfileGet`: the profile as Ceph prints it, every key, sorted by key.
    EcProfile {
        name: String,
        pairs: Vec<(String, String)>,
    },
    /// `EcProfileLs`: profile names, sorted.
    EcProfileNames(Vec<String>),
    /// `BlocklistLs`, sorted by instance.
    Blocklist(Vec<BlocklistEntry>),
    /// `PoolSnapCreate`: the new snapshot id, visible from OSD map `epoch` on.
    SnapId {
        snap: u64,
        epoch: u32,
    },
    // File-system map and MDS roles.
    /// `FsMapGet`.
    FsMap(FsMap),
    /// The answer to an `MdsBeacon`.
    MdsAssignment(MdsAssignment),
    // --- service map (metrics) ---
    /// `ServiceMap`: every daemon with a recent beacon, sorted by name.
    ServiceMap(Vec<ServiceEntry>),
    // Manager (kelp mgr), progress of long work and the cluster log.
    /// `MgrBeacon`: whether the beaconing manager is the active one, and the map.
    MgrBeacon {
        active: bool,
        map: MgrMap,
    },
    /// `MgrStat`.
    MgrMap(MgrMap),
    /// `ProgressGet`.
    Progress(Vec<ProgressItem>),
    /// `LogLast`, oldest first.
    ClusterLog(Vec<LogEntry>),
    // --- osd perf (observability) ---
    /// `OsdPerf`: every OSD with a stats report, by id.
    OsdPerf(Vec<crate::stats::OsdPerfStat>),
}

/// Ask for OSD maps newer than `have_epoch` (0: send the full map), and for later ones to be
/// pushed on this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribe {
    pub have_epoch: u32,
}

/// OSD map updates: either a full map (encoded `kelp_maps::OsdMap`) or consecutive encoded
/// incrementals starting right after the subscriber's epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapUpdate {
    pub full: Option<Vec<u8>>,
    pub incrementals: Vec<Vec<u8>>,
}

/// An OSD reports that it is running and where it listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdBoot {
    pub id: i32,
    pub uuid: String,
    pub addr: SocketAddr,
}

/// OSD → monitor (`MON_OSD_FAILURE`): `reporter` has had no heartbeat answer from `target` for
/// `failed_for_ms` (past its `osd_heartbeat_grace`), or, with `alive`, has heard from it again
/// and withdraws its report. `target_up_from` is the epoch at which the reporter's map says the
/// target came up, so a report about an earlier incarnation is ignored. Reporters resend a
/// standing report every heartbeat interval (a new leader learns it within one interval).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdFailure {
    pub reporter: i32,
    pub target: i32,
    pub target_up_from: u32,
    pub failed_for_ms: u64,
    pub alive: bool,
}

/// One manager daemon in the manager map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MgrInfo {
    /// `x` of `mgr.x`.
    pub name: String,
    /// Where its dashboard listens (`http://127.0.0.1:8443/`); empty if it serves none.
    pub dashboard_url: String,
    /// The id of this run of the daemon.
    pub instance: String,
}

/// Which manager is active and which stand by (Ceph's `MgrMap`). Kept by the leader monitor
/// in memory, from the managers' beacons: a new leader rebuilds it within a beacon interval.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MgrMap {
    /// Grows by one whenever the active manager changes.
    pub epoch: u64,
    pub active: Option<MgrInfo>,
    pub standbys: Vec<MgrInfo>,
}

/// What kind of long work a progress item follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ProgressKind {
    /// Degraded object copies being recovered.
    Recovery,
    /// Misplaced object copies being moved (backfill, rebalancing).
    Backfill,
    Scrub,
    DeepScrub,
    SnapTrim,
    PoolDeletion,
    Reshard,
}

impl ProgressKind {
    pub fn name(self) -> &'static str {
        match self {
            ProgressKind::Recovery => "recovery",
            ProgressKind::Backfill => "backfill",
            ProgressKind::Scrub => "scrub",
            ProgressKind::DeepScrub => "deep-scrub",
            ProgressKind::SnapTrim => "snaptrim",
            ProgressKind::PoolDeletion => "pool-deletion",
            ProgressKind::Reshard => "reshard",
        }
    }
}

/// One long operation the manager follows (Ceph's progress events).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressItem {
    /// Stable while the operation lasts (`recovery-1700000000`).
    pub id: String,
    pub kind: ProgressKind,
    /// One line for people (`Recovering 120 degraded object copies`).
    pub message: String,
    /// Done so far, in millionths (0..=1 000 000).
    pub fraction_ppm: u32,
    /// Estimated seconds left (`None` while unknown).
    pub eta_secs: Option<u64>,
    /// Unix ms when it was first seen.
    pub started_ms: u64,
    /// Unix ms when it finished (kept in the list for a while after).
    pub finished_ms: Option<u64>,
}

impl ProgressItem {
    pub fn fraction(&self) -> f64 {
        f64::from(self.fraction_ppm.min(1_000_000)) / 1_000_000.0
    }
}

/// How much a cluster-log entry matters (Ceph's `[INF]`, `[WRN]`, `[ERR]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LogLevel {
    Info,
    Warn,
    Error,
}

impl LogLevel {
    /// `INF`, `WRN`, `ERR`.
    pub fn short(self) -> &'static str {
        match self {
            LogLevel::Info => "INF",
            LogLevel::Warn => "WRN",
            LogLevel::Error => "ERR",
        }
    }
}

/// One entry of the cluster log the monitors keep (`kelp log last`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Position in the log, from 1, without gaps.
    pub seq: u64,
    /// Unix ms, by the leader's clock.
    pub stamp_ms: u64,
    pub level: LogLevel,
    /// Who logged it (`mon.a`).
    pub who: String,
    pub message: String,
}
