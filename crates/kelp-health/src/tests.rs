use super::*;
use kelp_maps::PoolSpec;
use kelp_proto::{OsdSpace, OsdSummary, PgMapTotals, PgStat};

/// `osds` OSDs, all up and in, and pool `data` with 4 PGs of size 3.
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

fn pg(seed: u32, state: &str, acting: Vec<i32>) -> PgSummary {
    let flags = state.parse::<PgState>().unwrap().to_flags();
    PgSummary {
        state_name: state.to_string(),
        stat: PgStat {
            pg: PgId::new(1, seed),
            state: flags,
            up: acting.clone(),
            acting,
            num_objects: 10,
            num_bytes: 1000,
            num_objects_degraded: 0,
            num_objects_misplaced: 0,
            num_objects_unfound: 0,
            last_update: (1, 10),
            reported_epoch: 1,
            scrub: None,
        },
        reported: true,
    }
}

fn osd(id: i32, used: u64, fullness: Fullness) -> OsdSummary {
    OsdSummary {
        id,
        up: true,
        in_: true,
        reported: true,
        space: OsdSpace {
            total: 1000,
            used,
            available: 1000 - used,
        },
        num_pgs: 3,
        fullness,
        rates: Default::default(),
    }
}

fn digest(map: &OsdMap, pgs: Vec<PgSummary>) -> PgMapDigest {
    PgMapDigest {
        epoch: map.epoch,
        pgs,
        osds: (0..3).map(|i| osd(i, 100, Fullness::Ok)).collect(),
        totals: PgMapTotals::default(),
        nearfull_ratio_ppm: 850_000,
        backfillfull_ratio_ppm: 900_000,
        full_ratio_ppm: 950_000,
        recovery: Default::default(),
        work: Default::default(),
        recovered_objects: Default::default(),
    }
}

fn clean_digest(map: &OsdMap) -> PgMapDigest {
    digest(
        map,
        (0..4)
            .map(|s| pg(s, "active+clean", vec![0, 1, 2]))
            .collect(),
    )
}

fn codes(checks: &[HealthCheck]) -> Vec<&'static str> {
    checks.iter().map(|c| c.code.as_str()).collect()
}

#[test]
fn a_clean_cluster_is_ok() {
    let map = cluster(3);
    let d = clean_digest(&map);
    let checks = health_checks(&map, Some(&d), &BTreeMap::new());
    assert!(checks.is_empty(), "{checks:?}");
    assert_eq!(overall(&checks), Severity::Ok);
    assert!(readiness(&map, &d).is_empty());
}

#[test]
fn codes_names_and_severities_are_stable() {
    let names: Vec<&str> = HealthCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(
        names,
        [
            "OSD_DOWN",
            "OSDMAP_FLAGS",
            "OSD_FULL",
            "OSD_BACKFILLFULL",
            "OSD_NEARFULL",
            "PG_AVAILABILITY",
            "PG_DEGRADED",
            "OBJECT_MISPLACED",
            "OBJECT_UNFOUND",
            "TOO_FEW_OSDS",
            "OSD_SCRUB_ERRORS",
            "PG_DAMAGED",
            "FS_DEGRADED",
            "MDS_ALL_DOWN",
            "FS_WITH_FAILED_MDS",
            "MDS_INSUFFICIENT_STANDBY",
        ]
    );
    for c in HealthCode::ALL {
        assert_eq!(HealthCode::from_name(c.as_str()), Some(*c));
    }
    assert_eq!(HealthCode::OsdFull.severity(), Severity::Err);
    assert_eq!(HealthCode::PgDegraded.severity(), Severity::Warn);
    assert_eq!(Severity::Warn.to_string(), "HEALTH_WARN");
    assert_eq!(Severity::Err.short(), "ERR");
}

#[test]
fn down_osd_and_flags() {
    let mut map = cluster(4);
    map.apply(&map.propose_osd_down(3).unwrap().unwrap())
        .unwrap();
    map.apply(&map.propose_flag(ClusterFlag::NoOut, true).unwrap())
        .unwrap();
    let checks = cluster_checks(&map, Some(&clean_digest(&map)));
    assert_eq!(codes(&checks), ["OSD_DOWN", "OSDMAP_FLAGS"]);
    assert_eq!(checks[0].summary, "1 osds down");
    assert_eq!(checks[0].detail, ["osd.3 is down"]);
    assert_eq!(checks[1].summary, "noout flag(s) set");
    assert_eq!(overall(&checks), Severity::Warn);
    assert_eq!(
        readiness(&map, &clean_digest(&map)),
        ["osd.3 down".to_string()]
    );
}

#[test]
fn fullness_checks_name_osds_and_ratios() {
    let map = cluster(3);
    let mut d = clean_digest(&map);
    d.osds = vec![
        osd(0, 960, Fullness::Full),
        osd(1, 910, Fullness::BackfillFull),
        osd(2, 860, Fullness::NearFull),
    ];
    let checks = cluster_checks(&map, Some(&d));
    assert_eq!(
        codes(&checks),
        ["OSD_FULL", "OSD_BACKFILLFULL", "OSD_NEARFULL"]
    );
    assert_eq!(
        checks[0].summary,
        "1 full osd(s) (full ratio 0.95): writes are refused"
    );
    assert_eq!(checks[0].detail, ["osd.0 is full (96.0% used)"]);
    assert_eq!(
        checks[1].summary,
        "1 backfillfull osd(s) (backfillfull ratio 0.9)"
    );
    assert_eq!(checks[2].detail, ["osd.2 is near full (86.0% used)"]);
    assert_eq!(overall(&checks), Severity::Err);

    // the map's full flag without a full OSD in the digest (yet)
    let mut map = cluster(3);
    map.apply(&map.propose_flag(ClusterFlag::Full, true).unwrap())
        .unwrap();
    let checks = cluster_checks(&map, Some(&clean_digest(&map)));
    assert_eq!(codes(&checks), ["OSD_FULL"]);
    assert_eq!(
        checks[0].summary,
        "the full flag is set (waiting for the OSDs' next reports)"
    );
}

#[test]
fn inactive_and_degraded_pgs() {
    let map = cluster(3);
    let mut d = digest(
        &map,
        vec![
            pg(0, "active+clean", vec![0, 1, 2]),
            pg(1, "stale+active+clean", vec![0, 1, 2]),
            pg(2, "peering", vec![0, 1]),
            pg(3, "active+undersized+degraded", vec![1, 2]),
        ],
    );
    d.totals = PgMapTotals {
        degraded_objects: 10,
        degraded_total: 120,
        misplaced_objects: 3,
        unfound_objects: 0,
        ..PgMapTotals::default()
    };
    let checks = cluster_checks(&map, Some(&d));
    assert_eq!(
        codes(&checks),
        ["PG_AVAILABILITY", "PG_DEGRADED", "OBJECT_MISPLACED"]
    );
    assert_eq!(
        checks[0].summary,
        "Reduced data availability: 2 pgs inactive, 1 pgs peering, 1 pgs stale"
    );
    assert_eq!(
        checks[0].detail,
        [
            "pg 1.1 is stale+active+clean, acting [0, 1, 2]",
            "pg 1.2 is peering, acting [0, 1]"
        ]
    );
    assert_eq!(
        checks[1].summary,
        "Degraded data redundancy: 10/120 objects degraded (8.333%), 1 pgs degraded, 1 pgs \
         undersized"
    );
    assert_eq!(
        checks[1].detail,
        ["pg 1.3 is active+undersized+degraded, acting [1, 2]"]
    );
    assert_eq!(checks[2].summary, "3/120 objects misplaced (2.500%)");
    assert_eq!(
        readiness(&map, &d),
        [
            "1 pgs active+undersized+degraded",
            "1 pgs peering",
            "1 pgs stale+active+clean"
        ]
    );
}

#[test]
fn unfound_objects_name_their_pg() {
    let map = cluster(3);
    let mut d = clean_digest(&map);
    d.pgs[2].stat.num_objects_unfound = 2;
    d.totals.unfound_objects = 2;
    let checks = cluster_checks(&map, Some(&d));
    assert_eq!(codes(&checks), ["OBJECT_UNFOUND"]);
    assert_eq!(checks[0].summary, "2 objects unfound");
    assert!(
        checks[0].detail[0].starts_with("pg 1.2 has 2 unfound objects"),
        "{:?}",
        checks[0].detail
    );
}

#[test]
fn no_digest_no_osds() {
    let map = cluster(3);
    let checks = cluster_checks(&map, None);
    assert_eq!(codes(&checks), ["PG_AVAILABILITY"]);
    assert_eq!(
        checks[0].summary,
        "PG states unknown: the monitors gave no statistics"
    );
    let empty = OsdMap::new("fsid", "osd").unwrap();
    assert_eq!(codes(&cluster_checks(&empty, None)), ["TOO_FEW_OSDS"]);
}

#[test]
fn blocked_pgs_are_explained() {
    let map = cluster(3);
    let d = digest(
        &map,
        vec![
            pg(0, "active+clean", vec![0, 1, 2]),
            pg(1, "down", vec![0, 1]),
            pg(2, "incomplete", vec![0, 1]),
            pg(3, "active+clean", vec![0, 1, 2]),
        ],
    );
    let mut checks = cluster_checks(&map, Some(&d));
    let blocked: Vec<&PgSummary> = blocked_pgs(&d).collect();
    assert_eq!(blocked.len(), 2);
    explain_blocked_pg(&mut checks, blocked[0], &[(2, false), (0, true)]);
    explain_blocked_pg(&mut checks, blocked[1], &[(1, true)]);
    assert_eq!(
        checks[0].summary,
        "Reduced data availability: 2 pgs inactive, 1 pgs down, 1 pgs incomplete"
    );
    assert_eq!(
        checks[0].detail,
        [
            "pg 1.1 is down, acting [0, 1]: waiting for one of the OSDs that held its latest \
             writes: osd.2 (down), osd.0 (up); bring one back, or give up on its data with \
             `kelp osd lost ID --yes-i-really-mean-it`",
            "pg 1.2 is incomplete, acting [0, 1]: the OSDs that held its latest writes \
             answered without them: osd.1 (up); bring one back, or give up on its data with \
             `kelp osd lost ID --yes-i-really-mean-it`"
        ]
    );
}

#[test]
fn scrub_errors_and_damage() {
    let mut scrubs = BTreeMap::new();
    scrubs.insert(PgId::new(1, 0), PgScrubSummary::default());
    scrubs.insert(
        PgId::new(1, 0x1a),
        PgScrubSummary {
            num_scrub_errors: 2,
            num_objects_inconsistent: 1,
            ..PgScrubSummary::default()
        },
    );
    let checks = scrub_checks(&scrubs);
    assert_eq!(codes(&checks), ["OSD_SCRUB_ERRORS", "PG_DAMAGED"]);
    assert_eq!(checks[0].summary, "2 scrub errors");
    assert_eq!(checks[1].summary, "Possible data damage: 1 pg inconsistent");
    assert_eq!(
        checks[1].detail,
        ["pg 1.1a is active+clean+inconsistent, 1 inconsistent objects"]
    );
    assert_eq!(overall(&checks), Severity::Err);
}

#[test]
fn pg_states_with_scrub_states() {
    let scrubbing = PgScrubSummary {
        scrubbing: true,
        deep: true,
        ..PgScrubSummary::default()
    };
    let damaged = PgScrubSummary {
        num_objects_inconsistent: 1,
        ..PgScrubSummary::default()
    };
    assert_eq!(pg_state_with_scrub("active+clean", None), "active+clean");
    assert_eq!(
        pg_state_with_scrub("active+clean", Some(&scrubbing)),
        "active+clean+scrubbing+deep"
    );
    assert_eq!(
        pg_state_with_scrub("active+clean", Some(&damaged)),
        "active+clean+inconsistent"
    );
    assert_eq!(
        pg_state_with_scrub("active+undersized+degraded+backfilling", Some(&scrubbing)),
        "active+undersized+degraded+scrubbing+deep+backfilling"
    );
    // names this version does not know are kept as they are
    assert_eq!(
        pg_state_with_scrub("active+clean+snaptrim", Some(&damaged)),
        "active+clean+snaptrim+inconsistent"
    );
    let table: BTreeMap<String, u32> = [
        ("active+clean".to_string(), 5),
        ("active+clean+scrubbing+deep".to_string(), 1),
        ("stale+active+clean".to_string(), 1),
        ("active+undersized+degraded".to_string(), 2),
    ]
    .into_iter()
    .collect();
    assert_eq!(clean_pgs(&table), 6);
}

#[test]
fn file_system_checks() {
    use kelp_maps::{FsMap, MdsBeacon, MdsState};
    let mut map = cluster(3);
    for name in ["meta", "fsdata"] {
        let (_, inc) = map
            .propose_pool_create(&PoolSpec {
                name: name.into(),
                pg_num: Some(4),
                ..PoolSpec::default()
            })
            .unwrap();
        map.apply(&inc).unwrap();
    }
    let mut fsmap = FsMap::new();
    assert!(fs_checks(&fsmap).is_empty());
    fsmap
        .fs_new(&map, "cephfs", "meta", "fsdata", false, 0)
        .unwrap();
    assert_eq!(
        codes(&fs_checks(&fsmap)),
        [
            "FS_DEGRADED",
            "MDS_ALL_DOWN",
            "FS_WITH_FAILED_MDS",
            "MDS_INSUFFICIENT_STANDBY"
        ]
    );
    assert_eq!(overall(&fs_checks(&fsmap)), Severity::Err);
    let beacon = |name: &str, state, incarnation| MdsBeacon {
        name: name.into(),
        addr: "127.0.0.1:6800".parse().unwrap(),
        instance: format!("i.{name}"),
        fs: None,
        state,
        incarnation,
    };
    fsmap
        .mds_beacon(&beacon("a", MdsState::Standby, 0), 1)
        .unwrap();
    assert_eq!(
        codes(&fs_checks(&fsmap)),
        ["FS_DEGRADED", "MDS_INSUFFICIENT_STANDBY"],
        "replaying"
    );
    fsmap
        .mds_beacon(&beacon("a", MdsState::Active, 1), 2)
        .unwrap();
    fsmap
        .mds_beacon(&beacon("b", MdsState::Standby, 0), 2)
        .unwrap();
    assert!(fs_checks(&fsmap).is_empty());
    fsmap.fs_fail("cephfs").unwrap();
    let checks = fs_checks(&fsmap);
    assert_eq!(
        codes(&checks),
        ["FS_DEGRADED", "MDS_ALL_DOWN", "FS_WITH_FAILED_MDS"]
    );
    assert!(checks[2].detail[0].contains("joinable true"), "{checks:?}");
}
