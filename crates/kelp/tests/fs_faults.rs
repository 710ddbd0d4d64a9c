//! The file system under faults, on a real cluster with real MDS daemons and FUSE mounts:
//! - kill -9 of the active MDS while one mount untars a tree of thousands of files and another
//!   lists it (`ls -R`) in a loop: the standby takes over, the untar finishes, the tree is
//!   complete and every file fsync'd before the kill is intact;
//! - kill -9 of an OSD during fsync'd writes: nothing acknowledged is lost;
//! - a full cluster: writes fail with ENOSPC (not EIO, not a hang), the mount keeps answering,
//!   and once files are deleted writes work again;
//! - malformed and hostile requests sent to the MDS over kelp-msgr (and raw garbage on its
//!   port) never crash it: it answers each one and goes on serving the mount.

#![allow(clippy::unwrap_used)]

mod fs_support;
mod heal_support;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fs_support::*;
use heal_support::Cluster;

/// Writes `data` to `path` and fsyncs it; the errno of the first failure.
fn write_synced(path: &std::path::Path, data: &[u8]) -> Result<(), i32> {
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(-1);
    let mut f = std::fs::File::create(path).map_err(errno)?;
    f.write_all(data).map_err(errno)?;
    f.sync_all().map_err(errno)?;
    Ok(())
}

/// Prints the end of the MDS daemons' and the mounts' logs (kept in the cluster directory).
fn print_fs_logs(c: &Cluster) {
    let Ok(entries) = std::fs::read_dir(&c.dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.ends_with(".log") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(40)..];
        eprintln!("==== {name} (last {} lines)", tail.len());
        for l in tail {
            eprintln!("{l}");
        }
    }
}

/// A file system `kelpfs` with an active and a standby MDS (`a`, `b`, started with `extra`):
/// the daemons by name, and the active one's.
fn active_and_standby(c: &Cluster, extra: &[&str]) -> (BTreeMap<String, Daemon>, String) {
    c.cli(&["fs", "new", "kelpfs", "fs.meta", "fs.data"]);
    let mut daemons = BTreeMap::new();
    daemons.insert("a".to_string(), start_mds_with(c, "a", extra));
    daemons.insert("b".to_string(), start_mds_with(c, "b", extra));
    let first = wait_active(c, None);
    (daemons, first)
}

#[test]
fn mds_failover_during_an_untar_while_another_mount_lists() {
    let c = fs_cluster();
    let (mut daemons, first) = active_and_standby(&c, &[]);
    let a = Mount::with(&c, "mnt-a", &["--fs", "kelpfs"]);
    let b = Mount::with(&c, "mnt-b", &["--fs", "kelpfs"]);

    // the source tree: 3000 small files in 60 directories, and its tarball
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    for i in 0..3000u64 {
        let d = tree.join(format!("d{:02}", i % 60));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(format!("f{i}")),
            heal_support::content(i, (i as usize * 37) % 3000),
        )
        .unwrap();
    }
    let tarball = src.path().join("tree.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(src.path())
        .arg("-cf")
        .arg(&tarball)
        .arg("tree")
        .status()
        .unwrap();
    assert!(st.success());

    // files fsync'd before the kill
    std::fs::create_dir(a.p("synced")).unwrap();
    let mut synced = Vec::new();
    for i in 0..20u64 {
        let data = heal_support::content(1000 + i, 4096 + i as usize * 1500);
        write_synced(&a.p(&format!("synced/s{i}")), &data).unwrap();
        synced.push(data);
    }

    // mount B lists the tree in a loop
    let stop = Arc::new(AtomicBool::new(false));
    let listings = Arc::new(AtomicUsize::new(0));
    let lister = {
        let (stop, listings, dir) = (stop.clone(), listings.clone(), b.dir.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let ok = Command::new("ls")
                    .arg("-R")
                    .arg(dir.join("tree"))
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    listings.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    // mount A untars; the active MDS is killed while it runs
    let mut tar = Command::new("tar")
        .arg("-xf")
        .arg(&tarball)
        .current_dir(&a.dir)
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !a.p("tree/d05").exists() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        tar.try_wait().unwrap().is_none(),
        "the untar finished before the MDS could be killed: make the tree bigger"
    );
    daemons.get_mut(&first).unwrap().kill9();
    let killed_at = Instant::now();
    let second = wait_active(&c, Some(&first));
    eprintln!(
        "{second} active {:?} after kill -9 of {first}",
        killed_at.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = tar.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = tar.kill();
            panic!("the untar did not finish within 300 s of the failover");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !status.success() {
        print_fs_logs(&c);
    }
    assert!(status.success(), "tar failed across the failover: {status}");
    let listed_before = listings.load(Ordering::Relaxed);
    // the lister goes on working after the failover
    let t = Instant::now();
    while listings.load(Ordering::Relaxed) < listed_before + 2 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "ls -R on mount B stopped working after the failover"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    lister.join().unwrap();

    // the tree is complete on both mounts; the fsync'd files are intact
    for m in [&a, &b] {
        let diff = Command::new("diff")
            .arg("-r")
            .arg(&tree)
            .arg(m.p("tree"))
            .output()
            .unwrap();
        if !diff.status.success() {
            // the evidence: how each mount sees the tree, and the MDS and mount logs
            print_fs_logs(&c);
        }
        assert!(
            diff.status.success(),
            "the untarred tree differs on {}: {}",
            m.dir.display(),
            String::from_utf8_lossy(&diff.stdout)
                .lines()
                .take(10)
                .collect::<Vec<_>>()
                .join("\n")
        );
        for (i, data) in synced.iter().enumerate() {
            assert_eq!(
                &std::fs::read(m.p(&format!("synced/s{i}"))).unwrap(),
                data,
                "synced/s{i}"
            );
        }
    }
}

#[test]
fn osd_killed_during_writes_loses_nothing_acknowledged() {
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let m = Mount::new(&c, "mnt");
    let acked: Arc<Mutex<Vec<(String, bytes::Bytes)>>> = Arc::default();
    let failures = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, failures, stop, dir) =
            (acked.clone(), failures.clone(), stop.clone(), m.dir.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{i}");
                let data = heal_support::content(i, 50_000 + (i as usize * 7919) % 600_000);
                match write_synced(&dir.join(&name), &data) {
                    Ok(()) => acked.lock().unwrap().push((name, data)),
                    Err(e) => {
                        eprintln!("write {name}: errno {e}");
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += 1;
            }
        })
    };
    let wait_acked = |n: usize, what: &str| {
        let t = Instant::now();
        while acked.lock().unwrap().len() < n {
            assert!(
                t.elapsed() < Duration::from_secs(180),
                "{what}: only {} writes acknowledged",
                acked.lock().unwrap().len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_acked(10, "before the kill");
    c.sigkill("osd.1");
    let at_kill = acked.lock().unwrap().len();
    wait_acked(at_kill + 15, "with osd.1 dead");
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "{} writes acknowledged, {} failed",
        acked.len(),
        failures.load(Ordering::Relaxed)
    );
    for (name, data) in &acked {
        assert_eq!(
            &std::fs::read(m.p(name)).unwrap(),
            data,
            "{name} (osd.1 down)"
        );
    }
    c.start("osd.1");
    let b = Mount::new(&c, "mnt2");
    for (name, data) in &acked {
        assert_eq!(
            &std::fs::read(b.p(name)).unwrap(),
            data,
            "{name} (osd.1 back)"
        );
    }
}

/// Whether the OSD map's `full` flag is set (`kelp status`).
fn map_full(c: &Cluster) -> bool {
    let s: serde_json::Value =
        serde_json::from_str(&c.cli(&["status", "--format", "json"])).unwrap();
    s["osdmap"]["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == "full"))
}

#[test]
fn a_full_cluster_gives_enospc_and_recovers_when_space_is_freed() {
    let c = Cluster::up_sized(3, 8, "256MiB");
    c.cli(&["pool", "create", "fs.meta", "--pg-num", "8"]);
    c.cli(&["pool", "create", "fs.data", "--pg-num", "8"]);
    let mut mds = start_mds(&c, "a");
    let m = Mount::new(&c, "mnt");
    let mut written = Vec::new();
    for i in 0..4u64 {
        let name = format!("before{i}");
        let data = heal_support::content(i, 2 << 20);
        write_synced(&m.p(&name), &data).unwrap();
        written.push((name, data));
    }
    // ballast in another pool, then a full ratio below the usage: the cluster is full
    let ballast = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ballast.path(), heal_support::content(99, 4 << 20)).unwrap();
    let b = ballast.path().display().to_string();
    for i in 0..8 {
        c.cli(&["rados", "-p", "data", "put", &format!("ballast{i}"), &b]);
    }
    c.cli(&["config", "set", "global", "mon_osd_full_ratio", "0.05"]);
    let t = Instant::now();
    while !map_full(&c) {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "the full flag never came"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // writes, new files and directories: ENOSPC, never EIO
    let e = write_synced(&m.p("while-full"), &heal_support::content(7, 1 << 20)).unwrap_err();
    assert_eq!(e, libc::ENOSPC, "a write on a full cluster gave errno {e}");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("before0"))
        .unwrap();
    let e = errno_of(
        f.write_all_at(&[1u8; 65536], 8 << 20)
            .and_then(|_| f.sync_all()),
    );
    assert_eq!(
        e,
        libc::ENOSPC,
        "overwriting on a full cluster gave errno {e}"
    );
    drop(f);
    assert_eq!(
        errno_of(std::fs::create_dir(m.p("dir-while-full"))),
        libc::ENOSPC
    );
    // deletes and truncates work while full (the MDS writes its journal past the full flag),
    // so that users can free space; new data still gets ENOSPC
    std::fs::remove_file(m.p("before3")).unwrap();
    assert_eq!(errno_of(std::fs::metadata(m.p("before3"))), libc::ENOENT);
    written.retain(|(n, _)| n != "before3");
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("before2"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    for (n, data) in written.iter_mut() {
        if n == "before2" {
            data.truncate(1000);
        }
    }
    assert_eq!(std::fs::metadata(m.p("before2")).unwrap().len(), 1000);
    std::fs::create_dir(m.p("gone-soon")).unwrap_err();
    let e = write_synced(&m.p("still-full"), b"new data").unwrap_err();
    assert_eq!(
        e,
        libc::ENOSPC,
        "a new file on a full cluster gave errno {e}"
    );
    let _ = std::fs::remove_file(m.p("still-full"));
    // the MDS goes on serving: stat, list, read what was acknowledged
    assert!(
        mds.child.try_wait().unwrap().is_none(),
        "the MDS stopped on a full cluster"
    );
    assert!(std::fs::read_dir(&m.dir).unwrap().count() >= written.len());
    for (name, data) in &written {
        assert_eq!(&std::fs::read(m.p(name)).unwrap(), data, "{name}");
    }
    // free space (and the ratio back): writes work again within a bounded time
    for i in 0..8 {
        c.cli(&["rados", "-p", "data", "rm", &format!("ballast{i}")]);
    }
    c.cli(&["config", "set", "global", "mon_osd_full_ratio", "0.95"]);
    let t = Instant::now();
    loop {
        match write_synced(&m.p("after-free"), b"space again") {
            Ok(()) => break,
            Err(e) => {
                assert!(
                    t.elapsed() < Duration::from_secs(240),
                    "writes still fail (errno {e}) 240 s after space was freed"
                );
                std::thread::sleep(Duration::from_secs(2));
            }
        }
    }
    assert_eq!(std::fs::read(m.p("after-free")).unwrap(), b"space again");
    for (name, data) in &written {
        assert_eq!(&std::fs::read(m.p(name)).unwrap(), data, "{name}");
        std::fs::remove_file(m.p(name)).unwrap();
    }
    std::fs::create_dir(m.p("dir-after")).unwrap();
    assert!(mds.child.try_wait().unwrap().is_none());
}

/// The active MDS's address in the file-system map.
fn mds_addr(c: &Cluster) -> std::net::SocketAddr {
    let v: serde_json::Value =
        serde_json::from_str(&c.cli(&["fs", "status", "--format", "json"])).unwrap();
    v["filesystems"][0]["active"]["addr"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn malformed_requests_never_crash_the_mds() {
    let c = fs_cluster();
    c.cli(&["fs", "new", "kelpfs", "fs.meta", "fs.data"]);
    let mut mds = start_mds_with(&c, "a", &[]);
    wait_active(&c, None);
    let m = Mount::with(&c, "mnt", &["--fs", "kelpfs"]);
    m.sh("mkdir -p d/e && echo x > d/f && ln -s f d/l");
    let addr = mds_addr(&c);
    let alive = |mds: &mut Daemon, what: &str| {
        assert!(
            mds.child.try_wait().unwrap().is_none(),
            "the MDS died after {what}: {}",
            std::fs::read_to_string(c.dir.join("mds.a.test.log")).unwrap_or_default()
        );
    };

    // 1. raw garbage on its port: random bytes, a huge frame length, a half handshake
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let mut garbage: Vec<Vec<u8>> = vec![
        vec![0xff; 64],
        vec![0; 4096],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        u64::MAX.to_le_bytes().repeat(8),
    ];
    for n in [1, 7, 64, 1000, 70_000] {
        garbage.push(noise(n));
    }
    for g in &garbage {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
            let _ = s.write_all(g);
            let _ = s.shutdown(std::net::Shutdown::Write);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    alive(&mut mds, "raw garbage");

    // 2. authenticated kelp-msgr requests that are malformed or hostile
    let keyring = kelp_msgr::Keyring::load(c.dir.join("keyring")).unwrap();
    let secret = kelp_msgr::KeyLookup::secret_for(&keyring, "client.admin").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answers = rt.block_on(async {
        let msgr = kelp_msgr::Messenger::builder("client.admin")
            .secret(secret)
            .build()
            .unwrap();
        let conn = msgr.connect(addr).await.unwrap();
        let env = |op: serde_json::Value| {
            serde_json::to_vec(&serde_json::json!({
                "v": kelp_fs::types::PROTOCOL_VERSION,
                "client": 77,
                "caller": {"uid": 0, "gid": 0},
                "op": op,
            }))
            .unwrap()
        };
        let big = "x".repeat(100_000);
        let mut requests: Vec<(u16, Vec<u8>)> = vec![
            (0x4d01, Vec::new()),
            (0x4d01, b"{".to_vec()),
            (0x4d01, b"null".to_vec()),
            (0x4d01, b"{\"v\":1}".to_vec()),
            (0x4d01, noise(500)),
            (0x4d02, env(serde_json::json!({"GetAttr": {"ino": 1}}))),
            (0xffff, noise(10)),
            (0x4d01, env(serde_json::json!({"GetAttr": {"ino": -1}}))),
            (0x4d01, env(serde_json::json!({"GetAttr": {"ino": "1"}}))),
            (0x4d01, env(serde_json::json!({"Nope": {}}))),
        ];
        let hostile = [
            serde_json::json!({"GetAttr": {"ino": 0}}),
            serde_json::json!({"GetAttr": {"ino": u64::MAX}}),
            serde_json::json!({"GetAttr": {"ino": 123_456_789}}),
            serde_json::json!({"Lookup": {"parent": 123_456_789, "name": "x"}}),
            serde_json::json!({"Lookup": {"parent": 1, "name": big}}),
            serde_json::json!({"ReadDir": {"ino": 1, "after": null, "max": 0}}),
            serde_json::json!({"ReadDir": {"ino": 1, "after": "\u{10ffff}", "max": u32::MAX}}),
            serde_json::json!({"Mkdir": {"parent": 1, "name": "a/b", "mode": 0o777}}),
            serde_json::json!({"Mkdir": {"parent": 1, "name": "", "mode": 0o777}}),
            serde_json::json!({"Mkdir": {"parent": 1, "name": "..", "mode": 0o777}}),
            serde_json::json!({"Mknod": {"parent": 1, "name": "weird", "mode": 0o170777u32, "rdev": u32::MAX, "exclusive": true}}),
            serde_json::json!({"Symlink": {"parent": 1, "name": "s", "target": big}}),
            serde_json::json!({"Link": {"ino": 1, "parent": 1, "name": "root-link"}}),
            serde_json::json!({"Unlink": {"parent": 1, "name": ".."}}),
            serde_json::json!({"Rmdir": {"parent": 1, "name": "."}}),
            serde_json::json!({"Rename": {"parent": 1, "name": "d", "new_parent": 1, "new_name": "d", "flags": 0}}),
            serde_json::json!({"Rename": {"parent": 1, "name": "..", "new_parent": 1, "new_name": "z", "flags": 0}}),
            serde_json::json!({"Rename": {"parent": 1, "name": "d", "new_parent": 123_456_789, "new_name": "z", "flags": 0}}),
            serde_json::json!({"Rename": {"parent": 1, "name": "d", "new_parent": 1, "new_name": "z", "flags": u32::MAX}}),
            serde_json::json!({"SetAttr": {"ino": 1, "set": {"mode": u32::MAX, "uid": null, "gid": null, "size": 5, "atime": null, "mtime": null}}}),
            serde_json::json!({"SetXattr": {"ino": 1, "name": "", "value": [], "flags": 3}}),
            serde_json::json!({"SetXattr": {"ino": 1, "name": "user.big", "value": vec![1u8; 70_000], "flags": 0}}),
            serde_json::json!({"GetXattr": {"ino": 123_456_789, "name": "user.x"}}),
            serde_json::json!({"RemoveXattr": {"ino": 1, "name": "user.none"}}),
            serde_json::json!({"Written": {"ino": 1, "end": u64::MAX, "mtime": {"secs": -5, "nanos": 4_000_000_000u64}}}),
            serde_json::json!({"Open": {"ino": 123_456_789}}),
            serde_json::json!({"Close": {"ino": 1}}),
            serde_json::json!({"Close": {"ino": 123_456_789}}),
            serde_json::json!({"Reconnect": {"opens": [[123_456_789, 3], [1, u32::MAX], [0, 0]]}}),
            serde_json::json!({"SetLk": {"ino": 1, "lock": {"typ": 99, "start": 10, "end": 0, "pid": 0, "owner": 0}}}),
            serde_json::json!({"GetLk": {"ino": 1, "lock": {"typ": 1, "start": 10, "end": 0, "pid": 0, "owner": 0}}}),
            serde_json::json!({"ReleaseLocks": {"ino": 123_456_789, "owner": 1}}),
        ];
        for op in hostile {
            requests.push((0x4d01, env(op)));
        }
        let mut answers = 0;
        for (i, (ty, meta)) in requests.iter().enumerate() {
            let r = conn
                .call(*ty, meta.clone(), bytes::Bytes::new(), Duration::from_secs(20))
                .await;
            match r {
                Ok(_) | Err(kelp_msgr::MsgrError::Remote { .. }) => answers += 1,
                Err(e) => panic!("request {i} ({ty:#x}) got no answer: {e}"),
            }
        }
        answers
    });
    eprintln!("{answers} malformed or hostile requests answered");
    alive(&mut mds, "malformed requests");

    // 3. it still serves the mount, and the map still shows it active
    m.sh("echo after > d/after && cat d/after && ls -lR > /dev/null");
    assert_eq!(std::fs::read(m.p("d/f")).unwrap(), b"x\n");
    let (name, state) = active_mds(&c).unwrap();
    assert_eq!((name.as_str(), state.contains("active")), ("a", true));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("d/f"))
        .unwrap();
    f.write_all_at(b"y", 0).unwrap();
    f.sync_all().unwrap();
    alive(&mut mds, "the mount's checks");
}

/// Directory fragments through a failover: a directory of a few hundred files (split size
/// 50, so it splits more than once, the last entries only in the journal) survives kill -9 of
/// the active MDS; the standby replays it and both mounts list every entry; its entries are
/// stored in fragment objects; emptied, it lists nothing.
#[test]
fn a_fragmented_directory_survives_kill_of_the_mds_and_lists_right_on_two_mounts() {
    use std::os::unix::fs::MetadataExt;
    let c = fs_support::fs_cluster();
    let (mut daemons, first) = active_and_standby(&c, &["--bal-split-size", "50"]);
    let a = Mount::with(&c, "mnt", &["--fs", "kelpfs"]);
    let b = Mount::with(&c, "mnt2", &["--fs", "kelpfs"]);
    a.sh("mkdir big && cd big && for i in $(seq 0 299); do echo $i > f$i; done");
    std::thread::sleep(Duration::from_millis(1500)); // checkpointed: in fragment objects
    a.sh("cd big && for i in $(seq 300 449); do echo $i > f$i; done");
    let ino = std::fs::metadata(a.p("big")).unwrap().ino();
    daemons.get_mut(&first).unwrap().kill9();
    let second = wait_active(&c, Some(&first));
    assert_ne!(first, second);
    let want: std::collections::BTreeSet<String> = (0..450).map(|i| format!("f{i}")).collect();
    for m in [&a, &b] {
        let names: std::collections::BTreeSet<String> = std::fs::read_dir(m.p("big"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, want, "listing of {}", m.dir.display());
        assert_eq!(m.sh("ls big | wc -l").trim(), "450");
        assert_eq!(std::fs::read_to_string(m.p("big/f449")).unwrap(), "449\n");
    }
    // stored as fragments: no single directory object left for it
    std::thread::sleep(Duration::from_millis(1500));
    let objects = c.cli(&["rados", "-p", "fs.meta", "ls"]);
    let frags = objects
        .lines()
        .filter(|o| o.starts_with(&format!("{ino:x}.dir.")))
        .count();
    assert!(
        frags >= 8,
        "{frags} fragment objects of {ino:x}:\n{objects}"
    );
    assert!(
        !objects.lines().any(|o| o == format!("{ino:x}.dir")),
        "the one-object directory was left behind"
    );
    // emptied from one mount, the other lists nothing
    a.sh("cd big && for i in $(seq 0 449); do rm f$i; done");
    assert_eq!(b.sh("ls big | wc -l").trim(), "0");
    std::fs::remove_dir(b.p("big")).unwrap();
}

/// Advisory locks survive a failover: mount A holds a flock and an fcntl lock, the active
/// MDS is killed, the standby takes over, and mount B's non-blocking attempts are still
/// refused (EWOULDBLOCK / EAGAIN) until A releases; then B gets both.
#[test]
fn locks_survive_kill_of_the_active_mds() {
    let c = fs_support::fs_cluster();
    let (mut daemons, first) = active_and_standby(&c, &[]);
    let a = Mount::with(&c, "mnt", &["--fs", "kelpfs"]);
    let b = Mount::with(&c, "mnt2", &["--fs", "kelpfs"]);
    std::fs::write(a.p("flocked"), b"").unwrap();
    std::fs::write(a.p("fcntled"), b"").unwrap();
    let release = c.dir.join("release-locks");
    let hold = "import fcntl, os, sys, time\n\
        f = open('flocked', 'r+')\n\
        fcntl.flock(f, fcntl.LOCK_EX)\n\
        g = open('fcntled', 'r+')\n\
        fcntl.lockf(g, fcntl.LOCK_EX, 0, 0)\n\
        print('held', flush=True)\n\
        while not os.path.exists(sys.argv[1]):\n    time.sleep(0.1)\n";
    let holder = Command::new("python3")
        .args(["-c", hold])
        .arg(&release)
        .current_dir(&a.dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut holder = fs_support::Daemon { child: holder };
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "held");
    daemons.get_mut(&first).unwrap().kill9();
    let second = wait_active(&c, Some(&first));
    assert_ne!(first, second);
    let try_flock = |m: &Mount| {
        Command::new("flock")
            .args(["-n"])
            .arg(m.p("flocked"))
            .arg("true")
            .status()
            .unwrap()
            .success()
    };
    // exit 7: EAGAIN/EWOULDBLOCK (the lock is held), anything else a failure of its own
    let try_fcntl = |m: &Mount| {
        Command::new("python3")
            .args([
                "-c",
                "import errno, fcntl, sys\nf = open('fcntled', 'r+')\ntry:\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)\nexcept OSError as e:\n    sys.exit(7 if e.errno in (errno.EAGAIN, errno.EACCES) else 1)",
            ])
            .current_dir(&m.dir)
            .status()
            .unwrap()
            .code()
    };
    assert!(
        !try_flock(&b),
        "flock -n on B took A's flock after the failover"
    );
    assert_eq!(try_fcntl(&b), Some(7), "B's fcntl lock after the failover");
    std::fs::write(&release, b"").unwrap();
    assert!(holder.child.wait().unwrap().success());
    let t = Instant::now();
    while !(try_flock(&b) && try_fcntl(&b) == Some(0)) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "B never got the locks A released"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Early replies: with the OSDs stalled, the MDS applies and answers changes it cannot
/// journal yet (creates, a mkdir, a symlink, a rename, a chmod); it is then killed -9 before
/// its journal holds them. The mount sends them again to the standby that takes over, which
/// gives every created file its inode number back: a second mount sees exactly what the
/// first one was answered, and the first mount's log shows the changes were sent again.
#[test]
fn changes_answered_before_the_journal_held_them_survive_kill_of_the_mds() {
    let c = fs_support::fs_cluster();
    let (mut daemons, first) = active_and_standby(&c, &[]);
    let a = Mount::with(&c, "mnt-a", &["--fs", "kelpfs"]);
    std::fs::create_dir(a.p("d")).unwrap();
    write_synced(&a.p("d/old"), b"written before the stall").unwrap();
    let listing = "cd d && stat -c '%n %i %a %F' * | sort";
    let before = a.sh(listing);

    // the OSDs stall: the MDS can apply and answer changes, but not journal them
    let osds: Vec<String> = (0..3).map(|o| format!("osd.{o}")).collect();
    osds.iter().for_each(|o| {
        c.sigstop(o);
    });
    let changed = std::panic::catch_unwind(|| {
        a.sh(
            "cd d && python3 -c 'import os\nfor i in range(40): os.close(os.open(f\"f{i}\", \
             os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))' && mkdir sub && ln -s f1 link \
             && mv old renamed && chmod 600 f3",
        );
        a.sh(listing)
    });
    daemons.get_mut(&first).unwrap().kill9();
    osds.iter().for_each(|o| c.sigcont(o));
    let expected = changed.unwrap();
    assert_ne!(expected, before);
    assert!(expected.contains("d/renamed") || expected.contains("renamed "));
    let second = wait_active(&c, Some(&first));
    assert_ne!(first, second);

    // a mount made after the takeover sees every change, with the same inode numbers
    let b = Mount::with(&c, "mnt-b", &["--fs", "kelpfs"]);
    let t = Instant::now();
    loop {
        let seen = b.sh(listing);
        if seen == expected {
            break;
        }
        if t.elapsed() > Duration::from_secs(90) {
            print_fs_logs(&c);
            panic!(
                "after the takeover mount B sees\n{seen}\nnot what mount A was answered\n{expected}"
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(a.sh(listing), expected, "mount A after the takeover");
    let log = std::fs::read_to_string(c.dir.join("mnt-a.log")).unwrap_or_default();
    assert!(
        log.contains("not known to be journaled"),
        "mount A never had to send a change again (the test did not stall the journal):\n{log}"
    );
    assert_eq!(
        std::fs::read(b.p("d/renamed")).unwrap(),
        b"written before the stall"
    );
    // new files after the takeover get inode numbers of their own
    std::fs::write(b.p("d/after"), b"x").unwrap();
    let inos = b.sh("cd d && stat -c '%i' * | sort | uniq -d");
    assert_eq!(inos.trim(), "", "two files share an inode number");
}
