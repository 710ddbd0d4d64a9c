//! Lifecycle rules (PutBucketLifecycleConfiguration) and the worker that applies them.
//!
//! Rules live in the bucket record. Every gateway's maintenance loop runs [`Rgw::lc_once`]
//! every `lc_interval` (`kelp s3 lc run` runs it by hand): for each bucket with enabled rules
//! it expires current objects (`Expiration` `Days`/`Date`: deleted, or hidden behind a delete
//! marker when the bucket is versioned), removes noncurrent versions
//! (`NoncurrentVersionExpiration`, honouring `NewerNoncurrentVersions`), removes delete markers
//! left with no other version (`ExpiredObjectDeleteMarker`) and aborts multipart uploads
//! (`AbortIncompleteMultipartUpload`). Each change is a compare-and-swap on what the worker
//! saw, so several gateways running the worker at once, or a client writing the key
//! meanwhile, never expire a newer object twice or by mistake. Ages are counted in
//! `lc_day` units (one day, unless shortened for tests like Ceph's `rgw_lc_debug_interval`);
//! an object becomes eligible once it is `Days` × `lc_day` old (AWS rounds up to the next
//! midnight UTC; Kelp does not).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::error::{Result, RgwError};
use crate::layout::{BucketRecord, IndexEntry, now_ns};
use crate::rgw::Rgw;

/// Most rules a bucket may have (as AWS).
pub const MAX_RULES: usize = 1000;

/// One lifecycle rule, as stored in the bucket record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub id: String,
    pub enabled: bool,
    /// Keys the rule applies to (filter prefix, or the legacy rule-level prefix).
    #[serde(default)]
    pub prefix: String,
    /// Every tag here must be on the object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_greater_than: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_less_than: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_days: Option<u32>,
    /// Expire current objects once this time (ns since the epoch) has passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_date_ns: Option<u64>,
    #[serde(default)]
    pub expired_object_delete_marker: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noncurrent_days: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newer_noncurrent_versions: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_multipart_days: Option<u32>,
}

/// Why a lifecycle configuration is refused (S3 answers `InvalidArgument`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    #[error("a lifecycle configuration needs at least one rule")]
    NoRules,
    #[error("at most {MAX_RULES} rules")]
    TooManyRules,
    #[error("rule ID '{0}' appears twice")]
    DuplicateId(String),
    #[error("a rule ID has at most 255 characters")]
    LongId,
    #[error("rule '{0}': Expiration takes Days or Date, not both")]
    DaysAndDate(String),
    #[error("rule '{0}': Days must be a positive integer")]
    ZeroDays(String),
    #[error("rule '{0}': DaysAfterInitiation must be a positive integer")]
    ZeroDaysAfterInitiation(String),
    #[error(
        "rule '{0}' has no action (Expiration, NoncurrentVersionExpiration or AbortIncompleteMultipartUpload)"
    )]
    NoAction(String),
}

impl Rule {
    /// Checks a rule as AWS does when it is put.
    pub fn validate(&self) -> std::result::Result<(), LifecycleError> {
        let id = || self.id.clone();
        if self.id.len() > 255 {
            return Err(LifecycleError::LongId);
        }
        if self.expiration_days.is_some() && self.expiration_date_ns.is_some() {
            return Err(LifecycleError::DaysAndDate(id()));
        }
        if self.expiration_days == Some(0) || self.noncurrent_days == Some(0) {
            return Err(LifecycleError::ZeroDays(id()));
        }
        if self.abort_multipart_days == Some(0) {
            return Err(LifecycleError::ZeroDaysAfterInitiation(id()));
        }
        if self.expiration_days.is_none()
            && self.expiration_date_ns.is_none()
            && !self.expired_object_delete_marker
            && self.noncurrent_days.is_none()
            && self.abort_multipart_days.is_none()
        {
            return Err(LifecycleError::NoAction(id()));
        }
        Ok(())
    }

    fn matches_key(&self, key: &str) -> bool {
        key.starts_with(&self.prefix)
    }

    fn matches_size(&self, size: u64) -> bool {
        self.size_greater_than.is_none_or(|g| size > g)
            && self.size_less_than.is_none_or(|l| size < l)
    }

    fn expires_current(&self, e: &IndexEntry, now: u64, day: Duration) -> bool {
        if let Some(d) = self.expiration_date_ns {
            return now >= d;
        }
        self.expiration_days
            .is_some_and(|days| e.mtime_ns.saturating_add(age(days, day)) <= now)
    }
}

/// `days` lifecycle days in ns.
fn age(days: u32, day: Duration) -> u64 {
    (day.as_nanos() as u64).saturating_mul(u64::from(days))
}

/// Checks a whole configuration (unique ids, rule count).
pub fn validate(rules: &[Rule]) -> std::result::Result<(), LifecycleError> {
    if rules.is_empty() {
        return Err(LifecycleError::NoRules);
    }
    if rules.len() > MAX_RULES {
        return Err(LifecycleError::TooManyRules);
    }
    let mut ids = std::collections::HashSet::new();
    for r in rules {
        r.validate()?;
        if !r.id.is_empty() && !ids.insert(r.id.as_str()) {
            return Err(LifecycleError::DuplicateId(r.id.clone()));
        }
    }
    Ok(())
}

/// What one lifecycle pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LcStats {
    pub buckets: u64,
    /// Current objects expired (deleted, or hidden behind a delete marker).
    pub expired: u64,
    /// Noncurrent versions removed.
    pub noncurrent_removed: u64,
    /// Delete markers left alone and removed.
    pub delete_markers_removed: u64,
    pub uploads_aborted: u64,
}

impl Rgw {
    /// Applies every bucket's lifecycle rules once, as of now, with ages in units of `day`.
    pub async fn lc_once(&self, day: Duration) -> Result<LcStats> {
        let mut stats = LcStats::default();
        for (name, _) in self.all_buckets().await? {
            let b = match self.bucket(&name).await {
                Ok(b) => b,
                Err(RgwError::NoSuchBucket(_)) => continue,
                Err(e) => return Err(e),
            };
            let rules: Vec<&Rule> = b.lifecycle.iter().filter(|r| r.enabled).collect();
            if rules.is_empty() {
                continue;
            }
            stats.buckets += 1;
            for r in rules {
                if let Err(e) = self.lc_rule(&b, r, day, &mut stats).await {
                    warn!(bucket = %b.name, rule = %r.id, "lifecycle rule failed: {e}");
                }
            }
        }
        Ok(stats)
    }

    async fn lc_rule(
        &self,
        b: &BucketRecord,
        r: &Rule,
        day: Duration,
        st: &mut LcStats,
    ) -> Result<()> {
        let now = now_ns();
        if r.expiration_days.is_some() || r.expiration_date_ns.is_some() {
            let mut after = String::new();
            loop {
                let page = self.list_objects(b, &r.prefix, &after, None, 1000).await?;
                for (key, e) in &page.objects {
                    if r.matches_key(key)
                        && r.matches_size(e.size)
                        && r.expires_current(e, now, day)
                        && self.lc_tags_match(r, e).await?
                        && self.expire_current(b, key, e).await?
                    {
                        st.expired += 1;
                    }
                }
                match (&page.last, page.truncated) {
                    (Some(l), true) => after = l.clone(),
                    _ => break,
                }
            }
        }
        if b.versioning.is_some() && (r.noncurrent_days.is_some() || r.expired_object_delete_marker)
        {
            let (mut km, mut vm) = (String::new(), String::new());
            loop {
                let page = self
                    .list_versions(b, &r.prefix, &km, &vm, None, 1000)
                    .await?;
                for (key, _, latest) in &page.versions {
                    if *latest && r.matches_key(key) {
                        self.lc_versions(b, r, key, now, day, st).await?;
                    }
                }
                match (&page.last, page.truncated) {
                    (Some((k, v)), true) => {
                        km = k.clone();
                        vm = v.clone();
                    }
                    _ => break,
                }
            }
        }
        if let Some(days) = r.abort_multipart_days {
            let (mut km, mut um) = (String::new(), String::new());
            loop {
                let (uploads, more) = self.list_uploads(b, &r.prefix, &km, &um, 1000).await?;
                for u in &uploads {
                    if u.initiated_ns.saturating_add(age(days, day)) <= now {
                        match self.abort_upload(b, &u.key, &u.upload_id).await {
                            Ok(()) => st.uploads_aborted += 1,
                            Err(RgwError::NoSuchUpload(_)) => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                match (uploads.last(), more) {
                    (Some(u), true) => {
                        km = u.key.clone();
                        um = u.upload_id.clone();
                    }
                    _ => break,
                }
            }
        }
        Ok(())
    }

    /// Noncurrent-version expiration and lone delete markers of one key.
    async fn lc_versions(
        &self,
        b: &BucketRecord,
        r: &Rule,
        key: &str,
        now: u64,
        day: Duration,
        st: &mut LcStats,
    ) -> Result<()> {
        let versions = self.versions(b, key).await?;
        if let Some(days) = r.noncurrent_days {
            for (i, v) in versions.iter().enumerate().skip(1) {
                // a version became noncurrent when the next newer one was written
                let since = versions[i - 1].mtime_ns;
                let newer_noncurrent = (i - 1) as u32;
                let keep = r
                    .newer_noncurrent_versions
                    .is_some_and(|n| newer_noncurrent < n);
                if !keep
                    && since.saturating_add(age(days, day)) <= now
                    && (v.dm || r.matches_size(v.size))
                    && self.delete_version(b, key, v.version_id()).await?.is_some()
                {
                    if v.dm {
                        st.delete_markers_removed += 1;
                    } else {
                        st.noncurrent_removed += 1;
                    }
                }
            }
        }
        if r.expired_object_delete_marker {
            let left = self.versions(b, key).await?;
            if let [only] = left.as_slice()
                && only.dm
                && self
                    .delete_version(b, key, only.version_id())
                    .await?
                    .is_some()
            {
                st.delete_markers_removed += 1;
            }
        }
        Ok(())
    }

    async fn lc_tags_match(&self, r: &Rule, e: &IndexEntry) -> Result<bool> {
        if r.tags.is_empty() {
            return Ok(true);
        }
        let meta = self.read_meta(&e.inst).await?;
        Ok(r.tags.iter().all(|(k, v)| meta.tags.get(k) == Some(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> Rule {
        Rule {
            id: "r".into(),
            enabled: true,
            expiration_days: Some(2),
            ..Rule::default()
        }
    }

    #[test]
    fn validation() {
        assert!(validate(&[rule()]).is_ok());
        assert_eq!(validate(&[]), Err(LifecycleError::NoRules));
        assert_eq!(
            validate(&[rule(), rule()]),
            Err(LifecycleError::DuplicateId("r".into()))
        );
        let none = Rule {
            expiration_days: None,
            ..rule()
        };
        assert_eq!(none.validate(), Err(LifecycleError::NoAction("r".into())));
        let both = Rule {
            expiration_date_ns: Some(1),
            ..rule()
        };
        assert_eq!(
            both.validate(),
            Err(LifecycleError::DaysAndDate("r".into()))
        );
        let zero = Rule {
            expiration_days: Some(0),
            ..rule()
        };
        assert_eq!(zero.validate(), Err(LifecycleError::ZeroDays("r".into())));
    }

    #[test]
    fn eligibility() {
        let day = Duration::from_secs(10);
        let e = IndexEntry {
            mtime_ns: 1_000,
            size: 50,
            ..IndexEntry::default()
        };
        let r = rule();
        let ten_s = 10_000_000_000u64;
        assert!(!r.expires_current(&e, 1_000 + 2 * ten_s - 1, day));
        assert!(r.expires_current(&e, 1_000 + 2 * ten_s, day));
        let dated = Rule {
            expiration_days: None,
            expiration_date_ns: Some(5_000),
            ..rule()
        };
        assert!(!dated.expires_current(&e, 4_999, day));
        assert!(dated.expires_current(&e, 5_000, day));
        let sized = Rule {
            size_greater_than: Some(10),
            size_less_than: Some(50),
            ..rule()
        };
        assert!(sized.matches_size(11));
        assert!(!sized.matches_size(50));
        assert!(!sized.matches_size(10));
        let pre = Rule {
            prefix: "logs/".into(),
            ..rule()
        };
        assert!(pre.matches_key("logs/a"));
        assert!(!pre.matches_key("log"));
    }
}
