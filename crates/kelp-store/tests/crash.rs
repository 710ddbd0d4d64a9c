//! Crash test: a child process (`kelp-store-crash-child`) runs the deterministic crash workload
//! and prints each transaction's durable acknowledgement (odd rounds defer small whole-unit
//! writes, even rounds write them to new extents); it is killed with SIGKILL at a random
//! moment (sometimes during mount and deferred-write replay, usually mid-write), many times.
//! After every kill the store is remounted and
//! - fsck is clean (deep on every 5th round),
//! - the last applied transaction id `k` is at least the highest acknowledged id (nothing
//!   acknowledged was lost) and never goes backwards,
//! - the whole store content equals the in-memory model after exactly `k` transactions, so no
//!   transaction is partly visible (each one also bumps the marker id atomically with its
//!   other changes).
//!
//! Default: 30 kills (about 20 s in debug on 2 cores). Long variant: `KELP_CRASH_KILLS=200
//! cargo test -p kelp-store --release --test crash -- --nocapture`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kelp_store::workload::{self, Rng};
use kelp_store::{KelpStore, MemStore, MkfsOptions, ObjectStore, StoreConfig};

#[test]
fn survives_sigkill_at_random_moments() {
    // Prewritten data file: copy-on-write rounds commit with one flush (see docs/STORE.md).
    let dir = tempfile::tempdir().unwrap();
    let opts = MkfsOptions {
        size: kelp_types::ByteSize(512 << 20),
        prewrite: true,
        ..MkfsOptions::default()
    };
    kelp_store::mkfs(dir.path(), &opts).unwrap();
    kill_rounds(dir.path(), 30, None, false);
}

/// Small objects kept inline in their records (a third of the workload's objects stay within
/// the first 3 KiB: written, overwritten, zeroed, grown into extents and truncated back in
/// place) while the child is killed, with the inline threshold switched off in every third
/// round: inline objects written before must stay readable and move into extents when they
/// change, and the store's count of inline bytes must match its records (fsck) after every
/// kill.
#[test]
fn survives_sigkill_with_small_objects_inline_on_and_off() {
    let dir = tempfile::tempdir().unwrap();
    let opts = MkfsOptions {
        size: kelp_types::ByteSize(256 << 20),
        prewrite: true,
        ..MkfsOptions::default()
    };
    kelp_store::mkfs(dir.path(), &opts).unwrap();
    kill_rounds(dir.path(), 20, None, true);
}

/// The same on a data file that grows, in 64 KiB steps from a frontier set back to 1 MiB, so
/// that kills land while the grower writes zeros, flushes and records a new frontier: a unit
/// allocated beyond the recorded frontier would make mount refuse the store, and a lost or
/// torn commit would fail the checks of [`kill_rounds`].
#[test]
fn survives_sigkill_while_the_data_file_grows() {
    let dir = tempfile::tempdir().unwrap();
    let opts = MkfsOptions {
        size: kelp_types::ByteSize(512 << 20),
        grow: true,
        ..MkfsOptions::default()
    };
    kelp_store::mkfs(dir.path(), &opts).unwrap();
    // mkfs wrote 64 MiB; a frontier behind what is written keeps the invariant (everything
    // below the frontier is written) and makes the workload grow the file many times
    let mut sb = kelp_store::Superblock::read(dir.path()).unwrap();
    sb.data_written = Some(1 << 20);
    sb.write(dir.path()).unwrap();
    kill_rounds(dir.path(), 20, Some(64 << 10), false);
    let grown = kelp_store::Superblock::read(dir.path())
        .unwrap()
        .data_written
        .unwrap();
    assert!(grown > 1 << 20, "the file never grew during the test");
    eprintln!("grown to {} KiB", grown >> 10);
}

/// Kills a child running the crash workload on the store in `dir` `kills` times (the
/// environment's `KELP_CRASH_KILLS` overrides), checking everything after each kill.
/// `inline_off_sometimes`: every third child runs with inline data switched off.
fn kill_rounds(
    dir: &std::path::Path,
    kills: u32,
    grow_step: Option<u64>,
    inline_off_sometimes: bool,
) {
    let kills: u32 = std::env::var("KELP_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(kills);
    let seed: u64 = std::env::var("KELP_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    let cfg = || StoreConfig {
        grow_step: kelp_types::ByteSize(grow_step.unwrap_or(0)),
        ..StoreConfig::default()
    };
    {
        let s = KelpStore::mount(dir, cfg()).unwrap();
        s.submit(workload::crash_setup()).unwrap().wait().unwrap();
        s.close().unwrap();
    }
    let model = MemStore::new();
    model
        .submit(workload::crash_setup())
        .unwrap()
        .wait()
        .unwrap();
    let mut model_id = 0u64;
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let mut total_acked = 0u64;
    for round in 0..kills {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kelp-store-crash-child"))
            .arg(dir)
            .arg(seed.to_string())
            // Alternate the small-write path: copy-on-write extents vs deferred writes.
            .arg(if round % 2 == 0 { "0" } else { "65536" })
            .arg(grow_step.unwrap_or(0).to_string())
            .arg(if inline_off_sometimes && round % 3 == 2 {
                "0"
            } else {
                "2048"
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let acked = Arc::new(AtomicU64::new(0));
        let ready = Arc::new(AtomicU64::new(0));
        let reader = {
            let (acked, ready) = (acked.clone(), ready.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(id) = line.strip_prefix("ACK ") {
                        acked.fetch_max(id.parse().unwrap(), Ordering::SeqCst);
                    } else if line.starts_with("READY") {
                        ready.store(1, Ordering::SeqCst);
                    }
                }
            })
        };
        // One round in eight is killed early (possibly during mount/replay); the rest after
        // mount, at a random point of the write stream.
        if rng.below(8) != 0 {
            let t0 = Instant::now();
            while ready.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    use std::io::Read;
                    child
                        .stderr
                        .take()
                        .unwrap()
                        .read_to_string(&mut err)
                        .unwrap();
                    panic!("round {round}: child exited early with {status}: {err}");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(rng.below(250)));
        } else {
            std::thread::sleep(Duration::from_millis(rng.below(40)));
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("round {round}: child died by itself with {status}: {err}");
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        let acked = acked.load(Ordering::SeqCst);

        let store = KelpStore::mount(dir, cfg()).unwrap();
        let rep = store.fsck(round % 5 == 4).unwrap();
        assert!(rep.is_clean(), "round {round}: fsck: {:?}", rep.problems);
        let k = workload::crash_applied_id(&store).unwrap();
        assert!(
            k >= acked,
            "round {round}: transaction {acked} was acknowledged but the store holds only {k}"
        );
        assert!(
            k >= model_id,
            "round {round}: store went back from {model_id} to {k}"
        );
        total_acked += k - model_id;
        while model_id < k {
            model_id += 1;
            model
                .submit(workload::crash_txn(seed, model_id))
                .unwrap()
                .wait()
                .unwrap();
        }
        assert_eq!(
            workload::dump(&store).unwrap(),
            workload::dump(&model).unwrap(),
            "round {round}: store content differs from the model after transaction {k}"
        );
        store.close().unwrap();
    }
    eprintln!(
        "crash test: {kills} kills, {total_acked} transactions survived, {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert!(model_id > 0, "no transaction ever committed");
}

/// Runs the child's `torn` script (three acknowledged transactions, all new extents on a
/// prewritten store, so the last one committed with a single flush), kills it, and returns
/// the byte ranges the write-ahead log's last record will have verified at mount.
fn torn_child(dir: &std::path::Path) -> Vec<(u64, u64)> {
    let opts = MkfsOptions {
        size: kelp_types::ByteSize(64 << 20),
        prewrite: true,
        ..MkfsOptions::default()
    };
    kelp_store::mkfs(dir, &opts).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kelp-store-crash-child"))
        .arg("torn")
        .arg(dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "DONE");
    child.kill().unwrap();
    child.wait().unwrap();
    kelp_store::wal_tail_new_extents(dir).unwrap()
}

/// The single-flush commit's failure case, which SIGKILL cannot produce (the kernel keeps
/// completed writes): power fails during the flush that was to make both the last log record
/// and its new extents durable, and the device kept the record but not the data. Played here
/// by overwriting the extents the last record names; mount must drop that record (the state
/// is the one before the last transaction, and fsck is clean), while an intact tail is kept.
#[test]
fn torn_log_tail_is_dropped() {
    use kelp_store::{CollectionId, ObjectId};
    use std::os::unix::fs::FileExt;
    let c = CollectionId::new(1, 0);
    let obj = |n: &str| ObjectId::new(1, "", n, 7);

    // Intact tail: the last transaction survives.
    let intact = tempfile::tempdir().unwrap();
    let ranges = torn_child(intact.path());
    // a (4 units, one run) and b (2 units) of the last transaction.
    assert_eq!(ranges.iter().map(|r| r.1).sum::<u64>(), 24576, "{ranges:?}");
    let s = KelpStore::mount(intact.path(), StoreConfig::default()).unwrap();
    assert_eq!(s.read(c, &obj("a"), 0, 1 << 20).unwrap(), vec![2u8; 16384]);
    assert_eq!(s.read(c, &obj("b"), 0, 1 << 20).unwrap(), vec![3u8; 8192]);
    s.close().unwrap();

    // Torn tail: the device lost the last batch's data.
    let torn = tempfile::tempdir().unwrap();
    let ranges = torn_child(torn.path());
    assert!(!ranges.is_empty());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(torn.path().join("block"))
        .unwrap();
    for (off, len) in &ranges {
        f.write_all_at(&vec![0xAA; *len as usize], *off).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let s = KelpStore::mount(torn.path(), StoreConfig::default()).unwrap();
    assert_eq!(s.read(c, &obj("a"), 0, 1 << 20).unwrap(), vec![1u8; 16384]);
    assert!(matches!(
        s.stat(c, &obj("b")),
        Err(kelp_store::StoreError::ObjectNotFound { .. })
    ));
    s.close().unwrap();
    let rep = kelp_store::fsck_dir(torn.path(), true).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
    // And the store goes on: the dropped transaction's units are free again.
    let s = KelpStore::mount(torn.path(), StoreConfig::default()).unwrap();
    let mut t = kelp_store::Transaction::new();
    t.write(c, &obj("b"), 0, vec![4u8; 8192]);
    s.submit(t).unwrap().wait().unwrap();
    assert_eq!(s.read(c, &obj("b"), 0, 8192).unwrap(), vec![4u8; 8192]);
}
