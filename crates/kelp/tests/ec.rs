//! Erasure-coded pools on a real cluster (`kelp up`: one monitor, six OSD processes), in one
//! test so the cluster starts once:
//!
//! 1. a 4+2 profile (`crush-failure-domain=osd`) and a pool on it; omap is refused;
//! 2. an fsx-style workload — objects of random sizes, writes at random offsets (partial
//!    stripes, parity deltas), appends, truncations, removals, xattrs — checked against a model
//!    after every step and at the end;
//!    then read again with `fast_read`, and a deep scrub of every PG finds the shards
//!    consistent;
//! 3. small objects are written among the rest (their space is measured by the benchmarks);
//! 4. two OSDs (`m`) are killed while a client keeps writing (the pool's `min_size` lowered to
//!    `k`): reads rebuild the missing shards on the fly, writes go on;
//! 5. the two come back and recover their shards; then two *other* OSDs are killed, so that
//!    every object must be rebuilt from shards the recovered OSDs hold: every acknowledged byte
//!    reads back exactly.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use heal_support::{Cluster, all_active_clean, content, osd_state, wait_until};
use kelp_client::{ClientError, IoCtx};

const POOL: &str = "ecpool";

/// A tiny deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Runs `steps` random operations on `objects` objects, checking each against `model`.
async fn fsx(io: &IoCtx, model: &mut BTreeMap<String, Vec<u8>>, seed: u64, steps: usize) {
    let mut rng = Rng(seed | 1);
    for step in 0..steps {
        let name = format!("fsx-{}", rng.below(10));
        let exists = model.contains_key(&name);
        let what = rng.below(10);
        let ctx = format!("step {step} on {name} (op {what})");
        match what {
            0 | 1 => {
                let len = match rng.below(4) {
                    0 => rng.below(5000),
                    1 => 4096,
                    _ => rng.below(600_000),
                } as usize;
                let data = content(rng.next(), len);
                io.write_full(&name, data.clone()).await.expect(&ctx);
                model.insert(name.clone(), data.to_vec());
            }
            2..=4 => {
                let cur = model.get(&name).map_or(0, Vec::len) as u64;
                let off = rng.below(cur + 20_000);
                let big = rng.below(3) == 0;
                let len = 1 + rng.below(if big { 70_000 } else { 6000 });
                let data = content(rng.next(), len as usize);
                io.write(&name, off, data.clone()).await.expect(&ctx);
                let m = model.entry(name.clone()).or_default();
                let end = (off + len) as usize;
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[off as usize..end].copy_from_slice(&data);
            }
            5 => {
                let data = content(rng.next(), 1 + rng.below(9000) as usize);
                io.append(&name, data.clone()).await.expect(&ctx);
                model
                    .entry(name.clone())
                    .or_default()
                    .extend_from_slice(&data);
            }
            6 if exists => {
                let cur = model[&name].len() as u64;
                let size = rng.below(cur + 10_000);
                io.truncate(&name, size).await.expect(&ctx);
                model.get_mut(&name).unwrap().resize(size as usize, 0);
            }
            7 if exists && rng.below(3) == 0 => {
                io.remove(&name).await.expect(&ctx);
                model.remove(&name);
            }
            8 if exists => {
                let v = content(rng.next(), 40);
                io.set_xattr(&name, "k", v.clone()).await.expect(&ctx);
                assert_eq!(io.get_xattr(&name, "k").await.expect(&ctx), v, "{ctx}");
            }
            _ => {}
        }
        // Check the object just touched: size and a random range.
        match model.get(&name) {
            Some(m) => {
                let st = io.stat(&name).await.expect(&ctx);
                assert_eq!(st.size, m.len() as u64, "{ctx}: size");
                let off = rng.below(m.len() as u64 + 1);
                let len = 1 + rng.below(100_000);
                let got = io.read(&name, off, len).await.expect(&ctx);
                let end = (off + len).min(m.len() as u64) as usize;
                assert!(
                    got[..] == m[off as usize..end],
                    "{ctx}: read [{off}, +{len}) differs ({} bytes)",
                    got.len()
                );
            }
            None => match io.stat(&name).await {
                Err(ClientError::NotFound { .. }) => {}
                other => panic!("{ctx}: removed object stats as {other:?}"),
            },
        }
    }
}

fn pool_id(rados: &kelp_client::Rados) -> u32 {
    rados.osd_map().pool_by_name(POOL).unwrap().id
}

async fn check_all(io: &IoCtx, model: &BTreeMap<String, Vec<u8>>, when: &str) {
    for (name, want) in model {
        let got = io
            .read(name, 0, 0)
            .await
            .unwrap_or_else(|e| panic!("{when}: {name}: {e}"));
        assert!(
            got[..] == want[..],
            "{when}: {name}: {} bytes read do not match the {} acknowledged",
            got.len(),
            want.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_coded_pool_survives_m_failures_and_recovers() {
    let c = Cluster::up(6, 8);

    // 1. Profile and pool.
    c.cli(&[
        "osd",
        "erasure-code-profile",
        "set",
        "p42",
        "k=4",
        "m=2",
        "crush-failure-domain=osd",
    ]);
    let got = c.cli(&["osd", "erasure-code-profile", "get", "p42"]);
    assert!(got.contains("k=4") && got.contains("m=2"), "{got}");
    c.cli(&["pool", "create", POOL, "8", "--erasure", "p42"]);
    wait_until(
        "the EC pool's PGs are active+clean",
        Duration::from_secs(60),
        || all_active_clean(&c),
    )
    .await;

    let rados = c.connect().await;
    let io = rados.ioctx(POOL).await.unwrap();
    match io.omap_set("obj", &[("k", b"v".as_slice())]).await {
        Err(ClientError::NotSupported(msg)) => assert!(msg.contains("erasure"), "{msg}"),
        other => panic!("omap on an EC pool: {other:?}"),
    }

    // 2. fsx-style workload.
    let mut model = BTreeMap::new();
    fsx(&io, &mut model, 42, 400).await;
    check_all(&io, &model, "after the workload").await;

    // fast_read: every shard asked, the first four answers decoded.
    c.cli(&["pool", "set", POOL, "fast_read", "true"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    check_all(&io, &model, "with fast_read").await;
    c.cli(&["pool", "set", POOL, "fast_read", "false"]);

    // A deep scrub of every PG finds the shards consistent (shards differ in bytes; their
    // metadata and checksums must agree).
    for seed in 0..8 {
        c.deep_scrub_is_clean(&format!("{}.{seed:x}", pool_id(&rados)));
    }

    // 3. Small objects: 4 KiB in a 4+2 pool is six 1 KiB shards.
    for i in 0..20 {
        let name = format!("small-{i}");
        let data = content(1000 + i, 4096);
        io.write_full(&name, data.clone()).await.unwrap();
        model.insert(name, data.to_vec());
    }

    // 4. Two OSDs down while a client writes (min_size k so the PGs keep serving).
    c.cli(&["pool", "set", POOL, "min_size", "4"]);
    let acked: Arc<Mutex<BTreeMap<String, Bytes>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (io, acked, stop) = (io.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            let mut errors = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("live-{}", i % 40);
                let data = content(5000 + i, (i as usize * 7919) % 90_000);
                match io.write_full(&name, data.clone()).await {
                    Ok(_) => {
                        acked.lock().unwrap().insert(name, data);
                    }
                    Err(_) => errors += 1,
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (i, errors)
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    for osd in ["osd.1", "osd.4"] {
        c.sigkill(osd);
    }
    wait_until(
        "osd.1 and osd.4 are marked down",
        Duration::from_secs(60),
        || !osd_state(&rados, 1).0 && !osd_state(&rados, 4).0,
    )
    .await;
    // Degraded: reads rebuild what the dead OSDs held; writes go on.
    check_all(&io, &model, "with two OSDs down").await;
    fsx(&io, &mut model, 7, 60).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 5. Back, recovered; then two others down: the recovered shards must be right.
    c.start("osd.1");
    c.start("osd.4");
    wait_until("osd.1 and osd.4 are up", Duration::from_secs(60), || {
        osd_state(&rados, 1).0 && osd_state(&rados, 4).0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let (writes, errors) = writer.await.unwrap();
    assert!(writes > 20, "the writer made {writes} writes");
    let live = acked.lock().unwrap().clone();
    assert!(
        !live.is_empty(),
        "no write was acknowledged ({errors} failed)"
    );
    for (k, v) in &live {
        model.insert(k.clone(), v.to_vec());
    }
    wait_until(
        "every PG is active+clean again",
        Duration::from_secs(120),
        || all_active_clean(&c),
    )
    .await;
    check_all(&io, &model, "after recovery").await;
    for osd in ["osd.0", "osd.2"] {
        c.sigkill(osd);
    }
    wait_until(
        "osd.0 and osd.2 are marked down",
        Duration::from_secs(60),
        || !osd_state(&rados, 0).0 && !osd_state(&rados, 2).0,
    )
    .await;
    check_all(&io, &model, "from the recovered shards").await;
}
