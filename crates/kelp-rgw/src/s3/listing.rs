//! Listings: buckets, objects (v1 and v2, with delimiters and markers) and object versions.

use super::*;

impl KelpS3 {
    pub(super) async fn do_list_buckets(
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

    pub(super) async fn do_list_objects(
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

    pub(super) async fn do_list_objects_v2(
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

    pub(super) async fn do_list_object_versions(
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
}
