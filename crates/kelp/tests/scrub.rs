//! Scrub and repair on a real cluster (issue 6, test 3): `kelp up` (one monitor, three OSD
//! processes, a size-3 pool), objects with known content, bytes flipped in one replica's data
//! file while that OSD is stopped. `kelp pg deep-scrub` must name the object and the bad OSD
//! (`kelp pg list-inconsistent`, `kelp health detail`), `kelp pg repair` must fix it (the
//! repaired store passes `kelp store fsck --deep`), and the client must never read wrong data —
//! also when the damaged copy is the primary's, which answers from a replica instead.
//!
//! How the bytes are found: the test searches the stopped OSD's data file (`osd.N/block`) for
//! a 64-byte run of the object's (pseudo-random, unique) content and flips 16 bytes there.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_client::{ClientConfig, Rados};
use kelp_types::PgId;

fn kelp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .output()
        .expect("run kelp")
}

fn kelp_ok(args: &[&str]) -> String {
    let out = kelp(args);
    assert!(
        out.status.success(),
        "kelp {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stops the cluster and removes its directory whatever happens.
struct Cluster {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Cluster {
    fn up() -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kelp-data");
        let d = dir.display().to_string();
        kelp_ok(&[
            "up",
            "--detach",
            "--dir",
            &d,
            "--osd-size",
            "256MiB",
            "--pg-num",
            "8",
            "--timeout-secs",
            "90",
            "--no-rgw",
            "--no-fs",
        ]);
        Cluster { _tmp: tmp, dir }
    }

    fn d(&self) -> String {
        self.dir.display().to_string()
    }

    fn conf(&self) -> String {
        self.dir.join("kelp.conf").display().to_string()
    }

    /// `kelp CMD… --conf CONF`, which must succeed; its standard output.
    fn cli_ok(&self, args: &[&str]) -> String {
        let conf = self.conf();
        let mut a = args.to_vec();
        a.extend(["--conf", conf.as_str()]);
        kelp_ok(&a)
    }

    fn daemon(&self, verb: &str, name: &str) {
        kelp_ok(&["daemon", verb, name, "--dir", &self.d()]);
    }

    async fn connect(&self) -> Rados {
        let mut cfg =
            ClientConfig::from_conf_file(Path::new(&self.conf()), "client.admin").unwrap();
        cfg.op_timeout = Duration::from_secs(60);
        Rados::connect(cfg).await.unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = kelp(&["down", "--dir", &self.d()]);
    }
}

/// Pseudo-random content, unique per seed.
fn body(seed: u64, len: usize) -> Bytes {
    let mut x = (seed + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

/// Flips 16 bytes of the single place in `file` holding `needle`; returns the file offset.
fn flip(file: &Path, needle: &[u8]) -> u64 {
    let found = heal_support::find_all(file, needle);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    assert_eq!(
        found.len(),
        1,
        "the pattern must be in {} exactly once",
        file.display()
    );
    let at = found[0];
    f.seek(SeekFrom::Start(at)).unwrap();
    let flipped: Vec<u8> = needle[..16].iter().map(|b| !b).collect();
    f.write_all(&flipped).unwrap();
    f.sync_all().unwrap();
    at
}

/// Writes `obj-I` with `body(I, len)` for each I, recording each in `written`.
async fn write_objects(
    io: &kelp_client::IoCtx,
    ids: std::ops::Range<u64>,
    len: usize,
    written: &mut BTreeMap<String, Bytes>,
) {
    for i in ids {
        let name = format!("obj-{i}");
        let data = body(i, len);
        io.write_full(&name, data.clone()).await.unwrap();
        written.insert(name, data);
    }
}

fn pg_of(rados: &Rados, name: &str) -> (PgId, Vec<i32>) {
    let map = rados.osd_map();
    let pool = map.pool_by_name("data").unwrap();
    let pg = pool.placement().object_pg(name, None, "");
    let m = map.pg_mapping(pg).unwrap();
    (pg, m.acting)
}

fn list_inconsistent(c: &Cluster, pg: PgId) -> serde_json::Value {
    let out = c.cli_ok(&[
        "pg",
        "list-inconsistent",
        &pg.to_string(),
        "--format",
        "json",
    ]);
    serde_json::from_str(&out).unwrap()
}

/// Waits until every OSD is up and `name` reads back as `want`.
async fn wait_serving(rados: &Rados, name: &str, want: &Bytes) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let map = rados.osd_map();
        if map.num_up() == 3 {
            let io = rados.ioctx("data").await.unwrap();
            if let Ok(got) = io.read(name, 0, 0).await {
                assert!(got == *want, "{name}: wrong data");
                return;
            }
        }
        assert!(Instant::now() < deadline, "the cluster did not come back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_scrub_finds_flipped_bytes_and_repair_fixes_them() {
    let started = Instant::now();
    let c = Cluster::up();
    let rados = c.connect().await;
    let io = rados.ioctx("data").await.unwrap();

    // Objects with known content (256 KiB: whole allocation units, written straight to the
    // data file rather than deferred).
    let mut written: BTreeMap<String, Bytes> = BTreeMap::new();
    write_objects(&io, 0..24u64, 256 << 10, &mut written).await;
    let victim = "obj-3".to_string();
    let (pg, acting) = pg_of(&rados, &victim);
    assert_eq!(acting.len(), 3);
    let replica = acting[1];
    eprintln!(
        "[{:?}] {victim} in pg {pg}, acting {acting:?}; corrupting osd.{replica}",
        started.elapsed()
    );

    // A reader that checks every object continuously, for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let io = rados.ioctx("data").await.unwrap();
        let (stop, reads, written) = (stop.clone(), reads.clone(), written.clone());
        tokio::spawn(async move {
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for (name, want) in &written {
                    match io.read(name, 0, 0).await {
                        Ok(got) => {
                            assert!(got == *want, "{name}: the client read wrong data");
                            reads.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => errors.push(format!("{name}: {e}")),
                    }
                }
            }
            errors
        })
    };

    // Flip bytes of the victim in the replica's data file while it is stopped.
    let name = format!("osd.{replica}");
    c.daemon("stop", &name);
    let needle = &written[&victim][100_000..100_064];
    let at = flip(&c.dir.join(&name).join("block"), needle);
    eprintln!(
        "[{:?}] flipped 16 bytes at offset {at} of {name}/block",
        started.elapsed()
    );
    c.daemon("start", &name);
    wait_serving(&rados, &victim, &written[&victim]).await;

    // Writers keep going in the PG while it is scrubbed and repaired.
    let writer = {
        let io = rados.ioctx("data").await.unwrap();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut done = BTreeMap::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("during-{i}");
                let data = body(1000 + i, 4096 + (i as usize % 7) * 1000);
                io.write_full(&name, data.clone()).await.unwrap();
                done.insert(name, data);
                i += 1;
            }
            done
        })
    };

    // Deep scrub: the victim is named, with the replica's copy bad.
    let pgid = pg.to_string();
    let t = Instant::now();
    let out = c.cli_ok(&["pg", "deep-scrub", &pgid, "--wait"]);
    eprintln!(
        "[{:?}] deep scrub took {:?}: {out}",
        started.elapsed(),
        t.elapsed()
    );
    let report = list_inconsistent(&c, pg);
    let objs = report["inconsistents"].as_array().unwrap();
    assert_eq!(objs.len(), 1, "{report:#}");
    assert_eq!(objs[0]["object"]["name"], victim.as_str());
    assert_eq!(
        objs[0]["bad_osds"],
        serde_json::json!([replica]),
        "{report:#}"
    );
    assert_eq!(
        objs[0]["auth_osd"],
        serde_json::json!(acting[0]),
        "{report:#}"
    );
    assert!(
        objs[0]["errors"]
            .as_array()
            .unwrap()
            .contains(&"read_error".into()),
        "{report:#}"
    );
    let health = c.cli_ok(&["health", "detail"]);
    assert!(health.starts_with("HEALTH_ERR"), "{health}");
    assert!(health.contains("OSD_SCRUB_ERRORS"), "{health}");
    assert!(health.contains("PG_DAMAGED"), "{health}");
    assert!(health.contains(&format!("pg {pgid} is")), "{health}");
    let pgls = c.cli_ok(&["pg", "ls"]);
    assert!(
        pgls.lines()
            .any(|l| l.starts_with(&pgid) && l.contains("+inconsistent")),
        "{pgls}"
    );

    // Repair: list-inconsistent empty, a new deep scrub clean, health clear.
    let out = c.cli_ok(&["pg", "repair", &pgid, "--wait"]);
    eprintln!("[{:?}] repair: {out}", started.elapsed());
    assert!(out.contains("1 repaired"), "{out}");
    let report = list_inconsistent(&c, pg);
    assert_eq!(report["inconsistents"], serde_json::json!([]), "{report:#}");
    let out = c.cli_ok(&["pg", "deep-scrub", &pgid, "--wait"]);
    assert!(out.contains(" 0 inconsistent"), "{out}");
    let health = c.cli_ok(&["health", "detail"]);
    assert!(!health.contains("OSD_SCRUB_ERRORS"), "{health}");
    assert!(!health.contains("PG_DAMAGED"), "{health}");

    stop.store(true, Ordering::Relaxed);
    let during = writer.await.unwrap();
    assert!(!during.is_empty());
    stop.store(false, Ordering::Relaxed);

    // The repaired replica's store is clean, checked offline.
    c.daemon("stop", &name);
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
    c.daemon("start", &name);
    wait_serving(&rados, &victim, &written[&victim]).await;

    // Now the primary's copy of another object: the read is served from a replica and the
    // primary's copy is repaired on the way.
    let victim2 = written
        .keys()
        .find(|n| pg_of(&rados, n).1[0] != replica && **n != victim)
        .unwrap()
        .clone();
    let (pg2, acting2) = pg_of(&rados, &victim2);
    let primary = acting2[0];
    let pname = format!("osd.{primary}");
    eprintln!(
        "[{:?}] corrupting the primary osd.{primary}'s copy of {victim2} (pg {pg2})",
        started.elapsed()
    );
    c.daemon("stop", &pname);
    flip(
        &c.dir.join(&pname).join("block"),
        &written[&victim2][50_000..50_064],
    );
    c.daemon("start", &pname);
    // Wait until it is primary again.
    let deadline = Instant::now() + Duration::from_secs(60);
    while pg_of(&rados, &victim2).1.first() != Some(&primary) || rados.osd_map().num_up() < 3 {
        assert!(Instant::now() < deadline, "osd.{primary} did not come back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = io.read(&victim2, 0, 0).await.unwrap();
    assert!(
        got == written[&victim2],
        "{victim2}: wrong data from a damaged primary"
    );
    // The primary noticed and repaired its copy (counted in the PG's summary)…
    let report = list_inconsistent(&c, pg2);
    assert_eq!(report["primary"], serde_json::json!(primary), "{report:#}");
    assert_eq!(report["summary"]["num_objects_repaired"], 1, "{report:#}");
    // …so a deep scrub finds nothing.
    let out = c.cli_ok(&["pg", "deep-scrub", &pg2.to_string(), "--wait"]);
    assert!(out.contains(" 0 inconsistent"), "{out}");

    stop.store(true, Ordering::Relaxed);
    let errors = reader.await.unwrap();
    let n = reads.load(Ordering::Relaxed);
    eprintln!(
        "[{:?}] reader: {n} good reads, {} errors {:?}",
        started.elapsed(),
        errors.len(),
        errors.iter().take(3).collect::<Vec<_>>()
    );
    assert!(n > 100, "the reader made too little progress: {n}");
    assert!(errors.is_empty(), "reads failed: {errors:?}");
    // Everything written during the scrubs reads back.
    for (name, want) in &during {
        assert!(io.read(name, 0, 0).await.unwrap() == *want, "{name}");
    }
    // `kelp osd deep-scrub` queues every PG the OSD is primary for.
    let out = c.cli_ok(&["osd", "deep-scrub", &primary.to_string()]);
    assert!(out.contains("instructed to deep-scrub"), "{out}");
    assert!(
        !out.contains(" 0 pgs"),
        "osd.{primary} is primary of {pg2}: {out}"
    );

    // Scheduled scrubs follow the central config: with a 2 s maximum interval every PG is
    // scrubbed within a few seconds whatever the load (the OSDs re-read the config every 5 s).
    let t = Instant::now();
    c.cli_ok(&["config", "set", "osd", "osd_scrub_min_interval", "1"]);
    c.cli_ok(&["config", "set", "osd", "osd_scrub_max_interval", "2"]);
    let stamp = |pg: PgId, key: &str| list_inconsistent(&c, pg)["summary"][key].as_u64().unwrap();
    let set_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let deadline = Instant::now() + Duration::from_secs(30);
    while stamp(pg, "last_scrub_stamp") <= set_at {
        assert!(
            Instant::now() < deadline,
            "no scheduled scrub of {pg} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "[{:?}] scheduled scrub seen after {:?}",
        started.elapsed(),
        t.elapsed()
    );
    c.cli_ok(&["config", "rm", "osd", "osd_scrub_min_interval"]);
    c.cli_ok(&["config", "rm", "osd", "osd_scrub_max_interval"]);
    eprintln!("[{:?}] done", started.elapsed());
}

/// Unfound (issue 6): an object whose every in-sync copy is unreadable when a member that
/// missed its last write comes back. Recovery copies everything else, reports the object as
/// unfound (`kelp status`, `kelp health detail`), clients get an error for it — never other
/// data — and once a client overwrites it the member is recovered and the PG is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_with_no_readable_copy_is_reported_unfound_never_invented() {
    let started = Instant::now();
    let c = Cluster::up();
    c.cli_ok(&["osd", "set", "noout"]);
    let rados = c.connect().await;
    let io = rados.ioctx("data").await.unwrap();
    let mut written: BTreeMap<String, Bytes> = BTreeMap::new();
    write_objects(&io, 0..12u64, 256 << 10, &mut written).await;
    let victim = "obj-3".to_string();
    let (pg, acting) = pg_of(&rados, &victim);
    assert_eq!(acting.len(), 3);
    let (primary, replica, behind) = (acting[0], acting[1], acting[2]);
    eprintln!(
        "[{:?}] {victim} in pg {pg}, acting {acting:?}",
        started.elapsed()
    );

    // osd.behind misses the victim's new version (and other writes).
    c.daemon("stop", &format!("osd.{behind}"));
    let v2 = body(500, 256 << 10);
    io.write_full(&victim, v2.clone()).await.unwrap();
    written.insert(victim.clone(), v2.clone());
    write_objects(&io, 12..20u64, 64 << 10, &mut written).await;
    // Both copies of the new version rot (each OSD stopped while its file is changed).
    let needle = &v2[100_000..100_064];
    for osd in [replica, primary] {
        let name = format!("osd.{osd}");
        c.daemon("stop", &name);
        let at = flip(&c.dir.join(&name).join("block"), needle);
        eprintln!("[{:?}] flipped {name}/block at {at}", started.elapsed());
        c.daemon("start", &name);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !rados.osd_map().is_up(osd) {
            assert!(Instant::now() < deadline, "{name} did not come back");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    c.daemon("start", &format!("osd.{behind}"));

    // Recovery cannot copy the victim: it is reported unfound.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let s: serde_json::Value =
            serde_json::from_str(&c.cli_ok(&["status", "--format", "json"])).unwrap();
        if s["pgmap"]["unfound_objects"] == 1 {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "no unfound object reported: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("[{:?}] unfound reported", started.elapsed());
    assert!(
        status["health"]["checks"]["OBJECT_UNFOUND"].is_object(),
        "{status:#}"
    );
    let detail = c.cli_ok(&["health", "detail"]);
    assert!(
        detail.contains(&format!("pg {pg} has 1 unfound objects")),
        "{detail}"
    );
    // Clients get an error for it, and every other object as written.
    let err = io
        .read(&victim, 0, 0)
        .await
        .expect_err("a read of an object with no readable copy must fail");
    eprintln!("[{:?}] reading the victim: {err}", started.elapsed());
    for (name, want) in written.iter().filter(|(n, _)| **n != victim) {
        let got = io.read(name, 0, 0).await.unwrap();
        assert!(got == *want, "{name}: wrong data");
    }

    // The PG still takes writes; overwriting the victim lets recovery finish.
    let v3 = body(600, 200 << 10);
    io.write_full(&victim, v3.clone()).await.unwrap();
    written.insert(victim.clone(), v3);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s: serde_json::Value =
            serde_json::from_str(&c.cli_ok(&["status", "--format", "json"])).unwrap();
        let clean = s["pgmap"]["pgs_by_state"]
            .as_array()
            .is_some_and(|a| a.len() == 1 && a[0]["state_name"] == "active+clean");
        if clean && s["pgmap"]["unfound_objects"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not clean: {s:#}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("[{:?}] clean again", started.elapsed());
    for (name, want) in &written {
        let got = io.read(name, 0, 0).await.unwrap();
        assert!(got == *want, "{name}: wrong data");
    }
}
