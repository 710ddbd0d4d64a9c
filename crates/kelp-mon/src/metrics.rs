//! The monitor's Prometheus metrics (`/metrics`, see `kelp_metrics`) and the service map.
//!
//! Every monitor exports its own Raft and map state and the commands it answered. Only the
//! leader exports the cluster's (OSDs up/in, PGs by state, per-pool objects and bytes, health
//! checks): it alone holds the OSDs' statistics, and one exporter per cluster-wide series keeps
//! `sum()` over all monitors right. Health checks are `kelp_health_check{name, severity}` 0/1,
//! for every check the monitors evaluate (scrub errors come from the OSDs, whose
//! `kelp_osd_scrub_errors` the alert rules use). Per-PG series are not exported.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use kelp_maps::OsdMap;
use kelp_metrics::{MetricDef, MetricTable, MetricType as T, Snapshot};
use kelp_proto::{PgMapDigest, ServiceEntry};

pub static METRICS: &[MetricDef] = &[
    // live: 0
    MetricDef {
        name: "kelp_mon_commands",
        kind: T::Counter,
        help: "Monitor commands this monitor received, by command.",
        labels: &["command"],
    },
    // every monitor: 1..=4
    MetricDef {
        name: "kelp_mon_is_leader",
        kind: T::Gauge,
        help: "1 on the Raft leader (the monitor that exports the cluster-wide series), 0 on the others.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mon_raft_term",
        kind: T::Gauge,
        help: "This monitor's current Raft term (a rising term means elections).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mon_raft_applied_index",
        kind: T::Gauge,
        help: "Index of the last Raft log entry this monitor applied.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_mon_osdmap_epoch",
        kind: T::Gauge,
        help: "The OSD map epoch this monitor has.",
        labels: &[],
    },
    // leader only: 5..
    MetricDef {
        name: "kelp_cluster_osds",
        kind: T::Gauge,
        help: "OSDs in the OSD map.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_cluster_osds_up",
        kind: T::Gauge,
        help: "OSDs the map says are up.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_cluster_osds_in",
        kind: T::Gauge,
        help: "OSDs the map says are in (hold data).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_cluster_osd_up",
        kind: T::Gauge,
        help: "1 when the OSD is up, 0 when down, per OSD.",
        labels: &["osd"],
    },
    MetricDef {
        name: "kelp_cluster_osd_in",
        kind: T::Gauge,
        help: "1 when the OSD is in, 0 when out, per OSD.",
        labels: &["osd"],
    },
    MetricDef {
        name: "kelp_cluster_pgs",
        kind: T::Gauge,
        help: "PGs by state (as `kelp status` counts them: reported, unknown, stale+…).",
        labels: &["state"],
    },
    MetricDef {
        name: "kelp_cluster_pg_num",
        kind: T::Gauge,
        help: "PGs in all pools.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_pool_pgs",
        kind: T::Gauge,
        help: "PGs of the pool (pg_num).",
        labels: &["pool"],
    },
    MetricDef {
        name: "kelp_pool_objects",
        kind: T::Gauge,
        help: "Objects stored in the pool (as their primaries last reported).",
        labels: &["pool"],
    },
    MetricDef {
        name: "kelp_pool_stored_bytes",
        kind: T::Gauge,
        help: "Logical bytes of object data stored in the pool.",
        labels: &["pool"],
    },
    MetricDef {
        name: "kelp_cluster_objects",
        kind: T::Gauge,
        help: "Objects in all pools.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_cluster_capacity_bytes",
        kind: T::Gauge,
        help: "Raw capacity of the up OSDs that reported.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_cluster_used_bytes",
        kind: T::Gauge,
        help: "Raw bytes used on the up OSDs that reported.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_cluster_available_bytes",
        kind: T::Gauge,
        help: "Raw bytes available on the up OSDs that reported.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_cluster_objects_degraded",
        kind: T::Gauge,
        help: "Missing object copies in the cluster (recovery still to do).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_cluster_objects_misplaced",
        kind: T::Gauge,
        help: "Object copies not where CRUSH wants them (backfill still to do).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_cluster_objects_unfound",
        kind: T::Gauge,
        help: "Objects with no readable copy.",
        labels: &[],
    },
    MetricDef {
        name: "kelp_health_status",
        kind: T::Gauge,
        help: "The cluster's health: 0 HEALTH_OK, 1 HEALTH_WARN, 2 HEALTH_ERR (checks the monitors evaluate).",
        labels: &[],
    },
    MetricDef {
        name: "kelp_health_check",
        kind: T::Gauge,
        help: "1 while the named health check fails, 0 otherwise, for every check the monitors evaluate.",
        labels: &["name", "severity"],
    },
    MetricDef {
        name: "kelp_service_map_daemons",
        kind: T::Gauge,
        help: "Daemons in the service map, by kind and status (up or stale).",
        labels: &["kind", "status"],
    },
];

pub static TABLE: MetricTable = MetricTable {
    daemon: "mon",
    metrics: METRICS,
};

/// The metrics set by [`Monitor`](crate::monitor::Monitor)'s scrape-time snapshot.
pub fn snapshot_metrics() -> &'static [MetricDef] {
    &METRICS[1..]
}

/// What every monitor exports about itself.
pub fn mon_snapshot(s: &mut Snapshot, leader: bool, term: u64, applied: u64, epoch: u32) {
    s.set(&METRICS[1], &[], if leader { 1.0 } else { 0.0 });
    s.set(&METRICS[2], &[], term as f64);
    s.set(&METRICS[3], &[], applied as f64);
    s.set(&METRICS[4], &[], f64::from(epoch));
}

/// The leader's cluster-wide series from the map, the statistics digest and the file-system
/// map.
pub fn cluster_snapshot(s: &mut Snapshot, map: &OsdMap, d: &PgMapDigest, fsmap: &kelp_maps::FsMap) {
    let m = &METRICS;
    s.set(&m[5], &[], map.osds.len() as f64);
    s.set(
        &m[6],
        &[],
        map.osds.values().filter(|o| o.up).count() as f64,
    );
    s.set(
        &m[7],
        &[],
        map.osds.values().filter(|o| o.is_in()).count() as f64,
    );
    for (id, o) in &map.osds {
        let id = id.to_string();
        s.set(&m[8], &[&id], if o.up { 1.0 } else { 0.0 });
        s.set(&m[9], &[&id], if o.is_in() { 1.0 } else { 0.0 });
    }
    let mut by_state: BTreeMap<&str, u64> = BTreeMap::new();
    let mut per_pool: HashMap<u32, (u64, u64)> = HashMap::new();
    for p in &d.pgs {
        *by_state.entry(p.state_name.as_str()).or_default() += 1;
        let e = per_pool.entry(p.stat.pg.pool.0).or_default();
        e.0 += p.stat.num_objects;
        e.1 += p.stat.num_bytes;
    }
    for (state, n) in &by_state {
        s.set(&m[10], &[state], *n as f64);
    }
    s.set(&m[11], &[], d.pgs.len() as f64);
    for pool in map.pools.values() {
        let (objects, bytes) = per_pool.get(&pool.id).copied().unwrap_or_default();
        s.set(&m[12], &[&pool.name], f64::from(pool.pg_num));
        s.set(&m[13], &[&pool.name], objects as f64);
        s.set(&m[14], &[&pool.name], bytes as f64);
    }
    let t = &d.totals;
    s.set(&m[15], &[], t.num_objects as f64);
    s.set(&m[16], &[], t.bytes_total as f64);
    s.set(&m[17], &[], t.bytes_used as f64);
    s.set(&m[18], &[], t.bytes_avail as f64);
    s.set(&m[19], &[], t.degraded_objects as f64);
    s.set(&m[20], &[], t.misplaced_objects as f64);
    s.set(&m[21], &[], t.unfound_objects as f64);
    let mut checks = kelp_health::cluster_checks(map, Some(d));
    checks.extend(kelp_health::fs_checks(fsmap));
    let status = match kelp_health::overall(&checks) {
        kelp_health::Severity::Ok => 0.0,
        kelp_health::Severity::Warn => 1.0,
        kelp_health::Severity::Err => 2.0,
    };
    s.set(&m[22], &[], status);
    for code in MON_CHECKS {
        let failing = checks.iter().any(|c| c.code == *code);
        s.set(
            &m[23],
            &[code.as_str(), code.severity().as_str()],
            if failing { 1.0 } else { 0.0 },
        );
    }
}

/// The health checks the monitors evaluate (`kelp_health::cluster_checks` and `fs_checks`);
/// the scrub ones (`OSD_SCRUB_ERRORS`, `PG_DAMAGED`) need the OSDs' scrub summaries.
pub const MON_CHECKS: &[kelp_health::HealthCode] = &[
    kelp_health::HealthCode::OsdDown,
    kelp_health::HealthCode::OsdmapFlags,
    kelp_health::HealthCode::OsdFull,
    kelp_health::HealthCode::OsdBackfillfull,
    kelp_health::HealthCode::OsdNearfull,
    kelp_health::HealthCode::PgAvailability,
    kelp_health::HealthCode::PgDegraded,
    kelp_health::HealthCode::ObjectMisplaced,
    kelp_health::HealthCode::ObjectUnfound,
    kelp_health::HealthCode::TooFewOsds,
    kelp_health::HealthCode::FsDegraded,
    kelp_health::HealthCode::MdsAllDown,
    kelp_health::HealthCode::FsWithFailedMds,
    kelp_health::HealthCode::MdsInsufficientStandby,
];

/// A beacon older than this is shown `stale`.
pub const SERVICE_STALE_AFTER: Duration = Duration::from_secs(15);
/// A beacon older than this is dropped from the service map.
pub const SERVICE_EXPIRE_AFTER: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
struct Beacon {
    kind: String,
    addrs: BTreeMap<String, String>,
    version: String,
    at: Instant,
}

/// The leader's service map: the last beacon of every daemon, in memory only (a new leader
/// rebuilds it from the next beacons, within one beacon interval).
#[derive(Debug, Default)]
pub struct ServiceMap {
    daemons: BTreeMap<String, Beacon>,
}

impl ServiceMap {
    pub fn beacon(
        &mut self,
        name: &str,
        kind: &str,
        addrs: BTreeMap<String, String>,
        version: &str,
        now: Instant,
    ) {
        self.daemons.insert(
            name.to_string(),
            Beacon {
                kind: kind.to_string(),
                addrs,
                version: version.to_string(),
                at: now,
            },
        );
    }

    /// Every daemon heard from within [`SERVICE_EXPIRE_AFTER`], sorted by name (older ones
    /// are dropped).
    pub fn entries(&mut self, now: Instant) -> Vec<ServiceEntry> {
        self.daemons
            .retain(|_, b| now.saturating_duration_since(b.at) < SERVICE_EXPIRE_AFTER);
        self.daemons
            .iter()
            .map(|(name, b)| {
                let age = now.saturating_duration_since(b.at);
                ServiceEntry {
                    name: name.clone(),
                    kind: b.kind.clone(),
                    addrs: b.addrs.clone(),
                    version: b.version.clone(),
                    age_ms: age.as_millis() as u64,
                    stale: age >= SERVICE_STALE_AFTER,
                }
            })
            .collect()
    }

    /// `kelp_service_map_daemons` series.
    pub fn snapshot(&mut self, s: &mut Snapshot, now: Instant) {
        let mut counts: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
        for e in self.entries(now) {
            let status = if e.stale { "stale" } else { "up" };
            *counts.entry((e.kind, status)).or_default() += 1;
        }
        for ((kind, status), n) in counts {
            s.set(&METRICS[24], &[&kind, status], n as f64);
        }
    }
}

/// The name of a command for `kelp_mon_commands` (its variant: a closed set).
pub fn command_name(cmd: &kelp_proto::MonCommand) -> String {
    let dbg = format!("{cmd:?}");
    dbg.split([' ', '{', '('])
        .next()
        .unwrap_or("Unknown")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_map_goes_stale_then_away() {
        let mut m = ServiceMap::default();
        let t0 = Instant::now();
        let mut addrs = BTreeMap::new();
        addrs.insert(
            "metrics".to_string(),
            "http://127.0.0.1:1/metrics".to_string(),
        );
        m.beacon("osd.0", "osd", addrs, "0.1.0", t0);
        let e = m.entries(t0 + Duration::from_secs(1));
        assert_eq!(e.len(), 1);
        assert!(!e[0].stale);
        assert!(m.entries(t0 + SERVICE_STALE_AFTER)[0].stale);
        assert!(m.entries(t0 + SERVICE_EXPIRE_AFTER).is_empty());
    }

    #[test]
    fn command_names_are_variants() {
        assert_eq!(command_name(&kelp_proto::MonCommand::Status), "Status");
        assert_eq!(
            command_name(&kelp_proto::MonCommand::PoolSnapCreate { pool: "p".into() }),
            "PoolSnapCreate"
        );
    }

    #[test]
    fn table_indices_match_names() {
        assert_eq!(METRICS[5].name, "kelp_cluster_osds");
        assert_eq!(METRICS[10].name, "kelp_cluster_pgs");
        assert_eq!(METRICS[22].name, "kelp_health_status");
        assert_eq!(METRICS[23].name, "kelp_health_check");
        assert_eq!(METRICS[24].name, "kelp_service_map_daemons");
    }
}
