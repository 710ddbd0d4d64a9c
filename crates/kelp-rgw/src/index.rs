//! The bucket index: one object per shard, its omap the sorted listing of that shard's keys
//! plus the bookkeeping of writes in flight, garbage and multipart uploads (see [`layout`]).
//! Every change to a key is a single omap update of its shard guarded by `CmpOmap` on what
//! the writer read, retried on a race: two writers of one key can never both win, and no
//! instance is ever left referenced by nobody without a `p` or `g` entry naming it.
//!
//! [`layout`]: crate::layout

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kelp_client::{ClientError, ReadOp, ReadResult, WriteOp};

use crate::error::{Result, RgwError, found};
use crate::layout::{
    BucketRecord, GcEntry, IndexEntry, LOG_PREFIX, LogEntry, MARKER, MARKER_MOVED,
    MARKER_RESHARDING, NULL_VERSION, OBJ_PREFIX, ObjectMeta, PartEntry, Pending, UPLOAD_PREFIX,
    UploadEntry, VERSION_PREFIX, Versioning, decode, encode, frozen_since, gc_key, now_ns, obj_key,
    part_key, parts_prefix, random_hex, shard_obj, shard_of, upload_key, version_key, version_sort,
    versions_prefix,
};
use crate::pending::PendingEntry;
use crate::rgw::Rgw;

/// Most compare-and-swap attempts on one key before giving up with "busy".
const CAS_TRIES: usize = 32;
/// Longest a change waits for a shard frozen by a reshard's final step (normally a few round
/// trips) before giving up with "busy" (S3 SlowDown, which clients retry).
const FROZEN_WAIT_MAX: Duration = Duration::from_secs(10);

/// The back-off of a change waiting for a frozen shard: 2 ms doubling to 50 ms per poll, so a
/// writer notices the switch within 50 ms of it.
#[derive(Default)]
struct FrozenWait {
    waited: Duration,
    next: Duration,
}

impl FrozenWait {
    async fn pause(&mut self, obj: &str) -> Result<()> {
        if self.waited >= FROZEN_WAIT_MAX {
            return Err(RgwError::Busy(format!("{obj} (frozen by a reshard)")));
        }
        self.next = (self.next * 2).clamp(Duration::from_millis(2), Duration::from_millis(50));
        tokio::time::sleep(self.next).await;
        self.waited += self.next;
        Ok(())
    }
}

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

/// One page of a version listing.
#[derive(Debug, Default)]
pub struct VersionListing {
    /// (key, version or delete marker, is it the key's latest)
    pub versions: Vec<(String, IndexEntry, bool)>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    /// The last (key, version id) or common prefix (with an empty version id) returned.
    pub last: Option<(String, String)>,
}

impl VersionListing {
    fn count(&self) -> usize {
        self.versions.len() + self.prefixes.len()
    }
}

/// The next `v` entry of a version walk: (key, version).
async fn next_version(c: &mut MergedCursor<'_>, obj: &str) -> Result<Option<(String, IndexEntry)>> {
    let Some((vk, raw)) = c.next().await? else {
        return Ok(None);
    };
    let key = user_key_of(VERSION_PREFIX, &vk);
    Ok(Some((key, decode(obj, &raw)?)))
}

/// The next `o` entry of a walk: (key, entry).
async fn next_object(c: &mut MergedCursor<'_>, obj: &str) -> Result<Option<(String, IndexEntry)>> {
    let Some((ok, raw)) = c.next().await? else {
        return Ok(None);
    };
    Ok(Some((
        ok[OBJ_PREFIX.len()..].to_string(),
        decode(obj, &raw)?,
    )))
}

/// One multipart upload in a listing.
#[derive(Debug, Clone)]
pub struct UploadInfo {
    pub key: String,
    pub upload_id: String,
    pub initiated_ns: u64,
}

/// Where a key's index entries are right now, and how a change to them must be guarded.
pub(crate) struct KeyShard {
    pub obj: String,
    /// The shard's reshard marker as read (the change is guarded on it being unchanged).
    marker: Option<Bytes>,
    /// The shard is being resharded: changes are logged for the resharder.
    log: bool,
    /// The shard is frozen for the final replay of a reshard: it can be read, but a change
    /// must wait until it has moved.
    frozen: bool,
}

/// What a key's index read returned.
pub(crate) struct KeyRead {
    pub shard: KeyShard,
    pub vals: BTreeMap<String, Bytes>,
    /// Entries under the requested prefixes, in order within each prefix.
    pub listed: Vec<(String, Bytes)>,
}

impl KeyRead {
    /// The decoded index entry stored under omap key `k`, if any.
    pub fn entry(&self, k: &str) -> Result<Option<IndexEntry>> {
        self.vals
            .get(k)
            .map(|raw| decode(&self.shard.obj, raw))
            .transpose()
    }

    /// The listed entries under `prefix` (one of the prefixes read), in order.
    pub fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a (String, Bytes)> {
        self.listed
            .iter()
            .filter(move |(k, _)| k.starts_with(prefix))
    }
}

/// One atomic change to a key's shard: guards, then sets and removals.
#[derive(Default, Clone)]
pub(crate) struct Txn {
    guards: Vec<(String, Option<Vec<u8>>)>,
    present: Vec<String>,
    sets: Vec<(String, Vec<u8>)>,
    rms: Vec<String>,
}

impl Txn {
    /// The change applies only if `k` holds `v` (or, with `None`, is absent).
    pub fn expect(&mut self, k: &str, v: Option<&[u8]>) -> &mut Self {
        self.guards.push((k.to_string(), v.map(<[u8]>::to_vec)));
        self
    }
    pub fn expect_present(&mut self, k: &str) -> &mut Self {
        self.present.push(k.to_string());
        self
    }
    pub fn set(&mut self, k: impl Into<String>, v: Vec<u8>) -> &mut Self {
        self.sets.push((k.into(), v));
        self
    }
    pub fn rm(&mut self, k: impl Into<String>) -> &mut Self {
        self.rms.push(k.into());
        self
    }

    fn build(mut self, shard: &KeyShard, key: &str) -> WriteOp {
        // a bucket's shards exist while it does: never recreate one of a deleted bucket
        let mut op = WriteOp::new()
            .assert_exists()
            .cmp_omap(MARKER, shard.marker.as_deref());
        for (k, v) in &self.guards {
            op = op.cmp_omap(k, v.as_deref());
        }
        for k in &self.present {
            op = op.omap_key_present(k);
        }
        if shard.log {
            let mut touched: Vec<String> = self.sets.iter().map(|(k, _)| k.clone()).collect();
            touched.extend(self.rms.iter().cloned());
            let entry = LogEntry {
                key: key.to_string(),
                omap: touched,
            };
            self.sets.push((
                format!("{LOG_PREFIX}{:016x}.{}", now_ns(), random_hex(4)),
                encode(&entry),
            ));
        }
        if !self.sets.is_empty() {
            op = op.omap_set(&self.sets);
        }
        if !self.rms.is_empty() {
            op = op.omap_rm_keys(&self.rms);
        }
        op
    }
}

/// What a planned change decided.
pub(crate) enum Step<T> {
    /// Nothing to write.
    Done(T),
    Write(Txn, T),
}

impl Rgw {
    /// A fresh instance name in bucket `b`.
    pub fn new_instance(&self, b: &BucketRecord) -> String {
        format!("{}.{}", b.id, random_hex(12))
    }

    /// Re-reads a bucket's record (after a reshard started or finished, or a shard was
    /// missing); `NoSuchBucket` once it is gone or is another incarnation.
    async fn refresh(&self, b: &mut BucketRecord) -> Result<()> {
        let fresh = self.bucket(&b.name).await?;
        if fresh.id != b.id {
            return Err(RgwError::NoSuchBucket(b.name.clone()));
        }
        *b = fresh;
        Ok(())
    }

    /// Reads omap `keys` (and everything under `prefixes`) of the shard holding `key`,
    /// following a reshard in progress or just finished.
    pub(crate) async fn key_read(
        &self,
        b: &mut BucketRecord,
        key: &str,
        keys: &[String],
        prefixes: &[&str],
    ) -> Result<KeyRead> {
        for _ in 0..CAS_TRIES {
            let old = shard_obj(&b.id, b.generation, shard_of(key, b.shards));
            let (marker, vals, listed) = self.read_shard(&old, keys, prefixes).await?;
            match (&marker, &b.reshard) {
                (Some(m), Some(t)) if m.as_ref() == MARKER_MOVED => {
                    let new = shard_obj(&b.id, t.generation, shard_of(key, t.shards));
                    let (marker, vals, listed) = self.read_shard(&new, keys, prefixes).await?;
                    return Ok(KeyRead {
                        shard: KeyShard {
                            obj: new,
                            marker,
                            log: false,
                            frozen: false,
                        },
                        vals,
                        listed,
                    });
                }
                // the record is older than the reshard that marked this shard
                (Some(_), None) => self.refresh(b).await?,
                (_, _) => {
                    // a change is logged only once the shard is marked: one that raced the
                    // marking fails its guard on the marker and is retried with logging
                    let log = marker.as_deref() == Some(MARKER_RESHARDING);
                    let frozen = marker.as_deref().and_then(frozen_since).is_some();
                    return Ok(KeyRead {
                        shard: KeyShard {
                            obj: old,
                            marker,
                            log,
                            frozen,
                        },
                        vals,
                        listed,
                    });
                }
            }
        }
        Err(RgwError::Busy(format!("{}/{key}", b.name)))
    }

    async fn read_shard(
        &self,
        obj: &str,
        keys: &[String],
        prefixes: &[&str],
    ) -> Result<(Option<Bytes>, BTreeMap<String, Bytes>, Vec<(String, Bytes)>)> {
        let mut all: Vec<&str> = keys.iter().map(String::as_str).collect();
        all.push(MARKER);
        let mut op = ReadOp::new().omap_get_vals_by_keys(&all);
        for p in prefixes {
            op = op.omap_get_vals("", p, 1000);
        }
        let Some(res) = found(self.inner.index.operate_read(op, obj).await)? else {
            return Ok((None, BTreeMap::new(), Vec::new()));
        };
        let mut it = res.into_iter();
        let mut vals: BTreeMap<String, Bytes> = match it.next() {
            Some(ReadResult::Pairs { entries, .. }) => entries.into_iter().collect(),
            _ => BTreeMap::new(),
        };
        let marker = vals.remove(MARKER);
        let mut listed = Vec::new();
        for p in prefixes {
            let Some(ReadResult::Pairs { entries, more }) = it.next() else {
                break;
            };
            let mut more = more && !entries.is_empty();
            let mut after = entries.last().map(|(k, _)| k.clone()).unwrap_or_default();
            listed.extend(entries);
            while more {
                let (page, m) = self.inner.index.omap_get_vals(obj, &after, p, 1000).await?;
                more = m && !page.is_empty();
                if let Some((k, _)) = page.last() {
                    after = k.clone();
                }
                listed.extend(page);
            }
        }
        Ok((marker, vals, listed))
    }

    /// Reads, decides and writes one atomic change to `key`'s index entries, retrying when
    /// another writer (or a reshard) got there first.
    pub(crate) async fn key_update<T>(
        &self,
        b: &BucketRecord,
        key: &str,
        keys: &[String],
        prefixes: &[&str],
        mut plan: impl FnMut(&KeyRead) -> Result<Step<T>>,
    ) -> Result<T> {
        let mut b = b.clone();
        let mut frozen_wait = FrozenWait::default();
        let mut tries = 0;
        while tries < CAS_TRIES {
            let read = self.key_read(&mut b, key, keys, prefixes).await?;
            let (txn, out) = match plan(&read)? {
                Step::Done(t) => return Ok(t),
                Step::Write(txn, t) => (txn, t),
            };
            if read.shard.frozen {
                // the resharder is replaying this shard's last changes (a few round trips);
                // the change goes to the new shard once it has moved
                frozen_wait.pause(&read.shard.obj).await?;
                continue;
            }
            tries += 1;
            match self
                .inner
                .index
                .operate(txn.build(&read.shard, key), &read.shard.obj)
                .await
            {
                Ok(_) => return Ok(out),
                Err(ClientError::Canceled { .. }) => {
                    self.refresh(&mut b).await?;
                }
                Err(ClientError::NotFound { .. }) => {
                    // deleted (refresh says so), or a shard never written yet: an index made
                    // before shards were created with the bucket, or a reshard's new shard
                    self.refresh(&mut b).await?;
                    match self
                        .inner
                        .index
                        .operate(WriteOp::new().create(false), &read.shard.obj)
                        .await
                    {
                        Ok(_) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(format!("{}/{key}", b.name)))
    }

    /// The index entry of `key`.
    pub async fn lookup(&self, b: &BucketRecord, key: &str) -> Result<Option<IndexEntry>> {
        let k = obj_key(key);
        let mut b = b.clone();
        let read = self
            .key_read(&mut b, key, std::slice::from_ref(&k), &[])
            .await?;
        read.vals
            .get(&k)
            .map(|raw| decode(&read.shard.obj, raw))
            .transpose()
    }

    /// Writes `t` to `key`'s shard without reading the shard first, guarded on the shard being
    /// unmarked, when the bucket's record names no reshard (then the shard almost always is).
    /// `false` if it was not written: a reshard, any marker (resharding, frozen, moved), a
    /// missing shard or one of `t`'s own guards failing; the caller then takes the general
    /// read-decide-write path ([`Rgw::key_update`]), which acts on what it finds.
    async fn try_unread(&self, b: &BucketRecord, key: &str, t: Txn) -> Result<bool> {
        if b.reshard.is_some() {
            return Ok(false);
        }
        let shard = KeyShard {
            obj: shard_obj(&b.id, b.generation, shard_of(key, b.shards)),
            marker: None,
            log: false,
            frozen: false,
        };
        match self
            .inner
            .index
            .operate(t.build(&shard, key), &shard.obj)
            .await
        {
            Ok(_) => Ok(true),
            Err(ClientError::Canceled { .. } | ClientError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Records that `inst` is being written for `key` (before any of its data), under one of
    /// this gateway's pending slots ([`crate::pending`]).
    pub async fn begin_write(
        &self,
        b: &BucketRecord,
        key: &str,
        inst: &str,
    ) -> Result<PendingEntry> {
        let value = Bytes::from(encode(&Pending {
            key: key.to_string(),
            since_ns: now_ns(),
            inst: inst.to_string(),
        }));
        let lease =
            self.inner
                .pending_slots
                .take(&shard_obj(&b.id, b.generation, shard_of(key, b.shards)));
        let p = PendingEntry::new(lease, value);
        let mut t = Txn::default();
        t.set(p.key(), p.value.to_vec());
        if self.try_unread(b, key, t.clone()).await? {
            return Ok(p);
        }
        self.key_update(b, key, &[], &[], |_| Ok(Step::Write(t.clone(), ())))
            .await?;
        Ok(p)
    }

    fn gc_due(&self) -> u64 {
        now_ns() + self.inner.cfg.gc_min_wait.as_nanos() as u64
    }

    fn grace_error(&self, what: &str) -> RgwError {
        RgwError::Body(format!(
            "{what} took longer than the {}s grace period for uploads",
            self.inner.cfg.pending_grace.as_secs()
        ))
    }

    /// Makes `entry` (a written instance) the object `key`, if `cond` holds: in a bucket
    /// without versioning the instance it replaces goes to the garbage collector; with
    /// versioning the entry becomes the newest version. Returns what it replaced.
    pub async fn commit_object(
        &self,
        b: &BucketRecord,
        key: &str,
        entry: &IndexEntry,
        pending: &PendingEntry,
        cond: &WriteCondition,
    ) -> Result<Made> {
        let made = self
            .commit_object_inner(b, key, entry, pending, cond)
            .await?;
        pending.removed();
        Ok(made)
    }

    async fn commit_object_inner(
        &self,
        b: &BucketRecord,
        key: &str,
        entry: &IndexEntry,
        pending: &PendingEntry,
        cond: &WriteCondition,
    ) -> Result<Made> {
        let pending_value = &pending.value;
        let k = obj_key(key);
        let pk = pending.key().to_string();
        let vp = versions_prefix(key);
        let due = self.gc_due();
        let mode = b.versioning;
        if mode.is_none() && cond.if_etag.is_none() {
            // Most writes in a bucket without versioning create a new key (an ingest, a
            // backup): commit guarded on the key being absent, without reading the shard. An
            // existing key (whose instance must go to the garbage collector) or a lost pending
            // entry fails a guard, and the general path below reads the shard and decides.
            let mut t = Txn::default();
            t.expect(&pk, Some(pending_value))
                .rm(pk.clone())
                .expect(&k, None)
                .set(k.clone(), encode(entry));
            if self.try_unread(b, key, t).await? {
                return Ok(Made::default());
            }
        }
        self.key_update(
            b,
            key,
            &[k.clone(), pk.clone()],
            &prefixes(mode, &vp),
            |r| {
                if r.vals.get(&pk) != Some(pending_value) {
                    return Err(self.grace_error(&format!("the upload of '{key}'")));
                }
                let old = r.entry(&k)?;
                check_condition(key, old.as_ref(), cond)?;
                let mut t = Txn::default();
                t.expect(&pk, Some(pending_value)).rm(pk.clone());
                let made = make_current(&mut t, r, key, mode, Some(entry.clone()), due)?;
                Ok(Step::Write(t, made))
            },
        )
        .await
    }

    /// Drops an instance that will never be committed: claims its pending entry (unless the
    /// collector already did) and deletes its data (never the parts a completion's manifest
    /// names: see [`Rgw::delete_uncommitted`]).
    pub async fn abandon_instance(
        &self,
        b: &BucketRecord,
        key: &str,
        inst: &str,
        pending: &PendingEntry,
    ) -> Result<()> {
        let pk = pending.key().to_string();
        let value = &pending.value;
        let claimed = self
            .key_update(b, key, std::slice::from_ref(&pk), &[], |r| {
                if r.vals.get(&pk) != Some(value) {
                    return Ok(Step::Done(false));
                }
                let mut t = Txn::default();
                t.expect(&pk, Some(value)).rm(pk.clone());
                Ok(Step::Write(t, true))
            })
            .await?;
        // Removed now, or earlier by the collector (the slot is this upload's alone).
        pending.removed();
        if claimed {
            self.delete_uncommitted(inst).await?;
        }
        Ok(())
    }

    /// Deletes `key` as S3 does without a version id: in a bucket without versioning the
    /// entry goes and its data goes to the garbage collector; with versioning a delete marker
    /// becomes the newest version (even when the key has no current object). `if_match`: only
    /// if the current object has this ETag.
    pub async fn delete_object(
        &self,
        b: &BucketRecord,
        key: &str,
        if_match: Option<&str>,
    ) -> Result<Made> {
        let k = obj_key(key);
        let vp = versions_prefix(key);
        let due = self.gc_due();
        let mode = b.versioning;
        self.key_update(
            b,
            key,
            std::slice::from_ref(&k),
            &prefixes(mode, &vp),
            |r| {
                let old = r.entry(&k)?;
                if let Some(want) = if_match {
                    match &old {
                        Some(e) if e.etag == want || want == "*" => {}
                        Some(_) => {
                            return Err(RgwError::PreconditionFailed(format!(
                                "'{key}' has another ETag"
                            )));
                        }
                        None => return Err(RgwError::NoSuchKey(key.to_string())),
                    }
                }
                if mode.is_none() && old.is_none() {
                    return Ok(Step::Done(Made::default()));
                }
                let mut t = Txn::default();
                let made = make_current(&mut t, r, key, mode, None, due)?;
                Ok(Step::Write(t, made))
            },
        )
        .await
    }

    /// Removes `key` only if its current entry is still `expected` (the lifecycle worker's
    /// expiration: two workers, or a writer racing with one, never expire a newer object).
    pub async fn expire_current(
        &self,
        b: &BucketRecord,
        key: &str,
        expected: &IndexEntry,
    ) -> Result<bool> {
        let k = obj_key(key);
        let vp = versions_prefix(key);
        let due = self.gc_due();
        let mode = b.versioning;
        self.key_update(
            b,
            key,
            std::slice::from_ref(&k),
            &prefixes(mode, &vp),
            |r| {
                let old = r.entry(&k)?;
                if old.as_ref() != Some(expected) {
                    return Ok(Step::Done(false));
                }
                let mut t = Txn::default();
                make_current(&mut t, r, key, mode, None, due)?;
                Ok(Step::Write(t, true))
            },
        )
        .await
    }

    /// Every version of `key`, newest first (an object written before versioning was enabled
    /// shows as its `null` version).
    pub async fn versions(&self, b: &BucketRecord, key: &str) -> Result<Vec<IndexEntry>> {
        let k = obj_key(key);
        let vp = versions_prefix(key);
        let mut b = b.clone();
        let r = self
            .key_read(&mut b, key, std::slice::from_ref(&k), &[&vp])
            .await?;
        key_versions(&r, &k, &vp).map(|v| v.into_iter().map(|(_, e, _)| e).collect())
    }

    /// The version `id` of `key` (`None` if there is no such version).
    pub async fn lookup_version(
        &self,
        b: &BucketRecord,
        key: &str,
        id: &str,
    ) -> Result<Option<IndexEntry>> {
        Ok(self
            .versions(b, key)
            .await?
            .into_iter()
            .find(|e| e.version_id() == id))
    }

    /// Permanently deletes version `id` of `key` (its data goes to the garbage collector); if
    /// it was the newest, the next one becomes current (or none, if that is a delete marker).
    /// Returns the removed version, `None` if there was none with that id.
    pub async fn delete_version(
        &self,
        b: &BucketRecord,
        key: &str,
        id: &str,
    ) -> Result<Option<IndexEntry>> {
        let k = obj_key(key);
        let vp = versions_prefix(key);
        let due = self.gc_due();
        self.key_update(b, key, std::slice::from_ref(&k), &[&vp], |r| {
            let versions = key_versions(r, &k, &vp)?;
            let Some(pos) = versions.iter().position(|(_, e, _)| e.version_id() == id) else {
                return Ok(Step::Done(None));
            };
            let (vk, victim, raw) = &versions[pos];
            let mut t = Txn::default();
            let cur = r.vals.get(&k);
            t.expect(&k, cur.map(|v| v.as_ref()));
            match vk {
                // a version kept only as the current entry (written before versioning)
                None => {
                    t.rm(k.clone());
                }
                Some(vk) => {
                    t.expect(vk, Some(raw)).rm(vk.clone());
                    if pos == 0 {
                        match versions.get(1) {
                            Some((_, next, _)) if !next.dm => {
                                t.set(k.clone(), encode(next));
                            }
                            _ => {
                                if cur.is_some() {
                                    t.rm(k.clone());
                                }
                            }
                        }
                    }
                }
            }
            if !victim.dm {
                let (gk, gv) = gc_entry(due, &victim.inst, victim.size);
                t.set(gk, gv);
            }
            Ok(Step::Write(t, Some(victim.clone())))
        })
        .await
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
        let mut cursor = MergedCursor::new(self, b, OBJ_PREFIX, prefix, &start, max).await?;
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

    /// Lists versions (and delete markers) in key order, newest first within a key, after
    /// (`key_marker`, `version_marker`), with keys starting with `prefix` and rolled up at
    /// `delimiter`; at most `max` entries (versions plus prefixes).
    pub async fn list_versions(
        &self,
        b: &BucketRecord,
        prefix: &str,
        key_marker: &str,
        version_marker: &str,
        delimiter: Option<&str>,
        max: usize,
    ) -> Result<VersionListing> {
        let delimiter = delimiter.filter(|d| !d.is_empty());
        // where each stream starts, and versions of the marker key still to skip
        let mut skip_in_marker: Option<&str> = None;
        let mut v_start = String::new();
        let mut o_start = key_marker.to_string();
        if !key_marker.is_empty() {
            let is_prefix = delimiter.is_some_and(|d| {
                key_marker
                    .strip_prefix(prefix)
                    .and_then(|rest| rest.find(d).map(|pos| pos + d.len() == rest.len()))
                    .unwrap_or(false)
            });
            if is_prefix {
                v_start = format!("{key_marker}{}", char::MAX);
                o_start = v_start.clone();
            } else if version_marker.is_empty() {
                v_start = format!("{key_marker}\u{0}{}", char::MAX);
            } else if version_marker == NULL_VERSION {
                v_start = key_marker.to_string();
                skip_in_marker = Some(NULL_VERSION);
            } else {
                v_start = format!("{key_marker}\u{0}{version_marker}");
            }
        }
        let mut vc = MergedCursor::new(self, b, VERSION_PREFIX, prefix, &v_start, max).await?;
        let mut oc = MergedCursor::new(self, b, OBJ_PREFIX, prefix, &o_start, max).await?;
        let mut out = VersionListing::default();
        // the key of the last version returned (later ones of the same key are not latest)
        let mut prev_key: Option<String> =
            (!version_marker.is_empty() && !key_marker.is_empty()).then(|| key_marker.to_string());
        let mut nv = next_version(&mut vc, &b.name).await?;
        let mut no = next_object(&mut oc, &b.name).await?;
        if let Some(skip) = skip_in_marker {
            // resume after the null version of the marker key
            while let Some((k, e)) = &nv {
                if k != key_marker {
                    break;
                }
                let done = e.version_id() == skip;
                nv = next_version(&mut vc, &b.name).await?;
                if done {
                    break;
                }
            }
        }
        loop {
            // an object with versions is listed from its versions only
            while let (Some((kv, _)), Some((ko, _))) = (&nv, &no) {
                if kv == ko {
                    no = next_object(&mut oc, &b.name).await?;
                } else {
                    break;
                }
            }
            let from_v = match (&nv, &no) {
                (None, None) => return Ok(out),
                (Some((kv, _)), Some((ko, _))) => kv < ko,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            if out.count() >= max {
                out.truncated = true;
                return Ok(out);
            }
            let key = if from_v { &nv } else { &no }
                .as_ref()
                .map(|(k, _)| k.clone())
                .unwrap_or_default();
            if let Some(d) = delimiter
                && let Some(pos) = key[prefix.len()..].find(d)
            {
                let cp = key[..prefix.len() + pos + d.len()].to_string();
                let bound = format!("{cp}{}", char::MAX);
                vc.skip_past(&format!("{VERSION_PREFIX}{bound}"));
                oc.skip_past(&format!("{OBJ_PREFIX}{bound}"));
                while nv.as_ref().is_some_and(|(k, _)| k.starts_with(&cp)) {
                    nv = next_version(&mut vc, &b.name).await?;
                }
                while no.as_ref().is_some_and(|(k, _)| k.starts_with(&cp)) {
                    no = next_object(&mut oc, &b.name).await?;
                }
                out.last = Some((cp.clone(), String::new()));
                out.prefixes.push(cp);
                continue;
            }
            let (k, e) = if from_v {
                std::mem::replace(&mut nv, next_version(&mut vc, &b.name).await?)
            } else {
                std::mem::replace(&mut no, next_object(&mut oc, &b.name).await?)
            }
            .expect("chosen stream has an entry");
            let latest = prev_key.as_deref() != Some(k.as_str());
            prev_key = Some(k.clone());
            out.last = Some((k.clone(), e.version_id().to_string()));
            out.versions.push((k, e, latest));
        }
    }

    /// Counts a bucket's objects and bytes (walks the whole index).
    pub async fn bucket_usage(&self, b: &BucketRecord) -> Result<(u64, u64)> {
        let mut cursor = MergedCursor::new(self, b, OBJ_PREFIX, "", "", 1000).await?;
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
        mut meta: ObjectMeta,
    ) -> Result<String> {
        let upload_id = random_hex(16);
        meta.key = key.to_string();
        let entry = encode(&UploadEntry {
            initiated_ns: now_ns(),
            meta,
        });
        let uk = upload_key(key, &upload_id);
        self.key_update(b, key, &[], &[], |_| {
            let mut t = Txn::default();
            t.set(uk.clone(), entry.clone());
            Ok(Step::Write(t, ()))
        })
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
        let uk = upload_key(key, upload_id);
        let mut b = b.clone();
        let r = self
            .key_read(&mut b, key, std::slice::from_ref(&uk), &[])
            .await?;
        match r.vals.get(&uk) {
            Some(raw) => decode(&r.shard.obj, raw),
            None => Err(RgwError::NoSuchUpload(upload_id.to_string())),
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
        pending: &PendingEntry,
    ) -> Result<()> {
        let uk = upload_key(key, upload_id);
        let mk = part_key(upload_id, part);
        let pk = pending.key().to_string();
        let pending_value = &pending.value;
        let raw_part = encode(entry);
        let due = self.gc_due();
        self.key_update(b, key, &[uk.clone(), mk.clone(), pk.clone()], &[], |r| {
            if !r.vals.contains_key(&uk) {
                return Err(RgwError::NoSuchUpload(upload_id.to_string()));
            }
            if r.vals.get(&pk) != Some(pending_value) {
                return Err(self.grace_error(&format!("part {part} of '{key}'")));
            }
            let old = r.vals.get(&mk);
            let mut t = Txn::default();
            t.expect_present(&uk)
                .expect(&mk, old.map(|v| v.as_ref()))
                .expect(&pk, Some(pending_value))
                .set(mk.clone(), raw_part.clone())
                .rm(pk.clone());
            if let Some(raw) = old {
                let o: PartEntry = decode(&r.shard.obj, raw)?;
                let (gk, gv) = gc_entry(due, &o.inst, o.size);
                t.set(gk, gv);
            }
            Ok(Step::Write(t, ()))
        })
        .await?;
        pending.removed();
        Ok(())
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
        let all = self.all_parts(b, key, upload_id).await?;
        let rest: Vec<(i32, PartEntry)> = all.into_iter().filter(|(n, _)| *n > after).collect();
        let more = rest.len() > max as usize;
        Ok((rest.into_iter().take(max as usize).collect(), more))
    }

    /// Every part of an upload, in order.
    pub async fn all_parts(
        &self,
        b: &BucketRecord,
        key: &str,
        upload_id: &str,
    ) -> Result<Vec<(i32, PartEntry)>> {
        let mut b = b.clone();
        let prefix = parts_prefix(upload_id);
        let r = self.key_read(&mut b, key, &[], &[&prefix]).await?;
        decode_parts(&r.shard.obj, &prefix, &r.listed)
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
        pending: &PendingEntry,
        used: &[(i32, PartEntry)],
        unused: &[(i32, PartEntry)],
        cond: &WriteCondition,
    ) -> Result<Made> {
        let k = obj_key(key);
        let uk = upload_key(key, upload_id);
        let pk = pending.key().to_string();
        let pending_value = &pending.value;
        let prefix = parts_prefix(upload_id);
        let vp = versions_prefix(key);
        let mut read_prefixes = vec![prefix.as_str()];
        read_prefixes.extend(prefixes(b.versioning, &vp));
        let due = self.gc_due();
        let mut expected: Vec<(i32, PartEntry)> = used.iter().chain(unused).cloned().collect();
        expected.sort_by_key(|(n, _)| *n);
        let made = self
            .key_update(
                b,
                key,
                &[k.clone(), uk.clone(), pk.clone()],
                &read_prefixes,
                |r| {
                    if !r.vals.contains_key(&uk) {
                        return Err(RgwError::NoSuchUpload(upload_id.to_string()));
                    }
                    if r.vals.get(&pk) != Some(pending_value) {
                        return Err(self.grace_error(&format!("completing '{key}'")));
                    }
                    let listed: Vec<(String, Bytes)> = r.under(&prefix).cloned().collect();
                    if decode_parts(&r.shard.obj, &prefix, &listed)? != expected {
                        return Err(RgwError::InvalidPart(
                            "the upload's parts changed while it was being completed".into(),
                        ));
                    }
                    // If-Match / If-None-Match: * on the object the upload replaces, checked
                    // in the same guarded update that replaces it
                    check_condition(key, r.entry(&k)?.as_ref(), cond)?;
                    let mut t = Txn::default();
                    t.expect_present(&uk)
                        .expect(&pk, Some(pending_value))
                        .rm(uk.clone())
                        .rm(pk.clone());
                    for (mk, raw) in &listed {
                        t.expect(mk, Some(raw)).rm(mk.clone());
                    }
                    for (_, p) in unused {
                        let (gk, gv) = gc_entry(due, &p.inst, p.size);
                        t.set(gk, gv);
                    }
                    let made =
                        make_current(&mut t, r, key, b.versioning, Some(entry.clone()), due)?;
                    Ok(Step::Write(t, made))
                },
            )
            .await?;
        pending.removed();
        Ok(made)
    }

    /// Aborts an upload: its parts go to the garbage collector.
    pub async fn abort_upload(&self, b: &BucketRecord, key: &str, upload_id: &str) -> Result<()> {
        let uk = upload_key(key, upload_id);
        let prefix = parts_prefix(upload_id);
        let due = self.gc_due();
        self.key_update(b, key, std::slice::from_ref(&uk), &[&prefix], |r| {
            if !r.vals.contains_key(&uk) {
                return Err(RgwError::NoSuchUpload(upload_id.to_string()));
            }
            let mut t = Txn::default();
            t.expect_present(&uk).rm(uk.clone());
            for (mk, raw) in r.under(&prefix) {
                let p: PartEntry = decode(&r.shard.obj, raw)?;
                let (gk, gv) = gc_entry(due, &p.inst, p.size);
                t.expect(mk, Some(raw)).rm(mk.clone()).set(gk, gv);
            }
            Ok(Step::Write(t, ()))
        })
        .await
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
        let mut cursor = MergedCursor::new(self, b, UPLOAD_PREFIX, prefix, &start, max).await?;
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

/// What making a new version current did.
#[derive(Debug, Default)]
pub struct Made {
    /// The key's current entry before.
    pub old: Option<IndexEntry>,
    /// The id of the version made (`None` in a bucket that never had versioning).
    pub version_id: Option<String>,
}

/// The prefixes a change to a key must read in a bucket with versioning mode `mode`.
fn prefixes(mode: Option<Versioning>, versions: &str) -> Vec<&str> {
    if mode.is_some() {
        vec![versions]
    } else {
        Vec::new()
    }
}

/// A key's versions from an index read of `o<key>` and the `v<key>` prefix, newest first:
/// (omap key of the `v` entry, entry, raw value). An object from before versioning has no
/// `v` entry: it is its own `null` version (omap key `None`).
fn key_versions(
    r: &KeyRead,
    k: &str,
    vp: &str,
) -> Result<Vec<(Option<String>, IndexEntry, Bytes)>> {
    let mut out = Vec::new();
    for (vk, raw) in r.under(vp) {
        out.push((Some(vk.clone()), decode(&r.shard.obj, raw)?, raw.clone()));
    }
    if out.is_empty()
        && let Some(raw) = r.vals.get(k)
    {
        out.push((None, decode(&r.shard.obj, raw)?, raw.clone()));
    }
    Ok(out)
}

/// Adds to `t` what makes `new` (an object; `None`: a deletion) the current version of `key`,
/// from what `r` read (`o<key>`, and the key's versions when `mode` is set). Without
/// versioning the replaced instance goes to the garbage collector; with versioning `new` (or
/// a delete marker) becomes the newest version, replacing the `null` version when suspended.
fn make_current(
    t: &mut Txn,
    r: &KeyRead,
    key: &str,
    mode: Option<Versioning>,
    new: Option<IndexEntry>,
    due: u64,
) -> Result<Made> {
    let k = obj_key(key);
    let old_raw = r.vals.get(&k);
    let old = r.entry(&k)?;
    t.expect(&k, old_raw.map(|v| v.as_ref()));
    let Some(mode) = mode else {
        if let Some(e) = &old {
            let (gk, gv) = gc_entry(due, &e.inst, e.size);
            t.set(gk, gv);
        }
        match new {
            Some(e) => {
                t.set(k, encode(&e));
            }
            None if old.is_some() => {
                t.rm(k);
            }
            None => {}
        }
        return Ok(Made {
            old,
            version_id: None,
        });
    };
    let now = now_ns();
    let vp = versions_prefix(key);
    let mut has_versions = false;
    for (vk, raw) in r.under(&vp) {
        has_versions = true;
        if mode == Versioning::Suspended {
            let v: IndexEntry = decode(&r.shard.obj, raw)?;
            if v.ver.is_none() {
                t.expect(vk, Some(raw)).rm(vk.clone());
                if !v.dm {
                    let (gk, gv) = gc_entry(due, &v.inst, v.size);
                    t.set(gk, gv);
                }
            }
        }
    }
    if !has_versions && let Some(e) = &old {
        // written before versioning was enabled: it is the null version
        if mode == Versioning::Enabled {
            t.set(
                version_key(key, &version_sort(e.mtime_ns.min(now.saturating_sub(1)))),
                encode(e),
            );
        } else {
            let (gk, gv) = gc_entry(due, &e.inst, e.size);
            t.set(gk, gv);
        }
    }
    let sort = version_sort(now);
    let ver = (mode == Versioning::Enabled).then(|| sort.clone());
    let entry = match new {
        Some(e) => IndexEntry {
            ver,
            dm: false,
            ..e
        },
        None => IndexEntry {
            ver,
            dm: true,
            mtime_ns: now,
            ..IndexEntry::default()
        },
    };
    t.set(version_key(key, &sort), encode(&entry));
    if entry.dm {
        if old_raw.is_some() {
            t.rm(k);
        }
    } else {
        t.set(k, encode(&entry));
    }
    Ok(Made {
        old,
        version_id: Some(entry.version_id().to_string()),
    })
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

fn decode_parts(
    obj: &str,
    prefix: &str,
    listed: &[(String, Bytes)],
) -> Result<Vec<(i32, PartEntry)>> {
    let mut out = Vec::with_capacity(listed.len());
    for (k, v) in listed {
        let n: i32 = k[prefix.len()..].parse().map_err(|_| RgwError::Corrupt {
            object: obj.to_string(),
            message: format!("bad part key {k:?}"),
        })?;
        out.push((n, decode(obj, v)?));
    }
    Ok(out)
}

/// The S3 key an index omap key is about (`o<key>`, `u<key>\0<id>`, `v<key>\0<version>`).
fn user_key_of(space: &str, omap_key: &str) -> String {
    let rest = &omap_key[space.len()..];
    match rest.rsplit_once('\u{0}') {
        Some((k, _)) if space == UPLOAD_PREFIX || space == VERSION_PREFIX => k.to_string(),
        _ => rest.to_string(),
    }
}

/// A shard to read in a listing; during a reshard, the new generation's shards carry only
/// the keys of old shards that have moved.
struct Source {
    obj: String,
    keep: Option<(u32, Arc<HashSet<u32>>)>,
}

impl Rgw {
    /// The shards a listing reads (see [`Source`]).
    async fn sources(&self, b: &BucketRecord) -> Result<Vec<Source>> {
        let Some(t) = &b.reshard else {
            return Ok((0..b.shards)
                .map(|s| Source {
                    obj: shard_obj(&b.id, b.generation, s),
                    keep: None,
                })
                .collect());
        };
        let markers = futures::future::join_all((0..b.shards).map(|s| {
            let obj = shard_obj(&b.id, b.generation, s);
            async move { (s, obj.clone(), self.read_shard(&obj, &[], &[]).await) }
        }))
        .await;
        let mut out = Vec::new();
        let mut moved = HashSet::new();
        for (s, obj, r) in markers {
            let (marker, _, _) = r?;
            if marker.as_deref() == Some(MARKER_MOVED) {
                moved.insert(s);
            } else {
                out.push(Source { obj, keep: None });
            }
        }
        if !moved.is_empty() {
            let moved = Arc::new(moved);
            out.extend((0..t.shards).map(|s| Source {
                obj: shard_obj(&b.id, t.generation, s),
                keep: Some((b.shards, moved.clone())),
            }));
        }
        Ok(out)
    }
}

/// Walks the omap entries under one prefix of every shard of a bucket in global key order
/// (a k-way merge of the shards' sorted pages).
struct MergedCursor<'a> {
    rgw: &'a Rgw,
    shards: Vec<ShardCursor>,
    space: String,
    /// omap-level prefix (space + user prefix)
    prefix: String,
    page: u32,
}

struct ShardCursor {
    obj: String,
    keep: Option<(u32, Arc<HashSet<u32>>)>,
    buf: VecDeque<(String, Bytes)>,
    after: String,
    more: bool,
}

impl<'a> MergedCursor<'a> {
    async fn new(
        rgw: &'a Rgw,
        b: &BucketRecord,
        space: &str,
        prefix: &str,
        start_after: &str,
        want: usize,
    ) -> Result<MergedCursor<'a>> {
        let full_prefix = format!("{space}{prefix}");
        let after = if start_after.is_empty() {
            String::new()
        } else {
            format!("{space}{start_after}")
        };
        let sources = rgw.sources(b).await?;
        let per_shard = (want.saturating_mul(2) / sources.len().max(1)).clamp(32, 1000) as u32;
        Ok(MergedCursor {
            rgw,
            shards: sources
                .into_iter()
                .map(|s| ShardCursor {
                    obj: s.obj,
                    keep: s.keep,
                    buf: VecDeque::new(),
                    after: after.clone(),
                    more: true,
                })
                .collect(),
            space: space.to_string(),
            prefix: full_prefix,
            page: per_shard,
        })
    }

    async fn fill(&mut self) -> Result<()> {
        loop {
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
            if fetches.is_empty() {
                return Ok(());
            }
            let idx: Vec<usize> = fetches.iter().map(|(i, _)| *i).collect();
            let results = futures::future::join_all(fetches.into_iter().map(|(_, f)| f)).await;
            let space = &self.space;
            for (i, r) in idx.into_iter().zip(results) {
                let s = &mut self.shards[i];
                match r {
                    Ok((entries, more)) => {
                        if let Some((k, _)) = entries.last() {
                            s.after = k.clone();
                        }
                        s.more = more && !entries.is_empty();
                        match &s.keep {
                            None => s.buf.extend(entries),
                            Some((old_shards, moved)) => {
                                s.buf.extend(entries.into_iter().filter(|(k, _)| {
                                    moved.contains(&shard_of(&user_key_of(space, k), *old_shards))
                                }))
                            }
                        }
                    }
                    Err(ClientError::NotFound { .. }) => s.more = false,
                    Err(e) => return Err(e.into()),
                }
            }
            // filtered shards may come back empty with more to read
            if !self.shards.iter().any(|s| s.buf.is_empty() && s.more) {
                return Ok(());
            }
        }
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
