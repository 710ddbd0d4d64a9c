//! The S3 gateway on a real cluster: `kelp up --detach` (which starts `kelp rgw` and writes
//! DIR/s3.env), a second gateway on the same cluster, then real clients: the boto3 suite in
//! tests/s3/boto3_suite.py (every operation and error code the gateway implements, across both
//! gateways), tests/s3/acl_cors_post.py (canned ACLs as anonymous clients and another user see
//! them, CORS preflights, browser POST uploads and their policy errors), tests/s3/refusals.py
//! (requests for features the gateway does not implement are refused with AWS's code and store
//! nothing; default client checksums are verified), the `aws` CLI syncing a
//! directory tree up and down byte for byte, `kelp s3 bench`, and the `kelp s3` admin commands. Needs python3 with boto3 and awscli (`.ci/run` installs
//! them); bounded to a few minutes.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn kelp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .output()
        .expect("run kelp")
}

fn ok(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kelp s3 bucket stats --bucket BUCKET --format json` on the cluster of `conf`.
fn bucket_stats(conf: &str, bucket: &str) -> serde_json::Value {
    let args = [
        "s3", "bucket", "stats", "--bucket", bucket, "--format", "json", "-c", conf,
    ];
    serde_json::from_str(&ok(&kelp(&args), "bucket stats")).unwrap()
}

/// Runs `kelp s3 bench ARGS --format json` with `env` (keys, endpoint) and returns its report.
fn s3_bench(env: &BTreeMap<String, String>, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(["s3", "bench"])
        .args(args)
        .args(["--format", "json"])
        .envs(env)
        .output()
        .unwrap();
    serde_json::from_str(&ok(&out, &format!("kelp s3 bench {args:?}"))).unwrap()
}

/// The cluster (and a second gateway), stopped and removed whatever happens.
struct Cluster {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    second: Option<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.second.take() {
            let _ = c.kill();
            let _ = c.wait();
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

fn wait_addr(file: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(a) = std::fs::read_to_string(file)
            && std::net::TcpStream::connect(a.trim()).is_ok()
        {
            return a.trim().to_string();
        }
        assert!(Instant::now() < deadline, "gateway did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Creates a bucket with boto3 (the gateway in `env`).
/// Starts a gateway of the cluster `conf` on a free port, writing its address to
/// `data/addr` (see [`wait_addr`]); `extra` adds options.
fn spawn_gateway(conf: &str, data: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(["rgw", "-c", conf, "--port", "0", "--data"])
        .arg(data)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn aws_like_mb(env: &BTreeMap<String, String>, bucket: &str) {
    let out = Command::new("python3")
        .args([
            "-c",
            &format!(
                "import boto3; boto3.client('s3', region_name='us-east-1').create_bucket(Bucket='{bucket}')"
            ),
        ])
        .envs(env)
        .output()
        .unwrap();
    ok(&out, "create bucket");
}

fn have(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn s3_gateway_with_real_clients() {
    assert!(
        have("python3", &["-c", "import boto3"]) && have("python3", &["-m", "awscli", "--version"]),
        "the S3 tests need python3 and the aws CLI (pip install boto3 awscli; .ci/run does it)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kelp-data");
    let d = dir.display().to_string();
    let mut c = Cluster {
        _tmp: tmp,
        dir: dir.clone(),
        second: None,
    };
    ok(
        &kelp(&[
            "up",
            "--detach",
            "--dir",
            &d,
            // room for what the gateway-kill load writes in its 6 s on a fast machine (3
            // uploaders of 3-9 MiB objects filled 1 GiB OSDs)
            "--osd-size",
            "4GiB",
            "--pg-num",
            "8",
            "--timeout-secs",
            "90",
            "--nbd-port",
            "0",
            "--rgw-port",
            "0",
        ]),
        "kelp up",
    );
    let env = env_of(&dir);
    let conf = dir.join("kelp.conf").display().to_string();

    // a second gateway on the same cluster
    let gw2 = c._tmp.path().join("gw2");
    c.second = Some(spawn_gateway(&conf, &gw2, &[]));
    let other = format!("http://{}", wait_addr(&gw2.join("addr")));

    // boto3: every operation, error codes, both gateways
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/boto3_suite.py");
    let out = Command::new("python3")
        .arg(&suite)
        .envs(&env)
        .env("OTHER_ENDPOINT_URL", &other)
        .output()
        .unwrap();
    ok(&out, "boto3 suite");

    // versioning and lifecycle (the worker run by hand with a one-second lifecycle day)
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/versioning_suite.py");
    let out = Command::new("python3")
        .arg(&suite)
        .envs(&env)
        .env("KELP_BIN", env!("CARGO_BIN_EXE_kelp"))
        .env("KELP_CONF", &conf)
        .output()
        .unwrap();
    ok(&out, "versioning suite");

    // canned ACLs (anonymous and another user of the cluster), CORS, browser POST uploads
    let bob: serde_json::Value = serde_json::from_str(&ok(
        &kelp(&[
            "s3", "user", "create", "--uid", "bob", "--format", "json", "-c", &conf,
        ]),
        "user create bob",
    ))
    .unwrap();
    // a suite script run with the default user's environment and bob's keys as the other user
    let suite = |script: &str| {
        Command::new("python3")
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/s3")
                    .join(script),
            )
            .envs(&env)
            .env(
                "OTHER_ACCESS_KEY_ID",
                bob["keys"][0]["access_key"].as_str().unwrap(),
            )
            .env(
                "OTHER_SECRET_ACCESS_KEY",
                bob["keys"][0]["secret_key"].as_str().unwrap(),
            )
            .output()
            .unwrap()
    };
    let out = suite("acl_cors_post.py");
    ok(&out, "ACL / CORS / POST suite");

    // what the gateway does not do is refused with AWS's code and stores nothing; default
    // client checksums are verified, wrong ones refused
    let out = suite("refusals.py");
    ok(&out, "refusals");

    // a gateway killed (SIGKILL) mid-upload loses nothing it acknowledged
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/kill_load.py");
    let acked = c._tmp.path().join("acked.json");
    aws_like_mb(&env, "victim");
    let load = Command::new("python3")
        .arg(&script)
        .arg("load")
        .envs(&env)
        .env("ENDPOINT", &other)
        .env("BUCKET", "victim")
        .env("ACKED", &acked)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(6));
    if let Some(mut gw) = c.second.take() {
        gw.kill().unwrap(); // SIGKILL
        gw.wait().unwrap();
    }
    ok(
        &load.wait_with_output().unwrap(),
        "uploads until the gateway died",
    );
    let out = Command::new("python3")
        .arg(&script)
        .arg("verify")
        .envs(&env)
        .env("ENDPOINT", &env["AWS_ENDPOINT_URL"])
        .env("BUCKET", "victim")
        .env("ACKED", &acked)
        .output()
        .unwrap();
    ok(&out, "verifying through the surviving gateway");
    // what the dead gateway left half-written is found and collected
    let gc = kelp(&[
        "s3",
        "gc",
        "run",
        "-c",
        &conf,
        "--pending-grace-secs",
        "0",
        "--gc-min-wait-secs",
        "0",
    ]);
    let said = String::from_utf8_lossy(&gc.stderr).to_string();
    ok(&gc, "gc run");
    assert!(
        !said.contains(" 0 abandoned"),
        "no abandoned upload was collected: {said}"
    );

    // the aws CLI: a tree up and down, byte for byte (large files go multipart)
    let src = c._tmp.path().join("tree");
    let mut files = BTreeMap::new();
    for (i, size) in [0usize, 1, 4096, 100_000, 9_000_000, 20_000_000]
        .iter()
        .enumerate()
    {
        let rel = format!("d{}/sub/file-{i}.bin", i % 2);
        let p = src.join(&rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let data: Vec<u8> = (0..*size).map(|j| (j * 31 + i * 7) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        files.insert(rel, data);
    }
    let aws = |args: &[&str]| {
        // `python3 -m awscli`: the `aws` script may not be on PATH (pyenv shims) right after
        // `pip install awscli`
        let out = Command::new("python3")
            .args(["-m", "awscli"])
            .args(args)
            .envs(&env)
            .output()
            .unwrap();
        ok(&out, &format!("aws {args:?}"))
    };
    aws(&["s3", "mb", "s3://synced"]);
    aws(&[
        "s3",
        "sync",
        "--only-show-errors",
        &src.display().to_string(),
        "s3://synced/tree",
    ]);
    let back = c._tmp.path().join("back");
    aws(&[
        "s3",
        "sync",
        "--only-show-errors",
        "s3://synced/tree",
        &back.display().to_string(),
    ]);
    for (rel, data) in &files {
        let got = std::fs::read(back.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(got == *data, "{rel} differs after the round trip");
    }
    let listing = aws(&["s3", "ls", "--recursive", "s3://synced/"]);
    assert_eq!(listing.lines().count(), files.len(), "{listing}");

    // kelp s3 bench against the gateway
    let report = s3_bench(
        &env,
        &[
            "put",
            "--bucket",
            "bench",
            "--size",
            "64KiB",
            "--concurrency",
            "4",
            "--duration",
            "2s",
        ],
    );
    assert!(report["ops"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["errors"].as_u64(), Some(0), "{report}");

    // admin: users, keys, buckets
    let admin = |args: &[&str]| {
        let mut all = vec!["s3"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-c", &conf]);
        kelp(&all)
    };
    let users = ok(&admin(&["user", "ls"]), "user ls");
    assert!(users.lines().any(|l| l == "kelp"), "{users}");
    ok(
        &admin(&[
            "user",
            "create",
            "--uid",
            "alice",
            "--display-name",
            "Alice",
        ]),
        "user create",
    );
    let dup = admin(&["user", "create", "--uid", "alice"]);
    assert!(!dup.status.success());
    assert!(String::from_utf8_lossy(&dup.stderr).contains("already exists"));
    let stats = bucket_stats(&conf, "synced");
    assert_eq!(
        stats["num_objects"].as_u64(),
        Some(files.len() as u64),
        "{stats}"
    );
    let refused = admin(&["bucket", "rm", "--bucket", "synced"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not empty"));
    ok(
        &admin(&["bucket", "rm", "--bucket", "synced", "--purge-objects"]),
        "bucket rm",
    );
    let buckets = ok(&admin(&["bucket", "ls"]), "bucket ls");
    assert!(!buckets.contains("synced"), "{buckets}");
    ok(&admin(&["gc", "run"]), "gc run");

    // resharding while clients write and list (nothing lost, nothing listed twice)
    ok(
        &admin(&[
            "bucket",
            "create",
            "--bucket",
            "growing",
            "--uid",
            "kelp",
            "--num-shards",
            "2",
        ]),
        "bucket create",
    );
    let load = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/reshard_load.py"))
        .envs(&env)
        .env("BUCKET", "growing")
        .env("DURATION", "25")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let first = admin(&[
        "bucket",
        "reshard",
        "--bucket",
        "growing",
        "--num-shards",
        "7",
    ]);
    ok(&first, "bucket reshard");
    let said = String::from_utf8_lossy(&first.stderr).to_string();
    eprintln!("{}", said.trim());
    assert!(said.contains("to 7 shards"), "{said}");
    std::thread::sleep(Duration::from_secs(2));
    ok(
        &admin(&[
            "bucket",
            "reshard",
            "--bucket",
            "growing",
            "--num-shards",
            "3",
        ]),
        "second reshard",
    );
    let out = load.wait_with_output().unwrap();
    let report = ok(&out, "clients during resharding");
    assert!(report.contains("writes="), "{report}");
    let stats = bucket_stats(&conf, "growing");
    assert_eq!(stats["num_shards"].as_u64(), Some(3), "{stats}");
    assert_eq!(stats["generation"].as_u64(), Some(2), "{stats}");
    eprintln!("resharding under load: {}", report.trim());

    // a shard bigger than the resharder's pages (1000 entries read, 500 gathered per new
    // shard): every entry is copied once, and the old shard is emptied down to its marker
    ok(
        &admin(&[
            "bucket",
            "create",
            "--bucket",
            "paged",
            "--uid",
            "kelp",
            "--num-shards",
            "1",
        ]),
        "bucket create",
    );
    let report = s3_bench(
        &env,
        &[
            "put",
            "--bucket",
            "paged",
            "--size",
            "1KiB",
            "--count",
            "2600",
            "--concurrency",
            "16",
            "--keep",
        ],
    );
    assert_eq!(report["errors"].as_u64(), Some(0), "{report}");
    let before = bucket_stats(&conf, "paged");
    assert_eq!(before["num_objects"].as_u64(), Some(2600), "{before}");
    let out = admin(&[
        "bucket",
        "reshard",
        "--bucket",
        "paged",
        "--num-shards",
        "3",
    ]);
    ok(&out, "bucket reshard");
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(said.contains("2600 entries copied"), "{said}");
    let after = bucket_stats(&conf, "paged");
    assert_eq!(after["num_objects"].as_u64(), Some(2600), "{after}");
    assert_eq!(after["num_shards"].as_u64(), Some(3), "{after}");
    let old = format!("{}.0", after["id"].as_str().unwrap());
    let left = ok(
        &kelp(&[
            "rados",
            "-c",
            &conf,
            "-p",
            "kelp.rgw.index",
            "listomapvals",
            &old,
        ]),
        "listomapvals",
    );
    let keys: Vec<&str> = left.lines().filter(|l| !l.starts_with("  ")).collect();
    assert_eq!(keys.len(), 1, "the old shard keeps only its marker: {left}");
    let _ = &mut c;
}

/// A reshard finishes while clients keep writing to every shard without a pause: before the
/// final freeze, the resharder waited for a moment with nothing left in a shard's log, which
/// a sustained load never gave it (11 → 23 shards took 6 minutes under 16 clients, and more
/// than 10 minutes in a longer run). Here one shard takes every write of 16 `kelp s3 bench`
/// clients through one gateway and of the checking writers of reshard_load.py through another
/// (a versioned bucket: `v` entries move too), and the reshard 1 → 5 must be done while the
/// load still runs.
#[test]
fn reshard_finishes_under_sustained_writes() {
    assert!(
        have("python3", &["-c", "import boto3"]),
        "the S3 tests need python3 with boto3 (pip install boto3; .ci/run does it)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kelp-data");
    let d = dir.display().to_string();
    let mut c = Cluster {
        _tmp: tmp,
        dir: dir.clone(),
        second: None,
    };
    ok(
        &kelp(&[
            "up",
            "--detach",
            "--dir",
            &d,
            "--osd-size",
            "1GiB",
            "--pg-num",
            "8",
            "--timeout-secs",
            "90",
            "--nbd-port",
            "0",
            "--rgw-port",
            "0",
        ]),
        "kelp up",
    );
    let env = env_of(&dir);
    let conf = dir.join("kelp.conf").display().to_string();
    let gw2 = c._tmp.path().join("gw2");
    c.second = Some(spawn_gateway(&conf, &gw2, &[]));
    let other = format!("http://{}", wait_addr(&gw2.join("addr")));
    let admin = |args: &[&str]| {
        let mut all = vec!["s3"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-c", &conf]);
        kelp(&all)
    };
    ok(
        &admin(&[
            "bucket",
            "create",
            "--bucket",
            "hot",
            "--uid",
            "kelp",
            "--num-shards",
            "1",
        ]),
        "bucket create",
    );
    let out = Command::new("python3")
        .args([
            "-c",
            "import boto3; boto3.client('s3', region_name='us-east-1').put_bucket_versioning(\
             Bucket='hot', VersioningConfiguration={'Status': 'Enabled'})",
        ])
        .envs(&env)
        .output()
        .unwrap();
    ok(&out, "enable versioning");

    const LOAD_SECS: u64 = 45;
    let started = Instant::now();
    let bench = Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args([
            "s3",
            "bench",
            "put",
            "--endpoint",
            &other,
            "--bucket",
            "hot",
            "--size",
            "1KiB",
            "--concurrency",
            "16",
            "--duration",
            &format!("{LOAD_SECS}s"),
            "--keep",
            "--format",
            "json",
        ])
        .envs(&env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let checked = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/reshard_load.py"))
        .envs(&env)
        .env("BUCKET", "hot")
        .env("DURATION", LOAD_SECS.to_string())
        .env("VERSIONED", "1")
        .env("OTHERS_PREFIX", "s3bench/")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(8));
    let reshard_started = Instant::now();
    let mut reshard = Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args([
            "s3",
            "bucket",
            "reshard",
            "--bucket",
            "hot",
            "--num-shards",
            "5",
        ])
        .args(["-c", &conf])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // the load lasts LOAD_SECS: the reshard must be done with time to spare before it ends
    let deadline = started + Duration::from_secs(LOAD_SECS - 5);
    while reshard.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = reshard.kill();
            let _ = reshard.wait();
            panic!(
                "the reshard 1 -> 5 had not finished after {:.1} s of sustained writes",
                reshard_started.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = reshard_started.elapsed();
    ok(&reshard.wait_with_output().unwrap(), "bucket reshard");
    let report: serde_json::Value =
        serde_json::from_str(&ok(&bench.wait_with_output().unwrap(), "kelp s3 bench")).unwrap();
    assert_eq!(report["errors"].as_u64(), Some(0), "{report}");
    let checked = ok(&checked.wait_with_output().unwrap(), "checking writers");
    assert!(checked.contains("writes="), "{checked}");
    let stats = bucket_stats(&conf, "hot");
    assert_eq!(stats["num_shards"].as_u64(), Some(5), "{stats}");
    eprintln!(
        "reshard 1 -> 5 under {} PUT/s of kelp s3 bench plus the checking writers ({}): {:.1} s",
        report["ops_per_s"],
        checked.trim(),
        took.as_secs_f64()
    );

    // Automatic resharding counts a shard's entries past the OSD's 10 000-entry page: a
    // one-shard bucket of 10 300 objects is left alone under a threshold of 20 000 (it was
    // resharded: a full page that said "more" counted as over any threshold) and resharded
    // under 10 200.
    ok(
        &admin(&[
            "bucket",
            "create",
            "--bucket",
            "grow",
            "--uid",
            "kelp",
            "--num-shards",
            "1",
        ]),
        "bucket create",
    );
    let filled = s3_bench(
        &env,
        &[
            "put",
            "--endpoint",
            &other,
            "--bucket",
            "grow",
            "--size",
            "0",
            "--concurrency",
            "32",
            "--count",
            "10300",
            "--keep",
        ],
    );
    assert_eq!(filled["ops"].as_u64(), Some(10_300), "{filled}");
    let shards_of_grow = || -> u64 {
        let stats = bucket_stats(&conf, "grow");
        stats["num_shards"].as_u64().unwrap()
    };
    let maintainer = |threshold: &str, dir: &str| {
        spawn_gateway(
            &conf,
            &c._tmp.path().join(dir),
            &[
                "--gc-interval-secs",
                "1",
                "--reshard-max-objects-per-shard",
                threshold,
            ],
        )
    };
    let mut gw = maintainer("20000", "gw3");
    wait_addr(&c._tmp.path().join("gw3/addr"));
    std::thread::sleep(Duration::from_secs(4));
    let _ = gw.kill();
    let _ = gw.wait();
    assert_eq!(shards_of_grow(), 1, "resharded below the threshold");
    let mut gw = maintainer("10200", "gw4");
    let deadline = Instant::now() + Duration::from_secs(60);
    while shards_of_grow() == 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = gw.kill();
    let _ = gw.wait();
    assert_eq!(shards_of_grow(), 3, "not resharded above the threshold");
    let _ = &mut c;
}
