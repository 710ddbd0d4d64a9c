//! Block images served by `kelp up`'s NBD server to real NBD clients: qemu-img (a qcow2 image
//! converted into a Kelp image and compared), qemu-io patterns, nbdcopy with four connections
//! both ways, nbdinfo, an nbdsh script for TRIM / WRITE_ZEROES / BLOCK_STATUS / FUA and bad
//! requests, fio's nbd engine verifying random writes while an OSD is killed, and a kill -9 of
//! the NBD server itself: every acknowledged write is read back after it restarts.

#![allow(clippy::unwrap_used)]

mod heal_support;
#[path = "../../kelp-nbd/tests/common/mod.rs"]
mod nbd_tools;

use std::process::Command;
use std::time::Duration;

use heal_support::Cluster;
use nbd_tools::{require_tool, run, run_ok};

const LIMIT: Duration = Duration::from_secs(120);

fn tools() {
    for (tool, pkg) in [
        ("qemu-img", "qemu-utils"),
        ("qemu-io", "qemu-utils"),
        ("nbdcopy", "libnbd-bin"),
        ("nbdinfo", "libnbd-bin"),
        ("nbdsh", "python3-libnbd"),
        ("fio", "fio"),
    ] {
        require_tool(tool, pkg);
    }
}

fn du_used(c: &Cluster, image: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&c.cli(&["rbd", "du", image, "--format", "json"])).unwrap();
    v["images"][0]["used_size"].as_u64().unwrap()
}

#[test]
fn qemu_and_libnbd_clients_use_kelp_images() {
    tools();
    let c = Cluster::up(3, 16);
    let tmp = tempfile::tempdir().unwrap();
    let t = |name: &str| tmp.path().join(name).display().to_string();

    // a qcow2 image made by qemu, converted into a Kelp image, compared
    let qcow = t("src.qcow2");
    run_ok(
        Command::new("qemu-img").args(["create", "-q", "-f", "qcow2", &qcow, "64M"]),
        LIMIT,
    );
    run_ok(
        Command::new("qemu-io").args([
            "-f",
            "qcow2",
            "-c",
            "write -P 0x5a 1M 3M",
            "-c",
            "write -P 0x11 40M 1M",
            &qcow,
        ]),
        LIMIT,
    );
    c.cli(&["rbd", "create", "vm", "--size", "64M"]);
    let vm = c.nbd_uri("rbd/vm");
    run_ok(
        Command::new("qemu-img").args(["convert", "-n", "-f", "qcow2", "-O", "raw", &qcow, &vm]),
        LIMIT,
    );
    run_ok(
        Command::new("qemu-img").args(["compare", "-f", "qcow2", "-F", "raw", &qcow, &vm]),
        LIMIT,
    );
    let info = run_ok(
        Command::new("qemu-img").args(["info", "--output=json", &vm]),
        LIMIT,
    );
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["virtual-size"], 64 << 20);
    // thin: only the two written objects hold data
    let used = du_used(&c, "vm");
    assert!(
        used <= 8 << 20,
        "a 4 MiB-per-object image stores {used} bytes"
    );
    // a changed byte makes compare fail (the check can fail)
    run_ok(
        Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x01 2M 512", &vm]),
        LIMIT,
    );
    let differ = run(
        Command::new("qemu-img").args(["compare", "-q", "-f", "qcow2", "-F", "raw", &qcow, &vm]),
        LIMIT,
    );
    assert_eq!(
        differ.status.code(),
        Some(1),
        "compare missed a changed byte"
    );

    // qemu-io patterns across object boundaries
    run_ok(
        Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            "write -P 0xab 3M 2M",
            "-c",
            "read -P 0xab 3M 2M",
            "-c",
            "read -P 0x11 40M 1M",
            &vm,
        ]),
        LIMIT,
    );

    // nbdcopy with four connections, both ways
    let data = nbd_tools::pattern(24 << 20, 5);
    let src = t("in.raw");
    std::fs::write(&src, &data).unwrap();
    c.cli(&["rbd", "create", "copy", "--size", "24M"]);
    let copy = c.nbd_uri("rbd/copy");
    run_ok(
        Command::new("nbdcopy").args(["--connections=4", &src, &copy]),
        LIMIT,
    );
    let out = t("out.raw");
    run_ok(
        Command::new("nbdcopy").args(["--connections=4", &copy, &out]),
        LIMIT,
    );
    assert!(
        std::fs::read(&out).unwrap() == data,
        "nbdcopy round trip differs"
    );

    // nbdinfo
    let j = run_ok(Command::new("nbdinfo").args(["--json", &copy]), LIMIT);
    let j: serde_json::Value = serde_json::from_str(&j).unwrap();
    let e = &j["exports"][0];
    assert_eq!(e["export-size"], 24 << 20);
    assert_eq!(e["can_multi_conn"], true);
    assert_eq!(e["can_trim"], true);
    assert_eq!(e["is_read_only"], false);
    // an image that does not exist is refused at the handshake
    let missing = run(Command::new("nbdinfo").arg(c.nbd_uri("rbd/nope")), LIMIT);
    assert!(!missing.status.success(), "a missing image was exported");

    // nbdsh: TRIM frees space (and `kelp rbd du` drops), holes are reported, WRITE_ZEROES,
    // FUA, and bad requests fail without breaking the connection
    let before = du_used(&c, "copy");
    let script = r#"
import nbd, errno
h.set_strict_mode(0)  # let bad requests reach the server
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(URI)
size = h.get_size()
h.trim(8 * 1024 * 1024, 8 * 1024 * 1024)
holes = []
def cb(meta, offset, entries, err):
    if meta != nbd.CONTEXT_BASE_ALLOCATION:
        return 0
    for i in range(0, len(entries), 2):
        holes.append((entries[i], entries[i+1]))
    return 0
h.block_status(4 * 1024 * 1024, 8 * 1024 * 1024, cb)
hole_bytes = 0
for (length, flags) in holes:
    if flags & nbd.STATE_HOLE:
        hole_bytes += length
assert hole_bytes >= 4 * 1024 * 1024, holes
assert h.pread(4096, 9 * 1024 * 1024) == bytes(4096)
h.zero(65536, 1024 * 1024)
assert h.pread(65536, 1024 * 1024) == bytes(65536)
h.zero(65536, 2 * 1024 * 1024, nbd.CMD_FLAG_NO_HOLE)
h.pwrite(b"\xee" * 4096, 3 * 1024 * 1024, nbd.CMD_FLAG_FUA)
assert h.pread(4096, 3 * 1024 * 1024) == b"\xee" * 4096
try:
    h.pread(4096, size)
    raise SystemExit("a read past the end succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EINVAL, (e.errnum, e.string)
h.flush()
assert h.pread(4096, 3 * 1024 * 1024) == b"\xee" * 4096
print("ok")
"#
    .replace("URI", &format!("{copy:?}"));
    let path = nbd_tools::path_for_nbdsh();
    let said = run_ok(
        Command::new("nbdsh")
            .env("PATH", path)
            .args(["-c", &script]),
        LIMIT,
    );
    assert!(said.contains("ok"), "{said}");
    let after = du_used(&c, "copy");
    assert!(
        after + (8 << 20) <= before,
        "TRIM of 8 MiB did not lower du: {before} -> {after}"
    );
}

#[test]
fn acknowledged_writes_survive_killing_the_nbd_server_and_an_osd() {
    tools();
    let c = Cluster::up(3, 16);
    c.cli(&["rbd", "create", "db", "--size", "32M"]);
    let uri = c.nbd_uri("rbd/db");

    // fio's nbd engine: random writes verified by CRC-32C, with osd.1 killed part-way through
    // and restarted after: fio must finish without a verify error.
    let killer = {
        let dir = c.dir.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            let pid: i32 = std::fs::read_to_string(dir.join("run").join("osd.1.pid"))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            // SAFETY: kill(2) on a daemon this test's cluster started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        })
    };
    let fio = run_ok(
        Command::new("fio").args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--size=32M",
            "--verify=crc32c",
            // no verify-state file left in the working directory
            "--verify_state_save=0",
            "--do_verify=1",
            "--verify_fatal=1",
            "--output-format=json",
        ]),
        Duration::from_secs(300),
    );
    killer.join().unwrap();
    let j: serde_json::Value = serde_json::from_str(&fio[fio.find('{').unwrap()..]).unwrap();
    assert_eq!(j["jobs"][0]["error"], 0, "fio reported an error: {fio}");
    c.start("osd.1");

    // acknowledged qemu-io writes, then kill -9 of the NBD server, restart, read back
    for (i, pat) in [0x21u8, 0x42, 0x63].iter().enumerate() {
        let off = format!("{}M", 1 + i * 5);
        run_ok(
            Command::new("qemu-io").args([
                "-f",
                "raw",
                "-c",
                &format!("write -P {pat:#x} {off} 1M"),
                &uri,
            ]),
            LIMIT,
        );
    }
    // a snapshot exported read-only keeps the bytes of its time
    c.cli(&["rbd", "snap", "create", "db@before"]);
    let snaps: serde_json::Value =
        serde_json::from_str(&c.cli(&["rbd", "snap", "ls", "db", "--format", "json"])).unwrap();
    assert_eq!(snaps[0]["name"], "before");
    qemu_io(&uri, &["write -P 0x99 1M 1M".into()]);
    let at_snap = c.nbd_uri("rbd/db@before");
    let j = run_ok(Command::new("nbdinfo").args(["--json", &at_snap]), LIMIT);
    assert!(j.contains("\"is_read_only\": true"), "{j}");
    run_ok(
        Command::new("qemu-io").args(["-r", "-f", "raw", "-c", "read -P 0x21 1M 1M", &at_snap]),
        LIMIT,
    );
    let refused = run(
        Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x1 0 4k", &at_snap]),
        LIMIT,
    );
    assert!(
        !refused.status.success() || !String::from_utf8_lossy(&refused.stdout).contains("wrote"),
        "a write to a snapshot export was accepted"
    );
    c.cli(&["rbd", "snap", "rollback", "db@before"]);

    c.sigkill("nbd.0");
    c.start("nbd.0");
    let again = c.nbd_uri("rbd/db");
    assert_eq!(again, uri, "the restarted server moved");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while run(Command::new("nbdinfo").arg(&again), LIMIT)
        .status
        .code()
        != Some(0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the NBD server did not come back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for (i, pat) in [0x21u8, 0x42, 0x63].iter().enumerate() {
        let off = format!("{}M", 1 + i * 5);
        run_ok(
            Command::new("qemu-io").args([
                "-f",
                "raw",
                "-c",
                &format!("read -P {pat:#x} {off} 1M"),
                &again,
            ]),
            LIMIT,
        );
    }
}

/// Waits for a `kelp nbd --data DIR` server to write its address; returns it.
fn server_addr(dir: &std::path::Path) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(a) = std::fs::read_to_string(dir.join("addr")) {
            return a.trim().to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kelp nbd did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn qemu_io(uri: &str, cmds: &[String]) {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    run_ok(c.arg(uri), LIMIT);
}

#[test]
fn two_servers_share_an_image_under_its_exclusive_lock() {
    tools();
    let c = Cluster::up(3, 16);
    c.cli(&["rbd", "create", "shared", "--size", "16M"]);
    let tmp = tempfile::tempdir().unwrap();
    // Killed on drop, so a failing test leaves no server behind.
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _second = Reaped(
        Command::new(env!("CARGO_BIN_EXE_kelp"))
            .args(["nbd", "-c", &c.conf(), "--bind", "127.0.0.1:0", "--data"])
            .arg(tmp.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let a = c.nbd_uri("rbd/shared");
    let b = format!("nbd://{}/rbd/shared", server_addr(tmp.path()));

    // The writers take turns: each write happens under the lock, none is lost.
    qemu_io(&a, &["write -P 0x11 0 1M".into()]);
    qemu_io(&b, &["write -P 0x22 1M 1M".into()]);
    qemu_io(&a, &["write -P 0x33 2M 1M".into()]);
    qemu_io(
        &b,
        &[
            "read -P 0x11 0 1M".into(),
            "read -P 0x22 1M 1M".into(),
            "read -P 0x33 2M 1M".into(),
        ],
    );

    // A client that keeps its connection to the cluster's server open after writing: that
    // server keeps the image open and holds the lock.
    let path = nbd_tools::path_for_nbdsh();
    let holder = |pat: u8, off: u32| {
        Command::new("nbdsh")
            .env("PATH", &path)
            .args([
                "-u",
                &a,
                "-c",
                &format!("import time\nh.pwrite(bytes([{pat}]) * 65536, {off})\ntime.sleep(600)"),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let lock_owner = || -> Option<String> {
        let v: serde_json::Value =
            serde_json::from_str(&c.cli(&["rbd", "lock", "ls", "shared", "--format", "json"]))
                .unwrap();
        v["instance"].as_str().map(str::to_string)
    };
    let wait_owner = || -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(o) = lock_owner() {
                return o;
            }
            assert!(std::time::Instant::now() < deadline, "nobody took the lock");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let _first = Reaped(holder(0x55, 4 << 20));
    let a_instance = wait_owner();
    let status = c.cli(&["rbd", "status", "shared", "--format", "json"]);
    assert!(
        status.contains(&a_instance),
        "the holder is not among the watchers: {status}"
    );
    // The other server asks for the lock; the live holder hands it over.
    qemu_io(&b, &["write -P 0x66 5M 1M".into()]);
    qemu_io(
        &b,
        &["read -P 0x55 4M 64k".into(), "read -P 0x66 5M 1M".into()],
    );
    // The cluster's server takes it back for a second writer of its own…
    let _again = Reaped(holder(0x77, 6 << 20));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while lock_owner().as_deref() != Some(a_instance.as_str()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the lock did not come back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // …and dies holding it: the other server fences it, then takes the lock and writes.
    c.sigkill("nbd.0");
    qemu_io(&b, &["write -P 0x44 3M 1M".into()]);
    let fenced = c.cli(&["osd", "blocklist", "ls"]);
    assert!(
        fenced.contains(&a_instance),
        "the dead holder {a_instance} was not blocklisted: {fenced}"
    );
    qemu_io(
        &b,
        &[
            "read -P 0x11 0 1M".into(),
            "read -P 0x22 1M 1M".into(),
            "read -P 0x33 2M 1M".into(),
            "read -P 0x44 3M 1M".into(),
            "read -P 0x55 4M 64k".into(),
            "read -P 0x66 5M 1M".into(),
            "read -P 0x77 6M 64k".into(),
        ],
    );
}

/// A read-write export of a clone: the server takes the image's exclusive lock when it opens
/// it (before any write) and then skips the clone's missing objects; once another client has
/// taken the lock and written, the server's reads see that write (no stale knowledge).
#[test]
fn a_clone_export_forgets_absent_objects_when_the_lock_moves() {
    tools();
    let c = Cluster::up(3, 16);
    c.cli(&["rbd", "create", "gold", "--size", "16M"]);
    let gold = c.nbd_uri("rbd/gold");
    qemu_io(&gold, &["write -P 0x5a 0 8M".into()]);
    c.cli(&["rbd", "snap", "create", "gold@s"]);
    c.cli(&["rbd", "snap", "protect", "gold@s"]);
    c.cli(&["rbd", "clone", "gold@s", "work"]);
    let uri = c.nbd_uri("rbd/work");
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    // A reader that keeps the export open (the server keeps the image and its lock).
    let _reader = Reaped(
        Command::new("nbdsh")
            .env("PATH", nbd_tools::path_for_nbdsh())
            .args([
                "-u",
                &uri,
                "-c",
                "import time\nh.pread(4096, 0)\ntime.sleep(600)",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let lock_owner = || -> Option<String> {
        let v: serde_json::Value =
            serde_json::from_str(&c.cli(&["rbd", "lock", "ls", "work", "--format", "json"]))
                .unwrap();
        v["instance"].as_str().map(str::to_string)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while lock_owner().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not take the clone's lock at open"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The server learns that the clone lacks object 0 (it reads the parent's bytes)…
    qemu_io(&uri, &["read -P 0x5a 0 4M".into()]);
    // …then another client takes the lock and writes 4 KiB at offset 0 (the bench's pattern,
    // byte i = (i mod 256) × 31).
    c.cli(&[
        "rbd",
        "bench",
        "work",
        "--io-type",
        "write",
        "--io-size",
        "4K",
        "--io-total",
        "4K",
    ]);
    let check = "want = bytes(((i % 256) * 31) % 256 for i in range(4096))\n\
                 got = h.pread(4096, 0)\n\
                 assert got == want, 'stale: %r' % got[:8]\n\
                 assert h.pread(4096, 4096) == bytes([0x5a]) * 4096";
    run_ok(
        Command::new("nbdsh")
            .env("PATH", nbd_tools::path_for_nbdsh())
            .args(["-u", &uri, "-c", check]),
        LIMIT,
    );
    // The parent is unchanged.
    qemu_io(&gold, &["read -P 0x5a 0 8M".into()]);
}
