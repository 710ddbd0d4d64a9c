//! The state machine alone: a sequence of entries applied to `MonState`, no Raft, no network.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use kelp_maps::PoolSpec;
use kelp_mon::{InitSpec, MonEntry, MonInfo, MonState};
use kelp_proto::{MonCommand, MonReply, OsdBoot};

fn init() -> MonEntry {
    MonEntry::Init(InitSpec {
        fsid: "f5c0ffee-0000-4000-8000-000000000001".into(),
        failure_domain: "osd".into(),
        keys: vec![
            ("client.admin".into(), "YWRtaW4=".into()),
            ("mon.a".into(), "bW9u".into()),
        ],
        monmap: vec![MonInfo {
            name: "a".into(),
            addr: "127.0.0.1:6789".parse().unwrap(),
        }],
    })
}

fn cmd(c: MonCommand) -> MonEntry {
    MonEntry::Command(c)
}

fn err(r: MonReply) -> String {
    match r {
        MonReply::Error { message } => message,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn commands_before_init_are_refused_and_init_is_idempotent() {
    let mut s = MonState::default();
    let m = err(s.apply(&cmd(MonCommand::OsdCreate {
        id: None,
        uuid: "u".into(),
        host: "h".into(),
        crush_weight: 0x10000,
    })));
    assert!(m.contains("not initialised"), "{m}");
    assert_eq!(s.apply(&init()), MonReply::Done { epoch: 1 });
    assert_eq!(s.apply(&init()), MonReply::Done { epoch: 1 });
    assert_eq!(s.secret("client.admin"), Some("YWRtaW4="));
}

#[test]
fn a_sequence_of_commands() {
    let mut s = MonState::default();
    s.apply(&init());
    for i in 0..3 {
        let r = s.apply(&cmd(MonCommand::OsdCreate {
            id: None,
            uuid: format!("uuid-{i}"),
            host: format!("host{i}"),
            crush_weight: 0x10000,
        }));
        assert_eq!(
            r,
            MonReply::OsdId {
                id: i,
                epoch: 2 + i as u32
            }
        );
    }
    // Same uuid again: same id, no new epoch.
    let r = s.apply(&cmd(MonCommand::OsdCreate {
        id: None,
        uuid: "uuid-1".into(),
        host: "host1".into(),
        crush_weight: 0x10000,
    }));
    assert_eq!(r, MonReply::OsdId { id: 1, epoch: 4 });

    let addr = "127.0.0.1:7000".parse().unwrap();
    let m = err(s.apply(&MonEntry::OsdBoot(OsdBoot {
        id: 0,
        uuid: "wrong".into(),
        addr,
    })));
    assert!(m.contains("uuid"), "{m}");
    assert_eq!(
        s.apply(&MonEntry::OsdBoot(OsdBoot {
            id: 0,
            uuid: "uuid-0".into(),
            addr
        })),
        MonReply::Done { epoch: 5 }
    );
    let up_from = s.osdmap().unwrap().osds[&0].up_from;
    assert_eq!(up_from, 5);

    // Pool defaults come from the central config.
    s.apply(&cmd(MonCommand::ConfigSet {
        who: "global".into(),
        key: "osd_pool_default_size".into(),
        value: "2".into(),
    }));
    let r = s.apply(&cmd(MonCommand::PoolCreate(PoolSpec {
        name: "rbd".into(),
        ..Default::default()
    })));
    assert_eq!(r, MonReply::PoolId { id: 1, epoch: 6 });
    let pool = s.osdmap().unwrap().pool_by_name("rbd").unwrap().clone();
    assert_eq!((pool.size, pool.min_size, pool.pg_num), (2, 1, 32));
    assert!(
        err(s.apply(&cmd(MonCommand::PoolCreate(PoolSpec {
            name: "rbd".into(),
            ..Default::default()
        }))))
        .contains("already exists")
    );

    // Config validation.
    let m = err(s.apply(&cmd(MonCommand::ConfigSet {
        who: "osd".into(),
        key: "osd_max_backfils".into(),
        value: "2".into(),
    })));
    assert!(m.contains("unknown config key 'osd_max_backfils'"), "{m}");
    let m = err(s.apply(&cmd(MonCommand::ConfigSet {
        who: "osd".into(),
        key: "osd_max_backfills".into(),
        value: "many".into(),
    })));
    assert!(m.contains("invalid value"), "{m}");
    assert!(
        err(s.apply(&cmd(MonCommand::SetFlag {
            flag: "nope".into(),
            on: true
        })))
        .contains("unknown cluster flag")
    );
    assert_eq!(
        s.apply(&cmd(MonCommand::SetFlag {
            flag: "noout".into(),
            on: true
        })),
        MonReply::Done { epoch: 7 }
    );

    // A stale mark-down (wrong up_from) does nothing; the right one marks the OSD down.
    assert_eq!(
        s.apply(&MonEntry::MarkDown { id: 0, up_from: 3 }),
        MonReply::Done { epoch: 7 }
    );
    assert_eq!(
        s.apply(&MonEntry::MarkDown { id: 0, up_from }),
        MonReply::Done { epoch: 8 }
    );
    assert!(!s.osdmap().unwrap().osds[&0].up);
    // noout is set: mark-out is a no-op.
    let down_at = s.osdmap().unwrap().osds[&0].down_at;
    assert_eq!(
        s.apply(&MonEntry::MarkOut { id: 0, down_at }),
        MonReply::Done { epoch: 8 }
    );
    assert!(s.osdmap().unwrap().osds[&0].is_in());

    // Auth: get-or-create keeps an existing secret; mon keys cannot be removed.
    let r = s.apply(&MonEntry::AuthGetOrCreate {
        entity: "osd.0".into(),
        secret: "c2VjcmV0".into(),
    });
    assert_eq!(
        r,
        MonReply::Key {
            entity: "osd.0".into(),
            secret: "c2VjcmV0".into()
        }
    );
    let r = s.apply(&MonEntry::AuthGetOrCreate {
        entity: "osd.0".into(),
        secret: "b3RoZXI=".into(),
    });
    assert_eq!(
        r,
        MonReply::Key {
            entity: "osd.0".into(),
            secret: "c2VjcmV0".into()
        }
    );
    assert!(
        err(s.apply(&cmd(MonCommand::AuthRm {
            entity: "mon.a".into()
        })))
        .contains("cannot be removed")
    );
    assert_eq!(
        s.read_only(&MonCommand::AuthList),
        MonReply::Entities(vec!["client.admin".into(), "mon.a".into(), "osd.0".into()])
    );

    // The encoded state round-trips exactly, and so does every later decision.
    let copy = MonState::decode(&s.encode()).unwrap();
    assert_eq!(copy.encode(), s.encode());
}

#[test]
fn incrementals_are_kept_up_to_the_limit_then_full_maps() {
    let mut s = MonState::default();
    s.apply(&init());
    s.apply(&cmd(MonCommand::ConfigSet {
        who: "mon".into(),
        key: "mon_max_incrementals".into(),
        value: "3".into(),
    }));
    for i in 0..6 {
        s.apply(&cmd(MonCommand::OsdCreate {
            id: None,
            uuid: format!("u{i}"),
            host: "h".into(),
            crush_weight: 0x10000,
        }));
    }
    assert_eq!(s.epoch(), 7);
    let u = s.catch_up(6);
    assert!(u.full.is_none());
    assert_eq!(u.incrementals.len(), 1);
    let u = s.catch_up(4);
    assert!(u.full.is_none());
    assert_eq!(u.incrementals.len(), 3);
    let u = s.catch_up(3);
    assert!(u.full.is_some(), "too far behind: full map");
    assert!(s.catch_up(0).full.is_some());
    let u = s.catch_up(7);
    assert!(u.full.is_none() && u.incrementals.is_empty());
    // The subscriber's own application gives the same map.
    let mut sub = kelp_maps::OsdMap::decode(s.catch_up(0).full.as_ref().unwrap()).unwrap();
    assert_eq!(sub.epoch, 7);
    let maps = kelp_mon::client::apply_update(Some(&sub), &s.catch_up(7))
        .unwrap()
        .unwrap();
    assert!(maps.is_empty());
    sub.epoch = 7;
    assert_eq!(&sub, s.osdmap().unwrap());
}

#[test]
fn the_full_flag_is_the_monitors_own() {
    let mut s = MonState::default();
    s.apply(&init());
    let m = err(s.apply(&cmd(MonCommand::SetFlag {
        flag: "full".into(),
        on: true,
    })));
    assert!(m.contains("set and cleared by the monitors"), "{m}");
    let e0 = s.epoch();
    assert_eq!(
        s.apply(&MonEntry::SetFull { on: true }),
        MonReply::Done { epoch: e0 + 1 }
    );
    let map = s.osdmap().unwrap();
    assert!(map.has_flag(kelp_maps::ClusterFlag::Full));
    assert_eq!(
        map.flags.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
        ["full"]
    );
    // Setting it again changes nothing; clearing it bumps the epoch.
    assert_eq!(
        s.apply(&MonEntry::SetFull { on: true }),
        MonReply::Done { epoch: e0 + 1 }
    );
    assert_eq!(
        s.apply(&MonEntry::SetFull { on: false }),
        MonReply::Done { epoch: e0 + 2 }
    );
    assert!(!s.osdmap().unwrap().has_flag(kelp_maps::ClusterFlag::Full));
    // The osd_stats_interval key exists with its default.
    assert_eq!(
        s.config_value("osd.1", "osd_stats_interval").as_deref(),
        Some("2")
    );
}

fn booted_osds(s: &mut MonState, n: i32) {
    for i in 0..n {
        s.apply(&cmd(MonCommand::OsdCreate {
            id: Some(i),
            uuid: format!("uuid-{i}"),
            host: "h".into(),
            crush_weight: 0x10000,
        }));
        boot(s, i, 7000);
    }
}

fn boot(s: &mut MonState, id: i32, port: u16) -> MonReply {
    s.apply(&MonEntry::OsdBoot(OsdBoot {
        id,
        uuid: format!("uuid-{id}"),
        addr: format!("127.0.0.1:{}", port + id as u16).parse().unwrap(),
    }))
}

fn osd(s: &MonState, id: i32) -> kelp_maps::OsdInfo {
    s.osdmap().unwrap().osds[&id].clone()
}

fn flag(s: &mut MonState, name: &str, on: bool) {
    s.apply(&cmd(MonCommand::SetFlag {
        flag: name.into(),
        on,
    }));
}

fn mark_down_out(s: &mut MonState, id: i32) {
    let o = osd(s, id);
    s.apply(&MonEntry::MarkDown {
        id,
        up_from: o.up_from,
    });
    let o = osd(s, id);
    assert!(!o.up);
    s.apply(&MonEntry::MarkOut {
        id,
        down_at: o.down_at,
    });
}

#[test]
fn auto_out_osds_come_back_in_at_boot_operator_out_ones_do_not() {
    let mut s = MonState::default();
    s.apply(&init());
    booted_osds(&mut s, 3);
    mark_down_out(&mut s, 1);
    assert!(!osd(&s, 1).is_in());
    assert!(s.auto_out().contains(&1));
    boot(&mut s, 1, 7100);
    assert!(osd(&s, 1).up && osd(&s, 1).is_in());
    assert!(s.auto_out().is_empty());

    // Marked out by the operator: stays out after a reboot.
    s.apply(&MonEntry::MarkDown {
        id: 2,
        up_from: osd(&s, 2).up_from,
    });
    s.apply(&cmd(MonCommand::OsdOut { id: 2 }));
    boot(&mut s, 2, 7200);
    assert!(osd(&s, 2).up && !osd(&s, 2).is_in());

    // Auto out, then the operator marks it out too: an operator decision, it stays out.
    mark_down_out(&mut s, 0);
    s.apply(&cmd(MonCommand::OsdOut { id: 0 }));
    boot(&mut s, 0, 7300);
    assert!(!osd(&s, 0).is_in());

    // The set survives a snapshot.
    mark_down_out(&mut s, 1);
    let copy = MonState::decode(&s.encode()).unwrap();
    assert!(copy.auto_out().contains(&1));
}

#[test]
fn noin_keeps_booting_osds_out_and_noup_refuses_boots() {
    let mut s = MonState::default();
    s.apply(&init());
    booted_osds(&mut s, 2);
    mark_down_out(&mut s, 1);
    flag(&mut s, "noin", true);
    boot(&mut s, 1, 7100);
    assert!(osd(&s, 1).up && !osd(&s, 1).is_in());
    // A new OSD created under noin starts out, and goes in at a boot after noin is unset.
    s.apply(&cmd(MonCommand::OsdCreate {
        id: Some(2),
        uuid: "uuid-2".into(),
        host: "h".into(),
        crush_weight: 0x10000,
    }));
    boot(&mut s, 2, 7000);
    assert!(!osd(&s, 2).is_in());
    flag(&mut s, "noin", false);
    s.apply(&MonEntry::MarkDown {
        id: 2,
        up_from: osd(&s, 2).up_from,
    });
    boot(&mut s, 2, 7200);
    assert!(osd(&s, 2).is_in());

    // noup: a boot is refused and the OSD stays down.
    s.apply(&MonEntry::MarkDown {
        id: 0,
        up_from: osd(&s, 0).up_from,
    });
    flag(&mut s, "noup", true);
    let m = err(boot(&mut s, 0, 7400));
    assert!(m.contains("noup"), "{m}");
    assert!(!osd(&s, 0).up);
    flag(&mut s, "noup", false);
    boot(&mut s, 0, 7400);
    assert!(osd(&s, 0).up);

    // nodown: a MarkDown from the leader's timers is a no-op; noout likewise for MarkOut.
    flag(&mut s, "nodown", true);
    s.apply(&MonEntry::MarkDown {
        id: 0,
        up_from: osd(&s, 0).up_from,
    });
    assert!(osd(&s, 0).up);
    flag(&mut s, "nodown", false);
    flag(&mut s, "noout", true);
    s.apply(&MonEntry::MarkDown {
        id: 0,
        up_from: osd(&s, 0).up_from,
    });
    s.apply(&MonEntry::MarkOut {
        id: 0,
        down_at: osd(&s, 0).down_at,
    });
    assert!(osd(&s, 0).is_in());
}

fn activate(
    s: &mut MonState,
    pg: kelp_types::PgId,
    epoch: u32,
    members: &[i32],
    heard: &[(i32, (u32, u64))],
) -> kelp_proto::ActivationVerdict {
    let r = s.apply(&cmd(MonCommand::PgActivate {
        activations: vec![kelp_proto::PgActivation {
            pg,
            primary: members[0],
            record: kelp_proto::PgRecord {
                epoch,
                members: members.to_vec(),
                last_update: (epoch, 10),
            },
            heard: heard.to_vec(),
        }],
    }));
    match r {
        MonReply::PgActivated(mut v) if v.len() == 1 => v.remove(0),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn pg_activation_records_lost_osds_purges_and_pool_deletes() {
    use kelp_proto::ActivationVerdict;
    let mut s = MonState::default();
    s.apply(&init());
    booted_osds(&mut s, 3);
    let r = s.apply(&cmd(MonCommand::PoolCreate(PoolSpec {
        name: "p".into(),
        pg_num: Some(4),
        size: Some(2),
        min_size: Some(1),
        ..Default::default()
    })));
    let MonReply::PoolId { id: pool, .. } = r else {
        panic!("{r:?}")
    };
    let pg = kelp_types::PgId::new(pool, 1);
    assert_eq!(
        activate(&mut s, pg, 5, &[0, 1], &[(0, (0, 0)), (1, (0, 0))]),
        ActivationVerdict::Recorded
    );
    // osd.1 alone afterwards (heard osd.1 with the record's history)
    assert_eq!(
        activate(&mut s, pg, 6, &[1], &[(1, (5, 10))]),
        ActivationVerdict::Recorded
    );
    // osd.0 back alone with its old copy: blocked, the record names osd.1
    match activate(&mut s, pg, 8, &[0], &[(0, (5, 10))]) {
        ActivationVerdict::Blocked { current } => assert_eq!(current.members, vec![1]),
        other => panic!("{other:?}"),
    }
    // records survive a snapshot
    let copy = MonState::decode(&s.encode()).unwrap();
    assert_eq!(copy.pg_record(pg), s.pg_record(pg));
    assert_eq!(s.pg_record(pg).unwrap().members, vec![1]);
    // a PG of no pool
    let bogus = kelp_types::PgId::new(pool, 99);
    assert_eq!(
        activate(&mut s, bogus, 8, &[0], &[(0, (0, 0))]),
        ActivationVerdict::NoSuchPg
    );
    // osd lost: refused while up; once down, its PGs stop waiting for it
    let m = err(s.apply(&cmd(MonCommand::OsdLost { id: 1 })));
    assert!(m.contains("is up"), "{m}");
    s.apply(&cmd(MonCommand::OsdDown { id: 1 }));
    assert!(matches!(
        s.apply(&cmd(MonCommand::OsdLost { id: 1 })),
        MonReply::Done { .. }
    ));
    assert_eq!(
        activate(&mut s, pg, 9, &[0], &[(0, (5, 10))]),
        ActivationVerdict::Recorded
    );
    // an older peering is stale
    assert!(matches!(
        activate(&mut s, pg, 7, &[2], &[(2, (0, 0))]),
        ActivationVerdict::Stale { .. }
    ));
    // deleting the pool drops its records
    s.apply(&cmd(MonCommand::PoolDelete { name: "p".into() }));
    assert_eq!(s.pg_record(pg), None);
}

#[test]
fn erasure_code_profiles_and_pools() {
    let mut s = MonState::default();
    s.apply(&init());
    for i in 0..3 {
        s.apply(&cmd(MonCommand::OsdCreate {
            id: None,
            uuid: format!("uuid-{i}"),
            host: "h".into(),
            crush_weight: 0x10000,
        }));
    }
    // a replicated default that an erasure-coded pool must not take
    s.apply(&cmd(MonCommand::ConfigSet {
        who: "global".into(),
        key: "osd_pool_default_size".into(),
        value: "2".into(),
    }));
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let set = |name: &str, w: &[&str], force: bool| {
        cmd(MonCommand::EcProfileSet {
            name: name.into(),
            words: words(w),
            force,
        })
    };
    // the words are validated by the monitors
    let m = err(s.apply(&set("p", &["k=2", "m=zero"], false)));
    assert!(m.contains("m=\"zero\" is not a whole number"), "{m}");
    let epoch = s.epoch();
    let p21 = ["k=2", "m=1", "crush-failure-domain=osd"];
    assert_eq!(
        s.apply(&set("p", &p21, false)),
        MonReply::Done { epoch: epoch + 1 }
    );
    assert_eq!(
        s.apply(&set("p", &p21, false)),
        MonReply::Done { epoch: epoch + 1 },
        "the same profile again makes no epoch"
    );
    assert!(err(s.apply(&set("p", &["k=2", "m=2"], false))).contains("will not override"));
    match s.read_only(&MonCommand::EcProfileGet { name: "p".into() }) {
        MonReply::EcProfile { name, pairs } => {
            assert_eq!(name, "p");
            assert!(pairs.contains(&("m".into(), "1".into())), "{pairs:?}");
            assert!(pairs.contains(&("crush-failure-domain".into(), "osd".into())));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err(s.read_only(&MonCommand::EcProfileGet { name: "x".into() })).contains("does not exist")
    );
    assert_eq!(
        s.apply(&cmd(MonCommand::EcProfileLs)),
        MonReply::EcProfileNames(vec!["default".into(), "p".into()])
    );
    // size and min_size come from the profile, pg_num from the config
    let r = s.apply(&cmd(MonCommand::PoolCreate(PoolSpec {
        name: "ec".into(),
        erasure: Some("p".into()),
        ..Default::default()
    })));
    assert!(matches!(r, MonReply::PoolId { .. }), "{r:?}");
    let pool = s.osdmap().unwrap().pool_by_name("ec").unwrap().clone();
    assert_eq!((pool.size, pool.min_size, pool.pg_num), (3, 2, 32));
    assert_eq!(pool.ec().map(|c| (c.k, c.m)), Some((2, 1)));
    let m = err(s.apply(&cmd(MonCommand::EcProfileRm { name: "p".into() })));
    assert!(m.contains("used by pool(s) ec"), "{m}");
    s.apply(&cmd(MonCommand::PoolDelete { name: "ec".into() }));
    assert!(matches!(
        s.apply(&cmd(MonCommand::EcProfileRm { name: "p".into() })),
        MonReply::Done { .. }
    ));
    assert!(
        err(s.apply(&cmd(MonCommand::EcProfileRm { name: "p".into() }))).contains("does not exist")
    );
}

#[test]
fn the_blocklist_is_replicated_state_with_leader_clock_expiries() {
    let mut s = MonState::default();
    s.apply(&init());
    let e0 = s.epoch();
    let ls = |s: &MonState| match s.read_only(&MonCommand::BlocklistLs) {
        MonReply::Blocklist(entries) => entries
            .into_iter()
            .map(|e| (e.instance, e.expires))
            .collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    // Without an expiry a command applies as it is; with one, only as the leader's entry.
    let r = s.apply(&cmd(MonCommand::BlocklistAdd {
        instance: "client.a.1".into(),
        expire_secs: None,
    }));
    assert_eq!(r, MonReply::Done { epoch: e0 + 1 });
    let m = err(s.apply(&cmd(MonCommand::BlocklistAdd {
        instance: "client.b.2".into(),
        expire_secs: Some(10),
    })));
    assert!(m.contains("leader"), "{m}");
    let r = s.apply(&MonEntry::BlocklistAdd {
        instance: "client.b.2".into(),
        until_ms: Some(5_000),
    });
    assert_eq!(r, MonReply::Done { epoch: e0 + 2 });
    assert_eq!(
        ls(&s),
        vec![
            ("client.a.1".to_string(), None),
            ("client.b.2".to_string(), Some(5_000))
        ]
    );
    assert!(s.osdmap().unwrap().is_blocklisted("client.a.1", u64::MAX));
    // Subscribers see it in the incrementals.
    let update = s.catch_up(e0);
    let mut map = kelp_maps::OsdMap::decode(&s.catch_up(0).full.unwrap()).unwrap();
    assert!(map.blocklist.contains_key("client.b.2"));
    assert_eq!(update.incrementals.len(), 2);
    // Expiry removes only what is due; rm of a missing entry is no new epoch.
    assert_eq!(
        s.apply(&MonEntry::BlocklistExpire { now_ms: 4_999 }),
        MonReply::Done { epoch: e0 + 2 }
    );
    assert_eq!(
        s.apply(&MonEntry::BlocklistExpire { now_ms: 5_000 }),
        MonReply::Done { epoch: e0 + 3 }
    );
    assert_eq!(ls(&s), vec![("client.a.1".to_string(), None)]);
    s.apply(&cmd(MonCommand::BlocklistRm {
        instance: "client.a.1".into(),
    }));
    assert!(ls(&s).is_empty());
    let r = s.apply(&cmd(MonCommand::BlocklistRm {
        instance: "client.a.1".into(),
    }));
    assert_eq!(r, MonReply::Done { epoch: e0 + 4 });
    // The state (and its map) survive a snapshot round trip.
    s.apply(&cmd(MonCommand::BlocklistAdd {
        instance: "client.c.3".into(),
        expire_secs: None,
    }));
    let back = MonState::decode(&s.encode()).unwrap();
    map = back.osdmap().unwrap().clone();
    assert!(map.blocklist.contains_key("client.c.3"));
}

#[test]
fn self_managed_snapshot_ids_are_allocated_and_removed_by_the_monitors() {
    let mut s = MonState::default();
    s.apply(&init());
    booted_osds(&mut s, 3);
    let r = s.apply(&cmd(MonCommand::PoolCreate(PoolSpec {
        name: "p".into(),
        pg_num: Some(4),
        ..Default::default()
    })));
    let MonReply::PoolId { id: pool, .. } = r else {
        panic!("{r:?}")
    };
    for want in 1..=2u64 {
        let r = s.apply(&cmd(MonCommand::PoolSnapCreate { pool: "p".into() }));
        let MonReply::SnapId { snap, epoch } = r else {
            panic!("{r:?}")
        };
        assert_eq!(snap, want);
        assert_eq!(epoch, s.osdmap().unwrap().epoch);
    }
    let r = s.apply(&cmd(MonCommand::PoolSnapRemove {
        pool: "p".into(),
        snap: 1,
    }));
    assert!(matches!(r, MonReply::Done { .. }), "{r:?}");
    let map = s.osdmap().unwrap();
    assert_eq!(map.pools[&pool].snap_seq, 2);
    assert!(map.pools[&pool].removed_snaps.contains(&1));
    assert!(
        err(s.apply(&cmd(MonCommand::PoolSnapRemove {
            pool: "p".into(),
            snap: 9,
        })))
        .contains("1..=2")
    );
    assert!(
        err(s.apply(&cmd(MonCommand::PoolSnapCreate {
            pool: "nope".into()
        })))
        .contains("nope")
    );
}

fn fs(c: MonCommand, now_ms: u64) -> MonEntry {
    MonEntry::Fs { cmd: c, now_ms }
}

fn mds(name: &str, state: kelp_maps::MdsState, incarnation: u64) -> MonCommand {
    MonCommand::MdsBeacon(kelp_maps::MdsBeacon {
        name: name.into(),
        addr: "127.0.0.1:6800".parse().unwrap(),
        instance: format!("client.mds-{name}.1"),
        fs: None,
        state,
        incarnation,
    })
}

#[test]
fn file_systems_are_replicated_state_and_failed_mds_are_blocklisted() {
    use kelp_maps::{MdsAssignment, MdsState};
    let mut s = MonState::default();
    s.apply(&init());
    booted_osds(&mut s, 3);
    for name in ["meta", "data"] {
        s.apply(&cmd(MonCommand::PoolCreate(PoolSpec {
            name: name.into(),
            pg_num: Some(4),
            size: Some(1),
            ..PoolSpec::default()
        })));
    }
    // Without the leader's clock a file-system command is refused.
    let m = err(s.apply(&cmd(MonCommand::FsRm { name: "x".into() })));
    assert!(m.contains("leader's clock"), "{m}");
    let new = MonCommand::FsNew {
        name: "cephfs".into(),
        metadata_pool: "meta".into(),
        data_pool: "data".into(),
        force: false,
    };
    assert!(matches!(
        s.apply(&fs(new.clone(), 1)),
        MonReply::Done { .. }
    ));
    assert!(err(s.apply(&fs(new, 1))).contains("already exists"));
    let m = err(s.apply(&cmd(MonCommand::PoolDelete {
        name: "meta".into(),
    })));
    assert!(m.contains("in use by file system 'cephfs'"), "{m}");
    assert_eq!(
        s.apply(&fs(mds("a", MdsState::Standby, 0), 2)),
        MonReply::MdsAssignment(MdsAssignment::Active {
            fs: "cephfs".into(),
            incarnation: 1
        })
    );
    s.apply(&fs(mds("b", MdsState::Standby, 0), 3));
    let epoch = s.epoch();
    // A stale timeout (another instance) changes nothing.
    s.apply(&MonEntry::MdsTimedOut {
        name: "a".into(),
        instance: "other".into(),
        now_ms: 4,
    });
    assert_eq!(s.epoch(), epoch);
    s.apply(&MonEntry::MdsTimedOut {
        name: "a".into(),
        instance: "client.mds-a.1".into(),
        now_ms: 5,
    });
    // Fenced in the OSD map (one new epoch), for mds_blocklist_interval from the leader's clock.
    assert_eq!(s.epoch(), epoch + 1);
    let until = s.osdmap().unwrap().blocklist["client.mds-a.1"];
    assert_eq!(until, Some(5 + 86_400_000));
    let active = s.fsmap().filesystems["cephfs"].active.clone().unwrap();
    assert_eq!((active.name.as_str(), active.incarnation), ("b", 2));
    // The state (file-system map included) survives a snapshot.
    let back = MonState::decode(&s.encode()).unwrap();
    assert_eq!(back.fsmap(), s.fsmap());
    assert_eq!(
        s.read_only(&MonCommand::FsMapGet),
        MonReply::FsMap(s.fsmap().clone())
    );
}

// Cluster log.
#[test]
fn cluster_log_is_numbered_capped_and_kept_in_snapshots() {
    use kelp_proto::{LogEntry, LogLevel};
    let entry = |m: &str| LogEntry {
        seq: 0,
        stamp_ms: 1000,
        level: LogLevel::Info,
        who: "mon.a".into(),
        message: m.into(),
    };
    let mut s = MonState::default();
    s.apply(&init());
    s.apply(&cmd(MonCommand::ConfigSet {
        who: "mon".into(),
        key: "mon_cluster_log_max".into(),
        value: "10".into(),
    }));
    s.apply(&MonEntry::ClusterLog(vec![entry("a"), entry("b")]));
    s.apply(&cmd(MonCommand::LogAppend {
        entries: vec![entry("c")],
    }));
    let last = s.log_last(2);
    assert_eq!(
        last.iter()
            .map(|e| (e.seq, e.message.as_str()))
            .collect::<Vec<_>>(),
        vec![(2, "b"), (3, "c")]
    );
    match s.read_only(&MonCommand::LogLast { n: 100 }) {
        MonReply::ClusterLog(all) => assert_eq!(all.len(), 3),
        other => panic!("{other:?}"),
    }
    for i in 0..20 {
        s.apply(&MonEntry::ClusterLog(vec![entry(&format!("e{i}"))]));
    }
    let all = s.log_last(100);
    assert_eq!(all.len(), 10, "capped at mon_cluster_log_max");
    assert_eq!(all.last().map(|e| e.seq), Some(23));
    // survives a snapshot
    let copy = MonState::decode(&s.encode()).unwrap();
    assert_eq!(copy.log_last(100), all);
    // the manager's commands are not log entries
    let m = err(s.apply(&cmd(MonCommand::MgrStat)));
    assert!(m.contains("in memory"), "{m}");
}
