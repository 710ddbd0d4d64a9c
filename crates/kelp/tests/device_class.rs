//! Device classes on a running cluster: `kelp osd crush set-device-class` / `rm-device-class`,
//! an OSD reporting its class at boot (`kelp osd run --device-class`), `kelp osd crush rule
//! create-replicated` with its refusals, and `kelp up` putting the file system's metadata pool
//! on the fastest class present, whose PGs then map only to that class's OSDs.

#![allow(clippy::unwrap_used)]

mod heal_support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use heal_support::*;

fn classes(c: &Cluster) -> Vec<(i64, Option<String>)> {
    let v: serde_json::Value =
        serde_json::from_str(&c.cli(&["--format", "json", "osd", "ls"])).unwrap();
    v["osds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["id"].as_i64().unwrap(),
                o["device_class"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn refused(c: &Cluster, args: &[&str], why: &str) {
    let mut all = args.to_vec();
    let conf = c.conf();
    all.extend(["-c", conf.as_str()]);
    let out = kelp(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "`kelp {}` was accepted",
        args.join(" ")
    );
    assert!(err.contains(why), "`kelp {}`: {err}", args.join(" "));
}

#[test]
fn metadata_pool_goes_to_the_fastest_device_class() {
    let c = Cluster::up(4, 8);
    // whatever the OSDs found at boot (a real disk under the test directory has a class)
    c.cli(&["osd", "crush", "rm-device-class", "0", "1", "2", "3"]);
    assert!(classes(&c).iter().all(|(_, k)| k.is_none()));
    c.cli(&["osd", "crush", "set-device-class", "hdd", "0"]);
    c.cli(&["osd", "crush", "set-device-class", "nvme", "osd.2", "3"]);
    refused(
        &c,
        &["osd", "crush", "set-device-class", "ssd", "0"],
        "rm-device-class 0",
    );
    refused(
        &c,
        &["osd", "crush", "set-device-class", "ssd", "9"],
        "osd.9 does not exist",
    );

    // osd.1 reports its class when it boots
    c.sigkill("osd.1");
    let dir = c.dir.display().to_string();
    let log = std::fs::File::create(c.dir.join("logs").join("osd.1.restart.log")).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(["osd", "run", "--id", "1", "--data", &format!("{dir}/osd.1")])
        .args([
            "-c",
            &c.conf(),
            "--host",
            "localhost",
            "--device-class",
            "nvme",
        ])
        .args(["--pid-file", &format!("{dir}/run/osd.1.pid")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn();
    // the cluster's `kelp down` stops it through its pid file
    drop(status.unwrap());
    let start = Instant::now();
    loop {
        let now = classes(&c);
        if now
            == vec![
                (0, Some("hdd".into())),
                (1, Some("nvme".into())),
                (2, Some("nvme".into())),
                (3, Some("nvme".into())),
            ]
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "osd.1 did not report its class: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    refused(
        &c,
        &[
            "osd",
            "crush",
            "rule",
            "create-replicated",
            "r",
            "nowhere",
            "osd",
        ],
        "'nowhere' is not a bucket",
    );
    refused(
        &c,
        &[
            "osd",
            "crush",
            "rule",
            "create-replicated",
            "r",
            "default",
            "shelf",
        ],
        "'shelf' is not a CRUSH type",
    );
    refused(
        &c,
        &[
            "osd",
            "crush",
            "rule",
            "create-replicated",
            "r",
            "default",
            "osd",
            "ssd",
        ],
        "no OSD of device class 'ssd'",
    );

    // `kelp up` on the running cluster makes the file system it was started without
    let out = kelp(&[
        "up",
        "--detach",
        "--dir",
        &dir,
        "--timeout-secs",
        "90",
        "--no-rgw",
        "--nbd-port",
        "0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kelp up: {err}");
    assert!(
        err.contains("metadata pool 'fs.meta': on device class nvme (CRUSH rule replicated_nvme)"),
        "{err}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let rados = c.connect().await;
        let map = rados.osd_map();
        let meta = map.pool_by_name("fs.meta").unwrap();
        assert_eq!(
            map.crush.rule(meta.crush_rule).unwrap().name,
            "replicated_nvme"
        );
        let data = map.pool_by_name("fs.data").unwrap();
        let mut data_osds = std::collections::BTreeSet::new();
        for pg in map.pool_pgs(data.id).unwrap() {
            data_osds.extend(map.pg_mapping(pg).unwrap().up_osds());
        }
        assert!(data_osds.contains(&0), "the data pool uses every OSD");
        for pg in map.pool_pgs(meta.id).unwrap() {
            let mut up: Vec<i32> = map.pg_mapping(pg).unwrap().up_osds().collect();
            up.sort_unstable();
            assert_eq!(up, vec![1, 2, 3], "pg {pg} of fs.meta");
        }
    });
}
