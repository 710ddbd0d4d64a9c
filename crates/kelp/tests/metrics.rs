//! Metrics: every daemon of a real `kelp up --detach` cluster (monitor, three OSDs, the S3
//! gateway, the NBD server) serves `/metrics` that `promtool check metrics` accepts; the
//! service map (`kelp daemon ls -f json`) names them all with their URLs; a real Prometheus
//! (file_sd targets generated from `kelp daemon ls`) scrapes them, and after a known workload
//! PromQL answers the expected counts; a metrics request answers while OSDs are busy; every
//! PromQL expression of the Grafana dashboard parses and returns data. Without a cluster: the
//! alert rules pass `promtool test rules`, cover every health check, and docs/METRICS.md
//! matches the metric tables.
//!
//! Needs Debian's `prometheus` package (`prometheus`, `promtool`; .ci/run installs it): a
//! missing tool fails the test with its name, never skips it.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn kelp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .output()
        .expect("run kelp")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The path of `tool`, or a failure naming it and where it comes from.
fn need(tool: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(tool))
            .find(|f| f.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("`{tool}` is not installed: this test needs Debian's `prometheus` package (apt-get install prometheus; .ci/run installs it)")
    })
}

/// `GET url` (plain http://HOST:PORT/PATH) with a deadline; `(status, body)`.
fn http_get(url: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let addr: std::net::SocketAddr = host.parse().expect("IP:PORT");
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    // the endpoint answers with Content-Length (no chunking)
    Ok((status, body.to_string()))
}

fn url_encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

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
            "--osds",
            "3",
            "--osd-size",
            "1GiB",
            "--pg-num",
            "16",
            "--timeout-secs",
            "120",
            "--rgw-port",
            "0",
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

    fn cli(&self, args: &[&str]) -> String {
        let conf = self.dir.join("kelp.conf").display().to_string();
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

    fn daemons(&self) -> Vec<serde_json::Value> {
        serde_json::from_str(&self.cli(&["daemon", "ls", "-f", "json"])).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = kelp(&["down", "--dir", &self.dir.display().to_string()]);
    }
}

/// A Prometheus server in a temporary directory, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// file_sd targets from `kelp daemon ls -f json` (docs/METRICS.md shows the same with jq).
fn file_sd(daemons: &[serde_json::Value]) -> serde_json::Value {
    let targets: Vec<serde_json::Value> = daemons
        .iter()
        .filter_map(|d| {
            let url = d["metrics_url"].as_str()?;
            let rest = url.strip_prefix("http://")?;
            let (hostport, path) = rest.split_once('/')?;
            Some(serde_json::json!({
                "targets": [hostport],
                "labels": {
                    "__metrics_path__": format!("/{path}"),
                    "daemon": d["name"],
                    "kind": d["kind"],
                },
            }))
        })
        .collect();
    serde_json::Value::Array(targets)
}

impl Prometheus {
    fn start(daemons: &[serde_json::Value]) -> Prometheus {
        let bin = need("prometheus");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("targets.json"),
            serde_json::to_string_pretty(&file_sd(daemons)).unwrap(),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("prometheus.yml"),
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: kelp\n    file_sd_configs:\n      - files: ['targets.json']\n        refresh_interval: 5s\n",
        )
        .unwrap();
        let port = free_port();
        let child = Command::new(bin)
            .current_dir(dir.path())
            .args([
                "--config.file=prometheus.yml",
                "--storage.tsdb.path=data",
                &format!("--web.listen-address=127.0.0.1:{port}"),
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("start prometheus");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(
            http_get(&format!("{}/-/ready", p.url), Duration::from_secs(2)),
            Ok((200, _))
        ) {
            assert!(Instant::now() < deadline, "prometheus did not get ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// An instant query: the API's `data.result` (the API must answer `success`).
    fn query(&self, q: &str) -> Vec<serde_json::Value> {
        let url = format!("{}/api/v1/query?query={}", self.url, url_encode(q));
        let (status, body) = http_get(&url, Duration::from_secs(10)).unwrap();
        assert_eq!(status, 200, "query {q}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "query {q}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The value of a query that returns one series (`None`: no series).
    fn scalar(&self, q: &str) -> Option<f64> {
        let r = self.query(q);
        r.first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok())
    }

    fn wait_for(&self, what: &str, q: &str, timeout: Duration, ok: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.scalar(q);
            if let Some(v) = v
                && ok(v)
            {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: `{q}` is {v:?} after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

fn promtool_check(body: &str, who: &str) {
    let mut child = Command::new(need("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics rejects {who}'s /metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_daemon_is_scraped_by_prometheus() {
    need("promtool");
    need("prometheus");
    let c = Cluster::up();

    // 1. the service map lists every daemon with its metrics URL
    let want = ["mon.a", "osd.0", "osd.1", "osd.2", "mgr.x"];
    let deadline = Instant::now() + Duration::from_secs(60);
    let daemons = loop {
        let d = c.daemons();
        let up = |name: &str| {
            d.iter()
                .any(|x| x["name"] == name && x["status"] == "up" && x["metrics_url"].is_string())
        };
        let kinds = |k: &str| d.iter().any(|x| x["kind"] == k && x["status"] == "up");
        if want.iter().all(|n| up(n)) && kinds("rgw") && kinds("nbd") {
            break d;
        }
        assert!(
            Instant::now() < deadline,
            "kelp daemon ls never listed every daemon: {d:#?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let plain = c.cli(&["daemon", "ls"]);
    assert!(
        plain.contains("METRICS_URL") && plain.contains("osd.2"),
        "{plain}"
    );

    // 2. every daemon's /metrics passes promtool and has its own metrics
    for d in &daemons {
        let name = d["name"].as_str().unwrap();
        let url = d["metrics_url"].as_str().unwrap();
        let (status, body) = http_get(url, Duration::from_secs(5)).unwrap();
        assert_eq!(status, 200, "{name}: {body}");
        promtool_check(&body, name);
        let expect = match d["kind"].as_str().unwrap() {
            "mon" => "kelp_cluster_pgs{",
            "osd" => "kelp_osd_op_latency_seconds_bucket{",
            "rgw" => "kelp_rgw_requests_in_flight",
            "nbd" => "kelp_nbd_connections_open",
            "mgr" => "kelp_mgr_active 1",
            "mds" => "kelp_mds_requests_in_flight",
            k => panic!("unexpected kind {k}"),
        };
        assert!(body.contains(expect), "{name} lacks {expect}:\n{body}");
        assert!(body.contains("process_resident_memory_bytes"), "{name}");
        // every daemon speaks kelp-msgr (to the monitors at least)
        assert!(
            body.contains("kelp_msgr_sent_bytes_total{peer=\"mon\"}"),
            "{name} lacks messenger statistics:\n{body}"
        );
        assert!(
            body.contains(&format!("kelp_daemon_info{{daemon=\"{name}\"")),
            "{name}"
        );
    }
    // a request to the gateway, so its per-operation series exist
    let s3 = daemons
        .iter()
        .find(|d| d["kind"] == "rgw")
        .and_then(|d| d["addrs"]["s3"].as_str())
        .unwrap()
        .to_string();
    let (status, _) = http_get(&format!("{s3}/"), Duration::from_secs(5)).unwrap();
    assert_eq!(status, 403, "anonymous ListBuckets is refused");
    let (status, _) = http_get(&format!("{s3}/somebucket"), Duration::from_secs(5)).unwrap();
    assert!(status >= 400, "anonymous ListObjects is refused");

    // 3. Prometheus scrapes them all (targets from kelp daemon ls)
    let prom = Prometheus::start(&daemons);
    let n = daemons.len() as f64;
    prom.wait_for(
        "every target scraped",
        "sum(up{job=\"kelp\"})",
        Duration::from_secs(60),
        |v| v == n,
    );

    // 4. a known workload: N objects in a new pool, counted by the monitor and the OSDs
    c.cli(&["pool", "create", "metricstest", "8"]);
    let before = prom.wait_for(
        "OSD write counters",
        "sum(kelp_osd_client_write_ops_total)",
        Duration::from_secs(30),
        |_| true,
    );
    let file = c.dir.join("obj");
    std::fs::write(&file, vec![7u8; 4096]).unwrap();
    let f = file.display().to_string();
    const N: usize = 20;
    for i in 0..N {
        c.cli(&["rados", "-p", "metricstest", "put", &format!("o{i}"), &f]);
    }
    prom.wait_for(
        "objects of the pool",
        "sum(kelp_pool_objects{pool=\"metricstest\"})",
        Duration::from_secs(60),
        |v| v == N as f64,
    );
    prom.wait_for(
        "bytes of the pool",
        "sum(kelp_pool_stored_bytes{pool=\"metricstest\"})",
        Duration::from_secs(60),
        |v| v == (N * 4096) as f64,
    );
    prom.wait_for(
        "client writes counted",
        "sum(kelp_osd_client_write_ops_total)",
        Duration::from_secs(30),
        |v| v >= before + N as f64,
    );
    prom.wait_for(
        "a write rate",
        "sum(rate(kelp_osd_op_in_bytes_total[1m]))",
        Duration::from_secs(30),
        |v| v > 0.0,
    );
    prom.wait_for(
        "health",
        "max(kelp_health_check{name=\"OSD_DOWN\"})",
        Duration::from_secs(30),
        |v| v == 0.0,
    );

    // 4b. messenger and store statistics after that workload: OSDs sent replication traffic
    // to each other, and their stores' object-record caches were used
    prom.wait_for(
        "bytes OSDs sent to OSDs",
        "sum(kelp_msgr_sent_bytes_total{kind=\"osd\",peer=\"osd\"})",
        Duration::from_secs(30),
        |v| v > (N * 4096) as f64,
    );
    prom.wait_for(
        "messages OSDs received from clients",
        "sum(kelp_msgr_received_messages_total{kind=\"osd\",peer=\"client\"})",
        Duration::from_secs(30),
        |v| v >= N as f64,
    );
    prom.wait_for(
        "open connections to the monitor",
        "sum(kelp_msgr_connections_open{kind=\"osd\",peer=\"mon\"})",
        Duration::from_secs(30),
        |v| v >= 3.0,
    );
    prom.wait_for(
        "object-record cache hits",
        "sum(kelp_osd_store_onode_cache_hits_total)",
        Duration::from_secs(30),
        |v| v > 0.0,
    );
    prom.wait_for(
        "object-record cache entries",
        "sum(kelp_osd_store_onode_cache_entries)",
        Duration::from_secs(30),
        |v| v > 0.0,
    );
    prom.wait_for(
        "free extents",
        "min(kelp_osd_store_free_extents)",
        Duration::from_secs(30),
        |v| v >= 1.0,
    );

    // 4c. S3: a bucket's stored bytes and objects, counted in the background by the gateway
    let sizes = [1000usize, 2000, 3000];
    s3_put(&c.dir, "usagetest", &sizes);
    prom.wait_for(
        "stored bytes of a bucket",
        "max(kelp_rgw_bucket_stored_bytes{bucket=\"usagetest\"})",
        Duration::from_secs(60),
        |v| v == sizes.iter().sum::<usize>() as f64,
    );
    prom.wait_for(
        "objects of a bucket",
        "max(kelp_rgw_bucket_objects{bucket=\"usagetest\"})",
        Duration::from_secs(30),
        |v| v == sizes.len() as f64,
    );

    // 4d. file system: requests to the active MDS grow with file operations on a mount
    let mds_before = prom.wait_for(
        "MDS requests",
        "sum(kelp_mds_requests_total)",
        Duration::from_secs(30),
        |_| true,
    );
    let appends_before = prom.wait_for(
        "MDS journal appends",
        "sum(kelp_mds_journal_appends_total)",
        Duration::from_secs(30),
        |_| true,
    );
    {
        let m = FuseMount::new(&c);
        for i in 0..10 {
            std::fs::create_dir(m.dir.join(format!("d{i}"))).unwrap();
            std::fs::write(m.dir.join(format!("d{i}/f")), b"hello").unwrap();
        }
        assert_eq!(std::fs::read_dir(&m.dir).unwrap().count(), 10);
    }
    prom.wait_for(
        "MDS requests after file operations",
        "sum(kelp_mds_requests_total{op=\"mkdir\"})",
        Duration::from_secs(30),
        |v| v >= 10.0,
    );
    prom.wait_for(
        "MDS requests grow",
        "sum(kelp_mds_requests_total)",
        Duration::from_secs(30),
        |v| v >= mds_before + 30.0,
    );
    // (one append carries the entries of every change made while the previous one was in
    // flight, so how many appends ~30 changes take depends on timing: 3 to 30)
    prom.wait_for(
        "MDS journal appends grow",
        "sum(kelp_mds_journal_appends_total)",
        Duration::from_secs(30),
        |v| v > appends_before,
    );
    prom.wait_for(
        "MDS request latency observed",
        "sum(kelp_mds_request_latency_seconds_count{op=\"mkdir\"})",
        Duration::from_secs(30),
        |v| v >= 10.0,
    );

    // 5. metrics answer while the OSDs are busy with writes
    let osd_urls: Vec<String> = daemons
        .iter()
        .filter(|d| d["kind"] == "osd")
        .map(|d| d["metrics_url"].as_str().unwrap().to_string())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let stop = stop.clone();
            let conf = c.dir.join("kelp.conf").display().to_string();
            let f = f.clone();
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = format!("busy{w}-{i}");
                    let _ = kelp(&["rados", "-p", "metricstest", "put", &name, &f, "-c", &conf]);
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    for round in 0..10 {
        for url in &osd_urls {
            let (status, body) = http_get(url, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("round {round}: {url} did not answer: {e}"));
            assert_eq!(status, 200);
            assert!(body.contains("kelp_osd_ops_in_flight"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }

    // 6. every expression of the Grafana dashboard parses and returns data
    std::thread::sleep(Duration::from_secs(3));
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("monitoring/grafana/kelp-cluster.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = 0;
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let e = t["expr"].as_str().unwrap();
            let r = prom.query(e);
            assert!(
                !r.is_empty(),
                "dashboard panel {:?}: `{e}` returns no data",
                p["title"]
            );
            exprs += 1;
        }
    }
    assert!(exprs >= 20, "{exprs} expressions");
}

/// Creates `bucket` and puts one object of each size in it, with boto3 and the keys `kelp up`
/// wrote to DIR/s3.env.
fn s3_put(dir: &Path, bucket: &str, sizes: &[usize]) {
    let env: Vec<(String, String)> = std::fs::read_to_string(dir.join("s3.env"))
        .expect("kelp up writes s3.env")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let sizes: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let script = "import os, sys, boto3\n\
        s3 = boto3.client('s3', endpoint_url=os.environ['AWS_ENDPOINT_URL'])\n\
        b = sys.argv[1]\n\
        s3.create_bucket(Bucket=b)\n\
        for i, n in enumerate(sys.argv[2:]):\n    \
            s3.put_object(Bucket=b, Key=f'k{i}', Body=b'x' * int(n))\n";
    let out = Command::new("python3")
        .args(["-c", script, bucket])
        .args(&sizes)
        .envs(env)
        .output()
        .expect("python3 (with boto3) runs");
    assert!(
        out.status.success(),
        "S3 puts failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kelp fs mount` of the cluster's default file system in DIR/mnt, unmounted on drop.
struct FuseMount {
    dir: PathBuf,
    child: Child,
}

fn is_mounted(dir: &Path) -> bool {
    let d = dir.display().to_string();
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(d.as_str()))
}

impl FuseMount {
    fn new(c: &Cluster) -> FuseMount {
        let dir = c.dir.join("mnt");
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(c.dir.join("mount.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kelp"))
            .args(["fs", "mount"])
            .arg(&dir)
            .args(["-c", &c.dir.join("kelp.conf").display().to_string()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kelp fs mount");
        let m = FuseMount { dir, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !is_mounted(&m.dir) {
            assert!(
                Instant::now() < deadline,
                "the mount did not appear: {}",
                std::fs::read_to_string(c.dir.join("mount.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        m
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        let _ = kelp(&["fs", "umount", &self.dir.display().to_string()]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && !matches!(self.child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if is_mounted(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
        }
    }
}

#[test]
fn alert_rules_pass_promtool() {
    let dir = repo().join("monitoring/prometheus");
    let out = Command::new(need("promtool"))
        .current_dir(&dir)
        .args(["check", "rules", "alerts.yml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(need("promtool"))
        .current_dir(&dir)
        .args(["test", "rules", "alerts_test.yml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_rules_cover_every_health_check() {
    let rules = std::fs::read_to_string(repo().join("monitoring/prometheus/alerts.yml")).unwrap();
    let tests =
        std::fs::read_to_string(repo().join("monitoring/prometheus/alerts_test.yml")).unwrap();
    for code in kelp_health::HealthCode::ALL {
        let label = format!("health_check: {}", code.as_str());
        assert!(rules.contains(&label), "alerts.yml has no rule for {code}");
        assert!(
            tests.contains(&label),
            "alerts_test.yml does not test {code}"
        );
    }
}

#[test]
fn metrics_doc_matches_the_metric_tables() {
    let out = kelp(&["metrics-doc"]);
    assert!(out.status.success());
    let generated = String::from_utf8(out.stdout).unwrap();
    let doc = std::fs::read_to_string(repo().join("docs/METRICS.md")).unwrap();
    let begin = "<!-- metrics:begin -->\n";
    let end = "<!-- metrics:end -->";
    let start = doc
        .find(begin)
        .expect("docs/METRICS.md has a metrics:begin marker")
        + begin.len();
    let stop = doc
        .find(end)
        .expect("docs/METRICS.md has a metrics:end marker");
    assert!(
        doc[start..stop] == generated,
        "docs/METRICS.md is out of date with the metric tables: regenerate the part between the \
         markers with `kelp metrics-doc` (cargo run -p kelp -- metrics-doc)"
    );
}

#[test]
fn metric_names_are_valid_and_unique() {
    let mut seen = std::collections::BTreeSet::new();
    for t in kelp_metrics_tables() {
        for m in t.metrics {
            assert!(
                m.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{}",
                m.name
            );
            // a counter gets `_total` when exported, histograms `_bucket`, `_sum`, `_count`:
            // no declared name may end with them (promtool refuses such gauges)
            for suffix in ["_total", "_count", "_sum", "_bucket"] {
                assert!(!m.name.ends_with(suffix), "{}", m.name);
            }
            assert!(seen.insert(m.name), "{} declared twice", m.name);
        }
    }
}

fn kelp_metrics_tables() -> Vec<kelp_metrics::MetricTable> {
    vec![
        kelp_metrics::COMMON_TABLE,
        kelp_metrics::MSGR_TABLE,
        kelp_mon::metrics::TABLE,
        kelp_osd::metrics::TABLE,
        kelp_rgw::metrics::TABLE,
        kelp_nbd::metrics::TABLE,
        kelp_mgr::metrics::TABLE,
        // MDS metrics
        kelp_fs::metrics::TABLE,
    ]
}

#[test]
fn gateway_top_k_default_is_the_registry_default() {
    assert_eq!(
        kelp_config::keys::METRICS_TOP_K.default.as_u64(),
        kelp_rgw::metrics::DEFAULT_TOP_K as u64
    );
}
