//! [`Rgw`]: the gateway's handle on the cluster (its three pools and its settings), shared by
//! the S3 front end, the admin commands and the garbage collector.
//!
//! Pool kinds: the metadata and index pools keep their state in omap (lists of users and
//! buckets, the bucket index, every `CmpOmap`-guarded change), so they must be replicated;
//! erasure-coded pools refuse omap. The data pool only ever sees whole-object writes, reads,
//! removals and xattrs (`data.rs` is the only code that touches it), so it may be
//! erasure-coded: [`RgwConfig::data_pool_profile`] creates it so, and an existing
//! erasure-coded data pool is used as it is. [`Rgw::open`] checks both rules.

use std::sync::Arc;
use std::time::Duration;

use kelp_client::{ClientError, IoCtx, PoolSpec, Rados};

use crate::error::{Result, RgwError};
use crate::layout::BucketRecord;
use std::time::Instant;

/// Gateway settings. Every field has a `kelp rgw` flag (see `--help`) of the same name.
#[derive(Debug, Clone)]
pub struct RgwConfig {
    /// Users, keys and bucket records.
    pub meta_pool: String,
    /// Bucket index shards.
    pub index_pool: String,
    /// Object data.
    pub data_pool: String,
    /// Erasure-code profile of the data pool (`None`: replicated). A missing data pool is
    /// created erasure-coded with it; an existing one must already be erasure-coded with it
    /// (a pool's kind never changes). Without it, an existing data pool of either kind is used.
    pub data_pool_profile: Option<String>,
    /// Index shards of a new bucket unless its creator asks otherwise.
    pub default_shards: u32,
    /// How long unreferenced data is kept before it is deleted (reads that started before an
    /// overwrite or a delete may still be streaming it).
    pub gc_min_wait: Duration,
    /// How long an upload may take before its unfinished data counts as abandoned.
    pub pending_grace: Duration,
    /// How often the garbage collector runs (0: never, in this gateway).
    pub gc_interval: Duration,
    /// PGs of the pools the gateway creates: meta, index, data.
    pub pg_nums: (u32, u32, u32),
    /// A bucket is resharded (to 2n+1 shards) once a shard holds this many objects
    /// (0: never automatically).
    pub reshard_max_objects_per_shard: u64,
    /// How often the maintenance loop applies lifecycle rules (0: never, in this gateway).
    pub lc_interval: Duration,
    /// The length of a lifecycle "day" (shorter only for tests, like Ceph's
    /// `rgw_lc_debug_interval`).
    pub lc_day: Duration,
    /// How long S3 requests may use a bucket record read before (0: read it every time).
    /// Changes made through this gateway apply at once; those made through another gateway
    /// (versioning, lifecycle, tags, deletion) within this time.
    pub bucket_cache_ttl: Duration,
    /// How often bucket usage (stored bytes and objects) is counted for the metrics and the
    /// dashboard: buckets changed through this gateway at each pass, every bucket every 30
    /// passes (0: never, in this gateway). See `crate::usage`.
    pub usage_interval: Duration,
}

impl Default for RgwConfig {
    fn default() -> Self {
        RgwConfig {
            meta_pool: "kelp.rgw.meta".into(),
            index_pool: "kelp.rgw.index".into(),
            data_pool: "kelp.rgw.data".into(),
            data_pool_profile: None,
            default_shards: 11,
            gc_min_wait: Duration::from_secs(2 * 3600),
            pending_grace: Duration::from_secs(3600),
            gc_interval: Duration::from_secs(300),
            pg_nums: (8, 16, 32),
            reshard_max_objects_per_shard: 100_000,
            lc_interval: Duration::from_secs(3600),
            lc_day: Duration::from_secs(86_400),
            bucket_cache_ttl: Duration::from_secs(2),
            usage_interval: Duration::from_secs(10),
        }
    }
}

/// The gateway's state: a cluster connection and its pools. Cheap to clone.
#[derive(Clone)]
pub struct Rgw {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub rados: Rados,
    pub meta: IoCtx,
    pub index: IoCtx,
    pub data: IoCtx,
    pub cfg: RgwConfig,
    /// The MD5 hashing thread shared by all uploads ([`crate::md5batch`]).
    pub md5: crate::md5batch::Md5Batcher,
    /// Bucket records recently read, by name, with when they were read.
    pub buckets: std::sync::Mutex<std::collections::HashMap<String, (BucketRecord, Instant)>>,
    /// This gateway's pending-entry keys ([`crate::pending`]).
    pub pending_slots: Arc<crate::pending::SlotPool>,
    /// Request metrics ([`crate::metrics`]).
    pub metrics: Arc<crate::metrics::RgwMetrics>,
}

impl Rgw {
    /// Opens the gateway's pools, creating those that do not exist yet: the metadata and
    /// index pools replicated, the data pool erasure-coded if `cfg.data_pool_profile` says so.
    /// Refused (before any pool is created) when a pool is of the wrong kind for its role.
    pub async fn open(rados: Rados, cfg: RgwConfig) -> Result<Rgw> {
        if let Some(profile) = &cfg.data_pool_profile
            && (cfg.data_pool == cfg.meta_pool || cfg.data_pool == cfg.index_pool)
        {
            return Err(RgwError::PoolKind {
                role: "data",
                pool: cfg.data_pool.clone(),
                have: "also the gateway's metadata or index pool".into(),
                need: format!(
                    "an erasure-coded data pool (profile '{profile}') needs a pool of its own: \
                     the other two keep omap, which erasure-coded pools refuse"
                ),
            });
        }
        for (role, name) in [("metadata", &cfg.meta_pool), ("index", &cfg.index_pool)] {
            check_kind(&rados, role, name, PoolWant::Replicated)?;
        }
        let want_data = match &cfg.data_pool_profile {
            Some(p) => PoolWant::Erasure(p),
            None => PoolWant::Any,
        };
        check_kind(&rados, "data", &cfg.data_pool, want_data)?;
        if let Some(profile) = &cfg.data_pool_profile
            && !rados.osd_map().ec_profiles.contains_key(profile)
        {
            return Err(RgwError::PoolKind {
                role: "data",
                pool: cfg.data_pool.clone(),
                have: "to be created".into(),
                need: format!(
                    "the erasure-code profile '{profile}' does not exist (make it with `kelp \
                     osd erasure-code-profile set {profile} k=K m=M …`)"
                ),
            });
        }
        let meta = ensure_pool(&rados, &cfg.meta_pool, cfg.pg_nums.0, None).await?;
        let index = ensure_pool(&rados, &cfg.index_pool, cfg.pg_nums.1, None).await?;
        let data = ensure_pool(
            &rados,
            &cfg.data_pool,
            cfg.pg_nums.2,
            cfg.data_pool_profile.as_deref(),
        )
        .await?;
        // Created by another gateway meanwhile: it may have been created of another kind.
        check_kind(&rados, "data", &cfg.data_pool, want_data)?;
        let metrics_top_k = crate::metrics::central_top_k(&rados).await;
        let md5 = crate::md5batch::Md5Batcher::start()
            .map_err(|e| RgwError::Internal(format!("starting the MD5 hashing thread: {e}")))?;
        Ok(Rgw {
            inner: Arc::new(Inner {
                rados,
                meta,
                index,
                data,
                cfg,
                md5,
                buckets: Default::default(),
                pending_slots: crate::pending::SlotPool::new(crate::layout::random_hex(6)),
                metrics: crate::metrics::RgwMetrics::new(metrics_top_k),
            }),
        })
    }

    pub fn config(&self) -> &RgwConfig {
        &self.inner.cfg
    }

    pub fn rados(&self) -> &Rados {
        &self.inner.rados
    }

    /// The gateway's request metrics (export them with `RgwMetrics::register`).
    pub fn metrics(&self) -> &Arc<crate::metrics::RgwMetrics> {
        &self.inner.metrics
    }
}

/// What a role needs of its pool.
#[derive(Debug, Clone, Copy)]
enum PoolWant<'a> {
    /// Keeps omap: replicated.
    Replicated,
    /// Erasure-coded with this profile.
    Erasure(&'a str),
    /// Either kind.
    Any,
}

/// Refuses an existing pool of the wrong kind for `role` (a missing pool passes: it is
/// created of the right kind).
fn check_kind(rados: &Rados, role: &'static str, name: &str, want: PoolWant<'_>) -> Result<()> {
    let map = rados.osd_map();
    let Some(pool) = map.pool_by_name(name) else {
        return Ok(());
    };
    let have = match pool.ec_profile_name() {
        Some(p) => format!("erasure-coded (profile '{p}')"),
        None => "replicated".to_string(),
    };
    let need = match want {
        PoolWant::Any => return Ok(()),
        PoolWant::Replicated if pool.ec().is_none() => return Ok(()),
        PoolWant::Erasure(p) if pool.ec_profile_name() == Some(p) => return Ok(()),
        PoolWant::Replicated => format!(
            "the {role} pool keeps its records in omap, which erasure-coded pools refuse: \
             give the gateway a replicated pool for it"
        ),
        PoolWant::Erasure(p) => format!(
            "it cannot become erasure-coded with profile '{p}' (a pool's kind and profile \
             never change): name a new data pool, which is then created erasure-coded, or \
             leave out the data pool profile to use this one as it is"
        ),
    };
    Err(RgwError::PoolKind {
        role,
        pool: name.to_string(),
        have,
        need,
    })
}

async fn ensure_pool(
    rados: &Rados,
    name: &str,
    pg_num: u32,
    erasure: Option<&str>,
) -> Result<IoCtx> {
    match rados.ioctx(name).await {
        Ok(io) => return Ok(io),
        Err(ClientError::NoSuchPool(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let created = rados
        .create_pool(PoolSpec {
            name: name.to_string(),
            pg_num: Some(pg_num),
            size: None,
            min_size: None,
            crush_rule: None,
            erasure: erasure.map(str::to_string),
        })
        .await;
    match created {
        Ok(_) => Ok(rados.ioctx(name).await?),
        // another gateway created it at the same moment
        Err(first) => {
            for _ in 0..50 {
                if let Ok(io) = rados.ioctx(name).await {
                    return Ok(io);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(first.into())
        }
    }
}
