//! `kelp store bench`: throughput and latency of the durable store on its real device.
//!
//! Every test drives the public [`ObjectStore`] API from N threads, each with one transaction
//! in flight (so N is the queue depth), and a write counts only once its commit future resolved
//! (durable). Tests, in order, on one freshly created store:
//!
//! | name | what |
//! |---|---|
//! | `write_4k_new_qd1` / `_qd16` | create 4 KiB objects |
//! | `overwrite_4k_qd1` / `_qd16` | overwrite whole existing 4 KiB objects (random) |
//! | `write_4m_qd4` | create 4 MiB objects (names cycle over 3/4 of the free space, so a fast device does not fill the store) |
//! | `randread_4k_qd16_cold` | 4 KiB reads at random offsets of the 4 MiB objects, after a remount and dropping the data file from the page cache |
//! | `overwrite_4k_in_4m_qd16` | 4 KiB writes at random aligned offsets of the 4 MiB objects (what a block image's random writes ask of each OSD) |
//! | `create_1m_4k_qd16` | create `objects` (default 1 000 000) 4 KiB objects; reports the rate per 100 000 and metadata bytes per object |
//! | `index_ingest_qd16` | what an S3 ingest of `objects` 1 KiB objects asks of each OSD (see `IndexSim`); reports the rate per 100 000 |

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

use crate::config::{MkfsOptions, StoreConfig};
use crate::error::Result;
use crate::kelpstore::{AlignedBuf, KelpStore, mkfs};
use crate::store::ObjectStore;
use crate::types::{CollectionId, ObjectId, Transaction};
use crate::workload::{Rng, test_hash};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Duration of each timed test.
    pub seconds: f64,
    /// Objects created by the metadata-heavy test.
    pub objects: u64,
    pub mkfs: MkfsOptions,
    pub config: StoreConfig,
    /// Run only these tests (names as in the table above); empty: all. Tests whose input
    /// another test would have created (overwrites, reads) prefill it themselves.
    pub only: Vec<String>,
}

/// Names of all tests, in the order they run.
pub const TESTS: [&str; 9] = [
    "write_4k_new_qd1",
    "write_4k_new_qd16",
    "overwrite_4k_qd1",
    "overwrite_4k_qd16",
    "write_4m_qd4",
    "randread_4k_qd16_cold",
    "overwrite_4k_in_4m_qd16",
    "create_1m_4k_qd16",
    "index_ingest_qd16",
];

#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub name: String,
    pub queue_depth: usize,
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Peak resident set size of the process during this test (the peak is reset before
    /// each test), MiB.
    pub peak_rss_mib: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct IngestReport {
    pub objects: u64,
    /// ops/s of each successive block of 100 000 objects (or of tenths, if fewer objects).
    pub ops_per_s_by_block: Vec<f64>,
    pub block_size: u64,
    pub first_block_ops_per_s: f64,
    pub last_block_ops_per_s: f64,
    /// (last - first) / first, percent.
    pub change_percent: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub results: Vec<BenchResult>,
    /// The largest of the tests' peaks.
    pub peak_rss_mib: f64,
    pub cache_budget_mib: f64,
    /// Metadata database growth per object in the ingest test (None if it did not run).
    pub metadata_bytes_per_object: Option<f64>,
    pub ingest: Option<IngestReport>,
    /// The `index_ingest_qd16` test's rates (None if it did not run).
    pub index_ingest: Option<IngestReport>,
    pub config: StoreConfig,
    pub mkfs: MkfsOptions,
}

/// Reset this process's peak resident set size to its current size (Linux `clear_refs` 5), so
/// that each test reports its own peak.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident set size of this process, MiB (Linux `VmHWM`).
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The largest per-test peak (and the current peak, for work outside the timed tests).
fn overall_peak(results: &[BenchResult]) -> f64 {
    results
        .iter()
        .map(|r| r.peak_rss_mib)
        .fold(peak_rss_mib(), f64::max)
}

struct Outcome {
    ops: u64,
    bytes: u64,
    lat_us: Vec<u32>,
    elapsed: f64,
}

/// Run `op(thread, i)` from `qd` threads until `deadline` passes or `limit` total ops are done.
fn drive(
    qd: usize,
    seconds: f64,
    limit: u64,
    op: impl Fn(usize, u64) -> Result<u64> + Sync,
) -> Result<Outcome> {
    reset_peak_rss();
    let stop = AtomicBool::new(false);
    let issued = AtomicU64::new(0);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let results: Vec<Result<(u64, Vec<u32>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..qd)
            .map(|t| {
                let (stop, issued, op) = (&stop, &issued, &op);
                s.spawn(move || -> Result<(u64, Vec<u32>)> {
                    let mut lat = Vec::new();
                    let mut bytes = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let i = issued.fetch_add(1, Ordering::Relaxed);
                        if i >= limit || Instant::now() >= deadline {
                            break;
                        }
                        let t0 = Instant::now();
                        match op(t, i) {
                            Ok(b) => bytes += b,
                            Err(e) => {
                                stop.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                        lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    }
                    Ok((bytes, lat))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("bench thread panicked")))
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut out = Outcome {
        ops: 0,
        bytes: 0,
        lat_us: Vec::new(),
        elapsed,
    };
    for r in results {
        let (b, l) = r?;
        out.bytes += b;
        out.ops += l.len() as u64;
        out.lat_us.extend(l);
    }
    Ok(out)
}

fn summarize(name: &str, qd: usize, mut o: Outcome) -> BenchResult {
    o.lat_us.sort_unstable();
    let pct = |p: f64| -> f64 {
        if o.lat_us.is_empty() {
            return 0.0;
        }
        let i = ((o.lat_us.len() as f64 * p).ceil() as usize).clamp(1, o.lat_us.len()) - 1;
        f64::from(o.lat_us[i]) / 1000.0
    };
    BenchResult {
        name: name.to_string(),
        queue_depth: qd,
        ops: o.ops,
        seconds: o.elapsed,
        ops_per_s: o.ops as f64 / o.elapsed,
        mib_per_s: o.bytes as f64 / o.elapsed / (1 << 20) as f64,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        peak_rss_mib: peak_rss_mib(),
    }
}

fn obj(prefix: &str, i: u64) -> ObjectId {
    let name = format!("{prefix}{i:010}");
    ObjectId::new(1, "", &name, test_hash(&name))
}

/// Write `data` as object `prefix{i}`. The payload is shared, not copied, as an OSD hands the
/// store a buffer received from the network.
fn write_new(s: &KelpStore, coll: CollectionId, prefix: &str, i: u64, data: &Bytes) -> Result<u64> {
    let mut t = Transaction::new();
    t.write(coll, &obj(prefix, i), 0, data.clone());
    s.submit(t)?.wait()?;
    Ok(data.len() as u64)
}

/// Run every test on a new store created in `dir` (which must not hold a store).
/// `progress` receives one line per finished test.
pub fn run_bench(dir: &Path, opts: &BenchOptions, progress: &dyn Fn(&str)) -> Result<BenchReport> {
    mkfs(dir, &opts.mkfs)?;
    let mut store = KelpStore::mount(dir, opts.config.clone())?;
    let colls: Vec<CollectionId> = (0..8).map(|i| CollectionId::new(1, i)).collect();
    {
        let mut t = Transaction::new();
        for c in &colls {
            t.create_collection(*c);
        }
        store.submit(t)?.wait()?;
    }
    let mut results = Vec::new();
    let secs = opts.seconds;
    let block4k = Bytes::from(Rng::new(1).bytes(4096));
    let report = |r: BenchResult, results: &mut Vec<BenchResult>| {
        progress(&format!(
            "{:<24} qd {:>2}: {:>9.0} ops/s {:>8.1} MiB/s  p50 {:>7.3} ms  p99 {:>7.3} ms  peak RSS {:>6.1} MiB",
            r.name, r.queue_depth, r.ops_per_s, r.mib_per_s, r.p50_ms, r.p99_ms, r.peak_rss_mib
        ));
        results.push(r);
    };

    // 4 KiB new objects.
    let want = |name: &str| opts.only.is_empty() || opts.only.iter().any(|n| n == name);
    let mut created = 0u64;
    for (qd, name) in [(1, "write_4k_new_qd1"), (16, "write_4k_new_qd16")] {
        if !want(name) {
            continue;
        }
        let base = created;
        let o = drive(qd, secs, u64::MAX, |_, i| {
            write_new(&store, colls[0], "s", base + i, &block4k)
        })?;
        created += o.ops;
        report(summarize(name, qd, o), &mut results);
    }
    store.flush()?;
    // 4 KiB overwrites of those objects.
    for (qd, name) in [(1, "overwrite_4k_qd1"), (16, "overwrite_4k_qd16")] {
        if !want(name) {
            continue;
        }
        if created == 0 {
            let o = drive(16, 1e7, 20_000, |_, i| {
                write_new(&store, colls[0], "s", i, &block4k)
            })?;
            created = o.ops;
        }
        let o = drive(qd, secs, u64::MAX, |t, i| {
            let mut r = Rng::new(i ^ ((t as u64) << 40));
            write_new(&store, colls[0], "s", r.below(created.max(1)), &block4k)
        })?;
        report(summarize(name, qd, o), &mut results);
    }
    // 4 MiB objects.
    // 4 KiB-aligned, as the OSD hands the store large payloads (the messenger aligns them):
    // written straight to the device after the checksums, without a bounce copy.
    let big = Bytes::from_owner(AlignedBuf::copy_of(&Rng::new(2).bytes(4 << 20)));
    // At most this many distinct 4 MiB objects (about 3/4 of the free space): a fast device
    // fills an 8 GiB store in a few seconds, so later writes replace the earliest objects
    // (whole-object copy-on-write writes like the first ones, freeing the old extents).
    let big_slots = (store.free_bytes() / (4 << 20) * 3 / 4).max(1);
    let mut big_objects = 0;
    if want("write_4m_qd4") {
        let o = drive(4, secs, u64::MAX, |_, i| {
            write_new(&store, colls[1], "m", i % big_slots, &big)
        })?;
        big_objects = o.ops.min(big_slots);
        report(summarize("write_4m_qd4", 4, o), &mut results);
    }
    if (want("randread_4k_qd16_cold") || want("overwrite_4k_in_4m_qd16")) && big_objects == 0 {
        let o = drive(4, 1e7, 512.min(big_slots), |_, i| {
            write_new(&store, colls[1], "m", i, &big)
        })?;
        big_objects = o.ops;
    }

    // Cold random reads: remount (empty metadata cache), drop data pages.
    store.close()?;
    store = KelpStore::mount(dir, opts.config.clone())?;
    store.drop_data_cache()?;
    if want("randread_4k_qd16_cold") {
        let o = drive(16, secs, u64::MAX, |t, i| {
            let mut r = Rng::new(i.wrapping_mul(31) ^ ((t as u64) << 48) ^ 0xabc);
            let which = r.below(big_objects.max(1));
            let off = r.below(1024) * 4096;
            let d = store.read(colls[1], &obj("m", which), off, 4096)?;
            Ok(d.len() as u64)
        })?;
        report(summarize("randread_4k_qd16_cold", 16, o), &mut results);
    }
    if want("overwrite_4k_in_4m_qd16") {
        let o = drive(16, secs, u64::MAX, |t, i| {
            let mut r = Rng::new(i.wrapping_mul(37) ^ ((t as u64) << 48) ^ 0xdef);
            let which = r.below(big_objects.max(1));
            let off = r.below(1024) * 4096;
            let mut tx = Transaction::new();
            tx.write(colls[1], &obj("m", which), off, block4k.clone());
            store.submit(tx)?.wait()?;
            Ok(4096)
        })?;
        report(summarize("overwrite_4k_in_4m_qd16", 16, o), &mut results);
    }

    // Metadata-heavy ingests, each in a store of its own so that compaction of the earlier
    // tests' garbage cannot make the metadata growth look smaller than it is.
    store.close()?;
    let n = opts.objects.max(10);
    let mut ingest = None;
    let mut metadata_bytes_per_object = None;
    if want("create_1m_4k_qd16") {
        let ingest_dir = dir.join("ingest");
        mkfs(&ingest_dir, &opts.mkfs)?;
        let store = KelpStore::mount(&ingest_dir, opts.config.clone())?;
        store
            .submit(Transaction::new().create_collection(colls[2]).clone())?
            .wait()?;
        store.compact_metadata()?;
        let meta_before = store.metadata_bytes();
        let (o, rep) = ingest_run(n, |_, i| write_new(&store, colls[2], "c", i, &block4k))?;
        report(summarize("create_1m_4k_qd16", 16, o), &mut results);
        store.flush()?;
        store.compact_metadata()?;
        let meta_after = store.metadata_bytes();
        metadata_bytes_per_object = Some(meta_after.saturating_sub(meta_before) as f64 / n as f64);
        ingest = Some(rep);
        store.close()?;
    }
    let mut index_ingest = None;
    if want("index_ingest_qd16") {
        let ingest_dir = dir.join("index-ingest");
        mkfs(&ingest_dir, &opts.mkfs)?;
        let store = KelpStore::mount(&ingest_dir, opts.config.clone())?;
        let sim = IndexSim::create(&store)?;
        let (o, rep) = ingest_run(n, |t, i| sim.put(&store, t, i))?;
        report(summarize("index_ingest_qd16", 16, o), &mut results);
        index_ingest = Some(rep);
        store.close()?;
    }
    Ok(BenchReport {
        peak_rss_mib: overall_peak(&results),
        results,
        cache_budget_mib: opts.config.cache_budget.0 as f64 / (1 << 20) as f64,
        metadata_bytes_per_object,
        ingest,
        index_ingest,
        config: opts.config.clone(),
        mkfs: opts.mkfs,
    })
}

/// Runs `op(i)` for `i` in `0..n` from 16 threads and reports the rate of each successive
/// block of 100 000 ops (tenths of `n` if fewer than a million).
fn ingest_run(
    n: u64,
    op: impl Fn(usize, u64) -> Result<u64> + Sync,
) -> Result<(Outcome, IngestReport)> {
    let block = if n >= 1_000_000 {
        100_000
    } else {
        n.div_ceil(10)
    };
    let marks: Vec<AtomicU64> = (0..n.div_ceil(block)).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicU64::new(0);
    let t0 = Instant::now();
    let o = drive(16, 1e7, n, |t, i| {
        let b = op(t, i)?;
        let d = done.fetch_add(1, Ordering::Relaxed) + 1;
        if d.is_multiple_of(block) || d == n {
            marks[((d - 1) / block) as usize]
                .store(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        Ok(b)
    })?;
    let mut rates = Vec::new();
    let mut prev = 0u64;
    for (k, m) in marks.iter().enumerate() {
        let t = m.load(Ordering::Relaxed);
        let count = block.min(n - k as u64 * block);
        rates.push(count as f64 / ((t.saturating_sub(prev)).max(1) as f64 / 1e6));
        prev = t;
    }
    let first = rates.first().copied().unwrap_or(0.0);
    let last = rates.last().copied().unwrap_or(0.0);
    Ok((
        o,
        IngestReport {
            objects: n,
            ops_per_s_by_block: rates,
            block_size: block,
            first_block_ops_per_s: first,
            last_block_ops_per_s: last,
            change_percent: if first > 0.0 {
                (last - first) / first * 100.0
            } else {
                0.0
            },
        },
    ))
}

/// Index pool PGs, data pool PGs and bucket index shards of [`IndexSim`].
const SIM_INDEX_PGS: u32 = 8;
const SIM_DATA_PGS: u32 = 32;
const SIM_SHARDS: u32 = 47;
/// PG-log entries kept per PG (the OSD's default `osd_max_pg_log_entries`).
const SIM_LOG_ENTRIES: u64 = 3000;

/// What an S3 ingest into one bucket asks of each OSD of a size-3 pool on three OSDs (every
/// OSD holds every PG), modelled on the store API as the OSD uses it. Per object, three
/// transactions one after the other, each also appending its PG's log entry (overwriting
/// the ring slot of the entry `osd_max_pg_log_entries` older), rewriting the PG info and
/// stamping the object's version and mtime attributes:
///
/// 1. the index shard's guard key (the reshard marker) read, then a pending entry set in the
///    shard object's omap under the uploading thread's reused slot key;
/// 2. the object's 1 KiB head written with its S3 attributes (data pool);
/// 3. the marker, the pending entry and the object's key read (guards), then the pending entry
///    removed and the object's index entry (`o<key>`, ~100 bytes) set.
struct IndexSim {
    /// Next PG-log version per PG: index PGs first, then data PGs.
    versions: Vec<AtomicU64>,
}

impl IndexSim {
    fn index_coll(pg: u32) -> CollectionId {
        CollectionId::new(7, pg)
    }
    fn data_coll(pg: u32) -> CollectionId {
        CollectionId::new(8, pg)
    }
    fn pgmeta(coll: CollectionId) -> ObjectId {
        ObjectId::new(coll.0.pool.0, "", "pgmeta", coll.0.seed)
    }

    fn create(store: &KelpStore) -> Result<IndexSim> {
        let mut t = Transaction::new();
        let colls = (0..SIM_INDEX_PGS)
            .map(Self::index_coll)
            .chain((0..SIM_DATA_PGS).map(Self::data_coll));
        for c in colls {
            t.create_collection(c).touch(c, &Self::pgmeta(c));
        }
        for s in 0..SIM_SHARDS {
            let (coll, oid) = Self::shard(s);
            t.touch(coll, &oid)
                .omap_set_header(coll, &oid, b"bucket index shard".to_vec());
        }
        store.submit(t)?.wait()?;
        Ok(IndexSim {
            versions: (0..SIM_INDEX_PGS + SIM_DATA_PGS)
                .map(|_| AtomicU64::new(1))
                .collect(),
        })
    }

    fn shard(s: u32) -> (CollectionId, ObjectId) {
        let name = format!("b-1234abcd.{s}");
        let h = test_hash(&name);
        (
            Self::index_coll(h % SIM_INDEX_PGS),
            ObjectId::new(7, "", &name, h),
        )
    }

    /// The PG-log append (into its ring slot) and info update, and the object's version stamp.
    fn stamp(&self, t: &mut Transaction, coll: CollectionId, slot: usize, oid: &ObjectId) {
        let v = self.versions[slot].fetch_add(1, Ordering::Relaxed);
        let meta = Self::pgmeta(coll);
        let mut entry = Vec::with_capacity(120);
        entry.extend_from_slice(&v.to_le_bytes());
        entry.extend_from_slice(oid.name.as_bytes());
        entry.extend_from_slice(b"client.4172.0:1234567 epoch 42 op write");
        let slot = v % SIM_LOG_ENTRIES;
        t.omap_set(
            coll,
            &meta,
            BTreeMap::from([(slot.to_be_bytes().to_vec(), entry)]),
        );
        t.omap_set_header(coll, &meta, [v.to_le_bytes(), v.to_le_bytes()].concat());
        t.set_xattr(coll, oid, "@v", v.to_le_bytes().to_vec());
        t.set_xattr(coll, oid, "@m", (v << 20).to_le_bytes().to_vec());
    }

    fn put(&self, store: &KelpStore, thread: usize, i: u64) -> Result<u64> {
        let key = format!("bench/1a2b3c4d/put-{i:010}");
        let hash = test_hash(&key);
        let s = hash % SIM_SHARDS;
        let (icoll, shard) = Self::shard(s);
        let islot = (icoll.0.seed) as usize;
        let marker = b"\x01r".to_vec();
        // The gateway's reused pending slot: one per concurrent upload.
        let pending = format!("pgw1.b-1234abcd.{s}.{thread}").into_bytes();
        let okey = format!("o{key}").into_bytes();

        store.omap_get(icoll, &shard, std::slice::from_ref(&marker))?;
        let mut t = Transaction::new();
        t.omap_set(
            icoll,
            &shard,
            BTreeMap::from([(pending.clone(), key.as_bytes().to_vec())]),
        );
        self.stamp(&mut t, icoll, islot, &shard);
        store.submit(t)?.wait()?;

        let dpg = hash % SIM_DATA_PGS;
        let dcoll = Self::data_coll(dpg);
        let head = ObjectId::new(8, "", &format!("b-1234abcd_{key}"), hash);
        let mut t = Transaction::new();
        t.write(dcoll, &head, 0, Bytes::from(Rng::new(i).bytes(1024)));
        t.set_xattr(
            dcoll,
            &head,
            "_rgw.etag",
            b"0123456789abcdef0123456789abcdef".to_vec(),
        );
        t.set_xattr(dcoll, &head, "_rgw.meta", vec![b'm'; 120]);
        self.stamp(&mut t, dcoll, (SIM_INDEX_PGS + dpg) as usize, &head);
        store.submit(t)?.wait()?;

        store.omap_get(icoll, &shard, &[marker, pending.clone(), okey.clone()])?;
        let mut t = Transaction::new();
        t.omap_remove(icoll, &shard, vec![pending]);
        t.omap_set(icoll, &shard, BTreeMap::from([(okey, vec![b'e'; 100])]));
        self.stamp(&mut t, icoll, islot, &shard);
        store.submit(t)?.wait()?;
        Ok(1024)
    }
}
