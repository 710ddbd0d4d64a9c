//! Real NBD clients against `kelp-nbd` serving in-memory devices on 127.0.0.1 and on a Unix
//! socket: libnbd's nbdinfo, nbdcopy and nbdsh, QEMU's qemu-img and qemu-io, and fio's nbd
//! engine. A missing tool fails the test with its name (CI installs them: `.ci/run`).
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, pattern, require_tool, run, run_ok};
use kelp_nbd::{BlockDevice, ExportInfo, MemDevice, MemExports};

const MIB: u64 = 1 << 20;
const LIMIT: Duration = Duration::from_secs(120);

fn info(size: u64) -> ExportInfo {
    ExportInfo {
        size,
        read_only: false,
        can_trim: true,
        block_status: true,
        multi_conn: true,
        min_block: 512,
        preferred_block: 4096,
        max_block: 4 << 20,
        description: "test disk".into(),
    }
}

#[test]
fn nbdinfo_reports_size_flags_and_block_sizes() {
    require_tool("nbdinfo", "libnbd-bin");
    let ro = MemDevice::with_info(ExportInfo {
        read_only: true,
        multi_conn: false,
        can_trim: false,
        block_status: false,
        description: "read-only".into(),
        ..info(3 * MIB)
    });
    let srv = TestServer::start(
        MemExports::new()
            .with("disk", Arc::new(MemDevice::with_info(info(64 * MIB))))
            .with("ro", Arc::new(ro)),
    );
    for uri in [srv.uri("disk"), srv.unix_uri("disk")] {
        let out = run_ok(Command::new("nbdinfo").args(["--json", &uri]), LIMIT);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["protocol"], "newstyle-fixed", "{out}");
        assert_eq!(v["structured"], true, "{out}");
        let e = &v["exports"][0];
        assert_eq!(e["export-name"], "disk", "{out}");
        assert_eq!(e["export-size"], 64 * MIB, "{out}");
        assert_eq!(e["description"], "test disk", "{out}");
        assert_eq!(e["can_multi_conn"], true, "{out}");
        assert_eq!(e["block_size_minimum"], 512, "{out}");
        assert_eq!(e["block_size_preferred"], 4096, "{out}");
        assert_eq!(e["block_size_maximum"], 4 * MIB, "{out}");
        for flag in [
            "can_flush",
            "can_fua",
            "can_trim",
            "can_zero",
            "can_df",
            "can_cache",
        ] {
            assert_eq!(e[flag], true, "{flag}: {out}");
        }
        assert_eq!(e["is_read_only"], false, "{out}");
        assert_eq!(
            e["contexts"],
            serde_json::json!(["base:allocation"]),
            "{out}"
        );
    }
    let out = run_ok(
        Command::new("nbdinfo").args(["--json", &srv.uri("ro")]),
        LIMIT,
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let e = &v["exports"][0];
    assert_eq!(e["export-size"], 3 * MIB, "{out}");
    assert_eq!(e["is_read_only"], true, "{out}");
    assert_eq!(e["can_multi_conn"], false, "{out}");
    assert_eq!(e["can_trim"], false, "{out}");
    assert_eq!(e["can_zero"], false, "{out}");
    // An export that does not exist is refused during the handshake.
    let o = run(
        Command::new("nbdinfo").args(["--json", &srv.uri("nope")]),
        LIMIT,
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("nope"), "{o:?}");
}

#[test]
fn nbdinfo_lists_exports() {
    require_tool("nbdinfo", "libnbd-bin");
    let srv = TestServer::start(
        MemExports::new()
            .with("alpha", Arc::new(MemDevice::new(MIB)))
            .with("beta", Arc::new(MemDevice::with_info(info(2 * MIB)))),
    );
    let out = run_ok(
        Command::new("nbdinfo").args(["--list", "--json", &srv.uri("")]),
        LIMIT,
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut names: Vec<(String, u64)> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["export-name"].as_str().unwrap().to_owned(),
                e["export-size"].as_u64().unwrap(),
            )
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![("alpha".to_owned(), MIB), ("beta".to_owned(), 2 * MIB)],
        "{out}"
    );
    let out = run_ok(
        Command::new("nbdinfo").args(["--list", &srv.unix_uri("")]),
        LIMIT,
    );
    assert!(
        out.contains("alpha") && out.contains("beta") && out.contains("test disk"),
        "{out}"
    );
}

#[test]
fn qemu_img_convert_and_compare() {
    require_tool("qemu-img", "qemu-utils");
    require_tool("qemu-io", "qemu-utils");
    let dev = Arc::new(MemDevice::with_info(info(64 * MIB)));
    let srv = TestServer::start(MemExports::new().with("disk", dev.clone()));
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.qcow2");
    let src = src.to_str().unwrap();
    run_ok(
        Command::new("qemu-img").args(["create", "-q", "-f", "qcow2", src, "64M"]),
        LIMIT,
    );
    run_ok(
        Command::new("qemu-io").args([
            "-f",
            "qcow2",
            "-c",
            "write -P 0x5a 1M 3M",
            "-c",
            "write -P 0xc3 40M 512k",
            "-c",
            "write -P 0x11 65535k 1k",
            src,
        ]),
        LIMIT,
    );
    let out = run_ok(
        Command::new("qemu-img").args(["info", "--output=json", &srv.uri("disk")]),
        LIMIT,
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["virtual-size"], 64 * MIB, "{out}");

    run_ok(
        Command::new("qemu-img").args([
            "convert",
            "-n",
            "-f",
            "qcow2",
            "-O",
            "raw",
            src,
            &srv.uri("disk"),
        ]),
        LIMIT,
    );
    run_ok(
        Command::new("qemu-img").args([
            "compare",
            "-f",
            "qcow2",
            "-F",
            "raw",
            src,
            &srv.uri("disk"),
        ]),
        LIMIT,
    );
    // The device holds the pattern, and stayed thin: only what was written is allocated.
    assert!(
        dev.read_now(MIB, 3 * MIB as usize)
            .unwrap()
            .iter()
            .all(|b| *b == 0x5a)
    );
    assert!(
        dev.read_now(40 * MIB, 512 << 10)
            .unwrap()
            .iter()
            .all(|b| *b == 0xc3)
    );
    assert!(
        dev.read_now(0, MIB as usize)
            .unwrap()
            .iter()
            .all(|b| *b == 0)
    );
    let allocated = dev.allocated_bytes();
    assert!(
        (3 * MIB + (512 << 10)..=8 * MIB).contains(&allocated),
        "allocated {allocated}"
    );

    // A different byte makes compare fail: the check can fail.
    run_ok(
        Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            "write -P 0x77 2M 4k",
            &srv.unix_uri("disk"),
        ]),
        LIMIT,
    );
    let o = run(
        Command::new("qemu-img").args([
            "compare",
            "-f",
            "qcow2",
            "-F",
            "raw",
            src,
            &srv.uri("disk"),
        ]),
        LIMIT,
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "compare must report a difference: {o:?}"
    );
}

#[test]
fn qemu_io_writes_and_reads_a_pattern() {
    require_tool("qemu-io", "qemu-utils");
    let dev = Arc::new(MemDevice::with_info(info(16 * MIB)));
    let srv = TestServer::start(MemExports::new().with("disk", dev.clone()));
    for (uri, byte, at) in [
        (srv.uri("disk"), 0xab_u8, 0u64),
        (srv.unix_uri("disk"), 0xcd, 8 * MIB),
    ] {
        let w = format!("write -P {byte:#x} {at} 1M");
        let r = format!("read -P {byte:#x} {at} 1M");
        let out = run_ok(
            Command::new("qemu-io").args(["-f", "raw", "-c", &w, "-c", &r, &uri]),
            LIMIT,
        );
        assert!(
            out.contains("wrote 1048576/1048576") && out.contains("read 1048576/1048576"),
            "{out}"
        );
        assert!(!out.contains("Pattern verification failed"), "{out}");
        assert!(
            dev.read_now(at, MIB as usize)
                .unwrap()
                .iter()
                .all(|b| *b == byte)
        );
    }
    // Reading the wrong pattern is noticed (the check can fail).
    let out = run(
        Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 0x01 0 4k", &srv.uri("disk")]),
        LIMIT,
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Pattern verification failed"),
        "{out:?}"
    );
    // FUA writes and flushes reach the device.
    let before = dev.stats();
    run_ok(
        Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            "write -f -P 0x3 0 64k",
            "-c",
            "flush",
            &srv.uri("disk"),
        ]),
        LIMIT,
    );
    let after = dev.stats();
    assert!(after.fua_writes > before.fua_writes, "{before:?} {after:?}");
    assert!(after.flushes > before.flushes, "{before:?} {after:?}");
}

#[test]
fn nbdcopy_with_four_connections_both_ways() {
    require_tool("nbdcopy", "libnbd-bin");
    let size = 48 * MIB;
    let dev = Arc::new(MemDevice::with_info(info(size)));
    let srv = TestServer::start(MemExports::new().with("disk", dev.clone()));
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    let data = pattern(size as usize, 0x5eed);
    std::fs::write(&src, &data).unwrap();
    run_ok(
        Command::new("nbdcopy").args([
            "--connections=4",
            "--requests=16",
            src.to_str().unwrap(),
            &srv.uri("disk"),
        ]),
        LIMIT,
    );
    assert!(
        dev.read_now(0, size as usize).unwrap() == data,
        "device differs from the source file"
    );
    // The zero blocks of the source were not allocated (nbdcopy skips or zeroes them).
    assert!(
        dev.allocated_bytes() < size,
        "allocated {}",
        dev.allocated_bytes()
    );

    let back = dir.path().join("back.img");
    run_ok(
        Command::new("nbdcopy").args([
            "--connections=4",
            &srv.unix_uri("disk"),
            back.to_str().unwrap(),
        ]),
        LIMIT,
    );
    run_ok(
        Command::new("cmp").args([src.to_str().unwrap(), back.to_str().unwrap()]),
        LIMIT,
    );
    // And cmp notices a difference (the check can fail).
    let mut other = data.clone();
    other[size as usize / 2] ^= 1;
    std::fs::write(&back, &other).unwrap();
    assert!(
        !run(
            Command::new("cmp").args([src.to_str().unwrap(), back.to_str().unwrap()]),
            LIMIT
        )
        .status
        .success()
    );
}

const NBDSH_SCRIPT: &str = r#"
import errno, os
uri = os.environ["KELP_NBD_URI"]
C = 65536
h.set_strict_mode(0)  # let bad requests reach the server instead of being refused locally
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(uri)
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
assert h.can_trim() and h.can_zero() and h.can_fua() and h.can_flush() and h.can_multi_conn()
size = h.get_size()
maxb = h.get_block_size(nbd.SIZE_MAXIMUM)
assert maxb == 1 << 20, maxb

def extents(off, length, flags=0):
    out = []
    def cb(metacontext, offset, entries, err):
        assert metacontext == nbd.CONTEXT_BASE_ALLOCATION
        assert offset == off
        out.extend(zip(entries[0::2], entries[1::2]))
        return 0
    h.block_status(length, off, cb, flags)
    return out

HZ = nbd.STATE_HOLE | nbd.STATE_ZERO
assert extents(0, 4 * C) == [(4 * C, HZ)], extents(0, 4 * C)
h.pwrite(b"\xaa" * (4 * C), 0, nbd.CMD_FLAG_FUA)
assert extents(0, 4 * C) == [(4 * C, 0)], extents(0, 4 * C)
assert extents(0, 8 * C) == [(4 * C, 0), (4 * C, HZ)], extents(0, 8 * C)
assert extents(0, 8 * C, nbd.CMD_FLAG_REQ_ONE) == [(4 * C, 0)]

# TRIM frees a chunk: it reads as zeros and is reported as a hole.
h.trim(C, C)
assert h.pread(C, C) == bytes(C)
assert extents(0, 4 * C) == [(C, 0), (C, HZ), (2 * C, 0)], extents(0, 4 * C)

# WRITE_ZEROES with NO_HOLE (count 2C at C) allocates the hole again and keeps the rest.
h.zero(2 * C, C, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(2 * C, C) == bytes(2 * C)
assert extents(0, 4 * C) == [(4 * C, 0)], extents(0, 4 * C)
# Without NO_HOLE it may punch a hole, and this device does.
h.zero(2 * C, 2 * C)
assert extents(0, 4 * C) == [(2 * C, 0), (2 * C, HZ)], extents(0, 4 * C)
assert h.pread(4 * C, 0) == b"\xaa" * C + bytes(3 * C)
h.pwrite(b"\x01" * 512, 5 * C, nbd.CMD_FLAG_FUA)
h.flush()

def expect(code, fn):
    try:
        fn()
    except nbd.Error as e:
        assert e.errnum == code, (code, e.errnum, e.string)
    else:
        raise AssertionError("expected errno %d" % code)

expect(errno.EINVAL, lambda: h.pread(512, size))             # past the end
expect(errno.EINVAL, lambda: h.pread(1024, size - 512))      # straddling the end
expect(errno.ENOSPC, lambda: h.pwrite(b"x" * 512, size))     # write past the end
expect(errno.EINVAL, lambda: h.trim(C, size))
expect(errno.ENOSPC, lambda: h.zero(C, size - 4))
expect(errno.EINVAL, lambda: extents(size, C))
expect(errno.EINVAL, lambda: h.pread(0, 0))                  # zero length
expect(errno.EINVAL, lambda: h.pread(2 * maxb, 0))           # over the maximum block size
expect(errno.EINVAL, lambda: h.pwrite(b"y" * (2 * maxb), 0)) # payload discarded, connection kept
# The connection still works, and the rejected write changed nothing.
assert h.pread(4, 0) == b"\xaa" * 4
assert h.pread(512, 5 * C) == b"\x01" * 512
h.shutdown()
print("nbdsh checks passed")
"#;

#[test]
fn nbdsh_trim_zero_block_status_fua_and_errors() {
    require_tool("nbdsh", "python3-libnbd");
    let path = common::path_for_nbdsh();
    let dev = Arc::new(MemDevice::with_info(ExportInfo {
        max_block: MIB as u32,
        ..info(16 * MIB)
    }));
    let srv = TestServer::start(MemExports::new().with("disk", dev.clone()));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("checks.py");
    std::fs::write(&script, NBDSH_SCRIPT).unwrap();
    for uri in [srv.uri("disk"), srv.unix_uri("disk")] {
        let out = run_ok(
            Command::new("nbdsh")
                .env("PATH", &path)
                .env("KELP_NBD_URI", &uri)
                .env("KELP_NBDSH_SCRIPT", &script)
                .args([
                    "-c",
                    "import os; exec(open(os.environ['KELP_NBDSH_SCRIPT']).read())",
                ]),
            LIMIT,
        );
        assert!(out.contains("nbdsh checks passed"), "{out}");
        // Reset the first 6 chunks for the second run.
        let d: &dyn BlockDevice = &*dev;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(d.trim(0, 6 << 16)).unwrap();
        assert_eq!(dev.allocated_bytes(), 0);
    }
    let s = dev.stats();
    assert!(s.fua_writes >= 4, "{s:?}");
    assert!(s.no_hole_zero_writes >= 2 && s.zero_writes >= 4, "{s:?}");
    assert!(s.trims >= 2 && s.flushes >= 2, "{s:?}");
}

#[test]
fn fio_nbd_engine_verifies_random_writes() {
    require_tool("fio", "fio");
    let help = run(Command::new("fio").arg("--enghelp=nbd"), LIMIT);
    assert!(
        help.status.success() && String::from_utf8_lossy(&help.stdout).contains("uri"),
        "this fio has no nbd engine (fio --enghelp=nbd): {help:?}"
    );
    let dev = Arc::new(MemDevice::with_info(info(32 * MIB)));
    let srv = TestServer::start(MemExports::new().with("disk", dev.clone()));
    let dir = tempfile::tempdir().unwrap();
    let out = run_ok(
        Command::new("fio").current_dir(dir.path()).args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", srv.uri("disk")),
            "--rw=randwrite",
            "--bs=4k",
            "--size=16m",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
        ]),
        LIMIT,
    );
    let json_start = out.find('{').unwrap();
    let v: serde_json::Value = serde_json::from_str(&out[json_start..]).unwrap();
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{out}");
    assert!(
        job["write"]["io_bytes"].as_u64().unwrap() >= 16 * MIB,
        "{out}"
    );
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= 16 * MIB,
        "verification reads: {out}"
    );
    assert!(dev.allocated_bytes() >= 16 * MIB);
}
