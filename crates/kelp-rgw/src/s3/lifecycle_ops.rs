//! Lifecycle configuration: the S3 documents to Kelp's rules and back (checked as AWS checks
//! them), and the three bucket operations.

use super::*;

/// A lifecycle rule from its S3 form (transitions: NotImplemented, there are no other
/// storage classes).
pub(super) fn rule_from_dto(r: LifecycleRule) -> S3Result<lifecycle::Rule> {
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

pub(super) fn rule_to_dto(r: &lifecycle::Rule) -> LifecycleRule {
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

impl KelpS3 {
    pub(super) async fn do_put_bucket_lifecycle_configuration(
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

    pub(super) async fn do_get_bucket_lifecycle_configuration(
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

    pub(super) async fn do_delete_bucket_lifecycle(
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
