//! The file-system map's decisions as pure functions: definitions and their refusals, and MDS
//! beacons, failures and promotions in, new map and actions out.

use crate::fsmap::{FsAction, FsMap, MdsAssignment, MdsBeacon, MdsState};
use crate::osdmap::tests::cluster;
use crate::{MapError, OsdMap, PoolSpec};

fn create(map: &mut OsdMap, name: &str, erasure: bool) -> u32 {
    let spec = PoolSpec {
        name: name.into(),
        pg_num: Some(8),
        erasure: erasure.then(|| "small".to_string()),
        ..PoolSpec::default()
    };
    let (id, inc) = map.propose_pool_create(&spec).unwrap();
    map.apply(&inc).unwrap();
    id
}

fn osdmap() -> OsdMap {
    let mut m = cluster(4, "osd");
    let profile =
        kelp_ec::Profile::from_words(&["k=2", "m=1", "crush-failure-domain=osd"]).unwrap();
    let inc = m
        .propose_ec_profile_set("small", &profile, false)
        .unwrap()
        .unwrap();
    m.apply(&inc).unwrap();
    create(&mut m, "meta", false);
    create(&mut m, "data", false);
    create(&mut m, "meta2", false);
    create(&mut m, "data2", false);
    create(&mut m, "ecdata", true);
    m
}

fn beacon(name: &str, state: MdsState, incarnation: u64) -> MdsBeacon {
    MdsBeacon {
        name: name.into(),
        addr: "127.0.0.1:6800".parse().unwrap(),
        instance: format!("client.mds.{name}.1"),
        fs: None,
        state,
        incarnation,
    }
}

fn with_fs() -> (OsdMap, FsMap) {
    let om = osdmap();
    let mut fm = FsMap::new();
    fm.fs_new(&om, "cephfs", "meta", "data", false, 1).unwrap();
    (om, fm)
}

#[test]
fn fs_new_refuses_bad_definitions_with_clear_errors() {
    let (om, mut fm) = with_fs();
    let e = |r: Result<u32, MapError>| r.unwrap_err().to_string();
    let mut f = fm.clone();
    assert!(e(f.fs_new(&om, "cephfs", "meta2", "data2", false, 1)).contains("already exists"));
    assert!(e(f.fs_new(&om, "b", "nope", "data2", false, 1)).contains("'nope' does not exist"));
    assert!(e(f.fs_new(&om, "b", "ecdata", "data2", false, 1)).contains("omap"));
    assert!(e(f.fs_new(&om, "b", "meta2", "ecdata", false, 1)).contains("--force"));
    assert!(e(f.fs_new(&om, "b", "meta", "data2", false, 1)).contains("used by file system"));
    assert!(e(f.fs_new(&om, "b", "meta2", "data", false, 1)).contains("used by file system"));
    assert!(e(f.fs_new(&om, "b", "meta2", "meta2", false, 1)).contains("both"));
    assert!(e(f.fs_new(&om, "b c", "meta2", "data2", false, 1)).contains("letters"));
    assert_eq!(f, fm, "refusals change nothing");
    let id = fm.fs_new(&om, "b", "meta2", "ecdata", true, 1).unwrap();
    assert_eq!(id, 1);
    assert_eq!(fm.epoch, 2);
    let b = &fm.filesystems["b"];
    assert_eq!((b.max_mds, b.standby_count_wanted, b.failed), (1, 1, false));
}

#[test]
fn settings_and_data_pools() {
    let (om, mut fm) = with_fs();
    let err = fm.fs_set("cephfs", "max_mds", "2", 1).unwrap_err();
    assert_eq!(err, MapError::FsMaxMdsUnsupported(2));
    fm.fs_set("cephfs", "max_mds", "1", 1).unwrap();
    fm.fs_set("cephfs", "standby_count_wanted", "0", 1).unwrap();
    assert_eq!(fm.filesystems["cephfs"].standby_count_wanted, 0);
    assert!(fm.fs_set("cephfs", "colour", "1", 1).is_err());
    assert!(fm.fs_set("nope", "max_mds", "1", 1).is_err());
    fm.fs_add_data_pool(&om, "cephfs", "ecdata").unwrap();
    assert_eq!(fm.filesystems["cephfs"].data_pools.len(), 2);
    let e = fm.fs_rm_data_pool(&om, "cephfs", "data").unwrap_err();
    assert!(e.to_string().contains("default data pool"));
    assert!(fm.fs_rm_data_pool(&om, "cephfs", "data2").is_err());
    fm.fs_rm_data_pool(&om, "cephfs", "ecdata").unwrap();
    assert_eq!(fm.filesystems["cephfs"].data_pools.len(), 1);
    assert_eq!(
        fm.fs_using_pool(om.pool_by_name("meta").unwrap().id)
            .unwrap()
            .name,
        "cephfs"
    );
}

#[test]
fn the_first_standby_takes_a_file_system_at_once() {
    let (_, mut fm) = with_fs();
    let (a, actions) = fm
        .mds_beacon(&beacon("a", MdsState::Standby, 0), 10)
        .unwrap();
    assert_eq!(
        a,
        MdsAssignment::Active {
            fs: "cephfs".into(),
            incarnation: 1
        }
    );
    assert!(actions.is_empty());
    let active = fm.filesystems["cephfs"].active.clone().unwrap();
    assert_eq!((active.state, active.since_ms), (MdsState::Replay, 10));
    // The second one stays standby.
    let (b, _) = fm
        .mds_beacon(&beacon("b", MdsState::Standby, 0), 11)
        .unwrap();
    assert_eq!(b, MdsAssignment::Standby);
    // `a` replays, then reports active: recorded.
    let epoch = fm.epoch;
    fm.mds_beacon(&beacon("a", MdsState::Replay, 1), 12)
        .unwrap();
    assert_eq!(
        fm.epoch, epoch,
        "a beacon that changes nothing keeps the epoch"
    );
    fm.mds_beacon(&beacon("a", MdsState::Active, 1), 13)
        .unwrap();
    assert_eq!(fm.epoch, epoch + 1);
    let active = fm.filesystems["cephfs"].active.clone().unwrap();
    assert_eq!((active.state, active.since_ms), (MdsState::Active, 13));
}

#[test]
fn a_timed_out_active_is_fenced_and_replaced_by_a_newer_incarnation() {
    let (_, mut fm) = with_fs();
    fm.mds_beacon(&beacon("a", MdsState::Standby, 0), 1)
        .unwrap();
    fm.mds_beacon(&beacon("a", MdsState::Active, 1), 2).unwrap();
    fm.mds_beacon(&beacon("b", MdsState::Standby, 0), 3)
        .unwrap();
    // A stale guard (another instance) does nothing.
    assert!(fm.mds_timed_out("a", "someone-else", 4).is_empty());
    let actions = fm.mds_timed_out("a", "client.mds.a.1", 5);
    assert_eq!(
        actions,
        vec![FsAction::Blocklist {
            instance: "client.mds.a.1".into()
        }]
    );
    let active = fm.filesystems["cephfs"].active.clone().unwrap();
    assert_eq!(
        (active.name.as_str(), active.state, active.incarnation),
        ("b", MdsState::Replay, 2)
    );
    assert!(fm.standbys.is_empty());
    // b learns it from its next beacon; a's late beacon is told to stop.
    let (r, _) = fm
        .mds_beacon(&beacon("b", MdsState::Standby, 0), 6)
        .unwrap();
    assert_eq!(
        r,
        MdsAssignment::Active {
            fs: "cephfs".into(),
            incarnation: 2
        }
    );
    let (r, _) = fm.mds_beacon(&beacon("a", MdsState::Active, 1), 6).unwrap();
    assert_eq!(r, MdsAssignment::Stop);
    // b with a wrong incarnation is stopped as well.
    let (r, _) = fm.mds_beacon(&beacon("b", MdsState::Active, 1), 6).unwrap();
    assert_eq!(r, MdsAssignment::Stop);
}

#[test]
fn with_no_standby_the_file_system_waits_and_incarnations_never_repeat() {
    let (_, mut fm) = with_fs();
    fm.mds_beacon(&beacon("a", MdsState::Standby, 0), 1)
        .unwrap();
    fm.mds_fail("a", 2).unwrap();
    assert!(fm.filesystems["cephfs"].active.is_none());
    // a comes back (as a fresh standby) and takes the role again with incarnation 2.
    let (r, _) = fm
        .mds_beacon(&beacon("a", MdsState::Standby, 0), 3)
        .unwrap();
    assert_eq!(
        r,
        MdsAssignment::Active {
            fs: "cephfs".into(),
            incarnation: 2
        }
    );
    assert!(fm.mds_fail("zz", 4).is_err());
}

#[test]
fn a_restarted_active_with_a_new_instance_is_fenced_first() {
    let (_, mut fm) = with_fs();
    fm.mds_beacon(&beacon("a", MdsState::Standby, 0), 1)
        .unwrap();
    let mut again = beacon("a", MdsState::Standby, 0);
    again.instance = "client.mds.a.2".into();
    let (r, actions) = fm.mds_beacon(&again, 2).unwrap();
    assert_eq!(
        actions,
        vec![FsAction::Blocklist {
            instance: "client.mds.a.1".into()
        }]
    );
    assert_eq!(
        r,
        MdsAssignment::Active {
            fs: "cephfs".into(),
            incarnation: 2
        }
    );
}

#[test]
fn fs_fail_blocks_takeover_until_joinable_and_allows_rm() {
    let (_, mut fm) = with_fs();
    fm.mds_beacon(&beacon("a", MdsState::Standby, 0), 1)
        .unwrap();
    fm.mds_beacon(&beacon("b", MdsState::Standby, 0), 1)
        .unwrap();
    let e = fm.fs_rm("cephfs").unwrap_err();
    assert!(e.to_string().contains("kelp fs fail cephfs"), "{e}");
    let actions = fm.fs_fail("cephfs").unwrap();
    assert_eq!(actions.len(), 1);
    assert!(fm.filesystems["cephfs"].active.is_none());
    assert_eq!(fm.standbys.len(), 1, "b is not promoted into a failed fs");
    fm.fs_set("cephfs", "joinable", "true", 5).unwrap();
    assert_eq!(fm.filesystems["cephfs"].active.as_ref().unwrap().name, "b");
    fm.fs_fail("cephfs").unwrap();
    fm.fs_rm("cephfs").unwrap();
    assert!(fm.filesystems.is_empty());
    let (r, _) = fm.mds_beacon(&beacon("b", MdsState::Active, 2), 6).unwrap();
    assert_eq!(r, MdsAssignment::Stop, "the fs is gone");
}

#[test]
fn a_standby_that_wants_a_file_system_is_preferred_for_it() {
    let om = osdmap();
    let mut fm = FsMap::new();
    let mut any = beacon("a", MdsState::Standby, 0);
    any.fs = None;
    let mut wants = beacon("z", MdsState::Standby, 0);
    wants.fs = Some("two".into());
    fm.mds_beacon(&any, 1).unwrap();
    fm.mds_beacon(&wants, 1).unwrap();
    fm.fs_new(&om, "two", "meta2", "data2", false, 2).unwrap();
    assert_eq!(fm.filesystems["two"].active.as_ref().unwrap().name, "z");
    fm.fs_new(&om, "one", "meta", "data", false, 3).unwrap();
    assert_eq!(fm.filesystems["one"].active.as_ref().unwrap().name, "a");
}

#[test]
fn bad_beacons_are_refused_and_encoding_round_trips() {
    let (_, mut fm) = with_fs();
    let mut b = beacon("a", MdsState::Standby, 0);
    b.instance = String::new();
    assert!(fm.mds_beacon(&b, 1).is_err());
    assert!(fm.mds_beacon(&beacon("", MdsState::Standby, 0), 1).is_err());
    fm.mds_beacon(&beacon("a", MdsState::Standby, 0), 1)
        .unwrap();
    let bytes = fm.encode();
    assert_eq!(FsMap::decode(&bytes).unwrap(), fm);
    assert!(FsMap::decode(&[]).is_err());
    assert!(FsMap::decode(&[9, 0]).is_err());
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// MDS `n`, restart generation `g` (its instance), beaconing what it was last told.
        Beacon {
            n: u8,
            g: u8,
            wants: Option<u8>,
        },
        TimedOut {
            n: u8,
            g: u8,
        },
        MdsFail(u8),
        FsFail(u8),
        Joinable(u8),
        Rm(u8),
        New(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..4u8, 0..2u8, proptest::option::of(0..2u8))
                .prop_map(|(n, g, wants)| Op::Beacon { n, g, wants }),
            2 => (0..4u8, 0..2u8).prop_map(|(n, g)| Op::TimedOut { n, g }),
            1 => (0..4u8).prop_map(Op::MdsFail),
            1 => (0..2u8).prop_map(Op::FsFail),
            1 => (0..2u8).prop_map(Op::Joinable),
            1 => (0..2u8).prop_map(Op::Rm),
            1 => (0..2u8).prop_map(Op::New),
        ]
    }

    fn fs_name(i: u8) -> String {
        format!("fs{i}")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Any sequence of beacons, timeouts and operator commands keeps the map's invariants:
        /// one place per MDS name, incarnations that only grow, every active MDS that loses its
        /// role fenced in the same step, no joinable file system left without an MDS while a
        /// standby could take it, and the epoch growing by one per change.
        #[test]
        fn invariants_hold(ops in proptest::collection::vec(op(), 1..60)) {
            let om = osdmap();
            let pools = [("meta", "data"), ("meta2", "data2")];
            let mut fm = FsMap::new();
            // what each (name, generation) believes: (state, incarnation)
            let mut belief: std::collections::HashMap<(u8, u8), (MdsState, u64)> =
                std::collections::HashMap::new();
            let mut high: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
            for (t, op) in ops.into_iter().enumerate() {
                let now = t as u64;
                let before = fm.clone();
                let actions = match op {
                    Op::Beacon { n, g, wants } => {
                        let (state, incarnation) =
                            belief.get(&(n, g)).copied().unwrap_or((MdsState::Standby, 0));
                        let b = MdsBeacon {
                            name: format!("m{n}"),
                            addr: "127.0.0.1:1".parse().unwrap(),
                            instance: format!("i{n}.{g}"),
                            fs: wants.map(fs_name),
                            state,
                            incarnation,
                        };
                        let (a, actions) = fm.mds_beacon(&b, now).unwrap();
                        let next = match a {
                            MdsAssignment::Active { incarnation, .. } => {
                                let s = if state == MdsState::Standby {
                                    MdsState::Replay
                                } else {
                                    MdsState::Active
                                };
                                (s, incarnation)
                            }
                            MdsAssignment::Standby | MdsAssignment::Stop => (MdsState::Standby, 0),
                        };
                        belief.insert((n, g), next);
                        actions
                    }
                    Op::TimedOut { n, g } => fm.mds_timed_out(&format!("m{n}"), &format!("i{n}.{g}"), now),
                    Op::MdsFail(n) => fm.mds_fail(&format!("m{n}"), now).unwrap_or_default(),
                    Op::FsFail(i) => fm.fs_fail(&fs_name(i)).unwrap_or_default(),
                    Op::Joinable(i) => {
                        let _ = fm.fs_set(&fs_name(i), "joinable", "true", now);
                        Vec::new()
                    }
                    Op::Rm(i) => {
                        let _ = fm.fs_rm(&fs_name(i));
                        Vec::new()
                    }
                    Op::New(i) => {
                        let (m, d) = pools[i as usize];
                        let _ = fm.fs_new(&om, &fs_name(i), m, d, false, now);
                        Vec::new()
                    }
                };
                // epoch: +1 per change, unchanged otherwise
                if fm == before {
                    prop_assert!(actions.is_empty());
                } else {
                    prop_assert_eq!(fm.epoch, before.epoch + 1);
                }
                // one place per name
                let mut names: Vec<&str> = fm.mds_daemons().map(|d| d.name.as_str()).collect();
                let count = names.len();
                names.sort_unstable();
                names.dedup();
                prop_assert_eq!(names.len(), count);
                for fs in fm.filesystems.values() {
                    // incarnations only grow (per file system, while it exists)
                    let h = high.entry(fs.name.clone()).or_insert(0);
                    prop_assert!(fs.last_incarnation >= *h);
                    *h = fs.last_incarnation;
                    if let Some(a) = &fs.active {
                        prop_assert!(a.incarnation >= 1 && a.incarnation <= fs.last_incarnation);
                        prop_assert!(a.state != MdsState::Standby);
                    } else if !fs.failed {
                        prop_assert_eq!(fm.standbys_for(&fs.name).count(), 0);
                    }
                }
                // an active that lost its role (same fs, other holder or none) was fenced
                for (name, old) in &before.filesystems {
                    let Some(a) = &old.active else { continue };
                    let still = fm
                        .filesystems
                        .get(name)
                        .and_then(|f| f.active.as_ref())
                        .is_some_and(|n| n.instance == a.instance && n.incarnation == a.incarnation);
                    if !still {
                        prop_assert!(
                            actions.contains(&FsAction::Blocklist { instance: a.instance.clone() }),
                            "{} lost {} without being fenced", a.name, name
                        );
                    }
                }
                for name in before.filesystems.keys().filter(|n| !fm.filesystems.contains_key(*n)) {
                    high.remove(name);
                }
            }
        }
    }
}
