//! Regression test: a store whose metadata database holds many sealed-but-unflushed memtables
//! (a store killed, or stopped, while fjall had rotated memtables it had not flushed yet) must
//! mount and accept writes. fjall 2.x wakes its flush worker only once per partition at startup,
//! so most of those memtables used to stay queued forever, counted in its write buffer: above
//! `max_write_buffer_size` every write halted for good (docs/STORE.md, "Write buffer").
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use fjall::{PartitionCreateOptions, PersistMode};
use kelp_store::workload::test_hash;
use kelp_store::{
    CollectionId, KelpStore, MkfsOptions, ObjectId, ObjectStore, StoreConfig, Transaction,
};

const C: CollectionId = kelp_store::workload::CRASH_COLLS[0];
/// Sealed journals left behind, each holding one memtable of the metadata partition. fjall's
/// startup flushes at most `flush_workers` (<= 4) memtables per partition with queued ones, so
/// at least 8 MiB stay stranded: twice the 4 MiB write buffer of the configuration below.
const SEALED: usize = 12;
const FILLER: usize = 1 << 20;

/// Leave `SEALED` sealed journals in the store's database, as a crash would: a keyspace without
/// a flush worker rotates its memtable `SEALED` times. The filler key is outside the store's key
/// schema and deleted at the end, so the store's content does not change.
fn strand_sealed_memtables(dir: &Path) {
    let kv = fjall::Config::new(dir.join("meta"))
        .flush_workers(0)
        .manual_journal_persist(true)
        .open()
        .unwrap();
    let meta = kv
        .open_partition("meta", PartitionCreateOptions::default())
        .unwrap();
    let key = b"\xffregression-filler".to_vec();
    for i in 0..SEALED {
        meta.insert(key.clone(), vec![i as u8; FILLER]).unwrap();
        assert!(meta.rotate_memtable().unwrap());
    }
    meta.remove(key).unwrap();
    kv.persist(PersistMode::SyncAll).unwrap();
}

fn run_with_timeout<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} did not finish within 60 s (write halt?)"))
}

#[test]
fn writes_proceed_after_recovering_many_sealed_memtables() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    kelp_store::mkfs(
        &dir,
        &MkfsOptions {
            size: kelp_types::ByteSize(64 << 20),
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    strand_sealed_memtables(&dir);
    let d = dir.clone();
    let ok = run_with_timeout("mount and 64 commits", move || {
        // A 16 MiB budget: a 4 MiB fjall write buffer.
        let cfg = StoreConfig {
            cache_budget: kelp_types::ByteSize(16 << 20),
            ..StoreConfig::default()
        };
        let s = KelpStore::mount(&d, cfg).unwrap();
        s.submit(Transaction::new().create_collection(C).clone())
            .unwrap()
            .wait()
            .unwrap();
        for i in 0..64u32 {
            let name = format!("obj{i}");
            let oid = ObjectId::new(1, "", &name, test_hash(&name));
            s.submit(
                Transaction::new()
                    .write(C, &oid, 0, vec![i as u8; 64 << 10])
                    .clone(),
            )
            .unwrap()
            .wait()
            .unwrap();
        }
        let report = s.fsck(true).unwrap();
        s.close().unwrap();
        report.is_clean()
    });
    assert!(ok, "fsck found problems");
    // And it mounts again, with everything in place.
    let d = dir.clone();
    let n = run_with_timeout("remount", move || {
        let s = KelpStore::mount(&d, StoreConfig::default()).unwrap();
        let n = s.list_objects(C, None, 1000).unwrap();
        s.close().unwrap();
        n.objects.len()
    });
    assert_eq!(n, 64);
}
