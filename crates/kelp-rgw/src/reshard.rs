//! Resharding a bucket's index while it keeps serving (Ceph blocks writes for the duration).
//!
//! A reshard fills a new *generation* of shards. The bucket record names the target; then each
//! old shard in turn is marked "resharding" (every change to it from then on also writes a log
//! entry naming the omap keys it touched, in the same atomic update), copied in full, and
//! brought up to date from its log in a bounded number of catch-up rounds. If a round finds the
//! log empty, the shard is marked "moved" with a compare-and-swap on its version (no change can
//! slip in between). Otherwise — the usual case under a sustained load, where the log never
//! empties by itself — the shard is *frozen*: writers (whose updates are guarded on the marker
//! they read) wait, readers keep reading it, the rest of the log is replayed, and the shard is
//! marked "moved". From that moment writers and readers of that shard's keys go to the new
//! generation; listings read the old shards not yet moved plus, from the new generation, only
//! the keys of moved shards. When every old shard has moved the record switches generations.
//!
//! What a client can wait for: reads never; a change to a key of the one frozen shard, for its
//! final replay (a few round trips; at most [`FROZEN_STALE`]/2 before the resharder gives up,
//! and a writer gives up with SlowDown after 10 s); any other change, one compare-and-swap
//! round trip.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use kelp_client::{ClientError, ReadOp, ReadResult, WriteOp};
use tracing::{debug, info, warn};

use crate::error::{Result, RgwError, found};
use crate::layout::{
    BucketRecord, GC_PREFIX, LOG_PREFIX, LogEntry, MARKER, MARKER_MOVED, MARKER_RESHARDING,
    OBJ_PREFIX, PART_PREFIX, PENDING_PREFIX, Pending, ReshardTarget, UPLOAD_PREFIX, VERSION_PREFIX,
    bucket_obj, decode, encode, frozen_marker, frozen_since, now_ns, shard_obj, shard_of,
};
use crate::meta::{MAX_SHARDS, omap_all, read_versioned};
use crate::rgw::Rgw;

/// How long old shards keep their entries after the switch (for requests that read the
/// bucket record just before it).
const CLEANUP_DELAY: Duration = Duration::from_secs(5);
/// A reshard whose driver has not finished after this long is resumed by another gateway.
const RESUME_AFTER: Duration = Duration::from_secs(600);
/// Catch-up rounds (each replays the log written during the previous one) before a shard is
/// frozen for the final replay whatever its log holds: under a sustained load the log never
/// empties by itself, and a round takes a few round trips, so it stays short.
const CATCH_UP_ROUNDS: u32 = 8;
/// A log this short is replayed once more and then the shard is frozen (the final replay is
/// then at most about this many entries written during that last round).
const FREEZE_AT_LOG: usize = 64;
/// A shard frozen this long was left so by a resharder that died; a gateway's maintenance
/// loop resumes the reshard. A resharder gives up on its final step after half this time, so
/// a slow one and its successor do not both replay into the new shards.
const FROZEN_STALE: Duration = Duration::from_secs(30);
/// Log entries read (and replayed) at a time.
const LOG_PAGE: u32 = 1000;
/// Entries read from an old shard at a time (copying and clearing).
const COPY_PAGE: u32 = 1000;
/// Entries gathered for one new shard before they are written to it.
const COPY_BATCH: usize = 500;
/// Entries gathered for all new shards together before every gathering is written, however
/// small (~15 MiB of index entries; a reshard to thousands of shards would otherwise hold
/// hundreds of entries per shard).
const COPY_HELD_MAX: usize = 50_000;
/// Entries per listing when counting a shard's objects (the OSD's default `max_omap_entries`).
const COUNT_PAGE: u64 = 10_000;

/// What a reshard did.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReshardStats {
    pub from_shards: u32,
    pub to_shards: u32,
    /// Entries copied in the full passes.
    pub copied: u64,
    /// Changes made meanwhile and replayed from the shards' logs.
    pub replayed: u64,
}

/// How a shard's catch-up ended (with the log entries it replayed).
enum CatchUp {
    /// The log was found empty and the shard switched to moved without pausing anyone (a
    /// compare-and-swap on the shard's version: no change slipped in).
    Moved(u64),
    /// The final step must freeze the shard.
    Freeze(u64),
}

impl Rgw {
    /// Reshards bucket `name` to `shards` index shards while it keeps serving; resumes a
    /// reshard in progress to the same size.
    pub async fn reshard(&self, name: &str, shards: u32) -> Result<ReshardStats> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(RgwError::Invalid(format!(
                "a bucket has 1 to {MAX_SHARDS} index shards, not {shards}"
            )));
        }
        let (b, target) = self.start_reshard(name, shards).await?;
        let Some(t) = target else {
            return Ok(ReshardStats {
                from_shards: b.shards,
                to_shards: b.shards,
                ..Default::default()
            });
        };
        let mut stats = ReshardStats {
            from_shards: b.shards,
            to_shards: t.shards,
            ..Default::default()
        };
        for s in 0..b.shards {
            let (copied, replayed) = self.migrate_shard(&b, &t, s).await?;
            stats.copied += copied;
            stats.replayed += replayed;
        }
        self.finish_reshard(&b, &t).await?;
        info!(bucket = %b.name, from = b.shards, to = t.shards, "resharded");
        tokio::time::sleep(CLEANUP_DELAY).await;
        for s in 0..b.shards {
            self.clear_old_shard(&shard_obj(&b.id, b.generation, s))
                .await?;
        }
        Ok(stats)
    }

    /// Records the target in the bucket record (or finds the one in progress).
    async fn start_reshard(
        &self,
        name: &str,
        shards: u32,
    ) -> Result<(BucketRecord, Option<ReshardTarget>)> {
        let meta = &self.inner.meta;
        for _ in 0..16 {
            let (mut b, version) = read_versioned::<BucketRecord>(meta, &bucket_obj(name))
                .await?
                .ok_or_else(|| RgwError::NoSuchBucket(name.to_string()))?;
            if let Some(t) = &b.reshard {
                if t.shards != shards {
                    return Err(RgwError::Invalid(format!(
                        "a reshard of '{name}' to {} shards is in progress; resume it with that \
                         number",
                        t.shards
                    )));
                }
                let t = t.clone();
                return Ok((b, Some(t)));
            }
            if b.shards == shards {
                return Ok((b, None));
            }
            let generation = b
                .retired
                .iter()
                .map(|(g, _)| *g)
                .chain([b.generation])
                .max()
                .unwrap_or(0)
                + 1;
            let t = ReshardTarget {
                generation,
                shards,
                started_ns: now_ns(),
            };
            b.reshard = Some(t.clone());
            match meta
                .operate(
                    WriteOp::new()
                        .assert_version(version)
                        .write_full(encode(&b)),
                    &bucket_obj(name),
                )
                .await
            {
                Ok(_) => return Ok((b, Some(t))),
                Err(ClientError::Canceled { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(bucket_obj(name)))
    }

    /// Copies one old shard to the new generation and switches it. Returns (copied, replayed).
    async fn migrate_shard(
        &self,
        b: &BucketRecord,
        t: &ReshardTarget,
        s: u32,
    ) -> Result<(u64, u64)> {
        let io = &self.inner.index;
        let old = shard_obj(&b.id, b.generation, s);
        let marker = read_marker(self, &old).await?;
        let mut copied = 0u64;
        let mut replayed = 0u64;
        match marker.as_deref() {
            Some(MARKER_MOVED) => return Ok((0, 0)),
            // a driver that went away froze it: its log is complete, only the last step is left
            Some(m) if frozen_since(m).is_some() => {}
            _ => {
                // guarded on the marker read, so a shard another driver moved is not reopened
                match io
                    .operate(
                        WriteOp::new()
                            .cmp_omap(MARKER, marker.as_deref())
                            .omap_set(&[(MARKER, MARKER_RESHARDING)]),
                        &old,
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(ClientError::Canceled { .. }) => {
                        return Err(RgwError::Busy(format!("{old} (another resharder)")));
                    }
                    Err(e) => return Err(e.into()),
                }
                copied = self.copy_shard(b, t, &old).await?;
                match self.catch_up(b, t, &old).await? {
                    CatchUp::Moved(n) => return Ok((copied, n)),
                    CatchUp::Freeze(n) => replayed = n,
                }
            }
        }
        replayed += self.freeze_and_switch(b, t, &old).await?;
        Ok((copied, replayed))
    }

    /// The full pass: copies every entry of shard `old`, routed by the key it belongs to.
    async fn copy_shard(&self, b: &BucketRecord, t: &ReshardTarget, old: &str) -> Result<u64> {
        let io = &self.inner.index;
        let uploads: HashMap<String, String> = omap_all(io, old, UPLOAD_PREFIX)
            .await?
            .into_iter()
            .filter_map(|(k, _)| {
                let rest = &k[UPLOAD_PREFIX.len()..];
                rest.rsplit_once('\u{0}')
                    .map(|(key, id)| (id.to_string(), key.to_string()))
            })
            .collect();
        let mut copied = 0u64;
        let mut after = String::new();
        // entries wait per new shard until a write's worth has gathered: a page routed at once
        // would make one tiny write per new shard (~10 entries each going from 47 to 95 shards)
        let mut pending: BTreeMap<u32, Vec<(String, Bytes)>> = BTreeMap::new();
        let mut held = 0usize; // entries in `pending`
        loop {
            let (page, more) = match io.omap_get_vals(old, &after, "", COPY_PAGE).await {
                Ok(p) => p,
                Err(ClientError::NotFound { .. }) => (Vec::new(), false),
                Err(e) => return Err(e.into()),
            };
            if let Some((k, _)) = page.last() {
                after = k.clone();
            }
            let last = !more || page.is_empty();
            for (k, v) in page {
                let route = match route_full(old, &k, &v, &uploads)? {
                    Some(key) => shard_of(&key, t.shards),
                    None => continue,
                };
                pending.entry(route).or_default().push((k, v));
                copied += 1;
                held += 1;
            }
            let ready = if last || held >= COPY_HELD_MAX {
                // everything: the end, or so many new shards that the gatherings outgrew the
                // gateway's share of memory before any filled
                held = 0;
                std::mem::take(&mut pending)
            } else {
                let ready: BTreeMap<u32, Vec<(String, Bytes)>> = pending
                    .extract_if(.., |_, e| e.len() >= COPY_BATCH)
                    .collect();
                held -= ready.values().map(Vec::len).sum::<usize>();
                ready
            };
            self.set_new(b, t, ready).await?;
            if last {
                break;
            }
        }
        Ok(copied)
    }

    /// Replays shard `old`'s log while writers keep adding to it, until it is short enough for
    /// the final step or [`CATCH_UP_ROUNDS`] rounds have passed.
    async fn catch_up(&self, b: &BucketRecord, t: &ReshardTarget, old: &str) -> Result<CatchUp> {
        let io = &self.inner.index;
        let mut replayed = 0u64;
        for round in 0..CATCH_UP_ROUNDS {
            let (version, logs) = self.read_log(old).await?;
            debug!(shard = old, round, log = logs.len(), "reshard catch-up");
            if logs.is_empty() {
                match io
                    .operate(
                        WriteOp::new()
                            .assert_version(version)
                            .omap_set(&[(MARKER, MARKER_MOVED)]),
                        old,
                    )
                    .await
                {
                    Ok(_) => return Ok(CatchUp::Moved(replayed)),
                    Err(ClientError::Canceled { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            let short = logs.len() <= FREEZE_AT_LOG;
            replayed += self.replay(b, t, old, &logs).await?;
            if short {
                break;
            }
        }
        Ok(CatchUp::Freeze(replayed))
    }

    /// The final step: freezes shard `old` (writers wait; its log can no longer grow), replays
    /// what is left of its log, and marks it moved. Returns the entries replayed.
    async fn freeze_and_switch(
        &self,
        b: &BucketRecord,
        t: &ReshardTarget,
        old: &str,
    ) -> Result<u64> {
        let io = &self.inner.index;
        let started = std::time::Instant::now();
        let frozen = match read_marker(self, old).await? {
            Some(m) if frozen_since(&m).is_some() => m.to_vec(),
            Some(m) if m.as_ref() == MARKER_RESHARDING => {
                let f = frozen_marker(now_ns());
                // every change to the shard is guarded on the marker it read: none lands after
                // this one, and each that landed before it logged itself
                match io
                    .operate(
                        WriteOp::new()
                            .cmp_omap(MARKER, Some(MARKER_RESHARDING))
                            .omap_set(&[(MARKER, f.as_slice())]),
                        old,
                    )
                    .await
                {
                    Ok(_) => f,
                    Err(ClientError::Canceled { .. }) => {
                        return Err(RgwError::Busy(format!("{old} (another resharder)")));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Some(m) if m.as_ref() == MARKER_MOVED => return Ok(0),
            _ => {
                return Err(RgwError::Corrupt {
                    object: old.to_string(),
                    message: "a shard being resharded lost its marker".into(),
                });
            }
        };
        let mut replayed = 0u64;
        loop {
            if started.elapsed() > FROZEN_STALE / 2 {
                return Err(RgwError::Busy(format!(
                    "{old}: the final replay of a reshard took too long; a gateway will resume it"
                )));
            }
            let (version, logs) = self.read_log(old).await?;
            if !logs.is_empty() {
                replayed += self.replay(b, t, old, &logs).await?;
                continue;
            }
            // guarded on the version too: a gateway too old to know frozen shards may still
            // have written (and logged) a change since the log was read
            match io
                .operate(
                    WriteOp::new()
                        .assert_version(version)
                        .cmp_omap(MARKER, Some(frozen.as_slice()))
                        .omap_set(&[(MARKER, MARKER_MOVED)]),
                    old,
                )
                .await
            {
                Ok(_) => break,
                Err(ClientError::Canceled { .. }) => {
                    if read_marker(self, old).await?.as_deref() != Some(frozen.as_slice()) {
                        return Err(RgwError::Busy(format!("{old} (another resharder)")));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        debug!(
            shard = old,
            replayed,
            pause_ms = started.elapsed().as_millis() as u64,
            "reshard: shard frozen, replayed and moved"
        );
        Ok(replayed)
    }

    /// The version of shard `old` and the first page of its log, read together.
    async fn read_log(&self, old: &str) -> Result<(u64, Vec<(String, Bytes)>)> {
        let res = self
            .inner
            .index
            .operate_read(
                ReadOp::new().stat().omap_get_vals("", LOG_PREFIX, LOG_PAGE),
                old,
            )
            .await?;
        let mut it = res.into_iter();
        match (it.next(), it.next()) {
            (Some(ReadResult::Stat { version, .. }), Some(ReadResult::Pairs { entries, .. })) => {
                Ok((version, entries))
            }
            _ => Err(RgwError::Corrupt {
                object: old.to_string(),
                message: "unexpected read result".into(),
            }),
        }
    }

    /// Writes `batches` (new shard → entries) to the new generation, all shards at once.
    async fn set_new(
        &self,
        b: &BucketRecord,
        t: &ReshardTarget,
        batches: BTreeMap<u32, Vec<(String, Bytes)>>,
    ) -> Result<()> {
        let io = &self.inner.index;
        futures::future::try_join_all(batches.into_iter().map(|(shard, entries)| async move {
            io.omap_set(&shard_obj(&b.id, t.generation, shard), &entries)
                .await
        }))
        .await?;
        Ok(())
    }

    /// Re-copies the omap keys named by `logs` (their current value, or their absence), then
    /// drops those log entries.
    async fn replay(
        &self,
        b: &BucketRecord,
        t: &ReshardTarget,
        old: &str,
        logs: &[(String, Bytes)],
    ) -> Result<u64> {
        let io = &self.inner.index;
        let mut touched: BTreeMap<String, String> = BTreeMap::new(); // omap key → S3 key
        for (_, raw) in logs {
            let l: LogEntry = decode(old, raw)?;
            for k in l.omap {
                touched.insert(k, l.key.clone());
            }
        }
        let keys: Vec<&String> = touched.keys().collect();
        let current: BTreeMap<String, Bytes> = match found(
            io.operate_read(ReadOp::new().omap_get_vals_by_keys(&keys), old)
                .await,
        )?
        .and_then(|mut r| r.pop())
        {
            Some(ReadResult::Pairs { entries, .. }) => entries.into_iter().collect(),
            _ => BTreeMap::new(),
        };
        let mut sets: BTreeMap<u32, Vec<(String, Bytes)>> = BTreeMap::new();
        let mut rms: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for (k, key) in &touched {
            let route_key = if k.starts_with(GC_PREFIX) {
                gc_inst(k)
            } else {
                key.clone()
            };
            let shard = shard_of(&route_key, t.shards);
            match current.get(k) {
                Some(v) => sets.entry(shard).or_default().push((k.clone(), v.clone())),
                None => rms.entry(shard).or_default().push(k.clone()),
            }
        }
        self.set_new(b, t, sets).await?;
        futures::future::try_join_all(rms.into_iter().map(|(shard, keys)| async move {
            match io
                .omap_rm_keys(&shard_obj(&b.id, t.generation, shard), &keys)
                .await
            {
                Ok(()) | Err(ClientError::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        }))
        .await?;
        let done: Vec<&String> = logs.iter().map(|(k, _)| k).collect();
        io.omap_rm_keys(old, &done).await?;
        Ok(logs.len() as u64)
    }

    /// Switches the bucket record to the new generation.
    async fn finish_reshard(&self, b: &BucketRecord, t: &ReshardTarget) -> Result<()> {
        let meta = &self.inner.meta;
        for _ in 0..16 {
            let (mut cur, version) = read_versioned::<BucketRecord>(meta, &bucket_obj(&b.name))
                .await?
                .ok_or_else(|| RgwError::NoSuchBucket(b.name.clone()))?;
            if cur.id != b.id || cur.reshard.as_ref() != Some(t) {
                return Ok(()); // someone else finished it
            }
            cur.retired.push((cur.generation, cur.shards));
            cur.generation = t.generation;
            cur.shards = t.shards;
            cur.reshard = None;
            match meta
                .operate(
                    WriteOp::new()
                        .assert_version(version)
                        .write_full(encode(&cur)),
                    &bucket_obj(&b.name),
                )
                .await
            {
                Ok(_) => return Ok(()),
                Err(ClientError::Canceled { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(bucket_obj(&b.name)))
    }

    /// Drops every entry of a moved shard but its marker.
    async fn clear_old_shard(&self, obj: &str) -> Result<()> {
        let io = &self.inner.index;
        // each page starts after the last key removed: starting from the front again would walk
        // every deletion made so far (quadratic: 200 s for 800 000 entries, in a store's
        // tombstones), and the OSD holding the shard would slow every other request meanwhile
        let mut after = MARKER.to_string();
        loop {
            let (page, more) = match io.omap_get_vals(obj, &after, "", COPY_PAGE).await {
                Ok(p) => p,
                Err(ClientError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            let Some((last, _)) = page.last() else {
                return Ok(());
            };
            after = last.clone();
            let keys: Vec<&String> = page.iter().map(|(k, _)| k).collect();
            io.omap_rm_keys(obj, &keys).await?;
            if !more {
                return Ok(());
            }
        }
    }

    /// Reshards buckets that have outgrown `max_per_shard` objects per shard (estimated from
    /// one shard) and resumes reshards whose driver went away. Called by the maintenance loop.
    pub async fn auto_reshard(&self, max_per_shard: u64) -> Result<()> {
        if max_per_shard == 0 {
            return Ok(());
        }
        for (name, _) in self.all_buckets().await? {
            let b = match self.bucket(&name).await {
                Ok(b) => b,
                Err(RgwError::NoSuchBucket(_)) => continue,
                Err(e) => return Err(e),
            };
            if let Some(t) = &b.reshard {
                let age = now_ns().saturating_sub(t.started_ns);
                if age > RESUME_AFTER.as_nanos() as u64 {
                    warn!(bucket = %name, "resuming an abandoned reshard");
                    self.reshard(&name, t.shards).await?;
                } else if self.stale_freeze(&b).await? {
                    // writers of that shard get SlowDown until it moves: do not wait 10 minutes
                    warn!(bucket = %name, "resuming a reshard that left a shard frozen");
                    self.reshard(&name, t.shards).await?;
                }
                continue;
            }
            let obj = shard_obj(&b.id, b.generation, 0);
            match self.shard_holds_at_least(&obj, max_per_shard).await {
                Ok(true) => {}
                Ok(false) | Err(RgwError::Rados(ClientError::NotFound { .. })) => continue,
                Err(e) => return Err(e),
            }
            let target = (b.shards.saturating_mul(2) + 1).min(MAX_SHARDS);
            if target > b.shards {
                info!(bucket = %name, from = b.shards, to = target, "bucket outgrew its index shards");
                self.reshard(&name, target).await?;
            }
        }
        Ok(())
    }
}

impl Rgw {
    /// Whether index shard `obj` holds at least `n` object entries, counted page by page (an
    /// OSD answers at most `max_omap_entries` entries per listing, 10 000 by default: a page
    /// that says "more" is not yet `n`).
    async fn shard_holds_at_least(&self, obj: &str, n: u64) -> Result<bool> {
        let (mut counted, mut after) = (0u64, String::new());
        loop {
            let want = (n - counted).min(COUNT_PAGE) as u32;
            let (page, more) = self
                .inner
                .index
                .omap_get_vals(obj, &after, OBJ_PREFIX, want)
                .await?;
            counted += page.len() as u64;
            if counted >= n {
                return Ok(true);
            }
            match page.last() {
                Some((k, _)) if more => after = k.clone(),
                _ => return Ok(false),
            }
        }
    }

    /// Whether one of `b`'s shards has been frozen for longer than [`FROZEN_STALE`]: its
    /// resharder died in the final step.
    async fn stale_freeze(&self, b: &BucketRecord) -> Result<bool> {
        let markers =
            futures::future::try_join_all((0..b.shards).map(|s| async move {
                read_marker(self, &shard_obj(&b.id, b.generation, s)).await
            }))
            .await?;
        let stale = now_ns().saturating_sub(FROZEN_STALE.as_nanos() as u64);
        Ok(markers
            .iter()
            .filter_map(|m| m.as_deref().and_then(frozen_since))
            .any(|since| since < stale))
    }
}

async fn read_marker(rgw: &Rgw, obj: &str) -> Result<Option<Bytes>> {
    let res = found(
        rgw.inner
            .index
            .operate_read(ReadOp::new().omap_get_vals_by_keys(&[MARKER]), obj)
            .await,
    )?;
    Ok(match res.and_then(|mut r| r.pop()) {
        Some(ReadResult::Pairs { entries, .. }) => entries.into_iter().next().map(|(_, v)| v),
        _ => None,
    })
}

/// The instance a GC key names (`g<due>.<instance>`).
fn gc_inst(k: &str) -> String {
    k[GC_PREFIX.len()..]
        .split_once('.')
        .map(|(_, inst)| inst.to_string())
        .unwrap_or_default()
}

/// The key routing an entry in the full pass (`None`: not copied).
fn route_full(
    obj: &str,
    k: &str,
    v: &[u8],
    uploads: &HashMap<String, String>,
) -> Result<Option<String>> {
    if k == MARKER || k.starts_with(LOG_PREFIX) {
        return Ok(None);
    }
    if let Some(key) = k.strip_prefix(OBJ_PREFIX) {
        return Ok(Some(key.to_string()));
    }
    if let Some(rest) = k
        .strip_prefix(UPLOAD_PREFIX)
        .or_else(|| k.strip_prefix(VERSION_PREFIX))
    {
        return Ok(rest.rsplit_once('\u{0}').map(|(key, _)| key.to_string()));
    }
    if let Some(rest) = k.strip_prefix(PART_PREFIX) {
        // the upload may have completed since the uploads were read: its log replays it
        return Ok(rest
            .split_once('\u{0}')
            .and_then(|(id, _)| uploads.get(id).cloned()));
    }
    if k.starts_with(PENDING_PREFIX) {
        let p: Pending = decode(obj, v)?;
        return Ok(Some(p.key));
    }
    if k.starts_with(GC_PREFIX) {
        return Ok(Some(gc_inst(k)));
    }
    Ok(None)
}
