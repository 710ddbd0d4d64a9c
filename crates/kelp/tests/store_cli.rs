//! `kelp store mkfs` / `fsck` end to end: exit statuses, a damaged block named by
//! `fsck --deep`, a damaged superblock refused with a clear message.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kelp_store::workload::test_hash;
use kelp_store::{CollectionId, KelpStore, ObjectId, ObjectStore, StoreConfig, Transaction};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("kelp-store-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn kelp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .output()
        .expect("run kelp")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn p(d: &Path) -> &str {
    d.to_str().unwrap()
}

#[test]
fn mkfs_fsck_and_deep_fsck_find_a_damaged_object() {
    let d = TempDir::new("fsck");
    let out = kelp(&["store", "mkfs", p(&d.0), "--size", "64MiB"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = kelp(&["store", "mkfs", p(&d.0)]);
    assert!(!out.status.success(), "mkfs over a store must fail");

    let c = CollectionId::new(3, 0);
    let o = ObjectId::new(3, "", "victim", test_hash("victim"));
    let off = {
        let s = KelpStore::mount(&d.0, StoreConfig::default()).unwrap();
        let mut t = Transaction::new();
        t.create_collection(c).write(c, &o, 0, vec![7u8; 32 << 10]);
        s.submit(t).unwrap().wait().unwrap();
        let off = s.object_extents(c, &o).unwrap()[0].0;
        s.close().unwrap();
        off
    };
    let out = kelp(&["store", "fsck", p(&d.0), "--deep"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("0 problem(s)"), "{}", text(&out));

    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.0.join("block"))
        .unwrap();
    f.write_all_at(&[0x55], off + 9000).unwrap();
    f.sync_all().unwrap();

    let out = kelp(&["store", "fsck", p(&d.0)]);
    assert!(
        out.status.success(),
        "shallow fsck reads no data: {}",
        text(&out)
    );
    let out = kelp(&["store", "fsck", p(&d.0), "--deep"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("checksum") && t.contains("victim") && t.contains("offset 8192"),
        "{t}"
    );

    let out = kelp(&["store", "fsck", p(&d.0), "--deep", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["problems"][0]["kind"], "checksum");
}

#[test]
fn garbage_superblock_is_refused_clearly() {
    let d = TempDir::new("sb");
    assert!(
        kelp(&["store", "mkfs", p(&d.0), "--size", "16MiB"])
            .status
            .success()
    );
    std::fs::write(d.0.join("superblock"), b"garbage, not a superblock").unwrap();
    let out = kelp(&["store", "fsck", p(&d.0)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("bad superblock"), "{}", text(&out));
    std::fs::write(d.0.join("superblock"), b"KELP").unwrap();
    let out = kelp(&["store", "fsck", p(&d.0)]);
    assert!(text(&out).contains("truncated"), "{}", text(&out));
}

/// The S3-index-shaped ingest runs every object's three transactions and reports its blocks.
#[test]
fn bench_runs_the_index_ingest() {
    let d = TempDir::new("bench");
    let out = kelp(&[
        "store",
        "bench",
        p(&d.0),
        "--only",
        "index_ingest_qd16",
        "--objects",
        "3000",
        "--size",
        "256MiB",
        "--cache-budget",
        "32MiB",
        "--no-prewrite",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &rep["results"][0];
    assert_eq!(r["name"], "index_ingest_qd16");
    assert_eq!(r["ops"], 3000);
    let ing = &rep["index_ingest"];
    assert_eq!(ing["objects"], 3000);
    assert_eq!(ing["block_size"], 300);
    let blocks = ing["ops_per_s_by_block"].as_array().unwrap();
    assert_eq!(blocks.len(), 10);
    assert!(blocks.iter().all(|b| b.as_f64().unwrap() > 0.0), "{ing}");
    // Only the tests asked for ran.
    assert!(rep["ingest"].is_null());
}

#[test]
fn every_store_command_has_help() {
    for cmd in [
        &["store", "--help"][..],
        &["store", "mkfs", "--help"],
        &["store", "fsck", "--help"],
        &["store", "bench", "--help"],
    ] {
        let out = kelp(cmd);
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"));
    }
}
