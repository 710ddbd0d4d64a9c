//! Garbage collection: deletes the data of overwritten and deleted objects once their
//! `g` entries are due, and the data of uploads abandoned mid-way (`p` entries older than the
//! grace period). Every gateway may run it; all steps are idempotent, and an abandoned entry is
//! claimed with compare-and-swap so a slow writer and the collector never both win.

use std::time::Duration;

use kelp_client::{ClientError, WriteOp};
use tracing::{debug, info, warn};

use crate::error::{Result, RgwError};
use crate::layout::{
    BucketRecord, GC_PREFIX, GcEntry, OBJ_PREFIX, PART_PREFIX, PENDING_PREFIX, PartEntry, Pending,
    UPLOAD_PREFIX, VERSION_PREFIX, decode, now_ns, shard_obj,
};
use crate::meta::omap_all;
use crate::rgw::Rgw;

/// What one collection pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GcStats {
    /// Instances of overwritten or deleted objects removed.
    pub collected: u64,
    /// Abandoned uploads' instances removed.
    pub abandoned: u64,
}

impl Rgw {
    /// One pass over every bucket's index.
    pub async fn gc_once(&self) -> Result<GcStats> {
        let mut stats = GcStats::default();
        for (name, _) in self.all_buckets().await? {
            let b = match self.bucket(&name).await {
                Ok(b) => b,
                Err(RgwError::NoSuchBucket(_)) => continue,
                Err(e) => return Err(e),
            };
            for obj in index_objects(&b, false) {
                let s = self.gc_shard(&b, &obj, false).await?;
                stats.collected += s.collected;
                stats.abandoned += s.abandoned;
            }
        }
        Ok(stats)
    }

    /// Collects one shard's garbage. With `everything`, due times and the grace period are
    /// ignored (a bucket being deleted).
    async fn gc_shard(&self, b: &BucketRecord, obj: &str, everything: bool) -> Result<GcStats> {
        let io = &self.inner.index;
        let mut stats = GcStats::default();
        let now = now_ns();
        // due garbage: keys sort by due time
        let due_bound = format!("{GC_PREFIX}{now:016x}");
        loop {
            let (entries, _) = match io.omap_get_vals(obj, "", GC_PREFIX, 256).await {
                Ok(p) => p,
                Err(ClientError::NotFound { .. }) => return Ok(stats),
                Err(e) => return Err(e.into()),
            };
            let due: Vec<_> = entries
                .into_iter()
                .filter(|(k, _)| everything || k.as_str() < due_bound.as_str())
                .collect();
            if due.is_empty() {
                break;
            }
            for (k, raw) in &due {
                let g: GcEntry = decode(obj, raw)?;
                self.delete_instance(&g.inst, Some(g.size)).await?;
                io.omap_rm_keys(obj, &[k]).await?;
                stats.collected += 1;
            }
        }
        // abandoned uploads
        let grace = self.inner.cfg.pending_grace.as_nanos() as u64;
        for (k, raw) in omap_all(io, obj, PENDING_PREFIX).await? {
            let p: Pending = decode(obj, &raw)?;
            if !everything && p.since_ns.saturating_add(grace) > now {
                continue;
            }
            // claim it: a writer finishing right now removes the same key in its commit
            match io
                .operate(
                    WriteOp::new().cmp_omap(&k, Some(&raw)).omap_rm_keys(&[&k]),
                    obj,
                )
                .await
            {
                Ok(_) => {}
                Err(ClientError::Canceled { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
            let inst = p.instance(&k);
            debug!(bucket = %b.name, key = %p.key, inst, "collecting an abandoned upload");
            self.delete_uncommitted(inst).await?;
            stats.abandoned += 1;
        }
        Ok(stats)
    }

    /// Deletes a bucket. Refused while it holds objects, unless `purge`, which first deletes
    /// every object (index entries and data, many at a time). Returns the objects deleted.
    pub async fn delete_bucket(&self, b: &BucketRecord, purge: bool) -> Result<u64> {
        let io = &self.inner.index;
        let mut deleted = 0u64;
        if b.reshard.is_some() {
            return Err(RgwError::Busy(format!(
                "bucket '{}' is being resharded; delete it once that is done",
                b.name
            )));
        }
        if !purge {
            self.check_empty(b).await?;
        }
        for obj in index_objects(b, false) {
            if purge {
                // versions (their instances include the current objects' ones)
                loop {
                    let (entries, _) = match io.omap_get_vals(&obj, "", VERSION_PREFIX, 512).await {
                        Ok(p) => p,
                        Err(ClientError::NotFound { .. }) => break,
                        Err(e) => return Err(e.into()),
                    };
                    if entries.is_empty() {
                        break;
                    }
                    let obj_ref: &str = &obj;
                    let raws: Vec<bytes::Bytes> =
                        entries.iter().map(|(_, raw)| raw.clone()).collect();
                    let mut dels =
                        futures::stream::iter(raws.into_iter().map(move |raw| async move {
                            let e: crate::layout::IndexEntry = decode(obj_ref, &raw)?;
                            if e.dm {
                                return Ok(());
                            }
                            match self.delete_instance(&e.inst, Some(e.size)).await {
                                Ok(()) => Ok(()),
                                Err(RgwError::Rados(ClientError::NotFound { .. })) => Ok(()),
                                Err(err) => Err(err),
                            }
                        }))
                        .buffer_unordered(32);
                    use futures::StreamExt;
                    while let Some(r) = dels.next().await {
                        r?;
                    }
                    let keys: Vec<&String> = entries.iter().map(|(k, _)| k).collect();
                    io.omap_rm_keys(&obj, &keys).await?;
                }
                loop {
                    let (entries, _) = match io.omap_get_vals(&obj, "", OBJ_PREFIX, 512).await {
                        Ok(p) => p,
                        Err(ClientError::NotFound { .. }) => break,
                        Err(e) => return Err(e.into()),
                    };
                    if entries.is_empty() {
                        break;
                    }
                    let raws: Vec<bytes::Bytes> =
                        entries.iter().map(|(_, raw)| raw.clone()).collect();
                    let obj_ref: &str = &obj;
                    let mut dels =
                        futures::stream::iter(raws.into_iter().map(move |raw| async move {
                            let e: crate::layout::IndexEntry = decode(obj_ref, &raw)?;
                            // a versioned object's instance went with its version above
                            match self.delete_instance(&e.inst, Some(e.size)).await {
                                Ok(()) => Ok(()),
                                Err(RgwError::Rados(ClientError::NotFound { .. })) => Ok(()),
                                Err(err) => Err(err),
                            }
                        }))
                        .buffer_unordered(32);
                    use futures::StreamExt;
                    while let Some(r) = dels.next().await {
                        r?;
                    }
                    let keys: Vec<&String> = entries.iter().map(|(k, _)| k).collect();
                    io.omap_rm_keys(&obj, &keys).await?;
                    deleted += entries.len() as u64;
                }
            }
            // multipart uploads in progress are aborted with the bucket
            for (k, raw) in omap_all(io, &obj, PART_PREFIX).await? {
                let p: PartEntry = decode(&obj, &raw)?;
                self.delete_instance(&p.inst, Some(p.size)).await?;
                io.omap_rm_keys(&obj, &[&k]).await?;
            }
            for (k, _) in omap_all(io, &obj, UPLOAD_PREFIX).await? {
                io.omap_rm_keys(&obj, &[&k]).await?;
            }
            self.gc_shard(b, &obj, true).await?;
        }
        // a writer racing with the deletion may have added an entry since the check
        if !purge {
            self.check_empty(b).await?;
        }
        self.remove_bucket_record(b).await?;
        for obj in index_objects(b, true) {
            match io.remove(&obj).await {
                Ok(()) | Err(ClientError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(deleted)
    }

    /// `BucketNotEmpty` unless the bucket has no object, version or delete marker.
    async fn check_empty(&self, b: &BucketRecord) -> Result<()> {
        let l = self.list_objects(b, "", "", None, 1).await?;
        let v = if b.versioning.is_some() {
            self.list_versions(b, "", "", "", None, 1)
                .await?
                .versions
                .len()
        } else {
            0
        };
        if !l.objects.is_empty() || v > 0 {
            return Err(RgwError::BucketNotEmpty(b.name.clone()));
        }
        Ok(())
    }

    /// The maintenance loop: every `gc_interval`, reshards buckets that outgrew their index
    /// ([`Rgw::auto_reshard`]) and collects garbage ([`Rgw::gc_once`]), until dropped.
    pub async fn run_gc(self) {
        let every = self.inner.cfg.gc_interval;
        if every.is_zero() {
            return;
        }
        let mut next_lc = tokio::time::Instant::now() + self.inner.cfg.lc_interval;
        loop {
            tokio::time::sleep(every).await;
            let lc_every = self.inner.cfg.lc_interval;
            if !lc_every.is_zero() && tokio::time::Instant::now() >= next_lc {
                next_lc = tokio::time::Instant::now() + lc_every;
                match self.lc_once(self.inner.cfg.lc_day).await {
                    Ok(s)
                        if s.expired
                            + s.noncurrent_removed
                            + s.delete_markers_removed
                            + s.uploads_aborted
                            > 0 =>
                    {
                        info!(
                            expired = s.expired,
                            noncurrent = s.noncurrent_removed,
                            delete_markers = s.delete_markers_removed,
                            uploads_aborted = s.uploads_aborted,
                            "lifecycle pass"
                        );
                    }
                    Ok(_) => {}
                    Err(e) => warn!("lifecycle pass failed: {e}"),
                }
            }
            if let Err(e) = self
                .auto_reshard(self.inner.cfg.reshard_max_objects_per_shard)
                .await
            {
                warn!("automatic resharding failed: {e}");
            }
            match self.gc_once().await {
                Ok(s) if s != GcStats::default() => {
                    info!(
                        collected = s.collected,
                        abandoned = s.abandoned,
                        "garbage collected"
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    warn!("garbage collection pass failed: {e}");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        }
    }
}

/// The index objects of a bucket: its generation's shards, those of a reshard in progress,
/// and (with `retired`) the marker-only shards of earlier generations.
pub(crate) fn index_objects(b: &BucketRecord, retired: bool) -> Vec<String> {
    let mut out: Vec<String> = (0..b.shards)
        .map(|s| shard_obj(&b.id, b.generation, s))
        .collect();
    if let Some(t) = &b.reshard {
        out.extend((0..t.shards).map(|s| shard_obj(&b.id, t.generation, s)));
    }
    if retired {
        for (g, n) in &b.retired {
            out.extend((0..*n).map(|s| shard_obj(&b.id, *g, s)));
        }
    }
    out
}
