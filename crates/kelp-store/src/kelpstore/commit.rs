//! The committer thread: group commit of prepared transactions (one log record and one flush
//! per batch), acknowledgements, deferred write-back (gathered into runs), releases of freed
//! units, checkpoints of the metadata database. See docs/STORE.md, "Write path".

use super::*;

pub(super) struct CommitterState {
    pub(super) bitmap: Bitmap,
    pub(super) wal: Wal,
    /// Deferred records whose units were written back but not yet flushed.
    pub(super) unsynced: Unsynced,
    /// Deferred units of finished batches whose write-back waits to be joined by the next
    /// batches' (see `Gathered`).
    pub(super) gathered: Gathered,
    /// Deferred records put into the database (by batches too large for the log; see
    /// `commit_kv`): their deletions must reach it too.
    pub(super) kv_deferred: HashSet<Vec<u8>>,
}

/// One run of contiguous deferred units of finished batches, not yet written back: new small
/// objects get units one after the other, so consecutive batches usually continue the run,
/// and one `O_DIRECT` write then covers several batches instead of one write (a device round
/// trip the committer waits for) per batch. Their units stay in `pending_blocks` (readers
/// take them from there) and their `D` records in the log until the run is written; it is
/// written before the committer waits for work, before a batch with freed units or units
/// elsewhere is finished, once it holds `GATHER_MAX_UNITS`, and before a checkpoint.
#[derive(Default)]
pub(super) struct Gathered {
    /// First unit of the run and the units' contents, in order.
    pub(super) start: u64,
    pub(super) units: Vec<Arc<Vec<u8>>>,
    /// `D` records of the batches in the run, the last of those batches, and their in-flight
    /// bytes: they are published as finished (`durable_seq`) once the run is written.
    pub(super) dkeys: Vec<Vec<u8>>,
    pub(super) last_seq: u64,
    pub(super) bytes: u64,
}

/// Most units in a gathered run (1 MiB of 4 KiB units).
pub(super) const GATHER_MAX_UNITS: usize = 256;

impl Gathered {
    /// Whether units `[off, off + len)` include a gathered one.
    pub(super) fn overlaps(&self, off: u64, len: u64) -> bool {
        !self.units.is_empty()
            && off < self.start + self.units.len() as u64
            && self.start < off + len
    }

    /// Whether a batch's deferred units, one run starting at `first`, may join the run.
    pub(super) fn joins(&self, first: u64, n: usize) -> bool {
        self.units.is_empty()
            || (first == self.start + self.units.len() as u64
                && self.units.len() + n <= GATHER_MAX_UNITS)
    }
}

/// Write the gathered run back (one `O_DIRECT` write), drop its units from `pending_blocks` and
/// list its `D` records as written back. Emptied even on an error (the store fails then).
pub(super) fn write_gathered(
    inner: &Inner,
    g: &mut Gathered,
    unsynced: &mut Unsynced,
) -> Result<()> {
    if g.units.is_empty() {
        return Ok(());
    }
    let Gathered {
        start,
        units,
        dkeys,
        last_seq,
        bytes,
    } = std::mem::take(g);
    let parts: Vec<&[u8]> = units.iter().map(|d| d.as_slice()).collect();
    let buf = AlignedBuf::from_parts(&parts, parts.len() * inner.geo.unit as usize);
    inner.writeback(&buf, start * inner.geo.unit, true)?;
    {
        let _g = inner.reuse.write().unwrap_or_else(|p| p.into_inner());
        forget_written(inner, start..start + units.len() as u64, last_seq);
    }
    unsynced.keys.extend(dkeys);
    unsynced.bytes += units.len() as u64 * inner.geo.unit;
    publish_durable(inner, bytes, last_seq);
    Ok(())
}

/// Drop units just written back from `pending_blocks`, unless a later batch (after `last_seq`)
/// gave them new content meanwhile. The caller holds `reuse` exclusively.
pub(super) fn forget_written(inner: &Inner, punits: impl Iterator<Item = u64>, last_seq: u64) {
    let mut pending = lock(&inner.pending_blocks);
    for punit in punits {
        if pending.get(&punit).is_some_and(|(s, _)| *s <= last_seq) {
            pending.remove(&punit);
        }
    }
    inner.pending_len.store(pending.len(), Ordering::Release);
}

#[derive(Default)]
pub(super) struct Unsynced {
    pub(super) keys: Vec<Vec<u8>>,
    /// Bytes of deferred data in the records of `keys`.
    pub(super) bytes: u64,
}

/// A batch whose commit is durable and acknowledged: `finish_batch` writes its deferred units
/// back and then releases the freed units left to it.
pub(super) struct DurableBatch {
    /// Freed units to release after the write-back (counted in `release_pending`).
    pub(super) freed: Vec<(u64, u64)>,
    /// The batch's in-flight bytes.
    pub(super) bytes: u64,
    pub(super) deferred: BTreeMap<u64, Arc<Vec<u8>>>,
    pub(super) dkey: Vec<u8>,
    /// Metadata keys of the batch (their overlay entries are dropped).
    pub(super) merged: Vec<Vec<u8>>,
    pub(super) last_seq: u64,
}

/// The commit thread: groups queued transactions into batches and makes each durable (see
/// `commit_batch`), acknowledges them, then does what follows the acknowledgements
/// (`finish_batch`: deferred write-back, releasing freed units) before taking the next batch.
///
/// Until 2026-11-26 (commit `f6df5b5`) a second thread, the finisher, did `finish_batch`, so that the next
/// batch's log write overlapped with the write-back. On the 2-vCPU reference VM, where
/// replicated 4 KiB writes are CPU-bound, handing every batch to another thread cost more than
/// the overlap gained: two more context switches per batch (the finisher's wake-up and its
/// park) on top of the write-back's own. Finishing in the committer gave +4-10 % 4 KiB writes
/// and 5-9 % less daemon CPU per write in a cluster, with `kelp store bench`'s 4 KiB writes
/// unchanged within noise (docs/benchmarks/rados.md, 2026-11-26 08:00-09:00 UTC).
pub(super) fn committer(inner: Arc<Inner>) {
    let Some(bitmap) = lock(&inner.bitmap).take() else {
        return;
    };
    let Some(wal) = lock(&inner.wal).take() else {
        return;
    };
    let mut st = CommitterState {
        bitmap,
        wal,
        unsynced: Unsynced::default(),
        gathered: Gathered::default(),
        kv_deferred: HashSet::new(),
    };
    commit_loop(&inner, &mut st);
    let CommitterState {
        bitmap,
        mut wal,
        mut gathered,
        mut unsynced,
        ..
    } = st;
    // Clean unmount: make the database durable on its own, so the next mount replays nothing.
    if lock(&inner.failed).is_none()
        && let Err(e) = checkpoint(&inner, &mut wal, &mut gathered, &mut unsynced)
    {
        fail(&inner, &e.to_string());
    }
    *lock(&inner.bitmap) = Some(bitmap);
    *lock(&inner.wal) = Some(wal);
}

pub(super) fn commit_loop(inner: &Inner, st: &mut CommitterState) {
    let idle = Duration::from_millis(inner.cfg.deferred_cleanup_ms.max(1));
    loop {
        let (batch, shutdown) = {
            let mut q = lock(&inner.queue);
            if q.items.is_empty() && !q.shutdown {
                // Written-back deferred records are dropped after `idle` without new commits.
                q.committer_waiting = true;
                if st.unsynced.keys.is_empty() {
                    q = inner.queue_cv.wait(q).unwrap_or_else(|p| p.into_inner());
                } else {
                    q = inner
                        .queue_cv
                        .wait_timeout(q, idle)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                q.committer_waiting = false;
            }
            let max = q.items.len().min(inner.cfg.max_batch_txns.max(1));
            let n = if inner.sb.data_written_ahead() {
                // One flush covers data and record: take everything queued, and write the
                // record while the data writes still run (`commit_batch`), so the record's
                // write does not queue on the device behind them.
                max
            } else {
                // The data file is flushed before the record: wait (without the queue lock)
                // for the head's data writes, then take the longest prefix whose data is on
                // the device; transactions still writing join a later batch instead of
                // holding this one back, so data writes overlap with flushes.
                let head = q.items.front().and_then(|p| p.data_done.clone());
                if let Some(dd) = head {
                    drop(q);
                    let _ = dd.wait();
                    q = lock(&inner.queue);
                }
                let max = q.items.len().min(inner.cfg.max_batch_txns.max(1));
                q.items
                    .iter()
                    .take(max)
                    .position(|p| p.data_done.as_ref().is_some_and(|d| !d.is_done()))
                    .unwrap_or(max)
                    .max(usize::from(max > 0))
            };
            let batch: Vec<Prepared> = q.items.drain(..n).collect();
            (batch, q.shutdown)
        };
        if batch.is_empty() {
            if shutdown {
                break;
            }
            if !st.unsynced.keys.is_empty()
                && let Err(e) = cleanup_deferred(inner, st)
            {
                fail(inner, &e.to_string());
            }
            continue;
        }
        if let Err(e) = commit_batch(inner, st, batch) {
            fail(inner, &e.to_string());
        }
        // The gathered run is written before the committer waits for work (only it drains
        // the queue, so a queue found non-empty here is still so when the loop takes the next
        // batch): a quiet store holds no unwritten units, and with few writers in flight no
        // unit waits in memory longer than one commit.
        let queue_empty = lock(&inner.queue).items.is_empty();
        if queue_empty && let Err(e) = write_gathered(inner, &mut st.gathered, &mut st.unsynced) {
            fail(inner, &e.to_string());
        }
    }
}

/// Make every batch applied to the database durable there, then start the log over.
///
/// The data file is flushed first: deferred write-backs of logged batches may be only in the
/// page cache, and their `D` records only in the log (not in the database), so once the log
/// starts over nothing could replay them.
///
/// Only the committer checkpoints, between batches: every committed batch's deferred units are
/// written back then (`finish_batch` runs right after each commit), once the gathered run is.
pub(super) fn checkpoint(
    inner: &Inner,
    wal: &mut Wal,
    gathered: &mut Gathered,
    unsynced: &mut Unsynced,
) -> Result<()> {
    write_gathered(inner, gathered, unsynced)?;
    inner
        .data
        .sync_data()
        .map_err(|e| StoreError::io("flushing the data file", e))?;
    inner
        .kv
        .persist(PersistMode::SyncAll)
        .map_err(|e| StoreError::kv("syncing the metadata database", e))?;
    wal.restart()
}

/// Commit one metadata batch: durable in the write-ahead log (one `O_DIRECT` write and one
/// device flush), then applied to the database without a sync. A batch too large for the log
/// is committed to the database directly, synced, after a checkpoint (so no older logged batch
/// can be replayed over it). `wait_data` returns once the batch's new extents are written: a
/// logged record is written while they may still be in flight, and flushed after them.
///
/// Deferred-write records (`D`) of a logged batch stay in the log only: they are large (every
/// deferred unit's content), short-lived, and needed only to replay write-backs after a crash,
/// which replaying the log does (it puts them into the database, and their deletions, in
/// order); a checkpoint flushes the data file before the log starts over. Only a batch too
/// large for the log puts its `D` record into the database; `kv_deferred` names those
/// records, so that their deletions reach the database too.
pub(super) fn commit_kv(
    inner: &Inner,
    wal: &mut Wal,
    (gathered, unsynced): (&mut Gathered, &mut Unsynced),
    kv_deferred: &mut HashSet<Vec<u8>>,
    verify: &[NewRun],
    ops: Vec<KvOp>,
    wait_data: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let payload = wal::encode_record(verify, &ops);
    let logged = wal.ever_fits(payload.len());
    if !wal.fits(payload.len()) {
        checkpoint(inner, wal, gathered, unsynced)?;
    }
    let mut wait_data = Some(wait_data);
    if !logged && let Some(w) = wait_data.take() {
        w()?;
    }
    if !logged && !verify.is_empty() {
        // Not logged, so not verifiable at replay: the new extents must be durable first.
        inner
            .data
            .sync_data()
            .map_err(|e| StoreError::io("flushing the data file", e))?;
    }
    if logged {
        wal.append_then_sync(&payload, || wait_data.take().map_or(Ok(()), |w| w()))?;
    }
    drop(payload);
    let mut b = inner.kv.batch();
    if !logged {
        b = b.durability(Some(PersistMode::SyncData));
    }
    for (part, k, v) in ops {
        let p = if part == PART_META {
            &inner.meta
        } else if logged && (v.is_some() || !kv_deferred.remove(&k)) {
            continue;
        } else {
            if v.is_some() {
                kv_deferred.insert(k.clone());
            } else {
                kv_deferred.remove(&k);
            }
            &inner.deferred_part
        };
        match v {
            Some(v) => b.insert(p, k, v),
            None => b.remove(p, k),
        }
    }
    b.commit()
        .map_err(|e| StoreError::kv("committing a metadata batch", e))
}

pub(super) fn fail(inner: &Inner, reason: &str) {
    let mut f = lock(&inner.failed);
    if f.is_none() {
        *f = Some(reason.to_string());
    }
    drop(f);
    // Fail everything still queued.
    let items: Vec<Prepared> = lock(&inner.queue).items.drain(..).collect();
    for p in items {
        let _ = p.done.send(Err(StoreError::Failed {
            reason: reason.to_string(),
        }));
    }
    inner.durable_cv.notify_all();
}

pub(super) fn cleanup_deferred(inner: &Inner, st: &mut CommitterState) -> Result<()> {
    // Taken before the flush: their write-backs are done, so the flush covers them.
    let keys = std::mem::take(&mut st.unsynced).keys;
    inner
        .data
        .sync_data()
        .map_err(|e| StoreError::io("flushing the data file", e))?;
    let ops = keys.into_iter().map(|k| (PART_DEFERRED, k, None)).collect();
    commit_kv(
        inner,
        &mut st.wal,
        (&mut st.gathered, &mut st.unsynced),
        &mut st.kv_deferred,
        &[],
        ops,
        || Ok(()),
    )
}

/// Deferred-write records are dropped (after a data-file flush) at the latest once this many
/// batches have accumulated; earlier if a batch flushes the data file anyway or when idle.
/// Each drop costs a data-file flush; the records themselves live in the log (bounded by its
/// size, and a checkpoint flushes the data file anyway), so the bound is loose: 64 batches /
/// 1 MiB here cost 5-20 % of a 4 KiB ingest (docs/benchmarks/store.md, 2026-11-25 01:45-03:00 UTC).
pub(super) const CLEANUP_BATCHES: usize = 1024;
/// ... or once they hold this much data (bounds the dirty write-back in the page cache that the
/// flush then has to write).
pub(super) const CLEANUP_BYTES: u64 = 16 << 20;

pub(super) fn commit_batch(
    inner: &Inner,
    st: &mut CommitterState,
    batch: Vec<Prepared>,
) -> Result<()> {
    let last_seq = batch.last().map_or(0, |p| p.seq);
    // Deferred unit contents of the whole batch, last writer wins.
    let mut deferred: BTreeMap<u64, Arc<Vec<u8>>> = BTreeMap::new();
    for p in &batch {
        for (u, d) in &p.deferred {
            deferred.insert(*u, d.clone());
        }
    }
    let dkey = keys::deferred_key(last_seq);
    let result = (|| -> Result<Vec<Vec<u8>>> {
        inner.check_failed()?;
        // 1. New extents reach the device before the metadata that points at them is durable:
        //    with a data-file flush, they are written before it; otherwise (prewritten data
        //    file) the log record is written while they are still in flight and the log's
        //    flush follows them (see `wait_data` in `commit_kv`).
        let wait_data = || -> Result<()> {
            for p in &batch {
                if let Some(dd) = &p.data_done {
                    dd.wait().map_err(|reason| StoreError::Failed {
                        reason: format!("data write failed: {reason}"),
                    })?;
                }
            }
            Ok(())
        };
        let wrote = batch.iter().any(|p| p.wrote_data);
        // Records to drop: taken before the data flush below, which then covers their
        // write-backs (`finish_batch` lists a record only once its units are written back).
        let dropped = {
            let u = &mut st.unsynced;
            let due = wrote || u.keys.len() >= CLEANUP_BATCHES || u.bytes >= CLEANUP_BYTES;
            if due {
                std::mem::take(u).keys
            } else {
                Vec::new()
            }
        };
        let cleanup = !dropped.is_empty();
        // On a prewritten data file the new extents need no separate flush: the log's flush
        // (one device cache flush, after the data writes completed) makes both durable, and
        // replay verifies the last record's new extents (a crash during that flush may have
        // kept the record but not the data). Deferred write-backs go through the page cache,
        // so dropping their records still needs a real data-file sync.
        let data_flush = cleanup || (wrote && !inner.sb.data_written_ahead());
        if data_flush {
            wait_data()?;
            inner
                .data
                .sync_data()
                .map_err(|e| StoreError::io("flushing the data file", e))?;
        }
        let verify = if wrote && !data_flush {
            let freed: Vec<(u64, u64)> =
                batch.iter().flat_map(|p| p.freed.iter().copied()).collect();
            verify_runs(
                batch.iter().flat_map(|p| p.new_runs.iter()),
                &deferred,
                &freed,
                inner.geo.bpu as usize,
            )
        } else {
            Vec::new()
        };
        // 2. One atomic metadata batch for every transaction of the group.
        let mut merged: BTreeMap<&[u8], &Option<Value>> = BTreeMap::new();
        for p in &batch {
            for (k, v) in &p.mutations {
                merged.insert(k, v);
            }
            for &(off, len) in &p.allocated {
                st.bitmap.set_range(off, len, true);
            }
            for &(off, len) in &p.freed {
                st.bitmap.set_range(off, len, false);
            }
        }
        let mut ops: Vec<KvOp> = Vec::with_capacity(merged.len() + 8);
        for (k, v) in &merged {
            ops.push((PART_META, k.to_vec(), v.as_ref().map(|v| v.to_vec())));
        }
        for (chunk, v) in st.bitmap.take_dirty() {
            ops.push((PART_META, keys::bitmap_key(chunk), Some(v)));
        }
        if !deferred.is_empty() {
            let list: Vec<(u64, &[u8])> =
                deferred.iter().map(|(u, d)| (*u, d.as_slice())).collect();
            ops.push((
                PART_DEFERRED,
                dkey.clone(),
                Some(codec::encode_deferred(&list)),
            ));
        }
        for k in dropped {
            ops.push((PART_DEFERRED, k, None));
        }
        commit_kv(
            inner,
            &mut st.wal,
            (&mut st.gathered, &mut st.unsynced),
            &mut st.kv_deferred,
            &verify,
            ops,
            wait_data,
        )?;
        Ok(merged.keys().map(|k| k.to_vec()).collect())
    })();
    let merged = match result {
        Ok(m) => m,
        Err(e) => {
            let reason = e.to_string();
            for p in batch {
                let _ = p.done.send(Err(StoreError::Failed {
                    reason: reason.clone(),
                }));
            }
            return Err(e);
        }
    };
    // The batch is durable: the committer acknowledges it at once (in commit order, as it
    // commits batches one after the other), before its write-back: acknowledging after the
    // previous batch's write-back put a device round trip on every acknowledgement's path,
    // and that fed on itself: small batches, each waiting for a device round trip, halved
    // `kelp store bench`'s 4 KiB writes (~25 000 instead of ~50 000 ops/s).
    let (freed, bytes) = release_and_ack(inner, batch, &deferred, &st.gathered);
    finish_batch(
        inner,
        (&mut st.gathered, &mut st.unsynced),
        DurableBatch {
            freed,
            bytes,
            deferred,
            dkey,
            merged,
            last_seq,
        },
    );
    Ok(())
}

/// The new extents of a batch that replay must find intact for its record to count (see
/// `mount.rs`): every new run of its transactions, less two kinds of units.
/// - Units that a deferred write of this batch also targets: their write-back may already have
///   replaced the new extent's content.
/// - Units that a later transaction of the same batch freed (an object written and then
///   overwritten or removed within one group commit): the batch's final state does not use
///   them, and they are released as soon as the batch is acknowledged (`release_and_ack`), so
///   the next batch may write its own data there before its record reaches the log. Verifying
///   them made a crash at that moment drop this acknowledged batch at replay.
pub(super) fn verify_runs<'a>(
    new_runs: impl Iterator<Item = &'a NewRun>,
    deferred: &BTreeMap<u64, Arc<Vec<u8>>>,
    freed: &[(u64, u64)],
    bpu: usize,
) -> Vec<NewRun> {
    let skip =
        |u: u64| deferred.contains_key(&u) || freed.iter().any(|&(o, l)| u >= o && u < o + l);
    let mut verify = Vec::new();
    for (punit, units, csums) in new_runs {
        let mut i = 0u64;
        while i < *units {
            if skip(punit + i) {
                i += 1;
                continue;
            }
            let s = i;
            while i < *units && !skip(punit + i) {
                i += 1;
            }
            verify.push((
                punit + s,
                i - s,
                csums[s as usize * bpu..i as usize * bpu].to_vec(),
            ));
        }
    }
    verify
}

/// Acknowledge a durable batch's transactions, releasing first the units it freed that no
/// write-back can clobber any more: every earlier batch is written back already except for the
/// gathered run, so those that neither the gathered run nor its own deferred writes target
/// (`finish_batch` releases the others after writing both). Releasing before the acknowledgement means a
/// client that waited for a delete finds the space free; units left for `finish_batch` (after
/// the batch's write-back) are counted in `release_pending` before it, and a transaction
/// refused for lack of space while some are pending waits for them and tries again (`submit`).
/// Returns the freed units left for `finish_batch` and the batch's in-flight bytes.
pub(super) fn release_and_ack(
    inner: &Inner,
    batch: Vec<Prepared>,
    deferred: &BTreeMap<u64, Arc<Vec<u8>>>,
    gathered: &Gathered,
) -> (Vec<(u64, u64)>, u64) {
    let mut freed = Vec::new();
    let mut bytes = 0;
    if batch.iter().any(|p| !p.freed.is_empty()) {
        let _g = inner.reuse.write().unwrap_or_else(|p| p.into_inner());
        let mut a = lock(&inner.alloc);
        for p in &batch {
            for &(off, len) in &p.freed {
                if deferred.range(off..off + len).next().is_some() || gathered.overlaps(off, len) {
                    freed.push((off, len));
                } else {
                    a.release(off, len);
                }
            }
        }
    }
    inner
        .release_pending
        .fetch_add(freed.len(), Ordering::AcqRel);
    for p in batch {
        bytes += p.bytes;
        let _ = p.done.send(Ok(()));
    }
    (freed, bytes)
}

/// A batch's deferred units are written back with `O_DIRECT` when they form at most this many
/// runs of contiguous units, else through the page cache. Direct: no copy into newly allocated
/// page-cache pages (13.5 % of all CPU of replicated 4 KiB writes of new objects, whose units
/// are allocated one after the other) and no dirty pages for the kernel to write later; but
/// each run is one device round trip, made one after the other by the committer, so scattered
/// units (4 KiB overwrites, whose new units reuse freed space) halved the store's 4 KiB
/// overwrite rate at queue depth 16 (32 000 -> 15 700 ops/s); through the page cache those
/// are a memory copy each (their pages are usually cached: the space was written recently).
pub(super) const WRITEBACK_DIRECT_RUNS: usize = 2;

/// After a batch's commit is durable and acknowledged (the committer, before it takes the next
/// batch): write the deferred units back, release the freed units left to it, and publish the
/// batch as done (`durable_seq`).
pub(super) fn finish_batch(
    inner: &Inner,
    (gathered, unsynced): (&mut Gathered, &mut Unsynced),
    d: DurableBatch,
) {
    let DurableBatch {
        freed,
        bytes,
        deferred,
        dkey,
        merged,
        last_seq,
    } = d;
    // A batch whose deferred units form one run, and that leaves no freed units to release
    // after its write-back, joins the gathered run if it continues it (else the gathered run is
    // written first, and this batch starts a new one). Any other batch writes the gathered run
    // first: its freed units may be among the gathered ones, and must not be released before
    // their write-back.
    let first = deferred.keys().next().copied().unwrap_or(0);
    let gather = !deferred.is_empty()
        && freed.is_empty()
        && deferred.len() <= GATHER_MAX_UNITS
        && deferred.keys().next_back() == Some(&(first + deferred.len() as u64 - 1));
    let mut gathered_result = Ok(());
    if !gather || !gathered.joins(first, deferred.len()) {
        gathered_result = write_gathered(inner, gathered, unsynced);
    }
    if gather && gathered_result.is_ok() {
        if gathered.units.is_empty() {
            gathered.start = first;
        }
        gathered.units.extend(deferred.into_values());
        gathered.dkeys.push(dkey);
        gathered.last_seq = last_seq;
        // Published as finished with the run's write-back (`write_gathered`).
        gathered.bytes += bytes;
        drop_overlay(inner, merged, last_seq);
        return;
    }
    // What follows the acknowledgements only makes the data file catch up with the metadata
    // (and is replayed from the `D` record after a crash).
    // Write back deferred units (contiguous units in one write), then drop them from
    // `pending_blocks` and release freed space, excluding readers that may be using old extent
    // maps. The writes need no exclusion: until its unit leaves `pending_blocks`, every reader
    // takes a deferred unit from there (`apply_unwritten`, after its device read), whatever
    // it read from the device meanwhile; and the device holds the new content before any
    // reader can miss it there.
    let writeback = gathered_result.and_then(|()| {
        let u = inner.geo.unit as usize;
        let units: Vec<(&u64, &Arc<Vec<u8>>)> = deferred.iter().collect();
        let mut runs = Vec::new();
        let mut i = 0;
        while i < units.len() {
            let mut j = i + 1;
            while j < units.len() && *units[j].0 == *units[j - 1].0 + 1 && j - i < 256 {
                j += 1;
            }
            runs.push(i..j);
            i = j;
        }
        let direct = runs.len() <= WRITEBACK_DIRECT_RUNS;
        for r in runs {
            let off = *units[r.start].0 * inner.geo.unit;
            let parts: Vec<&[u8]> = units[r].iter().map(|(_, d)| d.as_slice()).collect();
            if !direct && parts.len() == 1 {
                // Through the page cache, one unit needs no aligned copy.
                inner.writeback(parts[0], off, false)?;
            } else {
                let buf = AlignedBuf::from_parts(&parts, parts.len() * u);
                inner.writeback(&buf, off, direct)?;
            }
        }
        let _g = inner.reuse.write().unwrap_or_else(|p| p.into_inner());
        forget_written(inner, deferred.keys().copied(), last_seq);
        let mut a = lock(&inner.alloc);
        for &(off, len) in &freed {
            a.release(off, len);
        }
        Ok(())
    });
    // Counted down even if the write-back failed: the store is failed then, and a waiting
    // transaction must see that rather than wait for space.
    inner
        .release_pending
        .fetch_sub(freed.len(), Ordering::AcqRel);
    if !deferred.is_empty() && writeback.is_ok() {
        unsynced.keys.push(dkey);
        unsynced.bytes += deferred.len() as u64 * inner.geo.unit;
    }
    publish_finished(inner, merged, bytes, last_seq);
    if let Err(e) = writeback {
        fail(inner, &e.to_string());
    }
}

/// A finished batch: drop its overlay entries, count its in-flight bytes down and publish it as
/// done.
pub(super) fn publish_finished(inner: &Inner, merged: Vec<Vec<u8>>, bytes: u64, last_seq: u64) {
    drop_overlay(inner, merged, last_seq);
    publish_durable(inner, bytes, last_seq);
}

/// Drop a committed batch's overlay entries: its metadata is in the database.
pub(super) fn drop_overlay(inner: &Inner, merged: Vec<Vec<u8>>, last_seq: u64) {
    let mut ov = inner.overlay.write().unwrap_or_else(|p| p.into_inner());
    for k in merged {
        if ov.get(&k).is_some_and(|(s, _)| *s <= last_seq) {
            ov.remove(&k);
        }
    }
}

/// Publish every batch up to `last_seq` as finished (`durable_seq`: `flush` returns once its
/// batches are, their deferred units written back) and count their in-flight bytes down.
pub(super) fn publish_durable(inner: &Inner, bytes: u64, last_seq: u64) {
    let wake = {
        let mut q = lock(&inner.queue);
        q.inflight_bytes = q.inflight_bytes.saturating_sub(bytes);
        q.durable_seq = last_seq;
        q.durable_waiters > 0
    };
    if wake {
        inner.durable_cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(punit: u64, units: u64) -> NewRun {
        (punit, units, (0..units as u32 * 2).collect())
    }

    #[test]
    fn verify_runs_leave_out_units_freed_or_deferred_in_the_same_batch() {
        // Two transactions of one batch: the first writes units 10..14, the second overwrites
        // that object with units 20..22 and so frees 10..14; unit 21 also gets a deferred write.
        let runs = [run(10, 4), run(20, 2), run(30, 3)];
        let mut deferred = BTreeMap::new();
        deferred.insert(21, Arc::new(vec![0u8; 4096]));
        let freed = [(10, 4), (31, 1)];
        let v = verify_runs(runs.iter(), &deferred, &freed, 2);
        assert_eq!(
            v,
            vec![
                (20, 1, vec![0, 1]),
                (30, 1, vec![0, 1]),
                (32, 1, vec![4, 5]),
            ]
        );
        // Nothing freed or deferred: every run is verified whole.
        let v = verify_runs(runs.iter(), &BTreeMap::new(), &[], 2);
        assert_eq!(v, runs.to_vec());
    }
}
