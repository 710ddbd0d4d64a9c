//! The leader monitor's statistics (Ceph's manager `PGMap`, kept simple): the latest report of
//! every up OSD, held in memory only, and the pure functions that turn them into a cluster
//! digest (PG states, usage, client I/O rates) and into the `full` decision.
//!
//! Invariants and rules:
//! - reports are not replicated: a new leader starts empty, so until every up OSD has
//!   reported again its PGs show `unknown` (or `stale+…` if this monitor saw them before) and
//!   the `full` flag is left as it is ([`PgMap::full_decision`] answers `None`);
//! - a report is dropped as soon as the map says its OSD is down or gone;
//! - rates (client I/O, and recovery from [`kelp_proto::RecoveryCounters`]) come from the
//!   difference of successive cumulative counters over the time between their arrival;
//!   counters that went backwards (the OSD restarted) give no rate for that step;
//! - a PG's state is its current acting primary's report when that report was computed for the
//!   current acting set; `peering` when the acting set changed since (or the primary's report
//!   predates the change and does not list it yet); `stale+<last known>` when its primary has not
//!   reported for `stale_after` or not at all but another OSD reported it before; `unknown`
//!   when nothing was ever reported.

use std::collections::BTreeMap;

use kelp_maps::OsdMap;
use kelp_proto::{
    BackgroundWork, Fullness, IoCounters, IoRates, OsdPerfStat, OsdStatsReport, OsdSummary,
    PgMapDigest, PgMapTotals, PgStat, PgState, PgStateFlag, PgSummary, RecoveryCounters,
    RecoveryRates,
};
use kelp_types::PgId;

/// The `mon_osd_*_ratio`s, in millionths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FullRatios {
    pub nearfull_ppm: u32,
    pub backfillfull_ppm: u32,
    pub full_ppm: u32,
}

impl Default for FullRatios {
    fn default() -> Self {
        FullRatios {
            nearfull_ppm: 850_000,
            backfillfull_ppm: 900_000,
            full_ppm: 950_000,
        }
    }
}

/// A ratio (`0.95`) in millionths.
pub fn ratio_ppm(r: f64) -> u32 {
    (r.clamp(0.0, 1.0) * 1_000_000.0).round() as u32
}

/// How full a store is: at or past a ratio counts (`used / total >= ratio`).
pub fn fullness(total: u64, used: u64, r: &FullRatios) -> Fullness {
    if total == 0 {
        return Fullness::Ok;
    }
    let used_ppm = (used as u128 * 1_000_000 / total as u128) as u64;
    if used_ppm >= u64::from(r.full_ppm) {
        Fullness::Full
    } else if used_ppm >= u64::from(r.backfillfull_ppm) {
        Fullness::BackfillFull
    } else if used_ppm >= u64::from(r.nearfull_ppm) {
        Fullness::NearFull
    } else {
        Fullness::Ok
    }
}

/// Rates between two cumulative counter samples `secs` apart; zero if the counters went
/// backwards (a restart) or no time passed.
pub fn rates(prev: &IoCounters, cur: &IoCounters, secs: f64) -> IoRates {
    let backwards = cur.read_ops < prev.read_ops
        || cur.read_bytes < prev.read_bytes
        || cur.write_ops < prev.write_ops
        || cur.write_bytes < prev.write_bytes;
    if backwards || secs <= 0.0 {
        return IoRates::default();
    }
    let per_sec = |a: u64, b: u64| ((b - a) as f64 / secs).round() as u64;
    IoRates {
        read_bytes_sec: per_sec(prev.read_bytes, cur.read_bytes),
        write_bytes_sec: per_sec(prev.write_bytes, cur.write_bytes),
        read_op_per_sec: per_sec(prev.read_ops, cur.read_ops),
        write_op_per_sec: per_sec(prev.write_ops, cur.write_ops),
    }
}

/// Recovery rates between two cumulative samples `secs` apart; zero if the counters went
/// backwards (a restart) or no time passed.
pub fn recovery_rates(prev: &RecoveryCounters, cur: &RecoveryCounters, secs: f64) -> RecoveryRates {
    if cur.objects < prev.objects || cur.bytes < prev.bytes || secs <= 0.0 {
        return RecoveryRates::default();
    }
    let per_sec = |a: u64, b: u64| ((b - a) as f64 / secs).round() as u64;
    RecoveryRates {
        recovering_objects_per_sec: per_sec(prev.objects, cur.objects),
        recovering_bytes_per_sec: per_sec(prev.bytes, cur.bytes),
    }
}

#[derive(Debug, Clone)]
struct OsdEntry {
    report: OsdStatsReport,
    /// Arrival time, seconds on the caller's monotonic clock.
    at: f64,
    rates: IoRates,
    recovery: RecoveryRates,
}

/// The latest report per OSD and the last known stats of every PG.
#[derive(Debug, Clone, Default)]
pub struct PgMap {
    osds: BTreeMap<i32, OsdEntry>,
    /// The newest stats seen for each PG, whoever reported them (for `stale+…`).
    last_pg: BTreeMap<PgId, PgStat>,
}

impl PgMap {
    /// Each reporting OSD's recent write latencies (`kelp osd perf`), by id.
    pub fn perf(&self) -> Vec<OsdPerfStat> {
        self.osds
            .iter()
            .map(|(&id, e)| OsdPerfStat {
                id,
                perf: e.report.perf,
            })
            .collect()
    }

    /// Takes a report that arrived at `now` (seconds, monotonic).
    pub fn ingest(&mut self, report: OsdStatsReport, now: f64) {
        let (rates, recovery) = match self.osds.get(&report.osd) {
            Some(prev) => (
                rates(&prev.report.io, &report.io, now - prev.at),
                recovery_rates(&prev.report.recovery, &report.recovery, now - prev.at),
            ),
            None => (IoRates::default(), RecoveryRates::default()),
        };
        for pg in &report.pgs {
            self.last_pg.insert(pg.pg, pg.clone());
        }
        self.osds.insert(
            report.osd,
            OsdEntry {
                report,
                at: now,
                rates,
                recovery,
            },
        );
    }

    /// Forgets the reports of OSDs that are down or gone, and PGs of deleted pools.
    pub fn prune(&mut self, map: &OsdMap) {
        self.osds
            .retain(|id, _| map.osds.get(id).is_some_and(|o| o.up));
        self.last_pg.retain(|pg, _| {
            map.pools
                .get(&pg.pool.0)
                .is_some_and(|p| pg.seed < p.pg_num)
        });
    }

    /// Forgets everything (this monitor is no longer the leader).
    pub fn clear(&mut self) {
        self.osds.clear();
        self.last_pg.clear();
    }

    /// Whether the OSD has a report here.
    pub fn has_report(&self, osd: i32) -> bool {
        self.osds.contains_key(&osd)
    }

    /// Should the map's `full` flag be set? `Some(true)` if any up OSD's latest report is at or
    /// past the full ratio; `Some(false)` if every up OSD has reported and none is; `None`
    /// (leave the flag as it is) while some up OSD has not reported yet.
    pub fn full_decision(&self, map: &OsdMap, r: &FullRatios) -> Option<bool> {
        let mut all = true;
        for osd in map.osds.values().filter(|o| o.up) {
            match self.osds.get(&osd.id) {
                Some(e) => {
                    let s = &e.report.space;
                    if fullness(s.total, s.used, r) == Fullness::Full {
                        return Some(true);
                    }
                }
                None => all = false,
            }
        }
        all.then_some(false)
    }

    /// The digest against `map` at `now`; a primary whose report is older than `stale_after`
    /// seconds makes its PGs `stale`.
    pub fn digest(&self, map: &OsdMap, r: &FullRatios, now: f64, stale_after: f64) -> PgMapDigest {
        let mut pgs = Vec::new();
        let mut totals = PgMapTotals::default();
        let mut pgs_per_osd: BTreeMap<i32, u32> = BTreeMap::new();
        for pool in map.pools.values() {
            let Ok(ids) = map.pool_pgs(pool.id) else {
                continue;
            };
            for pg in ids {
                let Ok(m) = map.pg_mapping(pg) else { continue };
                for o in m.acting_osds() {
                    *pgs_per_osd.entry(o).or_default() += 1;
                }
                let blank = PgStat {
                    pg,
                    state: Vec::new(),
                    up: m.up.clone(),
                    acting: m.acting.clone(),
                    num_objects: 0,
                    num_bytes: 0,
                    num_objects_degraded: 0,
                    num_objects_misplaced: 0,
                    num_objects_unfound: 0,
                    last_update: (0, 0),
                    reported_epoch: 0,
                    scrub: None,
                };
                let stale = |st: &PgStat| {
                    let mut s = st.clone();
                    if !s.state.contains(&PgStateFlag::Stale) {
                        s.state.push(PgStateFlag::Stale);
                    }
                    s
                };
                let primary = (m.acting_primary >= 0)
                    .then(|| self.osds.get(&m.acting_primary))
                    .flatten();
                let (stat, reported) = match primary {
                    Some(e) => match e.report.pgs.iter().find(|s| s.pg == pg) {
                        Some(st) if now - e.at > stale_after => (stale(st), true),
                        Some(st) if st.acting == m.acting => (st.clone(), true),
                        Some(st) => {
                            let mut s = st.clone();
                            s.state = vec![PgStateFlag::Peering];
                            (s, true)
                        }
                        None if e.report.epoch < map.epoch => {
                            let mut s = self.last_pg.get(&pg).cloned().unwrap_or(blank);
                            s.state = vec![PgStateFlag::Peering];
                            (s, false)
                        }
                        None => (blank, false),
                    },
                    None => match self.last_pg.get(&pg) {
                        Some(st) => (stale(st), false),
                        None => (blank, false),
                    },
                };
                totals.num_objects += stat.num_objects;
                totals.data_bytes += stat.num_bytes;
                totals.degraded_objects += stat.num_objects_degraded;
                totals.degraded_total += stat.num_objects * u64::from(pool.size);
                totals.misplaced_objects += stat.num_objects_misplaced;
                totals.unfound_objects += stat.num_objects_unfound;
                pgs.push(PgSummary {
                    state_name: PgState::from_flags(&stat.state).to_string(),
                    stat,
                    reported,
                });
            }
        }
        let mut osds = Vec::new();
        let mut recovery = RecoveryRates::default();
        let mut work = BackgroundWork::default();
        let mut recovered_objects = BTreeMap::new();
        for o in map.osds.values() {
            let entry = self.osds.get(&o.id).filter(|_| o.up);
            let space = entry.map(|e| e.report.space).unwrap_or_default();
            let rates = entry.map(|e| e.rates).unwrap_or_default();
            if entry.is_some() {
                totals.bytes_total += space.total;
                totals.bytes_used += space.used;
                totals.bytes_avail += space.available;
                totals.rates.read_bytes_sec += rates.read_bytes_sec;
                totals.rates.write_bytes_sec += rates.write_bytes_sec;
                totals.rates.read_op_per_sec += rates.read_op_per_sec;
                totals.rates.write_op_per_sec += rates.write_op_per_sec;
            }
            if let Some(e) = entry {
                recovery.recovering_objects_per_sec += e.recovery.recovering_objects_per_sec;
                recovery.recovering_bytes_per_sec += e.recovery.recovering_bytes_per_sec;
                let w = &e.report.work;
                work.snaptrim_clones_left += w.snaptrim_clones_left;
                work.deleting_objects_left += w.deleting_objects_left;
                work.deleting_pgs_left += w.deleting_pgs_left;
                recovered_objects.insert(o.id, e.report.recovery.objects);
            }
            osds.push(OsdSummary {
                id: o.id,
                up: o.up,
                in_: o.is_in(),
                reported: entry.is_some(),
                space,
                num_pgs: pgs_per_osd.get(&o.id).copied().unwrap_or(0),
                fullness: fullness(space.total, space.used, r),
                rates,
            });
        }
        PgMapDigest {
            epoch: map.epoch,
            pgs,
            osds,
            totals,
            nearfull_ratio_ppm: r.nearfull_ppm,
            backfillfull_ratio_ppm: r.backfillfull_ppm,
            full_ratio_ppm: r.full_ppm,
            recovery,
            work,
            recovered_objects,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kelp_maps::PoolSpec;
    use kelp_proto::OsdSpace;

    fn cluster(osds: i32) -> OsdMap {
        let mut map = OsdMap::new("fsid", "osd").unwrap();
        for i in 0..osds {
            let (id, inc) = map
                .propose_osd_create(&format!("u{i}"), "localhost", 0x10000)
                .unwrap();
            map.apply(&inc.unwrap()).unwrap();
            let addr = format!("127.0.0.1:{}", 7000 + i).parse().unwrap();
            map.apply(&map.propose_osd_boot(id, addr).unwrap().unwrap())
                .unwrap();
        }
        let (_, inc) = map
            .propose_pool_create(&PoolSpec {
                name: "data".into(),
                pg_num: Some(4),
                size: Some(3),
                ..PoolSpec::default()
            })
            .unwrap();
        map.apply(&inc).unwrap();
        map
    }

    /// What each OSD would report as primary: every PG active+clean with `objects` objects.
    fn report(map: &OsdMap, osd: i32, used: u64, io: IoCounters, objects: u64) -> OsdStatsReport {
        let mut pgs = Vec::new();
        for pg in map.pool_pgs(1).unwrap() {
            let m = map.pg_mapping(pg).unwrap();
            if m.acting_primary == osd {
                pgs.push(PgStat {
                    pg,
                    state: vec![PgStateFlag::Active, PgStateFlag::Clean],
                    up: m.up.clone(),
                    acting: m.acting.clone(),
                    num_objects: objects,
                    num_bytes: objects * 100,
                    num_objects_degraded: 0,
                    num_objects_misplaced: 0,
                    num_objects_unfound: 0,
                    last_update: (map.epoch, objects),
                    reported_epoch: map.epoch,
                    scrub: None,
                });
            }
        }
        OsdStatsReport {
            osd,
            epoch: map.epoch,
            space: OsdSpace {
                total: 1000,
                used,
                available: 1000 - used,
            },
            io,
            pgs,
            recovery: RecoveryCounters::default(),
            perf: Default::default(),
            work: Default::default(),
        }
    }

    fn states(d: &PgMapDigest) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for p in &d.pgs {
            *out.entry(p.state_name.clone()).or_default() += 1;
        }
        out
    }

    #[test]
    fn rates_from_successive_counters() {
        let a = IoCounters {
            read_ops: 10,
            read_bytes: 1000,
            write_ops: 4,
            write_bytes: 400,
        };
        let b = IoCounters {
            read_ops: 30,
            read_bytes: 5000,
            write_ops: 8,
            write_bytes: 2400,
        };
        let r = rates(&a, &b, 2.0);
        assert_eq!(
            r,
            IoRates {
                read_bytes_sec: 2000,
                write_bytes_sec: 1000,
                read_op_per_sec: 10,
                write_op_per_sec: 2
            }
        );
        // A restart (counters back to zero) gives no rate, not a huge one.
        assert_eq!(rates(&b, &a, 2.0), IoRates::default());
        assert_eq!(rates(&a, &b, 0.0), IoRates::default());
    }

    #[test]
    fn recovery_rates_from_successive_counters_summed_over_up_osds() {
        let a = RecoveryCounters {
            objects: 10,
            bytes: 40 << 20,
        };
        let b = RecoveryCounters {
            objects: 30,
            bytes: 120 << 20,
        };
        assert_eq!(
            recovery_rates(&a, &b, 2.0),
            RecoveryRates {
                recovering_objects_per_sec: 10,
                recovering_bytes_per_sec: 40 << 20,
            }
        );
        assert_eq!(recovery_rates(&b, &a, 2.0), RecoveryRates::default());
        assert_eq!(recovery_rates(&a, &b, 0.0), RecoveryRates::default());

        let mut map = cluster(3);
        let r = FullRatios::default();
        let mut pm = PgMap::default();
        let io = IoCounters::default();
        for (osd, t) in [(0, 0.0), (1, 0.0), (2, 0.0), (0, 2.0), (1, 2.0), (2, 2.0)] {
            let mut rep = report(&map, osd, 100, io, 1);
            if t > 0.0 && osd > 0 {
                rep.recovery = RecoveryCounters {
                    objects: 8,
                    bytes: 8 << 22,
                };
            }
            pm.ingest(rep, t);
        }
        let d = pm.digest(&map, &r, 2.0, 10.0);
        assert_eq!(d.recovery.recovering_objects_per_sec, 8);
        assert_eq!(d.recovery.recovering_bytes_per_sec, 8 << 22);
        // A down OSD's rate no longer counts.
        map.apply(&map.propose_osd_down(2).unwrap().unwrap())
            .unwrap();
        pm.prune(&map);
        let d = pm.digest(&map, &r, 2.5, 10.0);
        assert_eq!(d.recovery.recovering_objects_per_sec, 4);
    }

    #[test]
    fn unknown_until_reported_then_reported_states_and_totals() {
        let map = cluster(3);
        let r = FullRatios::default();
        let mut pm = PgMap::default();
        let d = pm.digest(&map, &r, 0.0, 10.0);
        assert_eq!(states(&d), BTreeMap::from([("unknown".to_string(), 4)]));
        assert_eq!(pm.full_decision(&map, &r), None);
        let io0 = IoCounters::default();
        for osd in 0..3 {
            pm.ingest(report(&map, osd, 100, io0, 5), 0.0);
        }
        let d = pm.digest(&map, &r, 0.5, 10.0);
        assert_eq!(
            states(&d),
            BTreeMap::from([("active+clean".to_string(), 4)])
        );
        assert_eq!(d.totals.num_objects, 20);
        assert_eq!(d.totals.data_bytes, 2000);
        assert_eq!(d.totals.bytes_total, 3000);
        assert_eq!(d.totals.bytes_used, 300);
        assert_eq!(d.totals.degraded_total, 60);
        assert_eq!(pm.full_decision(&map, &r), Some(false));
        // Second round, one second later: rates summed over the OSDs.
        let io1 = IoCounters {
            write_ops: 10,
            write_bytes: 4096,
            ..io0
        };
        for osd in 0..3 {
            pm.ingest(report(&map, osd, 100, io1, 5), 1.0);
        }
        let d = pm.digest(&map, &r, 1.0, 10.0);
        assert_eq!(d.totals.rates.write_op_per_sec, 30);
        assert_eq!(d.totals.rates.write_bytes_sec, 3 * 4096);
        assert_eq!(d.osds.iter().map(|o| o.num_pgs).sum::<u32>(), 12);
        // A primary that stops reporting: its PGs turn stale.
        let d = pm.digest(&map, &r, 30.0, 10.0);
        assert!(d.pgs.iter().all(|p| p.state_name == "stale+active+clean"));
    }

    #[test]
    fn a_map_change_makes_old_reports_peering_or_stale() {
        let mut map = cluster(3);
        let r = FullRatios::default();
        let mut pm = PgMap::default();
        for osd in 0..3 {
            pm.ingest(report(&map, osd, 100, IoCounters::default(), 1), 0.0);
        }
        // osd.0 goes down: its report is dropped; PGs it was primary of move to a new primary
        // whose report predates the change (peering); the acting sets of the others shrink.
        let inc = map.propose_osd_down(0).unwrap().unwrap();
        map.apply(&inc).unwrap();
        pm.prune(&map);
        assert!(!pm.has_report(0));
        let d = pm.digest(&map, &r, 1.0, 10.0);
        assert!(
            d.pgs.iter().all(|p| p.state_name == "peering"),
            "{:?}",
            states(&d)
        );
        assert_eq!(d.totals.bytes_total, 2000);
        // The survivors report again at the new epoch.
        for osd in 1..3 {
            let mut rep = report(&map, osd, 100, IoCounters::default(), 1);
            for p in &mut rep.pgs {
                p.state = vec![
                    PgStateFlag::Active,
                    PgStateFlag::Undersized,
                    PgStateFlag::Degraded,
                ];
            }
            pm.ingest(rep, 2.0);
        }
        let d = pm.digest(&map, &r, 2.0, 10.0);
        assert_eq!(
            states(&d),
            BTreeMap::from([("active+undersized+degraded".to_string(), 4)])
        );
        // Every OSD down: the PGs keep their last known stats, as stale.
        for osd in 1..3 {
            let inc = map.propose_osd_down(osd).unwrap().unwrap();
            map.apply(&inc).unwrap();
        }
        pm.prune(&map);
        let d = pm.digest(&map, &r, 3.0, 10.0);
        assert_eq!(
            states(&d),
            BTreeMap::from([("stale+active+undersized+degraded".to_string(), 4)])
        );
        assert_eq!(pm.full_decision(&map, &r), Some(false));
    }

    #[test]
    fn full_decisions_follow_the_ratios() {
        let r = FullRatios::default();
        assert_eq!(fullness(1000, 849, &r), Fullness::Ok);
        assert_eq!(fullness(1000, 850, &r), Fullness::NearFull);
        assert_eq!(fullness(1000, 900, &r), Fullness::BackfillFull);
        assert_eq!(fullness(1000, 950, &r), Fullness::Full);
        assert_eq!(fullness(0, 0, &r), Fullness::Ok);
        assert_eq!(ratio_ppm(0.95), 950_000);

        let map = cluster(3);
        let mut pm = PgMap::default();
        pm.ingest(report(&map, 0, 960, IoCounters::default(), 0), 0.0);
        // One full OSD is enough, even before the others report.
        assert_eq!(pm.full_decision(&map, &r), Some(true));
        let d = pm.digest(&map, &r, 0.0, 10.0);
        assert_eq!(d.osds[0].fullness, Fullness::Full);
        // Space freed, but not every OSD has reported: leave the flag alone.
        pm.ingest(report(&map, 0, 500, IoCounters::default(), 0), 1.0);
        assert_eq!(pm.full_decision(&map, &r), None);
        for osd in 1..3 {
            pm.ingest(report(&map, osd, 920, IoCounters::default(), 0), 1.0);
        }
        assert_eq!(pm.full_decision(&map, &r), Some(false));
        let d = pm.digest(&map, &r, 1.0, 10.0);
        assert_eq!(d.osds[1].fullness, Fullness::BackfillFull);
        // A stricter ratio turns them full.
        let strict = FullRatios {
            full_ppm: 900_000,
            ..r
        };
        assert_eq!(pm.full_decision(&map, &strict), Some(true));
    }
}
