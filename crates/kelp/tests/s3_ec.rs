//! S3 object data on an erasure-coded pool, end to end, and `kelp df`:
//!
//! 1. `kelp up --ec` refuses specs that are not a usable code (`4`, `0+1`, `2+0`, `x+1`) with
//!    a message that says why, before it creates anything;
//! 2. `kelp up --detach --ec 2+1 --osds 1` raises the OSDs to 3 (and says so), makes the
//!    profile `kelp-2-1` and the gateway's data pool erasure-coded from it, with the metadata
//!    and index pools replicated (`kelp pool ls detail`);
//! 3. a second gateway started with `kelp rgw --data-pool-profile kelp-2-1` serves the same
//!    data pool; gateways refuse a replicated data pool under a profile and an erasure-coded
//!    index pool, with the reason;
//! 4. boto3 through both gateways: tests/s3/ec_data_pool.py (objects of many sizes, a
//!    multipart upload, whole and ranged reads, overwrite, copy, tags, deletes) and the whole
//!    boto3 suite (tests/s3/boto3_suite.py) — every operation the gateway implements, now with
//!    the data on the erasure-coded pool, so any omap op aimed at it would fail there;
//! 5. `kelp df -f json` shows the data pool erasure-coded, holding at least the bytes of the
//!    objects left, with 1.5× that in raw bytes, and the text form in `ceph df`'s shape;
//! 6. `kelp up --ec 4+2` on this 3-OSD cluster is refused with the numbers.
//!
//! Needs python3 with boto3 (`.ci/run` installs it).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn kelp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .output()
        .expect("run kelp")
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The command's stderr, asserting that it failed.
fn refused(out: &Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} should have been refused:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The cluster and the extra gateways, stopped whatever happens.
struct Cluster {
    dir: PathBuf,
    gateways: Vec<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for g in &mut self.gateways {
            let _ = g.kill();
            let _ = g.wait();
        }
        let _ = kelp(&["down", "--dir", &self.dir.display().to_string()]);
    }
}

fn env_of(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("s3.env"))
        .expect("kelp up writes s3.env")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn wait_addr(file: &Path, gateway: &mut Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(a) = std::fs::read_to_string(file)
            && std::net::TcpStream::connect(a.trim()).is_ok()
        {
            return a.trim().to_string();
        }
        if let Some(status) = gateway.try_wait().unwrap() {
            panic!("the gateway exited ({status})");
        }
        assert!(Instant::now() < deadline, "gateway did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `kelp df -f json` on the cluster of `conf`: (the whole report, the pool named `name`).
fn df(conf: &str, name: &str) -> (serde_json::Value, serde_json::Value) {
    let v: serde_json::Value =
        serde_json::from_str(&ok(&kelp(&["df", "-f", "json", "-c", conf]), "kelp df")).unwrap();
    let pool = v["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no pool {name} in {v}"))
        .clone();
    (v, pool)
}

#[test]
fn ec_specs_that_are_no_code_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("never");
    let d = dir.display().to_string();
    for (spec, why) in [
        ("4", "is not K+M"),
        ("0+1", "K (data shards per object) must be at least 1"),
        ("2+0", "M (parity shards per object) must be at least 1"),
        ("x+1", "'x' is not a whole number"),
        ("30+3", "more than the 32 shards"),
    ] {
        let err = refused(
            &kelp(&["up", "--dir", &d, "--ec", spec, "--detach"]),
            &format!("kelp up --ec {spec}"),
        );
        assert!(
            err.contains(why) && err.contains("--ec"),
            "--ec {spec}: {err}"
        );
        assert!(!dir.exists(), "--ec {spec} created {d}");
    }
    let help = ok(&kelp(&["up", "--help"]), "kelp up --help");
    assert!(
        help.contains("--ec <K+M>") && help.contains("kelp-K-M"),
        "{help}"
    );
}

#[test]
fn s3_data_on_an_erasure_coded_pool() {
    assert!(
        Command::new("python3")
            .args(["-c", "import boto3"])
            .status()
            .is_ok_and(|s| s.success()),
        "this test needs python3 with boto3 (pip install boto3; .ci/run does it)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kelp-data");
    let d = dir.display().to_string();
    let mut c = Cluster {
        dir: dir.clone(),
        gateways: Vec::new(),
    };
    let up = kelp(&[
        "up",
        "--detach",
        "--dir",
        &d,
        "--ec",
        "2+1",
        "--osds",
        "1",
        "--osd-size",
        "2GiB",
        "--pg-num",
        "8",
        "--timeout-secs",
        "120",
        "--rgw-port",
        "0",
    ]);
    let banner = ok(&up, "kelp up --ec 2+1");
    let said = String::from_utf8_lossy(&up.stderr);
    assert!(said.contains("creating 3 OSDs instead of 1"), "{said}");
    assert!(
        banner.contains("erasure-coded 2+1") && banner.contains("kelp-2-1"),
        "{banner}"
    );
    let conf = dir.join("kelp.conf").display().to_string();
    let env = env_of(&dir);

    // the pools: data erasure-coded from the profile, the rest replicated
    let detail = ok(
        &kelp(&["pool", "ls", "detail", "-c", &conf]),
        "pool ls detail",
    );
    let line = |pool: &str| -> String {
        detail
            .lines()
            .find(|l| l.contains(&format!("'{pool}'")))
            .unwrap_or_else(|| panic!("no {pool} in {detail}"))
            .to_string()
    };
    assert!(
        line("kelp.rgw.data").contains("erasure profile kelp-2-1 k=2 m=1 size 3"),
        "{detail}"
    );
    for replicated in ["kelp.rgw.meta", "kelp.rgw.index", "data"] {
        assert!(line(replicated).contains(" replicated size "), "{detail}");
    }
    let profile = ok(
        &kelp(&[
            "osd",
            "erasure-code-profile",
            "get",
            "kelp-2-1",
            "-c",
            &conf,
        ]),
        "profile get",
    );
    assert!(
        profile.contains("crush-failure-domain=osd") && profile.contains("k=2"),
        "{profile}"
    );

    // a gateway told to keep data on the profile serves the same pool
    let gw2 = tmp.path().join("gw2");
    let mut second = Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(["rgw", "-c", &conf, "--port", "0", "--data"])
        .arg(&gw2)
        .args(["--data-pool-profile", "kelp-2-1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let other = format!("http://{}", wait_addr(&gw2.join("addr"), &mut second));
    c.gateways.push(second);

    // pools of the wrong kind are refused, with the reason
    let err = refused(
        &kelp(&[
            "rgw",
            "-c",
            &conf,
            "--port",
            "0",
            "--data-pool",
            "data",
            "--data-pool-profile",
            "kelp-2-1",
        ]),
        "a replicated data pool under a profile",
    );
    assert!(
        err.contains("the data pool 'data' is replicated")
            && err.contains("cannot become erasure-coded with profile 'kelp-2-1'"),
        "{err}"
    );
    let err = refused(
        &kelp(&[
            "rgw",
            "-c",
            &conf,
            "--port",
            "0",
            "--index-pool",
            "kelp.rgw.data",
        ]),
        "an erasure-coded index pool",
    );
    assert!(
        err.contains("the index pool 'kelp.rgw.data' is erasure-coded") && err.contains("omap"),
        "{err}"
    );

    // boto3, through both gateways
    let script = |name: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/s3")
            .join(name)
    };
    let out = Command::new("python3")
        .arg(script("ec_data_pool.py"))
        .envs(&env)
        .env("OTHER_ENDPOINT_URL", &other)
        .output()
        .unwrap();
    let report = ok(&out, "ec_data_pool.py");
    let live: u64 = report
        .lines()
        .find_map(|l| l.strip_prefix("live_bytes="))
        .unwrap_or_else(|| panic!("no live_bytes in {report}"))
        .parse()
        .unwrap();
    assert!(live > 20 << 20, "{live}");
    let out = Command::new("python3")
        .arg(script("boto3_suite.py"))
        .envs(&env)
        .env("OTHER_ENDPOINT_URL", &other)
        .output()
        .unwrap();
    ok(&out, "boto3 suite on an erasure-coded data pool");

    // kelp df: the data pool holds the objects' bytes, at 1.5× raw (the OSDs report every few
    // seconds: wait for the counts to catch up)
    let deadline = Instant::now() + Duration::from_secs(60);
    let (all, data) = loop {
        let (all, data) = df(&conf, "kelp.rgw.data");
        if data["stats"]["stored"].as_u64().unwrap() >= live || Instant::now() > deadline {
            break (all, data);
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    assert_eq!(data["type"], "erasure", "{data}");
    assert_eq!(data["erasure_code_profile"], "kelp-2-1", "{data}");
    assert_eq!((data["k"].as_u64(), data["m"].as_u64()), (Some(2), Some(1)));
    let stored = data["stats"]["stored"].as_u64().unwrap();
    let used = data["stats"]["bytes_used"].as_u64().unwrap();
    assert!(
        stored >= live,
        "stored {stored} < the {live} bytes of live objects: {data}"
    );
    assert_eq!(used, (stored as f64 * 1.5).round() as u64, "{data}");
    assert!(data["stats"]["objects"].as_u64().unwrap() > 0, "{data}");
    assert!(data["stats"]["max_avail"].as_u64().unwrap() > 0, "{data}");
    let index = all["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "kelp.rgw.index")
        .unwrap();
    assert_eq!(index["type"], "replicated", "{index}");
    assert_eq!(index["raw_ratio"].as_f64(), Some(3.0), "{index}");
    let raw = &all["stats"];
    assert!(
        raw["total_bytes"].as_u64().unwrap() > 0
            && raw["total_used_raw_bytes"].as_u64().unwrap() > used / 2,
        "{raw}"
    );
    assert_eq!(raw["num_osds"].as_u64(), Some(3), "{raw}");
    let text = ok(&kelp(&["df", "-c", &conf]), "kelp df");
    assert!(
        text.contains("--- RAW STORAGE ---") && text.contains("--- POOLS ---"),
        "{text}"
    );
    let data_line = text
        .lines()
        .find(|l| l.starts_with("kelp.rgw.data "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(data_line.contains("erasure 2+1"), "{text}");

    // more shards than this cluster has OSDs: refused with the numbers, nothing started
    let err = refused(
        &kelp(&["up", "--detach", "--dir", &d, "--ec", "4+2"]),
        "kelp up --ec 4+2 on 3 OSDs",
    );
    assert!(
        err.contains("--ec 4+2 needs 6 OSDs") && err.contains("has 3"),
        "{err}"
    );
    let _ = &mut c;
}
