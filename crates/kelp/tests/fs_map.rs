//! The file-system map and MDS failover against a real cluster (`kelp up`, one monitor, three
//! OSDs). The MDS daemons are faked by this test: two client instances send beacons through
//! `Rados::mds_beacon`, as a real MDS does, and follow what the monitors answer.
//!
//! 1. `kelp fs new` refusals (unknown pool, erasure-coded metadata pool, existing name,
//!    max_mds > 1, pool deletion of a pool in use, `fs rm` without confirmation or while an MDS
//!    is active) and the read commands (`fs ls`, `fs status`, `mds stat`, `status`), text and
//!    JSON;
//! 2. the first MDS takes the file system at once, the second stays standby;
//! 3. the active MDS's beacons stop: within `mds_beacon_grace` + a few seconds the standby
//!    holds the role with a higher incarnation, the old instance is on the OSD blocklist
//!    (its object writes are refused), and its late beacon is answered `Stop`;
//! 4. `kelp mds fail` of the new active with no standby left: the file system is offline
//!    (`MDS_ALL_DOWN` in `kelp health detail`);
//! 5. the monitor restarts: the file system's definition and incarnation counter survive;
//! 6. `kelp fs fail` then `kelp fs rm --yes-i-really-mean-it`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heal_support::{Cluster, kelp, wait_until};
use kelp_client::{MdsAssignment, MdsBeacon, MdsState, Rados};

fn t(msg: &str) {
    eprintln!("[fs_map] {msg}");
}

/// Runs `kelp ARGS -c CONF`, expects failure, returns stderr.
fn cli_err(c: &Cluster, args: &[&str]) -> String {
    let conf = c.conf();
    let mut all = args.to_vec();
    all.extend(["-c", &conf]);
    let out = kelp(&all);
    assert!(
        !out.status.success(),
        "kelp {args:?} should fail: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A fake MDS: beacons every 300 ms and follows the answers (Standby → told Active → Replay
/// → Active), recording the last answer.
struct FakeMds {
    rados: Rados,
    beacon: Arc<Mutex<MdsBeacon>>,
    last: Arc<Mutex<Option<MdsAssignment>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeMds {
    async fn start(c: &Cluster, name: &str, port: u16) -> FakeMds {
        let rados = c.connect().await;
        let beacon = Arc::new(Mutex::new(MdsBeacon {
            name: name.to_string(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            instance: rados.instance(),
            fs: None,
            state: MdsState::Standby,
            incarnation: 0,
        }));
        let last = Arc::new(Mutex::new(None));
        let task = {
            let (rados, beacon, last) = (rados.clone(), beacon.clone(), last.clone());
            tokio::spawn(async move {
                loop {
                    let b = beacon.lock().unwrap().clone();
                    if let Ok(a) = rados.mds_beacon(&b).await {
                        let mut b = beacon.lock().unwrap();
                        match &a {
                            MdsAssignment::Active { incarnation, .. } => {
                                // replayed at once: Replay on the first answer, then Active
                                b.state = if b.state == MdsState::Standby {
                                    MdsState::Replay
                                } else {
                                    MdsState::Active
                                };
                                b.incarnation = *incarnation;
                            }
                            MdsAssignment::Standby => {
                                b.state = MdsState::Standby;
                                b.incarnation = 0;
                            }
                            MdsAssignment::Stop => {}
                        }
                        *last.lock().unwrap() = Some(a);
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            })
        };
        FakeMds {
            rados,
            beacon,
            last,
            task,
        }
    }

    fn last(&self) -> Option<MdsAssignment> {
        self.last.lock().unwrap().clone()
    }
}

impl Drop for FakeMds {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn fs_map_json(c: &Cluster) -> serde_json::Value {
    serde_json::from_str(&c.cli(&["fs", "status", "--format", "json"])).unwrap()
}

fn active_of(c: &Cluster) -> Option<(String, String, u64)> {
    let v = fs_map_json(c);
    let a = &v["filesystems"][0]["active"];
    a.is_object().then(|| {
        (
            a["name"].as_str().unwrap().to_string(),
            a["state"].as_str().unwrap().to_string(),
            a["incarnation"].as_u64().unwrap(),
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_map_and_mds_failover() {
    let c = Cluster::up(3, 8);
    let grace = 3;
    c.cli(&[
        "config",
        "set",
        "mon",
        "mds_beacon_grace",
        &grace.to_string(),
    ]);

    t("phase 1: definitions and refusals");
    c.cli(&["pool", "create", "fs_meta", "8"]);
    c.cli(&["pool", "create", "fs_data", "8"]);
    c.cli(&[
        "osd",
        "erasure-code-profile",
        "set",
        "p21",
        "k=2",
        "m=1",
        "crush-failure-domain=osd",
    ]);
    c.cli(&["pool", "create", "fs_ec", "8", "--erasure", "p21"]);
    let e = cli_err(&c, &["fs", "new", "cephfs", "nope", "fs_data"]);
    assert!(e.contains("pool 'nope' does not exist"), "{e}");
    let e = cli_err(&c, &["fs", "new", "cephfs", "fs_ec", "fs_data"]);
    assert!(e.contains("erasure-coded") && e.contains("omap"), "{e}");
    let e = cli_err(&c, &["fs", "new", "cephfs", "fs_meta", "fs_ec"]);
    assert!(e.contains("--force"), "{e}");
    c.cli(&["fs", "new", "cephfs", "fs_meta", "fs_data"]);
    let e = cli_err(&c, &["fs", "new", "cephfs", "fs_meta", "fs_data"]);
    assert!(e.contains("already exists"), "{e}");
    let e = cli_err(&c, &["fs", "new", "other", "fs_meta", "fs_ec", "--force"]);
    assert!(e.contains("already used by file system 'cephfs'"), "{e}");
    let e = cli_err(&c, &["fs", "set", "cephfs", "max_mds", "2"]);
    assert!(e.contains("only one active MDS"), "{e}");
    let e = cli_err(&c, &["pool", "rm", "fs_data", "--yes-i-really-mean-it"]);
    assert!(e.contains("in use by file system 'cephfs'"), "{e}");
    let e = cli_err(&c, &["fs", "rm", "cephfs"]);
    assert!(e.contains("--yes-i-really-mean-it"), "{e}");
    c.cli(&["fs", "add_data_pool", "cephfs", "fs_ec"]);
    let ls = c.cli(&["fs", "ls"]);
    assert!(
        ls.contains("name: cephfs, metadata pool: fs_meta, data pools: [fs_data fs_ec ]"),
        "{ls}"
    );
    c.cli(&["fs", "rm_data_pool", "cephfs", "fs_ec"]);
    let ls: serde_json::Value = serde_json::from_str(&c.cli(&["fs", "ls", "-f", "json"])).unwrap();
    assert_eq!(ls[0]["data_pools"], serde_json::json!(["fs_data"]));
    let health = c.cli(&["health", "detail"]);
    assert!(health.contains("MDS_ALL_DOWN"), "{health}");

    assert_eq!(
        c.connect().await.mds_beacon_interval("a").await.unwrap(),
        Duration::from_secs(1)
    );
    c.cli(&["config", "set", "mds", "mds_beacon_interval", "0.5"]);
    assert_eq!(
        c.connect().await.mds_beacon_interval("a").await.unwrap(),
        Duration::from_millis(500)
    );

    t("phase 2: the first MDS takes the file system at once");
    let a = FakeMds::start(&c, "a", 6801).await;
    wait_until("mds a active", Duration::from_secs(20), || {
        active_of(&c).is_some_and(|(n, s, _)| n == "a" && s == "up:active")
    })
    .await;
    let b = FakeMds::start(&c, "b", 6802).await;
    wait_until("mds b standby", Duration::from_secs(20), || {
        b.last() == Some(MdsAssignment::Standby)
    })
    .await;
    let (_, _, inc_a) = active_of(&c).unwrap();
    let stat = c.cli(&["mds", "stat"]);
    assert!(
        stat.contains("cephfs:1 {0=a=up:active} 1 up:standby"),
        "{stat}"
    );
    let status = c.cli(&["status"]);
    assert!(
        status.contains("mds: cephfs:1 {0=a=up:active} 1 up:standby"),
        "{status}"
    );
    let fs_status = c.cli(&["fs", "status", "cephfs"]);
    assert!(
        fs_status.contains("fs_meta") && fs_status.contains("STANDBY MDS"),
        "{fs_status}"
    );
    let old_instance = a.rados.instance();

    t("phase 3: the active MDS goes silent; the standby takes over");
    a.task.abort();
    let stopped = Instant::now();
    let took = wait_until(
        "mds b active with a newer incarnation",
        Duration::from_secs(grace + 10),
        || active_of(&c).is_some_and(|(n, _, i)| n == "b" && i > inc_a),
    )
    .await;
    t(&format!(
        "standby promoted {:?} after the beacons stopped",
        stopped.elapsed()
    ));
    assert!(took <= Duration::from_secs(grace + 5), "took {took:?}");
    wait_until("mds b reports active", Duration::from_secs(10), || {
        active_of(&c).is_some_and(|(n, s, _)| n == "b" && s == "up:active")
    })
    .await;
    let bl = c.cli(&["osd", "blocklist", "ls"]);
    assert!(bl.contains(&old_instance), "{old_instance} not in\n{bl}");
    // The old instance is fenced from the data (once its map has the entry, its ops carry
    // an epoch the OSDs check it at)...
    if let kelp_proto::MonReply::Status(s) = a
        .rados
        .mon_command(kelp_proto::MonCommand::Status)
        .await
        .unwrap()
    {
        a.rados.wait_for_epoch(s.epoch).await.unwrap();
    }
    let io = a.rados.ioctx("fs_meta").await.unwrap();
    let w = io.write_full("late-write", &b"late"[..]).await;
    assert!(
        matches!(w, Err(kelp_client::ClientError::Blocklisted(_))),
        "{w:?}"
    );
    // ... and told to stop when it beacons its old role.
    let late = a.beacon.lock().unwrap().clone();
    assert_eq!(late.state, MdsState::Active);
    assert_eq!(
        a.rados.mds_beacon(&late).await.unwrap(),
        MdsAssignment::Stop
    );
    drop(a);

    t("phase 4: mds fail with no standby left");
    c.cli(&["mds", "fail", "b"]);
    let e = cli_err(&c, &["mds", "fail", "nobody"]);
    assert!(e.contains("'nobody' is not in the file-system map"), "{e}");
    wait_until("b told to stop", Duration::from_secs(10), || {
        b.last() == Some(MdsAssignment::Stop)
    })
    .await;
    b.task.abort();
    let health = c.cli(&["health", "detail"]);
    assert!(
        health.contains("MDS_ALL_DOWN") && health.contains("fs cephfs is offline"),
        "{health}"
    );
    let v = fs_map_json(&c);
    let last_inc = v["filesystems"][0]["last_incarnation"].as_u64().unwrap();
    assert!(last_inc >= 2);

    t("phase 5: the monitor restarts; the definitions stay");
    let dir = c.dir.display().to_string();
    let out = kelp(&["daemon", "restart", "mon.a", "--dir", &dir]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ls = {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = kelp(&["fs", "ls", "-c", &c.conf()]);
            if out.status.success() {
                break String::from_utf8_lossy(&out.stdout).into_owned();
            }
            assert!(Instant::now() < deadline, "monitor not back");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    assert!(ls.contains("name: cephfs, metadata pool: fs_meta"), "{ls}");
    let v = fs_map_json(&c);
    assert_eq!(
        v["filesystems"][0]["last_incarnation"].as_u64(),
        Some(last_inc)
    );
    // A new MDS after the restart gets the next incarnation, never a repeated one.
    let d = FakeMds::start(&c, "d", 6804).await;
    wait_until("mds d active", Duration::from_secs(30), || {
        active_of(&c).is_some_and(|(n, _, i)| n == "d" && i == last_inc + 1)
    })
    .await;

    t("phase 6: fs fail, then fs rm");
    let e = cli_err(&c, &["fs", "rm", "cephfs", "--yes-i-really-mean-it"]);
    assert!(e.contains("kelp fs fail cephfs"), "{e}");
    c.cli(&["fs", "fail", "cephfs"]);
    let bl = c.cli(&["osd", "blocklist", "ls"]);
    assert!(bl.contains(&d.rados.instance()), "{bl}");
    wait_until("d told to stop", Duration::from_secs(10), || {
        d.last() == Some(MdsAssignment::Stop)
    })
    .await;
    c.cli(&["fs", "rm", "cephfs", "--yes-i-really-mean-it"]);
    let ls = c.cli(&["fs", "ls"]);
    assert!(ls.contains("No filesystems enabled"), "{ls}");
    c.cli(&["pool", "rm", "fs_data", "--yes-i-really-mean-it"]);
}
