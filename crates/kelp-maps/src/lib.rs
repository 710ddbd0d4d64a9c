//! Kelp's cluster maps. The OSD map is the authoritative description of the cluster that every
//! daemon and client shares: which OSDs exist, where they listen, whether they are up and in,
//! the pools, the CRUSH map and cluster flags. It changes only by numbered incrementals
//! (epoch `e` + incremental `e+1` = map `e+1`), which the monitors decide and replicate.
//!
//! Pure code: the monitors' decisions (`OsdMap::propose_*`) are functions from a map and a
//! request to an incremental or a typed error, and `apply` turns an incremental into the next
//! map. Both are deterministic, so every monitor and subscriber computes the same map.
//!
//! Invariants: `epoch` grows by exactly one per applied incremental; every pool's `crush_rule`
//! exists in the CRUSH map; every OSD in the CRUSH map exists in `osds`; pool ids and names are
//! unique; the CRUSH map is always finalized.

mod error;
mod mapcache;
mod osdmap;

pub use error::MapError;
pub use mapcache::MappingCache;
pub use osdmap::{
    Change, ClusterFlag, Incremental, OSD_MAP_FORMAT, OsdInfo, OsdMap, PgMapping, Pool, PoolKind,
    PoolSpec,
};
