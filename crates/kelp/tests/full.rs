//! OSD statistics and full handling on a real cluster (`kelp up --detach` with 64 MiB OSD
//! stores, one monitor, three OSDs, size 3):
//! 1. during a write load `kelp status --format json` reports nonzero client write rates, and
//!    afterwards `num_objects`/`data_bytes` match exactly what was written;
//! 2. issue 6, test 4: fill the cluster until writes fail; the failure is a clean "cluster
//!    full" error that comes promptly (not an op timeout); status shows HEALTH_ERR with
//!    OSD_FULL; every acknowledged object reads back exactly; deletes work while full; once
//!    enough is deleted, writes resume; nothing stored was harmed.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::PathBuf;
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
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kelp-data");
        let d = dir.display().to_string();
        let out = kelp(&[
            "up",
            "--detach",
            "--dir",
            &d,
            "--osd-size",
            "64MiB",
            "--pg-num",
            "8",
            "--timeout-secs",
            "90",
            "--no-rgw",
            "--no-fs",
            "--nbd-port",
            "0",
        ]);
        let c = Cluster { _tmp: tmp, dir };
        assert!(
            out.status.success(),
            "kelp up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    fn conf(&self) -> String {
        self.dir.join("kelp.conf").display().to_string()
    }

    async fn connect(&self) -> Rados {
        let mut cfg =
            ClientConfig::from_conf_file(&self.dir.join("kelp.conf"), "client.admin").unwrap();
        cfg.op_timeout = Duration::from_secs(30);
        Rados::connect(cfg).await.unwrap()
    }

    fn status(&self) -> serde_json::Value {
        let out = kelp(&["status", "--format", "json", "-c", &self.conf()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = kelp(&["down", "--dir", &self.dir.display().to_string()]);
    }
}

fn content(tag: u64, len: usize) -> Bytes {
    let mut x = tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
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

fn pgmap_u64(s: &serde_json::Value, key: &str) -> u64 {
    s["pgmap"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("pgmap.{key} missing: {s}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_follow_the_load_and_a_full_cluster_refuses_writes_cleanly() {
    let started = Instant::now();
    let cluster = Cluster::up();
    let rados = Arc::new(cluster.connect().await);
    let io = Arc::new(rados.ioctx("data").await.unwrap());

    // ---- 1. statistics under a write load (for 6 s, or until a third of the 64 MiB OSDs is
    // used on a fast machine: 4 × 1200 objects of one 4 KiB unit each, plus metadata)
    let stored: Arc<Mutex<BTreeMap<String, Bytes>>> = Arc::default();
    let load_for = Duration::from_secs(6);
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let (io, stored) = (io.clone(), stored.clone());
        writers.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let mut i = 0u64;
            while t0.elapsed() < load_for && i < 1200 {
                let name = format!("small-{w}-{i}");
                let body = content(w * 1_000_000 + i, 1000 + (i as usize * 37) % 3000);
                io.write_full(&name, body.clone()).await.unwrap();
                stored.lock().unwrap().insert(name, body);
                i += 1;
            }
        }));
    }
    let mut saw_rates = None;
    let deadline = Instant::now() + load_for;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let s = cluster.status();
        if pgmap_u64(&s, "write_op_per_sec") > 0 && pgmap_u64(&s, "write_bytes_sec") > 0 {
            saw_rates = Some(s);
            break;
        }
    }
    for w in writers {
        w.await.unwrap();
    }
    let s = saw_rates.expect("no nonzero write rates reported during the load");
    eprintln!(
        "[{:?}] during the load: {} op/s, {} B/s written",
        started.elapsed(),
        s["pgmap"]["write_op_per_sec"],
        s["pgmap"]["write_bytes_sec"]
    );
    let (want_objects, want_bytes) = {
        let st = stored.lock().unwrap();
        (
            st.len() as u64,
            st.values().map(|b| b.len() as u64).sum::<u64>(),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = cluster.status();
        let (objects, bytes) = (pgmap_u64(&s, "num_objects"), pgmap_u64(&s, "data_bytes"));
        if objects == want_objects && bytes == want_bytes {
            assert!(pgmap_u64(&s, "bytes_total") >= 3 * (60 << 20), "{s}");
            assert!(pgmap_u64(&s, "bytes_used") >= want_bytes, "{s}");
            assert_eq!(s["pgmap"]["pgs_by_state"][0]["state_name"], "active+clean");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "status reports {objects} objects / {bytes} bytes, wrote {want_objects} / {want_bytes}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "[{:?}] status counts {want_objects} objects, {want_bytes} bytes",
        started.elapsed()
    );

    // ---- 2. fill to full
    let big = 1 << 20;
    let mut full_error = None;
    for i in 0..200u64 {
        let name = format!("big-{i}");
        let body = content(7_000_000 + i, big);
        let t0 = Instant::now();
        match io.write_full(&name, body.clone()).await {
            Ok(_) => {
                stored.lock().unwrap().insert(name, body);
            }
            Err(e) => {
                full_error = Some((e, t0.elapsed()));
                break;
            }
        }
    }
    let (err, took) = full_error.expect("64 MiB OSDs never filled");
    eprintln!("[{:?}] full after: {err} ({took:?})", started.elapsed());
    assert!(matches!(err, ClientError::Full(_)), "{err:?}");
    assert!(err.to_string().contains("full"), "{err}");
    assert!(
        took < Duration::from_secs(5),
        "the full error took {took:?}"
    );
    // Once the map says full, writes fail at once, and the CLI says so clearly.
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        let s = cluster.status();
        // the health check comes from the OSDs' reports, the map flag right after it
        let flagged = s["osdmap"]["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == "full"));
        if s["health"]["checks"]["OSD_FULL"].is_object() && flagged {
            break s;
        }
        assert!(Instant::now() < deadline, "no OSD_FULL and full flag: {s}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(status["health"]["status"], "HEALTH_ERR", "{status}");
    assert!(
        status["osdmap"]["flags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "full"),
        "{status}"
    );
    let t0 = Instant::now();
    let err = io
        .write_full("one-more", content(1, 4096))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Full(_)), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let file = cluster.dir.join("one-more");
    std::fs::write(&file, b"x").unwrap();
    let out = kelp(&[
        "rados",
        "-c",
        &cluster.conf(),
        "-p",
        "data",
        "put",
        "cli-put",
        &file.display().to_string(),
    ]);
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("cluster is full"), "{msg}");
    let out = kelp(&["health", "detail", "-c", &cluster.conf()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("OSD_FULL") && text.contains("is full"),
        "{text}"
    );

    // Everything acknowledged reads back exactly while full.
    let all = stored.lock().unwrap().clone();
    for (name, body) in &all {
        assert_eq!(&io.read(name, 0, 0).await.unwrap(), body, "{name}");
    }
    eprintln!(
        "[{:?}] {} objects read back while full",
        started.elapsed(),
        all.len()
    );

    // Deletes work while full; once usage drops below the ratio, writes resume.
    let victims: Vec<String> = all
        .keys()
        .filter(|n| n.starts_with("big-"))
        .take(20)
        .cloned()
        .collect();
    for name in &victims {
        io.remove(name).await.unwrap();
        stored.lock().unwrap().remove(name);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let resumed_after = loop {
        match io.write_full("after-delete", content(2, 4096)).await {
            Ok(_) => break Instant::now(),
            Err(ClientError::Full(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
        assert!(Instant::now() < deadline, "writes never resumed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    stored
        .lock()
        .unwrap()
        .insert("after-delete".into(), content(2, 4096));
    eprintln!("[{:?}] writes resumed", started.elapsed());
    let _ = resumed_after;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = cluster.status();
        if s["health"]["status"] == "HEALTH_OK" {
            break;
        }
        assert!(Instant::now() < deadline, "not healthy after deletes: {s}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Nothing stored was harmed, and the deleted objects are gone.
    let all = stored.lock().unwrap().clone();
    for (name, body) in &all {
        assert_eq!(&io.read(name, 0, 0).await.unwrap(), body, "{name}");
    }
    for name in &victims {
        assert!(matches!(
            io.read(name, 0, 0).await,
            Err(ClientError::NotFound { .. })
        ));
    }
    eprintln!("[{:?}] full test done", started.elapsed());
}
