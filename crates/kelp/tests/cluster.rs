//! A real cluster: `kelp up --detach` in a temporary directory (one monitor, three OSD
//! processes), driven with the client library. Checks that every acknowledged write reads back
//! exactly: with concurrent clients, across a full restart, and while an OSD is killed with
//! SIGKILL and brought back; that a wrong key is refused; and that garbage sent to the daemons'
//! ports does not hurt them. Bounded: the whole test takes well under two minutes.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_client::{ClientConfig, ClientError, Rados};

fn kelp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .output()
        .expect("run kelp")
}

/// Stops the cluster and removes its directory whatever happens.
struct Cluster {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Cluster {
    fn up() -> Cluster {
        Self::up_with(&[])
    }

    fn up_with(extra: &[&str]) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kelp-data");
        let c = Cluster { _tmp: tmp, dir };
        c.start_with(extra);
        c
    }

    fn start(&self) {
        self.start_with(&[]);
    }

    fn start_with(&self, extra: &[&str]) {
        let d = self.dir.display().to_string();
        let mut args = vec![
            "up",
            "--detach",
            "--dir",
            &d,
            "--osd-size",
            "1GiB",
            "--pg-num",
            "16",
            "--timeout-secs",
            "90",
            "--no-rgw",
            "--no-fs",
            "--nbd-port",
            "0",
        ];
        args.extend_from_slice(extra);
        let out = kelp(&args);
        assert!(
            out.status.success(),
            "kelp up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn down(&self) {
        let out = kelp(&["down", "--dir", &self.dir.display().to_string()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("kelp.conf")
    }

    fn pid(&self, name: &str) -> i32 {
        std::fs::read_to_string(self.dir.join("run").join(format!("{name}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    async fn connect(&self) -> Rados {
        let mut cfg = ClientConfig::from_conf_file(&self.conf(), "client.admin").unwrap();
        cfg.op_timeout = Duration::from_secs(60);
        Rados::connect(cfg).await.unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = kelp(&["down", "--dir", &self.dir.display().to_string()]);
    }
}

/// Deterministic content for object `i` of writer `w` (sizes 0 .. 1 MiB, one of 8 MiB).
fn body(w: usize, i: usize) -> Bytes {
    let len = match (w, i) {
        (0, 0) => 8 << 20,
        (_, 1) => 0,
        _ => (w * 7919 + i * 104_729) % (1 << 20),
    };
    let mut x = ((w as u64 + 1) * 0x9e37_79b9_7f4a_7c15) ^ i as u64;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

async fn verify(rados: &Rados, acked: &BTreeMap<String, Bytes>) {
    let io = rados.ioctx("data").await.unwrap();
    for (name, want) in acked {
        let got = io
            .read(name, 0, 0)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            got == *want,
            "{name}: {} bytes read, {} expected",
            got.len(),
            want.len()
        );
    }
    let mut listed = io.list_objects().await.unwrap();
    listed.sort();
    let mut want: Vec<&String> = acked.keys().collect();
    want.sort();
    assert_eq!(listed.iter().collect::<Vec<_>>(), want, "listing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_restarts_and_a_killed_osd() {
    let started = Instant::now();
    let cluster = Cluster::up();
    // `kelp up` sizes its OSDs for one shared machine: a store budget in kelp.conf's `[osd]`
    // section, CPUs / OSDs async workers on each OSD's command line.
    let conf = kelp_client::ClusterConf::load(&cluster.conf()).unwrap();
    assert_eq!(conf.osd.cache.as_deref(), Some("96MiB"));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cpus / 3).max(1).to_string();
    for n in 0..3 {
        let pid = cluster.pid(&format!("osd.{n}"));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let at = args.iter().position(|a| *a == b"--threads");
        assert_eq!(
            at.map(|i| args[i + 1]),
            Some(threads.as_bytes()),
            "osd.{n}: {}",
            String::from_utf8_lossy(&cmdline)
        );
    }
    let rados = cluster.connect().await;
    let acked: Arc<Mutex<BTreeMap<String, Bytes>>> = Arc::default();

    // 1. four concurrent writers
    let mut tasks = Vec::new();
    for w in 0..4 {
        let io = rados.ioctx("data").await.unwrap();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                let name = format!("w{w}-obj{i}");
                let data = body(w, i);
                io.write_full(&name, data.clone()).await.unwrap();
                acked.lock().unwrap().insert(name, data);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let snapshot = acked.lock().unwrap().clone();
    assert_eq!(snapshot.len(), 160);
    verify(&rados, &snapshot).await;

    eprintln!("[{:?}] restart every daemon", started.elapsed());
    // 2. restart every daemon
    drop(rados);
    cluster.down();
    cluster.start();
    let rados = cluster.connect().await;
    verify(&rados, &snapshot).await;

    eprintln!("[{:?}] SIGKILL one OSD", started.elapsed());
    // 3. SIGKILL one OSD while a client keeps writing; bring it back
    let writer = {
        let io = rados.ioctx("data").await.unwrap();
        let acked = acked.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(14);
            let mut i = 0;
            while Instant::now() < deadline {
                let name = format!("during-kill-{i}");
                let full = body(9, i + 2);
                let data = full.slice(..((i * 977) % (64 << 10)).min(full.len()));
                let t = Instant::now();
                let r = io.write_full(&name, data.clone()).await;
                if t.elapsed() > Duration::from_secs(2) {
                    eprintln!(
                        "slow write {name}: {:?} {:?}",
                        t.elapsed(),
                        r.as_ref().err()
                    );
                }
                match r {
                    Ok(_) => {
                        acked.lock().unwrap().insert(name, data);
                    }
                    Err(ClientError::Timeout { .. }) => {}
                    Err(e) => panic!("{name}: {e}"),
                }
                i += 1;
            }
            i
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let victim = cluster.pid("osd.1");
    // SAFETY: signalling a child daemon of this test by pid.
    assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let out = kelp(&[
        "daemon",
        "start",
        "osd.1",
        "--dir",
        &cluster.dir.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = writer.await.unwrap();
    eprintln!("[{:?}] writer done ({written} writes)", started.elapsed());
    assert!(written > 0);
    // wait for every OSD up and every PG active+clean again
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = kelp(&["health", "-c", &cluster.conf().display().to_string()]);
        if String::from_utf8_lossy(&out.stdout).starts_with("HEALTH_OK") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not healthy: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("[{:?}] healthy again", started.elapsed());
    let all = acked.lock().unwrap().clone();
    assert!(
        all.len() > snapshot.len(),
        "writes went on while an OSD was dead"
    );
    verify(&rados, &all).await;

    eprintln!("[{:?}] a wrong key", started.elapsed());
    // 4. a wrong key is refused; missing pools and objects are clear errors
    let mut bad = ClientConfig::from_conf_file(&cluster.conf(), "client.admin").unwrap();
    bad.secret = kelp_msgr::generate_secret();
    bad.mon_timeout = Duration::from_secs(5);
    let err = Rados::connect(bad)
        .await
        .err()
        .expect("a wrong key must be refused");
    assert!(format!("{err}").to_lowercase().contains("auth"), "{err}");
    assert!(matches!(
        rados.ioctx("nope").await.err(),
        Some(ClientError::NoSuchPool(_))
    ));
    let io = rados.ioctx("data").await.unwrap();
    assert!(matches!(
        io.read("no-such-object", 0, 0).await,
        Err(ClientError::NotFound { .. })
    ));

    eprintln!("[{:?}] garbage", started.elapsed());
    // 5. garbage on the daemons' ports does not hurt them
    let map = rados.osd_map();
    let conf = kelp_client::ClusterConf::load(&cluster.conf()).unwrap();
    let mut targets: Vec<std::net::SocketAddr> = map.osds.values().filter_map(|o| o.addr).collect();
    targets.extend(conf.global.mon_host.iter().copied());
    for (n, addr) in targets.iter().enumerate() {
        for round in 0..20u64 {
            if let Ok(mut s) = std::net::TcpStream::connect(addr) {
                let mut junk = vec![0u8; (round as usize * 37) % 300 + 8];
                let mut x = round * 31 + n as u64 + 1;
                for b in junk.iter_mut() {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    *b = (x >> 33) as u8;
                }
                if round % 5 == 0 {
                    junk[..4].copy_from_slice(b"KELP"); // a plausible start, then nonsense
                }
                let _ = s.write_all(&junk);
            }
        }
    }
    io.write_full("after-garbage", &b"still here"[..])
        .await
        .unwrap();
    assert_eq!(
        &io.read("after-garbage", 0, 0).await.unwrap()[..],
        b"still here"
    );
    for name in ["mon.a", "osd.0", "osd.1", "osd.2"] {
        let pid = cluster.pid(name);
        assert!(Path::new(&format!("/proc/{pid}")).exists(), "{name} died");
    }
    eprintln!("cluster test took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_monitors_keep_serving_when_the_leader_is_killed() {
    let cluster = Cluster::up_with(&["--mons", "3"]);
    let conf = cluster.conf().display().to_string();
    let status = |conf: &str| -> serde_json::Value {
        let out = kelp(&["status", "--format", "json", "-c", conf]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let before = status(&conf);
    assert_eq!(before["monmap"]["num_mons"], 3);
    let leader = before["monmap"]["leader"].as_str().unwrap().to_string();
    let rados = cluster.connect().await;
    let io = rados.ioctx("data").await.unwrap();
    io.write_full("before", &b"1"[..]).await.unwrap();

    // writers keep going while the leader is killed outright (SIGKILL): no acknowledged
    // write may be lost, and they must go on after the election
    let acked: Arc<Mutex<BTreeMap<String, Bytes>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..3 {
        let (io, acked, stop) = (io.clone(), acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = format!("mw{w}-{i}");
                let data = Bytes::from(format!("{name}:{}", "x".repeat(i % 3000)));
                io.write_full(&name, data.clone()).await.unwrap();
                acked.lock().unwrap().insert(name, data);
                i += 1;
            }
            i
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_kill = acked.lock().unwrap().len();
    let pid = cluster.pid(&format!("mon.{leader}"));
    assert!(
        Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    // the client moves to another monitor by itself; writes and map changes go on
    rados
        .create_pool(kelp_maps::PoolSpec {
            name: "made-after".into(),
            pg_num: Some(8),
            ..Default::default()
        })
        .await
        .unwrap();
    let after_election = acked.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let mut acked = std::mem::take(&mut *acked.lock().unwrap());
    acked.insert("before".into(), Bytes::from_static(b"1"));
    assert!(
        acked.len() > after_election && after_election >= before_kill,
        "writes went on after the election ({before_kill} before the kill, {after_election} at the election, {} in all)",
        acked.len()
    );
    verify(&rados, &acked).await;
    io.write_full("after", &b"2"[..]).await.unwrap();
    assert_eq!(&io.read("after", 0, 0).await.unwrap()[..], b"2");
    // The new leader holds no PG statistics until the OSDs' next reports (every
    // osd_stats_interval, 2 s): PGs are `unknown` until then.
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let s = status(&conf);
        if s["health"]["status"] == "HEALTH_OK" {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "not healthy after the failover: {s}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let new_leader = after["monmap"]["leader"].as_str().unwrap();
    assert_ne!(new_leader, leader, "a new leader was elected");
    eprintln!(
        "leader {leader} killed; {} writes acknowledged and verified; new leader {new_leader}",
        acked.len()
    );
    // the stopped monitor rejoins and catches up
    let out = kelp(&[
        "daemon",
        "start",
        &format!("mon.{leader}"),
        "--dir",
        &cluster.dir.display().to_string(),
    ]);
    assert!(out.status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = status(&conf);
        let quorum = s["monmap"]["quorum_names"]
            .as_array()
            .map_or(0, |q| q.len());
        if quorum == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "{leader} did not rejoin: {s}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_osd_is_added_then_another_drained_and_removed_without_losing_a_byte() {
    let started = Instant::now();
    // Data files that grow (the default): the stores say so; the added OSD's file is only
    // reserved (`--no-prewrite`), so the cluster mixes both kinds of store.
    let cluster = Cluster::up_with(&[]);
    let superblock =
        |osd: u32| kelp_store::Superblock::read(&cluster.dir.join(format!("osd.{osd}"))).unwrap();
    assert!(superblock(0).data_written.is_some() && superblock(2).data_written.is_some());
    assert!(superblock(0).data_written_ahead() && !superblock(0).data_prewritten);
    let d = cluster.dir.display().to_string();
    let conf = cluster.conf().display().to_string();
    let rados = cluster.connect().await;
    let io = rados.ioctx("data").await.unwrap();
    let mut acked = BTreeMap::new();
    for i in 0..150 {
        let name = format!("before-{i}");
        let data = body(9, i);
        io.write_full(&name, data.clone()).await.unwrap();
        acked.insert(name, data);
    }

    // a fourth OSD joins: CRUSH moves a share of the PGs onto it
    let out = kelp(&[
        "daemon",
        "add-osd",
        "--dir",
        &d,
        "--osd-size",
        "1GiB",
        "--no-prewrite",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!superblock(3).data_written_ahead());
    for i in 0..100 {
        let name = format!("during-{i}");
        let data = body(8, i);
        io.write_full(&name, data.clone()).await.unwrap();
        acked.insert(name, data);
    }
    let map = rados.osd_map();
    assert!(map.osds.get(&3).is_some_and(|o| o.up && o.is_in()));
    let on_new = map
        .pool_pgs(map.pool_by_name("data").unwrap().id)
        .unwrap()
        .filter(|pg| map.pg_mapping(*pg).unwrap().acting.contains(&3))
        .count();
    assert!(on_new > 0, "no PG moved to the new OSD");
    verify(&rados, &acked).await;

    // osd.0 is drained (out) and removed; nothing may depend on it afterwards
    let refused = kelp(&["daemon", "remove-osd", "0", "--dir", &d]);
    assert!(
        !refused.status.success(),
        "an OSD still in must not be removed"
    );
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is in"));
    let out = kelp(&["osd", "out", "0", "-c", &conf]);
    assert!(out.status.success());
    for i in 0..50 {
        let name = format!("draining-{i}");
        let data = body(7, i);
        io.write_full(&name, data.clone()).await.unwrap();
        acked.insert(name, data);
    }
    verify(&rados, &acked).await;
    let out = kelp(&["daemon", "remove-osd", "0", "--dir", &d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!cluster.dir.join("osd.0").exists());
    let out = kelp(&["osd", "ls", "-c", &conf]);
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!listed.contains("osd.0\t"), "{listed}");
    assert!(listed.contains("osd.3\tup\tin"), "{listed}");
    verify(&rados, &acked).await;
    io.write_full("after-removal", &b"ok"[..]).await.unwrap();
    eprintln!(
        "add/drain/remove test took {:?} ({} objects verified three times)",
        started.elapsed(),
        acked.len()
    );
}
