//! Test-only child process for `tests/crash.rs`: mounts the store in `DIR` (optionally with
//! `prefer_deferred_size` = `PREFER_DEFERRED` bytes, a growing data file's step =
//! `GROW_STEP` bytes and `inline_max` = `INLINE_MAX` bytes), then submits the
//! deterministic crash workload (`kelp_store::workload::crash_txn(SEED, id)`) from the id after
//! the last one applied, up to 8 transactions in flight, printing `ACK <id>` to stdout once each
//! is durable. It runs until it is killed (the test sends SIGKILL at a random moment).

use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc;

use kelp_store::workload::{crash_applied_id, crash_txn};
use kelp_store::{KelpStore, ObjectStore, StoreConfig};

/// `kelp-store-crash-child torn DIR`: three transactions, each acknowledged before the next
/// (create collection 1.0; write `a` = 16 KiB of 1s; overwrite `a` with 16 KiB of 2s and write
/// `b` = 8 KiB of 3s), all as new extents; prints `DONE` and waits to be killed. The test then
/// plays the device losing the last batch's data (tests/crash.rs, `torn_log_tail_is_dropped`).
fn torn(dir: &str) {
    use kelp_store::{CollectionId, ObjectId, Transaction};
    let cfg = StoreConfig {
        prefer_deferred_size: kelp_types::ByteSize(0),
        ..StoreConfig::default()
    };
    let store = KelpStore::mount(&PathBuf::from(dir), cfg).unwrap_or_else(|e| {
        eprintln!("mount failed: {e}");
        std::process::exit(3)
    });
    let c = CollectionId::new(1, 0);
    let obj = |n: &str| ObjectId::new(1, "", n, 7);
    let mut t0 = Transaction::new();
    t0.create_collection(c);
    let mut t1 = Transaction::new();
    t1.write(c, &obj("a"), 0, vec![1u8; 16384]);
    let mut t2 = Transaction::new();
    t2.write(c, &obj("a"), 0, vec![2u8; 16384]);
    t2.write(c, &obj("b"), 0, vec![3u8; 8192]);
    for t in [t0, t1, t2] {
        if let Err(e) = store.submit(t).and_then(|c| c.wait()) {
            eprintln!("commit failed: {e}");
            std::process::exit(4);
        }
    }
    println!("DONE");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("torn") {
        let dir = std::env::args().nth(2).unwrap_or_default();
        return torn(&dir);
    }
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(seed)) = (args.next(), args.next()) else {
        eprintln!(
            "usage: kelp-store-crash-child DIR SEED [PREFER_DEFERRED [GROW_STEP [INLINE_MAX]]]"
        );
        std::process::exit(2);
    };
    let seed: u64 = seed.parse().unwrap_or_else(|_| {
        eprintln!("SEED must be an integer");
        std::process::exit(2)
    });
    // Optional third argument: prefer_deferred_size in bytes (the test alternates write paths
    // between runs of the child over the same store).
    let mut cfg = StoreConfig::default();
    if let Some(pd) = args.next().and_then(|v| v.parse::<u64>().ok()) {
        cfg.prefer_deferred_size = kelp_types::ByteSize(pd);
    }
    // Optional fourth argument: the grow step of a growing data file, bytes (small, so that
    // kills land while the file grows).
    if let Some(step) = args.next().and_then(|v| v.parse::<u64>().ok()) {
        cfg.grow_step = kelp_types::ByteSize(step);
    }
    // Optional fifth argument: inline_max in bytes (0 switches inline data off).
    if let Some(max) = args.next().and_then(|v| v.parse::<u64>().ok()) {
        cfg.inline_max = kelp_types::ByteSize(max);
    }
    let store = match KelpStore::mount(&PathBuf::from(dir), cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mount failed: {e}");
            std::process::exit(3);
        }
    };
    let first = match crash_applied_id(&store) {
        Ok(k) => k + 1,
        Err(e) => {
            eprintln!("reading marker failed: {e}");
            std::process::exit(3);
        }
    };
    println!("READY {first}");
    let _ = std::io::stdout().flush();
    let (tx, rx) = mpsc::sync_channel::<(u64, kelp_store::Commit)>(8);
    let acker = std::thread::spawn(move || {
        let mut out = std::io::stdout().lock();
        for (id, commit) in rx {
            if let Err(e) = commit.wait() {
                eprintln!("commit {id} failed: {e}");
                std::process::exit(4);
            }
            let _ = writeln!(out, "ACK {id}");
            let _ = out.flush();
        }
    });
    for id in first.. {
        match store.submit(crash_txn(seed, id)) {
            Ok(c) => {
                if tx.send((id, c)).is_err() {
                    break;
                }
            }
            Err(e) => {
                eprintln!("submit {id} failed: {e}");
                std::process::exit(4);
            }
        }
    }
    drop(tx);
    let _ = acker.join();
}
