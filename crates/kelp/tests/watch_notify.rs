//! Watch/notify and fencing against a real cluster (three OSDs started with `kelp up`), in
//! phases on one cluster:
//!
//! 1. two client instances watch an object and acknowledge notifies with their own replies;
//!    a third notifies and gets both replies (on a replicated and on an erasure-coded pool);
//!    watching a missing object is `NotFound`;
//! 2. the primary OSD of the watched object is SIGKILLed: the watches move to the new primary
//!    and still receive notifies (and acknowledge them);
//! 3. with `osd_client_watch_timeout` lowered to 3 s, a watcher process (`kelp rados watch`)
//!    is SIGKILLed: a notify right after reports it timed out, and it disappears from
//!    `listwatchers` after the timeout while the live watchers, which ping, stay;
//! 4. a blocklisted instance's ops are refused with `Blocklisted` (its watch ends with a
//!    `Blocklisted` error event) while others work; `blocklist rm` lets it work again, and a
//!    timed entry expires by itself;
//! 5. the CLI: `osd blocklist add|ls|rm`, `rados listwatchers|notify` (and `rados watch`,
//!    in phase 3).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod heal_support;

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use heal_support::{Cluster, kelp, wait_until};
use kelp_client::{ClientError, IoCtx, Rados, Watch, WatchEvent};

fn t(msg: &str) {
    eprintln!("[watch_notify] {msg}");
}

/// Acknowledges every notification on `w` with `TAG:PAYLOAD` until the watch ends; returns
/// how many it acknowledged and the event that ended it.
fn answer(mut w: Watch, tag: &'static str) -> tokio::task::JoinHandle<(usize, Option<String>)> {
    tokio::spawn(async move {
        let mut n = 0;
        while let Some(ev) = w.next().await {
            match ev {
                WatchEvent::Notify(note) => {
                    let reply = format!("{tag}:{}", String::from_utf8_lossy(&note.payload));
                    if w.ack(note.id, Bytes::from(reply)).await.is_ok() {
                        n += 1;
                    }
                }
                WatchEvent::Error(e) => return (n, Some(e.to_string())),
            }
        }
        (n, None)
    })
}

/// The replies of a notify, as `(instance, reply)` sorted.
async fn notify(
    io: &IoCtx,
    obj: &str,
    msg: &str,
    timeout: Duration,
) -> (Vec<(String, String)>, Vec<String>) {
    let r = io
        .notify(obj, Bytes::from(msg.to_string()), timeout)
        .await
        .unwrap_or_else(|e| panic!("notify {obj}: {e}"));
    let mut acks: Vec<(String, String)> = r
        .acks
        .iter()
        .map(|a| {
            (
                a.watcher.instance.clone(),
                String::from_utf8_lossy(&a.reply).into_owned(),
            )
        })
        .collect();
    acks.sort();
    (acks, r.timed_out.into_iter().map(|w| w.instance).collect())
}

fn primary_of(rados: &Rados, pool: &str, obj: &str) -> i32 {
    let map = rados.osd_map();
    let pool = map.pool_by_name(pool).unwrap();
    let pg = pool.placement().object_pg(obj, None, "");
    map.pg_mapping(pg).unwrap().acting_primary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_notify_failover_expiry_and_blocklist() {
    let c = Cluster::up(3, 16);
    let a = c.connect().await;
    let b = c.connect().await;
    let n = c.connect().await;
    assert_ne!(
        a.instance(),
        b.instance(),
        "every connection is its own instance"
    );
    assert!(
        a.instance().starts_with("client.admin."),
        "{}",
        a.instance()
    );

    // ---- 1. two watchers, one notifier; replicated and erasure-coded pools.
    c.cli(&[
        "osd",
        "erasure-code-profile",
        "set",
        "ec21",
        "k=2",
        "m=1",
        "crush-failure-domain=osd",
    ]);
    c.cli(&[
        "pool",
        "create",
        "ecpool",
        "--erasure",
        "ec21",
        "--pg-num",
        "8",
    ]);
    wait_until("every client has ecpool", Duration::from_secs(30), || {
        [&a, &b, &n]
            .iter()
            .all(|r| r.osd_map().pool_by_name("ecpool").is_some())
    })
    .await;
    let (ioa, iob, ion) = (
        a.ioctx("data").await.unwrap(),
        b.ioctx("data").await.unwrap(),
        n.ioctx("data").await.unwrap(),
    );
    ioa.write_full("obj", Bytes::from_static(b"watched"))
        .await
        .unwrap();
    assert!(matches!(
        ioa.watch("missing").await,
        Err(ClientError::NotFound { .. })
    ));
    let wa = ioa.watch("obj").await.unwrap();
    let wb = iob.watch("obj").await.unwrap();
    let mut watchers: Vec<(String, u64)> = ion
        .watchers("obj")
        .await
        .unwrap()
        .into_iter()
        .map(|w| (w.instance, w.cookie))
        .collect();
    watchers.sort();
    let mut want = vec![(a.instance(), wa.cookie()), (b.instance(), wb.cookie())];
    want.sort();
    assert_eq!(watchers, want);
    let ha = answer(wa, "a");
    let hb = answer(wb, "b");
    let (acks, timed_out) = notify(&ion, "obj", "hello", Duration::from_secs(10)).await;
    let mut want = vec![
        (a.instance(), "a:hello".to_string()),
        (b.instance(), "b:hello".to_string()),
    ];
    want.sort();
    assert_eq!(acks, want);
    assert!(timed_out.is_empty(), "{timed_out:?}");
    t("notify reached both watchers, with their replies");

    let eca = a.ioctx("ecpool").await.unwrap();
    eca.write_full("ecobj", Bytes::from_static(b"coded"))
        .await
        .unwrap();
    let wec = eca.watch("ecobj").await.unwrap();
    let hec = answer(wec, "ec");
    let ecn = n.ioctx("ecpool").await.unwrap();
    let (acks, _) = notify(&ecn, "ecobj", "x", Duration::from_secs(10)).await;
    assert_eq!(acks, vec![(a.instance(), "ec:x".to_string())]);
    t("watch/notify on an erasure-coded pool");

    // ---- 2. failover: kill -9 the watched object's primary.
    let primary = primary_of(&n, "data", "obj");
    t(&format!("SIGKILL osd.{primary}, the primary of obj"));
    c.sigkill(&format!("osd.{primary}"));
    wait_until("a new primary for obj", Duration::from_secs(60), || {
        let p = primary_of(&n, "data", "obj");
        p >= 0 && p != primary
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let acks = loop {
        let last = notify(&ion, "obj", "after-failover", Duration::from_secs(3)).await;
        if last.0.len() == 2 {
            break last.0;
        }
        assert!(
            Instant::now() < deadline,
            "watchers did not come back after the failover: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(acks[0].1.split(':').nth(1), Some("after-failover"));
    t(&format!(
        "both watches answer through osd.{} now",
        primary_of(&n, "data", "obj")
    ));
    c.start(&format!("osd.{primary}"));

    // ---- 3. a dead watcher expires (timeout lowered to 3 s); live ones keep pinging.
    c.cli(&["config", "set", "osd", "osd_client_watch_timeout", "3"]);
    // OSDs re-read the central config every 5 s; the live watches learn the new timeout at
    // their next ping.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let conf = c.conf();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args([
            "rados", "-p", "data", "watch", "obj", "--reply", "cli", "-c", &conf,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    // "watching obj as INSTANCE cookie=C"
    let dead = first
        .split_whitespace()
        .nth(3)
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    t(&format!("CLI watcher {dead}"));
    let (acks, _) = notify(&ion, "obj", "three", Duration::from_secs(10)).await;
    assert!(
        acks.contains(&(dead.clone(), "cli".to_string())),
        "the CLI watcher answers: {acks:?}"
    );
    let line = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        line.starts_with("NOTIFY cookie=") && line.ends_with(": three"),
        "{line}"
    );
    assert!(line.contains(&format!("from={}", n.instance())), "{line}");
    child.kill().unwrap();
    child.wait().unwrap();
    let (acks, timed_out) = notify(&ion, "obj", "four", Duration::from_secs(1)).await;
    assert!(
        timed_out.contains(&dead),
        "the dead watcher timed out: {timed_out:?}"
    );
    assert_eq!(acks.len(), 2, "the live watchers answer: {acks:?}");
    let gone_after = wait_until(
        "the dead watcher leaves listwatchers",
        Duration::from_secs(20),
        || {
            let out = c.cli(&["rados", "-p", "data", "listwatchers", "obj"]);
            !out.contains(&dead)
        },
    )
    .await;
    t(&format!(
        "dead watcher dropped {gone_after:?} after the kill"
    ));
    // The live watchers ping at a third of the timeout: they outlive several timeouts.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (acks, timed_out) = notify(&ion, "obj", "five", Duration::from_secs(5)).await;
    assert_eq!(acks.len(), 2, "{acks:?}");
    assert!(timed_out.is_empty() && !acks.iter().any(|(i, _)| *i == dead));
    let listed = c.cli(&["rados", "-p", "data", "listwatchers", "obj"]);
    assert!(
        listed.contains(&format!("watcher={}", a.instance())),
        "{listed}"
    );
    c.cli(&["config", "rm", "osd", "osd_client_watch_timeout"]);

    // ---- 4. fencing.
    let victim = c.connect().await;
    let iov = victim.ioctx("data").await.unwrap();
    iov.write_full("v", Bytes::from_static(b"1")).await.unwrap();
    let wv = iov.watch("obj").await.unwrap();
    let hv = answer(wv, "victim");
    let epoch = n.blocklist_add(&victim.instance(), None).await.unwrap();
    t(&format!(
        "blocklisted {} at epoch {epoch}",
        victim.instance()
    ));
    let listed = n.blocklist_ls().await.unwrap();
    assert!(
        listed
            .iter()
            .any(|e| e.instance == victim.instance() && e.expires.is_none()),
        "{listed:?}"
    );
    // Every op of the fenced instance is refused, reads included; others go on.
    let wait_fenced = Instant::now() + Duration::from_secs(30);
    loop {
        match iov.write_full("v", Bytes::from_static(b"2")).await {
            Err(ClientError::Blocklisted(_)) => break,
            other => {
                // Its own map may still be older than the blocklist: the OSDs only refuse
                // once they have it, which they do before serving an op of that epoch.
                assert!(Instant::now() < wait_fenced, "write not fenced: {other:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert!(matches!(
        iov.read("v", 0, 0).await,
        Err(ClientError::Blocklisted(_))
    ));
    ion.write_full("v", Bytes::from_static(b"3")).await.unwrap();
    assert_eq!(&ion.read("v", 0, 0).await.unwrap()[..], b"3");
    let (n_acked, ended) = tokio::time::timeout(Duration::from_secs(30), hv)
        .await
        .expect("the fenced watch ends")
        .unwrap();
    assert!(
        ended.as_deref().is_some_and(|e| e.contains("blocklisted")),
        "fenced watch ended with {ended:?} after {n_acked} acks"
    );
    let (acks, _) = notify(&ion, "obj", "six", Duration::from_secs(5)).await;
    assert!(
        !acks.iter().any(|(i, _)| *i == victim.instance()),
        "{acks:?}"
    );
    n.blocklist_rm(&victim.instance()).await.unwrap();
    let wait_unfenced = Instant::now() + Duration::from_secs(30);
    loop {
        match iov.write_full("v", Bytes::from_static(b"4")).await {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    Instant::now() < wait_unfenced,
                    "still refused after rm: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let fresh = c.connect().await;
    let iof = fresh.ioctx("data").await.unwrap();
    assert_eq!(&iof.read("v", 0, 0).await.unwrap()[..], b"4");
    t("blocklist rm: the instance works again, and new ones do");
    // A timed entry expires on its own (the leader removes it).
    n.blocklist_add("client.admin.feedface", Some(Duration::from_secs(2)))
        .await
        .unwrap();
    let ls = n.blocklist_ls().await.unwrap();
    assert!(
        ls.iter()
            .any(|e| e.instance == "client.admin.feedface" && e.expires.is_some())
    );
    let mut expired = false;
    for _ in 0..100 {
        if !n
            .blocklist_ls()
            .await
            .unwrap()
            .iter()
            .any(|e| e.instance == "client.admin.feedface")
        {
            expired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(expired, "the 2 s entry did not expire within 20 s");

    // ---- 5. CLI.
    c.cli(&["osd", "blocklist", "add", "client.admin.0123", "600"]);
    c.cli(&["osd", "blocklist", "add", "client.admin.4567"]);
    let ls = c.cli(&["osd", "blocklist", "ls"]);
    assert!(
        ls.contains("client.admin.0123 20") && ls.contains("client.admin.4567 never"),
        "{ls}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&c.cli(&["osd", "blocklist", "ls", "--format", "json"])).unwrap();
    assert_eq!(json.as_array().map(Vec::len), Some(2), "{json}");
    c.cli(&["osd", "blocklist", "rm", "client.admin.0123"]);
    c.cli(&["osd", "blocklist", "rm", "client.admin.4567"]);
    assert!(!c.cli(&["osd", "blocklist", "ls"]).contains("client.admin"));
    let out = kelp(&["osd", "blocklist", "add", "two words", "-c", &conf]);
    assert!(!out.status.success(), "a bad instance name is refused");
    let notified = c.cli(&[
        "rados",
        "-p",
        "data",
        "notify",
        "obj",
        "cli-msg",
        "--timeout",
        "5",
    ]);
    assert!(
        notified.contains(&format!("reply from {} cookie=", a.instance())),
        "{notified}"
    );
    assert!(notified.contains(": a:cli-msg"), "{notified}");
    let json: serde_json::Value = serde_json::from_str(&c.cli(&[
        "rados",
        "-p",
        "data",
        "listwatchers",
        "obj",
        "--format",
        "json",
    ]))
    .unwrap();
    assert_eq!(json.as_array().map(Vec::len), Some(2), "{json}");
    t("CLI commands");

    drop((ha, hb, hec));
}
