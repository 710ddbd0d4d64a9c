//! The measurement behind the choice of metadata database (docs/STORE.md, "Why fjall").
//!
//! Same workload on fjall and redb, durably committed: (1) single-record commits, (2) batches of
//! 16 records (one group commit), (3) an ingest of N small records (~60-byte keys, ~20-byte
//! values, like object records) in batches of 16, reporting commits/s for the first and last
//! tenth and bytes on disk per record.
//!
//! `cargo run --release -p kelp-store --example kv_choice -- DIR [N]`
#![allow(clippy::unwrap_used)] // a measurement program: a failure ends the run

use std::path::Path;
use std::time::Instant;

use kelp_store::workload::Rng;
use redb::{Durability, TableDefinition};

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("meta");

fn key(i: u64) -> Vec<u8> {
    let h = kelp_store::workload::splitmix(i) as u32;
    let mut k = vec![b'O', 0, 0, 0, 1, 0, 0, 0, 2];
    k.extend_from_slice(&h.to_be_bytes());
    k.extend_from_slice(&[0, 0, 0, 1, 0, 1]);
    k.extend_from_slice(format!("rbd_data.1234abcd.{i:016x}").as_bytes());
    k.extend_from_slice(&[0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]);
    k
}

fn dir_size(p: &Path) -> u64 {
    let mut t = 0;
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        let m = e.metadata().unwrap();
        t += if m.is_dir() {
            dir_size(&e.path())
        } else {
            m.len()
        };
    }
    t
}

trait Kv {
    fn commit(&mut self, recs: &[(Vec<u8>, Vec<u8>)]);
    fn settle(&mut self) {}
}

struct Fjall(fjall::Keyspace, fjall::PartitionHandle);
impl Kv for Fjall {
    fn commit(&mut self, recs: &[(Vec<u8>, Vec<u8>)]) {
        let mut b = self
            .0
            .batch()
            .durability(Some(fjall::PersistMode::SyncData));
        for (k, v) in recs {
            b.insert(&self.1, k.clone(), v.clone());
        }
        b.commit().unwrap();
    }
    fn settle(&mut self) {
        self.1.rotate_memtable_and_wait().unwrap();
    }
}

struct Redb(redb::Database);
impl Kv for Redb {
    fn commit(&mut self, recs: &[(Vec<u8>, Vec<u8>)]) {
        let mut tx = self.0.begin_write().unwrap();
        tx.set_durability(Durability::Immediate);
        {
            let mut t = tx.open_table(TABLE).unwrap();
            for (k, v) in recs {
                t.insert(k.as_slice(), v.as_slice()).unwrap();
            }
        }
        tx.commit().unwrap();
    }
}

fn run(name: &str, kv: &mut dyn Kv, dir: &Path, n: u64) {
    let mut r = Rng::new(1);
    let mut i = 0u64;
    let mut rec = |r: &mut Rng| {
        i += 1;
        (key(i), r.bytes(20))
    };
    for batch in [1usize, 16] {
        let t0 = Instant::now();
        let mut commits = 0;
        while t0.elapsed().as_secs_f64() < 3.0 {
            let recs: Vec<_> = (0..batch).map(|_| rec(&mut r)).collect();
            kv.commit(&recs);
            commits += 1;
        }
        println!(
            "{name}: batch {batch:>2}: {:.0} commits/s",
            commits as f64 / t0.elapsed().as_secs_f64()
        );
    }
    let before = dir_size(dir);
    let tenth = n / 10;
    let mut rates = Vec::new();
    let mut t = Instant::now();
    for k in 0..n / 16 {
        let recs: Vec<_> = (0..16).map(|_| rec(&mut r)).collect();
        kv.commit(&recs);
        if (k + 1) * 16 % tenth < 16 {
            rates.push(tenth as f64 / t.elapsed().as_secs_f64());
            t = Instant::now();
        }
    }
    kv.settle();
    let after = dir_size(dir);
    println!(
        "{name}: ingest {n} records in batches of 16: first tenth {:.0} rec/s, last tenth {:.0} rec/s; {:.1} bytes/record on disk",
        rates.first().unwrap_or(&0.0),
        rates.last().unwrap_or(&0.0),
        (after.saturating_sub(before)) as f64 / n as f64
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: kv_choice DIR [N]"));
    let n: u64 = args.next().map_or(200_000, |s| s.parse().unwrap());
    let fj = dir.join("fjall");
    let rd = dir.join("redb");
    std::fs::create_dir_all(&rd).unwrap();
    {
        let ks = fjall::Config::new(&fj)
            .manual_journal_persist(true)
            .cache_size(64 << 20)
            .open()
            .unwrap();
        let p = ks
            .open_partition("meta", fjall::PartitionCreateOptions::default())
            .unwrap();
        run("fjall", &mut Fjall(ks, p), &fj, n);
    }
    {
        let db = redb::Database::builder()
            .set_cache_size(64 << 20)
            .create(rd.join("db"))
            .unwrap();
        run("redb", &mut Redb(db), &rd, n);
    }
}
