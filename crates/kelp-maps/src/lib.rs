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
//! unique; the CRUSH map is always finalized. An erasure-coded pool carries its own copy of the
//! erasure-code profile it was made from (`PoolKind::Erasure`), so profile changes never
//! reach existing pools, and its PG mappings keep shard positions (holes are [`ITEM_NONE`]).

pub mod device_class;
#[cfg(test)]
mod ec_tests;
mod error;
pub mod fsmap;
#[cfg(test)]
mod fsmap_tests;
mod mapcache;
mod osdmap;

pub use device_class::fastest_device_class;
pub use error::MapError;
pub use fsmap::{
    FS_MAP_FORMAT, FsAction, FsInfo, FsMap, MdsAssignment, MdsBeacon, MdsInfo, MdsState,
};
pub use mapcache::MappingCache;
pub use osdmap::{
    Change, ClusterFlag, DEFAULT_EC_PROFILE, Incremental, OSD_MAP_FORMAT, OsdInfo, OsdMap,
    PgMapping, Pool, PoolKind, PoolSpec,
};

/// The hole marker in an erasure-coded pool's `up` / `acting` sets (see [`PgMapping`]): a
/// shard position with no OSD. CRUSH's own `ITEM_NONE`, `0x7fff_ffff`.
pub use kelp_crush::ITEM_NONE;
