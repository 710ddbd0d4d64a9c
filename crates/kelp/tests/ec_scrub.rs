//! A damaged shard of an erasure-coded object, on a real cluster (`kelp up`: one monitor, six
//! OSD processes, a 4+2 pool):
//!
//! 1. objects of 1 MiB are written (each shard 256 KiB: whole allocation units, written
//!    straight to the data file rather than deferred), then 16 bytes of one object's data
//!    shard are flipped in its OSD's data file while that OSD is stopped;
//! 2. reads of the object still return what was written (the bad shard fails its checksum
//!    and is rebuilt from the others on the fly);
//! 3. a deep scrub of the PG names the object and that OSD only, health reports the damage,
//!    `kelp pg repair` rewrites the shard from the other shards, and a second deep scrub,
//!    health and an offline deep fsck of the repaired OSD's store are clean.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use heal_support::{Cluster, all_active_clean, content, find_all, kelp, wait_until};

const POOL: &str = "ecpool";

/// Inverts 16 bytes of `file` at `at`.
fn flip_at(file: &Path, at: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let mut old = [0u8; 16];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut old).unwrap();
    let flipped: Vec<u8> = old.iter().map(|b| !b).collect();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&flipped).unwrap();
    f.sync_all().unwrap();
}

fn list_inconsistent(c: &Cluster, pgid: &str) -> serde_json::Value {
    let out = c.cli(&["pg", "list-inconsistent", pgid, "--format", "json"]);
    serde_json::from_str(&out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_scrub_finds_a_damaged_shard_and_repair_rebuilds_it() {
    let c = Cluster::up(6, 8);
    c.ec_pool(POOL, "p42", 4, 2);
    wait_until(
        "the EC pool's PGs are active+clean",
        Duration::from_secs(60),
        || all_active_clean(&c),
    )
    .await;
    let rados = c.connect().await;
    let io = rados.ioctx(POOL).await.unwrap();

    // 1. Objects of known content.
    let mut written: BTreeMap<String, Bytes> = BTreeMap::new();
    for i in 0..12u64 {
        let name = format!("obj-{i}");
        let data = content(7000 + i, 1 << 20);
        io.write_full(&name, data.clone()).await.unwrap();
        written.insert(name, data);
    }
    let victim = "obj-5";
    let map = rados.osd_map();
    let pool = map.pool_by_name(POOL).unwrap();
    let pg = pool.placement().object_pg(victim, None, "");
    let pgid = pg.to_string();
    let acting = map.pg_mapping(pg).unwrap().acting;
    assert_eq!(acting.len(), 6, "acting set of {pgid}: {acting:?}");

    // A needle from the object's data: data shards hold the object's bytes as they are, so
    // exactly one OSD's data file (the one with the shard holding these bytes) contains it.
    let needle = &written[victim][100_000..100_064];
    let mut holder = None;
    for osd in &acting {
        let name = format!("osd.{osd}");
        let found = find_all(&c.dir.join(&name).join("block"), needle);
        match found.len() {
            0 => {}
            1 => {
                assert!(holder.is_none(), "the needle is on two OSDs");
                holder = Some((*osd, found[0]));
            }
            n => panic!("{name} holds the needle {n} times"),
        }
    }
    let (bad_osd, at) = holder.expect("no OSD's data file holds the victim's bytes");
    let name = format!("osd.{bad_osd}");
    eprintln!("{victim} in pg {pgid}, acting {acting:?}; damaging {name} at {at}");

    c.cli(&["osd", "set", "noout"]);
    // Damage the shard while its OSD is stopped (a clean stop: the store checkpoints, so
    // nothing replays over the damage at the next start).
    let out = kelp(&[
        "daemon",
        "stop",
        &name,
        "--dir",
        &c.dir.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let block = c.dir.join(&name).join("block");
    assert_eq!(
        find_all(&block, needle),
        vec![at],
        "the store moved the shard"
    );
    flip_at(&block, at);
    assert!(find_all(&block, needle).is_empty());
    c.start(&name);
    wait_until(
        "the damaged OSD is back and every PG active+clean",
        Duration::from_secs(90),
        || all_active_clean(&c),
    )
    .await;

    // 2. Reads return what was written: the bad shard is rebuilt on the fly.
    for (n, want) in &written {
        let got = io.read(n, 0, 0).await.unwrap();
        assert!(got == *want, "{n}: the client read wrong data");
    }

    // 3. Deep scrub names the object and the OSD.
    let out = c.cli(&["pg", "deep-scrub", &pgid, "--wait"]);
    eprintln!("deep scrub: {out}");
    let report = list_inconsistent(&c, &pgid);
    let objs = report["inconsistents"].as_array().unwrap();
    assert_eq!(objs.len(), 1, "{report:#}");
    assert_eq!(objs[0]["object"]["name"], victim, "{report:#}");
    assert_eq!(
        objs[0]["bad_osds"],
        serde_json::json!([bad_osd]),
        "{report:#}"
    );
    let health = c.cli(&["health", "detail"]);
    assert!(health.starts_with("HEALTH_ERR"), "{health}");
    assert!(health.contains("OSD_SCRUB_ERRORS"), "{health}");
    assert!(health.contains("PG_DAMAGED"), "{health}");
    let pgls = c.cli(&["pg", "ls"]);
    assert!(
        pgls.lines()
            .any(|l| l.starts_with(&pgid) && l.contains("+inconsistent")),
        "{pgls}"
    );

    // Repair rebuilds the shard; a second deep scrub and health are clean.
    let out = c.cli(&["pg", "repair", &pgid, "--wait"]);
    eprintln!("repair: {out}");
    assert!(out.contains("1 repaired"), "{out}");
    let report = list_inconsistent(&c, &pgid);
    assert_eq!(report["inconsistents"], serde_json::json!([]), "{report:#}");
    let out = c.cli(&["pg", "deep-scrub", &pgid, "--wait"]);
    assert!(out.contains(" 0 inconsistent"), "{out}");
    let health = c.cli(&["health", "detail"]);
    assert!(!health.contains("OSD_SCRUB_ERRORS"), "{health}");
    assert!(!health.contains("PG_DAMAGED"), "{health}");
    for (n, want) in &written {
        let got = io.read(n, 0, 0).await.unwrap();
        assert!(got == *want, "{n}: wrong data after the repair");
    }

    // The repaired OSD's store holds the shard's bytes again and is clean, checked offline.
    let out = kelp(&[
        "daemon",
        "stop",
        &name,
        "--dir",
        &c.dir.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        find_all(&block, needle).len(),
        1,
        "the repaired shard is not in {name}'s data file"
    );
    let fsck = kelp(&[
        "store",
        "fsck",
        "--deep",
        &c.dir.join(&name).display().to_string(),
    ]);
    assert!(
        fsck.status.success(),
        "fsck of the repaired {name}:\n{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    c.cli(&["osd", "unset", "noout"]);
}
