//! An erasure-coded pool keeps every object when CRUSH moves surviving members to other shard
//! positions (`kelp up`: one monitor, seven OSD processes).
//!
//! `indep` placement keeps positions stable in most PGs when an OSD goes out, but not in all:
//! a retry after a collision can hand a survivor another position. Such a member holds the
//! shard of its old position. The test picks an OSD whose removal moves survivors of some PGs
//! (computed from the cluster's own map), fills the pool, kills that OSD and marks it out
//! while a client keeps overwriting parts of objects, and checks that every PG gets
//! active+clean, every acknowledged byte reads back, and a deep scrub of the PGs whose
//! members moved finds every shard consistent with its parity.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use heal_support::{Cluster, all_active_clean, content, read_back, wait_until};
use kelp_types::PgId;

const POOL: &str = "ecremap";
const PGS: u32 = 64;

/// PGs of `pool` in which some member other than `out` holds another position once `out` is
/// out of the map.
fn moved_by(map: &kelp_maps::OsdMap, pool: u32, out: i32) -> Vec<PgId> {
    let mut after = map.clone();
    after
        .apply(&kelp_maps::Incremental {
            epoch: map.epoch + 1,
            changes: vec![kelp_maps::Change::OsdWeight { id: out, weight: 0 }],
        })
        .unwrap();
    (0..PGS)
        .map(|seed| PgId::new(pool, seed))
        .filter(|&pg| {
            let (b, a) = (map.pg_mapping(pg).unwrap(), after.pg_mapping(pg).unwrap());
            b.up_shards().iter().enumerate().any(|(i, &o)| {
                o >= 0
                    && o != out
                    && o != kelp_maps::ITEM_NONE
                    && a.up_shards()
                        .iter()
                        .position(|&x| x == o)
                        .is_some_and(|j| j != i)
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec_members_crush_moves_to_other_positions_lose_nothing() {
    let c = Cluster::up(7, 8);
    c.ec_profile("p42", 4, 2);
    c.cli(&["pool", "create", POOL, &PGS.to_string(), "--erasure", "p42"]);
    wait_until(
        "the EC pool's PGs are active+clean",
        Duration::from_secs(90),
        || all_active_clean(&c),
    )
    .await;
    let rados = c.connect().await;
    let io = rados.ioctx(POOL).await.unwrap();
    let map = rados.osd_map();
    let pool = map.pool_by_name(POOL).unwrap().id;
    let (out, moved) = (0..7)
        .map(|osd| (osd, moved_by(&map, pool, osd)))
        .max_by_key(|(_, m)| m.len())
        .unwrap();
    assert!(
        !moved.is_empty(),
        "no OSD of this map moves a survivor of a PG to another position: the test needs one"
    );

    // Objects in every PG, those of the moved PGs included.
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for i in 0..300u64 {
        let name = format!("obj-{i}");
        let data = content(i, 1 + (i as usize * 7919) % 60_000);
        io.write_full(&name, data.clone()).await.unwrap();
        model.insert(name, data.to_vec());
    }
    let model = Arc::new(Mutex::new(model));

    // A client overwrites parts of objects (parity deltas) throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let uncertain: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let writer = {
        let (io, model, stop, uncertain) =
            (io.clone(), model.clone(), stop.clone(), uncertain.clone());
        tokio::spawn(async move {
            let (mut i, mut acked) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let name = format!("obj-{}", (i * 37) % 300);
                let len = model.lock().unwrap()[&name].len();
                let off = (i as usize * 4099) % len;
                let data = content(10_000 + i, 1 + (i as usize * 613) % 9000);
                match io.write(&name, off as u64, data.clone()).await {
                    Ok(_) => {
                        let mut m = model.lock().unwrap();
                        let obj = m.get_mut(&name).unwrap();
                        if obj.len() < off + data.len() {
                            obj.resize(off + data.len(), 0);
                        }
                        obj[off..off + data.len()].copy_from_slice(&data);
                        acked += 1;
                    }
                    // Not acknowledged: it may or may not have been applied.
                    Err(_) => {
                        uncertain.lock().unwrap().insert(name);
                    }
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    let victim = format!("osd.{out}");
    c.sigkill(&victim);
    c.cli(&["osd", "out", &out.to_string()]);
    wait_until(
        "every PG is active+clean after the OSD went out",
        Duration::from_secs(300),
        || all_active_clean(&c),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let acked = writer.await.unwrap();
    assert!(acked > 20, "only {acked} overwrites were acknowledged");

    let uncertain = uncertain.lock().unwrap().clone();
    let acknowledged: BTreeMap<String, Bytes> = model
        .lock()
        .unwrap()
        .iter()
        .filter(|(name, _)| !uncertain.contains(*name))
        .map(|(name, data)| (name.clone(), Bytes::from(data.clone())))
        .collect();
    read_back(&io, &acknowledged).await;
    // The OSDs saw members holding another position's shard, and backfilled them.
    let saw = (0..7).filter(|&o| o != out).any(|o| {
        c.log(&format!("osd.{o}"))
            .contains("members moved to another shard position")
    });
    assert!(
        saw,
        "no primary reported members moved to another shard position"
    );
    for pg in &moved {
        c.deep_scrub_is_clean(&format!("{}.{:x}", pg.pool.0, pg.seed));
    }
}
