//! The first hour of a new user: `kelp up --detach` on a machine with little disk (a 2 GiB ext4
//! file system made and loop-mounted by the test: tmpfs has no O_DIRECT) gives a cluster that
//! takes writes the moment it returns, through RADOS and S3, with no retry by the test; the
//! global options give the same answers before and after the subcommand; a restart loses
//! nothing; and a file system too small for any cluster gets a clear refusal, not a half-made
//! cluster. Needs root (mount) and e2fsprogs; the aws CLI for the S3 write (`.ci/run`
//! installs it).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn kelp_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .current_dir(dir)
        .env_remove("KELP_CONF")
        .env_remove("KELP_CLUSTER")
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

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An ext4 file system of `mib` MiB, loop-mounted at `mnt` until dropped (the cluster in it
/// stopped first).
struct SmallFs {
    _tmp: tempfile::TempDir,
    mnt: PathBuf,
}

impl SmallFs {
    fn new(mib: u64) -> SmallFs {
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("fs.img");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        run(
            "mkfs.ext4",
            &["-q", "-F", "-m", "0", image.to_str().unwrap()],
        );
        run(
            "mount",
            &["-o", "loop", image.to_str().unwrap(), mnt.to_str().unwrap()],
        );
        SmallFs { _tmp: tmp, mnt }
    }

    fn free_mib(&self) -> u64 {
        let out = Command::new("df")
            .args(["--output=avail", "-B1M"])
            .arg(&self.mnt)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let data = self.mnt.join("kelp-data");
        if data.exists() {
            let _ = kelp_in(&self.mnt, &["down"]);
        }
        for _ in 0..20 {
            let umounted = Command::new("umount")
                .arg(&self.mnt)
                .status()
                .is_ok_and(|s| s.success());
            if umounted {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

fn body(i: usize) -> Vec<u8> {
    (0..(4 << 20) as u32)
        .map(|b| (b as usize * 31 + i * 7) as u8)
        .collect()
}

#[test]
fn up_on_a_2_gib_file_system_takes_writes_the_moment_it_returns() {
    let fs = SmallFs::new(2048);
    let dir = &fs.mnt;
    let started = Instant::now();
    let up = kelp_in(dir, &["up", "--detach"]);
    let said = String::from_utf8_lossy(&up.stderr).into_owned();
    ok(&up, "kelp up --detach");
    let took = started.elapsed();
    assert!(
        said.contains("OSD data files: 3 × ") && said.contains("free"),
        "kelp up says what size it chose and why: {said}"
    );
    // right away: healthy, every PG of every pool active+clean
    let status: serde_json::Value = serde_json::from_str(&ok(
        &kelp_in(dir, &["status", "--format", "json"]),
        "status",
    ))
    .unwrap();
    assert_eq!(status["health"]["status"], "HEALTH_OK", "{status:#}");
    let states = status["pgmap"]["pgs_by_state"].as_array().unwrap();
    assert_eq!(states.len(), 1, "{states:?}");
    assert_eq!(states[0]["state_name"], "active+clean");
    assert!(status["pgmap"]["num_pgs"].as_u64().unwrap() >= 64 + 3);

    // RADOS writes and an S3 bucket and object, no retries
    let mut written = Vec::new();
    for i in 0..40 {
        let name = format!("obj{i}");
        let path = dir.join(format!("{name}.in"));
        std::fs::write(&path, body(i)).unwrap();
        ok(
            &kelp_in(
                dir,
                &["rados", "-p", "data", "put", &name, path.to_str().unwrap()],
            ),
            "rados put",
        );
        std::fs::remove_file(&path).unwrap();
        written.push(name);
    }
    let env = std::fs::read_to_string(dir.join("kelp-data/s3.env")).unwrap();
    let vars: Vec<(String, String)> = env
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let aws = |args: &[&str]| {
        let out = Command::new("aws")
            .args(args)
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .current_dir(dir)
            .output()
            .expect("the aws CLI (pip install awscli)");
        ok(&out, &format!("aws {args:?}"))
    };
    aws(&["s3", "mb", "s3://first"]);
    std::fs::write(dir.join("hello.txt"), b"hello").unwrap();
    aws(&["s3", "cp", "hello.txt", "s3://first/hello.txt"]);
    assert!(aws(&["s3", "ls", "s3://first"]).contains("hello.txt"));

    // the same answers with the global options before or after the subcommand
    let conf = dir.join("kelp-data/kelp.conf");
    let conf = conf.to_str().unwrap();
    let elsewhere = std::env::temp_dir();
    for (before, after) in [
        (
            vec!["-c", conf, "osd", "tree"],
            vec!["osd", "tree", "-c", conf],
        ),
        (vec!["-c", conf, "health"], vec!["health", "-c", conf]),
        (
            vec!["-c", conf, "-f", "json", "pool", "ls"],
            vec!["pool", "ls", "--format", "json", "-c", conf],
        ),
    ] {
        let a = ok(&kelp_in(&elsewhere, &before), "before");
        let b = ok(&kelp_in(&elsewhere, &after), "after");
        assert_eq!(a, b, "{before:?} vs {after:?}");
        assert!(!a.is_empty());
    }
    // `kelp -c F status` and `kelp status -c F`: equal once two looks agree (rates and
    // usage move while the cluster settles after the writes)
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let a = ok(&kelp_in(&elsewhere, &["-c", conf, "status"]), "status");
        let b = ok(&kelp_in(&elsewhere, &["status", "-c", conf]), "status");
        if a == b {
            assert!(a.contains("HEALTH_OK"), "{a}");
            break;
        }
        assert!(Instant::now() < deadline, "never the same:\n{a}\n{b}");
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        fs.free_mib() > 100,
        "the cluster left the file system room: {} MiB free",
        fs.free_mib()
    );

    // a restart loses nothing
    ok(&kelp_in(dir, &["down"]), "down");
    ok(&kelp_in(dir, &["up", "--detach"]), "up again");
    for (i, name) in written.iter().enumerate() {
        let out = kelp_in(dir, &["rados", "-p", "data", "get", name, "-"]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == body(i), "{name} came back different");
    }
    assert_eq!(
        aws(&["s3", "cp", "s3://first/hello.txt", "-"]),
        "hello",
        "the S3 object after a restart"
    );
    eprintln!("kelp up on 2 GiB took {took:?}: {said}");
}

#[test]
fn up_on_a_file_system_too_small_for_any_cluster_is_refused_clearly() {
    let fs = SmallFs::new(700);
    let up = kelp_in(&fs.mnt, &["up", "--detach"]);
    let said = String::from_utf8_lossy(&up.stderr).into_owned();
    assert!(!up.status.success(), "kelp up on 700 MiB: {said}");
    assert!(
        said.contains("free") && said.contains("need about") && said.contains("--osd-size"),
        "{said}"
    );
    // nothing half-made is left: no daemon, no configuration a later `kelp up` would reopen
    let data = fs.mnt.join("kelp-data");
    assert!(!data.join("run").exists(), "daemons were started");
    assert!(
        !data.join("kelp.conf").exists(),
        "a half-made cluster was left"
    );
    // with a size that fits, the same file system takes a cluster
    let up = kelp_in(
        &fs.mnt,
        &["up", "--detach", "--osd-size", "128MiB", "--no-rgw"],
    );
    ok(&up, "kelp up --osd-size 128MiB");
    ok(
        &kelp_in(&fs.mnt, &["health", "--wait", "--timeout", "60"]),
        "health --wait",
    );
}
