//! The bucket index: one object per shard, its omap the sorted listing of that shard's keys
//! plus the bookkeeping of writes in flight, garbage and multipart uploads (see [`layout`]).
//! Every change to a key is a single omap update of its shard guarded by `CmpOmap` on what
//! the writer read, retried on a race: two writers of one key can never both win, and no
//! instance is ever left referenced by nobody without a `p` or `g` entry naming it.
//!
//! [`layout`]: crate::layout

use std::collections::VecDeque;

use bytes::Bytes;
use kelp_client::{ClientError, ReadOp, ReadResult, WriteOp};

use crate::error::{Result, RgwError, found};
use crate::layout::{
    BucketRecord, GcEntry, IndexEntry, OBJ_PREFIX, ObjectMeta, PartEntry, Pending, UPLOAD_PREFIX,
    UploadEntry, decode, encode, gc_key, now_ns, obj_key, part_key, parts_prefix, pending_key,
    random_hex, shard_obj, shard_of, upload_key,
};
use crate::rgw::Rgw;

/// Most compare-and-swap attempts on one key before giving up with "busy".
const CAS_TRIES: usize = 32;

/// What a conditional write requires of the object it replaces.
#[derive(Debug, Clone, Default)]
pub struct WriteCondition {
    /// `If-None-Match: *`: only if the key does not exist.
    pub if_absent: bool,
    /// `If-Match`: only if the current ETag is this (hex, without quotes).
    pub if_etag: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Default)]
pub struct Listing {
    pub objects: Vec<(String, IndexEntry)>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    /// The last key or common prefix returned (the marker to continue from).
    pub last: Option<String>,
}

/// One multipart upload in a listing.
#[derive(Debug, Clone)]
pub struct UploadInfo {
    pub key: String,
    pub upload_id: String,
    pub initiated_ns: u64,
}

impl Rgw {
    fn shard_name(&self, b: &BucketRecord, key: &str) -> String {
        shard_obj(&b.id, shard_of(key, b.shards))
    }

    /// A fresh instance name in bucket `b`.
    pub fn new_instance(&self, b: &BucketRecord) -> String {
        format!("{}.{}", b.id, random_hex(12))
    }

    /// The index entry of `key` (raw, for compare-and-swap, and decoded).
    async fn lookup_raw(&self, b: &BucketRecord, key: &str) -> Result<Option<(Bytes, IndexEntry)>> {
        let shard = self.shard_name(b, key);
        let k = obj_key(key);
        let res = found(
            self.inner
                .index
                .operate_read(ReadOp::new().omap_get_vals_by_keys(&[&k]), &shard)
                .await,
        )?;
        let Some(mut res) = res else { return Ok(None) };
        match res.pop() {
            Some(ReadResult::Pairs { entries, .. }) => match entries.into_iter().next() {
                Some((_, raw)) => {
                    let e = decode(&shard, &raw)?;
                    Ok(Some((raw, e)))
                }
                None => Ok(None),
            },
            _ => Ok(None),
        }
    }

    pub async fn lookup(&self, b: &BucketRecord, key: &str) -> Result<Option<IndexEntry>> {
        Ok(self.lookup_raw(b, key).await?.map(|(_, e)| e))
    }

    /// Records that `inst` is being written for `key` (before any of its data).
    pub async fn begin_write(&self, b: &BucketRecord, key: &str, inst: &str) -> Result<Bytes> {
        let p = Bytes::from(encode(&Pending {
            key: key.to_string(),
            since_ns: now_ns(),
        }));
        self.inner
            .index
            .omap_set(&self.shard_name(b, key), &[(pending_key(inst), &p)])
            .await?;
        Ok(p)
    }

    fn gc_due(&self) -> u64 {
        now_ns() + self.inner.cfg.gc_min_wait.as_nanos() as u64
    }

    /// Makes `entry` (a written instance) the object `key`, if `cond` holds; the instance it
    /// replaces goes to the garbage collector. Returns the replaced entry.
    pub async fn commit_object(
        &self,
        b: &BucketRecord,
        key: &str,
        entry: &IndexEntry,
        pending: &Bytes,
        cond: &WriteCondition,
    ) -> Result<Option<IndexEntry>> {
        let shard = self.shard_name(b, key);
        let k = obj_key(key);
        let pk = pending_key(&entry.inst);
        let raw_entry = encode(entry);
        for _ in 0..CAS_TRIES {
            let old = self.lookup_raw(b, key).await?;
            check_condition(key, old.as_ref().map(|(_, e)| e), cond)?;
            let mut op = WriteOp::new()
                .cmp_omap(&k, old.as_ref().map(|(raw, _)| raw.as_ref()))
                .cmp_omap(&pk, Some(pending));
            let mut sets: Vec<(String, Vec<u8>)> = vec![(k.clone(), raw_entry.clone())];
            if let Some((_, e)) = &old {
                sets.push(gc_entry(self.gc_due(), &e.inst, e.size));
            }
            op = op.omap_set(&sets).omap_rm_keys(&[&pk]);
            match self.inner.index.operate(op, &shard).await {
                Ok(_) => return Ok(old.map(|(_, e)| e)),
                Err(ClientError::Canceled { .. }) => {
                    // lost a race with another writer of this key, or our pending entry is
                    // gone (we took longer than the grace period and the data was collected)
                    if !self.pending_present(&shard, &pk, pending).await? {
                        return Err(RgwError::Body(format!(
                            "upload of '{key}' took longer than the {}s grace period",
                            self.inner.cfg.pending_grace.as_secs()
                        )));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(format!("{}/{key}", b.name)))
    }

    async fn pending_present(&self, shard: &str, pk: &str, pending: &Bytes) -> Result<bool> {
        let res = found(
            self.inner
                .index
                .operate_read(ReadOp::new().omap_get_vals_by_keys(&[pk]), shard)
                .await,
        )?;
        Ok(matches!(
            res.and_then(|mut r| r.pop()),
            Some(ReadResult::Pairs { entries, .. }) if entries.first().is_some_and(|(_, v)| v == pending)
        ))
    }

    /// Drops an instance that will never be committed: claims its pending entry (unless the
    /// collector already did) and deletes its data.
    pub async fn abandon_instance(
        &self,
        b: &BucketRecord,
        key: &str,
        inst: &str,
        pending: &Bytes,
    ) -> Result<()> {
        let pk = pending_key(inst);
        match self
            .inner
            .index
            .operate(
                WriteOp::new()
                    .cmp_omap(&pk, Some(pending))
                    .omap_rm_keys(&[&pk]),
                &self.shard_name(b, key),
            )
            .await
        {
            Ok(_) => self.delete_instance(inst, None).await,
            Err(ClientError::Canceled { .. } | ClientError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes `key`; its data goes to the garbage collector. Returns the removed entry.
    pub async fn delete_object(&self, b: &BucketRecord, key: &str) -> Result<Option<IndexEntry>> {
        let shard = self.shard_name(b, key);
        let k = obj_key(key);
        for _ in 0..CAS_TRIES {
            let Some((raw, e)) = self.lookup_raw(b, key).await? else {
                return Ok(None);
            };
            let op = WriteOp::new()
                .cmp_omap(&k, Some(&raw))
                .omap_rm_keys(&[&k])
                .omap_set(&[gc_entry(self.gc_due(), &e.inst, e.size)]);
            match self.inner.index.operate(op, &shard).await {
                Ok(_) => return Ok(Some(e)),
                Err(ClientError::Canceled { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(format!("{}/{key}", b.name)))
    }

    /// Lists objects in key order: those after `start_after` starting with `prefix`, keys
    /// sharing a segment up to `delimiter` rolled up into common prefixes, at most `max`
    /// entries (objects plus prefixes).
    pub async fn list_objects(
        &self,
        b: &BucketRecord,
        prefix: &str,
        start_after: &str,
        delimiter: Option<&str>,
        max: usize,
    ) -> Result<Listing> {
        let mut start = start_after.to_string();
        // a marker that is itself a common prefix resumes after everything under it
        if let Some(d) = delimiter.filter(|d| !d.is_empty())
            && let Some(rest) = start.strip_prefix(prefix)
            && let Some(pos) = rest.find(d)
        {
            let cp_len = prefix.len() + pos + d.len();
            if cp_len == start.len() {
                start.push(char::MAX);
            }
        }
        let mut cursor = MergedCursor::new(self, b, OBJ_PREFIX, prefix, &start, max);
        let mut out = Listing::default();
        let mut count = 0usize;
        while count < max {
            let Some((okey, raw)) = cursor.next().await? else {
                return Ok(out);
            };
            let key = &okey[OBJ_PREFIX.len()..];
            if let Some(d) = delimiter.filter(|d| !d.is_empty())
                && let Some(pos) = key[prefix.len()..].find(d)
            {
                let cp = key[..prefix.len() + pos + d.len()].to_string();
                cursor.skip_past(&format!("{OBJ_PREFIX}{cp}{}", char::MAX));
                out.last = Some(cp.clone());
                out.prefixes.push(cp);
            } else {
                let e: IndexEntry = decode(&b.name, &raw)?;
                out.last = Some(key.to_string());
                out.objects.push((key.to_string(), e));
            }
            count += 1;
        }
        out.truncated = cursor.peek().await?;
        Ok(out)
    }

    /// Counts a bucket's objects and bytes (walks the whole index).
    pub async fn bucket_usage(&self, b: &BucketRecord) -> Result<(u64, u64)> {
        let mut cursor = MergedCursor::new(self, b, OBJ_PREFIX, "", "", 1000);
        let (mut n, mut bytes) = (0u64, 0u64);
        while let Some((_, raw)) = cursor.next().await? {
            let e: IndexEntry = decode(&b.name, &raw)?;
            n += 1;
            bytes += e.size;
        }
        Ok((n, bytes))
    }

    // ---- multipart uploads

    /// Starts a multipart upload of `key`; returns its id.
    pub async fn create_upload(
        &self,
        b: &BucketRecord,
        key: &str,
        meta: ObjectMeta,
    ) -> Result<String> {
        let upload_id = random_hex(16);
        let entry = UploadEntry {
            initiated_ns: now_ns(),
            meta,
        };
        self.inner
            .index
            .omap_set(
                &self.shard_name(b, key),
                &[(upload_key(key, &upload_id), encode(&entry))],
            )
            .await?;
        Ok(upload_id)
    }

    /// The upload's record (`NoSuchUpload` if it is not in progress).
    pub async fn upload(
        &self,
        b: &BucketRecord,
        key: &str,
        upload_id: &str,
    ) -> Result<UploadEntry> {
        let shard = self.shard_name(b, key);
        let uk = upload_key(key, upload_id);
        let res = found(
            self.inner
                .index
                .operate_read(ReadOp::new().omap_get_vals_by_keys(&[&uk]), &shard)
                .await,
        )?;
        match res.and_then(|mut r| r.pop()) {
            Some(ReadResult::Pairs { entries, .. }) if !entries.is_empty() => {
                decode(&shard, &entries[0].1)
            }
            _ => Err(RgwError::NoSuchUpload(upload_id.to_string())),
        }
    }

    /// Records an uploaded part (replacing an earlier upload of the same number, whose data
    /// goes to the garbage collector).
    pub async fn commit_part(
        &self,
        b: &BucketRecord,
        key: &str,
        upload_id: &str,
        part: i32,
        entry: &PartEntry,
        pending: &Bytes,
    ) -> Result<()> {
        let shard = self.shard_name(b, key);
        let uk = upload_key(key, upload_id);
        let mk = part_key(upload_id, part);
        let pk = pending_key(&entry.inst);
        for _ in 0..CAS_TRIES {
            let res = found(
                self.inner
                    .index
                    .operate_read(ReadOp::new().omap_get_vals_by_keys(&[&uk, &mk]), &shard)
                    .await,
            )?;
            let entries = match res.and_then(|mut r| r.pop()) {
                Some(ReadResult::Pairs { entries, .. }) => entries,
                _ => Vec::new(),
            };
            if !entries.iter().any(|(k, _)| *k == uk) {
                return Err(RgwError::NoSuchUpload(upload_id.to_string()));
            }
            let old = entries
                .iter()
                .find(|(k, _)| *k == mk)
                .map(|(_, v)| v.clone());
            let mut sets = vec![(mk.clone(), encode(entry))];
            if let Some(raw) = &old {
                let o: PartEntry = decode(&shard, raw)?;
                sets.push(gc_entry(self.gc_due(), &o.inst, o.size));
            }
            let op = WriteOp::new()
                .omap_key_present(&uk)
                .cmp_omap(&mk, old.as_deref())
                .cmp_omap(&pk, Some(pending))
                .omap_set(&sets)
                .omap_rm_keys(&[&pk]);
            match self.inner.index.operate(op, &shard).await {
                Ok(_) => return Ok(()),
                Err(ClientError::Canceled { .. }) => {
                    if !self.pending_present(&shard, &pk, pending).await? {
                        return Err(RgwError::Body(format!(
                            "part {part} of '{key}' took longer than the grace period"
                        )));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(format!("{}/{key}", b.name)))
    }

    /// An upload's parts after `after` (part number), up to `max`, and whether more follow.
    pub async fn parts(
        &self,
        b: &BucketRecord,
        key: &str,
        upload_id: &str,
        after: i32,
        max: u32,
    ) -> Result<(Vec<(i32, PartEntry)>, bool)> {
        let shard = self.shard_name(b, key);
        let prefix = parts_prefix(upload_id);
        let start = if after > 0 {
            part_key(upload_id, after)
        } else {
            String::new()
        };
        let (entries, more) = match self
            .inner
            .index
            .omap_get_vals(&shard, &start, &prefix, max.clamp(1, 1000))
            .await
        {
            Ok(p) => p,
            Err(ClientError::NotFound { .. }) => (Vec::new(), false),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            let n: i32 = k[prefix.len()..].parse().map_err(|_| RgwError::Corrupt {
                object: shard.clone(),
                message: format!("bad part key {k:?}"),
            })?;
            out.push((n, decode(&shard, &v)?));
        }
        Ok((out, more))
    }

    /// Every part of an upload, in order.
    pub async fn all_parts(
        &self,
        b: &BucketRecord,
        key: &str,
        upload_id: &str,
    ) -> Result<Vec<(i32, PartEntry)>> {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let (page, more) = self.parts(b, key, upload_id, after, 1000).await?;
            if let Some((n, _)) = page.last() {
                after = *n;
            }
            let empty = page.is_empty();
            all.extend(page);
            if !more || empty {
                return Ok(all);
            }
        }
    }

    /// Completes an upload: `head` (a written instance whose meta lists `used` parts) becomes
    /// the object; parts not used go to the garbage collector. One atomic index update.
    #[allow(clippy::too_many_arguments)]
    pub async fn complete_upload(
        &self,
        b: &BucketRecord,
        key: &str,
        upload_id: &str,
        entry: &IndexEntry,
        pending: &Bytes,
        used: &[(i32, PartEntry)],
        unused: &[(i32, PartEntry)],
    ) -> Result<Option<IndexEntry>> {
        let shard = self.shard_name(b, key);
        let k = obj_key(key);
        let uk = upload_key(key, upload_id);
        let pk = pending_key(&entry.inst);
        for _ in 0..CAS_TRIES {
            let old = self.lookup_raw(b, key).await?;
            let mut op = WriteOp::new()
                .omap_key_present(&uk)
                .cmp_omap(&k, old.as_ref().map(|(raw, _)| raw.as_ref()))
                .cmp_omap(&pk, Some(pending));
            for (n, p) in used.iter().chain(unused) {
                let raw = encode(p);
                op = op.cmp_omap(&part_key(upload_id, *n), Some(&raw));
            }
            let mut sets: Vec<(String, Vec<u8>)> = vec![(k.clone(), encode(entry))];
            if let Some((_, e)) = &old {
                sets.push(gc_entry(self.gc_due(), &e.inst, e.size));
            }
            for (_, p) in unused {
                sets.push(gc_entry(self.gc_due(), &p.inst, p.size));
            }
            let mut rms: Vec<String> = vec![uk.clone(), pk.clone()];
            rms.extend(
                used.iter()
                    .chain(unused)
                    .map(|(n, _)| part_key(upload_id, *n)),
            );
            op = op.omap_set(&sets).omap_rm_keys(&rms);
            match self.inner.index.operate(op, &shard).await {
                Ok(_) => return Ok(old.map(|(_, e)| e)),
                Err(ClientError::Canceled { .. }) => {
                    // the upload may have been completed or aborted meanwhile
                    self.upload(b, key, upload_id).await?;
                    let now: Vec<(i32, PartEntry)> = self.all_parts(b, key, upload_id).await?;
                    let expected: Vec<(i32, PartEntry)> =
                        used.iter().chain(unused).cloned().collect();
                    let mut sorted = expected.clone();
                    sorted.sort_by_key(|(n, _)| *n);
                    if now != sorted {
                        return Err(RgwError::InvalidPart(
                            "the upload's parts changed while it was being completed".into(),
                        ));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(format!("{}/{key}", b.name)))
    }

    /// Aborts an upload: its parts go to the garbage collector.
    pub async fn abort_upload(&self, b: &BucketRecord, key: &str, upload_id: &str) -> Result<()> {
        let shard = self.shard_name(b, key);
        let uk = upload_key(key, upload_id);
        for _ in 0..CAS_TRIES {
            self.upload(b, key, upload_id).await?;
            let parts = self.all_parts(b, key, upload_id).await?;
            let mut op = WriteOp::new().omap_key_present(&uk);
            let mut sets = Vec::new();
            let mut rms = vec![uk.clone()];
            for (n, p) in &parts {
                let mk = part_key(upload_id, *n);
                let raw = encode(p);
                op = op.cmp_omap(&mk, Some(&raw));
                sets.push(gc_entry(self.gc_due(), &p.inst, p.size));
                rms.push(mk);
            }
            op = op.omap_set(&sets).omap_rm_keys(&rms);
            match self.inner.index.operate(op, &shard).await {
                Ok(_) => return Ok(()),
                Err(ClientError::Canceled { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(format!("{}/{key}", b.name)))
    }

    /// Multipart uploads in progress, ordered by key then upload id, after
    /// (`key_marker`, `upload_id_marker`), with keys starting with `prefix`.
    pub async fn list_uploads(
        &self,
        b: &BucketRecord,
        prefix: &str,
        key_marker: &str,
        upload_id_marker: &str,
        max: usize,
    ) -> Result<(Vec<UploadInfo>, bool)> {
        let start = if key_marker.is_empty() {
            String::new()
        } else if upload_id_marker.is_empty() {
            // everything of key_marker itself is skipped
            format!("{key_marker}\u{0}{}", char::MAX)
        } else {
            format!("{key_marker}\u{0}{upload_id_marker}")
        };
        let mut cursor = MergedCursor::new(self, b, UPLOAD_PREFIX, prefix, &start, max);
        let mut out = Vec::new();
        while out.len() < max {
            let Some((ukey, raw)) = cursor.next().await? else {
                return Ok((out, false));
            };
            let rest = &ukey[UPLOAD_PREFIX.len()..];
            let Some((key, id)) = rest.rsplit_once('\u{0}') else {
                continue;
            };
            let e: UploadEntry = decode(&b.name, &raw)?;
            out.push(UploadInfo {
                key: key.to_string(),
                upload_id: id.to_string(),
                initiated_ns: e.initiated_ns,
            });
        }
        let more = cursor.peek().await?;
        Ok((out, more))
    }
}

fn gc_entry(due_ns: u64, inst: &str, size: u64) -> (String, Vec<u8>) {
    (
        gc_key(due_ns, inst),
        encode(&GcEntry {
            inst: inst.to_string(),
            size,
        }),
    )
}

fn check_condition(key: &str, old: Option<&IndexEntry>, cond: &WriteCondition) -> Result<()> {
    if cond.if_absent && old.is_some() {
        return Err(RgwError::PreconditionFailed(format!(
            "'{key}' already exists"
        )));
    }
    if let Some(want) = &cond.if_etag {
        match old {
            Some(e) if e.etag == *want || want == "*" => {}
            Some(_) => {
                return Err(RgwError::PreconditionFailed(format!(
                    "'{key}' has another ETag"
                )));
            }
            None => return Err(RgwError::NoSuchKey(key.to_string())),
        }
    }
    Ok(())
}

/// Walks the omap entries under one prefix of every shard of a bucket in global key order
/// (a k-way merge of the shards' sorted pages).
struct MergedCursor<'a> {
    rgw: &'a Rgw,
    shards: Vec<ShardCursor>,
    /// omap-level prefix ("o" + user prefix)
    prefix: String,
    page: u32,
}

struct ShardCursor {
    obj: String,
    buf: VecDeque<(String, Bytes)>,
    after: String,
    more: bool,
}

impl<'a> MergedCursor<'a> {
    fn new(
        rgw: &'a Rgw,
        b: &BucketRecord,
        space: &str,
        prefix: &str,
        start_after: &str,
        want: usize,
    ) -> Self {
        let full_prefix = format!("{space}{prefix}");
        let after = if start_after.is_empty() {
            String::new()
        } else {
            format!("{space}{start_after}")
        };
        let per_shard = (want.saturating_mul(2) / b.shards.max(1) as usize).clamp(32, 1000) as u32;
        MergedCursor {
            rgw,
            shards: (0..b.shards)
                .map(|s| ShardCursor {
                    obj: shard_obj(&b.id, s),
                    buf: VecDeque::new(),
                    after: after.clone(),
                    more: true,
                })
                .collect(),
            prefix: full_prefix,
            page: per_shard,
        }
    }

    async fn fill(&mut self) -> Result<()> {
        let io = &self.rgw.inner.index;
        let mut fetches = Vec::new();
        for (i, s) in self.shards.iter().enumerate() {
            if s.buf.is_empty() && s.more {
                fetches.push((
                    i,
                    io.omap_get_vals(&s.obj, &s.after, &self.prefix, self.page),
                ));
            }
        }
        let idx: Vec<usize> = fetches.iter().map(|(i, _)| *i).collect();
        let results = futures::future::join_all(fetches.into_iter().map(|(_, f)| f)).await;
        for (i, r) in idx.into_iter().zip(results) {
            let s = &mut self.shards[i];
            match r {
                Ok((entries, more)) => {
                    if let Some((k, _)) = entries.last() {
                        s.after = k.clone();
                    }
                    s.more = more && !entries.is_empty();
                    s.buf.extend(entries);
                }
                Err(ClientError::NotFound { .. }) => s.more = false,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The next entry in global order.
    async fn next(&mut self) -> Result<Option<(String, Bytes)>> {
        self.fill().await?;
        let best = self
            .shards
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.buf.front().map(|(k, _)| (i, k)))
            .min_by(|a, b| a.1.cmp(b.1))
            .map(|(i, _)| i);
        Ok(best.and_then(|i| self.shards[i].buf.pop_front()))
    }

    /// Whether any entry remains.
    async fn peek(&mut self) -> Result<bool> {
        self.fill().await?;
        Ok(self.shards.iter().any(|s| !s.buf.is_empty()))
    }

    /// Skips every entry up to and including `bound`.
    fn skip_past(&mut self, bound: &str) {
        for s in &mut self.shards {
            while s.buf.front().is_some_and(|(k, _)| k.as_str() <= bound) {
                s.buf.pop_front();
            }
            if s.buf.is_empty() && s.after.as_str() < bound {
                s.after = bound.to_string();
            }
        }
    }
}
