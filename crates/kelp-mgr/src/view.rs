//! What the active manager knows of the cluster after one poll ([`View`]), and the JSON the
//! API answers with, built from it (pure: no I/O, so the API's shape is unit-tested).
//!
//! Fast with many PGs and buckets: a view is built once per poll and shared (`Arc`); a list
//! request filters and slices it ([`paginate`]) and serialises only the page asked for.

use std::collections::BTreeMap;
use std::sync::Arc;

use kelp_health::HealthCheck;
use kelp_maps::OsdMap;
use kelp_proto::{ClusterStatus, MgrMap, PgMapDigest, PgScrubSummary, ProgressItem};
use kelp_types::PgId;
use serde_json::{Value, json};

use crate::series::IoSample;

/// A bucket as the gateways record it in the metadata pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketInfo {
    pub name: String,
    pub owner: String,
    pub shards: u32,
    pub created_ms: u64,
    /// Target shards of a reshard in progress, and when it started (unix ms).
    pub reshard: Option<(u32, u64)>,
    /// Objects and stored bytes, as the gateways last counted them (`None`: not counted yet).
    pub usage: Option<(u64, u64)>,
}

/// One poll's worth of cluster state.
#[derive(Debug, Clone)]
pub struct View {
    pub at_ms: u64,
    pub map: Arc<OsdMap>,
    pub status: Option<ClusterStatus>,
    pub digest: Option<PgMapDigest>,
    pub scrubs: BTreeMap<PgId, PgScrubSummary>,
    pub checks: Vec<HealthCheck>,
    pub mgrmap: MgrMap,
    pub buckets: Vec<BucketInfo>,
    /// PG state name (scrub states included) → count.
    pub pgs_by_state: BTreeMap<String, u32>,
}

impl View {
    pub fn new(
        at_ms: u64,
        map: Arc<OsdMap>,
        status: Option<ClusterStatus>,
        digest: Option<PgMapDigest>,
        scrubs: BTreeMap<PgId, PgScrubSummary>,
        mgrmap: MgrMap,
        buckets: Vec<BucketInfo>,
    ) -> View {
        let checks = kelp_health::health_checks(&map, digest.as_ref(), &scrubs);
        let mut pgs_by_state = BTreeMap::new();
        match &digest {
            Some(d) => {
                for p in &d.pgs {
                    let s = kelp_health::pg_state_with_scrub(&p.state_name, scrubs.get(&p.stat.pg));
                    *pgs_by_state.entry(s).or_default() += 1;
                }
            }
            None => {
                let n: u32 = map.pools.values().map(|p| p.pg_num).sum();
                if n > 0 {
                    pgs_by_state.insert("unknown".to_string(), n);
                }
            }
        }
        View {
            at_ms,
            map,
            status,
            digest,
            scrubs,
            checks,
            mgrmap,
            buckets,
            pgs_by_state,
        }
    }

    pub fn health_status(&self) -> &'static str {
        kelp_health::overall(&self.checks).as_str()
    }

    pub fn health_json(&self) -> Value {
        json!({
            "status": self.health_status(),
            "checks": self.checks.iter().map(|c| json!({
                "code": c.code.to_string(),
                "severity": c.severity.as_str(),
                "summary": c.summary,
                "count": c.detail.len(),
                "detail": c.detail.iter().take(50).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }

    pub fn osds(&self) -> Vec<Value> {
        let summaries: BTreeMap<i32, &kelp_proto::OsdSummary> = self
            .digest
            .iter()
            .flat_map(|d| d.osds.iter())
            .map(|o| (o.id, o))
            .collect();
        self.map
            .osds
            .values()
            .map(|o| {
                let s = summaries.get(&o.id);
                let space = s.map(|s| s.space).unwrap_or_default();
                let pct = if space.total == 0 {
                    0.0
                } else {
                    space.used as f64 * 100.0 / space.total as f64
                };
                json!({
                    "id": o.id,
                    "name": format!("osd.{}", o.id),
                    "host": o.host,
                    "up": o.up,
                    "in": o.is_in(),
                    "reweight": f64::from(o.weight) / 65536.0,
                    "total_bytes": space.total,
                    "used_bytes": space.used,
                    "avail_bytes": space.available,
                    "use_pct": (pct * 100.0).round() / 100.0,
                    "pgs": s.map_or(0, |s| s.num_pgs),
                    "reported": s.is_some_and(|s| s.reported),
                })
            })
            .collect()
    }

    pub fn pools(&self) -> Vec<Value> {
        let mut per_pool: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for p in self.digest.iter().flat_map(|d| d.pgs.iter()) {
            let e = per_pool.entry(p.stat.pg.pool.0).or_default();
            e.0 += p.stat.num_objects;
            e.1 += p.stat.num_bytes;
        }
        self.map
            .pools
            .values()
            .map(|p| {
                let (objects, stored) = per_pool.get(&p.id).copied().unwrap_or_default();
                let ratio = match p.ec() {
                    Some(code) if code.k > 0 => f64::from(code.k + code.m) / f64::from(code.k),
                    _ => f64::from(p.size),
                };
                json!({
                    "id": p.id,
                    "name": p.name,
                    "type": p.type_name(),
                    "size": p.size,
                    "min_size": p.min_size,
                    "pg_num": p.pg_num,
                    "objects": objects,
                    "stored_bytes": stored,
                    "raw_used_bytes": (stored as f64 * ratio) as u64,
                })
            })
            .collect()
    }

    /// PGs whose state contains `state` (every PG when `None`), in PG order.
    pub fn pgs(&self, state: Option<&str>) -> Vec<Value> {
        let Some(d) = &self.digest else {
            return Vec::new();
        };
        d.pgs
            .iter()
            .filter_map(|p| {
                let scrub = self.scrubs.get(&p.stat.pg);
                let name = kelp_health::pg_state_with_scrub(&p.state_name, scrub);
                if let Some(want) = state
                    && !name.split('+').any(|w| w == want)
                    && name != want
                {
                    return None;
                }
                Some(json!({
                    "pgid": p.stat.pg.to_string(),
                    "state": name,
                    "up": p.stat.up,
                    "acting": p.stat.acting,
                    "objects": p.stat.num_objects,
                    "bytes": p.stat.num_bytes,
                    "degraded": p.stat.num_objects_degraded,
                    "misplaced": p.stat.num_objects_misplaced,
                    "last_scrub_stamp": scrub.map_or(0, |s| s.last_scrub_stamp),
                    "last_deep_scrub_stamp": scrub.map_or(0, |s| s.last_deep_scrub_stamp),
                }))
            })
            .collect()
    }

    pub fn pg_states(&self) -> Vec<Value> {
        self.pgs_by_state
            .iter()
            .map(|(s, n)| json!({"state": s, "count": n}))
            .collect()
    }

    pub fn buckets_json(&self) -> Vec<Value> {
        self.buckets
            .iter()
            .map(|b| {
                json!({
                    "name": b.name, "owner": b.owner, "shards": b.shards,
                    "created_ms": b.created_ms,
                    "resharding_to": b.reshard.map(|r| r.0),
                    "objects": b.usage.map(|u| u.0),
                    "stored_bytes": b.usage.map(|u| u.1),
                })
            })
            .collect()
    }

    /// The S3 gateway's pools and their usage (per-bucket usage is in [`View::buckets_json`]).
    pub fn s3_pools(&self) -> Vec<Value> {
        self.pools()
            .into_iter()
            .filter(|p| {
                p["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("kelp.rgw."))
            })
            .collect()
    }

    pub fn summary(&self, io: Option<&IoSample>, progress: &[ProgressItem]) -> Value {
        let t = self.digest.as_ref().map(|d| d.totals).unwrap_or_default();
        let num_pgs: u32 = self.pgs_by_state.values().sum();
        json!({
            "fsid": self.map.fsid,
            "epoch": self.map.epoch,
            "at_ms": self.at_ms,
            "health": self.health_json(),
            "monitors": self.status.as_ref().map(|s| json!({
                "names": s.monitors.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
                "quorum": s.monitors.iter().filter(|(_, q)| *q).map(|(n, _)| n.clone()).collect::<Vec<_>>(),
                "leader": s.leader,
            })),
            "mgr": {
                "active": self.mgrmap.active.as_ref().map(|a| a.name.clone()),
                "standbys": self.mgrmap.standbys.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
            },
            "osds": {"total": self.map.osds.len(), "up": self.map.num_up(), "in": self.map.num_in()},
            "pools": self.map.pools.len(),
            "pgs": {"total": num_pgs, "by_state": self.pg_states()},
            "usage": {"objects": t.num_objects, "data_bytes": t.data_bytes, "used_bytes": t.bytes_used,
                "avail_bytes": t.bytes_avail, "total_bytes": t.bytes_total,
                "degraded_objects": t.degraded_objects, "misplaced_objects": t.misplaced_objects,
                "unfound_objects": t.unfound_objects},
            "io": io,
            "buckets": self.buckets.len(),
            "progress": progress.iter().map(progress_json).collect::<Vec<_>>(),
        })
    }
}

pub fn progress_json(p: &ProgressItem) -> Value {
    json!({
        "id": p.id,
        "kind": p.kind.name(),
        "message": p.message,
        "fraction": p.fraction(),
        "eta_secs": p.eta_secs,
        "started_ms": p.started_ms,
        "finished_ms": p.finished_ms,
    })
}

/// A page of `items` (`page` from 1) with the paging fields every list answers with.
pub fn paginate(items: Vec<Value>, page: usize, per_page: usize) -> Value {
    let total = items.len();
    let per_page = per_page.clamp(1, 1000);
    let page = page.max(1);
    let start = (page - 1).saturating_mul(per_page).min(total);
    let page_items: Vec<Value> = items.into_iter().skip(start).take(per_page).collect();
    json!({
        "items": page_items,
        "page": page,
        "per_page": per_page,
        "total": total,
        "pages": total.div_ceil(per_page),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_slice_and_count() {
        let items: Vec<Value> = (0..105).map(|i| json!(i)).collect();
        let p = paginate(items.clone(), 3, 50);
        assert_eq!(p["items"].as_array().map(Vec::len), Some(5));
        assert_eq!(p["items"][0], json!(100));
        assert_eq!(p["total"], json!(105));
        assert_eq!(p["pages"], json!(3));
        let p = paginate(items, 9, 50);
        assert_eq!(p["items"].as_array().map(Vec::len), Some(0));
    }

    #[test]
    fn a_view_of_a_fresh_map() {
        let map = Arc::new(OsdMap::new("f", "osd").unwrap());
        let v = View::new(
            1,
            map,
            None,
            None,
            BTreeMap::new(),
            MgrMap::default(),
            Vec::new(),
        );
        let s = v.summary(None, &[]);
        assert_eq!(s["osds"]["total"], json!(0));
        assert!(s["health"]["status"].as_str().is_some());
        assert!(v.pgs(None).is_empty());
    }
}
