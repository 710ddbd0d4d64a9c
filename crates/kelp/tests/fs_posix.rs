//! POSIX semantics of a real mount (`kelp fs mount` on a real cluster and MDS), the ground
//! pjdfstest and fsx cover, in the project's own terms so that CI runs it: permissions and
//! ownership as a non-root user (setpriv), setgid directories, sticky directories, chown
//! clearing setuid/setgid, hard and symbolic links (ELOOP), rename rules, truncate,
//! timestamps (utimensat, UTIME_NOW, what updates mtime/ctime), xattrs with their flags, name
//! lengths, fifos and device nodes; and an fsx-style random read/write/truncate loop checked
//! against an in-memory model, across reopen and a second mount.

#![allow(clippy::unwrap_used)]

mod fs_support;
mod heal_support;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use fs_support::*;

/// Runs `script` with bash as uid/gid `id` (no supplementary groups) in `dir`.
fn as_user(dir: &Path, id: u32, script: &str) -> Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={id}"),
            &format!("--regid={id}"),
            "--clear-groups",
            "bash",
            "-c",
            script,
        ])
        .current_dir(dir)
        .output()
        .unwrap()
}

fn ok_as(dir: &Path, id: u32, script: &str) -> String {
    let o = as_user(dir, id, script);
    assert!(
        o.status.success(),
        "`{script}` as uid {id} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn refused_as(dir: &Path, id: u32, script: &str, why: &str) {
    let o = as_user(dir, id, script);
    assert!(!o.status.success(), "uid {id} could: {why} (`{script}`)");
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode()
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// utimensat(2) on `p` with (seconds, nanoseconds) pairs (UTIME_NOW / UTIME_OMIT allowed).
fn utimensat(p: &Path, atime: (i64, i64), mtime: (i64, i64)) -> i32 {
    let times = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    let c = c_path(p);
    // SAFETY: c is a valid C string and times points at two timespecs.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    if rc == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

fn sleep_tick() {
    // timestamps are compared for change: let the clock move visibly
    std::thread::sleep(std::time::Duration::from_millis(20));
}

#[test]
fn posix_semantics_on_a_mount() {
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let m = Mount::new(&c, "mnt");
    let d = m.dir.clone();

    // --- permissions and ownership as a non-root user
    m.sh("mkdir -m 0777 pub && mkdir -m 0700 priv && echo s > priv/secret && chmod 0755 .");
    refused_as(
        &d,
        4321,
        "cat priv/secret",
        "read below a 0700 directory of root",
    );
    refused_as(&d, 4321, "ls priv", "list a 0700 directory of root");
    ok_as(&d, 4321, "echo mine > pub/mine && chmod 0600 pub/mine");
    let mine = std::fs::metadata(m.p("pub/mine")).unwrap();
    assert_eq!(
        (mine.uid(), mine.gid(), mine.mode() & 0o7777),
        (4321, 4321, 0o600)
    );
    refused_as(&d, 4322, "cat pub/mine", "read another user's 0600 file");
    refused_as(
        &d,
        4322,
        "echo x >> pub/mine",
        "write another user's 0600 file",
    );
    refused_as(&d, 4322, "chmod 0666 pub/mine", "chmod another user's file");
    refused_as(
        &d,
        4321,
        "chown 4322 pub/mine",
        "give a file away (only root may)",
    );
    refused_as(
        &d,
        4321,
        "chgrp 4322 pub/mine",
        "chgrp to a group it is not in",
    );
    ok_as(&d, 4321, "chgrp 4321 pub/mine"); // its own group: allowed
    refused_as(&d, 4321, "touch newfile", "create in root's 0755 directory");
    // the owner may read/write through its permission bits only
    ok_as(&d, 4321, "chmod 0200 pub/mine && echo more >> pub/mine");
    refused_as(&d, 4321, "cat pub/mine", "read its own 0200 file");
    ok_as(&d, 4321, "chmod 0600 pub/mine");
    // group and other bits
    m.sh("echo g > pub/grp && chown 0:4500 pub/grp && chmod 0640 pub/grp");
    refused_as(&d, 4321, "cat pub/grp", "read a 0640 file of another group");
    let o = Command::new("setpriv")
        .args([
            "--reuid=4321",
            "--regid=4321",
            "--groups=4500",
            "cat",
            "pub/grp",
        ])
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "a member of the file's group could not read it"
    );
    // execute permission on a directory is needed to traverse it
    m.sh("mkdir -m 0776 pub/noexec && echo t > pub/noexec/t");
    refused_as(
        &d,
        4321,
        "cat pub/noexec/t",
        "traverse a directory without x",
    );

    // setgid directory: new entries take its group, new subdirectories keep the bit
    m.sh("mkdir -m 2777 sg && chown 0:4600 sg");
    ok_as(&d, 4321, "touch sg/f && mkdir sg/sub");
    assert_eq!(std::fs::metadata(m.p("sg/f")).unwrap().gid(), 4600);
    let sub = std::fs::metadata(m.p("sg/sub")).unwrap();
    assert_eq!(sub.gid(), 4600);
    assert_ne!(
        sub.mode() & libc::S_ISGID,
        0,
        "a subdirectory of a setgid directory lost the bit"
    );

    // sticky directory: only the owner of an entry (or of the directory) removes or renames it
    m.sh("mkdir -m 1777 tmp");
    ok_as(&d, 4321, "touch tmp/a && mkdir tmp/ad");
    refused_as(
        &d,
        4322,
        "rm -f tmp/a",
        "remove another user's file from a sticky directory",
    );
    refused_as(
        &d,
        4322,
        "mv tmp/a tmp/b",
        "rename another user's file in a sticky directory",
    );
    refused_as(
        &d,
        4322,
        "rmdir tmp/ad",
        "remove another user's directory from a sticky one",
    );
    ok_as(&d, 4322, "touch tmp/c && rm tmp/c");
    ok_as(&d, 4321, "rm tmp/a && rmdir tmp/ad");

    // chown clears setuid/setgid of a regular file (also root's chown); so do a write, a
    // truncate and an fallocate by another user, not a write of root's; a setgid bit without
    // group execute (a mandatory-locking mark) survives a chown. (Root's step, another user's
    // step, the mode bits then.)
    for (root, user, want, why) in [
        (
            "touch su && chmod 6755 su && chown 1000:1000 su",
            None,
            0o755,
            "chown left setuid/setgid set",
        ),
        (
            "chmod 4777 su",
            Some("echo w >> su"),
            0o777,
            "a write by another user left setuid set",
        ),
        (
            "chmod 6777 su && echo r >> su",
            None,
            0o6777,
            "root's write cleared setuid",
        ),
        (
            "chmod 6777 su",
            Some("truncate -s 3 su"),
            0o777,
            "a truncate by another user left setuid/setgid set",
        ),
        (
            "chmod 6777 su",
            Some("fallocate -l 8192 su"),
            0o777,
            "an fallocate by another user left setuid/setgid set",
        ),
        (
            "chmod 2745 su && chown 1001 su",
            None,
            0o2745,
            "chown cleared setgid without group execute",
        ),
    ] {
        m.sh(root);
        if let Some(script) = user {
            ok_as(&d, 4321, script);
        }
        assert_eq!(mode(&m.p("su")) & 0o7777, want, "{why}");
    }
    // the fallocate grew the file (nothing after it changed the size)
    assert_eq!(std::fs::metadata(m.p("su")).unwrap().len(), 8192);
    // fallocate's other modes: KEEP_SIZE leaves the size, a punch zeroes its range, the rest
    // are refused (EOPNOTSUPP) and change nothing
    m.sh("head -c 8192 /dev/urandom > fa && fallocate -n -l 65536 fa && fallocate -p -o 1000 -l 2000 fa");
    let fa = std::fs::read(m.p("fa")).unwrap();
    assert_eq!(fa.len(), 8192);
    assert!(fa[1000..3000].iter().all(|b| *b == 0), "the punched range");
    assert!(fa[..1000].iter().any(|b| *b != 0) && fa[3000..].iter().any(|b| *b != 0));
    let o = Command::new("fallocate")
        .args(["-z", "-o", "0", "-l", "10"])
        .arg(m.p("fa"))
        .output()
        .unwrap();
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not supported"),
        "a zero-range fallocate: {o:?}"
    );
    assert_eq!(std::fs::read(m.p("fa")).unwrap(), fa);
    // chmod by a non-member of the group drops setgid
    m.sh("touch pub/sg2 && chown 4321:5000 pub/sg2");
    ok_as(&d, 4321, "chmod 2755 pub/sg2");
    assert_eq!(
        mode(&m.p("pub/sg2")) & 0o7777,
        0o755,
        "setgid kept on a file whose group the owner is not in"
    );
    let mut pm = std::fs::metadata(m.p("pub/sg2")).unwrap().permissions();
    pm.set_mode(0o2755);
    std::fs::set_permissions(m.p("pub/sg2"), pm).unwrap(); // root may
    assert_eq!(mode(&m.p("pub/sg2")) & 0o7777, 0o2755);

    // --- links
    m.sh("echo data > l0 && ln l0 l1 && ln l1 l2 && ln -s l0 s0 && ln -s nowhere dangling");
    assert_eq!(std::fs::metadata(m.p("l0")).unwrap().nlink(), 3);
    assert_eq!(
        std::fs::metadata(m.p("l0")).unwrap().ino(),
        std::fs::metadata(m.p("l2")).unwrap().ino()
    );
    std::fs::remove_file(m.p("l0")).unwrap();
    assert_eq!(std::fs::metadata(m.p("l1")).unwrap().nlink(), 2);
    assert_eq!(std::fs::read(m.p("l2")).unwrap(), b"data\n");
    assert_eq!(errno_of(std::fs::read(m.p("s0"))), libc::ENOENT); // its target went
    assert_eq!(
        errno_of(std::fs::hard_link(m.p("pub"), m.p("publink"))),
        libc::EPERM
    );
    assert_eq!(
        errno_of(std::fs::hard_link(m.p("l1"), m.p("l2"))),
        libc::EEXIST
    );
    assert_eq!(
        std::fs::read_link(m.p("dangling")).unwrap(),
        Path::new("nowhere")
    );
    assert_eq!(
        std::fs::symlink_metadata(m.p("dangling")).unwrap().len(),
        "nowhere".len() as u64
    );
    m.sh("ln -s loop2 loop1 && ln -s loop1 loop2");
    assert_eq!(errno_of(std::fs::read(m.p("loop1"))), libc::ELOOP);
    let long_target = "t".repeat(1000);
    std::os::unix::fs::symlink(&long_target, m.p("longlink")).unwrap();
    assert_eq!(
        std::fs::read_link(m.p("longlink")).unwrap(),
        Path::new(&long_target)
    );

    // --- name lengths
    let max = "n".repeat(255);
    std::fs::write(m.p(&max), b"").unwrap();
    assert!(m.p(&max).exists());
    let too_long = "n".repeat(256);
    assert_eq!(
        errno_of(std::fs::write(m.p(&too_long), b"")),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        errno_of(std::fs::create_dir(m.p(&too_long))),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        errno_of(std::fs::rename(m.p(&max), m.p(&too_long))),
        libc::ENAMETOOLONG
    );
    // also in a directory the mount made (it answers lookups of missing names itself)
    std::fs::create_dir(m.p("made")).unwrap();
    let in_made = m.p(&format!("made/{too_long}"));
    assert_eq!(errno_of(std::fs::metadata(&in_made)), libc::ENAMETOOLONG);
    assert_eq!(errno_of(std::fs::write(&in_made, b"")), libc::ENAMETOOLONG);
    assert_eq!(
        errno_of(std::fs::metadata(m.p(&format!("made/{max}")))),
        libc::ENOENT
    );

    // --- rename rules
    m.sh("mkdir -p rn/a/b rn/e && echo 1 > rn/f1 && echo 2 > rn/f2 && ln rn/f1 rn/f1h");
    std::fs::rename(m.p("rn/f1"), m.p("rn/f2")).unwrap(); // replaces the file
    assert_eq!(std::fs::read(m.p("rn/f2")).unwrap(), b"1\n");
    assert_eq!(std::fs::metadata(m.p("rn/f2")).unwrap().nlink(), 2);
    std::fs::rename(m.p("rn/f2"), m.p("rn/f1h")).unwrap(); // links of one file: no-op
    assert!(m.p("rn/f2").exists() && m.p("rn/f1h").exists());
    assert_eq!(
        errno_of(std::fs::rename(m.p("rn/a"), m.p("rn/a/b/c"))),
        libc::EINVAL
    );
    assert_eq!(
        errno_of(std::fs::rename(m.p("rn/e"), m.p("rn/a"))),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno_of(std::fs::rename(m.p("rn/f2"), m.p("rn/e"))),
        libc::EISDIR
    );
    assert_eq!(
        errno_of(std::fs::rename(m.p("rn/e"), m.p("rn/f2"))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno_of(std::fs::rename(m.p("rn/none"), m.p("rn/x"))),
        libc::ENOENT
    );
    let nlink_before = std::fs::metadata(m.p("rn")).unwrap().nlink();
    std::fs::rename(m.p("rn/a/b"), m.p("rn/b")).unwrap(); // a directory moves up
    assert_eq!(
        std::fs::metadata(m.p("rn")).unwrap().nlink(),
        nlink_before + 1
    );
    assert_eq!(std::fs::metadata(m.p("rn/a")).unwrap().nlink(), 2);
    std::fs::rename(m.p("rn/b"), m.p("rn/e")).unwrap(); // over an empty directory
    assert_eq!(std::fs::metadata(m.p("rn")).unwrap().nlink(), nlink_before);
    assert!(!m.p("rn/b").exists() && m.p("rn/e").is_dir());
    // a renamed directory's ".." follows it
    std::fs::create_dir(m.p("rn/e/inner")).unwrap();
    std::fs::rename(m.p("rn/e"), m.p("pub/moved")).unwrap();
    assert_eq!(
        std::fs::metadata(m.p("pub/moved/inner/../.."))
            .unwrap()
            .ino(),
        std::fs::metadata(m.p("pub")).unwrap().ino()
    );

    // --- truncate
    std::fs::write(m.p("tr"), vec![7u8; 10_000]).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("tr"))
        .unwrap();
    f.set_len(100).unwrap();
    f.set_len(5000).unwrap();
    drop(f);
    let t = std::fs::read(m.p("tr")).unwrap();
    assert_eq!(t.len(), 5000);
    assert!(t[..100].iter().all(|b| *b == 7) && t[100..].iter().all(|b| *b == 0));
    let ro = std::fs::File::open(m.p("tr")).unwrap();
    assert_ne!(
        errno_of(ro.set_len(0)),
        0,
        "ftruncate of a read-only descriptor"
    );
    assert_eq!(
        errno_of(std::fs::File::open(m.p("pub")).and_then(|f| f.set_len(0))),
        libc::EINVAL
    );
    refused_as(&d, 4321, "truncate -s 0 tr", "truncate root's 0644 file");
    m.sh(": > tr"); // O_TRUNC
    assert_eq!(std::fs::metadata(m.p("tr")).unwrap().len(), 0);

    // --- timestamps
    std::fs::write(m.p("ts"), b"x").unwrap();
    assert_eq!(
        utimensat(&m.p("ts"), (1_000_000_000, 5), (1_100_000_000, 7)),
        0
    );
    let t = std::fs::metadata(m.p("ts")).unwrap();
    assert_eq!((t.atime(), t.mtime()), (1_000_000_000, 1_100_000_000));
    assert_eq!(
        utimensat(&m.p("ts"), (0, libc::UTIME_OMIT), (1_200_000_000, 0)),
        0
    );
    let t = std::fs::metadata(m.p("ts")).unwrap();
    assert_eq!((t.atime(), t.mtime()), (1_000_000_000, 1_200_000_000));
    assert_eq!(
        utimensat(&m.p("ts"), (0, libc::UTIME_NOW), (0, libc::UTIME_NOW)),
        0
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let t = std::fs::metadata(m.p("ts")).unwrap();
    assert!((now - t.mtime()).abs() < 30 && (now - t.atime()).abs() < 30);
    // only the owner sets explicit times; a writer may set "now"
    m.sh("chmod 0666 ts");
    refused_as(
        &d,
        4321,
        "touch -d '2001-01-01' ts",
        "set explicit times on root's file",
    );
    ok_as(&d, 4321, "touch ts");
    // a write moves mtime and ctime; chmod moves ctime only; a new entry moves the directory's
    let before = std::fs::metadata(m.p("ts")).unwrap();
    sleep_tick();
    std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("ts"))
        .unwrap()
        .write_all_at(b"more", 1)
        .unwrap();
    let after = std::fs::metadata(m.p("ts")).unwrap();
    assert!(
        after.modified().unwrap() > before.modified().unwrap(),
        "write left mtime"
    );
    assert!(after.ctime_nsec() != before.ctime_nsec() || after.ctime() > before.ctime());
    sleep_tick();
    m.sh("chmod 0644 ts");
    let chm = std::fs::metadata(m.p("ts")).unwrap();
    assert_eq!(
        chm.modified().unwrap(),
        after.modified().unwrap(),
        "chmod moved mtime"
    );
    assert!((chm.ctime(), chm.ctime_nsec()) > (after.ctime(), after.ctime_nsec()));
    let dir_before = std::fs::metadata(m.p("pub")).unwrap();
    sleep_tick();
    std::fs::write(m.p("pub/newentry"), b"").unwrap();
    let dir_after = std::fs::metadata(m.p("pub")).unwrap();
    assert!(dir_after.modified().unwrap() > dir_before.modified().unwrap());

    // --- xattrs, with XATTR_CREATE / XATTR_REPLACE
    m.sh(
        "python3 -c \"
import os, errno
os.setxattr('ts', 'user.a', b'1')
assert os.getxattr('ts', 'user.a') == b'1'
try:
    os.setxattr('ts', 'user.a', b'2', os.XATTR_CREATE); raise SystemExit('XATTR_CREATE replaced')
except OSError as e:
    assert e.errno == errno.EEXIST, e
try:
    os.setxattr('ts', 'user.b', b'2', os.XATTR_REPLACE); raise SystemExit('XATTR_REPLACE created')
except OSError as e:
    assert e.errno == errno.ENODATA, e
os.setxattr('ts', 'user.a', b'3', os.XATTR_REPLACE)
os.setxattr('ts', 'user.big', bytes(range(256)) * 64)
assert os.getxattr('ts', 'user.big') == bytes(range(256)) * 64
os.setxattr('ts', 'user.empty', b'')
assert os.getxattr('ts', 'user.empty') == b''
assert sorted(n for n in os.listxattr('ts') if n.startswith('user.')) == ['user.a', 'user.big', 'user.empty']
os.removexattr('ts', 'user.big')
try:
    os.getxattr('ts', 'user.big'); raise SystemExit('removed xattr still read')
except OSError as e:
    assert e.errno == errno.ENODATA, e
try:
    os.removexattr('ts', 'user.none'); raise SystemExit('removed a missing xattr')
except OSError as e:
    assert e.errno == errno.ENODATA, e
os.setxattr('pub', 'user.dir', b'on a directory')
assert os.getxattr('pub', 'user.dir') == b'on a directory'
\"",
    );
    // another user may not set xattrs on root's 0644 file
    refused_as(
        &d,
        4321,
        "python3 -c \"import os; os.setxattr('ts', 'user.x', b'1')\"",
        "set an xattr on a file it cannot write",
    );

    // --- fifos and device nodes
    m.sh("mkfifo fifo && mknod cdev c 1 3 && mknod bdev b 7 0");
    let ft = |p: &str| std::fs::symlink_metadata(m.p(p)).unwrap().mode() & libc::S_IFMT;
    assert_eq!(ft("fifo"), libc::S_IFIFO);
    assert_eq!(ft("cdev"), libc::S_IFCHR);
    assert_eq!(ft("bdev"), libc::S_IFBLK);
    assert_eq!(
        std::fs::symlink_metadata(m.p("cdev")).unwrap().rdev(),
        libc::makedev(1, 3)
    );
    // a fifo passes data between two openers on the mount
    let out = m.sh("(echo through > fifo &) ; cat fifo");
    assert_eq!(out, "through\n");
    assert_eq!(errno_of(std::fs::create_dir(m.p("fifo"))), libc::EEXIST);
}

/// fsx in miniature: random writes, reads, truncates (down and up), appends, reopens and
/// fsyncs on one file, every read and the size checked against an in-memory model, and the
/// final content checked from a second mount.
#[test]
fn random_io_matches_a_model() {
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let a = Mount::new(&c, "mnt-a");
    let path = a.p("fsx.file");
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap()
    };
    let mut f = open();
    let mut model: Vec<u8> = Vec::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    };
    // sizes around the 4 MiB object boundary, as fsx's -l 1048576 does around pages
    const MAX: u64 = 6 << 20;
    for step in 0..600u32 {
        let op = rnd(100);
        if op < 35 {
            let off = if rnd(4) == 0 {
                (4 << 20) - rnd(70_000)
            } else {
                rnd(MAX)
            };
            let big = rnd(3) == 0;
            let len = 1 + rnd(if big { 200_000 } else { 5000 }) as usize;
            let data: Vec<u8> = (0..len)
                .map(|i| (step as usize * 31 + i * 7) as u8 | 1)
                .collect();
            f.write_all_at(&data, off).unwrap();
            let end = off as usize + len;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(&data);
        } else if op < 45 {
            let size = rnd(MAX);
            f.set_len(size).unwrap();
            model.resize(size as usize, 0);
        } else if op < 50 {
            let data = vec![(step % 200) as u8 + 3; 1 + rnd(3000) as usize];
            let mut app = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            std::io::Write::write_all(&mut app, &data).unwrap();
            model.extend_from_slice(&data);
        } else if op < 54 {
            f.sync_all().unwrap();
            drop(f);
            f = open();
        } else {
            let off = rnd(model.len() as u64 + 10_000);
            let len = rnd(300_000) as usize;
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < len {
                let n = f.read_at(&mut buf[got..], off + got as u64).unwrap();
                if n == 0 {
                    break;
                }
                got += n;
            }
            let start = (off as usize).min(model.len());
            let end = (off as usize + len).min(model.len());
            assert_eq!(
                got,
                end - start,
                "step {step}: read of {len} at {off} got {got}"
            );
            if buf[..got] != model[start..end] {
                let first = (0..got).find(|i| buf[*i] != model[start + i]).unwrap();
                panic!(
                    "step {step}: read of {len} at {off} differs from byte {} (got {}, want {})",
                    off as usize + first,
                    buf[first],
                    model[start + first]
                );
            }
        }
        assert_eq!(
            f.metadata().unwrap().len(),
            model.len() as u64,
            "step {step}: size"
        );
    }
    f.sync_all().unwrap();
    drop(f);
    assert!(
        std::fs::read(&path).unwrap() == model,
        "the file differs from the model"
    );
    let b = Mount::new(&c, "mnt-b");
    assert!(
        std::fs::read(b.p("fsx.file")).unwrap() == model,
        "another mount reads other content"
    );
}

/// O_DIRECT on a mount, checked by Python against a model: aligned direct writes and reads
/// (mmap-aligned buffers) at random offsets; a cached open of the same file on the same mount
/// reads every direct write at once (the kernel's pages are dropped on a direct write); a
/// second mount reads the same content, through its page cache and directly, also after
/// further direct writes on the first.
const DIRECT_IO_MODEL: &str = r#"
import mmap, os, random, sys

a, b = sys.argv[1], sys.argv[2]
BS = 4096
rnd = random.Random(29)
model = bytearray()
buf = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT wants

def put(fd, off, n, step):
    data = rnd.randbytes(n)
    buf[:n] = data
    w = os.pwritev(fd, [memoryview(buf)[:n]], off)
    assert w == n, f"step {step}: direct write of {n} at {off} wrote {w}"
    if len(model) < off + n:
        model.extend(bytes(off + n - len(model)))
    model[off:off + n] = data

def check(what, got, off, n):
    want = bytes(model[off:off + n])
    if got != want:
        first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), None)
        sys.exit(f"{what}: read of {n} at {off}: got {len(got)} bytes, want {len(want)}; "
                 f"first difference at {first}")

def direct_read(fd, off, n):
    r = os.preadv(fd, [memoryview(buf)[:n]], off)
    return bytes(buf[:r])

def whole(path, flags):
    fd = os.open(path, os.O_RDONLY | flags)
    out = bytearray()
    while True:
        chunk = direct_read(fd, len(out), 1 << 20) if flags else os.pread(fd, 1 << 20, len(out))
        if not chunk:
            break
        out += chunk
    os.close(fd)
    return bytes(out)

pa = os.path.join(a, "direct.file")
fd = os.open(pa, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
cached = os.open(pa, os.O_RDWR)
for step in range(300):
    op = rnd.randrange(10)
    if op < 5:
        put(fd, rnd.randrange(2048) * BS, rnd.randrange(1, 65) * BS, step)
    elif op < 7:
        off, n = rnd.randrange(2100) * BS, rnd.randrange(1, 129) * BS
        check(f"step {step} direct", direct_read(fd, off, n), off, n)
    else:
        off, n = rnd.randrange(2100) * BS, rnd.randrange(1, 200_000)
        check(f"step {step} cached", os.pread(cached, n, off), off, n)
    size = os.fstat(fd).st_size
    assert size == len(model), f"step {step}: size {size}, want {len(model)}"
os.fsync(fd)

pb = os.path.join(b, "direct.file")
check("second mount, cached", whole(pb, 0), 0, len(model))
keep_b = os.open(pb, os.O_RDONLY)
check("second mount, cached open", os.pread(keep_b, len(model), 0), 0, len(model))
for step in range(20):
    put(fd, rnd.randrange(2048) * BS, rnd.randrange(1, 17) * BS, 1000 + step)
    check(f"second mount after direct write {step}", os.pread(keep_b, len(model), 0), 0,
          len(model))
check("second mount, direct", whole(pb, os.O_DIRECT), 0, len(model))
check("first mount, direct", whole(pa, os.O_DIRECT), 0, len(model))
os.close(keep_b)
os.close(cached)
os.close(fd)
print(len(model))
"#;

#[test]
fn direct_io_bypasses_the_page_cache_and_stays_coherent() {
    let c = fs_cluster();
    let _mds = start_mds(&c, "a");
    let a = Mount::new(&c, "mnt-a");
    let b = Mount::new(&c, "mnt-b");
    let out = Command::new("python3")
        .args(["-c", DIRECT_IO_MODEL])
        .arg(&a.dir)
        .arg(&b.dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "direct I/O model: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let size: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(size > 1 << 20, "the model file is only {size} bytes");
    assert_eq!(std::fs::metadata(b.p("direct.file")).unwrap().len(), size);

    // fio as the benchmarks run it (libaio, direct, several requests in flight), every
    // block checked by CRC-32C after it is written
    let fio = Command::new("fio")
        .args([
            "--name=direct",
            "--filename=fio.file",
            "--size=16m",
            "--bsrange=4k-128k",
            "--rw=randwrite",
            "--ioengine=libaio",
            "--iodepth=16",
            "--direct=1",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--output-format=json",
        ])
        .current_dir(&a.dir)
        .output();
    let fio = match fio {
        Ok(o) => o,
        Err(e) => panic!("fio is needed for this test (.ci/run installs it): {e}"),
    };
    let text = String::from_utf8_lossy(&fio.stdout);
    assert!(
        fio.status.success(),
        "fio failed: {text}{}",
        String::from_utf8_lossy(&fio.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    assert_eq!(j["jobs"][0]["error"], 0, "fio reported an error: {text}");
    assert!(
        j["jobs"][0]["write"]["io_bytes"].as_u64().unwrap() >= 16 << 20,
        "fio wrote less than the file: {text}"
    );
    assert_eq!(std::fs::metadata(b.p("fio.file")).unwrap().len(), 16 << 20);
}
