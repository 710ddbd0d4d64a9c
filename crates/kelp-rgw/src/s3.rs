//! The S3 front end: `s3s` parses requests, checks SigV4 signatures (headers, presigned URLs,
//! streaming payloads) and writes XML; this module implements each operation on [`Rgw`].
//! Operations not listed here answer `NotImplemented` (the `s3s` default), never a silent
//! success.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use s3s::auth::{Credentials, S3Auth, SecretKey};
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

mod access;
mod cors_ops;
mod post;

pub use access::{ANONYMOUS_OPS, KelpAccess};
pub use post::MAX_POST_SIZE;

use self::access::{bucket_acl, object_acl};
use crate::acl::Access;
use crate::data::InstanceWriter;
use crate::error::RgwError;
use crate::index::WriteCondition;
use crate::layout::{
    BucketRecord, IndexEntry, NULL_VERSION, ObjectMeta, PartEntry, PartRef, STRIPE, Versioning,
    check_tags, now_ns, valid_version_id,
};
use crate::lifecycle;
use crate::pending::PendingEntry;
use crate::rgw::Rgw;

/// Largest single PUT (AWS's limit).
pub const MAX_PUT_SIZE: u64 = 5 << 30;
/// Smallest part of a multipart upload, except the last.
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// How long a looked-up access key is trusted before it is read again.
const KEY_CACHE_TTL: Duration = Duration::from_secs(10);

/// Maps a storage-layer error to the S3 error a client expects.
pub fn s3_err(e: RgwError) -> S3Error {
    use kelp_client::ClientError as C;
    let msg = e.to_string();
    let code = match &e {
        RgwError::NoSuchUser(_) | RgwError::NoSuchAccessKey(_) => S3ErrorCode::InvalidAccessKeyId,
        RgwError::UserExists(_) | RgwError::Invalid(_) => S3ErrorCode::InvalidArgument,
        RgwError::NoSuchBucket(_) => S3ErrorCode::NoSuchBucket,
        RgwError::BucketExists(_) => S3ErrorCode::BucketAlreadyExists,
        RgwError::BucketOwnedByYou(_) => S3ErrorCode::BucketAlreadyOwnedByYou,
        RgwError::BucketNotEmpty(_) => S3ErrorCode::BucketNotEmpty,
        RgwError::NoSuchKey(_) => S3ErrorCode::NoSuchKey,
        RgwError::NoSuchUpload(_) => S3ErrorCode::NoSuchUpload,
        RgwError::InvalidPart(_) => S3ErrorCode::InvalidPart,
        RgwError::InvalidPartOrder => S3ErrorCode::InvalidPartOrder,
        RgwError::EntityTooSmall { .. } => S3ErrorCode::EntityTooSmall,
        RgwError::EntityTooLarge(_) => S3ErrorCode::EntityTooLarge,
        RgwError::PreconditionFailed(_) => S3ErrorCode::PreconditionFailed,
        RgwError::InvalidBucketName { .. } => S3ErrorCode::InvalidBucketName,
        RgwError::AccessDenied(_) => S3ErrorCode::AccessDenied,
        RgwError::Busy(_) => S3ErrorCode::SlowDown,
        RgwError::Body(_) => S3ErrorCode::IncompleteBody,
        RgwError::Rados(C::Full(_)) => {
            return S3Error::with_message(
                S3ErrorCode::Custom("InsufficientCapacity".into()),
                format!("the cluster is full: {msg}"),
            )
            .with_status(507);
        }
        RgwError::Rados(C::Timeout { .. }) => S3ErrorCode::ServiceUnavailable,
        RgwError::Corrupt { .. } | RgwError::Internal(_) | RgwError::Rados(_) => {
            S3ErrorCode::InternalError
        }
    };
    S3Error::with_message(code, msg)
}

trait StatusExt {
    fn with_status(self, code: u16) -> Self;
}
impl StatusExt for S3Error {
    fn with_status(mut self, code: u16) -> Self {
        if let Ok(s) = hyper::StatusCode::from_u16(code) {
            self.set_status_code(s);
        }
        self
    }
}

/// Looks access keys up in the metadata pool (cached briefly).
/// access key → (when looked up, uid, secret)
type KeyCache = std::sync::Arc<Mutex<HashMap<String, (Instant, String, String)>>>;

#[derive(Clone)]
pub struct KelpAuth {
    rgw: Rgw,
    cache: KeyCache,
}

impl KelpAuth {
    pub fn new(rgw: Rgw) -> KelpAuth {
        KelpAuth {
            rgw,
            cache: Default::default(),
        }
    }

    /// (uid, secret) of an access key.
    async fn lookup(&self, access_key: &str) -> S3Result<(String, String)> {
        if let Some((at, uid, secret)) = self.cache.lock().unwrap().get(access_key)
            && at.elapsed() < KEY_CACHE_TTL
        {
            return Ok((uid.clone(), secret.clone()));
        }
        let (uid, secret) = self.rgw.secret_for(access_key).await.map_err(s3_err)?;
        let mut cache = self.cache.lock().unwrap();
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(
            access_key.to_string(),
            (Instant::now(), uid.clone(), secret.clone()),
        );
        Ok((uid, secret))
    }
}

#[async_trait::async_trait]
impl S3Auth for KelpAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        Ok(SecretKey::from(self.lookup(access_key).await?.1))
    }
}

/// The S3 service.
pub struct KelpS3 {
    rgw: Rgw,
    auth: KelpAuth,
}

impl KelpS3 {
    pub fn new(rgw: Rgw, auth: KelpAuth) -> KelpS3 {
        KelpS3 { rgw, auth }
    }

    async fn caller(&self, creds: &Option<Credentials>) -> S3Result<String> {
        match creds {
            Some(c) => Ok(self.auth.lookup(&c.access_key).await?.0),
            None => Err(s3_error!(AccessDenied, "anonymous access is not allowed")),
        }
    }

    /// The bucket, if the caller owns it.
    async fn owned(&self, creds: &Option<Credentials>, bucket: &str) -> S3Result<BucketRecord> {
        let uid = self.caller(creds).await?;
        let b = self.rgw.bucket_cached(bucket).await.map_err(s3_err)?;
        if b.owner != uid {
            return Err(s3_error!(
                AccessDenied,
                "bucket '{bucket}' belongs to another user"
            ));
        }
        Ok(b)
    }

    async fn owner(&self, uid: &str) -> Owner {
        let display = self
            .rgw
            .user(uid)
            .await
            .map(|u| u.display_name)
            .unwrap_or_default();
        Owner {
            id: Some(uid.to_string()),
            display_name: Some(display),
        }
    }

    /// Writes `body` as a new instance of `key` (not yet referenced) and returns it.
    async fn write_body(
        &self,
        b: &BucketRecord,
        key: &str,
        body: Option<StreamingBlob>,
        expect_len: Option<i64>,
        checks: &mut BodyChecks,
        meta: Option<ObjectMeta>,
    ) -> S3Result<(IndexEntry, PendingEntry)> {
        if let Some(len) = expect_len
            && len as u64 > MAX_PUT_SIZE
        {
            return Err(s3_error!(
                EntityTooLarge,
                "{len} bytes is more than the 5 GiB a single upload may carry"
            ));
        }
        let inst = self.rgw.new_instance(b);
        let pending = self.rgw.begin_write(b, key, &inst).await.map_err(s3_err)?;
        let result = async {
            let mut w = InstanceWriter::new(&self.rgw, &inst);
            if let Some(mut body) = body {
                while let Some(chunk) = body.next().await {
                    let chunk = chunk.map_err(|e| {
                        s3_error!(IncompleteBody, "the request body could not be read: {e}")
                    })?;
                    checks.update(&chunk);
                    w.push(chunk).await.map_err(s3_err)?;
                    if w.size() > MAX_PUT_SIZE {
                        return Err(s3_error!(EntityTooLarge, "more than 5 GiB in one upload"));
                    }
                }
            }
            if let Some(len) = expect_len
                && w.size() != len as u64
            {
                return Err(s3_error!(
                    IncompleteBody,
                    "the body has {} bytes but Content-Length said {len}",
                    w.size()
                ));
            }
            let mtime = now_ns();
            let written = w
                .finish(|wr| {
                    meta.map(|mut m| {
                        m.size = wr.size;
                        m.etag = hex::encode(wr.md5);
                        m.mtime_ns = mtime;
                        m.key = key.to_string();
                        m
                    })
                })
                .await
                .map_err(s3_err)?;
            checks.verify(&written.md5)?;
            Ok(IndexEntry {
                inst: inst.clone(),
                size: written.size,
                etag: hex::encode(written.md5),
                mtime_ns: mtime,
                ..Default::default()
            })
        }
        .await;
        match result {
            Ok(e) => Ok((e, pending)),
            Err(err) => {
                self.abandon(b, key, &inst, &pending);
                Err(err)
            }
        }
    }

    /// Writes `body` and makes it the object `key` (if `cond` holds).
    #[allow(clippy::too_many_arguments)]
    async fn store_object(
        &self,
        b: &BucketRecord,
        key: &str,
        body: Option<StreamingBlob>,
        expect_len: Option<i64>,
        checks: &mut BodyChecks,
        meta: ObjectMeta,
        cond: &WriteCondition,
    ) -> S3Result<(IndexEntry, Option<String>)> {
        let (entry, pending) = self
            .write_body(b, key, body, expect_len, checks, Some(meta))
            .await?;
        match self.rgw.commit_object(b, key, &entry, &pending, cond).await {
            Ok(made) => Ok((entry, made.version_id)),
            Err(e) => {
                self.abandon(b, key, &entry.inst, &pending);
                Err(s3_err(e))
            }
        }
    }

    /// Writes `body` as part `part` of a multipart upload.
    #[allow(clippy::too_many_arguments)]
    async fn store_part(
        &self,
        b: &BucketRecord,
        key: &str,
        upload_id: &str,
        part: i32,
        body: Option<StreamingBlob>,
        expect_len: Option<i64>,
        checks: &mut BodyChecks,
    ) -> S3Result<PartEntry> {
        let (entry, pending) = self
            .write_body(b, key, body, expect_len, checks, None)
            .await?;
        let p = PartEntry {
            inst: entry.inst.clone(),
            size: entry.size,
            etag: entry.etag.clone(),
            mtime_ns: entry.mtime_ns,
            checksums: checks
                .computed
                .as_ref()
                .map(checksum_map)
                .unwrap_or_default(),
        };
        if let Err(e) = self
            .rgw
            .commit_part(b, key, upload_id, part, &p, &pending)
            .await
        {
            self.abandon(b, key, &entry.inst, &pending);
            return Err(s3_err(e));
        }
        Ok(p)
    }

    /// Drops an instance that will not be committed (in the background; the pending entry
    /// still covers it if this fails).
    fn abandon(&self, b: &BucketRecord, key: &str, inst: &str, pending: &PendingEntry) {
        let rgw = self.rgw.clone();
        let (b, key, inst, pending) = (
            b.clone(),
            key.to_string(),
            inst.to_string(),
            pending.clone(),
        );
        tokio::spawn(async move {
            let _ = rgw.abandon_instance(&b, &key, &inst, &pending).await;
        });
    }

    /// Resolves a copy source the caller may read: (bucket, entry, meta).
    async fn copy_source(
        &self,
        creds: &Option<Credentials>,
        src: &CopySource,
    ) -> S3Result<(BucketRecord, String, IndexEntry)> {
        let (bucket, key, version) = match src {
            CopySource::Bucket {
                bucket,
                key,
                version_id,
            } => (bucket, key, version_id),
            _ => {
                return Err(s3_error!(
                    NotImplemented,
                    "access point copy sources are not supported"
                ));
            }
        };
        let (b, who) = self.requester_bucket(creds, bucket).await?;
        let version = version.as_deref().map(str::to_string);
        let e = self.current(&b, key, &version).await;
        let e = self.may_read(&b, &who, e).await?;
        Ok((b, key.to_string(), e))
    }

    /// The index entry of `key`: its current object, or the given version (`NoSuchKey`,
    /// `NoSuchVersion`, and `MethodNotAllowed` for a delete marker, as S3 answers).
    async fn current(
        &self,
        b: &BucketRecord,
        key: &str,
        version: &Option<String>,
    ) -> S3Result<IndexEntry> {
        let Some(v) = version.as_deref() else {
            return self
                .rgw
                .lookup(b, key)
                .await
                .map_err(s3_err)?
                .ok_or_else(|| s3_error!(NoSuchKey, "no such key '{key}'"));
        };
        if !valid_version_id(v) {
            return Err(s3_error!(InvalidArgument, "invalid version id '{v}'"));
        }
        match self.rgw.lookup_version(b, key, v).await.map_err(s3_err)? {
            Some(e) if e.dm => Err(s3_error!(
                MethodNotAllowed,
                "version '{v}' of '{key}' is a delete marker"
            )),
            Some(e) => Ok(e),
            None => Err(s3_error!(NoSuchVersion, "'{key}' has no version '{v}'")),
        }
    }

    /// Streams bytes `[start, end)` of an existing instance into `checks`/a new body.
    fn stream_instance(
        &self,
        e: &IndexEntry,
        meta: &ObjectMeta,
        start: u64,
        end: u64,
    ) -> StreamingBlob {
        let body = self.rgw.read_body(&e.inst, meta, start, end, Bytes::new());
        StreamingBlob::wrap(body)
    }
}

/// The version id S3 shows for `e` in bucket `b` (none where versioning was never enabled).
fn shown_version(b: &BucketRecord, e: &IndexEntry) -> Option<String> {
    (b.versioning.is_some() || e.ver.is_some()).then(|| e.version_id().to_string())
}

/// Deletes `key` (or one version of it) as DeleteObject does; returns the version id to show
/// and whether a delete marker was made or removed.
async fn delete_one(
    rgw: &Rgw,
    b: &BucketRecord,
    key: &str,
    version: Option<&str>,
    if_match: Option<&str>,
) -> S3Result<(Option<String>, bool)> {
    match version {
        Some(v) => {
            if !valid_version_id(v) {
                return Err(s3_error!(InvalidArgument, "invalid version id '{v}'"));
            }
            if v != NULL_VERSION && b.versioning.is_none() {
                return Err(s3_error!(
                    InvalidArgument,
                    "invalid version id '{v}': versioning was never enabled on '{}'",
                    b.name
                ));
            }
            // deleting a version that does not exist succeeds, as on S3
            let gone = rgw.delete_version(b, key, v).await.map_err(s3_err)?;
            Ok((Some(v.to_string()), gone.is_some_and(|e| e.dm)))
        }
        None => {
            let made = rgw.delete_object(b, key, if_match).await.map_err(s3_err)?;
            let dm = b.versioning.is_some();
            Ok((made.version_id, dm))
        }
    }
}

/// A lifecycle rule from its S3 form (transitions: NotImplemented, there are no other
/// storage classes).
fn rule_from_dto(r: LifecycleRule) -> S3Result<lifecycle::Rule> {
    if r.transitions.as_ref().is_some_and(|t| !t.is_empty())
        || r.noncurrent_version_transitions
            .as_ref()
            .is_some_and(|t| !t.is_empty())
    {
        return Err(s3_error!(
            NotImplemented,
            "lifecycle transitions are not supported (Kelp has one storage class)"
        ));
    }
    let days = |d: Option<i32>, what: &str| -> S3Result<Option<u32>> {
        match d {
            None => Ok(None),
            Some(n) if n > 0 => Ok(Some(n as u32)),
            Some(_) => Err(s3_error!(
                InvalidArgument,
                "'{what}' must be a positive integer"
            )),
        }
    };
    let size = |v: Option<i64>, what: &str| -> S3Result<Option<u64>> {
        match v {
            Some(n) if n < 0 => Err(s3_error!(
                InvalidArgument,
                "'{what}' must be a non-negative integer"
            )),
            v => Ok(v.map(|n| n as u64)),
        }
    };
    let enabled = match r.status.as_str() {
        ExpirationStatus::ENABLED => true,
        ExpirationStatus::DISABLED => false,
        other => {
            return Err(s3_error!(
                MalformedXML,
                "a rule's Status is Enabled or Disabled, not '{other}'"
            ));
        }
    };
    if r.prefix.is_some() && r.filter.is_some() {
        return Err(s3_error!(
            MalformedXML,
            "a rule has a Filter or (the older form) a Prefix, not both"
        ));
    }
    if let Some(f) = &r.filter {
        // a Filter holds exactly one condition; several are combined with And
        let conditions = [
            f.prefix.is_some(),
            f.tag.is_some(),
            f.and.is_some(),
            f.object_size_greater_than.is_some(),
            f.object_size_less_than.is_some(),
        ];
        if conditions.iter().filter(|c| **c).count() > 1 {
            return Err(s3_error!(
                MalformedXML,
                "a Filter holds one of Prefix, Tag, ObjectSizeGreaterThan, ObjectSizeLessThan or And"
            ));
        }
    }
    let mut out = lifecycle::Rule {
        id: r.id.unwrap_or_default(),
        enabled,
        prefix: r.prefix.unwrap_or_default(),
        ..Default::default()
    };
    if let Some(f) = r.filter {
        if let Some(p) = f.prefix {
            out.prefix = p;
        }
        if let Some(t) = f.tag {
            out.tags
                .insert(t.key.unwrap_or_default(), t.value.unwrap_or_default());
        }
        out.size_greater_than = size(f.object_size_greater_than, "ObjectSizeGreaterThan")?;
        out.size_less_than = size(f.object_size_less_than, "ObjectSizeLessThan")?;
        if let Some(a) = f.and {
            if let Some(p) = a.prefix {
                out.prefix = p;
            }
            for t in a.tags.unwrap_or_default() {
                out.tags
                    .insert(t.key.unwrap_or_default(), t.value.unwrap_or_default());
            }
            out.size_greater_than = size(a.object_size_greater_than, "ObjectSizeGreaterThan")?;
            out.size_less_than = size(a.object_size_less_than, "ObjectSizeLessThan")?;
        }
    }
    if let (Some(gt), Some(lt)) = (out.size_greater_than, out.size_less_than)
        && gt >= lt
    {
        return Err(s3_error!(
            InvalidArgument,
            "ObjectSizeGreaterThan must be less than ObjectSizeLessThan"
        ));
    }
    if let Some(e) = r.expiration {
        if e.expired_object_delete_marker.is_some() && (e.days.is_some() || e.date.is_some()) {
            return Err(s3_error!(
                MalformedXML,
                "ExpiredObjectDeleteMarker cannot be specified with Days or Date in a Lifecycle Expiration Policy"
            ));
        }
        if e.expired_object_delete_marker == Some(true) && !out.tags.is_empty() {
            return Err(s3_error!(
                InvalidRequest,
                "ExpiredObjectDeleteMarker cannot be specified with a tag filter"
            ));
        }
        if let Some(d) = &e.date {
            let t: time::OffsetDateTime = d.clone().into();
            if t.unix_timestamp() % 86_400 != 0 || t.nanosecond() != 0 {
                return Err(s3_error!(InvalidArgument, "'Date' must be at midnight GMT"));
            }
        }
        out.expiration_days = days(e.days, "Days")?;
        out.expiration_date_ns = e.date.map(|d| {
            let t: time::OffsetDateTime = d.into();
            (t.unix_timestamp_nanos().max(0)) as u64
        });
        out.expired_object_delete_marker = e.expired_object_delete_marker.unwrap_or(false);
    }
    if let Some(n) = r.noncurrent_version_expiration {
        if n.noncurrent_days.is_none() {
            return Err(s3_error!(
                InvalidArgument,
                "NoncurrentVersionExpiration needs NoncurrentDays"
            ));
        }
        if n.newer_noncurrent_versions
            .is_some_and(|v| !(1..=100).contains(&v))
        {
            return Err(s3_error!(
                InvalidArgument,
                "NewerNoncurrentVersions must be 1 to 100"
            ));
        }
        out.noncurrent_days = days(n.noncurrent_days, "NoncurrentDays")?;
        out.newer_noncurrent_versions = n.newer_noncurrent_versions.map(|v| v.max(0) as u32);
    }
    if let Some(a) = r.abort_incomplete_multipart_upload {
        if !out.tags.is_empty() {
            return Err(s3_error!(
                InvalidRequest,
                "AbortIncompleteMultipartUpload cannot be specified with a tag filter"
            ));
        }
        out.abort_multipart_days = days(a.days_after_initiation, "DaysAfterInitiation")?;
    }
    Ok(out)
}

fn rule_to_dto(r: &lifecycle::Rule) -> LifecycleRule {
    let tags: Vec<Tag> = tag_set(&r.tags);
    let conditions = usize::from(!r.prefix.is_empty())
        + tags.len()
        + usize::from(r.size_greater_than.is_some())
        + usize::from(r.size_less_than.is_some());
    let filter = if conditions > 1 {
        LifecycleRuleFilter {
            and: Some(LifecycleRuleAndOperator {
                prefix: Some(r.prefix.clone()),
                tags: Some(tags),
                object_size_greater_than: r.size_greater_than.map(|v| v as i64),
                object_size_less_than: r.size_less_than.map(|v| v as i64),
            }),
            ..Default::default()
        }
    } else {
        LifecycleRuleFilter {
            // the one condition, or an empty prefix (every key) when there is none
            prefix: (conditions == 0 || !r.prefix.is_empty()).then(|| r.prefix.clone()),
            tag: tags.into_iter().next(),
            object_size_greater_than: r.size_greater_than.map(|v| v as i64),
            object_size_less_than: r.size_less_than.map(|v| v as i64),
            ..Default::default()
        }
    };
    let expiration = (r.expiration_days.is_some()
        || r.expiration_date_ns.is_some()
        || r.expired_object_delete_marker)
        .then(|| LifecycleExpiration {
            days: r.expiration_days.map(|d| d as i32),
            date: r.expiration_date_ns.map(ts),
            expired_object_delete_marker: r.expired_object_delete_marker.then_some(true),
        });
    LifecycleRule {
        id: (!r.id.is_empty()).then(|| r.id.clone()),
        status: ExpirationStatus::from_static(if r.enabled {
            ExpirationStatus::ENABLED
        } else {
            ExpirationStatus::DISABLED
        }),
        filter: Some(filter),
        expiration,
        noncurrent_version_expiration: r.noncurrent_days.map(|d| NoncurrentVersionExpiration {
            noncurrent_days: Some(d as i32),
            newer_noncurrent_versions: r.newer_noncurrent_versions.map(|n| n as i32),
        }),
        abort_incomplete_multipart_upload: r.abort_multipart_days.map(|d| {
            AbortIncompleteMultipartUpload {
                days_after_initiation: Some(d as i32),
            }
        }),
        noncurrent_version_transitions: None,
        prefix: None,
        transitions: None,
    }
}

fn ts(ns: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_nanos(ns))
}

/// Seconds, as HTTP dates carry them.
fn secs(t: &Timestamp) -> i64 {
    let t: time::OffsetDateTime = t.clone().into();
    t.unix_timestamp()
}

fn etag(e: &str) -> ETag {
    ETag::Strong(e.to_string())
}

fn etag_matches(cond: &ETagCondition, current: &str) -> bool {
    match cond {
        ETagCondition::Any => true,
        ETagCondition::ETag(t) => t.value() == current,
    }
}

/// GET/HEAD preconditions in RFC 7232 order.
fn check_read_conditions(
    e: &IndexEntry,
    if_match: &Option<ETagCondition>,
    if_none_match: &Option<ETagCondition>,
    if_modified_since: &Option<Timestamp>,
    if_unmodified_since: &Option<Timestamp>,
) -> S3Result<()> {
    let mtime = (e.mtime_ns / 1_000_000_000) as i64;
    if let Some(c) = if_match {
        if !etag_matches(c, &e.etag) {
            return Err(s3_error!(PreconditionFailed, "If-Match does not hold"));
        }
    } else if let Some(t) = if_unmodified_since
        && mtime > secs(t)
    {
        return Err(s3_error!(
            PreconditionFailed,
            "modified since If-Unmodified-Since"
        ));
    }
    if let Some(c) = if_none_match {
        if etag_matches(c, &e.etag) {
            return Err(s3_error!(NotModified));
        }
    } else if let Some(t) = if_modified_since
        && mtime <= secs(t)
    {
        return Err(s3_error!(NotModified));
    }
    Ok(())
}

/// x-amz-copy-source-if-* (failures are 412 for every one of them).
fn check_copy_conditions(
    e: &IndexEntry,
    if_match: &Option<ETagCondition>,
    if_none_match: &Option<ETagCondition>,
    if_modified_since: &Option<Timestamp>,
    if_unmodified_since: &Option<Timestamp>,
) -> S3Result<()> {
    check_read_conditions(
        e,
        if_match,
        if_none_match,
        if_modified_since,
        if_unmodified_since,
    )
    .map_err(|err| {
        if *err.code() == S3ErrorCode::NotModified {
            s3_error!(PreconditionFailed, "copy source precondition does not hold")
        } else {
            err
        }
    })
}

fn bad_part_number(msg: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::Custom("InvalidPartNumber".into()),
        msg.to_string(),
    )
    .with_status(416)
}

fn check_key(key: &str) -> S3Result<()> {
    if key.is_empty() || key.len() > 1024 {
        return Err(s3_error!(
            KeyTooLongError,
            "object keys are 1 to 1024 bytes"
        ));
    }
    Ok(())
}

/// The checksums of `c` by algorithm (`crc32` → base64 value), as a part keeps them.
fn checksum_map(c: &Checksum) -> BTreeMap<String, String> {
    [
        ("crc32", &c.checksum_crc32),
        ("crc32c", &c.checksum_crc32c),
        ("sha1", &c.checksum_sha1),
        ("sha256", &c.checksum_sha256),
        ("crc64nvme", &c.checksum_crc64nvme),
    ]
    .into_iter()
    .filter_map(|(a, v)| v.clone().map(|v| (a.to_string(), v)))
    .collect()
}

/// The destination conditions of a write from its `If-Match` / `If-None-Match` headers
/// (other forms of `If-None-Match` were refused before: `crate::unsupported`).
fn write_condition(if_match: Option<String>, if_none_match: Option<&str>) -> WriteCondition {
    WriteCondition {
        if_absent: if_none_match.is_some_and(|v| v.trim() == "*"),
        if_etag: if_match.map(|v| v.trim().trim_matches('"').to_string()),
    }
}

/// Content-MD5 and x-amz-checksum-* verification of an uploaded body.
struct BodyChecks {
    content_md5: Option<String>,
    hasher: s3s::checksum::ChecksumHasher,
    expected: Checksum,
    trailers: Option<s3s::TrailingHeaders>,
    /// The checksum `x-amz-trailer` promised (lowercase header name): it must arrive.
    declared_trailer: Option<String>,
    computed: Option<Checksum>,
}

impl BodyChecks {
    #[allow(clippy::too_many_arguments)]
    fn new(
        content_md5: Option<String>,
        algorithm: Option<&ChecksumAlgorithm>,
        crc32: Option<String>,
        crc32c: Option<String>,
        sha1: Option<String>,
        sha256: Option<String>,
        crc64nvme: Option<String>,
        trailers: Option<s3s::TrailingHeaders>,
    ) -> S3Result<BodyChecks> {
        let mut hasher = s3s::checksum::ChecksumHasher::default();
        let alg = algorithm.map(|a| a.as_str().to_ascii_uppercase());
        if crc32.is_some() || alg.as_deref() == Some("CRC32") {
            hasher.crc32 = Some(Default::default());
        }
        if crc32c.is_some() || alg.as_deref() == Some("CRC32C") {
            hasher.crc32c = Some(Default::default());
        }
        if sha1.is_some() || alg.as_deref() == Some("SHA1") {
            hasher.sha1 = Some(Default::default());
        }
        if sha256.is_some() || alg.as_deref() == Some("SHA256") {
            hasher.sha256 = Some(Default::default());
        }
        if crc64nvme.is_some() || alg.as_deref() == Some("CRC64NVME") {
            hasher.crc64nvme = Some(Default::default());
        }
        if let Some(a) = alg.as_deref()
            && !["CRC32", "CRC32C", "SHA1", "SHA256", "CRC64NVME"].contains(&a)
        {
            return Err(s3_error!(InvalidArgument, "unknown checksum algorithm {a}"));
        }
        Ok(BodyChecks {
            content_md5,
            hasher,
            expected: Checksum {
                checksum_crc32: crc32,
                checksum_crc32c: crc32c,
                checksum_sha1: sha1,
                checksum_sha256: sha256,
                checksum_crc64nvme: crc64nvme,
                ..Default::default()
            },
            trailers,
            declared_trailer: None,
            computed: None,
        })
    }

    /// Requires the trailer `x-amz-trailer` names (if any) to arrive with the body, so that
    /// a checksum promised is never skipped because it did not come.
    fn declared_trailer(mut self, headers: &hyper::HeaderMap) -> BodyChecks {
        self.declared_trailer = headers
            .get("x-amz-trailer")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase());
        match self.declared_trailer.as_deref() {
            Some("x-amz-checksum-crc32") => self.hasher.crc32 = Some(Default::default()),
            Some("x-amz-checksum-crc32c") => self.hasher.crc32c = Some(Default::default()),
            Some("x-amz-checksum-sha1") => self.hasher.sha1 = Some(Default::default()),
            Some("x-amz-checksum-sha256") => self.hasher.sha256 = Some(Default::default()),
            Some("x-amz-checksum-crc64nvme") => self.hasher.crc64nvme = Some(Default::default()),
            // anything else was refused before the body was read (crate::unsupported)
            _ => {}
        }
        self
    }

    fn none() -> BodyChecks {
        BodyChecks::new(None, None, None, None, None, None, None, None).expect("no checks")
    }

    fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
    }

    fn verify(&mut self, md5: &[u8; 16]) -> S3Result<()> {
        if let Some(want) = &self.content_md5 {
            use base64::Engine;
            let want = base64::engine::general_purpose::STANDARD
                .decode(want)
                .map_err(|_| s3_error!(InvalidDigest, "Content-MD5 is not base64"))?;
            if want.as_slice() != md5 {
                return Err(s3_error!(BadDigest, "the body does not match Content-MD5"));
            }
        }
        let hasher = std::mem::take(&mut self.hasher);
        let mut exp = self.expected.clone();
        let trailers = self.trailers.take().and_then(|t| t.take());
        if let Some(name) = &self.declared_trailer {
            let value = trailers
                .as_ref()
                .and_then(|t| t.get(name.as_str()))
                .and_then(|v| v.to_str().ok());
            if value.is_none() {
                return Err(S3Error::with_message(
                    S3ErrorCode::Custom("MalformedTrailerError".into()),
                    format!("x-amz-trailer names {name} but the body carried no such trailer"),
                )
                .with_status(400));
            }
        }
        let got = hasher.finalize();
        if let Some(t) = trailers {
            let get = |name: &str| {
                t.get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            exp.checksum_crc32 = exp.checksum_crc32.or(get("x-amz-checksum-crc32"));
            exp.checksum_crc32c = exp.checksum_crc32c.or(get("x-amz-checksum-crc32c"));
            exp.checksum_sha1 = exp.checksum_sha1.or(get("x-amz-checksum-sha1"));
            exp.checksum_sha256 = exp.checksum_sha256.or(get("x-amz-checksum-sha256"));
            exp.checksum_crc64nvme = exp.checksum_crc64nvme.or(get("x-amz-checksum-crc64nvme"));
        }
        let pairs = [
            ("CRC32", &exp.checksum_crc32, &got.checksum_crc32),
            ("CRC32C", &exp.checksum_crc32c, &got.checksum_crc32c),
            ("SHA1", &exp.checksum_sha1, &got.checksum_sha1),
            ("SHA256", &exp.checksum_sha256, &got.checksum_sha256),
            (
                "CRC64NVME",
                &exp.checksum_crc64nvme,
                &got.checksum_crc64nvme,
            ),
        ];
        for (name, want, have) in pairs {
            if want.is_some() && have.is_none() {
                // a trailer for an algorithm nobody declared: nothing computed it
                return Err(s3_error!(
                    InvalidRequest,
                    "the body carried a {name} checksum that x-amz-trailer did not declare"
                ));
            }
            if let (Some(w), Some(h)) = (want, have)
                && w != h
            {
                return Err(s3_error!(
                    BadDigest,
                    "the body's {name} checksum is {h}, not {w}"
                ));
            }
        }
        self.computed = Some(got);
        Ok(())
    }
}

/// Keys in listings, percent-encoded when the client asked for `EncodingType=url`.
struct Enc(bool);
impl Enc {
    fn new(t: &Option<EncodingType>) -> Enc {
        Enc(t
            .as_ref()
            .is_some_and(|t| t.as_str().eq_ignore_ascii_case("url")))
    }
    fn s(&self, v: &str) -> String {
        if !self.0 {
            return v.to_string();
        }
        const KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
            .remove(b'-')
            .remove(b'_')
            .remove(b'.')
            .remove(b'~')
            .remove(b'/');
        percent_encoding::utf8_percent_encode(v, KEEP).to_string()
    }
    fn o(&self, v: &Option<String>) -> Option<String> {
        v.as_ref().map(|v| self.s(v))
    }
}

fn meta_from_headers(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    expires: Option<Timestamp>,
    metadata: Option<Metadata>,
) -> S3Result<ObjectMeta> {
    let user: BTreeMap<String, String> = metadata.unwrap_or_default().into_iter().collect();
    let user_bytes: usize = user.iter().map(|(k, v)| k.len() + v.len()).sum();
    if user_bytes > 2048 {
        return Err(s3_error!(
            MetadataTooLarge,
            "user metadata is limited to 2 KiB"
        ));
    }
    let expires = match expires {
        Some(t) => {
            let mut buf = Vec::new();
            t.format(TimestampFormat::HttpDate, &mut buf)
                .map_err(|_| s3_error!(InvalidArgument, "bad Expires"))?;
            Some(String::from_utf8_lossy(&buf).into_owned())
        }
        None => None,
    };
    Ok(ObjectMeta {
        content_type,
        content_encoding,
        content_disposition,
        content_language,
        cache_control,
        expires,
        user,
        ..ObjectMeta::default()
    })
}

fn expires_ts(m: &ObjectMeta) -> Option<Timestamp> {
    m.expires
        .as_deref()
        .and_then(|s| Timestamp::parse(TimestampFormat::HttpDate, s).ok())
}

fn user_meta(m: &ObjectMeta) -> Option<Metadata> {
    if m.user.is_empty() {
        None
    } else {
        Some(m.user.clone().into_iter().collect())
    }
}

/// Tags from an `x-amz-tagging` header (`k1=v1&k2=v2`, URL-encoded).
fn tags_from_header(h: Option<&str>) -> S3Result<BTreeMap<String, String>> {
    let mut tags = BTreeMap::new();
    let Some(h) = h.filter(|h| !h.is_empty()) else {
        return Ok(tags);
    };
    let dec = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| s3_error!(InvalidTag, "x-amz-tagging is not valid UTF-8"))
    };
    for pair in h.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if tags.insert(dec(k)?, dec(v)?).is_some() {
            return Err(s3_error!(InvalidTag, "a tag key appears twice"));
        }
    }
    check_tags(&tags, 10).map_err(|m| s3_error!(InvalidTag, "{m}"))?;
    Ok(tags)
}

fn tags_from_set(set: Vec<Tag>, max: usize) -> S3Result<BTreeMap<String, String>> {
    let mut tags = BTreeMap::new();
    for t in set {
        let k = t.key.unwrap_or_default();
        if tags
            .insert(k.clone(), t.value.unwrap_or_default())
            .is_some()
        {
            return Err(s3_error!(InvalidTag, "tag key '{k}' appears twice"));
        }
    }
    check_tags(&tags, max).map_err(|m| s3_error!(InvalidTag, "{m}"))?;
    Ok(tags)
}

fn tag_set(tags: &BTreeMap<String, String>) -> Vec<Tag> {
    tags.iter()
        .map(|(k, v)| Tag {
            key: Some(k.clone()),
            value: Some(v.clone()),
        })
        .collect()
}

fn tag_count(m: &ObjectMeta) -> Option<i32> {
    (!m.tags.is_empty()).then_some(m.tags.len() as i32)
}

fn max_keys(v: Option<i32>) -> S3Result<usize> {
    match v {
        None => Ok(1000),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok((n as usize).min(1000)),
    }
}

fn token_encode(marker: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(marker)
}

fn token_decode(token: &str) -> S3Result<String> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|v| String::from_utf8(v).ok())
        .ok_or_else(|| s3_error!(InvalidArgument, "the continuation token is not valid"))
}

/// Bytes `[first, last]` of a `bytes=first-last` copy-source range.
fn parse_copy_range(r: &str, size: u64) -> S3Result<(u64, u64)> {
    let bad = || {
        s3_error!(
            InvalidArgument,
            "x-amz-copy-source-range must look like bytes=first-last"
        )
    };
    let spec = r.strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if a > b || b >= size {
        return Err(s3_error!(
            InvalidRange,
            "range {a}-{b} is outside the {size}-byte source"
        ));
    }
    Ok((a, b + 1))
}

#[async_trait::async_trait]
impl S3 for KelpS3 {
    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let uid = self.caller(&req.credentials).await?;
        let prefix = req.input.prefix.clone().unwrap_or_default();
        let buckets = self
            .rgw
            .user_buckets(&uid)
            .await
            .map_err(s3_err)?
            .into_iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .map(|(name, created)| Bucket {
                name: Some(name),
                creation_date: Some(ts(created)),
                bucket_region: None,
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(self.owner(&uid).await),
            prefix: req.input.prefix,
            continuation_token: None,
        }))
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let uid = self.caller(&req.credentials).await?;
        let input = req.input;
        let acl = bucket_acl(input.acl.as_ref())?;
        let location = input
            .create_bucket_configuration
            .and_then(|c| c.location_constraint)
            .map(|l| l.as_str().to_string())
            .unwrap_or_default();
        let b = self
            .rgw
            .create_bucket(&uid, &input.bucket, None, &location, acl)
            .await
            .map_err(s3_err)?;
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{}", b.name)),
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Read)
            .await?;
        Ok(S3Response::new(HeadBucketOutput {
            bucket_region: Some(if b.location.is_empty() {
                "us-east-1".into()
            } else {
                b.location
            }),
            ..Default::default()
        }))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        self.rgw.delete_bucket(&b, false).await.map_err(s3_err)?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint: (!b.location.is_empty())
                .then(|| BucketLocationConstraint::from(b.location.clone())),
        }))
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        // never enabled: no Status element, as AWS answers
        Ok(S3Response::new(GetBucketVersioningOutput {
            status: b.versioning.map(|v| {
                BucketVersioningStatus::from_static(match v {
                    Versioning::Enabled => BucketVersioningStatus::ENABLED,
                    Versioning::Suspended => BucketVersioningStatus::SUSPENDED,
                })
            }),
            mfa_delete: None,
        }))
    }

    async fn put_bucket_versioning(
        &self,
        req: S3Request<PutBucketVersioningInput>,
    ) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let conf = req.input.versioning_configuration;
        if conf
            .mfa_delete
            .as_ref()
            .is_some_and(|m| m.as_str() == MFADelete::ENABLED)
        {
            return Err(s3_error!(NotImplemented, "MFA delete is not supported"));
        }
        let want = match conf.status.as_ref().map(|s| s.as_str()) {
            Some(BucketVersioningStatus::ENABLED) => Versioning::Enabled,
            Some(BucketVersioningStatus::SUSPENDED) => Versioning::Suspended,
            _ => {
                return Err(s3_error!(
                    MalformedXML,
                    "Status must be Enabled or Suspended"
                ));
            }
        };
        self.rgw
            .update_bucket(&b, |r| r.versioning = Some(want))
            .await
            .map_err(s3_err)?;
        Ok(S3Response::new(PutBucketVersioningOutput::default()))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Write)
            .await?;
        let input = req.input;
        check_key(&input.key)?;
        let acl = object_acl(input.acl.as_ref().map(|a| a.as_str()))?;
        let cond = WriteCondition {
            if_absent: input.if_none_match.as_ref().is_some_and(|c| c.is_any()),
            if_etag: input.if_match.as_ref().map(|c| match c {
                ETagCondition::Any => "*".to_string(),
                ETagCondition::ETag(t) => t.value().to_string(),
            }),
        };
        let mut checks = BodyChecks::new(
            input.content_md5.clone(),
            input.checksum_algorithm.as_ref(),
            input.checksum_crc32.clone(),
            input.checksum_crc32c.clone(),
            input.checksum_sha1.clone(),
            input.checksum_sha256.clone(),
            input.checksum_crc64nvme.clone(),
            req.trailing_headers,
        )?
        .declared_trailer(&req.headers);
        let meta = meta_from_headers(
            input.content_type.clone(),
            input.content_encoding.clone(),
            input.content_disposition.clone(),
            input.content_language.clone(),
            input.cache_control.clone(),
            input.expires.clone(),
            input.metadata.clone(),
        )?;
        let meta = ObjectMeta {
            tags: tags_from_header(input.tagging.as_deref())?,
            acl,
            ..meta
        };
        let (entry, version_id) = self
            .store_object(
                &b,
                &input.key,
                input.body,
                input.content_length,
                &mut checks,
                meta,
                &cond,
            )
            .await?;
        let sums = checks.computed.unwrap_or_default();
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag(&entry.etag)),
            version_id,
            checksum_crc32: sums.checksum_crc32,
            checksum_crc32c: sums.checksum_crc32c,
            checksum_sha1: sums.checksum_sha1,
            checksum_sha256: sums.checksum_sha256,
            checksum_crc64nvme: sums.checksum_crc64nvme,
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let (b, who) = self
            .requester_bucket(&req.credentials, &req.input.bucket)
            .await?;
        let input = req.input;
        let e = self.current(&b, &input.key, &input.version_id).await;
        let e = self.may_read(&b, &who, e).await?;
        check_read_conditions(
            &e,
            &input.if_match,
            &input.if_none_match,
            &input.if_modified_since,
            &input.if_unmodified_since,
        )?;
        // a range within the head stripe is read with the meta in one round trip
        let head_range = match (&input.part_number, &input.range) {
            (None, None) => Some((0, e.size)),
            (None, Some(r)) => r.check(e.size).ok().map(|r| (r.start, r.end)),
            _ => None,
        };
        let (meta_res, first) = match head_range {
            Some((s, t)) if t > s && t <= STRIPE => {
                match self.rgw.read_head(&e.inst, s, t - s).await {
                    Ok((m, d)) => (Ok(m), d),
                    Err(err) => (Err(err), Bytes::new()),
                }
            }
            _ => (self.rgw.read_meta(&e.inst).await, Bytes::new()),
        };
        let meta = match meta_res {
            Ok(m) => m,
            Err(RgwError::Rados(kelp_client::ClientError::NotFound { .. })) => {
                return Err(s3_error!(NoSuchKey, "'{}' was deleted", input.key));
            }
            Err(err) => return Err(s3_err(err)),
        };
        // a multipart head holds no data
        let first = if meta.parts.is_empty() {
            first
        } else {
            Bytes::new()
        };
        let (start, end, partial, parts_count) = match (&input.part_number, &input.range) {
            (Some(_), Some(_)) => {
                return Err(s3_error!(
                    InvalidRequest,
                    "Range and partNumber cannot both be given"
                ));
            }
            (Some(n), None) => {
                let n = *n;
                if meta.parts.is_empty() {
                    if n != 1 {
                        return Err(bad_part_number("the object has one part"));
                    }
                    (0, e.size, false, None)
                } else {
                    let idx = usize::try_from(n - 1)
                        .ok()
                        .filter(|i| *i < meta.parts.len())
                        .ok_or_else(|| bad_part_number(&format!("no part {n}")))?;
                    let start: u64 = meta.parts[..idx].iter().map(|p| p.size).sum();
                    (
                        start,
                        start + meta.parts[idx].size,
                        true,
                        Some(meta.parts.len() as i32),
                    )
                }
            }
            (None, Some(r)) => {
                let r = r.check(e.size).map_err(|_| {
                    s3_error!(
                        InvalidRange,
                        "the range is not satisfiable for {} bytes",
                        e.size
                    )
                })?;
                (r.start, r.end, true, None)
            }
            (None, None) => (0, e.size, false, None),
        };
        let body = self.rgw.read_body(&e.inst, &meta, start, end, first);
        let content_range = partial.then(|| {
            if end > start {
                format!("bytes {start}-{}/{}", end - 1, e.size)
            } else {
                format!("bytes */{}", e.size)
            }
        });
        let out = GetObjectOutput {
            body: Some(StreamingBlob::wrap(body)),
            content_length: Some((end - start) as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            last_modified: Some(ts(e.mtime_ns)),
            e_tag: Some(etag(&e.etag)),
            metadata: user_meta(&meta),
            content_type: meta.content_type.clone(),
            content_encoding: meta.content_encoding.clone(),
            content_disposition: meta.content_disposition.clone(),
            content_language: meta.content_language.clone(),
            cache_control: meta.cache_control.clone(),
            expires: expires_ts(&meta),
            parts_count,
            tag_count: tag_count(&meta),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            version_id: shown_version(&b, &e),
            ..Default::default()
        };
        let mut resp = S3Response::new(out);
        if partial {
            resp.status = Some(hyper::StatusCode::PARTIAL_CONTENT);
        }
        Ok(resp)
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let (b, who) = self
            .requester_bucket(&req.credentials, &req.input.bucket)
            .await?;
        let input = req.input;
        let e = self.current(&b, &input.key, &input.version_id).await;
        let e = self.may_read(&b, &who, e).await?;
        check_read_conditions(
            &e,
            &input.if_match,
            &input.if_none_match,
            &input.if_modified_since,
            &input.if_unmodified_since,
        )?;
        let meta = match self.rgw.read_meta(&e.inst).await {
            Ok(m) => m,
            Err(RgwError::Rados(kelp_client::ClientError::NotFound { .. })) => {
                return Err(s3_error!(NoSuchKey, "'{}' was deleted", input.key));
            }
            Err(err) => return Err(s3_err(err)),
        };
        let (len, range, parts_count) = match (&input.part_number, &input.range) {
            (Some(n), _) if !meta.parts.is_empty() => {
                let idx = usize::try_from(*n - 1)
                    .ok()
                    .filter(|i| *i < meta.parts.len())
                    .ok_or_else(|| bad_part_number(&format!("no part {n}")))?;
                (meta.parts[idx].size, None, Some(meta.parts.len() as i32))
            }
            (_, Some(r)) => {
                let r = r
                    .check(e.size)
                    .map_err(|_| s3_error!(InvalidRange, "the range is not satisfiable"))?;
                (
                    r.end - r.start,
                    Some(format!("bytes {}-{}/{}", r.start, r.end - 1, e.size)),
                    None,
                )
            }
            _ => (e.size, None, None),
        };
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(len as i64),
            content_range: range,
            accept_ranges: Some("bytes".into()),
            last_modified: Some(ts(e.mtime_ns)),
            e_tag: Some(etag(&e.etag)),
            metadata: user_meta(&meta),
            content_type: meta.content_type.clone(),
            content_encoding: meta.content_encoding.clone(),
            content_disposition: meta.content_disposition.clone(),
            content_language: meta.content_language.clone(),
            cache_control: meta.cache_control.clone(),
            expires: expires_ts(&meta),
            parts_count,
            storage_class: None,
            version_id: shown_version(&b, &e),
            ..Default::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Write)
            .await?;
        let input = req.input;
        let if_match = input.if_match.as_ref().map(|c| match c {
            ETagCondition::Any => "*".to_string(),
            ETagCondition::ETag(t) => t.value().to_string(),
        });
        let (version_id, delete_marker) = delete_one(
            &self.rgw,
            &b,
            &input.key,
            input.version_id.as_deref(),
            if_match.as_deref(),
        )
        .await?;
        let mut resp = S3Response::new(DeleteObjectOutput {
            version_id,
            delete_marker: delete_marker.then_some(true),
            ..Default::default()
        });
        resp.status = Some(hyper::StatusCode::NO_CONTENT);
        Ok(resp)
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Write)
            .await?;
        let del = req.input.delete;
        if del.objects.len() > 1000 {
            return Err(s3_error!(MalformedXML, "at most 1000 keys per request"));
        }
        let quiet = del.quiet.unwrap_or(false);
        let rgw = &self.rgw;
        let b = &b;
        type Deleted = (Option<String>, bool);
        let results: Vec<(ObjectIdentifier, Result<Deleted, S3Error>)> =
            futures::stream::iter(del.objects.into_iter().map(|o| async move {
                let r = delete_one(rgw, b, &o.key, o.version_id.as_deref(), None).await;
                (o, r)
            }))
            .buffer_unordered(16)
            .collect()
            .await;
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for (o, r) in results {
            match r {
                Ok((vid, dm)) if !quiet => deleted.push(DeletedObject {
                    key: Some(o.key),
                    // a delete marker made by this request is named by its version id
                    delete_marker_version_id: (dm && o.version_id.is_none())
                        .then(|| vid.clone())
                        .flatten(),
                    delete_marker: dm.then_some(true),
                    version_id: o.version_id,
                }),
                Ok(_) => {}
                Err(e) => errors.push(Error {
                    code: Some(e.code().as_str().to_string()),
                    key: Some(o.key),
                    message: e.message().map(str::to_string),
                    version_id: o.version_id,
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let dst = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Write)
            .await?;
        let input = req.input;
        check_key(&input.key)?;
        let acl = object_acl(input.acl.as_ref().map(|a| a.as_str()))?;
        let (src_b, src_key, src) = self
            .copy_source(&req.credentials, &input.copy_source)
            .await?;
        check_copy_conditions(
            &src,
            &input.copy_source_if_match,
            &input.copy_source_if_none_match,
            &input.copy_source_if_modified_since,
            &input.copy_source_if_unmodified_since,
        )?;
        let src_meta = self.rgw.read_meta(&src.inst).await.map_err(s3_err)?;
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        if src_b.id == dst.id && src_key == input.key && !replace {
            return Err(s3_error!(
                InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes."
            ));
        }
        let mut meta = if replace {
            meta_from_headers(
                input.content_type.clone(),
                input.content_encoding.clone(),
                input.content_disposition.clone(),
                input.content_language.clone(),
                input.cache_control.clone(),
                input.expires.clone(),
                input.metadata.clone(),
            )?
        } else {
            ObjectMeta {
                parts: Vec::new(),
                ..src_meta.clone()
            }
        };
        // an object copy gets the ACL the request names, never the source's (as S3)
        meta.acl = acl;
        meta.tags = if input
            .tagging_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == TaggingDirective::REPLACE)
        {
            tags_from_header(input.tagging.as_deref())?
        } else {
            src_meta.tags.clone()
        };
        let body = self.stream_instance(&src, &src_meta, 0, src.size);
        // x-amz-checksum-algorithm asks for the copy's checksum: computed as it streams
        let mut checks = BodyChecks::new(
            None,
            input.checksum_algorithm.as_ref(),
            None,
            None,
            None,
            None,
            None,
            None,
        )?;
        let header = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
        let cond = write_condition(
            header("if-match").map(str::to_string),
            header("if-none-match"),
        );
        let (entry, version_id) = self
            .store_object(
                &dst,
                &input.key,
                Some(body),
                Some(src.size as i64),
                &mut checks,
                meta,
                &cond,
            )
            .await?;
        let sums = checks.computed.unwrap_or_default();
        Ok(S3Response::new(CopyObjectOutput {
            version_id,
            copy_source_version_id: shown_version(&src_b, &src),
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(&entry.etag)),
                last_modified: Some(ts(entry.mtime_ns)),
                checksum_crc32: sums.checksum_crc32,
                checksum_crc32c: sums.checksum_crc32c,
                checksum_sha1: sums.checksum_sha1,
                checksum_sha256: sums.checksum_sha256,
                checksum_crc64nvme: sums.checksum_crc64nvme,
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Read)
            .await?;
        let input = req.input;
        let enc = Enc::new(&input.encoding_type);
        let max = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let marker = input.marker.clone().unwrap_or_default();
        let listing = if max == 0 {
            Default::default()
        } else {
            self.rgw
                .list_objects(&b, &prefix, &marker, input.delimiter.as_deref(), max)
                .await
                .map_err(s3_err)?
        };
        let owner = self.owner(&b.owner).await;
        let contents = listing
            .objects
            .iter()
            .map(|(k, e)| Object {
                key: Some(enc.s(k)),
                size: Some(e.size as i64),
                e_tag: Some(etag(&e.etag)),
                last_modified: Some(ts(e.mtime_ns)),
                storage_class: Some(ObjectStorageClass::from_static(
                    ObjectStorageClass::STANDARD,
                )),
                owner: Some(owner.clone()),
                ..Default::default()
            })
            .collect();
        let prefixes = listing
            .prefixes
            .iter()
            .map(|p| CommonPrefix {
                prefix: Some(enc.s(p)),
            })
            .collect();
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(b.name.clone()),
            prefix: Some(enc.s(&prefix)),
            marker: Some(enc.s(&marker)),
            max_keys: Some(max as i32),
            is_truncated: Some(listing.truncated),
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            delimiter: enc.o(&input.delimiter),
            next_marker: if listing.truncated {
                enc.o(&listing.last)
            } else {
                None
            },
            encoding_type: input.encoding_type,
            request_charged: None,
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Read)
            .await?;
        let input = req.input;
        let enc = Enc::new(&input.encoding_type);
        let max = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let start = match &input.continuation_token {
            Some(t) => token_decode(t)?,
            None => input.start_after.clone().unwrap_or_default(),
        };
        let listing = if max == 0 {
            Default::default()
        } else {
            self.rgw
                .list_objects(&b, &prefix, &start, input.delimiter.as_deref(), max)
                .await
                .map_err(s3_err)?
        };
        let owner = if input.fetch_owner == Some(true) {
            Some(self.owner(&b.owner).await)
        } else {
            None
        };
        let contents: Vec<Object> = listing
            .objects
            .iter()
            .map(|(k, e)| Object {
                key: Some(enc.s(k)),
                size: Some(e.size as i64),
                e_tag: Some(etag(&e.etag)),
                last_modified: Some(ts(e.mtime_ns)),
                storage_class: Some(ObjectStorageClass::from_static(
                    ObjectStorageClass::STANDARD,
                )),
                owner: owner.clone(),
                ..Default::default()
            })
            .collect();
        let prefixes: Vec<CommonPrefix> = listing
            .prefixes
            .iter()
            .map(|p| CommonPrefix {
                prefix: Some(enc.s(p)),
            })
            .collect();
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(b.name.clone()),
            prefix: Some(enc.s(&prefix)),
            max_keys: Some(max as i32),
            key_count: Some((contents.len() + prefixes.len()) as i32),
            continuation_token: input.continuation_token.clone(),
            is_truncated: Some(listing.truncated),
            next_continuation_token: if listing.truncated {
                listing.last.as_deref().map(token_encode)
            } else {
                None
            },
            contents: Some(contents),
            common_prefixes: Some(prefixes),
            delimiter: enc.o(&input.delimiter),
            encoding_type: input.encoding_type,
            start_after: enc.o(&input.start_after),
            request_charged: None,
        }))
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Read)
            .await?;
        let input = req.input;
        let enc = Enc::new(&input.encoding_type);
        let max = max_keys(input.max_keys)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let marker = input.key_marker.clone().unwrap_or_default();
        let vmarker = input.version_id_marker.clone().unwrap_or_default();
        if !vmarker.is_empty() && (marker.is_empty() || !valid_version_id(&vmarker)) {
            return Err(s3_error!(
                InvalidArgument,
                "version-id-marker needs a key-marker and a valid version id"
            ));
        }
        let listing = if max == 0 {
            Default::default()
        } else {
            self.rgw
                .list_versions(
                    &b,
                    &prefix,
                    &marker,
                    &vmarker,
                    input.delimiter.as_deref(),
                    max,
                )
                .await
                .map_err(s3_err)?
        };
        let owner = self.owner(&b.owner).await;
        let mut versions = Vec::new();
        let mut markers = Vec::new();
        for (k, e, latest) in &listing.versions {
            if e.dm {
                markers.push(DeleteMarkerEntry {
                    key: Some(enc.s(k)),
                    version_id: Some(e.version_id().to_string()),
                    is_latest: Some(*latest),
                    last_modified: Some(ts(e.mtime_ns)),
                    owner: Some(owner.clone()),
                });
            } else {
                versions.push(ObjectVersion {
                    key: Some(enc.s(k)),
                    version_id: Some(e.version_id().to_string()),
                    is_latest: Some(*latest),
                    size: Some(e.size as i64),
                    e_tag: Some(etag(&e.etag)),
                    last_modified: Some(ts(e.mtime_ns)),
                    storage_class: Some(ObjectVersionStorageClass::from_static(
                        ObjectVersionStorageClass::STANDARD,
                    )),
                    owner: Some(owner.clone()),
                    ..Default::default()
                });
            }
        }
        let (next_key, next_version) = match (&listing.last, listing.truncated) {
            (Some((k, v)), true) => (Some(enc.s(k)), (!v.is_empty()).then(|| v.clone())),
            _ => (None, None),
        };
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(b.name.clone()),
            prefix: Some(enc.s(&prefix)),
            key_marker: Some(enc.s(&marker)),
            version_id_marker: input.version_id_marker.clone(),
            max_keys: Some(max as i32),
            is_truncated: Some(listing.truncated),
            next_key_marker: next_key,
            next_version_id_marker: next_version,
            versions: Some(versions),
            delete_markers: (!markers.is_empty()).then_some(markers),
            common_prefixes: Some(
                listing
                    .prefixes
                    .iter()
                    .map(|p| CommonPrefix {
                        prefix: Some(enc.s(p)),
                    })
                    .collect(),
            ),
            delimiter: enc.o(&input.delimiter),
            encoding_type: input.encoding_type,
            request_charged: None,
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Write)
            .await?;
        let input = req.input;
        check_key(&input.key)?;
        let acl = object_acl(input.acl.as_ref().map(|a| a.as_str()))?;
        let meta = meta_from_headers(
            input.content_type,
            input.content_encoding,
            input.content_disposition,
            input.content_language,
            input.cache_control,
            input.expires,
            input.metadata,
        )?;
        let meta = ObjectMeta {
            tags: tags_from_header(input.tagging.as_deref())?,
            acl,
            ..meta
        };
        let id = self
            .rgw
            .create_upload(&b, &input.key, meta)
            .await
            .map_err(s3_err)?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(b.name),
            key: Some(input.key),
            upload_id: Some(id),
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Write)
            .await?;
        let input = req.input;
        if !(1..=10_000).contains(&input.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to 10000"));
        }
        self.rgw
            .upload(&b, &input.key, &input.upload_id)
            .await
            .map_err(s3_err)?;
        let mut checks = BodyChecks::new(
            input.content_md5.clone(),
            input.checksum_algorithm.as_ref(),
            input.checksum_crc32.clone(),
            input.checksum_crc32c.clone(),
            input.checksum_sha1.clone(),
            input.checksum_sha256.clone(),
            input.checksum_crc64nvme.clone(),
            req.trailing_headers,
        )?
        .declared_trailer(&req.headers);
        let part = self
            .store_part(
                &b,
                &input.key,
                &input.upload_id,
                input.part_number,
                input.body,
                input.content_length,
                &mut checks,
            )
            .await?;
        let sums = checks.computed.unwrap_or_default();
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(etag(&part.etag)),
            checksum_crc32: sums.checksum_crc32,
            checksum_crc32c: sums.checksum_crc32c,
            checksum_sha1: sums.checksum_sha1,
            checksum_sha256: sums.checksum_sha256,
            checksum_crc64nvme: sums.checksum_crc64nvme,
            ..Default::default()
        }))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Write)
            .await?;
        let input = req.input;
        if !(1..=10_000).contains(&input.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to 10000"));
        }
        self.rgw
            .upload(&b, &input.key, &input.upload_id)
            .await
            .map_err(s3_err)?;
        let (_, _, src) = self
            .copy_source(&req.credentials, &input.copy_source)
            .await?;
        check_copy_conditions(
            &src,
            &input.copy_source_if_match,
            &input.copy_source_if_none_match,
            &input.copy_source_if_modified_since,
            &input.copy_source_if_unmodified_since,
        )?;
        let src_meta = self.rgw.read_meta(&src.inst).await.map_err(s3_err)?;
        let (start, end) = match &input.copy_source_range {
            Some(r) => parse_copy_range(r, src.size)?,
            None => (0, src.size),
        };
        let body = self.stream_instance(&src, &src_meta, start, end);
        let mut checks = BodyChecks::none();
        let part = self
            .store_part(
                &b,
                &input.key,
                &input.upload_id,
                input.part_number,
                Some(body),
                Some((end - start) as i64),
                &mut checks,
            )
            .await?;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(etag(&part.etag)),
                last_modified: Some(ts(part.mtime_ns)),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Write)
            .await?;
        let input = req.input;
        self.rgw
            .upload(&b, &input.key, &input.upload_id)
            .await
            .map_err(s3_err)?;
        let max = input.max_parts.unwrap_or(1000).clamp(0, 1000);
        let after = input.part_number_marker.unwrap_or(0);
        let (parts, more) = if max == 0 {
            (Vec::new(), false)
        } else {
            self.rgw
                .parts(&b, &input.key, &input.upload_id, after, max as u32)
                .await
                .map_err(s3_err)?
        };
        let owner = self.owner(&b.owner).await;
        let next = parts.last().map(|(n, _)| *n);
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(b.name.clone()),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: next,
            max_parts: Some(max),
            is_truncated: Some(more),
            owner: Some(owner.clone()),
            initiator: Some(Initiator {
                id: owner.id.clone(),
                display_name: owner.display_name.clone(),
            }),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            parts: Some(
                parts
                    .into_iter()
                    .map(|(n, p)| Part {
                        part_number: Some(n),
                        size: Some(p.size as i64),
                        e_tag: Some(etag(&p.etag)),
                        last_modified: Some(ts(p.mtime_ns)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Read)
            .await?;
        let input = req.input;
        if input.delimiter.as_deref().is_some_and(|d| !d.is_empty()) {
            return Err(s3_error!(
                NotImplemented,
                "listing uploads with a delimiter is not supported yet"
            ));
        }
        let enc = Enc::new(&input.encoding_type);
        let max = input.max_uploads.unwrap_or(1000).clamp(0, 1000) as usize;
        let prefix = input.prefix.clone().unwrap_or_default();
        let (uploads, more) = if max == 0 {
            (Vec::new(), false)
        } else {
            self.rgw
                .list_uploads(
                    &b,
                    &prefix,
                    input.key_marker.as_deref().unwrap_or(""),
                    input.upload_id_marker.as_deref().unwrap_or(""),
                    max,
                )
                .await
                .map_err(s3_err)?
        };
        let owner = self.owner(&b.owner).await;
        let last = uploads.last().cloned();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(b.name.clone()),
            prefix: Some(enc.s(&prefix)),
            key_marker: enc.o(&input.key_marker),
            upload_id_marker: input.upload_id_marker.clone(),
            max_uploads: Some(max as i32),
            is_truncated: Some(more),
            next_key_marker: if more {
                last.as_ref().map(|u| enc.s(&u.key))
            } else {
                None
            },
            next_upload_id_marker: if more {
                last.map(|u| u.upload_id)
            } else {
                None
            },
            encoding_type: input.encoding_type,
            uploads: Some(
                uploads
                    .into_iter()
                    .map(|u| MultipartUpload {
                        key: Some(enc.s(&u.key)),
                        upload_id: Some(u.upload_id),
                        initiated: Some(ts(u.initiated_ns)),
                        owner: Some(owner.clone()),
                        initiator: Some(Initiator {
                            id: owner.id.clone(),
                            display_name: owner.display_name.clone(),
                        }),
                        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Write)
            .await?;
        let input = req.input;
        let upload = self
            .rgw
            .upload(&b, &input.key, &input.upload_id)
            .await
            .map_err(s3_err)?;
        let wanted = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default();
        if wanted.is_empty() {
            return Err(s3_error!(MalformedXML, "the request lists no parts"));
        }
        let stored: BTreeMap<i32, PartEntry> = self
            .rgw
            .all_parts(&b, &input.key, &input.upload_id)
            .await
            .map_err(s3_err)?
            .into_iter()
            .collect();
        let mut used: Vec<(i32, PartEntry)> = Vec::with_capacity(wanted.len());
        let mut last_n = 0;
        for (i, w) in wanted.iter().enumerate() {
            let n = w
                .part_number
                .ok_or_else(|| s3_error!(MalformedXML, "a part has no PartNumber"))?;
            if n <= last_n {
                return Err(s3_err(RgwError::InvalidPartOrder));
            }
            last_n = n;
            let p = stored.get(&n).ok_or_else(|| {
                s3_err(RgwError::InvalidPart(format!("part {n} was not uploaded")))
            })?;
            if let Some(t) = &w.e_tag
                && t.value().trim_matches('"') != p.etag
            {
                return Err(s3_err(RgwError::InvalidPart(format!(
                    "part {n} has ETag {}, not {}",
                    p.etag,
                    t.value()
                ))));
            }
            // a checksum the request lists for a part must be one its upload computed
            for (alg, want) in checksum_map(&Checksum {
                checksum_crc32: w.checksum_crc32.clone(),
                checksum_crc32c: w.checksum_crc32c.clone(),
                checksum_sha1: w.checksum_sha1.clone(),
                checksum_sha256: w.checksum_sha256.clone(),
                checksum_crc64nvme: w.checksum_crc64nvme.clone(),
                ..Default::default()
            }) {
                if p.checksums.get(&alg) != Some(&want) {
                    return Err(s3_err(RgwError::InvalidPart(format!(
                        "part {n}: its {} checksum is {}, not {want}",
                        alg.to_ascii_uppercase(),
                        p.checksums.get(&alg).map_or("not known", String::as_str),
                    ))));
                }
            }
            if i + 1 < wanted.len() && p.size < MIN_PART_SIZE {
                return Err(s3_err(RgwError::EntityTooSmall {
                    part: n,
                    size: p.size,
                }));
            }
            used.push((n, p.clone()));
        }
        let unused: Vec<(i32, PartEntry)> = stored
            .iter()
            .filter(|(n, _)| !used.iter().any(|(u, _)| u == *n))
            .map(|(n, p)| (*n, p.clone()))
            .collect();
        let mut md5 = md5_many::Md5State::new();
        for (_, p) in &used {
            md5.update(&hex::decode(&p.etag).unwrap_or_default());
        }
        let etag_s = format!("{}-{}", hex::encode(md5.finalize()), used.len());
        let size: u64 = used.iter().map(|(_, p)| p.size).sum();
        if let Some(want) = input.mpu_object_size
            && want != size as i64
        {
            return Err(s3_error!(
                InvalidRequest,
                "x-amz-mp-object-size is {want} but the parts hold {size} bytes"
            ));
        }
        let cond = write_condition(
            input.if_match.as_ref().map(|c| match c {
                ETagCondition::Any => "*".to_string(),
                ETagCondition::ETag(t) => t.value().to_string(),
            }),
            input
                .if_none_match
                .as_ref()
                .map(|c| if c.is_any() { "*" } else { "" }),
        );
        let mtime = now_ns();
        let meta = ObjectMeta {
            key: input.key.clone(),
            size,
            etag: etag_s.clone(),
            mtime_ns: mtime,
            parts: used
                .iter()
                .map(|(_, p)| PartRef {
                    inst: p.inst.clone(),
                    size: p.size,
                })
                .collect(),
            ..upload.meta
        };
        // the head: no data, only the manifest
        let inst = self.rgw.new_instance(&b);
        let pending = self
            .rgw
            .begin_write(&b, &input.key, &inst)
            .await
            .map_err(s3_err)?;
        let w = InstanceWriter::new(&self.rgw, &inst);
        if let Err(e) = w.finish(|_| Some(meta.clone())).await {
            self.abandon(&b, &input.key, &inst, &pending);
            return Err(s3_err(e));
        }
        let entry = IndexEntry {
            inst: inst.clone(),
            size,
            etag: etag_s.clone(),
            mtime_ns: mtime,
            ..Default::default()
        };
        let made = match self
            .rgw
            .complete_upload(
                &b,
                &input.key,
                &input.upload_id,
                &entry,
                &pending,
                &used,
                &unused,
                &cond,
            )
            .await
        {
            Ok(made) => made,
            Err(e) => {
                self.abandon(&b, &input.key, &inst, &pending);
                return Err(s3_err(e));
            }
        };
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(b.name.clone()),
            key: Some(input.key.clone()),
            e_tag: Some(etag(&etag_s)),
            location: Some(format!("/{}/{}", b.name, input.key)),
            version_id: made.version_id,
            ..Default::default()
        }))
    }

    async fn put_bucket_lifecycle_configuration(
        &self,
        req: S3Request<PutBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let conf = req
            .input
            .lifecycle_configuration
            .ok_or_else(|| s3_error!(MalformedXML, "no LifecycleConfiguration"))?;
        let rules = conf
            .rules
            .into_iter()
            .map(rule_from_dto)
            .collect::<S3Result<Vec<_>>>()?;
        lifecycle::validate(&rules).map_err(|m| s3_error!(InvalidArgument, "{m}"))?;
        self.rgw
            .update_bucket(&b, |r| r.lifecycle = rules.clone())
            .await
            .map_err(s3_err)?;
        Ok(S3Response::new(
            PutBucketLifecycleConfigurationOutput::default(),
        ))
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        if b.lifecycle.is_empty() {
            return Err(s3_error!(
                NoSuchLifecycleConfiguration,
                "bucket '{}' has no lifecycle configuration",
                b.name
            ));
        }
        Ok(S3Response::new(GetBucketLifecycleConfigurationOutput {
            rules: Some(b.lifecycle.iter().map(rule_to_dto).collect()),
            ..Default::default()
        }))
    }

    async fn delete_bucket_lifecycle(
        &self,
        req: S3Request<DeleteBucketLifecycleInput>,
    ) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        self.rgw
            .update_bucket(&b, |r| r.lifecycle.clear())
            .await
            .map_err(s3_err)?;
        let mut resp = S3Response::new(DeleteBucketLifecycleOutput::default());
        resp.status = Some(hyper::StatusCode::NO_CONTENT);
        Ok(resp)
    }

    async fn put_bucket_tagging(
        &self,
        req: S3Request<PutBucketTaggingInput>,
    ) -> S3Result<S3Response<PutBucketTaggingOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let tags = tags_from_set(req.input.tagging.tag_set, 50)?;
        self.rgw
            .update_bucket(&b, |r| r.tags = tags.clone())
            .await
            .map_err(s3_err)?;
        Ok(S3Response::new(PutBucketTaggingOutput::default()))
    }

    async fn get_bucket_tagging(
        &self,
        req: S3Request<GetBucketTaggingInput>,
    ) -> S3Result<S3Response<GetBucketTaggingOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        if b.tags.is_empty() {
            return Err(s3_error!(NoSuchTagSet, "bucket '{}' has no tags", b.name));
        }
        Ok(S3Response::new(GetBucketTaggingOutput {
            tag_set: tag_set(&b.tags),
        }))
    }

    async fn delete_bucket_tagging(
        &self,
        req: S3Request<DeleteBucketTaggingInput>,
    ) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        self.rgw
            .update_bucket(&b, |r| r.tags.clear())
            .await
            .map_err(s3_err)?;
        let mut resp = S3Response::new(DeleteBucketTaggingOutput::default());
        resp.status = Some(hyper::StatusCode::NO_CONTENT);
        Ok(resp)
    }

    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let input = req.input;
        let tags = tags_from_set(input.tagging.tag_set, 10)?;
        let e = self.current(&b, &input.key, &input.version_id).await?;
        self.rgw
            .update_meta(&e.inst, |m| m.tags = tags.clone())
            .await
            .map_err(s3_err)?;
        Ok(S3Response::new(PutObjectTaggingOutput::default()))
    }

    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let input = req.input;
        let e = self.current(&b, &input.key, &input.version_id).await?;
        let meta = self.rgw.read_meta(&e.inst).await.map_err(s3_err)?;
        Ok(S3Response::new(GetObjectTaggingOutput {
            tag_set: tag_set(&meta.tags),
            version_id: None,
        }))
    }

    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        let b = self.owned(&req.credentials, &req.input.bucket).await?;
        let input = req.input;
        let e = self.current(&b, &input.key, &input.version_id).await?;
        self.rgw
            .update_meta(&e.inst, |m| m.tags.clear())
            .await
            .map_err(s3_err)?;
        let mut resp = S3Response::new(DeleteObjectTaggingOutput::default());
        resp.status = Some(hyper::StatusCode::NO_CONTENT);
        Ok(resp)
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let b = self
            .bucket_for(&req.credentials, &req.input.bucket, Access::Write)
            .await?;
        let input = req.input;
        self.rgw
            .abort_upload(&b, &input.key, &input.upload_id)
            .await
            .map_err(s3_err)?;
        let mut resp = S3Response::new(AbortMultipartUploadOutput::default());
        resp.status = Some(hyper::StatusCode::NO_CONTENT);
        Ok(resp)
    }

    async fn put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        self.do_put_bucket_acl(req).await
    }

    async fn get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        self.do_get_bucket_acl(req).await
    }

    async fn put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        self.do_put_object_acl(req).await
    }

    async fn get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        self.do_get_object_acl(req).await
    }

    async fn put_bucket_cors(
        &self,
        req: S3Request<PutBucketCorsInput>,
    ) -> S3Result<S3Response<PutBucketCorsOutput>> {
        self.do_put_bucket_cors(req).await
    }

    async fn get_bucket_cors(
        &self,
        req: S3Request<GetBucketCorsInput>,
    ) -> S3Result<S3Response<GetBucketCorsOutput>> {
        self.do_get_bucket_cors(req).await
    }

    async fn delete_bucket_cors(
        &self,
        req: S3Request<DeleteBucketCorsInput>,
    ) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
        self.do_delete_bucket_cors(req).await
    }

    async fn post_object(
        &self,
        req: S3Request<PostObjectInput>,
    ) -> S3Result<S3Response<PostObjectOutput>> {
        self.do_post_object(req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(f: impl FnOnce(&mut LifecycleRule)) -> LifecycleRule {
        let mut r = LifecycleRule {
            abort_incomplete_multipart_upload: None,
            expiration: Some(LifecycleExpiration {
                days: Some(1),
                ..Default::default()
            }),
            filter: Some(LifecycleRuleFilter {
                prefix: Some("a/".into()),
                ..Default::default()
            }),
            id: Some("r".into()),
            noncurrent_version_expiration: None,
            noncurrent_version_transitions: None,
            prefix: None,
            status: ExpirationStatus::from_static(ExpirationStatus::ENABLED),
            transitions: None,
        };
        f(&mut r);
        r
    }

    fn code(r: LifecycleRule) -> Option<String> {
        rule_from_dto(r)
            .err()
            .map(|e| e.code().as_str().to_string())
    }

    #[test]
    fn lifecycle_rules_are_checked_as_aws_does() {
        assert_eq!(code(rule(|_| {})), None);
        assert_eq!(
            code(rule(
                |r| r.status = ExpirationStatus::from("Sometimes".to_string())
            )),
            Some("MalformedXML".into())
        );
        assert_eq!(
            code(rule(|r| r.prefix = Some("x".into()))),
            Some("MalformedXML".into())
        );
        assert_eq!(
            code(rule(|r| {
                r.filter.as_mut().unwrap().tag = Some(Tag {
                    key: Some("k".into()),
                    value: Some("v".into()),
                })
            })),
            Some("MalformedXML".into())
        );
        assert_eq!(
            code(rule(|r| r
                .expiration
                .as_mut()
                .unwrap()
                .expired_object_delete_marker = Some(true))),
            Some("MalformedXML".into())
        );
        assert_eq!(
            code(rule(|r| r.expiration.as_mut().unwrap().days = Some(0))),
            Some("InvalidArgument".into())
        );
        assert_eq!(
            code(rule(|r| {
                r.filter = Some(LifecycleRuleFilter {
                    object_size_greater_than: Some(-1),
                    ..Default::default()
                })
            })),
            Some("InvalidArgument".into())
        );
        assert_eq!(
            code(rule(|r| {
                r.noncurrent_version_expiration = Some(NoncurrentVersionExpiration {
                    noncurrent_days: None,
                    newer_noncurrent_versions: Some(2),
                })
            })),
            Some("InvalidArgument".into())
        );
        assert_eq!(
            code(rule(|r| {
                r.filter = Some(LifecycleRuleFilter {
                    tag: Some(Tag {
                        key: Some("k".into()),
                        value: Some("v".into()),
                    }),
                    ..Default::default()
                });
                r.abort_incomplete_multipart_upload = Some(AbortIncompleteMultipartUpload {
                    days_after_initiation: Some(1),
                });
            })),
            Some("InvalidRequest".into())
        );
        assert_eq!(
            code(rule(|r| r.transitions = Some(vec![Transition::default()]))),
            Some("NotImplemented".into())
        );
    }

    #[test]
    fn lifecycle_rules_read_back_as_they_can_be_put() {
        // a prefix and a size: written under And (a Filter holds one condition)
        let stored = rule_from_dto(rule(|r| {
            r.filter = Some(LifecycleRuleFilter {
                and: Some(LifecycleRuleAndOperator {
                    prefix: Some("a/".into()),
                    object_size_greater_than: Some(10),
                    ..Default::default()
                }),
                ..Default::default()
            })
        }))
        .unwrap();
        let back = rule_to_dto(&stored);
        let f = back.filter.as_ref().unwrap();
        assert!(
            f.prefix.is_none() && f.object_size_greater_than.is_none(),
            "{f:?}"
        );
        assert_eq!(rule_from_dto(back).unwrap(), stored);
        // one condition alone; none: the empty prefix
        let only = rule_from_dto(rule(|_| {})).unwrap();
        assert_eq!(rule_from_dto(rule_to_dto(&only)).unwrap(), only);
        let all = rule_from_dto(rule(|r| r.filter = None)).unwrap();
        let f = rule_to_dto(&all).filter.unwrap();
        assert_eq!(f.prefix.as_deref(), Some(""));
    }
}
