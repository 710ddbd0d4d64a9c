//! Deleting a pool frees its data on the OSDs (`kelp up`, 3 OSDs, one manager), in one test so
//! the cluster starts once:
//!
//! 1. a replicated pool (objects with omap and xattrs) and an erasure-coded pool (2+1) fill
//!    every OSD's store; the remover is slowed down (`osd_delete_sleep`,
//!    `osd_target_transaction_size`) so that the deletion takes some seconds;
//! 2. both pools are removed: `kelp progress` shows a `pool-deletion` item, clients of another
//!    pool keep reading and writing meanwhile, and one OSD is killed (SIGKILL) while it still
//!    holds most of the deleted data, then restarted;
//! 3. every OSD's used bytes fall back near what they were before the pools were made (the
//!    restarted OSD finished its removal), and the progress item finishes with fraction 1;
//! 4. a pool re-created with the same name has a new id and no objects;
//! 5. offline, every OSD's store passes `kelp store fsck` and holds exactly the collections of
//!    the PGs it serves in the pools that still exist.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use heal_support::{Cluster, content, kelp, progress, wait};

/// Each OSD's used bytes (`kelp osd df --format json`), for the OSDs that reported.
fn used(c: &Cluster) -> BTreeMap<i64, u64> {
    let v: serde_json::Value =
        serde_json::from_str(&c.cli(&["osd", "df", "--format", "json"])).unwrap();
    v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["reported"] == true && n["status"].as_str().unwrap_or("").starts_with("up"))
        .map(|n| {
            (
                n["id"].as_i64().unwrap(),
                n["kb_used"].as_u64().unwrap() * 1024,
            )
        })
        .collect()
}

const REP_OBJECTS: u64 = 1500;
const EC_OBJECTS: u64 = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pools_are_removed_from_the_osds() {
    let c = Cluster::up(3, 8);
    // each OSD removes ~2100 objects, 25 per transaction, 0.2 s apart: ~17 s or more
    c.cli(&["config", "set", "osd", "osd_delete_sleep", "0.2"]);
    c.cli(&["config", "set", "osd", "osd_target_transaction_size", "25"]);
    let baseline = wait("every OSD reported", Duration::from_secs(30), || {
        let u = used(&c);
        (u.len() == 3).then_some(u)
    });

    // ---- 1. two pools full of objects
    c.cli(&["pool", "create", "doomed", "8"]);
    c.ec_pool("doomed-ec", "del21", 2, 1);
    let rados = c.connect().await;
    let old_id = rados.osd_map().pool_by_name("doomed").unwrap().id;
    let rep = rados.ioctx("doomed").await.unwrap();
    let ec = rados.ioctx("doomed-ec").await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..8u64 {
        let (rep, ec) = (rep.clone(), ec.clone());
        tasks.push(tokio::spawn(async move {
            for i in (w..REP_OBJECTS).step_by(8) {
                let name = format!("r-{i}");
                rep.write_full(&name, content(i, 8192)).await.unwrap();
                if i % 3 == 0 {
                    let key = format!("k{i}");
                    rep.omap_set(&name, &[(key.as_str(), b"value".as_slice())])
                        .await
                        .unwrap();
                }
            }
            for i in (w..EC_OBJECTS).step_by(8) {
                ec.write_full(&format!("e-{i}"), content(10_000 + i, 16384))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 1500 * 8 KiB replicas + 600 * 8 KiB shards on every OSD: ~16 MiB each
    let grown = wait(
        "the OSDs report the new data",
        Duration::from_secs(30),
        || {
            let u = used(&c);
            (u.len() == 3 && u.iter().all(|(id, b)| *b >= baseline[id] + (12 << 20))).then_some(u)
        },
    );
    eprintln!("used before {baseline:?}, with the pools {grown:?}");

    // ---- 2. delete both, watch, kill an OSD in the middle
    // the OSDs re-read the central config every 5 s: the slow remover must be in force
    tokio::time::sleep(Duration::from_secs(6)).await;
    c.cli(&["pool", "rm", "doomed", "--yes-i-really-mean-it"]);
    c.cli(&["pool", "rm", "doomed-ec", "--yes-i-really-mean-it"]);
    let deleted_at = Instant::now();
    let item = wait(
        "a pool-deletion progress item",
        Duration::from_secs(30),
        || {
            progress(&c)
                .into_iter()
                .find(|i| i["kind"] == "pool-deletion" && i["finished_ms"].is_null())
        },
    );
    eprintln!("running after {:?}: {item}", deleted_at.elapsed());

    // osd.1 dies while it still holds most of the deleted data, and comes back
    let victim = 1i64;
    let at_kill = used(&c);
    let growth = grown[&victim] - baseline[&victim];
    assert!(
        at_kill[&victim] > baseline[&victim] + growth / 4,
        "osd.{victim} removed most of the data before it could be killed: {at_kill:?}"
    );
    c.sigkill("osd.1");
    // clients of another pool are served meanwhile
    let data = rados.ioctx("data").await.unwrap();
    for i in 0..20u64 {
        data.write_full(&format!("live-{i}"), content(50_000 + i, 4096))
            .await
            .unwrap();
    }
    c.start("osd.1");
    for i in 0..20u64 {
        let got = data.read(&format!("live-{i}"), 0, 0).await.unwrap();
        assert_eq!(got, content(50_000 + i, 4096));
    }

    // ---- 3. the space comes back on every OSD, the progress item finishes
    let after = wait(
        "every OSD's used bytes back near the baseline",
        Duration::from_secs(180),
        || {
            let u = used(&c);
            (u.len() == 3
                && u.iter()
                    .all(|(id, b)| *b <= baseline[id] + (grown[id] - baseline[id]) / 10))
            .then_some(u)
        },
    );
    eprintln!(
        "used after the deletion {after:?} ({:?} after pool rm)",
        deleted_at.elapsed()
    );
    assert!(
        c.log("osd.1").contains("queued the PG of a deleted pool"),
        "the restarted osd.1 found the deleted pools' PGs"
    );
    let done = wait(
        "the pool-deletion item finishes",
        Duration::from_secs(60),
        || {
            let items = progress(&c);
            let running = items
                .iter()
                .any(|i| i["kind"] == "pool-deletion" && i["finished_ms"].is_null());
            let finished = items
                .into_iter()
                .find(|i| i["kind"] == "pool-deletion" && !i["finished_ms"].is_null());
            finished.filter(|_| !running)
        },
    );
    eprintln!("finished: {done}");
    assert_eq!(done["fraction"].as_f64(), Some(1.0), "{done}");

    // ---- 4. the same name again: a new pool, empty
    c.cli(&["pool", "create", "doomed", "8"]);
    let new_id = wait(
        "the new pool in the client's map",
        Duration::from_secs(10),
        || rados.osd_map().pool_by_name("doomed").map(|p| p.id),
    );
    assert!(new_id > old_id, "pool id {new_id} reused (old {old_id})");
    let again = rados.ioctx("doomed").await.unwrap();
    assert_eq!(again.list_objects().await.unwrap(), Vec::<String>::new());
    assert!(
        again.read("r-3", 0, 0).await.is_err(),
        "an old object is back"
    );

    // ---- 5. offline: each store holds exactly the collections of the PGs it serves
    let map = rados.osd_map();
    let mut expected: BTreeMap<i32, u64> = BTreeMap::new();
    for pool in map.pools.values() {
        for seed in 0..pool.pg_num {
            let m = map
                .pg_mapping(kelp_types::PgId::new(pool.id, seed))
                .unwrap();
            let mut members: Vec<i32> = m.acting.iter().chain(m.up.iter()).copied().collect();
            members.sort_unstable();
            members.dedup();
            for osd in members.into_iter().filter(|o| *o >= 0) {
                *expected.entry(osd).or_default() += 1;
            }
        }
    }
    drop(again);
    drop(data);
    drop(rep);
    drop(ec);
    drop(rados);
    let down = kelp(&["down", "--dir", &c.dir.display().to_string()]);
    assert!(down.status.success(), "kelp down");
    for (osd, want) in expected {
        let dir = c.dir.join(format!("osd.{osd}"));
        let out = kelp(&[
            "store",
            "fsck",
            "--format",
            "json",
            &dir.display().to_string(),
        ]);
        let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        assert!(
            out.status.success(),
            "fsck of osd.{osd}: {rep}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            rep["collections"].as_u64(),
            Some(want),
            "osd.{osd} holds other collections than the PGs of the existing pools: {rep}"
        );
    }
}
