//! Statistics the OSDs report to the monitors, and the cluster-wide digest the leader monitor
//! computes from them (what Ceph's `MPGStats` and the manager's `PGMap` are, kept simple).
//!
//! Each OSD sends an [`OsdStatsReport`] every `osd_stats_interval` to the leader monitor
//! (`msg_type::MON_OSD_STATS`): its store's capacity and usage, its cumulative client I/O
//! counters, and one [`PgStat`] per PG it is the acting primary of. The leader keeps the
//! latest report per OSD in memory only (not in the Raft log) and answers
//! `MonCommand::PgStats` with a [`PgMapDigest`].
//!
//! Recovery progress: each report carries the OSD's cumulative [`RecoveryCounters`] (objects
//! and bytes it pulled to bring PGs up to date); the leader turns successive counters into
//! [`RecoveryRates`] as it does for client I/O.
//!
//! Extending: the scrub machinery fills [`PgStat::scrub`] ([`PgScrubStat`]); new PG states are
//! appended to [`PgStateFlag`] (postcard encodes variants by position, so appending keeps old
//! encodings readable) and placed in [`PG_STATE_ORDER`].

use std::collections::BTreeMap;

use kelp_types::PgId;
use serde::{Deserialize, Serialize};

/// One PG state bit, with Ceph's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PgStateFlag {
    /// Serving I/O (peered with at least `min_size` members).
    Active,
    /// Every object on `size` members, where CRUSH wants them.
    Clean,
    /// Gathering the members' logs / bringing members up to date before going active.
    Peering,
    /// Peered but with fewer than `min_size` members: not serving I/O.
    Peered,
    /// Some objects have fewer than `size` copies.
    Degraded,
    /// Fewer than `size` members in the acting set.
    Undersized,
    Recovering,
    RecoveryWait,
    Backfilling,
    BackfillWait,
    BackfillToofull,
    /// The acting set differs from the up set (`pg_temp`).
    Remapped,
    /// A member that must be consulted is down.
    Down,
    /// No member has a complete history.
    Incomplete,
    /// The monitors have no recent report from the PG's primary.
    Stale,
    Scrubbing,
    /// With `Scrubbing`: a deep scrub.
    Deep,
    /// Scrub found replicas that disagree.
    Inconsistent,
    Repair,
}

/// The order Ceph prints state names in (`active+undersized+degraded`, `stale+active+clean`).
pub const PG_STATE_ORDER: &[PgStateFlag] = &[
    PgStateFlag::Stale,
    PgStateFlag::Active,
    PgStateFlag::Clean,
    PgStateFlag::RecoveryWait,
    PgStateFlag::Recovering,
    PgStateFlag::Down,
    PgStateFlag::Undersized,
    PgStateFlag::Degraded,
    PgStateFlag::Remapped,
    PgStateFlag::Scrubbing,
    PgStateFlag::Deep,
    PgStateFlag::Inconsistent,
    PgStateFlag::Peering,
    PgStateFlag::Repair,
    PgStateFlag::BackfillWait,
    PgStateFlag::Backfilling,
    PgStateFlag::BackfillToofull,
    PgStateFlag::Incomplete,
    PgStateFlag::Peered,
];

impl PgStateFlag {
    pub fn name(self) -> &'static str {
        match self {
            PgStateFlag::Active => "active",
            PgStateFlag::Clean => "clean",
            PgStateFlag::Peering => "peering",
            PgStateFlag::Peered => "peered",
            PgStateFlag::Degraded => "degraded",
            PgStateFlag::Undersized => "undersized",
            PgStateFlag::Recovering => "recovering",
            PgStateFlag::RecoveryWait => "recovery_wait",
            PgStateFlag::Backfilling => "backfilling",
            PgStateFlag::BackfillWait => "backfill_wait",
            PgStateFlag::BackfillToofull => "backfill_toofull",
            PgStateFlag::Remapped => "remapped",
            PgStateFlag::Down => "down",
            PgStateFlag::Incomplete => "incomplete",
            PgStateFlag::Stale => "stale",
            PgStateFlag::Scrubbing => "scrubbing",
            PgStateFlag::Deep => "deep",
            PgStateFlag::Inconsistent => "inconsistent",
            PgStateFlag::Repair => "repair",
        }
    }
}

impl PgStateFlag {
    /// The flag named `word` (Ceph's name, as [`PgStateFlag::name`] prints it).
    pub fn from_name(word: &str) -> Option<PgStateFlag> {
        PG_STATE_ORDER.iter().copied().find(|f| f.name() == word)
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// A PG's states as a set: the one place PG state names are composed and parsed.
///
/// `Display` prints Ceph's form (names joined by `+` in [`PG_STATE_ORDER`]: `active+clean`,
/// `stale+active+undersized+degraded`; `unknown` for the empty set) and `FromStr` reads it
/// back. On the wire a PG's states travel as a list of [`PgStateFlag`]s (`PgStat::state`) and
/// as this printed form (`PgSummary::state_name`); both convert to and from a `PgState`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PgState(u32);

/// A word that is not a PG state name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown PG state '{word}'")]
pub struct UnknownPgState {
    pub word: String,
}

impl PgState {
    /// No state: printed `unknown` (nothing reported).
    pub const UNKNOWN: PgState = PgState(0);
    /// `active+clean`: what every PG of a healthy, settled cluster is.
    pub const ACTIVE_CLEAN: PgState =
        PgState((1 << PgStateFlag::Active as u32) | (1 << PgStateFlag::Clean as u32));

    pub fn from_flags(flags: &[PgStateFlag]) -> PgState {
        flags.iter().fold(PgState::UNKNOWN, |s, f| s.with(*f))
    }

    /// This set and `flag`.
    #[must_use]
    pub fn with(self, flag: PgStateFlag) -> PgState {
        PgState(self.0 | flag.bit())
    }

    /// Both sets' states.
    #[must_use]
    pub fn union(self, other: PgState) -> PgState {
        PgState(self.0 | other.0)
    }

    pub fn insert(&mut self, flag: PgStateFlag) {
        self.0 |= flag.bit();
    }

    pub fn contains(self, flag: PgStateFlag) -> bool {
        self.0 & flag.bit() != 0
    }

    pub fn is_unknown(self) -> bool {
        self.0 == 0
    }

    /// Serving I/O now: `active` and not `stale` (a stale PG's primary has stopped reporting).
    pub fn is_active(self) -> bool {
        self.contains(PgStateFlag::Active) && !self.contains(PgStateFlag::Stale)
    }

    /// Active and clean, not stale (scrubbing or inconsistent or not).
    pub fn is_active_clean(self) -> bool {
        self.is_active() && self.contains(PgStateFlag::Clean)
    }

    /// The flags in Ceph's order.
    pub fn flags(self) -> impl Iterator<Item = PgStateFlag> {
        PG_STATE_ORDER
            .iter()
            .copied()
            .filter(move |f| self.contains(*f))
    }

    /// The flags' names in Ceph's order (empty for `unknown`).
    pub fn names(self) -> Vec<&'static str> {
        self.flags().map(PgStateFlag::name).collect()
    }

    /// The flags in Ceph's order, as `PgStat::state` carries them.
    pub fn to_flags(self) -> Vec<PgStateFlag> {
        self.flags().collect()
    }
}

impl From<&[PgStateFlag]> for PgState {
    fn from(flags: &[PgStateFlag]) -> PgState {
        PgState::from_flags(flags)
    }
}

impl std::fmt::Display for PgState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_unknown() {
            return f.write_str("unknown");
        }
        for (i, name) in self.flags().map(PgStateFlag::name).enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            f.write_str(name)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for PgState {
    type Err = UnknownPgState;

    /// Reads Ceph's printed form, words in any order; `unknown` (alone) is the empty set.
    fn from_str(s: &str) -> Result<PgState, UnknownPgState> {
        if s == "unknown" {
            return Ok(PgState::UNKNOWN);
        }
        s.split('+').try_fold(PgState::UNKNOWN, |state, word| {
            PgStateFlag::from_name(word)
                .map(|f| state.with(f))
                .ok_or_else(|| UnknownPgState {
                    word: word.to_string(),
                })
        })
    }
}

/// Ceph's printed form of a set of states ([`PgState`]'s `Display`): names joined by `+` in
/// [`PG_STATE_ORDER`]; `unknown` for none.
pub fn pg_state_name(flags: &[PgStateFlag]) -> String {
    PgState::from_flags(flags).to_string()
}

/// Capacity and usage of an OSD's store, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdSpace {
    pub total: u64,
    pub used: u64,
    pub available: u64,
}

/// Cumulative client I/O served by an OSD as primary since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoCounters {
    pub read_ops: u64,
    pub read_bytes: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
}

/// Scrub results of a PG (filled by the scrub machinery; `None` until it reports).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgScrubStat {
    /// Wall-clock ns since the epoch of the last completed scrub (0: never).
    pub last_scrub_stamp_ns: u64,
    /// Wall-clock ns since the epoch of the last completed deep scrub (0: never).
    pub last_deep_scrub_stamp_ns: u64,
    /// Objects found inconsistent by the last scrub.
    pub num_inconsistent: u64,
}

/// One PG as its acting primary sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgStat {
    pub pg: PgId,
    /// The PG's states (any order; print with [`pg_state_name`]).
    pub state: Vec<PgStateFlag>,
    pub up: Vec<i32>,
    /// The acting set the state was computed for.
    pub acting: Vec<i32>,
    /// Objects and bytes of object data on the primary (Kelp's internal objects excluded).
    pub num_objects: u64,
    pub num_bytes: u64,
    /// Missing object copies (objects × members lacking them).
    pub num_objects_degraded: u64,
    /// Object copies not where CRUSH wants them (on acting members outside the up set).
    pub num_objects_misplaced: u64,
    /// Objects no member has.
    pub num_objects_unfound: u64,
    /// `(epoch, version)` of the newest PG-log entry.
    pub last_update: (u32, u64),
    /// The OSD map epoch the state was computed at.
    pub reported_epoch: u32,
    pub scrub: Option<PgScrubStat>,
}

/// Cumulative recovery work of an OSD since it started: objects it pulled from another member
/// and applied to bring its copy of a PG up to date, and their data bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryCounters {
    pub objects: u64,
    pub bytes: u64,
}

/// What an OSD sends the leader monitor every `osd_stats_interval`.
///
/// New fields go at the end. postcard is not self-describing, so `#[serde(default)]` alone does
/// not make a shorter, older encoding readable (it fails with "unexpected end"); decode with
/// [`OsdStatsReport::decode`], which falls back on the older layouts. An older monitor reads a
/// newer report: postcard ignores the bytes after the fields it knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdStatsReport {
    pub osd: i32,
    /// The OSD's map epoch when it built the report.
    pub epoch: u32,
    pub space: OsdSpace,
    pub io: IoCounters,
    /// The PGs it is the acting primary of.
    pub pgs: Vec<PgStat>,
    /// Added after the first layout ([`OsdStatsReportV1`]); zero in reports from older OSDs.
    #[serde(default)]
    pub recovery: RecoveryCounters,
    /// Recent write latencies (`kelp osd perf`); appended after [`OsdStatsReportV2`], zero in
    /// reports from older OSDs.
    #[serde(default)]
    pub perf: OsdPerf,
    /// Background work left on this OSD (snapshot trim, removal of deleted pools' PGs);
    /// appended with `perf`.
    #[serde(default)]
    pub work: BackgroundWork,
}

/// Background work an OSD (or, summed, the cluster) still has to do, for the manager's
/// progress items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackgroundWork {
    /// Clones still to examine in the PGs being snapshot-trimmed (their snapshots removed).
    pub snaptrim_clones_left: u64,
    /// Objects still to remove from the PGs of deleted pools.
    pub deleting_objects_left: u64,
    /// PGs of deleted pools still to remove.
    pub deleting_pgs_left: u64,
}

/// Recent latencies of an OSD's writes, in nanoseconds (`kelp osd perf`, Ceph's
/// `commit_latency_ms`/`apply_latency_ms`): `apply` is the time from a write reaching the
/// OSD's store layer to its transaction being executed and handed to the store (visible to
/// reads), `commit` the time until that transaction is durable. Each is the mean over the
/// writes of the last report interval that had any; zero until the OSD has written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdPerf {
    pub commit_latency_ns: u64,
    pub apply_latency_ns: u64,
}

/// One OSD's line of `kelp osd perf` (`MonCommand::OsdPerf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdPerfStat {
    pub id: i32,
    pub perf: OsdPerf,
}

/// The second layout of [`OsdStatsReport`] (no write latencies), kept to read reports from
/// OSDs that predate them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdStatsReportV2 {
    pub osd: i32,
    pub epoch: u32,
    pub space: OsdSpace,
    pub io: IoCounters,
    pub pgs: Vec<PgStat>,
    pub recovery: RecoveryCounters,
}

impl From<OsdStatsReportV2> for OsdStatsReport {
    fn from(v: OsdStatsReportV2) -> Self {
        OsdStatsReport {
            osd: v.osd,
            epoch: v.epoch,
            space: v.space,
            io: v.io,
            pgs: v.pgs,
            recovery: v.recovery,
            perf: OsdPerf::default(),
            work: BackgroundWork::default(),
        }
    }
}

/// The first layout of [`OsdStatsReport`] (no recovery counters), kept to read reports from
/// OSDs that predate them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdStatsReportV1 {
    pub osd: i32,
    pub epoch: u32,
    pub space: OsdSpace,
    pub io: IoCounters,
    pub pgs: Vec<PgStat>,
}

impl From<OsdStatsReportV1> for OsdStatsReport {
    fn from(v: OsdStatsReportV1) -> Self {
        OsdStatsReportV2 {
            osd: v.osd,
            epoch: v.epoch,
            space: v.space,
            io: v.io,
            pgs: v.pgs,
            recovery: RecoveryCounters::default(),
        }
        .into()
    }
}

impl OsdStatsReport {
    /// Decodes a report in the current layout or, failing that, in the second or the first
    /// one.
    pub fn decode(meta: &[u8]) -> Result<Self, crate::ProtoError> {
        match crate::decode::<OsdStatsReport>(meta, "OsdStatsReport") {
            Ok(r) => Ok(r),
            Err(e @ (crate::ProtoError::Empty | crate::ProtoError::Version { .. })) => Err(e),
            Err(e) => crate::decode::<OsdStatsReportV2>(meta, "OsdStatsReport")
                .map(Into::into)
                .or_else(|_| {
                    crate::decode::<OsdStatsReportV1>(meta, "OsdStatsReport").map(Into::into)
                })
                .map_err(|_| e),
        }
    }
}

/// How full an OSD is, against the `mon_osd_*_ratio`s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Fullness {
    #[default]
    Ok,
    NearFull,
    BackfillFull,
    Full,
}

/// Client I/O rates (per second), from successive cumulative counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoRates {
    pub read_bytes_sec: u64,
    pub write_bytes_sec: u64,
    pub read_op_per_sec: u64,
    pub write_op_per_sec: u64,
}

/// Recovery rates (per second), from successive [`RecoveryCounters`]; Ceph's `pgmap` names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryRates {
    pub recovering_objects_per_sec: u64,
    pub recovering_bytes_per_sec: u64,
}

/// One OSD in the digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdSummary {
    pub id: i32,
    pub up: bool,
    pub in_: bool,
    /// Whether the leader holds a report from it (usage fields are 0 otherwise).
    pub reported: bool,
    pub space: OsdSpace,
    /// PGs whose acting set holds it.
    pub num_pgs: u32,
    pub fullness: Fullness,
    pub rates: IoRates,
}

/// One PG in the digest: its state as the monitors judge it (reported, `unknown`, `stale+…`,
/// or `peering` when the report predates a change of its acting set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgSummary {
    pub state_name: String,
    /// The latest report for it (zeros and the map's sets when there is none).
    pub stat: PgStat,
    /// Whether `stat` comes from the current acting primary.
    pub reported: bool,
}

/// Cluster-wide totals, with Ceph's `pgmap` field names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgMapTotals {
    pub num_objects: u64,
    pub data_bytes: u64,
    pub bytes_used: u64,
    pub bytes_avail: u64,
    pub bytes_total: u64,
    pub degraded_objects: u64,
    /// Object copies in total (objects × pool size), the base of the degraded ratio.
    pub degraded_total: u64,
    pub misplaced_objects: u64,
    pub unfound_objects: u64,
    pub rates: IoRates,
}

/// The leader monitor's view of the cluster's statistics (`MonCommand::PgStats`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgMapDigest {
    /// The OSD map epoch it was computed against.
    pub epoch: u32,
    pub pgs: Vec<PgSummary>,
    pub osds: Vec<OsdSummary>,
    pub totals: PgMapTotals,
    /// `mon_osd_nearfull_ratio`, `mon_osd_backfillfull_ratio`, `mon_osd_full_ratio` in
    /// millionths.
    pub nearfull_ratio_ppm: u32,
    pub backfillfull_ratio_ppm: u32,
    pub full_ratio_ppm: u32,
    /// Recovery rates summed over the up OSDs (appended last; zero from an older leader).
    #[serde(default)]
    pub recovery: RecoveryRates,
    /// Background work left, summed over the up OSDs (appended last; zero from an older
    /// leader).
    #[serde(default)]
    pub work: BackgroundWork,
    /// Each up OSD's cumulative count of objects recovered or backfilled onto it since it
    /// started (its reports' [`RecoveryCounters::objects`]), by id: a recovery that starts and
    /// ends between two looks of the manager shows here when degraded counts cannot (appended
    /// last; empty from an older leader).
    #[serde(default)]
    pub recovered_objects: BTreeMap<i32, u64>,
}

/// The leader's answer to a stats report: the settings from the central config the OSD needs
/// (how `osd_stats_interval` and the full ratio reach it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsAck {
    /// `osd_stats_interval`, ms.
    pub interval_ms: u64,
    /// `mon_osd_full_ratio`, millionths: the OSD refuses client writes past it on its own.
    pub full_ratio_ppm: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_v1() -> OsdStatsReportV1 {
        OsdStatsReportV1 {
            osd: 3,
            epoch: 17,
            space: OsdSpace {
                total: 1000,
                used: 10,
                available: 990,
            },
            io: IoCounters {
                read_ops: 1,
                read_bytes: 2,
                write_ops: 3,
                write_bytes: 4,
            },
            pgs: vec![],
        }
    }

    /// A report as an OSD without recovery counters encoded it (version byte + postcard).
    const V1_FIXTURE: &[u8] = &[1, 6, 17, 232, 7, 10, 222, 7, 1, 2, 3, 4, 0];

    #[test]
    fn old_reports_stay_readable_and_new_ones_round_trip() {
        assert_eq!(crate::encode(&sample_v1()), V1_FIXTURE);
        // postcard cannot fill trailing serde defaults: the plain decode fails…
        assert!(crate::decode::<OsdStatsReport>(V1_FIXTURE, "r").is_err());
        // …the fallback reads it, with zero recovery counters.
        let r = OsdStatsReport::decode(V1_FIXTURE).unwrap();
        assert_eq!(r, OsdStatsReport::from(sample_v1()));
        assert_eq!(r.recovery, RecoveryCounters::default());
        let mut new = r.clone();
        new.recovery = RecoveryCounters {
            objects: 5,
            bytes: 5 << 22,
        };
        let bytes = crate::encode(&new);
        assert_eq!(OsdStatsReport::decode(&bytes).unwrap(), new);
        // An older reader ignores the appended counters.
        let old: OsdStatsReportV1 = crate::decode(&bytes, "r").unwrap();
        assert_eq!(old, sample_v1());
        assert!(OsdStatsReport::decode(&[]).is_err());
        assert!(OsdStatsReport::decode(&[9, 1]).is_err());
    }

    #[test]
    fn v2_reports_stay_readable_and_perf_round_trips() {
        let v2 = OsdStatsReportV2 {
            osd: 1,
            epoch: 4,
            space: OsdSpace::default(),
            io: IoCounters::default(),
            pgs: vec![],
            recovery: RecoveryCounters {
                objects: 7,
                bytes: 70,
            },
        };
        let bytes = crate::encode(&v2);
        assert!(crate::decode::<OsdStatsReport>(&bytes, "r").is_err());
        let r = OsdStatsReport::decode(&bytes).unwrap();
        assert_eq!(r.recovery.objects, 7);
        assert_eq!(r.perf, OsdPerf::default());
        let mut new = r.clone();
        new.perf = OsdPerf {
            commit_latency_ns: 1_500_000,
            apply_latency_ns: 300_000,
        };
        let bytes = crate::encode(&new);
        assert_eq!(OsdStatsReport::decode(&bytes).unwrap(), new);
        let old: OsdStatsReportV2 = crate::decode(&bytes, "r").unwrap();
        assert_eq!(old, v2);
    }

    #[test]
    fn pg_state_prints_and_parses_ceph_names() {
        use std::str::FromStr;
        let s = PgState::from_flags(&[
            PgStateFlag::Inconsistent,
            PgStateFlag::Deep,
            PgStateFlag::Scrubbing,
            PgStateFlag::Clean,
            PgStateFlag::Active,
        ]);
        assert_eq!(s.to_string(), "active+clean+scrubbing+deep+inconsistent");
        assert_eq!(PgState::from_str(&s.to_string()), Ok(s));
        assert_eq!(
            PgState::from_str("degraded+active+undersized")
                .unwrap()
                .to_string(),
            "active+undersized+degraded"
        );
        assert_eq!(PgState::from_str("unknown"), Ok(PgState::UNKNOWN));
        assert_eq!(PgState::UNKNOWN.to_string(), "unknown");
        assert_eq!(
            PgState::from_str("active+frobbing").unwrap_err().word,
            "frobbing"
        );
        assert!(PgState::from_str("active+clean").unwrap().is_active_clean());
        assert!(
            !PgState::from_str("stale+active+clean")
                .unwrap()
                .is_active_clean()
        );
        assert!(
            PgState::from_str("active+clean+inconsistent")
                .unwrap()
                .is_active_clean()
        );
        assert!(!PgState::from_str("peering").unwrap().is_active());
        // every flag round-trips through its name
        for f in PG_STATE_ORDER {
            assert_eq!(PgStateFlag::from_name(f.name()), Some(*f));
            assert_eq!(PgState::UNKNOWN.with(*f).to_flags(), vec![*f]);
        }
    }

    #[test]
    fn state_names_follow_ceph_order() {
        assert_eq!(pg_state_name(&[]), "unknown");
        assert_eq!(
            pg_state_name(&[PgStateFlag::Clean, PgStateFlag::Active]),
            "active+clean"
        );
        assert_eq!(
            pg_state_name(&[
                PgStateFlag::Degraded,
                PgStateFlag::Active,
                PgStateFlag::Undersized
            ]),
            "active+undersized+degraded"
        );
        assert_eq!(
            pg_state_name(&[PgStateFlag::Active, PgStateFlag::Clean, PgStateFlag::Stale]),
            "stale+active+clean"
        );
        // Every flag has a place in the order.
        let all = [
            PgStateFlag::Active,
            PgStateFlag::Clean,
            PgStateFlag::Peering,
            PgStateFlag::Peered,
            PgStateFlag::Degraded,
            PgStateFlag::Undersized,
            PgStateFlag::Recovering,
            PgStateFlag::RecoveryWait,
            PgStateFlag::Backfilling,
            PgStateFlag::BackfillWait,
            PgStateFlag::BackfillToofull,
            PgStateFlag::Remapped,
            PgStateFlag::Down,
            PgStateFlag::Incomplete,
            PgStateFlag::Stale,
            PgStateFlag::Scrubbing,
            PgStateFlag::Deep,
            PgStateFlag::Inconsistent,
            PgStateFlag::Repair,
        ];
        for f in all {
            assert!(PG_STATE_ORDER.contains(&f), "{f:?}");
        }
    }
}
