//! `kelp osd perf` and the snapshot-trim progress item on a real cluster (`kelp up`, 3 OSDs,
//! one manager), in one test so the cluster starts once:
//!
//! 1. before any write every OSD's latencies are 0; after writes, `kelp osd perf --format
//!    json` lists every OSD with commit and apply latency > 0 (every OSD holds replicas);
//! 2. objects written under a snapshot keep clones; the snapshot is removed with the trimmer
//!    slowed down (`osd_snap_trim_sleep`), and a `snaptrim` progress item appears in `kelp
//!    progress` and then finishes (fraction 1), and the clones are gone.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use std::time::Duration;

use heal_support::{Cluster, content, progress, wait};

fn perf(c: &Cluster) -> Vec<(i64, u64, u64)> {
    let v: serde_json::Value =
        serde_json::from_str(&c.cli(&["osd", "perf", "--format", "json"])).unwrap();
    v["osd_perf_infos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["id"].as_i64().unwrap(),
                o["perf_stats"]["commit_latency_ns"].as_u64().unwrap(),
                o["perf_stats"]["apply_latency_ns"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn osd_perf_and_snapshot_trim_progress() {
    let c = Cluster::up(3, 8);
    // ---- 1. osd perf
    let before = wait("every OSD reported", Duration::from_secs(30), || {
        let p = perf(&c);
        (p.len() == 3).then_some(p)
    });
    let plain = c.cli(&["osd", "perf"]);
    assert!(plain.contains("commit_lat(ms)"), "{plain}");
    let rados = c.connect().await;
    let mut io = rados.ioctx("data").await.unwrap();
    let n = 48u64;
    for i in 0..n {
        io.write_full(&format!("o-{i}"), content(i, 8192))
            .await
            .unwrap();
    }
    let after = wait(
        "every OSD reports write latencies",
        Duration::from_secs(30),
        || {
            let p = perf(&c);
            (p.len() == 3 && p.iter().all(|(_, commit, apply)| *commit > 0 && *apply > 0))
                .then_some(p)
        },
    );
    eprintln!("osd perf before {before:?}, after writes {after:?}");
    for (id, commit, apply) in &after {
        // commit waits for the apply and then the device
        assert!(commit >= apply, "osd.{id}: commit {commit} < apply {apply}");
    }

    // ---- 2. snapshot trim progress
    let snap = rados.selfmanaged_snap_create("data").await.unwrap();
    io.set_snap_context(snap, vec![snap]).unwrap();
    for i in 0..n {
        io.write_full(&format!("o-{i}"), content(1000 + i, 100))
            .await
            .unwrap();
    }
    // each primary examines about n / 3 clones, 0.25 s apart (twice per head): some seconds
    c.cli(&["config", "set", "osd", "osd_snap_trim_sleep", "0.25"]);
    rados.selfmanaged_snap_remove("data", snap).await.unwrap();
    let item = wait("a snaptrim progress item", Duration::from_secs(60), || {
        progress(&c)
            .into_iter()
            .find(|i| i["kind"] == "snaptrim" && i["finished_ms"].is_null())
    });
    eprintln!("running: {item}");
    let id = item["id"].as_str().unwrap().to_string();
    let done = wait(
        "the snaptrim item finishes",
        Duration::from_secs(120),
        || {
            progress(&c)
                .into_iter()
                .find(|i| i["id"] == id.as_str() && !i["finished_ms"].is_null())
        },
    );
    eprintln!("finished: {done}");
    assert_eq!(done["fraction"].as_f64(), Some(1.0), "{done}");
    let status = c.cli(&["status"]);
    eprintln!("{status}");
}
