//! Raw space of small objects in an erasure-coded pool, on a real cluster (`kelp up`: one
//! monitor, six OSD processes): 2 000 objects of 4 KiB in a 4+2 pool are 12 000 shards of
//! 1 KiB, which the OSDs' stores keep inline in their object records instead of in a 4 KiB
//! allocation unit each, so the raw space `kelp df` reports grows by about (k+m)/k = 1.5 times
//! what was stored (6 times before inline data). Space accounting, not timing: deterministic
//! up to the few records the cluster writes on its own meanwhile (maps); the bound is the
//! issue's goal, 1.6× (1.50× exactly when measured).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use std::time::{Duration, Instant};

use heal_support::{Cluster, all_active_clean, content, wait_until};

const POOL: &str = "ecsmall";
const OBJECTS: u64 = 2000;
const SIZE: usize = 4096;

/// (raw used bytes, objects in POOL, bytes stored in POOL) from `kelp df`.
fn df(c: &Cluster) -> (u64, u64, u64) {
    let v: serde_json::Value = serde_json::from_str(&c.cli(&["df", "--format", "json"])).unwrap();
    let pool = v["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == POOL)
        .unwrap()
        .clone();
    (
        v["stats"]["total_used_raw_bytes"].as_u64().unwrap(),
        pool["stats"]["objects"].as_u64().unwrap(),
        pool["stats"]["stored"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_objects_in_an_ec_pool_cost_about_k_plus_m_over_k() {
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
    // Let the usage reports settle before the baseline.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (raw0, objects0, _) = df(&c);
    assert_eq!(objects0, 0);

    // 16 writers in parallel.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..16u64 {
        let io = io.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..OBJECTS).step_by(16) {
                io.write_full(&format!("small-{i}"), content(i, SIZE))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    eprintln!(
        "wrote {OBJECTS} objects of {SIZE} B in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    // Every PG reported its objects and the usage stays put.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut prev = None;
    let (raw1, stored) = loop {
        let (raw, objects, stored) = df(&c);
        if objects == OBJECTS && prev == Some(raw) {
            break (raw, stored);
        }
        assert!(
            Instant::now() < deadline,
            "df never settled: {objects} objects, raw {raw}"
        );
        prev = Some(raw);
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    let logical = OBJECTS * SIZE as u64;
    assert_eq!(stored, logical);
    let ratio = (raw1 - raw0) as f64 / logical as f64;
    eprintln!(
        "raw used grew by {} KiB for {} KiB stored: {ratio:.2}x ({:.2} KiB per object)",
        (raw1 - raw0) / 1024,
        logical / 1024,
        (raw1 - raw0) as f64 / 1024.0 / OBJECTS as f64
    );
    assert!(
        ratio <= 1.6,
        "a 4 KiB object costs {ratio:.2}x its size raw (1.5x expected, 6x without inline data)"
    );
    // The objects read back.
    for i in [0, OBJECTS / 2, OBJECTS - 1] {
        let got = io.read(&format!("small-{i}"), 0, 0).await.unwrap();
        assert!(got == content(i, SIZE), "small-{i}");
    }
}
