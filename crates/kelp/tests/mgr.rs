//! The manager on a real cluster (`kelp up --mons 3`: managers mgr.x active, mgr.y standby),
//! in one test so the cluster starts once:
//!
//! 1. `kelp up` prints the dashboard's URL; `kelp mgr services` names the active one; the
//!    standby's address redirects plain GETs to it and answers a posted login with 503 and a
//!    link (never forwarding the key); a login with the key in the URL is refused;
//! 2. the JSON API: 401 without a key or with a wrong one, 200 with an admin or a read-only
//!    key, pagination fields on lists, 403 for an admin action with a read-only key;
//! 3. headless Chromium logs in (a local page posts the login form) and opens every page (a screenshot of each is kept in the
//!    test's temp dir); the DOM shows the health and the OSD count;
//! 4. an OSD with data is killed and marked out: a recovery/backfill progress item appears
//!    (`kelp progress`, `/api/progress`) and the dashboard shows it as a progress bar; the
//!    cluster log has the OSD going down and out;
//! 5. kill -9 of the active manager: the standby takes over (`kelp mgr services` changes)
//!    within seconds and serves the API.
//!
//! Chromium (`chromium`, Debian's package) is required: the test fails naming it if missing.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use heal_support::wait;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn kelp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .output()
        .expect("run kelp")
}

struct Cluster {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    banner: String,
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
            "--mons",
            "3",
            "--osds",
            "4",
            "--osd-size",
            "1GiB",
            "--pg-num",
            "16",
            "--timeout-secs",
            "120",
            "--no-rgw",
            "--nbd-port",
            "0",
            "--dashboard-port",
            "0",
        ]);
        let c = Cluster {
            _tmp: tmp,
            dir,
            banner: String::from_utf8_lossy(&out.stdout).into_owned(),
        };
        assert!(
            out.status.success(),
            "kelp up failed:\n{}\n{}",
            c.banner,
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

    fn pid(&self, name: &str) -> i32 {
        std::fs::read_to_string(self.dir.join("run").join(format!("{name}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    fn kill9(&self, name: &str) {
        let pid = self.pid(name);
        // SAFETY: kill(2) on a daemon this test's cluster started (pid from its run/ folder).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    }

    fn dashboard(&self) -> String {
        let v: serde_json::Value =
            serde_json::from_str(&self.cli(&["mgr", "services", "--format", "json"])).unwrap();
        v["dashboard"].as_str().unwrap_or("").to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for name in ["mgr.x", "mgr.y", "mon.a"] {
                let text =
                    std::fs::read_to_string(self.dir.join("logs").join(format!("{name}.log")))
                        .unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("==== {name}");
                for l in &lines[lines.len().saturating_sub(25)..] {
                    eprintln!("{l}");
                }
            }
        }
        let _ = kelp(&["down", "--dir", &self.dir.display().to_string()]);
    }
}

struct HttpResponse {
    status: u16,
    headers: String,
    body: String,
}

/// One HTTP/1.1 request (`Connection: close`) to `url` (`http://HOST:PORT/...`).
fn http(method: &str, url: &str, bearer: Option<&str>) -> HttpResponse {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = bearer
        .map(|b| format!("Authorization: Bearer {b}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    HttpResponse {
        status,
        headers: head.to_string(),
        body: body.to_string(),
    }
}

fn json(r: &HttpResponse) -> serde_json::Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn chromium() -> &'static str {
    for c in ["chromium", "chromium-browser"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return c;
        }
    }
    panic!(
        "this test needs Chromium: `chromium` (Debian's chromium package) is not installed or \
         does not run; .ci/run installs it"
    );
}

/// Runs headless Chromium on `url` with `args`; returns stdout.
fn chrome(profile: &Path, url: &str, args: &[&str]) -> String {
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--virtual-time-budget=6000",
            "--timeout=30000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn dashboard_api_progress_log_and_failover() {
    let started = Instant::now();
    let t = |what: &str| eprintln!("[{:>6.1?}] {what}", started.elapsed());
    let browser = chromium();
    let c = Cluster::up();
    t("cluster up");
    // ---- 1. URLs
    assert!(c.banner.contains("dashboard: http://"), "{}", c.banner);
    let url = c.dashboard();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let key = std::fs::read_to_string(c.dir.join("dashboard.key")).unwrap();
    let admin = format!("admin:{}", key.trim());
    let summary = wait(
        "the active manager's first look",
        Duration::from_secs(30),
        || {
            let r = http("GET", &format!("{url}api/summary"), Some(&admin));
            (r.status == 200).then(|| json(&r))
        },
    );
    assert_eq!(summary["osds"]["total"], 4, "{summary}");
    // `kelp up` starts mgr.x first: it is the active one
    assert_eq!(summary["mgr"]["active"], "x", "{summary}");
    assert!(
        summary["health"]["status"]
            .as_str()
            .unwrap()
            .starts_with("HEALTH_")
    );
    // the standby redirects to the active dashboard
    let (standby_addr, r) = wait("the standby redirects", Duration::from_secs(20), || {
        let addr = std::fs::read_to_string(c.dir.join("mgr.y").join("addr")).ok()?;
        let r = http("GET", &format!("http://{}/api/summary", addr.trim()), None);
        (r.status == 307).then_some((addr, r))
    });
    assert!(
        r.headers.contains(&format!("{url}api/summary")),
        "{}",
        r.headers
    );
    // …but a posted login (or action) is not forwarded: 503 and a link to the active one
    let r = http(
        "POST",
        &format!("http://{}/login", standby_addr.trim()),
        None,
    );
    assert_eq!(r.status, 503, "{}", r.headers);
    assert!(
        !r.headers.to_lowercase().contains("location:"),
        "{}",
        r.headers
    );
    assert!(r.body.contains(&url), "{}", r.body);

    // what the browser fetches for the first page: the HTML, the script, the style, the data
    let load = Instant::now();
    for path in [
        "",
        "static/app.js",
        "static/style.css",
        "api/whoami",
        "api/summary",
    ] {
        let r = http("GET", &format!("{url}{path}"), Some(&admin));
        assert_eq!(r.status, 200, "{path}: {}", r.headers);
    }
    t(&format!(
        "first page's five requests answered in {:?}",
        load.elapsed()
    ));

    // ---- 2. API, keys and roles
    assert_eq!(http("GET", &format!("{url}api/summary"), None).status, 401);
    assert_eq!(
        http("GET", &format!("{url}api/osds"), Some("admin:wrong")).status,
        401
    );
    let ro: serde_json::Value = serde_json::from_str(&c.cli(&[
        "dashboard",
        "ac-user-create",
        "viewer",
        "--role",
        "read-only",
        "--format",
        "json",
    ]))
    .unwrap();
    let viewer = format!("viewer:{}", ro["key"].as_str().unwrap());
    let osds = http(
        "GET",
        &format!("{url}api/osds?page=2&per_page=3"),
        Some(&viewer),
    );
    assert_eq!(osds.status, 200, "{}", osds.body);
    let osds = json(&osds);
    assert_eq!(osds["total"], 4);
    assert_eq!(osds["pages"], 2);
    assert_eq!(osds["items"].as_array().unwrap().len(), 1, "{osds}");
    let pgs = json(&http(
        "GET",
        &format!("{url}api/pgs?per_page=5"),
        Some(&viewer),
    ));
    assert_eq!(pgs["items"].as_array().unwrap().len(), 5, "{pgs}");
    assert!(pgs["total"].as_u64().unwrap() >= 16, "{pgs}");
    for list in ["pools", "pg_states", "progress", "log", "buckets", "io"] {
        let r = http("GET", &format!("{url}api/{list}"), Some(&viewer));
        assert_eq!(r.status, 200, "{list}: {}", r.body);
        assert!(json(&r)["total"].is_u64(), "{list}: {}", r.body);
    }
    for action in ["osd/0/deep-scrub", "osd/0/out"] {
        let r = http("POST", &format!("{url}api/{action}"), Some(&viewer));
        assert_eq!(r.status, 403, "{action}: {}", r.body);
        assert_eq!(
            http("POST", &format!("{url}api/{action}"), None).status,
            401
        );
    }
    let r = http("POST", &format!("{url}api/osd/0/deep-scrub"), Some(&admin));
    assert_eq!(r.status, 200, "{}", r.body);
    let users = c.cli(&["dashboard", "ac-user-ls"]);
    assert!(
        users.contains("admin admin") && users.contains("viewer read-only"),
        "{users}"
    );
    t("API checked");

    // ---- 3. the pages in headless Chromium
    let shots = c.dir.parent().unwrap().join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let profile = c.dir.parent().unwrap().join("chromium-profile");
    // Logging in is POST only: each visit starts from a local page whose form posts the name
    // and key to /login, which answers with the cookie and sends the browser on to `next`.
    let login = |next: &str| {
        let page = shots
            .parent()
            .unwrap()
            .join(format!("login-{}.html", encode(next).replace('%', "_")));
        std::fs::write(
            &page,
            format!(
                "<!doctype html><form id=\"f\" method=\"post\" action=\"{url}login\">\
                 <input name=\"user\" value=\"admin\"><input name=\"key\" value=\"{}\">\
                 <input name=\"next\" value=\"{next}\"></form>\
                 <script>document.getElementById('f').submit()</script>",
                key.trim()
            ),
        )
        .unwrap();
        format!("file://{}", page.display())
    };
    // a key in a URL is refused
    let r = http(
        "GET",
        &format!("{url}login?user=admin&key={}", encode(key.trim())),
        None,
    );
    assert_eq!(r.status, 405, "{}", r.headers);
    assert!(!r.headers.contains("kelp_dashboard="), "{}", r.headers);
    let first = Instant::now();
    let dom = chrome(&profile, &login("/"), &["--dump-dom"]);
    t(&format!(
        "overview rendered by {browser} in {:?}",
        first.elapsed()
    ));
    assert!(
        dom.contains("id=\"health-status\""),
        "no health in the DOM:\n{dom}"
    );
    assert!(dom.contains("HEALTH_"), "{dom}");
    assert!(
        dom.contains("<span id=\"osd-count\">4</span>"),
        "no OSD count 4:\n{dom}"
    );
    let dom = chrome(&profile, &login("/osds"), &["--dump-dom"]);
    assert!(dom.contains("osd.3") && dom.contains("mark out"), "{dom}");
    for page in [
        "/",
        "/health",
        "/osds",
        "/pools",
        "/pgs",
        "/io",
        "/buckets",
        "/progress",
        "/log",
    ] {
        let name = if page == "/" { "overview" } else { &page[1..] };
        let png = shots.join(format!("{name}.png"));
        chrome(
            &profile,
            &login(page),
            &[
                &format!("--screenshot={}", png.display()),
                "--window-size=1280,900",
            ],
        );
        let len = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
        assert!(len > 1000, "no screenshot of {page} ({len} bytes)");
    }
    t(&format!("screenshots in {}", shots.display()));
    // without logging in, a page sends the browser to the login form
    let dom = chrome(
        &profile.with_extension("anon"),
        &format!("{url}osds"),
        &["--dump-dom"],
    );
    assert!(dom.contains("name=\"key\""), "{dom}");

    // ---- 4. recovery progress: data on every OSD, osd.3 killed and marked out
    let rados_out = c.cli(&[
        "rados",
        "-p",
        "data",
        "bench",
        "4",
        "write",
        "--no-cleanup",
        "-b",
        "64KiB",
    ]);
    t(&format!(
        "wrote objects: {}",
        rados_out.lines().last().unwrap_or("")
    ));
    c.kill9("osd.3");
    wait("osd.3 marked down", Duration::from_secs(60), || {
        let v: serde_json::Value =
            serde_json::from_str(&c.cli(&["osd", "ls", "--format", "json"])).ok()?;
        v["osds"]
            .as_array()?
            .iter()
            .any(|o| o["id"] == 3 && o["status"] == "down")
            .then_some(())
    });
    c.cli(&["osd", "out", "3"]);
    t("osd.3 down and out");
    let item = wait("a recovery progress item", Duration::from_secs(60), || {
        let v: serde_json::Value =
            serde_json::from_str(&c.cli(&["progress", "--format", "json"])).ok()?;
        v.as_array()?
            .iter()
            .find(|i| i["kind"] == "recovery" || i["kind"] == "backfill")
            .cloned()
    });
    t(&format!("progress item: {item}"));
    let dom = chrome(&profile, &login("/progress"), &["--dump-dom"]);
    assert!(
        dom.contains("role=\"progressbar\""),
        "no progress bar:\n{dom}"
    );
    assert!(
        dom.contains("data-kind=\"recovery\"") || dom.contains("data-kind=\"backfill\""),
        "{dom}"
    );
    chrome(
        &profile,
        &login("/progress"),
        &[
            &format!(
                "--screenshot={}",
                shots.join("progress-recovery.png").display()
            ),
            "--window-size=1280,900",
        ],
    );
    let log = wait(
        "osd.3 down and out in the cluster log",
        Duration::from_secs(20),
        || {
            let log = c.cli(&["log", "last", "200"]);
            (log.contains("osd.3 marked down") && log.contains("osd.3 marked out")).then_some(log)
        },
    );
    assert!(log.contains("is now the leader"), "{log}");
    assert!(log.contains("[WRN]"), "{log}");

    // ---- 5. failover
    // measured before: the active manager's memory on this cluster
    let rss = std::fs::read_to_string(format!("/proc/{}/status", c.pid("mgr.x")))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or("")
        .to_string();
    t(&format!("mgr.x {rss}"));
    c.kill9("mgr.x");
    let killed = Instant::now();
    let new_url = wait("the standby takes over", Duration::from_secs(20), || {
        let u = c.dashboard();
        (!u.is_empty() && u != url).then_some(u)
    });
    t(&format!(
        "mgr.y active after {:?}: {new_url}",
        killed.elapsed()
    ));
    assert!(
        new_url.contains(standby_addr.trim()),
        "{new_url} vs {standby_addr}"
    );
    let s = wait(
        "the new active manager serves",
        Duration::from_secs(20),
        || {
            let r = http("GET", &format!("{new_url}api/summary"), Some(&viewer));
            (r.status == 200).then(|| json(&r))
        },
    );
    assert_eq!(s["mgr"]["active"], "y", "{s}");
    let log = wait(
        "the failover in the cluster log",
        Duration::from_secs(20),
        || {
            let log = c.cli(&["log", "last", "50"]);
            log.contains("replacing it with standby daemon y")
                .then_some(log)
        },
    );
    assert!(log.contains("Manager daemon x is unresponsive"), "{log}");
    t("done");
}
