//! The file system end to end: a real cluster, a real MDS (`kelp mds run`) and real FUSE
//! mounts (`kelp fs mount`), exercised with ordinary tools (cp, mv, ln, chmod, chown, touch,
//! truncate, tar, ls, du, xattrs through python), two mounts seeing each other's changes
//! (capabilities), locks, quotas, layouts, the MDS's cache budget, and fsync'd data surviving
//! kill -9 of the MDS. POSIX rules, permissions as non-root users and random I/O against a
//! model are in fs_posix.rs; faults in fs_faults.rs.
//!
//! Every mount is unmounted when its guard drops, also on panic (a leaked FUSE mount would
//! block later runs), and every daemon this test starts is killed.

#![allow(clippy::unwrap_used)]

mod fs_support;
mod heal_support;

use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fs_support::*;

#[test]
fn tools_rules_permissions_and_two_mounts() {
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let a = Mount::new(&c, "mnt-a");
    let b = Mount::new(&c, "mnt-b");

    // ordinary tools
    a.sh("echo hello > f && cp f g && mv g h && ln h hl && ln -s h sl && mkdir -p d/e/f");
    assert_eq!(std::fs::read_to_string(a.p("h")).unwrap(), "hello\n");
    assert_eq!(std::fs::read_to_string(a.p("sl")).unwrap(), "hello\n");
    assert_eq!(std::fs::read_link(a.p("sl")).unwrap(), Path::new("h"));
    assert_eq!(std::fs::metadata(a.p("h")).unwrap().nlink(), 2);
    assert!(!a.p("g").exists());
    a.sh("chmod 640 f && chown 1234:5678 f && touch -d '2001-02-03 04:05:06 UTC' f && truncate -s 10000 h");
    let m = std::fs::metadata(a.p("f")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
    assert_eq!(m.mtime(), 981_173_106);
    assert_eq!(std::fs::metadata(a.p("hl")).unwrap().len(), 10000);
    let h = std::fs::read(a.p("hl")).unwrap();
    assert_eq!(&h[..6], b"hello\n");
    assert!(
        h[6..].iter().all(|b| *b == 0),
        "a truncated-up file reads zeros"
    );
    a.sh(
        "python3 -c \"import os; os.setxattr('f', 'user.color', b'blue'); \
         assert os.getxattr('f', 'user.color') == b'blue'; \
         assert 'user.color' in os.listxattr('f'); os.removexattr('f', 'user.color'); \
         assert 'user.color' not in os.listxattr('f')\"",
    );
    // tar x of a small tree, then ls -lR / du; the tree matches the source
    let src = tempfile::tempdir().unwrap();
    let s = src.path().display();
    a.sh(&format!(
        "mkdir -p {s}/t/x/y && for i in $(seq 1 40); do head -c $((i*997)) /dev/urandom > {s}/t/x/f$i; done && \
         ln -s f1 {s}/t/x/link && echo z > {s}/t/x/y/z && tar -C {s} -cf {s}/t.tar t && tar -xf {s}/t.tar && \
         diff -r {s}/t t && ls -lR t > /dev/null && du -s t > /dev/null"
    ));
    // (rename rules, permissions as non-root users and random I/O against a model: fs_posix.rs)
    // O_APPEND
    a.sh("printf one > app && printf two >> app");
    assert_eq!(std::fs::read_to_string(a.p("app")).unwrap(), "onetwo");

    // two mounts: data, attributes, listings, renames — both directions
    std::fs::write(a.p("shared"), b"from a").unwrap();
    assert_eq!(std::fs::read(b.p("shared")).unwrap(), b"from a");
    std::fs::write(b.p("shared"), b"changed on b, longer").unwrap();
    assert_eq!(
        std::fs::read(a.p("shared")).unwrap(),
        b"changed on b, longer"
    );
    std::fs::set_permissions(b.p("shared"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        std::fs::metadata(a.p("shared")).unwrap().mode() & 0o777,
        0o600
    );
    std::fs::create_dir(b.p("made-on-b")).unwrap();
    std::fs::write(b.p("made-on-b/file"), b"x").unwrap();
    let listed: Vec<String> = std::fs::read_dir(a.p("made-on-b"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listed, ["file"]);
    std::fs::rename(a.p("made-on-b/file"), a.p("moved-by-a")).unwrap();
    assert!(!b.p("made-on-b/file").exists());
    assert_eq!(std::fs::read(b.p("moved-by-a")).unwrap(), b"x");
    std::fs::remove_file(b.p("moved-by-a")).unwrap();
    assert!(!a.p("moved-by-a").exists());

    // locks hold across mounts: flock and fcntl, in both directions
    std::fs::write(a.p("lockfile"), b"").unwrap();
    let holder = Command::new("flock")
        .arg(a.p("lockfile"))
        .args(["-c", "sleep 4"])
        .spawn()
        .unwrap();
    let mut holder = Daemon { child: holder };
    std::thread::sleep(Duration::from_millis(1500));
    let blocked = Command::new("flock")
        .args(["-n"])
        .arg(b.p("lockfile"))
        .arg("true")
        .status()
        .unwrap();
    assert!(!blocked.success(), "flock -n on b took a lock a holds");
    let waited = Command::new("flock")
        .args(["-w", "30"])
        .arg(b.p("lockfile"))
        .arg("true")
        .status()
        .unwrap();
    assert!(waited.success(), "flock on b never got the lock a released");
    holder.kill9();
    let fcntl = |m: &Mount, script: &str| {
        Command::new("python3")
            .args(["-c", script])
            .current_dir(&m.dir)
            .output()
            .unwrap()
    };
    let hold = "import fcntl, time\nf = open('lockfile', 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX, 10, 0)\nprint('held', flush=True)\ntime.sleep(3)";
    let try_lock = "import fcntl, sys\nf = open('lockfile', 'r+')\ntry:\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)\nexcept OSError:\n    sys.exit(7)";
    let other_range = "import fcntl\nf = open('lockfile', 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 100)";
    let b_dir = b.dir.clone();
    let h = std::thread::spawn(move || {
        Command::new("python3")
            .args(["-c", hold])
            .current_dir(&b_dir)
            .output()
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        fcntl(&a, try_lock).status.code(),
        Some(7),
        "a locked a range b holds"
    );
    assert!(
        fcntl(&a, other_range).status.success(),
        "a could not lock another range"
    );
    assert!(h.join().unwrap().status.success());
    assert!(
        fcntl(&a, try_lock).status.success(),
        "b's lock outlived its process"
    );

    // statfs shows the cluster's space
    let df = a.sh("df -B1 --output=size . | tail -1");
    let size: u64 = df.trim().parse().unwrap();
    assert!(size >= 1 << 30, "df shows {size} bytes for 3 GiB of OSDs");
}

#[test]
fn fsynced_data_survives_kill_of_the_mds() {
    let c = fs_cluster();
    let mut mds = start_mds(&c, "a");
    let a = Mount::new(&c, "mnt");
    let mut files = Vec::new();
    for i in 0..20 {
        let name = format!("dir{}/file{i}", i % 4);
        std::fs::create_dir_all(a.p(&format!("dir{}", i % 4))).unwrap();
        let data = heal_support::content(i, 1000 + i as usize * 7919);
        let mut f = std::fs::File::create(a.p(&name)).unwrap();
        std::io::Write::write_all(&mut f, &data).unwrap();
        f.sync_all().unwrap();
        files.push((name, data));
    }
    // an open file whose MDS dies keeps working after the restart
    let open = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(a.p("kept-open"))
        .unwrap();
    open.write_all_at(b"before", 0).unwrap();
    mds.kill9();
    let _mds2 = start_mds(&c, "b");
    open.write_all_at(b" after", 6).unwrap();
    open.sync_all().unwrap();
    let mut buf = [0u8; 12];
    open.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"before after");
    for (name, data) in &files {
        assert_eq!(&std::fs::read(a.p(name)).unwrap(), data, "{name}");
    }
    std::fs::write(a.p("dir0/new"), b"new").unwrap();
    // and a fresh mount sees all of it
    let b = Mount::new(&c, "mnt2");
    for (name, data) in &files {
        assert_eq!(&std::fs::read(b.p(name)).unwrap(), data, "{name}");
    }
    assert_eq!(std::fs::read(b.p("dir0/new")).unwrap(), b"new");
}

/// The file system `kelpfs` with MDS daemons `a` and `b`: the daemons, and which is active.
fn active_and_standby(
    c: &heal_support::Cluster,
) -> (std::collections::BTreeMap<String, Daemon>, String) {
    c.cli(&["fs", "new", "kelpfs", "fs.meta", "fs.data"]);
    let mut daemons = std::collections::BTreeMap::new();
    daemons.insert("a".to_string(), start_mds_with(c, "a", &[]));
    daemons.insert("b".to_string(), start_mds_with(c, "b", &[]));
    let first = wait_active(c, None);
    (daemons, first)
}

#[test]
fn standby_mds_takes_over_from_a_killed_active_one() {
    let c = fs_cluster();
    let (mut daemons, first) = active_and_standby(&c);
    let m = Mount::with(&c, "mnt", &["--fs", "kelpfs"]);
    let mut files = Vec::new();
    for i in 0..10u64 {
        let data = heal_support::content(i, 5000 + i as usize * 1000);
        let mut f = std::fs::File::create(m.p(&format!("f{i}"))).unwrap();
        std::io::Write::write_all(&mut f, &data).unwrap();
        f.sync_all().unwrap();
        files.push(data);
    }
    daemons.get_mut(&first).unwrap().kill9();
    let second = wait_active(&c, Some(&first));
    assert_ne!(first, second);
    // the same mount goes on: reads what was fsync'd, writes more
    for (i, data) in files.iter().enumerate() {
        assert_eq!(&std::fs::read(m.p(&format!("f{i}"))).unwrap(), data, "f{i}");
    }
    std::fs::write(m.p("after"), b"after failover").unwrap();
    assert_eq!(std::fs::read(m.p("after")).unwrap(), b"after failover");
}

/// Directory quotas through the `kelp.quota.*` attributes and the recursive statistics
/// (`kelp.dir.*`) seen through a mount with ordinary system calls.
#[test]
fn directory_quotas_give_edquot_and_statistics_read_as_attributes() {
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let m = Mount::new(&c, "mnt");
    let q = m.p("q");
    std::fs::create_dir(&q).unwrap();
    let set = |name: &str, v: &str| setxattr(&q, name, v).status;
    let get = |name: &str| getxattr(&q, name);
    assert!(set("kelp.quota.max_bytes", "1048576").success());
    assert!(set("kelp.quota.max_files", "3").success());
    assert_eq!(get("kelp.quota.max_bytes"), "1048576");

    // bytes: a file may grow to the quota, not past it; the refused write leaves no trace
    let data = heal_support::content(1, 1 << 20);
    std::fs::write(q.join("f"), &data).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(q.join("f"))
        .unwrap();
    assert_eq!(errno_of(f.write_all_at(b"more", 1 << 20)), libc::EDQUOT);
    drop(f);
    assert_eq!(std::fs::metadata(q.join("f")).unwrap().len(), 1 << 20);
    assert_eq!(get("kelp.dir.rbytes"), "1048576");
    // files: three entries below q, the fourth is refused
    std::fs::create_dir(q.join("d")).unwrap();
    std::fs::write(q.join("d/g"), b"").unwrap();
    assert_eq!(errno_of(std::fs::write(q.join("d/h"), b"")), libc::EDQUOT);
    assert_eq!(get("kelp.dir.rentries"), "3");
    // a non-root user cannot raise it
    let out = Command::new("setpriv")
        .args([
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
        ])
        .arg("import os,sys; os.setxattr(sys.argv[1], 'kelp.quota.max_bytes', b'0')")
        .arg(&q)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("PermissionError"),
        "a user cleared the quota: {out:?}"
    );
    // removing the quota lets the file grow again, and the refused bytes read as zeros
    assert!(set("kelp.quota.max_bytes", "0").success());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(q.join("f"))
        .unwrap();
    f.set_len((1 << 20) + 4).unwrap();
    drop(f);
    let back = std::fs::read(q.join("f")).unwrap();
    assert_eq!(&back[..1 << 20], &data[..]);
    assert_eq!(&back[1 << 20..], &[0u8; 4]);
    assert_eq!(get("kelp.dir.rbytes"), ((1u64 << 20) + 4).to_string());
}

/// File layouts: a directory's files go to another data pool of the file system (here an
/// erasure-coded one added with `fs add_data_pool`), named through `kelp.dir.layout.pool`.
#[test]
fn directory_layouts_put_files_in_an_erasure_coded_data_pool() {
    let c = fs_cluster();
    c.ec_pool("fs.ec", "p21", 2, 1);
    c.cli(&["fs", "new", "kelpfs", "fs.meta", "fs.data"]);
    let _mds = start_mds_with(&c, "a", &[]);
    wait_active(&c, None);
    let m = Mount::with(&c, "mnt", &["--fs", "kelpfs"]);
    std::fs::create_dir(m.p("cold")).unwrap();
    // only data pools of the file system may be named
    let out = setxattr(&m.p("cold"), "kelp.dir.layout.pool", "fs.ec");
    assert!(!out.status.success(), "fs.ec is not a data pool yet");
    c.cli(&["fs", "add_data_pool", "kelpfs", "fs.ec"]);
    let out = setxattr(&m.p("cold"), "kelp.dir.layout.pool", "fs.ec");
    assert!(out.status.success(), "{out:?}");

    let data = heal_support::content(7, 3 << 20 | 12345);
    std::fs::write(m.p("cold/big"), &data).unwrap();
    // (past the inline limit: a smaller file keeps its data with its inode)
    std::fs::write(m.p("hot"), [b'r'; 8192]).unwrap();
    // a partial overwrite and a truncate on the erasure-coded pool
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("cold/big"))
        .unwrap();
    f.write_all_at(b"patched", 1_000_000).unwrap();
    f.set_len(3 << 20).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut want = data.to_vec();
    want[1_000_000..1_000_007].copy_from_slice(b"patched");
    want.truncate(3 << 20);
    assert_eq!(std::fs::read(m.p("cold/big")).unwrap(), want);

    let ino = std::fs::metadata(m.p("cold/big")).unwrap().ino();
    let first = format!("{ino:x}.00000000");
    let ec = c.cli(&["rados", "ls", "-p", "fs.ec"]);
    assert!(ec.lines().any(|l| l == first), "{first} not in fs.ec: {ec}");
    let rep = c.cli(&["rados", "ls", "-p", "fs.data"]);
    assert!(!rep.lines().any(|l| l == first), "{first} in fs.data too");
    let hot = std::fs::metadata(m.p("hot")).unwrap().ino();
    assert!(
        rep.lines().any(|l| l == format!("{hot:x}.00000000")),
        "{rep}"
    );
    // the file's layout reads back
    assert_eq!(getxattr(&m.p("cold/big"), "kelp.file.layout.pool"), "fs.ec");
    // removing the file purges its objects from the erasure-coded pool (after the MDS's
    // purge grace of a fresh takeover)
    std::fs::remove_file(m.p("cold/big")).unwrap();
    let start = Instant::now();
    while c
        .cli(&["rados", "ls", "-p", "fs.ec"])
        .lines()
        .any(|l| l == first)
    {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the file's objects stayed in fs.ec"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The MDS's counters, read through its virtual extended attribute on a mount.
fn mds_stats(m: &Mount) -> serde_json::Value {
    let text = getxattr(&m.dir, "kelp.mds.stats");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("kelp.mds.stats {text:?}: {e}"))
}

fn mds_requests(m: &Mount) -> u64 {
    mds_stats(m)["requests"].as_u64().unwrap()
}

/// Stats `path` `n` times in one process.
fn stat_many(m: &Mount, path: &str, n: u32) {
    m.sh(&format!(
        "python3 -c \"import os\nfor _ in range({n}): os.stat('{path}')\""
    ));
}

/// Two mounts with capabilities (no --attr-timeout): each one caches what it read, and sees
/// the other's changes at once because they revoke its capabilities first; repeated stats of
/// an unchanged file do not reach the MDS; a killed mount holding capabilities holds up the
/// other's change for no longer than its session's bound.
#[test]
fn caps_keep_two_mounts_coherent_and_cache_what_is_unchanged() {
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let a = Mount::new(&c, "mnt-a");
    let b = Mount::new(&c, "mnt-b");
    // both polls must be registered with the MDS before grants are made
    std::thread::sleep(Duration::from_secs(1));

    // caching: stats of an unchanged file are answered by the kernel
    std::fs::write(a.p("f"), b"first").unwrap();
    assert_eq!(std::fs::read(b.p("f")).unwrap(), b"first");
    stat_many(&b, "f", 5);
    let before = mds_requests(&a);
    stat_many(&b, "f", 300);
    stat_many(&a, "f", 300);
    let after = mds_requests(&a);
    assert!(
        after - before <= 6,
        "600 stats of an unchanged file cost {} MDS requests",
        after - before
    );

    // every change on one mount is seen on the other at once, both directions; each
    // check first makes the reader cache the old state
    for (w, r) in [(&a, &b), (&b, &a)] {
        let tag = if std::ptr::eq(w, &a) { "ab" } else { "ba" };
        let f = format!("file-{tag}");
        // written and closed on w, read on r (same size, so only the pages tell)
        std::fs::write(w.p(&f), b"version-1").unwrap();
        assert_eq!(std::fs::read(r.p(&f)).unwrap(), b"version-1");
        stat_many(r, &f, 3);
        std::fs::write(w.p(&f), b"version-2").unwrap();
        assert_eq!(std::fs::read(r.p(&f)).unwrap(), b"version-2", "{tag}: data");
        // chmod
        std::fs::set_permissions(w.p(&f), std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(
            std::fs::metadata(r.p(&f)).unwrap().mode() & 0o777,
            0o640,
            "{tag}: chmod"
        );
        // utimens
        w.sh(&format!("touch -d '2001-02-03 04:05:06 UTC' {f}"));
        assert_eq!(
            std::fs::metadata(r.p(&f)).unwrap().mtime(),
            981_173_106,
            "{tag}: utimens"
        );
        // rename
        let g = format!("renamed-{tag}");
        std::fs::rename(w.p(&f), w.p(&g)).unwrap();
        assert!(!r.p(&f).exists(), "{tag}: old name still seen");
        assert_eq!(
            std::fs::read(r.p(&g)).unwrap(),
            b"version-2",
            "{tag}: rename"
        );
        // create, seen by ls
        let listing = |m: &Mount| m.sh("ls -1");
        assert!(!listing(r).contains(&format!("new-{tag}")));
        std::fs::write(w.p(&format!("new-{tag}")), b"n").unwrap();
        assert!(listing(r).contains(&format!("new-{tag}")), "{tag}: create");
        assert_eq!(
            std::fs::metadata(r.p(&format!("new-{tag}"))).unwrap().len(),
            1
        );
        // unlink
        std::fs::remove_file(w.p(&g)).unwrap();
        assert!(!r.p(&g).exists(), "{tag}: unlink");
        assert!(!listing(r).contains(&g), "{tag}: unlink (ls)");
        // a file growing on w: r's size follows
        stat_many(r, &format!("new-{tag}"), 2);
        w.sh(&format!("printf more >> new-{tag}"));
        assert_eq!(
            std::fs::metadata(r.p(&format!("new-{tag}"))).unwrap().len(),
            5,
            "{tag}: append"
        );
    }

    // a mount killed while it holds capabilities: the other's change waits at most for
    // the killed one's session to lapse (well within the lease)
    let mut b = b;
    stat_many(&b, "f", 3);
    assert_eq!(std::fs::read(b.p("f")).unwrap(), b"first");
    let mut child = b.child.take().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let start = Instant::now();
    std::fs::set_permissions(a.p("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(a.p("f"), b"after the kill").unwrap();
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(35),
        "a change held up {took:?} by a dead mount's capabilities"
    );
    assert_eq!(std::fs::read(a.p("f")).unwrap(), b"after the kill");
    drop(b);
    // a new mount sees it all
    let b2 = Mount::new(&c, "mnt-b2");
    assert_eq!(std::fs::read(b2.p("f")).unwrap(), b"after the kill");
    assert_eq!(std::fs::metadata(b2.p("f")).unwrap().mode() & 0o777, 0o600);
}

/// `--cache-inodes` is a bound, not advice: with a tiny budget, a tree far larger than it
/// leaves the MDS caching (and clients holding capabilities on) no more than the budget,
/// and everything stays correct.
#[test]
fn mds_cache_budget_is_enforced() {
    let c = fs_cluster();
    let _mds = start_mds_with(
        &c,
        "a",
        &[
            "--meta-pool",
            "fs.meta",
            "--data-pool",
            "fs.data",
            "--cache-inodes",
            "40",
        ],
    );
    let a = Mount::new(&c, "mnt");
    std::thread::sleep(Duration::from_secs(1));
    a.sh("mkdir d && for i in $(seq 1 300); do echo $i > d/f$i; done && ls -l d > /dev/null");
    let start = Instant::now();
    let stats = loop {
        let s = mds_stats(&a);
        let cached = s["cached_inodes"].as_u64().unwrap();
        let capped = s["cap_inodes"].as_u64().unwrap();
        if cached <= 40 && capped <= 40 {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the cache stays over its budget of 40: {s}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(stats["cache_budget"].as_u64(), Some(40));
    // and nothing was lost: every file reads back (reloading what was evicted)
    for i in (1..=300).step_by(7) {
        assert_eq!(
            std::fs::read_to_string(a.p(&format!("d/f{i}"))).unwrap(),
            format!("{i}\n")
        );
    }
    assert_eq!(a.sh("ls d | wc -l").trim(), "300");
}

/// `--max-backlog` bounds the journaled updates not yet written back: with checkpoints a
/// minute apart and a backlog of 200 updates, 400 creates still go on (a full backlog starts a
/// checkpoint at once instead of waiting for the interval), the MDS never holds much more
/// than the bound, and after kill -9 of the MDS its successor finds every file.
#[test]
fn the_backlog_of_updates_not_yet_written_back_is_bounded() {
    let c = fs_cluster();
    let args = [
        "--meta-pool",
        "fs.meta",
        "--data-pool",
        "fs.data",
        "--checkpoint-interval",
        "60",
        "--max-backlog",
        "200",
    ];
    let mut mds = start_mds_with(&c, "a", &args);
    let a = Mount::new(&c, "mnt");
    std::thread::sleep(Duration::from_secs(1));
    let done = std::sync::atomic::AtomicBool::new(false);
    let start = Instant::now();
    let most = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let n = mds_stats(&a)["unwritten_updates"].as_u64().unwrap();
                most = most.max(n);
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        });
        a.sh("mkdir d && for i in $(seq 1 400); do : > d/f$i; done");
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().unwrap()
    });
    let took = start.elapsed();
    // A create journals ~5 updates: 400 of them are ~2 000, ten times the bound.
    assert!(most > 0, "the backlog was never seen");
    assert!(
        most <= 260,
        "{most} updates waited to be written back (bound 200)"
    );
    assert!(
        took < Duration::from_secs(50),
        "400 creates took {took:?}: a full backlog waited for the 60 s checkpoint interval"
    );
    drop(a);
    mds.kill9();
    let mut mds_b = start_mds_with(&c, "b", &args);
    let b = Mount::new(&c, "mnt-b");
    assert_eq!(b.sh("ls d | wc -l").trim(), "400");
    // A stop (SIGTERM) writes the backlog back and exits cleanly; nothing is lost.
    b.sh("for i in $(seq 401 450); do : > d/f$i; done");
    let pid = mds_b.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let start = Instant::now();
    let status = loop {
        if let Some(st) = mds_b.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the MDS did not stop within a minute of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "the stopped MDS exited with {status}");
    drop(b);
    let _mds_c = start_mds_with(&c, "c", &args);
    let m = Mount::new(&c, "mnt-c");
    assert_eq!(m.sh("ls d | wc -l").trim(), "450");
}

/// `kelp.mds.stats`' count of requests of one operation (`readdir`, `written`, ...).
/// Runs the Python `script` with `m`'s `file` as its argument until it prints `synced`, then
/// kills the mount (kill -9) and the script.
fn kill_mount_once_synced(mut m: Mount, script: &str, file: &str) {
    let mut writer = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(m.p(file))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(writer.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "synced");
    let mut child = m.child.take().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = writer.kill();
    let _ = writer.wait();
}

fn mds_ops(m: &Mount, op: &str) -> u64 {
    mds_stats(m)["ops"][op].as_u64().unwrap_or(0)
}

/// Write-back under the exclusive capability: N writes to a file opened for writing cost
/// O(1) MDS requests, not one each; another mount sees the size at once without an fsync
/// (its stat revokes the capability, whose holder flushes the size first); an fsynced size
/// survives kill -9 of the writing mount.
#[test]
fn sizes_are_written_back_under_the_exclusive_capability() {
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let a = Mount::new(&c, "mnt-a");
    let b = Mount::new(&c, "mnt-b");
    // both polls must be registered with the MDS before grants are made
    std::thread::sleep(Duration::from_secs(1));

    // 400 writes of 4 KiB through one open handle, then a stat on the other mount at once
    let (written0, req0) = (mds_ops(&a, "written"), mds_requests(&a));
    let out = a.sh(&format!(
        "python3 -c \"
import os
fd = os.open('f', os.O_CREAT | os.O_WRONLY, 0o644)
for i in range(400):
    os.pwrite(fd, bytes([i % 251]) * 4096, i * 4096)
print(os.stat('{}').st_size)
os.close(fd)
\"",
        b.p("f").display()
    ));
    assert_eq!(
        out.trim(),
        (400 * 4096).to_string(),
        "the other mount's stat"
    );
    let written = mds_ops(&a, "written") - written0;
    let requests = mds_requests(&a) - req0;
    assert!(
        written <= 20,
        "400 writes sent {written} size updates to the MDS ({requests} requests)"
    );
    assert!(requests <= 60, "400 writes cost {requests} MDS requests");
    let data = std::fs::read(b.p("f")).unwrap();
    assert_eq!(data.len(), 400 * 4096);
    assert!(
        data.chunks(4096)
            .enumerate()
            .all(|(i, c)| c[0] == (i % 251) as u8)
    );

    // growth seen by the other mount while the writer keeps the file open
    let out = a.sh(&format!(
        "python3 -c \"
import os
fd = os.open('g', os.O_CREAT | os.O_WRONLY, 0o644)
for n in range(1, 4):
    os.write(fd, b'x' * 1000)
    print(os.stat('{}').st_size)
os.close(fd)
\"",
        b.p("g").display()
    ));
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["1000", "2000", "3000"]
    );

    // fsync, then more writes without it, then kill -9 of the writing mount: the fsynced
    // size is kept (the later one may be lost)
    kill_mount_once_synced(
        a,
        "import os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
for i in range(256):
    os.pwrite(fd, b'z' * 4096, i * 4096)
os.fsync(fd)
print('synced', flush=True)
os.pwrite(fd, b'w' * 4096, 256 * 4096)
time.sleep(60)",
        "h",
    );
    let size = std::fs::metadata(b.p("h")).unwrap().len();
    assert!(size >= 256 * 4096, "the fsynced size was lost: {size}");
    let data = std::fs::read(b.p("h")).unwrap();
    assert!(data[..256 * 4096].iter().all(|x| *x == b'z'));
}

/// The kernel caches a directory's listing while the mount holds the directory's shared
/// capability: listing an unchanged directory again costs the MDS no readdir, and a create
/// on the other mount is seen at once (its revoke drops the cached listing).
#[test]
fn the_kernel_caches_listings_while_the_directory_is_unchanged() {
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let a = Mount::new(&c, "mnt-a");
    let b = Mount::new(&c, "mnt-b");
    std::thread::sleep(Duration::from_secs(1));
    a.sh("mkdir d && for i in $(seq 1 100); do echo $i > d/f$i; done");
    let ls = |m: &Mount| m.sh("ls -l d | tail -n +2 | wc -l").trim().to_string();
    assert_eq!(ls(&b), "100");
    let before = mds_ops(&b, "readdir");
    assert!(before > 0, "the MDS counts readdirs");
    for _ in 0..3 {
        assert_eq!(ls(&b), "100");
    }
    assert_eq!(
        mds_ops(&b, "readdir") - before,
        0,
        "an unchanged directory was read again"
    );
    // another mount's create is seen at once, and so is this mount's own
    std::fs::write(a.p("d/new"), b"n").unwrap();
    assert_eq!(ls(&b), "101");
    assert!(b.sh("ls d").contains("new"));
    std::fs::write(b.p("d/mine"), b"m").unwrap();
    assert!(b.sh("ls d").contains("mine"));
    std::fs::remove_file(a.p("d/f1")).unwrap();
    assert!(!b.sh("ls d").lines().any(|l| l == "f1"));
    assert_eq!(ls(&b), "101");
    // and cached again once read
    let before = mds_ops(&b, "readdir");
    assert_eq!(ls(&b), "101");
    assert_eq!(mds_ops(&b, "readdir") - before, 0);
}

/// A change's reply carries the directory it changed as it is now: after each create or mkdir
/// in a directory this mount holds a lease on, `stat` of the directory shows the new link count
/// and a current mtime without a GETATTR reaching the MDS, and another mount agrees.
#[test]
fn a_change_brings_its_directory_s_new_attributes_along() {
    use std::os::unix::fs::MetadataExt;
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let a = Mount::new(&c, "mnt-a");
    let b = Mount::new(&c, "mnt-b");
    std::thread::sleep(Duration::from_secs(1));
    std::fs::create_dir(a.p("d")).unwrap();
    std::fs::metadata(a.p("d")).unwrap();
    let getattrs = mds_ops(&a, "getattr");
    let mut last_mtime = (0, 0);
    for i in 0..20 {
        std::fs::create_dir(a.p(&format!("d/sub{i}"))).unwrap();
        std::fs::write(a.p(&format!("d/f{i}")), b"x").unwrap();
        let m = std::fs::metadata(a.p("d")).unwrap();
        assert_eq!(
            m.nlink(),
            2 + i + 1,
            "link count of d after {} subdirectories",
            i + 1
        );
        let mtime = (m.mtime(), m.mtime_nsec());
        assert!(mtime >= last_mtime, "d's mtime went back");
        last_mtime = mtime;
    }
    let asked = mds_ops(&a, "getattr") - getattrs;
    assert!(
        asked < 10,
        "{asked} GETATTRs reached the MDS for 40 changes in a directory this mount holds a lease on"
    );
    let mb = std::fs::metadata(b.p("d")).unwrap();
    let ma = std::fs::metadata(a.p("d")).unwrap();
    assert_eq!(
        (mb.nlink(), mb.mtime(), mb.mtime_nsec()),
        (ma.nlink(), ma.mtime(), ma.mtime_nsec())
    );
}

/// Under the exclusive capability a file's writes are answered once on their way and its
/// mode, owner and times are set by the mount itself (the way `tar x` restores each file):
/// no setattr reaches the MDS; another mount sees the data and every attribute at once (its
/// look revokes the capability, whose holder stores the writes and sends what it kept first);
/// an fsync sends them too, so they survive kill -9 of the writing mount. Lookups of names a
/// directory this mount made does not hold are answered by the mount, until another mount
/// changes the directory.
#[test]
fn a_file_s_writes_and_attributes_stay_with_its_writer_until_someone_looks() {
    use std::os::unix::fs::MetadataExt;
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let a = Mount::new(&c, "mnt-a");
    let b = Mount::new(&c, "mnt-b");
    std::thread::sleep(Duration::from_secs(1));

    // a tree written the way tar writes it
    std::fs::create_dir(a.p("t")).unwrap();
    let (setattrs0, lookups0) = (mds_ops(&a, "setattr"), mds_ops(&a, "lookup"));
    // run outside the mount (an interpreter looks for modules in its working directory)
    let tar_like = Command::new("python3")
        .current_dir("/")
        .arg("-c")
        .arg(
            "import os, sys
for i in range(50):
    p = sys.argv[1] + '/f%d' % i
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.write(fd, bytes([i]) * (1000 + i))
    os.utime(fd, ns=(1_000_000_000 * (i + 1), 2_000_000_000 * (i + 1)))
    os.fchown(fd, 1000 + i, 2000 + i)
    os.fchmod(fd, 0o640 | (i % 8))
    os.close(fd)",
        )
        .arg(a.p("t"))
        .status()
        .unwrap();
    assert!(tar_like.success());
    assert_eq!(
        mds_ops(&a, "setattr") - setattrs0,
        0,
        "times, owner and mode went to the MDS one by one"
    );
    assert_eq!(
        mds_ops(&a, "lookup") - lookups0,
        0,
        "names never made in a directory this mount made were asked of the MDS"
    );
    for i in 0..50u64 {
        let p = format!("t/f{i}");
        let m = std::fs::metadata(b.p(&p)).unwrap();
        assert_eq!(m.len(), 1000 + i, "{p}: size");
        assert_eq!(
            (m.uid(), m.gid()),
            (1000 + i as u32, 2000 + i as u32),
            "{p}"
        );
        assert_eq!(m.mode() & 0o7777, 0o640 | (i as u32 % 8), "{p}: mode");
        assert_eq!(
            (m.atime(), m.mtime()),
            (i as i64 + 1, 2 * (i as i64 + 1)),
            "{p}"
        );
        let data = std::fs::read(b.p(&p)).unwrap();
        assert!(
            data.len() == 1000 + i as usize && data.iter().all(|x| u64::from(*x) == i),
            "{p}: data"
        );
    }
    // a name this mount answered as missing, made by the other mount: found at once
    let lookups = mds_ops(&a, "lookup");
    assert!(!a.p("t/none").exists());
    assert_eq!(mds_ops(&a, "lookup"), lookups, "answered by the mount");
    std::fs::write(b.p("t/none"), b"late").unwrap();
    assert_eq!(std::fs::read(a.p("t/none")).unwrap(), b"late");
    std::fs::remove_file(b.p("t/f3")).unwrap();
    assert!(!a.p("t/f3").exists());

    // chmod and a write, fsync, kill -9 of the writing mount: the other mount has both
    kill_mount_once_synced(
        a,
        "import os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
os.pwrite(fd, b'k' * 5000, 0)
os.fchmod(fd, 0o604)
os.fsync(fd)
print('synced', flush=True)
time.sleep(60)",
        "k",
    );
    let m = std::fs::metadata(b.p("k")).unwrap();
    assert_eq!((m.len(), m.mode() & 0o7777), (5000, 0o604));
    assert_eq!(std::fs::read(b.p("k")).unwrap(), vec![b'k'; 5000]);
}

/// The objects of `pool` whose names start with `prefix`.
fn objects_named(c: &heal_support::Cluster, pool: &str, prefix: &str) -> Vec<String> {
    c.cli(&["rados", "-p", pool, "ls"])
        .lines()
        .filter(|o| o.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

/// Waits (up to `secs`) until `ok` holds of `pool`'s object names.
fn wait_objects(c: &heal_support::Cluster, pool: &str, secs: u64, ok: impl Fn(&str) -> bool) {
    heal_support::wait(
        &format!("the objects of {pool} as expected"),
        Duration::from_secs(secs),
        || ok(&c.cli(&["rados", "-p", pool, "ls"])).then_some(()),
    );
}

#[test]
fn inodes_live_in_table_shards_and_older_file_systems_keep_one_object_each() {
    let c = fs_cluster();
    // A new file system records the inode table in its format object and writes inodes
    // back into shards of 1 024 numbers: no object per inode.
    let mut mds_a = start_mds(&c, "a");
    let m = Mount::new(&c, "mnt");
    m.sh("mkdir d && for i in $(seq 1 1500); do : > d/f$i; done; echo x > d/f7; ln -s f7 d/s");
    wait_objects(&c, "fs.meta", 30, |o| {
        o.lines().filter(|l| l.starts_with("mds.inodes.")).count() >= 2
    });
    let format = c.cli(&["rados", "-p", "fs.meta", "get", "mds.format", "-"]);
    assert!(format.contains("\"inode_table\":true"), "{format}");
    let per_inode: Vec<String> = objects_named(&c, "fs.meta", "")
        .into_iter()
        .filter(|o| o.ends_with(".inode"))
        .collect();
    assert_eq!(per_inode, ["1.inode"], "inode objects in a new file system");
    // The root's old inode object only turns away an MDS built before the table.
    let guard = c.cli(&["rados", "-p", "fs.meta", "get", "1.inode", "-"]);
    assert!(guard.contains("too old"), "{guard}");
    assert!(serde_json::from_str::<serde_json::Value>(&guard).unwrap()["inode"].is_null());
    // A successor reads every inode back from the shards (and the journal's tail).
    mds_a.kill9();
    let _mds_b = start_mds(&c, "b");
    assert_eq!(m.sh("ls d | wc -l").trim(), "1501");
    assert_eq!(m.sh("cat d/s; stat -c %s d/f1500").trim(), "x\n0");
    // Once its inodes are gone (purged 30 s after the takeover), a shard goes too; the
    // root's stays.
    m.sh("rm -rf d");

    // A file system made before the format record (its root has an inode object) keeps one
    // object per inode, across restarts that find no record.
    c.cli(&["pool", "create", "fs.meta2", "--pg-num", "8"]);
    c.cli(&["pool", "create", "fs.data2", "--pg-num", "8"]);
    let pools = ["--meta-pool", "fs.meta2", "--data-pool", "fs.data2"];
    let old = c.dir.join("format-objects.json");
    std::fs::write(&old, r#"{"v":1,"inode_table":false}"#).unwrap();
    c.cli(&[
        "rados",
        "-p",
        "fs.meta2",
        "put",
        "mds.format",
        old.to_str().unwrap(),
    ]);
    let mut mds_c = start_mds_with(&c, "c", &pools);
    let m2 = Mount::with(&c, "mnt2", &pools);
    m2.sh("for i in $(seq 1 20); do echo $i > f$i; done");
    wait_objects(&c, "fs.meta2", 30, |o| {
        o.lines().filter(|l| l.ends_with(".inode")).count() >= 21
    });
    mds_c.kill9();
    c.cli(&["rados", "-p", "fs.meta2", "rm", "mds.format"]);
    let _mds_d = start_mds_with(&c, "d", &pools);
    assert_eq!(m2.sh("cat f1 f20 | tr '\\n' ' '").trim(), "1 20");
    m2.sh("echo 21 > f21");
    wait_objects(&c, "fs.meta2", 30, |o| {
        o.lines().filter(|l| l.ends_with(".inode")).count() >= 22
    });
    assert!(objects_named(&c, "fs.meta2", "mds.inodes.").is_empty());
    let format = c.cli(&["rados", "-p", "fs.meta2", "get", "mds.format", "-"]);
    assert!(format.contains("\"inode_table\":false"), "{format}");
    drop(m2);

    wait_objects(&c, "fs.meta", 90, |o| {
        o.lines().filter(|l| l.starts_with("mds.inodes.")).count() == 1
    });
    assert_eq!(
        objects_named(&c, "fs.meta", "mds.inodes."),
        ["mds.inodes.0"]
    );
}

/// The inode numbers of the files directly in `dir`, by name, as `m` shows them.
fn inos_in(dir: &Path) -> std::collections::BTreeMap<String, u64> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                e.metadata().unwrap().ino(),
            )
        })
        .collect()
}

/// Creates in a directory the mount made are answered by the mount itself, with inode
/// numbers the MDS delegated to it (stored in `mds.delegations`), and sent behind: another
/// mount that looks sees every one with the same numbers, cannot remove the directory under
/// them, and a successor of a killed MDS gives the creates it never heard of the same
/// numbers.
#[test]
fn creates_in_a_directory_its_mount_made_are_sent_behind_with_delegated_numbers() {
    let c = fs_cluster();
    let (mut daemons, first) = active_and_standby(&c);
    let a = Mount::with(&c, "mnt-a", &["--fs", "kelpfs"]);
    let b = Mount::with(&c, "mnt-b", &["--fs", "kelpfs"]);

    // mount a makes d and creates in it (some files written, some empty)
    std::fs::create_dir(a.p("d")).unwrap();
    for i in 0..300u64 {
        let data = if i % 3 == 0 {
            Vec::new()
        } else {
            heal_support::content(i, 100 + i as usize * 13).to_vec()
        };
        std::fs::write(a.p(&format!("d/f{i:03}")), &data).unwrap();
    }
    let seen_by_a = inos_in(&a.p("d"));
    assert_eq!(seen_by_a.len(), 300);
    // the numbers come from ranges the MDS delegated and stored
    let stored: serde_json::Value =
        serde_json::from_str(&c.cli(&["rados", "-p", "fs.meta", "get", "mds.delegations", "-"]))
            .unwrap();
    let ranges: Vec<(u64, u64)> = stored["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["start"].as_u64().unwrap(), r["end"].as_u64().unwrap()))
        .collect();
    let delegated = |ino: u64| ranges.iter().any(|(s, e)| (*s..*e).contains(&ino));
    let behind = seen_by_a.values().filter(|i| delegated(**i)).count();
    assert!(
        behind >= 250,
        "{behind} of 300 creates used delegated numbers ({ranges:?})"
    );
    // mount b sees every file, with the same numbers and contents, and cannot remove d
    assert_eq!(inos_in(&b.p("d")), seen_by_a);
    for i in (0..300u64).step_by(7) {
        let want = if i % 3 == 0 {
            Vec::new()
        } else {
            heal_support::content(i, 100 + i as usize * 13).to_vec()
        };
        assert_eq!(std::fs::read(b.p(&format!("d/f{i:03}"))).unwrap(), want);
    }
    let e = std::fs::remove_dir(b.p("d")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    // an empty directory a made, removed by b: a's creates there went first, so it is not
    // empty; once a's file is gone, b removes it
    std::fs::create_dir(a.p("e")).unwrap();
    std::fs::write(a.p("e/only"), b"x").unwrap();
    let e = std::fs::remove_dir(b.p("e")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    std::fs::remove_file(b.p("e/only")).unwrap();
    std::fs::remove_dir(b.p("e")).unwrap();

    // kill -9 of the MDS right after creates it may not have heard of: the standby gives
    // them the numbers mount a gave
    std::fs::create_dir(a.p("g")).unwrap();
    for i in 0..100 {
        std::fs::write(a.p(&format!("g/h{i:03}")), format!("{i}")).unwrap();
    }
    let before = inos_in(&a.p("g"));
    daemons.get_mut(&first).unwrap().kill9();
    let second = wait_active(&c, Some(&first));
    assert_ne!(first, second);
    // a's own view goes through the new MDS once its leases are gone
    heal_support::wait(
        "mount a's creates to reach the new MDS",
        Duration::from_secs(60),
        || (inos_in(&b.p("g")) == before).then_some(()),
    );
    for i in 0..100 {
        assert_eq!(
            std::fs::read_to_string(b.p(&format!("g/h{i:03}"))).unwrap(),
            format!("{i}")
        );
    }
    assert_eq!(inos_in(&a.p("g")), before);
    // and creating goes on through the new MDS
    std::fs::create_dir(a.p("k")).unwrap();
    std::fs::write(a.p("k/after"), b"after").unwrap();
    assert_eq!(std::fs::read(b.p("k/after")).unwrap(), b"after");
    // the files a created across the takeover are closed there once (a create sent again
    // registers its own open): removed, their data is purged after the new MDS's grace
    std::fs::remove_dir_all(a.p("g")).unwrap();
    let names: Vec<String> = before.values().map(|i| format!("{i:x}.")).collect();
    wait_objects(&c, "fs.data", 120, |objects| {
        objects
            .lines()
            .all(|o| !names.iter().any(|n| o.starts_with(n.as_str())))
    });
}

/// Unlinks of files a mount made in a directory it made are answered by the mount itself
/// and sent behind: they finish while the MDS is frozen; another mount then sees exactly
/// the files left, a name removed and made again at once holds the new file, the removed
/// files' data is purged, and unlinks the MDS never heard of before a kill -9 reach its
/// successor.
#[test]
fn unlinks_of_files_a_mount_made_in_its_own_directory_are_sent_behind() {
    let c = fs_cluster();
    let (mut daemons, first) = active_and_standby(&c);
    let a = Mount::with(&c, "mnt-a", &["--fs", "kelpfs"]);
    let b = Mount::with(&c, "mnt-b", &["--fs", "kelpfs"]);
    let data = |i: u64| heal_support::content(i, 1 + i as usize * 37).to_vec();
    // the mount's first create in a directory it made asks the MDS, and for inode numbers
    std::fs::create_dir(a.p("warm")).unwrap();
    std::fs::write(a.p("warm/first"), b"").unwrap();
    std::thread::sleep(Duration::from_millis(200));

    std::fs::create_dir(a.p("d")).unwrap();
    for i in 0..200u64 {
        std::fs::write(a.p(&format!("d/f{i:03}")), data(i)).unwrap();
    }
    let made = inos_in(&a.p("d"));
    // the kernel's releases of the files come after their closes, and the sizes sent
    // behind the closes must be answered (a file with either on its way asks the MDS)
    std::thread::sleep(Duration::from_secs(2));

    // 150 unlinks while the MDS is frozen: none of them waits for it
    let mds = daemons[&first].child.id() as i32;
    // SAFETY: a signal to a child process this test started and still owns
    unsafe { libc::kill(mds, libc::SIGSTOP) };
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = a.p("d");
    std::thread::spawn(move || {
        for i in 0..150u64 {
            std::fs::remove_file(dir.join(format!("f{i:03}"))).unwrap();
        }
        let _ = tx.send(());
    });
    // (well within the monitors' grace: the MDS is not replaced)
    let finished = rx.recv_timeout(Duration::from_secs(4));
    // SAFETY: as above
    unsafe { libc::kill(mds, libc::SIGCONT) };
    assert!(finished.is_ok(), "the unlinks waited for the frozen MDS");

    // mount b sees exactly the 50 left, with their contents; a removed name is gone
    let left: std::collections::BTreeMap<String, u64> = made
        .iter()
        .filter(|(n, _)| n.as_str() >= "f150")
        .map(|(n, i)| (n.clone(), *i))
        .collect();
    assert_eq!(inos_in(&b.p("d")), left);
    for i in (150..200u64).step_by(9) {
        assert_eq!(std::fs::read(b.p(&format!("d/f{i:03}"))).unwrap(), data(i));
    }
    let e = std::fs::metadata(b.p("d/f007")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));

    // removed and made again at once (b's lookups took a's lease on d: make a new one)
    std::fs::create_dir(a.p("e")).unwrap();
    for i in 0..40u64 {
        std::fs::write(a.p(&format!("e/g{i:02}")), b"old").unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..40u64 {
        std::fs::remove_file(a.p(&format!("e/g{i:02}"))).unwrap();
        std::fs::write(a.p(&format!("e/g{i:02}")), format!("new {i}")).unwrap();
    }
    for i in 0..40u64 {
        assert_eq!(
            std::fs::read_to_string(b.p(&format!("e/g{i:02}"))).unwrap(),
            format!("new {i}")
        );
    }

    // the removed files' data objects go
    let gone: Vec<String> = made
        .iter()
        .filter(|(n, _)| n.as_str() < "f150")
        .map(|(_, i)| format!("{i:x}."))
        .collect();
    wait_objects(&c, "fs.data", 60, |objects| {
        objects
            .lines()
            .all(|o| !gone.iter().any(|g| o.starts_with(g.as_str())))
    });

    // unlinks sent behind just before kill -9 of the MDS reach its successor
    std::fs::create_dir(a.p("k")).unwrap();
    for i in 0..60u64 {
        std::fs::write(a.p(&format!("k/h{i:02}")), data(i)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..45u64 {
        std::fs::remove_file(a.p(&format!("k/h{i:02}"))).unwrap();
    }
    daemons.get_mut(&first).unwrap().kill9();
    let second = wait_active(&c, Some(&first));
    assert_ne!(first, second);
    let want: Vec<String> = (45..60).map(|i| format!("h{i:02}")).collect();
    // (names only: a name listed while the unlinks land may be gone by its `stat`)
    let names_in = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    heal_support::wait(
        "mount a's unlinks to reach the new MDS",
        Duration::from_secs(60),
        || (names_in(&b.p("k")) == want).then_some(()),
    );
    assert_eq!(inos_in(&a.p("k")).into_keys().collect::<Vec<_>>(), want);
    std::fs::remove_dir_all(a.p("k")).unwrap();
    std::fs::remove_dir_all(a.p("d")).unwrap();
    assert!(std::fs::read_dir(b.p("")).unwrap().all(|e| {
        let n = e.unwrap().file_name();
        n != "k" && n != "d"
    }));
}

/// A change in flight to an MDS that is frozen, replaced, and continued before the client
/// gives up on it is made by the successor: however the old MDS answers (early, before it
/// learns it was replaced — the client then sends it again, as it takes no answer over a
/// connection it has since left — or with ESHUTDOWN once fenced), the change holds on both
/// mounts. Which of the two the old MDS does first depends on scheduling: with the fix taken
/// out, this test failed in one run of two (b still saw `x0`), and on a `kelp up` cluster
/// (SIGSTOP for 8.5 s) the change was lost in two runs of three.
#[test]
fn a_change_answered_by_a_replaced_mds_is_made_by_its_successor() {
    let c = fs_cluster();
    let (daemons, first) = active_and_standby(&c);
    let a = Mount::with(&c, "mnt-a", &["--fs", "kelpfs"]);
    let b = Mount::with(&c, "mnt-b", &["--fs", "kelpfs"]);
    // made by a (in the root: through the MDS), untouched by b (no capability of b's to
    // revoke first); then the MDS is left idle (closes sent, journal and checkpoint written)
    // so that, continued, it has nothing to write before it answers the unlink
    for i in 0..3 {
        std::fs::write(a.p(&format!("x{i}")), b"x").unwrap();
    }
    std::thread::sleep(Duration::from_millis(2500));

    let mds = daemons[&first].child.id() as i32;
    // SAFETY: a signal to a child process this test started and still owns
    unsafe { libc::kill(mds, libc::SIGSTOP) };
    let dir = a.p("");
    let rm = std::thread::spawn(move || {
        (0..3)
            .map(|i| errno_of(std::fs::remove_file(dir.join(format!("x{i}")))))
            .collect::<Vec<i32>>()
    });
    let second = wait_active(&c, Some(&first));
    assert_ne!(first, second);
    // both mounts' capability polls moved to the successor (a's unlink still waits for the
    // frozen MDS's answer)
    heal_support::wait(
        "both mounts to open sessions with the new MDS",
        Duration::from_secs(30),
        || (mds_sessions(&c, &second) >= 2).then_some(()),
    );
    // SAFETY: as above; the old MDS answers what it holds, then learns it was replaced
    unsafe { libc::kill(mds, libc::SIGCONT) };
    assert_eq!(rm.join().unwrap(), [0, 0, 0]);
    std::process::Command::new("sync")
        .current_dir(a.p(""))
        .status()
        .unwrap();
    for i in 0..3 {
        let name = format!("x{i}");
        assert_eq!(
            errno_of(std::fs::metadata(b.p(&name))),
            libc::ENOENT,
            "{name} on b"
        );
        assert_eq!(
            errno_of(std::fs::metadata(a.p(&name))),
            libc::ENOENT,
            "{name} on a"
        );
    }
}

/// `kelp_mds_sessions` of the MDS `id` (its metrics endpoint is in its log); 0 if unread.
fn mds_sessions(c: &heal_support::Cluster, id: &str) -> u64 {
    use std::io::{Read, Write};
    let log = std::fs::read_to_string(c.dir.join(format!("mds.{id}.test.log"))).unwrap_or_default();
    let Some(addr) = log
        .split("metrics endpoint url=http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
    else {
        return 0;
    };
    let mut body = String::new();
    let got =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            write!(
                s,
                "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )?;
            s.read_to_string(&mut body)
        });
    if got.is_err() {
        return 0;
    }
    body.lines()
        .find_map(|l| l.strip_prefix("kelp_mds_sessions "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Small files a mount creates keep their data with their inode (no data object): another
/// mount reads them, a write that makes one grow past the inline limit, an append from
/// another mount, a punch and an O_DIRECT write move the data out to the file's object
/// first, a truncate cuts it; an fsync'd one survives kill -9 of the MDS; removed, their
/// inline data goes with them.
#[test]
fn small_files_keep_their_data_inline_and_move_it_out_when_written_otherwise() {
    let c = fs_cluster();
    let (mut daemons, first) = active_and_standby(&c);
    let a = Mount::with(&c, "mnt-a", &["--fs", "kelpfs"]);
    let b = Mount::with(&c, "mnt-b", &["--fs", "kelpfs"]);
    std::fs::create_dir(a.p("d")).unwrap();
    // sizes up to the limit (4 096 bytes) stay inline, one byte past it does not
    let sizes = [1usize, 100, 913, 2048, 4095, 4096, 4097, 10_000];
    for (i, n) in sizes.iter().enumerate() {
        std::fs::write(a.p(&format!("d/f{i}")), heal_support::content(i as u64, *n)).unwrap();
    }
    // two writes that together pass the limit: the first is kept, then written out
    {
        let mut f = std::fs::File::create(a.p("d/grown")).unwrap();
        std::io::Write::write_all(&mut f, &[b'x'; 3000]).unwrap();
        std::io::Write::write_all(&mut f, &[b'y'; 3000]).unwrap();
    }
    let inos = inos_in(&a.p("d"));
    let objects_of = |name: &str| -> usize {
        let prefix = format!("{:x}.", inos[name]);
        objects_named(&c, "fs.data", &prefix).len()
    };
    for (i, n) in sizes.iter().enumerate() {
        let want = heal_support::content(i as u64, *n);
        assert_eq!(
            std::fs::read(b.p(&format!("d/f{i}"))).unwrap(),
            want,
            "f{i}"
        );
        let objects = objects_of(&format!("f{i}"));
        if *n <= 4096 {
            assert_eq!(objects, 0, "f{i} ({n} bytes) has a data object");
        } else {
            assert_eq!(objects, 1, "f{i} ({n} bytes)");
        }
    }
    let mut grown = vec![b'x'; 3000];
    grown.extend_from_slice(&[b'y'; 3000]);
    assert_eq!(std::fs::read(b.p("d/grown")).unwrap(), grown);
    assert_eq!(objects_of("grown"), 1);
    // the next checkpoint writes the inline data back into a shard (and the MDS lets go of
    // what it wrote: its memory holds inline data only until then)
    wait_objects(&c, "fs.meta", 30, |objects| {
        objects.lines().any(|o| o.starts_with("mds.inline."))
    });
    heal_support::wait(
        "the MDS to let go of the inline data written back",
        Duration::from_secs(30),
        || (mds_stats(&a)["inline_bytes"].as_u64()? == 0).then_some(()),
    );

    // mount b appends to an inline file: the data moves out, both mounts see the whole
    let mut f1 = heal_support::content(1, 100).to_vec();
    {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(b.p("d/f1"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"appended by b").unwrap();
    }
    f1.extend_from_slice(b"appended by b");
    assert_eq!(std::fs::read(a.p("d/f1")).unwrap(), f1);
    assert_eq!(std::fs::read(b.p("d/f1")).unwrap(), f1);
    assert_eq!(objects_of("f1"), 1);

    // a truncate cuts inline data; growing again reads zeros after what is left
    let f2 = a.p("d/f2");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f2)
        .unwrap()
        .set_len(10)
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f2)
        .unwrap()
        .set_len(30)
        .unwrap();
    let mut want = heal_support::content(2, 913)[..10].to_vec();
    want.resize(30, 0);
    assert_eq!(std::fs::read(b.p("d/f2")).unwrap(), want);
    assert_eq!(objects_of("f2"), 0, "a truncate wrote a data object");

    // a punched hole and an O_DIRECT write go through the object
    b.sh("fallocate -p -o 100 -l 50 d/f3");
    let mut f3 = heal_support::content(3, 2048).to_vec();
    f3[100..150].fill(0);
    assert_eq!(std::fs::read(a.p("d/f3")).unwrap(), f3);
    a.sh("python3 -c \"import os, mmap
fd = os.open('d/f4', os.O_WRONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
buf.write(b'd' * 4096)
os.pwrite(fd, buf, 0)
os.close(fd)\"");
    assert_eq!(std::fs::read(b.p("d/f4")).unwrap(), vec![b'd'; 4096]);
    assert_eq!(objects_of("f4"), 1);

    // an fsync'd small file survives kill -9 of the active MDS
    {
        let mut f = std::fs::File::create(a.p("d/synced")).unwrap();
        std::io::Write::write_all(&mut f, b"fsync'd inline").unwrap();
        f.sync_all().unwrap();
    }
    daemons.get_mut(&first).unwrap().kill9();
    let second = wait_active(&c, Some(&first));
    assert_ne!(first, second);
    assert_eq!(std::fs::read(b.p("d/synced")).unwrap(), b"fsync'd inline");
    assert_eq!(
        std::fs::read(a.p("d/f5")).unwrap(),
        heal_support::content(5, 4096)
    );

    // removed: no data object was ever made for them, and their inline data goes too
    std::fs::remove_dir_all(a.p("d")).unwrap();
    wait_objects(&c, "fs.meta", 60, |objects| {
        objects
            .lines()
            .filter(|o| o.starts_with("mds.inline."))
            .all(|o| {
                c.cli(&["rados", "-p", "fs.meta", "listomapvals", o])
                    .trim()
                    .is_empty()
            })
    });
}
