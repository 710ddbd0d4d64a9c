//! Cluster health: Ceph's health checks with stable codes, computed once, as pure functions,
//! from what the monitors and the OSDs report.
//!
//! Inputs: the OSD map (up/in, flags), the leader monitor's statistics digest
//! ([`PgMapDigest`]: per-PG states and counts, per-OSD usage and fullness) and the primaries'
//! scrub summaries ([`PgScrubSummary`]). Output: the failed [`HealthCheck`]s, each with a
//! [`HealthCode`] operators can alert on (`OSD_DOWN`, `PG_DEGRADED`, …), a [`Severity`], a
//! one-line summary and detail lines. The CLI (`kelp status`, `kelp health [detail]`) prints
//! them; a manager daemon can serve the same values.
//!
//! Invariants: a check appears only when it fails (an empty list is `HEALTH_OK`); checks come
//! in a fixed order (map checks, fullness, PG checks, `TOO_FEW_OSDS`, then scrub checks); the
//! same inputs always give the same checks, byte for byte, so outputs can be compared.
//!
//! PG state names are composed by [`kelp_proto::PgState`] (re-exported here), which sits with
//! the wire's [`kelp_proto::PgStateFlag`] so that the OSDs, the monitors and every reader
//! print and parse them the same way.

use std::collections::BTreeMap;
use std::fmt;

use kelp_maps::{ClusterFlag, FsMap, MdsState, OsdMap};
use kelp_proto::{Fullness, PgMapDigest, PgScrubSummary, PgStateFlag, PgSummary};
use kelp_types::PgId;

pub use kelp_proto::{PgState, UnknownPgState};

/// How bad a check (or the cluster) is, with Ceph's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Ok,
    Warn,
    Err,
}

impl Severity {
    /// `HEALTH_OK`, `HEALTH_WARN`, `HEALTH_ERR`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Ok => "HEALTH_OK",
            Severity::Warn => "HEALTH_WARN",
            Severity::Err => "HEALTH_ERR",
        }
    }

    /// `OK`, `WARN`, `ERR` (the bracketed form of `health detail`).
    pub fn short(self) -> &'static str {
        &self.as_str()[7..]
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stable code of a health check (Ceph's names, so that alerts written for Ceph apply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HealthCode {
    /// In OSDs that are down.
    OsdDown,
    /// Cluster flags set (`noout`, `pause`, …; the `full` flag has its own check).
    OsdmapFlags,
    /// OSDs at or past `mon_osd_full_ratio`, or the map's `full` flag: writes are refused.
    OsdFull,
    /// OSDs past `mon_osd_backfillfull_ratio`: they accept no backfill.
    OsdBackfillfull,
    /// OSDs past `mon_osd_nearfull_ratio`.
    OsdNearfull,
    /// PGs not serving I/O (inactive, stale, peering, down, incomplete, unknown).
    PgAvailability,
    /// PGs with missing copies or too few members.
    PgDegraded,
    /// Object copies not where CRUSH wants them.
    ObjectMisplaced,
    /// Objects with no readable in-sync copy.
    ObjectUnfound,
    /// Errors found by the last scrubs.
    OsdScrubErrors,
    /// PGs with inconsistent objects.
    PgDamaged,
    /// No OSDs at all.
    TooFewOsds,
    // File systems (from the file-system map).
    /// A file system's rank 0 is not active (replaying, or no MDS holds it).
    FsDegraded,
    /// A file system has no active MDS: it is offline.
    MdsAllDown,
    /// A file system without an active MDS that no standby can take (none left, or it is
    /// failed / not joinable).
    FsWithFailedMds,
    /// Fewer standby MDS daemons than a file system's `standby_count_wanted`.
    MdsInsufficientStandby,
}

impl HealthCode {
    /// Every code, in the order checks are reported.
    pub const ALL: &'static [HealthCode] = &[
        HealthCode::OsdDown,
        HealthCode::OsdmapFlags,
        HealthCode::OsdFull,
        HealthCode::OsdBackfillfull,
        HealthCode::OsdNearfull,
        HealthCode::PgAvailability,
        HealthCode::PgDegraded,
        HealthCode::ObjectMisplaced,
        HealthCode::ObjectUnfound,
        HealthCode::TooFewOsds,
        HealthCode::OsdScrubErrors,
        HealthCode::PgDamaged,
        HealthCode::FsDegraded,
        HealthCode::MdsAllDown,
        HealthCode::FsWithFailedMds,
        HealthCode::MdsInsufficientStandby,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HealthCode::OsdDown => "OSD_DOWN",
            HealthCode::OsdmapFlags => "OSDMAP_FLAGS",
            HealthCode::OsdFull => "OSD_FULL",
            HealthCode::OsdBackfillfull => "OSD_BACKFILLFULL",
            HealthCode::OsdNearfull => "OSD_NEARFULL",
            HealthCode::PgAvailability => "PG_AVAILABILITY",
            HealthCode::PgDegraded => "PG_DEGRADED",
            HealthCode::ObjectMisplaced => "OBJECT_MISPLACED",
            HealthCode::ObjectUnfound => "OBJECT_UNFOUND",
            HealthCode::OsdScrubErrors => "OSD_SCRUB_ERRORS",
            HealthCode::PgDamaged => "PG_DAMAGED",
            HealthCode::TooFewOsds => "TOO_FEW_OSDS",
            HealthCode::FsDegraded => "FS_DEGRADED",
            HealthCode::MdsAllDown => "MDS_ALL_DOWN",
            HealthCode::FsWithFailedMds => "FS_WITH_FAILED_MDS",
            HealthCode::MdsInsufficientStandby => "MDS_INSUFFICIENT_STANDBY",
        }
    }

    /// The code named `name` (`OSD_DOWN`).
    pub fn from_name(name: &str) -> Option<HealthCode> {
        HealthCode::ALL.iter().copied().find(|c| c.as_str() == name)
    }

    /// The severity the check has when it fails.
    pub fn severity(self) -> Severity {
        match self {
            HealthCode::OsdFull
            | HealthCode::PgAvailability
            | HealthCode::OsdScrubErrors
            | HealthCode::PgDamaged
            | HealthCode::MdsAllDown => Severity::Err,
            HealthCode::OsdDown
            | HealthCode::OsdmapFlags
            | HealthCode::OsdBackfillfull
            | HealthCode::OsdNearfull
            | HealthCode::PgDegraded
            | HealthCode::ObjectMisplaced
            | HealthCode::ObjectUnfound
            | HealthCode::TooFewOsds
            | HealthCode::FsDegraded
            | HealthCode::FsWithFailedMds
            | HealthCode::MdsInsufficientStandby => Severity::Warn,
        }
    }
}

impl fmt::Display for HealthCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One failed health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    pub code: HealthCode,
    pub severity: Severity,
    /// One line (`2 osds down`).
    pub summary: String,
    /// What the check found, one line per item (`osd.3 is down`); may be empty.
    pub detail: Vec<String>,
}

impl HealthCheck {
    /// A check with its code's severity.
    pub fn new(code: HealthCode, summary: impl Into<String>, detail: Vec<String>) -> HealthCheck {
        HealthCheck {
            code,
            severity: code.severity(),
            summary: summary.into(),
            detail,
        }
    }
}

/// The cluster's status from its failed checks: the worst severity, `HEALTH_OK` for none.
pub fn overall(checks: &[HealthCheck]) -> Severity {
    checks
        .iter()
        .map(|c| c.severity)
        .max()
        .unwrap_or(Severity::Ok)
}

/// Every check: [`cluster_checks`] then [`scrub_checks`].
pub fn health_checks(
    map: &OsdMap,
    digest: Option<&PgMapDigest>,
    scrubs: &BTreeMap<PgId, PgScrubSummary>,
) -> Vec<HealthCheck> {
    let mut checks = cluster_checks(map, digest);
    checks.extend(scrub_checks(scrubs));
    checks
}

/// The file-system checks, from the file-system map (after the cluster and scrub checks):
/// `FS_DEGRADED` (rank 0 replaying or unheld), `MDS_ALL_DOWN` (no active MDS: the file system
/// is offline), `FS_WITH_FAILED_MDS` (offline and no standby can take it) and
/// `MDS_INSUFFICIENT_STANDBY` (fewer standbys that may take it than `standby_count_wanted`).
pub fn fs_checks(fsmap: &FsMap) -> Vec<HealthCheck> {
    let plural = |n: usize, word: &str| {
        if n == 1 {
            format!("1 {word}")
        } else {
            format!("{n} {word}s")
        }
    };
    let mut degraded = Vec::new();
    let mut offline = Vec::new();
    let mut failed = Vec::new();
    let mut short = Vec::new();
    for fs in fsmap.filesystems.values() {
        let standbys = fsmap.standbys_for(&fs.name).count();
        match &fs.active {
            Some(a) if a.state == MdsState::Active => {}
            Some(a) => degraded.push(format!(
                "fs {} is degraded: mds.{} is {}",
                fs.name, a.name, a.state
            )),
            None => {
                degraded.push(format!("fs {} is degraded: rank 0 has no MDS", fs.name));
                offline.push(format!(
                    "fs {} is offline because no MDS is active for it",
                    fs.name
                ));
                if fs.failed {
                    failed.push(format!(
                        "fs {} is failed (not joinable): `kelp fs set {} joinable true` lets an \
                         MDS take it",
                        fs.name, fs.name
                    ));
                } else if standbys == 0 {
                    failed.push(format!(
                        "fs {} has a failed rank 0 and no standby MDS to take it",
                        fs.name
                    ));
                }
            }
        }
        if (standbys as u64) < u64::from(fs.standby_count_wanted) {
            short.push(format!(
                "fs {} has {} standby MDS, wants {}",
                fs.name, standbys, fs.standby_count_wanted
            ));
        }
    }
    let mut checks = Vec::new();
    if !degraded.is_empty() {
        let s = format!("{} degraded", plural(degraded.len(), "filesystem"));
        checks.push(HealthCheck::new(HealthCode::FsDegraded, s, degraded));
    }
    if !offline.is_empty() {
        let s = format!("{} offline", plural(offline.len(), "filesystem"));
        checks.push(HealthCheck::new(HealthCode::MdsAllDown, s, offline));
    }
    if !failed.is_empty() {
        let s = format!("{} with a failed MDS", plural(failed.len(), "filesystem"));
        checks.push(HealthCheck::new(HealthCode::FsWithFailedMds, s, failed));
    }
    if !short.is_empty() {
        let s = "insufficient standby MDS daemons available".to_string();
        checks.push(HealthCheck::new(
            HealthCode::MdsInsufficientStandby,
            s,
            short,
        ));
    }
    checks
}

/// `part / whole` as a percentage, as Ceph prints ratios (with `{:.3}`).
pub fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// A PG state name as the digest carries it, as a set; words this version does not know are
/// left out (a newer monitor may send them).
pub fn parse_state_lenient(name: &str) -> PgState {
    name.parse().unwrap_or_else(|_| {
        name.split('+')
            .filter_map(PgStateFlag::from_name)
            .fold(PgState::UNKNOWN, PgState::with)
    })
}

/// The checks computed from the OSD map and the monitors' statistics digest (`None` when the
/// monitors gave none): `OSD_DOWN`, `OSDMAP_FLAGS`, `OSD_FULL`, `OSD_BACKFILLFULL`,
/// `OSD_NEARFULL`, `PG_AVAILABILITY`, `PG_DEGRADED`, `OBJECT_MISPLACED`, `OBJECT_UNFOUND`,
/// `TOO_FEW_OSDS`.
pub fn cluster_checks(map: &OsdMap, digest: Option<&PgMapDigest>) -> Vec<HealthCheck> {
    let mut checks = Vec::new();
    let down: Vec<String> = map
        .osds
        .values()
        .filter(|o| !o.up && o.is_in())
        .map(|o| format!("osd.{} is down", o.id))
        .collect();
    if !down.is_empty() {
        checks.push(HealthCheck::new(
            HealthCode::OsdDown,
            format!("{} osds down", down.len()),
            down,
        ));
    }
    let flags: Vec<String> = map
        .flags
        .iter()
        .filter(|f| **f != ClusterFlag::Full)
        .map(|f| f.to_string())
        .collect();
    if !flags.is_empty() {
        checks.push(HealthCheck::new(
            HealthCode::OsdmapFlags,
            format!("{} flag(s) set", flags.join(",")),
            vec![],
        ));
    }
    checks.extend(fullness_checks(map, digest));
    match digest {
        Some(d) => checks.extend(pg_checks(d)),
        None if map.pools.values().any(|p| p.pg_num > 0) => checks.push(HealthCheck::new(
            HealthCode::PgAvailability,
            "PG states unknown: the monitors gave no statistics",
            vec![],
        )),
        None => {}
    }
    if map.osds.is_empty() {
        checks.push(HealthCheck::new(HealthCode::TooFewOsds, "no OSDs", vec![]));
    }
    checks
}

/// `OSD_FULL`, `OSD_BACKFILLFULL`, `OSD_NEARFULL` from the up OSDs' fullness in the digest
/// (and the map's `full` flag).
fn fullness_checks(map: &OsdMap, digest: Option<&PgMapDigest>) -> Vec<HealthCheck> {
    let by_fullness = |level: Fullness, what: &str| -> Vec<String> {
        digest
            .map(|d| {
                d.osds
                    .iter()
                    .filter(|o| o.up && o.fullness == level)
                    .map(|o| {
                        format!(
                            "osd.{} is {what} ({:.1}% used)",
                            o.id,
                            percent(o.space.used, o.space.total)
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let ratio = |ppm: Option<u32>| ppm.map_or(String::new(), |p| format!("{}", p as f64 / 1e6));
    let mut checks = Vec::new();
    let full = by_fullness(Fullness::Full, "full");
    if !full.is_empty() || map.has_flag(ClusterFlag::Full) {
        let summary = if full.is_empty() {
            "the full flag is set (waiting for the OSDs' next reports)".to_string()
        } else {
            format!(
                "{} full osd(s) (full ratio {}): writes are refused",
                full.len(),
                ratio(digest.map(|d| d.full_ratio_ppm))
            )
        };
        checks.push(HealthCheck::new(HealthCode::OsdFull, summary, full));
    }
    let backfillfull = by_fullness(Fullness::BackfillFull, "backfill full");
    if !backfillfull.is_empty() {
        checks.push(HealthCheck::new(
            HealthCode::OsdBackfillfull,
            format!(
                "{} backfillfull osd(s) (backfillfull ratio {})",
                backfillfull.len(),
                ratio(digest.map(|d| d.backfillfull_ratio_ppm))
            ),
            backfillfull,
        ));
    }
    let nearfull = by_fullness(Fullness::NearFull, "near full");
    if !nearfull.is_empty() {
        checks.push(HealthCheck::new(
            HealthCode::OsdNearfull,
            format!(
                "{} nearfull osd(s) (nearfull ratio {})",
                nearfull.len(),
                ratio(digest.map(|d| d.nearfull_ratio_ppm))
            ),
            nearfull,
        ));
    }
    checks
}

/// `PG_AVAILABILITY`, `PG_DEGRADED`, `OBJECT_MISPLACED`, `OBJECT_UNFOUND` from the digest.
fn pg_checks(d: &PgMapDigest) -> Vec<HealthCheck> {
    // states an inactive PG is counted under in PG_AVAILABILITY's summary
    const INACTIVE_STATES: [PgStateFlag; 5] = [
        PgStateFlag::Peering,
        PgStateFlag::Stale,
        PgStateFlag::Down,
        PgStateFlag::Incomplete,
        PgStateFlag::Peered,
    ];
    let mut checks = Vec::new();
    let mut inactive = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut degraded = Vec::new();
    let (mut n_degraded, mut n_undersized) = (0, 0);
    for p in &d.pgs {
        let state = parse_state_lenient(&p.state_name);
        if !state.is_active() {
            inactive.push(format!(
                "pg {} is {}, acting {:?}",
                p.stat.pg, p.state_name, p.stat.acting
            ));
            if state.is_unknown() {
                *counts.entry("unknown").or_default() += 1;
            }
            for f in INACTIVE_STATES.iter().filter(|f| state.contains(**f)) {
                *counts.entry(f.name()).or_default() += 1;
            }
        }
        let is_degraded = state.contains(PgStateFlag::Degraded);
        let is_undersized = state.contains(PgStateFlag::Undersized);
        n_degraded += usize::from(is_degraded);
        n_undersized += usize::from(is_undersized);
        if is_degraded || is_undersized {
            degraded.push(format!(
                "pg {} is {}, acting {:?}",
                p.stat.pg, p.state_name, p.stat.acting
            ));
        }
    }
    if !inactive.is_empty() {
        let mut parts = vec![format!("{} pgs inactive", inactive.len())];
        parts.extend(counts.iter().map(|(s, n)| format!("{n} pgs {s}")));
        checks.push(HealthCheck::new(
            HealthCode::PgAvailability,
            format!("Reduced data availability: {}", parts.join(", ")),
            inactive,
        ));
    }
    let t = &d.totals;
    if !degraded.is_empty() || t.degraded_objects > 0 {
        let mut parts = Vec::new();
        if t.degraded_objects > 0 {
            parts.push(format!(
                "{}/{} objects degraded ({:.3}%)",
                t.degraded_objects,
                t.degraded_total,
                percent(t.degraded_objects, t.degraded_total)
            ));
        }
        if n_degraded > 0 {
            parts.push(format!("{n_degraded} pgs degraded"));
        }
        if n_undersized > 0 {
            parts.push(format!("{n_undersized} pgs undersized"));
        }
        checks.push(HealthCheck::new(
            HealthCode::PgDegraded,
            format!("Degraded data redundancy: {}", parts.join(", ")),
            degraded,
        ));
    }
    if t.misplaced_objects > 0 {
        checks.push(HealthCheck::new(
            HealthCode::ObjectMisplaced,
            format!(
                "{}/{} objects misplaced ({:.3}%)",
                t.misplaced_objects,
                t.degraded_total,
                percent(t.misplaced_objects, t.degraded_total)
            ),
            vec![],
        ));
    }
    if t.unfound_objects > 0 {
        checks.push(HealthCheck::new(
            HealthCode::ObjectUnfound,
            format!("{} objects unfound", t.unfound_objects),
            d.pgs
                .iter()
                .filter(|p| p.stat.num_objects_unfound > 0)
                .map(|p| {
                    format!(
                        "pg {} has {} unfound objects (every in-sync copy unreadable; \
                         names in the primary osd.{}'s log): overwrite or remove them",
                        p.stat.pg,
                        p.stat.num_objects_unfound,
                        p.stat
                            .acting
                            .iter()
                            .copied()
                            .find(|&o| o != kelp_maps::ITEM_NONE)
                            .unwrap_or(-1)
                    )
                })
                .collect(),
        ));
    }
    checks
}

/// The `OSD_SCRUB_ERRORS` and `PG_DAMAGED` checks from the primaries' scrub summaries.
pub fn scrub_checks(summaries: &BTreeMap<PgId, PgScrubSummary>) -> Vec<HealthCheck> {
    let errors: u64 = summaries.values().map(|s| s.num_scrub_errors).sum();
    let mut checks = Vec::new();
    if errors > 0 {
        checks.push(HealthCheck::new(
            HealthCode::OsdScrubErrors,
            format!("{errors} scrub errors"),
            vec![],
        ));
    }
    let damaged: Vec<String> = summaries
        .iter()
        .filter(|(_, s)| s.num_objects_inconsistent > 0)
        .map(|(pg, s)| {
            format!(
                "pg {pg} is {}, {} inconsistent objects",
                PgState::ACTIVE_CLEAN.union(s.state()),
                s.num_objects_inconsistent
            )
        })
        .collect();
    if !damaged.is_empty() {
        checks.push(HealthCheck::new(
            HealthCode::PgDamaged,
            format!(
                "Possible data damage: {} pg{} inconsistent",
                damaged.len(),
                if damaged.len() == 1 { "" } else { "s" }
            ),
            damaged,
        ));
    }
    checks
}

/// The PGs of the digest that wait for OSDs holding their latest writes (`down`) or that
/// found them without those writes (`incomplete`): the ones [`explain_blocked_pg`] explains.
pub fn blocked_pgs(d: &PgMapDigest) -> impl Iterator<Item = &PgSummary> {
    d.pgs.iter().filter(|p| {
        let s = parse_state_lenient(&p.state_name);
        s.contains(PgStateFlag::Down) || s.contains(PgStateFlag::Incomplete)
    })
}

/// Replaces (or adds) the `PG_AVAILABILITY` detail line of a blocked PG with one naming the
/// OSDs of its activation record, `members` as `(osd, up)`: the last OSDs known to hold all
/// its writes. Does nothing when `PG_AVAILABILITY` did not fail.
pub fn explain_blocked_pg(checks: &mut [HealthCheck], p: &PgSummary, members: &[(i32, bool)]) {
    let Some(check) = checks
        .iter_mut()
        .find(|c| c.code == HealthCode::PgAvailability)
    else {
        return;
    };
    let down = parse_state_lenient(&p.state_name).contains(PgStateFlag::Down);
    let prefix = format!("pg {} is {}", p.stat.pg, p.state_name);
    let osds: Vec<String> = members
        .iter()
        .map(|(o, up)| format!("osd.{o} ({})", if *up { "up" } else { "down" }))
        .collect();
    let why = if down {
        "waiting for one of the OSDs that held its latest writes"
    } else {
        "the OSDs that held its latest writes answered without them"
    };
    let line = format!(
        "{prefix}, acting {:?}: {why}: {}; bring one back, or give up on its data with \
         `kelp osd lost ID --yes-i-really-mean-it`",
        p.stat.acting,
        osds.join(", ")
    );
    if let Some(l) = check.detail.iter_mut().find(|l| l.starts_with(&prefix)) {
        *l = line;
    } else {
        check.detail.push(line);
    }
}

/// A PG's state as shown to operators: the digest's state with the primary's scrub states
/// (`scrubbing`, `deep`, `inconsistent`, `repair`) added, in Ceph's order.
pub fn pg_state_with_scrub(state_name: &str, scrub: Option<&PgScrubSummary>) -> String {
    let extra = scrub.map(PgScrubSummary::state).unwrap_or_default();
    match state_name.parse::<PgState>() {
        Ok(s) if !s.is_unknown() => s.union(extra).to_string(),
        // nothing reported, or a word this version does not know: keep the name as it is and
        // append the scrub states
        _ => {
            let mut state = state_name.to_string();
            for w in extra.names() {
                if !state.split('+').any(|have| have == w) {
                    state.push('+');
                    state.push_str(w);
                }
            }
            state
        }
    }
}

/// PGs counted active and clean (scrubbing or not, not stale) in a state → count table.
pub fn clean_pgs<'a>(pgs_by_state: impl IntoIterator<Item = (&'a String, &'a u32)>) -> u32 {
    pgs_by_state
        .into_iter()
        .filter(|(s, _)| parse_state_lenient(s).is_active_clean())
        .map(|(_, n)| n)
        .sum()
}

/// What keeps the cluster from being ready for clients (empty when ready): OSDs of the map
/// that are not up, PG statistics older than the map or missing PGs, and PGs not exactly
/// `active+clean`, counted by state.
pub fn readiness(map: &OsdMap, digest: &PgMapDigest) -> Vec<String> {
    let mut why = Vec::new();
    let down: Vec<String> = map
        .osds
        .iter()
        .filter(|(_, o)| !o.up)
        .map(|(id, _)| format!("osd.{id}"))
        .collect();
    if !down.is_empty() {
        why.push(format!("{} down", down.join(", ")));
    }
    let want: u32 = map.pools.values().map(|p| p.pg_num).sum();
    if digest.epoch < map.epoch || digest.pgs.len() != want as usize {
        why.push(format!(
            "PG statistics not yet reported for map epoch {} ({} of {want} PGs)",
            map.epoch,
            digest.pgs.len()
        ));
    }
    let mut unclean: BTreeMap<&str, u32> = BTreeMap::new();
    for p in digest
        .pgs
        .iter()
        .filter(|p| p.state_name.parse() != Ok(PgState::ACTIVE_CLEAN))
    {
        *unclean.entry(p.state_name.as_str()).or_default() += 1;
    }
    for (state, n) in unclean {
        why.push(format!("{n} pgs {state}"));
    }
    why
}

#[cfg(test)]
mod tests;
