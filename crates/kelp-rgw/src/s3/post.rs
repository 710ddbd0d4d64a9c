//! PostObject: browser uploads with an HTML form (`multipart/form-data`).
//!
//! `s3s` has done the protocol work by the time this runs: it verified the form's SigV4
//! signature (over the `policy` field), the policy's expiration, every condition
//! (`eq` / `starts-with` on each field, `content-length-range` on the file, the bucket) and
//! that every field is covered by a condition, and it read the file (at most
//! [`MAX_POST_SIZE`] bytes) into memory. This stores it through the same path as PutObject,
//! after resolving what `s3s` does not: `${filename}` in the key and the form's `acl` field
//! (see [`crate::form`]).

use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

use super::access::object_acl;
use super::{BodyChecks, KelpS3, check_key, meta_from_headers};
use crate::acl::Access;
use crate::form::PostForm;
use crate::index::WriteCondition;
use crate::layout::ObjectMeta;

/// Largest file a POST upload may carry: `s3s` holds it in memory before the gateway sees
/// it, so this is far below the 5 GiB of a PUT (larger files: PUT or multipart upload).
pub const MAX_POST_SIZE: u64 = 256 << 20;

impl KelpS3 {
    pub(super) async fn do_post_object(
        &self,
        req: S3Request<PostObjectInput>,
    ) -> S3Result<S3Response<PostObjectOutput>> {
        let form = req
            .extensions
            .get::<PostForm>()
            .map(PostForm::snapshot)
            .unwrap_or_default();
        if !form.complete || form.invalid {
            return Err(s3_error!(
                MalformedPOSTRequest,
                "the form fields could not be read (at most 1 MiB of fields before the file)"
            ));
        }
        let input = req.input;
        // the form's fields are S3's headers of a PUT: the same refusals apply
        if let Some(r) = crate::unsupported::check_form(&form.fields) {
            return Err(r.into());
        }
        let key = form.resolve_key(&input.key);
        check_key(&key)?;
        let acl = object_acl(input.acl.as_ref().map(|a| a.as_str()).or(form.field("acl")))?;
        let b = self
            .bucket_for(&req.credentials, &input.bucket, Access::Write)
            .await?;
        let mut checks = BodyChecks::new(
            input.content_md5.clone(),
            input.checksum_algorithm.as_ref(),
            input.checksum_crc32.clone(),
            input.checksum_crc32c.clone(),
            input.checksum_sha1.clone(),
            input.checksum_sha256.clone(),
            input.checksum_crc64nvme.clone(),
            None,
        )?;
        let meta = meta_from_headers(
            input.content_type.clone(),
            input.content_encoding.clone(),
            input.content_disposition.clone(),
            input.content_language.clone(),
            input.cache_control.clone(),
            input.expires.clone(),
            input.metadata.clone(),
        )?;
        let meta = ObjectMeta { acl, ..meta };
        let (entry, version_id) = self
            .store_object(
                &b,
                &key,
                input.body,
                input.content_length,
                &mut checks,
                meta,
                &WriteCondition::default(),
            )
            .await?;
        // (s3s writes the answer, 201 / 303 with the key as the form gave it; the front end in
        // server.rs puts in the key that `${filename}` became)
        let mut resp = S3Response::new(PostObjectOutput {
            e_tag: Some(super::etag(&entry.etag)),
            version_id,
            ..Default::default()
        });
        if let Ok(v) = hyper::header::HeaderValue::from_str(&format!("\"{}\"", entry.etag)) {
            resp.headers.insert(hyper::header::ETAG, v);
        }
        Ok(resp)
    }
}
