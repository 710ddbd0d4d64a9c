//! Data files that grow (`MkfsOptions::grow`): created sparse, written with zeros in steps
//! ahead of the allocator, every byte kept across remounts, and `NoSpace` only at the end.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use kelp_store::workload::test_hash;
use kelp_store::{
    CollectionId, KelpStore, MkfsOptions, ObjectId, ObjectStore, StoreConfig, StoreError,
    Superblock, Transaction,
};

const C: CollectionId = kelp_store::workload::CRASH_COLLS[0];
const MIB: u64 = 1 << 20;

fn oid(i: usize) -> ObjectId {
    let name = format!("obj{i}");
    ObjectId::new(1, "", &name, test_hash(&name))
}

fn content(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b * 7 + i * 13) as u8).collect()
}

fn mkfs_growing(dir: &Path, size: u64) -> KelpStore {
    let opts = MkfsOptions {
        size: kelp_types::ByteSize(size),
        grow: true,
        ..MkfsOptions::default()
    };
    kelp_store::mkfs(dir, &opts).unwrap();
    let s = KelpStore::mount(dir, StoreConfig::default()).unwrap();
    s.submit(Transaction::new().create_collection(C).clone())
        .unwrap()
        .wait()
        .unwrap();
    s
}

fn allocated_bytes(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("block")).unwrap().blocks() * 512
}

fn written(dir: &Path) -> u64 {
    Superblock::read(dir).unwrap().data_written.unwrap()
}

fn write(s: &KelpStore, i: usize, len: usize) -> Result<(), StoreError> {
    s.submit(
        Transaction::new()
            .write(C, &oid(i), 0, content(i, len))
            .clone(),
    )?
    .wait()
}

#[test]
fn starts_sparse_grows_ahead_of_the_writers_and_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let size = 1 << 30;
    let s = mkfs_growing(dir.path(), size);
    // mkfs wrote one step (64 MiB for 1 GiB), not the whole file
    assert_eq!(written(dir.path()), 64 * MIB);
    let on_disk = allocated_bytes(dir.path());
    assert!(
        (64 * MIB..80 * MIB).contains(&on_disk),
        "a new growing file takes one step of disk, not {on_disk}"
    );
    assert!(s.superblock().data_written_ahead());
    let space = s.space().unwrap();
    assert_eq!(space.total, size);
    assert!(
        space.available > size - 8 * MIB,
        "space beyond the frontier is available: {space:?}"
    );
    // 300 MiB in 1 MiB objects: several steps, some writers waiting for the grower
    for i in 0..300 {
        write(&s, i, MIB as usize).unwrap();
    }
    let w = written(dir.path());
    assert!(
        (300 * MIB..size).contains(&w),
        "the frontier moved past the data but not to the end: {w}"
    );
    assert!(allocated_bytes(dir.path()) < w + 8 * MIB);
    for i in (0..300).step_by(37) {
        assert_eq!(
            s.read(C, &oid(i), 0, MIB).unwrap(),
            content(i, MIB as usize)
        );
    }
    s.close().unwrap();
    let report = kelp_store::fsck_dir(dir.path(), true).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let s = KelpStore::mount(dir.path(), StoreConfig::default()).unwrap();
    for i in 0..300 {
        assert_eq!(
            s.read(C, &oid(i), 0, MIB).unwrap(),
            content(i, MIB as usize),
            "object {i} after remount"
        );
    }
    // keeps growing after a remount, from where it was
    for i in 300..400 {
        write(&s, i, MIB as usize).unwrap();
    }
    assert!(written(dir.path()) >= 400 * MIB);
    s.close().unwrap();
}

#[test]
fn fills_to_its_end_then_refuses_with_no_space_and_reuses_freed_space() {
    let dir = tempfile::tempdir().unwrap();
    let size = 160 * MIB; // steps of 64 MiB: grows twice, the last step shorter
    let s = mkfs_growing(dir.path(), size);
    let mut n = 0;
    let err = loop {
        match write(&s, n, MIB as usize) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 200, "a 160 MiB store took 200 MiB");
    };
    assert!(matches!(err, StoreError::NoSpace { .. }), "{err}");
    assert!(n >= 150, "only {n} MiB fit in a 160 MiB growing store");
    assert_eq!(written(dir.path()), size, "grown to the very end");
    assert_eq!(allocated_bytes(dir.path()) / MIB, size / MIB);
    // freed space is used again; nothing is lost
    s.submit(Transaction::new().remove(C, &oid(0)).clone())
        .unwrap()
        .wait()
        .unwrap();
    write(&s, 1000, MIB as usize).unwrap();
    for i in 1..n {
        assert_eq!(
            s.read(C, &oid(i), 0, MIB).unwrap(),
            content(i, MIB as usize)
        );
    }
    s.close().unwrap();
    let report = kelp_store::fsck_dir(dir.path(), true).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn a_frontier_behind_allocated_units_is_refused_at_mount() {
    let dir = tempfile::tempdir().unwrap();
    let s = mkfs_growing(dir.path(), 512 * MIB);
    for i in 0..100 {
        write(&s, i, MIB as usize).unwrap();
    }
    s.close().unwrap();
    // a superblock claiming less written space than the data uses (damage, or a bug) must
    // not let the allocator hand the same units out twice
    let mut sb = Superblock::read(dir.path()).unwrap();
    sb.data_written = Some(16 * MIB);
    sb.write(dir.path()).unwrap();
    match KelpStore::mount(dir.path(), StoreConfig::default()) {
        Err(e) => assert!(e.to_string().contains("beyond the written part"), "{e}"),
        Ok(_) => panic!("mounted a store whose frontier is behind its data"),
    }
}

#[test]
fn a_transaction_larger_than_a_step_waits_for_several_steps() {
    // 256 MiB file: steps of 64 MiB, one written at mkfs. A single 150 MiB write needs
    // more than two further steps before it fits; it must wait for them, not hang or fail.
    let dir = tempfile::tempdir().unwrap();
    let s = mkfs_growing(dir.path(), 256 * MIB);
    let big = content(7, 150 * MIB as usize);
    // a watchdog: a grower that stops short of what a waiter needs hangs it forever
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let r = s.submit(Transaction::new().write(C, &oid(0), 0, big.clone()).clone());
            tx.send(r.and_then(|c| c.wait())).unwrap();
        });
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(r) => r.unwrap(),
            Err(_) => {
                eprintln!("a 150 MiB write waited over 60 s for the file to grow");
                std::process::exit(1);
            }
        }
    });
    assert!(written(dir.path()) >= 150 * MIB);
    assert!(s.read(C, &oid(0), 0, 150 * MIB).unwrap() == big);
    s.close().unwrap();
}
