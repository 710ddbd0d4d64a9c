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
mod headers;
mod lifecycle_ops;
mod listing;
mod multipart;
mod post;

use self::headers::*;

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
        RgwError::Corrupt { .. }
        | RgwError::PoolKind { .. }
        | RgwError::Internal(_)
        | RgwError::Rados(_) => S3ErrorCode::InternalError,
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
/// Nothing panics while holding the key cache's lock (map get, insert, clear), so it is never
/// poisoned.
const KEY_CACHE_LOCK: &str = "key cache lock: no holder panics";

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
        if let Some((at, uid, secret)) = self.cache.lock().expect(KEY_CACHE_LOCK).get(access_key)
            && at.elapsed() < KEY_CACHE_TTL
        {
            return Ok((uid.clone(), secret.clone()));
        }
        let (uid, secret) = self.rgw.secret_for(access_key).await.map_err(s3_err)?;
        let mut cache = self.cache.lock().expect(KEY_CACHE_LOCK);
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

#[async_trait::async_trait]
impl S3 for KelpS3 {
    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.do_list_buckets(req).await
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
        self.do_list_objects(req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.do_list_objects_v2(req).await
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        self.do_list_object_versions(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.do_create_multipart_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.do_upload_part(req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        self.do_upload_part_copy(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.do_list_parts(req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        self.do_list_multipart_uploads(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.do_complete_multipart_upload(req).await
    }

    async fn put_bucket_lifecycle_configuration(
        &self,
        req: S3Request<PutBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
        self.do_put_bucket_lifecycle_configuration(req).await
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        self.do_get_bucket_lifecycle_configuration(req).await
    }

    async fn delete_bucket_lifecycle(
        &self,
        req: S3Request<DeleteBucketLifecycleInput>,
    ) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
        self.do_delete_bucket_lifecycle(req).await
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
        self.do_abort_multipart_upload(req).await
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
