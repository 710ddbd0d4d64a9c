//! Property: a map that follows incrementals equals the map they were made from.
//!
//! Monitors keep the full OSD map and hand out incrementals; OSDs and clients start from a
//! full map of some epoch (possibly old) and apply the incrementals after it, in order, as
//! they arrive over the wire. Whatever sequence of changes the monitors made (OSDs created,
//! booted, marked down, reweighted, removed; replicated and erasure-coded pools created,
//! resized and deleted; erasure-code profiles set and removed; flags; `pg_temp`), the
//! follower must end with exactly the monitors' map: the same encoding and the same PG
//! mappings. Along the way, pool ids are never reused after a pool is deleted.

use std::net::SocketAddr;

use kelp_crush::WEIGHT_ONE;
use kelp_maps::{ClusterFlag, Incremental, OsdMap, PoolSpec};
use kelp_types::PgId;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    CreateOsd {
        host: u8,
    },
    Boot {
        osd: u8,
        port: u16,
    },
    Down {
        osd: u8,
    },
    Weight {
        osd: u8,
        weight: u32,
    },
    Remove {
        osd: u8,
    },
    CreatePool {
        pg_num: u32,
        size: u32,
    },
    PoolSize {
        pool: u8,
        size: u32,
    },
    Flag {
        flag: u8,
        on: bool,
    },
    PgTemp {
        pool: u8,
        seed: u32,
        osds: Vec<u8>,
    },
    /// Profile `ec{k}{m}` by OSD (forced over an existing one of that name).
    EcProfile {
        k: u32,
        m: u32,
    },
    EcProfileRm {
        k: u32,
        m: u32,
    },
    /// An erasure-coded pool with profile `ec{k}{m}` (its own CRUSH rule).
    CreateEcPool {
        pg_num: u32,
        k: u32,
        m: u32,
    },
    DeletePool {
        pool: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..4).prop_map(|host| Op::CreateOsd { host }),
        3 => (0u8..10, 0u16..3).prop_map(|(osd, port)| Op::Boot { osd, port }),
        2 => (0u8..10).prop_map(|osd| Op::Down { osd }),
        2 => (0u8..10, prop_oneof![Just(0), Just(WEIGHT_ONE / 2), Just(WEIGHT_ONE)])
            .prop_map(|(osd, weight)| Op::Weight { osd, weight }),
        1 => (0u8..10).prop_map(|osd| Op::Remove { osd }),
        1 => (1u32..17, 1u32..4).prop_map(|(pg_num, size)| Op::CreatePool { pg_num, size }),
        1 => (0u8..3, 1u32..4).prop_map(|(pool, size)| Op::PoolSize { pool, size }),
        1 => (0u8..4, any::<bool>()).prop_map(|(flag, on)| Op::Flag { flag, on }),
        2 => (0u8..3, 0u32..16, proptest::collection::vec(0u8..10, 0..4))
            .prop_map(|(pool, seed, osds)| Op::PgTemp { pool, seed, osds }),
        2 => (1u32..4, 1u32..3).prop_map(|(k, m)| Op::EcProfile { k, m }),
        1 => (1u32..4, 1u32..3).prop_map(|(k, m)| Op::EcProfileRm { k, m }),
        2 => (1u32..17, 1u32..4, 1u32..3)
            .prop_map(|(pg_num, k, m)| Op::CreateEcPool { pg_num, k, m }),
        1 => (0u8..3).prop_map(|pool| Op::DeletePool { pool }),
    ]
}

const FLAGS: [ClusterFlag; 4] = [
    ClusterFlag::NoOut,
    ClusterFlag::NoRecover,
    ClusterFlag::NoBackfill,
    ClusterFlag::NoUp,
];

/// The incremental the monitors would make for `op` on `map`, if the op is valid there.
fn propose(map: &OsdMap, op: &Op) -> Option<Incremental> {
    let osd_ids: Vec<i32> = map.osds.keys().copied().collect();
    let pick = |i: u8| -> Option<i32> {
        (!osd_ids.is_empty()).then(|| osd_ids[i as usize % osd_ids.len()])
    };
    let pool_names: Vec<String> = map.pools.values().map(|p| p.name.clone()).collect();
    match op {
        Op::CreateOsd { host } => {
            let uuid = format!("uuid-{}", map.epoch);
            map.propose_osd_create(&uuid, &format!("host{host}"), WEIGHT_ONE)
                .ok()?
                .1
        }
        Op::Boot { osd, port } => {
            let id = pick(*osd)?;
            let addr: SocketAddr = format!("127.0.0.1:{}", 6800 + id as u16 * 4 + port)
                .parse()
                .ok()?;
            map.propose_osd_boot(id, addr).ok()?
        }
        Op::Down { osd } => map.propose_osd_down(pick(*osd)?).ok()?,
        Op::Weight { osd, weight } => map.propose_osd_weight(pick(*osd)?, *weight).ok()?,
        Op::Remove { osd } => {
            let id = pick(*osd)?;
            // Like `kelp osd purge`: only an OSD no PG maps to.
            let mapped = map.pools.values().any(|p| {
                (0..p.pg_num).any(|s| {
                    map.pg_mapping(PgId::new(p.id, s))
                        .is_ok_and(|m| m.up.contains(&id) || m.acting.contains(&id))
                })
            });
            if mapped {
                return None;
            }
            map.propose_osd_remove(id).ok()
        }
        Op::CreatePool { pg_num, size } => {
            let spec = PoolSpec {
                name: format!("pool{}", map.epoch),
                pg_num: Some(*pg_num),
                size: Some(*size),
                min_size: None,
                crush_rule: None,
                erasure: None,
            };
            map.propose_pool_create(&spec).ok().map(|(_, inc)| inc)
        }
        Op::PoolSize { pool, size } => {
            if pool_names.is_empty() {
                return None;
            }
            let name = &pool_names[*pool as usize % pool_names.len()];
            map.propose_pool_set(name, "size", &size.to_string()).ok()?
        }
        Op::Flag { flag, on } => map.propose_flag(FLAGS[*flag as usize], *on),
        Op::PgTemp { pool, seed, osds } => {
            let pools: Vec<&kelp_maps::Pool> = map.pools.values().collect();
            if pools.is_empty() {
                return None;
            }
            let p = pools[*pool as usize % pools.len()];
            let pg = PgId::new(p.id, seed % p.pg_num);
            let mut ids = Vec::new();
            for &o in osds {
                let id = pick(o)?;
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            if p.ec().is_some() {
                // one entry per shard position
                ids.resize(p.size as usize, kelp_maps::ITEM_NONE);
            }
            map.propose_pg_temp(pg, &ids).ok()?
        }
        Op::EcProfile { k, m } => {
            let words = [
                format!("k={k}"),
                format!("m={m}"),
                "crush-failure-domain=osd".to_string(),
            ];
            let profile = kelp_ec::Profile::from_words(&words).ok()?;
            map.propose_ec_profile_set(&format!("ec{k}{m}"), &profile, true)
                .ok()?
        }
        Op::EcProfileRm { k, m } => map.propose_ec_profile_rm(&format!("ec{k}{m}")).ok(),
        Op::CreateEcPool { pg_num, k, m } => {
            let spec = PoolSpec {
                name: format!("ecpool{}", map.epoch),
                pg_num: Some(*pg_num),
                erasure: Some(format!("ec{k}{m}")),
                ..PoolSpec::default()
            };
            map.propose_pool_create(&spec).ok().map(|(_, inc)| inc)
        }
        Op::DeletePool { pool } => {
            if pool_names.is_empty() {
                return None;
            }
            map.propose_pool_delete(&pool_names[*pool as usize % pool_names.len()])
                .ok()
        }
    }
}

/// Every PG with its up and acting sets (`None` if unmappable).
type Mappings = Vec<(PgId, Option<(Vec<i32>, Vec<i32>)>)>;

fn mappings(map: &OsdMap) -> Mappings {
    let mut out = Vec::new();
    for p in map.pools.values() {
        for s in 0..p.pg_num {
            let pg = PgId::new(p.id, s);
            out.push((pg, map.pg_mapping(pg).ok().map(|m| (m.up, m.acting))));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn incrementals_applied_in_order_equal_the_full_map(
        ops in proptest::collection::vec(op(), 1..60),
        start_at in any::<prop::sample::Index>(),
    ) {
        let mut leader = OsdMap::new("fsid", "osd").unwrap();
        // (the full map before each incremental, encoded) and the incrementals, as sent.
        let mut fulls = vec![leader.encode()];
        let mut incs: Vec<Vec<u8>> = Vec::new();
        // Every pool id ever used: a new pool never gets the id of a deleted one (OSDs may
        // still be removing its PGs' objects, which must never show in the new pool).
        let mut pool_ids = std::collections::BTreeSet::new();
        for o in &ops {
            let Some(inc) = propose(&leader, o) else { continue };
            prop_assert_eq!(inc.epoch, leader.epoch + 1);
            let before: std::collections::BTreeSet<u32> = leader.pools.keys().copied().collect();
            leader.apply(&inc).unwrap();
            for id in leader.pools.keys().filter(|id| !before.contains(id)) {
                prop_assert!(
                    pool_ids.last().is_none_or(|max| id > max),
                    "new pool id {} after {:?}",
                    id,
                    pool_ids
                );
                pool_ids.insert(*id);
            }
            incs.push(inc.encode());
            fulls.push(leader.encode());
        }
        // A follower starting from any full map so far.
        let k = start_at.index(fulls.len());
        let mut follower = OsdMap::decode(&fulls[k]).unwrap();
        for bytes in &incs[k..] {
            let inc = Incremental::decode(bytes).unwrap();
            prop_assert_eq!(inc.epoch, follower.epoch + 1);
            follower.apply(&inc).unwrap();
        }
        prop_assert_eq!(follower.epoch, leader.epoch);
        prop_assert_eq!(follower.encode(), leader.encode());
        prop_assert_eq!(mappings(&follower), mappings(&leader));
        // And the full map survives its own round trip.
        let again = OsdMap::decode(&leader.encode()).unwrap();
        prop_assert_eq!(mappings(&again), mappings(&leader));
    }
}
