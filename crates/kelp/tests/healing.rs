//! Failure detection and cluster flags on a real cluster (`kelp up`: one monitor, three OSD
//! processes, pool `data` size 3 / min_size 2), in one test so the cluster starts once:
//!
//! 1. an OSD frozen with SIGSTOP is marked down by its peers' heartbeat reports within the
//!    grace while a client keeps writing; after SIGCONT it notices and boots itself up again;
//! 2. with a short `mon_osd_down_out_interval`, a SIGKILLed OSD is marked out, and in again
//!    when it restarts;
//! 3. `noout` keeps a down OSD in (and unsetting it lets the interval apply);
//! 4. `pause` holds a client write and a read until it is unset, then both complete;
//! 5. `norecover` leaves a restarted OSD behind (its primaries log it, writes go on) until it
//!    is unset, then the PGs recover;
//! 6. `noup` keeps a restarted OSD down until it is unset, then it boots by itself;
//!
//! and at the end every acknowledged write reads back exactly.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use heal_support::{Cluster, content, osd_state, wait_until};
use kelp_client::Rados;

type Acked = Arc<Mutex<BTreeMap<String, Bytes>>>;

/// Writes `prefix-N` objects until `stop`, recording what was acknowledged; returns the number
/// of writes and any error (none is expected: writes must keep succeeding).
fn writer(
    rados: &Rados,
    prefix: &'static str,
    acked: Acked,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<(usize, Vec<String>)> {
    let rados = rados.clone();
    tokio::spawn(async move {
        let io = rados.ioctx("data").await.unwrap();
        let mut errors = Vec::new();
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let name = format!("{prefix}-{}", i % 64);
            let data = content(i as u64 + 1, (i * 7919) % (48 << 10));
            let t = Instant::now();
            match io.write_full(&name, data.clone()).await {
                Ok(_) => {
                    acked.lock().unwrap().insert(name, data);
                    ok.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => errors.push(format!("{name} after {:?}: {e}", t.elapsed())),
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (i, errors)
    })
}

async fn verify(rados: &Rados, acked: &Acked) {
    let io = rados.ioctx("data").await.unwrap();
    let all = acked.lock().unwrap().clone();
    heal_support::read_back(&io, &all).await;
}

fn count_in_osd_logs(c: &Cluster, needle: &str) -> usize {
    (0..3)
        .map(|i| c.log(&format!("osd.{i}")).matches(needle).count())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_detection_down_out_and_flags() {
    let started = Instant::now();
    let c = Cluster::up(3, 16);
    let rados = c.connect().await;
    let acked: Acked = Arc::default();
    let t = |what: &str| eprintln!("[{:>6.1?}] {what}", started.elapsed());

    // ---- 1. SIGSTOP: marked down by heartbeat reports; writes go on; SIGCONT: up again.
    // The monitor's session watch would notice too (the messenger's keepalives drop the
    // frozen OSD's connection); give it a long grace so that only the peers' reports can
    // mark osd.2 down in time.
    c.cli(&["config", "set", "mon", "mon_osd_session_grace", "60"]);
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let w = writer(&rados, "frozen", acked.clone(), stop.clone(), ok.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    t("SIGSTOP osd.2");
    c.sigstop("osd.2");
    let took = wait_until("osd.2 marked down", Duration::from_secs(20), || {
        !osd_state(&rados, 2).0
    })
    .await;
    t(&format!("osd.2 marked down after {took:?}"));
    // grace 6 s + a heartbeat interval + the monitor's tick; far below the session timeouts
    // (the frozen process keeps its TCP connections).
    assert!(took <= Duration::from_secs(12), "detection took {took:?}");
    let status = c.cli(&["status", "--format", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["osdmap"]["num_up_osds"], 2, "{status}");
    let mon_log = c.log("mon.a");
    assert!(
        mon_log.contains("reported failed by"),
        "the monitor did not mark osd.2 down on failure reports:\n{}",
        mon_log
            .lines()
            .filter(|l| l.contains("osd") || l.contains("OSD") || l.contains("failure"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Writes keep succeeding on the two remaining replicas (min_size 2).
    let before = ok.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = ok.load(Ordering::Relaxed) - before;
    t(&format!(
        "{during} writes acknowledged in 3 s with osd.2 frozen and down"
    ));
    assert!(
        during >= 10,
        "only {during} writes in 3 s while osd.2 was down"
    );
    t("SIGCONT osd.2");
    c.sigcont("osd.2");
    let took = wait_until("osd.2 up again", Duration::from_secs(20), || {
        osd_state(&rados, 2).0
    })
    .await;
    t(&format!("osd.2 up again after {took:?}"));
    stop.store(true, Ordering::Relaxed);
    let (writes, errors) = w.await.unwrap();
    assert!(errors.is_empty(), "writes failed: {errors:?}");
    t(&format!("{writes} writes while osd.2 was frozen and back"));
    verify(&rados, &acked).await;

    // ---- 2. down → out after the interval; in again at restart.
    c.cli(&["config", "rm", "mon", "mon_osd_session_grace"]);
    c.cli(&["config", "set", "mon", "mon_osd_down_out_interval", "3"]);
    t("SIGKILL osd.1");
    c.sigkill("osd.1");
    let took = wait_until("osd.1 marked down", Duration::from_secs(15), || {
        !osd_state(&rados, 1).0
    })
    .await;
    t(&format!("osd.1 down after {took:?}"));
    let took = wait_until("osd.1 marked out", Duration::from_secs(15), || {
        !osd_state(&rados, 1).1
    })
    .await;
    t(&format!("osd.1 out {took:?} later"));
    assert!(took >= Duration::from_secs(2), "out too early: {took:?}");
    rados
        .ioctx("data")
        .await
        .unwrap()
        .write_full("while-out", Bytes::from_static(b"x"))
        .await
        .unwrap();
    acked
        .lock()
        .unwrap()
        .insert("while-out".into(), Bytes::from_static(b"x"));
    c.start("osd.1");
    let took = wait_until("osd.1 up and in", Duration::from_secs(30), || {
        osd_state(&rados, 1) == (true, true)
    })
    .await;
    t(&format!("osd.1 up and in again after {took:?}"));

    // ---- 3. noout keeps it in; unsetting it lets the interval apply.
    c.cli(&["osd", "set", "noout"]);
    c.sigkill("osd.1");
    wait_until("osd.1 down (noout)", Duration::from_secs(15), || {
        !osd_state(&rados, 1).0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(osd_state(&rados, 1), (false, true), "noout: still in");
    t("noout held osd.1 in for 6 s");
    c.cli(&["osd", "unset", "noout"]);
    wait_until(
        "osd.1 out after noout is unset",
        Duration::from_secs(5),
        || !osd_state(&rados, 1).1,
    )
    .await;
    c.start("osd.1");
    wait_until(
        "osd.1 up and in (after noout)",
        Duration::from_secs(30),
        || osd_state(&rados, 1) == (true, true),
    )
    .await;
    t("osd.1 back");

    // ---- 4. pause holds a write and a read; unpause completes them.
    let io = rados.ioctx("data").await.unwrap();
    io.write_full("paused-read", Bytes::from_static(b"before pause"))
        .await
        .unwrap();
    acked
        .lock()
        .unwrap()
        .insert("paused-read".into(), Bytes::from_static(b"before pause"));
    c.cli(&["osd", "set", "pause"]);
    let epoch = rados.osd_map().epoch;
    wait_until("the client sees pause", Duration::from_secs(5), || {
        rados.osd_map().has_flag(kelp_maps::ClusterFlag::Pause)
    })
    .await;
    let data = content(4242, 10_000);
    let wio = io.clone();
    let wdata = data.clone();
    let held_write = tokio::spawn(async move { wio.write_full("paused-write", wdata).await });
    let rio = io.clone();
    let held_read = tokio::spawn(async move { rio.read("paused-read", 0, 0).await });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !held_write.is_finished(),
        "a write went through while paused"
    );
    assert!(!held_read.is_finished(), "a read went through while paused");
    t(&format!(
        "pause held a write and a read for 3 s (epoch {epoch})"
    ));
    c.cli(&["osd", "unset", "pause"]);
    let unpaused = Instant::now();
    tokio::time::timeout(Duration::from_secs(15), held_write)
        .await
        .expect("the held write completes after unpause")
        .unwrap()
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(15), held_read)
        .await
        .expect("the held read completes after unpause")
        .unwrap()
        .unwrap();
    assert_eq!(&got[..], b"before pause");
    t(&format!(
        "held ops completed {:?} after unpause",
        unpaused.elapsed()
    ));
    acked.lock().unwrap().insert("paused-write".into(), data);

    // ---- 5. norecover leaves a restarted OSD behind until unset.
    c.cli(&["osd", "set", "norecover"]);
    c.sigkill("osd.0");
    wait_until("osd.0 down", Duration::from_secs(15), || {
        !osd_state(&rados, 0).0
    })
    .await;
    for i in 0..20 {
        let name = format!("norecover-{i}");
        let data = content(9000 + i, 3000 + i as usize * 100);
        io.write_full(&name, data.clone()).await.unwrap();
        acked.lock().unwrap().insert(name, data);
    }
    let recovered_before = count_in_osd_logs(&c, " recovered in ");
    c.start("osd.0");
    wait_until("osd.0 up", Duration::from_secs(30), || {
        osd_state(&rados, 0).0
    })
    .await;
    wait_until(
        "a primary leaves osd.0 behind under norecover",
        Duration::from_secs(15),
        || count_in_osd_logs(&c, "recovery of these members paused") > 0,
    )
    .await;
    // Writes go on, degraded.
    for i in 20..30 {
        let name = format!("norecover-{i}");
        let data = content(9000 + i, 2000);
        io.write_full(&name, data.clone()).await.unwrap();
        acked.lock().unwrap().insert(name, data);
    }
    let recovered_paused = count_in_osd_logs(&c, " recovered in ");
    t(&format!(
        "norecover: osd.0 left behind ({} recoveries before, {} now)",
        recovered_before, recovered_paused
    ));
    c.cli(&["osd", "unset", "norecover"]);
    wait_until(
        "PGs recover osd.0 once norecover is unset",
        Duration::from_secs(20),
        || count_in_osd_logs(&c, " recovered in ") > recovered_paused,
    )
    .await;
    t("recovered after unset");

    // ---- 6. noup: a restarted OSD stays down until the flag is cleared, then boots by itself.
    c.cli(&["osd", "set", "noup"]);
    c.sigkill("osd.2");
    wait_until("osd.2 down (noup)", Duration::from_secs(15), || {
        !osd_state(&rados, 2).0
    })
    .await;
    c.start("osd.2");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!osd_state(&rados, 2).0, "noup: osd.2 was marked up");
    c.cli(&["osd", "unset", "noup"]);
    let took = wait_until(
        "osd.2 up after noup is unset",
        Duration::from_secs(10),
        || osd_state(&rados, 2).0,
    )
    .await;
    t(&format!("noup held osd.2 down; up {took:?} after unset"));

    verify(&rados, &acked).await;
    t("every acknowledged write reads back");
}
