//! Per-bucket usage — stored bytes and objects — for the metrics and the manager's dashboard.
//!
//! Counted in the background, never on a request's path: [`Rgw::run_usage`] counts the index of
//! every bucket that a request changed since the last pass (requests only mark the bucket, in
//! the lock the request metrics already take), and every bucket on a full pass (the first,
//! then every [`FULL_PASS_EVERY`] passes, which also catches changes made by other gateways
//! and by lifecycle rules). The figures are kept in [`crate::metrics::RgwMetrics`], where the
//! scrape reads them, and published in the metadata pool (omap of [`USAGE_OBJ`]: bucket name
//! -> JSON [`BucketUsage`]), where the manager reads them for its buckets page.
//!
//! Sizes are what the index records: the bytes of each current object version as put (and
//! objects counted the same way), as `kelp s3 bucket stats` prints them.

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::error::Result;
use crate::rgw::Rgw;

/// The metadata-pool object whose omap holds every bucket's usage (`bucket` -> JSON).
pub const USAGE_OBJ: &str = "bucket_usage";

/// Every how many passes all buckets are counted (the others count changed buckets only).
pub const FULL_PASS_EVERY: u32 = 30;

/// A bucket's usage as counted from its index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketUsage {
    /// Objects in the bucket.
    pub objects: u64,
    /// Bytes of those objects.
    pub bytes: u64,
    /// When it was counted (ms since the Unix epoch).
    pub at_ms: u64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Rgw {
    /// Counts bucket usage every `usage_interval` until the task is dropped (0: never).
    pub async fn run_usage(self) {
        let every = self.inner.cfg.usage_interval;
        if every.is_zero() {
            return;
        }
        let mut pass: u32 = 0;
        loop {
            let full = pass.is_multiple_of(FULL_PASS_EVERY);
            if let Err(e) = self.usage_once(full).await {
                warn!("counting bucket usage failed: {e}");
                // count everything again next time: marks taken by this pass are lost
                pass = 0;
            } else {
                pass = pass.wrapping_add(1);
            }
            tokio::time::sleep(every).await;
        }
    }

    /// One pass: every bucket (`full`) or those changed since the last pass.
    pub async fn usage_once(&self, full: bool) -> Result<()> {
        let metrics = &self.inner.metrics;
        let (marked, overflow) = metrics.take_changed_buckets();
        let full = full || overflow;
        let names: Vec<String> = if full {
            self.all_buckets()
                .await?
                .into_iter()
                .map(|(b, _)| b)
                .collect()
        } else {
            marked
        };
        if names.is_empty() && !full {
            return Ok(());
        }
        let mut counted = Vec::with_capacity(names.len());
        let mut gone = Vec::new();
        for name in names {
            let b = match self.bucket(&name).await {
                Ok(b) => b,
                Err(crate::error::RgwError::NoSuchBucket(_)) => {
                    gone.push(name);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let (objects, bytes) = self.bucket_usage(&b).await?;
            counted.push((
                name,
                BucketUsage {
                    objects,
                    bytes,
                    at_ms: now_ms(),
                },
            ));
        }
        let meta = &self.inner.meta;
        if full {
            // forget what was published for buckets that no longer exist
            let keep: std::collections::HashSet<&str> =
                counted.iter().map(|(n, _)| n.as_str()).collect();
            let published = crate::meta::omap_all(meta, USAGE_OBJ, "").await?;
            gone.extend(
                published
                    .into_iter()
                    .map(|(k, _)| k)
                    .filter(|k| !keep.contains(k.as_str())),
            );
        }
        if !gone.is_empty() {
            meta.omap_rm_keys(USAGE_OBJ, &gone)
                .await
                .or_else(|e| match e {
                    kelp_client::ClientError::NotFound { .. } => Ok(()),
                    e => Err(e),
                })?;
        }
        for chunk in counted.chunks(500) {
            let entries: Vec<(&str, Vec<u8>)> = chunk
                .iter()
                .map(|(n, u)| (n.as_str(), serde_json::to_vec(u).expect("usage serializes")))
                .collect();
            meta.omap_set(USAGE_OBJ, &entries).await?;
        }
        debug!(
            buckets = counted.len(),
            removed = gone.len(),
            full,
            "bucket usage counted"
        );
        metrics.set_usage(
            counted.into_iter().map(|(n, u)| (n, (u.objects, u.bytes))),
            &gone,
            full,
        );
        Ok(())
    }
}
