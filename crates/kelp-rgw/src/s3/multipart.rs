//! Multipart uploads: create, upload (and copy) parts, list parts and uploads, complete
//! (conditional, checked against the parts' ETags and checksums) and abort.

use super::*;

impl KelpS3 {
    pub(super) async fn do_create_multipart_upload(
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

    pub(super) async fn do_upload_part(
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

    pub(super) async fn do_upload_part_copy(
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

    pub(super) async fn do_list_parts(
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

    pub(super) async fn do_list_multipart_uploads(
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

    pub(super) async fn do_complete_multipart_upload(
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

    pub(super) async fn do_abort_multipart_upload(
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
}
