//! Erasure-code profiles and erasure-coded pools in the OSD map: the decisions (what is
//! refused, with which message; the CRUSH rule made) and the PG mappings (positions kept,
//! holes marked `ITEM_NONE`).

use std::collections::BTreeSet;

use kelp_crush::{ITEM_NONE, RULE_TYPE_ERASURE, WEIGHT_ONE};
use kelp_ec::Profile;
use kelp_types::PgId;

use crate::osdmap::tests::cluster;
use crate::{Change, MapError, OsdMap, PoolKind, PoolSpec};

fn profile(words: &[&str]) -> Profile {
    Profile::from_words(words).unwrap()
}

fn set_profile(map: &mut OsdMap, name: &str, words: &[&str]) {
    let inc = map
        .propose_ec_profile_set(name, &profile(words), false)
        .unwrap()
        .unwrap();
    map.apply(&inc).unwrap();
}

fn ec_spec(name: &str, profile: &str) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        pg_num: Some(32),
        erasure: Some(profile.into()),
        ..PoolSpec::default()
    }
}

fn create(map: &mut OsdMap, spec: &PoolSpec) -> u32 {
    let (id, inc) = map.propose_pool_create(spec).unwrap();
    map.apply(&inc).unwrap();
    id
}

fn refusal<T: std::fmt::Debug>(r: Result<T, MapError>) -> String {
    r.unwrap_err().to_string()
}

fn rule_text(map: &OsdMap, name: &str) -> String {
    let text = map.crush.to_text();
    let start = text
        .find(&format!("rule {name} {{"))
        .unwrap_or_else(|| panic!("no rule {name} in\n{text}"));
    let end = start + text[start..].find("}\n").unwrap() + 2;
    text[start..end].to_string()
}

#[test]
fn a_new_map_has_cephs_default_profile() {
    let map = OsdMap::new("f", "host").unwrap();
    let default = &map.ec_profiles["default"];
    assert_eq!((default.k, default.m), (2, 2));
    assert_eq!(default.failure_domain, "host");
    assert_eq!(map.ec_profiles.len(), 1);
}

#[test]
fn profiles_are_set_reset_and_removed_as_ceph_allows() {
    let mut map = cluster(6, "host");
    let p = profile(&["k=2", "m=1", "crush-failure-domain=osd"]);
    let inc = map.propose_ec_profile_set("p", &p, false).unwrap().unwrap();
    assert_eq!(
        inc.changes,
        vec![Change::SetEcProfile {
            name: "p".into(),
            profile: p.clone()
        }]
    );
    map.apply(&inc).unwrap();
    assert_eq!(map.ec_profiles["p"], p);
    // the same settings again: nothing to do
    assert!(
        map.propose_ec_profile_set("p", &p, false)
            .unwrap()
            .is_none()
    );
    // different settings: Ceph's refusal, unless forced
    let other = profile(&["k=3", "m=1", "crush-failure-domain=osd"]);
    let msg = refusal(map.propose_ec_profile_set("p", &other, false));
    assert!(
        msg.starts_with("will not override erasure code profile p because the existing profile {")
            && msg.contains("k=2,m=1")
            && msg.contains("is different from the proposed profile {")
            && msg.contains("k=3,m=1")
            && msg.contains("--force"),
        "{msg}"
    );
    assert!(
        map.propose_ec_profile_set("p", &other, true)
            .unwrap()
            .is_some()
    );
    assert!(map.propose_ec_profile_set("bad name", &p, false).is_err());
    // rm: unknown, then in use (naming the pools), then free
    assert_eq!(
        map.propose_ec_profile_rm("nope").unwrap_err(),
        MapError::NoSuchEcProfile("nope".into())
    );
    create(&mut map, &ec_spec("ec1", "p"));
    create(&mut map, &ec_spec("ec2", "p"));
    let msg = refusal(map.propose_ec_profile_rm("p"));
    assert_eq!(
        msg,
        "erasure-code profile 'p' is used by pool(s) ec1, ec2: delete them first"
    );
    let msg = refusal(map.propose_ec_profile_set("p", &other, false));
    assert!(msg.contains("used by pool(s) ec1, ec2"), "{msg}");
    // forced: the pools keep the code they were made with
    let inc = map
        .propose_ec_profile_set("p", &other, true)
        .unwrap()
        .unwrap();
    map.apply(&inc).unwrap();
    assert_eq!(map.ec_profiles["p"].k, 3);
    assert_eq!(map.pool_by_name("ec1").unwrap().ec(), Some(&p));
    for name in ["ec1", "ec2"] {
        let inc = map.propose_pool_delete(name).unwrap();
        map.apply(&inc).unwrap();
    }
    let inc = map.propose_ec_profile_rm("p").unwrap();
    map.apply(&inc).unwrap();
    assert!(!map.ec_profiles.contains_key("p"));
    // an incremental removing a profile that is gone does not apply
    let mut stale = inc.clone();
    stale.epoch = map.epoch + 1;
    assert!(map.apply(&stale).is_err());
}

#[test]
fn an_erasure_pool_gets_its_own_rule_in_cephs_shape() {
    let mut map = cluster(6, "host"); // hosts host0..host2, two OSDs each
    set_profile(&mut map, "h21", &["k=2", "m=1"]);
    set_profile(&mut map, "o42", &["k=4", "m=2", "crush-failure-domain=osd"]);
    let id = create(&mut map, &ec_spec("ecpool", "h21"));
    let pool = map.pools[&id].clone();
    assert_eq!(pool.type_name(), "erasure");
    assert_eq!(pool.ec_profile_name(), Some("h21"));
    assert_eq!((pool.size, pool.min_size), (3, 2)); // m = 1: min_size k, as Ceph
    assert!(!pool.fast_read);
    assert!(pool.placement().erasure);
    let rule = map.crush.rule(pool.crush_rule).unwrap();
    assert_eq!(
        (rule.name.as_str(), rule.rule_type),
        ("ecpool", RULE_TYPE_ERASURE)
    );
    assert_eq!(
        rule_text(&map, "ecpool"),
        "rule ecpool {\n\tid 1\n\ttype erasure\n\tmin_size 3\n\tmax_size 20\n\
         \tstep set_chooseleaf_tries 5\n\tstep set_choose_tries 100\n\tstep take default\n\
         \tstep chooseleaf indep 0 type host\n\tstep emit\n}\n"
    );
    // one shard per host
    for pg in map.pool_pgs(id).unwrap() {
        let m = map.pg_mapping(pg).unwrap();
        assert_eq!(m.up.len(), 3, "{pg}");
        let hosts: BTreeSet<_> = m.up.iter().map(|&o| map.host_of(o)).collect();
        assert_eq!(hosts.len(), 3, "{pg}: shards on distinct hosts");
        assert_eq!(m.acting, m.up);
        assert_eq!(m.up_primary, m.up[0]);
    }
    // failure domain osd: `choose indep 0 type osd`, default min_size k+1
    let id = create(&mut map, &ec_spec("wide", "o42"));
    assert_eq!((map.pools[&id].size, map.pools[&id].min_size), (6, 5));
    assert!(rule_text(&map, "wide").contains("\tstep choose indep 0 type osd\n"));
    // the rule of a deleted pool goes with it; a rule another pool uses stays
    let shared = create(
        &mut map,
        &PoolSpec {
            crush_rule: Some("wide".into()),
            ..ec_spec("shared", "o42")
        },
    );
    assert_eq!(map.pools[&shared].crush_rule, map.pools[&id].crush_rule);
    assert!(
        map.crush.rule_by_name("shared").is_none(),
        "no rule of its own"
    );
    map.apply(&map.propose_pool_delete("wide").unwrap())
        .unwrap();
    assert!(
        map.crush.rule_by_name("wide").is_some(),
        "still used by 'shared'"
    );
    map.apply(&map.propose_pool_delete("ecpool").unwrap())
        .unwrap();
    assert!(map.crush.rule_by_name("ecpool").is_none());
    // a pool of the same name later gets a fresh rule (the freed id)
    let again = create(&mut map, &ec_spec("ecpool", "h21"));
    assert_eq!(map.pools[&again].crush_rule, 1);
    // and the map still round-trips through its encoding
    assert_eq!(OsdMap::decode(&map.encode()).unwrap(), map);
}

#[test]
fn erasure_pools_are_refused_without_enough_failure_domains() {
    let mut map = cluster(6, "host");
    set_profile(&mut map, "p42", &["k=4", "m=2"]);
    let msg = refusal(map.propose_pool_create(&ec_spec("e", "p42")));
    assert_eq!(
        msg,
        "profile 'p42' needs k+m = 6 failure domains of type host under root default, the \
         CRUSH map has 3: use crush-failure-domain=osd or add hosts"
    );
    // a host whose only OSD has CRUSH weight 0 does not count
    let (_, inc) = map.propose_osd_create("light", "host3", 0).unwrap();
    map.apply(&inc.unwrap()).unwrap();
    assert_eq!(map.failure_domains(&map.ec_profiles["p42"]).unwrap(), 3);
    let (_, inc) = map
        .propose_osd_create("heavy", "host4", WEIGHT_ONE)
        .unwrap();
    map.apply(&inc.unwrap()).unwrap();
    assert_eq!(map.failure_domains(&map.ec_profiles["p42"]).unwrap(), 4);
    // by OSD: the 7 OSDs of weight > 0 are enough for 6 shards, not for 10
    set_profile(&mut map, "o64", &["k=6", "m=4", "crush-failure-domain=osd"]);
    let msg = refusal(map.propose_pool_create(&ec_spec("e", "o64")));
    assert_eq!(
        msg,
        "profile 'o64' needs k+m = 10 failure domains of type osd under root default, the \
         CRUSH map has 7: add OSDs or use a profile with a smaller k+m"
    );
    set_profile(&mut map, "o42", &["k=4", "m=2", "crush-failure-domain=osd"]);
    create(&mut map, &ec_spec("e", "o42"));
    // a device class no OSD has
    set_profile(
        &mut map,
        "ssd",
        &[
            "k=2",
            "m=1",
            "crush-failure-domain=osd",
            "crush-device-class=ssd",
        ],
    );
    let msg = refusal(map.propose_pool_create(&ec_spec("f", "ssd")));
    assert!(
        msg.contains("failure domains of type osd with device class ssd under root default, the CRUSH map has 0"),
        "{msg}"
    );
    // a failure domain or root CRUSH does not know
    set_profile(
        &mut map,
        "dc",
        &["k=2", "m=1", "crush-failure-domain=shelf"],
    );
    assert!(refusal(map.propose_pool_create(&ec_spec("f", "dc"))).contains("not a CRUSH type"));
    set_profile(&mut map, "root", &["k=2", "m=1", "crush-root=nowhere"]);
    assert!(refusal(map.propose_pool_create(&ec_spec("f", "root"))).contains("nowhere"));
    assert_eq!(
        map.propose_pool_create(&ec_spec("f", "missing"))
            .unwrap_err(),
        MapError::NoSuchEcProfile("missing".into())
    );
}

#[test]
fn an_erasure_pools_sizes_follow_its_profile() {
    let mut map = cluster(6, "osd");
    set_profile(&mut map, "p", &["k=3", "m=2", "crush-failure-domain=osd"]);
    let msg = refusal(map.propose_pool_create(&PoolSpec {
        size: Some(3),
        ..ec_spec("e", "p")
    }));
    assert_eq!(
        msg,
        "invalid value for size: the size of an erasure-coded pool is k+m = 5 (profile 'p': \
         k=3 m=2), not 3"
    );
    for bad in [2, 6] {
        let msg = refusal(map.propose_pool_create(&PoolSpec {
            min_size: Some(bad),
            ..ec_spec("e", "p")
        }));
        assert!(
            msg.contains(&format!("{bad} must be between k = 3 and k+m = 5")),
            "{msg}"
        );
    }
    let id = create(
        &mut map,
        &PoolSpec {
            size: Some(5),
            min_size: Some(3),
            ..ec_spec("e", "p")
        },
    );
    assert_eq!((map.pools[&id].size, map.pools[&id].min_size), (5, 3));
    // pool set: size is fixed, min_size stays in k..=k+m
    let msg = refusal(map.propose_pool_set("e", "size", "6"));
    assert!(
        msg.contains("the size of an erasure-coded pool is k+m and cannot change"),
        "{msg}"
    );
    assert!(map.propose_pool_set("e", "size", "5").unwrap().is_none());
    assert!(map.propose_pool_set("e", "min_size", "2").is_err());
    assert!(map.propose_pool_set("e", "min_size", "6").is_err());
    let inc = map.propose_pool_set("e", "min_size", "4").unwrap().unwrap();
    map.apply(&inc).unwrap();
    assert_eq!(map.pools[&id].min_size, 4);
    // an erasure pool may not move to a replicated rule, nor a replicated pool to an erasure
    // rule
    assert!(
        refusal(map.propose_pool_set("e", "crush_rule", "replicated_rule"))
            .contains("not a type erasure rule")
    );
    let rep = create(
        &mut map,
        &PoolSpec {
            name: "rep".into(),
            ..PoolSpec::default()
        },
    );
    assert_eq!(map.pools[&rep].kind, PoolKind::Replicated);
    assert!(map.pools[&rep].ec().is_none());
    assert!(
        refusal(map.propose_pool_set("rep", "crush_rule", "e"))
            .contains("not a type replicated rule")
    );
    assert!(
        map.propose_pool_create(&PoolSpec {
            name: "rep2".into(),
            crush_rule: Some("e".into()),
            ..PoolSpec::default()
        })
        .is_err()
    );
    // an erasure pool named like an existing replicated rule cannot have its own rule
    assert!(
        refusal(map.propose_pool_create(&ec_spec("replicated_rule", "p")))
            .contains("a replicated CRUSH rule named 'replicated_rule' exists")
    );
}

#[test]
fn fast_read_is_for_erasure_pools_only() {
    let mut map = cluster(3, "osd");
    set_profile(&mut map, "p", &["k=2", "m=1", "crush-failure-domain=osd"]);
    let id = create(&mut map, &ec_spec("e", "p"));
    create(
        &mut map,
        &PoolSpec {
            name: "rep".into(),
            ..PoolSpec::default()
        },
    );
    let inc = map
        .propose_pool_set("e", "fast_read", "true")
        .unwrap()
        .unwrap();
    map.apply(&inc).unwrap();
    assert!(map.pools[&id].fast_read);
    assert!(
        map.propose_pool_set("e", "fast_read", "1")
            .unwrap()
            .is_none()
    );
    assert!(map.propose_pool_set("e", "fast_read", "maybe").is_err());
    let inc = map
        .propose_pool_set("e", "fast_read", "false")
        .unwrap()
        .unwrap();
    map.apply(&inc).unwrap();
    assert!(!map.pools[&id].fast_read);
    assert_eq!(
        refusal(map.propose_pool_set("rep", "fast_read", "true")),
        "invalid value for fast_read: fast_read applies to erasure-coded pools only; pool 'rep' \
         is replicated"
    );
}

/// Every PG of `pool`: (pg, up).
fn ups(map: &OsdMap, pool: u32) -> Vec<(PgId, Vec<i32>)> {
    map.pool_pgs(pool)
        .unwrap()
        .map(|pg| (pg, map.pg_mapping(pg).unwrap().up_shards))
        .collect()
}

#[test]
fn erasure_mappings_keep_positions_and_mark_holes() {
    let mut map = cluster(6, "osd");
    set_profile(&mut map, "p", &["k=4", "m=2", "crush-failure-domain=osd"]);
    let id = create(&mut map, &ec_spec("e", "p"));
    let before = ups(&map, id);
    for (pg, up) in &before {
        let distinct: BTreeSet<_> = up.iter().collect();
        assert_eq!((up.len(), distinct.len()), (6, 6), "{pg}: {up:?}");
        assert!(!up.contains(&ITEM_NONE));
    }
    // osd.2 down: its position becomes a hole, every other position keeps its OSD
    map.apply(&map.propose_osd_down(2).unwrap().unwrap())
        .unwrap();
    for (pg, old) in &before {
        let m = map.pg_mapping(*pg).unwrap();
        let want: Vec<i32> = old
            .iter()
            .map(|&o| if o == 2 { ITEM_NONE } else { o })
            .collect();
        assert_eq!(m.up_shards, want, "{pg}");
        assert_eq!(m.up, m.up_osds().collect::<Vec<_>>(), "{pg}");
        assert_eq!(m.acting_shards, want, "{pg}");
        assert!(!m.acting.contains(&ITEM_NONE), "{pg}");
        let first = want.iter().copied().find(|&o| o != ITEM_NONE).unwrap();
        assert_eq!((m.up_primary, m.acting_primary), (first, first), "{pg}");
        assert_eq!(m.up_osds().count(), 5);
        assert!(!m.acting_osds().any(|o| o == ITEM_NONE));
    }
    // osd.2 out as well: 5 OSDs for 6 shards, so every PG has exactly one hole. Positions are
    // kept (a hole is not moved to the end); CRUSH `indep` keeps most shards where they were
    // (a position filled on a retry round can move, in Ceph as here: at most one per PG here).
    map.apply(&map.propose_osd_weight(2, 0).unwrap().unwrap())
        .unwrap();
    let mut stable_pgs = 0;
    let mut hole_positions = BTreeSet::new();
    for (pg, old) in &before {
        let up = map.pg_mapping(*pg).unwrap().up_shards;
        assert_eq!(up.len(), 6, "{pg}");
        assert_eq!(
            up.iter().filter(|&&o| o == ITEM_NONE).count(),
            1,
            "{pg}: {up:?}"
        );
        assert!(!up.contains(&2));
        let distinct: BTreeSet<_> = up.iter().filter(|&&o| o != ITEM_NONE).collect();
        assert_eq!(distinct.len(), 5, "{pg}: {up:?}");
        let moved = old
            .iter()
            .zip(&up)
            .filter(|(o, n)| **o != 2 && o != n)
            .count();
        assert!(moved <= 1, "{pg}: {old:?} -> {up:?}");
        stable_pgs += usize::from(moved == 0);
        hole_positions.insert(up.iter().position(|&o| o == ITEM_NONE));
    }
    assert!(
        stable_pgs * 2 >= before.len(),
        "{stable_pgs} of {} stable",
        before.len()
    );
    assert!(
        hole_positions.len() > 1,
        "holes stay in place: {hole_positions:?}"
    );
    // back in and up: the original mapping
    map.apply(&map.propose_osd_weight(2, WEIGHT_ONE).unwrap().unwrap())
        .unwrap();
    map.apply(
        &map.propose_osd_boot(2, "127.0.0.1:6802".parse().unwrap())
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(ups(&map, id), before);
}

#[test]
fn erasure_pg_temp_keeps_positions() {
    let mut map = cluster(6, "osd");
    set_profile(&mut map, "p", &["k=2", "m=1", "crush-failure-domain=osd"]);
    let id = create(&mut map, &ec_spec("e", "p"));
    let pg = PgId::new(id, 5);
    let up = map.pg_mapping(pg).unwrap().up_shards;
    let spare = (0..6).find(|o| !up.contains(o)).unwrap();
    // wrong length, or no OSD at all: refused
    assert!(map.propose_pg_temp(pg, &[up[0], up[1]]).is_err());
    assert!(
        map.propose_pg_temp(pg, &[ITEM_NONE, ITEM_NONE, ITEM_NONE])
            .is_err()
    );
    // shard 0 served by nobody for now, shard 2 by a spare OSD
    let temp = vec![ITEM_NONE, up[1], spare];
    map.apply(&map.propose_pg_temp(pg, &temp).unwrap().unwrap())
        .unwrap();
    let m = map.pg_mapping(pg).unwrap();
    assert_eq!(
        (m.up_shards.clone(), m.acting_shards.clone()),
        (up.clone(), temp.clone())
    );
    assert_eq!(m.acting, vec![up[1], spare]);
    assert_eq!(m.acting_primary, up[1]);
    // a member going down leaves a hole in its place
    map.apply(&map.propose_osd_down(spare).unwrap().unwrap())
        .unwrap();
    let m = map.pg_mapping(pg).unwrap();
    assert_eq!(m.acting_shards, vec![ITEM_NONE, up[1], ITEM_NONE]);
    assert_eq!(m.acting, vec![up[1]]);
    // no member left: the up set acts
    map.apply(&map.propose_osd_down(up[1]).unwrap().unwrap())
        .unwrap();
    let m = map.pg_mapping(pg).unwrap();
    assert_eq!(m.acting_shards, m.up_shards);
    assert_eq!(m.up_shards[1], ITEM_NONE);
}

#[test]
fn too_few_osds_leave_holes_where_crush_finds_none() {
    // 3 OSDs, a 2+2 profile by OSD: CRUSH fills 3 positions and leaves one hole
    let mut map = cluster(3, "osd");
    set_profile(&mut map, "p", &["k=2", "m=2", "crush-failure-domain=osd"]);
    assert!(map.propose_pool_create(&ec_spec("e", "p")).is_err());
    // (refused at creation; an OSD leaving later makes the same situation)
    let (_, inc) = map.propose_osd_create("u3", "host0", WEIGHT_ONE).unwrap();
    map.apply(&inc.unwrap()).unwrap();
    map.apply(
        &map.propose_osd_boot(3, "127.0.0.1:6803".parse().unwrap())
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    let id = create(&mut map, &ec_spec("e", "p"));
    map.apply(&map.propose_osd_down(3).unwrap().unwrap())
        .unwrap();
    map.apply(&map.propose_osd_weight(3, 0).unwrap().unwrap())
        .unwrap();
    for (pg, up) in ups(&map, id) {
        assert_eq!(up.len(), 4, "{pg}");
        assert_eq!(up.iter().filter(|&&o| o == ITEM_NONE).count(), 1, "{pg}");
        let m = map.pg_mapping(pg).unwrap();
        assert_ne!(m.up_primary, ITEM_NONE);
        assert!(m.up_primary >= 0);
    }
}

#[test]
fn device_classes_narrow_the_failure_domains_and_the_rule() {
    let mut map = cluster(6, "host"); // osd.i on host(i % 3)
    // osd.0, osd.1 and osd.3 are SSDs: on host0 (osd.0, osd.3) and host1 (osd.1)
    let mut text = map.crush.to_text();
    for id in [0, 1, 3] {
        text = text.replace(
            &format!("device {id} osd.{id}\n"),
            &format!("device {id} osd.{id} class ssd\n"),
        );
    }
    let inc = crate::Incremental {
        epoch: map.epoch + 1,
        changes: vec![Change::SetCrush(text)],
    };
    map.apply(&inc).unwrap();
    let count = |words: &[&str]| map.failure_domains(&profile(words)).unwrap();
    assert_eq!(count(&["crush-device-class=ssd"]), 2, "hosts with an SSD");
    assert_eq!(
        count(&["crush-device-class=ssd", "crush-failure-domain=osd"]),
        3
    );
    assert_eq!(count(&["crush-device-class=hdd"]), 0, "no such class");
    assert_eq!(count(&[]), 3);
    set_profile(&mut map, "ssd", &["k=2", "m=1", "crush-device-class=ssd"]);
    let msg = refusal(map.propose_pool_create(&ec_spec("e", "ssd")));
    assert!(
        msg.contains(
            "needs k+m = 3 failure domains of type host with device class ssd under root \
             default, the CRUSH map has 2"
        ),
        "{msg}"
    );
    set_profile(
        &mut map,
        "ssd-osd",
        &[
            "k=2",
            "m=1",
            "crush-device-class=ssd",
            "crush-failure-domain=osd",
        ],
    );
    let id = create(&mut map, &ec_spec("e", "ssd-osd"));
    assert!(
        rule_text(&map, "e")
            .contains("\tstep take default class ssd\n\tstep choose indep 0 type osd\n"),
        "{}",
        rule_text(&map, "e")
    );
    for (pg, up) in ups(&map, id) {
        let set: BTreeSet<i32> = up.iter().copied().collect();
        assert_eq!(set, BTreeSet::from([0, 1, 3]), "{pg}: only the SSDs");
    }
}
