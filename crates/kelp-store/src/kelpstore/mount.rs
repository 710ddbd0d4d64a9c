//! Creating, opening and closing a store: mkfs, the metadata database (fjall) and its recovery,
//! the lock file, mount (superblock checks, log replay, allocator, threads), unmount.

use super::*;

pub(super) fn kv_config(dir: &Path, cfg: &StoreConfig) -> fjall::Config {
    fjall::Config::new(dir.join(META_DIR))
        .cache_size(cfg.block_cache_bytes())
        .max_write_buffer_size(cfg.write_buffer_bytes())
        .manual_journal_persist(true)
}

pub(super) fn open_partitions(kv: &Keyspace) -> Result<(PartitionHandle, PartitionHandle)> {
    let meta = kv
        .open_partition(PARTITION, PartitionCreateOptions::default())
        .map_err(|e| StoreError::kv("opening the metadata partition", e))?;
    let deferred = kv
        .open_partition(DEFERRED_PARTITION, PartitionCreateOptions::default())
        .map_err(|e| StoreError::kv("opening the deferred-write partition", e))?;
    Ok((meta, deferred))
}

/// Most flush rounds of [`flush_recovered_memtables`]: each round flushes at least one queued
/// memtable (else the loop ends), so this only guards against a fjall change looping forever.
pub(super) const MAX_RECOVERY_FLUSH_ROUNDS: usize = 100_000;

/// Recover the database *without* fjall's background threads and flush every memtable it
/// holds: the sealed memtables recovered from its sealed journals and the active ones (then the
/// keyspace is dropped and opened normally by the caller, with an empty write buffer).
///
/// Why: fjall 2.x wakes its flush worker once per *partition* with queued memtables at startup
/// (`start_background_threads` releases its semaphore `queue_count()` times), and each wake-up
/// flushes at most `flush_workers` memtables (`available_parallelism - 1`, capped at 4; 1 on a
/// 2-CPU machine). A store killed (or stopped while fjall had rotations pending) with two or
/// more sealed journals holding one partition therefore leaves sealed memtables queued that
/// no wake-up ever flushes: their bytes stay in fjall's write-buffer counter forever, the
/// monitor does not rotate partitions that have queued flushes, and once that counter is above
/// `max_write_buffer_size` every write halts for good ("write halt because of write buffer
/// saturation" every 10 ms, with an idle flusher) — during the write-ahead log replay of mount
/// or later under load. Stranded memtables also survived restarts (their journals were never
/// dropped), so they accumulated. Flushing here, in this thread, with no flush worker running,
/// uses fjall's inline flush (`force_flush`, which must not race a flush worker: none exists on
/// a keyspace from `create_or_recover`).
pub(super) fn flush_recovered_memtables(dir: &Path, cfg: &StoreConfig) -> Result<()> {
    let kv = Keyspace::create_or_recover(kv_config(dir, cfg))
        .map_err(|e| StoreError::kv("recovering the metadata database", e))?;
    let (meta, deferred) = open_partitions(&kv)?;
    for p in [&meta, &deferred] {
        // Seal the active memtable too (queued like the recovered ones; the flush worker it
        // signals does not exist here), so the replay that follows starts with nothing buffered.
        p.rotate_memtable()
            .map_err(|e| StoreError::kv("sealing a recovered memtable", e))?;
    }
    let mut rounds = 0;
    loop {
        let before = kv.flushes_completed();
        kv.force_flush()
            .map_err(|e| StoreError::kv("flushing recovered memtables", e))?;
        if kv.flushes_completed() == before {
            break;
        }
        rounds += 1;
        if rounds >= MAX_RECOVERY_FLUSH_ROUNDS {
            return Err(StoreError::corrupt(
                "metadata database: recovered memtables do not drain",
            ));
        }
    }
    kv.persist(PersistMode::SyncAll)
        .map_err(|e| StoreError::kv("syncing the recovered metadata", e))?;
    Ok(())
}

/// During the write-ahead log replay (up to 64 MiB of batches applied back to back): once the
/// active memtables hold half the write buffer, seal the largest so that fjall's flush worker
/// starts on it at once, instead of letting the replay run into fjall's write halt and wait for
/// its monitor (which checks every 250 ms).
pub(super) fn relieve_write_buffer(cfg: &StoreConfig, parts: &[&PartitionHandle]) -> Result<()> {
    use fjall::AbstractTree;
    let active: u64 = parts
        .iter()
        .map(|p| u64::from(p.tree.active_memtable_size()))
        .sum();
    if active <= cfg.write_buffer_bytes() / 2 {
        return Ok(());
    }
    if let Some(p) = parts.iter().max_by_key(|p| p.tree.active_memtable_size()) {
        p.rotate_memtable()
            .map_err(|e| StoreError::kv("sealing a metadata memtable", e))?;
    }
    Ok(())
}

pub(super) fn open_kv(
    dir: &Path,
    cfg: &StoreConfig,
) -> Result<(Keyspace, PartitionHandle, PartitionHandle)> {
    flush_recovered_memtables(dir, cfg)?;
    let kv = kv_config(dir, cfg)
        .open()
        .map_err(|e| StoreError::kv("opening the metadata database", e))?;
    let (meta, deferred) = open_partitions(&kv)?;
    Ok((kv, meta, deferred))
}

pub(super) fn take_lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StoreError::io(format!("opening {}", path.display()), e))?;
    // A store closed a moment ago can still look locked: a process forking a child at that
    // moment lends the child its descriptors until the child's exec, and the lock goes with
    // them. So a held lock is retried for a short while before it is reported.
    let deadline = std::time::Instant::now() + LOCK_RETRY;
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(f),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked {
                    path: dir.to_path_buf(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::io("locking the store", e));
            }
        }
    }
}

/// How long a held store lock is retried before mounting fails with `Locked`.
pub(super) const LOCK_RETRY: Duration = Duration::from_secs(1);

pub(super) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(super) fn random_id() -> String {
    // Not security relevant: distinguishes stores. Time, pid and std's random hash keys.
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(t);
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// Create a new store in `dir` (created if missing; must not already hold a store).
pub fn mkfs(dir: &Path, opts: &MkfsOptions) -> Result<Superblock> {
    let unit = opts.min_alloc_size.0;
    let cb = opts.csum_block_size.0;
    if cb < 512 || unit < cb || !unit.is_multiple_of(cb) || !unit.is_power_of_two() {
        return Err(StoreError::InvalidArgument {
            reason: format!(
                "min_alloc_size ({unit}) must be a power of two and a multiple of csum_block_size ({cb} >= 512)"
            ),
        });
    }
    let size = opts.size.0 / unit * unit;
    if size < 16 * unit {
        return Err(StoreError::InvalidArgument {
            reason: format!("store size {} is too small", opts.size),
        });
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| StoreError::io(format!("creating {}", dir.display()), e))?;
    if dir.join(superblock::FILE_NAME).exists() || dir.join(META_DIR).exists() {
        return Err(StoreError::AlreadyExists {
            path: dir.to_path_buf(),
        });
    }
    let _lock = take_lock(dir)?;
    let data = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(dir.join(DATA_FILE))
        .map_err(|e| StoreError::io("creating the data file", e))?;
    data.set_len(size)
        .map_err(|e| StoreError::io("sizing the data file", e))?;
    let grows = opts.grow && !opts.prewrite;
    let mut data_written = None;
    if opts.prewrite {
        grow::write_zeros(&dir.join(DATA_FILE), 0, size)?;
    } else if grows {
        // Sparse; the first step is written now, the rest as data arrives (grow.rs).
        let first = grow::step_bytes(size, unit);
        grow::write_zeros(&dir.join(DATA_FILE), 0, first)?;
        data_written = Some(first);
    } else {
        // Reserve the space now (no ENOSPC from the filesystem later); not all filesystems
        // can.
        let _ = rustix::fs::fallocate(&data, rustix::fs::FallocateFlags::empty(), 0, size);
    }
    data.sync_all()
        .map_err(|e| StoreError::io("syncing the data file", e))?;
    let sb = Superblock {
        format_version: FORMAT_VERSION,
        store_id: random_id(),
        data_size: size,
        min_alloc_size: unit,
        csum_block_size: cb,
        created_unix: now_unix(),
        data_prewritten: opts.prewrite,
        data_written,
    };
    let cfg = StoreConfig {
        cache_budget: kelp_types::ByteSize(32 << 20),
        ..StoreConfig::default()
    };
    {
        let (kv, meta, _) = open_kv(dir, &cfg)?;
        let mut batch = kv.batch().durability(Some(PersistMode::SyncAll));
        batch.insert(&meta, keys::SUPER, sb.encode());
        batch.insert(&meta, keys::NEXT_NID, 1u64.to_be_bytes().to_vec());
        let mut bm = Bitmap::new(size / unit);
        bm.mark_all_dirty();
        for (chunk, v) in bm.take_dirty() {
            batch.insert(&meta, keys::bitmap_key(chunk), v);
        }
        batch
            .commit()
            .map_err(|e| StoreError::kv("writing the initial metadata", e))?;
        kv.persist(PersistMode::SyncAll)
            .map_err(|e| StoreError::kv("syncing the initial metadata", e))?;
    }
    Wal::create(dir)?;
    // The superblock is written last: its presence means mkfs completed.
    sb.write(dir)?;
    Ok(sb)
}

/// Do the new extents named by a log record carry the data their checksums describe?
pub(super) fn new_runs_intact(data: &File, sb: &Superblock, runs: &[NewRun]) -> Result<bool> {
    let unit = sb.min_alloc_size;
    let cb = sb.csum_block_size as usize;
    let bpu = (unit / sb.csum_block_size) as usize;
    let units_total = sb.data_size / unit;
    for (punit, units, csums) in runs {
        if punit.checked_add(*units).is_none_or(|e| e > units_total)
            || csums.len() != *units as usize * bpu
        {
            return Err(StoreError::corrupt(format!(
                "write-ahead log names units {punit}+{units} with {} checksums",
                csums.len()
            )));
        }
        let per_read = (8u64 << 20) / unit;
        let mut done = 0u64;
        while done < *units {
            let n = (units - done).min(per_read.max(1));
            let mut buf = AlignedBuf::zeroed((n * unit) as usize);
            data.read_exact_at(&mut buf, (punit + done) * unit)
                .map_err(|e| StoreError::io("verifying logged extents", e))?;
            let first = done as usize * bpu;
            for (i, block) in buf.chunks(cb).enumerate() {
                if kelp_types::crc32c(block) != csums[first + i] {
                    return Ok(false);
                }
            }
            done += n;
        }
    }
    Ok(true)
}

/// A 3-way merge of sorted `(key, value-or-tombstone)` sources; earlier sources win on equal
/// keys. Tombstones are skipped in the output.
pub(super) fn merge_sources(
    mut sources: Vec<KvSource<'_>>,
    limit: usize,
) -> Result<Vec<(Vec<u8>, Value)>> {
    let mut heads: Vec<Option<(Vec<u8>, Option<Value>)>> = Vec::with_capacity(sources.len());
    for s in sources.iter_mut() {
        heads.push(s.next().transpose()?);
    }
    let mut out = Vec::new();
    while out.len() < limit {
        let mut best: Option<usize> = None;
        for (i, h) in heads.iter().enumerate() {
            if let Some((k, _)) = h {
                match best {
                    Some(b) if heads[b].as_ref().is_some_and(|(bk, _)| bk <= k) => {}
                    _ => best = Some(i),
                }
            }
        }
        let Some(b) = best else { break };
        let Some((key, value)) = heads[b].take() else {
            break;
        };
        heads[b] = sources[b].next().transpose()?;
        // Drop the same key from lower-priority sources.
        for i in 0..heads.len() {
            while heads[i].as_ref().is_some_and(|(k, _)| *k == key) {
                heads[i] = sources[i].next().transpose()?;
            }
        }
        if let Some(v) = value {
            out.push((key, v));
        }
    }
    Ok(out)
}

impl KelpStore {
    /// Mount the store in `dir`: check the superblock, open the metadata, load the allocation
    /// bitmap, replay deferred writes left by a crash, start the committer.
    pub fn mount(dir: &Path, cfg: StoreConfig) -> Result<KelpStore> {
        let lock_file = take_lock(dir)?;
        let sb = Superblock::read(dir)?;
        // O_DIRECT: data I/O bypasses the page cache (no double caching, cache memory stays
        // within the configured budget, writes go straight to the device); fall back to
        // buffered I/O on filesystems without O_DIRECT (tmpfs).
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(flags)
                .open(dir.join(DATA_FILE))
        };
        let (data, direct) = match open(rustix::fs::OFlags::DIRECT.bits() as i32) {
            Ok(f) => (f, true),
            Err(_) => (
                open(0).map_err(|e| StoreError::io("opening the data file", e))?,
                false,
            ),
        };
        // Small reads (and hot large ones) go through the page cache, with this descriptor,
        // at random offsets: no read-ahead (it would fill the cache with neighbouring units
        // nobody asked for). Advisory only. Linux keeps it coherent with O_DIRECT writes
        // (cached pages of the range are invalidated).
        let data_buffered = open(0).map_err(|e| StoreError::io("opening the data file", e))?;
        let _ = rustix::fs::fadvise(&data_buffered, 0, None, rustix::fs::Advice::Random);
        let len = data
            .metadata()
            .map_err(|e| StoreError::io("inspecting the data file", e))?
            .len();
        if len < sb.data_size {
            return Err(StoreError::corrupt(format!(
                "data file is {len} bytes, superblock says {}",
                sb.data_size
            )));
        }
        // Reads are random; readahead would only pollute the page cache.
        let _ = rustix::fs::fadvise(&data, 0, None, rustix::fs::Advice::Random);
        let (kv, meta, deferred_part) = open_kv(dir, &cfg)?;
        let geo = Geometry {
            unit: sb.min_alloc_size,
            csum_block: sb.csum_block_size,
            bpu: sb.min_alloc_size / sb.csum_block_size,
            units: sb.data_size / sb.min_alloc_size,
        };
        let kv_sb = meta
            .get(keys::SUPER)
            .map_err(|e| StoreError::kv("reading the superblock copy", e))?
            .ok_or_else(|| StoreError::corrupt("metadata database has no superblock copy"))?;
        let kv_sb = Superblock::decode(&kv_sb, &dir.join(META_DIR))?;
        let mut sb = sb;
        // The copy in the database may lag behind the file's format version (upgrades) and
        // a growing file's frontier (rewritten in the file only).
        if (Superblock {
            format_version: sb.format_version,
            data_written: sb.data_written,
            ..kv_sb.clone()
        }) != sb
        {
            return Err(StoreError::corrupt(format!(
                "metadata database belongs to store {}, superblock to {}",
                kv_sb.store_id, sb.store_id
            )));
        }
        if sb.format_version < 2 {
            // Upgrade from version 1 (no write-ahead log; fjall's journal was synced, so the
            // database is complete): create the log, then declare version 2.
            let _ = std::fs::remove_file(dir.join(wal::WAL_FILE));
            Wal::create(dir)?;
            superblock::sync_dir(dir)?;
            sb.format_version = FORMAT_VERSION;
            sb.write(dir)?;
        }
        // Replay the write-ahead log: batches committed there may be missing from fjall.
        let (mut wal, mut payloads) = Wal::open(dir)?;
        // Only the last record can be torn: each record is written after the previous one's
        // flush completed. If its new extents are not all on the device, the crash came
        // during its flush: it was never acknowledged, and it is dropped.
        if let Some(last) = payloads.last() {
            let (runs, _) = wal::decode_record(last)?;
            if !new_runs_intact(&data, &sb, &runs)? {
                payloads.pop();
            }
        }
        for payload in &payloads {
            let mut b = kv.batch();
            for (part, k, v) in wal::decode_record(payload)?.1 {
                let p = if part == PART_META {
                    &meta
                } else {
                    &deferred_part
                };
                match v {
                    Some(v) => b.insert(p, k, v),
                    None => b.remove(p, k),
                }
            }
            b.commit()
                .map_err(|e| StoreError::kv("replaying the write-ahead log", e))?;
            relieve_write_buffer(&cfg, &[&meta, &deferred_part])?;
        }
        if kv_sb != sb {
            let mut b = kv.batch();
            b.insert(&meta, keys::SUPER, sb.encode());
            b.commit()
                .map_err(|e| StoreError::kv("updating the superblock copy", e))?;
        }
        kv.persist(PersistMode::SyncAll)
            .map_err(|e| StoreError::kv("syncing the replayed metadata", e))?;
        wal.restart()?;
        let next_nid = match meta
            .get(keys::NEXT_NID)
            .map_err(|e| StoreError::kv("reading the nid counter", e))?
        {
            Some(v) if v.len() == 8 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&v);
                u64::from_be_bytes(b)
            }
            _ => return Err(StoreError::corrupt("missing or malformed nid counter")),
        };
        // Absent in stores that never held inline data.
        let inline_bytes = match meta
            .get(keys::INLINE_BYTES)
            .map_err(|e| StoreError::kv("reading the inline-data counter", e))?
        {
            None => 0,
            Some(v) => <[u8; 8]>::try_from(&v[..])
                .map(u64::from_be_bytes)
                .map_err(|_| StoreError::corrupt("malformed inline-data counter"))?,
        };
        let mut bitmap = Bitmap::new(geo.units);
        let mut seen = 0u32;
        for r in meta.prefix([keys::BITMAP]) {
            let (k, v) = r.map_err(|e| StoreError::kv("loading the allocation bitmap", e))?;
            let chunk = keys::decode_bitmap_key(&k)?;
            bitmap.load_chunk(chunk, &v)?;
            seen += 1;
        }
        if seen != bitmap.chunks() {
            return Err(StoreError::corrupt(format!(
                "allocation bitmap has {seen} chunks, expected {}",
                bitmap.chunks()
            )));
        }
        // A growing file: only units below the frontier are handed out (grow.rs). Nothing can
        // have been allocated beyond it.
        let frontier = sb
            .data_written
            .map_or(geo.units, |w| (w / geo.unit).min(geo.units));
        let mut alloc = Allocator::with_frontier(frontier, geo.units);
        let mut free_to_end = frontier == geo.units;
        for (off, len) in bitmap.free_runs() {
            if off <= frontier && off + len == geo.units {
                free_to_end = true;
            }
            if off < frontier {
                alloc.release(off, len.min(frontier - off));
            }
        }
        if !free_to_end {
            return Err(StoreError::corrupt(format!(
                "units beyond the written part of the data file ({} bytes) are allocated",
                frontier * geo.unit
            )));
        }
        let grower = sb.data_written.is_some().then(|| {
            let step = match cfg.grow_step.0 {
                0 => grow::step_bytes(sb.data_size, geo.unit),
                s => s.max(geo.unit),
            };
            Arc::new(Grower::new(step / geo.unit))
        });
        let onode_cache = OnodeCache::new(cfg.onode_cache_bytes());
        let hot_reads = HotReads::new(cfg.hot_read_window.0);
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            cfg,
            geo,
            sb,
            data,
            data_buffered,
            direct,
            kv,
            meta,
            deferred_part,
            _lock: lock_file,
            overlay: RwLock::new(BTreeMap::new()),
            pending_blocks: Mutex::new(HashMap::new()),
            inflight_cow: Mutex::new(BTreeMap::new()),
            pending_len: AtomicUsize::new(0),
            release_pending: AtomicUsize::new(0),
            inflight_len: AtomicUsize::new(0),
            inline_bytes: AtomicU64::new(inline_bytes),
            onode_cache,
            known_colls: Mutex::new(HashSet::new()),
            read_bufs: Arc::new(BufPool::default()),
            hot_reads,
            alloc: Mutex::new(alloc),
            grower,
            grown: Condvar::new(),
            apply: Mutex::new(ApplyState {
                next_seq: 1,
                next_nid,
                inline_bytes,
            }),
            reuse: RwLock::new(()),
            queue: Mutex::new(Queue::default()),
            queue_cv: Condvar::new(),
            durable_cv: Condvar::new(),
            failed: Mutex::new(None),
            bitmap: Mutex::new(Some(bitmap)),
            wal: Mutex::new(Some(wal)),
        });
        replay_deferred(&inner)?;
        let worker = inner.clone();
        let handle = std::thread::Builder::new()
            .name("kelp-store-commit".into())
            .spawn(move || committer(worker))
            .map_err(|e| StoreError::io("starting the commit thread", e))?;
        let store = KelpStore {
            inner,
            committer: Mutex::new(Some(handle)),
            grower: Mutex::new(None),
        };
        if let Some(g) = store.inner.grower.clone() {
            let worker = store.inner.clone();
            let handle = std::thread::Builder::new()
                .name("kelp-store-grow".into())
                .spawn(move || {
                    let w = &*worker;
                    let data_path = w.dir.join(DATA_FILE);
                    let target = grow::GrowTarget {
                        dir: &w.dir,
                        data_path: &data_path,
                        unit: w.geo.unit,
                        alloc: &w.alloc,
                        grown: &w.grown,
                    };
                    grow::run(g, target, w.sb.clone());
                })
                .map_err(|e| StoreError::io("starting the grow thread", e))?;
            *lock(&store.grower) = Some(handle);
            // a store mounted with little room below its frontier grows at once
            store.inner.kick_grower_if_low(&lock(&store.inner.alloc));
        }
        Ok(store)
    }

    /// Wait for queued transactions, stop the committer and flush deferred writes.
    pub fn close(self) -> Result<()> {
        self.shutdown();
        self.inner.check_failed()
    }

    pub(super) fn shutdown(&self) {
        {
            let mut q = lock(&self.inner.queue);
            q.shutdown = true;
        }
        self.inner.queue_cv.notify_all();
        if let Some(h) = lock(&self.committer).take() {
            let _ = h.join();
        }
        if let Some(g) = &self.inner.grower {
            g.shutdown();
        }
        if let Some(h) = lock(&self.grower).take() {
            let _ = h.join();
        }
        // transactions still waiting for room get NoSpace rather than waiting forever
        lock(&self.inner.alloc).set_grow_failed(true);
        self.inner.grown.notify_all();
    }

    pub fn superblock(&self) -> &Superblock {
        &self.inner.sb
    }

    /// Free space in bytes (allocator view).
    pub fn free_bytes(&self) -> u64 {
        lock(&self.inner.alloc).free_units() * self.inner.geo.unit
    }

    /// On-disk size of the metadata database (allocated bytes; the write-ahead log is not
    /// included: it is a fixed 64 MiB).
    pub fn metadata_bytes(&self) -> u64 {
        dir_size(&self.inner.dir.join(META_DIR))
    }

    /// Flush the write buffers of both partitions to tables, so that fjall can drop the
    /// journals holding them (used before measuring metadata size: otherwise the journals,
    /// which also hold every deferred write's data until rotated, are counted).
    pub fn compact_metadata(&self) -> Result<()> {
        for p in [&self.inner.meta, &self.inner.deferred_part] {
            p.rotate_memtable_and_wait()
                .map_err(|e| StoreError::kv("flushing the metadata write buffer", e))?;
        }
        Ok(())
    }

    /// Drop the data file's pages from the OS page cache (benchmarks: cold reads).
    pub fn drop_data_cache(&self) -> Result<()> {
        self.inner
            .data
            .sync_data()
            .map_err(|e| StoreError::io("syncing the data file", e))?;
        rustix::fs::fadvise(&self.inner.data, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(|e| StoreError::io("dropping the page cache", e.into()))
    }

    /// Flip one bit of the inline data of a small object of the (unmounted) store in `dir`,
    /// keeping the record's checksum: fault injection for tests of reads, scrub and fsck.
    /// Mounts the store (which replays and empties the metadata log, so nothing replays the
    /// intact record over the damaged one later), rewrites the record, unmounts. False if the
    /// object has no inline data.
    #[doc(hidden)]
    pub fn damage_inline_data(
        dir: &Path,
        coll: CollectionId,
        oid: &ObjectId,
        at: usize,
    ) -> Result<bool> {
        let store = KelpStore::mount(dir, StoreConfig::default())?;
        let inner = &*store.inner;
        let key = keys::obj_key(coll, oid);
        let mut on = inner.onode_for_read(coll, oid)?;
        let damaged = match &mut on.inline {
            Some(i) => {
                i.flip_bit(at);
                let mut b = inner.kv.batch().durability(Some(PersistMode::SyncAll));
                b.insert(&inner.meta, key, on.encode());
                b.commit()
                    .map_err(|e| StoreError::kv("writing a damaged record", e))?;
                true
            }
            None => false,
        };
        store.close()?;
        Ok(damaged)
    }

    /// Whether `oid` keeps its data inline in its record (tests, debugging).
    pub fn is_inline(&self, coll: CollectionId, oid: &ObjectId) -> Result<bool> {
        Ok(self.inner.onode_for_read(coll, oid)?.inline.is_some())
    }

    /// Where the data of `oid` lives: `(data-file offset, length)` runs (tests, debugging).
    pub fn object_extents(&self, coll: CollectionId, oid: &ObjectId) -> Result<Vec<(u64, u64)>> {
        let on = self.inner.onode_for_read(coll, oid)?;
        let u = self.inner.geo.unit;
        Ok(on
            .extents
            .iter()
            .map(|e| (e.punit * u, e.units * u))
            .collect())
    }
}

/// Bytes allocated on disk under `p` (not apparent sizes: fjall's journals are 32 MiB sparse
/// files, mostly holes).
pub(crate) fn dir_size(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_size(&e.path()),
                Ok(m) => total += m.blocks() * 512,
                Err(_) => {}
            }
        }
    }
    total
}

impl Drop for KelpStore {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Write back deferred records a crash left behind, then drop them.
pub(super) fn replay_deferred(inner: &Inner) -> Result<()> {
    let mut keys_done = Vec::new();
    for r in inner.deferred_part.prefix([keys::DEFERRED]) {
        let (k, v) = r.map_err(|e| StoreError::kv("reading deferred writes", e))?;
        for (punit, data) in codec::decode_deferred(&v)? {
            if punit >= inner.geo.units || data.len() as u64 != inner.geo.unit {
                return Err(StoreError::corrupt(format!(
                    "deferred write to unit {punit} of {} bytes",
                    data.len()
                )));
            }
            inner.writeback(&data, punit * inner.geo.unit, true)?;
        }
        keys_done.push(k.to_vec());
    }
    if !keys_done.is_empty() {
        inner
            .data
            .sync_data()
            .map_err(|e| StoreError::io("syncing replayed deferred writes", e))?;
        let mut b = inner.kv.batch().durability(Some(PersistMode::SyncData));
        for k in keys_done {
            b.remove(&inner.deferred_part, k);
        }
        b.commit()
            .map_err(|e| StoreError::kv("dropping replayed deferred records", e))?;
    }
    Ok(())
}
