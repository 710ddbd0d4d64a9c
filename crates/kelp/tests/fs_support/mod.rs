//! The file-system tests' shared harness: a cluster with the pools `fs.meta`/`fs.data`, MDS
//! daemons killed on drop, and FUSE mounts unmounted on drop (also on panic: a leaked FUSE
//! mount would block later runs).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::heal_support::Cluster;

pub const KELP: &str = env!("CARGO_BIN_EXE_kelp");

/// A child daemon killed (SIGKILL) on drop.
pub struct Daemon {
    pub child: Child,
}

impl Daemon {
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A standalone MDS of the pools fs.meta / fs.data (outside the file-system map).
pub fn start_mds(c: &Cluster, id: &str) -> Daemon {
    start_mds_with(c, id, &["--meta-pool", "fs.meta", "--data-pool", "fs.data"])
}

pub fn start_mds_with(c: &Cluster, id: &str, extra: &[&str]) -> Daemon {
    let log = std::fs::File::create(c.dir.join(format!("mds.{id}.test.log"))).unwrap();
    // checkpoints every half second unless `extra` says otherwise
    let interval: &[&str] = if extra.contains(&"--checkpoint-interval") {
        &[]
    } else {
        &["--checkpoint-interval", "0.5"]
    };
    let child = Command::new(KELP)
        .args(["mds", "run", "--id", id, "-c", &c.conf()])
        .args(interval)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Daemon { child }
}

/// A FUSE mount, unmounted (and its client killed) on drop.
pub struct Mount {
    pub dir: PathBuf,
    pub child: Option<Child>,
}

pub fn mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let d = dir.display().to_string();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(d.as_str()))
}

impl Mount {
    pub fn new(c: &Cluster, name: &str) -> Mount {
        Mount::with(
            c,
            name,
            &["--meta-pool", "fs.meta", "--data-pool", "fs.data"],
        )
    }

    pub fn with(c: &Cluster, name: &str, extra: &[&str]) -> Mount {
        let dir = c.dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(c.dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new(KELP)
            .args(["fs", "mount"])
            .arg(&dir)
            .args(["-c", &c.conf()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let m = Mount {
            dir,
            child: Some(child),
        };
        let start = Instant::now();
        while !mounted(&m.dir) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "mount did not appear: {}",
                std::fs::read_to_string(c.dir.join(format!("{name}.log"))).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        m
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn sh(&self, script: &str) -> String {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{script}` failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new(KELP)
            .args(["fs", "umount"])
            .arg(&self.dir)
            .output();
        if let Some(mut c) = self.child.take() {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if mounted(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
        }
    }
}

pub fn fs_cluster() -> Cluster {
    let c = Cluster::up(3, 8);
    c.cli(&["pool", "create", "fs.meta", "--pg-num", "8"]);
    c.cli(&["pool", "create", "fs.data", "--pg-num", "16"]);
    c
}

pub fn errno_of(r: std::io::Result<impl Sized>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

pub fn active_mds(c: &Cluster) -> Option<(String, String)> {
    let v: serde_json::Value =
        serde_json::from_str(&c.cli(&["fs", "status", "--format", "json"])).unwrap();
    let a = &v["filesystems"][0]["active"];
    a.is_object().then(|| {
        (
            a["name"].as_str().unwrap().to_string(),
            a["state"].as_str().unwrap().to_string(),
        )
    })
}

pub fn wait_active(c: &Cluster, not: Option<&str>) -> String {
    let start = Instant::now();
    loop {
        if let Some((name, state)) = active_mds(c)
            && state.contains("active")
            && Some(name.as_str()) != not
        {
            return name;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no MDS became active: {:?}",
            active_mds(c)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `setxattr(path, name, value)` through Python's os module (no attr package needed).
pub fn setxattr(path: &Path, name: &str, value: &str) -> std::process::Output {
    Command::new("python3")
        .args([
            "-c",
            "import os,sys; os.setxattr(sys.argv[1], sys.argv[2], sys.argv[3].encode())",
        ])
        .arg(path)
        .args([name, value])
        .output()
        .unwrap()
}

/// `getxattr(path, name)` as text (empty when the call fails).
pub fn getxattr(path: &Path, name: &str) -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import os,sys; sys.stdout.write(os.getxattr(sys.argv[1], sys.argv[2]).decode())",
        ])
        .arg(path)
        .arg(name)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}
