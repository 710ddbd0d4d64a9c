//! The file system end to end: a real cluster, a real MDS (`kelp mds run`) and real FUSE
//! mounts (`kelp fs mount`), exercised with ordinary tools (cp, mv, ln, chmod, chown, touch,
//! truncate, tar, ls, du, xattrs through python), the rename rules, permissions as a non-root
//! user, random reads/writes/truncates checked against a model, two mounts seeing each
//! other's changes, and fsync'd data surviving kill -9 of the MDS.
//!
//! Every mount is unmounted when its guard drops, also on panic (a leaked FUSE mount would
//! block later runs), and every daemon this test starts is killed.

#![allow(clippy::unwrap_used)]

mod fs_support;
mod heal_support;

use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

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
    // rename rules
    a.sh("mkdir -p r/full r/empty && touch r/full/x r/file");
    assert_eq!(
        errno_of(std::fs::rename(a.p("r/empty"), a.p("r/full"))),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno_of(std::fs::rename(a.p("r"), a.p("r/empty/in"))),
        libc::EINVAL
    );
    assert_eq!(
        errno_of(std::fs::rename(a.p("r/file"), a.p("r/empty"))),
        libc::EISDIR
    );
    assert_eq!(
        errno_of(std::fs::rename(a.p("r/empty"), a.p("r/file"))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno_of(std::fs::remove_dir(a.p("r/full"))),
        libc::ENOTEMPTY
    );
    std::fs::rename(a.p("r/full/x"), a.p("d/e/x")).unwrap();
    std::fs::rename(a.p("r/full"), a.p("r/empty")).unwrap(); // over an empty directory
    assert!(a.p("d/e/x").exists() && !a.p("r/full").exists());

    // permissions as a non-root user
    a.sh("mkdir -p priv && chmod 700 priv && echo s > priv/secret && mkdir -p open && chmod 1777 open");
    let as_user = |script: &str| {
        Command::new("setpriv")
            .args([
                "--reuid=4321",
                "--regid=4321",
                "--clear-groups",
                "bash",
                "-c",
                script,
            ])
            .current_dir(&a.dir)
            .output()
            .unwrap()
    };
    let denied = as_user("cat priv/secret");
    assert!(
        !denied.status.success(),
        "a 0700 directory of root let uid 4321 in"
    );
    assert!(String::from_utf8_lossy(&denied.stderr).contains("Permission denied"));
    let mine = as_user("echo mine > open/mine && stat -c '%u %g' open/mine");
    assert!(
        mine.status.success(),
        "{}",
        String::from_utf8_lossy(&mine.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&mine.stdout).trim(), "4321 4321");
    let del = as_user("rm -f h");
    assert!(
        !del.status.success(),
        "uid 4321 removed root's file from a 0755 directory"
    );

    // random reads, writes and truncates against a model (objects are 4 MiB: cross them)
    let path = a.p("model");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut x: u64 = 0x9e37_79b9;
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for step in 0..120 {
        match rnd(4) {
            0 | 1 => {
                let off = rnd(9 << 20);
                let len = 1 + rnd(300_000) as usize;
                let byte = (step % 251) as u8 + 1;
                let data = vec![byte; len];
                f.write_all_at(&data, off).unwrap();
                let end = off as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            2 => {
                let size = rnd(10 << 20);
                f.set_len(size).unwrap();
                model.resize(size as usize, 0);
            }
            _ => {
                let off = rnd(model.len() as u64 + 1);
                let len = rnd(1 << 20) as usize;
                let mut buf = vec![0u8; len];
                let mut got = 0;
                while got < len {
                    let n = f.read_at(&mut buf[got..], off + got as u64).unwrap();
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                let want_end = (off as usize + len).min(model.len());
                let want = &model[(off as usize).min(want_end)..want_end];
                assert_eq!(&buf[..got], want, "step {step}: read {len} at {off}");
            }
        }
        assert_eq!(
            f.metadata().unwrap().len(),
            model.len() as u64,
            "step {step}"
        );
    }
    f.sync_all().unwrap();
    drop(f);
    assert!(
        std::fs::read(&path).unwrap() == model,
        "whole file differs from the model"
    );
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

#[test]
fn standby_mds_takes_over_from_a_killed_active_one() {
    let c = fs_cluster();
    c.cli(&["fs", "new", "kelpfs", "fs.meta", "fs.data"]);
    let mut daemons = std::collections::BTreeMap::new();
    daemons.insert("a".to_string(), start_mds_with(&c, "a", &[]));
    daemons.insert("b".to_string(), start_mds_with(&c, "b", &[]));
    let first = wait_active(&c, None);
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
