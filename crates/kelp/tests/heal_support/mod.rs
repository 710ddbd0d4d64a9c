//! Shared harness of the healing and chaos tests: a `kelp up --detach` cluster in a temporary
//! directory, daemons signalled by the pids in its `run/` folder (only the daemons this test
//! started), and polling helpers. Dropping the cluster continues any OSD left stopped, then
//! stops every daemon and removes the directory.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kelp_client::{ClientConfig, Rados};

pub fn kelp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .output()
        .expect("run kelp")
}

pub struct Cluster {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    /// Pids this test stopped with SIGSTOP and has not continued yet.
    stopped: Mutex<BTreeSet<i32>>,
}

impl Cluster {
    pub fn up(osds: u32, pg_num: u32) -> Cluster {
        Cluster::up_sized(osds, pg_num, "1GiB")
    }

    /// [`Cluster::up`] with OSD stores of `osd_size` (`kelp up --osd-size`).
    pub fn up_sized(osds: u32, pg_num: u32, osd_size: &str) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kelp-data");
        let c = Cluster {
            _tmp: tmp,
            dir,
            stopped: Mutex::default(),
        };
        let d = c.dir.display().to_string();
        let (osds, pg_num) = (osds.to_string(), pg_num.to_string());
        let out = kelp(&[
            "up",
            "--detach",
            "--dir",
            &d,
            "--osds",
            &osds,
            "--osd-size",
            osd_size,
            "--pg-num",
            &pg_num,
            "--timeout-secs",
            "90",
            "--no-rgw",
            // the file-system tests make their own pools and MDS daemons
            "--no-fs",
            // any free port: tests run clusters side by side
            "--nbd-port",
            "0",
        ]);
        assert!(
            out.status.success(),
            "kelp up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    /// `nbd://ADDR/rbd/IMAGE` of the cluster's NBD server.
    pub fn nbd_uri(&self, image: &str) -> String {
        let addr = std::fs::read_to_string(self.dir.join("nbd.0").join("addr")).unwrap();
        format!("nbd://{}/{image}", addr.trim())
    }

    pub fn conf(&self) -> String {
        self.dir.join("kelp.conf").display().to_string()
    }

    /// Runs `kelp ARGS -c CONF` and asserts success; returns stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let conf = self.conf();
        let mut all = args.to_vec();
        all.extend(["-c", &conf]);
        let out = kelp(&all);
        assert!(
            out.status.success(),
            "kelp {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Makes the erasure-code profile `profile` (`k` + `m`, one shard per OSD).
    pub fn ec_profile(&self, profile: &str, k: u32, m: u32) {
        let (k, m) = (format!("k={k}"), format!("m={m}"));
        let set = ["osd", "erasure-code-profile", "set", profile, &k, &m];
        self.cli(&[&set[..], &["crush-failure-domain=osd"]].concat());
    }

    /// Makes the erasure-code profile `profile` (`k` + `m`, one shard per OSD) and the pool
    /// `pool` of 8 PGs on it.
    pub fn ec_pool(&self, pool: &str, profile: &str, k: u32, m: u32) {
        self.ec_profile(profile, k, m);
        self.cli(&["pool", "create", pool, "8", "--erasure", profile]);
    }

    /// Deep-scrubs PG `pgid` (`POOL.SEED` in hex) and asserts it found nothing inconsistent.
    pub fn deep_scrub_is_clean(&self, pgid: &str) {
        self.cli(&["pg", "deep-scrub", pgid, "--wait"]);
        let report = self.cli(&["pg", "list-inconsistent", pgid, "--format", "json"]);
        let report: serde_json::Value = serde_json::from_str(&report).unwrap();
        assert_eq!(
            report["inconsistents"].as_array().map(Vec::len),
            Some(0),
            "{pgid}: {report:#}"
        );
    }

    pub fn pid(&self, name: &str) -> i32 {
        std::fs::read_to_string(self.dir.join("run").join(format!("{name}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join("logs").join(format!("{name}.log")))
            .unwrap_or_default()
    }

    fn signal(&self, pid: i32, sig: i32) {
        // SAFETY: kill(2) on a daemon this test's cluster started (pid from its run/ folder).
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    pub fn sigstop(&self, name: &str) -> i32 {
        let pid = self.pid(name);
        self.stopped.lock().unwrap().insert(pid);
        self.signal(pid, libc::SIGSTOP);
        pid
    }

    pub fn sigcont(&self, name: &str) {
        let pid = self.pid(name);
        self.signal(pid, libc::SIGCONT);
        self.stopped.lock().unwrap().remove(&pid);
    }

    /// SIGKILLs a daemon and waits until it is gone.
    pub fn sigkill(&self, name: &str) {
        let pid = self.pid(name);
        self.stopped.lock().unwrap().remove(&pid);
        self.signal(pid, libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        }) {
            assert!(Instant::now() < deadline, "{name} survived SIGKILL");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kelp daemon start NAME`.
    pub fn start(&self, name: &str) {
        let out = kelp(&[
            "daemon",
            "start",
            name,
            "--dir",
            &self.dir.display().to_string(),
        ]);
        assert!(
            out.status.success(),
            "starting {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub async fn connect(&self) -> Rados {
        let mut cfg =
            ClientConfig::from_conf_file(std::path::Path::new(&self.conf()), "client.admin")
                .unwrap();
        cfg.op_timeout = Duration::from_secs(60);
        Rados::connect(cfg).await.unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Keep the evidence: the end of every daemon's log.
            if let Ok(entries) = std::fs::read_dir(self.dir.join("logs")) {
                for e in entries.flatten() {
                    let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    let tail = &lines[lines.len().saturating_sub(25)..];
                    eprintln!("==== {} (last {} lines)", e.path().display(), tail.len());
                    for l in tail {
                        eprintln!("{l}");
                    }
                }
            }
        }
        for pid in std::mem::take(&mut *self.stopped.lock().unwrap_or_else(|p| p.into_inner())) {
            // SAFETY: as in `signal`; continuing our own stopped daemon so it can stop.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
        let _ = kelp(&["down", "--dir", &self.dir.display().to_string()]);
    }
}

/// Polls `cond` every 100 ms until it holds; returns how long it took, or panics with `what`
/// after `timeout`.
pub async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether `osd` is up / in in the client's current map.
pub fn osd_state(rados: &Rados, osd: i32) -> (bool, bool) {
    let map = rados.osd_map();
    map.osds
        .get(&osd)
        .map_or((false, false), |o| (o.up, o.is_in()))
}

/// Deterministic bytes for `(seed, len)`.
pub fn content(seed: u64, len: usize) -> bytes::Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    bytes::Bytes::from(v)
}

/// Reads every object of `objects` back through `io` and asserts it is exactly the recorded
/// content.
pub async fn read_back(
    io: &kelp_client::IoCtx,
    objects: &std::collections::BTreeMap<String, bytes::Bytes>,
) {
    for (name, want) in objects {
        let got = io
            .read(name, 0, 0)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            got == *want,
            "{name}: {} bytes read do not match the {} acknowledged",
            got.len(),
            want.len()
        );
    }
}

/// Every PG reported `active+clean` by its primary (`kelp status`, from the OSDs' reports).
pub fn all_active_clean(c: &Cluster) -> bool {
    let out = kelp(&["status", "--format", "json", "-c", &c.conf()]);
    let Ok(s) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return false;
    };
    let num = s["pgmap"]["num_pgs"].as_u64().unwrap_or(0);
    let clean: u64 = s["pgmap"]["pgs_by_state"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| e["state_name"] == "active+clean")
                .filter_map(|e| e["count"].as_u64())
                .sum()
        })
        .unwrap_or(0);
    num > 0 && clean == num
}

/// Every offset of `needle` in `file`.
pub fn find_all(file: &std::path::Path, needle: &[u8]) -> Vec<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(file).unwrap();
    let mut found = Vec::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut base = 0u64;
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        let mut window = std::mem::take(&mut carry);
        let window_base = base - window.len() as u64;
        window.extend_from_slice(&buf[..n]);
        for (i, w) in window.windows(needle.len()).enumerate() {
            if w == needle {
                found.push(window_base + i as u64);
            }
        }
        carry = window[window.len().saturating_sub(needle.len() - 1)..].to_vec();
        base += n as u64;
    }
    found
}

/// The cluster's long operations, as `kelp progress --format json` lists them (empty if the
/// command's output is not a list).
pub fn progress(c: &Cluster) -> Vec<serde_json::Value> {
    serde_json::from_str::<serde_json::Value>(&c.cli(&["progress", "--format", "json"]))
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// Polls `f` every 250 ms until it gives a value; fails the test with `what` after `timeout`.
pub fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
